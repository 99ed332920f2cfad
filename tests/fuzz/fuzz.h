/*
 * fuzz.h — what the fuzz targets of tests/fuzz/ share.
 *
 * Each fuzz_<target>.c defines LLVMFuzzerTestOneInput (and may define
 * LLVMFuzzerInitialize). It is linked two ways:
 *  - with libFuzzer (clang -fsanitize=fuzzer,address,undefined; `make fuzz`,
 *    CMake option KS_FUZZ): the fuzzer proper, run for a bounded time by
 *    tests/fuzz/run.sh;
 *  - with replay.c, in every build: a plain program that feeds the committed
 *    seed corpus and the regression inputs through the same function
 *    (ctest fuzz_replay_<target>, label unit), so `make test` and
 *    `make test-asan` replay them without libFuzzer.
 *
 * A target checks properties of the code under test with FUZZ_CHECK, not
 * assert(): the replay runs in Release builds too (NDEBUG), and a failed
 * property must abort there as well, printing what failed.
 */
#ifndef KS_FUZZ_H
#define KS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Like FUZZ_CHECK for two integers, printing both. */
#define FUZZ_CHECK_EQ(a, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "%s:%d: fuzz check failed: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, \
                    #a, #b, a_, b_);                                                               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif

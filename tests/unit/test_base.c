/* test_base.c — the errno mapping, the random bytes and KS_ASSERT shared by every layer
 * (src/base/base.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"

/* Regression: ks_kvfile_errno (kvfile.c) mapped ENOTDIR to KS_EIO while
 * errno_to_ks (mkmodel.c) mapped it to KS_ENOENT. Both use ks_errno_map now,
 * and a path through a file is "not found" everywhere. */
static void test_errno_map(void **state) {
    (void)state;
    static const struct {
        int e, want;
    } cases[] = {
        {ENOSPC, KS_ENOSPC},
#ifdef EDQUOT
        {EDQUOT, KS_ENOSPC},
#endif
        {ENOMEM, KS_ENOMEM},
        {ENOENT, KS_ENOENT},
        {ENOTDIR, KS_ENOENT},
        {EACCES, KS_EIO},
        {EPERM, KS_EIO},
        {EIO, KS_EIO},
        {EISDIR, KS_EIO},
        {0, KS_EIO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = ks_errno_map(cases[i].e);
        if (got != cases[i].want)
            fail_msg("errno %d: got %s, wanted %s", cases[i].e, ks_errname(got),
                     ks_errname(cases[i].want));
    }
}

/* One source of random bytes (it replaced four copies of getrandom with
 * four fallbacks): every length filled, no two draws alike. */
static void test_random(void **state) {
    (void)state;
    uint64_t seen[64];
    for (int i = 0; i < 64; i++) {
        seen[i] = ks_random_u64();
        for (int j = 0; j < i; j++) assert_true(seen[i] != seen[j]);
    }
    unsigned char a[9] = {0}, b[9] = {0};
    ks_random_bytes(a, sizeof a);
    ks_random_bytes(b, sizeof b);
    assert_true(memcmp(a, b, sizeof a) != 0);
    ks_random_bytes(a, 0); /* nothing to fill */
}

/* KS_ASSERT aborts with the condition named where asserts are on (the Debug
 * test builds, KS_ASSERTS), and evaluates nothing where they are off. */
static void test_assert(void **state) {
    (void)state;
    int evaluated = 0;
    KS_ASSERT(++evaluated == 1);
    assert_int_equal(evaluated, KS_ASSERTS_ON ? 1 : 0);
    if (!KS_ASSERTS_ON) return;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        KS_ASSERT(evaluated == 2);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errno_map),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_assert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

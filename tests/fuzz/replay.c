/*
 * replay.c — runs a fuzz target's inputs without libFuzzer (see fuzz.h).
 *
 * Usage: fuzz_replay_<target> PATH...
 * Each PATH is a file or a directory, whose regular files are fed in name
 * order (names starting with '.' skipped). Each input goes through
 * LLVMFuzzerTestOneInput once, as libFuzzer would run it; a failed property
 * aborts. Exit 0 when every input ran, 1 when a path cannot be read or when
 * no input was found at all: a missing corpus is a failure, not a pass.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* libFuzzer's optional hook; a target without it leaves this NULL. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad) {
        fprintf(stderr, "replay: %s: cannot read\n", path);
        free(buf);
        return -1;
    }
    /* A copy of exactly n bytes: ASan then sees any read past the input. */
    uint8_t *in = malloc(n ? n : 1);
    if (!in) {
        free(buf);
        return -1;
    }
    memcpy(in, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(in, n);
    free(in);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int n_inputs = 0, failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            failed = 1;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i]) == 0) n_inputs++; else failed = 1;
            continue;
        }
        struct dirent **names = NULL;
        int n = scandir(argv[i], &names, NULL, by_name);
        if (n < 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            failed = 1;
            continue;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            if (names[k]->d_name[0] != '.' &&
                snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name) < (int)sizeof path &&
                stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
                if (run_file(path) == 0) n_inputs++; else failed = 1;
            }
            free(names[k]);
        }
        free(names);
    }
    printf("replay: %d inputs\n", n_inputs);
    if (n_inputs == 0) fprintf(stderr, "replay: no input found\n");
    return failed || n_inputs == 0 ? 1 : 0;
}

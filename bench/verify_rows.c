/*
 * verify_rows.c — what a speculative verification step costs: the time of
 * one decode of k rows of one sequence (the next token and k - 1 drafted
 * ones) after a prompt, against one row, on the engine kvstash serves with.
 * Speculation pays when the tokens a step yields (1 + accepted) grow faster
 * than this cost; docs/BENCHMARKS.md "Speculative decoding" picks the draft
 * length from it. Not a test: prints a markdown table.
 *
 * usage: bench_verify_rows MODEL [THREADS [PROMPT_TOKENS [REPS]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [THREADS [PROMPT_TOKENS [REPS]]]\n", argv[0]);
        return 2;
    }
    int threads = argc > 2 ? atoi(argv[2]) : 2, n_prompt = argc > 3 ? atoi(argv[3]) : 512;
    int reps = argc > 4 ? atoi(argv[4]) : 30;
    ks_log_set_level(KS_LOG_WARN);
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = argv[1];
    ep.n_seq = 1;
    ep.n_ctx_seq = n_prompt + 128;
    ep.n_threads = threads;
    ks_engine *e = NULL;
    char err[512] = "";
    if (ks_engine_open(&ep, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int nv = ks_engine_n_vocab(e);
    ks_batch *b = ks_batch_create(n_prompt > 64 ? n_prompt : 64);
    srand(1);
    for (int i = 0; i < n_prompt; i++) ks_batch_add(b, 10 + rand() % (nv - 20), i, 0, i == n_prompt - 1);
    if (ks_engine_decode(e, b)) return 1;
    static const int ks[] = {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32};
    double base = 0;
    printf("| rows | median ms | vs 1 row |\n|---:|---:|---:|\n");
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        int k = ks[t];
        double *ms = malloc(sizeof(double) * (size_t)reps);
        for (int r = 0; r < reps + 2; r++) {
            ks_batch_clear(b);
            for (int j = 0; j < k; j++) ks_batch_add(b, 10 + rand() % (nv - 20), n_prompt + j, 0, true);
            double t0 = ks_now_ms();
            if (ks_engine_decode(e, b)) return 1;
            double dt = ks_now_ms() - t0;
            ks_engine_seq_rm(e, 0, n_prompt, -1);
            if (r >= 2) ms[r - 2] = dt; /* two warm-ups */
        }
        qsort(ms, (size_t)reps, sizeof *ms, cmp);
        double med = ms[reps / 2];
        if (k == 1) base = med;
        printf("| %d | %.2f | %.2fx |\n", k, med, med / base);
        free(ms);
    }
    ks_batch_free(b);
    ks_engine_free(e);
    return 0;
}

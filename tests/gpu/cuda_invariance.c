/*
 * cuda_invariance — batch invariance of the engine on a CUDA GPU (issue 27),
 * the GPU counterpart of tests/model/test_invariance.c. Run by
 * tests/gpu/test_cuda_invariance.sh (label gpu) and by the GPU benchmark
 * (bench/gpu/run.sh) as a measurement.
 *
 * usage: cuda_invariance MODEL [NGL]     (NGL: layers on the GPU, default all)
 *
 * For each case: a prompt of P tokens prefilled in chunks of C, then N tokens
 * generated greedily one row at a time; against one prefill of all P + N
 * tokens in chunks of 512. Prints the differing state bytes and whether the
 * last logits are equal, bit for bit, per case, and a row decoded beside
 * another sequence's row against the same row alone. The cases cross the
 * patched flash attention's 256-cell KV chunks (prompts past 256, 512, 1024
 * cells) and the matrix products' tile sizes (chunks of 7, 100, 512 rows).
 *
 * Exit status: 0 when the engine claims batch invariance and every case is
 * identical, or when it does not claim it (the numbers are then only a
 * measurement: the stock kernels); 1 when it claims it and a case differs;
 * 2 on a usage or setup error.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/engine.h"

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void fill_prompt(int32_t *t, int n, int n_vocab, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)(10 + (seed >> 8) % (uint32_t)(n_vocab - 10));
    }
}

static int prefill(ks_engine *e, ks_batch *b, const int32_t *t, int from, int to, int seq) {
    ks_batch_clear(b);
    for (int i = from; i < to; i++)
        if (ks_batch_add(b, t[i], i, seq, i == to - 1) < 0) return -1;
    return ks_engine_decode(e, b);
}

/* One case; returns the number of differing bytes plus 1 when the logits
 * differ, or -1 on a failed decode. */
static long one_case(ks_engine *e, int n_prompt, int n_gen, int chunk) {
    int nv = ks_engine_n_vocab(e);
    int n = n_prompt + n_gen;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    float *la = malloc(sizeof(float) * (size_t)nv);
    ks_batch *b = ks_batch_create(512);
    long out = -1;
    uint8_t *sa = NULL, *sb = NULL;
    if (!t || !la || !b) goto done;
    ks_engine_seq_clear(e, 0);
    fill_prompt(t, n_prompt, nv, (uint32_t)(n_prompt * 7 + chunk));
    for (int i0 = 0; i0 < n_prompt; i0 += chunk)
        if (prefill(e, b, t, i0, i0 + chunk < n_prompt ? i0 + chunk : n_prompt, 0)) goto done;
    for (int g = 0; g < n_gen; g++) {
        t[n_prompt + g] = argmax(ks_engine_logits(e, -1), nv);
        if (prefill(e, b, t, n_prompt + g, n_prompt + g + 1, 0)) goto done;
    }
    memcpy(la, ks_engine_logits(e, -1), sizeof(float) * (size_t)nv);
    size_t sz = ks_engine_state_size(e, 0);
    sa = malloc(sz ? sz : 1);
    sb = malloc(sz ? sz : 1);
    if (!sa || !sb || ks_engine_state_get(e, 0, sa, sz) != sz) goto done;
    ks_engine_seq_clear(e, 0);
    for (int i0 = 0; i0 < n; i0 += 512)
        if (prefill(e, b, t, i0, i0 + 512 < n ? i0 + 512 : n, 0)) goto done;
    const float *lb = ks_engine_logits(e, -1);
    if (ks_engine_state_size(e, 0) != sz || ks_engine_state_get(e, 0, sb, sz) != sz) goto done;
    out = 0;
    for (size_t i = 0; i < sz; i++) out += sa[i] != sb[i];
    float dmax = 0.0f;
    for (int i = 0; i < nv; i++) {
        float d = la[i] > lb[i] ? la[i] - lb[i] : lb[i] - la[i];
        if (d > dmax) dmax = d;
    }
    bool same = memcmp(la, lb, sizeof(float) * (size_t)nv) == 0;
    printf("| %5d | %4d | %5d | %9ld / %-10zu | %-9s | %.3g |\n", n_prompt, chunk, n_gen, out, sz,
           same ? "identical" : "differ", (double)dmax);
    out += !same;
done:
    free(sa);
    free(sb);
    free(t);
    free(la);
    ks_batch_free(b);
    ks_engine_seq_clear(e, 0);
    return out;
}

/* Sequence 0's row beside sequence 1's row against the same row alone. */
static long beside(ks_engine *e) {
    int nv = ks_engine_n_vocab(e);
    int32_t a[300], c[90];
    fill_prompt(a, 300, nv, 11);
    fill_prompt(c, 90, nv, 29);
    ks_batch *b = ks_batch_create(512);
    float *together = malloc(sizeof(float) * (size_t)nv);
    long out = -1;
    if (!b || !together) goto done;
    if (prefill(e, b, a, 0, 299, 0) || prefill(e, b, c, 0, 89, 1)) goto done;
    ks_batch_clear(b);
    int ia = ks_batch_add(b, a[299], 299, 0, true);
    (void)ks_batch_add(b, c[89], 89, 1, true);
    if (ks_engine_decode(e, b)) goto done;
    memcpy(together, ks_engine_logits(e, ia), sizeof(float) * (size_t)nv);
    ks_engine_seq_clear(e, 0);
    ks_engine_seq_clear(e, 1);
    if (prefill(e, b, a, 0, 299, 0) || prefill(e, b, a, 299, 300, 0)) goto done;
    out = memcmp(together, ks_engine_logits(e, -1), sizeof(float) * (size_t)nv) != 0;
    printf("row beside another sequence's row vs alone: logits %s\n", out ? "differ" : "identical");
done:
    free(together);
    ks_batch_free(b);
    ks_engine_seq_clear(e, 0);
    ks_engine_seq_clear(e, 1);
    return out;
}

/* What the kernels in force cost: a 2,048-token prefill in chunks of 512,
 * then 64 lone rows after it (tokens per second, wall clock, one run). */
static void speed(ks_engine *e) {
    enum { P = 2048, G = 64 };
    int nv = ks_engine_n_vocab(e);
    int32_t *t = malloc(sizeof(int32_t) * (P + G));
    ks_batch *b = ks_batch_create(512);
    if (!t || !b) goto done;
    fill_prompt(t, P + G, nv, 77);
    ks_engine_seq_clear(e, 0);
    double t0 = ks_now_ms();
    for (int i0 = 0; i0 < P; i0 += 512)
        if (prefill(e, b, t, i0, i0 + 512, 0)) goto done;
    (void)ks_engine_logits(e, -1);
    double t1 = ks_now_ms();
    for (int g = 0; g < G; g++) {
        if (prefill(e, b, t, P + g, P + g + 1, 0)) goto done;
        (void)ks_engine_logits(e, -1);
    }
    double t2 = ks_now_ms();
    printf("\nspeed: prefill of %d tokens %.0f tok/s; %d lone rows after it %.1f tok/s\n", P, P / (t1 - t0) * 1e3, G,
           G / (t2 - t1) * 1e3);
done:
    free(t);
    ks_batch_free(b);
    ks_engine_seq_clear(e, 0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cuda_invariance MODEL [NGL]\n");
        return 2;
    }
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = argv[1];
    ep.n_seq = 2;
    ep.n_ctx_seq = 4096;
    ep.offload.n_gpu_layers = KS_NGL_ALL;
    if (argc > 2 && strcmp(argv[2], "all")) ep.offload.n_gpu_layers = atoi(argv[2]);
    ks_engine *e = NULL;
    char err[256] = "";
    if (ks_engine_open(&ep, &e, err, sizeof err)) {
        fprintf(stderr, "cuda_invariance: engine open: %s\n", err);
        return 2;
    }
    char where[256];
    ks_engine_offload_desc(e, where, sizeof where);
    const char *inv = getenv("GGML_CUDA_KS_INVARIANT");
    bool claimed = ks_engine_batch_invariant(e);
    printf("model %s; %s; GGML_CUDA_KS_INVARIANT=%s; exact mode %s%s%s\n\n", argv[1], where, inv ? inv : "(unset)",
           ks_engine_exact_mode(e, true), claimed ? "" : ": ",
           claimed ? "" : (ks_engine_exact_reason(e, true) ? ks_engine_exact_reason(e, true) : "?"));
    printf("| prompt | chunk | lone rows | state bytes differing | logits | max abs diff |\n");
    printf("|--:|--:|--:|--:|---|--:|\n");
    static const int cases[][3] = {{5, 512, 40},   {31, 7, 33},    {200, 512, 60}, {250, 100, 20},
                                   {260, 512, 8},  {500, 7, 30},   {700, 100, 20}, {1030, 512, 40},
                                   {1500, 512, 10}, {2100, 100, 30}};
    long bad = 0;
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long d = one_case(e, cases[i][0], cases[i][2], cases[i][1]);
        if (d < 0) failed++;
        else bad += d > 0;
    }
    speed(e);
    long bs = beside(e);
    if (bs < 0) failed++;
    else bad += bs > 0;
    printf("\n%ld of %zu comparisons differ%s; engine claims batch invariance: %s\n", bad,
           sizeof cases / sizeof cases[0] + 1, failed ? " (some decodes failed)" : "", claimed ? "yes" : "no");
    ks_engine_free(e);
    if (failed) return 2;
    return claimed && bad ? 1 : 0;
}

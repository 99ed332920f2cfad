/*
 * Model tests of the hybrid and sliding-window test models (issue 15) and of
 * the llama.cpp facts the checkpoint work builds on (docs/LLAMA_FACTS.md,
 * "Hybrid, recurrent and sliding-window models"), on the engine alone:
 *  - tiny-hybrid (`lfm2`) is hybrid: a partial llama_memory_seq_rm is refused
 *    and leaves the sequence as it was; its partial state (the convolution
 *    layers' recurrent state) has one size whatever the length, and restored
 *    over the live sequence then trimmed, it puts the sequence back exactly;
 *  - tiny-swa (`gemma3`) has a 32-token window: a live sequence trims to any
 *    point, even before the window, and re-decodes exactly (the engine's
 *    full-size SWA cache keeps every cell); a state saved past the window
 *    carries only the window's cells (pos_min > 0 after a restore);
 *  - on both, save -> clear -> restore -> decode is bit-identical to a plain
 *    prefill (within the window for tiny-swa), and greedy output is not one
 *    repeated word.
 *
 * Env: KS_TINY_HYBRID_MODEL, KS_TINY_SWA_MODEL (written by the CTest
 * fixtures: `kvstash mkmodel --preset tiny-hybrid|tiny-swa --seed 1`).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/engine.h"
#include "engine/mkmodel.h"
#include "model/mkmodel_util.h"

#define N_SWA 32 /* the tiny-swa preset's window */

static const char *model_env(const char *var) {
    const char *p = getenv(var);
    if (!p || !*p) fail_msg("%s is not set (run through ctest, or set it)", var);
    return p;
}
static const char *hybrid_model(void) { return model_env("KS_TINY_HYBRID_MODEL"); }
static const char *swa_model(void) { return model_env("KS_TINY_SWA_MODEL"); }
static const char *mamba_model(void) { return model_env("KS_TINY_MAMBA_MODEL"); }

/* A test's engine and scratch: one sequence of 1024 tokens, one thread (the
 * test machine has 2 shared cores). */
typedef struct fx {
    ks_engine *e;
    ks_batch *b;
    int nv;
    int32_t t[1024];
    float *ref, *got;
} fx;

static void fx_open_fa(fx *f, const char *path, int flash_attn) {
    memset(f, 0, sizeof *f);
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = path;
    ep.n_ctx_seq = 1024;
    ep.n_threads = 1;
    ep.flash_attn = flash_attn;
    char err[512] = "";
    int rc = ks_engine_open(&ep, &f->e, err, sizeof err);
    if (rc) fail_msg("ks_engine_open %s: %s (%s)", path, ks_strerror(rc), err);
    f->nv = ks_engine_n_vocab(f->e);
    f->b = ks_batch_create(512);
    f->ref = malloc(sizeof(float) * (size_t)f->nv);
    f->got = malloc(sizeof(float) * (size_t)f->nv);
    assert_non_null(f->b);
    assert_non_null(f->ref);
    assert_non_null(f->got);
    uint32_t x = 12345;
    for (int i = 0; i < 1024; i++) {
        x = x * 1103515245u + 12345u;
        f->t[i] = (int32_t)(10 + (x >> 8) % (uint32_t)(f->nv - 10));
    }
}

static void fx_open(fx *f, const char *path) { fx_open_fa(f, path, KS_FA_AUTO); }

static void fx_close(fx *f) {
    ks_batch_free(f->b);
    ks_engine_free(f->e);
    free(f->ref);
    free(f->got);
}

/* Decodes t[from, to) of sequence 0: as one batch, or one row per token. */
static void dec(fx *f, const int32_t *t, int from, int to, bool lone) {
    if (lone) {
        for (int i = from; i < to; i++) {
            ks_batch_clear(f->b);
            ks_batch_add(f->b, t[i], i, 0, true);
            assert_int_equal(ks_engine_decode(f->e, f->b), 0);
        }
        return;
    }
    ks_batch_clear(f->b);
    for (int i = from; i < to; i++) ks_batch_add(f->b, t[i], i, 0, i == to - 1);
    assert_int_equal(ks_engine_decode(f->e, f->b), 0);
}

static void keep(fx *f, float *dst) {
    const float *l = ks_engine_logits(f->e, -1);
    assert_non_null(l);
    memcpy(dst, l, sizeof(float) * (size_t)f->nv);
}

/* The logits after a plain prefill of t[0, n) in a cleared sequence. */
static void plain(fx *f, const int32_t *t, int n) {
    ks_engine_seq_clear(f->e, 0);
    dec(f, t, 0, n, false);
    keep(f, f->ref);
}

static void assert_same_logits(fx *f, const char *what) {
    if (memcmp(f->ref, f->got, sizeof(float) * (size_t)f->nv) != 0) {
        double m = 0;
        for (int i = 0; i < f->nv; i++) {
            double d = (double)f->ref[i] - (double)f->got[i];
            if (d < 0) d = -d;
            if (d > m) m = d;
        }
        fail_msg("%s: logits differ from a plain prefill (max |d| %g)", what, m);
    }
}

/* Exactness needs lone rows to compute the bits of a batch (the patched CPU
 * backend); elsewhere the exactness tests have nothing to assert. */
static bool exact_here(fx *f) { return ks_engine_batch_invariant(f->e); }

/* ------------------------------------------------------------------ tests */

static void test_presets_shape(void **st) {
    (void)st;
    ks_mkmodel_shape s;
    assert_int_equal(ks_mkmodel_shape_of("tiny-hybrid", &s), 0);
    assert_int_equal(s.n_layer, 4);
    assert_int_equal(s.n_embd, 64);
    assert_int_equal(ks_mkmodel_shape_of("tiny-swa", &s), 0);
    assert_int_equal(s.n_layer, 4);
    /* bench-hybrid at the bench model's scale: 24 layers of 896, Q8_0, 32000 tokens */
    ks_mkmodel_shape b;
    assert_int_equal(ks_mkmodel_shape_of("bench-hybrid", &s), 0);
    assert_int_equal(ks_mkmodel_shape_of("bench", &b), 0);
    assert_int_equal(s.n_layer, b.n_layer);
    assert_int_equal(s.n_embd, b.n_embd);
    assert_int_equal(s.n_vocab, b.n_vocab);
    assert_int_equal(s.wtype, b.wtype);
    assert_true(s.n_params > b.n_params * 9 / 10 && s.n_params < b.n_params * 11 / 10);
    assert_non_null(strstr(ks_mkmodel_presets(), "tiny-hybrid"));
    assert_non_null(strstr(ks_mkmodel_presets(), "tiny-swa"));
    assert_non_null(strstr(ks_mkmodel_presets(), "bench-hybrid"));
}

/* The fixtures' files are the presets' with seed 1, byte for byte. */
static void test_deterministic(void **st) {
    (void)st;
    char dir[] = "/tmp/ks_test_hybrid.XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *presets[] = {"tiny-hybrid", "tiny-swa", "tiny-mamba"};
    const char *fixtures[] = {hybrid_model(), swa_model(), mamba_model()};
    for (int i = 0; i < 3; i++) {
        char path[512], err[256] = "";
        snprintf(path, sizeof path, "%s/%s.gguf", dir, presets[i]);
        assert_int_equal(ks_mkmodel(presets[i], 1, path, err, sizeof err), 0);
        assert_true(mk_same_file(path, fixtures[i]));
        unlink(path);
    }
    rmdir(dir);
}

static void test_hybrid_reports(void **st) {
    (void)st;
    fx f;
    fx_open(&f, hybrid_model());
    assert_true(ks_engine_is_hybrid(f.e));
    assert_false(ks_engine_is_recurrent(f.e));
    assert_false(ks_engine_partial_rm_ok(f.e));
    assert_int_equal(ks_engine_n_swa(f.e), 0);
    assert_int_equal(strncmp(ks_engine_model_desc(f.e), "lfm2", 4), 0);
    /* the probe's decodes ran on the convolution layers too */
    bool patched = strncmp(ks_engine_cpu_backend(), "kvstash-", 8) == 0;
    assert_int_equal(ks_engine_batch_invariant(f.e), patched);
    /* A full slot's state size (warm-start buffers), measured by the probe:
     * the model's shape alone says 0 here (layer 0 has no KV heads). It is
     * at least what 200 tokens take, and about 1024/200 times their KV. */
    size_t max = ks_engine_state_bytes_max(f.e);
    dec(&f, f.t, 0, 200, false);
    size_t sz200 = ks_engine_state_size(f.e, 0), part = ks_engine_state_size_partial(f.e, 0);
    assert_true(max > sz200);
    double per_tok = (double)(sz200 - part) / 200;
    assert_true(max > part + per_tok * 1024 * 0.9 && max < part + per_tok * 1024 * 1.1 + 65536);
    fx_close(&f);
}

static void test_swa_reports(void **st) {
    (void)st;
    fx f;
    fx_open(&f, swa_model());
    assert_false(ks_engine_is_hybrid(f.e));
    assert_false(ks_engine_is_recurrent(f.e));
    assert_true(ks_engine_partial_rm_ok(f.e));
    assert_int_equal(ks_engine_n_swa(f.e), N_SWA);
    assert_int_equal(strncmp(ks_engine_model_desc(f.e), "gemma3", 6), 0);
    bool patched = strncmp(ks_engine_cpu_backend(), "kvstash-", 8) == 0;
    assert_int_equal(ks_engine_batch_invariant(f.e), patched);
    fx_close(&f);
}

/* Fact (a): a partial removal is refused, even of the last token alone, and
 * leaves the sequence as it was: decoding on gives a plain prefill's bits. */
static void test_hybrid_partial_rm_refused(void **st) {
    (void)st;
    fx f;
    fx_open(&f, hybrid_model());
    ks_engine_seq_clear(f.e, 0);
    dec(&f, f.t, 0, 60, false);
    assert_false(ks_engine_seq_rm(f.e, 0, 40, -1));
    assert_false(ks_engine_seq_rm(f.e, 0, 59, -1));
    assert_int_equal(ks_engine_seq_pos_max(f.e, 0), 59);
    assert_true(ks_engine_seq_rm(f.e, 0, 60, -1)); /* nothing to remove */
    dec(&f, f.t, 60, 70, false);
    keep(&f, f.got);
    if (exact_here(&f)) {
        plain(&f, f.t, 70);
        assert_same_logits(&f, "decoding on after a refused seq_rm");
    }
    assert_true(ks_engine_seq_rm(f.e, 0, 0, -1)); /* the whole sequence always goes */
    assert_int_equal(ks_engine_seq_pos_max(f.e, 0), -1);
    fx_close(&f);
}

/* Fact (b): save at n0, clear (after the sequence went elsewhere), restore,
 * decode a batch and lone rows: a plain prefill's bits. */
static void roundtrip(const char *path, const int *cuts, int n_cuts) {
    fx f;
    fx_open(&f, path);
    if (!exact_here(&f)) {
        fx_close(&f);
        skip();
    }
    for (int c = 0; c < n_cuts; c++) {
        int n0 = cuts[c], n1 = n0 + 30, n2 = n1 + 10;
        plain(&f, f.t, n2);
        ks_engine_seq_clear(f.e, 0);
        dec(&f, f.t, 0, n0, false);
        size_t sz = ks_engine_state_size(f.e, 0);
        uint8_t *s = malloc(sz);
        assert_non_null(s);
        assert_int_equal(ks_engine_state_get(f.e, 0, s, sz), sz);
        dec(&f, f.t, n0, n0 + 7, false);
        ks_engine_seq_clear(f.e, 0);
        assert_int_equal(ks_engine_state_set(f.e, 0, s, sz), 0);
        assert_int_equal(ks_engine_seq_pos_max(f.e, 0), n0 - 1);
        dec(&f, f.t, n0, n1, false);
        dec(&f, f.t, n1, n2, true);
        keep(&f, f.got);
        char what[64];
        snprintf(what, sizeof what, "state restored at %d", n0);
        assert_same_logits(&f, what);
        free(s);
    }
    fx_close(&f);
}

static void test_hybrid_state_roundtrip(void **st) {
    (void)st;
    const int cuts[] = {1, 16, 40, 100, 200};
    roundtrip(hybrid_model(), cuts, 5);
}

/* Within the window: a state saved past it is not a prefill's unless it is
 * aligned (see test_swa_aligned_restores and
 * test_swa_restored_state_holds_the_window). */
static void test_swa_state_roundtrip(void **st) {
    (void)st;
    const int cuts[] = {1, 16, N_SWA};
    roundtrip(swa_model(), cuts, 3);
}

/* Past the window, a state whose window starts at a multiple of 64 tokens
 * (n = N_SWA + 64k) restores to the bits of the live sequence, and so does
 * a restored sequence cut back no further than its first window allows
 * (ks_engine_state_restorable; docs/LLAMA_FACTS.md, "Sliding window:
 * restores at aligned lengths"). With and without flash attention; on
 * tiny-gptoss (attention sinks, MXFP4 experts) too. */
static void aligned_roundtrip(const char *path, int fa) {
    fx f;
    fx_open_fa(&f, path, fa);
    int w = ks_engine_n_swa(f.e);
    assert_int_equal(w, N_SWA);
    assert_true(ks_engine_state_restorable(f.e, 1) && ks_engine_state_restorable(f.e, w));
    assert_false(ks_engine_state_restorable(f.e, w + 1) || ks_engine_state_restorable(f.e, 200));
    assert_true(ks_engine_state_restorable(f.e, w + 64) && ks_engine_state_restorable(f.e, w + 640));
    assert_int_equal(ks_engine_restorable_floor(f.e, 200), w + 128);
    assert_int_equal(ks_engine_restorable_floor(f.e, 20), 20);
    if (!exact_here(&f)) {
        fx_close(&f);
        return;
    }
    const int cuts[] = {w + 64, w + 128, w + 256, w + 384}; /* n2 within one batch of 512 */
    for (int c = 0; c < 4; c++) {
        int n0 = cuts[c], n1 = n0 + 30, n2 = n1 + 10;
        plain(&f, f.t, n2);
        ks_engine_seq_clear(f.e, 0);
        dec(&f, f.t, 0, n0, false);
        size_t sz = ks_engine_state_size(f.e, 0);
        uint8_t *st = malloc(sz);
        assert_non_null(st);
        assert_int_equal(ks_engine_state_get(f.e, 0, st, sz), sz);
        dec(&f, f.t, n0, n0 + 7, false); /* the slot went on elsewhere */
        ks_engine_seq_clear(f.e, 0);
        assert_int_equal(ks_engine_state_set(f.e, 0, st, sz), 0);
        assert_int_equal(ks_engine_seq_pos_min(f.e, 0), n0 - w);
        dec(&f, f.t, n0, n1, false);
        dec(&f, f.t, n1, n2, true);
        keep(&f, f.got);
        char what[96];
        snprintf(what, sizeof what, "%s, flash attention %d: state restored at %d", path, fa, n0);
        assert_same_logits(&f, what);
        /* cut back to where the first window is still whole, decode on */
        int cut = n0 + 1;
        assert_true(ks_engine_seq_rm(f.e, 0, cut, -1));
        dec(&f, f.t, cut, n1, false);
        dec(&f, f.t, n1, n2, true);
        keep(&f, f.got);
        snprintf(what, sizeof what, "%s, flash attention %d: restored at %d, cut to %d", path, fa, n0, cut);
        assert_same_logits(&f, what);
        free(st);
    }
    fx_close(&f);
}

static void test_swa_aligned_restores(void **st) {
    (void)st;
    const char *moe = getenv("KS_TINY_GPTOSS_MODEL");
    for (int fa = KS_FA_OFF; fa <= KS_FA_ON; fa++) {
        aligned_roundtrip(swa_model(), fa);
        if (moe && *moe) aligned_roundtrip(moe, fa);
    }
}

/* The partial state after t[0, k) is taken, t goes on to 205 tokens, the
 * removal of the suffix after k is refused; with the checkpoint set over
 * the live sequence it is accepted, the sequence is t[0, k), and other
 * tokens from there decode to a plain prefill's bits. */
static void checkpoint_then_other(fx *f, int k) {
    int n = 200, m = k + 40;
    int32_t other[1024];
    memcpy(other, f->t, sizeof other);
    for (int i = k; i < m; i++) other[i] = (int32_t)(10 + (f->t[i] * 7 + 3) % (f->nv - 10));
    plain(f, other, m);

    ks_engine_seq_clear(f->e, 0);
    dec(f, f->t, 0, k, false);
    size_t sz = ks_engine_state_size_partial(f->e, 0);
    uint8_t *s = malloc(sz);
    assert_non_null(s);
    assert_int_equal(ks_engine_state_get_partial(f->e, 0, s, sz), sz);
    dec(f, f->t, k, n, false);
    dec(f, f->t, n, n + 5, true);
    assert_false(ks_engine_seq_rm(f->e, 0, k, -1)); /* without the checkpoint: refused */
    assert_int_equal(ks_engine_state_set_partial(f->e, 0, s, sz), 0);
    assert_true(ks_engine_seq_rm(f->e, 0, k, -1));
    assert_int_equal(ks_engine_seq_pos_max(f->e, 0), k - 1);
    dec(f, other, k, m - 10, false);
    dec(f, other, m - 10, m, true);
    keep(f, f->got);
    if (exact_here(f)) {
        char what[64];
        snprintf(what, sizeof what, "checkpoint at %d", k);
        assert_same_logits(f, what);
    }
    free(s);
}

/* Fact (d) and the checkpoint: the partial state of a hybrid sequence is the
 * recurrent part alone, one size at every length and far smaller than the
 * full state; restored over the live sequence, then the attention KV trimmed
 * after it, the sequence is back at the checkpoint: other tokens from there
 * decode to a plain prefill's bits. */
static void test_hybrid_partial_checkpoint(void **st) {
    (void)st;
    fx f;
    fx_open(&f, hybrid_model());
    size_t fixed = 0;
    for (int n = 1; n <= 257; n += 64) {
        ks_engine_seq_clear(f.e, 0);
        dec(&f, f.t, 0, n, false);
        size_t p = ks_engine_state_size_partial(f.e, 0);
        if (!fixed) fixed = p;
        assert_int_equal(p, fixed);
        if (n > 1) assert_true(ks_engine_state_size(f.e, 0) > 10 * p);
    }
    /* 2 convolution layers x (l_cache - 1 = 2) inputs x 64 floats, and headers */
    assert_true(fixed >= 2 * 2 * 64 * sizeof(float) && fixed < 2 * 2 * 64 * sizeof(float) + 256);

    const int ks[] = {1, 20, 80, 150};
    for (int c = 0; c < 4; c++) checkpoint_then_other(&f, ks[c]);
    fx_close(&f);
}

/* Fact (e), live: 200 tokens decoded (far past the window), the sequence
 * trims back to any point, before the window too, and re-decodes to a plain
 * prefill's bits: the engine's SWA cache is full-size (llama's default
 * swa_full), so no cell ever left it. */
static void test_swa_trim_before_window(void **st) {
    (void)st;
    fx f;
    fx_open(&f, swa_model());
    const int trims[] = {190, 150, 100, 20};
    for (int k = 0; k < 4; k++) {
        plain(&f, f.t, 200);
        ks_engine_seq_clear(f.e, 0);
        dec(&f, f.t, 0, 200, false);
        assert_int_equal(ks_engine_seq_pos_min(f.e, 0), 0);
        assert_true(ks_engine_seq_rm(f.e, 0, trims[k], -1));
        assert_int_equal(ks_engine_seq_pos_max(f.e, 0), trims[k] - 1);
        dec(&f, f.t, trims[k], 200, false);
        keep(&f, f.got);
        if (exact_here(&f)) {
            char what[64];
            snprintf(what, sizeof what, "trimmed to %d", trims[k]);
            assert_same_logits(&f, what);
        }
    }
    fx_close(&f);
}

/* Fact (e), restored: llama's state of an SWA sequence leaves out the cells
 * the window masked, so after a restore the sequence holds only the last
 * N_SWA positions of the sliding layers (pos_min). The checkpoint work must
 * not trim such a sequence below pos_min + N_SWA: llama's seq_rm returns
 * true there although the cells the new tokens need are gone. */
static void test_swa_restored_state_holds_the_window(void **st) {
    (void)st;
    fx f;
    fx_open(&f, swa_model());
    ks_engine_seq_clear(f.e, 0);
    dec(&f, f.t, 0, 200, false);
    size_t sz = ks_engine_state_size(f.e, 0);
    uint8_t *s = malloc(sz);
    assert_non_null(s);
    assert_int_equal(ks_engine_state_get(f.e, 0, s, sz), sz);
    ks_engine_seq_clear(f.e, 0);
    assert_int_equal(ks_engine_state_set(f.e, 0, s, sz), 0);
    assert_int_equal(ks_engine_seq_pos_min(f.e, 0), 200 - N_SWA);
    assert_int_equal(ks_engine_seq_pos_max(f.e, 0), 199);
    /* the partial state is the window: one size past it */
    size_t p200 = ks_engine_state_size_partial(f.e, 0);
    dec(&f, f.t, 200, 264, false);
    assert_int_equal(ks_engine_state_size_partial(f.e, 0), p200);
    assert_true(p200 < sz / 4);
    free(s);
    fx_close(&f);
}

/* Greedy replies read as text: not one token repeated (the generator's
 * scales, design notes 4 and 7 of mkmodel.h). */
static void greedy_varied(const char *path) {
    ks_engine *e = mk_open_engine(path, 1024);
    const char *qs[] = {"hello", "What is the water like in the river?", "tell me a story about a dog", "why"};
    int n_ended = 0;
    for (int q = 0; q < 4; q++) {
        ks_msg m[2] = {{"system", "You are a helpful assistant."}, {"user", qs[q]}};
        char *text = NULL;
        assert_int_equal(ks_engine_template(e, m, 2, true, &text), 0);
        ks_tokens t = {0};
        assert_int_equal(ks_engine_tokenize(e, text, strlen(text), true, true, &t), 0);
        ks_engine_seq_clear(e, 0);
        int32_t out[48];
        int n = mk_generate(e, &t, 48, out);
        int top = 0;
        for (int i = 0; i < n; i++) {
            int c = 0;
            for (int j = 0; j < n; j++) c += out[j] == out[i];
            if (c > top) top = c;
        }
        n_ended += ks_engine_is_eog(e, out[n - 1]);
        if (n >= 8 && top * 2 > n) fail_msg("%s: reply to '%s' repeats one token %d of %d times", path, qs[q], top, n);
        assert_true(n >= 1);
        free(text);
        ks_tokens_free(&t);
    }
    assert_true(n_ended >= 1); /* replies end sometimes */
    ks_engine_free(e);
}

static void test_greedy_varied(void **st) {
    (void)st;
    greedy_varied(hybrid_model());
    greedy_varied(swa_model());
    greedy_varied(mamba_model());
}

/* tiny-mamba (a recurrent memory, no KV at all): llama.cpp reports it
 * recurrent, refuses to drop a suffix, and the probe's decodes run on it. */
static void test_mamba_reports(void **st) {
    (void)st;
    fx f;
    fx_open(&f, mamba_model());
    assert_true(ks_engine_is_recurrent(f.e));
    assert_false(ks_engine_is_hybrid(f.e));
    assert_false(ks_engine_partial_rm_ok(f.e));
    assert_int_equal(strncmp(ks_engine_model_desc(f.e), "mamba", 5), 0);
    bool patched = strncmp(ks_engine_cpu_backend(), "kvstash-", 8) == 0;
    assert_int_equal(ks_engine_batch_invariant(f.e), patched);
    fx_close(&f);
}

static void test_mamba_state_roundtrip(void **st) {
    (void)st;
    const int cuts[] = {1, 16, 40, 100, 200};
    roundtrip(mamba_model(), cuts, 5);
}

/* A recurrent memory's partial state is its whole state (one size at every
 * length: the last token's), and a checkpoint works as on the hybrid model:
 * set over the live sequence, the suffix removal it refused before is a
 * no-op the memory accepts, and decoding on gives a plain prefill's bits. */
static void test_mamba_checkpoint(void **st) {
    (void)st;
    fx f;
    fx_open(&f, mamba_model());
    size_t fixed = 0;
    for (int n = 1; n <= 257; n += 64) {
        ks_engine_seq_clear(f.e, 0);
        dec(&f, f.t, 0, n, false);
        size_t p = ks_engine_state_size_partial(f.e, 0);
        if (!fixed) fixed = p;
        assert_int_equal(p, fixed);
        assert_int_equal(ks_engine_state_size(f.e, 0), p);
    }
    const int ks[] = {1, 20, 150};
    for (int c = 0; c < 3; c++) checkpoint_then_other(&f, ks[c]);
    fx_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_shape),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_hybrid_reports),
        cmocka_unit_test(test_swa_reports),
        cmocka_unit_test(test_hybrid_partial_rm_refused),
        cmocka_unit_test(test_hybrid_state_roundtrip),
        cmocka_unit_test(test_swa_state_roundtrip),
        cmocka_unit_test(test_hybrid_partial_checkpoint),
        cmocka_unit_test(test_swa_trim_before_window),
        cmocka_unit_test(test_swa_restored_state_holds_the_window),
        cmocka_unit_test(test_swa_aligned_restores),
        cmocka_unit_test(test_greedy_varied),
        cmocka_unit_test(test_mamba_reports),
        cmocka_unit_test(test_mamba_state_roundtrip),
        cmocka_unit_test(test_mamba_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

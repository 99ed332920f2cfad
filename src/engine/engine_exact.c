/*
 * engine_exact.c — the engine's exactness: the open-time warm-up and
 * batch-invariance probe (ks__engine_probe, run once by ks_engine_open), and
 * what it makes of it (ks_engine_exact_how/_mode/_reason). See engine.h.
 *
 * Thread model: the probe runs inside ks_engine_open, before the engine is
 * shared; the getters read fields the open wrote.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine_int.h"
#include "ggml-backend.h"
#include "llama.h"

#define MOD "engine"

/* The warm-up and batch-invariance probe, run once by ks_engine_open.
 * A: PROBE_N tokens prefilled in one batch in sequence 0. B: A's first
 * PROBE_PRE kept (the others dropped; a memory that cannot drop a suffix
 * decodes them again as one batch), then the others one at a time. 8 lone
 * rows and no second batch where the memory allows (it was 16 and one more
 * batch: 0.6 s of every first load of the bench-q4k model at 2 threads, the
 * half of it gone). Both run the model's
 * real kernels on its real weights (repacked or not, whatever the CPU backend
 * chose), so an identical sequence state and identical last logits, bit for
 * bit, mean a token decoded alone computes what it computes inside a
 * prefill: the scheduler can then decode generated tokens one row each and
 * stay exact (no pairs). The probe alone cannot prove invariance: on a small
 * F16 model the prebuilt's drift is rare enough (25 state bytes in 40 tokens
 * in one run, none in this probe's 16) to slip through, so only the patched
 * backend is ever called invariant, and the probe is its safety net for
 * kernels the patch does not cover (on a real model a drift shows in
 * thousands of bytes: 332,427 of 4.5 MB for 64 tokens on the bench model).
 * It also pages the weights in and builds the one-row and
 * many-row graphs, so the first request costs what later ones do. Flash
 * attention counts as invariant only with the patch's revision 2: the stock
 * CPU kernel changes its tiling with the number of rows, the KV length and
 * the thread count, in ways 32 tokens would not show (docs/LLAMA_FACTS.md). */
/* Whether the K/V types take the patched CPU backend's tiled flash-attention
 * kernel: F16 or F32, both the same (revision 2); from revision 5 also the
 * quantized KV cache types and mixed ones, each K and V row dequantized into
 * F32 in the tile (docs/LLAMA_FACTS.md). Otherwise the stock per-row path,
 * which splits a decoded row's KV among the threads. */
static bool kv_cache_type(int t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_F32 || t == GGML_TYPE_BF16 || t == GGML_TYPE_Q8_0 ||
           t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q4_1 || t == GGML_TYPE_IQ4_NL || t == GGML_TYPE_Q5_0 ||
           t == GGML_TYPE_Q5_1;
}

bool ks__kv_tiled(int type_k, int type_v) {
    int k = type_k < 0 ? GGML_TYPE_F16 : type_k, v = type_v < 0 ? GGML_TYPE_F16 : type_v;
    if (k == v && (k == GGML_TYPE_F16 || k == GGML_TYPE_F32)) return true;
    return ks__g_patch_rev >= 5 && kv_cache_type(k) && kv_cache_type(v);
}

#define PROBE_N 24
#define PROBE_PRE 16

/* B of the probe, in sequence 0, which holds A's PROBE_N tokens: with
 * `trim` (a memory that drops a suffix) the tokens from PROBE_PRE on are
 * dropped, so A's batch gives B its prefix; without, the sequence is cleared
 * and tok[0, PROBE_PRE) decoded again as one batch. Then each later token
 * alone — or, with pairs, beside a throwaway copy of itself at the next
 * position that is removed right after, as the scheduler's fallback decodes
 * (step.c). The sequence state (sz bytes) goes to st and the last token's
 * logits to lo; false when a decode failed or the state is not sz bytes.
 * With sz_pre, the state's size at PROBE_PRE tokens. */
static bool probe_rows(ks_engine *e, struct llama_batch *b, const llama_token *tok, bool trim, bool pairs,
                       uint8_t *st, size_t sz, float *lo, size_t *sz_pre) {
    llama_memory_t mem = llama_get_memory(e->ctx);
    bool ok = true;
    if (trim) {
        ok = llama_memory_seq_rm(mem, 0, PROBE_PRE, -1);
    } else {
        llama_memory_clear(mem, true);
        for (int i = 0; i < PROBE_PRE; i++) {
            b->token[i] = tok[i]; b->pos[i] = i; b->n_seq_id[i] = 1; b->seq_id[i][0] = 0; b->logits[i] = 0;
        }
        b->n_tokens = PROBE_PRE;
        ok = llama_decode(e->ctx, *b) == 0;
    }
    if (ok && sz_pre) *sz_pre = llama_state_seq_get_size(e->ctx, 0);
    for (int i = PROBE_PRE; ok && i < PROBE_N; i++) {
        b->token[0] = tok[i]; b->pos[0] = i; b->n_seq_id[0] = 1; b->seq_id[0][0] = 0; b->logits[0] = i == PROBE_N - 1;
        b->n_tokens = 1;
        if (pairs) {
            b->token[1] = tok[i]; b->pos[1] = i + 1; b->n_seq_id[1] = 1; b->seq_id[1][0] = 0; b->logits[1] = 0;
            b->n_tokens = 2;
        }
        ok = llama_decode(e->ctx, *b) == 0 && (!pairs || llama_memory_seq_rm(mem, 0, i + 1, -1));
    }
    const float *l = NULL;
    ok = ok && (l = llama_get_logits_ith(e->ctx, 0)) != NULL && llama_state_seq_get_size(e->ctx, 0) == sz &&
         llama_state_seq_get_data(e->ctx, st, sz, 0) == sz;
    if (ok) memcpy(lo, l, sizeof(float) * (size_t)e->n_vocab);
    return ok;
}

/* With a GPU: after the probe's PROBE_N tokens in sequence 0, one batch of
 * up to GPU_WARM_N tokens and one lone token after it, so that a new
 * process's first prefill does not pay for loading the large-batch kernels
 * (CUDA loads a kernel at its first launch) and the first request after a
 * restart costs what later ones do. CUDA only: on Vulkan (the tests' Mesa
 * device) each new shape compiles pipelines, seconds per server start. */
#define GPU_WARM_N 512
static void gpu_warm(ks_engine *e) {
    int n = GPU_WARM_N < e->n_batch ? GPU_WARM_N : e->n_batch;
    if (n > e->n_ctx_seq - PROBE_N - 2) n = e->n_ctx_seq - PROBE_N - 2;
    if (n < 2) return;
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = (llama_token)((uint32_t)(i * 2654435761u) % (uint32_t)e->n_vocab);
        b.pos[i] = PROBE_N + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = i == n - 1;
    }
    b.n_tokens = n;
    bool ok = llama_decode(e->ctx, b) == 0;
    b.token[0] = b.token[n - 1]; b.pos[0] = PROBE_N + n; b.logits[0] = true;
    b.n_tokens = 1;
    ok = ok && llama_decode(e->ctx, b) == 0;
    if (!ok) KS_DEBUG(MOD, "the GPU warm-up batch did not decode");
    llama_batch_free(b);
}

/* Whether every kernel the model runs is one kvstash knows to be
 * batch-invariant on its GPU (docs/LLAMA_FACTS.md, "Batch invariance on
 * CUDA"): the CUDA module's patch in force on every device (its MMQ products
 * and its one flash-attention kernel), so every matrix weight quantized, flash
 * attention on over an F16 KV, a per-sequence context that is a multiple of
 * the kernel's 256-cell KV chunks, and layers left on the CPU only with the
 * patched CPU backend. When not, why (into why[0..n) when given). */
bool ks__gpu_kernels_ok(const ks_engine *e, char *why, size_t n) {
    const ks_engine_offload *o = &e->off;
    const char *r = NULL;
    if (!o->cuda_invariant)
        r = ks_devices_cuda_patched() ? "the CUDA module's batch-invariant kernels are off (GGML_CUDA_KS_INVARIANT)"
                                      : "only CUDA devices with kvstash's patched module have batch-invariant "
                                        "kernels";
    else if (!o->weights_quant)
        r = "the model has matrix weights of a float type, whose CUDA products the patch does not cover";
    else if (!e->flash_attn || (e->type_k >= 0 && e->type_k != GGML_TYPE_F16) ||
             (e->type_v >= 0 && e->type_v != GGML_TYPE_F16))
        r = "the patched CUDA attention is the flash-attention kernel over an F16 KV cache";
    else if (e->n_ctx_seq % 256)
        r = "the per-sequence context is not a multiple of 256 cells (the patched flash attention's KV chunk)";
    else if (o->n_gpu_layers < o->n_layers && !(ks__g_patched && ks__g_patch_rev >= 2))
        r = "layers left on the CPU need setup's patched CPU backend";
    if (r && why) snprintf(why, n, "%s", r);
    return r == NULL;
}

/* The probe's verdicts of this process, by what decides them: the same
 * model file (path, size, modification time) under the same kernels and
 * settings (threads, flash attention, KV types, repacking, context shape) is
 * probed once. A model unloaded and loaded again (several models, server.h)
 * then skips the probe's 18 decodes (~0.5 s on the bench model at 2 threads).
 * The CPU only: a GPU's probe also warms its kernels up (gpu_warm). */
typedef struct probe_memo {
    char path[1024];
    int64_t size, mtime_ns;
    int n_threads, flash_attn, type_k, type_v, n_ctx_seq, n_seq, n_batch;
    bool repack;
    bool invariant, pairs_ok, probe_ran;
    size_t probe_size, probe_diff, state_per_tok, state_fixed;
} probe_memo;
enum { PROBE_MEMO_MAX = 32 };
static probe_memo g_memo[PROBE_MEMO_MAX];
static int g_memo_n;
static pthread_mutex_t g_memo_mu = PTHREAD_MUTEX_INITIALIZER;

/* e's key into *k (false: not memoizable). */
static bool memo_key(const ks_engine *e, probe_memo *k) {
    struct stat st;
    if (e->gpu || !e->path || !e->path[0] || strlen(e->path) >= sizeof k->path || stat(e->path, &st)) return false;
    memset(k, 0, sizeof *k);
    snprintf(k->path, sizeof k->path, "%s", e->path);
    k->size = (int64_t)st.st_size;
    k->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    k->n_threads = e->n_threads;
    k->flash_attn = e->flash_attn;
    k->type_k = e->type_k;
    k->type_v = e->type_v;
    k->n_ctx_seq = e->n_ctx_seq;
    k->n_seq = e->n_seq;
    k->n_batch = e->n_batch;
    k->repack = e->repack;
    return true;
}

static bool memo_same(const probe_memo *a, const probe_memo *b) {
    return !strcmp(a->path, b->path) && a->size == b->size && a->mtime_ns == b->mtime_ns &&
           a->n_threads == b->n_threads && a->flash_attn == b->flash_attn && a->type_k == b->type_k &&
           a->type_v == b->type_v && a->n_ctx_seq == b->n_ctx_seq && a->n_seq == b->n_seq &&
           a->n_batch == b->n_batch && a->repack == b->repack;
}

static void probe_run(ks_engine *e);

void ks__engine_probe(ks_engine *e) {
    probe_memo k;
    bool keyed = memo_key(e, &k);
    if (keyed) {
        pthread_mutex_lock(&g_memo_mu);
        const probe_memo *hit = NULL;
        for (int i = 0; i < g_memo_n && !hit; i++)
            if (memo_same(&g_memo[i], &k)) hit = &g_memo[i];
        if (hit) {
            e->invariant = hit->invariant;
            e->pairs_ok = hit->pairs_ok;
            e->probe_ran = hit->probe_ran;
            e->probe_size = hit->probe_size;
            e->probe_diff = hit->probe_diff;
            e->state_per_tok = hit->state_per_tok;
            e->state_fixed = hit->state_fixed;
            e->warm_ms = 0;
        }
        pthread_mutex_unlock(&g_memo_mu);
        if (hit) {
            KS_DEBUG(MOD, "probe: this process's verdict for %s with the same settings (invariant %d, pairs %d)",
                     e->path, (int)e->invariant, (int)e->pairs_ok);
            return;
        }
    }
    probe_run(e);
    if (!keyed || !e->probe_ran) return;
    k.invariant = e->invariant;
    k.pairs_ok = e->pairs_ok;
    k.probe_ran = e->probe_ran;
    k.probe_size = e->probe_size;
    k.probe_diff = e->probe_diff;
    k.state_per_tok = e->state_per_tok;
    k.state_fixed = e->state_fixed;
    pthread_mutex_lock(&g_memo_mu);
    g_memo[g_memo_n < PROBE_MEMO_MAX ? g_memo_n++ : PROBE_MEMO_MAX - 1] = k;
    pthread_mutex_unlock(&g_memo_mu);
}

static void probe_run(ks_engine *e) {
    double t0 = ks_now_ms();
    e->invariant = false;
    e->pairs_ok = false;
    e->probe_ran = false;
    if (e->n_ctx_seq < PROBE_N + 2 || e->n_batch < PROBE_N) return;
    struct llama_batch b = llama_batch_init(PROBE_N, 0, 1);
    float *la = malloc(sizeof(float) * (size_t)e->n_vocab), *lb = malloc(sizeof(float) * (size_t)e->n_vocab);
    uint8_t *sa = NULL, *sb = NULL;
    size_t sz = 0;
    llama_memory_t mem = llama_get_memory(e->ctx);
    bool ok = la != NULL && lb != NULL;
    uint32_t x = 2463534242u;
    llama_token tok[PROBE_N];
    for (int i = 0; i < PROBE_N; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        tok[i] = (llama_token)(x % (uint32_t)e->n_vocab);
    }
    /* A */
    for (int i = 0; i < PROBE_N; i++) {
        b.token[i] = tok[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = i == PROBE_N - 1;
    }
    b.n_tokens = PROBE_N;
    const float *l = NULL;
    if (ok && llama_decode(e->ctx, b) == 0 && (l = llama_get_logits_ith(e->ctx, PROBE_N - 1))) {
        memcpy(la, l, sizeof(float) * (size_t)e->n_vocab);
        sz = llama_state_seq_get_size(e->ctx, 0);
        sa = malloc(sz ? sz : 1);
        sb = malloc(sz ? sz : 1);
        ok = sa && sb && llama_state_seq_get_data(e->ctx, sa, sz, 0) == sz;
    } else {
        ok = false;
    }
    /* B, lone rows */
    size_t sz_pre = 0;
    /* Not on a GPU, where the probe is cheap: Mesa's lavapipe (the tests'
     * Vulkan device) crashed in a later request, 2 runs in 10, after a probe
     * that dropped the suffix (e2e_vulkan, store tiers). */
    bool trim = ks_engine_partial_rm_ok(e) && !e->gpu;
    ok = ok && probe_rows(e, &b, tok, trim, false, sb, sz, lb, &sz_pre);
    /* A state's size at PROBE_PRE and PROBE_N tokens: what it takes per
     * token (KV) and apart from them (headers, a recurrent state). */
    if (ok && sz > sz_pre) {
        e->state_per_tok = (sz - sz_pre) / (PROBE_N - PROBE_PRE);
        e->state_fixed = sz > e->state_per_tok * PROBE_N ? sz - e->state_per_tok * PROBE_N : 0;
    }
    /* Only the patched CPU backend's kernels are known to be invariant: with
     * a GPU computing any part of the model the probe still runs there (it
     * reports what it sees), but nothing is called invariant (note 3). */
    bool kernels_ok = ks__g_patched && !e->gpu &&
                      (!e->flash_attn || (ks__g_patch_rev >= 2 && ks__kv_tiled(e->type_k, e->type_v)));
    if (e->gpu) kernels_ok = ks__gpu_kernels_ok(e, NULL, 0);
    if (ok) {
        e->probe_size = sz;
        e->probe_diff = 0;
        for (size_t k = 0; k < sz; k++) e->probe_diff += sa[k] != sb[k];
        bool same_logits = memcmp(la, lb, sizeof(float) * (size_t)e->n_vocab) == 0;
        e->invariant = kernels_ok && same_logits && e->probe_diff == 0;
        if (e->gpu)
            KS_DEBUG(MOD, "probe on %s: %zu of %zu state bytes differ, logits %s", e->off.dev[0].name, e->probe_diff,
                     sz, same_logits ? "identical" : "differ");
        else
            KS_DEBUG(MOD, "probe on the CPU (flash attention %s, K %s, V %s): %zu of %zu state bytes differ, logits %s",
                     e->flash_attn ? "on" : "off", ks_engine_kv_type_name(e->type_k),
                     ks_engine_kv_type_name(e->type_v), e->probe_diff, sz, same_logits ? "identical" : "differ");
    }
    /* B again as pairs, where lone rows differ on the CPU and a sequence can
     * drop its throwaway row. Pairs are only trusted where lone rows differ in
     * the known way — one-row products summed in another order than products
     * of two or more (the prebuilt backend) — and flash attention, whose stock
     * kernel retiles with the KV length where 32 tokens cannot show it, is
     * off or the patched one: a kernel that switches at more rows (the IQ
     * panel gemm at 8, docs/LLAMA_FACTS.md) fails here, and exactness is then
     * unavailable, not falsely claimed. A GPU picks its kernels by the row
     * count: pairs do not make it exact (note 3). */
    bool fa_ok = !e->flash_attn || (ks__g_patched && ks__g_patch_rev >= 2 && ks__kv_tiled(e->type_k, e->type_v));
    if (ok && !e->invariant && !e->gpu && fa_ok && ks_engine_partial_rm_ok(e)) {
        ok = probe_rows(e, &b, tok, true, true, sb, sz, lb, NULL);
        e->pairs_ok = ok && memcmp(la, lb, sizeof(float) * (size_t)e->n_vocab) == 0 && memcmp(sa, sb, sz) == 0;
    }
    if (ok && kernels_ok && !e->invariant)
        KS_WARN(MOD, "this model's kernels are not batch-invariant even in the patched CPU backend "
                     "(a lone token drifted from its prefill)%s",
                e->pairs_ok ? "; decoding in pairs to stay exact" : "");
    if (ok && e->gpu && !strncmp(e->off.dev[0].name, "CUDA", 4)) gpu_warm(e);
    llama_memory_clear(mem, true);
    free(la);
    free(lb);
    free(sa);
    free(sb);
    llama_batch_free(b);
    e->warm_ms = ks_now_ms() - t0;
    e->probe_ran = ok;
    if (!ok) KS_WARN(MOD, "the warm-up decode failed; decoding as if kernels were not batch-invariant");
}

ks_exact_how ks_engine_exact_how(const ks_engine *e, bool exact) {
    if (!exact) return KS_EXACT_OFF;
    if (e->invariant) return KS_EXACT_INVARIANT;
    /* Pairs do not make a GPU exact: it picks its kernels by the batch's row
     * count (note 3); only the patched CUDA kernels are (ks__gpu_kernels_ok). */
    if (e->gpu) return KS_EXACT_UNAVAILABLE;
    /* the scheduler's rule (sched.c): pairs where the probe found them exact
     * (which needs a trimmable memory) */
    return e->pairs_ok ? KS_EXACT_PAIRS : KS_EXACT_UNAVAILABLE;
}

const char *ks_engine_exact_mode(const ks_engine *e, bool exact) {
    switch (ks_engine_exact_how(e, exact)) {
    case KS_EXACT_INVARIANT: return "batch-invariant";
    case KS_EXACT_PAIRS: return "pairs";
    case KS_EXACT_UNAVAILABLE: return "unavailable";
    default: return "off";
    }
}

/* e->exact_reason for ks_engine_exact_reason, once the probe ran. */
void ks__engine_exact_reason(ks_engine *e) {
    char *r = e->exact_reason;
    size_t n = sizeof e->exact_reason;
    r[0] = '\0';
    if (e->gpu) {
        size_t l = 0;
        char why[160];
        for (int i = 0; i < e->off.n_devices && l + 1 < n; i++)
            l += (size_t)snprintf(r + l, n - l, "%s%s", i ? "+" : "", e->off.dev[i].name);
        if (!ks__gpu_kernels_ok(e, why, sizeof why)) {
            if (l + 1 < n) l += (size_t)snprintf(r + l, n - l, " kernels are not batch-invariant here: %s", why);
        } else if (l + 1 < n) {
            l += (size_t)snprintf(r + l, n - l, " kernels drifted in the open-time probe");
        }
        if (l + 1 < n && e->probe_ran && e->probe_diff)
            snprintf(r + l, n - l, " (the open-time probe: %zu of %zu state bytes differ)", e->probe_diff,
                     e->probe_size);
    } else if (!e->invariant && !ks_engine_partial_rm_ok(e)) {
        snprintf(r, n, "the CPU backend is not batch-invariant here and a %s memory cannot decode in pairs",
                 ks_engine_is_hybrid(e) ? "hybrid" : "recurrent");
    } else if (!e->invariant && !e->pairs_ok && !e->probe_ran) {
        snprintf(r, n, "the open-time probe's decodes failed");
    } else if (!e->invariant && !e->pairs_ok && e->flash_attn && !ks__kv_tiled(e->type_k, e->type_v)) {
        snprintf(r, n, "flash attention over a %s K / %s V cache takes the stock per-row kernel, which is not "
                       "batch-invariant (the patched tiled kernel covers F16 and F32 K/V, and from the patch's "
                       "revision 5 the quantized types; docs/LLAMA_FACTS.md)",
                 ks_engine_kv_type_name(e->type_k), ks_engine_kv_type_name(e->type_v));
    } else if (!e->invariant && !e->pairs_ok) {
        snprintf(r, n, "this model's CPU kernels are not batch-invariant, decoded alone or in pairs (%s; "
                       "docs/LLAMA_FACTS.md)",
                 e->flash_attn && !(ks__g_patched && ks__g_patch_rev >= 2) ? "the prebuilt flash-attention kernel"
                                                                   : "a kernel the patch does not cover, e.g. "
                                                                     "ggml's IQ panel gemm");
    }
}

const char *ks_engine_exact_reason(const ks_engine *e, bool exact) {
    return ks_engine_exact_how(e, exact) == KS_EXACT_UNAVAILABLE && e->exact_reason[0] ? e->exact_reason : NULL;
}


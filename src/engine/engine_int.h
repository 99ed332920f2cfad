/*
 * engine_int.h — what engine.c shares with sampler.c and engine_text.c: the engine's llama
 * objects, and the capture of llama's error lines (a grammar's reason); and
 * the struct itself, for engine.c's siblings engine_exact.c and engine_seq.c.
 * Inside src/engine/ only: it names llama.h's types.
 *
 * Thread model: as engine.h; the capture is per thread.
 */
#ifndef KS_ENGINE_INT_H
#define KS_ENGINE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/devices.h"
#include "engine/engine.h"
#include "ggml-backend.h"
#include "llama.h"

/* The engine's own state: for engine.c, engine_exact.c and engine_seq.c
 * only; sampler.c and engine_text.c use the accessors below. */
struct ks_engine {
    struct llama_model *model;
    struct llama_context *ctx;
    const struct llama_vocab *vocab;
    char *path;
    char desc[128];
    char name[128];
    const char *tmpl; /* the model's template, or "chatml"; borrowed from the model */
    int n_ctx_seq;
    int n_seq;
    int n_batch;
    int n_vocab;
    bool flash_attn;
    int type_k, type_v;
    int32_t *eog;   /* every end-of-generation token of the vocabulary (ignore_eos) */
    int n_eog;
    bool invariant; /* the open-time probe found one-row decodes bit-identical to batches */
    bool pairs_ok;  /* not invariant, but the probe found rows decoded as pairs (the scheduler's
                     * fallback, step.c) bit-identical to batches */
    bool probe_ran; /* the probe's decodes all ran (its verdict means something) */
    int n_expert, n_expert_used; /* a mixture of experts' (GGUF ARCH.expert_count, _used_count); 0: dense */
    bool repack;    /* weights may be repacked (llama's use_extra_bufts) */
    double warm_ms; /* what the probe (the warm-up) took */
    size_t state_fixed, state_per_tok; /* a sequence state's bytes: fixed + per token (measured by the probe) */
    struct ggml_threadpool *tp;        /* the context's persistent CPU thread pool (NULL: ggml's per-graph one) */
    void (*tp_free)(struct ggml_threadpool *);
    ks_engine_offload off;             /* where the model runs (devices.h) */
    bool gpu;                          /* a GPU computes some of it (off.n_devices > 0) */
    size_t probe_diff, probe_size;     /* state bytes the probe found differing, of how many */
    char exact_reason[256];            /* why exactness is unavailable ("" when it is not) */
    struct ks_media *media;            /* the projector (media.h), NULL: text only */
    int n_threads;                     /* the context's (the projector's encoder takes as many) */
};

struct ks_batch {
    struct llama_batch b;
    int n_max;
};

/* The CPU backend loaded (engine.c): the patched one (libks-ggml-cpu.so),
 * and its patch revision (1 matrix products, 2 also flash attention, 3 its
 * decode grouped by K/V head). Written once by the backends' pthread_once. */
extern bool ks__g_patched;
extern int ks__g_patch_rev;

/* The warm-up and batch-invariance probe (engine_exact.c), run once by
 * ks_engine_open; then e->exact_reason from what it found. */
void ks__engine_probe(ks_engine *e);
void ks__engine_exact_reason(ks_engine *e);
/* Whether the K/V types take the patched tiled flash-attention kernel. */
bool ks__kv_tiled(int type_k, int type_v);
bool ks__gpu_kernels_ok(const ks_engine *e, char *why, size_t n);

/* Borrowed for the engine's life. */
const struct llama_vocab *ks__engine_vocab(const ks_engine *e);
/* ks_engine_tokenize with a vocabulary (vocab_text.c): appends to out. */
int ks__vocab_tokenize(const struct llama_vocab *v, const char *text, size_t len, bool add_special,
                       bool parse_special, ks_tokens *out);
struct llama_context *ks__engine_ctx(const ks_engine *e);
const struct llama_model *ks__engine_model(const ks_engine *e);
/* The model's template for llama_chat_apply_template, or "chatml". */
const char *ks__engine_tmpl(const ks_engine *e);
/* Every end-of-generation token of the vocabulary (*n of them). */
const int32_t *ks__engine_eog(const ks_engine *e, int *n);

/* llama's error lines on this thread go to c's buffer (joined with "; ")
 * instead of the log while c is set: a bad grammar is the request's error,
 * not the server's. Returns the capture it replaces (set it back after);
 * NULL: the log again. */
typedef struct ks__log_capture {
    char *buf;
    size_t cap, len;
} ks__log_capture;
ks__log_capture *ks__engine_capture(ks__log_capture *c);

#endif

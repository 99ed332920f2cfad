/*
 * engine.h — the llama.cpp engine: the only module that includes llama.h.
 *
 * Owns one llama_model and one llama_context with n_seq sequences (one per
 * scheduler slot; system-prompt states are captured from a slot's own
 * sequence, so there are no spare ones), and with mmproj_path a multimodal
 * projector (media.h: images and audio as pseudo-tokens). Everything
 * llama-specific — backend loading, tokenizer, chat template, batches,
 * logits, samplers, sequence memory and sequence state — goes through here, so
 * that a rename in llama.cpp's API touches one file.
 *
 * Design notes
 *  0. Warm start and batch invariance: ks_engine_open runs a short probe (32
 *     tokens as one batch, and as 16 + 16 lone rows) that pages the model in and finds
 *     whether this build's kernels give a lone token the bits of a batch
 *     (ks_engine_batch_invariant); where they do not, the 16 again as pairs
 *     (each beside a throwaway copy, the scheduler's fallback), which may or
 *     may not be exact (ks_engine_pairs_exact). In exact mode, when neither
 *     is, the model is loaded again without weight repacking and probed
 *     again; when still neither is, exact mode is unavailable and the engine says why
 *     (a kernel the patch does not cover, docs/LLAMA_FACTS.md).
 *  1. Exactness: the prebuilt CPU backend's flash attention changes its
 *     tiling with the number of query rows, the KV length and the thread
 *     count; setup's patched build (revision 2) runs every row through one
 *     tiled kernel, so flash attention asked for there is exact too, and
 *     from revision 3 a decoded token's heads that share a K/V head share
 *     one tile, so it decodes about as fast as attention without it and
 *     prefills faster at depth (docs/LLAMA_FACTS.md). Auto turns it on there,
 *     and wherever exactness is not asked for; off on the prebuilt backend
 *     in exact mode.
 *     Either way a prefix kept in the KV (or restored from a state blob)
 *     followed by a partial decode gives bit-identical logits to a full
 *     prefill. kv_unified is false so that every sequence owns
 *     its own KV stream: one slot's cell layout never depends on another's,
 *     which keeps results independent of what other slots are doing.
 *  2. Each sequence therefore has n_ctx_seq = n_ctx_total / n_seq cells.
 *  3. Devices (docs/ARCHITECTURE.md, "Devices"): GPU backend modules found
 *     next to libllama (or named by KS_GPU_MODULES) are loaded beside the
 *     CPU backend (devices.h); the offload settings are resolved and checked
 *     against them and the model before any weight is loaded. Exact mode
 *     holds only where every layer, the KV and every product run on the
 *     patched CPU backend and the probe agrees: no GPU kernel has a
 *     batch-invariance patch yet, and pairs do not help there (a GPU picks
 *     its matrix and attention kernels by batch size). So with a GPU in use
 *     the exact mode is "unavailable", with the reason, and the scheduler
 *     decodes without pairs. With exactness asked for and layers left on the
 *     CPU, op offload is off: llama.cpp would otherwise run a CPU layer's
 *     prefill products on the GPU and its decode on the CPU. The devices
 *     and layers are part of ks_engine_kv_params: a state computed on a GPU
 *     is not a CPU prefill's bits.
 *
 * Thread model: ks_engine_open/free on any one thread. The tokenizer,
 * detokenizer, template and model-info calls are read-only on the model and
 * are safe from any thread at any time. Everything that touches the context
 * (decode, logits, samplers, memory, state) must be called from a single
 * thread — the inference thread.
 */
#ifndef KS_ENGINE_H
#define KS_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/offload.h"

typedef struct ks_engine ks_engine;
typedef struct ks_sampler ks_sampler;

enum { KS_FA_AUTO = -1, KS_FA_OFF = 0, KS_FA_ON = 1 };

typedef struct ks_engine_params {
    const char *model_path;
    int n_ctx_seq;   /* context per sequence (0: 4096); capped at the model's training context */
    int n_seq;       /* sequences (>= 1) */
    int n_batch;     /* logical batch = max tokens in one decode (0: 512) */
    int n_threads;   /* 0: online CPUs */
    int flash_attn;  /* KS_FA_AUTO (default; see note 1), KS_FA_ON, KS_FA_OFF */
    int type_k;      /* ggml_type of K/V cache; -1: default (F16) */
    int type_v;
    bool exact;      /* default true: when the probe finds the model's repacked weights
                        are not batch-invariant, load it again without repacking (note 0);
                        op offload stays off where layers stay on the CPU (note 3) */
    ks_offload offload; /* where the model runs (base/offload.h; default: "auto" layers on
                           every GPU found, none without one) */
    bool repack;     /* default true: let ggml repack weights into its interleaved
                        layouts (Q4_0, Q4_K, IQ4_NL, MXFP4 on x86; llama's use_extra_bufts,
                        llama-server's --no-repack turns it off) */
    const char *mmproj_path; /* a multimodal projector (mtmd's mmproj GGUF) for images and
                                audio in prompts (engine/media.h); NULL: text only */
    const struct ks_engine *pool_of; /* another engine whose CPU thread pool this one uses (a
                                draft model's: two pools of polling workers on the same cores
                                slow each other down); it must outlive this one and decode on
                                the same thread, never at the same time. NULL: a pool of its own */
} ks_engine_params;

ks_engine_params ks_engine_params_default(void);

/* Loads the backends (once per process), the model and a context.
 * Errors: KS_ENOENT (no such file), KS_EMODEL (not GGUF, unsupported
 * architecture, load failure), KS_ENOMEM (context creation). */
int ks_engine_open(const ks_engine_params *p, ks_engine **out, char *err, size_t errlen);
void ks_engine_free(ks_engine *e);

/* ------------------------------------------------------------- model info */
int ks_engine_n_ctx_seq(const ks_engine *e);
int ks_engine_n_seq(const ks_engine *e);
int ks_engine_n_batch(const ks_engine *e);
int ks_engine_n_vocab(const ks_engine *e);
const char *ks_engine_model_path(const ks_engine *e);
/* The engine's llama_model, for chat_tmpl.cpp's ks_chat_tmpl_create_for
 * (read-only: the engine owns it; valid until ks_engine_free). */
struct llama_model;
const struct llama_model *ks_engine_llama_model(const ks_engine *e);
/* A short description ("llama 0.5B Q8_0") — borrowed, valid until free. */
const char *ks_engine_model_desc(const ks_engine *e);
/* The model's name for the API (general.name or the file's base name). */
const char *ks_engine_model_name(const ks_engine *e);
/* The bytes that change the KV contents besides the model and the tokens:
 * K/V types, flash attention, n_ctx_seq, kv_unified... for cache keys. */
void ks_engine_kv_params(const ks_engine *e, char *buf, size_t n);
/* llama's sequence-state version (LLAMA_STATE_SEQ_VERSION). */
uint32_t ks_engine_state_version(void);
/* Every GGUF metadata pair "key=value\n" (for the model fingerprint). Owned: free(). */
char *ks_engine_meta_dump(const ks_engine *e);
/* true when a token decoded alone gets the bits it gets inside a prefill
 * batch, as measured on this model when it was opened (the warm-up probe): the
 * scheduler then decodes one row per sequence and stays exact. false with the
 * prebuilt CPU backend (one-row F16 products sum in another order), with flash
 * attention on a backend older than revision 2, or when the probe could not run. */
bool ks_engine_batch_invariant(const ks_engine *e);
/* Whether the model's weights were loaded with ggml's repacking (llama's
 * use_extra_bufts): false when asked (repack false) or when exact mode loaded
 * them again without it. */
bool ks_engine_repacked(const ks_engine *e);
/* true when the model is not batch-invariant but the probe found tokens
 * decoded as pairs (each beside a throwaway copy of itself, step.c) bit-
 * identical to a batch: the scheduler's fallback keeps exactness. false when
 * invariant, when the memory cannot drop the copy (hybrid, recurrent), with
 * the prebuilt's flash attention, or when a kernel switches at more than two
 * rows (docs/LLAMA_FACTS.md: the IQ panel gemm): exact mode is then off. */
bool ks_engine_pairs_exact(const ks_engine *e);

/* Experts per layer of a mixture-of-experts model (GGUF ARCH.expert_count),
 * 0 for a dense one; *n_used (may be NULL) gets the experts each token is
 * routed to. */
int ks_engine_n_expert(const ks_engine *e, int *n_used);

/* Whether flash attention is on (KS_FA_AUTO resolved). */
bool ks_engine_flash_attn(const ks_engine *e);
/* The KV cache's element types (ggml_type), and their names. */
int ks_engine_type_k(const ks_engine *e);
int ks_engine_type_v(const ks_engine *e);

/* llama-server's names of KV cache types (-ctk/-ctv: f32, f16, bf16, q8_0,
 * q4_0, q4_1, iq4_nl, q5_0, q5_1): the ggml type, or -1 for another name.
 * Any thread. */
int ks_engine_kv_type(const char *name);
/* A KV type's name ("f16"); "?" for a type not in the list above. */
const char *ks_engine_kv_type_name(int type);
/* Whether the type is quantized (llama.cpp then needs flash attention for V). */
bool ks_engine_kv_type_quantized(int type);
/* How a scheduler asked for exactness keeps it on this engine, for logs and
 * /props: "batch-invariant" (one row per generated token), "pairs" (the
 * fallback of step.c, where the probe found it exact: ks_engine_pairs_exact),
 * "off" (exact false), "unavailable" (asked for but not kept: a GPU in use, a
 * memory pairs cannot trim on a CPU backend that is not invariant, or kernels
 * exact neither alone nor in pairs; ks_engine_exact_reason says which). */
const char *ks_engine_exact_mode(const ks_engine *e, bool exact);
/* How exactness is kept (ks_engine_exact_how). */
typedef enum {
    KS_EXACT_OFF = 0,    /* not asked for */
    KS_EXACT_INVARIANT,  /* "batch-invariant": one row per generated token, exact */
    KS_EXACT_PAIRS,      /* "pairs": lone tokens decoded with a throwaway companion (step.c) */
    KS_EXACT_UNAVAILABLE /* asked for, but nothing on this engine keeps it (ks_engine_exact_reason) */
} ks_exact_how;
ks_exact_how ks_engine_exact_how(const ks_engine *e, bool exact);
/* Why exactness is unavailable ("CUDA0 kernels are not batch-invariant",
 * "a hybrid memory cannot decode in pairs on this CPU backend"), NULL when
 * it is not. Borrowed, valid until free. */
const char *ks_engine_exact_reason(const ks_engine *e, bool exact);
/* About the bytes of a full sequence's state (n_ctx_seq tokens), from the
 * model's shape; 0 when it cannot tell. For warm-start buffers. */
size_t ks_engine_state_bytes_max(const ks_engine *e);
/* Milliseconds the open-time warm-up (and probe) took. */
double ks_engine_warm_ms(const ks_engine *e);
/* The CPU backend in use: "kvstash-ggml-cpu-r<N>-<variant>" (setup's patched
 * build) or "prebuilt". Loads the backends if not yet done. Static string. */
const char *ks_engine_cpu_backend(void);
/* ------------------------------------------------------------- devices */
/* One GPU device the model uses. */
typedef struct ks_engine_device {
    char name[32];       /* ggml's name: "CUDA0", "Vulkan0" */
    char desc[128];      /* "NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.6, 256 bits)" */
    int n_layers;        /* layers it holds (the output layer counts as one) */
    bool kv;             /* it holds KV cells (layers of it, with kv offload on) */
    size_t mem_free, mem_total; /* bytes, when the engine opened */
} ks_engine_device;

/* What the offload settings resolved to (devices.h). */
typedef struct ks_engine_offload {
    int n_devices;       /* GPU devices in use; 0: the model runs on the CPU alone */
    ks_engine_device dev[KS_OFFLOAD_DEVICES_MAX];
    int n_layers;        /* the model's offloadable layers: n_layer + 1 (the output layer) */
    int n_gpu_layers;    /* how many of them are on GPUs */
    bool kv_cpu;         /* some KV cells live in host memory (layers on the CPU, or kv offload off) */
    bool kv_offload;     /* as asked (--no-kv-offload: false) */
    bool op_offload;     /* in force: false when asked, with no GPU, and in exact mode with
                            layers on the CPU */
    int split_mode;      /* KS_SPLIT_* */
    int main_gpu;
    char kv[160];        /* where the KV lives: "CPU", "CUDA0", "CPU+CUDA0", "CUDA0+CUDA1" */
    bool weights_quant;  /* every matrix weight but the input embedding is of a quantized type (the
                            products the CUDA patch makes batch-invariant, MMQ) */
    bool cuda_invariant; /* every device in use is CUDA, its module carries kvstash's batch-invariance
                            patch, and the engine turned it on (exact mode) */
} ks_engine_offload;

/* Borrowed, valid until free. */
const ks_engine_offload *ks_engine_offload_info(const ks_engine *e);
/* One line for logs and the listening line: "CPU", "25/25 layers on CUDA0,
 * KV on CUDA0", "10/25 layers on CUDA0 (15 on the CPU), KV on CPU+CUDA0",
 * "0/25 layers on the GPU, op offload to CUDA0". */
void ks_engine_offload_desc(const ks_engine *e, char *buf, size_t n);
/* The GPU backend modules loaded, by build id, comma-separated
 * ("kvstash-ggml-cuda-de3ff81-sm90a-inv1"); "" when none. Loads the backends if
 * not yet done. Static string. */
const char *ks_engine_gpu_backends(void);

/* true when the memory can remove a partial range of a sequence; false for
 * recurrent and hybrid models, whose state cannot be trimmed. */
bool ks_engine_partial_rm_ok(const ks_engine *e);
/* What kind of memory the model has (llama_model_is_hybrid / _is_recurrent):
 * hybrid models mix attention layers with recurrent or convolution layers
 * (LFM2, Granite 4, Qwen3-Next...), recurrent ones have no attention (Mamba,
 * RWKV). Either way the recurrent part is one fixed-size state per sequence
 * that cannot go back to an earlier position (docs/LLAMA_FACTS.md, "Hybrid,
 * recurrent and sliding-window models"). */
bool ks_engine_is_hybrid(const ks_engine *e);
bool ks_engine_is_recurrent(const ks_engine *e);
/* The sliding window of the model's SWA layers in tokens (llama_model_n_swa),
 * 0 when it has none (Gemma 2/3, gpt-oss have one). */
int ks_engine_n_swa(const ks_engine *e);
/* Whether a state of n tokens (ks_engine_state_get), set into a cleared
 * sequence, decodes on with the bits of the sequence it was taken from.
 * Always, but on a sliding-window model past the window: llama's state then
 * holds only the window's cells of the sliding layers (positions [n - n_swa,
 * n)) and a restore puts them at the sequence's first cells, shifted by
 * n - n_swa from where the live sequence had them. The CPU kernels sum
 * attention in blocks aligned to cell 0 — the patched flash-attention
 * kernel in tiles of 64 cells (masked cells add exact zeros), without flash
 * attention 16-lane sums (64 with ggml's one-row F16 dot) — so the shift
 * changes no bits when it is a multiple of KS_ENGINE_SWA_ALIGN, and does
 * otherwise (measured: docs/LLAMA_FACTS.md, "Sliding window: restores at
 * aligned lengths"). */
bool ks_engine_state_restorable(const ks_engine *e, int n);
/* The longest n' <= n with ks_engine_state_restorable(e, n') (n itself but
 * on a sliding-window model); n <= 0: n. */
int ks_engine_restorable_floor(const ks_engine *e, int n);
#define KS_ENGINE_SWA_ALIGN 64

/* -------------------------------------------------------------- tokenizer */
/* Tokenizes text. add_special: BOS as the model wants; parse_special: treat
 * "<|im_start|>" etc. as control tokens. Appends to out. */
int ks_engine_tokenize(const ks_engine *e, const char *text, size_t len, bool add_special,
                       bool parse_special, ks_tokens *out);
/* Text of one token (control tokens rendered as empty). Returns bytes written
 * (may exceed n: then call again with a bigger buffer), < 0 on error. */
int ks_engine_piece(const ks_engine *e, int32_t tok, char *buf, size_t n);
bool ks_engine_is_eog(const ks_engine *e, int32_t tok);
/* Text of one token with control tokens rendered as their text ("<|im_end|>"),
 * as llama-server's /detokenize and /tokenize pieces show them. Same return
 * convention as ks_engine_piece. */
int ks_engine_token_text(const ks_engine *e, int32_t tok, char *buf, size_t n);
/* The model's BOS / EOS token id, -1 when it has none. */
int32_t ks_engine_token_bos(const ks_engine *e);
int32_t ks_engine_token_eos(const ks_engine *e);
/* Whether the tokenizer puts BOS before a text (tokenizer.ggml.add_bos_token). */
bool ks_engine_adds_bos(const ks_engine *e);
/* The model's fill-in-the-middle tokens (llama.cpp's vocabulary: from the
 * GGUF's ids or found by their text, Qwen's <|fim_prefix|>, CodeLlama's
 * <PRE>, ...), -1 each where it has none. */
typedef struct ks_fim_tokens {
    int32_t pre, suf, mid, pad;
    int32_t rep; /* repository name (Qwen's <|repo_name|>) */
    int32_t sep; /* file separator (<|file_sep|>) */
} ks_fim_tokens;
ks_fim_tokens ks_engine_fim_tokens(const ks_engine *e);
/* The GGUF's chat template text (tokenizer.chat_template), NULL when the model
 * has none (ks_engine_template then uses ChatML). Borrowed, valid until free. */
const char *ks_engine_chat_template(const ks_engine *e);
/* The llama.cpp release kvstash runs on, read from the loaded library's file
 * name ("v0.5.0" from libllama.v0.5.0.so, "0.0.6000" from libllama.so.0.0.6000),
 * "unknown" when it carries none. Static string; any thread. */
const char *ks_engine_llama_version(void);

/* A chat message for the template. */
typedef struct ks_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} ks_msg;

/* Renders msgs with the model's own chat template (ChatML when the model has
 * none). add_gen: end with the assistant header. *out: owned, free().
 * Errors: KS_ETEMPLATE when llama.cpp does not know the template. */
int ks_engine_template(const ks_engine *e, const ks_msg *msgs, size_t n, bool add_gen, char **out);

/* ----------------------------------------------------- decode and logits */
/* One decode: n tokens, each (token, pos, seq, want_logits). Errors:
 * KS_EFULL when no KV cell is free (retry smaller), KS_ECANCELED when
 * aborted, KS_EDECODE otherwise. Inference thread only. */
typedef struct ks_batch ks_batch;
ks_batch *ks_batch_create(int n_max);
void ks_batch_free(ks_batch *b);
void ks_batch_clear(ks_batch *b);
int ks_batch_n(const ks_batch *b);
/* Returns the index of the added token in the batch. */
int ks_batch_add(ks_batch *b, int32_t tok, int pos, int seq, bool logits);
int ks_engine_decode(ks_engine *e, ks_batch *b);
/* Logits of the token at batch index i of the last decode (it must have
 * asked for logits); NULL otherwise. n_vocab floats, borrowed until the next decode. */
const float *ks_engine_logits(ks_engine *e, int i);

/* --------------------------------------------------------------- sampling */
/*
 * A sampler is llama.cpp's common_sampler rebuilt in C: the grammar is a
 * sampler of its own, outside the chain (so that history accepts skip it); the
 * chain is logit_bias (the request's biases, then -INFINITY on every
 * end-of-generation token for ignore_eos) -> penalties -> greedy, or
 * top_k -> top_p -> min_p -> temp -> dist. A stage that is off is not in the
 * chain: without an ext the chain is what it always was, and greedy output is
 * bit-for-bit the same. (llama-server also bans the model's suppress tokens,
 * tokenizer.ggml.suppress_tokens, in its logit_bias stage; kvstash does not,
 * which would change plain output on models that list any.)
 *
 * With a grammar, a token is sampled as llama-server does (rejection
 * sampling): the chain picks from all candidates; if the grammar rejects that
 * token, the grammar is applied to all candidates and the chain picks again.
 * For greedy that is the token grammar-first sampling gives. The
 * sampled token is then accepted by the grammar (end-of-generation tokens
 * excepted: they end the request) and the chain. llama.cpp's grammar throws
 * C++ exceptions and aborts on some inputs (docs/LLAMA_FACTS.md, "Grammar
 * sampler"): grammar.cpp catches the former, the checks here keep every
 * input away from the latter.
 */
typedef struct ks_logit_bias { int32_t tok; float bias; } ks_logit_bias;   /* bias -INFINITY bans the token */

/* The most log-probabilities a request can ask for per token. */
#define KS_N_PROBS_MAX 20

/* What a request adds to sampling beyond ks_sample_params (zero-initialised = off). */
/* The steps of a sampler chain in a given order (ks_sample_ext.order). */
enum { KS_SAMPLER_TOP_K = 1, KS_SAMPLER_TOP_P, KS_SAMPLER_MIN_P, KS_SAMPLER_TEMPERATURE, KS_SAMPLER_INFILL,
       KS_SAMPLER_PENALTIES };
#define KS_SAMPLER_ORDER_MAX 32

typedef struct ks_sample_ext {
    const char *grammar;            /* GBNF, root rule "root"; NULL or "": none */
    bool grammar_lazy;              /* the grammar applies from the first trigger on */
    /* regexes, as llama_sampler_init_grammar_lazy_patterns takes them */
    const char *const *trigger_patterns; int n_trigger_patterns;
    const int32_t *trigger_tokens; int n_trigger_tokens;
    /* tokens the (non-lazy) grammar accepts before the first sample
     * (llama-server: the template's generation prompt); ignored when lazy */
    const int32_t *grammar_prefill; int n_grammar_prefill;
    const ks_logit_bias *logit_bias; int n_logit_bias;
    float repeat_penalty;           /* 1 or 0: off */
    int repeat_last_n;              /* tokens looked back for penalties; -1: the whole context
                                       (n_ctx_seq); 0: off. Default used by the server: 64 */
    float frequency_penalty, presence_penalty; /* 0: off */
    bool ignore_eos;                /* every end-of-generation token gets -INFINITY */
    int n_probs;                    /* > 0: compute the top n_probs log-probabilities per
                                       sampled token (max KS_N_PROBS_MAX) */
    /* llama-server's "samplers": the chain after the biases in this order,
     * then a draw at the seed, as common_sampler_init builds it — a step not
     * listed is not applied (no temperature: the logits as they are; no
     * penalties: none), and there is no greedy shortcut (temperature 0 is
     * the temperature step's argmax). ordered false: kvstash's chain
     * (penalties, then top-k, top-p, min-p, temperature; greedy at
     * temperature 0). */
    bool ordered;
    uint8_t order[KS_SAMPLER_ORDER_MAX]; /* KS_SAMPLER_*; n_order 0: the draw alone */
    int n_order;
} ks_sample_ext;

/* Checks everything in x but the grammar itself: counts >= 0 with their
 * arrays, n_probs 0..KS_N_PROBS_MAX, repeat_last_n >= -1, finite penalties
 * (repeat_penalty 0, or > 0 with a finite inverse, as llama.cpp asks),
 * token ids in the vocabulary, biases neither NaN nor +INFINITY, no NULL
 * trigger pattern. 0 or KS_EINVAL; x NULL is valid. Any thread. */
int ks_sampler_ext_check(const ks_engine *e, const ks_sample_ext *x);

/* Checks that a GBNF grammar parses for this model's vocabulary (any thread:
 * it only reads the vocab). 0, or KS_EINVAL with llama.cpp's reason in err:
 * the lines it logs ("failed to parse grammar", "grammar does not contain a
 * 'root' symbol", left recursion), captured on this thread and kept out of
 * the log. The parser's detail ("expecting ')' at ...") llama.cpp prints to
 * stderr itself, out of reach. NULL or "" is no grammar: 0. */
int ks_engine_grammar_check(const ks_engine *e, const char *gbnf, char *err, size_t errlen);

/* x may be NULL (= plain sampler). NULL on failure, with *rc (rc may be
 * NULL): KS_EINVAL for what ks_sampler_ext_check refuses, a grammar
 * llama.cpp refuses, a trigger pattern that is no regex, grammar prefill the
 * grammar does not accept (or that ends generation); KS_ENOMEM otherwise.
 * Reads only the vocabulary, never the context: any thread (samplers are
 * used on the inference thread). */
ks_sampler *ks_sampler_create_ext(const ks_engine *e, const ks_sample_params *sp, const ks_sample_ext *x, int *rc);
/* = ks_sampler_create_ext(e, sp, NULL, NULL). */
ks_sampler *ks_sampler_create(const ks_engine *e, const ks_sample_params *sp);
void ks_sampler_free(ks_sampler *s);
/* History for the penalties only (the grammar never sees it): llama-server
 * accepts the prompt's tokens into its sampler chain before generating; this
 * accepts the last repeat_last_n of toks[0, n). A no-op when the penalties
 * are off. */
void ks_sampler_accept_history(ks_sampler *s, const int32_t *toks, int n);
/* Samples from the logits of batch index i and accepts the token. Returns -1
 * when no token may follow: a grammar at a dead end (nothing it allows is
 * possible, or all of it banned by logit_bias), or a grammar that threw while
 * accepting (a trigger whose text the grammar does not start with). The
 * request cannot go on; the sampler returns -1 from then on. A grammar that is
 * complete and allows nothing but the end of generation gives an
 * end-of-generation token even with ignore_eos. */
int32_t ks_sampler_sample(ks_sampler *s, ks_engine *e, int i);

typedef struct ks_token_prob { int32_t tok; float logprob; } ks_token_prob;
/* After ks_sampler_sample on batch index i: the sampled token's
 * log-probability and the top n (<= n_probs) candidates by log-probability,
 * computed as llama-server does by default (log-softmax of the raw logits of
 * that row over the whole vocabulary, before any sampler; post_sampling_probs
 * off). Returns how many entries were written to top (n capped at the
 * vocabulary; ties: lower id first; 0 when the row has no logits). Summed in
 * double: within float rounding of llama-server's log(p) of a float softmax,
 * except that a probability that underflows to 0 there (logprob -FLT_MAX)
 * has its true log here. No allocation; s may be NULL. */
int ks_sampler_probs(ks_sampler *s, ks_engine *e, int i, int32_t sampled, ks_token_prob *sampled_out,
                     ks_token_prob *top, int n);

/* ------------------------------------------------------- sequence memory */
/* Removes positions [p0, p1) of seq (p1 < 0: to the end). false when the
 * memory cannot remove a partial range: the caller then clears the sequence. */
bool ks_engine_seq_rm(ks_engine *e, int seq, int p0, int p1);
void ks_engine_seq_clear(ks_engine *e, int seq);
/* Highest position in seq, -1 when empty. */
int ks_engine_seq_pos_max(ks_engine *e, int seq);
/* Lowest position the memory still holds for seq, -1 when empty. Above 0 when
 * cells left the sliding window and were dropped (never with the engine's
 * full-size SWA cache, but after restoring a state saved past the window:
 * a state carries only the cells inside the window). */
int ks_engine_seq_pos_min(ks_engine *e, int seq);

/* Sequence state (the seq's KV as bytes): ask the size, then fill.
 * get returns bytes written (0 on failure); set returns KS_EMISMATCH when
 * llama rejects the blob (the sequence is then cleared). */
size_t ks_engine_state_size(ks_engine *e, int seq);
size_t ks_engine_state_get(ks_engine *e, int seq, uint8_t *buf, size_t n);
int ks_engine_state_set(ks_engine *e, int seq, const uint8_t *buf, size_t n);

/* The partial state of a sequence (llama's LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY):
 * only the part a trim cannot rebuild — the recurrent state of a hybrid or
 * recurrent model (a fixed size, whatever the sequence's length), the cells of
 * the sliding-window layers of an SWA model — without the attention KV of the
 * other layers. A checkpoint: restored over a live sequence whose attention
 * KV still holds the checkpoint's tokens, followed by ks_engine_seq_rm of
 * everything after them, it puts the sequence back at the checkpoint
 * (docs/LLAMA_FACTS.md, "Hybrid, recurrent and sliding-window models").
 * On a model with neither part (a plain KV cache) llama ignores the flag: the
 * blob is the full state, as large as ks_engine_state_get's. Same conventions as
 * ks_engine_state_size / _get / _set; set_partial leaves the attention KV as
 * it was and clears the whole sequence only when llama refuses the blob. */
size_t ks_engine_state_size_partial(ks_engine *e, int seq);
size_t ks_engine_state_get_partial(ks_engine *e, int seq, uint8_t *buf, size_t n);
int ks_engine_state_set_partial(ks_engine *e, int seq, const uint8_t *buf, size_t n);

#endif

/*
 * kvstash.h — the public C API of libkvstash.
 *
 * kvstash keeps the KV state of a conversation between calls so that no
 * prompt token is prefilled twice, and never changes the output by caching:
 * with greedy sampling, a cached turn produces exactly the tokens and logits
 * of an uncached one.
 *
 * Objects are opaque and come in create/free pairs; free(NULL) is a no-op.
 * Functions return 0 on success or a negative KS_E* code; ks_strerror()
 * names it. Where a function also takes (err, errlen), a human-readable
 * message is written there on failure.
 *
 * Thread model: a ks_chat owns one inference thread internally. The calls on
 * one ks_chat must not run concurrently with each other (serialise them);
 * different ks_chat objects are independent. Callbacks run on the inference
 * thread and must not call back into the same ks_chat.
 *
 * Linking: pkg-config --cflags --libs kvstash (see examples/README.md).
 */
#ifndef KVSTASH_H
#define KVSTASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvstash_version.h" /* KS_VERSION_MAJOR/MINOR/PATCH, KS_VERSION_STRING */

/* KS_API marks the functions libkvstash exports. The library is compiled with
 * -fvisibility=hidden and KS_BUILD defined, so these and nothing else leave
 * libkvstash.so; for users the macro is empty. */
#if defined(KS_BUILD) && defined(__GNUC__)
#define KS_API __attribute__((visibility("default")))
#else
#define KS_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ errors */
/* X(name, value, message): the one table every error code comes from. */
#define KS_ERRNO_MAP(X)                                                        \
    X(EINVAL, -1, "invalid argument")                                          \
    X(ENOMEM, -2, "out of memory")                                             \
    X(EIO, -3, "input/output error")                                           \
    X(ENOSPC, -4, "no space left on device")                                   \
    X(ECORRUPT, -5, "corrupt data")                                            \
    X(EVERSION, -6, "unsupported format version")                              \
    X(EBUSY, -7, "resource busy")                                              \
    X(ENOENT, -8, "not found")                                                 \
    X(EMODEL, -9, "model could not be loaded")                                 \
    X(ECTX, -10, "prompt does not fit in the context")                         \
    X(EDECODE, -11, "decode failed")                                           \
    X(ECANCELED, -12, "canceled")                                              \
    X(ETEMPLATE, -13, "chat template could not be applied")                    \
    X(EFULL, -14, "queue full")                                                \
    X(ESHUTDOWN, -15, "shutting down")                                         \
    X(EEMPTY, -16, "empty input")                                              \
    X(EMISMATCH, -17, "cached state does not match")

enum {
#define KS_ERRNO_ENUM(name, val, msg) KS_##name = val,
    KS_ERRNO_MAP(KS_ERRNO_ENUM)
#undef KS_ERRNO_ENUM
};

/* A static string describing err (never NULL). */
KS_API const char *ks_strerror(int err);
/* The code's symbolic name without the KS_ prefix, e.g. "ECORRUPT". */
KS_API const char *ks_errname(int err);

/* --------------------------------------------------------------- sampling */
typedef struct ks_sample_params {
    float temperature; /* <= 0: greedy (argmax) */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;     /* for temperature > 0 */
} ks_sample_params;

/* Greedy (temperature 0); top_k 40, top_p 0.95, min_p 0.05 (llama-server's)
 * apply when temperature > 0; seed 42. */
KS_API ks_sample_params ks_sample_params_default(void);

/* ----------------------------------------------------------- turn stats */
typedef struct ks_turn_stats {
    int n_prompt;        /* tokens in the whole prompt of this turn */
    int n_cached;        /* of those, reused from the KV cache */
    int n_new;           /* n_prompt - n_cached: prefilled this turn */
    int n_generated;     /* tokens produced */
    int n_dropped_msgs;  /* messages dropped from the front to fit the context */
    double prompt_ms;    /* prefill time (from the request to the first sampled token) */
    double ttft_ms;      /* time to first token, as seen by the caller */
    double gen_ms;       /* time spent generating after the first token */
    bool stopped_eog;    /* true: end of generation; false: max_tokens reached or canceled */
} ks_turn_stats;

/* --------------------------------------------------------------- ks_chat */
/* A single conversation on one model with its KV kept between turns. */
typedef struct ks_chat ks_chat;

enum { KS_FLASH_ATTN_AUTO = 0, KS_FLASH_ATTN_ON = 1, KS_FLASH_ATTN_OFF = 2 };
/* n_gpu_layers beyond a count: every layer that fits on the GPUs found (none
 * without a GPU), or every layer. */
enum { KS_GPU_LAYERS_AUTO = -1, KS_GPU_LAYERS_ALL = -2 };
/* How layers spread over several GPUs (llama-server's --split-mode). */
enum { KS_SPLIT_MODE_NONE = 0, KS_SPLIT_MODE_LAYER = 1, KS_SPLIT_MODE_ROW = 2 };

typedef struct ks_chat_params {
    const char *model_path; /* GGUF file (required) */
    int n_ctx;              /* context size in tokens (default 4096; capped at the model's) */
    int n_batch;            /* prefill chunk (default 512) */
    int n_threads;          /* 0 = number of online CPUs */
    bool cache;             /* keep and reuse the KV between turns (default true) */
    int flash_attn;         /* KS_FLASH_ATTN_AUTO (0, default): on where it is exact (setup's
                               patched CPU backend) or exact is false; _ON; _OFF */
    bool exact;             /* default true: cached and uncached output are bit-identical
                               (docs/LLAMA_FACTS.md). Free with setup's patched CPU backend;
                               on the prebuilt one lone tokens are decoded with a throwaway
                               companion row, which halves decode speed. */
    const char *system;     /* system prompt, may be NULL */
    /* Where the model runs: GPU backends setup installed next to libllama
     * (README, "GPUs"), with llama-server's settings. A GPU turns exact
     * output off: no GPU kernel is batch-invariant yet (ks_chat_exact_mode). */
    int n_gpu_layers;       /* KS_GPU_LAYERS_AUTO (default): every layer that fits on the GPUs
                               found, none without one; KS_GPU_LAYERS_ALL; or a count
                               0..the model's layers + 1 (the output layer) */
    const char *devices;    /* NULL (default): every GPU found; "none": the CPU alone; or
                               device names, comma-separated ("CUDA0,CUDA1", "Vulkan0") */
    int split_mode;         /* KS_SPLIT_MODE_LAYER (default), _NONE (main_gpu alone), _ROW */
    int main_gpu;           /* index into the devices in use (default 0) */
    const float *tensor_split; /* n_tensor_split proportions, one per device in use; NULL
                               (default): by each device's free memory. Copied by create. */
    int n_tensor_split;
    bool no_kv_offload;     /* true: the KV cache stays in host memory (default false) */
    bool no_op_offload;     /* true: the CPU layers' products never run on a GPU (default
                               false; exact mode turns it off where layers stay on the CPU) */
} ks_chat_params;

KS_API ks_chat_params ks_chat_params_default(void);

/* Loads the model and creates the conversation. On failure returns a KS_E*
 * code, sets *out to NULL and writes a message to err: KS_EINVAL for a
 * setting that cannot be honoured (more GPU layers than the model has, an
 * unknown device, a tensor split that does not match the devices, GPU layers
 * without a GPU), KS_ENOENT / KS_EMODEL for the model file. */
KS_API int ks_chat_create(const ks_chat_params *p, ks_chat **out, char *err, size_t errlen);
KS_API void ks_chat_free(ks_chat *c);

/* Called for each piece of generated text (UTF-8, never split inside a
 * character). Return non-zero to stop the generation. */
typedef int (*ks_text_cb)(void *ud, const char *text, size_t len);
/* Called during the prefill with tokens done / total to do (for progress). */
typedef void (*ks_progress_cb)(void *ud, int done, int total);

typedef struct ks_gen_params {
    int max_tokens;         /* default 256 */
    ks_sample_params sample;
    ks_text_cb on_text;     /* may be NULL */
    ks_progress_cb on_progress; /* may be NULL */
    void *ud;
} ks_gen_params;

KS_API ks_gen_params ks_gen_params_default(void);

/* Appends a user message, generates the assistant reply and appends it too.
 * *reply (may be NULL) receives the reply text: owned, free() it.
 * stats (may be NULL) receives the turn's figures.
 * Errors: KS_EEMPTY (empty or blank message), KS_EINVAL (max_tokens outside
 * [1, n_ctx - 1], or the prompt could not be tokenized), KS_ECTX (the message
 * alone does not fit with max_tokens), KS_ETEMPLATE (the model's chat
 * template cannot render the conversation), KS_ENOMEM, KS_EDECODE or another
 * code from the decode (the generation failed). On every error a message is
 * written to err and the history is as before the call; errors found before
 * the generation starts leave the cached KV as it was too. */
KS_API int ks_chat_send(ks_chat *c, const char *user_msg, const ks_gen_params *g,
                        char **reply, ks_turn_stats *stats, char *err, size_t errlen);

/* Forgets the history (keeps the system prompt) and drops the KV. */
KS_API void ks_chat_clear(ks_chat *c);
/* Replaces the system prompt (NULL: none) and forgets the history. */
KS_API int ks_chat_set_system(ks_chat *c, const char *system);
/* Number of messages in the history, the system prompt included. */
KS_API int ks_chat_n_messages(const ks_chat *c);
/* Message i of the history (0 = the system prompt when there is one):
 * content borrowed until the next call that changes the history; role in
 * *role when role is not NULL. NULL when i is out of range. */
KS_API const char *ks_chat_message(const ks_chat *c, int i, const char **role);
/* Tokens currently held in the KV cache for this conversation. */
KS_API int ks_chat_n_cached(const ks_chat *c);
/* Where the model runs: "CPU", or e.g. "25/25 layers on CUDA0, KV on CUDA0".
 * Borrowed, valid until ks_chat_free. */
KS_API const char *ks_chat_devices(const ks_chat *c);
/* How exactness (the exact parameter) is kept: "batch-invariant", "pairs",
 * "off" (not asked for) or "unavailable" (asked for, but a GPU computes part
 * of the model, or the CPU backend cannot keep it for this model); why in
 * *reason (may be NULL; NULL when it is not unavailable). Static or
 * borrowed strings, valid until ks_chat_free. */
KS_API const char *ks_chat_exact_mode(const ks_chat *c, const char **reason);
/* Next-token logits after the last turn's prompt (valid until the next call),
 * n_vocab in *n. For the exactness tests. NULL before the first turn. */
KS_API const float *ks_chat_last_prompt_logits(const ks_chat *c, int *n);

/* The library's version, "MAJOR.MINOR.PATCH": KS_VERSION_STRING of the headers
 * it was built from (a static string; compare it with the KS_VERSION_STRING
 * a program was compiled with to detect a mismatch). */
KS_API const char *ks_version(void);

#ifdef __cplusplus
}
#endif
#endif

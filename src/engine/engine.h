/*
 * engine.h — the llama.cpp engine: the only module that includes llama.h.
 *
 * Owns one llama_model and one llama_context with n_seq sequences (one per
 * scheduler slot; system-prompt states are captured from a slot's own
 * sequence, so there are no spare ones). Everything
 * llama-specific — backend loading, tokenizer, chat template, batches,
 * logits, samplers, sequence memory and sequence state — goes through here, so
 * that a rename in llama.cpp's API touches one file.
 *
 * Design notes
 *  1. Exactness: flash attention is off unless asked for. With it off, a
 *     prefix kept in the KV (or restored from a state blob) followed by a
 *     partial decode gives bit-identical logits to a full prefill
 *     (docs/LLAMA_FACTS.md). kv_unified is false so that every sequence owns
 *     its own KV stream: one slot's cell layout never depends on another's,
 *     which keeps results independent of what other slots are doing.
 *  2. Each sequence therefore has n_ctx_seq = n_ctx_total / n_seq cells.
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

typedef struct ks_engine ks_engine;
typedef struct ks_sampler ks_sampler;

typedef struct ks_engine_params {
    const char *model_path;
    int n_ctx_seq;   /* context per sequence (0: 4096); capped at the model's training context */
    int n_seq;       /* sequences (>= 1) */
    int n_batch;     /* logical batch = max tokens in one decode (0: 512) */
    int n_threads;   /* 0: online CPUs */
    bool flash_attn; /* default false — see note 1 */
    int type_k;      /* ggml_type of K/V cache; -1: default (F16) */
    int type_v;
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
/* true when the memory can remove a partial range of a sequence; false for
 * recurrent and hybrid models, whose state cannot be trimmed. */
bool ks_engine_partial_rm_ok(const ks_engine *e);

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
ks_sampler *ks_sampler_create(const ks_engine *e, const ks_sample_params *sp);
void ks_sampler_free(ks_sampler *s);
/* Samples from the logits of batch index i and accepts the token. */
int32_t ks_sampler_sample(ks_sampler *s, ks_engine *e, int i);

/* ------------------------------------------------------- sequence memory */
/* Removes positions [p0, p1) of seq (p1 < 0: to the end). false when the
 * memory cannot remove a partial range: the caller then clears the sequence. */
bool ks_engine_seq_rm(ks_engine *e, int seq, int p0, int p1);
void ks_engine_seq_clear(ks_engine *e, int seq);
/* Highest position in seq, -1 when empty. */
int ks_engine_seq_pos_max(ks_engine *e, int seq);

/* Sequence state (the seq's KV as bytes): ask the size, then fill.
 * get returns bytes written (0 on failure); set returns KS_EMISMATCH when
 * llama rejects the blob (the sequence is then cleared). */
size_t ks_engine_state_size(ks_engine *e, int seq);
size_t ks_engine_state_get(ks_engine *e, int seq, uint8_t *buf, size_t n);
int ks_engine_state_set(ks_engine *e, int seq, const uint8_t *buf, size_t n);

#endif

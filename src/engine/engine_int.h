/*
 * engine_int.h — what engine.c shares with sampler.c and engine_text.c: the engine's llama
 * objects, and the capture of llama's error lines (a grammar's reason).
 * Inside src/engine/ only: it names llama.h's types.
 *
 * Thread model: as engine.h; the capture is per thread.
 */
#ifndef KS_ENGINE_INT_H
#define KS_ENGINE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

struct llama_model;
struct llama_vocab;
struct llama_context;

/* Borrowed for the engine's life. */
const struct llama_vocab *ks__engine_vocab(const ks_engine *e);
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

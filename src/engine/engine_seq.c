/*
 * engine_seq.c — the engine's batches, decode, logits and sequence memory
 * (removal, positions, state get/set). See engine.h.
 *
 * Thread model: as engine.h — the inference thread's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "ggml-backend.h"
#include "llama.h"

#define MOD "engine"

/* ----------------------------------------------------- decode and logits */
ks_batch *ks_batch_create(int n_max) {
    ks_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->b = llama_batch_init(n_max, 0, 1);
    b->n_max = n_max;
    return b;
}

void ks_batch_free(ks_batch *b) {
    if (!b) return;
    llama_batch_free(b->b);
    free(b);
}

void ks_batch_clear(ks_batch *b) { b->b.n_tokens = 0; }
int ks_batch_n(const ks_batch *b) { return b->b.n_tokens; }

int ks_batch_add(ks_batch *b, int32_t tok, int pos, int seq, bool logits) {
    int i = b->b.n_tokens;
    if (i >= b->n_max) return -1;
    b->b.token[i] = tok;
    b->b.pos[i] = pos;
    b->b.n_seq_id[i] = 1;
    b->b.seq_id[i][0] = seq;
    b->b.logits[i] = logits ? 1 : 0;
    b->b.n_tokens++;
    return i;
}

int ks_engine_decode(ks_engine *e, ks_batch *b) {
    if (b->b.n_tokens == 0) return 0;
    int r = llama_decode(e->ctx, b->b);
    if (r == 0) return 0;
    if (r == 1) return KS_EFULL;
    if (r == 2) return KS_ECANCELED;
    KS_ERROR(MOD, "llama_decode failed (%d) on %d tokens", r, b->b.n_tokens);
    return KS_EDECODE;
}

const float *ks_engine_logits(ks_engine *e, int i) { return llama_get_logits_ith(e->ctx, i); }

/* ------------------------------------------------------- sequence memory */
bool ks_engine_seq_rm(ks_engine *e, int seq, int p0, int p1) {
    return llama_memory_seq_rm(llama_get_memory(e->ctx), seq, p0, p1);
}

void ks_engine_seq_clear(ks_engine *e, int seq) {
    /* Removing the whole range always succeeds, for every memory type. */
    llama_memory_seq_rm(llama_get_memory(e->ctx), seq, -1, -1);
}

int ks_engine_seq_pos_max(ks_engine *e, int seq) {
    return llama_memory_seq_pos_max(llama_get_memory(e->ctx), seq);
}
int ks_engine_seq_pos_min(ks_engine *e, int seq) {
    return llama_memory_seq_pos_min(llama_get_memory(e->ctx), seq);
}

size_t ks_engine_state_size(ks_engine *e, int seq) { return llama_state_seq_get_size(e->ctx, seq); }

size_t ks_engine_state_get(ks_engine *e, int seq, uint8_t *buf, size_t n) {
    return llama_state_seq_get_data(e->ctx, buf, n, seq);
}

int ks_engine_state_set(ks_engine *e, int seq, const uint8_t *buf, size_t n) {
    size_t r = llama_state_seq_set_data(e->ctx, buf, n, seq);
    if (r == 0) {
        ks_engine_seq_clear(e, seq);
        return KS_EMISMATCH;
    }
    return 0;
}

size_t ks_engine_state_size_partial(ks_engine *e, int seq) {
    return llama_state_seq_get_size_ext(e->ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
}

size_t ks_engine_state_get_partial(ks_engine *e, int seq, uint8_t *buf, size_t n) {
    return llama_state_seq_get_data_ext(e->ctx, buf, n, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
}

int ks_engine_state_set_partial(ks_engine *e, int seq, const uint8_t *buf, size_t n) {
    size_t r = llama_state_seq_set_data_ext(e->ctx, buf, n, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    if (r == 0) {
        /* the partial memory may be half-read: nothing of the sequence is trustworthy */
        ks_engine_seq_clear(e, seq);
        return KS_EMISMATCH;
    }
    return 0;
}


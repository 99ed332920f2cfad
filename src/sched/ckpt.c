/*
 * ckpt.c — a slot's checkpoints: partial states of a hybrid or recurrent
 * model's sequence, taken, set again, copied with a slot and dropped.
 *
 * NOTES ON CHECKPOINTS (hybrid models: s->ckpt_on; policy.c asks for them). Their memory cannot drop a
 * suffix (llama_memory_seq_rm refuses: the recurrent part holds one state,
 * the latest), so a trim would rebuild the whole sequence. A checkpoint is
 * the sequence's partial state (the recurrent part alone: 1.1 KB on
 * tiny-hybrid, 115 KB on bench-hybrid, whatever the length) taken when the
 * sequence held exactly tokens[0, k): at the end of a prefill chunk or of a
 * generated token's decode, never inside a batch. Set again over the live
 * sequence, whose attention KV still holds tokens[0, k), it puts the
 * recurrent part back at k, and seq_rm(k, -1) then drops the rest: the
 * sequence is tokens[0, k) exactly, and decoding on is bit-identical to a
 * prefill (docs/LLAMA_FACTS.md, "Partial states as checkpoints"). Taken at
 * the system prompt's end (a chunk ends there, like the SPC capture), at the
 * prompt's end (free: the last chunk ends there; the next turn of a chat
 * diverges inside this reply, whose rendered form differs from the
 * generated one in its last tokens) and every ckpt_gen_interval generated
 * tokens (a reply keeps its last two, so a divergence a few tokens before
 * the reply's end re-prefills at most about two intervals). trim() restores
 * the latest at or before the divergence; only when none fits (or llama
 * refuses) is the sequence rebuilt. Restores of whole states (store, SPC,
 * slot copies) replace the sequence and drop the checkpoints; they are
 * exact on hybrid models as they are (fact (b)). A slot copy takes the
 * source's checkpoints along (ckpt_copy), so it can go back to one at or
 * before the common prefix (copy_reach); and the prompt's end is saved to
 * the store too, as a whole state (reason checkpoint), for the slot, process
 * or host that gets the conversation's next turn without these checkpoints.
 *
 *
 * Invariants
 *  C1. A slot's checkpoints stand for prefixes of its token list: each
 *      ckpt.n_tokens <= tokens.n, ascending, and the tokens below it have
 *      not changed since it was taken. Whatever cuts or replaces the token
 *      list drops the checkpoints beyond the cut (ks__ckpt_drop).
 */
#include <stdlib.h>
#include <string.h>

#include "sched/sched_int.h"

#define MOD "sched"

/* Removes checkpoint i, returning its buffer (owned: the caller frees or reuses it). */
static uint8_t *ckpt_remove(slot *sl, int i) {
    uint8_t *blob = sl->ckpts[i].blob;
    sl->ckpt_bytes -= sl->ckpts[i].len;
    memmove(&sl->ckpts[i], &sl->ckpts[i + 1], sizeof sl->ckpts[0] * (size_t)(sl->n_ckpts - i - 1));
    sl->n_ckpts--;
    return blob;
}

void ks__ckpt_drop(slot *sl, int n) {
    while (sl->n_ckpts > 0 && sl->ckpts[sl->n_ckpts - 1].n_tokens > n) free(ckpt_remove(sl, sl->n_ckpts - 1));
    KS_ASSERT(sl->n_ckpts == 0 || sl->ckpts[sl->n_ckpts - 1].n_tokens <= n);
}

/* Takes a checkpoint of the slot's sequence, which holds exactly its token
 * list now (a chunk or a generated token was just decoded). `gen`: taken
 * while generating; the reply's older generation checkpoints beyond its
 * last two go first. Out of memory or budget: no checkpoint (a later trim
 * uses an earlier one or rebuilds). */
void ks__ckpt_take(ks_sched *s, slot *sl, bool gen) {
    int n = sl->tokens.n;
    if (!s->ckpt_on || n <= 0) return;
    if (sl->n_ckpts > 0 && sl->ckpts[sl->n_ckpts - 1].n_tokens >= n) return; /* held already (C1: not above) */
    double t0 = ks_now_ms();
    size_t need = ks_engine_state_size_partial(s->e, sl->id);
    if (need == 0 || need > s->p.ckpt_bytes) return;
    /* A removed checkpoint's buffer is reused: partial states have one size,
     * so it fits, and a multi-megabyte state every interval needs no fresh
     * pages. */
    uint8_t *buf = NULL;
    size_t cap = 0;
    if (gen && sl->r) {
        /* Thinning: a reply keeps its last two generation checkpoints. */
        int n_gen = 0, first = -1;
        for (int i = 0; i < sl->n_ckpts; i++)
            if (sl->ckpts[i].gen && sl->ckpts[i].n_tokens > sl->r->prompt.n && n_gen++ == 0) first = i;
        if (n_gen >= 2) {
            cap = sl->ckpts[first].len;
            buf = ckpt_remove(sl, first);
        }
    }
    while (sl->n_ckpts > 0 && (sl->n_ckpts >= s->p.ckpt_max || sl->ckpt_bytes + need > s->p.ckpt_bytes)) {
        free(buf);
        cap = sl->ckpts[0].len;
        buf = ckpt_remove(sl, 0); /* the lowest goes first */
        s->cst.ckpt_drops++;
    }
    if (buf && cap < need) {
        free(buf);
        buf = NULL;
    }
    if (!buf && !(buf = malloc(need))) return;
    size_t len = ks_engine_state_get_partial(s->e, sl->id, buf, need);
    if (len == 0) {
        free(buf);
        return;
    }
    sl->ckpts[sl->n_ckpts++] = (ckpt){.n_tokens = n, .gen = gen, .blob = buf, .len = len};
    sl->ckpt_bytes += len;
    s->cst.ckpt_saves++;
    s->cst.ckpt_ms_total += ks_now_ms() - t0;
    KS_DEBUG(MOD, "slot[%d] checkpoint at %d tokens (%zu bytes; %d held)", sl->id, n, len, sl->n_ckpts);
}

/* The slot's sequence cannot drop the suffix after n: puts it back at the
 * latest checkpoint at or before n. Returns the tokens it keeps (> 0), or 0
 * when no checkpoint fits or llama refused (the sequence may be cleared
 * then: the caller clears and rebuilds). The token list is the caller's. */
int ks__ckpt_restore(ks_sched *s, slot *sl, int n) {
    int i = sl->n_ckpts - 1;
    while (i >= 0 && sl->ckpts[i].n_tokens > n) i--;
    if (i < 0) return 0;
    double t0 = ks_now_ms();
    const ckpt *c = &sl->ckpts[i];
    if (ks_engine_state_set_partial(s->e, sl->id, c->blob, c->len) != 0) {
        KS_WARN(MOD, "slot[%d] checkpoint at %d tokens rejected by llama; rebuilding", sl->id, c->n_tokens);
        return 0;
    }
    if (!ks_engine_seq_rm(s->e, sl->id, ks__kv_pos(sl, c->n_tokens), -1)) {
        /* The recurrent part is at the checkpoint, the attention KV is not:
         * the caller clears the sequence (P1). */
        KS_WARN(MOD, "slot[%d] trim after the checkpoint at %d tokens refused; rebuilding", sl->id, c->n_tokens);
        return 0;
    }
    s->cst.ckpt_restores++;
    s->cst.ckpt_restored_tokens += (uint64_t)c->n_tokens;
    s->cst.ckpt_ms_total += ks_now_ms() - t0;
    KS_DEBUG(MOD, "slot[%d] checkpoint-restore at %d tokens (wanted %d of %d)", sl->id, c->n_tokens, n,
             sl->tokens.n);
    return c->n_tokens;
}

/* Copies src's checkpoints at or below n into dst, which holds none (its
 * sequence was just replaced by a copy of src's). Out of memory: fewer. */
void ks__ckpt_copy(slot *dst, const slot *src, int n) {
    for (int i = 0; i < src->n_ckpts && src->ckpts[i].n_tokens <= n; i++) {
        const ckpt *c = &src->ckpts[i];
        uint8_t *blob = malloc(c->len);
        if (!blob) return;
        memcpy(blob, c->blob, c->len);
        dst->ckpts[dst->n_ckpts++] = (ckpt){.n_tokens = c->n_tokens, .gen = c->gen, .blob = blob, .len = c->len};
        dst->ckpt_bytes += c->len;
    }
}

bool ks__ckpt_valid(const slot *sl) {
    size_t bytes = 0;
    for (int i = 0; i < sl->n_ckpts; i++) {
        if (sl->ckpts[i].n_tokens > sl->tokens.n) return false;
        if (i > 0 && sl->ckpts[i].n_tokens <= sl->ckpts[i - 1].n_tokens) return false;
        bytes += sl->ckpts[i].len;
    }
    return bytes == sl->ckpt_bytes;
}

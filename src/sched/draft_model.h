/*
 * draft_model.h — a draft model as a source of drafts for speculative
 * decoding (ks_drafter_ops, drafter.h; llama-server's -md / draft-simple):
 * a smaller model of the same vocabulary proposes the next tokens greedily,
 * the target verifies them (sched/step.c "Speculation"), so what it proposes
 * changes how fast, never what.
 *
 * Contract
 *  - The draft model is a ks_engine of its own with at least as many
 *    sequences as the scheduler has slots; the drafter of slot i uses its
 *    sequence i, and keeps the exact tokens that sequence holds. Before each
 *    draft it brings that sequence to the slot's tokens: it keeps the longest
 *    common prefix and decodes only the rest (a same-slot turn, the common
 *    case of a cached conversation, decodes in the draft model only the
 *    tokens the target prefilled, plus the sampled one). The prompt's part
 *    is decoded at the request's first draft, after its first token went
 *    out: a draft model never delays the first token. A new drafter (a
 *    slot that passes to another tenant) starts from an empty sequence.
 *  - Drafting is greedy from the draft's logits; it stops at n_max tokens, at
 *    a token whose probability under the draft is below p_min (0: never),
 *    at the draft's end of generation, or at the draft context's end.
 *  - The draft's KV is a cache citizen (issue 36): when the slot's tokens
 *    share less with the sequence than they do with another drafter's of
 *    the same tenant (a slot copy, a system prompt another slot holds, a
 *    conversation that moved), that sequence is copied first (state get/set
 *    in the draft engine) and only the rest decoded; else, with a store
 *    (cfg.store: the draft model's own, keyed by its fingerprint and
 *    kv-params, so never another model's), the longest stored prefix is
 *    restored (a conversation read back from the target's store, after a
 *    restart or on another host). A sequence about to lose a long tail
 *    (another conversation takes the slot) and a drafter's last sequence
 *    (destroy: a shutdown, an unload, another tenant) are saved to that
 *    store with reason evict (serve maps it to the target's shutdown tier).
 *    None of it changes a reply: a draft is only ever verified.
 *  - A request whose prompt has images or audio (pseudo-tokens, which the
 *    draft model cannot decode) gets no drafts.
 *  - ks_draft_model_same_vocab: the same vocabulary, token for token (text and
 *    count), and the same BOS/EOS; otherwise the drafts would be of other
 *    tokens. `kvstash serve -md` refuses another with exit 2.
 *
 * Thread model: the ops run on the scheduler's inference thread, which alone
 * decodes in the draft engine; the counters are atomics, read from any thread.
 */
#ifndef KS_DRAFT_MODEL_H
#define KS_DRAFT_MODEL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/store.h"
#include "engine/engine.h"
#include "sched/drafter.h"

/* The drafters one cfg serves at once (the scheduler's slots, 256 at most). */
#define KS_DRAFT_LIVE_MAX 256

typedef struct ks_draft_model_cfg {
    ks_engine *engine;            /* the draft model; borrowed, outlives the scheduler */
    float p_min;                  /* --spec-draft-p-min (default 0: greedy to n_max) */
    ks_store *store;              /* the draft model's states (NULL: none); borrowed, outlives the
                                     scheduler */
    bool no_cache;                /* neither copies nor restores (the benchmarks' baseline:
                                     KS_DRAFT_CACHE=0 in serve) */
    void *live[KS_DRAFT_LIVE_MAX]; /* the drafters by slot (inference thread only) */
    uint8_t *buf;                 /* the drafters' scratch for copies (inference thread only;
                                     freed by ks_draft_model_cfg_fini) */
    size_t buf_cap;
    /* Counters: prompt tokens the draft model decoded (a request's first
     * draft brings its sequence to the prompt: for a same-slot turn only the
     * new tokens, and the last one again for its logits), tokens it decoded
     * to follow generation (each step's sampled token, rejected positions),
     * and tokens it drafted. */
    _Atomic uint64_t prefilled;
    _Atomic uint64_t followed;
    _Atomic uint64_t drafted;
    /* Prompt tokens the draft sequence got without decoding them: copied
     * from another drafter's sequence, restored from the store; and the
     * states it saved there. */
    _Atomic uint64_t copied;
    _Atomic uint64_t restored;
    _Atomic uint64_t saved;
} ks_draft_model_cfg;

/* The ops; create's cfg is a ks_draft_model_cfg. */
const ks_drafter_ops *ks_draft_model_ops(void);
/* Frees what the drafters left in cfg (their copy scratch), after the
 * scheduler that used it is gone. */
void ks_draft_model_cfg_fini(ks_draft_model_cfg *cfg);

/* Whether draft can draft for target: 0, or KS_EINVAL with the first
 * difference in err ("token 17: 'ab' in the draft model, 'a' in the model"). */
int ks_draft_model_same_vocab(const ks_engine *target, const ks_engine *draft, char *err, size_t n);

#endif

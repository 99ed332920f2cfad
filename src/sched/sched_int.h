/*
 * sched_int.h — the scheduler's internal state, shared by its files:
 *
 *   sched.c   the queue, the inference thread's loop, the public calls and
 *             finishing requests (who runs when);
 *   policy.c  the cache policy: which slot a request goes to, how much of its
 *             KV is kept, which copies and restores run in which order
 *             (slot copy, store, SPC), when states are saved and captured
 *             (what is reused);
 *   step.c    one decode step: batch assembly, the exactness rule (every
 *             sequence at 0 or >= 2 rows), sampling (how it is computed);
 *   chunk.c   where a prefill's chunks end and what is saved there (cold
 *             saves, pins, captures, checkpoints), a generation's saves;
 *   ckpt.c    a hybrid model's checkpoints;
 *   warm.c    warm start: the store's latest states into the slots at
 *             creation.
 * (chat.c is ks_chat, built on the public API.)
 * The save-point cut arithmetic is pure and lives in cache/savepoint.c.
 *
 * Thread model: everything in a slot and in the inference-thread part of
 * ks_sched belongs to the inference thread; the fields marked "under mu" are
 * shared with the threads that call the public API.
 */
#ifndef KS_SCHED_INT_H
#define KS_SCHED_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/route.h"
#include "cache/store.h"
#include "sched/sched.h"

/* What became of a request's cache pin (policy.c). */
typedef enum { PIN_IGNORED = 0, PIN_PENDING, PIN_HELD, PIN_FAILED } pin_state;

typedef struct sreq {
    uint64_t id;
    ks_req_params p;     /* p.ext points to ext; p.pins to pins */
    ks_tokens prompt;
    uint64_t *hashes;
    ks_sample_ext *ext;  /* submit's deep copy, one allocation; NULL: none */
    ks_cache_pin pins[KS_MAX_CACHE_PINS]; /* submit's copy: ascending, merged */
    pin_state pin_st[KS_MAX_CACHE_PINS];
    int n_pins;
    int pin_saved_max;   /* the deepest pin saved (not refreshed) by this request, 0: none */
    atomic_int cancel;
    double t_submit, t_assign, t_first;
    ks_req_result res;
    bool done;           /* on_done was called (sched.h invariant 2) */
    int draft_steps;     /* decode steps that verified a draft (res.n_drafted's) */
    bool superseded;     /* its plan superseded the slot's deferred finish save: a cancel
                            defers one of what the slot holds then (policy.c) */
    struct sreq *next;
} sreq;

typedef enum { ST_IDLE = 0, ST_PREFILL, ST_GEN } slot_state;

/* A checkpoint (policy.c "Checkpoints"): the partial state of the slot's
 * sequence when it held exactly tokens[0, n_tokens). */
typedef struct ckpt {
    int n_tokens;
    bool gen;            /* taken while generating (thinned: a reply keeps its last two) */
    uint8_t *blob;       /* owned */
    size_t len;
} ckpt;

typedef struct slot {
    int id;
    slot_state state;
    bool planned;        /* assigned and trimmed; an assigned slot not yet planned is
                            "pending" to the router */
    bool no_store;       /* the KV was left by a cache_prompt:false request: never saved */
    bool save_pending;   /* a finish save deferred, not asked for yet (policy.c "Deferred
                            finish saves"); only on a slot whose KV no request changed since */
    double save_due_ms;  /* when it is taken at the latest, ks_now_ms() */
    ks_tokens tokens;    /* exactly what the sequence holds (sched.c, S1) */
    uint64_t tenant;     /* whose KV that is (ks_req_params.tenant): set by the plan
                            once the previous tenant's KV is saved and dropped */
    sreq *r;
    ks_media_set *media; /* the media set the tokens' runs are in (a reference): the
                            last planned request's, whose prompt they are a prefix of,
                            when it has M-RoPE images; NULL: token i at KV position i */
    int n_past;          /* next prompt index to prefill */
    int chunk;           /* prompt tokens in the current batch */
    int32_t next_tok;    /* sampled, to be decoded next */
    int i_logits;        /* batch index with logits in the current batch, -1 */
    int pad_pos;         /* position of the throwaway companion row, -1 */
    bool in_batch;
    ks_sampler *smpl;
    int n_generated;
    /* Speculative decoding (step.c): the slot's drafter (created on first
     * use, for the tenant drafter_tenant: never shown another tenant's
     * tokens), this step's draft (decoded after next_tok), and whether the
     * current request drafts at all and how many tokens at most. */
    void *drafter;
    uint64_t drafter_tenant;
    int32_t draft[KS_DRAFT_MAX];
    int n_draft;
    int draft_cap;
    double acc_hit, acc_miss; /* decayed counts of drafted tokens kept and of first rejections
                                 (step.c "How much to draft"): the acceptance estimate */
    int64_t last_used_us;
    /* IMC identity of the branch the slot holds */
    uint64_t msg_hash;
    int n_msgs_cached;
    /* route decision for the assigned request */
    ks_route route;
    int snap_sys;        /* SPC: capture the state when n_past reaches this, -1: no */
    int snap_store;      /* store: cold save when n_past reaches this at the end of the
                            current chunk, -1: no (set per step by ks__policy_chunk) */
    int snap_ckpt;       /* checkpoint when n_past reaches this (the system prompt's end), -1: no */
    ckpt ckpts[KS_SCHED_CKPT_MAX]; /* ascending n_tokens, all within tokens (C1 in ckpt.c) */
    int n_ckpts;
    size_t ckpt_bytes;   /* sum of their lengths */
    /* published (under mu) */
    ks_slot_info info;
} slot;

struct ks_sched {
    ks_sched_params p;
    ks_reason stop_reason;      /* the slots' saves when the thread stops (ks_sched_set_stop_reason) */
    ks_engine *e;
    int n_slots;
    int n_ctx_seq;
    int n_batch;
    slot *slots;
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work arrived / stop */
    pthread_cond_t cv_done; /* a request finished */
    /* under mu */
    sreq *q_head, *q_tail;
    int q_n;
    int n_active;           /* assigned, not finished: the slots not idle */
    bool stop;
    uint64_t next_id;
    int *clear_pending;     /* per slot: a clear was asked */
    ks_sched_stats st;      /* st.cache is a copy of cst, made by publish */
    /* inference thread only */
    ks_batch *batch;
    float *logits_copy;
    char *piece;            /* a sampled token's text, piece_cap bytes */
    size_t piece_cap;
    ks_token_prob probs_top[KS_N_PROBS_MAX]; /* on_probs' top candidates */
    int prefill_rr;         /* round-robin start among prefilling slots */
    bool pairs;             /* keep every sequence at >= 2 rows per decode (exactness) */
    ks_sched_cache_stats cst; /* the cache decisions' counters, published under mu */
    uint8_t *copy_buf;      /* slot copies' scratch (policy.c): kept while requests are active,
                               since a fresh multi-megabyte buffer costs more in page faults
                               than the copy itself; freed when the scheduler goes idle */
    size_t copy_cap;
    bool ckpt_on;           /* checkpoints: a hybrid model and a budget (sched.h) */
    bool spec_on;           /* speculative decoding runs (ks_sched_spec_status) */
    double cost_ms[KS_DRAFT_MAX + 2]; /* a decode's time by its rows (1..KS_DRAFT_MAX + 1), a moving
                                         average; 0: not seen (step.c "How much to draft") */
    bool spec_exact;
    const char *spec_why;
    /* What warm start put into slots (warm.c), copied for ks_sched_warm_list:
     * written before the inference thread starts, read-only after. */
    ks_tokens *warm_toks;
    uint64_t *warm_tenants;
    int n_warm;
};

/* sched.c */
/* Ends the slot's request with on_done; the slot becomes idle. A slot whose
 * sequence or token list may be wrong must go through ks__sched_fail instead. */
void ks__sched_finish(ks_sched *s, slot *sl, ks_finish f, int err, bool eog);
/* Ends the slot's request with an error and drops the slot's KV and tokens. */
void ks__sched_fail(ks_sched *s, slot *sl, int err);

/* policy.c */
/* Plans an assigned slot: creates the sampler, keeps the reused prefix,
 * restores from the store or SPC. Returns 0, or an error after which the
 * caller fails the request (the slot is consistent either way). KS_EINVAL
 * means the request's sampler could not be made (a grammar llama.cpp
 * refuses) and comes before anything of the slot is touched: the caller only
 * finishes the request, the slot keeps its KV. */
int ks__policy_plan(ks_sched *s, slot *sl);
/* Sizes the slot's next prefill chunk of at most take tokens at this budget,
 * ending it at a pending SPC capture, a pending cache pin or a cold save point
 * (sets snap_store). */
int ks__policy_chunk(ks_sched *s, slot *sl, int take, int budget);
/* After a prefill chunk was decoded and appended: SPC capture, cache pins and
 * cold save at their points. */
void ks__policy_chunk_done(ks_sched *s, slot *sl);
/* The request ends: the pins it did not reach count as failed, and the
 * result gets n_cache_written (sched.h). */
void ks__policy_pins_done(ks_sched *s, sreq *r);
/* After generated tokens were decoded and appended (the sequence held
 * n_before generated tokens before the step and holds n_after > n_before
 * now: more than one with a draft; the next one may be sampled already):
 * the continued save, the generation checkpoint, when a multiple of their
 * interval is in (n_before, n_after]. */
void ks__policy_token_done(ks_sched *s, slot *sl, int n_before, int n_after);
/* Hands the slot's KV (all of slot->tokens) to the store for `why`. */
void ks__policy_save(ks_sched *s, slot *sl, ks_reason why, bool sync);
/* policy.c's steps that chunk.c takes at a chunk's end: the SPC capture of
 * the system prompt's state, the save of request pin i, and the next pin
 * point after pos (0: none). */
void ks__policy_spc_capture(ks_sched *s, slot *sl);
/* Replaces the slot's sequence with a state standing for tokens[0, n)
 * (policy.c; warm.c too). Returns 0; KS_EMISMATCH when llama rejects the
 * state (the slot is then empty and consistent); KS_ENOMEM when the token
 * list cannot hold the tokens (the sequence is cleared too, P1). */
int ks__policy_restore_state(ks_sched *s, slot *sl, const uint8_t *state, size_t len, const int32_t *tokens,
                             int n);
void ks__policy_pin_save(ks_sched *s, slot *sl, sreq *r, int i);
int ks__policy_pin_next(const sreq *r, int pos);
/* The two halves of ks__policy_save, for a save taken after the request's
 * on_done (the finish save: its state copy must not hold back the reply's
 * end). ks__policy_save_ask counts the save request (published with the
 * slot, so that a client that saw the reply also sees it asked) and returns
 * 1 when the store wants the state, 0 when not, -1 when no save applies;
 * ks__policy_save_take, only after a 1 and before the slot's KV changes,
 * copies the state and hands it to the store (uncounting it when the copy
 * has no memory). */
int ks__policy_save_ask(ks_sched *s, slot *sl, ks_reason why);
void ks__policy_save_take(ks_sched *s, slot *sl, ks_reason why, bool sync);
/* No request is active: frees what the policy keeps only for busy periods
 * (the copy scratch). */
void ks__policy_idle(ks_sched *s);
/* Deferred finish saves (policy.c): ks__policy_defer_finish leaves the
 * finished slot's finish save pending (not yet asked) until due, where one
 * applies (the store saves finish states, the slot's may be stored);
 * ks__policy_pending_due returns the earliest due time of a pending save (ms,
 * ks_now_ms clock), -1 for none; ks__policy_pending_take takes every pending
 * save due by `now` (all with now < 0; sync: wait for the store to hold
 * them, as at shutdown) and returns how many. Inference thread, without mu. */
bool ks__policy_defer_finish(ks_sched *s, slot *sl); /* false: no finish save applies */
double ks__policy_pending_due(const ks_sched *s);
int ks__policy_pending_take(ks_sched *s, double now, bool sync);
/* Takes sl's deferred finish save now, if it has one (before its KV is cleared). */
void ks__policy_pending_take_slot(ks_sched *s, slot *sl);
/* Forgets every deferred finish save (a process's exit where they would go
 * nowhere that outlives it); returns how many. */
int ks__policy_pending_drop(ks_sched *s);

/* ckpt.c (hybrid and recurrent models; C1 there) */
/* Drops the slot's checkpoints beyond n tokens (all of them for 0): call
 * wherever the token list is cut or replaced. */
void ks__ckpt_drop(slot *sl, int n);
/* Takes a checkpoint of the slot's sequence, which holds exactly its token
 * list now; gen: while generating (a reply keeps its last two). */
void ks__ckpt_take(ks_sched *s, slot *sl, bool gen);
/* Puts the sequence back at the latest checkpoint at or before n tokens:
 * the tokens it keeps (> 0), or 0 when none fits (the caller rebuilds). */
int ks__ckpt_restore(ks_sched *s, slot *sl, int n);
/* Copies src's checkpoints at or before n tokens into dst (a slot copy). */
void ks__ckpt_copy(slot *dst, const slot *src, int n);
/* C1 holds for sl's checkpoints (KS_ASSERT). */
bool ks__ckpt_valid(const slot *sl);

/* The KV position of the slot's token i (engine/media.h note 2; sched.h
 * invariant 1): i but after an M-RoPE image of the slot's media set. */
static inline int ks__kv_pos(const slot *sl, int i) { return ks_media_set_kv_pos(sl->media, i); }
/* Makes set (the planned request's) the slot's media set: before the slot's
 * tokens become a prefix of that request's prompt (its first trim). Only a
 * set whose positions are not the tokens' is kept (NULL gives the same
 * positions): an idle slot holds no other set, nor its embeddings. */
static inline void ks__slot_media(slot *sl, ks_media_set *set) {
    if (!ks_media_set_shifts(set)) set = NULL;
    if (sl->media == set) return;
    ks_media_set_unref(sl->media);
    sl->media = ks_media_set_ref(set);
}

/* step.c */
/* One decode step over the busy slots (planned). */
void ks__step(ks_sched *s);

/* warm.c: puts the store's most recent states into the slots
 * (ks_sched_params.warm_slots). Before the inference thread starts. */
void ks__sched_warm(ks_sched *s);

#endif

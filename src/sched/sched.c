/*
 * sched.c — the inference thread: queue, slots, continuous batching.
 *
 * NOTES ON THE DESIGN OF THE SCHEDULER
 *
 * One thread (run()) owns the engine's context, every slot's sequence and
 * token list, and the samplers. HTTP threads only touch the queue, the cancel
 * flags and the published slot info, all under `mu`.
 *
 * A loop iteration ("step"):
 *   1. under mu: drop canceled queued requests, assign queued requests to idle
 *      slots (FIFO; routing picks the slot), mark those slots busy;
 *   2. without mu: plan each new assignment (trim the slot's KV to the reused
 *      prefix), then build one batch — one token per generating slot, then
 *      prefill chunks — decode it, sample, run callbacks, finish requests;
 *   3. under mu: publish slot info and counters, wake drainers.
 *
 * Invariants (see sched.h for the public ones)
 *  S1. slot->tokens grows only after a successful decode of those tokens, so
 *      it never claims KV that is not there; on a decode error the slot's
 *      sequence is cleared and its token list emptied.
 *  S2. A slot's sequence id equals its index.
 *  S3. Callbacks are called without holding mu.
 *
 * Snapshot points inside a prefill (a chunk ends exactly there, so that the
 * sequence holds exactly those tokens when its state is copied):
 *  - snap_sys: the system prompt's end, when SPC did not have it (capture).
 *  - cold saves (store) cost a warm turn no decode step. The last prefill
 *    chunk of a request (the chunk as sized reaches the end of the prompt) is
 *    cut for one only in a COLD prefill (< a stride reused: one extra step beside
 *    a whole prompt's prefill), at the prompt's last stride boundary; after a
 *    reused history it is never cut (the finish save follows within the
 *    request) — that cut cost warm turns ~150 ms of TTFT with 4 concurrent
 *    requests (docs/BENCHMARKS.md, save overhead). A chunk that is not the last
 *    and crosses a stride boundary b may end at b (its last one), moving the
 *    few tokens after b to the next chunk when that adds no decode step at
 *    the current budget; the state of exactly b tokens is then handed to the
 *    store as a `cold` save (if it wants it). Of those chunks only the last
 *    one saves (looking ahead at the current budget), so a long prefill gets
 *    one cold save, at its last stride-aligned chunk end. See cold_cut().
 */
#include "sched/sched.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/prefix.h"
#include "cache/route.h"
#include "cache/spc.h"
#include "cache/store.h"

#define MOD "sched"

typedef struct sreq {
    uint64_t id;
    ks_req_params p;
    ks_tokens prompt;
    uint64_t *hashes;
    atomic_int cancel;
    double t_submit, t_assign, t_first;
    ks_req_result res;
    struct sreq *next;
} sreq;

typedef enum { ST_IDLE = 0, ST_PREFILL, ST_GEN } slot_state;

typedef struct slot {
    int id;
    slot_state state;
    bool planned;        /* assigned and trimmed */
    bool no_store;       /* the KV was left by a cache_prompt:false request: never saved */
    ks_tokens tokens;    /* exactly what the sequence holds (S1) */
    sreq *r;
    int n_past;          /* next prompt index to prefill */
    int chunk;           /* prompt tokens in the current batch */
    int32_t next_tok;    /* sampled, to be decoded next */
    int i_logits;        /* batch index with logits in the current batch, -1 */
    int pad_pos;         /* position of the throwaway companion row, -1 */
    bool in_batch;
    ks_sampler *smpl;
    int n_generated;
    int64_t last_used_us;
    /* IMC identity of the branch the slot holds */
    uint64_t msg_hash;
    int n_msgs_cached;
    /* route decision for the assigned request */
    ks_route route;
    int snap_sys;        /* SPC: capture the state when n_past reaches this, -1: no */
    int snap_store;      /* store: cold save when n_past reaches this at the end of the
                            current chunk, -1: no (set per step by cold_cut) */
    /* published (under mu) */
    ks_slot_info info;
} slot;

struct ks_sched {
    ks_sched_params p;
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
    sreq *q_head, *q_tail;
    int q_n;
    int n_active;           /* assigned, not finished */
    bool stop;
    uint64_t next_id;
    int *clear_pending;     /* per slot: a clear was asked */
    ks_batch *batch;
    float *logits_copy;
    int prefill_rr;         /* round-robin start among prefilling slots */
    bool pairs;             /* keep every sequence at >= 2 rows per decode (exactness) */
    ks_sched_stats st;
};

const char *ks_finish_name(ks_finish f) {
    switch (f) {
    case KS_FINISH_STOP: return "stop";
    case KS_FINISH_LENGTH: return "length";
    case KS_FINISH_CANCEL: return "cancel";
    default: return "error";
    }
}

ks_sched_params ks_sched_params_default(void) {
    ks_sched_params p = {0};
    p.max_queue = 64;
    p.cache_prompt = true;
    p.affinity_min = 0.05f;
    p.exact = true;
    p.cache_min_tokens = 100;
    p.store_stride = 256;
    p.continued_interval = 512;
    p.store_min_tokens = 256;
    p.save_on_shutdown = true;
    return p;
}

static void sreq_free(sreq *r) {
    if (!r) return;
    ks_tokens_free(&r->prompt);
    free(r->hashes);
    free(r);
}

static void store_save(ks_sched *s, slot *sl, ks_reason why, bool sync);

/* ------------------------------------------------------------ finishing */
/* Ends slot's request: on_done, then the slot becomes idle. Inference thread. */
static void publish_locked(ks_sched *s);

static void finish(ks_sched *s, slot *sl, ks_finish f, int err, bool eog) {
    sreq *r = sl->r;
    /* Invariant S1 and the bookkeeping rule of prefix.h, checked in debug builds. */
    assert((f != KS_FINISH_STOP && f != KS_FINISH_LENGTH) ||
           sl->tokens.n == ks_prefix_kv_after(r->prompt.n, sl->n_generated, eog));
    if (s->p.store && (f == KS_FINISH_STOP || f == KS_FINISH_LENGTH) && r->p.cache_prompt && s->p.cache_prompt)
        store_save(s, sl, KS_REASON_FINISH, false);
    double now = ks_now_ms();
    r->res.slot = sl->id;
    r->res.n_generated = sl->n_generated;
    r->res.finish = f;
    r->res.error = err;
    if (r->t_first > 0) {
        r->res.prompt_ms = r->t_first - r->t_assign;
        r->res.ttft_ms = r->t_first - r->t_submit;
        r->res.gen_ms = now - r->t_first;
    } else if (r->t_assign > 0) {
        r->res.prompt_ms = now - r->t_assign;
    }
    ks_sampler_free(sl->smpl);
    sl->smpl = NULL;

    /* The slot is idle and published before on_done, so a caller woken by
     * on_done sees the slot as it is now (its KV and token count). */
    pthread_mutex_lock(&s->mu);
    s->st.requests_total++;
    if (f == KS_FINISH_CANCEL) s->st.requests_canceled++;
    s->st.prompt_tokens_total += (uint64_t)r->res.n_prompt;
    s->st.prompt_tokens_cached_total += (uint64_t)r->res.n_cached;
    s->st.tokens_predicted_total += (uint64_t)sl->n_generated;
    s->st.prompt_seconds_total += r->res.prompt_ms / 1e3;
    s->st.predicted_seconds_total += r->res.gen_ms / 1e3;
    sl->state = ST_IDLE;
    sl->planned = false;
    sl->r = NULL;
    sl->last_used_us = ks_now_us();
    sl->info.n_generated = sl->n_generated;
    s->n_active--;
    publish_locked(s);
    pthread_mutex_unlock(&s->mu);

    if (r->p.on_done) r->p.on_done(r->p.ud, &r->res); /* S3: no lock held */
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    sreq_free(r);
}

/* A request that never got a slot (canceled in the queue, or shutdown). */
static void finish_unassigned(ks_sched *s, sreq *r, ks_finish f) {
    r->res.finish = f;
    r->res.slot = -1;
    r->res.queue_ms = ks_now_ms() - r->t_submit;
    if (r->p.on_done) r->p.on_done(r->p.ud, &r->res);
    pthread_mutex_lock(&s->mu);
    s->st.requests_total++;
    if (f == KS_FINISH_CANCEL) s->st.requests_canceled++;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    sreq_free(r);
}

/* ------------------------------------------------------------- routing */
static int route_request(ks_sched *s, sreq *r, ks_route *out) {
    if (r->p.preferred_slot >= 0) {
        slot *sl = &s->slots[r->p.preferred_slot];
        if (sl->state != ST_IDLE) return KS_EBUSY;
        memset(out, 0, sizeof *out);
        out->slot = sl->id;
        bool cache = r->p.cache_prompt && s->p.cache_prompt;
        out->n_common = cache ? ks_prefix_common(sl->tokens.v, sl->tokens.n, r->prompt.v, r->prompt.n) : 0;
        out->n_reuse = ks_prefix_reuse(out->n_common, r->prompt.n);
        out->mode = out->n_reuse > 0 ? KS_ROUTE_PREFIX : KS_ROUTE_MISS;
        if (!cache) snprintf(out->reason, sizeof out->reason, "cache-disabled");
        else if (out->n_reuse == 0 && sl->tokens.n > 0) snprintf(out->reason, sizeof out->reason, "diverged-at-token-0");
        else if (out->n_reuse == 0) snprintf(out->reason, sizeof out->reason, "no-slot");
        else if (out->n_reuse < r->prompt.n - 1) snprintf(out->reason, sizeof out->reason, "diverged-at-token-%d", out->n_reuse);
        return 0;
    }
    ks_route_slot rs[256];
    int n = s->n_slots < 256 ? s->n_slots : 256;
    for (int i = 0; i < n; i++) {
        slot *sl = &s->slots[i];
        rs[i] = (ks_route_slot){.id = i, .busy = sl->state != ST_IDLE, .pending = false,
                                .tokens = sl->tokens.v, .n_tokens = sl->tokens.n,
                                .last_used_us = sl->last_used_us, .msg_hash = sl->msg_hash,
                                .n_msgs_cached = sl->n_msgs_cached};
    }
    ks_route_req rq = {.tokens = r->prompt.v, .n_tokens = r->prompt.n, .msg_prefix_hash = r->hashes,
                       .n_msgs = r->hashes ? r->p.n_msgs : 0,
                       .cache_prompt = r->p.cache_prompt && s->p.cache_prompt};
    if (s->p.spc && r->p.sys_key && r->p.n_sys_tokens >= s->p.cache_min_tokens &&
        ks_spc_contains(s->p.spc, r->p.sys_key))
        rq.spc_tokens = r->p.n_sys_tokens;
    ks_route_cfg cfg = {.imc = s->p.imc, .cache_min_tokens = s->p.cache_min_tokens,
                        .affinity_min = s->p.affinity_min};
    return ks_route_select(rs, n, &rq, &cfg, out);
}

/* Under mu: move assignable queued requests onto idle slots. Canceled queued
 * requests are moved to *dead for finishing outside the lock. */
static void assign_locked(ks_sched *s, sreq **dead) {
    sreq **pp = &s->q_head;
    sreq *prev = NULL;
    while (*pp) {
        sreq *r = *pp;
        if (atomic_load(&r->cancel) || s->stop) {
            *pp = r->next;
            if (s->q_tail == r) s->q_tail = prev;
            s->q_n--;
            r->next = *dead;
            *dead = r;
            continue;
        }
        ks_route rt;
        if (route_request(s, r, &rt) != 0) {
            /* Keep FIFO order for unpinned requests: a later one must not
             * overtake when no slot is free. A pinned request waits alone. */
            if (r->p.preferred_slot < 0) break;
            prev = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (s->q_tail == r) s->q_tail = prev;
        s->q_n--;
        slot *sl = &s->slots[rt.slot];
        sl->r = r;
        sl->route = rt;
        sl->state = ST_PREFILL;
        sl->planned = false;
        s->n_active++;
        r->t_assign = ks_now_ms();
        r->res.queue_ms = r->t_assign - r->t_submit;
    }
}

/* Copies the slot's sequence state into a new buffer (owned: free()). */
static uint8_t *snapshot(ks_sched *s, slot *sl, size_t *len) {
    double t0 = ks_now_ms();
    size_t n = ks_engine_state_size(s->e, sl->id);
    uint8_t *buf = n ? malloc(n) : NULL;
    if (!buf) return NULL;
    *len = ks_engine_state_get(s->e, sl->id, buf, n);
    if (*len == 0) {
        free(buf);
        return NULL;
    }
    pthread_mutex_lock(&s->mu);
    s->st.snapshot_ms_total += ks_now_ms() - t0;
    pthread_mutex_unlock(&s->mu);
    return buf;
}

/* Hands the slot's current KV (all of slot->tokens) to the store. */
static void store_save(ks_sched *s, slot *sl, ks_reason why, bool sync) {
    if (!s->p.store || sl->no_store || sl->tokens.n < s->p.store_min_tokens) return;
    /* Ask the store first: nothing is copied for a reason that maps to no
     * tier, or for a state it already holds (e.g. the finish save of the
     * request that left this KV, when the slot is evicted later). Such a "no"
     * is still a save request, counted by the store as not written. */
    bool want = ks_store_wants(s->p.store, why, sl->tokens.v, sl->tokens.n);
    size_t len = 0;
    uint8_t *buf = want ? snapshot(s, sl, &len) : NULL;
    if (want && !buf) return; /* out of memory: nothing was asked of the store */
    pthread_mutex_lock(&s->mu);
    s->st.store_save_requests[why]++;
    pthread_mutex_unlock(&s->mu);
    if (!want) return;
    int rc = ks_store_save(s->p.store, why, sl->tokens.v, sl->tokens.n, buf, len, sync); /* takes buf */
    KS_DEBUG(MOD, "slot[%d] save %s: %d tokens, %zu bytes%s (%s)", sl->id, ks_reason_name(why), sl->tokens.n,
             len, sync ? ", sync" : "", rc ? ks_strerror(rc) : "ok");
}

/* Store: restores the longest stored prefix of the prompt longer than `beat`
 * tokens (beat >= *n_reuse: what the slot or SPC gives without the store)
 * and at most `max` tokens (capped at all but the last token of the prompt).
 * Returns true when the slot now holds it. */
static bool store_restore(ks_sched *s, slot *sl, sreq *r, int *n_reuse, int beat, int max) {
    double t0 = ks_now_ms();
    ks_store_hit hit;
    if (beat < *n_reuse) beat = *n_reuse;
    if (max > r->prompt.n - 1) max = r->prompt.n - 1;
    if (beat + 1 > max) return false;
    if (ks_store_lookup_range(s->p.store, r->prompt.v, r->prompt.n, beat + 1, max, &hit) != 0) return false;
    bool ok = false;
    if (hit.n_tokens <= *n_reuse) goto done;
    if (sl->tokens.n > *n_reuse) store_save(s, sl, KS_REASON_EVICT, true); /* about to drop unsaved KV */
    ks_engine_seq_clear(s->e, sl->id);
    ks_tokens_truncate(&sl->tokens, 0);
    if (ks_engine_state_set(s->e, sl->id, hit.payload, hit.payload_len) != 0) {
        KS_WARN(MOD, "slot[%d] stored state of %d tokens rejected by llama; prefilling", sl->id, hit.n_tokens);
        *n_reuse = 0;
        goto done;
    }
    ks_tokens_assign(&sl->tokens, r->prompt.v, hit.n_tokens);
    *n_reuse = hit.n_tokens;
    double ms = ks_now_ms() - t0;
    ks_store_note_restore(s->p.store, ms);
    snprintf(r->res.cache_tier, sizeof r->res.cache_tier, "%s", ks_tier_name(hit.tier));
    r->res.restore_ms = ms;
    pthread_mutex_lock(&s->mu);
    s->st.store_hits++;
    s->st.store_restored_tokens += (uint64_t)hit.n_tokens;
    s->st.store_restore_ms_total += ms;
    pthread_mutex_unlock(&s->mu);
    KS_DEBUG(MOD, "slot[%d] store-restore %d tokens from %s (%zu bytes, %.2f ms)", sl->id, hit.n_tokens,
             ks_tier_name(hit.tier), hit.payload_len, ms);
    ok = true;
done:
    ks_store_hit_free(&hit);
    return ok;
}

/* SPC: restore the system prompt's state into the slot's (cleared) sequence.
 * The key is a 64-bit hash, so the entry's tokens are compared with the
 * prompt's before anything is restored (spc.h, invariant 5). */
static bool spc_restore(ks_sched *s, slot *sl, sreq *r, int *n_reuse) {
    int n_sys = r->p.n_sys_tokens;
    const ks_spc_entry *e = ks_spc_acquire(s->p.spc, r->p.sys_key);
    bool ok = false;
    if (!e) {
        s->st.spc_misses++;
        return false;
    }
    if (e->tokens.n != n_sys || memcmp(e->tokens.v, r->prompt.v, sizeof(int32_t) * (size_t)n_sys) != 0) {
        KS_WARN(MOD, "slot[%d] SPC entry does not match the prompt's system tokens; prefilling", sl->id);
        s->st.spc_misses++;
        goto done;
    }
    double t0 = ks_now_ms();
    ks_engine_seq_clear(s->e, sl->id);
    ks_tokens_truncate(&sl->tokens, 0);
    if (ks_engine_state_set(s->e, sl->id, e->blob, e->len) != 0) {
        KS_WARN(MOD, "slot[%d] SPC state rejected by llama; prefilling", sl->id);
        s->st.spc_misses++;
        *n_reuse = 0;
        goto done;
    }
    ks_tokens_assign(&sl->tokens, e->tokens.v, n_sys);
    *n_reuse = n_sys;
    s->st.spc_hits++;
    s->st.spc_restored_tokens += (uint64_t)n_sys;
    KS_DEBUG(MOD, "slot[%d] spc-restore %d tokens (%zu bytes) in %.2f ms", sl->id, n_sys, e->len, ks_now_ms() - t0);
    ok = true;
done:
    ks_spc_release(s->p.spc, e);
    return ok;
}

/* SPC: the slot's sequence holds exactly the system prompt now: keep a copy. */
static void spc_capture(ks_sched *s, slot *sl) {
    sreq *r = sl->r;
    size_t n = ks_engine_state_size(s->e, sl->id);
    uint8_t *buf = n ? malloc(n) : NULL;
    if (!buf) return;
    size_t got = ks_engine_state_get(s->e, sl->id, buf, n);
    if (got == 0) {
        free(buf);
        return;
    }
    int rc = ks_spc_insert(s->p.spc, r->p.sys_key, r->prompt.v, sl->snap_sys, buf, got); /* takes buf */
    if (rc == 0) {
        pthread_mutex_lock(&s->mu);
        s->st.spc_builds++;
        pthread_mutex_unlock(&s->mu);
        KS_DEBUG(MOD, "slot[%d] spc-capture %d tokens, %zu bytes", sl->id, sl->snap_sys, got);
    } else {
        KS_DEBUG(MOD, "slot[%d] spc-capture refused: %s", sl->id, ks_strerror(rc));
    }
}

static void count_mode(ks_sched *s, slot *sl, sreq *r, bool spc_hit, int n_reuse, bool took_over) {
    ks_route *rt = &sl->route;
    if (took_over) s->st.evictions++;
    if (spc_hit) return;
    switch (rt->mode) {
    case KS_ROUTE_IMC_HASH: s->st.imc_hash_hits++; break;
    case KS_ROUTE_IMC_TOKEN_PREFIX:
        s->st.imc_token_prefix_hits++;
        s->st.imc_salvaged_tokens += (uint64_t)n_reuse;
        KS_DEBUG("imc", "imc-partial-rebuilt slot[%d]: salvaged_prefix=%d of %d (%.0f%%)", sl->id, n_reuse,
                 r->prompt.n, 100.0 * n_reuse / r->prompt.n);
        break;
    case KS_ROUTE_PREFIX: s->st.mode_prefix++; break;
    default:
        s->st.mode_miss++;
        if (s->p.imc) s->st.rebuilds++;
        break;
    }
}

/* Inference thread: trim the slot's sequence to the reused prefix. */
static void plan(ks_sched *s, slot *sl) {
    sreq *r = sl->r;
    ks_route *rt = &sl->route;
    int n_reuse = rt->n_reuse;
    if (n_reuse > sl->tokens.n) n_reuse = sl->tokens.n;
    bool cache = r->p.cache_prompt && s->p.cache_prompt;
    /* evict (sync): the KV about to be dropped goes to the store first,
     * unless it is there already (store_save asks the store). */
    if (s->p.store && cache && n_reuse < sl->tokens.n) store_save(s, sl, KS_REASON_EVICT, true);
    /* The KV this request leaves is its own: a cache_prompt:false request's
     * is never stored, not later as evict or shutdown either. */
    sl->no_store = !cache;
    /* A miss on a slot that held another branch: that branch is gone. */
    bool took_over = rt->mode == KS_ROUTE_MISS && sl->tokens.n > 0 && r->p.cache_prompt && s->p.cache_prompt;
    if (n_reuse == 0) {
        if (sl->tokens.n > 0 || ks_engine_seq_pos_max(s->e, sl->id) >= 0) ks_engine_seq_clear(s->e, sl->id);
        ks_tokens_truncate(&sl->tokens, 0);
    } else if (n_reuse < sl->tokens.n) {
        if (rt->mode == KS_ROUTE_IMC_TOKEN_PREFIX)
            KS_DEBUG("imc", "imc-trim-prefix slot[%d]: cached_tokens=%d trim_pos=%d", sl->id, sl->tokens.n, n_reuse);
        if (s->p.simulate_no_partial_rm || !ks_engine_seq_rm(s->e, sl->id, n_reuse, -1)) {
            /* Recurrent/hybrid memory cannot drop a suffix: rebuild. */
            KS_DEBUG(MOD, "slot[%d] partial removal unsupported, rebuilding", sl->id);
            ks_engine_seq_clear(s->e, sl->id);
            n_reuse = 0;
            rt->mode = KS_ROUTE_MISS;
            snprintf(rt->reason, sizeof rt->reason, "partial-rm-unsupported");
            pthread_mutex_lock(&s->mu);
            s->st.partial_rm_rebuilds++;
            pthread_mutex_unlock(&s->mu);
        }
        ks_tokens_truncate(&sl->tokens, n_reuse);
    }
    sl->snap_sys = -1;
    sl->snap_store = -1;
    int n_sys = r->p.n_sys_tokens;
    bool spc_hit = false;
    /* The counters are read by other threads under mu; restoring a state
     * takes about a millisecond, so holding mu across it is fine. */
    bool spc_ok = cache && s->p.spc && r->p.sys_key && n_sys >= s->p.cache_min_tokens && n_sys < r->prompt.n &&
                  n_reuse < n_sys;
    bool store_ok = cache && s->p.store;
    /* The store first when SPC could act: a stored state longer than the
     * system prompt (a conversation's earlier turn) makes SPC's restore
     * wasted work; only then SPC, then a shorter stored prefix. */
    bool store_hit = store_ok && spc_ok && store_restore(s, sl, r, &n_reuse, n_sys, r->prompt.n);
    if (!store_hit && spc_ok) {
        pthread_mutex_lock(&s->mu);
        spc_hit = spc_restore(s, sl, r, &n_reuse);
        if (!spc_hit) sl->snap_sys = n_sys;
        pthread_mutex_unlock(&s->mu);
    }
    /* (when SPC could act, lengths above n_sys were asked for already) */
    if (!store_hit && !spc_hit && store_ok)
        store_hit = store_restore(s, sl, r, &n_reuse, n_reuse, spc_ok ? n_sys : r->prompt.n);
    pthread_mutex_lock(&s->mu);
    if (r->p.sys_key && n_sys > 0 && n_reuse < n_sys) s->st.sys_prompt_prefills++;
    count_mode(s, sl, r, spc_hit || store_hit, n_reuse, took_over);
    pthread_mutex_unlock(&s->mu);
    sl->n_past = n_reuse;
    sl->n_generated = 0;
    sl->i_logits = -1;
    r->res.id = r->id;
    r->res.n_prompt = r->prompt.n;
    r->res.n_cached = n_reuse;
    r->res.n_vocab = ks_engine_n_vocab(s->e);
    snprintf(r->res.cache_mode, sizeof r->res.cache_mode, "%s",
             store_hit ? "store" : spc_hit ? "spc" : ks_route_mode_name(rt->mode));
    snprintf(r->res.cache_reason, sizeof r->res.cache_reason, "%s", rt->reason);
    sl->smpl = ks_sampler_create(s->e, &r->p.sample);
    /* IMC identity: the branch this slot will hold after the request. */
    if (r->hashes && r->p.n_msgs > 0) {
        sl->msg_hash = r->hashes[r->p.n_msgs];
        sl->n_msgs_cached = r->p.n_msgs;
    } else {
        sl->msg_hash = 0;
        sl->n_msgs_cached = 0;
    }
    sl->planned = true;
    KS_DEBUG(MOD, "slot[%d] req %llu: prompt %d, reuse %d (mode %s%s%s)", sl->id, (unsigned long long)r->id,
             r->prompt.n, n_reuse, r->res.cache_mode, rt->reason[0] ? ", " : "", rt->reason);
}

/* ------------------------------------------------------------------ step */
static void fail_slot(ks_sched *s, slot *sl, int err) {
    ks_engine_seq_clear(s->e, sl->id);
    ks_tokens_truncate(&sl->tokens, 0);
    sl->msg_hash = 0;
    sl->n_msgs_cached = 0;
    finish(s, sl, KS_FINISH_ERROR, err, false);
}

static void sample_slot(ks_sched *s, slot *sl) {
    sreq *r = sl->r;
    int32_t tok = ks_sampler_sample(sl->smpl, s->e, sl->i_logits);
    if (sl->state == ST_PREFILL) {
        r->t_first = ks_now_ms();
        if (r->p.want_logits) {
            const float *lg = ks_engine_logits(s->e, sl->i_logits);
            if (lg && s->logits_copy) {
                memcpy(s->logits_copy, lg, sizeof(float) * (size_t)ks_engine_n_vocab(s->e));
                r->res.logits = s->logits_copy;
            }
        }
        sl->state = ST_GEN;
    }
    if (ks_engine_is_eog(s->e, tok)) {
        finish(s, sl, KS_FINISH_STOP, 0, true);
        return;
    }
    sl->n_generated++;
    char piece[256];
    int n = ks_engine_piece(s->e, tok, piece, sizeof piece);
    if (n > (int)sizeof piece) n = 0; /* no token renders longer than this in practice */
    int stop = r->p.on_token ? r->p.on_token(r->p.ud, tok, piece, n) : 0;
    if (stop) {
        finish(s, sl, KS_FINISH_STOP, 0, false);
    } else if (atomic_load(&r->cancel)) {
        finish(s, sl, KS_FINISH_CANCEL, 0, false);
    } else if (sl->n_generated >= r->p.max_tokens) {
        finish(s, sl, KS_FINISH_LENGTH, 0, false);
    } else {
        sl->next_tok = tok;
    }
}

/* Adds tokens [from, from + n) of the slot's prompt (or, for a generating
 * slot, its sampled token) to the batch so that the sequence contributes at
 * least two rows: a lone token gets a throwaway companion at the next
 * position, removed right after the decode (see NOTE ON EXACTNESS). */
static void add_rows(ks_sched *s, ks_batch *b, slot *sl, const int32_t *toks, int pos0, int n, bool logits_last) {
    for (int j = 0; j < n; j++) {
        int idx = ks_batch_add(b, toks[j], pos0 + j, sl->id, logits_last && j == n - 1);
        if (logits_last && j == n - 1) sl->i_logits = idx;
    }
    sl->pad_pos = -1;
    if (n == 1 && s->pairs) {
        ks_batch_add(b, toks[0], pos0 + 1, sl->id, false);
        sl->pad_pos = pos0 + 1;
    }
}

/* Decode steps left to prefill tokens [pos, n) at budget tokens a chunk, with
 * a chunk ending at sys (the pending SPC stop) when pos < sys < n. */
static int prefill_steps(int pos, int n, int sys, int budget) {
    int steps = 0;
    if (sys > pos && sys < n) {
        steps = (sys - pos + budget - 1) / budget;
        pos = sys;
    }
    return steps + (n - pos + budget - 1) / budget;
}

/* Where a prefill chunk [pos, end) that is not the last of the prompt (n
 * tokens) can end for a cold save: its last stride boundary b, when b is
 * after pos, at least store_min_tokens, and the tokens moved from this chunk
 * to the next ones cost no decode step at this budget. -1: nowhere. */
static int cold_point(const ks_sched *s, int pos, int end, int n, int sys, int budget) {
    int b = ks_prefix_align_down(end, s->p.store_stride);
    if (b <= pos || b < s->p.store_min_tokens) return -1;
    if (prefill_steps(b, n, sys, budget) != prefill_steps(end, n, sys, budget)) return -1;
    return b;
}

/* Whether this slot's prefill takes cold saves at all: a store with a stride,
 * and a request that caches (no_store mirrors cache_prompt, set in plan). */
static bool cold_saves(const ks_sched *s, const slot *sl) {
    return s->p.store && s->p.store_stride > 0 && !sl->no_store;
}

/* Where the LAST chunk of a COLD prefill (less than a stride reused, e.g. the
 * template's first tokens left in a taken-over slot) ends for its cold save:
 * the prompt's last stride boundary, if it is at least store_min_tokens;
 * -1 for a warm prefill (a history was reused) or none. */
static int cold_last_point(const ks_sched *s, const sreq *r) {
    if (r->res.n_cached >= s->p.store_stride) return -1;
    int b = ks_prefix_align_down(r->prompt.n - 1, s->p.store_stride);
    return b >= s->p.store_min_tokens ? b : -1;
}

/* Sizes the cold save of the chunk [n_past, n_past + take) of a prefilling
 * slot, which is NOT the request's last chunk (the caller never cuts that
 * one). The chunk ends at its cold_point() when no later chunk of this prefill
 * has one, looking ahead at the current budget: so a prefill saves once, at
 * its last stride-aligned chunk end. When the budget changes later (slots
 * start or stop generating) a prefill may save twice or not at all; the finish
 * save follows either way. Returns the chunk size and sets sl->snap_store to
 * the save point (-1: none). */
static int cold_cut(ks_sched *s, slot *sl, int take, int budget) {
    sreq *r = sl->r;
    sl->snap_store = -1;
    if (!cold_saves(s, sl)) return take;
    int n = r->prompt.n, sys = sl->snap_sys;
    int b = cold_point(s, sl->n_past, sl->n_past + take, n, sys, budget);
    if (b < 0) return take;
    for (int pos = sl->n_past + take;;) {
        int end = pos + budget;
        if (sys > pos && end > sys) end = sys;
        if (end >= n) { /* the last chunk: cut only in a cold prefill (cold_cut_last) */
            if (cold_last_point(s, r) > pos) return take;
            break;
        }
        if (cold_point(s, pos, end, n, sys, budget) >= 0) return take; /* a later chunk saves */
        pos = end;
    }
    sl->snap_store = b;
    return b - sl->n_past;
}

/* The last chunk [n_past, n) of a COLD prefill ends at cold_last_point(),
 * for one `cold` save of the prompt: the "cold after a cold prefill".
 * It costs one decode step, which is small beside a whole prompt's prefill; a
 * warm turn (a few new tokens after a reused history) never pays it. Returns
 * the chunk size and sets sl->snap_store (-1: none). */
static int cold_cut_last(ks_sched *s, slot *sl, int take) {
    sl->snap_store = -1;
    if (!cold_saves(s, sl)) return take;
    int b = cold_last_point(s, sl->r);
    if (b <= sl->n_past || b >= sl->n_past + take) return take;
    sl->snap_store = b;
    return b - sl->n_past;
}

/*
 * NOTE ON EXACTNESS. ggml's CPU matrix multiply takes a different kernel for
 * a single row (ggml's vec_dot) than for two or more (llamafile's tinyBLAS),
 * and the two round differently. A token decoded alone — every generated
 * token, and the last token of a nearly fully cached prompt — would get K/V
 * and logits that differ in the last bits from the same token inside a
 * prefill, so a cached conversation would drift from an uncached one. With
 * tinyBLAS, each output element is summed in the same order whatever the
 * number of rows, so kvstash keeps every sequence at two or more rows in
 * every micro-batch: a lone token is decoded together with a throwaway copy
 * at the next position (causal attention: the real token never sees it),
 * whose KV cell is removed right after. Measured in docs/LLAMA_FACTS.md:
 * generated-token KV is then byte-identical to prefilled KV, and results do
 * not depend on what other slots are doing.
 *
 * llama.cpp splits a multi-sequence batch into micro-batches with an equal
 * number of rows per sequence; so that no sequence is left with a single
 * row in the last micro-batch, a decode call holds the generating slots
 * (two rows each) and at most one prefill chunk, never of exactly 3 rows.
 */
static void step(ks_sched *s) {
    ks_batch *b = s->batch;
    ks_batch_clear(b);
    int n_gen = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        sl->in_batch = false;
        sl->i_logits = -1;
        sl->chunk = 0;
        sl->pad_pos = -1;
        if (sl->state == ST_IDLE) continue;
        if (atomic_load(&sl->r->cancel)) {
            finish(s, sl, KS_FINISH_CANCEL, 0, false);
            continue;
        }
        if (sl->state != ST_GEN) continue;
        add_rows(s, b, sl, &sl->next_tok, sl->tokens.n, 1, true);
        sl->in_batch = true;
        n_gen++;
    }
    /* One prefill chunk, round-robin among prefilling slots. While others
     * generate, keep it small so their streams keep flowing (sched.h, 3). */
    int budget = s->n_batch - ks_batch_n(b);
    if (n_gen > 0) {
        int cap = s->n_batch / 4 > 64 ? s->n_batch / 4 : 64;
        if (budget > cap) budget = cap;
    }
    for (int k = 0; k < s->n_slots && budget >= 2; k++) {
        slot *sl = &s->slots[(s->prefill_rr + k) % s->n_slots];
        if (sl->state != ST_PREFILL) continue;
        sreq *r = sl->r;
        int remaining = r->prompt.n - sl->n_past;
        int take = remaining < budget ? remaining : budget;
        if (sl->snap_sys > sl->n_past && take > sl->snap_sys - sl->n_past) take = sl->snap_sys - sl->n_past;
        if (take < remaining) take = cold_cut(s, sl, take, budget); /* both set sl->snap_store */
        else take = cold_cut_last(s, sl, take); /* only in a cold prefill */
        if (n_gen > 0 && take == 3) take = 2; /* see the note: never 3 beside 2-row sequences */
        if (sl->snap_store != sl->n_past + take) sl->snap_store = -1;
        add_rows(s, b, sl, r->prompt.v + sl->n_past, sl->n_past, take, sl->n_past + take == r->prompt.n);
        sl->chunk = take;
        sl->in_batch = true;
        s->prefill_rr = (sl->id + 1) % s->n_slots;
        break;
    }
    if (ks_batch_n(b) == 0) return;

    int rc = ks_engine_decode(s->e, b);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->in_batch && sl->pad_pos >= 0) ks_engine_seq_rm(s->e, sl->id, sl->pad_pos, -1);
    }
    if (rc != 0) {
        KS_ERROR(MOD, "decode of %d tokens failed: %s", ks_batch_n(b), ks_strerror(rc));
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].in_batch && s->slots[i].state != ST_IDLE) fail_slot(s, &s->slots[i], rc);
        return;
    }
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->in_batch || sl->state == ST_IDLE) continue;
        if (sl->state == ST_GEN) {
            ks_tokens_push(&sl->tokens, sl->next_tok);
            if (s->p.store && s->p.continued_interval > 0 && sl->n_generated % s->p.continued_interval == 0 &&
                sl->r->p.cache_prompt && s->p.cache_prompt)
                store_save(s, sl, KS_REASON_CONTINUED, false);
        } else {
            ks_tokens_append(&sl->tokens, sl->r->prompt.v + sl->n_past, sl->chunk);
            sl->n_past += sl->chunk;
            if (sl->n_past == sl->snap_sys) {
                spc_capture(s, sl);
                sl->snap_sys = -1;
            }
            if (sl->n_past == sl->snap_store) store_save(s, sl, KS_REASON_COLD, false);
            sl->snap_store = -1;
            if (sl->r->p.on_progress) sl->r->p.on_progress(sl->r->p.ud, sl->n_past, sl->r->prompt.n);
        }
        if (sl->i_logits >= 0) sample_slot(s, sl);
    }
}

static void publish_locked(ks_sched *s) {
    int busy = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        ks_slot_info *in = &sl->info;
        in->id = i;
        in->busy = sl->state != ST_IDLE;
        busy += in->busy;
        in->n_tokens = sl->tokens.n;
        in->last_used_us = sl->last_used_us;
        if (sl->r) {
            in->req_id = sl->r->id;
            in->n_prompt = sl->r->prompt.n;
            in->n_cached = sl->r->res.n_cached;
            in->n_generated = sl->n_generated;
        } else {
            in->req_id = 0; /* n_prompt/n_cached/n_generated: of the last request */
        }
    }
    s->st.slots_busy = busy;
    s->st.queue_depth = s->q_n;
}

static void *run(void *arg) {
    ks_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        for (int i = 0; i < s->n_slots; i++) {
            if (s->clear_pending[i] && s->slots[i].state == ST_IDLE) {
                ks_engine_seq_clear(s->e, i);
                ks_tokens_truncate(&s->slots[i].tokens, 0);
                s->slots[i].msg_hash = 0;
                s->slots[i].n_msgs_cached = 0;
                s->clear_pending[i] = 0;
                pthread_cond_broadcast(&s->cv_done);
            }
        }
        sreq *dead = NULL;
        assign_locked(s, &dead);
        publish_locked(s);
        if (dead) {
            pthread_mutex_unlock(&s->mu);
            while (dead) {
                sreq *n = dead->next;
                finish_unassigned(s, dead, KS_FINISH_CANCEL);
                dead = n;
            }
            pthread_mutex_lock(&s->mu);
            continue;
        }
        if (s->n_active == 0) {
            if (s->stop) break;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        bool stopping = s->stop;
        pthread_mutex_unlock(&s->mu);

        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->state == ST_IDLE) continue;
            if (stopping) atomic_store(&sl->r->cancel, 1);
            if (!sl->planned) plan(s, sl);
        }
        step(s);
        pthread_mutex_lock(&s->mu);
    }
    publish_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (s->p.store && s->p.save_on_shutdown) {
        for (int i = 0; i < s->n_slots; i++) store_save(s, &s->slots[i], KS_REASON_SHUTDOWN, true);
    }
    return NULL;
}

/* ------------------------------------------------------------ public API */
int ks_sched_create(const ks_sched_params *p, ks_sched **out) {
    *out = NULL;
    if (!p || !p->engine || p->cache_min_tokens < 0) return KS_EINVAL;
    ks_sched *s = calloc(1, sizeof *s);
    if (!s) return KS_ENOMEM;
    s->p = *p;
    s->e = p->engine;
    s->n_slots = p->n_slots > 0 ? p->n_slots : ks_engine_n_seq(s->e);
    if (s->n_slots > ks_engine_n_seq(s->e)) {
        free(s);
        return KS_EINVAL;
    }
    if (s->p.max_queue <= 0) s->p.max_queue = 64;
    s->n_ctx_seq = ks_engine_n_ctx_seq(s->e);
    s->n_batch = ks_engine_n_batch(s->e);
    s->next_id = 1;
    s->pairs = p->exact && ks_engine_partial_rm_ok(s->e);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->clear_pending = calloc((size_t)s->n_slots, sizeof *s->clear_pending);
    s->batch = ks_batch_create(s->n_batch);
    s->logits_copy = malloc(sizeof(float) * (size_t)ks_engine_n_vocab(s->e));
    if (!s->slots || !s->clear_pending || !s->batch || !s->logits_copy) goto nomem;
    for (int i = 0; i < s->n_slots; i++) {
        s->slots[i].id = i;
        s->slots[i].snap_sys = s->slots[i].snap_store = -1;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    s->st.n_slots = s->n_slots;
    if (pthread_create(&s->th, NULL, run, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        pthread_cond_destroy(&s->cv_done);
        goto nomem;
    }
    s->th_started = true;
    *out = s;
    return 0;
nomem:
    ks_batch_free(s->batch);
    free(s->logits_copy);
    free(s->slots);
    free(s->clear_pending);
    free(s);
    return KS_ENOMEM;
}

void ks_sched_free(ks_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->th_started) pthread_join(s->th, NULL);
    for (int i = 0; i < s->n_slots; i++) {
        ks_tokens_free(&s->slots[i].tokens);
        ks_sampler_free(s->slots[i].smpl);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->cv_done);
    ks_batch_free(s->batch);
    free(s->logits_copy);
    free(s->slots);
    free(s->clear_pending);
    free(s);
}

int ks_sched_submit(ks_sched *s, const ks_req_params *p, uint64_t *id) {
    if (!p || !p->tokens || p->n_tokens <= 0 || p->max_tokens < 1) return KS_EINVAL;
    if (p->preferred_slot >= s->n_slots) return KS_EINVAL;
    if ((int64_t)p->n_tokens + p->max_tokens > s->n_ctx_seq) return KS_ECTX;
    sreq *r = calloc(1, sizeof *r);
    if (!r) return KS_ENOMEM;
    r->p = *p;
    r->p.tokens = NULL;
    r->p.msg_prefix_hash = NULL;
    if (ks_tokens_assign(&r->prompt, p->tokens, p->n_tokens) != 0) goto nomem;
    if (p->msg_prefix_hash && p->n_msgs > 0) {
        r->hashes = malloc(sizeof(uint64_t) * (size_t)(p->n_msgs + 1));
        if (!r->hashes) goto nomem;
        memcpy(r->hashes, p->msg_prefix_hash, sizeof(uint64_t) * (size_t)(p->n_msgs + 1));
    }
    r->t_submit = ks_now_ms();
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        sreq_free(r);
        return KS_ESHUTDOWN;
    }
    int idle = 0;
    for (int i = 0; i < s->n_slots; i++) idle += s->slots[i].state == ST_IDLE;
    if (s->q_n >= s->p.max_queue && idle <= s->q_n) {
        s->st.requests_rejected++;
        pthread_mutex_unlock(&s->mu);
        sreq_free(r);
        return KS_EFULL;
    }
    r->id = s->next_id++;
    if (s->q_tail) s->q_tail->next = r; else s->q_head = r;
    s->q_tail = r;
    s->q_n++;
    s->st.queue_depth = s->q_n;
    if (id) *id = r->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
nomem:
    sreq_free(r);
    return KS_ENOMEM;
}

void ks_sched_cancel(ks_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    for (sreq *r = s->q_head; r; r = r->next)
        if (r->id == id) atomic_store(&r->cancel, 1);
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].r && s->slots[i].r->id == id) atomic_store(&s->slots[i].r->cancel, 1);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void ks_sched_drain(ks_sched *s) {
    pthread_mutex_lock(&s->mu);
    while (s->q_n > 0 || s->n_active > 0) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void ks_sched_clear_slot(ks_sched *s, int slot_id) {
    if (slot_id < 0 || slot_id >= s->n_slots) return;
    pthread_mutex_lock(&s->mu);
    s->clear_pending[slot_id] = 1;
    pthread_cond_signal(&s->cv);
    while (s->clear_pending[slot_id] && !s->stop) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

int ks_sched_slots(ks_sched *s, ks_slot_info *out, int n) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_slots && i < n; i++) out[i] = s->slots[i].info;
    int total = s->n_slots;
    pthread_mutex_unlock(&s->mu);
    return total;
}

void ks_sched_stats_get(ks_sched *s, ks_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queue_depth = s->q_n;
    pthread_mutex_unlock(&s->mu);
}

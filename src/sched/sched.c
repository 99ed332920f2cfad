/*
 * sched.c — the inference thread: queue, slots, continuous batching.
 *
 * NOTES ON THE DESIGN OF THE SCHEDULER
 *
 * One thread (run()) owns the engine's context, every slot's sequence and
 * token list, and the samplers. HTTP threads only touch the queue, the cancel
 * flags and the published slot info and counters, all under `mu`. The cache
 * policy (routing, reuse, restores, saves) is in policy.c, the decode step
 * (batch assembly, the exactness rule, sampling) in step.c (sched_int.h).
 *
 * A loop iteration ("step"):
 *   1. under mu: drop canceled queued requests, assign queued requests to idle
 *      slots (FIFO; routing picks the slot), mark those slots busy;
 *   2. without mu: plan each new assignment (policy.c), then one decode step
 *      (step.c): one token per generating slot and one prefill chunk, decode,
 *      sample, callbacks, finished requests;
 *   3. under mu: publish slot info and counters, wake drainers.
 *
 * Queue order. Requests are assigned in submission order: when the first
 * unpinned request finds no idle slot, the ones behind it wait too. Two kinds
 * wait without holding up the others: a pinned request (preferred_slot)
 * whose slot is busy, and a follower (share_prefill_of) whose leader is
 * queued or still prefilling — routed now, it would prefill beside the
 * leader the very tokens the leader is computing, whereas once the leader
 * has sampled its first token, planning copies them from the leader's slot
 * (policy.c). Both keep their place: when they can go, they go before the
 * requests submitted after them. A follower waits only for an earlier
 * request (submit drops a later id), so waits never form a cycle, and only
 * while its leader is alive and prefilling, which ends in bounded time.
 *
 * Invariants (see sched.h for the public ones)
 *  S1. slot->tokens grows only after a successful decode of those tokens, so
 *      it never claims KV that is not there; when the KV and the list cannot
 *      agree (a decode error, a list that cannot grow) the slot's sequence is
 *      cleared and its token list emptied (ks__sched_fail).
 *  S2. A slot's sequence id equals its index.
 *  S3. Callbacks are called without holding mu.
 */
#include "sched/sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/msghash.h"
#include "cache/prefix.h"
#include "cache/route.h"
#include "cache/spc.h"
#include "sched/sched_int.h"

#define MOD "sched"

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
    p.copy_min_tokens = 16;
    p.store_stride = 256;
    p.continued_interval = 512;
    p.store_min_tokens = 256;
    p.save_on_shutdown = true;
    p.ckpt_max = 8;
    p.ckpt_bytes = (size_t)32 << 20;
    p.ckpt_gen_interval = 16;
    p.draft_max = 16;
    p.draft_adaptive = true;
    return p;
}

static void sreq_free(sreq *r) {
    if (!r) return;
    ks_tokens_free(&r->prompt);
    ks_media_set_unref(r->p.media);
    free(r->hashes);
    free(r->ext);
    free(r);
}

/* A deep copy of x in one allocation (owned: free()): the struct, the
 * pattern pointers, the bias and token arrays, then the strings. Counts and
 * arrays were checked by ks_sampler_ext_check. */
static ks_sample_ext *ext_dup(const ks_sample_ext *x) {
    bool has_grammar = x->grammar && x->grammar[0];
    size_t n_str = has_grammar ? strlen(x->grammar) + 1 : 0;
    for (int k = 0; k < x->n_trigger_patterns; k++) n_str += strlen(x->trigger_patterns[k]) + 1;
    size_t n_toks = (size_t)x->n_trigger_tokens + (size_t)x->n_grammar_prefill;
    size_t size = sizeof *x + sizeof(char *) * (size_t)x->n_trigger_patterns +
                  sizeof(ks_logit_bias) * (size_t)x->n_logit_bias + sizeof(int32_t) * n_toks + n_str;
    ks_sample_ext *c = malloc(size);
    if (!c) return NULL;
    *c = *x;
    char *p = (char *)(c + 1);
    const char **pats = (const char **)p;
    p += sizeof(char *) * (size_t)x->n_trigger_patterns;
    ks_logit_bias *lb = (ks_logit_bias *)p;
    p += sizeof(ks_logit_bias) * (size_t)x->n_logit_bias;
    int32_t *tt = (int32_t *)p;
    p += sizeof(int32_t) * (size_t)x->n_trigger_tokens;
    int32_t *pre = (int32_t *)p;
    p += sizeof(int32_t) * (size_t)x->n_grammar_prefill;
    if (x->n_logit_bias) memcpy(lb, x->logit_bias, sizeof *lb * (size_t)x->n_logit_bias);
    if (x->n_trigger_tokens) memcpy(tt, x->trigger_tokens, sizeof *tt * (size_t)x->n_trigger_tokens);
    if (x->n_grammar_prefill) memcpy(pre, x->grammar_prefill, sizeof *pre * (size_t)x->n_grammar_prefill);
    c->logit_bias = x->n_logit_bias ? lb : NULL;
    c->trigger_tokens = x->n_trigger_tokens ? tt : NULL;
    c->grammar_prefill = x->n_grammar_prefill ? pre : NULL;
    c->grammar = NULL;
    if (has_grammar) {
        size_t n = strlen(x->grammar) + 1;
        memcpy(p, x->grammar, n);
        c->grammar = p;
        p += n;
    }
    for (int k = 0; k < x->n_trigger_patterns; k++) {
        size_t n = strlen(x->trigger_patterns[k]) + 1;
        memcpy(p, x->trigger_patterns[k], n);
        pats[k] = p;
        p += n;
    }
    c->trigger_patterns = x->n_trigger_patterns ? pats : NULL;
    return c;
}

/* ----------------------------------------------------------- invariants */
/* Between steps, when plans run (KS_ASSERT): every slot's sequence is
 * exactly its token list (sched.h invariant 1, S1: its last position is
 * tokens.n - 1, and S1 fills the positions below), its sequence id is its
 * index (S2), and its checkpoints stand for prefixes of it (ckpt.c C1). */
__attribute__((unused)) static bool slots_consistent(ks_sched *s) {
    for (int i = 0; i < s->n_slots; i++) {
        const slot *sl = &s->slots[i];
        if (sl->id != i || !ks__ckpt_valid(sl)) return false;
        int last = sl->tokens.n > 0 ? ks__kv_pos(sl, sl->tokens.n - 1) : -1;
        if (ks_engine_seq_pos_max(s->e, sl->id) != last) {
            KS_ERROR(MOD, "slot[%d] (state %d, planned %d, n_past %d): sequence ends at %d, token list holds %d", i,
                     (int)sl->state, (int)sl->planned, sl->n_past, ks_engine_seq_pos_max(s->e, sl->id), sl->tokens.n);
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------ finishing */
/* Ends slot's request: on_done, then the slot becomes idle. Inference thread. */
static void publish_locked(ks_sched *s);

void ks__sched_finish(ks_sched *s, slot *sl, ks_finish f, int err, bool eog) {
    sreq *r = sl->r;
    /* Invariant S1 and the bookkeeping rule of prefix.h. */
    KS_ASSERT((f != KS_FINISH_STOP && f != KS_FINISH_LENGTH) ||
              sl->tokens.n == ks_prefix_kv_after(r->prompt.n, sl->n_generated, eog));
    /* The finish save: deferred where finish_save_delay_ms says so (policy.c
     * "Deferred finish saves": left pending on the idle slot, not yet asked;
     * run() takes it when due unless the next request supersedes it); else
     * asked for now (counted with the slot below) and, with
     * finish_save_after_done, taken after on_done: copying a state (0.8 GB
     * for an 8B model at 7K tokens: 0.7 s from a GPU) must not hold back the
     * reply's end. Nothing between on_done and the copy changes the slot's
     * KV: only this thread assigns it. */
    bool ends = f == KS_FINISH_STOP || f == KS_FINISH_LENGTH;
    bool deferred = (ends || (f == KS_FINISH_CANCEL && r->superseded)) && s->p.finish_save_after_done &&
                    s->p.finish_save_delay_ms > 0 && ks__policy_defer_finish(s, sl);
    bool save = ends && !deferred && ks__policy_save_ask(s, sl, KS_REASON_FINISH) == 1;
    if (save && !s->p.finish_save_after_done) {
        ks__policy_save_take(s, sl, KS_REASON_FINISH, false);
        save = false;
    }
    ks__policy_pins_done(s, r);
    if (r->p.media)
        for (int i = 0; i < r->res.n_cached && i < r->prompt.n; i++)
            s->cst.media_tokens_reused += ks_token_is_media(r->prompt.v[i]);
    double now = ks_now_ms();
    r->res.slot = sl->id;
    r->res.n_generated = sl->n_generated;
    r->res.finish = f;
    r->res.eog = eog;
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
    s->st.draft_tokens_total += (uint64_t)r->res.n_drafted;
    s->st.draft_accepted_total += (uint64_t)r->res.n_draft_accepted;
    s->st.draft_steps_total += (uint64_t)r->draft_steps;
    s->st.prompt_seconds_total += r->res.prompt_ms / 1e3;
    s->st.predicted_seconds_total += r->res.gen_ms / 1e3;
    sl->state = ST_IDLE;
    sl->planned = false;
    sl->r = NULL;
    sl->last_used_us = ks_now_us();
    sl->info.n_generated = sl->n_generated;
    sl->info.n_drafted = r->res.n_drafted;
    sl->info.n_draft_accepted = r->res.n_draft_accepted;
    s->n_active--;
    publish_locked(s);
    pthread_mutex_unlock(&s->mu);

    KS_ASSERT(!r->done); /* sched.h invariant 2: exactly one on_done */
    r->done = true;
    if (r->p.on_done) r->p.on_done(r->p.ud, &r->res); /* S3: no lock held */
    if (save) ks__policy_save_take(s, sl, KS_REASON_FINISH, false);
    pthread_mutex_lock(&s->mu);
    if (save) publish_locked(s);
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    sreq_free(r);
}

/* A request that never got a slot (canceled in the queue, or shutdown). */
static void finish_unassigned(ks_sched *s, sreq *r, ks_finish f) {
    r->res.finish = f;
    r->res.slot = -1;
    r->res.queue_ms = ks_now_ms() - r->t_submit;
    KS_ASSERT(!r->done); /* sched.h invariant 2: exactly one on_done */
    r->done = true;
    if (r->p.on_done) r->p.on_done(r->p.ud, &r->res);
    pthread_mutex_lock(&s->mu);
    s->st.requests_total++;
    if (f == KS_FINISH_CANCEL) s->st.requests_canceled++;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    sreq_free(r);
}

/* The route of r (under mu): the slot table goes to route.c as it is; a
 * slot assigned earlier in the same pass and not yet planned is "pending",
 * so two requests never get one slot. A pinned request (preferred_slot)
 * waits for its slot and reuses its common prefix. KS_EBUSY: no slot now. */
static int route(ks_sched *s, sreq *r, ks_route *out) {
    bool cache = r->p.cache_prompt && s->p.cache_prompt;
    /* A pin to a slot that holds another tenant's KV is not honoured: the
     * request is routed as any other (route.h invariant 5), so that id_slot
     * can neither evict another tenant's slot nor tell whose it is. */
    const slot *pin = r->p.preferred_slot >= 0 ? &s->slots[r->p.preferred_slot] : NULL;
    if (pin && pin->tokens.n > 0 && pin->tenant != r->p.tenant) pin = NULL;
    if (pin) {
        slot *sl = &s->slots[r->p.preferred_slot];
        if (sl->state != ST_IDLE) return KS_EBUSY;
        memset(out, 0, sizeof *out);
        out->slot = sl->id;
        out->n_common = cache && sl->tenant == r->p.tenant
                            ? ks_prefix_common(sl->tokens.v, sl->tokens.n, r->prompt.v, r->prompt.n)
                            : 0;
        out->n_reuse = ks_prefix_reuse(out->n_common, r->prompt.n);
        out->mode = out->n_reuse > 0 ? KS_ROUTE_PREFIX : KS_ROUTE_MISS;
        if (!cache) snprintf(out->reason, sizeof out->reason, "cache-disabled");
        else if (out->n_reuse == 0 && sl->tokens.n > 0) snprintf(out->reason, sizeof out->reason, "diverged-at-token-0");
        else if (out->n_reuse == 0) snprintf(out->reason, sizeof out->reason, "no-slot");
        else if (out->n_reuse < r->prompt.n - 1) snprintf(out->reason, sizeof out->reason, "diverged-at-token-%d", out->n_reuse);
        return 0;
    }
    ks_route_slot rs[KS_MAX_SLOTS];
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        bool assigned = sl->state != ST_IDLE;
        rs[i] = (ks_route_slot){.id = i, .busy = assigned && sl->planned, .pending = assigned && !sl->planned,
                                .tokens = sl->tokens.v, .n_tokens = sl->tokens.n,
                                .last_used_us = sl->last_used_us, .msg_hash = sl->msg_hash,
                                .n_msgs_cached = sl->n_msgs_cached, .tenant = sl->tenant};
    }
    ks_route_req rq = {.tokens = r->prompt.v, .n_tokens = r->prompt.n, .msg_prefix_hash = r->hashes,
                       .n_msgs = r->hashes ? r->p.n_msgs : 0, .cache_prompt = cache, .tenant = r->p.tenant};
    if (s->p.spc && r->p.sys_key && r->p.n_sys_tokens >= s->p.cache_min_tokens &&
        ks_spc_contains(s->p.spc, r->p.sys_key))
        rq.spc_tokens = r->p.n_sys_tokens;
    ks_route_cfg cfg = {.imc = s->p.imc, .cache_min_tokens = s->p.cache_min_tokens,
                        .affinity_min = s->p.affinity_min};
    return ks_route_select(rs, s->n_slots, &rq, &cfg, out);
}

/* Under mu: whether follower r waits for its leader (share_prefill_of): the
 * leader is queued or on a slot still prefilling, and not canceled. Only
 * caching requests wait, and only when slot copies are on: otherwise there
 * is nothing to share. The leader was submitted first, so it is ahead of r
 * in the queue. */
static bool waits_for_leader_locked(ks_sched *s, sreq *r) {
    uint64_t lead = r->p.share_prefill_of;
    if (lead == 0 || !r->p.cache_prompt || !s->p.cache_prompt || s->p.copy_min_tokens <= 0) return false;
    for (sreq *q = s->q_head; q && q != r; q = q->next)
        if (q->id == lead) return !atomic_load(&q->cancel);
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->r && sl->r->id == lead) return sl->state == ST_PREFILL && !atomic_load(&sl->r->cancel);
    }
    return false; /* finished, or never existed */
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
        if (waits_for_leader_locked(s, r)) { /* "Queue order" above */
            prev = r;
            pp = &r->next;
            continue;
        }
        ks_route rt;
        if (route(s, r, &rt) != 0) {
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
        KS_ASSERT(sl->state == ST_IDLE && sl->id == rt.slot); /* sched.h invariant 2; S2 */
        sl->r = r;
        sl->route = rt;
        sl->state = ST_PREFILL;
        sl->planned = false;
        s->n_active++;
        r->t_assign = ks_now_ms();
        r->res.queue_ms = r->t_assign - r->t_submit;
    }
}

void ks__sched_fail(ks_sched *s, slot *sl, int err) {
    ks__policy_pending_take_slot(s, sl); /* a plan that failed before it resolved the slot's deferred save */
    ks_engine_seq_clear(s->e, sl->id);
    ks_tokens_truncate(&sl->tokens, 0);
    ks__ckpt_drop(sl, 0);
    sl->msg_hash = 0;
    sl->n_msgs_cached = 0;
    ks__sched_finish(s, sl, KS_FINISH_ERROR, err, false);
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
        in->tenant = sl->r ? sl->r->p.tenant : sl->tenant;
        if (sl->r) {
            in->req_id = sl->r->id;
            in->shown_req_id = sl->r->id;
            in->n_prompt = sl->r->prompt.n;
            in->n_cached = sl->r->res.n_cached;
            in->n_cache_written = sl->r->res.n_cache_written;
            in->n_generated = sl->n_generated;
            in->n_drafted = sl->r->res.n_drafted;
            in->n_draft_accepted = sl->r->res.n_draft_accepted;
        } else {
            in->req_id = 0; /* n_prompt/n_cached/n_generated: of the last request */
        }
    }
    s->st.slots_busy = busy;
    s->st.queue_depth = s->q_n;
    ks_media_stats ms; /* written by this (the inference) thread */
    ks_media_stats_get(s->e, &ms);
    s->cst.media_encodes = ms.encodes;
    s->cst.media_encode_ms_total = ms.encode_ms_total;
    s->cst.media_tokens_decoded = ms.decoded_tokens;
    s->cst.deferred_saves = 0;
    for (int i = 0; i < s->n_slots; i++) s->cst.deferred_saves += s->slots[i].save_pending;
    s->st.cache = s->cst;
}

static void *run(void *arg) {
    ks_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* A slot about to be cleared: its pending finish save first (the
         * copy without mu; then look at everything again). */
        slot *cleared = NULL;
        for (int i = 0; i < s->n_slots && !cleared; i++)
            if (s->clear_pending[i] && s->slots[i].state == ST_IDLE && s->slots[i].save_pending) cleared = &s->slots[i];
        if (cleared) {
            pthread_mutex_unlock(&s->mu);
            ks__policy_pending_take_slot(s, cleared);
            pthread_mutex_lock(&s->mu);
            publish_locked(s);
            continue;
        }
        for (int i = 0; i < s->n_slots; i++) {
            if (s->clear_pending[i] && s->slots[i].state == ST_IDLE) {
                ks_engine_seq_clear(s->e, i);
                ks_tokens_truncate(&s->slots[i].tokens, 0);
                ks__ckpt_drop(&s->slots[i], 0);
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
        double due = ks__policy_pending_due(s);
        if (s->n_active == 0) {
            if (s->stop) break;
            if (s->copy_buf) { /* freed without mu; then look at the queue again */
                pthread_mutex_unlock(&s->mu);
                ks__policy_idle(s);
                pthread_mutex_lock(&s->mu);
                continue;
            }
            if (due >= 0) { /* a deferred finish save: taken when due unless work comes first */
                double now = ks_now_ms();
                if (now >= due) {
                    pthread_mutex_unlock(&s->mu);
                    ks__policy_pending_take(s, now, false);
                    pthread_mutex_lock(&s->mu);
                    publish_locked(s);
                } else {
                    struct timespec ts;
                    ks_deadline_ms(&ts, (int64_t)(due - now) + 1);
                    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
                }
                continue;
            }
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        bool stopping = s->stop;
        pthread_mutex_unlock(&s->mu);
        /* Other slots are busy: a deferred finish save due now is taken
         * between their steps, as an undeferred one would have been. */
        if (due >= 0 && ks__policy_pending_take(s, ks_now_ms(), false) > 0) {
            pthread_mutex_lock(&s->mu);
            publish_locked(s);
            pthread_mutex_unlock(&s->mu);
        }

        bool planned = false;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->state == ST_IDLE) continue;
            if (stopping) atomic_store(&sl->r->cancel, 1);
            if (sl->planned) continue;
            planned = true;
            int rc = ks__policy_plan(s, sl);
            if (rc == KS_EINVAL) {
                /* The request's own sampling (its grammar): the slot is untouched. */
                KS_DEBUG(MOD, "slot[%d] request %llu: sampler refused", sl->id, (unsigned long long)sl->r->id);
                ks__sched_finish(s, sl, KS_FINISH_ERROR, rc, false);
            } else if (rc) {
                KS_ERROR(MOD, "slot[%d] request %llu could not be planned: %s", sl->id,
                         (unsigned long long)sl->r->id, ks_strerror(rc));
                ks__sched_fail(s, sl, rc);
            }
        }
        if (planned) {
            /* A plan's cached and breakpoint counts are what a stream's
             * first event reports (its first token may come in this step):
             * publish them before stepping. */
            pthread_mutex_lock(&s->mu);
            publish_locked(s);
            pthread_mutex_unlock(&s->mu);
        }
        KS_ASSERT(slots_consistent(s));
        ks__step(s);
        pthread_mutex_lock(&s->mu);
    }
    publish_locked(s);
    pthread_mutex_unlock(&s->mu);
    /* Deferred finish saves are taken before the shutdown saves (which then
     * find those states held) — not at a process's exit where they would go
     * only to its RAM tier (an unload keeps the RAM store: taken then). */
    bool keep = s->stop_reason != KS_REASON_SHUTDOWN || ks_store_reason_outlives(s->p.store, KS_REASON_FINISH);
    if (keep ? ks__policy_pending_take(s, -1, true) > 0 : ks__policy_pending_drop(s) > 0) {
        pthread_mutex_lock(&s->mu);
        publish_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    if (s->p.store && s->p.save_on_shutdown) {
        for (int i = 0; i < s->n_slots; i++) ks__policy_save(s, &s->slots[i], s->stop_reason, true);
        pthread_mutex_lock(&s->mu);
        publish_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* Checks the request's cache pins (sched.h) and copies them into r: merged
 * where equal (the longest TTL). KS_EINVAL when they break a rule. */
static int pins_copy(sreq *r, const ks_req_params *p) {
    if (p->n_pins < 0 || p->n_pins > KS_MAX_CACHE_PINS || (p->n_pins > 0 && !p->pins)) return KS_EINVAL;
    for (int i = 0; i < p->n_pins; i++) {
        const ks_cache_pin *c = &p->pins[i];
        if (c->n_tokens <= 0 || c->n_tokens > p->n_tokens || c->ttl_s <= 0) return KS_EINVAL;
        if (i > 0 && c->n_tokens < p->pins[i - 1].n_tokens) return KS_EINVAL;
        if (r->n_pins > 0 && r->pins[r->n_pins - 1].n_tokens == c->n_tokens) {
            if (c->ttl_s > r->pins[r->n_pins - 1].ttl_s) r->pins[r->n_pins - 1].ttl_s = c->ttl_s;
            continue;
        }
        r->pins[r->n_pins++] = *c;
    }
    return 0;
}

/* ------------------------------------------------------------ public API */
/* Frees everything but the thread and the locks (NULL members are fine). */
static void free_all(ks_sched *s) {
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        ks_tokens_free(&s->slots[i].tokens);
        ks_sampler_free(s->slots[i].smpl);
        ks_media_set_unref(s->slots[i].media);
        ks__ckpt_drop(&s->slots[i], 0);
        if (s->slots[i].drafter) s->p.drafter->free(s->slots[i].drafter);
    }
    ks_batch_free(s->batch);
    free(s->copy_buf);
    free(s->logits_copy);
    free(s->piece);
    free(s->slots);
    free(s->clear_pending);
    for (int i = 0; i < s->n_warm; i++) ks_tokens_free(&s->warm_toks[i]);
    free(s->warm_toks);
    free(s->warm_tenants);
    free(s);
}

int ks_sched_warm_list(const ks_sched *s, const ks_tokens **toks, const uint64_t **tenants) {
    *toks = s->warm_toks;
    *tenants = s->warm_tenants;
    return s->n_warm;
}

int ks_sched_create(const ks_sched_params *p, ks_sched **out) {
    *out = NULL;
    if (!p || !p->engine || p->cache_min_tokens < 0 || p->copy_min_tokens < 0 || p->max_queue < 1 ||
        p->ckpt_max < 0 || p->ckpt_max > KS_SCHED_CKPT_MAX || p->ckpt_gen_interval < 0 ||
        (p->drafter && (p->draft_max < 1 || p->draft_max > KS_DRAFT_MAX || p->draft_min < 0 ||
                        !p->drafter->create || !p->drafter->free || !p->drafter->begin ||
                        !p->drafter->draft || !p->drafter->accept)))
        return KS_EINVAL;
    int n_slots = p->n_slots > 0 ? p->n_slots : ks_engine_n_seq(p->engine);
    if (n_slots > ks_engine_n_seq(p->engine) || n_slots > KS_MAX_SLOTS) return KS_EINVAL;
    ks_sched *s = calloc(1, sizeof *s);
    if (!s) return KS_ENOMEM;
    s->p = *p;
    s->stop_reason = KS_REASON_SHUTDOWN;
    s->e = p->engine;
    s->n_slots = n_slots;
    s->n_ctx_seq = ks_engine_n_ctx_seq(s->e);
    s->n_batch = ks_engine_n_batch(s->e);
    s->next_id = 1;
    /* Pairs only where they are needed and help: a batch-invariant build (the
     * engine's probe) already gives a lone row the bits of a batch (step.c),
     * where the probe found pairs inexact too they would only cost, and on a
     * GPU they keep nothing exact (engine.h note 3). */
    s->pairs = ks_engine_exact_how(s->e, p->exact) == KS_EXACT_PAIRS;
    /* Speculation where rows can be dropped and a lone row is exact
     * (step.c, "Speculation"). */
    if (!p->drafter) s->spec_why = "no drafter";
    else if (!ks_engine_partial_rm_ok(s->e) || ks_engine_is_hybrid(s->e) || ks_engine_is_recurrent(s->e) ||
             p->simulate_no_partial_rm)
        s->spec_why = "the model's memory cannot drop drafted tokens (recurrent or hybrid)";
    else if (s->pairs)
        s->spec_why = "exactness takes pairs of rows on this CPU backend (not batch-invariant)";
    else {
        s->spec_on = true;
        s->spec_exact = ks_engine_exact_how(s->e, p->exact) == KS_EXACT_INVARIANT;
        if (!s->spec_exact && !p->exact) s->spec_why = "exact mode is off";
        else if (!s->spec_exact && !(s->spec_why = ks_engine_exact_reason(s->e, p->exact)))
            s->spec_why = "the engine is not batch-invariant";
    }
    /* Checkpoints where a trim needs them (policy.c "Checkpoints"). */
    s->ckpt_on = (ks_engine_is_hybrid(s->e) || ks_engine_is_recurrent(s->e)) && p->ckpt_max > 0 && p->ckpt_bytes > 0;
    /* Lookups on the inference thread leave Redis to the prefetch at submit. */
    if (p->store) ks_store_set_remote_prefetch(p->store, true);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->clear_pending = calloc((size_t)s->n_slots, sizeof *s->clear_pending);
    s->batch = ks_batch_create(s->n_batch);
    s->logits_copy = malloc(sizeof(float) * (size_t)ks_engine_n_vocab(s->e));
    s->piece_cap = 256;
    s->piece = malloc(s->piece_cap);
    if (!s->slots || !s->clear_pending || !s->batch || !s->logits_copy || !s->piece) goto nomem;
    for (int i = 0; i < s->n_slots; i++) {
        s->slots[i].id = i;
        s->slots[i].snap_sys = s->slots[i].snap_store = s->slots[i].snap_ckpt = -1;
        /* The engine may have served an earlier scheduler: each sequence
         * starts empty, as its slot's token list does (sched.h invariant 1;
         * no thread of ours runs yet). */
        ks_engine_seq_clear(s->e, i);
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca; /* cv: timed waits for deferred saves on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&s->cv_done, NULL);
    s->st.n_slots = s->n_slots;
    ks__sched_warm(s); /* no thread of ours runs yet */
    s->st.cache = s->cst;
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
    free_all(s);
    return KS_ENOMEM;
}

void ks_sched_set_stop_reason(ks_sched *s, ks_reason r) {
    if (s) s->stop_reason = r; /* read by the inference thread after stop, under mu's ordering */
}

void ks_sched_free(ks_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->th_started) pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->cv_done);
    free_all(s);
}

int ks_sched_submit(ks_sched *s, const ks_req_params *p, uint64_t *id) {
    if (!p || !p->tokens || p->n_tokens <= 0 || p->max_tokens < 1) return KS_EINVAL;
    if (p->preferred_slot >= s->n_slots) return KS_EINVAL;
    if (ks_sampler_ext_check(s->e, p->ext) != 0) return KS_EINVAL;
    if ((int64_t)p->n_tokens + p->max_tokens > s->n_ctx_seq) return KS_ECTX;
    /* Media: every pseudo-token is the set's, and the prompt ends in text (its
     * last row gives the first token's logits). */
    if (!ks_media_set_covers(p->media, p->tokens, p->n_tokens) || ks_token_is_media(p->tokens[p->n_tokens - 1]))
        return KS_EINVAL;
    sreq *r = calloc(1, sizeof *r);
    if (!r) return KS_ENOMEM;
    r->p = *p;
    r->p.media = ks_media_set_ref(p->media);
    r->p.tokens = NULL;
    r->p.msg_prefix_hash = NULL;
    r->p.ext = NULL;
    if (pins_copy(r, p) != 0) {
        sreq_free(r);
        return KS_EINVAL;
    }
    r->p.pins = r->n_pins ? r->pins : NULL;
    r->p.n_pins = r->n_pins;
    if (p->ext && !(r->p.ext = r->ext = ext_dup(p->ext))) goto nomem;
    if (ks_tokens_assign(&r->prompt, p->tokens, p->n_tokens) != 0) goto nomem;
    if (p->msg_prefix_hash && p->n_msgs > 0) {
        r->hashes = malloc(sizeof(uint64_t) * (size_t)(p->n_msgs + 1));
        if (!r->hashes) goto nomem;
        memcpy(r->hashes, p->msg_prefix_hash, sizeof(uint64_t) * (size_t)(p->n_msgs + 1));
        for (int k = 0; k <= p->n_msgs; k++) r->hashes[k] = ks_msghash_tenant(r->hashes[k], p->tenant);
    }
    /* The tenant's namespace (ks_req_params.tenant): an SPC key too, unless
     * the operator shares system prompts. */
    if (r->p.sys_key && !s->p.share_system_prompt) r->p.sys_key = ks_msghash_tenant(r->p.sys_key, p->tenant);
    r->t_submit = ks_now_ms();
    /* Redis is asked here, on the submitting thread, never on the inference
     * thread: the state it holds waits in the store for this request's
     * lookup (store.h, ks_store_prefetch). The first token's time counts it. */
    if (s->p.store && r->p.cache_prompt && s->p.cache_prompt) { /* returns at once without a redis tier */
        /* the longest state a restore could take (policy.c, restorable) */
        ks_store_prefetch_in(s->p.store, r->p.tenant, r->prompt.v, r->prompt.n,
                             ks_engine_restorable_floor(s->e, r->prompt.n - 1));
    }
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        sreq_free(r);
        return KS_ESHUTDOWN;
    }
    /* Idle slots from n_active, not from the slots' states: a slot's state
     * belongs to the inference thread, which moves it from prefill to
     * generation without mu (a data race ThreadSanitizer found). Idle <->
     * assigned changes happen under mu together with n_active, so this
     * count is exact. */
    int idle = s->n_slots - s->n_active;
    if (s->q_n >= s->p.max_queue && idle <= s->q_n) {
        s->st.requests_rejected++;
        pthread_mutex_unlock(&s->mu);
        sreq_free(r);
        return KS_EFULL;
    }
    r->id = s->next_id++;
    if (r->p.share_prefill_of >= r->id) r->p.share_prefill_of = 0; /* only an earlier request */
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

bool ks_sched_spec_status(const ks_sched *s, bool *exact, const char **why) {
    if (exact) *exact = s->spec_on && s->spec_exact;
    if (why) *why = s->spec_why;
    return s->spec_on;
}

void ks_sched_stats_get(ks_sched *s, ks_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queue_depth = s->q_n;
    pthread_mutex_unlock(&s->mu);
}

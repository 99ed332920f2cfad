/*
 * policy.c — the scheduler's cache policy: what a request reuses, and what
 * is kept for later requests.
 *
 * NOTES ON THE CACHE POLICY
 *
 * Planning (ks__policy_plan, inference thread, once per request):
 *  1. The sampler for the request comes first: a grammar llama.cpp refuses
 *     ends the request (KS_EINVAL) with the slot as it was. Its penalties
 *     take the prompt as history (llama-server's init_sampler). Nothing of
 *     the request's sampling (ks_sample_ext) reaches the steps below: it
 *     never changes what is reused, restored or saved.
 *  2. KV the slot is about to drop is saved first (`evict`, sync) unless the
 *     store holds it already.
 *  3. The slot keeps the route's common prefix (llama_memory_seq_rm; a full
 *     rebuild where the memory cannot drop a suffix). Every length reused,
 *     copied, restored or pinned is first cut back to the start of a whole
 *     media run it would end inside (ks_media_set_cut, media.h note 2a), so
 *     no sequence ever holds part of such a run.
 *  4. Copy: when another slot — busy or idle, whatever the router could not
 *     give — holds a prefix of the prompt at least copy_min_tokens longer
 *     than what this slot keeps (and than the system prompt when SPC holds
 *     it: SPC's state is smaller), its sequence is copied here with its
 *     token list (state get into a scratch buffer, state set: the calls SPC
 *     and the store use, exact), and trimmed to the common prefix. This is
 *     how the followers of a shared prefill (share_prefill_of, sched.c) get
 *     their leader's prompt. Plans run between decode steps, so every other
 *     slot's sequence is exactly its token list then (S1; step.c leaves no
 *     throwaway row): a generating source's tokens beyond the common prefix
 *     are trimmed off.
 *  5. Restores, each only when it gives more than the slot holds, cheapest
 *     sufficient first: the store for a prefix longer than the system prompt
 *     (a conversation's earlier turn makes an SPC restore wasted work), then
 *     SPC for the system prompt, then the store for any shorter prefix. A
 *     restored state is checked against the exact tokens it stands for.
 *  6. Cache pins (sched.h): a pinned prefix the store holds gets its deadline
 *     extended; one beyond the slot's reuse becomes a chunk end of the
 *     prefill (saved there); one within the reuse is saved now, by rewinding:
 *     the whole state copied, the sequence cut back to the pin, the pin's
 *     state copied, the whole state set again.
 *
 * Why copy before the restores: it needs no lookup, no read and no
 * verification (the source's token list is exact by S1), and its length is
 * known before anything is moved; the store is still asked for a longer
 * prefix afterwards. The minimum gain (copy_min_tokens, 16): a copy moves
 * the source's whole state twice (get, set), its generated tokens and the
 * part this slot holds already included, while a prefilled token costs
 * ~4 ms on the bench model (docs/LLAMA_FACTS.md, "Memory and state"). A
 * 4,000-token state (49 MB) copies in ~7 ms with the scratch buffer warm and
 * ~170 ms when the buffer is new (page faults; the first copy of a busy
 * period), about what 16 prefilled tokens cost: so 16 tokens pay for even
 * the worst copy of a long source, and a smaller gain is left to prefill.
 *
 * Why rewind rather than cut the reuse back to a pin within it: a pinned
 * system prompt whose deadline lapsed while the slot kept a long
 * conversation would otherwise cost that whole conversation's prefill; the
 * rewind costs two copies of the state and one set, like a slot copy.
 *
 * Saves, by reason: `cold` at a chunk end chosen by savepoint.c,
 * `continued` every continued_interval generated tokens, `finish` at the end
 * (sched.c), `evict` before KV is dropped, `shutdown` when the scheduler
 * stops, `pin` at a request's cache pins (not limited by store_min_tokens),
 * `checkpoint` at a prompt's end on a hybrid model (ckpt.c).
 * A save copies the sequence state here and hands the bytes to the store's
 * writer thread (sync only for evict and shutdown).
 *
 * Invariants
 *  P1. The slot's token list is exactly its sequence after every function
 *      here returns (S1 in sched.c): a token list that cannot be updated
 *      (ENOMEM) is reported to the caller, which fails the slot.
 *  P2. The counters (s->cst) are the inference thread's own; sched.c
 *      publishes them under mu. No restore or copy runs under mu.
 *  P3. A slot's checkpoints stand for prefixes of its token list (ckpt.c C1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/prefix.h"
#include "cache/savepoint.h"
#include "cache/spc.h"
#include "sched/sched_int.h"

#define MOD "sched"

/* ------------------------------------------------------- sliding windows */
/* Which states may be set into a slot. On a sliding-window model llama's
 * state of a sequence past the window keeps only the window's cells of the
 * sliding layers, and they come back in other cells: attention sums them in
 * another order than the uncached run did, unless the shift is a multiple
 * of the kernels' block (ks_engine_state_restorable; docs/LLAMA_FACTS.md,
 * "Sliding window: restores at aligned lengths"). So restores (store, SPC,
 * slot copies, pin rewinds) take states of at most the window or of
 * n_swa + 64k tokens, and on such a model cold saves land on those lengths
 * and other saves are made only there; live reuse in the slot is exact at
 * any length. */
static bool restorable(const ks_sched *s, int n) { return ks_engine_state_restorable(s->e, n); }

/* Whether a sequence whose sliding layers hold no cell before position
 * pos_min (a state restored past the window: its first window's start) can
 * be cut back to n tokens and decode on with a prefill's bits. Cut below
 * pos_min + n_swa, the tokens after the cut would miss cells they attend to,
 * although llama's seq_rm accepts it (llama-server's rule;
 * docs/LLAMA_FACTS.md (e)). */
static bool cut_keeps_window(const ks_sched *s, int pos_min, int n) {
    int w = ks_engine_n_swa(s->e);
    return w <= 0 || pos_min <= 0 || pos_min <= n - w;
}

/* ---------------------------------------------------------------- saves */
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
    s->cst.snapshot_ms_total += ks_now_ms() - t0;
    return buf;
}

/* Whether the slot's state may go to the store at all: there is one, the
 * KV is not a cache_prompt:false request's, it is long enough, and a
 * restore would take it (not so at every length on a sliding window). */
static bool slot_storable(const ks_sched *s, const slot *sl) {
    return s->p.store && !sl->no_store && sl->tokens.n >= s->p.store_min_tokens && restorable(s, sl->tokens.n);
}

/* Whether a save of the slot's state for `why` can apply at all (nothing
 * asked of the store but its configuration). */
static bool save_applies(const ks_sched *s, const slot *sl, ks_reason why) {
    return slot_storable(s, sl) && ks_store_saves_reason(s->p.store, why);
}

int ks__policy_save_ask(ks_sched *s, slot *sl, ks_reason why) {
    if (!slot_storable(s, sl)) return -1;
    /* Ask the store first: nothing is copied for a reason that maps to no
     * tier, or for a state it already holds (e.g. the finish save of the
     * request that left this KV, when the slot is evicted later). Such a "no"
     * is still a save request, counted by the store as not written. */
    bool want = ks_store_wants_in(s->p.store, sl->tenant, why, sl->tokens.v, sl->tokens.n);
    s->cst.store_save_requests[why]++;
    return want ? 1 : 0;
}

void ks__policy_save_take(ks_sched *s, slot *sl, ks_reason why, bool sync) {
    size_t len = 0;
    uint8_t *buf = snapshot(s, sl, &len);
    if (!buf) { /* out of memory: nothing was asked of the store after all */
        s->cst.store_save_requests[why]--;
        return;
    }
    int rc = ks_store_save_in(s->p.store, sl->tenant, why, sl->tokens.v, sl->tokens.n, buf, len, sync); /* takes buf */
    KS_DEBUG(MOD, "slot[%d] save %s: %d tokens, %zu bytes%s (%s)", sl->id, ks_reason_name(why), sl->tokens.n,
             len, sync ? ", sync" : "", rc ? ks_strerror(rc) : "ok");
}

void ks__policy_save(ks_sched *s, slot *sl, ks_reason why, bool sync) {
    if (ks__policy_save_ask(s, sl, why) == 1) ks__policy_save_take(s, sl, why, sync);
}

/* Deferred finish saves. A finish save copies the whole sequence's state on
 * this thread — from a GPU 0.5 s for 10K tokens of an 8B model — and an
 * agent's next request usually arrives within milliseconds of the reply's
 * end, continuing the very conversation whose state is being copied. So the
 * save waits on the idle slot for finish_save_delay_ms (sched.h), not yet
 * asked of the store (published as cst.deferred_saves); when the
 * slot's next request continues the conversation first (cache_prompt, the
 * same tenant, keeping at least half of the slot: the rule of the evict save
 * in ks__policy_plan), it is superseded (counted in finish_saves_superseded)
 * — that request's own finish save follows (or, when it is canceled, a
 * deferred save of what the slot holds then). Only where the cut is certain
 * to keep what the plan counts on: nothing to cut, or a memory that drops a
 * suffix without losing a window (not on sliding-window models, whose next
 * state may not be restorable, nor hybrid or recurrent ones, whose cut may
 * fall back to a checkpoint or a rebuild). Otherwise it is asked for and
 * taken (ks__policy_save) when due (between steps when other slots are busy),
 * before any other request changes the slot's KV (ks__policy_plan), before a
 * slot clear or a failed plan's clear, and when the scheduler stops — at
 * shutdown only where the finish saves outlive the process (not into the RAM
 * tier of a process about to exit). What is lost: the state of a turn whose
 * next turn failed (a decode error) or was running at a crash. */
static void pending_resolve(ks_sched *s, slot *sl, bool take, bool sync) {
    if (!sl->save_pending) return;
    sl->save_pending = false;
    if (take) ks__policy_save(s, sl, KS_REASON_FINISH, sync);
    else s->cst.finish_saves_superseded++;
}

bool ks__policy_defer_finish(ks_sched *s, slot *sl) {
    KS_ASSERT(!sl->save_pending);
    if (!save_applies(s, sl, KS_REASON_FINISH)) return false;
    sl->save_pending = true;
    sl->save_due_ms = ks_now_ms() + s->p.finish_save_delay_ms;
    return true;
}

void ks__policy_pending_take_slot(ks_sched *s, slot *sl) { pending_resolve(s, sl, true, false); }

/* Whether a plan that keeps n_reuse of sl's tokens certainly keeps them (the
 * deferred finish save's supersede rule, note above). */
static bool cut_certain(const ks_sched *s, const slot *sl, int n_reuse) {
    if (ks_engine_n_swa(s->e) > 0) return false;
    if (n_reuse == sl->tokens.n) return true;
    return !s->ckpt_on && !ks_engine_is_hybrid(s->e) && !ks_engine_is_recurrent(s->e) &&
           !s->p.simulate_no_partial_rm;
}

double ks__policy_pending_due(const ks_sched *s) {
    double due = -1;
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].save_pending && (due < 0 || s->slots[i].save_due_ms < due)) due = s->slots[i].save_due_ms;
    return due;
}

int ks__policy_pending_take(ks_sched *s, double now, bool sync) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        /* (a slot assigned a request and not yet planned: its plan resolves it) */
        if (!sl->save_pending || sl->r || (now >= 0 && sl->save_due_ms > now)) continue;
        pending_resolve(s, sl, true, sync);
        n++;
    }
    return n;
}

int ks__policy_pending_drop(ks_sched *s) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].save_pending) {
            s->slots[i].save_pending = false;
            n++;
        }
    return n;
}

/* SPC: the slot's sequence holds exactly the system prompt now: keep a copy. */
void ks__policy_spc_capture(ks_sched *s, slot *sl) {
    size_t got = 0;
    uint8_t *buf = snapshot(s, sl, &got);
    if (!buf) return;
    int rc = ks_spc_insert(s->p.spc, sl->r->p.sys_key, sl->r->prompt.v, sl->snap_sys, buf, got); /* takes buf */
    if (rc == 0) {
        s->cst.spc_builds++;
        KS_DEBUG(MOD, "slot[%d] spc-capture %d tokens, %zu bytes", sl->id, sl->snap_sys, got);
    } else {
        KS_DEBUG(MOD, "slot[%d] spc-capture refused: %s", sl->id, ks_strerror(rc));
    }
}

/* ------------------------------------------------------------- restores */
/* ks__policy_restore_state: sched_int.h. */
int ks__policy_restore_state(ks_sched *s, slot *sl, const uint8_t *state, size_t len, const int32_t *tokens,
                             int n) {
    ks_engine_seq_clear(s->e, sl->id);
    ks_tokens_truncate(&sl->tokens, 0);
    ks__ckpt_drop(sl, 0);
    if (!restorable(s, n)) return KS_EMISMATCH; /* callers never ask for it; a safety net */
    int rc = ks_engine_state_set(s->e, sl->id, state, len);
    if (rc == 0 && (rc = ks_tokens_assign(&sl->tokens, tokens, n)) != 0) ks_engine_seq_clear(s->e, sl->id);
    return rc;
}

/* Store: restores the longest stored prefix of the prompt longer than `beat`
 * tokens (beat >= *n_reuse: what the slot or SPC gives without the store)
 * and at most `max` tokens (capped at all but the last token of the prompt).
 * Returns 1 when the slot now holds it, 0 when not (the slot is unchanged,
 * or emptied with *n_reuse = 0 after a rejected state), or KS_ENOMEM. */
static int store_restore(ks_sched *s, slot *sl, sreq *r, int *n_reuse, int beat, int max) {
    double t0 = ks_now_ms();
    ks_store_hit hit;
    if (beat < *n_reuse) beat = *n_reuse;
    if (max > r->prompt.n - 1) max = r->prompt.n - 1;
    /* A state of a length that cannot be restored exactly (restorable: a
     * sliding window) is passed over for the next shorter one; on such a
     * model only restorable lengths are saved, so that is a state of another
     * process or version. */
    for (;;) {
        max = ks_engine_restorable_floor(s->e, max);
        if (beat + 1 > max) return 0;
        if (ks_store_lookup_range_in(s->p.store, r->p.tenant, r->prompt.v, r->prompt.n, beat + 1, max, &hit)) return 0;
        /* Nor is one that ends inside a whole media run (media.h note 2a):
         * none is ever saved there, this is defence. */
        if (restorable(s, hit.n_tokens) && ks_media_set_cut(r->p.media, hit.n_tokens) == hit.n_tokens) break;
        max = hit.n_tokens - 1;
        ks_store_hit_free(&hit);
    }
    int ret = 0;
    if (hit.n_tokens <= *n_reuse) goto done;
    if (sl->tokens.n > *n_reuse) ks__policy_save(s, sl, KS_REASON_EVICT, true); /* about to drop unsaved KV */
    int rc = ks__policy_restore_state(s, sl, hit.payload, hit.payload_len, r->prompt.v, hit.n_tokens);
    if (rc) {
        if (rc == KS_EMISMATCH)
            KS_WARN(MOD, "slot[%d] stored state of %d tokens rejected by llama; prefilling", sl->id, hit.n_tokens);
        *n_reuse = 0;
        ret = rc == KS_ENOMEM ? rc : 0;
        goto done;
    }
    *n_reuse = hit.n_tokens;
    double ms = ks_now_ms() - t0;
    ks_store_note_restore(s->p.store, ms);
    snprintf(r->res.cache_tier, sizeof r->res.cache_tier, "%s", ks_tier_name(hit.tier));
    r->res.restore_ms += ms + hit.prefetch_ms; /* after a copy's, if any; a Redis fetch at submit too */
    s->cst.store_hits++;
    s->cst.store_restored_tokens += (uint64_t)hit.n_tokens;
    s->cst.store_restore_ms_total += ms;
    KS_DEBUG(MOD, "slot[%d] store-restore %d tokens from %s (%zu bytes, %.2f ms)", sl->id, hit.n_tokens,
             ks_tier_name(hit.tier), hit.payload_len, ms);
    ret = 1;
done:
    ks_store_hit_free(&hit);
    return ret;
}

/* SPC: restore the system prompt's state into the slot. The key is a 64-bit
 * hash, so the entry's tokens are compared with the prompt's before anything
 * is restored (spc.h, invariant 5). Returns as store_restore. */
static int spc_restore(ks_sched *s, slot *sl, sreq *r, int *n_reuse) {
    int n_sys = r->p.n_sys_tokens;
    if (!restorable(s, n_sys) || ks_media_set_cut(r->p.media, n_sys) != n_sys) return 0;
    const ks_spc_entry *e = ks_spc_acquire(s->p.spc, r->p.sys_key);
    int ret = 0;
    if (!e) {
        s->cst.spc_misses++;
        return 0;
    }
    if (e->tokens.n != n_sys || memcmp(e->tokens.v, r->prompt.v, sizeof(int32_t) * (size_t)n_sys) != 0) {
        KS_WARN(MOD, "slot[%d] SPC entry does not match the prompt's system tokens; prefilling", sl->id);
        s->cst.spc_misses++;
        goto done;
    }
    double t0 = ks_now_ms();
    int rc = ks__policy_restore_state(s, sl, e->blob, e->len, e->tokens.v, n_sys);
    if (rc) {
        if (rc == KS_EMISMATCH) KS_WARN(MOD, "slot[%d] SPC state rejected by llama; prefilling", sl->id);
        s->cst.spc_misses++;
        *n_reuse = 0;
        ret = rc == KS_ENOMEM ? rc : 0;
        goto done;
    }
    *n_reuse = n_sys;
    s->cst.spc_hits++;
    s->cst.spc_restored_tokens += (uint64_t)n_sys;
    KS_DEBUG(MOD, "slot[%d] spc-restore %d tokens (%zu bytes) in %.2f ms", sl->id, n_sys, e->len, ks_now_ms() - t0);
    ret = 1;
done:
    ks_spc_release(s->p.spc, e);
    return ret;
}

/* --------------------------------------------------------------- plan */
static void count_mode(ks_sched *s, slot *sl, sreq *r, bool restored, int n_reuse, bool took_over) {
    ks_sched_cache_stats *c = &s->cst;
    if (took_over) c->evictions++;
    if (r->p.sys_key && r->p.n_sys_tokens > 0 && n_reuse < r->p.n_sys_tokens) c->sys_prompt_prefills++;
    if (restored) return;
    switch (sl->route.mode) {
    case KS_ROUTE_IMC_HASH: c->imc_hash_hits++; break;
    case KS_ROUTE_IMC_TOKEN_PREFIX:
        c->imc_token_prefix_hits++;
        c->imc_salvaged_tokens += (uint64_t)n_reuse;
        KS_DEBUG("imc", "imc-partial-rebuilt slot[%d]: salvaged_prefix=%d of %d (%.0f%%)", sl->id, n_reuse,
                 r->prompt.n, 100.0 * n_reuse / r->prompt.n);
        break;
    case KS_ROUTE_PREFIX: c->mode_prefix++; break;
    default:
        c->mode_miss++;
        if (s->p.imc) c->rebuilds++;
        break;
    }
}

/* Keeps [0, n_reuse) of the slot's sequence; returns what it really kept:
 * less at a checkpoint, 0 after a rebuild, where the memory cannot drop a
 * suffix. */
static int trim(ks_sched *s, slot *sl, int n_reuse) {
    ks_route *rt = &sl->route;
    if (n_reuse == 0) {
        if (sl->tokens.n > 0 || ks_engine_seq_pos_max(s->e, sl->id) >= 0) ks_engine_seq_clear(s->e, sl->id);
        ks_tokens_truncate(&sl->tokens, 0);
        ks__ckpt_drop(sl, 0);
        return 0;
    }
    if (n_reuse == sl->tokens.n) return n_reuse;
    if (!cut_keeps_window(s, ks_engine_seq_pos_min(s->e, sl->id), n_reuse)) {
        /* A sequence restored past a sliding window cannot go back this far:
         * the plan's restores that follow may find a shorter state. */
        KS_DEBUG(MOD, "slot[%d] cut to %d would lose the window of a restored sequence (pos_min %d), rebuilding",
                 sl->id, n_reuse, ks_engine_seq_pos_min(s->e, sl->id));
        ks_engine_seq_clear(s->e, sl->id);
        ks_tokens_truncate(&sl->tokens, 0);
        ks__ckpt_drop(sl, 0);
        rt->mode = KS_ROUTE_MISS;
        snprintf(rt->reason, sizeof rt->reason, "window-not-held");
        return 0;
    }
    if (rt->mode == KS_ROUTE_IMC_TOKEN_PREFIX)
        KS_DEBUG("imc", "imc-trim-prefix slot[%d]: cached_tokens=%d trim_pos=%d", sl->id, sl->tokens.n, n_reuse);
    if (s->p.simulate_no_partial_rm || !ks_engine_seq_rm(s->e, sl->id, ks__kv_pos(sl, n_reuse), -1)) {
        /* Recurrent/hybrid memory cannot drop a suffix: back to a checkpoint,
         * else rebuild. */
        int k = s->p.simulate_no_partial_rm ? 0 : ks__ckpt_restore(s, sl, n_reuse);
        if (k > 0) {
            n_reuse = k;
            snprintf(rt->reason, sizeof rt->reason, "checkpoint-at-token-%d", k);
        } else {
            KS_DEBUG(MOD, "slot[%d] partial removal unsupported, rebuilding", sl->id);
            ks_engine_seq_clear(s->e, sl->id);
            n_reuse = 0;
            rt->mode = KS_ROUTE_MISS;
            snprintf(rt->reason, sizeof rt->reason, "partial-rm-unsupported");
            s->cst.partial_rm_rebuilds++;
        }
    }
    ks_tokens_truncate(&sl->tokens, n_reuse);
    ks__ckpt_drop(sl, n_reuse);
    return n_reuse;
}

/* --------------------------------------------------------- slot copies */
void ks__policy_idle(ks_sched *s) {
    free(s->copy_buf);
    s->copy_buf = NULL;
    s->copy_cap = 0;
}

/* What a copy of slot o can keep of o's first n tokens: all n where the
 * memory can drop a suffix or o holds exactly n tokens; else (hybrid,
 * recurrent) the tokens up to o's latest checkpoint at or before n, which
 * the copy takes along and goes back to (0: none). */
static int copy_reach(const ks_sched *s, const slot *o, int n, bool trims) {
    if (trims || n >= o->tokens.n) return n;
    int i = o->n_ckpts - 1;
    while (i >= 0 && o->ckpts[i].n_tokens > n) i--;
    return i >= 0 ? o->ckpts[i].n_tokens : 0;
}

/* The slot other than dst whose tokens give r the longest reusable prefix
 * (ks_prefix_reuse, within copy_reach), when it is at least `need` tokens;
 * on equal lengths the one with the fewest tokens (the smallest state to
 * copy), then the lowest id. Returns its index and *n_out the reusable
 * length, or -1. */
static int copy_source(ks_sched *s, const slot *dst, const sreq *r, int need, int *n_out) {
    bool trims = !s->p.simulate_no_partial_rm && ks_engine_partial_rm_ok(s->e);
    int best = -1;
    *n_out = 0;
    for (int i = 0; i < s->n_slots; i++) {
        const slot *o = &s->slots[i];
        if (o == dst || o->tenant != r->p.tenant || o->tokens.n < need || !restorable(s, o->tokens.n)) continue;
        int n = ks_prefix_reuse(ks_prefix_common(o->tokens.v, o->tokens.n, r->prompt.v, r->prompt.n), r->prompt.n);
        n = copy_reach(s, o, ks_media_set_cut(r->p.media, n), trims);
        if (n < need) continue;
        /* The copy restores o's whole state, whose first window then starts
         * at o->tokens.n - n_swa, and cuts it back to n. */
        if (!cut_keeps_window(s, o->tokens.n - ks_engine_n_swa(s->e), n)) continue;
        if (best < 0 || n > *n_out || (n == *n_out && o->tokens.n < s->slots[best].tokens.n)) {
            best = i;
            *n_out = n;
        }
    }
    return best;
}

/* Copy (plan step 3): replaces the slot's sequence, which holds *n_reuse
 * tokens of the prompt, with another slot's that gives at least
 * copy_min_tokens more than `beat` (>= *n_reuse: what the slot or SPC gives
 * without it), and keeps the common prefix. Returns 1 when the slot now
 * holds it (*n_reuse updated), 0 when no copy was made (the slot is
 * unchanged, or emptied with *n_reuse = 0 after a rejected state), or
 * KS_ENOMEM (the slot is empty and consistent, P1). */
static int slot_copy(ks_sched *s, slot *sl, sreq *r, int *n_reuse, int beat) {
    if (s->p.copy_min_tokens <= 0) return 0;
    if (beat < *n_reuse) beat = *n_reuse;
    int n_copy = 0;
    int i = copy_source(s, sl, r, beat + s->p.copy_min_tokens, &n_copy);
    if (i < 0) return 0;
    slot *src = &s->slots[i];
    double t0 = ks_now_ms();
    size_t need = ks_engine_state_size(s->e, src->id);
    if (need > s->copy_cap) {
        /* Room for a source that grows a little (a generating slot); the old
         * contents are scratch, so no realloc copying them. */
        ks__policy_idle(s);
        size_t cap = need + need / 4;
        s->copy_buf = malloc(cap);
        if (!s->copy_buf) return 0; /* no memory for the copy: the slot prefills instead */
        s->copy_cap = cap;
    }
    size_t len = need ? ks_engine_state_get(s->e, src->id, s->copy_buf, s->copy_cap) : 0;
    if (len == 0) return 0;
    /* The slot's own tokens are a prefix of the source's (both start with
     * prompt[0, *n_reuse)), so replacing them loses nothing. */
    int rc = ks__policy_restore_state(s, sl, s->copy_buf, len, src->tokens.v, src->tokens.n);
    if (rc) {
        if (rc == KS_EMISMATCH)
            KS_WARN(MOD, "slot[%d] copy of slot[%d] rejected by llama; prefilling", sl->id, src->id);
        *n_reuse = 0;
        return rc == KS_ENOMEM ? rc : 0;
    }
    /* Hybrid: the source's checkpoints come along (P3 holds: they stand for
     * prefixes of the tokens just set), so trim() can go back to n_copy. */
    ks__ckpt_copy(sl, src, n_copy);
    *n_reuse = trim(s, sl, n_copy);
    if (*n_reuse < n_copy) return 0; /* the suffix could not be dropped: rebuilt (trim) */
    double ms = ks_now_ms() - t0;
    r->res.restore_ms += ms;
    s->cst.slot_copies++;
    s->cst.slot_copied_tokens += (uint64_t)n_copy;
    s->cst.slot_copy_ms_total += ms;
    /* The route's reason was about the routed slot; now the source says why
     * not more was reused (route.h's reasons). */
    ks_route *rt = &sl->route;
    int n_common = ks_prefix_common(src->tokens.v, src->tokens.n, r->prompt.v, r->prompt.n);
    if (n_copy < r->prompt.n - 1 && n_common < src->tokens.n)
        snprintf(rt->reason, sizeof rt->reason, "diverged-at-token-%d", n_common);
    else
        rt->reason[0] = '\0';
    KS_DEBUG(MOD, "slot[%d] copy %d of slot[%d]'s %d tokens (%s, %zu bytes, %.2f ms)", sl->id, n_copy, src->id,
             src->tokens.n, src->state == ST_IDLE ? "idle" : "busy", len, ms);
    return 1;
}

/* ---------------------------------------------------------- cache pins */
/* The deadline of pin i, from now. */
static int64_t pin_until(const sreq *r, int i) { return ks_wall_us() + (int64_t)r->pins[i].ttl_s * 1000000; }

/* Records that pin i is held (saved when `saved`, else refreshed). */
static void pin_held(ks_sched *s, sreq *r, int i, bool saved) {
    int n = r->pins[i].n_tokens;
    r->pin_st[i] = PIN_HELD;
    if (n > r->res.n_pinned) r->res.n_pinned = n;
    if (saved) {
        if (n > r->pin_saved_max) r->pin_saved_max = n;
        s->cst.pin_saves++;
    } else {
        s->cst.pin_refreshes++;
    }
}

/* Pin i: the slot's sequence holds exactly its prefix now. A state the store
 * got meanwhile is only refreshed; else it is copied and saved pinned. */
void ks__policy_pin_save(ks_sched *s, slot *sl, sreq *r, int i) {
    int n = r->pins[i].n_tokens;
    int64_t until = pin_until(r, i);
    if (!restorable(s, n)) { /* a sliding window: no restore would take it */
        r->pin_st[i] = PIN_FAILED;
        s->cst.pin_failures++;
        return;
    }
    if (ks_store_pin_in(s->p.store, r->p.tenant, r->prompt.v, n, until) == 0) {
        pin_held(s, r, i, false);
        return;
    }
    size_t len = 0;
    uint8_t *buf = snapshot(s, sl, &len);
    if (buf) s->cst.store_save_requests[KS_REASON_PIN]++; /* the store accounts for each (store.h stats) */
    /* takes buf */
    int rc = buf ? ks_store_save_pinned_in(s->p.store, r->p.tenant, r->prompt.v, n, buf, len, until) : KS_ENOMEM;
    KS_DEBUG(MOD, "slot[%d] pin %d tokens for %d s: %s", sl->id, n, r->pins[i].ttl_s,
             rc == 1 ? "saved" : rc == 0 ? "refreshed" : ks_strerror(rc));
    if (rc >= 0) {
        pin_held(s, r, i, rc == 1);
    } else {
        r->pin_st[i] = PIN_FAILED;
        s->cst.pin_failures++;
    }
}

/* Plan step 6 (sched.h, ks_cache_pin): the pins of the request on a slot that
 * holds *n_reuse tokens of its prompt (its whole sequence). Each pin the
 * store holds is refreshed; one beyond *n_reuse is left PIN_PENDING for the
 * prefill (a chunk ends there); one within is saved now, by rewinding the
 * sequence, or — where the memory cannot drop a suffix or the copy finds no
 * memory — by cutting the reuse back to it (*n_reuse lowered). Returns 0, or
 * KS_ENOMEM when the token list cannot be restored (the slot is empty then). */
static int pins_plan(ks_sched *s, slot *sl, sreq *r, int *n_reuse) {
    int covered[KS_MAX_CACHE_PINS], n_cov = 0;
    for (int i = 0; i < r->n_pins; i++) {
        int n = r->pins[i].n_tokens;
        if (ks_media_set_cut(r->p.media, n) != n) {
            /* Inside a whole media run (media.h note 2a): no state may end
             * there, so the pin cannot be held. */
            r->pin_st[i] = PIN_FAILED;
            s->cst.pin_failures++;
        } else if (ks_store_pin_in(s->p.store, r->p.tenant, r->prompt.v, n, pin_until(r, i)) == 0)
            pin_held(s, r, i, false);
        else if (n > *n_reuse)
            r->pin_st[i] = PIN_PENDING;
        else
            covered[n_cov++] = i;
    }
    if (n_cov == 0) return 0;
    /* A pin exactly at the reuse's end is a copy of what the slot holds. */
    if (r->pins[covered[n_cov - 1]].n_tokens == sl->tokens.n) ks__policy_pin_save(s, sl, r, covered[--n_cov]);
    if (n_cov == 0) return 0;

    int n_full = sl->tokens.n;
    size_t len = 0;
    bool trims = !s->p.simulate_no_partial_rm && ks_engine_partial_rm_ok(s->e);
    /* the rewind cuts the live sequence (its window must stay whole) and sets
     * its whole state again (a restore) */
    bool rewind = trims && restorable(s, n_full);
    int pmin = ks_engine_seq_pos_min(s->e, sl->id);
    for (int k = 0; rewind && k < n_cov; k++) rewind = cut_keeps_window(s, pmin, r->pins[covered[k]].n_tokens);
    uint8_t *full = rewind ? snapshot(s, sl, &len) : NULL;
    if (full) {
        /* Rewind: deepest first, each cut from the previous one. */
        for (int k = n_cov - 1; k >= 0; k--) {
            int i = covered[k], n = r->pins[i].n_tokens;
            if (!ks_engine_seq_rm(s->e, sl->id, ks__kv_pos(sl, n), -1)) break; /* the whole state is set again below */
            ks_tokens_truncate(&sl->tokens, n);
            uint64_t saves = s->cst.pin_saves;
            ks__policy_pin_save(s, sl, r, i);
            s->cst.pin_rewinds += s->cst.pin_saves - saves;
        }
        int rc = ks__policy_restore_state(s, sl, full, len, r->prompt.v, n_full);
        free(full);
        for (int k = 0; k < n_cov; k++)
            if (r->pin_st[covered[k]] == PIN_IGNORED) {
                r->pin_st[covered[k]] = PIN_FAILED;
                s->cst.pin_failures++;
            }
        if (rc != 0) {
            /* llama refused its own state (the slot is empty now): prefill. */
            KS_WARN(MOD, "slot[%d] state of %d tokens not set again after saving pins: %s", sl->id, n_full,
                    ks_strerror(rc));
            *n_reuse = 0;
            return rc == KS_ENOMEM ? rc : 0;
        }
        return 0;
    }
    /* Cut the reuse back to the shallowest of them; the others are prefill
     * chunk ends again. */
    int n_cut = r->pins[covered[0]].n_tokens;
    *n_reuse = trim(s, sl, n_cut);
    if (*n_reuse == n_cut) snprintf(sl->route.reason, sizeof sl->route.reason, "pin-at-token-%d", n_cut);
    for (int k = 0; k < n_cov; k++) {
        int i = covered[k];
        if (r->pins[i].n_tokens == *n_reuse)
            ks__policy_pin_save(s, sl, r, i);
        else
            r->pin_st[i] = PIN_PENDING;
    }
    return 0;
}

/* The first pending pin after pos, or -1. */
int ks__policy_pin_next(const sreq *r, int pos) {
    for (int i = 0; i < r->n_pins; i++)
        if (r->pin_st[i] == PIN_PENDING && r->pins[i].n_tokens > pos) return r->pins[i].n_tokens;
    return -1;
}

/* What the request's pins will write beyond the n_reuse tokens it reuses:
 * the deepest pin saved in the plan or left for the prefill. The first
 * stream event reports it (Anthropic's cache_creation_input_tokens) before
 * the saves happen; ks__policy_pins_done replaces it with what was written. */
static int pins_planned(const sreq *r, int n_reuse) {
    int deepest = r->pin_saved_max;
    for (int i = 0; i < r->n_pins; i++)
        if (r->pin_st[i] == PIN_PENDING && r->pins[i].n_tokens > deepest) deepest = r->pins[i].n_tokens;
    return deepest > n_reuse ? deepest - n_reuse : 0;
}

void ks__policy_pins_done(ks_sched *s, sreq *r) {
    for (int i = 0; i < r->n_pins; i++)
        if (r->pin_st[i] == PIN_PENDING) {
            r->pin_st[i] = PIN_FAILED;
            s->cst.pin_failures++;
        }
    int w = r->pin_saved_max - r->res.n_cached;
    r->res.n_cache_written = w > 0 ? w : 0;
    s->cst.pin_written_tokens += (uint64_t)r->res.n_cache_written;
}

int ks__policy_plan(ks_sched *s, slot *sl) {
    sreq *r = sl->r;
    ks_route *rt = &sl->route;
    bool cache = r->p.cache_prompt && s->p.cache_prompt;
    r->res.id = r->id;
    r->res.n_prompt = r->prompt.n;
    r->res.n_vocab = ks_engine_n_vocab(s->e);
    sl->n_generated = 0;
    sl->i_logits = -1;
    sl->snap_sys = -1;
    sl->snap_store = -1;
    sl->snap_ckpt = -1;
    /* The sampler first: a grammar llama.cpp refuses fails the request
     * before the slot's KV is touched (KS_EINVAL, sched_int.h). The
     * penalties look back on the prompt as llama-server's do. */
    int rc = 0;
    sl->smpl = ks_sampler_create_ext(s->e, &r->p.sample, r->p.ext, &rc);
    if (!sl->smpl) return rc ? rc : KS_ENOMEM;
    ks_sampler_accept_history(sl->smpl, r->prompt.v, r->prompt.n);

    int n_reuse = rt->n_reuse < sl->tokens.n ? rt->n_reuse : sl->tokens.n;
    /* Never inside a whole media run (media.h note 2a): its rows see the
     * rows after them, so the run is prefilled again from its start. */
    n_reuse = ks_media_set_cut(r->p.media, n_reuse);
    /* The slot's finish save still pending (note "Deferred finish saves"):
     * superseded when this request continues the conversation, else taken
     * before anything below changes the KV. */
    if (sl->save_pending) {
        r->superseded = cache && r->p.tenant == sl->tenant && sl->tokens.n - n_reuse <= sl->tokens.n / 2 &&
                        cut_certain(s, sl, n_reuse);
        pending_resolve(s, sl, !r->superseded, false);
    }
    /* evict (sync): the KV about to be dropped goes to the store first,
     * unless it is there already (ks__policy_save asks the store) — when
     * another conversation takes the slot (most of it is dropped). A turn
     * that keeps most of the slot and drops its tail (the last reply, which
     * the client renders back otherwise) continues the same conversation:
     * its older branch is not worth a copy of the whole state on the
     * inference thread, made before this turn's first token. */
    if (s->p.store && cache && sl->tokens.n - n_reuse > sl->tokens.n / 2)
        ks__policy_save(s, sl, KS_REASON_EVICT, true);
    /* The KV this request leaves is its own: a cache_prompt:false request's
     * is never stored, not later as evict or shutdown either. */
    sl->no_store = !cache;
    /* A miss on a slot that held another branch: that branch is gone. */
    bool took_over = rt->mode == KS_ROUTE_MISS && sl->tokens.n > 0 && cache;
    /* From the trim on, the slot's tokens are a prefix of this prompt (or of
     * a copy's or restore's that this prompt's set covers up to their cut):
     * their KV positions are this request's set's (media.h note 2). */
    ks__slot_media(sl, r->p.media);
    n_reuse = trim(s, sl, n_reuse);
    KS_ASSERT(sl->tenant == r->p.tenant || sl->tokens.n == 0); /* another's KV: saved above, kept nothing */
    sl->tenant = r->p.tenant; /* the slot's KV and its saves are this tenant's now (sched_int.h) */

    int n_sys = r->p.n_sys_tokens;
    /* A copy must beat the system prompt when SPC holds it: SPC's state is
     * the system prompt alone, a copy moves another conversation's whole
     * sequence (typically a slot that shares only the system prompt). */
    bool spc_has = cache && s->p.spc && r->p.sys_key && n_sys >= s->p.cache_min_tokens && n_sys < r->prompt.n &&
                   n_reuse < n_sys && ks_spc_contains(s->p.spc, r->p.sys_key);
    int copied = cache ? slot_copy(s, sl, r, &n_reuse, spc_has ? n_sys : n_reuse) : 0;
    if (copied < 0) return copied;
    bool spc_ok = cache && s->p.spc && r->p.sys_key && n_sys >= s->p.cache_min_tokens && n_sys < r->prompt.n &&
                  n_reuse < n_sys;
    bool store_ok = cache && s->p.store;
    /* The store first when SPC could act: a stored state longer than the
     * system prompt makes SPC's restore wasted work; only then SPC, then a
     * shorter stored prefix (lengths above n_sys were asked for already). */
    int store_hit = store_ok && spc_ok ? store_restore(s, sl, r, &n_reuse, n_sys, r->prompt.n) : 0;
    int spc_hit = 0;
    if (store_hit == 0 && spc_ok) {
        spc_hit = spc_restore(s, sl, r, &n_reuse);
        if (spc_hit == 0) sl->snap_sys = n_sys;
    }
    if (store_hit == 0 && spc_hit == 0 && store_ok)
        store_hit = store_restore(s, sl, r, &n_reuse, n_reuse, spc_ok ? n_sys : r->prompt.n);
    if (store_hit < 0 || spc_hit < 0) return store_hit < 0 ? store_hit : spc_hit;
    /* A miss a state of other K/V cache types would have served (a server of
     * other -ctk/-ctv saved it): never restored, but named. */
    if (store_ok && store_hit == 0 && n_reuse < r->prompt.n - 1) {
        char ty[32];
        if (ks_store_other_kv(s->p.store, r->p.tenant, r->prompt.v, n_reuse + 1, r->prompt.n - 1, ty, sizeof ty) > 0)
            snprintf(rt->reason, sizeof rt->reason, "stored-with-kv-%s", ty);
    }
    /* Pins: only where the KV may be stored (sched.h: ignored otherwise). */
    if (r->n_pins > 0 && store_ok) {
        int prc = pins_plan(s, sl, r, &n_reuse);
        if (prc) return prc;
    }
    count_mode(s, sl, r, copied || spc_hit || store_hit, n_reuse, took_over);
    /* A checkpoint at the system prompt's end, where conversations that
     * share it part (the SPC minimum applies). */
    if (s->ckpt_on && r->p.sys_key && n_sys >= s->p.cache_min_tokens && n_sys > n_reuse && n_sys < r->prompt.n)
        sl->snap_ckpt = n_sys;

    sl->n_past = n_reuse;
    r->res.n_cached = n_reuse;
    r->res.n_cache_written = pins_planned(r, n_reuse);
    snprintf(r->res.cache_mode, sizeof r->res.cache_mode, "%s",
             store_hit ? "store" : spc_hit ? "spc" : copied ? "copy" : ks_route_mode_name(rt->mode));
    snprintf(r->res.cache_reason, sizeof r->res.cache_reason, "%s", rt->reason);
    /* IMC identity: the branch this slot will hold after the request. */
    bool hashed = r->hashes && r->p.n_msgs > 0;
    sl->msg_hash = hashed ? r->hashes[r->p.n_msgs] : 0;
    sl->n_msgs_cached = hashed ? r->p.n_msgs : 0;
    sl->planned = true;
    KS_DEBUG(MOD, "slot[%d] req %llu: prompt %d, reuse %d (mode %s%s%s)", sl->id, (unsigned long long)r->id,
             r->prompt.n, n_reuse, r->res.cache_mode, rt->reason[0] ? ", " : "", rt->reason);
    return 0;
}

/*
 * warm.c — warm start: before the inference thread starts, the slots take
 * the states most recently saved to the store's file tiers (ks_store_recent),
 * so that the conversations a previous process was serving go on after a
 * restart as they would have in it: their next turn reuses the slot's prefix
 * (cache mode "prefix") instead of restoring the state on its critical path.
 * Every tenant's states are candidates: each file records its tenant (bound
 * by its key), and the slot takes it as its owner.
 * sched.h, ks_sched_params.warm_slots.
 *
 * Thread model: called by ks_sched_create before the inference thread
 * exists: it owns every slot and the engine.
 */
#include <stdlib.h>

#include "base/base.h"
#include "sched/sched_int.h"

#define MOD "sched"

/* Files read at most per slot warmed: a conversation's earlier turns are
 * newer than other conversations' states only rarely. */
#define WARM_READS_PER_SLOT 3

static bool has_mrope_media(const ks_sched *s, const ks_store_state *st) {
    if (!ks_media_mrope(ks_engine_media(s->e))) return false;
    for (int j = 0; j < st->n_tokens; j++)
        if (ks_token_is_media(st->tokens[j])) return true;
    return false;
}

void ks__sched_warm(ks_sched *s) {
    int want = s->p.warm_slots < s->n_slots ? s->p.warm_slots : s->n_slots;
    if (want <= 0 || !s->p.store) return;
    ks_store_state *st = calloc((size_t)want, sizeof *st);
    if (!st) return;
    double t0 = ks_now_ms();
    int n = 0;
    if (ks_store_recent(s->p.store, want, want * WARM_READS_PER_SLOT, st, &n) != 0) n = 0;
    int64_t now = ks_now_us();
    int put = 0;
    /* ks_sched_warm_list's copies (none when out of memory: only a cache
     * elsewhere is then cold) */
    s->warm_toks = calloc((size_t)want, sizeof *s->warm_toks);
    s->warm_tenants = calloc((size_t)want, sizeof *s->warm_tenants);
    for (int i = 0; i < n; i++) {
        slot *sl = &s->slots[put];
        double t1 = ks_now_ms();
        /* The lengths a lookup would restore: within the context, and on a
         * sliding-window model only where a restore is exact. */
        if (st[i].n_tokens >= s->n_ctx_seq || !ks_engine_state_restorable(s->e, st[i].n_tokens)) continue;
        /* Images of an M-RoPE projector take fewer KV positions than tokens
         * (engine/media.h note 2), which only a request's media set tells:
         * such a state waits for its conversation's next turn in the store. */
        if (has_mrope_media(s, &st[i])) continue;
        int rc = ks__policy_restore_state(s, sl, st[i].payload, st[i].len, st[i].tokens, st[i].n_tokens);
        if (rc == KS_ENOMEM) break;
        if (rc) {
            KS_WARN(MOD, "warm start: a stored state of %d tokens rejected by llama", st[i].n_tokens);
            continue;
        }
        /* The slot holds that tenant's KV: only its tenant's requests reuse
         * it (route.h invariant 4), as if that tenant's request had left it. */
        sl->tenant = st[i].tenant;
        /* The newest state the most recently used slot: LRU takes the others first. */
        sl->last_used_us = now - i;
        double ms = ks_now_ms() - t1;
        if (s->warm_toks && s->warm_tenants &&
            ks_tokens_assign(&s->warm_toks[s->n_warm], st[i].tokens, st[i].n_tokens) == 0)
            s->warm_tenants[s->n_warm++] = st[i].tenant;
        s->cst.warm_slots++;
        s->cst.warm_tokens += (uint64_t)st[i].n_tokens;
        s->cst.warm_ms_total += ms + st[i].load_ms;
        KS_INFO(MOD, "warm start: slot %d holds %d tokens from %s (%zu bytes; read %.1f ms, set %.1f ms)", sl->id,
                st[i].n_tokens, ks_tier_name(st[i].tier), st[i].len, st[i].load_ms, ms);
        put++;
    }
    for (int i = 0; i < n; i++) ks_store_state_free(&st[i]);
    free(st);
    if (put == 0) KS_INFO(MOD, "warm start: no stored state to put into the slots");
    else KS_INFO(MOD, "warm start: %d of %d slot(s) warmed in %.1f ms", put, s->n_slots, ks_now_ms() - t0);
}

/*
 * chunk.c — where a prefill's chunks end and what is taken there: the SPC
 * capture, cache pins, cold saves at the store's stride points (cut points
 * from cache/savepoint.c), checkpoints; and the saves of a generation
 * (continued, generation checkpoints). Part of the cache policy (policy.c,
 * sched_int.h).
 *
 * Thread model: the inference thread's.
 */
#include "base/base.h"
#include "cache/savepoint.h"
#include "sched/sched_int.h"

#define MOD "sched"

/* Whether this slot's prefill takes cold saves at all: a store with a stride,
 * and a request that caches (no_store mirrors cache_prompt, set in plan). */
static bool cold_saves(const ks_sched *s, const slot *sl) {
    return s->p.store && s->p.store_stride > 0 && !sl->no_store;
}

int ks__policy_chunk(ks_sched *s, slot *sl, int take, int budget) {
    sreq *r = sl->r;
    int remaining = r->prompt.n - sl->n_past;
    sl->snap_store = -1;
    /* The next snapshot point: the SPC capture or a cache pin, the nearer. */
    int cut = sl->snap_sys > sl->n_past ? sl->snap_sys : -1;
    int pin = ks__policy_pin_next(r, sl->n_past);
    if (pin > 0 && (cut < 0 || pin < cut)) cut = pin;
    if (sl->snap_ckpt > sl->n_past && (cut < 0 || sl->snap_ckpt < cut)) cut = sl->snap_ckpt;
    if (cut > 0 && take > cut - sl->n_past) take = cut - sl->n_past;
    if (!cold_saves(s, sl)) return take;
    ks_savepoint_cfg c = {.stride = s->p.store_stride, .min_tokens = s->p.store_min_tokens};
    if (ks_engine_n_swa(s->e) > 0) {
        /* Sliding window: only restorable lengths are saved (restorable), so
         * every prefill, cold or warm, saves at the last stride boundary of
         * its prompt that is one, its chunk cut there. Other saves rarely
         * land on one, so this is what a conversation's next turn, another
         * slot, process or host finds. */
        int b = r->prompt.n / c.stride * c.stride;
        while (b > sl->n_past && !ks_engine_state_restorable(s->e, b)) b -= c.stride;
        if (b > sl->n_past && b >= c.min_tokens && b - sl->n_past <= take) {
            sl->snap_store = b;
            return b - sl->n_past;
        }
        return take;
    }
    if (take < remaining)
        return ks_savepoint_cut(&c, sl->n_past, take, r->prompt.n, cut, budget, r->res.n_cached, &sl->snap_store);
    return ks_savepoint_cut_last(&c, sl->n_past, take, r->res.n_cached, r->prompt.n, &sl->snap_store);
}

void ks__policy_chunk_done(ks_sched *s, slot *sl) {
    if (sl->n_past == sl->snap_sys) {
        ks__policy_spc_capture(s, sl);
        sl->snap_sys = -1;
    }
    sreq *r = sl->r;
    for (int i = 0; i < r->n_pins; i++)
        if (r->pin_st[i] == PIN_PENDING && r->pins[i].n_tokens == sl->n_past) ks__policy_pin_save(s, sl, r, i);
    /* After a pin at the same point the cold save is a dedup of it. */
    if (sl->n_past == sl->snap_store) ks__policy_save(s, sl, KS_REASON_COLD, false);
    sl->snap_store = -1;
    /* Checkpoints: the system prompt's end, and the prompt's end (the next
     * turn of a chat diverges inside this reply). The prompt's end goes to
     * the store too (a whole state), for a slot, process or host that gets
     * the next turn without this slot's checkpoints. */
    if (sl->n_past == sl->snap_ckpt || sl->n_past == r->prompt.n) ks__ckpt_take(s, sl, false);
    if (s->ckpt_on && sl->n_past == r->prompt.n) ks__policy_save(s, sl, KS_REASON_CHECKPOINT, false);
    if (sl->n_past >= sl->snap_ckpt) sl->snap_ckpt = -1;
}

/* Whether a multiple of every (> 0) is in (a, b]. */
static bool crosses(int a, int b, int every) { return every > 0 && b / every > a / every; }

void ks__policy_token_done(ks_sched *s, slot *sl, int n_before, int n_after) {
    if (s->p.store && crosses(n_before, n_after, s->p.continued_interval) && !sl->no_store)
        ks__policy_save(s, sl, KS_REASON_CONTINUED, false);
    if (s->ckpt_on && crosses(n_before, n_after, s->p.ckpt_gen_interval)) ks__ckpt_take(s, sl, true);
}

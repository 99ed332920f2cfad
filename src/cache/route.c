/*
 * route.c — see route.h.
 *
 * Every scan walks the whole table (n_slots is small: at most 64) and breaks
 * ties on the slot id rather than on the array index, so the decision does
 * not depend on the order in which the caller lists its slots.
 */
#include "cache/route.h"

#include <stdio.h>

#include "base/base.h"
#include "cache/prefix.h"

const char *ks_route_mode_name(int mode) {
    switch (mode) {
    case KS_ROUTE_IMC_HASH: return "imc-hash";
    case KS_ROUTE_IMC_TOKEN_PREFIX: return "imc-token-prefix";
    case KS_ROUTE_PREFIX: return "prefix";
    case KS_ROUTE_MISS: return "miss";
    default: return "?";
    }
}

static bool is_idle(const ks_route_slot *s) { return !s->busy && !s->pending; }

/* Index of the idle empty slot with the lowest id, or -1. */
static int pick_empty(const ks_route_slot *slots, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!is_idle(&slots[i]) || slots[i].n_tokens > 0) continue;
        if (best < 0 || slots[i].id < slots[best].id) best = i;
    }
    return best;
}

/* Index of the least-recently-used idle slot (lowest id on equal times), or -1. */
static int pick_lru(const ks_route_slot *slots, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!is_idle(&slots[i])) continue;
        if (best < 0 || slots[i].last_used_us < slots[best].last_used_us ||
            (slots[i].last_used_us == slots[best].last_used_us && slots[i].id < slots[best].id))
            best = i;
    }
    return best;
}

/* The slot a miss takes when none is empty (route.h invariant 5): the
 * least recently used idle slot of the request's own tenant, else the
 * least recently used idle slot; -1 when none is idle. */
static int pick_victim(const ks_route_slot *slots, int n, uint64_t tenant) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!is_idle(&slots[i]) || slots[i].tenant != tenant) continue;
        if (best < 0 || slots[i].last_used_us < slots[best].last_used_us ||
            (slots[i].last_used_us == slots[best].last_used_us && slots[i].id < slots[best].id))
            best = i;
    }
    return best >= 0 ? best : pick_lru(slots, n);
}

/* Another tenant's slot shares nothing (route.h invariant 4). */
static int common_with(const ks_route_slot *s, const ks_route_req *req) {
    if (s->tenant != req->tenant) return 0;
    return ks_prefix_common(s->tokens, s->n_tokens, req->tokens, req->n_tokens);
}

/* Index of the idle non-empty slot with the longest common prefix (> 0, lowest
 * id on ties), or -1; *n_best receives its length (0 when -1). With log_imc,
 * logs each comparison at debug level ("imc": slot, common prefix, threshold). */
static int pick_longest(const ks_route_slot *slots, int n, const ks_route_req *req, bool log_imc,
                        int *n_best) {
    int best = -1;
    *n_best = 0;
    for (int i = 0; i < n; i++) {
        const ks_route_slot *s = &slots[i];
        if (!is_idle(s) || s->n_tokens <= 0) continue;
        int c = common_with(s, req);
        if (log_imc)
            KS_DEBUG("imc", "slot[%d] common-prefix %d/%d tokens (%d%% salvageable)", s->id, c,
                     s->n_tokens, (int)(100LL * c / s->n_tokens));
        if (c <= 0) continue;
        if (best < 0 || c > *n_best || (c == *n_best && s->id < slots[best].id)) {
            best = i;
            *n_best = c;
        }
    }
    return best;
}

/* IMC hash phase: the idle non-empty slot whose
 * message hash equals the request's hash over the same number of messages,
 * most cached messages first, lowest id on ties; -1 when none. */
static int pick_hash(const ks_route_slot *slots, int n, const ks_route_req *req) {
    if (!req->msg_prefix_hash || req->n_msgs <= 0) return -1;
    int best = -1;
    for (int i = 0; i < n; i++) {
        const ks_route_slot *s = &slots[i];
        if (!is_idle(s) || s->n_tokens <= 0) continue;
        /* 0 cached messages carries no information (raw completion, or the
         * empty prefix every conversation shares). */
        if (s->n_msgs_cached <= 0 || s->n_msgs_cached > req->n_msgs || s->tenant != req->tenant) continue;
        if (req->msg_prefix_hash[s->n_msgs_cached] != s->msg_hash) continue;
        if (best < 0 || s->n_msgs_cached > slots[best].n_msgs_cached ||
            (s->n_msgs_cached == slots[best].n_msgs_cached && s->id < slots[best].id))
            best = i;
    }
    return best;
}

/* Should a match of n_common tokens on slot s give way to a free empty slot?
 * Yes when taking s would destroy most of another conversation (the shared
 * part is under half of s), or when the shared part is no more than the
 * system prompt that the system prompt cache can restore into the empty slot
 * (a few tokens of slack cover the next message's header). */
static bool spares_other(const ks_route_slot *s, int n_common, const ks_route_req *req) {
    if (n_common >= s->n_tokens) return false; /* nothing of s would be lost */
    if (2 * n_common < s->n_tokens) return true;
    return req->spc_tokens > 0 && n_common <= req->spc_tokens + 8;
}

int ks_route_select(const ks_route_slot *slots, int n_slots, const ks_route_req *req,
                    const ks_route_cfg *cfg, ks_route *out) {
    if (!slots || n_slots <= 0 || !req || !cfg || !out || !req->tokens || req->n_tokens <= 0)
        return KS_EINVAL;

    int empty = pick_empty(slots, n_slots);
    int lru = pick_victim(slots, n_slots, req->tenant);
    if (lru < 0) return KS_EBUSY; /* no idle slot at all */

    ks_route r = {.slot = -1, .mode = KS_ROUTE_MISS};
    if (!req->cache_prompt) {
        /* The slot will be cleared: take an empty one so that no cache is lost. */
        int i = empty >= 0 ? empty : lru;
        r.slot = slots[i].id;
        snprintf(r.reason, sizeof r.reason, "cache-disabled");
        *out = r;
        return 0;
    }

    int chosen = -1;
    int n_best = 0; /* longest common prefix seen on a miss path (for "below-threshold") */
    if (!cfg->imc) {
        int best = pick_longest(slots, n_slots, req, false, &n_best);
        /* affinity_min is a float: 0.05f * 100 is 5.0000001, and 5 shared
         * tokens of 100 must count as 5%. Token counts are integers, so a
         * tolerance far below one token changes nothing else. */
        double need = (double)cfg->affinity_min * (double)req->n_tokens - 1e-3;
        /* As for IMC below: a match that would destroy most of another
         * conversation (shared part < half of that slot, typically just a
         * shared system prompt) does not beat a free empty slot — the
         * system prompt cache or the store can fill the empty one. */
        bool keep_other = best >= 0 && empty >= 0 && spares_other(&slots[best], n_best, req);
        if (best >= 0 && (double)n_best >= need && !keep_other) {
            chosen = best;
            r.mode = KS_ROUTE_PREFIX;
        } else if (best >= 0 && (double)n_best >= need) {
            n_best = 0; /* declined on purpose: "no-slot", not "below-threshold" */
        }
    } else {
        int h = pick_hash(slots, n_slots, req);
        if (h >= 0) {
            chosen = h;
            r.mode = KS_ROUTE_IMC_HASH;
            KS_DEBUG("imc", "slot[%d] hash match, %d cached messages of %d", slots[h].id,
                     slots[h].n_msgs_cached, req->n_msgs);
        } else {
            KS_DEBUG("imc", "no slot matched, trying token prefix match");
            int best = pick_longest(slots, n_slots, req, true, &n_best);
            /* Beyond the seed: salvaging a prefix from a slot destroys the
             * rest of its branch. When the shared part is less than half of
             * that slot (typically another sub-agent that shares only a
             * system preamble) and an empty slot is free, keep the other
             * branch alive and build in the empty slot instead. */
            bool keep_other = best >= 0 && empty >= 0 && spares_other(&slots[best], n_best, req);
            if (best >= 0 && n_best >= cfg->cache_min_tokens && !keep_other) {
                chosen = best;
                r.mode = KS_ROUTE_IMC_TOKEN_PREFIX;
                KS_DEBUG("imc", "token prefix match found: slot[%d] %d tokens", slots[best].id,
                         n_best);
            } else if (best >= 0 && n_best >= cfg->cache_min_tokens) {
                KS_DEBUG("imc", "slot[%d] shares only %d of its %d tokens and a slot is empty: "
                         "keeping its branch", slots[best].id, n_best, slots[best].n_tokens);
                n_best = 0;
            } else {
                KS_DEBUG("imc", "no usable token prefix match (best %d, cache_min_tokens %d)",
                         n_best, cfg->cache_min_tokens);
            }
        }
    }

    if (chosen < 0) chosen = empty >= 0 ? empty : lru;
    const ks_route_slot *s = &slots[chosen];
    r.slot = s->id;
    r.n_common = common_with(s, req);
    r.n_reuse = ks_prefix_reuse(r.n_common, req->n_tokens);

    if (r.mode == KS_ROUTE_MISS) {
        /* A taken-over slot is an eviction whatever it shared (chat prompts
         * share at least the start token and the first header); on an empty
         * slot, say whether some slot came close. */
        const char *why = s->n_tokens > 0 ? "evicted" : n_best > 0 ? "below-threshold" : "no-slot";
        snprintf(r.reason, sizeof r.reason, "%s", why);
    } else if (r.n_reuse < req->n_tokens - 1 && r.n_common < s->n_tokens) {
        snprintf(r.reason, sizeof r.reason, "diverged-at-token-%d", r.n_common);
    }
    if (cfg->imc && r.mode == KS_ROUTE_IMC_HASH && r.n_common < s->n_tokens)
        KS_DEBUG("imc", "slot[%d] hash matched but tokens diverge at %d of %d", s->id, r.n_common,
                 s->n_tokens);
    *out = r;
    return 0;
}

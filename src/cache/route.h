/*
 * route.h — which slot a request goes to, and how much of that slot's KV it
 * can keep.
 *
 * Called on the inference thread for each request about to be assigned. The
 * caller snapshots its slot table into ks_route_slot values (borrowed token
 * pointers), calls ks_route_select(), then keeps the chosen slot's KV
 * positions [0, n_reuse), removes the rest, and decodes request tokens
 * [n_reuse, n_tokens).
 *
 * Modes (how the slot was chosen):
 *   imc-hash          incremental message cache: the slot's message-prefix
 *                     hash equals the request's hash over as many messages;
 *                     the slot with the most cached messages wins.
 *   imc-token-prefix  IMC fallback for non-deterministic templates: no hash
 *                     matched, the longest common token prefix is at least
 *                     cache_min_tokens.
 *   prefix            IMC off: same-slot prefix reuse with affinity — the idle
 *                     slot with the longest common prefix, when it covers at
 *                     least affinity_min of the prompt.
 *   miss              none of the above: an empty idle slot, else the
 *                     least-recently-used idle slot (its cache is evicted):
 *                     the request's own tenant's first (invariant 5).
 *
 * Invariants
 *  1. Only idle slots (!busy && !pending) are ever chosen; with none,
 *     KS_EBUSY and the request waits. A caller that marks the chosen slot
 *     pending before routing the next request never routes two requests to
 *     one slot.
 *  2. n_common is the real common token prefix of the chosen slot's tokens and
 *     the request's tokens, whatever the mode: a hash match is a routing hint,
 *     never a reason to trust KV state, so caching cannot change the output.
 *     n_reuse = ks_prefix_reuse(n_common, n_tokens) < n_tokens, so the last
 *     prompt token is always decoded and logits exist.
 *  3. Ties are broken by the lowest slot id; the result depends only on the
 *     inputs, which are not modified.
 *  4. Tenants (docs/SECURITY.md): a slot whose tenant differs from the
 *     request's shares nothing with it — no hash match, n_common 0 whatever
 *     its tokens — so it is chosen only as an empty or LRU slot, with
 *     n_reuse 0, and the reason is the one any miss in that table gets
 *     ("no-slot" or "evicted"; "below-threshold" only from the request's
 *     own tenant's slots). Another tenant's request therefore never learns
 *     from the route (mode, n_common, reason) what a slot holds.
 *  5. Fairness between tenants: a miss that finds no empty slot takes the
 *     least recently used idle slot of the request's own tenant, and
 *     another tenant's only when its own tenant has no idle slot (all of
 *     them busy, or none at all). So a tenant's run of requests evicts its
 *     own slots before anyone else's; with one tenant this is the plain
 *     least recently used slot.
 *
 * Reasons ("why not more was reused"):
 *   ""                    everything reusable was reused: the whole prompt but
 *                         the mandatory last token, or all of the slot's tokens
 *                         (the rest of the prompt is new).
 *   "diverged-at-token-N" partial hit: the slot's tokens differ from the
 *                         prompt at position N = n_common.
 *   "below-threshold"     miss, although some idle slot shared a prefix: it was
 *                         shorter than cache_min_tokens (IMC) or than
 *                         affinity_min of the prompt (IMC off).
 *   "no-slot"             miss, nothing cached matched; an empty slot was used.
 *   "evicted"             miss, nothing cached matched; a non-empty LRU slot
 *                         was taken over.
 *   "cache-disabled"      the request has cache_prompt false: the slot is
 *                         cleared (n_common = n_reuse = 0).
 * On a miss n_reuse may still be > 0 when the chosen slot happens to share a
 * short prefix (e.g. BOS and a system prompt): those tokens are exact and kept.
 *
 * Thread model: pure function of its arguments; safe from any thread as long
 * as the borrowed arrays do not change during the call.
 */
#ifndef KS_CACHE_ROUTE_H
#define KS_CACHE_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

/* One slot as the router sees it. All pointers are borrowed for the call. */
typedef struct ks_route_slot {
    int id;                /* the slot's id, reported back in ks_route.slot */
    bool busy;             /* running a request */
    bool pending;          /* reserved by an earlier routing decision, not started yet */
    const int32_t *tokens; /* exactly the tokens whose KV the slot holds */
    int n_tokens;          /* 0: empty slot */
    int64_t last_used_us;  /* monotonic; the smallest is the LRU */
    uint64_t msg_hash;     /* hash of messages [0, n_msgs_cached) of the branch it holds */
    int n_msgs_cached;     /* 0: unknown (raw completion), never hash-matched */
    uint64_t tenant;       /* whose KV it holds (0: single tenant; invariant 4) */
} ks_route_slot;

typedef struct ks_route_req {
    const int32_t *tokens;          /* the whole prompt, n_tokens >= 1 */
    int n_tokens;
    const uint64_t *msg_prefix_hash; /* n_msgs + 1 entries (ks_msghash_prefixes); NULL for
                                        raw completions */
    int n_msgs;
    bool cache_prompt;              /* false: clear the slot and prefill everything */
    int spc_tokens;                 /* > 0: the system prompt cache holds the prompt's first
                                       spc_tokens tokens, so an empty slot can get them back
                                       for the price of one state restore */
    uint64_t tenant;                /* the request's tenant (invariant 4) */
} ks_route_req;

typedef struct ks_route_cfg {
    bool imc;             /* incremental message cache instead of affinity */
    int cache_min_tokens; /* IMC token-prefix fallback threshold */
    float affinity_min;   /* IMC off: fraction of the prompt a prefix must cover */
} ks_route_cfg;

enum { KS_ROUTE_IMC_HASH = 0, KS_ROUTE_IMC_TOKEN_PREFIX, KS_ROUTE_PREFIX, KS_ROUTE_MISS };

typedef struct ks_route {
    int slot;       /* ks_route_slot.id of the chosen slot */
    int mode;       /* KS_ROUTE_* */
    int n_common;   /* common token prefix of the slot and the prompt */
    int n_reuse;    /* KV tokens to keep: [0, n_reuse) */
    char reason[48];
} ks_route;

/* "imc-hash", "imc-token-prefix", "prefix", "miss"; "?" when unknown. */
const char *ks_route_mode_name(int mode);

/* Chooses the slot for req among slots[0, n_slots). Writes *out on success.
 * Returns 0; KS_EBUSY when no slot is idle (busy or pending everywhere);
 * KS_EINVAL for NULL slots/req/cfg/out, n_slots <= 0 or req->n_tokens <= 0
 * (or NULL req->tokens). Logs the IMC decisions at debug level ("imc"). */
int ks_route_select(const ks_route_slot *slots, int n_slots, const ks_route_req *req,
                    const ks_route_cfg *cfg, ks_route *out);

#endif

/*
 * msghash.h — hashes of chat-message prefixes, for slot routing (IMC) and the
 * system prompt cache key (SPC).
 *
 * A conversation branch is identified by the hash of its first k messages.
 * The hash is chained, so the hashes of every prefix of a request come out of
 * one pass: out[k + 1] = XXH3_64(encode(role_k, content_k), seed = out[k]).
 *
 * Invariants
 *  1. Prefix property: hashing messages[0, k) alone gives exactly out[k] of any
 *     longer conversation that starts with the same k messages.
 *  2. No boundary collisions by construction: each field is written with its
 *     length (u64 little-endian) before its bytes and the role is followed by
 *     a 0 byte, so ("ab", "c") and ("a", "bc") encode differently, and so do
 *     role/content swaps. A NULL string is encoded with a distinct length
 *     marker, so NULL and "" differ (an assistant message with tool calls
 *     and no content is not the same as an empty reply).
 *  3. The values are stable across runs and machines (XXH3 is defined on
 *     bytes), so they can be logged and compared between processes. They are
 *     64-bit hashes, not proofs: whoever restores KV state by hash must still
 *     compare tokens (route.c does: n_common is always the real token prefix).
 *
 * Thread model: no state; safe from any thread.
 */
#ifndef KS_CACHE_MSGHASH_H
#define KS_CACHE_MSGHASH_H

#include <stdint.h>

/* out[0] for every conversation: the hash of the empty prefix. */
uint64_t ks_msghash_empty(void);

/* Writes n_msgs + 1 values: out[k] = hash of messages [0, k), for k in
 * [0, n_msgs]. roles and contents hold n_msgs strings each (a string may be
 * NULL; the arrays may be NULL when n_msgs <= 0). out is caller-owned and
 * must hold n_msgs + 1 entries (only out[0] is written when n_msgs <= 0). */
void ks_msghash_prefixes(const char *const *roles, const char *const *contents, int n_msgs,
                         uint64_t *out);

/* The SPC key of a system prompt: a hash of (model_id, role, content), in a
 * domain separate from ks_msghash_prefixes(). model_id identifies everything
 * besides the text that makes KV state differ (model fingerprint, template,
 * context parameters); any argument may be NULL. */
uint64_t ks_msghash_system(const char *role, const char *content, const char *model_id);
/* h in a tenant's namespace (docs/SECURITY.md "Tenants"): h itself for
 * tenant 0 (single tenant), else a hash of (h, tenant) in a domain of its
 * own, never 0. The scheduler passes every message-prefix hash and SPC key
 * of a tenant's request through it, so one tenant's hashes name nothing of
 * another's; they are routing hints, and the router compares the tenants
 * themselves too (route.h invariant 4). */
uint64_t ks_msghash_tenant(uint64_t h, uint64_t tenant);

#endif

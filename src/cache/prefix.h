/*
 * prefix.h — token-prefix arithmetic for KV reuse.
 *
 * Owns nothing: pure functions over caller arrays.
 *
 * Invariants the callers rely on
 *  1. ks_prefix_common(a, na, b, nb) <= min(na, nb), and a[i] == b[i] for every
 *     i below it.
 *  2. ks_prefix_reuse() never returns the whole new prompt: at least one prompt
 *     token is always decoded, because the next-token logits only exist for a
 *     token that went through llama_decode in this request.
 *  3. Every result is >= 0.
 *
 * Thread model: no state; safe from any thread.
 */
#ifndef KS_CACHE_PREFIX_H
#define KS_CACHE_PREFIX_H

#include <stdint.h>

/* Length of the longest common prefix of a[0, na) and b[0, nb). A NULL array
 * or a count <= 0 counts as empty (result 0). */
int ks_prefix_common(const int32_t *a, int na, const int32_t *b, int nb);

/* Number of KV tokens to keep when a slot shares n_common tokens with a new
 * prompt of n_new_prompt tokens: min(n_common, n_new_prompt - 1), clamped to
 * >= 0. The caller keeps positions [0, result) and decodes [result, n_new_prompt). */
int ks_prefix_reuse(int n_common, int n_new_prompt);

/* n rounded down to a multiple of stride (n for stride <= 0; 0 for n <= 0). */
int ks_prefix_align_down(int n, int stride);

#endif

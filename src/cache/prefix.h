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

#include <stdbool.h>
#include <stdint.h>

/* Length of the longest common prefix of a[0, na) and b[0, nb). A NULL array
 * or a count <= 0 counts as empty (result 0). */
int ks_prefix_common(const int32_t *a, int na, const int32_t *b, int nb);

/* Number of KV tokens to keep when a slot shares n_common tokens with a new
 * prompt of n_new_prompt tokens: min(n_common, n_new_prompt - 1), clamped to
 * >= 0. The caller keeps positions [0, result) and decodes [result, n_new_prompt). */
int ks_prefix_reuse(int n_common, int n_new_prompt);

/* Token bookkeeping after generation: how many tokens a sequence's KV holds
 * after a request that prefilled n_prompt tokens and generated n_generated
 * (end-of-generation tokens are never counted). Every generated token is fed
 * back through llama_decode before the next one is sampled, except the last:
 * so the KV holds the prompt and all generated tokens but the last one —
 * unless generation ended by sampling an end-of-generation token
 * (ended_eog), after which every counted token was fed back. The last
 * sampled token is therefore never in the KV, and a next turn that starts
 * with it decodes it as part of its new tokens. */
int ks_prefix_kv_after(int n_prompt, int n_generated, bool ended_eog);

/* n rounded down to a multiple of stride (n for stride <= 0; 0 for n <= 0). */
int ks_prefix_align_down(int n, int stride);

#endif

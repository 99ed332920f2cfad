/*
 * overflow.h — which old chat turns to drop so that a conversation fits the
 * context (the chat CLI's policy when the history outgrows n_ctx).
 *
 * Policy
 *  1. messages[0] is kept when its role is "system" (and it is not also the
 *     last message).
 *  2. Whole turns are dropped, oldest first: a turn starts at a "user" message
 *     and runs up to the next "user" message (the assistant reply and any tool
 *     messages in between go with it). A leading non-user message left over
 *     after the system prompt is dropped as the start of the oldest turn.
 *  3. The last message (the new user message) is never dropped.
 *  4. The kept set is always system? + messages[first_kept, n_msgs); first_kept
 *     is either the last message or a "user" message.
 *
 * Thread model: no state; safe from any thread (count_tokens runs on the
 * calling thread).
 */
#ifndef KS_CACHE_OVERFLOW_H
#define KS_CACHE_OVERFLOW_H

/* Returns the number of tokens of the rendered prompt made of the system
 * message (when messages[0] is one) and messages [first_kept, n_msgs), or a
 * negative KS_E* code on failure (returned as is by ks_overflow_plan()). */
typedef int (*ks_overflow_count_fn)(void *ud, int first_kept, int n_msgs);

/* Finds the smallest number of oldest turns to drop so that the rendering
 * fits in budget tokens. roles holds n_msgs strings (NULL counts as neither
 * "system" nor "user"). On success *first_kept is the index of the first
 * kept non-system message: 1 (system present) or 0 when nothing is dropped,
 * n_msgs - 1 at most.
 * Returns 0; KS_ECTX when even system? + the last message does not fit;
 * KS_EINVAL for n_msgs <= 0 or NULL roles/count_tokens/first_kept; or the
 * negative code count_tokens returned. *first_kept is written only on success. */
int ks_overflow_plan(int n_msgs, const char *const *roles, ks_overflow_count_fn count_tokens,
                     void *ud, int budget, int *first_kept);

#endif

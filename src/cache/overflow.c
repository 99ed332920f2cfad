/*
 * overflow.c — see overflow.h.
 *
 * The scan is linear in the number of turns, one count_tokens call per
 * candidate: rendering is not guaranteed to shrink by a predictable amount
 * per dropped turn (templates add per-turn framing), so the first fitting
 * cut is found by trying each cut in order rather than by arithmetic.
 */
#include "cache/overflow.h"

#include <string.h>

#include "base/base.h"

static bool role_is(const char *role, const char *want) { return role && strcmp(role, want) == 0; }

int ks_overflow_plan(int n_msgs, const char *const *roles, ks_overflow_count_fn count_tokens,
                     void *ud, int budget, int *first_kept) {
    if (n_msgs <= 0 || !roles || !count_tokens || !first_kept) return KS_EINVAL;
    int last = n_msgs - 1;
    /* A lone system message is also the last message: nothing to keep apart. */
    int first = (n_msgs > 1 && role_is(roles[0], "system")) ? 1 : 0;
    for (;;) {
        int n = count_tokens(ud, first, n_msgs);
        if (n < 0) return n;
        if (n <= budget) {
            *first_kept = first;
            return 0;
        }
        if (first >= last) return KS_ECTX;
        /* Drop the turn starting at `first`: advance to the next user message
         * (or to the last message, which is kept whatever its role). */
        first++;
        while (first < last && !role_is(roles[first], "user")) first++;
    }
}

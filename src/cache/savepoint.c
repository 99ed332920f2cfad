/*
 * savepoint.c — see savepoint.h.
 */
#include "cache/savepoint.h"

#include <stddef.h>

#include "cache/prefix.h"

int ks_savepoint_steps(int pos, int n, int sys, int budget) {
    int steps = 0;
    if (sys > pos && sys < n) {
        steps = (sys - pos + budget - 1) / budget;
        pos = sys;
    }
    return steps + (n - pos + budget - 1) / budget;
}

/* Where a chunk [pos, end) that is not the last of the prompt (n tokens) can
 * end for a cold save: its last stride boundary b, when b is after pos, at
 * least min_tokens, and the tokens moved from this chunk to the next ones
 * cost no decode step at this budget. -1: nowhere. */
static int chunk_point(const ks_savepoint_cfg *c, int pos, int end, int n, int sys, int budget) {
    int b = ks_prefix_align_down(end, c->stride);
    if (b <= pos || b < c->min_tokens) return -1;
    if (ks_savepoint_steps(b, n, sys, budget) != ks_savepoint_steps(end, n, sys, budget)) return -1;
    return b;
}

int ks_savepoint_last(const ks_savepoint_cfg *c, int n_cached, int n_prompt) {
    if (n_cached >= c->stride) return -1;
    int b = ks_prefix_align_down(n_prompt - 1, c->stride);
    return b >= c->min_tokens ? b : -1;
}

int ks_savepoint_cut(const ks_savepoint_cfg *c, int pos, int take, int n, int sys, int budget,
                     int n_cached, int *save_at) {
    *save_at = -1;
    if (n_cached >= c->stride) return take; /* a warm prefill: the finish save follows (rule 1) */
    int b = chunk_point(c, pos, pos + take, n, sys, budget);
    if (b < 0) return take;
    /* Look ahead at the chunks this budget gives: a later one that saves
     * (rule 1), or a cold prefill's cut last chunk (rule 2), takes the save. */
    for (int p = pos + take;;) {
        int end = p + budget;
        if (sys > p && end > sys) end = sys;
        if (end >= n) {
            if (ks_savepoint_last(c, n_cached, n) > p) return take;
            break;
        }
        if (chunk_point(c, p, end, n, sys, budget) >= 0) return take;
        p = end;
    }
    *save_at = b;
    return b - pos;
}

int ks_savepoint_cut_last(const ks_savepoint_cfg *c, int pos, int take, int n_cached, int n_prompt,
                          int *save_at) {
    *save_at = -1;
    int b = ks_savepoint_last(c, n_cached, n_prompt);
    if (b <= pos || b >= pos + take) return take;
    *save_at = b;
    return b - pos;
}

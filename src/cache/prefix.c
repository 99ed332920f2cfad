/*
 * prefix.c — see prefix.h.
 */
#include "cache/prefix.h"

#include <stddef.h>

int ks_prefix_common(const int32_t *a, int na, const int32_t *b, int nb) {
    if (!a || !b || na <= 0 || nb <= 0) return 0;
    int n = na < nb ? na : nb;
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

int ks_prefix_reuse(int n_common, int n_new_prompt) {
    int r = n_common < n_new_prompt - 1 ? n_common : n_new_prompt - 1;
    return r > 0 ? r : 0;
}

int ks_prefix_align_down(int n, int stride) {
    if (n <= 0) return 0;
    if (stride <= 0) return n;
    return n - n % stride;
}

int ks_prefix_kv_after(int n_prompt, int n_generated, bool ended_eog) {
    if (n_prompt < 0) n_prompt = 0;
    if (n_generated <= 0) return n_prompt;
    return n_prompt + (ended_eog ? n_generated : n_generated - 1);
}

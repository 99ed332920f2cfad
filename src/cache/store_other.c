/*
 * store_other.c — ks_store_other_kv (store.h): a miss that a state saved
 * with other K/V cache types would have served says so, instead of reading
 * as a plain miss. Such a state is never restored (its key is another:
 * the types are in the kv-params a key hashes, key.h); it is only named.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/kvparams.h"
#include "cache/store_int.h"

/* Candidate lengths at most: the longest foreign ones. */
#define OTHER_LENS_MAX 64

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int ks_store_other_kv(ks_store *s, uint64_t tenant, const int32_t *tokens, int min_len, int max_len, char *types,
                      size_t n) {
    if (!s || !tokens || max_len < 1 || !types || n == 0) return 0;
    types[0] = '\0';
    if (min_len < 1) min_len = 1;
    /* The lengths of this model's foreign entries (other params) up to
     * max_len: none, nothing to ask. Only the file tiers hold foreign
     * entries (a directory other processes share; the ram tier is this
     * store's own). */
    enum { CAP = 4096 };
    int *all = malloc(CAP * sizeof *all);
    if (!all) return 0;
    int k = 0;
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK; t++)
        if (s->tiers[t]) ks_tier_foreign_lengths(s->tiers[t], s->fp, max_len, all, &k, CAP);
    int best = 0;
    char own[64] = "";
    ks_key *keys = NULL;
    char *alt = NULL;
    /* Ascending, distinct, at least min_len; the OTHER_LENS_MAX longest. */
    qsort(all, (size_t)k, sizeof *all, int_cmp);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (all[i] >= min_len && (u == 0 || all[u - 1] != all[i])) all[u++] = all[i];
    const int *lens = u > OTHER_LENS_MAX ? all + (u - OTHER_LENS_MAX) : all;
    if (u > OTHER_LENS_MAX) u = OTHER_LENS_MAX;
    if (u == 0) goto done;
    size_t cap = s->kv_len + 64;
    if (!(keys = malloc((size_t)u * sizeof *keys)) || !(alt = malloc(cap))) goto done;
    if (!ks_kvparams_type_pair(s->kv_params, s->kv_len, own, sizeof own)) goto done;
    for (int a = 0; a < KS_KVPARAMS_N_TYPES; a++)
        for (int b = 0; b < KS_KVPARAMS_N_TYPES; b++) {
            int len = ks_kvparams_with_types(s->kv_params, s->kv_len, ks_kvparams_types[a], ks_kvparams_types[b],
                                             alt, cap);
            if (len < 0 || ((size_t)len == s->kv_len && memcmp(alt, s->kv_params, s->kv_len) == 0)) continue;
            if (ks_key_prefixes_tenant(s->fp, alt, (size_t)len, tenant, tokens, lens[u - 1], lens, u, keys)) continue;
            for (int i = u - 1; i >= 0 && lens[i] > best; i--) {
                bool found = false;
                for (int t = KS_TIER_SHM; t <= KS_TIER_DISK && !found; t++) {
                    ks_tier_entry e;
                    found = s->tiers[t] && ks_tier_has(s->tiers[t], &keys[i], &e) && e.cls == KS_ENTRY_FOREIGN &&
                            memcmp(e.model_fp, s->fp, 32) == 0;
                }
                if (!found) continue;
                best = lens[i];
                ks_kvparams_type_pair(alt, (size_t)len, types, n);
                break;
            }
        }
done:
    if (best > 0) {
        atomic_fetch_add(&s->kv_type_misses, 1);
        KS_DEBUG("store", "lookup: a state of %d tokens is stored with K/V types %s (this store's: %s): never "
                          "restored here", best, types, own);
    }
    free(all);
    free(keys);
    free(alt);
    return best;
}

/*
 * store_lookup.c — longest-prefix lookups (see store.h): the candidate
 * lengths are every stride multiple and every stored length, longest
 * first; saves not written yet are probed before the tiers (read your own
 * writes, store.c).
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/store_int.h"

/* ----------------------------------------------------------------- lookup */
void ks_store_hit_free(ks_store_hit *hit) {
    if (!hit) return;
    ks_tier_blob_release(&hit->blob_);
    memset(hit, 0, sizeof *hit);
    hit->tier = KS_TIER_NONE;
}

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Asks the writer to move the storage of a bad entry of tier t aside (file
 * tiers) or delete it (redis). */
static void queue_quarantine(ks_store *s, int t, const ks_key *key) {
    job *j = calloc(1, sizeof *j);
    if (!j) return;
    j->kind = JOB_QUARANTINE;
    j->tier = (ks_tier_id)t;
    j->key = *key;
    j->refs = 1;
    pthread_mutex_lock(&s->mu);
    if (s->stopping)
        free(j);
    else
        ks__store_enqueue_locked(s, j);
    pthread_mutex_unlock(&s->mu);
}

static void warn_bad(int t, const ks_key *key, int L, int rc) {
    char hex[KS_KEY_HEX_LEN + 1];
    ks_key_to_hex(key, hex);
    KS_WARN("store", "%s entry %.12s (%d tokens) failed to load: %s; treated as a miss", ks_tier_name(t),
            hex, L, ks_strerror(rc));
}

/* Hides a bad entry and asks the writer to move its file aside. */
static void report_bad(ks_store *s, int t, const ks_key *key, int L, int rc) {
    if (!ks_tier_mark_bad(s->tiers[t], key)) return; /* someone else reported it */
    atomic_fetch_add(&s->corrupt_files, 1);
    warn_bad(t, key, L, rc);
    queue_quarantine(s, t, key);
}

ks_kvfile_expect ks__store_expect(const ks_store *s, const ks_key *key, const int32_t *tokens, int n) {
    ks_kvfile_expect exp = {
        .model_fp = s->fp,
        .params_hash = s->params_hash,
        .check_state_version = true,
        .state_version = s->state_version,
        .key = key,
        .tokens = tokens,
        .n_tokens = n,
        .mac = s->has_mac ? &s->mac : NULL,
    };
    return exp;
}

/* Fills hit from its blob, loaded from tier t since t0. */
static void fill_hit(ks_store *s, ks_store_hit *hit, int n, int t, int reason, double t0) {
    hit->n_tokens = n;
    hit->tier = (ks_tier_id)t;
    hit->reason = (ks_reason)reason;
    hit->payload = hit->blob_.payload;
    hit->payload_len = hit->blob_.len;
    hit->load_ms = ks_now_ms() - t0;
    ks__store_add_ms(&s->load_us, hit->load_ms);
}

/* The entry of key (tokens[0, n)) from the first local tier that holds it
 * and verifies: 0 and hit filled, else KS_ENOENT (a bad entry is reported). */
static int tiers_get(ks_store *s, const ks_key *key, const int32_t *tokens, int n, ks_store_hit *hit) {
    for (int t = 0; t < KS_TIER__LOCAL; t++) {
        ks_tier_entry e;
        if (!s->tiers[t] || !ks_tier_has(s->tiers[t], key, &e)) continue;
        if (e.cls == KS_ENTRY_FOREIGN) continue;
        ks_kvfile_expect exp = ks__store_expect(s, key, tokens, n);
        double t0 = ks_now_ms();
        int r = ks_tier_get(s->tiers[t], key, &exp, &hit->blob_);
        if (r == 0) {
            fill_hit(s, hit, n, t, e.reason, t0);
            return 0;
        }
        if (r == KS_ECORRUPT || r == KS_EVERSION || r == KS_EMISMATCH)
            report_bad(s, t, key, n, r);
        else if (r != KS_ENOENT)
            KS_WARN("store", "%s entry of %d tokens could not be read: %s", ks_tier_name(t), n, ks_strerror(r));
    }
    return KS_ENOENT;
}

/* The redis entry of key (tokens[0, n)) whose manifest a probe found: 0 and
 * hit filled, else KS_ENOENT. A broken entry (a chunk missing) or a bad one
 * is a miss and is deleted by the writer. */
static int redis_get(ks_store *s, const ks_key *key, const ks_tier_found *m, const int32_t *tokens, int n,
                     ks_store_hit *hit) {
    ks_tier *rt = s->tiers[KS_TIER_REDIS];
    if (m->n_tokens != (uint32_t)n) return KS_ENOENT;
    ks_kvfile_expect exp = ks__store_expect(s, key, tokens, n);
    double t0 = ks_now_ms();
    int r = ks_tier_fetch(rt, key, m, &exp, &hit->blob_);
    if (r == 0) {
        fill_hit(s, hit, n, KS_TIER_REDIS, (int)m->reason, t0);
        return 0;
    }
    if (r == KS_ECORRUPT || r == KS_EVERSION || r == KS_EMISMATCH) {
        atomic_fetch_add(&s->corrupt_files, 1);
        warn_bad(KS_TIER_REDIS, key, n, r);
        queue_quarantine(s, KS_TIER_REDIS, key);
    } else if (r == KS_ENOENT) {
        KS_INFO("store", "redis entry of %d tokens has lost a chunk (evicted or expired): a miss", n);
        queue_quarantine(s, KS_TIER_REDIS, key);
    } else if (r != KS_EBUSY) {
        KS_DEBUG("store", "redis entry of %d tokens could not be read: %s", n, ks_strerror(r));
    }
    return KS_ENOENT;
}

/* Whether a save not written yet, a prefetched state or a local tier holds
 * key: a lookup then needs nothing of Redis at that length or below. */
static bool held_locally(ks_store *s, const ks_key *key) {
    pthread_mutex_lock(&s->mu);
    bool queued = ks_keymap_get(&s->pending, key) != NULL;
    for (int i = 0; i < s->n_pf && !queued; i++) queued = ks_key_eq(&s->pf[i].key, key);
    pthread_mutex_unlock(&s->mu);
    if (queued) return true;
    for (int t = 0; t < KS_TIER__LOCAL; t++) {
        ks_tier_entry e;
        if (s->tiers[t] && ks_tier_has(s->tiers[t], key, &e) && e.cls != KS_ENTRY_FOREIGN) return true;
    }
    return false;
}

/* A queued save of key (tokens[0, n)), also one the writer is writing right
 * now: copies its payload into hit (0), else KS_ENOENT. */
static int pending_get(ks_store *s, const ks_key *key, const int32_t *tokens, int n, ks_store_hit *hit) {
    int rc = KS_ENOENT;
    double t0 = ks_now_ms();
    pthread_mutex_lock(&s->mu);
    job *j = ks_keymap_get(&s->pending, key);
    if (!j || j->kind != JOB_SAVE || j->done || j->n != n ||
        memcmp(j->tokens, tokens, (size_t)n * sizeof *tokens) != 0) {
        /* nothing queued (or a 256-bit key collision: never restore it) */
    } else if (j->payload) {
        uint8_t *copy = malloc(j->len ? j->len : 1);
        if (!copy) {
            rc = KS_ENOMEM;
        } else {
            memcpy(copy, j->payload, j->len);
            hit->blob_.owner_ = copy;
            hit->blob_.release_ = NULL; /* a plain copy: released by free() */
            hit->blob_.payload = copy;
            hit->blob_.len = j->len;
            hit->n_tokens = n;
            hit->tier = j->tier;
            hit->reason = j->reason;
            hit->payload = copy;
            hit->payload_len = j->len;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == 0) {
        hit->load_ms = ks_now_ms() - t0;
        ks__store_add_ms(&s->load_us, hit->load_ms);
        atomic_fetch_add(&s->pending_hits, 1);
        KS_DEBUG("store", "lookup: %d tokens from the save queue (%s, not written yet)", n, ks_tier_name(hit->tier));
    }
    return rc;
}

/* ------------------------------------------------------------- prefetch */
/* Removes pf[i] (mu held); its memory goes to the caller's *out or is freed. */
static void pf_remove_locked(ks_store *s, int i, prefetched *out) {
    prefetched e = s->pf[i];
    memmove(&s->pf[i], &s->pf[i + 1], (size_t)(s->n_pf - i - 1) * sizeof *s->pf);
    s->n_pf--;
    s->pf_bytes -= e.blob.len;
    if (out) {
        *out = e;
        return;
    }
    ks_tier_blob_release(&e.blob);
    free(e.tokens);
}

/* Drops the states older than KS_PREFETCH_AGE_MS (mu held). */
static void pf_expire_locked(ks_store *s, double now) {
    while (s->n_pf > 0 && now - s->pf[0].t_ms > KS_PREFETCH_AGE_MS) {
        pf_remove_locked(s, 0, NULL);
        atomic_fetch_add(&s->prefetch_dropped, 1);
    }
}

void ks__store_prefetch_clear(ks_store *s) {
    pthread_mutex_lock(&s->mu);
    while (s->n_pf > 0) pf_remove_locked(s, 0, NULL);
    pthread_mutex_unlock(&s->mu);
}

/* Keeps hit (of key) for a lookup: takes its blob (hit is zeroed). Oldest
 * states make room; the newest always stays. */
static void pf_keep(ks_store *s, const ks_key *key, const int32_t *tokens, ks_store_hit *hit, double fetch_ms) {
    int32_t *tk = malloc((size_t)hit->n_tokens * sizeof *tk);
    if (!tk) {
        ks_store_hit_free(hit);
        atomic_fetch_add(&s->prefetch_dropped, 1);
        return;
    }
    memcpy(tk, tokens, (size_t)hit->n_tokens * sizeof *tk);
    prefetched e = {.key = *key, .n = hit->n_tokens, .tokens = tk, .blob = hit->blob_, .reason = hit->reason,
                    .t_ms = ks_now_ms(), .fetch_ms = fetch_ms};
    memset(hit, 0, sizeof *hit);
    hit->tier = KS_TIER_NONE;
    pthread_mutex_lock(&s->mu);
    pf_expire_locked(s, e.t_ms);
    for (int i = 0; i < s->n_pf; i++)
        if (ks_key_eq(&s->pf[i].key, key)) { /* another request fetched it meanwhile */
            pthread_mutex_unlock(&s->mu);
            ks_tier_blob_release(&e.blob);
            free(tk);
            atomic_fetch_add(&s->prefetch_dropped, 1);
            return;
        }
    while (s->n_pf > 0 && (s->n_pf == KS_PREFETCH_MAX || s->pf_bytes + e.blob.len > s->queue_max_bytes)) {
        pf_remove_locked(s, 0, NULL);
        atomic_fetch_add(&s->prefetch_dropped, 1);
    }
    s->pf[s->n_pf++] = e;
    s->pf_bytes += e.blob.len;
    pthread_mutex_unlock(&s->mu);
}

/* The prefetched state of key (tokens[0, n)): moved into hit (0), else
 * KS_ENOENT. */
static int pf_take(ks_store *s, const ks_key *key, const int32_t *tokens, int n, ks_store_hit *hit) {
    prefetched e;
    bool got = false;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_pf; i++)
        if (ks_key_eq(&s->pf[i].key, key) && s->pf[i].n == n &&
            memcmp(s->pf[i].tokens, tokens, (size_t)n * sizeof *tokens) == 0) {
            pf_remove_locked(s, i, &e);
            got = true;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    if (!got) return KS_ENOENT;
    free(e.tokens);
    hit->blob_ = e.blob;
    fill_hit(s, hit, n, KS_TIER_REDIS, (int)e.reason, ks_now_ms());
    hit->prefetch_ms = e.fetch_ms;
    atomic_fetch_add(&s->prefetch_used, 1);
    return 0;
}

void ks_store_set_remote_prefetch(ks_store *s, bool on) {
    if (s) atomic_store(&s->remote_prefetch, on);
}

/* The manifests Redis holds for the candidate lengths of a lookup. */
typedef struct remote_found {
    bool *found;               /* [k]: a manifest for lens[i] */
    ks_tier_found *mans;       /* [k] */
} remote_found;

/* The longest length Redis may hold beyond what a local tier holds is worth
 * asking about; one pipelined round trip asks for the manifests of every
 * such candidate length, and for the lengths of the model's entries in
 * Redis (states saved at any length by other hosts, e.g. `finish`). Lengths
 * found that way, longer than every manifest found, get a second round trip
 * and are tried here, longest first: 0 and *hit (of *hit_key) on a hit. Otherwise *rf
 * holds the manifests for the caller's walk and KS_ENOENT is returned (or
 * KS_ENOMEM). Redis unreachable: KS_ENOENT and nothing found. */
static int redis_probe(ks_store *s, uint64_t tenant, const int32_t *tokens, const int *lens, const ks_key *keys, int k,
                       int min_len, int lim, remote_found *rf, ks_store_hit *hit, ks_key *hit_key) {
    enum { XCAP = 4096 };
    ks_tier *rt = s->tiers[KS_TIER_REDIS];
    int rc = KS_ENOENT, above = 0, first = k, nx = 0;
    int *xl = NULL;
    ks_key *xkeys = NULL;
    ks_tier_found *xmans = NULL;
    bool *xfound = NULL;
    for (int i = k - 1; i >= 0 && lens[i] >= min_len; i--)
        if (held_locally(s, &keys[i])) {
            above = lens[i];
            break;
        }
    int lo = above + 1 > min_len ? above + 1 : min_len;
    if (lo > lim) return KS_ENOENT;
    while (first > 0 && lens[first - 1] >= lo) first--;
    if (!(rf->found = calloc((size_t)k + 1, sizeof *rf->found)) || !(rf->mans = calloc((size_t)k + 1, sizeof *rf->mans)) ||
        !(xl = malloc(XCAP * sizeof *xl))) {
        rc = KS_ENOMEM;
        goto done;
    }
    if (ks_tier_probe(rt, keys + first, k - first, rf->mans + first, rf->found + first, lo, lim, xl, &nx,
                            XCAP) != 0)
        goto done;
    int best = 0;
    for (int i = k - 1; i >= first; i--)
        if (rf->found[i] && rf->mans[i].n_tokens == (uint32_t)lens[i]) {
            best = lens[i];
            break;
        }
    /* The remote lengths longer than every manifest found and not asked yet. */
    int u = 0;
    qsort(xl, (size_t)nx, sizeof *xl, int_cmp);
    for (int i = 0; i < nx; i++) {
        if (xl[i] <= best || (u > 0 && xl[u - 1] == xl[i])) continue;
        if (bsearch(&xl[i], lens, (size_t)k, sizeof *lens, int_cmp)) continue;
        xl[u++] = xl[i];
    }
    if (u == 0) goto done;
    if (!(xkeys = malloc((size_t)u * sizeof *xkeys)) || !(xmans = calloc((size_t)u, sizeof *xmans)) ||
        !(xfound = calloc((size_t)u, sizeof *xfound))) {
        rc = KS_ENOMEM;
        goto done;
    }
    if (ks_key_prefixes_tenant(s->fp, s->kv_params, s->kv_len, tenant, tokens, lim, xl, u, xkeys) != 0 ||
        ks_tier_probe(rt, xkeys, u, xmans, xfound, 0, 0, NULL, NULL, 0) != 0)
        goto done;
    for (int i = u - 1; i >= 0; i--)
        if (xfound[i] && redis_get(s, &xkeys[i], &xmans[i], tokens, xl[i], hit) == 0) {
            *hit_key = xkeys[i];
            rc = 0;
            goto done;
        }
done:
    free(xl);
    free(xkeys);
    free(xmans);
    free(xfound);
    return rc;
}

/* The candidate lengths of a lookup of tokens[0, lim), ascending, and their
 * keys: every stride multiple, every length a tier holds, of the saves not
 * written yet and of the prefetched states. 0 with *lens, *keys (malloc'd;
 * both NULL when *k is 0), or KS_ENOMEM. */
static int candidates(ks_store *s, uint64_t tenant, const int32_t *tokens, int lim, int **lens_out, ks_key **keys_out,
                      int *k_out) {
    int k = 0;
    int *lens = NULL;
    ks_key *keys = NULL;
    *lens_out = NULL;
    *keys_out = NULL;
    *k_out = 0;
    uint64_t n_entries = 0;
    for (int t = 0; t < KS_TIER__N; t++) {
        uint64_t e = 0;
        if (s->tiers[t]) ks_tier_usage(s->tiers[t], NULL, &e);
        n_entries += e;
    }
    int n_stride = s->cfg.stride > 0 ? lim / s->cfg.stride : 0;
    pthread_mutex_lock(&s->mu);
    int n_queued = (int)s->pending.n + s->n_pf;
    pthread_mutex_unlock(&s->mu);
    /* Entries may be added while we collect: the cap just truncates. */
    int cap = n_stride + (int)(n_entries < (uint64_t)INT_MAX / 2 ? n_entries : (uint64_t)INT_MAX / 2) + n_queued + 16;
    if (!(lens = malloc((size_t)cap * sizeof *lens))) return KS_ENOMEM;
    for (int i = 1; i <= n_stride; i++) lens[k++] = i * s->cfg.stride;
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) ks_tier_lengths(s->tiers[t], lim, lens, &k, cap);
    /* The lengths of saves not written yet too: queued, or being written
     * (out of the queue already, still in `pending` until they complete);
     * and of the prefetched states. */
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->pending.cap && k < cap; i++) {
        if (!ks_keymap_live(&s->pending, i)) continue;
        const job *q = s->pending.vals[i];
        if (q->kind == JOB_SAVE && q->n <= lim) lens[k++] = q->n;
    }
    for (int i = 0; i < s->n_pf && k < cap; i++)
        if (s->pf[i].n <= lim) lens[k++] = s->pf[i].n;
    pthread_mutex_unlock(&s->mu);
    if (k == 0) {
        free(lens);
        return 0;
    }
    qsort(lens, (size_t)k, sizeof *lens, int_cmp);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (u == 0 || lens[i] != lens[u - 1]) lens[u++] = lens[i];
    k = u;
    if (!(keys = malloc((size_t)k * sizeof *keys))) {
        free(lens);
        return KS_ENOMEM;
    }
    int kr = ks_key_prefixes_tenant(s->fp, s->kv_params, s->kv_len, tenant, tokens, lim, lens, k, keys);
    if (kr != 0) {
        free(lens);
        free(keys);
        return kr;
    }
    *lens_out = lens;
    *keys_out = keys;
    *k_out = k;
    return 0;
}

/* One walk over the candidate lengths, longest first. 0 with *hit filled, or
 * KS_ENOENT / KS_ENOMEM. Redis is asked here only when prefetching is off. */
static int probe(ks_store *s, uint64_t tenant, const int32_t *tokens, int min_len, int lim, ks_store_hit *hit) {
    int rc = KS_ENOENT, k = 0;
    remote_found remote = {0};
    int *lens = NULL;
    ks_key *keys = NULL;
    int cr = candidates(s, tenant, tokens, lim, &lens, &keys, &k);
    if (cr != 0 || k == 0) return cr ? cr : KS_ENOENT;
    ks_tier *rt = s->tiers[KS_TIER_REDIS];
    if (rt && !atomic_load(&s->remote_prefetch) && ks_tier_up(rt)) {
        ks_key hk;
        int r = redis_probe(s, tenant, tokens, lens, keys, k, min_len, lim, &remote, hit, &hk);
        if (r == 0 || r == KS_ENOMEM) {
            rc = r;
            goto done;
        }
    }
    for (int i = k - 1; i >= 0 && lens[i] >= min_len; i--) {
        /* A prefetched state or a save not written yet first (read your own
         * writes), then the tiers: the writer puts an entry into its tier
         * before the job leaves `pending`, so a save completing between the
         * two checks is found by one of them (the other order could miss it
         * in both). */
        if (pf_take(s, &keys[i], tokens, lens[i], hit) == 0 || pending_get(s, &keys[i], tokens, lens[i], hit) == 0 ||
            tiers_get(s, &keys[i], tokens, lens[i], hit) == 0 ||
            (remote.found && remote.found[i] && redis_get(s, &keys[i], &remote.mans[i], tokens, lens[i], hit) == 0)) {
            rc = 0;
            goto done;
        }
    }
done:
    free(remote.found);
    free(remote.mans);
    free(keys);
    free(lens);
    return rc;
}

int ks_store_prefetch(ks_store *s, const int32_t *tokens, int n, int max_len) {
    return ks_store_prefetch_in(s, 0, tokens, n, max_len);
}

int ks_store_prefetch_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, int max_len) {
    if (!s || n < 0 || (n > 0 && !tokens)) return KS_EINVAL;
    ks_tier *rt = s->tiers[KS_TIER_REDIS];
    int lim = (max_len < 0 || max_len > n) ? n : max_len;
    if (!rt || lim < 1 || !ks_tier_up(rt)) return 0;
    double t0 = ks_now_ms();
    atomic_fetch_add(&s->prefetches, 1);
    /* What the other processes of this host saved counts as local. */
    for (int t = 0; t < KS_TIER__LOCAL; t++)
        if (s->tiers[t]) ks_tier_rescan(s->tiers[t], 0);
    int k = 0, rc = 0;
    int *lens = NULL;
    ks_key *keys = NULL, hk;
    remote_found remote = {0};
    ks_store_hit hit;
    memset(&hit, 0, sizeof hit);
    hit.tier = KS_TIER_NONE;
    if ((rc = candidates(s, tenant, tokens, lim, &lens, &keys, &k)) != 0) return rc;
    int r = k > 0 ? redis_probe(s, tenant, tokens, lens, keys, k, 1, lim, &remote, &hit, &hk) : KS_ENOENT;
    for (int i = k - 1; r == KS_ENOENT && remote.found && i >= 0; i--)
        if (remote.found[i] && redis_get(s, &keys[i], &remote.mans[i], tokens, lens[i], &hit) == 0) {
            hk = keys[i];
            r = 0;
        }
    if (r == 0) {
        double ms = ks_now_ms() - t0;
        atomic_fetch_add(&s->prefetch_fetched, 1);
        KS_DEBUG("store", "prefetch: %d tokens from redis (%zu bytes, %.2f ms)", hit.n_tokens, hit.payload_len, ms);
        pf_keep(s, &hk, tokens, &hit, ms);
        rc = 1;
    } else {
        rc = r == KS_ENOMEM ? r : 0;
    }
    free(remote.found);
    free(remote.mans);
    free(keys);
    free(lens);
    return rc;
}

int ks_store_lookup(ks_store *s, const int32_t *tokens, int n, int max_len, ks_store_hit *hit) {
    return ks_store_lookup_range_in(s, 0, tokens, n, 1, max_len, hit);
}

int ks_store_lookup_range(ks_store *s, const int32_t *tokens, int n, int min_len, int max_len,
                          ks_store_hit *hit) {
    return ks_store_lookup_range_in(s, 0, tokens, n, min_len, max_len, hit);
}

int ks_store_lookup_range_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, int min_len, int max_len,
                             ks_store_hit *hit) {
    int rc = KS_ENOENT;
    if (!hit) return KS_EINVAL;
    memset(hit, 0, sizeof *hit);
    hit->tier = KS_TIER_NONE;
    if (!s || n < 0 || (n > 0 && !tokens)) return KS_EINVAL;
    int lim = (max_len < 0 || max_len > n) ? n : max_len;
    atomic_fetch_add(&s->lookups, 1);
    if (lim >= 1) {
        /* Another process may have saved (or evicted) since we last looked:
         * one stat per directory tells, and only then is it read again. */
        for (int t = 0; t < KS_TIER__N; t++)
            if (s->tiers[t]) ks_tier_rescan(s->tiers[t], 0);
        rc = probe(s, tenant, tokens, min_len < 1 ? 1 : min_len, lim, hit);
    }
    if (rc == 0) {
        atomic_fetch_add(&s->hits, 1);
        for (int t = 0; t < KS_TIER__N; t++)
            if (s->tiers[t]) atomic_fetch_add(t == hit->tier ? &s->tier_hits[t] : &s->tier_misses[t], 1);
        return 0;
    }
    atomic_fetch_add(&s->misses, 1);
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) atomic_fetch_add(&s->tier_misses[t], 1);
    return rc;
}


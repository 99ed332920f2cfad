/*
 * store_recent.c — warm start: the states most recently saved or hit in the
 * store's file tiers, read back whole with their tokens, for a new process
 * to put into its slots before it serves (store.h, ks_store_recent).
 *
 * Thread model: any thread, before requests run (the scheduler calls it
 * from ks_sched_create, before its inference thread starts). Reads files
 * only; the writer thread may run at the same time (a file it removes in
 * between is a miss).
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/store_int.h"
#include "cache/tier.h"

typedef struct cand {
    ks_key key;
    ks_tier_id tier;
    int n_tokens;
    int64_t used_us; /* the later of its save and its last hit */
} cand;

typedef struct cand_list {
    cand *v;
    int n, cap;
    ks_tier_id tier;
} cand_list;

static int collect(void *ud, const ks_tier_entry *e) {
    cand_list *l = ud;
    if (e->cls != KS_ENTRY_OWN || e->n_tokens < 1) return 0;
    for (int i = 0; i < l->n; i++) /* the same state in shm and on disk: one candidate, the faster tier */
        if (ks_key_eq(&l->v[i].key, &e->key)) return 0;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        cand *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return KS_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    int64_t used = e->last_hit_us > e->created_us ? e->last_hit_us : e->created_us;
    l->v[l->n++] = (cand){.key = e->key, .tier = l->tier, .n_tokens = e->n_tokens, .used_us = used};
    return 0;
}

static int newest_first(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->used_us != y->used_us) return x->used_us > y->used_us ? -1 : 1;
    return y->n_tokens - x->n_tokens; /* the same instant: the longer first */
}

/* Whether a[0, na) is a prefix of b[0, nb) (or equal to it). */
static bool is_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    return na <= nb && !memcmp(a, b, (size_t)na * sizeof *a);
}

/* Reads c's file whole and checks it as a lookup would (with a cache
 * secret, its tag too), the tokens against the key they must hash to. 0 and *out filled, or an error (a miss). */
static int load(ks_store *s, const cand *c, ks_store_state *out) {
    char path[KS_MAX_PATH + 80];
    if (ks_kvfile_path(s->tiers[c->tier]->dir, &c->key, path, sizeof path) != 0) return KS_EINVAL;
    ks_kvfile_expect exp = ks__store_expect(s, &c->key, NULL, 0); /* the tokens: against the key, below */
    ks_kvfile_meta meta;
    int32_t *tok = NULL;
    uint8_t *payload = NULL;
    int rc = ks_kvfile_read(path, &exp, &meta, &tok, &payload);
    if (rc) return rc;
    /* The tenant the file records must be the one its key was made for: the
     * key binds it (a file that names another tenant is a mismatch). */
    ks_key k;
    if ((rc = ks_key_compute_tenant(s->fp, s->kv_params, s->kv_len, meta.tenant, tok, (int)meta.n_tokens, &k)) != 0 ||
        !ks_key_eq(&k, &c->key)) {
        free(tok);
        free(payload);
        return rc ? rc : KS_EMISMATCH;
    }
    *out = (ks_store_state){.tokens = tok, .n_tokens = (int)meta.n_tokens, .payload = payload,
                            .len = (size_t)meta.payload_len, .tier = c->tier, .reason = (ks_reason)meta.reason,
                            .tenant = meta.tenant};
    return 0;
}

int ks_store_recent(ks_store *s, int max, int max_reads, ks_store_state *out, int *n_out) {
    *n_out = 0;
    if (!s || max < 0 || !out) return KS_EINVAL;
    cand_list l = {0};
    int rc = 0;
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK && !rc; t++) {
        if (!s->tiers[t]) continue;
        l.tier = (ks_tier_id)t;
        rc = ks_tier_list(s->tiers[t], collect, &l);
    }
    if (rc) {
        free(l.v);
        return rc;
    }
    qsort(l.v, (size_t)l.n, sizeof *l.v, newest_first);
    int n = 0;
    for (int i = 0, reads = 0; i < l.n && n < max && reads < max_reads; i++) {
        ks_store_state st;
        double t0 = ks_now_ms();
        reads++;
        if (load(s, &l.v[i], &st) != 0) continue; /* gone, or bad: a lookup reports and quarantines it */
        st.load_ms = ks_now_ms() - t0;
        bool dup = false;
        for (int j = 0; j < n && !dup; j++)
            dup = out[j].tenant == st.tenant && is_prefix(st.tokens, st.n_tokens, out[j].tokens, out[j].n_tokens);
        if (dup) { /* an earlier turn of a conversation already taken (of the same tenant) */
            ks_store_state_free(&st);
            continue;
        }
        out[n++] = st;
    }
    free(l.v);
    *n_out = n;
    return 0;
}

void ks_store_state_free(ks_store_state *st) {
    if (!st) return;
    free(st->tokens);
    free(st->payload);
    memset(st, 0, sizeof *st);
}

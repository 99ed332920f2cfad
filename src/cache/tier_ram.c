/*
 * tier_ram.c — the ram tier. Its entry table is tier.c's, like every tier's.
 *
 * The ram tier keeps each entry as a reference-counted blob (tokens +
 * payload). The table holds one reference; every get() takes another, handed
 * to the caller inside a ks_tier_blob, so a lookup can hand the payload to
 * llama without copying it and eviction can drop the table's reference while
 * a restore is still reading it: the blob is freed when the last reference
 * goes (Redis ae.c's deleted timers, in refcount form).
 *
 * Invariants (in addition to tier.h's)
 *  1. A blob's tokens and payload never change after put().
 *  2. blob->refs == 1 (the table) + the number of unreleased ks_tier_blobs.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/tier.h"

/* ============================================================ ram blobs */
typedef struct ram_blob {
    _Atomic int refs;
    int n;
    int32_t *tokens;
    uint8_t *payload;
    size_t len;
} ram_blob;

static void blob_unref(ram_blob *b) {
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) {
        free(b->tokens);
        free(b->payload);
        free(b);
    }
}

/* ks_tier_blob.release_ of the blobs ram_get hands out: drops their reference. */
static void blob_release(ks_tier_blob *out) { blob_unref(out->owner_); }

/* ============================================================= ram tier */
static int ram_put(ks_tier *t, const ks_kvfile_meta *m, const int32_t *tokens, int n,
                   uint8_t **payload, size_t len, bool *existed) {
    int rc = 0;
    ram_blob *b = NULL;
    ks__tentry *old = NULL;
    if (existed) *existed = false;
    if (n < 0 || (n && !tokens) || !payload || (len && !*payload)) return KS_EINVAL;
    pthread_rwlock_rdlock(&t->lock);
    ks__tentry *cur = ks_keymap_get(&t->map, &m->key);
    bool present = cur && !cur->bad;
    pthread_rwlock_unlock(&t->lock);
    if (present) {
        if (existed) *existed = true;
        return 0;
    }
    if (!(b = calloc(1, sizeof *b)) || !(b->tokens = malloc(n ? (size_t)n * 4 : 1))) {
        rc = KS_ENOMEM;
        goto done;
    }
    if (n) memcpy(b->tokens, tokens, (size_t)n * 4);
    b->n = n;
    b->len = len;
    atomic_store(&b->refs, 1);
    ks_tier_entry info = {0};
    info.key = m->key;
    info.n_tokens = n;
    info.reason = (int)m->reason;
    info.bytes = len + (uint64_t)n * 4 + sizeof *b;
    info.created_us = m->created_us;
    info.last_hit_us = m->created_us;
    info.pin_until_us = m->pin_until_us;
    info.state_version = m->state_version;
    memcpy(info.model_fp, m->model_fp, 32);
    memcpy(info.params_hash, m->params_hash, 32);
    info.cls = KS_ENTRY_OWN;
    /* The blob is complete before it is visible: readers take it as soon as
     * the table holds it. */
    b->payload = *payload;
    pthread_rwlock_wrlock(&t->lock);
    old = ks__tier_unlink_locked(t, &m->key); /* a bad one, if any */
    rc = ks__tier_insert_locked(t, &info, b, NULL);
    pthread_rwlock_unlock(&t->lock);
    if (rc == 0) {
        *payload = NULL; /* the tier keeps the buffer */
        b = NULL;
    } else {
        b->payload = NULL; /* still the caller's */
    }
done:
    if (old) {
        blob_unref(old->blob);
        free(old);
    }
    if (b) {
        free(b->tokens);
        free(b);
    }
    return rc;
}

static int ram_get(ks_tier *t, const ks_key *key, const ks_kvfile_expect *exp, ks_tier_blob *out) {
    ram_blob *b = NULL;
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    if (e && !e->bad) {
        b = e->blob;
        atomic_fetch_add(&b->refs, 1);
    }
    pthread_rwlock_unlock(&t->lock);
    if (!b) return KS_ENOENT;
    /* Same process, same model: only the exact tokens can differ (a SHA-256
     * collision), but the check is as cheap as it is cheap to be sure. */
    if (exp && exp->tokens &&
        (exp->n_tokens != b->n || memcmp(exp->tokens, b->tokens, (size_t)b->n * 4) != 0)) {
        blob_unref(b);
        return KS_EMISMATCH;
    }
    out->payload = b->payload;
    out->len = b->len;
    out->owner_ = b;
    out->release_ = blob_release;
    ks__tier_touch(t, key);
    return 0;
}

static int ram_drop(ks_tier *t, const ks_key *key, void *blob) {
    blob_unref(blob);
    return 0;
}

static int ram_quarantine(ks_tier *t, const ks_key *key) {
    pthread_rwlock_rdlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    bool bad = e && e->bad;
    pthread_rwlock_unlock(&t->lock);
    int rc = bad ? ks_tier_remove(t, key) : 0;
    return rc == KS_ENOENT ? 0 : rc;
}

static int ram_rescan(ks_tier *t, unsigned flags) { return 0; }
static void ram_persist(ks_tier *t) {}

static void ram_close(ks_tier *t) {
    for (size_t i = 0; i < t->map.cap; i++)
        if (ks_keymap_live(&t->map, i)) {
            ks__tentry *e = t->map.vals[i];
            blob_unref(e->blob);
            e->blob = NULL;
        }
    ks__tier_fini(t);
    free(t);
}

static const ks_tier_vt ram_vt = {
    .put = ram_put,
    .get = ram_get,
    .drop = ram_drop,
    .quarantine = ram_quarantine,
    .rescan = ram_rescan,
    .persist = ram_persist,
    .reload_pin = NULL, /* only this process pins its ram entries */
    .close = ram_close,
};

int ks_tier_ram_open(const ks_tier_ident *ident, ks_tier **out) {
    *out = NULL;
    ks_tier *t = calloc(1, sizeof *t);
    if (!t) return KS_ENOMEM;
    /* The ram tier only ever holds this process's own saves: no identity
     * is needed to classify them. */
    if (ks__tier_init(t, &ram_vt, KS_TIER_RAM, NULL) != 0) {
        free(t);
        return KS_ENOMEM;
    }
    *out = t;
    return 0;
}

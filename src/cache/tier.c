/*
 * tier.c — the part of every tier that is not about its storage: the entry
 * table (key -> metadata, bytes, LRU clock) behind the table rwlock, the
 * classes of entries, eviction and removal, and the release of a blob.
 * tier_ram.c and tier_file.c each implement the vtable (tier.h) on top of
 * these functions; neither calls into the other.
 *
 * Where state changes: the table only under t->lock held for writing
 * (insert, unlink, touch, pin, mark_bad, evict's pin reloads and marking,
 * forget_bad); the storage of an entry only through vt->drop, called
 * without the lock (tier.h invariant 3).
 *
 * Eviction with pins (tier.h "Pins"): the pinned entries are ranked by
 * deadline, latest first, and protected while their bytes fit in the pin
 * budget; the first that does not fit and every later-ranked one (the
 * soonest to expire) are ordinary LRU candidates. Protecting a prefix of that
 * ranking, not the best packing, keeps the rule a client can reason about:
 * a pin never loses protection to a pin that expires sooner.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cache/tier.h"

/* ============================================================ the table */
int ks__tier_init(ks_tier *t, const ks_tier_vt *vt, ks_tier_id id, const ks_tier_ident *ident) {
    t->vt = vt;
    t->id = id;
    if (ident && ident->model_fp) {
        memcpy(t->ident_fp, ident->model_fp, 32);
        if (ident->params_hash) memcpy(t->ident_params, ident->params_hash, 32);
        t->ident.model_fp = t->ident_fp;
        t->ident.params_hash = ident->params_hash ? t->ident_params : NULL;
        t->ident.state_version = ident->state_version;
        t->has_ident = true;
    }
    if (ident && ident->mac) {
        t->ident_mac = *ident->mac;
        t->ident.mac = &t->ident_mac;
    }
    return pthread_rwlock_init(&t->lock, NULL) == 0 ? 0 : KS_ENOMEM;
}

void ks__tier_fini(ks_tier *t) {
    for (size_t i = 0; i < t->map.cap; i++)
        if (ks_keymap_live(&t->map, i)) free(t->map.vals[i]);
    ks_keymap_free(&t->map);
    pthread_rwlock_destroy(&t->lock);
}

void ks_tier_close(ks_tier *t) {
    if (t) t->vt->close(t);
}

ks_entry_class ks__tier_classify(const ks_tier *t, const ks_kvfile_meta *m) {
    if (!t->has_ident) return KS_ENTRY_OWN;
    if (memcmp(m->model_fp, t->ident_fp, 32) != 0) return KS_ENTRY_FOREIGN;
    if (t->ident.params_hash && memcmp(m->params_hash, t->ident_params, 32) != 0)
        return KS_ENTRY_FOREIGN;
    if (m->state_version != t->ident.state_version) return KS_ENTRY_STALE;
    return KS_ENTRY_OWN;
}

/* Invariant 2 (tier.h), with the table's write lock or as its only user:
 * usage equals the sum of the entries' bytes (KS_ASSERT; a walk over the
 * table). */
__attribute__((unused)) static bool usage_ok_locked(const ks_tier *t) {
    uint64_t sum = 0;
    for (size_t i = 0; i < t->map.cap; i++)
        if (ks_keymap_live(&t->map, i)) sum += ((const ks__tentry *)t->map.vals[i])->info.bytes;
    return sum == t->bytes;
}

int ks__tier_insert_locked(ks_tier *t, const ks_tier_entry *info, void *blob, ks__tentry **out) {
    ks__tentry *e = calloc(1, sizeof *e);
    if (!e) return KS_ENOMEM;
    e->info = *info;
    e->blob = blob;
    e->lru = e->ins = ++t->seq;
    if (ks_keymap_put(&t->map, &info->key, e) != 0) {
        free(e);
        return KS_ENOMEM;
    }
    t->bytes += info->bytes;
    KS_ASSERT(usage_ok_locked(t));
    if (out) *out = e;
    return 0;
}

ks__tentry *ks__tier_unlink_locked(ks_tier *t, const ks_key *key) {
    ks__tentry *e = ks_keymap_del(&t->map, key);
    if (e) t->bytes -= e->info.bytes;
    KS_ASSERT(usage_ok_locked(t));
    return e;
}

static void tier_use(ks_tier *t, const ks_key *key, bool hit) {
    pthread_rwlock_wrlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    if (e) {
        e->info.last_hit_us = ks_wall_us();
        if (hit) e->info.hits++;
        e->lru = ++t->seq;
        e->dirty = true;
    }
    pthread_rwlock_unlock(&t->lock);
}

void ks__tier_touch(ks_tier *t, const ks_key *key) { tier_use(t, key, true); }

void ks__tier_refresh(ks_tier *t, const ks_key *key) { tier_use(t, key, false); }

bool ks_tier_has(ks_tier *t, const ks_key *key, ks_tier_entry *out) {
    pthread_rwlock_rdlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    bool ok = e && !e->bad;
    if (ok && out) *out = e->info;
    pthread_rwlock_unlock(&t->lock);
    return ok;
}

bool ks_tier_pin(ks_tier *t, const ks_key *key, int64_t until_us) {
    pthread_rwlock_wrlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    bool ok = e && !e->bad && e->info.cls == KS_ENTRY_OWN;
    if (ok && until_us > e->info.pin_until_us) {
        e->info.pin_until_us = until_us;
        e->dirty = true;
    }
    pthread_rwlock_unlock(&t->lock);
    return ok;
}

uint64_t ks_tier_pinned_bytes(ks_tier *t, int64_t now_us, uint64_t *n) {
    uint64_t bytes = 0, k = 0;
    pthread_rwlock_rdlock(&t->lock);
    for (size_t i = 0; i < t->map.cap; i++) {
        if (!ks_keymap_live(&t->map, i)) continue;
        const ks__tentry *e = t->map.vals[i];
        if (e->bad || e->info.pin_until_us <= now_us) continue;
        bytes += e->info.bytes;
        k++;
    }
    pthread_rwlock_unlock(&t->lock);
    if (n) *n = k;
    return bytes;
}

bool ks_tier_mark_bad(ks_tier *t, const ks_key *key) {
    pthread_rwlock_wrlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    bool marked = e && !e->bad;
    if (marked) e->bad = true;
    pthread_rwlock_unlock(&t->lock);
    return marked;
}

/* The n_tokens of the good entries of class cls (and, with fp, of that
 * model) with 1 <= n_tokens <= max_len, appended to out[*n] while *n < cap. */
static void lengths(ks_tier *t, ks_entry_class cls, const uint8_t *fp, int max_len, int *out, int *n, int cap) {
    pthread_rwlock_rdlock(&t->lock);
    for (size_t i = 0; i < t->map.cap && *n < cap; i++) {
        if (!ks_keymap_live(&t->map, i)) continue;
        const ks__tentry *e = t->map.vals[i];
        if (e->bad || e->info.cls != cls || (fp && memcmp(e->info.model_fp, fp, 32) != 0)) continue;
        if (e->info.n_tokens >= 1 && e->info.n_tokens <= max_len) out[(*n)++] = e->info.n_tokens;
    }
    pthread_rwlock_unlock(&t->lock);
}

void ks_tier_lengths(ks_tier *t, int max_len, int *out, int *n, int cap) {
    lengths(t, KS_ENTRY_OWN, NULL, max_len, out, n, cap);
}

void ks_tier_foreign_lengths(ks_tier *t, const uint8_t fp[32], int max_len, int *out, int *n, int cap) {
    lengths(t, KS_ENTRY_FOREIGN, fp, max_len, out, n, cap);
}

int ks_tier_list(ks_tier *t, ks_tier_list_cb cb, void *ud) {
    int rc = 0;
    size_t n = 0;
    ks_tier_entry *snap = NULL;
    pthread_rwlock_rdlock(&t->lock);
    if (t->map.n) snap = malloc(t->map.n * sizeof *snap);
    if (snap)
        for (size_t i = 0; i < t->map.cap; i++)
            if (ks_keymap_live(&t->map, i)) snap[n++] = ((ks__tentry *)t->map.vals[i])->info;
    bool oom = t->map.n && !snap;
    pthread_rwlock_unlock(&t->lock);
    if (oom) {
        rc = KS_ENOMEM;
        goto done;
    }
    for (size_t i = 0; i < n && rc == 0; i++) rc = cb(ud, &snap[i]);
done:
    free(snap);
    return rc;
}

void ks_tier_usage(ks_tier *t, uint64_t *bytes, uint64_t *entries) {
    pthread_rwlock_rdlock(&t->lock);
    if (bytes) *bytes = t->bytes;
    if (entries) *entries = t->map.n;
    pthread_rwlock_unlock(&t->lock);
}

static int lru_cmp(const void *a, const void *b) {
    const ks__tentry *x = *(ks__tentry *const *)a, *y = *(ks__tentry *const *)b;
    if (x->info.last_hit_us != y->info.last_hit_us) return x->info.last_hit_us < y->info.last_hit_us ? -1 : 1;
    return x->lru < y->lru ? -1 : x->lru > y->lru;
}

void ks__tier_forget_bad(ks_tier *t, const ks_key *keys, int n) {
    pthread_rwlock_wrlock(&t->lock);
    for (int i = 0; i < n; i++) {
        ks__tentry *e = ks_keymap_get(&t->map, &keys[i]);
        if (e && e->bad) free(ks__tier_unlink_locked(t, &keys[i]));
    }
    pthread_rwlock_unlock(&t->lock);
}

typedef struct victim {
    ks_tier_entry info;
    void *blob;
} victim;

/* Latest deadline first; ties: the more recently used first. */
static int pin_cmp(const void *a, const void *b) {
    const ks__tentry *x = *(ks__tentry *const *)a, *y = *(ks__tentry *const *)b;
    if (x->info.pin_until_us != y->info.pin_until_us) return x->info.pin_until_us > y->info.pin_until_us ? -1 : 1;
    return x->lru > y->lru ? -1 : x->lru < y->lru;
}

/* Chooses the victims among the table's good entries (caller holds the
 * lock; all has room for every entry): fills all[0, *k) with the candidates
 * in eviction order and returns how many of them must go to bring usage to
 * max_bytes (all of them when that is not enough). *dropped: how many of
 * those are pinned. */
static size_t choose(ks_tier *t, ks__tentry **all, size_t *k, uint64_t max_bytes, const ks_tier_pins *pins,
                     int *dropped) {
    uint64_t live = t->bytes;
    size_t n = 0, n_pinned = 0;
    *dropped = 0;
    /* Entries already marked bad are on their way out: not counted. */
    for (size_t i = 0; i < t->map.cap; i++) {
        if (!ks_keymap_live(&t->map, i)) continue;
        ks__tentry *e = t->map.vals[i];
        if (e->bad)
            live -= e->info.bytes;
        else
            all[n++] = e;
    }
    if (pins) {
        /* The pinned entries first, latest deadline first; a protected
         * prefix of them is taken out of the candidates. */
        for (size_t i = 0; i < n; i++) {
            if (all[i]->info.pin_until_us <= pins->now_us) continue;
            ks__tentry *x = all[n_pinned];
            all[n_pinned++] = all[i];
            all[i] = x;
        }
        if (n_pinned) qsort(all, n_pinned, sizeof *all, pin_cmp);
        uint64_t kept = 0;
        bool incoming = pins->incoming_bytes > 0 && pins->incoming_until_us > pins->now_us;
        size_t p = 0;
        for (; p < n_pinned; p++) {
            /* The incoming save ranks by its deadline like an entry. */
            if (incoming && pins->incoming_until_us >= all[p]->info.pin_until_us) {
                if (kept + pins->incoming_bytes > pins->max_bytes) break;
                kept += pins->incoming_bytes;
                incoming = false;
            }
            if (kept + all[p]->info.bytes > pins->max_bytes) break;
            kept += all[p]->info.bytes;
        }
        /* all[0, p) are protected: move the rest forward. */
        memmove(all, all + p, (n - p) * sizeof *all);
        n -= p;
    }
    if (n) qsort(all, n, sizeof *all, lru_cmp);
    size_t v = 0;
    for (; v < n && live > max_bytes; v++) {
        live -= all[v]->info.bytes;
        if (pins && all[v]->info.pin_until_us > pins->now_us) (*dropped)++;
    }
    *k = n;
    return v;
}

/* Reads the pins of the chosen victims again (another process may have set
 * them since this one indexed the files) and records a later one. Returns
 * true when a pin changed, so that the choice is made again. */
static bool reload_pins(ks_tier *t, uint64_t max_bytes, const ks_tier_pins *pins) {
    ks__tentry **all = NULL;
    ks_key *keys = NULL;
    size_t n = 0, k = 0;
    int dropped;
    bool changed = false;
    pthread_rwlock_rdlock(&t->lock);
    if (t->bytes > max_bytes && t->map.n && (all = malloc(t->map.n * sizeof *all)) &&
        (keys = malloc(t->map.n * sizeof *keys))) {
        n = choose(t, all, &k, max_bytes, pins, &dropped);
        for (size_t i = 0; i < n; i++) keys[i] = all[i]->info.key;
    }
    pthread_rwlock_unlock(&t->lock);
    for (size_t i = 0; i < n; i++) {
        int64_t pin = 0;
        if (t->vt->reload_pin(t, &keys[i], &pin) != 0 || pin <= pins->now_us) continue;
        pthread_rwlock_wrlock(&t->lock);
        ks__tentry *e = ks_keymap_get(&t->map, &keys[i]);
        if (e && !e->bad && pin > e->info.pin_until_us) {
            e->info.pin_until_us = pin;
            changed = true;
        }
        pthread_rwlock_unlock(&t->lock);
    }
    free(all);
    free(keys);
    return changed;
}

int ks_tier_evict(ks_tier *t, uint64_t max_bytes, ks_tier_pins *pins,
                  void (*cb)(void *ud, const ks_tier_entry *e), void *ud) {
    ks__tentry **all = NULL;
    victim *v = NULL;
    ks_key *keys = NULL;
    int n = 0, dropped = 0;
    if (pins) pins->dropped = 0;
    /* Each round can only add protection; two are plenty for the pins one
     * other process may have changed meanwhile. */
    for (int round = 0; pins && t->vt->reload_pin && round < 2; round++)
        if (!reload_pins(t, max_bytes, pins)) break;
    pthread_rwlock_wrlock(&t->lock);
    if (t->bytes <= max_bytes || t->map.n == 0) goto unlock;
    all = malloc(t->map.n * sizeof *all);
    v = malloc(t->map.n * sizeof *v);
    keys = malloc(t->map.n * sizeof *keys);
    if (!all || !v || !keys) goto unlock;
    size_t k = 0;
    size_t nv = choose(t, all, &k, max_bytes, pins, &dropped);
    for (size_t i = 0; i < nv; i++) {
        all[i]->bad = true;
        v[n].info = all[i]->info;
        v[n].blob = all[i]->blob;
        all[i]->blob = NULL;
        keys[n] = all[i]->info.key;
        n++;
    }
unlock:
    pthread_rwlock_unlock(&t->lock);
    if (pins) pins->dropped = n ? dropped : 0;
    for (int i = 0; i < n; i++) {
        t->vt->drop(t, &v[i].info.key, v[i].blob);
        if (cb) cb(ud, &v[i].info);
    }
    if (n) ks__tier_forget_bad(t, keys, n);
    free(all);
    free(v);
    free(keys);
    return n;
}

int ks_tier_remove(ks_tier *t, const ks_key *key) {
    pthread_rwlock_wrlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    void *blob = NULL;
    if (e) {
        e->bad = true;
        blob = e->blob;
        e->blob = NULL;
    }
    pthread_rwlock_unlock(&t->lock);
    if (!e) return KS_ENOENT;
    int rc = t->vt->drop(t, key, blob);
    ks__tier_forget_bad(t, key, 1);
    return rc;
}

/* ============================================================ blobs */
void ks_tier_blob_release(ks_tier_blob *b) {
    if (!b) return;
    /* The tier that handed the blob out knows how to give it back; a blob
     * without a release function owns a plain malloc'd buffer. */
    if (b->release_)
        b->release_(b);
    else
        free(b->owner_);
    memset(b, 0, sizeof *b);
}

/*
 * store.c — see store.h. The writer thread is in store_writer.c, lookups in
 * store_lookup.c (store_int.h).
 *
 * The writer thread
 *   Jobs go through one FIFO guarded by s->mu: SAVE (from ks_store_save),
 *   QUARANTINE (a lookup met a bad file), GC and FLUSH (barriers that a
 *   caller waits for). A job someone waits for is reference-counted (the
 *   waiter and the writer): whoever drops the last reference frees it, so a
 *   waiter that times out can leave without freeing a job the writer still
 *   uses. Async saves are bounded by count and payload bytes; sync saves,
 *   quarantines and barriers are not (their callers wait or they are tiny).
 *   `s->pending` maps the keys of queued saves so a second save of the same
 *   state is a dedup, not a second write.
 *
 * Read your own writes
 *   A lookup also sees the saves not written yet: a state saved a moment ago
 *   (a finish save, or an evict save deduplicated against it) is found even
 *   when the idle-priority writer has not written it (or is writing it: an
 *   fsync can take a second). Its payload is copied under s->mu; a job's
 *   payload is freed only when the job completes, under s->mu, and when the
 *   ram tier keeps the buffer, the job lets go of it under s->mu before the
 *   writer could evict it (see do_save), so the lookup never waits for the
 *   writer and never reads a freed buffer.
 *
 * Pins
 *   A pinned save is one job for two tiers (ram, then the tier of reason
 *   pin): the writer puts it into the file tier first and into ram last,
 *   since the ram tier keeps the buffer. Its deadline is read under s->mu
 *   before the puts and again after them: ks_store_pin may extend the
 *   deadline of a queued job meanwhile (under s->mu); an extension that
 *   comes after the second read finds the entries in their tiers, which it
 *   pins directly (the puts precede the read, the job leaves `pending` after
 *   it).
 *
 * Where state changes
 *   - tier tables: the writer (put, evict, quarantine, GC rescans); lookups
 *     (hit statistics, entries of vanished files, rescans that add entries);
 *     pins (ks_store_pin, save_pinned: the deadline of existing entries);
 *   - counters: atomics, from any thread;
 *   - the queue: under s->mu.
 */
#include "cache/store.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/redis_fmt.h"
#include "cache/kvparams.h"
#include "cache/store_int.h"

void ks__store_add_ms(_Atomic uint64_t *acc, double ms) {
    if (ms > 0) atomic_fetch_add(acc, (uint64_t)(ms * 1000.0 + 0.5));
}

/* ------------------------------------------------------------- defaults */
void ks_store_default_dirs(char *cache_dir, char *shm_dir) {
    if (cache_dir) {
        const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
        if (x && x[0] == '/')
            snprintf(cache_dir, KS_MAX_PATH, "%s/kvstash", x);
        else if (h && h[0])
            snprintf(cache_dir, KS_MAX_PATH, "%s/.cache/kvstash", h);
        else
            snprintf(cache_dir, KS_MAX_PATH, "/tmp/kvstash-%u", (unsigned)getuid());
    }
    if (shm_dir) snprintf(shm_dir, KS_MAX_PATH, "/dev/shm/kvstash-%u", (unsigned)getuid());
}

ks_store_params ks_store_params_default(void) {
    ks_store_params p;
    memset(&p, 0, sizeof p);
    ks_store_cfg_defaults(&p.cfg);
    p.cfg.enabled = true;
    ks_store_default_dirs(p.cfg.cache_dir, p.cfg.shm_dir);
    p.queue_max = 16;
    p.queue_max_bytes = 1ull << 30;
    return p;
}

/* --------------------------------------------------------------- open/close */
static bool same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return strcmp(a, b) == 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int ks_store_open(const ks_store_params *p, ks_store **out, char *err, size_t errlen) {
    int rc = 0;
    ks_store *s = NULL;
    if (!out) return KS_EINVAL;
    *out = NULL;
    if (!p || (p->kv_params_len && !p->kv_params) || p->cfg.stride < 0 || p->queue_max < 0 ||
        !(p->cfg.pin_share >= 0.0f && p->cfg.pin_share <= 1.0f)) {
        ks_set_err(err, errlen, "invalid store parameters");
        return KS_EINVAL;
    }
    for (int r = 0; r < KS_REASON__N; r++) {
        int t = p->cfg.reason_tier[r];
        if (t != KS_TIER_NONE && (t < 0 || t >= KS_TIER__LOCAL)) {
            ks_set_err(err, errlen, "invalid tier %d for reason %s", t, ks_reason_name(r));
            return KS_EINVAL;
        }
    }
    if (!(s = calloc(1, sizeof *s))) return KS_ENOMEM;
    s->cfg = p->cfg;
    memcpy(s->fp, p->model_fp, 32);
    s->state_version = p->state_version;
    if (p->mac) {
        s->mac = *p->mac;
        s->has_mac = true;
    }
    s->queue_max = p->queue_max ? p->queue_max : 16;
    s->queue_max_bytes = p->queue_max_bytes ? p->queue_max_bytes : (1ull << 30);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    if (p->kv_params_len) {
        if (!(s->kv_params = malloc(p->kv_params_len))) {
            rc = KS_ENOMEM;
            goto done;
        }
        memcpy(s->kv_params, p->kv_params, p->kv_params_len);
        s->kv_len = p->kv_params_len;
    }
    if ((rc = ks_sha256(s->kv_params ? s->kv_params : "", s->kv_len, s->params_hash)) != 0) goto done;

    ks_tier_ident ident = {.model_fp = s->fp, .params_hash = s->params_hash,
                           .state_version = s->state_version, .mac = s->has_mac ? &s->mac : NULL};
    if (s->cfg.tier_max_bytes[KS_TIER_RAM] > 0 && (rc = ks_tier_ram_open(&ident, &s->tiers[KS_TIER_RAM])) != 0)
        goto done;
    if (s->cfg.tier_max_bytes[KS_TIER_DISK] > 0) {
        if (!s->cfg.cache_dir[0]) {
            ks_set_err(err, errlen, "store: no cache_dir for the disk tier");
            rc = KS_EINVAL;
            goto done;
        }
        rc = ks_tier_file_open(KS_TIER_DISK, s->cfg.cache_dir, KS_TIER_CREATE | KS_TIER_CLEANUP,
                               &ident, &s->tiers[KS_TIER_DISK], err, errlen);
        if (rc != 0) goto done;
    }
    if (s->cfg.tier_max_bytes[KS_TIER_SHM] > 0 && s->cfg.shm_dir[0]) {
        char e2[256] = "";
        int r = ks_tier_file_open(KS_TIER_SHM, s->cfg.shm_dir, KS_TIER_CREATE | KS_TIER_CLEANUP,
                                  &ident, &s->tiers[KS_TIER_SHM], e2, sizeof e2);
        if (r != 0) KS_WARN("store", "shm tier disabled: %s", e2);
        else if (s->tiers[KS_TIER_DISK] && same_dir(s->cfg.shm_dir, s->cfg.cache_dir)) {
            ks_set_err(err, errlen, "store: shm_dir and cache_dir are the same directory (%s)",
                       s->cfg.cache_dir);
            rc = KS_EINVAL;
            goto done;
        }
    }
    if (s->cfg.redis.url[0] && s->cfg.tier_max_bytes[KS_TIER_REDIS] > 0) {
        rc = ks_tier_redis_open(&s->cfg.redis, (uint64_t)s->cfg.tier_max_bytes[KS_TIER_REDIS], &ident,
                                &s->tiers[KS_TIER_REDIS], err, errlen);
        if (rc != 0) goto done;
    }
    /* The params in words beside the entries, for `kvstash cache ls`
     * (kvparams.h): a convenience, never needed to serve. */
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK; t++) {
        const char *d = t == KS_TIER_DISK ? s->cfg.cache_dir : s->cfg.shm_dir;
        if (s->tiers[t] && ks_kvparams_register(d, s->params_hash, s->kv_params ? s->kv_params : "", s->kv_len))
            KS_DEBUG("store", "%s tier: cannot write the kv-params' name in %s/params", ks_tier_name(t), d);
    }
    /* The tier keeps what it needs; no copy of a credential stays here. */
    memset(s->cfg.redis.password, 0, sizeof s->cfg.redis.password);
    if (pthread_create(&s->writer, NULL, ks__store_writer_main, s) != 0) {
        ks_set_err(err, errlen, "store: cannot start the writer thread");
        rc = KS_ENOMEM;
        goto done;
    }
    s->writer_started = true;
    /* The budgets may have shrunk since the files were written. */
    job *g = calloc(1, sizeof *g);
    if (g) {
        g->kind = JOB_GC;
        g->refs = 1;
        pthread_mutex_lock(&s->mu);
        ks__store_enqueue_locked(s, g);
        pthread_mutex_unlock(&s->mu);
    }
    for (int t = 0; t < KS_TIER__N; t++) {
        uint64_t b = 0, e = 0;
        if (!s->tiers[t]) {
            if (t == KS_TIER_REDIS) continue; /* not configured: nothing to say */
            /* A disabled tier: its directory, if any is named, is not used. */
            KS_INFO("store", "%-4s tier: off", ks_tier_name(t));
            continue;
        }
        if (t == KS_TIER_REDIS) {
            char where[KS_REDIS_URL_MAX];
            ks_redis_url_redact(s->cfg.redis.url, where, sizeof where);
            KS_INFO("store", "redis tier: %s, prefix %s, chunks of %.1f MiB, budget %.1f MiB", where,
                    s->cfg.redis.key_prefix, (double)s->cfg.redis.chunk_bytes / 1048576.0,
                    (double)s->cfg.tier_max_bytes[t] / 1048576.0);
            continue;
        }
        ks_tier_usage(s->tiers[t], &b, &e);
        KS_INFO("store", "%-4s tier: %s%s%llu entries, %.1f MiB (budget %.1f MiB)", ks_tier_name(t),
                t == KS_TIER_RAM ? "" : (t == KS_TIER_SHM ? s->cfg.shm_dir : s->cfg.cache_dir),
                t == KS_TIER_RAM ? "" : ": ", (unsigned long long)e, (double)b / 1048576.0,
                (double)s->cfg.tier_max_bytes[t] / 1048576.0);
    }
done:
    if (rc != 0) {
        ks_store_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void ks_store_prewarm(ks_store *s, size_t bytes) {
    if (!s) return;
    for (int t = 0; t < KS_TIER__N; t++)
        if (t != KS_TIER_RAM && t < KS_TIER__LOCAL && s->tiers[t]) ks_tier_file_prewarm(s->tiers[t], bytes);
}

void ks_store_close(ks_store *s) {
    if (!s) return;
    if (s->writer_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        s->stop_deadline_ms = ks_now_ms() + (s->cfg.shutdown_timeout_ms > 0 ? s->cfg.shutdown_timeout_ms : 5000);
        pthread_cond_signal(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
    }
    ks__store_prefetch_clear(s);
    for (int t = 0; t < KS_TIER__N; t++) ks_tier_close(s->tiers[t]);
    ks_keymap_free(&s->pending);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(s->kv_params);
    free(s);
}

/* ------------------------------------------------------------------- save */
bool ks__store_stored_anywhere(ks_store *s, const ks_key *key) {
    for (int t = 0; t < KS_TIER__LOCAL; t++) {
        ks_tier_entry e;
        if (s->tiers[t] && ks_tier_has(s->tiers[t], key, &e) && e.cls == KS_ENTRY_OWN) return true;
    }
    return false;
}

bool ks__store_pin_held(ks_store *s, const ks_key *key, int64_t until_us) {
    bool held = false;
    pthread_mutex_lock(&s->mu);
    job *j = ks_keymap_get(&s->pending, key);
    if (j && j->kind == JOB_SAVE) {
        if (until_us > j->pin_until_us) j->pin_until_us = until_us;
        held = true;
    }
    pthread_mutex_unlock(&s->mu);
    /* After the queue: a job that completed meanwhile put its entries first.
     * Pins are local: Redis keeps no pins. */
    for (int t = 0; t < KS_TIER__LOCAL; t++)
        if (s->tiers[t] && ks_tier_pin(s->tiers[t], key, until_us)) held = true;
    return held;
}

/* The checks every save goes through before it is queued: *tiers is the
 * set of tiers it goes to (1 << ks_tier_id: the reason's local tier and, for
 * the reasons of cfg.redis.reasons, the redis tier), 0 when it is not
 * written — too small, a reason mapped to no (enabled) tier, the state is
 * stored already, or Redis is down — each counted as such; *key is computed
 * when the key was needed. Returns 0 or the error of computing the key.
 * (Whether the state is queued already is checked by the callers, under
 * s->mu.) */
/* Where the configuration sends saves of reason: its local tier when that
 * tier is open (else KS_TIER_NONE), and whether Redis takes them. */
static int reason_local(const ks_store *s, ks_reason reason) {
    int t = s->cfg.reason_tier[reason];
    return t != KS_TIER_NONE && s->tiers[t] ? t : KS_TIER_NONE;
}
static bool reason_remote(const ks_store *s, ks_reason reason) {
    return s->tiers[KS_TIER_REDIS] && (s->cfg.redis.reasons & (1u << reason));
}

static int save_check(ks_store *s, ks_reason reason, uint64_t tenant, const int32_t *tokens, int n, ks_key *key,
                      unsigned *tiers) {
    *tiers = 0;
    if (n < s->cfg.min_tokens || n == 0) {
        atomic_fetch_add(&s->small_saves, 1);
        return 0;
    }
    int t = reason_local(s, reason);
    ks_tier *rt = s->tiers[KS_TIER_REDIS];
    bool local = t != KS_TIER_NONE;
    bool remote = reason_remote(s, reason);
    if (!local && !remote) {
        atomic_fetch_add(&s->dropped_saves, 1);
        return 0;
    }
    int rc = ks_key_compute_tenant(s->fp, s->kv_params, s->kv_len, tenant, tokens, n, key);
    if (rc != 0) return rc;
    bool stored = ks__store_stored_anywhere(s, key);
    if (stored) {
        local = false;
        /* Declined as held: that state is the conversation's latest again, so
         * it counts as used now (LRU, and warm start's "most recently saved or
         * hit", store_recent.c), though not as a hit. Otherwise an older,
         * shorter save of the same conversation would look newer. Not with a
         * cache secret: an entry held under this key is known to be authentic
         * only once read (an untagged file of another process may hold it). */
        if (!s->has_mac)
            for (int i = 0; i < KS_TIER__LOCAL; i++)
                if (s->tiers[i]) ks__tier_refresh(s->tiers[i], key);
    }
    if (remote && ks_tier_has(rt, key, NULL)) {
        stored = true;
        remote = false;
    }
    if (remote && !ks_tier_up(rt)) {
        /* Down: not even copied for it (the breaker retries later). */
        ks_tier_note_dropped(rt);
        remote = false;
        if (!local && !stored) {
            atomic_fetch_add(&s->dropped_saves, 1);
            return 0;
        }
    }
    if (!local && !remote) {
        atomic_fetch_add(&s->dedup_saves, 1);
        return 0;
    }
    *tiers = (local ? 1u << t : 0) | (remote ? 1u << KS_TIER_REDIS : 0);
    return 0;
}

bool ks_store_wants(ks_store *s, ks_reason reason, const int32_t *tokens, int n) {
    return ks_store_wants_in(s, 0, reason, tokens, n);
}

bool ks_store_saves_reason(const ks_store *s, ks_reason reason) {
    return s && (int)reason >= 0 && reason < KS_REASON__N &&
           (reason_local(s, reason) != KS_TIER_NONE || reason_remote(s, reason));
}

bool ks_store_reason_outlives(const ks_store *s, ks_reason reason) {
    if (!ks_store_saves_reason(s, reason)) return false;
    int t = reason_local(s, reason);
    return (t != KS_TIER_NONE && t != KS_TIER_RAM) || reason_remote(s, reason);
}

bool ks_store_wants_in(ks_store *s, uint64_t tenant, ks_reason reason, const int32_t *tokens, int n) {
    if (!s || (int)reason < 0 || reason >= KS_REASON__N || n <= 0 || !tokens) return false;
    /* A "no" is accounted as the save would have been: small, dropped or dedup. */
    ks_key key;
    unsigned tiers;
    if (save_check(s, reason, tenant, tokens, n, &key, &tiers) != 0) return true; /* the save will report it */
    if (!tiers) return false;
    pthread_mutex_lock(&s->mu);
    bool queued = ks_keymap_get(&s->pending, &key) != NULL;
    pthread_mutex_unlock(&s->mu);
    if (queued) atomic_fetch_add(&s->dedup_saves, 1);
    return !queued;
}

/* A new save job for tiers (tier: the one a lookup of the queued save
 * names) with a copy of tokens[0, n) and no payload yet, waited for unless
 * async; NULL when out of memory. */
static job *save_job(ks_tier_id tier, unsigned tiers, const ks_key *key, uint64_t tenant, ks_reason reason,
                     const int32_t *tokens, int n, size_t len, bool async) {
    job *j = calloc(1, sizeof *j);
    if (!j || !(j->tokens = malloc(n ? (size_t)n * sizeof *tokens : 1))) {
        free(j);
        return NULL;
    }
    memcpy(j->tokens, tokens, (size_t)n * sizeof *tokens);
    j->kind = JOB_SAVE;
    j->tier = tier;
    j->tiers = tiers;
    j->key = *key;
    j->tenant = tenant;
    j->reason = reason;
    j->n = n;
    j->len = len;
    j->created_us = ks_wall_us();
    j->async = async;
    j->refs = async ? 1 : 2;
    return j;
}

int ks_store_save(ks_store *s, ks_reason reason, const int32_t *tokens, int n, uint8_t *payload,
                  size_t len, bool sync) {
    return ks_store_save_in(s, 0, reason, tokens, n, payload, len, sync);
}

int ks_store_save_in(ks_store *s, uint64_t tenant, ks_reason reason, const int32_t *tokens, int n, uint8_t *payload,
                     size_t len, bool sync) {
    int rc = 0;
    job *j = NULL, *rj = NULL;
    ks_key key;
    if (!s || (int)reason < 0 || reason >= KS_REASON__N || n < 0 || (n > 0 && !tokens) ||
        (len && !payload) || (uint64_t)n > KS_KVFILE_MAX_TOKENS) {
        rc = KS_EINVAL;
        goto done;
    }
    unsigned tiers;
    if ((rc = save_check(s, reason, tenant, tokens, n, &key, &tiers)) != 0 || !tiers) goto done;
    /* A caller that waits (evict, shutdown: the inference thread) waits for
     * its local tier only: Redis's latency must never become its own. The
     * copy for Redis goes as a job of its own, never waited for, with a copy
     * of the payload (or, with no local tier, the save is not waited for). */
    const unsigned redis_bit = 1u << KS_TIER_REDIS;
    if (sync && (tiers & redis_bit)) {
        if (tiers == redis_bit) {
            sync = false;
        } else {
            tiers &= ~redis_bit;
            rj = save_job(KS_TIER_REDIS, redis_bit, &key, tenant, reason, tokens, n, len, true);
            if (rj && (rj->payload = malloc(len ? len : 1))) {
                memcpy(rj->payload, payload, len);
                rj->uncounted = true;
            } else {
                ks__store_job_free(rj);
                rj = NULL;
                ks_tier_note_dropped(s->tiers[KS_TIER_REDIS]);
            }
        }
    }
    /* The tier a lookup of the queued save names: the local one, if any. */
    ks_tier_id first = KS_TIER_REDIS;
    for (int t = KS_TIER__LOCAL - 1; t >= 0; t--)
        if (tiers & (1u << t)) first = (ks_tier_id)t;
    if (!(j = save_job(first, tiers, &key, tenant, reason, tokens, n, len, !sync))) {
        rc = KS_ENOMEM;
        goto done;
    }

    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        rc = KS_ESHUTDOWN;
    } else if (ks_keymap_get(&s->pending, &key)) {
        atomic_fetch_add(&s->dedup_saves, 1);
    } else if (!sync && (s->n_async >= s->queue_max || s->async_bytes + len > s->queue_max_bytes)) {
        atomic_fetch_add(&s->skipped_saves, 1);
        KS_WARN("store", "save queue full (%d saves, %llu bytes): skipping the %s save of %d tokens",
                s->n_async, (unsigned long long)s->async_bytes, ks_reason_name(reason), n);
        rc = KS_EFULL;
    } else if (ks_keymap_put(&s->pending, &key, j) != 0) {
        rc = KS_ENOMEM;
    } else {
        j->payload = payload; /* the job owns it now */
        payload = NULL;
        if (!sync) {
            s->n_async++;
            s->async_bytes += len;
        }
        ks__store_enqueue_locked(s, j);
        if (rj && s->n_async < s->queue_max && s->async_bytes + len <= s->queue_max_bytes) {
            /* After the local save in the FIFO: the caller's wait ends before it. */
            s->n_async++;
            s->async_bytes += len;
            ks__store_enqueue_locked(s, rj);
            rj = NULL;
        } else if (rj) {
            ks_tier_note_dropped(s->tiers[KS_TIER_REDIS]);
        }
        if (sync) rc = ks__store_wait_job_locked(s, j, s->cfg.shutdown_timeout_ms);
        j = NULL;
    }
    pthread_mutex_unlock(&s->mu);
done:
    ks__store_job_free(j);
    ks__store_job_free(rj);
    free(payload);
    return rc;
}

int ks_store_pin(ks_store *s, const int32_t *tokens, int n, int64_t until_us) {
    return ks_store_pin_in(s, 0, tokens, n, until_us);
}

int ks_store_pin_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, int64_t until_us) {
    ks_key key;
    if (!s || n < 1 || !tokens || (uint64_t)n > KS_KVFILE_MAX_TOKENS || until_us <= 0) return KS_EINVAL;
    int rc = ks_key_compute_tenant(s->fp, s->kv_params, s->kv_len, tenant, tokens, n, &key);
    if (rc != 0) return rc;
    /* Another process may hold it: one stat per directory tells (as a lookup). */
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) ks_tier_rescan(s->tiers[t], 0);
    if (!ks__store_pin_held(s, &key, until_us)) return KS_ENOENT;
    atomic_fetch_add(&s->pin_refreshes, 1);
    return 0;
}

int ks_store_save_pinned(ks_store *s, const int32_t *tokens, int n, uint8_t *payload, size_t len,
                         int64_t until_us) {
    return ks_store_save_pinned_in(s, 0, tokens, n, payload, len, until_us);
}

int ks_store_save_pinned_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, uint8_t *payload, size_t len,
                            int64_t until_us) {
    int rc = 0;
    job *j = NULL;
    ks_key key;
    if (!s || n < 1 || !tokens || (len && !payload) || (uint64_t)n > KS_KVFILE_MAX_TOKENS || until_us <= 0) {
        rc = KS_EINVAL;
        goto done;
    }
    /* The ram tier, and the tier of reason pin when it is another one. */
    unsigned tiers = 0;
    int pt = s->cfg.reason_tier[KS_REASON_PIN];
    if (s->tiers[KS_TIER_RAM]) tiers |= 1u << KS_TIER_RAM;
    if (pt != KS_TIER_NONE && s->tiers[pt]) tiers |= 1u << pt;
    if (!tiers) {
        atomic_fetch_add(&s->dropped_saves, 1);
        rc = KS_ENOENT;
        goto done;
    }
    if ((rc = ks_key_compute_tenant(s->fp, s->kv_params, s->kv_len, tenant, tokens, n, &key)) != 0) goto done;
    if (ks__store_pin_held(s, &key, until_us)) {
        atomic_fetch_add(&s->dedup_saves, 1);
        atomic_fetch_add(&s->pin_refreshes, 1);
        goto done; /* 0: held, its pin extended */
    }
    ks_tier_id first = (tiers & (1u << KS_TIER_RAM)) ? KS_TIER_RAM : (ks_tier_id)pt;
    if (!(j = save_job(first, tiers, &key, tenant, KS_REASON_PIN, tokens, n, len, true))) {
        rc = KS_ENOMEM;
        goto done;
    }
    j->pin_until_us = until_us;

    pthread_mutex_lock(&s->mu);
    job *q = ks_keymap_get(&s->pending, &key);
    if (s->stopping) {
        rc = KS_ESHUTDOWN;
    } else if (q) {
        /* Queued since the check above: pin that one. */
        if (until_us > q->pin_until_us) q->pin_until_us = until_us;
        atomic_fetch_add(&s->dedup_saves, 1);
        atomic_fetch_add(&s->pin_refreshes, 1);
    } else if (s->n_async >= s->queue_max || s->async_bytes + len > s->queue_max_bytes) {
        atomic_fetch_add(&s->skipped_saves, 1);
        KS_WARN("store", "save queue full (%d saves, %llu bytes): skipping the pinned save of %d tokens",
                s->n_async, (unsigned long long)s->async_bytes, n);
        rc = KS_EFULL;
    } else if (ks_keymap_put(&s->pending, &key, j) != 0) {
        rc = KS_ENOMEM;
    } else {
        j->payload = payload; /* the job owns it now */
        payload = NULL;
        s->n_async++;
        s->async_bytes += len;
        ks__store_enqueue_locked(s, j);
        j = NULL;
        rc = 1;
    }
    pthread_mutex_unlock(&s->mu);
done:
    ks__store_job_free(j);
    free(payload);
    return rc;
}

int ks_store_flush(ks_store *s, int timeout_ms) {
    if (!s) return KS_EINVAL;
    return ks__store_run_waited(s, JOB_FLUSH, timeout_ms);
}

void ks_store_note_restore(ks_store *s, double ms) {
    if (s) ks__store_add_ms(&s->restore_us, ms);
}

void ks_store_stats(ks_store *s, struct ks_store_stats *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    if (!s) return;
    o->lookups = atomic_load(&s->lookups);
    o->hits = atomic_load(&s->hits);
    o->misses = atomic_load(&s->misses);
    int64_t now = ks_wall_us();
    for (int t = 0; t < KS_TIER__N; t++) {
        o->tier_hits[t] = atomic_load(&s->tier_hits[t]);
        o->tier_misses[t] = atomic_load(&s->tier_misses[t]);
        o->tier_evictions[t] = atomic_load(&s->tier_evictions[t]);
        o->tier_pin_drops[t] = atomic_load(&s->tier_pin_drops[t]);
        if (t == KS_TIER_REDIS && s->tiers[t]) {
            /* Redis's own accounting, shared by every host, as last seen. */
            ks_tier_get_remote_stats(s->tiers[t], &o->redis);
            o->has_redis = true;
            o->tier_bytes[t] = o->redis.bytes;
            o->tier_entries[t] = o->redis.entries;
            o->tier_max_bytes[t] = (uint64_t)s->cfg.tier_max_bytes[t];
        } else if (s->tiers[t]) {
            ks_tier_usage(s->tiers[t], &o->tier_bytes[t], &o->tier_entries[t]);
            o->tier_max_bytes[t] = (uint64_t)s->cfg.tier_max_bytes[t];
            o->tier_pinned_bytes[t] = ks_tier_pinned_bytes(s->tiers[t], now, &o->tier_pinned_entries[t]);
        }
    }
    o->pin_saves = atomic_load(&s->pin_saves);
    o->pin_refreshes = atomic_load(&s->pin_refreshes);
    for (int r = 0; r < KS_REASON__N; r++) o->saves[r] = atomic_load(&s->saves[r]);
    o->saved_bytes = atomic_load(&s->saved_bytes);
    o->dedup_saves = atomic_load(&s->dedup_saves);
    o->small_saves = atomic_load(&s->small_saves);
    o->dropped_saves = atomic_load(&s->dropped_saves);
    o->skipped_saves = atomic_load(&s->skipped_saves);
    o->failed_saves = atomic_load(&s->failed_saves);
    /* Bad files met by lookups, plus those the tiers' scans and saves moved aside. */
    o->corrupt_files = atomic_load(&s->corrupt_files);
    o->pending_hits = atomic_load(&s->pending_hits);
    o->kv_type_misses = atomic_load(&s->kv_type_misses);
    o->prefetches = atomic_load(&s->prefetches);
    o->prefetch_fetched = atomic_load(&s->prefetch_fetched);
    o->prefetch_used = atomic_load(&s->prefetch_used);
    o->prefetch_dropped = atomic_load(&s->prefetch_dropped);
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) {
            o->corrupt_files += atomic_load(&s->tiers[t]->n_bad);
            o->skipped_files += atomic_load(&s->tiers[t]->n_skipped);
        }
    o->load_ms_total = (double)atomic_load(&s->load_us) / 1000.0;
    o->save_ms_total = (double)atomic_load(&s->save_us) / 1000.0;
    o->restore_ms_total = (double)atomic_load(&s->restore_us) / 1000.0;
    pthread_mutex_lock(&s->mu);
    o->queued = (uint64_t)(s->n_queued + s->n_writing);
    pthread_mutex_unlock(&s->mu);
}

/* ----------------------------------------------------------------- verify */
int ks_store_verify_dir(const char *dir, ks_store_verify_cb cb, void *ud) {
    return ks_store_verify_dir_mac(dir, NULL, cb, ud);
}

int ks_store_verify_dir_mac(const char *dir, const ks_kvmac_key *mac, ks_store_verify_cb cb, void *ud) {
    int bad = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? KS_ENOENT : errno == ENOTDIR ? KS_EINVAL : KS_EIO;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        ks_key name_key;
        char path[PATH_MAX];
        if (!ks_kvfile_name_parse(de->d_name, &name_key)) continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path) continue;
        ks_kvfile_meta m;
        ks_kvfile_expect exp = {.key = &name_key, .mac = mac};
        int mrc = ks_kvfile_read_meta(path, &m);
        int rc = mrc == 0 ? ks_kvfile_read(path, &exp, NULL, NULL, NULL) : mrc;
        if (rc == KS_ENOENT) continue; /* removed while we looked */
        if (rc == KS_EMISMATCH) rc = KS_ECORRUPT; /* the name does not match the content */
        if (rc != 0 && rc != KS_EINVAL) bad++; /* KS_EINVAL: not a regular file, not read */
        if (cb && cb(ud, path, rc, mrc == 0 ? &m : NULL) != 0) break;
    }
    closedir(d);
    return bad;
}

/*
 * store.c — see store.h.
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
 * Where state changes
 *   - tier tables: the writer (put, evict, quarantine, GC rescans); lookups
 *     (hit statistics, entries of vanished files, rescans that add entries);
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

#define PERSIST_EVERY_MS 1000.0

typedef enum { JOB_SAVE, JOB_QUARANTINE, JOB_GC, JOB_FLUSH } job_kind;

typedef struct job {
    struct job *next;
    job_kind kind;
    ks_tier_id tier;
    ks_key key;
    /* save */
    ks_reason reason;
    int32_t *tokens;
    int n;
    uint8_t *payload;
    size_t len;
    int64_t created_us;
    bool async;
    /* completion (under s->mu) */
    int refs;          /* 1, or 2 while a caller waits */
    bool done;
    int result;
} job;

struct ks_store {
    ks_store_cfg cfg;
    uint8_t fp[32];
    uint8_t params_hash[32];
    void *kv_params;
    size_t kv_len;
    uint32_t state_version;
    int queue_max;
    uint64_t queue_max_bytes;
    ks_tier *tiers[KS_TIER__N];

    pthread_t writer;
    bool writer_started;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* a job was queued or stop was asked */
    pthread_cond_t done_cv;   /* a waited-for job completed */
    job *head, *tail;
    ks_keymap pending;        /* keys of queued saves (values: the job) */
    int n_async;
    uint64_t async_bytes;
    int n_queued;
    bool stopping;
    double stop_deadline_ms;

    /* counters */
    _Atomic uint64_t lookups, hits, misses;
    _Atomic uint64_t tier_hits[KS_TIER__N], tier_misses[KS_TIER__N], tier_evictions[KS_TIER__N];
    _Atomic uint64_t saves[KS_REASON__N], saved_bytes;
    _Atomic uint64_t dedup_saves, small_saves, dropped_saves, skipped_saves, failed_saves;
    _Atomic uint64_t corrupt_files;
    _Atomic uint64_t pending_hits;
    _Atomic uint64_t load_us, save_us, restore_us;
};

static int64_t wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void add_ms(_Atomic uint64_t *acc, double ms) {
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

/* ------------------------------------------------------------------ jobs */
static void job_free(job *j) {
    if (!j) return;
    free(j->tokens);
    free(j->payload);
    free(j);
}

/* Drops one reference (caller holds s->mu); frees at zero. */
static void job_unref_locked(job *j) {
    if (--j->refs == 0) job_free(j);
}

static void enqueue_locked(ks_store *s, job *j) {
    j->next = NULL;
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->work_cv);
}

/* Waits for j (refs 2) to complete; returns its result or KS_EBUSY on
 * timeout. Drops the waiter's reference either way. Caller holds s->mu. */
static int wait_job_locked(ks_store *s, job *j, int timeout_ms) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms > 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    while (!j->done) {
        int r = timeout_ms > 0 ? pthread_cond_timedwait(&s->done_cv, &s->mu, &dl)
                               : pthread_cond_wait(&s->done_cv, &s->mu);
        if (r == ETIMEDOUT && !j->done) break;
    }
    int rc = j->done ? j->result : KS_EBUSY;
    job_unref_locked(j);
    return rc;
}

/* Queues a barrier-like job (GC/FLUSH) and waits for it. */
static int run_waited(ks_store *s, job_kind kind, int timeout_ms) {
    job *j = calloc(1, sizeof *j);
    if (!j) return KS_ENOMEM;
    j->kind = kind;
    j->refs = 2;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(j);
        return KS_ESHUTDOWN;
    }
    enqueue_locked(s, j);
    int rc = wait_job_locked(s, j, timeout_ms);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static bool stored_anywhere(ks_store *s, const ks_key *key);

/* ---------------------------------------------------------- writer side */
static int evict_tier(ks_store *s, int t, uint64_t max_bytes) {
    int n = ks_tier_evict(s->tiers[t], max_bytes, NULL, NULL);
    if (n > 0) {
        atomic_fetch_add(&s->tier_evictions[t], (uint64_t)n);
        KS_DEBUG("store", "evicted %d %s entries to stay under %llu bytes", n, ks_tier_name(t),
                 (unsigned long long)max_bytes);
    }
    return n;
}

static int do_save(ks_store *s, job *j) {
    int t = j->tier;
    ks_tier *tier = s->tiers[t];
    uint64_t budget = (uint64_t)s->cfg.tier_max_bytes[t];
    uint64_t need = (uint64_t)KS_KVFILE_HEADER_LEN + 4ull * (uint64_t)j->n + j->len + KS_KVFILE_TAIL_LEN;
    bool existed = false;
    if (!tier) {
        atomic_fetch_add(&s->dropped_saves, 1);
        return 0;
    }
    if (need > budget) {
        KS_INFO("store", "not saving %d tokens (%s): %llu bytes exceed the %s budget of %llu",
                j->n, ks_reason_name(j->reason), (unsigned long long)need, ks_tier_name(t),
                (unsigned long long)budget);
        atomic_fetch_add(&s->dropped_saves, 1);
        return KS_ENOSPC;
    }
    /* Saved meanwhile (e.g. by another process, seen by a rescan): no need to
     * make room for it. */
    if (stored_anywhere(s, &j->key)) {
        atomic_fetch_add(&s->dedup_saves, 1);
        return 0;
    }
    /* Make room first, so that the tier never holds more than its budget.
     * Another process may have saved into the same directory since we last
     * looked (one stat tells): count its files too, or two writers would
     * each fill the budget. */
    ks_tier_rescan(tier, 0);
    evict_tier(s, t, budget - need);
    ks_kvfile_meta m;
    memset(&m, 0, sizeof m);
    m.state_version = s->state_version;
    m.reason = (uint32_t)j->reason;
    m.created_us = j->created_us;
    memcpy(m.model_fp, s->fp, 32);
    memcpy(m.params_hash, s->params_hash, 32);
    m.key = j->key;
    double t0 = ks_now_ms();
    /* Lookups may copy j->payload under s->mu until the job completes (read
     * your own writes). A tier that keeps the buffer (ram) takes it from a
     * local pointer; j->payload is cleared under s->mu right after, before
     * anything could drop the tier's reference to it (only this thread
     * evicts), so a lookup either copies a live buffer or finds the entry
     * in the tier. */
    uint8_t *pl = j->payload;
    int rc = ks_tier_put(tier, &m, j->tokens, j->n, &pl, j->len, &existed);
    if (!pl) {
        pthread_mutex_lock(&s->mu);
        j->payload = NULL; /* the tier keeps it */
        pthread_mutex_unlock(&s->mu);
    }
    add_ms(&s->save_us, ks_now_ms() - t0);
    if (rc != 0) {
        KS_WARN("store", "save of %d tokens (%s) to %s failed: %s; skipped", j->n,
                ks_reason_name(j->reason), ks_tier_name(t), ks_strerror(rc));
        atomic_fetch_add(&s->failed_saves, 1);
        return rc;
    }
    if (existed) {
        atomic_fetch_add(&s->dedup_saves, 1);
        return 0;
    }
    atomic_fetch_add(&s->saves[j->reason], 1);
    atomic_fetch_add(&s->saved_bytes, j->len);
    KS_DEBUG("store", "saved %d tokens (%s, %zu bytes) to %s in %.1f ms", j->n,
             ks_reason_name(j->reason), j->len, ks_tier_name(t), ks_now_ms() - t0);
    evict_tier(s, t, budget);
    return 0;
}

static int do_gc(ks_store *s) {
    int n = 0;
    for (int t = 0; t < KS_TIER__N; t++) {
        if (!s->tiers[t]) continue;
        ks_tier_rescan(s->tiers[t], KS_RESCAN_FORCE | KS_RESCAN_CLEANUP);
        n += evict_tier(s, t, (uint64_t)s->cfg.tier_max_bytes[t]);
    }
    return n;
}

static void persist_all(ks_store *s) {
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) ks_tier_persist(s->tiers[t]);
}

static void *writer_main(void *arg) {
    /* The writer runs at SCHED_IDLE: on a machine whose cores all run
     * llama.cpp's worker threads, any other runnable thread makes those
     * threads wait at their barriers, and a save would then slow every
     * request down far more than its own CPU time. Idle priority lets saves
     * use the gaps between decode steps. Lowering one's own priority needs
     * no privilege; if it fails the writer simply runs at normal priority. */
    struct sched_param sp = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) != 0)
        KS_DEBUG("store", "writer thread stays at normal priority");
    ks_store *s = arg;
    double last_persist = ks_now_ms();
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (!s->head) {
            if (s->stopping) break;
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_sec += 1;
            pthread_cond_timedwait(&s->work_cv, &s->mu, &dl);
        }
        job *j = s->head;
        if (j) {
            s->head = j->next;
            if (!s->head) s->tail = NULL;
            s->n_queued--;
            if (j->kind == JOB_SAVE && j->async) {
                s->n_async--;
                s->async_bytes -= j->len;
            }
        }
        bool late = s->stopping && ks_now_ms() > s->stop_deadline_ms;
        pthread_mutex_unlock(&s->mu);

        int rc = 0;
        if (j) {
            switch (j->kind) {
            case JOB_SAVE:
                if (late) {
                    KS_WARN("store", "shutdown timeout: dropping the save of %d tokens (%s)", j->n,
                            ks_reason_name(j->reason));
                    atomic_fetch_add(&s->skipped_saves, 1);
                    rc = KS_ESHUTDOWN;
                } else {
                    rc = do_save(s, j);
                }
                break;
            case JOB_QUARANTINE:
                if (s->tiers[j->tier]) ks_tier_quarantine(s->tiers[j->tier], &j->key);
                break;
            case JOB_GC: rc = do_gc(s); break;
            case JOB_FLUSH: break;
            }
        }
        if (ks_now_ms() - last_persist >= PERSIST_EVERY_MS) {
            persist_all(s);
            last_persist = ks_now_ms();
        }

        pthread_mutex_lock(&s->mu);
        if (j) {
            if (j->kind == JOB_SAVE) {
                if (ks_keymap_get(&s->pending, &j->key) == j) ks_keymap_del(&s->pending, &j->key);
                free(j->payload); /* still ours unless a tier kept it */
                j->payload = NULL;
            }
            j->done = true;
            j->result = rc;
            if (j->refs > 1) pthread_cond_broadcast(&s->done_cv);
            job_unref_locked(j);
        }
    }
    pthread_mutex_unlock(&s->mu);
    persist_all(s);
    return NULL;
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
    if (!p || (p->kv_params_len && !p->kv_params) || p->cfg.stride < 0 || p->queue_max < 0) {
        ks_set_err(err, errlen, "invalid store parameters");
        return KS_EINVAL;
    }
    for (int r = 0; r < KS_REASON__N; r++) {
        int t = p->cfg.reason_tier[r];
        if (t != KS_TIER_NONE && (t < 0 || t >= KS_TIER__N)) {
            ks_set_err(err, errlen, "invalid tier %d for reason %s", t, ks_reason_name(r));
            return KS_EINVAL;
        }
    }
    if (!(s = calloc(1, sizeof *s))) return KS_ENOMEM;
    s->cfg = p->cfg;
    memcpy(s->fp, p->model_fp, 32);
    s->state_version = p->state_version;
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
                           .state_version = s->state_version};
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
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
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
        enqueue_locked(s, g);
        pthread_mutex_unlock(&s->mu);
    }
    for (int t = 0; t < KS_TIER__N; t++) {
        uint64_t b = 0, e = 0;
        if (!s->tiers[t]) {
            /* A disabled tier: its directory, if any is named, is not used. */
            KS_INFO("store", "%-4s tier: off", ks_tier_name(t));
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
    for (int t = 0; t < KS_TIER__N; t++) ks_tier_close(s->tiers[t]);
    ks_keymap_free(&s->pending);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(s->kv_params);
    free(s);
}

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

/* Hides a bad entry and asks the writer to move its file aside. */
static void report_bad(ks_store *s, int t, const ks_key *key, int L, int rc) {
    if (!ks_tier_mark_bad(s->tiers[t], key)) return; /* someone else reported it */
    atomic_fetch_add(&s->corrupt_files, 1);
    char hex[KS_KEY_HEX_LEN + 1];
    ks_key_to_hex(key, hex);
    KS_WARN("store", "%s entry %.12s (%d tokens) failed to load: %s; treated as a miss", ks_tier_name(t),
            hex, L, ks_strerror(rc));
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
        enqueue_locked(s, j);
    pthread_mutex_unlock(&s->mu);
}

/* The entry of key (tokens[0, n)) from the first tier that holds it and
 * verifies: 0 and hit filled, else KS_ENOENT (a bad entry is reported). */
static int tiers_get(ks_store *s, const ks_key *key, const int32_t *tokens, int n, ks_store_hit *hit) {
    for (int t = 0; t < KS_TIER__N; t++) {
        ks_tier_entry e;
        if (!s->tiers[t] || !ks_tier_has(s->tiers[t], key, &e)) continue;
        if (e.cls == KS_ENTRY_FOREIGN) continue;
        ks_kvfile_expect exp = {
            .model_fp = s->fp,
            .params_hash = s->params_hash,
            .check_state_version = true,
            .state_version = s->state_version,
            .key = key,
            .tokens = tokens,
            .n_tokens = n,
        };
        double t0 = ks_now_ms();
        int r = ks_tier_get(s->tiers[t], key, &exp, &hit->blob_);
        if (r == 0) {
            hit->n_tokens = n;
            hit->tier = (ks_tier_id)t;
            hit->reason = (ks_reason)e.reason;
            hit->payload = hit->blob_.payload;
            hit->payload_len = hit->blob_.len;
            hit->load_ms = ks_now_ms() - t0;
            add_ms(&s->load_us, hit->load_ms);
            return 0;
        }
        if (r == KS_ECORRUPT || r == KS_EVERSION || r == KS_EMISMATCH)
            report_bad(s, t, key, n, r);
        else if (r != KS_ENOENT)
            KS_WARN("store", "%s entry of %d tokens could not be read: %s", ks_tier_name(t), n, ks_strerror(r));
    }
    return KS_ENOENT;
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
        add_ms(&s->load_us, hit->load_ms);
        atomic_fetch_add(&s->pending_hits, 1);
        KS_DEBUG("store", "lookup: %d tokens from the save queue (%s, not written yet)", n, ks_tier_name(hit->tier));
    }
    return rc;
}

/* One walk over the candidate lengths, longest first. 0 with *hit filled, or
 * KS_ENOENT / KS_ENOMEM. */
static int probe(ks_store *s, const int32_t *tokens, int min_len, int lim, ks_store_hit *hit) {
    int rc = KS_ENOENT, k = 0;
    int *lens = NULL;
    ks_key *keys = NULL;
    uint64_t n_entries = 0;
    for (int t = 0; t < KS_TIER__N; t++) {
        uint64_t e = 0;
        if (s->tiers[t]) ks_tier_usage(s->tiers[t], NULL, &e);
        n_entries += e;
    }
    int n_stride = s->cfg.stride > 0 ? lim / s->cfg.stride : 0;
    pthread_mutex_lock(&s->mu);
    int n_queued = (int)s->pending.n;
    pthread_mutex_unlock(&s->mu);
    /* Entries may be added while we collect: the cap just truncates. */
    int cap = n_stride + (int)(n_entries < (uint64_t)INT_MAX / 2 ? n_entries : (uint64_t)INT_MAX / 2) + n_queued + 16;
    if (!(lens = malloc((size_t)cap * sizeof *lens))) {
        rc = KS_ENOMEM;
        goto done;
    }
    for (int i = 1; i <= n_stride; i++) lens[k++] = i * s->cfg.stride;
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) ks_tier_lengths(s->tiers[t], lim, lens, &k, cap);
    /* The lengths of saves not written yet too: queued, or being written
     * (out of the queue already, still in `pending` until they complete). */
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->pending.cap && k < cap; i++) {
        if (!ks_keymap_live(&s->pending, i)) continue;
        const job *q = s->pending.vals[i];
        if (q->kind == JOB_SAVE && q->n <= lim) lens[k++] = q->n;
    }
    pthread_mutex_unlock(&s->mu);
    if (k == 0) goto done;
    qsort(lens, (size_t)k, sizeof *lens, int_cmp);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (u == 0 || lens[i] != lens[u - 1]) lens[u++] = lens[i];
    k = u;
    if (!(keys = malloc((size_t)k * sizeof *keys))) {
        rc = KS_ENOMEM;
        goto done;
    }
    int kr = ks_key_prefixes(s->fp, s->kv_params, s->kv_len, tokens, lim, lens, k, keys);
    if (kr != 0) {
        rc = kr;
        goto done;
    }
    for (int i = k - 1; i >= 0 && lens[i] >= min_len; i--) {
        /* A save not written yet first (read your own writes), then the
         * tiers: the writer puts an entry into its tier before the job
         * leaves `pending`, so a save completing between the two checks is
         * found by one of them (the other order could miss it in both). */
        if (pending_get(s, &keys[i], tokens, lens[i], hit) == 0 ||
            tiers_get(s, &keys[i], tokens, lens[i], hit) == 0) {
            rc = 0;
            goto done;
        }
    }
done:
    free(keys);
    free(lens);
    return rc;
}

int ks_store_lookup(ks_store *s, const int32_t *tokens, int n, int max_len, ks_store_hit *hit) {
    return ks_store_lookup_range(s, tokens, n, 1, max_len, hit);
}

int ks_store_lookup_range(ks_store *s, const int32_t *tokens, int n, int min_len, int max_len,
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
        rc = probe(s, tokens, min_len < 1 ? 1 : min_len, lim, hit);
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

/* ------------------------------------------------------------------- save */
static bool stored_anywhere(ks_store *s, const ks_key *key) {
    for (int t = 0; t < KS_TIER__N; t++) {
        ks_tier_entry e;
        if (s->tiers[t] && ks_tier_has(s->tiers[t], key, &e) && e.cls == KS_ENTRY_OWN) return true;
    }
    return false;
}

/* The checks every save goes through before it is queued: *tier is the
 * tier it goes to, or -1 when it is not written — too small, a reason mapped
 * to no (enabled) tier, or the state is stored already — each counted as
 * such; *key is computed when the key was needed. Returns 0 or the error of
 * computing the key. (Whether the state is queued already is checked by the
 * callers, under s->mu.) */
static int save_check(ks_store *s, ks_reason reason, const int32_t *tokens, int n, ks_key *key, int *tier) {
    *tier = -1;
    if (n < s->cfg.min_tokens || n == 0) {
        atomic_fetch_add(&s->small_saves, 1);
        return 0;
    }
    int t = s->cfg.reason_tier[reason];
    if (t == KS_TIER_NONE || !s->tiers[t]) {
        atomic_fetch_add(&s->dropped_saves, 1);
        return 0;
    }
    int rc = ks_key_compute(s->fp, s->kv_params, s->kv_len, tokens, n, key);
    if (rc != 0) return rc;
    if (stored_anywhere(s, key)) {
        atomic_fetch_add(&s->dedup_saves, 1);
        return 0;
    }
    *tier = t;
    return 0;
}

bool ks_store_wants(ks_store *s, ks_reason reason, const int32_t *tokens, int n) {
    if (!s || (int)reason < 0 || reason >= KS_REASON__N || n <= 0 || !tokens) return false;
    /* A "no" is accounted as the save would have been: small, dropped or dedup. */
    ks_key key;
    int t;
    if (save_check(s, reason, tokens, n, &key, &t) != 0) return true; /* the save will report it */
    if (t < 0) return false;
    pthread_mutex_lock(&s->mu);
    bool queued = ks_keymap_get(&s->pending, &key) != NULL;
    pthread_mutex_unlock(&s->mu);
    if (queued) atomic_fetch_add(&s->dedup_saves, 1);
    return !queued;
}

int ks_store_save(ks_store *s, ks_reason reason, const int32_t *tokens, int n, uint8_t *payload,
                  size_t len, bool sync) {
    int rc = 0;
    job *j = NULL;
    ks_key key;
    if (!s || (int)reason < 0 || reason >= KS_REASON__N || n < 0 || (n > 0 && !tokens) ||
        (len && !payload) || (uint64_t)n > KS_KVFILE_MAX_TOKENS) {
        rc = KS_EINVAL;
        goto done;
    }
    int t;
    if ((rc = save_check(s, reason, tokens, n, &key, &t)) != 0 || t < 0) goto done;
    if (!(j = calloc(1, sizeof *j)) || !(j->tokens = malloc((size_t)n * sizeof *tokens))) {
        rc = KS_ENOMEM;
        goto done;
    }
    memcpy(j->tokens, tokens, (size_t)n * sizeof *tokens);
    j->kind = JOB_SAVE;
    j->tier = (ks_tier_id)t;
    j->key = key;
    j->reason = reason;
    j->n = n;
    j->len = len;
    j->created_us = wall_us();
    j->async = !sync;
    j->refs = sync ? 2 : 1;

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
        enqueue_locked(s, j);
        if (sync) rc = wait_job_locked(s, j, s->cfg.shutdown_timeout_ms);
        j = NULL;
    }
    pthread_mutex_unlock(&s->mu);
done:
    job_free(j);
    free(payload);
    return rc;
}

int ks_store_flush(ks_store *s, int timeout_ms) {
    if (!s) return KS_EINVAL;
    return run_waited(s, JOB_FLUSH, timeout_ms);
}

int ks_store_gc(ks_store *s) {
    if (!s) return KS_EINVAL;
    return run_waited(s, JOB_GC, s->cfg.shutdown_timeout_ms);
}

void ks_store_note_restore(ks_store *s, double ms) {
    if (s) add_ms(&s->restore_us, ms);
}

void ks_store_stats(ks_store *s, struct ks_store_stats *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    if (!s) return;
    o->lookups = atomic_load(&s->lookups);
    o->hits = atomic_load(&s->hits);
    o->misses = atomic_load(&s->misses);
    for (int t = 0; t < KS_TIER__N; t++) {
        o->tier_hits[t] = atomic_load(&s->tier_hits[t]);
        o->tier_misses[t] = atomic_load(&s->tier_misses[t]);
        o->tier_evictions[t] = atomic_load(&s->tier_evictions[t]);
        if (s->tiers[t]) {
            ks_tier_usage(s->tiers[t], &o->tier_bytes[t], &o->tier_entries[t]);
            o->tier_max_bytes[t] = (uint64_t)s->cfg.tier_max_bytes[t];
        }
    }
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
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) o->corrupt_files += atomic_load(&s->tiers[t]->n_bad);
    o->load_ms_total = (double)atomic_load(&s->load_us) / 1000.0;
    o->save_ms_total = (double)atomic_load(&s->save_us) / 1000.0;
    o->restore_ms_total = (double)atomic_load(&s->restore_us) / 1000.0;
    pthread_mutex_lock(&s->mu);
    o->queued = (uint64_t)s->n_queued;
    pthread_mutex_unlock(&s->mu);
}

/* ----------------------------------------------------------------- verify */
int ks_store_verify_dir(const char *dir, ks_store_verify_cb cb, void *ud) {
    int bad = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? KS_ENOENT : KS_EIO;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        ks_key name_key;
        char path[PATH_MAX];
        if (!ks_kvfile_name_parse(de->d_name, &name_key)) continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path) continue;
        ks_kvfile_meta m;
        ks_kvfile_expect exp = {.key = &name_key};
        int mrc = ks_kvfile_read_meta(path, &m);
        int rc = mrc == 0 ? ks_kvfile_read(path, &exp, NULL, NULL, NULL) : mrc;
        if (rc == KS_ENOENT) continue; /* removed while we looked */
        if (rc == KS_EMISMATCH) rc = KS_ECORRUPT; /* the name does not match the content */
        if (rc != 0) bad++;
        if (cb && cb(ud, path, rc, mrc == 0 ? &m : NULL) != 0) break;
    }
    closedir(d);
    return bad;
}

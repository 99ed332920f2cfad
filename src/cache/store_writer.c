/*
 * store_writer.c — the store's job queue and writer thread (see the notes
 * at the top of store.c and store_int.h).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cache/store_int.h"

#define PERSIST_EVERY_MS 1000.0

/* ------------------------------------------------------------------ jobs */
void ks__store_job_free(job *j) {
    if (!j) return;
    free(j->tokens);
    free(j->payload);
    free(j);
}

/* Drops one reference (caller holds s->mu); frees at zero. */
void ks__store_job_unref_locked(job *j) {
    if (--j->refs == 0) ks__store_job_free(j);
}

void ks__store_enqueue_locked(ks_store *s, job *j) {
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
int ks__store_wait_job_locked(ks_store *s, job *j, int timeout_ms) {
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
    ks__store_job_unref_locked(j);
    return rc;
}

/* Queues a barrier-like job (GC/FLUSH) and waits for it. */
int ks__store_run_waited(ks_store *s, job_kind kind, int timeout_ms) {
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
    ks__store_enqueue_locked(s, j);
    int rc = ks__store_wait_job_locked(s, j, timeout_ms);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---------------------------------------------------------- writer side */
/* Evicts from tier t down to max_bytes, passing over the pinned entries that
 * fit in its pin budget (cfg.pin_share of the tier's budget); incoming_bytes
 * of a pinned save about to be put compete for that protection. */
static int evict_tier(ks_store *s, int t, uint64_t max_bytes, uint64_t incoming_bytes, int64_t incoming_until_us) {
    ks_tier_pins pins = {
        .now_us = ks_wall_us(),
        .max_bytes = (uint64_t)((double)s->cfg.pin_share * (double)s->cfg.tier_max_bytes[t]),
        .incoming_bytes = incoming_bytes,
        .incoming_until_us = incoming_until_us,
    };
    int n = ks_tier_evict(s->tiers[t], max_bytes, &pins, NULL, NULL);
    if (n > 0) {
        atomic_fetch_add(&s->tier_evictions[t], (uint64_t)n);
        KS_DEBUG("store", "evicted %d %s entries to stay under %llu bytes", n, ks_tier_name(t),
                 (unsigned long long)max_bytes);
    }
    if (pins.dropped > 0) {
        atomic_fetch_add(&s->tier_pin_drops[t], (uint64_t)pins.dropped);
        KS_INFO("store", "evicted %d pinned %s entries before their deadline: pins exceed %.0f%% of the budget",
                pins.dropped, ks_tier_name(t), 100.0 * s->cfg.pin_share);
    }
    return n;
}

/* What a save did in one tier, worst first: a job's outcome is the best of
 * its tiers'. */
enum { SAVE_FAILED = 0, SAVE_DROPPED, SAVE_EXISTED, SAVE_WROTE };

/* A save to the shared (remote) tier that failed: Redis unreachable, slow or
 * full costs that copy only — dropped and counted by the tier, never an
 * error of the save (its local tier may have it). */
static int remote_failed(ks_store *s, job *j, int t, int rc, int *out) {
    (void)s;
    KS_DEBUG("store", "save of %d tokens (%s) to %s dropped: %s", j->n, ks_reason_name(j->reason), ks_tier_name(t),
             ks_strerror(rc));
    ks_tier_note_dropped(s->tiers[t]);
    *out = SAVE_DROPPED;
    return 0;
}

/* Puts job j into tier t, pinned until pin (0: not pinned). *out: what
 * happened (SAVE_*), counted by the caller: one outcome per job, whatever
 * the number of its tiers, so that every save request is accounted for
 * exactly once (written, or not written with one cause). Returns 0 or the
 * error of this tier (logged). */
static int save_to(ks_store *s, job *j, int t, int64_t pin, int *out) {
    ks_tier *tier = s->tiers[t];
    uint64_t budget = (uint64_t)s->cfg.tier_max_bytes[t];
    uint64_t need = ks_kvfile_size_flags(j->n, j->len, KS_KVFILE_FLAG_PIN | (s->has_mac ? KS_KVFILE_FLAG_MAC : 0));
    bool existed = false;
    *out = SAVE_DROPPED;
    if (!tier) return 0;
    if (need > budget) {
        KS_INFO("store", "not saving %d tokens (%s): %llu bytes exceed the %s budget of %llu",
                j->n, ks_reason_name(j->reason), (unsigned long long)need, ks_tier_name(t),
                (unsigned long long)budget);
        return KS_ENOSPC;
    }
    if (tier->vt->make_room) {
        /* A shared tier keeps its budget by its own accounting (redis). */
        int r = tier->vt->make_room(tier, need, budget);
        if (r < 0) return remote_failed(s, j, t, r, out);
        if (r > 0) atomic_fetch_add(&s->tier_evictions[t], (uint64_t)r);
    } else {
        /* Make room first, so that the tier never holds more than its budget.
         * Another process may have saved into the same directory since we last
         * looked (one stat tells): count its files too, or two writers would
         * each fill the budget. */
        ks_tier_rescan(tier, 0);
        evict_tier(s, t, budget - need, pin ? need : 0, pin);
        uint64_t used = 0;
        ks_tier_usage(tier, &used, NULL);
        if (used + need > budget) {
            /* The pinned entries hold the room (at most pin_share of the budget). */
            KS_INFO("store", "not saving %d tokens (%s) to %s: pinned entries hold the room", j->n,
                    ks_reason_name(j->reason), ks_tier_name(t));
            return KS_ENOSPC;
        }
    }
    ks_kvfile_meta m;
    memset(&m, 0, sizeof m);
    m.state_version = s->state_version;
    m.reason = (uint32_t)j->reason;
    m.created_us = j->created_us;
    m.pin_until_us = pin;
    memcpy(m.model_fp, s->fp, 32);
    memcpy(m.params_hash, s->params_hash, 32);
    m.key = j->key;
    m.tenant = j->tenant;
    m.mac = s->has_mac ? &s->mac : NULL;
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
    ks__store_add_ms(&s->save_us, ks_now_ms() - t0);
    if (rc != 0 && tier->vt->make_room) return remote_failed(s, j, t, rc, out);
    if (rc != 0) {
        KS_WARN("store", "save of %d tokens (%s) to %s failed: %s; skipped", j->n,
                ks_reason_name(j->reason), ks_tier_name(t), ks_strerror(rc));
        *out = SAVE_FAILED;
        return rc;
    }
    if (existed) {
        /* Another process saved it: it is held, and pinned. */
        if (pin) ks_tier_pin(tier, &j->key, pin);
        *out = SAVE_EXISTED;
        return 0;
    }
    *out = SAVE_WROTE;
    KS_DEBUG("store", "saved %d tokens (%s, %zu bytes) to %s in %.1f ms", j->n,
             ks_reason_name(j->reason), j->len, ks_tier_name(t), ks_now_ms() - t0);
    if (!tier->vt->make_room) evict_tier(s, t, budget, 0, 0);
    return 0;
}

static int do_save(ks_store *s, job *j) {
    pthread_mutex_lock(&s->mu);
    int64_t pin = j->pin_until_us;
    pthread_mutex_unlock(&s->mu);
    /* Saved meanwhile (e.g. by another process, seen by a rescan): no need to
     * make room for it; a pin goes to the entries that hold it. The redis
     * tier is asked on its own: a state held here may still be new there. */
    unsigned tiers = j->tiers, local = (1u << KS_TIER__LOCAL) - 1;
    if ((tiers & local) && ks__store_stored_anywhere(s, &j->key)) {
        tiers &= ~local;
        if (pin) ks__store_pin_held(s, &j->key, pin);
    }
    if ((tiers & (1u << KS_TIER_REDIS)) && ks_tier_has(s->tiers[KS_TIER_REDIS], &j->key, NULL))
        tiers &= ~(1u << KS_TIER_REDIS);
    if (!tiers) {
        if (!j->uncounted) atomic_fetch_add(&s->dedup_saves, 1);
        return 0;
    }
    /* Redis and the file tiers first: the ram tier keeps the buffer (tiers
     * are ordered fastest first, so backwards). */
    int rc = 0, best = -1;
    for (int t = KS_TIER__N - 1; t >= 0; t--) {
        if (!(tiers & (1u << t))) continue;
        int out = SAVE_DROPPED;
        int r = save_to(s, j, t, pin, &out);
        if (r != 0 && rc == 0) rc = r;
        if (out > best) best = out;
    }
    if (pin) {
        /* A pin of the key that came while the job was being written. */
        pthread_mutex_lock(&s->mu);
        int64_t later = j->pin_until_us;
        pthread_mutex_unlock(&s->mu);
        if (later > pin)
            for (int t = 0; t < KS_TIER__N; t++)
                if ((j->tiers & (1u << t)) && s->tiers[t]) ks_tier_pin(s->tiers[t], &j->key, later);
    }
    if (j->uncounted) return rc;
    switch (best) {
    case SAVE_WROTE: break;
    case SAVE_EXISTED: atomic_fetch_add(&s->dedup_saves, 1); return 0;
    case SAVE_FAILED: atomic_fetch_add(&s->failed_saves, 1); return rc;
    default: atomic_fetch_add(&s->dropped_saves, 1); return rc;
    }
    atomic_fetch_add(&s->saves[j->reason], 1);
    atomic_fetch_add(&s->saved_bytes, j->len);
    if (pin) atomic_fetch_add(&s->pin_saves, 1);
    return 0;
}

int ks_store_gc_tier(ks_tier *t, uint64_t max_bytes, float pin_share, int *pin_drops) {
    if (pin_drops) *pin_drops = 0;
    if (!t) return 0;
    ks_tier_rescan(t, KS_RESCAN_FORCE | KS_RESCAN_CLEANUP);
    ks_tier_pins pins = {.now_us = ks_wall_us(), .max_bytes = (uint64_t)((double)pin_share * (double)max_bytes)};
    int n = ks_tier_evict(t, max_bytes, &pins, NULL, NULL);
    if (pin_drops) *pin_drops = pins.dropped;
    return n > 0 ? n : 0;
}

/* The GC at open: every tier within its budget (the budgets may have
 * shrunk since the files were written). */
static int do_gc(ks_store *s) {
    int n = 0;
    for (int t = 0; t < KS_TIER__N; t++) {
        if (!s->tiers[t]) continue;
        int r, drops = 0;
        if (s->tiers[t]->vt->make_room) r = s->tiers[t]->vt->make_room(s->tiers[t], 0, (uint64_t)s->cfg.tier_max_bytes[t]);
        else r = ks_store_gc_tier(s->tiers[t], (uint64_t)s->cfg.tier_max_bytes[t], s->cfg.pin_share, &drops);
        if (r > 0) {
            atomic_fetch_add(&s->tier_evictions[t], (uint64_t)r);
            n += r;
        }
        if (drops > 0) {
            atomic_fetch_add(&s->tier_pin_drops[t], (uint64_t)drops);
            KS_INFO("store", "evicted %d pinned %s entries before their deadline: pins exceed %.0f%% of the budget",
                    drops, ks_tier_name(t), 100.0 * s->cfg.pin_share);
        }
    }
    return n;
}

static void persist_all(ks_store *s) {
    for (int t = 0; t < KS_TIER__N; t++)
        if (s->tiers[t]) ks_tier_persist(s->tiers[t]);
}

void *ks__store_writer_main(void *arg) {
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
            s->n_writing = 1;
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
        s->n_writing = 0;
        if (j) {
            if (j->kind == JOB_SAVE) {
                if (ks_keymap_get(&s->pending, &j->key) == j) ks_keymap_del(&s->pending, &j->key);
                free(j->payload); /* still ours unless a tier kept it */
                j->payload = NULL;
            }
            j->done = true;
            j->result = rc;
            if (j->refs > 1) pthread_cond_broadcast(&s->done_cv);
            ks__store_job_unref_locked(j);
        }
    }
    pthread_mutex_unlock(&s->mu);
    persist_all(s);
    return NULL;
}


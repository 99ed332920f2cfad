/*
 * store_int.h — the store's internal state, shared by its three files:
 *
 *   store.c         open/close, the save API (what is wanted, what is
 *                   queued), statistics, verification;
 *   store_writer.c  the job queue and the writer thread (the only mutator
 *                   of the tiers' files and budgets);
 *   store_lookup.c  longest-prefix lookups over the tiers and the saves not
 *                   written yet.
 * The design notes (writer thread, read your own writes, where state
 * changes) are at the top of store.c.
 */
#ifndef KS_CACHE_STORE_INT_H
#define KS_CACHE_STORE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/key.h"
#include "cache/store.h"

typedef enum { JOB_SAVE, JOB_QUARANTINE, JOB_GC, JOB_FLUSH } job_kind;

typedef struct job {
    struct job *next;
    job_kind kind;
    ks_tier_id tier;   /* quarantine: the tier; save: the first of `tiers` a lookup names */
    ks_key key;
    uint64_t tenant;   /* save: whose state (recorded in the file: warm start reads it back) */
    /* save */
    unsigned tiers;    /* 1 << ks_tier_id of every tier it goes to (a pinned save: two) */
    int64_t pin_until_us; /* 0: not pinned; extended under s->mu by later pins of the key */
    ks_reason reason;
    int32_t *tokens;
    int n;
    uint8_t *payload;
    size_t len;
    int64_t created_us;
    bool async;
    bool uncounted;    /* the Redis copy of a waited-for save: its outcome is the redis
                          tier's (dropped, errors), not one more save request's */
    /* completion (under s->mu) */
    int refs;          /* 1, or 2 while a caller waits */
    bool done;
    int result;
} job;

/* A state fetched from Redis by ks_store_prefetch, kept for the lookup that
 * comes for it (store_lookup.c). */
typedef struct prefetched {
    ks_key key;
    int n;
    int32_t *tokens;       /* [0, n): compared again at the lookup */
    ks_tier_blob blob;     /* the verified payload */
    ks_reason reason;
    double t_ms;           /* when it was fetched (ks_now_ms) */
    double fetch_ms;       /* how long the fetch took */
} prefetched;

/* At most this many states wait for their lookup, and at most
 * queue_max_bytes of them (the newest always fits); one not taken within
 * KS_PREFETCH_AGE_MS is dropped. */
#define KS_PREFETCH_MAX 8
#define KS_PREFETCH_AGE_MS 120000.0

struct ks_store {
    ks_store_cfg cfg;
    uint8_t fp[32];
    uint8_t params_hash[32];
    void *kv_params;
    size_t kv_len;
    uint32_t state_version;
    ks_kvmac_key mac;         /* the store key (ks_store_params.mac) when has_mac */
    bool has_mac;
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
    int n_writing;            /* 1 while the writer works on a job it took off the queue */
    bool stopping;
    double stop_deadline_ms;
    /* prefetched states (under mu), oldest first */
    prefetched pf[KS_PREFETCH_MAX];
    int n_pf;
    uint64_t pf_bytes;
    _Atomic bool remote_prefetch; /* lookups leave Redis to ks_store_prefetch */

    /* counters */
    _Atomic uint64_t lookups, hits, misses;
    _Atomic uint64_t tier_hits[KS_TIER__N], tier_misses[KS_TIER__N], tier_evictions[KS_TIER__N];
    _Atomic uint64_t saves[KS_REASON__N], saved_bytes;
    _Atomic uint64_t dedup_saves, small_saves, dropped_saves, skipped_saves, failed_saves;
    _Atomic uint64_t corrupt_files;
    _Atomic uint64_t pending_hits;
    _Atomic uint64_t kv_type_misses;
    _Atomic uint64_t prefetches, prefetch_fetched, prefetch_used, prefetch_dropped;
    _Atomic uint64_t pin_saves, pin_refreshes, tier_pin_drops[KS_TIER__N];
    _Atomic uint64_t load_us, save_us, restore_us;
};

/* Shared helpers (store.c, store_writer.c). */
/* Adds ms to a microsecond counter. */
void ks__store_add_ms(_Atomic uint64_t *acc, double ms);
/* Whether one of our tiers holds key as an entry of this model. */
bool ks__store_stored_anywhere(ks_store *s, const ks_key *key);
/* Pins key until at least until_us wherever it is held: a queued save of it
 * (under s->mu) and every tier entry of it. Returns whether it is held. */
bool ks__store_pin_held(ks_store *s, const ks_key *key, int64_t until_us);
/* Frees a job that nobody else references; NULL is a no-op. */
void ks__store_job_free(job *j);
/* Drops one reference of j (caller holds s->mu); frees it at zero. */
void ks__store_job_unref_locked(job *j);
/* Queues j for the writer (caller holds s->mu). */
void ks__store_enqueue_locked(ks_store *s, job *j);
/* Waits for j (refs 2) to complete; its result or KS_EBUSY on timeout. Drops
 * the waiter's reference either way. Caller holds s->mu. */
int ks__store_wait_job_locked(ks_store *s, job *j, int timeout_ms);
/* Queues a barrier-like job (GC/FLUSH) and waits for it. */
int ks__store_run_waited(ks_store *s, job_kind kind, int timeout_ms);
/* What a stored state of key (tokens[0, n)) must match to be restored
 * (store_lookup.c): this store's model, params, state version, the key, the
 * tokens (NULL: not compared) and the cache secret's tag when it has one. */
ks_kvfile_expect ks__store_expect(const ks_store *s, const ks_key *key, const int32_t *tokens, int n);
/* Frees every prefetched state (store_lookup.c; close). */
void ks__store_prefetch_clear(ks_store *s);
/* The writer thread (store_writer.c). */
void *ks__store_writer_main(void *arg);

#endif

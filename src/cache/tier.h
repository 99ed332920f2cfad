/*
 * tier.h — one storage tier of the persistent store behind a table of
 * function pointers (the way Redis ae.c picks ae_epoll.c or ae_kqueue.c):
 *
 *   ram   tier_ram.c   in-process map key -> reference-counted blob
 *   shm   tier_file.c  a directory of kvfiles under /dev/shm/kvstash-<uid>/
 *   disk  tier_file.c  a directory of kvfiles under the cache dir
 *   redis tier_redis.c a Redis (or Valkey) server shared by the kvstash
 *                      servers of several hosts: chunks + manifest
 *
 * The entry table and the generic operations below (has, list, evict,
 * remove...) are tier.c's, shared by every implementation; each depends only
 * on tier.c, never on another. The store knows a tier by its table alone,
 * after opening it: a remote tier (redis) answers the table's remote part
 * (up, probe, fetch, remote_stats), which the local tiers leave NULL.
 *
 * Each tier owns its entry table: key -> metadata (tokens, bytes, reason,
 * times, hits, pin, and whether the entry belongs to this model). The store's
 * index is the union of the tiers' tables; each tier has its own byte budget
 * and LRU (least recently hit first, ties broken by insertion order).
 *
 * Pins. An entry whose pin_until_us is in the future is "pinned": eviction
 * passes it over while the pinned entries it protects fit in the pin budget
 * (ks_tier_pins.max_bytes); when they do not, the pins that expire soonest
 * lose their protection first and those entries are evicted by the LRU like
 * any other. A file tier keeps the pin in the file's trailer (kvfile.h), so
 * other processes and restarts honour it; before evicting a file it reads
 * the file's pin again, since another process may have set or extended it
 * after this one indexed the file.
 *
 * Entry classes. A file tier's directory may be shared by processes running
 * other models or another llama.cpp: an entry is
 *   OWN      same model fingerprint, kv-params hash and llama state version:
 *            served by lookups;
 *   STALE    same model and params, another llama state version: under our
 *            key but unusable — a lookup that meets it counts it as a bad
 *            file and quarantines it;
 *   FOREIGN  another model or other params: never served and never touched
 *            by lookups, but counted in the budget and evicted by LRU like
 *            the rest (the budget is the directory's).
 *
 * Invariants
 *  1. A table entry describes a file whose header was read and checked (file
 *     tiers) or a blob that was fully stored (ram); it never describes a temp
 *     file.
 *  2. usage() equals the sum of the entries' bytes.
 *  3. The table lock is never held across file I/O: lookups can only wait for
 *     another thread's table update, never for a file write.
 *  4. An entry marked bad is invisible to has()/get() until it is removed.
 *
 * Thread model: has, get, mark_bad, lengths, list and usage are safe from any
 * thread (table rwlock). put, remove, evict, quarantine, persist and
 * close belong to one thread: the store's writer thread (or the CLI's only
 * thread). rescan may run on any thread (one at a time, others skip); it only
 * adds entries for new files and drops entries whose file vanished.
 */
#ifndef KS_TIER_H
#define KS_TIER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/kvfile.h"
#include "cache/store_cfg.h"

typedef enum { KS_ENTRY_OWN = 0, KS_ENTRY_STALE, KS_ENTRY_FOREIGN } ks_entry_class;

/* A copy of one entry's metadata. */
typedef struct ks_tier_entry {
    ks_key key;
    int n_tokens;
    int reason;              /* ks_reason */
    uint64_t bytes;          /* size on the tier (file size, or blob size for ram) */
    int64_t created_us;      /* wall clock, microseconds */
    int64_t last_hit_us;     /* created_us when never hit */
    uint64_t hits;
    int64_t pin_until_us;    /* wall clock; pinned while in the future; 0: never pinned */
    uint32_t state_version;
    uint8_t model_fp[32];
    uint8_t params_hash[32]; /* the kv-params' SHA-256 (file and ram tiers; zero from redis lists) */
    ks_entry_class cls;
} ks_tier_entry;

/* What "ours" means for entry classes. NULL model_fp: every entry is OWN (the
 * CLI, which has no model). */
typedef struct ks_tier_ident {
    const uint8_t *model_fp;     /* 32 bytes */
    const uint8_t *params_hash;  /* 32 bytes */
    uint32_t state_version;
    const ks_kvmac_key *mac;     /* the store key (store.h); NULL: no cache secret. Copied */
} ks_tier_ident;

/* A payload handed out by get(). payload is read-only and valid until
 * ks_tier_blob_release(). */
typedef struct ks_tier_blob {
    const uint8_t *payload;
    size_t len;
    void *owner_;          /* internal: the malloc'd buffer or the ram blob reference */
    /* internal: gives owner_ back to the tier that handed it out; NULL: the
     * blob owns a plain malloc'd buffer, freed */
    void (*release_)(struct ks_tier_blob *b);
    struct ks_tier *pool_; /* internal: a file tier that takes the buffer back (its spare) */
    size_t cap_;
} ks_tier_blob;

/* Releases b's payload (by the tier that handed it out) and zeroes b. NULL
 * and a zeroed blob are no-ops. A blob from a file tier must be released
 * before that tier is closed. */
void ks_tier_blob_release(ks_tier_blob *b);

typedef struct ks_tier ks_tier;
typedef struct ks__tentry ks__tentry;

/* What a remote tier's probe found of one key: the entry's length, and what
 * its fetch needs, which is the tier's own business (redis: the entry's
 * manifest, redis_fmt.h). */
typedef struct ks_tier_found {
    uint32_t n_tokens;
    uint32_t reason;         /* ks_reason it was saved for */
    uint64_t priv_[12];
} ks_tier_found;

/* A remote tier's health and traffic (ks_tier_get_remote_stats). */
typedef enum { KS_BREAKER_CLOSED = 0, KS_BREAKER_OPEN, KS_BREAKER_HALF_OPEN } ks_breaker_state;
typedef struct ks_tier_remote_stats {
    uint64_t bytes;          /* every host's bytes, as last seen (redis: <prefix>:bytes) */
    uint64_t entries;        /* every host's entries, as last seen (redis: <prefix>:lru) */
    uint64_t errors;         /* failed operations (connect, timeout, protocol) */
    uint64_t dropped_saves;  /* saves not sent: breaker open */
    uint64_t broken;         /* entries with a missing part (a miss) */
    uint64_t ops;            /* round trips */
    double op_ms_total;      /* their time */
    uint64_t bytes_read, bytes_written;
    uint64_t breaker_opens;
    ks_breaker_state breaker;
} ks_tier_remote_stats;

/* Called for each entry (a copy); return non-zero to stop. */
typedef int (*ks_tier_list_cb)(void *ud, const ks_tier_entry *e);

typedef struct ks_tier_vt {
    /* Stores an entry. meta gives key, reason, created_us, state_version,
     * model_fp, params_hash; tokens are borrowed. *payload is the caller's
     * malloc'd buffer: a tier that keeps it sets *payload = NULL (ram), else
     * it stays the caller's. *existed: the key was already stored (nothing was
     * done, 0 returned). Errors: KS_ENOSPC, KS_EIO, KS_ENOMEM, KS_EINVAL. */
    int (*put)(ks_tier *t, const ks_kvfile_meta *meta, const int32_t *tokens, int n,
               uint8_t **payload, size_t len, bool *existed);
    /* Loads and verifies the entry against exp (tokens, model, params, key).
     * 0 and *out filled; KS_ENOENT (absent or vanished); KS_ECORRUPT,
     * KS_EVERSION, KS_EMISMATCH (a bad entry: the caller marks it); KS_EIO,
     * KS_ENOMEM. A hit updates the entry's last hit and hit count. */
    int (*get)(ks_tier *t, const ks_key *key, const ks_kvfile_expect *exp, ks_tier_blob *out);
    /* Frees the storage of an entry that is marked bad (invisible) and about
     * to leave the table: its file, or the ram blob reference taken out of
     * it. 0 or KS_EIO. */
    int (*drop)(ks_tier *t, const ks_key *key, void *blob);
    /* Moves the file of an entry marked bad into <dir>/quarantine/ and drops
     * the entry (ram: drops it). Does nothing when the entry is not (or no
     * longer) marked bad: a good state saved again since is kept. */
    int (*quarantine)(ks_tier *t, const ks_key *key);
    /* Rescans the directory when its mtime changed (KS_RESCAN_FORCE: always;
     * KS_RESCAN_CLEANUP, owner thread only: also remove temp files of dead
     * writers and quarantine files with a bad header). Returns the number of
     * entries added (>= 0) or KS_EIO / KS_ENOENT / KS_ENOMEM. ram: 0. */
    int (*rescan)(ks_tier *t, unsigned flags);
    /* Writes the hit statistics and pins of changed entries back to their
     * trailers. */
    void (*persist)(ks_tier *t);
    /* The pin the entry's storage holds now, which another process may have
     * changed (file tiers: the file's trailer). 0 and *pin_until_us, or an
     * error (the file vanished or cannot be read: the caller keeps what it
     * knows). NULL for a tier only this process writes (ram). */
    int (*reload_pin)(ks_tier *t, const ks_key *key, int64_t *pin_until_us);
    /* A tier whose storage is shared beyond this process and accounted there
     * (redis): evicts by its own rules until need more bytes fit in budget.
     * Returns the number evicted (>= 0), or KS_ENOSPC (no room can be made)
     * or KS_EIO (the tier cannot be reached). NULL: the table's own eviction
     * (ks_tier_evict) and usage keep the budget. Writer thread. */
    int (*make_room)(ks_tier *t, uint64_t need, uint64_t budget);
    /* A remote tier (redis; NULL in the local ones), whose storage is
     * reached over the network and shared with other hosts; the store asks
     * it only through these, and never on the inference thread without a
     * bound (store.h).
     * up: whether operations go through now (its circuit breaker is closed,
     * or half-open: its backoff is over). note_dropped: counts a save not
     * sent because it was down. */
    bool (*up)(ks_tier *t);
    void (*note_dropped)(ks_tier *t);
    /* What is stored of keys[0, k), in one round trip: found[i] and
     * what[i] for those present, of this model and well-formed. With lens
     * (cap entries), also the lengths in [lens_lo, lens_hi] of the model's
     * entries (*n_lens). Lookup threads; bounded by the tier's timeout. 0,
     * KS_EBUSY (down: nothing asked), KS_EIO, KS_ENOMEM. */
    int (*probe)(ks_tier *t, const ks_key *keys, int k, ks_tier_found *what, bool *found, int lens_lo,
                 int lens_hi, int *lens, int *n_lens, int cap);
    /* Reads the entry a probe found (f) and verifies it against exp as a
     * file tier does: 0 and *out (a plain buffer), KS_ENOENT (a part is
     * missing: evicted or expired, counted as broken), KS_ECORRUPT /
     * KS_EVERSION / KS_EMISMATCH, KS_EBUSY (down), KS_EIO, KS_ENOMEM.
     * Records the hit. */
    int (*fetch)(ks_tier *t, const ks_key *key, const ks_tier_found *f, const ks_kvfile_expect *exp,
                 ks_tier_blob *out);
    /* Thread-safe. */
    void (*remote_stats)(ks_tier *t, ks_tier_remote_stats *out);
    void (*close)(ks_tier *t);
} ks_tier_vt;

/* The common part of every tier; implementations embed it first. The table
 * functions below work on it for every tier. */
struct ks_tier {
    const ks_tier_vt *vt;
    ks_tier_id id;
    char dir[KS_MAX_PATH];        /* file tiers; "" for ram */
    ks_tier_ident ident;          /* copied */
    uint8_t ident_fp[32], ident_params[32];
    bool has_ident;
    ks_kvmac_key ident_mac;       /* ident.mac points here when there is one */
    pthread_rwlock_t lock;        /* guards everything below */
    ks_keymap map;                /* key -> ks__tentry* */
    uint64_t bytes;
    uint64_t seq;                 /* LRU and insertion clock */
    _Atomic uint64_t n_bad;       /* files found bad by scans and saves (quarantined) */
    _Atomic uint64_t n_skipped;   /* store file names that were not regular files (file tiers:
                                     skipped, never read; once per appearance) */
};

/* ------------------------------------------------------------ the tiers */
/* A ram tier. ident may be NULL. Returns 0 or KS_ENOMEM. */
int ks_tier_ram_open(const ks_tier_ident *ident, ks_tier **out);

/* Warm start: gives a file tier a read buffer of bytes (at most its spare
 * limit, 256 MiB) with every page already faulted in, so the first restore
 * of a new process reads as fast as later ones. No-op for ram, 0, or a tier
 * that already keeps one as large; best effort (no memory: nothing). */
void ks_tier_file_prewarm(ks_tier *t, size_t bytes);

/* Flags for ks_tier_file_open. */
enum {
    KS_TIER_CREATE = 1,   /* create the directory (and parents), mode 0700 */
    KS_TIER_CLEANUP = 2,  /* at open: remove temp files of dead writers and
                             quarantine files whose header is bad */
};
/* A file tier over dir (id: KS_TIER_SHM or KS_TIER_DISK). Scans the directory
 * (headers only) to build the table. Errors: KS_ENOENT (no such directory
 * and no KS_TIER_CREATE), KS_EINVAL (not a directory, or owned by another
 * user), KS_EIO, KS_ENOMEM; message in err. */
int ks_tier_file_open(ks_tier_id id, const char *dir, unsigned flags, const ks_tier_ident *ident,
                      ks_tier **out, char *err, size_t errlen);

/* The redis tier (tier_redis.c; redis_fmt.h for the key layout). Its table
 * holds the entries this process knows to be in Redis (it wrote them, or a
 * lookup met them); the truth is in Redis, shared with other hosts. cfg is
 * copied; max_bytes is kvstash's share of Redis (the sum over every host
 * writing under cfg->key_prefix). An unreachable server is not an error here:
 * the tier opens with its circuit breaker open and connects later (WARN).
 * Errors: KS_EINVAL (a bad URL or TLS settings that cannot work:
 * ks_redis_cfg_prepare, redis_conn.h), KS_ENOMEM; the message in err never
 * holds a password. */
struct ks_redis_cfg;
int ks_tier_redis_open(const struct ks_redis_cfg *cfg, uint64_t max_bytes, const ks_tier_ident *ident,
                       ks_tier **out, char *err, size_t errlen);

/* --------------------------------------------------- generic operations */
/* A remote tier's operations (the vtable's remote part); on a local tier
 * there is nothing remote: up, nothing found, zeroed stats. */
static inline bool ks_tier_is_remote(const ks_tier *t) { return t->vt->probe != NULL; }
static inline bool ks_tier_up(ks_tier *t) { return !t->vt->up || t->vt->up(t); }
static inline void ks_tier_note_dropped(ks_tier *t) {
    if (t->vt->note_dropped) t->vt->note_dropped(t);
}
static inline int ks_tier_probe(ks_tier *t, const ks_key *keys, int k, ks_tier_found *what, bool *found,
                                int lens_lo, int lens_hi, int *lens, int *n_lens, int cap) {
    if (!t->vt->probe) {
        for (int i = 0; i < k; i++) found[i] = false;
        if (n_lens) *n_lens = 0;
        return 0;
    }
    return t->vt->probe(t, keys, k, what, found, lens_lo, lens_hi, lens, n_lens, cap);
}
static inline int ks_tier_fetch(ks_tier *t, const ks_key *key, const ks_tier_found *f, const ks_kvfile_expect *exp,
                                ks_tier_blob *out) {
    return t->vt->fetch ? t->vt->fetch(t, key, f, exp, out) : KS_ENOENT;
}
static inline void ks_tier_get_remote_stats(ks_tier *t, ks_tier_remote_stats *out) {
    memset(out, 0, sizeof *out);
    if (t->vt->remote_stats) t->vt->remote_stats(t, out);
}

static inline int ks_tier_put(ks_tier *t, const ks_kvfile_meta *m, const int32_t *tok, int n,
                              uint8_t **payload, size_t len, bool *existed) {
    return t->vt->put(t, m, tok, n, payload, len, existed);
}
static inline int ks_tier_get(ks_tier *t, const ks_key *k, const ks_kvfile_expect *e,
                              ks_tier_blob *out) {
    return t->vt->get(t, k, e, out);
}
static inline int ks_tier_quarantine(ks_tier *t, const ks_key *k) { return t->vt->quarantine(t, k); }
enum { KS_RESCAN_FORCE = 1, KS_RESCAN_CLEANUP = 2 };
static inline int ks_tier_rescan(ks_tier *t, unsigned flags) { return t->vt->rescan(t, flags); }
static inline void ks_tier_persist(ks_tier *t) { t->vt->persist(t); }
/* NULL is a no-op. */
void ks_tier_close(ks_tier *t);

/* Removes the entry and its file. 0, KS_ENOENT, or KS_EIO when the file could
 * not be removed (the entry is dropped from the table anyway). */
int ks_tier_remove(ks_tier *t, const ks_key *key);
/* true when key is present and not bad; *e (may be NULL) receives a copy. */
bool ks_tier_has(ks_tier *t, const ks_key *key, ks_tier_entry *e);
/* Marks the entry bad; true only for the call that marked it (count once). */
bool ks_tier_mark_bad(ks_tier *t, const ks_key *key);
/* Pins key's entry (OWN and good) until at least until_us: a later deadline
 * it has is kept. File tiers write the new deadline to the trailer with the
 * next persist. Returns true when the entry is there (pinned). */
bool ks_tier_pin(ks_tier *t, const ks_key *key, int64_t until_us);
/* Bytes of the entries (good, any class) pinned at now_us (pin_until_us >
 * now_us), and their number in *n (may be NULL). */
uint64_t ks_tier_pinned_bytes(ks_tier *t, int64_t now_us, uint64_t *n);
/* Appends the n_tokens of every OWN, good entry with 1 <= n_tokens <= max_len
 * to out[*n] while *n < cap (duplicates included). */
void ks_tier_lengths(ks_tier *t, int max_len, int *out, int *n, int cap);
/* The same for the FOREIGN entries of model fp (another kv-params: K/V
 * types, context...): what ks_store_other_kv asks about. */
void ks_tier_foreign_lengths(ks_tier *t, const uint8_t fp[32], int max_len, int *out, int *n, int cap);
/* Calls cb with a copy of every entry, from a snapshot taken under the lock
 * (cb runs without the lock). Returns 0, KS_ENOMEM, or cb's non-zero value. */
int ks_tier_list(ks_tier *t, ks_tier_list_cb cb, void *ud);
void ks_tier_usage(ks_tier *t, uint64_t *bytes, uint64_t *entries);
/* How eviction treats pins (see "Pins" above). */
typedef struct ks_tier_pins {
    int64_t now_us;            /* wall clock: entries with pin_until_us > now_us are pinned */
    uint64_t max_bytes;        /* pinned bytes protected from eviction, latest deadlines first */
    /* A pinned save about to be added (0 bytes: none): it competes for the
     * protection like an entry, so making room for it never leaves more
     * protected than max_bytes once it is in. */
    uint64_t incoming_bytes;
    int64_t incoming_until_us;
    int dropped;               /* out: evicted entries whose pin had not expired */
} ks_tier_pins;

/* Removes least-recently-hit entries until usage <= max_bytes, passing over
 * the pinned entries pins protects (NULL: none); evicted keys are reported to
 * cb (may be NULL). Returns the number evicted. Usage stays above max_bytes
 * when the protected entries alone exceed it.
 * Removal order (here and in ks_tier_remove): mark the entries bad, drop
 * their storage, then take them out of the table — so that a concurrent
 * rescan never re-indexes a file that is about to vanish. Before that, the
 * pins of the chosen entries are read again (vt->reload_pin) and the choice
 * made again when one changed; a pin another process sets between that read
 * and the removal is lost (the window of one trailer read). */
int ks_tier_evict(ks_tier *t, uint64_t max_bytes, ks_tier_pins *pins,
                  void (*cb)(void *ud, const ks_tier_entry *e), void *ud);

/* ---------------------------------------------- internals for the tiers */
struct ks__tentry {
    ks_tier_entry info;
    uint64_t lru;         /* t->seq at the last hit or at insertion */
    uint64_t ins;         /* t->seq at insertion */
    bool bad;
    bool dirty;           /* hit statistics or pin not yet persisted */
    void *blob;           /* ram: the blob */
};
/* Classifies a header against the tier's identity. */
ks_entry_class ks__tier_classify(const ks_tier *t, const ks_kvfile_meta *m);
/* Inserts a new entry (caller holds the write lock). 0 or KS_ENOMEM. */
int ks__tier_insert_locked(ks_tier *t, const ks_tier_entry *info, void *blob, ks__tentry **out);
/* Removes an entry from the table (caller holds the write lock) and returns it
 * (caller frees), NULL when absent. */
ks__tentry *ks__tier_unlink_locked(ks_tier *t, const ks_key *key);
/* Records a hit (takes the write lock). */
void ks__tier_touch(ks_tier *t, const ks_key *key);
/* Records a use that is not a hit: the entry's last use is now (LRU, and
 * ks_store_recent's "most recently saved or hit"), its hit count unchanged
 * (takes the write lock). For a save declined because the entry holds that
 * state already. */
void ks__tier_refresh(ks_tier *t, const ks_key *key);
/* Common part of open/close. */
int ks__tier_init(ks_tier *t, const ks_tier_vt *vt, ks_tier_id id, const ks_tier_ident *ident);
void ks__tier_fini(ks_tier *t);
/* Takes entries that were marked bad (and whose storage was dropped) out of
 * the table. */
void ks__tier_forget_bad(ks_tier *t, const ks_key *keys, int n);

#endif

/*
 * store.h — the persistent tiered KV store: longest-prefix lookup over the
 * ram, shm and disk tiers, save reasons, and the writer thread.
 *
 * The store maps a token prefix to the llama sequence state that holds
 * exactly those tokens. A state is saved under ks_key(model fingerprint,
 * kv-params, tokens) into the tier its save reason maps to
 * (cfg.reason_tier); a lookup walks the candidate prefix lengths of a prompt
 * longest first and returns the first entry that loads and verifies.
 *
 * Design notes
 *  - The index is the union of the tiers' tables (tier.h). It is rebuilt at
 *    open from the shm and disk headers, so the cache survives restarts, and
 *    refreshed before each lookup when a directory's mtime changed (one
 *    stat per directory; the directory is read again only then), so saves
 *    of other processes on the same directories are found.
 *  - Candidate lengths of a lookup: every multiple of cfg.stride up to
 *    min(n, max_len), plus every distinct n_tokens of the index up to that
 *    (so states saved at arbitrary lengths, e.g. by `finish`, are found).
 *    Their keys come from one pass of the prefix hasher (key.h).
 *  - A file that fails to load (checksum, truncation, format or llama state
 *    version, wrong model or params, different tokens) is a miss: it is
 *    counted in corrupt_files, hidden from the index at once and moved into
 *    <dir>/quarantine/ by the writer thread. It is never restored.
 *  - Saves: the caller (the inference thread) computes the key and drops
 *    what need not be written (below min_tokens, tier "none", already stored
 *    or queued); the rest goes to the writer thread through a bounded queue.
 *  - Hit statistics are kept in memory and written back to the files'
 *    trailers by the writer thread about once a second and at close.
 *  - The redis tier (tier.h, tier_redis.c), when configured, is shared with
 *    the servers of other hosts: it is asked only for the lengths longer
 *    than what a local tier, the save queue or a prefetched state holds (one
 *    pipelined round trip for every candidate's manifest, one for the
 *    chunks). Who asks: ks_store_prefetch, on the thread that submits a
 *    request, which keeps the state it fetched for the lookup that comes for
 *    it; a lookup asks Redis itself only when prefetching is off
 *    (ks_store_set_remote_prefetch), so a slow Redis never holds up the
 *    inference thread. A state restored from it is not copied into the ram
 *    tier: that copy cost 5-20 ms per 6 MB state (first-touch page faults;
 *    docs/BENCHMARKS.md), and the turn's own finish save lands locally. Saves of the
 *    reasons in cfg.redis.reasons go to it besides their local tier, on the
 *    writer thread; a save the caller waits for waits for its local tier
 *    only. While Redis is down (circuit breaker open) it is skipped.
 *
 * Pins (a client's cache breakpoints, Anthropic's `cache_control`)
 *  - An entry pinned until T (wall clock, µs) is not evicted by the LRU
 *    before T, as long as the pinned entries of its tier fit in cfg.pin_share
 *    of the tier's budget. Beyond that, the pins that expire soonest lose
 *    their protection first (those entries are evicted as any other, counted
 *    in tier_pin_drops). An expired pin is nothing: the entry is ordinary.
 *  - ks_store_save_pinned saves into the ram tier and into the tier of
 *    cfg.reason_tier[KS_REASON_PIN] (a file tier in the full store mode, so
 *    other processes and restarts find it; "none" or "ram": ram only),
 *    regardless of cfg.min_tokens. A state already stored anywhere, or
 *    queued, is not written again: its pin is extended (ks_store_pin).
 *  - A pin is only ever extended, never shortened. In a file tier it is kept
 *    in the trailer (docs/kvfile-format.md): every process honours it, and
 *    reads it again before evicting the file. A file written before pins
 *    cannot keep one: its pin lives in this process's memory only.
 *  - A pinned save is still asynchronous: it can fail later like any save
 *    (I/O error, larger than the budget, or the room held by pins with later
 *    deadlines), which the caller does not learn; store stats count it.
 *
 * Invariants
 *  1. A lookup hit returns a payload whose file passed every check against
 *     this store's model fingerprint, kv-params hash, llama state version and
 *     the exact prompt tokens [0, hit.n_tokens) — or the payload of this
 *     store's own save not yet written by the writer, whose tokens equal
 *     [0, hit.n_tokens) (read your own writes: a state saved a moment ago is
 *     found before the idle-priority writer has written it).
 *  2. Only the writer thread creates, removes or renames files (saves,
 *     eviction, quarantine, trailer updates). Lookups read files and may
 *     update the in-memory index (hits, rescans) under the tier locks, which
 *     are never held across I/O: a lookup never waits on a file write.
 *  3. No half-written file is visible under a final name, and an I/O error
 *     (ENOSPC, EIO, a short write, a failed fsync) skips that save only: it
 *     is logged, counted, its temp file removed, and the store keeps serving.
 *  4. Each tier stays within cfg.tier_max_bytes after every save of this
 *     process (least recently hit entries are evicted first, protected pins
 *     passed over: a save that only fits by evicting them is dropped).
 *  5. Two processes (or two stores) on one directory never corrupt each
 *     other's files: temp names carry pid + counter, publishing is an atomic
 *     link() that never replaces a file, and readers verify everything.
 *
 * Thread model: ks_store_lookup, ks_store_save, ks_store_save_pinned,
 * ks_store_pin, ks_store_flush, ks_store_stats and
 * ks_store_note_restore are safe from any thread, also concurrently. ks_store_open/close run on one thread with no other call in
 * flight. The store owns one writer thread between open and close.
 */
#ifndef KS_STORE_H
#define KS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/kvfile.h"
#include "cache/kvmac.h"
#include "cache/store_cfg.h"
#include "cache/tier.h"

typedef struct ks_store ks_store;

typedef struct ks_store_params {
    ks_store_cfg cfg;           /* dirs, stride, min_tokens, budgets, reason -> tier, timeouts */
    uint8_t model_fp[32];       /* ks_model_fingerprint() */
    const void *kv_params;      /* the bytes that shape the KV besides model and tokens
                                   (ks_engine_kv_params); copied by open; may be NULL */
    size_t kv_params_len;
    uint32_t state_version;     /* llama's sequence-state version */
    int queue_max;              /* async saves waiting for the writer (default 16) */
    uint64_t queue_max_bytes;   /* and their payload bytes (default 1 GiB) */
    /* The store key from the deployment secret (kvmac.h; copied by open):
     * every entry written to shm, disk and redis is authenticated under it,
     * and an entry read from them without a valid tag is refused and
     * counted like a corrupt one (corrupt_files). NULL: no secret — entries
     * are only checksummed, and whoever can write a store directory or the
     * Redis controls what is restored (docs/SECURITY.md). */
    const ks_kvmac_key *mac;
} ks_store_params;

/* Defaults: ks_store_cfg_defaults (store_cfg.h), enabled, with the default
 * directories (ks_store_default_dirs), a zero fingerprint and no kv params. */
ks_store_params ks_store_params_default(void);

/* The default directories: cache_dir = $XDG_CACHE_HOME/kvstash or
 * $HOME/.cache/kvstash; shm_dir = /dev/shm/kvstash-<uid>. Each buffer holds
 * KS_MAX_PATH bytes; either may be NULL. */
void ks_store_default_dirs(char *cache_dir, char *shm_dir);

/* Opens the tiers whose budget is > 0 (ram in memory; shm and disk create
 * their directories with mode 0700), rebuilds the index from the files'
 * headers, removes temp files left by dead processes, quarantines files with
 * a bad header, and starts the writer thread (which first enforces the
 * budgets).
 * An shm directory that cannot be used only disables the shm tier (WARN).
 * Errors: KS_EINVAL (bad parameters; shm_dir and cache_dir the same), KS_EIO
 * / KS_ENOSPC (cache_dir cannot be created or read; owned by another user
 * -> KS_EINVAL), KS_ENOMEM; *out is NULL then and err says why. */
int ks_store_open(const ks_store_params *p, ks_store **out, char *err, size_t errlen);

/* Warm start (before the server reports ready): each file tier keeps a read
 * buffer of bytes (the largest state a slot can hold; at most 1 GiB) with
 * its pages already faulted in, so a new process's first restore costs what
 * later ones do. Costs that much memory per file tier up front, which the
 * first restore would have taken anyway; a buffer is kept after a restore
 * up to 4 GiB (tier_file.c). Any thread, before requests run. */
void ks_store_prewarm(ks_store *s, size_t bytes);

/* Writes what is queued (for at most cfg.shutdown_timeout_ms; later saves
 * are dropped and counted as skipped), persists the hit statistics, stops the
 * writer thread and frees everything. NULL is a no-op. No other call on s may
 * be in flight or follow. */
void ks_store_close(ks_store *s);

/* A lookup result. payload is read-only and owned by the hit: valid until
 * ks_store_hit_free(). */
typedef struct ks_store_hit {
    int n_tokens;           /* the restored prefix is tokens[0, n_tokens) */
    ks_tier_id tier;        /* where it came from (KS_TIER_NONE on a miss) */
    ks_reason reason;       /* why it was saved */
    const uint8_t *payload; /* the llama sequence state */
    size_t payload_len;
    double load_ms;         /* reading and verifying it */
    double prefetch_ms;     /* a prefetched state: what its fetch took on the submitting
                               thread (load_ms is then ~0) */
    ks_tier_blob blob_;     /* internal */
} ks_store_hit;

/* Releases hit's payload and zeroes it. NULL and a zeroed hit are no-ops.
 * Every hit must be freed before ks_store_close (a hit read from a file tier
 * gives its read buffer back to that tier). */
void ks_store_hit_free(ks_store_hit *hit);

/* Longest-prefix lookup: finds the longest L <= min(n, max_len) (max_len < 0:
 * no cap) such that the state of tokens[0, L) is stored and verifies, probing
 * the candidate lengths (see above) longest first, each in ram, then shm, then
 * disk. The directories are rescanned first when they changed (saves of
 * other processes).
 * tokens is borrowed. *hit is always initialised; on 0 it owns a payload
 * (ks_store_hit_free).
 * Returns 0 on a hit, KS_ENOENT on a miss (also when min(n, max_len) < 1),
 * KS_EINVAL (NULL s/hit, n < 0, tokens NULL with n > 0), KS_ENOMEM.
 * Thread-safe; never waits for a file write. */
int ks_store_lookup(ks_store *s, const int32_t *tokens, int n, int max_len, ks_store_hit *hit);
/* Same, considering only prefixes of at least min_len tokens: a caller that
 * already holds min_len - 1 tokens of KV does not pay for reading a shorter
 * state it would not use. */
int ks_store_lookup_range(ks_store *s, const int32_t *tokens, int n, int min_len, int max_len,
                          ks_store_hit *hit);

/* Tenants (docs/SECURITY.md "Tenants"). Every call below that names a state
 * by its tokens has an _in twin that names it in a tenant's namespace: the
 * tenant is hashed into the state's key (key.h), so a lookup, pin or save of
 * one tenant never finds, refreshes or deduplicates another's state, in any
 * tier (Redis too). Tenant 0 is the single-tenant namespace: the calls
 * without _in are the _in calls with tenant 0, with the keys they always had. */
int ks_store_lookup_range_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, int min_len, int max_len,
                             ks_store_hit *hit);

/* Why a lookup of tokens[0, max_len] found no state of at least min_len
 * tokens, when the reason is the K/V cache types: the longest state of this
 * model and tenant in a local file tier (shm, disk) that differs from this
 * store's kv-params in type_k/type_v alone — saved by a server of other
 * -ctk/-ctv — with its types into types ("q8_0/q8_0"). Returns its length,
 * or 0 when there is none (nothing is read: the tiers' tables and one key
 * per candidate length and type pair; nothing at all when the tiers hold no
 * foreign entry of this model). Redis is not asked (a round trip per pair).
 * Counts kv_type_misses. Thread-safe. */
int ks_store_other_kv(ks_store *s, uint64_t tenant, const int32_t *tokens, int min_len, int max_len, char *types,
                      size_t n);

/* Remote prefetch (the redis tier). ks_store_prefetch asks Redis, on the
 * calling thread, for the longest stored prefix of tokens[0, min(n,
 * max_len)) (max_len < 0: no cap) longer than what the local tiers, the save
 * queue and the states prefetched before hold; fetches and verifies it (as a
 * lookup would) and keeps it for the next lookup that reaches its length,
 * which takes it. At most KS_PREFETCH_MAX states wait, within the queue's
 * byte budget, for at most two minutes (store_int.h); one never taken is
 * dropped (counted). Bounded by the tier's timeouts and skipped while its
 * breaker is open. Returns 1 when a state was fetched, 0 when none was (no
 * redis tier, Redis down, nothing longer there), KS_EINVAL, KS_ENOMEM.
 * Thread-safe; a lookup never waits for it.
 * ks_store_set_remote_prefetch(s, true): lookups stop asking Redis
 * themselves and only take prefetched states (the scheduler sets it and
 * prefetches at submit). Off by default. */
int ks_store_prefetch(ks_store *s, const int32_t *tokens, int n, int max_len);
int ks_store_prefetch_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, int max_len);
void ks_store_set_remote_prefetch(ks_store *s, bool on);

/* Saves the state of tokens[0, n) for reason into cfg.reason_tier[reason].
 * Takes ownership of payload (malloc'd; freed by the store on every path,
 * also on error). tokens is borrowed (copied when queued).
 * Not written, returning 0: n < cfg.min_tokens; the tier is KS_TIER_NONE or
 * disabled; the key is already stored or queued (counted as dedup).
 * async (sync = false): queued for the writer thread; returns 0, or KS_EFULL
 * when the queue is full (logged, counted in skipped_saves).
 * sync (for evict/shutdown): waits until written, for at most
 * cfg.shutdown_timeout_ms (<= 0: no limit); returns 0, the write's error
 * (KS_ENOSPC, KS_EIO, KS_ENOMEM; logged and counted in failed_saves — the
 * store keeps serving), or KS_EBUSY on timeout (the save stays queued).
 * Other errors: KS_EINVAL, KS_ENOMEM, KS_ESHUTDOWN (closing).
 * Thread-safe. */
int ks_store_save(ks_store *s, ks_reason reason, const int32_t *tokens, int n, uint8_t *payload,
                  size_t len, bool sync);
int ks_store_save_in(ks_store *s, uint64_t tenant, ks_reason reason, const int32_t *tokens, int n, uint8_t *payload,
                     size_t len, bool sync);

/* Pins (see "Pins" above). until_us is a wall-clock deadline, µs since the
 * epoch (> 0). Both are thread-safe and never wait for the writer.
 *
 * ks_store_pin: extends the pin of the stored or queued state of tokens[0, n)
 * to at least until_us, in every tier that holds it (the directories are
 * rescanned first when they changed, as for a lookup). 0 when it is held
 * (counted in pin_refreshes), KS_ENOENT when not (nothing changes), KS_EINVAL
 * (NULL s or tokens, n < 1, until_us <= 0), KS_ENOMEM. Lets a caller skip
 * copying a state the store already holds. */
int ks_store_pin(ks_store *s, const int32_t *tokens, int n, int64_t until_us);
int ks_store_pin_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, int64_t until_us);
/* ks_store_save_pinned: saves the state of tokens[0, n) pinned until until_us,
 * for reason KS_REASON_PIN, asynchronously. Takes ownership of payload (freed
 * on every path); tokens is borrowed. cfg.min_tokens does not apply (n >= 1).
 * Returns 1 when queued for writing, 0 when the state was held already (its
 * pin extended, as ks_store_pin; counted as a dedup and a refresh), KS_ENOENT
 * when no enabled tier takes pins (no ram tier and reason pin maps to none or
 * to a disabled tier; counted as dropped), KS_EFULL (queue full; counted as
 * skipped), KS_EINVAL, KS_ENOMEM, KS_ESHUTDOWN. */
int ks_store_save_pinned(ks_store *s, const int32_t *tokens, int n, uint8_t *payload, size_t len,
                         int64_t until_us);
int ks_store_save_pinned_in(ks_store *s, uint64_t tenant, const int32_t *tokens, int n, uint8_t *payload, size_t len,
                            int64_t until_us);

/* Waits until every save queued before this call was processed, for at most
 * timeout_ms (<= 0: no limit). 0, KS_EBUSY (timeout), KS_ESHUTDOWN. */
int ks_store_flush(ks_store *s, int timeout_ms);
/* Would a save of tokens[0, n) for reason write anything? false when the
 * reason maps to no enabled tier, n is below min_tokens, or that state is
 * already stored or queued. Lets a caller skip copying a state that would be
 * dropped; a "no" is counted in the stats as that save would have been
 * (small_saves, dropped_saves or dedup_saves). Thread-safe; computes one key. */
bool ks_store_wants(ks_store *s, ks_reason reason, const int32_t *tokens, int n);
bool ks_store_wants_in(ks_store *s, uint64_t tenant, ks_reason reason, const int32_t *tokens, int n);
/* Whether saves of this reason go anywhere (a local tier or Redis): the
 * configuration only, nothing computed or counted. Thread-safe. */
bool ks_store_saves_reason(const ks_store *s, ks_reason reason);
/* Whether saves of this reason go somewhere that outlives the process (the
 * shm or disk tier, or Redis). Configuration only; thread-safe. */
bool ks_store_reason_outlives(const ks_store *s, ks_reason reason);

/* One garbage collection of a local tier t: a file tier is rescanned first
 * (temp files of dead writers removed, files with a bad header quarantined,
 * other processes' changes picked up), then the least recently hit entries
 * are evicted until t holds at most max_bytes, passing over the pinned
 * entries while they fit in pin_share of max_bytes ("Pins" above). The one
 * GC: the store's writer runs it on each of its tiers at open, with the
 * store's budgets and cfg.pin_share; `kvstash cache gc` runs it on the
 * directories with the configured ones. Returns the entries evicted (>= 0);
 * *pin_drops (may be NULL): the pinned ones among them. As thread-safe as
 * the tier's own calls (tier.h). */
int ks_store_gc_tier(ks_tier *t, uint64_t max_bytes, float pin_share, int *pin_drops);

/* Adds the time the caller spent restoring a hit into llama (restore_ms_total). */
void ks_store_note_restore(ks_store *s, double ms);

/* Counters since open (bytes/entries: current). */
struct ks_store_stats {
    uint64_t lookups;
    uint64_t hits;                         /* lookups that returned a state */
    uint64_t misses;
    uint64_t tier_hits[KS_TIER__N];        /* lookups served by the tier */
    uint64_t tier_misses[KS_TIER__N];      /* lookups not served by the (enabled) tier */
    uint64_t tier_bytes[KS_TIER__N];       /* current usage, foreign entries included */
    uint64_t tier_entries[KS_TIER__N];
    uint64_t tier_max_bytes[KS_TIER__N];   /* budgets (0: tier disabled) */
    uint64_t tier_evictions[KS_TIER__N];
    uint64_t saves[KS_REASON__N];          /* states written, by reason */
    uint64_t saved_bytes;                  /* their payload bytes */
    uint64_t dedup_saves;                  /* already stored or queued */
    uint64_t small_saves;                  /* n < min_tokens */
    uint64_t dropped_saves;                /* tier none/disabled, or bigger than the budget */
    uint64_t skipped_saves;                /* queue full, or dropped at close */
    uint64_t failed_saves;                 /* I/O errors (ENOSPC, EIO...) */
    uint64_t corrupt_files;                /* bad files met (lookups, scans, saves) */
    uint64_t skipped_files;                /* store file names that were not regular files (a
                                              FIFO, socket, directory, symlink...): skipped, never
                                              read, counted once per appearance (tier_file.c) */
    uint64_t queued;                       /* jobs waiting now, or being written (all their tiers,
                                              Redis included) */
    uint64_t pending_hits;                 /* hits served from a save not written yet */
    uint64_t kv_type_misses;               /* misses a state of other K/V types would have served
                                              (ks_store_other_kv) */
    uint64_t prefetches;                   /* ks_store_prefetch calls that asked Redis */
    uint64_t prefetch_fetched;             /* states they fetched */
    uint64_t prefetch_used;                /* of those, taken by a lookup */
    uint64_t prefetch_dropped;             /* of those, dropped unused (old, over the cap, or a
                                              lookup that needed less) */
    uint64_t pin_saves;                    /* pinned saves written (also in saves[KS_REASON_PIN]) */
    uint64_t pin_refreshes;                /* pins extended on states held already */
    uint64_t tier_pinned_bytes[KS_TIER__N];   /* current: entries pinned now (of this process's view) */
    uint64_t tier_pinned_entries[KS_TIER__N];
    uint64_t tier_pin_drops[KS_TIER__N];   /* pinned entries evicted before their deadline because
                                              the pins exceeded cfg.pin_share of the budget */
    bool has_redis;                        /* the redis tier is configured: redis below is set */
    ks_tier_remote_stats redis;             /* errors, dropped saves, broken entries, breaker (tier.h) */
    double load_ms_total;                  /* reading + verifying hits */
    double save_ms_total;                  /* writing saves (writer thread) */
    double restore_ms_total;               /* ks_store_note_restore() */
};

/* Fills *out (zeroed first). Thread-safe. */
void ks_store_stats(ks_store *s, struct ks_store_stats *out);

/* Called by ks_store_verify_dir for each file: path, the result of the full
 * check (0, KS_ECORRUPT, KS_EVERSION, KS_EIO...; KS_EINVAL: not a regular
 * file, skipped without a byte read) and, when the header could be read, its
 * metadata (else NULL). Return non-zero to stop. */
typedef int (*ks_store_verify_cb)(void *ud, const char *path, int rc, const ks_kvfile_meta *meta);

/* Checks every kvfile in dir completely (header, every length, checksum, and
 * that the header's key matches the file name), without a model: no file is
 * changed. Temp files are skipped; a store file name that is not a regular
 * file (kvfile.h "Reading") goes to cb with KS_EINVAL and is not counted bad.
 * Returns the number of bad files (>= 0), or KS_ENOENT (no such directory),
 * KS_EINVAL (dir is not a directory) or KS_EIO when dir cannot be read. cb
 * may be NULL. */
int ks_store_verify_dir(const char *dir, ks_store_verify_cb cb, void *ud);
/* The same, and with mac (may be NULL: the same as above) every file must
 * carry a valid tag under it (kvmac.h): one without a tag or with a bad one
 * is KS_ECORRUPT. */
int ks_store_verify_dir_mac(const char *dir, const ks_kvmac_key *mac, ks_store_verify_cb cb, void *ud);

/* Warm start (store_recent.c): a state read back whole with its tokens. */
typedef struct ks_store_state {
    int32_t *tokens;  /* owned: the state stands for tokens[0, n_tokens) */
    int n_tokens;
    uint8_t *payload; /* owned: the llama sequence state */
    size_t len;
    ks_tier_id tier;  /* KS_TIER_SHM or KS_TIER_DISK */
    ks_reason reason;
    uint64_t tenant;  /* whose state (the file records it; its key binds it): the slot's tenant */
    double load_ms;   /* reading and verifying it */
} ks_store_state;

/* The states of the file tiers (shm, disk) most recently saved or hit, newest
 * first, at most max of them: what a new process puts into its slots before
 * it serves (ks_sched_params.warm_slots), so that the conversations that
 * were running before a restart go on as in a warm process. Each is checked
 * as a lookup checks it (checksum, model, params, state version, the cache
 * secret's tag when the store has one) and its
 * tokens against its key in the tenant the file records (every tenant's
 * states are candidates; a file whose recorded tenant is not its key's is
 * refused); a state whose tokens are a prefix of one already taken for the
 * same tenant (an earlier turn of the same conversation) is skipped. At most
 * max_reads files are read. out[0, *n_out) are owned (ks_store_state_free).
 * Returns 0 (also when nothing is stored), KS_EINVAL or KS_ENOMEM.
 * Any thread; reads files only. */
int ks_store_recent(ks_store *s, int max, int max_reads, ks_store_state *out, int *n_out);
/* Frees st's buffers and zeroes it; NULL is a no-op. */
void ks_store_state_free(ks_store_state *st);

#endif

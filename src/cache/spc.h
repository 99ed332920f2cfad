/*
 * spc.h — the System Prompt Cache store: KV state blobs of
 * system prompts in RAM, keyed by a 64-bit hash (ks_msghash_system), least
 * recently used first out under a byte budget.
 *
 * Owns the entries: a copy of each prompt's tokens and the state blob handed
 * over by ks_spc_insert().
 *
 * Invariants
 *  1. bytes == sum over indexed entries of (blob len + 4 * n_tokens) <= max_bytes.
 *  2. At most one indexed entry per key; inserting a key again replaces it.
 *  3. An acquired entry is never freed before its release: eviction and
 *     replacement unlink it from the index (later lookups miss) and the last
 *     ks_spc_release() frees it. Such an entry no longer counts in bytes, so
 *     memory can exceed max_bytes by the size of entries still being read.
 *  4. Eviction takes unreferenced entries first, least recently used first;
 *     referenced ones are unlinked only when that is still not enough room.
 *  5. The key is a hash: before restoring, compare entry->tokens with the
 *     tokens of the system prompt you are about to skip. A 64-bit collision
 *     must turn into a miss, never into wrong KV state.
 *
 * Thread model: every function is thread-safe (one mutex per store); HTTP
 * threads may call ks_spc_get_stats() while the inference thread acquires and
 * inserts. The public fields of an acquired entry are immutable until its
 * release and may be read without the lock.
 */
#ifndef KS_CACHE_SPC_H
#define KS_CACHE_SPC_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

typedef struct ks_spc ks_spc;

/* One cached system prompt. Read-only for callers; valid from ks_spc_acquire()
 * until the matching ks_spc_release(). */
typedef struct ks_spc_entry {
    uint64_t key;
    ks_tokens tokens;   /* the system prompt's tokens (the state covers [0, tokens.n)) */
    const uint8_t *blob; /* llama_state_seq_get_data output */
    size_t len;
    int64_t created_us; /* ks_now_us() at insert */
} ks_spc_entry;

typedef struct ks_spc_stats {
    uint64_t hits;      /* ks_spc_acquire() found the key */
    uint64_t misses;    /* ks_spc_acquire() did not */
    uint64_t evictions; /* entries removed to make room (replacements not counted) */
    uint64_t inserts;   /* successful ks_spc_insert() calls */
    uint64_t refused;   /* ks_spc_insert() calls refused with KS_ENOSPC */
    int64_t entries;    /* indexed entries now */
    int64_t bytes;      /* their bytes (invariant 1) */
    int64_t max_bytes;
} ks_spc_stats;

/* Creates an empty store with a budget of max_bytes (<= 0: every insert is
 * refused). Returns 0 and *out; KS_EINVAL for NULL out; KS_ENOMEM. */
int ks_spc_create(int64_t max_bytes, ks_spc **out);

/* Frees the store and every entry. All acquired entries must have been
 * released. NULL is a no-op. */
void ks_spc_free(ks_spc *s);

/* Looks key up; on a hit takes a reference, marks the entry most recently used
 * and returns it (release it with ks_spc_release()). Returns NULL on a miss
 * or for a NULL store. Counts a hit or a miss. */
const ks_spc_entry *ks_spc_acquire(ks_spc *s, uint64_t key);

/* Drops a reference taken by ks_spc_acquire(); frees the entry when it was
 * unlinked meanwhile and this was the last reference. NULL e is a no-op. */
void ks_spc_release(ks_spc *s, const ks_spc_entry *e);

/* True when key is indexed. Does not count as a hit or miss, does not touch
 * the LRU order; the answer may be stale as soon as it returns. */
bool ks_spc_contains(ks_spc *s, uint64_t key);

/* Caches blob (len bytes, ownership taken: freed by the store, also on every
 * error) as the state of the prompt tokens[0, n_tokens) (copied) under key,
 * replacing any entry with the same key, evicting as invariant 4 says.
 * Returns 0; KS_ENOSPC when len + 4 * n_tokens exceeds the whole budget
 * (nothing is evicted then); KS_EINVAL for NULL s, NULL blob with len > 0,
 * n_tokens < 0 or NULL tokens with n_tokens > 0; KS_ENOMEM. */
int ks_spc_insert(ks_spc *s, uint64_t key, const int32_t *tokens, int n_tokens, uint8_t *blob,
                  size_t len);

/* Snapshot of the counters. NULL s or out: no-op. */
void ks_spc_get_stats(ks_spc *s, ks_spc_stats *out);

#endif

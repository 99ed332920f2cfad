/*
 * redis_ops.h — the operations on kvstash's entries in Redis that take
 * several commands, shared by the redis tier (tier_redis.c) and `kvstash
 * cache --redis` (cmd_cache.c): both delete, evict and read an entry the
 * same way (key layout and manifest: redis_fmt.h).
 *
 * Each runs on a connection its caller owns (redis_conn.h) and adds its
 * round trips to *trips (may be NULL). KS_EIO means the connection failed
 * (redis_conn.h contract 3: ks_redis_conn_error says why); the caller frees
 * it and counts the failure its own way. An error reply of the server to
 * one command (OOM under maxmemory, a wrong type) is not a failure of the
 * operation: the rest goes on, as the accounting tolerates (tier_redis.c
 * "Budget": a sum too high, never too low).
 *
 * Invariants
 *  1. An entry's size leaves <prefix>:bytes once: only the caller whose HDEL
 *     removed it from <prefix>:sizes sends the DECRBY, whichever host or
 *     process deletes it.
 *  2. A manifest and the chunks it names go in one DEL.
 *  3. Nothing read from Redis is used before its length was checked against
 *     the manifest (and the manifest against the limits, redis_fmt.h).
 *
 * Thread model: that of the connection — one thread at a time.
 */
#ifndef KS_REDIS_OPS_H
#define KS_REDIS_OPS_H

#include <stdint.h>

#include "cache/kvfile.h"
#include "cache/redis_conn.h"
#include "cache/redis_fmt.h"

typedef char ks_redis_member_str[KS_REDIS_MEMBER_LEN + 1];

/* Deletes the entries members[0, n): for each, its manifest and the chunks
 * it names (one DEL), its lru and sizes members, and — when this call's HDEL
 * removed its size — that size from <prefix>:bytes. Three round trips.
 * Returns how many sizes this call took off the sum (>= 0), KS_EIO or
 * KS_ENOMEM. *bytes_left (may be NULL): <prefix>:bytes after the last
 * DECRBY, -1 when none was sent. */
int ks_redis_ops_delete(ks_redis_conn *c, const ks_redis_names *nm, const ks_redis_member_str *members, int n,
                        int64_t *bytes_left, ks_redis_trips *trips);

/* Called with the members a round of ks_redis_ops_evict deleted. */
typedef void (*ks_redis_evict_cb)(void *ud, const ks_redis_member_str *members, int n);

/* Deletes the least recently used entries (<prefix>:lru, up to 16 a round)
 * until <prefix>:bytes + need <= budget, in at most max_rounds rounds
 * (<= 0: as many as it takes). A sum that counts only entries that are gone
 * (nothing left in lru) is set to 0. cb (may be NULL) is told the members
 * of each round. Returns the number of entries whose size was taken off the
 * sum (>= 0), KS_ENOSPC (need > budget: nothing done), KS_EIO or KS_ENOMEM.
 * *bytes_now (may be NULL): the last <prefix>:bytes seen, -1 when none. */
int ks_redis_ops_evict(ks_redis_conn *c, const ks_redis_names *nm, uint64_t need, uint64_t budget, int max_rounds,
                       ks_redis_evict_cb cb, void *ud, int64_t *bytes_now, ks_redis_trips *trips);

/* Appends a GET of each chunk of the entry whose manifest m is stored at
 * mkey: m->n_chunks commands, in order. 0 or the append's error. */
int ks_redis_ops_append_chunks(ks_redis_conn *c, const char *mkey, const ks_redis_manifest *m);

/* Copies the chunks from their replies rep[0, m->n_chunks) into buf
 * (m->total bytes). 0, KS_ENOENT (a chunk is missing: evicted or expired
 * under the manifest) or KS_ECORRUPT (a chunk of another length). */
int ks_redis_ops_take_chunks(redisReply *const *rep, const ks_redis_manifest *m, uint8_t *buf);

/* Checks an entry's bytes buf (m->total): the manifest's checksum first,
 * then the kvfile against exp (may be NULL) as a file tier does, then that
 * it holds m's token count under key. 0 with *meta and *payload_off (both
 * may be NULL), KS_ECORRUPT, KS_EVERSION or KS_EMISMATCH. Pure. */
int ks_redis_ops_check(const uint8_t *buf, const ks_redis_manifest *m, const ks_key *key, const ks_kvfile_expect *exp,
                       ks_kvfile_meta *meta, size_t *payload_off);

#endif

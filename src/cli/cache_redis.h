/*
 * cache_redis.h — the Redis part of `kvstash cache` (cmd_cache.c): the
 * entries a redis tier keeps under a key prefix (cache/redis_fmt.h), read
 * and maintained from the command line without a model.
 *
 * Entries are found with SCAN MATCH <prefix>:* (never KEYS, which blocks
 * Redis while it walks every key): a key is an entry's manifest when what
 * follows "<prefix>:" is a member "<fp-hex>:<key-hex>"; chunk keys and the
 * bookkeeping keys (lru, sizes, bytes, <fp>:lens) are passed over. Deleting
 * and evicting go through redis_ops.h, the code the tier itself uses, so
 * the accounting (<prefix>:bytes) stays what the servers expect. Safe next
 * to running servers: they treat an entry that vanished as a miss.
 *
 * Every function prints its errors ("kvstash cache SUB: redis URL: ...",
 * the URL redacted) and returns an exit code: 0, 1 (Redis failed or, for
 * verify, a bad entry), 2 (usage).
 *
 * Thread model: the command line's main thread only.
 */
#ifndef KS_CLI_CACHE_REDIS_H
#define KS_CLI_CACHE_REDIS_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/store_cfg.h"
#include "cache/tier.h"

typedef struct ks_cache_redis ks_cache_redis;

/* Checks cfg (URL, key_prefix, TLS settings: exit 2 when bad) and
 * connects (exit 1 when Redis cannot be reached). sub names the subcommand
 * in messages. */
int ks_cache_redis_open(const char *sub, const ks_redis_cfg *cfg, ks_cache_redis **out);
/* NULL is a no-op. */
void ks_cache_redis_close(ks_cache_redis *r);

/* Calls cb with every entry whose key starts with keyprefix (hex; NULL:
 * all): key, n_tokens, bytes (the kvfile's), reason, created_us,
 * last_hit_us (its last use by any server, from <prefix>:lru; created_us
 * when not accounted), model_fp. hits is 0 (Redis does not count them). */
int ks_cache_redis_list(ks_cache_redis *r, const char *keyprefix, ks_tier_list_cb cb, void *ud);

/* The accounting: members of <prefix>:lru, the value of <prefix>:bytes. */
int ks_cache_redis_usage(ks_cache_redis *r, uint64_t *entries, uint64_t *bytes);

/* Reads every entry's chunks and checks them as a server would before a
 * restore (lengths, the manifest's checksum, the kvfile, its key and token
 * count); prints "bad: redis KEY: ..." for each that fails. *good and *bad
 * receive the counts; with mac (may be NULL) every entry must carry a valid
 * tag under it (kvmac.h). 0, or 1 when Redis failed. */
int ks_cache_redis_verify(ks_cache_redis *r, const ks_kvmac_key *mac, int *good, int *bad);

/* Deletes the entries whose key starts with keyprefix (NULL: all, and the
 * model's length sets, and whatever the accounting still counts), with the
 * tier's accounting. print: one line per entry removed. *removed receives
 * their number. */
int ks_cache_redis_rm(ks_cache_redis *r, const char *keyprefix, bool print, int *removed);

/* Evicts the least recently used entries until <prefix>:bytes <= max_bytes
 * (as the servers do before a save). *evicted, *bytes_before and
 * *bytes_after receive what happened. */
int ks_cache_redis_gc(ks_cache_redis *r, uint64_t max_bytes, int *evicted, uint64_t *bytes_before,
                      uint64_t *bytes_after);

/* The redacted URL and the key prefix, for messages. Borrowed. */
const char *ks_cache_redis_where(const ks_cache_redis *r);
const char *ks_cache_redis_prefix(const ks_cache_redis *r);

#endif

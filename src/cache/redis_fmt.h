/*
 * redis_fmt.h — the pure part of the redis tier (tier_redis.c): its URL,
 * its key names, the manifest that makes an entry visible, and the chunk
 * arithmetic. No I/O, no hiredis: unit-tested on its own.
 *
 * Keys (docs/DEPLOY.md "What kvstash keeps in Redis"):
 *   <prefix>:<fp-hex>:<key-hex>                   the manifest (one line of text)
 *   <prefix>:<fp-hex>:<key-hex>:<nonce>:<i>       chunk i of the kvfile bytes
 *   <prefix>:lru    sorted set: member "<fp-hex>:<key-hex>", score: last use (ms)
 *   <prefix>:sizes  hash: member -> kvfile bytes (what the budget counts)
 *   <prefix>:bytes  integer: the sum of sizes (kvstash's share of Redis)
 *   <prefix>:<fp-hex>:lens  sorted set of the n_tokens of the entries of a model
 * A writer picks a random nonce per save, writes the chunks under it, then
 * the manifest with SET NX: two hosts saving one state at once never mix
 * their chunks, and a manifest only ever names chunks that were written.
 *
 * Invariants
 *  1. ks_redis_manifest_decode accepts only what ks_redis_manifest_encode
 *     writes, with consistent numbers (n_chunks = ceil(total / chunk_bytes),
 *     every length within the limits below): the reader allocates from these
 *     numbers.
 *  2. ks_redis_url_redact never lets a password through.
 *
 * Thread model: every function is pure and reentrant.
 */
#ifndef KS_REDIS_FMT_H
#define KS_REDIS_FMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "cache/kvmac.h"

/* chunk_bytes: 64 KiB .. 512 MiB (Redis's default proto-max-bulk-len). */
#define KS_REDIS_CHUNK_MIN ((int64_t)64 << 10)
#define KS_REDIS_CHUNK_MAX ((int64_t)512 << 20)
/* Chunks are written this much shorter than chunk_bytes: Redis keeps a value
 * in one allocation with a header of a few bytes, and its allocator
 * (jemalloc) rounds a value of exactly 4 MiB up to a 5 MiB size class — 25%
 * lost — where 4 MiB - 64 bytes costs 84 bytes more than its length
 * (measured on Redis 7.0, docs/DEPLOY.md). */
#define KS_REDIS_CHUNK_SLACK 64
/* The longest key this tier writes, NUL included. */
#define KS_REDIS_KEY_MAX 256

typedef struct ks_redis_url {
    bool tls;              /* rediss:// */
    bool unix_socket;      /* unix:// or redis+unix:// */
    char host[256];        /* TCP: name or address (IPv6 without brackets) */
    int port;              /* default 6379 */
    char path[256];        /* unix socket path */
    int db;                /* /db or ?db=N; default 0 */
    char user[128];        /* ACL user; "" for AUTH with the password only */
    char password[256];    /* "" when none */
} ks_redis_url;

/* Parses redis://[user[:password]@]host[:port][/db], rediss://... (TLS),
 * unix:///path[?db=N] and redis+unix://[user[:password]@]/path[?db=N].
 * User and password may be percent-encoded. 0, or KS_EINVAL with the reason
 * in err (which never contains the password). */
int ks_redis_url_parse(const char *url, ks_redis_url *out, char *err, size_t errlen);

/* Copies url into out (n bytes) with any password replaced by "***". */
void ks_redis_url_redact(const char *url, char *out, size_t n);

/* What makes an entry visible: written after all its chunks. */
typedef struct ks_redis_manifest {
    uint32_t n_tokens;
    uint32_t reason;       /* ks_reason */
    int64_t created_us;
    uint64_t total;        /* kvfile bytes, the sum of the chunks */
    uint64_t chunk_bytes;  /* every chunk but the last holds exactly this many */
    uint32_t n_chunks;
    uint64_t csum;         /* XXH3-64 of the whole kvfile bytes (checked before decoding) */
    uint64_t nonce;        /* the writer's random name of this copy's chunks */
    bool tagged;           /* written with the cache secret: tag follows on the line */
    uint8_t tag[16];       /* ks_redis_manifest_sign */
} ks_redis_manifest;

/* Writes m as one line into out (n bytes, 160 are plenty). Returns its
 * length, or KS_EINVAL when it does not fit. */
int ks_redis_manifest_encode(const ks_redis_manifest *m, char *out, size_t n);
/* Parses len bytes of s (not NUL-terminated). 0, KS_EVERSION (another
 * format), or KS_ECORRUPT (anything malformed or inconsistent). */
int ks_redis_manifest_decode(const char *s, size_t len, ks_redis_manifest *m);

/* The cache secret's tag on a manifest (docs/SECURITY.md): an HMAC of the
 * entry's member ("<fp>:<key>", so a manifest cannot be moved to another
 * key) and the manifest's line without the tag. sign sets m->tagged and
 * m->tag (0, or KS_EINVAL / KS_EIO); verify is true when m carries the tag
 * key gives it. A line written without the secret has no tag ("... nonce");
 * one written with it ends " <32 hex>": readers without the secret read
 * both. */
int ks_redis_manifest_sign(const ks_kvmac_key *key, const char *member, ks_redis_manifest *m);
bool ks_redis_manifest_verify(const ks_kvmac_key *key, const char *member, const ks_redis_manifest *m);

/* How many chunks of chunk_bytes hold total bytes (0 for 0; chunk_bytes > 0). */
uint32_t ks_redis_n_chunks(uint64_t total, uint64_t chunk_bytes);
/* The bytes [*off, *off + *len) of chunk i. */
void ks_redis_chunk_range(uint64_t total, uint64_t chunk_bytes, uint32_t i, uint64_t *off, uint64_t *len);

/* "<fp-hex>:<key-hex>" (the member of the lru and sizes sets) into out
 * (2 * KS_KEY_HEX_LEN + 2 bytes). */
#define KS_REDIS_MEMBER_LEN (2 * KS_KEY_HEX_LEN + 1)
void ks_redis_member(const uint8_t fp[32], const ks_key *key, char out[KS_REDIS_MEMBER_LEN + 1]);
/* Parses a member back; 0 or KS_EINVAL. */
int ks_redis_member_parse(const char *s, size_t len, uint8_t fp[32], ks_key *key);

/* The key names under a prefix (shorter than KS_REDIS_PREFIX_MAX, store_cfg.h:
 * then every name fits in KS_REDIS_KEY_MAX). */
typedef struct ks_redis_names {
    char prefix[KS_REDIS_KEY_MAX];
    char lru[KS_REDIS_KEY_MAX], sizes[KS_REDIS_KEY_MAX], bytes[KS_REDIS_KEY_MAX];
} ks_redis_names;
/* Fills n for prefix. KS_EINVAL when the prefix is too long (n is then
 * unusable). */
int ks_redis_names_init(ks_redis_names *n, const char *prefix);
/* <prefix>:<member>, the manifest's key. */
void ks_redis_key_manifest(const ks_redis_names *n, const char *member, char out[KS_REDIS_KEY_MAX]);
/* <mkey>:<nonce>:<i>, chunk i of the copy named nonce of the entry whose
 * manifest key is mkey (from ks_redis_key_manifest). */
void ks_redis_key_chunk(const char *mkey, uint64_t nonce, uint32_t i, char out[KS_REDIS_KEY_MAX]);
/* <prefix>:<fp-hex>:lens, the token counts of a model's entries. */
void ks_redis_key_lens(const ks_redis_names *n, const uint8_t fp[32], char out[KS_REDIS_KEY_MAX]);

#endif

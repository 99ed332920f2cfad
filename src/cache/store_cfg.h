/*
 * store_cfg.h — the settings of the KV store: the save reasons, the tiers,
 * which tier each reason saves into, the tiers' budgets and directories.
 *
 * These are the cache layer's own settings. Where they come from (defaults,
 * a YAML file, command-line flags) is decided above it, in src/config/; the
 * cache layer only receives a filled ks_store_cfg (store.h, tier.h).
 *
 * Thread model: plain data and pure functions; every function is thread-safe.
 */
#ifndef KS_STORE_CFG_H
#define KS_STORE_CFG_H

#include <stdbool.h>
#include <stdint.h>

/* The size of every path buffer of the store and its configuration, NUL included. */
#define KS_MAX_PATH 1024
/* The largest byte budget of a tier (1 PiB; the YAML keys
 * store.tiers.*.max_bytes, --cache-ram in MiB, `kvstash cache gc --max-bytes`
 * all stop here): budgets, their sums over the tiers and a share of one
 * stay far inside int64_t and a double's exact integers. */
#define KS_STORE_BYTES_MAX ((int64_t)1 << 50)

/* Why a state is saved; each reason maps to a tier (ks_store_cfg.reason_tier).
 * KS_REASON_PIN: a client's cache breakpoint (store.h "Pins"), saved pinned
 * into the ram tier and into the tier of reason_tier[KS_REASON_PIN].
 * KS_REASON_CHECKPOINT: a hybrid model's whole state at a prompt's end
 * (sched policy.c "Checkpoints"), where the next turn of its conversation
 * will most likely diverge.
 * KS_REASON_UNLOAD: a model's slots when the server unloads it (several
 * models, server.h): where the model finds them when it loads again. */
typedef enum {
    KS_REASON_COLD = 0,
    KS_REASON_CONTINUED,
    KS_REASON_FINISH,
    KS_REASON_EVICT,
    KS_REASON_SHUTDOWN,
    KS_REASON_PIN,
    KS_REASON_CHECKPOINT,
    KS_REASON_UNLOAD,
    KS_REASON__N
} ks_reason;
/* The tiers, fastest first; KS_TIER_NONE: "do not save". KS_TIER_REDIS is the
 * remote tier shared by the servers of several hosts (tier_redis.c): it takes
 * the saves of the reasons in ks_redis_cfg.reasons besides their local tier,
 * and is never a reason's tier in reason_tier. */
typedef enum {
    KS_TIER_RAM = 0, KS_TIER_SHM, KS_TIER_DISK, KS_TIER_REDIS, KS_TIER__N, KS_TIER_NONE = -1
} ks_tier_id;
/* The local tiers are [0, KS_TIER__LOCAL). */
#define KS_TIER__LOCAL KS_TIER_REDIS

/* "cold", "continued", "finish", "evict", "shutdown", "pin", "checkpoint", "unload"; "?" for any other value. */
const char *ks_reason_name(ks_reason r);
/* The reason named s, or -1 when s is NULL or unknown. */
int ks_reason_parse(const char *s);
/* "ram", "shm", "disk", "redis", "none" (KS_TIER_NONE); "?" for any other value. */
const char *ks_tier_name(ks_tier_id t);
/* The tier named s, KS_TIER_NONE for "none", or -2 when s is NULL or unknown. */
int ks_tier_parse(const char *s);

/* The redis tier (tier_redis.c, docs/DEPLOY.md). Off while url is "". */
#define KS_REDIS_URL_MAX 512
#define KS_REDIS_PREFIX_MAX 64
/* TLS to Redis (a rediss:// URL; redis_conn.h). Every file is PEM. Any of
 * these set (a file, a name, or verify false) with a URL that is not
 * rediss:// is a configuration error (ks_redis_cfg_prepare), never a
 * plain-text connection. */
typedef struct ks_redis_tls_cfg {
    char ca_file[KS_MAX_PATH];      /* CA certificates to verify the server with; "" (and no ca_dir):
                                       the system's default CA paths */
    char ca_dir[KS_MAX_PATH];       /* a directory of hashed CA certificates (c_rehash / openssl rehash) */
    char cert_file[KS_MAX_PATH];    /* client certificate (chain) for mutual TLS; needs key_file */
    char key_file[KS_MAX_PATH];     /* its private key, unencrypted */
    char server_name[256];          /* the name the certificate must carry, sent as SNI; "": the URL's host */
    bool verify;                    /* default true; false: no verification of the server at all */
} ks_redis_tls_cfg;
typedef struct ks_redis_cfg {
    char url[KS_REDIS_URL_MAX];     /* redis://[user:pass@]host[:port][/db], rediss:// (TLS),
                                       unix:///path, redis+unix:// */
    char password[256];             /* used when the URL has none (KVSTASH_REDIS_PASSWORD); never logged */
    char key_prefix[KS_REDIS_PREFIX_MAX]; /* default "kvstash": keys <prefix>:<fingerprint>:<key> */
    int ttl;                        /* seconds; 0 (default): no expiry; else every key written expires
                                       ttl s after its last use */
    int64_t chunk_bytes;            /* default 4 MiB: the largest value written (64 KiB..512 MiB) */
    int timeout_ms;                 /* default 250: connect and each command (10..60000) */
    int breaker_errors;             /* default 3: consecutive errors that open the circuit breaker */
    int breaker_ms;                 /* default 5000: how long the tier is skipped then */
    unsigned reasons;               /* 1 << ks_reason saved to redis; default finish|evict|shutdown|checkpoint|unload */
    ks_redis_tls_cfg tls;           /* rediss:// only */
} ks_redis_cfg;

typedef struct ks_store_cfg {
    bool enabled;                         /* the full store; default false unless a store key/flag is given */
    char cache_dir[KS_MAX_PATH];          /* disk tier; default $XDG_CACHE_HOME/kvstash or ~/.cache/kvstash */
    char shm_dir[KS_MAX_PATH];            /* default /dev/shm/kvstash-<uid> */
    char secret_file[KS_MAX_PATH];        /* the deployment secret that authenticates stored states
                                             (kvmac.h; also $KVSTASH_CACHE_SECRET); "": none */
    int stride;                           /* default 256 */
    int continued_interval;               /* default 512 */
    int min_tokens;                       /* default 256 */
    int shutdown_timeout_ms;              /* default 5000 */
    int finish_save_delay_ms;             /* a finish save waits this long for the conversation's next
                                             request, which supersedes it (ks_sched_params
                                             .finish_save_delay_ms); default 500, 0: taken at once */
    int warm_slots;                       /* slots filled from the file tiers at start (ks_sched_params
                                             .warm_slots); default 0 */
    int64_t tier_max_bytes[KS_TIER__N];   /* ram 2 GiB, shm 1 GiB, disk 10 GiB, redis 4 GiB (kvstash's
                                             share of the Redis memory); 0 disables the tier */
    int reason_tier[KS_REASON__N];        /* ks_tier_id; default cold=disk continued=shm finish=shm evict=disk
                                             shutdown=disk pin=disk checkpoint=shm
                                             unload=shm */
    unsigned reasons_given;               /* bit r: reason_tier[r] was set by the configuration
                                             (store.reasons), not a default */
    float pin_share;                      /* 0..1, default 0.5: the share of each tier's budget that pinned
                                             entries may hold protected from eviction (store.h "Pins") */
    ks_redis_cfg redis;
} ks_store_cfg;

/* Zeroes *c and fills the documented defaults above, except enabled (false)
 * and the two directories (""): who fills them decides their defaults
 * (ks_config_defaults, ks_store_params_default). c may not be NULL. */
void ks_store_cfg_defaults(ks_store_cfg *c);

#endif

/*
 * config.h — every `kvstash serve` setting, from defaults, a YAML file
 * (--config kvstash.yaml) and command-line flags, in that order of precedence
 * (flags win).
 *
 * This layer owns the decisions about settings: their defaults (the store's
 * numbers come from ks_store_cfg_defaults, cache/store_cfg.h), the YAML
 * file, and which store `kvstash serve` opens. The cache layer below only
 * receives a filled ks_store_cfg; the CLI above applies its flags over a
 * ks_config.
 *
 * YAML layout (every key optional):
 *
 *   model: /path/to/model.gguf
 *   mmproj: /path/to/mmproj.gguf   # images/audio in prompts (engine/media.h; --mmproj)
 *   host: 127.0.0.1
 *   port: 8080
 *   slots: 4                 # parallel sequences, 1..256
 *   ctx: 4096                # context per slot, tokens, 64..16777216
 *   batch: 512               # tokens per decode step, 1..1048576
 *   threads: 0               # 0 = all CPUs, 0..4096
 *   cache_prompt: true       # same-slot prefix reuse
 *   exact: true              # decode lone tokens in pairs: cached == uncached, bit for bit
 *   gpu_layers: auto         # layers on GPUs (-ngl): auto (all that fit; none without a GPU),
 *                            # all, or a count 0..the model's layers + 1 (the output layer)
 *   devices: CUDA0,CUDA1     # GPUs to use (--device), or none; default: every GPU found
 *   split_mode: layer        # none | layer | row (--split-mode)
 *   tensor_split: [3, 1]     # share of the layers per device in use (--tensor-split)
 *   main_gpu: 0              # the GPU of split_mode none (and row's KV) (--main-gpu)
 *   kv_offload: true         # false: the KV stays in host memory (--no-kv-offload)
 *   op_offload: true         # false: never run CPU layers' products on a GPU (--no-op-offload);
 *                            # exact mode turns it off where layers stay on the CPU
 *   repack: true             # let ggml repack Q4_0/Q4_K/IQ4_NL/MXFP4 weights (--no-repack)
 *   cache_type_k: f16        # the KV cache's types (-ctk, -ctv): f16, f32, bf16, q8_0, q4_0,
 *   cache_type_v: f16        # q4_1, iq4_nl, q5_0, q5_1 (a quantized V needs flash attention)
 *   affinity_min: 0.05       # min shared fraction to prefer a slot by prefix
 *   ctx_checkpoints: 8       # hybrid models: checkpoints per slot, 0..32 (0: none)
 *   checkpoint_bytes: 32MiB  # ... and their byte budget per slot
 *   checkpoint_every: 16     # ... one every N generated tokens (0: none while generating)
 *   api_key: secret          # one key: a single tenant (docs/SECURITY.md "Tenants")
 *   api_keys: [k1, k2]       # more keys, each its own tenant (at most 16 here; more in a file)
 *   api_key_file: /etc/kvstash/keys   # "KEY [NAME]" per line, read again when it changes
 *   tenant_by: prompt_cache_key,user  # request fields that subdivide a tenant (default none)
 *   share_system_prompt: false        # true: system prompt states (SPC) shared by all tenants
 *   metrics_key: secret      # the key of /metrics; with several tenants the only one
 *   max_queue: 64            # requests waiting for a slot, 1..1000000
 *   max_renders: 2           # chat template renders and grammar builds at once, 1..1024
 *   max_body_bytes: 16777216 # 1KiB..1TiB
 *   media:                   # image and audio input (with a projector; docs/SERVER.md "Media input")
 *     max_bytes: 10MiB       # one item, decoded (--media-max-bytes), 1KiB..1GiB
 *     max_items: 32          # items per request (--media-max-items), 1..1024
 *     max_total_bytes: 32MiB # all of a request's items, decoded (--media-max-total-bytes), 1KiB..4GiB
 *     max_pixels: 16777216   # width x height of one image (--media-max-pixels), 1..2^31
 *     path: /srv/images      # file:// image URLs, relative to it (--media-path; default none)
 *     fetch_hosts: "cdn.example.com,127.0.0.1"  # http(s):// image URLs from these hosts, "*": any
 *                            # (--media-fetch-hosts; default none: remote URLs refused)
 *     fetch_timeout_ms: 10000   # per image URL, its redirects included, 100..600000
 *     fetch_max_redirects: 3    # 0..10, each target's host checked again
 *   speculative:             # speculative decoding (docs/SERVER.md "Speculative decoding")
 *     type: ngram-simple     # none | ngram-simple | ngram-map-k | ngram-map-k4v | ngram-mod
 *     draft_max: 16          # tokens drafted per step at most, 1..64
 *     draft_min: 0           # shorter drafts are not verified
 *     ngram_simple_size_n: 3    # and _size_m (8), _min_hits (1); ngram_map_k_*, ngram_map_k4v_* alike (12, 48, 1);
 *     ngram_mod_n_match: 24     # ngram_mod_n_min, ngram_mod_n_max (llama-server's --spec-ngram-*)
 *     adaptive: true         # verify only what the measured costs make worth it
 *     draft_model: /path/to/draft.gguf   # drafts from a smaller model of the same vocabulary (-md)
 *     draft_p_min: 0         # ... stopped at a token it gives less probability (--spec-draft-p-min)
 *     draft_gpu_layers: auto # ... its layers on GPUs (-ngld; default: the model's)
 *   log: info                # debug|info|warn|error|off
 *   cors_origins: [http://localhost:5173]   # browser origins allowed (CORS); "*": any.
 *                            # Absent or []: CORS off. One origin may be given as a scalar.
 *   models:                  # per-model cache settings; the entry whose key equals the
 *     default:               # model's general.name or file base name applies, else "default"
 *       system_prompt_cache: true
 *       incremental_cache: true
 *       cache_min_tokens: 100
 *       slots: 3             # overrides the top-level slots for this model (1..256)
 *       spc_max_bytes: 268435456         # 0..1024TiB
 *       mmproj: /path/to/mmproj.gguf     # this model's projector (over the top-level mmproj)
 *       speculative: { type: none }      # this model's speculative block (replaces the top-level one)
 *       path: /models/small.gguf         # several models: this entry is a model served as NAME
 *       aliases: [claude-*haiku*, small] # other names a request may give (glob patterns)
 *       pin: false                       # loaded at start, never unloaded
 *       keep_alive: 300                  # unloaded after 300 s unused (-1: never)
 *       ctx: 8192                        # and exact, ctx_checkpoints, gpu_layers, cache_type_k/_v
 *   models_dir: /models      # every X.gguf is model X (a subdirectory X: its GGUF and mmproj)
 *   models_max: 4            # models loaded at once (0: no limit)
 *   models_memory: 20GiB     # their weights + KV at most (-1: 90% of RAM; 0: no limit)
 *   sleep_idle_seconds: 0    # unload a model unused this long (0: never)
 *   models_autoload: true    # a request loads its model
 *   default_model: big       # the model of a request that names none or an unknown one
 *   store:
 *     enabled: true                    # the full store (shm and disk tiers); see "Store modes"
 *     cache_dir: ~/.cache/kvstash      # disk tier directory
 *     shm_dir: /dev/shm/kvstash-$USER  # shm tier directory
 *     stride: 256
 *     continued_interval: 512
 *     min_tokens: 256                  # do not save states shorter than this
 *     shutdown_timeout_ms: 5000
 *     finish_save_delay_ms: 500        # a finish save waits for the next turn, which supersedes it
 *     warm_slots: 0                    # slots filled from shm/disk at start (--warm-slots)
 *     pin_share: 0.5                   # share of each tier's budget that pinned states (cache
 *                                      # breakpoints, store.h "Pins") may hold, 0..1
 *     tiers:                           # max_bytes: 0..1024TiB (KS_STORE_BYTES_MAX)
 *       ram:  { max_bytes: 2GiB }      # also the RAM-only store's budget (--cache-ram)
 *       shm:  { max_bytes: 1073741824 }
 *       disk: { max_bytes: 10737418240 }
 *       redis:                         # shared by the servers of several hosts (docs/DEPLOY.md)
 *         url: redis://[user:pass@]host:port/db   # or unix:///path, redis+unix://; --cache-redis
 *         max_bytes: 4GiB              # kvstash's share of Redis, every host together
 *         key_prefix: kvstash
 *         ttl: 0                       # seconds since last use; 0: none
 *         chunk_bytes: 4MiB            # 64KiB..512MiB
 *         timeout_ms: 250              # 10..60000
 *         breaker_errors: 3            # 1..1000
 *         breaker_ms: 5000             # 0..3600000
 *         reasons: [finish, evict, shutdown, checkpoint, unload]   # copied to Redis besides their local tier
 *         tls:                         # rediss:// only (any of these with another URL: an error)
 *           ca_file: /etc/kvstash/redis-ca.pem   # default: the system's CA certificates
 *           ca_dir: /etc/ssl/certs               # hashed CA directory, instead of or with ca_file
 *           cert_file: client.pem      # mutual TLS: client certificate, with key_file
 *           key_file: client.key       # unencrypted PEM
 *           server_name: redis.internal          # default: the URL's host
 *           verify: true               # false: no verification of the server (testing only)
 *     reasons: { cold: disk, continued: shm, finish: shm, evict: disk, shutdown: disk, pin: disk,
 *                checkpoint: shm, unload: shm }
 *                                      # pin: pinned saves go to ram and to this tier;
 *                                      # checkpoint: a hybrid model's state at a prompt's end
 *
 * Store modes (ks_config_store_plan): `kvstash serve` opens
 *  - the full store (ram, shm and disk tiers, store.reasons as given) when
 *    store.enabled is true: `enabled: true`, any other store key without
 *    `enabled: false`, or --cache-dir;
 *  - else the RAM-only store, when the ram tier's budget is > 0 (the
 *    default): only the ram tier, no directory used or created, no file
 *    read or written; every reason that maps to a tier maps to ram, except
 *    shutdown (none: the RAM dies with the process). Its settings are
 *    store.tiers.ram.max_bytes, stride, min_tokens, continued_interval,
 *    shutdown_timeout_ms, finish_save_delay_ms, pin_share and reasons (`none` stays none), so
 *    `store: { enabled: false, tiers: { ram: { max_bytes: 4GiB } } }` sizes
 *    it without turning on the full store;
 *  - no store when the ram budget is 0 and store.enabled is false, and never
 *    when cache_prompt is false (no reuse at all: no lookups, no saves).
 *
 * The redis tier is kept in both store modes; its password may also come
 * from $KVSTASH_REDIS_PASSWORD (cmd_serve.c), never from a log. Its
 * settings as a whole (the URL with the flags applied, the TLS files) are
 * checked by `kvstash serve` before the model loads (ks_redis_cfg_prepare,
 * cache/redis_conn.h): a bad one is exit 2.
 *
 * An unknown key, a wrong type or an out-of-range value fails with a message
 * that names the key path ("models.default.cache_min_tokens: expected an integer").
 * A setting that also has a flag has one range for both, from the constants
 * below (cmd_serve.c parses the flags with them).
 *
 * Thread model: a ks_config is plain data, filled on the main thread before
 * the server starts, read-only afterwards.
 */
#ifndef KS_CONFIG_H
#define KS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/offload.h"
#include "cache/store_cfg.h"

/* max_queue's range, the same for the YAML key and --max-queue. There is no
 * "no queue" value: 0 is refused rather than replaced by a default. */
enum { KS_CONFIG_MAX_QUEUE_MIN = 1, KS_CONFIG_MAX_QUEUE_MAX = 1000000 };

/* The ranges of the settings that are both a YAML key and a flag, inclusive:
 * port (--port), slots and models.<name>.slots (--slots; the engine's and the
 * scheduler's limit, KS_MAX_SLOTS), ctx (--ctx), batch (--batch), threads
 * (--threads). */
enum {
    KS_CONFIG_PORT_MIN = 0, KS_CONFIG_PORT_MAX = 65535,
    KS_CONFIG_SLOTS_MIN = 1, KS_CONFIG_SLOTS_MAX = 256, KS_CONFIG_MODELS_LOADED_MAX = 64,
    KS_CONFIG_CTX_MIN = 64, KS_CONFIG_CTX_MAX = 1 << 24,
    KS_CONFIG_BATCH_MIN = 1, KS_CONFIG_BATCH_MAX = 1 << 20,
    KS_CONFIG_THREADS_MIN = 0, KS_CONFIG_THREADS_MAX = 4096,
    KS_CONFIG_CKPT_MAX = 32, /* ctx_checkpoints (--ctx-checkpoints): KS_SCHED_CKPT_MAX */
    KS_CONFIG_CKPT_EVERY_MAX = 1 << 20, /* checkpoint_every (--checkpoint-every) */
};
/* max_body_bytes (--max-body-bytes): 1 KiB..1 TiB. The server buffers up to
 * twice that plus 1 MiB before it stops reading a body: bounded here, that
 * sum cannot overflow. */
#define KS_CONFIG_MAX_BODY_MIN ((int64_t)1024)
#define KS_CONFIG_MAX_BODY_MAX ((int64_t)1 << 40)
/* Byte budgets (store.tiers.<tier>.max_bytes, --cache-ram in MiB,
 * models.<name>.spc_max_bytes): 0..KS_STORE_BYTES_MAX (store_cfg.h, 1 PiB). */

/* cors_origins (and --cors-origin): at most this many, each shorter than
 * KS_CONFIG_ORIGIN_MAX bytes. */
enum { KS_CONFIG_CORS_MAX = 16, KS_CONFIG_ORIGIN_MAX = 256 };
/* api_keys: at most this many (a key file holds more). */
enum { KS_CONFIG_KEYS_MAX = 16 };

/* media.* (and the --media-* flags): the limits on a request's images and
 * audio (server/media_in.h takes them as ks_media_limits), and their ranges. */
typedef struct ks_media_cfg {
    int64_t max_bytes;          /* default 10 MiB */
    int max_items;              /* default 32 */
    int64_t max_total_bytes;    /* default 32 MiB */
    int64_t max_pixels;         /* default 16 Mi (4096 x 4096) */
    char path[KS_MAX_PATH];     /* file:// image URLs below this directory ("": refused; --media-path) */
    char fetch_hosts[1024];     /* http(s):// image URLs from these hosts, comma-separated, "*": any
                                   ("": refused; --media-fetch-hosts) */
    int fetch_timeout_ms;       /* per image URL, redirects included (default 10000) */
    int fetch_max_redirects;    /* redirects followed, each target checked (default 3) */
} ks_media_cfg;
#define KS_CONFIG_MEDIA_BYTES_MIN ((int64_t)1024)
#define KS_CONFIG_MEDIA_BYTES_MAX ((int64_t)1 << 30)
#define KS_CONFIG_MEDIA_TOTAL_MAX ((int64_t)4 << 30)
#define KS_CONFIG_MEDIA_ITEMS_MAX 1024
#define KS_CONFIG_MEDIA_PIXELS_MAX ((int64_t)1 << 31)

/* speculative (models.<name>.speculative, the --spec-* flags): speculative
 * decoding (docs/SERVER.md "Speculative decoding"). The n-gram settings are
 * llama-server's, per type. */
typedef struct ks_spec_cfg {
    char type[24];              /* none | ngram-simple | ngram-map-k | ngram-map-k4v | ngram-mod
                                   (--spec-type; default ngram-simple) */
    int draft_max;              /* tokens drafted per step at most, 1..64 (--spec-draft-n-max,
                                   --draft-max; default 16) */
    int draft_min;              /* shorter drafts are not verified, 0..64 (--spec-draft-n-min,
                                   --draft-min; default 0) */
    int ngram_size_n[3];        /* [simple, map-k, map-k4v]: lookup length 1..1024 (default 3, 12, 12) */
    int ngram_size_m[3];        /* ... draft length 1..1024 (default 8, 48, 48) */
    int ngram_min_hits[3];      /* ... >= 1 (default 1) */
    int ngram_mod_n_match;      /* ngram-mod: 1..1024 (default 24) */
    int ngram_mod_n_min;        /* 0..1024 (default 48) */
    int ngram_mod_n_max;        /* 0..1024 (default 64) */
    bool adaptive;              /* verify what is worth its measured cost (sched.h draft_adaptive;
                                   --no-spec-adaptive: every draft whole; default true) */
    char draft_model[KS_MAX_PATH]; /* a draft model (-md; "": none): drafts from it (draft-simple)
                                   instead of n-grams */
    float draft_p_min;          /* stop a draft at a token the draft model gives less (0..1,
                                   --spec-draft-p-min; default 0) */
    char draft_gpu_layers[16];  /* the draft model's layers on GPUs (-ngld): auto|all|N ("": the
                                   model's -ngl) */
} ks_spec_cfg;
enum { KS_CONFIG_DRAFT_MAX = 64 }; /* the scheduler's KS_DRAFT_MAX */
void ks_config_spec_defaults(ks_spec_cfg *s);

enum { KS_CONFIG_ALIASES_MAX = 8, KS_CONFIG_MODELS_MAX = 16 };
typedef struct ks_model_cache_cfg {
    bool system_prompt_cache;   /* SPC (default false) */
    bool incremental_cache;     /* IMC (default false) */
    int cache_min_tokens;       /* default 100 */
    int slots;                  /* 0: use the top-level value */
    int64_t spc_max_bytes;      /* default 256 MiB */
    char mmproj[KS_MAX_PATH];   /* the model's projector ("": the top-level mmproj) */
    bool has_spec;              /* a speculative block: it replaces the top-level one */
    ks_spec_cfg spec;
    /* Several models (docs/SERVER.md "Several models"): an entry with a path
     * is a model the server serves, loaded on demand, under the entry's key. */
    char path[KS_MAX_PATH];     /* the GGUF ("": a settings-only entry, matched by name) */
    char aliases[KS_CONFIG_ALIASES_MAX][128]; /* other names, exact or glob patterns (claude-*haiku*) */
    int n_aliases;
    bool pin;                   /* loaded at start, never unloaded */
    int keep_alive;             /* seconds unused before it is unloaded; 0: sleep_idle_seconds;
                                   -1: never (Ollama's keep_alive) */
    int ctx;                    /* per slot; 0: the top-level ctx */
    int exact;                  /* -1: the top-level exact; else 0/1 */
    int ctx_checkpoints;        /* -1: the top-level value */
    char gpu_layers[16];        /* auto|all|N; "": the top-level -ngl */
    char cache_type_k[16];      /* "": the top-level types */
    char cache_type_v[16];
} ks_model_cache_cfg;

typedef struct ks_config {
    char model[KS_MAX_PATH];
    char mmproj[KS_MAX_PATH];   /* projector for images and audio ("": none; --mmproj) */
    char host[256];
    int port;
    int slots;
    int ctx;
    int batch;
    int threads;
    bool cache_prompt;
    float affinity_min;
    char api_key[256];
    /* Tenants (docs/SECURITY.md): keys beyond api_key, a key file, the
     * fields that subdivide a tenant (server.h KS_TENANT_BY_*, as a list),
     * and whether system prompts are shared across tenants. A later file's
     * api_keys, or any --api-key flag, replaces the whole list. */
    char api_keys[KS_CONFIG_KEYS_MAX][256];
    int n_api_keys;
    char api_key_file[KS_MAX_PATH];
    char metrics_key[256];      /* /metrics (server.h metrics_key); "": none */
    char tenant_by[128];
    bool share_system_prompt;
    int max_queue;
    int max_renders;            /* default 2: renders and grammar builds at once (server/admit.h) */
    int64_t max_body_bytes;
    ks_media_cfg media;         /* image and audio input limits */
    char log[16];
    ks_model_cache_cfg cache;   /* the resolved per-model entry (after ks_config_resolve_model) */
    ks_store_cfg store;
    /* raw per-model entries from the file, resolved against the model's name */
    int n_models;
    char model_keys[16][128];
    ks_model_cache_cfg models[16];
    bool model_has_slots[16];
    bool exact;                 /* default true (see the note on exactness in sched.c) */
    ks_offload offload;         /* where the model runs (base/offload.h); checked against the
                                   devices and the model by the engine when it opens */
    bool repack;                /* default true: ggml may repack weights (engine.h ks_engine_params) */
    char cache_type_k[16];      /* the KV cache's types by llama-server's names ("": f16) */
    char cache_type_v[16];
    /* Checkpoints of hybrid models (sched.h ckpt_*): per slot at most
     * ctx_checkpoints (0..KS_CONFIG_CKPT_MAX; 0: none), within
     * checkpoint_bytes, one every checkpoint_every generated tokens (0: none
     * while generating). */
    int ctx_checkpoints;        /* default 8 */
    int64_t checkpoint_bytes;   /* default 32 MiB */
    int checkpoint_every;       /* default 16 */
    /* Browser origins allowed to call the server (CORS, docs/SERVER.md), each
     * checked by ks_config_check_origin; none (the default): CORS off. A later
     * file's list, or any --cors-origin flag, replaces the whole list. */
    char cors_origins[KS_CONFIG_CORS_MAX][KS_CONFIG_ORIGIN_MAX];
    int n_cors_origins;
    ks_spec_cfg spec;           /* speculative decoding (the resolved model's block, if any) */
    /* Several models (server.h "several models"): the models: entries with a
     * path, and each GGUF of models_dir. */
    char models_dir[KS_MAX_PATH]; /* --models-dir: each X.gguf is model X ("": none) */
    int models_max;             /* --models-max: loaded at once (default 4; 0: no limit) */
    int64_t models_memory;      /* --models-memory: bytes the loaded models may take (weights +
                                   KV, estimated from each GGUF); 0: none; -1 (default): 90% of
                                   the machine's memory */
    int sleep_idle_seconds;     /* --sleep-idle-seconds: unload a model unused this long (0,
                                   default: never) */
    bool models_autoload;       /* --no-models-autoload: a request does not load its model */
    char default_model[128];    /* --default-model: the model of requests naming none or an
                                   unknown one ("": with several models, none) */
} ks_config;

/* Fills every default. */
void ks_config_defaults(ks_config *c);
/* Reads a YAML file over the current values. Returns 0, or KS_ENOENT / KS_EINVAL
 * with a message naming the file, line and key path in err. */
int ks_config_load_file(ks_config *c, const char *path, char *err, size_t errlen);
/* Same from a string (for tests). */
int ks_config_load_string(ks_config *c, const char *yaml, char *err, size_t errlen);
/* Which store `kvstash serve` opens (see "Store modes" above). */
typedef enum { KS_STORE_OFF = 0, KS_STORE_RAM_ONLY, KS_STORE_FULL } ks_store_mode;

/* Decides the store for c and writes its settings to *out (c->store, changed
 * for the RAM-only mode: shm and disk budgets 0, both directories "", reasons
 * mapped to ram, shutdown to none). *out is a copy of c->store for the other
 * modes. c and out may not be NULL. */
ks_store_mode ks_config_store_plan(const ks_config *c, ks_store_cfg *out);
const char *ks_store_mode_name(ks_store_mode m); /* "off", "ram-only", "full" */

/* Whether origin may be allowed by CORS: "*", or scheme://host[:port] as a
 * browser sends it in Origin (no path, no trailing slash, ASCII; e.g.
 * http://localhost:5173). "null" is refused: sandboxed frames and file://
 * pages all send it, so allowing it would allow any of them. Returns 0, or
 * KS_EINVAL with the reason in why. */
int ks_config_check_origin(const char *origin, char *why, size_t whylen);

/* Picks the models.<name> entry for the model (its general.name or file base name,
 * else "default") into c->cache; per-model slots override c->slots. */
void ks_config_resolve_model(ks_config *c, const char *model_name, const char *model_file);

#endif

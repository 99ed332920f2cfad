/*
 * serve_flags.h — the command line of `kvstash serve`: its usage text, its
 * flags as given, and their application over the settings of the YAML file
 * (flags win; docs/SERVER.md lists them). cmd_serve.c runs the server.
 *
 * Thread model: the main thread, before any other starts.
 */
#ifndef KS_CLI_SERVE_FLAGS_H
#define KS_CLI_SERVE_FLAGS_H

#include <stdbool.h>
#include <stdio.h>

#include "base/offload.h"
#include "config/config.h"

/* The numeric speculative decoding flags (--spec-draft-n-max ...). */
#define KS_SERVE_SPEC_INTS 14

/* The flags as given, applied over the file's values. */
typedef struct ks_serve_flags {
    const char *model, *host, *api_key, *config, *log, *alias, *chat_template, *reasoning_format;
    const char *mmproj; /* --mmproj: wins over models.<name>.mmproj and mmproj */
    int port, slots, ctx, batch, threads, max_queue, max_tokens, timeout, shutdown_ms; /* -1: not given */
    int ctx_size; /* -c/--ctx-size: llama-server's, the slots' context together (-1: not given) */
    int header_timeout, max_conns, max_conns_client; /* -1: not given */
    long long max_body;
    long long media_max_bytes, media_max_total, media_max_pixels; /* --media-*, -1: not given */
    int media_max_items;                                          /* -1: not given */
    const char *media_path, *media_fetch_hosts;                   /* --media-path, --media-fetch-hosts */
    int media_fetch_timeout;                                      /* --media-fetch-timeout-ms, -1: not given */
    int cache_ram; /* MiB, -1: not given */
    int warm_slots; /* -1: not given */
    bool no_cache, no_exact, no_repack, imc, spc;
    bool spm_infill; /* --spm-infill */
    int flash_attn; /* KS_FA_* */
    const char *cache_type_k, *cache_type_v; /* --cache-type-k/-ctk, --cache-type-v/-ctv */
    const char *cache_dir, *cache_redis, *secret_file;
    const char *tls_ca, *tls_ca_dir, *tls_cert, *tls_key, *tls_name; /* --cache-redis-tls-* */
    bool tls_insecure;
    const char *cors[KS_CONFIG_CORS_MAX]; /* --cors-origin, in order */
    const char *keys[KS_CONFIG_KEYS_MAX + 1]; /* --api-key, in order */
    int n_keys;
    const char *key_file, *tenant_by; /* --api-key-file, --tenant-by */
    bool share_sys;                   /* --share-system-prompt */
    const char *metrics_key;          /* --metrics-key */
    int n_cors;
    int responses_ttl, responses_max; /* -1: not given */
    int ctx_checkpoints, checkpoint_every; /* -1: not given */
    long long checkpoint_bytes;            /* -1: not given */
    ks_offload offload;                    /* the offload flags, those in offload_given */
    unsigned offload_given;
    const char *spec_type;                 /* --spec-type */
    bool no_spec_adaptive;                 /* --no-spec-adaptive */
    const char *draft_model, *draft_ngl;   /* -md, -ngld */
    float draft_p_min;                     /* --spec-draft-p-min, < 0: not given */
    int spec_int[KS_SERVE_SPEC_INTS];      /* the --spec-* numbers (serve_flags.c), -1: not given */
    const char *models_dir, *default_model; /* --models-dir, --default-model */
    int models_max, sleep_idle;            /* --models-max, --sleep-idle-seconds; -1: not given */
    long long models_memory;               /* --models-memory MiB, -2: not given */
    int models_autoload;                   /* --models-autoload 1, --no-models-autoload 0; -1: not given */
} ks_serve_flags;

/* The usage text to f. */
void ks_serve_usage(FILE *f);
/* Parses argv into *f (zeroed first): 0, -1 for --help (usage printed), or
 * 2 after printing why a flag is refused. */
int ks_serve_parse_flags(int argc, char **argv, ks_serve_flags *f);
/* Applies the flags given in f over c (and the environment's
 * KVSTASH_API_KEY, KVSTASH_REDIS_PASSWORD): 0, or 2 after printing why. */
int ks_serve_apply_flags(const ks_serve_flags *f, ks_config *c);
/* The speculative decoding flags alone over c->spec (ks_serve_apply_flags
 * does it too; again after a model's own speculative block is resolved, so
 * that flags win over it as well). */
void ks_serve_apply_spec_flags(const ks_serve_flags *f, ks_config *c);

#endif

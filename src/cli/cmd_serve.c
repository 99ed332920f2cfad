/*
 * cmd_serve.c — `kvstash serve`: the OpenAI-compatible HTTP server.
 *
 * Settings come from the defaults, then the YAML file (--config), then the
 * flags (flags win; docs/SERVER.md lists them). Start-up order: engine →
 * caches (SPC, KV store, with their /metrics sources) → scheduler →
 * HTTP daemon; teardown runs in reverse. Then two lines on stderr that
 * scripts and tests rely on:
 *   kvstash: listening on http://HOST:PORT (model NAME, N slots, ctx C)
 *   kvstash: port=PORT
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread (the mask is set
 * before any thread starts) and taken with sigwait on this thread, so no
 * work happens in a signal handler. The first one drains: no new
 * connections, running requests finish (up to --shutdown-timeout), the rest
 * are canceled, everything is freed, exit 0. A second signal during the
 * drain cancels at once. With --api-key-file, SIGHUP is taken the same way
 * and has the server read its key file again (keyring.h).
 *
 * The KV store (ks_config_store_plan, config.h "Store modes"): the full store
 * with --cache-dir or a store: section; otherwise a RAM-only store (ram tier
 * only, --cache-ram MiB, default 2048) that keeps the states of conversations
 * whose slot was taken over, writing no file and using no directory; none
 * with --cache-ram 0 or --no-cache-prompt.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cache/redis_conn.h"
#include "cache/redis_fmt.h"
#include "config/config.h"
#include "cache/spc.h"
#include "cache/store.h"
#include "cli/cli.h"
#include "cli/serve_store.h"
#include "engine/engine.h"
#include "engine/fingerprint.h"
#include "sched/sched.h"
#include "server/keyring.h"
#include "server/server.h"

#define CMD "kvstash serve"

/* --slots and the YAML slots share one range (config.h); it is the scheduler's. */
_Static_assert(KS_CONFIG_SLOTS_MAX == KS_MAX_SLOTS, "the slots range must be the scheduler's");
_Static_assert(KS_CONFIG_CKPT_MAX == KS_SCHED_CKPT_MAX, "the ctx_checkpoints range must be the scheduler's");

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvstash serve -m MODEL [options]\n"
            "  -m, --model PATH          GGUF model file (required here or as model: in --config)\n"
            "  --host ADDR               address to bind (default 127.0.0.1)\n"
            "  --port N                  TCP port; 0 picks a free one (default 8080)\n"
            "  --slots N                 parallel sequences, 1..256 (default 4)\n"
            "  --ctx N                   context per slot, tokens, 64..16777216 (default 4096)\n"
            "  --batch N                 tokens per decode step, 1..1048576 (default 512)\n"
            "  --threads N               CPU threads, 0..4096; 0 = all (default 0)\n"
            "  --no-cache-prompt         never reuse a slot's KV (every prompt is prefilled)\n"
            "  --no-exact                decode generated tokens alone: faster decode, but cached and\n"
            "                            concurrent output may differ in the last bits (exact: false)\n"
            "  --no-repack               keep the weights as stored: ggml does not repack Q4_0, Q4_K,\n"
            "                            IQ4_NL, MXFP4 into its interleaved layouts (repack: false; as\n"
            "                            llama-server's --no-repack)\n"
            "  --imc                     incremental message cache: route conversations to their slot\n"
            "                            by message hashes (models.<name>.incremental_cache)\n"
            "  --spc                     system prompt cache: keep system-prompt KV states in RAM\n"
            "                            (models.<name>.system_prompt_cache)\n"
            "  --cache-ram MIB           RAM budget of the KV store (store.tiers.ram.max_bytes; default\n"
            "                            2048). Without --cache-dir the store is RAM-only: evicted\n"
            "                            conversations are restored from RAM, no file is written;\n"
            "                            0 turns it off\n"
            "  --cache-dir DIR           enable the full persistent KV store (ram, shm and disk tiers)\n"
            "                            with its disk tier in DIR (store.enabled, store.cache_dir)\n"
            "  --warm-slots N|all        at start, before serving, put the N most recently saved states\n"
            "                            of the store's shm and disk tiers into the slots (one per\n"
            "                            conversation), so conversations go on after a restart as in a\n"
            "                            warm process (store.warm_slots; default 0: off)\n"
            "  --cache-redis URL         share KV states with the servers of other hosts through Redis or\n"
            "                            Valkey (store.tiers.redis.url): redis://[user:pass@]host:port/db,\n"
            "                            rediss:// (TLS), unix:///path; password also from\n"
            "                            $KVSTASH_REDIS_PASSWORD (docs/DEPLOY.md)\n"
            "  --cache-redis-tls-ca FILE CA certificates (PEM) that sign the rediss:// server's certificate\n"
            "                            (store.tiers.redis.tls.ca_file; default: the system's)\n"
            "  --cache-redis-tls-ca-dir DIR  a hashed directory of CA certificates (tls.ca_dir)\n"
            "  --cache-redis-tls-cert FILE   client certificate for mutual TLS (tls.cert_file), with\n"
            "  --cache-redis-tls-key FILE    its unencrypted private key (tls.key_file)\n"
            "  --cache-redis-tls-server-name NAME  the name the server's certificate must carry, sent as\n"
            "                            SNI (tls.server_name; default: the URL's host)\n"
            "  --cache-redis-tls-insecure  do not verify the server's certificate (tls.verify: false;\n"
            "                            testing only)\n"
            "  --cache-secret-file FILE  a deployment secret (>= 16 bytes, mode 600) that authenticates\n"
            "                            every stored state (store.secret_file; also\n"
            "                            $KVSTASH_CACHE_SECRET; docs/SECURITY.md)\n"
            "  --api-key KEY             require 'Authorization: Bearer KEY' (also $KVSTASH_API_KEY);\n"
            "                            repeatable (up to 17): then each key is a tenant whose cache\n"
            "                            no other key can reach (docs/SECURITY.md)\n"
            "  --api-key-file FILE       more keys, 'KEY [TENANT-NAME]' per line (keys with one name are\n"
            "                            one tenant); read again when it changes or on SIGHUP\n"
            "  --tenant-by LIST          request fields that subdivide a key's tenant: prompt_cache_key,\n"
            "                            cache_salt, user (also metadata.user_id) (default: none)\n"
            "  --share-system-prompt     let every tenant restore a system prompt's cached state (SPC)\n"
            "  --responses-ttl S         keep Responses API conversations for previous_response_id this\n"
            "                            long, seconds (default 3600; 0: keep none)\n"
            "  --responses-max N         ... and at most this many, oldest forgotten first (default 1024)\n"
            "  --cors-origin ORIGIN      let browser pages from ORIGIN (e.g. http://localhost:5173) call\n"
            "                            the server (CORS); repeatable, up to 16; * allows any origin\n"
            "                            (cors_origins; default: none, CORS off)\n"
            "  --max-queue N             requests waiting for a slot, 1..1000000; beyond: 503 (default 64)\n"
            "  --max-body-bytes N        largest request body, 1024..2^40; beyond: 413 (default 16777216)\n"
            "  --max-tokens N            max_tokens of requests that give none (default 2048;\n"
            "                            always capped by the context left after the prompt)\n"
            "  --alias NAME              model id in /v1/models and responses (default: the model's name)\n"
            "  --chat-template FILE      Jinja chat template to use instead of the GGUF's\n"
            "  --reasoning-format F      where a reasoning model's thinking goes: deepseek (default:\n"
            "                            reasoning_content), deepseek-legacy, auto or none (in content)\n"
            "  --timeout S               idle keep-alive timeout between requests, seconds; 0: none\n"
            "                            (default 600)\n"
            "  --header-timeout S        a request's headers and body may pause this long, seconds,\n"
            "                            1..3600; then the connection is closed (default 30)\n"
            "  --max-connections N       connections served at once, 1..960; the next 16 get 503,\n"
            "                            later ones wait in the kernel's backlog (default 256)\n"
            "  --max-connections-per-client N\n"
            "                            connections from one address, 0..960, at most\n"
            "                            --max-connections; beyond, a new one is closed at once;\n"
            "                            0: half of --max-connections (default 0)\n"
            "  --shutdown-timeout MS     on SIGTERM, wait this long for running requests (default 10000)\n"
            "  --flash-attn [on|off|auto]  flash attention (default auto: on with setup's patched CPU\n"
            "                            backend, where it is exact, or with --no-exact; off on the\n"
            "                            prebuilt one, where cached and uncached output could differ in\n"
            "                            the last bits). --flash-attn alone means on\n"
            "  --ctx-checkpoints N       hybrid and recurrent models: state checkpoints kept per slot,\n"
            "                            0..32, so a turn that diverges inside the slot goes back to one\n"
            "                            instead of prefilling everything; 0: none (default 8;\n"
            "                            --swa-checkpoints is the same flag, as in llama-server)\n"
            "  --checkpoint-every N      ... one every N generated tokens; 0: none while generating\n"
            "                            (default 16)\n"
            "  --checkpoint-bytes SIZE   ... within SIZE per slot, e.g. 64M (default 32M)\n"
            "  --config FILE             YAML settings (see docs/SERVER.md); flags override it\n"
            "  --log LEVEL               debug|info|warn|error|off (default info)\n"
            "GPUs (docs/SERVER.md, \"GPUs\"):\n"
            "%s",
            ks_cli_offload_usage);
}

/* The flags as given, applied over the file's values. */
typedef struct flags {
    const char *model, *host, *api_key, *config, *log, *alias, *chat_template, *reasoning_format;
    int port, slots, ctx, batch, threads, max_queue, max_tokens, timeout, shutdown_ms; /* -1: not given */
    int header_timeout, max_conns, max_conns_client; /* -1: not given */
    long long max_body;
    int cache_ram; /* MiB, -1: not given */
    int warm_slots; /* -1: not given */
    bool no_cache, no_exact, no_repack, imc, spc;
    int flash_attn; /* KS_FA_* */
    const char *cache_dir, *cache_redis, *secret_file;
    const char *tls_ca, *tls_ca_dir, *tls_cert, *tls_key, *tls_name; /* --cache-redis-tls-* */
    bool tls_insecure;
    const char *cors[KS_CONFIG_CORS_MAX]; /* --cors-origin, in order */
    const char *keys[KS_CONFIG_KEYS_MAX + 1]; /* --api-key, in order */
    int n_keys;
    const char *key_file, *tenant_by; /* --api-key-file, --tenant-by */
    bool share_sys;                   /* --share-system-prompt */
    int n_cors;
    int responses_ttl, responses_max; /* -1: not given */
    int ctx_checkpoints, checkpoint_every; /* -1: not given */
    long long checkpoint_bytes;            /* -1: not given */
    ks_offload offload;                    /* the offload flags, those in offload_given */
    unsigned offload_given;
} flags;

static int parse_flags(int argc, char **argv, flags *f) {
    enum { O_HOST = 256, O_PORT, O_SLOTS, O_CTX, O_BATCH, O_THREADS, O_NOCACHE, O_NOEXACT, O_KEY, O_QUEUE, O_BODY,
           O_MAXTOK, O_ALIAS, O_TIMEOUT, O_SHUTDOWN, O_FA, O_CONFIG, O_LOG, O_IMC, O_SPC, O_CACHEDIR, O_CACHERAM,
           O_TEMPLATE, O_REASONING, O_CORS, O_RESP_TTL, O_RESP_MAX, O_HDR_TIMEOUT, O_MAXCONN, O_MAXCONN_CLIENT,
           O_CKPT, O_CKPT_EVERY, O_CKPT_BYTES, O_CACHEREDIS, O_TLS_CA, O_TLS_CA_DIR, O_TLS_CERT, O_TLS_KEY,
           O_TLS_NAME, O_TLS_INSECURE, O_NOREPACK, O_WARM, O_SECRET, O_KEYFILE, O_TENANT_BY, O_SHARE_SYS,
           O_OFFLOAD,
           O_OFFLOAD_END = O_OFFLOAD + KS_CLI_OFFLOAD_N };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},          {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},        {"slots", required_argument, 0, O_SLOTS},
        {"ctx", required_argument, 0, O_CTX},          {"batch", required_argument, 0, O_BATCH},
        {"threads", required_argument, 0, O_THREADS},  {"no-cache-prompt", no_argument, 0, O_NOCACHE},
        {"no-exact", no_argument, 0, O_NOEXACT},     {"no-repack", no_argument, 0, O_NOREPACK},
        {"api-key", required_argument, 0, O_KEY},      {"max-queue", required_argument, 0, O_QUEUE},
        {"api-key-file", required_argument, 0, O_KEYFILE}, {"tenant-by", required_argument, 0, O_TENANT_BY},
        {"share-system-prompt", no_argument, 0, O_SHARE_SYS},
        {"max-body-bytes", required_argument, 0, O_BODY}, {"max-tokens", required_argument, 0, O_MAXTOK},
        {"alias", required_argument, 0, O_ALIAS},      {"timeout", required_argument, 0, O_TIMEOUT},
        {"shutdown-timeout", required_argument, 0, O_SHUTDOWN}, {"flash-attn", optional_argument, 0, O_FA},
        {"config", required_argument, 0, O_CONFIG},    {"log", required_argument, 0, O_LOG},
        {"imc", no_argument, 0, O_IMC},                {"spc", no_argument, 0, O_SPC},
        {"cache-dir", required_argument, 0, O_CACHEDIR}, {"cache-ram", required_argument, 0, O_CACHERAM},
        {"cache-redis", required_argument, 0, O_CACHEREDIS}, {"warm-slots", required_argument, 0, O_WARM},
        {"cache-redis-tls-ca", required_argument, 0, O_TLS_CA},
        {"cache-redis-tls-ca-dir", required_argument, 0, O_TLS_CA_DIR},
        {"cache-redis-tls-cert", required_argument, 0, O_TLS_CERT},
        {"cache-redis-tls-key", required_argument, 0, O_TLS_KEY},
        {"cache-redis-tls-server-name", required_argument, 0, O_TLS_NAME},
        {"cache-redis-tls-insecure", no_argument, 0, O_TLS_INSECURE},
        {"cache-secret-file", required_argument, 0, O_SECRET},
        {"chat-template", required_argument, 0, O_TEMPLATE}, {"reasoning-format", required_argument, 0, O_REASONING},
        {"cors-origin", required_argument, 0, O_CORS},
        {"responses-ttl", required_argument, 0, O_RESP_TTL}, {"responses-max", required_argument, 0, O_RESP_MAX},
        {"header-timeout", required_argument, 0, O_HDR_TIMEOUT}, {"max-connections", required_argument, 0, O_MAXCONN},
        {"max-connections-per-client", required_argument, 0, O_MAXCONN_CLIENT},
        {"ctx-checkpoints", required_argument, 0, O_CKPT}, {"swa-checkpoints", required_argument, 0, O_CKPT},
        {"checkpoint-every", required_argument, 0, O_CKPT_EVERY},
        {"checkpoint-bytes", required_argument, 0, O_CKPT_BYTES},
        KS_CLI_OFFLOAD_OPTS(O_OFFLOAD),
        {"help", no_argument, 0, 'h'},                 {0, 0, 0, 0}};
    memset(f, 0, sizeof *f);
    ks_offload_defaults(&f->offload);
    ks_cli_offload_aliases(argc, argv);
    f->port = f->slots = f->ctx = f->batch = f->threads = f->max_queue = f->max_tokens = f->timeout = -1;
    f->shutdown_ms = 10000;
    f->flash_attn = KS_FA_AUTO;
    f->max_body = -1;
    f->cache_ram = -1;
    f->warm_slots = -1;
    f->responses_ttl = f->responses_max = -1;
    f->header_timeout = f->max_conns = f->max_conns_client = -1;
    f->ctx_checkpoints = f->checkpoint_every = -1;
    f->checkpoint_bytes = -1;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': f->model = optarg; break;
        case O_HOST: f->host = optarg; break;
        /* The ranges of settings that are also YAML keys come from config.h. */
        case O_PORT:
            if (ks_cli_parse_int(CMD, "--port", optarg, KS_CONFIG_PORT_MIN, KS_CONFIG_PORT_MAX, &f->port)) return 2;
            break;
        case O_SLOTS:
            if (ks_cli_parse_int(CMD, "--slots", optarg, KS_CONFIG_SLOTS_MIN, KS_CONFIG_SLOTS_MAX, &f->slots)) return 2;
            break;
        case O_CTX:
            if (ks_cli_parse_int(CMD, "--ctx", optarg, KS_CONFIG_CTX_MIN, KS_CONFIG_CTX_MAX, &f->ctx)) return 2;
            break;
        case O_BATCH:
            if (ks_cli_parse_int(CMD, "--batch", optarg, KS_CONFIG_BATCH_MIN, KS_CONFIG_BATCH_MAX, &f->batch)) return 2;
            break;
        case O_THREADS:
            if (ks_cli_parse_int(CMD, "--threads", optarg, KS_CONFIG_THREADS_MIN, KS_CONFIG_THREADS_MAX, &f->threads))
                return 2;
            break;
        case O_NOCACHE: f->no_cache = true; break;
        case O_NOEXACT: f->no_exact = true; break;
        case O_NOREPACK: f->no_repack = true; break;
        case O_KEY:
            if (f->n_keys == KS_CONFIG_KEYS_MAX + 1) {
                fprintf(stderr, CMD ": --api-key: at most %d (use --api-key-file for more)\n", KS_CONFIG_KEYS_MAX + 1);
                return 2;
            }
            f->keys[f->n_keys++] = f->api_key = optarg;
            break;
        case O_KEYFILE: f->key_file = optarg; break;
        case O_TENANT_BY: {
            unsigned bits;
            if (ks_server_tenant_by_parse(optarg, &bits)) {
                fprintf(stderr, CMD ": --tenant-by: a comma-separated list of prompt_cache_key, cache_salt, user\n");
                return 2;
            }
            f->tenant_by = optarg;
            break;
        }
        case O_SHARE_SYS: f->share_sys = true; break;
        case O_QUEUE:
            if (ks_cli_parse_int(CMD, "--max-queue", optarg, KS_CONFIG_MAX_QUEUE_MIN, KS_CONFIG_MAX_QUEUE_MAX,
                                 &f->max_queue))
                return 2;
            break;
        case O_BODY:
            if (ks_cli_parse_ll(CMD, "--max-body-bytes", optarg, KS_CONFIG_MAX_BODY_MIN, KS_CONFIG_MAX_BODY_MAX,
                                &f->max_body))
                return 2;
            break;
        case O_MAXTOK: if (ks_cli_parse_int(CMD, "--max-tokens", optarg, 1, 1 << 24, &f->max_tokens)) return 2; break;
        case O_ALIAS: f->alias = optarg; break;
        case O_TIMEOUT: if (ks_cli_parse_int(CMD, "--timeout", optarg, 0, 86400, &f->timeout)) return 2; break;
        case O_SHUTDOWN: if (ks_cli_parse_int(CMD, "--shutdown-timeout", optarg, 0, 3600000, &f->shutdown_ms)) return 2; break;
        case O_HDR_TIMEOUT: if (ks_cli_parse_int(CMD, "--header-timeout", optarg, 1, 3600, &f->header_timeout)) return 2; break;
        case O_MAXCONN:
            if (ks_cli_parse_int(CMD, "--max-connections", optarg, 1, KS_SERVER_CONN_MAX, &f->max_conns)) return 2;
            break;
        case O_MAXCONN_CLIENT:
            if (ks_cli_parse_int(CMD, "--max-connections-per-client", optarg, 0, KS_SERVER_CONN_MAX,
                                 &f->max_conns_client))
                return 2;
            break;
        case O_FA:
            if (ks_cli_parse_flash_attn(CMD, optarg, argc, argv, &optind, &f->flash_attn)) return 2;
            break;
        case O_IMC: f->imc = true; break;
        case O_SPC: f->spc = true; break;
        case O_CACHEDIR: f->cache_dir = optarg; break;
        case O_CACHEREDIS: {
            ks_redis_url u;
            char why[256];
            if (strlen(optarg) >= KS_REDIS_URL_MAX || ks_redis_url_parse(optarg, &u, why, sizeof why) != 0) {
                fprintf(stderr, CMD ": --cache-redis: %s\n", strlen(optarg) >= KS_REDIS_URL_MAX ? "too long" : why);
                return 2;
            }
            memset(&u, 0, sizeof u);
            f->cache_redis = optarg;
            break;
        }
        /* Checked with the URL once every setting is known (check_redis). */
        case O_TLS_CA: f->tls_ca = optarg; break;
        case O_TLS_CA_DIR: f->tls_ca_dir = optarg; break;
        case O_TLS_CERT: f->tls_cert = optarg; break;
        case O_TLS_KEY: f->tls_key = optarg; break;
        case O_TLS_NAME: f->tls_name = optarg; break;
        case O_TLS_INSECURE: f->tls_insecure = true; break;
        case O_SECRET: f->secret_file = optarg; break;
        case O_CACHERAM: /* MiB: the range of store.tiers.ram.max_bytes */
            if (ks_cli_parse_int(CMD, "--cache-ram", optarg, 0, (int)(KS_STORE_BYTES_MAX >> 20), &f->cache_ram))
                return 2;
            break;
        case O_WARM: /* "all": every slot */
            if (!strcmp(optarg, "all")) f->warm_slots = KS_MAX_SLOTS;
            else if (ks_cli_parse_int(CMD, "--warm-slots", optarg, 0, KS_MAX_SLOTS, &f->warm_slots)) return 2;
            break;
        case O_CONFIG: f->config = optarg; break;
        case O_TEMPLATE: f->chat_template = optarg; break;
        case O_CORS: {
            char why[256];
            if (ks_config_check_origin(optarg, why, sizeof why)) {
                fprintf(stderr, CMD ": --cors-origin: %s\n", why);
                return 2;
            }
            if (f->n_cors == KS_CONFIG_CORS_MAX) {
                fprintf(stderr, CMD ": --cors-origin: at most %d origins\n", KS_CONFIG_CORS_MAX);
                return 2;
            }
            f->cors[f->n_cors++] = optarg;
            break;
        }
        case O_RESP_TTL:
            if (ks_cli_parse_int(CMD, "--responses-ttl", optarg, 0, 30 * 86400, &f->responses_ttl)) return 2;
            break;
        case O_RESP_MAX:
            if (ks_cli_parse_int(CMD, "--responses-max", optarg, 0, 1 << 20, &f->responses_max)) return 2;
            break;
        case O_CKPT: /* the ranges of ctx_checkpoints, checkpoint_every and checkpoint_bytes (config.h) */
            if (ks_cli_parse_int(CMD, "--ctx-checkpoints", optarg, 0, KS_CONFIG_CKPT_MAX, &f->ctx_checkpoints))
                return 2;
            break;
        case O_CKPT_EVERY:
            if (ks_cli_parse_int(CMD, "--checkpoint-every", optarg, 0, KS_CONFIG_CKPT_EVERY_MAX, &f->checkpoint_every))
                return 2;
            break;
        case O_CKPT_BYTES:
        {
            int64_t v;
            if (ks_cli_parse_size(CMD, "--checkpoint-bytes", optarg, &v)) return 2;
            if (v > KS_STORE_BYTES_MAX) {
                fprintf(stderr, CMD ": --checkpoint-bytes must be at most 1 PiB, got '%s'\n", optarg);
                return 2;
            }
            f->checkpoint_bytes = v;
            break;
        }
        case O_REASONING:
            if (strcmp(optarg, "deepseek") && strcmp(optarg, "deepseek-legacy") && strcmp(optarg, "auto") &&
                strcmp(optarg, "none")) {
                fprintf(stderr, CMD ": --reasoning-format: '%s' is not one of deepseek, deepseek-legacy, auto, none\n",
                        optarg);
                return 2;
            }
            f->reasoning_format = optarg;
            break;
        case O_LOG: {
            int lv;
            if (ks_cli_parse_log(CMD, optarg, &lv)) return 2;
            f->log = optarg;
            break;
        }
        case 'h': usage(stdout); return -1; /* --help: the caller exits 0 */

        case ':':
            fprintf(stderr, CMD ": option '%s' needs a value\n", argv[optind - 1]);
            return 2;
        default:
            if (c >= O_OFFLOAD && c < O_OFFLOAD_END) {
                if (ks_cli_offload_flag(CMD, c - O_OFFLOAD, optarg, &f->offload, &f->offload_given)) return 2;
                break;
            }
            fprintf(stderr, CMD ": unknown option '%s'\n\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, CMD ": unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    int max_conns = f->max_conns >= 0 ? f->max_conns : ks_server_params_default().max_connections;
    if (f->max_conns_client > max_conns) {
        fprintf(stderr, CMD ": --max-connections-per-client %d is more than --max-connections %d\n",
                f->max_conns_client, max_conns);
        return 2;
    }
    return 0;
}

#define COPY(dst, src)                                                                      \
    do {                                                                                    \
        if (strlen(src) >= sizeof(dst)) {                                                   \
            fprintf(stderr, CMD ": value too long: '%.40s...'\n", src);                     \
            return 2;                                                                       \
        }                                                                                   \
        snprintf(dst, sizeof(dst), "%s", src);                                              \
    } while (0)

static int apply_flags(const flags *f, ks_config *c) {
    if (f->model) COPY(c->model, f->model);
    if (f->host) COPY(c->host, f->host);
    if (f->api_key) {
        COPY(c->api_key, f->keys[0]);
        memset(c->api_keys, 0, sizeof c->api_keys);
        for (int i = 1; i < f->n_keys; i++) COPY(c->api_keys[i - 1], f->keys[i]);
        c->n_api_keys = f->n_keys - 1;
    }
    else if (!c->api_key[0] && getenv("KVSTASH_API_KEY")) COPY(c->api_key, getenv("KVSTASH_API_KEY"));
    if (f->key_file) COPY(c->api_key_file, f->key_file);
    if (f->tenant_by) COPY(c->tenant_by, f->tenant_by);
    if (f->share_sys) c->share_system_prompt = true;
    if (f->log) COPY(c->log, f->log);
    if (f->port >= 0) c->port = f->port;
    if (f->slots >= 0) c->slots = f->slots;
    if (f->ctx >= 0) c->ctx = f->ctx;
    if (f->batch >= 0) c->batch = f->batch;
    if (f->threads >= 0) c->threads = f->threads;
    if (f->max_queue >= 0) c->max_queue = f->max_queue;
    if (f->max_body >= 0) c->max_body_bytes = f->max_body;
    if (f->no_cache) c->cache_prompt = false;
    if (f->no_exact) c->exact = false;
    ks_cli_offload_apply(&f->offload, f->offload_given, &c->offload);
    if (f->no_repack) c->repack = false;
    if (f->ctx_checkpoints >= 0) c->ctx_checkpoints = f->ctx_checkpoints;
    if (f->checkpoint_every >= 0) c->checkpoint_every = f->checkpoint_every;
    if (f->checkpoint_bytes >= 0) c->checkpoint_bytes = f->checkpoint_bytes;
    if (f->cache_dir) {
        COPY(c->store.cache_dir, f->cache_dir);
        c->store.enabled = true;
    }
    if (f->cache_ram >= 0) c->store.tier_max_bytes[KS_TIER_RAM] = (int64_t)f->cache_ram << 20;
    if (f->warm_slots >= 0) c->store.warm_slots = f->warm_slots;
    if (f->cache_redis) COPY(c->store.redis.url, f->cache_redis);
    if (f->tls_ca) COPY(c->store.redis.tls.ca_file, f->tls_ca);
    if (f->tls_ca_dir) COPY(c->store.redis.tls.ca_dir, f->tls_ca_dir);
    if (f->tls_cert) COPY(c->store.redis.tls.cert_file, f->tls_cert);
    if (f->tls_key) COPY(c->store.redis.tls.key_file, f->tls_key);
    if (f->tls_name) COPY(c->store.redis.tls.server_name, f->tls_name);
    if (f->tls_insecure) c->store.redis.tls.verify = false;
    if (f->secret_file) COPY(c->store.secret_file, f->secret_file);
    /* A password kept out of the URL (and so out of ps and shell histories). */
    const char *pw = getenv("KVSTASH_REDIS_PASSWORD");
    if (pw && strlen(pw) < sizeof c->store.redis.password) COPY(c->store.redis.password, pw);
    /* The flags' origins replace the file's (parse_flags checked them). */
    if (f->n_cors) {
        memset(c->cors_origins, 0, sizeof c->cors_origins);
        for (int i = 0; i < f->n_cors; i++) COPY(c->cors_origins[i], f->cors[i]);
        c->n_cors_origins = f->n_cors;
    }
    return 0;
}



static int open_engine(const ks_config *c, int flash_attn, ks_engine **e) {
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = c->model;
    ep.n_seq = c->slots;
    ep.n_ctx_seq = c->ctx;
    ep.n_batch = c->batch;
    ep.n_threads = c->threads;
    ep.flash_attn = flash_attn;
    ep.exact = c->exact;
    ep.offload = c->offload;
    ep.repack = c->repack;
    char err[1024] = "";
    int rc = ks_engine_open(&ep, e, err, sizeof err);
    if (rc) fprintf(stderr, CMD ": %s\n", err[0] ? err : ks_strerror(rc));
    if (!rc) {
        /* What the open-time probe found, so that a model's exactness (a
         * mixture of experts' above all: issue 31) is stated, not assumed. */
        int n_used = 0, n_exp = ks_engine_n_expert(*e, &n_used);
        char moe[64] = "";
        if (n_exp > 0) snprintf(moe, sizeof moe, ", %d experts (%d per token)", n_exp, n_used);
        bool inv = ks_engine_batch_invariant(*e), pairs = ks_engine_pairs_exact(*e);
        const char *why = ks_engine_exact_reason(*e, c->exact);
        KS_INFO("serve", "model %s (%s%s), weight repacking %s; probe: a token decoded alone %s its bits in a "
                "batch%s -> exact mode %s%s%s%s", ks_engine_model_name(*e), ks_engine_model_desc(*e), moe,
                ks_engine_repacked(*e) ? "on" : "off", inv ? "keeps" : "does not keep",
                inv ? "" : pairs ? ", decoded in pairs it does" : "", ks_engine_exact_mode(*e, c->exact),
                why ? " (" : "", why ? why : "", why ? ")" : "");
        /* A silently smaller context turns a client's long prompt into a
         * refusal it cannot explain: say so at the default level. */
        if (c->ctx > ks_engine_n_ctx_seq(*e))
            KS_WARN("serve", "--ctx %d is more than this model takes: each slot gets %d tokens (the model's "
                             "trained context)", c->ctx, ks_engine_n_ctx_seq(*e));
    }
    return rc;
}

/* The API keys and tenant settings, checked before the model loads: a key
 * file that cannot be read or has a bad line, a bad key or tenant_by is a
 * usage error (exit 2). The server reads them again at start. */
static int check_keys(const ks_config *c) {
    unsigned bits;
    if (ks_server_tenant_by_parse(c->tenant_by, &bits)) {
        fprintf(stderr, CMD ": tenant_by '%s': a comma-separated list of prompt_cache_key, cache_salt, user\n",
                c->tenant_by);
        return 2;
    }
    const char *keys[1 + KS_CONFIG_KEYS_MAX];
    int n = 0;
    keys[n++] = c->api_key;
    for (int i = 0; i < c->n_api_keys; i++) keys[n++] = c->api_keys[i];
    ks_keyring *k = NULL;
    char err[512] = "";
    int rc = ks_keyring_create(keys, n, c->api_key_file, &k, err, sizeof err);
    ks_keyring_free(k);
    if (rc) {
        fprintf(stderr, CMD ": %s\n", err[0] ? err : ks_strerror(rc));
        return 2;
    }
    return 0;
}

static const char *signame(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal"; }

int ks_cmd_serve(int argc, char **argv) {
    flags f;
    int rc = parse_flags(argc, argv, &f);
    if (rc == -1) return 0; /* --help */
    if (rc) return rc;

    ks_config cfg;
    ks_config_defaults(&cfg);
    if (f.config) {
        char err[512] = "";
        rc = ks_config_load_file(&cfg, f.config, err, sizeof err);
        if (rc) {
            fprintf(stderr, CMD ": %s\n", err[0] ? err : ks_strerror(rc));
            return 2;
        }
    }
    if ((rc = apply_flags(&f, &cfg))) return rc;
    ks_serve_secret secret;
    if ((rc = ks_serve_store_check(&cfg, &secret))) return rc;
    if ((rc = check_keys(&cfg))) return rc;
    int lv = ks_log_parse_level(cfg.log);
    ks_log_set_level(lv < 0 ? KS_LOG_INFO : (ks_log_level)lv);
    if (!cfg.model[0]) {
        fprintf(stderr, CMD ": no model: give -m MODEL (or model: in --config)\n\n");
        usage(stderr);
        return 2;
    }
    /* A models.<name> entry may set slots; the --slots flag still wins. The
     * entry is matched by file name first (the engine, which knows
     * general.name, is sized by the slot count), then again below. */
    int top_slots = cfg.slots; /* before any models entry touches it */
    ks_config_resolve_model(&cfg, NULL, cfg.model);
    if (f.slots >= 0) cfg.slots = f.slots;

    /* Block the shutdown signals before any thread exists, so every thread
     * inherits the mask and only sigwait below sees them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    /* With a key file, SIGHUP reads it again (and no longer stops the server). */
    if (cfg.api_key_file[0]) sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    ks_engine *e = NULL;
    ks_sched *sched = NULL;
    ks_server *srv = NULL;
    char *tmpl_text = NULL; /* --chat-template */
    ks_spc *spc = NULL;
    ks_store *store = NULL;
    ks_metrics *metrics = NULL;
    int exit_code = 1;
    /* A setting the engine refuses (a device, the layers, the split) is a
     * usage error, found before anything is served: exit 2. */
    if ((rc = open_engine(&cfg, f.flash_attn, &e))) {
        if (rc == KS_EINVAL) exit_code = 2;
        goto done;
    }
    {
        ks_config by_name = cfg;
        /* Resolve from the top-level slots again: the file-name entry applied
         * above must not leak its slots into an entry matched by name. */
        by_name.slots = top_slots;
        ks_config_resolve_model(&by_name, ks_engine_model_name(e), cfg.model);
        cfg.cache = by_name.cache;
        if (f.slots < 0 && by_name.slots != cfg.slots) {
            KS_INFO("serve", "models entry for '%s' sets %d slots: reopening", ks_engine_model_name(e),
                    by_name.slots);
            ks_engine_free(e);
            e = NULL;
            cfg.slots = by_name.slots;
            if ((rc = open_engine(&cfg, f.flash_attn, &e))) {
                if (rc == KS_EINVAL) exit_code = 2;
                goto done;
            }
        }
    }

    if (f.imc) cfg.cache.incremental_cache = true;
    if (f.spc) cfg.cache.system_prompt_cache = true;

    metrics = ks_metrics_create();
    if (!metrics) {
        fprintf(stderr, CMD ": out of memory\n");
        goto done;
    }
    if (cfg.cache.system_prompt_cache) {
        if ((rc = ks_spc_create(cfg.cache.spc_max_bytes, &spc)) ||
            (rc = ks_metrics_add(metrics, ks_metrics_spc, spc))) {
            fprintf(stderr, CMD ": cannot create the system prompt cache: %s\n", ks_strerror(rc));
            goto done;
        }
    }
    ks_store_cfg store_cfg;
    ks_store_mode store_mode = ks_config_store_plan(&cfg, &store_cfg);
    if (store_mode != KS_STORE_OFF) {
        if (ks_serve_store_open(&cfg, &store_cfg, &secret, e, &store)) goto done;
        if ((rc = ks_metrics_add(metrics, ks_metrics_store, store))) goto done;
    }
    ks_serve_store_report(&cfg, &store_cfg, store, &secret);
    memset(&secret, 0, sizeof secret); /* the store keeps its copy */

    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = cfg.slots;
    sp.max_queue = cfg.max_queue;
    sp.cache_prompt = cfg.cache_prompt;
    sp.exact = cfg.exact;
    sp.affinity_min = cfg.affinity_min;
    sp.imc = cfg.cache.incremental_cache;
    sp.cache_min_tokens = cfg.cache.cache_min_tokens;
    sp.spc = spc;
    sp.store = store;
    sp.store_stride = store_cfg.stride;
    sp.continued_interval = store_cfg.continued_interval;
    sp.store_min_tokens = store_cfg.min_tokens;
    sp.warm_slots = store_cfg.warm_slots;
    sp.finish_save_after_done = true;
    if (sp.warm_slots > 0 && (!store || store_mode == KS_STORE_RAM_ONLY))
        KS_WARN("serve", "--warm-slots (store.warm_slots) needs the persistent store (--cache-dir or a store: "
                         "section): no slot is warmed");
    if (!store || store_mode == KS_STORE_RAM_ONLY) sp.warm_slots = 0;
    sp.ckpt_max = cfg.ctx_checkpoints;
    sp.ckpt_bytes = (size_t)cfg.checkpoint_bytes;
    sp.ckpt_gen_interval = cfg.checkpoint_every;
    sp.share_system_prompt = cfg.share_system_prompt;
    rc = ks_sched_create(&sp, &sched);
    if (rc) {
        fprintf(stderr, CMD ": cannot start the scheduler: %s\n", ks_strerror(rc));
        goto done;
    }

    ks_server_params hp = ks_server_params_default();
    hp.engine = e;
    hp.sched = sched;
    hp.host = cfg.host;
    hp.port = cfg.port;
    hp.api_key = cfg.api_key;
    const char *extra_keys[KS_CONFIG_KEYS_MAX];
    for (int i = 0; i < cfg.n_api_keys; i++) extra_keys[i] = cfg.api_keys[i];
    hp.api_keys = extra_keys;
    hp.n_api_keys = cfg.n_api_keys;
    hp.api_key_file = cfg.api_key_file;
    if (ks_server_tenant_by_parse(cfg.tenant_by, &hp.tenant_by)) {
        fprintf(stderr, CMD ": tenant_by: a comma-separated list of prompt_cache_key, cache_salt, user\n");
        exit_code = 2;
        goto done;
    }
    hp.model_name = f.alias;
    hp.max_body_bytes = cfg.max_body_bytes;
    if (f.max_tokens > 0) hp.default_max_tokens = f.max_tokens;
    if (f.timeout >= 0) hp.timeout_s = f.timeout;
    if (f.header_timeout >= 0) hp.header_timeout_s = f.header_timeout;
    if (f.max_conns >= 0) hp.max_connections = f.max_conns;
    hp.max_renders = cfg.max_renders;
    if (f.max_conns_client >= 0) hp.max_connections_per_client = f.max_conns_client;
    hp.cache_prompt = cfg.cache_prompt;
    hp.exact = cfg.exact;
    hp.store_mode = !store ? "off" : store_mode == KS_STORE_RAM_ONLY ? "ram-only" : "full";
    hp.metrics = metrics;
    const char *cors[KS_CONFIG_CORS_MAX];
    bool cors_any = false;
    for (int i = 0; i < cfg.n_cors_origins; i++) {
        cors[i] = cfg.cors_origins[i];
        cors_any |= !strcmp(cors[i], "*");
    }
    hp.cors_origins = cors;
    hp.n_cors_origins = cfg.n_cors_origins;
    /* The SPC key must change with whatever changes a system prompt's KV. */
    char model_id[KS_MAX_PATH + 1024], kv[1024];
    ks_engine_kv_params(e, kv, sizeof kv);
    snprintf(model_id, sizeof model_id, "%s|%s", ks_engine_model_path(e), kv);
    hp.model_id = model_id;
    hp.reasoning_format = f.reasoning_format;
    if (f.responses_ttl >= 0) hp.responses_ttl_s = f.responses_ttl;
    if (f.responses_max >= 0) hp.responses_max = f.responses_max;
    if (f.chat_template) {
        if (ks_cli_read_template(CMD, f.chat_template, &tmpl_text)) {
            rc = KS_EINVAL;
            goto done;
        }
        hp.chat_template = tmpl_text;
    }
    char err[512] = "";
    rc = ks_server_start(&hp, &srv, err, sizeof err);
    if (rc) {
        fprintf(stderr, CMD ": %s\n", err[0] ? err : ks_strerror(rc));
        goto done;
    }
    bool v6 = strchr(cfg.host, ':') != NULL;
    char where[512], why[320] = "";
    ks_engine_offload_desc(e, where, sizeof where);
    const char *reason = ks_engine_exact_reason(e, cfg.exact);
    if (reason) snprintf(why, sizeof why, " (%s)", reason);
    fprintf(stderr, "kvstash: listening on http://%s%s%s:%d (model %s, %d slots, ctx %d, %s, exact: %s%s)\n",
            v6 ? "[" : "", cfg.host, v6 ? "]" : "", ks_server_port(srv), f.alias ? f.alias : ks_engine_model_name(e),
            cfg.slots, ks_engine_n_ctx_seq(e), where, ks_engine_exact_mode(e, cfg.exact), why);
    fprintf(stderr, "kvstash: port=%d\n", ks_server_port(srv));
    char store_desc[KS_MAX_PATH + 256];
    ks_serve_store_desc(&store_cfg, store, store_mode, store_desc, sizeof store_desc);
    KS_INFO("serve", "cache: prompt %s, imc %s, spc %s, store %s", cfg.cache_prompt ? "on" : "off",
            sp.imc ? "on" : "off", spc ? "on" : "off", store_desc);
    if (ks_engine_offload_info(e)->n_devices > 0 && reason)
        KS_WARN("serve", "exact output is unavailable on %s: a cached reply may differ from an uncached one in "
                         "the last bits (-ngl 0 keeps the model on the CPU, where it is exact)", where);
    bool keyed = cfg.api_key[0] || cfg.n_api_keys || cfg.api_key_file[0];
    if (!keyed && strcmp(cfg.host, "127.0.0.1") && strcmp(cfg.host, "localhost") &&
        strcmp(cfg.host, "::1"))
        KS_WARN("serve", "listening on %s without --api-key: anyone who can reach it can use it", cfg.host);
    if (cfg.n_cors_origins) {
        char list[1024] = "";
        for (int i = 0, n = 0; i < cfg.n_cors_origins && n >= 0 && (size_t)n < sizeof list; i++)
            n += snprintf(list + n, sizeof list - (size_t)n, "%s%s", i ? " " : "", cfg.cors_origins[i]);
        KS_INFO("serve", "cors: browser pages from %s may call this server", list);
        if (cors_any && !keyed)
            KS_WARN("serve", "--cors-origin '*' without --api-key: any web page opened in a browser that can reach "
                             "this server can use it");
    }

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0 || sig == SIGHUP) {
        if (sig == SIGHUP) {
            KS_INFO("serve", "SIGHUP: reading the API key file again");
            ks_server_reload_keys(srv);
            sig = 0;
        }
    }
    KS_INFO("serve", "%s: stopping; waiting up to %d ms for %d running request(s)", signame(sig), f.shutdown_ms,
            ks_server_n_active(srv));
    ks_server_quiesce(srv);
    double deadline = ks_now_ms() + (double)f.shutdown_ms;
    while (ks_server_n_active(srv) > 0 && ks_now_ms() < deadline) {
        /* Sleep 50 ms, or less when a second signal comes: then cancel now. */
        struct timespec ts = {0, 50 * 1000000L};
        int s2 = sigtimedwait(&sigs, NULL, &ts);
        if (s2 == SIGHUP) ks_server_reload_keys(srv);
        else if (s2 > 0) {
            KS_WARN("serve", "%s again: canceling the running requests", signame(s2));
            break;
        }
    }
    if (ks_server_n_active(srv) > 0) KS_WARN("serve", "canceling %d request(s)", ks_server_n_active(srv));
    exit_code = 0;
done:
    /* Order matters (server.h note 6): no server thread may call the
     * scheduler once it is freed; the daemon stops after every on_done ran. */
    if (srv) ks_server_detach_sched(srv);
    ks_sched_free(sched); /* shutdown saves go to the store here */
    ks_server_free(srv);
    ks_metrics_free(metrics);
    ks_store_close(store); /* writes what is queued (store.shutdown_timeout_ms) */
    ks_spc_free(spc);
    ks_engine_free(e);
    free(tmpl_text);
    if (exit_code == 0) KS_INFO("serve", "stopped");
    return exit_code;
}

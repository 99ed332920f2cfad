/*
 * serve_flags.c — see serve_flags.h.
 */
#include "cli/serve_flags.h"

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/redis_fmt.h"
#include "cache/store.h"
#include "cli/cli.h"
#include "sched/sched.h"
#include "server/server.h"

#define CMD "kvstash serve"

void ks_serve_usage(FILE *f) {
    fprintf(f,
            "usage: kvstash serve -m MODEL [options]\n"
            "  -m, --model PATH          GGUF model file (required here or as model: in --config)\n"
            "  --mmproj FILE             multimodal projector (mmproj GGUF) for images and audio in\n"
            "                            prompts (mmproj, models.<name>.mmproj; default: none)\n"            "  --host ADDR               address to bind (default 127.0.0.1)\n"
            "  --port N                  TCP port; 0 picks a free one (default 8080)\n"
            "  --slots N                 parallel sequences, 1..256 (default 4; -np, --parallel)\n"
            "  --ctx N                   context per slot, tokens, 64..16777216 (default 4096)\n"
            "  -c, --ctx-size N          llama-server's: the slots' context together, each slot\n"
            "                            N / slots (--ctx wins)\n"
            "  --batch N                 tokens per decode step, 1..1048576 (default 512; -b)\n"
            "  --threads N               CPU threads, 0..4096; 0 = all (default 0; -t)\n"
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
            "  --metrics-key KEY         the key of /metrics (metrics_key); with several API keys the\n"
            "                            only one: their counters are every tenant's\n"
            "  --responses-ttl S         keep Responses API conversations for previous_response_id this\n"
            "                            long, seconds (default 3600; 0: keep none)\n"
            "  --responses-max N         ... and at most this many, oldest forgotten first (default 1024)\n"
            "  --cors-origin ORIGIN      let browser pages from ORIGIN (e.g. http://localhost:5173) call\n"
            "                            the server (CORS); repeatable, up to 16; * allows any origin\n"
            "                            (cors_origins; default: none, CORS off)\n"
            "  --max-queue N             requests waiting for a slot, 1..1000000; beyond: 503 (default 64)\n"
            "  --max-body-bytes N        largest request body, 1024..2^40; beyond: 413 (default 16777216)\n"
            "  --media-max-bytes N       largest image or audio clip, decoded, 1024..2^30 (media.max_bytes;\n"
            "                            default 10485760); --media-max-total-bytes N: all of a request's\n"
            "                            (default 33554432); --media-max-items N: items per request,\n"
            "                            1..1024 (default 32); --media-max-pixels N: width x height of an\n"
            "                            image (default 16777216). Beyond any: 400\n"
            "  --media-path DIR          serve file:// image URLs from below DIR (relative paths only;\n"
            "                            media.path; default: file:// URLs refused)\n"
            "  --media-fetch-hosts LIST  fetch http(s):// image URLs from these hosts, comma-separated,\n"
            "                            * for any (media.fetch_hosts; default: none, remote URLs refused);\n"
            "                            --media-fetch-timeout-ms N: per fetch, 100..600000 (default 10000)\n"
            "  --max-tokens N            max_tokens of requests that give none (default -1: until an\n"
            "                            end of generation or the context's end, as llama-server;\n"
            "                            always capped by the context left after the prompt)\n"
            "  --alias NAME              model id in /v1/models and responses (default: the model's name)\n"
            "Several models (models: entries with a path, docs/SERVER.md \"Several models\"):\n"
            "  --models-dir DIR          serve every X.gguf of DIR as model X (a subdirectory X: its GGUF,\n"
            "                            with an mmproj*.gguf beside it as projector) (models_dir)\n"
            "  --models-max N            models loaded at once, 0..64; 0: no limit (default 4);\n"
            "                            the least recently used idle one is unloaded for another\n"
            "  --models-memory MIB       the loaded models' weights + KV at most, estimated from each\n"
            "                            GGUF; 0: no limit (default: 90%% of the machine's memory)\n"
            "  --sleep-idle-seconds N    unload a model unused this long, keeping its conversations in\n"
            "                            the store (default 0: never; per model: keep_alive)\n"
            "  --no-models-autoload      a request does not load its model (POST /models/load does)\n"
            "  --default-model NAME      the model of requests naming none or an unknown one\n"
            "  --chat-template FILE      Jinja chat template to use instead of the GGUF's\n"
            "  --reasoning-format F      where a reasoning model's thinking goes: deepseek (default:\n"
            "                            reasoning_content), deepseek-legacy, auto or none (in content)\n"
            "  --spm-infill              /infill puts the suffix before the prefix (suffix-prefix-\n"
            "                            middle: models trained so; default prefix-suffix-middle)\n"
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
            "  -ctk, --cache-type-k T    the KV cache's K type: f16 (default), f32, bf16, q8_0, q4_0,\n"
            "  -ctv, --cache-type-v T    q4_1, iq4_nl, q5_0, q5_1 (cache_type_k, cache_type_v); a\n"
            "                            quantized V needs flash attention; exact only over F16/F32\n"
            "  --ctx-checkpoints N       hybrid and recurrent models: state checkpoints kept per slot,\n"
            "                            0..32, so a turn that diverges inside the slot goes back to one\n"
            "                            instead of prefilling everything; 0: none (default 8;\n"
            "                            --swa-checkpoints is the same flag, as in llama-server)\n"
            "  --checkpoint-every N      ... one every N generated tokens; 0: none while generating\n"
            "                            (default 16)\n"
            "  --checkpoint-bytes SIZE   ... within SIZE per slot, e.g. 64M (default 32M)\n"
            "  --config FILE             YAML settings (see docs/SERVER.md); flags override it\n"
            "  --log LEVEL               debug|info|warn|error|off (default info)\n"
            "Speculative decoding (docs/SERVER.md, \"Speculative decoding\"; exact: a reply is the same\n"
            "with and without it):\n"
            "  --spec-type T             none, ngram-simple (default), ngram-map-k, ngram-map-k4v or\n"
            "                            ngram-mod: drafts from the slot's own tokens (speculative.type)\n"
            "  --spec-draft-n-max N      tokens drafted per step at most, 1..64 (--draft-max; default 16)\n"
            "  --spec-draft-n-min N      shorter drafts are not verified, 0..64 (--draft-min; default 0)\n"
            "  --spec-ngram-simple-size-n N, --spec-ngram-simple-size-m N, --spec-ngram-simple-min-hits N\n"
            "                            lookup length, draft length, hits (default 3, 8, 1); the same\n"
            "                            for ngram-map-k and ngram-map-k4v (--spec-ngram-map-k-size-n ...;\n"
            "                            default 12, 48, 1)\n"
            "  --spec-ngram-mod-n-match N, --spec-ngram-mod-n-min N, --spec-ngram-mod-n-max N\n"
            "                            ngram-mod's lookup length and draft bounds (default 24, 48, 64)\n"
            "  -md, --model-draft FILE   draft from a smaller model of the same vocabulary instead\n"
            "                            (draft-simple; speculative.draft_model)\n"
            "  -ngld, --gpu-layers-draft N|auto|all   its layers on GPUs (default: as -ngl)\n"
            "  --spec-draft-p-min P      stop a draft at a token the draft model gives less than P\n"
            "                            (0..1, default 0)\n"
            "  --no-spec-adaptive        verify every draft whole (default: only what the measured cost\n"
            "                            of a decode's rows and the slot's acceptance make worth it)\n"
            "GPUs (docs/SERVER.md, \"GPUs\"):\n"
            "%s",
            ks_cli_offload_usage);
}


/* The numeric --spec-* flags, llama-server's names and ranges (config.h
 * ks_spec_cfg), in ks_serve_flags.spec_int's order. */
static const struct {
    const char *name;
    int lo, hi;
} k_spec[KS_SERVE_SPEC_INTS] = {
    {"spec-draft-n-max", 1, KS_CONFIG_DRAFT_MAX},  {"spec-draft-n-min", 0, KS_CONFIG_DRAFT_MAX},
    {"spec-ngram-simple-size-n", 1, 1024},         {"spec-ngram-simple-size-m", 1, 1024},
    {"spec-ngram-simple-min-hits", 1, 65535},      {"spec-ngram-map-k-size-n", 1, 1024},
    {"spec-ngram-map-k-size-m", 1, 1024},          {"spec-ngram-map-k-min-hits", 1, 65535},
    {"spec-ngram-map-k4v-size-n", 1, 1024},        {"spec-ngram-map-k4v-size-m", 1, 1024},
    {"spec-ngram-map-k4v-min-hits", 1, 65535},     {"spec-ngram-mod-n-match", 1, 1024},
    {"spec-ngram-mod-n-min", 0, 1024},             {"spec-ngram-mod-n-max", 0, 1024},
};

void ks_serve_apply_spec_flags(const ks_serve_flags *f, ks_config *c) {
    ks_spec_cfg *s = &c->spec;
    int *dst[KS_SERVE_SPEC_INTS] = {&s->draft_max, &s->draft_min,
                                    &s->ngram_size_n[0], &s->ngram_size_m[0], &s->ngram_min_hits[0],
                                    &s->ngram_size_n[1], &s->ngram_size_m[1], &s->ngram_min_hits[1],
                                    &s->ngram_size_n[2], &s->ngram_size_m[2], &s->ngram_min_hits[2],
                                    &s->ngram_mod_n_match, &s->ngram_mod_n_min, &s->ngram_mod_n_max};
    if (f->spec_type) snprintf(s->type, sizeof s->type, "%s", f->spec_type); /* length checked by parse */
    if (f->no_spec_adaptive) s->adaptive = false;
    if (f->draft_model) snprintf(s->draft_model, sizeof s->draft_model, "%s", f->draft_model); /* checked by parse */
    if (f->draft_ngl) snprintf(s->draft_gpu_layers, sizeof s->draft_gpu_layers, "%s", f->draft_ngl);
    if (f->draft_p_min >= 0) s->draft_p_min = f->draft_p_min;
    for (int i = 0; i < KS_SERVE_SPEC_INTS; i++)
        if (f->spec_int[i] >= 0) *dst[i] = f->spec_int[i];
}

int ks_serve_parse_flags(int argc, char **argv, ks_serve_flags *f) {
    enum { O_HOST = 256, O_MMPROJ, O_PORT, O_SLOTS, O_CTX, O_CTX_SIZE, O_BATCH, O_THREADS, O_NOCACHE, O_NOEXACT, O_KEY, O_QUEUE, O_BODY,
           O_MAXTOK, O_ALIAS, O_TIMEOUT, O_SHUTDOWN, O_FA, O_CONFIG, O_LOG, O_IMC, O_SPC, O_CACHEDIR, O_CACHERAM,
           O_TEMPLATE, O_REASONING, O_SPM_INFILL, O_CORS, O_RESP_TTL, O_RESP_MAX, O_HDR_TIMEOUT, O_MAXCONN, O_MAXCONN_CLIENT,
           O_CKPT, O_CKPT_EVERY, O_CKPT_BYTES, O_CACHEREDIS, O_TLS_CA, O_TLS_CA_DIR, O_TLS_CERT, O_TLS_KEY,
           O_TLS_NAME, O_TLS_INSECURE, O_NOREPACK, O_WARM, O_SECRET, O_KEYFILE, O_TENANT_BY, O_SHARE_SYS, O_METRICS_KEY,
           O_MEDIA_BYTES, O_MEDIA_TOTAL, O_MEDIA_ITEMS, O_MEDIA_PIXELS, O_MEDIA_PATH, O_MEDIA_HOSTS, O_MEDIA_FTIMEOUT,
           O_CTK, O_CTV, O_SPEC_TYPE, O_SPEC_NOADAPT, O_DRAFT_MODEL, O_DRAFT_NGL, O_DRAFT_PMIN,
           O_MODELS_DIR, O_MODELS_MAX, O_MODELS_MEM, O_SLEEP_IDLE, O_AUTOLOAD, O_NO_AUTOLOAD, O_DEFAULT_MODEL, O_OFFLOAD,
           O_OFFLOAD_END = O_OFFLOAD + KS_CLI_OFFLOAD_N, O_SPEC, O_SPEC_END = O_SPEC + KS_SERVE_SPEC_INTS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},          {"host", required_argument, 0, O_HOST},
        {"mmproj", required_argument, 0, O_MMPROJ},
        {"port", required_argument, 0, O_PORT},        {"slots", required_argument, 0, O_SLOTS},
        {"ctx", required_argument, 0, O_CTX},          {"batch", required_argument, 0, O_BATCH},
        {"ctx-size", required_argument, 0, O_CTX_SIZE},
        {"threads", required_argument, 0, O_THREADS},  {"no-cache-prompt", no_argument, 0, O_NOCACHE},
        {"no-exact", no_argument, 0, O_NOEXACT},     {"no-repack", no_argument, 0, O_NOREPACK},
        {"api-key", required_argument, 0, O_KEY},      {"max-queue", required_argument, 0, O_QUEUE},
        {"api-key-file", required_argument, 0, O_KEYFILE}, {"tenant-by", required_argument, 0, O_TENANT_BY},
        {"share-system-prompt", no_argument, 0, O_SHARE_SYS}, {"metrics-key", required_argument, 0, O_METRICS_KEY},
        {"max-body-bytes", required_argument, 0, O_BODY}, {"max-tokens", required_argument, 0, O_MAXTOK},
        {"alias", required_argument, 0, O_ALIAS},      {"timeout", required_argument, 0, O_TIMEOUT},
        {"shutdown-timeout", required_argument, 0, O_SHUTDOWN}, {"flash-attn", optional_argument, 0, O_FA},
        {"config", required_argument, 0, O_CONFIG},    {"log", required_argument, 0, O_LOG},
        {"imc", no_argument, 0, O_IMC},                {"spc", no_argument, 0, O_SPC},
        {"models-dir", required_argument, 0, O_MODELS_DIR}, {"models-max", required_argument, 0, O_MODELS_MAX},
        {"models-memory", required_argument, 0, O_MODELS_MEM},
        {"sleep-idle-seconds", required_argument, 0, O_SLEEP_IDLE},
        {"models-autoload", no_argument, 0, O_AUTOLOAD}, {"no-models-autoload", no_argument, 0, O_NO_AUTOLOAD},
        {"default-model", required_argument, 0, O_DEFAULT_MODEL},
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
        {"spm-infill", no_argument, 0, O_SPM_INFILL},
        {"cors-origin", required_argument, 0, O_CORS},
        {"responses-ttl", required_argument, 0, O_RESP_TTL}, {"responses-max", required_argument, 0, O_RESP_MAX},
        {"header-timeout", required_argument, 0, O_HDR_TIMEOUT}, {"max-connections", required_argument, 0, O_MAXCONN},
        {"max-connections-per-client", required_argument, 0, O_MAXCONN_CLIENT},
        {"ctx-checkpoints", required_argument, 0, O_CKPT}, {"swa-checkpoints", required_argument, 0, O_CKPT},
        {"checkpoint-every", required_argument, 0, O_CKPT_EVERY},
        {"checkpoint-bytes", required_argument, 0, O_CKPT_BYTES},
        {"media-max-bytes", required_argument, 0, O_MEDIA_BYTES},
        {"media-max-total-bytes", required_argument, 0, O_MEDIA_TOTAL},
        {"media-max-items", required_argument, 0, O_MEDIA_ITEMS},
        {"media-max-pixels", required_argument, 0, O_MEDIA_PIXELS},
        {"media-path", required_argument, 0, O_MEDIA_PATH},
        {"media-fetch-hosts", required_argument, 0, O_MEDIA_HOSTS},
        {"media-fetch-timeout-ms", required_argument, 0, O_MEDIA_FTIMEOUT},
        {"cache-type-k", required_argument, 0, O_CTK}, {"cache-type-v", required_argument, 0, O_CTV},
        KS_CLI_OFFLOAD_OPTS(O_OFFLOAD),
        {"spec-type", required_argument, 0, O_SPEC_TYPE}, {"no-spec-adaptive", no_argument, 0, O_SPEC_NOADAPT},
        {"model-draft", required_argument, 0, O_DRAFT_MODEL}, {"spec-draft-model", required_argument, 0, O_DRAFT_MODEL},
        {"gpu-layers-draft", required_argument, 0, O_DRAFT_NGL}, {"n-gpu-layers-draft", required_argument, 0, O_DRAFT_NGL},
        {"spec-draft-ngl", required_argument, 0, O_DRAFT_NGL},
        {"spec-draft-p-min", required_argument, 0, O_DRAFT_PMIN}, {"draft-p-min", required_argument, 0, O_DRAFT_PMIN},
        {k_spec[0].name, required_argument, 0, O_SPEC + 0}, {"draft-max", required_argument, 0, O_SPEC + 0},
        {"draft-n", required_argument, 0, O_SPEC + 0},
        {k_spec[1].name, required_argument, 0, O_SPEC + 1}, {"draft-min", required_argument, 0, O_SPEC + 1},
        {k_spec[2].name, required_argument, 0, O_SPEC + 2}, {k_spec[3].name, required_argument, 0, O_SPEC + 3},
        {k_spec[4].name, required_argument, 0, O_SPEC + 4}, {k_spec[5].name, required_argument, 0, O_SPEC + 5},
        {k_spec[6].name, required_argument, 0, O_SPEC + 6}, {k_spec[7].name, required_argument, 0, O_SPEC + 7},
        {k_spec[8].name, required_argument, 0, O_SPEC + 8}, {k_spec[9].name, required_argument, 0, O_SPEC + 9},
        {k_spec[10].name, required_argument, 0, O_SPEC + 10}, {k_spec[11].name, required_argument, 0, O_SPEC + 11},
        {k_spec[12].name, required_argument, 0, O_SPEC + 12}, {k_spec[13].name, required_argument, 0, O_SPEC + 13},
        {"help", no_argument, 0, 'h'},                 {0, 0, 0, 0}};
    _Static_assert(sizeof k_spec / sizeof k_spec[0] == KS_SERVE_SPEC_INTS, "one entry per --spec-* number");
    memset(f, 0, sizeof *f);
    ks_offload_defaults(&f->offload);
    ks_cli_offload_aliases(argc, argv);
    /* llama-server's names for the same settings; -c is its --ctx-size, the
     * context of all the slots together (ks_serve_apply_flags divides it). */
    static char *const from[] = {"-t", "-np", "--parallel", "-b", "--batch-size", "-c"};
    static char *const to[] = {"--threads", "--slots", "--slots", "--batch", "--batch", "--ctx-size"};
    ks_cli_rename_flags(argc, argv, from, to, sizeof from / sizeof from[0]);
    f->ctx_size = -1;
    f->port = f->slots = f->ctx = f->batch = f->threads = f->max_queue = f->max_tokens = f->timeout = -1;
    f->shutdown_ms = 10000;
    f->flash_attn = KS_FA_AUTO;
    f->max_body = -1;
    f->media_max_bytes = f->media_max_total = f->media_max_pixels = -1;
    f->media_max_items = -1;
    f->media_fetch_timeout = -1;
    f->cache_ram = -1;
    f->warm_slots = -1;
    f->responses_ttl = f->responses_max = -1;
    f->header_timeout = f->max_conns = f->max_conns_client = -1;
    f->ctx_checkpoints = f->checkpoint_every = -1;
    f->checkpoint_bytes = -1;
    for (int i = 0; i < KS_SERVE_SPEC_INTS; i++) f->spec_int[i] = -1;
    f->draft_p_min = -1;
    f->models_max = f->sleep_idle = f->models_autoload = -1;
    f->models_memory = -2;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': f->model = optarg; break;
        case O_MMPROJ: f->mmproj = optarg; break;
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
        case O_CTX_SIZE:
            if (ks_cli_parse_int(CMD, "--ctx-size (-c)", optarg, KS_CONFIG_CTX_MIN, INT_MAX, &f->ctx_size)) return 2;
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
            /* An empty key would turn authentication off without a word. */
            if (!optarg[0]) {
                fprintf(stderr, CMD ": --api-key: empty (give a key, or no --api-key for a server without keys)\n");
                return 2;
            }
            f->keys[f->n_keys++] = f->api_key = optarg;
            break;
        case O_KEYFILE: f->key_file = optarg; break;
        case O_METRICS_KEY: f->metrics_key = optarg; break;
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
        case O_MEDIA_BYTES:
            if (ks_cli_parse_ll(CMD, "--media-max-bytes", optarg, KS_CONFIG_MEDIA_BYTES_MIN, KS_CONFIG_MEDIA_BYTES_MAX,
                                &f->media_max_bytes))
                return 2;
            break;
        case O_MEDIA_TOTAL:
            if (ks_cli_parse_ll(CMD, "--media-max-total-bytes", optarg, KS_CONFIG_MEDIA_BYTES_MIN,
                                KS_CONFIG_MEDIA_TOTAL_MAX, &f->media_max_total))
                return 2;
            break;
        case O_MEDIA_ITEMS:
            if (ks_cli_parse_int(CMD, "--media-max-items", optarg, 1, KS_CONFIG_MEDIA_ITEMS_MAX, &f->media_max_items))
                return 2;
            break;
        case O_MEDIA_PIXELS:
            if (ks_cli_parse_ll(CMD, "--media-max-pixels", optarg, 1, KS_CONFIG_MEDIA_PIXELS_MAX, &f->media_max_pixels))
                return 2;
            break;
        case O_MEDIA_PATH: f->media_path = optarg; break;
        case O_MEDIA_HOSTS: f->media_fetch_hosts = optarg; break;
        case O_MEDIA_FTIMEOUT:
            if (ks_cli_parse_int(CMD, "--media-fetch-timeout-ms", optarg, 100, 600000, &f->media_fetch_timeout))
                return 2;
            break;
        case O_MAXTOK:
            if (ks_cli_parse_int(CMD, "--max-tokens", optarg, -1, 1 << 24, &f->max_tokens)) return 2;
            if (f->max_tokens == 0) {
                fprintf(stderr, "kvstash serve: --max-tokens: expected -1 (until the end) or 1..%d, got 0\n", 1 << 24);
                return 2;
            }
            break;
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
        case O_CTK: f->cache_type_k = optarg; break;
        case O_CTV: f->cache_type_v = optarg; break;
        case O_SPEC_NOADAPT: f->no_spec_adaptive = true; break;
        case O_MODELS_DIR: f->models_dir = optarg; break;
        case O_DEFAULT_MODEL: f->default_model = optarg; break;
        case O_MODELS_MAX:
            if (ks_cli_parse_int(CMD, "--models-max", optarg, 0, KS_CONFIG_MODELS_LOADED_MAX, &f->models_max)) return 2;
            break;
        case O_MODELS_MEM: {
            int mib;
            if (ks_cli_parse_int(CMD, "--models-memory", optarg, 0, 1 << 30, &mib)) return 2;
            f->models_memory = mib;
            break;
        }
        case O_SLEEP_IDLE:
            if (ks_cli_parse_int(CMD, "--sleep-idle-seconds", optarg, 0, 100000000, &f->sleep_idle)) return 2;
            break;
        case O_AUTOLOAD: f->models_autoload = 1; break;
        case O_NO_AUTOLOAD: f->models_autoload = 0; break;
        case O_DRAFT_MODEL:
            if (strlen(optarg) >= KS_MAX_PATH) {
                fprintf(stderr, CMD ": --model-draft: path too long\n");
                return 2;
            }
            f->draft_model = optarg;
            break;
        case O_DRAFT_NGL: {
            int n;
            char why[128];
            if (strlen(optarg) >= 16 || ks_offload_parse_layers(optarg, &n, why, sizeof why)) {
                fprintf(stderr, CMD ": --gpu-layers-draft (-ngld): '%s': auto, all or a count\n", optarg);
                return 2;
            }
            f->draft_ngl = optarg;
            break;
        }
        case O_DRAFT_PMIN: {
            char *end;
            double x = strtod(optarg, &end);
            if (!*optarg || *end || !(x >= 0 && x <= 1)) {
                fprintf(stderr, CMD ": --spec-draft-p-min: expected a probability 0..1, got '%s'\n", optarg);
                return 2;
            }
            f->draft_p_min = (float)x;
            break;
        }
        case O_SPEC_TYPE:
            if (strlen(optarg) >= sizeof ((ks_spec_cfg *)0)->type) {
                fprintf(stderr, CMD ": --spec-type: '%s' is not a speculative decoding type\n", optarg);
                return 2;
            }
            f->spec_type = optarg;
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
        case O_SPM_INFILL:
            f->spm_infill = true;
            break;
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
        case 'h': ks_serve_usage(stdout); return -1; /* --help: the caller exits 0 */

        case ':':
            fprintf(stderr, CMD ": option '%s' needs a value\n", argv[optind - 1]);
            return 2;
        default:
            if (c >= O_OFFLOAD && c < O_OFFLOAD_END) {
                if (ks_cli_offload_flag(CMD, c - O_OFFLOAD, optarg, &f->offload, &f->offload_given)) return 2;
                break;
            }
            if (c >= O_SPEC && c < O_SPEC_END) {
                char flag[64];
                snprintf(flag, sizeof flag, "--%s", k_spec[c - O_SPEC].name);
                if (ks_cli_parse_int(CMD, flag, optarg, k_spec[c - O_SPEC].lo, k_spec[c - O_SPEC].hi,
                                     &f->spec_int[c - O_SPEC]))
                    return 2;
                break;
            }
            fprintf(stderr, CMD ": unknown option '%s'\n\n", argv[optind - 1]);
            ks_serve_usage(stderr);
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

int ks_serve_apply_flags(const ks_serve_flags *f, ks_config *c) {
    if (f->model) COPY(c->model, f->model);
    if (f->host) COPY(c->host, f->host);
    if (f->api_key) {
        COPY(c->api_key, f->keys[0]);
        memset(c->api_keys, 0, sizeof c->api_keys);
        for (int i = 1; i < f->n_keys; i++) COPY(c->api_keys[i - 1], f->keys[i]);
        c->n_api_keys = f->n_keys - 1;
    }
    else if (!c->api_key[0] && getenv("KVSTASH_API_KEY")) {
        if (!getenv("KVSTASH_API_KEY")[0]) {
            fprintf(stderr, CMD ": KVSTASH_API_KEY is set but empty (give a key, or unset it for a server "
                            "without keys)\n");
            return 2;
        }
        COPY(c->api_key, getenv("KVSTASH_API_KEY"));
    }
    if (f->key_file) COPY(c->api_key_file, f->key_file);
    if (f->tenant_by) COPY(c->tenant_by, f->tenant_by);
    if (f->share_sys) c->share_system_prompt = true;
    if (f->metrics_key) COPY(c->metrics_key, f->metrics_key);
    if (f->log) COPY(c->log, f->log);
    if (f->cache_type_k) COPY(c->cache_type_k, f->cache_type_k);
    if (f->cache_type_v) COPY(c->cache_type_v, f->cache_type_v);
    ks_serve_apply_spec_flags(f, c);
    if (f->port >= 0) c->port = f->port;
    if (f->models_dir) COPY(c->models_dir, f->models_dir);
    if (f->default_model) COPY(c->default_model, f->default_model);
    if (f->models_max >= 0) c->models_max = f->models_max;
    if (f->models_memory >= 0) c->models_memory = (int64_t)f->models_memory << 20;
    if (f->sleep_idle >= 0) c->sleep_idle_seconds = f->sleep_idle;
    if (f->models_autoload >= 0) c->models_autoload = f->models_autoload;
    if (f->slots >= 0) c->slots = f->slots;
    if (f->ctx >= 0) c->ctx = f->ctx;
    /* -c N as llama-server: N tokens for all the slots, each N / slots (an
     * explicit --ctx wins) */
    if (f->ctx_size >= 0 && f->ctx < 0) {
        int per = f->ctx_size / (c->slots > 0 ? c->slots : 1);
        c->ctx = per < KS_CONFIG_CTX_MIN ? KS_CONFIG_CTX_MIN : per > KS_CONFIG_CTX_MAX ? KS_CONFIG_CTX_MAX : per;
    }
    if (f->batch >= 0) c->batch = f->batch;
    if (f->threads >= 0) c->threads = f->threads;
    if (f->max_queue >= 0) c->max_queue = f->max_queue;
    if (f->max_body >= 0) c->max_body_bytes = f->max_body;
    if (f->media_max_bytes >= 0) c->media.max_bytes = f->media_max_bytes;
    if (f->media_max_total >= 0) c->media.max_total_bytes = f->media_max_total;
    if (f->media_max_items >= 0) c->media.max_items = f->media_max_items;
    if (f->media_max_pixels >= 0) c->media.max_pixels = f->media_max_pixels;
    if (f->media_path) COPY(c->media.path, f->media_path);
    if (f->media_fetch_hosts) COPY(c->media.fetch_hosts, f->media_fetch_hosts);
    if (f->media_fetch_timeout >= 0) c->media.fetch_timeout_ms = f->media_fetch_timeout;
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

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
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "config/config.h"
#include "cache/spc.h"
#include "cache/store.h"
#include "cli/cli.h"
#include "cli/serve_flags.h"
#include "cli/serve_store.h"
#include "engine/engine.h"
#include "engine/fingerprint.h"
#include "engine/media.h"
#include "sched/draft_model.h"
#include "sched/draft_ngram.h"
#include "sched/sched.h"
#include "server/keyring.h"
#include "engine/media.h"
#include "server/server.h"

#define CMD "kvstash serve"

/* --slots and the YAML slots share one range (config.h); it is the scheduler's. */
_Static_assert(KS_CONFIG_SLOTS_MAX == KS_MAX_SLOTS, "the slots range must be the scheduler's");
_Static_assert(KS_CONFIG_CKPT_MAX == KS_SCHED_CKPT_MAX, "the ctx_checkpoints range must be the scheduler's");

/* The KV cache's types by name: 0 and *k, *v (-1: the default), or 2 (a
 * usage error, said, naming the flag) for an unknown name or a quantized V
 * without flash attention. */
static int kv_types(const ks_config *c, int flash_attn, int *k, int *v) {
    *k = *v = -1;
    const char *names[2] = {c->cache_type_k, c->cache_type_v};
    const char *flags[2] = {"--cache-type-k (cache_type_k)", "--cache-type-v (cache_type_v)"};
    int *out[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        if (!names[i][0]) continue;
        if ((*out[i] = ks_engine_kv_type(names[i])) < 0) {
            fprintf(stderr, CMD ": %s: '%s' is not a KV cache type; one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, "
                            "q5_0, q5_1\n", flags[i], names[i]);
            return 2;
        }
    }
    if (ks_engine_kv_type_quantized(*v) && flash_attn == KS_FA_OFF) {
        fprintf(stderr, CMD ": --cache-type-v %s: a quantized V cache needs flash attention (--flash-attn on or "
                        "auto, not off)\n", c->cache_type_v);
        return 2;
    }
    return 0;
}

/* Speculative decoding's drafter from c->spec: *ops NULL for "none"; 2
 * (said, naming the flag and key) for an unknown type or a bad setting. */
static int spec_setup(const ks_config *c, ks_ngram_params *np, const ks_drafter_ops **ops) {
    *ops = NULL;
    const ks_spec_cfg *s = &c->spec;
    if (!strcmp(s->type, "none")) return 0;
    /* A draft model drafts instead of n-grams (llama-server's draft-simple). */
    if (s->draft_model[0]) {
        *ops = ks_draft_model_ops();
        return 0;
    }
    if (!strcmp(s->type, "draft-simple")) {
        fprintf(stderr, CMD ": --spec-type draft-simple needs a draft model (-md FILE, speculative.draft_model)\n");
        return 2;
    }
    int t = ks_ngram_type_parse(s->type);
    if (t < 0) {
        fprintf(stderr, CMD ": --spec-type (speculative.type): '%s' is not a speculative decoding type; one of none, "
                        "ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, draft-simple (with -md)\n", s->type);
        return 2;
    }
    *np = ks_ngram_params_default((ks_ngram_type)t);
    int k = t == KS_NGRAM_MAP_K ? 1 : t == KS_NGRAM_MAP_K4V ? 2 : 0;
    np->size_n = s->ngram_size_n[k];
    np->size_m = s->ngram_size_m[k];
    np->min_hits = s->ngram_min_hits[k];
    np->mod_n_match = s->ngram_mod_n_match;
    np->mod_n_min = s->ngram_mod_n_min;
    np->mod_n_max = s->ngram_mod_n_max;
    char err[160];
    if (ks_ngram_params_check(np, err, sizeof err)) {
        fprintf(stderr, CMD ": %s\n", err);
        return 2;
    }
    if (s->draft_min > s->draft_max) {
        fprintf(stderr, CMD ": --spec-draft-n-min %d is more than --spec-draft-n-max %d\n", s->draft_min,
                s->draft_max);
        return 2;
    }
    *ops = ks_ngram_ops();
    return 0;
}

/* The draft model (-md) beside the model e: the same slots and context, its
 * own GPU layers (-ngld); a vocabulary that is not e's is a usage error.
 * 0, KS_EINVAL (said: exit 2) or another error (said). */
static int open_draft(const ks_config *c, int flash_attn, ks_engine *e, ks_engine **d) {
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = c->spec.draft_model;
    ep.n_seq = c->slots;
    ep.n_ctx_seq = ks_engine_n_ctx_seq(e);
    ep.n_batch = c->batch;
    ep.n_threads = c->threads;
    ep.flash_attn = flash_attn;
    ep.exact = false; /* drafts change how fast, never what: no probe needed */
    ep.pool_of = e;   /* one pool of polling workers on the cores, not two (engine.h) */
    ep.offload = c->offload;
    ep.repack = c->repack;
    char why[128];
    if (c->spec.draft_gpu_layers[0] &&
        ks_offload_parse_layers(c->spec.draft_gpu_layers, &ep.offload.n_gpu_layers, why, sizeof why)) {
        fprintf(stderr, CMD ": speculative.draft_gpu_layers: '%s': %s\n", c->spec.draft_gpu_layers, why);
        return KS_EINVAL;
    }
    char err[1024] = "";
    int rc = ks_engine_open(&ep, d, err, sizeof err);
    if (rc) {
        fprintf(stderr, CMD ": --model-draft (speculative.draft_model): %s\n", err[0] ? err : ks_strerror(rc));
        return rc == KS_ENOENT || rc == KS_EINVAL || rc == KS_ECORRUPT ? KS_EINVAL : rc;
    }
    if ((rc = ks_draft_model_same_vocab(e, *d, err, sizeof err))) {
        fprintf(stderr, CMD ": --model-draft %s: not the model's vocabulary: %s\n", c->spec.draft_model, err);
        ks_engine_free(*d);
        *d = NULL;
        return KS_EINVAL;
    }
    KS_INFO("serve", "draft model %s (%s), %d slots", ks_engine_model_name(*d), ks_engine_model_desc(*d), c->slots);
    return 0;
}

static void draft_metrics(void *ud, ks_prom *p) {
    ks_draft_model_cfg *c = ud;
    ks_prom_counter(p, "kvstash_draft_model_prefill_tokens_total",
                    "Prompt tokens the draft model decoded (a same-slot turn: its new tokens and the last again).",
                    (double)atomic_load(&c->prefilled));
    ks_prom_counter(p, "kvstash_draft_model_follow_tokens_total",
                    "Tokens the draft model decoded to follow generation (sampled tokens, rejected positions).",
                    (double)atomic_load(&c->followed));
    ks_prom_counter(p, "kvstash_draft_model_drafted_tokens_total", "Tokens the draft model drafted.",
                    (double)atomic_load(&c->drafted));
}

static int open_engine(const ks_config *c, int flash_attn, ks_engine **e) {
    ks_engine_params ep = ks_engine_params_default();
    if (kv_types(c, flash_attn, &ep.type_k, &ep.type_v)) return KS_EINVAL;
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
    ks_serve_flags f;
    int rc = ks_serve_parse_flags(argc, argv, &f);
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
    if ((rc = ks_serve_apply_flags(&f, &cfg))) return rc;
    ks_serve_secret secret;
    if ((rc = ks_serve_store_check(&cfg, &secret))) return rc;
    if ((rc = check_keys(&cfg))) return rc;
    {
        int k, v;
        if ((rc = kv_types(&cfg, f.flash_attn, &k, &v))) return rc;
    }
    int lv = ks_log_parse_level(cfg.log);
    ks_log_set_level(lv < 0 ? KS_LOG_INFO : (ks_log_level)lv);
    if (!cfg.model[0]) {
        fprintf(stderr, CMD ": no model: give -m MODEL (or model: in --config)\n\n");
        ks_serve_usage(stderr);
        return 2;
    }
    /* A models.<name> entry may set slots; the --slots flag still wins. The
     * entry is matched by file name first (the engine, which knows
     * general.name, is sized by the slot count), then again below. */
    /* A media directory that is not one is the operator's mistake, said now
     * (before the model loads) rather than per request. */
    if (cfg.media.path[0]) {
        struct stat mst;
        if (stat(cfg.media.path, &mst) || !S_ISDIR(mst.st_mode)) {
            fprintf(stderr, CMD ": media path '%s' is not a directory\n", cfg.media.path);
            return 2;
        }
    }
    int top_slots = cfg.slots; /* before any models entry touches it */
    ks_config_resolve_model(&cfg, NULL, cfg.model);
    if (f.slots >= 0) cfg.slots = f.slots;
    ks_serve_apply_spec_flags(&f, &cfg); /* flags win over a model's speculative block */
    ks_ngram_params ngram;
    const ks_drafter_ops *drafter = NULL;
    if ((rc = spec_setup(&cfg, &ngram, &drafter))) return rc;

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

    ks_engine *e = NULL, *draft_e = NULL;
    static ks_draft_model_cfg dmc; /* the scheduler's drafters and /metrics read it until the end */
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
        cfg.spec = by_name.spec;
        ks_serve_apply_spec_flags(&f, &cfg);
        if ((rc = spec_setup(&cfg, &ngram, &drafter))) {
            exit_code = 2;
            goto done;
        }
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

    {
        /* The projector: --mmproj, else the model's entry's, else the top-level one. */
        const char *mm = f.mmproj ? f.mmproj : cfg.cache.mmproj[0] ? cfg.cache.mmproj : cfg.mmproj;
        char err[1024] = "";
        if (mm[0] && (rc = ks_engine_media_open(e, mm, err, sizeof err))) {
            fprintf(stderr, CMD ": %s\n", err[0] ? err : ks_strerror(rc));
            goto done;
        }
        if (mm[0])
            KS_INFO("serve", "projector %s: %s%s%s input", mm, ks_media_vision(ks_engine_media(e)) ? "image" : "",
                    ks_media_vision(ks_engine_media(e)) && ks_media_audio(ks_engine_media(e)) ? " and " : "",
                    ks_media_audio(ks_engine_media(e)) ? "audio" : "");
    }
    if (drafter == ks_draft_model_ops()) {
        if ((rc = open_draft(&cfg, f.flash_attn, e, &draft_e))) {
            if (rc == KS_EINVAL) exit_code = 2;
            goto done;
        }
        dmc.engine = draft_e;
        dmc.p_min = cfg.spec.draft_p_min;
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
    sp.drafter = drafter;
    sp.drafter_cfg = drafter == ks_draft_model_ops() ? (void *)&dmc : (void *)&ngram;
    if (draft_e && (rc = ks_metrics_add(metrics, draft_metrics, &dmc))) goto done;
    sp.draft_max = cfg.spec.draft_max;
    sp.draft_min = cfg.spec.draft_min;
    sp.draft_adaptive = cfg.spec.adaptive;
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
    hp.metrics_key = cfg.metrics_key;
    if (ks_server_tenant_by_parse(cfg.tenant_by, &hp.tenant_by)) {
        fprintf(stderr, CMD ": tenant_by: a comma-separated list of prompt_cache_key, cache_salt, user\n");
        exit_code = 2;
        goto done;
    }
    hp.model_name = f.alias;
    hp.max_body_bytes = cfg.max_body_bytes;
    hp.media.max_bytes = cfg.media.max_bytes;
    hp.media.max_items = cfg.media.max_items;
    hp.media.max_total_bytes = cfg.media.max_total_bytes;
    hp.media.max_pixels = cfg.media.max_pixels;
    /* Images by URL: off unless named (media_fetch.h; --media-path checked
     * before the model loaded). */
    hp.media_fetch = (ks_media_fetch_cfg){.dir = cfg.media.path, .hosts = cfg.media.fetch_hosts,
                                          .timeout_ms = cfg.media.fetch_timeout_ms,
                                          .max_redirects = cfg.media.fetch_max_redirects};
    /* What the projector (--mmproj) takes; none without one. */
    ks_media *mm = ks_engine_media(e);
    hp.media.modalities = (mm && ks_media_vision(mm) ? KS_MEDIA_IN_IMAGE : 0u) |
                          (mm && ks_media_audio(mm) ? KS_MEDIA_IN_AUDIO : 0u);
    hp.media.marker = ks_media_marker();
    if (f.max_tokens > 0) hp.default_max_tokens = f.max_tokens;
    if (f.timeout >= 0) hp.timeout_s = f.timeout;
    if (f.header_timeout >= 0) hp.header_timeout_s = f.header_timeout;
    if (f.max_conns >= 0) hp.max_connections = f.max_conns;
    hp.max_renders = cfg.max_renders;
    if (f.max_conns_client >= 0) hp.max_connections_per_client = f.max_conns_client;
    hp.cache_prompt = cfg.cache_prompt;
    hp.exact = cfg.exact;
    /* What drafts, by llama-server's type names (the log, /props). */
    const char *spec_name = !drafter ? "none" : draft_e ? "draft-simple" : cfg.spec.type;
    hp.spec_type = spec_name;
    hp.draft_max = cfg.spec.draft_max;
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
    {
        bool spec_exact;
        const char *spec_why;
        bool spec_on = ks_sched_spec_status(sched, &spec_exact, &spec_why);
        if (!drafter)
            KS_INFO("serve", "speculative decoding: off (--spec-type none)");
        else if (!spec_on)
            KS_INFO("serve", "speculative decoding: off (%s)", spec_why);
        else
            KS_INFO("serve", "speculative decoding: %s, up to %d tokens per step, %s", spec_name, cfg.spec.draft_max,
                    spec_exact ? "exact (a reply is the same without it)" : "not exact");
        if (drafter && spec_on && !spec_exact)
            KS_WARN("serve", "speculative decoding is not exact here (%s): a reply may differ from one without it "
                             "in the last bits, as a cached one may (--spec-type none turns it off)", spec_why);
    }
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
    ks_engine_free(draft_e); /* after the scheduler: its drafters decoded in it */
    ks_engine_free(e);
    free(tmpl_text);
    if (exit_code == 0) KS_INFO("serve", "stopped");
    return exit_code;
}

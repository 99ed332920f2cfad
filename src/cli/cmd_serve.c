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
 * the second after every other start-up line (cache, speculation, warnings).
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
#include "cli/serve_models.h"
#include "server/keyring.h"
#include "server/server.h"
#include <unistd.h>

#define CMD "kvstash serve"

/* --slots and the YAML slots share one range (config.h); it is the scheduler's. */
_Static_assert(KS_CONFIG_SLOTS_MAX == KS_MAX_SLOTS, "the slots range must be the scheduler's");
_Static_assert(KS_CONFIG_CKPT_MAX == KS_SCHED_CKPT_MAX, "the ctx_checkpoints range must be the scheduler's");
_Static_assert((int)KS_CONFIG_MODELS_LOADED_MAX <= (int)KS_SERVER_MODELS_MAX, "models_max within the server's table");
_Static_assert((int)KS_CONFIG_ALIASES_MAX <= (int)KS_SERVER_ALIASES_MAX, "aliases within the server's table");

/* The server's loader over the models of serve_models.h. A model opened
 * before the server started (one model, -m) is handed over at its first load. */
typedef struct loader_ctx {
    ks_serve_model *v;
    const char *mmproj_flag;    /* --mmproj (one model) */
    const char *chat_template;  /* --chat-template FILE */
} loader_ctx;

static int loader_load(void *ud, int i, ks_server_model_parts *out, char *err, size_t errlen) {
    loader_ctx *L = ud;
    ks_serve_model *sm = &L->v[i];
    if (!sm->loaded) {
        int rc = ks_serve_model_engine(sm, err, errlen);
        if (!rc && (rc = ks_serve_model_rest(sm, NULL, L->chat_template, err, errlen))) {
            ks_engine_free(sm->e);
            sm->e = NULL;
        }
        if (rc) return rc;
    }
    ks_serve_model_parts(sm, out);
    return 0;
}

static void loader_unload(void *ud, int i, bool shutdown) {
    loader_ctx *L = ud;
    ks_serve_model_unload(&L->v[i], shutdown);
}

static void loader_stop(void *ud, int i) {
    loader_ctx *L = ud;
    ks_serve_model_stop(&L->v[i]);
}

/* The machine's memory: the default of --models-memory is 90% of it. */
static int64_t phys_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (int64_t)pages * size : 0;
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
    static ks_serve_secret secret; /* the stores of models loaded later need it too */
    if ((rc = ks_serve_store_check(&cfg, &secret))) return rc;
    if ((rc = check_keys(&cfg))) return rc;
    {
        int k, v;
        if ((rc = ks_serve_kv_types(&cfg, f.flash_attn, &k, &v))) return rc;
    }
    int lv = ks_log_parse_level(cfg.log);
    ks_log_set_level(lv < 0 ? KS_LOG_INFO : (ks_log_level)lv);
    /* A media directory that is not one is the operator's mistake, said now
     * (before the model loads) rather than per request. */
    if (cfg.media.path[0]) {
        struct stat mst;
        if (stat(cfg.media.path, &mst) || !S_ISDIR(mst.st_mode)) {
            fprintf(stderr, CMD ": media path '%s' is not a directory\n", cfg.media.path);
            return 2;
        }
    }
    /* Several models (models: entries with a path, --models-dir), or one (-m). */
    ks_serve_model *models = NULL;
    int n_models = 0;
    if ((rc = ks_serve_models_plan(&cfg, &f, &models, &n_models))) return rc;
    bool multi = n_models > 0;
    if (!multi && !cfg.model[0]) {
        fprintf(stderr, CMD ": no model: give -m MODEL (or model: in --config, models.<name>.path, "
                        "--models-dir)\n\n");
        ks_serve_usage(stderr);
        return 2;
    }
    if (multi && cfg.default_model[0]) {
        bool known = false;
        for (int i = 0; i < n_models && !known; i++) known = !strcmp(models[i].name, cfg.default_model);
        if (!known) {
            fprintf(stderr, CMD ": --default-model (default_model) '%s' is none of the models\n", cfg.default_model);
            ks_serve_models_free(models, n_models);
            return 2;
        }
    }

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

    ks_server *srv = NULL;
    ks_metrics *metrics = NULL;
    ks_server_model_cfg *table = NULL;
    int exit_code = 1;
    if (!multi) {
        /* One model, opened here as it always was: a setting the engine
         * refuses (a device, the layers, the split) is a usage error, found
         * before anything is served (exit 2). */
        if (!(models = calloc(1, sizeof *models)) || !(models[0].cfg = malloc(sizeof cfg))) {
            fprintf(stderr, CMD ": out of memory\n");
            goto done;
        }
        n_models = 1;
        ks_serve_model *sm = &models[0];
        sm->flash_attn = f.flash_attn;
        sm->secret = &secret;
        ks_config *mc = sm->cfg;
        *mc = cfg;
        int top_slots = mc->slots; /* before any models entry touches it */
        /* A models.<name> entry may set slots; the --slots flag still wins. The
         * entry is matched by file name first (the engine, which knows
         * general.name, is sized by the slot count), then again below. */
        ks_config_resolve_model(mc, NULL, mc->model);
        if (f.slots >= 0) mc->slots = f.slots;
        ks_serve_apply_spec_flags(&f, mc); /* flags win over a model's speculative block */
        {
            ks_ngram_params np;
            const ks_drafter_ops *ops;
            if ((rc = ks_serve_spec_setup(mc, &np, &ops))) {
                exit_code = 2;
                goto done;
            }
        }
        char err[1024];
        if ((rc = ks_serve_model_engine(sm, err, sizeof err))) {
            if (rc == KS_EINVAL) exit_code = 2;
            goto done;
        }
        ks_config *by_name = malloc(sizeof *by_name);
        if (!by_name) goto done;
        *by_name = *mc;
        /* Resolve from the top-level slots again: the file-name entry applied
         * above must not leak its slots into an entry matched by name. */
        by_name->slots = top_slots;
        ks_config_resolve_model(by_name, ks_engine_model_name(sm->e), mc->model);
        mc->cache = by_name->cache;
        mc->spec = by_name->spec;
        int by_name_slots = by_name->slots;
        free(by_name);
        ks_serve_apply_spec_flags(&f, mc);
        {
            ks_ngram_params np;
            const ks_drafter_ops *ops;
            if ((rc = ks_serve_spec_setup(mc, &np, &ops))) {
                exit_code = 2;
                goto done;
            }
        }
        if (f.slots < 0 && by_name_slots != mc->slots) {
            KS_INFO("serve", "models entry for '%s' sets %d slots: reopening", ks_engine_model_name(sm->e),
                    by_name_slots);
            ks_engine_free(sm->e);
            sm->e = NULL;
            mc->slots = by_name_slots;
            if ((rc = ks_serve_model_engine(sm, err, sizeof err))) {
                if (rc == KS_EINVAL) exit_code = 2;
                goto done;
            }
        }
        if (f.imc) mc->cache.incremental_cache = true;
        if (f.spc) mc->cache.system_prompt_cache = true;
        if ((rc = ks_serve_model_rest(sm, f.mmproj, f.chat_template, err, sizeof err))) {
            if (rc == KS_EINVAL) exit_code = 2;
            goto done;
        }
        snprintf(sm->name, sizeof sm->name, "%s", f.alias ? f.alias : ks_engine_model_name(sm->e));
    } else {
        for (int i = 0; i < n_models; i++) models[i].secret = &secret;
    }

    if (!(table = calloc((size_t)n_models, sizeof *table)) || !(metrics = ks_metrics_create())) {
        fprintf(stderr, CMD ": out of memory\n");
        goto done;
    }
    const char *aliases[KS_SERVER_MODELS_MAX][KS_CONFIG_ALIASES_MAX];
    static char fails[KS_SERVER_MODELS_MAX][512];
    for (int i = 0; i < n_models; i++) {
        const ks_config *mc = models[i].cfg;
        table[i].name = models[i].name;
        table[i].path = mc->model;
        if (!multi) {
            table[i].pin = true;
            continue;
        }
        table[i].pin = mc->cache.pin;
        table[i].keep_alive_s = mc->cache.keep_alive;
        for (int a = 0; a < mc->cache.n_aliases; a++) aliases[i][a] = mc->cache.aliases[a];
        table[i].aliases = aliases[i];
        table[i].n_aliases = mc->cache.n_aliases;
        char err[512] = "";
        int64_t est = 0;
        int erc = ks_model_estimate_bytes(mc->model, mc->ctx, mc->slots, &est, err, sizeof err);
        if (erc == KS_EMODEL || erc == KS_ENOENT) {
            /* Listed as failed from the start: loading it would first unload
             * another model for nothing. */
            KS_WARN("serve", "model %s cannot be loaded: %s", models[i].name, err);
            snprintf(fails[i], sizeof fails[i], "%s", err);
            table[i].fail = fails[i];
        } else if (erc) {
            KS_WARN("serve", "model %s: %s (its memory estimated as the file's size)", models[i].name, err);
        }
        table[i].est_bytes = est;
    }
    loader_ctx lctx = {.v = models, .mmproj_flag = f.mmproj, .chat_template = f.chat_template};

    ks_server_params hp = ks_server_params_default();
    hp.models = table;
    hp.n_models = n_models;
    hp.loader = (ks_server_loader){.ud = &lctx, .load = loader_load, .unload = loader_unload, .stop = loader_stop};
    hp.default_model = cfg.default_model;
    hp.models_max = cfg.models_max;
    hp.memory_budget = cfg.models_memory >= 0 ? cfg.models_memory : phys_bytes() / 10 * 9;
    hp.idle_unload_s = cfg.sleep_idle_seconds;
    hp.autoload = cfg.models_autoload;
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
    hp.media.marker = ks_media_marker();
    if (f.max_tokens > 0) hp.default_max_tokens = f.max_tokens;
    if (f.timeout >= 0) hp.timeout_s = f.timeout;
    if (f.header_timeout >= 0) hp.header_timeout_s = f.header_timeout;
    if (f.max_conns >= 0) hp.max_connections = f.max_conns;
    hp.max_renders = cfg.max_renders;
    if (f.max_conns_client >= 0) hp.max_connections_per_client = f.max_conns_client;
    hp.metrics = metrics;
    const char *cors[KS_CONFIG_CORS_MAX];
    bool cors_any = false;
    for (int i = 0; i < cfg.n_cors_origins; i++) {
        cors[i] = cfg.cors_origins[i];
        cors_any |= !strcmp(cors[i], "*");
    }
    hp.cors_origins = cors;
    hp.n_cors_origins = cfg.n_cors_origins;
    hp.reasoning_format = f.reasoning_format;
    hp.spm_infill = f.spm_infill;
    if (f.responses_ttl >= 0) hp.responses_ttl_s = f.responses_ttl;
    if (f.responses_max >= 0) hp.responses_max = f.responses_max;
    char err[512] = "";
    rc = ks_server_start(&hp, &srv, err, sizeof err);
    if (rc) {
        fprintf(stderr, CMD ": %s\n", err[0] ? err : ks_strerror(rc));
        goto done;
    }
    bool v6 = strchr(cfg.host, ':') != NULL;
    if (!multi) {
        ks_serve_model *sm = &models[0];
        ks_engine *e = sm->e;
        char where[512], why[320] = "";
        ks_engine_offload_desc(e, where, sizeof where);
        const char *reason = ks_engine_exact_reason(e, sm->cfg->exact);
        if (reason) snprintf(why, sizeof why, " (%s)", reason);
        fprintf(stderr, "kvstash: listening on http://%s%s%s:%d (model %s, %d slots, ctx %d, %s, exact: %s%s)\n",
                v6 ? "[" : "", cfg.host, v6 ? "]" : "", ks_server_port(srv), sm->name, sm->cfg->slots,
                ks_engine_n_ctx_seq(e), where, ks_engine_exact_mode(e, sm->cfg->exact), why);
        char store_desc[KS_MAX_PATH + 256];
        ks_serve_store_desc(&sm->store_cfg, sm->store, sm->store_mode, store_desc, sizeof store_desc);
        KS_INFO("serve", "cache: prompt %s, imc %s, spc %s, store %s", sm->cfg->cache_prompt ? "on" : "off",
                sm->cfg->cache.incremental_cache ? "on" : "off", sm->spc ? "on" : "off", store_desc);
        bool spec_exact;
        const char *spec_why;
        bool spec_on = ks_sched_spec_status(sm->sched, &spec_exact, &spec_why);
        if (!sm->drafter)
            KS_INFO("serve", "speculative decoding: off (--spec-type none)");
        else if (!spec_on)
            KS_INFO("serve", "speculative decoding: off (%s)", spec_why);
        else
            KS_INFO("serve", "speculative decoding: %s, up to %d tokens per step, %s", sm->spec_name,
                    sm->cfg->spec.draft_max, spec_exact ? "exact (a reply is the same without it)" : "not exact");
        if (sm->drafter && spec_on && !spec_exact)
            KS_WARN("serve", "speculative decoding is not exact here (%s): a reply may differ from one without it "
                             "in the last bits, as a cached one may (--spec-type none turns it off)", spec_why);
        if (ks_engine_offload_info(e)->n_devices > 0 && reason)
            KS_WARN("serve", "exact output is unavailable on %s: a cached reply may differ from an uncached one in "
                             "the last bits (-ngl 0 keeps the model on the CPU, where it is exact)", where);
    } else {
        char list[2048] = "";
        for (int i = 0, n = 0; i < n_models && n >= 0 && (size_t)n < sizeof list; i++)
            n += snprintf(list + n, sizeof list - (size_t)n, "%s%s%s", i ? ", " : "", models[i].name,
                          table[i].pin ? " (pinned)" : "");
        fprintf(stderr, "kvstash: listening on http://%s%s%s:%d (%d models: %s; default %s; at most %d loaded)\n",
                v6 ? "[" : "", cfg.host, v6 ? "]" : "", ks_server_port(srv), n_models, list,
                cfg.default_model[0] ? cfg.default_model : "none", cfg.models_max);
        for (int i = 0; i < n_models; i++)
            KS_INFO("serve", "model %s: %s, about %.0f MiB loaded (%d slots, ctx %d)%s%s", models[i].name,
                    models[i].cfg->model, (double)table[i].est_bytes / 1048576.0, models[i].cfg->slots,
                    models[i].cfg->ctx, table[i].n_aliases ? ", aliases " : "",
                    table[i].n_aliases ? models[i].cfg->cache.aliases[0] : "");
    }
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
    /* Last of the start lines: a supervisor (or a test) that waits for it has
     * every line above in hand. */
    fprintf(stderr, "kvstash: port=%d\n", ks_server_port(srv));

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
    /* Order matters (server.h note 6): no server thread may call a
     * scheduler once it is freed; ks_server_free unloads every model (its
     * scheduler's shutdown saves go to the store), then stops the daemon. */
    if (srv) ks_server_detach_sched(srv);
    ks_server_free(srv);
    ks_metrics_free(metrics);
    ks_serve_models_free(models, n_models); /* the stores write what is queued */
    free(table);
    memset(&secret, 0, sizeof secret);
    if (exit_code == 0) KS_INFO("serve", "stopped");
    return exit_code;
}

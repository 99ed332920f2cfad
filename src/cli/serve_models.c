/*
 * serve_models.c — see serve_models.h.
 */
#include "cli/serve_models.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "engine/fingerprint.h"
#include "engine/media.h"

#define CMD "kvstash serve"

/* A message on stderr (the log) and in err. */
static void say(char *err, size_t errlen, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, CMD ": %s\n", line);
    if (err && errlen) snprintf(err, errlen, "%s", line);
}

int ks_serve_kv_types(const ks_config *c, int flash_attn, int *k, int *v) {
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

int ks_serve_spec_setup(const ks_config *c, ks_ngram_params *np, const ks_drafter_ops **ops) {
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

/* The draft model (-md) beside the model: the same slots and context, its
 * own GPU layers (-ngld); a vocabulary that is not the model's is a usage
 * error. 0, KS_EINVAL (said) or another error (said). */
static int open_draft(ks_serve_model *sm, char *err, size_t errlen) {
    const ks_config *c = sm->cfg;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = c->spec.draft_model;
    ep.n_seq = c->slots;
    ep.n_ctx_seq = ks_engine_n_ctx_seq(sm->e);
    ep.n_batch = c->batch;
    ep.n_threads = c->threads;
    ep.flash_attn = sm->flash_attn;
    ep.exact = false; /* drafts change how fast, never what: no probe needed */
    ep.pool_of = sm->e; /* one pool of polling workers on the cores, not two (engine.h) */
    ep.offload = c->offload;
    ep.repack = c->repack;
    char why[128];
    if (c->spec.draft_gpu_layers[0] &&
        ks_offload_parse_layers(c->spec.draft_gpu_layers, &ep.offload.n_gpu_layers, why, sizeof why)) {
        say(err, errlen, "speculative.draft_gpu_layers: '%s': %s", c->spec.draft_gpu_layers, why);
        return KS_EINVAL;
    }
    char e2[1024] = "";
    int rc = ks_engine_open(&ep, &sm->draft_e, e2, sizeof e2);
    if (rc) {
        say(err, errlen, "--model-draft (speculative.draft_model): %s", e2[0] ? e2 : ks_strerror(rc));
        return rc == KS_ENOENT || rc == KS_EINVAL || rc == KS_ECORRUPT ? KS_EINVAL : rc;
    }
    if ((rc = ks_draft_model_same_vocab(sm->e, sm->draft_e, e2, sizeof e2))) {
        say(err, errlen, "--model-draft %s: not the model's vocabulary: %s", c->spec.draft_model, e2);
        ks_engine_free(sm->draft_e);
        sm->draft_e = NULL;
        return KS_EINVAL;
    }
    char where[256];
    ks_engine_offload_desc(sm->draft_e, where, sizeof where);
    KS_INFO("serve", "%s: draft model %s (%s), %d slots, %s", sm->name, ks_engine_model_name(sm->draft_e),
            ks_engine_model_desc(sm->draft_e), c->slots, where);
    return 0;
}

/* The draft model's own store (draft_model.h: its states beside the
 * target's): the target's settings, with a quarter of its RAM budget (a
 * draft model's KV is the smaller) and its saves (reason evict: a slot
 * taken over, the drafter's last sequence at an unload or shutdown) where
 * the target's shutdown saves go, so a restart finds them. Keyed by the draft
 * model's fingerprint and kv-params: never the target's entries. Failing to
 * open it costs speed only: logged, and the drafters decode instead. */
static void open_draft_store(ks_serve_model *sm) {
    sm->draft_store_opened = true;
    ks_store_cfg dc = sm->store_cfg;
    dc.tier_max_bytes[KS_TIER_RAM] /= 4;
    if (dc.reason_tier[KS_REASON_SHUTDOWN] != KS_TIER_NONE)
        dc.reason_tier[KS_REASON_EVICT] = dc.reason_tier[KS_REASON_SHUTDOWN];
    dc.warm_slots = 0;
    uint8_t fp[32];
    char e2[512] = "";
    const char *fp_dir = dc.tier_max_bytes[KS_TIER_DISK] > 0 ? dc.cache_dir : NULL;
    int rc = ks_model_fingerprint_cached(sm->cfg->spec.draft_model, fp_dir, fp, NULL, e2, sizeof e2);
    if (!rc) {
        KS_INFO("serve", "%s: the draft model's states (a store of its own, the same tiers):", sm->name);
        rc = ks_serve_store_open(sm->cfg, &dc, sm->secret, sm->draft_e, fp, &sm->draft_store);
    }
    if (rc)
        KS_WARN("serve", "%s: the draft model's store cannot be opened (%s): its cached turns decode the prompt in the "
                         "draft model", sm->name, e2[0] ? e2 : ks_strerror(rc));
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
    ks_prom_counter(p, "kvstash_draft_model_copied_tokens_total",
                    "Prompt tokens the draft model took from another slot's draft sequence instead of decoding them.",
                    (double)atomic_load(&c->copied));
    ks_prom_counter(p, "kvstash_draft_model_restored_tokens_total",
                    "Prompt tokens the draft model read back from its store instead of decoding them.",
                    (double)atomic_load(&c->restored));
    ks_prom_counter(p, "kvstash_draft_model_saved_states_total", "Draft model states saved to its store.",
                    (double)atomic_load(&c->saved));
}

static void *fp_main(void *ud) {
    ks_serve_model *sm = ud;
    char err[256];
    sm->fp_rc = ks_serve_store_fingerprint(sm->cfg, &sm->store_cfg, sm->fp, err, sizeof err);
    return NULL;
}

/* Joins the fingerprint's thread, if one runs. */
static void fp_join(ks_serve_model *sm) {
    if (!sm->fp_running) return;
    pthread_join(sm->fp_thread, NULL);
    sm->fp_running = false;
}

int ks_serve_model_engine(ks_serve_model *sm, char *err, size_t errlen) {
    const ks_config *c = sm->cfg;
    if (!sm->store_opened && !sm->fp_running) {
        /* The store's fingerprint beside the engine's load (one core reads
         * and repacks the weights; the other hashes them). */
        sm->store_mode = ks_config_store_plan(c, &sm->store_cfg);
        sm->fp_rc = -1;
        if (sm->store_mode != KS_STORE_OFF) sm->fp_running = pthread_create(&sm->fp_thread, NULL, fp_main, sm) == 0;
    }
    ks_engine_params ep = ks_engine_params_default();
    if (ks_serve_kv_types(c, sm->flash_attn, &ep.type_k, &ep.type_v)) {
        say(err, errlen, "a KV cache type the engine refuses (cache_type_k, cache_type_v)");
        return KS_EINVAL;
    }
    ep.model_path = c->model;
    ep.n_seq = c->slots;
    ep.n_ctx_seq = c->ctx;
    ep.n_batch = c->batch;
    ep.n_threads = c->threads;
    ep.flash_attn = sm->flash_attn;
    ep.exact = c->exact;
    ep.offload = c->offload;
    ep.repack = c->repack;
    char e2[1024] = "";
    int rc = ks_engine_open(&ep, &sm->e, e2, sizeof e2);
    if (rc) {
        fp_join(sm);
        say(err, errlen, "%s", e2[0] ? e2 : ks_strerror(rc));
        return rc;
    }
    ks_engine *e = sm->e;
    /* What the open-time probe found, so that a model's exactness (a
     * mixture of experts' above all: issue 31) is stated, not assumed. */
    int n_used = 0, n_exp = ks_engine_n_expert(e, &n_used);
    char moe[64] = "";
    if (n_exp > 0) snprintf(moe, sizeof moe, ", %d experts (%d per token)", n_exp, n_used);
    bool inv = ks_engine_batch_invariant(e), pairs = ks_engine_pairs_exact(e);
    const char *why = ks_engine_exact_reason(e, c->exact);
    KS_INFO("serve", "model %s (%s%s), weight repacking %s; probe: a token decoded alone %s its bits in a "
            "batch%s -> exact mode %s%s%s%s", ks_engine_model_name(e), ks_engine_model_desc(e), moe,
            ks_engine_repacked(e) ? "on" : "off", inv ? "keeps" : "does not keep",
            inv ? "" : pairs ? ", decoded in pairs it does" : "", ks_engine_exact_mode(e, c->exact),
            why ? " (" : "", why ? why : "", why ? ")" : "");
    /* A silently smaller context turns a client's long prompt into a
     * refusal it cannot explain: say so at the default level. */
    if (c->ctx > ks_engine_n_ctx_seq(e))
        KS_WARN("serve", "--ctx %d is more than this model takes: each slot gets %d tokens (the model's "
                         "trained context)", c->ctx, ks_engine_n_ctx_seq(e));
    return 0;
}

int ks_serve_model_rest(ks_serve_model *sm, const char *mmproj_flag, const char *chat_template_file, char *err,
                        size_t errlen) {
    ks_config *c = sm->cfg;
    int rc;
    if (ks_serve_spec_setup(c, &sm->ngram, &sm->drafter)) {
        say(err, errlen, "a speculative decoding setting is refused (see above)");
        rc = KS_EINVAL;
        goto fail;
    }
    {
        /* The projector: --mmproj, else the model's entry's, else the top-level one. */
        const char *mm = mmproj_flag ? mmproj_flag : c->cache.mmproj[0] ? c->cache.mmproj : c->mmproj;
        char e2[1024] = "";
        if (mm[0] && (rc = ks_engine_media_open(sm->e, mm, e2, sizeof e2))) {
            say(err, errlen, "%s", e2[0] ? e2 : ks_strerror(rc));
            if (rc == KS_EINVAL) rc = KS_EMODEL; /* exit 1, not a usage error (as it always was) */
            goto fail;
        }
        if (mm[0])
            KS_INFO("serve", "projector %s: %s%s%s input", mm, ks_media_vision(ks_engine_media(sm->e)) ? "image" : "",
                    ks_media_vision(ks_engine_media(sm->e)) && ks_media_audio(ks_engine_media(sm->e)) ? " and " : "",
                    ks_media_audio(ks_engine_media(sm->e)) ? "audio" : "");
    }
    if (sm->drafter == ks_draft_model_ops()) {
        if ((rc = open_draft(sm, err, errlen))) goto fail;
        memset(&sm->dmc, 0, sizeof sm->dmc);
        sm->dmc.engine = sm->draft_e;
        sm->dmc.p_min = c->spec.draft_p_min;
        /* KS_DRAFT_CACHE=0: the draft model's KV follows the slot by common
         * prefix only, as before it was cached (a diagnostic, and the
         * baseline of bench/draft_cache.sh) */
        const char *dc = getenv("KS_DRAFT_CACHE");
        sm->dmc.no_cache = dc && !strcmp(dc, "0");
    }
    if (!(sm->metrics = ks_metrics_create())) {
        rc = KS_ENOMEM;
        say(err, errlen, "out of memory");
        goto fail;
    }
    if (c->cache.system_prompt_cache) {
        if ((rc = ks_spc_create(c->cache.spc_max_bytes, &sm->spc)) ||
            (rc = ks_metrics_add(sm->metrics, ks_metrics_spc, sm->spc))) {
            say(err, errlen, "cannot create the system prompt cache: %s", ks_strerror(rc));
            goto fail;
        }
    }
    if (!sm->store_opened) {
        fp_join(sm);
        sm->store_mode = ks_config_store_plan(c, &sm->store_cfg);
        /* The thread's fingerprint when it got one; else computed again
         * there, which prints why it fails. */
        const uint8_t *fp = sm->fp_rc == 0 ? sm->fp : NULL;
        if (sm->store_mode != KS_STORE_OFF && (rc = ks_serve_store_open(c, &sm->store_cfg, sm->secret, sm->e, fp,
                                                                         &sm->store))) {
            say(err, errlen, "cannot open the KV store (see above)");
            if (rc == KS_EINVAL) rc = KS_EIO; /* exit 1, not a usage error (as it always was) */
            goto fail;
        }
        sm->store_opened = true;
        if (!sm->quiet_start) ks_serve_store_report(c, &sm->store_cfg, sm->store, sm->secret);
    }
    if (sm->store && (rc = ks_metrics_add(sm->metrics, ks_metrics_store, sm->store))) goto fail;
    if (sm->draft_e && sm->store && !sm->draft_store_opened) open_draft_store(sm);
    sm->dmc.store = sm->draft_e ? sm->draft_store : NULL;
    if (chat_template_file && !sm->tmpl_text && ks_cli_read_template(CMD, chat_template_file, &sm->tmpl_text)) {
        say(err, errlen, "--chat-template %s cannot be read", chat_template_file);
        rc = KS_EINVAL;
        goto fail;
    }

    ks_sched_params sp = ks_sched_params_default();
    sp.engine = sm->e;
    sp.n_slots = c->slots;
    sp.max_queue = c->max_queue;
    sp.cache_prompt = c->cache_prompt;
    sp.exact = c->exact;
    sp.affinity_min = c->affinity_min;
    sp.imc = c->cache.incremental_cache;
    sp.cache_min_tokens = c->cache.cache_min_tokens;
    sp.spc = sm->spc;
    sp.store = sm->store;
    sp.store_stride = sm->store_cfg.stride;
    sp.continued_interval = sm->store_cfg.continued_interval;
    sp.store_min_tokens = sm->store_cfg.min_tokens;
    sp.warm_slots = sm->store_cfg.warm_slots;
    sp.finish_save_after_done = true;
    sp.finish_save_delay_ms = sm->store_cfg.finish_save_delay_ms;
    if (sp.warm_slots > 0 && (!sm->store || sm->store_mode == KS_STORE_RAM_ONLY) && !sm->quiet_start)
        KS_WARN("serve", "--warm-slots (store.warm_slots) needs the persistent store (--cache-dir or a store: "
                         "section): no slot is warmed");
    if (!sm->store || sm->store_mode == KS_STORE_RAM_ONLY) sp.warm_slots = 0;
    sp.ckpt_max = c->ctx_checkpoints;
    sp.ckpt_bytes = (size_t)c->checkpoint_bytes;
    sp.ckpt_gen_interval = c->checkpoint_every;
    sp.share_system_prompt = c->share_system_prompt;
    sp.drafter = sm->drafter;
    sp.drafter_cfg = sm->drafter == ks_draft_model_ops() ? (void *)&sm->dmc : (void *)&sm->ngram;
    if (sm->draft_e && (rc = ks_metrics_add(sm->metrics, draft_metrics, &sm->dmc))) goto fail;
    sp.draft_max = c->spec.draft_max;
    sp.draft_min = c->spec.draft_min;
    sp.draft_adaptive = c->spec.adaptive;
    if ((rc = ks_sched_create(&sp, &sm->sched))) {
        say(err, errlen, "cannot start the scheduler: %s", ks_strerror(rc));
        goto fail;
    }
    /* The SPC key must change with whatever changes a system prompt's KV. */
    char kv[1024];
    ks_engine_kv_params(sm->e, kv, sizeof kv);
    snprintf(sm->model_id, sizeof sm->model_id, "%s|%s", ks_engine_model_path(sm->e), kv);
    sm->spec_name = !sm->drafter ? "none" : sm->draft_e ? "draft-simple" : c->spec.type;
    sm->loaded = true;
    return 0;
fail:
    fp_join(sm);
    ks_spc_free(sm->spc);
    sm->spc = NULL;
    ks_metrics_free(sm->metrics);
    sm->metrics = NULL;
    ks_engine_free(sm->draft_e);
    sm->draft_e = NULL;
    return rc;
}

void ks_serve_model_parts(ks_serve_model *sm, ks_server_model_parts *out) {
    memset(out, 0, sizeof *out);
    out->engine = sm->e;
    out->sched = sm->sched;
    out->model_id = sm->model_id;
    out->chat_template = sm->tmpl_text;
    ks_media *mm = ks_engine_media(sm->e);
    out->media_modalities = (mm && ks_media_vision(mm) ? KS_MEDIA_IN_IMAGE : 0u) |
                            (mm && ks_media_audio(mm) ? KS_MEDIA_IN_AUDIO : 0u);
    out->cache_prompt = sm->cfg->cache_prompt;
    out->exact = sm->cfg->exact;
    out->spec_type = sm->spec_name;
    out->draft_max = sm->cfg->spec.draft_max;
    out->store_mode = !sm->store ? "off" : sm->store_mode == KS_STORE_RAM_ONLY ? "ram-only" : "full";
    out->metrics = sm->metrics;
}

void ks_serve_model_stop(ks_serve_model *sm) {
    if (sm->sched) ks_sched_set_stop_reason(sm->sched, KS_REASON_SHUTDOWN);
    ks_sched_free(sm->sched); /* its slots go to the store here */
    sm->sched = NULL;
}

void ks_serve_model_unload(ks_serve_model *sm, bool shutdown) {
    if (sm->sched) ks_sched_set_stop_reason(sm->sched, shutdown ? KS_REASON_SHUTDOWN : KS_REASON_UNLOAD);
    ks_sched_free(sm->sched); /* its slots go to the store here */
    sm->sched = NULL;
    ks_spc_free(sm->spc);
    sm->spc = NULL;
    ks_engine_free(sm->draft_e); /* after the scheduler: its drafters decoded in it */
    sm->draft_e = NULL;
    ks_draft_model_cfg_fini(&sm->dmc);
    ks_engine_free(sm->e);
    sm->e = NULL;
    ks_metrics_free(sm->metrics);
    sm->metrics = NULL;
    sm->loaded = false;
}

void ks_serve_model_final(ks_serve_model *sm) {
    fp_join(sm);
    ks_serve_model_unload(sm, true);
    ks_store_close(sm->store); /* writes what is queued (store.shutdown_timeout_ms) */
    sm->store = NULL;
    ks_store_close(sm->draft_store);
    sm->draft_store = NULL;
    free(sm->tmpl_text);
    sm->tmpl_text = NULL;
    free(sm->cfg);
    sm->cfg = NULL;
}

/* ---------------------------------------------------------- several models */
static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcasecmp(s + n - k, suf);
}

/* A GGUF that is not a model to serve: a projector, a draft. */
static bool side_file(const char *name) {
    return strstr(name, "mmproj") || !strncmp(name, "mtp-", 4) || !strncmp(name, "draft-", 6);
}

typedef struct found {
    char name[128];
    char path[KS_MAX_PATH];
    char mmproj[KS_MAX_PATH];
    int entry;                  /* c->models index of an entry with a path, -1: models_dir or -m */
    bool dash_m;                /* the -m model (the top-level mmproj is its) */
} found;

static int cmp_names(const void *a, const void *b) {
    return strcmp(((const found *)a)->name, ((const found *)b)->name);
}

/* models_dir's models (llama-server's rules: X.gguf is X; a subdirectory X
 * holds X's GGUF and a projector whose name has "mmproj"), sorted. */
static int scan_dir(const char *dir, found *v, int *n, int max) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, CMD ": --models-dir %s: %s\n", dir, strerror(errno));
        return 2;
    }
    int first = *n;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[KS_MAX_PATH];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= sizeof p) continue;
        struct stat st;
        if (stat(p, &st)) continue;
        found f = {.entry = -1};
        if (S_ISREG(st.st_mode) && has_suffix(de->d_name, ".gguf") && !side_file(de->d_name)) {
            snprintf(f.name, sizeof f.name, "%.*s", (int)(strlen(de->d_name) - 5), de->d_name);
            snprintf(f.path, sizeof f.path, "%s", p);
        } else if (S_ISDIR(st.st_mode)) {
            DIR *sd = opendir(p);
            struct dirent *se;
            while (sd && (se = readdir(sd))) {
                if (!has_suffix(se->d_name, ".gguf")) continue;
                char q[KS_MAX_PATH];
                if ((size_t)snprintf(q, sizeof q, "%s/%s", p, se->d_name) >= sizeof q) continue;
                if (strstr(se->d_name, "mmproj")) snprintf(f.mmproj, sizeof f.mmproj, "%s", q);
                else if (!side_file(se->d_name) && (!f.path[0] || strstr(se->d_name, "-00001-of-")))
                    snprintf(f.path, sizeof f.path, "%s", q);
            }
            if (sd) closedir(sd);
            if (!f.path[0]) continue;
            snprintf(f.name, sizeof f.name, "%.127s", de->d_name);
        } else {
            continue;
        }
        if (*n >= max) {
            closedir(d);
            fprintf(stderr, CMD ": --models-dir %s: more than %d models\n", dir, max);
            return 2;
        }
        v[(*n)++] = f;
    }
    closedir(d);
    qsort(v + first, (size_t)(*n - first), sizeof *v, cmp_names);
    return 0;
}

/* The settings of model f: the top level, its models.<name> entry (by its
 * name, else "default"), the per-model keys, then the flags that win. */
static int model_cfg(const ks_config *c, const ks_serve_flags *fl, const found *f, int n_models, ks_config *out) {
    *out = *c;
    snprintf(out->model, sizeof out->model, "%s", f->path);
    ks_config_resolve_model(out, f->name, f->path);
    ks_model_cache_cfg *m = &out->cache;
    /* Settings from another model's entry ("default" with a path of its
     * own): its settings, not its identity. */
    if (m->path[0] && strcmp(m->path, f->path)) {
        m->path[0] = '\0';
        m->n_aliases = 0;
        m->pin = false;
        m->keep_alive = 0;
    }
    /* The top-level projector is the -m model's, not every model's. */
    if (!f->dash_m) out->mmproj[0] = '\0';
    if (m->ctx > 0) out->ctx = m->ctx;
    if (m->exact >= 0) out->exact = m->exact;
    if (m->ctx_checkpoints >= 0) out->ctx_checkpoints = m->ctx_checkpoints;
    if (m->cache_type_k[0]) snprintf(out->cache_type_k, sizeof out->cache_type_k, "%s", m->cache_type_k);
    if (m->cache_type_v[0]) snprintf(out->cache_type_v, sizeof out->cache_type_v, "%s", m->cache_type_v);
    if (m->gpu_layers[0]) {
        char why[128];
        if (ks_offload_parse_layers(m->gpu_layers, &out->offload.n_gpu_layers, why, sizeof why)) {
            fprintf(stderr, CMD ": models.%s.gpu_layers: '%s': %s\n", f->name, m->gpu_layers, why);
            return 2;
        }
    }
    if (f->mmproj[0] && !out->cache.mmproj[0]) snprintf(out->cache.mmproj, sizeof out->cache.mmproj, "%s", f->mmproj);
    if (fl->slots >= 0) out->slots = fl->slots;
    ks_serve_apply_spec_flags(fl, out);
    if (fl->imc) out->cache.incremental_cache = true;
    if (fl->spc) out->cache.system_prompt_cache = true;
    /* The RAM budgets are the models' together: each its share. */
    if (n_models > 1) out->store.tier_max_bytes[KS_TIER_RAM] /= n_models;
    return 0;
}

int ks_serve_models_plan(const ks_config *c, const ks_serve_flags *fl, ks_serve_model **out, int *n) {
    *out = NULL;
    *n = 0;
    enum { MAX = KS_SERVER_MODELS_MAX };
    found *v = calloc(MAX + 1, sizeof *v);
    if (!v) return 1;
    int k = 0, rc = 0;
    for (int i = 0; i < c->n_models; i++) {
        if (!c->models[i].path[0]) continue;
        snprintf(v[k].name, sizeof v[k].name, "%s", c->model_keys[i]);
        snprintf(v[k].path, sizeof v[k].path, "%s", c->models[i].path);
        v[k].entry = i;
        k++;
    }
    int n_entries = k;
    if (c->models_dir[0] && (rc = scan_dir(c->models_dir, v, &k, MAX))) goto done;
    /* An entry wins over a models_dir file of its name. */
    for (int i = n_entries; i < k; i++)
        for (int j = 0; j < n_entries; j++)
            if (!strcmp(v[i].name, v[j].name)) {
                memmove(&v[i], &v[i + 1], sizeof *v * (size_t)(k - i - 1));
                k--;
                i--;
                break;
            }
    if (k == 0) {
        if (c->models_dir[0]) {
            fprintf(stderr, CMD ": --models-dir %s: no GGUF model in it\n", c->models_dir);
            rc = 2;
        }
        goto done;
    }
    /* -m as well: one more model, named by --alias or its file's stem. */
    if (c->model[0]) {
        if (k >= MAX) {
            fprintf(stderr, CMD ": more than %d models\n", MAX);
            rc = 2;
            goto done;
        }
        const char *base = strrchr(c->model, '/');
        base = base ? base + 1 : c->model;
        found f = {.entry = -1, .dash_m = true};
        if (fl->alias) snprintf(f.name, sizeof f.name, "%s", fl->alias);
        else snprintf(f.name, sizeof f.name, "%.*s", (int)(has_suffix(base, ".gguf") ? strlen(base) - 5 : strlen(base)), base);
        snprintf(f.path, sizeof f.path, "%s", c->model);
        if (fl->mmproj) snprintf(f.mmproj, sizeof f.mmproj, "%s", fl->mmproj);
        memmove(&v[1], &v[0], sizeof *v * (size_t)k);
        v[0] = f;
        k++;
    }
    ks_serve_model *m = calloc((size_t)k, sizeof *m);
    if (!m) {
        rc = 1;
        goto done;
    }
    for (int i = 0; i < k && !rc; i++) {
        snprintf(m[i].name, sizeof m[i].name, "%s", v[i].name);
        m[i].flash_attn = fl->flash_attn;
        m[i].quiet_start = true;
        if (!(m[i].cfg = malloc(sizeof *m[i].cfg))) rc = 1;
        else rc = model_cfg(c, fl, &v[i], k, m[i].cfg);
        if (!rc) {
            int kk, vv;
            if (ks_serve_kv_types(m[i].cfg, fl->flash_attn, &kk, &vv)) rc = 2;
        }
        if (!rc) {
            ks_ngram_params np;
            const ks_drafter_ops *ops;
            if (ks_serve_spec_setup(m[i].cfg, &np, &ops)) rc = 2;
        }
    }
    if (rc) {
        ks_serve_models_free(m, k);
        goto done;
    }
    *out = m;
    *n = k;
done:
    free(v);
    return rc;
}

void ks_serve_models_free(ks_serve_model *v, int n) {
    for (int i = 0; v && i < n; i++) ks_serve_model_final(&v[i]);
    free(v);
}

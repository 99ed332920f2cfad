/*
 * config_yaml.c — the YAML file of `kvstash serve` (config.h), read with
 * libyaml.
 *
 * NOTES ON THE DESIGN
 *  - The YAML text is composed into a libyaml document (yaml_parser_load) and
 *    walked mapping by mapping against tables of known keys. Only the known
 *    depth is walked, so anchors and aliases (even cyclic ones) cannot make
 *    the walk recurse without bound.
 *  - Loading is all or nothing: the file is applied to a copy of the
 *    configuration, which replaces the caller's only when every key was valid.
 *  - Scalars are read by their text whatever their YAML style: `port: "8080"`
 *    is the integer 8080, and `cache_dir: ~` is the home directory rather than
 *    YAML's null (an empty value is a type error where a path is required).
 *  - Byte sizes take an optional suffix, case-insensitive: K/M/G/T, Ki/Mi/Gi/Ti
 *    and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB are powers of 1000
 *    (SI); B is bytes. A fraction is allowed with a suffix ("1.5GiB") and the
 *    result is rounded down to a whole byte.
 *  - Paths are expanded as config.c says.
 *  - Error messages name the key path and the line (1-based) of the offending
 *    node: "unknown key 'store.tiers.ram.maxbytes' at line 7",
 *    "'port' at line 3: expected an integer 0..65535, got 'abc'".
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "base/base.h"
#include "cache/redis_fmt.h"
#include "config/config_int.h"
#include "config/config_walk.h"

#define MAX_FILE_BYTES (1 << 20)

static const field k_top_fields[] = {
    FS(ks_config, model, F_PATH),
    FS(ks_config, mmproj, F_PATH),
    FS(ks_config, host, F_STR),
    FI(ks_config, port, KS_CONFIG_PORT_MIN, KS_CONFIG_PORT_MAX), /* 0: any free port */
    FI(ks_config, slots, KS_CONFIG_SLOTS_MIN, KS_CONFIG_SLOTS_MAX),
    FI(ks_config, ctx, KS_CONFIG_CTX_MIN, KS_CONFIG_CTX_MAX),
    FI(ks_config, batch, KS_CONFIG_BATCH_MIN, KS_CONFIG_BATCH_MAX),
    FI(ks_config, threads, KS_CONFIG_THREADS_MIN, KS_CONFIG_THREADS_MAX),
    FB(ks_config, cache_prompt),
    FB(ks_config, exact),
    FB(ks_config, repack),
    FS(ks_config, cache_type_k, F_STR),
    FS(ks_config, cache_type_v, F_STR),
    FF(ks_config, affinity_min, 0, 1),
    FI(ks_config, ctx_checkpoints, 0, KS_CONFIG_CKPT_MAX),
    FY(ks_config, checkpoint_bytes, 0, KS_STORE_BYTES_MAX),
    FI(ks_config, checkpoint_every, 0, KS_CONFIG_CKPT_EVERY_MAX),
    FS(ks_config, api_key, F_STR),
    FS(ks_config, api_key_file, F_PATH),
    FS(ks_config, metrics_key, F_STR),
    FS(ks_config, tenant_by, F_STR),
    FB(ks_config, share_system_prompt),
    FI(ks_config, max_queue, KS_CONFIG_MAX_QUEUE_MIN, KS_CONFIG_MAX_QUEUE_MAX),
    FI(ks_config, max_renders, 1, 1024),
    FY(ks_config, max_body_bytes, KS_CONFIG_MAX_BODY_MIN, KS_CONFIG_MAX_BODY_MAX),
    FS(ks_config, log, F_LOG),
    FS(ks_config, models_dir, F_PATH),
    FI(ks_config, models_max, 0, KS_CONFIG_MODELS_LOADED_MAX),
    FY(ks_config, models_memory, -1, KS_STORE_BYTES_MAX),
    FI(ks_config, sleep_idle_seconds, 0, 100000000),
    FB(ks_config, models_autoload),
    FS(ks_config, default_model, F_STR),
};

static const field k_model_fields[] = {
    FB(ks_model_cache_cfg, system_prompt_cache),
    FB(ks_model_cache_cfg, incremental_cache),
    FI(ks_model_cache_cfg, cache_min_tokens, 0, 10000000),
    FI(ks_model_cache_cfg, slots, KS_CONFIG_SLOTS_MIN, KS_CONFIG_SLOTS_MAX),
    FY(ks_model_cache_cfg, spc_max_bytes, 0, KS_STORE_BYTES_MAX),
    FS(ks_model_cache_cfg, mmproj, F_PATH),
    FS(ks_model_cache_cfg, path, F_PATH),
    FB(ks_model_cache_cfg, pin),
    FI(ks_model_cache_cfg, keep_alive, -1, 100000000),
    FI(ks_model_cache_cfg, ctx, KS_CONFIG_CTX_MIN, KS_CONFIG_CTX_MAX),
    FI(ks_model_cache_cfg, ctx_checkpoints, 0, KS_CONFIG_CKPT_MAX),
    FS(ks_model_cache_cfg, gpu_layers, F_STR),
    FS(ks_model_cache_cfg, cache_type_k, F_STR),
    FS(ks_model_cache_cfg, cache_type_v, F_STR),
};

static const field k_store_fields[] = {
    FB(ks_store_cfg, enabled),
    FS(ks_store_cfg, cache_dir, F_PATH),
    FS(ks_store_cfg, shm_dir, F_PATH),
    FS(ks_store_cfg, secret_file, F_PATH),
    FI(ks_store_cfg, stride, 1, 1048576),
    FI(ks_store_cfg, continued_interval, 0, 1048576),
    FI(ks_store_cfg, min_tokens, 0, 1048576),
    FI(ks_store_cfg, shutdown_timeout_ms, 0, 3600000),
    FI(ks_store_cfg, finish_save_delay_ms, 0, 60000),
    FI(ks_store_cfg, warm_slots, 0, KS_CONFIG_SLOTS_MAX),
    FF(ks_store_cfg, pin_share, 0, 1),
};

static const field k_redis_fields[] = {
    FS(ks_redis_cfg, url, F_STR),
    FS(ks_redis_cfg, key_prefix, F_STR),
    FI(ks_redis_cfg, ttl, 0, 2147483647),
    FY(ks_redis_cfg, chunk_bytes, KS_REDIS_CHUNK_MIN, KS_REDIS_CHUNK_MAX),
    FI(ks_redis_cfg, timeout_ms, 10, 60000),
    FI(ks_redis_cfg, breaker_errors, 1, 1000),
    FI(ks_redis_cfg, breaker_ms, 0, 3600000),
};

/* media: the limits on a request's images and audio. */
static const field k_media_fields[] = {
    FY(ks_media_cfg, max_bytes, KS_CONFIG_MEDIA_BYTES_MIN, KS_CONFIG_MEDIA_BYTES_MAX),
    FI(ks_media_cfg, max_items, 1, KS_CONFIG_MEDIA_ITEMS_MAX),
    FY(ks_media_cfg, max_total_bytes, KS_CONFIG_MEDIA_BYTES_MIN, KS_CONFIG_MEDIA_TOTAL_MAX),
    FY(ks_media_cfg, max_pixels, 1, KS_CONFIG_MEDIA_PIXELS_MAX),
    FS(ks_media_cfg, path, F_PATH),
    FS(ks_media_cfg, fetch_hosts, F_STR),
    FI(ks_media_cfg, fetch_timeout_ms, 100, 600000),
    FI(ks_media_cfg, fetch_max_redirects, 0, 10),
};

/* store.tiers.redis.tls (rediss:// only: cmd_serve.c checks the whole with
 * ks_redis_cfg_prepare once the flags are applied). */
static const field k_redis_tls_fields[] = {
    FS(ks_redis_tls_cfg, ca_file, F_PATH),
    FS(ks_redis_tls_cfg, ca_dir, F_PATH),
    FS(ks_redis_tls_cfg, cert_file, F_PATH),
    FS(ks_redis_tls_cfg, key_file, F_PATH),
    FS(ks_redis_tls_cfg, server_name, F_STR),
    FB(ks_redis_tls_cfg, verify),
};

static const field k_spec_fields[] = {
    FS(ks_spec_cfg, type, F_STR),
    FI(ks_spec_cfg, draft_max, 1, KS_CONFIG_DRAFT_MAX),
    FI(ks_spec_cfg, draft_min, 0, KS_CONFIG_DRAFT_MAX),
    {"ngram_simple_size_n", F_INT, offsetof(ks_spec_cfg, ngram_size_n[0]), 0, 1, 1024},
    {"ngram_simple_size_m", F_INT, offsetof(ks_spec_cfg, ngram_size_m[0]), 0, 1, 1024},
    {"ngram_simple_min_hits", F_INT, offsetof(ks_spec_cfg, ngram_min_hits[0]), 0, 1, 65535},
    {"ngram_map_k_size_n", F_INT, offsetof(ks_spec_cfg, ngram_size_n[1]), 0, 1, 1024},
    {"ngram_map_k_size_m", F_INT, offsetof(ks_spec_cfg, ngram_size_m[1]), 0, 1, 1024},
    {"ngram_map_k_min_hits", F_INT, offsetof(ks_spec_cfg, ngram_min_hits[1]), 0, 1, 65535},
    {"ngram_map_k4v_size_n", F_INT, offsetof(ks_spec_cfg, ngram_size_n[2]), 0, 1, 1024},
    {"ngram_map_k4v_size_m", F_INT, offsetof(ks_spec_cfg, ngram_size_m[2]), 0, 1, 1024},
    {"ngram_map_k4v_min_hits", F_INT, offsetof(ks_spec_cfg, ngram_min_hits[2]), 0, 1, 65535},
    FI(ks_spec_cfg, ngram_mod_n_match, 1, 1024),
    FI(ks_spec_cfg, ngram_mod_n_min, 0, 1024),
    FI(ks_spec_cfg, ngram_mod_n_max, 0, 1024),
    FB(ks_spec_cfg, adaptive),
    FS(ks_spec_cfg, draft_model, F_PATH),
    FF(ks_spec_cfg, draft_p_min, 0, 1),
    FS(ks_spec_cfg, draft_gpu_layers, F_STR),
};

/* ------------------------------------------------------------ sections */
/* A mapping of plain fields: key -> the table's field of ud. */
static int table_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn, void *ud,
                      const field *tab, size_t n) {
    const field *f = ks__cfg_find_field(tab, n, key);
    if (!f) return ks__cfg_fail_unknown(w, path, key, kn);
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    return ks__cfg_set_field(w, full, f, vn, ud);
}

static int spec_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn, void *ud) {
    return table_pair(w, path, key, kn, vn, ud, k_spec_fields, N_FIELDS(k_spec_fields));
}

typedef struct model_ud {
    ks_model_cache_cfg *m;
    bool has_slots;
} model_ud;

/* aliases: a sequence of names or glob patterns (or one as a scalar). */
static int model_aliases(walk *w, const char *path, yaml_node_t *vn, ks_model_cache_cfg *m) {
    bool seq = vn->type == YAML_SEQUENCE_NODE;
    if (!seq && !ks__cfg_scalar_of(vn)) return ks__cfg_type_error(w, path, vn, "a list of names");
    ptrdiff_t n_items = seq ? vn->data.sequence.items.top - vn->data.sequence.items.start : 1;
    if (n_items > KS_CONFIG_ALIASES_MAX) {
        ks_set_err(w->err, w->errlen, "'%s' at line %d: at most %d aliases", path, line_of(vn), KS_CONFIG_ALIASES_MAX);
        return KS_EINVAL;
    }
    memset(m->aliases, 0, sizeof m->aliases);
    for (int i = 0; i < (int)n_items; i++) {
        yaml_node_t *item = seq ? yaml_document_get_node(w->doc, vn->data.sequence.items.start[i]) : vn;
        char full[544];
        snprintf(full, sizeof full, "%s[%d]", path, i);
        const char *s = item ? ks__cfg_scalar_of(item) : NULL;
        if (!s || !s[0] || strlen(s) != item->data.scalar.length || strlen(s) >= sizeof m->aliases[i])
            return ks__cfg_type_error(w, full, item ? item : vn, "a name or pattern of 1..127 bytes");
        memcpy(m->aliases[i], s, strlen(s) + 1);
    }
    m->n_aliases = (int)n_items;
    return 0;
}

static int model_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn,
                      void *ud) {
    model_ud *mu = ud;
    if (strcmp(key, "aliases") == 0) {
        char full[512];
        ks__cfg_join(full, sizeof full, path, key);
        return model_aliases(w, full, vn, mu->m);
    }
    if (strcmp(key, "exact") == 0) {
        /* three states: absent (the top-level exact), true, false */
        const char *s = ks__cfg_scalar_of(vn);
        char full[512];
        ks__cfg_join(full, sizeof full, path, key);
        if (s && (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on"))) mu->m->exact = 1;
        else if (s && (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off"))) mu->m->exact = 0;
        else return ks__cfg_type_error(w, full, vn, "true or false");
        return 0;
    }
    if (strcmp(key, "speculative") == 0) {
        char full[512];
        ks__cfg_join(full, sizeof full, path, key);
        if (!mu->m->has_spec) ks_config_spec_defaults(&mu->m->spec);
        mu->m->has_spec = true;
        return ks__cfg_each_pair(w, full, vn, spec_pair, &mu->m->spec);
    }
    const field *f = ks__cfg_find_field(k_model_fields, N_FIELDS(k_model_fields), key);
    if (!f) return ks__cfg_fail_unknown(w, path, key, kn);
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    int rc = ks__cfg_set_field(w, full, f, vn, mu->m);
    if (rc == 0 && strcmp(key, "slots") == 0) mu->has_slots = true;
    return rc;
}

static int models_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn,
                       void *ud) {
    ks_config *c = ud;
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    if (!*key || (int)strlen(key) >= MODEL_KEY_MAX) {
        ks_set_err(w->err, w->errlen, "'%s' at line %d: a model name must be 1..%d bytes",
                   full, line_of(kn), MODEL_KEY_MAX - 1);
        return KS_EINVAL;
    }
    /* An entry from an earlier file is updated in place, key by key. */
    int i = 0;
    while (i < c->n_models && strcmp(c->model_keys[i], key) != 0) i++;
    bool fresh = i == c->n_models;
    if (fresh && c->n_models >= N_MODELS_MAX) {
        ks_set_err(w->err, w->errlen, "'%s' at line %d: at most %d model entries", full,
                   line_of(kn), N_MODELS_MAX);
        return KS_EINVAL;
    }
    model_ud mu = {.m = &c->models[i], .has_slots = fresh ? false : c->model_has_slots[i]};
    if (fresh) ks__config_model_defaults(&c->models[i]);
    int rc = ks__cfg_each_pair(w, full, vn, model_pair, &mu);
    if (rc) return rc;
    if (fresh) {
        snprintf(c->model_keys[i], sizeof c->model_keys[i], "%s", key);
        c->n_models++;
    }
    c->model_has_slots[i] = mu.has_slots;
    return 0;
}

static int tier_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn,
                     void *ud) {
    int64_t *max_bytes = ud;
    if (strcmp(key, "max_bytes") != 0) return ks__cfg_fail_unknown(w, path, key, kn);
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    static const field f = {"max_bytes", F_BYTES, 0, 0, 0, KS_STORE_BYTES_MAX};
    return ks__cfg_set_field(w, full, &f, vn, max_bytes);
}

/* store.tiers.redis.reasons: a list of reason names (or one as a scalar),
 * replacing the default set. */
static int redis_reasons(walk *w, const char *path, yaml_node_t *vn, unsigned *mask) {
    bool seq = vn->type == YAML_SEQUENCE_NODE;
    if (!seq && !ks__cfg_scalar_of(vn)) return ks__cfg_type_error(w, path, vn, "a list of save reasons");
    ptrdiff_t n = seq ? vn->data.sequence.items.top - vn->data.sequence.items.start : 1;
    unsigned m = 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        yaml_node_t *item = seq ? yaml_document_get_node(w->doc, vn->data.sequence.items.start[i]) : vn;
        const char *s = item ? ks__cfg_scalar_of(item) : NULL;
        int r = ks_reason_parse(s);
        if (r < 0 || r == KS_REASON_PIN)
            return ks__cfg_type_error(w, path, item ? item : vn, "reasons among cold|continued|finish|evict|shutdown");
        m |= 1u << r;
    }
    *mask = m;
    return 0;
}

static int media_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn, void *ud) {
    return table_pair(w, path, key, kn, vn, ud, k_media_fields, N_FIELDS(k_media_fields));
}

static int redis_tls_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn, void *ud) {
    return table_pair(w, path, key, kn, vn, ud, k_redis_tls_fields, N_FIELDS(k_redis_tls_fields));
}

static int redis_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn, void *ud) {
    ks_store_cfg *s = ud;
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    if (strcmp(key, "tls") == 0) return ks__cfg_each_pair(w, full, vn, redis_tls_pair, &s->redis.tls);
    if (strcmp(key, "max_bytes") == 0) return tier_pair(w, path, key, kn, vn, &s->tier_max_bytes[KS_TIER_REDIS]);
    if (strcmp(key, "reasons") == 0) return redis_reasons(w, full, vn, &s->redis.reasons);
    const field *f = ks__cfg_find_field(k_redis_fields, N_FIELDS(k_redis_fields), key);
    if (!f) return ks__cfg_fail_unknown(w, path, key, kn);
    int rc = ks__cfg_set_field(w, full, f, vn, &s->redis);
    if (rc) return rc;
    if (strcmp(key, "url") == 0 && s->redis.url[0]) {
        ks_redis_url u;
        char why[256];
        if (ks_redis_url_parse(s->redis.url, &u, why, sizeof why) != 0) {
            ks_set_err(w->err, w->errlen, "'%s' at line %d: %s", full, line_of(vn), why);
            return KS_EINVAL;
        }
        memset(&u, 0, sizeof u); /* no copy of a password left behind */
    }
    if (strcmp(key, "key_prefix") == 0 && (!s->redis.key_prefix[0] || strpbrk(s->redis.key_prefix, " \t\r\n")))
        return ks__cfg_type_error(w, full, vn, "a non-empty prefix without spaces");
    return 0;
}

static int tiers_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn,
                      void *ud) {
    ks_store_cfg *s = ud;
    int t = ks_tier_parse(key);
    if (t < 0) return ks__cfg_fail_unknown(w, path, key, kn);
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    if (t == KS_TIER_REDIS) return ks__cfg_each_pair(w, full, vn, redis_pair, s);
    return ks__cfg_each_pair(w, full, vn, tier_pair, &s->tier_max_bytes[t]);
}

static int reasons_pair(walk *w, const char *path, const char *key, yaml_node_t *kn,
                        yaml_node_t *vn, void *ud) {
    ks_store_cfg *s = ud;
    int r = ks_reason_parse(key);
    if (r < 0) return ks__cfg_fail_unknown(w, path, key, kn);
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    const char *v = ks__cfg_scalar_of(vn);
    int t = ks_tier_parse(v);
    /* Redis takes saves besides a local tier: store.tiers.redis.reasons. */
    if (t == -2 || t == KS_TIER_REDIS) return ks__cfg_type_error(w, full, vn, "one of ram|shm|disk|none");
    s->reason_tier[r] = t;
    s->reasons_given |= 1u << r;
    return 0;
}

typedef struct store_ud {
    ks_store_cfg *s;
    bool enabled_given;
    bool other_given;
} store_ud;

static int store_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn,
                      void *ud) {
    store_ud *su = ud;
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    int rc;
    if (strcmp(key, "tiers") == 0) {
        rc = ks__cfg_each_pair(w, full, vn, tiers_pair, su->s);
    } else if (strcmp(key, "reasons") == 0) {
        rc = ks__cfg_each_pair(w, full, vn, reasons_pair, su->s);
    } else {
        const field *f = ks__cfg_find_field(k_store_fields, N_FIELDS(k_store_fields), key);
        if (!f) return ks__cfg_fail_unknown(w, path, key, kn);
        rc = ks__cfg_set_field(w, full, f, vn, su->s);
    }
    if (strcmp(key, "enabled") == 0) su->enabled_given = true;
    else su->other_given = true;
    return rc;
}

/* cors_origins: a sequence of origins (or one as a scalar), replacing any
 * earlier list whole: a later file says which origins, not which more. */
static int cors_origins(walk *w, const char *path, yaml_node_t *vn, ks_config *c) {
    bool seq = vn->type == YAML_SEQUENCE_NODE;
    if (!seq && !ks__cfg_scalar_of(vn)) return ks__cfg_type_error(w, path, vn, "a list of origins");
    ptrdiff_t n_items = seq ? vn->data.sequence.items.top - vn->data.sequence.items.start : 1;
    if (n_items > KS_CONFIG_CORS_MAX) {
        ks_set_err(w->err, w->errlen, "'%s' at line %d: at most %d origins", path, line_of(vn), KS_CONFIG_CORS_MAX);
        return KS_EINVAL;
    }
    /* Zeroed whole, so that equal lists compare equal byte for byte (config.c). */
    char list[KS_CONFIG_CORS_MAX][KS_CONFIG_ORIGIN_MAX];
    memset(list, 0, sizeof list);
    for (int i = 0; i < (int)n_items; i++) {
        yaml_node_t *item = seq ? yaml_document_get_node(w->doc, vn->data.sequence.items.start[i]) : vn;
        char full[512];
        snprintf(full, sizeof full, "%s[%d]", path, i);
        const char *s = item ? ks__cfg_scalar_of(item) : NULL;
        if (!s || strlen(s) != item->data.scalar.length)
            return ks__cfg_type_error(w, full, item ? item : vn, "an origin such as http://localhost:5173, or *");
        char why[256];
        if (ks_config_check_origin(s, why, sizeof why)) {
            ks_set_err(w->err, w->errlen, "'%s' at line %d: %s", full, line_of(item), why);
            return KS_EINVAL;
        }
        memcpy(list[i], s, strlen(s) + 1);
    }
    memcpy(c->cors_origins, list, sizeof list);
    c->n_cors_origins = (int)n_items;
    return 0;
}

/* api_keys: a sequence of keys (or one as a scalar), replacing any earlier
 * list whole. The server checks each key (keyring.h). */
static int api_keys(walk *w, const char *path, yaml_node_t *vn, ks_config *c) {
    bool seq = vn->type == YAML_SEQUENCE_NODE;
    if (!seq && !ks__cfg_scalar_of(vn)) return ks__cfg_type_error(w, path, vn, "a list of keys");
    ptrdiff_t n_items = seq ? vn->data.sequence.items.top - vn->data.sequence.items.start : 1;
    if (n_items > KS_CONFIG_KEYS_MAX) {
        ks_set_err(w->err, w->errlen, "'%s' at line %d: at most %d keys (use api_key_file for more)", path,
                   line_of(vn), KS_CONFIG_KEYS_MAX);
        return KS_EINVAL;
    }
    char list[KS_CONFIG_KEYS_MAX][256];
    memset(list, 0, sizeof list);
    for (int i = 0; i < (int)n_items; i++) {
        yaml_node_t *item = seq ? yaml_document_get_node(w->doc, vn->data.sequence.items.start[i]) : vn;
        char full[512];
        snprintf(full, sizeof full, "%s[%d]", path, i);
        const char *s = item ? ks__cfg_scalar_of(item) : NULL;
        if (!s || !s[0] || strlen(s) != item->data.scalar.length || strlen(s) >= sizeof list[i])
            return ks__cfg_type_error(w, full, item ? item : vn, "a key of 1..255 bytes");
        memcpy(list[i], s, strlen(s) + 1);
    }
    memcpy(c->api_keys, list, sizeof list);
    c->n_api_keys = (int)n_items;
    return 0;
}

/* The offload keys (base/offload.h), with the parsers the flags use:
 * gpu_layers (auto | all | N), devices ("CUDA0,CUDA1" | none), split_mode
 * (none | layer | row), tensor_split ([3, 1] or "3,1"), main_gpu,
 * kv_offload, op_offload. Returns 1 when key is none of them. */
static int offload_pair(walk *w, const char *key, yaml_node_t *vn, ks_offload *o) {
    const char *s = ks__cfg_scalar_of(vn);
    char why[256];
    if (strcmp(key, "gpu_layers") == 0) {
        if (!s || ks_offload_parse_layers(s, &o->n_gpu_layers, why, sizeof why))
            return ks__cfg_type_error(w, key, vn, "a layer count, auto or all");
        return 0;
    }
    if (strcmp(key, "split_mode") == 0) {
        if (!s || ks_offload_parse_split_mode(s, &o->split_mode, why, sizeof why))
            return ks__cfg_type_error(w, key, vn, "none, layer or row");
        return 0;
    }
    if (strcmp(key, "main_gpu") == 0) {
        long long v;
        if (!s || !ks__cfg_parse_i64(s, &v) || v < 0 || v >= KS_OFFLOAD_DEVICES_MAX)
            return ks__cfg_type_error(w, key, vn, "a device index 0..15");
        o->main_gpu = (int)v;
        return 0;
    }
    if (strcmp(key, "kv_offload") == 0 || strcmp(key, "op_offload") == 0) {
        if (!s || !ks__cfg_parse_bool(s, key[0] == 'k' ? &o->kv_offload : &o->op_offload))
            return ks__cfg_type_error(w, key, vn, "true or false");
        return 0;
    }
    if (strcmp(key, "devices") == 0) {
        if (!s || strlen(s) != vn->data.scalar.length || ks_offload_check_devices(s, why, sizeof why)) {
            if (s && strlen(s) == vn->data.scalar.length) {
                ks_set_err(w->err, w->errlen, "'%s' at line %d: %s", key, line_of(vn), why);
                return KS_EINVAL;
            }
            return ks__cfg_type_error(w, key, vn, "device names like CUDA0,CUDA1, or none");
        }
        snprintf(o->devices, sizeof o->devices, "%s", s);
        return 0;
    }
    if (strcmp(key, "tensor_split") == 0) {
        /* A sequence is joined into the flag's text: one parser for both. */
        char text[KS_OFFLOAD_DEVICES_MAX * 32] = "";
        if (vn->type == YAML_SEQUENCE_NODE) {
            ptrdiff_t n = vn->data.sequence.items.top - vn->data.sequence.items.start;
            for (ptrdiff_t i = 0; i < n; i++) {
                yaml_node_t *item = yaml_document_get_node(w->doc, vn->data.sequence.items.start[i]);
                const char *is = item ? ks__cfg_scalar_of(item) : NULL;
                size_t l = strlen(text);
                if (!is || strlen(is) > 24 || i >= KS_OFFLOAD_DEVICES_MAX)
                    return ks__cfg_type_error(w, key, item ? item : vn, "at most 16 proportions like [3, 1]");
                snprintf(text + l, sizeof text - l, "%s%s", i ? "," : "", is);
            }
        } else if (s && strlen(s) < sizeof text) {
            snprintf(text, sizeof text, "%s", s);
        } else {
            return ks__cfg_type_error(w, key, vn, "proportions like [3, 1]");
        }
        if (ks_offload_parse_tensor_split(text, o->tensor_split, &o->n_tensor_split, why, sizeof why)) {
            ks_set_err(w->err, w->errlen, "'%s' at line %d: %s", key, line_of(vn), why);
            return KS_EINVAL;
        }
        return 0;
    }
    return 1;
}

static int top_pair(walk *w, const char *path, const char *key, yaml_node_t *kn, yaml_node_t *vn,
                    void *ud) {
    ks_config *c = ud;
    int orc = offload_pair(w, key, vn, &c->offload);
    if (orc <= 0) return orc;
    if (strcmp(key, "cors_origins") == 0) return cors_origins(w, key, vn, c);
    if (strcmp(key, "api_keys") == 0) return api_keys(w, key, vn, c);
    if (strcmp(key, "models") == 0) return ks__cfg_each_pair(w, key, vn, models_pair, c);
    if (strcmp(key, "media") == 0) return ks__cfg_each_pair(w, key, vn, media_pair, &c->media);
    if (strcmp(key, "speculative") == 0) return ks__cfg_each_pair(w, key, vn, spec_pair, &c->spec);
    if (strcmp(key, "store") == 0) {
        store_ud su = {.s = &c->store};
        int rc = ks__cfg_each_pair(w, key, vn, store_pair, &su);
        /* Configuring any part of the store turns it on, unless the same
         * section says enabled: false. */
        if (rc == 0 && su.other_given && !su.enabled_given) c->store.enabled = true;
        return rc;
    }
    const field *f = ks__cfg_find_field(k_top_fields, N_FIELDS(k_top_fields), key);
    if (!f) return ks__cfg_fail_unknown(w, path, key, kn);
    return ks__cfg_set_field(w, key, f, vn, c);
}

/* ------------------------------------------------------------ loading */
static int load_text(ks_config *c, const char *text, size_t len, char *err, size_t errlen) {
    yaml_parser_t parser;
    yaml_document_t doc, extra;
    bool have_doc = false;
    int rc = 0;
    ks_config *tmp = NULL;

    if (!yaml_parser_initialize(&parser)) {
        ks_set_err(err, errlen, "out of memory");
        return KS_ENOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) goto syntax;
    have_doc = true;

    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        /* A second document would silently be ignored otherwise. */
        if (!yaml_parser_load(&parser, &extra)) goto syntax;
        bool more = yaml_document_get_root_node(&extra) != NULL;
        int extra_line = more ? (int)extra.start_mark.line + 1 : 0;
        yaml_document_delete(&extra);
        if (more) {
            ks_set_err(err, errlen, "a second YAML document at line %d (only one is read)",
                       extra_line);
            rc = KS_EINVAL;
            goto done;
        }
        if (root->type != YAML_MAPPING_NODE) {
            ks_set_err(err, errlen, "top level at line %d: expected a mapping of settings, got %s",
                       line_of(root),
                       root->type == YAML_SCALAR_NODE ? "a scalar" : ks__cfg_node_desc(root));
            rc = KS_EINVAL;
            goto done;
        }
        tmp = malloc(sizeof *tmp);
        if (!tmp) {
            ks_set_err(err, errlen, "out of memory");
            rc = KS_ENOMEM;
            goto done;
        }
        /* memcpy, not assignment: padding bytes are copied too, so a config
         * loaded from a file compares equal (memcmp) to the same text loaded
         * from a string. */
        memcpy(tmp, c, sizeof *tmp);
        walk w = {.doc = &doc, .err = err, .errlen = errlen};
        rc = ks__cfg_each_pair(&w, "", root, top_pair, tmp);
        if (rc == 0) memcpy(c, tmp, sizeof *c);
    }
    goto done;

syntax:
    ks_set_err(err, errlen, "YAML syntax error at line %d column %d: %s%s%s",
               (int)parser.problem_mark.line + 1, (int)parser.problem_mark.column + 1,
               parser.problem ? parser.problem : "unknown problem",
               parser.context ? " " : "", parser.context ? parser.context : "");
    rc = parser.error == YAML_MEMORY_ERROR ? KS_ENOMEM : KS_EINVAL;
done:
    free(tmp);
    if (have_doc) yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

int ks_config_load_string(ks_config *c, const char *yaml, char *err, size_t errlen) {
    if (!c || !yaml) {
        ks_set_err(err, errlen, "no configuration text");
        return KS_EINVAL;
    }
    return load_text(c, yaml, strlen(yaml), err, errlen);
}

int ks_config_load_file(ks_config *c, const char *path, char *err, size_t errlen) {
    if (!c || !path) {
        ks_set_err(err, errlen, "no configuration file");
        return KS_EINVAL;
    }
    int rc = 0;
    char *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        ks_set_err(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT ? KS_ENOENT : KS_EIO;
    }
    text = malloc(MAX_FILE_BYTES + 1);
    if (!text) {
        ks_set_err(err, errlen, "%s: out of memory", path);
        rc = KS_ENOMEM;
        goto done;
    }
    size_t n = fread(text, 1, MAX_FILE_BYTES + 1, f);
    if (ferror(f)) {
        int e = errno;
        ks_set_err(err, errlen, "%s: %s", path, strerror(e));
        rc = KS_EIO;
        goto done;
    }
    if (n > MAX_FILE_BYTES) {
        ks_set_err(err, errlen, "%s: larger than %d bytes", path, MAX_FILE_BYTES);
        rc = KS_EINVAL;
        goto done;
    }
    char msg[512] = "";
    rc = load_text(c, text, n, msg, sizeof msg);
    if (rc) ks_set_err(err, errlen, "%s: %s", path, msg);
done:
    free(text);
    fclose(f);
    return rc;
}


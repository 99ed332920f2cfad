/*
 * config.c — see config.h: defaults, paths, the store mode and the per-model
 * entries; the YAML file is read by config_yaml.c.
 *
 * Paths expand a leading `~` (or `~/`) to the home directory and $NAME or
 * ${NAME} to the environment variable; $USER, $HOME and $UID fall back to the
 * password database / getuid() when unset. Any other undefined variable is an
 * error: a path that silently lost a component would write the cache
 * somewhere unexpected.
 */
#include <ctype.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "config/config_int.h"

/* ------------------------------------------------------------ environment */
/* The home directory: $HOME, else the password database, else "/". */
const char *ks__config_home_dir(void) {
    const char *h = getenv("HOME");
    if (h && *h) return h;
    struct passwd *pw = getpwuid(getuid());
    return (pw && pw->pw_dir && *pw->pw_dir) ? pw->pw_dir : "/";
}

/* The value of variable name[0, n), with the fallbacks described above, or
 * NULL when undefined. num receives $UID's digits. */
static const char *env_value(const char *name, size_t n, char *num, size_t numlen) {
    char key[128];
    if (n == 0 || n >= sizeof key) return NULL;
    memcpy(key, name, n);
    key[n] = '\0';
    const char *v = getenv(key);
    if (v) return v;
    if (strcmp(key, "HOME") == 0) return ks__config_home_dir();
    if (strcmp(key, "USER") == 0) {
        struct passwd *pw = getpwuid(getuid());
        return pw ? pw->pw_name : NULL;
    }
    if (strcmp(key, "UID") == 0) {
        snprintf(num, numlen, "%u", (unsigned)getuid());
        return num;
    }
    return NULL;
}

/* Expands ~ and $VARS of in into out[outlen]. Returns 0, or -1 with why set. */
int ks__config_expand_path(const char *in, char *out, size_t outlen, char *why, size_t whylen) {
    ks_buf b = {0};
    int rc = 0;
    const char *p = in;
    if (p[0] == '~') {
        if (p[1] != '\0' && p[1] != '/') {
            ks_set_err(why, whylen, "~user is not supported");
            rc = -1;
            goto done;
        }
        const char *h = ks__config_home_dir();
        if (ks_buf_append(&b, h, strlen(h))) goto nomem;
        p++;
    }
    while (*p) {
        if (p[0] == '$' && (p[1] == '{' || isalpha((unsigned char)p[1]) || p[1] == '_')) {
            bool braced = p[1] == '{';
            const char *name = p + (braced ? 2 : 1);
            size_t n = 0;
            while (isalnum((unsigned char)name[n]) || name[n] == '_') n++;
            if (braced && name[n] != '}') {
                ks_set_err(why, whylen, "unterminated ${ in '%s'", in);
                rc = -1;
                goto done;
            }
            char num[32];
            const char *v = env_value(name, n, num, sizeof num);
            if (!v) {
                ks_set_err(why, whylen, "undefined variable $%.*s", (int)n, name);
                rc = -1;
                goto done;
            }
            if (ks_buf_append(&b, v, strlen(v))) goto nomem;
            p = name + n + (braced ? 1 : 0);
        } else {
            if (ks_buf_append(&b, p, 1)) goto nomem;
            p++;
        }
    }
    if (b.len + 1 > outlen) {
        ks_set_err(why, whylen, "path longer than %zu bytes", outlen - 1);
        rc = -1;
        goto done;
    }
    memcpy(out, b.s ? b.s : "", b.len + 1);
    goto done;
nomem:
    ks_set_err(why, whylen, "out of memory");
    rc = -1;
done:
    ks_buf_free(&b);
    return rc;
}

/* ------------------------------------------------------------ defaults */
/* Fills m in place (memset first): returning the struct by value would leave
 * its padding bytes unspecified, and configs are compared with memcmp. */
void ks_config_spec_defaults(ks_spec_cfg *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->type, sizeof s->type, "ngram-simple");
    s->draft_max = 16;
    s->draft_min = 0;
    for (int i = 0; i < 3; i++) {
        s->ngram_size_n[i] = 12; /* llama.cpp's */
        s->ngram_size_m[i] = 48;
        s->ngram_min_hits[i] = 1;
    }
    /* ngram-simple, the default type: a 3-token lookup drafting up to 8, by
     * measurement (docs/BENCHMARKS.md "Speculative decoding"): 1.12x the
     * decode of greedy replies on two cores where llama.cpp's 12/48 gave
     * 1.03x, and no cost at zero acceptance (the adaptive choice verifies
     * only what pays). */
    s->ngram_size_n[0] = 3;
    s->ngram_size_m[0] = 8;
    s->ngram_mod_n_match = 24;
    s->ngram_mod_n_min = 48;
    s->ngram_mod_n_max = 64;
    s->adaptive = true;
}

void ks__config_model_defaults(ks_model_cache_cfg *m) {
    memset(m, 0, sizeof *m);
    m->system_prompt_cache = false;
    m->incremental_cache = false;
    m->cache_min_tokens = 100;
    m->slots = 0;
    m->spc_max_bytes = 256LL << 20;
    m->exact = -1;
    m->ctx_checkpoints = -1;
}

void ks_config_defaults(ks_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8080;
    c->slots = 4;
    c->ctx = 4096;
    c->batch = 512;
    c->threads = 0;
    c->cache_prompt = true;
    c->exact = true;
    ks_offload_defaults(&c->offload);
    c->repack = true;
    c->affinity_min = 0.05f;
    c->ctx_checkpoints = 8;
    c->checkpoint_bytes = 32LL << 20;
    c->checkpoint_every = 16;
    c->max_queue = 64;
    c->max_renders = 2;
    c->max_body_bytes = 16777216;
    c->media = (ks_media_cfg){.max_bytes = 10LL << 20, .max_items = 32, .max_total_bytes = 32LL << 20,
                              .max_pixels = 16LL << 20, .fetch_timeout_ms = 10000,
                              .fetch_max_redirects = 3};
    snprintf(c->log, sizeof c->log, "info");
    ks__config_model_defaults(&c->cache);
    ks_config_spec_defaults(&c->spec);
    c->models_max = 4;
    c->models_memory = -1;
    c->models_autoload = true;

    ks_store_cfg *s = &c->store;
    ks_store_cfg_defaults(s);
    const char *xdg = getenv("XDG_CACHE_HOME");
    /* The XDG spec: a relative or empty value is invalid and is ignored. */
    if (xdg && xdg[0] == '/')
        snprintf(s->cache_dir, sizeof s->cache_dir, "%s/kvstash", xdg);
    else
        snprintf(s->cache_dir, sizeof s->cache_dir, "%s/.cache/kvstash", ks__config_home_dir());
    snprintf(s->shm_dir, sizeof s->shm_dir, "/dev/shm/kvstash-%u", (unsigned)getuid());
    c->n_models = 0;
}

/* ------------------------------------------------------------ store mode */
const char *ks_store_mode_name(ks_store_mode m) {
    switch (m) {
    case KS_STORE_RAM_ONLY: return "ram-only";
    case KS_STORE_FULL: return "full";
    default: return "off";
    }
}

ks_store_mode ks_config_store_plan(const ks_config *c, ks_store_cfg *out) {
    memcpy(out, &c->store, sizeof *out);
    /* No reuse at all: nothing would ever be looked up, and nothing saved. */
    if (!c->cache_prompt) return KS_STORE_OFF;
    if (c->store.enabled) return KS_STORE_FULL;
    if (c->store.tier_max_bytes[KS_TIER_RAM] <= 0) return KS_STORE_OFF;
    /* RAM only: no directory may be used, so none is named. */
    out->enabled = true;
    out->cache_dir[0] = '\0';
    out->shm_dir[0] = '\0';
    out->tier_max_bytes[KS_TIER_SHM] = 0;
    out->tier_max_bytes[KS_TIER_DISK] = 0;
    for (int r = 0; r < KS_REASON__N; r++)
        if (out->reason_tier[r] != KS_TIER_NONE) out->reason_tier[r] = KS_TIER_RAM;
    out->reason_tier[KS_REASON_SHUTDOWN] = KS_TIER_NONE; /* the RAM dies with the process */
    /* One process, its states only for its own slots: a conversation's state
     * is saved when another one takes its slot (evict), not after every
     * turn (finish) and every stride of a reply (continued). A save copies
     * the whole sequence's KV — on a GPU from device memory, 1.3 GB at 10K
     * tokens of an 8B model — on the inference thread, where every turn of
     * an agent's tool loop paid it for a state the slot still held
     * (docs/BENCHMARKS.md, GPU). Unless the configuration names them. */
    static const int lazy[] = {KS_REASON_FINISH, KS_REASON_CONTINUED};
    for (size_t i = 0; i < sizeof lazy / sizeof lazy[0]; i++)
        if (!(out->reasons_given & (1u << lazy[i]))) out->reason_tier[lazy[i]] = KS_TIER_NONE;
    return KS_STORE_RAM_ONLY;
}

/* ------------------------------------------------------------ CORS */
int ks_config_check_origin(const char *origin, char *why, size_t whylen) {
    size_t n = origin ? strlen(origin) : 0;
    if (n == 0) {
        ks_set_err(why, whylen, "an empty origin");
        return KS_EINVAL;
    }
    if (n >= KS_CONFIG_ORIGIN_MAX) {
        ks_set_err(why, whylen, "an origin longer than %d bytes", KS_CONFIG_ORIGIN_MAX - 1);
        return KS_EINVAL;
    }
    if (strcmp(origin, "*") == 0) return 0;
    if (strcasecmp(origin, "null") == 0) {
        ks_set_err(why, whylen, "the 'null' origin is refused: every sandboxed frame and file:// page sends "
                                "it (use * to allow any origin)");
        return KS_EINVAL;
    }
    const char *p = origin;
    if (!isalpha((unsigned char)*p)) goto bad;
    while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.') p++;
    if (strncmp(p, "://", 3) != 0) goto bad;
    p += 3;
    if (!*p) goto bad;
    /* The host and port: what a browser's Origin holds, so no path, query,
     * separator, space or non-ASCII byte (browsers send IDNs as punycode). */
    for (; *p; p++)
        if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f || strchr("/?#,\\", *p)) goto bad;
    return 0;
bad:
    ks_set_err(why, whylen, "'%.80s' is not an origin: scheme://host[:port] without a path or trailing slash "
                            "(e.g. http://localhost:5173), or *", origin);
    return KS_EINVAL;
}

/* ------------------------------------------------------------ per model */
static int find_model(const ks_config *c, const char *name, size_t n) {
    for (int i = 0; i < c->n_models; i++)
        if (strlen(c->model_keys[i]) == n && strncmp(c->model_keys[i], name, n) == 0) return i;
    return -1;
}

void ks_config_resolve_model(ks_config *c, const char *model_name, const char *model_file) {
    if (!c) return;
    int i = -1;
    if (model_name && *model_name) i = find_model(c, model_name, strlen(model_name));
    if (i < 0 && model_file && *model_file) {
        const char *base = strrchr(model_file, '/');
        base = base ? base + 1 : model_file;
        size_t n = strlen(base);
        i = find_model(c, base, n);
        if (i < 0 && n > 5 && strcasecmp(base + n - 5, ".gguf") == 0) i = find_model(c, base, n - 5);
    }
    if (i < 0) i = find_model(c, "default", 7);
    if (i < 0) {
        ks__config_model_defaults(&c->cache);
        KS_DEBUG("config", "no models entry for '%s': built-in cache defaults",
                 model_name ? model_name : "");
        return;
    }
    memcpy(&c->cache, &c->models[i], sizeof c->cache);
    if (c->model_has_slots[i]) c->slots = c->models[i].slots;
    if (c->models[i].has_spec) c->spec = c->models[i].spec;
    KS_DEBUG("config", "cache settings from models.%s", c->model_keys[i]);
}

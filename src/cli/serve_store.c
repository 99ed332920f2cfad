/*
 * serve_store.c — see serve_store.h.
 */
#include "cli/serve_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/redis_conn.h"
#include "cache/redis_fmt.h"
#include "engine/fingerprint.h"

#define CMD "kvstash serve"

/* The redis tier's settings as a whole, once the file and the flags are
 * applied: the URL, TLS settings only with rediss://, and the TLS files
 * (read and loaded now, so that a mistake stops the server before the model
 * loads rather than showing later as a tier that never connects). Returns
 * 0 or 2 (message printed). */
static int check_redis(const ks_config *c) {
    const ks_redis_cfg *rc = &c->store.redis;
    if (!rc->url[0]) {
        if (!ks_redis_tls_cfg_given(&rc->tls)) return 0;
        fprintf(stderr, CMD ": redis TLS settings (--cache-redis-tls-*, store.tiers.redis.tls) without a Redis "
                        "URL: give --cache-redis rediss://...\n");
        return 2;
    }
    ks_redis_url u;
    char err[512] = "";
    if (ks_redis_cfg_prepare(rc, &u, NULL, err, sizeof err) != 0) {
        fprintf(stderr, CMD ": %s\n", err);
        return 2;
    }
    memset(&u, 0, sizeof u); /* no copy of a password left behind */
    return 0;
}

/* The KV store for this engine, with the settings of ks_config_store_plan:
 * keys carry the model's fingerprint and the KV-shaping parameters, so states
 * of another model or context size are never found. The fingerprint is
 * cached in the disk tier's directory only when there is one (a RAM-only
 * store writes nothing). */
int ks_serve_store_fingerprint(const ks_config *c, const ks_store_cfg *sc, uint8_t fp[32], char *err, size_t errlen) {
    const char *fp_dir = sc->tier_max_bytes[KS_TIER_DISK] > 0 ? sc->cache_dir : NULL;
    return ks_model_fingerprint_cached(c->model, fp_dir, fp, NULL, err, errlen);
}

int ks_serve_store_open(const ks_config *c, const ks_store_cfg *sc, const ks_serve_secret *sec, const ks_engine *e,
                        const uint8_t *fp, ks_store **out) {
    ks_store_params sp = ks_store_params_default();
    sp.cfg = *sc;
    sp.mac = sec->on ? &sec->key : NULL;
    char err[512] = "";
    int rc = 0;
    if (fp) memcpy(sp.model_fp, fp, 32);
    else rc = ks_serve_store_fingerprint(c, sc, sp.model_fp, err, sizeof err);
    if (rc) {
        fprintf(stderr, CMD ": model fingerprint: %s\n", err[0] ? err : ks_strerror(rc));
        return rc;
    }
    char kv[1024];
    ks_engine_kv_params(e, kv, sizeof kv);
    sp.kv_params = kv;
    sp.kv_params_len = strlen(kv);
    sp.state_version = ks_engine_state_version();
    rc = ks_store_open(&sp, out, err, sizeof err);
    if (rc) fprintf(stderr, CMD ": cannot open the KV store: %s\n", err[0] ? err : ks_strerror(rc));
    /* warm start: the file tiers' read buffers faulted in before /health */
    else ks_store_prewarm(*out, ks_engine_state_bytes_max(e));
    return rc;
}

int ks_serve_store_check(const ks_config *c, ks_serve_secret *sec) {
    memset(sec, 0, sizeof *sec);
    int rc = check_redis(c);
    if (rc) return rc;
    char err[512] = "";
    const char *env = getenv(KS_KVMAC_ENV);
    if (c->store.secret_file[0]) {
        if (ks_kvmac_key_load_file(c->store.secret_file, &sec->key, err, sizeof err) != 0) {
            fprintf(stderr, CMD ": %s\n", err);
            return 2;
        }
        snprintf(sec->from, sizeof sec->from, "the cache secret file");
    } else if (env && env[0]) {
        if (ks_kvmac_key_from_secret(env, strlen(env), &sec->key) != 0) {
            fprintf(stderr, CMD ": $" KS_KVMAC_ENV ": the secret must be %u to %u bytes\n", KS_KVMAC_SECRET_MIN,
                    KS_KVMAC_SECRET_MAX);
            return 2;
        }
        snprintf(sec->from, sizeof sec->from, "$" KS_KVMAC_ENV);
    } else {
        return 0;
    }
    sec->on = true;
    return 0;
}

void ks_serve_store_report(const ks_config *c, const ks_store_cfg *sc, const ks_store *store,
                           const ks_serve_secret *sec) {
    const ks_store_cfg *given = &c->store;
    bool redis_given = given->redis.url[0] != '\0';
    /* Tiers turned off by another setting: one line each, never silence. */
    if (!store) {
        const char *why = !c->cache_prompt ? "--no-cache-prompt (cache_prompt: false) turns every cache off"
                                           : "--cache-ram 0 (store.tiers.ram.max_bytes: 0) without --cache-dir or "
                                             "store.enabled turns the KV store off";
        if (given->enabled)
            KS_WARN("serve", "prompt caching is off: the KV store (%s) is not opened: %s", given->cache_dir, why);
        if (redis_given)
            KS_WARN("serve", "the redis tier (--cache-redis, store.tiers.redis.url) is not used: %s", why);
        if (sec->on) KS_WARN("serve", "the cache secret (%s) is not used: no KV store is opened", sec->from);
        return;
    }
    if (redis_given && sc->tier_max_bytes[KS_TIER_REDIS] <= 0)
        KS_WARN("serve", "the redis tier (--cache-redis, store.tiers.redis.url) is not used: "
                         "store.tiers.redis.max_bytes is 0");
    bool shm = sc->shm_dir[0] && sc->tier_max_bytes[KS_TIER_SHM] > 0;
    bool redis = redis_given && sc->tier_max_bytes[KS_TIER_REDIS] > 0;
    if (shm) {
        char def[KS_MAX_PATH];
        ks_store_default_dirs(NULL, def);
        bool is_default = strcmp(def, sc->shm_dir) == 0;
        KS_INFO("serve", "store: shm tier %s%s is shared with every kvstash process of uid %ld on this host that "
                "uses it (any model and settings: states are apart only by their keys)",
                sc->shm_dir, is_default ? " (the default)" : "", (long)getuid());
        /* The default directory was not chosen for this server: where keys
         * or a secret say its states are not everyone's, say whom it still
         * shares them with (docs/SECURITY.md "Who shares the shm directory"). */
        bool keys = c->api_key[0] || c->n_api_keys > 0 || c->api_key_file[0];
        if (is_default && keys)
            KS_WARN("serve", "store: the default shm tier %s is shared with every kvstash process of uid %ld on this "
                    "host: one without keys, or with a key or tenant name of this server's, on the same model, shares "
                    "the cached prompts of this server's tenants (hits, cache fields, timing); give store.shm_dir a "
                    "directory of this server's own (docs/SECURITY.md)", sc->shm_dir, (long)getuid());
        if (is_default && sec->on)
            KS_WARN("serve", "store: the default shm tier %s is shared with every kvstash process of uid %ld on this "
                    "host: the entries those without this cache secret write there are refused here, counted corrupt "
                    "and quarantined; give store.shm_dir a directory of this server's own (docs/SECURITY.md)",
                    sc->shm_dir, (long)getuid());
    }
    if (sec->on) {
        KS_INFO("serve", "store: stored states are authenticated (Poly1305 under the secret from %s); entries "
                "without a valid tag are refused", sec->from);
    } else if (shm || redis) {
        char where[KS_MAX_PATH + 64] = "";
        snprintf(where, sizeof where, "%s%s%s", shm ? sc->shm_dir : "", shm && redis ? " or " : "",
                 redis ? "the Redis" : "");
        KS_WARN("serve", "store: no cache secret: whoever can write %s controls this server's output (states are "
                "checksummed, not authenticated); give --cache-secret-file or $" KS_KVMAC_ENV " (docs/SECURITY.md)",
                where);
    }
}

void ks_serve_store_desc(const ks_store_cfg *sc, const ks_store *store, ks_store_mode mode, char *out, size_t n) {
    snprintf(out, n, "off");
    if (store && mode == KS_STORE_RAM_ONLY)
        snprintf(out, n, "ram-only (%.0f MiB)", (double)sc->tier_max_bytes[KS_TIER_RAM] / 1048576.0);
    else if (store)
        snprintf(out, n, "on at %s", sc->cache_dir);
    if (store && sc->redis.url[0] && sc->tier_max_bytes[KS_TIER_REDIS] > 0) {
        char where[KS_REDIS_URL_MAX];
        ks_redis_url_redact(sc->redis.url, where, sizeof where);
        size_t l = strlen(out);
        snprintf(out + l, n - l, " + redis %.200s", where);
    }
}

/*
 * serve_store.h — `kvstash serve`'s KV store: its settings checked before
 * the model loads (the Redis URL and TLS files, the cache secret), the store
 * opened for the engine, and the start-up lines that say what the store
 * shares and with whom.
 *
 * The rule for settings that contradict each other (docs/SERVER.md "Settings
 * that turn a tier off"): a setting that only means something with a tier
 * that is not given at all (Redis TLS files without a Redis URL; a cache
 * secret that cannot be read) is an error, exit 2, before the model loads; a
 * tier that is given but turned off by another setting (--no-cache-prompt,
 * --cache-ram 0 without the full store, a budget of 0) is not opened, and one
 * warning line names the tier and the setting that turned it off. Nothing is
 * ignored without a line.
 *
 * Thread model: the main thread of `kvstash serve`, before and after the
 * server runs.
 */
#ifndef KS_SERVE_STORE_H
#define KS_SERVE_STORE_H

#include <stdbool.h>

#include "cache/kvmac.h"
#include "cache/store.h"
#include "config/config.h"
#include "engine/engine.h"

/* The cache secret, once read (never logged, never printed). */
typedef struct ks_serve_secret {
    ks_kvmac_key key;
    bool on;
    char from[64]; /* "--cache-secret-file" / "store.secret_file" / "$KVSTASH_CACHE_SECRET" */
} ks_serve_secret;

/* Checks the Redis settings (ks_redis_cfg_prepare) and reads the cache
 * secret: c->store.secret_file (the flag or the YAML key), else
 * $KVSTASH_CACHE_SECRET. Returns 0, or 2 with the reason printed. */
int ks_serve_store_check(const ks_config *c, ks_serve_secret *sec);

/* Opens the store of mode settings sc for engine e (model fingerprint, KV
 * params, state version; sec's key when on). fp: the model's fingerprint
 * when the caller computed it (ks_serve_store_fingerprint), NULL: computed
 * here. 0 or a KS_E* code (printed). */
int ks_serve_store_open(const ks_config *c, const ks_store_cfg *sc, const ks_serve_secret *sec, const ks_engine *e,
                        const uint8_t *fp, ks_store **out);
/* The fingerprint ks_serve_store_open keys the store with (cached in the
 * disk tier's directory when there is one): 0, or a KS_E* code with err. */
int ks_serve_store_fingerprint(const ks_config *c, const ks_store_cfg *sc, uint8_t fp[32], char *err, size_t errlen);

/* "off", "ram-only (N MiB)" or "on at DIR", with " + redis URL" (password
 * redacted) when the redis tier is on: the store in the start-up line. */
void ks_serve_store_desc(const ks_store_cfg *sc, const ks_store *store, ks_store_mode mode, char *out, size_t n);

/* The start-up lines about the store (see the rule above): tiers turned off
 * by another setting, whom the shm directory is shared with, and whether
 * stored states are authenticated. store: the open store or NULL. */
void ks_serve_store_report(const ks_config *c, const ks_store_cfg *sc, const ks_store *store,
                           const ks_serve_secret *sec);

#endif

/*
 * auth.c — who may use a route (server_int.h): the API keys and the tenant
 * each stands for (keyring.h), and /metrics, which shows every tenant's
 * counters together.
 *
 * /metrics (docs/SECURITY.md "Tenants"): with several tenants, a tenant's
 * key does not open it — its hit, miss and eviction counts are every
 * tenant's, and a key holder reading them learns when others hit — only the
 * metrics key does (--metrics-key, metrics_key), kept apart from the API
 * keys as an operator's. With one tenant or none, any key that opens the
 * API opens /metrics as before, and so does the metrics key when one is
 * set; on a server without API keys a metrics key alone guards /metrics.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/keyring.h"
#include "server/server_int.h"

int ks__auth_open(ks_server *s, const ks_server_params *p, char *err, size_t errlen) {
    const char *keys[1 + 64];
    int n_keys = 0;
    if (p->n_api_keys > 64) {
        ks_set_err(err, errlen, "more than 64 API keys: use a key file");
        return KS_EINVAL;
    }
    if (p->api_key && p->api_key[0]) keys[n_keys++] = p->api_key;
    for (int i = 0; i < p->n_api_keys && p->api_keys; i++) keys[n_keys++] = p->api_keys[i];
    int rc = ks_keyring_create(keys, n_keys, p->api_key_file, &s->keys, err, errlen);
    if (!rc && p->metrics_key && p->metrics_key[0]) {
        const char *mk[1] = {p->metrics_key};
        char e2[128];
        if ((rc = ks_keyring_create(mk, 1, NULL, &s->metrics_keys, e2, sizeof e2)))
            ks_set_err(err, errlen, "the metrics key: %s", e2);
        /* Every tenant's counters behind a tenant's own key: refused, at
         * start and in every re-read of the key file. */
        else
            rc = ks_keyring_forbid(s->keys, p->metrics_key, err, errlen);
    }
    if (rc) return rc;
    s->tenant_by = p->tenant_by;
    int nk = ks_keyring_count(s->keys);
    bool file = p->api_key_file && p->api_key_file[0];
    s->tenants = nk > 1 || file;
    if (nk || file || p->tenant_by)
        KS_INFO("auth", "%d API key(s)%s%s%s: %s%s%s%s", nk, file ? " (key file " : "", file ? p->api_key_file : "",
                file ? ")" : "", s->tenants ? "a tenant per key (or name)" : "one tenant",
                p->tenant_by & KS_TENANT_BY_PROMPT_CACHE_KEY ? ", split by prompt_cache_key" : "",
                p->tenant_by & KS_TENANT_BY_CACHE_SALT ? ", split by cache_salt" : "",
                p->tenant_by & KS_TENANT_BY_USER ? ", split by user" : "");
    if (s->tenants)
        KS_INFO("auth", "/metrics shows every tenant's counters: %s", s->metrics_keys
                    ? "it answers the metrics key only"
                    : "no metrics key (--metrics-key, metrics_key), so it answers no one (403)");
    else if (s->metrics_keys)
        KS_INFO("auth", "/metrics answers the metrics key%s", nk ? " and the API key" : " only");
    return 0;
}

/* The key a request carries: Authorization: Bearer KEY, else X-Api-Key. */
static const char *given_key(struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *key = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        key = h + 7;
        while (*key == ' ') key++;
    }
    return key ? key : MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
}

int ks__auth_check(ks_server *s, struct MHD_Connection *c, bool metrics, bool *given, uint64_t *tenant) {
    const char *key = given_key(c);
    uint64_t t = 0;
    *tenant = 0;
    *given = key != NULL;
    if (metrics && s->metrics_keys && key && ks_keyring_check(s->metrics_keys, key, &t)) return 0;
    if (!ks_keyring_required(s->keys)) return metrics && s->metrics_keys ? 401 : 0;
    if (!key || !ks_keyring_check(s->keys, key, tenant)) return 401;
    return metrics && s->tenants ? 403 : 0;
}

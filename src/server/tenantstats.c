/*
 * tenantstats.c — see tenantstats.h. An open-addressing table keyed by the
 * tenant id (ids are hashes, never 0: 0 marks an empty row; tenant 0, the
 * single tenant of a server without keys, is kept in a row of its own).
 */
#include "server/tenantstats.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct row {
    uint64_t tenant; /* 0: empty */
    ks_tenant_usage u;
} row;

struct ks_tenantstats {
    pthread_mutex_t mu;
    row rows[2 * KS_TENANTSTATS_MAX]; /* at most half full */
    int n;
    ks_tenant_usage zero;     /* tenant 0 */
    bool zero_used;
    ks_tenant_usage overflow; /* tenants beyond KS_TENANTSTATS_MAX */
    bool overflow_used;
};

ks_tenantstats *ks_tenantstats_create(void) {
    ks_tenantstats *t = calloc(1, sizeof *t);
    if (t) pthread_mutex_init(&t->mu, NULL);
    return t;
}

void ks_tenantstats_free(ks_tenantstats *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Under mu: tenant's row, made when make and there is room; NULL otherwise. */
static ks_tenant_usage *find(ks_tenantstats *t, uint64_t tenant, bool make) {
    if (tenant == 0) {
        if (make) t->zero_used = true;
        return t->zero_used ? &t->zero : NULL;
    }
    size_t cap = sizeof t->rows / sizeof t->rows[0];
    size_t i = (size_t)(tenant ^ (tenant >> 29)) & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        if (t->rows[i].tenant == tenant) return &t->rows[i].u;
        if (t->rows[i].tenant == 0) break;
    }
    if (!make || t->n >= KS_TENANTSTATS_MAX) return NULL;
    t->rows[i].tenant = tenant;
    t->n++;
    return &t->rows[i].u;
}

void ks_tenantstats_add(ks_tenantstats *t, uint64_t tenant, int n_prompt, int n_cached, int n_generated) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    ks_tenant_usage *u = find(t, tenant, true);
    if (!u) {
        u = &t->overflow;
        t->overflow_used = true;
    }
    u->requests++;
    u->prompt_tokens += n_prompt > 0 ? (uint64_t)n_prompt : 0;
    u->cached_tokens += n_cached > 0 ? (uint64_t)n_cached : 0;
    u->generated_tokens += n_generated > 0 ? (uint64_t)n_generated : 0;
    pthread_mutex_unlock(&t->mu);
}

void ks_tenantstats_get(ks_tenantstats *t, uint64_t tenant, ks_tenant_usage *out) {
    memset(out, 0, sizeof *out);
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    ks_tenant_usage *u = find(t, tenant, false);
    if (u) *out = *u;
    pthread_mutex_unlock(&t->mu);
}

void ks_tenantstats_each(ks_tenantstats *t, void (*fn)(void *ud, uint64_t tenant, bool overflow,
                                                         const ks_tenant_usage *u),
                         void *ud) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    if (t->zero_used) fn(ud, 0, false, &t->zero);
    for (size_t i = 0; i < sizeof t->rows / sizeof t->rows[0]; i++)
        if (t->rows[i].tenant) fn(ud, t->rows[i].tenant, false, &t->rows[i].u);
    if (t->overflow_used) fn(ud, 0, true, &t->overflow);
    pthread_mutex_unlock(&t->mu);
}

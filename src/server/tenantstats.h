/*
 * tenantstats.h — each tenant's use of the server (issue 41): requests, prompt
 * tokens, the prompt tokens read from a cache, generated tokens, counted per
 * tenant id as generations finish.
 *
 * Two views. /metrics (the metrics key's, with several tenants) shows them
 * with a `tenant` label bounded by the operator: the key file's names, and
 * every other tenant (inline keys, unnamed lines, --tenant-by subdivisions,
 * tenants beyond the table) together as "other" — never a key or a raw id.
 * GET /tenant shows a key's own tenant, and nothing of another's.
 *
 * The table holds KS_TENANTSTATS_MAX tenants; later ones are counted in one
 * overflow row that only /metrics shows (as "other").
 *
 * Thread model: add and the reads take one mutex; any thread.
 */
#ifndef KS_TENANTSTATS_H
#define KS_TENANTSTATS_H

#include <stdbool.h>
#include <stdint.h>

#define KS_TENANTSTATS_MAX 1024

typedef struct ks_tenant_usage {
    uint64_t requests;          /* generations finished (each choice of n counts) */
    uint64_t prompt_tokens;
    uint64_t cached_tokens;     /* of the prompt tokens, read from a cache */
    uint64_t generated_tokens;
} ks_tenant_usage;

typedef struct ks_tenantstats ks_tenantstats;

ks_tenantstats *ks_tenantstats_create(void); /* NULL on ENOMEM */
void ks_tenantstats_free(ks_tenantstats *t); /* NULL: no-op */

/* One finished generation of tenant. */
void ks_tenantstats_add(ks_tenantstats *t, uint64_t tenant, int n_prompt, int n_cached, int n_generated);

/* tenant's own counts into *out (zeros when it has none). */
void ks_tenantstats_get(ks_tenantstats *t, uint64_t tenant, ks_tenant_usage *out);

/* Calls fn once per tenant in the table, and once with overflow set for the
 * tenants beyond it (when there are any), under the mutex: fn must not call
 * back into t. */
void ks_tenantstats_each(ks_tenantstats *t, void (*fn)(void *ud, uint64_t tenant, bool overflow,
                                                         const ks_tenant_usage *u),
                         void *ud);

#endif

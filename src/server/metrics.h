/*
 * metrics.h — /metrics in the Prometheus text exposition format (0.0.4).
 *
 * One registry, many sources: every module that has counters (the scheduler,
 * the HTTP layer, later the SPC / IMC / store) contributes one render
 * function, registered in one place (ks_server_start). A source writes its
 * families through the ks_prom writer, which emits the # HELP / # TYPE lines
 * and formats values, so no source hand-writes exposition syntax.
 *
 * Names: prefix `kvstash_`, base units (seconds, tokens), counters end in
 * `_total` (Prometheus naming conventions).
 *
 * Thread model: sources are added on one thread before the first render;
 * after that the registry is read-only and ks_metrics_render may run on any
 * number of threads at once (each source must be thread-safe).
 * ks_http_counters are lock-free atomics, safe from any thread.
 */
#ifndef KS_METRICS_H
#define KS_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/base.h"
#include "sched/sched.h"

/* ---------------------------------------------------------------- writer */
/* Writes into out; the first allocation failure is kept in rc and later calls
 * do nothing, so sources need not check every call. */
typedef struct ks_prom {
    ks_buf *out;
    int rc;
    const char *extra; /* NULL, or a label pair written into every sample, already
                          escaped: model="NAME" (several models) */
} ks_prom;

/* An unlabelled counter or gauge: HELP, TYPE and the sample. */
void ks_prom_counter(ks_prom *p, const char *name, const char *help, double v);
void ks_prom_gauge(ks_prom *p, const char *name, const char *help, double v);
/* A labelled family: the header once (type "counter" or "gauge"), then one
 * ks_prom_sample per label value. label may be NULL for no label; the value
 * is escaped (\\, \", \n). */
void ks_prom_family(ks_prom *p, const char *name, const char *type, const char *help);
void ks_prom_sample(ks_prom *p, const char *name, const char *label, const char *value, double v);

/* "NAME=\"VALUE\"" with VALUE escaped, into out (n bytes): for ks_prom.extra. */
void ks_prom_label_pair(char *out, size_t n, const char *name, const char *value);
/* The expositions parts[0, n) as one: each family's HELP and TYPE once, its
 * samples from every part together (a family split across the parts, as the
 * same source rendered for several models, is one group, as the format
 * requires). Appended to out: 0 or KS_ENOMEM. */
int ks_prom_merge(const ks_buf *parts, int n, ks_buf *out);
/* -------------------------------------------------------------- registry */
typedef void (*ks_metrics_fn)(void *ud, ks_prom *p);
typedef struct ks_metrics ks_metrics;

ks_metrics *ks_metrics_create(void);         /* NULL on ENOMEM */
void ks_metrics_free(ks_metrics *m);         /* NULL-safe; does not touch the sources' ud */
/* Adds a source (rendered in the order added). 0 or KS_ENOMEM. */
int ks_metrics_add(ks_metrics *m, ks_metrics_fn fn, void *ud);
/* Renders every source into out (appended). 0 or KS_ENOMEM. */
int ks_metrics_render(const ks_metrics *m, ks_buf *out);
/* ... with every sample carrying the label pair extra (ks_prom.extra; NULL: none). */
int ks_metrics_render_extra(const ks_metrics *m, const char *extra, ks_buf *out);

/* --------------------------------------------------------------- sources */
/* The scheduler's figures (kvstash_requests_total ... kvstash_queue_depth) and
 * its cache decisions (kvstash_cache_requests_total{mode}, IMC, SPC, store). */
void ks_metrics_sched(ks_prom *p, const ks_sched_stats *st);
/* The System Prompt Cache's own counters (kvstash_spc_*). ud: ks_spc. */
void ks_metrics_spc(void *ud, ks_prom *p);
/* The persistent store's counters (kvstash_store_*, by tier and reason). ud: ks_store. */
void ks_metrics_store(void *ud, ks_prom *p);

/* HTTP responses by status, counted by the server for every reply. */
#define KS_HTTP_STATUS_MIN 100
#define KS_HTTP_STATUS_MAX 599
typedef struct ks_http_counters {
    _Atomic uint64_t requests;
    _Atomic uint64_t by_status[KS_HTTP_STATUS_MAX - KS_HTTP_STATUS_MIN + 1];
    _Atomic uint64_t client_disconnects;
    _Atomic int connections; /* open now, each counted once from accept to close */
    _Atomic uint64_t media_items[2]; /* images [0] and audio clips [1] of parsed requests */
    _Atomic uint64_t media_bytes;    /* their decoded bytes */
    int64_t started_us; /* monotonic, set once before serving */
} ks_http_counters;

void ks_http_count(ks_http_counters *c, int status);
/* One parsed request's media: n_images, n_audio, bytes (decoded). */
void ks_http_count_media(ks_http_counters *c, int n_images, int n_audio, int64_t bytes);
/* kvstash_http_requests_total, kvstash_http_errors_total{code="4xx|5xx"},
 * kvstash_http_connections, kvstash_client_disconnects_total,
 * kvstash_media_items_total{kind}, kvstash_media_bytes_total,
 * kvstash_uptime_seconds. ud: ks_http_counters. */
void ks_metrics_http(void *ud, ks_prom *p);

#endif

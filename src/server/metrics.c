/*
 * metrics.c — see metrics.h.
 */
#include "server/metrics.h"

#include "cache/spc.h"
#include "cache/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- writer */
static void put(ks_prom *p, const char *s) {
    if (p->rc == 0) p->rc = ks_buf_append(p->out, s, strlen(s));
}

/* Integral values print as integers (exact up to 2^53); the rest with 9
 * significant digits; NaN / infinities with Prometheus' spellings. */
static void put_value(ks_prom *p, double v) {
    char b[48];
    if (isnan(v)) snprintf(b, sizeof b, "NaN");
    else if (isinf(v)) snprintf(b, sizeof b, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(b, sizeof b, "%.0f", v);
    else snprintf(b, sizeof b, "%.9g", v);
    put(p, b);
}

void ks_prom_family(ks_prom *p, const char *name, const char *type, const char *help) {
    if (p->rc) return;
    p->rc = ks_buf_printf(p->out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void ks_prom_sample(ks_prom *p, const char *name, const char *label, const char *value, double v) {
    put(p, name);
    if (label) {
        put(p, "{");
        put(p, label);
        put(p, "=\"");
        for (const char *c = value ? value : ""; *c; c++) {
            char e[3] = {*c, 0, 0};
            if (*c == '\\' || *c == '"') e[0] = '\\', e[1] = *c;
            else if (*c == '\n') e[0] = '\\', e[1] = 'n';
            put(p, e);
        }
        put(p, "\"");
        if (p->extra) {
            put(p, ",");
            put(p, p->extra);
        }
        put(p, "}");
    } else if (p->extra) {
        put(p, "{");
        put(p, p->extra);
        put(p, "}");
    }
    put(p, " ");
    put_value(p, v);
    put(p, "\n");
}

void ks_prom_counter(ks_prom *p, const char *name, const char *help, double v) {
    ks_prom_family(p, name, "counter", help);
    ks_prom_sample(p, name, NULL, NULL, v);
}

void ks_prom_gauge(ks_prom *p, const char *name, const char *help, double v) {
    ks_prom_family(p, name, "gauge", help);
    ks_prom_sample(p, name, NULL, NULL, v);
}

void ks_prom_label_pair(char *out, size_t n, const char *name, const char *value) {
    size_t k = 0;
    int w = snprintf(out, n, "%s=\"", name);
    if (w < 0 || (size_t)w >= n) {
        if (n) out[0] = '\0';
        return;
    }
    k = (size_t)w;
    for (const char *c = value ? value : ""; *c && k + 4 < n; c++) {
        if (*c == '\\' || *c == '"') out[k++] = '\\', out[k++] = *c;
        else if (*c == '\n') out[k++] = '\\', out[k++] = 'n';
        else out[k++] = *c;
    }
    out[k++] = '"';
    out[k] = '\0';
}

/* One family of a merge: its HELP and TYPE lines and its samples. */
typedef struct fam {
    char name[160];
    ks_buf head;
    ks_buf samples;
} fam;

int ks_prom_merge(const ks_buf *parts, int n, ks_buf *out) {
    fam *f = NULL;
    int nf = 0, cap = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const char *s = parts[i].s, *end = s ? s + parts[i].len : s;
        fam *cur = NULL;
        while (s && s < end && !rc) {
            const char *nl = memchr(s, '\n', (size_t)(end - s));
            size_t len = nl ? (size_t)(nl - s) + 1 : (size_t)(end - s);
            bool help = len > 7 && !strncmp(s, "# HELP ", 7);
            bool type = len > 7 && !strncmp(s, "# TYPE ", 7);
            if (help || type) {
                const char *nm = s + 7;
                size_t nn = strcspn(nm, " \n");
                cur = NULL;
                for (int k = 0; k < nf && !cur; k++)
                    if (strlen(f[k].name) == nn && !strncmp(f[k].name, nm, nn)) cur = &f[k];
                if (!cur) {
                    if (nf == cap) {
                        int nc = cap ? cap * 2 : 64;
                        fam *g = realloc(f, sizeof *f * (size_t)nc);
                        if (!g) {
                            rc = KS_ENOMEM;
                            break;
                        }
                        f = g;
                        cap = nc;
                    }
                    cur = &f[nf++];
                    memset(cur, 0, sizeof *cur);
                    snprintf(cur->name, sizeof cur->name, "%.*s", (int)nn, nm);
                    rc = ks_buf_append(&cur->head, s, len);
                } else if (cur->head.len == 0 || (type && !memmem(cur->head.s, cur->head.len, "# TYPE ", 7))) {
                    rc = ks_buf_append(&cur->head, s, len);
                }
            } else if (cur) {
                rc = ks_buf_append(&cur->samples, s, len);
            } else {
                rc = ks_buf_append(out, s, len); /* a sample before any family: as it came */
            }
            s += len;
        }
    }
    for (int k = 0; k < nf; k++) {
        if (!rc) rc = ks_buf_append(out, f[k].head.s ? f[k].head.s : "", f[k].head.len);
        if (!rc) rc = ks_buf_append(out, f[k].samples.s ? f[k].samples.s : "", f[k].samples.len);
        ks_buf_free(&f[k].head);
        ks_buf_free(&f[k].samples);
    }
    free(f);
    return rc;
}

/* -------------------------------------------------------------- registry */
struct ks_metrics {
    struct {
        ks_metrics_fn fn;
        void *ud;
    } *src;
    int n;
};

ks_metrics *ks_metrics_create(void) { return calloc(1, sizeof(ks_metrics)); }

void ks_metrics_free(ks_metrics *m) {
    if (!m) return;
    free(m->src);
    free(m);
}

int ks_metrics_add(ks_metrics *m, ks_metrics_fn fn, void *ud) {
    void *n = realloc(m->src, (size_t)(m->n + 1) * sizeof *m->src);
    if (!n) return KS_ENOMEM;
    m->src = n;
    m->src[m->n].fn = fn;
    m->src[m->n].ud = ud;
    m->n++;
    return 0;
}

int ks_metrics_render(const ks_metrics *m, ks_buf *out) { return ks_metrics_render_extra(m, NULL, out); }

int ks_metrics_render_extra(const ks_metrics *m, const char *extra, ks_buf *out) {
    ks_prom p = {out, 0, extra};
    for (int i = 0; i < m->n && p.rc == 0; i++) m->src[i].fn(m->src[i].ud, &p);
    /* An empty registry still yields a valid (empty) NUL-terminated body. */
    if (p.rc == 0 && !out->s) p.rc = ks_buf_append(out, "", 0);
    return p.rc;
}

/* --------------------------------------------------------------- sources */
void ks_metrics_sched(ks_prom *p, const ks_sched_stats *st) {
    ks_prom_counter(p, "kvstash_requests_total", "Generation requests finished by the scheduler (any outcome).",
                    (double)st->requests_total);
    ks_prom_counter(p, "kvstash_requests_rejected_total", "Requests refused because the queue was full.",
                    (double)st->requests_rejected);
    ks_prom_counter(p, "kvstash_requests_canceled_total",
                    "Requests canceled (client disconnected or shutdown).", (double)st->requests_canceled);
    ks_prom_counter(p, "kvstash_prompt_tokens_total", "Prompt tokens of all requests, cached or not.",
                    (double)st->prompt_tokens_total);
    ks_prom_counter(p, "kvstash_prompt_tokens_cached_total",
                    "Prompt tokens whose KV was reused instead of prefilled.",
                    (double)st->prompt_tokens_cached_total);
    ks_prom_counter(p, "kvstash_prompt_tokens_prefilled_total", "Prompt tokens actually prefilled.",
                    (double)(st->prompt_tokens_total - st->prompt_tokens_cached_total));
    ks_prom_gauge(p, "kvstash_cache_hit_ratio",
                  "Cached prompt tokens / prompt tokens since start (0 before the first request).",
                  st->prompt_tokens_total
                      ? (double)st->prompt_tokens_cached_total / (double)st->prompt_tokens_total
                      : 0.0);
    ks_prom_counter(p, "kvstash_prompt_seconds_total", "Time spent prefilling prompts.",
                    st->prompt_seconds_total);
    ks_prom_counter(p, "kvstash_tokens_predicted_total", "Tokens generated.",
                    (double)st->tokens_predicted_total);
    ks_prom_counter(p, "kvstash_predicted_seconds_total", "Time spent generating.",
                    st->predicted_seconds_total);
    ks_prom_counter(p, "kvstash_draft_tokens_total",
                    "Speculative decoding: drafted tokens verified (finished requests).",
                    (double)st->draft_tokens_total);
    ks_prom_counter(p, "kvstash_draft_accepted_total",
                    "Speculative decoding: drafted tokens accepted, each a token without a decode step of its own.",
                    (double)st->draft_accepted_total);
    ks_prom_counter(p, "kvstash_draft_steps_total", "Speculative decoding: decode steps that verified a draft.",
                    (double)st->draft_steps_total);
    ks_prom_gauge(p, "kvstash_slots_busy", "Slots running a request.", st->slots_busy);
    ks_prom_gauge(p, "kvstash_slots_total", "Slots (parallel sequences).", st->n_slots);
    ks_prom_gauge(p, "kvstash_queue_depth", "Requests waiting for a slot.", st->queue_depth);

    const ks_sched_cache_stats *c = &st->cache;
    /* How prompts were served. The scheduler counts the route decision once per
     * request; an SPC or store restore is counted besides, so the decisions do
     * not partition the requests. */
    ks_prom_family(p, "kvstash_cache_decisions_total", "counter",
                   "Cache decisions by kind (route modes once per request; spc and store restores besides).");
    ks_prom_sample(p, "kvstash_cache_decisions_total", "decision", "prefix", (double)c->mode_prefix);
    ks_prom_sample(p, "kvstash_cache_decisions_total", "decision", "imc-hash", (double)c->imc_hash_hits);
    ks_prom_sample(p, "kvstash_cache_decisions_total", "decision", "imc-token-prefix",
                   (double)c->imc_token_prefix_hits);
    ks_prom_sample(p, "kvstash_cache_decisions_total", "decision", "spc", (double)c->spc_hits);
    ks_prom_sample(p, "kvstash_cache_decisions_total", "decision", "store", (double)c->store_hits);
    ks_prom_sample(p, "kvstash_cache_decisions_total", "decision", "copy", (double)c->slot_copies);
    ks_prom_sample(p, "kvstash_cache_decisions_total", "decision", "miss", (double)c->mode_miss);
    ks_prom_counter(p, "kvstash_media_encodes_total", "Media chunks (images, audio) run through the projector.",
                    (double)c->media_encodes);
    ks_prom_counter(p, "kvstash_media_encode_seconds_total", "Time the projector took.", c->media_encode_ms_total / 1e3);
    ks_prom_counter(p, "kvstash_media_tokens_prefilled_total", "Media tokens decoded into a sequence (embeddings).",
                    (double)c->media_tokens_decoded);
    ks_prom_counter(p, "kvstash_media_tokens_reused_total", "Media tokens of prompts found in the cache, not encoded "
                    "again.", (double)c->media_tokens_reused);
    ks_prom_counter(p, "kvstash_imc_salvaged_tokens_total", "Tokens kept by IMC token-prefix salvage.",
                    (double)c->imc_salvaged_tokens);
    ks_prom_counter(p, "kvstash_slot_evictions_total", "Non-empty slots taken over for another branch.",
                    (double)c->evictions);
    ks_prom_counter(p, "kvstash_imc_rebuilds_total", "IMC branches built from scratch.", (double)c->rebuilds);
    ks_prom_counter(p, "kvstash_spc_misses_total", "System prompts the SPC had no state for.",
                    (double)c->spc_misses);
    ks_prom_counter(p, "kvstash_spc_builds_total", "System-prompt states captured into the SPC.",
                    (double)c->spc_builds);
    ks_prom_counter(p, "kvstash_spc_restored_tokens_total", "Tokens restored from the SPC.",
                    (double)c->spc_restored_tokens);
    ks_prom_counter(p, "kvstash_sys_prompt_prefills_total", "Requests whose system prompt was prefilled.",
                    (double)c->sys_prompt_prefills);
    ks_prom_counter(p, "kvstash_partial_rm_rebuilds_total",
                    "Sequences rebuilt because the memory could not drop a suffix.", (double)c->partial_rm_rebuilds);
    ks_prom_counter(p, "kvstash_checkpoint_saves_total", "Hybrid models: partial states taken as checkpoints.",
                    (double)c->ckpt_saves);
    ks_prom_counter(p, "kvstash_checkpoint_drops_total", "Checkpoints dropped for a slot's count or byte budget.",
                    (double)c->ckpt_drops);
    ks_prom_counter(p, "kvstash_checkpoint_restores_total", "Trims served by a checkpoint instead of a rebuild.",
                    (double)c->ckpt_restores);
    ks_prom_counter(p, "kvstash_checkpoint_restored_tokens_total", "Tokens kept by checkpoint restores.",
                    (double)c->ckpt_restored_tokens);
    ks_prom_counter(p, "kvstash_checkpoint_seconds_total", "Inference-thread time taking and setting checkpoints.",
                    c->ckpt_ms_total / 1e3);
    ks_prom_counter(p, "kvstash_slot_copied_tokens_total", "Tokens copied from another slot's sequence.",
                    (double)c->slot_copied_tokens);
    ks_prom_counter(p, "kvstash_store_restored_tokens_total", "Tokens restored from the persistent store.",
                    (double)c->store_restored_tokens);
    ks_prom_counter(p, "kvstash_store_restore_seconds_total", "Store lookup + read + verify + state set.",
                    c->store_restore_ms_total / 1e3);
    ks_prom_counter(p, "kvstash_warm_slots_total", "Slots that took a stored state at start (--warm-slots).",
                    (double)c->warm_slots);
    ks_prom_counter(p, "kvstash_warm_tokens_total", "Tokens those slots took at start.", (double)c->warm_tokens);
    ks_prom_family(p, "kvstash_store_save_requests_total", "counter", "States handed to the store, by save reason.");
    int n_reasons = (int)(sizeof c->store_save_requests / sizeof c->store_save_requests[0]);
    for (int r = 0; r < KS_REASON__N && r < n_reasons; r++)
        ks_prom_sample(p, "kvstash_store_save_requests_total", "reason", ks_reason_name((ks_reason)r),
                       (double)c->store_save_requests[r]);
    ks_prom_counter(p, "kvstash_snapshot_seconds_total", "Inference-thread time spent copying states.",
                    c->snapshot_ms_total / 1e3);
    ks_prom_counter(p, "kvstash_store_finish_saves_superseded_total",
                    "Finish saves not taken: the conversation's next request came first (store.finish_save_delay_ms).",
                    (double)c->finish_saves_superseded);
    ks_prom_gauge(p, "kvstash_store_deferred_saves", "Finish saves waiting for their delay (not yet requested).",
                  (double)c->deferred_saves);
    /* cache_control breakpoints (cache pins). */
    ks_prom_counter(p, "kvstash_cache_pins_saved_total", "Pinned prefix states handed to the store.",
                    (double)c->pin_saves);
    ks_prom_counter(p, "kvstash_cache_pins_refreshed_total", "Pins already held whose deadline was extended.",
                    (double)c->pin_refreshes);
    ks_prom_counter(p, "kvstash_cache_pins_rewound_total",
                    "Pins saved from inside a reused prefix (state copied, cut back, set again).",
                    (double)c->pin_rewinds);
    ks_prom_counter(p, "kvstash_cache_pins_failed_total", "Pins that could not be saved.", (double)c->pin_failures);
    ks_prom_counter(p, "kvstash_cache_pin_written_tokens_total", "Prompt tokens newly written for pins.",
                    (double)c->pin_written_tokens);
}

void ks_metrics_spc(void *ud, ks_prom *p) {
    ks_spc_stats st;
    ks_spc_get_stats(ud, &st);
    ks_prom_counter(p, "kvstash_spc_lookups_hit_total", "SPC lookups that found the system prompt.", (double)st.hits);
    ks_prom_counter(p, "kvstash_spc_lookups_miss_total", "SPC lookups that did not.", (double)st.misses);
    ks_prom_counter(p, "kvstash_spc_inserts_total", "System-prompt states stored.", (double)st.inserts);
    ks_prom_counter(p, "kvstash_spc_refused_total", "States refused by the byte budget.", (double)st.refused);
    ks_prom_counter(p, "kvstash_spc_evictions_total", "States evicted to make room.", (double)st.evictions);
    ks_prom_gauge(p, "kvstash_spc_entries", "System-prompt states held.", (double)st.entries);
    ks_prom_gauge(p, "kvstash_spc_bytes", "Bytes held by the SPC.", (double)st.bytes);
    ks_prom_gauge(p, "kvstash_spc_max_bytes", "SPC byte budget.", (double)st.max_bytes);
}

void ks_metrics_store(void *ud, ks_prom *p) {
    struct ks_store_stats st;
    ks_store_stats(ud, &st);
    ks_prom_counter(p, "kvstash_store_lookups_total", "Store lookups.", (double)st.lookups);
    ks_prom_counter(p, "kvstash_store_hits_total", "Store lookups that returned a state.", (double)st.hits);
    ks_prom_counter(p, "kvstash_store_misses_total", "Store lookups that did not.", (double)st.misses);
    const char *fam[][3] = {
        {"kvstash_store_tier_hits_total", "counter", "Lookups served by the tier."},
        {"kvstash_store_tier_bytes", "gauge", "Bytes in the tier (entries of other processes included)."},
        {"kvstash_store_tier_entries", "gauge", "States in the tier."},
        {"kvstash_store_tier_max_bytes", "gauge", "Tier budget (0: disabled)."},
        {"kvstash_store_tier_evictions_total", "counter", "States evicted from the tier."},
        {"kvstash_store_tier_pinned_bytes", "gauge", "Bytes of pinned states in the tier."},
        {"kvstash_store_tier_pinned_entries", "gauge", "Pinned states in the tier."},
        {"kvstash_store_tier_pin_drops_total", "counter",
         "Pinned states evicted before their deadline (beyond the tier's pin_share)."},
    };
    const uint64_t *val[] = {st.tier_hits,      st.tier_bytes,         st.tier_entries,
                             st.tier_max_bytes, st.tier_evictions,     st.tier_pinned_bytes,
                             st.tier_pinned_entries, st.tier_pin_drops};
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        ks_prom_family(p, fam[f][0], fam[f][1], fam[f][2]);
        for (int t = 0; t < KS_TIER__N; t++)
            ks_prom_sample(p, fam[f][0], "tier", ks_tier_name((ks_tier_id)t), (double)val[f][t]);
    }
    ks_prom_family(p, "kvstash_store_saves_total", "counter", "States written, by save reason.");
    for (int r = 0; r < KS_REASON__N; r++)
        ks_prom_sample(p, "kvstash_store_saves_total", "reason", ks_reason_name((ks_reason)r), (double)st.saves[r]);
    ks_prom_counter(p, "kvstash_store_saved_bytes_total", "Payload bytes written.", (double)st.saved_bytes);
    ks_prom_family(p, "kvstash_store_saves_not_written_total", "counter", "Saves not written, by cause.");
    ks_prom_sample(p, "kvstash_store_saves_not_written_total", "cause", "dedup", (double)st.dedup_saves);
    ks_prom_sample(p, "kvstash_store_saves_not_written_total", "cause", "small", (double)st.small_saves);
    ks_prom_sample(p, "kvstash_store_saves_not_written_total", "cause", "dropped", (double)st.dropped_saves);
    ks_prom_sample(p, "kvstash_store_saves_not_written_total", "cause", "skipped", (double)st.skipped_saves);
    ks_prom_sample(p, "kvstash_store_saves_not_written_total", "cause", "failed", (double)st.failed_saves);
    ks_prom_counter(p, "kvstash_store_corrupt_files_total", "Bad files met (never restored).",
                    (double)st.corrupt_files);
    ks_prom_counter(p, "kvstash_store_skipped_files_total",
                    "Store file names that were not regular files (FIFO, socket, directory, symlink): skipped, "
                    "never read.",
                    (double)st.skipped_files);
    ks_prom_counter(p, "kvstash_store_pending_hits_total",
                    "Hits served from a save the writer had not written yet (read your own writes).",
                    (double)st.pending_hits);
    ks_prom_counter(p, "kvstash_store_kv_type_misses_total",
                    "Misses that a stored state of other K/V cache types (-ctk/-ctv) would have served: "
                    "never restored, named in the reply's cache.reason",
                    (double)st.kv_type_misses);
    ks_prom_gauge(p, "kvstash_store_queued_saves", "Saves waiting for the writer thread or being written.", (double)st.queued);
    ks_prom_counter(p, "kvstash_store_load_seconds_total", "Reading and verifying hits.", st.load_ms_total / 1e3);
    ks_prom_counter(p, "kvstash_store_save_seconds_total", "Writing saves (writer thread).", st.save_ms_total / 1e3);
    if (!st.has_redis) return;
    /* The redis tier (tier.h): what a shared, remote tier adds to the per-tier families above. */
    const ks_tier_remote_stats *r = &st.redis;
    const struct {
        const char *name, *help;
        double v;
    } rc[] = {
        {"kvstash_store_redis_errors_total", "Failed Redis operations (connect, timeout, protocol).", (double)r->errors},
        {"kvstash_store_redis_dropped_saves_total",
         "Saves not sent to Redis: the tier was down (circuit breaker open), the queue full, or a failure.",
         (double)r->dropped_saves},
        {"kvstash_store_redis_broken_total",
         "Redis entries met with a missing chunk or a malformed manifest (a miss, never a restore).", (double)r->broken},
        {"kvstash_store_redis_round_trips_total", "Redis round trips (pipelines).", (double)r->ops},
        {"kvstash_store_redis_seconds_total", "Time spent in Redis round trips.", r->op_ms_total / 1e3},
        {"kvstash_store_redis_read_bytes_total", "kvfile bytes read from Redis (hits).", (double)r->bytes_read},
        {"kvstash_store_redis_written_bytes_total", "kvfile bytes written to Redis.", (double)r->bytes_written},
        {"kvstash_store_redis_breaker_opens_total", "Times the circuit breaker opened.", (double)r->breaker_opens},
        {"kvstash_store_redis_prefetches_total",
         "Requests whose submitting thread asked Redis for a longer prefix than the local tiers hold.",
         (double)st.prefetches},
        {"kvstash_store_redis_prefetched_total", "States those prefetches fetched from Redis.",
         (double)st.prefetch_fetched},
        {"kvstash_store_redis_prefetch_used_total", "Prefetched states a lookup took (restored).",
         (double)st.prefetch_used},
        {"kvstash_store_redis_prefetch_dropped_total",
         "Prefetched states dropped unused (too old, over the cap, or the slot held more).",
         (double)st.prefetch_dropped},
    };
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) ks_prom_counter(p, rc[i].name, rc[i].help, rc[i].v);
    ks_prom_gauge(p, "kvstash_store_redis_breaker_state", "Circuit breaker: 0 closed, 1 open (tier skipped), 2 half-open.",
                  (double)r->breaker);
}

void ks_http_count(ks_http_counters *c, int status) {
    atomic_fetch_add(&c->requests, 1);
    if (status >= KS_HTTP_STATUS_MIN && status <= KS_HTTP_STATUS_MAX)
        atomic_fetch_add(&c->by_status[status - KS_HTTP_STATUS_MIN], 1);
}

void ks_http_count_media(ks_http_counters *c, int n_images, int n_audio, int64_t bytes) {
    atomic_fetch_add(&c->media_items[0], (uint64_t)n_images);
    atomic_fetch_add(&c->media_items[1], (uint64_t)n_audio);
    atomic_fetch_add(&c->media_bytes, (uint64_t)bytes);
}

void ks_metrics_http(void *ud, ks_prom *p) {
    ks_http_counters *c = ud;
    ks_prom_counter(p, "kvstash_http_requests_total", "HTTP requests answered.",
                    (double)atomic_load(&c->requests));
    ks_prom_family(p, "kvstash_http_errors_total", "counter", "HTTP error responses by status code.");
    for (int s = 400; s <= KS_HTTP_STATUS_MAX; s++) {
        uint64_t n = atomic_load(&c->by_status[s - KS_HTTP_STATUS_MIN]);
        if (!n) continue;
        char code[8];
        snprintf(code, sizeof code, "%d", s);
        ks_prom_sample(p, "kvstash_http_errors_total", "code", code, (double)n);
    }
    ks_prom_gauge(p, "kvstash_http_connections", "Client connections open now.",
                  (double)atomic_load(&c->connections));
    ks_prom_counter(p, "kvstash_client_disconnects_total",
                    "Generations canceled because the client went away.",
                    (double)atomic_load(&c->client_disconnects));
    ks_prom_family(p, "kvstash_media_items_total", "counter",
                   "Images and audio clips in requests that parsed (each request's, counted once).");
    ks_prom_sample(p, "kvstash_media_items_total", "kind", "image", (double)atomic_load(&c->media_items[0]));
    ks_prom_sample(p, "kvstash_media_items_total", "kind", "audio", (double)atomic_load(&c->media_items[1]));
    ks_prom_counter(p, "kvstash_media_bytes_total", "Their bytes, decoded (the files as sent).",
                    (double)atomic_load(&c->media_bytes));
    ks_prom_gauge(p, "kvstash_uptime_seconds", "Seconds since the server started.",
                  c->started_us ? (double)(ks_now_us() - c->started_us) / 1e6 : 0.0);
}

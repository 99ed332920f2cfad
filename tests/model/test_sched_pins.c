/*
 * Model tests of cache pins (sched.h ks_cache_pin: Anthropic cache_control
 * breakpoints) on the generated tiny model: a pinned prefix is saved at its
 * exact position, a request restored from it gives bit-identical output and
 * logits; a pin within the reused prefix is saved by rewinding the sequence
 * (exact too), or by cutting the reuse back where the memory cannot drop a
 * suffix; n_cache_written / n_pinned for cold, already-pinned and rewound
 * pins; a pinned state outlives eviction pressure until its TTL, within
 * pin_share; invalid pins are refused; a pin on the disk tier outlives the
 * store. Every output is compared with an uncached run on a separate engine.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <limits.h>
#include <cmocka.h>

#include "cache/kvfile.h"
#include "cache/store.h"
#include "engine/engine.h"
#include "sched/sched.h"
#include "run_util.h"

#define N_BATCH 64
#define STRIDE 16
#define MAX_PROG 64

static ks_engine *g_ref_e;
static ks_sched *g_ref; /* 1 slot, no store: the uncached reference */

/* A run with its prefill progress and the first token's logits. run first:
 * run_on_token/run_on_done take the same pointer. */
typedef struct rec {
    run r;
    float *logits;
    int n_vocab;
    int prog[MAX_PROG];
    int n_prog;
} rec;

static void rec_progress(void *ud, int done, int total) {
    (void)total;
    rec *x = ud;
    if (x->n_prog < MAX_PROG) x->prog[x->n_prog] = done;
    x->n_prog++;
}

static void rec_done(void *ud, const ks_req_result *r) {
    rec *x = ud;
    if (r->logits) {
        x->logits = malloc(sizeof(float) * (size_t)r->n_vocab);
        if (x->logits) memcpy(x->logits, r->logits, sizeof(float) * (size_t)r->n_vocab);
        x->n_vocab = r->n_vocab;
    }
    run_on_done(ud, r);
}

static void rec_free(rec *x) {
    run_free(&x->r);
    free(x->logits);
    x->logits = NULL;
}

static ks_req_params req_for(const ks_tokens *prompt, const ks_cache_pin *pins, int n_pins, rec *x) {
    ks_req_params p = {0};
    p.tokens = prompt->v;
    p.n_tokens = prompt->n;
    p.max_tokens = 8;
    p.sample = ks_sample_params_default();
    p.cache_prompt = true;
    p.want_logits = true;
    p.preferred_slot = 0;
    p.pins = pins;
    p.n_pins = n_pins;
    p.on_token = run_on_token;
    p.on_progress = rec_progress;
    p.on_done = rec_done;
    p.ud = x;
    return p;
}

/* Runs prompt with pins on s and waits. */
static void ask(ks_sched *s, const ks_tokens *prompt, const ks_cache_pin *pins, int n_pins, bool cache, rec *x) {
    memset(x, 0, sizeof *x);
    run_init(&x->r);
    ks_req_params p = req_for(prompt, pins, n_pins, x);
    p.cache_prompt = cache;
    assert_int_equal(ks_sched_submit(s, &p, NULL), 0);
    run_wait(&x->r);
    assert_int_not_equal(x->r.res.finish, KS_FINISH_ERROR);
}

/* The output and the first token's logits equal the uncached run's, bit for bit. */
static void assert_exact(const ks_tokens *prompt, const rec *x) {
    rec ref;
    ks_sched_clear_slot(g_ref, 0);
    ask(g_ref, prompt, NULL, 0, false, &ref);
    assert_int_equal(x->r.out.n, ref.r.out.n);
    assert_memory_equal(x->r.out.v, ref.r.out.v, sizeof(int32_t) * (size_t)ref.r.out.n);
    assert_non_null(x->logits);
    assert_non_null(ref.logits);
    assert_int_equal(x->n_vocab, ref.n_vocab);
    assert_memory_equal(x->logits, ref.logits, sizeof(float) * (size_t)ref.n_vocab);
    rec_free(&ref);
}

/* n pseudo-random tokens (ids 10..409) from seed. */
static void fresh(ks_tokens *t, int n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        assert_int_equal(ks_tokens_push(t, (int32_t)(10 + (x >> 8) % 400)), 0);
    }
}

/* The longest stored prefix of prompt of at most max_len tokens (0: none). */
static int stored(ks_store *st, const ks_tokens *prompt, int max_len, ks_reason *why) {
    ks_store_hit h;
    int rc = ks_store_lookup(st, prompt->v, prompt->n, max_len, &h);
    int n = rc == 0 ? h.n_tokens : 0;
    if (rc == 0 && why) *why = h.reason;
    ks_store_hit_free(&h);
    return n;
}

/* ----------------------------------------------------------------- rigs */
/* An engine, a store and a 1-slot scheduler over them. */
typedef struct rig {
    ks_engine *e;
    ks_store *st;
    ks_sched *s;
} rig;

typedef struct rig_opts {
    int64_t ram_bytes;
    float pin_share;
    const char *disk;      /* full mode: the disk tier here, reason pin to it */
    int min_tokens;        /* the store's and the scheduler's */
    int stride;            /* the scheduler's cold-save stride (0: no cold saves) */
    bool no_partial_rm;    /* simulate_no_partial_rm */
    bool no_store;
} rig_opts;

static ks_engine *open_engine(void) {
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MODEL");
    ep.n_seq = 1;
    ep.n_ctx_seq = 2048;
    ep.n_batch = N_BATCH;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    char err[256] = "";
    int rc = ks_engine_open(&ep, &e, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    return rc ? NULL : e;
}

static void rig_open(rig *g, const rig_opts *o) {
    memset(g, 0, sizeof *g);
    g->e = open_engine();
    assert_non_null(g->e);
    if (!o->no_store) {
        ks_store_params p = ks_store_params_default();
        for (int t = 0; t < KS_TIER__N; t++) p.cfg.tier_max_bytes[t] = 0;
        p.cfg.tier_max_bytes[KS_TIER_RAM] = o->ram_bytes;
        p.cfg.stride = STRIDE;
        p.cfg.min_tokens = o->min_tokens;
        p.cfg.shutdown_timeout_ms = 30000;
        p.cfg.pin_share = o->pin_share;
        for (int r = 0; r < KS_REASON__N; r++) p.cfg.reason_tier[r] = KS_TIER_RAM;
        p.cfg.reason_tier[KS_REASON_SHUTDOWN] = KS_TIER_NONE;
        p.cfg.shm_dir[0] = '\0';
        if (o->disk) {
            snprintf(p.cfg.cache_dir, sizeof p.cfg.cache_dir, "%s", o->disk);
            p.cfg.tier_max_bytes[KS_TIER_DISK] = 256 << 20;
            /* Only pins are stored: every file is the pin's. */
            for (int r = 0; r < KS_REASON__N; r++) p.cfg.reason_tier[r] = KS_TIER_NONE;
            p.cfg.reason_tier[KS_REASON_PIN] = KS_TIER_DISK;
        }
        char kv[256];
        ks_engine_kv_params(g->e, kv, sizeof kv);
        p.kv_params = kv;
        p.kv_params_len = strlen(kv);
        p.state_version = ks_engine_state_version();
        memset(p.model_fp, 7, sizeof p.model_fp);
        char err[256] = "";
        if (ks_store_open(&p, &g->st, err, sizeof err) != 0) fail_msg("ks_store_open: %s", err);
    }
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g->e;
    sp.n_slots = 1;
    sp.store = g->st;
    sp.store_stride = o->stride;
    sp.store_min_tokens = o->min_tokens;
    sp.continued_interval = 0;
    sp.save_on_shutdown = false;
    sp.simulate_no_partial_rm = o->no_partial_rm;
    assert_int_equal(ks_sched_create(&sp, &g->s), 0);
}

static void rig_close(rig *g) {
    ks_sched_free(g->s);
    ks_store_close(g->st);
    ks_engine_free(g->e);
    memset(g, 0, sizeof *g);
}

static ks_sched_cache_stats sched_cst(const rig *g) {
    ks_sched_stats st;
    ks_sched_stats_get(g->s, &st);
    return st.cache;
}

/* Every state handed to the store is accounted for exactly once: written,
 * or not written with one cause (what the e2e tests' settleStore relies on),
 * pinned saves of two tiers included. */
static void assert_accounted(const rig *g) {
    assert_int_equal(ks_store_flush(g->st, 0), 0);
    ks_sched_cache_stats c = sched_cst(g);
    struct ks_store_stats ss;
    ks_store_stats(g->st, &ss);
    uint64_t asked = 0, done = ss.dedup_saves + ss.small_saves + ss.dropped_saves + ss.skipped_saves + ss.failed_saves;
    for (int r = 0; r < KS_REASON__N; r++) {
        asked += c.store_save_requests[r];
        done += ss.saves[r];
    }
    assert_int_equal(asked, done);
    assert_true(c.store_save_requests[KS_REASON_PIN] >= ss.saves[KS_REASON_PIN]);
}

/* The default rig: a big ram tier, and no save but the pins (min_tokens
 * above every prompt; pins ignore it). */
static const rig_opts k_pins_only = {.ram_bytes = 256 << 20, .pin_share = 0.5f, .min_tokens = 100000};

/* ---------------------------------------------------------------- tests */
/* (a), (d) cold and already pinned: a cold prefill cuts its chunks at the
 * pins (64 is the batch), saves the pins' states, and reports the deepest as
 * written; the same request again restores the pinned state (a verified
 * store hit) with bit-identical output and logits, and only refreshes. */
static void test_pin_saves_and_restores_exactly(void **st) {
    (void)st;
    rig g;
    rig_open(&g, &k_pins_only);
    ks_tokens a = {0};
    fresh(&a, 150, 1);
    ks_cache_pin pins[] = {{60, 300}, {100, 300}};
    rec x;
    ask(g.s, &a, pins, 2, true, &x);
    assert_int_equal(x.r.res.n_cached, 0);
    assert_int_equal(x.r.res.n_cache_written, 100);
    assert_int_equal(x.r.res.n_pinned, 100);
    assert_int_equal(x.n_prog, 3);
    assert_int_equal(x.prog[0], 60);
    assert_int_equal(x.prog[1], 100);
    assert_int_equal(x.prog[2], 150);
    assert_exact(&a, &x);
    assert_int_equal(ks_store_flush(g.st, 0), 0);
    ks_reason why = KS_REASON__N;
    assert_int_equal(stored(g.st, &a, a.n - 1, &why), 100);
    assert_int_equal(why, KS_REASON_PIN);
    assert_int_equal(stored(g.st, &a, 99, &why), 60);
    struct ks_store_stats ss;
    ks_store_stats(g.st, &ss);
    assert_int_equal(ss.saves[KS_REASON_PIN], 2);
    assert_int_equal(ss.tier_pinned_entries[KS_TIER_RAM], 2);
    assert_int_equal(ss.saves[KS_REASON_FINISH], 0); /* min_tokens: only the pins */
    ks_sched_cache_stats c = sched_cst(&g);
    assert_int_equal(c.pin_saves, 2);
    assert_int_equal(c.pin_written_tokens, 100);

    /* The same request on an empty slot: restored from the pin, exact. */
    ks_sched_clear_slot(g.s, 0);
    rec y;
    ask(g.s, &a, pins, 2, true, &y);
    assert_string_equal(y.r.res.cache_mode, "store");
    assert_string_equal(y.r.res.cache_tier, "ram");
    assert_int_equal(y.r.res.n_cached, 100);
    assert_int_equal(y.r.res.n_cache_written, 0);
    assert_int_equal(y.r.res.n_pinned, 100);
    assert_int_equal(y.n_prog, 1);
    assert_exact(&a, &y);
    assert_memory_equal(y.r.out.v, x.r.out.v, sizeof(int32_t) * (size_t)x.r.out.n);
    ks_store_stats(g.st, &ss);
    assert_int_equal(ss.saves[KS_REASON_PIN], 2); /* nothing written again */
    assert_int_equal(ss.pin_refreshes, 2);
    c = sched_cst(&g);
    assert_int_equal(c.pin_saves, 2);
    assert_int_equal(c.pin_refreshes, 2);
    assert_int_equal(c.pin_failures, 0);

    /* Without pins: nothing pinned, nothing written. */
    rec z;
    ask(g.s, &a, NULL, 0, true, &z);
    assert_int_equal(z.r.res.n_pinned, 0);
    assert_int_equal(z.r.res.n_cache_written, 0);
    /* A pin on the whole prompt is saved after the last chunk; a request
     * with it again only refreshes it. */
    ks_cache_pin whole[] = {{100, 60}, {150, 60}};
    rec w;
    ks_sched_clear_slot(g.s, 0);
    ask(g.s, &a, whole, 2, true, &w);
    assert_int_equal(w.r.res.n_cached, 100);
    assert_int_equal(w.r.res.n_cache_written, 50);
    assert_int_equal(w.r.res.n_pinned, 150);
    assert_exact(&a, &w);
    assert_int_equal(ks_store_flush(g.st, 0), 0);
    assert_int_equal(stored(g.st, &a, a.n, &why), 150);
    rec v;
    ks_sched_clear_slot(g.s, 0);
    ask(g.s, &a, whole, 2, true, &v);
    assert_int_equal(v.r.res.n_cache_written, 0);
    assert_int_equal(v.r.res.n_pinned, 150);
    assert_accounted(&g);
    rec_free(&x);
    rec_free(&y);
    rec_free(&z);
    rec_free(&w);
    rec_free(&v);
    ks_tokens_free(&a);
    rig_close(&g);
}

/* (d) P < n_cached: the slot holds a conversation; pins within it that the
 * store lacks are saved by rewinding the sequence, the reuse is kept, the
 * output stays exact, and the rewound states restore exactly later. Where
 * the memory cannot drop a suffix, the reuse is cut back instead. */
static void test_pin_within_reuse(void **st) {
    (void)st;
    rig g;
    rig_open(&g, &k_pins_only);
    ks_tokens a = {0};
    fresh(&a, 120, 2);
    rec x;
    ask(g.s, &a, NULL, 0, true, &x);
    ks_tokens b = {0};
    ks_tokens_append(&b, a.v, a.n);
    ks_tokens_append(&b, x.r.out.v, x.r.out.n);
    fresh(&b, 30, 3);
    ks_cache_pin pins[] = {{40, 300}, {110, 300}};
    rec y;
    ask(g.s, &b, pins, 2, true, &y);
    assert_true(y.r.res.n_cached >= a.n);
    assert_string_equal(y.r.res.cache_mode, "prefix");
    assert_int_equal(y.r.res.n_cache_written, 0); /* within what was read */
    assert_int_equal(y.r.res.n_pinned, 110);
    assert_int_equal(y.n_prog, 1); /* no chunk cut: the pins were saved at planning */
    assert_exact(&b, &y);
    ks_sched_cache_stats c = sched_cst(&g);
    assert_int_equal(c.pin_saves, 2);
    assert_int_equal(c.pin_rewinds, 2);
    assert_int_equal(ks_store_flush(g.st, 0), 0);
    ks_reason why = KS_REASON__N;
    assert_int_equal(stored(g.st, &b, 120, &why), 110);
    assert_int_equal(why, KS_REASON_PIN);
    assert_int_equal(stored(g.st, &b, 109, &why), 40);

    /* The rewound states are exact: restored into an empty slot. */
    for (int k = 0; k < 2; k++) {
        ks_tokens c2 = {0};
        ks_tokens_append(&c2, b.v, pins[k].n_tokens);
        fresh(&c2, 20, 4);
        ks_sched_clear_slot(g.s, 0);
        rec z;
        ask(g.s, &c2, NULL, 0, true, &z);
        assert_string_equal(z.r.res.cache_mode, "store");
        assert_int_equal(z.r.res.n_cached, pins[k].n_tokens);
        assert_exact(&c2, &z);
        rec_free(&z);
        ks_tokens_free(&c2);
    }

    /* A pin beyond the reuse beside one held: written = P - n_cached. */
    ks_sched_clear_slot(g.s, 0);
    ks_tokens d = {0};
    ks_tokens_append(&d, b.v, b.n);
    fresh(&d, 40, 5);
    ks_cache_pin deeper[] = {{110, 300}, {d.n - 10, 300}};
    rec u;
    ask(g.s, &d, deeper, 2, true, &u);
    assert_int_equal(u.r.res.n_cached, 110); /* restored from the pin */
    assert_int_equal(u.r.res.n_cache_written, d.n - 10 - 110);
    assert_int_equal(u.r.res.n_pinned, d.n - 10);
    assert_exact(&d, &u);
    assert_accounted(&g);
    rec_free(&u);
    rig_close(&g);

    /* Without partial removal: the reuse is cut back to the pin (a rebuild
     * here, as every trim of such a memory), and the pin saved in the prefill. */
    rig_opts o = k_pins_only;
    o.no_partial_rm = true;
    rig_open(&g, &o);
    rec p0;
    ask(g.s, &a, NULL, 0, true, &p0);
    ks_cache_pin one[] = {{40, 300}};
    rec q;
    ask(g.s, &b, one, 1, true, &q);
    assert_int_equal(q.r.res.n_cached, 0);
    assert_int_equal(q.r.res.n_cache_written, 40);
    assert_int_equal(q.r.res.n_pinned, 40);
    assert_true(q.n_prog >= 2);
    assert_int_equal(q.prog[0], 40);
    assert_exact(&b, &q);
    c = sched_cst(&g);
    assert_int_equal(c.pin_rewinds, 0);
    assert_int_equal(c.pin_saves, 1);
    rec_free(&p0);
    rec_free(&q);
    rig_close(&g);
    rec_free(&x);
    rec_free(&y);
    ks_tokens_free(&a);
    ks_tokens_free(&b);
    ks_tokens_free(&d);
}

/* Runs the filler prompts first .. first + k - 1 (70 tokens each, saved at
 * finish): eviction pressure. */
static void fill(rig *g, uint32_t first, int k) {
    for (int i = 0; i < k; i++) {
        ks_tokens f = {0};
        fresh(&f, 70, first + (uint32_t)i);
        rec x;
        ask(g->s, &f, NULL, 0, true, &x);
        rec_free(&x);
        ks_tokens_free(&f);
    }
    assert_int_equal(ks_store_flush(g->st, 0), 0);
}

/* (b), (c) A small ram tier: saves of other prompts evict each other, the
 * pinned state survives until its TTL and is evictable after it; of two
 * pins beyond pin_share, the one that expires sooner loses its protection. */
static void test_pin_survives_eviction_until_ttl(void **st) {
    (void)st;
    /* The sizes on this model: a finish save (70 + 8 tokens), a 60-token pin. */
    rig g;
    rig_opts o = {.ram_bytes = 256 << 20, .pin_share = 0.5f, .min_tokens = 32};
    rig_open(&g, &o);
    fill(&g, 100, 1);
    struct ks_store_stats ss;
    ks_store_stats(g.st, &ss);
    assert_int_equal(ss.tier_entries[KS_TIER_RAM], 1);
    int64_t entry = (int64_t)ss.tier_bytes[KS_TIER_RAM];
    ks_tokens x0 = {0};
    fresh(&x0, 70, 99);
    ks_cache_pin pin0[] = {{60, 60}};
    rec r0;
    ask(g.s, &x0, pin0, 1, true, &r0);
    assert_int_equal(ks_store_flush(g.st, 0), 0);
    ks_store_stats(g.st, &ss);
    int64_t pinned = (int64_t)ss.tier_pinned_bytes[KS_TIER_RAM];
    assert_true(pinned > 0 && pinned < entry);
    rec_free(&r0);
    ks_tokens_free(&x0);
    rig_close(&g);

    /* Five finish saves and a half fit; pins may hold one and a half pinned
     * states: one. */
    o.ram_bytes = 5 * entry + entry / 2;
    o.pin_share = (float)(1.5 * (double)pinned / (double)o.ram_bytes);
    rig_open(&g, &o);
    ks_tokens x1 = {0}, x2 = {0};
    fresh(&x1, 70, 1);
    fresh(&x2, 70, 2);
    ks_cache_pin long_pin[] = {{60, 5}}, short_pin[] = {{60, 4}};
    double t0 = ks_now_ms();
    rec r1, r2;
    ask(g.s, &x1, long_pin, 1, true, &r1);
    ask(g.s, &x2, short_pin, 1, true, &r2);
    assert_int_equal(r1.r.res.n_pinned, 60);
    assert_int_equal(r2.r.res.n_pinned, 60);
    fill(&g, 200, 8);
    double elapsed = ks_now_ms() - t0;
    if (elapsed > 3500) fail_msg("the fill took %.0f ms: cannot check within the 4 s TTL", elapsed);
    assert_int_equal(stored(g.st, &x1, 60, NULL), 60); /* the later deadline: protected */
    assert_int_equal(stored(g.st, &x2, 60, NULL), 0);  /* beyond the share: lost protection first */
    ks_store_stats(g.st, &ss);
    assert_int_equal(ss.tier_pin_drops[KS_TIER_RAM], 1);
    assert_true(ss.tier_evictions[KS_TIER_RAM] >= 6);
    assert_true(ss.tier_bytes[KS_TIER_RAM] <= (uint64_t)o.ram_bytes);
    assert_int_equal(ss.tier_pinned_entries[KS_TIER_RAM], 1);
    /* The fillers themselves were evicted (the oldest first). */
    ks_tokens f0 = {0};
    fresh(&f0, 70, 200);
    assert_int_equal(stored(g.st, &f0, f0.n, NULL), 0);
    ks_tokens_free(&f0);

    /* After its TTL it is an ordinary entry: the LRU takes it. */
    while (ks_now_ms() - t0 < 5500) usleep(100000);
    fill(&g, 300, 8);
    assert_int_equal(stored(g.st, &x1, 60, NULL), 0);
    ks_store_stats(g.st, &ss);
    assert_int_equal(ss.tier_pinned_entries[KS_TIER_RAM], 0);
    assert_int_equal(ss.tier_pin_drops[KS_TIER_RAM], 1); /* expired: not a drop */
    assert_accounted(&g);
    rec_free(&r1);
    rec_free(&r2);
    ks_tokens_free(&x1);
    ks_tokens_free(&x2);
    rig_close(&g);
}

/* (e) Invalid pins are refused by submit; pins are ignored without caching
 * or without a store. */
static void test_invalid_and_ignored_pins(void **st) {
    (void)st;
    rig g;
    rig_open(&g, &k_pins_only);
    ks_tokens a = {0};
    fresh(&a, 50, 6);
    rec x;
    memset(&x, 0, sizeof x);
    ks_cache_pin nine[9];
    for (int i = 0; i < 9; i++) nine[i] = (ks_cache_pin){1 + i, 60};
    const struct {
        ks_cache_pin pins[3];
        int n;
    } bad[] = {
        {{{0, 60}}, 1},                   /* empty prefix */
        {{{-3, 60}}, 1},
        {{{51, 60}}, 1},                  /* beyond the prompt */
        {{{10, 0}}, 1},                   /* no TTL */
        {{{10, -5}}, 1},
        {{{20, 60}, {10, 60}}, 2},        /* descending */
        {{{10, 60}, {20, 60}, {5, 60}}, 3},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_req_params p = req_for(&a, bad[i].pins, bad[i].n, &x);
        if (ks_sched_submit(g.s, &p, NULL) != KS_EINVAL) fail_msg("bad pins %zu accepted", i);
    }
    ks_req_params p = req_for(&a, nine, 9, &x);
    assert_int_equal(ks_sched_submit(g.s, &p, NULL), KS_EINVAL); /* more than KS_MAX_CACHE_PINS */
    p = req_for(&a, NULL, 1, &x);
    assert_int_equal(ks_sched_submit(g.s, &p, NULL), KS_EINVAL); /* n_pins without pins */
    p = req_for(&a, nine, -1, &x);
    assert_int_equal(ks_sched_submit(g.s, &p, NULL), KS_EINVAL);

    /* Equal positions are merged (the longer TTL); the whole prompt is allowed. */
    ks_cache_pin dup[] = {{30, 60}, {30, 3600}, {50, 60}};
    rec y;
    ask(g.s, &a, dup, 3, true, &y);
    assert_int_equal(y.r.res.n_pinned, 50);
    assert_int_equal(sched_cst(&g).pin_saves, 2);
    rec_free(&y);
    /* cache_prompt false: ignored. */
    struct ks_store_stats s0, s1;
    assert_int_equal(ks_store_flush(g.st, 0), 0);
    ks_store_stats(g.st, &s0);
    ks_tokens b = {0};
    fresh(&b, 50, 7);
    ks_cache_pin one[] = {{40, 60}};
    rec z;
    ask(g.s, &b, one, 1, false, &z);
    assert_int_equal(z.r.res.n_pinned, 0);
    assert_int_equal(z.r.res.n_cache_written, 0);
    assert_int_equal(ks_store_flush(g.st, 0), 0);
    ks_store_stats(g.st, &s1);
    assert_int_equal(s1.saves[KS_REASON_PIN], s0.saves[KS_REASON_PIN]);
    assert_int_equal(stored(g.st, &b, 49, NULL), 0);
    rec_free(&z);
    rig_close(&g);
    /* No store: ignored. */
    rig_opts o = {.no_store = true, .min_tokens = 256};
    rig_open(&g, &o);
    rec w;
    ask(g.s, &b, one, 1, true, &w);
    assert_int_equal(w.r.res.n_pinned, 0);
    assert_int_equal(w.r.res.n_cache_written, 0);
    assert_exact(&b, &w);
    rec_free(&w);
    rig_close(&g);
    ks_tokens_free(&a);
    ks_tokens_free(&b);
}

/* (f) Full mode: the pin goes to the disk tier (its deadline in the file) and
 * a new store on the directory (a restart) restores it, exactly. */
static void test_pin_on_disk_outlives_the_store(void **st) {
    (void)st;
    char root[64];
    snprintf(root, sizeof root, "/tmp/ks-sched-pins-XXXXXX");
    assert_non_null(mkdtemp(root));
    rig_opts o = k_pins_only;
    o.disk = root;
    rig g;
    rig_open(&g, &o);
    ks_tokens a = {0};
    fresh(&a, 150, 8);
    ks_cache_pin pins[] = {{100, 3600}};
    int64_t t0 = ks_wall_us();
    rec x;
    ask(g.s, &a, pins, 1, true, &x);
    assert_int_equal(x.r.res.n_cache_written, 100);
    assert_int_equal(ks_store_flush(g.st, 0), 0);
    struct ks_store_stats ss;
    ks_store_stats(g.st, &ss);
    assert_int_equal(ss.tier_pinned_entries[KS_TIER_RAM], 1);
    assert_int_equal(ss.tier_pinned_entries[KS_TIER_DISK], 1);
    assert_int_equal(ss.saves[KS_REASON_PIN], 1); /* one save, two tiers */
    assert_accounted(&g);
    rig_close(&g);

    /* The file: reason pin, pinned for the TTL. */
    DIR *d = opendir(root);
    assert_non_null(d);
    int n_files = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!ks_kvfile_name_parse(de->d_name, NULL)) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", root, de->d_name);
        ks_kvfile_meta m;
        assert_int_equal(ks_kvfile_read_meta(path, &m), 0);
        assert_int_equal(m.reason, KS_REASON_PIN);
        assert_int_equal(m.n_tokens, 100);
        assert_true(m.pin_until_us >= t0 + 3600ll * 1000000);
        n_files++;
    }
    closedir(d);
    assert_int_equal(n_files, 1);

    rig_open(&g, &o);
    rec y;
    ask(g.s, &a, NULL, 0, true, &y);
    assert_string_equal(y.r.res.cache_mode, "store");
    assert_string_equal(y.r.res.cache_tier, "disk");
    assert_int_equal(y.r.res.n_cached, 100);
    assert_exact(&a, &y);
    ks_store_stats(g.st, &ss);
    assert_int_equal(ss.tier_pinned_entries[KS_TIER_DISK], 1);
    rig_close(&g);
    rec_free(&x);
    rec_free(&y);
    ks_tokens_free(&a);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

static int setup(void **st) {
    (void)st;
    g_ref_e = open_engine();
    if (!g_ref_e || ks_engine_n_batch(g_ref_e) != N_BATCH) return -1;
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_ref_e;
    sp.n_slots = 1;
    return ks_sched_create(&sp, &g_ref) == 0 ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    ks_sched_free(g_ref);
    ks_engine_free(g_ref_e);
    return 0;
}

int main(void) {
    ks_log_set_level(getenv("KS_TEST_LOG") ? KS_LOG_DEBUG : KS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_saves_and_restores_exactly),
        cmocka_unit_test(test_pin_within_reuse),
        cmocka_unit_test(test_pin_survives_eviction_until_ttl),
        cmocka_unit_test(test_invalid_and_ignored_pins),
        cmocka_unit_test(test_pin_on_disk_outlives_the_store),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

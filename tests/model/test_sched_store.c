/*
 * Model tests of the scheduler's `cold` store saves on the generated tiny
 * model (n_batch 64, store stride 16, min_tokens 32, every reason but shutdown
 * to the ram tier). A prefill saves once. A COLD prefill (less than a stride
 * reused) saves at the prompt's last stride boundary, its last chunk cut there
 * (one decode step more, beside a whole prompt's prefill). A warm prefill never
 * pays a step for it: its last chunk is never cut, so a warm turn prefilled in
 * one chunk gets none, and a longer one saves at its last stride-aligned chunk
 * end when moving the tokens costs no step.
 *
 * Every request runs on two 1-slot schedulers, one with the store and one
 * without: the decode steps of the prefill (on_progress calls, one per chunk)
 * must be the same (one more for a cold prefill's cut), and the cached token
 * counts and the outputs equal.
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
#include <cmocka.h>

#include "cache/prefix.h"
#include "cache/store.h"
#include "engine/engine.h"
#include "sched/sched.h"
#include "run_util.h"

#define N_BATCH 64
#define STRIDE 16
#define MIN_TOKENS 32
#define MAX_PROG 64

static char g_root[64];
static ks_engine *g_e, *g_ref_e;
static ks_store *g_store;
static ks_sched *g_s;   /* with the store */
static ks_sched *g_ref; /* the same without a store */

/* A run that also records the prefill progress (n_past after each chunk).
 * run first: run_on_token/run_on_done take the same pointer. */
typedef struct rec {
    run r;
    int prog[MAX_PROG];
    int n_prog;
} rec;

static void rec_progress(void *ud, int done, int total) {
    (void)total;
    rec *x = ud;
    if (x->n_prog < MAX_PROG) x->prog[x->n_prog] = done;
    x->n_prog++;
}

static void once(ks_sched *s, const ks_tokens *prompt, rec *x) {
    memset(x, 0, sizeof *x);
    run_init(&x->r);
    ks_req_params p = {0};
    p.tokens = prompt->v;
    p.n_tokens = prompt->n;
    p.max_tokens = 8;
    p.sample = ks_sample_params_default();
    p.cache_prompt = true;
    p.preferred_slot = 0;
    p.on_token = run_on_token;
    p.on_progress = rec_progress;
    p.on_done = run_on_done;
    p.ud = x;
    assert_int_equal(ks_sched_submit(s, &p, NULL), 0);
    run_wait(&x->r);
    assert_int_not_equal(x->r.res.finish, KS_FINISH_ERROR);
    assert_true(x->n_prog <= MAX_PROG);
}

/* Runs prompt on both schedulers; the store must change nothing but saves
 * and, for a cold prefill's cut, add extra_steps decode steps. Returns the
 * store side's record in *x (run_free it). */
static void twin(const ks_tokens *prompt, rec *x, int extra_steps) {
    rec ref;
    once(g_s, prompt, x);
    once(g_ref, prompt, &ref);
    assert_int_equal(x->r.res.n_cached, ref.r.res.n_cached);
    assert_string_equal(x->r.res.cache_mode, ref.r.res.cache_mode);
    assert_int_equal(x->n_prog, ref.n_prog + extra_steps);
    assert_int_equal(x->r.out.n, ref.r.out.n);
    assert_memory_equal(x->r.out.v, ref.r.out.v, sizeof(int32_t) * (size_t)ref.r.out.n);
    run_free(&ref.r);
    /* The cold save is async: let the writer publish it before any check. */
    assert_int_equal(ks_store_flush(g_store, 0), 0);
}

/* n pseudo-random tokens (ids 10..409) from seed. */
static void fresh(ks_tokens *t, int n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        assert_int_equal(ks_tokens_push(t, (int32_t)(10 + (x >> 8) % 400)), 0);
    }
}

static uint64_t cold_requests(void) {
    ks_sched_stats st;
    ks_sched_stats_get(g_s, &st);
    return st.cache.store_save_requests[KS_REASON_COLD];
}

static uint64_t cold_written(void) {
    struct ks_store_stats st;
    ks_store_stats(g_store, &st);
    return st.saves[KS_REASON_COLD];
}

/* The longest stored prefix of prompt shorter than the prompt (what a replay
 * of the same prompt would restore); 0 when none. */
static int stored_prefix(const ks_tokens *prompt, ks_reason *why) {
    ks_store_hit h;
    int rc = ks_store_lookup(g_store, prompt->v, prompt->n, prompt->n - 1, &h);
    int n = rc == 0 ? h.n_tokens : 0;
    if (rc == 0 && why) *why = h.reason;
    ks_store_hit_free(&h);
    return n;
}

/* A cold prompt of 150 tokens prefills in chunks ending at 64, 128, 144 and
 * 150: one cold save, at 144, the prompt's last stride boundary (not at 64 or
 * 128 too); one step more than without a store. */
static void test_multi_chunk_cold_prefill_saves_once(void **st) {
    (void)st;
    uint64_t c0 = cold_requests(), w0 = cold_written();
    ks_tokens a = {0};
    fresh(&a, 150, 1);
    rec x;
    twin(&a, &x, 1);
    assert_int_equal(x.r.res.n_cached, 0);
    assert_int_equal(x.n_prog, 4);
    assert_int_equal(x.prog[0], 64);
    assert_int_equal(x.prog[1], 128);
    assert_int_equal(x.prog[2], 144);
    assert_int_equal(x.prog[3], 150);
    assert_int_equal(cold_requests() - c0, 1);
    assert_int_equal(cold_written() - w0, 1);
    ks_reason why = KS_REASON__N;
    assert_int_equal(stored_prefix(&a, &why), 144);
    assert_int_equal(why, KS_REASON_COLD);
    run_free(&x.r);
    ks_tokens_free(&a);
}

/* A cold prompt that fits one chunk is cut at its last stride boundary (48)
 * and saved there (a replay in another process restores it); its finish save
 * is written too. Then a warm turn whose new tokens fit one chunk: no cut, no
 * cold save (a cut there cost warm turns TTFT, docs/BENCHMARKS.md). */
static void test_single_chunk_cold_saves_warm_does_not(void **st) {
    (void)st;
    struct ks_store_stats s0, s1;
    ks_store_stats(g_store, &s0);
    uint64_t c0 = cold_requests();
    ks_tokens b = {0};
    fresh(&b, 60, 2);
    rec x;
    twin(&b, &x, 1);
    assert_int_equal(x.r.res.n_cached, 0);
    assert_int_equal(x.n_prog, 2);
    assert_int_equal(x.prog[0], 48);
    assert_int_equal(x.prog[1], 60);
    assert_int_equal(cold_requests() - c0, 1);
    ks_reason why = KS_REASON__N;
    assert_int_equal(stored_prefix(&b, &why), 48);
    assert_int_equal(why, KS_REASON_COLD);
    ks_store_stats(g_store, &s1);
    assert_int_equal(s1.saves[KS_REASON_COLD], s0.saves[KS_REASON_COLD] + 1);
    assert_true(s1.saves[KS_REASON_FINISH] > s0.saves[KS_REASON_FINISH]);
    c0 = cold_requests();
    s0 = s1;

    /* Warm turn: b, the reply, 40 more tokens; ~41 tokens to prefill, across
     * the stride boundary 96. */
    ks_tokens b2 = {0};
    ks_tokens_append(&b2, b.v, b.n);
    ks_tokens_append(&b2, x.r.out.v, x.r.out.n);
    fresh(&b2, 40, 3);
    rec y;
    twin(&b2, &y, 0);
    assert_true(y.r.res.n_cached >= b.n);
    assert_true(b2.n - y.r.res.n_cached <= N_BATCH);
    assert_true(ks_prefix_align_down(b2.n - 1, STRIDE) > y.r.res.n_cached); /* a boundary is crossed */
    assert_int_equal(y.n_prog, 1);
    assert_int_equal(cold_requests(), c0);
    ks_store_stats(g_store, &s1);
    assert_int_equal(s1.saves[KS_REASON_COLD], s0.saves[KS_REASON_COLD]);
    run_free(&x.r);
    run_free(&y.r);
    ks_tokens_free(&b);
    ks_tokens_free(&b2);
}

/* A warm prefill from an unaligned position (75 tokens reused) is never cut
 * for a cold save, in two chunks or more: its finish save follows within the
 * request, and on a GPU a save copies the whole sequence's KV to host memory
 * (savepoint.h rule 1). The chunks end where the budget puts them (64 a
 * step: 139 and 175; 139 and 203). Before, the first chunk was cut at 128
 * when the rest still fit one chunk. */
static void test_warm_multi_chunk_never_cut(void **st) {
    (void)st;
    ks_tokens base = {0};
    fresh(&base, 90, 4);
    rec x;
    twin(&base, &x, 1); /* cold: cut at 80; the slot holds base + reply */
    uint64_t c0 = cold_requests(), w0 = cold_written();

    ks_tokens p1 = {0};
    ks_tokens_append(&p1, base.v, 75);
    fresh(&p1, 100, 5); /* differs from base at 75 (different seed) */
    assert_int_not_equal(p1.v[75], base.v[75]);
    rec y;
    twin(&p1, &y, 0);
    assert_int_equal(y.r.res.n_cached, 75);
    assert_int_equal(y.n_prog, 2);
    assert_int_equal(y.prog[0], 139);
    assert_int_equal(y.prog[1], 175);
    assert_int_equal(cold_requests() - c0, 0);
    assert_int_equal(cold_written() - w0, 0);

    ks_tokens p2 = {0};
    ks_tokens_append(&p2, base.v, 75);
    fresh(&p2, 128, 6);
    assert_int_not_equal(p2.v[75], p1.v[75]);
    rec z;
    twin(&p2, &z, 0);
    assert_int_equal(z.r.res.n_cached, 75);
    assert_int_equal(z.n_prog, 2);
    assert_int_equal(z.prog[0], 139);
    assert_int_equal(z.prog[1], 203);
    assert_int_equal(cold_requests() - c0, 0);
    run_free(&x.r);
    run_free(&y.r);
    run_free(&z.r);
    ks_tokens_free(&base);
    ks_tokens_free(&p1);
    ks_tokens_free(&p2);
}

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

static int setup(void **st) {
    (void)st;
    snprintf(g_root, sizeof g_root, "/tmp/ks-sched-store-XXXXXX");
    if (!mkdtemp(g_root)) return -1;
    g_e = open_engine();
    g_ref_e = open_engine();
    if (!g_e || !g_ref_e || ks_engine_n_batch(g_e) != N_BATCH) return -1;

    ks_store_params p = ks_store_params_default();
    snprintf(p.cfg.cache_dir, sizeof p.cfg.cache_dir, "%s/disk", g_root);
    snprintf(p.cfg.shm_dir, sizeof p.cfg.shm_dir, "%s/shm", g_root);
    p.cfg.stride = STRIDE;
    p.cfg.min_tokens = MIN_TOKENS;
    p.cfg.shutdown_timeout_ms = 30000;
    for (int t = 0; t < KS_TIER__N; t++) p.cfg.tier_max_bytes[t] = 0;
    p.cfg.tier_max_bytes[KS_TIER_RAM] = 256u << 20;
    for (int r = 0; r < KS_REASON__N; r++) p.cfg.reason_tier[r] = KS_TIER_RAM;
    p.cfg.reason_tier[KS_REASON_SHUTDOWN] = KS_TIER_NONE;
    char kv[256];
    ks_engine_kv_params(g_e, kv, sizeof kv);
    p.kv_params = kv;
    p.kv_params_len = strlen(kv);
    p.state_version = ks_engine_state_version();
    char err[256] = "";
    if (ks_store_open(&p, &g_store, err, sizeof err) != 0) {
        fprintf(stderr, "ks_store_open: %s\n", err);
        return -1;
    }

    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_e;
    sp.n_slots = 1;
    sp.store = g_store;
    sp.store_stride = STRIDE;
    sp.store_min_tokens = MIN_TOKENS;
    sp.continued_interval = 0;
    if (ks_sched_create(&sp, &g_s) != 0) return -1;
    sp = ks_sched_params_default();
    sp.engine = g_ref_e;
    sp.n_slots = 1;
    return ks_sched_create(&sp, &g_ref) == 0 ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    ks_sched_free(g_s);
    ks_sched_free(g_ref);
    ks_store_close(g_store);
    ks_engine_free(g_e);
    ks_engine_free(g_ref_e);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_chunk_cold_prefill_saves_once),
        cmocka_unit_test(test_single_chunk_cold_saves_warm_does_not),
        cmocka_unit_test(test_warm_multi_chunk_never_cut),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * Model tests of shared prefills and slot copies on the generated tiny model:
 * the followers of a request (share_prefill_of, OpenAI `n` > 1) wait for its
 * prefill and copy its prompt from its slot instead of prefilling it again,
 * and any request whose prefix sits in another slot (busy or idle) copies it.
 * Every output is compared token for token with an uncached run of the same
 * prompt and seed.
 *
 * The inference thread is held at a chosen point with a gate: a callback of
 * the leading request (on_progress after a prefill chunk, or on_token) blocks
 * until the test has queued, canceled or submitted what it needs, so the
 * scheduler's state at that point does not depend on timing.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cache/prefix.h"
#include "engine/engine.h"
#include "sched/sched.h"
#include "run_util.h"
#include "fa_util.h"

enum { N_SLOTS = 3, MAX_TOKENS = 24 };

static ks_engine *g_e;

/* ------------------------------------------------------------------ gate */
/* Holds the inference thread in a callback: armed, the first callback that
 * reaches its trigger count (`at`) says it arrived and waits until opened. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int at;       /* trigger on this call (1: the first) */
    int calls;
    int value;    /* on_progress: tokens done when it arrived */
    bool armed, arrived, open;
} gate;

static gate g_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, false, false, false};

static void gate_arm(int at) {
    pthread_mutex_lock(&g_gate.mu);
    g_gate.at = at;
    g_gate.calls = 0;
    g_gate.value = 0;
    g_gate.armed = true;
    g_gate.arrived = g_gate.open = false;
    pthread_mutex_unlock(&g_gate.mu);
}

static void gate_pass(int value) {
    pthread_mutex_lock(&g_gate.mu);
    if (g_gate.armed && ++g_gate.calls == g_gate.at) {
        g_gate.value = value;
        g_gate.arrived = true;
        pthread_cond_broadcast(&g_gate.cv);
        while (!g_gate.open) pthread_cond_wait(&g_gate.cv, &g_gate.mu);
        g_gate.armed = false;
    }
    pthread_mutex_unlock(&g_gate.mu);
}

static int gate_wait_arrived(void) {
    pthread_mutex_lock(&g_gate.mu);
    while (!g_gate.arrived) pthread_cond_wait(&g_gate.cv, &g_gate.mu);
    int v = g_gate.value;
    pthread_mutex_unlock(&g_gate.mu);
    return v;
}

static void gate_open(void) {
    pthread_mutex_lock(&g_gate.mu);
    g_gate.open = true;
    pthread_cond_broadcast(&g_gate.cv);
    pthread_mutex_unlock(&g_gate.mu);
}

static void gated_progress(void *ud, int done, int total) {
    (void)ud;
    (void)total;
    gate_pass(done);
}

static int gated_token(void *ud, int32_t tok, const char *piece, int len) {
    int rc = run_on_token(ud, tok, piece, len);
    gate_pass(0);
    return rc;
}

/* --------------------------------------------------------------- helpers */
/* A chat prompt of at least n_min tokens; `topic` varies the user message. */
static void long_prompt(int n_min, const char *topic, ks_tokens *out) {
    static const char *words[] = {"apples", "rivers", "lanterns", "copper", "meadows", "engines",
                                  "violins", "harbors", "glaciers", "orchards", "pebbles", "comets"};
    size_t cap = 64 * 1024;
    char *sys = malloc(cap);
    assert_non_null(sys);
    size_t n = 0;
    sys[0] = '\0';
    out->n = 0;
    for (int i = 0; out->n < n_min; i++) {
        n += (size_t)snprintf(sys + n, cap - n, "Rule %d: speak of %s and %s before %s. ", i, words[i % 12],
                              words[(i * 7 + 3) % 12], words[(i * 5 + 1) % 12]);
        assert_true(n < cap - 256);
        ks_msg m[] = {{"system", sys}, {"user", topic}};
        char *text = NULL;
        assert_int_equal(ks_engine_template(g_e, m, 2, true, &text), 0);
        out->n = 0;
        assert_int_equal(ks_engine_tokenize(g_e, text, strlen(text), true, true, out), 0);
        free(text);
    }
    free(sys);
}

static ks_sched *open_sched(int copy_min_tokens) {
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_e;
    sp.n_slots = N_SLOTS;
    sp.copy_min_tokens = copy_min_tokens;
    ks_sched *s = NULL;
    assert_int_equal(ks_sched_create(&sp, &s), 0);
    return s;
}

/* Empties every slot, so the next request finds nothing cached anywhere. */
static void clear_all(ks_sched *s) {
    for (int i = 0; i < N_SLOTS; i++) ks_sched_clear_slot(s, i);
}

typedef struct req_opts {
    bool cache;
    float temperature;
    uint64_t seed;
    uint64_t share_of;
    bool gate_progress; /* on_progress goes through the gate */
    bool gate_token;    /* on_token goes through the gate */
} req_opts;

static uint64_t submit(ks_sched *s, const ks_tokens *prompt, const req_opts *o, run *x) {
    run_init(x);
    ks_req_params p = {0};
    p.tokens = prompt->v;
    p.n_tokens = prompt->n;
    p.max_tokens = MAX_TOKENS;
    p.sample = ks_sample_params_default();
    p.sample.temperature = o->temperature;
    p.sample.seed = o->seed;
    p.cache_prompt = o->cache;
    p.preferred_slot = -1;
    p.share_prefill_of = o->share_of;
    p.on_token = o->gate_token ? gated_token : run_on_token;
    p.on_progress = o->gate_progress ? gated_progress : NULL;
    p.on_done = run_on_done;
    p.ud = x;
    uint64_t id = 0;
    assert_int_equal(ks_sched_submit(s, &p, &id), 0);
    assert_true(id > 0);
    return id;
}

/* The reference: the prompt with cache_prompt false, alone. */
static void uncached(ks_sched *s, const ks_tokens *prompt, float temperature, uint64_t seed, run *x) {
    req_opts o = {.cache = false, .temperature = temperature, .seed = seed};
    submit(s, prompt, &o, x);
    run_wait(x);
    assert_int_equal(x->res.finish == KS_FINISH_ERROR, 0);
    assert_int_equal(x->res.n_cached, 0);
}

static void assert_same_output(const run *a, const run *b) {
    assert_int_equal(a->out.n, b->out.n);
    assert_memory_equal(a->out.v, b->out.v, sizeof(int32_t) * (size_t)a->out.n);
}

static void assert_ok(const run *x) {
    if (x->res.finish == KS_FINISH_ERROR) fprintf(stderr, "request failed: %s\n", ks_strerror(x->res.error));
    assert_true(x->res.finish == KS_FINISH_STOP || x->res.finish == KS_FINISH_LENGTH);
}

/* ------------------------------------------------------------------ tests */
/* n = 3 with one prompt: the leader prefills, the two followers wait for it
 * and copy its prompt (all but the last token, which they decode for their
 * logits); outputs equal the uncached one, and about one prompt is prefilled
 * in all. */
static void test_followers_copy_the_leaders_prefill(void **st) {
    (void)st;
    ks_sched *s = open_sched(16);
    ks_tokens prompt = {0};
    long_prompt(300, "tell me about the sea", &prompt);
    assert_true(prompt.n >= 300);
    run ref;
    uncached(s, &prompt, 0, 0, &ref);
    assert_true(ref.out.n > 1); /* the leader is still generating when the followers go */
    clear_all(s);

    run lead, f[2];
    gate_arm(1);
    uint64_t id = submit(s, &prompt, &(req_opts){.cache = true, .gate_progress = true}, &lead);
    assert_int_equal(gate_wait_arrived(), prompt.n); /* the leader's prefill is decoded, not sampled */
    for (int i = 0; i < 2; i++) submit(s, &prompt, &(req_opts){.cache = true, .share_of = id}, &f[i]);
    gate_open();
    run_wait(&lead);
    run_wait(&f[0]);
    run_wait(&f[1]);

    assert_ok(&lead);
    assert_same_output(&lead, &ref);
    assert_int_equal(lead.res.n_cached, 0);
    int prefilled = lead.res.n_prompt - lead.res.n_cached;
    for (int i = 0; i < 2; i++) {
        assert_ok(&f[i]);
        assert_same_output(&f[i], &ref);
        assert_int_equal(f[i].res.n_cached, prompt.n - 1);
        assert_string_equal(f[i].res.cache_mode, "copy");
        assert_string_equal(f[i].res.cache_reason, "");
        assert_int_not_equal(f[i].res.slot, lead.res.slot);
        assert_true(f[i].res.restore_ms > 0);
        prefilled += f[i].res.n_prompt - f[i].res.n_cached;
        fprintf(stderr, "follower %d: %d tokens copied in %.3f ms\n", i, f[i].res.n_cached, f[i].res.restore_ms);
    }
    assert_int_equal(prefilled, prompt.n + 2); /* one prompt, and each follower's last token */
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.slot_copies, 2);
    assert_int_equal((int)stt.cache.slot_copied_tokens, 2 * (prompt.n - 1));

    run_free(&ref);
    run_free(&lead);
    run_free(&f[0]);
    run_free(&f[1]);
    ks_tokens_free(&prompt);
    ks_sched_free(s);
}

/* Sampling (temperature 0.8), a different seed per choice: each follower's
 * tokens are those of its seed run uncached — the copied KV is exact. */
static void test_followers_exact_with_sampling(void **st) {
    (void)st;
    ks_sched *s = open_sched(16);
    ks_tokens prompt = {0};
    long_prompt(320, "write a short poem", &prompt);
    const uint64_t seeds[3] = {11, 22, 33};
    run ref[3], got[3];
    for (int i = 0; i < 3; i++) uncached(s, &prompt, 0.8f, seeds[i], &ref[i]);
    /* The seeds matter: otherwise this test would prove nothing about them. */
    assert_true(ref[0].out.n != ref[1].out.n ||
                memcmp(ref[0].out.v, ref[1].out.v, sizeof(int32_t) * (size_t)ref[0].out.n) != 0);
    clear_all(s);

    gate_arm(1);
    uint64_t id = submit(s, &prompt, &(req_opts){.cache = true, .temperature = 0.8f, .seed = seeds[0],
                                                 .gate_progress = true}, &got[0]);
    gate_wait_arrived();
    for (int i = 1; i < 3; i++)
        submit(s, &prompt, &(req_opts){.cache = true, .temperature = 0.8f, .seed = seeds[i], .share_of = id},
               &got[i]);
    gate_open();
    for (int i = 0; i < 3; i++) run_wait(&got[i]);
    for (int i = 0; i < 3; i++) {
        assert_ok(&got[i]);
        assert_same_output(&got[i], &ref[i]);
        if (i > 0) {
            assert_string_equal(got[i].res.cache_mode, "copy");
            assert_int_equal(got[i].res.n_cached, prompt.n - 1);
        }
        run_free(&ref[i]);
        run_free(&got[i]);
    }
    ks_tokens_free(&prompt);
    ks_sched_free(s);
}

/* The leader is canceled after the first chunk of its prefill: the followers
 * stop waiting, copy the chunk that exists, prefill the rest themselves and
 * answer exactly. */
static void test_leader_canceled_while_prefilling(void **st) {
    (void)st;
    ks_sched *s = open_sched(16);
    int n_batch = ks_engine_n_batch(g_e);
    ks_tokens prompt = {0};
    long_prompt(n_batch + 200, "describe a storm", &prompt);
    assert_true(prompt.n > n_batch + 16);
    run ref;
    uncached(s, &prompt, 0, 0, &ref);
    clear_all(s);

    run lead, f[2];
    gate_arm(1);
    uint64_t id = submit(s, &prompt, &(req_opts){.cache = true, .gate_progress = true}, &lead);
    int first = gate_wait_arrived();
    assert_true(first < prompt.n); /* held after a chunk that is not the last */
    for (int i = 0; i < 2; i++) submit(s, &prompt, &(req_opts){.cache = true, .share_of = id}, &f[i]);
    ks_sched_cancel(s, id);
    gate_open();
    run_wait(&lead);
    run_wait(&f[0]);
    run_wait(&f[1]);
    assert_int_equal(lead.res.finish, KS_FINISH_CANCEL);
    for (int i = 0; i < 2; i++) {
        assert_ok(&f[i]);
        assert_same_output(&f[i], &ref);
        /* What the leader had decoded, copied; never more. */
        assert_true(f[i].res.n_cached <= first);
        assert_true(f[i].res.n_cached >= first - 1);
    }
    run_free(&ref);
    run_free(&lead);
    run_free(&f[0]);
    run_free(&f[1]);
    ks_tokens_free(&prompt);
    ks_sched_free(s);
}

/* A follower naming a finished request, or an id not yet given out, runs
 * as any request. */
static void test_follower_of_unknown_or_finished_id(void **st) {
    (void)st;
    ks_sched *s = open_sched(16);
    ks_tokens prompt = {0};
    long_prompt(300, "count the stars", &prompt);
    run ref, done, a, b;
    uncached(s, &prompt, 0, 0, &ref);
    clear_all(s);
    uint64_t id = submit(s, &prompt, &(req_opts){.cache = true}, &done);
    run_wait(&done);
    assert_ok(&done);
    submit(s, &prompt, &(req_opts){.cache = true, .share_of = id}, &a); /* finished */
    run_wait(&a);
    submit(s, &prompt, &(req_opts){.cache = true, .share_of = id + 1000}, &b); /* a later id: ignored */
    run_wait(&b);
    assert_ok(&a);
    assert_ok(&b);
    assert_same_output(&done, &ref);
    assert_same_output(&a, &ref);
    assert_same_output(&b, &ref);
    assert_int_equal(a.res.n_cached, prompt.n - 1); /* the finished request's slot: a prefix hit */
    assert_int_equal(b.res.n_cached, prompt.n - 1);
    run_free(&ref);
    run_free(&done);
    run_free(&a);
    run_free(&b);
    ks_tokens_free(&prompt);
    ks_sched_free(s);
}

/* No share_prefill_of at all: a request whose prefix sits in a busy slot
 * (generating, its generated tokens in its KV) copies it, and the copy is
 * cut back to the common prefix. With copies off it prefills the prefix. */
static void test_busy_slot_prefix_is_copied(void **st) {
    (void)st;
    ks_tokens pa = {0}, pb = {0};
    long_prompt(300, "name three rivers", &pa);
    long_prompt(300, "name three mountains and a lake", &pb);
    int common = ks_prefix_common(pa.v, pa.n, pb.v, pb.n);
    assert_true(common > 250 && common < pb.n - 1);
    for (int copies = 1; copies >= 0; copies--) {
        ks_sched *s = open_sched(copies ? 16 : 0);
        run refa, refb, a, b;
        uncached(s, &pa, 0, 0, &refa);
        uncached(s, &pb, 0, 0, &refb);
        assert_true(refa.out.n >= 6);
        clear_all(s);
        gate_arm(5); /* a holds the thread at its 5th token: 4 generated tokens are in its KV */
        submit(s, &pa, &(req_opts){.cache = true, .gate_token = true}, &a);
        gate_wait_arrived();
        submit(s, &pb, &(req_opts){.cache = true}, &b);
        gate_open();
        run_wait(&a);
        run_wait(&b);
        assert_ok(&a);
        assert_ok(&b);
        assert_same_output(&a, &refa);
        assert_same_output(&b, &refb);
        assert_int_not_equal(a.res.slot, b.res.slot);
        if (copies) {
            assert_string_equal(b.res.cache_mode, "copy");
            assert_int_equal(b.res.n_cached, common);
            char want[48];
            snprintf(want, sizeof want, "diverged-at-token-%d", common);
            assert_string_equal(b.res.cache_reason, want);
        } else {
            assert_string_not_equal(b.res.cache_mode, "copy");
            assert_int_equal(b.res.n_cached, 0);
        }
        ks_sched_stats stt;
        ks_sched_stats_get(s, &stt);
        assert_int_equal((int)stt.cache.slot_copies, copies);
        run_free(&refa);
        run_free(&refb);
        run_free(&a);
        run_free(&b);
        ks_sched_free(s);
    }
    ks_tokens_free(&pa);
    ks_tokens_free(&pb);
}

/* The copy's cost for a prompt of about 1,000 tokens (printed; for the
 * report in docs/ARCHITECTURE.md), copied from a busy slot. */
static void test_copy_cost_1000_tokens(void **st) {
    (void)st;
    ks_sched *s = open_sched(16);
    ks_tokens prompt = {0};
    long_prompt(1000, "summarize the rules", &prompt);
    run ref, lead, f;
    uncached(s, &prompt, 0, 0, &ref);
    clear_all(s);
    gate_arm(1);
    submit(s, &prompt, &(req_opts){.cache = true, .gate_token = true}, &lead);
    gate_wait_arrived();
    submit(s, &prompt, &(req_opts){.cache = true}, &f); /* lead's slot is busy */
    gate_open();
    run_wait(&lead);
    run_wait(&f);
    assert_same_output(&f, &ref);
    assert_string_equal(f.res.cache_mode, "copy");
    fprintf(stderr, "copy of %d tokens (prompt %d): %.3f ms\n", f.res.n_cached, prompt.n, f.res.restore_ms);
    run_free(&ref);
    run_free(&lead);
    run_free(&f);
    ks_tokens_free(&prompt);
    ks_sched_free(s);
}

static int setup(void **st) {
    (void)st;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MODEL");
    ep.n_seq = N_SLOTS;
    ep.n_ctx_seq = 2048;
    ep.n_threads = 1;
    /* ctest runs this file with flash attention at its default (on with the
     * patched backend: exact too) and again with KS_TEST_FLASH_ATTN=off|on */
    ep.flash_attn = test_flash_attn();
    char err[256] = "";
    int rc = ks_engine_open(&ep, &g_e, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    return rc ? -1 : 0;
}

static int teardown(void **st) {
    (void)st;
    ks_engine_free(g_e);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_followers_copy_the_leaders_prefill),
        cmocka_unit_test(test_followers_exact_with_sampling),
        cmocka_unit_test(test_leader_canceled_while_prefilling),
        cmocka_unit_test(test_follower_of_unknown_or_finished_id),
        cmocka_unit_test(test_busy_slot_prefix_is_copied),
        cmocka_unit_test(test_copy_cost_1000_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

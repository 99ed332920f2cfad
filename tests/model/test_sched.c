/*
 * Model tests of the scheduler's cache paths on the generated tiny model:
 * an edited earlier message recomputes only the divergent suffix, a changed
 * system prompt is a miss by itself, and continuous batching across slots
 * gives exactly the outputs of sequential uncached runs.
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

static void submit(ks_sched *s, const ks_tokens *prompt, bool cache, int max_tokens, run *x) {
    ks_req_params p = {0};
    p.tokens = prompt->v;
    p.n_tokens = prompt->n;
    p.max_tokens = max_tokens;
    p.sample = ks_sample_params_default();
    p.cache_prompt = cache;
    p.preferred_slot = -1;
    p.on_token = run_on_token;
    p.on_done = run_on_done;
    p.ud = x;
    assert_int_equal(ks_sched_submit(s, &p, NULL), 0);
}

static void prompt_of(ks_engine *e, const ks_msg *m, int n, ks_tokens *out) {
    assert_int_equal(run_prompt(e, m, n, out), 0);
}

static ks_engine *open_engine(int n_seq) {
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MODEL");
    ep.n_seq = n_seq;
    ep.n_ctx_seq = 2048;
    ep.n_threads = 1;
    /* ctest runs this file with flash attention at its default (on with the
     * patched backend: exact too) and again with KS_TEST_FLASH_ATTN=off|on */
    ep.flash_attn = test_flash_attn();
    ks_engine *e = NULL;
    char err[256] = "";
    int rc = ks_engine_open(&ep, &e, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    return e;
}

static ks_sched *open_sched_ex(ks_engine *e, int n_slots, bool no_partial_rm) {
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = n_slots;
    sp.simulate_no_partial_rm = no_partial_rm;
    ks_sched *s = NULL;
    assert_int_equal(ks_sched_create(&sp, &s), 0);
    return s;
}

static ks_sched *open_sched(ks_engine *e, int n_slots) { return open_sched_ex(e, n_slots, false); }

/* One request, waited for. */
static void once(ks_sched *s, const ks_tokens *prompt, bool cache, int max_tokens, run *x) {
    run_init(x);
    submit(s, prompt, cache, max_tokens, x);
    run_wait(x);
    assert_int_equal(x->res.finish == KS_FINISH_ERROR, 0);
}

static void test_edited_message_trims_suffix(void **st) {
    (void)st;
    ks_engine *e = open_engine(1);
    ks_sched *s = open_sched(e, 1);
    ks_msg a[] = {{"system", "You are a helpful assistant for testing caches."},
                  {"user", "first question about apples and pears"},
                  {"assistant", "apples are red and pears are green"},
                  {"user", "second question about the weather"}};
    ks_msg b[4];
    memcpy(b, a, sizeof a);
    b[1].content = "first question about apples and plums"; /* edited earlier message */
    ks_tokens pa = {0}, pb = {0};
    prompt_of(e, a, 4, &pa);
    prompt_of(e, b, 4, &pb);
    int lcp = ks_prefix_common(pa.v, pa.n, pb.v, pb.n);
    assert_true(lcp > 5 && lcp < pb.n - 10);

    run ra, rb, cold;
    once(s, &pa, true, 12, &ra);
    once(s, &pb, true, 12, &rb);
    assert_int_equal(rb.res.n_cached, lcp); /* exactly the common prefix, nothing more */
    assert_int_equal(rb.res.n_prompt, pb.n);
    assert_string_equal(rb.res.cache_mode, "prefix");
    char want[48];
    snprintf(want, sizeof want, "diverged-at-token-%d", lcp);
    assert_string_equal(rb.res.cache_reason, want);
    once(s, &pb, false, 12, &cold); /* cache off: full prefill */
    assert_int_equal(cold.res.n_cached, 0);
    assert_int_equal(rb.out.n, cold.out.n);
    assert_memory_equal(rb.out.v, cold.out.v, sizeof(int32_t) * (size_t)cold.out.n);
    run_free(&ra);
    run_free(&rb);
    run_free(&cold);
    ks_tokens_free(&pa);
    ks_tokens_free(&pb);
    ks_sched_free(s);
    ks_engine_free(e);
}

static void test_changed_system_prompt_is_miss(void **st) {
    (void)st;
    ks_engine *e = open_engine(1);
    ks_sched *s = open_sched(e, 1);
    ks_msg a[] = {{"system", "You answer questions about gardening in detail."},
                  {"user", "how do I grow tomatoes"}};
    ks_msg b[] = {{"system", "Translate every answer into pirate speech."},
                  {"user", "how do I grow tomatoes"}};
    ks_tokens pa = {0}, pb = {0}, hdr = {0};
    prompt_of(e, a, 2, &pa);
    prompt_of(e, b, 2, &pb);
    /* The only shared tokens are BOS and the system header. */
    assert_int_equal(ks_engine_tokenize(e, "<|im_start|>system\n", 19, true, true, &hdr), 0);
    int lcp = ks_prefix_common(pa.v, pa.n, pb.v, pb.n);
    assert_true(lcp <= hdr.n + 1);
    run ra, rb, cold;
    once(s, &pa, true, 12, &ra);
    once(s, &pb, true, 12, &rb);
    assert_int_equal(rb.res.n_cached, lcp);
    assert_true(rb.res.n_cached < pb.n / 4);
    once(s, &pb, false, 12, &cold);
    assert_int_equal(rb.out.n, cold.out.n);
    assert_memory_equal(rb.out.v, cold.out.v, sizeof(int32_t) * (size_t)cold.out.n);
    run_free(&ra);
    run_free(&rb);
    run_free(&cold);
    ks_tokens_free(&pa);
    ks_tokens_free(&pb);
    ks_tokens_free(&hdr);
    ks_sched_free(s);
    ks_engine_free(e);
}

/* Several requests at once on 2 slots (continuous batching, prefill chunks
 * interleaved with decode steps) give the tokens of one-at-a-time runs. */
static void test_batching_is_exact(void **st) {
    (void)st;
    enum { N = 5 };
    const char *users[N] = {"tell me a story about a cat", "what is two plus two",
                            "describe the moon in three words", "a long question about the history of old maps and roads",
                            "say something kind"};
    ks_engine *e1 = open_engine(1);
    ks_sched *s1 = open_sched(e1, 1);
    ks_tokens prompts[N];
    run seq[N];
    memset(prompts, 0, sizeof prompts);
    for (int i = 0; i < N; i++) {
        ks_msg m[] = {{"system", "You are a test."}, {"user", users[i]}};
        prompt_of(e1, m, 2, &prompts[i]);
        once(s1, &prompts[i], false, 20, &seq[i]);
    }
    ks_sched_free(s1);
    ks_engine_free(e1);

    ks_engine *e2 = open_engine(2);
    ks_sched *s2 = open_sched(e2, 2);
    run par[N];
    for (int i = 0; i < N; i++) {
        run_init(&par[i]);
        submit(s2, &prompts[i], true, 20, &par[i]);
    }
    for (int i = 0; i < N; i++) run_wait(&par[i]);
    for (int i = 0; i < N; i++) {
        assert_int_equal(par[i].out.n, seq[i].out.n);
        assert_memory_equal(par[i].out.v, seq[i].out.v, sizeof(int32_t) * (size_t)seq[i].out.n);
        run_free(&par[i]);
        run_free(&seq[i]);
        ks_tokens_free(&prompts[i]);
    }
    ks_sched_stats stt;
    ks_sched_stats_get(s2, &stt);
    assert_int_equal((int)stt.requests_total, N);
    ks_sched_free(s2);
    ks_engine_free(e2);
}

/* Memory that cannot drop a suffix (recurrent/hybrid models; simulated):
 * a divergent prompt rebuilds the slot from scratch — never a wrong answer —
 * while a prompt that only extends the slot still reuses it. */
static void test_no_partial_rm_rebuilds(void **st) {
    (void)st;
    ks_engine *e = open_engine(1);
    ks_sched *s = open_sched_ex(e, 1, true);
    ks_msg a[] = {{"system", "You are a helpful assistant for testing caches."},
                  {"user", "first question about apples and pears"}};
    ks_msg b[] = {{"system", "You are a helpful assistant for testing caches."},
                  {"user", "first question about apples and plums"}};
    ks_tokens pa = {0}, pb = {0};
    prompt_of(e, a, 2, &pa);
    prompt_of(e, b, 2, &pb);
    run ra, rb, rc2, cold;
    once(s, &pa, true, 12, &ra);
    once(s, &pb, true, 12, &rb); /* diverges inside the slot: full rebuild */
    assert_int_equal(rb.res.n_cached, 0);
    assert_string_equal(rb.res.cache_mode, "miss");
    assert_string_equal(rb.res.cache_reason, "partial-rm-unsupported");
    once(s, &pb, false, 12, &cold);
    assert_int_equal(rb.out.n, cold.out.n);
    assert_memory_equal(rb.out.v, cold.out.v, sizeof(int32_t) * (size_t)cold.out.n);
    /* an extension of what the slot holds needs no removal: reused */
    ks_tokens ext = {0};
    ks_tokens_assign(&ext, pb.v, pb.n);
    ks_tokens_append(&ext, cold.out.v, cold.out.n); /* everything the slot holds, and more */
    ks_tokens_append(&ext, pa.v + 1, 3);
    int held = ks_prefix_kv_after(pb.n, cold.out.n, cold.res.finish == KS_FINISH_STOP);
    once(s, &ext, true, 4, &rc2);
    assert_int_equal(rc2.res.n_cached, held);
    assert_string_equal(rc2.res.cache_mode, "prefix");
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.partial_rm_rebuilds, 1);
    run_free(&ra);
    run_free(&rb);
    run_free(&rc2);
    run_free(&cold);
    ks_tokens_free(&pa);
    ks_tokens_free(&pb);
    ks_tokens_free(&ext);
    ks_sched_free(s);
    ks_engine_free(e);
}

/* Bad submissions are refused with a code and nothing is queued. */
static void test_submit_errors(void **st) {
    (void)st;
    ks_engine *e = open_engine(1);
    ks_sched *s = open_sched(e, 1);
    ks_req_params p = {0};
    p.max_tokens = 4;
    p.preferred_slot = -1;
    assert_int_equal(ks_sched_submit(s, &p, NULL), KS_EINVAL); /* no tokens */
    int32_t toks[4] = {1, 2, 3, 4};
    p.tokens = toks;
    p.n_tokens = 4;
    p.max_tokens = 0;
    assert_int_equal(ks_sched_submit(s, &p, NULL), KS_EINVAL);
    p.max_tokens = ks_engine_n_ctx_seq(e);
    assert_int_equal(ks_sched_submit(s, &p, NULL), KS_ECTX);
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal(stt.queue_depth, 0);
    ks_sched_free(s);
    /* Regression: max_queue 0 was silently 64; bad parameters are refused. */
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    ks_sched *bad = (ks_sched *)1;
    sp.max_queue = 0;
    assert_int_equal(ks_sched_create(&sp, &bad), KS_EINVAL);
    assert_null(bad);
    sp.max_queue = 1;
    sp.n_slots = ks_engine_n_seq(e) + 1;
    assert_int_equal(ks_sched_create(&sp, &bad), KS_EINVAL);
    ks_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edited_message_trims_suffix),
        cmocka_unit_test(test_changed_system_prompt_is_miss),
        cmocka_unit_test(test_batching_is_exact),
        cmocka_unit_test(test_no_partial_rm_rebuilds),
        cmocka_unit_test(test_submit_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * Model tests of speculative decoding (step.c "Speculation") through the
 * scheduler on the generated tiny model, with the n-gram drafters of
 * llama.cpp's common library (draft_ngram.h): a reply with drafts is the
 * reply without them, token for token — greedy, sampled at a seed, with
 * logprobs, a grammar, penalties and biases, stopped by the caller,
 * at max_tokens, from a cached prefix, and beside another slot — and the
 * drafts are really verified and accepted (the counters), so that no case
 * passes by drafting nothing.
 *
 * Random weights fall into repeating text, where n-grams hit: every
 * comparison asserts that drafts were accepted in the run it compares.
 */
#include <math.h>
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
#include "engine/engine.h"
#include "engine/mkmodel.h"
#include "sched/draft_model.h"
#include "sched/draft_ngram.h"
#include "sched/sched.h"
#include "run_util.h"

enum { MAXG = 256 };

typedef struct srun {
    run r; /* first: run_on_token and run_on_done take the srun as a run */
    int n_probs_calls;
    ks_token_prob sampled[MAXG];
    ks_token_prob top[MAXG][4];
    int stop_after;   /* > 0: on_token asks to stop at this many tokens */
} srun;

static int on_token(void *ud, int32_t tok, const char *piece, int len) {
    srun *x = ud;
    run_on_token(ud, tok, piece, len);
    return x->stop_after > 0 && x->r.out.n >= x->stop_after;
}

static void on_probs(void *ud, const ks_token_prob *sampled, const ks_token_prob *top, int n_top) {
    srun *x = ud;
    int i = x->n_probs_calls++;
    if (i >= MAXG) return;
    x->sampled[i] = *sampled;
    memcpy(x->top[i], top, sizeof *top * (size_t)(n_top < 4 ? n_top : 4));
}

static ks_engine *g_e;
static ks_sched *g_s;
static ks_ngram_params g_np;

static bool g_adaptive;

static void open_sched(ks_ngram_type type, int n_slots) {
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_e;
    sp.n_slots = n_slots;
    g_np = ks_ngram_params_default(type);
    g_np.size_n = 3; /* the tiny model's loops are short */
    g_np.size_m = 16;
    g_np.mod_n_match = 4;
    g_np.mod_n_min = 1;
    g_np.mod_n_max = 16;
    sp.drafter = ks_ngram_ops();
    sp.drafter_cfg = &g_np;
    sp.draft_max = 16;
    sp.draft_adaptive = g_adaptive; /* false: every draft verified, whatever rows cost here */
    assert_int_equal(ks_sched_create(&sp, &g_s), 0);
}

static int setup(void **st) {
    (void)st;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MODEL");
    ep.n_seq = 2;
    ep.n_ctx_seq = 1024;
    ep.n_threads = 1;
    char err[256] = "";
    int rc = ks_engine_open(&ep, &g_e, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    open_sched(KS_NGRAM_SIMPLE, 2);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    ks_sched_free(g_s);
    ks_engine_free(g_e);
    return 0;
}

static void prompt_of(const char *user, ks_tokens *out) {
    ks_msg m[] = {{"system", "You are a test."}, {"user", user}};
    assert_int_equal(run_prompt(g_e, m, 2, out), 0);
}

typedef struct req {
    const ks_tokens *prompt;
    ks_sample_params sp;
    const ks_sample_ext *x;
    int max_tokens;
    bool cache;
    int draft_max; /* ks_req_params.draft_max */
    int stop_after;
    int preferred;  /* slot + 1, 0: the scheduler's choice */
} req;

static void submit(const req *q, srun *r) {
    memset(r, 0, sizeof *r);
    run_init(&r->r);
    r->stop_after = q->stop_after;
    ks_req_params p = {0};
    p.tokens = q->prompt->v;
    p.n_tokens = q->prompt->n;
    p.max_tokens = q->max_tokens;
    p.sample = q->sp;
    p.ext = q->x;
    p.cache_prompt = q->cache;
    p.draft_max = q->draft_max;
    p.preferred_slot = q->preferred - 1;
    p.on_token = on_token;
    p.on_probs = on_probs;
    p.on_done = run_on_done;
    p.ud = r;
    assert_int_equal(ks_sched_submit(g_s, &p, NULL), 0);
}

static void go(const req *q, srun *r) {
    submit(q, r);
    run_wait(&r->r);
}

static void assert_same_run(const srun *a, const srun *b) {
    assert_int_equal(a->r.out.n, b->r.out.n);
    for (int i = 0; i < a->r.out.n; i++)
        if (a->r.out.v[i] != b->r.out.v[i]) fail_msg("token %d differs: %d vs %d", i, a->r.out.v[i], b->r.out.v[i]);
    assert_int_equal(a->r.res.finish, b->r.res.finish);
    assert_int_equal(a->r.res.eog, b->r.res.eog);
    assert_int_equal(a->r.res.n_generated, b->r.res.n_generated);
    assert_int_equal(a->n_probs_calls, b->n_probs_calls);
    for (int i = 0; i < a->n_probs_calls && i < MAXG; i++) {
        assert_int_equal(a->sampled[i].tok, b->sampled[i].tok);
        assert_true(a->sampled[i].logprob == b->sampled[i].logprob); /* bits */
        for (int j = 0; j < 4; j++) {
            assert_int_equal(a->top[i][j].tok, b->top[i][j].tok);
            assert_true(a->top[i][j].logprob == b->top[i][j].logprob);
        }
    }
}

/* The same request with and without drafts, uncached both: equal. Returns
 * the drafted run's accepted count (the callers assert it is not 0). */
static int same_with_drafts(req q, const char *what) {
    srun off, on;
    q.draft_max = -1;
    q.cache = false;
    go(&q, &off);
    assert_int_equal(off.r.res.n_drafted, 0);
    q.draft_max = 0;
    go(&q, &on);
    fprintf(stderr, "# %s: %d tokens, %d drafted, %d accepted\n", what, on.r.out.n, on.r.res.n_drafted,
            on.r.res.n_draft_accepted);
    assert_same_run(&on, &off);
    assert_true(on.r.res.n_draft_accepted <= on.r.res.n_drafted);
    int acc = on.r.res.n_draft_accepted;
    run_free(&off.r);
    run_free(&on.r);
    return acc;
}

static const ks_sample_ext k_long = {.ignore_eos = true};

/* ------------------------------------------------------------------ 1 */
static void test_greedy(void **st) {
    (void)st;
    ks_tokens p = {0};
    const char *users[] = {"describe the moon", "a long question about old maps and roads", "write code"};
    for (int i = 0; i < 3; i++) {
        prompt_of(users[i], &p);
        req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 200};
        assert_true(same_with_drafts(q, users[i]) > 0);
    }
    bool exact;
    const char *why = "x";
    assert_true(ks_sched_spec_status(g_s, &exact, &why));
    assert_true(exact);
    assert_null(why);
    ks_tokens_free(&p);
}

/* ------------------------------------------------------------------ 2 */
/* Sampled at a seed: every row is sampled by the same sampler in the same
 * order, so the RNG draws are the same. */
static void test_sampled_seed(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("tell me a story about a cat", &p);
    ks_sample_params sp = {.temperature = 0.6f, .top_k = 8, .top_p = 0.95f, .min_p = 0.05f, .seed = 42};
    req q = {.prompt = &p, .sp = sp, .x = &k_long, .max_tokens = 200};
    assert_true(same_with_drafts(q, "sampled") > 0);
    ks_tokens_free(&p);
}

/* ------------------------------------------------------------------ 3 */
/* Logprobs (bit for bit), penalties, biases, a grammar. */
static void test_ext(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("list things", &p);
    ks_sample_ext lp = {.ignore_eos = true, .n_probs = 4};
    req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &lp, .max_tokens = 160};
    assert_true(same_with_drafts(q, "logprobs") > 0);
    ks_logit_bias lb[1] = {{567, -INFINITY}};
    ks_sample_ext pen = {.ignore_eos = true, .logit_bias = lb, .n_logit_bias = 1, .frequency_penalty = 0.01f,
                         .repeat_penalty = 1.01f, .repeat_last_n = 8};
    q.x = &pen;
    assert_true(same_with_drafts(q, "penalties") > 0);
    /* a grammar that lets the model loop: ab* pairs of lower-case words */
    ks_sample_ext gr = {.ignore_eos = true, .grammar = "root ::= ([a-z]+ \" \")+"};
    q.x = &gr;
    assert_true(same_with_drafts(q, "grammar") > 0);
    ks_tokens_free(&p);
}

/* ------------------------------------------------------------------ 4 */
/* The caller's stop (a stop string) and max_tokens inside an accepted
 * draft: the same tokens, and the slot's KV holds exactly what one-token
 * decoding would have left (the next request reuses all of it). */
static void test_stop_and_length(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("describe the moon", &p);
    /* Every end point from 150 to 157: some end inside an accepted draft. */
    int acc_stop = 0, acc_len = 0;
    for (int stop = 150; stop < 158; stop++) {
        req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 200, .stop_after = stop};
        acc_stop += same_with_drafts(q, "stopped");
        q.stop_after = 0;
        q.max_tokens = stop;
        acc_len += same_with_drafts(q, "max_tokens");
    }
    assert_true(acc_stop > 0 && acc_len > 0);
    /* Cached: a run with drafts leaves the KV of its reply, which the next
     * turn reuses to the token. */
    srun a, b, cold;
    req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 161, .cache = true};
    go(&q, &a);
    assert_true(a.r.res.n_draft_accepted > 0);
    ks_tokens p2 = {0};
    ks_tokens_assign(&p2, p.v, p.n);
    ks_tokens_append(&p2, a.r.out.v, a.r.out.n);
    const char *more = "<|im_end|>\n<|im_start|>user\nand then what<|im_end|>\n<|im_start|>assistant\n";
    assert_int_equal(ks_engine_tokenize(g_e, more, strlen(more), false, true, &p2), 0);
    req q2 = {.prompt = &p2, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 200, .cache = true};
    go(&q2, &b);
    assert_int_equal(b.r.res.n_cached, ks_prefix_kv_after(p.n, a.r.out.n, false));
    assert_true(b.r.res.n_draft_accepted > 0);
    q2.cache = false;
    q2.draft_max = -1;
    go(&q2, &cold);
    assert_int_equal(cold.r.res.n_cached, 0);
    assert_same_run(&b, &cold);
    run_free(&a.r);
    run_free(&b.r);
    run_free(&cold.r);
    ks_tokens_free(&p2);
    ks_tokens_free(&p);
}

/* ------------------------------------------------------------------ 5 */
/* Two slots drafting at once give what each gives alone without drafts. */
static void test_concurrent(void **st) {
    (void)st;
    ks_tokens p1 = {0}, p2 = {0};
    prompt_of("describe the moon", &p1);
    prompt_of("write code", &p2);
    req q1 = {.prompt = &p1, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 200};
    req q2 = q1;
    q2.prompt = &p2;
    q2.sp.temperature = 0.6f;
    q2.sp.top_k = 8;
    q2.sp.seed = 42;
    srun a, b, a0, b0;
    submit(&q1, &a);
    submit(&q2, &b);
    run_wait(&a.r);
    run_wait(&b.r);
    q1.draft_max = q2.draft_max = -1;
    go(&q1, &a0);
    go(&q2, &b0);
    assert_same_run(&a, &a0);
    assert_same_run(&b, &b0);
    fprintf(stderr, "# concurrent: %d and %d accepted\n", a.r.res.n_draft_accepted, b.r.res.n_draft_accepted);
    assert_true(a.r.res.n_draft_accepted > 0 && b.r.res.n_draft_accepted > 0);
    ks_sched_stats ss;
    ks_sched_stats_get(g_s, &ss);
    assert_true(ss.draft_accepted_total >= (uint64_t)(a.r.res.n_draft_accepted + b.r.res.n_draft_accepted));
    assert_true(ss.draft_tokens_total >= ss.draft_accepted_total);
    assert_true(ss.draft_steps_total > 0);
    run_free(&a.r);
    run_free(&b.r);
    run_free(&a0.r);
    run_free(&b0.r);
    ks_tokens_free(&p1);
    ks_tokens_free(&p2);
}

/* ------------------------------------------------------------------ 6 */
/* Every n-gram type of the common library, and a request cap. */
static void test_types(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("a long question about old maps and roads", &p);
    for (int t = 0; t < KS_NGRAM__N; t++) {
        ks_sched_free(g_s);
        open_sched((ks_ngram_type)t, 2);
        req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 200};
        assert_true(same_with_drafts(q, ks_ngram_type_name((ks_ngram_type)t)) > 0);
    }
    /* draft_max 2 per request: never more than 2 per step */
    srun r;
    req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 100, .draft_max = 2};
    go(&q, &r);
    assert_true(r.r.res.n_drafted > 0);
    assert_true(r.r.res.n_drafted <= 2 * r.r.res.n_generated);
    run_free(&r.r);
    ks_tokens_free(&p);
    ks_sched_free(g_s);
    open_sched(KS_NGRAM_SIMPLE, 2);
}

/* ------------------------------------------------------------------ 7 */
/* Adaptive drafting (step.c "How much to draft") verifies what the measured
 * costs make worth it: whatever it picks, the replies are the same. */
static void test_adaptive(void **st) {
    (void)st;
    ks_sched_free(g_s);
    g_adaptive = true;
    open_sched(KS_NGRAM_SIMPLE, 2);
    ks_tokens p = {0};
    prompt_of("describe the moon", &p);
    req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 200};
    int acc = same_with_drafts(q, "adaptive");
    ks_sample_params sp = {.temperature = 1.0f, .seed = 3};
    q.sp = sp;
    acc += same_with_drafts(q, "adaptive, temperature 1");
    fprintf(stderr, "# adaptive: %d accepted\n", acc);
    ks_tokens_free(&p);
    ks_sched_free(g_s);
    g_adaptive = false;
    open_sched(KS_NGRAM_SIMPLE, 2);
}

/* ------------------------------------------------------------------ 8 */
/* A draft model (draft_model.h): the tiny target/draft pair (mkmodel.h
 * note 11) agrees on most tokens; the replies are the target's alone, and a
 * same-slot turn prefills in the draft model only what the target did
 * (and the last token again). A model of another vocabulary is refused. */
static void test_draft_model(void **st) {
    (void)st;
    ks_sched_free(g_s);
    g_s = NULL;
    ks_engine_params ep = ks_engine_params_default();
    ep.n_seq = 2;
    ep.n_ctx_seq = 1024;
    ep.n_threads = 1;
    char err[256] = "";
    ks_engine *tgt = NULL, *dft = NULL, *other = NULL;
    ep.model_path = getenv("KS_TINY_TARGET_MODEL");
    assert_int_equal(ks_engine_open(&ep, &tgt, err, sizeof err), 0);
    ep.model_path = getenv("KS_TINY_DRAFT_MODEL");
    ep.exact = false;
    assert_int_equal(ks_engine_open(&ep, &dft, err, sizeof err), 0);
    assert_int_equal(ks_draft_model_same_vocab(tgt, dft, err, sizeof err), 0);
    char path[] = "/tmp/ks-test-spec-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ks_mkmodel("tiny-agent", 1, path, err, sizeof err), 0);
    ep.model_path = path;
    assert_int_equal(ks_engine_open(&ep, &other, err, sizeof err), 0);
    err[0] = '\0';
    assert_int_equal(ks_draft_model_same_vocab(tgt, other, err, sizeof err), KS_EINVAL);
    assert_true(strlen(err) > 0);
    ks_engine_free(other);
    unlink(path);

    ks_draft_model_cfg dc = {.engine = dft};
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = tgt;
    sp.n_slots = 2;
    sp.drafter = ks_draft_model_ops();
    sp.drafter_cfg = &dc;
    sp.draft_max = 8;
    sp.draft_adaptive = false;
    ks_engine *saved = g_e;
    g_e = tgt; /* prompt_of and go use the target */
    assert_int_equal(ks_sched_create(&sp, &g_s), 0);
    ks_tokens p = {0};
    prompt_of("describe the moon", &p);
    req q = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 160};
    assert_true(same_with_drafts(q, "draft model, greedy") > 0);
    ks_sample_params smp = {.temperature = 0.5f, .top_k = 8, .seed = 4};
    q.sp = smp;
    assert_true(same_with_drafts(q, "draft model, seeded") > 0);
    /* A same-slot turn: the draft model decodes the new tokens only. */
    srun a, b, cold;
    req q1 = {.prompt = &p, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 60, .cache = true,
              .preferred = 1};
    go(&q1, &a);
    ks_tokens p2 = {0};
    ks_tokens_assign(&p2, p.v, p.n);
    ks_tokens_append(&p2, a.r.out.v, a.r.out.n);
    const char *more = "<|im_end|>\n<|im_start|>user\nand then what<|im_end|>\n<|im_start|>assistant\n";
    assert_int_equal(ks_engine_tokenize(tgt, more, strlen(more), false, true, &p2), 0);
    uint64_t pre0 = atomic_load(&dc.prefilled);
    req q2 = {.prompt = &p2, .sp = ks_sample_params_default(), .x = &k_long, .max_tokens = 60, .cache = true,
              .preferred = 1};
    go(&q2, &b);
    uint64_t pre = atomic_load(&dc.prefilled) - pre0;
    int new_tokens = p2.n - b.r.res.n_cached;
    fprintf(stderr, "# draft model: cached turn of %d tokens, %d new; the draft model prefilled %llu\n", p2.n,
            new_tokens, (unsigned long long)pre);
    assert_true(b.r.res.n_cached > p.n);
    assert_true(b.r.res.n_draft_accepted > 0);
    assert_true(pre <= (uint64_t)new_tokens + 1);
    q2.cache = false;
    q2.draft_max = -1;
    go(&q2, &cold);
    assert_same_run(&b, &cold);
    run_free(&a.r);
    run_free(&b.r);
    run_free(&cold.r);
    ks_tokens_free(&p2);
    ks_tokens_free(&p);
    ks_sched_free(g_s);
    ks_engine_free(dft);
    ks_draft_model_cfg_fini(&dc);
    ks_engine_free(tgt);
    g_e = saved;
    open_sched(KS_NGRAM_SIMPLE, 2);
}

static void test_params(void **st) {
    (void)st;
    char err[128];
    ks_ngram_params p = ks_ngram_params_default(KS_NGRAM_MOD);
    assert_int_equal(ks_ngram_params_check(&p, err, sizeof err), 0);
    p.mod_n_match = 0;
    assert_int_equal(ks_ngram_params_check(&p, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "--spec-ngram-mod-n-match"));
    assert_int_equal(ks_ngram_type_parse("ngram-map-k4v"), KS_NGRAM_MAP_K4V);
    assert_int_equal(ks_ngram_type_parse("draft-simple"), -1);
    /* the scheduler refuses a cap outside 1..KS_DRAFT_MAX */
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_e;
    sp.drafter = ks_ngram_ops();
    sp.drafter_cfg = &g_np;
    sp.draft_max = KS_DRAFT_MAX + 1;
    ks_sched *s = NULL;
    assert_int_equal(ks_sched_create(&sp, &s), KS_EINVAL);
    assert_null(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),       cmocka_unit_test(test_sampled_seed), cmocka_unit_test(test_ext),
        cmocka_unit_test(test_stop_and_length), cmocka_unit_test(test_concurrent), cmocka_unit_test(test_types),
        cmocka_unit_test(test_adaptive),     cmocka_unit_test(test_draft_model), cmocka_unit_test(test_params),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

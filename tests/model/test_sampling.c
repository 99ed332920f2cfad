/*
 * Model tests of per-request sampling (ks_sample_ext) through the scheduler
 * on the generated tiny model (random weights, vocabulary of 999 tokens, EOG
 * tokens </s> and <|im_end|>): grammars strict and lazy, bad grammars,
 * logit_bias, ignore_eos, penalties with the prompt as history, logprobs,
 * and that none of it changes what the cache reuses.
 *
 * Facts about the tiny model the cases rely on are asserted where they are
 * used (a greedy output that loops, a prompt that ends early by EOG), so a
 * new model fails loudly instead of making a case vacuous.
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
#include <cmocka.h>

#include "cache/prefix.h"
#include "engine/engine.h"
#include "sched/sched.h"
#include "run_util.h"

enum { MAXG = 64 };

/* A run with what on_probs saw and the first token's logits. */
typedef struct srun {
    run r; /* first: run_on_token and run_on_done take the srun as a run */
    int n_probs_calls;
    int out_n_at_probs[MAXG]; /* tokens seen by on_token when on_probs came */
    ks_token_prob sampled[MAXG];
    ks_token_prob top[MAXG][KS_N_PROBS_MAX];
    int n_top[MAXG];
    float *logits;
    int n_vocab;
} srun;

static void on_probs(void *ud, const ks_token_prob *sampled, const ks_token_prob *top, int n_top) {
    srun *x = ud;
    int i = x->n_probs_calls++;
    if (i >= MAXG) return;
    x->out_n_at_probs[i] = x->r.out.n;
    x->sampled[i] = *sampled;
    x->n_top[i] = n_top;
    memcpy(x->top[i], top, sizeof *top * (size_t)(n_top < KS_N_PROBS_MAX ? n_top : KS_N_PROBS_MAX));
}

static void on_done(void *ud, const ks_req_result *r) {
    srun *x = ud;
    if (r->logits) {
        x->logits = malloc(sizeof(float) * (size_t)r->n_vocab);
        assert_non_null(x->logits);
        memcpy(x->logits, r->logits, sizeof(float) * (size_t)r->n_vocab);
        x->n_vocab = r->n_vocab;
    }
    run_on_done(ud, r);
}

static void srun_free(srun *x) {
    run_free(&x->r);
    free(x->logits);
}

static ks_engine *g_e;
static ks_sched *g_s;

static int setup(void **st) {
    (void)st;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MODEL");
    ep.n_seq = 1;
    ep.n_ctx_seq = 2048;
    ep.n_threads = 1;
    char err[256] = "";
    int rc = ks_engine_open(&ep, &g_e, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_e;
    sp.n_slots = 1;
    assert_int_equal(ks_sched_create(&sp, &g_s), 0);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    ks_sched_free(g_s);
    ks_engine_free(g_e);
    return 0;
}

/* The chat prompt of one user message. */
static void prompt_of(const char *user, ks_tokens *out) {
    ks_msg m[] = {{"system", "You are a test."}, {"user", user}};
    assert_int_equal(run_prompt(g_e, m, 2, out), 0);
}

static void submit_sp(const ks_tokens *prompt, const ks_sample_params *sp, const ks_sample_ext *x, int max_tokens,
                      bool cache, srun *r) {
    memset(r, 0, sizeof *r);
    run_init(&r->r);
    ks_req_params p = {0};
    p.tokens = prompt->v;
    p.n_tokens = prompt->n;
    p.max_tokens = max_tokens;
    p.sample = *sp;
    p.ext = x;
    p.cache_prompt = cache;
    p.want_logits = true;
    p.preferred_slot = -1;
    p.on_token = run_on_token;
    p.on_probs = on_probs;
    p.on_done = on_done;
    p.ud = r;
    assert_int_equal(ks_sched_submit(g_s, &p, NULL), 0);
}

/* Greedy. */
static void submit(const ks_tokens *prompt, const ks_sample_ext *x, int max_tokens, bool cache, srun *r) {
    ks_sample_params sp = ks_sample_params_default();
    submit_sp(prompt, &sp, x, max_tokens, cache, r);
}

/* One greedy request, waited for. */
static void go(const ks_tokens *prompt, const ks_sample_ext *x, int max_tokens, bool cache, srun *r) {
    submit(prompt, x, max_tokens, cache, r);
    run_wait(&r->r);
}

/* The text of toks[from, to) into buf. */
static const char *text_of(const ks_tokens *t, int from, int to, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = from; i < to; i++) {
        char piece[64];
        int n = ks_engine_piece(g_e, t->v[i], piece, sizeof piece);
        assert_true(n >= 0 && n < (int)sizeof piece);
        assert_true(len + (size_t)n < cap);
        memcpy(buf + len, piece, (size_t)n);
        len += (size_t)n;
        buf[len] = '\0';
    }
    return buf;
}

static void assert_same_tokens(const ks_tokens *a, const ks_tokens *b, int n) {
    assert_true(a->n >= n && b->n >= n);
    for (int i = 0; i < n; i++) {
        if (a->v[i] != b->v[i]) fail_msg("token %d differs: %d vs %d", i, a->v[i], b->v[i]);
    }
}

/* digits{1,3} " done" */
static bool is_digits_done(const char *s) {
    int d = 0;
    while (s[d] >= '0' && s[d] <= '9') d++;
    return d >= 1 && d <= 3 && !strcmp(s + d, " done");
}

/* Generated tokens equal to an earlier generated token. */
static int repeats(const ks_tokens *t) {
    int n = 0;
    for (int i = 1; i < t->n; i++)
        for (int j = 0; j < i; j++)
            if (t->v[j] == t->v[i]) {
                n++;
                break;
            }
    return n;
}

/* Generated tokens that are tokens of the prompt. */
static int in_prompt(const ks_tokens *out, const ks_tokens *prompt) {
    int n = 0;
    for (int i = 0; i < out->n; i++)
        for (int j = 0; j < prompt->n; j++)
            if (out->v[i] == prompt->v[j]) {
                n++;
                break;
            }
    return n;
}

/* ------------------------------------------------------------------ 1 */
/* A strict grammar decides the text and ends it with EOG; the request's
 * memory can go right after submit (deep copy). */
static void test_grammar_strict(void **st) {
    (void)st;
    ks_tokens p = {0}, blocker = {0};
    prompt_of("yes or no", &p);
    prompt_of("hello", &blocker);
    srun free_run, yn, digits, yn_ign, first;
    char t1[512], t2[512];
    go(&p, NULL, 16, true, &free_run);
    assert_int_equal(free_run.r.res.finish, KS_FINISH_LENGTH); /* the free text runs on */

    /* Queued behind a request that keeps the one slot busy, with the
     * grammar's memory overwritten and freed right after submit. */
    char *gbnf = strdup("root ::= \"yes\" | \"no\"");
    ks_sample_ext *x = calloc(1, sizeof *x);
    x->grammar = gbnf;
    submit(&blocker, NULL, 40, true, &first);
    submit(&p, x, 16, true, &yn);
    memset(gbnf, 'x', strlen(gbnf));
    free(gbnf);
    memset(x, 0xff, sizeof *x);
    free(x);
    run_wait(&first.r);
    run_wait(&yn.r);
    assert_int_equal(yn.r.res.finish, KS_FINISH_STOP);
    assert_true(yn.r.res.eog);
    text_of(&yn.r.out, 0, yn.r.out.n, t1, sizeof t1);
    assert_true(!strcmp(t1, "yes") || !strcmp(t1, "no"));
    text_of(&free_run.r.out, 0, free_run.r.out.n, t2, sizeof t2);
    assert_string_not_equal(t1, t2);

    ks_sample_ext xd = {.grammar = "root ::= [0-9]{1,3} \" done\""};
    go(&p, &xd, 16, true, &digits);
    assert_int_equal(digits.r.res.finish, KS_FINISH_STOP);
    assert_true(digits.r.res.eog);
    text_of(&digits.r.out, 0, digits.r.out.n, t1, sizeof t1);
    if (!is_digits_done(t1)) fail_msg("'%s' does not match [0-9]{1,3} \" done\"", t1);

    /* Sampling with temperature: the chain's pick is checked against the
     * grammar and drawn again from the grammar's candidates when it breaks
     * it (rejection sampling); the text still follows the grammar. */
    for (uint64_t seed = 1; seed <= 3; seed++) {
        srun hot;
        ks_sample_params sp = ks_sample_params_default();
        sp.temperature = 1.0f;
        sp.seed = seed;
        submit_sp(&p, &sp, &xd, 16, true, &hot);
        run_wait(&hot.r);
        assert_true(hot.r.res.eog);
        text_of(&hot.r.out, 0, hot.r.out.n, t1, sizeof t1);
        if (!is_digits_done(t1)) fail_msg("seed %d: '%s'", (int)seed, t1);
        srun_free(&hot);
    }

    /* A complete grammar that allows nothing but the end: ignore_eos cannot
     * keep it going (nor crash it); it ends with EOG. */
    ks_sample_ext xi = {.grammar = "root ::= \"yes\" | \"no\"", .ignore_eos = true};
    go(&p, &xi, 16, true, &yn_ign);
    assert_int_equal(yn_ign.r.res.finish, KS_FINISH_STOP);
    assert_true(yn_ign.r.res.eog);
    assert_int_equal(yn_ign.r.out.n, yn.r.out.n);
    assert_same_tokens(&yn_ign.r.out, &yn.r.out, yn.r.out.n);

    srun_free(&free_run);
    srun_free(&first);
    srun_free(&yn);
    srun_free(&digits);
    srun_free(&yn_ign);
    ks_tokens_free(&p);
    ks_tokens_free(&blocker);
}

/* ------------------------------------------------------------------ 2 */
/* Bad grammars: ks_engine_grammar_check says why; a submitted one ends the
 * request at plan time with KS_EINVAL, the slot keeps its KV and the next
 * request is served from it. A grammar that allows no token ends its request
 * with KS_EINVAL too, instead of sampling a token it forbids. */
static void test_bad_grammar(void **st) {
    (void)st;
    char err[256];
    assert_int_equal(ks_engine_grammar_check(g_e, "root ::= \"yes\" | \"no\"", err, sizeof err), 0);
    assert_int_equal(ks_engine_grammar_check(g_e, NULL, err, sizeof err), 0);
    assert_int_equal(ks_engine_grammar_check(g_e, "root ::= (\"yes\"", err, sizeof err), KS_EINVAL);
    assert_true(strlen(err) > 0);
    assert_int_equal(ks_engine_grammar_check(g_e, "answer ::= \"yes\"", err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "root")); /* llama's line: the grammar has no 'root' symbol */
    assert_int_equal(ks_engine_grammar_check(g_e, "root ::= undefined-rule", err, sizeof err), KS_EINVAL);
    assert_true(strlen(err) > 0);

    ks_tokens p = {0};
    prompt_of("say something kind", &p);
    srun a, bad, bad_re, dead, b;
    go(&p, NULL, 8, true, &a);
    ks_sample_ext xb = {.grammar = "root ::= (\"yes\""};
    go(&p, &xb, 8, true, &bad);
    assert_int_equal(bad.r.res.finish, KS_FINISH_ERROR);
    assert_int_equal(bad.r.res.error, KS_EINVAL);
    assert_int_equal(bad.r.out.n, 0);
    /* A trigger pattern that is no regex: std::regex_error inside llama.cpp,
     * caught (it would terminate the process otherwise). */
    const char *pats[] = {"(["};
    ks_sample_ext xr = {.grammar = "root ::= \"yes\"", .grammar_lazy = true, .trigger_patterns = pats,
                        .n_trigger_patterns = 1};
    go(&p, &xr, 8, true, &bad_re);
    assert_int_equal(bad_re.r.res.finish, KS_FINISH_ERROR);
    assert_int_equal(bad_re.r.res.error, KS_EINVAL);

    /* A grammar at a dead end from the start: every token it allows (those
     * whose text starts with a digit) banned by logit_bias. */
    ks_logit_bias bans[64];
    int n_bans = 0;
    for (int32_t t = 0; t < ks_engine_n_vocab(g_e); t++) {
        char piece[64];
        int n = ks_engine_piece(g_e, t, piece, sizeof piece);
        if (n > 0 && piece[0] >= '0' && piece[0] <= '9') {
            assert_true(n_bans < 64);
            bans[n_bans++] = (ks_logit_bias){t, -INFINITY};
        }
    }
    assert_true(n_bans >= 10);
    ks_sample_ext xd = {.grammar = "root ::= [0-9] \" done\"", .logit_bias = bans, .n_logit_bias = n_bans};
    go(&p, &xd, 8, true, &dead);
    assert_int_equal(dead.r.res.finish, KS_FINISH_ERROR);
    assert_int_equal(dead.r.res.error, KS_EINVAL);
    assert_int_equal(dead.r.out.n, 0);

    go(&p, NULL, 8, true, &b);
    assert_int_equal(b.r.res.finish == KS_FINISH_ERROR, 0);
    assert_int_equal(b.r.res.n_cached, p.n - 1); /* the KV of `a` was kept through the failures */
    assert_int_equal(b.r.out.n, a.r.out.n);
    assert_same_tokens(&b.r.out, &a.r.out, a.r.out.n);
    srun_free(&a);
    srun_free(&bad);
    srun_free(&bad_re);
    srun_free(&dead);
    srun_free(&b);
    ks_tokens_free(&p);
}

/* ------------------------------------------------------------------ 3 */
/* Lazy grammars: free text up to the trigger, the grammar from it on. The
 * trigger is a token the free greedy output emits at step k (first time). */
static void test_grammar_lazy(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("hello", &p);
    srun u, lt, lp, mism, after;
    go(&p, NULL, 24, true, &u);
    /* The first token from step 3 on that was not emitted before, with a
     * plain word as its text. */
    int k = -1;
    char piece[64];
    for (int i = 3; i < u.r.out.n && k < 0; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= u.r.out.v[j] == u.r.out.v[i];
        int n = ks_engine_piece(g_e, u.r.out.v[i], piece, sizeof piece);
        piece[n] = '\0';
        bool word = n > 1 && piece[0] == ' ' && strspn(piece + 1, "abcdefghijklmnopqrstuvwxyz") == (size_t)n - 1;
        if (!seen && word) k = i;
    }
    assert_true(k >= 3);
    int32_t trig = u.r.out.v[k];
    char before[512], rest[256], gbnf[128];
    text_of(&u.r.out, 0, k, before, sizeof before);
    assert_null(strstr(before, piece)); /* the word pattern below fires first at k too */
    snprintf(gbnf, sizeof gbnf, "root ::= \"%s\" [0-9]{1,3} \" done\"", piece);

    ks_sample_ext xt = {.grammar = gbnf, .grammar_lazy = true, .trigger_tokens = &trig, .n_trigger_tokens = 1};
    go(&p, &xt, 24, true, &lt);
    assert_int_equal(lt.r.res.finish, KS_FINISH_STOP);
    assert_true(lt.r.res.eog);
    assert_true(lt.r.out.n > k + 1);
    assert_same_tokens(&lt.r.out, &u.r.out, k + 1); /* free up to and including the trigger */
    text_of(&lt.r.out, k + 1, lt.r.out.n, rest, sizeof rest);
    if (!is_digits_done(rest)) fail_msg("after the trigger: '%s'", rest);

    /* The same with the word as a regex trigger (what common makes of a word
     * trigger: the escaped word; this one needs no escaping). */
    const char *pat = piece;
    ks_sample_ext xp = {.grammar = gbnf, .grammar_lazy = true, .trigger_patterns = &pat, .n_trigger_patterns = 1};
    go(&p, &xp, 24, true, &lp);
    assert_int_equal(lp.r.res.finish, KS_FINISH_STOP);
    assert_true(lp.r.res.eog);
    assert_int_equal(lp.r.out.n, lt.r.out.n);
    assert_same_tokens(&lp.r.out, &lt.r.out, lt.r.out.n);

    /* A trigger whose text the grammar does not start with: llama.cpp throws
     * in accept ("Unexpected empty grammar stack"); the request ends with
     * KS_EINVAL after the free tokens, the trigger token not emitted. */
    ks_sample_ext xm = {.grammar = "root ::= \"zzz\"", .grammar_lazy = true, .trigger_tokens = &trig,
                        .n_trigger_tokens = 1};
    go(&p, &xm, 24, true, &mism);
    assert_int_equal(mism.r.res.finish, KS_FINISH_ERROR);
    assert_int_equal(mism.r.res.error, KS_EINVAL);
    assert_int_equal(mism.r.out.n, k);
    assert_same_tokens(&mism.r.out, &u.r.out, k);
    go(&p, NULL, 24, true, &after); /* and the scheduler goes on */
    assert_int_equal(after.r.out.n, u.r.out.n);
    assert_same_tokens(&after.r.out, &u.r.out, u.r.out.n);
    srun_free(&u);
    srun_free(&lt);
    srun_free(&lp);
    srun_free(&mism);
    srun_free(&after);
    ks_tokens_free(&p);
}

/* A strict grammar's prefill (llama-server: the generation prompt) is
 * accepted before the first sample: the output is what follows it. */
static void test_grammar_prefill(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("hello", &p);
    srun u, pre, bad_pre, eog_pre;
    go(&p, NULL, 4, true, &u);
    char head[128], gbnf[192], out[64];
    text_of(&u.r.out, 0, 2, head, sizeof head); /* " place do" */
    snprintf(gbnf, sizeof gbnf, "root ::= \"%s\" [0-9]", head);
    ks_sample_ext x = {.grammar = gbnf, .grammar_prefill = u.r.out.v, .n_grammar_prefill = 2};
    go(&p, &x, 8, true, &pre);
    assert_int_equal(pre.r.res.finish, KS_FINISH_STOP);
    assert_true(pre.r.res.eog);
    assert_int_equal(pre.r.out.n, 1);
    text_of(&pre.r.out, 0, 1, out, sizeof out);
    assert_true(strlen(out) == 1 && out[0] >= '0' && out[0] <= '9');
    /* Prefill the grammar does not take (order swapped), or that ends
     * generation (llama.cpp would abort on it): KS_EINVAL at plan time. */
    int32_t swapped[2] = {u.r.out.v[1], u.r.out.v[0]};
    ks_sample_ext xs = {.grammar = gbnf, .grammar_prefill = swapped, .n_grammar_prefill = 2};
    go(&p, &xs, 8, true, &bad_pre);
    assert_int_equal(bad_pre.r.res.finish, KS_FINISH_ERROR);
    assert_int_equal(bad_pre.r.res.error, KS_EINVAL);
    int32_t eos = ks_engine_token_eos(g_e);
    ks_sample_ext xe = {.grammar = gbnf, .grammar_prefill = &eos, .n_grammar_prefill = 1};
    go(&p, &xe, 8, true, &eog_pre);
    assert_int_equal(eog_pre.r.res.finish, KS_FINISH_ERROR);
    assert_int_equal(eog_pre.r.res.error, KS_EINVAL);
    srun_free(&u);
    srun_free(&pre);
    srun_free(&bad_pre);
    srun_free(&eog_pre);
    ks_tokens_free(&p);
}

/* ------------------------------------------------------------------ 4 */
static void test_logit_bias_ignore_eos(void **st) {
    (void)st;
    ks_tokens p = {0}, q = {0};
    prompt_of("hello", &p);
    srun u, up, ban, eos_up, eos_up_ign, q_free, q_ign;
    go(&p, NULL, 12, true, &u);
    assert_int_equal(u.r.res.finish, KS_FINISH_LENGTH);
    int32_t other = u.r.out.v[0] == 900 ? 901 : 900; /* a word the free output does not start with */
    ks_logit_bias b_up = {other, 100.0f};
    ks_sample_ext xu = {.logit_bias = &b_up, .n_logit_bias = 1};
    go(&p, &xu, 12, true, &up);
    assert_int_equal(up.r.out.v[0], other);

    ks_logit_bias b_ban = {u.r.out.v[0], -INFINITY};
    ks_sample_ext xb = {.logit_bias = &b_ban, .n_logit_bias = 1};
    go(&p, &xb, 12, true, &ban);
    assert_true(ban.r.out.n > 0);
    assert_int_not_equal(ban.r.out.v[0], u.r.out.v[0]);
    for (int i = 0; i < ban.r.out.n; i++) assert_int_not_equal(ban.r.out.v[i], u.r.out.v[0]);

    /* EOG biased up ends at once; ignore_eos wins over the bias. */
    ks_logit_bias b_eos = {ks_engine_token_eos(g_e), 100.0f};
    assert_true(b_eos.tok >= 0);
    ks_sample_ext xe = {.logit_bias = &b_eos, .n_logit_bias = 1};
    go(&p, &xe, 12, true, &eos_up);
    assert_true(eos_up.r.res.eog);
    assert_int_equal(eos_up.r.out.n, 0);
    xe.ignore_eos = true;
    go(&p, &xe, 12, true, &eos_up_ign);
    assert_int_equal(eos_up_ign.r.res.finish, KS_FINISH_LENGTH);
    assert_int_equal(eos_up_ign.r.out.n, 12);

    /* A prompt the tiny model ends by itself (EOG after a few tokens): with
     * ignore_eos it runs to max_tokens, the same tokens up to where EOG was. */
    prompt_of("the the the", &q);
    go(&q, NULL, 30, true, &q_free);
    assert_true(q_free.r.res.eog);
    assert_true(q_free.r.out.n < 30);
    ks_sample_ext xi = {.ignore_eos = true};
    go(&q, &xi, 30, true, &q_ign);
    assert_int_equal(q_ign.r.res.finish, KS_FINISH_LENGTH);
    assert_false(q_ign.r.res.eog);
    assert_int_equal(q_ign.r.out.n, 30);
    assert_same_tokens(&q_ign.r.out, &q_free.r.out, q_free.r.out.n);
    for (int i = 0; i < q_ign.r.out.n; i++) assert_false(ks_engine_is_eog(g_e, q_ign.r.out.v[i]));

    srun_free(&u);
    srun_free(&up);
    srun_free(&ban);
    srun_free(&eos_up);
    srun_free(&eos_up_ign);
    srun_free(&q_free);
    srun_free(&q_ign);
    ks_tokens_free(&p);
    ks_tokens_free(&q);
}

/* ------------------------------------------------------------------ 5 */
/* Penalties change a looping greedy output and cut its repeats; the prompt
 * is their history (llama-server accepts it into the chain first). */
static void test_penalties(void **st) {
    (void)st;
    enum { N = 40 };
    ks_tokens p = {0};
    prompt_of("hello", &p);
    srun u, off, rep, freq, pres, qplain, hist;
    go(&p, NULL, N, true, &u);
    int r0 = repeats(&u.r.out);
    assert_true(r0 >= N / 2); /* the tiny model loops on this prompt */

    ks_sample_ext xo = {.repeat_penalty = 1.5f, .frequency_penalty = 1.0f, .repeat_last_n = 0}; /* window 0: off */
    go(&p, &xo, N, true, &off);
    assert_int_equal(off.r.out.n, u.r.out.n);
    assert_same_tokens(&off.r.out, &u.r.out, u.r.out.n);

    const struct { ks_sample_ext x; srun *r; } cases[] = {
        {{.repeat_penalty = 1.5f, .repeat_last_n = 64}, &rep},
        {{.frequency_penalty = 0.5f, .repeat_last_n = 64}, &freq},
        {{.presence_penalty = 0.5f, .repeat_last_n = 64}, &pres},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        go(&p, &cases[c].x, N, true, cases[c].r);
        const ks_tokens *o = &cases[c].r->r.out;
        int n = o->n < u.r.out.n ? o->n : u.r.out.n;
        assert_true(n > 0);
        assert_true(o->n != u.r.out.n || memcmp(o->v, u.r.out.v, sizeof(int32_t) * (size_t)n) != 0);
        if (!(repeats(o) < r0)) fail_msg("case %zu: %d repeats, %d without penalties", c, repeats(o), r0);
    }

    /* A presence penalty no logit of this model survives, over the whole
     * context, on a prompt whose plain output repeats one of its words: no
     * generated token is one of the prompt's (the prompt is history) or an
     * earlier one. */
    ks_tokens q = {0};
    prompt_of("old friends like to read", &q);
    go(&q, NULL, N, true, &qplain);
    ks_sample_ext xh = {.presence_penalty = 1000.0f, .repeat_last_n = -1};
    go(&q, &xh, N, true, &hist);
    assert_true(in_prompt(&qplain.r.out, &q) > 0);
    assert_int_equal(hist.r.out.n, N);
    assert_int_equal(repeats(&hist.r.out), 0);
    assert_int_equal(in_prompt(&hist.r.out, &q), 0);
    ks_tokens_free(&q);
    srun_free(&qplain);

    srun_free(&u);
    srun_free(&off);
    srun_free(&rep);
    srun_free(&freq);
    srun_free(&pres);
    srun_free(&hist);
    ks_tokens_free(&p);
}

/* ks_sampler_accept_history keeps the last repeat_last_n tokens, on an
 * engine of its own (the scheduler's belongs to its thread): a presence
 * penalty on the greedy token g moves the pick off g while g is in the
 * window, and not once four newer tokens have pushed it out of a window of
 * four. */
static void test_history_window(void **st) {
    (void)st;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MODEL");
    ep.n_ctx_seq = 256;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    char err[256];
    assert_int_equal(ks_engine_open(&ep, &e, err, sizeof err), 0);
    ks_tokens p = {0};
    const char *text = "hello there";
    assert_int_equal(ks_engine_tokenize(e, text, strlen(text), true, false, &p), 0);
    ks_batch *b = ks_batch_create(ks_engine_n_batch(e));
    int idx = 0;
    for (int i = 0; i < p.n; i++) idx = ks_batch_add(b, p.v[i], i, 0, i == p.n - 1);
    assert_int_equal(ks_engine_decode(e, b), 0);

    ks_sample_params sp = {0};
    ks_sampler *s = ks_sampler_create(e, &sp);
    int32_t g = ks_sampler_sample(s, e, idx);
    ks_sampler_free(s);
    int32_t hist[5] = {g};
    for (int k = 1; k < 5; k++) hist[k] = (g + k) % ks_engine_n_vocab(e);
    const struct { int last_n; int n_hist; bool moves; } cases[] = {
        {4, 0, false}, /* nothing accepted */
        {4, 1, true},  /* g in the window */
        {4, 5, false}, /* g pushed out by four newer tokens */
        {5, 5, true},
        {-1, 5, true}, /* the whole context */
        {0, 5, false}, /* penalties off: history ignored */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ks_sample_ext x = {.presence_penalty = 1000.0f, .repeat_last_n = cases[c].last_n};
        int rc = -99;
        s = ks_sampler_create_ext(e, &sp, &x, &rc);
        assert_int_equal(rc, 0);
        assert_non_null(s);
        ks_sampler_accept_history(s, hist, cases[c].n_hist);
        int32_t t = ks_sampler_sample(s, e, idx);
        if ((t != g) != cases[c].moves) fail_msg("case %zu: sampled %d, greedy %d", c, t, g);
        ks_sampler_free(s);
    }
    ks_batch_free(b);
    ks_tokens_free(&p);
    ks_engine_free(e);
}

/* ------------------------------------------------------------------ 6 */
static void test_logprobs(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("describe the moon", &p);
    srun plain, lp, none;
    go(&p, NULL, 12, true, &plain);
    ks_sample_ext x = {.n_probs = 5};
    go(&p, &x, 12, true, &lp);
    assert_true(lp.r.res.eog); /* this prompt ends by EOG: no on_probs for it */
    assert_int_equal(lp.r.out.n, plain.r.out.n);
    assert_same_tokens(&lp.r.out, &plain.r.out, plain.r.out.n);
    assert_int_equal(lp.n_probs_calls, lp.r.out.n);
    for (int i = 0; i < lp.n_probs_calls; i++) {
        assert_int_equal(lp.out_n_at_probs[i], i); /* right before on_token */
        assert_int_equal(lp.n_top[i], 5);
        assert_int_equal(lp.sampled[i].tok, lp.r.out.v[i]);
        assert_int_equal(lp.top[i][0].tok, lp.sampled[i].tok); /* greedy: the top token */
        assert_true(lp.top[i][0].logprob == lp.sampled[i].logprob);
        for (int j = 0; j < 5; j++) {
            assert_true(lp.top[i][j].logprob <= 0.0f);
            if (j) assert_true(lp.top[i][j].logprob <= lp.top[i][j - 1].logprob);
        }
    }
    /* The first token against the raw logits: a log-softmax over the whole
     * vocabulary, summing to 1. */
    assert_non_null(lp.logits);
    int nv = lp.n_vocab;
    double mx = -INFINITY, sum = 0.0;
    for (int t = 0; t < nv; t++) mx = lp.logits[t] > mx ? lp.logits[t] : mx;
    for (int t = 0; t < nv; t++) sum += exp(lp.logits[t] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < 5; j++) {
        int32_t t = lp.top[0][j].tok;
        assert_true(fabs(lp.top[0][j].logprob - (lp.logits[t] - lse)) < 1e-4);
    }
    for (int t = 0; t < nv; t++) /* nothing outside the top is above its last */
        assert_true(lp.logits[t] - lse <= lp.top[0][4].logprob + 1e-6 ||
                    t == lp.top[0][0].tok || t == lp.top[0][1].tok || t == lp.top[0][2].tok ||
                    t == lp.top[0][3].tok || t == lp.top[0][4].tok);
    double lse_got = lp.logits[lp.top[0][0].tok] - lp.top[0][0].logprob, total = 0.0;
    for (int t = 0; t < nv; t++) total += exp(lp.logits[t] - lse_got);
    assert_true(fabs(total - 1.0) < 1e-4);

    go(&p, NULL, 12, true, &none); /* no ext: no on_probs */
    assert_int_equal(none.n_probs_calls, 0);
    srun_free(&plain);
    srun_free(&lp);
    srun_free(&none);
    ks_tokens_free(&p);
}

/* ------------------------------------------------------------------ 7 */
/* The ext changes only which token is sampled: a cached second turn with a
 * grammar, penalties and biases reuses exactly what a plain one would and
 * gives, token for token, the uncached run's output. */
static void test_ext_exact_with_cache(void **st) {
    (void)st;
    ks_tokens a = {0}, b = {0};
    prompt_of("tell me a story about a cat", &a);
    ks_logit_bias lb[2] = {{900, 3.0f}, {567, -INFINITY}};
    ks_sample_ext x = {.grammar = "root ::= [a-z ]+", .logit_bias = lb, .n_logit_bias = 2,
                       .repeat_penalty = 1.3f, .repeat_last_n = 64, .frequency_penalty = 0.2f,
                       .presence_penalty = 0.2f};
    srun t1, cached, cold;
    go(&a, &x, 16, true, &t1);
    assert_int_equal(t1.r.res.finish == KS_FINISH_ERROR, 0);
    assert_true(t1.r.out.n > 4);
    /* Turn 2: the first turn, its reply and a new user message. */
    ks_tokens_assign(&b, a.v, a.n);
    ks_tokens_append(&b, t1.r.out.v, t1.r.out.n);
    const char *more = "<|im_end|>\n<|im_start|>user\nand then what<|im_end|>\n<|im_start|>assistant\n";
    assert_int_equal(ks_engine_tokenize(g_e, more, strlen(more), false, true, &b), 0);
    go(&b, &x, 16, true, &cached);
    int held = ks_prefix_kv_after(a.n, t1.r.out.n, t1.r.res.finish == KS_FINISH_STOP);
    assert_int_equal(cached.r.res.n_cached, held);
    assert_string_equal(cached.r.res.cache_mode, "prefix");
    go(&b, &x, 16, false, &cold);
    assert_int_equal(cold.r.res.n_cached, 0);
    assert_int_equal(cached.r.out.n, cold.r.out.n);
    assert_same_tokens(&cached.r.out, &cold.r.out, cold.r.out.n);
    assert_true(cached.r.out.n > 0);
    for (int i = 0; i < cached.r.out.n; i++) assert_int_not_equal(cached.r.out.v[i], 567);
    srun_free(&t1);
    srun_free(&cached);
    srun_free(&cold);
    ks_tokens_free(&a);
    ks_tokens_free(&b);
}

/* ------------------------------------------------------------------ misc */
/* An ext that is all zeros is no ext: greedy output bit-for-bit the same. */
static void test_zero_ext_is_plain(void **st) {
    (void)st;
    ks_tokens p = {0};
    prompt_of("a long question about the history of old maps and roads", &p);
    srun a, b;
    ks_sample_ext zero = {0};
    go(&p, NULL, 24, false, &a);
    go(&p, &zero, 24, false, &b);
    assert_int_equal(a.r.out.n, b.r.out.n);
    assert_same_tokens(&a.r.out, &b.r.out, a.r.out.n);
    assert_int_equal(b.n_probs_calls, 0);
    srun_free(&a);
    srun_free(&b);
    ks_tokens_free(&p);
}

/* Submit refuses an ext that cannot be sampled with; nothing is queued. */
static void test_submit_rejects_bad_ext(void **st) {
    (void)st;
    int32_t toks[4] = {1, 2, 3, 4};
    int32_t bad_tok = ks_engine_n_vocab(g_e);
    const char *null_pat[1] = {NULL};
    ks_logit_bias bias_oob = {bad_tok, 1.0f}, bias_nan = {5, NAN}, bias_inf = {5, INFINITY};
    ks_sample_ext bad[] = {
        {.n_probs = 21},
        {.n_probs = -1},
        {.repeat_last_n = -2},
        {.n_logit_bias = -1},
        {.n_logit_bias = 1}, /* NULL array */
        {.logit_bias = &bias_oob, .n_logit_bias = 1},
        {.logit_bias = &bias_nan, .n_logit_bias = 1},
        {.logit_bias = &bias_inf, .n_logit_bias = 1},
        {.trigger_tokens = &bad_tok, .n_trigger_tokens = 1},
        {.grammar_prefill = &bad_tok, .n_grammar_prefill = 1},
        {.trigger_patterns = null_pat, .n_trigger_patterns = 1},
        {.n_trigger_patterns = -1},
        {.repeat_penalty = -1.0f},
        {.repeat_penalty = NAN},
        {.frequency_penalty = INFINITY},
        {.presence_penalty = NAN},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_req_params p = {0};
        p.tokens = toks;
        p.n_tokens = 4;
        p.max_tokens = 4;
        p.preferred_slot = -1;
        p.ext = &bad[i];
        int rc = ks_sched_submit(g_s, &p, NULL);
        if (rc != KS_EINVAL) fail_msg("bad ext %zu: %s", i, ks_errname(rc));
        assert_int_equal(ks_sampler_ext_check(g_e, &bad[i]), KS_EINVAL);
    }
    ks_sample_ext ok = {.n_probs = KS_N_PROBS_MAX, .repeat_last_n = -1, .repeat_penalty = 1.1f};
    assert_int_equal(ks_sampler_ext_check(g_e, &ok), 0);
    assert_int_equal(ks_sampler_ext_check(g_e, NULL), 0);
    ks_sched_stats stt;
    ks_sched_stats_get(g_s, &stt);
    assert_int_equal(stt.queue_depth, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar_strict),
        cmocka_unit_test(test_bad_grammar),
        cmocka_unit_test(test_grammar_lazy),
        cmocka_unit_test(test_grammar_prefill),
        cmocka_unit_test(test_logit_bias_ignore_eos),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_history_window),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_ext_exact_with_cache),
        cmocka_unit_test(test_zero_ext_is_plain),
        cmocka_unit_test(test_submit_rejects_bad_ext),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * Model tests of the System Prompt Cache and the Incremental Message Cache
 * in the scheduler, on the generated tiny model. Every cached output is
 * compared with a cold (cache off) run of the same prompt.
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

#include "cache/msghash.h"
#include "cache/prefix.h"
#include "cache/spc.h"
#include "engine/engine.h"
#include "sched/sched.h"
#include "run_util.h"

typedef struct conv {
    ks_msg m[16];
    int n;
} conv;

static ks_engine *g_e;
static ks_engine *g_cold_e; /* a separate 1-slot engine for the cold references */
static ks_sched *g_cold;

/* Renders, hashes and submits a conversation; waits; returns the result. */
static void ask(ks_sched *s, const conv *c, bool cache, int slot, bool with_sys, run *x) {
    run_init(x);
    char *text = NULL;
    assert_int_equal(ks_engine_template(g_e, c->m, (size_t)c->n, true, &text), 0);
    ks_tokens toks = {0}, sys = {0};
    assert_int_equal(ks_engine_tokenize(g_e, text, strlen(text), true, true, &toks), 0);
    free(text);
    const char *roles[16], *contents[16];
    uint64_t hashes[17];
    for (int i = 0; i < c->n; i++) {
        roles[i] = c->m[i].role;
        contents[i] = c->m[i].content;
    }
    ks_msghash_prefixes(roles, contents, c->n, hashes);
    ks_req_params p = {0};
    p.tokens = toks.v;
    p.n_tokens = toks.n;
    p.max_tokens = 16;
    p.sample = ks_sample_params_default();
    p.cache_prompt = cache;
    p.preferred_slot = slot;
    p.msg_prefix_hash = hashes;
    p.n_msgs = c->n;
    if (with_sys && !strcmp(c->m[0].role, "system")) {
        assert_int_equal(ks_engine_template(g_e, c->m, 1, false, &text), 0);
        assert_int_equal(ks_engine_tokenize(g_e, text, strlen(text), true, true, &sys), 0);
        free(text);
        p.sys_key = ks_msghash_system("system", c->m[0].content, "tiny");
        p.n_sys_tokens = ks_prefix_common(sys.v, sys.n, toks.v, toks.n) == sys.n ? sys.n : 0;
    }
    p.on_token = run_on_token;
    p.on_done = run_on_done;
    p.ud = x;
    assert_int_equal(ks_sched_submit(s, &p, NULL), 0);
    run_wait(x);
    assert_int_not_equal(x->res.finish, KS_FINISH_ERROR);
    ks_tokens_free(&toks);
    ks_tokens_free(&sys);
}

static void assert_same_output(const run *a, const run *b) {
    assert_int_equal(a->out.n, b->out.n);
    assert_memory_equal(a->out.v, b->out.v, sizeof(int32_t) * (size_t)a->out.n);
}

static ks_sched *open_sched(int n_slots, bool imc, ks_spc *spc) {
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_e;
    sp.n_slots = n_slots;
    sp.imc = imc;
    sp.cache_min_tokens = 16;
    sp.spc = spc;
    ks_sched *s = NULL;
    assert_int_equal(ks_sched_create(&sp, &s), 0);
    return s;
}

static const char *LONG_SYS =
    "You are the support assistant of a large online shop that sells garden tools, seeds, pots, soil "
    "and outdoor furniture. Answer politely, in short sentences, and always suggest one product that fits "
    "the question. Never talk about prices you are not sure of and never promise delivery dates.";

/* SPC: six users with one long system prompt. The system prompt is decoded
 * once; users on the other slot get it restored; outputs equal cold runs. */
static void test_spc_six_users(void **st) {
    (void)st;
    ks_spc *spc = NULL;
    assert_int_equal(ks_spc_create(64 << 20, &spc), 0);
    ks_sched *s = open_sched(3, false, spc);
    const char *users[6] = {"how do I plant tulips", "which soil for roses", "best pot for a lemon tree",
                            "how often to water ferns", "a bench for a small garden", "seeds for a shady spot"};
    for (int i = 0; i < 6; i++) {
        conv c = {.m = {{"system", LONG_SYS}, {"user", users[i]}}, .n = 2};
        run hot, cold;
        ask(s, &c, true, i % 3, true, &hot); /* spread the users over the slots */
        ask(g_cold, &c, false, 0, false, &cold); /* cold reference on its own engine */
        assert_same_output(&hot, &cold);
        if (i == 1 || i == 2) {
            /* first use of slots 1 and 2: the system prompt comes from SPC */
            assert_string_equal(hot.res.cache_mode, "spc");
            assert_true(hot.res.n_cached > 40);
        }
        run_free(&hot);
        run_free(&cold);
    }
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.spc_builds, 1);
    assert_true(stt.cache.spc_hits >= 2);
    /* Hot requests only: one prefill of the system prompt (the first user);
     * the cold references (no sys_key) are not counted. */
    assert_int_equal((int)stt.cache.sys_prompt_prefills, 1);
    ks_spc_stats sps;
    ks_spc_get_stats(spc, &sps);
    assert_int_equal((int)sps.entries, 1);
    assert_true(sps.bytes > 0);
    ks_sched_free(s);
    ks_spc_free(spc);
}

static const char *SYS[5] = {
    "Planner. You plan tasks and split them into small steps for the others to do later.",
    "Coder. You write code in C and explain every function you write in one sentence.",
    "Reviewer. You review code and list every bug you find with its line number and a fix.",
    "Tester. You write the tests for new code and check that every test can fail on a bug.",
    "Writer. You write the documentation and keep the readme true to what the code does."};

/* IMC: 3 sub-agents interleaved on 3 slots: from round 2 on every request
 * is an imc-hash hit that prefills only the new message. */
static void test_imc_three_agents(void **st) {
    (void)st;
    ks_sched *s = open_sched(3, true, NULL);
    conv c[3];
    int prev_prompt[3];
    for (int a = 0; a < 3; a++) c[a] = (conv){.m = {{"system", SYS[a]}, {"user", "start the work now"}}, .n = 2};
    char replies[3][4][256];
    for (int round = 0; round < 4; round++) {
        for (int a = 0; a < 3; a++) {
            run x, cold;
            ask(s, &c[a], true, -1, false, &x);
            if (round == 0) {
                assert_string_equal(x.res.cache_mode, "miss");
            } else {
                assert_string_equal(x.res.cache_mode, "imc-hash");
                /* all of the previous prompt is reused: only the reply's
                 * closing and the new message are prefilled */
                assert_true(x.res.n_cached >= prev_prompt[a]);
                assert_true(x.res.n_prompt - x.res.n_cached < 40);
            }
            ask(g_cold, &c[a], false, 0, false, &cold);
            assert_same_output(&x, &cold);
            prev_prompt[a] = x.res.n_prompt;
            /* the reply text as a client would send it back */
            char *t = replies[a][round];
            t[0] = '\0';
            for (int i = 0; i < x.out.n && strlen(t) < 200; i++) {
                char piece[64];
                int n = ks_engine_piece(g_e, x.out.v[i], piece, sizeof piece - 1);
                if (n < 0 || n > 60) continue;
                piece[n] = '\0';
                strcat(t, piece);
            }
            c[a].m[c[a].n++] = (ks_msg){"assistant", t};
            c[a].m[c[a].n++] = (ks_msg){"user", round % 2 ? "continue with the next step" : "now check it"};
            run_free(&x);
            run_free(&cold);
        }
    }
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_true(stt.cache.imc_hash_hits >= 9);
    ks_sched_free(s);
}

/* IMC: 5 sub-agents on 3 slots: LRU eviction and rebuild, outputs exact. */
static void test_imc_five_agents_lru(void **st) {
    (void)st;
    ks_sched *s = open_sched(3, true, NULL);
    conv c[5];
    for (int a = 0; a < 5; a++) c[a] = (conv){.m = {{"system", SYS[a]}, {"user", "begin"}}, .n = 2};
    int evicted = 0;
    for (int round = 0; round < 2; round++) {
        for (int a = 0; a < 5; a++) {
            run x, cold;
            ask(s, &c[a], true, -1, false, &x);
            if (!strcmp(x.res.cache_mode, "miss") && round > 0) evicted++;
            ask(g_cold, &c[a], false, 0, false, &cold);
            assert_same_output(&x, &cold);
            c[a].m[c[a].n++] = (ks_msg){"assistant", "ok"};
            c[a].m[c[a].n++] = (ks_msg){"user", "go on"};
            run_free(&x);
            run_free(&cold);
        }
    }
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_true(evicted >= 2);
    assert_true(stt.cache.evictions >= 2);
    assert_true(stt.cache.rebuilds >= 5);
    ks_sched_free(s);
}

/* IMC: an assistant message re-sent with different whitespace: no hash
 * match, the token-prefix fallback salvages the common prefix. */
static void test_imc_template_drift(void **st) {
    (void)st;
    ks_sched *s = open_sched(2, true, NULL);
    conv c = {.m = {{"system", SYS[1]}, {"user", "write a function that adds two numbers"}}, .n = 2};
    run x;
    ask(s, &c, true, -1, false, &x);
    run_free(&x);
    c.m[c.n++] = (ks_msg){"assistant", "here is the function you asked for"};
    c.m[c.n++] = (ks_msg){"user", "now make it faster"};
    ask(s, &c, true, -1, false, &x); /* hash hit, extends the branch */
    assert_string_equal(x.res.cache_mode, "imc-hash");
    run_free(&x);
    conv d = c;
    d.m[2].content = "here is  the function you asked for "; /* whitespace drift */
    d.m[d.n++] = (ks_msg){"assistant", "done"};
    d.m[d.n++] = (ks_msg){"user", "thanks"};
    /* expected salvage: the common token prefix with what the slot holds */
    char *text = NULL;
    ks_tokens pd = {0}, pc = {0};
    assert_int_equal(ks_engine_template(g_e, d.m, (size_t)d.n, true, &text), 0);
    assert_int_equal(ks_engine_tokenize(g_e, text, strlen(text), true, true, &pd), 0);
    free(text);
    assert_int_equal(ks_engine_template(g_e, c.m, (size_t)c.n, true, &text), 0);
    assert_int_equal(ks_engine_tokenize(g_e, text, strlen(text), true, true, &pc), 0);
    free(text);
    int lcp = ks_prefix_common(pc.v, pc.n, pd.v, pd.n);
    run y, cold;
    ask(s, &d, true, -1, false, &y);
    assert_string_equal(y.res.cache_mode, "imc-token-prefix");
    assert_int_equal(y.res.n_cached, lcp);
    ask(g_cold, &d, false, 0, false, &cold);
    assert_same_output(&y, &cold);
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.imc_token_prefix_hits, 1);
    assert_int_equal((int)stt.cache.imc_salvaged_tokens, lcp);
    run_free(&y);
    run_free(&cold);
    ks_tokens_free(&pd);
    ks_tokens_free(&pc);
    ks_sched_free(s);
}

static int setup(void **st) {
    (void)st;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MODEL");
    ep.n_seq = 3;
    ep.n_ctx_seq = 2048;
    ep.n_threads = 1;
    char err[256] = "";
    int rc = ks_engine_open(&ep, &g_e, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    ep.n_seq = 1;
    if (!rc) rc = ks_engine_open(&ep, &g_cold_e, err, sizeof err);
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = g_cold_e;
    if (!rc) rc = ks_sched_create(&sp, &g_cold);
    return rc;
}

static int teardown(void **st) {
    (void)st;
    ks_sched_free(g_cold);
    ks_engine_free(g_cold_e);
    ks_engine_free(g_e);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spc_six_users),
        cmocka_unit_test(test_imc_three_agents),
        cmocka_unit_test(test_imc_five_agents_lru),
        cmocka_unit_test(test_imc_template_drift),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * Model tests of the scheduler's checkpoints on the hybrid test model
 * (tiny-hybrid, lfm2; issue 15, policy.c "Checkpoints"): its memory cannot
 * drop a suffix, so each chat turn — which diverges inside the previous
 * reply — rebuilt the whole sequence ("partial-rm-unsupported"). With
 * checkpoints a turn keeps at least the previous prompt, and the greedy
 * output (tokens, first logits bit for bit) equals an uncached scheduler's.
 *
 * The chat is built at the token level so that every turn needs a trim:
 * the next prompt is the previous prompt, the reply without its last two
 * tokens (the rendered reply differs from the generated one in its last
 * tokens, as measured on the bench model), and the next user turn.
 *
 * Env: KS_TINY_HYBRID_MODEL, KS_TINY_MAMBA_MODEL (the CTest fixture
 * `hybrid_models`).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cache/prefix.h"
#include "cache/store.h"
#include "engine/engine.h"
#include "sched/sched.h"
#include "run_util.h"

#define N_TURNS 6
#define MAX_TOKENS 24

static ks_engine *open_model(const char *env, int n_seq) {
    const char *path = getenv(env);
    if (!path || !*path) fail_msg("%s is not set (run through ctest)", env);
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = path;
    ep.n_seq = n_seq;
    ep.n_ctx_seq = 2048;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    char err[256] = "";
    int rc = ks_engine_open(&ep, &e, err, sizeof err);
    if (rc) fail_msg("ks_engine_open %s: %s (%s)", path, ks_strerror(rc), err);
    return e;
}

static ks_engine *open_hybrid_seqs(int n_seq) {
    ks_engine *e = open_model("KS_TINY_HYBRID_MODEL", n_seq);
    assert_true(ks_engine_is_hybrid(e));
    return e;
}

static ks_engine *open_hybrid(void) { return open_hybrid_seqs(1); }

static ks_sched *open_sched(ks_engine *e, int ckpt_max, size_t ckpt_bytes, int gen_interval) {
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = 1;
    sp.ckpt_max = ckpt_max;
    sp.ckpt_bytes = ckpt_bytes;
    sp.ckpt_gen_interval = gen_interval;
    sp.cache_min_tokens = 8; /* the system prompt below gets its checkpoint */
    ks_sched *s = NULL;
    assert_int_equal(ks_sched_create(&sp, &s), 0);
    return s;
}

/* Submits a greedy request for prompt on the slot and waits for it; its
 * result lands in x (on_done gets ud = the struct that starts with x). */
static void submit_wait(ks_sched *s, const ks_tokens *prompt, bool cache, int n_sys, int slot, run *x,
                        void (*on_done)(void *, const ks_req_result *), void *ud) {
    ks_req_params p = {0};
    p.tokens = prompt->v;
    p.n_tokens = prompt->n;
    p.max_tokens = MAX_TOKENS;
    p.sample = ks_sample_params_default(); /* greedy */
    p.cache_prompt = cache;
    p.want_logits = true;
    p.preferred_slot = slot;
    p.sys_key = n_sys > 0 ? 0x5eed : 0;
    p.n_sys_tokens = n_sys;
    p.on_token = run_on_token;
    p.on_done = on_done;
    p.ud = ud;
    assert_int_equal(ks_sched_submit(s, &p, NULL), 0);
    run_wait(x);
    assert_int_not_equal(x->res.finish, KS_FINISH_ERROR);
}

static void once_on(ks_sched *s, const ks_tokens *prompt, bool cache, int n_sys, int slot, run *x) {
    run_init(x);
    submit_wait(s, prompt, cache, n_sys, slot, x, run_on_done, x);
}

static void once(ks_sched *s, const ks_tokens *prompt, bool cache, int n_sys, run *x) {
    once_on(s, prompt, cache, n_sys, 0, x);
}

/* The logits of the first sampled token, kept by on_done's caller. */
typedef struct logit_run {
    run r;
    float *lg;
} logit_run;

static void on_done_logits(void *ud, const ks_req_result *res) {
    logit_run *x = ud;
    if (res->logits) {
        x->lg = malloc(sizeof(float) * (size_t)res->n_vocab);
        if (x->lg) memcpy(x->lg, res->logits, sizeof(float) * (size_t)res->n_vocab);
    }
    run_on_done(&x->r, res);
}

static void once_logits(ks_sched *s, const ks_tokens *prompt, bool cache, int n_sys, logit_run *x) {
    x->lg = NULL;
    run_init(&x->r);
    submit_wait(s, prompt, cache, n_sys, 0, &x->r, on_done_logits, x);
    assert_non_null(x->lg);
}

static void tokenize(ks_engine *e, const char *text, bool add_special, ks_tokens *out) {
    assert_int_equal(ks_engine_tokenize(e, text, strlen(text), add_special, true, out), 0);
}

static void free_pair(ks_sched *s, ks_sched *u, ks_engine *e, ks_engine *e2) {
    ks_sched_free(s);
    ks_sched_free(u);
    ks_engine_free(e);
    ks_engine_free(e2);
}

/* Every turn after the first went back to a checkpoint; none was rebuilt. */
static void assert_every_turn_restored(ks_sched *s) {
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.ckpt_restores, N_TURNS - 1);
    assert_int_equal((int)stt.cache.partial_rm_rebuilds, 0);
}

typedef struct chat_report {
    int n_cached[N_TURNS];
    int n_prev_prompt[N_TURNS]; /* the previous turn's prompt */
    int n_common[N_TURNS];      /* the common prefix with what the slot held */
    char reason[N_TURNS][48];
} chat_report;

/* A 6-turn chat on `cached` (caching) against `plain` (cache_prompt false):
 * tokens and first logits equal turn by turn. */
static void chat6(ks_engine *e, ks_sched *cached, ks_sched *plain, chat_report *rep) {
    static const char *qs[N_TURNS] = {"hello, what is the water like in the river?", "tell me a story about a dog",
                                      "why did the dog run to the river?", "and then what happened",
                                      "describe the river in three words", "say something kind to the dog"};
    const char *sys = "<|im_start|>system\nYou are a helpful assistant who answers in short sentences.<|im_end|>\n";
    ks_tokens prompt = {0}, sys_t = {0}, tail = {0};
    tokenize(e, sys, true, &sys_t);
    ks_tokens_assign(&prompt, sys_t.v, sys_t.n);
    char text[256];
    snprintf(text, sizeof text, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", qs[0]);
    tokenize(e, text, false, &tail);
    ks_tokens_append(&prompt, tail.v, tail.n);
    ks_tokens held = {0}; /* what the cached slot holds after each turn */
    memset(rep, 0, sizeof *rep);
    int nv = ks_engine_n_vocab(e);
    for (int t = 0; t < N_TURNS; t++) {
        logit_run a, b;
        rep->n_common[t] = ks_prefix_common(held.v, held.n, prompt.v, prompt.n);
        once_logits(cached, &prompt, true, sys_t.n, &a);
        once_logits(plain, &prompt, false, sys_t.n, &b);
        rep->n_cached[t] = a.r.res.n_cached;
        snprintf(rep->reason[t], sizeof rep->reason[t], "%s", a.r.res.cache_reason);
        print_message("turn %d: prompt %d, common %d, cached %d (%s), reply %d tokens\n", t + 1, prompt.n,
                      rep->n_common[t], a.r.res.n_cached, a.r.res.cache_reason, a.r.out.n);
        assert_int_equal(b.r.res.n_cached, 0);
        /* Exact only where a lone row computes a batch's bits (the patched
         * CPU backend): a hybrid memory cannot take step.c's pairs. */
        if (!ks_engine_batch_invariant(e)) goto next;
        if (a.r.out.n != b.r.out.n || memcmp(a.r.out.v, b.r.out.v, sizeof(int32_t) * (size_t)b.r.out.n) != 0)
            fail_msg("turn %d: cached reply differs from the uncached one (%d vs %d tokens)", t + 1, a.r.out.n,
                     b.r.out.n);
        if (memcmp(a.lg, b.lg, sizeof(float) * (size_t)nv) != 0)
            fail_msg("turn %d: first logits differ from the uncached run (cached %d tokens, %s)", t + 1,
                     a.r.res.n_cached, a.r.res.cache_reason);
    next:
        assert_true(a.r.out.n >= 1);
        /* What the slot holds: the prompt and the decoded reply. */
        int kv = ks_prefix_kv_after(prompt.n, a.r.res.n_generated, a.r.res.eog);
        ks_tokens_assign(&held, prompt.v, prompt.n);
        ks_tokens_append(&held, a.r.out.v, kv - prompt.n);
        assert_int_equal(held.n, kv);
        /* The next prompt: the reply less its last two tokens, then the next
         * user turn: it diverges inside the reply, so the slot must trim. */
        if (t + 1 < N_TURNS) {
            rep->n_prev_prompt[t + 1] = prompt.n;
            int keep = a.r.out.n > 2 ? a.r.out.n - 2 : 0;
            ks_tokens_append(&prompt, a.r.out.v, keep);
            snprintf(text, sizeof text, "<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n",
                     qs[t + 1]);
            tail.n = 0;
            tokenize(e, text, false, &tail);
            ks_tokens_append(&prompt, tail.v, tail.n);
        }
        free(a.lg);
        free(b.lg);
        run_free(&a.r);
        run_free(&b.r);
    }
    ks_tokens_free(&prompt);
    ks_tokens_free(&sys_t);
    ks_tokens_free(&tail);
    ks_tokens_free(&held);
}

/* Checkpoints at the prompt's end alone (no generation checkpoints), at
 * most 3 a slot: from turn 2 on each turn keeps exactly the previous
 * prompt; the system prompt's checkpoint and the older prompt ends go
 * first. */
static void test_chat_keeps_previous_prompt(void **st) {
    (void)st;
    ks_engine *e = open_hybrid(), *e2 = open_hybrid();
    ks_sched *s = open_sched(e, 3, (size_t)4 << 20, 0);
    ks_sched *u = open_sched(e2, 3, (size_t)4 << 20, 0);
    chat_report rep;
    chat6(e, s, u, &rep);
    for (int t = 1; t < N_TURNS; t++) {
        assert_true(rep.n_common[t] > rep.n_prev_prompt[t]); /* the reply was partly reusable */
        if (rep.n_cached[t] != rep.n_prev_prompt[t])
            fail_msg("turn %d: cached %d, previous prompt %d (%s)", t + 1, rep.n_cached[t], rep.n_prev_prompt[t],
                     rep.reason[t]);
        char want[48];
        snprintf(want, sizeof want, "checkpoint-at-token-%d", rep.n_prev_prompt[t]);
        assert_string_equal(rep.reason[t], want);
    }
    assert_every_turn_restored(s);
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    /* the system prompt's and each prompt end's; 3 kept */
    assert_int_equal((int)stt.cache.ckpt_saves, N_TURNS + 1);
    assert_int_equal((int)stt.cache.ckpt_drops, N_TURNS + 1 - 3);
    ks_sched_stats_get(u, &stt);
    assert_int_equal((int)stt.cache.ckpt_restores, 0);
    free_pair(s, u, e, e2);
}

/* The defaults (generation checkpoints every 16 tokens, a reply keeps its
 * last two): a turn keeps the previous prompt and most of the reply. */
static void test_chat_keeps_reply(void **st) {
    (void)st;
    ks_engine *e = open_hybrid(), *e2 = open_hybrid();
    ks_sched_params d = ks_sched_params_default();
    ks_sched *s = open_sched(e, d.ckpt_max, d.ckpt_bytes, 4);
    ks_sched *u = open_sched(e2, d.ckpt_max, d.ckpt_bytes, 4);
    chat_report rep;
    chat6(e, s, u, &rep);
    int beyond = 0;
    for (int t = 1; t < N_TURNS; t++) {
        if (rep.n_cached[t] < rep.n_prev_prompt[t])
            fail_msg("turn %d: cached %d < previous prompt %d (%s)", t + 1, rep.n_cached[t], rep.n_prev_prompt[t],
                     rep.reason[t]);
        /* at most two intervals of the reply prefilled again */
        if (rep.n_cached[t] < rep.n_common[t] - 2 * 4)
            fail_msg("turn %d: cached %d, common prefix %d (%s)", t + 1, rep.n_cached[t], rep.n_common[t],
                     rep.reason[t]);
        beyond += rep.n_cached[t] > rep.n_prev_prompt[t];
    }
    assert_true(beyond >= 1); /* some reply was long enough for a generation checkpoint */
    assert_every_turn_restored(s);
    free_pair(s, u, e, e2);
}

/* A recurrent model (tiny-mamba, no KV at all): the same checkpoints serve
 * it, its partial state being its whole state (test_hybrid.c). */
static void test_recurrent_chat(void **st) {
    (void)st;
    ks_engine *e = open_model("KS_TINY_MAMBA_MODEL", 1), *e2 = open_model("KS_TINY_MAMBA_MODEL", 1);
    assert_true(ks_engine_is_recurrent(e));
    ks_sched_params d = ks_sched_params_default();
    ks_sched *s = open_sched(e, d.ckpt_max, d.ckpt_bytes, 4);
    ks_sched *u = open_sched(e2, d.ckpt_max, d.ckpt_bytes, 4);
    chat_report rep;
    chat6(e, s, u, &rep);
    for (int t = 1; t < N_TURNS; t++) {
        if (rep.n_cached[t] < rep.n_prev_prompt[t])
            fail_msg("turn %d: cached %d < previous prompt %d (%s)", t + 1, rep.n_cached[t], rep.n_prev_prompt[t],
                     rep.reason[t]);
        assert_int_equal(strncmp(rep.reason[t], "checkpoint-at-token-", 20), 0);
    }
    assert_every_turn_restored(s);
    free_pair(s, u, e, e2);
}

/* A budget of 0 (or a count of 0) is today's rebuild: every turn after the
 * first a full prefill, outputs still exact. */
static void test_no_budget_rebuilds(void **st) {
    (void)st;
    ks_engine *e = open_hybrid(), *e2 = open_hybrid();
    ks_sched *s = open_sched(e, 8, 0, 16);
    ks_sched *u = open_sched(e2, 0, (size_t)4 << 20, 16);
    chat_report rep;
    chat6(e, s, u, &rep);
    for (int t = 1; t < N_TURNS; t++) {
        assert_int_equal(rep.n_cached[t], 0);
        assert_string_equal(rep.reason[t], "partial-rm-unsupported");
    }
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.ckpt_saves, 0);
    assert_int_equal((int)stt.cache.partial_rm_rebuilds, N_TURNS - 1);
    free_pair(s, u, e, e2);
}

/* A conversation that changes its last user message goes back to the
 * checkpoint of the earlier prompt end; one that shares only the system
 * prompt, to the system prompt's checkpoint. The count cap holds. */
static void test_earlier_checkpoints(void **st) {
    (void)st;
    ks_engine *e = open_hybrid(), *e2 = open_hybrid();
    ks_sched *s = open_sched(e, 3, (size_t)4 << 20, 0);
    ks_sched *u = open_sched(e2, 3, (size_t)4 << 20, 0);
    ks_tokens sys_t = {0}, p1 = {0}, p2 = {0}, p3 = {0}, t = {0};
    tokenize(e, "<|im_start|>system\nYou answer about rivers and dogs.<|im_end|>\n", true, &sys_t);
    ks_tokens_assign(&p1, sys_t.v, sys_t.n);
    tokenize(e, "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n", false, &t);
    ks_tokens_append(&p1, t.v, t.n);
    run a1, a2, a3, a4, b;
    once(s, &p1, true, sys_t.n, &a1);
    /* turn 2 after the reply */
    ks_tokens_assign(&p2, p1.v, p1.n);
    ks_tokens_append(&p2, a1.out.v, a1.out.n > 2 ? a1.out.n - 2 : 0);
    t.n = 0;
    tokenize(e, "<|im_end|>\n<|im_start|>user\ntell me about the dog<|im_end|>\n<|im_start|>assistant\n", false, &t);
    ks_tokens_append(&p2, t.v, t.n);
    once(s, &p2, true, sys_t.n, &a2);
    assert_int_equal(a2.res.n_cached, p1.n);
    /* the same turn 2 with another question: back to turn 1's prompt end
     * (p2's own end lies past the divergence) */
    ks_tokens_assign(&p3, p2.v, p2.n - t.n);
    t.n = 0;
    tokenize(e, "<|im_end|>\n<|im_start|>user\nno, about the river<|im_end|>\n<|im_start|>assistant\n", false, &t);
    ks_tokens_append(&p3, t.v, t.n);
    int lcp = ks_prefix_common(p2.v, p2.n, p3.v, p3.n);
    assert_true(lcp > p1.n && lcp < p2.n);
    once(s, &p3, true, sys_t.n, &a3);
    assert_int_equal(a3.res.n_cached, p1.n);
    once(u, &p3, false, sys_t.n, &b);
    if (ks_engine_batch_invariant(e)) { /* see chat6 */
        assert_int_equal(a3.out.n, b.out.n);
        assert_memory_equal(a3.out.v, b.out.v, sizeof(int32_t) * (size_t)b.out.n);
    }
    run_free(&b);
    /* another conversation with the same system prompt: its checkpoint */
    p1.n = sys_t.n;
    t.n = 0;
    tokenize(e, "<|im_start|>user\nsomething else entirely<|im_end|>\n<|im_start|>assistant\n", false, &t);
    ks_tokens_append(&p1, t.v, t.n);
    once(s, &p1, true, sys_t.n, &a4);
    assert_int_equal(a4.res.n_cached, sys_t.n);
    char want[48];
    snprintf(want, sizeof want, "checkpoint-at-token-%d", sys_t.n);
    assert_string_equal(a4.res.cache_reason, want);
    once(u, &p1, false, sys_t.n, &b);
    if (ks_engine_batch_invariant(e)) { /* see chat6 */
        assert_int_equal(a4.out.n, b.out.n);
        assert_memory_equal(a4.out.v, b.out.v, sizeof(int32_t) * (size_t)b.out.n);
    }
    run_free(&b);
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.ckpt_restores, 3);
    run_free(&a1);
    run_free(&a2);
    run_free(&a3);
    run_free(&a4);
    ks_tokens_free(&sys_t);
    ks_tokens_free(&p1);
    ks_tokens_free(&p2);
    ks_tokens_free(&p3);
    ks_tokens_free(&t);
    free_pair(s, u, e, e2);
}

/* The first two turns of a conversation: p1 (system + a question) and p2,
 * which goes on from p1's reply less its last two tokens (so it diverges
 * inside the reply); a1 is p1's run on s (on the given slot). */
static void two_turns(ks_engine *e, ks_sched *s, int slot, const char *q, ks_tokens *sys_t, ks_tokens *p1,
                      ks_tokens *p2, run *a1) {
    ks_tokens t = {0};
    char text[256];
    tokenize(e, "<|im_start|>system\nYou answer about rivers and dogs.<|im_end|>\n", true, sys_t);
    ks_tokens_assign(p1, sys_t->v, sys_t->n);
    snprintf(text, sizeof text, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", q);
    tokenize(e, text, false, &t);
    ks_tokens_append(p1, t.v, t.n);
    once_on(s, p1, true, sys_t->n, slot, a1);
    assert_true(a1->out.n > 2);
    ks_tokens_assign(p2, p1->v, p1->n);
    ks_tokens_append(p2, a1->out.v, a1->out.n - 2);
    t.n = 0;
    tokenize(e, "<|im_end|>\n<|im_start|>user\nand then what happened<|im_end|>\n<|im_start|>assistant\n", false, &t);
    ks_tokens_append(p2, t.v, t.n);
    ks_tokens_free(&t);
}

/* The same reply as an uncached run of prompt on u (where exact: see chat6). */
static void same_as_uncached(ks_engine *e, ks_sched *u, const ks_tokens *prompt, const run *a) {
    run b;
    once(u, prompt, false, 0, &b);
    if (ks_engine_batch_invariant(e)) {
        assert_int_equal(a->out.n, b.out.n);
        assert_memory_equal(a->out.v, b.out.v, sizeof(int32_t) * (size_t)b.out.n);
    }
    run_free(&b);
}

/* Sub-agents on another slot: turn 2 of a conversation whose turn 1 ran on
 * slot 0 goes to slot 1, which copies slot 0's sequence and its
 * checkpoints, and goes back to turn 1's prompt end (a copy used to need a
 * source that was a prefix of the prompt, which a chat turn never is). */
static void test_copy_takes_checkpoints(void **st) {
    (void)st;
    ks_engine *e = open_hybrid_seqs(2), *e2 = open_hybrid();
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = 2;
    sp.ckpt_gen_interval = 0;
    ks_sched *s = NULL, *u = open_sched(e2, 0, 0, 0);
    assert_int_equal(ks_sched_create(&sp, &s), 0);
    ks_tokens sys_t = {0}, p1 = {0}, p2 = {0};
    run a1, a2;
    two_turns(e, s, 0, "hello, what is the water like in the river?", &sys_t, &p1, &p2, &a1);
    once_on(s, &p2, true, 0, 1, &a2);
    assert_string_equal(a2.res.cache_mode, "copy");
    assert_int_equal(a2.res.n_cached, p1.n);
    same_as_uncached(e, u, &p2, &a2);
    ks_sched_stats stt;
    ks_sched_stats_get(s, &stt);
    assert_int_equal((int)stt.cache.slot_copies, 1);
    assert_int_equal((int)stt.cache.ckpt_restores, 1);
    assert_int_equal((int)stt.cache.partial_rm_rebuilds, 0);
    run_free(&a1);
    run_free(&a2);
    ks_tokens_free(&sys_t);
    ks_tokens_free(&p1);
    ks_tokens_free(&p2);
    free_pair(s, u, e, e2);
}

/* Sub-agents on fewer slots, through the store: conversation A's turn 1,
 * then B's on the same slot (A's KV leaves it), then A's turn 2, which
 * diverges inside A's reply: the store holds A's whole state at turn 1's
 * prompt end (reason checkpoint), so turn 2 restores all of turn 1's
 * prompt, not only the last stride boundary of its cold prefill. */
static void test_store_checkpoint(void **st) {
    (void)st;
    ks_engine *e = open_hybrid(), *e2 = open_hybrid();
    ks_store_params p = ks_store_params_default();
    for (int t = 0; t < KS_TIER__N; t++) p.cfg.tier_max_bytes[t] = 0;
    p.cfg.tier_max_bytes[KS_TIER_RAM] = 64u << 20;
    for (int r = 0; r < KS_REASON__N; r++) p.cfg.reason_tier[r] = KS_TIER_RAM;
    p.cfg.reason_tier[KS_REASON_SHUTDOWN] = KS_TIER_NONE;
    p.cfg.stride = 16;
    p.cfg.min_tokens = 16;
    char kv[256];
    ks_engine_kv_params(e, kv, sizeof kv);
    p.kv_params = kv;
    p.kv_params_len = strlen(kv);
    p.state_version = ks_engine_state_version();
    ks_store *store = NULL;
    char err[256] = "";
    if (ks_store_open(&p, &store, err, sizeof err) != 0) fail_msg("ks_store_open: %s", err);
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = 1;
    sp.store = store;
    sp.store_stride = 16;
    sp.store_min_tokens = 16;
    sp.continued_interval = 0;
    sp.ckpt_gen_interval = 0;
    ks_sched *s = NULL, *u = open_sched(e2, 0, 0, 0);
    assert_int_equal(ks_sched_create(&sp, &s), 0);

    ks_tokens sys_a = {0}, a1p = {0}, a2p = {0}, sys_b = {0}, b1p = {0}, b2p = {0};
    run a1, b1, a2;
    two_turns(e, s, 0, "hello, what is the water like in the river?", &sys_a, &a1p, &a2p, &a1);
    assert_true(a1p.n % 16 != 0); /* the prompt's end is not a stride boundary */
    two_turns(e, s, 0, "tell me a story about a dog that swims", &sys_b, &b1p, &b2p, &b1);
    once(s, &a2p, true, 0, &a2);
    assert_string_equal(a2.res.cache_mode, "store");
    assert_int_equal(a2.res.n_cached, a1p.n);
    same_as_uncached(e, u, &a2p, &a2);
    assert_int_equal(ks_store_flush(store, 30000), 0); /* saves are written by the writer thread */
    struct ks_store_stats ss;
    ks_store_stats(store, &ss);
    assert_int_equal((int)ss.saves[KS_REASON_CHECKPOINT], 3); /* a1's, b1's and a2's prompt ends */

    run_free(&a1);
    run_free(&b1);
    run_free(&a2);
    ks_tokens_free(&sys_a);
    ks_tokens_free(&a1p);
    ks_tokens_free(&a2p);
    ks_tokens_free(&sys_b);
    ks_tokens_free(&b1p);
    ks_tokens_free(&b2p);
    ks_sched_free(s);
    ks_sched_free(u);
    ks_store_close(store);
    ks_engine_free(e);
    ks_engine_free(e2);
}

int main(void) {
    if (getenv("KS_TEST_DEBUG")) ks_log_set_level(KS_LOG_DEBUG);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_keeps_previous_prompt),
        cmocka_unit_test(test_chat_keeps_reply),
        cmocka_unit_test(test_no_budget_rebuilds),
        cmocka_unit_test(test_recurrent_chat),
        cmocka_unit_test(test_earlier_checkpoints),
        cmocka_unit_test(test_copy_takes_checkpoints),
        cmocka_unit_test(test_store_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_route.c — slot routing (src/cache/route.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/msghash.h"
#include "cache/route.h"

/* Token streams: seq(base)[i] = base + i, so two streams share a prefix
 * exactly when they were written from the same base up to a point. */
static void fill(int32_t *t, int n, int32_t base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static ks_route_slot mk_slot(int id, const int32_t *tokens, int n, int64_t used) {
    return (ks_route_slot){.id = id, .tokens = tokens, .n_tokens = n, .last_used_us = used};
}

static const ks_route_cfg k_prefix_cfg = {.imc = false, .cache_min_tokens = 100, .affinity_min = 0.05f};
static const ks_route_cfg k_imc_cfg = {.imc = true, .cache_min_tokens = 100, .affinity_min = 0.05f};

static ks_route route_ok(const ks_route_slot *s, int n, const ks_route_req *req,
                         const ks_route_cfg *cfg) {
    ks_route r;
    memset(&r, 0x5a, sizeof r);
    assert_int_equal(ks_route_select(s, n, req, cfg, &r), 0);
    return r;
}

/* ---------------------------------------------------------------- basics */
static void test_mode_names(void **state) {
    (void)state;
    assert_string_equal(ks_route_mode_name(KS_ROUTE_IMC_HASH), "imc-hash");
    assert_string_equal(ks_route_mode_name(KS_ROUTE_IMC_TOKEN_PREFIX), "imc-token-prefix");
    assert_string_equal(ks_route_mode_name(KS_ROUTE_PREFIX), "prefix");
    assert_string_equal(ks_route_mode_name(KS_ROUTE_MISS), "miss");
    assert_string_equal(ks_route_mode_name(99), "?");
}

static void test_invalid_and_busy(void **state) {
    (void)state;
    int32_t p[4];
    fill(p, 4, 1);
    ks_route_slot s[2] = {mk_slot(0, NULL, 0, 0), mk_slot(1, NULL, 0, 0)};
    ks_route_req req = {.tokens = p, .n_tokens = 4, .cache_prompt = true};
    ks_route r;
    s[0].busy = true;
    s[1].pending = true;
    assert_int_equal(ks_route_select(s, 2, &req, &k_prefix_cfg, &r), KS_EBUSY);
    assert_int_equal(ks_route_select(s, 2, &req, &k_imc_cfg, &r), KS_EBUSY);
    req.cache_prompt = false;
    assert_int_equal(ks_route_select(s, 2, &req, &k_prefix_cfg, &r), KS_EBUSY);
    req.n_tokens = 0;
    assert_int_equal(ks_route_select(s, 2, &req, &k_prefix_cfg, &r), KS_EINVAL);
    req.n_tokens = 4;
    assert_int_equal(ks_route_select(s, 0, &req, &k_prefix_cfg, &r), KS_EINVAL);
    assert_int_equal(ks_route_select(NULL, 2, &req, &k_prefix_cfg, &r), KS_EINVAL);
    assert_int_equal(ks_route_select(s, 2, &req, &k_prefix_cfg, NULL), KS_EINVAL);
}

/* ---------------------------------------------------------- cache disabled */
static void test_cache_disabled_prefers_empty_then_lru(void **state) {
    (void)state;
    int32_t p[50], a[50], b[50];
    fill(p, 50, 1);
    fill(a, 50, 1); /* slot 0 holds exactly the prompt: still not reused */
    fill(b, 50, 500);
    ks_route_slot s[3] = {mk_slot(0, a, 50, 10), mk_slot(1, b, 50, 5), mk_slot(2, NULL, 0, 20)};
    ks_route_req req = {.tokens = p, .n_tokens = 50, .cache_prompt = false};
    ks_route r = route_ok(s, 3, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 2);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_int_equal(r.n_reuse, 0);
    assert_int_equal(r.n_common, 0);
    assert_string_equal(r.reason, "cache-disabled");
    s[2].busy = true; /* no empty slot: least recently used */
    r = route_ok(s, 3, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.n_reuse, 0);
    assert_string_equal(r.reason, "cache-disabled");
}

/* ------------------------------------------------- IMC off: prefix affinity */
static void test_prefix_longest_common_wins(void **state) {
    (void)state;
    int32_t p[100], a[40], b[80], c[30];
    fill(p, 100, 1);
    fill(a, 40, 1);
    fill(b, 80, 1);
    b[60] = -1; /* slot 1 diverges at 60 */
    fill(c, 30, 1);
    ks_route_slot s[4] = {mk_slot(0, a, 40, 1), mk_slot(1, b, 80, 2), mk_slot(2, c, 30, 3),
                          mk_slot(3, NULL, 0, 0)};
    ks_route_req req = {.tokens = p, .n_tokens = 100, .cache_prompt = true};
    ks_route r = route_ok(s, 4, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_PREFIX);
    assert_int_equal(r.n_common, 60);
    assert_int_equal(r.n_reuse, 60);
    assert_string_equal(r.reason, "diverged-at-token-60");

    /* the slot's whole content reused, the rest is new: nothing more to get */
    s[1].busy = true;
    r = route_ok(s, 4, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.n_common, 40);
    assert_int_equal(r.n_reuse, 40);
    assert_string_equal(r.reason, "");
}

static void test_prefix_whole_prompt_but_last_token(void **state) {
    (void)state;
    int32_t p[20], a[35];
    fill(p, 20, 1);
    fill(a, 35, 1); /* the slot holds the prompt plus a generated reply */
    ks_route_slot s[1] = {mk_slot(0, a, 35, 1)};
    ks_route_req req = {.tokens = p, .n_tokens = 20, .cache_prompt = true};
    ks_route r = route_ok(s, 1, &req, &k_prefix_cfg);
    assert_int_equal(r.mode, KS_ROUTE_PREFIX);
    assert_int_equal(r.n_common, 20);
    assert_int_equal(r.n_reuse, 19); /* the last token is decoded for its logits */
    assert_string_equal(r.reason, "");
}

static void test_prefix_below_affinity_takes_empty_slot(void **state) {
    (void)state;
    int32_t p[100], a[100];
    fill(p, 100, 1);
    fill(a, 100, 1);
    a[4] = -1; /* 4 common tokens < 0.05 * 100 */
    ks_route_slot s[2] = {mk_slot(0, a, 100, 1), mk_slot(1, NULL, 0, 0)};
    ks_route_req req = {.tokens = p, .n_tokens = 100, .cache_prompt = true};
    ks_route r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_int_equal(r.n_reuse, 0);
    assert_string_equal(r.reason, "below-threshold");

    /* 5 common tokens reach the threshold, but they are a small part of
     * slot 0's conversation and an empty slot is free: slot 0 is kept */
    a[4] = 5;
    a[5] = -1;
    r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_string_equal(r.reason, "no-slot");
    /* without a free slot the 5 tokens are reused */
    s[1].busy = true;
    r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.mode, KS_ROUTE_PREFIX);
    assert_int_equal(r.n_reuse, 5);
    s[1].busy = false;

    /* below threshold, no empty slot: the LRU slot, keeping its exact prefix */
    a[5] = 6;
    a[4] = -1;
    s[1].busy = true;
    r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_int_equal(r.n_common, 4);
    assert_int_equal(r.n_reuse, 4);
    assert_string_equal(r.reason, "evicted"); /* its branch is gone, whatever it shared */
}

static void test_prefix_no_match_reasons(void **state) {
    (void)state;
    int32_t p[10], a[10], b[10];
    fill(p, 10, 1);
    fill(a, 10, 100);
    fill(b, 10, 200);
    ks_route_slot s[3] = {mk_slot(0, a, 10, 7), mk_slot(1, NULL, 0, 9), mk_slot(2, b, 10, 3)};
    ks_route_req req = {.tokens = p, .n_tokens = 10, .cache_prompt = true};
    ks_route r = route_ok(s, 3, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_string_equal(r.reason, "no-slot");
    s[1].pending = true;
    r = route_ok(s, 3, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 2); /* oldest last_used */
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_int_equal(r.n_reuse, 0);
    assert_string_equal(r.reason, "evicted");
}

static void test_ties_go_to_lowest_id_not_index(void **state) {
    (void)state;
    int32_t p[10], a[10];
    fill(p, 10, 1);
    fill(a, 10, 1);
    /* listed in descending id order */
    ks_route_slot s[3] = {mk_slot(7, a, 10, 1), mk_slot(5, a, 10, 1), mk_slot(6, a, 10, 1)};
    ks_route_req req = {.tokens = p, .n_tokens = 10, .cache_prompt = true};
    assert_int_equal(route_ok(s, 3, &req, &k_prefix_cfg).slot, 5);
    assert_int_equal(route_ok(s, 3, &req, &k_imc_cfg).slot, 5);
    /* equal LRU times */
    int32_t q[10];
    fill(q, 10, 900);
    req.tokens = q;
    assert_int_equal(route_ok(s, 3, &req, &k_prefix_cfg).slot, 5);
    /* equal emptiness */
    ks_route_slot e[3] = {mk_slot(4, NULL, 0, 1), mk_slot(2, NULL, 0, 9), mk_slot(3, NULL, 0, 0)};
    assert_int_equal(route_ok(e, 3, &req, &k_prefix_cfg).slot, 2);
}

static void test_pending_slot_never_chosen_twice(void **state) {
    (void)state;
    int32_t p[50], a[50];
    fill(p, 50, 1);
    fill(a, 50, 1);
    for (int imc = 0; imc < 2; imc++) {
        const ks_route_cfg *cfg = imc ? &k_imc_cfg : &k_prefix_cfg;
        /* both requests want slot 0 (longest prefix); two empty slots race */
        ks_route_slot s[3] = {mk_slot(0, a, 50, 1), mk_slot(1, NULL, 0, 0), mk_slot(2, NULL, 0, 0)};
        ks_route_req req = {.tokens = p, .n_tokens = 50, .cache_prompt = true};
        int seen[3] = {0};
        for (int k = 0; k < 3; k++) {
            ks_route r = route_ok(s, 3, &req, cfg);
            assert_in_range(r.slot, 0, 2);
            assert_int_equal(seen[r.slot], 0);
            seen[r.slot] = 1;
            s[r.slot].pending = true; /* what the scheduler does before the next pick */
        }
        ks_route r;
        assert_int_equal(ks_route_select(s, 3, &req, cfg, &r), KS_EBUSY);
    }
}

/* ------------------------------------------------------------------ IMC */
/* A conversation branch: n messages of tokens seq(base), 10 tokens each. */
typedef struct branch {
    const char *roles[8];
    const char *contents[8];
    char text[8][32];
    uint64_t hash[9];
    int32_t tok[80];
} branch;

static void mk_branch(branch *b, int id, int n_msgs) {
    for (int k = 0; k < n_msgs; k++) {
        b->roles[k] = k == 0 ? "system" : (k % 2 ? "user" : "assistant");
        snprintf(b->text[k], sizeof b->text[k], "branch %d msg %d", id, k);
        b->contents[k] = b->text[k];
    }
    ks_msghash_prefixes(b->roles, b->contents, n_msgs, b->hash);
    fill(b->tok, 10 * n_msgs, 1000 * (id + 1));
}

/* The slot holds messages [0, n) of b (10 tokens per message). */
static void hold(ks_route_slot *s, const branch *b, int n, int64_t used) {
    s->tokens = b->tok;
    s->n_tokens = 10 * n;
    s->msg_hash = b->hash[n];
    s->n_msgs_cached = n;
    s->last_used_us = used;
}

static ks_route_req ask(const branch *b, int n) {
    return (ks_route_req){.tokens = b->tok, .n_tokens = 10 * n, .msg_prefix_hash = b->hash,
                          .n_msgs = n, .cache_prompt = true};
}

static void test_imc_hash_prefers_most_cached_messages(void **state) {
    (void)state;
    branch b;
    mk_branch(&b, 1, 7);
    ks_route_slot s[4] = {mk_slot(0, NULL, 0, 0), mk_slot(1, NULL, 0, 0), mk_slot(2, NULL, 0, 0),
                          mk_slot(3, NULL, 0, 0)};
    hold(&s[0], &b, 2, 100);
    hold(&s[1], &b, 4, 50);
    hold(&s[2], &b, 7, 10); /* more messages than the request: skipped */
    ks_route_req req = ask(&b, 5);
    ks_route r = route_ok(s, 4, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_IMC_HASH);
    assert_int_equal(r.n_common, 40);
    assert_int_equal(r.n_reuse, 40);
    assert_string_equal(r.reason, "");
    /* the better slot busy: the next best hash match */
    s[1].busy = true;
    r = route_ok(s, 4, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.mode, KS_ROUTE_IMC_HASH);
    assert_int_equal(r.n_reuse, 20);
}

static void test_imc_hash_beats_longer_token_prefix(void **state) {
    (void)state;
    branch b, other;
    mk_branch(&b, 1, 5);
    mk_branch(&other, 1, 5); /* same tokens, different hash chain */
    other.hash[4] ^= 1;
    ks_route_slot s[2] = {mk_slot(0, NULL, 0, 0), mk_slot(1, NULL, 0, 0)};
    hold(&s[0], &other, 4, 1); /* 40 common tokens but no hash match */
    hold(&s[1], &b, 2, 1);     /* hash match on 2 messages */
    ks_route_req req = ask(&b, 5);
    ks_route r = route_ok(s, 2, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_IMC_HASH);
}

static void test_imc_hash_reports_real_token_prefix(void **state) {
    (void)state;
    branch b;
    mk_branch(&b, 1, 5);
    int32_t slot_tok[40];
    memcpy(slot_tok, b.tok, sizeof slot_tok);
    slot_tok[25] = -7; /* the template rendered differently this time */
    ks_route_slot s[1] = {mk_slot(0, NULL, 0, 0)};
    hold(&s[0], &b, 4, 1);
    s[0].tokens = slot_tok;
    ks_route_req req = ask(&b, 5);
    ks_route r = route_ok(s, 1, &req, &k_imc_cfg);
    assert_int_equal(r.mode, KS_ROUTE_IMC_HASH);
    assert_int_equal(r.n_common, 25);
    assert_int_equal(r.n_reuse, 25);
    assert_string_equal(r.reason, "diverged-at-token-25");
}

static void test_imc_token_prefix_threshold(void **state) {
    (void)state;
    int32_t p[300], a[200], b[200];
    fill(p, 300, 1);
    fill(a, 200, 1);
    fill(b, 200, 1);
    a[150] = -1; /* 150 common */
    b[120] = -1; /* 120 common */
    uint64_t h[3] = {1, 2, 3};
    ks_route_slot s[3] = {mk_slot(0, b, 200, 1), mk_slot(1, a, 200, 2), mk_slot(2, NULL, 0, 0)};
    s[0].msg_hash = 77; /* no hash matches */
    s[0].n_msgs_cached = 2;
    s[1].msg_hash = 78;
    s[1].n_msgs_cached = 2;
    ks_route_req req = {.tokens = p, .n_tokens = 300, .msg_prefix_hash = h, .n_msgs = 2,
                        .cache_prompt = true};
    ks_route r = route_ok(s, 3, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_IMC_TOKEN_PREFIX);
    assert_int_equal(r.n_common, 150);
    assert_int_equal(r.n_reuse, 150);
    assert_string_equal(r.reason, "diverged-at-token-150");

    /* below cache_min_tokens: the empty slot, nothing reused */
    ks_route_cfg strict = k_imc_cfg;
    strict.cache_min_tokens = 151;
    r = route_ok(s, 3, &req, &strict);
    assert_int_equal(r.slot, 2);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_int_equal(r.n_reuse, 0);
    assert_string_equal(r.reason, "below-threshold");

    /* exactly at the threshold is enough */
    strict.cache_min_tokens = 150;
    r = route_ok(s, 3, &req, &strict);
    assert_int_equal(r.mode, KS_ROUTE_IMC_TOKEN_PREFIX);

    /* raw completion (no message hashes): the token fallback directly */
    req.msg_prefix_hash = NULL;
    req.n_msgs = 0;
    r = route_ok(s, 3, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_IMC_TOKEN_PREFIX);

    /* nothing in common at all, no empty slot: LRU eviction */
    int32_t q[300];
    fill(q, 300, 5000);
    req.tokens = q;
    s[2].busy = true;
    r = route_ok(s, 3, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_string_equal(r.reason, "evicted");
    s[2].busy = false;
    r = route_ok(s, 3, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 2);
    assert_string_equal(r.reason, "no-slot");
}

/* Beyond the seed: a token-prefix salvage that would destroy most of another
 * branch (shared part < half of that slot) takes a free empty slot instead;
 * without an empty slot the salvage goes ahead. */
static void test_imc_token_prefix_keeps_other_branch(void **state) {
    (void)state;
    int32_t p[300], a[400];
    fill(p, 300, 1);
    fill(a, 400, 1);
    a[150] = -1; /* 150 of the slot's 400 tokens shared: < half */
    uint64_t h[3] = {1, 2, 3};
    ks_route_slot s[2] = {mk_slot(0, a, 400, 1), mk_slot(1, NULL, 0, 0)};
    s[0].msg_hash = 77;
    s[0].n_msgs_cached = 2;
    ks_route_req req = {.tokens = p, .n_tokens = 300, .msg_prefix_hash = h, .n_msgs = 2,
                        .cache_prompt = true};
    ks_route r = route_ok(s, 2, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_string_equal(r.reason, "no-slot");
    /* no empty slot: salvage */
    s[1].busy = true;
    r = route_ok(s, 2, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.mode, KS_ROUTE_IMC_TOKEN_PREFIX);
    assert_int_equal(r.n_reuse, 150);
    /* more than half shared (same conversation drifted): salvage even with an empty slot */
    s[1].busy = false;
    a[150] = 151;
    a[250] = -1; /* 250 of 400 shared */
    r = route_ok(s, 2, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.mode, KS_ROUTE_IMC_TOKEN_PREFIX);
    assert_int_equal(r.n_reuse, 250);
}

/* A match that is no more than the system prompt SPC can restore gives way
 * to an empty slot, even when it is most of the other slot (a long shared
 * system prompt and short turns); without SPC holding it, the match wins. */
static void test_spc_prompt_match_prefers_empty_slot(void **state) {
    (void)state;
    int32_t p[1000], a[1000];
    fill(p, 1000, 1);
    fill(a, 1000, 1);
    a[905] = -1; /* 905 shared of the slot's 1000: most of it */
    ks_route_slot s[2] = {mk_slot(0, a, 1000, 1), mk_slot(1, NULL, 0, 0)};
    ks_route_req req = {.tokens = p, .n_tokens = 1000, .cache_prompt = true};
    ks_route r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.mode, KS_ROUTE_PREFIX);
    req.spc_tokens = 900; /* SPC holds the first 900: take the empty slot */
    r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    req.spc_tokens = 800; /* the match goes well past what SPC holds: reuse it */
    r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 0);
    s[1].busy = true; /* no empty slot: reuse it */
    req.spc_tokens = 900;
    r = route_ok(s, 2, &req, &k_prefix_cfg);
    assert_int_equal(r.slot, 0);
}

static void test_imc_zero_cached_messages_never_hash_match(void **state) {
    (void)state;
    branch b;
    mk_branch(&b, 1, 3);
    ks_route_slot s[2] = {mk_slot(0, NULL, 0, 0), mk_slot(1, NULL, 0, 0)};
    int32_t t[5];
    fill(t, 5, 77777);
    s[0] = mk_slot(0, t, 5, 1);
    s[0].msg_hash = b.hash[0]; /* the empty-prefix hash, 0 messages */
    s[0].n_msgs_cached = 0;
    ks_route_req req = ask(&b, 3);
    ks_route r = route_ok(s, 2, &req, &k_imc_cfg);
    assert_int_equal(r.slot, 1);
    assert_int_equal(r.mode, KS_ROUTE_MISS);
    assert_string_equal(r.reason, "no-slot");
}

/* Five conversation branches take turns on three slots: each routing marks
 * the slot as the scheduler would after the turn. */
static void test_imc_five_branches_three_slots_lru(void **state) {
    (void)state;
    branch br[5];
    for (int i = 0; i < 5; i++) mk_branch(&br[i], i, 6);
    ks_route_slot s[3] = {mk_slot(0, NULL, 0, 0), mk_slot(1, NULL, 0, 0), mk_slot(2, NULL, 0, 0)};
    int64_t clock = 100;
    struct { int branch, n_msgs, slot, mode; const char *reason; } plan[] = {
        {0, 2, 0, KS_ROUTE_MISS, "no-slot"},
        {1, 2, 1, KS_ROUTE_MISS, "no-slot"},
        {2, 2, 2, KS_ROUTE_MISS, "no-slot"},
        {0, 4, 0, KS_ROUTE_IMC_HASH, ""},     /* branch 0 continues in its slot */
        {3, 2, 1, KS_ROUTE_MISS, "evicted"},  /* LRU: branch 1's slot (used at 101) */
        {4, 2, 2, KS_ROUTE_MISS, "evicted"},  /* LRU: branch 2's slot (used at 102) */
        {1, 4, 0, KS_ROUTE_MISS, "evicted"},  /* branch 1 comes back: its slot is gone */
        {3, 4, 1, KS_ROUTE_IMC_HASH, ""},
        {4, 6, 2, KS_ROUTE_IMC_HASH, ""},
    };
    for (size_t k = 0; k < sizeof plan / sizeof plan[0]; k++) {
        branch *b = &br[plan[k].branch];
        ks_route_req req = ask(b, plan[k].n_msgs);
        ks_route r = route_ok(s, 3, &req, &k_imc_cfg);
        assert_int_equal(r.slot, plan[k].slot);
        assert_int_equal(r.mode, plan[k].mode);
        assert_string_equal(r.reason, plan[k].reason);
        /* after the turn the slot caches all messages of the request */
        hold(&s[r.slot], b, plan[k].n_msgs, clock++);
    }
}

static void test_inputs_are_not_modified(void **state) {
    (void)state;
    branch b;
    mk_branch(&b, 1, 5);
    ks_route_slot s[3] = {mk_slot(0, NULL, 0, 0), mk_slot(1, NULL, 0, 0), mk_slot(2, NULL, 0, 0)};
    hold(&s[0], &b, 2, 1);
    hold(&s[1], &b, 4, 2);
    s[2].busy = true;
    ks_route_slot s_copy[3];
    memcpy(s_copy, s, sizeof s);
    branch b_copy = b;
    ks_route_req req = ask(&b, 5);
    ks_route_req req_copy = req;
    ks_route_cfg cfg = k_imc_cfg, cfg_copy = cfg;
    (void)route_ok(s, 3, &req, &cfg);
    cfg.imc = false;
    cfg_copy.imc = false;
    (void)route_ok(s, 3, &req, &cfg);
    assert_memory_equal(s, s_copy, sizeof s);
    assert_memory_equal(&b, &b_copy, sizeof b);
    assert_memory_equal(&req, &req_copy, sizeof req);
    assert_memory_equal(&cfg, &cfg_copy, sizeof cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_names),
        cmocka_unit_test(test_invalid_and_busy),
        cmocka_unit_test(test_cache_disabled_prefers_empty_then_lru),
        cmocka_unit_test(test_prefix_longest_common_wins),
        cmocka_unit_test(test_prefix_whole_prompt_but_last_token),
        cmocka_unit_test(test_prefix_below_affinity_takes_empty_slot),
        cmocka_unit_test(test_prefix_no_match_reasons),
        cmocka_unit_test(test_ties_go_to_lowest_id_not_index),
        cmocka_unit_test(test_pending_slot_never_chosen_twice),
        cmocka_unit_test(test_imc_hash_prefers_most_cached_messages),
        cmocka_unit_test(test_imc_hash_beats_longer_token_prefix),
        cmocka_unit_test(test_imc_hash_reports_real_token_prefix),
        cmocka_unit_test(test_imc_token_prefix_threshold),
        cmocka_unit_test(test_imc_token_prefix_keeps_other_branch),
        cmocka_unit_test(test_spc_prompt_match_prefers_empty_slot),
        cmocka_unit_test(test_imc_zero_cached_messages_never_hash_match),
        cmocka_unit_test(test_imc_five_branches_three_slots_lru),
        cmocka_unit_test(test_inputs_are_not_modified),
    };
    ks_log_set_level(KS_LOG_DEBUG); /* exercise the IMC debug lines too */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

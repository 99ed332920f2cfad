/*
 * Model tests of the tokenization cache (engine/tokcache.h): a text
 * tokenized in pieces, from the cache or not, must be the tokens of the whole
 * text tokenized by llama.cpp — on the vocabularies of every real template
 * setup installs (their special tokens), for texts built to meet the cuts'
 * corner cases (special tokens side by side, at the ends, halves of them,
 * whitespace around them); a conversation sent again with one message more
 * must take its earlier messages from the cache; one namespace's pieces never
 * answer for another's; the budget holds.
 *
 * Env: KS_TEMPLATES_DIR (as ctest sets it). KS_TOKCACHE_CHECK is cleared:
 * this test compares for itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/mkmodel.h"
#include "engine/tokcache.h"
#include "model/mkmodel_util.h"
#include "model/tmpl_util.h"
#include "prompt/prompt_tmpl.h"

static const char *const TEMPLATES[] = {
    "Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407",
    "openai-gpt-oss-120b",
};
#define N_TEMPLATES (sizeof TEMPLATES / sizeof TEMPLATES[0])

/* What texts are made of: the templates' special tokens, halves and
 * neighbours of them, words, whitespace, other scripts. */
static const char *const FRAGS[] = {
    "<|im_start|>", "<|im_end|>", "<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n",
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>", "[INST]",
    "[/INST]", "[TOOL_CALLS]", "<s>", "</s>", "<unk>", "<|start|>", "<|end|>", "<|channel|>", "<|message|>",
    "<|return|>", "<|call|>", "<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_", "start|>", "<|",
    "|>", "<", ">", "[", "]", "/", " ", "  ", "\n", "\n\n", "\t", " \n ", "hello", " world", "The", " quick",
    "brown", " fox.", "def f(x):\n    return x", "{\"a\": [1, 2]}", "caf\xc3\xa9", " \xe6\x97\xa5\xe6\x9c\xac",
    "\xf0\x9f\x99\x82", "12345", "  indented", "tool", "assistant", "user", "system",
};
#define N_FRAGS (sizeof FRAGS / sizeof FRAGS[0])

static char g_dir[64];

static int setup(void **st) {
    (void)st;
    unsetenv("KS_TOKCACHE_CHECK");
    return tmpl_dir_make(g_dir, sizeof g_dir, "test_tokcache");
}

static int teardown(void **st) {
    (void)st;
    tmpl_dir_remove(g_dir, N_TEMPLATES);
    return 0;
}

typedef tmpl_fixture fixture;

/* The tiny model with template i, its engine and its template object. */
static fixture open_model(size_t i) { return tmpl_open(g_dir, i, TEMPLATES[i]); }

/* The tokens of text through c must be the whole text's. */
static void expect_same(const fixture *f, ks_tokcache *c, uint64_t ns, const char *text, size_t len, const char *what) {
    ks_tokens whole = {0}, got = {0};
    assert_int_equal(ks_engine_tokenize(f->e, text, len, true, true, &whole), 0);
    assert_int_equal(ks_tokcache_tokenize(c, ns, text, len, &got), 0);
    if (got.n != whole.n || memcmp(got.v, whole.v, sizeof *got.v * (size_t)got.n) != 0) {
        int k = 0;
        while (k < got.n && k < whole.n && got.v[k] == whole.v[k]) k++;
        fail_msg("%s: %zu bytes: %d tokens in pieces, %d whole, first difference at token %d", what, len, got.n,
                 whole.n, k);
    }
    ks_tokens_free(&whole);
    ks_tokens_free(&got);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* A random text of up to max_frags fragments into buf (NUL-terminated). */
static size_t random_text(uint64_t *rng, char *buf, size_t cap, int max_frags) {
    size_t n = 0;
    int k = (int)(rng_next(rng) % (uint64_t)(max_frags + 1));
    for (int i = 0; i < k; i++) {
        const char *fr = FRAGS[rng_next(rng) % N_FRAGS];
        size_t l = strlen(fr);
        if (n + l + 1 > cap) break;
        memcpy(buf + n, fr, l);
        n += l;
    }
    buf[n] = '\0';
    return n;
}

/* Random texts, each tokenized twice (the second time from the cache), and
 * texts that grow by a few fragments at a time as a conversation does. */
static void test_pieces_are_the_whole(void **st) {
    (void)st;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    static char buf[1 << 14], grow[1 << 16];
    for (size_t i = 0; i < N_TEMPLATES; i++) {
        fixture f = open_model(i);
        ks_tokcache *c = ks_tokcache_create(f.e, 1 << 20);
        assert_non_null(c);
        ks_tokcache_stats s0;
        ks_tokcache_get_stats(c, &s0);
        assert_true(s0.pieces); /* mkmodel writes SPM ("llama") vocabularies: cut */
        for (int r = 0; r < 400; r++) {
            size_t n = random_text(&rng, buf, sizeof buf, 60);
            expect_same(&f, c, 0, buf, n, TEMPLATES[i]);
            expect_same(&f, c, 0, buf, n, TEMPLATES[i]);
        }
        size_t g = 0;
        for (int r = 0; r < 120; r++) {
            size_t n = random_text(&rng, buf, sizeof buf, 12);
            if (g + n + 1 > sizeof grow) break;
            memcpy(grow + g, buf, n + 1);
            g += n;
            expect_same(&f, c, 0, grow, g, TEMPLATES[i]);
        }
        ks_tokcache_stats s;
        ks_tokcache_get_stats(c, &s);
        assert_true(s.hit_tokens > 0 && s.miss_tokens > 0);
        ks_tokcache_free(c);
        tmpl_close(&f);
    }
}

/* A conversation rendered by the template, then again with one message
 * more: the tokens are the uncached render's, and the second render takes its
 * earlier messages from the cache. */
static void test_conversation_reuses_its_messages(void **st) {
    (void)st;
    for (size_t i = 0; i < N_TEMPLATES; i++) {
        fixture f = open_model(i);
        ks_tokcache *c = ks_tokcache_create(f.e, 1 << 20);
        ks_prompt_memo *memo = ks_prompt_memo_create(16);
        assert_true(c && memo);
        ks_prompt_memo_use_tokcache(memo, c);
        json_t *req = json_pack("{s:[{s:s, s:s}]}", "messages", "role", "system", "content",
                                "You are a coding agent. Use the tools; say what you did.");
        json_t *msgs = json_object_get(req, "messages");
        uint64_t hit0 = 0, miss0 = 0;
        for (int turn = 0; turn < 6; turn++) {
            char line[256];
            snprintf(line, sizeof line, "Turn %d: please read src/file%d.c and fix the bug on line %d. Thanks!",
                     turn, turn, 10 * turn + 3);
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", line));
            ks_prompt_opts o = {.hints = true, .model_id = "test"};
            ks_prompt_tmpl plain, cached;
            char err[512] = "";
            if (ks_prompt_tmpl_chat(f.e, f.t, req, &o, NULL, &plain, err, sizeof err))
                fail_msg("%s: %s", TEMPLATES[i], err);
            if (ks_prompt_tmpl_chat(f.e, f.t, req, &o, memo, &cached, err, sizeof err))
                fail_msg("%s: %s", TEMPLATES[i], err);
            assert_int_equal(cached.p.tokens.n, plain.p.tokens.n);
            assert_memory_equal(cached.p.tokens.v, plain.p.tokens.v, sizeof(int32_t) * (size_t)plain.p.tokens.n);
            assert_int_equal(cached.p.n_sys_tokens, plain.p.n_sys_tokens);
            ks_tokcache_stats s;
            ks_tokcache_get_stats(c, &s);
            if (turn >= 2) {
                /* the earlier turns came from the cache: most of the prompt
                 * (Mistral's template moves the system message to the last
                 * user message, so there only the turns before it) */
                uint64_t hit = s.hit_tokens - hit0, miss = s.miss_tokens - miss0;
                bool moves = strstr(TEMPLATES[i], "Mistral") != NULL;
                if (!(moves ? hit > 0 : hit > miss)) fail_msg("%s turn %d: %llu tokens from the cache, %llu tokenized", TEMPLATES[i],
                                            turn, (unsigned long long)hit, (unsigned long long)miss);
            }
            hit0 = s.hit_tokens, miss0 = s.miss_tokens;
            snprintf(line, sizeof line, "Fixed the bug in file%d.c: an off-by-one.", turn);
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", line));
            ks_prompt_tmpl_free(&plain);
            ks_prompt_tmpl_free(&cached);
        }
        json_decref(req);
        ks_prompt_memo_free(memo);
        ks_tokcache_free(c);
        tmpl_close(&f);
    }
}

/* One namespace's pieces never answer for another's. */
static void test_namespaces_apart(void **st) {
    (void)st;
    fixture f = open_model(0);
    ks_tokcache *c = ks_tokcache_create(f.e, 1 << 20);
    /* no piece twice: every hit below is another call's */
    const char *t = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there";
    expect_same(&f, c, 1, t, strlen(t), "ns 1");
    ks_tokcache_stats a, b;
    ks_tokcache_get_stats(c, &a);
    expect_same(&f, c, 2, t, strlen(t), "ns 2");
    ks_tokcache_get_stats(c, &b);
    assert_int_equal(b.hit_tokens, a.hit_tokens); /* nothing from ns 1 */
    assert_true(b.miss_tokens > a.miss_tokens);
    expect_same(&f, c, 1, t, strlen(t), "ns 1 again");
    ks_tokcache_get_stats(c, &a);
    assert_true(a.hit_tokens > b.hit_tokens);
    assert_int_equal(a.miss_tokens, b.miss_tokens);
    ks_tokcache_free(c);
    tmpl_close(&f);
}

/* A restarted process: the token list a warm slot holds seeds the cache, so
 * the conversation's next render finds its pieces (in its tenant only); a
 * list whose runs are no text's tokens seeds nothing wrong. */
static void test_seed_from_a_state(void **st) {
    (void)st;
    for (size_t i = 0; i < N_TEMPLATES; i++) {
        fixture f = open_model(i);
        json_t *req = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s, s:s}]}", "messages", "role", "system",
                                "content", "You are a coding agent. Use the tools; say what you did.", "role", "user",
                                "content", "Please read src/main.c and fix the crash on line 42.", "role", "assistant",
                                "content", "Fixed: the pointer was freed twice.", "role", "user", "content",
                                "Now add a test for it.");
        ks_prompt_opts o = {.hints = true, .model_id = "test", .memo_ns = 7};
        char err[512] = "";
        ks_prompt_tmpl before, plain, cached;
        if (ks_prompt_tmpl_chat(f.e, f.t, req, &o, NULL, &before, err, sizeof err)) fail_msg("%s", err);
        /* the state of the turn that answered: its prompt and a reply */
        ks_tokens state = {0};
        assert_int_equal(ks_tokens_assign(&state, before.p.tokens.v, before.p.tokens.n), 0);
        ks_tokcache *c = ks_tokcache_create(f.e, 1 << 20);
        ks_prompt_memo *memo = ks_prompt_memo_create(16);
        ks_prompt_memo_use_tokcache(memo, c);
        int kept = ks_tokcache_seed(c, 7, state.v, state.n);
        if (kept < 2) fail_msg("%s: %d pieces seeded", TEMPLATES[i], kept);
        json_t *msgs = json_object_get(req, "messages");
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", "Added test_double_free."));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", "Run it."));
        ks_tokcache_stats s0, s1;
        ks_tokcache_get_stats(c, &s0);
        if (ks_prompt_tmpl_chat(f.e, f.t, req, &o, NULL, &plain, err, sizeof err)) fail_msg("%s", err);
        if (ks_prompt_tmpl_chat(f.e, f.t, req, &o, memo, &cached, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(cached.p.tokens.n, plain.p.tokens.n);
        assert_memory_equal(cached.p.tokens.v, plain.p.tokens.v, sizeof(int32_t) * (size_t)plain.p.tokens.n);
        ks_tokcache_get_stats(c, &s1);
        if (s1.hit_tokens - s0.hit_tokens < (uint64_t)state.n / 4)
            fail_msg("%s: %llu tokens of the next render from the seed (state %d tokens)", TEMPLATES[i],
                     (unsigned long long)(s1.hit_tokens - s0.hit_tokens), state.n);
        /* another tenant finds none of it */
        ks_tokcache *c2 = ks_tokcache_create(f.e, 1 << 20);
        ks_tokcache_seed(c2, 7, state.v, state.n);
        ks_tokcache_get_stats(c2, &s0);
        const char *text = "<|im_start|>system\nYou are a coding agent. Use the tools; say what you did.";
        expect_same(&f, c2, 8, text, strlen(text), "another tenant");
        ks_tokcache_get_stats(c2, &s1);
        assert_int_equal(s1.hit_tokens, s0.hit_tokens);
        /* tokens that are no text's (ids at random): whatever is kept answers right */
        uint64_t rng = 1234 + i;
        ks_tokens junk = {0};
        for (int k = 0; k < 400; k++) ks_tokens_push(&junk, (int32_t)(rng_next(&rng) % (uint64_t)ks_engine_n_vocab(f.e)));
        ks_tokcache_seed(c2, 0, junk.v, junk.n);
        static char buf[1 << 13];
        for (int r = 0; r < 200; r++) {
            size_t n = random_text(&rng, buf, sizeof buf, 40);
            expect_same(&f, c2, 0, buf, n, "after a junk seed");
        }
        ks_tokens_free(&junk);
        ks_tokcache_free(c2);
        ks_tokens_free(&state);
        ks_prompt_tmpl_free(&before);
        ks_prompt_tmpl_free(&plain);
        ks_prompt_tmpl_free(&cached);
        ks_prompt_memo_free(memo);
        ks_tokcache_free(c);
        json_decref(req);
        tmpl_close(&f);
    }
}

/* A small budget: what is held stays within it, and results stay right. */
static void test_budget_holds(void **st) {
    (void)st;
    fixture f = open_model(0);
    const size_t budget = 4096;
    ks_tokcache *c = ks_tokcache_create(f.e, budget);
    uint64_t rng = 42;
    static char buf[1 << 13];
    for (int r = 0; r < 300; r++) {
        size_t n = random_text(&rng, buf, sizeof buf, 40);
        expect_same(&f, c, 0, buf, n, "budget");
        ks_tokcache_stats s;
        ks_tokcache_get_stats(c, &s);
        if (s.bytes > budget) fail_msg("%zu bytes held, budget %zu", s.bytes, budget);
    }
    ks_tokcache_stats s;
    ks_tokcache_get_stats(c, &s);
    assert_true(s.entries > 0);
    ks_tokcache_free(c);
    tmpl_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_are_the_whole),
        cmocka_unit_test(test_conversation_reuses_its_messages),
        cmocka_unit_test(test_namespaces_apart),
        cmocka_unit_test(test_seed_from_a_state),
        cmocka_unit_test(test_budget_holds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * Model tests of the multi-turn cache (ks_chat) on the generated tiny model:
 * exactness against the cache-off run, bookkeeping, overflow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "kvstash.h"
#include "fa_util.h"

static const char *model(void) {
    const char *m = getenv("KS_TINY_MODEL");
    return m ? m : "build/models/tiny.gguf";
}

static const char *USER_MSGS[10] = {
    "hello there, how are you today",
    "tell me about the weather in the north",
    "what is the best way to learn a new language",
    "can you write a short poem about the sea",
    "why is the sky blue during the day",
    "list three things that make a good friend",
    "how do trains work in big cities",
    "what should I cook for dinner tonight",
    "explain the rules of a simple game",
    "thank you, say goodbye now",
};

static ks_chat *open_chat(bool cache, int n_ctx, const char *system) {
    ks_chat_params p = ks_chat_params_default();
    p.flash_attn = test_flash_attn_chat(); /* ctest's *_no_flash_attn run */
    p.model_path = model();
    p.cache = cache;
    p.n_ctx = n_ctx;
    p.system = system;
    p.n_threads = 1;
    char err[256] = "";
    ks_chat *c = NULL;
    int rc = ks_chat_create(&p, &c, err, sizeof err);
    if (rc) fprintf(stderr, "ks_chat_create: %s\n", err);
    assert_int_equal(rc, 0);
    assert_non_null(c);
    return c;
}

/* Cache on vs cache off: identical replies and bit-identical next-token logits
 * for 10 turns; cached counts grow on the cached side and stay 0 without. */
static void test_ten_turns_exact(void **st) {
    (void)st;
    ks_chat *on = open_chat(true, 4096, "You are a terse assistant.");
    ks_chat *off = open_chat(false, 4096, "You are a terse assistant.");
    ks_gen_params g = ks_gen_params_default();
    g.max_tokens = 24;
    int prev_prompt = 0;
    for (int t = 0; t < 10; t++) {
        char *r_on = NULL, *r_off = NULL;
        ks_turn_stats s_on, s_off;
        char err[256];
        assert_int_equal(ks_chat_send(on, USER_MSGS[t], &g, &r_on, &s_on, err, sizeof err), 0);
        assert_int_equal(ks_chat_send(off, USER_MSGS[t], &g, &r_off, &s_off, err, sizeof err), 0);
        assert_string_equal(r_on, r_off);
        assert_int_equal(s_on.n_generated, s_off.n_generated);
        assert_int_equal(s_on.n_prompt, s_off.n_prompt);
        assert_int_equal(s_off.n_cached, 0);
        if (t > 0) {
            /* Everything before this turn's new message was reused: at least
             * the previous prompt (the reply's tokens may re-tokenize). */
            assert_true(s_on.n_cached >= prev_prompt);
            assert_true(s_on.n_new < s_on.n_prompt / 2 || t < 2);
        } else {
            assert_int_equal(s_on.n_cached, 0);
        }
        assert_int_equal(s_on.n_new, s_on.n_prompt - s_on.n_cached);
        int nv_on = 0, nv_off = 0;
        const float *l_on = ks_chat_last_prompt_logits(on, &nv_on);
        const float *l_off = ks_chat_last_prompt_logits(off, &nv_off);
        assert_non_null(l_on);
        assert_non_null(l_off);
        assert_int_equal(nv_on, nv_off);
        assert_memory_equal(l_on, l_off, sizeof(float) * (size_t)nv_on);
        prev_prompt = s_on.n_prompt;
        free(r_on);
        free(r_off);
    }
    /* The KV holds the last prompt and all but the last generated token. */
    assert_true(ks_chat_n_cached(on) >= prev_prompt);
    assert_int_equal(ks_chat_n_cached(off), ks_chat_n_cached(on));
    assert_int_equal(ks_chat_n_messages(on), 21);
    ks_chat_free(on);
    ks_chat_free(off);
}

/* /clear drops the KV: the next turn is cold. */
static void test_clear_is_cold(void **st) {
    (void)st;
    ks_chat *c = open_chat(true, 2048, NULL);
    ks_gen_params g = ks_gen_params_default();
    g.max_tokens = 8;
    ks_turn_stats s;
    char err[256];
    assert_int_equal(ks_chat_send(c, "first message", &g, NULL, &s, err, sizeof err), 0);
    assert_true(ks_chat_n_cached(c) > 0);
    ks_chat_clear(c);
    assert_int_equal(ks_chat_n_cached(c), 0);
    assert_int_equal(ks_chat_n_messages(c), 0);
    assert_int_equal(ks_chat_send(c, "first message", &g, NULL, &s, err, sizeof err), 0);
    assert_int_equal(s.n_cached, 0);
    ks_chat_free(c);
}

/* Overflow: a small context forces dropping the oldest turns; the system
 * prompt stays first, the turn succeeds and says what it dropped. */
static void test_overflow_keeps_system(void **st) {
    (void)st;
    const char *sys = "SYSTEM PROMPT that must survive";
    ks_chat *c = open_chat(true, 256, sys);
    ks_gen_params g = ks_gen_params_default();
    g.max_tokens = 16;
    int dropped_total = 0;
    for (int t = 0; t < 10; t++) {
        ks_turn_stats s;
        char err[256] = "";
        int rc = ks_chat_send(c, USER_MSGS[t], &g, NULL, &s, err, sizeof err);
        if (rc) fprintf(stderr, "turn %d: %s\n", t, err);
        assert_int_equal(rc, 0);
        assert_true(s.n_prompt + g.max_tokens <= 256);
        dropped_total += s.n_dropped_msgs;
        const char *role = NULL;
        assert_string_equal(ks_chat_message(c, 0, &role), sys);
        assert_string_equal(role, "system");
        /* The latest exchange is always kept, last. */
        int n = ks_chat_n_messages(c);
        assert_string_equal(ks_chat_message(c, n - 2, &role), USER_MSGS[t]);
        assert_string_equal(role, "user");
    }
    assert_true(dropped_total > 0);
    assert_true(ks_chat_n_messages(c) < 21);
    ks_chat_free(c);
}

/* Bad input: empty and too-long messages fail cleanly and lose nothing. */
static void test_bad_messages(void **st) {
    (void)st;
    ks_chat *c = open_chat(true, 256, NULL);
    ks_gen_params g = ks_gen_params_default();
    g.max_tokens = 8;
    char err[256] = "";
    assert_int_equal(ks_chat_send(c, "a normal message", &g, NULL, NULL, err, sizeof err), 0);
    int n_msgs = ks_chat_n_messages(c);
    int n_cached = ks_chat_n_cached(c);
    assert_int_equal(ks_chat_send(c, "", &g, NULL, NULL, err, sizeof err), KS_EEMPTY);
    assert_non_null(strstr(err, "empty"));
    assert_int_equal(ks_chat_send(c, "  \t ", &g, NULL, NULL, err, sizeof err), KS_EEMPTY);
    size_t big = 4000;
    char *longmsg = malloc(big + 1);
    for (size_t i = 0; i < big; i++) longmsg[i] = (i % 5 == 4) ? ' ' : 'a' + (char)(i % 7);
    longmsg[big] = '\0';
    err[0] = '\0';
    assert_int_equal(ks_chat_send(c, longmsg, &g, NULL, NULL, err, sizeof err), KS_ECTX);
    assert_non_null(strstr(err, "too long"));
    free(longmsg);
    /* Nothing lost: history and KV as before, and the next turn reuses it. */
    assert_int_equal(ks_chat_n_messages(c), n_msgs);
    assert_int_equal(ks_chat_n_cached(c), n_cached);
    ks_turn_stats s;
    assert_int_equal(ks_chat_send(c, "another one", &g, NULL, &s, err, sizeof err), 0);
    assert_true(s.n_cached > 0);
    ks_chat_free(c);
}

static int stop_at_first_text(void *ud, const char *text, size_t len) {
    (void)text;
    (void)len;
    (*(int *)ud)++;
    return 1;
}

/* Regression: stopped_eog was true when the caller stopped the generation
 * (on_text returned non-zero), not only at an end-of-generation token. */
static void test_caller_stop_is_not_eog(void **st) {
    (void)st;
    ks_chat *c = open_chat(true, 2048, NULL);
    ks_gen_params g = ks_gen_params_default();
    g.max_tokens = 32;
    int calls = 0;
    g.on_text = stop_at_first_text;
    g.ud = &calls;
    ks_turn_stats s;
    char err[256] = "";
    assert_int_equal(ks_chat_send(c, "hello there, how are you today", &g, NULL, &s, err, sizeof err), 0);
    assert_true(calls >= 1);
    assert_true(s.n_generated < g.max_tokens);
    assert_false(s.stopped_eog);
    ks_chat_free(c);
}

static void test_open_errors(void **st) {
    (void)st;
    ks_chat_params p = ks_chat_params_default();
    p.flash_attn = test_flash_attn_chat(); /* ctest's *_no_flash_attn run */
    char err[256] = "";
    ks_chat *c = (ks_chat *)1;
    p.model_path = "/nonexistent/model.gguf";
    assert_int_equal(ks_chat_create(&p, &c, err, sizeof err), KS_ENOENT);
    assert_null(c);
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
    char path[] = "/tmp/ks_notgguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hello world, not a model\n", 25), 25);
    close(fd);
    p.model_path = path;
    err[0] = '\0';
    assert_int_equal(ks_chat_create(&p, &c, err, sizeof err), KS_EMODEL);
    assert_non_null(strstr(err, "not a GGUF"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_ten_turns_exact),
        cmocka_unit_test(test_clear_is_cold),
        cmocka_unit_test(test_overflow_keeps_system),
        cmocka_unit_test(test_bad_messages),
        cmocka_unit_test(test_caller_stop_is_not_eog),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

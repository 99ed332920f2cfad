/*
 * Model tests of prompt_tmpl's shortcuts (prompt_tmpl.h): where a cache
 * breakpoint falls and the SPC key's system prompt, found without rendering
 * again — the last message from the generation prompt's tokens, the others
 * from a ks_prompt_memo — must be what rendering finds, on every real
 * template setup installs, and a memo entry must never answer for a prompt
 * whose tokens it was not found in.
 *
 * Env: KS_BIN, KS_TEMPLATES_DIR (as ctest sets them).
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
#include "model/mkmodel_util.h"
#include "model/tmpl_util.h"
#include "prompt/prompt_tmpl.h"

static const char *const TEMPLATES[] = {
    "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "Qwen3-Coder", "meta-llama-Llama-3.1-8B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407", "openai-gpt-oss-120b", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
};

/* A coding agent's conversation: system, tools, a call and its result, more turns. */
static const char REQ[] =
    "{\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are a coding agent. Use the tools.\"},"
    "{\"role\":\"user\",\"content\":\"What is in the current directory?\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"abcDEF123\",\"type\":\"function\","
    "\"function\":{\"name\":\"bash\",\"arguments\":\"{\\\"command\\\":\\\"ls\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"abcDEF123\",\"content\":\"README.txt\\nsrc\"},"
    "{\"role\":\"assistant\",\"content\":\"A README and a src directory.\"},"
    "{\"role\":\"user\",\"content\":\"Show me the README.\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"description\":\"Runs a command\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"}},\"required\":[\"command\"]}}}]}";

static char g_dir[64];

static int setup(void **st) {
    (void)st;
    return tmpl_dir_make(g_dir, sizeof g_dir, "test_prompt_tmpl");
}

static int teardown(void **st) {
    (void)st;
    tmpl_dir_remove(g_dir, sizeof TEMPLATES / sizeof TEMPLATES[0]);
    return 0;
}

typedef tmpl_fixture fixture;

/* The tiny model with template i, its engine and its template object. */
static fixture open_model(size_t i) { return tmpl_open(g_dir, i, TEMPLATES[i]); }

static void render(const fixture *f, const json_t *req, ks_prompt_memo *memo, ks_prompt_tmpl *out) {
    ks_prompt_opts o = {.hints = true, .model_id = "test"};
    char err[512] = "";
    memset(out, 0, sizeof *out);
    int rc = ks_prompt_tmpl_chat(f->e, f->t, req, &o, memo, out, err, sizeof err);
    if (rc) fail_msg("render: %s (%s)", ks_strerror(rc), err);
}

static void test_breakpoints_and_system_as_rendered(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof TEMPLATES / sizeof TEMPLATES[0]; i++) {
        fixture f = open_model(i);
        json_t *req = json_loads(REQ, 0, NULL);
        assert_non_null(req);
        ks_prompt_memo *memo = ks_prompt_memo_create(16);
        ks_prompt_tmpl plain, first, again;
        render(&f, req, NULL, &plain);
        render(&f, req, memo, &first);
        render(&f, req, memo, &again);
        /* the prompt ends with the generation prompt in these templates but Mistral's */
        if (strstr(TEMPLATES[i], "Mistral") == NULL && plain.n_gen_prompt <= 0)
            fail_msg("%s: no generation prompt found at the prompt's end", TEMPLATES[i]);
        assert_false(plain.continuation);
        assert_int_equal(first.p.n_sys_tokens, plain.p.n_sys_tokens);
        assert_int_equal(again.p.n_sys_tokens, plain.p.n_sys_tokens);
        assert_true(first.p.sys_key == plain.p.sys_key && again.p.sys_key == plain.p.sys_key);
        int n_msgs = (int)json_array_size(json_object_get(req, "messages"));
        for (int upto = 0; upto < n_msgs; upto++) {
            const ks_tokens *full = &plain.p.tokens;
            int slow = ks_prompt_tmpl_prefix_len(f.e, f.t, req, upto, full, 0, NULL);
            int fast = ks_prompt_tmpl_prefix_len(f.e, f.t, req, upto, full, plain.n_gen_prompt, memo);
            int hit = ks_prompt_tmpl_prefix_len(f.e, f.t, req, upto, full, plain.n_gen_prompt, memo);
            if (slow != fast || fast != hit)
                fail_msg("%s: breakpoint after message %d: rendered %d, shortcut %d, memo %d", TEMPLATES[i], upto,
                         slow, fast, hit);
        }
        uint64_t hits, misses;
        ks_prompt_memo_stats(memo, &hits, &misses);
        assert_true(hits >= 1 && misses >= 1);

        /* The same system message in a prompt that starts otherwise (another
         * model id is not it: the tokens differ here by a first user message
         * in its place): the memo's entry does not answer for it. */
        json_t *other = json_deep_copy(req);
        json_t *m0 = json_array_get(json_object_get(other, "messages"), 0);
        json_object_set_new(m0, "content", json_string("You are a different agent."));
        ks_prompt_tmpl o1, o2;
        render(&f, other, NULL, &o1);
        render(&f, other, memo, &o2);
        assert_int_equal(o1.p.n_sys_tokens, o2.p.n_sys_tokens);
        assert_true(o1.p.sys_key == o2.p.sys_key);
        assert_true(o1.p.sys_key != plain.p.sys_key || plain.p.sys_key == 0);
        ks_prompt_tmpl_free(&o1);
        ks_prompt_tmpl_free(&o2);
        json_decref(other);

        ks_prompt_tmpl_free(&plain);
        ks_prompt_tmpl_free(&first);
        ks_prompt_tmpl_free(&again);
        ks_prompt_memo_free(memo);
        json_decref(req);
        tmpl_close(&f);
    }
}

/* A continued final message: the prompt does not end with the generation
 * prompt, so the last message's breakpoint is rendered, not derived. */
static void test_continued_message_renders(void **st) {
    (void)st;
    fixture f = open_model(0);
    json_t *req = json_loads(REQ, 0, NULL);
    json_t *msgs = json_object_get(req, "messages");
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", "The README says"));
    ks_prompt_tmpl p;
    render(&f, req, NULL, &p);
    assert_int_equal(p.n_gen_prompt, 0);
    assert_true(p.continuation); /* the typed flag the server reads (not the parse JSON) */
    int last = (int)json_array_size(msgs) - 1;
    int slow = ks_prompt_tmpl_prefix_len(f.e, f.t, req, last, &p.p.tokens, 0, NULL);
    assert_int_equal(ks_prompt_tmpl_prefix_len(f.e, f.t, req, last, &p.p.tokens, p.n_gen_prompt, NULL), slow);
    ks_prompt_tmpl_free(&p);
    json_decref(req);
    tmpl_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_breakpoints_and_system_as_rendered),
        cmocka_unit_test(test_continued_message_renders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

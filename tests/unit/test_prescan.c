/* test_prescan.c — the size bound from a body's bytes (issue 28;
 * src/server/prescan.c): for requests in each wire format, the prescan of
 * the body and of every prefix of it never exceeds presize's bound of the
 * chat request the format's parser makes of it (above it, a request that
 * fits would be refused), and equals it where the parser keeps every string
 * (so that it refuses what presize refuses, before the parse); what it does
 * not follow counts 0; tools count whole whatever tool_choice names. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "prompt/presize.h"
#include "server/api.h"
#include "server/prescan.h"

static const ks_presize ALL = {{true, true, true, true}, true, true, true, true};

typedef struct req {
    ks_prescan_shape shape;
    const char *body;
    bool exact; /* the prescan equals presize (the parser keeps every counted string) */
} req;

#define TOOL_CHAT                                                                                                    \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather \\u00e9 \\ud83d\\ude00.\"," \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"the city\"},"  \
    "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"]}}}"

static const req k_reqs[] = {
    {KS_PRESCAN_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}]}", true},
    {KS_PRESCAN_CHAT,
     "{\"model\":\"m\",\"messages\":[{\"content\":\"  You are terse.\\n\\n \",\"role\":\"developer\"},"
     "{\"role\":\"user\",\"content\":\"\\n  What is 2+2?\\t \"},{\"role\":\"assistant\",\"content\":\"4\"},"
     "{\"role\":\"user\",\"content\":[{\"text\":\" part one \",\"type\":\"text\"},{\"type\":\"text\",\"text\":\"two\"}]}],"
     "\"temperature\":0.5,\"stop\":[\"x\"],\"stream\":false}",
     false /* parts joined: the join's trimmed text is longer than its trimmed parts */},
    {KS_PRESCAN_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],\"tools\":[" TOOL_CHAT
                      ",{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}],\"tool_choice\":\"auto\"}",
     true},
    {KS_PRESCAN_CHAT,
     "{\"messages\":[{\"role\":\"system\",\"content\":\"Use tools.\"},{\"role\":\"user\",\"content\":\"Paris?\"},"
     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
     "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
     "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},{\"role\":\"user\",\"content\":\"Thanks!\"}],"
     "\"tools\":[" TOOL_CHAT "]}",
     true},
    {KS_PRESCAN_RESPONSES, "{\"model\":\"m\",\"input\":\"  Hello  \",\"instructions\":\"Be brief.\"}", true},
    {KS_PRESCAN_RESPONSES,
     "{\"input\":[{\"role\":\"developer\",\"content\":\"Rules.\"},{\"type\":\"message\",\"role\":\"user\","
     "\"content\":[{\"type\":\"input_text\",\"text\":\"Weather in Paris?\"}]},"
     "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"get_weather\",\"arguments\":\"{}\"},"
     "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"sunny\"}],"
     "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather.\",\"parameters\":"
     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"the city\"}}}},"
     "{\"type\":\"web_search\"},{\"type\":\"custom\",\"name\":\"apply_patch\",\"description\":\"Patch.\"},"
     "{\"type\":\"namespace\",\"name\":\"mcp\",\"tools\":[{\"type\":\"function\",\"name\":\"x\",\"description\":\"X.\"}]}]}",
     false /* custom and namespace tools are renamed: not counted */},
    {KS_PRESCAN_MESSAGES,
     "{\"model\":\"m\",\"max_tokens\":10,\"system\":[{\"type\":\"text\",\"text\":\"You are Claude.\"}],"
     "\"messages\":[{\"role\":\"user\",\"content\":\"Hi \"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\","
     "\"text\":\"Hello\"},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"get_weather\",\"input\":{}}]},"
     "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"sunny\"},"
     "{\"type\":\"text\",\"text\":\"And tomorrow?\"}]}],"
     "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather.\",\"input_schema\":{\"type\":\"object\","
     "\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"the city\"}}}},"
     "{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],\"tool_choice\":{\"type\":\"auto\"}}",
     true},
    {KS_PRESCAN_MESSAGES, "{\"max_tokens\":10,\"system\":\"Short.\",\"messages\":[{\"role\":\"user\",\"content\":"
                          "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\" b \"}]}]}",
     false},
    /* Issue 42: assistants' contents (after their last "</think>") and tool results. */
    {KS_PRESCAN_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
     "\"<think>long thought</think>\\n The answer. \"},{\"role\":\"user\",\"content\":\"more\"},"
     "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a</think>\"},{\"type\":\"text\",\"text\":\"b\"}]},"
     "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\" result text \"}]}",
     false /* parts joined */},
    {KS_PRESCAN_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
     "\"x</thin</think>kept \\u00e9</think2\"},{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"r\"}]}",
     true},
    {KS_PRESCAN_RESPONSES,
     "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"message\",\"role\":\"assistant\",\"content\":"
     "[{\"type\":\"output_text\",\"text\":\"an answer\"}]},{\"type\":\"custom_tool_call\",\"call_id\":\"c\","
     "\"name\":\"apply_patch\",\"input\":\"p\"},{\"type\":\"custom_tool_call_output\",\"call_id\":\"c\","
     "\"output\":\"done\"}],\"tools\":[{\"type\":\"custom\",\"name\":\"apply_patch\"}]}",
     false /* a custom tool is made a function: not counted */},
    {KS_PRESCAN_MESSAGES,
     "{\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
     "\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"\"},{\"type\":\"text\",\"text\":"
     "\"calling\"},{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}]},{\"role\":\"user\","
     "\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":\"text\",\"text\":"
     "\" big result \"}]}]}],\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}",
     true},
};

/* The chat request's presize bound, through the format's own parser. */
static size_t presize_of(const req *r) {
    json_error_t je;
    json_t *root = json_loads(r->body, JSON_REJECT_DUPLICATES, &je);
    if (!root) fail_msg("not JSON: %s: %s", je.text, r->body);
    ks_api_error e;
    ks_api_request rq;
    json_t *chat = NULL;
    if (r->shape == KS_PRESCAN_RESPONSES) {
        ks_api_resp_req rr;
        if (ks_api_responses_to_chat(root, NULL, &rr, &e)) fail_msg("responses: %s", e.message);
        chat = json_incref(rr.chat);
        ks_api_resp_req_free(&rr);
    } else if (r->shape == KS_PRESCAN_MESSAGES) {
        ks_api_msg_req mr;
        if (ks_api_messages_to_chat(root, false, &mr, &e)) fail_msg("messages: %s", e.message);
        chat = json_incref(mr.chat);
        ks_api_msg_req_free(&mr);
    } else {
        chat = json_incref(root);
    }
    json_decref(root);
    if (ks_api_parse_root(KS_API_CHAT, chat, &rq, &e)) fail_msg("chat: %s", e.message);
    size_t n = ks_presize_bytes(&ALL, rq.tmpl_req);
    ks_api_request_free(&rq);
    return n;
}

static void test_bound(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_reqs / sizeof k_reqs[0]; i++) {
        const req *r = &k_reqs[i];
        size_t len = strlen(r->body);
        size_t bound = presize_of(r), pre = ks_prescan_bytes(&ALL, r->shape, r->body, len);
        if (pre > bound || (r->exact && pre != bound))
            fail_msg("request %zu: prescan %zu, presize %zu (%s)", i, pre, bound, r->exact ? "equal" : "at most");
        assert_true(pre > 0);
        /* Every prefix, as the body comes in: never more than the whole. */
        for (size_t n = 0; n <= len; n++) {
            size_t part = ks_prescan_prefix_bytes(&ALL, r->shape, r->body, n);
            if (part > pre) fail_msg("request %zu: prefix of %zu bytes counts %zu > %zu", i, n, part, pre);
        }
        assert_int_equal(ks_prescan_prefix_bytes(&ALL, r->shape, r->body, len), pre);
        /* Nothing counted when the template copies nothing. */
        const ks_presize none = {0};
        assert_int_equal(ks_prescan_bytes(&none, r->shape, r->body, len), 0);
    }
}

/* Each kind counts only when the probe found it (presize.h). */
static void test_kinds(void **state) {
    (void)state;
    const char *b = "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"user!\"}],"
                    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"nm\",\"description\":\"desc\","
                    "\"parameters\":{\"properties\":{\"param\":{\"description\":\"pdesc\"}}}}}]}";
    size_t len = strlen(b);
    ks_presize p = {0};
    p.content[0] = true;
    assert_int_equal(ks_prescan_bytes(&p, KS_PRESCAN_CHAT, b, len), 3);
    p = (ks_presize){0};
    p.content[1] = true;
    assert_int_equal(ks_prescan_bytes(&p, KS_PRESCAN_CHAT, b, len), 5);
    p = (ks_presize){.tool_name = true};
    assert_int_equal(ks_prescan_bytes(&p, KS_PRESCAN_CHAT, b, len), 2);
    p = (ks_presize){.tool_desc = true};
    assert_int_equal(ks_prescan_bytes(&p, KS_PRESCAN_CHAT, b, len), 4);
    p = (ks_presize){.param_name = true};
    assert_int_equal(ks_prescan_bytes(&p, KS_PRESCAN_CHAT, b, len), 5);
    p = (ks_presize){.param_desc = true};
    assert_int_equal(ks_prescan_bytes(&p, KS_PRESCAN_CHAT, b, len), 5);
    assert_int_equal(ks_prescan_bytes(&ALL, KS_PRESCAN_NONE, b, len), 0);
}

/* What the scanner does not follow counts 0 whole, and what a prefix held
 * whole before it. */
static void test_unfollowed(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",
        "[]",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"}]} x",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\udc00b\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"},]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"}],\"x\":tru}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (ks_prescan_bytes(&ALL, KS_PRESCAN_CHAT, bad[i], strlen(bad[i])))
            fail_msg("body %zu counted: %s", i, bad[i]);
    /* Deeper than the scanner tracks: 0, the parser decides. */
    char deep[4096];
    int n = snprintf(deep, sizeof deep, "{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"}],\"x\":");
    for (int d = 0; d < KS_PRESCAN_MAX_DEPTH + 2; d++) deep[n++] = '[';
    for (int d = 0; d < KS_PRESCAN_MAX_DEPTH + 2; d++) deep[n++] = ']';
    deep[n++] = '}';
    assert_int_equal(ks_prescan_bytes(&ALL, KS_PRESCAN_CHAT, deep, (size_t)n), 0);
    assert_int_equal(ks_prescan_prefix_bytes(&ALL, KS_PRESCAN_CHAT, deep, (size_t)n), 3);
    /* A message counts once closed: its role may come last. */
    const char *m = "{\"messages\":[{\"content\":\"abcdef\",\"role\":\"user\"}]}";
    const char *cut = strstr(m, "\"role\"");
    assert_int_equal(ks_prescan_prefix_bytes(&ALL, KS_PRESCAN_CHAT, m, (size_t)(cut - m)), 0);
    assert_int_equal(ks_prescan_bytes(&ALL, KS_PRESCAN_CHAT, m, strlen(m)), 6);
}

/* Tools count whole, as they come, whatever tool_choice names (prescan.h
 * invariant 1's exception), in every format. */
static void test_named_choice(void **state) {
    (void)state;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" TOOL_CHAT
                       "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}";
    const char *unnamed = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" TOOL_CHAT "]}";
    assert_int_equal(ks_prescan_bytes(&ALL, KS_PRESCAN_CHAT, chat, strlen(chat)),
                     ks_prescan_bytes(&ALL, KS_PRESCAN_CHAT, unnamed, strlen(unnamed)));
    const char *msgs = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"a\","
                       "\"input_schema\":{}},{\"name\":\"bb\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\","
                       "\"name\":\"a\"}}";
    assert_int_equal(ks_prescan_bytes(&ALL, KS_PRESCAN_MESSAGES, msgs, strlen(msgs)), 1 + 1 + 2);
}

/* Keys and values, counted in every shape (the parse's cost: prescan.h). */
static void test_items(void **state) {
    (void)state;
    const char *b = "{\"a\":[1,2,{}],\"b\":\"x\",\"c\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    ks_prescan_counts n;
    /* { a [ 1 2 {} b "x" c true messages [ { role "user" content "hi": 17 */
    for (int sh = KS_PRESCAN_NONE; sh <= KS_PRESCAN_MESSAGES; sh++) {
        ks_prescan_count(&ALL, (ks_prescan_shape)sh, b, strlen(b), false, &n);
        assert_int_equal(n.items, 17);
        assert_int_equal(n.bytes, sh == KS_PRESCAN_CHAT || sh == KS_PRESCAN_MESSAGES ? 2 : 0);
    }
    /* not an object, and not JSON past a point: what was followed */
    ks_prescan_count(&ALL, KS_PRESCAN_CHAT, "[{},{},{}]", 10, false, &n);
    assert_int_equal(n.items, 4);
    ks_prescan_count(&ALL, KS_PRESCAN_CHAT, "[{},{},{} junk", 14, false, &n);
    assert_int_equal(n.items, 4);
    /* a prefix: what it began */
    ks_prescan_count(&ALL, KS_PRESCAN_CHAT, b, 12, true, &n);
    assert_int_equal(n.items, 6);
}

/* Issue 42: the bytes of the top-level values the walk does not read
 * (fields outside the prompt), and a tools array when the template renders
 * no tools; nothing for KS_PRESCAN_NONE. */
static void test_other(void **state) {
    (void)state;
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"frob\":\"12345\",\"temperature\":0.5,"
                    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}";
    ks_prescan_counts n;
    ks_prescan_count(&ALL, KS_PRESCAN_CHAT, b, strlen(b), false, &n);
    assert_int_equal(n.other, strlen("\"12345\"") + strlen("0.5"));
    assert_int_equal(n.other_items, 2);
    const ks_presize no_tools = {{true, true, true, true}, false, false, false, false};
    ks_prescan_count(&no_tools, KS_PRESCAN_CHAT, b, strlen(b), false, &n);
    assert_int_equal(n.other, strlen("\"12345\"") + strlen("0.5") +
                                  strlen("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"));
    ks_prescan_count(&ALL, KS_PRESCAN_NONE, b, strlen(b), false, &n);
    assert_int_equal(n.other, 0);
    /* A prefix counts whole values only. */
    ks_prescan_count(&ALL, KS_PRESCAN_CHAT, b, strlen("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"frob\":\"12"),
                     true, &n);
    assert_int_equal(n.other, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound),
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_unfollowed),
        cmocka_unit_test(test_named_choice),
        cmocka_unit_test(test_items), cmocka_unit_test(test_other),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

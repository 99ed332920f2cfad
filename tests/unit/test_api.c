/* test_api.c — request parsing and validation of the OpenAI protocol (src/server/api.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "server/api.h"

/* Parses body as kind and expects a 4xx with the given code and param
 * (param NULL: the error has no param). Prints both sides on mismatch. */
static void expect_bad(ks_api_kind kind, const char *body, int status, const char *code, const char *param) {
    ks_api_request r;
    ks_api_error e;
    memset(&e, 0, sizeof e);
    int rc = ks_api_parse(kind, body, strlen(body), &r, &e);
    if (rc == 0) {
        ks_api_request_free(&r);
        fail_msg("body %s: parsed, wanted %d %s (param %s)", body, status, code, param ? param : "null");
    }
    if (rc != KS_EINVAL) fail_msg("body %s: rc %d (%s), wanted KS_EINVAL", body, rc, ks_errname(rc));
    if (e.status != status || strcmp(e.code ? e.code : "null", code) ||
        strcmp(e.param, param ? param : ""))
        fail_msg("body %s:\n  got  %d %s param '%s' (%s)\n  want %d %s param '%s'", body, e.status,
                 e.code ? e.code : "null", e.param, e.message, status, code, param ? param : "");
    assert_string_equal(e.type, "invalid_request_error");
    assert_true(strlen(e.message) > 0);
    /* The parse failure left nothing behind: free is a no-op. */
    assert_null(r.root);
    ks_api_request_free(&r);
}

static void parse_ok(ks_api_kind kind, const char *body, ks_api_request *r) {
    ks_api_error e;
    int rc = ks_api_parse(kind, body, strlen(body), r, &e);
    if (rc) fail_msg("body %s: rc %d: %d %s param '%s': %s", body, rc, e.status, e.code ? e.code : "null",
                     e.param, e.message);
}

#define CHAT(extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" extra "}"
#define CMPL(extra) "{\"prompt\":\"once upon\"" extra "}"

/* ------------------------------------------------------------ chat: bad */
static void test_bad_json(void **state) {
    (void)state;
    expect_bad(KS_API_CHAT, "", 400, "invalid_json", NULL);
    expect_bad(KS_API_CHAT, "{", 400, "invalid_json", NULL);
    expect_bad(KS_API_CHAT, "{\"messages\":[}", 400, "invalid_json", NULL);
    expect_bad(KS_API_CHAT, "{\"a\":1} trailing", 400, "invalid_json", NULL);
    expect_bad(KS_API_CHAT, "\xff\xfe{}", 400, "invalid_json", NULL);
    {
        /* A raw NUL byte after a number (jansson takes it; the byte
         * pre-scan does not): refused before the parse. */
        static const char nul[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":5\0,\"seed\":7}";
        ks_api_request r;
        ks_api_error e;
        memset(&e, 0, sizeof e);
        assert_int_equal(ks_api_parse(KS_API_CHAT, nul, sizeof nul - 1, &r, &e), KS_EINVAL);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.code, "invalid_json");
        assert_non_null(strstr(e.message, "NUL byte at offset"));
    }
    /* Invalid UTF-8 inside a string and NUL escapes are refused by jansson. */
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", 400, "invalid_json", NULL);
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", 400,
               "invalid_json", NULL);
    /* Not an object. */
    expect_bad(KS_API_CHAT, "[]", 400, "invalid_type", NULL);
    expect_bad(KS_API_CHAT, "42", 400, "invalid_type", NULL);
    expect_bad(KS_API_CHAT, "\"x\"", 400, "invalid_type", NULL);
    /* Duplicate keys are ambiguous: refused. */
    expect_bad(KS_API_CHAT, "{\"messages\":[],\"messages\":[]}", 400, "invalid_json", NULL);
}

static void test_bad_messages(void **state) {
    (void)state;
    expect_bad(KS_API_CHAT, "{}", 400, "missing_required_parameter", "messages");
    expect_bad(KS_API_CHAT, "{\"messages\":null}", 400, "missing_required_parameter", "messages");
    expect_bad(KS_API_CHAT, "{\"messages\":[]}", 400, "empty_array", "messages");
    expect_bad(KS_API_CHAT, "{\"messages\":\"hi\"}", 400, "invalid_type", "messages");
    expect_bad(KS_API_CHAT, "{\"messages\":{\"role\":\"user\"}}", 400, "invalid_type", "messages");
    expect_bad(KS_API_CHAT, "{\"messages\":[\"hi\"]}", 400, "invalid_type", "messages[0]");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "missing_required_parameter",
               "messages[0].role");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":7,\"content\":\"hi\"}]}", 400, "invalid_type",
               "messages[0].role");
    expect_bad(KS_API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"wizard\",\"content\":\"hi\"}]}",
               400, "invalid_value", "messages[1].role");
    /* A tool result needs the id of the call it answers. */
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"hi\"}]}", 400,
               "missing_required_parameter", "messages[0].tool_call_id");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"function\",\"content\":\"hi\"}]}", 400, "invalid_value",
               "messages[0].role");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\"}]}]}",
               400, "missing_required_parameter", "messages[0].tool_calls[0].function");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":1}}]}]}",
               400, "invalid_type", "messages[0].tool_calls[0].function.name");
    expect_bad(KS_API_CHAT, CHAT(",\"tools\":[{\"type\":\"function\",\"function\":{}}]"), 400,
               "missing_required_parameter", "tools[0].function.name");
    expect_bad(KS_API_CHAT, CHAT(",\"tools\":[{\"type\":\"retrieval\"}]"), 400, "invalid_value", "tools[0].type");
    expect_bad(KS_API_CHAT, CHAT(",\"tool_choice\":\"sometimes\""), 400, "invalid_value", "tool_choice");
    expect_bad(KS_API_CHAT, CHAT(",\"response_format\":{\"type\":\"json_schema\"}"), 400,
               "missing_required_parameter", "response_format.json_schema");
    expect_bad(KS_API_CHAT, CHAT(",\"grammar\":\"root ::= x\",\"json_schema\":{}"), 400, "invalid_value", "grammar");
    expect_bad(KS_API_CHAT, CHAT(",\"logit_bias\":{\"5\":\"x\"}"), 400, "invalid_type", "logit_bias.5");
    expect_bad(KS_API_CHAT, CHAT(",\"logit_bias\":[[5]]"), 400, "invalid_value", "logit_bias[0]");
    /* One getter family (issue 30): these had codes of their own (invalid_value
     * for a wrong type and for a range); now OpenAI's, as every other field. */
    expect_bad(KS_API_CHAT, CHAT(",\"repeat_last_n\":-2"), 400, "integer_below_min_value", "repeat_last_n");
    expect_bad(KS_API_CHAT, CHAT(",\"repeat_last_n\":\"64\""), 400, "invalid_type", "repeat_last_n");
    expect_bad(KS_API_CHAT, CHAT(",\"presence_penalty\":3"), 400, "decimal_above_max_value", "presence_penalty");
    expect_bad(KS_API_CHAT, CHAT(",\"frequency_penalty\":-3"), 400, "decimal_below_min_value", "frequency_penalty");
    expect_bad(KS_API_CHAT, CHAT(",\"repeat_penalty\":\"x\""), 400, "invalid_type", "repeat_penalty");
    expect_bad(KS_API_CHAT, CHAT(",\"id_slot\":-2"), 400, "integer_below_min_value", "id_slot");
    expect_bad(KS_API_CHAT, CHAT(",\"id_slot\":1.5"), 400, "invalid_type", "id_slot");
    expect_bad(KS_API_CHAT, CHAT(",\"n_probs\":21"), 400, "integer_above_max_value", "n_probs");
    expect_bad(KS_API_CHAT, CHAT(",\"logprobs\":true,\"top_logprobs\":21"), 400, "integer_above_max_value",
               "top_logprobs");
    expect_bad(KS_API_CHAT, CHAT(",\"top_logprobs\":2"), 400, "invalid_value", "top_logprobs"); /* needs logprobs */
    expect_bad(KS_API_COMPLETION, CMPL(",\"logprobs\":21"), 400, "integer_above_max_value", "logprobs");
    expect_bad(KS_API_COMPLETION, CMPL(",\"logprobs\":true"), 400, "invalid_type", "logprobs");
    expect_bad(KS_API_CHAT, CHAT(",\"n\":\"2\""), 400, "invalid_type", "n");
    expect_bad(KS_API_COMPLETION, CMPL(",\"messages\":[]"), 400, "unsupported_parameter", "messages");
    expect_bad(KS_API_CHAT, CHAT(",\"prompt\":\"x\""), 400, "unsupported_parameter", "prompt");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "missing_required_parameter",
               "messages[0].content");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", 400,
               "missing_required_parameter", "messages[0].content");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "invalid_type",
               "messages[0].content");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"x\"}}]}", 400,
               "invalid_type", "messages[0].content");
    /* Content parts. */
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", 400, "invalid_type",
               "messages[0].content[0]");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", 400,
               "missing_required_parameter", "messages[0].content[0].type");
    expect_bad(KS_API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
               "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
               400, "invalid_value", "messages[0].content[1]"); /* no projector: no image input */
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"file\"}]}]}", 400,
               "invalid_value", "messages[0].content[0].type");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
               "missing_required_parameter", "messages[0].content[0].text");
    expect_bad(KS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}",
               400, "invalid_type", "messages[0].content[0].text");
}

static void test_bad_sampling(void **state) {
    (void)state;
    expect_bad(KS_API_CHAT, CHAT(",\"temperature\":\"hot\""), 400, "invalid_type", "temperature");
    expect_bad(KS_API_CHAT, CHAT(",\"temperature\":true"), 400, "invalid_type", "temperature");
    expect_bad(KS_API_CHAT, CHAT(",\"temperature\":-0.5"), 400, "decimal_below_min_value", "temperature");
    expect_bad(KS_API_CHAT, CHAT(",\"temperature\":2.5"), 400, "decimal_above_max_value", "temperature");
    expect_bad(KS_API_CHAT, CHAT(",\"top_p\":1.5"), 400, "decimal_above_max_value", "top_p");
    expect_bad(KS_API_CHAT, CHAT(",\"top_p\":[1]"), 400, "invalid_type", "top_p");
    expect_bad(KS_API_CHAT, CHAT(",\"min_p\":-1"), 400, "decimal_below_min_value", "min_p");
    expect_bad(KS_API_CHAT, CHAT(",\"top_k\":-1"), 400, "integer_below_min_value", "top_k");
    expect_bad(KS_API_CHAT, CHAT(",\"top_k\":2.5"), 400, "invalid_type", "top_k");
    expect_bad(KS_API_CHAT, CHAT(",\"max_tokens\":0"), 400, "integer_below_min_value", "max_tokens");
    expect_bad(KS_API_CHAT, CHAT(",\"max_tokens\":-5"), 400, "integer_below_min_value", "max_tokens");
    expect_bad(KS_API_CHAT, CHAT(",\"max_tokens\":1.5"), 400, "invalid_type", "max_tokens");
    expect_bad(KS_API_CHAT, CHAT(",\"max_tokens\":\"10\""), 400, "invalid_type", "max_tokens");
    expect_bad(KS_API_CHAT, CHAT(",\"max_tokens\":99999999999"), 400, "integer_above_max_value", "max_tokens");
    expect_bad(KS_API_CHAT, CHAT(",\"max_completion_tokens\":0"), 400, "integer_below_min_value",
               "max_completion_tokens");
    expect_bad(KS_API_CHAT, CHAT(",\"seed\":\"x\""), 400, "invalid_type", "seed");
    expect_bad(KS_API_CHAT, CHAT(",\"n\":0"), 400, "integer_below_min_value", "n");
    expect_bad(KS_API_CHAT, CHAT(",\"n\":17"), 400, "integer_above_max_value", "n");
    expect_bad(KS_API_CHAT, CHAT(",\"stream\":\"yes\""), 400, "invalid_type", "stream");
    expect_bad(KS_API_CHAT, CHAT(",\"stream\":1"), 400, "invalid_type", "stream");
    expect_bad(KS_API_CHAT, CHAT(",\"stream_options\":true"), 400, "invalid_type", "stream_options");
    expect_bad(KS_API_CHAT, CHAT(",\"stream_options\":{\"include_usage\":1}"), 400, "invalid_type",
               "stream_options.include_usage");
    expect_bad(KS_API_CHAT, CHAT(",\"cache_prompt\":\"no\""), 400, "invalid_type", "cache_prompt");
}

static void test_bad_stop(void **state) {
    (void)state;
    expect_bad(KS_API_CHAT, CHAT(",\"stop\":5"), 400, "invalid_type", "stop");
    expect_bad(KS_API_CHAT, CHAT(",\"stop\":{\"a\":1}"), 400, "invalid_type", "stop");
    expect_bad(KS_API_CHAT, CHAT(",\"stop\":[\"a\",5]"), 400, "invalid_type", "stop[1]");
    expect_bad(KS_API_CHAT, CHAT(",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
                                 "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]"),
               400, "array_above_max_length", "stop");
    char body[1024];
    char big[KS_API_MAX_STOP_LEN + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    snprintf(body, sizeof body, CHAT(",\"stop\":\"%s\""), big);
    expect_bad(KS_API_CHAT, body, 400, "string_above_max_length", "stop");
    snprintf(body, sizeof body, CHAT(",\"stop\":[\"a\",\"%s\"]"), big);
    expect_bad(KS_API_CHAT, body, 400, "string_above_max_length", "stop[1]");
}

/* ------------------------------------------------------- completions: bad */
static void test_bad_prompt(void **state) {
    (void)state;
    expect_bad(KS_API_COMPLETION, "{}", 400, "missing_required_parameter", "prompt");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":null}", 400, "missing_required_parameter", "prompt");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":\"\"}", 400, "invalid_value", "prompt");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[]}", 400, "empty_array", "prompt");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[\"a\",\"\"]}", 400, "invalid_value", "prompt[1]");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[\"a\",5]}", 400, "invalid_type", "prompt[1]");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[\"\"]}", 400, "invalid_value", "prompt[0]");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":5}", 400, "invalid_type", "prompt");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":{\"a\":1}}", 400, "invalid_type", "prompt");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[1,\"a\"]}", 400, "invalid_type", "prompt[1]");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[1,-2]}", 400, "invalid_value", "prompt[1]");
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[[1,\"x\"]]}", 400, "invalid_type", "prompt[0][1]");
    expect_bad(KS_API_COMPLETION, CMPL(",\"temperature\":\"0\""), 400, "invalid_type", "temperature");
    expect_bad(KS_API_COMPLETION, CMPL(",\"max_tokens\":0"), 400, "integer_below_min_value", "max_tokens");
    /* A chat body on the completions endpoint lacks its prompt. */
    expect_bad(KS_API_COMPLETION, CHAT(""), 400, "missing_required_parameter", "prompt");
}

/* ---------------------------------------------------------------- good */
static void test_chat_defaults(void **state) {
    (void)state;
    ks_api_request r;
    parse_ok(KS_API_CHAT, CHAT(""), &r);
    assert_int_equal(r.kind, KS_API_CHAT);
    assert_int_equal(r.n_msgs, 1);
    assert_string_equal(r.msgs[0].role, "user");
    assert_string_equal(r.msgs[0].content, "hi");
    assert_int_equal(r.max_tokens, -1);
    assert_false(r.stream);
    assert_false(r.include_usage);
    assert_true(r.cache_prompt);
    assert_false(r.seed_set);
    assert_int_equal(r.n_stops, 0);
    ks_sample_params d = ks_api_sample_defaults();
    assert_true(r.sample.temperature == d.temperature);
    assert_int_equal(r.sample.top_k, 40);
    assert_true(r.sample.top_p == 0.95f);
    assert_true(r.sample.min_p == 0.05f);
    ks_api_request_free(&r);
    ks_api_request_free(&r); /* idempotent */
    ks_api_request_free(NULL);
}

static void test_chat_fields(void **state) {
    (void)state;
    ks_api_request r;
    parse_ok(KS_API_CHAT,
             "{\"model\":\"whatever\",\"user\":\"u\",\"presence_penalty\":0,\"tools\":[],\"metadata\":{},"
             "\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
             "{\"role\":\"system\",\"content\":\"sys\",\"name\":\"x\"},"
             "{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\",\"content\":null},"
             "{\"role\":\"assistant\"},{\"role\":\"user\",\"content\":\"q2\"}],"
             "\"max_tokens\":7,\"temperature\":0,\"top_p\":1,\"top_k\":0,\"min_p\":0,\"seed\":-3,\"n\":1,"
             "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"cache_prompt\":false,"
             "\"stop\":null,\"logprobs\":null}",
             &r);
    assert_int_equal(r.n_msgs, 6);
    assert_string_equal(r.msgs[0].role, "system"); /* developer is system */
    assert_string_equal(r.msgs[0].content, "be brief");
    assert_string_equal(r.msgs[1].role, "system");
    assert_string_equal(r.msgs[3].role, "assistant");
    assert_string_equal(r.msgs[3].content, "");
    assert_string_equal(r.msgs[4].content, "");
    assert_string_equal(r.msgs[5].content, "q2");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.sample.temperature == 0.0f);
    assert_int_equal(r.sample.top_k, 0);
    assert_true(r.seed_set);
    assert_true(r.sample.seed == (uint64_t)-3);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_false(r.cache_prompt);
    assert_int_equal(r.n_stops, 0);
    ks_api_request_free(&r);

    /* max_completion_tokens wins over max_tokens; an integer temperature is a number. */
    parse_ok(KS_API_CHAT, CHAT(",\"max_tokens\":5,\"max_completion_tokens\":9,\"temperature\":1"), &r);
    assert_int_equal(r.max_tokens, 9);
    assert_true(r.sample.temperature == 1.0f);
    ks_api_request_free(&r);
    parse_ok(KS_API_CHAT, CHAT(",\"max_tokens\":null,\"temperature\":null,\"stream\":null"), &r);
    assert_int_equal(r.max_tokens, -1);
    assert_false(r.stream);
    ks_api_request_free(&r);
    /* include_usage without stream is accepted (and harmless). */
    parse_ok(KS_API_CHAT, CHAT(",\"stream_options\":{}"), &r);
    assert_false(r.include_usage);
    ks_api_request_free(&r);
}

static void test_content_parts(void **state) {
    (void)state;
    ks_api_request r;
    parse_ok(KS_API_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"first\"},"
             "{\"type\":\"text\",\"text\":\"second\"},{\"type\":\"text\",\"text\":\"\"},"
             "{\"type\":\"text\",\"text\":\"third \\u00e9\"}]},"
             "{\"role\":\"assistant\",\"content\":[]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\"},{\"type\":\"text\",\"text\":\"x\"}]}]}",
             &r);
    assert_int_equal(r.n_msgs, 3);
    /* Joined with "\n" like llama.cpp's server; an empty leading part adds no newline. */
    assert_string_equal(r.msgs[0].content, "first\nsecond\n\nthird \xc3\xa9");
    assert_string_equal(r.msgs[1].content, "");
    assert_string_equal(r.msgs[2].content, "x");
    ks_api_request_free(&r);
}

static void test_stop_parsing(void **state) {
    (void)state;
    ks_api_request r;
    parse_ok(KS_API_CHAT, CHAT(",\"stop\":\"\\n\\n\""), &r);
    assert_int_equal(r.n_stops, 1);
    assert_string_equal(r.stops[0], "\n\n");
    ks_api_request_free(&r);

    parse_ok(KS_API_CHAT, CHAT(",\"stop\":[\"END\",\"\",\"\\u00fc\"]"), &r);
    assert_int_equal(r.n_stops, 2); /* the empty string is dropped */
    assert_string_equal(r.stops[0], "END");
    assert_string_equal(r.stops[1], "\xc3\xbc");
    ks_api_request_free(&r);

    parse_ok(KS_API_CHAT, CHAT(",\"stop\":[]"), &r);
    assert_int_equal(r.n_stops, 0);
    ks_api_request_free(&r);

    parse_ok(KS_API_CHAT, CHAT(",\"stop\":\"\""), &r);
    assert_int_equal(r.n_stops, 0);
    ks_api_request_free(&r);

    parse_ok(KS_API_CHAT, CHAT(",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
                               "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\"]"),
             &r);
    assert_int_equal(r.n_stops, KS_API_MAX_STOPS);
    assert_string_equal(r.stops[15], "16");
    ks_api_request_free(&r);
}

/* The fields of an agent: tool calls and results, tools, a named tool
 * choice, structured output, sampling, as the template request sees them. */
static void test_agent_fields(void **state) {
    (void)state;
    ks_api_request r;
    parse_ok(KS_API_CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"abc123def\",\"type\":\"function\","
             "\"function\":{\"name\":\"w\",\"arguments\":{\"city\":\"Oslo\"}}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"abc123def\",\"content\":\"sunny\"}],"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\"}},"
             "{\"type\":\"function\",\"function\":{\"name\":\"v\",\"parameters\":{\"type\":\"object\"}}}],"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"v\"}},"
             "\"logit_bias\":{\"7\":-100,\"hello\":2},\"logprobs\":true,\"top_logprobs\":2,\"n\":3,"
             "\"repeat_penalty\":1.1,\"ignore_eos\":true,\"id_slot\":1,\"user\":\"u\"}",
             &r);
    assert_true(r.has_tools);
    json_t *tr = r.tmpl_req;
    json_t *m1 = json_array_get(json_object_get(tr, "messages"), 1);
    assert_true(json_is_null(json_object_get(m1, "content")));
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(m1, "tool_calls"), 0), "function"),
                                   "arguments");
    assert_string_equal(json_string_value(args), "{\"city\":\"Oslo\"}"); /* an object is serialized */
    json_t *m2 = json_array_get(json_object_get(tr, "messages"), 2);
    assert_string_equal(json_string_value(json_object_get(m2, "role")), "tool");
    assert_string_equal(json_string_value(json_object_get(m2, "tool_call_id")), "abc123def");
    /* The named tool only, and required. */
    assert_int_equal(json_array_size(json_object_get(tr, "tools")), 1);
    assert_string_equal(json_string_value(json_object_get(tr, "tool_choice")), "required");
    assert_int_equal(r.n_bias, 2);
    assert_int_equal(r.bias[0].tok, 7);
    assert_true(r.bias[0].bias == -100.0f);
    assert_string_equal(r.bias[1].text, "hello");
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 2);
    assert_int_equal(r.n, 3);
    assert_true(r.repeat_penalty > 1.09f && r.repeat_penalty < 1.11f);
    assert_true(r.ignore_eos);
    assert_int_equal(r.id_slot, 1);
    ks_api_request_free(&r);

    parse_ok(KS_API_CHAT, CHAT(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\"}}],\"tool_choice\":\"none\""), &r);
    assert_false(r.has_tools);
    ks_api_request_free(&r);

    parse_ok(KS_API_CHAT, CHAT(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
                               "\"schema\":{\"type\":\"object\"}}},\"logit_bias\":[[5,false]]"), &r);
    assert_true(r.structured);
    assert_non_null(json_object_get(r.tmpl_req, "response_format"));
    assert_true(r.bias[0].bias < -1e30f); /* false: banned */
    ks_api_request_free(&r);
}

static void test_prompt_forms(void **state) {
    (void)state;
    ks_api_request r;
    parse_ok(KS_API_COMPLETION, CMPL(",\"max_tokens\":3,\"stream\":true"), &r);
    assert_string_equal(r.prompt, "once upon");
    assert_null(r.prompt_tokens);
    assert_int_equal(r.max_tokens, 3);
    assert_true(r.stream);
    ks_api_request_free(&r);

    parse_ok(KS_API_COMPLETION, "{\"prompt\":[\"only one\"]}", &r);
    assert_string_equal(r.prompt, "only one");
    ks_api_request_free(&r);

    parse_ok(KS_API_COMPLETION, "{\"prompt\":[1,2,300]}", &r);
    assert_null(r.prompt);
    assert_int_equal(r.n_prompt_tokens, 3);
    assert_int_equal(r.prompt_tokens[2], 300);
    ks_api_request_free(&r);

    parse_ok(KS_API_COMPLETION, "{\"prompt\":[\"a\",[1,2],\"c\"],\"n\":2,\"logprobs\":3}", &r);
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompts[0].text, "a");
    assert_int_equal(r.prompts[1].n_tokens, 2);
    assert_string_equal(r.prompts[2].text, "c");
    assert_int_equal(r.n, 2);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    ks_api_request_free(&r);
    /* 64 prompts x n may not pass 64 choices. */
    expect_bad(KS_API_COMPLETION, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"n\":16}", 400, "invalid_value", "n");
}

/* The body need not be NUL-terminated: only len bytes are read. */
static void test_body_length(void **state) {
    (void)state;
    const char *s = CHAT("") "GARBAGE";
    ks_api_request r;
    ks_api_error e;
    assert_int_equal(ks_api_parse(KS_API_CHAT, s, strlen(s) - 7, &r, &e), 0);
    ks_api_request_free(&r);
    assert_int_equal(ks_api_parse(KS_API_CHAT, s, strlen(s), &r, &e), KS_EINVAL);
    assert_int_equal(e.status, 400);
}

/* ---------------------------------------------------------------- errors */
static void test_error_json(void **state) {
    (void)state;
    ks_api_error e;
    ks_api_error_set(&e, 400, "invalid_request_error", "invalid_type", "temperature", "bad %s", "thing");
    json_t *o = ks_api_error_json(&e);
    assert_non_null(o);
    json_t *err = json_object_get(o, "error");
    assert_true(json_is_object(err));
    assert_string_equal(json_string_value(json_object_get(err, "message")), "bad thing");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "temperature");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "invalid_type");
    json_decref(o);

    /* No param, no code: both null (OpenAI's shape keeps the keys). */
    ks_api_error_set(&e, 503, "server_error", NULL, NULL, "busy");
    o = ks_api_error_json(&e);
    err = json_object_get(o, "error");
    assert_true(json_is_null(json_object_get(err, "param")));
    assert_true(json_is_null(json_object_get(err, "code")));
    json_decref(o);

    /* A message cut inside a UTF-8 character still encodes. */
    ks_api_error_set(&e, 400, "invalid_request_error", "x", NULL, "%s", "caf\xc3");
    o = ks_api_error_json(&e);
    assert_non_null(o);
    assert_non_null(json_string_value(json_object_get(json_object_get(o, "error"), "message")));
    json_decref(o);
}

/* A long unknown role is quoted, cut, and the error still renders. */
static void test_long_role(void **state) {
    (void)state;
    char body[2048];
    char role[600];
    memset(role, 'r', sizeof role - 1);
    role[sizeof role - 1] = '\0';
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"%s\",\"content\":\"x\"}]}", role);
    expect_bad(KS_API_CHAT, body, 400, "invalid_value", "messages[0].role");
}

/* Regression (found by tests/fuzz/fuzz_api): an unknown field whose name
 * is 27 x U+20AC (81 bytes) was quoted as its first 80 bytes, cut inside
 * the 27th character; json_string refused the param, the error body could
 * not be built and the client got a 500 "out of memory" instead of the 400.
 * The cut character is now dropped, in the param and the message alike,
 * and the error renders in both shapes (OpenAI, Anthropic). */
static void test_cut_field_name(void **state) {
    (void)state;
    char name[128] = "", want[128] = "", body[256];
    for (int i = 0; i < 27; i++) strcat(name, "\xe2\x82\xac");
    for (int i = 0; i < 21; i++) strcat(want, "\xe2\x82\xac");
    /* An unknown field is ignored now (issue 25): its note keeps the name,
     * cut at a character boundary (63 bytes of 81: 21 characters). */
    snprintf(body, sizeof body, CHAT(",\"%s\":1"), name);
    ks_api_request r;
    ks_api_error e;
    parse_ok(KS_API_CHAT, body, &r);
    assert_int_equal(r.notes.n, 1);
    assert_string_equal(r.notes.v[0].field, want);
    ks_api_request_free(&r);

    /* A refused one quotes it cut too: a cache_control key (32 bytes of 33). */
    name[0] = want[0] = '\0';
    for (int i = 0; i < 11; i++) strcat(name, "\xe2\x82\xac");
    strcpy(want, "messages[0].cache_control.");
    for (int i = 0; i < 10; i++) strcat(want, "\xe2\x82\xac");
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"cache_control\":"
             "{\"type\":\"ephemeral\",\"%s\":1}}]}", name);
    expect_bad(KS_API_CHAT, body, 400, "unsupported_parameter", want);
    assert_int_equal(ks_api_parse(KS_API_CHAT, body, strlen(body), &r, &e), KS_EINVAL);
    json_t *o = ks_api_error_json(&e);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "param")), want);
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(o, "error"), "message")), want));
    json_decref(o);
    o = ks_api_messages_error_json(&e);
    assert_non_null(o);
    json_decref(o);

    /* A message cut inside a character keeps the text around the cut. */
    ks_api_error_set(&e, 400, "invalid_request_error", "x", NULL, "'%.4s' is bad", "caf\xc3\xa9");
    assert_string_equal(e.message, "'caf' is bad");
    o = ks_api_messages_error_json(&e);
    assert_non_null(o);
    json_decref(o);
}

/* Issue 25's field policy on chat: a field no list knows is noted and
 * ignored (as llama-server ignores it); the named hosted-service fields are
 * ignored without a note; the other endpoint's own fields stay a 400. */
static void test_unknown_fields(void **state) {
    (void)state;
    ks_api_request r;
    parse_ok(KS_API_CHAT, CHAT(",\"frobnicate\":true,\"user\":\"u\",\"prompt_cache_key\":\"k\",\"verbosity\":\"low\""),
             &r);
    assert_int_equal(r.notes.n, 2);
    assert_string_equal(r.notes.v[0].field, "frobnicate");
    assert_string_equal(r.notes.v[0].what, "an unknown field");
    assert_string_equal(r.notes.v[1].field, "verbosity");
    ks_api_request_free(&r);
    parse_ok(KS_API_COMPLETION, CMPL(",\"frobnicate\":true"), &r);
    assert_int_equal(r.notes.n, 1);
    ks_api_request_free(&r);
    /* at most KS_API_MAX_NOTES kept, all counted */
    char body[1024] = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    for (int i = 0; i < KS_API_MAX_NOTES + 3; i++) snprintf(body + strlen(body), 32, ",\"f%d\":%d", i, i);
    strcat(body, "}");
    parse_ok(KS_API_CHAT, body, &r);
    assert_int_equal(r.notes.n, KS_API_MAX_NOTES);
    assert_int_equal(r.notes.n_total, KS_API_MAX_NOTES + 3);
    ks_api_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_json),      cmocka_unit_test(test_bad_messages),
        cmocka_unit_test(test_bad_sampling),  cmocka_unit_test(test_bad_stop),
        cmocka_unit_test(test_bad_prompt),    cmocka_unit_test(test_chat_defaults),
        cmocka_unit_test(test_chat_fields),   cmocka_unit_test(test_content_parts),
        cmocka_unit_test(test_stop_parsing),  cmocka_unit_test(test_agent_fields), cmocka_unit_test(test_prompt_forms),
        cmocka_unit_test(test_body_length),   cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_long_role),     cmocka_unit_test(test_cut_field_name),
        cmocka_unit_test(test_unknown_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

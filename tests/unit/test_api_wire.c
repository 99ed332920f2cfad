/* test_api_wire.c — the Responses and Messages translations (api_responses.c,
 * api_messages.c), cache_control breakpoints (api_chat.c) and the two
 * stream state machines, without a model. */
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

static json_t *J(const char *text) {
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &e);
    if (!v) fail_msg("bad test JSON: %s: %s", e.text, text);
    return v;
}

/* a equals the JSON text b. */
static void assert_json(const json_t *a, const char *b) {
    json_t *x = J(b);
    if (!json_equal((json_t *)a, x)) {
        char *d = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("got %s\nwant %s", d, b);
    }
    json_decref(x);
}

/* ------------------------------------------------------------ responses */
static void test_responses_items(void **state) {
    (void)state;
    json_t *root = J("{\"model\":\"m\",\"instructions\":\"Be nice.\",\"max_output_tokens\":9,"
                     "\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
                     "{\"type\":\"input_text\",\"text\":\"b\",\"cache_control\":{\"type\":\"ephemeral\"}}]},"
                     "{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},"
                     "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"c\"}]},"
                     "{\"type\":\"function_call\",\"call_id\":\"k1\",\"name\":\"f\",\"arguments\":\"{}\"},"
                     "{\"type\":\"function_call\",\"call_id\":\"k2\",\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"},"
                     "{\"type\":\"function_call_output\",\"call_id\":\"k1\",\"output\":\"r1\"},"
                     "{\"type\":\"function_call_output\",\"call_id\":\"k2\",\"output\":\"r2\"}],"
                     "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],"
                     "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
                     "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"w\",\"schema\":{\"type\":\"object\"}}}}");
    json_t *hist = J("[{\"role\":\"user\",\"content\":\"old\"},{\"role\":\"assistant\",\"content\":\"reply\"}]");
    ks_api_resp_req rr;
    ks_api_error err;
    assert_int_equal(ks_api_responses_to_chat(root, hist, &rr, &err), 0);
    assert_true(rr.store);
    /* Instructions, then the history, then the input: consecutive calls join the
     * assistant message before them, reasoning rides on it. */
    assert_json(json_object_get(rr.chat, "messages"),
                "[{\"role\":\"system\",\"content\":\"Be nice.\"},{\"role\":\"user\",\"content\":\"old\"},"
                "{\"role\":\"assistant\",\"content\":\"reply\"},"
                "{\"role\":\"user\",\"content\":\"a\\nb\",\"cache_control\":{\"type\":\"ephemeral\"}},"
                "{\"role\":\"assistant\",\"content\":\"c\",\"reasoning_content\":\"hmm\",\"tool_calls\":["
                "{\"id\":\"k1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
                "{\"id\":\"k2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"k1\",\"content\":\"r1\"},"
                "{\"role\":\"tool\",\"tool_call_id\":\"k2\",\"content\":\"r2\"}]");
    /* The input alone (kept with the response) has no instructions or history. */
    assert_int_equal(json_array_size(rr.input), 4);
    assert_int_equal(json_integer_value(json_object_get(rr.chat, "max_tokens")), 9);
    assert_json(json_object_get(rr.chat, "tools"),
                "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]");
    assert_json(json_object_get(rr.chat, "tool_choice"), "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}");
    assert_json(json_object_get(rr.chat, "response_format"),
                "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\",\"schema\":{\"type\":\"object\"}}}");
    /* The chat parser takes the result, with the breakpoint on message 3. */
    ks_api_request rq;
    assert_int_equal(ks_api_parse_root(KS_API_CHAT, json_incref(rr.chat), &rq, &err), 0);
    assert_int_equal(rq.n_bps, 1);
    assert_int_equal(rq.bps[0].msg, 3);
    assert_int_equal(rq.bps[0].ttl_s, 300);
    assert_int_equal(rq.max_tokens, 9);
    ks_api_request_free(&rq);
    ks_api_resp_req_free(&rr);
    json_decref(hist);
    json_decref(root);
}

static void expect_resp_error(const char *body, const char *code, const char *param) {
    json_t *root = J(body);
    ks_api_resp_req rr;
    ks_api_error err;
    assert_int_equal(ks_api_responses_to_chat(root, NULL, &rr, &err), KS_EINVAL);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, code);
    assert_string_equal(err.param, param);
    assert_null(rr.chat);
    json_decref(root);
}

static void test_responses_errors(void **state) {
    (void)state;
    expect_resp_error("{\"input\":\"x\",\"n\":2}", "unsupported_parameter", "n");
    expect_resp_error("{}", "missing_required_parameter", "input");
    expect_resp_error("{\"input\":\"\"}", "invalid_value", "input");
    expect_resp_error("{\"input\":[]}", "empty_array", "input");
    expect_resp_error("{\"input\":7}", "invalid_type", "input");
    expect_resp_error("{\"input\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "invalid_value", "input[0].role");
    expect_resp_error("{\"input\":[{\"role\":\"user\"}]}", "missing_required_parameter", "input[0].content");
    expect_resp_error("{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "unsupported_value", "input[0].type");
    expect_resp_error("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"a\"}]}", "missing_required_parameter",
                      "input[0].output");
    expect_resp_error("{\"input\":\"x\",\"conversation\":\"conv_1\"}", "unsupported_parameter", "conversation");
    expect_resp_error("{\"input\":\"x\",\"prompt\":{\"id\":\"pmpt_1\"}}", "unsupported_parameter", "prompt");
    expect_resp_error("{\"input\":\"x\",\"tools\":[{\"name\":\"f\"}]}", "missing_required_parameter",
                      "tools[0].type");
    expect_resp_error("{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"n\"}]}",
                      "missing_required_parameter", "tools[0].tools");
    expect_resp_error("{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"n\",\"tools\":{}}]}",
                      "invalid_type", "tools[0].tools");
    expect_resp_error("{\"input\":\"x\",\"tool_choice\":{\"type\":\"mcp\"},\"tools\":[]}", "unsupported_value",
                      "tool_choice");
    expect_resp_error("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}", "missing_required_parameter",
                      "text.format.schema");
    expect_resp_error("{\"input\":\"x\",\"truncation\":\"auto\"}", "unsupported_value", "truncation");
    expect_resp_error("{\"input\":\"x\",\"store\":\"yes\"}", "invalid_type", "store");
    expect_resp_error("{\"input\":\"x\",\"instructions\":3}", "invalid_type", "instructions");
    json_t *root = J("{\"input\":\"x\",\"previous_response_id\":5}");
    const char *id;
    ks_api_error err;
    assert_int_equal(ks_api_responses_prev_id(root, &id, &err), KS_EINVAL);
    assert_string_equal(err.param, "previous_response_id");
    json_decref(root);
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_responses_stream(void **state) {
    (void)state;
    ks_api_rstream st;
    ks_api_rstream_init(&st, NULL);
    ks_buf out = {0};
    json_t *resp = J("{\"id\":\"resp_1\",\"status\":\"in_progress\",\"output\":[]}");
    assert_int_equal(ks_api_rstream_start(&st, resp, &out), 0);
    const char *deltas[] = {
        "{\"reasoning_content\":\"think\"}",
        "{\"content\":\"Hel\"}",
        "{\"content\":\"lo\"}",
        "{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}",
    };
    for (size_t i = 0; i < sizeof deltas / sizeof deltas[0]; i++) {
        json_t *d = J(deltas[i]);
        assert_int_equal(ks_api_rstream_delta(&st, d, &out), 0);
        json_decref(d);
    }
    json_object_set_new(resp, "status", json_string("completed"));
    assert_int_equal(ks_api_rstream_end(&st, resp, &out), 0);
    /* Three items, each added and done once; events numbered 0.. in order. */
    assert_int_equal(count(out.s, "event: response.output_item.added\n"), 3);
    assert_int_equal(count(out.s, "event: response.output_item.done\n"), 3);
    assert_int_equal(count(out.s, "event: response.output_text.delta\n"), 2);
    assert_int_equal(count(out.s, "event: response.function_call_arguments.delta\n"), 2);
    assert_non_null(strstr(out.s, "\"arguments\":\"{\\\"a\\\":1}\""));
    assert_true(strstr(out.s, "event: response.created") < strstr(out.s, "event: response.reasoning_text.delta"));
    assert_true(strstr(out.s, "event: response.output_text.done") < strstr(out.s, "event: response.function_call_arguments.delta"));
    assert_non_null(strstr(out.s, "event: response.completed\n"));
    assert_non_null(strstr(out.s, "\"sequence_number\":0"));
    char last[48];
    snprintf(last, sizeof last, "\"sequence_number\":%d", st.seq - 1);
    assert_non_null(strstr(out.s, last));
    /* The final response carries the items as streamed. */
    json_t *items = json_object_get(resp, "output");
    assert_int_equal(json_array_size(items), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 1), "type")), "message");
    assert_json(json_object_get(json_array_get(json_object_get(json_array_get(items, 1), "content"), 0), "text"),
                "\"Hello\"");
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 2), "call_id")), "c1");
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 2), "status")), "completed");
    json_decref(resp);
    ks_buf_free(&out);
    ks_api_rstream_free(&st);
}

static void test_responses_output(void **state) {
    (void)state;
    json_t *msg = J("{\"content\":\"\",\"reasoning_content\":\"r\",\"tool_calls\":[{\"id\":\"k\",\"type\":\"function\","
                    "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}");
    json_t *items = ks_api_responses_output(msg, NULL, NULL);
    assert_int_equal(json_array_size(items), 2); /* no empty message beside a call */
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 0), "type")), "reasoning");
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 1), "type")), "function_call");
    ks_req_result r = {.n_prompt = 50, .n_cached = 40, .n_generated = 5};
    json_t *req = J("{\"instructions\":\"I\",\"temperature\":0.5}");
    ks_api_resp_out o = {.id = "resp_x", .created = 1, .model = "m", .status = "incomplete",
                         .incomplete = "max_output_tokens", .req = req, .output = items, .store = true, .r = &r};
    json_t *resp = ks_api_responses_object(&o);
    assert_json(json_object_get(resp, "usage"),
                "{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":40},\"output_tokens\":5,"
                "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":55}");
    assert_json(json_object_get(resp, "incomplete_details"), "{\"reason\":\"max_output_tokens\"}");
    assert_string_equal(json_string_value(json_object_get(resp, "instructions")), "I");
    json_decref(resp);
    json_decref(req);
    json_decref(items);
    json_decref(msg);
}

/* ------------------------------------------------------------ messages */
static void test_messages_translate(void **state) {
    (void)state;
    json_t *root = J("{\"model\":\"m\",\"max_tokens\":20,\"stop_sequences\":[\"END\"],\"thinking\":{\"type\":\"enabled\","
                     "\"budget_tokens\":1024},\"system\":[{\"type\":\"text\",\"text\":\"S1\"},{\"type\":\"text\",\"text\":"
                     "\"S2\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}],"
                     "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"},"
                     "\"cache_control\":{\"type\":\"ephemeral\"}}],\"tool_choice\":{\"type\":\"any\","
                     "\"disable_parallel_tool_use\":true},\"messages\":["
                     "{\"role\":\"user\",\"content\":\"hi\"},"
                     "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"s\"},"
                     "{\"type\":\"text\",\"text\":\"calling\"},{\"type\":\"tool_use\",\"id\":\"u1\",\"name\":\"f\","
                     "\"input\":{\"a\":1}}]},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"u1\",\"content\":"
                     "[{\"type\":\"text\",\"text\":\"ok\"}]},{\"type\":\"text\",\"text\":\"next\",\"cache_control\":"
                     "{\"type\":\"ephemeral\"}}]}]}");
    ks_api_msg_req mr;
    ks_api_error err;
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &err), 0);
    assert_int_equal(mr.n_user_stops, 1);
    assert_json(json_object_get(mr.chat, "messages"),
                "[{\"role\":\"system\",\"content\":\"S1\\nS2\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}},"
                "{\"role\":\"user\",\"content\":\"hi\"},"
                "{\"role\":\"assistant\",\"content\":\"calling\",\"reasoning_content\":\"t\",\"tool_calls\":[{\"id\":"
                "\"u1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"u1\",\"content\":\"ok\"},"
                "{\"role\":\"user\",\"content\":\"next\",\"cache_control\":{\"type\":\"ephemeral\"}}]");
    assert_json(json_object_get(mr.chat, "tool_choice"), "\"required\"");
    assert_true(json_is_false(json_object_get(mr.chat, "parallel_tool_calls")));
    assert_true(json_is_true(json_object_get(mr.chat, "enable_thinking")));
    assert_json(json_object_get(mr.chat, "stop"), "[\"END\"]");
    ks_api_request rq;
    assert_int_equal(ks_api_parse_root(KS_API_CHAT, json_incref(mr.chat), &rq, &err), 0);
    /* Breakpoints: the system message (1 h), the last user message, the tools. */
    assert_int_equal(rq.n_bps, 3);
    assert_int_equal(rq.bps[0].msg, 0);
    assert_int_equal(rq.bps[0].ttl_s, 3600);
    assert_int_equal(rq.bps[1].msg, 4);
    assert_int_equal(rq.bps[2].msg, -1);
    assert_int_equal(rq.n_stops, 1);
    assert_true(rq.has_tools);
    ks_api_request_free(&rq);
    ks_api_msg_req_free(&mr);
    json_decref(root);
}

static void expect_msg_error(const char *body, bool count, const char *param) {
    json_t *root = J(body);
    ks_api_msg_req mr;
    ks_api_error err;
    assert_int_equal(ks_api_messages_to_chat(root, count, &mr, &err), KS_EINVAL);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, param);
    json_t *o = ks_api_messages_error_json(&err);
    assert_string_equal(json_string_value(json_object_get(o, "type")), "error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "type")), "invalid_request_error");
    json_decref(o);
    json_decref(root);
}

/* Issue 25's request-field policy on Responses (docs/SERVER.md, "Request
 * fields"), with what Codex 0.169 sends: client_metadata, include,
 * prompt_cache_key and text.verbosity ignored silently; an unknown field
 * noted and ignored; web_search and tool_search dropped with a note;
 * function tools of a namespace group named ns__name; a custom tool a
 * function of one string; n: 1 taken. */
static void test_responses_field_policy(void **state) {
    (void)state;
    json_t *root = J("{\"model\":\"gpt-5.5\",\"input\":\"x\",\"n\":1,\"store\":false,"
                     "\"client_metadata\":{\"thread_id\":\"t\"},\"include\":[\"reasoning.encrypted_content\"],"
                     "\"prompt_cache_key\":\"k\",\"text\":{\"verbosity\":\"low\"},\"frobnicate\":{},"
                     "\"reasoning\":{\"effort\":\"medium\",\"summary\":\"auto\"},"
                     "\"tools\":[{\"type\":\"function\",\"name\":\"exec_command\",\"strict\":false,"
                     "\"parameters\":{\"type\":\"object\"}},"
                     "{\"type\":\"custom\",\"name\":\"apply_patch\",\"description\":\"Edit files.\","
                     "\"format\":{\"type\":\"grammar\",\"syntax\":\"lark\",\"definition\":\"start: x\"}},"
                     "{\"type\":\"namespace\",\"name\":\"mcp\",\"tools\":[{\"type\":\"function\",\"name\":\"read\"},"
                     "{\"type\":\"web_search\"}]},"
                     "{\"type\":\"tool_search\",\"execution\":\"client\"},{\"type\":\"web_search\"}]}");
    ks_api_resp_req rr;
    ks_api_error err;
    assert_int_equal(ks_api_responses_to_chat(root, NULL, &rr, &err), 0);
    assert_int_equal(rr.notes.n, 4);
    assert_string_equal(rr.notes.v[0].field, "frobnicate");
    assert_string_equal(rr.notes.v[0].what, "an unknown field");
    assert_string_equal(rr.notes.v[1].field, "tools[2].tools[1]");
    assert_string_equal(rr.notes.v[2].field, "tools[3]");
    assert_string_equal(rr.notes.v[2].what, "a hosted tool (tool_search)");
    assert_string_equal(rr.notes.v[3].field, "tools[4]");
    assert_string_equal(rr.notes.v[3].what, "a hosted tool (web_search)");
    json_t *tools = json_object_get(rr.chat, "tools");
    assert_int_equal(json_array_size(tools), 3);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(tools, 1), "function"), "name")),
                        "apply_patch");
    assert_json(json_object_get(json_object_get(json_object_get(json_array_get(tools, 1), "function"), "parameters"),
                                "required"), "[\"input\"]");
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(tools, 2), "function"), "name")),
                        "mcp__read");
    assert_json(rr.tool_map, "{\"apply_patch\":{\"custom\":true,\"name\":\"apply_patch\"},"
                             "\"mcp__read\":{\"namespace\":\"mcp\",\"name\":\"read\"}}");
    assert_string_equal(json_string_value(json_object_get(rr.chat, "reasoning_effort")), "medium");

    /* The output maps the calls back: a namespaced function call, a custom tool call. */
    json_t *msg = J("{\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"function\":{\"name\":\"mcp__read\","
                    "\"arguments\":\"{}\"}},{\"id\":\"c2\",\"function\":{\"name\":\"apply_patch\","
                    "\"arguments\":\"{\\\"input\\\":\\\"*** Begin Patch\\\"}\"}}]}");
    json_t *items = ks_api_responses_output(msg, NULL, rr.tool_map);
    assert_int_equal(json_array_size(items), 2);
    json_t *a = json_array_get(items, 0), *b = json_array_get(items, 1);
    assert_string_equal(json_string_value(json_object_get(a, "type")), "function_call");
    assert_string_equal(json_string_value(json_object_get(a, "name")), "read");
    assert_string_equal(json_string_value(json_object_get(a, "namespace")), "mcp");
    assert_string_equal(json_string_value(json_object_get(b, "type")), "custom_tool_call");
    assert_string_equal(json_string_value(json_object_get(b, "name")), "apply_patch");
    assert_string_equal(json_string_value(json_object_get(b, "input")), "*** Begin Patch");
    assert_string_equal(json_string_value(json_object_get(b, "call_id")), "c2");

    /* Streamed, the custom call's input comes whole in its .done events. */
    ks_api_rstream st;
    ks_api_rstream_init(&st, rr.tool_map);
    ks_buf out = {0};
    json_t *d1 = J("{\"tool_calls\":[{\"index\":0,\"id\":\"c2\",\"function\":"
                   "{\"name\":\"apply_patch\",\"arguments\":\"{\\\"inp\"}}]}");
    json_t *d2 = J("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"ut\\\":\\\"p\\\"}\"}}]}");
    assert_int_equal(ks_api_rstream_delta(&st, d1, &out), 0); /* deltas are borrowed */
    assert_int_equal(ks_api_rstream_delta(&st, d2, &out), 0);
    json_decref(d1);
    json_decref(d2);
    json_t *resp = J("{\"status\":\"completed\"}");
    assert_int_equal(ks_api_rstream_end(&st, resp, &out), 0);
    assert_non_null(strstr(out.s, "event: response.custom_tool_call_input.done"));
    assert_null(strstr(out.s, "function_call_arguments"));
    assert_json(json_object_get(json_array_get(json_object_get(resp, "output"), 0), "input"), "\"p\"");
    json_decref(resp);
    ks_buf_free(&out);
    ks_api_rstream_free(&st);
    json_decref(items);
    json_decref(msg);
    ks_api_resp_req_free(&rr);
    json_decref(root);

    /* The next turn's input: the calls as Codex sends them back. */
    root = J("{\"input\":[{\"role\":\"user\",\"content\":\"x\"},"
             "{\"type\":\"function_call\",\"namespace\":\"mcp\",\"name\":\"read\",\"call_id\":\"c1\",\"arguments\":\"{}\"},"
             "{\"type\":\"custom_tool_call\",\"name\":\"apply_patch\",\"call_id\":\"c2\",\"input\":\"p\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r1\"},"
             "{\"type\":\"custom_tool_call_output\",\"call_id\":\"c2\",\"output\":\"r2\"}]}");
    assert_int_equal(ks_api_responses_to_chat(root, NULL, &rr, &err), 0);
    assert_json(json_object_get(rr.chat, "messages"),
                "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
                "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"mcp__read\",\"arguments\":\"{}\"}},"
                "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"apply_patch\","
                "\"arguments\":\"{\\\"input\\\":\\\"p\\\"}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r1\"},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"r2\"}]");
    ks_api_resp_req_free(&rr);
    json_decref(root);
}

/* The same policy on Messages, with what Claude Code 2.1.197 sends:
 * context_management and metadata ignored silently, output_config.effort as
 * the reasoning effort ("max" is "high"), output_config.format as a JSON
 * schema, a system message inside messages kept where it stands, a server
 * tool dropped with a note, an unknown field noted. */
static void test_messages_field_policy(void **state) {
    (void)state;
    json_t *root = J("{\"model\":\"qwen3-coder\",\"max_tokens\":8,\"metadata\":{\"user_id\":\"u\"},"
                     "\"context_management\":{\"edits\":[{\"type\":\"clear_thinking_20251015\",\"keep\":\"all\"}]},"
                     "\"output_config\":{\"effort\":\"max\",\"format\":{\"type\":\"json_schema\","
                     "\"schema\":{\"type\":\"object\"}}},\"frobnicate\":1,"
                     "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"},"
                     "{\"name\":\"Bash\",\"input_schema\":{\"type\":\"object\"}}],"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"system\",\"content\":\"agents\"},"
                     "{\"role\":\"assistant\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"go\"}]}");
    ks_api_msg_req mr;
    ks_api_error err;
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &err), 0);
    assert_int_equal(mr.mid_system, 1);
    assert_int_equal(mr.notes.n, 2);
    assert_string_equal(mr.notes.v[0].field, "frobnicate");
    assert_string_equal(mr.notes.v[1].field, "tools.0");
    assert_string_equal(mr.notes.v[1].what, "a server tool (web_search_20250305)");
    assert_json(json_object_get(mr.chat, "messages"),
                "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"system\",\"content\":\"agents\"},"
                "{\"role\":\"assistant\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"go\"}]");
    assert_int_equal(json_array_size(json_object_get(mr.chat, "tools")), 1);
    assert_string_equal(json_string_value(json_object_get(mr.chat, "reasoning_effort")), "high");
    assert_json(json_object_get(mr.chat, "response_format"),
                "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"output\",\"schema\":{\"type\":\"object\"}}}");
    ks_api_msg_req_free(&mr);
    json_decref(root);
    /* count_tokens: a sampling field it does not take is noted, not refused. */
    root = J("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1}");
    assert_int_equal(ks_api_messages_to_chat(root, true, &mr, &err), 0);
    assert_int_equal(mr.notes.n, 1);
    assert_string_equal(mr.notes.v[0].field, "temperature");
    assert_int_equal(mr.mid_system, -1);
    ks_api_msg_req_free(&mr);
    json_decref(root);
}

/* Claude Code 2.1.332's tool search (captured): deferred tools are not in
 * chat's tools until a tool_reference loads one; the reference renders the
 * tool's definition as text in the tool result; the loaded tool goes to chat
 * with defer_loading (callable, not rendered). The mid-conversation tool
 * changes: tool_addition (a definition, a reference) and tool_removal in a
 * system message render as text and change what may be called. */
static void test_messages_tool_search(void **state) {
    (void)state;
    const char *tools = "\"tools\":[{\"name\":\"Read\",\"input_schema\":{\"type\":\"object\"}},"
                        "{\"name\":\"ToolSearch\",\"input_schema\":{\"type\":\"object\"}},"
                        "{\"name\":\"WebFetch\",\"description\":\"Fetch\",\"input_schema\":{\"type\":\"object\"},"
                        "\"defer_loading\":true},"
                        "{\"name\":\"DeferredToolPlaceholder\",\"input_schema\":{\"type\":\"object\"},"
                        "\"defer_loading\":true,\"cache_control\":{\"type\":\"ephemeral\"}}]";
    char body[2048];
    /* Turn 1: nothing loaded. The placeholder's breakpoint moves to the last rendered tool. */
    snprintf(body, sizeof body, "{\"max_tokens\":8,%s,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", tools);
    json_t *root = J(body);
    ks_api_msg_req mr;
    ks_api_error err;
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &err), 0);
    assert_json(json_object_get(mr.chat, "tools"),
                "[{\"type\":\"function\",\"function\":{\"name\":\"Read\",\"parameters\":{\"type\":\"object\"}}},"
                "{\"type\":\"function\",\"function\":{\"name\":\"ToolSearch\",\"parameters\":{\"type\":\"object\"}},"
                "\"cache_control\":{\"type\":\"ephemeral\"}}]");
    ks_api_msg_req_free(&mr);
    json_decref(root);
    /* Turn 2: ToolSearch's result references WebFetch. */
    snprintf(body, sizeof body,
             "{\"max_tokens\":8,%s,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t0\",\"name\":\"ToolSearch\","
             "\"input\":{\"query\":\"select:WebFetch\"}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t0\",\"content\":"
             "[{\"type\":\"tool_reference\",\"tool_name\":\"WebFetch\"}]}]}]}", tools);
    root = J(body);
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &err), 0);
    json_t *msgs = json_object_get(mr.chat, "messages");
    assert_json(json_array_get(msgs, 2),
                "{\"role\":\"tool\",\"tool_call_id\":\"t0\",\"content\":\"Tool loaded: {\\\"type\\\":\\\"function\\\","
                "\\\"function\\\":{\\\"name\\\":\\\"WebFetch\\\",\\\"description\\\":\\\"Fetch\\\",\\\"parameters\\\":"
                "{\\\"type\\\":\\\"object\\\"}}}\"}");
    json_t *ct = json_object_get(mr.chat, "tools");
    assert_int_equal(json_array_size(ct), 3);
    assert_true(json_is_true(json_object_get(json_array_get(ct, 2), "defer_loading")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(ct, 2), "function"), "name")),
                        "WebFetch");
    /* chat: WebFetch is callable, not listed. */
    ks_api_request rq;
    assert_int_equal(ks_api_parse_root(KS_API_CHAT, json_incref(mr.chat), &rq, &err), 0);
    assert_int_equal(json_array_size(json_object_get(rq.tmpl_req, "tools")), 2);
    assert_int_equal(json_array_size(json_object_get(rq.tmpl_req, "deferred_tools")), 1);
    assert_true(rq.has_tools);
    ks_api_request_free(&rq);
    ks_api_msg_req_free(&mr);
    json_decref(root);
    /* Tool changes in a system message: a new tool by definition, WebFetch by
     * reference, then Read and the new tool removed. */
    snprintf(body, sizeof body,
             "{\"max_tokens\":8,%s,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
             "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"note\"},{\"type\":\"tool_addition\","
             "\"tool\":{\"type\":\"tool_definition\",\"definition\":{\"name\":\"mcp__x\",\"input_schema\":"
             "{\"type\":\"object\"}}}},{\"type\":\"tool_addition\",\"tool\":{\"type\":\"tool_reference\",\"name\":"
             "\"WebFetch\"}}]},{\"role\":\"assistant\",\"content\":\"ok\"},"
             "{\"role\":\"system\",\"content\":[{\"type\":\"tool_removal\",\"tool\":{\"type\":\"tool_reference\","
             "\"name\":\"Read\"}},{\"type\":\"tool_removal\",\"tool\":{\"type\":\"tool_reference\",\"name\":"
             "\"mcp__x\"}}]},{\"role\":\"user\",\"content\":\"go\"}]}", tools);
    root = J(body);
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &err), 0);
    msgs = json_object_get(mr.chat, "messages");
    assert_json(json_array_get(msgs, 1),
                "{\"role\":\"system\",\"content\":\"note\\nTool added: {\\\"type\\\":\\\"function\\\",\\\"function\\\":"
                "{\\\"name\\\":\\\"mcp__x\\\",\\\"parameters\\\":{\\\"type\\\":\\\"object\\\"}}}\\nTool added: "
                "{\\\"type\\\":\\\"function\\\",\\\"function\\\":{\\\"name\\\":\\\"WebFetch\\\",\\\"description\\\":"
                "\\\"Fetch\\\",\\\"parameters\\\":{\\\"type\\\":\\\"object\\\"}}}\"}");
    assert_json(json_array_get(msgs, 3), "{\"role\":\"system\",\"content\":\"Tool removed: Read\\nTool removed: mcp__x\"}");
    ct = json_object_get(mr.chat, "tools");
    /* Read stays listed (the prompt's prefix), WebFetch loaded, mcp__x gone again. */
    assert_int_equal(json_array_size(ct), 3);
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(ct, 2), "function"), "name")),
                        "WebFetch");
    assert_int_equal(mr.mid_system, 1);
    ks_api_msg_req_free(&mr);
    json_decref(root);
    /* A reference to a tool the request does not define renders its name and loads nothing. */
    root = J("{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
             "\"tool_use_id\":\"t\",\"content\":[{\"type\":\"tool_reference\",\"tool_name\":\"Gone\"}]}]}]}");
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &err), 0);
    assert_json(json_array_get(json_object_get(mr.chat, "messages"), 0),
                "{\"role\":\"tool\",\"tool_call_id\":\"t\",\"content\":\"Tool loaded: {\\\"type\\\":\\\"function\\\","
                "\\\"function\\\":{\\\"name\\\":\\\"Gone\\\"}}\"}");
    assert_null(json_object_get(mr.chat, "tools"));
    ks_api_msg_req_free(&mr);
    json_decref(root);
    /* Malformed: a reference without a name, a tool_addition of another shape, defer_loading not a boolean. */
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                     "\"tool_use_id\":\"t\",\"content\":[{\"type\":\"tool_reference\"}]}]}]}",
                     false, "messages.0.content.0.content.0");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"system\","
                     "\"content\":[{\"type\":\"tool_addition\",\"tool\":{\"type\":\"other\"}}]}]}",
                     false, "messages.1.content.0.tool");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"system\","
                     "\"content\":[{\"type\":\"tool_addition\",\"tool\":{\"type\":\"tool_definition\",\"definition\":"
                     "{\"name\":\"x\"}}}]}]}",
                     false, "messages.1.content.0.tool.definition");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":"
                     "\"a\",\"input_schema\":{},\"defer_loading\":\"yes\"}]}",
                     false, "tools.0.defer_loading");
}

/* Nested fields (issue 40): an unknown one is noted once per folded path,
 * however many items carry it; the ones docs/SERVER.md lists as ignored are
 * not noted; server tools' own fields are not checked. */
static void test_nested_fields(void **state) {
    (void)state;
    json_t *root = J("{\"max_tokens\":8,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":9,\"display\":\"x\","
                     "\"zzz\":1},\"tools\":[{\"name\":\"a\",\"input_schema\":{},\"eager_input_streaming\":true,"
                     "\"frob\":1},{\"name\":\"b\",\"input_schema\":{},\"frob\":2,\"strict\":true},"
                     "{\"type\":\"web_search_20250305\",\"name\":\"web_search\",\"max_uses\":3}],"
                     "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\",\"flair\":1}]}]}");
    ks_api_msg_req mr;
    ks_api_error err;
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &err), 0);
    assert_int_equal(mr.notes.n, 4);
    assert_string_equal(mr.notes.v[0].field, "tools[].frob");
    assert_string_equal(mr.notes.v[0].what, "an unknown field");
    assert_string_equal(mr.notes.v[1].field, "thinking.zzz");
    assert_string_equal(mr.notes.v[2].field, "messages[].content[].flair");
    assert_string_equal(mr.notes.v[3].field, "tools.2");
    ks_api_msg_req_free(&mr);
    json_decref(root);
    /* Chat: messages, tools and their functions. */
    root = J("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"refusal\":null,\"weight\":1}],"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"examples\":[]}}],"
             "\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}}");
    ks_api_request rq;
    assert_int_equal(ks_api_parse_root(KS_API_CHAT, root, &rq, &err), 0);
    assert_int_equal(rq.notes.n, 2);
    assert_string_equal(rq.notes.v[0].field, "messages[].weight");
    assert_string_equal(rq.notes.v[1].field, "tools[].function.examples");
    ks_api_request_free(&rq);
}

static void test_messages_errors(void **state) {
    (void)state;
    expect_msg_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false, "max_tokens");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[]}", false, "messages");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", false,
                     "messages.0.role");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"system\","
                     "\"content\":[{\"type\":\"image\"}]}]}", false, "messages.1.content.0");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"output_config\":"
                     "{\"effort\":\"extreme\"}}", false, "output_config.effort");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"output_config\":"
                     "{\"format\":{\"type\":\"json_schema\"}}}", false, "output_config.format");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", false,
                     "messages.0.content.0.source");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]}",
                     false, "messages.0.content.0");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
                     "\"bash_20250124\",\"name\":\"bash\"}]}", false, "tools.0");
    expect_msg_error("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":"
                     "\"some\"}}", false, "tool_choice.type");
    json_t *root = J("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    ks_api_msg_req mr;
    ks_api_error err;
    assert_int_equal(ks_api_messages_to_chat(root, true, &mr, &err), 0);
    ks_api_msg_req_free(&mr);
    json_decref(root);
    /* Status to Anthropic's error type. */
    ks_api_error e;
    ks_api_error_set(&e, 503, "server_error", "queue_full", NULL, "busy");
    json_t *o = ks_api_messages_error_json(&e);
    assert_json(o, "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}");
    json_decref(o);
}

static void test_messages_output(void **state) {
    (void)state;
    ks_req_result r = {.n_prompt = 100, .n_cached = 60, .n_cache_written = 30, .n_generated = 4};
    json_t *u = ks_api_messages_usage(&r);
    assert_json(u, "{\"input_tokens\":10,\"cache_creation_input_tokens\":30,\"cache_read_input_tokens\":60,"
                   "\"output_tokens\":4}");
    json_decref(u);
    json_t *msg = J("{\"content\":\"x\",\"reasoning_content\":\"why\",\"tool_calls\":[{\"id\":\"k\",\"function\":{"
                    "\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 2}\"}}]}");
    ks_api_msg_out o = {.id = "msg_1", .model = "m", .msg = msg, .stop_reason = "tool_use", .r = &r};
    json_t *m = ks_api_messages_object(&o);
    assert_json(json_object_get(m, "content"),
                "[{\"type\":\"thinking\",\"thinking\":\"why\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"x\"},"
                "{\"type\":\"tool_use\",\"id\":\"k\",\"name\":\"f\",\"input\":{\"a\":2}}]");
    assert_string_equal(json_string_value(json_object_get(m, "stop_reason")), "tool_use");
    assert_true(json_is_null(json_object_get(m, "stop_sequence")));
    json_decref(m);
    json_decref(msg);

    /* The stream: blocks open and close in order, a thinking block gets its signature. */
    ks_api_mstream st;
    ks_buf out = {0};
    assert_int_equal(ks_api_mstream_start(&st, "msg_1", "m", &r, &out), 0);
    const char *deltas[] = {
        "{\"reasoning_content\":\"a\"}", "{\"content\":\"b\"}",
        "{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}",
        "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}",
    };
    for (size_t i = 0; i < 4; i++) {
        json_t *d = J(deltas[i]);
        assert_int_equal(ks_api_mstream_delta(&st, d, &out), 0);
        json_decref(d);
    }
    assert_int_equal(ks_api_mstream_end(&st, "tool_use", NULL, &r, &out), 0);
    assert_int_equal(count(out.s, "event: content_block_start\n"), 3);
    assert_int_equal(count(out.s, "event: content_block_stop\n"), 3);
    assert_int_equal(count(out.s, "\"signature_delta\""), 1);
    assert_non_null(strstr(out.s, "\"partial_json\":\"{}\""));
    assert_true(strstr(out.s, "event: message_start") < strstr(out.s, "event: content_block_start"));
    assert_true(strstr(out.s, "event: message_delta") < strstr(out.s, "event: message_stop"));
    assert_non_null(strstr(out.s, "\"cache_read_input_tokens\":60"));
    ks_buf_free(&out);

    /* Nothing generated: one empty text block. */
    assert_int_equal(ks_api_mstream_start(&st, "msg_2", "m", NULL, &out), 0);
    assert_int_equal(ks_api_mstream_end(&st, "end_turn", NULL, NULL, &out), 0);
    assert_int_equal(count(out.s, "event: content_block_start\n"), 1);
    ks_buf_free(&out);
}

/* ------------------------------------------------------------ chat breakpoints */
static void test_chat_breakpoints(void **state) {
    (void)state;
    ks_api_request rq;
    ks_api_error err;
    const char *ok = "{\"messages\":[{\"role\":\"system\",\"content\":\"s\",\"cache_control\":{\"type\":\"ephemeral\"}},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"u\",\"cache_control\":{\"type\":"
                     "\"ephemeral\",\"ttl\":\"1h\"}}],\"cache_control\":{\"type\":\"ephemeral\"}}]}";
    assert_int_equal(ks_api_parse(KS_API_CHAT, ok, strlen(ok), &rq, &err), 0);
    assert_int_equal(rq.n_bps, 2); /* two marks on message 1 are one breakpoint, the longer TTL */
    assert_int_equal(rq.bps[1].msg, 1);
    assert_int_equal(rq.bps[1].ttl_s, 3600);
    /* The template never sees cache_control (it is not part of a message's hash). */
    assert_null(json_object_get(json_array_get(json_object_get(rq.tmpl_req, "messages"), 0), "cache_control"));
    ks_api_request_free(&rq);
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":{\"type\":\"persistent\"}}]}",
         "messages[0].cache_control.type"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1d\"}}]}",
         "messages[0].cache_control.ttl"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":\"yes\"}]}", "messages[0].cache_control"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"u\",\"cache_control\":{\"type\":\"ephemeral\",\"x\":1}}]}",
         "messages[0].cache_control.x"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"f\"},\"cache_control\":{}}]}",
         "tools[0].cache_control.type"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ks_api_parse(KS_API_CHAT, bad[i].body, strlen(bad[i].body), &rq, &err), KS_EINVAL);
        assert_string_equal(err.param, bad[i].param);
    }
    /* At most four breakpoints. */
    ks_buf b = {0};
    ks_buf_printf(&b, "{\"messages\":[");
    for (int i = 0; i < 5; i++)
        ks_buf_printf(&b, "%s{\"role\":\"user\",\"content\":\"m%d\",\"cache_control\":{\"type\":\"ephemeral\"}}",
                      i ? "," : "", i);
    ks_buf_printf(&b, "]}");
    assert_int_equal(ks_api_parse(KS_API_CHAT, b.s, b.len, &rq, &err), KS_EINVAL);
    assert_string_equal(err.param, "messages[4].cache_control");
    ks_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_responses_items),   cmocka_unit_test(test_responses_errors),
        cmocka_unit_test(test_responses_stream),  cmocka_unit_test(test_responses_output),
        cmocka_unit_test(test_messages_translate), cmocka_unit_test(test_messages_errors),
        cmocka_unit_test(test_messages_tool_search), cmocka_unit_test(test_nested_fields),
        cmocka_unit_test(test_messages_output),   cmocka_unit_test(test_chat_breakpoints),
        cmocka_unit_test(test_responses_field_policy), cmocka_unit_test(test_messages_field_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

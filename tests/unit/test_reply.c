/* test_reply.c — a generation's output (src/server/output.c) and reply
 * (src/server/reply.c) through a recording format table: the calls a format
 * gets, in order (fmt.h F1), with the deltas, logprobs and endings the
 * generation's text makes; no model, no scheduler, no HTTP. The OpenAI
 * chat table is checked on the live path too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/chat_tmpl.h"
#include "server/fmt.h"
#include "server/output.h"
#include "server/reply.h"

/* ------------------------------------------------------------ the recorder */
/* Every call as one JSON object: {"call": name, ...its arguments}. */
typedef struct rec {
    json_t *calls;
    int freed;
} rec;

static rec R;

static void note(json_t *o) { json_array_append_new(R.calls, o); }

/* Sets key to a copy of v when there is one (absent: not passed). */
static json_t *with(json_t *o, const char *key, const json_t *v) {
    if (v) json_object_set_new(o, key, json_deep_copy(v));
    return o;
}

static int parse(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    (void)env, (void)root, (void)rq, (void)st, (void)e;
    fail_msg("not called by the reply");
    return KS_EINVAL;
}

static void free_state(void *st) {
    assert_ptr_equal(st, &R);
    R.freed++;
}

static json_t *whole(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, int n, const ks_req_result *total) {
    assert_ptr_equal(st, &R);
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(
            a, with(with(json_pack("{s:i, s:s, s:s, s:i, s:i}", "index", ch[i].index, "finish", ch[i].finish, "text",
                                   ch[i].text, "stop_index", ch[i].stop_index, "n_generated", ch[i].r->n_generated),
                         "msg", ch[i].msg),
                    "logprobs", ch[i].logprobs));
    note(json_pack("{s:s, s:s, s:i}", "call", "whole", "id", g->id, "total", total->n_generated));
    return json_pack("{s:o}", "choices", a);
}

static int stream_start(void *st, const ks_fmt_gen *g, ks_buf *out) {
    assert_ptr_equal(st, &R);
    note(json_pack("{s:s, s:i}", "call", "start", "n", g->n_choices));
    return ks_buf_append(out, "S", 1);
}

static int stream_delta(void *st, const ks_fmt_gen *g, int index, const json_t *delta, const json_t *logprobs,
                        ks_buf *out) {
    (void)st, (void)g;
    note(with(with(json_pack("{s:s, s:i}", "call", "delta", "index", index), "delta", delta), "logprobs", logprobs));
    return ks_buf_append(out, "D", 1);
}

static int stream_end(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, ks_buf *out) {
    (void)st, (void)g;
    note(json_pack("{s:s, s:i, s:s, s:s, s:i}", "call", "end", "index", ch->index, "finish", ch->finish, "text",
                   ch->text, "stop_index", ch->stop_index));
    return ks_buf_append(out, "E", 1);
}

static int stream_error(void *st, const ks_fmt_gen *g, int index, const ks_api_error *e, ks_buf *out) {
    (void)st, (void)g;
    note(json_pack("{s:s, s:i, s:i, s:s}", "call", "error", "index", index, "status", e->status, "code", e->code));
    return ks_buf_append(out, "X", 1);
}

static int stream_done(void *st, const ks_fmt_gen *g, const ks_req_result *total, ks_buf *out) {
    (void)st, (void)g;
    note(json_pack("{s:s, s:i}", "call", "done", "total", total->n_generated));
    return ks_buf_append(out, "Z", 1);
}

static const ks_fmt RECORDER = {
    .name = "recorder", .id_prefix = "rec-", .parse = parse, .free_state = free_state,
    .error_json = ks_api_error_json, .whole = whole, .stream_start = stream_start, .stream_delta = stream_delta,
    .stream_end = stream_end, .stream_error = stream_error, .stream_done = stream_done,
};

static json_t *J(const char *text) {
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &e);
    if (!v) fail_msg("bad test JSON: %s: %s", e.text, text);
    return v;
}

/* The recorded calls equal the JSON text want (then forgotten). */
static void assert_calls(const char *want) {
    json_t *w = J(want);
    if (!json_equal(R.calls, w)) {
        char *d = json_dumps(R.calls, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("calls:\n%s\nwant:\n%s", d, want);
    }
    json_decref(w);
    json_array_clear(R.calls);
}

static int setup(void **st) {
    (void)st;
    json_decref(R.calls);
    R.calls = json_array();
    R.freed = 0;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    json_decref(R.calls);
    R.calls = NULL;
    return 0;
}

static ks_reply *make(int n, const char *parse, bool continuation) {
    ks_fmt_gen g = {.id = "rec-1", .created = 7, .model = "m", .n_choices = n};
    ks_reply *rp = ks__reply_create(&RECORDER, &R, &g, parse, continuation);
    assert_non_null(rp);
    return rp;
}

/* ------------------------------------------------------------ streams */
/* Two choices of plain text: F1's order, each choice's text as content
 * deltas, its end with everything it said, then done with the totals. */
static void test_stream_order(void **st) {
    (void)st;
    ks_reply *rp = make(2, NULL, false);
    ks_buf out = {0};
    ks_req_result r0 = {.finish = KS_FINISH_STOP, .n_generated = 2}, r1 = {.finish = KS_FINISH_LENGTH, .n_generated = 3};
    ks_reply_end e0 = {.r = &r0, .stop_index = -1}, e1 = {.r = &r1, .stop_index = -1};
    assert_int_equal(ks__reply_start(rp, &out), 0);
    assert_int_equal(ks__reply_choice(rp, 0, "Hel", 3, NULL, NULL, &out), 0);
    assert_int_equal(ks__reply_choice(rp, 1, "abc", 3, NULL, NULL, &out), 0);
    assert_false(ks__reply_finished(rp, 0));
    assert_int_equal(ks__reply_choice(rp, 0, "lo", 2, NULL, &e0, &out), 0);
    assert_true(ks__reply_finished(rp, 0));
    assert_int_equal(ks__reply_choice(rp, 1, NULL, 0, NULL, &e1, &out), 0);
    ks_req_result t = {.n_generated = 5};
    assert_int_equal(ks__reply_done(rp, &t, &out), 0);
    assert_calls("[{\"call\":\"start\",\"n\":2},"
                 "{\"call\":\"delta\",\"index\":0,\"delta\":{\"content\":\"Hel\"}},"
                 "{\"call\":\"delta\",\"index\":1,\"delta\":{\"content\":\"abc\"}},"
                 "{\"call\":\"delta\",\"index\":0,\"delta\":{\"content\":\"lo\"}},"
                 "{\"call\":\"end\",\"index\":0,\"finish\":\"stop\",\"text\":\"Hello\",\"stop_index\":-1},"
                 "{\"call\":\"end\",\"index\":1,\"finish\":\"length\",\"text\":\"abc\",\"stop_index\":-1},"
                 "{\"call\":\"done\",\"total\":5}]");
    assert_string_equal(out.s, "SDDDEEZ");
    ks_buf_free(&out);
    ks__reply_free(rp);
    assert_int_equal(R.freed, 1); /* F2: the state goes with the reply, once */
}

/* Logprob entries ride on the next delta; those that never get one go out
 * on an empty delta before the end. A stop string names its index; a
 * length finish cut by a stop string is a stop. */
static void test_stream_logprobs(void **st) {
    (void)st;
    ks_reply *rp = make(1, NULL, false);
    ks_buf out = {0};
    assert_int_equal(ks__reply_start(rp, &out), 0);
    assert_int_equal(ks__reply_choice(rp, 0, NULL, 0, J("[{\"token\":\"a\"}]"), NULL, &out), 0);
    assert_int_equal(ks__reply_choice(rp, 0, NULL, 0, J("[{\"token\":\"b\"}]"), NULL, &out), 0);
    assert_int_equal(ks__reply_choice(rp, 0, "ab", 2, J("[{\"token\":\"c\"}]"), NULL, &out), 0);
    assert_int_equal(ks__reply_choice(rp, 0, NULL, 0, J("[{\"token\":\"d\"}]"), NULL, &out), 0);
    ks_req_result r = {.finish = KS_FINISH_LENGTH};
    ks_reply_end e = {.r = &r, .stopped = true, .stop_index = 1};
    assert_int_equal(ks__reply_choice(rp, 0, NULL, 0, NULL, &e, &out), 0);
    assert_calls("[{\"call\":\"start\",\"n\":1},"
                 "{\"call\":\"delta\",\"index\":0,\"delta\":{\"content\":\"ab\"},"
                 "\"logprobs\":[{\"token\":\"a\"},{\"token\":\"b\"},{\"token\":\"c\"}]},"
                 "{\"call\":\"delta\",\"index\":0,\"logprobs\":[{\"token\":\"d\"}]},"
                 "{\"call\":\"end\",\"index\":0,\"finish\":\"stop\",\"text\":\"ab\",\"stop_index\":1}]");
    ks_buf_free(&out);
    ks__reply_free(rp);
}

/* A choice that did not complete ends with its error, and nothing follows
 * the error (F1): no done. Canceled: 503; the grammar refused: 400; the
 * text could not be kept: 500. */
static void test_stream_error(void **st) {
    (void)st;
    static const struct {
        ks_finish finish;
        int error;
        bool failed;
        const char *want;
    } cases[] = {
        {KS_FINISH_CANCEL, 0, false, "{\"call\":\"error\",\"index\":0,\"status\":503,\"code\":\"shutting_down\"}"},
        {KS_FINISH_ERROR, KS_EINVAL, false, "{\"call\":\"error\",\"index\":0,\"status\":400,\"code\":\"invalid_grammar\"}"},
        {KS_FINISH_STOP, 0, true, "{\"call\":\"error\",\"index\":0,\"status\":500,\"code\":\"generation_failed\"}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ks_reply *rp = make(1, NULL, false);
        ks_buf out = {0};
        ks_req_result r = {.finish = cases[i].finish, .error = cases[i].error};
        ks_reply_end e = {.r = &r, .stop_index = -1, .failed = cases[i].failed};
        assert_int_equal(ks__reply_start(rp, &out), 0);
        assert_int_equal(ks__reply_choice(rp, 0, "x", 1, NULL, &e, &out), 0);
        assert_int_equal(ks__reply_done(rp, &r, &out), 0);
        char want[256];
        snprintf(want, sizeof want,
                 "[{\"call\":\"start\",\"n\":1},{\"call\":\"delta\",\"index\":0,\"delta\":{\"content\":\"x\"}},%s]",
                 cases[i].want);
        assert_calls(want);
        ks_buf_free(&out);
        ks__reply_free(rp);
    }
}

/* Text that is not UTF-8 cannot become a delta: an error, not a chunk
 * (the textstream never hands the reply such text). */
static void test_stream_bad_text(void **st) {
    (void)st;
    ks_reply *rp = make(1, NULL, false);
    ks_buf out = {0};
    assert_int_not_equal(ks__reply_choice(rp, 0, "\xc3", 1, NULL, NULL, &out), 0);
    ks_buf_free(&out);
    ks__reply_free(rp);
    json_array_clear(R.calls);
}

/* ------------------------------------------------------------ whole replies */
static void test_whole(void **st) {
    (void)st;
    ks_reply *rp = make(2, NULL, false);
    ks_req_result r0 = {.finish = KS_FINISH_STOP, .n_generated = 1}, r1 = {.finish = KS_FINISH_STOP, .n_generated = 2};
    ks_reply_end ends[2] = {{.r = &r0, .stop_index = -1}, {.r = &r1, .stopped = true, .stop_index = 0}};
    const char *texts[2] = {"a", "bc"};
    json_t *lp = J("[{\"token\":\"a\"}]");
    json_t *lps[2] = {lp, NULL};
    ks_req_result t = {.n_generated = 3};
    ks_api_error e;
    json_t *o = ks__reply_whole(rp, texts, lps, ends, &t, &e);
    assert_non_null(o);
    json_t *want = J("{\"choices\":[{\"index\":0,\"finish\":\"stop\",\"text\":\"a\",\"logprobs\":[{\"token\":\"a\"}],"
                     "\"stop_index\":-1,\"n_generated\":1},"
                     "{\"index\":1,\"finish\":\"stop\",\"text\":\"bc\",\"stop_index\":0,\"n_generated\":2}]}");
    assert_true(json_equal(o, want));
    json_decref(want);
    json_decref(o);
    assert_calls("[{\"call\":\"whole\",\"id\":\"rec-1\",\"total\":3}]");
    /* A failed choice: the reply is its error, and the format is not asked. */
    r1.finish = KS_FINISH_CANCEL;
    ends[1].stopped = false;
    assert_null(ks__reply_whole(rp, texts, lps, ends, &t, &e));
    assert_int_equal(e.status, 503);
    assert_calls("[]");
    json_decref(lp);
    ks__reply_free(rp);
}

/* ------------------------------------------------------------ output parsing */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = '\0';
    fclose(f);
    return b;
}

/* The parse options of a request with one tool through Qwen2.5's template
 * (Hermes-style <tool_call> blocks). Owned. */
static char *tool_parse(void) {
    const char *dir = getenv("KS_TEMPLATES_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/Qwen-Qwen2.5-7B-Instruct.jinja", dir ? dir : "deps/common/templates");
    char *src = slurp(path);
    if (!src) fail_msg("cannot read %s", path);
    ks_chat_tmpl *t = NULL;
    char err[512] = "";
    assert_int_equal(ks_chat_tmpl_create(NULL, src, &t, err, sizeof err), 0);
    free(src);
    const char *req = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"tools\":[{\"type\":"
                      "\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                      "\"properties\":{\"city\":{\"type\":\"string\"}}}}}]}";
    char *res = NULL;
    assert_int_equal(ks_chat_tmpl_apply(t, req, &res, err, sizeof err), 0);
    json_t *r = J(res);
    char *parse = json_dumps(json_object_get(r, "parse"), JSON_COMPACT);
    json_decref(r);
    free(res);
    ks_chat_tmpl_free(t);
    return parse;
}

/* A tool call streamed in pieces: the header (id, name) once, before its
 * first argument fragment, then the fragments; the id is the same in every
 * partial parse and in the end (O1, O2); the finish becomes tool_calls. */
static void test_output_tool_call(void **st) {
    (void)st;
    char *parse = tool_parse();
    static const char *const pieces[] = {"Let me check.", "\n<tool_call>\n{\"name\": \"get_",
                                         "weather\", \"arguments\": {\"city\": \"Pa", "ris\"}}\n</tool_call>"};
    ks_out o;
    assert_int_equal(ks__out_init(&o, parse, "test"), 0);
    json_t *all = json_array();
    for (size_t i = 0; i < 4; i++) {
        json_t *d = NULL;
        assert_int_equal(ks__out_feed(&o, pieces[i], strlen(pieces[i]), false, &d), 0);
        json_array_extend(all, d);
        json_decref(d);
    }
    json_t *d = NULL;
    assert_int_equal(ks__out_feed(&o, NULL, 0, true, &d), 0);
    json_array_extend(all, d);
    json_decref(d);
    /* text first; one header with the name whole; fragments that add up */
    ks_buf content = {0}, args = {0};
    int headers = 0;
    const char *id = NULL;
    size_t i;
    json_t *x;
    json_array_foreach(all, i, x) {
        const char *c = json_string_value(json_object_get(x, "content"));
        if (c) {
            assert_int_equal(headers, 0);
            ks_buf_append(&content, c, strlen(c));
            continue;
        }
        json_t *tc = json_array_get(json_object_get(x, "tool_calls"), 0);
        assert_non_null(tc);
        assert_int_equal(json_integer_value(json_object_get(tc, "index")), 0);
        json_t *fn = json_object_get(tc, "function");
        if (json_object_get(tc, "id")) {
            headers++;
            id = json_string_value(json_object_get(tc, "id"));
            assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
            assert_int_equal(args.len, 0);
        }
        const char *a = json_string_value(json_object_get(fn, "arguments"));
        ks_buf_append(&args, a, strlen(a));
    }
    assert_int_equal(headers, 1);
    assert_non_null(id);
    assert_int_equal(strlen(id), 9);
    /* the final message trims the text before the call; the stream sent it as it grew */
    assert_memory_equal(content.s, "Let me check.", 13);
    json_t *want = J("{\"city\": \"Paris\"}"), *got = J(args.s);
    assert_true(json_equal(want, got));
    json_decref(want);
    json_decref(got);
    /* The final message keeps the streamed id. */
    json_t *calls = json_object_get(o.msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 0), "id")), id);
    assert_string_equal(ks__out_finish(&o, "stop"), "tool_calls");
    assert_string_equal(ks__out_finish(&o, "length"), "length");
    /* The whole reply parses the same text into the same call. */
    ks_out w;
    assert_int_equal(ks__out_init(&w, parse, "test"), 0);
    ks__out_whole(&w, o.text.s, false);
    assert_int_equal(json_array_size(json_object_get(w.msg, "tool_calls")), 1);
    assert_string_equal(json_string_value(json_object_get(w.msg, "content")),
                        json_string_value(json_object_get(o.msg, "content")));
    ks__out_free(&w);
    ks_buf_free(&content);
    ks_buf_free(&args);
    json_decref(all);
    ks__out_free(&o);
    free(parse);
}

/* Plain text: every piece a content delta; a whole reply has no message. */
static void test_output_plain(void **st) {
    (void)st;
    ks_out o;
    assert_int_equal(ks__out_init(&o, NULL, "test"), 0);
    json_t *d = NULL;
    assert_int_equal(ks__out_feed(&o, "x", 1, false, &d), 0);
    json_t *want = J("[{\"content\":\"x\"}]");
    assert_true(json_equal(d, want));
    json_decref(want);
    json_decref(d);
    assert_int_equal(ks__out_feed(&o, NULL, 0, true, &d), 0);
    assert_null(d);
    ks__out_whole(&o, "x", false);
    assert_null(o.msg);
    assert_string_equal(ks__out_finish(&o, "stop"), "stop");
    ks__out_free(&o);
    ks__out_free(&o); /* idempotent */
}

/* ------------------------------------------------------------ the chat table, live */
/* The OpenAI chat table on the reply path: the role chunk, a text chunk
 * built by ks_api_chunk_delta_json with its logprobs, the finish chunk,
 * usage when asked, [DONE]. */
static void test_chat_table(void **st) {
    (void)st;
    ks_fmt_env env = {0};
    ks_api_request rq;
    ks_api_error e;
    void *s = NULL;
    assert_int_equal(ks__fmt_chat.parse(&env,
                                        J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                                          "\"stream_options\":{\"include_usage\":true},\"logprobs\":true}"),
                                        &rq, &s, &e),
                     0);
    ks_api_request_free(&rq);
    ks_fmt_gen g = {.id = "chatcmpl-t", .created = 1, .model = "m", .n_choices = 1};
    ks_reply *rp = ks__reply_create(&ks__fmt_chat, s, &g, NULL, false);
    assert_non_null(rp);
    ks_buf out = {0};
    ks_req_result r = {.finish = KS_FINISH_STOP, .n_prompt = 4, .n_generated = 1};
    ks_reply_end end = {.r = &r, .stop_index = -1};
    assert_int_equal(ks__reply_start(rp, &out), 0);
    assert_int_equal(ks__reply_choice(rp, 0, "hi", 2, J("[{\"token\":\"hi\",\"logprob\":-0.5,\"bytes\":[104,105]}]"),
                                      &end, &out),
                     0);
    assert_int_equal(ks__reply_done(rp, &r, &out), 0);
    const char *p = out.s;
    json_t *ev[8];
    int n = 0;
    while (p && *p && n < 8) {
        assert_memory_equal(p, "data: ", 6);
        const char *end_ev = strstr(p, "\n\n");
        assert_non_null(end_ev);
        if (!strncmp(p + 6, "[DONE]", 6)) {
            ev[n++] = NULL;
        } else {
            json_error_t je;
            ev[n] = json_loadb(p + 6, (size_t)(end_ev - p - 6), 0, &je);
            assert_non_null(ev[n]);
            n++;
        }
        p = end_ev + 2;
    }
    assert_int_equal(n, 5); /* role, text, finish, usage, [DONE] */
    assert_null(ev[4]);
    json_t *c1 = json_array_get(json_object_get(ev[1], "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c1, "delta"), "content")), "hi");
    json_t *lpc = json_object_get(json_object_get(c1, "logprobs"), "content");
    assert_int_equal(json_array_size(lpc), 1);
    json_t *c2 = json_array_get(json_object_get(ev[2], "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c2, "finish_reason")), "stop");
    assert_int_equal(json_array_size(json_object_get(ev[3], "choices")), 0);
    assert_non_null(json_object_get(ev[3], "usage"));
    for (int i = 0; i < 4; i++) json_decref(ev[i]);
    ks_buf_free(&out);
    ks__reply_free(rp);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_stream_order), T(test_stream_logprobs), T(test_stream_error),     T(test_stream_bad_text),
        T(test_whole),        T(test_output_plain),    T(test_output_tool_call), T(test_chat_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

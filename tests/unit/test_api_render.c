/* test_api_render.c — response JSON, SSE chunks and /metrics text (src/server/api.c, metrics.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "server/api.h"
#include "server/metrics.h"

static ks_req_result sample_result(void) {
    ks_req_result r;
    memset(&r, 0, sizeof r);
    r.id = 7;
    r.slot = 1;
    r.n_prompt = 120;
    r.n_cached = 100;
    r.n_generated = 10;
    r.prompt_ms = 40.0;
    r.gen_ms = 200.0;
    r.ttft_ms = 45.0;
    r.finish = KS_FINISH_LENGTH;
    snprintf(r.cache_mode, sizeof r.cache_mode, "prefix");
    snprintf(r.cache_reason, sizeof r.cache_reason, "diverged-at-token-100");
    return r;
}

static json_int_t iget(json_t *o, const char *path) {
    /* path: "a.b.c" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) cur = json_object_get(cur, tok);
    if (!json_is_integer(cur)) fail_msg("%s is not an integer", path);
    return json_integer_value(cur);
}

static double rget(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(json_object_get(o, a), b);
    if (!json_is_number(v)) fail_msg("%s.%s is not a number", a, b);
    return json_number_value(v);
}

static const char *sget(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) fail_msg("%s is not a string", key);
    return json_string_value(v);
}

/* -------------------------------------------------------------- response */
static void test_chat_response(void **state) {
    (void)state;
    ks_req_result r = sample_result();
    ks_api_gen g = {.kind = KS_API_CHAT, .id = "chatcmpl-abc", .created = 1700000000, .model = "tiny", .text = "hello \xc3\xa9", .finish = "length", .r = &r};
    json_t *o = ks_api_response_json(&g);
    assert_non_null(o);
    assert_string_equal(sget(o, "id"), "chatcmpl-abc");
    assert_string_equal(sget(o, "object"), "chat.completion");
    assert_int_equal(iget(o, "created"), 1700000000);
    assert_string_equal(sget(o, "model"), "tiny");
    json_t *choices = json_object_get(o, "choices");
    assert_int_equal(json_array_size(choices), 1);
    json_t *c0 = json_array_get(choices, 0);
    assert_int_equal(iget(c0, "index"), 0);
    assert_string_equal(sget(c0, "finish_reason"), "length");
    json_t *msg = json_object_get(c0, "message");
    assert_string_equal(sget(msg, "role"), "assistant");
    assert_string_equal(sget(msg, "content"), "hello \xc3\xa9");
    /* usage */
    assert_int_equal(iget(o, "usage.prompt_tokens"), 120);
    assert_int_equal(iget(o, "usage.completion_tokens"), 10);
    assert_int_equal(iget(o, "usage.total_tokens"), 130);
    assert_int_equal(iget(o, "usage.prompt_tokens_details.cached_tokens"), 100);
    /* timings, as llama-server */
    assert_int_equal(iget(o, "timings.cache_n"), 100);
    assert_int_equal(iget(o, "timings.prompt_n"), 20);
    assert_true(rget(o, "timings", "prompt_ms") == 40.0);
    assert_true(rget(o, "timings", "prompt_per_token_ms") == 2.0);
    assert_true(rget(o, "timings", "prompt_per_second") == 500.0);
    assert_int_equal(iget(o, "timings.predicted_n"), 10);
    assert_true(rget(o, "timings", "predicted_ms") == 200.0);
    assert_true(rget(o, "timings", "predicted_per_token_ms") == 20.0);
    assert_true(rget(o, "timings", "predicted_per_second") == 50.0);
    /* cache */
    json_t *cache = json_object_get(o, "cache");
    assert_string_equal(sget(cache, "mode"), "prefix");
    assert_string_equal(sget(cache, "reason"), "diverged-at-token-100");
    assert_int_equal(iget(cache, "cached_tokens"), 100);
    assert_int_equal(iget(cache, "slot"), 1);
    assert_null(json_object_get(cache, "tier")); /* no restore */
    assert_null(json_object_get(cache, "restore_ms"));
    json_decref(o);

    /* A state restored from the store names its tier and the restore time. */
    snprintf(r.cache_mode, sizeof r.cache_mode, "store");
    snprintf(r.cache_tier, sizeof r.cache_tier, "disk");
    r.restore_ms = 3.5;
    cache = ks_api_cache_json(&r);
    assert_string_equal(sget(cache, "mode"), "store");
    assert_string_equal(sget(cache, "tier"), "disk");
    assert_true(json_real_value(json_object_get(cache, "restore_ms")) == 3.5);
    json_decref(cache);
}

static void test_completion_response(void **state) {
    (void)state;
    ks_req_result r = sample_result();
    r.cache_reason[0] = '\0';
    r.finish = KS_FINISH_STOP;
    ks_api_gen g = {.kind = KS_API_COMPLETION, .id = "cmpl-x", .created = 1, .model = "m", .text = " there", .finish = "stop", .r = &r};
    json_t *o = ks_api_response_json(&g);
    assert_string_equal(sget(o, "object"), "text_completion");
    json_t *c0 = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(sget(c0, "text"), " there");
    assert_string_equal(sget(c0, "finish_reason"), "stop");
    assert_true(json_is_null(json_object_get(c0, "logprobs")));
    /* no reason key when everything reusable was reused */
    assert_null(json_object_get(json_object_get(o, "cache"), "reason"));
    json_decref(o);
}

/* Zero durations and zero counts never produce inf/nan (jansson would refuse them). */
static void test_timings_zero(void **state) {
    (void)state;
    ks_req_result r;
    memset(&r, 0, sizeof r);
    r.n_prompt = 5;
    r.n_cached = 5;
    json_t *t = ks_api_timings_json(&r);
    assert_non_null(t);
    assert_int_equal(iget(t, "prompt_n"), 0);
    assert_true(json_real_value(json_object_get(t, "prompt_per_second")) == 0.0);
    assert_true(json_real_value(json_object_get(t, "predicted_per_token_ms")) == 0.0);
    json_decref(t);
    json_t *c = ks_api_cache_json(&r);
    assert_string_equal(sget(c, "mode"), "none"); /* empty mode from the scheduler */
    json_decref(c);
}

static void test_finish_reason(void **state) {
    (void)state;
    ks_req_result r;
    memset(&r, 0, sizeof r);
    r.finish = KS_FINISH_STOP;
    assert_string_equal(ks_api_finish_reason(&r, false), "stop");
    r.finish = KS_FINISH_LENGTH;
    assert_string_equal(ks_api_finish_reason(&r, false), "length");
    assert_string_equal(ks_api_finish_reason(&r, true), "stop");
    r.finish = KS_FINISH_CANCEL;
    assert_null(ks_api_finish_reason(&r, false));
    r.finish = KS_FINISH_ERROR;
    assert_null(ks_api_finish_reason(&r, false));
}

static void test_ids(void **state) {
    (void)state;
    char a[64], b[64];
    ks_api_make_id(a, sizeof a, "chatcmpl-");
    ks_api_make_id(b, sizeof b, "chatcmpl-");
    assert_int_equal(strlen(a), strlen("chatcmpl-") + 32);
    assert_memory_equal(a, "chatcmpl-", 9);
    assert_string_not_equal(a, b);
    for (const char *p = a + 9; *p; p++) assert_non_null(strchr("0123456789abcdef", *p));
}

/* ------------------------------------------------------------------ SSE */
/* Splits an SSE buffer into its events; each must be "data: X\n\n". */
static int sse_events(const char *s, char ev[][2048], int max) {
    int n = 0;
    while (*s) {
        if (strncmp(s, "data: ", 6)) fail_msg("event does not start with 'data: ': %.40s", s);
        const char *end = strstr(s, "\n\n");
        if (!end) fail_msg("event not terminated by a blank line: %.40s", s);
        if (n >= max) fail_msg("too many events");
        size_t len = (size_t)(end - s - 6);
        assert_true(len < 2048);
        memcpy(ev[n], s + 6, len);
        ev[n][len] = '\0';
        if (strchr(ev[n], '\n')) fail_msg("an event's data spans lines: %s", ev[n]);
        n++;
        s = end + 2;
    }
    return n;
}

static void test_sse_chat(void **state) {
    (void)state;
    ks_req_result r = sample_result();
    ks_api_gen g = {.kind = KS_API_CHAT, .id = "chatcmpl-1", .created = 5, .model = "tiny", .text = NULL, .finish = "length", .r = &r};
    ks_buf b = {0};
    json_t *o;
    o = ks_api_chunk_json(&g, KS_API_CHUNK_ROLE);
    assert_int_equal(ks_api_sse(&b, o), 0);
    json_decref(o);
    /* Text with a newline and a quote: JSON escapes keep the event on one line. */
    o = ks_api_chunk_delta_json(&g, json_pack("{s:s%}", "content", "a\n\"b\"xyz", (size_t)5), NULL, NULL);
    assert_int_equal(ks_api_sse(&b, o), 0);
    json_decref(o);
    o = ks_api_chunk_json(&g, KS_API_CHUNK_FINISH);
    assert_int_equal(ks_api_sse(&b, o), 0);
    json_decref(o);
    o = ks_api_chunk_json(&g, KS_API_CHUNK_USAGE);
    assert_int_equal(ks_api_sse(&b, o), 0);
    json_decref(o);
    assert_int_equal(ks_api_sse_done(&b), 0);

    char ev[8][2048];
    int n = sse_events(b.s, ev, 8);
    assert_int_equal(n, 5);
    assert_string_equal(ev[4], "[DONE]");
    json_t *c[4];
    for (int i = 0; i < 4; i++) {
        json_error_t je;
        c[i] = json_loads(ev[i], 0, &je);
        if (!c[i]) fail_msg("event %d is not JSON: %s", i, je.text);
        assert_string_equal(sget(c[i], "object"), "chat.completion.chunk");
        assert_string_equal(sget(c[i], "id"), "chatcmpl-1");
        assert_int_equal(iget(c[i], "created"), 5);
    }
    json_t *d0 = json_object_get(json_array_get(json_object_get(c[0], "choices"), 0), "delta");
    assert_string_equal(sget(d0, "role"), "assistant");
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(c[0], "choices"), 0), "finish_reason")));
    json_t *ch1 = json_array_get(json_object_get(c[1], "choices"), 0);
    json_t *d1 = json_object_get(ch1, "delta");
    assert_string_equal(sget(d1, "content"), "a\n\"b\"");
    assert_null(json_object_get(d1, "role"));
    assert_true(json_is_null(json_object_get(ch1, "logprobs")) && json_is_null(json_object_get(ch1, "finish_reason")));
    json_t *ch2 = json_array_get(json_object_get(c[2], "choices"), 0);
    assert_string_equal(sget(ch2, "finish_reason"), "length");
    assert_int_equal(json_object_size(json_object_get(ch2, "delta")), 0);
    assert_non_null(json_object_get(c[2], "timings"));
    assert_null(json_object_get(c[2], "usage"));
    /* The usage chunk: no choices, usage + timings + cache. */
    assert_int_equal(json_array_size(json_object_get(c[3], "choices")), 0);
    assert_int_equal(iget(c[3], "usage.prompt_tokens_details.cached_tokens"), 100);
    assert_int_equal(iget(c[3], "timings.cache_n"), 100);
    assert_string_equal(sget(json_object_get(c[3], "cache"), "mode"), "prefix");
    for (int i = 0; i < 4; i++) json_decref(c[i]);
    ks_buf_free(&b);
}

static void test_sse_completion(void **state) {
    (void)state;
    ks_req_result r = sample_result();
    ks_api_gen g = {.kind = KS_API_COMPLETION, .id = "cmpl-1", .created = 5, .model = "tiny", .text = NULL, .finish = "stop", .r = &r};
    /* The delta's content is the completion's text. */
    json_t *o = ks_api_chunk_delta_json(&g, json_pack("{s:s}", "content", " word"), NULL, NULL);
    assert_string_equal(sget(o, "object"), "text_completion");
    json_t *c0 = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(sget(c0, "text"), " word");
    assert_true(json_is_null(json_object_get(c0, "finish_reason")));
    assert_null(json_object_get(c0, "delta"));
    json_decref(o);
    /* No content (a chunk for logprobs only): an empty text, the logprobs object as given. */
    o = ks_api_chunk_delta_json(&g, json_object(), json_pack("{s:[]}", "tokens"), NULL);
    c0 = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(sget(c0, "text"), "");
    assert_true(json_is_array(json_object_get(json_object_get(c0, "logprobs"), "tokens")));
    json_decref(o);
    o = ks_api_chunk_json(&g, KS_API_CHUNK_FINISH);
    c0 = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(sget(c0, "text"), "");
    assert_string_equal(sget(c0, "finish_reason"), "stop");
    json_decref(o);
    /* A delta that is not an object cannot be a chunk: NULL (and the logprobs are freed). */
    assert_null(ks_api_chunk_delta_json(&g, json_string("x"), json_object(), NULL));
    ks_buf b = {0};
    assert_int_equal(ks_api_sse(&b, NULL), KS_EINVAL);
    ks_buf_free(&b);
}

/* ------------------------------------------------------------- metrics */
/* Checks the exposition format line by line: comments are HELP/TYPE with a
 * known type, every family has HELP then TYPE before its samples, and every
 * sample is `name{labels} value` with a parseable value. Returns the value of
 * `want` (a sample as written before the space), or -1 when absent. */
static double check_prom(const char *text, const char *want) {
    double found = -1;
    char family[128] = "";
    char *copy = strdup(text);
    assert_non_null(copy);
    int lineno = 0;
    for (char *save, *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char name[128], rest[256];
        if (!strncmp(line, "# HELP ", 7)) {
            if (sscanf(line + 7, "%127s %255[^\n]", name, rest) != 2) fail_msg("line %d: bad HELP: %s", lineno, line);
            snprintf(family, sizeof family, "%s", name);
            continue;
        }
        if (!strncmp(line, "# TYPE ", 7)) {
            char type[32];
            if (sscanf(line + 7, "%127s %31s", name, type) != 2) fail_msg("line %d: bad TYPE: %s", lineno, line);
            if (strcmp(name, family)) fail_msg("line %d: TYPE %s without its HELP", lineno, name);
            if (strcmp(type, "counter") && strcmp(type, "gauge")) fail_msg("line %d: type %s", lineno, type);
            continue;
        }
        if (line[0] == '#') fail_msg("line %d: unknown comment %s", lineno, line);
        const char *sp = strrchr(line, ' ');
        if (!sp) fail_msg("line %d: no value: %s", lineno, line);
        size_t nlen = strcspn(line, "{ ");
        if (nlen != strlen(family) || strncmp(line, family, nlen))
            fail_msg("line %d: sample of %.*s outside its family %s", lineno, (int)nlen, line, family);
        for (size_t i = 0; i < nlen; i++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:", line[i]))
                fail_msg("line %d: bad metric name", lineno);
        if (line[nlen] == '{' && line[sp - line - 1] != '}') fail_msg("line %d: unterminated labels", lineno);
        char *end;
        double v = strtod(sp + 1, &end);
        if (*end && strcmp(sp + 1, "NaN") && strcmp(sp + 1, "+Inf") && strcmp(sp + 1, "-Inf"))
            fail_msg("line %d: bad value '%s'", lineno, sp + 1);
        if (want && (size_t)(sp - line) == strlen(want) && !strncmp(line, want, strlen(want))) found = v;
    }
    free(copy);
    return found;
}

static void test_prom_sched(void **state) {
    (void)state;
    ks_sched_stats st;
    memset(&st, 0, sizeof st);
    st.requests_total = 12;
    st.requests_rejected = 2;
    st.prompt_tokens_total = 1000;
    st.prompt_tokens_cached_total = 750;
    st.tokens_predicted_total = 300;
    st.prompt_seconds_total = 1.5;
    st.predicted_seconds_total = 3.25;
    st.slots_busy = 1;
    st.n_slots = 4;
    st.queue_depth = 3;
    ks_buf b = {0};
    ks_prom p = {&b, 0, NULL};
    ks_metrics_sched(&p, &st);
    assert_int_equal(p.rc, 0);
    assert_true(check_prom(b.s, "kvstash_requests_total") == 12);
    assert_true(check_prom(b.s, "kvstash_requests_rejected_total") == 2);
    assert_true(check_prom(b.s, "kvstash_prompt_tokens_total") == 1000);
    assert_true(check_prom(b.s, "kvstash_prompt_tokens_cached_total") == 750);
    assert_true(check_prom(b.s, "kvstash_prompt_tokens_prefilled_total") == 250);
    assert_true(check_prom(b.s, "kvstash_cache_hit_ratio") == 0.75);
    assert_true(check_prom(b.s, "kvstash_prompt_seconds_total") == 1.5);
    assert_true(check_prom(b.s, "kvstash_tokens_predicted_total") == 300);
    assert_true(check_prom(b.s, "kvstash_predicted_seconds_total") == 3.25);
    assert_true(check_prom(b.s, "kvstash_slots_busy") == 1);
    assert_true(check_prom(b.s, "kvstash_slots_total") == 4);
    assert_true(check_prom(b.s, "kvstash_queue_depth") == 3);
    assert_non_null(strstr(b.s, "# TYPE kvstash_cache_hit_ratio gauge\n"));
    assert_non_null(strstr(b.s, "# TYPE kvstash_requests_total counter\n"));
    ks_buf_free(&b);

    /* Before the first request the ratio is 0, not NaN. */
    memset(&st, 0, sizeof st);
    ks_prom q = {&b, 0, NULL};
    ks_metrics_sched(&q, &st);
    assert_true(check_prom(b.s, "kvstash_cache_hit_ratio") == 0);
    ks_buf_free(&b);
}

static void src_a(void *ud, ks_prom *p) {
    (void)ud;
    ks_prom_counter(p, "kvstash_a_total", "A.", 1);
}

static void src_b(void *ud, ks_prom *p) {
    int *n = ud;
    ks_prom_family(p, "kvstash_b", "gauge", "B by kind.");
    ks_prom_sample(p, "kvstash_b", "kind", "x\"y\\z\nw", *n);
    ks_prom_sample(p, "kvstash_b", "kind", "plain", 0.5);
    ks_prom_gauge(p, "kvstash_big", "Big.", 123456789012.0);
    ks_prom_gauge(p, "kvstash_nan", "NaN.", NAN);
}

static void test_prom_registry(void **state) {
    (void)state;
    ks_metrics *m = ks_metrics_create();
    assert_non_null(m);
    int n = 42;
    assert_int_equal(ks_metrics_add(m, src_a, NULL), 0);
    assert_int_equal(ks_metrics_add(m, src_b, &n), 0);
    ks_http_counters http;
    memset(&http, 0, sizeof http);
    ks_http_count(&http, 200);
    ks_http_count(&http, 404);
    ks_http_count(&http, 404);
    ks_http_count(&http, 503);
    ks_http_count(&http, 999); /* out of range: counted in the total only */
    assert_int_equal(ks_metrics_add(m, ks_metrics_http, &http), 0);
    ks_buf b = {0};
    assert_int_equal(ks_metrics_render(m, &b), 0);
    assert_true(check_prom(b.s, "kvstash_a_total") == 1);
    assert_true(check_prom(b.s, "kvstash_b{kind=\"x\\\"y\\\\z\\nw\"}") == 42);
    assert_true(check_prom(b.s, "kvstash_b{kind=\"plain\"}") == 0.5);
    assert_true(check_prom(b.s, "kvstash_big") == 123456789012.0);
    assert_non_null(strstr(b.s, "kvstash_big 123456789012\n"));
    assert_non_null(strstr(b.s, "kvstash_nan NaN\n"));
    assert_true(check_prom(b.s, "kvstash_http_requests_total") == 5);
    assert_true(check_prom(b.s, "kvstash_http_errors_total{code=\"404\"}") == 2);
    assert_true(check_prom(b.s, "kvstash_http_errors_total{code=\"503\"}") == 1);
    assert_true(check_prom(b.s, "kvstash_http_errors_total{code=\"200\"}") == -1);
    /* Sources render in the order added. */
    assert_true(strstr(b.s, "kvstash_a_total") < strstr(b.s, "kvstash_b"));
    ks_buf_free(&b);
    ks_metrics_free(m);
    ks_metrics_free(NULL);

    /* An empty registry renders an empty, valid body. */
    m = ks_metrics_create();
    assert_int_equal(ks_metrics_render(m, &b), 0);
    assert_non_null(b.s);
    assert_int_equal(b.len, 0);
    ks_buf_free(&b);
    ks_metrics_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_response), cmocka_unit_test(test_completion_response),
        cmocka_unit_test(test_timings_zero),  cmocka_unit_test(test_finish_reason),
        cmocka_unit_test(test_ids),           cmocka_unit_test(test_sse_chat),
        cmocka_unit_test(test_sse_completion), cmocka_unit_test(test_prom_sched),
        cmocka_unit_test(test_prom_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

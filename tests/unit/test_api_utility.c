/* test_api_utility.c — the JSON of llama-server's utility endpoints
 * (/tokenize, /detokenize, /props) in src/server/api.c. */
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

#define N_VOCAB 100

static void expect_error(const ks_api_error *e, const char *body, int status, const char *code, const char *param) {
    if (e->status != status || strcmp(e->code ? e->code : "null", code) || strcmp(e->param, param ? param : ""))
        fail_msg("body %s:\n  got  %d %s param '%s' (%s)\n  want %d %s param '%s'", body, e->status,
                 e->code ? e->code : "null", e->param, e->message, status, code, param ? param : "");
    assert_string_equal(e->type, "invalid_request_error");
    assert_true(strlen(e->message) > 0);
}

static void tok_bad(const char *body, const char *code, const char *param) {
    ks_api_tokenize t;
    ks_api_error e;
    memset(&e, 0, sizeof e);
    int rc = ks_api_parse_tokenize(body, strlen(body), N_VOCAB, &t, &e);
    ks_api_tokenize_free(&t);
    if (rc != KS_EINVAL) fail_msg("body %s: rc %d (%s), wanted KS_EINVAL", body, rc, ks_errname(rc));
    expect_error(&e, body, 400, code, param);
}

static void detok_bad(const char *body, const char *code, const char *param) {
    int32_t *ids = (int32_t *)1;
    int n = -1;
    ks_api_error e;
    memset(&e, 0, sizeof e);
    int rc = ks_api_parse_detokenize(body, strlen(body), N_VOCAB, &ids, &n, &e);
    if (rc != KS_EINVAL) fail_msg("body %s: rc %d (%s), wanted KS_EINVAL", body, rc, ks_errname(rc));
    assert_null(ids);
    assert_int_equal(n, 0);
    expect_error(&e, body, 400, code, param);
}

static void test_tokenize_defaults(void **state) {
    (void)state;
    const char *body = "{\"content\":\"hello world\"}";
    ks_api_tokenize t;
    ks_api_error e;
    assert_int_equal(ks_api_parse_tokenize(body, strlen(body), N_VOCAB, &t, &e), 0);
    /* llama-server's defaults: add_special false, parse_special true, with_pieces false. */
    assert_false(t.add_special);
    assert_true(t.parse_special);
    assert_false(t.with_pieces);
    assert_int_equal(t.n_parts, 1);
    assert_int_equal(t.parts[0].len, 11);
    assert_memory_equal(t.parts[0].text, "hello world", 11);
    ks_api_tokenize_free(&t);
    ks_api_tokenize_free(&t); /* idempotent */
    ks_api_tokenize_free(NULL);

    body = "{\"content\":\"\",\"add_special\":true,\"parse_special\":false,\"with_pieces\":true,\"model\":\"x\"}";
    assert_int_equal(ks_api_parse_tokenize(body, strlen(body), N_VOCAB, &t, &e), 0);
    assert_true(t.add_special);
    assert_false(t.parse_special);
    assert_true(t.with_pieces);
    assert_int_equal(t.n_parts, 1);
    assert_int_equal(t.parts[0].len, 0);
    ks_api_tokenize_free(&t);

    /* null counts as absent, as for the generation endpoints. */
    body = "{\"content\":\"a\",\"add_special\":null}";
    assert_int_equal(ks_api_parse_tokenize(body, strlen(body), N_VOCAB, &t, &e), 0);
    assert_false(t.add_special);
    ks_api_tokenize_free(&t);
}

static void test_tokenize_mixed(void **state) {
    (void)state;
    const char *body = "{\"content\":[5,\"ab\",0,\"\",99]}";
    ks_api_tokenize t;
    ks_api_error e;
    assert_int_equal(ks_api_parse_tokenize(body, strlen(body), N_VOCAB, &t, &e), 0);
    assert_int_equal(t.n_parts, 5);
    assert_null(t.parts[0].text);
    assert_int_equal(t.parts[0].tok, 5);
    assert_string_equal(t.parts[1].text, "ab");
    assert_int_equal(t.parts[1].len, 2);
    assert_int_equal(t.parts[2].tok, 0);
    assert_non_null(t.parts[3].text);
    assert_int_equal(t.parts[3].len, 0);
    assert_int_equal(t.parts[4].tok, 99);
    ks_api_tokenize_free(&t);

    body = "{\"content\":[]}";
    assert_int_equal(ks_api_parse_tokenize(body, strlen(body), N_VOCAB, &t, &e), 0);
    assert_int_equal(t.n_parts, 0);
    ks_api_tokenize_free(&t);
}

static void test_tokenize_bad(void **state) {
    (void)state;
    tok_bad("", "invalid_json", NULL);
    tok_bad("{\"content\":", "invalid_json", NULL);
    tok_bad("[\"content\"]", "invalid_type", NULL);
    tok_bad("{}", "missing_required_parameter", "content");
    tok_bad("{\"content\":null}", "missing_required_parameter", "content");
    tok_bad("{\"content\":42}", "invalid_type", "content");
    tok_bad("{\"content\":{\"a\":1}}", "invalid_type", "content");
    tok_bad("{\"content\":[\"a\",true]}", "invalid_type", "content[1]");
    tok_bad("{\"content\":[\"a\",1.5]}", "invalid_type", "content[1]");
    tok_bad("{\"content\":[\"a\",-1]}", "invalid_value", "content[1]");
    tok_bad("{\"content\":[100]}", "invalid_value", "content[0]");
    tok_bad("{\"content\":\"a\",\"add_special\":1}", "invalid_type", "add_special");
    tok_bad("{\"content\":\"a\",\"parse_special\":\"no\"}", "invalid_type", "parse_special");
    tok_bad("{\"content\":\"a\",\"with_pieces\":[]}", "invalid_type", "with_pieces");
}

static void test_detokenize(void **state) {
    (void)state;
    const char *body = "{\"tokens\":[0,7,99]}";
    int32_t *ids;
    int n;
    ks_api_error e;
    assert_int_equal(ks_api_parse_detokenize(body, strlen(body), N_VOCAB, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 7);
    assert_int_equal(ids[2], 99);
    free(ids);

    body = "{\"tokens\":[]}";
    assert_int_equal(ks_api_parse_detokenize(body, strlen(body), N_VOCAB, &ids, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_null(ids);
}

static void test_detokenize_bad(void **state) {
    (void)state;
    detok_bad("nope", "invalid_json", NULL);
    detok_bad("\"tokens\"", "invalid_type", NULL);
    detok_bad("{}", "missing_required_parameter", "tokens");
    detok_bad("{\"tokens\":null}", "missing_required_parameter", "tokens");
    detok_bad("{\"tokens\":\"1 2 3\"}", "invalid_type", "tokens");
    detok_bad("{\"tokens\":[1,\"2\"]}", "invalid_type", "tokens[1]");
    detok_bad("{\"tokens\":[1,2,3.0]}", "invalid_type", "tokens[2]");
    /* Ids outside the vocabulary name the element. */
    detok_bad("{\"tokens\":[1,100]}", "invalid_value", "tokens[1]");
    detok_bad("{\"tokens\":[-1]}", "invalid_value", "tokens[0]");
    detok_bad("{\"tokens\":[1,2,99999999999]}", "invalid_value", "tokens[2]");
}

static char *dump(json_t *o) {
    assert_non_null(o);
    char *s = ks_api_dump(o);
    json_decref(o);
    assert_non_null(s);
    return s;
}

static void test_token_piece(void **state) {
    (void)state;
    char *s = dump(ks_api_token_piece_json(12, " world", 6));
    assert_string_equal(s, "{\"id\":12,\"piece\":\" world\"}");
    free(s);
    /* The first byte of a 3-byte character alone is not UTF-8: byte values. */
    s = dump(ks_api_token_piece_json(7, "\xe3\x81", 2));
    assert_string_equal(s, "{\"id\":7,\"piece\":[227,129]}");
    free(s);
    s = dump(ks_api_token_piece_json(8, "\xe3\x81\x82", 3));
    assert_string_equal(s, "{\"id\":8,\"piece\":\"\xe3\x81\x82\"}");
    free(s);
    s = dump(ks_api_token_piece_json(0, "", 0));
    assert_string_equal(s, "{\"id\":0,\"piece\":\"\"}");
    free(s);
}

static void test_props(void **state) {
    (void)state;
    ks_api_props p = {.n_ctx = 512, .total_slots = 2, .default_max_tokens = 2048, .model_alias = "tiny",
                      .model_path = "/m/tiny.gguf", .chat_template = "{{ x }}", .bos_token = "<s>",
                      .eos_token = "<|im_end|>", .llama_version = "v0.5.0", .cache_prompt = true,
                      .exact = false, .store = "ram-only"};
    json_t *o = ks_api_props_json(&p);
    assert_non_null(o);
    json_t *dgs = json_object_get(o, "default_generation_settings");
    assert_int_equal(json_integer_value(json_object_get(dgs, "n_ctx")), 512);
    json_t *params = json_object_get(dgs, "params");
    /* The server's sampling defaults (ks_api_sample_defaults), as written. */
    assert_true(json_real_value(json_object_get(params, "temperature")) == 0.8);
    assert_true(json_real_value(json_object_get(params, "top_p")) == 0.95);
    assert_true(json_real_value(json_object_get(params, "min_p")) == 0.05);
    assert_int_equal(json_integer_value(json_object_get(params, "top_k")), 40);
    assert_int_equal(json_integer_value(json_object_get(params, "seed")), 4294967295LL);
    assert_int_equal(json_integer_value(json_object_get(params, "n_predict")), 2048);
    assert_int_equal(json_integer_value(json_object_get(params, "max_tokens")), 2048);
    assert_int_equal(json_integer_value(json_object_get(o, "total_slots")), 2);
    assert_string_equal(json_string_value(json_object_get(o, "model_path")), "/m/tiny.gguf");
    assert_string_equal(json_string_value(json_object_get(o, "model_alias")), "tiny");
    assert_string_equal(json_string_value(json_object_get(o, "chat_template")), "{{ x }}");
    assert_string_equal(json_string_value(json_object_get(o, "bos_token")), "<s>");
    assert_string_equal(json_string_value(json_object_get(o, "eos_token")), "<|im_end|>");
    char want[96];
    snprintf(want, sizeof want, "kvstash-%s llama.cpp-v0.5.0", ks_version());
    assert_string_equal(json_string_value(json_object_get(o, "build_info")), want);
    json_t *mod = json_object_get(o, "modalities");
    assert_true(json_is_false(json_object_get(mod, "vision")));
    assert_true(json_is_false(json_object_get(mod, "audio")));
    json_t *ks = json_object_get(o, "kvstash");
    assert_string_equal(json_string_value(json_object_get(ks, "version")), ks_version());
    assert_true(json_is_true(json_object_get(ks, "cache_prompt")));
    assert_true(json_is_false(json_object_get(ks, "exact")));
    assert_string_equal(json_string_value(json_object_get(ks, "store")), "ram-only");
    json_decref(o);

    /* No template, no BOS, a token text that is not UTF-8, store unknown. */
    ks_api_props q = {.n_ctx = 1, .total_slots = 1, .bos_token = "\xff", .exact = true};
    o = ks_api_props_json(&q);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "chat_template")), "");
    assert_string_equal(json_string_value(json_object_get(o, "bos_token")), "");
    assert_string_equal(json_string_value(json_object_get(o, "eos_token")), "");
    assert_null(json_object_get(json_object_get(o, "kvstash"), "store"));
    json_decref(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_defaults), cmocka_unit_test(test_tokenize_mixed),
        cmocka_unit_test(test_tokenize_bad),      cmocka_unit_test(test_detokenize),
        cmocka_unit_test(test_detokenize_bad),    cmocka_unit_test(test_token_piece),
        cmocka_unit_test(test_props),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

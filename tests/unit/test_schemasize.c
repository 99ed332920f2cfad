/* test_schemasize.c — JSON schemas sized before their grammar is built
 * (issue 28; src/server/schemasize.c): each limit refuses one past it and
 * takes one at it, names where; totals add up over a request's schemas; a
 * pattern's nested quantifiers multiply (sequential ones do not); the
 * schemas of real agents' tools pass. */
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
#include "server/schemasize.h"

static int check(json_t *s, char *why, size_t n) {
    ks_schema_size sz = {0};
    int rc = ks_schema_size_add(&sz, s, why, n);
    json_decref(s);
    return rc;
}

/* An object of n string properties, the first req of them required. */
static json_t *object(int n, int req) {
    json_t *p = json_object(), *r = json_array();
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof k, "p%d", i);
        json_object_set_new(p, k, json_pack("{s:s}", "type", "string"));
        if (i < req) json_array_append_new(r, json_string(k));
    }
    return json_pack("{s:s, s:o, s:o}", "type", "object", "properties", p, "required", r);
}

static json_t *enum_of(int n) {
    json_t *e = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(e, json_integer(i));
    return json_pack("{s:o}", "enum", e);
}

static void test_limits(void **state) {
    (void)state;
    char why[300];
    assert_int_equal(check(object(KS_SCHEMA_MAX_OPTIONAL, 0), why, sizeof why), 0);
    assert_int_equal(check(object(KS_SCHEMA_MAX_OPTIONAL + 1, 0), why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "optional properties"));
    assert_int_equal(check(object(KS_SCHEMA_MAX_OPTIONAL + 100, 100), why, sizeof why), 0);
    assert_int_equal(check(object(KS_SCHEMA_MAX_PROPERTIES, KS_SCHEMA_MAX_PROPERTIES), why, sizeof why), 0);
    assert_int_equal(check(object(KS_SCHEMA_MAX_PROPERTIES + 1, KS_SCHEMA_MAX_PROPERTIES + 1), why, sizeof why),
                     KS_EINVAL);
    assert_int_equal(check(enum_of(KS_SCHEMA_MAX_ALTERNATIVES), why, sizeof why), 0);
    assert_int_equal(check(enum_of(KS_SCHEMA_MAX_ALTERNATIVES + 1), why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "enum values"));
    /* anyOf branches count with enum values, nested, and the path says where */
    json_t *any = json_array();
    for (int i = 0; i < KS_SCHEMA_MAX_ALTERNATIVES; i++) json_array_append_new(any, json_pack("{s:i}", "const", i));
    json_t *s = json_pack("{s:s, s:{s:{s:o, s:[i]}}}", "type", "object", "properties", "x", "anyOf", any, "enum", 1);
    assert_int_equal(check(s, why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "'/properties/x'"));
    /* strings: one const of the limit's length passes, one byte more does not */
    char *big = malloc(KS_SCHEMA_MAX_STRING + 2);
    memset(big, 'a', KS_SCHEMA_MAX_STRING + 1);
    big[KS_SCHEMA_MAX_STRING + 1] = '\0';
    assert_int_equal(check(json_pack("{s:s}", "const", big + 1), why, sizeof why), 0);
    assert_int_equal(check(json_pack("{s:s}", "const", big), why, sizeof why), KS_EINVAL);
    free(big);
    /* depth */
    json_t *d = json_pack("{s:s}", "type", "string");
    for (int i = 1; i < KS_SCHEMA_MAX_DEPTH; i++) d = json_pack("{s:s, s:o}", "type", "array", "items", d);
    assert_int_equal(check(json_deep_copy(d), why, sizeof why), 0);
    assert_int_equal(check(json_pack("{s:s, s:o}", "type", "array", "items", d), why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "nests"));
    /* not a schema: nothing */
    assert_int_equal(check(json_string("x"), why, sizeof why), 0);
    assert_int_equal(check(NULL, why, sizeof why), 0);
}

static void test_totals(void **state) {
    (void)state;
    char why[300];
    ks_schema_size sz = {0};
    json_t *a = enum_of(KS_SCHEMA_MAX_ALTERNATIVES / 2), *b = enum_of(KS_SCHEMA_MAX_ALTERNATIVES / 2 + 1);
    assert_int_equal(ks_schema_size_add(&sz, a, why, sizeof why), 0);
    assert_int_equal(ks_schema_size_add(&sz, b, why, sizeof why), KS_EINVAL);
    json_decref(a);
    json_decref(b);
}

static void test_pattern(void **state) {
    (void)state;
    assert_int_equal(ks_schema_pattern_repeat("^[a-z]+$"), 1);
    assert_int_equal(ks_schema_pattern_repeat("^a{0,100}$"), 100);
    assert_int_equal(ks_schema_pattern_repeat("^(a{0,100}){0,100}$"), 10000);
    assert_int_equal(ks_schema_pattern_repeat("^((a{0,1000}){0,1000})$"), 1000000);
    assert_int_equal(ks_schema_pattern_repeat("^a{1000}b{1000}c{1000}$"), 1000); /* in a row: no product */
    assert_int_equal(ks_schema_pattern_repeat("^a{5000}$"), 2000);              /* llama.cpp's cap */
    assert_int_equal(ks_schema_pattern_repeat("^a{3,}$"), 3);
    assert_int_equal(ks_schema_pattern_repeat("^\\d{3}-\\d{4}$"), 4);
    assert_int_equal(ks_schema_pattern_repeat("^[{(]{2}x\\{9}$"), 2); /* braces in a class, an escaped brace */
    assert_int_equal(ks_schema_pattern_repeat("(((a{10}"), 10);
    char why[300];
    assert_int_equal(check(json_pack("{s:s, s:s}", "type", "string", "pattern", "^(a{0,200}){0,200}$"), why, sizeof why),
                     KS_EINVAL);
    assert_non_null(strstr(why, "pattern"));
}

/* A coding agent's tool (a shape Claude Code and Codex send): passes. */
static void test_real(void **state) {
    (void)state;
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"file_path\":{\"type\":\"string\",\"description\":\"The absolute path\"},"
        "\"edits\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"old_string\":{\"type\":"
        "\"string\"},\"new_string\":{\"type\":\"string\"},\"replace_all\":{\"type\":\"boolean\",\"default\":false}},"
        "\"required\":[\"old_string\",\"new_string\"],\"additionalProperties\":false},\"minItems\":1},"
        "\"mode\":{\"enum\":[\"a\",\"b\",\"c\"]},\"ref\":{\"$ref\":\"#/$defs/x\"}},\"required\":[\"file_path\",\"edits\"],"
        "\"$defs\":{\"x\":{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^[0-9a-f]{40}$\"},{\"type\":\"null\"}]}},"
        "\"$schema\":\"http://json-schema.org/draft-07/schema#\"}";
    char why[300] = "";
    json_t *s = json_loads(schema, 0, NULL);
    assert_non_null(s);
    ks_schema_size sz = {0};
    assert_int_equal(ks_schema_size_add(&sz, s, why, sizeof why), 0);
    assert_int_equal(sz.properties, 7);
    assert_int_equal(sz.alternatives, 5);
    json_decref(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_totals),
        cmocka_unit_test(test_pattern),
        cmocka_unit_test(test_real),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

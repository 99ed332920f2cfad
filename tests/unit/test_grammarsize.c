/* test_grammarsize.c — raw GBNF grammars sized before llama.cpp parses them
 * (issue 42; src/server/grammarsize.c): the fan-out of llama.cpp's stacks
 * computed as its parser makes rules (alternatives, references, empty
 * alternatives and optional elements, groups, repetitions); each limit
 * refuses one past it and takes one within it; the grammars that crashed the
 * server or held it for a minute are refused; real grammars pass. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "server/grammarsize.h"

static int check(const char *g, size_t *fanout, char *why, size_t n) {
    return ks_grammar_size_check(g, strlen(g), fanout, why, n);
}

static size_t fanout_of(const char *g) {
    char why[256] = "";
    size_t f = 0;
    int rc = check(g, &f, why, sizeof why);
    if (rc) fprintf(stderr, "refused: %s\n", why);
    assert_int_equal(rc, 0);
    return f;
}

/* A buffer of text built with printf pieces. */
typedef struct buf {
    char *s;
    size_t n, cap;
} buf;

static void put(buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->s = realloc(b->s, b->cap);
        assert_non_null(b->s);
    }
    memcpy(b->s + b->n, tmp, (size_t)k + 1);
    b->n += (size_t)k;
}

/* root ::= "w0" | "w1" | ... (n alternatives). */
static char *alternatives(int n) {
    buf b = {0};
    put(&b, "root ::= ");
    for (int i = 0; i < n; i++) put(&b, "%s\"w%d\"", i ? " | " : "", i);
    return b.s;
}

/* root ::= A "z0" | A "z1" | ... (n), A ::= "q0" | ... (m): n * m stacks at the start. */
static char *product(int n, int m) {
    buf b = {0};
    put(&b, "root ::= ");
    for (int i = 0; i < n; i++) put(&b, "%sA \"z%d\"", i ? " | " : "", i);
    put(&b, "\nA ::= ");
    for (int i = 0; i < m; i++) put(&b, "%s\"q%d\"", i ? " | " : "", i);
    put(&b, "\n");
    return b.s;
}

static void test_fanout_counts(void **st) {
    (void)st;
    assert_int_equal(fanout_of("root ::= \"a\""), 1);
    assert_int_equal(fanout_of("root ::= x\nx ::= \"a\" | \"b\" | \"c\""), 3);
    /* An empty alternative counts what follows: x? x? x? "y" can start 4 ways. */
    assert_int_equal(fanout_of("root ::= a? a? a? \"y\"\na ::= \"a\""), 4);
    /* Groups and repetitions are rules as llama.cpp makes them. */
    assert_int_equal(fanout_of("root ::= (\"a\" | \"b\" | (\"c\" | \"d\"))* \"e\""), 5);
    assert_int_equal(fanout_of("root ::= [a-z]+ \"!\""), 2);
    assert_int_equal(fanout_of("root ::= (x | y){2,5} \"!\"\nx ::= \"1\" | \"2\"\ny ::= \"3\""), 4);
    /* Comments, newlines inside groups, escapes in literals. */
    assert_int_equal(fanout_of("# a comment\nroot ::= (\n  \"a\\\"(\" # inside\n  | [\\]|(] )\n"), 2);
    /* Left recursion is llama.cpp's to refuse; it passes here. */
    assert_int_equal(fanout_of("root ::= root \"a\" | \"b\""), 2);
    /* What does not parse passes too: llama.cpp names the reason. */
    char why[128];
    assert_int_equal(check("root ::= \"unterminated", NULL, why, sizeof why), 0);
    assert_int_equal(check("::= \"x\"", NULL, why, sizeof why), 0);
}

/* llama.cpp's JSON grammar (grammars/json.gbnf) passes with a small fan-out. */
static void test_real_grammar(void **st) {
    (void)st;
    const char *json =
        "root   ::= object\n"
        "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::=\n"
        "  \"{\" ws (\n"
        "            string \":\" ws value\n"
        "    (\",\" ws string \":\" ws value)*\n"
        "  )? \"}\" ws\n"
        "array  ::=\n"
        "  \"[\" ws (\n"
        "            value\n"
        "    (\",\" ws value)*\n"
        "  )? \"]\" ws\n"
        "string ::=\n"
        "  \"\\\"\" (\n"
        "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
        "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
        "  )* \"\\\"\" ws\n"
        "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";
    size_t f = fanout_of(json);
    assert_true(f >= 2 && f < 64);
}

static void test_limits(void **st) {
    (void)st;
    char why[256];
    size_t f;
    char *g = alternatives(KS_GRAMMAR_MAX_FANOUT);
    assert_int_equal(check(g, &f, why, sizeof why), 0);
    assert_int_equal(f, KS_GRAMMAR_MAX_FANOUT);
    free(g);
    /* 20,000 alternatives took 4.1 s; the probe's 60,000 (650 KB) is past the bytes too. */
    g = alternatives(KS_GRAMMAR_MAX_FANOUT + 1);
    assert_int_equal(check(g, &f, why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "'root'"));
    assert_non_null(strstr(why, "4097 ways"));
    free(g);
    g = alternatives(60000);
    assert_int_equal(check(g, NULL, why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "bytes"));
    free(g);
    /* 300 x 300 from 5.8 KB held the inference thread 70 s. */
    g = product(300, 300);
    assert_int_equal(check(g, &f, why, sizeof why), KS_EINVAL);
    assert_int_equal(f, 90000);
    free(g);
    g = product(60, 60);
    assert_int_equal(check(g, &f, why, sizeof why), 0);
    assert_int_equal(f, 3600);
    free(g);
    /* Token terminals (<[id]>, <tok>, !<...>) are read; and a grammar this
     * reader cannot follow to its end is checked as far as it was read (a
     * review found both let the 300 x 300 grammar through). */
    for (int k = 0; k < 3; k++) {
        buf t = {0};
        char *p = product(300, 300);
        put(&t, "%s", "");
        size_t n = strlen(p);
        t.s = realloc(t.s, n + 64);
        memcpy(t.s, p, n + 1);
        strcat(t.s, k == 0 ? "z ::= <[0]> !<tok>\n" : k == 1 ? "z ::= <think>\n" : "z ::= @@@\n");
        assert_int_equal(check(t.s, &f, why, sizeof why), KS_EINVAL);
        assert_int_equal(f, 90000);
        free(p);
        free(t.s);
    }
    assert_int_equal(fanout_of("root ::= <[12]> x\nx ::= \"a\" | <b> | !<c>"), 3);
    /* 60,000 nested groups crashed the server (the parser's recursion). */
    buf b = {0};
    put(&b, "root ::= ");
    for (int i = 0; i < 60000; i++) put(&b, "(");
    put(&b, "\"a\"");
    for (int i = 0; i < 60000; i++) put(&b, ")");
    assert_int_equal(check(b.s, NULL, why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "nests groups deeper"));
    b.n = 0;
    put(&b, "root ::= ");
    for (int i = 0; i < KS_GRAMMAR_MAX_DEPTH; i++) put(&b, "(");
    put(&b, "\"a\"");
    for (int i = 0; i < KS_GRAMMAR_MAX_DEPTH; i++) put(&b, ")");
    assert_int_equal(check(b.s, NULL, why, sizeof why), 0);
    /* A chain of 5,000 first references (r0 ::= r1, r1 ::= r2, ...). */
    b.n = 0;
    for (int i = 0; i < 5000; i++) put(&b, "r%d ::= r%d\n", i, i + 1);
    put(&b, "r5000 ::= \"x\"\n");
    assert_int_equal(check(b.s, NULL, why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "chains rule references"));
    free(b.s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fanout_counts),
        cmocka_unit_test(test_real_grammar),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Unit tests for base/textstream: UTF-8 repair and stop strings across pieces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/textstream.h"

static void feed_all(ks_textstream *ts, const char *const *pieces, int n, ks_buf *out) {
    for (int i = 0; i < n; i++)
        if (ks_textstream_feed(ts, pieces[i], strlen(pieces[i]), out) == 1) break;
    ks_textstream_flush(ts, out);
}

static void test_plain(void **st) {
    (void)st;
    ks_textstream *ts = ks_textstream_create(NULL, 0);
    ks_buf out = {0};
    const char *p[] = {"Hello", ", ", "world"};
    feed_all(ts, p, 3, &out);
    assert_string_equal(out.s, "Hello, world");
    assert_string_equal(ks_textstream_text(ts, NULL), "Hello, world");
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

static void test_split_utf8(void **st) {
    (void)st;
    ks_textstream *ts = ks_textstream_create(NULL, 0);
    ks_buf out = {0};
    /* "é" = C3 A9 split across two pieces: nothing emitted after the first. */
    assert_int_equal(ks_textstream_feed(ts, "a\xC3", 2, &out), 0);
    assert_string_equal(out.s, "a");
    assert_int_equal(ks_textstream_feed(ts, "\xA9!", 2, &out), 0);
    assert_string_equal(out.s, "a\xC3\xA9!");
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

static void test_invalid_bytes_replaced(void **st) {
    (void)st;
    ks_textstream *ts = ks_textstream_create(NULL, 0);
    ks_buf out = {0};
    ks_textstream_feed(ts, "x\xFFy", 3, &out);          /* invalid lead */
    ks_textstream_feed(ts, "\xC3(", 2, &out);            /* lead + bad continuation */
    ks_textstream_feed(ts, "\xE2\x82", 2, &out);         /* incomplete at the end */
    ks_textstream_flush(ts, &out);
    assert_string_equal(out.s, "x\xEF\xBF\xBDy\xEF\xBF\xBD(\xEF\xBF\xBD");
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

static void test_stop_across_pieces(void **st) {
    (void)st;
    const char *stops[] = {"END", "xyz"};
    ks_textstream *ts = ks_textstream_create(stops, 2);
    ks_buf out = {0};
    assert_int_equal(ks_textstream_feed(ts, "abc E", 5, &out), 0);
    assert_string_equal(out.s, "abc "); /* "E" held: it may start "END" */
    assert_int_equal(ks_textstream_feed(ts, "N", 1, &out), 0);
    assert_int_equal(ks_textstream_feed(ts, "Dmore", 5, &out), 1);
    assert_true(ks_textstream_stopped(ts));
    ks_textstream_flush(ts, &out);
    assert_string_equal(out.s, "abc ");
    assert_int_equal(ks_textstream_feed(ts, "zzz", 3, &out), 1);
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

/* Regression (found by tests/fuzz/fuzz_textstream): a stop string that is
 * not valid UTF-8 ("\xBF\xBDs", the tail of U+FFFD and an "s") matched, and
 * was held as a partial match, inside a character, so the text emitted
 * before it ended with a cut U+FFFD. Such a stop is now ignored. */
static void test_invalid_utf8_stop_ignored(void **st) {
    (void)st;
    const char *stops[] = {"\xBF\xBDs", "END"};
    ks_textstream *ts = ks_textstream_create(stops, 2);
    ks_buf out = {0};
    assert_int_equal(ks_textstream_feed(ts, "ok\xFF", 3, &out), 0); /* "ok" U+FFFD */
    assert_string_equal(out.s, "ok\xEF\xBF\xBD");
    assert_int_equal(ks_textstream_feed(ts, "s", 1, &out), 0);
    assert_false(ks_textstream_stopped(ts));
    assert_int_equal(ks_textstream_feed(ts, " END", 4, &out), 1);
    assert_int_equal(ks_textstream_stop_index(ts), 1);
    assert_string_equal(out.s, "ok\xEF\xBF\xBDs ");
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

/* ks_utf8_scrub keeps every valid character and drops the rest. */
static void test_utf8_scrub(void **st) {
    (void)st;
    char a[] = "caf\xc3\xa9 \xe2\x82"; /* a cut euro sign at the end */
    assert_int_equal(ks_utf8_scrub(a, strlen(a)), 6);
    assert_string_equal(a, "caf\xc3\xa9 ");
    char b[] = "x\xffy\xc0\xafz\xed\xa0\x80w\xf0\x9f\x98\x80"; /* invalid, overlong, surrogate, emoji */
    assert_int_equal(ks_utf8_scrub(b, strlen(b)), 8);
    assert_string_equal(b, "xyzw\xf0\x9f\x98\x80");
    char c[] = "";
    assert_int_equal(ks_utf8_scrub(c, 0), 0);
}

static void test_partial_stop_released(void **st) {
    (void)st;
    const char *stops[] = {"STOP"};
    ks_textstream *ts = ks_textstream_create(stops, 1);
    ks_buf out = {0};
    ks_textstream_feed(ts, "a ST", 4, &out);
    assert_string_equal(out.s, "a ");
    ks_textstream_feed(ts, "x", 1, &out); /* "STx" cannot be STOP any more */
    assert_string_equal(out.s, "a STx");
    ks_textstream_feed(ts, "STO", 3, &out);
    ks_textstream_flush(ts, &out); /* end of generation: partial match is text */
    assert_string_equal(out.s, "a STxSTO");
    assert_false(ks_textstream_stopped(ts));
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

static void test_stop_earliest_wins(void **st) {
    (void)st;
    const char *stops[] = {"cd", "b"};
    ks_textstream *ts = ks_textstream_create(stops, 2);
    ks_buf out = {0};
    assert_int_equal(ks_textstream_feed(ts, "abcd", 4, &out), 1);
    assert_string_equal(out.s, "a");
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

/* n_indent: the first line is never judged; a later line that starts with
 * fewer blanks ends the text before its first other character, whatever
 * piece it comes in; blank-only lines and deeper ones pass. */
static void test_indent(void **st) {
    (void)st;
    ks_textstream *ts = ks_textstream_create(NULL, 0);
    ks_textstream_set_indent(ts, 4);
    ks_buf out = {0};
    assert_int_equal(ks_textstream_feed(ts, "x = 1\n    y", strlen("x = 1\n    y"), &out), 0);
    assert_int_equal(ks_textstream_feed(ts, " = 2\n\n \t  z\n  ", strlen(" = 2\n\n \t  z\n  "), &out), 0);
    assert_int_equal(ks_textstream_feed(ts, "", strlen(""), &out), 0);
    assert_int_equal(ks_textstream_feed(ts, "\tw\n  ret", strlen("\tw\n  ret"), &out), 1);
    assert_true(ks_textstream_stopped(ts));
    assert_int_equal(ks_textstream_stop_index(ts), KS_TEXTSTREAM_STOP_INDENT);
    ks_textstream_flush(ts, &out);
    /* "  \tw" is 3 blanks: cut there, the blanks kept (llama-server's cut) */
    assert_string_equal(out.s, "x = 1\n    y = 2\n\n \t  z\n  \t");
    assert_string_equal(ks_textstream_text(ts, NULL), out.s);
    assert_int_equal(ks_textstream_feed(ts, "a", strlen("a"), &out), 1);
    ks_buf_free(&out);
    ks_textstream_free(ts);

    /* with a stop string held across pieces, the earlier of the two wins */
    const char *stops[] = {"STOP"};
    ts = ks_textstream_create(stops, 1);
    ks_textstream_set_indent(ts, 2);
    assert_int_equal(ks_textstream_feed(ts, "a\nb ST", strlen("a\nb ST"), &out), 1);
    assert_string_equal(out.s, "a\n");
    assert_int_equal(ks_textstream_stop_index(ts), KS_TEXTSTREAM_STOP_INDENT);
    ks_buf_free(&out);
    ks_textstream_free(ts);
    ts = ks_textstream_create(stops, 1);
    ks_textstream_set_indent(ts, 2);
    assert_int_equal(ks_textstream_feed(ts, "a\n  b ST", strlen("a\n  b ST"), &out), 0);
    assert_int_equal(ks_textstream_feed(ts, "OP\nc", strlen("OP\nc"), &out), 1);
    assert_string_equal(out.s, "a\n  b ");
    assert_int_equal(ks_textstream_stop_index(ts), 0);
    ks_buf_free(&out);
    ks_textstream_free(ts);

    /* the rule cutting held text at the end (flush) */
    ts = ks_textstream_create(stops, 1);
    ks_textstream_set_indent(ts, 2);
    assert_int_equal(ks_textstream_feed(ts, "a\nS", strlen("a\nS"), &out), 0);
    assert_string_equal(out.s, "a\n");
    assert_int_equal(ks_textstream_flush(ts, &out), 0);
    assert_string_equal(out.s, "a\n");
    assert_true(ks_textstream_stopped(ts));
    ks_buf_free(&out);
    ks_textstream_free(ts);

    /* off: nothing is cut */
    ts = ks_textstream_create(NULL, 0);
    ks_textstream_set_indent(ts, 0);
    assert_int_equal(ks_textstream_feed(ts, "a\nb\n", strlen("a\nb\n"), &out), 0);
    assert_string_equal(out.s, "a\nb\n");
    ks_buf_free(&out);
    ks_textstream_free(ts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_split_utf8),
        cmocka_unit_test(test_invalid_bytes_replaced),
        cmocka_unit_test(test_stop_across_pieces),
        cmocka_unit_test(test_partial_stop_released),
        cmocka_unit_test(test_invalid_utf8_stop_ignored),
        cmocka_unit_test(test_utf8_scrub),
        cmocka_unit_test(test_stop_earliest_wins),
        cmocka_unit_test(test_indent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_overflow.c — dropping old turns to fit the context (src/cache/overflow.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/overflow.h"

/* A fake renderer: each message costs its size + 2 framing tokens, and the
 * system message (when messages[0] is one) is always counted. */
typedef struct conv {
    const char *const *roles;
    const int *size;
    int n_calls;
    int last_first;
} conv;

static int count(void *ud, int first_kept, int n_msgs) {
    conv *c = ud;
    c->n_calls++;
    c->last_first = first_kept;
    int n = 0;
    if (first_kept > 0 && strcmp(c->roles[0], "system") == 0) n += c->size[0] + 2;
    for (int i = first_kept; i < n_msgs; i++) n += c->size[i] + 2;
    return n;
}

static int count_fails(void *ud, int first_kept, int n_msgs) {
    (void)ud;
    (void)first_kept;
    (void)n_msgs;
    return KS_ETEMPLATE;
}

static const char *const k_roles[] = {"system", "user", "assistant", "user", "assistant", "user"};
static const int k_size[] = {10, 20, 30, 40, 50, 5};
/* totals: sys 12, turn1 22+32=54, turn2 42+52=94, last 7 → all 167 */

static void test_everything_fits(void **state) {
    (void)state;
    conv c = {k_roles, k_size, 0, -1};
    int first = -1;
    assert_int_equal(ks_overflow_plan(6, k_roles, count, &c, 167, &first), 0);
    assert_int_equal(first, 1);
    assert_int_equal(c.n_calls, 1);
}

static void test_keeps_system_drops_whole_oldest_turns(void **state) {
    (void)state;
    conv c = {k_roles, k_size, 0, -1};
    int first = -1;
    /* 166: one token short, the whole first turn (user + assistant) goes */
    assert_int_equal(ks_overflow_plan(6, k_roles, count, &c, 166, &first), 0);
    assert_int_equal(first, 3);
    assert_string_equal(k_roles[first], "user");
    /* 112: one short of system + turn 2 + last (113), so turn 2 goes as well */
    assert_int_equal(ks_overflow_plan(6, k_roles, count, &c, 112, &first), 0);
    assert_int_equal(first, 5);
    /* exactly system + last */
    assert_int_equal(ks_overflow_plan(6, k_roles, count, &c, 19, &first), 0);
    assert_int_equal(first, 5);
}

static void test_last_message_alone_too_big(void **state) {
    (void)state;
    conv c = {k_roles, k_size, 0, -1};
    int first = 42;
    assert_int_equal(ks_overflow_plan(6, k_roles, count, &c, 18, &first), KS_ECTX);
    assert_int_equal(first, 42); /* untouched on error */
    assert_int_equal(c.last_first, 5); /* it tried system + last before giving up */
}

static void test_no_system_message(void **state) {
    (void)state;
    static const char *const roles[] = {"user", "assistant", "user", "assistant", "user"};
    static const int size[] = {20, 30, 40, 50, 5};
    conv c = {roles, size, 0, -1};
    int first = -1;
    assert_int_equal(ks_overflow_plan(5, roles, count, &c, 155, &first), 0);
    assert_int_equal(first, 0);
    assert_int_equal(ks_overflow_plan(5, roles, count, &c, 154, &first), 0);
    assert_int_equal(first, 2);
    assert_int_equal(ks_overflow_plan(5, roles, count, &c, 7, &first), 0);
    assert_int_equal(first, 4);
    assert_int_equal(ks_overflow_plan(5, roles, count, &c, 6, &first), KS_ECTX);
}

static void test_tool_messages_go_with_their_turn(void **state) {
    (void)state;
    static const char *const roles[] = {"system", "user", "assistant", "tool", "assistant", "user"};
    static const int size[] = {1, 1, 1, 1, 1, 1};
    conv c = {roles, size, 0, -1};
    int first = -1;
    assert_int_equal(ks_overflow_plan(6, roles, count, &c, 17, &first), 0);
    assert_int_equal(first, 5); /* user..tool..assistant dropped together */
}

static void test_counter_error_propagates(void **state) {
    (void)state;
    int first = -1;
    assert_int_equal(ks_overflow_plan(6, k_roles, count_fails, NULL, 1000, &first), KS_ETEMPLATE);
    assert_int_equal(ks_overflow_plan(0, k_roles, count_fails, NULL, 1000, &first), KS_EINVAL);
}

static void test_single_system_message_is_the_last(void **state) {
    (void)state;
    static const char *const roles[] = {"system"};
    static const int size[] = {3};
    conv c = {roles, size, 0, -1};
    int first = -1;
    assert_int_equal(ks_overflow_plan(1, roles, count, &c, 5, &first), 0);
    assert_int_equal(first, 0);
    assert_int_equal(ks_overflow_plan(1, roles, count, &c, 4, &first), KS_ECTX);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_everything_fits),
        cmocka_unit_test(test_keeps_system_drops_whole_oldest_turns),
        cmocka_unit_test(test_last_message_alone_too_big),
        cmocka_unit_test(test_no_system_message),
        cmocka_unit_test(test_tool_messages_go_with_their_turn),
        cmocka_unit_test(test_counter_error_propagates),
        cmocka_unit_test(test_single_system_message_is_the_last),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

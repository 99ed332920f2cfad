/* test_prefix.c — token-prefix arithmetic (src/cache/prefix.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache/prefix.h"

static void test_common(void **state) {
    (void)state;
    const int32_t a[] = {1, 2, 3, 4, 5};
    const int32_t b[] = {1, 2, 3, 9, 5, 6};
    const int32_t c[] = {7, 2, 3};
    assert_int_equal(ks_prefix_common(a, 5, b, 6), 3);
    assert_int_equal(ks_prefix_common(b, 6, a, 5), 3);
    assert_int_equal(ks_prefix_common(a, 5, a, 5), 5);
    assert_int_equal(ks_prefix_common(a, 5, a, 2), 2); /* one is a prefix of the other */
    assert_int_equal(ks_prefix_common(a, 2, a, 5), 2);
    assert_int_equal(ks_prefix_common(a, 5, c, 3), 0); /* differ at the first token */
    assert_int_equal(ks_prefix_common(a, 0, b, 6), 0);
    assert_int_equal(ks_prefix_common(a, 5, b, -1), 0);
    assert_int_equal(ks_prefix_common(NULL, 5, b, 6), 0);
    assert_int_equal(ks_prefix_common(a, 5, NULL, 6), 0);
}

static void test_reuse_keeps_one_token_to_decode(void **state) {
    (void)state;
    assert_int_equal(ks_prefix_reuse(3, 10), 3);  /* partial: all common tokens */
    assert_int_equal(ks_prefix_reuse(10, 10), 9); /* identical prompt: last token decoded */
    assert_int_equal(ks_prefix_reuse(50, 10), 9); /* slot longer than the prompt */
    assert_int_equal(ks_prefix_reuse(9, 10), 9);
    assert_int_equal(ks_prefix_reuse(1, 1), 0);   /* one-token prompt: nothing kept */
    assert_int_equal(ks_prefix_reuse(0, 10), 0);
    assert_int_equal(ks_prefix_reuse(5, 0), 0);   /* never negative */
    assert_int_equal(ks_prefix_reuse(-3, 10), 0);
}

static void test_align_down(void **state) {
    (void)state;
    assert_int_equal(ks_prefix_align_down(1000, 256), 768);
    assert_int_equal(ks_prefix_align_down(768, 256), 768);
    assert_int_equal(ks_prefix_align_down(255, 256), 0);
    assert_int_equal(ks_prefix_align_down(0, 256), 0);
    assert_int_equal(ks_prefix_align_down(-5, 256), 0);
    assert_int_equal(ks_prefix_align_down(1000, 0), 1000);
    assert_int_equal(ks_prefix_align_down(1000, 1), 1000);
}

/* Token bookkeeping after generation: a turn of 10 prompt tokens that
 * generated 4 tokens holds 13 (the 4th was sampled, never fed back) when it
 * stopped on max_tokens or a stop string, and 14 when it then sampled an
 * end-of-generation token; the next turn's prompt then reuses exactly that. */
static void test_kv_after_generation(void **state) {
    (void)state;
    assert_int_equal(ks_prefix_kv_after(10, 4, false), 13);
    assert_int_equal(ks_prefix_kv_after(10, 4, true), 14);
    assert_int_equal(ks_prefix_kv_after(10, 1, false), 10);
    assert_int_equal(ks_prefix_kv_after(10, 0, true), 10);  /* EOG as the first token */
    assert_int_equal(ks_prefix_kv_after(10, 0, false), 10);
    assert_int_equal(ks_prefix_kv_after(-3, 0, false), 0);
    /* a follow-up prompt = prompt + the 4 generated tokens + 5 new ones */
    int32_t kv[13], next[19];
    for (int i = 0; i < 19; i++) next[i] = 100 + i;
    for (int i = 0; i < 13; i++) kv[i] = next[i];
    int common = ks_prefix_common(kv, ks_prefix_kv_after(10, 4, false), next, 19);
    assert_int_equal(common, 13);
    assert_int_equal(ks_prefix_reuse(common, 19), 13); /* decode the 4th reply token + 5 new */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_common),
        cmocka_unit_test(test_reuse_keeps_one_token_to_decode),
        cmocka_unit_test(test_align_down),
        cmocka_unit_test(test_kv_after_generation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

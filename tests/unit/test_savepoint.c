/* test_savepoint.c — the cold-save cut arithmetic (src/cache/savepoint.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache/savepoint.h"

static const ks_savepoint_cfg CFG = {.stride = 256, .min_tokens = 256};

static void test_steps(void **state) {
    (void)state;
    assert_int_equal(ks_savepoint_steps(0, 1000, -1, 512), 2);
    assert_int_equal(ks_savepoint_steps(0, 512, -1, 512), 1);
    assert_int_equal(ks_savepoint_steps(0, 513, -1, 512), 2);
    assert_int_equal(ks_savepoint_steps(1000, 1000, -1, 512), 0);
    /* a pending SPC stop at 100 splits the first chunk */
    assert_int_equal(ks_savepoint_steps(0, 600, 100, 512), 2);
    assert_int_equal(ks_savepoint_steps(0, 400, 100, 512), 2);
    /* a stop outside (pos, n) changes nothing */
    assert_int_equal(ks_savepoint_steps(200, 600, 100, 512), 1);
    assert_int_equal(ks_savepoint_steps(0, 400, 400, 512), 1);
}

static void test_last_point_only_in_cold_prefill(void **state) {
    (void)state;
    assert_int_equal(ks_savepoint_last(&CFG, 0, 1000), 768);
    assert_int_equal(ks_savepoint_last(&CFG, 255, 1000), 768); /* less than a stride reused: cold */
    assert_int_equal(ks_savepoint_last(&CFG, 256, 1000), -1);  /* a history was reused: warm */
    assert_int_equal(ks_savepoint_last(&CFG, 0, 769), 768);
    assert_int_equal(ks_savepoint_last(&CFG, 0, 768), 512);    /* never the prompt's last token */
    assert_int_equal(ks_savepoint_last(&CFG, 0, 257), 256);
    assert_int_equal(ks_savepoint_last(&CFG, 0, 256), -1);     /* below min_tokens */
    ks_savepoint_cfg hi = {.stride = 256, .min_tokens = 600};
    assert_int_equal(ks_savepoint_last(&hi, 0, 700), -1);
}

/* A cold prefill of 1000 tokens at 512 a chunk: the first chunk is not cut
 * (the cut last chunk will save), the last chunk ends at 768 for the save. */
static void test_cold_prefill_saves_once_at_the_last_boundary(void **state) {
    (void)state;
    int at = 0;
    assert_int_equal(ks_savepoint_cut(&CFG, 0, 512, 1000, -1, 512, 0, &at), 512);
    assert_int_equal(at, -1);
    assert_int_equal(ks_savepoint_cut_last(&CFG, 512, 488, 0, 1000, &at), 256);
    assert_int_equal(at, 768);
    /* the rest of the prompt after the save point is the final chunk, uncut */
    assert_int_equal(ks_savepoint_cut_last(&CFG, 768, 232, 0, 1000, &at), 232);
    assert_int_equal(at, -1);
}

/* A warm prefill (a history reused): no chunk is cut, the last one neither;
 * the finish save follows within the request. */
static void test_warm_prefill_saves_nowhere(void **state) {
    (void)state;
    int at = 0;
    assert_int_equal(ks_savepoint_cut(&CFG, 300, 512, 1000, -1, 512, 300, &at), 512);
    assert_int_equal(at, -1);
    assert_int_equal(ks_savepoint_cut(&CFG, 300, 300, 550, -1, 300, 300, &at), 300);
    assert_int_equal(at, -1);
    assert_int_equal(ks_savepoint_cut_last(&CFG, 300, 700, 300, 1000, &at), 700);
    assert_int_equal(at, -1);
}

static void test_no_cut_that_adds_a_step(void **state) {
    (void)state;
    int at = 0;
    /* [0, 300) of 600 at 300 a chunk: ending at 256 leaves 344 = 2 steps, not 1 */
    assert_int_equal(ks_savepoint_cut(&CFG, 0, 300, 600, -1, 300, 0, &at), 300);
    assert_int_equal(at, -1);
    /* of 400 tokens both ways take 1 more step, and the last chunk has no
     * boundary of its own after its start: the cut is free */
    assert_int_equal(ks_savepoint_cut(&CFG, 0, 300, 400, -1, 300, 0, &at), 256);
    assert_int_equal(at, 256);
}

static void test_only_the_last_eligible_chunk_saves(void **state) {
    (void)state;
    int at = 0;
    /* 1030 tokens, cold, 512 a chunk: chunk [0, 512) could end at 512, but the
     * next chunk ends at a boundary of its own, so it is not cut ... */
    assert_int_equal(ks_savepoint_cut(&CFG, 0, 512, 1030, -1, 512, 0, &at), 512);
    assert_int_equal(at, -1);
    /* ... that chunk takes the save (the last one's boundary is its start) */
    assert_int_equal(ks_savepoint_cut(&CFG, 512, 512, 1030, -1, 512, 0, &at), 512);
    assert_int_equal(at, 1024);
}

static void test_below_min_tokens_or_before_the_chunk(void **state) {
    (void)state;
    int at = 0;
    ks_savepoint_cfg hi = {.stride = 256, .min_tokens = 1024};
    assert_int_equal(ks_savepoint_cut(&hi, 300, 512, 1000, -1, 512, 300, &at), 512);
    assert_int_equal(at, -1);
    /* the chunk's boundary is its own start: nothing to save */
    assert_int_equal(ks_savepoint_cut(&CFG, 512, 200, 1000, -1, 200, 600, &at), 200);
    assert_int_equal(at, -1);
    /* the last chunk of a cold prefill whose boundary lies before it */
    assert_int_equal(ks_savepoint_cut_last(&CFG, 800, 200, 0, 1000, &at), 200);
    assert_int_equal(at, -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps),
        cmocka_unit_test(test_last_point_only_in_cold_prefill),
        cmocka_unit_test(test_cold_prefill_saves_once_at_the_last_boundary),
        cmocka_unit_test(test_warm_prefill_saves_nowhere),
        cmocka_unit_test(test_no_cut_that_adds_a_step),
        cmocka_unit_test(test_only_the_last_eligible_chunk_saves),
        cmocka_unit_test(test_below_min_tokens_or_before_the_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_admit.c — the render limit of issue 28 (src/server/admit.c): however
 * many threads render at once, at most max are inside at any moment, every
 * one gets in, and the counters count each render and refusal once. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <sched.h>

#include <cmocka.h>

#include "server/admit.h"

enum { THREADS = 8, ROUNDS = 200, MAX = 2 };

static ks_admit g_a;
static _Atomic int g_inside, g_most;

static void *worker(void *ud) {
    (void)ud;
    for (int r = 0; r < ROUNDS; r++) {
        ks_admit_enter(&g_a, r % 2 ? KS_ADMIT_GRAMMAR : KS_ADMIT_RENDER);
        int now = atomic_fetch_add(&g_inside, 1) + 1;
        int most = atomic_load(&g_most);
        while (now > most && !atomic_compare_exchange_weak(&g_most, &most, now)) {}
        sched_yield();
        atomic_fetch_sub(&g_inside, 1);
        ks_admit_leave(&g_a);
    }
    return NULL;
}

static void test_at_most_max_inside(void **state) {
    (void)state;
    assert_int_equal(ks_admit_init(&g_a, MAX), 0);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, NULL), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    assert_true(atomic_load(&g_most) <= MAX);
    assert_int_equal(atomic_load(&g_a.renders), THREADS * ROUNDS / 2);
    assert_int_equal(atomic_load(&g_a.grammars), THREADS * ROUNDS / 2);
    assert_int_equal(g_a.running, 0);
    assert_int_equal(g_a.waiting, 0);
    ks_admit_note_refused(&g_a);
    assert_int_equal(atomic_load(&g_a.refused), 1);
    ks_admit_fini(&g_a);
}

static void test_out_of_range_is_default(void **state) {
    (void)state;
    ks_admit a;
    assert_int_equal(ks_admit_init(&a, 0), 0);
    assert_int_equal(a.max, KS_ADMIT_DEFAULT);
    ks_admit_fini(&a);
    assert_int_equal(ks_admit_init(&a, KS_ADMIT_MAX + 1), 0);
    assert_int_equal(a.max, KS_ADMIT_DEFAULT);
    ks_admit_fini(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_at_most_max_inside),
        cmocka_unit_test(test_out_of_range_is_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

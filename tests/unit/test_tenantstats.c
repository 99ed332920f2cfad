/* test_tenantstats.c — each tenant's counts (src/server/tenantstats.c): added
 * and read back per tenant, tenant 0 kept apart, tenants beyond the table
 * counted in the overflow row only, which no tenant's own view shows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "server/tenantstats.h"

typedef struct seen {
    int rows;
    uint64_t requests, overflow_requests;
} seen;

static void count(void *ud, uint64_t tenant, bool overflow, const ks_tenant_usage *u) {
    (void)tenant;
    seen *s = ud;
    s->rows++;
    s->requests += u->requests;
    if (overflow) s->overflow_requests += u->requests;
}

static void test_counts(void **st) {
    (void)st;
    ks_tenantstats *t = ks_tenantstats_create();
    assert_non_null(t);
    ks_tenantstats_add(t, 42, 100, 60, 7);
    ks_tenantstats_add(t, 42, 120, 100, 3);
    ks_tenantstats_add(t, 0, 10, 0, 1);
    ks_tenant_usage u;
    ks_tenantstats_get(t, 42, &u);
    assert_int_equal(u.requests, 2);
    assert_int_equal(u.prompt_tokens, 220);
    assert_int_equal(u.cached_tokens, 160);
    assert_int_equal(u.generated_tokens, 10);
    ks_tenantstats_get(t, 0, &u);
    assert_int_equal(u.requests, 1);
    ks_tenantstats_get(t, 43, &u);
    assert_int_equal(u.requests, 0);
    /* Past the table: the overflow row, seen by the walk, by no tenant's view. */
    for (uint64_t i = 1; i <= KS_TENANTSTATS_MAX + 10; i++) ks_tenantstats_add(t, 1000 + i * 7919, 1, 0, 1);
    seen s = {0};
    ks_tenantstats_each(t, count, &s);
    assert_int_equal(s.rows, KS_TENANTSTATS_MAX + 2); /* the table, tenant 0, the overflow */
    assert_int_equal(s.requests, 3 + KS_TENANTSTATS_MAX + 10);
    assert_int_equal(s.overflow_requests, 11); /* 42 took one row of the table */
    ks_tenantstats_get(t, 1000 + (KS_TENANTSTATS_MAX + 10) * 7919ull, &u);
    assert_int_equal(u.requests, 0);
    ks_tenantstats_free(t);
    ks_tenantstats_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_counts)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

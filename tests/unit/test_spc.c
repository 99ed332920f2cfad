/* test_spc.c — the system prompt cache store (src/cache/spc.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/spc.h"

/* An entry of exactly `size` bytes (10 tokens + blob) whose bytes and tokens
 * are derived from key, so a reader can check it got the right data. */
static int put(ks_spc *s, uint64_t key, int size) {
    int32_t tok[10];
    for (int i = 0; i < 10; i++) tok[i] = (int32_t)(key * 100 + (uint64_t)i);
    size_t len = (size_t)(size - 40);
    uint8_t *blob = malloc(len ? len : 1);
    assert_non_null(blob);
    memset(blob, (int)(key & 0xff), len);
    return ks_spc_insert(s, key, tok, 10, blob, len);
}

static void check_entry(const ks_spc_entry *e, uint64_t key, int size) {
    assert_non_null(e);
    assert_int_equal(e->key, key);
    assert_int_equal(e->tokens.n, 10);
    assert_int_equal(e->tokens.v[9], (int32_t)(key * 100 + 9));
    assert_int_equal(e->len, size - 40);
    for (size_t i = 0; i < e->len; i++)
        if (e->blob[i] != (uint8_t)(key & 0xff)) fail_msg("blob byte %zu of key %llu", i, (unsigned long long)key);
}

static ks_spc_stats stats(ks_spc *s) {
    ks_spc_stats st;
    ks_spc_get_stats(s, &st);
    return st;
}

static void test_hit_miss_and_stats(void **state) {
    (void)state;
    ks_spc *s = NULL;
    assert_int_equal(ks_spc_create(1000, &s), 0);
    assert_null(ks_spc_acquire(s, 1));
    assert_int_equal(put(s, 1, 300), 0);
    const ks_spc_entry *e = ks_spc_acquire(s, 1);
    check_entry(e, 1, 300);
    assert_true(e->created_us > 0);
    ks_spc_release(s, e);
    ks_spc_stats st = stats(s);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.inserts, 1);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.bytes, 300);
    assert_int_equal(st.max_bytes, 1000);
    assert_int_equal(st.evictions, 0);
    ks_spc_free(s);
    ks_spc_free(NULL);
}

static void test_lru_under_budget(void **state) {
    (void)state;
    ks_spc *s = NULL;
    assert_int_equal(ks_spc_create(1000, &s), 0);
    assert_int_equal(put(s, 1, 300), 0);
    assert_int_equal(put(s, 2, 300), 0);
    assert_int_equal(put(s, 3, 300), 0);
    assert_int_equal(stats(s).bytes, 900);
    /* touch 1: now 2 is the least recently used */
    ks_spc_release(s, ks_spc_acquire(s, 1));
    assert_int_equal(put(s, 4, 300), 0);
    assert_true(ks_spc_contains(s, 1));
    assert_false(ks_spc_contains(s, 2));
    assert_true(ks_spc_contains(s, 3));
    assert_true(ks_spc_contains(s, 4));
    ks_spc_stats st = stats(s);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.bytes, 900);
    /* a bigger one evicts the two oldest (3, then 1) */
    assert_int_equal(put(s, 5, 600), 0);
    assert_false(ks_spc_contains(s, 3));
    assert_false(ks_spc_contains(s, 1));
    assert_true(ks_spc_contains(s, 4));
    assert_true(ks_spc_contains(s, 5));
    st = stats(s);
    assert_int_equal(st.evictions, 3);
    assert_int_equal(st.bytes, 900);
    assert_true(st.bytes <= st.max_bytes);
    ks_spc_free(s);
}

static void test_refcount_protects_acquired_entry(void **state) {
    (void)state;
    ks_spc *s = NULL;
    assert_int_equal(ks_spc_create(1000, &s), 0);
    assert_int_equal(put(s, 1, 300), 0);
    assert_int_equal(put(s, 2, 300), 0);
    assert_int_equal(put(s, 3, 300), 0);
    /* 1 is the LRU but being read: the unreferenced 2 goes instead */
    const ks_spc_entry *e1 = ks_spc_acquire(s, 1);
    ks_spc_release(s, ks_spc_acquire(s, 2));
    ks_spc_release(s, ks_spc_acquire(s, 3)); /* LRU order now 1, 2, 3 */
    assert_int_equal(put(s, 4, 300), 0);
    assert_true(ks_spc_contains(s, 1));
    assert_false(ks_spc_contains(s, 2));

    /* nothing else is enough: the read entry is unlinked but stays valid */
    assert_int_equal(put(s, 5, 1000), 0);
    assert_false(ks_spc_contains(s, 1));
    assert_null(ks_spc_acquire(s, 1));
    check_entry(e1, 1, 300);
    ks_spc_stats st = stats(s);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.bytes, 1000);
    ks_spc_release(s, e1); /* freed here (ASan/LSan would see a leak or a double free) */
    ks_spc_free(s);
}

static void test_replace_while_acquired(void **state) {
    (void)state;
    ks_spc *s = NULL;
    assert_int_equal(ks_spc_create(1000, &s), 0);
    assert_int_equal(put(s, 7, 200), 0);
    const ks_spc_entry *old = ks_spc_acquire(s, 7);
    assert_int_equal(put(s, 7, 400), 0); /* same key, new state */
    const ks_spc_entry *now = ks_spc_acquire(s, 7);
    assert_ptr_not_equal(old, now);
    check_entry(old, 7, 200);
    check_entry(now, 7, 400);
    ks_spc_stats st = stats(s);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.bytes, 400);
    assert_int_equal(st.evictions, 0); /* a replacement is not an eviction */
    ks_spc_release(s, old);
    ks_spc_release(s, now);
    ks_spc_free(s);
}

static void test_oversize_refused(void **state) {
    (void)state;
    ks_spc *s = NULL;
    assert_int_equal(ks_spc_create(1000, &s), 0);
    assert_int_equal(put(s, 1, 500), 0);
    assert_int_equal(put(s, 2, 1001), KS_ENOSPC); /* blob freed by the store */
    assert_true(ks_spc_contains(s, 1));            /* nothing evicted for it */
    ks_spc_stats st = stats(s);
    assert_int_equal(st.refused, 1);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.entries, 1);
    assert_int_equal(put(s, 3, 1000), 0); /* exactly the budget fits */
    ks_spc_free(s);

    /* a zero budget refuses everything */
    assert_int_equal(ks_spc_create(0, &s), 0);
    assert_int_equal(put(s, 1, 40), KS_ENOSPC);
    ks_spc_free(s);
}

static void test_invalid_arguments(void **state) {
    (void)state;
    ks_spc *s = NULL;
    assert_int_equal(ks_spc_create(1000, NULL), KS_EINVAL);
    assert_int_equal(ks_spc_create(1000, &s), 0);
    assert_int_equal(ks_spc_insert(s, 1, NULL, 3, malloc(8), 8), KS_EINVAL);
    assert_int_equal(ks_spc_insert(s, 1, NULL, 0, NULL, 8), KS_EINVAL);
    assert_int_equal(ks_spc_insert(NULL, 1, NULL, 0, malloc(8), 8), KS_EINVAL);
    assert_int_equal(ks_spc_insert(s, 1, NULL, 0, NULL, 0), 0); /* empty state is legal */
    assert_null(ks_spc_acquire(NULL, 1));
    ks_spc_release(s, NULL);
    ks_spc_free(s);
}

/* Readers check every entry they get while the main thread churns the store:
 * a freed-under-the-reader entry shows up as wrong bytes (or an ASan report). */
typedef struct reader_arg {
    ks_spc *s;
    int errors;
} reader_arg;

static void *reader(void *p) {
    reader_arg *a = p;
    for (int i = 0; i < 20000; i++) {
        uint64_t key = (uint64_t)(i % 8);
        const ks_spc_entry *e = ks_spc_acquire(a->s, key);
        if (!e) continue;
        if (e->key != key || e->len != 160 || e->blob[0] != (uint8_t)key ||
            e->blob[159] != (uint8_t)key || e->tokens.v[0] != (int32_t)(key * 100))
            a->errors++;
        ks_spc_release(a->s, e);
    }
    return NULL;
}

static void test_concurrent_readers(void **state) {
    (void)state;
    ks_spc *s = NULL;
    assert_int_equal(ks_spc_create(4 * 200, &s), 0); /* room for 4 of the 8 keys */
    reader_arg args[3] = {{s, 0}, {s, 0}, {s, 0}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, reader, &args[i]), 0);
    for (int i = 0; i < 5000; i++) assert_int_equal(put(s, (uint64_t)(i % 8), 200), 0);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
    }
    ks_spc_stats st = stats(s);
    assert_true(st.bytes <= st.max_bytes);
    assert_int_equal(st.inserts, 5000);
    ks_spc_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_miss_and_stats),
        cmocka_unit_test(test_lru_under_budget),
        cmocka_unit_test(test_refcount_protects_acquired_entry),
        cmocka_unit_test(test_replace_while_acquired),
        cmocka_unit_test(test_oversize_refused),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_concurrent_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

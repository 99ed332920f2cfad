/* test_msghash.c — message-prefix hashes (src/cache/msghash.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>
#include <xxhash.h>

#include "cache/msghash.h"

static void test_prefix_property(void **state) {
    (void)state;
    const char *roles[] = {"system", "user", "assistant", "user"};
    const char *contents[] = {"be brief", "hi", "hello!", "how are you?"};
    uint64_t full[5], part[3];
    ks_msghash_prefixes(roles, contents, 4, full);
    ks_msghash_prefixes(roles, contents, 2, part);
    assert_int_equal(full[0], ks_msghash_empty());
    for (int k = 0; k <= 2; k++) assert_int_equal(part[k], full[k]);
    /* every prefix differs from every other */
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++) assert_int_not_equal(full[i], full[j]);
    /* deterministic */
    uint64_t again[5];
    ks_msghash_prefixes(roles, contents, 4, again);
    for (int k = 0; k < 5; k++) assert_int_equal(again[k], full[k]);
}

static void test_later_change_keeps_earlier_prefixes(void **state) {
    (void)state;
    const char *roles[] = {"system", "user", "assistant"};
    const char *a[] = {"s", "q1", "r1"};
    const char *b[] = {"s", "q1", "r1 edited"};
    uint64_t ha[4], hb[4];
    ks_msghash_prefixes(roles, a, 3, ha);
    ks_msghash_prefixes(roles, b, 3, hb);
    assert_int_equal(ha[2], hb[2]);
    assert_int_not_equal(ha[3], hb[3]);
}

static void test_boundaries_do_not_collide(void **state) {
    (void)state;
    uint64_t x[2], y[2], z[3], w[3];
    /* role/content boundary: ("ab", "c") vs ("a", "bc") */
    const char *r1[] = {"ab"}, *c1[] = {"c"};
    const char *r2[] = {"a"}, *c2[] = {"bc"};
    ks_msghash_prefixes(r1, c1, 1, x);
    ks_msghash_prefixes(r2, c2, 1, y);
    assert_int_not_equal(x[1], y[1]);
    /* message boundary: user "ab" + user "c" vs user "a" + user "bc" */
    const char *ru[] = {"user", "user"};
    const char *cz[] = {"ab", "c"}, *cw[] = {"a", "bc"};
    ks_msghash_prefixes(ru, cz, 2, z);
    ks_msghash_prefixes(ru, cw, 2, w);
    assert_int_not_equal(z[2], w[2]);
    /* NULL content differs from "" */
    const char *ra[] = {"assistant"}, *cn[] = {NULL}, *ce[] = {""};
    ks_msghash_prefixes(ra, cn, 1, x);
    ks_msghash_prefixes(ra, ce, 1, y);
    assert_int_not_equal(x[1], y[1]);
}

static void test_role_matters(void **state) {
    (void)state;
    const char *ru[] = {"user"}, *rs[] = {"system"}, *c[] = {"hello"};
    uint64_t a[2], b[2];
    ks_msghash_prefixes(ru, c, 1, a);
    ks_msghash_prefixes(rs, c, 1, b);
    assert_int_not_equal(a[1], b[1]);
    assert_int_equal(a[0], b[0]);
}

static void test_zero_messages(void **state) {
    (void)state;
    uint64_t out[1] = {0};
    ks_msghash_prefixes(NULL, NULL, 0, out);
    assert_int_equal(out[0], ks_msghash_empty());
}

static void test_system_key(void **state) {
    (void)state;
    uint64_t k = ks_msghash_system("system", "be brief", "model-A");
    assert_int_equal(k, ks_msghash_system("system", "be brief", "model-A"));
    assert_int_not_equal(k, ks_msghash_system("system", "be brief", "model-B"));
    assert_int_not_equal(k, ks_msghash_system("system", "be brief!", "model-A"));
    assert_int_not_equal(k, ks_msghash_system("developer", "be brief", "model-A"));
    assert_int_not_equal(k, ks_msghash_system("system", "be brief", NULL));
    /* a separate domain from the message-prefix chain */
    const char *r[] = {"system"}, *c[] = {"be brief"};
    uint64_t h[2];
    ks_msghash_prefixes(r, c, 1, h);
    assert_int_not_equal(ks_msghash_system("system", "be brief", ""), h[1]);
}


/* Pins the documented encoding, so hashes stay comparable across builds:
 * out[k+1] = XXH3_64(len(role) u64le ‖ role ‖ 0 ‖ len(content) u64le ‖ content, seed out[k]). */
static void test_documented_encoding(void **state) {
    (void)state;
    const char *r[] = {"user"}, *c[] = {"hi"};
    uint64_t h[2];
    ks_msghash_prefixes(r, c, 1, h);
    unsigned char buf[8 + 4 + 1 + 8 + 2] = {0};
    buf[0] = 4;
    memcpy(buf + 8, "user", 4);
    buf[12] = 0;
    buf[13] = 2;
    memcpy(buf + 21, "hi", 2);
    assert_int_equal(h[1], XXH3_64bits_withSeed(buf, sizeof buf, h[0]));
    assert_int_equal(h[0], XXH3_64bits_withSeed("kvstash/msghash/v1", 18, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_property),
        cmocka_unit_test(test_later_change_keeps_earlier_prefixes),
        cmocka_unit_test(test_boundaries_do_not_collide),
        cmocka_unit_test(test_role_matters),
        cmocka_unit_test(test_zero_messages),
        cmocka_unit_test(test_system_key),
        cmocka_unit_test(test_documented_encoding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

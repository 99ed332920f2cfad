/* test_tenant.c — issue 28: tenants in every cache key and routing decision,
 * the API key ring (keyring.c) and unguessable ids (ks_api_make_id).
 *
 * Regression for: another API key's request hit, copied or restored a
 * tenant's prompt state (store keys, message hashes and the router had no
 * tenant), and ids came from one seed and a counter, so one id gave away
 * the others. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/msghash.h"
#include "cache/route.h"
#include "config/config.h"
#include "server/api.h"
#include "server/convstore.h"
#include "server/keyring.h"

static const char KV[] = "type_k=f16;type_v=f16;n_ctx_seq=4096;fa=0";

/* ------------------------------------------------------------------ keys */
static void test_key_tenant(void **state) {
    (void)state;
    uint8_t fp[32];
    for (int i = 0; i < 32; i++) fp[i] = (uint8_t)i;
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = i * 31;
    ks_key k0, t0, t1, t2;
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), toks, 64, &k0), 0);
    /* tenant 0 is the single-tenant key, byte for byte */
    assert_int_equal(ks_key_compute_tenant(fp, KV, strlen(KV), 0, toks, 64, &t0), 0);
    assert_true(ks_key_eq(&k0, &t0));
    assert_int_equal(ks_key_compute_tenant(fp, KV, strlen(KV), 1, toks, 64, &t1), 0);
    assert_int_equal(ks_key_compute_tenant(fp, KV, strlen(KV), 2, toks, 64, &t2), 0);
    assert_false(ks_key_eq(&k0, &t1));
    assert_false(ks_key_eq(&t1, &t2));
    /* A tenant's key is not a single-tenant key of other tokens either: the
     * 8 tenant bytes read as two tokens after the kv params. */
    int32_t shifted[66] = {1, 0};
    memcpy(shifted + 2, toks, sizeof toks);
    ks_key s;
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), shifted, 66, &s), 0);
    assert_false(ks_key_eq(&s, &t1));
    /* the prefix hasher agrees with the one-shot key in a tenant's namespace */
    int lens[] = {0, 16, 33, 64};
    ks_key pk[4];
    assert_int_equal(ks_key_prefixes_tenant(fp, KV, strlen(KV), 7, toks, 64, lens, 4, pk), 0);
    for (int i = 0; i < 4; i++) {
        ks_key one;
        assert_int_equal(ks_key_compute_tenant(fp, KV, strlen(KV), 7, toks, lens[i], &one), 0);
        assert_true(ks_key_eq(&one, &pk[i]));
    }
}

static void test_msghash_tenant(void **state) {
    (void)state;
    uint64_t h = ks_msghash_system("system", "You are helpful.", "model");
    assert_int_equal(ks_msghash_tenant(h, 0), h);
    uint64_t a = ks_msghash_tenant(h, 1), b = ks_msghash_tenant(h, 2);
    assert_int_not_equal(a, h);
    assert_int_not_equal(a, b);
    assert_int_not_equal(a, 0);
    assert_int_equal(ks_msghash_tenant(h, 1), a); /* stable */
}

/* --------------------------------------------------------------- routing */
/* B's prompt is A's secret with one more token: without tenants it would
 * be a prefix hit on A's slot. With them, A's slot shares nothing with B:
 * B gets an empty slot and the reason any unrelated request gets. */
static void test_route_other_tenant_shares_nothing(void **state) {
    (void)state;
    int32_t secret[40], guess[41], other[41];
    for (int i = 0; i < 40; i++) secret[i] = guess[i] = 100 + i;
    guess[40] = 7;
    for (int i = 0; i < 41; i++) other[i] = 5000 + i;
    uint64_t ha[3] = {11, 12, 13};
    ks_route_slot slots[2] = {
        {.id = 0, .tokens = secret, .n_tokens = 40, .last_used_us = 5, .msg_hash = 12, .n_msgs_cached = 1,
         .tenant = 0xA},
        {.id = 1},
    };
    ks_route_cfg cfg[2] = {{.imc = false, .affinity_min = 0.05f}, {.imc = true, .cache_min_tokens = 4}};
    for (int m = 0; m < 2; m++) {
        ks_route rb, rc, ra;
        ks_route_req b = {.tokens = guess, .n_tokens = 41, .msg_prefix_hash = ha, .n_msgs = 2, .cache_prompt = true,
                          .tenant = 0xB};
        ks_route_req c = {.tokens = other, .n_tokens = 41, .cache_prompt = true, .tenant = 0xC};
        assert_int_equal(ks_route_select(slots, 2, &b, &cfg[m], &rb), 0);
        assert_int_equal(ks_route_select(slots, 2, &c, &cfg[m], &rc), 0);
        assert_int_equal(rb.slot, 1);
        assert_int_equal(rb.mode, KS_ROUTE_MISS);
        assert_int_equal(rb.n_common, 0);
        assert_int_equal(rb.n_reuse, 0);
        assert_string_equal(rb.reason, rc.reason);
        assert_int_equal(rb.mode, rc.mode);
        /* the owner still hits */
        b.tenant = 0xA;
        assert_int_equal(ks_route_select(slots, 2, &b, &cfg[m], &ra), 0);
        assert_int_equal(ra.slot, 0);
        assert_int_equal(ra.n_common, 40);
        assert_int_equal(ra.mode, m ? KS_ROUTE_IMC_HASH : KS_ROUTE_PREFIX);
    }
    /* With no empty slot, B takes A's slot only as the LRU: nothing kept. */
    slots[1] = (ks_route_slot){.id = 1, .tokens = other, .n_tokens = 41, .last_used_us = 9, .tenant = 0xC};
    ks_route_req b = {.tokens = guess, .n_tokens = 41, .cache_prompt = true, .tenant = 0xB};
    ks_route r;
    assert_int_equal(ks_route_select(slots, 2, &b, &cfg[0], &r), 0);
    assert_int_equal(r.slot, 0);
    assert_int_equal(r.n_reuse, 0);
    assert_string_equal(r.reason, "evicted");
}

/* Fairness (route.h invariant 5): B's miss with no empty slot takes B's own
 * least recently used slot, not A's older one; A's only when B has none
 * idle; one tenant: the plain LRU, as before. */
static void test_route_lru_own_tenant_first(void **state) {
    (void)state;
    int32_t a[20], b[20], b2[20], q[20];
    for (int i = 0; i < 20; i++) a[i] = 100 + i, b[i] = 300 + i, b2[i] = 500 + i, q[i] = 900 + i;
    ks_route_slot slots[3] = {
        {.id = 0, .tokens = a, .n_tokens = 20, .last_used_us = 1, .tenant = 0xA},  /* the oldest: A's */
        {.id = 1, .tokens = b, .n_tokens = 20, .last_used_us = 5, .tenant = 0xB},
        {.id = 2, .tokens = b2, .n_tokens = 20, .last_used_us = 3, .tenant = 0xB}, /* B's oldest */
    };
    ks_route_cfg cfg[2] = {{.imc = false, .affinity_min = 0.05f}, {.imc = true, .cache_min_tokens = 4}};
    for (int m = 0; m < 2; m++) {
        ks_route r;
        ks_route_req req = {.tokens = q, .n_tokens = 20, .cache_prompt = true, .tenant = 0xB};
        assert_int_equal(ks_route_select(slots, 3, &req, &cfg[m], &r), 0);
        assert_int_equal(r.slot, 2);
        assert_string_equal(r.reason, "evicted");
        /* cache_prompt false clears its slot: B's own too */
        req.cache_prompt = false;
        assert_int_equal(ks_route_select(slots, 3, &req, &cfg[m], &r), 0);
        assert_int_equal(r.slot, 2);
        req.cache_prompt = true;
        /* B's slots busy: then the LRU of all, A's */
        slots[1].busy = slots[2].pending = true;
        assert_int_equal(ks_route_select(slots, 3, &req, &cfg[m], &r), 0);
        assert_int_equal(r.slot, 0);
        /* a tenant with no slot at all: the LRU of all */
        slots[1].busy = slots[2].pending = false;
        req.tenant = 0xC;
        assert_int_equal(ks_route_select(slots, 3, &req, &cfg[m], &r), 0);
        assert_int_equal(r.slot, 0);
        /* one tenant: the plain LRU */
        ks_route_slot one[3];
        memcpy(one, slots, sizeof one);
        for (int i = 0; i < 3; i++) one[i].tenant = 0;
        req.tenant = 0;
        assert_int_equal(ks_route_select(one, 3, &req, &cfg[m], &r), 0);
        assert_int_equal(r.slot, 0);
    }
}

/* ------------------------------------------------------------------- ids */
static int cmp_str(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

static void test_ids_random_128_bits(void **state) {
    (void)state;
    enum { N = 20000 };
    char (*ids)[64] = malloc(N * sizeof *ids);
    assert_non_null(ids);
    int ones[128] = {0};
    for (int i = 0; i < N; i++) {
        ks_api_make_id(ids[i], sizeof ids[i], "resp_");
        assert_int_equal(strlen(ids[i]), 5 + 32);
        assert_memory_equal(ids[i], "resp_", 5);
        uint8_t b[16];
        assert_int_equal(ks_hex_decode(ids[i] + 5, b, 16), 0);
        for (const char *p = ids[i] + 5; *p; p++) assert_non_null(strchr("0123456789abcdef", *p));
        for (int k = 0; k < 128; k++) ones[k] += (b[k / 8] >> (k % 8)) & 1;
    }
    qsort(ids, N, sizeof *ids, cmp_str);
    for (int i = 1; i < N; i++) assert_string_not_equal(ids[i - 1], ids[i]);
    /* Every one of the 128 bits varies (a counter or a 96-bit id would leave
     * some fixed): each is set in 40..60% of the ids (about 14 standard
     * deviations from the mean: never fails by chance). */
    for (int k = 0; k < 128; k++) {
        if (ones[k] < N * 2 / 5 || ones[k] > N * 3 / 5) fail_msg("bit %d set in %d of %d ids", k, ones[k], N);
    }
    free(ids);
}

/* ----------------------------------------------------------- keyring */
static char *write_file(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/ks-keyring-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void rewrite(const char *path, const char *text) {
    char tmp[80];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(tmp, 0600), 0); /* a key file others may read is refused */
    assert_int_equal(rename(tmp, path), 0);
}

static void test_keyring_tenants(void **state) {
    (void)state;
    uint64_t t = 99, t2 = 99;
    /* no key: everything allowed, one tenant */
    ks_keyring *k = NULL;
    char err[256];
    assert_int_equal(ks_keyring_create(NULL, 0, NULL, &k, err, sizeof err), 0);
    assert_false(ks_keyring_required(k));
    assert_true(ks_keyring_check(k, NULL, &t));
    assert_int_equal(t, 0);
    ks_keyring_free(k);
    /* one key: required, tenant 0 (the single tenant) */
    const char *one[] = {"k1"};
    assert_int_equal(ks_keyring_create(one, 1, NULL, &k, err, sizeof err), 0);
    assert_true(ks_keyring_required(k));
    assert_false(ks_keyring_check(k, NULL, &t));
    assert_false(ks_keyring_check(k, "k2", &t));
    assert_false(ks_keyring_check(k, "k", &t));
    assert_false(ks_keyring_check(k, "", &t));
    assert_true(ks_keyring_check(k, "k1", &t));
    assert_int_equal(t, 0);
    ks_keyring_free(k);
    /* two keys: two tenants, neither 0 */
    const char *two[] = {"k1", "k2"};
    assert_int_equal(ks_keyring_create(two, 2, NULL, &k, err, sizeof err), 0);
    assert_true(ks_keyring_check(k, "k1", &t));
    assert_true(ks_keyring_check(k, "k2", &t2));
    assert_int_not_equal(t, 0);
    assert_int_not_equal(t2, 0);
    assert_int_not_equal(t, t2);
    assert_int_equal(t, ks_keyring_tenant_of("k1"));
    ks_keyring_free(k);
    /* a bad inline key */
    const char *bad[] = {"has space"};
    assert_int_equal(ks_keyring_create(bad, 1, NULL, &k, err, sizeof err), KS_EINVAL);
    assert_null(k);
}

static void test_keyring_file(void **state) {
    (void)state;
    char *path = write_file("# comment\n\n  kA alice\nkB alice # same tenant\nkC\n");
    char p[64];
    snprintf(p, sizeof p, "%s", path);
    ks_keyring *k = NULL;
    char err[256];
    const char *inl[] = {"kI"};
    assert_int_equal(ks_keyring_create(inl, 1, p, &k, err, sizeof err), 0);
    assert_int_equal(ks_keyring_count(k), 4);
    uint64_t a, b, c, i;
    assert_true(ks_keyring_check(k, "kA", &a));
    assert_true(ks_keyring_check(k, "kB", &b));
    assert_true(ks_keyring_check(k, "kC", &c));
    assert_true(ks_keyring_check(k, "kI", &i)); /* with a file, the inline key is a tenant too */
    assert_int_equal(a, b);
    assert_int_equal(a, ks_keyring_tenant_of("alice"));
    assert_int_equal(c, ks_keyring_tenant_of("kC"));
    assert_int_not_equal(a, c);
    assert_int_not_equal(i, 0);
    assert_false(ks_keyring_check(k, "kD", &a));
    /* rotated: read again on the next check */
    rewrite(p, "kD alice\nkC\n");
    assert_false(ks_keyring_check(k, "kA", &a));
    assert_true(ks_keyring_check(k, "kD", &a));
    assert_int_equal(a, ks_keyring_tenant_of("alice"));
    /* a bad file is refused whole; the keys read before stay */
    rewrite(p, "kE\nkF one two\n");
    assert_true(ks_keyring_check(k, "kD", &a));
    assert_false(ks_keyring_check(k, "kE", &a));
    /* gone: the same */
    unlink(p);
    assert_true(ks_keyring_check(k, "kD", &a));
    rewrite(p, "kG\n");
    assert_true(ks_keyring_check(k, "kG", &a));
    assert_false(ks_keyring_check(k, "kD", &a));
    ks_keyring_free(k);
    /* at create, a bad file is an error that names the line */
    rewrite(p, "ok\nnot ok here\n");
    assert_int_equal(ks_keyring_create(NULL, 0, p, &k, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "line 2"));
    unlink(p);
    assert_int_equal(ks_keyring_create(NULL, 0, p, &k, err, sizeof err), KS_EINVAL);
}

/* Checks on many threads while the file is rewritten (ThreadSanitizer). */
typedef struct {
    ks_keyring *k;
    int ok;
} chk;

static void *checker(void *arg) {
    chk *c = arg;
    uint64_t t;
    for (int i = 0; i < 2000; i++) c->ok += ks_keyring_check(c->k, "stay", &t);
    return NULL;
}

static void test_keyring_threads(void **state) {
    (void)state;
    char p[64];
    snprintf(p, sizeof p, "%s", write_file("stay\n"));
    ks_keyring *k = NULL;
    char err[256];
    assert_int_equal(ks_keyring_create(NULL, 0, p, &k, err, sizeof err), 0);
    pthread_t th[4];
    chk c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (chk){.k = k};
        assert_int_equal(pthread_create(&th[i], NULL, checker, &c[i]), 0);
    }
    for (int i = 0; i < 50; i++) {
        rewrite(p, i % 2 ? "stay\nother\n" : "stay\n");
        ks_keyring_reload(k);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(c[i].ok, 2000); /* "stay" is in every version */
    }
    ks_keyring_free(k);
    unlink(p);
}

/* ------------------------------------------------------ conversations */
static void test_convstore_owner(void **state) {
    (void)state;
    ks_convstore *cs = ks_convstore_create(8, 60);
    assert_non_null(cs);
    assert_int_equal(ks_convstore_put(cs, "resp_a", 0xA, json_array()), 0);
    json_t *m = ks_convstore_get(cs, "resp_a", 0xA);
    assert_non_null(m);
    json_decref(m);
    assert_null(ks_convstore_get(cs, "resp_a", 0xB));
    assert_null(ks_convstore_get(cs, "resp_a", 0));
    assert_null(ks_convstore_get(cs, "resp_b", 0xA));
    ks_convstore_free(cs);
}

/* ------------------------------------------------------------ settings */
static void test_config_tenant_settings(void **state) {
    (void)state;
    ks_config c;
    ks_config_defaults(&c);
    assert_int_equal(c.n_api_keys, 0);
    assert_false(c.share_system_prompt);
    char err[512] = "";
    const char *yaml = "api_key: one\napi_keys: [two, three]\napi_key_file: /etc/kvstash/keys\n"
                       "tenant_by: prompt_cache_key,user\nshare_system_prompt: true\n";
    assert_int_equal(ks_config_load_string(&c, yaml, err, sizeof err), 0);
    assert_string_equal(c.api_key, "one");
    assert_int_equal(c.n_api_keys, 2);
    assert_string_equal(c.api_keys[0], "two");
    assert_string_equal(c.api_keys[1], "three");
    assert_string_equal(c.api_key_file, "/etc/kvstash/keys");
    assert_string_equal(c.tenant_by, "prompt_cache_key,user");
    assert_true(c.share_system_prompt);
    /* one key as a scalar; a later file's list replaces the whole list */
    assert_int_equal(ks_config_load_string(&c, "api_keys: four\n", err, sizeof err), 0);
    assert_int_equal(c.n_api_keys, 1);
    assert_string_equal(c.api_keys[0], "four");
    /* refused, naming the key, and nothing changed */
    ks_config before = c;
    assert_int_equal(ks_config_load_string(&c, "api_keys: [a, '']\n", err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "api_keys[1]"));
    char many[512] = "api_keys: [";
    for (int i = 0; i < KS_CONFIG_KEYS_MAX + 1; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%sk%d", i ? ", " : "", i);
    strcat(many, "]\n");
    assert_int_equal(ks_config_load_string(&c, many, err, sizeof err), KS_EINVAL);
    assert_int_equal(ks_config_load_string(&c, "share_system_prompt: maybe\n", err, sizeof err), KS_EINVAL);
    assert_memory_equal(&before, &c, sizeof c);
}

int main(void) {
    ks_log_set_level(KS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_tenant),
        cmocka_unit_test(test_msghash_tenant),
        cmocka_unit_test(test_route_other_tenant_shares_nothing),
        cmocka_unit_test(test_route_lru_own_tenant_first),
        cmocka_unit_test(test_ids_random_128_bits),
        cmocka_unit_test(test_keyring_tenants),
        cmocka_unit_test(test_keyring_file),
        cmocka_unit_test(test_keyring_threads),
        cmocka_unit_test(test_convstore_owner),
        cmocka_unit_test(test_config_tenant_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_redis_fmt.c — the pure logic of the redis tier (src/cache/redis_fmt.c)
 * and the in-memory kvfile it stores (kvfile.c): URLs (every accepted form,
 * refusals, credentials that never appear in messages or redacted URLs),
 * chunk arithmetic, manifests (round trip, every malformed or inconsistent
 * one refused), members, and ks_kvfile_encode/decode (the same bytes as a
 * file, every flipped byte and truncation refused). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/redis_fmt.h"
#include "cache/store_cfg.h"

static void test_url_forms(void **state) {
    (void)state;
    ks_redis_url u;
    char err[256];
    assert_int_equal(ks_redis_url_parse("redis://localhost", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "localhost");
    assert_int_equal(u.port, 6379);
    assert_int_equal(u.db, 0);
    assert_false(u.tls);
    assert_false(u.unix_socket);
    assert_string_equal(u.password, "");

    assert_int_equal(ks_redis_url_parse("redis://user:s3cr%40t@10.0.0.7:6390/4", &u, err, sizeof err), 0);
    assert_string_equal(u.user, "user");
    assert_string_equal(u.password, "s3cr@t");
    assert_string_equal(u.host, "10.0.0.7");
    assert_int_equal(u.port, 6390);
    assert_int_equal(u.db, 4);

    assert_int_equal(ks_redis_url_parse("redis://:only@h:1", &u, err, sizeof err), 0);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "only");

    assert_int_equal(ks_redis_url_parse("rediss://[::1]:6380", &u, err, sizeof err), 0);
    assert_true(u.tls);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 6380);

    assert_int_equal(ks_redis_url_parse("unix:///run/redis/redis.sock", &u, err, sizeof err), 0);
    assert_true(u.unix_socket);
    assert_string_equal(u.path, "/run/redis/redis.sock");

    assert_int_equal(ks_redis_url_parse("redis+unix://app:pw@/tmp/r.sock?db=2", &u, err, sizeof err), 0);
    assert_true(u.unix_socket);
    assert_string_equal(u.path, "/tmp/r.sock");
    assert_string_equal(u.user, "app");
    assert_string_equal(u.password, "pw");
    assert_int_equal(u.db, 2);
    assert_int_equal(ks_redis_url_parse("redis://h:7/?db=3", &u, err, sizeof err), 0);
    assert_int_equal(u.db, 3);
}

static void test_url_refused(void **state) {
    (void)state;
    ks_redis_url u;
    char err[256];
    const char *bad[] = {
        "", "localhost:6379", "http://h", "redis://", "redis://h:0", "redis://h:65536", "redis://h:x",
        "redis://h/abc", "redis://h/1/2", "unix://relative.sock", "unix://", "redis://[::1", "redis://h?foo=1",
        "redis://u:bad%zz@h", "redis://u:bad%4@h", "redis://u:%00@h",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        int rc = ks_redis_url_parse(bad[i], &u, err, sizeof err);
        if (rc != KS_EINVAL) fail_msg("'%s' accepted (rc %d)", bad[i], rc);
        assert_true(err[0] != '\0');
    }
    /* A password never reaches a message. */
    assert_int_equal(ks_redis_url_parse("redis://u:hunter2@h:99999", &u, err, sizeof err), KS_EINVAL);
    assert_null(strstr(err, "hunter2"));
    assert_int_equal(ks_redis_url_parse(NULL, &u, err, sizeof err), KS_EINVAL);
}

static void test_url_redact(void **state) {
    (void)state;
    char out[256];
    ks_redis_url_redact("redis://user:hunter2@h:6379/1", out, sizeof out);
    assert_string_equal(out, "redis://user:***@h:6379/1");
    ks_redis_url_redact("redis://:hunter2@h", out, sizeof out);
    assert_string_equal(out, "redis://:***@h");
    ks_redis_url_redact("redis+unix://a:hunter2@/tmp/s.sock", out, sizeof out);
    assert_string_equal(out, "redis+unix://a:***@/tmp/s.sock");
    /* '@' inside the password (not percent-encoded): still hidden whole. */
    ks_redis_url_redact("redis://u:hun@ter2@h", out, sizeof out);
    assert_null(strstr(out, "hun"));
    assert_null(strstr(out, "ter2"));
    ks_redis_url_redact("redis://user@h", out, sizeof out);
    assert_string_equal(out, "redis://user@h");
    ks_redis_url_redact("unix:///tmp/s.sock", out, sizeof out);
    assert_string_equal(out, "unix:///tmp/s.sock");
    /* Truncation never exposes it either. */
    char tiny[12];
    ks_redis_url_redact("redis://u:hunter2@h", tiny, sizeof tiny);
    assert_null(strstr(tiny, "hunt"));
}

static void test_chunks(void **state) {
    (void)state;
    assert_int_equal(ks_redis_n_chunks(0, 100), 0);
    assert_int_equal(ks_redis_n_chunks(1, 100), 1);
    assert_int_equal(ks_redis_n_chunks(100, 100), 1);
    assert_int_equal(ks_redis_n_chunks(101, 100), 2);
    assert_int_equal(ks_redis_n_chunks(1000, 100), 10);
    assert_int_equal(ks_redis_n_chunks(5, 0), 0);
    /* The ranges tile [0, total) exactly, every chunk but the last full. */
    const uint64_t totals[] = {1, 99, 100, 101, 250, 1000, 65537};
    for (size_t k = 0; k < sizeof totals / sizeof totals[0]; k++) {
        uint64_t total = totals[k], at = 0;
        uint32_t n = ks_redis_n_chunks(total, 100);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t off, len;
            ks_redis_chunk_range(total, 100, i, &off, &len);
            assert_int_equal(off, at);
            assert_true(len > 0 && len <= 100);
            if (i + 1 < n) assert_int_equal(len, 100);
            at += len;
        }
        assert_int_equal(at, total);
    }
}

static ks_redis_manifest sample_manifest(void) {
    ks_redis_manifest m = {
        .n_tokens = 300,
        .reason = KS_REASON_FINISH,
        .created_us = 1700000000123456LL,
        .chunk_bytes = 65536,
        .csum = 0x0123456789abcdefULL,
        .nonce = 0xfedcba9876543210ULL,
    };
    m.total = ks_kvfile_size(300, 200000);
    m.n_chunks = ks_redis_n_chunks(m.total, m.chunk_bytes);
    return m;
}

static void test_manifest_round_trip(void **state) {
    (void)state;
    ks_redis_manifest m = sample_manifest(), back;
    char line[256];
    int n = ks_redis_manifest_encode(&m, line, sizeof line);
    assert_true(n > 0 && (size_t)n == strlen(line));
    assert_int_equal(ks_redis_manifest_decode(line, (size_t)n, &back), 0);
    assert_memory_equal(&m, &back, sizeof m);
    char small[20];
    assert_int_equal(ks_redis_manifest_encode(&m, small, sizeof small), KS_EINVAL);
}

static void test_manifest_refused(void **state) {
    (void)state;
    ks_redis_manifest m = sample_manifest(), back;
    char line[200], bad[256];
    int n = ks_redis_manifest_encode(&m, line, sizeof line);
    /* Every truncation. */
    for (int k = 0; k < n; k++)
        if (ks_redis_manifest_decode(line, (size_t)k, &back) == 0 && k != n)
            fail_msg("truncated to %d bytes accepted", k);
    /* Inconsistent numbers: each would make a reader allocate or index wrong. */
    ks_redis_manifest x;
    x = m, x.n_chunks++;
    ks_redis_manifest_encode(&x, bad, sizeof bad);
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &back), KS_ECORRUPT);
    x = m, x.chunk_bytes = 1000;
    x.n_chunks = ks_redis_n_chunks(x.total, 1000);
    ks_redis_manifest_encode(&x, bad, sizeof bad);
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &back), KS_ECORRUPT);
    x = m, x.reason = KS_REASON__N;
    ks_redis_manifest_encode(&x, bad, sizeof bad);
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &back), KS_ECORRUPT);
    x = m, x.total = 10, x.n_chunks = 1;
    ks_redis_manifest_encode(&x, bad, sizeof bad);
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &back), KS_ECORRUPT);
    x = m, x.n_tokens = KS_KVFILE_MAX_TOKENS + 1;
    ks_redis_manifest_encode(&x, bad, sizeof bad);
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &back), KS_ECORRUPT);
    /* Another version; garbage; signs, spaces and trailing text. */
    snprintf(bad, sizeof bad, "%s", line);
    bad[14] = '2';
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &back), KS_EVERSION);
    const char *junk[] = {"", "kvstash-redis", "hello world", "kvstash-redis 1 -300 2 1 1 1 1 0 0"};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++)
        assert_int_equal(ks_redis_manifest_decode(junk[i], strlen(junk[i]), &back), KS_ECORRUPT);
    snprintf(bad, sizeof bad, "%s x", line);
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &back), KS_ECORRUPT);
    snprintf(bad, sizeof bad, "%s", line);
    bad[20] = '\0'; /* an embedded NUL within the given length */
    assert_int_equal(ks_redis_manifest_decode(bad, (size_t)n, &back), KS_ECORRUPT);
}

static void test_member(void **state) {
    (void)state;
    uint8_t fp[32], fp2[32];
    ks_key k, k2;
    for (int i = 0; i < 32; i++) fp[i] = (uint8_t)(i * 7), k.b[i] = (uint8_t)(255 - i);
    char m[KS_REDIS_MEMBER_LEN + 1];
    ks_redis_member(fp, &k, m);
    assert_int_equal(strlen(m), KS_REDIS_MEMBER_LEN);
    assert_int_equal(ks_redis_member_parse(m, strlen(m), fp2, &k2), 0);
    assert_memory_equal(fp, fp2, 32);
    assert_true(ks_key_eq(&k, &k2));
    assert_int_equal(ks_redis_member_parse(m, strlen(m) - 1, fp2, &k2), KS_EINVAL);
    m[64] = '-';
    assert_int_equal(ks_redis_member_parse(m, KS_REDIS_MEMBER_LEN, fp2, &k2), KS_EINVAL);
}

/* ks_kvfile_encode writes the bytes ks_kvfile_write does; decode checks them. */
static void test_kvfile_in_memory(void **state) {
    (void)state;
    ks_kvfile_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.state_version = 3;
    meta.reason = KS_REASON_FINISH;
    meta.created_us = 1234567;
    for (int i = 0; i < 32; i++) meta.model_fp[i] = (uint8_t)i, meta.params_hash[i] = (uint8_t)(i + 1), meta.key.b[i] = (uint8_t)(i + 2);
    int32_t toks[7] = {5, 4, 3, 2, 1, 0, 70000};
    uint8_t payload[1000];
    for (int i = 0; i < 1000; i++) payload[i] = (uint8_t)(i * 31);
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(ks_kvfile_encode(&meta, toks, 7, payload, sizeof payload, &buf, &len), 0);
    assert_int_equal(len, ks_kvfile_size(7, sizeof payload));

    /* Byte for byte what the file tier writes. */
    char dir[] = "/tmp/ks-redisfmt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(ks_kvfile_write(dir, &meta, toks, 7, payload, sizeof payload, NULL, NULL, NULL), 0);
    char path[1200];
    ks_kvfile_path(dir, &meta.key, path, sizeof path);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *file = malloc(len + 1);
    assert_int_equal(fread(file, 1, len + 1, f), len);
    fclose(f);
    assert_memory_equal(file, buf, len);
    free(file);
    unlink(path);
    rmdir(dir);

    ks_kvfile_expect exp = {.model_fp = meta.model_fp, .params_hash = meta.params_hash, .check_state_version = true,
                            .state_version = 3, .key = &meta.key, .tokens = toks, .n_tokens = 7};
    ks_kvfile_meta got;
    size_t off = 0;
    assert_int_equal(ks_kvfile_decode(buf, len, &exp, &got, &off), 0);
    assert_int_equal(got.n_tokens, 7);
    assert_int_equal(got.payload_len, sizeof payload);
    assert_memory_equal(buf + off, payload, sizeof payload);

    /* Every flipped byte before the trailer, every truncation: refused. */
    size_t body = len - KS_KVFILE_TRAILER_LEN;
    for (size_t i = 0; i < body; i++) {
        buf[i] ^= 0x40;
        int rc = ks_kvfile_decode(buf, len, &exp, NULL, NULL);
        buf[i] ^= 0x40;
        if (rc == 0) fail_msg("flipped byte %zu accepted", i);
    }
    for (size_t k = 0; k < len; k++)
        if (ks_kvfile_decode(buf, k, &exp, NULL, NULL) == 0) fail_msg("truncated to %zu accepted", k);
    /* Other tokens, model, state version. */
    int32_t other[7] = {5, 4, 3, 2, 1, 0, 70001};
    ks_kvfile_expect e2 = exp;
    e2.tokens = other;
    assert_int_equal(ks_kvfile_decode(buf, len, &e2, NULL, NULL), KS_EMISMATCH);
    e2 = exp;
    e2.state_version = 4;
    assert_int_equal(ks_kvfile_decode(buf, len, &e2, NULL, NULL), KS_EVERSION);
    uint8_t fp2[32] = {0};
    e2 = exp;
    e2.model_fp = fp2;
    assert_int_equal(ks_kvfile_decode(buf, len, &e2, NULL, NULL), KS_EMISMATCH);
    assert_int_equal(ks_kvfile_decode(NULL, 0, &exp, NULL, NULL), KS_ECORRUPT);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_forms),
        cmocka_unit_test(test_url_refused),
        cmocka_unit_test(test_url_redact),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_manifest_round_trip),
        cmocka_unit_test(test_manifest_refused),
        cmocka_unit_test(test_member),
        cmocka_unit_test(test_kvfile_in_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_kvmac.c — authenticated stored states (issue 28; src/cache/kvmac.c,
 * the KS_KVFILE_FLAG_MAC part of src/cache/kvfile.c): a forged entry whose
 * checksum was recomputed is refused when the reader has the secret (the
 * probe of issue 28 passed without one), an entry written without a secret
 * or under another secret is refused, every flipped byte before the trailer
 * is refused, files and in-memory (redis) entries alike; secret files that
 * are too short or readable by others are refused. */
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/kvmac.h"
#include "cache/redis_fmt.h"
#include "cache/store_cfg.h"

typedef struct fx {
    char dir[64];
    char path[PATH_MAX];
    uint8_t fp[32], params[32];
    ks_key key;
    int32_t toks[5];
    uint8_t payload[3000];
    ks_kvfile_meta meta;
    ks_kvmac_key k1, k2;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/ks-kvmac-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    for (int i = 0; i < 32; i++) {
        f->fp[i] = (uint8_t)(0xa0 + i);
        f->params[i] = (uint8_t)(0x10 + i);
    }
    int32_t t[5] = {1, 17, 99999, 5, -3};
    memcpy(f->toks, t, sizeof t);
    for (size_t i = 0; i < sizeof f->payload; i++) f->payload[i] = (uint8_t)(i * 31 + 7);
    ks_key_compute(f->fp, "kv", 2, f->toks, 5, &f->key);
    f->meta.state_version = 3;
    f->meta.reason = KS_REASON_FINISH;
    f->meta.created_us = 1700000000123456ll;
    memcpy(f->meta.model_fp, f->fp, 32);
    memcpy(f->meta.params_hash, f->params, 32);
    f->meta.key = f->key;
    ks_kvfile_path(f->dir, &f->key, f->path, sizeof f->path);
    if (ks_kvmac_key_from_secret("correct horse battery staple", 28, &f->k1) != 0) return -1;
    if (ks_kvmac_key_from_secret("another deployment secret!!", 27, &f->k2) != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static ks_kvfile_expect expect_all(fx *f, const ks_kvmac_key *mac) {
    ks_kvfile_expect e = {.model_fp = f->fp, .params_hash = f->params, .check_state_version = true,
                          .state_version = 3, .key = &f->key, .tokens = f->toks, .n_tokens = 5, .mac = mac};
    return e;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)sz, fp), (size_t)sz);
    fclose(fp);
    *n = (size_t)sz;
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t n) {
    unlink(path);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b, 1, n, fp), n);
    fclose(fp);
}

static void write_file(fx *f, const ks_kvmac_key *mac) {
    unlink(f->path);
    f->meta.mac = mac;
    uint64_t bytes = 0;
    assert_int_equal(ks_kvfile_write(f->dir, &f->meta, f->toks, 5, f->payload, sizeof f->payload, NULL, &bytes, NULL),
                     0);
    assert_int_equal(bytes, KS_KVFILE_HEADER_LEN + 5 * 4 + sizeof f->payload + KS_KVFILE_TAIL_LEN +
                                (mac ? KS_KVFILE_MAC_LEN : 0));
    f->meta.mac = NULL;
}

/* The forger of issue 28: change a payload byte and recompute the XXH3
 * checksum (a file tier: the checksum sits after the payload). */
static void forge(uint8_t *b, size_t n, size_t body) {
    b[body - 10] ^= 0x5a;
    uint64_t h = XXH3_64bits(b, body);
    if (!h) h = KS_KVFILE_CSUM_ZERO;
    memcpy(b + body, &h, 8); /* little-endian host */
    (void)n;
}

static void test_round_trip_and_refusals(void **state) {
    fx *f = *state;
    ks_kvfile_expect e1 = expect_all(f, &f->k1), e2 = expect_all(f, &f->k2), e0 = expect_all(f, NULL);
    ks_kvfile_meta m;
    uint8_t *payload = NULL;

    write_file(f, &f->k1);
    assert_int_equal(ks_kvfile_read(f->path, &e1, &m, NULL, &payload), 0);
    assert_true(m.flags & KS_KVFILE_FLAG_MAC);
    assert_memory_equal(payload, f->payload, sizeof f->payload);
    free(payload);
    /* without the secret: read like any entry (only the checksum) */
    assert_int_equal(ks_kvfile_read(f->path, &e0, NULL, NULL, NULL), 0);
    /* another secret */
    assert_int_equal(ks_kvfile_read(f->path, &e2, NULL, NULL, NULL), KS_ECORRUPT);
    /* the trailer stays outside: touching keeps the tag valid */
    assert_int_equal(ks_kvfile_touch(f->path, 1700000000999999ll, 3, 1800000000000000ll), 0);
    assert_int_equal(ks_kvfile_read(f->path, &e1, &m, NULL, NULL), 0);
    assert_int_equal(m.hits, 3);
    assert_int_equal(m.pin_until_us, 1800000000000000ll);

    /* an entry written without a secret is refused by a reader with one */
    write_file(f, NULL);
    assert_int_equal(ks_kvfile_read(f->path, &e0, NULL, NULL, NULL), 0);
    assert_int_equal(ks_kvfile_read(f->path, &e1, NULL, NULL, NULL), KS_ECORRUPT);
}

/* The probe of issue 28: a forged state with a recomputed checksum passed. */
static void test_forged_checksum_refused(void **state) {
    fx *f = *state;
    ks_kvfile_expect e1 = expect_all(f, &f->k1), e0 = expect_all(f, NULL);
    size_t n = 0;

    write_file(f, &f->k1);
    uint8_t *b = slurp(f->path, &n);
    size_t body = n - KS_KVFILE_TAIL_LEN - KS_KVFILE_MAC_LEN;
    forge(b, n, body);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, &e0, NULL, NULL, NULL), 0); /* the checksum alone is fooled */
    assert_int_equal(ks_kvfile_read(f->path, &e1, NULL, NULL, NULL), KS_ECORRUPT);
    /* and stripping the tag (flag off, header resealed) cannot help: no tag, refused */
    free(b);

    /* every flipped byte before the trailer is refused with the key */
    write_file(f, &f->k1);
    b = slurp(f->path, &n);
    for (size_t i = 0; i < n - KS_KVFILE_TRAILER_LEN; i++) {
        b[i] ^= 0x01;
        spit(f->path, b, n);
        if (ks_kvfile_read(f->path, &e1, NULL, NULL, NULL) == 0) fail_msg("flip of byte %zu read", i);
        b[i] ^= 0x01;
    }
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, &e1, NULL, NULL, NULL), 0);
    free(b);
}

/* The redis tier's bytes: encode/decode, same rules. */
static void test_in_memory(void **state) {
    fx *f = *state;
    ks_kvfile_expect e1 = expect_all(f, &f->k1), e2 = expect_all(f, &f->k2), e0 = expect_all(f, NULL);
    uint8_t *buf = NULL, *plain = NULL;
    size_t len = 0, plen = 0, off = 0;
    f->meta.mac = &f->k1;
    assert_int_equal(ks_kvfile_encode(&f->meta, f->toks, 5, f->payload, sizeof f->payload, &buf, &len), 0);
    f->meta.mac = NULL;
    assert_int_equal(len, ks_kvfile_size_flags(5, sizeof f->payload, KS_KVFILE_FLAG_PIN | KS_KVFILE_FLAG_MAC));
    assert_int_equal(ks_kvfile_decode(buf, len, &e1, NULL, &off), 0);
    assert_memory_equal(buf + off, f->payload, sizeof f->payload);
    assert_int_equal(ks_kvfile_decode(buf, len, &e0, NULL, NULL), 0);
    assert_int_equal(ks_kvfile_decode(buf, len, &e2, NULL, NULL), KS_ECORRUPT);
    size_t body = len - KS_KVFILE_TAIL_LEN - KS_KVFILE_MAC_LEN;
    forge(buf, len, body);
    assert_int_equal(ks_kvfile_decode(buf, len, &e0, NULL, NULL), 0);
    assert_int_equal(ks_kvfile_decode(buf, len, &e1, NULL, NULL), KS_ECORRUPT);
    assert_int_equal(ks_kvfile_encode(&f->meta, f->toks, 5, f->payload, sizeof f->payload, &plain, &plen), 0);
    assert_int_equal(ks_kvfile_decode(plain, plen, &e1, NULL, NULL), KS_ECORRUPT);
    free(buf);
    free(plain);
}

static void test_secret_files(void **state) {
    fx *f = *state;
    char p[PATH_MAX], err[256];
    ks_kvmac_key k;
    snprintf(p, sizeof p, "%s/secret", f->dir);
    spit(p, (const uint8_t *)"short\n", 6);
    chmod(p, 0600);
    assert_int_equal(ks_kvmac_key_load_file(p, &k, err, sizeof err), KS_EINVAL);
    spit(p, (const uint8_t *)"correct horse battery staple\n", 29);
    chmod(p, 0644);
    assert_int_equal(ks_kvmac_key_load_file(p, &k, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "others"));
    assert_null(strstr(err, "horse")); /* never the content */
    chmod(p, 0640);
    assert_int_equal(ks_kvmac_key_load_file(p, &k, err, sizeof err), 0);
    assert_memory_equal(k.k, f->k1.k, sizeof k.k); /* the newline is not part of the secret */
    snprintf(p, sizeof p, "%s/none", f->dir);
    assert_int_equal(ks_kvmac_key_load_file(p, &k, err, sizeof err), KS_ENOENT);
    assert_int_equal(ks_kvmac_key_from_secret("0123456789abcde", 15, &k), KS_EINVAL);
}

/* Redis manifests: tagged with the secret, bound to their key; an untagged
 * line (written without the secret) still parses, and fails the check. */
static void test_redis_manifest(void **state) {
    fx *f = *state;
    ks_redis_manifest m = {.n_tokens = 300, .reason = 2, .created_us = 1700000000000000ll, .chunk_bytes = 4194240,
                           .csum = 0x1234, .nonce = 0xabcdef};
    m.total = ks_kvfile_size(300, 200000) + KS_KVFILE_MAC_LEN;
    m.n_chunks = ks_redis_n_chunks(m.total, m.chunk_bytes);
    const char *member = "aa:bb", *other = "aa:bc";
    char line[256];
    ks_redis_manifest d;
    int n = ks_redis_manifest_encode(&m, line, sizeof line);
    assert_true(n > 0);
    assert_int_equal(ks_redis_manifest_decode(line, (size_t)n, &d), 0);
    assert_false(d.tagged);
    assert_false(ks_redis_manifest_verify(&f->k1, member, &d)); /* written without the secret */
    assert_int_equal(ks_redis_manifest_sign(&f->k1, member, &m), 0);
    n = ks_redis_manifest_encode(&m, line, sizeof line);
    assert_true(n > 0);
    assert_int_equal(ks_redis_manifest_decode(line, (size_t)n, &d), 0);
    assert_true(d.tagged);
    assert_true(ks_redis_manifest_verify(&f->k1, member, &d));
    assert_false(ks_redis_manifest_verify(&f->k2, member, &d)); /* another secret */
    assert_false(ks_redis_manifest_verify(&f->k1, other, &d));  /* moved to another key */
    d.n_tokens = 299;                                              /* a field changed */
    assert_false(ks_redis_manifest_verify(&f->k1, member, &d));
    /* not canonical: upper-case hex, a short tag, trailing bytes */
    char bad[300];
    snprintf(bad, sizeof bad, "%s", line);
    for (char *p = bad + n - 32; *p; p++)
        if (*p >= 'a' && *p <= 'f') *p = (char)(*p - 'a' + 'A');
    if (strcmp(bad, line) != 0) assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &d), KS_ECORRUPT);
    assert_int_equal(ks_redis_manifest_decode(line, (size_t)n - 1, &d), KS_ECORRUPT);
    snprintf(bad, sizeof bad, "%s 00", line);
    assert_int_equal(ks_redis_manifest_decode(bad, strlen(bad), &d), KS_ECORRUPT);
}

int main(void) {
    ks_log_set_level(KS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_and_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forged_checksum_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redis_manifest, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

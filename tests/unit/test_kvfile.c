/* test_kvfile.c — the kvfile format (src/cache/kvfile.c): round trip, every
 * flipped byte and every truncation refused, version and identity checks,
 * trailer updates (hits, pins) that keep the checksum valid, files of the
 * layout before pins still read, names that are not regular files refused
 * without blocking or following. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/store_cfg.h"
#include "cache/kvfile.h"

typedef struct fx {
    char dir[64];
    char path[PATH_MAX];
    uint8_t fp[32], params[32];
    ks_key key;
    int32_t toks[5];
    uint8_t payload[300];
    ks_kvfile_meta meta;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/ks-kvf-XXXXXX");
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

static void write_ok(fx *f) {
    bool existed = true;
    uint64_t bytes = 0;
    char orphan[PATH_MAX];
    int rc = ks_kvfile_write(f->dir, &f->meta, f->toks, 5, f->payload, sizeof f->payload, &existed,
                             &bytes, orphan);
    assert_int_equal(rc, 0);
    assert_false(existed);
    assert_string_equal(orphan, "");
    assert_int_equal(bytes, KS_KVFILE_HEADER_LEN + 5 * 4 + sizeof f->payload + KS_KVFILE_TAIL_LEN);
}

static ks_kvfile_expect expect_all(fx *f) {
    ks_kvfile_expect e = {.model_fp = f->fp,
                          .params_hash = f->params,
                          .check_state_version = true,
                          .state_version = 3,
                          .key = &f->key,
                          .tokens = f->toks,
                          .n_tokens = 5};
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
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (n) assert_int_equal(fwrite(b, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0 && strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static void test_round_trip(void **state) {
    fx *f = *state;
    write_ok(f);
    assert_int_equal(count_entries(f->dir, "."), 0); /* no temp file left */
    ks_kvfile_meta m;
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), 0);
    assert_int_equal(m.version, KS_KVFILE_VERSION);
    assert_int_equal(m.state_version, 3);
    assert_int_equal(m.reason, KS_REASON_FINISH);
    assert_int_equal(m.n_tokens, 5);
    assert_int_equal(m.payload_len, sizeof f->payload);
    assert_int_equal(m.created_us, 1700000000123456ll);
    assert_int_equal(m.last_hit_us, m.created_us);
    assert_int_equal(m.hits, 0);
    assert_true(m.trailer_ok);
    assert_memory_equal(m.model_fp, f->fp, 32);
    assert_memory_equal(m.params_hash, f->params, 32);
    assert_true(ks_key_eq(&m.key, &f->key));

    ks_kvfile_expect e = expect_all(f);
    int32_t *toks = NULL;
    uint8_t *payload = NULL;
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, &toks, &payload), 0);
    assert_memory_equal(toks, f->toks, sizeof f->toks);
    assert_memory_equal(payload, f->payload, sizeof f->payload);
    free(toks);
    free(payload);
    /* verify-only and no expectations */
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), 0);

    /* A second write of the same key publishes nothing and says so. */
    bool existed = false;
    uint8_t other[10] = {0};
    assert_int_equal(ks_kvfile_write(f->dir, &f->meta, f->toks, 5, other, sizeof other, &existed, NULL, NULL), 0);
    assert_true(existed);
    assert_int_equal(ks_kvfile_read(f->path, &e, NULL, NULL, &payload), 0);
    assert_memory_equal(payload, f->payload, sizeof f->payload);
    free(payload);
    assert_int_equal(count_entries(f->dir, "."), 0);
    /* an empty payload and no tokens are valid too */
    ks_kvfile_meta m0 = f->meta;
    m0.key.b[0] ^= 0xff;
    char p0[PATH_MAX];
    ks_kvfile_path(f->dir, &m0.key, p0, sizeof p0);
    assert_int_equal(ks_kvfile_write(f->dir, &m0, NULL, 0, NULL, 0, NULL, NULL, NULL), 0);
    payload = NULL;
    assert_int_equal(ks_kvfile_read(p0, NULL, &m, NULL, &payload), 0);
    assert_int_equal(m.n_tokens, 0);
    assert_int_equal(m.payload_len, 0);
    free(payload);
    assert_int_equal(m.flags, KS_KVFILE_FLAG_PIN);
}

static void reseal(uint8_t *b);

/* A reason added after pins (checkpoint) sets flag REASON6, so that a
 * reader from before it refuses the file (another version) rather than
 * quarantining it as corrupt; this reader takes it. */
/* The tenant a state belongs to is in the header (the bytes that were
 * "reserved, 0" before tenants: 0 is the single tenant, as every file from
 * before reads), covered by the header check; the in-memory form too. */
static void test_tenant(void **state) {
    fx *f = *state;
    write_ok(f); /* a writer that names no tenant: 0 */
    ks_kvfile_meta m;
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), 0);
    assert_int_equal(m.tenant, 0);
    unlink(f->path);
    f->meta.tenant = 0x1122334455667788ull;
    write_ok(f);
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), 0);
    assert_true(m.tenant == 0x1122334455667788ull);
    ks_kvfile_expect e = expect_all(f);
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
    assert_true(m.tenant == 0x1122334455667788ull);
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(ks_kvfile_encode(&f->meta, f->toks, 5, f->payload, sizeof f->payload, &buf, &len), 0);
    memset(&m, 0, sizeof m);
    assert_int_equal(ks_kvfile_decode(buf, len, &e, &m, NULL), 0);
    assert_true(m.tenant == 0x1122334455667788ull);
    free(buf);
    f->meta.tenant = 0;
}

static void test_reason_after_pins(void **state) {
    fx *f = *state;
    f->meta.reason = KS_REASON_CHECKPOINT;
    write_ok(f);
    ks_kvfile_meta m;
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), 0);
    assert_int_equal(m.reason, KS_REASON_CHECKPOINT);
    assert_int_equal(m.flags, KS_KVFILE_FLAG_PIN | KS_KVFILE_FLAG_REASON6);
    ks_kvfile_expect e = expect_all(f);
    assert_int_equal(ks_kvfile_read(f->path, &e, NULL, NULL, NULL), 0);
    assert_int_equal(ks_kvfile_touch(f->path, 5, 2, 0), 0);
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
    assert_int_equal(m.hits, 2);
    assert_int_equal(m.reason, KS_REASON_CHECKPOINT);

    /* The flag without such a reason, or such a reason without the flag: no
     * kvstash wrote that file (a rewrite would differ); corrupt (found by
     * fuzz_kvfile). */
    uint8_t b[4096];
    FILE *fp = fopen(f->path, "rb");
    assert_non_null(fp);
    size_t n = fread(b, 1, sizeof b, fp);
    fclose(fp);
    uint32_t finish = KS_REASON_FINISH, pin_only = KS_KVFILE_FLAG_PIN;
    for (int k = 0; k < 2; k++) {
        uint8_t c[4096];
        memcpy(c, b, n);
        if (k == 0) memcpy(c + 20, &finish, 4);   /* reason finish, flag REASON6 */
        else memcpy(c + 28, &pin_only, 4);        /* reason checkpoint, no REASON6 */
        reseal(c);
        spit(f->path, c, n);
        assert_int_equal(ks_kvfile_read_meta(f->path, &m), KS_ECORRUPT);
    }
}

/* ks_kvfile_read_buf: the payload lands in the caller's buffer, reused when
 * big enough, replaced when too small; a failed read keeps a valid buffer. */
static void test_read_into_buffer(void **state) {
    fx *f = *state;
    write_ok(f);
    ks_kvfile_expect e = {.model_fp = f->fp, .params_hash = f->params, .key = &f->key, .tokens = f->toks,
                          .n_tokens = 5};
    uint8_t *buf = malloc(10);
    size_t cap = 10;
    ks_kvfile_meta m;
    assert_int_equal(ks_kvfile_read_buf(f->path, &e, &m, &buf, &cap), 0); /* too small: replaced */
    assert_int_equal(cap, sizeof f->payload);
    assert_memory_equal(buf, f->payload, sizeof f->payload);
    assert_int_equal(m.payload_len, sizeof f->payload);
    uint8_t *big = realloc(buf, 4096);
    assert_non_null(big);
    buf = big;
    cap = 4096;
    memset(buf, 0, cap);
    assert_int_equal(ks_kvfile_read_buf(f->path, &e, NULL, &buf, &cap), 0); /* big enough: reused */
    assert_ptr_equal(buf, big);
    assert_int_equal(cap, 4096);
    assert_memory_equal(buf, f->payload, sizeof f->payload);
    int32_t other[5] = {1, 17, 99999, 5, -4};
    e.tokens = other; /* a mismatch: an error, the buffer stays ours */
    assert_int_equal(ks_kvfile_read_buf(f->path, &e, NULL, &buf, &cap), KS_EMISMATCH);
    assert_ptr_equal(buf, big);
    uint8_t *none = NULL;
    size_t ncap = 0;
    e.tokens = f->toks;
    assert_int_equal(ks_kvfile_read_buf(f->path, &e, NULL, &none, &ncap), 0); /* no buffer yet */
    assert_non_null(none);
    assert_memory_equal(none, f->payload, sizeof f->payload);
    assert_int_equal(ks_kvfile_read_buf(f->path, &e, NULL, NULL, &ncap), KS_EINVAL);
    free(none);
    free(buf);
}

static void test_names(void **state) {
    (void)state;
    ks_key k;
    char name[KS_KVFILE_NAME_LEN + 1], hex[KS_KEY_HEX_LEN + 1];
    for (int i = 0; i < 32; i++) k.b[i] = (uint8_t)(i * 3);
    ks_key_to_hex(&k, hex);
    snprintf(name, sizeof name, "%s.kvs", hex);
    ks_key back;
    assert_true(ks_kvfile_name_parse(name, &back));
    assert_true(ks_key_eq(&k, &back));
    name[0] = 'A'; /* upper case is not ours */
    assert_false(ks_kvfile_name_parse(name, NULL));
    assert_false(ks_kvfile_name_parse("abc.kvs", NULL));
    assert_false(ks_kvfile_name_parse("quarantine", NULL));
    pid_t pid = 0;
    assert_true(ks_kvfile_temp_parse(".0123456789abcdef.4242.7.tmp", &pid));
    assert_int_equal(pid, 4242);
    assert_false(ks_kvfile_temp_parse(".0123456789abcdef.x.7.tmp", &pid));
    assert_false(ks_kvfile_temp_parse("0123456789abcdef0.4242.7.tmp", &pid));
}

/* Flipping any bit of any byte before the trailer makes the file unreadable. */
static void test_flip_every_byte(void **state) {
    fx *f = *state;
    write_ok(f);
    size_t n;
    uint8_t *orig = slurp(f->path, &n);
    ks_kvfile_expect e = expect_all(f);
    for (size_t i = 0; i < n - KS_KVFILE_TRAILER_LEN; i++) {
        for (int bit = 0; bit < 8; bit += 7) {
            uint8_t *b = malloc(n);
            memcpy(b, orig, n);
            b[i] ^= (uint8_t)(1u << bit);
            spit(f->path, b, n);
            free(b);
            uint8_t *payload = NULL;
            int rc = ks_kvfile_read(f->path, &e, NULL, NULL, &payload);
            if (rc != KS_ECORRUPT) fail_msg("flip of byte %zu bit %d: rc %s", i, bit, ks_errname(rc));
            assert_null(payload);
            rc = ks_kvfile_read(f->path, NULL, NULL, NULL, NULL);
            if (rc != KS_ECORRUPT) fail_msg("flip of byte %zu (no expectations): rc %s", i, ks_errname(rc));
            /* A header byte is caught by the header check already. */
            if (i < KS_KVFILE_HEADER_LEN) assert_int_equal(ks_kvfile_read_meta(f->path, NULL), KS_ECORRUPT);
        }
    }
    /* Trailer bytes are outside the checks: the file still reads, the hit
     * statistics are dropped when their own check fails. */
    for (size_t i = n - KS_KVFILE_TRAILER_LEN; i < n; i++) {
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        b[i] ^= 0x01;
        spit(f->path, b, n);
        free(b);
        ks_kvfile_meta m;
        assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
        assert_false(m.trailer_ok);
        assert_int_equal(m.hits, 0);
        assert_int_equal(m.last_hit_us, m.created_us);
    }
    spit(f->path, orig, n);
    assert_int_equal(ks_kvfile_read(f->path, &e, NULL, NULL, NULL), 0);
    free(orig);
}

static void test_truncate_every_length(void **state) {
    fx *f = *state;
    write_ok(f);
    size_t n;
    uint8_t *orig = slurp(f->path, &n);
    for (size_t len = 0; len < n; len++) {
        spit(f->path, orig, len);
        int rc = ks_kvfile_read(f->path, NULL, NULL, NULL, NULL);
        if (rc != KS_ECORRUPT) fail_msg("truncated to %zu: rc %s", len, ks_errname(rc));
        rc = ks_kvfile_read_meta(f->path, NULL);
        if (rc != KS_ECORRUPT) fail_msg("truncated to %zu (meta): rc %s", len, ks_errname(rc));
    }
    /* one byte too many */
    uint8_t *b = malloc(n + 1);
    memcpy(b, orig, n);
    b[n] = 0;
    spit(f->path, b, n + 1);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);
    free(b);
    free(orig);
}

/* Rewrites header fields and re-seals the header check: what a writer of
 * another version (or a lying one) would produce. */
static void reseal(uint8_t *b) {
    uint64_t h = XXH3_64bits(b, 152);
    if (!h) h = KS_KVFILE_CSUM_ZERO;
    memcpy(b + 152, &h, 8);
}

static void test_versions_and_limits(void **state) {
    fx *f = *state;
    write_ok(f);
    size_t n;
    uint8_t *orig = slurp(f->path, &n);
    /* Returning here tells the optimizer that n is large enough for the
     * writes at n - KS_KVFILE_TAIL_LEN below (GCC's -Wstringop-overflow at -O3). */
    if (n < KS_KVFILE_HEADER_LEN + KS_KVFILE_TAIL_LEN) {
        free(orig);
        fail_msg("a kvfile of %zu bytes", n);
        return;
    }
    uint8_t *b = malloc(n);
    assert_non_null(b);
    ks_kvfile_expect e = expect_all(f);
    ks_kvfile_meta m;

    /* format version 2 */
    memcpy(b, orig, n);
    uint32_t v2 = 2;
    memcpy(b + 8, &v2, 4);
    reseal(b);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, &e, NULL, NULL, NULL), KS_EVERSION);
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), KS_EVERSION);
    assert_int_equal(m.version, 2);

    /* unknown flags (KS_KVFILE_FLAG_PIN and KS_KVFILE_FLAG_REASON6 are the known ones) */
    uint32_t unknown[] = {4, 0x80000000u, KS_KVFILE_FLAG_PIN | 4, KS_KVFILE_FLAG_REASON6 | 8};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        memcpy(b, orig, n);
        memcpy(b + 28, &unknown[i], 4);
        reseal(b);
        spit(f->path, b, n);
        assert_int_equal(ks_kvfile_read(f->path, &e, NULL, NULL, NULL), KS_EVERSION);
        assert_int_equal(ks_kvfile_touch(f->path, 1, 1, 0), KS_ECORRUPT);
    }

    /* huge lengths with a valid header: refused before any allocation */
    uint32_t big_n = KS_KVFILE_MAX_TOKENS;
    uint64_t big_len = KS_KVFILE_MAX_PAYLOAD;
    memcpy(b, orig, n);
    memcpy(b + 24, &big_n, 4);
    reseal(b);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);
    memcpy(b, orig, n);
    memcpy(b + 32, &big_len, 8);
    reseal(b);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);
    big_n = 0xffffffffu;
    memcpy(b, orig, n);
    memcpy(b + 24, &big_n, 4);
    reseal(b);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);
    /* header_len beyond the limit or the file */
    uint32_t hl = 1u << 30;
    memcpy(b, orig, n);
    memcpy(b + 12, &hl, 4);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);
    /* a reason out of range */
    uint32_t reason = KS_REASON__N;
    memcpy(b, orig, n);
    memcpy(b + 20, &reason, 4);
    reseal(b);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);

    /* A stored 0 never means "no checksum": zero the body checksum, and the header check. */
    memcpy(b, orig, n);
    memset(b + n - KS_KVFILE_TAIL_LEN, 0, 8);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);
    memcpy(b, orig, n);
    memset(b + 152, 0, 8);
    spit(f->path, b, n);
    assert_int_equal(ks_kvfile_read(f->path, NULL, NULL, NULL, NULL), KS_ECORRUPT);

    /* identity checks on a sound file */
    spit(f->path, orig, n);
    ks_kvfile_expect x = e;
    x.state_version = 4;
    assert_int_equal(ks_kvfile_read(f->path, &x, NULL, NULL, NULL), KS_EVERSION);
    x = e;
    uint8_t other[32];
    memcpy(other, f->fp, 32);
    other[0] ^= 1;
    x.model_fp = other;
    assert_int_equal(ks_kvfile_read(f->path, &x, NULL, NULL, NULL), KS_EMISMATCH);
    x = e;
    x.params_hash = other;
    assert_int_equal(ks_kvfile_read(f->path, &x, NULL, NULL, NULL), KS_EMISMATCH);
    x = e;
    ks_key k2 = f->key;
    k2.b[5] ^= 1;
    x.key = &k2;
    assert_int_equal(ks_kvfile_read(f->path, &x, NULL, NULL, NULL), KS_EMISMATCH);
    x = e;
    int32_t t2[5];
    memcpy(t2, f->toks, sizeof t2);
    t2[4]++;
    x.tokens = t2;
    int32_t *tout = NULL;
    uint8_t *pout = NULL;
    assert_int_equal(ks_kvfile_read(f->path, &x, NULL, &tout, &pout), KS_EMISMATCH);
    assert_null(tout);
    assert_null(pout);
    x = e;
    x.n_tokens = 4;
    assert_int_equal(ks_kvfile_read(f->path, &x, NULL, NULL, NULL), KS_EMISMATCH);
    /* not a regular file (test_special_files_refused has the others), missing file */
    assert_int_equal(ks_kvfile_read(f->dir, NULL, NULL, NULL, NULL), KS_EINVAL);
    char missing[PATH_MAX];
    snprintf(missing, sizeof missing, "%s/nope.kvs", f->dir);
    assert_int_equal(ks_kvfile_read(missing, NULL, NULL, NULL, NULL), KS_ENOENT);
    assert_int_equal(ks_kvfile_read_meta(missing, NULL), KS_ENOENT);
    /* A path through a file (ENOTDIR) is missing too, as mkmodel always said:
     * ks_kvfile_errno used to call it an I/O error (one errno mapping now). */
    char through[PATH_MAX + 16];
    snprintf(through, sizeof through, "%s/nope.kvs", f->path);
    assert_int_equal(ks_kvfile_read(through, NULL, NULL, NULL, NULL), KS_ENOENT);
    assert_int_equal(ks_kvfile_read_meta(through, NULL), KS_ENOENT);
    free(b);
    free(orig);
}

static void test_touch_keeps_checksum(void **state) {
    fx *f = *state;
    write_ok(f);
    ks_kvfile_expect e = expect_all(f);
    for (uint64_t h = 1; h <= 3; h++) assert_int_equal(ks_kvfile_touch(f->path, 1800000000000000ll + (int64_t)h, h, 0), 0);
    ks_kvfile_meta m;
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
    assert_true(m.trailer_ok);
    assert_int_equal(m.hits, 3);
    assert_int_equal(m.last_hit_us, 1800000000000003ll);
    assert_int_equal(m.flags, KS_KVFILE_FLAG_PIN);
    assert_int_equal(m.pin_until_us, 0);
    /* touch refuses what is not a kvfile */
    char junk[PATH_MAX];
    snprintf(junk, sizeof junk, "%s/junk", f->dir);
    uint8_t zeros[400] = {0};
    spit(junk, zeros, sizeof zeros);
    assert_int_equal(ks_kvfile_touch(junk, 1, 1, 0), KS_ECORRUPT);
    size_t n;
    uint8_t *b = slurp(junk, &n);
    assert_memory_equal(b, zeros, sizeof zeros);
    free(b);
}

/* The pin deadline: written with the file, read back by both readers, extended
 * by touch and never shortened by it (another process may hold the longer one). */
static void test_pin_in_trailer(void **state) {
    fx *f = *state;
    f->meta.pin_until_us = 1900000000000000ll;
    write_ok(f);
    ks_kvfile_expect e = expect_all(f);
    ks_kvfile_meta m;
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), 0);
    assert_int_equal(m.pin_until_us, 1900000000000000ll);
    assert_int_equal(m.flags, KS_KVFILE_FLAG_PIN);
    assert_int_equal(ks_kvfile_touch(f->path, 1800000000000001ll, 1, 1950000000000000ll), 0);
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
    assert_int_equal(m.pin_until_us, 1950000000000000ll);
    assert_int_equal(m.hits, 1);
    /* An earlier deadline (or none) keeps the later one. */
    assert_int_equal(ks_kvfile_touch(f->path, 1800000000000002ll, 2, 1910000000000000ll), 0);
    assert_int_equal(ks_kvfile_touch(f->path, 1800000000000003ll, 3, 0), 0);
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
    assert_int_equal(m.pin_until_us, 1950000000000000ll);
    assert_int_equal(m.hits, 3);
    assert_int_equal(m.last_hit_us, 1800000000000003ll);
    /* A damaged trailer loses the pin with the statistics; touch then writes ours. */
    size_t n;
    uint8_t *b = slurp(f->path, &n);
    b[n - 12] ^= 0x40; /* the pin field */
    spit(f->path, b, n);
    free(b);
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
    assert_false(m.trailer_ok);
    assert_int_equal(m.pin_until_us, 0);
    assert_int_equal(ks_kvfile_touch(f->path, 1, 4, 1920000000000000ll), 0);
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), 0);
    assert_true(m.trailer_ok);
    assert_int_equal(m.pin_until_us, 1920000000000000ll);
}

/* A file written before pins: no flag, a 24-byte trailer (last hit, hits,
 * check). Built here from a current file: flag cleared, header resealed,
 * checksum recomputed, the trailer without the pin. It reads (pin 0), and
 * touch keeps its layout: the pin cannot be kept there and is ignored. */
static void test_file_before_pins_reads(void **state) {
    fx *f = *state;
    write_ok(f);
    size_t n;
    uint8_t *cur = slurp(f->path, &n);
    if (n < KS_KVFILE_HEADER_LEN + KS_KVFILE_TAIL_LEN) {
        free(cur);
        fail_msg("a kvfile of %zu bytes", n);
        return;
    }
    size_t body = n - KS_KVFILE_TAIL_LEN; /* header + tokens + payload */
    size_t old_n = body + 8 + KS_KVFILE_TRAILER_LEN_NOPIN;
    uint8_t *b = malloc(old_n);
    assert_non_null(b);
    memcpy(b, cur, body);
    uint32_t flags = 0;
    memcpy(b + 28, &flags, 4);
    reseal(b);
    uint64_t csum = XXH3_64bits(b, body);
    if (!csum) csum = KS_KVFILE_CSUM_ZERO;
    memcpy(b + body, &csum, 8);
    int64_t last = 1700000000999999ll;
    uint64_t hits = 7;
    memcpy(b + body + 8, &last, 8);
    memcpy(b + body + 16, &hits, 8);
    uint64_t tcheck = XXH3_64bits(b + body + 8, 16);
    if (!tcheck) tcheck = KS_KVFILE_CSUM_ZERO;
    memcpy(b + body + 24, &tcheck, 8);
    spit(f->path, b, old_n);

    ks_kvfile_expect e = expect_all(f);
    ks_kvfile_meta m;
    uint8_t *payload = NULL;
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, &payload), 0);
    assert_memory_equal(payload, f->payload, sizeof f->payload);
    free(payload);
    assert_int_equal(m.flags, 0);
    assert_true(m.trailer_ok);
    assert_int_equal(m.hits, 7);
    assert_int_equal(m.last_hit_us, last);
    assert_int_equal(m.pin_until_us, 0);
    assert_int_equal(m.file_size, old_n);
    assert_int_equal(ks_kvfile_touch(f->path, last + 1, 8, 1900000000000000ll), 0);
    assert_int_equal(ks_kvfile_read(f->path, &e, &m, NULL, NULL), 0);
    assert_true(m.trailer_ok);
    assert_int_equal(m.hits, 8);
    assert_int_equal(m.pin_until_us, 0);
    size_t n2;
    uint8_t *after = slurp(f->path, &n2);
    assert_int_equal(n2, old_n);
    assert_memory_equal(after, b, body + 8); /* only the trailer changed */
    /* Every byte before its trailer is still checked. */
    for (size_t i = 0; i < body + 8; i += 7) {
        uint8_t *c = malloc(old_n);
        assert_non_null(c);
        memcpy(c, after, old_n);
        c[i] ^= 0x20;
        spit(f->path, c, old_n);
        free(c);
        if (ks_kvfile_read(f->path, &e, NULL, NULL, NULL) != KS_ECORRUPT) fail_msg("flip of byte %zu read", i);
    }
    free(after);
    free(b);
    free(cur);
}

/* Issue 13, finding 2: a FIFO (or socket, directory, symlink) under a kvfile
 * name made the readers block in open() until a writer came. Every reader
 * and touch now refuses it with KS_EINVAL at once, without reading a byte.
 * An alarm turns a hang back into a failure. */
static void test_special_files_refused(void **state) {
    fx *f = *state;
    write_ok(f); /* a real kvfile, the target of the symlink */
    char fifo[PATH_MAX], dir[PATH_MAX], sock[PATH_MAX], link_[PATH_MAX];
    snprintf(fifo, sizeof fifo, "%s/%064d.kvs", f->dir, 1);
    snprintf(dir, sizeof dir, "%s/%064d.kvs", f->dir, 2);
    snprintf(sock, sizeof sock, "%s/%064d.kvs", f->dir, 3);
    snprintf(link_, sizeof link_, "%s/%064d.kvs", f->dir, 4);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(sfd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    bool have_sock = strlen(sock) < sizeof sa.sun_path;
    if (have_sock) {
        memcpy(sa.sun_path, sock, strlen(sock) + 1);
        assert_int_equal(bind(sfd, (struct sockaddr *)&sa, sizeof sa), 0);
    }
    assert_int_equal(symlink(f->path, link_), 0);
    const char *paths[] = {fifo, dir, link_, sock};
    alarm(20);
    for (int i = 0; i < (have_sock ? 4 : 3); i++) {
        ks_kvfile_meta m;
        ks_kvfile_expect e = expect_all(f);
        uint8_t *buf = NULL;
        size_t cap = 0;
        int32_t *toks = NULL;
        uint8_t *payload = NULL;
        if (ks_kvfile_read_meta(paths[i], &m) != KS_EINVAL) fail_msg("read_meta(%s): not KS_EINVAL", paths[i]);
        if (ks_kvfile_read(paths[i], &e, &m, &toks, &payload) != KS_EINVAL) fail_msg("read(%s)", paths[i]);
        assert_null(toks);
        assert_null(payload);
        if (ks_kvfile_read_buf(paths[i], &e, &m, &buf, &cap) != KS_EINVAL) fail_msg("read_buf(%s)", paths[i]);
        free(buf);
        if (ks_kvfile_touch(paths[i], 1, 1, 0) != KS_EINVAL) fail_msg("touch(%s)", paths[i]);
    }
    alarm(0);
    close(sfd);
}

/* Issue 13, finding 10: touch (the hit statistics written back into the
 * trailer) followed symlinks: a link named like a kvfile got its target's
 * trailer rewritten. It is refused now, and the target keeps its bytes. */
static void test_touch_does_not_follow_symlinks(void **state) {
    fx *f = *state;
    write_ok(f);
    size_t n0, n1;
    uint8_t *before = slurp(f->path, &n0);
    char link_[PATH_MAX];
    snprintf(link_, sizeof link_, "%s/%064d.kvs", f->dir, 7);
    assert_int_equal(symlink(f->path, link_), 0);
    assert_int_equal(ks_kvfile_touch(link_, 1900000000000000ll, 42, 1990000000000000ll), KS_EINVAL);
    uint8_t *after = slurp(f->path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    /* the file itself is still touched */
    assert_int_equal(ks_kvfile_touch(f->path, 1900000000000000ll, 42, 0), 0);
    ks_kvfile_meta m;
    assert_int_equal(ks_kvfile_read_meta(f->path, &m), 0);
    assert_int_equal(m.hits, 42);
}

static void test_write_errors(void **state) {
    fx *f = *state;
    char missing[PATH_MAX];
    snprintf(missing, sizeof missing, "%s/no/such/dir", f->dir);
    assert_int_equal(ks_kvfile_write(missing, &f->meta, f->toks, 5, f->payload, 10, NULL, NULL, NULL), KS_EIO);
    assert_int_equal(ks_kvfile_write(f->dir, &f->meta, NULL, 5, f->payload, 10, NULL, NULL, NULL), KS_EINVAL);
    assert_int_equal(ks_kvfile_write(f->dir, &f->meta, f->toks, -1, f->payload, 10, NULL, NULL, NULL), KS_EINVAL);
    assert_int_equal(count_entries(f->dir, ""), 0);
}

int main(void) {
    ks_log_set_level(KS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reason_after_pins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_into_buffer, setup, teardown),
        cmocka_unit_test(test_names),
        cmocka_unit_test_setup_teardown(test_flip_every_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncate_every_length, setup, teardown),
        cmocka_unit_test_setup_teardown(test_versions_and_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_touch_keeps_checksum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_in_trailer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_before_pins_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_special_files_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_touch_does_not_follow_symlinks, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

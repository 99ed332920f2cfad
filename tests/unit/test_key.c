/* test_key.c — cache keys (src/cache/key.c), the prefix hasher, the key map,
 * and the model fingerprint (src/engine/fingerprint.c) on hand-made GGUF files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/kvparams.h"
#include "engine/fingerprint.h"

static const char KV[] = "type_k=f16;type_v=f16;n_ctx_seq=4096;fa=0";

static void fp_init(uint8_t fp[32]) {
    for (int i = 0; i < 32; i++) fp[i] = (uint8_t)i;
}

static void expect_hex(const ks_key *k, const char *want) {
    char hex[KS_KEY_HEX_LEN + 1];
    ks_key_to_hex(k, hex);
    if (strcmp(hex, want) != 0) fail_msg("key %s, expected %s", hex, want);
}

/* The key is SHA-256(fp ‖ u32le(len kv) ‖ kv ‖ tokens as u32le). The expected
 * values were computed independently with Python's hashlib. */
static void test_key_golden(void **state) {
    (void)state;
    uint8_t fp[32];
    fp_init(fp);
    int32_t toks[] = {1, 2, 300, 70000, -1};
    ks_key k;
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), toks, 5, &k), 0);
    expect_hex(&k, "0be2f3b897b928b226b47b0c1e501b12046128b21bd7e157daa1f85948598cbe");
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), toks, 0, &k), 0);
    expect_hex(&k, "4a3ac5914504172b1179ad8997b5e5ea9232e2196dfb50eafe66c4322063579e");
}

static void test_key_stable_and_different(void **state) {
    (void)state;
    uint8_t fp[32], fp2[32];
    fp_init(fp);
    fp_init(fp2);
    fp2[31] ^= 1;
    int32_t a[64], b[64];
    for (int i = 0; i < 64; i++) a[i] = b[i] = i * 7919;
    ks_key k1, k2;
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), a, 64, &k1), 0);
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), b, 64, &k2), 0);
    assert_true(ks_key_eq(&k1, &k2));
    /* one token */
    b[63]++;
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), b, 64, &k2), 0);
    assert_false(ks_key_eq(&k1, &k2));
    /* one token shorter */
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), a, 63, &k2), 0);
    assert_false(ks_key_eq(&k1, &k2));
    /* another model */
    assert_int_equal(ks_key_compute(fp2, KV, strlen(KV), a, 64, &k2), 0);
    assert_false(ks_key_eq(&k1, &k2));
    /* other KV params */
    assert_int_equal(ks_key_compute(fp, "type_k=q8_0", 11, a, 64, &k2), 0);
    assert_false(ks_key_eq(&k1, &k2));
    /* The params/tokens boundary is unambiguous: params "AB"+token 0 and
     * params "A"+bytes "B\0\0\0" share their byte stream without the length. */
    int32_t t1[1] = {0}, t2[1] = {0x42}; /* 'B' little-endian = 42 00 00 00 */
    ks_key x, y;
    assert_int_equal(ks_key_compute(fp, "AB\0\0\0", 2, t1, 1, &x), 0);
    assert_int_equal(ks_key_compute(fp, "A", 1, t2, 1, &y), 0);
    assert_false(ks_key_eq(&x, &y));
    /* NULL params with length 0 equal "" */
    assert_int_equal(ks_key_compute(fp, NULL, 0, a, 8, &x), 0);
    assert_int_equal(ks_key_compute(fp, "", 0, a, 8, &y), 0);
    assert_true(ks_key_eq(&x, &y));
}

static void test_prefix_hasher_equals_one_shot(void **state) {
    (void)state;
    uint8_t fp[32];
    fp_init(fp);
    enum { N = 3000 };
    int32_t *toks = malloc(N * sizeof *toks);
    assert_non_null(toks);
    srand(7);
    for (int i = 0; i < N; i++) toks[i] = rand() % 150000;
    int lens[] = {0, 1, 1, 2, 255, 256, 257, 1024, 2047, 2999, 3000};
    int nl = (int)(sizeof lens / sizeof lens[0]);
    ks_key keys[sizeof lens / sizeof lens[0]];
    assert_int_equal(ks_key_prefixes(fp, KV, strlen(KV), toks, N, lens, nl, keys), 0);
    for (int i = 0; i < nl; i++) {
        ks_key one;
        assert_int_equal(ks_key_compute(fp, KV, strlen(KV), toks, lens[i], &one), 0);
        if (!ks_key_eq(&one, &keys[i])) fail_msg("prefix key of length %d differs", lens[i]);
    }
    /* Keys of different lengths differ. */
    assert_false(ks_key_eq(&keys[3], &keys[4]));
    /* Unsorted or out-of-range lengths are refused. */
    int bad1[] = {5, 4};
    int bad2[] = {N + 1};
    int bad3[] = {-1};
    assert_int_equal(ks_key_prefixes(fp, KV, strlen(KV), toks, N, bad1, 2, keys), KS_EINVAL);
    assert_int_equal(ks_key_prefixes(fp, KV, strlen(KV), toks, N, bad2, 1, keys), KS_EINVAL);
    assert_int_equal(ks_key_prefixes(fp, KV, strlen(KV), toks, N, bad3, 1, keys), KS_EINVAL);
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), toks, -1, keys), KS_EINVAL);
    assert_int_equal(ks_key_compute(fp, KV, strlen(KV), NULL, 3, keys), KS_EINVAL);
    free(toks);
}

static void test_hex(void **state) {
    (void)state;
    ks_key k, back;
    for (int i = 0; i < 32; i++) k.b[i] = (uint8_t)(i * 37 + 5);
    char hex[KS_KEY_HEX_LEN + 1];
    ks_key_to_hex(&k, hex);
    assert_int_equal(strlen(hex), 64);
    assert_int_equal(ks_key_from_hex(hex, &back), 0);
    assert_true(ks_key_eq(&k, &back));
    hex[10] = 'g';
    assert_int_equal(ks_key_from_hex(hex, &back), KS_EINVAL);
    assert_int_equal(ks_key_from_hex("abcd", &back), KS_EINVAL);
    uint8_t b[2];
    assert_int_equal(ks_hex_decode("aF09", b, 2), 0);
    assert_int_equal(b[0], 0xaf);
    assert_int_equal(b[1], 0x09);
}

static void test_keymap(void **state) {
    (void)state;
    ks_keymap m = {0};
    enum { N = 5000 };
    static ks_key keys[N];
    for (int i = 0; i < N; i++) {
        uint32_t v = (uint32_t)i;
        assert_int_equal(ks_sha256(&v, sizeof v, keys[i].b), 0);
        assert_int_equal(ks_keymap_put(&m, &keys[i], (void *)(intptr_t)(i + 1)), 0);
    }
    assert_int_equal(m.n, N);
    for (int i = 0; i < N; i++) assert_int_equal((intptr_t)ks_keymap_get(&m, &keys[i]), i + 1);
    /* delete the even ones, replace some odd ones */
    for (int i = 0; i < N; i += 2) assert_int_equal((intptr_t)ks_keymap_del(&m, &keys[i]), i + 1);
    assert_null(ks_keymap_del(&m, &keys[0]));
    for (int i = 1; i < N; i += 4) assert_int_equal(ks_keymap_put(&m, &keys[i], (void *)(intptr_t)7), 0);
    assert_int_equal(m.n, N / 2);
    for (int i = 0; i < N; i++) {
        intptr_t v = (intptr_t)ks_keymap_get(&m, &keys[i]);
        intptr_t want = (i % 2 == 0) ? 0 : (i % 4 == 1 ? 7 : i + 1);
        if (v != want) fail_msg("key %d: %ld, expected %ld", i, (long)v, (long)want);
    }
    /* churn: tombstones must not fill the table */
    for (int round = 0; round < 20; round++)
        for (int i = 0; i < N; i += 2) {
            assert_int_equal(ks_keymap_put(&m, &keys[i], (void *)1), 0);
            assert_non_null(ks_keymap_del(&m, &keys[i]));
        }
    assert_int_equal(m.n, N / 2);
    size_t live = 0;
    for (size_t i = 0; i < m.cap; i++) live += ks_keymap_live(&m, i);
    assert_int_equal(live, N / 2);
    ks_keymap_free(&m);
    ks_keymap_free(&m); /* idempotent */
}

/* ------------------------------------------------------------ fingerprint */
typedef struct {
    uint8_t *b;
    size_t n, cap;
} wbuf;

static void wb_put(wbuf *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2;
        w->b = realloc(w->b, w->cap);
        assert_non_null(w->b);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void wb_u32(wbuf *w, uint32_t v) { wb_put(w, &v, 4); }
static void wb_u64(wbuf *w, uint64_t v) { wb_put(w, &v, 8); }
static void wb_str(wbuf *w, const char *s) {
    wb_u64(w, strlen(s));
    wb_put(w, s, strlen(s));
}

/* A minimal GGUF v3: three metadata pairs and one F32 tensor of n floats
 * (value i * seed). */
static void write_gguf(const char *path, const char *name, uint32_t seed, size_t n) {
    wbuf w = {0};
    wb_put(&w, "GGUF", 4);
    wb_u32(&w, 3);
    wb_u64(&w, 1); /* tensors */
    wb_u64(&w, 3); /* kv */
    wb_str(&w, "general.name");
    wb_u32(&w, 8); /* string */
    wb_str(&w, name);
    wb_str(&w, "test.u32");
    wb_u32(&w, 4);
    wb_u32(&w, 42);
    wb_str(&w, "test.words");
    wb_u32(&w, 9); /* array */
    wb_u32(&w, 8); /* of strings */
    wb_u64(&w, 2);
    wb_str(&w, "hello");
    wb_str(&w, "world");
    wb_str(&w, "w");
    wb_u32(&w, 1);          /* n_dims */
    wb_u64(&w, (uint64_t)n);
    wb_u32(&w, 0);          /* GGML_TYPE_F32 */
    wb_u64(&w, 0);          /* offset */
    while (w.n % 32) wb_put(&w, "", 1);
    for (size_t i = 0; i < n; i++) {
        float f = (float)i * (float)seed;
        wb_put(&w, &f, 4);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(w.b, 1, w.n, f), w.n);
    assert_int_equal(fclose(f), 0);
    free(w.b);
}

static void set_old_mtime(const char *path) {
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 3600;
    ts[1] = ts[0];
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void test_fingerprint(void **state) {
    (void)state;
    char dir[] = "/tmp/ks-fp-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char a[256], b[256], c[256], junk[256], cache[256];
    snprintf(a, sizeof a, "%s/a.gguf", dir);
    snprintf(b, sizeof b, "%s/b.gguf", dir);
    snprintf(c, sizeof c, "%s/c.gguf", dir);
    snprintf(junk, sizeof junk, "%s/junk.gguf", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    enum { NF = 200000 }; /* 800 KB of weights: four distinct samples */
    write_gguf(a, "tiny", 1, NF);
    write_gguf(b, "tiny", 2, NF); /* same metadata, other "seed" */
    write_gguf(c, "tinier", 1, NF);
    char err[256] = "";
    uint8_t fa[32], fa2[32], fb[32], fc[32];
    int rc = ks_model_fingerprint(a, fa, err, sizeof err);
    if (rc) fail_msg("fingerprint: %s", err);
    assert_int_equal(ks_model_fingerprint(a, fa2, err, sizeof err), 0);
    assert_memory_equal(fa, fa2, 32);
    assert_int_equal(ks_model_fingerprint(b, fb, err, sizeof err), 0);
    assert_memory_not_equal(fa, fb, 32);
    assert_int_equal(ks_model_fingerprint(c, fc, err, sizeof err), 0);
    assert_memory_not_equal(fa, fc, 32);
    /* One weight flipped deep inside the tensor, away from where v1 sampled
     * (issue 13: a fine-tune that keeps the metadata): another model. */
    char d[256];
    snprintf(d, sizeof d, "%s/d.gguf", dir);
    write_gguf(d, "tiny", 1, NF);
    {
        FILE *fd = fopen(d, "r+b");
        assert_non_null(fd);
        struct stat st;
        assert_int_equal(stat(d, &st), 0);
        long where = (long)st.st_size - (long)NF * 4 + (long)(NF / 6) * 4 + 3; /* the sign byte of float NF/6 */
        assert_int_equal(fseek(fd, where, SEEK_SET), 0);
        int byte = fgetc(fd);
        assert_int_equal(fseek(fd, where, SEEK_SET), 0);
        fputc(byte ^ 0x80, fd);
        assert_int_equal(fclose(fd), 0);
    }
    uint8_t fd_[32];
    assert_int_equal(ks_model_fingerprint(d, fd_, err, sizeof err), 0);
    assert_memory_not_equal(fa, fd_, 32);
    /* errors */
    FILE *f = fopen(junk, "wb");
    assert_non_null(f);
    fputs("this is not a gguf file at all, just text padding padding padding", f);
    fclose(f);
    assert_int_equal(ks_model_fingerprint(junk, fa2, err, sizeof err), KS_EMODEL);
    assert_non_null(strstr(err, "GGUF"));
    snprintf(junk, sizeof junk, "%s/missing.gguf", dir);
    assert_int_equal(ks_model_fingerprint(junk, fa2, err, sizeof err), KS_ENOENT);

    /* The cache: not written for a fresh file, used once the file is old. */
    bool cached = true;
    assert_int_equal(ks_model_fingerprint_cached(a, cache, fa2, &cached, err, sizeof err), 0);
    assert_false(cached);
    assert_memory_equal(fa, fa2, 32);
    set_old_mtime(a);
    assert_int_equal(ks_model_fingerprint_cached(a, cache, fa2, &cached, err, sizeof err), 0);
    assert_false(cached);
    assert_memory_equal(fa, fa2, 32);
    assert_int_equal(ks_model_fingerprint_cached(a, cache, fa2, &cached, err, sizeof err), 0);
    assert_true(cached);
    assert_memory_equal(fa, fa2, 32);
    /* Replace a by b's content (new inode, new mtime): the cache must not answer. */
    assert_int_equal(rename(b, a), 0);
    assert_int_equal(ks_model_fingerprint_cached(a, cache, fa2, &cached, err, sizeof err), 0);
    assert_false(cached);
    assert_memory_equal(fa2, fb, 32);
    /* Without a cache dir it still works. */
    assert_int_equal(ks_model_fingerprint_cached(c, NULL, fa2, &cached, err, sizeof err), 0);
    assert_false(cached);
    assert_memory_equal(fa2, fc, 32);

    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* kvparams.h: the types of a params string, the same string with others
 * (whose key is another), and the names registered beside a store's files:
 * read back only when they hash to the name. */
static void test_kvparams(void **state) {
    (void)state;
    const char *p = "type_k=q8_0;type_v=f16;fa=1;n_ctx_seq=4096";
    char out[256];
    assert_true(ks_kvparams_type_pair(p, strlen(p), out, sizeof out));
    assert_string_equal(out, "q8_0/f16");
    assert_false(ks_kvparams_type_pair("fa=1;type_k=f16", 15, out, sizeof out));
    assert_false(ks_kvparams_type_pair("type_k=f16", 10, out, sizeof out)); /* no type_v */
    int n = ks_kvparams_with_types(p, strlen(p), "q4_0", "q4_0", out, sizeof out);
    assert_int_equal(n, (int)strlen("type_k=q4_0;type_v=q4_0;fa=1;n_ctx_seq=4096"));
    assert_string_equal(out, "type_k=q4_0;type_v=q4_0;fa=1;n_ctx_seq=4096");
    assert_int_equal(ks_kvparams_with_types(p, strlen(p), "f16", "f16", out, 8), -1); /* too small */
    assert_int_equal(ks_kvparams_with_types("fa=1", 4, "f16", "f16", out, sizeof out), -1);
    /* a string of another pair keys other states */
    uint8_t fp[32];
    fp_init(fp);
    int32_t toks[] = {5, 6, 7};
    ks_key a, b;
    assert_int_equal(ks_key_compute(fp, p, strlen(p), toks, 3, &a), 0);
    assert_int_equal(ks_key_compute(fp, out, (size_t)ks_kvparams_with_types(p, strlen(p), "q4_0", "q4_0", out,
                                                                             sizeof out), toks, 3, &b), 0);
    assert_false(ks_key_eq(&a, &b));

    char dir[] = "/tmp/ks-kvparams-XXXXXX";
    assert_non_null(mkdtemp(dir));
    uint8_t h[32], other[32];
    assert_int_equal(ks_sha256(p, strlen(p), h), 0);
    assert_int_equal(ks_kvparams_lookup(dir, h, out, sizeof out), KS_ENOENT);
    assert_int_equal(ks_kvparams_register(dir, h, p, strlen(p)), 0);
    assert_int_equal(ks_kvparams_register(dir, h, p, strlen(p)), 0); /* again: kept */
    assert_int_equal(ks_kvparams_lookup(dir, h, out, sizeof out), 0);
    assert_string_equal(out, p);
    assert_int_equal(ks_kvparams_lookup(dir, h, out, 8), KS_EINVAL);
    /* a file whose bytes do not hash to its name reads as absent */
    assert_int_equal(ks_sha256("x", 1, other), 0);
    char hex[65], path[512];
    ks_hex_encode(other, 32, hex);
    snprintf(path, sizeof path, "%s/params/%s.txt", dir, hex);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("type_k=f16;type_v=f16", f);
    fclose(f);
    assert_int_equal(ks_kvparams_lookup(dir, other, out, sizeof out), KS_ENOENT);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    ks_log_set_level(KS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_golden),
        cmocka_unit_test(test_key_stable_and_different),
        cmocka_unit_test(test_prefix_hasher_equals_one_shot),
        cmocka_unit_test(test_hex),
        cmocka_unit_test(test_keymap),
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_kvparams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

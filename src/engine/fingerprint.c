/*
 * fingerprint.c — see fingerprint.h.
 */
#include "engine/fingerprint.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/base.h"
#include "gguf.h"

#define FP_CHUNK (4u << 20)
#define FP_TAG "kvstash-model-fp-v2"

static void h_u64(EVP_MD_CTX *c, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    EVP_DigestUpdate(c, b, 8);
}

static void h_str(EVP_MD_CTX *c, const char *s) {
    size_t n = s ? strlen(s) : 0;
    h_u64(c, n);
    if (n) EVP_DigestUpdate(c, s, n);
}

/* Size of one scalar of a GGUF type; 0 for strings and arrays. */
static size_t type_size(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static void hash_kv(EVP_MD_CTX *c, const struct gguf_context *g, int64_t i) {
    enum gguf_type t = gguf_get_kv_type(g, i);
    h_str(c, gguf_get_key(g, i));
    h_u64(c, (uint64_t)t);
    if (t == GGUF_TYPE_STRING) {
        h_str(c, gguf_get_val_str(g, i));
    } else if (t == GGUF_TYPE_ARRAY) {
        enum gguf_type at = gguf_get_arr_type(g, i);
        size_t n = gguf_get_arr_n(g, i);
        h_u64(c, (uint64_t)at);
        h_u64(c, n);
        if (at == GGUF_TYPE_STRING) {
            for (size_t k = 0; k < n; k++) h_str(c, gguf_get_arr_str(g, i, k));
        } else if (type_size(at) && n) {
            EVP_DigestUpdate(c, gguf_get_arr_data(g, i), n * type_size(at));
        }
    } else if (type_size(t)) {
        EVP_DigestUpdate(c, gguf_get_val_data(g, i), type_size(t));
    }
}

int ks_model_fingerprint(const char *gguf_path, uint8_t out[32], char *err, size_t errlen) {
    int rc = 0, fd = -1;
    struct gguf_context *g = NULL;
    EVP_MD_CTX *c = NULL;
    uint8_t *buf = NULL;
    struct stat sb;
    if (!gguf_path || !out) return KS_EINVAL;
    if (stat(gguf_path, &sb) != 0) {
        int e = errno;
        ks_set_err(err, errlen, "%s: %s", gguf_path, strerror(e));
        return e == ENOENT ? KS_ENOENT : KS_EIO;
    }
    if (!S_ISREG(sb.st_mode)) {
        ks_set_err(err, errlen, "%s: not a regular file", gguf_path);
        return KS_EMODEL;
    }
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    if (!(g = gguf_init_from_file(gguf_path, gp))) {
        ks_set_err(err, errlen, "%s: not a readable GGUF file", gguf_path);
        rc = KS_EMODEL;
        goto done;
    }
    if (!(c = EVP_MD_CTX_new()) || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1 ||
        !(buf = malloc(FP_CHUNK))) {
        rc = KS_ENOMEM;
        goto done;
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    EVP_DigestUpdate(c, FP_TAG, sizeof FP_TAG);
    h_u64(c, fsize);
    h_u64(c, gguf_get_version(g));
    h_u64(c, gguf_get_alignment(g));
    uint64_t data_off = gguf_get_data_offset(g);
    h_u64(c, data_off);
    int64_t n_kv = gguf_get_n_kv(g);
    h_u64(c, (uint64_t)n_kv);
    for (int64_t i = 0; i < n_kv; i++) hash_kv(c, g, i);
    int64_t n_t = gguf_get_n_tensors(g);
    h_u64(c, (uint64_t)n_t);
    for (int64_t i = 0; i < n_t; i++) {
        const int64_t *ne = gguf_get_tensor_ne(g, i);
        h_str(c, gguf_get_tensor_name(g, i));
        h_u64(c, (uint64_t)gguf_get_tensor_type(g, i));
        for (int d = 0; d < GGML_MAX_DIMS; d++) h_u64(c, (uint64_t)ne[d]);
        h_u64(c, gguf_get_tensor_offset(g, i));
        h_u64(c, gguf_get_tensor_size(g, i));
    }
    /* Every byte of the tensor data: a fine-tune that keeps the metadata
     * differs only there, anywhere. XXH3-128 streams at memory speed; its
     * digest goes into the SHA-256. */
    if (data_off < fsize) {
        if ((fd = open(gguf_path, O_RDONLY | O_CLOEXEC)) < 0) {
            ks_set_err(err, errlen, "%s: %s", gguf_path, strerror(errno));
            rc = KS_EIO;
            goto done;
        }
#ifdef POSIX_FADV_SEQUENTIAL
        posix_fadvise(fd, (off_t)data_off, 0, POSIX_FADV_SEQUENTIAL);
#endif
        XXH3_state_t *x = XXH3_createState();
        if (!x || XXH3_128bits_reset(x) == XXH_ERROR) {
            XXH3_freeState(x);
            rc = KS_ENOMEM;
            goto done;
        }
        uint64_t off = data_off;
        while (off < fsize) {
            size_t want = fsize - off < FP_CHUNK ? (size_t)(fsize - off) : FP_CHUNK;
            ssize_t r = pread(fd, buf, want, (off_t)off);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            XXH3_128bits_update(x, buf, (size_t)r);
            off += (uint64_t)r;
        }
        XXH128_hash_t h = XXH3_128bits_digest(x);
        XXH3_freeState(x);
        if (off != fsize) {
            ks_set_err(err, errlen, "%s: short read of the tensor data", gguf_path);
            rc = KS_EIO;
            goto done;
        }
        h_u64(c, fsize - data_off);
        h_u64(c, h.low64);
        h_u64(c, h.high64);
    }
    unsigned int md = 0;
    if (EVP_DigestFinal_ex(c, out, &md) != 1 || md != 32) rc = KS_ENOMEM;
done:
    if (fd >= 0) close(fd);
    free(buf);
    EVP_MD_CTX_free(c);
    if (g) gguf_free(g);
    return rc;
}

/* ------------------------------------------------------------------ cache */
#define FP_CACHE_MAGIC "kvstash-fingerprint 2"

static int cache_path(const char *cache_dir, const char *real, char *out, size_t n) {
    uint8_t h[32];
    char hex[65];
    unsigned int md = 0;
    if (EVP_Digest(real, strlen(real), h, &md, EVP_sha256(), NULL) != 1) return -1;
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    int w = snprintf(out, n, "%s/fingerprints/%s.fp", cache_dir, hex);
    return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

static void describe(const char *real, const struct stat *sb, char *line, size_t n) {
    snprintf(line, n, "%s\npath %s\nsize %lld\nmtime %lld.%09ld\nino %llu\ndev %llu\n", FP_CACHE_MAGIC,
             real, (long long)sb->st_size, (long long)sb->st_mtim.tv_sec, (long)sb->st_mtim.tv_nsec,
             (unsigned long long)sb->st_ino, (unsigned long long)sb->st_dev);
}

static bool cache_read(const char *cpath, const char *want, uint8_t out[32]) {
    char buf[PATH_MAX + 512];
    FILE *f = fopen(cpath, "re");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    size_t wl = strlen(want);
    if (n < wl + 3 + 64 || memcmp(buf, want, wl) != 0 || memcmp(buf + wl, "fp ", 3) != 0) return false;
    const char *hx = buf + wl + 3;
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (sscanf(hx + 2 * i, "%2x", &v) != 1) return false;
        out[i] = (uint8_t)v;
    }
    return true;
}

static void cache_write(const char *cache_dir, const char *cpath, const char *desc, const uint8_t fp[32]) {
    char dir[PATH_MAX], tmp[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/fingerprints", cache_dir);
    mkdir(cache_dir, 0700);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return;
    if (snprintf(tmp, sizeof tmp, "%s.%ld.tmp", cpath, (long)getpid()) >= (int)sizeof tmp) return;
    FILE *f = fopen(tmp, "we");
    if (!f) return;
    fputs(desc, f);
    fputs("fp ", f);
    for (int i = 0; i < 32; i++) fprintf(f, "%02x", fp[i]);
    fputc('\n', f);
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, cpath) != 0) {
        KS_DEBUG("fingerprint", "cannot write %s: %s", cpath, strerror(errno));
        unlink(tmp);
    }
}

int ks_model_fingerprint_cached(const char *gguf_path, const char *cache_dir, uint8_t out[32],
                                bool *from_cache, char *err, size_t errlen) {
    char real[PATH_MAX], cpath[PATH_MAX], desc[PATH_MAX + 256];
    struct stat sb;
    if (from_cache) *from_cache = false;
    if (!cache_dir || !cache_dir[0] || !gguf_path || !realpath(gguf_path, real) ||
        stat(real, &sb) != 0 || cache_path(cache_dir, real, cpath, sizeof cpath) != 0)
        return ks_model_fingerprint(gguf_path, out, err, errlen);
    describe(real, &sb, desc, sizeof desc);
    if (cache_read(cpath, desc, out)) {
        if (from_cache) *from_cache = true;
        return 0;
    }
    int rc = ks_model_fingerprint(real, out, err, errlen);
    if (rc != 0) return rc;
    /* The file may have changed while we read it: only cache a result whose
     * description still holds afterwards, and not for a file modified in the
     * last seconds — a rewrite within the same clock tick would keep its
     * mtime ("racy git"). */
    struct stat sb2;
    char desc2[sizeof desc];
    if (stat(real, &sb2) == 0 && (int64_t)time(NULL) - (int64_t)sb2.st_mtim.tv_sec > 2) {
        describe(real, &sb2, desc2, sizeof desc2);
        if (strcmp(desc, desc2) == 0) cache_write(cache_dir, cpath, desc, out);
    }
    return 0;
}

/* An unsigned integer metadata value of g (any integer type), or dflt. */
static uint64_t kv_uint(const struct gguf_context *g, const char *key, uint64_t dflt) {
    int64_t i = gguf_find_key(g, key);
    if (i < 0) return dflt;
    switch (gguf_get_kv_type(g, i)) {
    case GGUF_TYPE_UINT8: return gguf_get_val_u8(g, i);
    case GGUF_TYPE_UINT16: return gguf_get_val_u16(g, i);
    case GGUF_TYPE_UINT32: return gguf_get_val_u32(g, i);
    case GGUF_TYPE_UINT64: return gguf_get_val_u64(g, i);
    case GGUF_TYPE_INT32: return gguf_get_val_i32(g, i) > 0 ? (uint64_t)gguf_get_val_i32(g, i) : dflt;
    case GGUF_TYPE_INT64: return gguf_get_val_i64(g, i) > 0 ? (uint64_t)gguf_get_val_i64(g, i) : dflt;
    default: return dflt;
    }
}

int ks_model_estimate_bytes(const char *gguf_path, int n_ctx, int n_seq, int64_t *bytes, char *err,
                            size_t errlen) {
    struct stat sb;
    *bytes = 0;
    if (stat(gguf_path, &sb)) {
        ks_set_err(err, errlen, "%s: %s", gguf_path, strerror(errno));
        return errno == ENOENT ? KS_ENOENT : KS_EIO;
    }
    *bytes = (int64_t)sb.st_size;
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = gguf_init_from_file(gguf_path, gp);
    if (!g) {
        ks_set_err(err, errlen, "%s: not a readable GGUF file", gguf_path);
        return KS_EMODEL;
    }
    int64_t ai = gguf_find_key(g, "general.architecture");
    const char *arch = ai >= 0 && gguf_get_kv_type(g, ai) == GGUF_TYPE_STRING ? gguf_get_val_str(g, ai) : "";
    char k[160];
    snprintf(k, sizeof k, "%s.block_count", arch);
    uint64_t n_layer = kv_uint(g, k, 0);
    snprintf(k, sizeof k, "%s.embedding_length", arch);
    uint64_t n_embd = kv_uint(g, k, 0);
    snprintf(k, sizeof k, "%s.attention.head_count", arch);
    uint64_t n_head = kv_uint(g, k, 1);
    snprintf(k, sizeof k, "%s.attention.head_count_kv", arch);
    uint64_t n_head_kv = kv_uint(g, k, n_head);
    snprintf(k, sizeof k, "%s.attention.key_length", arch);
    uint64_t k_len = kv_uint(g, k, n_head ? n_embd / n_head : 0);
    snprintf(k, sizeof k, "%s.attention.value_length", arch);
    uint64_t v_len = kv_uint(g, k, k_len);
    gguf_free(g);
    /* K and V at F16 for every layer, position and sequence: an upper bound
     * for models whose layers are not all attention (recurrent, sliding). */
    uint64_t kv = n_layer * (uint64_t)(n_ctx > 0 ? n_ctx : 0) * (uint64_t)(n_seq > 0 ? n_seq : 0) * n_head_kv *
                  (k_len + v_len) * 2u;
    *bytes += (int64_t)kv;
    return 0;
}

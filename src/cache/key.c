/*
 * key.c — see key.h.
 *
 * The prefix hasher feeds the tokens once through one SHA-256 context and
 * clones the context (EVP_MD_CTX_copy_ex) at every requested length: the
 * clone is finalised, the original goes on. Cost: one pass over the longest
 * prefix plus one finalisation per length, instead of one pass per length.
 */
#include "cache/key.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Tokens are converted to little-endian in chunks of this many. */
#define KEY_CHUNK 1024

static int feed_tokens(EVP_MD_CTX *c, const int32_t *t, int n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return EVP_DigestUpdate(c, t, (size_t)n * 4) == 1 ? 0 : KS_ENOMEM;
#else
    uint8_t buf[KEY_CHUNK * 4];
    while (n > 0) {
        int k = n < KEY_CHUNK ? n : KEY_CHUNK;
        for (int i = 0; i < k; i++) {
            uint32_t v = (uint32_t)t[i];
            buf[4 * i] = (uint8_t)v;
            buf[4 * i + 1] = (uint8_t)(v >> 8);
            buf[4 * i + 2] = (uint8_t)(v >> 16);
            buf[4 * i + 3] = (uint8_t)(v >> 24);
        }
        if (EVP_DigestUpdate(c, buf, (size_t)k * 4) != 1) return KS_ENOMEM;
        t += k;
        n -= k;
    }
    return 0;
#endif
}

/* A tenant's keys set the length field's top bit (kv-params lengths are
 * below 2^31) and hash the tenant after the kv params: no tenant's key can
 * equal another's, nor one of the single-tenant keys, whose bytes are
 * exactly what they were before tenants existed. */
static int start(EVP_MD_CTX *c, const uint8_t fp[32], const void *kv, size_t kv_len, uint64_t tenant) {
    uint32_t l = (uint32_t)kv_len | (tenant ? 0x80000000u : 0);
    uint8_t len_le[4] = {(uint8_t)l, (uint8_t)(l >> 8), (uint8_t)(l >> 16), (uint8_t)(l >> 24)};
    uint8_t t_le[8];
    for (int i = 0; i < 8; i++) t_le[i] = (uint8_t)(tenant >> (8 * i));
    if (EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) return KS_ENOMEM;
    if (EVP_DigestUpdate(c, fp, 32) != 1) return KS_ENOMEM;
    if (EVP_DigestUpdate(c, len_le, 4) != 1) return KS_ENOMEM;
    if (kv_len && EVP_DigestUpdate(c, kv, kv_len) != 1) return KS_ENOMEM;
    if (tenant && EVP_DigestUpdate(c, t_le, 8) != 1) return KS_ENOMEM;
    return 0;
}

int ks_key_compute(const uint8_t fp[32], const void *kv_params, size_t kv_len,
                   const int32_t *tokens, int n, ks_key *out) {
    return ks_key_compute_tenant(fp, kv_params, kv_len, 0, tokens, n, out);
}

int ks_key_compute_tenant(const uint8_t fp[32], const void *kv_params, size_t kv_len, uint64_t tenant,
                          const int32_t *tokens, int n, ks_key *out) {
    int lens[1] = {n};
    if (n < 0) return KS_EINVAL;
    return ks_key_prefixes_tenant(fp, kv_params, kv_len, tenant, tokens, n, lens, 1, out);
}

int ks_key_prefixes(const uint8_t fp[32], const void *kv_params, size_t kv_len,
                    const int32_t *tokens, int n, const int *lens, int n_lens, ks_key *out) {
    return ks_key_prefixes_tenant(fp, kv_params, kv_len, 0, tokens, n, lens, n_lens, out);
}

int ks_key_prefixes_tenant(const uint8_t fp[32], const void *kv_params, size_t kv_len, uint64_t tenant,
                           const int32_t *tokens, int n, const int *lens, int n_lens, ks_key *out) {
    int rc = 0;
    EVP_MD_CTX *c = NULL, *tmp = NULL;
    if (!fp || !out || n < 0 || n_lens < 0 || (n > 0 && !tokens) || (kv_len && !kv_params) ||
        kv_len >= 0x80000000u || (n_lens > 0 && !lens))
        return KS_EINVAL;
    for (int i = 0; i < n_lens; i++)
        if (lens[i] < 0 || lens[i] > n || (i > 0 && lens[i] < lens[i - 1])) return KS_EINVAL;
    c = EVP_MD_CTX_new();
    tmp = EVP_MD_CTX_new();
    if (!c || !tmp) {
        rc = KS_ENOMEM;
        goto done;
    }
    if ((rc = start(c, fp, kv_params, kv_len, tenant)) != 0) goto done;
    int at = 0;
    for (int i = 0; i < n_lens; i++) {
        if (lens[i] > at) {
            if ((rc = feed_tokens(c, tokens + at, lens[i] - at)) != 0) goto done;
            at = lens[i];
        }
        unsigned int md_len = 0;
        if (EVP_MD_CTX_copy_ex(tmp, c) != 1 || EVP_DigestFinal_ex(tmp, out[i].b, &md_len) != 1 ||
            md_len != KS_KEY_LEN) {
            rc = KS_ENOMEM;
            goto done;
        }
    }
done:
    EVP_MD_CTX_free(tmp);
    EVP_MD_CTX_free(c);
    return rc;
}

int ks_sha256(const void *data, size_t len, uint8_t out[32]) {
    unsigned int md_len = 0;
    if (EVP_Digest(data, len, out, &md_len, EVP_sha256(), NULL) != 1 || md_len != 32)
        return KS_ENOMEM;
    return 0;
}

bool ks_key_eq(const ks_key *a, const ks_key *b) { return memcmp(a->b, b->b, KS_KEY_LEN) == 0; }

void ks_hex_encode(const uint8_t *b, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int ks_hex_decode(const char *hex, uint8_t *b, size_t n) {
    if (!hex || !b) return KS_EINVAL;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]);
        int lo = hi < 0 ? -1 : hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return KS_EINVAL;
        b[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

void ks_key_to_hex(const ks_key *k, char out[KS_KEY_HEX_LEN + 1]) { ks_hex_encode(k->b, KS_KEY_LEN, out); }

int ks_key_from_hex(const char *hex, ks_key *out) {
    if (!hex || strlen(hex) != KS_KEY_HEX_LEN) return KS_EINVAL;
    return ks_hex_decode(hex, out->b, KS_KEY_LEN);
}

/* ---------------------------------------------------------------- keymap */
static char tomb_marker;
#define KS_KEYMAP_TOMB ((void *)&tomb_marker)

static size_t key_hash(const ks_key *k) {
    uint64_t h;
    memcpy(&h, k->b, sizeof h);
    return (size_t)h;
}

bool ks_keymap_live(const ks_keymap *m, size_t i) {
    return i < m->cap && m->vals[i] != NULL && m->vals[i] != KS_KEYMAP_TOMB;
}

void *ks_keymap_get(const ks_keymap *m, const ks_key *k) {
    if (m->cap == 0) return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = key_hash(k) & mask, probes = 0; probes < m->cap; i = (i + 1) & mask, probes++) {
        if (m->vals[i] == NULL) return NULL;
        if (m->vals[i] != KS_KEYMAP_TOMB && ks_key_eq(&m->keys[i], k)) return m->vals[i];
    }
    return NULL;
}

static int rehash(ks_keymap *m, size_t ncap) {
    ks_key *nk = calloc(ncap, sizeof *nk);
    void **nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return KS_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!ks_keymap_live(m, i)) continue;
        size_t j = key_hash(&m->keys[i]) & (ncap - 1);
        while (nv[j]) j = (j + 1) & (ncap - 1);
        nk[j] = m->keys[i];
        nv[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
    m->n_tomb = 0;
    return 0;
}

int ks_keymap_put(ks_keymap *m, const ks_key *k, void *v) {
    if (!v || v == KS_KEYMAP_TOMB) return KS_EINVAL;
    /* Keep the load (live + tombstones) under 3/4 so probes stay short and
     * an empty slot always ends a probe sequence. */
    if ((m->n + m->n_tomb + 1) * 4 > m->cap * 3) {
        size_t ncap = m->cap ? m->cap : 16;
        while ((m->n + 1) * 2 > ncap) ncap *= 2;
        int rc = rehash(m, ncap);
        if (rc) return rc;
    }
    size_t mask = m->cap - 1, tomb = SIZE_MAX;
    size_t i = key_hash(k) & mask;
    for (;; i = (i + 1) & mask) {
        if (m->vals[i] == NULL) break;
        if (m->vals[i] == KS_KEYMAP_TOMB) {
            if (tomb == SIZE_MAX) tomb = i;
            continue;
        }
        if (ks_key_eq(&m->keys[i], k)) {
            m->vals[i] = v;
            return 0;
        }
    }
    if (tomb != SIZE_MAX) {
        i = tomb;
        m->n_tomb--;
    }
    m->keys[i] = *k;
    m->vals[i] = v;
    m->n++;
    return 0;
}

void *ks_keymap_del(ks_keymap *m, const ks_key *k) {
    if (m->cap == 0) return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = key_hash(k) & mask, probes = 0; probes < m->cap; i = (i + 1) & mask, probes++) {
        if (m->vals[i] == NULL) return NULL;
        if (m->vals[i] != KS_KEYMAP_TOMB && ks_key_eq(&m->keys[i], k)) {
            void *v = m->vals[i];
            m->vals[i] = KS_KEYMAP_TOMB;
            m->n--;
            m->n_tomb++;
            return v;
        }
    }
    return NULL;
}

void ks_keymap_free(ks_keymap *m) {
    if (!m) return;
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

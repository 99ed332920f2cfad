/*
 * kvmac.c — see kvmac.h. OpenSSL does the cryptography: HMAC-SHA256 for the
 * key derivations, EVP_MAC "POLY1305" for the tags, RAND_bytes for nonces.
 */
#include "cache/kvmac.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

#define STORE_LABEL "kvstash store key v1"
#define ENTRY_LABEL "kvstash kvfile poly1305 v1"

struct ks_kvmac {
    EVP_MAC *mac;
    EVP_MAC_CTX *ctx;
};

int ks_kvmac_key_from_secret(const void *secret, size_t len, ks_kvmac_key *out) {
    if (!secret || !out || len < KS_KVMAC_SECRET_MIN || len > KS_KVMAC_SECRET_MAX) return KS_EINVAL;
    unsigned int n = 0;
    if (!HMAC(EVP_sha256(), secret, (int)len, (const unsigned char *)STORE_LABEL, sizeof STORE_LABEL - 1, out->k,
              &n) ||
        n != sizeof out->k)
        return KS_EIO;
    return 0;
}

int ks_kvmac_key_load_file(const char *path, ks_kvmac_key *out, char *err, size_t errlen) {
    uint8_t buf[KS_KVMAC_SECRET_MAX + 1];
    struct stat sb;
    int rc = 0;
    /* A symlink is followed (secret mounts are often links); what it names
     * must be a regular file, checked after the open. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        ks_set_err(err, errlen, "cache secret file %s: %s", path, strerror(e));
        return e == ENOENT ? KS_ENOENT : KS_EIO;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ks_set_err(err, errlen, "cache secret file %s: not a regular file", path);
        rc = KS_EINVAL;
        goto done;
    }
    if (sb.st_mode & 007) {
        ks_set_err(err, errlen, "cache secret file %s: readable or writable by others (chmod 600 it)", path);
        rc = KS_EINVAL;
        goto done;
    }
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, sizeof buf - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            ks_set_err(err, errlen, "cache secret file %s: %s", path, strerror(errno));
            rc = KS_EIO;
            goto done;
        }
        if (r == 0 || (got += (size_t)r) == sizeof buf) break;
    }
    while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) got--;
    if (got > KS_KVMAC_SECRET_MAX || got < KS_KVMAC_SECRET_MIN) {
        ks_set_err(err, errlen, "cache secret file %s: the secret must be %u to %u bytes", path,
                   KS_KVMAC_SECRET_MIN, KS_KVMAC_SECRET_MAX);
        rc = KS_EINVAL;
        goto done;
    }
    if ((rc = ks_kvmac_key_from_secret(buf, got, out)) != 0)
        ks_set_err(err, errlen, "cache secret file %s: %s", path, ks_strerror(rc));
done:
    OPENSSL_cleanse(buf, sizeof buf);
    close(fd);
    return rc;
}

int ks_kvmac_nonce(uint8_t nonce[KS_KVMAC_NONCE_LEN]) {
    return RAND_bytes(nonce, (int)KS_KVMAC_NONCE_LEN) == 1 ? 0 : KS_EIO;
}

ks_kvmac *ks_kvmac_begin(const ks_kvmac_key *key, const uint8_t nonce[KS_KVMAC_NONCE_LEN]) {
    uint8_t in[sizeof ENTRY_LABEL - 1 + KS_KVMAC_NONCE_LEN], otk[32];
    unsigned int n = 0;
    memcpy(in, ENTRY_LABEL, sizeof ENTRY_LABEL - 1);
    memcpy(in + sizeof ENTRY_LABEL - 1, nonce, KS_KVMAC_NONCE_LEN);
    ks_kvmac *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    /* The one-time key: Poly1305 is only unforgeable when no key tags two
     * messages, and every entry has its own random nonce. */
    if (!HMAC(EVP_sha256(), key->k, sizeof key->k, in, sizeof in, otk, &n) || n != sizeof otk ||
        !(m->mac = EVP_MAC_fetch(NULL, "POLY1305", NULL)) || !(m->ctx = EVP_MAC_CTX_new(m->mac)) ||
        EVP_MAC_init(m->ctx, otk, sizeof otk, NULL) != 1) {
        ks_kvmac_free(m);
        m = NULL;
    }
    OPENSSL_cleanse(otk, sizeof otk);
    return m;
}

int ks_kvmac_update(ks_kvmac *m, const void *p, size_t len) {
    if (len == 0) return 0;
    return EVP_MAC_update(m->ctx, p, len) == 1 ? 0 : KS_EIO;
}

int ks_kvmac_final(ks_kvmac *m, uint8_t tag[KS_KVMAC_TAG_LEN]) {
    size_t n = 0;
    return EVP_MAC_final(m->ctx, tag, &n, KS_KVMAC_TAG_LEN) == 1 && n == KS_KVMAC_TAG_LEN ? 0 : KS_EIO;
}

void ks_kvmac_free(ks_kvmac *m) {
    if (!m) return;
    EVP_MAC_CTX_free(m->ctx);
    EVP_MAC_free(m->mac);
    free(m);
}

int ks_kvmac_tag(const ks_kvmac_key *key, const uint8_t nonce[KS_KVMAC_NONCE_LEN], const void *buf, size_t len,
                 uint8_t tag[KS_KVMAC_TAG_LEN]) {
    ks_kvmac *m = ks_kvmac_begin(key, nonce);
    if (!m) return KS_ENOMEM;
    int rc = ks_kvmac_update(m, buf, len);
    if (rc == 0) rc = ks_kvmac_final(m, tag);
    ks_kvmac_free(m);
    return rc;
}

bool ks_kvmac_equal(const uint8_t a[KS_KVMAC_TAG_LEN], const uint8_t b[KS_KVMAC_TAG_LEN]) {
    return CRYPTO_memcmp(a, b, KS_KVMAC_TAG_LEN) == 0;
}

int ks_kvmac_text_tag(const ks_kvmac_key *key, const char *label, const char *a, const char *b,
                      uint8_t tag[KS_KVMAC_TAG_LEN]) {
    char in[1024 + 128];
    int n = snprintf(in, sizeof in, "%s%c%s%c%s", label, 0, a, 0, b);
    if (n < 0 || (size_t)n >= sizeof in) return KS_EINVAL;
    uint8_t out[32];
    unsigned int ol = 0;
    if (!HMAC(EVP_sha256(), key->k, sizeof key->k, (const unsigned char *)in, (size_t)n, out, &ol) || ol != 32)
        return KS_EIO;
    memcpy(tag, out, KS_KVMAC_TAG_LEN);
    return 0;
}

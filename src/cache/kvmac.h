/*
 * kvmac.h — the authentication of stored states (docs/SECURITY.md,
 * docs/kvfile-format.md "Authentication").
 *
 * A deployment secret (--cache-secret-file, $KVSTASH_CACHE_SECRET, YAML
 * store.secret_file) is turned once into a 32-byte store key
 *     K = HMAC-SHA256(secret, "kvstash store key v1").
 * Every stored entry gets a fresh random 16-byte nonce and a one-time
 * Poly1305 key derived from it,
 *     otk = HMAC-SHA256(K, "kvstash kvfile poly1305 v1" || nonce),
 * and a 16-byte Poly1305 tag under otk over the entry's bytes. Poly1305 is a
 * real one-time MAC (OpenSSL's, vectorised: a few GB/s, about the cost of the
 * XXH3 checksum beside it); the HMAC derivation makes the one-time key
 * unique per entry, so no key is ever used twice, and nobody without the
 * secret can compute a tag.
 *
 * Invariants
 *  1. The secret and K never reach a log or an error message.
 *  2. Tags are compared in constant time (CRYPTO_memcmp).
 *  3. A secret shorter than KS_KVMAC_SECRET_MIN bytes is refused.
 *
 * Thread model: a ks_kvmac_key is immutable after ks_kvmac_key_from_secret
 * and may be shared by any number of threads; a ks_kvmac stream belongs to
 * one thread.
 */
#ifndef KS_KVMAC_H
#define KS_KVMAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KS_KVMAC_NONCE_LEN 16u
#define KS_KVMAC_TAG_LEN 16u
#define KS_KVMAC_SECRET_MIN 16u   /* bytes: shorter secrets are refused */
#define KS_KVMAC_SECRET_MAX 4096u /* bytes read from a secret file at most */
#define KS_KVMAC_ENV "KVSTASH_CACHE_SECRET"

/* The store key derived from the deployment secret. */
typedef struct ks_kvmac_key {
    uint8_t k[32];
} ks_kvmac_key;

/* Derives *out from secret (len bytes). 0, KS_EINVAL (NULL, or shorter than
 * KS_KVMAC_SECRET_MIN), KS_ENOMEM / KS_EIO (OpenSSL failed). Reentrant. */
int ks_kvmac_key_from_secret(const void *secret, size_t len, ks_kvmac_key *out);

/* Reads a secret file (trailing newlines and carriage returns are not part
 * of the secret) and derives *out. A file that is not regular, or that
 * "others" may read or write (mode & 007), is refused. 0 or KS_EINVAL /
 * KS_ENOENT / KS_EIO with the reason (never the content) in err. */
int ks_kvmac_key_load_file(const char *path, ks_kvmac_key *out, char *err, size_t errlen);

/* Fills nonce with KS_KVMAC_NONCE_LEN bytes from the system's CSPRNG. 0 or
 * KS_EIO. */
int ks_kvmac_nonce(uint8_t nonce[KS_KVMAC_NONCE_LEN]);

/* A running tag over one entry's bytes. */
typedef struct ks_kvmac ks_kvmac;

/* Starts a tag under the one-time key of (key, nonce). NULL on failure
 * (ENOMEM, OpenSSL). The caller ends it with ks_kvmac_final or
 * ks_kvmac_free. */
ks_kvmac *ks_kvmac_begin(const ks_kvmac_key *key, const uint8_t nonce[KS_KVMAC_NONCE_LEN]);
/* Feeds len bytes. 0 or KS_EIO. */
int ks_kvmac_update(ks_kvmac *m, const void *p, size_t len);
/* Writes the tag. 0 or KS_EIO. m stays to be freed. */
int ks_kvmac_final(ks_kvmac *m, uint8_t tag[KS_KVMAC_TAG_LEN]);
/* NULL is a no-op. */
void ks_kvmac_free(ks_kvmac *m);

/* One-shot: the tag of buf (len bytes). 0 or KS_ENOMEM / KS_EIO. */
int ks_kvmac_tag(const ks_kvmac_key *key, const uint8_t nonce[KS_KVMAC_NONCE_LEN], const void *buf, size_t len,
                 uint8_t tag[KS_KVMAC_TAG_LEN]);
/* A tag of short text (a Redis manifest, redis_fmt.h): the first 16 bytes
 * of HMAC-SHA256(K, label || 0 || a || 0 || b). a and b are NUL-terminated;
 * together at most 1024 bytes. 0, KS_EINVAL (too long) or KS_EIO. */
int ks_kvmac_text_tag(const ks_kvmac_key *key, const char *label, const char *a, const char *b,
                      uint8_t tag[KS_KVMAC_TAG_LEN]);
/* Constant-time comparison of two tags. */
bool ks_kvmac_equal(const uint8_t a[KS_KVMAC_TAG_LEN], const uint8_t b[KS_KVMAC_TAG_LEN]);

#endif

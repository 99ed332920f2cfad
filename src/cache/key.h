/*
 * key.h — token-exact cache keys, their hex form, the prefix hasher and a
 * key -> pointer map.
 *
 * A ks_key names one KV state: the SHA-256 of
 *
 *     model fingerprint (32 bytes)
 *   ‖ u32le(len(kv_params)) ‖ kv_params bytes   (K/V types, n_ctx_seq, flash-attn...)
 *   ‖ tokens[0..n) as little-endian u32
 *
 * or, for a tenant's state (tenant != 0: the server's tenants, docs/SECURITY.md),
 *
 *     model fingerprint ‖ u32le(len(kv_params) | 2^31) ‖ kv_params bytes
 *   ‖ u64le(tenant) ‖ tokens
 *
 * so that one tenant's keys never equal another's nor the single-tenant ones
 * (tenant 0), which are the bytes they always were.
 *
 * The length prefix makes the split between the kv-params string and the
 * tokens unambiguous (without it, params "ab"+tokens and params "a"+tokens
 * whose first byte is 'b' could hash the same bytes).
 *
 * Invariants
 *  1. The key depends only on (fingerprint, kv_params, tenant, tokens): the same
 *     inputs give the same key on every host and in every process.
 *  2. ks_key_prefixes() gives, for each requested L, exactly the key that
 *     ks_key_compute() gives for tokens[:L] (one pass over the tokens).
 *
 * Thread model: every function is reentrant; a ks_keymap is not thread-safe
 * (its owner serialises access, see tier.h).
 */
#ifndef KS_KEY_H
#define KS_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KS_KEY_LEN 32
#define KS_KEY_HEX_LEN 64 /* without the NUL */

typedef struct ks_key {
    uint8_t b[KS_KEY_LEN];
} ks_key;

/* The key of tokens[0, n). fp: 32 bytes; kv_params may be NULL when kv_len is 0.
 * Returns 0, KS_EINVAL (NULL/negative arguments) or KS_ENOMEM (OpenSSL). */
int ks_key_compute(const uint8_t fp[32], const void *kv_params, size_t kv_len,
                   const int32_t *tokens, int n, ks_key *out);

/* Keys of every prefix tokens[0, lens[i]) in one pass: lens must be sorted
 * ascending, each in [0, n]; out[i] receives the key of lens[i]. Returns 0,
 * KS_EINVAL (unsorted or out-of-range lens) or KS_ENOMEM. */
int ks_key_prefixes(const uint8_t fp[32], const void *kv_params, size_t kv_len,
                    const int32_t *tokens, int n, const int *lens, int n_lens, ks_key *out);

/* The same in a tenant's namespace (tenant 0: exactly the two above). */
int ks_key_compute_tenant(const uint8_t fp[32], const void *kv_params, size_t kv_len, uint64_t tenant,
                          const int32_t *tokens, int n, ks_key *out);
int ks_key_prefixes_tenant(const uint8_t fp[32], const void *kv_params, size_t kv_len, uint64_t tenant,
                           const int32_t *tokens, int n, const int *lens, int n_lens, ks_key *out);
/* SHA-256 of arbitrary bytes (the kv-params hash stored in kvfiles). 0 or KS_ENOMEM. */
int ks_sha256(const void *data, size_t len, uint8_t out[32]);

bool ks_key_eq(const ks_key *a, const ks_key *b);

/* Lower-case hex of n bytes into out (2n+1 bytes, NUL-terminated). */
void ks_hex_encode(const uint8_t *b, size_t n, char *out);
/* Parses exactly 2n hex digits (either case). 0 or KS_EINVAL. */
int ks_hex_decode(const char *hex, uint8_t *b, size_t n);
/* out: KS_KEY_HEX_LEN + 1 bytes. */
void ks_key_to_hex(const ks_key *k, char out[KS_KEY_HEX_LEN + 1]);
/* Parses a 64-digit hex key. 0 or KS_EINVAL. */
int ks_key_from_hex(const char *hex, ks_key *out);

/* ---------------------------------------------------------------- keymap */
/* An open-addressing hash map from ks_key to a non-NULL pointer. Keys are
 * already uniformly distributed (SHA-256), so the first 8 bytes are the hash.
 * Zero-initialised is an empty map. Owned: free with ks_keymap_free() (the
 * values are not freed). */
typedef struct ks_keymap {
    ks_key *keys;
    void **vals;     /* NULL: empty slot; KS_KEYMAP_TOMB: deleted */
    size_t cap;      /* power of two or 0 */
    size_t n;        /* live entries */
    size_t n_tomb;
} ks_keymap;

void *ks_keymap_get(const ks_keymap *m, const ks_key *k);
/* Inserts or replaces; returns 0 or KS_ENOMEM (the map is unchanged then). */
int ks_keymap_put(ks_keymap *m, const ks_key *k, void *v);
/* Removes and returns the value, NULL when absent. */
void *ks_keymap_del(ks_keymap *m, const ks_key *k);
/* Iteration: for (size_t i = 0; i < m->cap; i++) if (ks_keymap_live(m, i)) ... m->vals[i] */
bool ks_keymap_live(const ks_keymap *m, size_t i);
void ks_keymap_free(ks_keymap *m);

#endif

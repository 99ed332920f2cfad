/*
 * msghash.c — see msghash.h.
 *
 * xxhash is compiled inline (XXH_INLINE_ALL) so that the streaming state can
 * live on the stack: no allocation, hence no failure path in a void function.
 */
#include "cache/msghash.h"

#include <stddef.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Domain tags: a message-prefix hash can never equal an SPC key by accident
 * of equal inputs. */
static const char k_domain_msgs[] = "kvstash/msghash/v1";
static const char k_domain_system[] = "kvstash/spc/v1";

/* Length marker of a NULL string; no real string is this long. */
#define NULL_LEN UINT64_MAX

static void put_field(XXH3_state_t *st, const char *s) {
    uint64_t n = s ? (uint64_t)strlen(s) : NULL_LEN;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(n >> (8 * i));
    XXH3_64bits_update(st, le, sizeof le);
    if (s) XXH3_64bits_update(st, s, (size_t)n);
}

/* encode(role, content) = len(role) ‖ role ‖ 0 ‖ len(content) ‖ content */
static uint64_t hash_message(const char *role, const char *content, uint64_t seed) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    put_field(&st, role);
    static const unsigned char zero = 0;
    XXH3_64bits_update(&st, &zero, 1);
    put_field(&st, content);
    return XXH3_64bits_digest(&st);
}

uint64_t ks_msghash_empty(void) {
    return XXH3_64bits_withSeed(k_domain_msgs, sizeof k_domain_msgs - 1, 0);
}

void ks_msghash_prefixes(const char *const *roles, const char *const *contents, int n_msgs,
                         uint64_t *out) {
    if (!out) return;
    out[0] = ks_msghash_empty();
    for (int k = 0; k < n_msgs; k++)
        out[k + 1] = hash_message(roles ? roles[k] : NULL, contents ? contents[k] : NULL, out[k]);
}

uint64_t ks_msghash_system(const char *role, const char *content, const char *model_id) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, 0);
    XXH3_64bits_update(&st, k_domain_system, sizeof k_domain_system - 1);
    put_field(&st, model_id);
    uint64_t seed = XXH3_64bits_digest(&st);
    return hash_message(role, content, seed);
}

uint64_t ks_msghash_tenant(uint64_t h, uint64_t tenant) {
    static const char k_domain_tenant[] = "kvstash-tenant-v1";
    if (tenant == 0) return h;
    uint8_t b[sizeof k_domain_tenant - 1 + 16];
    memcpy(b, k_domain_tenant, sizeof k_domain_tenant - 1);
    for (int i = 0; i < 8; i++) {
        b[sizeof k_domain_tenant - 1 + i] = (uint8_t)(h >> (8 * i));
        b[sizeof k_domain_tenant - 1 + 8 + i] = (uint8_t)(tenant >> (8 * i));
    }
    uint64_t v = XXH3_64bits(b, sizeof b);
    return v ? v : 1; /* 0 means "no key" to the SPC callers */
}

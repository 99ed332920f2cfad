/*
 * kvfile_int.h — what kvfile.c shares with kvfile_mem.c (the in-memory
 * encoder and decoder of the redis tier): byte order, the layout's lengths,
 * the header codec and the running checks. Internal to those two files.
 *
 * Thread model: every function is reentrant; a sink belongs to one thread.
 */
#ifndef KS_KVFILE_INT_H
#define KS_KVFILE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "cache/kvfile.h"
#include "cache/kvmac.h"

static inline void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static inline uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static inline uint64_t nonzero(uint64_t h) { return h ? h : KS_KVFILE_CSUM_ZERO; }

static inline size_t trailer_len(uint32_t flags) {
    return (flags & KS_KVFILE_FLAG_PIN) ? KS_KVFILE_TRAILER_LEN : KS_KVFILE_TRAILER_LEN_NOPIN;
}

static inline size_t mac_len(uint32_t flags) { return (flags & KS_KVFILE_FLAG_MAC) ? KS_KVFILE_MAC_LEN : 0; }

/* What follows the payload: checksum, [nonce + tag], trailer. */
static inline size_t tail_len(uint32_t flags) { return 8 + mac_len(flags) + trailer_len(flags); }

/* The running checks over a file's bytes: the XXH3 checksum and, when the
 * entry is authenticated, its Poly1305 tag (kvmac.h). */
typedef struct sink {
    XXH3_state_t *st;
    ks_kvmac *mac; /* NULL: no tag */
    int err;       /* KS_EIO once the MAC failed */
} sink;

/* Fills a trailer of the given flags (the pin only with KS_KVFILE_FLAG_PIN);
 * returns its length. */
size_t ks__kvfile_encode_trailer(uint8_t t[KS_KVFILE_TRAILER_LEN], uint32_t flags, int64_t last_hit_us,
                                 uint64_t hits, int64_t pin_until_us);
/* Feeds n bytes to the checksum and, when there is one, the tag. */
void ks__kvfile_feed(sink *k, const void *p, size_t n);
/* The flags a writer sets for meta. */
uint32_t ks__kvfile_writer_flags(const ks_kvfile_meta *m);
/* The header of an entry of n tokens and len payload bytes. */
void ks__kvfile_encode_header(uint8_t h[KS_KVFILE_HEADER_LEN], const ks_kvfile_meta *m, uint32_t n, uint64_t len);
/* Magic and header length of a kvfile of fsize bytes: 0 or KS_ECORRUPT. */
int ks__kvfile_header_len(const uint8_t *h, uint64_t fsize, uint32_t *hlen);
/* The whole header against its check, the version and the limits, and its
 * lengths against fsize: 0, KS_ECORRUPT or KS_EVERSION. */
int ks__kvfile_parse_header(const uint8_t *h, uint32_t hlen, uint64_t fsize, ks_kvfile_meta *m);
/* The trailer (got of the expected bytes) into m's statistics and pin. */
void ks__kvfile_decode_trailer(const uint8_t *t, size_t got, ks_kvfile_meta *m);
/* The header against the caller's expectations: 0, KS_EVERSION, KS_EMISMATCH. */
int ks__kvfile_check_expect_header(const ks_kvfile_meta *m, const ks_kvfile_expect *e);
/* Writers: start the checks (a fresh nonce into nonce_out when meta has a
 * key), end them into tail (checksum, [nonce + tag], trailer). */
int ks__kvfile_tail_begin(const ks_kvfile_meta *meta, sink *k, uint8_t nonce_out[KS_KVMAC_NONCE_LEN]);
int ks__kvfile_tail_end(const ks_kvfile_meta *meta, sink *k, uint8_t *tail);
/* Readers: start the checks of header m whose tail (checksum, [nonce + tag])
 * is given (KS_ECORRUPT: exp wants a tag and there is none), end them
 * (0 or KS_ECORRUPT; KS_EIO when the MAC failed). */
int ks__kvfile_check_begin(const ks_kvfile_meta *m, const ks_kvfile_expect *exp, const uint8_t *tail, sink *k);
int ks__kvfile_check_end(sink *k, const uint8_t *tail);
/* Frees a sink's states; a zeroed sink is a no-op. */
void ks__kvfile_sink_free(sink *k);

#endif

/*
 * kvfile.h — the on-disk format of one cached KV state (docs/kvfile-format.md).
 *
 * A kvfile is named <dir>/<64 hex of the key>.kvs and holds, little-endian:
 *
 *   header (160 bytes, self-checked by an XXH3-64 in its last 8 bytes)
 *   tokens (n_tokens x u32)
 *   payload (llama sequence state, opaque)
 *   checksum (u64: XXH3-64 of every byte before it)
 *   [nonce (16) + Poly1305 tag (16) of every byte before the nonce: only
 *    with flag KS_KVFILE_FLAG_MAC, written when the store has a secret]
 *   trailer (32 bytes: last-hit time, hit count, pin deadline, XXH3-64 of
 *            those 24 bytes; flag KS_KVFILE_FLAG_PIN. Files written before
 *            pins have no flag and a 24-byte trailer without the pin: still
 *            read, their pin is 0)
 *
 * Writing: a temp file ".<key16>.<pid>.<counter>.tmp" in the same directory
 * is written, fsynced and closed, then link()ed to its final name (which
 * fails when the name exists: a kvfile is never replaced), the temp name is
 * unlinked and the directory fsynced. Every failure removes the temp file.
 * On a filesystem without hard links (EPERM/EOPNOTSUPP/ENOSYS/EMLINK from
 * link) the temp file is renamed instead.
 *
 * Reading is bounded: every length is checked against fixed limits and the
 * file's size before anything is allocated, and no byte read from the file
 * ever reaches an assert. Files are opened with O_NONBLOCK | O_NOFOLLOW |
 * O_CLOEXEC and fstat()ed before any read or write: a name that is not a
 * regular file (a symlink, never followed; a FIFO, socket, device or
 * directory) is refused with KS_EINVAL and never blocks the caller.
 *
 * Invariants
 *  1. No incomplete file is ever visible under a final name: the final name
 *     appears (link) only after the whole content was written and fsynced.
 *  2. A file whose header check or checksum does not match is refused with
 *     KS_ECORRUPT; a file of another format version or llama state version
 *     with KS_EVERSION; a sound file for another model, other KV params, key
 *     or tokens with KS_EMISMATCH. Flipping any byte before the trailer makes
 *     the file fail to read.
 *  3. A stored checksum is never 0 (a computed 0 is stored as
 *     KS_KVFILE_CSUM_ZERO), so 0 never means "no checksum".
 *  4. The trailer (hit count, last hit, pin) is outside both checks: updating
 *     it in place (ks_kvfile_touch) never invalidates the file. A torn or
 *     damaged trailer only loses the hit statistics and the pin (trailer_ok =
 *     false).
 *  5. A reader given a store key (exp->mac) accepts only a file with flag
 *     KS_KVFILE_FLAG_MAC whose tag verifies under it: anything else is
 *     KS_ECORRUPT, like a checksum failure. The tag is checked in the same
 *     pass as the checksum, before any token or payload byte is returned.
 *
 * Thread model: every function is reentrant and works on paths; concurrent
 * readers and one writer per final name are safe (see store.h for who
 * writes). Other processes may read and write the same directory.
 */
#ifndef KS_KVFILE_H
#define KS_KVFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache/key.h"
#include "cache/kvmac.h"

#define KS_KVFILE_MAGIC "KVSTASH\0"
#define KS_KVFILE_VERSION 1u
#define KS_KVFILE_HEADER_LEN 160u
#define KS_KVFILE_HEADER_MAX 4096u          /* any version's header must fit */
#define KS_KVFILE_FLAG_PIN 1u               /* header flag: the trailer holds a pin deadline */
#define KS_KVFILE_FLAG_REASON6 2u           /* header flag: the reason is a value added after pins
                                               (6, checkpoint): readers before it refuse the file
                                               (KS_EVERSION) instead of taking it for corrupt */
#define KS_KVFILE_FLAG_MAC 16u              /* header flag: nonce + Poly1305 tag after the checksum
                                               (kvmac.h); readers before it refuse the file */
#define KS_KVFILE_MAC_LEN 32u               /* nonce (16) + tag (16), flag KS_KVFILE_FLAG_MAC */
#define KS_KVFILE_TRAILER_LEN 32u           /* last hit, hits, pin, check (KS_KVFILE_FLAG_PIN) */
#define KS_KVFILE_TRAILER_LEN_NOPIN 24u     /* last hit, hits, check (no flag: files before pins) */
#define KS_KVFILE_TAIL_LEN 40u              /* checksum (8) + trailer (32), as written now */
#define KS_KVFILE_MAX_TOKENS (1u << 24)     /* 16 Mi tokens */
#define KS_KVFILE_MAX_PAYLOAD ((uint64_t)1 << 40)
#define KS_KVFILE_CSUM_ZERO 0x4b56535441534830ull /* "KVSTASH0": stored for a computed 0 */
#define KS_KVFILE_EXT ".kvs"
/* "<64 hex>.kvs" + NUL */
#define KS_KVFILE_NAME_LEN (KS_KEY_HEX_LEN + 4)

/* What a header (and trailer) says. */
typedef struct ks_kvfile_meta {
    uint32_t version;        /* format version */
    uint32_t state_version;  /* llama's sequence-state version */
    uint32_t reason;         /* ks_reason */
    uint32_t n_tokens;
    uint32_t flags;          /* KS_KVFILE_FLAG_*: set by the readers; the writer sets its own */
    uint64_t payload_len;
    int64_t created_us;      /* wall clock, microseconds since the epoch */
    uint8_t model_fp[32];
    uint8_t params_hash[32]; /* SHA-256 of the kv-params bytes */
    ks_key key;
    uint64_t tenant;         /* whose state (the key's tenant, key.h; 0: single tenant) */
    /* trailer (not checksummed) */
    int64_t last_hit_us;     /* created_us when never hit or when the trailer is bad */
    uint64_t hits;
    int64_t pin_until_us;    /* wall clock: keep the entry until then (store.h "Pins"); 0: not
                                pinned (also without KS_KVFILE_FLAG_PIN or a bad trailer) */
    bool trailer_ok;
    uint64_t file_size;      /* set by the readers */
    /* writers only: authenticate the entry under this key (flag
       KS_KVFILE_FLAG_MAC); NULL: no tag. Borrowed; readers set NULL */
    const ks_kvmac_key *mac;
} ks_kvfile_meta;

/* What the reader must find; NULL pointers are not checked. */
typedef struct ks_kvfile_expect {
    const uint8_t *model_fp;     /* 32 bytes */
    const uint8_t *params_hash;  /* 32 bytes */
    bool check_state_version;
    uint32_t state_version;
    const ks_key *key;
    const int32_t *tokens;       /* the exact token list, n_tokens long */
    int n_tokens;
    /* the store key: the entry must carry a valid tag under it (flag
       KS_KVFILE_FLAG_MAC), else KS_ECORRUPT. NULL: tags are not checked
       (an entry with one is read like any other) */
    const ks_kvmac_key *mac;
} ks_kvfile_expect;

/* <dir>/<hex>.kvs into out. Returns 0 or KS_EINVAL when it does not fit. */
int ks_kvfile_path(const char *dir, const ks_key *key, char *out, size_t n);
/* true when name is "<64 lower-case hex>.kvs"; fills *key when non-NULL. */
bool ks_kvfile_name_parse(const char *name, ks_key *key);
/* true when name is one of our temp files; fills *pid with its writer. */
bool ks_kvfile_temp_parse(const char *name, pid_t *pid);

/* Writes and publishes <dir>/<key>.kvs. meta supplies state_version, reason,
 * created_us, model_fp, params_hash, key and pin_until_us (n_tokens and
 * payload_len come from n and len; the file always has KS_KVFILE_FLAG_PIN).
 * tokens/payload are borrowed.
 * *existed (may be NULL) is set when a file of that name already existed: then
 * nothing was published and 0 is returned. *file_bytes (may be NULL) receives
 * the published file's size.
 * Errors: KS_EINVAL (bad arguments, n or len over the limits), KS_ENOSPC
 * (ENOSPC/EDQUOT), KS_ENOMEM, KS_EIO (any other failure). On error no temp
 * file is left behind and nothing is published — except when only the
 * clean-up unlink itself failed, in which case *orphan (may be NULL) receives
 * the temp path (PATH_MAX bytes) so that the caller can retry the unlink.
 * A failure after the final name appeared (unlinking the temp name, fsyncing
 * the directory) is logged and ignored: the published file is complete. */
int ks_kvfile_write(const char *dir, const ks_kvfile_meta *meta, const int32_t *tokens, int n,
                    const uint8_t *payload, size_t len, bool *existed, uint64_t *file_bytes,
                    char *orphan);

/* Reads and checks the header and trailer only (no checksum of the body):
 * what a directory scan needs. Errors: KS_ENOENT, KS_EINVAL (not a regular
 * file, see "Reading" above), KS_EIO, KS_ECORRUPT, KS_EVERSION (another
 * format version; meta->version is set). */
int ks_kvfile_read_meta(const char *path, ks_kvfile_meta *meta);

/* Reads and verifies the whole file against exp (may be NULL).
 * tokens_out / payload_out (may be NULL) receive owned copies (free()); when
 * NULL the data is only verified, streaming, without a big allocation.
 * meta (may be NULL) receives the header and trailer.
 * Errors: KS_ENOENT, KS_EINVAL (not a regular file), KS_EIO, KS_ENOMEM,
 * KS_ECORRUPT (header check, lengths, checksum), KS_EVERSION (format or state
 * version), KS_EMISMATCH (model, params, key or tokens differ from exp).
 * Nothing is allocated on error. */
int ks_kvfile_read(const char *path, const ks_kvfile_expect *exp, ks_kvfile_meta *meta,
                   int32_t **tokens_out, uint8_t **payload_out);
/* Same, reading the payload into the caller's buffer *buf of *cap bytes
 * (both may be NULL / 0): reused when big enough, else replaced by a new
 * one (*buf and *cap updated; the old one freed). Reusing a buffer whose
 * pages are already mapped reads a page-cached file about 3x faster than
 * into a fresh allocation (first-touch page faults). On error *buf is still
 * a valid buffer of *cap bytes (or NULL) and holds no meaningful data. */
int ks_kvfile_read_buf(const char *path, const ks_kvfile_expect *exp, ks_kvfile_meta *meta, uint8_t **buf,
                       size_t *cap);

/* Rewrites the trailer in place (one pwrite of the trailer) with last_hit_us,
 * hits and, in a file with KS_KVFILE_FLAG_PIN, the pin deadline: the later of
 * pin_until_us and the one the file holds (another process may have
 * extended it; a pin is never shortened here). A file without the flag keeps
 * no pin (pin_until_us is ignored). 0, KS_ENOENT, KS_EINVAL (not a regular
 * file: a symlink is never followed), KS_EIO or KS_ECORRUPT (the file is not
 * a kvfile of this version, or its header check fails).
 * The read and the write of the pin are not atomic across processes: two
 * processes touching one file at the same instant may lose one's extension
 * (the entry is then evictable earlier; the file stays valid). */
int ks_kvfile_touch(const char *path, int64_t last_hit_us, uint64_t hits, int64_t pin_until_us);

/* The size of a file of n tokens and len payload bytes with the given
 * KS_KVFILE_FLAG_* flags of the writer (ks_kvfile_size: without a tag). */
uint64_t ks_kvfile_size_flags(int n, size_t len, uint32_t flags);

/* In memory (the redis tier, tier_redis.c): the exact bytes of the file
 * ks_kvfile_write would write, and their reader.
 *
 * ks_kvfile_size: the size of the kvfile of n tokens and len payload bytes.
 * ks_kvfile_encode: *out receives a malloc'd buffer (caller frees) of
 * *out_len bytes. 0, KS_EINVAL (limits), KS_ENOMEM.
 * ks_kvfile_decode: checks buf (len bytes: header, lengths against len,
 * checksum, exp as ks_kvfile_read) without copying; *payload_off (may be
 * NULL) receives where the payload starts in buf, meta (may be NULL) the
 * header. 0, KS_ECORRUPT, KS_EVERSION, KS_EMISMATCH. Never reads outside
 * [buf, buf + len). Reentrant. */
uint64_t ks_kvfile_size(int n, size_t len);
int ks_kvfile_encode(const ks_kvfile_meta *meta, const int32_t *tokens, int n, const uint8_t *payload, size_t len,
                     uint8_t **out, size_t *out_len);
int ks_kvfile_decode(const uint8_t *buf, size_t len, const ks_kvfile_expect *exp, ks_kvfile_meta *meta,
                     size_t *payload_off);

#endif

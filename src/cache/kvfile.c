/*
 * kvfile.c — see kvfile.h and docs/kvfile-format.md.
 *
 * Order of the reader's checks, and why:
 *  1. magic, then header_len against [24, 4096] and the file size — nothing
 *     else can be located before that;
 *  2. the header check (XXH3-64 of the header bytes before it) — from here on
 *     the header fields are trusted to be what the writer wrote, so a flipped
 *     byte in the version field reads as ECORRUPT, not as a version bump;
 *  3. format version, then the v1 fields: reason range, flags (only
 *     KS_KVFILE_FLAG_PIN, which sets the trailer's length, and
 *     KS_KVFILE_FLAG_REASON6 are known), lengths
 *     against the limits and against the file size (exact equality);
 *  4. state version, model fingerprint, params hash, key against `exp` —
 *     cheap rejections before any body byte is read;
 *  5. tokens and payload, streamed through XXH3, then the stored checksum;
 *  6. the tokens against exp->tokens.
 */
#include "cache/kvfile.h"
#include "cache/kvfile_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/base.h"
#include "cache/store_cfg.h"
#include "cache/sysio.h"

#define OFF_VERSION 8
#define OFF_HEADER_LEN 12
#define OFF_STATE_VERSION 16
#define OFF_REASON 20
#define OFF_N_TOKENS 24
#define OFF_FLAGS 28
#define OFF_PAYLOAD_LEN 32
#define OFF_CREATED 40
#define OFF_FP 48
#define OFF_PARAMS 80
#define OFF_KEY 112
#define OFF_TENANT 144 /* "reserved", always 0, before tenants: what readers from then ignore */
#define OFF_HCHECK 152
#define VERIFY_CHUNK (1u << 20)
#define KNOWN_FLAGS (KS_KVFILE_FLAG_PIN | KS_KVFILE_FLAG_REASON6 | KS_KVFILE_FLAG_MAC)
/* Checksum and tag are computed over one chunk at a time, both while it is in
 * the cache: a second pass over a 1 GB state would read it from memory again. */
#define HASH_CHUNK (256u << 10)

/* ------------------------------------------------------- little-endian io */
/* The check of a trailer of len bytes: XXH3-64 of the fields before it. */
static uint64_t trailer_check(const uint8_t *t, size_t len) { return nonzero(XXH3_64bits(t, len - 8)); }

void ks__kvfile_feed(sink *k, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        size_t c = n < HASH_CHUNK ? n : HASH_CHUNK;
        XXH3_64bits_update(k->st, b, c);
        if (k->mac && ks_kvmac_update(k->mac, b, c) != 0) k->err = KS_EIO;
        b += c;
        n -= c;
    }
}

/* Fills a trailer of the given flags; the pin is left out without the flag. */
size_t ks__kvfile_encode_trailer(uint8_t t[KS_KVFILE_TRAILER_LEN], uint32_t flags, int64_t last_hit_us, uint64_t hits,
                             int64_t pin_until_us) {
    size_t len = trailer_len(flags);
    put64(t, (uint64_t)last_hit_us);
    put64(t + 8, hits);
    if (flags & KS_KVFILE_FLAG_PIN) put64(t + 16, (uint64_t)(pin_until_us > 0 ? pin_until_us : 0));
    put64(t + len - 8, trailer_check(t, len));
    return len;
}

/* ------------------------------------------------------------------ names */
int ks_kvfile_path(const char *dir, const ks_key *key, char *out, size_t n) {
    char hex[KS_KEY_HEX_LEN + 1];
    ks_key_to_hex(key, hex);
    int w = snprintf(out, n, "%s/%s%s", dir, hex, KS_KVFILE_EXT);
    return (w < 0 || (size_t)w >= n) ? KS_EINVAL : 0;
}

bool ks_kvfile_name_parse(const char *name, ks_key *key) {
    if (strlen(name) != KS_KEY_HEX_LEN + 4 || strcmp(name + KS_KEY_HEX_LEN, KS_KVFILE_EXT) != 0)
        return false;
    for (int i = 0; i < KS_KEY_HEX_LEN; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    ks_key k;
    if (ks_hex_decode(name, k.b, KS_KEY_LEN) != 0) return false;
    if (key) *key = k;
    return true;
}

bool ks_kvfile_temp_parse(const char *name, pid_t *pid) {
    /* ".<16 hex>.<pid>.<counter>.tmp" */
    size_t len = strlen(name);
    if (len < 1 + 16 + 1 + 1 + 1 + 1 + 4 || name[0] != '.' || name[17] != '.' ||
        strcmp(name + len - 4, ".tmp") != 0)
        return false;
    char *end = NULL;
    errno = 0;
    long p = strtol(name + 18, &end, 10);
    if (errno || !end || *end != '.' || p <= 0 || p > INT_MAX) return false;
    if (pid) *pid = (pid_t)p;
    return true;
}

/* ---------------------------------------------------------------- writing */
/* The flags a writer sets for meta. */
uint32_t ks__kvfile_writer_flags(const ks_kvfile_meta *m) {
    return KS_KVFILE_FLAG_PIN | (m->reason > KS_REASON_PIN ? KS_KVFILE_FLAG_REASON6 : 0) |
           (m->mac ? KS_KVFILE_FLAG_MAC : 0);
}

void ks__kvfile_encode_header(uint8_t h[KS_KVFILE_HEADER_LEN], const ks_kvfile_meta *m, uint32_t n,
                          uint64_t len) {
    memset(h, 0, KS_KVFILE_HEADER_LEN);
    memcpy(h, KS_KVFILE_MAGIC, 8);
    put32(h + OFF_VERSION, KS_KVFILE_VERSION);
    put32(h + OFF_HEADER_LEN, KS_KVFILE_HEADER_LEN);
    put32(h + OFF_STATE_VERSION, m->state_version);
    put32(h + OFF_REASON, m->reason);
    put32(h + OFF_N_TOKENS, n);
    put32(h + OFF_FLAGS, ks__kvfile_writer_flags(m));
    put64(h + OFF_PAYLOAD_LEN, len);
    put64(h + OFF_CREATED, (uint64_t)m->created_us);
    memcpy(h + OFF_FP, m->model_fp, 32);
    memcpy(h + OFF_PARAMS, m->params_hash, 32);
    memcpy(h + OFF_KEY, m->key.b, 32);
    put64(h + OFF_TENANT, m->tenant);
    put64(h + OFF_HCHECK, nonzero(XXH3_64bits(h, OFF_HCHECK)));
}

/* Writes the tokens as little-endian u32 and feeds them to the checksum. */
static int write_tokens(int fd, sink *st, const int32_t *t, int n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    ks__kvfile_feed(st, t, (size_t)n * 4);
    return ks_sysio_write_all(fd, t, (size_t)n * 4);
#else
    uint8_t buf[4096];
    while (n > 0) {
        int k = n < 1024 ? n : 1024;
        for (int i = 0; i < k; i++) put32(buf + 4 * i, (uint32_t)t[i]);
        ks__kvfile_feed(st, buf, (size_t)k * 4);
        if (ks_sysio_write_all(fd, buf, (size_t)k * 4) != 0) return -1;
        t += k;
        n -= k;
    }
    return 0;
#endif
}

static int fsync_dir(const char *dir) {
    int fd = ks_sysio_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return -1;
    int rc = ks_sysio_fsync(fd);
    int saved = errno;
    ks_sysio_close(fd);
    errno = saved;
    return rc;
}

static _Atomic unsigned long g_tmp_counter;

static int write_err(int e) {
    int rc = ks_errno_map(e);
    return rc == KS_ENOENT ? KS_EIO : rc; /* the directory vanished: an I/O failure for a writer */
}

/* Starts the checks of a new entry: the checksum, and the tag when meta
 * has a key, whose fresh nonce goes to nonce_out. 0, KS_ENOMEM or KS_EIO. */
int ks__kvfile_tail_begin(const ks_kvfile_meta *meta, sink *k, uint8_t nonce_out[KS_KVMAC_NONCE_LEN]) {
    if (!(k->st = XXH3_createState())) return KS_ENOMEM;
    XXH3_64bits_reset(k->st);
    if (!meta->mac) return 0;
    if (ks_kvmac_nonce(nonce_out) != 0) return KS_EIO;
    return (k->mac = ks_kvmac_begin(meta->mac, nonce_out)) ? 0 : KS_ENOMEM;
}

/* Ends them into tail: checksum, [nonce (already there, from tail_begin) +
 * tag, which covers the checksum too], then a fresh trailer (never hit). */
int ks__kvfile_tail_end(const ks_kvfile_meta *meta, sink *k, uint8_t *tail) {
    uint32_t flags = ks__kvfile_writer_flags(meta);
    put64(tail, nonzero(XXH3_64bits_digest(k->st)));
    if (k->mac) {
        if (k->err || ks_kvmac_update(k->mac, tail, 8) != 0 ||
            ks_kvmac_final(k->mac, tail + 8 + KS_KVMAC_NONCE_LEN) != 0)
            return KS_EIO;
    }
    ks__kvfile_encode_trailer(tail + 8 + mac_len(flags), flags, meta->created_us, 0, meta->pin_until_us);
    return 0;
}

void ks__kvfile_sink_free(sink *k) {
    XXH3_freeState(k->st);
    ks_kvmac_free(k->mac);
    k->st = NULL;
    k->mac = NULL;
}

int ks_kvfile_write(const char *dir, const ks_kvfile_meta *meta, const int32_t *tokens, int n,
                    const uint8_t *payload, size_t len, bool *existed, uint64_t *file_bytes,
                    char *orphan) {
    int rc = 0, fd = -1, cfd;
    bool tmp_exists = false, published = false;
    char tmp[PATH_MAX], final[PATH_MAX], hex[KS_KEY_HEX_LEN + 1];
    sink sk = {0};
    uint8_t hdr[KS_KVFILE_HEADER_LEN], tail[8 + KS_KVFILE_MAC_LEN + KS_KVFILE_TRAILER_LEN];
    uint32_t flags = meta ? ks__kvfile_writer_flags(meta) : 0;

    if (existed) *existed = false;
    if (orphan) orphan[0] = '\0';
    if (!dir || !meta || n < 0 || (uint64_t)n > KS_KVFILE_MAX_TOKENS || (n && !tokens) ||
        (uint64_t)len > KS_KVFILE_MAX_PAYLOAD || (len && !payload))
        return KS_EINVAL;
    ks_key_to_hex(&meta->key, hex);
    if (ks_kvfile_path(dir, &meta->key, final, sizeof final) != 0) return KS_EINVAL;
    int w = snprintf(tmp, sizeof tmp, "%s/.%.16s.%ld.%lu.tmp", dir, hex, (long)getpid(),
                     atomic_fetch_add(&g_tmp_counter, 1) + 1);
    if (w < 0 || (size_t)w >= sizeof tmp) return KS_EINVAL;
    if ((rc = ks__kvfile_tail_begin(meta, &sk, tail + 8)) != 0) goto done;

    fd = ks_sysio_open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = write_err(errno);
        goto done;
    }
    tmp_exists = true;
    ks__kvfile_encode_header(hdr, meta, (uint32_t)n, (uint64_t)len);
    ks__kvfile_feed(&sk, hdr, sizeof hdr);
    if (ks_sysio_write_all(fd, hdr, sizeof hdr) != 0 || write_tokens(fd, &sk, tokens, n) != 0) {
        rc = write_err(errno);
        goto done;
    }
    if (len) {
        ks__kvfile_feed(&sk, payload, len);
        if (ks_sysio_write_all(fd, payload, len) != 0) {
            rc = write_err(errno);
            goto done;
        }
    }
    if ((rc = ks__kvfile_tail_end(meta, &sk, tail)) != 0) goto done;
    if (ks_sysio_write_all(fd, tail, tail_len(flags)) != 0) {
        rc = write_err(errno);
        goto done;
    }
    /* The data must be on stable storage before the name points at it, or a
     * crash could leave a final name over a hole (SQLite unixSync). */
    if (ks_sysio_fsync(fd) != 0) {
        rc = write_err(errno);
        goto done;
    }
    cfd = fd;
    fd = -1;
    if (ks_sysio_close(cfd) != 0) {
        rc = write_err(errno);
        goto done;
    }
    /* link() publishes without ever replacing an existing file: a kvfile under
     * its final name is immutable except for its trailer. */
    if (ks_sysio_link(tmp, final) != 0) {
        int e = errno;
        if (e == EEXIST) {
            if (existed) *existed = true;
            goto done;
        }
        /* A filesystem without hard links: rename instead. It may replace a
         * file published meanwhile under the same key — an equally valid
         * state of the same tokens, and readers keep the inode they opened. */
        if (!(e == EPERM || e == EOPNOTSUPP || e == ENOSYS || e == EMLINK) || ks_sysio_rename(tmp, final) != 0) {
            rc = write_err(e == EPERM || e == EOPNOTSUPP || e == ENOSYS || e == EMLINK ? errno : e);
            goto done;
        }
        tmp_exists = false; /* renamed: there is no temp name to remove */
    }
    published = true;
    if (file_bytes) *file_bytes = ks_kvfile_size_flags(n, len, flags);
    /* From here the file is published and complete: later failures only cost
     * a stray temp name (left to the caller's retry) or the durability of the
     * name, never a bad file. */
    if (tmp_exists && ks_sysio_unlink(tmp) != 0) {
        KS_WARN("kvfile", "unlink %s after publishing: %s", tmp, strerror(errno));
        if (orphan) snprintf(orphan, PATH_MAX, "%s", tmp);
    }
    tmp_exists = false;
    if (fsync_dir(dir) != 0) KS_WARN("kvfile", "fsync dir %s: %s", dir, strerror(errno));
done:
    if (fd >= 0) ks_sysio_close(fd);
    if (!published && tmp_exists && ks_sysio_unlink(tmp) != 0 && errno != ENOENT) {
        KS_WARN("kvfile", "cannot remove temp file %s: %s", tmp, strerror(errno));
        if (orphan) snprintf(orphan, PATH_MAX, "%s", tmp);
    }
    ks__kvfile_sink_free(&sk);
    return rc;
}

/* ---------------------------------------------------------------- reading */
/* Opens an existing kvfile and fstats it: 0 with *fd open and *sb filled, or
 * KS_EINVAL (not a regular file), KS_ENOENT, KS_EIO, KS_ENOMEM (no space
 * cannot be the reason an open of an existing file fails).
 * Any name in a store directory may be something else: a FIFO would block a
 * plain open() until a writer comes (the server's rescans run on the
 * inference thread), and a symlink would make a trailer update write into
 * whatever it points to. So the open never blocks (O_NONBLOCK) and never
 * follows a final symlink (O_NOFOLLOW: ELOOP), and nothing is read before
 * fstat says "regular file". O_NONBLOCK is left on: Linux ignores it for
 * reads and writes of regular files. */
/* Whether uid owns the directory that holds path. */
static bool owner_of_dir(const char *path, uid_t uid) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 0;
    if (n >= sizeof dir) return false;
    if (n) memcpy(dir, path, n);
    else dir[n++] = '.';
    dir[n] = '\0';
    struct stat ds;
    return stat(dir, &ds) == 0 && ds.st_uid == uid;
}

static int open_existing(const char *path, int flags, int *fd, struct stat *sb) {
    *fd = ks_sysio_open(path, flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
    if (*fd < 0) {
        int e = errno;
        /* ELOOP: a symlink; ENXIO: a socket (or a FIFO opened for writing
         * without a reader); EISDIR: a directory opened for writing. */
        if (e == ELOOP || e == ENXIO || e == EISDIR || e == ENODEV) return KS_EINVAL;
        int rc = ks_errno_map(e);
        return rc == KS_ENOSPC ? KS_EIO : rc;
    }
    int rc = 0;
    if (fstat(*fd, sb) != 0)
        rc = KS_EIO;
    else if (!S_ISREG(sb->st_mode))
        rc = KS_EINVAL;
    /* Only the store's own entries: a file another user put in a store
     * directory (one that was open to others once) is not read. The
     * store's own: ours, or (root's maintenance of a server's store) the
     * directory owner's. */
    else if (sb->st_uid != geteuid() && !owner_of_dir(path, sb->st_uid))
        rc = KS_EINVAL;
    if (rc != 0) {
        ks_sysio_close(*fd);
        *fd = -1;
    }
    return rc;
}

/* Checks the first 16 bytes of a kvfile of fsize bytes (magic, header
 * length): 0 and *hlen, or KS_ECORRUPT. */
int ks__kvfile_header_len(const uint8_t *h, uint64_t fsize, uint32_t *hlen) {
    if (fsize < 16 + 8 || memcmp(h, KS_KVFILE_MAGIC, 8) != 0) return KS_ECORRUPT;
    *hlen = get32(h + OFF_HEADER_LEN);
    if (*hlen < 24 || *hlen > KS_KVFILE_HEADER_MAX || *hlen > fsize) return KS_ECORRUPT;
    return 0;
}

/* Checks a whole header of hlen bytes (its own check, version, limits, and
 * that its lengths add up to fsize) into *m: 0, KS_ECORRUPT or KS_EVERSION.
 * Every file and every in-memory kvfile goes through here. */
int ks__kvfile_parse_header(const uint8_t *h, uint32_t hlen, uint64_t fsize, ks_kvfile_meta *m) {
    if (get64(h + hlen - 8) != nonzero(XXH3_64bits(h, hlen - 8))) return KS_ECORRUPT;
    m->version = get32(h + OFF_VERSION);
    if (m->version != KS_KVFILE_VERSION) return KS_EVERSION;
    if (hlen != KS_KVFILE_HEADER_LEN) return KS_ECORRUPT;
    m->state_version = get32(h + OFF_STATE_VERSION);
    m->reason = get32(h + OFF_REASON);
    m->n_tokens = get32(h + OFF_N_TOKENS);
    m->payload_len = get64(h + OFF_PAYLOAD_LEN);
    m->created_us = (int64_t)get64(h + OFF_CREATED);
    memcpy(m->model_fp, h + OFF_FP, 32);
    memcpy(m->params_hash, h + OFF_PARAMS, 32);
    memcpy(m->key.b, h + OFF_KEY, 32);
    m->tenant = get64(h + OFF_TENANT);
    m->flags = get32(h + OFF_FLAGS);
    if (m->flags & ~(uint32_t)KNOWN_FLAGS) return KS_EVERSION; /* a feature this reader does not know */
    size_t tlen = tail_len(m->flags);
    /* REASON6 is set exactly when the reason is one added after pins (the
     * writer's rule): a file that says otherwise was not written by kvstash */
    if (m->reason >= KS_REASON__N || (m->reason > KS_REASON_PIN) != !!(m->flags & KS_KVFILE_FLAG_REASON6) ||
        m->n_tokens > KS_KVFILE_MAX_TOKENS ||
        m->payload_len > KS_KVFILE_MAX_PAYLOAD ||
        fsize != (uint64_t)KS_KVFILE_HEADER_LEN + 4ull * m->n_tokens + m->payload_len + tlen)
        return KS_ECORRUPT;
    return 0;
}

/* The trailer t (got bytes of the tlen expected): advisory statistics and the
 * pin, outside every check. */
void ks__kvfile_decode_trailer(const uint8_t *t, size_t got, ks_kvfile_meta *m) {
    size_t tlen = trailer_len(m->flags);
    m->trailer_ok = got == tlen && get64(t + tlen - 8) == trailer_check(t, tlen);
    m->last_hit_us = m->trailer_ok ? (int64_t)get64(t) : m->created_us;
    m->hits = m->trailer_ok ? get64(t + 8) : 0;
    m->pin_until_us = m->trailer_ok && (m->flags & KS_KVFILE_FLAG_PIN) ? (int64_t)get64(t + 16) : 0;
}

/* Opens path and reads + checks its header. On success *fd is open. */
static int open_header(const char *path, int *fd_out, ks_kvfile_meta *m) {
    int rc = 0, fd = -1;
    uint8_t h[KS_KVFILE_HEADER_MAX];
    struct stat sb;
    uint32_t hlen = 0;
    memset(m, 0, sizeof *m);
    *fd_out = -1;
    if ((rc = open_existing(path, O_RDONLY, &fd, &sb)) != 0) goto done;
    uint64_t fsize = (uint64_t)sb.st_size;
    m->file_size = fsize;
    if (fsize < 16 + 8) {
        rc = KS_ECORRUPT;
        goto done;
    }
    ssize_t r = ks_sysio_pread_all(fd, h, 16, 0);
    if (r < 0) {
        rc = KS_EIO;
        goto done;
    }
    if (r < 16 || (rc = ks__kvfile_header_len(h, fsize, &hlen)) != 0) {
        rc = KS_ECORRUPT;
        goto done;
    }
    r = ks_sysio_pread_all(fd, h, hlen, 0);
    if (r < 0) {
        rc = KS_EIO;
        goto done;
    }
    if ((uint32_t)r < hlen) {
        rc = KS_ECORRUPT;
        goto done;
    }
    if ((rc = ks__kvfile_parse_header(h, hlen, fsize, m)) != 0) goto done;
    size_t tlen = trailer_len(m->flags);
    uint8_t t[KS_KVFILE_TRAILER_LEN];
    r = ks_sysio_pread_all(fd, t, tlen, (off_t)(fsize - tlen));
    if (r < 0) {
        rc = KS_EIO;
        goto done;
    }
    ks__kvfile_decode_trailer(t, (size_t)r, m);
    *fd_out = fd;
    fd = -1;
done:
    if (fd >= 0) ks_sysio_close(fd);
    return rc;
}

int ks_kvfile_read_meta(const char *path, ks_kvfile_meta *meta) {
    ks_kvfile_meta m;
    int fd = -1;
    int rc = open_header(path, &fd, &m);
    if (fd >= 0) ks_sysio_close(fd);
    if (meta) *meta = m;
    return rc;
}

int ks__kvfile_check_expect_header(const ks_kvfile_meta *m, const ks_kvfile_expect *e) {
    if (!e) return 0;
    if (e->check_state_version && m->state_version != e->state_version) return KS_EVERSION;
    if (e->model_fp && memcmp(m->model_fp, e->model_fp, 32) != 0) return KS_EMISMATCH;
    if (e->params_hash && memcmp(m->params_hash, e->params_hash, 32) != 0) return KS_EMISMATCH;
    if (e->key && !ks_key_eq(&m->key, e->key)) return KS_EMISMATCH;
    if (e->tokens && (e->n_tokens < 0 || (uint32_t)e->n_tokens != m->n_tokens)) return KS_EMISMATCH;
    return 0;
}

/* Reads exactly n bytes at off and feeds them to the running checks (k may
 * be NULL), VERIFY_CHUNK bytes at a time so that each chunk is hashed while
 * it is still in the cache. KS_EIO on a read error, KS_ECORRUPT when the
 * file ends early (truncated under us). */
static int read_exact(int fd, void *buf, size_t n, off_t off, sink *k) {
    uint8_t *b = buf;
    while (n > 0) {
        size_t c = n < VERIFY_CHUNK ? n : VERIFY_CHUNK;
        ssize_t r = ks_sysio_pread_all(fd, b, c, off);
        if (r < 0) return KS_EIO;
        if ((size_t)r != c) return KS_ECORRUPT;
        if (k) ks__kvfile_feed(k, b, c);
        b += c;
        off += (off_t)c;
        n -= c;
    }
    return 0;
}

/* Starts the reader's checks of an entry of header m whose tail (checksum,
 * [nonce + tag]) is in tail: the checksum, and the tag when exp asks for
 * one — an entry without a tag is then refused (KS_ECORRUPT) before its body
 * is read. */
int ks__kvfile_check_begin(const ks_kvfile_meta *m, const ks_kvfile_expect *exp, const uint8_t *tail, sink *k) {
    if (!(k->st = XXH3_createState())) return KS_ENOMEM;
    XXH3_64bits_reset(k->st);
    if (!exp || !exp->mac) return 0;
    if (!(m->flags & KS_KVFILE_FLAG_MAC)) return KS_ECORRUPT;
    return (k->mac = ks_kvmac_begin(exp->mac, tail + 8)) ? 0 : KS_ENOMEM;
}

/* Ends them: the checksum, then the tag over everything before the nonce.
 * 0 or KS_ECORRUPT (KS_EIO when the MAC itself failed). */
int ks__kvfile_check_end(sink *k, const uint8_t *tail) {
    if (get64(tail) != nonzero(XXH3_64bits_digest(k->st))) return KS_ECORRUPT;
    if (!k->mac) return 0;
    uint8_t tag[KS_KVMAC_TAG_LEN];
    if (k->err || ks_kvmac_update(k->mac, tail, 8) != 0 || ks_kvmac_final(k->mac, tag) != 0) return KS_EIO;
    return ks_kvmac_equal(tag, tail + 8 + KS_KVMAC_NONCE_LEN) ? 0 : KS_ECORRUPT;
}

/* The reader behind ks_kvfile_read and ks_kvfile_read_buf: the payload goes
 * into *pbuf (*pcap bytes, reused when big enough) when pbuf is given. */
static int read_file(const char *path, const ks_kvfile_expect *exp, ks_kvfile_meta *meta, int32_t **tokens_out,
                     uint8_t **pbuf, size_t *pcap) {
    int rc = 0, fd = -1;
    ks_kvfile_meta m;
    int32_t *toks = NULL;
    uint8_t *chunk = NULL;
    sink sk = {0};
    uint8_t hdr[KS_KVFILE_HEADER_LEN], tail[8 + KS_KVFILE_MAC_LEN];

    if (tokens_out) *tokens_out = NULL;
    if ((rc = open_header(path, &fd, &m)) != 0) goto done;
    if ((rc = ks__kvfile_check_expect_header(&m, exp)) != 0) goto done;

    /* Lengths were checked against the limits and the file size: the
     * allocations below are bounded by what is really on disk. */
    size_t tok_bytes = (size_t)m.n_tokens * 4;
    off_t off = (off_t)(KS_KVFILE_HEADER_LEN + tok_bytes);
    if ((rc = read_exact(fd, tail, 8 + mac_len(m.flags), (off_t)(off + (off_t)m.payload_len), NULL)) != 0 ||
        (rc = ks__kvfile_check_begin(&m, exp, tail, &sk)) != 0)
        goto done;
    if (!(toks = malloc(tok_bytes ? tok_bytes : 1))) {
        rc = KS_ENOMEM;
        goto done;
    }
    if ((rc = read_exact(fd, hdr, sizeof hdr, 0, &sk)) != 0) goto done;
    if ((rc = read_exact(fd, toks, tok_bytes, KS_KVFILE_HEADER_LEN, &sk)) != 0) goto done;
#if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
    for (uint32_t i = 0; i < m.n_tokens; i++) toks[i] = (int32_t)get32((const uint8_t *)&toks[i]);
#endif
    if (pbuf) {
        size_t need = m.payload_len ? (size_t)m.payload_len : 1;
        if (!*pbuf || *pcap < need) {
            free(*pbuf);
            *pcap = 0;
            if (!(*pbuf = malloc(need))) {
                rc = KS_ENOMEM;
                goto done;
            }
            *pcap = need;
        }
        if ((rc = read_exact(fd, *pbuf, (size_t)m.payload_len, off, &sk)) != 0) goto done;
    } else {
        if (!(chunk = malloc(VERIFY_CHUNK))) {
            rc = KS_ENOMEM;
            goto done;
        }
        uint64_t left = m.payload_len;
        off_t at = off;
        while (left > 0) {
            size_t k = left < VERIFY_CHUNK ? (size_t)left : VERIFY_CHUNK;
            if ((rc = read_exact(fd, chunk, k, at, &sk)) != 0) goto done;
            left -= k;
            at += (off_t)k;
        }
    }
    if ((rc = ks__kvfile_check_end(&sk, tail)) != 0) goto done;
    if (exp && exp->tokens && memcmp(toks, exp->tokens, tok_bytes) != 0) {
        rc = KS_EMISMATCH;
        goto done;
    }
    if (tokens_out) {
        *tokens_out = toks;
        toks = NULL;
    }
done:
    if (meta) *meta = m;
    if (fd >= 0) ks_sysio_close(fd);
    ks__kvfile_sink_free(&sk);
    free(chunk);
    free(toks);
    return rc;
}

int ks_kvfile_read(const char *path, const ks_kvfile_expect *exp, ks_kvfile_meta *meta,
                   int32_t **tokens_out, uint8_t **payload_out) {
    if (!payload_out) return read_file(path, exp, meta, tokens_out, NULL, NULL);
    uint8_t *buf = NULL;
    size_t cap = 0;
    *payload_out = NULL;
    int rc = read_file(path, exp, meta, tokens_out, &buf, &cap);
    if (rc == 0)
        *payload_out = buf;
    else
        free(buf);
    return rc;
}

int ks_kvfile_read_buf(const char *path, const ks_kvfile_expect *exp, ks_kvfile_meta *meta, uint8_t **buf,
                       size_t *cap) {
    if (!buf || !cap) return KS_EINVAL;
    return read_file(path, exp, meta, NULL, buf, cap);
}

int ks_kvfile_touch(const char *path, int64_t last_hit_us, uint64_t hits, int64_t pin_until_us) {
    int rc = 0, fd = -1;
    uint8_t h[KS_KVFILE_HEADER_LEN], t[KS_KVFILE_TRAILER_LEN];
    struct stat sb;
    /* Never through a symlink (open_existing): the bytes would land in its
     * target. Then only touch a kvfile of this version whose header checks,
     * of a plausible size: the trailer sits at the very end and its length
     * comes from the flags, so a wrong file would otherwise get bytes
     * overwritten. */
    if ((rc = open_existing(path, O_RDWR, &fd, &sb)) != 0) goto done;
    if (sb.st_size < (off_t)(KS_KVFILE_HEADER_LEN + 8 + KS_KVFILE_TRAILER_LEN_NOPIN) ||
        ks_sysio_pread_all(fd, h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h, KS_KVFILE_MAGIC, 8) != 0 ||
        get32(h + OFF_VERSION) != KS_KVFILE_VERSION || get32(h + OFF_HEADER_LEN) != KS_KVFILE_HEADER_LEN ||
        get64(h + OFF_HCHECK) != nonzero(XXH3_64bits(h, OFF_HCHECK)) ||
        (get32(h + OFF_FLAGS) & ~(uint32_t)KNOWN_FLAGS)) {
        rc = KS_ECORRUPT;
        goto done;
    }
    uint32_t flags = get32(h + OFF_FLAGS);
    size_t tlen = trailer_len(flags);
    if (sb.st_size < (off_t)(KS_KVFILE_HEADER_LEN + 8 + tlen)) {
        rc = KS_ECORRUPT;
        goto done;
    }
    off_t at = sb.st_size - (off_t)tlen;
    /* Another process may have pinned the entry for longer: keep the later
     * deadline (a sound trailer only; a damaged one has no pin to keep). */
    if ((flags & KS_KVFILE_FLAG_PIN) && ks_sysio_pread_all(fd, t, tlen, at) == (ssize_t)tlen &&
        get64(t + tlen - 8) == trailer_check(t, tlen) && (int64_t)get64(t + 16) > pin_until_us)
        pin_until_us = (int64_t)get64(t + 16);
    ks__kvfile_encode_trailer(t, flags, last_hit_us, hits, pin_until_us);
    ssize_t w = ks_sysio_pwrite(fd, t, tlen, at);
    if (w != (ssize_t)tlen) rc = KS_EIO;
done:
    if (fd >= 0) ks_sysio_close(fd);
    return rc;
}

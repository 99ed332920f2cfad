/*
 * fuzz_kvfile.c — the kvfile reader (src/cache/kvfile.c): header, tokens,
 * payload, checksum and trailer, as the store reads files from a shared
 * directory that anything may have written.
 *
 * Each input is a whole file. It is read twice: as it is, and "repaired":
 * magic set, lengths made to fit the file, then the header check, the body
 * checksum and the trailer check recomputed, so that the fuzzer gets past
 * the checksums to the fields behind them (version, flags, reason, lengths).
 *
 * Properties checked, for each of the two files:
 *  1. the readers return only what kvfile.h lists for damaged files, never
 *     crash, leak or read out of bounds; ks_kvfile_read agrees with
 *     ks_kvfile_read_meta on the header;
 *  2. an accepted file has the exact size its header says, and the tokens
 *     and payload returned are the file's bytes;
 *  3. a file whose header reads and whose body checksum (computed here,
 *     independently) matches is accepted: a sound file is never refused;
 *     so every repaired version-1 file with known flags is read;
 *  4. an accepted file is refused against another model, state version or
 *     token list (KS_EMISMATCH / KS_EVERSION), accepted against its own, by
 *     the streaming reader and into a caller's buffer alike;
 *  5. ks_kvfile_touch keeps it valid and sets the trailer: hits, last hit,
 *     and the later of the two pin deadlines (only with KS_KVFILE_FLAG_PIN);
 *  6. written again by ks_kvfile_write from what was read, a file with the
 *     current layout (flag PIN, reserved bytes zero) is byte for byte the
 *     input up to its trailer;
 *  7. a reader with a store key (the cache secret, kvmac.h) refuses every
 *     accepted file with KS_ECORRUPT: without flag MAC it has no tag, and
 *     with it (nonce and tag bytes left as the fuzzer wrote them, which a
 *     reader without a key does not check) its tag is not the key's.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/store_cfg.h"
#include "fuzz.h"

static char g_dir[256], g_out[PATH_MAX], g_path[PATH_MAX];

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static uint64_t nonzero(uint64_t h) { return h ? h : KS_KVFILE_CSUM_ZERO; }
static size_t trailer_len(uint32_t flags) {
    return (flags & KS_KVFILE_FLAG_PIN) ? KS_KVFILE_TRAILER_LEN : KS_KVFILE_TRAILER_LEN_NOPIN;
}

static void cleanup(void) {
    unlink(g_path);
    rmdir(g_out);
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* tmpfs when there is one: every input is written, and some fsynced. */
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/ks-fuzz-kvfile-XXXXXX", base);
    FUZZ_CHECK(mkdtemp(g_dir) != NULL);
    snprintf(g_out, sizeof g_out, "%s/out", g_dir);
    FUZZ_CHECK(mkdir(g_out, 0700) == 0);
    snprintf(g_path, sizeof g_path, "%s/input.kvs", g_dir);
    atexit(cleanup);
    return 0;
}

static void write_input(const uint8_t *d, size_t n) {
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0);
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, d + off, n - off);
        FUZZ_CHECK(w > 0);
        off += (size_t)w;
    }
    FUZZ_CHECK(close(fd) == 0);
}

static bool read_whole(const char *path, uint8_t **out, size_t *n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat sb;
    FUZZ_CHECK(fstat(fd, &sb) == 0);
    *n = (size_t)sb.st_size;
    *out = malloc(*n ? *n : 1);
    FUZZ_CHECK(*out && pread(fd, *out, *n, 0) == (ssize_t)*n);
    close(fd);
    return true;
}

/* Property 6. */
static void check_rewrite(const uint8_t *d, size_t n, const ks_kvfile_meta *m, const int32_t *toks,
                          const uint8_t *payload) {
    static const uint8_t zero[8];
    uint32_t flags = KS_KVFILE_FLAG_PIN | (m->reason > KS_REASON_PIN ? KS_KVFILE_FLAG_REASON6 : 0);
    if (m->flags != flags || memcmp(d + 144, zero, 8) != 0) return; /* as every writer since pins writes */
    bool existed = true;
    uint64_t bytes = 0;
    char orphan[PATH_MAX];
    int rc = ks_kvfile_write(g_out, m, toks, (int)m->n_tokens, payload, (size_t)m->payload_len, &existed, &bytes,
                             orphan);
    FUZZ_CHECK_EQ(rc, 0);
    FUZZ_CHECK(!existed);
    FUZZ_CHECK_EQ(bytes, n);
    char path[PATH_MAX];
    FUZZ_CHECK_EQ(ks_kvfile_path(g_out, &m->key, path, sizeof path), 0);
    uint8_t *w = NULL;
    size_t wn = 0;
    FUZZ_CHECK(read_whole(path, &w, &wn));
    FUZZ_CHECK_EQ(wn, n);
    FUZZ_CHECK(memcmp(w, d, n - KS_KVFILE_TRAILER_LEN) == 0);
    free(w);
    FUZZ_CHECK(unlink(path) == 0);
}

static void check_file(const uint8_t *d, size_t n, bool must_read) {
    write_input(d, n);
    ks_kvfile_meta m, m2;
    int rc_meta = ks_kvfile_read_meta(g_path, &m);
    FUZZ_CHECK(rc_meta == 0 || rc_meta == KS_ECORRUPT || rc_meta == KS_EVERSION);
    FUZZ_CHECK_EQ(m.file_size, n);
    /* what follows the checksum: [nonce + tag] (flag MAC), then the trailer */
    size_t tlen = trailer_len(m.flags) + ((m.flags & KS_KVFILE_FLAG_MAC) ? KS_KVFILE_MAC_LEN : 0);
    bool body_ok = false;
    if (rc_meta == 0) {
        FUZZ_CHECK_EQ(m.version, KS_KVFILE_VERSION);
        FUZZ_CHECK(m.reason < KS_REASON__N && m.n_tokens <= KS_KVFILE_MAX_TOKENS);
        FUZZ_CHECK_EQ(n, KS_KVFILE_HEADER_LEN + 4ull * m.n_tokens + m.payload_len + 8 + tlen);
        body_ok = get64(d + n - tlen - 8) == nonzero(XXH3_64bits(d, n - tlen - 8));
    }
    FUZZ_CHECK(!must_read || rc_meta == 0);

    int32_t *toks = NULL;
    uint8_t *payload = NULL;
    int rc = ks_kvfile_read(g_path, NULL, &m2, &toks, &payload);
    if (rc_meta != 0) FUZZ_CHECK_EQ(rc, rc_meta); /* property 1 */
    else FUZZ_CHECK_EQ(rc, body_ok ? 0 : KS_ECORRUPT); /* property 3 */
    if (rc != 0) {
        FUZZ_CHECK(toks == NULL && payload == NULL);
        return;
    }
    /* Property 2. */
    FUZZ_CHECK(m2.n_tokens == m.n_tokens && m2.payload_len == m.payload_len && m2.flags == m.flags &&
               m2.reason == m.reason && m2.created_us == m.created_us && m2.hits == m.hits &&
               m2.pin_until_us == m.pin_until_us && m2.trailer_ok == m.trailer_ok);
    FUZZ_CHECK(toks && payload);
    size_t tok_bytes = 4u * m.n_tokens;
    FUZZ_CHECK(memcmp(toks, d + KS_KVFILE_HEADER_LEN, tok_bytes) == 0);
    FUZZ_CHECK(memcmp(payload, d + KS_KVFILE_HEADER_LEN + tok_bytes, (size_t)m.payload_len) == 0);

    /* Property 4. */
    ks_kvfile_expect e = {.model_fp = m.model_fp, .params_hash = m.params_hash, .check_state_version = true,
                          .state_version = m.state_version, .key = &m.key, .tokens = toks, .n_tokens = (int)m.n_tokens};
    FUZZ_CHECK_EQ(ks_kvfile_read(g_path, &e, NULL, NULL, NULL), 0);
    uint8_t *buf = malloc(1);
    size_t cap = 1;
    FUZZ_CHECK_EQ(ks_kvfile_read_buf(g_path, &e, NULL, &buf, &cap), 0);
    FUZZ_CHECK(cap >= m.payload_len && memcmp(buf, payload, (size_t)m.payload_len) == 0);
    free(buf);
    ks_kvfile_expect bad = e;
    uint8_t other_fp[32];
    memcpy(other_fp, m.model_fp, 32);
    other_fp[31] ^= 1;
    bad.model_fp = other_fp;
    FUZZ_CHECK_EQ(ks_kvfile_read(g_path, &bad, NULL, NULL, NULL), KS_EMISMATCH);
    bad = e;
    bad.state_version = m.state_version + 1;
    FUZZ_CHECK_EQ(ks_kvfile_read(g_path, &bad, NULL, NULL, NULL), KS_EVERSION);
    if (m.n_tokens > 0) {
        int32_t *other = malloc(tok_bytes);
        FUZZ_CHECK(other != NULL);
        memcpy(other, toks, tok_bytes);
        other[m.n_tokens - 1] ^= 1;
        bad = e;
        bad.tokens = other;
        FUZZ_CHECK_EQ(ks_kvfile_read(g_path, &bad, NULL, NULL, NULL), KS_EMISMATCH);
        free(other);
    }

    /* Property 7. */
    ks_kvmac_key key;
    memset(&key, 0x5a, sizeof key);
    bad = e;
    bad.mac = &key;
    FUZZ_CHECK_EQ(ks_kvfile_read(g_path, &bad, NULL, NULL, NULL), KS_ECORRUPT);

    /* Property 6 before 5: touch rewrites the trailer of the input file. */
    check_rewrite(d, n, &m, toks, payload);

    /* Property 5. */
    const int64_t pin = 5;
    FUZZ_CHECK_EQ(ks_kvfile_touch(g_path, 12345, 7, pin), 0);
    ks_kvfile_meta t;
    FUZZ_CHECK_EQ(ks_kvfile_read(g_path, &e, &t, NULL, NULL), 0);
    FUZZ_CHECK(t.trailer_ok && t.hits == 7 && t.last_hit_us == 12345);
    int64_t want = 0;
    if (m.flags & KS_KVFILE_FLAG_PIN) want = m.trailer_ok && m.pin_until_us > pin ? m.pin_until_us : pin;
    FUZZ_CHECK_EQ(t.pin_until_us, want);

    free(toks);
    free(payload);
}

/* The input with its checks recomputed (see the top). Returns whether the
 * result is a sound file of this version, which must then be read. */
static bool repair(uint8_t *c, size_t n) {
    if (n < 24) return false;
    memcpy(c, KS_KVFILE_MAGIC, 8);
    uint32_t hlen = get32(c + 12);
    if (hlen < 24 || hlen > KS_KVFILE_HEADER_MAX || hlen > n) put32(c + 12, hlen = n >= 160 ? 160 : 24);
    uint32_t flags = hlen >= 32 ? get32(c + 28) : 0;
    /* With flag MAC a nonce and a tag sit between checksum and trailer. */
    size_t tlen = trailer_len(flags) + ((flags & KS_KVFILE_FLAG_MAC) ? KS_KVFILE_MAC_LEN : 0);
    bool sizes = false;
    if (hlen == KS_KVFILE_HEADER_LEN && n >= KS_KVFILE_HEADER_LEN + 8 + tlen) {
        uint64_t room = n - KS_KVFILE_HEADER_LEN - 8 - tlen;
        uint32_t n_tokens = get32(c + 24);
        if (n_tokens > room / 4) n_tokens = (uint32_t)(room / 4);
        put32(c + 24, n_tokens);
        put64(c + 32, room - 4ull * n_tokens);
        uint32_t reason = get32(c + 20) % KS_REASON__N;
        put32(c + 20, reason);
        /* REASON6 exactly with a reason added after pins (kvfile.h) */
        flags = (flags & ~(uint32_t)KS_KVFILE_FLAG_REASON6) | (reason > KS_REASON_PIN ? KS_KVFILE_FLAG_REASON6 : 0);
        put32(c + 28, flags);
        sizes = true;
    }
    put64(c + hlen - 8, nonzero(XXH3_64bits(c, hlen - 8)));
    if (!sizes) return false;
    size_t trl = trailer_len(flags);
    put64(c + n - tlen - 8, nonzero(XXH3_64bits(c, n - tlen - 8)));
    put64(c + n - 8, nonzero(XXH3_64bits(c + n - trl, trl - 8)));
    return get32(c + 8) == KS_KVFILE_VERSION &&
           (flags & ~(uint32_t)(KS_KVFILE_FLAG_PIN | KS_KVFILE_FLAG_REASON6 | KS_KVFILE_FLAG_MAC)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) LLVMFuzzerInitialize(NULL, NULL);
    check_file(data, size, false);
    uint8_t *c = malloc(size ? size : 1);
    FUZZ_CHECK(c != NULL);
    memcpy(c, data, size);
    bool sound = repair(c, size);
    check_file(c, size, sound);
    free(c);
    return 0;
}

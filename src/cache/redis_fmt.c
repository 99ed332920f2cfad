/*
 * redis_fmt.c — see redis_fmt.h.
 */
#include "cache/redis_fmt.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/store_cfg.h"

#define MANIFEST_MAGIC "kvstash-redis"
#define MANIFEST_VERSION 1

/* ------------------------------------------------------------------ URL */
static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decodes s[0, n) into out (cap bytes). false when malformed or too long. */
static bool pct_decode(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= n) return false;
            int a = hexval(s[i + 1]), b = hexval(s[i + 2]);
            if (a < 0 || b < 0) return false;
            c = (char)(a * 16 + b);
            i += 2;
        }
        if (c == '\0' || k + 1 >= cap) return false;
        out[k++] = c;
    }
    out[k] = '\0';
    return true;
}

/* An integer in [lo, hi] made of s[0, n) only. */
static bool parse_int(const char *s, size_t n, long lo, long hi, int *out) {
    if (n == 0 || n > 9) return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* user[:password] of s[0, n). */
static int parse_userinfo(const char *s, size_t n, ks_redis_url *u, char *err, size_t errlen) {
    const char *colon = memchr(s, ':', n);
    size_t ulen = colon ? (size_t)(colon - s) : n;
    if (!pct_decode(s, ulen, u->user, sizeof u->user)) {
        ks_set_err(err, errlen, "redis URL: bad user name");
        return KS_EINVAL;
    }
    if (colon && !pct_decode(colon + 1, n - ulen - 1, u->password, sizeof u->password)) {
        ks_set_err(err, errlen, "redis URL: bad password (percent-encode it, at most %zu bytes)",
                   sizeof u->password - 1);
        return KS_EINVAL;
    }
    return 0;
}

/* "?db=N" (or nothing) at s. */
static int parse_query(const char *s, ks_redis_url *u, char *err, size_t errlen) {
    if (!*s) return 0;
    if (strncmp(s, "?db=", 4) != 0 || !parse_int(s + 4, strlen(s + 4), 0, 1 << 20, &u->db)) {
        ks_set_err(err, errlen, "redis URL: the only query is ?db=N");
        return KS_EINVAL;
    }
    return 0;
}

int ks_redis_url_parse(const char *url, ks_redis_url *u, char *err, size_t errlen) {
    if (!u) return KS_EINVAL;
    memset(u, 0, sizeof *u);
    u->port = 6379;
    if (!url || !*url) {
        ks_set_err(err, errlen, "redis URL: empty");
        return KS_EINVAL;
    }
    const char *rest;
    if (strncmp(url, "redis://", 8) == 0) {
        rest = url + 8;
    } else if (strncmp(url, "rediss://", 9) == 0) {
        rest = url + 9;
        u->tls = true;
    } else if (strncmp(url, "unix://", 7) == 0) {
        rest = url + 7;
        u->unix_socket = true;
    } else if (strncmp(url, "redis+unix://", 13) == 0) {
        rest = url + 13;
        u->unix_socket = true;
    } else {
        ks_set_err(err, errlen, "redis URL: expected redis://, rediss://, unix:// or redis+unix://");
        return KS_EINVAL;
    }
    /* The userinfo ends at the last '@' before the path (a password may hold '@'
     * only percent-encoded, but be lenient about the rest). */
    const char *slash = strchr(rest, '/');
    const char *end_auth = slash ? slash : rest + strlen(rest);
    const char *at = NULL;
    for (const char *p = rest; p < end_auth; p++)
        if (*p == '@') at = p;
    if (at) {
        int rc = parse_userinfo(rest, (size_t)(at - rest), u, err, errlen);
        if (rc) return rc;
        rest = at + 1;
    }
    if (u->unix_socket) {
        const char *q = strchr(rest, '?');
        size_t plen = q ? (size_t)(q - rest) : strlen(rest);
        if (plen == 0 || rest[0] != '/' || plen >= sizeof u->path) {
            ks_set_err(err, errlen, "redis URL: a unix socket needs an absolute path (unix:///run/redis.sock)");
            return KS_EINVAL;
        }
        memcpy(u->path, rest, plen);
        u->path[plen] = '\0';
        return parse_query(rest + plen, u, err, errlen);
    }
    /* host[:port][/db][?db=N] */
    const char *hend;
    const char *h = rest;
    if (*h == '[') {
        const char *rb = strchr(h, ']');
        if (!rb) {
            ks_set_err(err, errlen, "redis URL: unclosed [ in the host");
            return KS_EINVAL;
        }
        if ((size_t)(rb - h - 1) >= sizeof u->host || rb == h + 1) {
            ks_set_err(err, errlen, "redis URL: bad host");
            return KS_EINVAL;
        }
        memcpy(u->host, h + 1, (size_t)(rb - h - 1));
        hend = rb + 1;
    } else {
        hend = h + strcspn(h, ":/?");
        if (hend == h || (size_t)(hend - h) >= sizeof u->host) {
            ks_set_err(err, errlen, "redis URL: no host");
            return KS_EINVAL;
        }
        memcpy(u->host, h, (size_t)(hend - h));
    }
    const char *p = hend;
    if (*p == ':') {
        size_t n = strcspn(p + 1, "/?");
        if (!parse_int(p + 1, n, 1, 65535, &u->port)) {
            ks_set_err(err, errlen, "redis URL: bad port");
            return KS_EINVAL;
        }
        p += 1 + n;
    }
    if (*p == '/') {
        size_t n = strcspn(p + 1, "?");
        if (n && !parse_int(p + 1, n, 0, 1 << 20, &u->db)) {
            ks_set_err(err, errlen, "redis URL: bad database number");
            return KS_EINVAL;
        }
        p += 1 + n;
    }
    if (*p && *p != '?') {
        ks_set_err(err, errlen, "redis URL: unexpected text after the host");
        return KS_EINVAL;
    }
    return parse_query(p, u, err, errlen);
}

void ks_redis_url_redact(const char *url, char *out, size_t n) {
    if (!out || n == 0) return;
    out[0] = '\0';
    if (!url) return;
    const char *sch = strstr(url, "://");
    const char *rest = sch ? sch + 3 : url;
    const char *slash = strchr(rest, '/');
    const char *end_auth = slash ? slash : rest + strlen(rest);
    const char *at = NULL;
    for (const char *p = rest; p < end_auth; p++)
        if (*p == '@') at = p;
    const char *colon = at ? memchr(rest, ':', (size_t)(at - rest)) : NULL;
    if (!colon) {
        snprintf(out, n, "%s", url);
        return;
    }
    /* scheme://user: *** @rest */
    snprintf(out, n, "%.*s***%s", (int)(colon + 1 - url), url, at);
}

/* ------------------------------------------------------------- manifest */
uint32_t ks_redis_n_chunks(uint64_t total, uint64_t chunk_bytes) {
    if (chunk_bytes == 0) return 0;
    uint64_t n = total / chunk_bytes + (total % chunk_bytes != 0);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

void ks_redis_chunk_range(uint64_t total, uint64_t chunk_bytes, uint32_t i, uint64_t *off, uint64_t *len) {
    uint64_t o = (uint64_t)i * chunk_bytes;
    *off = o < total ? o : total;
    *len = total - *off < chunk_bytes ? total - *off : chunk_bytes;
}

int ks_redis_manifest_encode(const ks_redis_manifest *m, char *out, size_t n) {
    int w = snprintf(out, n,
                     MANIFEST_MAGIC " %d %" PRIu32 " %" PRIu32 " %" PRId64 " %" PRIu64 " %" PRIu64 " %" PRIu32
                                    " %016" PRIx64 " %016" PRIx64,
                     MANIFEST_VERSION, m->n_tokens, m->reason, m->created_us, m->total, m->chunk_bytes,
                     m->n_chunks, m->csum, m->nonce);
    if (w < 0 || (size_t)w >= n) return KS_EINVAL;
    if (m->tagged) {
        char hex[2 * sizeof m->tag + 1];
        ks_hex_encode(m->tag, sizeof m->tag, hex);
        int t = snprintf(out + w, n - (size_t)w, " %s", hex);
        if (t < 0 || (size_t)t >= n - (size_t)w) return KS_EINVAL;
        w += t;
    }
    return w;
}

/* The text a manifest's tag covers: the line without its tag. */
static int manifest_tag(const ks_kvmac_key *key, const char *member, const ks_redis_manifest *m, uint8_t *tag) {
    ks_redis_manifest u = *m;
    char line[256];
    u.tagged = false;
    if (ks_redis_manifest_encode(&u, line, sizeof line) < 0) return KS_EINVAL;
    return ks_kvmac_text_tag(key, "kvstash redis manifest v1", member, line, tag);
}

int ks_redis_manifest_sign(const ks_kvmac_key *key, const char *member, ks_redis_manifest *m) {
    int rc = manifest_tag(key, member, m, m->tag);
    m->tagged = rc == 0;
    return rc;
}

bool ks_redis_manifest_verify(const ks_kvmac_key *key, const char *member, const ks_redis_manifest *m) {
    uint8_t t[sizeof m->tag];
    return m->tagged && manifest_tag(key, member, m, t) == 0 && ks_kvmac_equal(t, m->tag);
}

int ks_redis_manifest_decode(const char *s, size_t len, ks_redis_manifest *m) {
    char buf[256];
    memset(m, 0, sizeof *m);
    if (!s || len == 0 || len >= sizeof buf) return KS_ECORRUPT;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (strlen(buf) != len) return KS_ECORRUPT; /* an embedded NUL */
    char magic[32];
    int version = 0, consumed = 0;
    if (sscanf(buf, "%31s %d%n", magic, &version, &consumed) != 2 || strcmp(magic, MANIFEST_MAGIC) != 0)
        return KS_ECORRUPT;
    if (version != MANIFEST_VERSION) return KS_EVERSION;
    /* Every field is digits only: sscanf alone would take signs and spaces. */
    for (const char *p = buf + consumed; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == ' ' || *p == '-')) return KS_ECORRUPT;
    int tail = 0;
    if (sscanf(buf + consumed, " %" SCNu32 " %" SCNu32 " %" SCNd64 " %" SCNu64 " %" SCNu64 " %" SCNu32
                                " %16" SCNx64 " %16" SCNx64 "%n",
               &m->n_tokens, &m->reason, &m->created_us, &m->total, &m->chunk_bytes, &m->n_chunks, &m->csum,
               &m->nonce, &tail) != 8)
        return KS_ECORRUPT;
    const char *rest = buf + consumed + tail;
    if (*rest == ' ' && strlen(rest + 1) == 2 * sizeof m->tag && ks_hex_decode(rest + 1, m->tag, sizeof m->tag) == 0)
        m->tagged = true; /* written with the cache secret; canonical form checked below */
    else if (*rest != '\0')
        return KS_ECORRUPT;
    if (m->n_tokens > KS_KVFILE_MAX_TOKENS || m->reason >= KS_REASON__N ||
        m->chunk_bytes < (uint64_t)(KS_REDIS_CHUNK_MIN - KS_REDIS_CHUNK_SLACK) ||
        m->chunk_bytes > (uint64_t)KS_REDIS_CHUNK_MAX ||
        m->total < ks_kvfile_size((int)m->n_tokens, 0) ||
        m->total > ks_kvfile_size((int)m->n_tokens, 0) + KS_KVFILE_MAX_PAYLOAD ||
        m->n_chunks != ks_redis_n_chunks(m->total, m->chunk_bytes))
        return KS_ECORRUPT;
    /* Only the canonical line: no leading zeros, no short hex, nothing a
     * reader could take two ways. */
    char again[256];
    int n = ks_redis_manifest_encode(m, again, sizeof again);
    if (n < 0 || (size_t)n != len || memcmp(again, buf, len) != 0) return KS_ECORRUPT;
    return 0;
}

/* --------------------------------------------------------------- members */
void ks_redis_member(const uint8_t fp[32], const ks_key *key, char out[KS_REDIS_MEMBER_LEN + 1]) {
    ks_key fk;
    memcpy(fk.b, fp, 32);
    ks_key_to_hex(&fk, out);
    out[KS_KEY_HEX_LEN] = ':';
    ks_key_to_hex(key, out + KS_KEY_HEX_LEN + 1);
}

int ks_redis_member_parse(const char *s, size_t len, uint8_t fp[32], ks_key *key) {
    char hex[KS_KEY_HEX_LEN + 1];
    ks_key fk;
    if (!s || len != KS_REDIS_MEMBER_LEN || s[KS_KEY_HEX_LEN] != ':') return KS_EINVAL;
    memcpy(hex, s, KS_KEY_HEX_LEN);
    hex[KS_KEY_HEX_LEN] = '\0';
    if (ks_key_from_hex(hex, &fk) != 0) return KS_EINVAL;
    memcpy(hex, s + KS_KEY_HEX_LEN + 1, KS_KEY_HEX_LEN);
    if (ks_key_from_hex(hex, key) != 0) return KS_EINVAL;
    memcpy(fp, fk.b, 32);
    return 0;
}

/* ----------------------------------------------------------------- names */
int ks_redis_names_init(ks_redis_names *n, const char *prefix) {
    memset(n, 0, sizeof *n);
    if (!prefix || strlen(prefix) >= KS_REDIS_PREFIX_MAX) return KS_EINVAL;
    snprintf(n->prefix, sizeof n->prefix, "%s", prefix);
    snprintf(n->lru, sizeof n->lru, "%s:lru", prefix);
    snprintf(n->sizes, sizeof n->sizes, "%s:sizes", prefix);
    snprintf(n->bytes, sizeof n->bytes, "%s:bytes", prefix);
    return 0;
}

/* Every name fits: the prefix is shorter than KS_REDIS_PREFIX_MAX (64), a
 * member is 129 bytes and a chunk's suffix at most 28. */
void ks_redis_key_manifest(const ks_redis_names *n, const char *member, char out[KS_REDIS_KEY_MAX]) {
    if (snprintf(out, KS_REDIS_KEY_MAX, "%s:%s", n->prefix, member) >= KS_REDIS_KEY_MAX) abort();
}

void ks_redis_key_chunk(const char *mkey, uint64_t nonce, uint32_t i, char out[KS_REDIS_KEY_MAX]) {
    if (snprintf(out, KS_REDIS_KEY_MAX, "%s:%016" PRIx64 ":%" PRIu32, mkey, nonce, i) >= KS_REDIS_KEY_MAX) abort();
}

void ks_redis_key_lens(const ks_redis_names *n, const uint8_t fp[32], char out[KS_REDIS_KEY_MAX]) {
    ks_key fk;
    char hex[KS_KEY_HEX_LEN + 1];
    memcpy(fk.b, fp, 32);
    ks_key_to_hex(&fk, hex);
    if (snprintf(out, KS_REDIS_KEY_MAX, "%s:%s:lens", n->prefix, hex) >= KS_REDIS_KEY_MAX) abort();
}

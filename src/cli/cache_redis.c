/*
 * cache_redis.c — see cache_redis.h.
 */
#include "cli/cache_redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/kvfile.h"
#include "cache/redis_conn.h"
#include "cache/redis_fmt.h"
#include "cache/redis_ops.h"

#define CMD "kvstash cache"
#define TIMEOUT_MS 10000 /* a command line can wait longer than a server's lookup */
#define SCAN_COUNT 1000
#define DELETE_BATCH 64

struct ks_cache_redis {
    const char *sub;
    ks_redis_conn *c;
    ks_redis_tls *tls;
    ks_redis_names nm;
    char where[KS_REDIS_URL_MAX];
};

/* One entry found by a scan. */
typedef struct ent {
    ks_redis_member_str member;
    uint8_t fp[32];
    ks_key key;
    int mrc;                /* ks_redis_manifest_decode's result */
    ks_redis_manifest m;    /* when mrc == 0 */
    int64_t last_use_ms;    /* <prefix>:lru score; -1: not accounted */
} ent;

typedef struct ents {
    ent *v;
    size_t n, cap;
    ks_key *lens;              /* the fingerprints of the <prefix>:<fp>:lens keys (rm --all) */
    size_t n_lens, cap_lens;
} ents;

static int conn_failed(ks_cache_redis *r) {
    fprintf(stderr, CMD " %s: redis %s: %s\n", r->sub, r->where, ks_redis_conn_error(r->c));
    return 1;
}

static int oom(ks_cache_redis *r) {
    fprintf(stderr, CMD " %s: out of memory\n", r->sub);
    return 1;
}

/* A reply that is an error (an ACL refusing a command, a wrong type):
 * printed, exit 1. */
static int reply_failed(ks_cache_redis *r, const char *what, const redisReply *rep) {
    fprintf(stderr, CMD " %s: redis %s: %s: %s\n", r->sub, r->where, what,
            rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    return 1;
}

int ks_cache_redis_open(const char *sub, const ks_redis_cfg *cfg, ks_cache_redis **out) {
    *out = NULL;
    ks_cache_redis *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, CMD " %s: out of memory\n", sub);
        return 1;
    }
    r->sub = sub;
    ks_redis_url_redact(cfg->url, r->where, sizeof r->where);
    if (!cfg->key_prefix[0] || strpbrk(cfg->key_prefix, " \t\r\n") || ks_redis_names_init(&r->nm, cfg->key_prefix)) {
        fprintf(stderr, CMD " %s: --redis-prefix: a non-empty prefix without spaces, shorter than %d bytes\n", sub,
                KS_REDIS_PREFIX_MAX);
        free(r);
        return 2;
    }
    ks_redis_url url;
    char err[512] = "";
    if (ks_redis_cfg_prepare(cfg, &url, &r->tls, err, sizeof err) != 0) {
        fprintf(stderr, CMD " %s: %s\n", sub, err);
        free(r);
        return 2;
    }
    int rc = ks_redis_conn_open(&url, r->tls, TIMEOUT_MS, &r->c, err, sizeof err);
    memset(&url, 0, sizeof url); /* no copy of a password left behind */
    if (rc != 0) {
        fprintf(stderr, CMD " %s: redis %s: %s\n", sub, r->where, err[0] ? err : ks_strerror(rc));
        ks_cache_redis_close(r);
        return 1;
    }
    *out = r;
    return 0;
}

void ks_cache_redis_close(ks_cache_redis *r) {
    if (!r) return;
    ks_redis_conn_free(r->c);
    ks_redis_tls_free(r->tls);
    free(r);
}

const char *ks_cache_redis_where(const ks_cache_redis *r) { return r->where; }
const char *ks_cache_redis_prefix(const ks_cache_redis *r) { return r->nm.prefix; }

/* ------------------------------------------------------------ scanning */
/* Whether the key of member (its part after the fingerprint) starts with
 * keyprefix (hex, any case); NULL matches everything. */
static bool member_matches(const char *member, const char *keyprefix) {
    if (!keyprefix) return true;
    const char *hex = member + KS_KEY_HEX_LEN + 1;
    for (size_t i = 0; keyprefix[i]; i++) {
        char c = keyprefix[i];
        if (c >= 'A' && c <= 'F') c = (char)(c - 'A' + 'a');
        if (i >= KS_KEY_HEX_LEN || hex[i] != c) return false;
    }
    return true;
}

/* prefix with the glob characters of MATCH escaped, then ":*". */
static void scan_pattern(const char *prefix, char *out, size_t n) {
    size_t k = 0;
    for (const char *p = prefix; *p && k + 4 < n; p++) {
        if (strchr("*?[]\\", *p)) out[k++] = '\\';
        out[k++] = *p;
    }
    snprintf(out + k, n - k, ":*");
}

static int ent_cmp(const void *a, const void *b) { return strcmp(((const ent *)a)->member, ((const ent *)b)->member); }

static void ents_free(ents *e) {
    free(e->v);
    free(e->lens);
    memset(e, 0, sizeof *e);
}

/* Reads the manifests (and last uses) of the members[0, n) just scanned into e. */
static int read_manifests(ks_cache_redis *r, ks_redis_member_str *members, int n, ents *e) {
    if (n == 0) return 0;
    redisReply **rep = calloc((size_t)n * 2, sizeof *rep);
    if (!rep) return oom(r);
    char mkey[KS_REDIS_KEY_MAX];
    for (int i = 0; i < n; i++) {
        ks_redis_key_manifest(&r->nm, members[i], mkey);
        ks_redis_conn_append(r->c, "GET %s", mkey);
        ks_redis_conn_append(r->c, "ZSCORE %s %s", r->nm.lru, members[i]);
    }
    if (ks_redis_conn_get_replies(r->c, 2 * n, rep, NULL) != 0) {
        free(rep);
        return conn_failed(r);
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const redisReply *man = rep[2 * i], *score = rep[2 * i + 1];
        if (man->type == REDIS_REPLY_ERROR) {
            rc = reply_failed(r, "GET", man);
            break;
        }
        if (man->type != REDIS_REPLY_STRING) continue; /* deleted since the scan */
        if (e->n == e->cap) {
            size_t ncap = e->cap ? e->cap * 2 : 64;
            ent *nv = realloc(e->v, ncap * sizeof *nv);
            if (!nv) {
                rc = oom(r);
                break;
            }
            e->v = nv;
            e->cap = ncap;
        }
        ent *x = &e->v[e->n++];
        memset(x, 0, sizeof *x);
        memcpy(x->member, members[i], sizeof x->member);
        ks_redis_member_parse(x->member, strlen(x->member), x->fp, &x->key);
        x->mrc = ks_redis_manifest_decode(man->str, man->len, &x->m);
        x->last_use_ms = score->type == REDIS_REPLY_STRING ? strtoll(score->str, NULL, 10) : -1;
    }
    for (int i = 0; i < 2 * n; i++) freeReplyObject(rep[i]);
    free(rep);
    return rc;
}

/* Every entry under the prefix whose key starts with keyprefix (NULL: all),
 * sorted by member, each once (SCAN may return a key twice). */
static int scan_entries(ks_cache_redis *r, const char *keyprefix, ents *e) {
    char pattern[2 * KS_REDIS_PREFIX_MAX + 4], cursor[32] = "0";
    size_t plen = strlen(r->nm.prefix);
    scan_pattern(r->nm.prefix, pattern, sizeof pattern);
    memset(e, 0, sizeof *e);
    ks_redis_member_str *batch = NULL;
    int rc = 0;
    do {
        redisReply *rep = ks_redis_conn_command(r->c, "SCAN %s MATCH %s COUNT %d", cursor, pattern, SCAN_COUNT);
        if (!rep) {
            rc = conn_failed(r);
            break;
        }
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 || rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY || rep->element[0]->len >= sizeof cursor) {
            rc = reply_failed(r, "SCAN", rep);
            freeReplyObject(rep);
            break;
        }
        memcpy(cursor, rep->element[0]->str, rep->element[0]->len + 1);
        int nb = 0;
        const redisReply *keys = rep->element[1];
        /* COUNT is a hint: a reply may hold more keys. */
        free(batch);
        if (!(batch = calloc(keys->elements + 1, sizeof *batch))) {
            freeReplyObject(rep);
            rc = oom(r);
            break;
        }
        for (size_t i = 0; i < keys->elements; i++) {
            const redisReply *k = keys->element[i];
            if (k->type != REDIS_REPLY_STRING || k->len <= plen + 1 || memcmp(k->str, r->nm.prefix, plen) != 0 ||
                k->str[plen] != ':')
                continue;
            const char *rest = k->str + plen + 1;
            size_t rlen = k->len - plen - 1;
            uint8_t fp[32];
            ks_key key;
            if (rlen == KS_REDIS_MEMBER_LEN && ks_redis_member_parse(rest, rlen, fp, &key) == 0) {
                memcpy(batch[nb], rest, rlen);
                batch[nb][rlen] = '\0';
                if (member_matches(batch[nb], keyprefix)) nb++;
            } else if (rlen == KS_KEY_HEX_LEN + 5 && memcmp(rest + KS_KEY_HEX_LEN, ":lens", 5) == 0) {
                char hex[KS_KEY_HEX_LEN + 1];
                memcpy(hex, rest, KS_KEY_HEX_LEN);
                hex[KS_KEY_HEX_LEN] = '\0';
                if (ks_key_from_hex(hex, &key) != 0) continue;
                if (e->n_lens == e->cap_lens) {
                    size_t ncap = e->cap_lens ? e->cap_lens * 2 : 8;
                    ks_key *nl = realloc(e->lens, ncap * sizeof *nl);
                    if (!nl) {
                        rc = oom(r);
                        break;
                    }
                    e->lens = nl;
                    e->cap_lens = ncap;
                }
                e->lens[e->n_lens++] = key;
            }
        }
        freeReplyObject(rep);
        if (rc == 0) rc = read_manifests(r, batch, nb, e);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    free(batch);
    if (rc != 0) {
        ents_free(e);
        return rc;
    }
    if (e->n > 1) {
        qsort(e->v, e->n, sizeof *e->v, ent_cmp);
        size_t k = 1;
        for (size_t i = 1; i < e->n; i++)
            if (strcmp(e->v[i].member, e->v[k - 1].member) != 0) e->v[k++] = e->v[i];
        e->n = k;
    }
    return 0;
}

/* --------------------------------------------------------------- reading */
int ks_cache_redis_list(ks_cache_redis *r, const char *keyprefix, ks_tier_list_cb cb, void *ud) {
    ents e;
    int rc = scan_entries(r, keyprefix, &e);
    if (rc) return rc;
    for (size_t i = 0; i < e.n; i++) {
        const ent *x = &e.v[i];
        if (x->mrc != 0) continue; /* verify names it */
        ks_tier_entry te;
        memset(&te, 0, sizeof te);
        te.key = x->key;
        te.n_tokens = (int)x->m.n_tokens;
        te.reason = (int)x->m.reason;
        te.bytes = x->m.total;
        te.created_us = x->m.created_us;
        te.last_hit_us = x->last_use_ms >= 0 ? x->last_use_ms * 1000 : x->m.created_us;
        memcpy(te.model_fp, x->fp, 32);
        if (cb(ud, &te) != 0) break;
    }
    ents_free(&e);
    return 0;
}

int ks_cache_redis_usage(ks_cache_redis *r, uint64_t *entries, uint64_t *bytes) {
    redisReply *rep[2] = {0};
    ks_redis_conn_append(r->c, "ZCARD %s", r->nm.lru);
    ks_redis_conn_append(r->c, "GET %s", r->nm.bytes);
    if (ks_redis_conn_get_replies(r->c, 2, rep, NULL) != 0) return conn_failed(r);
    int rc = 0;
    if (rep[0]->type != REDIS_REPLY_INTEGER) rc = reply_failed(r, "ZCARD", rep[0]);
    else if (rep[1]->type == REDIS_REPLY_ERROR) rc = reply_failed(r, "GET", rep[1]);
    int64_t e = ks_redis_reply_int(rep[0]), b = ks_redis_reply_int(rep[1]);
    *entries = e > 0 ? (uint64_t)e : 0;
    *bytes = b > 0 ? (uint64_t)b : 0;
    freeReplyObject(rep[0]);
    freeReplyObject(rep[1]);
    return rc;
}

static void print_bad(const ks_cache_redis *r, const ent *x, const char *what, int err) {
    printf("bad: redis %s:%s: %s%s%s (%s)\n", r->nm.prefix, x->member, what, what[0] ? ": " : "", ks_errname(err),
           err == KS_ENOENT ? "a chunk is missing: evicted or expired" : ks_strerror(err));
}

int ks_cache_redis_verify(ks_cache_redis *r, const ks_kvmac_key *mac, int *good, int *bad) {
    ents e;
    *good = *bad = 0;
    int rc = scan_entries(r, NULL, &e);
    if (rc) return rc;
    char mkey[KS_REDIS_KEY_MAX];
    for (size_t i = 0; i < e.n && rc == 0; i++) {
        const ent *x = &e.v[i];
        if (x->mrc != 0 || (mac && !ks_redis_manifest_verify(mac, x->member, &x->m))) {
            print_bad(r, x, "manifest", x->mrc ? x->mrc : KS_ECORRUPT); /* no valid tag: not written with the secret */
            (*bad)++;
            continue;
        }
        /* The manifest passed the limits (redis_fmt.h): total and n_chunks are bounded. */
        uint8_t *buf = x->m.total <= SIZE_MAX ? malloc(x->m.total ? (size_t)x->m.total : 1) : NULL;
        redisReply **rep = calloc((size_t)x->m.n_chunks + 1, sizeof *rep);
        if (!buf || !rep) {
            free(buf);
            free(rep);
            rc = oom(r);
            break;
        }
        ks_redis_key_manifest(&r->nm, x->member, mkey);
        ks_redis_ops_append_chunks(r->c, mkey, &x->m);
        if (ks_redis_conn_get_replies(r->c, (int)x->m.n_chunks, rep, NULL) != 0) {
            free(buf);
            free(rep);
            rc = conn_failed(r);
            break;
        }
        int v = ks_redis_ops_take_chunks(rep, &x->m, buf);
        for (uint32_t k = 0; k < x->m.n_chunks; k++) freeReplyObject(rep[k]);
        free(rep);
        if (v == 0) {
            /* As a server restores it: its own model and key (the name must match the content). */
            ks_kvfile_expect exp = {.model_fp = x->fp, .key = &x->key, .mac = mac};
            v = ks_redis_ops_check(buf, &x->m, &x->key, &exp, NULL, NULL);
        }
        free(buf);
        if (v == 0) {
            (*good)++;
        } else {
            print_bad(r, x, "", v);
            (*bad)++;
        }
    }
    ents_free(&e);
    return rc;
}

/* --------------------------------------------------------------- removal */
/* Appends to *v the members of <prefix>:lru that match keyprefix and are
 * not among the scanned e (accounted, manifest gone). */
static int lru_only(ks_cache_redis *r, const char *keyprefix, const ents *e, ks_redis_member_str **v, size_t *n) {
    *v = NULL;
    *n = 0;
    redisReply *rep = ks_redis_conn_command(r->c, "ZRANGE %s 0 -1", r->nm.lru);
    if (!rep) return conn_failed(r);
    if (rep->type != REDIS_REPLY_ARRAY) {
        int rc = reply_failed(r, "ZRANGE", rep);
        freeReplyObject(rep);
        return rc;
    }
    *v = calloc(rep->elements + 1, sizeof **v);
    if (!*v) {
        freeReplyObject(rep);
        return oom(r);
    }
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *m = rep->element[i];
        if (m->type != REDIS_REPLY_STRING || m->len != KS_REDIS_MEMBER_LEN) continue;
        ent probe;
        memcpy(probe.member, m->str, m->len);
        probe.member[m->len] = '\0';
        if (!member_matches(probe.member, keyprefix)) continue;
        if (e->n && bsearch(&probe, e->v, e->n, sizeof *e->v, ent_cmp)) continue;
        memcpy((*v)[(*n)++], probe.member, sizeof probe.member);
    }
    freeReplyObject(rep);
    return 0;
}

/* Deletes members[0, n) in batches (ks_redis_ops_delete). */
static int delete_all(ks_cache_redis *r, ks_redis_member_str *members, size_t n) {
    for (size_t i = 0; i < n; i += DELETE_BATCH) {
        int k = (int)(n - i < DELETE_BATCH ? n - i : DELETE_BATCH);
        int d = ks_redis_ops_delete(r->c, &r->nm, members + i, k, NULL, NULL);
        if (d == KS_ENOMEM) return oom(r);
        if (d < 0) return conn_failed(r);
    }
    return 0;
}

int ks_cache_redis_rm(ks_cache_redis *r, const char *keyprefix, bool print, int *removed) {
    ents e;
    ks_redis_member_str *extra = NULL, *all = NULL;
    size_t n_extra = 0;
    *removed = 0;
    int rc = scan_entries(r, keyprefix, &e);
    if (rc) return rc;
    if ((rc = lru_only(r, keyprefix, &e, &extra, &n_extra)) != 0) goto done;
    if (!(all = calloc(e.n + n_extra + 1, sizeof *all))) {
        rc = oom(r);
        goto done;
    }
    for (size_t i = 0; i < e.n; i++) memcpy(all[i], e.v[i].member, sizeof all[i]);
    if (n_extra) memcpy(all + e.n, extra, n_extra * sizeof *extra);
    if ((rc = delete_all(r, all, e.n + n_extra)) != 0) goto done;
    for (size_t i = 0; print && i < e.n; i++) {
        const ent *x = &e.v[i];
        char hex[KS_KEY_HEX_LEN + 1];
        ks_key_to_hex(&x->key, hex);
        if (x->mrc == 0) printf("removed %s (redis, %u tokens)\n", hex, (unsigned)x->m.n_tokens);
        else printf("removed %s (redis, a bad manifest)\n", hex);
    }
    *removed = (int)(e.n + n_extra);
    if (!keyprefix) {
        /* Everything: the models' length sets too, and whatever the sum
         * still counts (entries of hosts that died between the steps of a
         * save), as a server's eviction would with a budget of 0. */
        char key[KS_REDIS_KEY_MAX];
        for (size_t i = 0; i < e.n_lens; i++) {
            ks_redis_key_lens(&r->nm, e.lens[i].b, key);
            redisReply *rep = ks_redis_conn_command(r->c, "DEL %s", key);
            if (!rep) {
                rc = conn_failed(r);
                goto done;
            }
            freeReplyObject(rep);
        }
        int ev = ks_redis_ops_evict(r->c, &r->nm, 0, 0, 64, NULL, NULL, NULL, NULL);
        if (ev == KS_ENOMEM) rc = oom(r);
        else if (ev < 0) rc = conn_failed(r);
        else *removed += ev;
    }
done:
    ents_free(&e);
    free(extra);
    free(all);
    return rc;
}

int ks_cache_redis_gc(ks_cache_redis *r, uint64_t max_bytes, int *evicted, uint64_t *bytes_before,
                      uint64_t *bytes_after) {
    uint64_t n = 0;
    *evicted = 0;
    int rc = ks_cache_redis_usage(r, &n, bytes_before);
    if (rc) return rc;
    /* Bounded: 16 entries a round, and a few rounds more for what servers
     * add meanwhile; a server that refuses the deletions cannot keep it
     * looping. */
    int rounds = (int)(n / 16) + 4;
    int64_t now = -1;
    int ev = ks_redis_ops_evict(r->c, &r->nm, 0, max_bytes, rounds, NULL, NULL, &now, NULL);
    if (ev == KS_ENOMEM) return oom(r);
    if (ev < 0) return conn_failed(r);
    *evicted = ev;
    if ((rc = ks_cache_redis_usage(r, &n, bytes_after)) != 0) return rc;
    return 0;
}

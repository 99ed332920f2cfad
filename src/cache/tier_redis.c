/*
 * tier_redis.c — the redis tier: kvfiles in a Redis (or Valkey) server that
 * the kvstash servers of several hosts share (tier.h; key layout and
 * manifest in redis_fmt.h; operations in docs/DEPLOY.md). It talks to Redis
 * through redis_conn.h (TCP, unix socket or TLS: one code path) and shares
 * its deletions, evictions and entry checks with `kvstash cache --redis`
 * (redis_ops.h).
 *
 * An entry is the exact bytes of the kvfile a file tier would write, split
 * into chunks of at most cfg.chunk_bytes (Redis caps a value at 512 MiB, and
 * one big value blocks the server while it is copied), written first, and a
 * manifest written last with SET NX: the manifest is what makes the entry
 * visible. A reader gets the manifests of every candidate length in one
 * pipelined round trip (its probe, tier.h), then the chunks of the one it
 * picks in another (its fetch), and checks the manifest's XXH3 of
 * the whole and then the kvfile itself as a file tier does. A chunk that is
 * missing (Redis evicted or expired it) makes a miss, never a restore.
 *
 * Budget. Redis holds the accounting, shared by every host writing under the
 * key prefix: <prefix>:sizes (member -> bytes), their sum <prefix>:bytes and
 * <prefix>:lru (member -> last use, ms). Before a save the writer evicts the
 * least recently used members until the save fits in max_bytes. The steps
 * are separate commands, not a transaction: a process killed between them
 * leaves the sum too high (the next evictions free more than needed; an
 * entry whose manifest is gone is cleaned up when it comes to be evicted),
 * never too low, so kvstash's share never exceeds max_bytes by more than the
 * saves in flight of the other hosts.
 *
 * Faults. Every connect, TLS handshake, read and write waits at most
 * cfg.timeout_ms (redis_conn.h contract 1). A failure — no answer, a TLS
 * server that cannot be verified, refused credentials — closes the
 * connection; cfg.breaker_errors failures in a row open the circuit
 * breaker: for cfg.breaker_ms the tier is skipped (lookups go on without
 * it, saves are dropped and counted), then the next operation tries again
 * (half-open): success closes the breaker, failure opens it again at once.
 *
 * Invariants (in addition to tier.h's)
 *  1. A manifest names only chunks that were all written before it.
 *  2. Nothing from Redis is used before its length was checked against the
 *     manifest and the manifest against the limits (redis_fmt.h).
 *  3. The password is never logged: errors name the server by its redacted
 *     URL, and redis_conn's messages never carry it.
 *
 * Thread model: connections each behind its own mutex — up to
 * KS_REDIS_LOOKUP_CONNS for the lookups (probe, fetch, get; any thread: a
 * lookup takes a free one, so the prefetches of concurrent requests do not
 * wait for each other), one for the writer thread (put, make_room, drop,
 * quarantine) — and one TLS context they share (read-only once created).
 * The breaker and counters are atomics.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "base/base.h"
#include "cache/redis_conn.h"
#include "cache/redis_fmt.h"
#include "cache/redis_ops.h"
#include "cache/tier.h"

/* Lookups (prefetches on HTTP threads) of concurrent requests each get a
 * connection of their own, up to this many: one slow reply does not queue
 * the others behind it. Opened on first use. */
#define KS_REDIS_LOOKUP_CONNS 4

typedef struct rconn {
    pthread_mutex_t mu;
    ks_redis_conn *c;
    char why[512]; /* the last failure, for the warning at open */
} rconn;

typedef struct redis_tier {
    ks_tier base;
    ks_redis_url url;
    ks_redis_tls *tls;            /* rediss://: shared by both connections; else NULL */
    ks_redis_cfg cfg;             /* password cleared: it lives in url only */
    char where[KS_REDIS_URL_MAX]; /* the redacted URL, for messages */
    uint64_t max_bytes;
    uint8_t fp[32];
    ks_redis_names nm;
    char k_lens[KS_REDIS_KEY_MAX];
    rconn rd[KS_REDIS_LOOKUP_CONNS], wr;
    _Atomic unsigned rd_next;      /* where a lookup that finds every connection busy waits */
    _Atomic int n_fail;
    _Atomic int64_t open_until_ms; /* 0: closed; else the monotonic time of the next try */
    _Atomic uint64_t bytes, entries, errors, dropped, broken, ops, op_us, bytes_read, bytes_written, opens;
} redis_tier;

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ============================================================ breaker */
static bool rt_up(ks_tier *t) {
    redis_tier *r = (redis_tier *)t;
    int64_t until = atomic_load(&r->open_until_ms);
    return until == 0 || mono_ms() >= until;
}

static void op_ok(redis_tier *r) {
    atomic_store(&r->n_fail, 0);
    if (atomic_exchange(&r->open_until_ms, 0) != 0) KS_INFO("store", "redis tier: %s answers again", r->where);
}

/* Closes cn's connection and counts a failure of what, for the reason why
 * (NULL: the connection's own; cn->mu held). */
static void op_fail(redis_tier *r, rconn *cn, const char *what, const char *why) {
    /* A copy: the connection's own message goes with the connection. */
    char msg[320];
    if (!why) why = cn->c ? ks_redis_conn_error(cn->c) : "";
    snprintf(msg, sizeof msg, "%s", why[0] || !cn->c ? why : "unexpected reply");
    snprintf(cn->why, sizeof cn->why, "%s%s%s", what, msg[0] ? ": " : "", msg);
    ks_redis_conn_free(cn->c);
    cn->c = NULL;
    atomic_fetch_add(&r->errors, 1);
    /* Half-open (a backoff had been set): one failure opens it again. */
    bool was_open = atomic_load(&r->open_until_ms) != 0;
    if (was_open || atomic_fetch_add(&r->n_fail, 1) + 1 >= r->cfg.breaker_errors) {
        atomic_store(&r->n_fail, 0);
        atomic_store(&r->open_until_ms, mono_ms() + r->cfg.breaker_ms);
        atomic_fetch_add(&r->opens, 1);
        KS_WARN("store", "redis tier: %s %s failed%s%s; skipping the tier for %d ms", r->where, what,
                msg[0] ? ": " : "", msg, r->cfg.breaker_ms);
    } else {
        KS_DEBUG("store", "redis tier: %s %s failed%s%s", r->where, what, msg[0] ? ": " : "", msg);
    }
}

static void add_trips(redis_tier *r, const ks_redis_trips *tr) {
    atomic_fetch_add(&r->ops, tr->n);
    atomic_fetch_add(&r->op_us, tr->us);
}

/* The connection of cn, connected (TLS handshake, AUTH, SELECT) when it was
 * not. NULL when the tier is skipped or the connection failed (counted).
 * cn->mu is held. */
static ks_redis_conn *conn(redis_tier *r, rconn *cn) {
    if (cn->c && !ks_redis_conn_failed(cn->c)) return cn->c;
    if (!rt_up(&r->base)) return NULL;
    ks_redis_conn_free(cn->c);
    cn->c = NULL;
    char err[320] = "";
    int rc = ks_redis_conn_open(&r->url, r->tls, r->cfg.timeout_ms, &cn->c, err, sizeof err);
    if (rc != 0) {
        if (rc == KS_EINVAL) KS_WARN("store", "redis tier: %s: %s", r->where, err);
        op_fail(r, cn, rc == KS_EINVAL ? "AUTH" : "connect", err[0] ? err : ks_strerror(rc));
        return NULL;
    }
    return cn->c;
}

/* A lookup connection, locked: the first one free, else (all busy) one in
 * turn, waited for. Unlock its mu when done. */
static rconn *rd_take(redis_tier *r) {
    for (int i = 0; i < KS_REDIS_LOOKUP_CONNS; i++)
        if (pthread_mutex_trylock(&r->rd[i].mu) == 0) return &r->rd[i];
    rconn *cn = &r->rd[atomic_fetch_add(&r->rd_next, 1) % KS_REDIS_LOOKUP_CONNS];
    pthread_mutex_lock(&cn->mu);
    return cn;
}

/* Reads the n replies of a pipeline into rep[] (one round trip, timed).
 * 0, or KS_EIO (every reply freed, the failure counted). cn->mu is held. */
static int collect(redis_tier *r, rconn *cn, int n, redisReply **rep, const char *what) {
    ks_redis_trips tr = {0, 0};
    int rc = ks_redis_conn_get_replies(cn->c, n, rep, &tr);
    add_trips(r, &tr);
    if (rc != 0) {
        op_fail(r, cn, what, NULL);
        return KS_EIO;
    }
    for (int i = 0; i < n; i++)
        if (rep[i]->type == REDIS_REPLY_ERROR) {
            /* A server error (OOM under maxmemory, a wrong type): the
             * connection is fine but the operation failed. */
            KS_DEBUG("store", "redis tier: %s: %s", what, rep[i]->str);
        }
    op_ok(r);
    return 0;
}

static void free_replies(redisReply **rep, int n) {
    for (int i = 0; rep && i < n; i++) freeReplyObject(rep[i]);
}

/* ============================================================== names */
static void key_manifest(const redis_tier *r, const char *member, char out[KS_REDIS_KEY_MAX]) {
    ks_redis_key_manifest(&r->nm, member, out);
}

/* ======================================================= known entries */
static void known_add(redis_tier *r, const ks_key *key, uint32_t n_tokens, uint32_t reason, int64_t created_us,
                      uint64_t bytes) {
    ks_tier *t = &r->base;
    ks_tier_entry e;
    memset(&e, 0, sizeof e);
    e.key = *key;
    e.n_tokens = (int)n_tokens;
    e.reason = (int)reason;
    e.bytes = bytes;
    e.created_us = e.last_hit_us = created_us;
    memcpy(e.model_fp, r->fp, 32);
    e.cls = KS_ENTRY_OWN;
    pthread_rwlock_wrlock(&t->lock);
    if (!ks_keymap_get(&t->map, key)) ks__tier_insert_locked(t, &e, NULL, NULL);
    pthread_rwlock_unlock(&t->lock);
}

static void known_del(redis_tier *r, const ks_key *key) {
    pthread_rwlock_wrlock(&r->base.lock);
    free(ks__tier_unlink_locked(&r->base, key));
    pthread_rwlock_unlock(&r->base.lock);
}

/* Forgets the members of this model among members[0, n). */
static void known_del_members(void *ud, const ks_redis_member_str *members, int n) {
    redis_tier *r = ud;
    for (int i = 0; i < n; i++) {
        uint8_t fp[32];
        ks_key key;
        if (ks_redis_member_parse(members[i], strlen(members[i]), fp, &key) == 0 && memcmp(fp, r->fp, 32) == 0)
            known_del(r, &key);
    }
}

/* ========================================================== removal */
/* Deletes the entries of members[0, n) with their accounting
 * (ks_redis_ops_delete) on the writer's connection c (wr.mu held). Returns
 * how many this call removed from the accounting, or KS_EIO (counted),
 * KS_ENOMEM. */
static int delete_members(redis_tier *r, ks_redis_conn *c, const ks_redis_member_str *members, int n) {
    ks_redis_trips tr = {0, 0};
    int64_t left = -1;
    int rc = ks_redis_ops_delete(c, &r->nm, members, n, &left, &tr);
    add_trips(r, &tr);
    if (rc == KS_EIO) {
        op_fail(r, &r->wr, "eviction", NULL);
        return rc;
    }
    if (rc < 0) return rc;
    op_ok(r);
    if (left >= 0) atomic_store(&r->bytes, left > 0 ? (uint64_t)left : 0);
    known_del_members(r, members, n);
    return rc;
}

static int rt_make_room(ks_tier *t, uint64_t need, uint64_t budget) {
    redis_tier *r = (redis_tier *)t;
    int rc = 0;
    if (need > budget) return KS_ENOSPC;
    pthread_mutex_lock(&r->wr.mu);
    ks_redis_conn *c = conn(r, &r->wr);
    if (!c) {
        rc = KS_EIO;
        goto done;
    }
    /* Bounded: each round frees up to 16 entries; a budget far over its
     * limit (a smaller max_bytes than before) is brought down over a few
     * saves rather than in one long pause of the writer. */
    ks_redis_trips tr = {0, 0};
    int64_t used = -1;
    rc = ks_redis_ops_evict(c, &r->nm, need, budget, 16, known_del_members, r, &used, &tr);
    add_trips(r, &tr);
    if (used >= 0) atomic_store(&r->bytes, (uint64_t)used);
    if (rc == KS_EIO) op_fail(r, &r->wr, "eviction", NULL);
    else if (rc >= 0) op_ok(r);
done:
    pthread_mutex_unlock(&r->wr.mu);
    if (rc > 0) KS_DEBUG("store", "redis tier: evicted %d entries to stay within %" PRIu64 " bytes", rc, budget);
    return rc;
}

/* ============================================================== put */
static int rt_put(ks_tier *t, const ks_kvfile_meta *meta, const int32_t *tokens, int n, uint8_t **payload,
                  size_t len, bool *existed) {
    redis_tier *r = (redis_tier *)t;
    int rc = 0;
    uint8_t *buf = NULL;
    size_t total = 0;
    redisReply **rep = NULL;
    char member[KS_REDIS_MEMBER_LEN + 1], mkey[KS_REDIS_KEY_MAX], ck[KS_REDIS_KEY_MAX], line[192];
    if (existed) *existed = false;
    if (!payload || (len && !*payload)) return KS_EINVAL;
    if ((rc = ks_kvfile_encode(meta, tokens, n, *payload, len, &buf, &total)) != 0) return rc;
    ks_redis_manifest m = {
        .n_tokens = (uint32_t)n,
        .reason = meta->reason,
        .created_us = meta->created_us,
        .total = total,
        .chunk_bytes = (uint64_t)(r->cfg.chunk_bytes - KS_REDIS_CHUNK_SLACK),
        .n_chunks = ks_redis_n_chunks(total, (uint64_t)(r->cfg.chunk_bytes - KS_REDIS_CHUNK_SLACK)),
        .csum = XXH3_64bits(buf, total),
    };
    m.nonce = ks_random_u64();
    ks_redis_member(r->fp, &meta->key, member);
    if (meta->mac && (rc = ks_redis_manifest_sign(meta->mac, member, &m)) != 0) {
        free(buf);
        return rc;
    }
    int ml = ks_redis_manifest_encode(&m, line, sizeof line);
    key_manifest(r, member, mkey);
    if (!(rep = calloc((size_t)m.n_chunks + 8, sizeof *rep))) {
        free(buf);
        return KS_ENOMEM;
    }
    pthread_mutex_lock(&r->wr.mu);
    ks_redis_conn *c = conn(r, &r->wr);
    if (!c) {
        rc = KS_EIO;
        goto done;
    }
    ks_redis_conn_append(c, "EXISTS %s", mkey);
    if ((rc = collect(r, &r->wr, 1, rep, "save (exists)")) != 0) goto done;
    bool there = ks_redis_reply_int(rep[0]) == 1;
    free_replies(rep, 1);
    rep[0] = NULL;
    if (there) {
        if (existed) *existed = true;
        known_add(r, &meta->key, m.n_tokens, m.reason, m.created_us, total);
        goto done;
    }
    /* The chunks first, in one pipeline... */
    for (uint32_t i = 0; i < m.n_chunks; i++) {
        uint64_t off, cl;
        ks_redis_chunk_range(total, m.chunk_bytes, i, &off, &cl);
        ks_redis_key_chunk(mkey, m.nonce, i, ck);
        if (r->cfg.ttl > 0)
            ks_redis_conn_append(c, "SET %s %b EX %lld", ck, buf + off, (size_t)cl, (long long)r->cfg.ttl);
        else
            ks_redis_conn_append(c, "SET %s %b", ck, buf + off, (size_t)cl);
    }
    if ((rc = collect(r, &r->wr, (int)m.n_chunks, rep, "save (chunks)")) != 0) goto done;
    bool all = true;
    for (uint32_t i = 0; i < m.n_chunks; i++) all = all && ks_redis_reply_is(rep[i], REDIS_REPLY_STATUS);
    if (!all) {
        /* Refused by the server (maxmemory with noeviction): what was written goes. */
        KS_WARN("store", "redis tier: %s refused a chunk (%s); the save of %d tokens is dropped", r->where,
                rep[0] && rep[0]->type == REDIS_REPLY_ERROR ? rep[0]->str : "see the server's log", n);
    }
    free_replies(rep, (int)m.n_chunks);
    memset(rep, 0, ((size_t)m.n_chunks + 8) * sizeof *rep);
    /* ...then the manifest, only if no other host published this state first. */
    bool published = false;
    if (all) {
        if (r->cfg.ttl > 0)
            ks_redis_conn_append(c, "SET %s %b NX EX %lld", mkey, line, (size_t)ml, (long long)r->cfg.ttl);
        else
            ks_redis_conn_append(c, "SET %s %b NX", mkey, line, (size_t)ml);
        if ((rc = collect(r, &r->wr, 1, rep, "save (manifest)")) != 0) goto done;
        published = ks_redis_reply_is(rep[0], REDIS_REPLY_STATUS);
        if (!published && rep[0] && rep[0]->type == REDIS_REPLY_NIL && existed) *existed = true;
        free_replies(rep, 1);
        rep[0] = NULL;
    }
    if (!published) {
        /* Our chunks are nobody's: remove them (best effort). */
        const char **argv = malloc(((size_t)m.n_chunks + 1) * sizeof *argv);
        char (*names)[KS_REDIS_KEY_MAX] = malloc(((size_t)m.n_chunks + 1) * KS_REDIS_KEY_MAX);
        if (argv && names && m.n_chunks) {
            argv[0] = "DEL";
            for (uint32_t i = 0; i < m.n_chunks; i++) {
                ks_redis_key_chunk(mkey, m.nonce, i, names[i]);
                argv[i + 1] = names[i];
            }
            ks_redis_conn_append_argv(c, (int)m.n_chunks + 1, argv, NULL);
            if (collect(r, &r->wr, 1, rep, "save (undo)") == 0) free_replies(rep, 1);
            rep[0] = NULL;
        }
        free(argv);
        free(names);
        if (!all) rc = KS_ENOSPC;
        else known_add(r, &meta->key, m.n_tokens, m.reason, m.created_us, total);
        goto done;
    }
    /* Visible: account for it. */
    ks_redis_conn_append(c, "HSET %s %s %llu", r->nm.sizes, member, (unsigned long long)total);
    ks_redis_conn_append(c, "INCRBY %s %llu", r->nm.bytes, (unsigned long long)total);
    ks_redis_conn_append(c, "ZADD %s %lld %s", r->nm.lru, (long long)(ks_wall_us() / 1000), member);
    ks_redis_conn_append(c, "ZADD %s %u %u", r->k_lens, m.n_tokens, m.n_tokens);
    ks_redis_conn_append(c, "ZCARD %s", r->nm.lru);
    if ((rc = collect(r, &r->wr, 5, rep, "save (account)")) != 0) goto done;
    int64_t b = ks_redis_reply_int(rep[1]), e = ks_redis_reply_int(rep[4]);
    atomic_store(&r->bytes, b > 0 ? (uint64_t)b : 0);
    atomic_store(&r->entries, e > 0 ? (uint64_t)e : 0);
    free_replies(rep, 5);
    memset(rep, 0, 5 * sizeof *rep);
    atomic_fetch_add(&r->bytes_written, total);
    known_add(r, &meta->key, m.n_tokens, m.reason, m.created_us, total);
done:
    pthread_mutex_unlock(&r->wr.mu);
    free(rep);
    free(buf);
    return rc;
}

/* ============================================================ lookups */
/* The found entry's manifest travels in its ks_tier_found. */
_Static_assert(sizeof(ks_redis_manifest) <= sizeof(((ks_tier_found *)0)->priv_), "a manifest fits in ks_tier_found");

static int rt_probe(ks_tier *t, const ks_key *keys, int k, ks_tier_found *what, bool *found, int lens_lo,
                    int lens_hi, int *lens, int *n_lens, int cap) {
    redis_tier *r = (redis_tier *)t;
    int rc = 0;
    if (n_lens) *n_lens = 0;
    for (int i = 0; i < k; i++) found[i] = false;
    if (!rt_up(t)) return KS_EBUSY;
    int nq = k + (lens ? 1 : 0);
    if (nq == 0) return 0;
    redisReply **rep = calloc((size_t)nq, sizeof *rep);
    if (!rep) return KS_ENOMEM;
    char member[KS_REDIS_MEMBER_LEN + 1], mkey[KS_REDIS_KEY_MAX];
    rconn *cn = rd_take(r);
    ks_redis_conn *c = conn(r, cn);
    if (!c) {
        rc = KS_EIO;
        goto done;
    }
    for (int i = 0; i < k; i++) {
        ks_redis_member(r->fp, &keys[i], member);
        key_manifest(r, member, mkey);
        ks_redis_conn_append(c, "GET %s", mkey);
    }
    if (lens) ks_redis_conn_append(c, "ZRANGEBYSCORE %s %d %d", r->k_lens, lens_lo, lens_hi);
    if ((rc = collect(r, cn, nq, rep, "lookup (manifests)")) != 0) goto done;
    for (int i = 0; i < k; i++) {
        if (rep[i]->type == REDIS_REPLY_STRING) {
            ks_redis_manifest m;
            found[i] = ks_redis_manifest_decode(rep[i]->str, rep[i]->len, &m) == 0;
            if (!found[i]) atomic_fetch_add(&r->broken, 1);
            what[i].n_tokens = found[i] ? m.n_tokens : 0;
            what[i].reason = found[i] ? m.reason : 0;
            if (found[i]) memcpy(what[i].priv_, &m, sizeof m);
        } else {
            /* Gone (evicted by a host or by Redis): forget it here too. */
            known_del(r, &keys[i]);
        }
    }
    if (lens && rep[k]->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i < rep[k]->elements && *n_lens < cap; i++) {
            long v = rep[k]->element[i]->str ? strtol(rep[k]->element[i]->str, NULL, 10) : 0;
            if (v >= lens_lo && v <= lens_hi && v > 0) lens[(*n_lens)++] = (int)v;
        }
    free_replies(rep, nq);
done:
    pthread_mutex_unlock(&cn->mu);
    free(rep);
    return rc;
}

static int rt_fetch(ks_tier *t, const ks_key *key, const ks_tier_found *f, const ks_kvfile_expect *exp,
                    ks_tier_blob *out) {
    redis_tier *r = (redis_tier *)t;
    ks_redis_manifest mf;
    memcpy(&mf, f->priv_, sizeof mf);
    const ks_redis_manifest *m = &mf;
    int rc = 0;
    uint8_t *buf = NULL;
    memset(out, 0, sizeof *out);
    if (!rt_up(t)) return KS_EBUSY;
    char member[KS_REDIS_MEMBER_LEN + 1], mkey[KS_REDIS_KEY_MAX], ck[KS_REDIS_KEY_MAX];
    ks_redis_member(r->fp, key, member);
    /* With a cache secret, a manifest without a valid tag for this key is
     * not one a server with the secret wrote: refused like a corrupt entry
     * (counted, deleted) before any chunk is fetched. The entry's own tag
     * is checked again on its bytes (ks_redis_ops_check). */
    if (t->ident.mac && !ks_redis_manifest_verify(t->ident.mac, member, m)) return KS_ECORRUPT;
    /* m was checked against the limits (redis_fmt.h): total is bounded. */
    if (m->total > SIZE_MAX || !(buf = malloc((size_t)m->total))) return KS_ENOMEM;
    int extra = 1 + (r->cfg.ttl > 0 ? 1 + (int)m->n_chunks : 0);
    int nq = (int)m->n_chunks + extra;
    redisReply **rep = calloc((size_t)nq, sizeof *rep);
    if (!rep) {
        free(buf);
        return KS_ENOMEM;
    }
    key_manifest(r, member, mkey);
    rconn *cn = rd_take(r);
    ks_redis_conn *c = conn(r, cn);
    if (!c) {
        rc = KS_EIO;
        goto unlock;
    }
    ks_redis_ops_append_chunks(c, mkey, m);
    /* The hit: most recently used now (XX: only while the entry is accounted). */
    ks_redis_conn_append(c, "ZADD %s XX %lld %s", r->nm.lru, (long long)(ks_wall_us() / 1000), member);
    if (r->cfg.ttl > 0) {
        /* A TTL counts from the last use, as the LRU does. */
        ks_redis_conn_append(c, "EXPIRE %s %lld", mkey, (long long)r->cfg.ttl);
        for (uint32_t i = 0; i < m->n_chunks; i++) {
            ks_redis_key_chunk(mkey, m->nonce, i, ck);
            ks_redis_conn_append(c, "EXPIRE %s %lld", ck, (long long)r->cfg.ttl);
        }
    }
    double tq = ks_now_ms();
    rc = collect(r, cn, nq, rep, "lookup (chunks)");
    double tc = ks_now_ms();
    KS_DEBUG("store", "redis tier: %" PRIu32 " chunks, %" PRIu64 " bytes read in %.2f ms", m->n_chunks, m->total, tc - tq);
unlock:
    pthread_mutex_unlock(&cn->mu);
    if (rc != 0) goto done;
    rc = ks_redis_ops_take_chunks(rep, m, buf);
    free_replies(rep, nq);
    if (rc == KS_ENOENT) {
        atomic_fetch_add(&r->broken, 1); /* evicted or expired under the manifest */
        goto done;
    }
    if (rc != 0) goto done;
    ks_kvfile_meta km;
    size_t off = 0;
    if ((rc = ks_redis_ops_check(buf, m, key, exp, &km, &off)) != 0) goto done;
    atomic_fetch_add(&r->bytes_read, m->total);
    known_add(r, key, m->n_tokens, km.reason, km.created_us, m->total);
    ks__tier_touch(t, key);
    out->owner_ = buf;
    out->payload = buf + off;
    out->len = (size_t)km.payload_len;
    out->release_ = NULL; /* a plain buffer: free()d */
    buf = NULL;
done:
    free(rep);
    free(buf);
    return rc;
}

static int rt_get(ks_tier *t, const ks_key *key, const ks_kvfile_expect *exp, ks_tier_blob *out) {
    ks_tier_found m;
    bool found = false;
    memset(out, 0, sizeof *out);
    int rc = rt_probe(t, key, 1, &m, &found, 0, 0, NULL, NULL, 0);
    if (rc != 0) return rc == KS_EBUSY ? KS_ENOENT : rc;
    if (!found) return KS_ENOENT;
    return rt_fetch(t, key, &m, exp, out);
}

/* ============================================================ removal */
static int remove_key(redis_tier *r, const ks_key *key) {
    ks_redis_member_str members[1];
    ks_redis_member(r->fp, key, members[0]);
    pthread_mutex_lock(&r->wr.mu);
    ks_redis_conn *c = conn(r, &r->wr);
    int rc = c ? delete_members(r, c, members, 1) : KS_EIO;
    pthread_mutex_unlock(&r->wr.mu);
    known_del(r, key);
    return rc < 0 ? rc : 0;
}

static int rt_drop(ks_tier *t, const ks_key *key, void *blob) {
    (void)blob;
    return remove_key((redis_tier *)t, key);
}

static int rt_quarantine(ks_tier *t, const ks_key *key) {
    /* Nothing to keep aside in Redis: a bad or broken entry is deleted, and
     * the next save of that state writes it again. */
    return remove_key((redis_tier *)t, key);
}

static int rt_rescan(ks_tier *t, unsigned flags) {
    (void)t;
    (void)flags;
    return 0;
}

static void rt_persist(ks_tier *t) { (void)t; }

static void rt_close(ks_tier *t) {
    redis_tier *r = (redis_tier *)t;
    for (int i = 0; i < KS_REDIS_LOOKUP_CONNS; i++) {
        ks_redis_conn_free(r->rd[i].c);
        pthread_mutex_destroy(&r->rd[i].mu);
    }
    ks_redis_conn_free(r->wr.c);
    ks_redis_tls_free(r->tls);
    pthread_mutex_destroy(&r->wr.mu);
    ks__tier_fini(t);
    /* The password leaves memory with the tier. */
    memset(&r->url, 0, sizeof r->url);
    free(r);
}


static void rt_note_dropped(ks_tier *t) { atomic_fetch_add(&((redis_tier *)t)->dropped, 1); }

static void rt_remote_stats(ks_tier *t, ks_tier_remote_stats *o) {
    redis_tier *r = (redis_tier *)t;
    memset(o, 0, sizeof *o);
    o->bytes = atomic_load(&r->bytes);
    o->entries = atomic_load(&r->entries);
    o->errors = atomic_load(&r->errors);
    o->dropped_saves = atomic_load(&r->dropped);
    o->broken = atomic_load(&r->broken);
    o->ops = atomic_load(&r->ops);
    o->op_ms_total = (double)atomic_load(&r->op_us) / 1000.0;
    o->bytes_read = atomic_load(&r->bytes_read);
    o->bytes_written = atomic_load(&r->bytes_written);
    o->breaker_opens = atomic_load(&r->opens);
    int64_t until = atomic_load(&r->open_until_ms);
    o->breaker = until == 0 ? KS_BREAKER_CLOSED : mono_ms() < until ? KS_BREAKER_OPEN : KS_BREAKER_HALF_OPEN;
}

static const ks_tier_vt k_redis_vt = {
    .put = rt_put,
    .get = rt_get,
    .drop = rt_drop,
    .quarantine = rt_quarantine,
    .rescan = rt_rescan,
    .persist = rt_persist,
    .reload_pin = NULL,
    .make_room = rt_make_room,
    .up = rt_up,
    .note_dropped = rt_note_dropped,
    .probe = rt_probe,
    .fetch = rt_fetch,
    .remote_stats = rt_remote_stats,
    .close = rt_close,
};

int ks_tier_redis_open(const struct ks_redis_cfg *cfg, uint64_t max_bytes, const ks_tier_ident *ident,
                       ks_tier **out, char *err, size_t errlen) {
    *out = NULL;
    redis_tier *r = calloc(1, sizeof *r);
    if (!r) return KS_ENOMEM;
    /* The URL, the password (from cfg when the URL has none) and, for
     * rediss://, the TLS context: every setting checked here. */
    int rc = ks_redis_cfg_prepare(cfg, &r->url, &r->tls, err, errlen);
    if (rc) goto fail;
    ks_redis_url_redact(cfg->url, r->where, sizeof r->where);
    r->cfg = *cfg;
    memset(r->cfg.password, 0, sizeof r->cfg.password);
    if (!r->cfg.key_prefix[0] || strchr(r->cfg.key_prefix, ' ') || r->cfg.chunk_bytes < KS_REDIS_CHUNK_MIN ||
        r->cfg.chunk_bytes > KS_REDIS_CHUNK_MAX || r->cfg.timeout_ms < 1 || r->cfg.breaker_errors < 1 ||
        r->cfg.breaker_ms < 0) {
        ks_set_err(err, errlen, "redis tier: invalid settings (key_prefix, chunk_bytes, timeout_ms or breaker)");
        rc = KS_EINVAL;
        goto fail;
    }
    r->max_bytes = max_bytes;
    if (ident && ident->model_fp) memcpy(r->fp, ident->model_fp, 32);
    if (ks_redis_names_init(&r->nm, r->cfg.key_prefix) != 0) {
        ks_set_err(err, errlen, "redis tier: key_prefix longer than %d bytes", KS_REDIS_PREFIX_MAX - 1);
        rc = KS_EINVAL;
        goto fail;
    }
    ks_redis_key_lens(&r->nm, r->fp, r->k_lens);
    for (int i = 0; i < KS_REDIS_LOOKUP_CONNS; i++) pthread_mutex_init(&r->rd[i].mu, NULL);
    pthread_mutex_init(&r->wr.mu, NULL);
    if ((rc = ks__tier_init(&r->base, &k_redis_vt, KS_TIER_REDIS, ident)) != 0) {
        for (int i = 0; i < KS_REDIS_LOOKUP_CONNS; i++) pthread_mutex_destroy(&r->rd[i].mu);
        pthread_mutex_destroy(&r->wr.mu);
        goto fail;
    }
    /* A first contact tells the operator at start whether Redis answers; a
     * server that does not is no reason not to serve (the breaker retries). */
    pthread_mutex_lock(&r->wr.mu);
    ks_redis_conn *c = conn(r, &r->wr);
    redisReply *rep[2] = {0};
    if (c) {
        ks_redis_conn_append(c, "GET %s", r->nm.bytes);
        ks_redis_conn_append(c, "ZCARD %s", r->nm.lru);
        if (collect(r, &r->wr, 2, rep, "first contact") == 0) {
            int64_t b = ks_redis_reply_int(rep[0]), e = ks_redis_reply_int(rep[1]);
            atomic_store(&r->bytes, b > 0 ? (uint64_t)b : 0);
            atomic_store(&r->entries, e > 0 ? (uint64_t)e : 0);
            free_replies(rep, 2);
        }
    }
    bool up = r->wr.c != NULL;
    pthread_mutex_unlock(&r->wr.mu);
    if (!up) {
        /* Open the breaker at once: the first lookups must not each wait for
         * a connect timeout. */
        atomic_store(&r->open_until_ms, mono_ms() + r->cfg.breaker_ms);
        KS_WARN("store", "redis tier: %s does not answer; serving without it, retrying every %d ms (%s)", r->where,
                r->cfg.breaker_ms, r->wr.why[0] ? r->wr.why : "no reason given");
    }
    *out = &r->base;
    return 0;
fail:
    ks_redis_tls_free(r->tls);
    memset(&r->url, 0, sizeof r->url);
    free(r);
    return rc;
}

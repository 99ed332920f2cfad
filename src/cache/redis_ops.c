/*
 * redis_ops.c — see redis_ops.h.
 */
#include "cache/redis_ops.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/base.h"

/* One pipeline's replies; server error replies are logged (not failures). */
static int collect(ks_redis_conn *c, int n, redisReply **rep, ks_redis_trips *trips, const char *what) {
    int rc = ks_redis_conn_get_replies(c, n, rep, trips);
    for (int i = 0; rc == 0 && i < n; i++)
        if (rep[i]->type == REDIS_REPLY_ERROR) KS_DEBUG("store", "redis: %s: %s", what, rep[i]->str);
    return rc;
}

static void free_replies(redisReply **rep, int n) {
    for (int i = 0; rep && i < n; i++) {
        freeReplyObject(rep[i]);
        rep[i] = NULL;
    }
}

int ks_redis_ops_delete(ks_redis_conn *c, const ks_redis_names *nm, const ks_redis_member_str *members, int n,
                        int64_t *bytes_left, ks_redis_trips *trips) {
    int rc = 0, removed = 0;
    if (bytes_left) *bytes_left = -1;
    if (n <= 0) return 0;
    redisReply **rep = calloc((size_t)n * 3 + 1, sizeof *rep);
    uint64_t *sizes = calloc((size_t)n + 1, sizeof *sizes);
    if (!rep || !sizes) {
        rc = KS_ENOMEM;
        goto done;
    }
    char mkey[KS_REDIS_KEY_MAX];
    /* 1. What each entry is made of, and the size the accounting holds. */
    for (int i = 0; i < n; i++) {
        ks_redis_key_manifest(nm, members[i], mkey);
        ks_redis_conn_append(c, "GET %s", mkey);
        ks_redis_conn_append(c, "HGET %s %s", nm->sizes, members[i]);
    }
    if ((rc = collect(c, 2 * n, rep, trips, "eviction (read)")) != 0) goto done;
    /* 2. DEL manifest chunk... in one command: the manifest goes with its
     * chunks. A manifest gone or unreadable leaves its chunks to their TTL
     * (or to Redis's eviction): their nonce is unknown. */
    for (int i = 0; i < n; i++) {
        redisReply *man = rep[2 * i];
        sizes[i] = (uint64_t)ks_redis_reply_int(rep[2 * i + 1]);
        ks_redis_manifest m;
        bool have = man && man->type == REDIS_REPLY_STRING && ks_redis_manifest_decode(man->str, man->len, &m) == 0;
        ks_redis_key_manifest(nm, members[i], mkey);
        uint32_t nc = have ? m.n_chunks : 0;
        const char **argv = malloc(((size_t)nc + 2) * sizeof *argv);
        char (*names)[KS_REDIS_KEY_MAX] = malloc(((size_t)nc + 1) * KS_REDIS_KEY_MAX);
        if (!argv || !names) {
            ks_redis_conn_append(c, "DEL %s", mkey);
        } else {
            argv[0] = "DEL";
            argv[1] = mkey;
            for (uint32_t k = 0; k < nc; k++) {
                ks_redis_key_chunk(mkey, m.nonce, k, names[k]);
                argv[k + 2] = names[k];
            }
            ks_redis_conn_append_argv(c, (int)nc + 2, argv, NULL);
        }
        free(argv);
        free(names);
        ks_redis_conn_append(c, "ZREM %s %s", nm->lru, members[i]);
        ks_redis_conn_append(c, "HDEL %s %s", nm->sizes, members[i]);
    }
    free_replies(rep, 2 * n);
    if ((rc = collect(c, 3 * n, rep, trips, "eviction (delete)")) != 0) goto done;
    /* 3. Only the caller whose HDEL removed the size takes it off the sum. */
    int nd = 0;
    for (int i = 0; i < n; i++)
        if (ks_redis_reply_int(rep[3 * i + 2]) == 1 && sizes[i] > 0) {
            ks_redis_conn_append(c, "DECRBY %s %" PRIu64, nm->bytes, sizes[i]);
            nd++;
            removed++;
        }
    free_replies(rep, 3 * n);
    if (nd && (rc = collect(c, nd, rep, trips, "eviction (account)")) == 0) {
        if (bytes_left) *bytes_left = ks_redis_reply_int(rep[nd - 1]);
        free_replies(rep, nd);
    }
done:
    free(rep);
    free(sizes);
    return rc ? rc : removed;
}

int ks_redis_ops_evict(ks_redis_conn *c, const ks_redis_names *nm, uint64_t need, uint64_t budget, int max_rounds,
                       ks_redis_evict_cb cb, void *ud, int64_t *bytes_now, ks_redis_trips *trips) {
    int rc = 0, evicted = 0;
    if (bytes_now) *bytes_now = -1;
    if (need > budget) return KS_ENOSPC;
    for (int round = 0; max_rounds <= 0 || round < max_rounds; round++) {
        redisReply *rep[2] = {0};
        ks_redis_conn_append(c, "GET %s", nm->bytes);
        ks_redis_conn_append(c, "ZRANGE %s 0 15", nm->lru);
        if ((rc = collect(c, 2, rep, trips, "eviction (list)")) != 0) break;
        int64_t used = ks_redis_reply_int(rep[0]);
        if (bytes_now) *bytes_now = used;
        if (used < 0 || (uint64_t)used + need <= budget) {
            free_replies(rep, 2);
            break;
        }
        size_t n = rep[1]->type == REDIS_REPLY_ARRAY ? rep[1]->elements : 0;
        if (n == 0) {
            /* The sum counts entries that are gone (a host died between
             * steps): nothing is left to evict, so it restarts from zero. */
            free_replies(rep, 2);
            ks_redis_conn_append(c, "SET %s 0", nm->bytes);
            if ((rc = collect(c, 1, rep, trips, "eviction (reset)")) != 0) break;
            free_replies(rep, 1);
            if (bytes_now) *bytes_now = 0;
            break;
        }
        ks_redis_member_str *members = calloc(n, sizeof *members);
        int k = 0;
        for (size_t i = 0; members && i < n; i++) {
            redisReply *e = rep[1]->element[i];
            if (e->type == REDIS_REPLY_STRING && e->len <= KS_REDIS_MEMBER_LEN) {
                memcpy(members[k], e->str, e->len);
                members[k++][e->len] = '\0';
            }
        }
        free_replies(rep, 2);
        if (!members) {
            rc = KS_ENOMEM;
            break;
        }
        int64_t left = -1;
        int d = ks_redis_ops_delete(c, nm, members, k, &left, trips);
        if (d >= 0 && cb) cb(ud, members, k);
        free(members);
        if (d < 0) {
            rc = d;
            break;
        }
        if (left >= 0 && bytes_now) *bytes_now = left;
        evicted += d;
    }
    return rc ? rc : evicted;
}

int ks_redis_ops_append_chunks(ks_redis_conn *c, const char *mkey, const ks_redis_manifest *m) {
    char ck[KS_REDIS_KEY_MAX];
    for (uint32_t i = 0; i < m->n_chunks; i++) {
        ks_redis_key_chunk(mkey, m->nonce, i, ck);
        int rc = ks_redis_conn_append(c, "GET %s", ck);
        if (rc) return rc;
    }
    return 0;
}

int ks_redis_ops_take_chunks(redisReply *const *rep, const ks_redis_manifest *m, uint8_t *buf) {
    for (uint32_t i = 0; i < m->n_chunks; i++) {
        uint64_t off, cl;
        ks_redis_chunk_range(m->total, m->chunk_bytes, i, &off, &cl);
        if (!rep[i] || rep[i]->type != REDIS_REPLY_STRING) return KS_ENOENT;
        if ((uint64_t)rep[i]->len != cl) return KS_ECORRUPT;
        memcpy(buf + off, rep[i]->str, (size_t)cl);
    }
    return 0;
}

int ks_redis_ops_check(const uint8_t *buf, const ks_redis_manifest *m, const ks_key *key, const ks_kvfile_expect *exp,
                       ks_kvfile_meta *meta, size_t *payload_off) {
    if (XXH3_64bits(buf, (size_t)m->total) != m->csum) return KS_ECORRUPT;
    ks_kvfile_meta km;
    size_t off = 0;
    int rc = ks_kvfile_decode(buf, (size_t)m->total, exp, &km, &off);
    if (rc != 0) return rc;
    if (km.n_tokens != m->n_tokens || !ks_key_eq(&km.key, key)) return KS_EMISMATCH;
    if (meta) *meta = km;
    if (payload_off) *payload_off = off;
    return 0;
}

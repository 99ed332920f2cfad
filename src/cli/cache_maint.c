/*
 * cache_maint.c — `kvstash cache verify|gc|rm` (cmd_cache.h): the commands
 * that check, shrink and clear the store's directories and a redis tier.
 * The options, the listings and the dispatch are cmd_cache.c's.
 */
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/kvfile.h"
#include "cache/store.h"
#include "cache/tier.h"
#include "cli/cache_redis.h"
#include "cli/cmd_cache.h"

#define CMD "kvstash cache"

/* --------------------------------------------------------------- verify */
typedef struct vstate {
    int good, bad, skipped;
    int tagged; /* files that carry a tag (KS_KVFILE_FLAG_MAC) */
    const char *dir; /* the directory being checked */
    /* the good files by K/V cache types (ks__cache_kv_types) */
    struct {
        char types[32];
        int n;
    } kv[16];
    int n_kv;
} vstate;

static void count_kv(vstate *v, const char *types) {
    int i = 0;
    while (i < v->n_kv && strcmp(v->kv[i].types, types)) i++;
    if (i == v->n_kv) {
        if (v->n_kv == (int)(sizeof v->kv / sizeof v->kv[0])) return;
        snprintf(v->kv[v->n_kv++].types, sizeof v->kv[0].types, "%s", types);
    }
    v->kv[i].n++;
}

static int verify_cb(void *ud, const char *path, int rc, const ks_kvfile_meta *m) {
    vstate *v = ud;
    if (m && (m->flags & KS_KVFILE_FLAG_MAC)) v->tagged++;
    if (rc == 0) {
        v->good++;
        if (m) count_kv(v, ks__cache_kv_types(v->dir, m->params_hash));
    } else if (rc == KS_EINVAL) {
        v->skipped++;
        printf("skipped: %s: not a regular file\n", path);
    } else {
        v->bad++;
        printf("bad: %s: %s (%s)\n", path, ks_errname(rc), ks_strerror(rc));
    }
    return 0;
}

/* The cache secret of --secret-file (or --config's), else $KVSTASH_CACHE_SECRET:
 * 0 with *on set when there is one, or 2 (message printed). */
static int load_secret(const opts *o, ks_kvmac_key *k, bool *on) {
    char err[512] = "";
    const char *env = getenv(KS_KVMAC_ENV);
    *on = false;
    if (o->secret_file[0]) {
        if (ks_kvmac_key_load_file(o->secret_file, k, err, sizeof err) != 0) {
            fprintf(stderr, CMD " verify: %s\n", err);
            return 2;
        }
    } else if (env && env[0]) {
        if (ks_kvmac_key_from_secret(env, strlen(env), k) != 0) {
            fprintf(stderr, CMD " verify: $" KS_KVMAC_ENV ": the secret must be %u to %u bytes\n",
                    KS_KVMAC_SECRET_MIN, KS_KVMAC_SECRET_MAX);
            return 2;
        }
    } else {
        return 0;
    }
    *on = true;
    return 0;
}

int ks__cache_verify(const opts *o) {
    vstate v = {0};
    ks_kvmac_key key;
    bool auth = false;
    int crc = ks__cache_check_dirs(o);
    if (crc) return crc;
    if ((crc = load_secret(o, &key, &auth)) != 0) return crc;
    /* Connected before anything is read: an unreachable Redis fails fast. */
    ks_cache_redis *redis = NULL;
    if ((crc = ks__cache_open_redis(o, &redis)) != 0) return crc;
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK; t++) {
        if (!o->use[t]) continue;
        v.dir = o->dirs[t];
        int rc = ks_store_verify_dir_mac(o->dirs[t], auth ? &key : NULL, verify_cb, &v);
        if (rc == KS_ENOENT) continue; /* vanished since ks__cache_check_dirs */
        if (rc < 0) {
            fprintf(stderr, CMD " verify: %s: %s\n", o->dirs[t],
                    rc == KS_EINVAL ? "not a directory" : ks_strerror(rc));
            ks_cache_redis_close(redis);
            return rc == KS_EINVAL ? 2 : 1;
        }
    }
    if (o->use[KS_TIER_SHM] || o->use[KS_TIER_DISK]) {
        printf("%d files checked: %d good, %d bad", v.good + v.bad, v.good, v.bad);
        if (v.skipped) printf("; %d skipped (not regular files)", v.skipped);
        printf("\n");
        /* What they hold, by K/V cache types ("?": no name registered) */
        if (v.n_kv) {
            printf("K/V cache types:");
            for (int i = 0; i < v.n_kv; i++) printf("%s %s %d", i ? "," : "", v.kv[i].types, v.kv[i].n);
            printf("\n");
        }
    }
    if (redis) {
        int good = 0, bad = 0;
        crc = ks_cache_redis_verify(redis, auth ? &key : NULL, &good, &bad);
        ks_cache_redis_close(redis);
        if (crc) return crc;
        printf("%d redis entries checked: %d good, %d bad\n", good + bad, good, bad);
        v.bad += bad;
    }
    /* Checksums alone find accidental damage only: say which check ran. */
    if (auth)
        printf("authenticated: every entry checked against the cache secret (entries without a valid tag are "
               "bad)\n");
    else
        printf("not authenticated: no cache secret (--secret-file or $" KS_KVMAC_ENV "), so entries were checked "
               "against their checksums only, which anyone who can write them can recompute%s\n",
               v.tagged ? "; tagged files were not authenticated" : "");
    memset(&key, 0, sizeof key);
    return v.bad ? 1 : 0;
}

/* ------------------------------------------------------------------- gc */
static int purge_quarantine(const char *dir) {
    char q[PATH_MAX], p[PATH_MAX];
    int n = 0;
    if (snprintf(q, sizeof q, "%s/quarantine", dir) >= (int)sizeof q) return 0;
    DIR *d = opendir(q);
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        if (snprintf(p, sizeof p, "%s/%s", q, de->d_name) >= (int)sizeof p) continue;
        if (unlink(p) == 0) n++;
    }
    closedir(d);
    rmdir(q);
    return n;
}

int ks__cache_gc(const opts *o) {
    if (o->prefix || o->all) {
        fprintf(stderr, CMD " gc: takes no key prefix (use rm)\n");
        return 2;
    }
    int rc = ks__cache_check_dirs(o);
    if (rc) return rc;
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK; t++) {
        ks_tier *tier = NULL;
        /* CLEANUP: temp files of dead writers go, files with a bad header are
         * moved to quarantine/ (and purged below). */
        if (ks__cache_open_tier(o, t, KS_TIER_CLEANUP, &tier) != 0) return 1;
        if (!tier) continue;
        uint64_t budget = (uint64_t)(o->max_bytes >= 0 ? o->max_bytes : o->cfg.tier_max_bytes[t]);
        uint64_t b0 = 0, b1 = 0, e1 = 0;
        ks_tier_usage(tier, &b0, NULL);
        /* The store's own GC, with the configured pin share (store.h "Pins"). */
        int drops = 0;
        int n = ks_store_gc_tier(tier, budget, o->cfg.pin_share, &drops);
        ks_tier_usage(tier, &b1, &e1);
        uint64_t bad = atomic_load(&tier->n_bad);
        ks_tier_close(tier);
        int purged = purge_quarantine(o->dirs[t]);
        char freed[16], now[16], lim[16];
        ks__cache_fmt_bytes(b0 - b1, freed, sizeof freed);
        ks__cache_fmt_bytes(b1, now, sizeof now);
        ks__cache_fmt_bytes(budget, lim, sizeof lim);
        printf("%s: evicted %d entries (%s; %d pinned), now %llu entries, %s (budget %s, pins within %.0f%% of it); "
               "%llu bad files, %d quarantined files removed\n",
               ks_tier_name((ks_tier_id)t), n, freed, drops, (unsigned long long)e1, now, lim, 100.0 * o->cfg.pin_share,
               (unsigned long long)bad, purged);
    }
    ks_cache_redis *redis = NULL;
    if ((rc = ks__cache_open_redis(o, &redis)) != 0 || !redis) return rc;
    if (o->max_bytes < 0) {
        printf("redis: nothing evicted: give --max-bytes N (the servers keep Redis within their "
               "store.tiers.redis.max_bytes, which is not known here)\n");
    } else {
        int n = 0;
        uint64_t b0 = 0, b1 = 0;
        rc = ks_cache_redis_gc(redis, (uint64_t)o->max_bytes, &n, &b0, &b1);
        if (rc == 0) {
            char freed[16], now[16], lim[16];
            ks__cache_fmt_bytes(b0 > b1 ? b0 - b1 : 0, freed, sizeof freed);
            ks__cache_fmt_bytes(b1, now, sizeof now);
            ks__cache_fmt_bytes((uint64_t)o->max_bytes, lim, sizeof lim);
            printf("redis: evicted %d entries (%s), now %s (budget %s)%s\n", n, freed, now, lim,
                   b1 > (uint64_t)o->max_bytes ? "; still over: servers are saving, run it again" : "");
        }
    }
    ks_cache_redis_close(redis);
    return rc;
}

/* ------------------------------------------------------------------- rm */
int ks__cache_rm(const opts *o) {
    if (o->all == (o->prefix != NULL)) {
        fprintf(stderr, CMD " rm: give either --all or a KEYPREFIX\n");
        return 2;
    }
    int crc = ks__cache_check_dirs(o);
    if (crc) return crc;
    int removed = 0, failed = 0;
    ks_cache_redis *redis = NULL;
    if ((crc = ks__cache_open_redis(o, &redis)) != 0) return crc;
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK; t++) {
        ks_tier *tier = NULL;
        rows r = {0};
        if (ks__cache_open_tier(o, t, 0, &tier) != 0) {
            ks_cache_redis_close(redis);
            return 1;
        }
        if (!tier) continue;
        r.tier = t;
        r.prefix = o->prefix;
        ks_tier_list(tier, ks__cache_collect, &r);
        for (size_t i = 0; i < r.n; i++) {
            char hex[KS_KEY_HEX_LEN + 1];
            ks_key_to_hex(&r.v[i].e.key, hex);
            int rc = ks_tier_remove(tier, &r.v[i].e.key);
            if (rc == 0) {
                removed++;
                if (!o->all) printf("removed %s (%s, %d tokens)\n", hex, ks_tier_name((ks_tier_id)t), r.v[i].e.n_tokens);
            } else if (rc != KS_ENOENT) {
                failed++;
                fprintf(stderr, CMD " rm: %s: %s\n", hex, ks_strerror(rc));
            }
        }
        free(r.v);
        ks_tier_close(tier);
    }
    if (redis) {
        int n = 0;
        crc = ks_cache_redis_rm(redis, o->prefix, !o->all, &n);
        ks_cache_redis_close(redis);
        if (crc) return crc;
        removed += n;
    }
    if (o->all) printf("removed %d entries\n", removed);
    if (!o->all && removed == 0 && failed == 0) {
        fprintf(stderr, CMD " rm: no entry matches %s\n", o->prefix);
        return 1;
    }
    return failed ? 1 : 0;
}

/*
 * cmd_cache.c — `kvstash cache ls|stats|verify|gc|rm`: inspect and maintain
 * the persistent store's directories, and the entries of a redis tier
 * (--redis URL, cache_redis.c), without a model.
 *
 * Every subcommand works on the disk tier directory (--cache-dir; default as
 * in the server: $XDG_CACHE_HOME/kvstash or ~/.cache/kvstash) and, only when
 * --shm-dir names it, on an shm tier directory. The server's default shm
 * directory, /dev/shm/kvstash-<uid>, is shared by every server of the user
 * whatever their --cache-dir: a command that acted on it by default (gc, rm
 * --all) would reach into all of them. Every directory acted on must exist
 * and be a directory: else exit 2 with a message naming it (a mistyped path
 * must not look like an empty cache). Files of every model are listed (the
 * MODEL column tells them apart). Names that are not regular files are
 * skipped without being opened for a blocking read (kvfile.h). Safe to run
 * next to a server: files are only ever replaced atomically, and a server
 * that finds a file gone treats it as a miss.
 *
 * With --redis URL, the entries under --redis-prefix (default kvstash) in
 * that Redis are acted on too (tier "redis"); the directories are then acted
 * on only when --cache-dir or --shm-dir names them, so that a host with no
 * disk tier can inspect Redis alone. The password comes from the URL or
 * $KVSTASH_REDIS_PASSWORD, the TLS settings from --redis-tls-* (as serve's
 * --cache-redis-tls-*). A Redis that cannot be reached is exit 1 naming the
 * URL (redacted).
 *
 * Exit codes: 0 ok, 1 runtime error (verify: a bad file or entry; Redis
 * unreachable), 2 usage error (a missing directory included).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/kvfile.h"
#include "cache/kvparams.h"
#include "cache/redis_conn.h"
#include "cache/store.h"
#include "cache/store_cfg.h"
#include "cache/tier.h"
#include "cli/cache_redis.h"
#include "cli/cli.h"
#include "cli/cmd_cache.h"
#include "config/config.h"

#define CMD "kvstash cache"


static void usage(FILE *f) {
    fprintf(f,
            "usage: kvstash cache <command> [--cache-dir DIR] [--shm-dir DIR] [options]\n"
            "  ls     [KEYPREFIX]           list entries: key, tokens, bytes, tier, reason, age, hits, model,\n"
            "                               K/V cache types\n"
            "  stats                        totals per tier\n"
            "  verify                       check every file completely; exit 1 naming each bad one\n"
            "  gc     [--max-bytes N] [--config FILE]\n"
            "                               evict least recently hit entries until each tier holds at\n"
            "                               most N bytes (default: the budgets of FILE, serve's YAML,\n"
            "                               else shm 1G, disk 10G; K/M/G/T suffixes; at most 1024T),\n"
            "                               entries pinned by cache breakpoints kept within FILE's\n"
            "                               store.pin_share of it (default half); remove temp files of\n"
            "                               dead writers and quarantined files\n"
            "  rm     --all | KEYPREFIX     remove entries\n"
            "options:\n"
            "  --cache-dir DIR   the disk tier (default $XDG_CACHE_HOME/kvstash or ~/.cache/kvstash)\n"
            "  --shm-dir DIR     also act on this shm tier. Without it no shm directory is touched:\n"
            "                    the servers' default, /dev/shm/kvstash-<uid>, is shared by every\n"
            "                    server of the user whatever their --cache-dir, so name it to include it\n"
            "  --redis URL       also act on the entries of a redis tier (tier 'redis'): redis://,\n"
            "                    rediss:// (TLS), unix://; password also from $KVSTASH_REDIS_PASSWORD.\n"
            "                    With --redis, the disk tier is acted on only when --cache-dir names it.\n"
            "                    gc evicts from Redis only with --max-bytes (the servers' budget,\n"
            "                    store.tiers.redis.max_bytes, is not known here)\n"
            "  --redis-prefix P  the servers' store.tiers.redis.key_prefix (default kvstash)\n"
            "  --redis-tls-ca FILE, --redis-tls-ca-dir DIR, --redis-tls-cert FILE, --redis-tls-key FILE,\n"
            "  --redis-tls-server-name NAME, --redis-tls-insecure\n"
            "                    TLS settings for a rediss:// URL, as serve's --cache-redis-tls-*\n"
            "  --secret-file FILE  the servers' cache secret (also --config's store.secret_file or\n"
            "                    $KVSTASH_CACHE_SECRET): verify then also authenticates every entry;\n"
            "                    without it, verify checks checksums only and says so\n"
            "A directory given (or the default --cache-dir) that does not exist or is not a\n"
            "directory is an error (exit 2); a Redis that cannot be reached is exit 1.\n");
}

static const char *tier_str(int t) { return ks_tier_name((ks_tier_id)t); }

static const char *reason_str(int r) { return ks_reason_name((ks_reason)r); }

/* "12.3M" style sizes (binary units). */
void ks__cache_fmt_bytes(uint64_t b, char *out, size_t n) {
    const char *u = "BKMGT";
    double v = (double)b;
    int i = 0;
    while (v >= 1024.0 && i < 4) {
        v /= 1024.0;
        i++;
    }
    if (i == 0)
        snprintf(out, n, "%lluB", (unsigned long long)b);
    else
        snprintf(out, n, "%.1f%c", v, u[i]);
}

static void fmt_age(int64_t us, char *out, size_t n) {
    int64_t s = us / 1000000;
    if (s < 0) s = 0;
    if (s < 120)
        snprintf(out, n, "%llds", (long long)s);
    else if (s < 7200)
        snprintf(out, n, "%lldm", (long long)(s / 60));
    else if (s < 2 * 86400)
        snprintf(out, n, "%lldh", (long long)(s / 3600));
    else
        snprintf(out, n, "%lldd", (long long)(s / 86400));
}

static bool is_hex(const char *s) {
    if (!*s || strlen(s) > KS_KEY_HEX_LEN) return false;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') || (*s >= 'A' && *s <= 'F'))) return false;
    return true;
}

static bool key_matches(const ks_key *k, const char *prefix) {
    char hex[KS_KEY_HEX_LEN + 1];
    ks_key_to_hex(k, hex);
    for (size_t i = 0; prefix[i]; i++) {
        char c = prefix[i];
        if (c >= 'A' && c <= 'F') c = (char)(c - 'A' + 'a');
        if (hex[i] != c) return false;
    }
    return true;
}

/* The options that take a value; their index in parse. */
enum { O_CACHE_DIR, O_SHM_DIR, O_MAX_BYTES, O_REDIS, O_REDIS_PREFIX, O_TLS_CA, O_TLS_CA_DIR, O_TLS_CERT, O_TLS_KEY,
       O_TLS_NAME, O_CONFIG, O_SECRET, O__N };
static const char *const k_valued[O__N] = {"--cache-dir", "--shm-dir", "--max-bytes", "--redis", "--redis-prefix",
                                           "--redis-tls-ca", "--redis-tls-ca-dir", "--redis-tls-cert",
                                           "--redis-tls-key", "--redis-tls-server-name", "--config",
                                           "--secret-file"};

/* Copies val into dst (n bytes) for flag; 0 or 2 (message printed). */
static int copy_arg(char *dst, size_t n, const char *flag, const char *val) {
    if (!val[0] || strlen(val) >= n) {
        fprintf(stderr, CMD ": %s: %s value\n", flag, val[0] ? "too long a" : "an empty");
        return 2;
    }
    snprintf(dst, n, "%s", val);
    return 0;
}

/* Returns 0 or 2 (usage error, message printed). */
static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->max_bytes = -1;
    ks_store_default_dirs(o->dirs[KS_TIER_DISK], NULL);
    o->use[KS_TIER_DISK] = true;
    bool cache_dir_given = false;
    ks_store_cfg_defaults(&o->cfg);
    o->redis = o->cfg.redis; /* key_prefix kvstash, verify on */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    o->sub = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        int which = -1;
        for (int k = 0; k < O__N; k++) {
            size_t l = strlen(k_valued[k]);
            if (strcmp(a, k_valued[k]) == 0) {
                if (i + 1 >= argc) {
                    fprintf(stderr, CMD ": %s needs a value\n", a);
                    return 2;
                }
                which = k;
                val = argv[++i];
            } else if (strncmp(a, k_valued[k], l) == 0 && a[l] == '=') {
                which = k;
                val = a + l + 1;
            }
        }
        ks_redis_tls_cfg *tls = &o->redis.tls;
        char *dst = NULL;
        size_t dst_n = 0;
        int rc;
        switch (which) {
        case O_CACHE_DIR:
        case O_SHM_DIR: {
            if (!val[0] || strlen(val) >= KS_MAX_PATH) {
                fprintf(stderr, CMD ": %s: invalid directory\n", k_valued[which]);
                return 2;
            }
            int t = which == O_CACHE_DIR ? KS_TIER_DISK : KS_TIER_SHM;
            snprintf(o->dirs[t], KS_MAX_PATH, "%s", val);
            o->use[t] = true;
            if (t == KS_TIER_DISK) cache_dir_given = true;
            continue;
        }
        case O_MAX_BYTES:
            if (ks_cli_parse_size(CMD, "--max-bytes", val, &o->max_bytes)) return 2;
            /* A tier's budget: the range of store.tiers.<tier>.max_bytes. */
            if (o->max_bytes > KS_STORE_BYTES_MAX) {
                fprintf(stderr, CMD ": --max-bytes must be a size in [0, %lldT] like 500M or 2G, got '%s'\n",
                        (long long)(KS_STORE_BYTES_MAX >> 40), val);
                return 2;
            }
            continue;
        case O_CONFIG: {
            /* serve's YAML: the store's budgets and pin share, as the servers run with them */
            ks_config c;
            char err[512] = "";
            ks_config_defaults(&c);
            if (ks_config_load_file(&c, val, err, sizeof err)) {
                fprintf(stderr, CMD ": --config %s: %s\n", val, err);
                return 2;
            }
            o->cfg = c.store;
            if (c.store.secret_file[0]) snprintf(o->secret_file, sizeof o->secret_file, "%s", c.store.secret_file);
            continue;
        }
        case O_REDIS: o->use_redis = true; dst = o->redis.url; dst_n = sizeof o->redis.url; break;
        case O_REDIS_PREFIX: dst = o->redis.key_prefix; dst_n = sizeof o->redis.key_prefix; break;
        case O_TLS_CA: dst = tls->ca_file; dst_n = sizeof tls->ca_file; break;
        case O_TLS_CA_DIR: dst = tls->ca_dir; dst_n = sizeof tls->ca_dir; break;
        case O_TLS_CERT: dst = tls->cert_file; dst_n = sizeof tls->cert_file; break;
        case O_TLS_KEY: dst = tls->key_file; dst_n = sizeof tls->key_file; break;
        case O_TLS_NAME: dst = tls->server_name; dst_n = sizeof tls->server_name; break;
        case O_SECRET: dst = o->secret_file; dst_n = sizeof o->secret_file; break;
        default: break;
        }
        if (dst && (rc = copy_arg(dst, dst_n, k_valued[which], val)) != 0) return rc;
        if (which >= 0) continue;
        if (strcmp(a, "--all") == 0) {
            o->all = true;
        } else if (strcmp(a, "--redis-tls-insecure") == 0) {
            o->redis.tls.verify = false;
        } else if (a[0] == '-') {
            fprintf(stderr, CMD " %s: unknown option '%s'\n", o->sub, a);
            return 2;
        } else if (!o->prefix) {
            if (!is_hex(a)) {
                fprintf(stderr, CMD " %s: '%s' is not a key prefix (hex digits)\n", o->sub, a);
                return 2;
            }
            o->prefix = a;
        } else {
            fprintf(stderr, CMD " %s: unexpected argument '%s'\n", o->sub, a);
            return 2;
        }
    }
    if (!o->use_redis && (strcmp(o->redis.key_prefix, "kvstash") != 0 || ks_redis_tls_cfg_given(&o->redis.tls))) {
        fprintf(stderr, CMD " %s: --redis-prefix and --redis-tls-* need --redis URL\n", o->sub);
        return 2;
    }
    /* Redis alone unless a directory is named: a host with Redis only has no disk tier. */
    if (o->use_redis && !cache_dir_given) o->use[KS_TIER_DISK] = false;
    const char *pw = getenv("KVSTASH_REDIS_PASSWORD");
    if (o->use_redis && pw && strlen(pw) < sizeof o->redis.password)
        snprintf(o->redis.password, sizeof o->redis.password, "%s", pw);
    return 0;
}

/* Connects to the Redis of --redis (NULL *r without it). 0, 1 or 2 (message printed). */
int ks__cache_open_redis(const opts *o, ks_cache_redis **r) {
    *r = NULL;
    if (!o->use_redis) return 0;
    return ks_cache_redis_open(o->sub, &o->redis, r);
}

/* Checks that every directory acted on exists and is a directory. Returns 0,
 * 2 (missing or not a directory) or 1 (cannot be examined); message printed. */
int ks__cache_check_dirs(const opts *o) {
    for (int t = KS_TIER_DISK; t >= KS_TIER_SHM; t--) {
        struct stat sb;
        const char *flag = t == KS_TIER_DISK ? "--cache-dir" : "--shm-dir";
        if (!o->use[t]) continue;
        if (stat(o->dirs[t], &sb) != 0) {
            int e = errno;
            if (e == ENOENT || e == ENOTDIR) {
                fprintf(stderr, CMD " %s: %s %s: no such directory\n", o->sub, flag, o->dirs[t]);
                return 2;
            }
            fprintf(stderr, CMD " %s: %s %s: %s\n", o->sub, flag, o->dirs[t], strerror(e));
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            fprintf(stderr, CMD " %s: %s %s: not a directory\n", o->sub, flag, o->dirs[t]);
            return 2;
        }
    }
    return 0;
}

/* Opens a tier directory read-mostly; *t NULL when it is not acted on (or
 * vanished since ks__cache_check_dirs). Returns 0 or 1 (error printed). */
int ks__cache_open_tier(const opts *o, int tier, unsigned flags, ks_tier **t) {
    char err[512] = "";
    *t = NULL;
    if (!o->use[tier]) return 0;
    int rc = ks_tier_file_open((ks_tier_id)tier, o->dirs[tier], flags, NULL, t, err, sizeof err);
    if (rc == KS_ENOENT) return 0;
    if (rc != 0) {
        fprintf(stderr, CMD " %s: %s tier: %s\n", o->sub, tier_str(tier), err);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------- ls */
const char *ks__cache_kv_types(const char *dir, const uint8_t hash[32]) {
    /* A directory holds the states of a few params at most. */
    enum { MEMO = 16 };
    static struct {
        char dir[KS_MAX_PATH];
        uint8_t hash[32];
        char types[32];
    } memo[MEMO];
    static int n_memo, next;
    for (int i = 0; i < n_memo; i++)
        if (!memcmp(memo[i].hash, hash, 32) && !strcmp(memo[i].dir, dir)) return memo[i].types;
    int i = n_memo < MEMO ? n_memo++ : (next++ % MEMO);
    snprintf(memo[i].dir, sizeof memo[i].dir, "%s", dir);
    memcpy(memo[i].hash, hash, 32);
    char params[4096];
    if (ks_kvparams_lookup(dir, hash, params, sizeof params) != 0 ||
        !ks_kvparams_type_pair(params, strlen(params), memo[i].types, sizeof memo[i].types))
        snprintf(memo[i].types, sizeof memo[i].types, "?");
    return memo[i].types;
}


int ks__cache_collect(void *ud, const ks_tier_entry *e) {
    rows *r = ud;
    if (r->prefix && !key_matches(&e->key, r->prefix)) return 0;
    if (r->n == r->cap) {
        size_t ncap = r->cap ? r->cap * 2 : 64;
        row *nv = realloc(r->v, ncap * sizeof *nv);
        if (!nv) {
            r->oom = true;
            return 1;
        }
        r->v = nv;
        r->cap = ncap;
    }
    r->v[r->n].e = *e;
    r->v[r->n].tier = r->tier;
    r->n++;
    return 0;
}

static int row_cmp(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->e.last_hit_us != y->e.last_hit_us) return x->e.last_hit_us > y->e.last_hit_us ? -1 : 1;
    return memcmp(x->e.key.b, y->e.key.b, KS_KEY_LEN);
}

/* Collects the entries of both tiers (matching o->prefix). */
static int collect_all(const opts *o, rows *r, unsigned flags) {
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK; t++) {
        ks_tier *tier = NULL;
        if (ks__cache_open_tier(o, t, flags, &tier) != 0) return 1;
        if (!tier) continue;
        r->tier = t;
        r->prefix = o->prefix;
        ks_tier_list(tier, ks__cache_collect, r);
        ks_tier_close(tier);
        if (r->oom) {
            fprintf(stderr, CMD " %s: out of memory\n", o->sub);
            return 1;
        }
    }
    return 0;
}

static int cmd_ls(const opts *o) {
    rows r = {0};
    if (o->all) {
        fprintf(stderr, CMD " ls: --all is for rm\n");
        return 2;
    }
    int rc = ks__cache_check_dirs(o);
    if (rc) return rc;
    ks_cache_redis *redis = NULL;
    if ((rc = ks__cache_open_redis(o, &redis)) != 0) return rc;
    if (collect_all(o, &r, 0) != 0) {
        free(r.v);
        ks_cache_redis_close(redis);
        return 1;
    }
    if (redis) {
        r.tier = KS_TIER_REDIS;
        r.prefix = o->prefix;
        rc = ks_cache_redis_list(redis, o->prefix, ks__cache_collect, &r);
        ks_cache_redis_close(redis);
        if (rc == 0 && r.oom) rc = 1, fprintf(stderr, CMD " ls: out of memory\n");
        if (rc) {
            free(r.v);
            return rc;
        }
    }
    if (r.n) qsort(r.v, r.n, sizeof *r.v, row_cmp); /* r.v is NULL when empty: UB for qsort */
    int64_t now = ks_wall_us();
    printf("%-12s %8s %9s %-5s %-9s %6s %6s %6s %-8s %s\n", "KEY", "TOKENS", "BYTES", "TIER", "REASON", "AGE",
           "IDLE", "HITS", "MODEL", "KV");
    for (size_t i = 0; i < r.n; i++) {
        const ks_tier_entry *e = &r.v[i].e;
        bool remote = r.v[i].tier == KS_TIER_REDIS;
        char hex[KS_KEY_HEX_LEN + 1], fp[9], sz[16], age[16], idle[16], hits[24];
        ks_key_to_hex(&e->key, hex);
        ks_hex_encode(e->model_fp, 4, fp);
        ks__cache_fmt_bytes(e->bytes, sz, sizeof sz);
        fmt_age(now - e->created_us, age, sizeof age);
        /* Redis keeps every server's last use of an entry (its LRU), not a hit count. */
        if (e->hits || remote)
            fmt_age(now - e->last_hit_us, idle, sizeof idle);
        else
            snprintf(idle, sizeof idle, "-");
        if (remote)
            snprintf(hits, sizeof hits, "-");
        else
            snprintf(hits, sizeof hits, "%llu", (unsigned long long)e->hits);
        /* The K/V cache types from the name the store registered beside the
         * files (a Redis listing reads manifests only: "-"). */
        const char *kv = remote ? "-" : ks__cache_kv_types(o->dirs[r.v[i].tier], e->params_hash);
        printf("%.12s %8d %9s %-5s %-9s %6s %6s %6s %-8s %s\n", hex, e->n_tokens, sz, tier_str(r.v[i].tier),
               reason_str(e->reason), age, idle, hits, fp, kv);
    }
    if (r.n == 0) fprintf(stderr, o->prefix ? "no entry matches %s\n" : "the cache is empty\n", o->prefix);
    free(r.v);
    return 0;
}

/* ---------------------------------------------------------------- stats */
static void count_dir(const char *dir, int *temps, int *quarantined) {
    char q[PATH_MAX];
    *temps = *quarantined = 0;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (ks_kvfile_temp_parse(de->d_name, NULL)) (*temps)++;
        closedir(d);
    }
    if (snprintf(q, sizeof q, "%s/quarantine", dir) >= (int)sizeof q) return;
    if ((d = opendir(q)) != NULL) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (de->d_name[0] != '.') (*quarantined)++;
        closedir(d);
    }
}

/* The detail line of a tier's stats: tokens, hits and reasons of its entries. */
static void print_reasons(const rows *r, bool with_hits) {
    uint64_t by_reason[KS_REASON__N] = {0}, hits = 0, tokens = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (r->v[i].e.reason >= 0 && r->v[i].e.reason < KS_REASON__N) by_reason[r->v[i].e.reason]++;
        hits += r->v[i].e.hits;
        tokens += (uint64_t)r->v[i].e.n_tokens;
    }
    printf("%-5s %8s %10s  tokens %llu", "", "", "", (unsigned long long)tokens);
    if (with_hits) printf(", hits %llu", (unsigned long long)hits);
    printf("; cold %llu, continued %llu, finish %llu, evict %llu, shutdown %llu",
           (unsigned long long)by_reason[0], (unsigned long long)by_reason[1], (unsigned long long)by_reason[2],
           (unsigned long long)by_reason[3], (unsigned long long)by_reason[4]);
}

/* The redis line of stats: the accounting, and what a scan finds. */
static int stats_redis(const opts *o, uint64_t *tot_b, uint64_t *tot_e) {
    ks_cache_redis *redis = NULL;
    int rc = ks__cache_open_redis(o, &redis);
    if (rc || !redis) return rc;
    uint64_t e = 0, b = 0;
    rows r = {0};
    if ((rc = ks_cache_redis_usage(redis, &e, &b)) == 0) {
        r.tier = KS_TIER_REDIS;
        rc = ks_cache_redis_list(redis, NULL, ks__cache_collect, &r);
        if (rc == 0 && r.oom) rc = 1, fprintf(stderr, CMD " stats: out of memory\n");
    }
    if (rc == 0) {
        char sz[16];
        ks__cache_fmt_bytes(b, sz, sizeof sz);
        printf("%-5s %8llu %10s  %s prefix %s (budget: the servers' store.tiers.redis.max_bytes)\n", "redis",
               (unsigned long long)e, sz, ks_cache_redis_where(redis), ks_cache_redis_prefix(redis));
        print_reasons(&r, false);
        printf("; manifests %zu", r.n);
        if (r.n != e) printf(" (the accounting counts %llu: saves in flight, or left by a server that died)",
                             (unsigned long long)e);
        printf("\n");
        *tot_b += b;
        *tot_e += e;
    }
    free(r.v);
    ks_cache_redis_close(redis);
    return rc;
}

static int cmd_stats(const opts *o) {
    uint64_t tot_b = 0, tot_e = 0;
    int rc = ks__cache_check_dirs(o);
    if (rc) return rc;
    printf("%-5s %8s %10s  %s\n", "TIER", "ENTRIES", "BYTES", "DETAIL");
    for (int t = KS_TIER_SHM; t <= KS_TIER_DISK; t++) {
        ks_tier *tier = NULL;
        rows r = {0};
        if (!o->use[t]) {
            printf("%-5s %8s %10s  not included (give %s DIR)\n", tier_str(t), "-", "-",
                   t == KS_TIER_SHM ? "--shm-dir" : "--cache-dir");
            continue;
        }
        if (ks__cache_open_tier(o, t, 0, &tier) != 0) return 1;
        if (!tier) {
            printf("%-5s %8s %10s  %s (absent)\n", tier_str(t), "-", "-", o->dirs[t]);
            continue;
        }
        r.tier = t;
        ks_tier_list(tier, ks__cache_collect, &r);
        uint64_t b = 0, e = 0, skipped = atomic_load(&tier->n_skipped);
        ks_tier_usage(tier, &b, &e);
        ks_tier_close(tier);
        int temps, quar;
        count_dir(o->dirs[t], &temps, &quar);
        char sz[16];
        ks__cache_fmt_bytes(b, sz, sizeof sz);
        printf("%-5s %8llu %10s  %s\n", tier_str(t), (unsigned long long)e, sz, o->dirs[t]);
        print_reasons(&r, true);
        free(r.v);
        printf("; temp files %d, quarantined %d", temps, quar);
        if (skipped) printf("; skipped %llu (not regular files)", (unsigned long long)skipped);
        printf("\n");
        tot_b += b;
        tot_e += e;
    }
    if ((rc = stats_redis(o, &tot_b, &tot_e)) != 0) return rc;
    char sz[16];
    ks__cache_fmt_bytes(tot_b, sz, sizeof sz);
    printf("%-5s %8llu %10s\n", "total", (unsigned long long)tot_e, sz);
    return 0;
}

int ks_cmd_cache(int argc, char **argv) {
    opts o;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || (i == 1 && !strcmp(argv[i], "help"))) {
            usage(stdout);
            return 0;
        }
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    if ((!strcmp(o.sub, "stats") || !strcmp(o.sub, "verify")) && (o.prefix || o.all)) {
        fprintf(stderr, CMD " %s: takes no key prefix or --all\n", o.sub);
        return 2;
    }
    /* Warnings (a file moved to quarantine...) are worth seeing; chatter is not. */
    if (ks_log_get_level() < KS_LOG_WARN) ks_log_set_level(KS_LOG_WARN);
    /* A Redis that closes the connection fails a write, not the process (TLS writes with write(2)). */
    if (o.use_redis) signal(SIGPIPE, SIG_IGN);
    if (!strcmp(o.sub, "ls")) return cmd_ls(&o);
    if (!strcmp(o.sub, "stats")) return cmd_stats(&o);
    if (!strcmp(o.sub, "verify")) return ks__cache_verify(&o);
    if (!strcmp(o.sub, "gc")) return ks__cache_gc(&o);
    if (!strcmp(o.sub, "rm")) return ks__cache_rm(&o);
    fprintf(stderr, CMD ": unknown command '%s'\n", o.sub);
    usage(stderr);
    return 2;
}

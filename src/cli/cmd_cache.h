/*
 * cmd_cache.h — what the files of `kvstash cache` share: its options, the
 * entry rows of a listing, and the helpers that open what the options name
 * (cmd_cache.c); the verify, gc and rm commands (cache_maint.c).
 *
 * Thread model: the CLI's one thread.
 */
#ifndef KS_CMD_CACHE_H
#define KS_CMD_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "cache/redis_conn.h"
#include "cache/store_cfg.h"
#include "cache/tier.h"
#include "cli/cache_redis.h"

typedef struct opts {
    const char *sub;
    char dirs[KS_TIER__N][KS_MAX_PATH]; /* [SHM], [DISK] used */
    bool use[KS_TIER__N];               /* the tiers acted on: disk always, shm with --shm-dir */
    bool all;
    const char *prefix;
    int64_t max_bytes;                   /* -1: the configured budgets */
    ks_store_cfg cfg;                    /* the budgets and pin share: defaults, or --config's */
    bool use_redis;                      /* --redis */
    ks_redis_cfg redis;                  /* url, key_prefix, password, tls */
    char secret_file[KS_MAX_PATH];       /* --secret-file, else --config's store.secret_file; "": none */
} opts;

typedef struct row {
    ks_tier_entry e;
    int tier;
} row;

typedef struct rows {
    row *v;
    size_t n, cap;
    int tier;
    const char *prefix;
    bool oom;
} rows;

/* "12.3M" style sizes (binary units) into out. */
void ks__cache_fmt_bytes(uint64_t b, char *out, size_t n);
/* The K/V cache types ("q8_0/q8_0") of the entries of kv-params hash in
 * dir, from the name its store registered there (cache/kvparams.h); "?"
 * when none is. Remembers the last few it read. */
const char *ks__cache_kv_types(const char *dir, const uint8_t hash[32]);
/* Connects to the Redis of --redis (NULL *r without it). 0, 1 or 2 (message printed). */
int ks__cache_open_redis(const opts *o, ks_cache_redis **r);
/* Every directory acted on exists and is a directory: 0, 2 (missing or not a
 * directory) or 1 (cannot be examined); message printed. */
int ks__cache_check_dirs(const opts *o);
/* Opens the file tier of o->dirs[tier] with flags (NULL *t when it is not acted on). 0 or 1. */
int ks__cache_open_tier(const opts *o, int tier, unsigned flags, ks_tier **t);
/* ks_tier_list's callback: appends the entries matching r->prefix to r. */
int ks__cache_collect(void *ud, const ks_tier_entry *e);

/* The commands: exit codes 0, 1 (runtime error, a bad file) or 2 (usage). */
int ks__cache_verify(const opts *o);
int ks__cache_gc(const opts *o);
int ks__cache_rm(const opts *o);

#endif

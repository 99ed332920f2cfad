/* test_store.c — the persistent tiered store (src/cache/store.c, tier_*.c):
 * tiers by reason, longest-prefix lookup, LRU budgets, restarts, two stores on
 * one directory, corrupt / version-bumped / foreign files, the save queue,
 * pins (protection, share of the budget, expiry, files, other processes),
 * names that are not regular files. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/kvfile.h"
#include "cache/store.h"
#include "cache/store_cfg.h"

#define NTOK 64

typedef struct fx {
    char root[64];
    char disk[128], shm[128];
    int32_t toks[NTOK];
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    /* The shm tier on the real tmpfs when there is one. */
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(f->root, sizeof f->root, "%s/ks-store-XXXXXX", base);
    if (!mkdtemp(f->root)) return -1;
    snprintf(f->disk, sizeof f->disk, "%s/disk", f->root);
    snprintf(f->shm, sizeof f->shm, "%s/shm", f->root);
    for (int i = 0; i < NTOK; i++) f->toks[i] = 1000 + i * 3;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->root);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static ks_store_params params_for(fx *f, uint8_t model, uint32_t state_version) {
    ks_store_params p = ks_store_params_default();
    snprintf(p.cfg.cache_dir, sizeof p.cfg.cache_dir, "%s", f->disk);
    snprintf(p.cfg.shm_dir, sizeof p.cfg.shm_dir, "%s", f->shm);
    p.cfg.stride = 4;
    p.cfg.min_tokens = 4;
    p.cfg.shutdown_timeout_ms = 30000;
    for (int t = 0; t < KS_TIER__N; t++) p.cfg.tier_max_bytes[t] = 1 << 20;
    p.cfg.reason_tier[KS_REASON_COLD] = KS_TIER_DISK;
    p.cfg.reason_tier[KS_REASON_CONTINUED] = KS_TIER_SHM;
    p.cfg.reason_tier[KS_REASON_FINISH] = KS_TIER_RAM;
    p.cfg.reason_tier[KS_REASON_EVICT] = KS_TIER_DISK;
    p.cfg.reason_tier[KS_REASON_SHUTDOWN] = KS_TIER_NONE;
    memset(p.model_fp, model, 32);
    p.kv_params = "type_k=f16;type_v=f16;n_ctx_seq=512;fa=0";
    p.kv_params_len = strlen(p.kv_params);
    p.state_version = state_version;
    return p;
}

static ks_store *open_store(const ks_store_params *p) {
    ks_store *s = NULL;
    char err[256] = "";
    int rc = ks_store_open(p, &s, err, sizeof err);
    if (rc != 0) fail_msg("ks_store_open: %s (%s)", ks_errname(rc), err);
    assert_int_equal(ks_store_flush(s, 0), 0); /* the GC at open is done */
    return s;
}

static uint8_t *mkpayload(size_t len, uint32_t seed) {
    uint8_t *p = malloc(len ? len : 1);
    assert_non_null(p);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
    return p;
}

static void expect_payload(const ks_store_hit *h, size_t len, uint32_t seed) {
    assert_int_equal(h->payload_len, len);
    uint8_t *want = mkpayload(len, seed);
    assert_memory_equal(h->payload, want, len);
    free(want);
}

static void save_sync(ks_store *s, ks_reason r, const int32_t *t, int n, size_t len, uint32_t seed) {
    int rc = ks_store_save(s, r, t, n, mkpayload(len, seed), len, true);
    if (rc != 0) fail_msg("sync save of %d tokens: %s", n, ks_errname(rc));
}

static int expect_hit(ks_store *s, const int32_t *t, int n, int max_len, int want_n, ks_tier_id want_tier) {
    ks_store_hit h;
    int rc = ks_store_lookup(s, t, n, max_len, &h);
    if (want_n == 0) {
        if (rc != KS_ENOENT) fail_msg("lookup(n=%d, max=%d): expected a miss, got %s with %d tokens", n,
                                      max_len, ks_errname(rc), h.n_tokens);
        assert_int_equal(h.tier, KS_TIER_NONE);
        assert_null(h.payload);
        return 0;
    }
    if (rc != 0) fail_msg("lookup(n=%d, max=%d): %s, expected %d tokens", n, max_len, ks_errname(rc), want_n);
    if (h.n_tokens != want_n) fail_msg("lookup(n=%d, max=%d): %d tokens, expected %d", n, max_len, h.n_tokens, want_n);
    if ((int)want_tier >= 0 && h.tier != want_tier)
        fail_msg("lookup: tier %d, expected %d", h.tier, want_tier);
    int tier = h.tier;
    ks_store_hit_free(&h);
    assert_null(h.payload);
    return tier;
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    size_t sl = strlen(suffix);
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] != '.' && l >= sl && strcmp(de->d_name + l - sl, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

static void file_of(fx *f, const char *dir, const ks_store_params *p, int n, char *out) {
    ks_key k;
    assert_int_equal(ks_key_compute(p->model_fp, p->kv_params, p->kv_params_len, f->toks, n, &k), 0);
    assert_int_equal(ks_kvfile_path(dir, &k, out, PATH_MAX), 0);
}

/* ------------------------------------------------------------------ tests */
/* The names of the reasons and tiers (store_cfg.h), as the YAML and the logs spell them. */
static void test_reason_and_tier_names(void **state) {
    (void)state;
    assert_string_equal(ks_reason_name(KS_REASON_COLD), "cold");
    assert_string_equal(ks_reason_name(KS_REASON_SHUTDOWN), "shutdown");
    assert_string_equal(ks_reason_name(KS_REASON_PIN), "pin");
    assert_int_equal(ks_reason_parse("pin"), KS_REASON_PIN);
    assert_string_equal(ks_reason_name(KS_REASON__N), "?");
    assert_int_equal(ks_reason_parse("continued"), KS_REASON_CONTINUED);
    assert_int_equal(ks_reason_parse("evict"), KS_REASON_EVICT);
    assert_int_equal(ks_reason_parse("warm"), -1);
    assert_int_equal(ks_reason_parse(NULL), -1);
    assert_string_equal(ks_tier_name(KS_TIER_RAM), "ram");
    assert_string_equal(ks_tier_name(KS_TIER_DISK), "disk");
    assert_string_equal(ks_tier_name(KS_TIER_NONE), "none");
    assert_int_equal(ks_tier_parse("shm"), KS_TIER_SHM);
    assert_int_equal(ks_tier_parse("none"), KS_TIER_NONE);
    assert_int_equal(ks_tier_parse("tape"), -2);
    assert_int_equal(ks_tier_parse(NULL), -2);
}

static void test_tiers_by_reason(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    int32_t a[8], b[8], c[8];
    for (int i = 0; i < 8; i++) {
        a[i] = 10 + i;
        b[i] = 20 + i;
        c[i] = 30 + i;
    }
    save_sync(s, KS_REASON_COLD, a, 8, 5000, 1);
    save_sync(s, KS_REASON_CONTINUED, b, 8, 6000, 2);
    save_sync(s, KS_REASON_FINISH, c, 8, 7000, 3);
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, a, 8, -1, &h), 0);
    assert_int_equal(h.tier, KS_TIER_DISK);
    assert_int_equal(h.reason, KS_REASON_COLD);
    expect_payload(&h, 5000, 1);
    ks_store_hit_free(&h);
    assert_int_equal(ks_store_lookup(s, b, 8, -1, &h), 0);
    assert_int_equal(h.tier, KS_TIER_SHM);
    assert_int_equal(h.reason, KS_REASON_CONTINUED);
    expect_payload(&h, 6000, 2);
    ks_store_hit_free(&h);
    assert_int_equal(ks_store_lookup(s, c, 8, -1, &h), 0);
    assert_int_equal(h.tier, KS_TIER_RAM);
    assert_int_equal(h.reason, KS_REASON_FINISH);
    expect_payload(&h, 7000, 3);
    /* The ram payload is shared, not copied: a second hit sees the same bytes. */
    ks_store_hit h2;
    assert_int_equal(ks_store_lookup(s, c, 8, -1, &h2), 0);
    assert_ptr_equal(h.payload, h2.payload);
    ks_store_hit_free(&h);
    ks_store_hit_free(&h2);
    assert_int_equal(count_files(f->disk, ".kvs"), 1);
    assert_int_equal(count_files(f->shm, ".kvs"), 1);

    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.saves[KS_REASON_COLD], 1);
    assert_int_equal(st.saves[KS_REASON_CONTINUED], 1);
    assert_int_equal(st.saves[KS_REASON_FINISH], 1);
    assert_int_equal(st.saved_bytes, 18000);
    assert_int_equal(st.lookups, 4);
    assert_int_equal(st.hits, 4);
    assert_int_equal(st.tier_hits[KS_TIER_RAM], 2);
    assert_int_equal(st.tier_hits[KS_TIER_SHM], 1);
    assert_int_equal(st.tier_hits[KS_TIER_DISK], 1);
    assert_int_equal(st.tier_misses[KS_TIER_DISK], 3);
    assert_int_equal(st.tier_entries[KS_TIER_RAM], 1);
    assert_int_equal(st.tier_entries[KS_TIER_SHM], 1);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 1);
    assert_true(st.tier_bytes[KS_TIER_DISK] > 5000);
    assert_int_equal(st.corrupt_files, 0);
    assert_int_equal(st.queued, 0);
    ks_store_close(s);
}

static void test_longest_prefix(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    /* stride 4: 8 and 16 are stride-aligned, 13 is not (a `finish` length) */
    save_sync(s, KS_REASON_COLD, f->toks, 8, 100, 8);
    save_sync(s, KS_REASON_FINISH, f->toks, 16, 100, 16); /* ram */
    save_sync(s, KS_REASON_CONTINUED, f->toks, 13, 100, 13); /* shm */
    expect_hit(s, f->toks, 20, -1, 16, KS_TIER_RAM);
    expect_hit(s, f->toks, 20, 16, 16, KS_TIER_RAM);
    expect_hit(s, f->toks, 20, 15, 13, KS_TIER_SHM);
    expect_hit(s, f->toks, 13, -1, 13, KS_TIER_SHM);
    expect_hit(s, f->toks, 20, 12, 8, KS_TIER_DISK);
    expect_hit(s, f->toks, 20, 7, 0, KS_TIER_NONE);
    expect_hit(s, f->toks, 20, 0, 0, KS_TIER_NONE);
    expect_hit(s, f->toks, 0, -1, 0, KS_TIER_NONE);
    /* a prompt that diverges after position 14 / 10 / 3 */
    int32_t q[20];
    memcpy(q, f->toks, sizeof q);
    q[14] = -5;
    expect_hit(s, q, 20, -1, 13, KS_TIER_SHM);
    q[10] = -5;
    expect_hit(s, q, 20, -1, 8, KS_TIER_DISK);
    q[3] = -5;
    expect_hit(s, q, 20, -1, 0, KS_TIER_NONE);
    /* the payload is the one of the length found */
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, f->toks, 15, -1, &h), 0);
    expect_payload(&h, 100, 13);
    ks_store_hit_free(&h);
    ks_store_hit_free(&h); /* a zeroed hit is a no-op */
    /* lookup_range: prefixes shorter than min_len are not even read */
    uint64_t hits_before;
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    hits_before = st.hits;
    assert_int_equal(ks_store_lookup_range(s, f->toks, 20, 14, -1, &h), 0);
    assert_int_equal(h.n_tokens, 16);
    ks_store_hit_free(&h);
    assert_int_equal(ks_store_lookup_range(s, f->toks, 20, 9, 15, &h), 0);
    assert_int_equal(h.n_tokens, 13);
    ks_store_hit_free(&h);
    assert_int_equal(ks_store_lookup_range(s, f->toks, 20, 17, -1, &h), KS_ENOENT);
    assert_int_equal(ks_store_lookup_range(s, f->toks, 20, 14, 15, &h), KS_ENOENT);
    ks_store_stats(s, &st);
    assert_int_equal((int)(st.hits - hits_before), 2);
    ks_store_close(s);
}

static void test_save_filters(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    p.cfg.min_tokens = 10;
    p.cfg.tier_max_bytes[KS_TIER_SHM] = 0; /* continued -> a disabled tier */
    ks_store *s = open_store(&p);
    struct ks_store_stats st;
    assert_int_equal(ks_store_save(s, KS_REASON_COLD, f->toks, 9, mkpayload(10, 1), 10, true), 0);
    assert_int_equal(ks_store_save(s, KS_REASON_SHUTDOWN, f->toks, 12, mkpayload(10, 1), 10, true), 0);
    assert_int_equal(ks_store_save(s, KS_REASON_CONTINUED, f->toks, 12, mkpayload(10, 1), 10, true), 0);
    save_sync(s, KS_REASON_COLD, f->toks, 12, 10, 1);
    /* the same state again: already stored, whatever the reason */
    assert_int_equal(ks_store_save(s, KS_REASON_EVICT, f->toks, 12, mkpayload(10, 2), 10, true), 0);
    assert_int_equal(ks_store_save(s, KS_REASON_COLD, f->toks, 12, mkpayload(10, 2), 10, false), 0);
    assert_int_equal(ks_store_flush(s, 0), 0);
    ks_store_stats(s, &st);
    assert_int_equal(st.small_saves, 1);
    assert_int_equal(st.dropped_saves, 2);
    assert_int_equal(st.saves[KS_REASON_COLD], 1);
    assert_int_equal(st.saves[KS_REASON_EVICT], 0);
    assert_int_equal(st.dedup_saves, 2);
    assert_int_equal(count_files(f->disk, ".kvs"), 1);
    /* the first payload stayed */
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, f->toks, 12, -1, &h), 0);
    expect_payload(&h, 10, 1);
    ks_store_hit_free(&h);
    /* bad arguments (the payload is freed: ASan would tell) */
    assert_int_equal(ks_store_save(s, KS_REASON__N, f->toks, 12, mkpayload(10, 1), 10, true), KS_EINVAL);
    assert_int_equal(ks_store_save(s, KS_REASON_COLD, NULL, 12, mkpayload(10, 1), 10, true), KS_EINVAL);
    assert_int_equal(ks_store_save(NULL, KS_REASON_COLD, f->toks, 12, mkpayload(10, 1), 10, true), KS_EINVAL);
    assert_int_equal(ks_store_lookup(s, NULL, 5, -1, &h), KS_EINVAL);
    assert_int_equal(ks_store_lookup(s, f->toks, -1, -1, &h), KS_EINVAL);
    assert_int_equal(ks_store_lookup(s, f->toks, 5, -1, NULL), KS_EINVAL);
    ks_store_close(s);
    ks_store_close(NULL);
}

/* Each tier keeps under its budget, evicting the least recently hit. */
static void test_lru_budget_per_tier(void **state) {
    fx *f = *state;
    for (int tier = 0; tier < KS_TIER__LOCAL; tier++) {
        ks_store_params p = params_for(f, 1, 1);
        p.cfg.reason_tier[KS_REASON_COLD] = tier;
        /* room for two entries of 1000 payload bytes + 8 tokens, not three */
        uint64_t budget = 2 * (KS_KVFILE_HEADER_LEN + 32 + 1000 + KS_KVFILE_TAIL_LEN) + 100;
        p.cfg.tier_max_bytes[tier] = (int64_t)budget;
        ks_store *s = open_store(&p);
        int32_t a[8], b[8], c[8], d[8];
        for (int i = 0; i < 8; i++) {
            a[i] = 100 * tier + i;
            b[i] = 100 * tier + 10 + i;
            c[i] = 100 * tier + 20 + i;
            d[i] = 100 * tier + 30 + i;
        }
        struct ks_store_stats st;
        save_sync(s, KS_REASON_COLD, a, 8, 1000, 1);
        save_sync(s, KS_REASON_COLD, b, 8, 1000, 2);
        ks_store_stats(s, &st);
        assert_int_equal(st.tier_entries[tier], 2);
        assert_true(st.tier_bytes[tier] <= budget);
        expect_hit(s, a, 8, -1, 8, (ks_tier_id)tier); /* a is now more recent than b */
        save_sync(s, KS_REASON_COLD, c, 8, 1000, 3);
        ks_store_stats(s, &st);
        assert_int_equal(st.tier_entries[tier], 2);
        assert_true(st.tier_bytes[tier] <= budget);
        assert_int_equal(st.tier_evictions[tier], 1);
        expect_hit(s, b, 8, -1, 0, KS_TIER_NONE);
        expect_hit(s, a, 8, -1, 8, (ks_tier_id)tier);
        expect_hit(s, c, 8, -1, 8, (ks_tier_id)tier);
        /* now c is the least recent: d pushes it out */
        expect_hit(s, a, 8, -1, 8, (ks_tier_id)tier);
        save_sync(s, KS_REASON_COLD, d, 8, 1000, 4);
        expect_hit(s, c, 8, -1, 0, KS_TIER_NONE);
        expect_hit(s, a, 8, -1, 8, (ks_tier_id)tier);
        expect_hit(s, d, 8, -1, 8, (ks_tier_id)tier);
        /* a state bigger than the whole budget is not saved */
        assert_int_equal(ks_store_save(s, KS_REASON_COLD, a, 7, mkpayload(budget, 9), budget, true), KS_ENOSPC);
        ks_store_stats(s, &st);
        assert_true(st.tier_bytes[tier] <= budget);
        assert_int_equal(st.tier_entries[tier], 2);
        if (tier != KS_TIER_RAM)
            assert_int_equal(count_files(tier == KS_TIER_SHM ? f->shm : f->disk, ".kvs"), 2);
        ks_store_close(s);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", f->disk, f->shm);
        assert_int_equal(system(cmd), 0);
    }
}

static void test_restart(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 3000, 1);       /* disk */
    save_sync(s, KS_REASON_CONTINUED, f->toks, 12, 3000, 2); /* shm */
    save_sync(s, KS_REASON_FINISH, f->toks, 16, 3000, 3);    /* ram */
    expect_hit(s, f->toks, 64, -1, 16, KS_TIER_RAM);
    expect_hit(s, f->toks, 64, 12, 12, KS_TIER_SHM);
    expect_hit(s, f->toks, 64, 12, 12, KS_TIER_SHM);
    ks_store_close(s); /* persists the hit counts */

    char path[PATH_MAX];
    ks_kvfile_meta m;
    file_of(f, f->shm, &p, 12, path);
    assert_int_equal(ks_kvfile_read_meta(path, &m), 0);
    assert_int_equal(m.hits, 2);
    assert_true(m.last_hit_us > m.created_us);

    s = open_store(&p);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_entries[KS_TIER_RAM], 0);
    assert_int_equal(st.tier_entries[KS_TIER_SHM], 1);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 1);
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, f->toks, 64, -1, &h), 0);
    assert_int_equal(h.n_tokens, 12);
    assert_int_equal(h.tier, KS_TIER_SHM);
    assert_int_equal(h.reason, KS_REASON_CONTINUED);
    expect_payload(&h, 3000, 2);
    ks_store_hit_free(&h);
    expect_hit(s, f->toks, 11, -1, 8, KS_TIER_DISK);
    ks_store_close(s);
}

/* A save declined because the store holds that state already counts as a
 * use of it (not a hit): warm start (ks_store_recent, newest first) then
 * takes the conversation's latest state, not an older, shorter one saved
 * since. Before, the 8-token cold save below looked newer than the 16-token
 * state the conversation was at again, and came first. */
static void test_declined_save_is_a_use(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    save_sync(s, KS_REASON_CONTINUED, f->toks, 16, 3000, 1); /* shm */
    usleep(2000);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 3000, 2);       /* disk, newer */
    usleep(2000);
    /* the conversation is at 16 tokens again: held, so not saved */
    assert_false(ks_store_wants(s, KS_REASON_CONTINUED, f->toks, 16));
    ks_store_state st[2];
    int n = 0;
    assert_int_equal(ks_store_recent(s, 2, 4, st, &n), 0);
    assert_true(n >= 1);
    assert_int_equal(st[0].n_tokens, 16); /* the 8-token state is its prefix: skipped */
    assert_int_equal(n, 1);
    for (int i = 0; i < n; i++) ks_store_state_free(&st[i]);
    ks_store_close(s); /* persists the use */

    char path[PATH_MAX];
    ks_kvfile_meta m;
    file_of(f, f->shm, &p, 16, path);
    assert_int_equal(ks_kvfile_read_meta(path, &m), 0);
    assert_int_equal(m.hits, 0); /* a use, not a hit */
    assert_true(m.last_hit_us > m.created_us);
    s = open_store(&p); /* a new process: the same order */
    n = 0;
    assert_int_equal(ks_store_recent(s, 2, 4, st, &n), 0);
    assert_true(n >= 1);
    assert_int_equal(st[0].n_tokens, 16);
    for (int i = 0; i < n; i++) ks_store_state_free(&st[i]);
    ks_store_close(s);
}

/* A file tier keeps one read buffer between lookups: the next hit reads
 * into it (pages already mapped), and every hit still carries its own data. */
static void test_file_reads_reuse_a_buffer(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 3000, 1);  /* disk */
    save_sync(s, KS_REASON_COLD, f->toks, 12, 2000, 2); /* disk, smaller */
    ks_store_hit a, b, c;
    assert_int_equal(ks_store_lookup(s, f->toks, 9, -1, &a), 0);
    assert_int_equal(a.tier, KS_TIER_DISK);
    expect_payload(&a, 3000, 1);
    const uint8_t *first = a.payload;
    /* while a holds the buffer, another read gets a buffer of its own */
    assert_int_equal(ks_store_lookup(s, f->toks, 13, -1, &b), 0);
    assert_int_equal(b.n_tokens, 12);
    expect_payload(&b, 2000, 2);
    assert_ptr_not_equal(b.payload, first);
    ks_store_hit_free(&b);
    ks_store_hit_free(&a); /* the larger buffer is the one kept */
    assert_int_equal(ks_store_lookup(s, f->toks, 13, -1, &c), 0);
    assert_ptr_equal(c.payload, first);
    expect_payload(&c, 2000, 2);
    ks_store_hit_free(&c);
    ks_store_close(s);
}

/* Warm start: after ks_store_prewarm (the file tier's read buffer made up
 * front, pages faulted in) reads still carry their own entry's data, the
 * buffer is reused, and a hit larger than it gets a buffer of its own. (What
 * it saves — page faults on a new process's first restore — is measured in
 * docs/BENCHMARKS.md, not here.) */
static void test_prewarm_keeps_reads_correct(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 3000, 1);  /* disk */
    save_sync(s, KS_REASON_COLD, f->toks, 12, 9000, 2); /* disk, larger than the buffer */
    ks_store_close(s);
    s = open_store(&p); /* a new process: nothing read yet */
    ks_store_prewarm(s, 4096);
    ks_store_hit a, b;
    assert_int_equal(ks_store_lookup(s, f->toks, 9, -1, &a), 0);
    expect_payload(&a, 3000, 1);
    const uint8_t *warm = a.payload;
    ks_store_hit_free(&a);
    ks_store_prewarm(s, 4096); /* the tier keeps it: a no-op */
    assert_int_equal(ks_store_lookup(s, f->toks, 9, -1, &a), 0);
    assert_ptr_equal(a.payload, warm);
    assert_int_equal(ks_store_lookup(s, f->toks, 13, -1, &b), 0);
    expect_payload(&b, 9000, 2);
    assert_ptr_not_equal(b.payload, warm);
    ks_store_hit_free(&b);
    ks_store_hit_free(&a);
    ks_store_prewarm(NULL, 4096); /* no store: no-op */
    ks_store_close(s);
}

static void test_two_stores_one_dir(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *a = open_store(&p);
    ks_store *b = open_store(&p);
    save_sync(a, KS_REASON_COLD, f->toks, 20, 2000, 1);
    expect_hit(b, f->toks, 64, -1, 20, KS_TIER_DISK);
    save_sync(b, KS_REASON_CONTINUED, f->toks, 28, 2000, 2);
    expect_hit(a, f->toks, 64, -1, 28, KS_TIER_SHM);
    /* The same state from both: one file, the second is a dedup. */
    save_sync(a, KS_REASON_COLD, f->toks, 36, 2000, 3);
    assert_int_equal(ks_store_save(b, KS_REASON_COLD, f->toks, 36, mkpayload(2000, 4), 2000, true), 0);
    struct ks_store_stats st;
    ks_store_stats(b, &st);
    assert_int_equal(st.dedup_saves, 1);
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(b, f->toks, 64, -1, &h), 0);
    assert_int_equal(h.n_tokens, 36);
    expect_payload(&h, 2000, 3);
    ks_store_hit_free(&h);
    /* Removed under a's feet by b's eviction: a sees a miss, not an error. */
    ks_store_params small = p;
    small.cfg.tier_max_bytes[KS_TIER_DISK] = 1;
    ks_store_close(b);
    b = open_store(&small); /* its GC at open evicts every disk entry */
    assert_int_equal(count_files(f->disk, ".kvs"), 0);
    expect_hit(a, f->toks, 64, 27, 0, KS_TIER_NONE);
    ks_store_stats(a, &st);
    assert_int_equal(st.corrupt_files, 0);
    ks_store_close(b);
    ks_store_close(a);
}

static void test_corrupt_file_is_a_miss(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 4000, 1);
    save_sync(s, KS_REASON_COLD, f->toks, 12, 4000, 2);
    ks_store_close(s);
    /* flip a payload byte of the 12-token file; truncate the 8-token one */
    char p12[PATH_MAX], p8[PATH_MAX];
    file_of(f, f->disk, &p, 12, p12);
    file_of(f, f->disk, &p, 8, p8);
    int fd = open(p12, O_RDWR);
    assert_true(fd >= 0);
    uint8_t byte;
    assert_int_equal(pread(fd, &byte, 1, 2000), 1);
    byte ^= 0x40;
    assert_int_equal(pwrite(fd, &byte, 1, 2000), 1);
    close(fd);
    assert_int_equal(truncate(p8, 3000), 0);

    s = open_store(&p);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.corrupt_files, 1); /* the truncated one, at open */
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 1);
    expect_hit(s, f->toks, 64, -1, 0, KS_TIER_NONE);
    expect_hit(s, f->toks, 64, -1, 0, KS_TIER_NONE);
    assert_int_equal(ks_store_flush(s, 0), 0);
    ks_store_stats(s, &st);
    assert_int_equal(st.corrupt_files, 2);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 0);
    assert_int_equal(count_files(f->disk, ".kvs"), 0);
    char q[PATH_MAX];
    snprintf(q, sizeof q, "%s/quarantine", f->disk);
    assert_int_equal(count_files(q, ""), 2);
    /* the same states can be saved again and are served */
    save_sync(s, KS_REASON_COLD, f->toks, 12, 4000, 5);
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, f->toks, 64, -1, &h), 0);
    assert_int_equal(h.n_tokens, 12);
    expect_payload(&h, 4000, 5);
    ks_store_hit_free(&h);
    ks_store_close(s);
}

static void test_state_version_bump(void **state) {
    fx *f = *state;
    ks_store_params p1 = params_for(f, 1, 1), p2 = params_for(f, 1, 2);
    ks_store *s = open_store(&p1);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 1000, 1);
    ks_store_close(s);
    s = open_store(&p2);
    expect_hit(s, f->toks, 64, -1, 0, KS_TIER_NONE);
    assert_int_equal(ks_store_flush(s, 0), 0);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.corrupt_files, 1);
    assert_int_equal(count_files(f->disk, ".kvs"), 0);
    /* the new llama writes its own state under the same key */
    save_sync(s, KS_REASON_COLD, f->toks, 8, 1000, 2);
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, f->toks, 64, -1, &h), 0);
    expect_payload(&h, 1000, 2);
    ks_store_hit_free(&h);
    ks_store_close(s);
    /* and the old one cannot use it */
    s = open_store(&p1);
    expect_hit(s, f->toks, 64, -1, 0, KS_TIER_NONE);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 1000, 4); /* a v1 file again */
    ks_store_close(s);
    /* A save that comes before any lookup replaces the stale file too. */
    s = open_store(&p2);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 1000, 3);
    ks_store_stats(s, &st);
    assert_int_equal(st.saves[KS_REASON_COLD], 1);
    assert_int_equal(st.dedup_saves, 0);
    assert_int_equal(st.corrupt_files, 1);
    assert_int_equal(count_files(f->disk, ".kvs"), 1);
    assert_int_equal(ks_store_lookup(s, f->toks, 64, -1, &h), 0);
    expect_payload(&h, 1000, 3);
    ks_store_hit_free(&h);
    ks_store_close(s);
}

static void test_other_model_is_left_alone(void **state) {
    fx *f = *state;
    ks_store_params pa = params_for(f, 1, 1), pb = params_for(f, 2, 1);
    ks_store *a = open_store(&pa);
    save_sync(a, KS_REASON_COLD, f->toks, 8, 1000, 1);
    ks_store *b = open_store(&pb);
    expect_hit(b, f->toks, 64, -1, 0, KS_TIER_NONE);
    struct ks_store_stats st;
    ks_store_stats(b, &st);
    assert_int_equal(st.corrupt_files, 0);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 1); /* counted in the directory's budget */
    /* other kv params: also another cache */
    ks_store_params pc = params_for(f, 1, 1);
    pc.kv_params = "type_k=q8_0";
    pc.kv_params_len = strlen(pc.kv_params);
    ks_store *c = open_store(&pc);
    expect_hit(c, f->toks, 64, -1, 0, KS_TIER_NONE);
    save_sync(c, KS_REASON_COLD, f->toks, 8, 1000, 3);
    expect_hit(c, f->toks, 64, -1, 8, KS_TIER_DISK);
    ks_store_close(c);
    ks_store_close(b);
    assert_int_equal(count_files(f->disk, ".kvs"), 2);
    expect_hit(a, f->toks, 64, -1, 8, KS_TIER_DISK);
    ks_store_close(a);
}

static void test_async_queue(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    p.queue_max_bytes = 100; /* any async save of more is skipped */
    ks_store *s = open_store(&p);
    assert_int_equal(ks_store_save(s, KS_REASON_COLD, f->toks, 8, mkpayload(80, 1), 80, false), 0);
    assert_int_equal(ks_store_flush(s, 0), 0);
    expect_hit(s, f->toks, 64, -1, 8, KS_TIER_DISK);
    assert_int_equal(ks_store_save(s, KS_REASON_COLD, f->toks, 12, mkpayload(1000, 2), 1000, false), KS_EFULL);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.skipped_saves, 1);
    expect_hit(s, f->toks, 64, -1, 8, KS_TIER_DISK);
    /* sync saves are not bounded by the queue */
    save_sync(s, KS_REASON_EVICT, f->toks, 12, 1000, 2);
    expect_hit(s, f->toks, 64, -1, 12, KS_TIER_DISK);
    /* many small async saves, then one flush: all written, in order */
    ks_store_params p2 = params_for(f, 1, 1);
    ks_store_close(s);
    s = open_store(&p2);
    for (int n = 16; n <= 64; n += 4) {
        int rc = ks_store_save(s, KS_REASON_CONTINUED, f->toks, n, mkpayload(64, (uint32_t)n), 64, false);
        assert_true(rc == 0 || rc == KS_EFULL);
    }
    assert_int_equal(ks_store_flush(s, 0), 0);
    ks_store_stats(s, &st);
    assert_int_equal(st.saves[KS_REASON_CONTINUED] + st.skipped_saves, 13);
    assert_int_equal(st.queued, 0);
    assert_true(st.saves[KS_REASON_CONTINUED] >= 1);
    ks_store_close(s);
}

static void test_gc_enforces_shrunk_budget(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    for (int n = 8; n <= 20; n += 4) save_sync(s, KS_REASON_COLD, f->toks, n, 1000, (uint32_t)n);
    expect_hit(s, f->toks, 64, 8, 8, KS_TIER_DISK); /* 8 is the most recently hit */
    ks_store_close(s);
    assert_int_equal(count_files(f->disk, ".kvs"), 4);
    uint64_t one = KS_KVFILE_HEADER_LEN + 4 * 20 + 1000 + KS_KVFILE_TAIL_LEN;
    p.cfg.tier_max_bytes[KS_TIER_DISK] = (int64_t)(2 * one);
    s = open_store(&p);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_true(st.tier_bytes[KS_TIER_DISK] <= 2 * one);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 2);
    assert_int_equal(st.tier_evictions[KS_TIER_DISK], 2);
    assert_int_equal(count_files(f->disk, ".kvs"), 2);
    expect_hit(s, f->toks, 64, 8, 8, KS_TIER_DISK); /* the recently hit one survived */
    expect_hit(s, f->toks, 64, -1, 20, KS_TIER_DISK);
    ks_store_close(s);
}

/* Lookups on several threads while the writer saves and evicts in every
 * tier: every hit must carry exactly the payload of its length.
 * Regression: ram_put made a blob visible in the table before setting its
 * payload pointer, so a concurrent lookup could return a NULL payload (found
 * by this test under ThreadSanitizer). */
typedef struct stress {
    ks_store *s;
    const int32_t *toks;
    _Atomic int stop;
    int hits, bad;
} stress;

static void *stress_reader(void *arg) {
    stress *st = arg;
    for (int i = 0; i < 20000 && !atomic_load(&st->stop); i++) {
        ks_store_hit h;
        int rc = ks_store_lookup(st->s, st->toks, NTOK, -1, &h);
        if (rc == KS_ENOENT) continue;
        if (rc != 0) {
            st->bad++;
            continue;
        }
        uint8_t *want = mkpayload(512, (uint32_t)h.n_tokens);
        if (h.payload_len != 512 || memcmp(h.payload, want, 512) != 0) st->bad++;
        free(want);
        st->hits++;
        ks_store_hit_free(&h);
    }
    return NULL;
}

static void test_concurrent_lookups(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    /* each tier holds about four entries: constant eviction */
    for (int t = 0; t < KS_TIER__N; t++) p.cfg.tier_max_bytes[t] = 4 * (KS_KVFILE_HEADER_LEN + 4 * NTOK + 512 + KS_KVFILE_TAIL_LEN);
    ks_store *s = open_store(&p);
    stress st[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        memset(&st[i], 0, sizeof st[i]);
        st[i].s = s;
        st[i].toks = f->toks;
        assert_int_equal(pthread_create(&th[i], NULL, stress_reader, &st[i]), 0);
    }
    static const ks_reason rs[] = {KS_REASON_COLD, KS_REASON_CONTINUED, KS_REASON_FINISH};
    for (int round = 0; round < 10; round++)
        for (int n = 4; n <= NTOK; n++) {
            int rc = ks_store_save(s, rs[(n + round) % 3], f->toks, n, mkpayload(512, (uint32_t)n), 512, (n % 7) == 0);
            assert_true(rc == 0 || rc == KS_EFULL);
        }
    assert_int_equal(ks_store_flush(s, 0), 0);
    int hits = 0;
    for (int i = 0; i < 3; i++) {
        atomic_store(&st[i].stop, 1);
        pthread_join(th[i], NULL);
        assert_int_equal(st[i].bad, 0);
        hits += st[i].hits;
    }
    /* One more hit for sure, so that the readers' check is not vacuous. */
    save_sync(s, KS_REASON_COLD, f->toks, NTOK, 512, NTOK);
    st[0].stop = 0;
    st[0].hits = 0;
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, f->toks, NTOK, -1, &h), 0);
    expect_payload(&h, 512, NTOK);
    ks_store_hit_free(&h);
    print_message("concurrent readers: %d hits\n", hits);
    struct ks_store_stats ss;
    ks_store_stats(s, &ss);
    for (int t = 0; t < KS_TIER__N; t++) assert_true(ss.tier_bytes[t] <= (uint64_t)p.cfg.tier_max_bytes[t]);
    assert_int_equal(ss.corrupt_files, 0);
    assert_int_equal(ss.failed_saves, 0);
    ks_store_close(s);
    assert_int_equal(ks_store_verify_dir(f->disk, NULL, NULL), 0);
    assert_int_equal(ks_store_verify_dir(f->shm, NULL, NULL), 0);
}

static int verify_cb(void *ud, const char *path, int rc, const ks_kvfile_meta *m) {
    int *v = ud;
    if (rc == 0) {
        v[0]++;
        assert_non_null(m);
    } else {
        v[1]++;
    }
    return 0;
}

static void test_verify_dir_and_stale_temps(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    for (int n = 8; n <= 16; n += 4) save_sync(s, KS_REASON_COLD, f->toks, n, 500, (uint32_t)n);
    ks_store_close(s);
    int counts[2] = {0, 0};
    assert_int_equal(ks_store_verify_dir(f->disk, verify_cb, counts), 0);
    assert_int_equal(counts[0], 3);
    assert_int_equal(counts[1], 0);
    /* a file copied under another key's name is bad even though it checks */
    char p8[PATH_MAX], p12[PATH_MAX], cmd[2 * PATH_MAX + 16];
    file_of(f, f->disk, &p, 8, p8);
    file_of(f, f->disk, &p, 12, p12);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", p8, p12);
    assert_int_equal(system(cmd), 0);
    counts[0] = counts[1] = 0;
    assert_int_equal(ks_store_verify_dir(f->disk, verify_cb, counts), 1);
    assert_int_equal(counts[1], 1);
    assert_int_equal(ks_store_verify_dir("/nonexistent/ks", NULL, NULL), KS_ENOENT);
    /* issue 13, finding 10: a file given as the directory is not an I/O error */
    assert_int_equal(ks_store_verify_dir(p8, NULL, NULL), KS_EINVAL);

    /* temp files: a dead writer's is removed at open, ours is not */
    pid_t child = fork();
    if (child == 0) _exit(0);
    assert_true(child > 0);
    waitpid(child, NULL, 0);
    char dead[PATH_MAX], mine[PATH_MAX];
    snprintf(dead, sizeof dead, "%s/.0123456789abcdef.%ld.1.tmp", f->disk, (long)child);
    snprintf(mine, sizeof mine, "%s/.0123456789abcdef.%ld.1.tmp", f->disk, (long)getpid());
    FILE *fp = fopen(dead, "w");
    assert_non_null(fp);
    fclose(fp);
    fp = fopen(mine, "w");
    assert_non_null(fp);
    fclose(fp);
    s = open_store(&p);
    assert_int_equal(access(dead, F_OK), -1);
    assert_int_equal(access(mine, F_OK), 0);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.corrupt_files, 1); /* the file under the wrong name, quarantined */
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 2);
    ks_store_close(s);
    unlink(mine);
}

typedef struct vcount {
    int good, bad, skipped;
} vcount;

static int verify_count(void *ud, const char *path, int rc, const ks_kvfile_meta *m) {
    vcount *v = ud;
    if (rc == 0) v->good++;
    else if (rc == KS_EINVAL) v->skipped++;
    else v->bad++;
    return 0;
}

static bool is_fifo(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode);
}

/* Issue 13, finding 2: a FIFO named like a store file hung the store: at
 * open (the server never became ready) and at a rescan (lookups run on the
 * inference thread: every generation stopped). Names that are not regular
 * files (FIFO, directory, symlink) are skipped now, counted once each in
 * skipped_files, never moved to quarantine; saves and lookups go on. An
 * alarm turns a hang back into a failure. */
static void test_special_files_skipped(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = open_store(&p);
    save_sync(s, KS_REASON_COLD, f->toks, 8, 500, 1);       /* disk */
    save_sync(s, KS_REASON_CONTINUED, f->toks, 12, 500, 2); /* shm */
    ks_store_close(s);
    char d16[PATH_MAX], s16[PATH_MAX], d20[PATH_MAX], d28[PATH_MAX], d24[PATH_MAX], d8[PATH_MAX];
    file_of(f, f->disk, &p, 16, d16);
    file_of(f, f->shm, &p, 16, s16);
    file_of(f, f->disk, &p, 20, d20);
    file_of(f, f->disk, &p, 28, d28);
    file_of(f, f->disk, &p, 24, d24);
    file_of(f, f->disk, &p, 8, d8);
    assert_int_equal(mkfifo(d16, 0600), 0);
    assert_int_equal(mkfifo(s16, 0600), 0);
    assert_int_equal(symlink(d8, d20), 0); /* a valid kvfile behind it, under another name */
    assert_int_equal(mkdir(d28, 0700), 0);
    alarm(60);

    /* at open */
    s = open_store(&p);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.skipped_files, 4);
    assert_int_equal(st.corrupt_files, 0);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], 1);
    assert_int_equal(st.tier_entries[KS_TIER_SHM], 1);
    expect_hit(s, f->toks, 64, -1, 12, KS_TIER_SHM);
    expect_hit(s, f->toks, 64, 11, 8, KS_TIER_DISK);

    /* at run time: a new FIFO, then a rescan by the next lookup */
    assert_int_equal(mkfifo(d24, 0600), 0);
    expect_hit(s, f->toks, 64, -1, 12, KS_TIER_SHM);
    ks_store_stats(s, &st);
    assert_int_equal(st.skipped_files, 5);
    /* counted once while they stay, however often the directory is scanned */
    save_sync(s, KS_REASON_COLD, f->toks, 36, 500, 3);
    expect_hit(s, f->toks, 64, -1, 36, KS_TIER_DISK);
    save_sync(s, KS_REASON_COLD, f->toks, 40, 500, 4); /* and scanned again */
    expect_hit(s, f->toks, 64, -1, 40, KS_TIER_DISK);
    ks_store_stats(s, &st);
    assert_int_equal(st.skipped_files, 5);

    /* an indexed file replaced by a FIFO: a miss, not a hang */
    assert_int_equal(unlink(d8), 0);
    assert_int_equal(mkfifo(d8, 0600), 0);
    expect_hit(s, f->toks, 64, 11, 0, KS_TIER_NONE);
    ks_store_stats(s, &st);
    assert_int_equal(st.skipped_files, 6);
    assert_int_equal(st.corrupt_files, 0);

    /* a save whose name is taken by a FIFO fails; the FIFO stays */
    assert_int_equal(ks_store_save(s, KS_REASON_COLD, f->toks, 16, mkpayload(500, 4), 500, true), KS_EIO);
    ks_store_close(s);
    assert_true(is_fifo(d16) && is_fifo(s16) && is_fifo(d24) && is_fifo(d8));

    /* verify: skipped, not bad */
    vcount v = {0, 0, 0};
    assert_int_equal(ks_store_verify_dir(f->disk, verify_count, &v), 0);
    assert_int_equal(v.good, 2); /* the 36- and 40-token states */
    assert_int_equal(v.bad, 0);
    assert_int_equal(v.skipped, 5);
    alarm(0);
}

static void test_open_errors(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    ks_store *s = (ks_store *)1;
    char err[256] = "";
    /* the disk dir is a file */
    assert_int_equal(mkdir(f->disk, 0700), 0);
    char file[512];
    snprintf(file, sizeof file, "%s/afile", f->disk);
    FILE *fp = fopen(file, "w");
    assert_non_null(fp);
    fclose(fp);
    snprintf(p.cfg.cache_dir, sizeof p.cfg.cache_dir, "%s", file);
    assert_int_not_equal(ks_store_open(&p, &s, err, sizeof err), 0);
    assert_null(s);
    assert_true(strlen(err) > 0);
    /* the same directory for shm and disk */
    p = params_for(f, 1, 1);
    snprintf(p.cfg.shm_dir, sizeof p.cfg.shm_dir, "%s", f->disk);
    assert_int_equal(ks_store_open(&p, &s, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "same"));
    /* a bad reason -> tier mapping */
    p = params_for(f, 1, 1);
    p.cfg.reason_tier[KS_REASON_COLD] = 7;
    assert_int_equal(ks_store_open(&p, &s, err, sizeof err), KS_EINVAL);
    /* an unusable shm dir only disables the shm tier */
    p = params_for(f, 1, 1);
    snprintf(p.cfg.shm_dir, sizeof p.cfg.shm_dir, "%s", file);
    s = open_store(&p);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_max_bytes[KS_TIER_SHM], 0);
    assert_int_equal(ks_store_save(s, KS_REASON_CONTINUED, f->toks, 8, mkpayload(10, 1), 10, true), 0);
    ks_store_stats(s, &st);
    assert_int_equal(st.dropped_saves, 1);
    ks_store_close(s);
}

/* ------------------------------------------------------------------ pins */
static int64_t wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* State i: n tokens starting with 5000 + i (distinct from every other i). */
static const int32_t *state_toks(int i, int n) {
    static int32_t t[64];
    assert_true(n <= 64);
    for (int k = 0; k < n; k++) t[k] = k == 0 ? 5000 + i : 7 * k;
    return t;
}

static bool holds(ks_store *s, int i, int n) {
    ks_store_hit h;
    int rc = ks_store_lookup(s, state_toks(i, n), n, -1, &h);
    bool ok = rc == 0 && h.n_tokens == n;
    ks_store_hit_free(&h);
    return ok;
}

/* Fills the tier with k unpinned states (ids from `first`), 1000-byte payloads. */
static void fill(ks_store *s, int first, int k) {
    for (int i = first; i < first + k; i++)
        save_sync(s, KS_REASON_FINISH, state_toks(i, 4), 4, 1000, (uint32_t)i);
}

/* A ram-only store of about ten 1000-byte states; half of it for pins. */
static ks_store_params ram_pin_params(fx *f) {
    ks_store_params p = params_for(f, 1, 1);
    for (int t = 0; t < KS_TIER__N; t++) p.cfg.tier_max_bytes[t] = 0;
    p.cfg.tier_max_bytes[KS_TIER_RAM] = 11000;
    for (int r = 0; r < KS_REASON__N; r++) p.cfg.reason_tier[r] = KS_TIER_RAM;
    p.cfg.pin_share = 0.5f;
    return p;
}

/* A pinned state survives any number of later saves; its pin is refreshed
 * instead of saved again; min_tokens does not apply to it. */
static void test_pin_protects(void **state) {
    fx *f = *state;
    ks_store_params p = ram_pin_params(f);
    ks_store *s = open_store(&p);
    int64_t until = wall_us() + 60 * 1000000ll;
    /* 3 tokens < min_tokens (4): a pin is an explicit request. */
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 3), 3, mkpayload(1000, 99), 1000, until), 1);
    assert_int_equal(ks_store_flush(s, 0), 0);
    fill(s, 100, 30);
    assert_true(holds(s, 0, 3));
    assert_false(holds(s, 100, 4)); /* the oldest unpinned ones went */
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_true(st.tier_evictions[KS_TIER_RAM] >= 20);
    assert_int_equal(st.tier_pinned_entries[KS_TIER_RAM], 1);
    assert_true(st.tier_pinned_bytes[KS_TIER_RAM] >= 1000);
    assert_int_equal(st.saves[KS_REASON_PIN], 1);
    assert_int_equal(st.pin_saves, 1);
    assert_int_equal(st.tier_pin_drops[KS_TIER_RAM], 0);
    assert_true(st.tier_bytes[KS_TIER_RAM] <= 11000);
    /* Held: refreshed, not written again. */
    assert_int_equal(ks_store_pin(s, state_toks(0, 3), 3, until + 1), 0);
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 3), 3, mkpayload(1000, 98), 1000, until + 2), 0);
    assert_int_equal(ks_store_pin(s, state_toks(1, 3), 3, until), KS_ENOENT);
    assert_int_equal(ks_store_pin(s, state_toks(0, 3), 3, 0), KS_EINVAL);
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 3), 0, mkpayload(10, 1), 10, until), KS_EINVAL);
    assert_int_equal(ks_store_flush(s, 0), 0);
    ks_store_stats(s, &st);
    assert_int_equal(st.pin_saves, 1);
    assert_int_equal(st.pin_refreshes, 2);
    /* The payload is the first save's. */
    ks_store_hit h;
    assert_int_equal(ks_store_lookup(s, state_toks(0, 3), 3, -1, &h), 0);
    expect_payload(&h, 1000, 99);
    assert_int_equal(h.reason, KS_REASON_PIN);
    ks_store_hit_free(&h);
    /* A state saved unpinned gets its pin by ks_store_pin, then survives. */
    fill(s, 200, 1);
    assert_int_equal(ks_store_pin(s, state_toks(200, 4), 4, until), 0);
    fill(s, 300, 30);
    assert_true(holds(s, 200, 4));
    assert_true(holds(s, 0, 3));
    ks_store_close(s);
}

/* A pin protects until its deadline, not after. */
static void test_pin_expires(void **state) {
    fx *f = *state;
    ks_store_params p = ram_pin_params(f);
    ks_store *s = open_store(&p);
    int64_t until = wall_us() + 1000000; /* 1 s */
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 4), 4, mkpayload(1000, 1), 1000, until), 1);
    assert_int_equal(ks_store_flush(s, 0), 0);
    fill(s, 100, 20);
    assert_true(holds(s, 0, 4));
    while (wall_us() <= until + 20000) usleep(50000);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_pinned_entries[KS_TIER_RAM], 0);
    /* Now an ordinary entry, recently hit by holds(): the LRU takes it after
     * the others. */
    fill(s, 200, 20);
    assert_false(holds(s, 0, 4));
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_pin_drops[KS_TIER_RAM], 0); /* it had expired */
    ks_store_close(s);
}

/* Pins beyond pin_share of the budget: the ones that expire soonest lose
 * protection first; pin_share 0 protects nothing. */
static void test_pin_share(void **state) {
    fx *f = *state;
    ks_store_params p = ram_pin_params(f); /* 5500 bytes of pins: five 1000-byte states */
    ks_store *s = open_store(&p);
    int64_t now = wall_us();
    /* State 0 until +100 s, states 1..6 until +10 s .. +60 s. */
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 3), 3, mkpayload(1000, 0), 1000, now + 100000000ll), 1);
    for (int i = 1; i <= 6; i++)
        assert_int_equal(ks_store_save_pinned(s, state_toks(i, 3), 3, mkpayload(1000, (uint32_t)i), 1000,
                                              now + 10000000ll * i),
                         1);
    assert_int_equal(ks_store_flush(s, 0), 0);
    fill(s, 100, 30);
    /* Protected by deadline: 0 (100 s), 6, 5, 4, 3 (60..30 s) = five states. */
    assert_true(holds(s, 0, 3));
    for (int i = 3; i <= 6; i++)
        if (!holds(s, i, 3)) fail_msg("pinned state %d (deadline +%d s) was evicted", i, 10 * i);
    assert_false(holds(s, 1, 3));
    assert_false(holds(s, 2, 3));
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_pin_drops[KS_TIER_RAM], 2);
    assert_int_equal(st.tier_pinned_entries[KS_TIER_RAM], 5);
    assert_true(st.tier_pinned_bytes[KS_TIER_RAM] <= 5500);
    assert_true(st.tier_bytes[KS_TIER_RAM] <= 11000);
    ks_store_close(s);

    p.cfg.pin_share = 0.0f;
    s = open_store(&p);
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 3), 3, mkpayload(1000, 0), 1000, now + 100000000ll), 1);
    assert_int_equal(ks_store_flush(s, 0), 0);
    fill(s, 100, 30);
    assert_false(holds(s, 0, 3));
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_pin_drops[KS_TIER_RAM], 1);
    ks_store_close(s);
    /* pin_share outside 0..1 is refused */
    p.cfg.pin_share = 1.5f;
    ks_store *bad = NULL;
    assert_int_equal(ks_store_open(&p, &bad, NULL, 0), KS_EINVAL);
    assert_null(bad);
}

/* Full store: a pinned save goes to ram and to the tier of reason pin
 * (disk); the file keeps the deadline across close/reopen, and another store
 * on the directory honours it, also one set after it indexed the file. */
static void test_pin_in_files(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    p.cfg.reason_tier[KS_REASON_PIN] = KS_TIER_DISK;
    uint64_t one = KS_KVFILE_HEADER_LEN + 4 * 4 + 1000 + KS_KVFILE_TAIL_LEN;
    p.cfg.tier_max_bytes[KS_TIER_DISK] = (int64_t)(6 * one);
    p.cfg.pin_share = 0.5f;
    ks_store *s = open_store(&p);
    int64_t until = wall_us() + 600 * 1000000ll;
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 4), 4, mkpayload(1000, 7), 1000, until), 1);
    assert_int_equal(ks_store_flush(s, 0), 0);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_pinned_entries[KS_TIER_RAM], 1);
    assert_int_equal(st.tier_pinned_entries[KS_TIER_DISK], 1);
    assert_int_equal(st.saves[KS_REASON_PIN], 1);
    assert_int_equal(count_files(f->disk, ".kvs"), 1);
    ks_store_close(s);

    /* The file holds the deadline. */
    ks_key key;
    char path[PATH_MAX];
    ks_kvfile_meta m;
    assert_int_equal(ks_key_compute(p.model_fp, p.kv_params, p.kv_params_len, state_toks(0, 4), 4, &key), 0);
    assert_int_equal(ks_kvfile_path(f->disk, &key, path, sizeof path), 0);
    assert_int_equal(ks_kvfile_read_meta(path, &m), 0);
    assert_int_equal(m.pin_until_us, until);
    assert_int_equal(m.reason, KS_REASON_PIN);

    /* Reopened (a restart): the pin protects it from the disk LRU. */
    ks_store_params q = p;
    q.cfg.reason_tier[KS_REASON_COLD] = KS_TIER_DISK;
    ks_store *a = open_store(&q);
    for (int i = 100; i < 120; i++) save_sync(a, KS_REASON_COLD, state_toks(i, 4), 4, 1000, (uint32_t)i);
    assert_true(holds(a, 0, 4));
    ks_store_stats(a, &st);
    assert_int_equal(st.tier_entries[KS_TIER_RAM], 0); /* from the disk: not in this process's ram */
    assert_true(st.tier_evictions[KS_TIER_DISK] >= 14);

    /* Another store on the directory pins a state a saved; a still has it
     * unpinned in its table, reads the file's pin before evicting, keeps it. */
    ks_store *b = open_store(&q);
    assert_int_equal(ks_store_pin(b, state_toks(119, 4), 4, until), 0);
    ks_store_close(b); /* persists the pin into the trailer */
    for (int i = 200; i < 220; i++) save_sync(a, KS_REASON_COLD, state_toks(i, 4), 4, 1000, (uint32_t)i);
    assert_true(holds(a, 119, 4));
    assert_true(holds(a, 0, 4));
    assert_false(holds(a, 200, 4));
    assert_int_equal(ks_kvfile_read_meta(path, &m), 0);
    assert_int_equal(m.pin_until_us, until); /* not shortened by a's trailer updates */
    ks_store_close(a);

    /* kvstash cache gc honours pins too (ks_tier_evict with pins). */
    ks_tier *t = NULL;
    char err[128];
    assert_int_equal(ks_tier_file_open(KS_TIER_DISK, f->disk, 0, NULL, &t, err, sizeof err), 0);
    ks_tier_pins pins = {.now_us = wall_us(), .max_bytes = 1u << 20};
    assert_true(ks_tier_evict(t, 0, &pins, NULL, NULL) >= 1);
    uint64_t n = 0;
    ks_tier_usage(t, NULL, &n);
    assert_int_equal(n, 2); /* the two pinned files */
    assert_int_equal(ks_tier_pinned_bytes(t, pins.now_us, NULL), 2 * one);
    ks_tier_close(t);
}

/* No tier takes pins: ram off and reason pin to none. */
static void test_pin_without_tier(void **state) {
    fx *f = *state;
    ks_store_params p = params_for(f, 1, 1);
    p.cfg.tier_max_bytes[KS_TIER_RAM] = 0;
    p.cfg.reason_tier[KS_REASON_PIN] = KS_TIER_NONE;
    ks_store *s = open_store(&p);
    assert_int_equal(ks_store_save_pinned(s, state_toks(0, 4), 4, mkpayload(10, 1), 10, wall_us() + 1000000), KS_ENOENT);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.dropped_saves, 1);
    ks_store_close(s);
}

int main(void) {
    ks_log_set_level(getenv("KS_TEST_LOG") ? KS_LOG_DEBUG : KS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reason_and_tier_names),
        cmocka_unit_test_setup_teardown(test_tiers_by_reason, setup, teardown),
        cmocka_unit_test_setup_teardown(test_longest_prefix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_filters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lru_budget_per_tier, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_declined_save_is_a_use, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_reads_reuse_a_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prewarm_keeps_reads_correct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_stores_one_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_file_is_a_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_version_bump, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_model_is_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_enforces_shrunk_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_dir_and_stale_temps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_special_files_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_lookups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_protects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_share, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_in_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_without_tier, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

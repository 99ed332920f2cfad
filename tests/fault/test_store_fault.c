/* test_store_fault.c — the store under injected I/O failures (through
 * src/cache/sysio.c) and under kill -9.
 *
 * For every system call a save makes (open, write, fsync, close, link,
 * unlink — of the temp file and of the directory), in the order it makes
 * them, the Nth call is made to fail; then:
 *   - the save either failed (and nothing was published: a miss) or
 *     succeeded (the failure came after the publishing link: a hit);
 *   - every published file verifies, no temp file stays behind;
 *   - the store keeps working (the next save and lookup succeed).
 * Then a child process saving in a loop is killed at random points; every
 * file under a final name must verify. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/store.h"
#include "cache/sysio.h"

#define NTOK 32
#define PAYLOAD 20000

typedef struct fx {
    char dir[64];
    int32_t toks[NTOK];
    uint32_t next_id;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/ks-fault-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    for (int i = 0; i < NTOK; i++) f->toks[i] = 500 + i;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    ks_sysio_fault_clear();
    ks_sysio_release(); /* never leave a writer blocked behind a failed test */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static ks_store_params disk_params(fx *f) {
    ks_store_params p = ks_store_params_default();
    snprintf(p.cfg.cache_dir, sizeof p.cfg.cache_dir, "%s", f->dir);
    p.cfg.shm_dir[0] = '\0';
    p.cfg.tier_max_bytes[KS_TIER_RAM] = 0;
    p.cfg.tier_max_bytes[KS_TIER_SHM] = 0;
    p.cfg.tier_max_bytes[KS_TIER_DISK] = 64 << 20;
    p.cfg.stride = 8;
    p.cfg.min_tokens = 8;
    p.cfg.shutdown_timeout_ms = 60000;
    for (int r = 0; r < KS_REASON__N; r++) p.cfg.reason_tier[r] = KS_TIER_DISK;
    memset(p.model_fp, 0x5a, 32);
    p.kv_params = "kv";
    p.kv_params_len = 2;
    p.state_version = 1;
    return p;
}

static uint8_t *mkpayload(size_t len, uint32_t seed) {
    uint8_t *p = malloc(len);
    assert_non_null(p);
    for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(i * 7 + seed * 13);
    return p;
}

static int count_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) n += ks_kvfile_temp_parse(de->d_name, NULL);
    closedir(d);
    return n;
}

static int count_kvs(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) n += ks_kvfile_name_parse(de->d_name, NULL);
    closedir(d);
    return n;
}

static int print_bad(void *ud, const char *path, int rc, const ks_kvfile_meta *m) {
    if (rc != 0) fprintf(stderr, "bad file %s: %s\n", path, ks_errname(rc));
    return 0;
}

/* A fresh token list (its first token unique), saved sync; returns the rc. */
static int save_new(fx *f, ks_store *s, uint32_t *id) {
    *id = ++f->next_id;
    f->toks[0] = (int32_t)(100000 + *id);
    return ks_store_save(s, KS_REASON_COLD, f->toks, NTOK, mkpayload(PAYLOAD, *id), PAYLOAD, true);
}

/* Looks up the list of id: 1 hit (payload checked), 0 miss. */
static int lookup_id(fx *f, ks_store *s, uint32_t id) {
    ks_store_hit h;
    f->toks[0] = (int32_t)(100000 + id);
    int rc = ks_store_lookup(s, f->toks, NTOK, -1, &h);
    if (rc == KS_ENOENT) return 0;
    if (rc != 0) fail_msg("lookup: %s", ks_errname(rc));
    assert_int_equal(h.n_tokens, NTOK);
    uint8_t *want = mkpayload(PAYLOAD, id);
    assert_int_equal(h.payload_len, PAYLOAD);
    assert_memory_equal(h.payload, want, PAYLOAD);
    free(want);
    ks_store_hit_free(&h);
    return 1;
}

/* After a faulty save: state consistent, store still working. */
static void check_after(fx *f, ks_store *s, int rc, uint32_t id, const char *what) {
    int hit = lookup_id(f, s, id);
    if (rc == 0 && !hit) fail_msg("%s: save said 0 but the state is not found", what);
    if (rc != 0 && hit) fail_msg("%s: save failed (%s) but a file was published", what, ks_errname(rc));
    /* the store keeps serving: a clean save and lookup */
    uint32_t ok_id;
    int rc2 = save_new(f, s, &ok_id);
    if (rc2 != 0) fail_msg("%s: the next save failed: %s", what, ks_errname(rc2));
    if (!lookup_id(f, s, ok_id)) fail_msg("%s: the next save is not found", what);
    int temps = count_temps(f->dir);
    if (temps) fail_msg("%s: %d temp files left", what, temps);
    int bad = ks_store_verify_dir(f->dir, print_bad, NULL);
    if (bad) fail_msg("%s: %d bad files published", what, bad);
}

static void test_fault_at_each_step(void **state) {
    fx *f = *state;
    ks_store_params p = disk_params(f);
    ks_store *s = NULL;
    char err[256];
    assert_int_equal(ks_store_open(&p, &s, err, sizeof err), 0);
    assert_int_equal(ks_store_flush(s, 0), 0);

    /* How many calls of each kind one save makes. */
    long before[KS_SYSIO__N], calls[KS_SYSIO__N];
    for (int op = 0; op < KS_SYSIO__N; op++) before[op] = ks_sysio_count((ks_sysio_op)op);
    uint32_t id;
    assert_int_equal(save_new(f, s, &id), 0);
    for (int op = 0; op < KS_SYSIO__N; op++) calls[op] = ks_sysio_count((ks_sysio_op)op) - before[op];
    assert_true(calls[KS_SYSIO_OPEN] >= 2);  /* temp file, directory */
    assert_true(calls[KS_SYSIO_WRITE] >= 3); /* header, tokens, payload, tail */
    assert_true(calls[KS_SYSIO_FSYNC] >= 2); /* file, directory */
    assert_true(calls[KS_SYSIO_LINK] == 1);
    assert_true(calls[KS_SYSIO_UNLINK] >= 1);

    static const struct {
        ks_sysio_op op;
        int err;
    } faults[] = {
        {KS_SYSIO_OPEN, EIO},   {KS_SYSIO_OPEN, ENOSPC}, {KS_SYSIO_WRITE, ENOSPC}, {KS_SYSIO_WRITE, EIO},
        {KS_SYSIO_FSYNC, EIO},  {KS_SYSIO_CLOSE, EIO},   {KS_SYSIO_LINK, EIO},     {KS_SYSIO_LINK, ENOSPC},
        {KS_SYSIO_UNLINK, EIO},
    };
    int n_failed = 0, n_ok = 0;
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        for (long k = 1; k <= calls[faults[i].op]; k++) {
            char what[96];
            snprintf(what, sizeof what, "%s #%ld -> %s", ks_sysio_op_name(faults[i].op), k,
                     strerror(faults[i].err));
            struct ks_store_stats st0, st1;
            ks_store_stats(s, &st0);
            ks_sysio_fault_set(faults[i].op, k, KS_SYSIO_FAIL, faults[i].err, false);
            int rc = save_new(f, s, &id);
            bool fired = ks_sysio_fault_fired();
            ks_sysio_fault_clear();
            if (!fired) fail_msg("%s: the fault was never reached", what);
            ks_store_stats(s, &st1);
            if (rc != 0) {
                n_failed++;
                assert_int_equal(st1.failed_saves, st0.failed_saves + 1);
                if (faults[i].op == KS_SYSIO_WRITE && faults[i].err == ENOSPC) assert_int_equal(rc, KS_ENOSPC);
            } else {
                n_ok++;
            }
            check_after(f, s, rc, id, what);
        }
    }
    /* Failures before the link must fail the save; after it, they must not. */
    assert_true(n_failed >= 8);
    assert_true(n_ok >= 2);

    /* Short writes are retried: the save succeeds and the file verifies. */
    for (long k = 1; k <= calls[KS_SYSIO_WRITE]; k++) {
        ks_sysio_fault_set(KS_SYSIO_WRITE, k, KS_SYSIO_SHORT, 0, false);
        int rc = save_new(f, s, &id);
        assert_true(ks_sysio_fault_fired());
        ks_sysio_fault_clear();
        assert_int_equal(rc, 0);
        check_after(f, s, rc, id, "short write");
    }
    /* A filesystem without hard links: the temp file is renamed instead. */
    ks_sysio_fault_set(KS_SYSIO_LINK, 1, KS_SYSIO_FAIL, EPERM, true);
    long renames = ks_sysio_count(KS_SYSIO_RENAME);
    for (int r = 0; r < 2; r++) {
        int rc = save_new(f, s, &id);
        assert_int_equal(rc, 0);
        assert_int_equal(lookup_id(f, s, id), 1);
    }
    ks_sysio_fault_clear();
    assert_int_equal(ks_sysio_count(KS_SYSIO_RENAME) - renames, 2);
    check_after(f, s, 0, id, "no hard links");
    /* A disk that stays full: every save fails until it is not, then all is well. */
    ks_sysio_fault_set(KS_SYSIO_WRITE, 1, KS_SYSIO_FAIL, ENOSPC, true);
    for (int r = 0; r < 3; r++) assert_int_equal(save_new(f, s, &id), KS_ENOSPC);
    ks_sysio_fault_clear();
    assert_int_equal(count_temps(f->dir), 0);
    check_after(f, s, KS_ENOSPC, id, "full disk");
    /* A short write followed by a full disk. */
    ks_sysio_fault_set(KS_SYSIO_WRITE, 3, KS_SYSIO_SHORT, ENOSPC, true);
    assert_int_equal(save_new(f, s, &id), KS_ENOSPC);
    ks_sysio_fault_clear();
    check_after(f, s, KS_ENOSPC, id, "short write then full");

    /* A read error on lookup is a miss, not a corrupt file: the entry stays. */
    uint32_t rid;
    assert_int_equal(save_new(f, s, &rid), 0);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    uint64_t corrupt = st.corrupt_files;
    ks_sysio_fault_set(KS_SYSIO_PREAD, 1, KS_SYSIO_FAIL, EIO, false);
    assert_int_equal(lookup_id(f, s, rid), 0);
    ks_sysio_fault_clear();
    assert_int_equal(lookup_id(f, s, rid), 1);
    ks_store_stats(s, &st);
    assert_int_equal(st.corrupt_files, corrupt);
    assert_int_equal(st.corrupt_files, 0);
    ks_store_close(s);

    /* And after all that, a restart sees exactly the good files. */
    assert_int_equal(ks_store_open(&p, &s, err, sizeof err), 0);
    assert_int_equal(ks_store_flush(s, 0), 0);
    ks_store_stats(s, &st);
    assert_int_equal(st.corrupt_files, 0);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], (uint64_t)count_kvs(f->dir));
    assert_int_equal(lookup_id(f, s, rid), 1);
    ks_store_close(s);
}

/* A child saves in a loop and is killed at random moments. */
static void child_loop(const char *dir, int round) {
    fx cf;
    memset(&cf, 0, sizeof cf);
    snprintf(cf.dir, sizeof cf.dir, "%s", dir);
    ks_log_set_level(KS_LOG_OFF);
    ks_store_params p = disk_params(&cf);
    p.cfg.tier_max_bytes[KS_TIER_DISK] = 24 << 20; /* evictions happen too */
    ks_store *s = NULL;
    char err[256];
    if (ks_store_open(&p, &s, err, sizeof err) != 0) _exit(3);
    int32_t toks[NTOK];
    for (int i = 0; i < NTOK; i++) toks[i] = 7 + i;
    srand((unsigned)(getpid() ^ round));
    for (uint32_t i = 0;; i++) {
        toks[0] = round * 1000000 + (int)i;
        size_t len = 1000 + (size_t)(rand() % (3 << 20));
        uint8_t *pl = malloc(len);
        if (!pl) _exit(4);
        memset(pl, (int)(i & 0xff), len);
        ks_store_save(s, KS_REASON_COLD, toks, NTOK, pl, len, (i & 1) == 0);
    }
}

static void test_kill9_while_saving(void **state) {
    fx *f = *state;
    srand(12345);
    int rounds = 30;
    for (int r = 0; r < rounds; r++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) child_loop(f->dir, r);
        struct timespec ts = {0, (long)(10 + rand() % 120) * 1000000L};
        nanosleep(&ts, NULL);
        assert_int_equal(kill(pid, SIGKILL), 0);
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (!WIFSIGNALED(st)) fail_msg("round %d: child exited by itself (status %d)", r, st);
        int bad = ks_store_verify_dir(f->dir, print_bad, NULL);
        if (bad) fail_msg("round %d: %d published files do not verify", r, bad);
    }
    int published = count_kvs(f->dir);
    print_message("%d files published, %d temp files left by the killed writers\n", published,
                  count_temps(f->dir));
    assert_true(published > 0);
    /* Opening cleans the dead writers' temp files and indexes every file. */
    ks_store_params p = disk_params(f);
    ks_store *s = NULL;
    char err[256];
    assert_int_equal(ks_store_open(&p, &s, err, sizeof err), 0);
    assert_int_equal(ks_store_flush(s, 0), 0);
    assert_int_equal(count_temps(f->dir), 0);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.corrupt_files, 0);
    assert_int_equal(st.tier_entries[KS_TIER_DISK], (uint64_t)count_kvs(f->dir));
    ks_store_close(s);
}

/* Read your own writes: while the writer is stuck inside a disk save (its
 * fsync held), both that save and a save queued behind it are found by
 * lookups straight from memory — also as the prefix of a longer prompt —
 * without waiting. Once released, both come from their tiers. */
static void test_lookup_sees_queued_saves(void **state) {
    fx *f = *state;
    ks_store_params p = disk_params(f);
    p.cfg.tier_max_bytes[KS_TIER_RAM] = 64 << 20;
    p.cfg.reason_tier[KS_REASON_FINISH] = KS_TIER_RAM; /* cold: disk */
    ks_store *s = NULL;
    char err[256];
    assert_int_equal(ks_store_open(&p, &s, err, sizeof err), 0);
    int32_t a[NTOK], b[NTOK + 8];
    for (int i = 0; i < NTOK; i++) a[i] = 7000 + i;
    for (int i = 0; i < NTOK + 8; i++) b[i] = 9000 + i;

    ks_sysio_hold(KS_SYSIO_FSYNC);
    /* a's save: 29 tokens, not a stride multiple (8), so a lookup finds its
     * length only through the save itself */
    assert_int_equal(ks_store_save(s, KS_REASON_COLD, a, NTOK - 3, mkpayload(PAYLOAD, 1), PAYLOAD, false), 0);
    for (int i = 0; i < 5000 && ks_sysio_held() == 0; i++) usleep(1000);
    assert_int_equal(ks_sysio_held(), 1); /* the writer is inside a's save */
    assert_int_equal(ks_store_save(s, KS_REASON_FINISH, b, NTOK, mkpayload(PAYLOAD, 2), PAYLOAD, false), 0);

    ks_store_hit h;
    /* b's first NTOK tokens: queued, not written; found as the prefix of b */
    assert_int_equal(ks_store_lookup(s, b, NTOK + 8, -1, &h), 0);
    assert_int_equal(h.n_tokens, NTOK);
    assert_int_equal(h.tier, KS_TIER_RAM);
    assert_int_equal(h.reason, KS_REASON_FINISH);
    uint8_t *want = mkpayload(PAYLOAD, 2);
    assert_int_equal(h.payload_len, PAYLOAD);
    assert_memory_equal(h.payload, want, PAYLOAD);
    free(want);
    ks_store_hit_free(&h);
    struct ks_store_stats st;
    ks_store_stats(s, &st);
    assert_int_equal(st.tier_entries[KS_TIER_RAM], 0); /* really still queued */
    assert_int_equal(st.pending_hits, 1);
    /* a different token in the middle: not b's state */
    b[5]++;
    assert_int_equal(ks_store_lookup(s, b, NTOK + 8, -1, &h), KS_ENOENT);
    b[5]--;
    /* a: the writer is inside its disk save (held in fsync): found too,
     * without waiting for the writer */
    assert_int_equal(ks_store_lookup(s, a, NTOK, -1, &h), 0);
    assert_int_equal(h.n_tokens, NTOK - 3);
    assert_int_equal(h.tier, KS_TIER_DISK);
    assert_int_equal(h.reason, KS_REASON_COLD);
    want = mkpayload(PAYLOAD, 1);
    assert_memory_equal(h.payload, want, PAYLOAD);
    free(want);
    ks_store_hit_free(&h);
    assert_int_equal(ks_sysio_held(), 1); /* still held: nothing was waited for */
    ks_store_stats(s, &st);
    assert_int_equal(st.pending_hits, 2);

    ks_sysio_release();
    assert_int_equal(ks_store_flush(s, 0), 0);
    assert_int_equal(ks_store_lookup(s, a, NTOK, -1, &h), 0);
    assert_int_equal(h.tier, KS_TIER_DISK);
    assert_int_equal(h.n_tokens, NTOK - 3);
    ks_store_hit_free(&h);
    assert_int_equal(ks_store_lookup(s, b, NTOK + 8, -1, &h), 0);
    assert_int_equal(h.tier, KS_TIER_RAM);
    assert_int_equal(h.n_tokens, NTOK);
    ks_store_hit_free(&h);
    ks_store_close(s);
}

int main(void) {
    ks_log_set_level(getenv("KS_TEST_LOG") ? KS_LOG_DEBUG : KS_LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fault_at_each_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill9_while_saving, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_sees_queued_saves, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * tier_file.c — the shm and disk tiers: a directory of kvfiles.
 *
 * Directory layout
 *   <dir>/<64 hex key>.kvs                 published entries (kvfile.h)
 *   <dir>/.<key16>.<pid>.<n>.tmp           a save in progress (never read)
 *   <dir>/quarantine/<name>.<time>         files found bad, kept for a post-mortem
 *                                          (at most KS_QUARANTINE_MAX, oldest go first)
 *   anything else                          ignored (e.g. fingerprints/)
 *
 * A name like <key>.kvs that is not a regular file (a FIFO, socket, device,
 * directory or symlink) is skipped: never opened when readdir's d_type tells,
 * else opened without blocking or following and refused by its fstat
 * (kvfile.h), never quarantined (it is not a bad kvfile, and may not be
 * ours to move), counted in n_skipped and logged once while it stays.
 *
 * The table is rebuilt from the headers at open and refreshed by rescan()
 * when the directory's mtime changes — that is how saves of other processes
 * on the same directory become visible. A rescan reads only the headers of
 * names it does not know, and forgets entries whose file vanished (evicted
 * or removed by another process) unless they were added after the scan
 * started.
 *
 * Invariants (in addition to tier.h's)
 *  1. Only files named <key>.kvs whose header checks are in the table, and
 *     the table key equals the key in the header.
 *  2. Files are only created by ks_kvfile_write (temp + link) and only
 *     removed by drop/quarantine/cleanup on the owner thread — or by other
 *     processes, which readers tolerate (a vanished file is a miss).
 *  3. No scan or read blocks on what a name in the directory is: only
 *     regular files are read.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/sysio.h"
#include "cache/tier.h"

#define KS_QUARANTINE_MAX 32
#define KS_TEMP_MAX_AGE_S 3600 /* a temp file this old belongs to nobody */
#define KS_MAX_ORPHANS 16

typedef struct file_tier {
    ks_tier base;
    pthread_mutex_t scan_mu;       /* one rescan at a time */
    struct timespec dir_mtime;     /* at the last scan */
    bool scanned;
    ks_keymap skipped;             /* names skipped (not regular files) at the last scan (scan_mu) */
    /* temp names whose unlink failed: retried by the owner thread */
    char orphans[KS_MAX_ORPHANS][PATH_MAX];
    int n_orphans;
    /* one read buffer kept between gets (pages already mapped: a restore
     * from the page cache reads ~3x faster than into a fresh malloc) */
    pthread_mutex_t spare_mu;
    uint8_t *spare;
    size_t spare_cap;
} file_tier;

/* Larger buffers are not kept. A GPU server's states run to gigabytes (an
 * 8B model's at 7K tokens: 842 MB), and a fresh buffer's first fill costs
 * ~0.5 s per GiB in page faults (493 ms measured on the 2-core test
 * machine), more than the read itself: at 256 MiB every such restore paid
 * them (1.2 s of a 1.3 s restore on an H100 machine, docs/BENCHMARKS.md
 * "Restart on a GPU"). The server prewarms one of its largest state's size,
 * up to PREWARM_MAX (ks_store_prewarm). */
#define SPARE_MAX ((size_t)4 << 30)

/* Keeps buf as the spare read buffer when it is the larger one (and not too
 * large to keep), else frees it. NULL is a no-op. */
static void spare_put(ks_tier *t, void *buf, size_t cap) {
    file_tier *ft = (file_tier *)t;
    if (!buf) return;
    pthread_mutex_lock(&ft->spare_mu);
    if (cap <= SPARE_MAX && (!ft->spare || cap > ft->spare_cap)) {
        void *old = ft->spare;
        ft->spare = buf;
        ft->spare_cap = cap;
        buf = old;
    }
    pthread_mutex_unlock(&ft->spare_mu);
    free(buf);
}

/* Prewarmed at most: the largest state a slot can hold is rarely reached,
 * and faulting it in costs memory and ~0.5 s per GiB at start, per tier; a
 * larger state's buffer is kept after its first restore (SPARE_MAX). */
#define PREWARM_MAX ((size_t)1 << 30)

void ks_tier_file_prewarm(ks_tier *t, size_t bytes) {
    if (!t || t->id == KS_TIER_RAM || bytes == 0) return;
    if (bytes > PREWARM_MAX) bytes = PREWARM_MAX;
    file_tier *ft = (file_tier *)t;
    pthread_mutex_lock(&ft->spare_mu);
    bool have = ft->spare && ft->spare_cap >= bytes;
    pthread_mutex_unlock(&ft->spare_mu);
    if (have) return;
    uint8_t *buf = malloc(bytes);
    if (!buf) return;
    /* touch every page now: a fresh buffer's first fill costs ~12 us a page in
     * faults (docs/LLAMA_FACTS.md), ~70 ms for a 22 MB state */
    for (size_t i = 0; i < bytes; i += 4096) buf[i] = 0;
    buf[bytes - 1] = 0;
    spare_put(t, buf, bytes);
}

/* ks_tier_blob.release_ of the blobs file_get hands out: the read buffer
 * goes back to its tier (which is still open: tier.h). */
static void blob_release(ks_tier_blob *b) { spare_put(b->pool_, b->owner_, b->cap_); }

static int entry_path(const ks_tier *t, const ks_key *key, char *out, size_t n) {
    return ks_kvfile_path(t->dir, key, out, n);
}

static void info_from_meta(const ks_tier *t, const ks_kvfile_meta *m, ks_tier_entry *info) {
    memset(info, 0, sizeof *info);
    info->key = m->key;
    info->n_tokens = (int)m->n_tokens;
    info->reason = (int)m->reason;
    info->bytes = m->file_size;
    info->created_us = m->created_us;
    info->last_hit_us = m->last_hit_us;
    info->hits = m->hits;
    info->pin_until_us = m->pin_until_us;
    info->state_version = m->state_version;
    memcpy(info->model_fp, m->model_fp, 32);
    memcpy(info->params_hash, m->params_hash, 32);
    info->cls = ks__tier_classify(t, m);
}

static void orphans_retry(file_tier *ft) {
    int keep = 0;
    for (int i = 0; i < ft->n_orphans; i++) {
        if (ks_sysio_unlink(ft->orphans[i]) == 0 || errno == ENOENT) continue;
        if (keep != i) memcpy(ft->orphans[keep], ft->orphans[i], PATH_MAX);
        keep++;
    }
    ft->n_orphans = keep;
}

static void orphan_add(file_tier *ft, const char *path) {
    if (!path[0]) return;
    if (ft->n_orphans < KS_MAX_ORPHANS)
        snprintf(ft->orphans[ft->n_orphans++], PATH_MAX, "%s", path);
    else
        KS_WARN("store", "too many undeletable temp files; leaving %s", path);
}

/* ------------------------------------------------------------ quarantine */
typedef struct qfile {
    char name[NAME_MAX + 1];
    struct timespec mtime;
} qfile;

static int qfile_cmp(const void *a, const void *b) {
    const qfile *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : x->mtime.tv_nsec > y->mtime.tv_nsec;
}

/* Keeps at most KS_QUARANTINE_MAX files in qdir, removing the oldest. */
static void quarantine_prune(const char *qdir) {
    DIR *d = opendir(qdir);
    qfile *v = NULL;
    size_t n = 0, cap = 0;
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char p[PATH_MAX];
        struct stat sb;
        if (snprintf(p, sizeof p, "%s/%s", qdir, de->d_name) >= (int)sizeof p) continue;
        if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            qfile *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) break;
            v = nv;
            cap = ncap;
        }
        snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
        v[n].mtime = sb.st_mtim;
        n++;
    }
    closedir(d);
    if (n > KS_QUARANTINE_MAX) {
        qsort(v, n, sizeof *v, qfile_cmp);
        for (size_t i = 0; i + KS_QUARANTINE_MAX < n; i++) {
            char p[PATH_MAX];
            if (snprintf(p, sizeof p, "%s/%s", qdir, v[i].name) < (int)sizeof p) ks_sysio_unlink(p);
        }
    }
    free(v);
}

/* Moves <dir>/<name> into <dir>/quarantine/; deletes it when that fails. */
static void quarantine_file(const char *dir, const char *name) {
    char src[PATH_MAX], qdir[PATH_MAX], dst[PATH_MAX];
    if (snprintf(src, sizeof src, "%s/%s", dir, name) >= (int)sizeof src) return;
    if (snprintf(qdir, sizeof qdir, "%s/quarantine", dir) >= (int)sizeof qdir) return;
    int w = snprintf(dst, sizeof dst, "%s/%s.%lld.%ld", qdir, name, (long long)ks_wall_us(),
                     (long)getpid());
    if (ks_sysio_mkdir(qdir, 0700) != 0 && errno != EEXIST) w = -1;
    if (w < 0 || (size_t)w >= sizeof dst || ks_sysio_rename(src, dst) != 0) {
        if (errno == ENOENT) return;
        /* A bad file must not stay under its final name. */
        if (ks_sysio_unlink(src) != 0 && errno != ENOENT)
            KS_WARN("store", "cannot quarantine or remove bad file %s: %s", src, strerror(errno));
        return;
    }
    KS_WARN("store", "quarantined bad cache file %s -> %s", src, dst);
    quarantine_prune(qdir);
}

/* ------------------------------------------------------------------ scan */
static bool temp_is_stale(const char *dir, const char *name) {
    pid_t pid = 0;
    char p[PATH_MAX];
    struct stat sb;
    if (!ks_kvfile_temp_parse(name, &pid)) return false;
    if (pid == getpid()) return false; /* a save of this process may be in flight */
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p || lstat(p, &sb) != 0) return false;
    return (int64_t)time(NULL) - (int64_t)sb.st_mtim.tv_sec > KS_TEMP_MAX_AGE_S;
}

/* Records that the store file name of key (path) is not a regular file and
 * was skipped: counted and logged when the last scan did not skip it too.
 * Caller holds scan_mu; *now collects this scan's skipped names. */
static void note_skipped(file_tier *ft, ks_keymap *now, const ks_key *key, const char *path) {
    if (ks_keymap_get(&ft->skipped, key) == NULL) {
        atomic_fetch_add(&ft->base.n_skipped, 1);
        KS_WARN("store", "skipping %s: not a regular file", path);
    }
    if (ks_keymap_put(now, key, (void *)1) != 0) {
        /* Out of memory: the name may be counted again next time, no worse. */
    }
}

/* Scans the directory. cleanup: remove dead temps and quarantine bad files
 * (owner thread only). Returns the number of entries added or a KS_E*. */
static int scan(file_tier *ft, bool force, bool cleanup) {
    ks_tier *t = &ft->base;
    int rc = 0, added = 0;
    DIR *d = NULL;
    ks_keymap seen = {0}, skipped = {0};
    bool listed = false;
    struct stat sb;
    uint64_t start_seq;

    if (cleanup)
        pthread_mutex_lock(&ft->scan_mu);
    else if (pthread_mutex_trylock(&ft->scan_mu) != 0)
        return 0; /* another thread is scanning right now */
    if (stat(t->dir, &sb) != 0) {
        rc = errno == ENOENT ? KS_ENOENT : KS_EIO;
        goto done;
    }
    if (!force && ft->scanned && sb.st_mtim.tv_sec == ft->dir_mtime.tv_sec &&
        sb.st_mtim.tv_nsec == ft->dir_mtime.tv_nsec)
        goto done;
    /* Recorded before reading: a change during the readdir shows up as a
     * newer mtime at the next check. */
    ft->dir_mtime = sb.st_mtim;
    /* File times have the kernel's coarse clock (a tick): a file linked in the
     * same tick right after this stat would leave the mtime unchanged. An
     * mtime that recent is not trusted ("racy git"): the next check scans. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t age_ms = ((int64_t)now.tv_sec - sb.st_mtim.tv_sec) * 1000 +
                     ((int64_t)now.tv_nsec - sb.st_mtim.tv_nsec) / 1000000;
    ft->scanned = age_ms > 100;
    pthread_rwlock_rdlock(&t->lock);
    start_seq = t->seq;
    pthread_rwlock_unlock(&t->lock);

    if (!(d = opendir(t->dir))) {
        rc = errno == ENOENT ? KS_ENOENT : KS_EIO;
        goto done;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        ks_key key;
        if (!ks_kvfile_name_parse(de->d_name, &key)) {
            if (cleanup && temp_is_stale(t->dir, de->d_name)) {
                char p[PATH_MAX];
                if (snprintf(p, sizeof p, "%s/%s", t->dir, de->d_name) < (int)sizeof p) {
                    KS_INFO("store", "removing stale temp file %s", p);
                    ks_sysio_unlink(p);
                }
            }
            continue;
        }
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", t->dir, de->d_name) >= (int)sizeof path) continue;
        /* Not a regular file, as the directory entry says: not even opened.
         * Left out of `seen`, so an entry indexed under that name before
         * (its file since replaced) is forgotten below. */
        if (de->d_type != DT_UNKNOWN && de->d_type != DT_REG) {
            note_skipped(ft, &skipped, &key, path);
            continue;
        }
        if (ks_keymap_put(&seen, &key, (void *)1) != 0) {
            rc = KS_ENOMEM;
            goto done;
        }
        pthread_rwlock_rdlock(&t->lock);
        bool known = ks_keymap_get(&t->map, &key) != NULL;
        pthread_rwlock_unlock(&t->lock);
        if (known) continue;

        ks_kvfile_meta m;
        int r = ks_kvfile_read_meta(path, &m);
        if (r == 0 && !ks_key_eq(&m.key, &key)) r = KS_ECORRUPT; /* renamed or swapped file */
        if (r == KS_ENOENT) continue;
        if (r == KS_EINVAL) { /* not a regular file (a filesystem without d_type) */
            note_skipped(ft, &skipped, &key, path);
            continue;
        }
        if (r != 0) {
            /* Files of another format version belong to another kvstash:
             * leave them alone. Bad files are moved aside by the owner. */
            if (r == KS_EVERSION) {
                KS_DEBUG("store", "ignoring %s: format version %u", path, m.version);
            } else if (cleanup && r == KS_ECORRUPT) {
                t->n_bad++;
                quarantine_file(t->dir, de->d_name);
            } else {
                KS_DEBUG("store", "skipping %s: %s", path, ks_strerror(r));
            }
            continue;
        }
        ks_tier_entry info;
        info_from_meta(t, &m, &info);
        pthread_rwlock_wrlock(&t->lock);
        int ir = ks_keymap_get(&t->map, &key) ? 0 : ks__tier_insert_locked(t, &info, NULL, NULL);
        pthread_rwlock_unlock(&t->lock);
        if (ir != 0) {
            rc = ir;
            goto done;
        }
        added++;
    }
    listed = true;
    /* Forget entries whose file vanished, unless they were added after the
     * listing started (our own save that the listing may have missed). */
    pthread_rwlock_wrlock(&t->lock);
    for (size_t i = 0; i < t->map.cap; i++) {
        if (!ks_keymap_live(&t->map, i)) continue;
        ks__tentry *e = t->map.vals[i];
        if (e->ins > start_seq || ks_keymap_get(&seen, &e->info.key)) continue;
        free(ks__tier_unlink_locked(t, &e->info.key));
    }
    pthread_rwlock_unlock(&t->lock);
done:
    if (d) closedir(d);
    ks_keymap_free(&seen);
    if (listed) { /* this scan's skipped names replace the last one's */
        ks_keymap_free(&ft->skipped);
        ft->skipped = skipped;
    } else {
        ks_keymap_free(&skipped);
    }
    pthread_mutex_unlock(&ft->scan_mu);
    return rc ? rc : added;
}

/* ------------------------------------------------------------------- ops */
static int file_put(ks_tier *t, const ks_kvfile_meta *m, const int32_t *tokens, int n,
                    uint8_t **payload, size_t len, bool *existed) {
    file_tier *ft = (file_tier *)t;
    int rc = 0;
    char orphan[PATH_MAX], path[PATH_MAX];
    uint64_t bytes = 0;
    bool ex = false;
    if (existed) *existed = false;
    orphans_retry(ft);
    if (!payload || entry_path(t, &m->key, path, sizeof path) != 0) return KS_EINVAL;
    ks_tier_entry cur_e;
    if (ks_tier_has(t, &m->key, &cur_e)) {
        if (cur_e.cls == KS_ENTRY_OWN) {
            if (existed) *existed = true;
            return 0;
        }
        /* A stale state (another llama state version) under our key: it can
         * never be used again and is replaced below (the link finds it). */
        if (ks_tier_mark_bad(t, &m->key)) t->n_bad++;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = ks_kvfile_write(t->dir, m, tokens, n, *payload, len, &ex, &bytes, orphan);
        orphan_add(ft, orphan);
        if (rc != 0 || !ex) break;
        /* A file already has this name: another process saved the same
         * state (a dedup), or a bad/stale file sits there, which must go. */
        ks_kvfile_meta cur;
        int r = ks_kvfile_read_meta(path, &cur);
        pthread_rwlock_rdlock(&t->lock);
        ks__tentry *ce = ks_keymap_get(&t->map, &m->key);
        bool known_bad = ce && ce->bad;
        pthread_rwlock_unlock(&t->lock);
        /* With a secret, a file without a tag is no copy of this state: it
         * would be refused at its first lookup, so it is replaced now. */
        if (r == 0 && !known_bad && ks_key_eq(&cur.key, &m->key) &&
            ks__tier_classify(t, &cur) == KS_ENTRY_OWN && (!m->mac || (cur.flags & KS_KVFILE_FLAG_MAC))) {
            ks_tier_entry info;
            info_from_meta(t, &cur, &info);
            pthread_rwlock_wrlock(&t->lock);
            if (!ks_keymap_get(&t->map, &m->key)) ks__tier_insert_locked(t, &info, NULL, NULL);
            pthread_rwlock_unlock(&t->lock);
            if (existed) *existed = true;
            return 0;
        }
        if (r == KS_ENOENT) continue; /* it just vanished: try again */
        /* Not a regular file under our name: not a bad kvfile, and not ours
         * to move (scans skip it). This tier cannot hold the state. */
        if (r == KS_EINVAL) return KS_EIO;
        pthread_rwlock_wrlock(&t->lock);
        ce = ks_keymap_get(&t->map, &m->key);
        if (ce) ce->bad = true;
        pthread_rwlock_unlock(&t->lock);
        char name[KS_KVFILE_NAME_LEN + 1];
        snprintf(name, sizeof name, "%s", strrchr(path, '/') + 1);
        if (r == KS_ECORRUPT && !known_bad) t->n_bad++;
        quarantine_file(t->dir, name);
        ks__tier_forget_bad(t, &m->key, 1);
    }
    if (rc == 0 && ex) rc = KS_EIO; /* could not clear the name twice in a row */
    if (rc != 0) return rc;
    ks_kvfile_meta pm = *m;
    pm.n_tokens = (uint32_t)n;
    pm.payload_len = len;
    pm.file_size = bytes;
    pm.last_hit_us = m->created_us;
    pm.hits = 0;
    ks_tier_entry info;
    info_from_meta(t, &pm, &info);
    pthread_rwlock_wrlock(&t->lock);
    rc = ks_keymap_get(&t->map, &m->key) ? 0 : ks__tier_insert_locked(t, &info, NULL, NULL);
    pthread_rwlock_unlock(&t->lock);
    return rc;
}

static int file_get(ks_tier *t, const ks_key *key, const ks_kvfile_expect *exp, ks_tier_blob *out) {
    char path[PATH_MAX];
    uint8_t *payload = NULL;
    ks_kvfile_meta m;
    ks_tier_entry info;
    memset(out, 0, sizeof *out);
    if (!ks_tier_has(t, key, &info)) return KS_ENOENT;
    if (info.cls == KS_ENTRY_FOREIGN) return KS_ENOENT;
    if (info.cls == KS_ENTRY_STALE) return KS_EVERSION;
    if (entry_path(t, key, path, sizeof path) != 0) return KS_EINVAL;
    file_tier *ft = (file_tier *)t;
    size_t cap = 0;
    pthread_mutex_lock(&ft->spare_mu);
    payload = ft->spare;
    cap = ft->spare_cap;
    ft->spare = NULL;
    ft->spare_cap = 0;
    pthread_mutex_unlock(&ft->spare_mu);
    int rc = ks_kvfile_read_buf(path, exp, &m, &payload, &cap);
    if (rc != 0) spare_put(t, payload, cap);
    if (rc == KS_EINVAL) {
        /* Replaced by something that is not a regular file since it was
         * indexed: forget it as if it had vanished (it is not ours to
         * quarantine). The next scan counts and logs the name. */
        KS_DEBUG("store", "%s is no longer a regular file: forgotten", path);
        rc = KS_ENOENT;
    }
    if (rc == KS_ENOENT) {
        /* Removed by another process: forget it (no file to touch). */
        pthread_rwlock_wrlock(&t->lock);
        free(ks__tier_unlink_locked(t, key));
        pthread_rwlock_unlock(&t->lock);
        return KS_ENOENT;
    }
    if (rc != 0) return rc;
    out->payload = payload;
    out->len = (size_t)m.payload_len;
    out->owner_ = payload;
    out->release_ = blob_release;
    out->pool_ = t;
    out->cap_ = cap;
    ks__tier_touch(t, key);
    return 0;
}

static int file_drop(ks_tier *t, const ks_key *key, void *blob) {
    char path[PATH_MAX];
    if (entry_path(t, key, path, sizeof path) != 0) return KS_EINVAL;
    if (ks_sysio_unlink(path) != 0 && errno != ENOENT) {
        KS_WARN("store", "cannot remove %s: %s", path, strerror(errno));
        return KS_EIO;
    }
    return 0;
}

static int file_quarantine(ks_tier *t, const ks_key *key) {
    char hex[KS_KEY_HEX_LEN + 1], name[KS_KVFILE_NAME_LEN + 1];
    pthread_rwlock_rdlock(&t->lock);
    ks__tentry *e = ks_keymap_get(&t->map, key);
    bool bad = e && e->bad;
    pthread_rwlock_unlock(&t->lock);
    if (!bad) return 0;
    ks_key_to_hex(key, hex);
    snprintf(name, sizeof name, "%s%s", hex, KS_KVFILE_EXT);
    quarantine_file(t->dir, name);
    ks__tier_forget_bad(t, key, 1);
    return 0;
}

static int file_rescan(ks_tier *t, unsigned flags) {
    return scan((file_tier *)t, (flags & KS_RESCAN_FORCE) != 0, (flags & KS_RESCAN_CLEANUP) != 0);
}

static void file_persist(ks_tier *t) {
    file_tier *ft = (file_tier *)t;
    typedef struct { ks_key key; int64_t last; uint64_t hits; int64_t pin; } upd;
    upd *v = NULL;
    size_t n = 0;
    orphans_retry(ft);
    pthread_rwlock_wrlock(&t->lock);
    for (size_t i = 0; i < t->map.cap; i++) {
        if (!ks_keymap_live(&t->map, i)) continue;
        ks__tentry *e = t->map.vals[i];
        if (!e->dirty || e->bad) continue;
        if (!v && !(v = malloc(t->map.n * sizeof *v))) break;
        v[n].key = e->info.key;
        v[n].last = e->info.last_hit_us;
        v[n].hits = e->info.hits;
        v[n].pin = e->info.pin_until_us;
        n++;
        e->dirty = false;
    }
    pthread_rwlock_unlock(&t->lock);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        if (entry_path(t, &v[i].key, path, sizeof path) != 0) continue;
        int rc = ks_kvfile_touch(path, v[i].last, v[i].hits, v[i].pin);
        if (rc != 0 && rc != KS_ENOENT) KS_DEBUG("store", "touch %s: %s", path, ks_strerror(rc));
    }
    free(v);
}

static int file_reload_pin(ks_tier *t, const ks_key *key, int64_t *pin_until_us) {
    char path[PATH_MAX];
    ks_kvfile_meta m;
    if (entry_path(t, key, path, sizeof path) != 0) return KS_EINVAL;
    int rc = ks_kvfile_read_meta(path, &m);
    if (rc == 0) *pin_until_us = m.pin_until_us;
    return rc;
}

static void file_close(ks_tier *t) {
    file_tier *ft = (file_tier *)t;
    orphans_retry(ft);
    ks__tier_fini(t);
    ks_keymap_free(&ft->skipped);
    pthread_mutex_destroy(&ft->scan_mu);
    pthread_mutex_destroy(&ft->spare_mu);
    free(ft->spare);
    free(ft);
}

static const ks_tier_vt file_vt = {
    .put = file_put,
    .get = file_get,
    .drop = file_drop,
    .quarantine = file_quarantine,
    .rescan = file_rescan,
    .persist = file_persist,
    .reload_pin = file_reload_pin,
    .close = file_close,
};

/* mkdir -p with mode 0700 for every created component. */
static int mkdirs(const char *dir) {
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return -1;
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (ks_sysio_mkdir(p, 0700) != 0 && errno != EEXIST) return -1;
        p[i] = c;
    }
    return 0;
}

int ks_tier_file_open(ks_tier_id id, const char *dir, unsigned flags, const ks_tier_ident *ident,
                      ks_tier **out, char *err, size_t errlen) {
    int rc = 0;
    file_tier *ft = NULL;
    struct stat sb;
    *out = NULL;
    if (!dir || !dir[0] || strlen(dir) >= KS_MAX_PATH || (id != KS_TIER_SHM && id != KS_TIER_DISK)) {
        ks_set_err(err, errlen, "invalid cache directory");
        return KS_EINVAL;
    }
    if ((flags & KS_TIER_CREATE) && mkdirs(dir) != 0) {
        int e = errno;
        ks_set_err(err, errlen, "cannot create %s: %s", dir, strerror(e));
        return ks_errno_map(e) == KS_ENOSPC ? KS_ENOSPC : KS_EIO;
    }
    if (stat(dir, &sb) != 0) {
        int e = errno;
        ks_set_err(err, errlen, "%s: %s", dir, strerror(e));
        return e == ENOENT ? KS_ENOENT : KS_EIO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        ks_set_err(err, errlen, "%s is not a directory", dir);
        return KS_EINVAL;
    }
    /* /dev/shm is world-writable: a directory someone else created under our
     * name could feed us files. Only use directories we own. */
    if (sb.st_uid != geteuid()) {
        ks_set_err(err, errlen, "%s is owned by uid %u, not by us (uid %u)", dir,
                   (unsigned)sb.st_uid, (unsigned)geteuid());
        return KS_EINVAL;
    }
    /* Ours, but one others may write to: another user could plant entries
     * (without a cache secret, restored as ours). Made private (0700), with
     * a line in the log; refused when that fails. Entries of other owners
     * already there are never read (kvfile.c, open_existing). */
    if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
        if (chmod(dir, 0700) != 0) {
            int e = errno;
            ks_set_err(err, errlen, "%s is writable by %s and cannot be made private: %s", dir,
                       sb.st_mode & S_IWOTH ? "others" : "its group", strerror(e));
            return KS_EINVAL;
        }
        KS_WARN("store", "%s was writable by %s (mode %03o): made private (0700)", dir,
                sb.st_mode & S_IWOTH ? "others" : "its group", (unsigned)(sb.st_mode & 0777));
    }
    if (!(ft = calloc(1, sizeof *ft))) return KS_ENOMEM;
    if (ks__tier_init(&ft->base, &file_vt, id, ident) != 0) {
        free(ft);
        return KS_ENOMEM;
    }
    pthread_mutex_init(&ft->scan_mu, NULL);
    pthread_mutex_init(&ft->spare_mu, NULL);
    snprintf(ft->base.dir, sizeof ft->base.dir, "%s", dir);
    rc = scan(ft, true, (flags & KS_TIER_CLEANUP) != 0);
    if (rc < 0) {
        ks_set_err(err, errlen, "scanning %s: %s", dir, ks_strerror(rc));
        file_close(&ft->base);
        return rc;
    }
    *out = &ft->base;
    return 0;
}

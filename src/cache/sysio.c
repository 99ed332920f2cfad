/*
 * sysio.c — see sysio.h.
 *
 * The fault state is a handful of atomics: `armed` is checked first with a
 * relaxed load so that the normal path costs nothing more. When armed, the
 * countdown is decremented atomically so exactly one call (the nth) fires,
 * even with several threads doing I/O.
 */
#include "cache/sysio.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

static _Atomic long g_count[KS_SYSIO__N];
static _Atomic int g_armed;      /* 0: no fault */
static _Atomic int g_op;
static _Atomic long g_left;      /* calls of g_op before the faulty one */
static _Atomic int g_action;
static _Atomic int g_err;
static _Atomic int g_sticky;
static _Atomic int g_fired;

void ks_sysio_fault_set(ks_sysio_op op, long nth, ks_sysio_action action, int err, bool sticky) {
    atomic_store(&g_armed, 0);
    atomic_store(&g_op, (int)op);
    atomic_store(&g_left, nth < 1 ? 1 : nth);
    atomic_store(&g_action, (int)action);
    atomic_store(&g_err, err ? err : EIO);
    atomic_store(&g_sticky, sticky ? 1 : 0);
    atomic_store(&g_fired, 0);
    atomic_store(&g_armed, 1);
}

void ks_sysio_fault_clear(void) {
    atomic_store(&g_armed, 0);
    atomic_store(&g_fired, 0);
}

bool ks_sysio_fault_fired(void) { return atomic_load(&g_fired) != 0; }

long ks_sysio_count(ks_sysio_op op) {
    return (op >= 0 && op < KS_SYSIO__N) ? atomic_load(&g_count[op]) : 0;
}

const char *ks_sysio_op_name(ks_sysio_op op) {
    static const char *names[KS_SYSIO__N] = {"open",   "write", "pwrite", "pread",
                                             "fsync",  "rename", "link",  "unlink",
                                             "close",  "mkdir"};
    return (op >= 0 && op < KS_SYSIO__N) ? names[op] : "?";
}

static _Atomic int g_hold = -1; /* the held op, -1: none */
static _Atomic int g_held;       /* callers blocked now */
static pthread_mutex_t g_hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hold_cv = PTHREAD_COND_INITIALIZER;

void ks_sysio_hold(ks_sysio_op op) { atomic_store(&g_hold, (int)op); }

void ks_sysio_release(void) {
    pthread_mutex_lock(&g_hold_mu);
    atomic_store(&g_hold, -1);
    pthread_cond_broadcast(&g_hold_cv);
    pthread_mutex_unlock(&g_hold_mu);
}

int ks_sysio_held(void) { return atomic_load(&g_held); }

static void maybe_hold(ks_sysio_op op) {
    if (atomic_load_explicit(&g_hold, memory_order_relaxed) != (int)op) return;
    pthread_mutex_lock(&g_hold_mu);
    atomic_fetch_add(&g_held, 1);
    while (atomic_load(&g_hold) == (int)op) pthread_cond_wait(&g_hold_cv, &g_hold_mu);
    atomic_fetch_sub(&g_held, 1);
    pthread_mutex_unlock(&g_hold_mu);
}

/* Returns 0: no fault; 1: fail; 2: short write. */
static int check(ks_sysio_op op) {
    atomic_fetch_add_explicit(&g_count[op], 1, memory_order_relaxed);
    maybe_hold(op);
    if (!atomic_load_explicit(&g_armed, memory_order_relaxed)) return 0;
    if (atomic_load(&g_op) != (int)op) return 0;
    if (atomic_load(&g_fired) && atomic_load(&g_sticky))
        return atomic_load(&g_action) == KS_SYSIO_SHORT ? 2 : 1;
    if (atomic_fetch_sub(&g_left, 1) != 1) return 0;
    atomic_store(&g_fired, 1);
    if (!atomic_load(&g_sticky)) atomic_store(&g_armed, 0);
    return atomic_load(&g_action) == KS_SYSIO_SHORT ? 2 : 1;
}

static int fail(void) {
    errno = atomic_load(&g_err);
    return -1;
}

int ks_sysio_open(const char *path, int flags, mode_t mode) {
    if (check(KS_SYSIO_OPEN)) return fail();
    return open(path, flags, mode);
}

ssize_t ks_sysio_write(int fd, const void *buf, size_t n) {
    int f = check(KS_SYSIO_WRITE);
    if (f == 1) return fail();
    if (f == 2 && n > 1) return write(fd, buf, n / 2);
    if (f == 2) return fail();
    return write(fd, buf, n);
}

ssize_t ks_sysio_pwrite(int fd, const void *buf, size_t n, off_t off) {
    int f = check(KS_SYSIO_PWRITE);
    if (f == 1) return fail();
    if (f == 2 && n > 1) return pwrite(fd, buf, n / 2, off);
    if (f == 2) return fail();
    return pwrite(fd, buf, n, off);
}

ssize_t ks_sysio_pread(int fd, void *buf, size_t n, off_t off) {
    int f = check(KS_SYSIO_PREAD);
    if (f == 1) return fail();
    if (f == 2 && n > 1) return pread(fd, buf, n / 2, off);
    if (f == 2) return fail();
    return pread(fd, buf, n, off);
}

int ks_sysio_fsync(int fd) {
    if (check(KS_SYSIO_FSYNC)) return fail();
    return fsync(fd);
}

int ks_sysio_rename(const char *from, const char *to) {
    if (check(KS_SYSIO_RENAME)) return fail();
    return rename(from, to);
}

int ks_sysio_link(const char *from, const char *to) {
    if (check(KS_SYSIO_LINK)) return fail();
    return link(from, to);
}

int ks_sysio_unlink(const char *path) {
    if (check(KS_SYSIO_UNLINK)) return fail();
    return unlink(path);
}

int ks_sysio_close(int fd) {
    /* A faulty close still releases the descriptor, as close(2) does on
     * Linux even when it reports an error: never leak it. */
    if (check(KS_SYSIO_CLOSE)) {
        int e = atomic_load(&g_err);
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

int ks_sysio_mkdir(const char *path, mode_t mode) {
    if (check(KS_SYSIO_MKDIR)) return fail();
    return mkdir(path, mode);
}

int ks_sysio_write_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = ks_sysio_write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

ssize_t ks_sysio_pread_all(int fd, void *buf, size_t n, off_t off) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = ks_sysio_pread(fd, p + done, n - done, off + (off_t)done);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

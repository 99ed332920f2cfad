/*
 * sysio.h — the system calls of the persistent store, behind one indirection
 * so that tests can make any of them fail (the SQLite "VFS" idea, reduced to
 * what kvstash needs).
 *
 * Every function behaves exactly like the POSIX call of the same name
 * (return value and errno), except that an armed fault makes the Nth call of
 * an operation fail:
 *   - KS_SYSIO_FAIL:  return -1 with errno = the given value (ENOSPC, EIO...)
 *   - KS_SYSIO_SHORT: write/pwrite transfer only part of the buffer (at
 *     least 1 byte, less than asked) and return that count, as a real disk
 *     does before it reports ENOSPC; other operations fail with errno.
 * With `sticky` the fault stays on for every later call of that operation
 * (a disk that stays full) until ks_sysio_fault_clear().
 *
 * Invariants
 *  1. With no fault armed and nothing held, each wrapper is the plain system
 *     call plus one relaxed atomic increment (the per-operation call counter)
 *     and two relaxed loads.
 *  2. A fault fires on exactly one call (or every call from then on when
 *     sticky), whichever thread makes it.
 *
 * Thread model: all functions are thread-safe. The fault hook is global to the
 * process; tests arm it and then drive the code under test.
 */
#ifndef KS_SYSIO_H
#define KS_SYSIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    KS_SYSIO_OPEN = 0,
    KS_SYSIO_WRITE,
    KS_SYSIO_PWRITE,
    KS_SYSIO_PREAD,
    KS_SYSIO_FSYNC,
    KS_SYSIO_RENAME,
    KS_SYSIO_LINK,
    KS_SYSIO_UNLINK,
    KS_SYSIO_CLOSE,
    KS_SYSIO_MKDIR,
    KS_SYSIO__N
} ks_sysio_op;

typedef enum { KS_SYSIO_FAIL = 0, KS_SYSIO_SHORT } ks_sysio_action;

int ks_sysio_open(const char *path, int flags, mode_t mode);
ssize_t ks_sysio_write(int fd, const void *buf, size_t n);
ssize_t ks_sysio_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t ks_sysio_pread(int fd, void *buf, size_t n, off_t off);
int ks_sysio_fsync(int fd);
int ks_sysio_rename(const char *from, const char *to);
int ks_sysio_link(const char *from, const char *to);
int ks_sysio_unlink(const char *path);
int ks_sysio_close(int fd);
int ks_sysio_mkdir(const char *path, mode_t mode);

/* Loops over short writes until n bytes are written: 0, or -1 with errno
 * (a zero-byte write counts as EIO). */
int ks_sysio_write_all(int fd, const void *buf, size_t n);
/* Loops over short reads: returns bytes read (< n only at end of file) or -1. */
ssize_t ks_sysio_pread_all(int fd, void *buf, size_t n, off_t off);

/* ------------------------------------------------------------- test hook */
/* Arms a fault on the nth (1-based, counted from now) call of op.
 * err: the errno to report (ignored for a short write). */
void ks_sysio_fault_set(ks_sysio_op op, long nth, ks_sysio_action action, int err, bool sticky);
void ks_sysio_fault_clear(void);
/* true once the armed fault has fired (for tests to know a step was reached). */
bool ks_sysio_fault_fired(void);
/* Calls of op since the process started. */
long ks_sysio_count(ks_sysio_op op);
const char *ks_sysio_op_name(ks_sysio_op op);

/* Holds every call of op from now on: the calling thread blocks (before the
 * call) until ks_sysio_release(). ks_sysio_held() tells how many callers are
 * blocked now, so a test knows a step was reached (e.g. the store's writer
 * thread inside a save). */
void ks_sysio_hold(ks_sysio_op op);
void ks_sysio_release(void);
int ks_sysio_held(void);

#endif

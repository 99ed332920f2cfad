/*
 * base.h — errors, logging, time and the token vector shared by every layer.
 *
 * Owns nothing global except the log level and log sink (set once at start,
 * read by every thread). Thread model: every function here is thread-safe;
 * ks_tokens values are owned by one thread at a time.
 *
 * Errors: functions return 0 on success and a negative KS_E* code on failure.
 * All codes come from one table (KS_ERRNO_MAP) so that ks_strerror() and the
 * enum can never disagree.
 */
#ifndef KS_BASE_H
#define KS_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvstash.h" /* KS_E* codes and ks_strerror() are public */

/* ------------------------------------------------------------------- errors */
/* The one errno -> KS_E* mapping of the project:
 *   ENOSPC, EDQUOT    -> KS_ENOSPC
 *   ENOMEM            -> KS_ENOMEM
 *   ENOENT, ENOTDIR   -> KS_ENOENT  (nothing at that path: a missing
 *                                    component, or one that is a file)
 *   anything else     -> KS_EIO     (EACCES, EPERM, EIO, ...; also 0)
 * A caller for whom a code means something else adjusts the result (a
 * writer whose directory vanished reports KS_EIO, not KS_ENOENT). Pure. */
int ks_errno_map(int e);

/* --------------------------------------------------------------- invariants */
/* KS_ASSERT(cond): checks one of the numbered invariants the module design
 * blocks state (STYLE.md "Errors"; SQLite's assert( assert_pager_state(p) )).
 * On wherever NDEBUG is not defined — the Debug builds, among them the test
 * builds (make test-asan, test-tsan, fuzz) — and wherever KS_ASSERTS is
 * (cmake -DKS_ASSERTS=ON); off in the release builds, where cond is not
 * evaluated, so a check may cost what it costs (a walk over a table). A
 * failure prints the condition, file, line and function and aborts. Never
 * for bytes from disk or the network: those are checked and refused. */
#if !defined(NDEBUG) || defined(KS_ASSERTS)
#define KS_ASSERTS_ON 1
#define KS_ASSERT(cond) ((cond) ? (void)0 : ks__assert_fail(#cond, __FILE__, __LINE__, __func__))
#else
#define KS_ASSERTS_ON 0
#define KS_ASSERT(cond) ((void)0)
#endif
void ks__assert_fail(const char *cond, const char *file, int line, const char *func) __attribute__((noreturn));

/* ------------------------------------------------------------------ logging */
typedef enum { KS_LOG_DEBUG = 0, KS_LOG_INFO, KS_LOG_WARN, KS_LOG_ERROR, KS_LOG_OFF } ks_log_level;

void ks_log_set_level(ks_log_level level);
ks_log_level ks_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns -1 when unknown. */
int ks_log_parse_level(const char *s);
void ks_log(ks_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define KS_DEBUG(mod, ...) do { if (ks_log_get_level() <= KS_LOG_DEBUG) ks_log(KS_LOG_DEBUG, mod, __VA_ARGS__); } while (0)
#define KS_INFO(mod, ...)  ks_log(KS_LOG_INFO, mod, __VA_ARGS__)
#define KS_WARN(mod, ...)  ks_log(KS_LOG_WARN, mod, __VA_ARGS__)
#define KS_ERROR(mod, ...) ks_log(KS_LOG_ERROR, mod, __VA_ARGS__)

/* --------------------------------------------------------------------- time */
/* Monotonic clock in milliseconds / microseconds. */
double ks_now_ms(void);
int64_t ks_now_us(void);
/* *ts = the monotonic clock ms milliseconds from now: the deadline of a
 * pthread_cond_timedwait on a condition variable made with CLOCK_MONOTONIC. */
struct timespec;
void ks_deadline_ms(struct timespec *ts, int64_t ms);
/* Wall clock, seconds / microseconds since the epoch. */
int64_t ks_wall_s(void);
int64_t ks_wall_us(void);

/* ------------------------------------------------------------------- random */
/* Fills buf[0, n) with random bytes: the kernel's (getrandom, never waiting
 * for entropy), or when it has none to give, a splitmix64 stream seeded from
 * both clocks, the pid and a process-wide counter: distinct on every call,
 * not secret. Ids, nonces and sampling seeds; never keys. Thread-safe. */
void ks_random_bytes(void *buf, size_t n);
/* Fills buf[0, n) from the system's CSPRNG (getrandom, waiting only while the
 * kernel's pool is not yet initialised at boot; /dev/urandom where getrandom
 * is missing). Secrets and ids a client must not guess (ks_api_make_id).
 * 0, or KS_EIO when neither could give the bytes (buf is then unusable).
 * Thread-safe. */
int ks_random_secure(void *buf, size_t n);
uint64_t ks_random_u64(void);

/* ----------------------------------------------------------- token vectors */
/* A growable array of token ids. Zero-initialised is an empty vector.
 * Owned: free with ks_tokens_free(). Not thread-safe. */
typedef struct ks_tokens {
    int32_t *v;
    int n;
    int cap;
} ks_tokens;

int ks_tokens_reserve(ks_tokens *t, int cap);          /* 0 or KS_ENOMEM */
int ks_tokens_push(ks_tokens *t, int32_t tok);         /* 0 or KS_ENOMEM */
int ks_tokens_append(ks_tokens *t, const int32_t *v, int n);
int ks_tokens_assign(ks_tokens *t, const int32_t *v, int n);
void ks_tokens_truncate(ks_tokens *t, int n);          /* keeps [0, n) */
void ks_tokens_free(ks_tokens *t);

/* ------------------------------------------------------------ small helpers */
/* snprintf into err (may be NULL) — the common "message out-parameter". */
void ks_set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* strdup that returns NULL on NULL input. */
char *ks_strdup(const char *s);
/* A growable string buffer. Zero-initialised is empty; s is always NUL-terminated
 * once anything was appended. Owned: free with ks_buf_free(). */
typedef struct ks_buf {
    char *s;
    size_t len;
    size_t cap;
} ks_buf;
int ks_buf_append(ks_buf *b, const char *s, size_t n);
int ks_buf_printf(ks_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ks_buf_reset(ks_buf *b);
void ks_buf_free(ks_buf *b);

#endif

/*
 * base.c — see base.h.
 */
#include "base/base.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

/* ------------------------------------------------------------------- errors */
const char *ks_strerror(int err) {
    switch (err) {
#define KS_STRERROR_CASE(name, val, msg) case KS_##name: return msg;
        KS_ERRNO_MAP(KS_STRERROR_CASE)
#undef KS_STRERROR_CASE
    case 0: return "success";
    default: return "unknown error";
    }
}

const char *ks_errname(int err) {
    switch (err) {
#define KS_ERRNAME_CASE(name, val, msg) case KS_##name: return #name;
        KS_ERRNO_MAP(KS_ERRNAME_CASE)
#undef KS_ERRNAME_CASE
    case 0: return "OK";
    default: return "EUNKNOWN";
    }
}

int ks_errno_map(int e) {
    switch (e) {
    case ENOSPC:
#ifdef EDQUOT
    case EDQUOT:
#endif
        return KS_ENOSPC;
    case ENOMEM: return KS_ENOMEM;
    case ENOENT:
    case ENOTDIR: return KS_ENOENT;
    default: return KS_EIO;
    }
}

/* ------------------------------------------------------------------ logging */
static _Atomic int g_level = KS_LOG_INFO;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

void ks_log_set_level(ks_log_level level) { atomic_store(&g_level, (int)level); }
ks_log_level ks_log_get_level(void) { return (ks_log_level)atomic_load(&g_level); }

int ks_log_parse_level(const char *s) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (s && strcmp(s, names[i]) == 0) return i;
    return -1;
}

void ks_log(ks_log_level level, const char *module, const char *fmt, ...) {
    if (level < ks_log_get_level()) return;
    static const char tag[] = "DIWE";
    int saved = errno;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char line[4096];
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %c %-6s ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tag[level < 4 ? level : 3], module);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line under a lock so lines from threads never interleave. */
    pthread_mutex_lock(&g_log_mu);
    fprintf(stderr, "%s\n", line);
    pthread_mutex_unlock(&g_log_mu);
    errno = saved;
}

/* --------------------------------------------------------------------- time */
double ks_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void ks_deadline_ms(struct timespec *ts, int64_t ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int64_t ks_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t ks_wall_s(void) { return (int64_t)time(NULL); }

int64_t ks_wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* --------------------------------------------------------------- invariants */
void ks__assert_fail(const char *cond, const char *file, int line, const char *func) {
    fprintf(stderr, "kvstash: invariant violated: %s (%s:%d, %s)\n", cond, file, line, func);
    fflush(stderr);
    abort();
}

/* ------------------------------------------------------------------- random */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ks_random_bytes(void *buf, size_t n) {
    unsigned char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(p + got, n - got, GRND_NONBLOCK);
        if (r > 0) got += (size_t)r;
        else if (!(r < 0 && errno == EINTR)) break;
    }
    if (got == n) return;
    static _Atomic uint64_t counter;
    uint64_t x = (uint64_t)ks_now_us() ^ ((uint64_t)ks_wall_us() << 17) ^ ((uint64_t)getpid() << 45) ^
                 (atomic_fetch_add(&counter, 1) * 0xD1B54A32D192ED03ull);
    uint64_t v = 0;
    for (size_t i = got; i < n; i++) {
        if ((i - got) % 8 == 0) v = splitmix64(&x);
        p[i] = (unsigned char)(v >> (8 * ((i - got) % 8)));
    }
}

int ks_random_secure(void *buf, size_t n) {
    unsigned char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(p + got, n - got, 0);
        if (r > 0) got += (size_t)r;
        else if (!(r < 0 && errno == EINTR)) break;
    }
    if (got == n) return 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return KS_EIO;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r > 0) got += (size_t)r;
        else if (!(r < 0 && errno == EINTR)) break;
    }
    close(fd);
    return got == n ? 0 : KS_EIO;
}

uint64_t ks_random_u64(void) {
    uint64_t x;
    ks_random_bytes(&x, sizeof x);
    return x;
}

/* ----------------------------------------------------------- token vectors */
int ks_tokens_reserve(ks_tokens *t, int cap) {
    if (cap <= t->cap) return 0;
    int ncap = t->cap ? t->cap : 64;
    while (ncap < cap) ncap *= 2;
    int32_t *nv = realloc(t->v, (size_t)ncap * sizeof *nv);
    if (!nv) return KS_ENOMEM;
    t->v = nv;
    t->cap = ncap;
    return 0;
}

int ks_tokens_push(ks_tokens *t, int32_t tok) {
    int rc = ks_tokens_reserve(t, t->n + 1);
    if (rc) return rc;
    t->v[t->n++] = tok;
    return 0;
}

int ks_tokens_append(ks_tokens *t, const int32_t *v, int n) {
    if (n <= 0) return 0;
    int rc = ks_tokens_reserve(t, t->n + n);
    if (rc) return rc;
    memcpy(t->v + t->n, v, (size_t)n * sizeof *v);
    t->n += n;
    return 0;
}

int ks_tokens_assign(ks_tokens *t, const int32_t *v, int n) {
    t->n = 0;
    return ks_tokens_append(t, v, n);
}

void ks_tokens_truncate(ks_tokens *t, int n) {
    if (n < t->n) t->n = n < 0 ? 0 : n;
}

void ks_tokens_free(ks_tokens *t) {
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}

/* ------------------------------------------------------------ small helpers */
void ks_set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

char *ks_strdup(const char *s) { return s ? strdup(s) : NULL; }

int ks_buf_append(ks_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n + 1) ncap *= 2;
        char *ns = realloc(b->s, ncap);
        if (!ns) return KS_ENOMEM;
        b->s = ns;
        b->cap = ncap;
    }
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

int ks_buf_printf(ks_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return KS_EINVAL;
    if ((size_t)n < sizeof small) return ks_buf_append(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return KS_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = ks_buf_append(b, big, (size_t)n);
    free(big);
    return rc;
}

void ks_buf_reset(ks_buf *b) {
    b->len = 0;
    if (b->s) b->s[0] = '\0';
}

void ks_buf_free(ks_buf *b) {
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}

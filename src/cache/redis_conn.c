/*
 * redis_conn.c — see redis_conn.h.
 *
 * NOTES ON THE DESIGN
 *  - The socket is non-blocking from its creation; every wait is one poll()
 *    of at most timeout_ms (restarted after EINTR with what is left), so a
 *    timeout means the server made no progress for that long.
 *  - Output: the commands appended since the last flush, in order, as a list
 *    of pieces. A command of 64 KiB or more (a chunk) becomes a piece of its
 *    own, the buffer hiredis formatted it into — never copied again; smaller
 *    ones are copied into a shared piece, so that a pipeline of many GETs
 *    goes out in one system call (plain: sendmsg of every piece at once;
 *    TLS: SSL_write of each piece, OpenSSL cutting it into records).
 *  - Input: reads of up to 256 KiB (TLS: SSL_read until that is full or
 *    nothing more is ready, as one record is at most 16 KiB) fed to hiredis's
 *    reader, whose buffer is kept between replies (maxbuf = 0): a chunk of
 *    MiBs would otherwise be read into fresh pages every time.
 *  - Failures are sticky (fail()): the first message is kept, later calls
 *    return KS_EIO at once. OpenSSL's error queue is per thread: it is
 *    cleared before each TLS call and emptied after a failure was described,
 *    so no stale error reaches other users of libcrypto on the thread.
 */
#include "cache/redis_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/base.h"
#include "cache/redis_tls_int.h"

#define RBUF_BYTES ((size_t)256 << 10)
#define BIG_CMD ((size_t)64 << 10) /* a command this long is a piece of its own */
#define SMALL_PIECE ((size_t)64 << 10)
#define IOV_BATCH 64


typedef struct piece {
    char *p;
    size_t len, cap; /* cap 0: a formatted command adopted whole (redisFreeCommand) */
} piece;

struct ks_redis_conn {
    int fd;
    SSL *ssl;
    redisReader *reader;
    int timeout_ms;
    piece *out;
    int n_out, cap_out, head; /* pieces [head, n_out) are pending */
    size_t head_off;          /* bytes of out[head] already sent */
    char *rbuf;
    bool failed;
    char where[300]; /* host:port or the socket path, for messages */
    char err[320];
};

/* ============================================================ helpers */
bool ks_redis_reply_is(const redisReply *rep, int want) {
    if (!rep || rep->type != want) return false;
    return want != REDIS_REPLY_STATUS || strcmp(rep->str, "OK") == 0;
}

int64_t ks_redis_reply_int(const redisReply *rep) {
    if (!rep) return 0;
    if (rep->type == REDIS_REPLY_INTEGER) return (int64_t)rep->integer;
    if (rep->type == REDIS_REPLY_STRING) return strtoll(rep->str, NULL, 10);
    return 0;
}

/* Marks c failed with the message (the first failure's is kept). Always KS_EIO. */
static int fail(ks_redis_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(ks_redis_conn *c, const char *fmt, ...) {
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, sizeof c->err, fmt, ap);
        va_end(ap);
        c->failed = true;
    }
    return KS_EIO;
}


/* Why a TLS call on c->ssl failed (ret and SSL_get_error's e) into out. */
static void tls_why(ks_redis_conn *c, int ret, int e, int saved_errno, char *out, size_t n) {
    long v = SSL_get_verify_result(c->ssl);
    if (v != X509_V_OK) {
        snprintf(out, n, "certificate verify failed: %s", X509_verify_cert_error_string(v));
        ERR_clear_error();
    } else if (e == SSL_ERROR_SYSCALL && ERR_peek_last_error() == 0) {
        bool eof = ret == 0 || saved_errno == 0;
        snprintf(out, n, "%s", eof ? "the server closed the connection" : strerror(saved_errno));
    } else if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(out, n, "the server closed the connection");
        ERR_clear_error();
    } else {
        ks__redis_ssl_reason(out, n);
    }
}

/* After a failed TLS write: whether the server had sent an alert saying why
 * it closed the connection (reason in out). In TLS 1.3 the client's side of
 * the handshake ends before the server has checked the client's
 * certificate, so a server that requires one ("certificate required") says
 * so only after; its alert may still be waiting in the socket when the
 * write meets the reset that followed it. */
static bool tls_alert(ks_redis_conn *c, char *out, size_t n) {
    char b[256], reason[256];
    ERR_clear_error();
    int r = SSL_read(c->ssl, b, sizeof b);
    if (r <= 0 && SSL_get_error(c->ssl, r) == SSL_ERROR_SSL) {
        ks__redis_ssl_reason(reason, sizeof reason);
        if (!strstr(reason, "alert")) return false;
        snprintf(out, n, "%s", reason);
        return true;
    }
    ERR_clear_error();
    return false;
}

static bool is_ip_literal(const char *s) {
    unsigned char b[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

/* Waits until c->fd is ready for events (POLLIN or POLLOUT), at most
 * timeout_ms. 0, or KS_EIO (c failed: what timed out or went wrong). */
static int wait_fd(ks_redis_conn *c, short events, const char *what) {
    double deadline = ks_now_ms() + c->timeout_ms;
    for (;;) {
        int left = (int)(deadline - ks_now_ms() + 0.999);
        if (left < 0) left = 0;
        struct pollfd p = {.fd = c->fd, .events = events};
        int r = poll(&p, 1, left);
        if (r > 0) return 0; /* readable, writable, or an error the next call reports */
        if (r == 0) return fail(c, "%s %s: no answer within %d ms", what, c->where, c->timeout_ms);
        if (errno != EINTR) return fail(c, "%s %s: poll: %s", what, c->where, strerror(errno));
    }
}

/* ========================================================== connecting */
static int set_nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Completes a connect() that returned rc (-1 with errno EINPROGRESS: waits). */
static int finish_connect(ks_redis_conn *c, int rc) {
    if (rc == 0) return 0;
    if (errno != EINPROGRESS) return fail(c, "connect to %s: %s", c->where, strerror(errno));
    if (wait_fd(c, POLLOUT, "connect to") != 0) return KS_EIO;
    int e = 0;
    socklen_t el = sizeof e;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) e = errno;
    if (e) return fail(c, "connect to %s: %s", c->where, strerror(e));
    return 0;
}

static int connect_unix(ks_redis_conn *c, const char *path) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) return fail(c, "connect to %s: path too long", c->where);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if ((c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
        return fail(c, "connect to %s: socket: %s", c->where, strerror(errno));
    return finish_connect(c, connect(c->fd, (struct sockaddr *)&sa, sizeof sa));
}

/* Every address of host in turn (as hiredis does), each with the timeout. */
static int connect_tcp(ks_redis_conn *c, const char *host, int port) {
    struct addrinfo hints, *res = NULL;
    char ps[16];
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) return fail(c, "connect to %s: cannot resolve '%s': %s", c->where, host, gai_strerror(g));
    int rc = KS_EIO;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        c->failed = false; /* the last address's error is the one reported */
        if (c->fd >= 0) close(c->fd);
        c->fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (c->fd < 0) {
            rc = fail(c, "connect to %s: socket: %s", c->where, strerror(errno));
            continue;
        }
        if ((rc = finish_connect(c, connect(c->fd, a->ai_addr, a->ai_addrlen))) == 0) break;
    }
    freeaddrinfo(res);
    if (rc == 0) set_nodelay(c->fd); /* a pipeline goes out at once, not after a delayed ACK */
    return rc;
}

static int tls_handshake(ks_redis_conn *c, const ks_redis_tls *tls, const char *host) {
    char why[256];
    const char *name = tls->server_name[0] ? tls->server_name : host;
    ERR_clear_error();
    if (!(c->ssl = SSL_new(tls->ctx)) || SSL_set_fd(c->ssl, c->fd) != 1) {
        ks__redis_ssl_reason(why, sizeof why);
        return fail(c, "TLS with %s: %s", c->where, why);
    }
    bool ip = is_ip_literal(name);
    /* SNI carries host names only (RFC 6066). */
    if (!ip && SSL_set_tlsext_host_name(c->ssl, name) != 1) {
        ks__redis_ssl_reason(why, sizeof why);
        return fail(c, "TLS with %s: server name '%s': %s", c->where, name, why);
    }
    if (tls->verify) {
        int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), name) : SSL_set1_host(c->ssl, name);
        if (ok != 1) {
            ks__redis_ssl_reason(why, sizeof why);
            return fail(c, "TLS with %s: server name '%s': %s", c->where, name, why);
        }
    }
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(c->ssl);
        if (r == 1) return 0;
        int saved = errno;
        int e = SSL_get_error(c->ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            if (wait_fd(c, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, "TLS handshake with") != 0) return KS_EIO;
            continue;
        }
        tls_why(c, r, e, saved, why, sizeof why);
        return fail(c, "TLS handshake with %s: %s", c->where, why);
    }
}

int ks_redis_conn_open(const ks_redis_url *url, const ks_redis_tls *tls, int timeout_ms, ks_redis_conn **out,
                       char *err, size_t errlen) {
    *out = NULL;
    if (url->tls && !tls) {
        ks_set_err(err, errlen, "redis: a rediss:// URL needs TLS settings");
        return KS_EINVAL;
    }
    ks_redis_conn *c = calloc(1, sizeof *c);
    if (!c) return KS_ENOMEM;
    c->fd = -1;
    c->timeout_ms = timeout_ms < 1 ? 1 : timeout_ms;
    int rc = KS_ENOMEM;
    if (url->unix_socket)
        snprintf(c->where, sizeof c->where, "%s", url->path);
    else
        snprintf(c->where, sizeof c->where, strchr(url->host, ':') ? "[%s]:%d" : "%s:%d", url->host, url->port);
    if (!(c->rbuf = malloc(RBUF_BYTES)) || !(c->reader = redisReaderCreate())) goto fail;
    /* hiredis frees its read buffer whenever it is empty and larger than
     * 16 KiB, so every chunk would be read into fresh pages (page faults
     * cost more than the copy itself); keep it, as the file tiers keep
     * their read buffer: at most about one chunk per connection. */
    c->reader->maxbuf = 0;
    if ((rc = url->unix_socket ? connect_unix(c, url->path) : connect_tcp(c, url->host, url->port)) != 0) goto fail;
    if (url->tls && !url->unix_socket && (rc = tls_handshake(c, tls, url->host)) != 0) goto fail;
    redisReply *rep;
    if (url->password[0]) {
        rep = url->user[0] ? ks_redis_conn_command(c, "AUTH %s %s", url->user, url->password)
                           : ks_redis_conn_command(c, "AUTH %s", url->password);
        bool good = ks_redis_reply_is(rep, REDIS_REPLY_STATUS);
        if (!good && rep) {
            /* Redis's answer (WRONGPASS ..., or "AUTH <password> called
             * without any password configured") never repeats the password. */
            ks_set_err(err, errlen, "%s refused the credentials (AUTH): %.200s", c->where,
                       rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
            rc = KS_EINVAL;
        }
        freeReplyObject(rep);
        if (!good) {
            if (!rep) rc = KS_EIO;
            goto fail;
        }
    }
    if (url->db) {
        rep = ks_redis_conn_command(c, "SELECT %d", url->db);
        bool good = ks_redis_reply_is(rep, REDIS_REPLY_STATUS);
        if (!good && rep) {
            ks_set_err(err, errlen, "%s refused SELECT %d: %.200s", c->where, url->db,
                       rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
            rc = KS_EINVAL;
        }
        freeReplyObject(rep);
        if (!good) {
            if (!rep) rc = KS_EIO;
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    if (rc == KS_EIO) ks_set_err(err, errlen, "%s", c->err);
    else if (rc == KS_ENOMEM) ks_set_err(err, errlen, "redis: out of memory");
    ks_redis_conn_free(c);
    return rc;
}

static void free_pieces(ks_redis_conn *c) {
    for (int i = c->head; i < c->n_out; i++) {
        if (c->out[i].cap) free(c->out[i].p);
        else redisFreeCommand(c->out[i].p);
    }
    c->n_out = c->head = 0;
    c->head_off = 0;
}

void ks_redis_conn_free(ks_redis_conn *c) {
    if (!c) return;
    if (c->ssl) {
        /* A close_notify on a healthy connection; nothing is waited for. */
        if (!c->failed) {
            ERR_clear_error();
            SSL_shutdown(c->ssl);
        }
        SSL_free(c->ssl);
        ERR_clear_error();
    }
    if (c->fd >= 0) close(c->fd);
    free_pieces(c);
    free(c->out);
    if (c->reader) redisReaderFree(c->reader);
    free(c->rbuf);
    free(c);
}

const char *ks_redis_conn_error(const ks_redis_conn *c) { return c->failed ? c->err : ""; }
bool ks_redis_conn_failed(const ks_redis_conn *c) { return c->failed; }

/* ============================================================= output */
/* Takes cmd (len bytes, formatted by hiredis) into the output. */
static int push(ks_redis_conn *c, char *cmd, size_t len) {
    if (c->head == c->n_out) c->head = c->n_out = 0;
    piece *last = c->n_out > c->head ? &c->out[c->n_out - 1] : NULL;
    if (len < BIG_CMD && last && last->cap && last->cap - last->len >= len) {
        memcpy(last->p + last->len, cmd, len);
        last->len += len;
        redisFreeCommand(cmd);
        return 0;
    }
    if (c->n_out == c->cap_out) {
        int ncap = c->cap_out ? c->cap_out * 2 : 16;
        piece *np = realloc(c->out, (size_t)ncap * sizeof *np);
        if (!np) goto oom;
        c->out = np;
        c->cap_out = ncap;
    }
    piece *p = &c->out[c->n_out];
    if (len >= BIG_CMD) {
        *p = (piece){.p = cmd, .len = len, .cap = 0};
    } else {
        if (!(p->p = malloc(SMALL_PIECE))) goto oom;
        memcpy(p->p, cmd, len);
        p->len = len;
        p->cap = SMALL_PIECE;
        redisFreeCommand(cmd);
    }
    c->n_out++;
    return 0;
oom:
    redisFreeCommand(cmd);
    fail(c, "out of memory for a command to %s", c->where);
    return KS_ENOMEM;
}

static int vappend(ks_redis_conn *c, const char *fmt, va_list ap) {
    if (c->failed) return KS_EIO;
    char *cmd = NULL;
    int len = redisvFormatCommand(&cmd, fmt, ap);
    if (len < 0 || !cmd) {
        /* A pipeline missing a command would pair replies with the wrong
         * commands: the connection is done. */
        fail(c, "cannot format a command to %s", c->where);
        return len == -2 ? KS_EINVAL : KS_ENOMEM;
    }
    return push(c, cmd, (size_t)len);
}

int ks_redis_conn_append(ks_redis_conn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vappend(c, fmt, ap);
    va_end(ap);
    return rc;
}

int ks_redis_conn_append_argv(ks_redis_conn *c, int argc, const char **argv, const size_t *argvlen) {
    if (c->failed) return KS_EIO;
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    if (len < 0 || !cmd) {
        fail(c, "cannot format a command to %s", c->where);
        return KS_ENOMEM;
    }
    return push(c, cmd, (size_t)len);
}

/* Marks n more bytes of the output as sent. */
static void advance(ks_redis_conn *c, size_t n) {
    while (n > 0 && c->head < c->n_out) {
        piece *p = &c->out[c->head];
        size_t left = p->len - c->head_off;
        if (n < left) {
            c->head_off += n;
            return;
        }
        n -= left;
        if (p->cap) free(p->p);
        else redisFreeCommand(p->p);
        c->head++;
        c->head_off = 0;
    }
}

static int flush(ks_redis_conn *c) {
    char why[256];
    while (c->head < c->n_out) {
        piece *p = &c->out[c->head];
        if (c->ssl) {
            size_t left = p->len - c->head_off;
            ERR_clear_error();
            errno = 0;
            int w = SSL_write(c->ssl, p->p + c->head_off, left > INT_MAX ? INT_MAX : (int)left);
            if (w > 0) {
                advance(c, (size_t)w);
                continue;
            }
            int saved = errno;
            int e = SSL_get_error(c->ssl, w);
            if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
                if (wait_fd(c, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, "write to") != 0) return KS_EIO;
                continue;
            }
            tls_why(c, w, e, saved, why, sizeof why);
            if (e == SSL_ERROR_SYSCALL) tls_alert(c, why, sizeof why);
            return fail(c, "write to %s: %s", c->where, why);
        }
        struct iovec iov[IOV_BATCH];
        int k = 0;
        for (int i = c->head; i < c->n_out && k < IOV_BATCH; i++, k++) {
            size_t off = i == c->head ? c->head_off : 0;
            iov[k].iov_base = c->out[i].p + off;
            iov[k].iov_len = c->out[i].len - off;
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)k;
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (w > 0) {
            advance(c, (size_t)w);
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(c, POLLOUT, "write to") != 0) return KS_EIO;
        } else if (w < 0 && errno != EINTR) {
            return fail(c, "write to %s: %s", c->where, strerror(errno));
        }
    }
    c->head = c->n_out = 0;
    c->head_off = 0;
    return 0;
}

/* ============================================================== input */
/* Reads what the server sent (waiting for at least one byte) into the reader. */
static int fill(ks_redis_conn *c) {
    char why[256];
    size_t got = 0;
    for (;;) {
        if (c->ssl) {
            ERR_clear_error();
            errno = 0;
            int r = SSL_read(c->ssl, c->rbuf + got, (int)(RBUF_BYTES - got));
            if (r > 0) {
                got += (size_t)r;
                if (got == RBUF_BYTES) break;
                continue;
            }
            int saved = errno;
            int e = SSL_get_error(c->ssl, r);
            if (got) break; /* what came first is parsed; a failure shows again on the next read */
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                if (wait_fd(c, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, "read from") != 0) return KS_EIO;
                continue;
            }
            tls_why(c, r, e, saved, why, sizeof why);
            return fail(c, "read from %s: %s", c->where, why);
        }
        ssize_t r = recv(c->fd, c->rbuf, RBUF_BYTES, 0);
        if (r > 0) {
            got = (size_t)r;
            break;
        }
        if (r == 0) return fail(c, "read from %s: the server closed the connection", c->where);
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(c, POLLIN, "read from") != 0) return KS_EIO;
        } else if (errno != EINTR) {
            return fail(c, "read from %s: %s", c->where, strerror(errno));
        }
    }
    if (redisReaderFeed(c->reader, c->rbuf, got) != REDIS_OK)
        return fail(c, "read from %s: %s", c->where, c->reader->errstr);
    return 0;
}

int ks_redis_conn_get_reply(ks_redis_conn *c, redisReply **reply) {
    *reply = NULL;
    if (c->failed || flush(c) != 0) return KS_EIO;
    for (;;) {
        void *r = NULL;
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK)
            return fail(c, "read from %s: protocol error: %s", c->where, c->reader->errstr);
        if (r) {
            *reply = r;
            return 0;
        }
        if (fill(c) != 0) return KS_EIO;
    }
}

int ks_redis_conn_get_replies(ks_redis_conn *c, int n, redisReply **rep, ks_redis_trips *trips) {
    double t0 = ks_now_ms();
    int i = 0, rc = 0;
    for (; i < n; i++)
        if ((rc = ks_redis_conn_get_reply(c, &rep[i])) != 0) break;
    if (trips) {
        double ms = ks_now_ms() - t0;
        trips->n++;
        if (ms > 0) trips->us += (uint64_t)(ms * 1000.0);
    }
    if (rc != 0) {
        for (int j = 0; j < i; j++) freeReplyObject(rep[j]);
        memset(rep, 0, (size_t)n * sizeof *rep);
    }
    return rc;
}

redisReply *ks_redis_conn_command(ks_redis_conn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vappend(c, fmt, ap);
    va_end(ap);
    redisReply *rep = NULL;
    if (rc == 0) ks_redis_conn_get_reply(c, &rep);
    return rep;
}

/* test_redis_conn.c — the Redis connection (src/cache/redis_conn.c) without a
 * Redis: the settings check (ks_redis_cfg_prepare), and connections to
 * scripted servers on a unix socket or TCP port of this process — a refused
 * connect, a server that never answers (the timeout bounds every wait, also
 * the TLS handshake), pipelined replies split across many reads, a protocol
 * error and a server that hangs up (both sticky failures). The real
 * redis-server, with TLS, is in tests/e2e/redis.test.mjs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "base/base.h"
#include "cache/redis_conn.h"

static ks_redis_cfg cfg_of(const char *url) {
    ks_redis_cfg c;
    ks_store_cfg sc;
    ks_store_cfg_defaults(&sc);
    c = sc.redis;
    snprintf(c.url, sizeof c.url, "%s", url);
    return c;
}

static void expect_refused(const ks_redis_cfg *c, const char *want) {
    ks_redis_url u;
    ks_redis_tls *tls = (ks_redis_tls *)1;
    char err[512] = "";
    int rc = ks_redis_cfg_prepare(c, &u, &tls, err, sizeof err);
    if (rc != KS_EINVAL || !strstr(err, want))
        fail_msg("url %s: rc %d, message \"%s\", wanted it to contain \"%s\"", c->url, rc, err, want);
    assert_null(tls);
    assert_null(strstr(err, "pw-hidden"));
    assert_string_equal(u.host, "");
}

/* ------------------------------------------------------------- settings */
static void test_prepare(void **state) {
    (void)state;
    ks_redis_url u;
    ks_redis_tls *tls = NULL;
    char err[512] = "";
    /* Plain: no TLS context; the password from the settings when the URL has none. */
    ks_redis_cfg c = cfg_of("redis://127.0.0.1:1/3");
    snprintf(c.password, sizeof c.password, "from-env");
    assert_int_equal(ks_redis_cfg_prepare(&c, &u, &tls, err, sizeof err), 0);
    assert_null(tls);
    assert_string_equal(u.password, "from-env");
    assert_int_equal(u.db, 3);
    c = cfg_of("redis://:in-url@127.0.0.1:1");
    snprintf(c.password, sizeof c.password, "from-env");
    assert_int_equal(ks_redis_cfg_prepare(&c, &u, &tls, err, sizeof err), 0);
    assert_string_equal(u.password, "in-url");
    /* rediss:// without settings: the system's CA paths. */
    c = cfg_of("rediss://localhost:6380");
    assert_int_equal(ks_redis_cfg_prepare(&c, &u, &tls, err, sizeof err), 0);
    assert_non_null(tls);
    assert_true(u.tls);
    ks_redis_tls_free(tls);
    assert_int_equal(ks_redis_cfg_prepare(&c, &u, NULL, err, sizeof err), 0); /* check only */

    /* TLS settings with another scheme: refused, whatever the setting. */
    c = cfg_of("redis://u:pw-hidden@127.0.0.1:1");
    c.tls.verify = false;
    expect_refused(&c, "need a rediss:// URL, not redis://u:***@127.0.0.1:1");
    c = cfg_of("unix:///tmp/r.sock");
    snprintf(c.tls.server_name, sizeof c.tls.server_name, "r.example");
    expect_refused(&c, "need a rediss:// URL");
    /* A certificate without its key, a key without its certificate. */
    c = cfg_of("rediss://127.0.0.1:1");
    snprintf(c.tls.cert_file, sizeof c.tls.cert_file, "/etc/hostname");
    expect_refused(&c, "cert_file) and its key (key_file) go together");
    c = cfg_of("rediss://127.0.0.1:1");
    snprintf(c.tls.key_file, sizeof c.tls.key_file, "/etc/hostname");
    expect_refused(&c, "go together");
    /* Files that are missing, or not what they should be. */
    c = cfg_of("rediss://127.0.0.1:1");
    snprintf(c.tls.ca_file, sizeof c.tls.ca_file, "/nonexistent/ca.pem");
    expect_refused(&c, "ca_file '/nonexistent/ca.pem': No such file or directory");
    c = cfg_of("rediss://127.0.0.1:1");
    snprintf(c.tls.ca_file, sizeof c.tls.ca_file, "/tmp");
    expect_refused(&c, "ca_file '/tmp': a directory");
    c = cfg_of("rediss://127.0.0.1:1");
    snprintf(c.tls.ca_dir, sizeof c.tls.ca_dir, "/etc/hostname");
    expect_refused(&c, "ca_dir '/etc/hostname': not a directory");
    c = cfg_of("rediss://127.0.0.1:1");
    snprintf(c.tls.ca_file, sizeof c.tls.ca_file, "/etc/hostname");
    expect_refused(&c, "cannot load the CA certificates of ca_file '/etc/hostname'");
    c = cfg_of("rediss://127.0.0.1:1");
    snprintf(c.tls.cert_file, sizeof c.tls.cert_file, "/etc/hostname");
    snprintf(c.tls.key_file, sizeof c.tls.key_file, "/etc/hostname");
    expect_refused(&c, "cert_file '/etc/hostname'");
    /* A bad URL. */
    c = cfg_of("rediss://h:0");
    expect_refused(&c, "bad port");
}

/* ------------------------------------------------------ scripted servers */
typedef struct script {
    int lfd;              /* listening socket */
    size_t expect;        /* bytes of commands to read before answering */
    const char *answer;   /* then written (answer_len bytes), then the connection is closed */
    size_t answer_len;
    size_t chunk;         /* written this many bytes at a time (0: all at once) */
    bool silent;          /* accept and never answer (until the test closes) */
    bool hang_up;         /* close after the answer */
    size_t got;           /* out: bytes read */
} script;

static void *serve(void *arg) {
    script *s = arg;
    int fd = accept(s->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    char buf[65536];
    while (s->got < s->expect) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        s->got += (size_t)n;
    }
    if (!s->silent && s->answer) {
        size_t off = 0;
        while (off < s->answer_len) {
            size_t n = s->chunk && s->answer_len - off > s->chunk ? s->chunk : s->answer_len - off;
            ssize_t w = write(fd, s->answer + off, n);
            if (w <= 0) break;
            off += (size_t)w;
            if (s->chunk) usleep(1000);
        }
    }
    /* Wait for the client to close (silent: it times out first). */
    if (!s->hang_up)
        while (read(fd, buf, sizeof buf) > 0) {
        }
    close(fd);
    return NULL;
}

/* A listening unix socket in a temp dir; its URL in url. */
static int listen_unix(char *dir, char *url, size_t n) {
    strcpy(dir, "/tmp/ks_test_redis_conn_XXXXXX");
    assert_non_null(mkdtemp(dir));
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/s.sock", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    snprintf(url, n, "unix://%s", sa.sun_path);
    return fd;
}

static int listen_tcp(int *port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    socklen_t l = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &l), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

static void cleanup_unix(int lfd, const char *dir) {
    char p[256];
    close(lfd);
    snprintf(p, sizeof p, "%s/s.sock", dir);
    unlink(p);
    rmdir(dir);
}

static void test_refused(void **state) {
    (void)state;
    int port;
    int lfd = listen_tcp(&port);
    close(lfd); /* nothing listens there now */
    char url[64], err[512] = "";
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    ks_redis_cfg c = cfg_of(url);
    ks_redis_url u;
    assert_int_equal(ks_redis_cfg_prepare(&c, &u, NULL, err, sizeof err), 0);
    ks_redis_conn *conn = (ks_redis_conn *)1;
    assert_int_equal(ks_redis_conn_open(&u, NULL, 200, &conn, err, sizeof err), KS_EIO);
    assert_null(conn);
    assert_non_null(strstr(err, "Connection refused"));
    /* rediss:// needs its TLS context. */
    u.tls = true;
    assert_int_equal(ks_redis_conn_open(&u, NULL, 200, &conn, err, sizeof err), KS_EINVAL);
}

/* A server that accepts and never answers: AUTH (and, over TCP, the TLS
 * handshake) fails after the timeout, not later, without the password in
 * the message. */
static void test_silent_server(void **state) {
    (void)state;
    for (int tls = 0; tls < 2; tls++) {
        int port;
        int lfd = listen_tcp(&port);
        script s = {.lfd = lfd, .expect = 1, .silent = true};
        pthread_t th;
        pthread_create(&th, NULL, serve, &s);
        char url[96], err[512] = "";
        snprintf(url, sizeof url, "%s://:pw-hidden@127.0.0.1:%d", tls ? "rediss" : "redis", port);
        ks_redis_cfg c = cfg_of(url);
        c.tls.verify = !tls; /* nothing to verify: the handshake never gets that far */
        ks_redis_url u;
        ks_redis_tls *t = NULL;
        assert_int_equal(ks_redis_cfg_prepare(&c, &u, &t, err, sizeof err), 0);
        ks_redis_conn *conn = NULL;
        double t0 = ks_now_ms();
        assert_int_equal(ks_redis_conn_open(&u, t, 150, &conn, err, sizeof err), KS_EIO);
        double ms = ks_now_ms() - t0;
        if (ms < 140 || ms > 2000) fail_msg("%s: failed after %.0f ms, timeout 150 ms", url, ms);
        assert_non_null(strstr(err, "no answer within 150 ms"));
        assert_non_null(strstr(err, tls ? "TLS handshake with 127.0.0.1" : "read from 127.0.0.1"));
        assert_null(strstr(err, "pw-hidden"));
        assert_null(conn);
        ks_redis_tls_free(t);
        pthread_join(th, NULL);
        close(lfd);
    }
}

/* Pipelined commands, one flush; replies (a bulk of 1 MiB among small
 * ones) arrive in small pieces and are handed out in order. */
static void test_pipeline(void **state) {
    (void)state;
    char dir[64], url[128], err[512] = "";
    int lfd = listen_unix(dir, url, sizeof url);
    size_t big = (size_t)1 << 20;
    char *answer = malloc(big + 256);
    assert_non_null(answer);
    int n = snprintf(answer, 64, "+OK\r\n:42\r\n$%zu\r\n", big);
    memset(answer + n, 'x', big);
    n += (int)big;
    n += snprintf(answer + n, 64, "\r\n$-1\r\n-ERR no such thing\r\n*2\r\n$1\r\na\r\n:7\r\n");
    /* What the client sends: its commands, formatted as hiredis does. */
    const char *cmds[] = {"SET k v", "INCR n", "GET big", "GET none", "BOGUS", "LRANGE l 0 1"};
    size_t expect = 0;
    for (int i = 0; i < 6; i++) {
        char *f = NULL;
        int l = redisFormatCommand(&f, cmds[i]);
        assert_true(l > 0);
        expect += (size_t)l;
        redisFreeCommand(f);
    }
    script s = {.lfd = lfd, .expect = expect, .answer = answer, .answer_len = (size_t)n, .chunk = 100000};
    pthread_t th;
    pthread_create(&th, NULL, serve, &s);
    ks_redis_cfg c = cfg_of(url);
    ks_redis_url u;
    assert_int_equal(ks_redis_cfg_prepare(&c, &u, NULL, err, sizeof err), 0);
    ks_redis_conn *conn = NULL;
    int rc = ks_redis_conn_open(&u, NULL, 2000, &conn, err, sizeof err);
    if (rc) fail_msg("open: %s", err);
    for (int i = 0; i < 6; i++) assert_int_equal(ks_redis_conn_append(conn, cmds[i]), 0);
    redisReply *rep[6] = {0};
    ks_redis_trips tr = {0, 0};
    assert_int_equal(ks_redis_conn_get_replies(conn, 6, rep, &tr), 0);
    assert_int_equal(tr.n, 1);
    assert_int_equal(s.got, expect);
    assert_true(ks_redis_reply_is(rep[0], REDIS_REPLY_STATUS));
    assert_int_equal(ks_redis_reply_int(rep[1]), 42);
    assert_int_equal(rep[2]->type, REDIS_REPLY_STRING);
    assert_int_equal(rep[2]->len, big);
    assert_int_equal(rep[2]->str[0], 'x');
    assert_int_equal(rep[2]->str[big - 1], 'x');
    assert_int_equal(rep[3]->type, REDIS_REPLY_NIL);
    assert_int_equal(rep[4]->type, REDIS_REPLY_ERROR); /* a reply, not a failure */
    assert_string_equal(rep[4]->str, "ERR no such thing");
    assert_int_equal(rep[5]->type, REDIS_REPLY_ARRAY);
    assert_int_equal(rep[5]->elements, 2);
    assert_false(ks_redis_conn_failed(conn));
    for (int i = 0; i < 6; i++) freeReplyObject(rep[i]);
    ks_redis_conn_free(conn);
    pthread_join(th, NULL);
    free(answer);
    cleanup_unix(lfd, dir);
}

/* Garbage from the server, or a server that hangs up mid-reply: the
 * connection fails, and stays failed. */
static void test_sticky_failures(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        char dir[64], url[128], err[512] = "";
        int lfd = listen_unix(dir, url, sizeof url);
        const char *answer = k == 0 ? "+OK\r\n?garbage\r\n" : "+OK\r\n$100\r\nonly a part";
        char *f = NULL;
        size_t expect = (size_t)redisFormatCommand(&f, "GET a");
        redisFreeCommand(f);
        script s = {.lfd = lfd, .expect = 2 * expect, .answer = answer, .answer_len = strlen(answer),
                    .hang_up = true};
        pthread_t th;
        pthread_create(&th, NULL, serve, &s);
        ks_redis_cfg c = cfg_of(url);
        ks_redis_url u;
        assert_int_equal(ks_redis_cfg_prepare(&c, &u, NULL, err, sizeof err), 0);
        ks_redis_conn *conn = NULL;
        assert_int_equal(ks_redis_conn_open(&u, NULL, 2000, &conn, err, sizeof err), 0);
        ks_redis_conn_append(conn, "GET a");
        ks_redis_conn_append(conn, "GET a");
        redisReply *r = NULL;
        assert_int_equal(ks_redis_conn_get_reply(conn, &r), 0);
        assert_true(ks_redis_reply_is(r, REDIS_REPLY_STATUS));
        freeReplyObject(r);
        assert_int_equal(ks_redis_conn_get_reply(conn, &r), KS_EIO);
        assert_null(r);
        assert_true(ks_redis_conn_failed(conn));
        const char *why = ks_redis_conn_error(conn);
        assert_non_null(strstr(why, k == 0 ? "protocol error" : "the server closed the connection"));
        /* Sticky: no more commands, no more replies. */
        assert_int_equal(ks_redis_conn_append(conn, "PING"), KS_EIO);
        assert_null(ks_redis_conn_command(conn, "PING"));
        assert_string_equal(ks_redis_conn_error(conn), why);
        ks_redis_conn_free(conn);
        pthread_join(th, NULL);
        cleanup_unix(lfd, dir);
    }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_silent_server),
        cmocka_unit_test(test_pipeline),
        cmocka_unit_test(test_sticky_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

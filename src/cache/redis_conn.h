/*
 * redis_conn.h — one connection to a Redis (or Valkey) server over TCP, a
 * unix socket, or TLS over TCP (OpenSSL), for the redis tier (tier_redis.c)
 * and `kvstash cache --redis` (cmd_cache.c).
 *
 * hiredis serves for the protocol only: commands are formatted with
 * redisvFormatCommand / redisFormatCommandArgv and replies parsed by a
 * redisReader into the usual redisReply (freed with freeReplyObject). The
 * socket, the timeouts and TLS are this module's: Debian 12's hiredis 0.14
 * has no TLS, and its blocking context reads 16 KiB at a time where a reply
 * here is MiBs of chunks.
 *
 * Contract
 *  1. Every wait — connect, TLS handshake, each read and each write — lasts
 *     at most timeout_ms (a non-blocking socket and poll). It bounds a
 *     pause, not a transfer: a reply of 100 MiB that keeps arriving is not
 *     cut, as with SO_RCVTIMEO.
 *  2. Pipelining: append formats a command into the output; nothing is sent
 *     until get_reply, which first sends everything appended, then reads.
 *     Replies come back in the order of the commands.
 *  3. Any failure of the connection (connect, TLS, I/O, timeout, the server
 *     closing it, a protocol error) is sticky: that call and every later one
 *     fail with KS_EIO and ks_redis_conn_error says why, until the
 *     connection is freed (a reader never sees a reply that belongs to
 *     another command). An error reply of the server (-ERR, -OOM, -WRONGPASS)
 *     is not a failure of the connection: it is a REDIS_REPLY_ERROR reply.
 *  4. TLS (a rediss:// URL): TLS 1.2 or later; the server's certificate is
 *     verified against ca_file / ca_dir (else the system's default CA paths)
 *     and its name against server_name (default: the URL's host; an IP
 *     address is matched against the certificate's IP addresses and not sent
 *     as SNI), unless verify is false. A client certificate and key, when
 *     given, answer a server that requires one (mutual TLS).
 *  5. No message of this module contains a password: errors name the
 *     server by host and port (or socket path) only.
 *
 * Thread model: a connection is used by one thread at a time (its owner
 * serializes, e.g. with a mutex); two connections are independent. A
 * ks_redis_tls is read-only once created and may be shared by any number of
 * connections on any threads (OpenSSL's SSL_CTX is). Writes on a closed
 * connection may raise SIGPIPE in the TLS case (OpenSSL writes with
 * write(2)): the process ignores SIGPIPE (kvstash serve and cache do).
 */
#ifndef KS_REDIS_CONN_H
#define KS_REDIS_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "cache/redis_fmt.h"
#include "cache/store_cfg.h"

typedef struct ks_redis_tls ks_redis_tls;
typedef struct ks_redis_conn ks_redis_conn;

/* ------------------------------------------------------------- settings */
/* Whether any TLS setting differs from its default (a file or name given,
 * or verify false). */
bool ks_redis_tls_cfg_given(const ks_redis_tls_cfg *t);

/* Everything needed to connect with cfg, checked: *url parsed from
 * cfg->url, its password taken from cfg->password when the URL has none;
 * *tls (owned: ks_redis_tls_free) created for a rediss:// URL, NULL for
 * the others. tls may be NULL to check only (the TLS context is created and
 * freed). Refused, with KS_EINVAL and the reason in err (never the
 * password): a bad URL; TLS settings with a URL that is not rediss://; a
 * client certificate without its key or a key without a certificate; a
 * file that cannot be read or is not what it should be (a CA file without
 * certificates, a key that does not match the certificate); a ca_dir that
 * is not a directory. KS_ENOMEM. On failure *url is zeroed and *tls NULL. */
int ks_redis_cfg_prepare(const ks_redis_cfg *cfg, ks_redis_url *url, ks_redis_tls **tls, char *err,
                         size_t errlen);

/* Frees a TLS context. NULL is a no-op. The connections made with it must
 * be freed first. */
void ks_redis_tls_free(ks_redis_tls *tls);

/* ----------------------------------------------------------- connection */
/* Connects to url (TCP, unix socket, or TLS over TCP with tls, which a
 * rediss:// URL needs and the others ignore), then sends AUTH when the URL
 * has a password and SELECT when its db is not 0, each wait bounded by
 * timeout_ms (>= 1). 0 and *out (owned: ks_redis_conn_free); else *out is
 * NULL and err says why: KS_EIO (no connection, TLS handshake or
 * verification failed, no answer in time), KS_EINVAL (the server refused
 * AUTH or SELECT — err has its error reply — or a rediss:// URL without
 * tls), KS_ENOMEM. */
int ks_redis_conn_open(const ks_redis_url *url, const ks_redis_tls *tls, int timeout_ms, ks_redis_conn **out,
                       char *err, size_t errlen);

/* Closes the connection and frees everything it holds (pending output and
 * unread replies included). NULL is a no-op. */
void ks_redis_conn_free(ks_redis_conn *c);

/* Appends one command, formatted as hiredis's redisCommand does (%s a C
 * string, %b a pointer and a size_t length, %d %lld %u... numbers), to the
 * output. 0, KS_EIO (the connection has failed), KS_EINVAL (a bad format)
 * or KS_ENOMEM; either of the last two fails the connection too: a
 * pipeline with a command missing would pair replies with the wrong
 * commands. */
int ks_redis_conn_append(ks_redis_conn *c, const char *fmt, ...);
/* The same with argc arguments argv[i] of argvlen[i] bytes (argvlen NULL:
 * NUL-terminated strings). */
int ks_redis_conn_append_argv(ks_redis_conn *c, int argc, const char **argv, const size_t *argvlen);

/* Sends everything appended, then reads the next reply into *reply (owned:
 * freeReplyObject). 0, or KS_EIO (*reply NULL; the connection has failed). */
int ks_redis_conn_get_reply(ks_redis_conn *c, redisReply **reply);

/* Round trips and their time, for a caller's statistics. */
typedef struct ks_redis_trips {
    uint64_t n;
    uint64_t us;
} ks_redis_trips;
/* The n replies of one pipeline into rep[0, n) (one round trip, added to
 * *trips when it is not NULL, successful or not). 0, or KS_EIO with every
 * reply read so far freed and rep[0, n) NULL. */
int ks_redis_conn_get_replies(ks_redis_conn *c, int n, redisReply **rep, ks_redis_trips *trips);

/* append + get_reply: the reply (owned), or NULL when the connection failed
 * (or the command could not be formatted: then the connection fails too). */
redisReply *ks_redis_conn_command(ks_redis_conn *c, const char *fmt, ...);

/* Why the connection failed ("" while it has not). Borrowed: valid until
 * the connection is freed. */
const char *ks_redis_conn_error(const ks_redis_conn *c);
/* Whether the connection has failed (contract 3). */
bool ks_redis_conn_failed(const ks_redis_conn *c);

/* true when rep is of type want (for REDIS_REPLY_STATUS: "OK"). */
bool ks_redis_reply_is(const redisReply *rep, int want);
/* An integer reply, or a string of digits (GET of a counter); 0 otherwise. */
int64_t ks_redis_reply_int(const redisReply *rep);

#endif

/*
 * redis_tls_int.h — the TLS context of the redis tier's connections, shared
 * by redis_tls.c (which makes it) and redis_conn.c (which connects with it).
 * Read-only once made (redis_conn.h's thread model).
 */
#ifndef KS_REDIS_TLS_INT_H
#define KS_REDIS_TLS_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

struct ks_redis_tls {
    SSL_CTX *ctx;
    char server_name[256];
    bool verify;
};

/* The reason of OpenSSL's last error on this thread into out (n bytes), the
 * queue emptied. */
void ks__redis_ssl_reason(char *out, size_t n);

#endif

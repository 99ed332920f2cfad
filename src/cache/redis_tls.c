/*
 * redis_tls.c — the redis tier's connection settings (redis_conn.h): the
 * URL checked and parsed, and the TLS context its connections share (CA
 * certificates, the client certificate and key, the name to verify), made
 * once from ks_redis_tls_cfg. redis_conn.c connects with them.
 */
#include "cache/redis_conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/base.h"
#include "cache/redis_tls_int.h"

/* The reason of OpenSSL's last error on this thread into out (n bytes), the
 * queue emptied. */
void ks__redis_ssl_reason(char *out, size_t n) {
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (r)
        snprintf(out, n, "%s", r);
    else if (e)
        ERR_error_string_n(e, out, n);
    else
        snprintf(out, n, "unknown TLS error");
    ERR_clear_error();
}

bool ks_redis_tls_cfg_given(const ks_redis_tls_cfg *t) {
    return t->ca_file[0] || t->ca_dir[0] || t->cert_file[0] || t->key_file[0] || t->server_name[0] || !t->verify;
}

/* 0 when path names a readable file (dir: a directory); else KS_EINVAL with
 * the reason. */
static int check_path(const char *key, const char *path, bool dir, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ks_set_err(err, errlen, "redis TLS: %s '%s': %s", key, path, strerror(errno));
        return KS_EINVAL;
    }
    if (dir ? !S_ISDIR(sb.st_mode) : S_ISDIR(sb.st_mode)) {
        ks_set_err(err, errlen, "redis TLS: %s '%s': %s", key, path, dir ? "not a directory" : "a directory");
        return KS_EINVAL;
    }
    if (access(path, R_OK | (dir ? X_OK : 0)) != 0) {
        ks_set_err(err, errlen, "redis TLS: %s '%s': %s", key, path, strerror(errno));
        return KS_EINVAL;
    }
    return 0;
}

/* An encrypted key is refused rather than asked for on a terminal. */
static int no_passphrase(char *buf, int size, int rwflag, void *ud) {
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)ud;
    return 0;
}

static int tls_create(const ks_redis_tls_cfg *t, ks_redis_tls **out, char *err, size_t errlen) {
    int rc = KS_EINVAL;
    char why[256];
    *out = NULL;
    if (!t->cert_file[0] != !t->key_file[0]) {
        ks_set_err(err, errlen, "redis TLS: a client certificate (cert_file) and its key (key_file) go together: "
                                "give both or neither");
        return KS_EINVAL;
    }
    if ((t->ca_file[0] && check_path("ca_file", t->ca_file, false, err, errlen)) ||
        (t->ca_dir[0] && check_path("ca_dir", t->ca_dir, true, err, errlen)) ||
        (t->cert_file[0] && check_path("cert_file", t->cert_file, false, err, errlen)) ||
        (t->key_file[0] && check_path("key_file", t->key_file, false, err, errlen)))
        return KS_EINVAL;
    ks_redis_tls *x = calloc(1, sizeof *x);
    if (!x) return KS_ENOMEM;
    snprintf(x->server_name, sizeof x->server_name, "%s", t->server_name);
    x->verify = t->verify;
    ERR_clear_error();
    if (!(x->ctx = SSL_CTX_new(TLS_client_method()))) {
        ks__redis_ssl_reason(why, sizeof why);
        ks_set_err(err, errlen, "redis TLS: %s", why);
        rc = KS_ENOMEM;
        goto fail;
    }
    SSL_CTX_set_min_proto_version(x->ctx, TLS1_2_VERSION);
    SSL_CTX_set_default_passwd_cb(x->ctx, no_passphrase);
    /* SSL_write may return after part of a piece (a chunk of MiBs) when the
     * socket is full, and is called again with the same piece from there. */
    SSL_CTX_set_mode(x->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* The CA settings are loaded even with verify off: a file that was given
     * and cannot be used is a mistake to report, not to ignore. */
    if (t->ca_file[0] || t->ca_dir[0]) {
        if (SSL_CTX_load_verify_locations(x->ctx, t->ca_file[0] ? t->ca_file : NULL,
                                          t->ca_dir[0] ? t->ca_dir : NULL) != 1) {
            ks__redis_ssl_reason(why, sizeof why);
            ks_set_err(err, errlen, "redis TLS: cannot load the CA certificates of %s '%s': %s",
                       t->ca_file[0] ? "ca_file" : "ca_dir", t->ca_file[0] ? t->ca_file : t->ca_dir, why);
            goto fail;
        }
    } else if (t->verify && SSL_CTX_set_default_verify_paths(x->ctx) != 1) {
        ks__redis_ssl_reason(why, sizeof why);
        ks_set_err(err, errlen, "redis TLS: cannot use the system's CA certificates (%s): give ca_file", why);
        goto fail;
    }
    SSL_CTX_set_verify(x->ctx, t->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    if (t->cert_file[0]) {
        if (SSL_CTX_use_certificate_chain_file(x->ctx, t->cert_file) != 1) {
            ks__redis_ssl_reason(why, sizeof why);
            ks_set_err(err, errlen, "redis TLS: cert_file '%s': %s", t->cert_file, why);
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(x->ctx, t->key_file, SSL_FILETYPE_PEM) != 1) {
            unsigned long e = ERR_peek_last_error();
            bool mismatch = ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH;
            ks__redis_ssl_reason(why, sizeof why);
            if (mismatch)
                ks_set_err(err, errlen, "redis TLS: key_file '%s' does not match cert_file '%s'", t->key_file,
                           t->cert_file);
            else
                ks_set_err(err, errlen, "redis TLS: key_file '%s': %s (an unencrypted PEM key)", t->key_file, why);
            goto fail;
        }
        if (SSL_CTX_check_private_key(x->ctx) != 1) {
            ks__redis_ssl_reason(why, sizeof why);
            ks_set_err(err, errlen, "redis TLS: key_file '%s' does not match cert_file '%s': %s", t->key_file,
                       t->cert_file, why);
            goto fail;
        }
    }
    *out = x;
    return 0;
fail:
    ERR_clear_error();
    ks_redis_tls_free(x);
    return rc;
}

void ks_redis_tls_free(ks_redis_tls *tls) {
    if (!tls) return;
    SSL_CTX_free(tls->ctx);
    free(tls);
}

int ks_redis_cfg_prepare(const ks_redis_cfg *cfg, ks_redis_url *url, ks_redis_tls **tls, char *err, size_t errlen) {
    ks_redis_url u;
    ks_redis_tls *t = NULL;
    memset(url, 0, sizeof *url);
    if (tls) *tls = NULL;
    int rc = ks_redis_url_parse(cfg->url, &u, err, errlen);
    if (rc) goto done;
    if (!u.tls && ks_redis_tls_cfg_given(&cfg->tls)) {
        char where[KS_REDIS_URL_MAX];
        ks_redis_url_redact(cfg->url, where, sizeof where);
        ks_set_err(err, errlen, "redis TLS settings need a rediss:// URL, not %s (the connection would not use them)",
                   where);
        rc = KS_EINVAL;
        goto done;
    }
    if (u.tls && (rc = tls_create(&cfg->tls, &t, err, errlen)) != 0) goto done;
    if (!u.password[0] && cfg->password[0]) {
        if (strlen(cfg->password) >= sizeof u.password) {
            ks_set_err(err, errlen, "redis password: at most %zu bytes", sizeof u.password - 1);
            rc = KS_EINVAL;
            goto done;
        }
        snprintf(u.password, sizeof u.password, "%s", cfg->password);
    }
    *url = u;
    if (tls) {
        *tls = t;
        t = NULL;
    }
done:
    ks_redis_tls_free(t);
    memset(&u, 0, sizeof u); /* no copy of a password left behind */
    return rc;
}

/*
 * media_fetch.c — http(s):// and file:// images for a request (media_fetch.h).
 */
#include "server/media_fetch.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

#define URL_MAX 8192

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_curl_ok;
static void curl_init_once(void) { g_curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }

static bool has_prefix(const char *s, size_t len, const char *p) {
    size_t n = strlen(p);
    return len >= n && !strncasecmp(s, p, n);
}

int ks_media_fetch_is_url(const char *url, size_t len) {
    return has_prefix(url, len, "http://") || has_prefix(url, len, "https://") || has_prefix(url, len, "file://");
}

/* Note 3: host in the comma-separated list, or the list is "*". */
static bool host_allowed(const char *list, const char *host) {
    if (!list || !*list || !host || !*host) return false;
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        host++;
        hl -= 2;
    }
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        size_t n = (size_t)(t - p);
        if (n == 1 && *p == '*') return true;
        if (n >= 2 && p[0] == '[' && p[n - 1] == ']') {
            p++;
            n -= 2;
        }
        if (n && n == hl && !strncasecmp(p, host, n)) return true;
        p = e;
    }
    return false;
}

/* ------------------------------------------------------------------ file */
static ks_fetch_result fetch_file(const ks_media_fetch_cfg *c, const char *rel, int64_t max_bytes, uint8_t **data,
                                  size_t *n, char *err, size_t errlen) {
    if (!c->dir || !*c->dir) {
        ks_set_err(err, errlen, "file:// URLs are not allowed on this server (--media-path)");
        return KS_FETCH_REFUSED;
    }
    if (!*rel || rel[0] == '/') {
        ks_set_err(err, errlen, "a file:// URL names a path relative to the server's media directory");
        return KS_FETCH_REFUSED;
    }
    for (const char *p = rel; *p;) { /* no ".." component */
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == 2 && p[0] == '.' && p[1] == '.') {
            ks_set_err(err, errlen, "a file:// path may not contain '..'");
            return KS_FETCH_REFUSED;
        }
        p += l + (e ? 1 : 0);
    }
    char root[PATH_MAX], want[PATH_MAX * 2], real[PATH_MAX];
    if (!realpath(c->dir, root)) {
        ks_set_err(err, errlen, "the server's media directory cannot be read");
        return KS_FETCH_FAILED;
    }
    if (strlen(rel) >= PATH_MAX || (size_t)snprintf(want, sizeof want, "%s/%s", root, rel) >= sizeof want) {
        ks_set_err(err, errlen, "the file:// path is too long");
        return KS_FETCH_BAD_URL;
    }
    size_t rl = strlen(root);
    if (!realpath(want, real)) {
        ks_set_err(err, errlen, "no such file in the server's media directory: '%.200s'", rel);
        return KS_FETCH_FAILED;
    }
    if (strncmp(real, root, rl) || (real[rl] != '/' && !(rl == 1 && root[0] == '/'))) {
        ks_set_err(err, errlen, "'%.200s' leads outside the server's media directory", rel);
        return KS_FETCH_REFUSED;
    }
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        ks_set_err(err, errlen, "'%.200s' is not a readable file in the server's media directory", rel);
        return KS_FETCH_FAILED;
    }
    if (st.st_size > max_bytes) {
        close(fd);
        ks_set_err(err, errlen, "the file is %lld bytes; this server takes at most %lld bytes per item "
                   "(--media-max-bytes)", (long long)st.st_size, (long long)max_bytes);
        return KS_FETCH_TOO_LARGE;
    }
    uint8_t *d = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!d) {
        close(fd);
        return KS_FETCH_NOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, d + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != (size_t)st.st_size) {
        free(d);
        ks_set_err(err, errlen, "'%.200s' could not be read", rel);
        return KS_FETCH_FAILED;
    }
    *data = d;
    *n = got;
    return KS_FETCH_OK;
}

/* ------------------------------------------------------------------ http */
typedef struct {
    uint8_t *d;
    size_t n, cap;
    int64_t max;
    bool too_large, nomem;
} sink;

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
    sink *s = ud;
    size_t k = sz * nm;
    if ((int64_t)(s->n + k) > s->max) {
        s->too_large = true;
        return 0; /* aborts the transfer */
    }
    if (s->n + k > s->cap) {
        size_t cap = s->cap ? s->cap : 65536;
        while (cap < s->n + k) cap *= 2;
        if ((int64_t)cap > s->max) cap = (size_t)s->max;
        uint8_t *d = realloc(s->d, cap);
        if (!d) {
            s->nomem = true;
            return 0;
        }
        s->d = d;
        s->cap = cap;
    }
    memcpy(s->d + s->n, p, k);
    s->n += k;
    return k;
}

/* Scheme and host of url, checked (notes 2, 3). */
static ks_fetch_result check_url(const ks_media_fetch_cfg *c, const char *url, char *err, size_t errlen) {
    CURLU *u = curl_url();
    if (!u) return KS_FETCH_NOMEM;
    ks_fetch_result r = KS_FETCH_OK;
    char *scheme = NULL, *host = NULL;
    if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
        ks_set_err(err, errlen, "the URL is malformed");
        r = KS_FETCH_BAD_URL;
    } else if (strcasecmp(scheme, "http") && strcasecmp(scheme, "https")) {
        ks_set_err(err, errlen, "only http and https URLs are fetched (not %.16s)", scheme);
        r = KS_FETCH_REFUSED;
    } else if (!c->hosts || !*c->hosts) {
        ks_set_err(err, errlen, "this server does not fetch remote images (--media-fetch-hosts)");
        r = KS_FETCH_REFUSED;
    } else if (!host_allowed(c->hosts, host)) {
        ks_set_err(err, errlen, "this server does not fetch images from '%.200s' (--media-fetch-hosts)", host);
        r = KS_FETCH_REFUSED;
    }
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    return r;
}

static ks_fetch_result fetch_http(const ks_media_fetch_cfg *c, const char *first, int64_t max_bytes, uint8_t **data,
                                  size_t *n, char *err, size_t errlen) {
    pthread_once(&g_once, curl_init_once);
    if (!g_curl_ok) {
        ks_set_err(err, errlen, "the server's HTTP client could not start");
        return KS_FETCH_FAILED;
    }
    int timeout = c->timeout_ms > 0 ? c->timeout_ms : KS_MEDIA_FETCH_TIMEOUT_MS;
    int max_redir = c->max_redirects >= 0 ? c->max_redirects : KS_MEDIA_FETCH_REDIRECTS;
    char *url = strdup(first);
    if (!url) return KS_FETCH_NOMEM;
    ks_fetch_result r = KS_FETCH_FAILED;
    const double deadline = ks_now_ms() + timeout; /* the redirects' hops share it */
    for (int hop = 0;; hop++) {
        if ((r = check_url(c, url, err, errlen)) != KS_FETCH_OK) break;
        long left = (long)(deadline - ks_now_ms());
        if (left < 1) {
            ks_set_err(err, errlen, "the image could not be fetched: timeout after %d ms", timeout);
            r = KS_FETCH_FAILED;
            break;
        }
        CURL *h = curl_easy_init();
        if (!h) {
            r = KS_FETCH_NOMEM;
            break;
        }
        sink s = {.max = max_bytes};
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_PROXY, ""); /* not from the environment */
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, left);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, left);
        curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max_bytes);
        curl_easy_setopt(h, CURLOPT_USERAGENT, "kvstash");
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
        CURLcode cc = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (s.nomem) {
            r = KS_FETCH_NOMEM;
        } else if (s.too_large || cc == CURLE_FILESIZE_EXCEEDED) {
            ks_set_err(err, errlen, "the image at the URL is larger than the %lld bytes this server takes per item "
                       "(--media-max-bytes)", (long long)max_bytes);
            r = KS_FETCH_TOO_LARGE;
        } else if (cc != CURLE_OK) {
            ks_set_err(err, errlen, "the image could not be fetched: %s", curl_easy_strerror(cc));
            r = KS_FETCH_FAILED;
        } else if (status >= 300 && status < 400) {
            char *next = NULL;
            curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &next);
            if (!next) {
                ks_set_err(err, errlen, "the image's URL answered %ld without a location", status);
                r = KS_FETCH_FAILED;
            } else if (hop >= max_redir) {
                ks_set_err(err, errlen, "the image's URL redirects more than %d times", max_redir);
                r = KS_FETCH_FAILED;
            } else {
                char *nu = strdup(next);
                free(url);
                url = nu;
                free(s.d);
                curl_easy_cleanup(h);
                if (!url) return KS_FETCH_NOMEM;
                continue;
            }
        } else if (status < 200 || status >= 300) {
            ks_set_err(err, errlen, "the image's URL answered HTTP %ld", status);
            r = KS_FETCH_FAILED;
        } else {
            *data = s.d ? s.d : malloc(1);
            *n = s.n;
            s.d = NULL;
            r = *data ? KS_FETCH_OK : KS_FETCH_NOMEM;
        }
        free(s.d);
        curl_easy_cleanup(h);
        break;
    }
    free(url);
    return r;
}

ks_fetch_result ks_media_fetch(const ks_media_fetch_cfg *cfg, const char *url, size_t len, int64_t max_bytes,
                               uint8_t **data, size_t *n, char *err, size_t errlen) {
    *data = NULL;
    *n = 0;
    if (!ks_media_fetch_is_url(url, len)) return KS_FETCH_NOT_URL;
    if (len >= URL_MAX || memchr(url, 0, len)) {
        ks_set_err(err, errlen, "the URL is malformed or longer than %d bytes", URL_MAX - 1);
        return KS_FETCH_BAD_URL;
    }
    char buf[URL_MAX];
    memcpy(buf, url, len);
    buf[len] = 0;
    static const ks_media_fetch_cfg none = {0};
    const ks_media_fetch_cfg *c = cfg ? cfg : &none;
    if (has_prefix(buf, len, "file://"))
        return fetch_file(c, buf + 7, max_bytes, data, n, err, errlen);
    return fetch_http(c, buf, max_bytes, data, n, err, errlen);
}

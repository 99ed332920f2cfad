/*
 * media_fetch.h — the bytes of an image a request names by URL rather than
 * carries: http(s):// from the hosts the operator allows (--media-fetch-hosts,
 * media.fetch_hosts) and file:// below one directory (--media-path,
 * media.path, as llama-server's flag). Everything else is refused, and
 * both are off by default: a server that fetches what a request names can
 * be made to reach hosts its users cannot (server-side request forgery).
 *
 * NOTES ON THE DESIGN
 *  1. libcurl does the transfer (Debian's libcurl4-openssl-dev): http and
 *     https only, certificates verified, no proxy from the environment, one
 *     timeout for the whole fetch (its redirects included), and the body refused
 *     as soon as it passes max_bytes (the Content-Length first, then what
 *     has arrived), so a large or endless body costs at most max_bytes.
 *  2. Redirects are followed by hand, at most max_redirects of them, and
 *     each target's scheme and host are checked as the first URL's were:
 *     an allowed host cannot send the server to one that is not.
 *  3. A host is allowed when it equals an entry of the list, case
 *     insensitive, or the list is "*" (any host). A bracketed IPv6 address
 *     is compared without its brackets.
 *  4. file:// paths are relative to the directory; absolute paths and ".."
 *     are refused, and the file's real path (links resolved) must lie in
 *     the directory's real path.
 *  5. What comes back is bytes, not the type the remote declared (servers
 *     label images loosely); the caller checks them as it checks inline
 *     data (api_media.c: magic bytes, limits, header). No fetched byte is
 *     trusted here.
 *
 * Thread model: reentrant; ks_media_fetch blocks its caller (the request's
 * connection thread) for at most about timeout_ms. curl_global_init is
 * called once, at the first fetch (pthread_once).
 */
#ifndef KS_MEDIA_FETCH_H
#define KS_MEDIA_FETCH_H

#include <stddef.h>
#include <stdint.h>

#define KS_MEDIA_FETCH_TIMEOUT_MS 10000 /* default: one fetch, redirects, connects and bodies */
#define KS_MEDIA_FETCH_REDIRECTS 3      /* default: redirects followed */

typedef struct ks_media_fetch_cfg {
    const char *dir;   /* file:// root; NULL or "": file:// refused */
    const char *hosts; /* comma-separated hosts http(s):// may name, "*": any; NULL or "": refused */
    int timeout_ms;    /* per URL, its redirects included; <= 0: KS_MEDIA_FETCH_TIMEOUT_MS */
    int max_redirects; /* < 0: KS_MEDIA_FETCH_REDIRECTS */
} ks_media_fetch_cfg;

/* Why a fetch failed: the API error's code and words follow from it. */
typedef enum {
    KS_FETCH_OK = 0,
    KS_FETCH_NOT_URL,     /* not http(s):// or file:// (a data URL, a bare word): not ours */
    KS_FETCH_REFUSED,     /* the scheme, host or path is not allowed here */
    KS_FETCH_BAD_URL,     /* malformed */
    KS_FETCH_TOO_LARGE,   /* more than max_bytes */
    KS_FETCH_FAILED,      /* the network, the file system or the remote said no (status, timeout) */
    KS_FETCH_NOMEM,
} ks_fetch_result;

/* True when url (len bytes) is one this module takes (http://, https://,
 * file://, case-insensitive scheme), allowed or not. */
int ks_media_fetch_is_url(const char *url, size_t len);

/* Fetches url into *data (malloc'd, *n bytes; owned by the caller). On
 * failure err says why in words a client may read (no local path beyond
 * what the client sent). */
ks_fetch_result ks_media_fetch(const ks_media_fetch_cfg *cfg, const char *url, size_t len, int64_t max_bytes,
                               uint8_t **data, size_t *n, char *err, size_t errlen);

#endif

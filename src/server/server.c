/*
 * server.c — see server.h. The libmicrohttpd layer: lifecycle, routing
 * (each route names its format, fmt.h), authentication, CORS preflights,
 * body limits, framing and early errors. The endpoints are utility.c's and
 * request.c's, the responses respond.c's (server_int.h).
 *
 * NOTES ON THE DESIGN OF THE HTTP LAYER
 *
 * MHD calls on_request several times per request on the connection's own
 * thread: once when the headers are in (we pick the route and decide early
 * errors: 404, 405, 401, 413 by Content-Length), once per body chunk (we
 * buffer up to max_body_bytes, then discard), and once at the end, where
 * every response is queued. Early errors are answered only at the end, after
 * the body was read, so that a client still sending its body never meets a
 * reset connection; only a body beyond hard_cap() is refused at once, and so
 * are a request whose framing is ambiguous (bad_framing) and one on a
 * connection beyond max_connections: their reply goes out with
 * "Connection: close" and nothing more is read from the connection.
 *
 * Timeouts (server.h note 9). MHD has one inactivity timeout per connection,
 * which we switch: header_timeout_s from accept (the daemon's default) and
 * again when a request line arrives (on_uri); timeout_s once the request is
 * read (the last on_request call), for making and sending the reply and the
 * idle wait for the next request; 0 while a generation runs (gen.c, which
 * puts timeout_s back before the reply).
 *
 * CORS (server.h note 7) lives in two places: reply_options answers an
 * OPTIONS on a route, and ks__cors_headers adds Access-Control-Allow-Origin
 * to every response, whoever builds it, so no status or stream escapes it.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/chat_tmpl.h"
#include "server/convstore.h"
#include "server/hdrwatch.h"
#include "server/keyring.h"
#include "server/tenantstats.h"
#include "prompt/prompt_tmpl.h"
#include "server/fmt.h"
#include "server/gen.h"
#include "server/keyring.h"
#include "server/plan.h"
#include "server/refusals.h"

/* Render results the server remembers (prompt_tmpl.h): a few per
 * conversation (its system message, its breakpoints), for many at once. */
#define KS_SERVER_MEMO 256
/* Rendered prompts' pieces and their tokens kept for the next render
 * (engine/tokcache.h): 64 MiB, some seven million tokens of text, the
 * messages of about eighty 80K-token agent conversations. */
#define KS_SERVER_TOKCACHE ((size_t)64 << 20)
#include "server/server_int.h"

#define MOD "http"
#define FREE_WAIT_MS 3000

/* ------------------------------------------------------------------ routes */
enum { R_HEALTH = 1, R_MODELS, R_METRICS, R_SLOTS, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_PROPS, R_APPLY_TEMPLATE,
       R_RESPONSES, R_MESSAGES, R_COUNT_TOKENS, R_TENANT, R_MODELS_LOAD, R_MODELS_UNLOAD };
enum { M_GET = 1, M_POST = 2 }; /* M_GET: GET and HEAD */

struct route {
    const char *path;
    int id;
    unsigned methods;
    const ks_fmt *fmt; /* a generation's format, the shape of the route's errors; NULL: OpenAI's */
};

static const route ROUTES[] = {
    /* "/" answers as /health does: clients probe it (Claude Code sends HEAD /
     * before its first request), and llama-server answers it. */
    {"/", R_HEALTH, M_GET, NULL},
    {"/health", R_HEALTH, M_GET, NULL},
    {"/v1/health", R_HEALTH, M_GET, NULL},
    {"/v1/models", R_MODELS, M_GET, NULL},
    {"/models", R_MODELS, M_GET, NULL},
    /* llama-server's router: {"model": NAME} (models.c) */
    {"/models/load", R_MODELS_LOAD, M_POST, NULL},
    {"/models/unload", R_MODELS_UNLOAD, M_POST, NULL},
    {"/metrics", R_METRICS, M_GET, NULL},
    {"/slots", R_SLOTS, M_GET, NULL},
    {"/tenant", R_TENANT, M_GET, NULL},
    {"/v1/chat/completions", R_CHAT, M_POST, &ks__fmt_chat},
    {"/chat/completions", R_CHAT, M_POST, &ks__fmt_chat},
    {"/v1/completions", R_COMPLETIONS, M_POST, &ks__fmt_completions},
    {"/completions", R_COMPLETIONS, M_POST, &ks__fmt_completions},
    /* llama-server's own shapes (fmt_native.c); its /completions is this
     * shape too, kvstash's is OpenAI's (docs/SERVER.md) */
    {"/completion", R_COMPLETIONS, M_POST, &ks__fmt_native},
    {"/infill", R_COMPLETIONS, M_POST, &ks__fmt_infill},
    /* llama-server has these without a /v1 alias. */
    {"/tokenize", R_TOKENIZE, M_POST, NULL},
    {"/detokenize", R_DETOKENIZE, M_POST, NULL},
    {"/props", R_PROPS, M_GET | M_POST, NULL},
    /* a chat request, parsed as chat's (utility.c) */
    {"/apply-template", R_APPLY_TEMPLATE, M_POST, &ks__fmt_chat},
    {"/v1/responses", R_RESPONSES, M_POST, &ks__fmt_responses},
    {"/responses", R_RESPONSES, M_POST, &ks__fmt_responses},
    {"/v1/messages", R_MESSAGES, M_POST, &ks__fmt_messages},
    {"/v1/messages/count_tokens", R_COUNT_TOKENS, M_POST, &ks__fmt_messages},
    /* AI-SDK Anthropic clients (cline) append /messages to the base URL, and
     * the base URL Claude Code takes has no /v1. */
    {"/messages", R_MESSAGES, M_POST, &ks__fmt_messages},
    {"/messages/count_tokens", R_COUNT_TOKENS, M_POST, &ks__fmt_messages},
};

static const char *allowed(const route *rt) {
    return rt->methods == M_POST ? "POST" : rt->methods == M_GET ? "GET, HEAD" : "GET, HEAD, POST";
}

static const route *find_route(const char *url) {
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (!strcmp(url, ROUTES[i].path)) return &ROUTES[i];
    return NULL;
}

/* ------------------------------------------------------------------ limits */
static uint64_t hard_cap(const ks_server *s) { return (uint64_t)s->max_body * 2 + (1u << 20); }

/* --------------------------------------------------------------- MHD glue */
/* Authorization: Bearer KEY (or X-Api-Key: KEY, as llama-server accepts);
 * *tenant: the key's (keyring.h). */
/* -------------------------------------------------------------------- CORS */
/* A preflight's answer is cached by the browser this long (seconds). */
#define CORS_MAX_AGE "600"
/* Allowed request headers when a preflight names none we can echo: the API
 * key, and what the openai and @anthropic-ai/sdk packages send. */
#define CORS_HEADERS                                                                                      \
    "Authorization, Content-Type, X-Api-Key, anthropic-version, anthropic-beta, "                          \
    "anthropic-dangerous-direct-browser-access, OpenAI-Beta, OpenAI-Organization, OpenAI-Project, "         \
    "X-Stainless-Lang, X-Stainless-Package-Version, X-Stainless-OS, X-Stainless-Arch, "                    \
    "X-Stainless-Runtime, X-Stainless-Runtime-Version, X-Stainless-Retry-Count, X-Stainless-Timeout, "     \
    "X-Stainless-Helper-Method"

static const char *header(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* Access-Control-Request-Headers is echoed, as llama-server does (the SDKs
 * send a dozen x-stainless-* headers, more with each version), when it is a
 * plain list of header names: nothing else goes back into a header. */
static bool header_names(const char *h) {
    size_t n = 0;
    for (; h[n]; n++)
        if (!isalnum((unsigned char)h[n]) && !strchr("-_.!#$%&'*+^`|~, ", h[n])) return false;
    return n > 0 && n <= 4096;
}

/* OPTIONS on a route while CORS is on. A preflight (Origin and
 * Access-Control-Request-Method) from an allowed origin: 204 with the
 * route's methods and the requested headers; from another origin: 403
 * without CORS headers, which the browser reports as a CORS failure. Any
 * other OPTIONS: 204 with Allow. Never an API key: browsers send none on a
 * preflight, and the request that follows needs it. */
static enum MHD_Result reply_options(ks_server *s, struct MHD_Connection *c, conn *cn) {
    char methods[48];
    snprintf(methods, sizeof methods, "%s, OPTIONS", allowed(cn->rt));
    const char *origin = header(c, "Origin");
    if (!origin || !header(c, MHD_HTTP_HEADER_ACCESS_CONTROL_REQUEST_METHOD)) {
        const char *const h[] = {MHD_HTTP_HEADER_ALLOW, methods, NULL};
        return ks__respond(s, c, cn, 204, NULL, NULL, 0, h);
    }
    if (!ks__cors_origin(s, c)) {
        ks_api_error e;
        ks_api_error_set(&e, 403, "invalid_request_error", "origin_not_allowed", NULL,
                         "Origin %.200s is not allowed (the server's --cors-origin).", origin);
        return ks__respond_error(s, c, cn, &e, NULL);
    }
    const char *want = header(c, MHD_HTTP_HEADER_ACCESS_CONTROL_REQUEST_HEADERS);
    /* Chrome asks before a public page may call a private address (Private
     * Network Access); an origin the operator allowed may. */
    const char *pna = header(c, "Access-Control-Request-Private-Network");
    const char *const h[] = {MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_METHODS, methods,
                             MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_HEADERS,
                             want && header_names(want) ? want : CORS_HEADERS,
                             MHD_HTTP_HEADER_ACCESS_CONTROL_MAX_AGE, CORS_MAX_AGE,
                             pna && !strcasecmp(pna, "true") ? "Access-Control-Allow-Private-Network" : NULL, "true",
                             NULL};
    return ks__respond(s, c, cn, 204, NULL, NULL, 0, h);
}

static enum MHD_Result reply_early(ks_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                   const char *url) {
    ks_api_error e;
    switch (cn->early) {
    case 404:
        ks_api_error_set(&e, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %.16s %.200s.",
                         method, url);
        return ks__respond_error(s, c, cn, &e, NULL);
    case 405: {
        char allow[48]; /* OPTIONS too while CORS is on */
        snprintf(allow, sizeof allow, "%s%s", allowed(cn->rt), s->n_cors_origins ? ", OPTIONS" : "");
        ks_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                         "Method %.16s is not allowed on %s; use %s.", method, cn->rt->path, allow);
        const char *const h[] = {MHD_HTTP_HEADER_ALLOW, allow, NULL};
        return ks__respond_error(s, c, cn, &e, h);
    }
    case 401: {
        ks_api_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                         cn->key_given ? "Incorrect API key provided."
                                       : "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.");
        const char *const h[] = {MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer", NULL};
        return ks__respond_error(s, c, cn, &e, h);
    }
    case 403:
        ks_api_error_set(&e, 403, "invalid_request_error", "permission_denied", NULL,
                         "/metrics counts every tenant's requests together: on a server with several API keys it "
                         "answers only the metrics key (--metrics-key), not an API key.");
        return ks__respond_error(s, c, cn, &e, NULL);
    case KS_BODY_TOO_LONG: /* sized before its parse (plan.h, prescan.h) */
    case KS_BODY_TOO_MANY:
    case KS_BODY_TOO_MUCH_ELSE:
        ks__plan_body_error(s, cn->m, cn->early, &e);
        return ks__respond_error(s, c, cn, &e, NULL);
    case 413:
        ks_api_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "The request body is larger than the limit of %lld bytes.", (long long)s->max_body);
        return ks__respond_error(s, c, cn, &e, NULL);
    default:
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "The request body could not be stored.");
        return ks__respond_error(s, c, cn, &e, NULL);
    }
}

/* The header fields that say how long the body is. */
typedef struct framing {
    int n_length;         /* Content-Length fields */
    int n_encoding;       /* Transfer-Encoding fields */
    const char *encoding; /* the first one's value */
    bool ws_name;         /* a field name with whitespace (before its colon) */
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    framing *f = cls;
    (void)kind;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) f->n_length++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) && !f->n_encoding++) f->encoding = value;
    if (key[strcspn(key, " \t")]) f->ws_name = true;
    return MHD_YES;
}

/* Why c's request cannot be delimited without guessing, or NULL. MHD takes
 * the first of several Content-Length fields, lets Transfer-Encoding win
 * over Content-Length, and keeps whitespace before a colon in the field's
 * name; a proxy in front of us may decide otherwise, and whatever the two
 * disagree on is read by one of them as the start of another request
 * (request smuggling). RFC 9112 6.3 and 5.1: reject with 400, then close.
 * (A Content-Length that is not a number MHD refuses itself: 400 before
 * on_request is called.) */
static const char *bad_framing(struct MHD_Connection *c, bool http11) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.ws_name) return "a header field name contains whitespace";
    if (f.n_length > 1) return "more than one Content-Length header";
    if (f.n_encoding && f.n_length) return "Content-Length together with Transfer-Encoding";
    if (f.n_encoding && !http11) return "Transfer-Encoding in an HTTP/1.0 request";
    if (f.n_encoding > 1 || (f.n_encoding && strcasecmp(f.encoding, "chunked")))
        return "a Transfer-Encoding other than chunked";
    return NULL;
}

/* The connection's record in the header watch (its socket context). */
static ks_hdrconn *hdrconn(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: counts open connections and marks those
 * beyond max_connections, answered 503 by on_request (server.h note 9);
 * puts each in the header watch (hdrwatch.h), its socket context. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    ks_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        int n = atomic_fetch_add(&s->http.connections, 1) + 1;
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const void *addr = NULL;
        int addr_len = 0;
        if (ai && ai->client_addr && ai->client_addr->sa_family == AF_INET) {
            addr = &((const struct sockaddr_in *)(const void *)ai->client_addr)->sin_addr;
            addr_len = 4;
        } else if (ai && ai->client_addr && ai->client_addr->sa_family == AF_INET6) {
            addr = &((const struct sockaddr_in6 *)(const void *)ai->client_addr)->sin6_addr;
            addr_len = 16;
        }
        ks_hdrconn *hc = ks_hdrwatch_open(s->hdrwatch, fi ? fi->connect_fd : -1, addr, addr_len);
        if (hc) hc->over_cap = n > s->max_connections;
        *socket_context = hc;
    } else {
        atomic_fetch_sub(&s->http.connections, 1);
        ks_hdrwatch_close(s->hdrwatch, *socket_context);
        *socket_context = NULL;
    }
}

/* MHD_OPTION_URI_LOG_CALLBACK: a request line is in, the headers and body
 * are due within the header timeout (a keep-alive connection was idle
 * under timeout_s until now). The result becomes *con_cls: none. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    ks_server *s = cls;
    (void)uri;
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->header_timeout_s);
    ks_hdrwatch_request_line(s->hdrwatch, hdrconn(c));
    return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    ks_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        /* Headers are in: route, authenticate, check the declared size. */
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        *con_cls = cn;
        cn->t0 = ks_now_ms();
        cn->rt = find_route(url);
        if (cn->rt) cn->fmt = cn->rt->fmt;
        bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        bool post = !strcmp(method, "POST");
        cn->post = post;
        snprintf(cn->method, sizeof cn->method, "%s", method);
        /* the route's path when there is one: the log then names one cause per
         * route, whatever query string came with it */
        snprintf(cn->url, sizeof cn->url, "%s", cn->rt ? cn->rt->path : url);
        /* An unknown path is logged as sent: no control character of it
         * reaches the log (a newline would forge a line). */
        for (char *u = cn->url; *u; u++)
            if ((unsigned char)*u < 0x20 || *u == 0x7f) *u = '?';
        cn->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        ks_hdrconn *hc = hdrconn(c);
        ks_hdrwatch_headers(s->hdrwatch, hc);
        const char *why = bad_framing(c, cn->http11);
        if (why || (hc && hc->over_cap)) {
            ks_api_error e;
            const char *const close_h[] = {MHD_HTTP_HEADER_CONNECTION, "close", NULL};
            const char *const busy_h[] = {MHD_HTTP_HEADER_CONNECTION, "close", "Retry-After", "1", NULL};
            if (why) {
                ks_api_error_set(&e, 400, "invalid_request_error", "invalid_framing", NULL,
                                 "The request's length is ambiguous: %s (RFC 9112 6.3).", why);
                return ks__respond_error(s, c, cn, &e, close_h);
            }
            ks_api_error_set(&e, 503, "server_error", "too_many_connections", NULL,
                             "The server is at its limit of %d connections. Retry later.", s->max_connections);
            return ks__respond_error(s, c, cn, &e, busy_h);
        }
        /* One model: the request's, held from here (its body is sized by it,
         * plan.h). With several, the body names it (request.c). */
        if (cn->rt && !s->multi && cn->rt->id != R_HEALTH && cn->rt->id != R_METRICS && cn->rt->id != R_MODELS &&
            cn->rt->id != R_TENANT && cn->rt->id != R_MODELS_LOAD && cn->rt->id != R_MODELS_UNLOAD) {
            ks_api_error me;
            (void)ks__models_acquire(s, NULL, false, &cn->m, &me);
        }
        if (!cn->rt) cn->early = 404;
        else if (s->n_cors_origins && !strcmp(method, "OPTIONS")) cn->options = true; /* no key: reply_options */
        else if (!((get && (cn->rt->methods & M_GET)) || (post && (cn->rt->methods & M_POST)))) cn->early = 405;
        else if (cn->rt->id != R_HEALTH)
            cn->early = ks__auth_check(s, c, cn->rt->id == R_METRICS, &cn->key_given, &cn->tenant);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (!errno && end != cl && n > (unsigned long long)s->max_body && !cn->early) cn->early = 413;
            /* Far too big: answer now (MHD then closes the connection) rather
             * than read it all. */
            if (!errno && end != cl && n > hard_cap(s)) {
                if (!cn->early || cn->early == 413) cn->early = 413;
                return reply_early(s, c, cn, method, url);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (!cn->early && cn->post) {
            if ((uint64_t)cn->body.len + n > (uint64_t)s->max_body) {
                cn->early = 413;
                cn->discarded = cn->body.len;
                ks_buf_free(&cn->body);
            } else if (ks_buf_append(&cn->body, upload_data, n)) {
                cn->early = 500;
                ks_buf_free(&cn->body);
            } else if ((cn->early = ks__plan_body(s, cn->m, cn->fmt ? cn->fmt->prescan : KS_PRESCAN_NONE, cn->body.s,
                                                  cn->body.len, &cn->prescan_next))) {
                /* Refused by what has come: the rest is read and dropped. */
                cn->discarded = cn->body.len;
                ks_buf_free(&cn->body);
            } else {
                return MHD_YES;
            }
        }
        cn->discarded += n;
        /* A body without Content-Length (chunked) beyond the hard cap: drop
         * the connection, there is no way to answer in the middle of a body
         * (libmicrohttpd 0.9.75's MHD_queue_response refuses a response
         * between the headers and the body's end; docs/SECURITY.md). */
        return cn->discarded > hard_cap(s) ? MHD_NO : MHD_YES;
    }
    /* The request is in: the header timeout was for reading it. The reply
     * may take long to make (a generation turns the timeout off) and to
     * send, and then the connection waits idle for the next request. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
    if (!cn->early && cn->post)
        cn->early = ks__plan_body(s, cn->m, cn->fmt ? cn->fmt->prescan : KS_PRESCAN_NONE, cn->body.s, cn->body.len, NULL);
    if (cn->early) return reply_early(s, c, cn, method, url);
    if (cn->options) return reply_options(s, c, cn);
    switch (cn->rt->id) {
    case R_HEALTH: return ks__util_health(s, c, cn);
    case R_MODELS: return ks__util_models(s, c, cn);
    case R_METRICS: return ks__util_metrics(s, c, cn);
    case R_SLOTS: return ks__util_slots(s, c, cn);
    case R_TENANT: return ks__util_tenant(s, c, cn);
    case R_CHAT:
    case R_COMPLETIONS:
    case R_RESPONSES:
    case R_MESSAGES: return ks__request_generate(s, c, cn, cn->rt->fmt);
    case R_TOKENIZE: return ks__util_tokenize(s, c, cn);
    case R_DETOKENIZE: return ks__util_detokenize(s, c, cn);
    case R_PROPS: return ks__util_props(s, c, cn);
    case R_APPLY_TEMPLATE: return ks__util_apply_template(s, c, cn);
    case R_COUNT_TOKENS: return ks__request_count_tokens(s, c, cn);
    case R_MODELS_LOAD: return ks__util_models_load(s, c, cn, true);
    case R_MODELS_UNLOAD: return ks__util_models_load(s, c, cn, false);
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    ks_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) return;
    ks_hdrwatch_done(s->hdrwatch, hdrconn(c));
    if (cn->g) ks__gen_request_done(cn->g, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
    ks__models_release(s, cn->m);
    KS_DEBUG(MOD, "%s -> %d in %.1f ms%s", cn->rt ? cn->rt->path : cn->url, cn->status, ks_now_ms() - cn->t0,
             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (terminated early)");
    ks_buf_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    ks_server *s = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    if (atomic_load(&s->starting)) snprintf(s->start_err, sizeof s->start_err, "%.255s", line);
    /* MHD reports every client that hangs up mid-response: not our error. */
    KS_DEBUG("mhd", "%s", line);
}

int ks__server_slots(ks_smodel *m, ks_slot_info *info) {
    int n = 0;
    pthread_rwlock_rdlock(&m->sched_lock);
    if (!m->detached) n = ks_sched_slots(m->sched, info, KS_MAX_SLOTS);
    pthread_rwlock_unlock(&m->sched_lock);
    return n < KS_MAX_SLOTS ? n : KS_MAX_SLOTS;
}

/* Each tenant's use, labelled by the key file's names and "other" (tenantstats.h):
 * only with several tenants, whose /metrics answers the metrics key alone. */
typedef struct tlabel {
    char name[KS_KEYRING_NAME_MAX + 1];
    uint64_t tenant;
    ks_tenant_usage u;
    int slots;
} tlabel;

typedef struct tlabels {
    ks_server *s;
    tlabel *v;
    int n, cap;
} tlabels;

static tlabel *label_row(tlabels *L, const char *name) {
    for (int i = 0; i < L->n; i++)
        if (!strcmp(L->v[i].name, name)) return &L->v[i];
    if (L->n == L->cap) return NULL;
    tlabel *t = &L->v[L->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

static void label_of(ks_server *s, uint64_t tenant, bool overflow, char *out, size_t n) {
    if (overflow || !ks_keyring_name(s->keys, tenant, out, n)) snprintf(out, n, "other");
}

static void tenant_row(void *ud, uint64_t tenant, bool overflow, const ks_tenant_usage *u) {
    tlabels *L = ud;
    char name[KS_KEYRING_NAME_MAX + 1];
    label_of(L->s, tenant, overflow, name, sizeof name);
    tlabel *t = label_row(L, name);
    if (!t) return;
    t->u.requests += u->requests;
    t->u.prompt_tokens += u->prompt_tokens;
    t->u.cached_tokens += u->cached_tokens;
    t->u.generated_tokens += u->generated_tokens;
}

/* The slots of one model that hold a tenant's KV, into its row. */
static void tenant_slots(void *ud, const ks_smodel *m, const ks_slot_info *info, int n) {
    tlabels *L = ud;
    (void)m;
    for (int i = 0; i < n; i++) {
        if (!ks__slot_held(&info[i])) continue;
        char name[KS_KEYRING_NAME_MAX + 1];
        label_of(L->s, info[i].tenant, false, name, sizeof name);
        tlabel *t = label_row(L, name);
        if (t) t->slots++;
    }
}

static void tenants_source(void *ud, ks_prom *p) {
    ks_server *s = ud;
    if (!s->tenants) return;
    tlabels L = {.s = s, .cap = KS_TENANTSTATS_MAX + 2};
    if (!(L.v = calloc((size_t)L.cap, sizeof *L.v))) {
        p->rc = KS_ENOMEM;
        return;
    }
    ks_tenantstats_each(s->tstats, tenant_row, &L);
    ks__models_slots(s, tenant_slots, &L);
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"kvstash_tenant_requests_total", "counter", "Generations finished, by tenant (the key file's names; other: the rest)"},
        {"kvstash_tenant_prompt_tokens_total", "counter", "Prompt tokens, by tenant"},
        {"kvstash_tenant_cached_tokens_total", "counter", "Prompt tokens read from a cache (slot, SPC, IMC, store), by tenant"},
        {"kvstash_tenant_generated_tokens_total", "counter", "Generated tokens, by tenant"},
        {"kvstash_tenant_slots", "gauge", "Slots whose KV is the tenant's now"},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        ks_prom_family(p, fam[f].name, fam[f].type, fam[f].help);
        for (int i = 0; i < L.n; i++) {
            const tlabel *t = &L.v[i];
            double v = f == 0 ? (double)t->u.requests : f == 1 ? (double)t->u.prompt_tokens
                     : f == 2 ? (double)t->u.cached_tokens : f == 3 ? (double)t->u.generated_tokens : t->slots;
            ks_prom_sample(p, fam[f].name, "tenant", t->name, v);
        }
    }
    free(L.v);
}

/* The tokenization cache's counters (engine/tokcache.h). */
static void tokcache_source(void *ud, ks_prom *p) {
    ks_smodel *m = ud;
    ks_tokcache_stats st;
    ks_tokcache_get_stats(m->tokcache, &st);
    ks_prom_counter(p, "kvstash_prompt_tokens_untokenized_total",
                    "Tokens of rendered prompts taken from the tokenization cache: pieces of text seen before.",
                    (double)st.hit_tokens);
    ks_prom_counter(p, "kvstash_prompt_tokens_tokenized_total", "Tokens of rendered prompts the tokenizer produced.",
                    (double)st.miss_tokens);
    ks_prom_gauge(p, "kvstash_tokcache_bytes", "Bytes the tokenization cache holds (texts and tokens).",
                  (double)st.bytes);
}

static void sched_source(void *ud, ks_prom *p) {
    ks_smodel *m = ud;
    ks_sched_stats st = {0};
    pthread_rwlock_rdlock(&m->sched_lock);
    if (!m->detached) ks_sched_stats_get(m->sched, &st);
    pthread_rwlock_unlock(&m->sched_lock);
    ks_metrics_sched(p, &st);
}

/* ------------------------------------------------------------- lifecycle */
/* The longest text of any token, in bytes (control tokens as their text):
 * each token of a tokenized text stands for at most this many of its bytes.
 * One pass over the vocabulary at start. */
static int longest_token(const ks_engine *e) {
    char buf[256];
    int m = 1, n_vocab = ks_engine_n_vocab(e);
    for (int32_t t = 0; t < n_vocab; t++) {
        int n = ks_engine_token_text(e, t, buf, sizeof buf); /* the length, also when it does not fit */
        if (n > m) m = n;
    }
    return m;
}

ks_server_params ks_server_params_default(void) {
    ks_server_params p = {0};
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_body_bytes = 16 << 20;
    p.default_max_tokens = -1;
    p.max_connections = 256;
    p.timeout_s = 600;
    p.header_timeout_s = 30;
    p.responses_max = 1024;
    p.models_max = 4;
    p.autoload = true;
    p.load_wait_ms = 600000;
    p.responses_ttl_s = 3600;
    p.max_renders = KS_ADMIT_DEFAULT;
    p.media = ks_media_in_limits_default();
    return p;
}

int ks__smodel_open(ks_server *s, ks_smodel *m, const ks_server_model_parts *pt, char *err, size_t errlen) {
    if (!pt->engine || !pt->sched) {
        ks_set_err(err, errlen, "the loader gave no engine or scheduler");
        return KS_EINVAL;
    }
    m->engine = pt->engine;
    m->sched = pt->sched;
    m->metrics = pt->metrics;
    snprintf(m->model_id, sizeof m->model_id, "%s", pt->model_id ? pt->model_id : m->name);
    m->max_token_bytes = longest_token(pt->engine);
    m->cache_prompt = pt->cache_prompt;
    m->exact = pt->exact;
    snprintf(m->spec_type, sizeof m->spec_type, "%s", pt->spec_type ? pt->spec_type : "none");
    m->draft_max = pt->draft_max;
    m->spec_on = ks_sched_spec_status(pt->sched, &m->spec_exact, &m->spec_reason);
    snprintf(m->store_mode, sizeof m->store_mode, "%s", pt->store_mode ? pt->store_mode : "");
    m->created = ks_wall_s();
    m->media = s->media;
    m->media.modalities = pt->media_modalities;
    if (!(m->memo = ks_prompt_memo_create(KS_SERVER_MEMO)) ||
        !(m->tokcache = ks_tokcache_create(pt->engine, KS_SERVER_TOKCACHE)))
        return KS_ENOMEM;
    /* KS_TOKCACHE=0: every prompt tokenized whole (a diagnostic, and the
     * benchmarks' baseline: bench/peer_lib.sh kvstash-no-tokcache) */
    const char *tc_env = getenv("KS_TOKCACHE");
    if (!(tc_env && !strcmp(tc_env, "0"))) {
        ks_prompt_memo_use_tokcache(m->memo, m->tokcache);
        /* After a restart the conversations warm start put into the slots come
         * back first: their renders find their pieces (a seed is checked by
         * tokenizing each piece once, here, before anything is served). */
        const ks_tokens *wt;
        const uint64_t *wn;
        int n_warm = ks_sched_warm_list(pt->sched, &wt, &wn), kept = 0;
        double t0 = ks_now_ms();
        for (int i = 0; i < n_warm; i++) kept += ks_tokcache_seed(m->tokcache, wn[i], wt[i].v, wt[i].n);
        if (n_warm > 0)
            KS_INFO("http", "tokenization cache: %d pieces from the %d warm slot(s)' conversations in %.1f ms", kept,
                    n_warm, ks_now_ms() - t0);
    }
    const char *tmpl_src = pt->chat_template ? pt->chat_template : s->chat_template;
    {
        /* From the engine's model (a second, vocabulary-only read of the
         * GGUF took ~50 ms of every load); the template object keeps text
         * only (chat_tmpl.h note 2). */
        char terr[512] = "";
        int trc = ks_chat_tmpl_create_for(m->engine, tmpl_src, &m->tmpl, terr, sizeof terr);
        if (trc && tmpl_src && tmpl_src[0]) {
            ks_set_err(err, errlen, "--chat-template: %s", terr[0] ? terr : ks_strerror(trc));
            return trc;
        }
        if (trc)
            KS_WARN("http", "%s: the model's chat template cannot be used (%s): chat falls back to llama.cpp's "
                            "built-in templates, without tools or structured output", m->name,
                    terr[0] ? terr : ks_strerror(trc));
        ks_presize_probe(m->tmpl, &m->presize);
        char *info = NULL;
        if (m->tmpl && !ks_chat_tmpl_info(m->tmpl, &info, terr, sizeof terr)) {
            json_t *j = json_loads(info, 0, NULL);
            json_t *caps = json_object_get(j, "caps");
            if (caps && !json_is_true(json_object_get(caps, "supports_tools")) &&
                !json_is_true(json_object_get(caps, "supports_tool_calls")))
                KS_WARN("http", "%s: the model's chat template renders no tools: a request with tools is answered "
                                "without them (no tool calls; the reply's cache.tools_ignored says so). Give a "
                                "template that does with --chat-template", m->name);
            json_decref(j);
        }
        free(info);
    }
    /* The model's own series (its scheduler, its tokenization cache) join
     * the loader's registry, rendered with the model's label (models.c). */
    if (m->metrics &&
        (ks_metrics_add(m->metrics, sched_source, m) || ks_metrics_add(m->metrics, tokcache_source, m)))
        return KS_ENOMEM;
    return 0;
}

void ks__smodel_close(ks_smodel *m) {
    ks_prompt_memo_free(m->memo);
    ks_tokcache_free(m->tokcache);
    ks_chat_tmpl_free(m->tmpl);
    m->memo = NULL;
    m->tokcache = NULL;
    m->tmpl = NULL;
    m->engine = NULL;
    m->sched = NULL;
    m->metrics = NULL;
}

int ks_server_start(const ks_server_params *p, ks_server **out, char *err, size_t errlen) {
    *out = NULL;
    if (p->port < 0 || p->port > 65535 || p->max_body_bytes <= 0 ||
        p->default_max_tokens == 0 || p->default_max_tokens < -1 || p->max_connections < 1 || p->max_connections > KS_SERVER_CONN_MAX ||
        p->max_connections_per_client < 0 || p->max_connections_per_client > p->max_connections ||
        p->timeout_s < 0 || p->header_timeout_s < 1 || p->responses_max < 0 || p->responses_ttl_s < 0) {
        ks_set_err(err, errlen, "invalid server parameters");
        return KS_EINVAL;
    }
    const char *host = p->host && p->host[0] ? p->host : "127.0.0.1";
    if (strlen(host) >= 256 || (p->api_key && strlen(p->api_key) >= 256)) {
        ks_set_err(err, errlen, "host or api key too long (255 bytes at most)");
        return KS_EINVAL;
    }
    int n_cors = p->cors_origins ? p->n_cors_origins : 0;
    if (n_cors < 0 || n_cors > KS_SERVER_CORS_MAX) {
        ks_set_err(err, errlen, "%d CORS origins (at most %d)", n_cors, KS_SERVER_CORS_MAX);
        return KS_EINVAL;
    }
    for (int i = 0; i < n_cors; i++) {
        if (!p->cors_origins[i] || !p->cors_origins[i][0] || strlen(p->cors_origins[i]) >= KS_SERVER_ORIGIN_MAX) {
            ks_set_err(err, errlen, "CORS origin %d empty or too long (%d bytes at most)", i, KS_SERVER_ORIGIN_MAX - 1);
            return KS_EINVAL;
        }
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", p->port);
    int g = getaddrinfo(host, port_s, &hints, &ai);
    if (g || !ai) {
        ks_set_err(err, errlen, "cannot resolve host '%s': %s", host, gai_strerror(g));
        return KS_EINVAL;
    }

    ks_server *s = calloc(1, sizeof *s);
    if (s) {
        s->own_metrics = p->metrics == NULL;
        s->metrics = p->metrics ? p->metrics : ks_metrics_create();
    }
    if (!s || !s->metrics) {
        free(s);
        freeaddrinfo(ai);
        return KS_ENOMEM;
    }
    s->quiesced_fd = MHD_INVALID_SOCKET;
    snprintf(s->host, sizeof s->host, "%s", host);
    int krc = ks__auth_open(s, p, err, errlen);
    if (krc) {
        ks_server_free(s);
        freeaddrinfo(ai);
        return krc;
    }
    s->max_body = p->max_body_bytes;
    s->default_max_tokens = p->default_max_tokens;
    s->timeout_s = (unsigned)p->timeout_s;
    s->header_timeout_s = (unsigned)p->header_timeout_s;
    s->max_connections = p->max_connections;
    s->created = ks_wall_s();
    s->http.started_us = ks_now_us();
    snprintf(s->reasoning_format, sizeof s->reasoning_format, "%s", p->reasoning_format ? p->reasoning_format : "");
    s->spm_infill = p->spm_infill;
    s->media = p->media;
    s->fetch = p->media_fetch;
    s->fetch.dir = p->media_fetch.dir && *p->media_fetch.dir ? strdup(p->media_fetch.dir) : NULL;
    s->fetch.hosts = p->media_fetch.hosts && *p->media_fetch.hosts ? strdup(p->media_fetch.hosts) : NULL;
    s->media.fetch = &s->fetch;
    s->media.modalities = 0;
    if ((p->media_fetch.dir && *p->media_fetch.dir && !s->fetch.dir) ||
        (p->media_fetch.hosts && *p->media_fetch.hosts && !s->fetch.hosts) ||
        !(s->convs = ks_convstore_create(p->responses_max, p->responses_ttl_s)) ||
        !(s->refusals = ks_refusals_create()) || !(s->tstats = ks_tenantstats_create()) ||
        !(s->admit_ok = ks_admit_init(&s->admit, p->max_renders) == 0)) {
        ks_server_free(s);
        freeaddrinfo(ai);
        return KS_ENOMEM;
    }
    for (int i = 0; i < n_cors; i++) {
        snprintf(s->cors_origins[i], sizeof s->cors_origins[i], "%s", p->cors_origins[i]);
        if (!strcmp(p->cors_origins[i], "*")) s->cors_any = true;
    }
    s->n_cors_origins = n_cors;
    if (p->chat_template_all && !(s->chat_template = strdup(p->chat_template_all))) {
        ks_server_free(s);
        freeaddrinfo(ai);
        return KS_ENOMEM;
    }
    /* The models: the pinned ones load now (models.c). */
    int mrc = ks__models_start(s, p, err, errlen);
    if (mrc) {
        ks_server_free(s);
        freeaddrinfo(ai);
        return mrc;
    }
    /* The server's own sources; the caller's (store...) are already in the
     * registry. Sources are only added before the daemon starts (metrics.h). */
    if (ks_metrics_add(s->metrics, ks__models_metrics, s) || ks_metrics_add(s->metrics, ks_metrics_http, &s->http) ||
        ks_metrics_add(s->metrics, ks_metrics_admit, &s->admit) || ks_metrics_add(s->metrics, tenants_source, s)) {
        ks_server_free(s);
        freeaddrinfo(ai);
        return KS_ENOMEM;
    }

    /* server.h note 9: MHD accepts the spare band beyond max_connections so
     * that on_request can answer it 503. The per-address cap is the header
     * watch's (hdrwatch.h): a connection beyond it takes the place of one
     * of its address's still awaiting headers (MHD's own per-address limit
     * would refuse it at accept while the cut one is still counted). */
    unsigned per_client = (unsigned)(p->max_connections_per_client ? p->max_connections_per_client
                                                                    : (p->max_connections + 1) / 2);
    if (ks_hdrwatch_start((unsigned)p->header_timeout_s, (unsigned)p->timeout_s, (int)per_client, &s->hdrwatch)) {
        ks_server_free(s);
        freeaddrinfo(ai);
        return KS_ENOMEM;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    atomic_store(&s->starting, true);
    s->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections + KS_SERVER_CONN_SPARE,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->header_timeout_s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_END);
    int saved = errno;
    atomic_store(&s->starting, false);
    freeaddrinfo(ai);
    if (!s->d) {
        ks_set_err(err, errlen, "cannot listen on %s:%d: %s", host, p->port,
                   s->start_err[0] ? s->start_err : strerror(saved));
        ks_server_free(s);
        return KS_EIO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    *out = s;
    return 0;
}

int ks_server_port(const ks_server *s) { return s->port; }

void ks_server_reload_keys(ks_server *s) { ks_keyring_reload(s->keys); }

int ks_server_tenant_by_parse(const char *list, unsigned *bits) {
    static const struct {
        const char *name;
        unsigned bit;
    } k[] = {{"prompt_cache_key", KS_TENANT_BY_PROMPT_CACHE_KEY}, {"cache_salt", KS_TENANT_BY_CACHE_SALT},
             {"user", KS_TENANT_BY_USER}, {"none", 0}};
    *bits = 0;
    for (const char *p = list ? list : ""; *p;) {
        size_t n = strcspn(p, ",");
        bool ok = n == 0;
        for (size_t i = 0; i < sizeof k / sizeof k[0] && !ok; i++)
            if (strlen(k[i].name) == n && !strncmp(p, k[i].name, n)) *bits |= k[i].bit, ok = true;
        if (!ok) return KS_EINVAL;
        p += n + (p[n] == ',');
    }
    return 0;
}

void ks_server_quiesce(ks_server *s) {
    if (atomic_exchange(&s->draining, true)) return;
    if (s->d) s->quiesced_fd = MHD_quiesce_daemon(s->d);
}

int ks_server_n_active(ks_server *s) { return atomic_load(&s->n_active); }

void ks_server_detach_sched(ks_server *s) {
    atomic_store(&s->draining, true);
    for (int i = 0; s->m && i < s->n_models; i++) {
        pthread_rwlock_wrlock(&s->m[i].sched_lock);
        s->m[i].detached = true;
        pthread_rwlock_unlock(&s->m[i].sched_lock);
    }
}

void ks_server_free(ks_server *s) {
    if (!s) return;
    /* Every model's scheduler stopped (what is left is canceled, every
     * on_done runs, its slots go to the store) before the wait below for the
     * replies still being written; the engines go after the daemon. */
    atomic_store(&s->draining, true);
    ks__models_stop(s);
    /* Requests whose generation just ended (canceled by ks_sched_free) still
     * have to write their last bytes: a 503 body, a stream's error event.
     * Stopping the daemon now would cut them off, so give them a moment;
     * a client that does not read holds this up by at most the bound. */
    for (int i = 0; i < FREE_WAIT_MS / 10 && atomic_load(&s->n_active) > 0; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    ks__models_unload_all(s); /* no connection is left to read an engine */
    ks_hdrwatch_stop(s->hdrwatch);
    ks_tenantstats_free(s->tstats);
    /* MHD hands the listening socket to whoever quiesced: ours to close,
     * and only after the daemon stopped (its threads may still use it). */
    if (s->quiesced_fd != MHD_INVALID_SOCKET) close(s->quiesced_fd);
    if (s->own_metrics) ks_metrics_free(s->metrics);
    ks_refusals_free(s->refusals);
    ks_convstore_free(s->convs);
    ks__models_free(s);
    free(s->chat_template);
    if (s->admit_ok) ks_admit_fini(&s->admit);
    ks_keyring_free(s->keys);
    free((char *)s->fetch.dir);
    free((char *)s->fetch.hosts);
    ks_keyring_free(s->metrics_keys);
    free(s);
}

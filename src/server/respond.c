/*
 * respond.c — every reply goes out here (server_int.h): a body, JSON, or an
 * error in the shape of the request's format, each with its CORS headers
 * and its status counted; and the log of what a request carried that the
 * server went on without.
 *
 * It calls nothing else of the server's files: the handlers (utility.c,
 * request.c, gen.c) and the HTTP layer (server.c) call it.
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/fmt.h"
#include "server/refusals.h"
#include "server/server_int.h"

#define MOD "http"

enum MHD_Result ks__respond(ks_server *s, struct MHD_Connection *c, conn *cn, int status, const char *ctype,
                          char *body, size_t len, const char *const *hdrs) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    if (ctype) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    for (int i = 0; hdrs && hdrs[i]; i += 2) MHD_add_response_header(r, hdrs[i], hdrs[i + 1]);
    ks__cors_headers(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ks_http_count(&s->http, status);
    if (cn) cn->status = status;
    return rc;
}

enum MHD_Result ks__respond_json(ks_server *s, struct MHD_Connection *c, conn *cn, int status, json_t *obj,
                               const char *const *hdrs) {
    char *body = obj ? ks_api_dump(obj) : NULL;
    json_decref(obj);
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":\"out_of_memory\"}}";
        body = strdup(oom);
        status = 500;
        if (!body) return MHD_NO;
    }
    return ks__respond(s, c, cn, status, "application/json; charset=utf-8", body, strlen(body), hdrs);
}

enum MHD_Result ks__respond_error(ks_server *s, struct MHD_Connection *c, conn *cn, const ks_api_error *e,
                                const char *const *hdrs) {
    /* A refusal is the client's problem, but the operator must be able to see
     * it without debug logging (refusals.h: once per cause). */
    if (e->status >= 400 && e->status < 500)
        ks_refusals_note(s->refusals, cn ? cn->method : "?", cn ? cn->url : "?", e->status, e->code, e->param,
                         e->message);
    /* Each route answers in its format's shape (Anthropic's with its own types). */
    json_t *o = cn && cn->fmt ? cn->fmt->error_json(e) : ks_api_error_json(e);
    return ks__respond_json(s, c, cn, e->status, o, hdrs);
}

void ks__log_notes(ks_server *s, const conn *cn, const ks_api_notes *n) {
    for (int i = 0; n && i < n->n; i++)
        ks_refusals_ignored(s->refusals, cn ? cn->method : "?", cn ? cn->url : "?", n->v[i].field, n->v[i].what);
    if (n && n->n_total > n->n)
        KS_DEBUG(MOD, "%s %s: %d more fields ignored", cn ? cn->method : "?", cn ? cn->url : "?", n->n_total - n->n);
}

/* -------------------------------------------------------------------- CORS */
/* Response headers a page may read besides the safelisted ones: the SDKs
 * read Retry-After on a 503 to back off. */
#define CORS_EXPOSE "Retry-After, WWW-Authenticate, Allow"
/* The Access-Control-Allow-Origin of a reply to c's request, or NULL (not
 * allowed, no Origin, CORS off). "*" when any origin is allowed: the
 * wildcard is valid because credentials never are. Else the request's own
 * Origin, borrowed from MHD for the request's life. */
const char *ks__cors_origin(const ks_server *s, struct MHD_Connection *c) {
    const char *o = s->n_cors_origins ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin") : NULL;
    if (!o) return NULL;
    if (s->cors_any) return "*";
    for (int i = 0; i < s->n_cors_origins; i++)
        if (!strcasecmp(o, s->cors_origins[i])) return o;
    return NULL;
}

void ks__cors_headers(const ks_server *s, struct MHD_Connection *c, struct MHD_Response *r) {
    if (!s->n_cors_origins) return;
    /* The reply depends on the Origin (echoed, or no header for another
     * one): a cache must not hand one origin's reply to another. */
    MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
    const char *o = ks__cors_origin(s, c);
    if (!o) return;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, o);
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_EXPOSE_HEADERS, CORS_EXPOSE);
}

/*
 * server_int.h — the HTTP server's internal state and the calls between its
 * files, which run one way, along a request's path (docs/ARCHITECTURE.md
 * "The server, file by file"):
 *
 *   server.c   the libmicrohttpd layer: lifecycle, routing (each route names
 *              its format, fmt.h), authentication, CORS, limits, framing
 *   utility.c  the small endpoints: health, models, metrics, slots, and
 *              llama-server's tokenize, detokenize, props, apply-template
 *   request.c  a generation route: body -> the format's parser -> plan
 *              (plan.c) -> generation (gen.c) -> reply
 *   gen.c      the live generation; output.c and reply.c make its reply
 *              through the format's table (fmt_*.c)
 *   respond.c  every HTTP response goes out here (errors in the route's
 *              format's shape)
 * The api*.c files are pure JSON in and out, below all of these.
 *
 * Thread model: see server.h. The fields of ks_server are set by
 * ks_server_start and read-only afterwards, except those marked otherwise.
 */
#ifndef KS_SERVER_INT_H
#define KS_SERVER_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "prompt/presize.h"
#include "server/admit.h"
#include "server/api.h"
#include "server/lptext.h"
#include "server/server.h"

/* A model of the table (models.c). The entry lives as long as the server;
 * what a load makes (engine, scheduler, template...) comes and goes with the
 * model. A request holds a reference (ks__models_acquire) from the moment its
 * model is resolved until its generation is freed: the model is not unloaded
 * under it, and its loaded fields may be read without a lock meanwhile. */
typedef enum { KS_SMODEL_UNLOADED = 0, KS_SMODEL_LOADING, KS_SMODEL_LOADED, KS_SMODEL_UNLOADING } ks_smodel_state;

typedef struct ks_smodel {
    /* fixed by ks_server_start */
    int index;
    char name[256];
    char path[512];
    char aliases[KS_SERVER_ALIASES_MAX][256];
    int n_aliases;
    bool pin;
    int keep_alive_s;
    int64_t est_bytes;
    /* under the table's lock (models.c) */
    ks_smodel_state state;
    bool failed;                /* the last load failed: reason says why */
    char reason[512];
    int refs;                   /* requests holding it */
    double last_used_ms;        /* monotonic: the last release (or acquire) */
    bool want_load;             /* the loading thread is asked to load it */
    bool want_unload;           /* ... to unload it when no request holds it */
    uint64_t loads, unloads;    /* counted for /metrics */
    /* The scheduler is called only under sched_lock (read) and while
     * !detached (gen.c H1): an unload detaches first. Persistent, so a
     * request that outlives its model's unload at shutdown can still ask. */
    pthread_rwlock_t sched_lock;
    bool detached;              /* under sched_lock */
    /* set by a load, read-only while loaded */
    ks_engine *engine;
    ks_sched *sched;
    char model_id[512];
    ks_media_limits media;      /* the server's limits with this model's modalities */
    int max_token_bytes;        /* the longest text of a token, in bytes (plan.c) */
    ks_presize presize;         /* what the template is known to copy into a prompt */
    struct ks_chat_tmpl *tmpl;  /* NULL: llama.cpp's built-in templates, without tools */
    struct ks_prompt_memo *memo;  /* render results across requests (prompt_tmpl.h) */
    struct ks_tokcache *tokcache; /* rendered prompts' pieces, tokenized (engine/tokcache.h) */
    bool cache_prompt;
    bool exact;
    char spec_type[24];         /* /props (server.h) */
    int draft_max;
    bool spec_on, spec_exact;   /* the scheduler's ks_sched_spec_status */
    const char *spec_reason;
    char store_mode[16];        /* "" : not shown */
    int64_t created;            /* wall clock of the load */
    ks_metrics *metrics;        /* the loader's registry with the server's sources added */
} ks_smodel;

struct ks_models;

struct ks_server {
    struct ks_models *models;   /* the table (models.c) */
    int n_models;
    ks_smodel *m;               /* [n_models] */
    bool multi;                 /* several models: per-model labels, status lists */
    _Atomic bool draining;
    _Atomic int n_active;       /* live generations */
    struct MHD_Daemon *d;
    MHD_socket quiesced_fd;
    _Atomic bool starting;      /* MHD log lines go to start_err while starting */
    char start_err[256];
    int port;
    char host[256];
    struct ks_keyring *keys;    /* API keys and their tenants (keyring.h); NULL: none */
    struct ks_keyring *metrics_keys; /* the metrics key (auth.c); NULL: none */
    bool tenants;               /* several tenants: a key or key file per tenant (keyring.h 3) */
    unsigned tenant_by;         /* KS_TENANT_BY_* (server.h) */
    int64_t max_body;
    ks_media_limits media;      /* image and audio input: the limits (modalities: each model's) */
    ks_media_fetch_cfg fetch;   /* media.fetch points here; its strings are owned */
    int default_max_tokens;
    unsigned timeout_s;         /* idle keep-alive (server.h note 9) */
    unsigned header_timeout_s;  /* headers and body */
    struct ks_hdrwatch *hdrwatch; /* the whole-header deadline (hdrwatch.h) */
    struct ks_tenantstats *tstats; /* each tenant's use (tenantstats.h) */
    int max_connections;        /* served; the spare band beyond gets 503 */
    ks_admit admit;             /* renders and grammar builds at once (admit.h) */
    bool admit_ok;              /* admit initialised */
    char *chat_template;        /* --chat-template's source for every model, NULL: each GGUF's */
    char reasoning_format[24];  /* the requests' default, "" : the library's */
    bool spm_infill;            /* /infill's order (--spm-infill) */
    int64_t created;
    ks_metrics *metrics;
    bool own_metrics;
    ks_http_counters http;
    struct ks_convstore *convs; /* Responses conversations, for previous_response_id */
    struct ks_refusals *refusals; /* refused requests, logged once per cause (refusals.h) */
    /* CORS (server.h note 7): the allowed origins, none: off. */
    char cors_origins[KS_SERVER_CORS_MAX][KS_SERVER_ORIGIN_MAX];
    int n_cors_origins;
    bool cors_any;              /* "*" is one of them */
};

typedef struct ks_gen ks_gen;
struct ks_convstore;

struct ks_fmt;
typedef struct route route;

/* One HTTP request on its connection thread. */
typedef struct conn {
    const route *rt;
    bool post;            /* the method is POST (routes may take GET and POST) */
    char method[8];       /* as sent, truncated (for the log) */
    char url[128];        /* as sent, truncated (for the log) */
    int early;            /* status decided when the headers came in, 0: none */
    bool key_given;       /* for the 401 message */
    uint64_t tenant;      /* the key's tenant (keyring.h), 0: single tenant */
    bool options;         /* OPTIONS on a route with CORS on: reply_options answers */
    bool http11;          /* HTTP/1.1, not 1.0 (framing; an interim 1xx response may be sent) */
    ks_buf body;
    uint64_t discarded;
    uint64_t prescan_next; /* the body length of the next prescan (plan.h ks__plan_body) */
    int status;
    double t0;
    ks_gen *g;            /* the HTTP reference of a generation, dropped when the request ends */
    ks_smodel *m;         /* the request's model, held (ks__models_acquire) until the request ends */
    const struct ks_fmt *fmt; /* the route's format (fmt.h): its errors' shape; NULL: OpenAI's */
} conn;

/* The table of models (models.c). ks__models_start: the entries of p, the
 * loading thread, and the pinned models loaded (a failure is an error only
 * when p has one entry). At shutdown (ks_server_free): ks__models_stop joins
 * the thread, detaches every loaded model and stops its scheduler (the
 * loader's stop); after the daemon stopped, ks__models_unload_all unloads
 * them (the loader's unload, shutdown true); ks__models_free frees the table.
 *
 * ks__models_acquire: the model name (NULL or "": none given) resolves to —
 * an entry's name, alias or alias pattern, else the default model — held in
 * *m once loaded (loading it first when autoload is on, waiting at most
 * load_wait_ms). Errors fill e: 404 model_not_found (no such model, no
 * default), 400 model_required (none named, several models, no default),
 * 503 model_loading (still loading after the wait; Retry-After),
 * 503 model_not_loaded (autoload off), 500 model_load_failed (with the
 * reason). wait false: only a model already loaded is held (else
 * model_not_loaded). ks__models_ref takes one more reference on a held
 * model; ks__models_release drops one (NULL: nothing).
 *
 * ks__models_load / ks__models_unload: POST /models/load and /models/unload
 * of the model name: 0 (asked: the loading thread does it), or e filled.
 * ks__models_json: /v1/models' data array. */
int ks__models_start(ks_server *s, const ks_server_params *p, char *err, size_t errlen);
void ks__models_stop(ks_server *s);
void ks__models_unload_all(ks_server *s);
void ks__models_free(ks_server *s);
int ks__models_acquire(ks_server *s, const char *name, bool wait, ks_smodel **m, ks_api_error *e);
void ks__models_ref(ks_server *s, ks_smodel *m);
void ks__models_release(ks_server *s, ks_smodel *m);
int ks__models_load(ks_server *s, const char *name, ks_api_error *e);
int ks__models_unload(ks_server *s, const char *name, ks_api_error *e);
json_t *ks__models_json(ks_server *s);
/* GET /props without a model on a server of several models and no default
 * model: llama-server's router answer (role "router", its limits, a dummy
 * model and generation settings so that a web UI reading /props at start
 * keeps working) with kvstash.models, the names; NULL when a model answers
 * instead (one model, or a default) or without memory. */
json_t *ks__models_router_props(ks_server *s);
/* fn(ud, m, its slots) for each loaded model in turn (none is loaded for
 * it; each held while fn runs). Returns how many. */
int ks__models_slots(ks_server *s, void (*fn)(void *ud, const ks_smodel *m, const ks_slot_info *info, int n),
                     void *ud);
/* The server's per-model state of a loaded model (server.c): template, caches,
 * limits from parts; ks__smodel_close frees them. */
int ks__smodel_open(ks_server *s, ks_smodel *m, const ks_server_model_parts *parts, char *err, size_t errlen);
void ks__smodel_close(ks_smodel *m);
/* The /metrics source that renders each loaded model's registry (labelled
 * model="NAME" with several models) and the table's own series. */
void ks__models_metrics(void *ud, ks_prom *p);

/* Who may use a route (auth.c). ks__auth_open makes the key rings of p
 * (their errors in err: KS_EINVAL, KS_ENOMEM) and says at start what they
 * are. ks__auth_check: 0 (allowed; *tenant the key's), 401 (no key or a
 * wrong one; *given whether one came) or 403 (/metrics with a tenant's key
 * on a server of several tenants). metrics: the route is /metrics. */
int ks__auth_open(ks_server *s, const ks_server_params *p, char *err, size_t errlen);
int ks__auth_check(ks_server *s, struct MHD_Connection *c, bool metrics, bool *given, uint64_t *tenant);

/* Replies (respond.c). Each queues the response, counts its status and sets
 * cn->status (cn may be NULL). */
/* body is owned and freed here; hdrs: name, value, ..., NULL (may be NULL);
 * ctype NULL: no Content-Type (a 204). */
enum MHD_Result ks__respond(ks_server *s, struct MHD_Connection *c, conn *cn, int status, const char *ctype,
                          char *body, size_t len, const char *const *hdrs);
/* A whole reply o (stolen) with the logprobs of lpt[0, n) spliced in place
 * of their placeholders (lptext.h; lptext.c); a 500 when memory runs out. */
enum MHD_Result ks__respond_spliced(ks_server *s, struct MHD_Connection *c, conn *cn, json_t *o,
                                  ks_lptext *const *lpt, int n);
/* obj is stolen. */
enum MHD_Result ks__respond_json(ks_server *s, struct MHD_Connection *c, conn *cn, int status, json_t *obj,
                               const char *const *hdrs);
enum MHD_Result ks__respond_error(ks_server *s, struct MHD_Connection *c, conn *cn, const ks_api_error *e,
                                const char *const *hdrs);
/* Logs what the request carried and the server went on without (api.h
 * ks_api_notes), once per cause (refusals.h). n may be NULL. */
void ks__log_notes(ks_server *s, const conn *cn, const ks_api_notes *n);
/* Adds to r the CORS headers of a reply to c's request: nothing when CORS is
 * off; else Vary: Origin, and when the request's Origin is allowed,
 * Access-Control-Allow-Origin and Access-Control-Expose-Headers. Every
 * response goes through it before MHD_queue_response: the replies above do,
 * and so must one made elsewhere (gen.c's SSE stream), or a browser on
 * another origin cannot read it. */
void ks__cors_headers(const ks_server *s, struct MHD_Connection *c, struct MHD_Response *r);
/* The Access-Control-Allow-Origin of a reply to c's request, or NULL (not
 * allowed, no Origin, CORS off): "*" when any origin is allowed, else the
 * request's own Origin, borrowed from MHD for the request's life. */
const char *ks__cors_origin(const ks_server *s, struct MHD_Connection *c);

/* The small endpoints (utility.c), each the whole request: GET /health
 * (also "/"), GET /v1/models, GET /metrics, GET /slots; POST /tokenize,
 * POST /detokenize, GET /props and POST /props (501, as llama-server
 * without --props). */
enum MHD_Result ks__util_health(ks_server *s, struct MHD_Connection *c, conn *cn);
enum MHD_Result ks__util_models(ks_server *s, struct MHD_Connection *c, conn *cn);
/* POST /models/load (load true) and /models/unload: {"model": NAME}. */
enum MHD_Result ks__util_models_load(ks_server *s, struct MHD_Connection *c, conn *cn, bool load);
/* The model of a utility request, into cn->m (held until the request ends):
 * already there (one model), else the one named (NULL: the default);
 * 0, or e filled. */
int ks__util_model(ks_server *s, conn *cn, const char *name, ks_api_error *e);
enum MHD_Result ks__util_metrics(ks_server *s, struct MHD_Connection *c, conn *cn);
enum MHD_Result ks__util_slots(ks_server *s, struct MHD_Connection *c, conn *cn);
/* The scheduler's slots into info (KS_MAX_SLOTS of them at most), under
 * sched_lock; 0 once the scheduler is detached. */
int ks__server_slots(ks_smodel *m, ks_slot_info *info);
/* A slot holds its tenant's KV or request (an empty idle slot is no one's). */
static inline bool ks__slot_held(const ks_slot_info *si) { return si->n_tokens > 0 || si->busy; }
/* GET /tenant: the key's own tenant's use (tenantstats.h), nothing of others. */
enum MHD_Result ks__util_tenant(ks_server *s, struct MHD_Connection *c, conn *cn);
enum MHD_Result ks__util_tokenize(ks_server *s, struct MHD_Connection *c, conn *cn);
enum MHD_Result ks__util_detokenize(ks_server *s, struct MHD_Connection *c, conn *cn);
enum MHD_Result ks__util_props(ks_server *s, struct MHD_Connection *c, conn *cn);
enum MHD_Result ks__util_apply_template(ks_server *s, struct MHD_Connection *c, conn *cn);

/* The generation routes (request.c), each the whole request: the body
 * through fmt's parser, the plan, the generation, the reply. fmt: the
 * route's format (fmt.h). */
enum MHD_Result ks__request_generate(ks_server *s, struct MHD_Connection *c, conn *cn, const struct ks_fmt *fmt);
/* POST /v1/messages/count_tokens: the prompt's token count. */
enum MHD_Result ks__request_count_tokens(ks_server *s, struct MHD_Connection *c, conn *cn);
/* The body of cn as a request in fmt's format: into *rq (free with
 * ks_api_request_free) and the format's state *st (fmt->free_state), with
 * the server's defaults applied (its reasoning format). 0, or a KS_E* code
 * with e filled and nothing to free. /apply-template renders through it. */
int ks__request_parse(ks_server *s, const struct ks_fmt *fmt, conn *cn, ks_api_request *rq, void **st,
                      ks_api_error *e);
#endif

/*
 * server.h — the HTTP server of `kvstash serve` (libmicrohttpd).
 *
 * Owns the MHD daemon, the routing table, authentication, body limits, the
 * per-request generation objects, the /metrics registry and the table of
 * models (models.c: one or several, each loaded on demand by the caller's
 * loader, which makes its engine and scheduler).
 *
 * Endpoints (docs/SERVER.md; the table is server.c's ROUTES):
 *   POST /v1/chat/completions  (also /chat/completions)   stream and non-stream
 *   POST /v1/completions       (also /completions)        stream and non-stream
 *   POST /v1/responses         (also /responses)          OpenAI Responses
 *   POST /v1/messages, /v1/messages/count_tokens          Anthropic Messages
 *   GET  /v1/models            (also /models); POST /models/load, /models/unload
 *   GET  /health               (also /, /v1/health) {"status":"ok"}; never needs the API key
 *   GET  /metrics              Prometheus text
 *   GET  /slots                slot table as JSON
 *   POST /tokenize, /detokenize, /apply-template, GET /props   llama-server's
 *   OPTIONS on any of them     CORS preflight, when cors_origins is set
 *
 * Design notes
 *  1. Thread per connection (MHD_USE_THREAD_PER_CONNECTION): a handler may
 *     block on its own request without holding up anyone else. The inference
 *     thread never blocks on HTTP: its callbacks append text to the request's
 *     buffer under a short mutex and signal; the connection thread formats
 *     and writes. A slow client only grows its own buffer (bounded by
 *     max_tokens).
 *  2. A generation object is reference-counted: one reference for the HTTP
 *     request, one for the scheduler (dropped in on_done), one for a
 *     streaming response's content reader. It is freed when the last goes.
 *  3. A client that goes away is noticed while its connection thread waits
 *     (the socket is polled every 200 ms) or by MHD's request-completed
 *     callback (a failed write); either cancels the request in the
 *     scheduler, so its slot frees within one decode step. A client that
 *     shut down its sending side (end of file on the socket) may still read
 *     its reply — a half-close — or may have closed the socket, and TCP tells
 *     the two apart only when something is written: so the wait writes a
 *     probe that any HTTP client ignores (an SSE comment in a stream; an
 *     interim "100 Continue" before a whole HTTP/1.1 reply), at most once a
 *     second, and a closed peer answers it with a reset (POLLHUP/POLLERR).
 *     A request canceled because its client left ends as "cancel" (log,
 *     kvstash_requests_canceled_total), never as "stop".
 *  4. Every response status is counted (/metrics); every error body has
 *     OpenAI's shape (api.h).
 *  5. Chat requests carry the scheduler's cache hints: the message-prefix
 *     hashes (IMC) and, for a leading system message whose rendered tokens
 *     are exactly the prompt's first tokens, its SPC key and token count.
 *     Hints only steer routing; the scheduler compares tokens before reusing.
 *  6. Shutdown order (cmd_serve.c): ks_server_quiesce (no new connections,
 *     new requests get 503) → wait for ks_server_n_active() == 0 or a
 *     timeout → ks_server_detach_sched (no server thread calls a model's
 *     scheduler after it returns) → ks_server_free (unloads every model: the
 *     loader frees its scheduler, which cancels what is left and runs every
 *     on_done; then stops MHD and joins the connection threads).
 *  7. CORS is off without cors_origins: no response carries a CORS header
 *     and OPTIONS is a 405 like any other method. With it, every response
 *     (errors and streams too) to a request whose Origin is allowed carries
 *     Access-Control-Allow-Origin, and a preflight (OPTIONS) needs no API
 *     key. Credentials (cookies) are never allowed.
 *  8. A request with ambiguous framing (two Content-Length fields,
 *     Content-Length with Transfer-Encoding, a Transfer-Encoding other than
 *     chunked, whitespace before a field name's colon) is a 400 and the
 *     connection is closed (RFC 9112 6.3, 5.1): nothing after it on that
 *     connection is read as a request.
 *  9. Slow or idle clients cannot hold every connection: headers and body
 *     must come within header_timeout_s of silence (an idle keep-alive
 *     connection between requests has timeout_s); one client address holds
 *     at most max_connections_per_client connections (libmicrohttpd closes
 *     the next at once); beyond max_connections, the next
 *     KS_SERVER_CONN_SPARE connections get a 503 "too_many_connections" and
 *     are closed, and only beyond those do new connections wait in the
 *     kernel's backlog.
 *
 * Thread model: start/quiesce/detach/free on one (the main) thread; the
 * rest of the work runs on MHD's threads and, for the callbacks, on the
 * scheduler's inference thread.
 */
#ifndef KS_SERVER_H
#define KS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "sched/sched.h"
#include "server/media_fetch.h"
#include "server/media_in.h"
#include "server/metrics.h"

typedef struct ks_server ks_server;

/* cors_origins: at most this many, each shorter than KS_SERVER_ORIGIN_MAX.
 * KS_SERVER_CONN_SPARE: connections beyond max_connections accepted only to
 * be answered 503 (note 9). KS_SERVER_CONN_MAX: the largest max_connections;
 * each connection is a thread and a descriptor that libmicrohttpd's
 * select() must fit below FD_SETSIZE (1024) with the spare band. */
enum { KS_SERVER_CORS_MAX = 16, KS_SERVER_ORIGIN_MAX = 256, KS_SERVER_CONN_SPARE = 16, KS_SERVER_CONN_MAX = 960 };

/* Request fields that may subdivide a tenant (ks_server_params.tenant_by):
 * OpenAI's prompt_cache_key, vLLM's cache_salt, and the end user (OpenAI's
 * user, Anthropic's metadata.user_id). */
enum { KS_TENANT_BY_PROMPT_CACHE_KEY = 1u << 0, KS_TENANT_BY_CACHE_SALT = 1u << 1, KS_TENANT_BY_USER = 1u << 2 };
/* Parses a comma-separated list of "prompt_cache_key", "cache_salt", "user"
 * (or "none", ""): 0 and *bits, or KS_EINVAL. */
int ks_server_tenant_by_parse(const char *list, unsigned *bits);

/* ------------------------------------------------------- several models
 * The server serves the models of its table (models.c: routing, loading,
 * unloading; docs/SERVER.md "Several models"). Each entry is loaded by the
 * caller's loader, on demand, off the HTTP threads; a model's KV and
 * scheduler go with it when it is unloaded, its store stays with the loader. */

/* What the server needs of a loaded model; the loader fills it. Borrowed
 * until the loader's unload. */
typedef struct ks_server_model_parts {
    ks_engine *engine;
    ks_sched *sched;
    const char *model_id;     /* what besides the text makes a system prompt's KV differ
                                 (model, context parameters): part of the SPC key; copied.
                                 NULL: the model's name */
    const char *chat_template;   /* Jinja source used instead of the GGUF's; NULL: the GGUF's */
    unsigned media_modalities;   /* KS_MEDIA_IN_* the model's projector takes (0: none) */
    bool cache_prompt;        /* shown in /v1/models meta (the scheduler's setting) */
    bool exact;               /* shown in /props (the scheduler's setting) */
    const char *spec_type;    /* speculative decoding's type for /props (NULL: "none"), copied */
    int draft_max;            /* ... and its draft cap */
    const char *store_mode;   /* shown in /props: "off", "ram-only", "full"; NULL: not shown */
    ks_metrics *metrics;      /* the model's own /metrics sources (SPC, draft model...),
                                 rendered with its model label; NULL: none. The server adds its
                                 per-model sources (scheduler, tokenization cache) to it, so it
                                 must be one the loader made for this load */
} ks_server_model_parts;

/* One entry of the table. */
typedef struct ks_server_model_cfg {
    const char *name;         /* the id in /v1/models and replies; copied */
    const char *const *aliases; /* other names a request may give: exact, or glob patterns
                                   (fnmatch: * ? [...]); copied; at most KS_SERVER_ALIASES_MAX */
    int n_aliases;
    bool pin;                 /* loaded at start and never unloaded */
    int keep_alive_s;         /* unloaded after this long unused; 0: the table's idle_unload_s;
                                 < 0: never for being idle */
    int64_t est_bytes;        /* memory it takes loaded (weights + KV), for memory_budget */
    const char *path;         /* shown in /v1/models (NULL: nothing); copied */
    const char *fail;         /* known not to load (its GGUF cannot be read): listed as failed
                                 with this reason from the start, loaded only when asked
                                 (POST /models/load); NULL: none. Copied */
} ks_server_model_cfg;

/* The caller's loader. load: opens model index (its entry's settings are the
 * caller's) into *out; 0, or an error with a message in err (the model is
 * then listed as failed with it). Runs on the table's loading thread, one at
 * a time. unload: frees what load made, after the server let go of it (no
 * request holds it and no server thread calls its scheduler): the
 * scheduler's slots go to the store first, with KS_REASON_UNLOAD, or
 * KS_REASON_SHUTDOWN when the server stops (shutdown true). */
typedef struct ks_server_loader {
    void *ud;
    int (*load)(void *ud, int index, ks_server_model_parts *out, char *err, size_t errlen);
    void (*unload)(void *ud, int index, bool shutdown);
    /* When the server stops: frees the model's scheduler alone (its slots to the
     * store with KS_REASON_SHUTDOWN; every request left gets its on_done) while
     * requests may still read the engine; unload (shutdown true) follows once
     * no connection is left. NULL: unload does it all then. */
    void (*stop)(void *ud, int index);
} ks_server_loader;

enum { KS_SERVER_MODELS_MAX = 64, KS_SERVER_ALIASES_MAX = 16 };

typedef struct ks_server_params {
    /* The models (at least one) and their loader. A pinned entry is loaded by
     * ks_server_start before it returns (a failure fails the start when it is
     * the only entry; with several, that model is listed as failed). */
    const ks_server_model_cfg *models;
    int n_models;
    ks_server_loader loader;
    const char *default_model; /* serves requests naming no model or one that matches none;
                                  NULL or "": with one model, that one; with several, such a
                                  request gets a 404 model_not_found */
    int models_max;           /* models loaded at once (default 4; 0: no limit) */
    int64_t memory_budget;    /* bytes the loaded models' est_bytes may add up to (0: none) */
    int idle_unload_s;        /* a model unused this long is unloaded (0, default: never) */
    bool autoload;            /* a request loads its model (default true); else 503 until
                                 POST /models/load */
    int load_wait_ms;         /* how long a request waits for its model to load, then 503 with
                                 Retry-After (default 600000) */
    const char *host;         /* address to bind (default "127.0.0.1"); copied */
    int port;                 /* 0: a free port, see ks_server_port (default 8080) */
    const char *api_key;      /* NULL or "": no authentication; copied */
    /* More keys and a key file the operator may rewrite while serving
     * (keyring.h: format, reloads, and which tenant each key is; every key
     * is its own tenant unless api_key alone is given). Copied; at most 64
     * (a key file holds more). */
    const char *const *api_keys;
    int n_api_keys;
    const char *api_key_file; /* NULL or "": none */
    /* The key that opens /metrics (auth.c): with several tenants the only
     * one (an API key gets 403); else as well as the API keys. NULL or "":
     * none. Copied. */
    const char *metrics_key;
    /* Which request fields subdivide a key's tenant (docs/SECURITY.md):
     * KS_TENANT_BY_* bits, 0 (default): none. */
    unsigned tenant_by;
    int64_t max_body_bytes;   /* larger bodies get 413 (default 16 MiB) */
    int default_max_tokens;   /* for requests without max_tokens, capped at the context
                                 left after the prompt; -1 (default): until an end of
                                 generation or the context's end, as llama-server */
    int max_connections;      /* connections served at once (default 256); up to
                                 KS_SERVER_CONN_SPARE more are accepted only to be
                                 answered 503 (note 9) */
    int max_connections_per_client; /* per client address (default 0: half of
                                 max_connections); beyond, the address's oldest
                                 connection awaiting its headers is closed for the new
                                 one, else the new one (hdrwatch.h), without a reply */
    int timeout_s;            /* idle keep-alive timeout between requests (default 600;
                                 0: none; generation time does not count) */
    int header_timeout_s;     /* a request's headers and body: at most this many seconds
                                 without a byte from the client (default 30, >= 1; a
                                 fresh connection gets it too) */
    const char *chat_template_all; /* Jinja source for every model whose parts give none
                                      (--chat-template); NULL: each GGUF's. Copied */
    bool spm_infill;              /* /infill: suffix, prefix, middle (--spm-infill) */
    const char *reasoning_format; /* default of requests that give none: "deepseek" (NULL),
                                     "deepseek-legacy", "auto", "none" */
    int responses_max;        /* Responses API: conversations kept for previous_response_id
                                 (default 1024; the oldest goes first) */
    int responses_ttl_s;      /* ... and for how long (default 3600; 0: none kept) */
    const char *const *cors_origins; /* browser origins allowed (CORS, note 7): "*" or
                                        scheme://host[:port], compared without case; copied.
                                        NULL or n_cors_origins 0: CORS off */
    int n_cors_origins;
    int max_renders;          /* template renders and grammar builds at once, 1..1024
                                 (default 2; admit.h): the others wait their turn */
    ks_media_limits media;    /* image and audio input (media_in.h): the limits (default
                                 ks_media_in_limits_default; modalities are each model's);
                                 marker borrowed */
    ks_media_fetch_cfg media_fetch; /* images named by http(s):// and file:// URLs (media_fetch.h);
                                       default all zero: refused. Strings copied */
    ks_metrics *metrics;      /* borrowed registry holding the caller's sources (SPC,
                                 store...); the server adds its own before serving.
                                 NULL: the server makes one */
} ks_server_params;

ks_server_params ks_server_params_default(void);

/* Binds and starts serving. Errors: KS_EINVAL (bad params or host),
 * KS_EIO (bind/listen failed, message in err), KS_ENOMEM. A borrowed
 * registry (p->metrics) then refers to the server: render it only between a
 * successful start and ks_server_free, and free it after the server. */
int ks_server_start(const ks_server_params *p, ks_server **out, char *err, size_t errlen);
/* The bound port (the real one when started with port 0). */
int ks_server_port(const ks_server *s);
/* Stops accepting connections; requests that arrive on open keep-alive
 * connections get 503 "shutting_down". Running requests continue. Idempotent. */
void ks_server_quiesce(ks_server *s);
/* Generation requests still alive (queued, running, or being written out). */
int ks_server_n_active(ks_server *s);
/* After this returns no server thread calls a model's scheduler again (waits
 * for calls in progress); requests that still wait for their on_done get it
 * when ks_server_free unloads the models. Idempotent. */
void ks_server_detach_sched(ks_server *s);
/* Reads the API key file again before the next request (SIGHUP). Any thread. */
void ks_server_reload_keys(ks_server *s);
/* Unloads every model (the loader's unload, shutdown true), waits up to 3 s
 * for requests still writing their reply, stops the daemon (closing every
 * connection) and frees. Call after ks_server_detach_sched. NULL is a no-op. */
void ks_server_free(ks_server *s);

#endif

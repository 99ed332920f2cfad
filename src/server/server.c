/*
 * server.c — see server.h.
 *
 * NOTES ON THE DESIGN OF THE HTTP LAYER
 *
 * MHD calls on_request several times per request on the connection's own
 * thread: once when the headers are in (we pick the route and decide early
 * errors: 404, 405, 401, 413 by Content-Length), once per body chunk (we
 * buffer up to max_body_bytes, then discard), and once at the end, where
 * every response is queued. Early errors are answered only at the end, after
 * the body was read, so that a client still sending its body never meets a
 * reset connection; only a body beyond hard_cap() is refused at once.
 *
 * A generation (struct gen) is shared by three parties (server.h note 2):
 *   - the connection thread: creates it, submits it, then either waits for
 *     it (non-stream) or hands it to the content reader (stream);
 *   - the inference thread: on_token feeds the textstream and appends the safe
 *     text to g->pending; on_done flushes, stores the result, sets g->done;
 *   - MHD's request-completed callback: cancels it if the request ended
 *     abnormally, and drops the HTTP reference.
 * Fields are grouped below by who may touch them.
 *
 * Invariants
 *  H1. The scheduler is called only under sched_lock (read) and while
 *      !detached; ks_server_detach_sched takes the write lock, so after it
 *      returns no server thread is inside or will enter a ks_sched_* call.
 *  H2. Every submitted gen gets exactly one on_done (sched.h invariant 2),
 *      which is what the waiting connection thread needs to wake for good;
 *      besides, waits poll the socket every 200 ms to notice a client that left.
 *  H3. The inference thread never waits on a connection: it takes g->mu for
 *      an append and a signal only.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/textstream.h"
#include "cache/msghash.h"
#include "server/api.h"

#define MOD "http"
#define WAIT_POLL_MS 200
#define FREE_WAIT_MS 3000

struct ks_server {
    ks_engine *engine;
    ks_sched *sched;
    pthread_rwlock_t sched_lock;
    bool detached;              /* H1: under sched_lock */
    _Atomic bool draining;
    _Atomic int n_active;       /* live gens */
    struct MHD_Daemon *d;
    MHD_socket quiesced_fd;
    bool starting;              /* MHD log lines go to start_err while starting */
    char start_err[256];
    int port;
    char host[256];
    char api_key[256];
    char model[256];
    char model_id[512];
    int64_t max_body;
    int default_max_tokens;
    unsigned timeout_s;
    bool cache_prompt;
    int64_t created;
    ks_metrics *metrics;
    bool own_metrics;
    ks_http_counters http;
};

/* ------------------------------------------------------------------ routes */
enum { R_HEALTH = 1, R_MODELS, R_METRICS, R_SLOTS, R_CHAT, R_COMPLETIONS };

typedef struct route {
    const char *path;
    int id;
    bool post; /* POST only; otherwise GET and HEAD */
} route;

static const route ROUTES[] = {
    {"/health", R_HEALTH, false},          {"/v1/health", R_HEALTH, false},
    {"/v1/models", R_MODELS, false},       {"/models", R_MODELS, false},
    {"/metrics", R_METRICS, false},        {"/slots", R_SLOTS, false},
    {"/v1/chat/completions", R_CHAT, true}, {"/chat/completions", R_CHAT, true},
    {"/v1/completions", R_COMPLETIONS, true}, {"/completions", R_COMPLETIONS, true},
};

static const route *find_route(const char *url) {
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (!strcmp(url, ROUTES[i].path)) return &ROUTES[i];
    return NULL;
}

/* ------------------------------------------------------------- generation */
enum { PH_START = 0, PH_BODY, PH_END };

typedef struct gen {
    /* set before submit, read-only afterwards */
    ks_server *srv;
    ks_api_kind kind;
    bool stream;
    bool include_usage;
    char id[64];
    int64_t created;
    int fd;                        /* the client's socket, polled for hang-up */
    struct MHD_Connection *conn;
    uint64_t sched_id;
    _Atomic bool gone;             /* client went away: canceled */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    int refs;
    ks_buf pending;                /* safe text not yet taken by the connection thread */
    bool done;
    bool stopped;                  /* a stop string ended it */
    bool failed;                   /* the text could not be kept (ENOMEM) */
    ks_req_result res;             /* valid once done */

    /* inference thread only (handed over by submit) */
    ks_textstream *ts;
    ks_buf scratch;

    /* connection thread only (stream) */
    int phase;
    ks_buf out;
    size_t out_off;
    ks_buf take;
} gen;

static gen *gen_create(ks_server *s, ks_api_kind kind, const ks_api_request *rq) {
    gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc) {
        free(g);
        return NULL;
    }
    pthread_mutex_init(&g->mu, NULL);
    g->ts = ks_textstream_create(rq->stops, rq->n_stops);
    if (!g->ts) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return NULL;
    }
    g->srv = s;
    g->kind = kind;
    g->stream = rq->stream;
    g->include_usage = rq->include_usage;
    g->created = ks_wall_s();
    g->fd = -1;
    g->refs = 1;
    ks_api_make_id(g->id, sizeof g->id, kind == KS_API_CHAT ? "chatcmpl-" : "cmpl-");
    atomic_fetch_add(&s->n_active, 1);
    return g;
}

static void gen_ref(gen *g) {
    pthread_mutex_lock(&g->mu);
    g->refs++;
    pthread_mutex_unlock(&g->mu);
}

static void gen_release(gen *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left > 0) return;
    ks_server *s = g->srv;
    ks_textstream_free(g->ts);
    ks_buf_free(&g->scratch);
    ks_buf_free(&g->pending);
    ks_buf_free(&g->out);
    ks_buf_free(&g->take);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
    atomic_fetch_sub(&s->n_active, 1);
}

/* Inference thread. */
static int on_token(void *ud, int32_t tok, const char *piece, int len) {
    gen *g = ud;
    (void)tok;
    if (atomic_load(&g->gone)) return 1;
    ks_buf_reset(&g->scratch);
    int rc = ks_textstream_feed(g->ts, piece, len > 0 ? (size_t)len : 0, &g->scratch);
    bool fail = rc < 0;
    if (g->scratch.len || fail) {
        pthread_mutex_lock(&g->mu);
        if (!fail && ks_buf_append(&g->pending, g->scratch.s, g->scratch.len)) fail = true;
        if (fail) g->failed = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return fail || rc == 1;
}

/* Inference thread: the one INFO line per request, then wake the waiter. */
static void on_done(void *ud, const ks_req_result *r) {
    gen *g = ud;
    bool stopped = ks_textstream_stopped(g->ts);
    ks_buf_reset(&g->scratch);
    int frc = stopped ? 0 : ks_textstream_flush(g->ts, &g->scratch);

    const char *finish = r->finish == KS_FINISH_STOP || r->finish == KS_FINISH_LENGTH
                             ? ks_api_finish_reason(r, stopped)
                             : ks_finish_name(r->finish);
    double tps = r->gen_ms > 0 ? 1e3 * r->n_generated / r->gen_ms : 0.0;
    KS_INFO(MOD, "%s slot %d: prompt %d tok, cached %d (%.0f%%), ttft %.1f ms, %d tok at %.1f tok/s, "
                 "finish %s, cache %.*s%s%.*s",
            g->id, r->slot, r->n_prompt, r->n_cached,
            r->n_prompt ? 100.0 * r->n_cached / r->n_prompt : 0.0, r->ttft_ms, r->n_generated, tps,
            finish, (int)sizeof r->cache_mode, r->cache_mode, r->cache_reason[0] ? " / " : "",
            (int)sizeof r->cache_reason, r->cache_reason);
    if (r->finish == KS_FINISH_ERROR)
        KS_WARN(MOD, "%s failed: %s", g->id, ks_strerror(r->error));

    pthread_mutex_lock(&g->mu);
    if (frc < 0 || ks_buf_append(&g->pending, g->scratch.s ? g->scratch.s : "", g->scratch.len))
        g->failed = true;
    g->res = *r;
    g->res.logits = NULL; /* borrowed for this call only */
    g->stopped = stopped;
    g->done = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    gen_release(g); /* the scheduler's reference */
}

/* ----------------------------------------------------------- scheduler calls (H1) */
static int sched_submit(ks_server *s, const ks_req_params *rp, uint64_t *id) {
    int rc;
    pthread_rwlock_rdlock(&s->sched_lock);
    if (s->detached || atomic_load(&s->draining)) rc = KS_ESHUTDOWN;
    else rc = ks_sched_submit(s->sched, rp, id);
    pthread_rwlock_unlock(&s->sched_lock);
    return rc;
}

static void sched_cancel(ks_server *s, uint64_t id) {
    pthread_rwlock_rdlock(&s->sched_lock);
    if (!s->detached) ks_sched_cancel(s->sched, id);
    pthread_rwlock_unlock(&s->sched_lock);
}

/* The client left: cancel once, so the slot frees within a step. */
static void gen_abandon(gen *g) {
    if (atomic_exchange(&g->gone, true)) return;
    pthread_mutex_lock(&g->mu);
    bool done = g->done;
    pthread_mutex_unlock(&g->mu);
    if (done) return;
    atomic_fetch_add(&g->srv->http.client_disconnects, 1);
    KS_INFO(MOD, "%s: client disconnected, canceling", g->id);
    sched_cancel(g->srv, g->sched_id);
}

/* true when the peer closed its side (or the socket broke). A client that
 * pipelined its next request has data waiting, which is not a hang-up. */
static bool peer_closed(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Waits (g->mu held) until pred says stop or the client left; returns false
 * when the client left. */
static bool wait_locked(gen *g, bool want_text) {
    while (!g->done && !(want_text && g->pending.len)) {
        struct timespec ts;
        deadline_in(&ts, WAIT_POLL_MS);
        if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) != ETIMEDOUT) continue;
        if (atomic_load(&g->gone)) continue; /* canceled: on_done is on its way (H2) */
        pthread_mutex_unlock(&g->mu);
        bool closed = peer_closed(g->fd);
        if (closed) gen_abandon(g);
        pthread_mutex_lock(&g->mu);
        if (closed && want_text) return false;
    }
    return true;
}

/* ----------------------------------------------------------------- replies */
typedef struct conn {
    const route *rt;
    int early;            /* status decided when the headers came in, 0: none */
    bool key_given;       /* for the 401 message */
    ks_buf body;
    uint64_t discarded;
    int status;
    double t0;
    gen *g;
} conn;

static uint64_t hard_cap(const ks_server *s) { return (uint64_t)s->max_body * 2 + (1u << 20); }

/* Queues body (owned, freed here) with status; hdrs: name, value, ..., NULL. */
static enum MHD_Result reply(ks_server *s, struct MHD_Connection *c, conn *cn, int status,
                             const char *ctype, char *body, size_t len, const char *const *hdrs) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    for (int i = 0; hdrs && hdrs[i]; i += 2) MHD_add_response_header(r, hdrs[i], hdrs[i + 1]);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    ks_http_count(&s->http, status);
    if (cn) cn->status = status;
    return rc;
}

/* obj is stolen. */
static enum MHD_Result reply_json(ks_server *s, struct MHD_Connection *c, conn *cn, int status,
                                  json_t *obj, const char *const *hdrs) {
    char *body = obj ? ks_api_dump(obj) : NULL;
    json_decref(obj);
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":\"out_of_memory\"}}";
        body = strdup(oom);
        status = 500;
        if (!body) return MHD_NO;
    }
    return reply(s, c, cn, status, "application/json; charset=utf-8", body, strlen(body), hdrs);
}

static enum MHD_Result reply_error(ks_server *s, struct MHD_Connection *c, conn *cn,
                                   const ks_api_error *e, const char *const *hdrs) {
    return reply_json(s, c, cn, e->status, ks_api_error_json(e), hdrs);
}

#define ERR(status, type, code, param, ...)                                              \
    do {                                                                                 \
        ks_api_error e_;                                                                 \
        ks_api_error_set(&e_, status, type, code, param, __VA_ARGS__);                   \
        return reply_error(s, c, cn, &e_, NULL);                                         \
    } while (0)

/* ------------------------------------------------------------- endpoints */
static enum MHD_Result do_health(ks_server *s, struct MHD_Connection *c, conn *cn) {
    bool d = atomic_load(&s->draining);
    return reply_json(s, c, cn, d ? 503 : 200, json_pack("{s:s}", "status", d ? "shutting_down" : "ok"), NULL);
}

static enum MHD_Result do_models(ks_server *s, struct MHD_Connection *c, conn *cn) {
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:{s:i, s:i, s:i, s:s, s:b}}]}", "object", "list",
                          "data", "id", s->model, "object", "model", "created", (json_int_t)s->created,
                          "owned_by", "kvstash", "meta", "n_ctx_seq", ks_engine_n_ctx_seq(s->engine),
                          "n_vocab", ks_engine_n_vocab(s->engine), "n_slots", ks_engine_n_seq(s->engine),
                          "desc", ks_engine_model_desc(s->engine), "cache_prompt", s->cache_prompt);
    return reply_json(s, c, cn, 200, o, NULL);
}

static enum MHD_Result do_metrics(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_buf b = {0};
    if (ks_metrics_render(s->metrics, &b)) {
        ks_buf_free(&b);
        ERR(500, "server_error", "out_of_memory", NULL, "out of memory");
    }
    return reply(s, c, cn, 200, "text/plain; version=0.0.4; charset=utf-8", b.s, b.len, NULL);
}

static enum MHD_Result do_slots(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_slot_info info[256];
    int n = 0;
    pthread_rwlock_rdlock(&s->sched_lock);
    if (!s->detached) n = ks_sched_slots(s->sched, info, 256);
    pthread_rwlock_unlock(&s->sched_lock);
    if (n > 256) n = 256;
    json_t *a = json_array();
    int64_t now = ks_now_us();
    for (int i = 0; a && i < n; i++) {
        const ks_slot_info *si = &info[i];
        json_t *o = json_pack("{s:i, s:s, s:b, s:I, s:i, s:i, s:i, s:i, s:o}", "id", si->id, "state",
                              si->busy ? "busy" : "idle", "busy", si->busy, "req_id", (json_int_t)si->req_id,
                              "n_tokens", si->n_tokens, "n_prompt", si->n_prompt, "n_cached", si->n_cached,
                              "n_generated", si->n_generated, "idle_ms",
                              si->busy || !si->last_used_us ? json_null()
                                                            : json_real((double)(now - si->last_used_us) / 1e3));
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
    }
    return reply_json(s, c, cn, 200, a, NULL);
}

/* The scheduler's cache hints for a chat request (sched.h: optional, so a
 * failure here only costs cache hits, never correctness: the scheduler
 * compares tokens before it reuses anything). */
typedef struct hints {
    uint64_t *hashes;  /* n_msgs + 1 message-prefix hashes (IMC), owned */
    uint64_t sys_key;  /* SPC key of the leading system message, 0: none */
    int n_sys_tokens;  /* its rendered tokens when they are a prefix of the prompt */
} hints;

static void chat_hints(ks_server *s, const ks_api_request *rq, const ks_tokens *toks, hints *h) {
    const char **roles = malloc(sizeof(char *) * (size_t)rq->n_msgs * 2);
    h->hashes = malloc(sizeof(uint64_t) * ((size_t)rq->n_msgs + 1));
    if (roles && h->hashes) {
        const char **contents = roles + rq->n_msgs;
        for (int i = 0; i < rq->n_msgs; i++) {
            roles[i] = rq->msgs[i].role;
            contents[i] = rq->msgs[i].content;
        }
        ks_msghash_prefixes(roles, contents, rq->n_msgs, h->hashes);
    } else {
        free(h->hashes);
        h->hashes = NULL;
    }
    free(roles);
    if (strcmp(rq->msgs[0].role, "system") != 0) return;
    /* The system prompt alone, rendered as the template renders it at the head
     * of a conversation; usable only when its tokens are exactly the prompt's
     * first tokens (some templates render a lone system message differently). */
    char *text = NULL;
    ks_tokens sys = {0};
    if (ks_engine_template(s->engine, rq->msgs, 1, false, &text) == 0 &&
        ks_engine_tokenize(s->engine, text, strlen(text), true, true, &sys) == 0 && sys.n > 0 &&
        sys.n < toks->n && !memcmp(sys.v, toks->v, sizeof(int32_t) * (size_t)sys.n)) {
        h->sys_key = ks_msghash_system("system", rq->msgs[0].content, s->model_id);
        h->n_sys_tokens = sys.n;
    }
    free(text);
    ks_tokens_free(&sys);
}

/* The prompt tokens of a request, and for chat requests the cache hints. */
static int build_prompt(ks_server *s, const ks_api_request *rq, ks_tokens *toks, hints *h,
                        ks_api_error *e) {
    memset(h, 0, sizeof *h);
    if (rq->kind == KS_API_CHAT) {
        char *text = NULL;
        int rc = ks_engine_template(s->engine, rq->msgs, (size_t)rq->n_msgs, true, &text);
        if (rc) {
            ks_api_error_set(e, 500, "server_error", "template_error", NULL,
                             "The model's chat template could not be applied: %s.", ks_strerror(rc));
            return rc;
        }
        rc = ks_engine_tokenize(s->engine, text, strlen(text), true, true, toks);
        free(text);
        if (rc) goto tok_fail;
        chat_hints(s, rq, toks, h);
        return 0;
    }
    if (rq->prompt) {
        int rc = ks_engine_tokenize(s->engine, rq->prompt, strlen(rq->prompt), true, true, toks);
        if (rc) goto tok_fail;
        return 0;
    }
    int n_vocab = ks_engine_n_vocab(s->engine);
    for (int i = 0; i < rq->n_prompt_tokens; i++) {
        if (rq->prompt_tokens[i] >= n_vocab) {
            char param[32];
            snprintf(param, sizeof param, "prompt[%d]", i);
            ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", param,
                             "Invalid '%s': token id %d is outside the vocabulary (%d tokens).", param,
                             (int)rq->prompt_tokens[i], n_vocab);
            return KS_EINVAL;
        }
    }
    if (ks_tokens_assign(toks, rq->prompt_tokens, rq->n_prompt_tokens)) goto tok_fail;
    return 0;
tok_fail:
    ks_api_error_set(e, 500, "server_error", "tokenize_failed", NULL, "The prompt could not be tokenized.");
    return KS_EINVAL;
}

static uint64_t random_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) x = (uint64_t)ks_now_us() * 2654435761u;
    return x;
}

/* The final SSE events of a stream into g->out. */
static int stream_finish(gen *g) {
    ks_server *s = g->srv;
    const ks_req_result *r = &g->res;
    const char *finish = ks_api_finish_reason(r, g->stopped);
    if (g->failed || !finish) {
        ks_api_error e;
        if (r->finish == KS_FINISH_CANCEL)
            ks_api_error_set(&e, 503, "server_error", "shutting_down", NULL,
                             "The generation was canceled: the server is shutting down.");
        else
            ks_api_error_set(&e, 500, "server_error", "generation_failed", NULL, "Generation failed: %s.",
                             g->failed ? ks_strerror(KS_ENOMEM) : ks_strerror(r->error));
        json_t *o = ks_api_error_json(&e);
        int rc = ks_api_sse(&g->out, o);
        json_decref(o);
        return rc;
    }
    ks_api_gen ag = {g->kind, g->id, g->created, s->model, NULL, finish, r};
    json_t *o = ks_api_chunk_json(&ag, KS_API_CHUNK_FINISH, NULL, 0);
    int rc = ks_api_sse(&g->out, o);
    json_decref(o);
    if (!rc && g->include_usage) {
        o = ks_api_chunk_json(&ag, KS_API_CHUNK_USAGE, NULL, 0);
        rc = ks_api_sse(&g->out, o);
        json_decref(o);
    }
    return rc ? rc : ks_api_sse_done(&g->out);
}

/* MHD content reader of a streamed response (connection thread). Blocks
 * until there is something to send: thread-per-connection mode forbids
 * returning 0, which would spin. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    gen *g = cls;
    ks_server *s = g->srv;
    (void)pos;
    for (;;) {
        if (g->out_off < g->out.len) {
            size_t n = g->out.len - g->out_off;
            if (n > max) n = max;
            memcpy(buf, g->out.s + g->out_off, n);
            g->out_off += n;
            if (g->out_off == g->out.len) {
                ks_buf_reset(&g->out);
                g->out_off = 0;
            }
            return (ssize_t)n;
        }
        if (g->phase == PH_END) {
            /* Back to the idle timeout for the keep-alive connection. */
            MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        int rc = 0;
        ks_api_gen ag = {g->kind, g->id, g->created, s->model, NULL, NULL, NULL};
        if (g->phase == PH_START) {
            g->phase = PH_BODY;
            if (g->kind == KS_API_CHAT) {
                json_t *o = ks_api_chunk_json(&ag, KS_API_CHUNK_ROLE, NULL, 0);
                rc = ks_api_sse(&g->out, o);
                json_decref(o);
            }
        } else {
            pthread_mutex_lock(&g->mu);
            bool alive = wait_locked(g, true);
            bool done = g->done;
            ks_buf_reset(&g->take);
            if (alive && g->pending.len) {
                rc = ks_buf_append(&g->take, g->pending.s, g->pending.len);
                ks_buf_reset(&g->pending);
            }
            pthread_mutex_unlock(&g->mu);
            if (!alive) return MHD_CONTENT_READER_END_WITH_ERROR;
            if (!rc && g->take.len) {
                json_t *o = ks_api_chunk_json(&ag, KS_API_CHUNK_DELTA, g->take.s, g->take.len);
                rc = ks_api_sse(&g->out, o);
                json_decref(o);
            }
            if (!rc && done) {
                rc = stream_finish(g);
                g->phase = PH_END;
            }
        }
        if (rc) {
            KS_ERROR(MOD, "%s: stream formatting failed: %s", g->id, ks_strerror(rc));
            gen_abandon(g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) { gen_release(cls); }

static enum MHD_Result do_generate(ks_server *s, struct MHD_Connection *c, conn *cn, ks_api_kind kind) {
    ks_api_request rq;
    ks_api_error e;
    ks_tokens toks = {0};
    hints h = {0};
    gen *g = NULL;
    enum MHD_Result ret;

    if (ks_api_parse(kind, cn->body.s, cn->body.len, &rq, &e)) return reply_error(s, c, cn, &e, NULL);
    if (atomic_load(&s->draining)) {
        ks_api_error_set(&e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        goto fail;
    }
    if (build_prompt(s, &rq, &toks, &h, &e)) goto fail;

    int n_ctx = ks_engine_n_ctx_seq(s->engine);
    const char *what = kind == KS_API_CHAT ? "messages" : "prompt";
    if (toks.n == 0) {
        ks_api_error_set(&e, 400, "invalid_request_error", "invalid_value", what,
                         "Invalid '%s': the prompt is empty after tokenization.", what);
        goto fail;
    }
    if ((rq.max_tokens > 0 && (int64_t)toks.n + rq.max_tokens > n_ctx) || toks.n >= n_ctx) {
        if (rq.max_tokens > 0)
            ks_api_error_set(&e, 400, "invalid_request_error", "context_length_exceeded", what,
                             "This model's maximum context length is %d tokens. However, you requested "
                             "%lld tokens (%d in the %s, %d in the completion). Please reduce the length "
                             "of the %s or completion.", n_ctx, (long long)toks.n + rq.max_tokens, toks.n,
                             what, rq.max_tokens, what);
        else
            ks_api_error_set(&e, 400, "invalid_request_error", "context_length_exceeded", what,
                             "This model's maximum context length is %d tokens. However, your %s "
                             "resulted in %d tokens, which leaves no room for a completion. Please "
                             "reduce the length of the %s.", n_ctx, what, toks.n, what);
        goto fail;
    }
    int max_tokens = rq.max_tokens > 0 ? rq.max_tokens : s->default_max_tokens;
    if (max_tokens > n_ctx - toks.n) max_tokens = n_ctx - toks.n;

    g = gen_create(s, kind, &rq);
    if (!g) {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        goto fail;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    g->conn = c;
    cn->g = g; /* the HTTP reference, dropped in on_completed */

    ks_req_params rp = {0};
    rp.tokens = toks.v;
    rp.n_tokens = toks.n;
    rp.max_tokens = max_tokens;
    rp.sample = rq.sample;
    if (!rq.seed_set) rp.sample.seed = random_seed();
    rp.cache_prompt = rq.cache_prompt;
    rp.preferred_slot = -1;
    if (h.hashes) {
        rp.msg_prefix_hash = h.hashes;
        rp.n_msgs = rq.n_msgs;
        rp.n_msgs_cacheable = rq.n_msgs - 1; /* all but the last (sched.h) */
    }
    rp.sys_key = h.sys_key;
    rp.n_sys_tokens = h.n_sys_tokens;
    rp.on_token = on_token;
    rp.on_done = on_done;
    rp.ud = g;
    gen_ref(g); /* the scheduler's reference, dropped in on_done */
    /* Generation time must not count as idleness (the connection thread
     * blocks below); the idle timeout comes back when the reply is out. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    int rc = sched_submit(s, &rp, &g->sched_id);
    if (rc) {
        gen_release(g); /* on_done will not come */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
        const char *const retry[] = {"Retry-After", "1", NULL};
        switch (rc) {
        case KS_EFULL:
            ks_api_error_set(&e, 503, "server_error", "queue_full", NULL,
                             "The server is busy: the request queue is full. Retry later.");
            ret = reply_error(s, c, cn, &e, retry);
            goto out;
        case KS_ESHUTDOWN:
            ks_api_error_set(&e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
            break;
        case KS_ECTX:
            ks_api_error_set(&e, 400, "invalid_request_error", "context_length_exceeded", what,
                             "The %s and max_tokens do not fit in the context (%d tokens).", what, n_ctx);
            break;
        default:
            ks_api_error_set(&e, 500, "server_error", "submit_failed", NULL, "The request could not be queued: %s.",
                             ks_strerror(rc));
        }
        goto fail;
    }
    KS_DEBUG(MOD, "%s: queued as %llu, %d prompt tokens, max_tokens %d%s", g->id,
             (unsigned long long)g->sched_id, toks.n, max_tokens, rq.stream ? ", stream" : "");

    if (rq.stream) {
        gen_ref(g); /* the content reader's reference, dropped in stream_free */
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, g,
                                                                   stream_free);
        if (!r) {
            gen_release(g);
            gen_abandon(g);
            ret = MHD_NO;
            goto out;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        ks_http_count(&s->http, 200);
        cn->status = 200;
        goto out;
    }

    pthread_mutex_lock(&g->mu);
    wait_locked(g, false);
    pthread_mutex_unlock(&g->mu);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
    if (atomic_load(&g->gone)) { /* nobody to answer */
        ret = MHD_NO;
        goto out;
    }
    const char *finish = ks_api_finish_reason(&g->res, g->stopped);
    if (g->failed || !finish) {
        if (g->res.finish == KS_FINISH_CANCEL)
            ks_api_error_set(&e, 503, "server_error", "shutting_down", NULL,
                             "The generation was canceled: the server is shutting down.");
        else
            ks_api_error_set(&e, 500, "server_error", "generation_failed", NULL, "Generation failed: %s.",
                             g->failed ? ks_strerror(KS_ENOMEM) : ks_strerror(g->res.error));
        goto fail;
    }
    ks_api_gen ag = {kind, g->id, g->created, s->model, g->pending.s ? g->pending.s : "", finish, &g->res};
    json_t *o = ks_api_response_json(&ag);
    if (!o) {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "The response could not be encoded.");
        goto fail;
    }
    ret = reply_json(s, c, cn, 200, o, NULL);
    goto out;
fail:
    ret = reply_error(s, c, cn, &e, NULL);
out:
    ks_api_request_free(&rq);
    ks_tokens_free(&toks);
    free(h.hashes);
    return ret;
}

/* --------------------------------------------------------------- MHD glue */
static bool equal_ct(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na && i < nb; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* Authorization: Bearer KEY (or X-Api-Key: KEY, as llama-server accepts). */
static bool authorized(ks_server *s, struct MHD_Connection *c, bool *given) {
    *given = false;
    if (!s->api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *key = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        key = h + 7;
        while (*key == ' ') key++;
    }
    if (!key) key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
    *given = key != NULL;
    return key && equal_ct(key, s->api_key);
}

static enum MHD_Result reply_early(ks_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                   const char *url) {
    ks_api_error e;
    switch (cn->early) {
    case 404:
        ks_api_error_set(&e, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %.16s %.200s.",
                         method, url);
        return reply_error(s, c, cn, &e, NULL);
    case 405: {
        const char *allow = cn->rt->post ? "POST" : "GET, HEAD";
        ks_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                         "Method %.16s is not allowed on %s; use %s.", method, cn->rt->path, allow);
        const char *const h[] = {MHD_HTTP_HEADER_ALLOW, allow, NULL};
        return reply_error(s, c, cn, &e, h);
    }
    case 401: {
        ks_api_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                         cn->key_given ? "Incorrect API key provided."
                                       : "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.");
        const char *const h[] = {MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer", NULL};
        return reply_error(s, c, cn, &e, h);
    }
    case 413:
        ks_api_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "The request body is larger than the limit of %lld bytes.", (long long)s->max_body);
        return reply_error(s, c, cn, &e, NULL);
    default:
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "The request body could not be stored.");
        return reply_error(s, c, cn, &e, NULL);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    ks_server *s = cls;
    conn *cn = *con_cls;
    (void)version;
    if (!cn) {
        /* Headers are in: route, authenticate, check the declared size. */
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        *con_cls = cn;
        cn->t0 = ks_now_ms();
        cn->rt = find_route(url);
        bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        bool post = !strcmp(method, "POST");
        bool given;
        if (!cn->rt) cn->early = 404;
        else if (cn->rt->post ? !post : !get) cn->early = 405;
        else if (cn->rt->id != R_HEALTH && !authorized(s, c, &given)) cn->early = 401, cn->key_given = given;
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
        if (!cn->early && cn->rt->post) {
            if ((uint64_t)cn->body.len + n > (uint64_t)s->max_body) {
                cn->early = 413;
                cn->discarded = cn->body.len;
                ks_buf_free(&cn->body);
            } else if (ks_buf_append(&cn->body, upload_data, n)) {
                cn->early = 500;
                ks_buf_free(&cn->body);
            } else {
                return MHD_YES;
            }
        }
        cn->discarded += n;
        /* A body without Content-Length (chunked) beyond the hard cap: drop
         * the connection, there is no way to answer in the middle of a body. */
        return cn->discarded > hard_cap(s) ? MHD_NO : MHD_YES;
    }
    if (cn->early) return reply_early(s, c, cn, method, url);
    switch (cn->rt->id) {
    case R_HEALTH: return do_health(s, c, cn);
    case R_MODELS: return do_models(s, c, cn);
    case R_METRICS: return do_metrics(s, c, cn);
    case R_SLOTS: return do_slots(s, c, cn);
    case R_CHAT: return do_generate(s, c, cn, KS_API_CHAT);
    case R_COMPLETIONS: return do_generate(s, c, cn, KS_API_COMPLETION);
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    ks_server *s = cls;
    conn *cn = *con_cls;
    (void)c;
    (void)s;
    if (!cn) return;
    if (cn->g) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) gen_abandon(cn->g);
        gen_release(cn->g);
    }
    KS_DEBUG(MOD, "%s -> %d in %.1f ms%s", cn->rt ? cn->rt->path : "?", cn->status, ks_now_ms() - cn->t0,
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
    if (s->starting) snprintf(s->start_err, sizeof s->start_err, "%.255s", line);
    /* MHD reports every client that hangs up mid-response: not our error. */
    KS_DEBUG("mhd", "%s", line);
}

static void sched_source(void *ud, ks_prom *p) {
    ks_server *s = ud;
    ks_sched_stats st = {0};
    pthread_rwlock_rdlock(&s->sched_lock);
    if (!s->detached) ks_sched_stats_get(s->sched, &st);
    pthread_rwlock_unlock(&s->sched_lock);
    ks_metrics_sched(p, &st);
}

/* ------------------------------------------------------------- lifecycle */
ks_server_params ks_server_params_default(void) {
    ks_server_params p = {0};
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_body_bytes = 16 << 20;
    p.default_max_tokens = 2048;
    p.max_connections = 256;
    p.timeout_s = 600;
    p.cache_prompt = true;
    return p;
}

int ks_server_start(const ks_server_params *p, ks_server **out, char *err, size_t errlen) {
    *out = NULL;
    if (!p->engine || !p->sched || p->port < 0 || p->port > 65535 || p->max_body_bytes <= 0 ||
        p->default_max_tokens < 1 || p->max_connections < 1 || p->timeout_s < 0) {
        ks_set_err(err, errlen, "invalid server parameters");
        return KS_EINVAL;
    }
    const char *host = p->host && p->host[0] ? p->host : "127.0.0.1";
    const char *model = p->model_name && p->model_name[0] ? p->model_name : ks_engine_model_name(p->engine);
    if (strlen(host) >= 256 || (p->api_key && strlen(p->api_key) >= 256) || strlen(model ? model : "") >= 256) {
        ks_set_err(err, errlen, "host, api key or model name too long (255 bytes at most)");
        return KS_EINVAL;
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
    pthread_rwlock_init(&s->sched_lock, NULL);
    s->engine = p->engine;
    s->sched = p->sched;
    s->quiesced_fd = MHD_INVALID_SOCKET;
    snprintf(s->host, sizeof s->host, "%s", host);
    snprintf(s->api_key, sizeof s->api_key, "%s", p->api_key ? p->api_key : "");
    snprintf(s->model, sizeof s->model, "%s", model ? model : "model");
    snprintf(s->model_id, sizeof s->model_id, "%s", p->model_id ? p->model_id : s->model);
    s->max_body = p->max_body_bytes;
    s->default_max_tokens = p->default_max_tokens;
    s->timeout_s = (unsigned)p->timeout_s;
    s->cache_prompt = p->cache_prompt;
    s->created = ks_wall_s();
    s->http.started_us = ks_now_us();
    /* The server's own sources; the caller's (SPC, store) are already in the
     * registry. Sources are only added before the daemon starts (metrics.h). */
    if (ks_metrics_add(s->metrics, sched_source, s) || ks_metrics_add(s->metrics, ks_metrics_http, &s->http)) {
        ks_server_free(s);
        freeaddrinfo(ai);
        return KS_ENOMEM;
    }

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->starting = true;
    s->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->timeout_s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_END);
    int saved = errno;
    s->starting = false;
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

void ks_server_quiesce(ks_server *s) {
    if (atomic_exchange(&s->draining, true)) return;
    if (s->d) s->quiesced_fd = MHD_quiesce_daemon(s->d);
}

int ks_server_n_active(ks_server *s) { return atomic_load(&s->n_active); }

void ks_server_detach_sched(ks_server *s) {
    atomic_store(&s->draining, true);
    pthread_rwlock_wrlock(&s->sched_lock);
    s->detached = true;
    pthread_rwlock_unlock(&s->sched_lock);
}

void ks_server_free(ks_server *s) {
    if (!s) return;
    /* Requests whose generation just ended (canceled by ks_sched_free) still
     * have to write their last bytes: a 503 body, a stream's error event.
     * Stopping the daemon now would cut them off, so give them a moment;
     * a client that does not read holds this up by at most the bound. */
    for (int i = 0; i < FREE_WAIT_MS / 10 && atomic_load(&s->n_active) > 0; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    /* MHD hands the listening socket to whoever quiesced: ours to close,
     * and only after the daemon stopped (its threads may still use it). */
    if (s->quiesced_fd != MHD_INVALID_SOCKET) close(s->quiesced_fd);
    if (s->own_metrics) ks_metrics_free(s->metrics);
    pthread_rwlock_destroy(&s->sched_lock);
    free(s);
}

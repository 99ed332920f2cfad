/*
 * gen.c — generations: from a parsed request to the scheduler and back to
 * the client as one JSON body or a stream of server-sent events.
 *
 * NOTES ON THE DESIGN OF A GENERATION
 *
 * A generation (ks_gen) is shared by three parties (server.h note 2):
 *   - the connection thread: creates it, submits it, then either waits for
 *     it (non-stream) or hands it to the content reader (stream);
 *   - the inference thread: on_token feeds the textstream and appends the safe
 *     text to g->pending; on_done flushes, stores the result, sets g->done;
 *   - MHD's request-completed callback (ks__gen_request_done): cancels it if
 *     the request ended abnormally, and drops the HTTP reference.
 * Fields are grouped below by who may touch them.
 *
 * Invariants
 *  H1. The scheduler is called only under sched_lock (read) and while
 *      !detached; ks_server_detach_sched takes the write lock, so after it
 *      returns no server thread is inside or will enter a ks_sched_* call.
 *  H2. Every submitted generation gets exactly one on_done (sched.h
 *      invariant 2), which is what the waiting connection thread needs to
 *      wake for good; besides, waits poll the socket every 200 ms to notice
 *      a client that left.
 *  H3. The inference thread never waits on a connection: it takes g->mu for
 *      an append and a signal only.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "base/textstream.h"
#include "prompt/prompt.h"
#include "server/server_int.h"

#define MOD "http"
#define WAIT_POLL_MS 200

enum { PH_START = 0, PH_BODY, PH_END };

struct ks_gen {
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
};

typedef ks_gen gen;

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

void ks__gen_request_done(ks_gen *g, bool completed_ok) {
    if (!completed_ok) gen_abandon(g);
    gen_release(g);
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

/* Waits (g->mu held) until the generation is done or, with want_text, has
 * text pending, or the client left; returns false when the client left. */
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

/* The error of a generation that did not complete (canceled, failed), or
 * NULL finish reason: fills e and returns true. g is done. */
static bool gen_failed(const gen *g, const char **finish, ks_api_error *e) {
    *finish = ks_api_finish_reason(&g->res, g->stopped);
    if (!g->failed && *finish) return false;
    if (g->res.finish == KS_FINISH_CANCEL)
        ks_api_error_set(e, 503, "server_error", "shutting_down", NULL,
                         "The generation was canceled: the server is shutting down.");
    else
        ks_api_error_set(e, 500, "server_error", "generation_failed", NULL, "Generation failed: %s.",
                         g->failed ? ks_strerror(KS_ENOMEM) : ks_strerror(g->res.error));
    return true;
}

/* ------------------------------------------------------------- streaming */
/* Appends one SSE event of obj (stolen) to g->out. */
static int sse(gen *g, json_t *obj) {
    int rc = obj ? ks_api_sse(&g->out, obj) : KS_ENOMEM;
    json_decref(obj);
    return rc;
}

/* The final SSE events of a stream into g->out. */
static int stream_finish(gen *g) {
    ks_server *s = g->srv;
    const char *finish;
    ks_api_error e;
    if (gen_failed(g, &finish, &e)) return sse(g, ks_api_error_json(&e));
    ks_api_gen ag = {g->kind, g->id, g->created, s->model, NULL, finish, &g->res};
    int rc = sse(g, ks_api_chunk_json(&ag, KS_API_CHUNK_FINISH, NULL, 0));
    if (!rc && g->include_usage) rc = sse(g, ks_api_chunk_json(&ag, KS_API_CHUNK_USAGE, NULL, 0));
    return rc ? rc : ks_api_sse_done(&g->out);
}

/* The next events of a stream into g->out: the role chunk first, then text
 * as it comes, then the end. Blocks until there is something. */
static int stream_next(gen *g) {
    ks_api_gen ag = {g->kind, g->id, g->created, g->srv->model, NULL, NULL, NULL};
    if (g->phase == PH_START) {
        g->phase = PH_BODY;
        return g->kind == KS_API_CHAT ? sse(g, ks_api_chunk_json(&ag, KS_API_CHUNK_ROLE, NULL, 0)) : 0;
    }
    pthread_mutex_lock(&g->mu);
    bool alive = wait_locked(g, true);
    bool done = g->done;
    int rc = 0;
    ks_buf_reset(&g->take);
    if (alive && g->pending.len) {
        rc = ks_buf_append(&g->take, g->pending.s, g->pending.len);
        ks_buf_reset(&g->pending);
    }
    pthread_mutex_unlock(&g->mu);
    if (!alive) return KS_ECANCELED;
    if (!rc && g->take.len) rc = sse(g, ks_api_chunk_json(&ag, KS_API_CHUNK_DELTA, g->take.s, g->take.len));
    if (!rc && done) {
        rc = stream_finish(g);
        g->phase = PH_END;
    }
    return rc;
}

/* MHD content reader of a streamed response (connection thread). Blocks
 * until there is something to send: thread-per-connection mode forbids
 * returning 0, which would spin. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    gen *g = cls;
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
            MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, g->srv->timeout_s);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        int rc = stream_next(g);
        if (rc == KS_ECANCELED) return MHD_CONTENT_READER_END_WITH_ERROR; /* the client left */
        if (rc) {
            KS_ERROR(MOD, "%s: stream formatting failed: %s", g->id, ks_strerror(rc));
            gen_abandon(g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) { gen_release(cls); }

/* ------------------------------------------------------------- a request */
/* The prompt of a request, and for chat requests the cache hints. */
static int build_prompt(ks_server *s, const ks_api_request *rq, ks_prompt *p, ks_api_error *e) {
    int rc, bad = 0;
    if (rq->kind == KS_API_CHAT) {
        ks_prompt_opts o = {.hints = true, .model_id = s->model_id};
        rc = ks_prompt_chat(s->engine, rq->msgs, rq->n_msgs, &o, p);
    } else if (rq->prompt) {
        rc = ks_prompt_text(s->engine, rq->prompt, p);
    } else {
        rc = ks_prompt_ids(s->engine, rq->prompt_tokens, rq->n_prompt_tokens, p, &bad);
        if (rc == KS_EINVAL) {
            char param[32];
            snprintf(param, sizeof param, "prompt[%d]", bad);
            ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", param,
                             "Invalid '%s': token id %d is outside the vocabulary (%d tokens).", param,
                             (int)rq->prompt_tokens[bad], ks_engine_n_vocab(s->engine));
            return rc;
        }
    }
    if (rc == KS_ETEMPLATE)
        ks_api_error_set(e, 500, "server_error", "template_error", NULL,
                         "The model's chat template could not be applied: %s.", ks_strerror(rc));
    else if (rc)
        ks_api_error_set(e, 500, "server_error", "tokenize_failed", NULL, "The prompt could not be tokenized.");
    return rc;
}

/* Checks the prompt against the context and picks max_tokens (*max). */
static int fit_context(ks_server *s, const ks_api_request *rq, int n_prompt, int *max, ks_api_error *e) {
    int n_ctx = ks_engine_n_ctx_seq(s->engine);
    const char *what = rq->kind == KS_API_CHAT ? "messages" : "prompt";
    if (n_prompt == 0) {
        ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", what,
                         "Invalid '%s': the prompt is empty after tokenization.", what);
        return KS_EINVAL;
    }
    if (rq->max_tokens > 0 && (int64_t)n_prompt + rq->max_tokens > n_ctx) {
        ks_api_error_set(e, 400, "invalid_request_error", "context_length_exceeded", what,
                         "This model's maximum context length is %d tokens. However, you requested "
                         "%lld tokens (%d in the %s, %d in the completion). Please reduce the length "
                         "of the %s or completion.", n_ctx, (long long)n_prompt + rq->max_tokens, n_prompt,
                         what, rq->max_tokens, what);
        return KS_ECTX;
    }
    if (n_prompt >= n_ctx) {
        ks_api_error_set(e, 400, "invalid_request_error", "context_length_exceeded", what,
                         "This model's maximum context length is %d tokens. However, your %s "
                         "resulted in %d tokens, which leaves no room for a completion. Please "
                         "reduce the length of the %s.", n_ctx, what, n_prompt, what);
        return KS_ECTX;
    }
    *max = rq->max_tokens > 0 ? rq->max_tokens : s->default_max_tokens;
    if (*max > n_ctx - n_prompt) *max = n_ctx - n_prompt;
    return 0;
}

static uint64_t random_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) x = (uint64_t)ks_now_us() * 2654435761u;
    return x;
}

/* Queues the generation. On failure fills e (and *retry for a full queue);
 * on_done will not come then. */
static int submit(ks_server *s, gen *g, const ks_api_request *rq, const ks_prompt *p, int max_tokens,
                  ks_api_error *e, bool *retry) {
    ks_req_params rp = {0};
    rp.tokens = p->tokens.v;
    rp.n_tokens = p->tokens.n;
    rp.max_tokens = max_tokens;
    rp.sample = rq->sample;
    if (!rq->seed_set) rp.sample.seed = random_seed();
    rp.cache_prompt = rq->cache_prompt;
    rp.preferred_slot = -1;
    if (p->msg_hashes) {
        rp.msg_prefix_hash = p->msg_hashes;
        rp.n_msgs = p->n_msgs;
        rp.n_msgs_cacheable = p->n_msgs - 1; /* all but the last (sched.h) */
    }
    rp.sys_key = p->sys_key;
    rp.n_sys_tokens = p->n_sys_tokens;
    rp.on_token = on_token;
    rp.on_done = on_done;
    rp.ud = g;
    gen_ref(g); /* the scheduler's reference, dropped in on_done */
    int rc = sched_submit(s, &rp, &g->sched_id);
    if (!rc) return 0;
    gen_release(g);
    const char *what = rq->kind == KS_API_CHAT ? "messages" : "prompt";
    switch (rc) {
    case KS_EFULL:
        ks_api_error_set(e, 503, "server_error", "queue_full", NULL,
                         "The server is busy: the request queue is full. Retry later.");
        *retry = true;
        break;
    case KS_ESHUTDOWN:
        ks_api_error_set(e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        break;
    case KS_ECTX:
        ks_api_error_set(e, 400, "invalid_request_error", "context_length_exceeded", what,
                         "The %s and max_tokens do not fit in the context (%d tokens).", what,
                         ks_engine_n_ctx_seq(s->engine));
        break;
    default:
        ks_api_error_set(e, 500, "server_error", "submit_failed", NULL, "The request could not be queued: %s.",
                         ks_strerror(rc));
    }
    return rc;
}

static enum MHD_Result respond_stream(ks_server *s, struct MHD_Connection *c, conn *cn, gen *g) {
    gen_ref(g); /* the content reader's reference, dropped in stream_free */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, g,
                                                               stream_free);
    if (!r) {
        gen_release(g);
        gen_abandon(g);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    ks_http_count(&s->http, 200);
    cn->status = 200;
    return ret;
}

static enum MHD_Result respond_whole(ks_server *s, struct MHD_Connection *c, conn *cn, gen *g) {
    pthread_mutex_lock(&g->mu);
    wait_locked(g, false);
    pthread_mutex_unlock(&g->mu);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
    if (atomic_load(&g->gone)) return MHD_NO; /* nobody to answer */
    const char *finish;
    ks_api_error e;
    if (gen_failed(g, &finish, &e)) return ks__reply_error(s, c, cn, &e, NULL);
    ks_api_gen ag = {g->kind, g->id, g->created, s->model, g->pending.s ? g->pending.s : "", finish, &g->res};
    json_t *o = ks_api_response_json(&ag);
    if (!o) {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "The response could not be encoded.");
        return ks__reply_error(s, c, cn, &e, NULL);
    }
    return ks__reply_json(s, c, cn, 200, o, NULL);
}

enum MHD_Result ks__gen_handle(ks_server *s, struct MHD_Connection *c, conn *cn, ks_api_kind kind) {
    ks_api_request rq;
    ks_api_error e;
    ks_prompt p = {0};
    enum MHD_Result ret;
    int max_tokens = 0;
    bool retry = false;

    if (ks_api_parse(kind, cn->body.s, cn->body.len, &rq, &e)) return ks__reply_error(s, c, cn, &e, NULL);
    if (atomic_load(&s->draining)) {
        ks_api_error_set(&e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        goto fail;
    }
    if (build_prompt(s, &rq, &p, &e) || fit_context(s, &rq, p.tokens.n, &max_tokens, &e)) goto fail;
    gen *g = gen_create(s, kind, &rq);
    if (!g) {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        goto fail;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    g->conn = c;
    cn->g = g; /* the HTTP reference, dropped in ks__gen_request_done */
    /* Generation time must not count as idleness (the connection thread
     * blocks while it runs); the idle timeout comes back when the reply is out. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (submit(s, g, &rq, &p, max_tokens, &e, &retry)) {
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
        const char *const retry_after[] = {"Retry-After", "1", NULL};
        ret = ks__reply_error(s, c, cn, &e, retry ? retry_after : NULL);
        goto out;
    }
    KS_DEBUG(MOD, "%s: queued as %llu, %d prompt tokens, max_tokens %d%s", g->id,
             (unsigned long long)g->sched_id, p.tokens.n, max_tokens, rq.stream ? ", stream" : "");
    ret = rq.stream ? respond_stream(s, c, cn, g) : respond_whole(s, c, cn, g);
    goto out;
fail:
    ret = ks__reply_error(s, c, cn, &e, NULL);
out:
    ks_api_request_free(&rq);
    ks_prompt_free(&p);
    return ret;
}

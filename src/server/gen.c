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
 *      a client that left (server.h note 3: end of file is not leaving).
 *  H3. The inference thread never waits on a connection: it takes g->mu for
 *      an append and a signal only.
 *  H4. A generation whose client left is canceled (ks_sched_cancel), never
 *      stopped by on_token: its result, log line and metrics say "cancel".
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
#include "prompt/prompt_tmpl.h"
#include "server/api_int.h"
#include "engine/chat_tmpl.h"
#include "server/convstore.h"
#include "server/plan.h"
#include "server/server_int.h"

#define MOD "http"
#define WAIT_POLL_MS 200
/* After end of file on the socket, a probe written at most this often tells
 * a half-closed client (it reads on) from one that is gone (its kernel
 * answers the probe with a reset). */
#define PROBE_MS 1000

enum { PH_START = 0, PH_BODY, PH_END };

/* One choice: one scheduler request. */
typedef struct choice {
    struct ks_gen *g;
    int index;                     /* in the response */
    uint64_t sched_id;
    bool submitted;

    /* inference thread only (handed over by submit) */
    ks_textstream *ts;
    ks_buf scratch;

    /* under g->mu */
    ks_buf pending;                /* safe text not yet taken by the connection thread */
    json_t *lp_pending;            /* logprob entries not yet taken (array), NULL: none asked */
    bool done;
    bool stopped;                  /* a stop string ended it */
    int stop_index;                /* which one (in the request's stops, then the template's) */
    bool failed;                   /* the text could not be kept (ENOMEM) */
    ks_req_result res;             /* valid once done */

    /* connection thread only */
    ks_buf text;                   /* everything taken so far */
    json_t *lp_all;                /* every logprob entry taken so far */
    json_t *msg;                   /* the last parsed message (stream) */
    json_t *ids;                   /* tool-call ids given so far, by index (array of strings) */
    json_t *args_sent;             /* streamed arguments, by tool-call index (array of strings) */
    bool finished;                 /* the finish chunk is out */
} choice;

struct ks_gen {
    /* set before submit, read-only afterwards */
    ks_server *srv;
    ks_api_kind kind;
    bool stream;
    bool include_usage;
    char id[64];
    int64_t created;
    int fd;                        /* the client's socket, polled for hang-up */
    bool http11;                   /* the client may be sent an interim 1xx response */
    struct MHD_Connection *conn;
    _Atomic bool gone;             /* client went away: canceled */
    choice *ch;
    int n_ch;
    int n_prompts;                 /* distinct prompts (usage counts each once) */
    char *parse;                   /* chat: parse options for ks_chat_tmpl_parse, NULL: plain text */
    bool continuation;             /* chat: the last assistant message is continued */
    int32_t *preserved;            /* tokens the output shows as text (sorted) */
    int n_preserved;
    bool logprobs;
    int top_logprobs;
    /* The wire protocol of the reply (server_int.h): OpenAI chat/completions,
     * Responses or Messages; the last two render chat output their way
     * (api_responses.c, api_messages.c) and have one choice. */
    ks_wire wire;
    json_t *wreq;                  /* responses: the request, for the fields the response repeats */
    json_t *conv;                  /* responses: history + input as chat messages, kept under the
                                      id with the output when store is on */
    bool store;
    json_t *user_stops;            /* messages: stop_sequences (stop_reason names the one met) */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    int refs;
    int n_done;

    /* connection thread only */
    double probe_ms;               /* when the last probe went out (server.h note 3), 0: none */
    /* connection thread only (stream) */
    int phase;
    bool stream_failed;            /* a choice ended with an error event */
    ks_buf out;
    size_t out_off;
    ks_buf take;
    ks_api_rstream rs;             /* responses stream state */
    ks_api_mstream ms;             /* messages stream state */
    bool started;                  /* messages: message_start is out */
};

typedef ks_gen gen;

static void choice_free(choice *c) {
    ks_textstream_free(c->ts);
    ks_buf_free(&c->scratch);
    ks_buf_free(&c->pending);
    ks_buf_free(&c->text);
    json_decref(c->lp_pending);
    json_decref(c->lp_all);
    json_decref(c->msg);
    json_decref(c->ids);
    json_decref(c->args_sent);
}

static void gen_destroy(gen *g) {
    for (int i = 0; i < g->n_ch; i++) choice_free(&g->ch[i]);
    free(g->ch);
    free(g->parse);
    free(g->preserved);
    ks_buf_free(&g->out);
    ks_buf_free(&g->take);
    ks_api_rstream_free(&g->rs);
    json_decref(g->wreq);
    json_decref(g->conv);
    json_decref(g->user_stops);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* stops: the request's plus the template's. */
static gen *gen_create(ks_server *s, ks_api_kind kind, ks_wire wire, const ks_api_request *rq, int n_ch,
                       const char *const *stops, int n_stops) {
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
    g->ch = calloc((size_t)n_ch, sizeof *g->ch);
    if (!g->ch) goto fail;
    g->n_ch = n_ch;
    for (int i = 0; i < n_ch; i++) {
        choice *c = &g->ch[i];
        c->g = g;
        c->index = i;
        if (!(c->ts = ks_textstream_create(stops, n_stops))) goto fail;
        if (rq->logprobs && (!(c->lp_pending = json_array()) || !(c->lp_all = json_array()))) goto fail;
        if (!(c->ids = json_array()) || !(c->args_sent = json_array())) goto fail;
    }
    g->srv = s;
    g->kind = kind;
    g->stream = rq->stream;
    g->include_usage = rq->include_usage;
    g->logprobs = rq->logprobs;
    g->top_logprobs = rq->top_logprobs;
    g->created = ks_wall_s();
    g->fd = -1;
    g->refs = 1;
    g->wire = wire;
    ks_api_rstream_init(&g->rs, NULL);
    if (!g->rs.items) goto fail;
    ks_api_make_id(g->id, sizeof g->id,
                   wire == KS_WIRE_RESPONSES  ? "resp_"
                   : wire == KS_WIRE_MESSAGES ? "msg_"
                   : kind == KS_API_CHAT      ? "chatcmpl-"
                                              : "cmpl-");
    atomic_fetch_add(&s->n_active, 1);
    return g;
fail:
    gen_destroy(g);
    return NULL;
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
    gen_destroy(g);
    atomic_fetch_sub(&s->n_active, 1);
}

/* Inference thread. A preserved special token (a tool-call marker) is shown
 * as its text, so that the output parser sees it. */
static int on_token(void *ud, int32_t tok, const char *piece, int len) {
    choice *c = ud;
    gen *g = c->g;
    /* The client left: the cancel is on its way (gen_abandon), and stopping
     * here would end the request as "stop" (H4). Nobody reads the text. */
    if (atomic_load(&g->gone)) return 0;
    char special[256];
    if (ks_prompt_tmpl_preserved(g->preserved, g->n_preserved, tok)) {
        int n = ks_engine_token_text(g->srv->engine, tok, special, sizeof special);
        if (n > 0 && n <= (int)sizeof special) {
            piece = special;
            len = n;
        }
    }
    ks_buf_reset(&c->scratch);
    int rc = ks_textstream_feed(c->ts, piece, len > 0 ? (size_t)len : 0, &c->scratch);
    bool fail = rc < 0;
    if (c->scratch.len || fail) {
        pthread_mutex_lock(&g->mu);
        if (!fail && ks_buf_append(&c->pending, c->scratch.s, c->scratch.len)) fail = true;
        if (fail) c->failed = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return fail || rc == 1;
}

/* A token's text for logprobs: {token, logprob, bytes}. */
static json_t *lp_entry(gen *g, int32_t tok, float lp) {
    char buf[256];
    int n = ks_engine_piece(g->srv->engine, tok, buf, sizeof buf);
    if (n < 0) n = 0;
    if (n > (int)sizeof buf) n = (int)sizeof buf;
    json_t *bytes = json_array();
    for (int i = 0; i < n && bytes; i++) json_array_append_new(bytes, json_integer((unsigned char)buf[i]));
    /* A piece that is part of a character is shown by its bytes only. */
    json_t *t = json_stringn(buf, (size_t)n);
    return json_pack("{s:o, s:f, s:o}", "token", t ? t : json_string(""), "logprob", (double)lp, "bytes",
                     bytes ? bytes : json_array());
}

/* Inference thread: the sampled token's probabilities, before on_token. */
static void on_probs(void *ud, const ks_token_prob *sampled, const ks_token_prob *top, int n_top) {
    choice *c = ud;
    gen *g = c->g;
    json_t *e = lp_entry(g, sampled->tok, sampled->logprob);
    json_t *alts = json_array();
    for (int i = 0; i < n_top && i < g->top_logprobs && alts; i++) {
        json_t *a = lp_entry(g, top[i].tok, top[i].logprob);
        if (a) json_array_append_new(alts, a);
    }
    if (e && alts) json_object_set_new(e, "top_logprobs", alts);
    else json_decref(alts);
    pthread_mutex_lock(&g->mu);
    if (e && c->lp_pending) json_array_append_new(c->lp_pending, e);
    else json_decref(e);
    pthread_mutex_unlock(&g->mu);
}

/* Inference thread: the one INFO line per choice, then wake the waiter. */
static void on_done(void *ud, const ks_req_result *r) {
    choice *c = ud;
    gen *g = c->g;
    bool stopped = ks_textstream_stopped(c->ts);
    ks_buf_reset(&c->scratch);
    int frc = stopped ? 0 : ks_textstream_flush(c->ts, &c->scratch);

    const char *finish = r->finish == KS_FINISH_STOP || r->finish == KS_FINISH_LENGTH
                             ? ks_api_finish_reason(r, stopped)
                             : ks_finish_name(r->finish);
    double tps = r->gen_ms > 0 ? 1e3 * r->n_generated / r->gen_ms : 0.0;
    char which[16] = "";
    if (g->n_ch > 1) snprintf(which, sizeof which, "[%d]", c->index);
    KS_INFO(MOD, "%s%s slot %d: prompt %d tok, cached %d (%.0f%%), ttft %.1f ms, %d tok at %.1f tok/s, "
                 "finish %s, cache %.*s%s%.*s",
            g->id, which, r->slot, r->n_prompt, r->n_cached,
            r->n_prompt ? 100.0 * r->n_cached / r->n_prompt : 0.0, r->ttft_ms, r->n_generated, tps,
            finish, (int)sizeof r->cache_mode, r->cache_mode, r->cache_reason[0] ? " / " : "",
            (int)sizeof r->cache_reason, r->cache_reason);
    if (r->finish == KS_FINISH_ERROR)
        KS_WARN(MOD, "%s%s failed: %s", g->id, which, ks_strerror(r->error));

    pthread_mutex_lock(&g->mu);
    if (frc < 0 || ks_buf_append(&c->pending, c->scratch.s ? c->scratch.s : "", c->scratch.len))
        c->failed = true;
    c->res = *r;
    c->res.logits = NULL; /* borrowed for this call only */
    c->stopped = stopped;
    c->stop_index = ks_textstream_stop_index(c->ts);
    c->done = true;
    g->n_done++;
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

static void cancel_choices(gen *g) {
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].submitted) sched_cancel(g->srv, g->ch[i].sched_id);
}

/* The client left: cancel once, so the slots free within a step. */
static void gen_abandon(gen *g) {
    if (atomic_exchange(&g->gone, true)) return;
    pthread_mutex_lock(&g->mu);
    bool done = g->n_done == g->n_ch;
    pthread_mutex_unlock(&g->mu);
    if (done) return;
    atomic_fetch_add(&g->srv->http.client_disconnects, 1);
    KS_INFO(MOD, "%s: client disconnected, canceling", g->id);
    cancel_choices(g);
}

void ks__gen_request_done(ks_gen *g, bool completed_ok) {
    if (!completed_ok) gen_abandon(g);
    gen_release(g);
}

/* What the client's socket says (server.h note 3). */
enum { PEER_OK = 0, PEER_EOF, PEER_GONE };

/* PEER_GONE: the connection broke (a reset: POLLHUP/POLLERR, a read error).
 * PEER_EOF: the client will send nothing more — it shut down its sending
 * side and may still read (a half-close), or it closed the socket; TCP
 * tells these apart only when we write. A client that pipelined its next
 * request has data waiting, which is neither. */
static int peer_state(int fd) {
    if (fd < 0) return PEER_OK;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return PEER_OK;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return PEER_GONE;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return PEER_EOF;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return PEER_GONE;
    }
    return PEER_OK;
}

/* Whether a probe is due after end of file: the first at once, then one a
 * PROBE_MS. A whole reply can be probed only on HTTP/1.1 (1xx responses). */
static bool probe_due(gen *g) {
    if (!g->stream && !g->http11) return false;
    double now = ks_now_ms();
    if (g->probe_ms > 0 && now - g->probe_ms < PROBE_MS) return false;
    g->probe_ms = now;
    return true;
}

/* The probe of a whole reply: an interim response, which every HTTP/1.1
 * client must accept before the final one and may ignore (RFC 9110 15.2).
 * Written on the socket directly: MHD writes nothing while the request's
 * handler (this thread) waits, so nothing interleaves with it. */
static void probe_interim(gen *g) {
    static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
    size_t off = 0;
    while (off < sizeof msg - 1) {
        ssize_t n = send(g->fd, msg + off, sizeof msg - 1 - off, MSG_NOSIGNAL);
        if (n > 0) off += (size_t)n;
        else if (n < 0 && errno == EINTR) continue;
        else return; /* the reset shows at the next poll */
    }
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

/* Something for the stream (g->mu held): a choice with text or logprobs
 * pending, or done and not yet finished. */
static bool stream_ready(const gen *g) {
    for (int i = 0; i < g->n_ch; i++) {
        const choice *c = &g->ch[i];
        if (c->pending.len || (c->lp_pending && json_array_size(c->lp_pending)) || (c->done && !c->finished))
            return true;
    }
    return false;
}

enum { W_READY = 0, W_GONE, W_PROBE };

/* Waits (g->mu held) until every choice is done or, with want_text, the
 * stream has something (W_READY). Returns early with W_GONE when the client
 * left (want_text only: a whole reply waits for the canceled choices' on_done),
 * and with W_PROBE when a probe of a client at end of file is due (the
 * caller writes it and waits again). */
static int wait_locked(gen *g, bool want_text) {
    while (g->n_done < g->n_ch && !(want_text && stream_ready(g))) {
        struct timespec ts;
        deadline_in(&ts, WAIT_POLL_MS);
        if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) != ETIMEDOUT) continue;
        if (atomic_load(&g->gone)) continue; /* canceled: on_done is on its way (H2) */
        pthread_mutex_unlock(&g->mu);
        int peer = peer_state(g->fd);
        if (peer == PEER_GONE) gen_abandon(g);
        bool probe = peer == PEER_EOF && probe_due(g);
        pthread_mutex_lock(&g->mu);
        if (peer == PEER_GONE && want_text) return W_GONE;
        if (probe) return W_PROBE;
    }
    return W_READY;
}

/* The error of a choice that did not complete (canceled, failed), or NULL
 * finish reason: fills e and returns true. c is done. */
static bool choice_failed(const choice *c, const char **finish, ks_api_error *e) {
    *finish = ks_api_finish_reason(&c->res, c->stopped);
    if (!c->failed && *finish) return false;
    if (c->res.finish == KS_FINISH_CANCEL)
        ks_api_error_set(e, 503, "server_error", "shutting_down", NULL,
                         "The generation was canceled: the server is shutting down.");
    else if (c->res.error == KS_EINVAL)
        ks_api_error_set(e, 400, T_INVALID, "invalid_grammar", NULL,
                         "The grammar could not be used for sampling.");
    else
        ks_api_error_set(e, 500, "server_error", "generation_failed", NULL, "Generation failed: %s.",
                         c->failed ? ks_strerror(KS_ENOMEM) : ks_strerror(c->res.error));
    return true;
}

/* The statistics of the whole request: sums over the choices; the prompt of
 * n choices that share it counts once. */
static ks_req_result total_result(const gen *g) {
    ks_req_result t = g->ch[0].res;
    int per = g->n_ch / (g->n_prompts > 0 ? g->n_prompts : 1);
    if (per < 1) per = 1;
    t.n_prompt = t.n_cached = t.n_generated = 0;
    t.prompt_ms = t.gen_ms = 0;
    for (int i = 0; i < g->n_ch; i++) {
        const ks_req_result *r = &g->ch[i].res;
        if (i % per == 0) {
            t.n_prompt += r->n_prompt;
            t.n_cached += r->n_cached;
            t.prompt_ms += r->prompt_ms;
        }
        t.n_generated += r->n_generated;
        if (r->gen_ms > t.gen_ms) t.gen_ms = r->gen_ms;
    }
    return t;
}

/* ------------------------------------------------------------- output parsing */
static const char ID_CHARS[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/* Tool calls without an id get one, the same for a call across partial
 * parses: 9 alphanumeric characters (Mistral's templates refuse others). */
static void give_ids(choice *c, json_t *msg) {
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        json_t *id = json_object_get(tc, "id");
        if (i >= json_array_size(c->ids)) {
            char buf[10];
            unsigned char rnd[9];
            if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
                for (int k = 0; k < 9; k++) rnd[k] = (unsigned char)(ks_now_us() >> (k * 3));
            for (int k = 0; k < 9; k++) buf[k] = ID_CHARS[rnd[k] % (sizeof ID_CHARS - 1)];
            buf[9] = 0;
            json_array_append_new(c->ids, json_string(json_is_string(id) && json_string_length(id) ? json_string_value(id) : buf));
        }
        json_object_set(tc, "id", json_array_get(c->ids, i));
    }
}

/* The generated text as a message (new reference), NULL when it cannot be
 * parsed (then the text is the content). */
static json_t *parse_text(gen *g, choice *c, const char *text, bool partial) {
    if (!g->parse) return NULL;
    char *out = NULL;
    char err[256] = "";
    int rc = ks_chat_tmpl_parse(text, partial, g->parse, &out, err, sizeof err);
    if (rc) {
        if (!partial) KS_DEBUG(MOD, "%s: output not parsed (%s): returned as text", g->id, err);
        return NULL;
    }
    json_t *m = json_loads(out, 0, NULL);
    free(out);
    if (m) give_ids(c, m);
    return m;
}

static const char *jstr(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The delta from prev to cur of one string field, appended to *deltas as
 * {key: suffix}; a field that did not grow by appending adds nothing. */
static void delta_field(json_t *deltas, const json_t *prev, const json_t *cur, const char *key) {
    const char *a = jstr(prev, key), *b = jstr(cur, key);
    size_t la = strlen(a), lb = strlen(b);
    if (lb > la && !strncmp(a, b, la)) json_array_append_new(deltas, json_pack("{s:s}", key, b + la));
}

/* The stream deltas from c->msg to cur (OpenAI's order: text first, then
 * each tool call's header — id, name — then its argument fragments). A
 * call's header waits for its arguments to start (the name is whole then). */
static json_t *message_deltas(choice *c, const json_t *cur, bool final) {
    json_t *d = json_array();
    if (!d) return NULL;
    const json_t *prev = c->msg;
    delta_field(d, prev, cur, "reasoning_content");
    delta_field(d, prev, cur, "content");
    json_t *calls = json_object_get(cur, "tool_calls");
    size_t n = json_array_size(calls);
    for (size_t i = 0; i < n; i++) {
        json_t *tc = json_array_get(calls, i);
        json_t *fn = json_object_get(tc, "function");
        const char *name = jstr(fn, "name"), *args = jstr(fn, "arguments");
        if (i >= json_array_size(c->args_sent)) {
            if (!name[0] || (!args[0] && i + 1 == n && !final)) break;
            json_t *h = json_pack("{s:[{s:i, s:O, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", (int)i, "id",
                                  json_object_get(tc, "id"), "type", "function", "function", "name", name,
                                  "arguments", "");
            if (h) json_array_append_new(d, h);
            json_array_append_new(c->args_sent, json_string(""));
        }
        const char *sent = json_string_value(json_array_get(c->args_sent, i));
        size_t ls = strlen(sent), la = strlen(args);
        if (la > ls && !strncmp(sent, args, ls)) {
            json_t *f = json_pack("{s:[{s:i, s:{s:s}}]}", "tool_calls", "index", (int)i, "function", "arguments",
                                  args + ls);
            if (f) json_array_append_new(d, f);
            json_array_set_new(c->args_sent, i, json_string(args));
        }
    }
    return d;
}

/* A continued message: the response holds what was generated, not the
 * prefill the parser sees again (the parse of no output, base). */
static void strip_prefill(json_t *msg, const json_t *base) {
    static const char *const keys[] = {"content", "reasoning_content"};
    for (int k = 0; k < 2; k++) {
        const char *a = jstr(base, keys[k]), *b = jstr(msg, keys[k]);
        size_t la = strlen(a);
        if (la && !strncmp(a, b, la)) json_object_set_new(msg, keys[k], json_string(b + la));
    }
}

/* finish_reason of a choice whose message is msg. */
static const char *finish_of(const json_t *msg, const char *finish) {
    json_t *calls = msg ? json_object_get(msg, "tool_calls") : NULL;
    if (json_array_size(calls) > 0 && !strcmp(finish, "stop")) return "tool_calls";
    return finish;
}

/* logprobs entries as a completion's legacy object. */
static json_t *legacy_logprobs(const json_t *entries) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i, off = 0;
    json_t *e;
    json_array_foreach(entries, i, e) {
        const char *t = jstr(e, "token");
        json_array_append(tokens, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += strlen(t);
        json_t *top = json_object();
        size_t j;
        json_t *a;
        json_array_foreach(json_object_get(e, "top_logprobs"), j, a) json_object_set(top, jstr(a, "token"), json_object_get(a, "logprob"));
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

/* The logprobs object of a response or chunk from entries (new reference). */
static json_t *logprobs_json(const gen *g, json_t *entries) {
    if (!entries) return NULL;
    if (g->kind == KS_API_CHAT) return json_pack("{s:O, s:[]}", "content", entries, "refusal");
    return legacy_logprobs(entries);
}

/* ------------------------------------------------------------- other wires */
/* What a choice's result says so far: the whole result once done, else
 * the prompt and cached counts of the slot running it (the prefill is over
 * once a token is out). */
static void peek_result(gen *g, choice *c, ks_req_result *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_lock(&g->mu);
    bool done = c->done;
    if (done) *r = c->res;
    pthread_mutex_unlock(&g->mu);
    if (done) return;
    ks_slot_info *info = malloc(sizeof *info * KS_MAX_SLOTS);
    if (!info) return;
    ks_server *s = g->srv;
    int n = 0;
    pthread_rwlock_rdlock(&s->sched_lock);
    if (!s->detached) n = ks_sched_slots(s->sched, info, KS_MAX_SLOTS);
    pthread_rwlock_unlock(&s->sched_lock);
    for (int i = 0; i < n && i < KS_MAX_SLOTS; i++)
        /* shown_req_id: the request may have finished since (its slot idle),
         * its numbers still shown until the slot's next request */
        if (info[i].shown_req_id == c->sched_id) {
            r->n_prompt = info[i].n_prompt;
            r->n_cached = info[i].n_cached;
            r->n_cache_written = info[i].n_cache_written;
            r->slot = info[i].id;
        }
    free(info);
}

/* Anthropic's stop_reason (and the stop sequence met) for an OpenAI finish. */
static const char *messages_stop(const gen *g, const choice *c, const char *finish, const char **seq) {
    *seq = NULL;
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    if (!strcmp(finish, "length")) return "max_tokens";
    if (c->stopped && c->stop_index >= 0 && (size_t)c->stop_index < json_array_size(g->user_stops)) {
        *seq = json_string_value(json_array_get(g->user_stops, (size_t)c->stop_index));
        return "stop_sequence";
    }
    return "end_turn";
}

/* The Responses object of a finished choice; output: its items (borrowed). */
static json_t *responses_object(const gen *g, const char *finish, const json_t *output, const ks_req_result *r) {
    bool cut = !strcmp(finish, "length");
    ks_api_resp_out o = {.id = g->id, .created = g->created, .model = g->srv->model,
                         .status = cut ? "incomplete" : "completed", .incomplete = cut ? "max_output_tokens" : NULL,
                         .req = g->wreq, .output = output, .store = g->store, .r = r};
    return ks_api_responses_object(&o);
}

/* Keeps the conversation of a finished Responses choice under its id: the
 * history and input, then the reply as an assistant message. */
static void keep_conversation(gen *g, const choice *c, const char *text) {
    if (g->wire != KS_WIRE_RESPONSES || !g->store || !g->conv) return;
    json_t *conv = json_copy(g->conv);
    json_t *m = json_pack("{s:s}", "role", "assistant");
    if (!conv || !m) goto oom;
    const json_t *msg = c->msg;
    const char *content = msg ? jstr(msg, "content") : text;
    json_object_set_new(m, "content", content && content[0] ? json_string(content) : json_null());
    if (msg && jstr(msg, "reasoning_content")[0])
        json_object_set(m, "reasoning_content", json_object_get(msg, "reasoning_content"));
    json_t *calls = msg ? json_object_get(msg, "tool_calls") : NULL;
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (json_is_null(json_object_get(m, "content")) && !json_array_size(calls))
        json_object_set_new(m, "content", json_string(""));
    if (json_array_append_new(conv, m)) {
        m = NULL;
        goto oom;
    }
    ks_convstore_put(g->srv->convs, g->id, conv);
    return;
oom:
    json_decref(m);
    json_decref(conv);
    KS_WARN(MOD, "%s: the conversation could not be kept (out of memory)", g->id);
}

/* One chat delta in the reply's wire protocol (not OpenAI's). */
static int wire_delta(gen *g, choice *c, const json_t *d) {
    if (g->wire == KS_WIRE_RESPONSES) return ks_api_rstream_delta(&g->rs, d, &g->out);
    if (!g->started) {
        ks_req_result r;
        peek_result(g, c, &r);
        int rc = ks_api_mstream_start(&g->ms, g->id, g->srv->model, &r, &g->out);
        if (rc) return rc;
        g->started = true;
    }
    return ks_api_mstream_delta(&g->ms, d, &g->out);
}

/* ------------------------------------------------------------- streaming */
/* Appends one SSE event of obj (stolen) to g->out. */
static int sse(gen *g, json_t *obj) {
    int rc = obj ? ks_api_sse(&g->out, obj) : KS_ENOMEM;
    json_decref(obj);
    return rc;
}

static ks_api_gen api_gen(const gen *g, const choice *c) {
    ks_api_gen ag = {0};
    ag.kind = g->kind;
    ag.index = c ? c->index : 0;
    ag.id = g->id;
    ag.created = g->created;
    ag.model = g->srv->model;
    return ag;
}

/* Chunks of one choice for new text (text, len) and logprob entries lp
 * (stolen, may be NULL); final: the choice is done. */
static int stream_choice(gen *g, choice *c, const char *text, size_t len, json_t *lp, bool final) {
    ks_api_gen ag = api_gen(g, c);
    int rc = 0;
    json_t *deltas = NULL;
    if (g->parse) {
        if (len && ks_buf_append(&c->text, text, len)) {
            json_decref(lp);
            return KS_ENOMEM;
        }
        json_t *m = (len || final) ? parse_text(g, c, c->text.s ? c->text.s : "", !final) : NULL;
        if (!m && final && !c->msg) {
            /* Not parseable as a whole: the text is the content. */
            m = json_pack("{s:s%, s:s, s:[]}", "content", c->text.s ? c->text.s : "", c->text.len,
                          "reasoning_content", "", "tool_calls");
        }
        if (m) {
            deltas = message_deltas(c, m, final);
            json_decref(c->msg);
            c->msg = m;
        }
    } else if (len) {
        if (g->wire != KS_WIRE_OPENAI && ks_buf_append(&c->text, text, len)) {
            json_decref(lp);
            return KS_ENOMEM;
        }
        deltas = json_array();
        json_t *t = json_stringn(text, len);
        if (deltas && t) json_array_append_new(deltas, json_pack(g->kind == KS_API_CHAT ? "{s:o}" : "{s:o}",
                                                                g->kind == KS_API_CHAT ? "content" : "text", t));
        else json_decref(t);
    }
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d) {
        if (g->wire != KS_WIRE_OPENAI) {
            if ((rc = wire_delta(g, c, d))) break;
            continue;
        }
        json_t *l = NULL;
        if (lp) { /* the logprobs so far ride on the first delta */
            l = logprobs_json(g, lp);
            json_decref(lp);
            lp = NULL;
        }
        if ((rc = sse(g, ks_api_chunk_delta_json(&ag, json_incref(d), l, NULL)))) break;
    }
    json_decref(deltas);
    if (lp && !rc) {
        /* Entries with no text to ride on yet (held back): keep them for later. */
        pthread_mutex_lock(&g->mu);
        json_array_extend(lp, c->lp_pending);
        json_array_clear(c->lp_pending);
        json_array_extend(c->lp_pending, lp);
        pthread_mutex_unlock(&g->mu);
        if (final) {
            json_t *l = logprobs_json(g, lp);
            json_t *empty = g->kind == KS_API_CHAT ? json_object() : json_pack("{s:s}", "text", "");
            rc = sse(g, ks_api_chunk_delta_json(&ag, empty, l, NULL));
            pthread_mutex_lock(&g->mu);
            json_array_clear(c->lp_pending);
            pthread_mutex_unlock(&g->mu);
        }
    }
    json_decref(lp);
    return rc;
}

/* The finish chunk of a done choice. */
static int stream_choice_end(gen *g, choice *c) {
    const char *finish;
    ks_api_error e;
    c->finished = true;
    if (choice_failed(c, &finish, &e)) {
        g->stream_failed = true;
        if (g->wire == KS_WIRE_RESPONSES) return ks_api_rstream_error(&g->rs, &e, &g->out);
        if (g->wire == KS_WIRE_MESSAGES) return ks_api_mstream_error(&e, &g->out);
        return sse(g, ks_api_error_json(&e));
    }
    if (g->wire == KS_WIRE_RESPONSES) {
        json_t *resp = responses_object(g, finish_of(c->msg, finish), NULL, &c->res);
        int rc = resp ? ks_api_rstream_end(&g->rs, resp, &g->out) : KS_ENOMEM;
        json_decref(resp);
        if (!rc) keep_conversation(g, c, c->text.s ? c->text.s : "");
        return rc;
    }
    if (g->wire == KS_WIRE_MESSAGES) {
        int rc = 0;
        if (!g->started) {
            rc = ks_api_mstream_start(&g->ms, g->id, g->srv->model, &c->res, &g->out);
            g->started = true;
        }
        const char *seq;
        const char *why = messages_stop(g, c, finish_of(c->msg, finish), &seq);
        return rc ? rc : ks_api_mstream_end(&g->ms, why, seq, &c->res, &g->out);
    }
    ks_api_gen ag = api_gen(g, c);
    ag.finish = finish_of(c->msg, finish);
    ag.r = g->n_ch == 1 ? &c->res : NULL;
    return sse(g, ks_api_chunk_json(&ag, KS_API_CHUNK_FINISH, NULL, 0));
}

/* The final SSE events of a stream into g->out: usage, then [DONE] — not
 * after an error event, which ends a failed stream. */
static int stream_finish(gen *g) {
    if (g->stream_failed || g->wire != KS_WIRE_OPENAI) return 0;
    ks_api_gen ag = api_gen(g, NULL);
    ks_req_result t = total_result(g);
    ag.r = &t;
    int rc = 0;
    if (g->include_usage) rc = sse(g, ks_api_chunk_json(&ag, KS_API_CHUNK_USAGE, NULL, 0));
    return rc ? rc : ks_api_sse_done(&g->out);
}

/* The next events of a stream into g->out: the role chunks first, then text
 * as it comes, then each choice's end. Blocks until there is something. */
static int stream_next(gen *g) {
    int rc = 0;
    if (g->phase == PH_START) {
        g->phase = PH_BODY;
        if (g->wire == KS_WIRE_RESPONSES) {
            ks_api_resp_out o = {.id = g->id, .created = g->created, .model = g->srv->model, .status = "in_progress",
                                 .req = g->wreq, .store = g->store};
            json_t *resp = ks_api_responses_object(&o);
            rc = resp ? ks_api_rstream_start(&g->rs, resp, &g->out) : KS_ENOMEM;
            json_decref(resp);
        }
        bool role = g->kind == KS_API_CHAT && g->wire == KS_WIRE_OPENAI;
        for (int i = 0; i < g->n_ch && !rc; i++) {
            ks_api_gen ag = api_gen(g, &g->ch[i]);
            if (role) rc = sse(g, ks_api_chunk_json(&ag, KS_API_CHUNK_ROLE, NULL, 0));
            if (!rc && g->parse && g->continuation) {
                /* The continued message's own text is not sent again: the
                 * parse of no output is where the deltas start. */
                g->ch[i].msg = parse_text(g, &g->ch[i], "", true);
            }
        }
        return rc;
    }
    pthread_mutex_lock(&g->mu);
    int w = wait_locked(g, true);
    pthread_mutex_unlock(&g->mu);
    if (w == W_GONE) return KS_ECANCELED;
    /* An SSE comment: clients skip it; a closed peer resets (server.h note 3). */
    if (w == W_PROBE) return ks_buf_append(&g->out, ":\n\n", 3);
    bool all_finished = true;
    for (int i = 0; i < g->n_ch && !rc; i++) {
        choice *c = &g->ch[i];
        if (c->finished) continue;
        pthread_mutex_lock(&g->mu);
        bool done = c->done;
        ks_buf_reset(&g->take);
        if (c->pending.len) {
            rc = ks_buf_append(&g->take, c->pending.s, c->pending.len);
            ks_buf_reset(&c->pending);
        }
        json_t *lp = NULL;
        if (c->lp_pending && json_array_size(c->lp_pending)) {
            lp = json_copy(c->lp_pending);
            json_array_clear(c->lp_pending);
        }
        pthread_mutex_unlock(&g->mu);
        if (!rc && (g->take.len || lp || done)) rc = stream_choice(g, c, g->take.s, g->take.len, lp, done);
        else json_decref(lp);
        if (!rc && done) rc = stream_choice_end(g, c);
        if (!c->finished) all_finished = false;
    }
    if (!rc && all_finished) {
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
static uint64_t random_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) x = (uint64_t)ks_now_us() * 2654435761u;
    return x;
}

/* Queues every choice: for each prompt, choice 0 first, then the others
 * sharing its prefill. On failure fills e (and *retry for a full queue) and
 * cancels what was queued; those choices still get their on_done. */
static int submit(ks_server *s, gen *g, const ks_api_request *rq, const ks_plan *pl, ks_api_error *e, bool *retry) {
    ks_sample_ext x = ks__plan_ext(rq, pl);
    uint64_t base_seed = rq->seed_set ? rq->sample.seed : 0;
    int rc = 0;
    for (int i = 0; i < g->n_ch && !rc; i++) {
        choice *c = &g->ch[i];
        int pi = i / rq->n, j = i % rq->n;
        const ks_prompt *p = &pl->prompts[pi];
        ks_req_params rp = {0};
        rp.tokens = p->tokens.v;
        rp.n_tokens = p->tokens.n;
        rp.max_tokens = pl->max_tokens;
        rp.sample = rq->sample;
        /* Choice j of a seeded request samples with seed + j: choice 0 is the n = 1 output. */
        rp.sample.seed = rq->seed_set ? base_seed + (uint64_t)j : random_seed();
        rp.ext = &x;
        rp.cache_prompt = rq->cache_prompt;
        rp.preferred_slot = rq->id_slot;
        if (j > 0) rp.share_prefill_of = g->ch[i - j].sched_id;
        else if (pl->n_pins) {
            rp.pins = pl->pins;
            rp.n_pins = pl->n_pins;
        }
        if (p->msg_hashes) {
            rp.msg_prefix_hash = p->msg_hashes;
            rp.n_msgs = p->n_msgs;
            rp.n_msgs_cacheable = p->n_msgs - 1; /* all but the last (sched.h) */
        }
        rp.sys_key = p->sys_key;
        rp.n_sys_tokens = p->n_sys_tokens;
        rp.on_token = on_token;
        rp.on_probs = rq->logprobs ? on_probs : NULL;
        rp.on_done = on_done;
        rp.ud = c;
        gen_ref(g); /* the scheduler's reference, dropped in on_done */
        rc = sched_submit(s, &rp, &c->sched_id);
        if (rc) gen_release(g);
        else c->submitted = true;
    }
    if (!rc) return 0;
    /* Choices that were not queued count as done; those that were are canceled. */
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_ch; i++)
        if (!g->ch[i].submitted) {
            g->ch[i].done = true;
            g->n_done++;
        }
    pthread_mutex_unlock(&g->mu);
    cancel_choices(g);
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
        ks_api_error_set(e, 400, T_INVALID, "context_length_exceeded", what,
                         "The %s and max_tokens do not fit in the context (%d tokens).", what,
                         ks_engine_n_ctx_seq(s->engine));
        break;
    case KS_EINVAL:
        ks_api_error_set(e, 400, T_INVALID, "invalid_value", rq->id_slot >= 0 ? "id_slot" : NULL,
                         /* the scheduler's check: a slot it does not have */
                         rq->id_slot >= 0 ? "Invalid 'id_slot': the server has no slot %d." : "The request could not be queued (invalid sampling parameters).",
                         rq->id_slot);
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
    ks__cors_headers(s, c, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    ks_http_count(&s->http, 200);
    cn->status = 200;
    return ret;
}

static enum MHD_Result respond_whole(ks_server *s, struct MHD_Connection *c, conn *cn, gen *g) {
    pthread_mutex_lock(&g->mu);
    while (wait_locked(g, false) == W_PROBE) {
        pthread_mutex_unlock(&g->mu);
        probe_interim(g);
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
    if (atomic_load(&g->gone)) return MHD_NO; /* nobody to answer */
    ks_api_error e;
    ks_api_gen *ags = calloc((size_t)g->n_ch, sizeof *ags);
    json_t **lps = calloc((size_t)g->n_ch, sizeof *lps);
    json_t *o = NULL;
    if (!ags || !lps) goto oom;
    for (int i = 0; i < g->n_ch; i++) {
        choice *ch = &g->ch[i];
        const char *finish;
        if (choice_failed(ch, &finish, &e)) {
            free(ags);
            free(lps);
            return ks__respond_error(s, c, cn, &e, NULL);
        }
        const char *text = ch->pending.s ? ch->pending.s : "";
        ch->msg = parse_text(g, ch, text, false);
        if (ch->msg && g->continuation) {
            json_t *base = parse_text(g, ch, "", true);
            if (base) strip_prefill(ch->msg, base);
            json_decref(base);
        }
        if (ch->lp_all) {
            json_array_extend(ch->lp_all, ch->lp_pending);
            lps[i] = logprobs_json(g, ch->lp_all);
        }
        ags[i] = api_gen(g, ch);
        ags[i].text = text;
        ags[i].msg = ch->msg;
        ags[i].finish = finish_of(ch->msg, finish);
        ags[i].logprobs = lps[i];
    }
    if (g->wire != KS_WIRE_OPENAI) { /* one choice */
        choice *ch = &g->ch[0];
        if (g->wire == KS_WIRE_RESPONSES) {
            json_t *items = ks_api_responses_output(ch->msg, ags[0].text, g->rs.tool_map);
            o = items ? responses_object(g, ags[0].finish, items, &ch->res) : NULL;
            json_decref(items);
            if (o) keep_conversation(g, ch, ags[0].text);
        } else {
            const char *seq;
            ks_api_msg_out mo = {.id = g->id, .model = g->srv->model, .msg = ch->msg, .text = ags[0].text,
                                 .r = &ch->res};
            mo.stop_reason = messages_stop(g, ch, ags[0].finish, &seq);
            mo.stop_sequence = seq;
            o = ks_api_messages_object(&mo);
        }
        json_decref(lps[0]);
        free(ags);
        free(lps);
        if (!o) goto oom;
        return ks__respond_json(s, c, cn, 200, o, NULL);
    }
    ks_req_result t = total_result(g);
    o = ks_api_response_multi_json(ags, g->n_ch, &t);
    for (int i = 0; i < g->n_ch; i++) json_decref(lps[i]);
    free(ags);
    free(lps);
    if (!o) goto oom;
    return ks__respond_json(s, c, cn, 200, o, NULL);
oom:
    free(ags);
    free(lps);
    ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "The response could not be encoded.");
    return ks__respond_error(s, c, cn, &e, NULL);
}

/* What a Responses or Messages request adds to the chat request it became. */
typedef struct wire_req {
    ks_wire wire;
    json_t *wreq;                  /* the request (responses), stolen by run */
    json_t *conv;                  /* history + input (responses), stolen by run */
    bool store;
    int mid_system;                /* messages: the first system message inside messages, -1: none */
    json_t *tool_map;              /* responses: ks_api_resp_req's, stolen by run */
} wire_req;

/* Anthropic's answer to a system message its model does not take inside
 * messages; Claude Code recognises these words and sends the message again
 * as a <system-reminder> in a user turn. */
static void mid_system_refused(const wire_req *w, ks_api_error *e) {
    char param[48], why[300];
    snprintf(param, sizeof param, "messages.%d.role", w->mid_system);
    snprintf(why, sizeof why, "%.299s", e->message);
    why[strcspn(why, "\n")] = '\0'; /* the template engine's first line says it */
    ks_api_error_set(e, 400, T_INVALID, "invalid_value", param,
                     "%s: role 'system' is not supported on this model (its chat template refused a system message "
                     "there: %.200s)", param, why);
}

/* A parsed request (freed here) from prompt to reply. */
static enum MHD_Result run(ks_server *s, struct MHD_Connection *c, conn *cn, ks_api_request *rqp, wire_req *w) {
    ks_api_request rq = *rqp;
    ks_api_kind kind = rq.kind;
    ks_api_error e;
    ks_plan pl = {0};
    enum MHD_Result ret;
    bool retry = false;
    gen *g = NULL;

    if (atomic_load(&s->draining)) {
        ks_api_error_set(&e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        goto fail;
    }
    /* The time a request spends here is per request, whatever the cache
     * holds (docs/SERVER.md, "Logs": the debug line below shows it). */
    double t0 = ks_now_ms();
    if (ks__plan_prompts(s, &rq, &pl, true, &e)) {
        if (w && w->mid_system >= 0 && e.code && !strcmp(e.code, "template_error")) mid_system_refused(w, &e);
        goto fail;
    }
    double t_prompt = ks_now_ms();
    if (ks__plan_fit(s, &rq, &pl, &e) || ks__plan_bias(s, &rq, &pl, &e) || ks__plan_grammar(s, &rq, &pl, &e)) goto fail;
    double t_grammar = ks_now_ms();
    if (pl.templated) ks__plan_pins(s, &rq, &pl);
    double t_pins = ks_now_ms();
    ks__plan_stops(&rq, &pl);
    g = gen_create(s, kind, w ? w->wire : KS_WIRE_OPENAI, &rq, pl.n_prompts * rq.n, pl.stops, pl.n_stops);
    if (g && w) {
        g->wreq = w->wreq;
        g->conv = w->conv;
        g->rs.tool_map = w->tool_map;
        w->wreq = w->conv = w->tool_map = NULL;
        g->store = w->store;
        if (w->wire == KS_WIRE_MESSAGES && (g->user_stops = json_array()))
            for (int i = 0; i < rq.n_stops; i++) json_array_append_new(g->user_stops, json_string(rq.stops[i]));
    }
    if (!g) {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        goto fail;
    }
    g->n_prompts = pl.n_prompts;
    if (pl.templated) {
        /* The gen keeps what parsing needs after the plan is gone. */
        g->parse = pl.tp.parse;
        pl.tp.parse = NULL;
        g->preserved = pl.tp.preserved;
        g->n_preserved = pl.tp.n_preserved;
        pl.tp.preserved = NULL;
        pl.tp.n_preserved = 0;
        g->continuation = pl.tp.continuation;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    g->http11 = cn->http11;
    g->conn = c;
    cn->g = g; /* the HTTP reference, dropped in ks__gen_request_done */
    /* Generation time must not count as idleness (the connection thread
     * blocks while it runs); the idle timeout comes back when the reply is out. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (submit(s, g, &rq, &pl, &e, &retry)) {
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
        const char *const retry_after[] = {"Retry-After", "1", NULL};
        ret = ks__respond_error(s, c, cn, &e, retry ? retry_after : NULL);
        goto out;
    }
    KS_DEBUG(MOD, "%s: queued %d choice(s), %d prompt tokens, max_tokens %d%s%s%s, grammar %s%s "
                  "(%d trigger patterns, %d trigger tokens, %d prefill tokens); prompt %.1f ms, grammar %.1f ms, "
                  "breakpoints %.1f ms, submit %.1f ms",
             g->id, g->n_ch, pl.prompts[0].tokens.n, pl.max_tokens, rq.stream ? ", stream" : "",
             pl.templated ? ", format " : "", pl.templated ? pl.tp.format : "",
             pl.tp.grammar || pl.grammar ? "yes" : "no", pl.tp.grammar_lazy ? " lazy" : "", pl.tp.n_trigger_patterns,
             pl.tp.n_trigger_tokens, pl.tp.n_grammar_prefill, t_prompt - t0, t_grammar - t_prompt, t_pins - t_grammar,
             ks_now_ms() - t_pins);
    ret = rq.stream ? respond_stream(s, c, cn, g) : respond_whole(s, c, cn, g);
    goto out;
fail:
    ret = ks__respond_error(s, c, cn, &e, NULL);
out:
    ks_api_request_free(&rq);
    ks__plan_free(&pl);
    if (w) {
        json_decref(w->wreq);
        json_decref(w->conv);
        json_decref(w->tool_map);
    }
    return ret;
}

enum MHD_Result ks__gen_handle(ks_server *s, struct MHD_Connection *c, conn *cn, ks_api_kind kind) {
    ks_api_request rq;
    ks_api_error e;
    if (ks_api_parse(kind, cn->body.s, cn->body.len, &rq, &e)) return ks__respond_error(s, c, cn, &e, NULL);
    ks__log_notes(s, cn, &rq.notes);
    return run(s, c, cn, &rq, NULL);
}

enum MHD_Result ks__gen_handle_responses(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_api_error e;
    json_t *root = NULL, *hist = NULL, *conv = NULL;
    ks_api_resp_req rr = {0};
    ks_api_request rq;
    const char *prev;
    if (ks__api_load_object(cn->body.s, cn->body.len, &root, &e) || ks_api_responses_prev_id(root, &prev, &e))
        goto fail;
    if (prev && !(hist = ks_convstore_get(s->convs, prev))) {
        ks_api_error_set(&e, 400, T_INVALID, "previous_response_not_found", "previous_response_id",
                         "Previous response with id '%.80s' not found. This server keeps responses in memory for "
                         "%d s (and forgets them on restart); send the whole conversation as input instead.",
                         prev, ks_convstore_ttl(s->convs));
        goto fail;
    }
    if (ks_api_responses_to_chat(root, hist, &rr, &e)) goto fail;
    conv = hist ? json_copy(hist) : json_array();
    if (!conv || json_array_extend(conv, rr.input)) {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        goto fail;
    }
    if (ks_api_parse_root(KS_API_CHAT, json_incref(rr.chat), &rq, &e)) goto fail;
    ks__log_notes(s, cn, &rr.notes);
    wire_req w = {KS_WIRE_RESPONSES, root, conv, rr.store, -1, json_incref(rr.tool_map)};
    json_decref(hist);
    ks_api_resp_req_free(&rr);
    return run(s, c, cn, &rq, &w);
fail:
    json_decref(root);
    json_decref(hist);
    json_decref(conv);
    ks_api_resp_req_free(&rr);
    return ks__respond_error(s, c, cn, &e, NULL);
}

enum MHD_Result ks__gen_handle_messages(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_api_error e;
    json_t *root = NULL;
    ks_api_msg_req mr = {0};
    ks_api_request rq;
    if (ks__api_load_object(cn->body.s, cn->body.len, &root, &e) || ks_api_messages_to_chat(root, false, &mr, &e) ||
        ks_api_parse_root(KS_API_CHAT, json_incref(mr.chat), &rq, &e)) {
        json_decref(root);
        ks_api_msg_req_free(&mr);
        return ks__respond_error(s, c, cn, &e, NULL);
    }
    json_decref(root);
    ks__log_notes(s, cn, &mr.notes);
    wire_req w = {KS_WIRE_MESSAGES, NULL, NULL, false, mr.mid_system, NULL};
    ks_api_msg_req_free(&mr);
    return run(s, c, cn, &rq, &w);
}

enum MHD_Result ks__gen_count_tokens(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_api_error e;
    json_t *root = NULL;
    ks_api_msg_req mr = {0};
    ks_api_request rq = {0};
    ks_plan pl = {0};
    enum MHD_Result ret;
    if (ks__api_load_object(cn->body.s, cn->body.len, &root, &e) || ks_api_messages_to_chat(root, true, &mr, &e) ||
        ks_api_parse_root(KS_API_CHAT, json_incref(mr.chat), &rq, &e) || ks__plan_prompts(s, &rq, &pl, false, &e))
        ret = ks__respond_error(s, c, cn, &e, NULL);
    else {
        ks__log_notes(s, cn, &mr.notes);
        ret = ks__respond_json(s, c, cn, 200, json_pack("{s:i}", "input_tokens", pl.prompts[0].tokens.n), NULL);
    }
    json_decref(root);
    ks_api_msg_req_free(&mr);
    ks_api_request_free(&rq);
    ks__plan_free(&pl);
    return ret;
}

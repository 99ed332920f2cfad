/*
 * gen.c — the live generation: a planned request's choices submitted to the
 * scheduler, the callbacks that collect their text on the inference thread,
 * the waits that notice a client that left, and the connection thread's
 * side of the reply (the stream's content reader, the whole reply's wait),
 * which hands the text to reply.c. It never asks which format it serves
 * (fmt.h).
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/textstream.h"
#include "server/lptext.h"
#include "prompt/prompt_tmpl.h"
#include "server/api_int.h"
#include "server/gen.h"
#include "server/output.h"
#include "server/peer.h"
#include "server/reply.h"
#include "server/tenantstats.h"

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
    double t_first_ms;             /* when its first token came (t_max_predict_ms), 0: not yet */
    bool timed_out;                /* t_max_predict_ms ended it, at a newline */

    /* under g->mu */
    ks_buf pending;                /* safe text not yet taken by the connection thread (a whole
                                      reply never takes it: it is all the text) */
    json_t *lp_pending;            /* stream: logprob entries not yet taken (array), NULL: none asked */
    ks_lptext lpt;                 /* whole reply: the logprobs as text (lptext.h), when lp_text */
    bool lp_text;
    bool done;
    bool stopped;                  /* a stop string ended it */
    int stop_index;                /* which one (in the request's stops, then the template's) */
    bool failed;                   /* the text could not be kept (ENOMEM) */
    ks_req_result res;             /* valid once done */
} choice;

struct ks_gen {
    /* set before submit, read-only afterwards */
    ks_server *srv;
    ks_smodel *m;                  /* the model, held (ks__models_ref) until the generation is freed */
    bool stream;
    bool lp_ids;                   /* logprob entries carry the token id (llama-server's shape) */
    int t_max_predict_ms;          /* llama-server's; 0: none */
    char id[64];
    int fd;                        /* the client's socket, polled for hang-up */
    bool http11;                   /* the client may be sent an interim 1xx response */
    struct MHD_Connection *conn;
    _Atomic bool gone;             /* client went away: canceled */
    choice *ch;
    int n_ch;
    int n_prompts;                 /* distinct prompts (usage counts each once) */
    char *parse;                   /* chat: parse options for the output (owned), NULL: plain text */
    int32_t *preserved;            /* tokens the output shows as text (sorted) */
    int n_preserved;
    int top_logprobs;
    bool tools_ignored;            /* the plan's: set on each choice's result */
    uint64_t key_tenant;           /* the request's key's tenant (tenantstats.h) */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    int refs;
    int n_done;

    /* connection thread only */
    ks_reply *rp;                  /* the reply, in the request's format */
    double probe_ms;               /* when the last probe went out (server.h note 3), 0: none */
    /* connection thread only (stream) */
    int phase;
    ks_buf out;
    size_t out_off;
    ks_buf take;
};

typedef ks_gen gen;

static void choice_free(choice *c) {
    ks_textstream_free(c->ts);
    ks_buf_free(&c->scratch);
    ks_buf_free(&c->pending);
    json_decref(c->lp_pending);
    ks_lptext_free(&c->lpt);
}

static void gen_destroy(gen *g) {
    for (int i = 0; i < g->n_ch; i++) choice_free(&g->ch[i]);
    free(g->ch);
    ks__reply_free(g->rp);
    free(g->parse);
    free(g->preserved);
    ks_buf_free(&g->out);
    ks_buf_free(&g->take);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void peek_result(void *ud, int index, ks_req_result *r);

ks_gen *ks__gen_create(ks_server *s, ks_smodel *m, const ks_fmt *fmt, void *st, const ks_api_request *rq, ks_plan *pl) {
    int n_ch = pl->n_prompts * rq->n;
    gen *g = calloc(1, sizeof *g);
    if (!g) goto fail_st;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc) {
        free(g);
        goto fail_st;
    }
    pthread_mutex_init(&g->mu, NULL);
    g->srv = s;
    g->m = m;
    ks__models_ref(s, m);
    g->fd = -1;
    g->refs = 1;
    g->stream = rq->stream;
    g->top_logprobs = rq->top_logprobs;
    g->lp_ids = fmt->logprobs_bare;
    g->t_max_predict_ms = rq->t_max_predict_ms;
    g->n_prompts = pl->n_prompts;
    g->tools_ignored = pl->tools_ignored;
    ks_api_make_id(g->id, sizeof g->id, fmt->id_prefix);
    if (pl->templated) {
        /* The gen keeps what parsing needs after the plan is gone. */
        g->parse = pl->tp.parse;
        pl->tp.parse = NULL;
        g->preserved = pl->tp.preserved;
        g->n_preserved = pl->tp.n_preserved;
        pl->tp.preserved = NULL;
        pl->tp.n_preserved = 0;
    }
    ks_fmt_gen fg = {.id = g->id, .created = ks_wall_s(), .model = m->name, .n_choices = n_ch,
                     .peek = peek_result, .peek_ud = g};
    g->rp = ks__reply_create(fmt, st, &fg, g->parse, pl->templated && pl->tp.continuation);
    st = NULL; /* the reply's now, also on failure */
    if (!g->rp) goto fail;
    g->ch = calloc((size_t)n_ch, sizeof *g->ch);
    if (!g->ch) goto fail;
    g->n_ch = n_ch;
    for (int i = 0; i < n_ch; i++) {
        choice *c = &g->ch[i];
        c->g = g;
        c->index = i;
        if (!(c->ts = ks_textstream_create(pl->stops, pl->n_stops))) goto fail;
        ks_textstream_set_indent(c->ts, rq->n_indent);
        c->lp_text = rq->logprobs && !rq->stream;
        c->lpt.legacy = fmt->logprobs_legacy;
        c->lpt.bare = fmt->logprobs_bare;
        if (rq->logprobs && rq->stream && !(c->lp_pending = json_array())) goto fail;
    }
    atomic_fetch_add(&s->n_active, 1);
    return g;
fail:
    gen_destroy(g);
fail_st:
    if (st && fmt->free_state) fmt->free_state(st);
    return NULL;
}

const char *ks__gen_id(const ks_gen *g) { return g->id; }

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
    ks_smodel *m = g->m;
    gen_destroy(g);
    ks__models_release(s, m);
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
        int n = ks_engine_token_text(g->m->engine, tok, special, sizeof special);
        if (n > 0 && n <= (int)sizeof special) {
            piece = special;
            len = n;
        }
    }
    ks_buf_reset(&c->scratch);
    int rc = ks_textstream_feed(c->ts, piece, len > 0 ? (size_t)len : 0, &c->scratch);
    bool fail = rc < 0;
    /* llama-server's t_max_predict_ms: past it, the reply ends after a token
     * whose text holds a newline (the time counts from the first token). */
    double now = g->t_max_predict_ms > 0 ? ks_now_ms() : 0.0;
    if (g->t_max_predict_ms > 0 && c->t_first_ms == 0.0) c->t_first_ms = now;
    if (rc == 0 && g->t_max_predict_ms > 0 && now - c->t_first_ms > g->t_max_predict_ms && c->scratch.len &&
        memchr(c->scratch.s, '\n', c->scratch.len)) {
        c->timed_out = true;
        rc = 1;
    }
    if (c->scratch.len || fail) {
        pthread_mutex_lock(&g->mu);
        if (!fail && ks_buf_append(&c->pending, c->scratch.s, c->scratch.len)) fail = true;
        if (fail) c->failed = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return fail || rc == 1;
}

/* Inference thread: the sampled token's probabilities, before on_token. */
static json_t *lp_entry(gen *g, int32_t tok, float lp) {
    char buf[256];
    int n = ks_engine_piece(g->m->engine, tok, buf, sizeof buf);
    if (n > (int)sizeof buf) n = (int)sizeof buf;
    json_t *e = ks__out_lp_entry(buf, n, lp);
    if (e && g->lp_ids) json_object_set_new(e, "id", json_integer(tok));
    return e;
}

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
    else if (c->lp_text) ks_lptext_add(&c->lpt, e), json_decref(e);
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

    const char *finish = c->timed_out ? "length (t_max_predict_ms)"
                         : stopped && ks_textstream_stop_index(c->ts) == KS_TEXTSTREAM_STOP_INDENT ? "length (n_indent)"
                         : r->finish == KS_FINISH_STOP || r->finish == KS_FINISH_LENGTH
                             ? ks_api_finish_reason(r, stopped)
                             : ks_finish_name(r->finish);
    double tps = r->gen_ms > 0 ? 1e3 * r->n_generated / r->gen_ms : 0.0;
    char which[16] = "";
    if (g->n_ch > 1) snprintf(which, sizeof which, "[%d]", c->index);
    /* Floored to a tenth: 99.96% is not "100%" while a token was prefilled. */
    double pct = r->n_prompt ? floor(1000.0 * r->n_cached / r->n_prompt) / 10.0 : 0.0;
    /* Speculation: the drafted tokens kept of those verified. */
    char spec[64] = "";
    if (r->n_drafted > 0) snprintf(spec, sizeof spec, ", drafts %d/%d", r->n_draft_accepted, r->n_drafted);
    KS_INFO(MOD, "%s%s slot %d: prompt %d tok, cached %d (%.1f%%), ttft %.1f ms, %d tok at %.1f tok/s%s, "
                 "finish %s, cache %.*s%s%.*s%s%s",
            g->id, which, r->slot, r->n_prompt, r->n_cached, pct, r->ttft_ms, r->n_generated, tps, spec,
            finish, (int)sizeof r->cache_mode, r->cache_mode, r->cache_reason[0] ? " / " : "",
            (int)sizeof r->cache_reason, r->cache_reason, g->srv->multi ? ", model " : "",
            g->srv->multi ? g->m->name : "");
    if (r->finish == KS_FINISH_ERROR)
        KS_WARN(MOD, "%s%s failed: %s", g->id, which, ks_strerror(r->error));
    ks_tenantstats_add(g->srv->tstats, g->key_tenant, r->n_prompt, r->n_cached, r->n_generated);

    pthread_mutex_lock(&g->mu);
    if (frc < 0 || ks_buf_append(&c->pending, c->scratch.s ? c->scratch.s : "", c->scratch.len))
        c->failed = true;
    KS_ASSERT(!c->done && g->n_done < g->n_ch); /* H2: one on_done per choice */
    c->res = *r;
    c->res.logits = NULL; /* borrowed for this call only */
    c->res.tools_ignored = g->tools_ignored;
    c->stopped = stopped || c->timed_out;
    c->stop_index = c->timed_out ? KS_REPLY_STOP_TIME : ks_textstream_stop_index(c->ts);
    c->done = true;
    g->n_done++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    gen_release(g); /* the scheduler's reference */
}

/* ----------------------------------------------------------- scheduler calls (H1) */
static int sched_submit(ks_server *s, ks_smodel *m, const ks_req_params *rp, uint64_t *id) {
    int rc;
    pthread_rwlock_rdlock(&m->sched_lock);
    if (m->detached || atomic_load(&s->draining)) rc = KS_ESHUTDOWN;
    else rc = ks_sched_submit(m->sched, rp, id);
    pthread_rwlock_unlock(&m->sched_lock);
    return rc;
}

static void sched_cancel(ks_smodel *m, uint64_t id) {
    pthread_rwlock_rdlock(&m->sched_lock);
    if (!m->detached) ks_sched_cancel(m->sched, id);
    pthread_rwlock_unlock(&m->sched_lock);
}

static void cancel_choices(gen *g) {
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].submitted) sched_cancel(g->m, g->ch[i].sched_id);
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

/* Whether a probe is due after end of file: the first at once, then one a
 * PROBE_MS. A whole reply can be probed only on HTTP/1.1 (1xx responses). */
static bool probe_due(gen *g) {
    if (!g->stream && !g->http11) return false;
    double now = ks_now_ms();
    if (g->probe_ms > 0 && now - g->probe_ms < PROBE_MS) return false;
    g->probe_ms = now;
    return true;
}


/* Something for the stream (g->mu held): a choice with text or logprobs
 * pending, or done and not yet finished. */
static bool stream_ready(const gen *g) {
    for (int i = 0; i < g->n_ch; i++) {
        const choice *c = &g->ch[i];
        if (c->pending.len || (c->lp_pending && json_array_size(c->lp_pending)) ||
            (c->done && !ks__reply_finished(g->rp, i)))
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
        ks_deadline_ms(&ts, WAIT_POLL_MS);
        if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) != ETIMEDOUT) continue;
        if (atomic_load(&g->gone)) continue; /* canceled: on_done is on its way (H2) */
        pthread_mutex_unlock(&g->mu);
        int peer = ks__peer_state(g->fd);
        if (peer == KS_PEER_GONE) gen_abandon(g);
        bool probe = peer == KS_PEER_EOF && probe_due(g);
        pthread_mutex_lock(&g->mu);
        if (peer == KS_PEER_GONE && want_text) return W_GONE;
        if (probe) return W_PROBE;
    }
    return W_READY;
}

/* The statistics of the whole request: sums over the choices; the prompt of
 * n choices that share it counts once. */
static ks_req_result total_result(const gen *g) {
    ks_req_result t = g->ch[0].res;
    int per = g->n_ch / (g->n_prompts > 0 ? g->n_prompts : 1);
    if (per < 1) per = 1;
    t.n_prompt = t.n_cached = t.n_generated = t.n_drafted = t.n_draft_accepted = 0;
    t.prompt_ms = t.gen_ms = 0;
    for (int i = 0; i < g->n_ch; i++) {
        const ks_req_result *r = &g->ch[i].res;
        if (i % per == 0) {
            t.n_prompt += r->n_prompt;
            t.n_cached += r->n_cached;
            t.prompt_ms += r->prompt_ms;
        }
        t.n_generated += r->n_generated;
        t.n_drafted += r->n_drafted;
        t.n_draft_accepted += r->n_draft_accepted;
        if (r->gen_ms > t.gen_ms) t.gen_ms = r->gen_ms;
    }
    return t;
}

/* What a choice's result says so far: the whole result once done, else
 * the prompt and cached counts of the slot running it (the prefill is over
 * once a token is out). */
static void peek_result(void *ud, int index, ks_req_result *r) {
    gen *g = ud;
    choice *c = &g->ch[index];
    memset(r, 0, sizeof *r);
    pthread_mutex_lock(&g->mu);
    bool done = c->done;
    if (done) *r = c->res;
    pthread_mutex_unlock(&g->mu);
    if (done) return;
    ks_slot_info *info = malloc(sizeof *info * KS_MAX_SLOTS);
    if (!info) return;
    int n = ks__server_slots(g->m, info);
    for (int i = 0; i < n; i++)
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

/* ------------------------------------------------------------- the reply */
/* How choice c ended, for the reply (c is done). */
static ks_reply_end choice_end(const choice *c) {
    return (ks_reply_end){.r = &c->res, .stopped = c->stopped, .stop_index = c->stop_index, .failed = c->failed};
}

/* The next events of a stream into g->out: the first events, then text as
 * it comes, then each choice's end. Blocks until there is something. */
static int stream_next(gen *g) {
    int rc = 0;
    if (g->phase == PH_START) {
        g->phase = PH_BODY;
        return ks__reply_start(g->rp, &g->out);
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
        if (ks__reply_finished(g->rp, i)) continue;
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
        /* c->res and the stop fields are written before done, under mu: read
         * them only once done was seen under it (on_done writes them until then). */
        ks_reply_end end = {0};
        if (done) end = choice_end(c);
        if (!rc && (g->take.len || lp || done))
            rc = ks__reply_choice(g->rp, i, g->take.s, g->take.len, lp, done ? &end : NULL, &g->out);
        else json_decref(lp);
        if (!ks__reply_finished(g->rp, i)) all_finished = false;
    }
    if (!rc && all_finished) {
        ks_req_result t = total_result(g);
        rc = ks__reply_done(g->rp, &t, &g->out);
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

/* ------------------------------------------------------------- submitting */
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
        rp.sample.seed = rq->seed_set ? base_seed + (uint64_t)j : ks_random_u64();
        rp.ext = &x;
        rp.cache_prompt = rq->cache_prompt;
        rp.draft_max = rq->draft_max;
        rp.tenant = rq->tenant;
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
        rp.media = pl->tp.media; /* a chat prompt's images and audio (one prompt) */
        rp.on_token = on_token;
        rp.on_probs = rq->logprobs ? on_probs : NULL;
        rp.on_done = on_done;
        rp.ud = c;
        gen_ref(g); /* the scheduler's reference, dropped in on_done */
        rc = sched_submit(s, g->m, &rp, &c->sched_id);
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
    switch (rc) {
    case KS_EFULL:
        ks_api_error_set(e, 503, "server_error", "queue_full", NULL,
                         "The server is busy: the request queue is full. Retry later.");
        *retry = true;
        break;
    case KS_ESHUTDOWN:
        ks_api_error_set(e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        break;
    case KS_ECTX: /* the scheduler's own check, after the plan's */
        ks__plan_ctx_error(s, g->m, rq, e, "resulted in %d tokens and max_tokens is %d", pl->prompts[0].tokens.n,
                           pl->max_tokens);
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

int ks__gen_submit(ks_gen *g, struct MHD_Connection *c, conn *cn, const ks_api_request *rq, const ks_plan *pl,
                   ks_api_error *e, bool *retry) {
    ks_server *s = g->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    g->http11 = cn->http11;
    g->key_tenant = cn->tenant;
    g->conn = c;
    cn->g = g; /* the HTTP reference, dropped in ks__gen_request_done */
    /* Generation time must not count as idleness (the connection thread
     * blocks while it runs); the idle timeout comes back when the reply is out. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    int rc = submit(s, g, rq, pl, e, retry);
    if (rc) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
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
        ks__peer_interim(g->fd);
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->timeout_s);
    if (atomic_load(&g->gone)) return MHD_NO; /* nobody to answer */
    ks_api_error e;
    const char **texts = calloc((size_t)g->n_ch, sizeof *texts);
    json_t **lps = calloc((size_t)g->n_ch, sizeof *lps);
    ks_reply_end *ends = calloc((size_t)g->n_ch, sizeof *ends);
    json_t *o = NULL;
    if (texts && lps && ends) {
        /* Every choice is done: nothing writes to them any more. */
        for (int i = 0; i < g->n_ch; i++) {
            texts[i] = g->ch[i].pending.s ? g->ch[i].pending.s : "";
            lps[i] = g->ch[i].lp_text ? ks_lptext_placeholder(i) : json_incref(g->ch[i].lp_pending);
            ends[i] = choice_end(&g->ch[i]);
        }
        ks_req_result t = total_result(g);
        o = ks__reply_whole(g->rp, texts, lps, ends, &t, &e);
    } else {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "The response could not be encoded.");
    }
    for (int i = 0; lps && i < g->n_ch; i++) json_decref(lps[i]);
    free(texts);
    free(lps);
    free(ends);
    ks_lptext *lpt[KS_API_MAX_CHOICES];
    for (int i = 0; i < g->n_ch && i < KS_API_MAX_CHOICES; i++) lpt[i] = &g->ch[i].lpt;
    if (o && g->ch[0].lp_text) return ks__respond_spliced(s, c, cn, o, lpt, g->n_ch);
    return o ? ks__respond_json(s, c, cn, 200, o, NULL) : ks__respond_error(s, c, cn, &e, NULL);
}

enum MHD_Result ks__gen_reply(ks_gen *g, struct MHD_Connection *c, conn *cn) {
    return g->stream ? respond_stream(g->srv, c, cn, g) : respond_whole(g->srv, c, cn, g);
}

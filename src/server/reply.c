/*
 * reply.c — see reply.h: whole and streamed replies through the format's table.
 */
#include <stdlib.h>
#include <string.h>

#include "base/textstream.h"
#include "server/api_int.h"
#include "server/output.h"
#include "server/reply.h"

typedef struct rchoice {
    ks_out out;
    json_t *lp_held;       /* entries waiting for a delta to ride on, NULL: none */
    bool finished;         /* its end or error is out */
} rchoice;

struct ks_reply {
    const ks_fmt *fmt;
    void *st;
    ks_fmt_gen g;
    bool continuation;
    bool failed;           /* a choice ended with an error event */
    rchoice *ch;
};

ks_reply *ks__reply_create(const ks_fmt *fmt, void *st, const ks_fmt_gen *g, const char *parse, bool continuation) {
    ks_reply *rp = calloc(1, sizeof *rp);
    if (!rp || !(rp->ch = calloc((size_t)(g->n_choices > 0 ? g->n_choices : 1), sizeof *rp->ch))) {
        free(rp);
        if (fmt->free_state) fmt->free_state(st);
        return NULL;
    }
    rp->fmt = fmt;
    rp->st = st;
    rp->g = *g;
    rp->continuation = continuation;
    for (int i = 0; i < g->n_choices; i++) {
        if (ks__out_init(&rp->ch[i].out, parse, g->id)) {
            ks__reply_free(rp);
            return NULL;
        }
    }
    return rp;
}

void ks__reply_free(ks_reply *rp) {
    if (!rp) return;
    for (int i = 0; rp->ch && i < rp->g.n_choices; i++) {
        ks__out_free(&rp->ch[i].out);
        json_decref(rp->ch[i].lp_held);
    }
    free(rp->ch);
    if (rp->fmt->free_state) rp->fmt->free_state(rp->st);
    free(rp);
}

/* The error of a choice that did not complete (canceled, failed): fills e
 * and returns true; else *finish ("stop", "length"). */
static bool choice_error(const ks_reply_end *end, const char **finish, ks_api_error *e) {
    /* n_indent or t_max_predict_ms ended it: llama-server counts those as limits */
    *finish = end->stopped && (end->stop_index == KS_TEXTSTREAM_STOP_INDENT || end->stop_index == KS_REPLY_STOP_TIME)
                  ? "length"
                  : ks_api_finish_reason(end->r, end->stopped);
    if (!end->failed && *finish) return false;
    if (end->r->finish == KS_FINISH_CANCEL)
        ks_api_error_set(e, 503, "server_error", "shutting_down", NULL,
                         "The generation was canceled: the server is shutting down.");
    else if (end->r->error == KS_EINVAL)
        ks_api_error_set(e, 400, T_INVALID, "invalid_grammar", NULL, "The grammar could not be used for sampling.");
    else
        ks_api_error_set(e, 500, "server_error", "generation_failed", NULL, "Generation failed: %s.",
                         end->failed ? ks_strerror(KS_ENOMEM) : ks_strerror(end->r->error));
    return true;
}

static ks_fmt_choice fmt_choice(const rchoice *c, int i, const char *finish, const char *text, const json_t *lp,
                                const ks_reply_end *end) {
    ks_fmt_choice fc = {.index = i, .finish = ks__out_finish(&c->out, finish), .msg = c->out.msg,
                        .text = text ? text : "", .logprobs = lp, .stop_index = -1, .r = end->r};
    if (end->stopped) fc.stop_index = end->stop_index;
    return fc;
}

int ks__reply_start(ks_reply *rp, ks_buf *out) {
    int rc = rp->fmt->stream_start(rp->st, &rp->g, out);
    /* The continued message's own text is not sent again. */
    for (int i = 0; i < rp->g.n_choices && !rc && rp->continuation; i++) ks__out_continue(&rp->ch[i].out);
    return rc;
}

bool ks__reply_finished(const ks_reply *rp, int i) { return rp->ch[i].finished; }

int ks__reply_choice(ks_reply *rp, int i, const char *text, size_t len, json_t *lp, const ks_reply_end *end,
                     ks_buf *out) {
    rchoice *c = &rp->ch[i];
    int rc = 0;
    KS_ASSERT(i >= 0 && i < rp->g.n_choices && !c->finished); /* fmt.h F1: nothing after a choice's end */
    if (lp && !c->lp_held) {
        c->lp_held = lp;
    } else if (lp) {
        rc = json_array_extend(c->lp_held, lp) ? KS_ENOMEM : 0;
        json_decref(lp);
    }
    json_t *deltas = NULL;
    if (!rc) rc = ks__out_feed(&c->out, text, len, end != NULL, &deltas);
    size_t k;
    json_t *d;
    json_array_foreach(deltas, k, d) {
        if (rc) break;
        /* The logprobs so far ride on the first delta. */
        json_t *l = c->lp_held;
        c->lp_held = NULL;
        rc = rp->fmt->stream_delta(rp->st, &rp->g, i, d, l, out);
        json_decref(l);
    }
    json_decref(deltas);
    if (rc || !end) return rc;
    if (c->lp_held && json_array_size(c->lp_held)) {
        /* Entries that never got a delta: on an empty one before the end. */
        rc = rp->fmt->stream_delta(rp->st, &rp->g, i, NULL, c->lp_held, out);
        if (rc) return rc;
    }
    json_decref(c->lp_held);
    c->lp_held = NULL;
    c->finished = true;
    const char *finish;
    ks_api_error e;
    if (choice_error(end, &finish, &e)) {
        rp->failed = true;
        return rp->fmt->stream_error(rp->st, &rp->g, i, &e, out);
    }
    ks_fmt_choice fc = fmt_choice(c, i, finish, c->out.text.s, NULL, end);
    return rp->fmt->stream_end(rp->st, &rp->g, &fc, out);
}

int ks__reply_done(ks_reply *rp, const ks_req_result *total, ks_buf *out) {
    for (int i = 0; i < rp->g.n_choices; i++) KS_ASSERT(rp->ch[i].finished); /* F1: done after every end */
    if (rp->failed) return 0;
    return rp->fmt->stream_done(rp->st, &rp->g, total, out);
}

json_t *ks__reply_whole(ks_reply *rp, const char *const *texts, json_t *const *lps, const ks_reply_end *ends,
                        const ks_req_result *total, ks_api_error *e) {
    int n = rp->g.n_choices;
    ks_fmt_choice *fc = calloc((size_t)n, sizeof *fc);
    if (!fc) goto oom;
    for (int i = 0; i < n; i++) {
        const char *finish;
        if (choice_error(&ends[i], &finish, e)) {
            free(fc);
            return NULL;
        }
        rchoice *c = &rp->ch[i];
        ks__out_whole(&c->out, texts[i], rp->continuation);
        fc[i] = fmt_choice(c, i, finish, texts[i], lps[i], &ends[i]);
    }
    json_t *o = rp->fmt->whole(rp->st, &rp->g, fc, n, total);
    free(fc);
    if (o) return o;
oom:
    ks_api_error_set(e, 500, "server_error", "out_of_memory", NULL, "The response could not be encoded.");
    return NULL;
}

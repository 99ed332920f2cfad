/*
 * fmt_openai.c — the OpenAI formats' tables (fmt.h): chat completions and
 * completions, their wire shapes in api.c (chat.completion[.chunk],
 * text_completion), SSE with data-only events ending in [DONE].
 */
#include <stdlib.h>

#include "server/api_int.h"
#include "server/fmt.h"

/* The state of one request. */
typedef struct oai {
    ks_api_kind kind;
    bool include_usage;    /* stream_options.include_usage */
} oai;

static int parse_kind(const ks_fmt_env *env, ks_api_kind kind, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    int rc = ks_api_parse_root_media(kind, root, env->media, rq, e);
    if (rc) return rc;
    oai *o = calloc(1, sizeof *o);
    if (!o) {
        ks_api_request_free(rq);
        return ks__api_oom(e);
    }
    o->kind = kind;
    o->include_usage = rq->include_usage;
    *st = o;
    return 0;
}

static int parse_chat(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    return parse_kind(env, KS_API_CHAT, root, rq, st, e);
}

static int parse_completions(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    return parse_kind(env, KS_API_COMPLETION, root, rq, st, e);
}

static ks_api_gen api_gen(const oai *o, const ks_fmt_gen *g, int index) {
    return (ks_api_gen){.kind = o->kind, .index = index, .id = g->id, .created = g->created, .model = g->model};
}

/* Appends one SSE event of obj (stolen) to out. */
static int sse(ks_buf *out, json_t *obj) {
    int rc = obj ? ks_api_sse(out, obj) : KS_ENOMEM;
    json_decref(obj);
    return rc;
}

static json_t *whole(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, int n, const ks_req_result *total) {
    const oai *o = st;
    ks_api_gen *ags = calloc((size_t)n, sizeof *ags);
    json_t **lps = calloc((size_t)n, sizeof *lps);
    json_t *r = NULL;
    if (!ags || !lps) goto out;
    for (int i = 0; i < n; i++) {
        ags[i] = api_gen(o, g, ch[i].index);
        ags[i].text = ch[i].text;
        ags[i].msg = ch[i].msg;
        ags[i].finish = ch[i].finish;
        if (ch[i].logprobs && !(ags[i].logprobs = lps[i] = ks_api_logprobs_json(o->kind, ch[i].logprobs))) goto out;
    }
    r = ks_api_response_multi_json(ags, n, total);
out:
    for (int i = 0; lps && i < n; i++) json_decref(lps[i]);
    free(ags);
    free(lps);
    return r;
}

/* Chat: each choice's first chunk says who speaks. */
static int stream_start(void *st, const ks_fmt_gen *g, ks_buf *out) {
    const oai *o = st;
    int rc = 0;
    for (int i = 0; i < g->n_choices && !rc && o->kind == KS_API_CHAT; i++) {
        ks_api_gen ag = api_gen(o, g, i);
        rc = sse(out, ks_api_chunk_json(&ag, KS_API_CHUNK_ROLE));
    }
    return rc;
}

static int stream_delta(void *st, const ks_fmt_gen *g, int index, const json_t *delta, const json_t *logprobs,
                        ks_buf *out) {
    const oai *o = st;
    ks_api_gen ag = api_gen(o, g, index);
    json_t *l = logprobs ? ks_api_logprobs_json(o->kind, logprobs) : NULL;
    if (logprobs && !l) return KS_ENOMEM;
    /* No delta: an empty one carries the logprobs. */
    json_t *d = delta ? json_incref((json_t *)delta) : json_object(); /* read, never changed */
    return sse(out, ks_api_chunk_delta_json(&ag, d, l, NULL));
}

static int stream_end(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, ks_buf *out) {
    const oai *o = st;
    ks_api_gen ag = api_gen(o, g, ch->index);
    ag.finish = ch->finish;
    /* With several choices, the statistics go on the usage chunk. */
    ag.r = g->n_choices == 1 ? ch->r : NULL;
    return sse(out, ks_api_chunk_json(&ag, KS_API_CHUNK_FINISH));
}

static int stream_error(void *st, const ks_fmt_gen *g, int index, const ks_api_error *e, ks_buf *out) {
    (void)st, (void)g, (void)index;
    return sse(out, ks_api_error_json(e));
}

/* usage (when asked), then [DONE]. */
static int stream_done(void *st, const ks_fmt_gen *g, const ks_req_result *total, ks_buf *out) {
    const oai *o = st;
    int rc = 0;
    if (o->include_usage) {
        ks_api_gen ag = api_gen(o, g, 0);
        ag.r = total;
        rc = sse(out, ks_api_chunk_json(&ag, KS_API_CHUNK_USAGE));
    }
    return rc ? rc : ks_api_sse_done(out);
}

const ks_fmt ks__fmt_chat = {
    .name = "chat",
    .prescan = KS_PRESCAN_CHAT,
    .id_prefix = "chatcmpl-",
    .parse = parse_chat,
    .free_state = free,
    .error_json = ks_api_error_json,
    .whole = whole,
    .stream_start = stream_start,
    .stream_delta = stream_delta,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .stream_done = stream_done,
};

const ks_fmt ks__fmt_completions = {
    .name = "completions",
    .id_prefix = "cmpl-",
    .logprobs_legacy = true,
    .parse = parse_completions,
    .free_state = free,
    .error_json = ks_api_error_json,
    .whole = whole,
    .stream_start = stream_start,
    .stream_delta = stream_delta,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .stream_done = stream_done,
};

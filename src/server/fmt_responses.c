/*
 * fmt_responses.c — the OpenAI Responses format's table (fmt.h): the
 * request translated into a chat request (api_responses.c) after its
 * previous_response_id is looked up (convstore.c); the reply as a response
 * object of output items, or typed stream events (api_responses_out.c); a
 * finished reply's conversation kept under its id when store is on.
 */
#include <stdlib.h>
#include <string.h>

#include "server/api_int.h"
#include "server/convstore.h"
#include "server/fmt.h"

#define MOD "http"

/* The state of one request. */
typedef struct resp {
    json_t *req;                   /* the request, for the fields the response repeats */
    json_t *conv;                  /* history + input as chat messages, kept under the id with the
                                      output when store is on */
    bool store;
    struct ks_convstore *convs;    /* borrowed from the server */
    uint64_t tenant;               /* whose the conversation is */
    ks_api_rstream rs;             /* the stream's items and sequence numbers */
} resp;

static void free_state(void *st) {
    resp *r = st;
    if (!r) return;
    json_decref(r->req);
    json_decref(r->conv);
    ks_api_rstream_free(&r->rs);
    free(r);
}

static int parse(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    json_t *hist = NULL, *conv = NULL;
    ks_api_resp_req rr = {0};
    const char *prev;
    resp *r = NULL;
    if (ks_api_responses_prev_id(root, &prev, e)) goto fail;
    if (prev && !(hist = ks_convstore_get(env->convs, prev, env->tenant))) {
        ks_api_error_set(e, 400, T_INVALID, "previous_response_not_found", "previous_response_id",
                         "Previous response with id '%.80s' not found. This server keeps responses in memory for "
                         "%d s (and forgets them on restart); send the whole conversation as input instead.",
                         prev, ks_convstore_ttl(env->convs));
        goto fail;
    }
    if (ks_api_responses_to_chat(root, hist, &rr, e)) goto fail;
    conv = hist ? json_copy(hist) : json_array();
    if (!conv || json_array_extend(conv, rr.input) || !(r = calloc(1, sizeof *r))) {
        ks__api_oom(e);
        goto fail;
    }
    if (ks_api_parse_root_media(KS_API_CHAT, json_incref(rr.chat), env->media, rq, e)) goto fail;
    rq->notes = rr.notes; /* what the Responses request carried and the server went on without */
    r->req = root;
    r->conv = conv;
    r->store = rr.store;
    r->convs = env->convs;
    r->tenant = env->tenant;
    ks_api_rstream_init(&r->rs, rr.tool_map);
    json_decref(hist);
    ks_api_resp_req_free(&rr);
    if (!r->rs.items) {
        free_state(r);
        ks_api_request_free(rq);
        return ks__api_oom(e);
    }
    *st = r;
    return 0;
fail:
    free(r);
    json_decref(root);
    json_decref(hist);
    json_decref(conv);
    ks_api_resp_req_free(&rr);
    return e->status >= 500 ? KS_ENOMEM : KS_EINVAL;
}

/* The response object; output: its items (borrowed), NULL: the stream's. */
static json_t *object(const resp *r, const ks_fmt_gen *g, const char *status, const char *finish,
                      const json_t *output, const ks_req_result *res) {
    bool cut = finish && !strcmp(finish, "length");
    ks_api_resp_out o = {.id = g->id, .created = g->created, .model = g->model,
                         .status = cut ? "incomplete" : status, .incomplete = cut ? "max_output_tokens" : NULL,
                         .req = r->req, .output = output, .store = r->store, .r = res};
    return ks_api_responses_object(&o);
}

/* Keeps the conversation of a finished reply under its id: the history and
 * input, then the reply as an assistant message. */
static void keep_conversation(const resp *r, const ks_fmt_gen *g, const ks_fmt_choice *ch) {
    if (!r->store || !r->conv) return;
    json_t *conv = json_copy(r->conv);
    json_t *m = json_pack("{s:s}", "role", "assistant");
    if (!conv || !m) goto oom;
    const json_t *msg = ch->msg;
    const char *content = msg ? json_string_value(json_object_get(msg, "content")) : ch->text;
    json_object_set_new(m, "content", content && content[0] ? json_string(content) : json_null());
    const char *reasoning = msg ? json_string_value(json_object_get(msg, "reasoning_content")) : NULL;
    if (reasoning && reasoning[0]) json_object_set(m, "reasoning_content", json_object_get(msg, "reasoning_content"));
    json_t *calls = msg ? json_object_get(msg, "tool_calls") : NULL;
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (json_is_null(json_object_get(m, "content")) && !json_array_size(calls))
        json_object_set_new(m, "content", json_string(""));
    if (json_array_append_new(conv, m)) {
        m = NULL;
        goto oom;
    }
    ks_convstore_put(r->convs, g->id, r->tenant, conv);
    return;
oom:
    json_decref(m);
    json_decref(conv);
    KS_WARN(MOD, "%s: the conversation could not be kept (out of memory)", g->id);
}

/* One choice: the request has no n. */
static json_t *whole(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, int n, const ks_req_result *total) {
    resp *r = st;
    (void)n, (void)total;
    json_t *items = ks_api_responses_output(ch->msg, ch->text, r->rs.tool_map);
    json_t *o = items ? object(r, g, "completed", ch->finish, items, ch->r) : NULL;
    json_decref(items);
    if (o) keep_conversation(r, g, ch);
    return o;
}

static int stream_start(void *st, const ks_fmt_gen *g, ks_buf *out) {
    resp *r = st;
    json_t *o = object(r, g, "in_progress", NULL, NULL, NULL);
    int rc = o ? ks_api_rstream_start(&r->rs, o, out) : KS_ENOMEM;
    json_decref(o);
    return rc;
}

static int stream_delta(void *st, const ks_fmt_gen *g, int index, const json_t *delta, const json_t *logprobs,
                        ks_buf *out) {
    resp *r = st;
    (void)g, (void)index, (void)logprobs; /* the request has no logprobs */
    return delta ? ks_api_rstream_delta(&r->rs, delta, out) : 0;
}

static int stream_end(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, ks_buf *out) {
    resp *r = st;
    json_t *o = object(r, g, "completed", ch->finish, NULL, ch->r);
    int rc = o ? ks_api_rstream_end(&r->rs, o, out) : KS_ENOMEM;
    json_decref(o);
    if (!rc) keep_conversation(r, g, ch);
    return rc;
}

static int stream_error(void *st, const ks_fmt_gen *g, int index, const ks_api_error *e, ks_buf *out) {
    resp *r = st;
    (void)g, (void)index;
    return ks_api_rstream_error(&r->rs, e, out);
}

/* The stream ends with response.completed (stream_end). */
static int stream_done(void *st, const ks_fmt_gen *g, const ks_req_result *total, ks_buf *out) {
    (void)st, (void)g, (void)total, (void)out;
    return 0;
}

const ks_fmt ks__fmt_responses = {
    .name = "responses",
    .prescan = KS_PRESCAN_RESPONSES,
    .id_prefix = "resp_",
    .parse = parse,
    .free_state = free_state,
    .error_json = ks_api_error_json,
    .whole = whole,
    .stream_start = stream_start,
    .stream_delta = stream_delta,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .stream_done = stream_done,
};

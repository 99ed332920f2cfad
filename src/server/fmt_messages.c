/*
 * fmt_messages.c — the Anthropic Messages format's table (fmt.h): the
 * request translated into a chat request (api_messages.c); the reply as a
 * message object, or content-block stream events; errors in Anthropic's
 * shape; a system message the template refuses inside messages in
 * Anthropic's words.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_int.h"
#include "server/fmt.h"

/* The state of one request. */
typedef struct msgs {
    json_t *user_stops;    /* stop_sequences (stop_reason names the one met) */
    int mid_system;        /* the first system message inside messages, -1: none */
    ks_api_mstream ms;
    bool started;          /* message_start is out */
} msgs;

static void free_state(void *st) {
    msgs *m = st;
    if (!m) return;
    json_decref(m->user_stops);
    free(m);
}

static int parse(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    ks_api_msg_req mr = {0};
    int rc = ks_api_messages_to_chat(root, false, &mr, e);
    json_decref(root);
    if (!rc) rc = ks_api_parse_root_media(KS_API_CHAT, json_incref(mr.chat), env->media, rq, e);
    if (rc) {
        ks_api_msg_req_free(&mr);
        return rc;
    }
    rq->notes = mr.notes; /* what the Messages request carried and the server went on without */
    msgs *m = calloc(1, sizeof *m);
    if (m) m->user_stops = json_array();
    for (int i = 0; m && m->user_stops && i < rq->n_stops; i++)
        json_array_append_new(m->user_stops, json_string(rq->stops[i]));
    if (!m || !m->user_stops) {
        free_state(m);
        ks_api_msg_req_free(&mr);
        ks_api_request_free(rq);
        return ks__api_oom(e);
    }
    m->mid_system = mr.mid_system;
    ks_api_msg_req_free(&mr);
    *st = m;
    return 0;
}

/* Anthropic's answer to a system message its model does not take inside
 * messages; Claude Code recognises these words and sends the message again
 * as a <system-reminder> in a user turn. */
static void render_error(const void *st, ks_api_error *e) {
    const msgs *m = st;
    if (m->mid_system < 0 || !e->code || strcmp(e->code, "template_error")) return;
    char param[48], why[300];
    snprintf(param, sizeof param, "messages.%d.role", m->mid_system);
    snprintf(why, sizeof why, "%.299s", e->message);
    why[strcspn(why, "\n")] = '\0'; /* the template engine's first line says it */
    ks_api_error_set(e, 400, T_INVALID, "invalid_value", param,
                     "%s: role 'system' is not supported on this model (its chat template refused a system message "
                     "there: %.200s)", param, why);
}

/* Anthropic's stop_reason (and the stop sequence met) for an OpenAI finish. */
static const char *stop_reason(const msgs *m, const ks_fmt_choice *ch, const char **seq) {
    *seq = NULL;
    if (!strcmp(ch->finish, "tool_calls")) return "tool_use";
    if (!strcmp(ch->finish, "length")) return "max_tokens";
    if (ch->stop_index >= 0 && (size_t)ch->stop_index < json_array_size(m->user_stops)) {
        *seq = json_string_value(json_array_get(m->user_stops, (size_t)ch->stop_index));
        return "stop_sequence";
    }
    return "end_turn";
}

/* One choice: the request has no n. */
static json_t *whole(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, int n, const ks_req_result *total) {
    const msgs *m = st;
    (void)n, (void)total;
    const char *seq;
    ks_api_msg_out mo = {.id = g->id, .model = g->model, .msg = ch->msg, .text = ch->text, .r = ch->r};
    mo.stop_reason = stop_reason(m, ch, &seq);
    mo.stop_sequence = seq;
    return ks_api_messages_object(&mo);
}

/* message_start waits for the first delta: its usage says what the prefill
 * found in the cache, known once a token is out. */
static int stream_start(void *st, const ks_fmt_gen *g, ks_buf *out) {
    (void)st, (void)g, (void)out;
    return 0;
}

static int start(msgs *m, const ks_fmt_gen *g, int index, const ks_req_result *known, ks_buf *out) {
    if (m->started) return 0;
    ks_req_result r = {0};
    if (known) r = *known;
    else if (g->peek) g->peek(g->peek_ud, index, &r);
    int rc = ks_api_mstream_start(&m->ms, g->id, g->model, &r, out);
    m->started = true;
    return rc;
}

static int stream_delta(void *st, const ks_fmt_gen *g, int index, const json_t *delta, const json_t *logprobs,
                        ks_buf *out) {
    msgs *m = st;
    (void)logprobs; /* the request has no logprobs */
    if (!delta) return 0;
    int rc = start(m, g, index, NULL, out);
    return rc ? rc : ks_api_mstream_delta(&m->ms, delta, out);
}

static int stream_end(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, ks_buf *out) {
    msgs *m = st;
    int rc = start(m, g, ch->index, ch->r, out);
    const char *seq;
    const char *why = stop_reason(m, ch, &seq);
    return rc ? rc : ks_api_mstream_end(&m->ms, why, seq, ch->r, out);
}

static int stream_error(void *st, const ks_fmt_gen *g, int index, const ks_api_error *e, ks_buf *out) {
    (void)st, (void)g, (void)index;
    return ks_api_mstream_error(e, out);
}

/* The stream ends with message_stop (stream_end). */
static int stream_done(void *st, const ks_fmt_gen *g, const ks_req_result *total, ks_buf *out) {
    (void)st, (void)g, (void)total, (void)out;
    return 0;
}

const ks_fmt ks__fmt_messages = {
    .name = "messages",
    .prescan = KS_PRESCAN_MESSAGES,
    .id_prefix = "msg_",
    .parse = parse,
    .free_state = free_state,
    .error_json = ks_api_messages_error_json,
    .render_error = render_error,
    .whole = whole,
    .stream_start = stream_start,
    .stream_delta = stream_delta,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .stream_done = stream_done,
};

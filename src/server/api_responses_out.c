/*
 * api_responses_out.c — the OpenAI Responses API's reply shapes: the chat
 * output (a parsed message, or the stream's chat deltas in fmt.h's shape)
 * as Responses output items, the response object, and the typed stream
 * events (response.created ... response.completed). The request's side is
 * api_responses.c; the format's table, fmt_responses.c.
 *
 * Pure JSON, like api.c: unit-tested without a model (tests/unit/test_api_wire.c).
 *
 * Item ids: every output item gets a fresh id (msg_, rs_, fc_ + 24 hex
 * digits); a function call keeps the template's call id as call_id, the id
 * a function_call_output names.
 */
#include "server/api.h"
#include "server/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ output */
static json_t *text_part(const char *text) {
    return json_pack("{s:s, s:s, s:[], s:[]}", "type", "output_text", "text", text, "annotations", "logprobs");
}

static json_t *message_item(const char *text, const char *status) {
    char id[64];
    ks_api_make_id(id, sizeof id, "msg_");
    json_t *parts = text ? json_pack("[o]", text_part(text)) : json_array();
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role", "assistant",
                     "content", parts);
}

static json_t *reasoning_item(const char *text) {
    char id[64];
    ks_api_make_id(id, sizeof id, "rs_");
    json_t *content = text ? json_pack("[{s:s, s:s}]", "type", "reasoning_text", "text", text) : json_array();
    return json_pack("{s:s, s:s, s:[], s:o}", "id", id, "type", "reasoning", "summary", "content", content);
}


/* A custom tool's input from the arguments the model wrote for it: their
 * "input" string, else (the model did not follow the one-string shape) the
 * arguments as written. Owned: free(). */
static char *custom_input(const char *args) {
    json_t *a = json_loads(args, JSON_DECODE_ANY, NULL);
    const char *in = json_string_value(json_object_get(a, "input"));
    char *r = strdup(in ? in : args);
    json_decref(a);
    return r;
}

/* The output item of a call to the chat tool `name` (tool_map: what it stands
 * for, ks_api_resp_req): a function_call, with its namespace when it is one
 * of a group's, or a custom_tool_call whose input is the arguments' string. */
static json_t *call_item(const json_t *tool_map, const char *call_id, const char *name, const char *args,
                         const char *status) {
    char id[64];
    json_t *m = json_object_get(tool_map, name);
    if (json_is_true(json_object_get(m, "custom"))) {
        ks_api_make_id(id, sizeof id, "ctc_");
        char *in = custom_input(args);
        json_t *it = in ? json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "custom_tool_call", "status",
                                    status, "call_id", call_id, "name", ks__api_str(m, "name"), "input", in)
                        : NULL;
        free(in);
        return it;
    }
    ks_api_make_id(id, sizeof id, "fc_");
    json_t *it = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call", "status", status,
                           "call_id", call_id, "name", m ? ks__api_str(m, "name") : name, "arguments", args);
    if (it && m) json_object_set(it, "namespace", json_object_get(m, "namespace"));
    return it;
}

json_t *ks_api_responses_output(const json_t *msg, const char *text, const json_t *tool_map) {
    json_t *out = json_array();
    if (!out) return NULL;
    const char *content = msg ? ks__api_str(msg, "content") : (text ? text : "");
    const char *reasoning = msg ? ks__api_str(msg, "reasoning_content") : "";
    if (reasoning[0]) json_array_append_new(out, reasoning_item(reasoning));
    json_t *calls = msg ? json_object_get(msg, "tool_calls") : NULL;
    if (content[0] || !json_array_size(calls)) json_array_append_new(out, message_item(content, "completed"));
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        json_t *fn = json_object_get(tc, "function");
        json_array_append_new(out, call_item(tool_map, ks__api_str(tc, "id"), ks__api_str(fn, "name"), ks__api_str(fn, "arguments"),
                                             "completed"));
    }
    return out;
}

/* The request fields a response object repeats. */
static const char *const ECHO_FIELDS[] = {"instructions", "max_output_tokens", "parallel_tool_calls",
                                          "previous_response_id", "temperature", "top_p", "tool_choice",
                                          "tools", "text", "reasoning", "metadata", "user", "truncation", NULL};

json_t *ks_api_responses_object(const ks_api_resp_out *o) {
    json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s, s:b, s:b}", "id", o->id, "object", "response",
                          "created_at", (json_int_t)o->created, "status", o->status, "error", "incomplete_details",
                          "model", o->model ? o->model : "", "background", 0, "store", o->store);
    if (!r) return NULL;
    /* Defaults for what the request did not say. */
    json_object_set_new(r, "instructions", json_null());
    json_object_set_new(r, "max_output_tokens", json_null());
    json_object_set_new(r, "parallel_tool_calls", json_true());
    json_object_set_new(r, "previous_response_id", json_null());
    json_object_set_new(r, "temperature", json_real(1.0));
    json_object_set_new(r, "top_p", json_real(1.0));
    json_object_set_new(r, "tool_choice", json_string("auto"));
    json_object_set_new(r, "tools", json_array());
    json_object_set_new(r, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(r, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    json_object_set_new(r, "metadata", json_object());
    json_object_set_new(r, "user", json_null());
    json_object_set_new(r, "truncation", json_string("disabled"));
    for (const char *const *f = ECHO_FIELDS; o->req && *f; f++) {
        json_t *v = json_object_get(o->req, *f);
        if (v && !json_is_null(v)) json_object_set(r, *f, v);
    }
    if (o->incomplete) json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", o->incomplete));
    if (o->error)
        json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", o->error->code ? o->error->code : "server_error",
                                                  "message", o->error->message));
    json_object_set_new(r, "output", o->output ? json_incref((json_t *)o->output) : json_array());
    if (o->r) {
        const ks_req_result *x = o->r;
        json_object_set_new(r, "usage",
                            json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", x->n_prompt,
                                      "input_tokens_details", "cached_tokens", x->n_cached, "output_tokens",
                                      x->n_generated, "output_tokens_details", "reasoning_tokens", 0, "total_tokens",
                                      x->n_prompt + x->n_generated));
        json_t *c = ks_api_cache_json(x);
        if (c) json_object_set_new(r, "cache", c);
        json_t *t = ks_api_timings_json(x);
        if (t) json_object_set_new(r, "timings", t);
    } else {
        json_object_set_new(r, "usage", json_null());
    }
    return r;
}

/* ------------------------------------------------------------ stream */
enum { OPEN_NONE = 0, OPEN_REASONING, OPEN_MESSAGE, OPEN_CALL, OPEN_CUSTOM };

void ks_api_rstream_init(ks_api_rstream *st, json_t *tool_map) {
    memset(st, 0, sizeof *st);
    st->items = json_array();
    st->open = -1;
    st->tool_map = json_incref(tool_map);
}

void ks_api_rstream_free(ks_api_rstream *st) {
    json_decref(st->items);
    json_decref(st->tool_map);
    ks_buf_free(&st->custom_args);
    memset(st, 0, sizeof *st);
}

/* One event: "event: <type>\ndata: <json>\n\n"; ev is stolen, gets type and
 * sequence_number. */
static int event(ks_api_rstream *st, ks_buf *out, const char *type, json_t *ev) {
    if (!ev) return KS_ENOMEM;
    json_object_set_new(ev, "type", json_string(type));
    json_object_set_new(ev, "sequence_number", json_integer(st->seq++));
    int rc = ks_api_sse_event(out, type, ev);
    json_decref(ev);
    return rc;
}

int ks_api_rstream_start(ks_api_rstream *st, const json_t *resp, ks_buf *out) {
    int rc = event(st, out, "response.created", json_pack("{s:O}", "response", resp));
    return rc ? rc : event(st, out, "response.in_progress", json_pack("{s:O}", "response", resp));
}

static json_t *open_item(ks_api_rstream *st) { return json_array_get(st->items, (size_t)st->open); }

/* Ends the open item: its .done events. */
static int close_item(ks_api_rstream *st, ks_buf *out) {
    if (st->open < 0) return 0;
    json_t *it = open_item(st);
    const char *id = ks__api_str(it, "id");
    int oi = st->open, rc = 0;
    json_t *part = json_array_get(json_object_get(it, "content"), 0);
    if (st->open_kind == OPEN_MESSAGE) {
        rc = event(st, out, "response.output_text.done",
                   json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", id, "output_index", oi, "content_index", 0,
                             "text", json_object_get(part, "text"), "logprobs"));
        if (!rc) rc = event(st, out, "response.content_part.done",
                            json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi, "content_index", 0,
                                      "part", part));
    } else if (st->open_kind == OPEN_REASONING) {
        rc = event(st, out, "response.reasoning_text.done",
                   json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi, "content_index", 0, "text",
                             json_object_get(part, "text")));
        if (!rc) rc = event(st, out, "response.content_part.done",
                            json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi, "content_index", 0,
                                      "part", part));
    } else if (st->open_kind == OPEN_CALL) {
        rc = event(st, out, "response.function_call_arguments.done",
                   json_pack("{s:s, s:i, s:O, s:O}", "item_id", id, "output_index", oi, "name",
                             json_object_get(it, "name"), "arguments", json_object_get(it, "arguments")));
    } else if (st->open_kind == OPEN_CUSTOM) {
        /* The input is known whole only now: the arguments were JSON around it. */
        char *in = custom_input(st->custom_args.s ? st->custom_args.s : "");
        ks_buf_free(&st->custom_args);
        rc = in && !json_object_set_new(it, "input", json_string(in)) ? 0 : KS_ENOMEM;
        if (!rc)
            rc = event(st, out, "response.custom_tool_call_input.done",
                       json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", oi, "input",
                                 json_object_get(it, "input")));
        free(in);
    }
    if (json_object_get(it, "status")) json_object_set_new(it, "status", json_string("completed"));
    if (!rc) rc = event(st, out, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", oi, "item", it));
    st->open = -1;
    st->open_kind = OPEN_NONE;
    return rc;
}

/* Opens item (stolen) of kind, with its first content part for text kinds. */
static int add_item(ks_api_rstream *st, ks_buf *out, json_t *it, int kind) {
    int rc = close_item(st, out);
    if (rc || !it) {
        json_decref(it);
        return rc ? rc : KS_ENOMEM;
    }
    /* .added shows the item empty, as it is before any delta. */
    json_t *shown = json_deep_copy(it);
    if (json_array_append_new(st->items, it)) {
        json_decref(shown);
        return KS_ENOMEM;
    }
    st->open = (int)json_array_size(st->items) - 1;
    st->open_kind = kind;
    rc = event(st, out, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", st->open, "item", shown));
    if (rc || kind == OPEN_CALL || kind == OPEN_CUSTOM) return rc;
    json_t *part = kind == OPEN_MESSAGE ? text_part("") : json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "");
    json_t *content = json_object_get(it, "content");
    if (!part || json_array_append(content, part)) {
        json_decref(part);
        return KS_ENOMEM;
    }
    return event(st, out, "response.content_part.added",
                 json_pack("{s:s, s:i, s:i, s:o}", "item_id", ks__api_str(it, "id"), "output_index", st->open,
                           "content_index", 0, "part", part));
}

/* Appends s to the string field key of o. */
static int grow(json_t *o, const char *key, const char *s) {
    const char *a = ks__api_str(o, key);
    size_t la = strlen(a), ls = strlen(s);
    char *n = malloc(la + ls + 1);
    if (!n) return KS_ENOMEM;
    memcpy(n, a, la);
    memcpy(n + la, s, ls + 1);
    int rc = json_object_set_new(o, key, json_string(n)) ? KS_ENOMEM : 0;
    free(n);
    return rc;
}

int ks_api_rstream_delta(ks_api_rstream *st, const json_t *d, ks_buf *out) {
    int rc = 0;
    const char *s;
    if ((s = json_string_value(json_object_get(d, "reasoning_content")))) {
        if (st->open_kind != OPEN_REASONING && (rc = add_item(st, out, reasoning_item(NULL), OPEN_REASONING))) return rc;
        json_t *part = json_array_get(json_object_get(open_item(st), "content"), 0);
        if ((rc = grow(part, "text", s))) return rc;
        return event(st, out, "response.reasoning_text.delta",
                     json_pack("{s:s, s:i, s:i, s:s}", "item_id", ks__api_str(open_item(st), "id"), "output_index", st->open,
                               "content_index", 0, "delta", s));
    }
    if ((s = json_string_value(json_object_get(d, "content")))) {
        if (st->open_kind != OPEN_MESSAGE && (rc = add_item(st, out, message_item(NULL, "in_progress"), OPEN_MESSAGE)))
            return rc;
        json_t *part = json_array_get(json_object_get(open_item(st), "content"), 0);
        if ((rc = grow(part, "text", s))) return rc;
        return event(st, out, "response.output_text.delta",
                     json_pack("{s:s, s:i, s:i, s:s, s:[]}", "item_id", ks__api_str(open_item(st), "id"), "output_index",
                               st->open, "content_index", 0, "delta", s, "logprobs"));
    }
    json_t *calls = json_object_get(d, "tool_calls");
    json_t *tc = json_array_get(calls, 0);
    if (!tc) return 0;
    json_t *fn = json_object_get(tc, "function");
    int index = (int)json_integer_value(json_object_get(tc, "index"));
    if (json_object_get(fn, "name")) { /* a call's header */
        json_t *it = call_item(st->tool_map, ks__api_str(tc, "id"), ks__api_str(fn, "name"), "", "in_progress");
        bool custom = it && !strcmp(ks__api_str(it, "type"), "custom_tool_call");
        if ((rc = add_item(st, out, it, custom ? OPEN_CUSTOM : OPEN_CALL))) return rc;
        st->call_index = index;
        s = ks__api_str(fn, "arguments");
        if (!s[0]) return 0;
    } else {
        s = ks__api_str(fn, "arguments");
    }
    if (st->open_kind == OPEN_CUSTOM && st->call_index == index) /* its input comes at close_item */
        return ks_buf_append(&st->custom_args, s, strlen(s)) ? KS_ENOMEM : 0;
    if (st->open_kind != OPEN_CALL || st->call_index != index || !s[0]) return 0;
    if ((rc = grow(open_item(st), "arguments", s))) return rc;
    return event(st, out, "response.function_call_arguments.delta",
                 json_pack("{s:s, s:i, s:s}", "item_id", ks__api_str(open_item(st), "id"), "output_index", st->open, "delta",
                           s));
}

int ks_api_rstream_end(ks_api_rstream *st, json_t *resp, ks_buf *out) {
    int rc = close_item(st, out);
    if (rc) return rc;
    json_object_set(resp, "output", st->items);
    const char *status = ks__api_str(resp, "status");
    const char *type = !strcmp(status, "incomplete") ? "response.incomplete"
                       : !strcmp(status, "failed")   ? "response.failed"
                                                     : "response.completed";
    return event(st, out, type, json_pack("{s:O}", "response", resp));
}

int ks_api_rstream_error(ks_api_rstream *st, const ks_api_error *e, ks_buf *out) {
    /* "error" carries an error object too, so that SDKs raise it. */
    json_t *wrapped = ks_api_error_json(e);
    json_t *ev = wrapped ? json_pack("{s:s, s:s, s:n, s:O}", "code", e->code ? e->code : "server_error", "message",
                                     e->message, "param", "error", json_object_get(wrapped, "error"))
                         : NULL;
    json_decref(wrapped);
    return event(st, out, "error", ev);
}

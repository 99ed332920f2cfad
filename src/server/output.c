/*
 * output.c — see output.h: generated text → message, ids, deltas, finish.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_tmpl.h"
#include "server/api_int.h"
#include "server/output.h"

#define MOD "http"

int ks__out_init(ks_out *o, const char *parse, const char *log_id) {
    memset(o, 0, sizeof *o);
    o->parse = parse;
    o->log_id = log_id ? log_id : "";
    o->ids = json_array();
    o->args_sent = json_array();
    return o->ids && o->args_sent ? 0 : KS_ENOMEM;
}

void ks__out_free(ks_out *o) {
    if (!o) return;
    ks_buf_free(&o->text);
    json_decref(o->msg);
    json_decref(o->ids);
    json_decref(o->args_sent);
    memset(o, 0, sizeof *o);
}

static const char ID_CHARS[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/* Tool calls without an id get one, the same for a call across partial
 * parses (O1): 9 alphanumeric characters (Mistral's templates refuse others). */
static void give_ids(ks_out *o, json_t *msg) {
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        json_t *id = json_object_get(tc, "id");
        if (i >= json_array_size(o->ids)) {
            char buf[10];
            unsigned char rnd[9];
            ks_random_bytes(rnd, sizeof rnd);
            for (int k = 0; k < 9; k++) buf[k] = ID_CHARS[rnd[k] % (sizeof ID_CHARS - 1)];
            buf[9] = 0;
            json_array_append_new(o->ids, json_string(json_is_string(id) && json_string_length(id) ? json_string_value(id) : buf));
        }
        json_object_set(tc, "id", json_array_get(o->ids, i));
    }
    KS_ASSERT(json_array_size(o->ids) >= json_array_size(calls)); /* O1 */
}

/* The generated text as a message (new reference), NULL when it cannot be
 * parsed (then the text is the content). */
static json_t *parse_text(ks_out *o, const char *text, bool partial) {
    if (!o->parse) return NULL;
    char *out = NULL;
    char err[256] = "";
    int rc = ks_chat_tmpl_parse(text, partial, o->parse, &out, err, sizeof err);
    if (rc) {
        if (!partial) KS_DEBUG(MOD, "%s: output not parsed (%s): returned as text", o->log_id, err);
        return NULL;
    }
    json_t *m = json_loads(out, 0, NULL);
    free(out);
    if (m) give_ids(o, m);
    return m;
}


/* The delta from prev to cur of one string field, appended to *deltas as
 * {key: suffix}; a field that did not grow by appending adds nothing. */
static void delta_field(json_t *deltas, const json_t *prev, const json_t *cur, const char *key) {
    const char *a = ks__api_str(prev, key), *b = ks__api_str(cur, key);
    size_t la = strlen(a), lb = strlen(b);
    if (lb > la && !strncmp(a, b, la)) json_array_append_new(deltas, json_pack("{s:s}", key, b + la));
}

/* The stream deltas from o->msg to cur (OpenAI's order: text first, then
 * each tool call's header — id, name — then its argument fragments). A
 * call's header waits for its arguments to start (the name is whole then). */
static json_t *message_deltas(ks_out *o, const json_t *cur, bool final) {
    json_t *d = json_array();
    if (!d) return NULL;
    const json_t *prev = o->msg;
    delta_field(d, prev, cur, "reasoning_content");
    delta_field(d, prev, cur, "content");
    json_t *calls = json_object_get(cur, "tool_calls");
    size_t n = json_array_size(calls);
    for (size_t i = 0; i < n; i++) {
        json_t *tc = json_array_get(calls, i);
        json_t *fn = json_object_get(tc, "function");
        const char *name = ks__api_str(fn, "name"), *args = ks__api_str(fn, "arguments");
        if (i >= json_array_size(o->args_sent)) {
            if (!name[0] || (!args[0] && i + 1 == n && !final)) break;
            json_t *h = json_pack("{s:[{s:i, s:O, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", (int)i, "id",
                                  json_object_get(tc, "id"), "type", "function", "function", "name", name,
                                  "arguments", "");
            if (h) json_array_append_new(d, h);
            json_array_append_new(o->args_sent, json_string(""));
        }
        const char *sent = json_string_value(json_array_get(o->args_sent, i));
        size_t ls = strlen(sent), la = strlen(args);
        if (la > ls && !strncmp(sent, args, ls)) {
            json_t *f = json_pack("{s:[{s:i, s:{s:s}}]}", "tool_calls", "index", (int)i, "function", "arguments",
                                  args + ls);
            if (f) json_array_append_new(d, f);
            json_array_set_new(o->args_sent, i, json_string(args));
        }
    }
    return d;
}

void ks__out_continue(ks_out *o) {
    if (!o->parse) return;
    json_decref(o->msg);
    o->msg = parse_text(o, "", true);
}

int ks__out_feed(ks_out *o, const char *text, size_t len, bool final, json_t **deltas) {
    *deltas = NULL;
    if (len && ks_buf_append(&o->text, text, len)) return KS_ENOMEM;
    if (!o->parse) {
        if (!len) return 0;
        json_t *d = json_array(), *t = json_stringn(text, len);
        json_t *one = d && t ? json_pack("{s:o}", "content", t) : (json_decref(t), NULL);
        if (!one || json_array_append_new(d, one)) {
            json_decref(d);
            return KS_ENOMEM;
        }
        *deltas = d;
        return 0;
    }
    if (!len && !final) return 0;
    const char *all = o->text.s ? o->text.s : "";
    json_t *m = parse_text(o, all, !final);
    if (!m && final && !o->msg) {
        /* Not parseable as a whole: the text is the content. */
        m = json_pack("{s:s%, s:s, s:[]}", "content", all, o->text.len, "reasoning_content", "", "tool_calls");
    }
    if (!m) return 0;
    *deltas = message_deltas(o, m, final);
    json_decref(o->msg);
    o->msg = m;
    return *deltas ? 0 : KS_ENOMEM;
}

/* A continued message: the response holds what was generated, not the
 * prefill the parser sees again (the parse of no output, base). */
static void strip_prefill(json_t *msg, const json_t *base) {
    static const char *const keys[] = {"content", "reasoning_content"};
    for (int k = 0; k < 2; k++) {
        const char *a = ks__api_str(base, keys[k]), *b = ks__api_str(msg, keys[k]);
        size_t la = strlen(a);
        if (la && !strncmp(a, b, la)) json_object_set_new(msg, keys[k], json_string(b + la));
    }
}

void ks__out_whole(ks_out *o, const char *text, bool continuation) {
    json_decref(o->msg);
    o->msg = parse_text(o, text ? text : "", false);
    if (o->msg && continuation) {
        json_t *base = parse_text(o, "", true);
        if (base) strip_prefill(o->msg, base);
        json_decref(base);
    }
}

const char *ks__out_finish(const ks_out *o, const char *finish) {
    json_t *calls = o->msg ? json_object_get(o->msg, "tool_calls") : NULL;
    if (json_array_size(calls) > 0 && !strcmp(finish, "stop")) return "tool_calls";
    return finish;
}

json_t *ks__out_lp_entry(const char *piece, int n, float logprob) {
    if (n < 0) n = 0;
    json_t *bytes = json_array();
    for (int i = 0; i < n && bytes; i++) json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
    /* A piece that is part of a character is shown by its bytes only. */
    json_t *t = json_stringn(piece, (size_t)n);
    return json_pack("{s:o, s:f, s:o}", "token", t ? t : json_string(""), "logprob", (double)logprob, "bytes",
                     bytes ? bytes : json_array());
}

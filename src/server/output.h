/*
 * output.h — a choice's generated text turned into what a reply shows
 * (output.c): the assistant message the template's parser makes of it
 * (content, reasoning, tool calls), tool-call ids, the stream's chat deltas
 * from one parse to the next, the finish reason a message implies, and
 * logprob entries.
 *
 * Nothing here knows the reply's format (fmt.h): it speaks the internal
 * shapes, which each format's table renders.
 *
 * Invariants
 *  O1. A tool call keeps the id it was first given, across partial parses
 *      and into the final message.
 *  O2. Deltas only grow what was sent: a field that changed other than by
 *      appending adds nothing, and a call's header (id, name) goes out once,
 *      before its first argument fragment.
 *
 * Thread model: a ks_out belongs to one choice, on its connection thread.
 */
#ifndef KS_OUTPUT_H
#define KS_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "base/base.h"

typedef struct ks_out {
    const char *parse;     /* parse options for ks_chat_tmpl_parse (borrowed), NULL: plain text */
    const char *log_id;    /* the request's id, for the debug log (borrowed) */
    ks_buf text;           /* everything fed so far */
    json_t *msg;           /* the last parsed message, NULL: none yet */
    json_t *ids;           /* tool-call ids given so far, by index (O1) */
    json_t *args_sent;     /* streamed arguments, by tool-call index (O2) */
} ks_out;

/* parse, log_id borrowed for o's life. 0 or KS_ENOMEM (then free o). */
int ks__out_init(ks_out *o, const char *parse, const char *log_id);
/* NULL-safe, idempotent. */
void ks__out_free(ks_out *o);

/* A stream of a continued message starts at the parse of no output: the
 * message's own text is not sent again. No-op for plain text. */
void ks__out_continue(ks_out *o);
/* Appends text[0, len) and puts into *deltas (new array) the chat deltas
 * since the last call (fmt.h's shapes); final: the text is whole (a call
 * still being written comes out; text that parses as nothing becomes the
 * content). 0 or KS_ENOMEM. */
int ks__out_feed(ks_out *o, const char *text, size_t len, bool final, json_t **deltas);
/* The whole reply: text parsed into o->msg (NULL when there is no parser or
 * it fails: then the text is the content); continuation: the continued
 * message's own text taken off the front. */
void ks__out_whole(ks_out *o, const char *text, bool continuation);
/* The finish reason of a choice whose message is o->msg: "stop" becomes
 * "tool_calls" when the message calls tools. */
const char *ks__out_finish(const ks_out *o, const char *finish);

/* A logprob entry {token, logprob, bytes} of a token whose text is
 * piece[0, n) (n may cut a character: the bytes show it). NULL on ENOMEM. */
json_t *ks__out_lp_entry(const char *piece, int n, float logprob);

#endif

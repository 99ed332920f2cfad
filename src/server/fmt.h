/*
 * fmt.h — the reply formats: one table of functions per wire format
 * (OpenAI chat completions and completions, fmt_openai.c; OpenAI Responses,
 * fmt_responses.c; Anthropic Messages, fmt_messages.c), named by the route
 * (server.c). A fourth API is one more table.
 *
 * NOTES ON THE DESIGN OF THE FORMATS
 *
 * Everything between the parse and the reply is one path for every format:
 * a request is parsed into the internal request (ks_api_request: a chat or a
 * completion request), planned (plan.c), generated (gen.c), its text turned
 * into a message and chat deltas (output.c), and replied (reply.c). Only the
 * table knows which format it serves; the generation, output and reply code
 * call it and never ask.
 *
 * The internal shapes a table is given:
 *  - a message: chat_tmpl.h's parsed assistant message {content,
 *    reasoning_content, tool_calls}, or NULL when the text is the content;
 *  - a delta: one of {"content": s}, {"reasoning_content": s}, or
 *    {"tool_calls": [{index, id, type, function: {name, arguments: ""}}]}
 *    (a call's header) and {"tool_calls": [{index, function: {arguments}}]}
 *    (a fragment of its arguments), in OpenAI's order (output.c);
 *  - logprob entries: an array of {token, logprob, bytes, top_logprobs?},
 *    the format's own logprobs object made from them.
 *
 * Invariants (reply.c keeps them; a table may rely on them)
 *  F1. A stream is stream_start, then for each choice any number of
 *      stream_delta and exactly one stream_end or stream_error, then
 *      stream_done — unless a choice failed: after a stream_error nothing
 *      more is written but that choice's error (the error event ends a
 *      failed stream).
 *  F2. A table's state (the parse's *st) belongs to one request and is
 *      freed once, with the reply (reply.c) or by the request when no reply
 *      was made (request.c).
 *  F3. Nothing here blocks or takes a lock of the generation's: the
 *      functions run on the connection thread, between the generation's
 *      waits, and peek is the one call back into it.
 *
 * Thread model: the tables are constant; a state belongs to one request's
 * connection thread.
 */
#ifndef KS_FMT_H
#define KS_FMT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "server/api.h"
#include "server/prescan.h"

struct ks_convstore;

/* What a format's parser may use of the server (borrowed). */
typedef struct ks_fmt_env {
    struct ks_convstore *convs; /* Responses conversations (previous_response_id) */
    uint64_t tenant;            /* the request's tenant (docs/SECURITY.md): whose they are */
    const ks_media_limits *media; /* what the model takes of images and audio, and the limits
                                     (media_in.h); NULL: none */
} ks_fmt_env;

/* What every reply shows of its generation (borrowed, read-only). */
typedef struct ks_fmt_gen {
    const char *id;             /* fmt->id_prefix + 32 hex digits (ks_api_make_id) */
    int64_t created;            /* unix seconds */
    const char *model;
    int n_choices;
    /* What is known of choice index before it is done (the prompt and
     * cached token counts once its prefill is over; zeroes before). NULL:
     * nothing is known (r zeroed). */
    void (*peek)(void *ud, int index, ks_req_result *r);
    void *peek_ud;
} ks_fmt_gen;

/* A choice that ended well (borrowed for the call). */
typedef struct ks_fmt_choice {
    int index;
    const char *finish;         /* "stop", "length", "tool_calls" */
    const json_t *msg;          /* the parsed message, NULL: text is the content */
    const char *text;           /* everything generated */
    const json_t *logprobs;     /* whole replies: every logprob entry; NULL: none asked */
    int stop_index;             /* the stop string that ended it (the request's, then the
                                   template's), -1: none */
    const ks_req_result *r;
} ks_fmt_choice;

typedef struct ks_fmt {
    const char *name;           /* "chat", "completions", "responses", "messages" (logs, tests) */
    const char *id_prefix;      /* "chatcmpl-", "cmpl-", "resp_", "msg_" */
    ks_prescan_shape prescan;   /* how its body is sized before the parse (prescan.h) */
    bool logprobs_legacy;       /* a whole reply's logprobs as OpenAI's legacy parallel arrays
                                   (completions: tokens, token_logprobs, top_logprobs,
                                   text_offset; lptext.h) rather than chat's entries */
    bool logprobs_bare;         /* a whole reply's logprobs as the bare array of chat's entries
                                   (llama-server's completion_probabilities) */
    /* The request: root (stolen, also on error) into *rq (free with
     * ks_api_request_free) and the format's own state *st (free with
     * free_state). 0, or a KS_E* code with e filled and nothing to free. */
    int (*parse)(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e);
    void (*free_state)(void *st); /* NULL-safe */
    /* An error body in the format's shape (new reference, NULL on ENOMEM). */
    json_t *(*error_json)(const ks_api_error *e);
    /* A render error (the template refused the conversation) in the
     * format's words; NULL: as it is. */
    void (*render_error)(const void *st, ks_api_error *e);
    /* The whole reply of n choices (new reference, NULL on ENOMEM); total:
     * the request's statistics (a prompt shared by n choices counted once). */
    json_t *(*whole)(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, int n, const ks_req_result *total);
    /* The stream (F1), each appending its events to out: 0, or KS_ENOMEM /
     * KS_EINVAL. delta NULL: logprobs only (entries that had no text to ride
     * on); logprobs: entries (borrowed), NULL: none. */
    int (*stream_start)(void *st, const ks_fmt_gen *g, ks_buf *out);
    int (*stream_delta)(void *st, const ks_fmt_gen *g, int index, const json_t *delta, const json_t *logprobs,
                        ks_buf *out);
    int (*stream_end)(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, ks_buf *out);
    int (*stream_error)(void *st, const ks_fmt_gen *g, int index, const ks_api_error *e, ks_buf *out);
    int (*stream_done)(void *st, const ks_fmt_gen *g, const ks_req_result *total, ks_buf *out);
} ks_fmt;

extern const ks_fmt ks__fmt_chat;        /* POST /v1/chat/completions */
extern const ks_fmt ks__fmt_completions; /* POST /v1/completions */
extern const ks_fmt ks__fmt_responses;   /* POST /v1/responses */
extern const ks_fmt ks__fmt_messages;    /* POST /v1/messages, /v1/messages/count_tokens (errors) */
extern const ks_fmt ks__fmt_native;      /* POST /completion: llama-server's own shape */
extern const ks_fmt ks__fmt_infill;      /* POST /infill: llama-server's fill-in-the-middle */

#endif

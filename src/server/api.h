/*
 * api.h — the OpenAI-compatible wire protocol: request parsing and
 * validation, response and SSE chunk JSON, error bodies.
 *
 * Pure functions over jansson: no sockets, no engine, no scheduler, so every
 * rule here is unit-tested without a model (tests/unit/test_api*.c). Which
 * file holds what: api_fields.c errors and the typed field getters; api.c
 * the OpenAI request entry and replies; api_chat.c chat's fields and the
 * field policy; api_media.c the image and audio parts (media_in.c their
 * pure checks); api_responses.c / api_responses_out.c and api_messages.c the
 * Responses and Messages translations and reply shapes; api_utility.c the
 * utility endpoints.
 *
 * Design notes
 *  1. Validation happens completely before anything is queued: a request that
 *     parses is well-formed (types, ranges, roles, stop strings). Only the
 *     checks that need the model (tokenized length against the context, token
 *     ids against the vocabulary) are left to the server.
 *  2. Errors follow OpenAI's shape, {"error":{"message","type","param","code"}},
 *     with OpenAI's codes where OpenAI has one (invalid_type,
 *     missing_required_parameter, integer_below_min_value, ...), so client
 *     libraries surface them the usual way.
 *  3. Every request field is either implemented, documented as accepted and
 *     ignored (the list in api_chat.c, docs/SERVER.md), or a 400
 *     "unsupported_parameter" that names it: never silently ignored.
 *  4. Every string in a parsed request is valid UTF-8 without NUL bytes
 *     (jansson refuses anything else), so it can go to the tokenizer as a C string.
 *
 * Thread model: every function is reentrant; a ks_api_request belongs to one
 * thread at a time.
 */
#ifndef KS_API_H
#define KS_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/base.h"
#include "engine/engine.h"
#include "prompt/prompt.h"
#include "sched/sched.h"
#include "server/media_in.h"

#define KS_API_MAX_STOPS 16
/* Upper bound on a stop string's length; longer ones are refused (400). */
#define KS_API_MAX_STOP_LEN 256

/* ------------------------------------------------------------------ errors */
/* An HTTP error in OpenAI's shape. type/code point to static strings. */
typedef struct ks_api_error {
    int status;          /* HTTP status: 400, 401, 404, 405, 413, 500, 503 */
    const char *type;    /* "invalid_request_error", "authentication_error", "server_error" */
    const char *code;    /* e.g. "invalid_type"; NULL renders as null */
    char param[96];      /* offending field, e.g. "messages[1].role"; "" renders as null */
    char message[384];
} ks_api_error;

/* Fills e (status, type, code, param may be NULL) with a printf-style message. */
void ks_api_error_set(ks_api_error *e, int status, const char *type, const char *code,
                      const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{...}} — new reference, NULL on ENOMEM. */
json_t *ks_api_error_json(const ks_api_error *e);

/* ---------------------------------------------------------------- requests */
typedef enum { KS_API_CHAT = 0, KS_API_COMPLETION } ks_api_kind;

/* Most choices (n) per prompt, prompts per completion request, and choices
 * in all; top_logprobs at most. */
#define KS_API_MAX_N 16
#define KS_API_MAX_PROMPTS 64
#define KS_API_MAX_CHOICES 64
#define KS_API_MAX_TOP_LOGPROBS 20

/* One logit_bias entry: a token id, or a string whose tokens all get the
 * bias (llama-server's rule; the server tokenizes it). */
typedef struct ks_api_bias {
    int32_t tok;          /* when text is NULL */
    const char *text;     /* borrowed */
    float bias;           /* -INFINITY: banned (false in llama-server's array form) */
} ks_api_bias;

/* One prompt of a completion request: text, or token ids. */
typedef struct ks_api_prompt {
    const char *text;     /* borrowed; NULL: tokens */
    int32_t *tokens;      /* owned */
    int n_tokens;
} ks_api_prompt;

/* A cache breakpoint (Anthropic's cache_control, also taken on chat
 * messages and tools): the prompt up to the end of a message is a prefix
 * the client will send again, to be kept in the store for ttl_s seconds. */
/* What a request carried that the server does not act on and went on without
 * (docs/SERVER.md, "Request fields"): fields it does not know (ignored, as
 * llama-server ignores them), hosted tools (dropped). The server logs each
 * one once (refusals.h); nothing here is an error. */
#define KS_API_MAX_NOTES 8
typedef struct ks_api_notes {
    int n;                 /* kept in v, at most KS_API_MAX_NOTES */
    int n_total;           /* all of them */
    struct {
        char field[64];    /* "frobnicate", "tools[3]" (cut at a character boundary) */
        char what[64];     /* "an unknown field", "a hosted tool (web_search)" */
    } v[KS_API_MAX_NOTES];
} ks_api_notes;

/* Adds one to n (NULL: nothing). */
void ks_api_note(ks_api_notes *n, const char *field, const char *what);

#define KS_API_MAX_BREAKPOINTS 4
typedef struct ks_api_breakpoint {
    int msg;              /* the prefix ends after tmpl_req's messages[msg]; -1: a breakpoint
                             on the tools (the end of the leading system message, or of
                             the first message when there is none) */
    int ttl_s;            /* "5m": 300 (the default), "1h": 3600 */
} ks_api_breakpoint;

/* One image or audio clip of a chat request (api_media.c), in the order
 * of the markers in the messages' text. */
typedef struct ks_api_media {
    ks_media_in_kind kind;
    ks_media_in_format format;   /* from the magic bytes */
    uint8_t *data;               /* owned: the decoded file's bytes (PNG, WAV, ...) */
    size_t n;
    int64_t width, height;       /* an image's, from its header; 0 for audio */
    uint8_t sha256[32];          /* of data: the item's identity */
    char param[96];              /* where the request had it, for later errors */
} ks_api_media;

/* The most files in /infill's input_extra. */
#define KS_API_MAX_INFILL_EXTRA 4096

typedef struct ks_api_request {
    ks_api_kind kind;
    /* chat: roles are static strings ("system", "user", "assistant"; "developer"
     * is mapped to "system"); contents are borrowed from this request. */
    ks_msg *msgs;
    int n_msgs;
    /* completion: exactly one of prompt (borrowed) or prompt_tokens (owned) is
     * set: the first of the prompts, which holds all of them. */
    const char *prompt;
    int32_t *prompt_tokens;
    int n_prompt_tokens;
    ks_api_prompt *prompts;  /* owned; prompts[0] aliases prompt / prompt_tokens */
    int n_prompts;
    /* POST /infill (ks_api_parse_infill): one prompt (prompts[0] empty), made
     * of these by the plan (prompt.h, ks_prompt_infill); strings borrowed
     * from root, "" when absent. */
    bool infill;
    const char *infill_prefix, *infill_suffix, *infill_prompt;
    ks_prompt_infill_chunk *infill_extra; /* owned; filename "tmp" when the client gave none */
    int n_infill_extra;

    /* chat: the request as llama.cpp's common library renders it
     * (chat_tmpl.h: messages with "developer" as "system", tools,
     * tool_choice, parallel_tool_calls, response_format, grammar,
     * reasoning_format, chat_template_kwargs, continue_final_message...);
     * new reference, NULL for completions. */
    json_t *tmpl_req;
    bool has_tools;          /* tools given and tool_choice is not "none" */
    bool structured;         /* response_format json_object/json_schema, json_schema or grammar */
    /* completion: a GBNF grammar (borrowed) or a JSON schema (borrowed from root) */
    const char *grammar;
    json_t *json_schema;

    /* sampling beyond ks_sample_params */
    ks_api_bias *bias;       /* owned */
    int n_bias;
    float repeat_penalty;    /* default 1 (off) */
    int repeat_last_n;       /* default 64 (llama-server's); -1: the whole context */
    float frequency_penalty, presence_penalty; /* default 0 */
    bool ignore_eos;
    bool logprobs;           /* chat: logprobs; completion: logprobs >= 0 given */
    int top_logprobs;        /* alternatives per token, 0..KS_API_MAX_TOP_LOGPROBS */
    int n;                   /* choices per prompt, default 1 */
    int id_slot;             /* -1: the scheduler chooses */

    int max_tokens;        /* -1: not given (the server picks, see docs/SERVER.md) */
    int n_indent;          /* llama-server's: > 0, a later line indented less ends the reply
                              (textstream.h); 0: off */
    int t_max_predict_ms;  /* llama-server's: > 0, past this many ms after the first token the
                              reply ends at a newline; 0: off */
    uint8_t sampler_order[KS_SAMPLER_ORDER_MAX]; /* llama-server's "samplers" (engine.h
                                                    ks_sample_ext.order); n 0: kvstash's chain */
    int n_sampler_order;
    bool samplers_given;   /* "samplers" was given (an empty list: the draw alone) */
    ks_sample_params sample;
    bool seed_set;         /* false: the server draws a seed */
    const char *stops[KS_API_MAX_STOPS]; /* borrowed, non-empty */
    int n_stops;
    bool stream;
    bool include_usage;    /* stream_options.include_usage */
    bool cache_prompt;     /* extension; default true (the server switch still applies) */
    int draft_max;         /* llama-server's "speculative.n_max": 0 (absent) the server's, -1 none
                              (the field 0), > 0 at most that many drafted tokens per step */
    ks_api_notes notes;    /* fields ignored (unknown), tools dropped */
    ks_api_breakpoint bps[KS_API_MAX_BREAKPOINTS]; /* chat: cache_control breakpoints, in the
                                                      order given */
    int n_bps;
    uint64_t tenant;       /* set by the server: whose request (docs/SECURITY.md), 0: single */
    /* chat: the images and audio of the messages, in order; each stands at
     * one marker (media_limits->marker) in its message's text. */
    const ks_media_limits *media_limits; /* borrowed for the parse; NULL: no media input */
    ks_api_media *media;   /* owned */
    int n_media;
    int64_t media_bytes;   /* their bytes together */

    /* owned storage behind the borrowed pointers */
    json_t *root;
    char **owned;
    int n_owned;
} ks_api_request;

/* Sampling defaults of a request that sets none (llama-server's, so that
 * outputs match what its users know): temperature 0.8, top_k 40,
 * top_p 0.95, min_p 0.05. */
ks_sample_params ks_api_sample_defaults(void);

/* Parses and validates a request body of `kind`. Returns 0 and fills *out
 * (free with ks_api_request_free), or a negative KS_E* code with *err filled
 * (status 400; the caller checks the body size limit, 413, before calling).
 * body need not be NUL-terminated. */
int ks_api_parse(ks_api_kind kind, const char *body, size_t len, ks_api_request *out,
                 ks_api_error *err);
/* The same from a parsed object (stolen, also on error): the OpenAI
 * Responses and Anthropic Messages endpoints translate their requests into
 * a chat request and parse that. */
int ks_api_parse_root(ks_api_kind kind, json_t *root, ks_api_request *out, ks_api_error *err);
/* llama-server's POST /infill request (root stolen, also on error): a
 * completion with input_prefix, input_suffix, input_extra and an optional
 * prompt, rq->infill set. */
int ks_api_parse_infill(json_t *root, ks_api_request *out, ks_api_error *err);
/* The same with media input: image and audio parts are checked against
 * media (borrowed for the call; NULL, or modalities 0: every such part is a
 * 400 that says the model takes no image or audio input). */
int ks_api_parse_root_media(ks_api_kind kind, json_t *root, const ks_media_limits *media, ks_api_request *out,
                            ks_api_error *err);
/* Frees what ks_api_parse allocated; zeroes *r. NULL-safe, idempotent. */
void ks_api_request_free(ks_api_request *r);

/* -------------------------------------------------------- utility endpoints */
/* POST /tokenize, as llama-server's: content is a string, or an array mixing
 * strings (tokenized; add_special applies to the first element only, and only
 * when it is a string) and token ids (passed through). */
typedef struct ks_api_tok_part {
    const char *text;     /* borrowed from the request; NULL: a token id */
    size_t len;
    int32_t tok;
} ks_api_tok_part;

typedef struct ks_api_tokenize {
    ks_api_tok_part *parts; /* owned */
    int n_parts;
    bool add_special;       /* default false */
    bool parse_special;     /* default true */
    bool with_pieces;       /* default false */
    json_t *root;           /* owns the strings */
} ks_api_tokenize;

/* Parses a /tokenize body. Token ids in content must be in [0, n_vocab).
 * 0, or KS_EINVAL / KS_ENOMEM with *err filled (400 / 500). Free *out with
 * ks_api_tokenize_free whatever the result. */
int ks_api_parse_tokenize(const char *body, size_t len, int n_vocab, ks_api_tokenize *out, ks_api_error *err);
void ks_api_tokenize_free(ks_api_tokenize *t);

/* Parses a /detokenize body: {"tokens": [ids in [0, n_vocab)]}. *tokens is
 * owned (free()), NULL for an empty array. 0, or KS_EINVAL / KS_ENOMEM with
 * *err filled; the param of a bad id is "tokens[i]". */
int ks_api_parse_detokenize(const char *body, size_t len, int n_vocab, int32_t **tokens, int *n,
                            ks_api_error *err);

/* {"id": id, "piece": ...} of /tokenize with_pieces: the piece as a string
 * when it is valid UTF-8, else as an array of its byte values (llama-server's
 * rule, for tokens that hold part of a character). NULL on ENOMEM. */
json_t *ks_api_token_piece_json(int32_t id, const char *piece, size_t len);

/* What GET /props shows (strings borrowed; NULL renders as ""). */
typedef struct ks_api_props {
    int n_ctx;                 /* per slot */
    int total_slots;
    int default_max_tokens;
    const char *model_alias;
    const char *model_path;
    const char *chat_template; /* the GGUF's, NULL: none */
    const char *bos_token, *eos_token;
    const char *llama_version;
    bool cache_prompt;
    bool exact;
    const char *exact_mode;    /* how exactness is kept: "batch-invariant", "pairs", "off", "unavailable";
                                  NULL: not shown */
    const char *exact_reason;  /* why "unavailable" (ks_engine_exact_reason); NULL: not shown */
    const ks_engine_offload *offload; /* where the model runs; NULL: not shown */
    const char *gpu_backends;  /* ks_engine_gpu_backends(), comma-separated; NULL: not shown */
    const char *probe;         /* what the engine's open-time probe found, whatever exact is:
                                  "batch-invariant", "pairs", "not invariant"; NULL: not shown */
    bool repacked;             /* weight repacking on (ks_engine_repacked) */
    int n_expert, n_expert_used; /* a mixture of experts' experts per layer and per token; 0: dense */
    bool flash_attn;           /* flash attention in effect (after --flash-attn auto) */
    const char *cache_type_k;  /* the KV cache's types ("f16") */
    const char *cache_type_v;
    const char *cpu_backend;   /* ks_engine_cpu_backend(); NULL: not shown */
    const char *store;         /* "off", "ram-only", "full"; NULL: not shown */
    bool vision, audio;        /* image / audio input (a projector: --mmproj) */
    /* Speculative decoding: the configured type ("none") and cap, whether it
     * runs and is exact (ks_sched_spec_status), and why not. */
    const char *spec_type;
    int draft_max;
    bool spec_on, spec_exact;
    const char *spec_reason;
} ks_api_props;

/* llama-server's /props object with the fields that apply to kvstash
 * (docs/SERVER.md), plus a "kvstash" object. NULL on ENOMEM. */
json_t *ks_api_props_json(const ks_api_props *p);

/* ---------------------------------------------------------------- responses */
/* Everything a response shows about one generation. */
typedef struct ks_api_gen {
    ks_api_kind kind;
    int index;               /* the choice's index (n > 1, several prompts) */
    const json_t *msg;       /* chat: the parsed assistant message {content, reasoning_content,
                                tool_calls} (borrowed), NULL: text is the content */
    const json_t *logprobs;  /* the choice's logprobs object (borrowed), NULL: null */
    const char *id;          /* "chatcmpl-..." or "cmpl-..." */
    int64_t created;         /* unix seconds */
    const char *model;
    const char *text;        /* the whole reply (non-stream) */
    const char *finish;      /* "stop" | "length" | "tool_calls" (NULL: "stop") */
    const ks_req_result *r;  /* counts and timings; may be NULL in chunks that need none */
} ks_api_gen;

/* A new id: prefix + 32 hex digits, 128 bits from the system's CSPRNG
 * (ks_random_secure): unique, and unguessable from any other id.
 * n >= prefix + 33. Thread-safe. */
#define KS_API_ID_BYTES 16
void ks_api_make_id(char *buf, size_t n, const char *prefix);

/* finish_reason for a scheduler result: "stop", "length" (NULL for
 * cancel/error, which are not successful completions). stopped_by_string
 * wins over length when the stop string completed on the last allowed token. */
const char *ks_api_finish_reason(const ks_req_result *r, bool stopped_by_string);

/* The usage / timings / cache objects (new references). cache:
 * {mode, cached_tokens, slot, reason?, tier?, restore_ms?}; reason only when
 * not everything reusable was reused, tier/restore_ms only for a restore. */
json_t *ks_api_usage_json(const ks_req_result *r);
json_t *ks_api_timings_json(const ks_req_result *r);
json_t *ks_api_cache_json(const ks_req_result *r);

/* The complete non-streamed response: chat.completion or text_completion. */
json_t *ks_api_response_json(const ks_api_gen *g);

/* Stream chunks (chat.completion.chunk or text_completion) that carry no
 * text (ks_api_chunk_delta_json carries the text):
 *  role:   first chat chunk, delta {role:"assistant", content:""}
 *  finish: empty delta with finish_reason, plus timings and cache (g->r, may be NULL)
 *  usage:  choices [] with usage, timings and cache (stream_options.include_usage) */
typedef enum { KS_API_CHUNK_ROLE, KS_API_CHUNK_FINISH, KS_API_CHUNK_USAGE } ks_api_chunk_kind;
json_t *ks_api_chunk_json(const ks_api_gen *g, ks_api_chunk_kind k);

/* The non-streamed response of several choices: the envelope from gs[0],
 * one choice per gs[i] (index, text or msg, finish, logprobs), usage,
 * timings and cache from r (aggregated by the caller). */
json_t *ks_api_response_multi_json(const ks_api_gen *gs, int n, const ks_req_result *r);

/* The stream chunk of one delta of choice g->index: delta (stolen) in the
 * internal shape (fmt.h: {content | reasoning_content | tool_calls}; {}:
 * none, for a chunk that carries logprobs only), whose fields become the
 * chat choice's delta, or a completion's text (its content); logprobs
 * (stolen, NULL: null); finish (NULL: null). NULL on ENOMEM. The server's
 * streams build every text chunk here. */
json_t *ks_api_chunk_delta_json(const ks_api_gen *g, json_t *delta, json_t *logprobs, const char *finish);

/* The logprobs object of a response or chunk from logprob entries
 * ({token, logprob, bytes, top_logprobs?}, borrowed): chat's {content,
 * refusal}, or the completions API's parallel arrays. New reference; NULL
 * when entries is NULL or on ENOMEM. */
json_t *ks_api_logprobs_json(ks_api_kind kind, const json_t *entries);

/* The assistant message of a response from a parsed message (chat_tmpl.h's
 * shape): content (null when there are tool calls and no text),
 * reasoning_content when not empty, tool_calls when there are any. New
 * reference; NULL on ENOMEM. */
json_t *ks_api_message_json(const json_t *parsed);

/* Appends "data: <compact JSON>\n\n" to out. 0, KS_ENOMEM or KS_EINVAL (unencodable). */
int ks_api_sse(ks_buf *out, const json_t *obj);
/* Appends "data: [DONE]\n\n". */
int ks_api_sse_done(ks_buf *out);

/* Appends "event: <name>\ndata: <compact JSON>\n\n" (the typed events of the
 * Responses and Messages APIs). 0, KS_ENOMEM or KS_EINVAL. */
int ks_api_sse_event(ks_buf *out, const char *name, const json_t *obj);

/* ------------------------------------------------ OpenAI Responses (api_responses.c) */
/* A Responses request as a chat request. */
typedef struct ks_api_resp_req {
    json_t *chat;            /* the chat request: instructions as a system message, the
                                history, the input; tools, text.format, sampling renamed */
    json_t *input;           /* this request's input as chat messages (kept with the response) */
    bool store;              /* keep the conversation for previous_response_id (default true) */
    ks_api_notes notes;      /* fields ignored, tools dropped */
    /* The chat tools that are not plain function tools, by their chat name:
     * {"ns__tool": {"namespace": "ns", "name": "tool"}} for the function tools
     * of a namespace group, {"apply_patch": {"custom": true, "name": ...}} for
     * a custom (freeform) tool, which the template sees as a function taking
     * one string, "input". The output is rendered back through it
     * (ks_api_responses_output, ks_api_rstream). NULL: none. */
    json_t *tool_map;
} ks_api_resp_req;

/* previous_response_id of a request (borrowed), NULL: none; 400 on a wrong type. */
int ks_api_responses_prev_id(json_t *root, const char **id, ks_api_error *err);
/* Translates root (borrowed); history: the chat messages of the previous
 * response's conversation (borrowed, NULL: none). Every field and item is
 * checked here, with Responses names in errors; any other field is a 400
 * unsupported_parameter. */
int ks_api_responses_to_chat(json_t *root, const json_t *history, ks_api_resp_req *out, ks_api_error *err);
void ks_api_resp_req_free(ks_api_resp_req *r);

/* Output items of a parsed chat message (reasoning, message, function
 * calls; text: the content when msg is NULL), each with a fresh id. */
json_t *ks_api_responses_output(const json_t *msg, const char *text, const json_t *tool_map);

typedef struct ks_api_resp_out {
    const char *id;
    int64_t created;
    const char *model;
    const char *status;        /* "in_progress", "completed", "incomplete", "failed" */
    const char *incomplete;    /* incomplete_details.reason, NULL: none */
    const ks_api_error *error; /* status failed */
    const json_t *req;         /* the request, for the fields a response repeats (borrowed) */
    const json_t *output;      /* items (borrowed), NULL: [] */
    bool store;
    const ks_req_result *r;    /* usage, cache, timings; NULL: usage null */
} ks_api_resp_out;
/* The response object. NULL on ENOMEM. */
json_t *ks_api_responses_object(const ks_api_resp_out *o);

/* A streamed response: chat deltas (ks_api_chunk_delta_json's delta
 * objects, in the order output.c makes them) become typed events; the items
 * are built as they stream, and the final response carries them. */
typedef struct ks_api_rstream {
    int seq;                   /* sequence_number of the next event */
    json_t *items;             /* output items so far */
    int open;                  /* the open item's index, -1: none */
    int open_kind;
    int call_index;            /* the open function call's index in the chat deltas */
    json_t *tool_map;          /* ks_api_resp_req's (owned reference), NULL: none */
    ks_buf custom_args;        /* the open custom tool call's arguments so far */
} ks_api_rstream;
/* tool_map: ks_api_resp_req.tool_map (a reference is taken), may be NULL. */
void ks_api_rstream_init(ks_api_rstream *st, json_t *tool_map);
void ks_api_rstream_free(ks_api_rstream *st);
/* response.created, response.in_progress with resp (status in_progress). */
int ks_api_rstream_start(ks_api_rstream *st, const json_t *resp, ks_buf *out);
int ks_api_rstream_delta(ks_api_rstream *st, const json_t *delta, ks_buf *out);
/* Closes the open item; resp (its output set to the items) as
 * response.completed / .incomplete / .failed by its status. */
int ks_api_rstream_end(ks_api_rstream *st, json_t *resp, ks_buf *out);
/* An "error" event. */
int ks_api_rstream_error(ks_api_rstream *st, const ks_api_error *e, ks_buf *out);

/* ------------------------------------------------ Anthropic Messages (api_messages.c) */
typedef struct ks_api_msg_req {
    json_t *chat;              /* the chat request */
    int n_user_stops;          /* stop_sequences given (the chat request's first stops) */
    int mid_system;            /* the index in messages of the first system message there, -1: none */
    ks_api_notes notes;        /* fields ignored, tools dropped */
} ks_api_msg_req;
/* Translates a Messages request (root borrowed). count: for count_tokens
 * (max_tokens not required, no sampling fields). */
int ks_api_messages_to_chat(json_t *root, bool count, ks_api_msg_req *out, ks_api_error *err);
void ks_api_msg_req_free(ks_api_msg_req *r);

/* Anthropic's error body: {"type":"error","error":{"type","message"}}, the
 * type from the status (invalid_request_error, authentication_error,
 * not_found_error, request_too_large, overloaded_error, api_error...). */
json_t *ks_api_messages_error_json(const ks_api_error *e);

/* usage as Anthropic counts it: input_tokens are the prompt tokens neither
 * read from nor written to the cache. */
json_t *ks_api_messages_usage(const ks_req_result *r);

typedef struct ks_api_msg_out {
    const char *id;
    const char *model;
    const json_t *msg;          /* parsed chat message, NULL: text is the content */
    const char *text;
    const char *stop_reason;    /* end_turn, max_tokens, stop_sequence, tool_use */
    const char *stop_sequence;  /* NULL: null */
    const ks_req_result *r;
} ks_api_msg_out;
/* The message object of a non-streamed reply. NULL on ENOMEM. */
json_t *ks_api_messages_object(const ks_api_msg_out *o);

/* A streamed message: chat deltas become content blocks. */
typedef struct ks_api_mstream {
    int n_blocks;              /* blocks opened so far */
    int open_kind;             /* of the open block (0: none) */
    int call_index;
} ks_api_mstream;
/* message_start (usage: what is known when the first token is out). */
int ks_api_mstream_start(ks_api_mstream *st, const char *id, const char *model, const ks_req_result *r,
                         ks_buf *out);
int ks_api_mstream_delta(ks_api_mstream *st, const json_t *delta, ks_buf *out);
/* Closes the open block; message_delta (stop_reason, usage), message_stop. */
int ks_api_mstream_end(ks_api_mstream *st, const char *stop_reason, const char *stop_sequence,
                       const ks_req_result *r, ks_buf *out);
int ks_api_mstream_error(const ks_api_error *e, ks_buf *out);

/* Compact JSON text of obj (owned: free()); NULL on ENOMEM. Reals with 9
 * significant digits. */
char *ks_api_dump(const json_t *obj);

#endif

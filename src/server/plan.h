/*
 * plan.h — a parsed request turned into what the scheduler is given (plan.c):
 * its prompts rendered and tokenized (with the cache hints), checked against
 * the context, max_tokens fitted, the logit bias and grammar built, the cache
 * breakpoints placed, the stop strings collected.
 *
 * Nothing here knows the request's wire format: a Responses or Messages
 * request arrives here as the chat request it was translated into.
 *
 * Thread model: an HTTP thread, one plan per request; the server's template,
 * engine and render memo are shared read-only (prompt_tmpl.h).
 */
#ifndef KS_PLAN_H
#define KS_PLAN_H

#include "prompt/prompt_tmpl.h"
#include "server/prescan.h"
#include "server/server_int.h"

/* Everything a request is turned into before it is queued. */
typedef struct ks_plan {
    ks_prompt *prompts;            /* one per prompt */
    int n_prompts;
    ks_prompt_tmpl tp;             /* chat through the model's template */
    bool templated;
    const char *stops[KS_API_MAX_STOPS + 16];
    int n_stops;
    ks_logit_bias *bias;
    int n_bias;
    char *grammar;                 /* completions: from grammar / json_schema */
    int max_tokens;
    ks_cache_pin pins[KS_API_MAX_BREAKPOINTS]; /* the cache breakpoints' prefixes, ascending */
    int n_pins;
    bool tools_ignored;            /* the request has tools the chat template rendered none of */
} ks_plan;

/* Frees what the plan holds and zeroes it. Idempotent. */
void ks__plan_free(ks_plan *pl);
/* The prompts of a request, and for chat requests the cache hints and what
 * the template says about sampling and parsing. bounded: refuse a prompt
 * longer than the context could hold in bytes before tokenizing it (a
 * generation; not a token count). 0, or a KS_E* code with e filled. */
int ks__plan_prompts(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, bool bounded, ks_api_error *e);
/* A body sized before it is parsed (prescan.h), whole (next NULL) or the
 * part come so far while it comes in (server.c): KS_BODY_TOO_MANY when it
 * holds more keys and values than KS_BODY_ITEMS_BASE and
 * KS_BODY_ITEMS_PER_TOKEN per token of context (any route), KS_BODY_TOO_LONG
 * when the strings the chat template is known to copy, in the route's
 * shape, are more than the context holds (counted as refused before
 * render), else 0. With next, scans only once len has passed a bound and
 * *next, and sets *next (0 at the start of a body) to twice len. */
enum { KS_BODY_TOO_LONG = 1400, KS_BODY_TOO_MANY = 1413, KS_BODY_TOO_MUCH_ELSE = 1414 };
#define KS_BODY_ITEMS_BASE 262144
/* KS_BODY_TOO_MUCH_ELSE: the fields outside what the template renders (a
 * chat, Responses or Messages body's top-level values other than its
 * messages, input, system, instructions and tools: response formats,
 * grammars, sampling fields, metadata, unknown fields) hold more than this
 * many bytes (issue 42: a 15 MB unknown field cost 37 MB each to parse and
 * was then ignored). */
#define KS_BODY_ELSE_MAX (4u << 20)
/* ... or more than this many JSON keys and values: a response format's
 * schema of 10^5 nodes would be parsed (a tree of ~100 bytes a node) before
 * schemasize.h refused it; real schemas stay within a few thousand (issue 41). */
#define KS_BODY_ELSE_ITEMS 131072
#define KS_BODY_ITEMS_PER_TOKEN 4
int ks__plan_body(ks_server *s, ks_smodel *m, ks_prescan_shape shape, const char *body, size_t len, uint64_t *next);
/* The error of a body ks__plan_body refused (why: its result): 413
 * request_too_large, or the 400 context_length_exceeded of ks__plan_prompts. */
void ks__plan_body_error(ks_server *s, ks_smodel *m, int why, ks_api_error *e);
/* A parsed request's JSON schemas (response format, tools' parameters)
 * sized before any grammar is built from them (schemasize.h): 0, or
 * KS_EINVAL with e filled (400 schema_too_large). */
int ks__plan_schemas(const ks_api_request *rq, ks_api_error *e);
/* A parsed chat request sized before its render: its schemas
 * (ks__plan_schemas), then the strings its template is known to copy
 * (presize.h), the 400 context_length_exceeded of ks__plan_prompts when
 * they are more than the context holds. 0, or KS_EINVAL / KS_ECTX with e
 * filled (the latter counted as refused before render). */
int ks__plan_presize(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_api_error *e);
/* The 400 of a prompt that does not fit the context (context_length_exceeded,
 * one wording for every cause): fmt says what is known of its length
 * ("resulted in %d tokens"). Returns KS_ECTX. */
int ks__plan_ctx_error(const ks_server *s, const ks_smodel *m, const ks_api_request *rq, ks_api_error *e, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Checks the prompts against the context and picks max_tokens. */
int ks__plan_fit(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, ks_api_error *e);
/* logit_bias as token biases; ids checked against the vocabulary. */
int ks__plan_bias(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, ks_api_error *e);
/* The grammar: the template's (chat) or the request's (completions). */
int ks__plan_grammar(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, ks_api_error *e);
/* The cache breakpoints' token positions (chat through the template). */
void ks__plan_pins(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl);
/* The request's stop strings, then the template's. */
void ks__plan_stops(const ks_api_request *rq, ks_plan *pl);
/* The sampling the request adds (engine.h); borrows from rq and pl. */
ks_sample_ext ks__plan_ext(const ks_api_request *rq, const ks_plan *pl);

#endif

/*
 * prompt_tmpl.h — a chat request rendered with the model's own Jinja
 * template through llama.cpp's common library (engine/chat_tmpl.h), as
 * llama-server renders it: the prompt's tokens and cache hints (prompt.h),
 * plus what sampling and output parsing need for tools and structured
 * output (grammar, lazy triggers, stop strings, preserved tokens, parser).
 *
 * The server's path; ks_chat keeps llama.cpp's built-in templates (prompt.h),
 * so that libkvstash stays plain C. A library of its own (ks_prompt_tmpl):
 * it needs the C++ common library and jansson.
 *
 * Cache hints. Everything besides the messages that changes the prompt
 * (tools, tool_choice, template kwargs, response format, reasoning options)
 * is hashed into a leading pseudo-message, so a different tool list is a
 * different IMC branch and a different SPC key; each message is hashed as its
 * canonical JSON (sorted keys), so tool calls, tool results and their ids
 * are part of it. The SPC key is set when the leading system message,
 * rendered alone with the same tools and options, is a token prefix of the
 * prompt (with tools, most templates put them in that system block).
 *
 * Thread model: as prompt.h; the template is only read (chat_tmpl.h).
 */
#ifndef KS_PROMPT_TMPL_H
#define KS_PROMPT_TMPL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/chat_tmpl.h"
#include "prompt/prompt.h"

typedef struct ks_prompt_tmpl {
    ks_prompt p;               /* tokens; hints: msg_hashes has n_msgs + 2 values (the
                                  options pseudo-message first), p.n_msgs = messages + 1 */
    char *grammar;             /* GBNF, NULL: none */
    bool grammar_lazy;
    char **trigger_patterns;   /* lazy triggers as regexes */
    int n_trigger_patterns;
    int32_t *trigger_tokens;
    int n_trigger_tokens;
    int32_t *grammar_prefill;  /* tokens the grammar accepts first (the generation prompt) */
    int n_grammar_prefill;
    int32_t *preserved;        /* single-token specials the output shows as text (sorted) */
    int n_preserved;
    char **stops;              /* the template's additional stop strings */
    int n_stops;
    char *parse;               /* parse options for ks_chat_tmpl_parse (JSON text) */
    char *format;              /* the output format's name, for the logs */
} ks_prompt_tmpl;

/* Renders req (chat_tmpl.h's request object: messages, tools, ...) and
 * tokenizes it. out must be zeroed or freed. Errors: KS_EINVAL (the
 * request or its schema cannot be rendered: err says why, a client error),
 * KS_ETEMPLATE (the template raised), KS_ECTX (the rendered prompt is
 * longer than o->max_bytes: not tokenized), KS_ENOMEM; out is freed then. */
int ks_prompt_tmpl_chat(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, const ks_prompt_opts *o,
                        ks_prompt_tmpl *out, char *err, size_t errlen);

/* Where a cache breakpoint after messages[upto] of req falls in the prompt
 * full (req's own tokens): the longest token prefix full shares with req
 * rendered with messages[0..upto] only and no generation prompt. 0 when that
 * render fails (a template may refuse a conversation ending there) or
 * shares nothing. Costs one render and one tokenization. */
int ks_prompt_tmpl_prefix_len(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, int upto,
                              const ks_tokens *full);

/* true when tok is in preserved[0, n) (sorted, as ks_prompt_tmpl keeps it;
 * a caller may keep the array after the rest is freed). */
bool ks_prompt_tmpl_preserved(const int32_t *preserved, int n, int32_t tok);

/* NULL-safe, idempotent. */
void ks_prompt_tmpl_free(ks_prompt_tmpl *p);

#endif

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
 * Renders cost what the conversation weighs. A coding agent's request is
 * 20-30K tokens, and the hints and breakpoints used to render and tokenize
 * parts of it again (the system message with its tools for the SPC key, the
 * conversation up to each cache breakpoint): about 0.45 s per request on two
 * CPU cores for Claude Code's, more than the whole cached turn. Now:
 *  - a breakpoint on the last message of a request that ends with the
 *    generation prompt is the prompt without it (ks_prompt_tmpl.n_gen_prompt
 *    trailing tokens): no render;
 *  - what another render found (the system message alone, a breakpoint's
 *    prefix) is remembered in a ks_prompt_memo by the canonical JSON of what
 *    was rendered, with a hash of the tokens it found; a request whose prompt
 *    starts with those very tokens takes the length from there.
 * A length taken either way is a token prefix of this request's prompt,
 * checked; whether it is the one the render would find again is what the
 * memo's key (the same render input) and the generation prompt's tokens say.
 *
 * Thread model: as prompt.h; the template is only read (chat_tmpl.h). A
 * ks_prompt_memo is shared by any number of threads (a mutex guards it).
 */
#ifndef KS_PROMPT_TMPL_H
#define KS_PROMPT_TMPL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/chat_tmpl.h"
#include "engine/media.h"
#include "engine/tokcache.h"
#include "prompt/prompt.h"

/* A chat prompt's images and audio: the rendered text holds one
 * ks_media_marker() per item, in the order of items, and the prompt is
 * tokenized with the projector (media.h: each item's chunks become
 * pseudo-tokens, and the prompt's media set goes with the tokens). The
 * cache hints need nothing more: the message JSON they hash carries each
 * item's SHA-256 (server/api_media.c). */
typedef struct ks_prompt_media {
    ks_media *mm;               /* the engine's projector */
    const ks_media_item *items; /* borrowed for the call */
    int n_items;
} ks_prompt_media;

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
    char *parse;               /* parse options for ks_chat_tmpl_parse (JSON text, opaque: read
                                  it through the fields here, never by parsing it) */
    bool continuation;         /* the last assistant message is continued (continue_final_message,
                                  or a prefill): the output parser sees its text again first */
    char *format;              /* the output format's name, for the logs */
    int n_gen_prompt;          /* p.tokens ends with the generation prompt's this many tokens
                                  (0: it does not, e.g. a continued final message) */
    ks_media_set *media;       /* the prompt's media (one reference, dropped by
                                  ks_prompt_tmpl_free), NULL: none */
} ks_prompt_tmpl;

/* Render results remembered across requests (see above): at most n entries,
 * the oldest replaced. NULL on ENOMEM; free(NULL) is a no-op. */
typedef struct ks_prompt_memo ks_prompt_memo;
ks_prompt_memo *ks_prompt_memo_create(int n);
void ks_prompt_memo_free(ks_prompt_memo *m);
/* Renders answered from the memo / done and remembered, since created. */
void ks_prompt_memo_stats(ks_prompt_memo *m, uint64_t *hits, uint64_t *misses);
/* Renders with this memo are tokenized through tc (engine/tokcache.h: the
 * pieces of text seen before are not tokenized again), in the memo's
 * namespace; borrowed, set before the memo is shared; NULL: none. */
void ks_prompt_memo_use_tokcache(ks_prompt_memo *m, struct ks_tokcache *tc);

/* Renders req (chat_tmpl.h's request object: messages, tools, ...) and
 * tokenizes it (with o->media's items when it has any). out must be zeroed
 * or freed. Errors: KS_EINVAL (the request or its schema cannot be
 * rendered: err says why, a client error), KS_ETEMPLATE (the template
 * raised), KS_ECTX (the rendered prompt is longer than o->max_bytes: not
 * tokenized), KS_EDECODE (the media could not be tokenized: err says why,
 * "media item N ..." when one item is the cause; a client error),
 * KS_ENOMEM; out is freed then.
 * Breakpoints (ks_prompt_tmpl_prefix_len_ns with the prompt's media set)
 * render the text with its markers and step over each item's run in the
 * prompt: a breakpoint after an image falls after the image. */
int ks_prompt_tmpl_chat(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, const ks_prompt_opts *o,
                        ks_prompt_memo *memo, ks_prompt_tmpl *out, char *err, size_t errlen);

/* Where a cache breakpoint after messages[upto] of req falls in the prompt
 * full (req's own tokens, from ks_prompt_tmpl_chat, whose n_gen_prompt is
 * n_gen_prompt): the longest token prefix full shares with req rendered with
 * messages[0..upto] only and no generation prompt. 0 when that render fails
 * (a template may refuse a conversation ending there) or shares nothing.
 * Costs one render and one tokenization unless the breakpoint is on the last
 * message or memo (may be NULL) holds it. */
int ks_prompt_tmpl_prefix_len(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, int upto,
                              const ks_tokens *full, int n_gen_prompt, ks_prompt_memo *memo);
/* The same with memo entries in namespace ns (ks_prompt_opts.memo_ns), and
 * full's media set (ks_prompt_tmpl.media; NULL: none): each media marker of
 * the render steps over its item's run in full, where every item is one run
 * (images); otherwise the prefix stops at the first marker. */
int ks_prompt_tmpl_prefix_len_ns(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, int upto,
                                 const ks_tokens *full, const ks_media_set *media, int n_gen_prompt,
                                 ks_prompt_memo *memo, uint64_t ns);

/* true when tok is in preserved[0, n) (sorted, as ks_prompt_tmpl keeps it;
 * a caller may keep the array after the rest is freed). */
bool ks_prompt_tmpl_preserved(const int32_t *preserved, int n, int32_t tok);

/* NULL-safe, idempotent. */
void ks_prompt_tmpl_free(ks_prompt_tmpl *p);

#endif

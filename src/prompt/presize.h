/*
 * presize.h — a lower bound on the bytes a chat template will render for a
 * request, computed from the request alone, before any render (issue 28:
 * a 1.5 MB tools array cost 4.9 s and ~490 MB to render before the context
 * check refused it).
 *
 * The bound counts only strings the template is known to copy into the
 * prompt. Which ones it copies is found once per template by a probe
 * (ks_presize_probe): one render of a small request whose strings are
 * unique sentinels — two system/user messages' contents, two tools' names
 * and descriptions, a parameter's name and description — and two more, one
 * with an assistant's content (a turn before the last user message) and one
 * with a tool's result, each alone so that a template refusing one of them
 * leaves the others counted. A kind of string
 * counts only when every one of its sentinels appears whole in the probe's
 * output; a template that fails the probe counts nothing (the bound is 0,
 * no request is refused before its render).
 *
 * Soundness: rendering copies a string (escaped for JSON or not: never
 * shorter) or drops it; the one change templates commonly make is trimming
 * the whitespace around a message's content, so contents count trimmed. The
 * assumption — a template that shows a probe's string whole shows every
 * string of that kind whole — is what makes the bound a bound: with it, a
 * request refused here would have rendered to more bytes, which is more
 * tokens than the context (the caller divides by the vocabulary's longest
 * token), so no request that fits is ever refused. The probe renders with
 * the template's default variables: a request's chat_template_kwargs are
 * assumed not to make it drop such strings (true of every template in the
 * test set, tests/unit/test_presize.c; a template whose variables did would
 * need its probe per variable set).
 *
 * Thread model: ks_presize_probe once, at start; ks_presize_bytes then reads
 * the result only and may run on any number of threads.
 */
#ifndef KS_PRESIZE_H
#define KS_PRESIZE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine/chat_tmpl.h"

/* The roles whose message contents are counted (KS_PRESIZE_*). An
 * assistant's content counts from after its last "</think>" (reasoning
 * templates cut what comes before: Qwen3's, DeepSeek-R1's); a tool message's
 * is a tool's result (issue 42: a 15 MB assistant message or tool result
 * cost 206-264 MB to render before the context check refused it). */
enum { KS_PRESIZE_SYSTEM, KS_PRESIZE_USER, KS_PRESIZE_ASSISTANT, KS_PRESIZE_TOOL, KS_PRESIZE_ROLES };

typedef struct ks_presize {
    bool content[KS_PRESIZE_ROLES]; /* message contents copied, by role (above) */
    bool tool_name, tool_desc, param_name, param_desc;
} ks_presize;

/* Probes t (one render). Never fails: a template that cannot render the
 * probe leaves every kind uncounted. t may be NULL (nothing counted). */
void ks_presize_probe(const ks_chat_tmpl *t, ks_presize *out);

/* The lower bound, in bytes, of what the template renders for req (the
 * object given to ks_chat_tmpl_apply: messages, tools). Walks req once,
 * allocating nothing. */
size_t ks_presize_bytes(const ks_presize *p, const json_t *req);

/* The presize kind of a message role: KS_PRESIZE_*, -1 for a role not
 * counted ("developer" is a system message). */
int ks_presize_role(const char *role);

/* The bytes of s[0, n) a reasoning template keeps of an assistant's content:
 * after the last "</think>", trimmed. */
size_t ks_presize_after_think(const char *s, size_t n);

#endif

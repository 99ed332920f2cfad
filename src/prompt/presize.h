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
 * and descriptions, a parameter's name and description. A kind of string
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

typedef struct ks_presize {
    bool content[2];     /* message contents copied: [0] system, [1] user */
    bool tool_name, tool_desc, param_name, param_desc;
} ks_presize;

/* Probes t (one render). Never fails: a template that cannot render the
 * probe leaves every kind uncounted. t may be NULL (nothing counted). */
void ks_presize_probe(const ks_chat_tmpl *t, ks_presize *out);

/* The lower bound, in bytes, of what the template renders for req (the
 * object given to ks_chat_tmpl_apply: messages, tools). Walks req once,
 * allocating nothing. */
size_t ks_presize_bytes(const ks_presize *p, const json_t *req);

#endif

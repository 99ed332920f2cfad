/*
 * lptext.h — the logprobs of a whole (non-streamed) reply, kept as the JSON
 * text they become, not as a JSON tree (issue 28: `n: 16`, `max_tokens:
 * 1000`, `top_logprobs: 20` built a tree of 16,000 entries of 21
 * alternatives each and a deep copy of it, ~630 MB peak for a 23 MB reply).
 *
 * Each token's entry is serialised when it is sampled (the same jansson
 * dump as before: byte for byte the same reply) and appended to the
 * choice's text; the reply object carries a placeholder string in its
 * "logprobs" field, and ks_lptext_splice puts each choice's text in its
 * place in the dumped reply. A reply's memory is then bounded by what it
 * returns: at most about three times its bytes at the moment of the splice
 * (the logprobs text with its buffers' slack, and the reply), against ~27
 * times before (docs/SERVER.md "Memory").
 *
 * Thread model: one choice's ks_lptext is written by the inference thread
 * under the generation's mutex and read by the connection thread once every
 * choice is done (gen.c); the functions themselves are reentrant.
 */
#ifndef KS_LPTEXT_H
#define KS_LPTEXT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"

typedef struct ks_lptext {
    bool legacy;    /* completions: parallel arrays (tokens, token_logprobs, top_logprobs,
                       text_offset); else chat: {"content": [entries], "refusal": []} */
    bool bare;      /* not legacy: the entries' array alone (llama-server's /completion) */
    ks_buf part[4]; /* chat: [0] the entries; legacy: the four arrays' elements */
    size_t offset;  /* legacy: text_offset of the next token */
    int n;
    bool failed;    /* out of memory: the reply is a 500 */
} ks_lptext;

/* Appends one entry ({token, logprob, bytes, top_logprobs: [{token,
 * logprob, bytes}]}, borrowed). Sets t->failed on ENOMEM. */
void ks_lptext_add(ks_lptext *t, const json_t *entry);
void ks_lptext_free(ks_lptext *t);

/* The placeholder of choice i (new reference; NULL on ENOMEM): the reply's
 * "logprobs" value until the splice. */
json_t *ks_lptext_placeholder(int i);

/* The reply body: body (len bytes, a compact dump of the reply) with the
 * placeholder of each choice i < n whose lpt[i] is not NULL replaced by
 * that choice's logprobs text. A placeholder the format did not write is
 * skipped. Returns a malloc'd body (*out_len bytes, NUL-terminated) or NULL
 * (ENOMEM, or a failed lpt). */
char *ks_lptext_splice(const char *body, size_t len, ks_lptext *const *lpt, int n, size_t *out_len);

#endif

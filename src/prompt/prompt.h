/*
 * prompt.h — a request's prompt as the scheduler sees it: the messages
 * rendered with the model's chat template and tokenized (or raw text or
 * token ids), plus the cache hints derived from the messages.
 *
 * The one place where messages become tokens, for both ks_chat and the
 * server, so templates, tools and grammars are added here once.
 *
 * Cache hints (optional: they only steer routing, the scheduler compares
 * tokens before it reuses anything, so a failure here costs hits, never
 * correctness):
 *  - msg_hashes: the chained hashes of every message prefix (IMC,
 *    cache/msghash.h), n_msgs + 1 of them;
 *  - sys_key / n_sys_tokens: for a leading system message whose rendering
 *    alone (as the template renders it at the head of a conversation) is
 *    exactly the prompt's first tokens, its SPC key and token count. Some
 *    templates render a lone system message differently: then no key.
 *
 * Thread model: the functions only read the engine's model (tokenizer,
 * template), which is safe from any thread (engine.h); a ks_prompt belongs
 * to one thread at a time.
 */
#ifndef KS_PROMPT_H
#define KS_PROMPT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/engine.h"

typedef struct ks_prompt {
    ks_tokens tokens;      /* the whole prompt */
    uint64_t *msg_hashes;  /* n_msgs + 1 message-prefix hashes, or NULL (owned) */
    int n_msgs;
    uint64_t sys_key;      /* SPC key of the leading system message, 0: none */
    int n_sys_tokens;      /* its tokens, a prefix of the prompt; 0: none */
} ks_prompt;

typedef struct ks_prompt_opts {
    bool hints;            /* compute msg_hashes and the SPC key */
    const char *model_id;  /* what besides the text makes a system prompt's KV differ
                              (model, context parameters): part of the SPC key */
    int64_t max_bytes;     /* > 0: a rendered prompt longer than this is refused with
                              KS_ECTX before it is tokenized (the caller's bound of a
                              prompt that cannot fit its context); 0: none */
    uint64_t memo_ns;      /* the render memo's namespace (prompt_tmpl.h): the server's
                              tenant, so that a render remembered for one tenant never
                              saves another one's time; 0: the shared one */
    const struct ks_prompt_media *media; /* the prompt's images and audio (prompt_tmpl.h; the
                                            server's chat path only); NULL: none */
} ks_prompt_opts;

/* Renders msgs[0, n) (n >= 1) with the model's template, ending with the
 * assistant header, tokenizes (BOS as the model wants, special tokens
 * parsed) into out->tokens, and with o->hints the cache hints. out must be
 * zeroed or freed. Errors: KS_ETEMPLATE (the template cannot render these
 * messages), KS_ECTX (longer than o->max_bytes), KS_ENOMEM, KS_EINVAL
 * (tokenization failed); out is freed then. */
int ks_prompt_chat(const ks_engine *e, const ks_msg *msgs, int n, const ks_prompt_opts *o, ks_prompt *out);

/* Just the tokens of msgs rendered as above, appended to a cleared *toks
 * (for sizing a conversation to the context). Errors as ks_prompt_chat. */
int ks_prompt_render(const ks_engine *e, const ks_msg *msgs, int n, ks_tokens *toks);

/* A raw text prompt (completions): tokenized as above, no hints. */
int ks_prompt_text(const ks_engine *e, const char *text, ks_prompt *out);

/* Token ids given by the client. KS_EINVAL with *bad = the index of the first
 * id outside the vocabulary; KS_ENOMEM. */
int ks_prompt_ids(const ks_engine *e, const int32_t *ids, int n, ks_prompt *out, int *bad);

/* Frees what a ks_prompt holds and zeroes it. NULL-safe, idempotent. */
void ks_prompt_free(ks_prompt *p);

#endif

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

/* A fill-in-the-middle prompt (the server's /infill), built as llama-server's
 * format_prompt_infill builds it, token for token, in the repository-level
 * pattern (arXiv 2409.12186) where the model has <|repo_name|> and
 * <|file_sep|>:
 *   [REP]myproject\n [SEP]filename0\n text0 ... [SEP]filename\n
 *   [BOS] [PRE] prefix prompt [SUF] suffix [MID]
 * (spm: [SUF] suffix [PRE] prefix prompt [MID]). Without a file separator
 * each extra chunk follows a "\n\n--- snippet ---\n\n" line. The prefix keeps
 * its last 3/4 of n_batch tokens, the suffix its first n_batch/4 - 2 -
 * |prompt|, the extra context its last n_ctx - n_batch - 2 n_predict: the
 * files come first, so a client that sends the same ones each time finds
 * them in the prefix cache. prefix, suffix, chunks: tokenized with no
 * specials parsed (code that holds "<|fim_prefix|>" stays text); prompt:
 * specials parsed. KS_EINVAL when the model has no prefix, suffix or middle
 * token; KS_ENOMEM. */
typedef struct ks_prompt_infill_chunk {
    const char *filename; /* "tmp" when NULL */
    const char *text;
} ks_prompt_infill_chunk;
typedef struct ks_prompt_infill_in {
    const char *prefix, *suffix; /* the code before and after the cursor */
    const char *prompt;          /* after the prefix; NULL or "": none */
    const ks_prompt_infill_chunk *extra;
    int n_extra;
    int n_batch, n_ctx, n_predict; /* the server's (n_predict -1: unbounded) */
    bool spm;                    /* suffix-prefix-middle order (--spm-infill) */
} ks_prompt_infill_in;
int ks_prompt_infill(const ks_engine *e, const ks_prompt_infill_in *in, ks_prompt *out);

/* Frees what a ks_prompt holds and zeroes it. NULL-safe, idempotent. */
void ks_prompt_free(ks_prompt *p);

#endif

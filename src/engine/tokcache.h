/*
 * tokcache.h — a rendered chat prompt tokenized piece by piece, the pieces
 * seen before taken from a cache: a conversation sent again with one message
 * more costs the tokenization of that message, not of the conversation.
 *
 * Why: llama.cpp tokenizes a prompt by first splitting it at every special
 * token's text (for each special token, a search of the whole text), then
 * running the tokenizer over each plain fragment. For a coding agent's
 * 30K-token conversation that is ~12 ms per request on a CPU core, every
 * request, for text that is the same as the last one's but for its end —
 * the largest part of a fully cached request's time outside the model on a GPU.
 *
 * Contract: ks_tokcache_tokenize(c, ns, text, len, out) appends to out exactly
 * what ks_engine_tokenize(e, text, len, true, true, out) appends: BOS as the
 * model wants, special tokens parsed. The text is cut before an occurrence of
 * a special token's text only where llama.cpp's split provably starts a
 * fragment there, so that tokenizing the pieces one by one (the first with
 * BOS, the others without) gives the whole text's tokens (docs/LLAMA_FACTS.md,
 * "Tokenizing in pieces"):
 *  - the vocabulary is SPM ("llama") or plain BPE ("gpt2"), whose tokenizers
 *    run each fragment alone (SPM's space prefix after a special token holds
 *    in a piece that starts with one), and adds no EOS;
 *  - the special token at the cut is the longest one matching there, has no
 *    left-strip attribute (which would reach into the piece before), and no
 *    special token's text straddles the cut;
 *  - the piece's tokens start with that special token (checked after each
 *    tokenization: otherwise the whole text is tokenized as one).
 * With KS_TOKCACHE_CHECK=1 in the environment every result is compared with
 * the whole text's tokenization; a difference aborts the process (the tests
 * run their servers so).
 *
 * Pieces are kept with their bytes (compared on every hit: a hash only finds
 * them), their namespace ns (the server's tenant: one tenant's text never
 * saves another one's time) and whether they began a text (BOS), up to a
 * budget of bytes (tokens, text and entry), least recently used first out.
 *
 * Thread model: any number of threads; a mutex guards the table, and the
 * tokenizer runs outside it (read-only on the vocabulary).
 */
#ifndef KS_TOKCACHE_H
#define KS_TOKCACHE_H

#include <stddef.h>
#include <stdint.h>

#include <stdbool.h>

#include "base/base.h"

struct ks_engine;
typedef struct ks_tokcache ks_tokcache;

/* A cache of at most max_bytes for e's vocabulary (which must outlive
 * it). NULL when out of memory. A vocabulary it cannot cut (see above) gets a
 * cache that tokenizes every text whole. */
ks_tokcache *ks_tokcache_create(const struct ks_engine *e, size_t max_bytes);
void ks_tokcache_free(ks_tokcache *c);

/* As ks_engine_tokenize(e, text, len, true, true, out), for c's engine.
 * Errors as ks_engine_tokenize. */
int ks_tokcache_tokenize(ks_tokcache *c, uint64_t ns, const char *text, size_t len, ks_tokens *out);

/* Puts the pieces of a token list into the cache, as if its text had been
 * tokenized (ns as above): the list is cut before the special tokens a text
 * is cut at, each run is turned back into text, and kept only where that text
 * tokenizes to the very run (the first with BOS when the model adds one; a
 * media pseudo-token ends the list). For a restarted process: the
 * conversations warm start put into slots come back first, and their renders
 * then find their pieces. Returns the pieces kept. */
int ks_tokcache_seed(ks_tokcache *c, uint64_t ns, const int32_t *tok, int n);

typedef struct ks_tokcache_stats {
    uint64_t hit_tokens;  /* tokens taken from the cache */
    uint64_t miss_tokens; /* tokens tokenized (pieces not in it, or whole texts) */
    uint64_t whole;       /* texts tokenized whole: no cut, or a cut that did not hold */
    size_t bytes;         /* what the pieces held now take */
    int entries;          /* pieces held now */
    bool pieces;          /* whether this vocabulary is cut at all */
} ks_tokcache_stats;
void ks_tokcache_get_stats(ks_tokcache *c, ks_tokcache_stats *st);

#endif

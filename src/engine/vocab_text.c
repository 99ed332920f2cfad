/*
 * vocab_text.c — tokenizing with a llama vocabulary into a ks_tokens: the one
 * place that sizes llama_tokenize's output (engine_text.c's
 * ks_engine_tokenize, tokcache.c's pieces). Apart from engine_text.c so that
 * a tool with a vocabulary but no engine (bench/tokcache_vocabs.c) links it.
 *
 * Thread model: reads the vocabulary only; any thread.
 */
#include <limits.h>

#include "engine/engine_int.h"
#include "llama.h"

int ks__vocab_tokenize(const struct llama_vocab *v, const char *text, size_t len, bool add_special,
                       bool parse_special, ks_tokens *out) {
    if (len > INT32_MAX / 2) return KS_EINVAL;
    int cap = (int)len + 8;
    int rc = ks_tokens_reserve(out, out->n + cap);
    if (rc) return rc;
    int n = llama_tokenize(v, text, (int32_t)len, out->v + out->n, cap, add_special, parse_special);
    if (n < 0) {
        rc = ks_tokens_reserve(out, out->n - n);
        if (rc) return rc;
        n = llama_tokenize(v, text, (int32_t)len, out->v + out->n, -n, add_special, parse_special);
        if (n < 0) return KS_EINVAL;
    }
    out->n += n;
    return 0;
}

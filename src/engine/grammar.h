/*
 * grammar.h — llama.cpp's grammar sampler behind calls that never throw.
 *
 * llama.cpp's grammar code throws C++ exceptions through its C API: a
 * trigger pattern that is no valid std::regex (at init), a token whose text
 * the grammar cannot take (at accept: "Unexpected empty grammar stack"), a
 * regex search that gives up (at accept, while a lazy grammar waits for its
 * trigger). An exception reaching the C frames of the inference thread would
 * terminate the process; grammar.cpp catches each one and returns a code.
 * Internal to src/engine/ (engine.c); the rest of the project goes through
 * ks_sampler_* in engine.h.
 *
 * Thread model: as the sampler it guards (init on any thread, accept on the
 * thread that samples).
 */
#ifndef KS_GRAMMAR_H
#define KS_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct llama_sampler;
struct llama_vocab;

/* llama_sampler_init_grammar (lazy: _lazy_patterns with the triggers) with
 * root rule "root". 0 and *out; KS_EINVAL when llama.cpp refuses the grammar
 * (*out NULL; err: the exception's message, or "" when llama.cpp returned
 * NULL, having logged its reason) or KS_ENOMEM. */
int ks__grammar_init(const struct llama_vocab *vocab, const char *gbnf, bool lazy, const char *const *patterns,
                     int n_patterns, const int32_t *tokens, int n_tokens, struct llama_sampler **out, char *err,
                     size_t errlen);
/* llama_sampler_accept(g, tok). 0; KS_EINVAL when it threw (err: its
 * message; KS_ENOMEM for std::bad_alloc): the grammar's state is then undefined (its stacks may be empty,
 * which llama.cpp asserts on at the next apply) and it must not be used
 * again but to free it. Never call it with an end-of-generation token the
 * grammar does not allow: llama.cpp aborts on that one (GGML_ABORT). */
int ks__grammar_accept(struct llama_sampler *g, int32_t tok, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif

/*
 * grammar.cpp — see grammar.h. C++ only to catch: no template of the standard
 * library is instantiated here, so libkvstash.so exports nothing new.
 */
#include "engine/grammar.h"

#include <cstdio>
#include <exception>
#include <new>

#include "llama.h"

extern "C" {
#include "base/base.h"
}

int ks__grammar_init(const struct llama_vocab *vocab, const char *gbnf, bool lazy, const char *const *patterns,
                     int n_patterns, const int32_t *tokens, int n_tokens, struct llama_sampler **out, char *err,
                     size_t errlen) {
    *out = nullptr;
    if (errlen) err[0] = '\0';
    try {
        if (lazy)
            *out = llama_sampler_init_grammar_lazy_patterns(vocab, gbnf, "root", const_cast<const char **>(patterns),
                                                            (size_t)n_patterns, tokens, (size_t)n_tokens);
        else
            *out = llama_sampler_init_grammar(vocab, gbnf, "root");
    } catch (const std::bad_alloc &) {
        return KS_ENOMEM;
    } catch (const std::exception &ex) {
        /* std::regex_error from a trigger pattern. llama.cpp leaks its
         * sampler's small context object on this path (it is allocated
         * before the grammar); nothing to free here. */
        std::snprintf(err, errlen, "%s", ex.what());
        return KS_EINVAL;
    } catch (...) {
        std::snprintf(err, errlen, "unknown exception from llama.cpp's grammar");
        return KS_EINVAL;
    }
    return *out ? 0 : KS_EINVAL;
}

int ks__grammar_accept(struct llama_sampler *g, int32_t tok, char *err, size_t errlen) {
    if (errlen) err[0] = '\0';
    try {
        llama_sampler_accept(g, tok);
    } catch (const std::bad_alloc &) {
        std::snprintf(err, errlen, "out of memory");
        return KS_ENOMEM;
    } catch (const std::exception &ex) {
        std::snprintf(err, errlen, "%s", ex.what());
        return KS_EINVAL;
    } catch (...) {
        std::snprintf(err, errlen, "unknown exception from llama.cpp's grammar");
        return KS_EINVAL;
    }
    return 0;
}

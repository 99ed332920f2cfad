/*
 * tokcache_vocabs — the tokenization cache (src/engine/tokcache.h) against
 * llama.cpp's own tokenizer on real vocabularies: for each vocabulary-only
 * GGUF given (llama.cpp's repository has them under models/ggml-vocab-*.gguf;
 * none is downloaded here), 3,000 random texts built from its special tokens'
 * texts, halves of them, whitespace, code and other scripts, each tokenized
 * twice (the second time mostly from the cache), compared token for token
 * with llama_tokenize on the whole text. Exit 1 on any difference.
 *
 *   build/tokcache_vocabs path/to/ggml-vocab-*.gguf
 *
 * Built against tokcache.c alone: the two engine accessors it uses are
 * defined here over a vocabulary-only model (no ks_engine, no weights).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokcache.h"
#include "llama.h"

struct ks_engine;
static const struct llama_vocab *g_vocab;
static const struct llama_model *g_model;
const struct llama_vocab *ks__engine_vocab(const struct ks_engine *e) { (void)e; return g_vocab; }
const struct llama_model *ks__engine_model(const struct ks_engine *e) { (void)e; return g_model; }

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

static const char *const PLAIN[] = {
    " ", "  ", "\n", "\n\n", "\t", " \n ", "hello", " world", "The", " quick", "brown", " fox.",
    "def f(x):\n    return x", "{\"a\": [1, 2]}", "caf\xc3\xa9", " \xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x99\x82",
    "12345", "  indented", "<", ">", "<|", "|>", "[", "]", "system", "user", "assistant", "'s", " don't", "  \n\n  ",
};
#define N_PLAIN (sizeof PLAIN / sizeof PLAIN[0])

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s VOCAB.gguf...\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    llama_log_set(NULL, NULL);
    int bad = 0;
    static char buf[1 << 16];
    for (int a = 1; a < argc; a++) {
        struct llama_model_params mp = llama_model_default_params();
        mp.vocab_only = true;
        struct llama_model *m = llama_model_load_from_file(argv[a], mp);
        if (!m) {
            printf("%s: cannot load\n", argv[a]);
            bad++;
            continue;
        }
        g_model = m;
        g_vocab = llama_model_get_vocab(m);
        int nv = llama_vocab_n_tokens(g_vocab), ns = 0;
        const char **sp = malloc(sizeof *sp * (size_t)nv);
        for (int i = 0; sp && i < nv; i++)
            if (llama_vocab_get_attr(g_vocab, i) &
                (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN))
                sp[ns++] = llama_vocab_get_text(g_vocab, i);
        ks_tokcache *c = ks_tokcache_create(NULL, 64u << 20);
        if (!sp || !c) return 1;
        int fails = 0;
        for (int r = 0; r < 3000; r++) {
            size_t n = 0;
            for (int i = 0, k = (int)(rnd() % 80); i < k; i++) {
                char half[256];
                const char *f;
                int w = (int)(rnd() % 10);
                if (w < 4 && ns) {
                    f = sp[rnd() % (uint64_t)(ns < 40 || rnd() % 2 ? ns : 40)];
                } else if (w == 4 && ns) {
                    const char *t = sp[rnd() % (uint64_t)ns];
                    size_t h = strlen(t) ? rnd() % strlen(t) : 0;
                    if (h >= sizeof half) h = sizeof half - 1;
                    memcpy(half, t, h);
                    half[h] = '\0';
                    f = half;
                } else {
                    f = PLAIN[rnd() % N_PLAIN];
                }
                size_t l = strlen(f);
                if (n + l + 1 > sizeof buf) break;
                memcpy(buf + n, f, l);
                n += l;
            }
            for (int rep = 0; rep < 2; rep++) {
                ks_tokens p = {0};
                int cap = (int)n + 8;
                int32_t *w = malloc(sizeof *w * (size_t)cap);
                int nw = w ? llama_tokenize(g_vocab, buf, (int32_t)n, w, cap, true, true) : -1;
                if (ks_tokcache_tokenize(c, 0, buf, n, &p) || nw != p.n ||
                    memcmp(w, p.v, sizeof *w * (size_t)(nw > 0 ? nw : 0)) != 0)
                    fails++;
                free(w);
                ks_tokens_free(&p);
            }
        }
        ks_tokcache_stats s;
        ks_tokcache_get_stats(c, &s);
        const char *name = strrchr(argv[a], '/');
        printf("%-32s %s, %5d special tokens: %s; %d of 6000 differ; tokens from the cache %llu, tokenized %llu, "
               "texts whole %llu\n",
               name ? name + 1 : argv[a], llama_vocab_type(g_vocab) == LLAMA_VOCAB_TYPE_SPM ? "SPM" :
                                          llama_vocab_type(g_vocab) == LLAMA_VOCAB_TYPE_BPE ? "BPE" : "other",
               ns, s.pieces ? "cut" : "whole", fails, (unsigned long long)s.hit_tokens,
               (unsigned long long)s.miss_tokens, (unsigned long long)s.whole);
        bad += fails;
        ks_tokcache_free(c);
        free(sp);
        llama_model_free(m);
    }
    return bad != 0;
}

/*
 * mkmodel_util.h — helpers shared by the mkmodel model tests
 * (test_mkmodel.c, test_mkmodel_tmpl.c): whole files into memory and an
 * engine on a generated model. Include after cmocka.h.
 */
#ifndef KS_TEST_MKMODEL_UTIL_H
#define KS_TEST_MKMODEL_UTIL_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Whole file, NUL-terminated; *len (may be NULL) gets its size. Fails the
 * test when the file cannot be read. Owned: free(). */
static inline char *mk_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    if (len) *len = (size_t)n;
    return b;
}

static inline bool mk_same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = mk_slurp(a, &na), *y = mk_slurp(b, &nb);
    bool same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* An engine on the model at path, one thread, n_ctx_seq tokens. */
static inline ks_engine *mk_open_engine(const char *path, int n_ctx_seq) {
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = path;
    ep.n_ctx_seq = n_ctx_seq;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    char err[512] = "";
    int rc = ks_engine_open(&ep, &e, err, sizeof err);
    if (rc) fail_msg("ks_engine_open %s: %s (%s)", path, ks_strerror(rc), err);
    return e;
}

/* Prefills prompt (in batches of n_batch), then samples greedily up to n
 * tokens into out, stopping after an end-of-generation token. Returns the
 * count. */
static inline int mk_generate(ks_engine *e, const ks_tokens *prompt, int n, int32_t *out) {
    int nb = ks_engine_n_batch(e);
    ks_batch *b = ks_batch_create(nb);
    assert_non_null(b);
    int idx = 0;
    for (int p0 = 0; p0 < prompt->n; p0 += nb) {
        ks_batch_clear(b);
        for (int i = p0; i < prompt->n && i < p0 + nb; i++)
            idx = ks_batch_add(b, prompt->v[i], i, 0, i == prompt->n - 1);
        assert_int_equal(ks_engine_decode(e, b), 0);
    }
    ks_sample_params sp = {0}; /* temperature 0: greedy */
    ks_sampler *s = ks_sampler_create(e, &sp);
    assert_non_null(s);
    int got = 0;
    for (int k = 0; k < n; k++) {
        assert_non_null(ks_engine_logits(e, idx));
        int32_t tok = ks_sampler_sample(s, e, idx);
        assert_true(tok >= 0 && tok < ks_engine_n_vocab(e));
        out[got++] = tok;
        if (ks_engine_is_eog(e, tok)) break;
        ks_batch_clear(b);
        idx = ks_batch_add(b, tok, prompt->n + k, 0, true);
        assert_int_equal(ks_engine_decode(e, b), 0);
    }
    ks_sampler_free(s);
    ks_batch_free(b);
    return got;
}

/* Fails the test when a temporary file of a writer ("*.tmp.*") is left in dir. */
static inline void mk_assert_no_tmp(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp.")) fail_msg("temporary file left behind: %s", de->d_name);
    closedir(d);
}

#endif

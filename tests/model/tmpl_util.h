/*
 * tmpl_util.h — the tiny model written once per real chat template setup
 * installs (its special tokens in the vocabulary), opened with its engine and
 * template object: the fixture of test_prompt_tmpl.c and test_tokcache.c.
 * Include after cmocka.h and model/mkmodel_util.h.
 *
 * Env: KS_TEMPLATES_DIR (as ctest sets it; default build/deps/common/templates).
 */
#ifndef KS_TEST_TMPL_UTIL_H
#define KS_TEST_TMPL_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/chat_tmpl.h"
#include "engine/engine.h"
#include "engine/mkmodel.h"

typedef struct tmpl_fixture {
    ks_engine *e;
    ks_chat_tmpl *t;
} tmpl_fixture;

/* A temporary directory for the models (dir: at least 64 bytes), named after the test. */
static inline int tmpl_dir_make(char *dir, size_t n, const char *test) {
    snprintf(dir, n, "/tmp/ks_%s.XXXXXX", test);
    return mkdtemp(dir) ? 0 : -1;
}

/* The models tmpl_open wrote for templates [0, n), and the directory. */
static inline void tmpl_dir_remove(const char *dir, size_t n) {
    char p[128];
    for (size_t i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%zu.gguf", dir, i);
        unlink(p);
    }
    rmdir(dir);
}

/* The tiny model with template name (the i-th of the test: dir/i.gguf, written
 * when missing), its engine and its template object. */
static inline tmpl_fixture tmpl_open(const char *dir, size_t i, const char *name) {
    const char *tdir = getenv("KS_TEMPLATES_DIR");
    char tpath[1024], mpath[128], err[512] = "";
    snprintf(tpath, sizeof tpath, "%s/%s.jinja", tdir ? tdir : "build/deps/common/templates", name);
    snprintf(mpath, sizeof mpath, "%s/%zu.gguf", dir, i);
    if (access(mpath, F_OK) != 0) {
        char *src = mk_slurp(tpath, NULL);
        ks_mkmodel_params mp = ks_mkmodel_params_default();
        mp.chat_template = src;
        if (ks_mkmodel_write(&mp, mpath, NULL, err, sizeof err)) fail_msg("%s: %s", name, err);
        free(src);
    }
    tmpl_fixture f = {mk_open_engine(mpath, 4096), NULL};
    if (ks_chat_tmpl_create_from_file(mpath, NULL, &f.t, err, sizeof err)) fail_msg("%s: %s", name, err);
    return f;
}

static inline void tmpl_close(tmpl_fixture *f) {
    ks_chat_tmpl_free(f->t);
    ks_engine_free(f->e);
}

#endif

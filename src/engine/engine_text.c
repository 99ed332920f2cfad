/*
 * engine_text.c — the engine's text in and out (engine.h): tokenizing, token
 * pieces and special tokens, llama.cpp's built-in chat templates (ks_chat),
 * and the llama.cpp release in use. Like engine.c it includes llama.h; it
 * reaches the engine's model and vocabulary through engine_int.h.
 *
 * Thread model: every call only reads the model and vocabulary, and may run
 * on any thread (engine.h).
 */
#include "engine/engine.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "llama.h"

int ks_engine_tokenize(const ks_engine *e, const char *text, size_t len, bool add_special,
                       bool parse_special, ks_tokens *out) {
    return ks__vocab_tokenize(ks__engine_vocab(e), text, len, add_special, parse_special, out);
}

/* A media pseudo-token (media.h, negative) has no text: 0 bytes, where
 * llama.cpp would throw out of its vocabulary's bounds. */
int ks_engine_piece(const ks_engine *e, int32_t tok, char *buf, size_t n) {
    if (tok < 0) return 0;
    int r = llama_token_to_piece(ks__engine_vocab(e), tok, buf, (int32_t)n, 0, false);
    return r < 0 ? -r : r; /* negative = the size needed */
}

bool ks_engine_is_eog(const ks_engine *e, int32_t tok) { return llama_vocab_is_eog(ks__engine_vocab(e), tok); }

int ks_engine_token_text(const ks_engine *e, int32_t tok, char *buf, size_t n) {
    if (tok < 0) return 0;
    int r = llama_token_to_piece(ks__engine_vocab(e), tok, buf, (int32_t)n, 0, true);
    return r < 0 ? -r : r;
}

int32_t ks_engine_token_bos(const ks_engine *e) {
    llama_token t = llama_vocab_bos(ks__engine_vocab(e));
    return t == LLAMA_TOKEN_NULL ? -1 : t;
}

bool ks_engine_adds_bos(const ks_engine *e) { return llama_vocab_get_add_bos(ks__engine_vocab(e)); }

static int32_t tok_or_none(llama_token t) { return t == LLAMA_TOKEN_NULL ? -1 : t; }

ks_fim_tokens ks_engine_fim_tokens(const ks_engine *e) {
    const struct llama_vocab *v = ks__engine_vocab(e);
    return (ks_fim_tokens){
        .pre = tok_or_none(llama_vocab_fim_pre(v)),
        .suf = tok_or_none(llama_vocab_fim_suf(v)),
        .mid = tok_or_none(llama_vocab_fim_mid(v)),
        .pad = tok_or_none(llama_vocab_fim_pad(v)),
        .rep = tok_or_none(llama_vocab_fim_rep(v)),
        .sep = tok_or_none(llama_vocab_fim_sep(v)),
    };
}

int32_t ks_engine_token_eos(const ks_engine *e) {
    llama_token t = llama_vocab_eos(ks__engine_vocab(e));
    return t == LLAMA_TOKEN_NULL ? -1 : t;
}

const char *ks_engine_chat_template(const ks_engine *e) { return llama_model_chat_template(ks__engine_model(e), NULL); }

static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;
static char g_llama_version[64] = "unknown";

/* llama.h has no version call (the build number lives in the common
 * library), but the pinned release names its library file after itself. */
static void llama_version_init(void) {
    Dl_info info;
    char real[4096];
    if (!dladdr((void *)&llama_backend_init, &info) || !info.dli_fname || !realpath(info.dli_fname, real)) return;
    const char *base = strrchr(real, '/');
    base = base ? base + 1 : real;
    const char *v = NULL;
    size_t n = 0;
    if (!strncmp(base, "libllama.", 9) && strstr(base, ".so")) {
        const char *so = strstr(base, ".so");
        if (so[3] == '.' && so[4]) v = so + 4, n = strlen(v);          /* libllama.so.X.Y.Z */
        else if (so > base + 9) v = base + 9, n = (size_t)(so - v);    /* libllama.vX.Y.Z.so */
    }
    if (v && n > 0 && n < sizeof g_llama_version) snprintf(g_llama_version, sizeof g_llama_version, "%.*s", (int)n, v);
}

const char *ks_engine_llama_version(void) {
    pthread_once(&g_version_once, llama_version_init);
    return g_llama_version;
}

int ks_engine_template(const ks_engine *e, const ks_msg *msgs, size_t n, bool add_gen, char **out) {
    *out = NULL;
    llama_chat_message *cm = calloc(n ? n : 1, sizeof *cm);
    if (!cm) return KS_ENOMEM;
    size_t total = 64;
    for (size_t i = 0; i < n; i++) {
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content ? msgs[i].content : "";
        total += strlen(cm[i].content) + strlen(cm[i].role) + 32;
    }
    size_t cap = total * 2;
    char *buf = malloc(cap);
    int rc = 0;
    if (!buf) { rc = KS_ENOMEM; goto done; }
    int32_t r = llama_chat_apply_template(ks__engine_tmpl(e), cm, n, add_gen, buf, (int32_t)cap);
    if (r < 0) { rc = KS_ETEMPLATE; goto done; }
    if ((size_t)r >= cap) {
        cap = (size_t)r + 1;
        char *nb = realloc(buf, cap);
        if (!nb) { rc = KS_ENOMEM; goto done; }
        buf = nb;
        r = llama_chat_apply_template(ks__engine_tmpl(e), cm, n, add_gen, buf, (int32_t)cap);
        if (r < 0 || (size_t)r >= cap) { rc = KS_ETEMPLATE; goto done; }
    }
    buf[r] = '\0';
    *out = buf;
    buf = NULL;
done:
    free(buf);
    free(cm);
    return rc;
}

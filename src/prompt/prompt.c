/*
 * prompt.c — see prompt.h.
 */
#include "prompt/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "cache/msghash.h"

/* Renders msgs and tokenizes the text, appending to toks; a text longer
 * than max_bytes (> 0) is KS_ECTX, not tokenized. */
static int render(const ks_engine *e, const ks_msg *msgs, int n, bool add_gen, int64_t max_bytes, ks_tokens *toks) {
    char *text = NULL;
    int rc = ks_engine_template(e, msgs, (size_t)n, add_gen, &text);
    if (rc) return rc;
    size_t len = strlen(text);
    rc = max_bytes > 0 && len > (uint64_t)max_bytes ? KS_ECTX : ks_engine_tokenize(e, text, len, true, true, toks);
    free(text);
    return rc;
}

int ks_prompt_render(const ks_engine *e, const ks_msg *msgs, int n, ks_tokens *toks) {
    ks_tokens_truncate(toks, 0);
    return render(e, msgs, n, true, 0, toks);
}

/* The message-prefix hashes (IMC); left NULL on ENOMEM (prompt.h: hints are
 * optional). */
static void msg_hashes(const ks_msg *msgs, int n, ks_prompt *p) {
    const char **roles = malloc(sizeof(char *) * (size_t)n * 2);
    p->msg_hashes = malloc(sizeof(uint64_t) * ((size_t)n + 1));
    if (roles && p->msg_hashes) {
        const char **contents = roles + n;
        for (int i = 0; i < n; i++) {
            roles[i] = msgs[i].role;
            contents[i] = msgs[i].content;
        }
        ks_msghash_prefixes(roles, contents, n, p->msg_hashes);
        p->n_msgs = n;
    } else {
        free(p->msg_hashes);
        p->msg_hashes = NULL;
    }
    free(roles);
}

/* The SPC key of a leading system message whose lone rendering is a clean
 * token prefix of the prompt. */
static void sys_key(const ks_engine *e, const ks_msg *msgs, const char *model_id, ks_prompt *p) {
    if (strcmp(msgs[0].role, "system") != 0) return;
    ks_tokens sys = {0};
    const ks_tokens *t = &p->tokens;
    if (render(e, msgs, 1, false, 0, &sys) == 0 && sys.n > 0 && sys.n < t->n &&
        !memcmp(sys.v, t->v, sizeof(int32_t) * (size_t)sys.n)) {
        p->sys_key = ks_msghash_system("system", msgs[0].content, model_id);
        p->n_sys_tokens = sys.n;
    }
    ks_tokens_free(&sys);
}

int ks_prompt_chat(const ks_engine *e, const ks_msg *msgs, int n, const ks_prompt_opts *o, ks_prompt *out) {
    memset(out, 0, sizeof *out);
    if (!msgs || n < 1) return KS_EINVAL;
    int rc = render(e, msgs, n, true, o ? o->max_bytes : 0, &out->tokens);
    if (rc) {
        ks_prompt_free(out);
        return rc;
    }
    if (o && o->hints) {
        msg_hashes(msgs, n, out);
        sys_key(e, msgs, o->model_id, out);
    }
    return 0;
}

int ks_prompt_text(const ks_engine *e, const char *text, ks_prompt *out) {
    memset(out, 0, sizeof *out);
    int rc = ks_engine_tokenize(e, text, strlen(text), true, true, &out->tokens);
    if (rc) ks_prompt_free(out);
    return rc;
}

int ks_prompt_ids(const ks_engine *e, const int32_t *ids, int n, ks_prompt *out, int *bad) {
    memset(out, 0, sizeof *out);
    int n_vocab = ks_engine_n_vocab(e);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            if (bad) *bad = i;
            return KS_EINVAL;
        }
    }
    return ks_tokens_assign(&out->tokens, ids, n);
}

/* Tokenizes s (NULL: nothing) onto t, no BOS. */
static int tok_text(const ks_engine *e, const char *s, bool parse_special, ks_tokens *t) {
    return s && *s ? ks_engine_tokenize(e, s, strlen(s), false, parse_special, t) : 0;
}

/* The last n of s onto t (n <= s->n). */
static int append_tail(ks_tokens *t, const ks_tokens *s, int n) {
    return n > 0 ? ks_tokens_append(t, s->v + s->n - n, n) : 0;
}

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

int ks_prompt_infill(const ks_engine *e, const ks_prompt_infill_in *in, ks_prompt *out) {
    memset(out, 0, sizeof *out);
    ks_fim_tokens fim = ks_engine_fim_tokens(e);
    if (fim.pre < 0 || fim.suf < 0 || fim.mid < 0) return KS_EINVAL;
    ks_tokens extra = {0}, pre = {0}, suf = {0}, prompt = {0};
    int rc = tok_text(e, in->prefix, false, &pre);
    if (!rc) rc = tok_text(e, in->suffix, false, &suf);
    if (!rc) rc = tok_text(e, in->prompt, true, &prompt);
    if (!rc && fim.rep >= 0) {
        rc = ks_tokens_push(&extra, fim.rep);
        if (!rc) rc = tok_text(e, "myproject\n", false, &extra);
    }
    for (int i = 0; !rc && i < in->n_extra; i++) {
        const char *fn = in->extra[i].filename ? in->extra[i].filename : "tmp";
        if (fim.sep >= 0) {
            ks_buf line = {0};
            rc = ks_tokens_push(&extra, fim.sep);
            if (!rc) rc = ks_buf_printf(&line, "%s\n", fn);
            if (!rc) rc = tok_text(e, line.s, false, &extra);
            ks_buf_free(&line);
        } else {
            rc = tok_text(e, "\n\n--- snippet ---\n\n", false, &extra);
        }
        if (!rc) rc = tok_text(e, in->extra[i].text, false, &extra);
    }
    if (!rc && fim.sep >= 0) {
        rc = ks_tokens_push(&extra, fim.sep);
        if (!rc) rc = tok_text(e, "filename\n", false, &extra);
    }
    if (rc) goto out;

    /* llama-server's budget: the prefix and suffix fit a batch, 3:1. */
    int n_prefix_take = imin(pre.n, 3 * (in->n_batch / 4));
    int n_suffix_take = imin(suf.n, imax(0, in->n_batch / 4 - (2 + prompt.n)));
    int n_extra_take = imin(imax(0, in->n_ctx - in->n_batch - 2 * in->n_predict), extra.n);

    ks_tokens *t = &out->tokens;
    rc = ks_tokens_reserve(t, n_extra_take + n_prefix_take + prompt.n + n_suffix_take + 4);
    if (!rc) rc = append_tail(t, &extra, n_extra_take);
    if (!rc && ks_engine_adds_bos(e) && ks_engine_token_bos(e) >= 0) rc = ks_tokens_push(t, ks_engine_token_bos(e));
    for (int part = 0; part < 2 && !rc; part++) {
        if ((part == 0) != in->spm) { /* the prefix part */
            rc = ks_tokens_push(t, fim.pre);
            if (!rc) rc = append_tail(t, &pre, n_prefix_take);
            if (!rc) rc = append_tail(t, &prompt, prompt.n);
        } else {
            rc = ks_tokens_push(t, fim.suf);
            if (!rc && n_suffix_take > 0) rc = ks_tokens_append(t, suf.v, n_suffix_take);
        }
    }
    if (!rc) rc = ks_tokens_push(t, fim.mid);
out:
    ks_tokens_free(&extra);
    ks_tokens_free(&pre);
    ks_tokens_free(&suf);
    ks_tokens_free(&prompt);
    if (rc) ks_prompt_free(out);
    return rc;
}

void ks_prompt_free(ks_prompt *p) {
    if (!p) return;
    ks_tokens_free(&p->tokens);
    free(p->msg_hashes);
    memset(p, 0, sizeof *p);
}

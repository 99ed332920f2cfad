/*
 * lptext.c — see lptext.h.
 */
#include "server/lptext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/server_int.h"

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9) | JSON_ENCODE_ANY)

/* Appends v's dump to b, a comma first unless b is empty. */
static int add(ks_buf *b, const json_t *v) {
    char *s = v ? json_dumps(v, DUMP_FLAGS) : NULL;
    if (!s) return KS_ENOMEM;
    int rc = (b->len && ks_buf_append(b, ",", 1)) || ks_buf_append(b, s, strlen(s)) ? KS_ENOMEM : 0;
    free(s);
    return rc;
}

void ks_lptext_add(ks_lptext *t, const json_t *e) {
    if (t->failed) return;
    int rc;
    if (!t->legacy) {
        rc = add(&t->part[0], e);
    } else {
        /* As the completions API's logprobs object always was (api.c): the
         * alternatives as {token: logprob}, the offsets in bytes. */
        json_t *tok = json_object_get(e, "token"), *top = json_object(), *off = json_integer((json_int_t)t->offset);
        size_t j;
        json_t *a;
        json_array_foreach(json_object_get(e, "top_logprobs"), j, a) {
            const char *at = json_string_value(json_object_get(a, "token"));
            if (top) json_object_set(top, at ? at : "", json_object_get(a, "logprob"));
        }
        rc = add(&t->part[0], tok) || add(&t->part[1], json_object_get(e, "logprob")) || add(&t->part[2], top) ||
             add(&t->part[3], off);
        json_decref(top);
        json_decref(off);
        const char *ts = json_string_value(tok);
        t->offset += ts ? strlen(ts) : 0;
    }
    if (rc) t->failed = true;
    t->n++;
}

void ks_lptext_free(ks_lptext *t) {
    for (int i = 0; i < 4; i++) ks_buf_free(&t->part[i]);
    memset(t, 0, sizeof *t);
}

json_t *ks_lptext_placeholder(int i) {
    char s[48];
    snprintf(s, sizeof s, "\x1fks-logprobs-%d\x1f", i);
    return json_string(s);
}

/* The text of t in its API's shape into out. */
static int emit(ks_buf *out, const ks_lptext *t) {
    static const char *const legacy[4] = {"{\"tokens\":[", "],\"token_logprobs\":[", "],\"top_logprobs\":[",
                                          "],\"text_offset\":["};
    if (!t->legacy && t->bare)
        return ks_buf_append(out, "[", 1) || ks_buf_append(out, t->part[0].s, t->part[0].len) ||
                       ks_buf_append(out, "]", 1)
                   ? KS_ENOMEM
                   : 0;
    if (!t->legacy)
        return ks_buf_append(out, "{\"content\":[", 12) || ks_buf_append(out, t->part[0].s, t->part[0].len) ||
                       ks_buf_append(out, "],\"refusal\":[]}", 15)
                   ? KS_ENOMEM
                   : 0;
    for (int i = 0; i < 4; i++)
        if (ks_buf_append(out, legacy[i], strlen(legacy[i])) || ks_buf_append(out, t->part[i].s, t->part[i].len))
            return KS_ENOMEM;
    return ks_buf_append(out, "]}", 2) ? KS_ENOMEM : 0;
}

char *ks_lptext_splice(const char *body, size_t len, ks_lptext *const *lpt, int n, size_t *out_len) {
    ks_buf out = {0};
    size_t need = len + 1, at = 0;
    for (int i = 0; i < n; i++)
        if (lpt[i]) {
            if (lpt[i]->failed) return NULL;
            for (int k = 0; k < 4; k++) need += lpt[i]->part[k].len + 32;
        }
    /* One allocation of the final size: no doubling past the reply. */
    if (!(out.s = malloc(need))) return NULL;
    out.cap = need;
    for (int i = 0; i < n; i++) {
        if (!lpt[i]) continue;
        /* The key makes the match unambiguous: inside a JSON string every
         * quote is escaped, so `"logprobs":"` only ever starts a member. */
        char pat[96];
        json_t *ph = ks_lptext_placeholder(i);
        char *q = ph ? json_dumps(ph, JSON_ENCODE_ANY) : NULL; /* as the reply's dump escapes it */
        json_decref(ph);
        /* llama-server's /completion names them completion_probabilities */
        const char *key = lpt[i]->bare ? "\"completion_probabilities\":" : "\"logprobs\":";
        int pl = q ? snprintf(pat, sizeof pat, "%s%s", key, q) : -1;
        free(q);
        if (pl < 0 || pl >= (int)sizeof pat) {
            ks_buf_free(&out);
            return NULL;
        }
        const char *hit = memmem(body + at, len - at, pat, (size_t)pl);
        if (!hit) continue; /* a format without logprobs */
        size_t h = (size_t)(hit - body) + strlen(key); /* keep the key */
        if (ks_buf_append(&out, body + at, h - at) || emit(&out, lpt[i])) {
            ks_buf_free(&out);
            return NULL;
        }
        at = (size_t)(hit - body) + (size_t)pl;
    }
    if (ks_buf_append(&out, body + at, len - at)) {
        ks_buf_free(&out);
        return NULL;
    }
    *out_len = out.len;
    return out.s;
}

enum MHD_Result ks__respond_spliced(ks_server *s, struct MHD_Connection *c, conn *cn, json_t *o,
                                  ks_lptext *const *lpt, int n) {
    char *body = ks_api_dump(o), *out = NULL;
    size_t len = 0;
    json_decref(o);
    if (body) out = ks_lptext_splice(body, strlen(body), lpt, n, &len);
    free(body);
    if (out) return ks__respond(s, c, cn, 200, "application/json; charset=utf-8", out, len, NULL);
    ks_api_error e;
    ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "The response could not be encoded.");
    return ks__respond_error(s, c, cn, &e, NULL);
}

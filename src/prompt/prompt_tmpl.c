/*
 * prompt_tmpl.c — see prompt_tmpl.h.
 */
#include "prompt/prompt_tmpl.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/msghash.h"

#define OPTIONS_ROLE "\x01options"

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Canonical JSON text of v (sorted keys, compact): equal requests hash equal. */
static char *canon(const json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY); }

/* The request without its messages and without what only steers sampling
 * or parsing (tool_choice, parallel_tool_calls, grammar, reasoning_format)
 * or only touches the last message (add_generation_prompt,
 * continue_final_message): what besides the messages shapes the prompt. An
 * agent that says tool_choice "required" on one turn and "auto" on the next
 * stays on its branch; the tokens are compared before anything is reused, so
 * a field left out here can cost a routing hint, never correctness. */
static char *options_text(const json_t *req) {
    static const char *const steer[] = {"messages", "tool_choice", "parallel_tool_calls", "grammar",
                                        "reasoning_format", "add_generation_prompt", "continue_final_message"};
    json_t *o = json_copy((json_t *)req);
    if (!o) return NULL;
    for (size_t i = 0; i < sizeof steer / sizeof steer[0]; i++) json_object_del(o, steer[i]);
    char *s = canon(o);
    json_decref(o);
    return s;
}

/* Message-prefix hashes with the options as message 0. Left NULL on ENOMEM. */
static void hints_hashes(const json_t *msgs, const char *opts, ks_prompt *p) {
    int n = (int)json_array_size(msgs) + 1;
    const char **roles = calloc((size_t)n * 2, sizeof(char *));
    char **texts = calloc((size_t)n, sizeof(char *));
    p->msg_hashes = malloc(sizeof(uint64_t) * ((size_t)n + 1));
    bool ok = roles && texts && p->msg_hashes;
    const char **contents = roles ? roles + n : NULL;
    if (ok) {
        roles[0] = OPTIONS_ROLE;
        contents[0] = opts;
        for (int i = 1; i < n && ok; i++) {
            json_t *m = json_array_get(msgs, (size_t)i - 1);
            roles[i] = json_string_value(json_object_get(m, "role"));
            texts[i] = canon(m);
            contents[i] = texts[i];
            ok = texts[i] != NULL;
        }
    }
    if (ok) {
        ks_msghash_prefixes(roles, contents, n, p->msg_hashes);
        p->n_msgs = n;
    } else {
        free(p->msg_hashes);
        p->msg_hashes = NULL;
    }
    if (texts)
        for (int i = 0; i < n; i++) free(texts[i]);
    free(texts);
    free(roles);
}

/* Renders req and returns the parsed result object (new reference). */
static int apply(const ks_chat_tmpl *t, const json_t *req, json_t **res, char *err, size_t errlen) {
    char *body = json_dumps(req, JSON_COMPACT);
    if (!body) return KS_ENOMEM;
    char *out = NULL;
    int rc = ks_chat_tmpl_apply(t, body, &out, err, errlen);
    free(body);
    if (rc) return rc;
    *res = json_loads(out, 0, NULL);
    free(out);
    return *res ? 0 : KS_ENOMEM;
}

/* As ks_engine_tokenize with BOS and special tokens, through the memo's
 * tokenization cache when it has one (ns: its namespace). */
static int tokenize(const ks_engine *e, const ks_prompt_memo *memo, uint64_t ns, const char *text, ks_tokens *out);

/* ------------------------------------------------------------ memo */
typedef struct memo_ent {
    uint64_t key;   /* XXH3 of the canonical JSON rendered; 0: free */
    uint64_t toks;  /* XXH3 of the first n tokens of the prompt it was found in */
    int n;          /* the token prefix the render shares with that prompt */
    bool whole;     /* ... and the render is all of it */
    uint64_t used;  /* the memo's clock when last found or stored */
} memo_ent;

struct ks_prompt_memo {
    pthread_mutex_t mu;
    memo_ent *v;
    int n;
    uint64_t clock, hits, misses;
    ks_tokcache *tc; /* borrowed; set before the memo is shared */
};

static int tokenize(const ks_engine *e, const ks_prompt_memo *memo, uint64_t ns, const char *text, ks_tokens *out) {
    if (memo && memo->tc) return ks_tokcache_tokenize(memo->tc, ns, text, strlen(text), out);
    return ks_engine_tokenize(e, text, strlen(text), true, true, out);
}

void ks_prompt_memo_use_tokcache(ks_prompt_memo *m, ks_tokcache *tc) { m->tc = tc; }

ks_prompt_memo *ks_prompt_memo_create(int n) {
    ks_prompt_memo *m = n > 0 ? calloc(1, sizeof *m) : NULL;
    if (!m) return NULL;
    if (!(m->v = calloc((size_t)n, sizeof *m->v))) {
        free(m);
        return NULL;
    }
    m->n = n;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void ks_prompt_memo_free(ks_prompt_memo *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->v);
    free(m);
}

void ks_prompt_memo_stats(ks_prompt_memo *m, uint64_t *hits, uint64_t *misses) {
    pthread_mutex_lock(&m->mu);
    *hits = m->hits;
    *misses = m->misses;
    pthread_mutex_unlock(&m->mu);
}

static uint64_t toks_hash(const ks_tokens *t, int n) { return XXH3_64bits(t->v, sizeof(int32_t) * (size_t)n); }

/* The entry of key when its tokens start full: 1 and *n, *whole; else 0. */
static int memo_get(ks_prompt_memo *m, uint64_t key, const ks_tokens *full, int *n, bool *whole) {
    int found = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n; i++) {
        memo_ent *x = &m->v[i];
        if (x->key != key) continue;
        if (x->n <= full->n && toks_hash(full, x->n) == x->toks) {
            *n = x->n;
            *whole = x->whole;
            x->used = ++m->clock;
            found = 1;
        }
        break;
    }
    if (found) m->hits++;
    else m->misses++;
    pthread_mutex_unlock(&m->mu);
    return found;
}

static void memo_put(ks_prompt_memo *m, uint64_t key, const ks_tokens *full, int n, bool whole) {
    uint64_t th = toks_hash(full, n);
    pthread_mutex_lock(&m->mu);
    int at = 0;
    for (int i = 0; i < m->n; i++) {
        if (m->v[i].key == key) {
            at = i;
            break;
        }
        if (m->v[i].used < m->v[at].used) at = i;
    }
    m->v[at] = (memo_ent){key, th, n, whole, ++m->clock};
    pthread_mutex_unlock(&m->mu);
}

/* req with messages[0..upto] only, no generation prompt: what a cache
 * breakpoint after messages[upto], or (upto 0) the system message alone,
 * renders to. NULL on ENOMEM. */
static json_t *head_request(const json_t *req, int upto) {
    const json_t *msgs = json_object_get(req, "messages");
    json_t *part = json_copy((json_t *)req);
    json_t *head = json_array();
    for (int i = 0; head && i <= upto; i++) json_array_append(head, json_array_get(msgs, (size_t)i));
    if (!part || !head || json_object_set_new(part, "messages", head)) {
        json_decref(part);
        return NULL;
    }
    json_object_del(part, "continue_final_message");
    json_object_set_new(part, "add_generation_prompt", json_false());
    return part;
}

/* The longest token prefix full shares with req's head (head_request):
 * *whole when all of the head's tokens are that prefix. From memo when it
 * holds this very head for a prompt starting as full does, else one render
 * and one tokenization (then remembered). 0 when the render fails. */
/* The token prefix full shares with text, where full was tokenized with its
 * media (ks_media_tokenize: the text split at the markers, each piece
 * tokenized alone, BOS first, each item's chunks as pseudo-tokens) and text
 * holds the same markers: piece by piece, each marker stepping over the next
 * media run of full (after at most a few tokens of the projector's own text
 * before it, such as Gemma 3's <start_of_image>). Only where every item is
 * one run; otherwise -1 (the caller compares the text whole, which stops at
 * the first marker). */
static int media_head(const ks_engine *e, const char *text, const ks_tokens *full, const ks_media_set *m,
                      bool *whole) {
    int n_runs = ks_media_set_n_runs(m);
    if (n_runs == 0 || n_runs != ks_media_set_n_items(m)) return -1;
    const char *mk = ks_media_marker();
    size_t ml = strlen(mk);
    int i = 0, run = 0;
    bool first = true;
    for (const char *p = text;;) {
        const char *q = strstr(p, mk);
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len > 0 || first) {
            ks_tokens seg = {0};
            if (ks_engine_tokenize(e, p, len, first, true, &seg)) {
                ks_tokens_free(&seg);
                return i;
            }
            int k = 0;
            while (k < seg.n && i < full->n && seg.v[k] == full->v[i]) k++, i++;
            bool all = k == seg.n;
            ks_tokens_free(&seg);
            if (!all) return i;
        }
        if (!q) {
            *whole = i > 0;
            return i;
        }
        if (run >= n_runs) return i;
        int pos, n;
        ks_media_set_run(m, run++, &pos, &n);
        if (pos < i || pos - i > 8) return i;
        i = pos + n;
        p = q + ml;
        first = false;
    }
}

static int head_len(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, int upto, const ks_tokens *full,
                    const ks_media_set *media, ks_prompt_memo *memo, uint64_t ns, bool *whole) {
    *whole = false;
    json_t *part = head_request(req, upto);
    char *c = part && memo ? canon(part) : NULL;
    /* ns: the memo's namespace (ks_prompt_opts.memo_ns); seed 0 is plain XXH3 */
    uint64_t key = c ? XXH3_64bits_withSeed(c, strlen(c), ns) | 1 : 0;
    free(c);
    int n = 0;
    if (key && memo_get(memo, key, full, &n, whole)) {
        json_decref(part);
        return n;
    }
    json_t *res = NULL;
    ks_tokens tok = {0};
    char err[64];
    if (part && apply(t, part, &res, err, sizeof err) == 0) {
        const char *text = json_string_value(json_object_get(res, "prompt"));
        int nm = text && media ? media_head(e, text, full, media, whole) : -1;
        if (nm >= 0) {
            n = nm;
        } else if (text && tokenize(e, memo, ns, text, &tok) == 0) {
            while (n < tok.n && n < full->n && tok.v[n] == full->v[n]) n++;
            *whole = n > 0 && n == tok.n;
        }
        if (key && n > 0) memo_put(memo, key, full, n, *whole);
    }
    json_decref(part);
    json_decref(res);
    ks_tokens_free(&tok);
    return n;
}

/* SPC: the leading system message rendered alone, with the same options. */
static void sys_key(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, const char *opts,
                    const char *model_id, ks_prompt_memo *memo, uint64_t ns, ks_prompt *p) {
    const json_t *msgs = json_object_get(req, "messages");
    json_t *m0 = json_array_get(msgs, 0);
    if (!m0 || strcmp(json_string_value(json_object_get(m0, "role")), "system") != 0) return;
    if (json_array_size(msgs) < 2) return;
    bool whole;
    int n_sys = head_len(e, t, req, 0, &p->tokens, NULL, memo, ns, &whole);
    if (!whole || n_sys >= p->tokens.n) return;
    char *c = canon(m0);
    size_t n = (c ? strlen(c) : 0) + strlen(opts) + 2;
    char *both = c ? malloc(n) : NULL;
    if (both) {
        snprintf(both, n, "%s\n%s", c, opts);
        p->sys_key = ks_msghash_system("system", both, model_id);
        p->n_sys_tokens = n_sys;
    }
    free(both);
    free(c);
}

/* How many tokens at the end of full are the generation prompt gp (parsed
 * as the full prompt was: it starts at a special token in every template
 * that has one, where tokenization starts afresh), 0 when full does not end
 * with them. */
static int gen_prompt_tokens(const ks_engine *e, const char *gp, const ks_tokens *full) {
    if (!gp || !gp[0]) return 0;
    ks_tokens g = {0};
    int n = 0;
    if (ks_engine_tokenize(e, gp, strlen(gp), false, true, &g) == 0 && g.n > 0 && g.n < full->n &&
        !memcmp(g.v, full->v + (full->n - g.n), sizeof(int32_t) * (size_t)g.n))
        n = g.n;
    ks_tokens_free(&g);
    return n;
}

static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A string's tokens when it is exactly one token, else -1. */
static int32_t single_token(const ks_engine *e, const char *s) {
    ks_tokens t = {0};
    int32_t tok = -1;
    if (ks_engine_tokenize(e, s, strlen(s), false, true, &t) == 0 && t.n == 1) tok = t.v[0];
    ks_tokens_free(&t);
    return tok;
}

static int push_str(char ***v, int *n, const char *s) {
    char **nv = realloc(*v, sizeof(char *) * ((size_t)*n + 1));
    if (!nv) return KS_ENOMEM;
    *v = nv;
    if (!(nv[*n] = dup_str(s))) return KS_ENOMEM;
    (*n)++;
    return 0;
}

static int push_tok(int32_t **v, int *n, int32_t tok) {
    int32_t *nv = realloc(*v, sizeof(int32_t) * ((size_t)*n + 1));
    if (!nv) return KS_ENOMEM;
    *v = nv;
    nv[(*n)++] = tok;
    return 0;
}

static void free_strs(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* parallel_tool_calls false: the common library's tool-call grammars still
 * repeat the call rule ("tool-calls ::= (tool-call space)+", or with
 * "tool-call?" when lazy; docs/LLAMA_FACTS.md), and random or small models
 * call again and again until max_tokens. One call is what the client asked
 * for: "(X)+" becomes "X", in place, so the grammar completes after the first
 * call and generation ends there. */
static void one_call(char *g) {
    static const char head[] = "tool-calls ::= (";
    char *at = strstr(g, head);
    if (!at || (at != g && at[-1] != '\n')) return;
    char *open = at + sizeof head - 2, *eol = strchr(open, '\n');
    if (!eol) eol = open + strlen(open);
    if (eol - open < 3 || eol[-1] != '+' || eol[-2] != ')') return;
    /* "(X)+" -> "X": drop the "(" and the ")+" */
    size_t inner = (size_t)(eol - 2 - (open + 1));
    memmove(open, open + 1, inner);
    memmove(open + inner, eol, strlen(eol) + 1);
}

/* tool_choice "required": the output is a call. llama.cpp's grammar lets
 * plain text come first ("root ::= ... until-N? tool-calls"), which random or
 * small models fill until max_tokens; the preamble is cut when the root rule
 * has exactly that shape (a reasoning block is another rule, left alone). */
static void no_preamble(char *g) {
    char *root = strncmp(g, "root ::= ", 9) == 0 ? g : strstr(g, "\nroot ::= ");
    if (!root) return;
    char *eol = strchr(root + 1, '\n');
    if (!eol) eol = root + strlen(root);
    char *u = strstr(root, " until-");
    if (!u || u > eol) return;
    char *q = u + 7;
    while (*q >= '0' && *q <= '9') q++;
    if (q == u + 7 || strncmp(q, "? tool-calls", 12) != 0) return;
    memmove(u, q + 1, strlen(q + 1) + 1); /* keep the space before tool-calls */
}

/* What sampling and parsing need, from the apply result. */
static int sampling_parts(const ks_engine *e, json_t *res, bool parallel, bool required, ks_prompt_tmpl *out) {
    int rc;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(res, "preserved_tokens"), i, v) {
        int32_t tok = json_is_string(v) ? single_token(e, json_string_value(v)) : -1;
        if (tok >= 0 && (rc = push_tok(&out->preserved, &out->n_preserved, tok))) return rc;
    }
    if (out->n_preserved > 1) qsort(out->preserved, (size_t)out->n_preserved, sizeof(int32_t), cmp_tok);
    json_array_foreach(json_object_get(res, "additional_stops"), i, v) {
        if (json_is_string(v) && json_string_length(v) > 0 && (rc = push_str(&out->stops, &out->n_stops, json_string_value(v))))
            return rc;
    }
    const char *g = json_string_value(json_object_get(res, "grammar"));
    if (!g || !g[0]) return 0;
    if (!(out->grammar = dup_str(g))) return KS_ENOMEM;
    if (!parallel) one_call(out->grammar);
    if (required) no_preamble(out->grammar);
    out->grammar_lazy = json_is_true(json_object_get(res, "grammar_lazy"));
    json_array_foreach(json_object_get(res, "grammar_triggers"), i, v) {
        const char *type = json_string_value(json_object_get(v, "type"));
        const char *value = json_string_value(json_object_get(v, "value"));
        const char *pattern = json_string_value(json_object_get(v, "pattern"));
        if (!type) continue;
        int32_t tok = -1;
        if (!strcmp(type, "token")) {
            tok = (int32_t)json_integer_value(json_object_get(v, "token"));
        } else if (!strcmp(type, "word") && value) {
            /* llama-server's rule: a word that is one preserved token triggers as that token. */
            int32_t t1 = single_token(e, value);
            if (t1 >= 0 && ks_prompt_tmpl_preserved(out->preserved, out->n_preserved, t1)) tok = t1;
        }
        if (tok >= 0) rc = push_tok(&out->trigger_tokens, &out->n_trigger_tokens, tok);
        else if (pattern) rc = push_str(&out->trigger_patterns, &out->n_trigger_patterns, pattern);
        else rc = 0;
        if (rc) return rc;
    }
    /* A grammar built by the template starts after the generation prompt:
     * the grammar accepts its tokens first (llama-server's prefill; a
     * leading space token some tokenizers add is skipped as there). */
    const char *gp = json_string_value(json_object_get(res, "generation_prompt"));
    if (out->grammar_lazy && gp && out->continuation) {
        /* A continued assistant message that already holds a trigger
         * ("<tool_call>\n" as a prefill) has started the call: the lazy
         * grammar would never see its trigger in the output, so it applies
         * from the start, fed the prompt's text from the trigger on. */
        json_array_foreach(json_object_get(res, "grammar_triggers"), i, v) {
            const char *type = json_string_value(json_object_get(v, "type"));
            const char *value = json_string_value(json_object_get(v, "value"));
            const char *at = type && !strcmp(type, "word") && value && value[0] ? strstr(gp, value) : NULL;
            if (!at) continue;
            out->grammar_lazy = false;
            free_strs(out->trigger_patterns, out->n_trigger_patterns);
            out->trigger_patterns = NULL;
            out->n_trigger_patterns = 0;
            free(out->trigger_tokens);
            out->trigger_tokens = NULL;
            out->n_trigger_tokens = 0;
            ks_tokens t = {0};
            if ((rc = ks_engine_tokenize(e, at, strlen(at), false, true, &t))) return rc;
            for (int k = 0; k < t.n && !rc; k++) rc = push_tok(&out->grammar_prefill, &out->n_grammar_prefill, t.v[k]);
            ks_tokens_free(&t);
            return rc;
        }
    }
    if (!out->grammar_lazy && json_is_true(json_object_get(res, "grammar_prefill")) && gp && gp[0]) {
        ks_tokens t = {0};
        if ((rc = ks_engine_tokenize(e, gp, strlen(gp), false, true, &t))) return rc;
        for (int k = 0; k < t.n && !rc; k++) {
            if (k == 0 && !isspace((unsigned char)gp[0])) {
                char piece[64];
                int n = ks_engine_token_text(e, t.v[0], piece, sizeof piece);
                if (n > 0 && isspace((unsigned char)piece[0])) continue;
            }
            rc = push_tok(&out->grammar_prefill, &out->n_grammar_prefill, t.v[k]);
        }
        ks_tokens_free(&t);
        if (rc) return rc;
    }
    return 0;
}

int ks_prompt_tmpl_chat(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, const ks_prompt_opts *o,
                        ks_prompt_memo *memo, ks_prompt_tmpl *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    json_t *res = NULL;
    char *opts = NULL;
    int rc = apply(t, req, &res, err, errlen);
    if (rc) goto fail;
    const char *text = json_string_value(json_object_get(res, "prompt"));
    json_t *parse = json_object_get(res, "parse");
    const char *fmt = json_string_value(json_object_get(res, "format_name"));
    rc = KS_ENOMEM;
    if (!text || !parse) goto fail;
    if (!(out->parse = json_dumps(parse, JSON_COMPACT))) goto fail;
    if (!(out->format = dup_str(fmt ? fmt : ""))) goto fail;
    out->continuation = json_is_true(json_object_get(parse, "is_continuation"));
    rc = KS_ECTX;
    if (o && o->max_bytes > 0 && strlen(text) > (uint64_t)o->max_bytes) goto fail;
    if (o && o->media && o->media->n_items > 0) {
        rc = ks_media_tokenize(o->media->mm, text, strlen(text), true, true, o->media->items, o->media->n_items,
                               &out->p.tokens, &out->media, err, errlen);
        if (rc == KS_EINVAL) rc = KS_EDECODE; /* the media's fault, not the template's */
        if (rc) goto fail;
    } else if ((rc = tokenize(e, memo, o ? o->memo_ns : 0, text, &out->p.tokens))) {
        goto fail;
    }
    json_t *ptc = json_object_get(req, "parallel_tool_calls");
    const char *choice = json_string_value(json_object_get(req, "tool_choice"));
    if ((rc = sampling_parts(e, res, !json_is_false(ptc), choice && !strcmp(choice, "required"), out))) goto fail;
    if (!out->continuation)
        out->n_gen_prompt = gen_prompt_tokens(e, json_string_value(json_object_get(res, "generation_prompt")),
                                              &out->p.tokens);
    if (o && o->hints) {
        opts = options_text(req);
        if (opts) {
            hints_hashes(json_object_get(req, "messages"), opts, &out->p);
            sys_key(e, t, req, opts, o->model_id, memo, o->memo_ns, &out->p);
        }
    }
    free(opts);
    json_decref(res);
    return 0;
fail:
    free(opts);
    json_decref(res);
    ks_prompt_tmpl_free(out);
    return rc;
}

int ks_prompt_tmpl_prefix_len(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, int upto,
                              const ks_tokens *full, int n_gen_prompt, ks_prompt_memo *memo) {
    return ks_prompt_tmpl_prefix_len_ns(e, t, req, upto, full, NULL, n_gen_prompt, memo, 0);
}

int ks_prompt_tmpl_prefix_len_ns(const ks_engine *e, const ks_chat_tmpl *t, const json_t *req, int upto,
                                 const ks_tokens *full, const ks_media_set *media, int n_gen_prompt,
                                 ks_prompt_memo *memo, uint64_t ns) {
    const json_t *msgs = json_object_get(req, "messages");
    if (upto < 0 || (size_t)upto >= json_array_size(msgs)) return 0;
    /* The last message: the prompt is that render plus the generation prompt. */
    if ((size_t)upto + 1 == json_array_size(msgs) && n_gen_prompt > 0 && n_gen_prompt < full->n)
        return full->n - n_gen_prompt;
    bool whole;
    return head_len(e, t, req, upto, full, media, memo, ns, &whole);
}

bool ks_prompt_tmpl_preserved(const int32_t *preserved, int n, int32_t tok) {
    return n > 0 && bsearch(&tok, preserved, (size_t)n, sizeof(int32_t), cmp_tok) != NULL;
}

void ks_prompt_tmpl_free(ks_prompt_tmpl *p) {
    if (!p) return;
    ks_prompt_free(&p->p);
    free(p->grammar);
    free_strs(p->trigger_patterns, p->n_trigger_patterns);
    free(p->trigger_tokens);
    free(p->grammar_prefill);
    free(p->preserved);
    free_strs(p->stops, p->n_stops);
    free(p->parse);
    free(p->format);
    ks_media_set_unref(p->media);
    memset(p, 0, sizeof *p);
}

/*
 * grammarsize.c — see grammarsize.h.
 *
 * The grammar is read as llama.cpp's parser reads it (src/llama-grammar.cpp,
 * parse_sequence / parse_alternates): a rule is `name ::= alternatives` up
 * to the end of its line (newlines are free inside parentheses); an element
 * is a string, a character class, `.`, a rule name or a parenthesized group,
 * followed by `*`, `+`, `?` or `{m,n}`; `#` starts a comment. Groups and
 * repeated elements become rules of their own, as llama.cpp makes them
 * (x* is R ::= x R | <empty>, x+ is x R, x? is R ::= x | <empty>; {m,n}
 * counts here as x+ or x*, which start the same ways).
 *
 * The fan-out of position i of a sequence s, F(s, i): 1 at a terminal or at
 * the end; at a reference to rule R, E(R) + e(R) * F(s, i + 1), where E(R)
 * sums F(a, 0) over R's non-empty alternatives a and e(R) counts its empty
 * ones. Each sequence is walked from its end, and E(R) is computed once, so
 * the whole costs time linear in the grammar; the only recursion is through
 * E along chains of first references, capped at CHAIN_MAX (llama.cpp's own
 * left-recursion check recurses the same way).
 */
#include "server/grammarsize.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define CHAIN_MAX 1000
#define SATURATE ((size_t)1 << 40)

typedef struct item {
    int ref; /* rule index, or -1: a terminal */
} item;

typedef struct seq {
    int rule;
    int start, len; /* items [start, start + len) */
} seq;

typedef struct rule {
    const char *name; /* into the grammar text, name_len bytes; NULL: made for a group or repetition */
    int name_len;
    int parent;       /* made rules: the named rule they came from (for messages) */
    int first_alt, n_alts, n_empty;
    size_t e;         /* E(R) */
    int state;        /* 0: not computed, 1: computing, 2: done */
} rule;

typedef struct gs {
    const char *p, *end;
    item *items;
    int n_items, cap_items;
    seq *seqs;
    int n_seqs, cap_seqs;
    rule *rules;
    int n_rules, cap_rules;
    int *alt_index; /* seq ids grouped by rule */
    int *hash;      /* open addressing over named rules, -1 empty */
    size_t hash_cap;
    int depth;
    int cur_named; /* the named rule being parsed */
    bool oom, too_deep, bad;
    size_t max_fanout;
    int max_rule;
} gs;

static int grow(void **v, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *x = realloc(*v, (size_t)n * elem);
    if (!x) return -1;
    *v = x;
    *cap = n;
    return 0;
}

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static uint64_t hash_name(const char *s, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int new_rule(gs *g, const char *name, int name_len) {
    if (grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) {
        g->oom = true;
        return -1;
    }
    rule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->name_len = name_len;
    r->parent = name ? g->n_rules : g->cur_named;
    return g->n_rules++;
}

/* The named rule's index, made on first sight. */
static int named_rule(gs *g, const char *name, int n) {
    if ((size_t)g->n_rules * 2 >= g->hash_cap) {
        size_t cap = g->hash_cap ? g->hash_cap * 2 : 1024;
        int *h = malloc(cap * sizeof *h);
        if (!h) {
            g->oom = true;
            return -1;
        }
        for (size_t i = 0; i < cap; i++) h[i] = -1;
        for (size_t i = 0; i < g->hash_cap; i++) {
            int r = g->hash[i];
            if (r < 0) continue;
            size_t j = hash_name(g->rules[r].name, g->rules[r].name_len) & (cap - 1);
            while (h[j] >= 0) j = (j + 1) & (cap - 1);
            h[j] = r;
        }
        free(g->hash);
        g->hash = h;
        g->hash_cap = cap;
    }
    size_t j = hash_name(name, n) & (g->hash_cap - 1);
    for (; g->hash[j] >= 0; j = (j + 1) & (g->hash_cap - 1)) {
        const rule *r = &g->rules[g->hash[j]];
        if (r->name_len == n && !memcmp(r->name, name, (size_t)n)) return g->hash[j];
    }
    int r = new_rule(g, name, n);
    if (r >= 0) g->hash[j] = r;
    return r;
}

static void push_item(gs *g, int ref) {
    if (grow((void **)&g->items, &g->cap_items, g->n_items + 1, sizeof *g->items)) {
        g->oom = true;
        return;
    }
    g->items[g->n_items++].ref = ref;
}

/* A sequence of the rule from the items [start, n_items). */
static void push_seq(gs *g, int rule_id, int start) {
    if (grow((void **)&g->seqs, &g->cap_seqs, g->n_seqs + 1, sizeof *g->seqs)) {
        g->oom = true;
        return;
    }
    g->seqs[g->n_seqs++] = (seq){.rule = rule_id, .start = start, .len = g->n_items - start};
}

/* Spaces and tabs, comments; newlines when newline_ok. */
static void space(gs *g, bool newline_ok) {
    while (g->p < g->end) {
        char c = *g->p;
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            g->p++;
        } else if (c == '#') {
            while (g->p < g->end && *g->p != '\n' && *g->p != '\r') g->p++;
        } else {
            break;
        }
    }
}

/* Past a literal that starts at p (its quote or bracket) and ends with close. */
static void skip_literal(gs *g, char close) {
    g->p++;
    while (g->p < g->end && *g->p != close) {
        if (*g->p == '\\' && g->p + 1 < g->end) g->p++;
        g->p++;
    }
    if (g->p < g->end) g->p++;
    else g->bad = true;
}

static void alternates(gs *g, int rule_id, bool nested);

/* A sequence's items while it is read: its own buffer, so that the rules a
 * group or repetition inside it makes (whose sequences are pushed whole, at
 * once) never land in the middle of it. */
typedef struct vec {
    int *v;
    int n, cap;
} vec;

static void vec_push(gs *g, vec *x, int ref) {
    if (grow((void **)&x->v, &x->cap, x->n + 1, sizeof *x->v)) {
        g->oom = true;
        return;
    }
    x->v[x->n++] = ref;
}

/* A whole sequence of the rule: its items appended, contiguous. */
static void push_seq_of(gs *g, int rule_id, const int *refs, int n) {
    int start = g->n_items;
    for (int i = 0; i < n && !g->oom; i++) push_item(g, refs[i]);
    push_seq(g, rule_id, start);
}

/* A rule made for a repetition of x: x* is R ::= x R | <empty>; x? is
 * R ::= x | <empty>. */
static int repeat_rule(gs *g, int x, bool star) {
    int r = new_rule(g, NULL, 0);
    if (r < 0) return -1;
    int body[2] = {x, r};
    push_seq_of(g, r, body, star ? 2 : 1);
    push_seq_of(g, r, NULL, 0); /* the empty alternative */
    return r;
}

static void sequence(gs *g, bool nested, vec *out) {
    int last = -1; /* the last element's index in out */
    while (g->p < g->end && !g->oom && !g->too_deep && !g->bad) {
        char c = *g->p;
        if (c == '"' || c == '[') {
            skip_literal(g, c == '"' ? '"' : ']');
            last = out->n;
            vec_push(g, out, -1);
        } else if (c == '.') {
            g->p++;
            last = out->n;
            vec_push(g, out, -1);
        } else if (c == '<' || (c == '!' && g->p + 1 < g->end && g->p[1] == '<')) {
            /* A token terminal (<[id]>, <tok>, !<...>): one terminal. */
            const char *q = memchr(g->p, '>', (size_t)(g->end - g->p));
            if (!q) {
                g->bad = true;
                return;
            }
            g->p = q + 1;
            last = out->n;
            vec_push(g, out, -1);
        } else if (name_char(c)) {
            const char *s = g->p;
            while (g->p < g->end && name_char(*g->p)) g->p++;
            int r = named_rule(g, s, (int)(g->p - s));
            last = out->n;
            vec_push(g, out, r);
        } else if (c == '(') {
            if (++g->depth > KS_GRAMMAR_MAX_DEPTH) {
                g->too_deep = true;
                return;
            }
            g->p++;
            space(g, true);
            int r = new_rule(g, NULL, 0);
            if (r < 0) return;
            alternates(g, r, true);
            g->depth--;
            if (g->oom || g->too_deep || g->bad) return;
            if (g->p >= g->end || *g->p != ')') {
                g->bad = true;
                return;
            }
            g->p++;
            last = out->n;
            vec_push(g, out, r);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) {
                g->bad = true;
                return;
            }
            bool star = c != '?', plus = c == '+', once = false;
            if (c == '{') {
                /* {m}, {m,}, {m,n}: x+ when m >= 1 (the element comes first),
                 * x* or x? when m is 0; exactly once: the element as it is. */
                const char *q = memchr(g->p, '}', (size_t)(g->end - g->p));
                if (!q) {
                    g->bad = true;
                    return;
                }
                long m = strtol(g->p + 1, NULL, 10);
                const char *comma = memchr(g->p, ',', (size_t)(q - g->p));
                long n = !comma ? m : comma + 1 == q ? -1 : strtol(comma + 1, NULL, 10);
                g->p = q;
                plus = m >= 1;
                star = n != 1;
                once = m == 1 && n == 1;
            }
            g->p++;
            int x = out->v[last];
            if (once) {
                /* nothing made */
            } else if (plus) {
                int r = repeat_rule(g, x, true);
                if (r >= 0) vec_push(g, out, r);
            } else {
                int r = repeat_rule(g, x, star);
                if (r >= 0) out->v[last] = r;
            }
            last = -1;
        } else {
            break;
        }
        space(g, nested);
    }
}

static void alternates(gs *g, int rule_id, bool nested) {
    for (;;) {
        vec alt = {0};
        sequence(g, nested, &alt);
        if (!g->oom && !g->too_deep && !g->bad) push_seq_of(g, rule_id, alt.v, alt.n);
        free(alt.v);
        if (g->oom || g->too_deep || g->bad) return;
        if (g->p < g->end && *g->p == '|') {
            g->p++;
            space(g, true);
            continue;
        }
        return;
    }
}

/* E(R), computed once; the fan-outs of R's positions go into max_fanout. */
static size_t expand(gs *g, int r, int chain);

/* F over a sequence, from its end; returns F(s, 0). */
static size_t seq_fanout(gs *g, const seq *s, int chain) {
    size_t next = 1;
    for (int i = s->len - 1; i >= 0 && !g->too_deep; i--) {
        int ref = g->items[s->start + i].ref;
        if (ref < 0) {
            next = 1;
            continue;
        }
        size_t e = expand(g, ref, chain + 1);
        size_t f = e + (size_t)g->rules[ref].n_empty * next;
        if (f > SATURATE) f = SATURATE;
        if (f > g->max_fanout) {
            g->max_fanout = f;
            g->max_rule = s->rule;
        }
        next = f;
    }
    return next;
}

static size_t expand(gs *g, int r, int chain) {
    rule *R = &g->rules[r];
    if (R->state == 2) return R->e;
    if (R->state == 1) return 1; /* left recursion: llama.cpp refuses it */
    if (chain > CHAIN_MAX) {
        g->too_deep = true;
        return 1;
    }
    R->state = 1;
    size_t e = 0;
    for (int k = 0; k < R->n_alts; k++) {
        const seq *s = &g->seqs[g->alt_index[R->first_alt + k]];
        if (s->len == 0) continue;
        e += seq_fanout(g, s, chain);
        if (e > SATURATE) e = SATURATE;
    }
    R = &g->rules[r]; /* not moved (no rule is made now), but keep it plain */
    R->e = e;
    R->state = 2;
    return e;
}

static void name_of(const gs *g, int r, char *out, size_t n) {
    const rule *R = &g->rules[g->rules[r].parent];
    if (R->name) snprintf(out, n, "'%.*s'", R->name_len > 64 ? 64 : R->name_len, R->name);
    else snprintf(out, n, "a group");
}

int ks_grammar_size_check(const char *gbnf, size_t len, size_t *fanout, char *why, size_t why_len) {
    if (fanout) *fanout = 0;
    if (len > KS_GRAMMAR_MAX_BYTES) {
        ks_set_err(why, why_len, "the grammar has %zu bytes, more than %d", len, KS_GRAMMAR_MAX_BYTES);
        return KS_EINVAL;
    }
    gs g = {.p = gbnf, .end = gbnf + len, .cur_named = 0};
    space(&g, true);
    while (g.p < g.end && !g.oom && !g.too_deep && !g.bad) {
        const char *s = g.p;
        while (g.p < g.end && name_char(*g.p)) g.p++;
        if (g.p == s) {
            g.bad = true;
            break;
        }
        int r = named_rule(&g, s, (int)(g.p - s));
        if (r < 0) break;
        g.cur_named = r;
        space(&g, false);
        if (g.end - g.p < 3 || memcmp(g.p, "::=", 3)) {
            g.bad = true;
            break;
        }
        g.p += 3;
        space(&g, true);
        alternates(&g, r, false);
        space(&g, true);
    }
    int rc = 0;
    if (g.oom) {
        rc = KS_ENOMEM;
    } else if (g.too_deep) {
        ks_set_err(why, why_len, "the grammar nests groups deeper than %d", KS_GRAMMAR_MAX_DEPTH);
        rc = KS_EINVAL;
    } else if (g.n_rules) {
        /* A grammar this reader could not follow to its end (llama.cpp may
         * still take it, or name why not) is checked as far as it was read:
         * never passed unchecked. */
        /* Group each rule's alternatives (counting sort by rule). */
        int *count = calloc((size_t)g.n_rules + 1, sizeof *count);
        g.alt_index = malloc(((size_t)g.n_seqs + 1) * sizeof *g.alt_index);
        if (!count || !g.alt_index) {
            rc = KS_ENOMEM;
        } else {
            for (int i = 0; i < g.n_seqs; i++) count[g.seqs[i].rule + 1]++;
            for (int r = 0; r < g.n_rules; r++) {
                g.rules[r].first_alt = count[r];
                g.rules[r].n_alts = count[r + 1];
                count[r + 1] += count[r];
            }
            for (int r = 0; r < g.n_rules; r++) count[r] = g.rules[r].first_alt;
            for (int i = 0; i < g.n_seqs; i++) {
                g.alt_index[count[g.seqs[i].rule]++] = i;
                if (g.seqs[i].len == 0) g.rules[g.seqs[i].rule].n_empty++;
            }
            for (int r = 0; r < g.n_rules && !g.too_deep; r++) {
                size_t e = expand(&g, r, 0);
                if (e > g.max_fanout) {
                    g.max_fanout = e;
                    g.max_rule = r;
                }
            }
            char who[80];
            if (g.too_deep) {
                ks_set_err(why, why_len, "the grammar chains rule references deeper than %d", CHAIN_MAX);
                rc = KS_EINVAL;
            } else if (g.max_fanout > KS_GRAMMAR_MAX_FANOUT) {
                name_of(&g, g.max_rule, who, sizeof who);
                ks_set_err(why, why_len,
                           "in rule %s the grammar can continue in %zu ways at one point, more than %d (each is a "
                           "parse stack llama.cpp keeps and compares with the others at every token)",
                           who, g.max_fanout, KS_GRAMMAR_MAX_FANOUT);
                rc = KS_EINVAL;
            }
            if (fanout) *fanout = g.max_fanout;
        }
        free(count);
    }
    free(g.items);
    free(g.seqs);
    free(g.rules);
    free(g.alt_index);
    free(g.hash);
    return rc;
}

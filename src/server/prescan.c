/*
 * prescan.c — see prescan.h: presize's bound from the body's bytes.
 *
 * A recursive-descent walk over the bytes: member() and element() step
 * through an object's members and an array's elements, str() measures a
 * string (decoded length, trimmed length, and the first bytes to compare
 * keys and short values with), skip() passes over any value. The walkers
 * below them know each format's shape and count what its parser hands the
 * template (prescan.h invariant 1), each in the same words as the parser it
 * mirrors: api_chat.c, api_responses.c, api_messages.c.
 */
#include "server/prescan.h"

#include <stdbool.h>
#include <string.h>

typedef struct sc {
    const char *p, *e;
    int depth;
    bool bad;
    size_t items; /* keys and values begun */
} sc;

/* A measured string: n decoded bytes, trim of them between the first and
 * the last byte that is not white space (presize.c's space()); lit its
 * bytes when they are few and ASCII (lit_ok). */
typedef struct strm {
    size_t n, trim;
    size_t tail;  /* trimmed bytes after the last "</think>" (trim when none) */
    bool think;   /* it holds a "</think>" */
    char lit[24];
    bool lit_ok;
} strm;

static bool fail(sc *c) {
    c->bad = true;
    return false;
}

static void ws(sc *c) {
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static bool at(sc *c, char ch) {
    ws(c);
    return !c->bad && c->p < c->e && *c->p == ch;
}

static bool eat(sc *c, char ch) {
    if (!at(c, ch)) return false;
    c->p++;
    return true;
}

static bool space(unsigned ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }

static int hex4(const sc *c) {
    if (c->e - c->p < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char h = c->p[i];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* One escape after the backslash: *k decoded bytes, *ch the character when
 * k is 1. false: a sequence the parser refuses (\u0000 among them). */
static bool escape(sc *c, size_t *k, unsigned *ch) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (c->p >= c->e) return false;
    char x = *c->p++;
    const char *f = x ? strchr(from, x) : NULL;
    *k = 1;
    if (f) {
        *ch = (unsigned char)to[f - from];
        return true;
    }
    if (x != 'u') return false;
    int cp = hex4(c);
    if (cp <= 0) return false;
    c->p += 4;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return false;
    if (cp >= 0xD800 && cp <= 0xDBFF) { /* a pair: one 4-byte character */
        if (c->e - c->p < 2 || c->p[0] != '\\' || c->p[1] != 'u') return false;
        c->p += 2;
        int lo = hex4(c);
        if (lo < 0xDC00 || lo > 0xDFFF) return false;
        c->p += 4;
        *k = 4;
    } else {
        *k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
    }
    *ch = *k == 1 ? (unsigned)cp : 0x80;
    return true;
}

static bool str(sc *c, strm *m) {
    if (!eat(c, '"')) return fail(c);
    c->items++;
    size_t n = 0, lead = 0, end = 0, nl = 0;
    size_t t_lead = 0, t_end = 0, mi = 0; /* after the last "</think>": presize.c's after_think */
    bool seen = false, t_seen = false;
    static const char think_end[] = "</think>";
    m->lit_ok = true;
    m->think = false;
    for (;;) {
        if (c->p >= c->e) return fail(c);
        unsigned ch = (unsigned char)*c->p++;
        size_t k = 1;
        if (ch == '"') break;
        if (ch < 0x20) return fail(c);
        if (ch == '\\' && !escape(c, &k, &ch)) return fail(c);
        if (k == 1 && ch < 0x80 && nl + 1 < sizeof m->lit) m->lit[nl++] = (char)ch;
        else m->lit_ok = false;
        if (!(k == 1 && space(ch))) {
            if (!seen) lead = n;
            seen = true;
            end = n + k;
            if (!t_seen) t_lead = n;
            t_seen = true;
            t_end = n + k;
        }
        n += k;
        /* "</think>" seen whole: what follows starts afresh. */
        if (k == 1 && ch == (unsigned char)think_end[mi]) {
            if (++mi == sizeof think_end - 1) {
                mi = 0;
                m->think = true;
                t_seen = false;
            }
        } else {
            mi = k == 1 && ch == '<';
        }
    }
    m->lit[nl] = '\0';
    m->n = n;
    m->trim = seen ? end - lead : 0;
    m->tail = t_seen ? t_end - t_lead : 0;
    return true;
}

static bool is(const strm *m, const char *lit) { return m->lit_ok && !strcmp(m->lit, lit); }

static bool in(const strm *m, const char *const *lits) {
    for (; *lits; lits++)
        if (is(m, *lits)) return true;
    return false;
}

static bool skip(sc *c);

/* The object at the cursor, one member a call: *st 0 before its '{'. true
 * with the key in k and the cursor at its value (which the caller must
 * consume); false after its '}', or on a bad body (c->bad). */
static bool member(sc *c, int *st, strm *k) {
    if (c->bad) return false;
    if (*st == 0) {
        if (!eat(c, '{') || ++c->depth > KS_PRESCAN_MAX_DEPTH) return fail(c);
        *st = 1;
        c->items++;
        if (eat(c, '}')) return c->depth--, false;
    } else {
        if (eat(c, '}')) return c->depth--, false;
        if (!eat(c, ',')) return fail(c);
    }
    return (str(c, k) && eat(c, ':')) || fail(c);
}

/* The array at the cursor, one element a call, as member(). */
static bool element(sc *c, int *st) {
    if (c->bad) return false;
    if (*st == 0) {
        if (!eat(c, '[') || ++c->depth > KS_PRESCAN_MAX_DEPTH) return fail(c);
        *st = 1;
        c->items++;
        if (eat(c, ']')) return c->depth--, false;
        return true;
    }
    if (eat(c, ']')) return c->depth--, false;
    return eat(c, ',') || fail(c);
}

static bool literal(sc *c, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, w, n)) return fail(c);
    c->p += n;
    return true;
}

static bool skip(sc *c) {
    ws(c);
    if (c->bad || c->p >= c->e) return fail(c);
    strm m;
    int st = 0;
    switch (*c->p) {
    case '"': return str(c, &m);
    case '{':
        while (member(c, &st, &m))
            if (!skip(c)) return false;
        return !c->bad;
    case '[':
        while (element(c, &st))
            if (!skip(c)) return false;
        return !c->bad;
    case 't': return c->items++, literal(c, "true");
    case 'f': return c->items++, literal(c, "false");
    case 'n': return c->items++, literal(c, "null");
    default: {
        c->items++;
        const char *s = c->p;
        while (c->p < c->e && (strchr("0123456789+-.eE", *c->p) && *c->p)) c->p++;
        return c->p > s || fail(c);
    }
    }
}

/* A string at the cursor measured into v; false (and the value skipped)
 * when the value is not a string. */
static bool string_at(sc *c, strm *v) {
    if (at(c, '"')) return str(c, v);
    skip(c);
    return false;
}

/* ------------------------------------------------------------ messages */
static const char *const CHAT_PARTS[] = {"text", NULL};
static const char *const RESP_PARTS[] = {"input_text", "output_text", "text", NULL};

/* What a content counts, by presize kind: kind[KS_PRESIZE_USER] the texts
 * of a user's, [KS_PRESIZE_TOOL] the tool results in it (Messages), and the
 * assistant's count as text after a "</think>" (presize.c's rule): plain
 * the trimmed sum, think the sum from the last part holding one. */
typedef struct counts {
    size_t plain, think, tool;
} counts;

/* A text of a content: added to plain, and to think (reset where it holds
 * a "</think>"). */
static void add_text(counts *o, const strm *v) {
    o->plain += v->trim;
    o->think = v->think ? v->tail : o->think + v->trim;
}

static void content(sc *c, const char *const *types, counts *o);

/* A content part {type, text}, or a Messages tool_result block {type,
 * content}: counted when its type is one of types (or tool_result), else
 * not (the parsers join text parts with "\n"; the trimmed parts add up to
 * at most the trimmed text they make). */
static void part(sc *c, const char *const *types, counts *o) {
    if (!at(c, '{')) {
        skip(c);
        return;
    }
    int st = 0;
    strm k, v, text = {0};
    counts inner = {0};
    bool ok = false, result = false;
    while (member(c, &st, &k)) {
        if (is(&k, "type")) {
            bool isstr = string_at(c, &v); /* v is not measured when the type is not a string */
            ok = isstr && in(&v, types);
            result = isstr && is(&v, "tool_result");
        } else if (is(&k, "text")) {
            if (!string_at(c, &text)) text = (strm){0};
        } else if (is(&k, "content")) {
            inner = (counts){0};
            content(c, types, &inner);
        } else {
            skip(c);
        }
    }
    if (c->bad) return;
    if (ok) add_text(o, &text);
    if (result) o->tool += inner.plain;
}

/* A content: a string or an array of parts. */
static void content(sc *c, const char *const *types, counts *o) {
    strm v;
    if (at(c, '"')) {
        if (str(c, &v)) add_text(o, &v);
        return;
    }
    if (!at(c, '[')) {
        skip(c);
        return;
    }
    int st = 0;
    while (element(c, &st)) part(c, types, o);
}

/* The presize kind of a role in the shape's words; -1: not counted. */
static int role_kind(const strm *r, ks_prescan_shape sh) {
    if (is(r, "user")) return KS_PRESIZE_USER;
    if (is(r, "assistant")) return KS_PRESIZE_ASSISTANT;
    if (is(r, "system") || (sh != KS_PRESCAN_MESSAGES && is(r, "developer"))) return KS_PRESIZE_SYSTEM;
    if (sh == KS_PRESCAN_CHAT && is(r, "tool")) return KS_PRESIZE_TOOL;
    return -1;
}

/* A message (chat, Messages) or a Responses input item: its content when
 * its role's contents are counted (Responses: a message item; or a
 * function_call_output, whose output is a tool's result); a Messages user
 * message's tool_result blocks as tool results. */
static size_t message(sc *c, const ks_presize *p, ks_prescan_shape sh) {
    if (!at(c, '{')) return skip(c), 0;
    int st = 0, role = -1, item = 0; /* Responses: 0 a message, 1 a call's output, -1 another item */
    strm k, v, output = {0};
    counts n = {0};
    static const char *const MSG_BLOCKS[] = {"text", "tool_result", NULL};
    const char *const *types = sh == KS_PRESCAN_RESPONSES ? RESP_PARTS : sh == KS_PRESCAN_MESSAGES ? MSG_BLOCKS : CHAT_PARTS;
    while (member(c, &st, &k)) {
        if (is(&k, "role")) role = string_at(c, &v) ? role_kind(&v, sh) : -1;
        else if (is(&k, "content")) {
            n = (counts){0};
            content(c, types, &n);
        } else if (sh == KS_PRESCAN_RESPONSES && is(&k, "type")) {
            item = !string_at(c, &v) ? -1
                   : is(&v, "message")                                                          ? 0
                   : is(&v, "function_call_output") || is(&v, "custom_tool_call_output") ? 1
                                                                                              : -1;
        } else if (sh == KS_PRESCAN_RESPONSES && is(&k, "output")) {
            if (!string_at(c, &output)) output = (strm){0};
        } else {
            skip(c);
        }
    }
    if (c->bad || item < 0) return 0;
    if (item == 1) return p->content[KS_PRESIZE_TOOL] ? output.trim : 0;
    size_t out = sh == KS_PRESCAN_MESSAGES && p->content[KS_PRESIZE_TOOL] ? n.tool : 0;
    if (role < 0 || !p->content[role]) return out;
    return out + (role == KS_PRESIZE_ASSISTANT ? n.think : n.plain);
}

/* ------------------------------------------------------------ tools */
/* A JSON schema's properties: the parameters' names and descriptions. */
static size_t properties(sc *c, const ks_presize *p) {
    if (!at(c, '{')) return skip(c), 0;
    int st = 0;
    strm k, kk, v;
    size_t n = 0;
    while (member(c, &st, &k)) {
        if (p->param_name) n += k.n;
        if (!p->param_desc || !at(c, '{')) {
            skip(c);
            continue;
        }
        int st2 = 0;
        while (member(c, &st2, &kk)) {
            if (is(&kk, "description")) n += string_at(c, &v) ? v.n : 0;
            else skip(c);
        }
    }
    return n;
}

static size_t schema(sc *c, const ks_presize *p) {
    if (!at(c, '{')) return skip(c), 0;
    int st = 0;
    strm k;
    size_t n = 0;
    while (member(c, &st, &k)) {
        if (is(&k, "properties")) n += properties(c, p);
        else skip(c);
    }
    return n;
}

/* One member of a function's object: its name, description, or the schema
 * of its parameters (under schema_key), counted into *n; others skipped. */
static void fn_member(sc *c, const ks_presize *p, const strm *k, const char *schema_key, size_t *n) {
    strm v;
    if (is(k, "name")) *n += string_at(c, &v) && p->tool_name ? v.n : 0;
    else if (is(k, "description")) *n += string_at(c, &v) && p->tool_desc ? v.n : 0;
    else if (is(k, schema_key)) *n += schema(c, p);
    else skip(c);
}

/* A tool: chat's {type: "function", function: {...}}, Responses'
 * {type: "function", name, ...} (other types are dropped or renamed: not
 * counted), Messages' {name, description, input_schema} without a type or
 * of type "custom" (server tools are dropped). */
static size_t tool(sc *c, const ks_presize *p, ks_prescan_shape sh) {
    if (!at(c, '{')) return skip(c), 0;
    int st = 0, type = 0; /* 0 none, 1 the counted one, -1 another */
    strm k, v;
    size_t n = 0;
    bool deferred = false; /* defer_loading: not rendered (api_msg_tools.c, api_chat.c) */
    while (member(c, &st, &k)) {
        if (sh != KS_PRESCAN_RESPONSES && is(&k, "defer_loading")) {
            deferred = at(c, 't');
            skip(c);
            continue;
        }
        if (is(&k, "type")) type = string_at(c, &v) && is(&v, sh == KS_PRESCAN_MESSAGES ? "custom" : "function") ? 1 : -1;
        else if (sh == KS_PRESCAN_CHAT && is(&k, "function") && at(c, '{')) {
            int st2 = 0;
            strm kk;
            while (member(c, &st2, &kk)) fn_member(c, p, &kk, "parameters", &n);
        } else if (sh != KS_PRESCAN_CHAT)
            fn_member(c, p, &k, sh == KS_PRESCAN_MESSAGES ? "input_schema" : "parameters", &n);
        else
            skip(c);
    }
    return (sh == KS_PRESCAN_MESSAGES ? type >= 0 : type == 1) && !deferred && !c->bad ? n : 0;
}

void ks_prescan_count(const ks_presize *p, ks_prescan_shape sh, const char *body, size_t len, bool prefix,
                      ks_prescan_counts *out) {
    *out = (ks_prescan_counts){0};
    if (!body) return;
    static const ks_presize none;
    if (!p || sh == KS_PRESCAN_NONE) p = &none, sh = KS_PRESCAN_NONE;
    sc c = {body, body + len, 0, false, 0};
    size_t msgs = 0, tools = 0;
    int st = 0;
    strm k, v;
    if (!at(&c, '{')) { /* not an object (the parser refuses it): its items all the same */
        skip(&c);
        out->items = c.items;
        return;
    }
    while (member(&c, &st, &k)) {
        if (sh == KS_PRESCAN_NONE) {
            skip(&c);
            continue;
        }
        int el = 0;
        if (sh != KS_PRESCAN_RESPONSES && is(&k, "messages") && at(&c, '[')) {
            while (element(&c, &el)) msgs += message(&c, p, sh);
        } else if (is(&k, "tools") && at(&c, '[')) {
            /* A template that renders no tools: they are fields outside the
             * prompt like any other (issue 42: parsed whole, then ignored). */
            const char *b = c.p;
            while (element(&c, &el)) tools += tool(&c, p, sh);
            if (!p->tool_name && !p->tool_desc && !p->param_name && !p->param_desc && !c.bad)
                out->other += (size_t)(c.p - b);
        } else if (sh == KS_PRESCAN_MESSAGES && is(&k, "system")) {
            counts n = {0};
            content(&c, CHAT_PARTS, &n);
            msgs += p->content[KS_PRESIZE_SYSTEM] ? n.plain : 0;
        } else if (sh == KS_PRESCAN_RESPONSES && is(&k, "instructions")) {
            msgs += string_at(&c, &v) && p->content[0] ? v.trim : 0;
        } else if (sh == KS_PRESCAN_RESPONSES && is(&k, "input")) {
            if (at(&c, '[')) {
                while (element(&c, &el)) msgs += message(&c, p, sh);
            } else {
                msgs += string_at(&c, &v) && p->content[1] ? v.trim : 0;
            }
        } else {
            const char *b = c.p;
            size_t i0 = c.items;
            if (skip(&c)) {
                out->other += (size_t)(c.p - b);
                out->other_items += c.items - i0;
            }
        }
    }
    out->items = c.items;
    ws(&c);
    out->bytes = prefix || !(c.bad || c.p != c.e) ? msgs + tools : 0;
}

size_t ks_prescan_bytes(const ks_presize *p, ks_prescan_shape sh, const char *body, size_t len) {
    ks_prescan_counts n;
    ks_prescan_count(p, sh, body, len, false, &n);
    return n.bytes;
}

size_t ks_prescan_prefix_bytes(const ks_presize *p, ks_prescan_shape sh, const char *body, size_t len) {
    ks_prescan_counts n;
    ks_prescan_count(p, sh, body, len, true, &n);
    return n.bytes;
}

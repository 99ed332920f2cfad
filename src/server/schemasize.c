/*
 * schemasize.c — see schemasize.h.
 */
#include "server/schemasize.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define REPEAT_CAP 2000 /* llama.cpp's MAX_REPETITION_THRESHOLD: past it, a maximum is unbounded */
#define PATTERN_GROUPS 64

typedef struct walk {
    ks_schema_size *sz;
    char *why;
    size_t why_len;
    char path[160];
} walk;

static int refuse(walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(walk *w, const char *fmt, ...) {
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (w->why && w->why_len) snprintf(w->why, w->why_len, "%s (at '%s')", what, w->path[0] ? w->path : "/");
    return KS_EINVAL;
}

static int totals(walk *w) {
    if (w->sz->properties > KS_SCHEMA_MAX_PROPERTIES)
        return refuse(w, "it has more than %d object properties", KS_SCHEMA_MAX_PROPERTIES);
    if (w->sz->alternatives > KS_SCHEMA_MAX_ALTERNATIVES)
        return refuse(w, "it has more than %d enum values and anyOf/oneOf branches", KS_SCHEMA_MAX_ALTERNATIVES);
    if (w->sz->strings > KS_SCHEMA_MAX_STRING)
        return refuse(w, "its property names, definition names, enum and const strings are more than %d bytes",
                      KS_SCHEMA_MAX_STRING);
    return 0;
}

static size_t str_bytes(const json_t *v) { return json_is_string(v) ? json_string_length(v) : 0; }

static int add(walk *w, const json_t *s, int depth);

/* s's member key (a schema, or for list a container of schemas) under path "/key[/i]". */
static int sub(walk *w, const json_t *s, const char *key, int depth, bool list) {
    const json_t *v = json_object_get(s, key);
    if (!v) return 0;
    size_t at = strlen(w->path);
    int rc = 0;
    snprintf(w->path + at, sizeof w->path - at, "/%s", key);
    size_t at2 = strlen(w->path);
    if (!list) {
        rc = add(w, v, depth);
    } else if (json_is_array(v)) {
        size_t i;
        const json_t *x;
        json_array_foreach(v, i, x) {
            snprintf(w->path + at2, sizeof w->path - at2, "/%zu", i);
            if ((rc = add(w, x, depth))) break;
        }
    } else if (json_is_object(v)) {
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            snprintf(w->path + at2, sizeof w->path - at2, "/%s", k);
            if ((rc = add(w, x, depth))) break;
        }
    }
    if (!rc) w->path[at] = '\0';
    return rc;
}

static int add(walk *w, const json_t *s, int depth) {
    if (!json_is_object(s)) return 0;
    if (depth >= KS_SCHEMA_MAX_DEPTH) return refuse(w, "it nests more than %d schemas", KS_SCHEMA_MAX_DEPTH);
    int rc;
    const json_t *props = json_object_get(s, "properties");
    if (json_is_object(props)) {
        size_t k = json_object_size(props), req = 0, i;
        const json_t *r;
        json_array_foreach(json_object_get(s, "required"), i, r)
            if (json_is_string(r) && json_object_get(props, json_string_value(r))) req++;
        if (req > k) req = k; /* a name required twice */
        if (k - req > KS_SCHEMA_MAX_OPTIONAL)
            return refuse(w, "an object has %zu optional properties (at most %d; list the others in 'required')",
                          k - req, KS_SCHEMA_MAX_OPTIONAL);
        w->sz->properties += k;
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)props, key, v) w->sz->strings += strlen(key);
        if ((rc = totals(w))) return rc;
    }
    const json_t *e = json_object_get(s, "enum");
    if (json_is_array(e)) {
        size_t i;
        const json_t *v;
        w->sz->alternatives += json_array_size(e);
        json_array_foreach(e, i, v) w->sz->strings += str_bytes(v);
    }
    w->sz->strings += str_bytes(json_object_get(s, "const"));
    w->sz->alternatives += json_array_size(json_object_get(s, "anyOf")) + json_array_size(json_object_get(s, "oneOf"));
    static const char *const defs[] = {"$defs", "definitions"};
    for (int d = 0; d < 2; d++) {
        const char *key;
        const json_t *v;
        const json_t *o = json_object_get(s, defs[d]);
        if (json_is_object(o)) json_object_foreach((json_t *)o, key, v) w->sz->strings += strlen(key);
    }
    if ((rc = totals(w))) return rc;
    const char *pattern = json_string_value(json_object_get(s, "pattern"));
    size_t rep = pattern ? ks_schema_pattern_repeat(pattern) : 1;
    if (rep > KS_SCHEMA_MAX_REPEAT)
        return refuse(w, "its pattern's nested quantifiers repeat %zu times (at most %d)", rep, KS_SCHEMA_MAX_REPEAT);
    /* Every place a schema holds schemas (JSON Schema 2020-12 and draft 7). */
    static const char *const one[] = {"items", "additionalProperties", "not", "contains", "if", "then", "else",
                                      "propertyNames", "unevaluatedProperties", "unevaluatedItems",
                                      "additionalItems", NULL};
    static const char *const many[] = {"properties", "anyOf", "oneOf", "allOf", "prefixItems", "$defs",
                                       "definitions", "patternProperties", "dependentSchemas", NULL};
    for (const char *const *k = one; *k; k++) {
        /* items may be an array (draft 7's tuples) */
        bool list = !strcmp(*k, "items") && json_is_array(json_object_get(s, "items"));
        if ((rc = sub(w, s, *k, depth + 1, list))) return rc;
    }
    for (const char *const *k = many; *k; k++)
        if ((rc = sub(w, s, *k, depth + 1, true))) return rc;
    return 0;
}

int ks_schema_size_add(ks_schema_size *sz, const json_t *schema, char *why, size_t why_len) {
    walk w = {.sz = sz, .why = why, .why_len = why_len};
    return add(&w, schema, 0);
}

/* A quantifier at *p ({n}, {n,}, {n,m}; *, + and ? repeat without copies):
 * how many copies llama.cpp's grammar makes of what it repeats; *p moves
 * past it. 1 when there is none. */
static size_t quantifier(const char **p) {
    const char *q = *p;
    if (*q == '*' || *q == '+' || *q == '?') {
        *p = q + 1;
        return 1;
    }
    if (*q != '{') return 1;
    char *end;
    unsigned long long lo = strtoull(q + 1, &end, 10), hi = lo;
    if (end == q + 1) return 1; /* a literal brace */
    bool open = false;
    if (*end == ',') {
        const char *h = end + 1;
        hi = strtoull(h, &end, 10);
        open = end == h;
    }
    if (*end != '}') return 1;
    *p = end + 1;
    if (!open && hi <= REPEAT_CAP) return hi ? (size_t)hi : 1;
    return lo > REPEAT_CAP ? REPEAT_CAP : lo ? (size_t)lo : 1;
}

static size_t mul(size_t a, size_t b) { return a > SIZE_MAX / (b ? b : 1) ? SIZE_MAX : a * b; }

size_t ks_schema_pattern_repeat(const char *p) {
    size_t group[PATTERN_GROUPS]; /* the largest product inside each open group */
    int depth = 0;
    group[0] = 1;
    while (*p) {
        size_t atom = 1;
        if (*p == '(') {
            if (++depth >= PATTERN_GROUPS) return SIZE_MAX;
            group[depth] = 1;
            p++;
            continue;
        }
        if (*p == ')') {
            if (depth == 0) {
                p++;
                continue;
            }
            atom = group[depth--];
            p++;
        } else if (*p == '[') { /* a class is one atom: to its closing bracket */
            p++;
            if (*p == '^') p++;
            if (*p == ']') p++;
            while (*p && *p != ']') p += p[0] == '\\' && p[1] ? 2 : 1;
            if (*p) p++;
        } else if (*p == '\\' && p[1]) {
            p += 2;
        } else {
            p++;
        }
        size_t n = mul(atom, quantifier(&p));
        if (n > group[depth]) group[depth] = n;
    }
    while (depth > 0) { /* unclosed groups: the converter refuses them; count what they hold */
        size_t in = group[depth--];
        if (in > group[depth]) group[depth] = in;
    }
    return group[0];
}

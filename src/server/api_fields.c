/*
 * api_fields.c — what every request parser shares (api_int.h): OpenAI's
 * error object and the notes of what a request carried that the server went
 * on without; the body as one JSON object; and the typed getters of request
 * fields, each checking type and range with OpenAI's codes.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/textstream.h"
#include "server/api.h"
#include "server/api_int.h"

/* ------------------------------------------------------------------ errors */
void ks_api_error_set(ks_api_error *e, int status, const char *type, const char *code,
                      const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* Both quote the client's strings cut at byte limits ("%.80s", and the
     * buffers' sizes), which can end inside a character: JSON refuses
     * invalid UTF-8, and the error body itself would fail (a 500 "out of
     * memory" for a bad field name; found by tests/fuzz/fuzz_api). */
    ks_utf8_scrub(e->param, strlen(e->param));
    ks_utf8_scrub(e->message, strlen(e->message));
}

void ks_api_note(ks_api_notes *n, const char *field, const char *what) {
    if (!n) return;
    n->n_total++;
    if (n->n >= KS_API_MAX_NOTES) return;
    snprintf(n->v[n->n].field, sizeof n->v[n->n].field, "%s", field);
    snprintf(n->v[n->n].what, sizeof n->v[n->n].what, "%s", what);
    ks_utf8_scrub(n->v[n->n].field, strlen(n->v[n->n].field)); /* a client's name, cut at a byte limit */
    ks_utf8_scrub(n->v[n->n].what, strlen(n->v[n->n].what));
    n->n++;
}

json_t *ks_api_error_json(const ks_api_error *e) {
    /* ks_api_error_set scrubs the message; one filled in another way may
     * still not be UTF-8: json_string refuses that, so fall back to a
     * generic message then. */
    json_t *msg = json_string(e->message);
    if (!msg) msg = json_string("invalid request");
    return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error",
                     "message", msg,
                     "type", e->type ? e->type : T_INVALID,
                     "param", e->param[0] ? json_string(e->param) : json_null(),
                     "code", e->code ? json_string(e->code) : json_null());
}

/* A field counts as absent when missing or null (OpenAI accepts explicit nulls). */
json_t *ks__api_field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

const char *ks__api_str(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

const char *ks__api_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Optional number in [lo, hi] into *out. */
int ks__api_get_number(json_t *root, const char *key, double lo, double hi, float *out,
                      ks_api_error *err) {
    json_t *v = ks__api_field(root, key);
    if (!v) return 0;
    if (!json_is_number(v))
        BAD("invalid_type", key, "Invalid type for '%s': expected a number, but got %s instead.",
            key, ks__api_json_type_name(v));
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo)
        BAD("decimal_below_min_value", key,
            "Invalid '%s': decimal below minimum value. Expected a value >= %g, but got %g instead.",
            key, lo, d);
    if (d > hi)
        BAD("decimal_above_max_value", key,
            "Invalid '%s': decimal above maximum value. Expected a value <= %g, but got %g instead.",
            key, hi, d);
    *out = (float)d;
    return 0;
}

/* Optional integer >= lo into *out; *set (may be NULL) tells whether it was given. */
int ks__api_get_int(json_t *root, const char *key, long long lo, long long hi, long long *out,
                   bool *set, ks_api_error *err) {
    json_t *v = ks__api_field(root, key);
    if (set) *set = v != NULL;
    if (!v) return 0;
    if (!json_is_integer(v))
        BAD("invalid_type", key, "Invalid type for '%s': expected an integer, but got %s instead.",
            key, ks__api_json_type_name(v));
    long long x = json_integer_value(v);
    if (x < lo)
        BAD("integer_below_min_value", key,
            "Invalid '%s': integer below minimum value. Expected a value >= %lld, but got %lld instead.",
            key, lo, x);
    if (x > hi)
        BAD("integer_above_max_value", key,
            "Invalid '%s': integer above maximum value. Expected a value <= %lld, but got %lld instead.",
            key, hi, x);
    *out = x;
    return 0;
}

int ks__api_get_bool(json_t *root, const char *key, bool *out, ks_api_error *err) {
    json_t *v = ks__api_field(root, key);
    if (!v) return 0;
    if (!json_is_boolean(v))
        BAD("invalid_type", key, "Invalid type for '%s': expected a boolean, but got %s instead.",
            key, ks__api_json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

int ks__api_keep(ks_api_request *r, char *s) {
    char **n = realloc(r->owned, (size_t)(r->n_owned + 1) * sizeof *n);
    if (!n) {
        free(s);
        return KS_ENOMEM;
    }
    r->owned = n;
    r->owned[r->n_owned++] = s;
    return 0;
}

int ks__api_err_rc(const ks_api_error *err) { return err->status == 500 ? KS_ENOMEM : KS_EINVAL; }

int ks__api_oom(ks_api_error *err) {
    ks_api_error_set(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
    return KS_ENOMEM;
}

bool ks__api_in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

int ks__api_want(json_t *v, json_type t, const char *what, const char *param, ks_api_error *err) {
    bool ok = t == JSON_TRUE ? json_is_boolean(v) : json_typeof(v) == t;
    if (!ok)
        BAD("invalid_type", param, "Invalid type for '%s': expected %s, but got %s instead.", param, what,
            ks__api_json_type_name(v));
    return 0;
}

void ks__api_note_unknown(json_t *root, ks_api_notes *notes, const char *const *l1, const char *const *l2,
                          const char *const *l3, const char *const *l4) {
    const char *const *lists[] = {l1, l2, l3, l4};
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        bool known = false;
        for (int i = 0; i < 4 && lists[i] && !known; i++) known = ks__api_in_list(lists[i], k);
        if (known) continue;
        ks_api_note(notes, k, "an unknown field");
    }
}

/* Notes a field once per request: a folded path ("tools[].x") seen on many
 * items is one note. */
static void note_once(ks_api_notes *notes, const char *field) {
    for (int i = 0; i < notes->n; i++)
        if (!strcmp(notes->v[i].field, field)) return;
    ks_api_note(notes, field, "an unknown field");
}

/* The objects at the pattern's segments [seg, ...) from v; path: the folded
 * path so far. */
static void walk(json_t *v, const char *pat, char *path, size_t cap, const ks__api_nested *spec,
                 ks_api_notes *notes) {
    size_t len = strlen(path);
    if (!*pat) {
        if (!json_is_object(v)) return;
        if (spec->when_types) {
            const char *ty = json_string_value(json_object_get(v, "type"));
            if (ty && !ks__api_in_list(spec->when_types, ty)) return;
        }
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (ks__api_in_list(spec->known, k) || (spec->ignored && ks__api_in_list(spec->ignored, k))) continue;
            snprintf(path + len, cap - len, "%s%s", len ? "." : "", k);
            note_once(notes, path);
            path[len] = '\0';
        }
        return;
    }
    const char *dot = strchr(pat, '.');
    size_t n = dot ? (size_t)(dot - pat) : strlen(pat);
    const char *next = dot ? dot + 1 : pat + n;
    bool each = n > 2 && !memcmp(pat + n - 2, "[]", 2);
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)(each ? n - 2 : n), pat);
    json_t *c = json_is_object(v) ? json_object_get(v, key) : NULL;
    if (!c) return;
    snprintf(path + len, cap - len, "%s%.*s", len ? "." : "", (int)n, pat);
    if (!each) {
        walk(c, next, path, cap, spec, notes);
    } else if (json_is_array(c)) {
        size_t i;
        json_t *e;
        json_array_foreach(c, i, e) walk(e, next, path, cap, spec, notes);
    }
    path[len] = '\0';
}

void ks__api_note_nested(json_t *root, const ks__api_nested *spec, ks_api_notes *notes) {
    if (!notes) return;
    for (; spec->path; spec++) {
        char path[64] = "";
        walk(root, spec->path, path, sizeof path, spec, notes);
    }
}

/* The body as a JSON object into *root (new reference), or 400. */
int ks__api_load_object(const char *body, size_t len, json_t **root, ks_api_error *err) {
    json_error_t je;
    *root = NULL;
    /* A raw NUL byte is never valid JSON (RFC 8259: control characters
     * must be escaped in strings and are not white space), but jansson
     * takes some bodies with one; refused here so that the parser and the
     * byte pre-scan (prescan.h), which refuses them too, agree. */
    const char *nul = body ? memchr(body, '\0', len) : NULL;
    if (nul)
        BAD("invalid_json", NULL, "We could not parse the JSON body of your request: a NUL byte at offset %zu.",
            (size_t)(nul - body));
    *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!*root)
        BAD("invalid_json", NULL, "We could not parse the JSON body of your request: %s (line %d, column %d).",
            je.text, je.line, je.column);
    if (!json_is_object(*root)) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_type", NULL, "The request body must be a JSON object, not %s.",
                         ks__api_json_type_name(*root));
        json_decref(*root);
        *root = NULL;
        return KS_EINVAL;
    }
    return 0;
}


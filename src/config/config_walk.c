/*
 * config_walk.c — see config_walk.h; the notes on scalars and errors are at
 * the top of config_yaml.c.
 */
#include "config/config_walk.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "config/config_int.h"

/* ------------------------------------------------------------ walking */
const char *ks__cfg_scalar_of(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

const char *ks__cfg_node_desc(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a sequence";
    default: return "nothing";
    }
}

/* "'path' at line N: expected X, got 'v'" — always returns KS_EINVAL. */
int ks__cfg_type_error(walk *w, const char *path, const yaml_node_t *v, const char *expected) {
    const char *s = ks__cfg_scalar_of(v);
    if (s)
        ks_set_err(w->err, w->errlen, "'%s' at line %d: expected %s, got '%.80s'", path, line_of(v),
                   expected, s);
    else
        ks_set_err(w->err, w->errlen, "'%s' at line %d: expected %s, got %s", path, line_of(v),
                   expected, ks__cfg_node_desc(v));
    return KS_EINVAL;
}

/* Key paths longer than out are cut (they only appear in messages). */
void ks__cfg_join(char *out, size_t outlen, const char *prefix, const char *key) {
    int n = (prefix && *prefix) ? snprintf(out, outlen, "%s.%s", prefix, key) : snprintf(out, outlen, "%s", key);
    (void)n; /* checked use of the result keeps -Wformat-truncation quiet at -O3 */
    if (n < 0 && outlen) out[0] = '\0';
}

/* Iterates a mapping, checking that keys are scalars and unique. */

int ks__cfg_each_pair(walk *w, const char *path, yaml_node_t *map, pair_fn fn, void *ud) {
    if (map->type != YAML_MAPPING_NODE) return ks__cfg_type_error(w, path, map, "a mapping");
    yaml_node_pair_t *begin = map->data.mapping.pairs.start;
    yaml_node_pair_t *end = map->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = begin; p < end; p++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
        if (!kn || !vn) {
            ks_set_err(w->err, w->errlen, "'%s': malformed mapping", path);
            return KS_EINVAL;
        }
        const char *key = ks__cfg_scalar_of(kn);
        if (!key) {
            ks_set_err(w->err, w->errlen, "'%s' at line %d: keys must be plain strings, got %s",
                       *path ? path : "top level", line_of(kn), ks__cfg_node_desc(kn));
            return KS_EINVAL;
        }
        for (yaml_node_pair_t *q = begin; q < p; q++) {
            const char *prev = ks__cfg_scalar_of(yaml_document_get_node(w->doc, q->key));
            if (prev && strcmp(prev, key) == 0) {
                char full[512];
                ks__cfg_join(full, sizeof full, path, key);
                ks_set_err(w->err, w->errlen, "duplicate key '%s' at line %d", full, line_of(kn));
                return KS_EINVAL;
            }
        }
        int rc = fn(w, path, key, kn, vn, ud);
        if (rc) return rc;
    }
    return 0;
}

int ks__cfg_fail_unknown(walk *w, const char *path, const char *key, const yaml_node_t *kn) {
    char full[512];
    ks__cfg_join(full, sizeof full, path, key);
    ks_set_err(w->err, w->errlen, "unknown key '%s' at line %d", full, line_of(kn));
    return KS_EINVAL;
}

/* ------------------------------------------------------------ scalar parsers */
bool ks__cfg_parse_i64(const char *s, long long *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool ks__cfg_parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};
    for (int i = 0; s && i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = true, true;
        if (strcasecmp(s, no[i]) == 0) return *out = false, true;
    }
    return false;
}

bool ks__cfg_parse_f64(const char *s, double *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* "268435456", "256MiB", "512M", "1.5 GiB", "10GB". */
bool ks__cfg_parse_bytes(const char *s, int64_t *out) {
    if (!s || !isdigit((unsigned char)*s)) return false;
    const char *p = s;
    while (isdigit((unsigned char)*p)) p++;
    bool frac = *p == '.';
    if (frac) {
        p++;
        if (!isdigit((unsigned char)*p)) return false;
        while (isdigit((unsigned char)*p)) p++;
    }
    size_t nlen = (size_t)(p - s);
    char num[64];
    if (nlen >= sizeof num) return false;
    memcpy(num, s, nlen);
    num[nlen] = '\0';
    while (*p == ' ') p++;

    static const struct { const char *sfx; long double mul; } units[] = {
        {"", 1}, {"b", 1},
        {"k", 1024.0L}, {"ki", 1024.0L}, {"kib", 1024.0L}, {"kb", 1e3L},
        {"m", 1048576.0L}, {"mi", 1048576.0L}, {"mib", 1048576.0L}, {"mb", 1e6L},
        {"g", 1073741824.0L}, {"gi", 1073741824.0L}, {"gib", 1073741824.0L}, {"gb", 1e9L},
        {"t", 1099511627776.0L}, {"ti", 1099511627776.0L}, {"tib", 1099511627776.0L}, {"tb", 1e12L},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].sfx) != 0) continue;
        if (units[i].mul == 1 && frac) return false; /* "1.5" bytes */
        long double v = strtold(num, NULL) * units[i].mul;
        if (!(v >= 0) || v > (long double)INT64_MAX) return false;
        *out = (int64_t)v;
        return true;
    }
    return false;
}

/* A byte count as the YAML may spell it: in the largest binary unit that
 * divides it ("1KiB", "1TiB", "1024TiB"), else in bytes. */
void ks__cfg_fmt_size(long long v, char *out, size_t n) {
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int i = 0; i < 4; i++) {
        long long u = 1LL << (10 * (4 - i));
        if (v > 0 && v % u == 0) {
            snprintf(out, n, "%lld%s", v / u, units[i]);
            return;
        }
    }
    snprintf(out, n, "%lld", v);
}


const field *ks__cfg_find_field(const field *t, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, key) == 0) return &t[i];
    return NULL;
}

/* Parses vn as f into base + f->off. */
int ks__cfg_set_field(walk *w, const char *path, const field *f, const yaml_node_t *vn, void *base) {
    char *dst = (char *)base + f->off;
    const char *s = ks__cfg_scalar_of(vn);
    char expected[160];
    switch (f->kind) {
    case F_INT: {
        long long v;
        snprintf(expected, sizeof expected, "an integer %lld..%lld", f->lo, f->hi);
        if (!s || !ks__cfg_parse_i64(s, &v) || v < f->lo || v > f->hi)
            return ks__cfg_type_error(w, path, vn, expected);
        *(int *)dst = (int)v;
        return 0;
    }
    case F_BOOL:
        if (!s || !ks__cfg_parse_bool(s, (bool *)dst)) return ks__cfg_type_error(w, path, vn, "true or false");
        return 0;
    case F_FLOAT: {
        double v;
        snprintf(expected, sizeof expected, "a number %lld..%lld", f->lo, f->hi);
        if (!s || !ks__cfg_parse_f64(s, &v) || v < (double)f->lo || v > (double)f->hi)
            return ks__cfg_type_error(w, path, vn, expected);
        *(float *)dst = (float)v;
        return 0;
    }
    case F_BYTES: {
        int64_t v;
        char lo[32], hi[32];
        ks__cfg_fmt_size(f->lo, lo, sizeof lo);
        ks__cfg_fmt_size(f->hi, hi, sizeof hi);
        snprintf(expected, sizeof expected, "a byte size %s..%s (e.g. 268435456, 256MiB, 1GiB)", lo, hi);
        if (!s || !ks__cfg_parse_bytes(s, &v) || v < f->lo || v > f->hi) return ks__cfg_type_error(w, path, vn, expected);
        *(int64_t *)dst = v;
        return 0;
    }
    case F_STR:
        /* An empty api_key means "no key"; an empty host cannot be bound. */
        if (!s || (!*s && strcmp(f->name, "host") == 0))
            return ks__cfg_type_error(w, path, vn, "a non-empty string");
        if (strlen(s) != vn->data.scalar.length || strlen(s) >= f->size) {
            snprintf(expected, sizeof expected, "a string of at most %zu bytes", f->size - 1);
            return ks__cfg_type_error(w, path, vn, expected);
        }
        memcpy(dst, s, strlen(s) + 1);
        return 0;
    case F_LOG:
        if (!s || ks_log_parse_level(s) < 0 || strlen(s) >= f->size)
            return ks__cfg_type_error(w, path, vn, "one of debug|info|warn|error|off");
        memcpy(dst, s, strlen(s) + 1);
        return 0;
    case F_PATH: {
        /* The top-level model may be left empty (no model); directories may not. */
        bool may_be_empty = strcmp(f->name, "model") == 0;
        if (!s || strlen(s) != vn->data.scalar.length || (!*s && !may_be_empty))
            return ks__cfg_type_error(w, path, vn, "a path");
        char why[160];
        if (ks__config_expand_path(s, dst, f->size, why, sizeof why) != 0) {
            ks_set_err(w->err, w->errlen, "'%s' at line %d: %s", path, line_of(vn), why);
            return KS_EINVAL;
        }
        return 0;
    }
    }
    return KS_EINVAL;
}

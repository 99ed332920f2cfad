/*
 * config_walk.h — how config_yaml.c walks a libyaml document: the walk's
 * state, mappings key by key with the key path and line in each error, the
 * scalar parsers (integers, booleans, reals, byte sizes with suffixes), and
 * tables of known keys written into a struct by offset (config_walk.c).
 * Inside src/config/ only.
 *
 * Thread model: a walk belongs to the one thread loading a file.
 */
#ifndef KS_CONFIG_WALK_H
#define KS_CONFIG_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <yaml.h>

/* A walk over one document: errors go to err ("'key.path' at line N: ..."). */
typedef struct walk {
    yaml_document_t *doc;
    char *err;
    size_t errlen;
} walk;

/* The 1-based line of a node. */
static inline int line_of(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

/* Called by ks__cfg_each_pair for each key of a mapping (path: the key's). */
typedef int (*pair_fn)(walk *w, const char *path, const char *key, yaml_node_t *kn,
                       yaml_node_t *vn, void *ud);

/* A table of known keys: each a field of a struct, parsed by kind. */
typedef enum { F_INT, F_BOOL, F_FLOAT, F_STR, F_PATH, F_BYTES, F_LOG } field_kind;

typedef struct field {
    const char *name;
    field_kind kind;
    size_t off;  /* offset in the target struct */
    size_t size; /* for strings: buffer size */
    long long lo, hi; /* F_INT, F_FLOAT, F_BYTES: the range, inclusive */
} field;

#define FI(st, name, lo, hi) {#name, F_INT, offsetof(st, name), 0, lo, hi}
#define FB(st, name) {#name, F_BOOL, offsetof(st, name), 0, 0, 0}
#define FF(st, name, lo, hi) {#name, F_FLOAT, offsetof(st, name), 0, lo, hi}
#define FS(st, name, kind) {#name, kind, offsetof(st, name), sizeof(((st *)0)->name), 0, 0}
#define FY(st, name, lo, hi) {#name, F_BYTES, offsetof(st, name), 0, lo, hi}

#define N_FIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* Walking: a scalar's text (NULL for another node); what a node is, for
 * errors; a type error of path; "prefix.key"; a mapping's pairs, keys
 * scalar and unique; an unknown key's error. Errors return KS_EINVAL with
 * w->err written. */
const char *ks__cfg_scalar_of(const yaml_node_t *n);
const char *ks__cfg_node_desc(const yaml_node_t *n);
int ks__cfg_type_error(walk *w, const char *path, const yaml_node_t *v, const char *expected);
void ks__cfg_join(char *out, size_t outlen, const char *prefix, const char *key);
int ks__cfg_each_pair(walk *w, const char *path, yaml_node_t *map, pair_fn fn, void *ud);
int ks__cfg_fail_unknown(walk *w, const char *path, const char *key, const yaml_node_t *kn);
/* Scalars (config_yaml.c's notes): false when s is not one. */
bool ks__cfg_parse_i64(const char *s, long long *out);
bool ks__cfg_parse_bool(const char *s, bool *out);
bool ks__cfg_parse_f64(const char *s, double *out);
bool ks__cfg_parse_bytes(const char *s, int64_t *out);
void ks__cfg_fmt_size(long long v, char *out, size_t n);
/* Tables: a key's field (NULL: unknown); parsing vn as f into base + f->off. */
const field *ks__cfg_find_field(const field *t, size_t n, const char *key);
int ks__cfg_set_field(walk *w, const char *path, const field *f, const yaml_node_t *vn, void *base);

#endif

/*
 * keyring.c — see keyring.h.
 *
 * The keyring keeps no key in clear: each key is held as its SHA-256, and a
 * check hashes the key given once and compares it with every digest in full
 * (no early exit), so the time of a check depends on the number of keys,
 * never on how close a guess came.
 */
#include "server/keyring.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/key.h"

#define MOD "auth"

typedef struct kentry {
    uint8_t digest[32]; /* SHA-256 of the key */
    uint64_t tenant;
    int line;           /* the key file's line (0: inline) */
} kentry;

typedef struct kname {
    uint64_t tenant;
    char *name; /* the key file's name of the tenant (names are not secret) */
} kname;

typedef struct kset {
    kentry *v;
    int n, cap;
    kname *names; /* distinct named tenants of the set */
    int n_names, cap_names;
} kset;

static void kset_free(kset *ks) {
    for (int i = 0; i < ks->n_names; i++) free(ks->names[i].name);
    free(ks->names);
    free(ks->v);
    memset(ks, 0, sizeof *ks);
}

/* Remembers tenant's name. Not searched for repeats (a file of 65,536 named
 * lines would make that quadratic under the mutex): a name given on
 * consecutive lines is kept once, one given apart again (a lookup takes the
 * first). */
static int kset_name(kset *ks, uint64_t tenant, const char *name, size_t n) {
    if (ks->n_names && ks->names[ks->n_names - 1].tenant == tenant) return 0;
    if (ks->n_names == ks->cap_names) {
        int cap = ks->cap_names ? ks->cap_names * 2 : 8;
        kname *v = realloc(ks->names, (size_t)cap * sizeof *v);
        if (!v) return KS_ENOMEM;
        ks->names = v;
        ks->cap_names = cap;
    }
    char *c = malloc(n + 1);
    if (!c) return KS_ENOMEM;
    memcpy(c, name, n);
    c[n] = '\0';
    ks->names[ks->n_names++] = (kname){tenant, c};
    return 0;
}

struct ks_keyring {
    pthread_mutex_t mu;
    kset inline_keys;   /* fixed at create */
    kset file_keys;     /* under mu: the key file's, as read last */
    char *file;         /* NULL: none */
    bool single;        /* note "Tenants" 2: one inline key, no file */
    /* under mu: what the file was when read (or last failed to read) */
    struct timespec mtime;
    off_t size;
    ino_t ino;
    bool seen;
    _Atomic bool reload;
    uint8_t forbid[32]; /* a key no API key may be (the metrics key), when has_forbid */
    bool has_forbid;
};

static bool kset_has(const kset *ks, int n, const uint8_t d[32]);

/* Under mu (or before k is shared): a key of the file's that is also an
 * inline key, or the forbidden one. Checked at create and at every re-read. */
static bool conflicts(const ks_keyring *k, const kset *file, const char *path, char *err, size_t errlen) {
    for (int i = 0; i < file->n; i++) {
        if (kset_has(&k->inline_keys, k->inline_keys.n, file->v[i].digest)) {
            ks_set_err(err, errlen, "%s line %d: a key also given as --api-key / api_key(s)", path, file->v[i].line);
            return true;
        }
        if (k->has_forbid && !memcmp(k->forbid, file->v[i].digest, 32)) {
            ks_set_err(err, errlen, "%s line %d: the metrics key is not an API key (give /metrics a key of its own)",
                       path, file->v[i].line);
            return true;
        }
    }
    return false;
}

uint64_t ks_keyring_tenant_of(const char *s) {
    static const char dom[] = "kvstash-tenant-v1";
    size_t n = strlen(s);
    uint8_t buf[sizeof dom + KS_KEYRING_KEY_MAX + 1], d[32];
    if (n > KS_KEYRING_KEY_MAX) n = KS_KEYRING_KEY_MAX;
    memcpy(buf, dom, sizeof dom); /* with its NUL: the domain ends unambiguously */
    memcpy(buf + sizeof dom, s, n);
    if (ks_sha256(buf, sizeof dom + n, d) != 0) memset(d, 0, sizeof d);
    uint64_t t = 0;
    for (int i = 0; i < 8; i++) t |= (uint64_t)d[i] << (8 * i);
    return t ? t : 1;
}

static bool token_ok(const char *s, size_t n, size_t max) {
    if (n == 0 || n > max) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f) return false;
    return true;
}

static int kset_add(kset *ks, const char *key, size_t n, uint64_t tenant) {
    if (ks->n == ks->cap) {
        int cap = ks->cap ? ks->cap * 2 : 8;
        kentry *v = realloc(ks->v, (size_t)cap * sizeof *v);
        if (!v) return KS_ENOMEM;
        ks->v = v;
        ks->cap = cap;
    }
    kentry *e = &ks->v[ks->n];
    if (ks_sha256(key, n, e->digest) != 0) return KS_ENOMEM;
    e->tenant = tenant;
    ks->n++;
    return 0;
}

/* Whether the key file open as f is safe to take keys from (note 5): a
 * regular file of ours, or root's, that no other user may write. *open_read:
 * others may read it (a warning, not a refusal). */
static int file_safe(FILE *f, const char *path, struct stat *st, bool *open_read, char *err, size_t errlen) {
    if (fstat(fileno(f), st) != 0) {
        ks_set_err(err, errlen, "cannot stat the key file %s: %s", path, strerror(errno));
        return KS_EINVAL;
    }
    if (!S_ISREG(st->st_mode)) {
        ks_set_err(err, errlen, "the key file %s is not a regular file", path);
        return KS_EINVAL;
    }
    if (st->st_uid != geteuid() && st->st_uid != 0) {
        ks_set_err(err, errlen, "the key file %s is owned by uid %u, not by this server's user (uid %u) or root",
                   path, (unsigned)st->st_uid, (unsigned)geteuid());
        return KS_EINVAL;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        ks_set_err(err, errlen, "the key file %s is writable by %s: another user could add a key (chmod 600 it)",
                   path, st->st_mode & S_IWOTH ? "others" : "its group");
        return KS_EINVAL;
    }
    /* As the cache secret file: keys others may read are keys others hold. */
    if (st->st_mode & S_IRWXO) {
        ks_set_err(err, errlen, "the key file %s is readable by others: they hold its keys (chmod 600 it)", path);
        return KS_EINVAL;
    }
    *open_read = (st->st_mode & S_IRGRP) != 0;
    return 0;
}

static int by_digest(const void *a, const void *b) {
    return memcmp(((const kentry *)a)->digest, ((const kentry *)b)->digest, 32);
}

/* A key given twice: under two names it would belong to whichever came
 * last, so it is refused. */
static bool kset_has(const kset *ks, int n, const uint8_t d[32]) {
    for (int i = 0; i < n; i++)
        if (!memcmp(ks->v[i].digest, d, 32)) return true;
    return false;
}

/* Parses the key file at path into *out (emptied first). 0, or KS_EINVAL /
 * KS_ENOMEM with the reason in err; *st: the file's stat when opened;
 * *open_read: others may read it. */
static int read_file(const char *path, kset *out, struct stat *st, bool *open_read, char *err, size_t errlen) {
    out->n = 0;
    *open_read = false;
    FILE *f = fopen(path, "re");
    if (!f) {
        ks_set_err(err, errlen, "cannot read the key file %s: %s", path, strerror(errno));
        return KS_EINVAL;
    }
    int rc = 0, line_no = 0;
    if ((rc = file_safe(f, path, st, open_read, err, errlen)) != 0) {
        fclose(f);
        return rc;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line_no++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n' && !feof(f)) {
            ks_set_err(err, errlen, "%s line %d: too long", path, line_no);
            rc = KS_EINVAL;
            break;
        }
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0') continue;
        char *key = p;
        size_t nk = strcspn(p, " \t\r\n");
        p += nk;
        while (*p == ' ' || *p == '\t') p++;
        char *name = p;
        size_t nn = strcspn(p, " \t\r\n");
        p += nn;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
        if (*p == '#') p += strlen(p); /* a comment after the name */
        if (!token_ok(key, nk, KS_KEYRING_KEY_MAX) || (nn && !token_ok(name, nn, KS_KEYRING_NAME_MAX)) || *p) {
            ks_set_err(err, errlen, "%s line %d: expected 'KEY [NAME]' (a key of 1..%d and a name of 1..%d printable "
                       "bytes without spaces)", path, line_no, KS_KEYRING_KEY_MAX, KS_KEYRING_NAME_MAX);
            rc = KS_EINVAL;
            break;
        }
        if (out->n >= KS_KEYRING_KEYS_MAX) {
            ks_set_err(err, errlen, "%s: more than %d keys", path, KS_KEYRING_KEYS_MAX);
            rc = KS_EINVAL;
            break;
        }
        char who[KS_KEYRING_KEY_MAX + 1];
        size_t nw = nn ? nn : nk;
        memcpy(who, nn ? name : key, nw);
        who[nw] = '\0';
        if ((rc = kset_add(out, key, nk, ks_keyring_tenant_of(who))) != 0 ||
            (nn && (rc = kset_name(out, out->v[out->n - 1].tenant, name, nn)) != 0)) {
            ks_set_err(err, errlen, "out of memory reading %s", path);
            break;
        }
        out->v[out->n - 1].line = line_no;
    }
    /* A key given twice: found by sorting the digests (a file of 65,536 keys
     * is read again under the mutex every check waits on: no quadratic scan). */
    if (rc == 0 && out->n > 1) {
        qsort(out->v, (size_t)out->n, sizeof *out->v, by_digest);
        for (int i = 1; i < out->n && rc == 0; i++)
            if (!memcmp(out->v[i - 1].digest, out->v[i].digest, 32)) {
                int a = out->v[i - 1].line, b = out->v[i].line;
                ks_set_err(err, errlen, "%s line %d: a key given before, on line %d (one key, one tenant)", path,
                           a > b ? a : b, a > b ? b : a);
                rc = KS_EINVAL;
            }
    }
    if (rc == 0 && ferror(f)) {
        ks_set_err(err, errlen, "cannot read the key file %s", path);
        rc = KS_EINVAL;
    }
    fclose(f);
    return rc;
}

int ks_keyring_create(const char *const *keys, int n_keys, const char *file, ks_keyring **out, char *err,
                      size_t errlen) {
    *out = NULL;
    ks_keyring *k = calloc(1, sizeof *k);
    if (!k) return KS_ENOMEM;
    pthread_mutex_init(&k->mu, NULL);
    int rc = 0, n_inline = 0;
    for (int i = 0; i < n_keys; i++)
        if (keys[i] && keys[i][0]) n_inline++;

    k->single = n_inline == 1 && !(file && file[0]);
    for (int i = 0; i < n_keys && rc == 0; i++) {
        if (!keys[i] || !keys[i][0]) continue;
        size_t n = strlen(keys[i]);
        if (!token_ok(keys[i], n, KS_KEYRING_KEY_MAX)) {
            ks_set_err(err, errlen, "API key %d: 1..%d printable bytes without spaces", i + 1, KS_KEYRING_KEY_MAX);
            rc = KS_EINVAL;
            break;
        }
        rc = kset_add(&k->inline_keys, keys[i], n, k->single ? 0 : ks_keyring_tenant_of(keys[i]));
        if (rc == 0 && kset_has(&k->inline_keys, k->inline_keys.n - 1, k->inline_keys.v[k->inline_keys.n - 1].digest)) {
            ks_set_err(err, errlen, "API key %d is given twice", i + 1);
            rc = KS_EINVAL;
        }
    }
    if (rc == 0 && file && file[0]) {
        struct stat st;
        bool open_read = false;
        if (!(k->file = strdup(file))) rc = KS_ENOMEM;
        else if ((rc = read_file(file, &k->file_keys, &st, &open_read, err, errlen)) == 0) {
            k->mtime = st.st_mtim;
            k->size = st.st_size;
            k->ino = st.st_ino;
            k->seen = true;
            if (open_read) KS_WARN(MOD, "the key file %s is readable by its group (chmod 600 it)", file);
            if (conflicts(k, &k->file_keys, file, err, errlen)) rc = KS_EINVAL;
        }
    }
    if (rc) {
        ks_keyring_free(k);
        return rc;
    }
    *out = k;
    return 0;
}

void ks_keyring_free(ks_keyring *k) {
    if (!k) return;
    pthread_mutex_destroy(&k->mu);
    kset_free(&k->inline_keys);
    kset_free(&k->file_keys);
    free(k->file);
    free(k);
}

bool ks_keyring_required(const ks_keyring *k) { return k && (k->inline_keys.n > 0 || k->file); }

/* Under mu: reads the key file again when it changed or a reload was asked. */
static void refresh_locked(ks_keyring *k) {
    struct stat st;
    bool asked = atomic_exchange(&k->reload, false);
    bool ok = stat(k->file, &st) == 0;
    if (!asked && ok && k->seen && st.st_mtim.tv_sec == k->mtime.tv_sec && st.st_mtim.tv_nsec == k->mtime.tv_nsec &&
        st.st_size == k->size && st.st_ino == k->ino)
        return;
    if (!asked && !ok && !k->seen) return; /* still missing: warned already */
    kset fresh = {0};
    char err[512] = "";
    struct stat rst;
    bool open_read = false;
    /* A file that became unsafe (another user may now write it) is not
     * read: the keys read before stay in force, with a warning. */
    int rc = read_file(k->file, &fresh, &rst, &open_read, err, sizeof err);
    if (rc == 0 && conflicts(k, &fresh, k->file, err, sizeof err)) rc = KS_EINVAL;
    /* Remember what was looked at, read or not, so that a bad file is
     * warned about once per change, not once per request. */
    k->seen = rc == 0 || ok;
    if (ok) {
        k->mtime = rc == 0 ? rst.st_mtim : st.st_mtim;
        k->size = rc == 0 ? rst.st_size : st.st_size;
        k->ino = rc == 0 ? rst.st_ino : st.st_ino;
    }
    if (rc) {
        kset_free(&fresh);
        KS_WARN(MOD, "%s; the %d key(s) read before stay in force", err, k->file_keys.n);
        return;
    }
    kset_free(&k->file_keys);
    k->file_keys = fresh;
    KS_INFO(MOD, "key file %s read again: %d key(s)", k->file, fresh.n);
}

static bool ct_eq(const uint8_t *a, const uint8_t *b) {
    unsigned char d = 0;
    for (int i = 0; i < 32; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* Every entry is compared in full; the last match wins (keys are unique in
 * practice, and either match is a tenant the operator gave this key). */
static bool match(const kset *ks, const uint8_t d[32], uint64_t *tenant) {
    bool found = false;
    for (int i = 0; i < ks->n; i++) {
        bool m = ct_eq(ks->v[i].digest, d);
        if (m) *tenant = ks->v[i].tenant;
        found |= m;
    }
    return found;
}

bool ks_keyring_check(ks_keyring *k, const char *key, uint64_t *tenant) {
    *tenant = 0;
    if (!ks_keyring_required(k)) return true;
    if (!key) return false;
    uint8_t d[32];
    size_t n = strlen(key);
    if (n == 0 || n > KS_KEYRING_KEY_MAX || ks_sha256(key, n, d) != 0) return false;
    pthread_mutex_lock(&k->mu);
    if (k->file) refresh_locked(k);
    bool a = match(&k->inline_keys, d, tenant);
    bool b = match(&k->file_keys, d, tenant);
    pthread_mutex_unlock(&k->mu);
    return a | b;
}

int ks_keyring_forbid(ks_keyring *k, const char *key, char *err, size_t errlen) {
    if (!k || !key || !key[0]) return 0;
    uint8_t d[32];
    if (ks_sha256(key, strlen(key), d) != 0) return KS_ENOMEM;
    pthread_mutex_lock(&k->mu);
    memcpy(k->forbid, d, 32);
    k->has_forbid = true;
    int rc = kset_has(&k->inline_keys, k->inline_keys.n, d) || kset_has(&k->file_keys, k->file_keys.n, d) ? KS_EINVAL
                                                                                                        : 0;
    pthread_mutex_unlock(&k->mu);
    if (rc) ks_set_err(err, errlen, "the metrics key is also an API key: give /metrics a key of its own");
    return rc;
}

bool ks_keyring_name(ks_keyring *k, uint64_t tenant, char *out, size_t n) {
    bool found = false;
    if (!k || !n) return false;
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < k->file_keys.n_names && !found; i++)
        if (k->file_keys.names[i].tenant == tenant) {
            snprintf(out, n, "%s", k->file_keys.names[i].name);
            found = true;
        }
    pthread_mutex_unlock(&k->mu);
    return found;
}

void ks_keyring_reload(ks_keyring *k) {
    if (k) atomic_store(&k->reload, true);
}

int ks_keyring_count(ks_keyring *k) {
    if (!k) return 0;
    pthread_mutex_lock(&k->mu);
    if (k->file) refresh_locked(k);
    int n = k->inline_keys.n + k->file_keys.n;
    pthread_mutex_unlock(&k->mu);
    return n;
}

uint64_t ks_keyring_subtenant(uint64_t tenant, const char *field, const char *value, size_t n) {
    static const char dom[] = "kvstash-subtenant-v1";
    size_t nf = strlen(field), len = sizeof dom + 8 + nf + 1 + n;
    uint8_t *buf = malloc(len), d[32];
    if (!buf) return tenant ^ 0x9E3779B97F4A7C15ull; /* still another namespace, if a weak one */
    uint8_t *p = buf;
    memcpy(p, dom, sizeof dom), p += sizeof dom;
    for (int i = 0; i < 8; i++) *p++ = (uint8_t)(tenant >> (8 * i));
    memcpy(p, field, nf + 1), p += nf + 1; /* with its NUL */
    memcpy(p, value, n);
    int rc = ks_sha256(buf, len, d);
    free(buf);
    uint64_t t = 0;
    for (int i = 0; rc == 0 && i < 8; i++) t |= (uint64_t)d[i] << (8 * i);
    if (rc) t = tenant ^ 0x9E3779B97F4A7C15ull;
    return t && t != tenant ? t : t + 1;
}

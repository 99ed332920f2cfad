/*
 * kvparams.c — see kvparams.h.
 */
#include "cache/kvparams.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/key.h"

const char *const ks_kvparams_types[KS_KVPARAMS_N_TYPES] = {"f32",  "f16",    "bf16", "q8_0", "q4_0",
                                                            "q4_1", "iq4_nl", "q5_0", "q5_1"};

/* A params string is short (engine.c writes under 1 KiB). */
#define KVPARAMS_MAX 4096

static int params_path(const char *dir, const uint8_t hash[32], char *out, size_t n) {
    char hex[65];
    ks_hex_encode(hash, 32, hex);
    int w = snprintf(out, n, "%s/params/%s.txt", dir, hex);
    return w < 0 || (size_t)w >= n ? KS_EINVAL : 0;
}

int ks_kvparams_lookup(const char *dir, const uint8_t hash[32], char *out, size_t n) {
    char path[PATH_MAX];
    if (!dir || !dir[0] || !out || n == 0 || params_path(dir, hash, path, sizeof path)) return KS_EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return KS_ENOENT;
    struct stat st;
    char buf[KVPARAMS_MAX];
    ssize_t got = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < KVPARAMS_MAX)
        got = pread(fd, buf, (size_t)st.st_size, 0);
    close(fd);
    if (got < 0 || got != (ssize_t)st.st_size) return KS_ENOENT;
    uint8_t h[32];
    if (ks_sha256(buf, (size_t)got, h) || memcmp(h, hash, 32) != 0) return KS_ENOENT;
    if ((size_t)got >= n) return KS_EINVAL;
    memcpy(out, buf, (size_t)got);
    out[got] = '\0';
    return 0;
}

int ks_kvparams_register(const char *dir, const uint8_t hash[32], const char *params, size_t len) {
    char path[PATH_MAX], sub[PATH_MAX], tmp[PATH_MAX + 32], have[KVPARAMS_MAX];
    if (!dir || !dir[0] || len >= KVPARAMS_MAX || params_path(dir, hash, path, sizeof path)) return KS_EINVAL;
    if (ks_kvparams_lookup(dir, hash, have, sizeof have) == 0) return 0;
    if (snprintf(sub, sizeof sub, "%s/params", dir) >= (int)sizeof sub) return KS_EINVAL;
    if (mkdir(sub, 0700) != 0 && errno != EEXIST) return KS_EIO;
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    /* Plain system calls, not sysio's: the store's fault-injection tests
     * count the calls of the entries' I/O. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return KS_EIO;
    bool ok = write(fd, params, len) == (ssize_t)len && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return KS_EIO;
    }
    return 0;
}

/* The value of "name=" at p (up to ';' or the end) — its start and length. */
static bool field(const char *p, size_t len, const char *name, const char **val, size_t *vlen) {
    size_t nl = strlen(name);
    if (len < nl || memcmp(p, name, nl) != 0) return false;
    const char *v = p + nl, *end = p + len, *semi = memchr(v, ';', (size_t)(end - v));
    *val = v;
    *vlen = (size_t)((semi ? semi : end) - v);
    return *vlen > 0;
}

/* The two types at the start of params: their values and where the rest
 * (after "type_v=V") begins. */
static bool split(const char *params, size_t len, const char **k, size_t *kl, const char **v, size_t *vl,
                  size_t *rest) {
    if (!params || !field(params, len, "type_k=", k, kl)) return false;
    size_t off = (size_t)(*k - params) + *kl;
    if (off >= len || params[off] != ';') return false;
    off++;
    if (!field(params + off, len - off, "type_v=", v, vl)) return false;
    *rest = (size_t)(*v - params) + *vl;
    return true;
}

bool ks_kvparams_type_pair(const char *params, size_t len, char *out, size_t n) {
    const char *k, *v;
    size_t kl, vl, rest;
    if (!split(params, len, &k, &kl, &v, &vl, &rest)) return false;
    int w = snprintf(out, n, "%.*s/%.*s", (int)kl, k, (int)vl, v);
    return w > 0 && (size_t)w < n;
}

int ks_kvparams_with_types(const char *params, size_t len, const char *kt, const char *vt, char *out, size_t n) {
    const char *k, *v;
    size_t kl, vl, rest;
    if (!split(params, len, &k, &kl, &v, &vl, &rest)) return -1;
    int w = snprintf(out, n, "type_k=%s;type_v=%s", kt, vt);
    if (w < 0 || (size_t)w + (len - rest) >= n) return -1;
    memcpy(out + w, params + rest, len - rest);
    out[(size_t)w + (len - rest)] = '\0';
    return w + (int)(len - rest);
}

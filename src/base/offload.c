/*
 * offload.c — the GPU offload settings and their parsers. See offload.h.
 */
#include "base/offload.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void ks_offload_defaults(ks_offload *o) {
    memset(o, 0, sizeof *o);
    o->n_gpu_layers = KS_NGL_AUTO;
    o->split_mode = KS_SPLIT_LAYER;
    o->kv_offload = true;
    o->op_offload = true;
}

static int refuse(char *why, size_t whylen, const char *fmt, const char *s) {
    if (whylen) snprintf(why, whylen, fmt, s ? s : "");
    return KS_EINVAL;
}

int ks_offload_parse_layers(const char *s, int *out, char *why, size_t whylen) {
    if (!s || !*s) return refuse(why, whylen, "must be a layer count, auto or all, got '%s'", s);
    if (!strcmp(s, "auto")) { *out = KS_NGL_AUTO; return 0; }
    if (!strcmp(s, "all")) { *out = KS_NGL_ALL; return 0; }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > INT_MAX)
        return refuse(why, whylen, "must be a layer count (0 or more), auto or all, got '%s'", s);
    *out = (int)v;
    return 0;
}

int ks_offload_parse_split_mode(const char *s, int *out, char *why, size_t whylen) {
    if (s && !strcmp(s, "none")) *out = KS_SPLIT_NONE;
    else if (s && !strcmp(s, "layer")) *out = KS_SPLIT_LAYER;
    else if (s && !strcmp(s, "row")) *out = KS_SPLIT_ROW;
    else return refuse(why, whylen, "must be none, layer or row, got '%s'", s);
    return 0;
}

int ks_offload_parse_tensor_split(const char *s, float *out, int *n, char *why, size_t whylen) {
    float v[KS_OFFLOAD_DEVICES_MAX];
    int k = 0;
    double sum = 0.0;
    if (!s || !*s) return refuse(why, whylen, "must be proportions like 3,1, got '%s'", s);
    const char *p = s;
    for (;;) {
        if (k == KS_OFFLOAD_DEVICES_MAX) {
            if (whylen) snprintf(why, whylen, "has more than %d entries: '%s'", KS_OFFLOAD_DEVICES_MAX, s);
            return KS_EINVAL;
        }
        char *end = NULL;
        errno = 0;
        double d = strtod(p, &end);
        /* strtod skips leading blanks; an entry must start with a digit or a dot */
        if (end == p || errno || !isfinite(d) || d < 0.0 || !(*p == '.' || (*p >= '0' && *p <= '9')))
            return refuse(why, whylen, "must be numbers >= 0 separated by ',' (like 3,1), got '%s'", s);
        v[k++] = (float)d;
        sum += d;
        if (*end == '\0') break;
        if (*end != ',' && *end != '/')
            return refuse(why, whylen, "must be numbers >= 0 separated by ',' (like 3,1), got '%s'", s);
        p = end + 1;
    }
    if (!(sum > 0.0)) return refuse(why, whylen, "does not add up to anything: every proportion is 0 in '%s'", s);
    memcpy(out, v, sizeof(float) * (size_t)k);
    *n = k;
    return 0;
}

int ks_offload_check_devices(const char *s, char *why, size_t whylen) {
    if (!s || !*s) return refuse(why, whylen, "must be device names like CUDA0,CUDA1 or none, got '%s'", s);
    if (strlen(s) >= KS_OFFLOAD_DEVICES_LEN) return refuse(why, whylen, "is too long: '%.40s...'", s);
    if (!strcmp(s, "none")) return 0;
    int k = 0;
    for (const char *p = s;;) {
        size_t len = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-");
        if (len == 0 || (p[len] != ',' && p[len] != '\0'))
            return refuse(why, whylen, "must be device names like CUDA0,CUDA1 or none, got '%s'", s);
        if (++k > KS_OFFLOAD_DEVICES_MAX) {
            if (whylen) snprintf(why, whylen, "names more than %d devices", KS_OFFLOAD_DEVICES_MAX);
            return KS_EINVAL;
        }
        if (p[len] == '\0') break;
        p += len + 1;
    }
    return 0;
}

const char *ks_offload_layers_str(int n_gpu_layers, char *buf, size_t n) {
    if (n_gpu_layers == KS_NGL_AUTO) snprintf(buf, n, "auto");
    else if (n_gpu_layers == KS_NGL_ALL || n_gpu_layers < 0) snprintf(buf, n, "all");
    else snprintf(buf, n, "%d", n_gpu_layers);
    return buf;
}

const char *ks_offload_split_mode_name(int mode) {
    switch (mode) {
    case KS_SPLIT_NONE: return "none";
    case KS_SPLIT_LAYER: return "layer";
    case KS_SPLIT_ROW: return "row";
    default: return "?";
    }
}

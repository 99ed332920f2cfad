/*
 * cli.c — see cli.h: the one way the command line reads a number, so that
 * every flag refuses the same inputs ("", "12abc", "1e999", "nan", a value
 * out of range) with the same message naming the flag and its range.
 */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/mkmodel.h"

/* strtod over the start of s: 0 and *end after the number, or -1 when s has
 * no number, it overflows or underflows (ERANGE), or it is not finite. */
static int scan_double(const char *s, double *v, char **end) {
    if (!s || !*s) return -1;
    errno = 0;
    *v = strtod(s, end);
    if (*end == s || errno == ERANGE || !isfinite(*v)) return -1;
    return 0;
}

int ks_cli_parse_ll(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
                    long long *out) {
    char *end = NULL;
    long long v = 0;
    if (s && *s) {
        errno = 0;
        v = strtoll(s, &end, 10);
    }
    /* The tests short-circuit: errno is read only after strtoll ran. */
    if (!s || !*s || end == s || *end || errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "%s: %s must be an integer in [%lld, %lld], got '%s'\n", cmd, flag, lo, hi,
                s ? s : "");
        return KS_EINVAL;
    }
    *out = v;
    return 0;
}

int ks_cli_parse_int(const char *cmd, const char *flag, const char *s, int lo, int hi, int *out) {
    long long v;
    int rc = ks_cli_parse_ll(cmd, flag, s, lo, hi, &v);
    if (rc == 0) *out = (int)v; /* in [lo, hi]: fits */
    return rc;
}

int ks_cli_parse_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
                        double *out) {
    char *end = NULL;
    double v = 0;
    if (scan_double(s, &v, &end) != 0 || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s must be a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi,
                s ? s : "");
        return KS_EINVAL;
    }
    *out = v;
    return 0;
}

int ks_cli_parse_size(const char *cmd, const char *flag, const char *s, int64_t *out) {
    char *end = NULL;
    double v = 0, mul = 1;
    if (scan_double(s, &v, &end) != 0 || v < 0) goto bad;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1048576.0; break;
        case 'g': case 'G': mul = 1073741824.0; break;
        case 't': case 'T': mul = 1099511627776.0; break;
        default: goto bad;
        }
        end++;
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
        if (*end) goto bad;
    }
    v *= mul;
    /* 9.2e18 < 2^63 - 1: whatever is larger might not fit an int64_t. */
    if (v > 9.2e18) goto bad;
    *out = (int64_t)v;
    return 0;
bad:
    fprintf(stderr, "%s: %s must be a size in [0, 8 EiB) like 500M or 2G, got '%s'\n", cmd, flag,
            s ? s : "");
    return KS_EINVAL;
}

int ks_cli_parse_log(const char *cmd, const char *s, int *out) {
    int lv = s ? ks_log_parse_level(s) : -1;
    if (lv < 0) {
        fprintf(stderr, "%s: --log must be debug, info, warn, error or off, got '%s'\n", cmd, s ? s : "");
        return KS_EINVAL;
    }
    *out = lv;
    return 0;
}
int ks_cli_parse_flash_attn(const char *cmd, const char *optarg, int argc, char **argv, int *optind, int *out) {
    /* "--flash-attn off" as two words too: getopt gives an optional argument
     * only when it is glued ("--flash-attn=off"). */
    const char *v = optarg;
    if (!v && *optind < argc &&
        (!strcmp(argv[*optind], "on") || !strcmp(argv[*optind], "off") || !strcmp(argv[*optind], "auto")))
        v = argv[(*optind)++];
    if (!v || !strcmp(v, "on")) *out = 1;
    else if (!strcmp(v, "off")) *out = 0;
    else if (!strcmp(v, "auto")) *out = -1;
    else {
        fprintf(stderr, "%s: --flash-attn: '%s' is not on, off or auto\n", cmd, v);
        return KS_EINVAL;
    }
    return 0;
}

/* Reads the template file into *out (owned: free()). Returns 0, 1 (cannot
 * open or read it) or 2 (not acceptable text); the message is printed. */
int ks_cli_read_template(const char *cmd, const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        fprintf(stderr, "%s: --chat-template '%s': %s\n", cmd, path, strerror(e));
        return 1;
    }
    /* One byte more than the limit tells "too large" without trusting
     * st_size (a pipe has none). */
    size_t cap = KS_MKMODEL_TMPL_MAX + 1;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        fprintf(stderr, "%s: %s\n", cmd, ks_strerror(KS_ENOMEM));
        return 1;
    }
    size_t n = fread(buf, 1, cap, f);
    int e = ferror(f) ? errno : 0;
    fclose(f);
    int rc = 0;
    if (e) {
        fprintf(stderr, "%s: --chat-template '%s': cannot read: %s\n", cmd, path,
                strerror(e ? e : EIO));
        rc = 1;
    } else if (n == 0) {
        fprintf(stderr, "%s: --chat-template '%s': the file is empty\n", cmd, path);
        rc = 2;
    } else if (n > KS_MKMODEL_TMPL_MAX) {
        fprintf(stderr, "%s: --chat-template '%s': larger than %d bytes (1 MiB)\n", cmd, path,
                KS_MKMODEL_TMPL_MAX);
        rc = 2;
    } else if (memchr(buf, '\0', n)) {
        fprintf(stderr, "%s: --chat-template '%s': holds a NUL byte, not text\n", cmd, path);
        rc = 2;
    }
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

/* ------------------------------------------------------------ offload flags */
int ks_cli_offload_flag(const char *cmd, int which, const char *arg, ks_offload *o, unsigned *given) {
    char why[256];
    int rc = 0;
    const char *flag = "";
    switch (which) {
    case 0: flag = "--gpu-layers"; rc = ks_offload_parse_layers(arg, &o->n_gpu_layers, why, sizeof why); break;
    case 1:
        flag = "--device";
        if (!(rc = ks_offload_check_devices(arg, why, sizeof why))) snprintf(o->devices, sizeof o->devices, "%s", arg);
        break;
    case 2: flag = "--split-mode"; rc = ks_offload_parse_split_mode(arg, &o->split_mode, why, sizeof why); break;
    case 3:
        flag = "--tensor-split";
        rc = ks_offload_parse_tensor_split(arg, o->tensor_split, &o->n_tensor_split, why, sizeof why);
        break;
    case 4:
        if (ks_cli_parse_int(cmd, "--main-gpu", arg, 0, KS_OFFLOAD_DEVICES_MAX - 1, &o->main_gpu)) return KS_EINVAL;
        break;
    case 5: o->kv_offload = false; break;
    case 6: o->op_offload = false; break;
    default: return KS_EINVAL;
    }
    if (rc) {
        fprintf(stderr, "%s: %s %s\n", cmd, flag, why);
        return rc;
    }
    *given |= 1u << which;
    return 0;
}

void ks_cli_offload_apply(const ks_offload *src, unsigned given, ks_offload *dst) {
    if (given & 1u) dst->n_gpu_layers = src->n_gpu_layers;
    if (given & 2u) memcpy(dst->devices, src->devices, sizeof dst->devices);
    if (given & 4u) dst->split_mode = src->split_mode;
    if (given & 8u) {
        memcpy(dst->tensor_split, src->tensor_split, sizeof dst->tensor_split);
        dst->n_tensor_split = src->n_tensor_split;
    }
    if (given & 16u) dst->main_gpu = src->main_gpu;
    if (given & 32u) dst->kv_offload = src->kv_offload;
    if (given & 64u) dst->op_offload = src->op_offload;
}

void ks_cli_offload_aliases(int argc, char **argv) {
    static char *const from[] = {"-ngl", "-dev", "-sm", "-ts", "-mg", "-nkvo", "-ctk", "-ctv", "-md", "-ngld"};
    static char *const to[] = {"--gpu-layers", "--device", "--split-mode", "--tensor-split", "--main-gpu",
                               "--no-kv-offload", "--cache-type-k", "--cache-type-v", "--model-draft",
                               "--gpu-layers-draft"};
    ks_cli_rename_flags(argc, argv, from, to, sizeof from / sizeof from[0]);
}

void ks_cli_rename_flags(int argc, char **argv, char *const *from, char *const *to, size_t n) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        for (size_t k = 0; k < n; k++)
            if (!strcmp(argv[i], from[k])) argv[i] = to[k];
    }
}

const char *const ks_cli_offload_usage =
    "  -ngl, --gpu-layers N|auto|all\n"
    "                            layers on GPUs: auto (default) puts every layer that fits on the\n"
    "                            GPUs found and none without one; all; or a count up to the\n"
    "                            model's layers + 1 (the output layer). A GPU turns exact output\n"
    "                            off (exact: unavailable): -ngl 0 keeps the model on the CPU\n"
    "  --device LIST|none        GPUs to use, e.g. CUDA0,CUDA1 (default: every GPU found); none:\n"
    "                            the CPU alone (-dev)\n"
    "  --split-mode none|layer|row  how layers spread over several GPUs (default layer; -sm)\n"
    "  --tensor-split A,B,..     share of the offloaded layers per GPU in use, e.g. 3,1 (default:\n"
    "                            by free memory; -ts)\n"
    "  --main-gpu N              the GPU of --split-mode none (and row's KV), default 0 (-mg)\n"
    "  --no-kv-offload           keep the KV cache in host memory (-nkvo)\n"
    "  --no-op-offload           never run the products of CPU layers on a GPU (exact mode already\n"
    "                            does not where layers stay on the CPU)\n";

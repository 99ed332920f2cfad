/*
 * devices.c — GPU backend modules and the offload settings resolved for one
 * model. See devices.h.
 */
#include "engine/devices.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "gguf.h"

#define MOD "engine"

static char g_modules[512];      /* ids of the loaded GPU modules, comma-separated */
static char g_module_names[128]; /* their backends' names ("CUDA", "Vulkan") */
static int g_n_found;            /* devices they found */
static bool g_cuda_patched;      /* the CUDA module exports ggml_cuda_ks_patch_rev */

/* The build id next to a module: <path without .so>.id, first line; the
 * file's base name when there is none. */
static void module_id(const char *path, char *id, size_t n) {
    char p[4200];
    snprintf(p, sizeof p, "%s", path);
    size_t l = strlen(p);
    if (l > 3 && !strcmp(p + l - 3, ".so")) p[l - 3] = '\0';
    strncat(p, ".id", sizeof p - strlen(p) - 1);
    id[0] = '\0';
    FILE *f = fopen(p, "r");
    if (f) {
        if (!fgets(id, (int)n, f)) id[0] = '\0';
        fclose(f);
        id[strcspn(id, "\r\n")] = '\0';
    }
    if (!id[0]) {
        const char *b = strrchr(path, '/');
        snprintf(id, n, "%s", b ? b + 1 : path);
    }
}

static void append(char *buf, size_t n, const char *s) {
    size_t l = strlen(buf);
    if (l + 1 < n) snprintf(buf + l, n - l, "%s%s", l ? "," : "", s);
}

static int load_module(const char *path) {
    if (access(path, R_OK) != 0) return 0;
    /* dlopen first, to say in one line why a module cannot load (no CUDA
     * driver, libcuda.so.1, on a machine without an NVIDIA GPU; no Vulkan
     * loader): ggml would log it as an error of its own. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        KS_WARN(MOD, "the GPU backend %s cannot be loaded (%s); running without it", path, why ? why : "dlopen failed");
        return 0;
    }
    ggml_backend_reg_t reg = ggml_backend_load(path);
    bool patched = dlsym(h, "ggml_cuda_ks_patch_rev") != NULL;
    dlclose(h); /* ggml holds its own handle */
    if (!reg) {
        KS_WARN(MOD, "the GPU backend %s could not be loaded (see the error above); running without it", path);
        return 0;
    }
    char id[160];
    module_id(path, id, sizeof id);
    append(g_modules, sizeof g_modules, id);
    append(g_module_names, sizeof g_module_names, ggml_backend_reg_name(reg));
    if (patched && !strcmp(ggml_backend_reg_name(reg), "CUDA")) g_cuda_patched = true;
    int n = (int)ggml_backend_reg_dev_count(reg);
    g_n_found += n;
    KS_DEBUG(MOD, "GPU backend %s (%s): %d device(s)", id, ggml_backend_reg_name(reg), n);
    return 1;
}

int ks_devices_load_modules(const char *dir) {
    const char *list = getenv("KS_GPU_MODULES");
    int n = 0;
    if (list && !strcmp(list, "none")) return 0;
    if (list && *list) {
        char *copy = strdup(list), *save = NULL;
        for (char *p = copy ? strtok_r(copy, ":", &save) : NULL; p; p = strtok_r(NULL, ":", &save)) {
            if (access(p, R_OK) != 0) KS_WARN(MOD, "KS_GPU_MODULES names %s, which cannot be read", p);
            else n += load_module(p);
        }
        free(copy);
        return n;
    }
    static const char *const names[] = {"libks-ggml-cuda.so", "libks-ggml-vulkan.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s%s%s", dir, dir[0] ? "/" : "", names[i]);
        n += load_module(path);
    }
    return n;
}

const char *ks_devices_modules(void) { return g_modules; }
bool ks_devices_cuda_patched(void) { return g_cuda_patched; }

/* ------------------------------------------------------------- the model */
/* What the GGUF says about the layers, read without loading any weight. */
typedef struct model_shape {
    int n_layer;
    double *layer_bytes;  /* n_layer + 1: each layer's weights, the output layer last */
    double kv_per_cell;   /* K and V bytes of one cell of one layer */
    int n_vocab, n_embd, n_ff;
    bool weights_quant;   /* every matrix weight but token_embd quantized */
} model_shape;

static int64_t key_of(const struct gguf_context *g, const char *arch, const char *suffix) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", arch, suffix);
    return gguf_find_key(g, k);
}

/* A count key: u32, i32, u64... or the largest entry of an array of them
 * (per-layer head counts). 0 when absent. */
static long long count_of(const struct gguf_context *g, int64_t id) {
    if (id < 0) return 0;
    switch (gguf_get_kv_type(g, id)) {
    case GGUF_TYPE_UINT32: return gguf_get_val_u32(g, id);
    case GGUF_TYPE_INT32: return gguf_get_val_i32(g, id);
    case GGUF_TYPE_UINT64: return (long long)gguf_get_val_u64(g, id);
    case GGUF_TYPE_INT64: return gguf_get_val_i64(g, id);
    case GGUF_TYPE_UINT16: return gguf_get_val_u16(g, id);
    case GGUF_TYPE_ARRAY: {
        size_t n = gguf_get_arr_n(g, id);
        long long best = 0;
        const void *d = gguf_get_arr_data(g, id);
        enum gguf_type t = gguf_get_arr_type(g, id);
        for (size_t i = 0; d && i < n; i++) {
            long long v = t == GGUF_TYPE_UINT32   ? (long long)((const uint32_t *)d)[i]
                        : t == GGUF_TYPE_INT32 ? (long long)((const int32_t *)d)[i]
                                               : 0;
            if (v > best) best = v;
        }
        return best;
    }
    default: return 0;
    }
}

static int read_shape(const ks_devices_req *req, model_shape *ms, char *err, size_t errlen) {
    memset(ms, 0, sizeof *ms);
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = gguf_init_from_file(req->model_path, gp);
    if (!g) {
        ks_set_err(err, errlen, "model file '%s': its GGUF metadata cannot be read", req->model_path);
        return KS_EMODEL;
    }
    int rc = 0;
    int64_t a = gguf_find_key(g, "general.architecture");
    const char *arch = a >= 0 && gguf_get_kv_type(g, a) == GGUF_TYPE_STRING ? gguf_get_val_str(g, a) : NULL;
    long long n_layer = arch ? count_of(g, key_of(g, arch, "block_count")) : 0;
    if (!arch || n_layer <= 0 || n_layer > 100000) {
        ks_set_err(err, errlen, "model file '%s' names no architecture or layer count (general.architecture, "
                   "<arch>.block_count)", req->model_path);
        rc = KS_EMODEL;
        goto done;
    }
    ms->n_layer = (int)n_layer;
    ms->layer_bytes = calloc((size_t)n_layer + 1, sizeof(double));
    if (!ms->layer_bytes) {
        rc = KS_ENOMEM;
        goto done;
    }
    double embd_bytes = 0.0;
    bool has_output = false;
    ms->weights_quant = true;
    bool embd_quant = true;
    for (int64_t t = 0; t < gguf_get_n_tensors(g); t++) {
        const char *name = gguf_get_tensor_name(g, t);
        /* a matrix weight (norms and biases are vectors; token_embd is read
         * by rows, not multiplied) of a float type takes the F16/F32 product
         * kernels, which the CUDA patch does not cover */
        enum ggml_type ty = gguf_get_tensor_type(g, t);
        if (!strcmp(name, "token_embd.weight")) embd_quant = ggml_is_quantized(ty);
        else if (!ggml_is_quantized(ty) && strstr(name, ".weight") &&
            !strstr(name, "norm") && strncmp(name, "rope_freqs", 10))
            ms->weights_quant = false;
        double sz = (double)gguf_get_tensor_size(g, t);
        int il;
        if (sscanf(name, "blk.%d.", &il) == 1 && il >= 0 && il < n_layer) ms->layer_bytes[il] += sz;
        else if (!strcmp(name, "token_embd.weight")) embd_bytes = sz;
        else if (!strncmp(name, "output", 6)) {
            ms->layer_bytes[n_layer] += sz;
            has_output |= !strcmp(name, "output.weight");
        }
    }
    /* tied embeddings: the output layer gets its own copy of token_embd (and
     * multiplies by it) */
    if (!has_output) {
        ms->layer_bytes[n_layer] += embd_bytes;
        ms->weights_quant &= embd_quant;
    }
    long long n_embd = count_of(g, key_of(g, arch, "embedding_length"));
    long long n_head = count_of(g, key_of(g, arch, "attention.head_count"));
    long long n_head_kv = count_of(g, key_of(g, arch, "attention.head_count_kv"));
    long long k_len = count_of(g, key_of(g, arch, "attention.key_length"));
    long long v_len = count_of(g, key_of(g, arch, "attention.value_length"));
    if (n_head_kv <= 0) n_head_kv = n_head;
    if (n_head > 0 && k_len <= 0) k_len = n_embd / n_head;
    if (n_head > 0 && v_len <= 0) v_len = n_embd / n_head;
    ms->kv_per_cell = (double)ggml_row_size((enum ggml_type)req->type_k, k_len * n_head_kv) +
                      (double)ggml_row_size((enum ggml_type)req->type_v, v_len * n_head_kv);
    ms->n_embd = (int)n_embd;
    ms->n_ff = (int)count_of(g, key_of(g, arch, "feed_forward_length"));
    int64_t tok = gguf_find_key(g, "tokenizer.ggml.tokens");
    ms->n_vocab = tok >= 0 && gguf_get_kv_type(g, tok) == GGUF_TYPE_ARRAY ? (int)gguf_get_arr_n(g, tok) : 0;
done:
    gguf_free(g);
    return rc;
}

/* ------------------------------------------------------------ resolving */
static void device_list(char *buf, size_t n, ggml_backend_dev_t *d, int nd) {
    buf[0] = '\0';
    for (int i = 0; i < nd; i++) append(buf, n, ggml_backend_dev_name(d[i]));
    if (!nd) snprintf(buf, n, "none");
}

/* Why no GPU can be used, for the messages. */
static void no_gpu_reason(char *buf, size_t n) {
    if (!g_modules[0])
        snprintf(buf, n, "no GPU backend is installed (setup builds or fetches one with KS_GPU=cuda or "
                         "KS_GPU=vulkan: README, \"GPUs\")");
    else
        snprintf(buf, n, "the GPU backend loaded (%s) found no device%s", g_modules,
                 strstr(g_module_names, "Vulkan") ? " (a CPU-type Vulkan device such as Mesa's llvmpipe is "
                                                    "used only when GGML_VK_VISIBLE_DEVICES names it)" : "");
}

/* Every GPU ggml found, as llama.cpp picks them by default
 * (llama_prepare_model_devices): the discrete GPUs, or the integrated ones
 * when there is no discrete one. */
static int default_devices(ggml_backend_dev_t *out) {
    int n = 0, ni = 0;
    ggml_backend_dev_t igpu[KS_OFFLOAD_DEVICES_MAX];
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
        if (t == GGML_BACKEND_DEVICE_TYPE_GPU && n < KS_OFFLOAD_DEVICES_MAX) out[n++] = d;
        else if (t == GGML_BACKEND_DEVICE_TYPE_IGPU && ni < KS_OFFLOAD_DEVICES_MAX) igpu[ni++] = d;
    }
    if (n == 0) {
        memcpy(out, igpu, sizeof(ggml_backend_dev_t) * (size_t)ni);
        n = ni;
    }
    return n;
}

static int named_devices(const char *list, ggml_backend_dev_t *out, char *err, size_t errlen) {
    int n = 0;
    char copy[KS_OFFLOAD_DEVICES_LEN], *save = NULL;
    snprintf(copy, sizeof copy, "%s", list);
    for (char *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        ggml_backend_dev_t d = ggml_backend_dev_by_name(p);
        if (!d || ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU ||
            ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_ACCEL) {
            ggml_backend_dev_t all[KS_OFFLOAD_DEVICES_MAX];
            int na = default_devices(all);
            char names[512], why[1024];
            device_list(names, sizeof names, all, na);
            if (na) ks_set_err(err, errlen, "unknown device '%s' (--device): the GPU devices found are %s", p, names);
            else {
                no_gpu_reason(why, sizeof why);
                ks_set_err(err, errlen, "unknown device '%s' (--device): no GPU device was found: %s", p, why);
            }
            return KS_EINVAL;
        }
        for (int i = 0; i < n; i++)
            if (out[i] == d) {
                ks_set_err(err, errlen, "device '%s' is named twice (--device %s)", p, list);
                return KS_EINVAL;
            }
        if (n == KS_OFFLOAD_DEVICES_MAX) {
            ks_set_err(err, errlen, "--device names more than %d devices", KS_OFFLOAD_DEVICES_MAX);
            return KS_EINVAL;
        }
        out[n++] = d;
    }
    return n;
}

/* "auto": how many layers, from the end, fit in the devices' free memory
 * (devices.h note 3). */
static int fit_layers(const ks_devices_req *req, const model_shape *ms, ggml_backend_dev_t *d, int nd) {
    const double margin = 1024.0 * 1024 * 1024; /* llama-server's --fit-target default, per device */
    double budget = 0.0;
    for (int i = 0; i < nd; i++) {
        size_t f = 0, t = 0;
        ggml_backend_dev_memory(d[i], &f, &t);
        if (f == 0 && t == 0) return ms->n_layer + 1; /* no memory figures (llama.cpp then uses the host's) */
        budget += (double)f - margin;
    }
    int ff = ms->n_ff > ms->n_embd ? ms->n_ff : ms->n_embd;
    budget -= (double)req->n_batch * ((double)ms->n_vocab + 4.0 * ff) * 4.0 + 64.0 * 1024 * 1024;
    double kv = req->offload->kv_offload ? ms->kv_per_cell * (double)req->n_ctx_total : 0.0;
    int n = 0;
    for (int il = ms->n_layer; il >= 0; il--) {
        double need = ms->layer_bytes[il] + (il < ms->n_layer ? kv : 0.0);
        if (need > budget) break;
        budget -= need;
        n++;
    }
    return n;
}

int ks_devices_resolve(const ks_devices_req *req, ks_engine_offload *out, void **devs_out, int *n_gpu_layers,
                       char *err, size_t errlen) {
    const ks_offload *o = req->offload;
    memset(out, 0, sizeof *out);
    devs_out[0] = NULL;
    *n_gpu_layers = 0;
    out->split_mode = o->split_mode;
    out->main_gpu = o->main_gpu;
    out->kv_offload = o->kv_offload;
    char layers[16], why[1024];
    ks_offload_layers_str(o->n_gpu_layers, layers, sizeof layers);

    if (o->split_mode != KS_SPLIT_NONE && o->split_mode != KS_SPLIT_LAYER && o->split_mode != KS_SPLIT_ROW) {
        ks_set_err(err, errlen, "split mode %d is not none, layer or row (--split-mode)", o->split_mode);
        return KS_EINVAL;
    }
    if (o->n_gpu_layers < KS_NGL_ALL) {
        ks_set_err(err, errlen, "GPU layers %d (-ngl): must be a count, auto or all", o->n_gpu_layers);
        return KS_EINVAL;
    }
    if (o->main_gpu < 0) {
        ks_set_err(err, errlen, "main GPU %d (--main-gpu) must be 0 or more", o->main_gpu);
        return KS_EINVAL;
    }
    if (o->devices[0] && strcmp(o->devices, "none") && ks_offload_check_devices(o->devices, why, sizeof why)) {
        ks_set_err(err, errlen, "--device %s", why);
        return KS_EINVAL;
    }

    /* The model's layers first: a count beyond them is wrong on any machine. */
    model_shape ms;
    int rc = read_shape(req, &ms, err, errlen);
    if (rc) return rc;
    out->n_layers = ms.n_layer + 1;
    out->weights_quant = ms.weights_quant;
    if (o->n_gpu_layers > out->n_layers) {
        ks_set_err(err, errlen, "GPU layers %d (-ngl): the model has %d layers and an output layer, %d in all; "
                   "give 0..%d, or all", o->n_gpu_layers, ms.n_layer, out->n_layers, out->n_layers);
        rc = KS_EINVAL;
        goto done;
    }

    ggml_backend_dev_t d[KS_OFFLOAD_DEVICES_MAX];
    int nd;
    bool none = !strcmp(o->devices, "none");
    if (none) nd = 0;
    else if (o->devices[0]) {
        if ((nd = named_devices(o->devices, d, err, errlen)) < 0) {
            rc = nd;
            goto done;
        }
    } else {
        nd = default_devices(d);
    }
    bool asked = o->n_gpu_layers > 0 || o->n_gpu_layers == KS_NGL_ALL;
    if (asked && nd == 0) {
        if (none) ks_set_err(err, errlen, "GPU layers %s (-ngl) with --device none: nothing can hold them", layers);
        else {
            no_gpu_reason(why, sizeof why);
            ks_set_err(err, errlen, "GPU layers %s (-ngl) asked for, but %s", layers, why);
        }
        rc = KS_EINVAL;
        goto done;
    }
    if (o->main_gpu > 0 && o->main_gpu >= nd) {
        char names[512];
        device_list(names, sizeof names, d, nd);
        ks_set_err(err, errlen, "main GPU %d (--main-gpu): the devices in use are %s (%d)", o->main_gpu, names, nd);
        rc = KS_EINVAL;
        goto done;
    }
    /* split mode none: the main GPU alone (llama.cpp drops the others) */
    ggml_backend_dev_t use[KS_OFFLOAD_DEVICES_MAX];
    int nu = nd;
    memcpy(use, d, sizeof(ggml_backend_dev_t) * (size_t)nd);
    if (o->split_mode == KS_SPLIT_NONE && nd > 0) {
        use[0] = d[o->main_gpu];
        nu = 1;
    }
    if (o->n_tensor_split > 0) {
        double sum = 0.0;
        bool bad = false;
        for (int i = 0; i < o->n_tensor_split && i < KS_OFFLOAD_DEVICES_MAX; i++) {
            bad |= !(o->tensor_split[i] >= 0.0f) || o->tensor_split[i] > 1e30f;
            sum += o->tensor_split[i];
        }
        char names[512];
        device_list(names, sizeof names, use, nu);
        if (o->n_tensor_split != nu) {
            ks_set_err(err, errlen, "the tensor split (--tensor-split) has %d entr%s for %d device%s in use (%s)",
                       o->n_tensor_split, o->n_tensor_split == 1 ? "y" : "ies", nu, nu == 1 ? "" : "s", names);
            rc = KS_EINVAL;
            goto done;
        }
        if (bad || !(sum > 0.0)) {
            ks_set_err(err, errlen, "the tensor split (--tensor-split) does not add up: proportions must be >= 0 "
                       "and not all 0");
            rc = KS_EINVAL;
            goto done;
        }
    }

    int ngl = o->n_gpu_layers == KS_NGL_ALL ? out->n_layers
            : o->n_gpu_layers == KS_NGL_AUTO ? (nu ? fit_layers(req, &ms, use, nu) : 0)
            : o->n_gpu_layers;
    if (o->n_gpu_layers == KS_NGL_AUTO && nu)
        KS_DEBUG(MOD, "-ngl auto: %d of %d layers fit on %d device(s)", ngl, out->n_layers, nu);
    /* Op offload: never without a GPU; off in exact mode while layers stay on
     * the CPU (the device of their prefill must be the device of their decode). */
    bool op = o->op_offload && nu > 0;
    if (op && req->exact && ngl < out->n_layers) {
        op = false;
        KS_DEBUG(MOD, "op offload off: exact mode with %d layer(s) on the CPU", out->n_layers - ngl);
    }
    if (ngl == 0 && !op) nu = 0; /* nothing for a GPU to do: the CPU alone, no device memory used */
    out->op_offload = op;
    out->n_gpu_layers = nu ? ngl : 0;
    out->n_devices = nu;

    /* Where each layer goes, as load_tensors computes it (devices.h note 2). */
    float split[KS_OFFLOAD_DEVICES_MAX];
    double total = 0.0;
    for (int i = 0; i < nu; i++) {
        size_t f = 0, t = 0;
        ggml_backend_dev_memory(use[i], &f, &t);
        out->dev[i].mem_free = f;
        out->dev[i].mem_total = t;
        snprintf(out->dev[i].name, sizeof out->dev[i].name, "%s", ggml_backend_dev_name(use[i]));
        snprintf(out->dev[i].desc, sizeof out->dev[i].desc, "%s", ggml_backend_dev_description(use[i]));
        split[i] = o->n_tensor_split > 0 ? o->tensor_split[i] : (float)f;
        total += split[i];
    }
    if (total <= 0.0)
        for (int i = 0; i < nu; i++) split[i] = 1.0f, total += 1.0;
    double acc = 0.0;
    for (int i = 0; i < nu; i++) {
        acc += split[i];
        split[i] = (float)(acc / total);
    }
    int start = out->n_layers - out->n_gpu_layers;
    for (int il = 0; il < out->n_layers; il++) {
        bool is_out = il == ms.n_layer;
        if (il < start || nu == 0) {
            if (!is_out) out->kv_cpu = true;
            continue;
        }
        int k = 0;
        float x = (float)(il - start) / (float)out->n_gpu_layers;
        while (k < nu - 1 && !(x < split[k])) k++;
        /* row split: every device holds a share of each offloaded layer */
        if (o->split_mode == KS_SPLIT_ROW)
            for (int i = 0; i < nu; i++) out->dev[i].n_layers++;
        else out->dev[k].n_layers++;
        if (!is_out) {
            if (!o->kv_offload) out->kv_cpu = true;
            else if (o->split_mode == KS_SPLIT_ROW) out->dev[o->main_gpu < nu ? o->main_gpu : 0].kv = true;
            else out->dev[k].kv = true;
        }
    }
    out->kv[0] = '\0';
    if (out->kv_cpu) append(out->kv, sizeof out->kv, "CPU");
    for (int i = 0; i < nu; i++)
        if (out->dev[i].kv) {
            size_t l = strlen(out->kv);
            snprintf(out->kv + l, sizeof out->kv - l, "%s%s", l ? "+" : "", out->dev[i].name);
        }
    if (!out->kv[0]) snprintf(out->kv, sizeof out->kv, "CPU");
    /* llama.cpp gets every device asked for (it reduces to the main GPU itself
     * with split mode none); none at all when the CPU does everything */
    for (int i = 0; nu && i < nd; i++) devs_out[i] = d[i];
    devs_out[nu ? nd : 0] = NULL;
    *n_gpu_layers = out->n_gpu_layers;
done:
    free(ms.layer_bytes);
    return rc;
}

/*
 * offload.h — where the model runs: the GPU offload settings, as the flags,
 * the YAML file and the library take them (llama-server's names: -ngl,
 * --device, --split-mode, --tensor-split, --main-gpu, --no-kv-offload,
 * --no-op-offload), and their parsers.
 *
 * Plain data and pure parsing, shared by the config layer, the CLI and the
 * engine (which resolves the settings against the devices it finds and the
 * model it loads: engine.h, "Devices"). Nothing here knows a device.
 *
 * Thread model: plain values; the parsers are reentrant.
 */
#ifndef KS_OFFLOAD_H
#define KS_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>

/* n_gpu_layers beyond a count: "auto" (every layer that fits in the free
 * memory of the devices in use: all of them on a GPU the model fits in; 0
 * without a GPU) and "all" (every layer, the output layer included). */
enum { KS_NGL_AUTO = -1, KS_NGL_ALL = -2 };
/* llama_split_mode's values: none = one GPU (main_gpu), layer = whole layers
 * per GPU (default), row = each weight split by rows across the GPUs. */
enum { KS_SPLIT_NONE = 0, KS_SPLIT_LAYER = 1, KS_SPLIT_ROW = 2 };
/* At most this many devices in a --device list or a --tensor-split
 * (llama_max_devices() in this release). */
#define KS_OFFLOAD_DEVICES_MAX 16
/* The longest --device list, bytes with the NUL. */
#define KS_OFFLOAD_DEVICES_LEN 256

typedef struct ks_offload {
    int n_gpu_layers;  /* KS_NGL_AUTO (default), KS_NGL_ALL, or a count >= 0 */
    /* "" (default): every GPU found; "none": no GPU at all (not even for op
     * offload); else device names as ggml calls them, comma-separated
     * ("CUDA0,CUDA1", "Vulkan0") */
    char devices[KS_OFFLOAD_DEVICES_LEN];
    int split_mode;    /* KS_SPLIT_LAYER (default), KS_SPLIT_NONE, KS_SPLIT_ROW */
    int main_gpu;      /* index into the devices in use (default 0) */
    /* proportions of the offloaded layers (or rows) per device in use, in
     * their order; n_tensor_split 0 (default): by each device's free memory */
    float tensor_split[KS_OFFLOAD_DEVICES_MAX];
    int n_tensor_split;
    bool kv_offload;   /* default true: a layer's KV lives on its layer's device */
    bool op_offload;   /* default true: llama.cpp may run large-batch products of CPU-resident
                          weights on a GPU; exact mode turns it off (engine.h, "Devices") */
} ks_offload;

void ks_offload_defaults(ks_offload *o);

/* The parsers: each parses the whole of s and, on a refusal, returns
 * KS_EINVAL with the reason (without the flag's name) in why; *out is then
 * unchanged. */
/* "auto", "all" or a decimal count 0..INT_MAX (-ngl, gpu_layers). */
int ks_offload_parse_layers(const char *s, int *out, char *why, size_t whylen);
/* "none", "layer", "row" (--split-mode, split_mode). */
int ks_offload_parse_split_mode(const char *s, int *out, char *why, size_t whylen);
/* "3,1" or "3/1" (llama-server's separators): 1..KS_OFFLOAD_DEVICES_MAX
 * finite numbers >= 0 that do not all equal 0 (--tensor-split). out holds
 * KS_OFFLOAD_DEVICES_MAX floats. */
int ks_offload_parse_tensor_split(const char *s, float *out, int *n, char *why, size_t whylen);
/* "none" or names of [A-Za-z0-9_.-]+, comma-separated, no empty entry, at
 * most KS_OFFLOAD_DEVICES_MAX, shorter than KS_OFFLOAD_DEVICES_LEN in all
 * (--device, devices). Whether such a device exists is the engine's check. */
int ks_offload_check_devices(const char *s, char *why, size_t whylen);

/* "auto", "all" or the count, into buf; returns buf. */
const char *ks_offload_layers_str(int n_gpu_layers, char *buf, size_t n);
/* "none", "layer", "row"; "?" for another value. Static string. */
const char *ks_offload_split_mode_name(int mode);

#endif

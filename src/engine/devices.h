/*
 * devices.h — the engine's GPU devices: which GPU backend modules are
 * loaded, and what the offload settings (base/offload.h) resolve to for one
 * model: the devices in use, how many layers each holds, where the KV
 * lives, whether op offload stays on. Internal to src/engine/ (engine.c is
 * its only caller); it includes ggml's backend and GGUF headers, not
 * llama.h.
 *
 * Design notes
 *  1. Modules: ggml's GPU backends are shared libraries loaded at run time
 *     (GGML_BACKEND_DL), like the CPU one. Setup installs them next to
 *     libllama as libks-ggml-cuda.so and libks-ggml-vulkan.so, each with an
 *     .id file naming its build (scripts/setup_gpu.sh); the "libks-" names
 *     keep ggml's own loader (ggml_backend_load_all_from_path, which the
 *     prebuilt CPU path calls) from picking them up by its file pattern.
 *     KS_GPU_MODULES in the environment replaces that set: "none" loads no
 *     GPU module, a ':'-separated list of files loads exactly those (the
 *     tests point it at setup's Vulkan module in build/deps/vulkan/).
 *  2. Layers as llama.cpp places them (llama-model.cpp, load_tensors, read
 *     in the pinned source): a model of n_layer layers has n_layer + 1
 *     offloadable ones, the output layer counting as one; n_gpu_layers = k
 *     puts the last k on GPUs (the output layer first, then n_layer - 1,
 *     ...), split across the devices by tensor_split (by free memory when
 *     none is given). The input embedding always stays on the CPU.
 *     ks_devices_resolve mirrors that placement to report it; llama.cpp
 *     computes it again from the same parameters.
 *  3. "auto" is an estimate: the weights of each layer (the GGUF's tensor
 *     sizes) and its KV cache (n_ctx, the K/V types, the KV heads) against
 *     the free memory of the devices, less a margin of 1 GiB per device
 *     (llama-server's --fit-target default) and the compute buffers;
 *     layers are taken from the end, as llama.cpp places them.
 *     llama-server measures instead (common_fit_params, a dry-run load) and
 *     may also shrink the context; kvstash never changes the context.
 *
 * Thread model: ks_devices_load_modules once per process (under the
 * engine's pthread_once); ks_devices_resolve on the thread that opens an
 * engine.
 */
#ifndef KS_DEVICES_H
#define KS_DEVICES_H

#include <stdbool.h>
#include <stddef.h>

#include "base/offload.h"
#include "engine/engine.h"

/* Loads the GPU backend modules (note 1) from dir (libllama's directory).
 * Returns how many loaded. */
int ks_devices_load_modules(const char *dir);
/* Whether the CUDA module loaded carries kvstash's batch-invariance patch
 * (scripts/patches/ggml-cuda-batch-invariant.patch: it exports
 * ggml_cuda_ks_patch_rev, a C name). The patch's kernels run only in a process whose
 * environment has GGML_CUDA_KS_INVARIANT set (the engine sets it in exact
 * mode, before the first decode); without it the module runs the stock ones. */
bool ks_devices_cuda_patched(void);
/* The ids of the GPU modules loaded, comma-separated ("" when none).
 * Static string, valid after ks_devices_load_modules. */
const char *ks_devices_modules(void);

/* What the engine asks of ks_devices_resolve besides the settings. */
typedef struct ks_devices_req {
    const char *model_path;
    const ks_offload *offload;
    bool exact;             /* exactness asked for: op offload goes off where layers stay on the CPU */
    long long n_ctx_total;  /* cells of every sequence together (for the KV of "auto") */
    int type_k, type_v;     /* ggml types of the KV cache */
    int n_batch;            /* for the compute buffers of "auto" */
} ks_devices_req;

/* Resolves the settings for one model: checks every device name, the main
 * GPU, the tensor split against the devices in use and the layer count
 * against the model's (read from the GGUF's metadata, before any weight is
 * loaded); fills *out (the report, engine.h) and devs[0..n) (the devices to
 * hand to llama.cpp, NULL-terminated, at most KS_OFFLOAD_DEVICES_MAX + 1)
 * and *n_gpu_layers (the count to load with). With no GPU in use — none
 * found, --device none, or 0 layers with op offload off — devs is empty
 * and the model runs on the CPU alone. KS_EINVAL with the reason in err for
 * a setting that cannot be honoured (the CLI exits 2), KS_EMODEL when the
 * GGUF's metadata cannot be read. */
int ks_devices_resolve(const ks_devices_req *req, ks_engine_offload *out, void **devs, int *n_gpu_layers,
                       char *err, size_t errlen);

#endif

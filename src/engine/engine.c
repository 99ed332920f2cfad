/*
 * engine.c — llama.cpp behind the ks_engine interface. See engine.h.
 */
#include "engine/engine.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/devices.h"
#include "engine/engine_int.h"
#include "engine/grammar.h"
#include "engine/media.h"
#include "ggml-backend.h"
#include "llama.h"

#define MOD "engine"

/* ------------------------------------------------------------- backends */
/* While a thread creates a grammar, llama.cpp's error lines go to its
 * capture buffer (the caller's reason) instead of the log: a bad grammar is
 * the request's error, not the server's. Thread-local, since llama's logger
 * is one callback for the process and grammars are checked on HTTP threads. */
static _Thread_local ks__log_capture *t_capture;

static void llama_log_cb(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    ks__log_capture *c = t_capture;
    if (c && level == GGML_LOG_LEVEL_ERROR) {
        size_t n = strlen(text);
        while (n && (text[n - 1] == '\n')) n--;
        if (n && c->cap > c->len + 1) {
            int w = snprintf(c->buf + c->len, c->cap - c->len, "%s%.*s", c->len ? "; " : "", (int)n, text);
            if (w > 0) c->len += (size_t)w < c->cap - c->len ? (size_t)w : c->cap - c->len - 1;
        }
        KS_DEBUG("llama", "%.*s", (int)n, text);
        return;
    }
    /* llama.cpp is chatty at info level; its warnings and errors matter. */
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        size_t n = strlen(text);
        while (n && (text[n - 1] == '\n')) n--;
        if (n) ks_log(level == GGML_LOG_LEVEL_ERROR ? KS_LOG_ERROR : KS_LOG_DEBUG, "llama", "%.*s", (int)n, text);
    } else if (ks_log_get_level() <= KS_LOG_DEBUG && getenv("KS_LLAMA_VERBOSE")) {
        fputs(text, stderr);
    }
}

static pthread_once_t g_backend_once = PTHREAD_ONCE_INIT;
static int g_backend_count;
static char g_cpu_backend[64] = "prebuilt";
bool ks__g_patched; /* libks-ggml-cpu.so is the CPU backend */
int ks__g_patch_rev; /* its patch revision: 1 matrix products, 2 also flash attention,
                         * 3 its decode grouped by K/V head */

/* The CPU backend: setup builds ggml's CPU backend from the pinned source with
 * the batch-invariant patch (scripts/setup_cpu.sh) as libks-ggml-cpu.so next
 * to libllama; it is loaded instead of the prebuilt variants when present.
 * KS_GGML_CPU=prebuilt in the environment loads the prebuilt ones anyway (the
 * benchmarks and the tests of the pair-decoding fallback use it). */
static bool load_patched_cpu(const char *dir) {
    const char *want = getenv("KS_GGML_CPU");
    if (want && !strcmp(want, "prebuilt")) return false;
    char path[4200];
    snprintf(path, sizeof path, "%s%slibks-ggml-cpu.so", dir, dir[0] ? "/" : "");
    if (access(path, R_OK) != 0) return false;
    if (!ggml_backend_load(path)) {
        KS_WARN(MOD, "%s could not be loaded; using the prebuilt CPU backend", path);
        return false;
    }
    /* setup writes "kvstash-ggml-cpu-r<N>-<variant>" next to the module */
    char id[64] = "";
    snprintf(path, sizeof path, "%s%slibks-ggml-cpu.id", dir, dir[0] ? "/" : "");
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(id, sizeof id, f)) id[0] = '\0';
        fclose(f);
        id[strcspn(id, "\r\n")] = '\0';
    }
    if (sscanf(id, "kvstash-ggml-cpu-r%d", &ks__g_patch_rev) != 1) ks__g_patch_rev = 1;
    snprintf(g_cpu_backend, sizeof g_cpu_backend, "%s", id[0] ? id : "kvstash-ggml-cpu-r1");
    return true;
}

static void backend_init(void) {
    llama_log_set(llama_log_cb, NULL);
    /* Backends are separate shared libraries next to libllama; plain
     * ggml_backend_load_all() only looks next to the executable. */
    char dir[4096] = "";
    Dl_info info;
    if (dladdr((void *)&llama_backend_init, &info) && info.dli_fname) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0'; else dir[0] = '\0';
    }
#ifdef KS_LLAMA_LIBDIR
    if (!dir[0]) snprintf(dir, sizeof dir, "%s", KS_LLAMA_LIBDIR);
#endif
    if (!getenv("GGML_NO_BACKTRACE")) setenv("GGML_NO_BACKTRACE", "1", 0);
    ks__g_patched = load_patched_cpu(dir);
    if (!ks__g_patched) ggml_backend_load_all_from_path(dir[0] ? dir : NULL);
    /* The GPU modules besides the CPU backend (devices.h note 1). */
    ks_devices_load_modules(dir);
    llama_backend_init();
    g_backend_count = (int)ggml_backend_dev_count();
    KS_DEBUG(MOD, "backends loaded from %s: %d device(s), CPU backend %s, GPU backends %s", dir, g_backend_count,
             g_cpu_backend, ks_devices_modules()[0] ? ks_devices_modules() : "none");
}

const char *ks_engine_gpu_backends(void) {
    pthread_once(&g_backend_once, backend_init);
    return ks_devices_modules();
}

const char *ks_engine_cpu_backend(void) {
    pthread_once(&g_backend_once, backend_init);
    return g_cpu_backend;
}

/* ------------------------------------------------------------ open/free */
ks_engine_params ks_engine_params_default(void) {
    ks_engine_params p = {0};
    p.n_ctx_seq = 4096;
    p.n_seq = 1;
    p.n_batch = 512;
    p.type_k = -1;
    p.type_v = -1;
    p.exact = true;
    p.repack = true;
    p.flash_attn = KS_FA_AUTO;
    ks_offload_defaults(&p.offload);
    return p;
}

static int check_gguf_file(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        ks_set_err(err, errlen, "model file '%s': %s", path, strerror(errno));
        return errno == ENOENT ? KS_ENOENT : KS_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        ks_set_err(err, errlen, "model file '%s' is not a regular file", path);
        return KS_EMODEL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        ks_set_err(err, errlen, "model file '%s': %s", path, strerror(errno));
        return KS_EIO;
    }
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got != 4 || memcmp(magic, "GGUF", 4) != 0) {
        ks_set_err(err, errlen, "model file '%s' is not a GGUF file (bad magic)", path);
        return KS_EMODEL;
    }
    return 0;
}

/* An integer hyper-parameter "<arch>.<key>" of the model's GGUF, 0 when absent. */
static int model_meta_int(const struct llama_model *m, const char *key) {
    char arch[64], k[128], v[32];
    if (llama_model_meta_val_str(m, "general.architecture", arch, sizeof arch) <= 0) return 0;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (llama_model_meta_val_str(m, k, v, sizeof v) <= 0) return 0;
    return atoi(v);
}

/* The context's CPU thread pool, made once per engine, as llama-server's
 * common_init does. Without one, ggml makes a pool for every graph: it
 * starts n_threads - 1 threads and joins them again for each decoded token
 * (docs/LLAMA_FACTS.md). Its workers poll for the next graph a while before
 * they sleep (ggml's default level, 50): a token's graph starts without a
 * wake-up. The CPU backend's functions come through its registry (it is
 * loaded at run time). No pool (e.tp NULL) leaves ggml's default. */
static void thread_pool(ks_engine *e, int n_threads) {
    if (e->tp || n_threads < 2) return;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = cpu ? ggml_backend_dev_backend_reg(cpu) : NULL;
    if (!reg) return;
    struct ggml_threadpool *(*tp_new)(struct ggml_threadpool_params *) =
        (struct ggml_threadpool *(*)(struct ggml_threadpool_params *))ggml_backend_reg_get_proc_address(
            reg, "ggml_threadpool_new");
    void (*tp_free)(struct ggml_threadpool *) =
        (void (*)(struct ggml_threadpool *))ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
    if (!tp_new || !tp_free) {
        KS_WARN(MOD, "the CPU backend exports no thread pool: ggml starts its threads for every graph");
        return;
    }
    struct ggml_threadpool_params tpp;
    ggml_threadpool_params_init(&tpp, n_threads);
    e->tp = tp_new(&tpp);
    e->tp_free = tp_free;
    if (!e->tp) KS_WARN(MOD, "could not create a thread pool of %d threads: ggml starts them for every graph", n_threads);
}

int ks_engine_open(const ks_engine_params *p, ks_engine **out, char *err, size_t errlen) {
    *out = NULL;
    if (!p || !p->model_path || !p->model_path[0]) {
        ks_set_err(err, errlen, "no model file given");
        return KS_EINVAL;
    }
    if (p->n_seq < 1 || p->n_seq > 256) {
        ks_set_err(err, errlen, "number of sequences must be 1..256 (got %d)", p->n_seq);
        return KS_EINVAL;
    }
    int rc = check_gguf_file(p->model_path, err, errlen);
    if (rc) return rc;
    pthread_once(&g_backend_once, backend_init);
    if (g_backend_count == 0) {
        ks_set_err(err, errlen, "no ggml backend could be loaded (looked next to libllama)");
        return KS_EMODEL;
    }

    ks_engine *e = calloc(1, sizeof *e);
    if (!e) return KS_ENOMEM;
    e->path = strdup(p->model_path);

    /* Devices (note 3): the settings checked against the devices found and
     * the model's layers before any weight is loaded. */
    struct llama_context_params cp = llama_context_default_params();
    if (p->type_k >= 0) cp.type_k = (enum ggml_type)p->type_k;
    if (p->type_v >= 0) cp.type_v = (enum ggml_type)p->type_v;
    ggml_backend_dev_t devs[KS_OFFLOAD_DEVICES_MAX + 1];
    int n_gpu_layers = 0;
    {
        int n_ctx_req = p->n_ctx_seq > 0 ? p->n_ctx_seq : 4096;
        ks_devices_req dr = {
            .model_path = p->model_path,
            .offload = &p->offload,
            .exact = p->exact,
            .n_ctx_total = (long long)n_ctx_req * p->n_seq,
            .type_k = cp.type_k,
            .type_v = cp.type_v,
            .n_batch = p->n_batch > 0 ? p->n_batch : 512,
        };
        rc = ks_devices_resolve(&dr, &e->off, (void **)devs, &n_gpu_layers, err, errlen);
        if (rc) goto fail;
        e->gpu = e->off.n_devices > 0;
    }
    /* CUDA's batch-invariant kernels (devices.h): asked for through the
     * environment, read by the module at its first launch, so before any
     * decode of this process. Only for exact mode with every device CUDA;
     * GGML_CUDA_KS_INVARIANT already set (0 included) is left as it is. */
    if (e->gpu && p->exact && ks_devices_cuda_patched()) {
        bool all_cuda = true;
        for (int i = 0; i < e->off.n_devices; i++) all_cuda &= !strncmp(e->off.dev[i].name, "CUDA", 4);
        if (all_cuda) setenv("GGML_CUDA_KS_INVARIANT", "31", 0);
        const char *inv = getenv("GGML_CUDA_KS_INVARIANT");
        int m = inv ? atoi(inv) : 0;
        /* MMQ for every row count (1), split alike for every row count (2 or
         * 8), one flash-attention kernel and KV split (4) */
        e->off.cuda_invariant = all_cuda && (m & 1) && (m & 4) && (m & 10);
    }

    /* auto is on where it keeps the promise: with setup's patched CPU backend
     * from revision 3 (exact, and its decode packs K and V once per K/V head,
     * docs/LLAMA_FACTS.md, flash attention), or when exactness is not asked
     * for (as llama-server's auto on a CPU). On the prebuilt backend in exact
     * mode it stays off: its kernel tiles by the batch and the KV length.
     * With a GPU in use it is on, as llama-server's auto: exactness is not
     * kept there anyway (note 3). */
    /* A quantized V needs it (llama.cpp refuses the context otherwise): on;
     * exact with the patch's revision 5, which tiles quantized K/V too (else
     * exactness says unavailable). */
    if (p->flash_attn == KS_FA_AUTO)
        e->flash_attn = (ks__g_patched && ks__g_patch_rev >= 3 && ks__kv_tiled(p->type_k, p->type_v)) ||
                        !p->exact || e->gpu || ks_engine_kv_type_quantized(p->type_v);
    else e->flash_attn = p->flash_attn == KS_FA_ON;

    struct llama_model_params mp = llama_model_default_params();
    /* Always an explicit device list: the one resolved, empty for the CPU
     * alone (llama.cpp's NULL would mean every GPU it finds). */
    mp.devices = devs;
    mp.n_gpu_layers = n_gpu_layers;
    mp.split_mode = (enum llama_split_mode)p->offload.split_mode;
    mp.main_gpu = p->offload.main_gpu;
    float tsplit[KS_OFFLOAD_DEVICES_MAX] = {0};
    if (p->offload.n_tensor_split > 0 && llama_max_devices() >= KS_OFFLOAD_DEVICES_MAX) {
        memcpy(tsplit, p->offload.tensor_split, sizeof tsplit);
        mp.tensor_split = tsplit;
    }
    mp.use_extra_bufts = p->repack;
    double t_load = ks_now_ms();
    e->model = llama_model_load_from_file(p->model_path, mp);
    t_load = ks_now_ms() - t_load;
    if (!e->model) {
        ks_set_err(err, errlen,
                   "model file '%s' could not be loaded (unsupported architecture or damaged file; "
                   "run with --log debug for llama.cpp's reason)", p->model_path);
        rc = KS_EMODEL;
        goto fail;
    }
    e->vocab = llama_model_get_vocab(e->model);
    e->n_vocab = llama_vocab_n_tokens(e->vocab);
    /* llama.h lists no end-of-generation tokens; llama-server finds them the
     * same way for ignore_eos. */
    for (int t = 0; t < e->n_vocab; t++) e->n_eog += llama_vocab_is_eog(e->vocab, t);
    e->eog = malloc(sizeof(int32_t) * (size_t)(e->n_eog ? e->n_eog : 1));
    if (!e->eog) {
        rc = KS_ENOMEM;
        goto fail;
    }
    for (int t = 0, k = 0; t < e->n_vocab; t++)
        if (llama_vocab_is_eog(e->vocab, t)) e->eog[k++] = t;
    llama_model_desc(e->model, e->desc, sizeof e->desc);
    if (llama_model_meta_val_str(e->model, "general.name", e->name, sizeof e->name) <= 0) {
        const char *base = strrchr(p->model_path, '/');
        snprintf(e->name, sizeof e->name, "%s", base ? base + 1 : p->model_path);
    }

    /* Chat template: the model's own; ChatML when it carries none. Reject a
     * template llama.cpp cannot apply now rather than on the first request. */
    e->tmpl = llama_model_chat_template(e->model, NULL);
    if (!e->tmpl) e->tmpl = "chatml";
    {
        llama_chat_message probe[2] = {{"system", "s"}, {"user", "u"}};
        char buf[512];
        if (llama_chat_apply_template(e->tmpl, probe, 2, true, buf, sizeof buf) < 0) {
            ks_set_err(err, errlen,
                       "model '%s' has a chat template llama.cpp's built-in templates do not support",
                       p->model_path);
            rc = KS_ETEMPLATE;
            goto fail;
        }
    }

    int n_ctx_seq = p->n_ctx_seq > 0 ? p->n_ctx_seq : 4096;
    int n_train = llama_model_n_ctx_train(e->model);
    if (n_train > 0 && n_ctx_seq > n_train) n_ctx_seq = n_train;
    int n_batch = p->n_batch > 0 ? p->n_batch : 512;
    /* The scheduler decodes every generating sequence as two rows (see the
     * note on exactness in sched.c): a batch must hold two rows per sequence
     * plus a prefill chunk. */
    if (n_batch < 2 * p->n_seq + 2) n_batch = 2 * p->n_seq + 2;
    int n_threads = p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;

    if ((uint64_t)n_ctx_seq * (uint64_t)p->n_seq > INT32_MAX) {
        ks_set_err(err, errlen, "a context of %d tokens x %d sequences is more than llama.cpp can hold",
                   n_ctx_seq, p->n_seq);
        rc = KS_EINVAL;
        goto fail;
    }
    cp.n_ctx = (uint32_t)n_ctx_seq * (uint32_t)p->n_seq;
    cp.n_batch = (uint32_t)n_batch;
    cp.n_ubatch = (uint32_t)n_batch;
    cp.n_seq_max = (uint32_t)p->n_seq;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = e->flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.kv_unified = false;
    cp.no_perf = true;
    cp.offload_kqv = p->offload.kv_offload;
    cp.op_offload = e->off.op_offload;
    e->type_k = cp.type_k;
    e->type_v = cp.type_v;
    if (p->pool_of && p->pool_of->tp) e->tp = p->pool_of->tp; /* borrowed: tp_free stays NULL */
    else thread_pool(e, n_threads);
    double t_ctx = ks_now_ms();
    e->ctx = llama_init_from_model(e->model, cp);
    t_ctx = ks_now_ms() - t_ctx;
    if (e->ctx && e->tp) llama_attach_threadpool(e->ctx, e->tp, NULL);
    if (!e->ctx && (p->type_k >= 0 || p->type_v >= 0) && (cp.type_k != GGML_TYPE_F16 || cp.type_v != GGML_TYPE_F16)) {
        /* llama.cpp refuses a quantized type whose block does not divide the
         * model's head size (32 for q8_0, q4_0 ...; the log line above says
         * which): a usage error, not memory. */
        ks_set_err(err, errlen, "could not create a context with a %s K / %s V cache for this model (llama.cpp's "
                                "reason is in the log line above: a quantized type's block must divide the head "
                                "size); --cache-type-k / --cache-type-v",
                   ks_engine_kv_type_name(cp.type_k), ks_engine_kv_type_name(cp.type_v));
        rc = KS_EINVAL;
        goto fail;
    }
    if (!e->ctx) {
        ks_set_err(err, errlen, "could not create a context of %d tokens x %d sequences (out of memory?)",
                   n_ctx_seq, p->n_seq);
        rc = KS_ENOMEM;
        goto fail;
    }
    e->n_seq = p->n_seq;
    e->n_ctx_seq = (int)llama_n_ctx_seq(e->ctx);
    e->n_batch = (int)llama_n_batch(e->ctx);
    e->repack = mp.use_extra_bufts;
    e->n_expert = model_meta_int(e->model, "expert_count");
    e->n_expert_used = model_meta_int(e->model, "expert_used_count");
    e->n_threads = n_threads; /* the probe's verdict is for this many (its memo's key) */
    ks__engine_probe(e);
    if (p->exact && !e->gpu && e->repack && !e->invariant && !e->pairs_ok && e->probe_ran) {
        /* ggml repacks some weight types (Q4_0, Q4_K, IQ4_NL, MXFP4 on x86)
         * into interleaved blocks and multiplies groups of four rows with one
         * kernel and the rest with another, which may sum in different orders,
         * so neither lone rows nor pairs match a prefill. Patch revision 4
         * makes the Q4_K pair agree (Q4_0, IQ4_NL and MXFP4 agree as shipped;
         * docs/LLAMA_FACTS.md); the prebuilt's Q4_K and anything else that
         * drifts lands here. Without repacking every row takes ggml's vec_dot,
         * whatever the batch. */
        KS_INFO(MOD, "repacked weights are not batch-invariant on this model: loading it again without "
                     "repacking to keep cached output exact");
        llama_free(e->ctx);
        e->ctx = NULL;
        llama_model_free(e->model);
        mp.use_extra_bufts = false;
        e->model = llama_model_load_from_file(p->model_path, mp);
        e->ctx = e->model ? llama_init_from_model(e->model, cp) : NULL;
        if (e->ctx && e->tp) llama_attach_threadpool(e->ctx, e->tp, NULL);
        if (!e->ctx) {
            ks_set_err(err, errlen, "model file '%s' could not be loaded again without weight repacking",
                       p->model_path);
            rc = KS_EMODEL;
            goto fail;
        }
        e->vocab = llama_model_get_vocab(e->model);
        e->tmpl = llama_model_chat_template(e->model, NULL);
        if (!e->tmpl) e->tmpl = "chatml";
        e->repack = false;
        ks__engine_probe(e);
    }
    ks__engine_exact_reason(e);
    /* The projector, against the text model it feeds (media.h note 2). */
    e->n_threads = n_threads;
    if (p->mmproj_path && p->mmproj_path[0] && (rc = ks_engine_media_open(e, p->mmproj_path, err, errlen))) goto fail;
    char where[512];
    ks_engine_offload_desc(e, where, sizeof where);
    KS_DEBUG(MOD, "model %s (%s): n_ctx_seq=%d n_seq=%d n_batch=%d threads=%d fa=%d cpu=%s repack=%d invariant=%d "
             "load %.0f ms, context %.0f ms, warm-up %.0f ms; %s", e->name, e->desc, e->n_ctx_seq, e->n_seq, e->n_batch, n_threads, (int)e->flash_attn,
             g_cpu_backend, (int)e->repack, (int)e->invariant, t_load, t_ctx, e->warm_ms, where);
    *out = e;
    return 0;
fail:
    ks_engine_free(e);
    return rc;
}

void ks_engine_free(ks_engine *e) {
    if (!e) return;
    ks__media_close(e->media); /* before the model it was opened against */
    if (e->ctx) llama_free(e->ctx);
    if (e->tp && e->tp_free) e->tp_free(e->tp); /* after the context that used it; a borrowed one is not ours */
    if (e->model) llama_model_free(e->model);
    free(e->eog);
    free(e->path);
    free(e);
}

/* ------------------------------------------------------------- model info */
int ks_engine_n_ctx_seq(const ks_engine *e) { return e->n_ctx_seq; }
int ks_engine_n_seq(const ks_engine *e) { return e->n_seq; }
int ks_engine_n_batch(const ks_engine *e) { return e->n_batch; }
int ks_engine_n_vocab(const ks_engine *e) { return e->n_vocab; }
const char *ks_engine_model_path(const ks_engine *e) { return e->path; }
const char *ks_engine_model_desc(const ks_engine *e) { return e->desc; }
const struct llama_model *ks_engine_llama_model(const ks_engine *e) { return e->model; }
const char *ks_engine_model_name(const ks_engine *e) { return e->name; }

void ks_engine_kv_params(const ks_engine *e, char *buf, size_t n) {
    /* n_seq too: llama's sequence-state blob differs with the number of
     * sequences, and a blob of another layout is refused at restore. */
    /* And the CPU backend build: another build of the kernels may compute other
     * bits, so a state it wrote is not this build's prefill. */
    int l = snprintf(buf, n, "type_k=%s;type_v=%s;fa=%d;n_ctx_seq=%d;n_seq=%d;kv_unified=0;state_v=%d;cpu=%s;repack=%d",
                     ggml_type_name((enum ggml_type)e->type_k), ggml_type_name((enum ggml_type)e->type_v),
                     (int)e->flash_attn, e->n_ctx_seq, e->n_seq, LLAMA_STATE_SEQ_VERSION, g_cpu_backend, (int)e->repack);
    /* And the devices (note 3): which GPU build computed which layers, where
     * the KV lives and whether CPU layers' prefills ran on a GPU. Absent on the
     * CPU alone, so that CPU states keep the keys they always had. */
    const ks_engine_offload *o = &e->off;
    if (!e->gpu || l < 0 || (size_t)l >= n) return;
    l += snprintf(buf + l, n - (size_t)l, ";gpu=%s;ngl=%d/%d;kqv=%d;opo=%d;sm=%d;mg=%d;%sdev=", ks_devices_modules(),
                  o->n_gpu_layers, o->n_layers, (int)o->kv_offload, (int)o->op_offload, o->split_mode, o->main_gpu,
                  o->cuda_invariant ? "inv=1;" : "");
    for (int i = 0; i < o->n_devices && l > 0 && (size_t)l < n; i++)
        l += snprintf(buf + l, n - (size_t)l, "%s%s:%s:%d", i ? "," : "", o->dev[i].name, o->dev[i].desc,
                      o->dev[i].n_layers);
}

uint32_t ks_engine_state_version(void) { return LLAMA_STATE_SEQ_VERSION; }

char *ks_engine_meta_dump(const ks_engine *e) {
    ks_buf b = {0};
    int n = llama_model_meta_count(e->model);
    char key[512];
    char *val = malloc(1 << 16);
    if (!val) return NULL;
    for (int i = 0; i < n; i++) {
        if (llama_model_meta_key_by_index(e->model, i, key, sizeof key) < 0) continue;
        if (llama_model_meta_val_str_by_index(e->model, i, val, 1 << 16) < 0) val[0] = '\0';
        ks_buf_printf(&b, "%s=%s\n", key, val);
    }
    free(val);
    ks_buf_printf(&b, "n_params=%llu;size=%llu\n", (unsigned long long)llama_model_n_params(e->model),
                  (unsigned long long)llama_model_size(e->model));
    return b.s;
}

bool ks_engine_batch_invariant(const ks_engine *e) { return e->invariant; }
ks_media *ks_engine_media(const ks_engine *e) { return e->media; }
int ks_engine_media_open(ks_engine *e, const char *path, char *err, size_t errlen) {
    if (e->media) {
        ks_set_err(err, errlen, "a projector is open already");
        return KS_EINVAL;
    }
    return ks__media_open(e, path, e->n_threads, e->gpu, &e->media, err, errlen);
}
bool ks_engine_flash_attn(const ks_engine *e) { return e->flash_attn; }
int ks_engine_type_k(const ks_engine *e) { return e->type_k; }
int ks_engine_type_v(const ks_engine *e) { return e->type_v; }

static const struct {
    const char *name;
    enum ggml_type type;
} KV_TYPES[] = {
    {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},     {"q8_0", GGML_TYPE_Q8_0},
    {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1}, {"iq4_nl", GGML_TYPE_IQ4_NL}, {"q5_0", GGML_TYPE_Q5_0},
    {"q5_1", GGML_TYPE_Q5_1},
};

int ks_engine_kv_type(const char *name) {
    for (size_t i = 0; name && i < sizeof KV_TYPES / sizeof KV_TYPES[0]; i++)
        if (!strcmp(name, KV_TYPES[i].name)) return (int)KV_TYPES[i].type;
    return -1;
}

const char *ks_engine_kv_type_name(int type) {
    for (size_t i = 0; i < sizeof KV_TYPES / sizeof KV_TYPES[0]; i++)
        if ((int)KV_TYPES[i].type == type) return KV_TYPES[i].name;
    return "?";
}

bool ks_engine_kv_type_quantized(int type) {
    return type >= 0 && type != GGML_TYPE_F32 && type != GGML_TYPE_F16 && type != GGML_TYPE_BF16;
}
bool ks_engine_repacked(const ks_engine *e) { return e->repack; }

size_t ks_engine_state_bytes_max(const ks_engine *e) {
    /* As the probe measured it (any memory: hybrid models' layer 0 may have
     * no KV heads), for a full slot */
    if (e->state_per_tok > 0) return e->state_fixed + e->state_per_tok * (size_t)e->n_ctx_seq + 4096;
    /* Else K and V of every layer for every cell of a sequence, plus the
     * blob's headers and token list: the bytes a full slot's state takes */
    int32_t n_layer = llama_model_n_layer(e->model), n_head = llama_model_n_head(e->model);
    int32_t n_head_kv = llama_model_n_head_kv(e->model), n_embd = llama_model_n_embd(e->model);
    if (n_layer <= 0 || n_head <= 0 || n_head_kv <= 0 || n_embd <= 0) return 0;
    int64_t kv = (int64_t)(n_embd / n_head) * n_head_kv;
    size_t per_tok = (size_t)n_layer * (ggml_row_size((enum ggml_type)e->type_k, kv) +
                                        ggml_row_size((enum ggml_type)e->type_v, kv)) + 16;
    return per_tok * (size_t)e->n_ctx_seq + 4096;
}

const ks_engine_offload *ks_engine_offload_info(const ks_engine *e) { return &e->off; }

void ks_engine_offload_desc(const ks_engine *e, char *buf, size_t n) {
    const ks_engine_offload *o = &e->off;
    if (!e->gpu) {
        snprintf(buf, n, "CPU");
        return;
    }
    size_t l = 0;
    if (o->n_gpu_layers == 0) {
        l += (size_t)snprintf(buf, n, "0/%d layers on the GPU, op offload to %s", o->n_layers, o->dev[0].name);
        return;
    }
    l += (size_t)snprintf(buf + l, n - l, "%d/%d layers on ", o->n_gpu_layers, o->n_layers);
    for (int i = 0; i < o->n_devices && l + 1 < n; i++) {
        if (o->n_devices > 1)
            l += (size_t)snprintf(buf + l, n - l, "%s%s (%d)", i ? ", " : "", o->dev[i].name, o->dev[i].n_layers);
        else l += (size_t)snprintf(buf + l, n - l, "%s", o->dev[i].name);
    }
    if (l + 1 < n && o->n_gpu_layers < o->n_layers)
        l += (size_t)snprintf(buf + l, n - l, " (%d on the CPU)", o->n_layers - o->n_gpu_layers);
    if (l + 1 < n) snprintf(buf + l, n - l, ", KV on %s", o->kv);
}

bool ks_engine_pairs_exact(const ks_engine *e) { return e->pairs_ok; }

double ks_engine_warm_ms(const ks_engine *e) { return e->warm_ms; }

int ks_engine_n_expert(const ks_engine *e, int *n_used) {
    if (n_used) *n_used = e->n_expert_used;
    return e->n_expert;
}

bool ks_engine_partial_rm_ok(const ks_engine *e) {
    return !llama_model_is_recurrent(e->model) && !llama_model_is_hybrid(e->model);
}
bool ks_engine_is_hybrid(const ks_engine *e) { return llama_model_is_hybrid(e->model); }
bool ks_engine_is_recurrent(const ks_engine *e) { return llama_model_is_recurrent(e->model); }
int ks_engine_n_swa(const ks_engine *e) { return (int)llama_model_n_swa(e->model); }

bool ks_engine_state_restorable(const ks_engine *e, int n) {
    int w = ks_engine_n_swa(e);
    return w <= 0 || n <= w || (n - w) % KS_ENGINE_SWA_ALIGN == 0;
}

int ks_engine_restorable_floor(const ks_engine *e, int n) {
    int w = ks_engine_n_swa(e);
    if (w <= 0 || n <= w) return n;
    return w + (n - w) / KS_ENGINE_SWA_ALIGN * KS_ENGINE_SWA_ALIGN;
}
/* ------------------------------------------ for sampler.c and engine_text.c */
const struct llama_vocab *ks__engine_vocab(const ks_engine *e) { return e->vocab; }
struct llama_context *ks__engine_ctx(const ks_engine *e) { return e->ctx; }
const struct llama_model *ks__engine_model(const ks_engine *e) { return e->model; }
const char *ks__engine_tmpl(const ks_engine *e) { return e->tmpl; }
const int32_t *ks__engine_eog(const ks_engine *e, int *n) {
    *n = e->n_eog;
    return e->eog;
}
ks__log_capture *ks__engine_capture(ks__log_capture *c) {
    ks__log_capture *prev = t_capture;
    t_capture = c;
    return prev;
}

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
#include "engine/grammar.h"
#include "ggml-backend.h"
#include "llama.h"

struct ks_engine {
    struct llama_model *model;
    struct llama_context *ctx;
    const struct llama_vocab *vocab;
    char *path;
    char desc[128];
    char name[128];
    const char *tmpl; /* the model's template, or "chatml"; borrowed from the model */
    int n_ctx_seq;
    int n_seq;
    int n_batch;
    int n_vocab;
    bool flash_attn;
    int type_k, type_v;
    int32_t *eog;   /* every end-of-generation token of the vocabulary (ignore_eos) */
    int n_eog;
    bool invariant; /* the open-time probe found one-row decodes bit-identical to batches */
    bool probe_ran; /* the probe's decodes all ran (its verdict means something) */
    bool repack;    /* weights may be repacked (llama's use_extra_bufts) */
    double warm_ms; /* what the probe (the warm-up) took */
    size_t state_fixed, state_per_tok; /* a sequence state's bytes: fixed + per token (measured by the probe) */
    struct ggml_threadpool *tp;        /* the context's persistent CPU thread pool (NULL: ggml's per-graph one) */
    void (*tp_free)(struct ggml_threadpool *);
    ks_engine_offload off;             /* where the model runs (devices.h) */
    bool gpu;                          /* a GPU computes some of it (off.n_devices > 0) */
    size_t probe_diff, probe_size;     /* state bytes the probe found differing, of how many */
    char exact_reason[256];            /* why exactness is unavailable ("" when it is not) */
};

struct ks_batch {
    struct llama_batch b;
    int n_max;
};

struct ks_sampler {
    struct llama_sampler *chain;
    struct llama_sampler *grammar; /* NULL: none; never in the chain */
    llama_token_data *cur;         /* with a grammar: n_vocab candidates, reused per token */
    int n_vocab;
    int n_history;                 /* penalties' window (prompt tokens accepted as history), 0: off */
    bool failed;                   /* ks_sampler_sample returned -1: it does so from now on */
};

#define MOD "engine"

static void exact_reason(ks_engine *e);

/* ------------------------------------------------------------- backends */
/* While a thread creates a grammar, llama.cpp's error lines go to its
 * capture buffer (the caller's reason) instead of the log: a bad grammar is
 * the request's error, not the server's. Thread-local, since llama's logger
 * is one callback for the process and grammars are checked on HTTP threads. */
typedef struct log_capture {
    char *buf;
    size_t cap, len;
} log_capture;
static _Thread_local log_capture *t_capture;

static void llama_log_cb(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    log_capture *c = t_capture;
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
static bool g_patched; /* libks-ggml-cpu.so is the CPU backend */
static int g_patch_rev; /* its patch revision: 1 matrix products, 2 also flash attention,
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
    if (sscanf(id, "kvstash-ggml-cpu-r%d", &g_patch_rev) != 1) g_patch_rev = 1;
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
    g_patched = load_patched_cpu(dir);
    if (!g_patched) ggml_backend_load_all_from_path(dir[0] ? dir : NULL);
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

/* The warm-up and batch-invariance probe, run once by ks_engine_open.
 * A: PROBE_N tokens prefilled in one batch in sequence 0. B: the first
 * PROBE_PRE as one batch, then the others one at a time. Both run the model's
 * real kernels on its real weights (repacked or not, whatever the CPU backend
 * chose), so an identical sequence state and identical last logits, bit for
 * bit, mean a token decoded alone computes what it computes inside a
 * prefill: the scheduler can then decode generated tokens one row each and
 * stay exact (no pairs). The probe alone cannot prove invariance: on a small
 * F16 model the prebuilt's drift is rare enough (25 state bytes in 40 tokens
 * in one run, none in this probe's 16) to slip through, so only the patched
 * backend is ever called invariant, and the probe is its safety net for
 * kernels the patch does not cover (on a real model a drift shows in
 * thousands of bytes: 332,427 of 4.5 MB for 64 tokens on the bench model).
 * It also pages the weights in and builds the one-row and
 * many-row graphs, so the first request costs what later ones do. Flash
 * attention counts as invariant only with the patch's revision 2: the stock
 * CPU kernel changes its tiling with the number of rows, the KV length and
 * the thread count, in ways 32 tokens would not show (docs/LLAMA_FACTS.md). */
/* Whether the K/V types take the patched tiled flash-attention kernel (F16 or
 * F32, both the same); quantized ones take the stock per-row path, which
 * splits a decoded row's KV among the threads. */
static bool kv_tiled(int type_k, int type_v) {
    int k = type_k < 0 ? GGML_TYPE_F16 : type_k, v = type_v < 0 ? GGML_TYPE_F16 : type_v;
    return k == v && (k == GGML_TYPE_F16 || k == GGML_TYPE_F32);
}

#define PROBE_N 32
#define PROBE_PRE 16
static void probe(ks_engine *e) {
    double t0 = ks_now_ms();
    e->invariant = false;
    e->probe_ran = false;
    if (e->n_ctx_seq < PROBE_N + 1 || e->n_batch < PROBE_N) return;
    struct llama_batch b = llama_batch_init(PROBE_N, 0, 1);
    float *la = malloc(sizeof(float) * (size_t)e->n_vocab);
    uint8_t *sa = NULL, *sb = NULL;
    size_t sz = 0;
    llama_memory_t mem = llama_get_memory(e->ctx);
    bool ok = la != NULL;
    uint32_t x = 2463534242u;
    llama_token tok[PROBE_N];
    for (int i = 0; i < PROBE_N; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        tok[i] = (llama_token)(x % (uint32_t)e->n_vocab);
    }
    /* A */
    for (int i = 0; i < PROBE_N; i++) {
        b.token[i] = tok[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = i == PROBE_N - 1;
    }
    b.n_tokens = PROBE_N;
    const float *l = NULL;
    if (ok && llama_decode(e->ctx, b) == 0 && (l = llama_get_logits_ith(e->ctx, PROBE_N - 1))) {
        memcpy(la, l, sizeof(float) * (size_t)e->n_vocab);
        sz = llama_state_seq_get_size(e->ctx, 0);
        sa = malloc(sz ? sz : 1);
        sb = malloc(sz ? sz : 1);
        ok = sa && sb && llama_state_seq_get_data(e->ctx, sa, sz, 0) == sz;
    } else {
        ok = false;
    }
    llama_memory_clear(mem, true);
    /* B */
    if (ok) {
        b.n_tokens = PROBE_PRE;
        b.logits[PROBE_N - 1] = 0;
        ok = llama_decode(e->ctx, b) == 0;
    }
    /* A state's size at PROBE_PRE and PROBE_N tokens: what it takes per
     * token (KV) and apart from them (headers, a recurrent state). */
    size_t sz_pre = ok ? llama_state_seq_get_size(e->ctx, 0) : 0;
    if (ok && sz > sz_pre) {
        e->state_per_tok = (sz - sz_pre) / (PROBE_N - PROBE_PRE);
        e->state_fixed = sz > e->state_per_tok * PROBE_N ? sz - e->state_per_tok * PROBE_N : 0;
    }
    for (int i = PROBE_PRE; ok && i < PROBE_N; i++) {
        b.token[0] = tok[i]; b.pos[0] = i; b.logits[0] = i == PROBE_N - 1;
        b.n_tokens = 1;
        ok = llama_decode(e->ctx, b) == 0;
    }
    if (ok) ok = (l = llama_get_logits_ith(e->ctx, 0)) != NULL && llama_state_seq_get_size(e->ctx, 0) == sz &&
                 llama_state_seq_get_data(e->ctx, sb, sz, 0) == sz;
    /* Only the patched CPU backend's kernels are known to be invariant: with
     * a GPU computing any part of the model the probe still runs there (it
     * reports what it sees), but nothing is called invariant (note 3). */
    bool kernels_ok = g_patched && !e->gpu && (!e->flash_attn || (g_patch_rev >= 2 && kv_tiled(e->type_k, e->type_v)));
    if (ok) {
        e->probe_size = sz;
        e->probe_diff = 0;
        for (size_t k = 0; k < sz; k++) e->probe_diff += sa[k] != sb[k];
        bool same_logits = memcmp(la, l, sizeof(float) * (size_t)e->n_vocab) == 0;
        e->invariant = kernels_ok && same_logits && e->probe_diff == 0;
        if (e->gpu)
            KS_DEBUG(MOD, "probe on %s: %zu of %zu state bytes differ, logits %s", e->off.dev[0].name, e->probe_diff,
                     sz, same_logits ? "identical" : "differ");
    }
    if (ok && kernels_ok && !e->invariant)
        KS_WARN(MOD, "this model's kernels are not batch-invariant even in the patched CPU backend "
                     "(a lone token drifted from its prefill); decoding in pairs to stay exact");
    llama_memory_clear(mem, true);
    free(la);
    free(sa);
    free(sb);
    llama_batch_free(b);
    e->warm_ms = ks_now_ms() - t0;
    e->probe_ran = ok;
    if (!ok) KS_WARN(MOD, "the warm-up decode failed; decoding as if kernels were not batch-invariant");
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

    /* auto is on where it keeps the promise: with setup's patched CPU backend
     * from revision 3 (exact, and its decode packs K and V once per K/V head,
     * docs/LLAMA_FACTS.md, flash attention), or when exactness is not asked
     * for (as llama-server's auto on a CPU). On the prebuilt backend in exact
     * mode it stays off: its kernel tiles by the batch and the KV length.
     * With a GPU in use it is on, as llama-server's auto: exactness is not
     * kept there anyway (note 3). */
    if (p->flash_attn == KS_FA_AUTO)
        e->flash_attn = (g_patched && g_patch_rev >= 3 && kv_tiled(p->type_k, p->type_v)) || !p->exact || e->gpu;
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
    e->model = llama_model_load_from_file(p->model_path, mp);
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
    thread_pool(e, n_threads);
    e->ctx = llama_init_from_model(e->model, cp);
    if (e->ctx && e->tp) llama_attach_threadpool(e->ctx, e->tp, NULL);
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
    probe(e);
    if (p->exact && g_patched && !e->gpu && (!e->flash_attn || g_patch_rev >= 2) && !e->invariant && e->probe_ran) {
        /* ggml repacks some weight types (Q4_0, Q4_K, IQ4_NL on x86) into
         * interleaved blocks and multiplies groups of four rows with one kernel
         * and the rest with another, which may sum in different orders. Patch
         * revision 4 makes the Q4_K pair agree (Q4_0 and IQ4_NL agree as
         * shipped; docs/LLAMA_FACTS.md); anything else that drifts lands here. Without repacking every row takes ggml's
         * vec_dot, whatever the batch: exact. */
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
        probe(e);
    }
    exact_reason(e);
    char where[512];
    ks_engine_offload_desc(e, where, sizeof where);
    KS_DEBUG(MOD, "model %s (%s): n_ctx_seq=%d n_seq=%d n_batch=%d threads=%d fa=%d cpu=%s repack=%d invariant=%d "
             "warm-up %.0f ms; %s", e->name, e->desc, e->n_ctx_seq, e->n_seq, e->n_batch, n_threads, (int)e->flash_attn,
             g_cpu_backend, (int)e->repack, (int)e->invariant, e->warm_ms, where);
    *out = e;
    return 0;
fail:
    ks_engine_free(e);
    return rc;
}

void ks_engine_free(ks_engine *e) {
    if (!e) return;
    if (e->ctx) llama_free(e->ctx);
    if (e->tp) e->tp_free(e->tp); /* after the context that used it */
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
    l += snprintf(buf + l, n - (size_t)l, ";gpu=%s;ngl=%d/%d;kqv=%d;opo=%d;sm=%d;mg=%d;dev=", ks_devices_modules(),
                  o->n_gpu_layers, o->n_layers, (int)o->kv_offload, (int)o->op_offload, o->split_mode, o->main_gpu);
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
bool ks_engine_flash_attn(const ks_engine *e) { return e->flash_attn; }
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

ks_exact_how ks_engine_exact_how(const ks_engine *e, bool exact) {
    if (!exact) return KS_EXACT_OFF;
    /* No GPU kernel is known to be batch-invariant, and pairs do not make a
     * GPU exact: it picks its kernels by the batch's row count (note 3). */
    if (e->gpu) return KS_EXACT_UNAVAILABLE;
    if (e->invariant) return KS_EXACT_INVARIANT;
    /* the scheduler's rule (sched.c): pairs need a trimmable memory */
    return ks_engine_partial_rm_ok(e) ? KS_EXACT_PAIRS : KS_EXACT_UNAVAILABLE;
}

const char *ks_engine_exact_mode(const ks_engine *e, bool exact) {
    switch (ks_engine_exact_how(e, exact)) {
    case KS_EXACT_INVARIANT: return "batch-invariant";
    case KS_EXACT_PAIRS: return "pairs";
    case KS_EXACT_UNAVAILABLE: return "unavailable";
    default: return "off";
    }
}

/* e->exact_reason for ks_engine_exact_reason, once the probe ran. */
static void exact_reason(ks_engine *e) {
    char *r = e->exact_reason;
    size_t n = sizeof e->exact_reason;
    r[0] = '\0';
    if (e->gpu) {
        size_t l = 0;
        for (int i = 0; i < e->off.n_devices && l + 1 < n; i++)
            l += (size_t)snprintf(r + l, n - l, "%s%s", i ? "+" : "", e->off.dev[i].name);
        if (l + 1 < n) l += (size_t)snprintf(r + l, n - l, " kernels are not batch-invariant");
        if (l + 1 < n && e->probe_ran && e->probe_diff)
            snprintf(r + l, n - l, " (the open-time probe: %zu of %zu state bytes differ)", e->probe_diff,
                     e->probe_size);
    } else if (!e->invariant && !ks_engine_partial_rm_ok(e)) {
        snprintf(r, n, "the CPU backend is not batch-invariant here and a %s memory cannot decode in pairs",
                 ks_engine_is_hybrid(e) ? "hybrid" : "recurrent");
    }
}

const char *ks_engine_exact_reason(const ks_engine *e, bool exact) {
    return ks_engine_exact_how(e, exact) == KS_EXACT_UNAVAILABLE && e->exact_reason[0] ? e->exact_reason : NULL;
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
double ks_engine_warm_ms(const ks_engine *e) { return e->warm_ms; }

bool ks_engine_partial_rm_ok(const ks_engine *e) {
    return !llama_model_is_recurrent(e->model) && !llama_model_is_hybrid(e->model);
}
bool ks_engine_is_hybrid(const ks_engine *e) { return llama_model_is_hybrid(e->model); }
bool ks_engine_is_recurrent(const ks_engine *e) { return llama_model_is_recurrent(e->model); }
int ks_engine_n_swa(const ks_engine *e) { return (int)llama_model_n_swa(e->model); }

/* -------------------------------------------------------------- tokenizer */
int ks_engine_tokenize(const ks_engine *e, const char *text, size_t len, bool add_special,
                       bool parse_special, ks_tokens *out) {
    if (len > INT32_MAX / 2) return KS_EINVAL;
    int cap = (int)len + 8;
    int rc = ks_tokens_reserve(out, out->n + cap);
    if (rc) return rc;
    int n = llama_tokenize(e->vocab, text, (int32_t)len, out->v + out->n, cap, add_special, parse_special);
    if (n < 0) {
        rc = ks_tokens_reserve(out, out->n - n);
        if (rc) return rc;
        n = llama_tokenize(e->vocab, text, (int32_t)len, out->v + out->n, -n, add_special, parse_special);
        if (n < 0) return KS_EINVAL;
    }
    out->n += n;
    return 0;
}

int ks_engine_piece(const ks_engine *e, int32_t tok, char *buf, size_t n) {
    int r = llama_token_to_piece(e->vocab, tok, buf, (int32_t)n, 0, false);
    return r < 0 ? -r : r; /* negative = the size needed */
}

bool ks_engine_is_eog(const ks_engine *e, int32_t tok) { return llama_vocab_is_eog(e->vocab, tok); }

int ks_engine_token_text(const ks_engine *e, int32_t tok, char *buf, size_t n) {
    int r = llama_token_to_piece(e->vocab, tok, buf, (int32_t)n, 0, true);
    return r < 0 ? -r : r;
}

int32_t ks_engine_token_bos(const ks_engine *e) {
    llama_token t = llama_vocab_bos(e->vocab);
    return t == LLAMA_TOKEN_NULL ? -1 : t;
}

int32_t ks_engine_token_eos(const ks_engine *e) {
    llama_token t = llama_vocab_eos(e->vocab);
    return t == LLAMA_TOKEN_NULL ? -1 : t;
}

const char *ks_engine_chat_template(const ks_engine *e) { return llama_model_chat_template(e->model, NULL); }

static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;
static char g_llama_version[64] = "unknown";

/* llama.h has no version call (the build number lives in the common
 * library), but the pinned release names its library file after itself. */
static void llama_version_init(void) {
    Dl_info info;
    char real[4096];
    if (!dladdr((void *)&llama_backend_init, &info) || !info.dli_fname || !realpath(info.dli_fname, real)) return;
    const char *base = strrchr(real, '/');
    base = base ? base + 1 : real;
    const char *v = NULL;
    size_t n = 0;
    if (!strncmp(base, "libllama.", 9) && strstr(base, ".so")) {
        const char *so = strstr(base, ".so");
        if (so[3] == '.' && so[4]) v = so + 4, n = strlen(v);          /* libllama.so.X.Y.Z */
        else if (so > base + 9) v = base + 9, n = (size_t)(so - v);    /* libllama.vX.Y.Z.so */
    }
    if (v && n > 0 && n < sizeof g_llama_version) snprintf(g_llama_version, sizeof g_llama_version, "%.*s", (int)n, v);
}

const char *ks_engine_llama_version(void) {
    pthread_once(&g_version_once, llama_version_init);
    return g_llama_version;
}

int ks_engine_template(const ks_engine *e, const ks_msg *msgs, size_t n, bool add_gen, char **out) {
    *out = NULL;
    llama_chat_message *cm = calloc(n ? n : 1, sizeof *cm);
    if (!cm) return KS_ENOMEM;
    size_t total = 64;
    for (size_t i = 0; i < n; i++) {
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content ? msgs[i].content : "";
        total += strlen(cm[i].content) + strlen(cm[i].role) + 32;
    }
    size_t cap = total * 2;
    char *buf = malloc(cap);
    int rc = 0;
    if (!buf) { rc = KS_ENOMEM; goto done; }
    int32_t r = llama_chat_apply_template(e->tmpl, cm, n, add_gen, buf, (int32_t)cap);
    if (r < 0) { rc = KS_ETEMPLATE; goto done; }
    if ((size_t)r >= cap) {
        cap = (size_t)r + 1;
        char *nb = realloc(buf, cap);
        if (!nb) { rc = KS_ENOMEM; goto done; }
        buf = nb;
        r = llama_chat_apply_template(e->tmpl, cm, n, add_gen, buf, (int32_t)cap);
        if (r < 0 || (size_t)r >= cap) { rc = KS_ETEMPLATE; goto done; }
    }
    buf[r] = '\0';
    *out = buf;
    buf = NULL;
done:
    free(buf);
    free(cm);
    return rc;
}

/* ----------------------------------------------------- decode and logits */
ks_batch *ks_batch_create(int n_max) {
    ks_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->b = llama_batch_init(n_max, 0, 1);
    b->n_max = n_max;
    return b;
}

void ks_batch_free(ks_batch *b) {
    if (!b) return;
    llama_batch_free(b->b);
    free(b);
}

void ks_batch_clear(ks_batch *b) { b->b.n_tokens = 0; }
int ks_batch_n(const ks_batch *b) { return b->b.n_tokens; }

int ks_batch_add(ks_batch *b, int32_t tok, int pos, int seq, bool logits) {
    int i = b->b.n_tokens;
    if (i >= b->n_max) return -1;
    b->b.token[i] = tok;
    b->b.pos[i] = pos;
    b->b.n_seq_id[i] = 1;
    b->b.seq_id[i][0] = seq;
    b->b.logits[i] = logits ? 1 : 0;
    b->b.n_tokens++;
    return i;
}

int ks_engine_decode(ks_engine *e, ks_batch *b) {
    if (b->b.n_tokens == 0) return 0;
    int r = llama_decode(e->ctx, b->b);
    if (r == 0) return 0;
    if (r == 1) return KS_EFULL;
    if (r == 2) return KS_ECANCELED;
    KS_ERROR(MOD, "llama_decode failed (%d) on %d tokens", r, b->b.n_tokens);
    return KS_EDECODE;
}

const float *ks_engine_logits(ks_engine *e, int i) { return llama_get_logits_ith(e->ctx, i); }

/* --------------------------------------------------------------- sampling */
static bool tokens_in_vocab(const ks_engine *e, const int32_t *t, int n) {
    for (int k = 0; k < n; k++)
        if (t[k] < 0 || t[k] >= e->n_vocab) return false;
    return true;
}

int ks_sampler_ext_check(const ks_engine *e, const ks_sample_ext *x) {
    if (!x) return 0;
    if (x->n_trigger_patterns < 0 || x->n_trigger_tokens < 0 || x->n_grammar_prefill < 0 || x->n_logit_bias < 0)
        return KS_EINVAL;
    if ((x->n_trigger_patterns && !x->trigger_patterns) || (x->n_trigger_tokens && !x->trigger_tokens) ||
        (x->n_grammar_prefill && !x->grammar_prefill) || (x->n_logit_bias && !x->logit_bias))
        return KS_EINVAL;
    if (x->n_probs < 0 || x->n_probs > KS_N_PROBS_MAX || x->repeat_last_n < -1) return KS_EINVAL;
    /* llama.cpp's common_sampler_init refuses these too (it throws). */
    float rp = x->repeat_penalty;
    if (!isfinite(rp) || rp < 0.0f || (rp > 0.0f && !isfinite(1.0f / rp))) return KS_EINVAL;
    if (!isfinite(x->frequency_penalty) || !isfinite(x->presence_penalty)) return KS_EINVAL;
    for (int k = 0; k < x->n_trigger_patterns; k++)
        if (!x->trigger_patterns[k]) return KS_EINVAL;
    if (!tokens_in_vocab(e, x->trigger_tokens, x->n_trigger_tokens) ||
        !tokens_in_vocab(e, x->grammar_prefill, x->n_grammar_prefill))
        return KS_EINVAL;
    /* An out-of-range id would be written outside llama's candidate array; a
     * +INFINITY or NaN logit makes the softmax NaN. */
    for (int k = 0; k < x->n_logit_bias; k++) {
        float b = x->logit_bias[k].bias;
        if (x->logit_bias[k].tok < 0 || x->logit_bias[k].tok >= e->n_vocab || isnan(b) || b == INFINITY)
            return KS_EINVAL;
    }
    return 0;
}

/* Runs ks__grammar_init with llama's error lines captured; on failure err
 * holds the best reason there is. */
static int grammar_init(const ks_engine *e, const char *gbnf, bool lazy, const ks_sample_ext *x,
                        struct llama_sampler **out, char *err, size_t errlen) {
    char ex[256] = "";
    log_capture cap = {err, errlen, 0};
    if (errlen) err[0] = '\0';
    log_capture *prev = t_capture;
    t_capture = &cap;
    int rc = ks__grammar_init(e->vocab, gbnf, lazy, x ? x->trigger_patterns : NULL, x ? x->n_trigger_patterns : 0,
                              x ? x->trigger_tokens : NULL, x ? x->n_trigger_tokens : 0, out, ex, sizeof ex);
    t_capture = prev;
    if (rc && ex[0]) ks_set_err(err, errlen, "%s", ex); /* an exception says more than the log */
    else if (rc && cap.len == 0) ks_set_err(err, errlen, "llama.cpp refused the grammar");
    return rc;
}

int ks_engine_grammar_check(const ks_engine *e, const char *gbnf, char *err, size_t errlen) {
    if (errlen) err[0] = '\0';
    if (!gbnf || !gbnf[0]) return 0;
    struct llama_sampler *g = NULL;
    int rc = grammar_init(e, gbnf, false, NULL, &g, err, errlen);
    llama_sampler_free(g);
    return rc;
}

/* Whether the grammar in its current state allows tok (llama-server's
 * single-candidate check). Applying never throws; a lazy grammar that waits
 * for its trigger allows everything. */
static bool grammar_allows(struct llama_sampler *g, int32_t tok) {
    llama_token_data d = {tok, 1.0f, 0.0f};
    llama_token_data_array a = {&d, 1, -1, false};
    llama_sampler_apply(g, &a);
    return d.logit != -INFINITY;
}

/* The chain's front: the request's biases and ignore_eos's. */
static int add_logit_bias(const ks_engine *e, ks_sampler *s, const ks_sample_ext *x) {
    int n = x->n_logit_bias + (x->ignore_eos ? e->n_eog : 0);
    if (n == 0) return 0;
    llama_logit_bias *lb = malloc(sizeof *lb * (size_t)n);
    if (!lb) return KS_ENOMEM;
    int k = 0;
    for (int j = 0; j < x->n_logit_bias; j++) lb[k++] = (llama_logit_bias){x->logit_bias[j].tok, x->logit_bias[j].bias};
    for (int j = 0; x->ignore_eos && j < e->n_eog; j++) lb[k++] = (llama_logit_bias){e->eog[j], -INFINITY};
    llama_sampler_chain_add(s->chain, llama_sampler_init_logit_bias(e->n_vocab, n, lb)); /* copies lb */
    free(lb);
    return 0;
}

static void add_penalties(const ks_engine *e, ks_sampler *s, const ks_sample_ext *x) {
    int last_n = x->repeat_last_n == -1 ? e->n_ctx_seq : x->repeat_last_n;
    float rp = x->repeat_penalty == 0.0f ? 1.0f : x->repeat_penalty;
    if (last_n <= 0 || (rp == 1.0f && x->frequency_penalty == 0.0f && x->presence_penalty == 0.0f)) return;
    llama_sampler_chain_add(s->chain, llama_sampler_init_penalties(e->n_vocab, last_n, rp, x->frequency_penalty,
                                                                    x->presence_penalty));
    s->n_history = last_n;
}

/* The grammar sampler, and for a strict grammar the prefill accepted. */
static int add_grammar(const ks_engine *e, ks_sampler *s, const ks_sample_ext *x) {
    char err[512];
    int rc = grammar_init(e, x->grammar, x->grammar_lazy, x, &s->grammar, err, sizeof err);
    if (rc) {
        KS_DEBUG(MOD, "grammar refused: %s", err);
        return rc;
    }
    for (int k = 0; !x->grammar_lazy && k < x->n_grammar_prefill; k++) {
        int32_t t = x->grammar_prefill[k];
        /* llama.cpp aborts on an end-of-generation token the grammar does not allow. */
        if (llama_vocab_is_eog(e->vocab, t)) {
            KS_DEBUG(MOD, "grammar prefill token %d ends generation", t);
            return KS_EINVAL;
        }
        if ((rc = ks__grammar_accept(s->grammar, t, err, sizeof err)) != 0) {
            KS_DEBUG(MOD, "grammar prefill token %d refused: %s", t, err);
            return rc;
        }
    }
    s->cur = malloc(sizeof *s->cur * (size_t)e->n_vocab);
    return s->cur ? 0 : KS_ENOMEM;
}

ks_sampler *ks_sampler_create_ext(const ks_engine *e, const ks_sample_params *sp, const ks_sample_ext *x, int *rc) {
    int rc_ = 0;
    if (!rc) rc = &rc_;
    if ((*rc = ks_sampler_ext_check(e, x)) != 0) return NULL;
    *rc = KS_ENOMEM;
    ks_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_vocab = e->n_vocab;
    struct llama_sampler_chain_params scp = llama_sampler_chain_default_params();
    scp.no_perf = true;
    s->chain = llama_sampler_chain_init(scp);
    if (!s->chain) goto fail;
    if (x) {
        if (add_logit_bias(e, s, x)) goto fail;
        add_penalties(e, s, x);
    }
    if (!sp || sp->temperature <= 0.0f) {
        llama_sampler_chain_add(s->chain, llama_sampler_init_greedy());
    } else {
        if (sp->top_k > 0) llama_sampler_chain_add(s->chain, llama_sampler_init_top_k(sp->top_k));
        if (sp->top_p > 0.0f && sp->top_p < 1.0f) llama_sampler_chain_add(s->chain, llama_sampler_init_top_p(sp->top_p, 1));
        if (sp->min_p > 0.0f) llama_sampler_chain_add(s->chain, llama_sampler_init_min_p(sp->min_p, 1));
        llama_sampler_chain_add(s->chain, llama_sampler_init_temp(sp->temperature));
        llama_sampler_chain_add(s->chain, llama_sampler_init_dist((uint32_t)(sp->seed ^ (sp->seed >> 32))));
    }
    if (x && x->grammar && x->grammar[0] && (*rc = add_grammar(e, s, x)) != 0) goto fail;
    *rc = 0;
    return s;
fail:
    ks_sampler_free(s);
    return NULL;
}

ks_sampler *ks_sampler_create(const ks_engine *e, const ks_sample_params *sp) {
    return ks_sampler_create_ext(e, sp, NULL, NULL);
}

void ks_sampler_free(ks_sampler *s) {
    if (!s) return;
    llama_sampler_free(s->chain);
    llama_sampler_free(s->grammar);
    free(s->cur);
    free(s);
}

void ks_sampler_accept_history(ks_sampler *s, const int32_t *toks, int n) {
    if (!s || s->n_history == 0) return;
    for (int k = n > s->n_history ? n - s->n_history : 0; k < n; k++) llama_sampler_accept(s->chain, toks[k]);
}

/* The candidates in token order, from a logits row. */
static llama_token_data_array candidates(ks_sampler *s, const float *lg) {
    for (int t = 0; t < s->n_vocab; t++) s->cur[t] = (llama_token_data){t, lg[t], 0.0f};
    return (llama_token_data_array){s->cur, (size_t)s->n_vocab, -1, false};
}

/* The token the chain selected, -1 when it selected none that is possible
 * (every candidate was -INFINITY). */
static int32_t selected(const llama_token_data_array *a) {
    if (a->selected < 0 || (size_t)a->selected >= a->size) return -1;
    float l = a->data[a->selected].logit;
    return isnan(l) || l == -INFINITY ? -1 : a->data[a->selected].id;
}

static int32_t sample_failed(ks_sampler *s) {
    s->failed = true;
    return -1;
}

int32_t ks_sampler_sample(ks_sampler *s, ks_engine *e, int i) {
    if (s->failed) return -1;
    /* llama_sampler_sample also accepts the token into the chain. */
    if (!s->grammar) return llama_sampler_sample(s->chain, e->ctx, i);
    const float *lg = llama_get_logits_ith(e->ctx, i);
    if (!lg) return sample_failed(s);
    /* Rejection sampling, as llama-server: the grammar is applied to the whole
     * vocabulary only when the chain's pick breaks it. */
    llama_token_data_array a = candidates(s, lg);
    llama_sampler_apply(s->chain, &a);
    int32_t tok = selected(&a);
    if (tok < 0 || !grammar_allows(s->grammar, tok)) {
        a = candidates(s, lg);
        llama_sampler_apply(s->grammar, &a);
        /* The grammar only masks (the array is still in token order): the
         * end-of-generation token it allows with the highest logit, for when
         * the chain's biases ban everything else it allows. */
        int32_t eog = -1;
        for (int k = 0; k < e->n_eog; k++) {
            int32_t t = e->eog[k];
            if (a.data[t].logit != -INFINITY && (eog < 0 || lg[t] > lg[eog])) eog = t;
        }
        llama_sampler_apply(s->chain, &a);
        tok = selected(&a);
        if (tok < 0) tok = eog; /* a complete grammar ends generation, ignore_eos or not */
        if (tok < 0) {
            KS_DEBUG(MOD, "grammar: no token is allowed");
            return sample_failed(s);
        }
    }
    /* An end-of-generation token ends the request: the grammar never needs it
     * (and llama.cpp aborts on one it does not allow). */
    if (!llama_vocab_is_eog(e->vocab, tok)) {
        char err[256];
        if (ks__grammar_accept(s->grammar, tok, err, sizeof err) != 0) {
            KS_DEBUG(MOD, "grammar refused token %d: %s", tok, err);
            return sample_failed(s);
        }
    }
    llama_sampler_accept(s->chain, tok);
    return tok;
}

int ks_sampler_probs(ks_sampler *s, ks_engine *e, int i, int32_t sampled, ks_token_prob *sampled_out,
                     ks_token_prob *top, int n) {
    (void)s;
    const float *lg = llama_get_logits_ith(e->ctx, i);
    if (sampled_out) *sampled_out = (ks_token_prob){sampled, -INFINITY};
    if (!lg) return 0;
    int nv = e->n_vocab;
    float mx = -INFINITY;
    for (int t = 0; t < nv; t++)
        if (lg[t] > mx) mx = lg[t];
    double sum = 0.0;
    for (int t = 0; t < nv; t++) sum += exp((double)lg[t] - mx);
    double lse = mx + log(sum);
    if (sampled_out && sampled >= 0 && sampled < nv) sampled_out->logprob = (float)(lg[sampled] - lse);
    if (!top || n < 0) n = 0;
    if (n > nv) n = nv;
    /* Top n by insertion (n <= KS_N_PROBS_MAX in use): logits first, turned
     * into log-probabilities at the end. Strict comparisons keep the lower id
     * first among equals. */
    int k = 0;
    for (int t = 0; t < nv && n > 0; t++) {
        float l = lg[t];
        if (k == n && !(l > top[n - 1].logprob)) continue;
        int j = k < n ? k++ : n - 1;
        while (j > 0 && l > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (ks_token_prob){t, l};
    }
    for (int j = 0; j < k; j++) top[j].logprob = (float)(top[j].logprob - lse);
    return k;
}

/* ------------------------------------------------------- sequence memory */
bool ks_engine_seq_rm(ks_engine *e, int seq, int p0, int p1) {
    return llama_memory_seq_rm(llama_get_memory(e->ctx), seq, p0, p1);
}

void ks_engine_seq_clear(ks_engine *e, int seq) {
    /* Removing the whole range always succeeds, for every memory type. */
    llama_memory_seq_rm(llama_get_memory(e->ctx), seq, -1, -1);
}

int ks_engine_seq_pos_max(ks_engine *e, int seq) {
    return llama_memory_seq_pos_max(llama_get_memory(e->ctx), seq);
}
int ks_engine_seq_pos_min(ks_engine *e, int seq) {
    return llama_memory_seq_pos_min(llama_get_memory(e->ctx), seq);
}

size_t ks_engine_state_size(ks_engine *e, int seq) { return llama_state_seq_get_size(e->ctx, seq); }

size_t ks_engine_state_get(ks_engine *e, int seq, uint8_t *buf, size_t n) {
    return llama_state_seq_get_data(e->ctx, buf, n, seq);
}

int ks_engine_state_set(ks_engine *e, int seq, const uint8_t *buf, size_t n) {
    size_t r = llama_state_seq_set_data(e->ctx, buf, n, seq);
    if (r == 0) {
        ks_engine_seq_clear(e, seq);
        return KS_EMISMATCH;
    }
    return 0;
}

size_t ks_engine_state_size_partial(ks_engine *e, int seq) {
    return llama_state_seq_get_size_ext(e->ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
}

size_t ks_engine_state_get_partial(ks_engine *e, int seq, uint8_t *buf, size_t n) {
    return llama_state_seq_get_data_ext(e->ctx, buf, n, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
}

int ks_engine_state_set_partial(ks_engine *e, int seq, const uint8_t *buf, size_t n) {
    size_t r = llama_state_seq_set_data_ext(e->ctx, buf, n, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    if (r == 0) {
        /* the partial memory may be half-read: nothing of the sequence is trustworthy */
        ks_engine_seq_clear(e, seq);
        return KS_EMISMATCH;
    }
    return 0;
}


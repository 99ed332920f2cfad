/*
 * mkmodel.c — random-weight GGUF models for tests and benchmarks. See mkmodel.h.
 *
 * The GGUF header (keys, vocabulary, tensor infos) is built with gguf.h and
 * written first with gguf_get_meta_data; the tensor data then follows tensor
 * by tensor, generated in chunks of rows, so that even the 421 MiB bench model
 * needs about 32 MiB of memory (two chunk buffers). Offsets are the ones gguf
 * computed (each tensor padded to the alignment), and the writer checks that
 * it lands on every one of them.
 */
#include "engine/mkmodel.h"
#include "engine/mkmodel_int.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "ggml.h"
#include "gguf.h"

#define MOD "mkmodel"

/* ------------------------------------------------------------------ presets */
/* The presets and what follows from one: mkmodel_presets.c (mkmodel_int.h). */

/* Weights of gemma3's post-norms (post_attention_norm, post_ffw_norm). They
 * scale each block's output after an RMS norm, so the residual gain above
 * cannot: with 1.0 every block adds a vector as large as the embedding and
 * greedy output settles on one word ("state state state ..."); measured on
 * tiny-swa, 0.5 still did on most prompts, 0.3 read varied on one-turn
 * prompts but fell back into one word 150 tokens into a chat, 0.2 reads
 * varied through a 300-token chat and ends replies. */
#define POST_NORM_GAIN 0.2f

static const char k_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}";

/* -------------------------------------------------------------------- PRNG */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct rng { uint64_t s[4]; } rng;

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng *r) { /* xoshiro256** */
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

uint64_t ks__mkmodel_fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

/* One independent stream per tensor: the seed and the name, mixed. */
static void rng_seed(rng *r, uint64_t seed, const char *name) {
    uint64_t x = seed;
    uint64_t m = splitmix64(&x) ^ ks__mkmodel_fnv1a64(name);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&m);
}

/* A "normal-ish" value with mean 0 and standard deviation 1: the sum of two
 * independent uniforms (a triangular distribution on [-sqrt 6, sqrt 6]). One
 * 64-bit draw gives both 24-bit uniforms, so the stream is one draw per value. */
static inline float rng_tri(rng *r) {
    uint64_t x = rng_next(r);
    float a = (float)(x >> 40) * (1.0f / 16777216.0f);
    float b = (float)((x >> 16) & 0xffffff) * (1.0f / 16777216.0f);
    return (a + b - 1.0f) * 2.44948974f; /* sqrt(6): variance of (a+b-1) is 1/6 */
}

/* ------------------------------------------------------------------ tensors */
/* TK_RESID: the projections that write into the residual stream
 * (attn_output, ffn_down, shortconv.out_proj), scaled by ks__mk_resid_gain().
 * TK_POST_NORM: gemma3's norms of a block's output, POST_NORM_GAIN.
 * TK_SSM_A: mamba's A (negative: the state decays, exp(dt A) < 1, as
 * trained models' -exp(A_log) do; positive would grow it without bound).
 * TK_ONE: ones (mamba's skip D).
 * TK_BIAS: gpt-oss's biases, BIAS_STD. TK_SINK: its attention sinks, one
 * logit per head, SINK_STD. */
enum tkind { TK_NORM, TK_EMBD, TK_OUTPUT, TK_WEIGHT, TK_RESID, TK_POST_NORM, TK_SSM_A, TK_ONE, TK_BIAS, TK_SINK };

/* Biases small beside the products they are added to (a trained model's are
 * too); sinks of the size of the attention logits, so that a sink takes a
 * real share of a head's attention in some heads and little in others. */
#define BIAS_STD 0.02f
#define SINK_STD 1.0f

typedef struct tspec {
    char name[64];
    int64_t ne0, ne1; /* ggml order: ne0 = input dimension (row length) */
    int64_t ne2;      /* > 1: a 3-D tensor of ne2 matrices (the experts); 0 or 1: 2-D */
    enum ggml_type type;
    enum tkind kind;
} tspec;

/* The tensors of a model in file order (shapes: docs/LLAMA_FACTS.md; for
 * lfm2 and gemma3, design note 7 in mkmodel.h; for the experts' archs, note 9). */
static int make_specs(const preset *p, int n_vocab, tspec **out, int *n_out) {
    int n = 3 + 19 * p->n_layer; /* at most: gpt-oss's 19 tensors per layer */
    tspec *t = calloc((size_t)n, sizeof *t);
    if (!t) return KS_ENOMEM;
    int64_t E = p->n_embd, V = n_vocab, F = p->n_ff;
    int64_t d = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
    int64_t Hd = d * p->n_head, Hkvd = d * p->n_head_kv;
    int64_t X = p->n_expert, Fx = p->n_ff_exp;
    enum ggml_type xt = p->xtype ? p->xtype : p->wtype;
    int k = 0;
#define SPEC3(nm, a, b, c, ty, kd) do { assert(k < n); snprintf(t[k].name, sizeof t[k].name, "%s", nm); \
        t[k].ne0 = (a); t[k].ne1 = (b); t[k].ne2 = (c); t[k].type = (ty); t[k].kind = (kd); k++; } while (0)
#define SPEC(nm, a, b, ty, kd) SPEC3(nm, a, b, 0, ty, kd)
    enum ggml_type et = p->etype ? p->etype : p->wtype;
    SPEC("token_embd.weight", E, V, et, TK_EMBD);
    /* lfm2's final norm has the name of an embedding norm (a converter's
     * mistake llama.cpp keeps: LLM_TENSOR_OUTPUT_NORM_LFM2) */
    SPEC(p->arch == MK_ARCH_LFM2 ? "token_embd_norm.weight" : "output_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
    SPEC("output.weight", E, V, et, TK_OUTPUT);
    for (int l = 0; l < p->n_layer; l++) {
        char nm[64];
#define LSPEC(suffix, a, b, ty, kd) do { snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix); \
        SPEC(nm, a, b, ty, kd); } while (0)
        LSPEC("attn_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
        if (ks__mk_is_moe(p)) {
            /* qwen3moe and gpt-oss (src/models/qwen3moe.cpp, openai-moe.cpp):
             * attention, then a router (F32, as converters leave it) over
             * n_expert experts of gate/up/down, top n_expert_used per token */
            bool oss = p->arch == MK_ARCH_GPTOSS;
#define XSPEC(suffix, a, b, ty, kd) do { snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix); \
        SPEC3(nm, a, b, X, ty, kd); } while (0)
            LSPEC("attn_q.weight", E, Hd, p->wtype, TK_WEIGHT);
            if (oss) LSPEC("attn_q.bias", Hd, 1, GGML_TYPE_F32, TK_BIAS);
            LSPEC("attn_k.weight", E, Hkvd, p->wtype, TK_WEIGHT);
            if (oss) LSPEC("attn_k.bias", Hkvd, 1, GGML_TYPE_F32, TK_BIAS);
            LSPEC("attn_v.weight", E, Hkvd, p->wtype, TK_WEIGHT);
            if (oss) LSPEC("attn_v.bias", Hkvd, 1, GGML_TYPE_F32, TK_BIAS);
            LSPEC("attn_output.weight", Hd, E, p->wtype, TK_RESID);
            if (oss) {
                LSPEC("attn_output.bias", E, 1, GGML_TYPE_F32, TK_BIAS);
                LSPEC("attn_sinks.weight", p->n_head, 1, GGML_TYPE_F32, TK_SINK);
                /* gpt-oss's norm before the experts has this name */
                LSPEC("post_attention_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
            } else {
                LSPEC("attn_q_norm.weight", d, 1, GGML_TYPE_F32, TK_NORM);
                LSPEC("attn_k_norm.weight", d, 1, GGML_TYPE_F32, TK_NORM);
                LSPEC("ffn_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
            }
            LSPEC("ffn_gate_inp.weight", E, X, GGML_TYPE_F32, TK_WEIGHT);
            if (oss) LSPEC("ffn_gate_inp.bias", X, 1, GGML_TYPE_F32, TK_BIAS);
            XSPEC("ffn_gate_exps.weight", E, Fx, xt, TK_WEIGHT);
            if (oss) LSPEC("ffn_gate_exps.bias", Fx, X, GGML_TYPE_F32, TK_BIAS);
            XSPEC("ffn_up_exps.weight", E, Fx, xt, TK_WEIGHT);
            if (oss) LSPEC("ffn_up_exps.bias", Fx, X, GGML_TYPE_F32, TK_BIAS);
            XSPEC("ffn_down_exps.weight", Fx, E, xt, TK_RESID);
            if (oss) LSPEC("ffn_down_exps.bias", E, X, GGML_TYPE_F32, TK_BIAS);
#undef XSPEC
            continue;
        }
        if (p->arch == MK_ARCH_MAMBA) {
            /* llama.cpp's mamba: in -> (x, z), causal conv of x, selective
             * scan (dt, B, C from x), gated by z, out (llama_model_mamba) */
            int64_t Di = 2 * E, S = p->ssm_d_state, R = p->ssm_dt_rank;
            LSPEC("ssm_in.weight", E, 2 * Di, p->wtype, TK_WEIGHT);
            LSPEC("ssm_conv1d.weight", p->ssm_d_conv, Di, GGML_TYPE_F32, TK_WEIGHT);
            LSPEC("ssm_conv1d.bias", Di, 1, GGML_TYPE_F32, TK_WEIGHT);
            LSPEC("ssm_x.weight", Di, R + 2 * S, p->wtype, TK_WEIGHT);
            LSPEC("ssm_dt.weight", R, Di, GGML_TYPE_F32, TK_WEIGHT);
            LSPEC("ssm_dt.bias", Di, 1, GGML_TYPE_F32, TK_WEIGHT);
            LSPEC("ssm_a", S, Di, GGML_TYPE_F32, TK_SSM_A);
            LSPEC("ssm_d", Di, 1, GGML_TYPE_F32, TK_ONE);
            LSPEC("ssm_out.weight", Di, E, p->wtype, TK_RESID);
            continue; /* no feed-forward block */
        }
        if (p->arch == MK_ARCH_LFM2 && !ks__mk_lfm2_is_attn(p, l)) {
            /* depthwise causal convolution over conv_l_cache taps, gated:
             * in_proj makes (b, c, x), out = out_proj(c * conv(b * x)) */
            LSPEC("shortconv.conv.weight", p->conv_l_cache, E, GGML_TYPE_F32, TK_WEIGHT);
            LSPEC("shortconv.in_proj.weight", E, 3 * E, p->wtype, TK_WEIGHT);
            LSPEC("shortconv.out_proj.weight", E, E, p->wtype, TK_RESID);
        } else {
            bool qkv_b = p->arch == MK_ARCH_QWEN2VL; /* qwen2's q/k/v biases */
            LSPEC("attn_q.weight", E, Hd, p->wtype, TK_WEIGHT);
            if (qkv_b) LSPEC("attn_q.bias", Hd, 1, GGML_TYPE_F32, TK_BIAS);
            LSPEC("attn_k.weight", E, Hkvd, p->wtype, TK_WEIGHT);
            if (qkv_b) LSPEC("attn_k.bias", Hkvd, 1, GGML_TYPE_F32, TK_BIAS);
            LSPEC("attn_v.weight", E, Hkvd, p->wtype, TK_WEIGHT);
            if (qkv_b) LSPEC("attn_v.bias", Hkvd, 1, GGML_TYPE_F32, TK_BIAS);
            LSPEC("attn_output.weight", Hd, E, p->wtype, TK_RESID);
            if (p->arch != MK_ARCH_LLAMA && p->arch != MK_ARCH_QWEN2VL) {
                LSPEC("attn_q_norm.weight", d, 1, GGML_TYPE_F32, TK_NORM);
                LSPEC("attn_k_norm.weight", d, 1, GGML_TYPE_F32, TK_NORM);
            }
            if (p->arch == MK_ARCH_GEMMA3)
                LSPEC("post_attention_norm.weight", E, 1, GGML_TYPE_F32, TK_POST_NORM);
        }
        LSPEC("ffn_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
        LSPEC("ffn_gate.weight", E, F, p->wtype, TK_WEIGHT);
        LSPEC("ffn_up.weight", E, F, p->wtype, TK_WEIGHT);
        LSPEC("ffn_down.weight", F, E, p->wtype, TK_RESID);
        if (p->arch == MK_ARCH_GEMMA3) LSPEC("post_ffw_norm.weight", E, 1, GGML_TYPE_F32, TK_POST_NORM);
#undef LSPEC
    }
#undef SPEC
#undef SPEC3
    *out = t;
    *n_out = k;
    return 0;
}

/* The shape of what build_vocab and make_specs made. */
static void fill_shape(const preset *p, const vocab *v, const tspec *t, int nt, const tmpl_info *ti,
                       ks_mkmodel_shape *out) {
    memset(out, 0, sizeof *out);
    out->preset = p->name;
    out->n_vocab = v->n;
    out->n_embd = p->n_embd;
    out->n_layer = p->n_layer;
    out->n_head = p->n_head;
    out->n_head_kv = p->n_head_kv;
    out->n_ff = p->n_ff;
    out->n_ctx_train = p->n_ctx_train;
    out->wtype = (int)p->wtype;
    out->wtype_name = ggml_type_name(p->wtype);
    for (int i = 0; i < nt; i++) out->n_params += (uint64_t)(t[i].ne0 * t[i].ne1 * (t[i].ne2 > 1 ? t[i].ne2 : 1));
    out->arch = ks__mk_arch_name(p);
    out->n_expert = p->n_expert;
    out->n_expert_used = p->n_expert_used;
    out->tmpl_family = ti ? ti->fam->name : "chatml";
    out->n_tmpl_specials = ti ? ti->n : 0;
    out->bos = ti ? ti->fam->bos : "<s>";
    out->eog = ti ? ti->eog : "<|im_end|>";
    out->add_bos = ti ? ti->add_bos : true;
}

int ks_mkmodel_shape_of(const char *preset_name, ks_mkmodel_shape *out) {
    const preset *p = ks__mkmodel_find_preset(preset_name);
    if (!p || !out) return KS_EINVAL;
    vocab v;
    int rc = ks__mkmodel_build_vocab(p, NULL, false, &v);
    if (rc) return rc;
    tspec *t = NULL;
    int nt = 0;
    rc = make_specs(p, v.n, &t, &nt);
    if (rc) { ks__mkmodel_vocab_free(&v); return rc; }
    fill_shape(p, &v, t, nt, NULL, out);
    free(t);
    ks__mkmodel_vocab_free(&v);
    return 0;
}

/* ------------------------------------------------------------------ writing */
typedef struct writer {
    FILE *f;
    int err; /* saved errno of the first failure; later writes are skipped */
} writer;

static bool w_write(writer *w, const void *buf, size_t n) {
    if (w->err) return false;
    if (n && fwrite(buf, 1, n, w->f) != n) {
        w->err = errno ? errno : EIO;
        return false;
    }
    return true;
}

/* Q4_K's block (ggml-common.h): 256 values in 8 sub-blocks of 32, value =
 * d * scale_j * q - dmin * min_j with 4-bit q and 6-bit scale_j, min_j packed
 * in 12 bytes (get_scale_min_k4 in ggml-quants.c). */
#define Q4K_BLOCK 256
#define Q4K_BYTES 144

/* Random Q4_K blocks of standard deviation std and mean 0 (note 8): every
 * scale and min 32, q uniform on 0..15 (mean 7.5, standard deviation
 * sqrt(255/12) = 4.61), so d = std / (32 * 4.61) and dmin = 7.5 d. */
static void random_q4k_blocks(rng *r, uint8_t *out, int64_t n_blocks, float std) {
    ggml_fp16_t d = ggml_fp32_to_fp16(std / (32.0f * 4.6098f));
    ggml_fp16_t dmin = ggml_fp32_to_fp16(7.5f * ggml_fp16_to_fp32(d));
    /* scale_j = min_j = 32 for j < 4 in bytes 0..7 (low 6 bits; the top 2
     * bits are the high bits of sub-blocks 4..7), whose low 4 bits (bytes
     * 8..11) are 0: 32 = 0b10'0000 */
    static const uint8_t scales[12] = {160, 160, 160, 160, 160, 160, 160, 160, 0, 0, 0, 0};
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = out + b * Q4K_BYTES;
        memcpy(blk, &d, 2);
        memcpy(blk + 2, &dmin, 2);
        memcpy(blk + 4, scales, 12);
        for (int k = 0; k < 128; k += 8) {
            uint64_t x = rng_next(r);
            memcpy(blk + 16 + k, &x, 8);
        }
    }
}

/* Generates tensor t row chunk by row chunk and writes its bytes. */
static bool write_tensor(writer *w, const tspec *t, uint64_t seed, const vocab *v, float gain, float e_std,
                         float *fbuf, void *qbuf, int64_t chunk_elems, bool random_blocks) {
    rng r;
    rng_seed(&r, seed, t->name);
    /* a 3-D tensor's matrices follow each other row after row */
    const int64_t n_rows = t->ne1 * (t->ne2 > 1 ? t->ne2 : 1);
    if (random_blocks && t->type == GGML_TYPE_Q4_K && (t->kind == TK_WEIGHT || t->kind == TK_RESID) &&
        t->ne0 % Q4K_BLOCK == 0) {
        float std = 1.0f / sqrtf((float)t->ne0) * (t->kind == TK_RESID ? gain : 1.0f);
        int64_t per_chunk = chunk_elems / Q4K_BLOCK, total = t->ne0 / Q4K_BLOCK * n_rows;
        for (int64_t b0 = 0; b0 < total; b0 += per_chunk) {
            int64_t nb = total - b0 < per_chunk ? total - b0 : per_chunk;
            random_q4k_blocks(&r, qbuf, nb, std);
            if (!w_write(w, qbuf, (size_t)nb * Q4K_BYTES)) return false;
        }
        return true;
    }
    int64_t rows_per_chunk = chunk_elems / t->ne0;
    if (rows_per_chunk < 1) rows_per_chunk = 1;
    float std = 1.0f / sqrtf((float)t->ne0); /* 1/sqrt(fan_in) keeps activations O(1) */
    if (t->kind == TK_EMBD) std = e_std;
    if (t->kind == TK_RESID) std *= gain;
    if (t->kind == TK_BIAS) std = BIAS_STD;
    if (t->kind == TK_SINK) std = SINK_STD;
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
        int64_t nr = n_rows - r0 < rows_per_chunk ? n_rows - r0 : rows_per_chunk;
        for (int64_t i = 0; i < nr; i++) {
            float *row = fbuf + i * t->ne0;
            float s = std;
            if (t->kind == TK_OUTPUT) s *= v->out_scale[r0 + i];
            for (int64_t j = 0; j < t->ne0; j++)
                row[j] = t->kind == TK_NORM || t->kind == TK_ONE ? 1.0f
                         : t->kind == TK_POST_NORM              ? POST_NORM_GAIN
                         : t->kind == TK_SSM_A                  ? -(1.0f + (float)(j + 1) * 0.25f) - 0.1f * fabsf(rng_tri(&r))
                                                                : rng_tri(&r) * s;
        }
        int64_t ne = nr * t->ne0;
        size_t nbytes;
        const void *src;
        switch (t->type) {
        case GGML_TYPE_F32:
            src = fbuf;
            nbytes = (size_t)ne * sizeof(float);
            break;
        case GGML_TYPE_F16:
            ggml_fp32_to_fp16_row(fbuf, qbuf, ne);
            src = qbuf;
            nbytes = (size_t)ne * sizeof(ggml_fp16_t);
            break;
        default:
            nbytes = ggml_quantize_chunk(t->type, fbuf, qbuf, 0, nr, t->ne0, NULL);
            src = qbuf;
            break;
        }
        assert(nbytes == ggml_row_size(t->type, t->ne0) * (size_t)nr);
        if (!w_write(w, src, nbytes)) return false;
    }
    return true;
}

/* mkdir -p of the directory part of path. */
static int make_parents(const char *path, char *err, size_t errlen) {
    char *dir = strdup(path);
    if (!dir) return KS_ENOMEM;
    char *slash = strrchr(dir, '/');
    int rc = 0;
    if (slash && slash != dir) {
        *slash = '\0';
        for (char *p = dir + 1; ; p++) {
            if (*p == '/' || *p == '\0') {
                char c = *p;
                *p = '\0';
                if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                    int e = errno;
                    ks_set_err(err, errlen, "cannot create directory '%s': %s", dir, strerror(e));
                    rc = ks_errno_map(e);
                    break;
                }
                *p = c;
                if (c == '\0') break;
            }
        }
    }
    free(dir);
    return rc;
}

/* fsyncs the directory holding path, so that the rename is durable. */
static int fsync_parent(const char *path) {
    char *dir = strdup(path);
    if (!dir) return ENOMEM;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir) d = "/";
    else if (slash) { *slash = '\0'; d = dir; }
    int e = 0;
    int fd = open(d, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) e = errno;
    if (fd >= 0) close(fd);
    free(dir);
    return e;
}

static struct gguf_context *build_gguf(const preset *p, const vocab *v, const tmpl_info *ti,
                                       const char *chat_template, const tspec *t, int nt,
                                       struct ggml_context **gctx_out) {
    struct gguf_context *g = gguf_init_empty();
    if (!g) return NULL;
    char name[64];
    snprintf(name, sizeof name, "kvstash-%s", p->name);
    const char *arch = ks__mk_arch_name(p);
    char key[96];
#define AKEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    gguf_set_val_str(g, "general.architecture", arch);
    gguf_set_val_str(g, "general.name", name);
    gguf_set_val_u32(g, "general.file_type", p->ftype);
    gguf_set_val_u32(g, "general.quantization_version", GGML_QNT_VERSION);
    gguf_set_val_u32(g, AKEY("vocab_size"), (uint32_t)v->n);
    gguf_set_val_u32(g, AKEY("context_length"), (uint32_t)p->n_ctx_train);
    gguf_set_val_u32(g, AKEY("embedding_length"), (uint32_t)p->n_embd);
    gguf_set_val_u32(g, AKEY("block_count"), (uint32_t)p->n_layer);
    gguf_set_val_u32(g, AKEY("feed_forward_length"), (uint32_t)p->n_ff);
    gguf_set_val_u32(g, AKEY("attention.head_count"), (uint32_t)p->n_head);
    if (p->arch == MK_ARCH_LFM2) {
        /* lfm2 tells a convolution layer by its zero KV heads (is_recr) */
        uint32_t kv[256];
        assert(p->n_layer <= 256);
        for (int l = 0; l < p->n_layer; l++) kv[l] = ks__mk_lfm2_is_attn(p, l) ? (uint32_t)p->n_head_kv : 0;
        gguf_set_arr_data(g, AKEY("attention.head_count_kv"), GGUF_TYPE_UINT32, kv, (size_t)p->n_layer);
        gguf_set_val_u32(g, AKEY("shortconv.l_cache"), (uint32_t)p->conv_l_cache);
    } else {
        gguf_set_val_u32(g, AKEY("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    }
    /* gpt-oss: its real epsilon and rope (a base of 150000 and YaRN from 4096
     * trained tokens x 32); qwen3moe: Qwen3's base. The others as before. */
    gguf_set_val_f32(g, AKEY("attention.layer_norm_rms_epsilon"), p->arch == MK_ARCH_GPTOSS ? 1e-5f : 1e-6f);
    gguf_set_val_u32(g, AKEY("rope.dimension_count"),
                     (uint32_t)(p->head_dim ? p->head_dim : p->n_embd / p->n_head));
    gguf_set_val_f32(g, AKEY("rope.freq_base"), p->arch == MK_ARCH_GPTOSS     ? 150000.0f
                                                : p->arch == MK_ARCH_QWEN3MOE ? 1000000.0f
                                                                              : 10000.0f);
    if (p->head_dim) {
        gguf_set_val_u32(g, AKEY("attention.key_length"), (uint32_t)p->head_dim);
        gguf_set_val_u32(g, AKEY("attention.value_length"), (uint32_t)p->head_dim);
    }
    if (ks__mk_is_moe(p)) {
        gguf_set_val_u32(g, AKEY("expert_count"), (uint32_t)p->n_expert);
        gguf_set_val_u32(g, AKEY("expert_used_count"), (uint32_t)p->n_expert_used);
        gguf_set_val_u32(g, AKEY("expert_feed_forward_length"), (uint32_t)p->n_ff_exp);
    }
    if (p->arch == MK_ARCH_GPTOSS) {
        /* the window's layers follow llama.cpp's gpt-oss default (pattern 2:
         * layer il slides when il is even); the real files write no pattern */
        gguf_set_val_u32(g, AKEY("attention.sliding_window"), (uint32_t)p->n_swa);
        gguf_set_val_str(g, AKEY("rope.scaling.type"), "yarn");
        gguf_set_val_f32(g, AKEY("rope.scaling.factor"), 32.0f);
        gguf_set_val_u32(g, AKEY("rope.scaling.original_context_length"), 4096);
    }
    if (p->arch == MK_ARCH_MAMBA) {
        gguf_set_val_u32(g, AKEY("ssm.conv_kernel"), (uint32_t)p->ssm_d_conv);
        gguf_set_val_u32(g, AKEY("ssm.inner_size"), (uint32_t)(2 * p->n_embd));
        gguf_set_val_u32(g, AKEY("ssm.state_size"), (uint32_t)p->ssm_d_state);
        gguf_set_val_u32(g, AKEY("ssm.time_step_rank"), (uint32_t)p->ssm_dt_rank);
    }
    if (p->arch == MK_ARCH_QWEN2VL) {
        /* M-RoPE: the rotary pairs (head_dim / 2) split into sections for the
         * temporal, height and width positions (and a fourth, unused),
         * Qwen2-VL's proportions 16:24:24 of 64 */
        int half = (int)(p->n_embd / p->n_head) / 2;
        int32_t sec[4] = {half / 4, (half - half / 4) / 2, 0, 0};
        sec[2] = half - sec[0] - sec[1];
        gguf_set_arr_data(g, AKEY("rope.dimension_sections"), GGUF_TYPE_INT32, sec, 4);
    }
    if (p->arch == MK_ARCH_GEMMA3) {
        gguf_set_val_u32(g, AKEY("attention.sliding_window"), (uint32_t)p->n_swa);
        gguf_set_val_u32(g, AKEY("attention.sliding_window_pattern"), (uint32_t)p->swa_pattern);
    }
#undef AKEY

    gguf_set_val_str(g, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", (const char **)v->text, (size_t)v->n);
    gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->score, (size_t)v->n);
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->type, (size_t)v->n);
    /* Without a template the keys are exactly those of before templates
     * existed: the presets' files must not change (design note 6). */
    gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", ti ? (uint32_t)ti->bos_id : KS_MKMODEL_TOK_BOS);
    gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", ti ? (uint32_t)ti->eog_id : KS_MKMODEL_TOK_IM_END);
    /* llama.cpp guesses the end-of-turn token by its text; say it. */
    if (ti) gguf_set_val_u32(g, "tokenizer.ggml.eot_token_id", (uint32_t)ti->eog_id);
    gguf_set_val_u32(g, "tokenizer.ggml.unknown_token_id", KS_MKMODEL_TOK_UNK);
    gguf_set_val_bool(g, "tokenizer.ggml.add_bos_token", ti ? ti->add_bos : true);
    gguf_set_val_bool(g, "tokenizer.ggml.add_eos_token", false);
    /* Without this llama.cpp inserts "▁" after every special token of ChatML. */
    gguf_set_val_bool(g, "tokenizer.ggml.add_space_prefix", false);
    gguf_set_val_str(g, "tokenizer.chat_template", ti ? chat_template : k_chatml);

    /* Tensor infos only: a no_alloc ggml context holds the shapes; the data
     * is written separately (see the file comment). */
    struct ggml_init_params ip = {
        .mem_size = (size_t)nt * ggml_tensor_overhead() + 1024,
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    struct ggml_context *gctx = ggml_init(ip);
    if (!gctx) {
        gguf_free(g);
        return NULL;
    }
    for (int i = 0; i < nt; i++) {
        struct ggml_tensor *x = t[i].ne2 > 1   ? ggml_new_tensor_3d(gctx, t[i].type, t[i].ne0, t[i].ne1, t[i].ne2)
                                : t[i].ne1 == 1 ? ggml_new_tensor_1d(gctx, t[i].type, t[i].ne0)
                                                : ggml_new_tensor_2d(gctx, t[i].type, t[i].ne0, t[i].ne1);
        ggml_set_name(x, t[i].name);
        gguf_add_tensor(g, x);
    }
    *gctx_out = gctx;
    return g;
}

ks_mkmodel_params ks_mkmodel_params_default(void) {
    ks_mkmodel_params mp = {.preset = "tiny", .seed = 1, .chat_template = NULL};
    return mp;
}

int ks_mkmodel(const char *preset_name, uint64_t seed, const char *out_path, char *err, size_t errlen) {
    ks_mkmodel_params mp = {.preset = preset_name, .seed = seed, .chat_template = NULL};
    return ks_mkmodel_write(&mp, out_path, NULL, err, errlen);
}

int ks_mkmodel_write(const ks_mkmodel_params *mp, const char *out_path, ks_mkmodel_shape *shape,
                     char *err, size_t errlen) {
    if (!mp) {
        ks_set_err(err, errlen, "no parameters");
        return KS_EINVAL;
    }
    const char *preset_name = mp->preset;
    const uint64_t seed = mp->seed;
    const preset *pp = ks__mkmodel_find_preset(preset_name);
    if (!pp) {
        ks_set_err(err, errlen, "unknown preset '%s' (known: %s)", preset_name ? preset_name : "(null)",
                   ks_mkmodel_presets());
        return KS_EINVAL;
    }
    if (mp->n_ctx_train && (mp->n_ctx_train < KS_MKMODEL_CTX_MIN || mp->n_ctx_train > KS_MKMODEL_CTX_MAX)) {
        ks_set_err(err, errlen, "trained context %d out of range (%d..%d)", mp->n_ctx_train, KS_MKMODEL_CTX_MIN,
                   KS_MKMODEL_CTX_MAX);
        return KS_EINVAL;
    }
    preset pc = *pp; /* the preset as this call writes it */
    if (mp->n_ctx_train) pc.n_ctx_train = mp->n_ctx_train;
    const preset *p = &pc;
    if (!out_path || !out_path[0]) {
        ks_set_err(err, errlen, "no output path");
        return KS_EINVAL;
    }

    int rc = 0;
    tmpl_info tinfo = {0};
    tmpl_info *ti = NULL;
    vocab v = {0};
    tspec *t = NULL;
    int nt = 0;
    struct gguf_context *g = NULL;
    struct ggml_context *gctx = NULL;
    void *meta = NULL;
    float *fbuf = NULL;
    void *qbuf = NULL;
    char *tmp = NULL;
    int fd = -1;
    writer w = {0};

    if (mp->chat_template) {
        if ((rc = ks__mkmodel_tmpl_analyse(mp->chat_template, &tinfo, err, errlen)) != 0) goto done;
        ti = &tinfo;
    }
    if ((rc = ks__mkmodel_build_vocab(p, ti, mp->fim, &v)) != 0) goto done;
    if ((rc = make_specs(p, v.n, &t, &nt)) != 0) goto done;
    if (shape) fill_shape(p, &v, t, nt, ti, shape);
    g = build_gguf(p, &v, ti, mp->chat_template, t, nt, &gctx);
    if (!g) { rc = KS_ENOMEM; goto done; }

    size_t meta_size = gguf_get_meta_size(g);
    meta = malloc(meta_size);
    /* Chunks of about 4 Mi floats, but at least one row. */
    int64_t chunk = 1 << 22;
    if (chunk < p->n_ff) chunk = p->n_ff;
    fbuf = malloc((size_t)chunk * sizeof(float));
    qbuf = malloc((size_t)chunk * sizeof(float));
    tmp = malloc(strlen(out_path) + 16);
    if (!meta || !fbuf || !qbuf || !tmp) { rc = KS_ENOMEM; goto done; }
    gguf_get_meta_data(g, meta);

    if ((rc = make_parents(out_path, err, errlen)) != 0) goto done;
    sprintf(tmp, "%s.tmp.XXXXXX", out_path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        ks_set_err(err, errlen, "cannot write '%s' (temporary file '%s'): %s", out_path, tmp, strerror(e));
        rc = ks_errno_map(e);
        tmp[0] = '\0'; /* nothing to remove */
        goto done;
    }
    (void)fchmod(fd, 0644); /* mkstemp makes 0600; a model is not a secret */
    w.f = fdopen(fd, "wb");
    if (!w.f) { rc = ks_errno_map(errno); goto done; }
    fd = -1; /* owned by w.f now */

    const size_t align = gguf_get_alignment(g);
    static const uint8_t zeros[64];
    assert(align <= sizeof zeros);
    w_write(&w, meta, meta_size);
    for (int i = 0; i < nt && !w.err; i++) {
        /* The data must land exactly where the header says it is. */
        long pos = ftell(w.f);
        if (pos < 0 || (size_t)pos != meta_size + gguf_get_tensor_offset(g, i)) {
            ks_set_err(err, errlen, "internal error: tensor %s at offset %ld, header says %zu", t[i].name,
                       pos, meta_size + gguf_get_tensor_offset(g, i));
            rc = KS_EIO;
            goto done;
        }
        size_t nbytes = gguf_get_tensor_size(g, i);
        float gain = ks__mk_resid_gain(p);
        int il;
        if (p->perturb_from > 0 && sscanf(t[i].name, "blk.%d.", &il) == 1 && il >= p->perturb_from) gain *= p->perturb;
        if (!write_tensor(&w, &t[i], seed, &v, gain, ks__mk_embd_std(p), fbuf, qbuf, chunk, p->random_blocks)) break;
        size_t pad = GGML_PAD(nbytes, align) - nbytes;
        w_write(&w, zeros, pad);
    }
    if (!w.err && fflush(w.f) != 0) w.err = errno;
    if (!w.err && fsync(fileno(w.f)) != 0) w.err = errno;
    if (fclose(w.f) != 0 && !w.err) w.err = errno;
    w.f = NULL;
    if (w.err) {
        ks_set_err(err, errlen, "writing '%s': %s", tmp, strerror(w.err));
        rc = ks_errno_map(w.err);
        goto done;
    }
    if (rename(tmp, out_path) != 0) {
        int e = errno;
        ks_set_err(err, errlen, "cannot rename '%s' to '%s': %s", tmp, out_path, strerror(e));
        rc = ks_errno_map(e);
        goto done;
    }
    tmp[0] = '\0'; /* renamed: nothing to remove */
    int e = fsync_parent(out_path);
    if (e) KS_WARN(MOD, "fsync of the directory of '%s': %s", out_path, strerror(e));

done:
    if (w.f) fclose(w.f);
    if (fd >= 0) close(fd);
    if (rc && tmp && tmp[0]) unlink(tmp);
    free(tmp);
    free(qbuf);
    free(fbuf);
    free(meta);
    if (gctx) ggml_free(gctx);
    if (g) gguf_free(g);
    free(t);
    ks__mkmodel_vocab_free(&v);
    ks__mkmodel_tmpl_free(&tinfo);
    return rc;
}

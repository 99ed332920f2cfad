/*
 * mkmodel_mmproj.c — random-weight vision projectors that llama.cpp's mtmd
 * loads (`kvstash mkmodel --preset P --mmproj OUT-mmproj.gguf OUT.gguf`),
 * for the tests and benchmarks of images in the cache. See mkmodel.h note 10.
 *
 * The projector is LLaVA's: a CLIP ViT (patch convolution, learned position
 * embeddings, pre-norm blocks with biased attention and a GELU MLP) whose
 * second-to-last block's output goes through clip.cpp's PROJECTOR_TYPE_MLP
 * (mm.0 -> GELU -> mm.2) into the text model's embedding space. Keys and
 * tensor names are those tools/mtmd/clip-impl.h and clip.cpp of the pinned
 * source read for "mlp"; images are resized to image_size (mtmd's fixed-size
 * preprocessor), so every image takes (image_size / patch_size)^2 tokens.
 *
 * For a Gemma 3 text preset (arch gemma3: tiny-swa) the projector is Gemma
 * 3's instead (clip.cpp's PROJECTOR_TYPE_GEMMA3, built by clip_graph_siglip):
 * the same ViT (its last block's output, then a post-norm v.post_ln), the
 * patch grid average-pooled by clip.vision.projector.scale_factor a side,
 * RMS-normed with mm.soft_emb_norm and projected by mm.input_projection
 * (n_embd_vit x n_embd_text, no bias). mtmd decodes its image tokens with
 * non-causal attention (mtmd_decode_use_non_causal: engine/media.h note 2a)
 * and wraps them in <start_of_image> ... <end_of_image> text.
 *
 * With audio asked for, the file also has an audio encoder (mtmd loads both
 * from one file, each with its own projector type): Ultravox's, a Whisper encoder (two
 * 1-D convolutions over 80 mel bins, 3000 frames per 30 s chunk -> 1500
 * positions, pre-norm blocks with no bias on K) whose frames are stacked by
 * 12 and projected by an RMS-normed SwiGLU MLP: 125 tokens per 30 s chunk, a
 * shorter clip being padded to one chunk by mtmd's preprocessor. (The stack
 * factor must divide 1500: clip.cpp counts ceil(3000 / f) / 2 tokens where
 * the graph makes ceil(1500 / f), and aborts when they differ — 8, Ultravox's
 * own, gives 187 against 188.)
 *
 * Thread model: reentrant, as ks_mkmodel.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/mkmodel.h"
#include "engine/mkmodel_int.h"
#include "ggml.h"
#include "gguf.h"

/* The projector's shape for a text model of n_embd. */
typedef struct vshape {
    int image_size, patch_size, n_embd, n_layer, n_head, n_ff;
    int n_merge; /* Gemma 3: the average pool's side (0: LLaVA) */
    bool qwen2vl; /* Qwen2-VL's merger (M-RoPE): images of any size, 2x2 patches a token */
} vshape;

/* tiny: 64 image tokens from a 64x64 image; bench: 196 tokens of 224x224
 * through a ViT-S-sized encoder (6 blocks of 384, 6 heads), the cost of a
 * small real one. Gemma 3: 80x80 in 4x4 patches pooled 2x2, 100 tokens
 * (more than a scheduler's smallest prefill chunk, 64: the tests see a run
 * that must not be cut); or 224x224 in 16x16 patches pooled 2x2, 49 tokens
 * (the pool's side must divide the grid's). */
static vshape shape_for(int text_embd, bool gemma3, bool qwen2vl) {
    if (qwen2vl)
        /* One block of one head: mtmd's warm-up encodes a 1288x1288 image
         * (46x46 tokens, 8464 patches) whatever the file says. image_size is
         * the side of the tests' images, kept as they are (a multiple of 28
         * above the minimum of 8 tokens): 112x112 gives 4x4 tokens over 4
         * positions. */
        return (vshape){.image_size = 112, .patch_size = 14, .n_embd = 32, .n_layer = 1, .n_head = 1, .n_ff = 64,
                        .n_merge = 2, .qwen2vl = true};
    if (gemma3) {
        if (text_embd <= 256)
            return (vshape){.image_size = 80, .patch_size = 4, .n_embd = 32, .n_layer = 2, .n_head = 2, .n_ff = 64,
                            .n_merge = 2};
        return (vshape){.image_size = 224, .patch_size = 16, .n_embd = 384, .n_layer = 6, .n_head = 6, .n_ff = 1536,
                        .n_merge = 2};
    }
    if (text_embd <= 256) return (vshape){.image_size = 64, .patch_size = 8, .n_embd = 32, .n_layer = 2, .n_head = 2, .n_ff = 64};
    return (vshape){.image_size = 224, .patch_size = 16, .n_embd = 384, .n_layer = 6, .n_head = 6, .n_ff = 1536};
}

/* Image tokens of a projector of shape v. */
static int n_image_tokens(const vshape *v) {
    int side = v->image_size / v->patch_size;
    if (v->n_merge > 0) side /= v->n_merge;
    return side * side;
}

static uint64_t smix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Values of mean 0 and standard deviation std, from the seed and the tensor's
 * name only (mkmodel.h note 1): a sum of two uniforms, as mkmodel.c's. */
static void fill_random(float *v, int64_t n, uint64_t seed, const char *name, float std) {
    uint64_t s = seed ^ ks__mkmodel_fnv1a64(name) ^ 0x6d6d70726f6aULL; /* "mmproj" */
    for (int64_t i = 0; i < n; i++) {
        uint64_t x = smix(&s);
        float a = (float)(x >> 40) * (1.0f / 16777216.0f);
        float b = (float)((x >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        v[i] = (a + b - 1.0f) * 2.44948974f * std;
    }
}

enum { FILL_RANDOM, FILL_ONES, FILL_ZEROS };

/* Adds a tensor of ne (ggml order), F16 when f16, filled as `how`. */
static int add_tensor(struct ggml_context *ctx, struct gguf_context *g, const char *name, int n_dims,
                      const int64_t *ne, bool f16, int how, float std, uint64_t seed) {
    struct ggml_tensor *t = ggml_new_tensor(ctx, f16 ? GGML_TYPE_F16 : GGML_TYPE_F32, n_dims, ne);
    if (!t) return KS_ENOMEM;
    ggml_set_name(t, name);
    int64_t n = ggml_nelements(t);
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return KS_ENOMEM;
    if (how == FILL_RANDOM) fill_random(v, n, seed, name, std);
    else for (int64_t i = 0; i < n; i++) v[i] = how == FILL_ONES ? 1.0f : 0.0f;
    if (f16) ggml_fp32_to_fp16_row(v, (ggml_fp16_t *)t->data, n);
    else memcpy(t->data, v, sizeof(float) * (size_t)n);
    free(v);
    gguf_add_tensor(g, t);
    return 0;
}

#define NE(...) ((const int64_t[]){__VA_ARGS__})

static int add_tensors(struct ggml_context *ctx, struct gguf_context *g, const vshape *v, int text_embd,
                       uint64_t seed) {
    int E = v->n_embd, F = v->n_ff, P = v->patch_size, T = text_embd;
    int n_patches = (v->image_size / P) * (v->image_size / P);
    int rc = 0;
    char nm[96];
    rc = rc ? rc : add_tensor(ctx, g, "v.patch_embd.weight", 4, NE(P, P, 3, E), true, FILL_RANDOM,
                              1.0f / sqrtf((float)(P * P * 3)), seed);
    if (v->qwen2vl) {
        /* Qwen2-VL: a second patch convolution (the temporal pair's other
         * frame, summed for a still image), no bias, no position embeddings
         * (2-D M-RoPE in the ViT's attention instead) */
        rc = rc ? rc : add_tensor(ctx, g, "v.patch_embd.weight.1", 4, NE(P, P, 3, E), true, FILL_RANDOM,
                                  1.0f / sqrtf((float)(P * P * 3)), seed);
    } else {
        rc = rc ? rc : add_tensor(ctx, g, "v.patch_embd.bias", 1, NE(E), false, FILL_ZEROS, 0, seed);
        rc = rc ? rc : add_tensor(ctx, g, "v.position_embd.weight", 2, NE(E, n_patches), false, FILL_RANDOM, 0.5f,
                                  seed);
    }
    for (int il = 0; il < v->n_layer && !rc; il++) {
        static const char *const attn[] = {"attn_q", "attn_k", "attn_v", "attn_out"};
        for (int j = 0; j < 4 && !rc; j++) {
            snprintf(nm, sizeof nm, "v.blk.%d.%s.weight", il, attn[j]);
            rc = add_tensor(ctx, g, nm, 2, NE(E, E), true, FILL_RANDOM, 1.0f / sqrtf((float)E), seed);
            snprintf(nm, sizeof nm, "v.blk.%d.%s.bias", il, attn[j]);
            rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ZEROS, 0, seed);
        }
        for (int j = 1; j <= 2 && !rc; j++) {
            snprintf(nm, sizeof nm, "v.blk.%d.ln%d.weight", il, j);
            rc = add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ONES, 0, seed);
            snprintf(nm, sizeof nm, "v.blk.%d.ln%d.bias", il, j);
            rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ZEROS, 0, seed);
        }
        snprintf(nm, sizeof nm, "v.blk.%d.ffn_up.weight", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 2, NE(E, F), true, FILL_RANDOM, 1.0f / sqrtf((float)E), seed);
        snprintf(nm, sizeof nm, "v.blk.%d.ffn_up.bias", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(F), false, FILL_ZEROS, 0, seed);
        snprintf(nm, sizeof nm, "v.blk.%d.ffn_down.weight", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 2, NE(F, E), true, FILL_RANDOM, 1.0f / sqrtf((float)F), seed);
        snprintf(nm, sizeof nm, "v.blk.%d.ffn_down.bias", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ZEROS, 0, seed);
    }
    if (v->qwen2vl) {
        /* The merger: each 2x2 group of patches (4 E wide) through mm.0 ->
         * GELU -> mm.2 into the text model's space (mkmodel.h note 5). */
        int M = 4 * E;
        rc = rc ? rc : add_tensor(ctx, g, "mm.0.weight", 2, NE(M, M), true, FILL_RANDOM, 1.0f / sqrtf((float)M), seed);
        rc = rc ? rc : add_tensor(ctx, g, "mm.0.bias", 1, NE(M), false, FILL_ZEROS, 0, seed);
        rc = rc ? rc : add_tensor(ctx, g, "mm.2.weight", 2, NE(M, T), true, FILL_RANDOM, 1.5f / sqrtf((float)M), seed);
        rc = rc ? rc : add_tensor(ctx, g, "mm.2.bias", 1, NE(T), false, FILL_ZEROS, 0, seed);
        return rc;
    }
    if (v->n_merge > 0) {
        /* Gemma 3: post-norm, then (after the pool) RMS norm and a plain
         * projection, whose output (unit rows in, weights of 1/sqrt(E)) is at
         * about the scale the text model's token embeddings take in its
         * graph (mkmodel.h note 5: gemma3's are multiplied by sqrt(n_embd)
         * there, media embeddings are not). */
        rc = rc ? rc : add_tensor(ctx, g, "v.post_ln.weight", 1, NE(E), false, FILL_ONES, 0, seed);
        rc = rc ? rc : add_tensor(ctx, g, "v.post_ln.bias", 1, NE(E), false, FILL_ZEROS, 0, seed);
        rc = rc ? rc : add_tensor(ctx, g, "mm.soft_emb_norm.weight", 1, NE(E), false, FILL_ONES, 0, seed);
        rc = rc ? rc : add_tensor(ctx, g, "mm.input_projection.weight", 2, NE(T, E), true, FILL_RANDOM,
                                  1.0f / sqrtf((float)E), seed);
        return rc;
    }
    /* The LLaVA projection into the text model's space: its output at about
     * the scale of the text model's token embeddings (mkmodel.h note 5). */
    rc = rc ? rc : add_tensor(ctx, g, "mm.0.weight", 2, NE(E, T), true, FILL_RANDOM, 1.0f / sqrtf((float)E), seed);
    rc = rc ? rc : add_tensor(ctx, g, "mm.0.bias", 1, NE(T), false, FILL_ZEROS, 0, seed);
    rc = rc ? rc : add_tensor(ctx, g, "mm.2.weight", 2, NE(T, T), true, FILL_RANDOM, 1.5f / sqrtf((float)T), seed);
    rc = rc ? rc : add_tensor(ctx, g, "mm.2.bias", 1, NE(T), false, FILL_ZEROS, 0, seed);
    return rc;
}

/* The audio encoder: Whisper's shape in miniature, for every preset. */
enum { A_MEL = 80, A_EMBD = 32, A_LAYER = 2, A_HEAD = 2, A_FF = 64, A_POS = 1500, A_STACK = 12 };

static int add_audio_tensors(struct ggml_context *ctx, struct gguf_context *g, int text_embd, uint64_t seed) {
    int E = A_EMBD, F = A_FF, T = text_embd, S = E * A_STACK;
    int rc = 0;
    char nm[96];
    float se = 1.0f / sqrtf((float)E);
    rc = rc ? rc : add_tensor(ctx, g, "a.conv1d.1.weight", 3, NE(3, A_MEL, E), true, FILL_RANDOM,
                              1.0f / sqrtf(3.0f * A_MEL), seed);
    rc = rc ? rc : add_tensor(ctx, g, "a.conv1d.1.bias", 2, NE(1, E), false, FILL_ZEROS, 0, seed);
    rc = rc ? rc : add_tensor(ctx, g, "a.conv1d.2.weight", 3, NE(3, E, E), true, FILL_RANDOM,
                              1.0f / sqrtf(3.0f * E), seed);
    rc = rc ? rc : add_tensor(ctx, g, "a.conv1d.2.bias", 2, NE(1, E), false, FILL_ZEROS, 0, seed);
    rc = rc ? rc : add_tensor(ctx, g, "a.position_embd.weight", 2, NE(E, A_POS), false, FILL_RANDOM, 0.5f, seed);
    for (int il = 0; il < A_LAYER && !rc; il++) {
        static const char *const attn[] = {"attn_q", "attn_k", "attn_v", "attn_out"};
        for (int j = 0; j < 4 && !rc; j++) {
            snprintf(nm, sizeof nm, "a.blk.%d.%s.weight", il, attn[j]);
            rc = add_tensor(ctx, g, nm, 2, NE(E, E), true, FILL_RANDOM, se, seed);
            if (j == 1) continue; /* Whisper's K has no bias (whisper-enc.cpp asserts it) */
            snprintf(nm, sizeof nm, "a.blk.%d.%s.bias", il, attn[j]);
            rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ZEROS, 0, seed);
        }
        for (int j = 1; j <= 2 && !rc; j++) {
            snprintf(nm, sizeof nm, "a.blk.%d.ln%d.weight", il, j);
            rc = add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ONES, 0, seed);
            snprintf(nm, sizeof nm, "a.blk.%d.ln%d.bias", il, j);
            rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ZEROS, 0, seed);
        }
        snprintf(nm, sizeof nm, "a.blk.%d.ffn_up.weight", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 2, NE(E, F), true, FILL_RANDOM, se, seed);
        snprintf(nm, sizeof nm, "a.blk.%d.ffn_up.bias", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(F), false, FILL_ZEROS, 0, seed);
        snprintf(nm, sizeof nm, "a.blk.%d.ffn_down.weight", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 2, NE(F, E), true, FILL_RANDOM, 1.0f / sqrtf((float)F), seed);
        snprintf(nm, sizeof nm, "a.blk.%d.ffn_down.bias", il);
        rc = rc ? rc : add_tensor(ctx, g, nm, 1, NE(E), false, FILL_ZEROS, 0, seed);
    }
    /* Ultravox's projector: RMS norm, SwiGLU up to 2T, RMS norm, down to T. */
    rc = rc ? rc : add_tensor(ctx, g, "mm.a.norm_pre.weight", 1, NE(S), false, FILL_ONES, 0, seed);
    rc = rc ? rc : add_tensor(ctx, g, "mm.a.mlp.1.weight", 2, NE(S, 2 * T), true, FILL_RANDOM,
                              1.0f / sqrtf((float)S), seed);
    rc = rc ? rc : add_tensor(ctx, g, "mm.a.norm_mid.weight", 1, NE(T), false, FILL_ONES, 0, seed);
    rc = rc ? rc : add_tensor(ctx, g, "mm.a.mlp.2.weight", 2, NE(T, T), true, FILL_RANDOM,
                              1.5f / sqrtf((float)T), seed);
    return rc;
}

static void set_audio_keys(struct gguf_context *g, int text_embd) {
    gguf_set_val_bool(g, "clip.has_audio_encoder", true);
    gguf_set_val_str(g, "clip.audio.projector_type", "ultravox");
    gguf_set_val_u32(g, "clip.audio.num_mel_bins", A_MEL);
    gguf_set_val_u32(g, "clip.audio.embedding_length", A_EMBD);
    gguf_set_val_u32(g, "clip.audio.feed_forward_length", A_FF);
    gguf_set_val_u32(g, "clip.audio.block_count", A_LAYER);
    gguf_set_val_u32(g, "clip.audio.projection_dim", (uint32_t)text_embd);
    gguf_set_val_u32(g, "clip.audio.attention.head_count", A_HEAD);
    gguf_set_val_f32(g, "clip.audio.attention.layer_norm_epsilon", 1e-5f);
    gguf_set_val_u32(g, "clip.audio.projector.stack_factor", A_STACK);
}

static void set_keys(struct gguf_context *g, const vshape *v, int text_embd, const char *preset) {
    char name[96];
    snprintf(name, sizeof name, "kvstash random mmproj for %s", preset);
    gguf_set_val_str(g, "general.architecture", "clip");
    gguf_set_val_str(g, "general.name", name);
    gguf_set_val_u32(g, "general.file_type", 1); /* mostly F16 */
    gguf_set_val_bool(g, "clip.has_vision_encoder", true);
    /* Per modality (the file may hold an audio encoder too): mtmd reads
     * clip.vision.projector_type when clip.projector_type is absent. */
    gguf_set_val_str(g, "clip.vision.projector_type",
                     v->qwen2vl ? "qwen2vl_merger" : v->n_merge > 0 ? "gemma3" : "mlp");
    if (v->n_merge > 0 && !v->qwen2vl) gguf_set_val_u32(g, "clip.vision.projector.scale_factor", (uint32_t)v->n_merge);
    gguf_set_val_bool(g, "clip.use_gelu", true);
    gguf_set_val_u32(g, "clip.vision.image_size", (uint32_t)v->image_size);
    gguf_set_val_u32(g, "clip.vision.patch_size", (uint32_t)v->patch_size);
    gguf_set_val_u32(g, "clip.vision.embedding_length", (uint32_t)v->n_embd);
    gguf_set_val_u32(g, "clip.vision.feed_forward_length", (uint32_t)v->n_ff);
    gguf_set_val_u32(g, "clip.vision.block_count", (uint32_t)v->n_layer);
    gguf_set_val_u32(g, "clip.vision.projection_dim", (uint32_t)text_embd);
    gguf_set_val_u32(g, "clip.vision.attention.head_count", (uint32_t)v->n_head);
    gguf_set_val_f32(g, "clip.vision.attention.layer_norm_epsilon", 1e-6f);
    static const float half[3] = {0.5f, 0.5f, 0.5f};
    gguf_set_arr_data(g, "clip.vision.image_mean", GGUF_TYPE_FLOAT32, half, 3);
    gguf_set_arr_data(g, "clip.vision.image_std", GGUF_TYPE_FLOAT32, half, 3);
}

static int fsync_path(const char *path, bool dir) {
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return KS_EIO;
    int rc = fsync(fd) == 0 ? 0 : (errno == ENOSPC ? KS_ENOSPC : KS_EIO);
    close(fd);
    return rc;
}

int ks_mkmodel_mmproj(const char *text_preset, uint64_t seed, bool audio, const char *out_path,
                      ks_mkmodel_mmproj_shape *shape, char *err, size_t errlen) {
    ks_mkmodel_shape ts;
    if (!out_path || !out_path[0]) {
        ks_set_err(err, errlen, "no output path for the projector");
        return KS_EINVAL;
    }
    int rc = ks_mkmodel_shape_of(text_preset, &ts);
    if (rc) {
        ks_set_err(err, errlen, "unknown preset '%s'", text_preset ? text_preset : "(null)");
        return rc;
    }
    const preset *tp = ks__mkmodel_find_preset(text_preset);
    vshape v = shape_for(ts.n_embd, tp && tp->arch == MK_ARCH_GEMMA3, tp && tp->arch == MK_ARCH_QWEN2VL);
    size_t mem = 64u << 20;
    if (ts.n_embd > 256) mem = 256u << 20;
    struct ggml_init_params ip = {.mem_size = mem, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(ip);
    struct gguf_context *g = gguf_init_empty();
    char *tmp = NULL;
    if (!ctx || !g) {
        rc = KS_ENOMEM;
        goto done;
    }
    set_keys(g, &v, ts.n_embd, ts.preset);
    if (audio) set_audio_keys(g, ts.n_embd);
    rc = add_tensors(ctx, g, &v, ts.n_embd, seed);
    if (!rc && audio) rc = add_audio_tensors(ctx, g, ts.n_embd, seed);
    if (rc) goto done;
    /* Atomic: temp file, fsync, rename, fsync the directory (mkmodel.h note 2). */
    tmp = malloc(strlen(out_path) + 16);
    if (!tmp) {
        rc = KS_ENOMEM;
        goto done;
    }
    sprintf(tmp, "%s.tmp.%d", out_path, (int)getpid());
    if (!gguf_write_to_file(g, tmp, false) || fsync_path(tmp, false)) {
        rc = KS_EIO;
        ks_set_err(err, errlen, "could not write '%s'", tmp);
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, out_path) != 0) {
        rc = errno == ENOENT ? KS_ENOENT : KS_EIO;
        ks_set_err(err, errlen, "could not rename '%s' to '%s': %s", tmp, out_path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    {
        char *dir = strdup(out_path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash) *slash = '\0';
        if (dir) fsync_path(slash ? (dir[0] ? dir : "/") : ".", true);
        free(dir);
    }
    if (shape) {
        shape->image_size = v.image_size;
        shape->patch_size = v.patch_size;
        shape->n_embd = v.n_embd;
        shape->n_layer = v.n_layer;
        shape->n_tokens = n_image_tokens(&v);
        shape->gemma3 = v.n_merge > 0 && !v.qwen2vl;
        shape->qwen2vl = v.qwen2vl;
        shape->n_embd_text = ts.n_embd;
        shape->audio = audio;
    }
done:
    if (rc == KS_ENOMEM) ks_set_err(err, errlen, "out of memory writing the projector");
    free(tmp);
    if (g) gguf_free(g);
    if (ctx) ggml_free(ctx);
    return rc;
}

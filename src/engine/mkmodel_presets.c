/*
 * mkmodel_presets.c — the shapes `kvstash mkmodel --preset NAME` writes: one
 * table row per preset (mkmodel_int.h's struct preset). See mkmodel.h.
 *
 * Thread model: constant data.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "engine/mkmodel.h"
#include "engine/mkmodel_int.h"
#include "ggml.h"

/* GGUF general.file_type values (llama.h's llama_ftype) */
enum { FTYPE_F16 = 1, FTYPE_Q8_0 = 7, FTYPE_Q4_K_M = 15, FTYPE_MXFP4_MOE = 38 };

static const preset k_presets[] = {
    {.name = "tiny", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16},
    {.name = "bench", .n_embd = 896, .n_layer = 24, .n_head = 14, .n_head_kv = 2, .n_ff = 4864,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q8_0, .ftype = FTYPE_Q8_0},
    /* the bench model in Q4_K (n_embd 1024: K-quant rows are multiples of 256), the type
     * most local models are run in; ggml's CPU
     * backend repacks it (docs/LLAMA_FACTS.md, batch invariance) */
    {.name = "bench-q4k", .n_embd = 1024, .n_layer = 24, .n_head = 16, .n_head_kv = 2, .n_ff = 4864,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q4_K, .ftype = FTYPE_Q4_K_M},
    /* an 8B shape (Llama 3 8B's layers: n_embd 4096, 32 layers, 32 heads, 8 KV heads, ffn
     * 14336) in Q4_K, for GPU benchmarks: the block weights are random Q4_K blocks
     * written directly (mkmodel.h note 8), token_embd and output Q8_0 as generated
     * (readable output, note 4); ~4.3 GB, written in seconds */
    {.name = "bench-8b-q4k", .n_embd = 4096, .n_layer = 32, .n_head = 32, .n_head_kv = 8, .n_ff = 14336,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q4_K, .ftype = FTYPE_Q4_K_M, .etype = GGML_TYPE_Q8_0, .random_blocks = true},
    /* tiny in Q4_K (n_embd 256, a multiple of the K-quant row): repacked like
     * bench-q4k, for the exactness tests of the repacked kernels */
    {.name = "tiny-q4k", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 512,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_Q4_K, .ftype = FTYPE_Q4_K_M},
    /* hybrid (design note 7): LFM2, short convolutions with attention in every
     * other layer; the bench one has LFM2's own ratio, attention in one layer of three */
    {.name = "tiny-hybrid", .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16,
     .arch = MK_ARCH_LFM2, .attn_period = 2, .conv_l_cache = 3},
    /* tiny-hybrid with heads of 64 (n_embd 128, 2 heads): quantized K/V blocks of 32 fit */
    {.name = "tiny-hybrid-h64", .n_embd = 128, .n_layer = 4, .n_head = 2, .n_head_kv = 1, .n_ff = 256,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16,
     .arch = MK_ARCH_LFM2, .attn_period = 2, .conv_l_cache = 3},
    {.name = "bench-hybrid", .n_embd = 896, .n_layer = 24, .n_head = 14, .n_head_kv = 2, .n_ff = 4864,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q8_0, .ftype = FTYPE_Q8_0, .arch = MK_ARCH_LFM2, .attn_period = 3, .conv_l_cache = 3},
    /* sliding-window attention: Gemma 3, sliding and global layers alternating */
    {.name = "tiny-swa", .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16,
     .arch = MK_ARCH_GEMMA3, .n_swa = 32, .swa_pattern = 2},
    /* the tiny shape with a vocabulary that tokenizes coding agents' prompts as
     * densely as a real model's (about 4 bytes a token, mkmodel_agent_vocab.c)
     * and a long trained context: an agent's 100 KB first request fits */
    {.name = "tiny-agent", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 131072, .n_vocab_max = 24000, .agent_vocab = true, .wtype = GGML_TYPE_F16,
     .ftype = FTYPE_F16, .eog_scale = SCALE_IM_END_AGENT},
    /* Draft/target pairs for speculative decoding (mkmodel.h note 11): the
     * target is its draft's layers plus layers that perturb the residual
     * stream a little; the draft proposes what the target samples on most
     * tokens (the acceptance each pair gives: docs/BENCHMARKS.md "Draft models") */
    {.name = "tiny-draft", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16, .gain_layers = 2},
    {.name = "tiny-target", .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16, .gain_layers = 2,
     .perturb_from = 2, .perturb = 0.1f},
    {.name = "bench-draft", .n_embd = 896, .n_layer = 4, .n_head = 14, .n_head_kv = 2, .n_ff = 4864,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q8_0, .ftype = FTYPE_Q8_0, .gain_layers = 4},
    {.name = "bench-target", .n_embd = 896, .n_layer = 24, .n_head = 14, .n_head_kv = 2, .n_ff = 4864,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q8_0, .ftype = FTYPE_Q8_0, .gain_layers = 4, .perturb_from = 4, .perturb = 0.05f},
    /* recurrent: Mamba, state-space layers only (no attention, no feed-forward) */
    {.name = "tiny-mamba", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16,
     .arch = MK_ARCH_MAMBA, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 4},
    /* mixture of experts (design note 9): Qwen3-MoE's layers (q/k norms, head
     * dim 2 n_embd / n_head as Qwen3-30B-A3B's, experts in every layer, softmax
     * top-k gating, the chosen weights renormalised). The tiny ones for tests
     * (Q8_0, never repacked; Q4_K, repacked on x86), the bench ones at
     * Qwen3-30B-A3B's ratios with half its width and layers: 64 experts, 8
     * routed, ~0.5 B parameters per token of 2.6 B; bench-moe-q4k's block
     * weights are random Q4_K blocks (note 8: seconds, not minutes, to write) */
    {.name = "tiny-moe", .n_embd = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 256,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_Q8_0, .ftype = FTYPE_Q8_0,
     .arch = MK_ARCH_QWEN3MOE, .head_dim = 64, .n_expert = 16, .n_expert_used = 4, .n_ff_exp = 64},
    {.name = "tiny-moe-q4k", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 1024,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_Q4_K, .ftype = FTYPE_Q4_K_M,
     .arch = MK_ARCH_QWEN3MOE, .head_dim = 64, .n_expert = 16, .n_expert_used = 4, .n_ff_exp = 256},
    {.name = "tiny-moe-iq4xs", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 1024,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_IQ4_XS, .ftype = 30,
     .arch = MK_ARCH_QWEN3MOE, .head_dim = 64, .n_expert = 16, .n_expert_used = 4, .n_ff_exp = 256},
    {.name = "bench-moe", .n_embd = 1024, .n_layer = 24, .n_head = 16, .n_head_kv = 4, .n_ff = 4096,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q8_0, .ftype = FTYPE_Q8_0, .arch = MK_ARCH_QWEN3MOE, .head_dim = 128,
     .n_expert = 64, .n_expert_used = 8, .n_ff_exp = 512},
    {.name = "bench-moe-q4k", .n_embd = 1024, .n_layer = 24, .n_head = 16, .n_head_kv = 4, .n_ff = 4096,
     .n_ctx_train = 32768, .n_vocab_max = 32000, .rich_vocab = true, .pad_vocab = true,
     .wtype = GGML_TYPE_Q4_K, .ftype = FTYPE_Q4_K_M, .arch = MK_ARCH_QWEN3MOE, .head_dim = 128,
     .n_expert = 64, .n_expert_used = 8, .n_ff_exp = 512, .random_blocks = true},
    /* gpt-oss (design note 9): MXFP4 experts with biases, attention sinks, a
     * 32-token sliding window in layers 0 and 2, YaRN over 4096 tokens x 32;
     * the rest Q8_0. Meant to be written with its real template
     * (--chat-template openai-gpt-oss-120b.jinja) */
    {.name = "tiny-gptoss", .n_embd = 128, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .n_ff = 256,
     .n_ctx_train = 131072, .n_vocab_max = 1000, .wtype = GGML_TYPE_Q8_0, .ftype = FTYPE_MXFP4_MOE,
     .arch = MK_ARCH_GPTOSS, .n_swa = 32, .swa_pattern = 2, .head_dim = 64, .n_expert = 8,
     .n_expert_used = 2, .n_ff_exp = 128, .xtype = GGML_TYPE_MXFP4},
    /* M-RoPE: Qwen2-VL's text model (qwen2vl), the tiny shape; with --mmproj
     * Qwen2-VL's projector, whose image tokens take fewer KV positions than
     * tokens (engine/media.h note 2) */
    {.name = "tiny-mrope", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
     .n_ctx_train = 8192, .n_vocab_max = 1000, .wtype = GGML_TYPE_F16, .ftype = FTYPE_F16,
     .arch = MK_ARCH_QWEN2VL},
};

const char *ks_mkmodel_presets(void) {
    return "tiny|bench|bench-q4k|bench-8b-q4k|tiny-q4k|tiny-hybrid|bench-hybrid|tiny-swa|tiny-mamba|tiny-agent|"
           "tiny-moe|tiny-moe-q4k|tiny-moe-iq4xs|bench-moe|bench-moe-q4k|tiny-gptoss|tiny-mrope";
}

const preset *ks__mkmodel_find_preset(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(k_presets[i].name, name)) return &k_presets[i];
    return NULL;
}

const char *ks__mk_arch_name(const preset *p) {
    switch (p->arch) {
    case MK_ARCH_LFM2: return "lfm2";
    case MK_ARCH_GEMMA3: return "gemma3";
    case MK_ARCH_MAMBA: return "mamba";
    case MK_ARCH_QWEN3MOE: return "qwen3moe";
    case MK_ARCH_GPTOSS: return "gpt-oss";
    case MK_ARCH_QWEN2VL: return "qwen2vl";
    default: return "llama";
    }
}

/* lfm2: whether layer il is an attention layer (the others are convolutions). */
bool ks__mk_lfm2_is_attn(const preset *p, int il) { return il % p->attn_period == p->attn_period - 1; }

bool ks__mk_is_moe(const preset *p) { return p->n_expert > 0; }

/* Standard deviation of the token embeddings. With random weights the
 * attention output drifts towards one common vector (nearly uniform attention
 * averages the context), which makes greedy output repeat one word; embeddings
 * of the size of the layers' outputs keep the current token visible in the
 * residual stream (measured: 0.4 gave "still still still ...", 1.0 varied
 * text). RMS norm removes the overall scale anyway. */
#define EMBD_STD 1.0f

/* Gain of the residual projections. Each layer's attention adds a nearly
 * context-independent vector, and over 24 layers these add up until every
 * position predicts the same word. Scaling the residual projections down with
 * depth (as GPT-2 does at init) keeps the current token and its context
 * visible: measured on bench, gain 1 repeats one word, 1/sqrt(2 n_layer)
 * makes every reply the same chain, 1.5/sqrt(n_layer) reads varied. */
float ks__mk_resid_gain(const preset *p) {
    float g = 1.5f / sqrtf((float)(p->gain_layers ? p->gain_layers : p->n_layer));
    return g < 1.0f ? g : 1.0f;
}

/* Standard deviation of the token embeddings as stored. Gemma multiplies
 * them by sqrt(n_embd) in the graph; dividing here gives the residual
 * stream the scale EMBD_STD gives `llama`. */
float ks__mk_embd_std(const preset *p) {
    return p->arch == MK_ARCH_GEMMA3 ? EMBD_STD / sqrtf((float)p->n_embd) : EMBD_STD;
}

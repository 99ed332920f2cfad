/*
 * mkmodel_int.h — shared by mkmodel.c (the GGUF writer) and mkmodel_tmpl.c
 * (what a chat template asks of the vocabulary; design note 6 in mkmodel.h).
 */
#ifndef KS_MKMODEL_INT_H
#define KS_MKMODEL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ggml.h"

/* The architectures mkmodel writes (design note 7 in mkmodel.h). */
enum mk_arch {
    MK_ARCH_LLAMA, /* "llama": attention in every layer */
    MK_ARCH_LFM2,  /* "lfm2": short-convolution layers and attention layers (hybrid memory) */
    MK_ARCH_GEMMA3, /* "gemma3": sliding-window and global attention layers (iSWA KV cache) */
    MK_ARCH_MAMBA,  /* "mamba": selective state-space layers only (recurrent memory, no KV) */
    MK_ARCH_QWEN3MOE, /* "qwen3moe": attention with q/k norms, routed experts (top-k of n_expert) */
    MK_ARCH_GPTOSS,   /* "gpt-oss": attention with sinks, alternating sliding-window layers,
                       * routed experts with biases (MXFP4) */
    MK_ARCH_QWEN2VL   /* "qwen2vl": llama's layers with q/k/v biases, M-RoPE (4 position
                       * sections a token: rope.dimension_sections) */
};

typedef struct preset {
    const char *name;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    int n_vocab_max;   /* tiny: stop adding words before this; bench: pad to it */
    bool rich_vocab;   /* capitalised and unprefixed word variants */
    bool pad_vocab;    /* fill up to n_vocab_max with synthetic "▁w<id>" pieces */
    float eog_scale;   /* the end-of-turn token's output scale, 0: SCALE_IM_END (design note 4) */
    bool agent_vocab;  /* add the words and punctuation runs of coding agents' prompts
                        * (mkmodel_agent_vocab.c): a real tokenizer's density on them */
    enum ggml_type wtype;
    uint32_t ftype;    /* general.file_type (llama_ftype: 1 mostly F16, 7 mostly Q8_0) */
    enum ggml_type etype; /* token_embd and output, when not wtype (0: wtype) */
    bool random_blocks;   /* Q4_K block weights written as random quantized blocks, not
                           * quantized from floats (mkmodel.h note 8): an 8B model in seconds */
    /* Beyond `llama` (zero for it): */
    enum mk_arch arch;
    int attn_period;   /* lfm2: layer il is attention when il % attn_period == attn_period - 1,
                        * the others short convolutions */
    int conv_l_cache;  /* lfm2: taps of the short convolution (lfm2.shortconv.l_cache) */
    int n_swa;         /* gemma3: sliding window in tokens (attention.sliding_window) */
    int swa_pattern;   /* gemma3: layer il is global when il % swa_pattern == swa_pattern - 1,
                        * the others sliding-window (attention.sliding_window_pattern) */
    int ssm_d_state, ssm_d_conv, ssm_dt_rank; /* mamba: state size, conv taps, dt rank (inner size
                                               * is 2 n_embd, the only one llama.cpp loads) */
    int head_dim;      /* attention.key_length and value_length when not n_embd / n_head
                        * (qwen3moe, gpt-oss); 0: n_embd / n_head, no key written */
    int n_expert, n_expert_used, n_ff_exp; /* mixture of experts: experts per layer, experts
                                            * routed to per token, each expert's hidden size */
    enum ggml_type xtype; /* the experts' weights (gpt-oss: MXFP4); 0 (F32, never meant): wtype */
    /* Draft/target pairs (speculative decoding): the residual gain as for a
     * model of gain_layers layers (0: n_layer), so that a target's first
     * layers are its draft's, tensor for tensor (the same names, the same
     * seeds); layers from perturb_from on (0: none) write into the residual
     * stream with that gain times perturb: a small seeded perturbation of the
     * draft, whose size sets how often the two agree. */
    int gain_layers;
    int perturb_from;
    float perturb;
} preset;

/* The preset named name (mkmodel_presets.c), or NULL. */
const preset *ks__mkmodel_find_preset(const char *name);
/* What follows from a preset (mkmodel_presets.c): its GGUF architecture name;
 * for lfm2, whether layer il is an attention layer; whether it is a mixture
 * of experts; the gain of its residual projections; the standard deviation
 * of its token embeddings as stored. */
const char *ks__mk_arch_name(const preset *p);
bool ks__mk_lfm2_is_attn(const preset *p, int il);
bool ks__mk_is_moe(const preset *p);
float ks__mk_resid_gain(const preset *p);
float ks__mk_embd_std(const preset *p);

/* Output-row scales (design note 4 in mkmodel.h). */
#define SCALE_WORD 1.0f
#define SCALE_PUNCT 0.8f
#define SCALE_PIECE 0.15f
#define SCALE_GLUED_WORD 0.3f  /* unprefixed "word": glues onto the previous word */
#define SCALE_CAP_WORD 0.5f    /* "▁Word": otherwise capitals crowd out lowercase */
#define SCALE_CONTROL 0.05f
#define SCALE_IM_END 1.6f
/* tiny-agent: among ~15,600 tokens the end of turn needs more to win; at 1.6
 * its replies at temperature 0.8 ran to a median of 140 tokens (often 600+),
 * at 2.2 to a median of 44 (at most 177 of 30): an agent's next turn then
 * re-prefills a short reply, as with a real model's shorter ones. */
#define SCALE_IM_END_AGENT 2.2f

#define SPACE_UTF8 "\xe2\x96\x81" /* U+2581 "▁", SentencePiece's space */

/* -------------------------------------------------------------- vocabulary */

typedef struct vocab {
    char **text;
    float *score;
    int32_t *type;
    float *out_scale;
    int n, cap;
    int *slots; /* open-addressing hash of ids (-1: empty), for dedup */
    int n_slots;
} vocab;

/* GGUF token types (tokenizer.ggml.token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_BYTE = 6 };

typedef struct family {
    const char *name;
    const char *marker;
    const char *bos;
    bool add_bos;
    const char *eog;
    const char *extra[8];
} family;

/* What a chat template asks of the vocabulary. */
typedef struct tmpl_info {
    const family *fam;
    const char *eog;  /* static */
    bool add_bos;
    char **tok;       /* owned */
    int32_t *type;
    int n, cap;
    int bos_id, eog_id; /* set by build_vocab */
} tmpl_info;

/* Reads a template's text into *ti: its family, BOS, end-of-turn token and
 * specials. 0, or KS_EINVAL / KS_ENOMEM with a message in err. */
int ks__mkmodel_tmpl_analyse(const char *text, tmpl_info *ti, char *err, size_t errlen);
/* Frees what ks__mkmodel_tmpl_analyse allocated; zeroes *ti. */
void ks__mkmodel_tmpl_free(tmpl_info *ti);

/* mkmodel_agent_vocab.c (generated): NULL-terminated lists. */
extern const char *const ks__mkmodel_agent_words[];
extern const char *const ks__mkmodel_agent_runs[];

/* The vocabulary of a preset (mkmodel_vocab.c), with the template's specials
 * when ti is not NULL (their ids go into ti). 0 or KS_ENOMEM. */
int ks__mkmodel_build_vocab(const preset *p, tmpl_info *ti, bool fim, vocab *v);
/* The id of a token's text, -1 when absent. */
int ks__mkmodel_vocab_find(const vocab *v, const char *text);
void ks__mkmodel_vocab_free(vocab *v);
/* FNV-1a of a string (the vocabulary's hash and the tensors' seeds). */
uint64_t ks__mkmodel_fnv1a64(const char *s);

#endif

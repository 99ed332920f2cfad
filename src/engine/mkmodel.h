/*
 * mkmodel.h — writes random-weight GGUF models of architecture `llama`, and
 * of `lfm2` (hybrid) and `gemma3` (sliding window) for the memories that are
 * not a plain KV cache (note 7), `qwen3moe` and `gpt-oss` for mixtures of
 * experts (note 9).
 *
 * No weights can be downloaded where kvstash is built and tested, so every
 * test, demo and benchmark runs on a model this module makes. It uses ggml's
 * gguf writer only (gguf.h / ggml.h from ggml-base), never llama.h.
 *
 * Design notes
 *  1. Determinism: the file is a pure function of (preset, seed). Each tensor
 *     draws from its own xoshiro256** stream seeded from the seed and the
 *     tensor's name, so the bytes do not depend on the order or chunking of
 *     the generation. Never rand().
 *  2. Atomicity: the model is written to a temporary file in the destination
 *     directory, fsynced, renamed over OUT and the directory fsynced. A killed
 *     or failed run never leaves a partial file under OUT (a stray
 *     "OUT.tmp.XXXXXX" may remain after SIGKILL; a failed run removes it).
 *  3. Vocabulary (SentencePiece-style, tokenizer.ggml.model = "llama"):
 *     <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, <|im_start|> 259,
 *     <|im_end|> 260, then "▁" (space), every printable ASCII character with
 *     and without a leading "▁", then English words as "▁word" together with
 *     every prefix of it (llama.cpp's SPM tokenizer only merges pairs whose
 *     concatenation is itself a token, so a word is reachable only through a
 *     chain of prefixes). The bench preset adds capitalised and unprefixed
 *     variants and pads with synthetic pieces "▁w<id>" to 32000.
 *     BOS = <s>, EOS = <|im_end|> (a reply ends at the end of its turn),
 *     add_bos_token = true, add_space_prefix = false (ChatML), the Qwen2
 *     ChatML Jinja template (note 6: or a real template).
 *  4. Readable greedy output: the rows of output.weight are scaled per token —
 *     whole words 1.0, capitalised words 0.5, unprefixed words 0.3, ".,!?:;"
 *     0.8, partial pieces and single characters 0.15, control, byte and
 *     synthetic tokens 0.05, and <|im_end|> 1.6 so that a reply sometimes ends
 *     (2.2 in tiny-agent, whose large vocabulary would otherwise keep replies
 *     long). This lives in the weights only; nothing changes at run time. How
 *     soon a reply ends depends on the seed (tiny seed 1: about half of the
 *     replies within 64 tokens; some seeds end most replies within a few
 *     tokens).
 *  5. Weights: symmetric "normal-ish" values (sum of two uniforms) with
 *     standard deviation 1/sqrt(fan_in), embeddings 1.0, norms exactly 1.0
 *     (F32). The projections into the residual stream (attn_output, ffn_down)
 *     get a gain of min(1, 1.5/sqrt(n_layer)) so that deep presets do not
 *     collapse onto one repeated word. 2-D weights are F16 (tiny) or Q8_0
 *     (bench, via ggml_quantize_chunk); output.weight is untied.
 *
 *  6. A real chat template (ks_mkmodel_params.chat_template): its text is
 *     written as tokenizer.chat_template and the vocabulary gets the special
 *     tokens it needs, appended after the preset's tokens so that the fixed
 *     ids below hold for every template (<|im_start|> and <|im_end|> stay,
 *     as plain control tokens). Without a template nothing changes: the
 *     presets' files are byte-identical to those of before templates.
 *     - Specials: every "<|name|>" and "[UPPER_NAME]"/"[/UPPER_NAME]" in the
 *       template outside Jinja comments, the tags <tool_call>, </tool_call>,
 *       <tool_response>, </tool_response>, <think>, </think> when present,
 *       and the family's fixed list (below). Markers that appear in the
 *       assistant's own output, where the output parser must read them, are
 *       USER_DEFINED (token type 4: llama_token_to_piece renders them with
 *       special=false, and they tokenize as one token even without
 *       parse_special): the six tags, [TOOL_CALLS], <|python_tag|>, and
 *       gpt-oss's <|start|>, <|message|>, <|channel|>, <|constrain|> (which
 *       llama.cpp forces to USER_DEFINED anyway). All others, the turn
 *       delimiters, are CONTROL (type 3: parse_special only, rendered as "").
 *     - Family, by the first marker found; BOS, add_bos, end of turn (EOS =
 *       EOT = the turn's end, written as tokenizer.ggml.eos_token_id and
 *       tokenizer.ggml.eot_token_id) and fixed specials:
 *         llama3  "<|start_header_id|>"  <|begin_of_text|>, add  <|eot_id|>
 *                 + <|begin_of_text|> <|end_of_text|> <|eom_id|> <|python_tag|>
 *         harmony "<|channel|>" (gpt-oss)  <s>, no add   <|return|>
 *                 + <|start|> <|end|> <|message|> <|channel|> <|constrain|>
 *                   <|call|> <|endoftext|>
 *         mistral "[INST]"               <s>, add      </s>
 *         chatml  "<|im_start|>"         <s>, no add   <|im_end|>
 *                 + <|endoftext|>
 *         other                          <s>, no add   the first of <|im_end|>
 *                 <|eot_id|> <|return|> <|end|> <end_of_turn> <|endoftext|>
 *                 the template contains, else </s>
 *       A template that writes bos_token itself (Hermes 3) gets add_bos too.
 *       llama.cpp also marks tokens end-of-generation by their text
 *       (<|eom_id|>, <|call|>, </s>, <|endoftext|>, ...), and for gpt-oss
 *       takes <|end|> out of that set again.
 *     - The end-of-turn token gets the output scale of note 4 (1.6);
 *       <|im_end|> then gets 0.05 unless it is the end of turn.
 *
 *  7. Architectures beyond `llama` (the tensors' names and shapes are read from
 *     the pinned llama.cpp's src/models/lfm2.cpp and gemma3.cpp; why these two:
 *     docs/LLAMA_FACTS.md, "Hybrid, recurrent and sliding-window models"). The
 *     vocabulary, template, output scales and generator are those of `llama`.
 *     - tiny-hybrid, tiny-hybrid-h64 (heads of 64), bench-hybrid: `lfm2` (Liquid's LFM2), llama.cpp's hybrid
 *       memory: layer il is attention when il % attn_period == attn_period - 1
 *       (tiny: 1 and 3 of 4; bench: 8 of 24, LFM2's own ratio), the others
 *       gated short convolutions whose last conv_l_cache - 1 inputs are the
 *       recurrent state. Keys: lfm2.attention.head_count_kv is a per-layer
 *       array, 0 marking a convolution layer; lfm2.shortconv.l_cache (3).
 *       Tensors: token_embd, token_embd_norm (lfm2's final norm has that
 *       name), output; per layer attn_norm, then either attn_q/k/v/output and
 *       attn_q_norm/attn_k_norm {head_dim}, or shortconv.conv {l_cache, E}
 *       (F32), shortconv.in_proj {E, 3E}, shortconv.out_proj {E, E}; then
 *       ffn_norm, ffn_gate/up/down.
 *     - tiny-swa: `gemma3` with gemma3.attention.sliding_window 32 and
 *       sliding_window_pattern 2: layers 0 and 2 attend to the last 32
 *       positions, 1 and 3 to all (llama.cpp's iSWA KV cache). Tensors as
 *       `llama` plus attn_q_norm/attn_k_norm {head_dim} and the norms of the
 *       blocks' outputs post_attention_norm, post_ffw_norm (weights 0.2, see
 *       POST_NORM_GAIN in mkmodel.c); embeddings stored at 1/sqrt(n_embd) of
 *       `llama`'s, since gemma scales them up by sqrt(n_embd).
 *     - tiny-mamba: `mamba` (src/models/mamba.cpp), llama.cpp's recurrent
 *       memory alone: per layer attn_norm, ssm_in {E, 2 Di}, ssm_conv1d
 *       {d_conv, Di} and its bias, ssm_x {Di, R + 2 S}, ssm_dt {R, Di} and
 *       its bias, ssm_a {S, Di} (negative, so the state decays: -(1 + j/4)
 *       for state j, a little noise), ssm_d {Di} (ones), ssm_out {Di, E}; no
 *       feed-forward. Di = 2E (the only expansion llama.cpp loads), S 16,
 *       d_conv 4, R 4. Keys mamba.ssm.{conv_kernel, inner_size, state_size,
 *       time_step_rank}.
 *  8. bench-8b-q4k: an 8B shape for GPU benchmarks (4.3 GB), made in seconds
 *     on the GPU machine rather than carried there. Quantizing 7 billion
 *     floats to Q4_K would take minutes, so its block weights are written as
 *     random Q4_K blocks (every scale and min 32, random 4-bit values,
 *     d and dmin chosen for mean 0 and the standard deviation of note 5):
 *     the same bytes per value and the same kernels as a real Q4_K model,
 *     uniform rather than bell-shaped values. token_embd and output are
 *     Q8_0 (a Q4_K_M file has Q6_K there), generated as in note 5 so that
 *     greedy output stays readable.
 *
 *  9. Mixtures of experts (src/models/qwen3moe.cpp and openai-moe.cpp of the
 *     pinned llama.cpp; docs/LLAMA_FACTS.md "Mixture-of-experts models"). Each
 *     layer's feed-forward block is n_expert experts, of which a router
 *     (ffn_gate_inp {E, n_expert}, F32 as converters leave it) picks
 *     n_expert_used per token; their weights are 3-D tensors {in, out,
 *     n_expert} multiplied through GGML_OP_MUL_MAT_ID. Keys
 *     ARCH.expert_count, expert_used_count, expert_feed_forward_length, and
 *     attention.key_length / value_length (the head dimension, which is not
 *     n_embd / n_head in either family).
 *     - tiny-moe, tiny-moe-q4k, bench-moe, bench-moe-q4k: `qwen3moe`
 *       (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-VL-30B-A3B): per layer
 *       attn_norm, attn_q/k/v/output, attn_q_norm/attn_k_norm {head_dim},
 *       ffn_norm, ffn_gate_inp, ffn_gate_exps/ffn_up_exps {E, n_ff_exp,
 *       n_expert}, ffn_down_exps {n_ff_exp, E, n_expert}. Softmax over the
 *       router's logits, top k, the k weights renormalised. rope.freq_base 1e6.
 *       bench-moe-q4k's block weights are random Q4_K blocks (note 8): its
 *       2.4 billion expert values would take minutes to quantize here.
 *     - tiny-gptoss: `gpt-oss` (gpt-oss-20b/120b): per layer attn_norm,
 *       attn_q/k/v/output with biases, attn_sinks {n_head} (one logit per
 *       head that takes a share of the softmax, F32, standard deviation 1),
 *       post_attention_norm (the norm before the experts), ffn_gate_inp with
 *       a bias, the three expert tensors in MXFP4 with biases {n_ff_exp or E,
 *       n_expert} (all biases F32, standard deviation 0.02); the router's top
 *       k logits go through a softmax (SOFTMAX_WEIGHT) and the experts
 *       through gpt-oss's clamped SwiGLU. attention.sliding_window 32 in the
 *       even layers (llama.cpp's default pattern for the arch), YaRN rope
 *       (factor 32 over 4096 trained tokens, base 150000), rms epsilon 1e-5.
 *       Its real template, openai-gpt-oss-120b.jinja (note 6, harmony
 *       family), is given with --chat-template; the preset alone has ChatML.
 *
 * 10. Vision projectors (mkmodel_mmproj.c, `--mmproj FILE`): a random-weight
 *     mmproj GGUF that llama.cpp's mtmd loads beside a preset's text model
 *     (engine/media.h): LLaVA's, a CLIP ViT with clip.cpp's simplest
 *     projector ("mlp": mm.0 -> GELU -> mm.2) into the text model's n_embd.
 *     Text presets of n_embd <= 256 get a tiny one (64x64 images, 8x8
 *     patches: 64 tokens an image; ViT of 2 blocks of 32, ~70 KiB), the
 *     others a bench one (224x224, 16x16 patches: 196 tokens; ViT-S-sized, 6
 *     blocks of 384, 6 heads, ffn 1536; ~24 MiB). F16 matrices, F32 biases
 *     (zero), norms (one) and position embeddings. A pure function of (preset,
 *     seed), written atomically like the model. With audio (`--mmproj-audio`)
 *     the file also has an audio encoder (clip.{vision,audio}.projector_type):
 *     Ultravox's, a Whisper encoder (80 mel bins, 2 blocks of 32, ~360 KiB)
 *     with frames stacked by 12 and an RMS-normed SwiGLU projector: 125 tokens
 *     per 30 s chunk of audio (mkmodel_mmproj.c). For a gemma3 text preset
 *     (tiny-swa) the projector is Gemma 3's instead (clip.cpp "gemma3": the
 *     ViT's patches average-pooled 2x2, RMS-normed, projected by
 *     mm.input_projection): tiny 80x80 images in 4x4 patches, 100 tokens
 *     an image, which mtmd decodes with non-causal attention (engine/media.h
 *     note 2a). For a qwen2vl text preset (tiny-mrope) it is Qwen2-VL's
 *     (clip.cpp "qwen2vl_merger": two patch convolutions summed, 2-D M-RoPE
 *     in a ViT of one block, each 2x2 patch group merged by mm.0 -> GELU ->
 *     mm.2): images keep their aspect (sides rounded to 28, at least 8
 *     tokens), an image of nx x ny tokens takes max(nx, ny) KV positions
 *     (engine/media.h note 2).
 * 11. Draft/target pairs for speculative decoding (tiny-draft/tiny-target,
 *     bench-draft/bench-target): a draft model of few layers, and a target
 *     of the same shape and vocabulary whose first layers are the draft's
 *     tensor for tensor (per-tensor seeds by name; the residual gain of the
 *     draft's layer count, preset.gain_layers) followed by layers whose
 *     residual projections are scaled by preset.perturb: the target's logits
 *     are the draft's, perturbed a little, so a drafted token is kept on most
 *     steps; the perturbation sets how often (docs/BENCHMARKS.md, "Draft
 *     models"). Random drafts for random targets would never agree.
 *
 * Thread model: ks_mkmodel and ks_mkmodel_shape_of are reentrant (no global
 * state of their own); ggml's quantizer is thread-safe.
 */
#ifndef KS_MKMODEL_H
#define KS_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Fixed token ids of every generated model (note 3). */
#define KS_MKMODEL_TOK_UNK 0
#define KS_MKMODEL_TOK_BOS 1
#define KS_MKMODEL_TOK_S_END 2       /* </s>: llama.cpp also treats it as end-of-generation */
#define KS_MKMODEL_TOK_BYTE0 3       /* <0x00>; byte b is KS_MKMODEL_TOK_BYTE0 + b */
#define KS_MKMODEL_TOK_IM_START 259
#define KS_MKMODEL_TOK_IM_END 260    /* also tokenizer.ggml.eos_token_id */
#define KS_MKMODEL_TOK_SPACE 261     /* "▁" */

/* The shape of a preset. */
typedef struct ks_mkmodel_shape {
    const char *preset;     /* borrowed, static */
    int n_vocab;
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int n_ff;
    int n_ctx_train;
    int wtype;              /* ggml_type of the 2-D weights (norms are F32) */
    const char *wtype_name; /* "f16", "q8_0" — borrowed, static */
    uint64_t n_params;      /* all tensor elements */
    const char *arch;       /* general.architecture: "llama", "qwen3moe", ... — borrowed, static */
    int n_expert;           /* experts per layer (0: a dense feed-forward block) */
    int n_expert_used;      /* experts each token is routed to */
    /* The chat template's needs (note 6); all strings borrowed, static. */
    const char *tmpl_family; /* "chatml" (the preset's own), "llama3", "harmony", ... */
    int n_tmpl_specials;     /* specials the template asked for (0: the preset's own) */
    const char *bos;         /* text of the BOS token, "<s>" ... */
    const char *eog;         /* text of the end-of-turn token (EOS and EOT) */
    bool add_bos;
} ks_mkmodel_shape;

/* Longest chat template accepted, in bytes. */
#define KS_MKMODEL_TMPL_MAX (1024 * 1024)

/* What to make. Filled by ks_mkmodel_params_default(): tiny, seed 1, no template. */
typedef struct ks_mkmodel_params {
    const char *preset;        /* one of ks_mkmodel_presets() */
    uint64_t seed;
    const char *chat_template; /* Jinja text (borrowed for the call); NULL: the preset's ChatML */
    int n_ctx_train;           /* the trained context written to the file, KS_MKMODEL_CTX_MIN..MAX;
                                  0: the preset's */
    bool fim;                  /* also the fill-in-the-middle specials of Qwen2.5-Coder
                                  (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>, <|fim_pad|>,
                                  <|repo_name|>, <|file_sep|>), control tokens after all others:
                                  llama.cpp finds them by their text (the server's /infill) */
} ks_mkmodel_params;

/* The range of ks_mkmodel_params.n_ctx_train (as the server's --ctx). */
#define KS_MKMODEL_CTX_MIN 64
#define KS_MKMODEL_CTX_MAX 16777216

ks_mkmodel_params ks_mkmodel_params_default(void);

/* Names of the presets, "tiny|bench|..." — static. */
const char *ks_mkmodel_presets(void);

/* Fills *out with the shape of preset (builds the vocabulary to count it).
 * Returns 0, KS_EINVAL for an unknown preset or NULL arguments, KS_ENOMEM. */
int ks_mkmodel_shape_of(const char *preset, ks_mkmodel_shape *out);

/* Writes the random-weight model `preset` (one of ks_mkmodel_presets()) made from
 * `seed` to out_path, atomically (note 2). Missing parent directories are
 * created. An existing file at out_path is replaced.
 * Returns 0 or: KS_EINVAL (unknown preset, empty path), KS_ENOMEM,
 * KS_ENOSPC (disk full), KS_ENOENT (a parent directory cannot be reached),
 * KS_EIO (any other I/O error). On failure a message is written to err
 * (may be NULL) and nothing is left under out_path. */
int ks_mkmodel(const char *preset, uint64_t seed, const char *out_path, char *err, size_t errlen);

/* The same with a chat template (note 6): ks_mkmodel is ks_mkmodel_write of
 * {preset, seed, NULL}. shape (may be NULL) receives the shape of the model
 * written, its vocabulary size and template fields included.
 * Errors as ks_mkmodel, and KS_EINVAL for a template that is empty, longer
 * than KS_MKMODEL_TMPL_MAX, not valid UTF-8 or with more than 1024 special
 * tokens (the message in err says which); then nothing is written. */
int ks_mkmodel_write(const ks_mkmodel_params *p, const char *out_path, ks_mkmodel_shape *shape,
                     char *err, size_t errlen);

/* What ks_mkmodel_mmproj wrote (note 10). */
typedef struct ks_mkmodel_mmproj_shape {
    int image_size, patch_size; /* images are resized to image_size^2 */
    int n_embd, n_layer;        /* the ViT's */
    int n_tokens;               /* KV tokens per image: (image_size / patch_size)^2, pooled for Gemma 3 */
    bool gemma3;                /* Gemma 3's projector (non-causal image tokens), else LLaVA's */
    bool qwen2vl;               /* Qwen2-VL's (M-RoPE image tokens; n_tokens: an image_size^2 image's) */
    int n_embd_text;            /* the text model's embedding size it projects to */
    bool audio;                 /* an audio encoder too (note 10) */
} ks_mkmodel_mmproj_shape;

/* Writes the random-weight vision projector for text preset `preset` made
 * from seed to out_path, atomically (note 10), with an audio encoder too when
 * audio. shape (may be NULL) gets its shape. Errors as ks_mkmodel's. */
int ks_mkmodel_mmproj(const char *preset, uint64_t seed, bool audio, const char *out_path,
                      ks_mkmodel_mmproj_shape *shape, char *err, size_t errlen);

#endif

/*
 * cmd_mkmodel.c — `kvstash mkmodel --preset NAME [--seed N]
 * [--chat-template FILE] [--ctx-train N] [--mmproj FILE] OUT.gguf`.
 *
 * Writes a random-weight GGUF model (engine/mkmodel.h). Exit codes:
 * 0 written, 1 I/O or memory error (also: the template file cannot be
 * opened or read), 2 usage error (unknown option or preset, missing or extra
 * OUT, bad seed, a template file that is empty, larger than 1 MiB, not UTF-8
 * text or holds a NUL byte). The template is read and checked before
 * anything is written: a bad one leaves no file behind.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "cli/cli.h"
#include "engine/mkmodel.h"

static void mkmodel_usage(FILE *f) {
    fprintf(f,
            "usage: kvstash mkmodel --preset NAME [--seed N] [--chat-template FILE] [--ctx-train N]\n"
            "                       [--mmproj FILE] OUT.gguf\n"
            "\n"
            "Writes a random-weight GGUF model (architecture `llama`, or `lfm2`,\n"
            "`gemma3`, `mamba`, `qwen3moe`, `gpt-oss`, `qwen2vl` for the presets that say so) with a ChatML\n"
            "template, for tests, demos and benchmarks. The file is a pure function of\n"
            "the preset, the seed and the template, and is written atomically (temp\n"
            "file + rename).\n"
            "\n"
            "  --preset NAME   tiny:  2 layers, n_embd 64, 4 heads (2 KV), ffn 128,\n"
            "                         ~1000 tokens, F16, context 8192 (< 1 MiB)\n"
            "                  bench: 24 layers, n_embd 896, 14 heads (2 KV), ffn 4864,\n"
            "                         32000 tokens, Q8_0, context 32768 (~421 MiB)\n"
            "                  bench-q4k: bench in Q4_K_M with n_embd 1024, 16 heads\n"
            "                  bench-8b-q4k: an 8B shape (n_embd 4096, 32 layers, 32 heads\n"
            "                         (8 KV), ffn 14336) in Q4_K, for GPU benchmarks: random\n"
            "                         Q4_K blocks written directly, made in seconds (~4.3 GB)\n"
            "                  tiny-q4k: tiny in Q4_K_M with n_embd 256, ffn 512 (< 1 MiB)\n"
            "                  tiny-hybrid:  `lfm2`, the tiny shape in 4 layers: short\n"
            "                         convolutions in 0 and 2, attention in 1 and 3\n"
            "                  tiny-hybrid-h64: tiny-hybrid with n_embd 128, 2 heads of 64\n"
            "                         (quantized KV caches need heads of 32k)\n"
            "                  bench-hybrid: `lfm2` at the bench shape: 16 convolution\n"
            "                         and 8 attention layers (~444 MiB)\n"
            "                  tiny-swa:  `gemma3`, the tiny shape in 4 layers: a 32-token\n"
            "                         sliding window in 0 and 2, global attention in 1 and 3\n"
            "                  tiny-mamba: `mamba`, 2 state-space layers of 64 (a recurrent\n"
            "                         memory: no KV cache at all)\n"
            "                  tiny-agent: the tiny shape with a ~15600-token vocabulary of\n"
            "                         coding agents' words (about 4 bytes a token on their\n"
            "                         prompts) and context 131072 (~5 MiB)\n"
            "                  tiny-moe: `qwen3moe`, a mixture of experts: 2 layers, n_embd 128,\n"
            "                         head dim 64, 16 experts of 64, 4 per token, Q8_0 (~1.4 MiB)\n"
            "                  tiny-moe-q4k: the same in Q4_K with n_embd 256, experts of 256\n"
            "                  tiny-moe-iq4xs: tiny-moe-q4k in IQ4_XS (a type whose kernels are\n"
            "                         not batch-invariant: exact mode is unavailable on it)\n"
            "                  bench-moe: Qwen3-30B-A3B's ratios at half its width and layers:\n"
            "                         24 layers, n_embd 1024, 16 heads (4 KV) of 128, 64 experts\n"
            "                         of 512, 8 per token, 32000 tokens, Q8_0 (2.6 B parameters,\n"
            "                         0.5 B per token; ~2.8 GiB)\n"
            "                  bench-moe-q4k: bench-moe in Q4_K (~1.4 GiB; minutes to write)\n"
            "                  tiny-gptoss: `gpt-oss`: 4 layers, n_embd 128, 4 heads (2 KV) of 64\n"
            "                         with attention sinks, a 32-token sliding window in layers 0\n"
            "                         and 2, 8 MXFP4 experts of 128, 2 per token, YaRN; give it\n"
            "                         --chat-template openai-gpt-oss-120b.jinja\n"
            "                  tiny-mrope: `qwen2vl`, the tiny shape with q/k/v biases and\n"
            "                         M-RoPE (4 position sections a token)\n"
            "                  tiny-target, tiny-draft; bench-target, bench-draft: pairs for\n"
            "                         speculative decoding (-md): the draft is its target's first\n"
            "                         layers (2 of 4; 4 of 24, the bench shape), the target's\n"
            "                         others perturb them a little (0.1; 0.05), so the draft\n"
            "                         agrees on most greedy tokens (kept: 60-65%%; 59-68%%)\n"
            "  --seed N        weights seed, an unsigned 64-bit integer (default 1)\n"
            "  --chat-template FILE\n"
            "                  a Jinja chat template (UTF-8, at most 1 MiB) to write\n"
            "                  instead of ChatML; the vocabulary gets its special\n"
            "                  tokens, BOS and end-of-turn token (Llama 3, Mistral,\n"
            "                  gpt-oss, ChatML families)\n"
            "  --ctx-train N   the trained context written to the model (64..16777216;\n"
            "                  default: the preset's), the most a server gives a slot\n"
            "  --mmproj FILE   also write a random-weight vision projector for the model\n"
            "                  (LLaVA's MLP over a CLIP ViT, for kvstash serve --mmproj):\n"
            "                  n_embd <= 256: 64x64 images, 64 tokens each (~70 KiB);\n"
            "                  larger: 224x224 images, 196 tokens, a ViT-S-sized encoder;\n"
            "                  for a gemma3 preset (tiny-swa) Gemma 3's projector instead\n"
            "                  (pooled patches, non-causal image tokens): 100 tokens each;\n"
            "                  for a qwen2vl preset (tiny-mrope) Qwen2-VL's merger (M-RoPE:\n"
            "                  a 112x112 image is 16 tokens over 4 KV positions)\n"
            "  --mmproj-audio  the projector also takes audio: Ultravox's Whisper encoder,\n"
            "                  125 tokens per 30 s of audio (~360 KiB more)\n"
            "  --fim           also the fill-in-the-middle specials of Qwen2.5-Coder\n"
            "                  (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>, <|fim_pad|>,\n"
            "                  <|repo_name|>, <|file_sep|>), for kvstash serve's /infill\n"
            "  -h, --help      this help\n");
}

static int parse_seed(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || !end || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}


int ks_cmd_mkmodel(int argc, char **argv) {
    const char *preset = NULL;
    const char *out = NULL;
    const char *tmpl_path = NULL;
    uint64_t seed = 1;
    int ctx_train = 0;
    const char *mmproj = NULL;
    bool mmproj_audio = false;
    bool fim = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            mkmodel_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--preset") || !strncmp(a, "--preset=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) {
                fprintf(stderr, "kvstash mkmodel: --preset needs a value (%s)\n", ks_mkmodel_presets());
                return 2;
            }
            preset = v;
        } else if (!strcmp(a, "--seed") || !strncmp(a, "--seed=", 7)) {
            const char *v = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : NULL);
            if (parse_seed(v, &seed) != 0) {
                fprintf(stderr, "kvstash mkmodel: --seed needs an unsigned integer (got '%s')\n",
                        v ? v : "");
                return 2;
            }
        } else if (!strcmp(a, "--chat-template") || !strncmp(a, "--chat-template=", 16)) {
            const char *v = a[15] == '=' ? a + 16 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !*v) {
                fprintf(stderr, "kvstash mkmodel: --chat-template needs a file\n");
                return 2;
            }
            tmpl_path = v;
        } else if (!strcmp(a, "--ctx-train") || !strncmp(a, "--ctx-train=", 12)) {
            const char *v = a[11] == '=' ? a + 12 : (i + 1 < argc ? argv[++i] : NULL);
            if (ks_cli_parse_int("kvstash mkmodel", "--ctx-train", v, KS_MKMODEL_CTX_MIN, KS_MKMODEL_CTX_MAX,
                                 &ctx_train))
                return 2;
        } else if (!strcmp(a, "--mmproj") || !strncmp(a, "--mmproj=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !*v) {
                fprintf(stderr, "kvstash mkmodel: --mmproj needs a file\n");
                return 2;
            }
            mmproj = v;
        } else if (!strcmp(a, "--mmproj-audio")) {
            mmproj_audio = true;
        } else if (!strcmp(a, "--fim")) {
            fim = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "kvstash mkmodel: unknown option '%s'\n", a);
            mkmodel_usage(stderr);
            return 2;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "kvstash mkmodel: more than one output file ('%s', '%s')\n", out, a);
            return 2;
        }
    }
    if (!preset) {
        fprintf(stderr, "kvstash mkmodel: --preset is required (%s)\n", ks_mkmodel_presets());
        mkmodel_usage(stderr);
        return 2;
    }
    ks_mkmodel_shape shape;
    int rc = ks_mkmodel_shape_of(preset, &shape);
    if (rc == KS_EINVAL) {
        fprintf(stderr, "kvstash mkmodel: unknown preset '%s' (known: %s)\n", preset, ks_mkmodel_presets());
        return 2;
    }
    if (rc) {
        fprintf(stderr, "kvstash mkmodel: %s\n", ks_strerror(rc));
        return 1;
    }
    if (!out || !out[0]) {
        fprintf(stderr, "kvstash mkmodel: missing output file OUT.gguf\n");
        mkmodel_usage(stderr);
        return 2;
    }

    if (mmproj_audio && !mmproj) {
        fprintf(stderr, "kvstash mkmodel: --mmproj-audio needs --mmproj FILE\n");
        return 2;
    }
    char *tmpl = NULL;
    if (tmpl_path && (rc = ks_cli_read_template("kvstash mkmodel", tmpl_path, &tmpl)) != 0) return rc;

    ks_mkmodel_params mp = ks_mkmodel_params_default();
    mp.preset = preset;
    mp.seed = seed;
    mp.chat_template = tmpl;
    mp.n_ctx_train = ctx_train;
    mp.fim = fim;
    char err[512] = "";
    double t0 = ks_now_ms();
    rc = ks_mkmodel_write(&mp, out, &shape, err, sizeof err);
    double secs = (ks_now_ms() - t0) / 1e3;
    free(tmpl);
    if (rc) {
        if (tmpl_path && rc == KS_EINVAL)
            fprintf(stderr, "kvstash mkmodel: --chat-template '%s': %s\n", tmpl_path, err);
        else
            fprintf(stderr, "kvstash mkmodel: %s\n", err[0] ? err : ks_strerror(rc));
        return rc == KS_EINVAL ? 2 : 1;
    }
    struct stat st;
    long long bytes = stat(out, &st) == 0 ? (long long)st.st_size : -1;
    fprintf(stderr,
            "kvstash mkmodel: %s seed %" PRIu64 ": %" PRIu64 " params (%d layers, n_embd %d, vocab %d, %s), "
            "%lld bytes, %.3f s -> %s\n",
            shape.preset, seed, shape.n_params, shape.n_layer, shape.n_embd, shape.n_vocab, shape.wtype_name,
            bytes, secs, out);
    if (tmpl_path)
        fprintf(stderr,
                "kvstash mkmodel: chat template %s (%s family): %d special tokens, BOS %s%s, end of turn %s\n",
                tmpl_path, shape.tmpl_family, shape.n_tmpl_specials, shape.bos,
                shape.add_bos ? " (added)" : " (not added)", shape.eog);
    if (mmproj) {
        ks_mkmodel_mmproj_shape ms;
        t0 = ks_now_ms();
        rc = ks_mkmodel_mmproj(preset, seed, mmproj_audio, mmproj, &ms, err, sizeof err);
        if (rc) {
            fprintf(stderr, "kvstash mkmodel: --mmproj '%s': %s\n", mmproj, err[0] ? err : ks_strerror(rc));
            return rc == KS_EINVAL ? 2 : 1;
        }
        bytes = stat(mmproj, &st) == 0 ? (long long)st.st_size : -1;
        fprintf(stderr,
                "kvstash mkmodel: projector %s (ViT %d layers, n_embd %d, %dx%d images, %d tokens each -> n_embd "
                "%d)%s, %lld bytes, %.3f s -> %s\n",
                ms.qwen2vl ? "qwen2vl_merger" : ms.gemma3 ? "gemma3" : "mlp", ms.n_layer, ms.n_embd, ms.image_size, ms.image_size, ms.n_tokens,
                ms.n_embd_text,
                ms.audio ? " + audio ultravox (125 tokens per 30 s)" : "", bytes,
                (ks_now_ms() - t0) / 1e3, mmproj);
    }
    return 0;
}

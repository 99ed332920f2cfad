/*
 * Model tests for engine/mkmodel: the random-weight GGUF writer and the
 * `kvstash mkmodel` command.
 *
 * Env: KS_TINY_MODEL — the tiny model written by the CTest fixture
 * (`kvstash mkmodel --preset tiny --seed 1`); KS_BIN — the kvstash binary.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/engine.h"
#include "engine/mkmodel.h"
#include "model/mkmodel_util.h"

static char g_dir[256]; /* per-run scratch directory */

static const char *tiny_model(void) {
    const char *p = getenv("KS_TINY_MODEL");
    if (!p || !*p) fail_msg("KS_TINY_MODEL is not set (run through ctest, or set it)");
    return p;
}

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static int setup(void **st) {
    (void)st;
    snprintf(g_dir, sizeof g_dir, "/tmp/ks_test_mkmodel.XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *de;
        char p[512];
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(g_dir);
    return 0;
}

/* ------------------------------------------------------------------ files */
static void test_deterministic(void **st) {
    (void)st;
    char a[512], b[512], c[512], one[512];
    path_in(a, sizeof a, "a.gguf");
    path_in(b, sizeof b, "b.gguf");
    path_in(c, sizeof c, "c.gguf");
    path_in(one, sizeof one, "one.gguf");
    char err[256] = "";
    assert_int_equal(ks_mkmodel("tiny", 7, a, err, sizeof err), 0);
    assert_int_equal(ks_mkmodel("tiny", 7, b, err, sizeof err), 0);
    assert_int_equal(ks_mkmodel("tiny", 8, c, err, sizeof err), 0);
    assert_true(mk_same_file(a, b));
    assert_false(mk_same_file(a, c));
    /* The library with seed 1 makes exactly the fixture's file (written by the CLI). */
    assert_int_equal(ks_mkmodel("tiny", 1, one, err, sizeof err), 0);
    assert_true(mk_same_file(one, tiny_model()));
    /* Rewriting over an existing file replaces it. */
    assert_int_equal(ks_mkmodel("tiny", 8, a, err, sizeof err), 0);
    assert_true(mk_same_file(a, c));
}

/* Issue 29: the projector is a pure function of preset and seed, sized to
 * the preset's n_embd (mkmodel.h note 10); a preset it does not know is
 * refused and nothing is written. (test_media loads it through mtmd.) */
static void test_mmproj(void **st) {
    (void)st;
    char a[512], b[512], c[512], d[512];
    path_in(a, sizeof a, "a-mmproj.gguf");
    path_in(b, sizeof b, "b-mmproj.gguf");
    path_in(c, sizeof c, "c-mmproj.gguf");
    path_in(d, sizeof d, "d-mmproj.gguf");
    char err[256] = "";
    ks_mkmodel_mmproj_shape ms;
    assert_int_equal(ks_mkmodel_mmproj("tiny", 7, false, a, &ms, err, sizeof err), 0);
    assert_int_equal(ms.n_tokens, 64);
    assert_int_equal(ms.n_embd_text, 64);
    assert_false(ms.gemma3);
    /* A gemma3 preset gets Gemma 3's projector: 80x80, 4x4 patches pooled
     * 2x2 (test_media_gemma3 loads it through mtmd). */
    assert_int_equal(ks_mkmodel_mmproj("tiny-swa", 7, false, b, &ms, err, sizeof err), 0);
    assert_true(ms.gemma3);
    assert_int_equal(ms.n_tokens, 100);
    assert_int_equal(ms.image_size, 80);
    assert_int_equal(ms.n_embd_text, 64);
    /* A qwen2vl preset gets Qwen2-VL's (M-RoPE): a 112x112 image in 14x14
     * patches merged 2x2, 16 tokens (test_media_mrope loads it). */
    assert_int_equal(ks_mkmodel_mmproj("tiny-mrope", 7, false, b, &ms, err, sizeof err), 0);
    assert_true(ms.qwen2vl);
    assert_false(ms.gemma3);
    assert_int_equal(ms.n_tokens, 16);
    assert_int_equal(ms.image_size, 112);
    assert_int_equal(ks_mkmodel_mmproj("tiny", 7, false, b, NULL, err, sizeof err), 0);
    assert_int_equal(ks_mkmodel_mmproj("tiny", 8, false, c, NULL, err, sizeof err), 0);
    assert_true(mk_same_file(a, b));
    assert_false(mk_same_file(a, c));
    assert_int_equal(ks_mkmodel_mmproj("tiny-q4k", 7, true, c, &ms, err, sizeof err), 0);
    assert_int_equal(ms.n_embd_text, 256);
    assert_true(ms.audio);
    assert_int_equal(ks_mkmodel_mmproj("no-such", 7, false, d, NULL, err, sizeof err), KS_EINVAL);
    assert_int_equal(access(d, F_OK), -1);
}

static void test_tiny_size_and_shape(void **st) {
    (void)st;
    struct stat sb;
    assert_int_equal(stat(tiny_model(), &sb), 0);
    assert_true(sb.st_size > 0);
    assert_true(sb.st_size <= 1024 * 1024);

    ks_mkmodel_shape s;
    assert_int_equal(ks_mkmodel_shape_of("tiny", &s), 0);
    assert_int_equal(s.n_embd, 64);
    assert_int_equal(s.n_layer, 2);
    assert_true(s.n_vocab >= 600 && s.n_vocab <= 1000);
    assert_int_equal(ks_mkmodel_shape_of("bench", &s), 0);
    assert_int_equal(s.n_vocab, 32000);
    assert_int_equal(s.n_layer, 24);
    /* the 8B shape of the GPU benchmarks (issue 26): Llama 3 8B's layers */
    assert_int_equal(ks_mkmodel_shape_of("bench-8b-q4k", &s), 0);
    assert_int_equal(s.n_layer, 32);
    assert_int_equal(s.n_embd, 4096);
    assert_int_equal(s.n_head_kv, 8);
    assert_true(s.n_params > 7000000000ULL && s.n_params < 7500000000ULL);
    assert_string_equal(s.wtype_name, "q4_K");
    assert_int_equal(ks_mkmodel_shape_of("huge", &s), KS_EINVAL);
}

static void test_bad_arguments(void **st) {
    (void)st;
    char p[512], err[256] = "";
    path_in(p, sizeof p, "x.gguf");
    assert_int_equal(ks_mkmodel("nope", 1, p, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "nope"));
    assert_int_equal(ks_mkmodel("tiny", 1, "", err, sizeof err), KS_EINVAL);
    assert_int_equal(access(p, F_OK), -1);
}

static void test_unwritable_path(void **st) {
    (void)st;
    /* Tests run as root too, so permissions prove nothing: use a path whose
     * parent is a regular file, and one under /proc. */
    char file[512], bad[600], err[256] = "";
    path_in(file, sizeof file, "plainfile");
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(bad, sizeof bad, "%s/model.gguf", file);
    int rc = ks_mkmodel("tiny", 1, bad, err, sizeof err);
    assert_true(rc < 0);
    assert_true(err[0] != '\0');
    assert_int_equal(access(bad, F_OK), -1);

    err[0] = '\0';
    rc = ks_mkmodel("tiny", 1, "/proc/kvstash-no-such-dir/model.gguf", err, sizeof err);
    assert_true(rc < 0);
    assert_true(err[0] != '\0');

    /* Nothing but the plain file is left in the scratch directory: no temp file. */
    mk_assert_no_tmp(g_dir);
}

static void test_creates_parent_dirs(void **st) {
    (void)st;
    char p[512], err[256] = "";
    path_in(p, sizeof p, "sub/dir/m.gguf");
    assert_int_equal(ks_mkmodel("tiny", 3, p, err, sizeof err), 0);
    assert_int_equal(access(p, R_OK), 0);
    unlink(p);
    path_in(p, sizeof p, "sub/dir");
    rmdir(p);
    path_in(p, sizeof p, "sub");
    rmdir(p);
}

/* -------------------------------------------------------------------- CLI */
static int run_cli(const char *args) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) fail_msg("KS_BIN is not set");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel %s >/dev/null 2>&1", bin, args);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void test_cli_exit_codes(void **st) {
    (void)st;
    char p[512], args[1024];
    path_in(p, sizeof p, "cli.gguf");
    assert_int_equal(run_cli("--help"), 0);
    snprintf(args, sizeof args, "--preset nope '%s'", p);
    assert_int_equal(run_cli(args), 2);
    assert_int_equal(run_cli("--preset tiny"), 2);
    snprintf(args, sizeof args, "--preset tiny --seed x '%s'", p);
    assert_int_equal(run_cli(args), 2);
    snprintf(args, sizeof args, "--bogus '%s'", p);
    assert_int_equal(run_cli(args), 2);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(run_cli("--preset tiny /proc/kvstash-no-such-dir/m.gguf"), 1);
    snprintf(args, sizeof args, "--preset tiny --seed 1 '%s'", p);
    assert_int_equal(run_cli(args), 0);
    assert_true(mk_same_file(p, tiny_model()));
}

/* ----------------------------------------------------------------- engine */
static ks_engine *open_tiny(void) { return mk_open_engine(tiny_model(), 512); }

static int count_tok(const ks_tokens *t, int32_t id) {
    int n = 0;
    for (int i = 0; i < t->n; i++) n += t->v[i] == id;
    return n;
}

static void test_load_template_tokenize(void **st) {
    (void)st;
    ks_engine *e = open_tiny();
    ks_mkmodel_shape s;
    assert_int_equal(ks_mkmodel_shape_of("tiny", &s), 0);
    assert_int_equal(ks_engine_n_vocab(e), s.n_vocab);

    ks_msg msgs[2] = {{"system", "You are a helpful assistant."}, {"user", "What is the name of the sea?"}};
    char *prompt = NULL;
    assert_int_equal(ks_engine_template(e, msgs, 2, true, &prompt), 0);
    assert_string_equal(prompt, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                "<|im_start|>user\nWhat is the name of the sea?<|im_end|>\n"
                                "<|im_start|>assistant\n");

    ks_tokens t = {0};
    assert_int_equal(ks_engine_tokenize(e, prompt, strlen(prompt), true, true, &t), 0);
    assert_true(t.n > 10);
    assert_int_equal(t.v[0], KS_MKMODEL_TOK_BOS);
    assert_int_equal(count_tok(&t, KS_MKMODEL_TOK_IM_START), 3);
    assert_int_equal(count_tok(&t, KS_MKMODEL_TOK_IM_END), 2);
    /* Specials are single tokens, not "<", "|", ... and no "▁" follows them. */
    assert_int_equal(count_tok(&t, KS_MKMODEL_TOK_BYTE0 + '<'), 0);
    assert_int_equal(count_tok(&t, KS_MKMODEL_TOK_SPACE), 0);
    for (int i = 0; i < t.n; i++) {
        if (t.v[i] != KS_MKMODEL_TOK_IM_START) continue;
        char piece[64];
        assert_true(i + 1 < t.n);
        int n = ks_engine_piece(e, t.v[i + 1], piece, sizeof piece);
        assert_true(n > 0 && piece[0] != ' '); /* "system", not " system" */
    }
    /* Words are single tokens: " the name of the" is 4 tokens. */
    ks_tokens w = {0};
    assert_int_equal(ks_engine_tokenize(e, " the name of the", 16, false, false, &w), 0);
    assert_int_equal(w.n, 4);
    ks_tokens_free(&w);

    assert_true(ks_engine_is_eog(e, KS_MKMODEL_TOK_IM_END));
    assert_false(ks_engine_is_eog(e, KS_MKMODEL_TOK_IM_START));
    assert_false(ks_engine_is_eog(e, t.v[t.n - 2])); /* a piece of "assistant" */

    ks_tokens_free(&t);
    free(prompt);
    ks_engine_free(e);
}

/* tiny-agent (issue 25): a coding agent's prompt tokenizes about as densely
 * as with a real tokenizer (the tiny vocabulary takes ~1.2 bytes a token),
 * and --ctx-train / n_ctx_train is what the file says: the engine gives a
 * slot that much and no more. */
static void test_agent_preset_and_ctx_train(void **st) {
    (void)st;
    char p[512], err[256] = "";
    path_in(p, sizeof p, "agent.gguf");
    ks_mkmodel_params mp = ks_mkmodel_params_default();
    mp.preset = "tiny-agent";
    mp.n_ctx_train = 40960; /* a multiple of 256: llama.cpp pads a context to one */
    ks_mkmodel_shape sh;
    assert_int_equal(ks_mkmodel_write(&mp, p, &sh, err, sizeof err), 0);
    assert_int_equal(sh.n_ctx_train, 40960);
    assert_true(sh.n_vocab > 8000 && sh.n_vocab <= 24000);
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = p;
    ep.n_ctx_seq = 65536;
    ks_engine *e = NULL;
    assert_int_equal(ks_engine_open(&ep, &e, err, sizeof err), 0);
    assert_int_equal(ks_engine_n_ctx_seq(e), 40960); /* capped at the trained context */
    /* A paragraph and a tool schema as the agents send them. */
    static const char text[] =
        "You are an interactive agent that helps users with software engineering tasks. Use the instructions "
        "below and the tools available to you to assist the user.\n\n# Doing tasks\n - When the user asks you to "
        "read a file, use the Read tool instead of running a command.\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"Bash\", \"description\": \"Executes a given bash "
        "command and returns its output.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"command\": "
        "{\"type\": \"string\", \"description\": \"The command to execute\"}}, \"required\": [\"command\"], "
        "\"additionalProperties\": false}}}";
    ks_tokens t = {0};
    assert_int_equal(ks_engine_tokenize(e, text, strlen(text), false, false, &t), 0);
    double bpt = (double)strlen(text) / t.n;
    if (bpt < 3.0) fail_msg("tiny-agent: %.2f bytes a token (%d tokens for %zu bytes), want >= 3", bpt, t.n, strlen(text));
    ks_tokens_free(&t);
    ks_engine_free(e);
    /* Out of range: refused before anything is written. */
    mp.n_ctx_train = 32;
    path_in(p, sizeof p, "agent-bad.gguf");
    assert_int_equal(ks_mkmodel_write(&mp, p, NULL, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "trained context"));
    assert_int_equal(access(p, F_OK), -1);
}

static void test_decode_greedy(void **st) {
    (void)st;
    ks_engine *e = open_tiny();
    ks_msg msgs[2] = {{"system", "You are a helpful assistant."}, {"user", "Tell me a story about the sea."}};
    char *prompt = NULL;
    assert_int_equal(ks_engine_template(e, msgs, 2, true, &prompt), 0);
    ks_tokens t = {0};
    assert_int_equal(ks_engine_tokenize(e, prompt, strlen(prompt), true, true, &t), 0);

    int32_t a[20], b[20];
    int na = mk_generate(e, &t, 20, a);
    assert_true(na >= 1);
    ks_buf text = {0};
    for (int i = 0; i < na; i++) {
        char piece[64];
        int n = ks_engine_piece(e, a[i], piece, sizeof piece);
        if (n > 0 && n < (int)sizeof piece) ks_buf_append(&text, piece, (size_t)n);
    }
    print_message("greedy (%d tokens): %s\n", na, text.s ? text.s : "");

    /* Same prompt again from an empty sequence: the same tokens. */
    ks_engine_seq_clear(e, 0);
    int nb = mk_generate(e, &t, 20, b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof a[0]);

    ks_buf_free(&text);
    ks_tokens_free(&t);
    free(prompt);
    ks_engine_free(e);
}

/* Mixtures of experts (design note 9 of mkmodel.h, issue 31): each tiny
 * preset loads as its architecture with its experts, 3-D expert tensors
 * included (llama.cpp counts every parameter the file says it has), decodes
 * greedily the same twice, and is a pure function of its seed; the bench
 * presets have Qwen3-30B-A3B's ratios. */
static void test_moe_presets(void **st) {
    (void)st;
    static const struct {
        const char *preset, *arch;
        int n_expert, n_used, n_swa;
        const char *key; /* a metadatum llama.cpp reads, as the meta dump shows it */
    } cases[] = {
        {"tiny-moe", "qwen3moe", 16, 4, 0, "qwen3moe.attention.key_length=64\n"},
        {"tiny-moe-q4k", "qwen3moe", 16, 4, 0, "qwen3moe.expert_feed_forward_length=256\n"},
        {"tiny-moe-iq4xs", "qwen3moe", 16, 4, 0, "qwen3moe.expert_used_count=4\n"},
        {"tiny-gptoss", "gpt-oss", 8, 2, 32, "gpt-oss.rope.scaling.type=yarn\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char p[512], q[512], err[256] = "";
        path_in(p, sizeof p, "moe.gguf");
        path_in(q, sizeof q, "moe2.gguf");
        ks_mkmodel_params mp = ks_mkmodel_params_default();
        mp.preset = cases[i].preset;
        ks_mkmodel_shape sh;
        assert_int_equal(ks_mkmodel_write(&mp, p, &sh, err, sizeof err), 0);
        assert_string_equal(sh.arch, cases[i].arch);
        assert_int_equal(sh.n_expert, cases[i].n_expert);
        assert_int_equal(sh.n_expert_used, cases[i].n_used);
        assert_int_equal(ks_mkmodel_write(&mp, q, NULL, err, sizeof err), 0);
        assert_true(mk_same_file(p, q));

        ks_engine *e = mk_open_engine(p, 512);
        assert_int_equal(strncmp(ks_engine_model_desc(e), cases[i].arch, strlen(cases[i].arch)), 0);
        int used = 0;
        assert_int_equal(ks_engine_n_expert(e, &used), cases[i].n_expert);
        assert_int_equal(used, cases[i].n_used);
        assert_int_equal(ks_engine_n_swa(e), cases[i].n_swa);
        char *meta = ks_engine_meta_dump(e);
        assert_non_null(meta);
        if (!strstr(meta, cases[i].key)) fail_msg("%s: no '%s' in the metadata", cases[i].preset, cases[i].key);
        char want[64];
        snprintf(want, sizeof want, "n_params=%llu;", (unsigned long long)sh.n_params);
        if (!strstr(meta, want)) fail_msg("%s: llama.cpp counts other parameters than the %s written", cases[i].preset, want);
        free(meta);

        ks_msg msgs[2] = {{"system", "You are a helpful assistant."}, {"user", "Tell me a story about the sea."}};
        char *prompt = NULL;
        assert_int_equal(ks_engine_template(e, msgs, 2, true, &prompt), 0);
        ks_tokens t = {0};
        assert_int_equal(ks_engine_tokenize(e, prompt, strlen(prompt), true, true, &t), 0);
        int32_t a[16], b[16];
        int na = mk_generate(e, &t, 16, a);
        ks_engine_seq_clear(e, 0);
        int nb = mk_generate(e, &t, 16, b);
        assert_true(na >= 1);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, (size_t)na * sizeof a[0]);
        ks_tokens_free(&t);
        free(prompt);
        ks_engine_free(e);
        unlink(p);
        unlink(q);
    }
    ks_mkmodel_shape s;
    assert_int_equal(ks_mkmodel_shape_of("bench-moe-q4k", &s), 0);
    assert_string_equal(s.wtype_name, "q4_K");
    assert_int_equal(s.n_expert, 64);
    assert_int_equal(s.n_expert_used, 8);
    assert_true(s.n_params > 2500000000ull && s.n_params < 2700000000ull);
    assert_int_equal(ks_mkmodel_shape_of("bench-moe", &s), 0);
    assert_string_equal(s.wtype_name, "q8_0");
    assert_int_equal(ks_mkmodel_shape_of("tiny", &s), 0);
    assert_string_equal(s.arch, "llama");
    assert_int_equal(s.n_expert, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_tiny_size_and_shape),
        cmocka_unit_test(test_mmproj),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_unwritable_path),
        cmocka_unit_test(test_creates_parent_dirs),
        cmocka_unit_test(test_cli_exit_codes),
        cmocka_unit_test(test_load_template_tokenize),
        cmocka_unit_test(test_decode_greedy),
        cmocka_unit_test(test_agent_preset_and_ctx_train),
        cmocka_unit_test(test_moe_presets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

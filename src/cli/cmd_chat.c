/*
 * cmd_chat.c — `kvstash chat`: an interactive multi-turn REPL over ks_chat.
 *
 * Reads one user message per line from stdin (a terminal or a pipe). Replies
 * stream to stdout; after each reply the turn's figures go to stderr:
 *   prompt: N tokens | cached: C | new: K | P tok/s | TTFT: T ms
 *   output: M tokens | R tok/s
 * Commands: /clear, /stats, /system TEXT, /quit (or end of input).
 * A bad message (empty, longer than the context) prints an error and the
 * session goes on; the exit code is then 1.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"
#include "kvstash.h"

#define CMD "kvstash chat"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvstash chat -m MODEL [options]\n"
            "  -m, --model PATH      GGUF model file (required)\n"
            "  --system TEXT         system prompt\n"
            "  --no-cache            prefill the whole history every turn (for comparison)\n"
            "  --max-tokens N        reply length limit (default 256)\n"
            "  --temp T              temperature; 0 = greedy (default 0)\n"
            "  --top-k N --top-p P --min-p P   sampling filters (with --temp > 0)\n"
            "  --seed S              sampling seed (default 42)\n"
            "  --ctx N               context size in tokens (default 4096)\n"
            "  --batch N             prefill chunk (default 512)\n"
            "  --threads N           CPU threads (default: all)\n"
            "  --flash-attn [on|off|auto]  flash attention (default auto: on where it is exact, with\n"
            "                        setup's patched CPU backend; see kvstash serve --help)\n"
            "  --log LEVEL           debug|info|warn|error|off (default warn)\n"
            "%s"
            "Reads one message per line. Commands: /clear /stats /system TEXT /quit\n",
            ks_cli_offload_usage);
}

typedef struct progress {
    bool tty;
    bool shown;
} progress;

static void on_progress(void *ud, int done, int total) {
    progress *p = ud;
    if (!p->tty || total < 256) return;
    if (done < total) {
        fprintf(stderr, "\rprefill %d/%d tokens (%d%%)", done, total, (int)(100.0 * done / total));
        p->shown = true;
    } else if (p->shown) {
        fprintf(stderr, "\r%*s\r", 48, "");
        p->shown = false;
    }
}

static int on_text(void *ud, const char *text, size_t len) {
    (void)ud;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static char *trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}

int ks_cmd_chat(int argc, char **argv) {
    ks_chat_params cp = ks_chat_params_default();
    ks_gen_params gp = ks_gen_params_default();
    enum { O_SYSTEM = 256, O_NOCACHE, O_MAXTOK, O_TEMP, O_SEED, O_CTX, O_THREADS, O_BATCH, O_TOPK, O_TOPP,
           O_MINP, O_FA, O_LOG, O_OFFLOAD, O_OFFLOAD_END = O_OFFLOAD + KS_CLI_OFFLOAD_N };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},  {"system", required_argument, 0, O_SYSTEM},
        {"no-cache", no_argument, 0, O_NOCACHE}, {"max-tokens", required_argument, 0, O_MAXTOK},
        {"temp", required_argument, 0, O_TEMP}, {"seed", required_argument, 0, O_SEED},
        {"ctx", required_argument, 0, O_CTX},   {"threads", required_argument, 0, O_THREADS},
        {"batch", required_argument, 0, O_BATCH}, {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP}, {"min-p", required_argument, 0, O_MINP},
        {"flash-attn", optional_argument, 0, O_FA},   {"log", required_argument, 0, O_LOG},
        KS_CLI_OFFLOAD_OPTS(O_OFFLOAD),
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    ks_log_set_level(KS_LOG_WARN);
    ks_offload off;
    unsigned off_given = 0;
    ks_offload_defaults(&off);
    ks_cli_offload_aliases(argc, argv);
    optind = 1;
    int c;
    char *end;
    double d;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': cp.model_path = optarg; break;
        case O_SYSTEM: cp.system = optarg; break;
        case O_NOCACHE: cp.cache = false; break;
        case O_MAXTOK: if (ks_cli_parse_int(CMD, "--max-tokens", optarg, 1, 1 << 20, &gp.max_tokens)) return 2; break;
        case O_TEMP:
            if (ks_cli_parse_double(CMD, "--temp", optarg, 0, 100, &d)) return 2;
            gp.sample.temperature = (float)d;
            break;
        case O_SEED:
            gp.sample.seed = strtoull(optarg, &end, 10);
            if (*end || end == optarg) {
                fprintf(stderr, "kvstash chat: --seed must be a non-negative integer, got '%s'\n", optarg);
                return 2;
            }
            break;
        case O_CTX: if (ks_cli_parse_int(CMD, "--ctx", optarg, 64, 1 << 20, &cp.n_ctx)) return 2; break;
        case O_THREADS: if (ks_cli_parse_int(CMD, "--threads", optarg, 0, 1024, &cp.n_threads)) return 2; break;
        case O_BATCH: if (ks_cli_parse_int(CMD, "--batch", optarg, 1, 65536, &cp.n_batch)) return 2; break;
        case O_TOPK: if (ks_cli_parse_int(CMD, "--top-k", optarg, 0, 1 << 20, &gp.sample.top_k)) return 2; break;
        case O_TOPP:
            if (ks_cli_parse_double(CMD, "--top-p", optarg, 0, 1, &d)) return 2;
            gp.sample.top_p = (float)d;
            break;
        case O_MINP:
            if (ks_cli_parse_double(CMD, "--min-p", optarg, 0, 1, &d)) return 2;
            gp.sample.min_p = (float)d;
            break;
        case O_FA: {
            int fa;
            if (ks_cli_parse_flash_attn(CMD, optarg, argc, argv, &optind, &fa)) return 2;
            cp.flash_attn = fa == 1 ? KS_FLASH_ATTN_ON : fa == 0 ? KS_FLASH_ATTN_OFF : KS_FLASH_ATTN_AUTO;
            break;
        }
        case O_LOG: {
            int lv;
            if (ks_cli_parse_log("kvstash chat", optarg, &lv)) return 2;
            ks_log_set_level((ks_log_level)lv);
            break;
        }
        case 'h': usage(stdout); return 0;
        default:
            if (c >= O_OFFLOAD && c < O_OFFLOAD_END) {
                if (ks_cli_offload_flag(CMD, c - O_OFFLOAD, optarg, &off, &off_given)) return 2;
                break;
            }
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvstash chat: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!cp.model_path) {
        fprintf(stderr, "kvstash chat: no model given (-m MODEL.gguf)\n");
        usage(stderr);
        return 2;
    }
    cp.n_gpu_layers = off.n_gpu_layers;
    cp.devices = off.devices[0] ? off.devices : NULL;
    cp.split_mode = off.split_mode;
    cp.main_gpu = off.main_gpu;
    cp.tensor_split = off.n_tensor_split ? off.tensor_split : NULL;
    cp.n_tensor_split = off.n_tensor_split;
    cp.no_kv_offload = !off.kv_offload;
    cp.no_op_offload = !off.op_offload;
    char err[1024] = "";
    ks_chat *chat = NULL;
    int rc = ks_chat_create(&cp, &chat, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvstash chat: %s\n", err[0] ? err : ks_strerror(rc));
        return rc == KS_EINVAL ? 2 : 1; /* a setting that cannot be honoured is a usage error */
    }
    const char *reason = NULL;
    const char *mode = ks_chat_exact_mode(chat, &reason);
    if (reason) fprintf(stderr, "kvstash chat: %s; exact output %s: %s\n", ks_chat_devices(chat), mode, reason);
    bool tty_in = isatty(STDIN_FILENO);
    progress prog = {.tty = isatty(STDERR_FILENO), .shown = false};
    gp.on_text = on_text;
    gp.on_progress = on_progress;
    gp.ud = &prog;

    int failures = 0, turns = 0;
    long long tot_prompt = 0, tot_cached = 0, tot_gen = 0;
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty_in) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        trim(line);
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/clear")) {
            ks_chat_clear(chat);
            fprintf(stderr, "(history cleared)\n");
            continue;
        }
        if (!strncmp(line, "/system", 7) && (line[7] == ' ' || line[7] == '\0')) {
            ks_chat_set_system(chat, line[7] ? line + 8 : NULL);
            fprintf(stderr, "(system prompt set; history cleared)\n");
            continue;
        }
        if (!strcmp(line, "/stats")) {
            fprintf(stderr,
                    "turns: %d | prompt tokens: %lld | cached: %lld (%.1f%%) | generated: %lld | "
                    "messages: %d | KV tokens held: %d\n",
                    turns, tot_prompt, tot_cached, tot_prompt ? 100.0 * (double)tot_cached / (double)tot_prompt : 0.0,
                    tot_gen, ks_chat_n_messages(chat), ks_chat_n_cached(chat));
            continue;
        }
        if (tty_in && line[0] == '\0') continue; /* an empty Enter at a terminal is not a message */
        char *reply = NULL;
        ks_turn_stats st;
        err[0] = '\0';
        rc = ks_chat_send(chat, line, &gp, &reply, &st, err, sizeof err);
        if (rc) {
            fprintf(stderr, "kvstash chat: %s\n", err[0] ? err : ks_strerror(rc));
            failures++;
            continue;
        }
        fputc('\n', stdout);
        fflush(stdout);
        free(reply);
        turns++;
        tot_prompt += st.n_prompt;
        tot_cached += st.n_cached;
        tot_gen += st.n_generated;
        double pps = st.prompt_ms > 0 ? st.n_new / (st.prompt_ms / 1e3) : 0;
        double gps = st.gen_ms > 0 && st.n_generated > 1 ? (st.n_generated - 1) / (st.gen_ms / 1e3) : 0;
        fprintf(stderr, "prompt: %d tokens | cached: %d | new: %d | %.1f tok/s | TTFT: %.0f ms", st.n_prompt,
                st.n_cached, st.n_new, pps, st.ttft_ms);
        if (st.n_dropped_msgs) fprintf(stderr, " | dropped: %d oldest messages (context full)", st.n_dropped_msgs);
        fprintf(stderr, "\noutput: %d tokens | %.1f tok/s\n", st.n_generated, gps);
    }
    free(line);
    ks_chat_free(chat);
    return failures ? 1 : 0;
}

/*
 * main.c — dispatches `kvstash <command>`.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kvstash.h"

static void usage(FILE *f) {
    fprintf(f,
            "kvstash %s — a prompt cache for llama.cpp: never prefill the same tokens twice\n"
            "\n"
            "usage: kvstash <command> [options]\n"
            "  chat     -m MODEL   interactive multi-turn chat with the KV kept between turns\n"
            "  serve    -m MODEL   OpenAI-compatible HTTP server with slots and caches\n"
            "  mkmodel  --preset tiny|bench|... OUT.gguf   write a random-weight test model\n"
            "  cache    ls|stats|verify|gc|rm --cache-dir DIR   inspect the persistent store\n"
            "  bench    chat|decode -m MODEL   measure the multi-turn cache and pair decoding\n"
            "  version\n"
            "\n"
            "`kvstash <command> --help` shows the command's options.\n",
            ks_version());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "chat")) return ks_cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return ks_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "mkmodel")) return ks_cmd_mkmodel(argc - 1, argv + 1);
    if (!strcmp(cmd, "cache")) return ks_cmd_cache(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return ks_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("kvstash %s\n", ks_version());
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvstash: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}

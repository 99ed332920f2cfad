/*
 * cli.h — the kvstash command line: one function per subcommand, and the
 * parsers every subcommand uses for its numeric flags.
 *
 * Each subcommand returns the process exit code (0 ok, 1 runtime error,
 * 2 usage error) and prints its errors to stderr as "kvstash <cmd>: message".
 *
 * Thread model: the command line runs on the main thread; the parsers are
 * reentrant (they only read their arguments and write *out and stderr).
 */
#ifndef KS_CLI_H
#define KS_CLI_H

#include <stdint.h>

#include "base/offload.h"

int ks_cmd_chat(int argc, char **argv);
int ks_cmd_serve(int argc, char **argv);
int ks_cmd_mkmodel(int argc, char **argv);
int ks_cmd_cache(int argc, char **argv);
int ks_cmd_bench(int argc, char **argv);

/* The numeric flag parsers. Each parses the whole of s (a flag's value) and
 * refuses NULL or empty input, trailing characters, a value that overflows
 * its type (ERANGE), a non-finite number and anything outside [lo, hi]. On
 * success it writes *out and returns 0; else *out is unchanged, one line
 *   "CMD: FLAG must be <what> in [LO, HI], got 'S'"
 * goes to stderr and it returns KS_EINVAL (the caller exits 2). cmd is the
 * message prefix ("kvstash serve"), flag the flag's name ("--port"). */

/* A decimal integer (leading blanks and a sign allowed, as strtoll). */
int ks_cli_parse_ll(const char *cmd, const char *flag, const char *s, long long lo, long long hi,
                    long long *out);
/* The same for an int. */
int ks_cli_parse_int(const char *cmd, const char *flag, const char *s, int lo, int hi, int *out);
/* A decimal number (strtod's syntax, e.g. "0.7", "1e-3"). */
int ks_cli_parse_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
                        double *out);
/* A byte count: a number >= 0, fraction allowed, with an optional suffix
 * K, M, G or T (powers of 1024, case-insensitive; "Mi", "MB", "MiB" are the
 * same); "500M", "1.5G", "4096". The result is rounded down and at most
 * 2^63 - 1 bytes (the message says "a size like 500M or 2G"). */
int ks_cli_parse_size(const char *cmd, const char *flag, const char *s, int64_t *out);
/* A --log level (debug, info, warn, error, off) into *out (a ks_log_level);
 * the same contract as the parsers above. */
int ks_cli_parse_log(const char *cmd, const char *s, int *out);

/* --flash-attn [on|off|auto] (getopt optional_argument): the value glued
 * (optarg) or as the next word, which it then consumes (*optind); alone it
 * means on. *out = 1 on, 0 off, -1 auto (engine.h's KS_FA_*). 0 or KS_EINVAL
 * with the message printed. */
int ks_cli_parse_flash_attn(const char *cmd, const char *optarg, int argc, char **argv, int *optind, int *out);

/* The offload flags of serve and chat, llama-server's (base/offload.h):
 *   -ngl, --gpu-layers, --n-gpu-layers N|auto|all   --device LIST|none (-dev)
 *   --split-mode none|layer|row (-sm)   --tensor-split A,B,.. (-ts)
 *   --main-gpu N (-mg)   --no-kv-offload (-nkvo)   --no-op-offload
 * KS_CLI_OFFLOAD_OPTS(first) are their getopt_long entries, with the values
 * first .. first + 7 for the commands' switch; ks_cli_offload_flag parses
 * the one with that value (optarg: its value) into *o and sets its bit
 * (1 << (value - first)) in *given, so that a command can apply only the
 * flags given over a file's settings. 0, or KS_EINVAL with the message
 * printed ("CMD: --tensor-split must be ..."). */
#define KS_CLI_OFFLOAD_N 8
#define KS_CLI_OFFLOAD_OPTS(first)                                                                         \
    {"gpu-layers", required_argument, 0, (first)}, {"n-gpu-layers", required_argument, 0, (first)},     \
    {"device", required_argument, 0, (first) + 1}, {"split-mode", required_argument, 0, (first) + 2},  \
    {"tensor-split", required_argument, 0, (first) + 3}, {"main-gpu", required_argument, 0, (first) + 4}, \
    {"no-kv-offload", no_argument, 0, (first) + 5}, {"no-op-offload", no_argument, 0, (first) + 6}
int ks_cli_offload_flag(const char *cmd, int which, const char *optarg, ks_offload *o, unsigned *given);
/* Copies the fields of src whose bits are set in given into dst. */
void ks_cli_offload_apply(const ks_offload *src, unsigned given, ks_offload *dst);
/* Rewrites llama-server's single-dash spellings -ngl, -dev, -sm, -ts, -mg,
 * -nkvo, -ctk and -ctv in argv[1, argc) to the long names (in place; the strings are
 * static), so that getopt_long takes them. Call before getopt_long. */
void ks_cli_offload_aliases(int argc, char **argv);
/* Rewrites every argv[1, argc) (up to a "--") equal to from[k] into to[k], in
 * place (the strings must outlive argv's use): other spellings of the same
 * flags, before getopt_long. */
void ks_cli_rename_flags(int argc, char **argv, char *const *from, char *const *to, size_t n);
/* The usage lines of these flags, for --help. */
extern const char *const ks_cli_offload_usage;

/* Reads a --chat-template FILE into *out (owned: free()): at most
 * KS_MKMODEL_TMPL_MAX bytes of text without NUL. Returns 0, 1 (cannot open or
 * read it) or 2 (not acceptable text); the message, prefixed with cmd, is
 * printed. */
int ks_cli_read_template(const char *cmd, const char *path, char **out);

#endif

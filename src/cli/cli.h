/*
 * cli.h — the kvstash command line: one function per subcommand.
 * Each returns the process exit code (0 ok, 1 runtime error, 2 usage error)
 * and prints its errors to stderr as "kvstash <cmd>: message".
 */
#ifndef KS_CLI_H
#define KS_CLI_H

int ks_cmd_chat(int argc, char **argv);
int ks_cmd_serve(int argc, char **argv);
int ks_cmd_mkmodel(int argc, char **argv);
int ks_cmd_cache(int argc, char **argv);
int ks_cmd_bench(int argc, char **argv);

#endif

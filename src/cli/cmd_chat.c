/* cmd_chat.c — placeholder until the command lands. */
#include <stdio.h>
#include "cli/cli.h"
int ks_cmd_chat(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "kvstash chat: not built yet\n");
    return 1;
}

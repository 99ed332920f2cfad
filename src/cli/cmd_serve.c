/* cmd_serve.c — placeholder until the command lands. */
#include <stdio.h>
#include "cli/cli.h"
int ks_cmd_serve(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "kvstash serve: not built yet\n");
    return 1;
}

/* cmd_mkmodel.c — placeholder until the command lands. */
#include <stdio.h>
#include "cli/cli.h"
int ks_cmd_mkmodel(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "kvstash mkmodel: not built yet\n");
    return 1;
}

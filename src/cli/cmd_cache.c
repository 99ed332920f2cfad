/* cmd_cache.c — placeholder until the command lands. */
#include <stdio.h>
#include "cli/cli.h"
int ks_cmd_cache(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "kvstash cache: not built yet\n");
    return 1;
}

/* Compiles include/kvstash.h alone as strict C11 (-Wall -Wextra -Werror -pedantic). */
#include "kvstash.h"

int ks_header_check_dummy(void);
int ks_header_check_dummy(void) { return KS_EINVAL < 0 ? 0 : 1; }

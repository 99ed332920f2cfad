#include "kvstash.h"
const char *ks_version(void) { return "0.1.0"; }

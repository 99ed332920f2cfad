#include "kvstash.h"

/* The one version literal is project(VERSION) in CMakeLists.txt; it reaches
 * here through the generated kvstash_version.h. */
const char *ks_version(void) { return KS_VERSION_STRING; }

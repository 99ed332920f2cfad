/*
 * fuzz_config.c — the YAML configuration of `kvstash serve`
 * (src/config/config_yaml.c over libyaml), as read from a file anyone can
 * hand to --config.
 *
 * Input: the YAML text (cut at the first NUL, as ks_config_load_string
 * takes a C string). Paths expand $HOME and friends: the environment is
 * fixed at start so that a run is reproducible.
 *
 * Properties checked:
 *  1. loading returns 0 or KS_EINVAL (a message in err, NUL-terminated,
 *     never empty) and never crashes, leaks or reads out of bounds;
 *  2. all or nothing (config_yaml.c): a refused text leaves the
 *     configuration byte for byte as it was;
 *  3. loading is deterministic: the same text over the same starting
 *     configuration gives the same bytes, and an accepted text loaded again
 *     over its own result changes nothing (every key is a plain setting);
 *  4. what an accepted text sets is in range where the server relies on it
 *     (ports, slots, the body limit, the origin list), and the store plan
 *     and the per-model resolution run on it.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "config/config.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("HOME", "/home/fuzz", 1);
    setenv("USER", "fuzz", 1);
    setenv("XDG_CACHE_HOME", "/home/fuzz/.cache", 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool init;
    if (!init) LLVMFuzzerInitialize(NULL, NULL), init = true;
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';

    ks_config *c = malloc(sizeof *c), *before = malloc(sizeof *before), *again = malloc(sizeof *again);
    FUZZ_CHECK(c && before && again);
    memset(c, 0, sizeof *c);
    ks_config_defaults(c);
    memcpy(before, c, sizeof *c);
    char err[512];
    memset(err, 0x55, sizeof err);
    int rc = ks_config_load_string(c, text, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == KS_EINVAL);

    memcpy(again, before, sizeof *again);
    char err2[512];
    FUZZ_CHECK_EQ(ks_config_load_string(again, text, err2, sizeof err2), rc);
    FUZZ_CHECK(memcmp(again, c, sizeof *c) == 0); /* property 3 */

    if (rc != 0) {
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0');
        FUZZ_CHECK(strcmp(err, err2) == 0);
        FUZZ_CHECK(memcmp(c, before, sizeof *c) == 0); /* property 2 */
    } else {
        FUZZ_CHECK_EQ(ks_config_load_string(again, text, err2, sizeof err2), 0);
        FUZZ_CHECK(memcmp(again, c, sizeof *c) == 0);
        /* Property 4. */
        FUZZ_CHECK(c->port >= 0 && c->port <= 65535);
        FUZZ_CHECK(c->slots >= 1 && c->slots <= 256);
        FUZZ_CHECK(c->max_body_bytes >= KS_CONFIG_MAX_BODY_MIN && c->max_body_bytes <= KS_CONFIG_MAX_BODY_MAX);
        FUZZ_CHECK(c->n_cors_origins >= 0 && c->n_cors_origins <= KS_CONFIG_CORS_MAX);
        FUZZ_CHECK(c->n_models >= 0 && c->n_models <= 16);
        FUZZ_CHECK(memchr(c->model, '\0', sizeof c->model) && memchr(c->host, '\0', sizeof c->host) &&
                   memchr(c->api_key, '\0', sizeof c->api_key) && memchr(c->log, '\0', sizeof c->log));
        for (int i = 0; i < c->n_cors_origins; i++) {
            char why[128];
            FUZZ_CHECK(memchr(c->cors_origins[i], '\0', KS_CONFIG_ORIGIN_MAX) != NULL);
            FUZZ_CHECK_EQ(ks_config_check_origin(c->cors_origins[i], why, sizeof why), 0);
        }
        ks_store_cfg plan;
        ks_store_mode mode = ks_config_store_plan(c, &plan);
        FUZZ_CHECK(mode == KS_STORE_OFF || mode == KS_STORE_RAM_ONLY || mode == KS_STORE_FULL);
        FUZZ_CHECK(ks_store_mode_name(mode) != NULL);
        ks_config_resolve_model(c, "fuzz-model", "/models/fuzz.gguf");
        FUZZ_CHECK(c->slots >= 1 && c->slots <= 256);
    }
    free(c);
    free(before);
    free(again);
    free(text);
    return 0;
}

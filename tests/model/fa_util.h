/*
 * fa_util.h — flash attention as ctest asks for it: the model tests run with
 * the default (auto) and again with KS_TEST_FLASH_ATTN=off (or on).
 * Include after engine/engine.h or kvstash.h.
 */
#ifndef KS_TEST_FA_UTIL_H
#define KS_TEST_FA_UTIL_H

#include <stdlib.h>
#include <string.h>

/* 1 on, 0 off, -1 auto (unset or anything else) */
static inline int test_fa_env(void) {
    const char *v = getenv("KS_TEST_FLASH_ATTN");
    if (v && !strcmp(v, "on")) return 1;
    if (v && !strcmp(v, "off")) return 0;
    return -1;
}

#ifdef KS_ENGINE_H
static inline int test_flash_attn(void) {
    int v = test_fa_env();
    return v == 1 ? KS_FA_ON : v == 0 ? KS_FA_OFF : KS_FA_AUTO;
}
#endif

#ifdef KVSTASH_H
static inline int test_flash_attn_chat(void) {
    int v = test_fa_env();
    return v == 1 ? KS_FLASH_ATTN_ON : v == 0 ? KS_FLASH_ATTN_OFF : KS_FLASH_ATTN_AUTO;
}
#endif

#endif

/*
 * media_util.h — the fixture the media model tests share (test_media*.c):
 * a store in a fresh temp directory (the RAM tier only, stride and
 * min_tokens 16, nothing saved at shutdown) and two schedulers over the
 * test's own engines: one with the cache and that store, one that prefills
 * every request (the uncached reference). The engines stay the test's.
 * Also the test images (binary PPMs) and prompts tokenized with them.
 * Include after cmocka.h.
 */
#ifndef KS_TEST_MEDIA_UTIL_H
#define KS_TEST_MEDIA_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/store.h"
#include "engine/engine.h"
#include "engine/media.h"
#include "sched/sched.h"

/* A binary PPM (stb_image reads it): w x h, pixels from seed. Also a buffer
 * of any other media file (test_media.c's WAVs). */
typedef struct img {
    uint8_t *b;
    size_t n;
} img;

static inline img make_img(int w, int h, uint32_t seed) {
    char hdr[32];
    int hl = snprintf(hdr, sizeof hdr, "P6\n%d %d\n255\n", w, h);
    img m = {malloc((size_t)hl + (size_t)w * (size_t)h * 3), (size_t)hl + (size_t)w * (size_t)h * 3};
    memcpy(m.b, hdr, (size_t)hl);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = (size_t)hl; i < m.n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        m.b[i] = (uint8_t)x;
    }
    return m;
}

/* A prompt's tokens with its media set (one reference). */
typedef struct prompt {
    ks_tokens t;
    ks_media_set *set;
} prompt;

#define MEDIA_UTIL_MAX_ITEMS 4

/* text (one marker per item) with imgs[0, n_imgs) through e's projector;
 * fails the test when it cannot be tokenized. */
static inline void tokenize(ks_engine *e, const char *text, const img *imgs, int n_imgs, prompt *p) {
    memset(p, 0, sizeof *p);
    assert_true(n_imgs >= 0 && n_imgs <= MEDIA_UTIL_MAX_ITEMS);
    ks_media_item items[MEDIA_UTIL_MAX_ITEMS];
    for (int i = 0; i < n_imgs; i++) items[i] = (ks_media_item){imgs[i].b, imgs[i].n};
    char err[256] = "";
    int rc = ks_media_tokenize(ks_engine_media(e), text, strlen(text), true, true, items, n_imgs, &p->t, &p->set,
                               err, sizeof err);
    if (rc) fprintf(stderr, "ks_media_tokenize: %s\n", err);
    assert_int_equal(rc, 0);
}

static inline void prompt_free(prompt *p) {
    ks_tokens_free(&p->t);
    ks_media_set_unref(p->set);
}

typedef struct media_fx {
    char root[64];
    ks_store *store;
    ks_sched *s;   /* cache on, n_slots slots, the store in RAM */
    ks_sched *ref; /* one slot, every request uncached */
} media_fx;

/* 0, or -1 with the reason on stderr. tag names the temp directory. */
static inline int media_fx_open(media_fx *f, const char *tag, ks_engine *e, ks_engine *ref_e, int n_slots) {
    memset(f, 0, sizeof *f);
    snprintf(f->root, sizeof f->root, "/tmp/ks-%s-XXXXXX", tag);
    if (!mkdtemp(f->root)) return -1;
    ks_store_params p = ks_store_params_default();
    snprintf(p.cfg.cache_dir, sizeof p.cfg.cache_dir, "%s/disk", f->root);
    snprintf(p.cfg.shm_dir, sizeof p.cfg.shm_dir, "%s/shm", f->root);
    p.cfg.stride = 16;
    p.cfg.min_tokens = 16;
    p.cfg.shutdown_timeout_ms = 30000;
    for (int t = 0; t < KS_TIER__N; t++) p.cfg.tier_max_bytes[t] = 0;
    p.cfg.tier_max_bytes[KS_TIER_RAM] = 256u << 20;
    for (int r = 0; r < KS_REASON__N; r++) p.cfg.reason_tier[r] = KS_TIER_RAM;
    p.cfg.reason_tier[KS_REASON_SHUTDOWN] = KS_TIER_NONE;
    char kv[256], err[256] = "";
    ks_engine_kv_params(e, kv, sizeof kv);
    p.kv_params = kv;
    p.kv_params_len = strlen(kv);
    p.state_version = ks_engine_state_version();
    if (ks_store_open(&p, &f->store, err, sizeof err) != 0) {
        fprintf(stderr, "ks_store_open: %s\n", err);
        return -1;
    }
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = n_slots;
    sp.store = f->store;
    sp.store_stride = 16;
    sp.store_min_tokens = 16;
    if (ks_sched_create(&sp, &f->s) != 0) return -1;
    sp = ks_sched_params_default();
    sp.engine = ref_e;
    sp.n_slots = 1;
    return ks_sched_create(&sp, &f->ref) == 0 ? 0 : -1;
}

/* The schedulers, the store and its directory (not the engines). */
static inline int media_fx_close(media_fx *f) {
    ks_sched_free(f->s);
    ks_sched_free(f->ref);
    ks_store_close(f->store);
    if (!f->root[0]) return 0;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->root);
    return system(cmd) == 0 ? 0 : -1;
}

#endif

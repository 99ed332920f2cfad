/* bench/media_turns.c — a conversation about one image through the scheduler
 * (issue 29): each turn's time to first token with the cache, and the same
 * prompt without it (cache_prompt false: the slot cleared, everything
 * prefilled; the image's embeddings are the set's already, so the uncached
 * time has no encode in it), and whether both gave the same greedy tokens.
 *
 *   build/bench_media_turns MODEL MMPROJ [TURNS=4] [THREADS=2]
 *
 * E.g. kvstash mkmodel --preset bench --mmproj bench-mmproj.gguf bench.gguf
 * (196 tokens an image through a ViT-S-sized encoder). The image is a 640x480
 * PPM of noise; each turn appends the reply and a question. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/media.h"
#include "sched/sched.h"

typedef struct res {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    ks_req_result r;
    ks_tokens out;
} res;

static int on_token(void *ud, int32_t tok, const char *piece, int len) {
    (void)piece, (void)len;
    return ks_tokens_push(&((res *)ud)->out, tok) ? 1 : 0;
}

static void on_done(void *ud, const ks_req_result *r) {
    res *x = ud;
    pthread_mutex_lock(&x->mu);
    x->r = *r;
    x->done = true;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static int once(ks_sched *s, const ks_tokens *t, ks_media_set *set, bool cache, res *x) {
    memset(x, 0, sizeof *x);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    ks_req_params rp = {0};
    rp.tokens = t->v;
    rp.n_tokens = t->n;
    rp.max_tokens = 16;
    rp.sample = ks_sample_params_default();
    rp.cache_prompt = cache;
    rp.preferred_slot = 0;
    rp.media = set;
    rp.on_token = on_token;
    rp.on_done = on_done;
    rp.ud = x;
    int rc = ks_sched_submit(s, &rp, NULL);
    if (rc) return rc;
    pthread_mutex_lock(&x->mu);
    while (!x->done) pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
    return x->r.finish == KS_FINISH_ERROR ? x->r.error : 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL MMPROJ [TURNS=4] [THREADS=2]\n", argv[0]);
        return 2;
    }
    int turns = argc > 3 ? atoi(argv[3]) : 4, threads = argc > 4 ? atoi(argv[4]) : 2;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = argv[1];
    ep.mmproj_path = argv[2];
    ep.n_ctx_seq = 8192;
    ep.n_threads = threads;
    ks_engine *e = NULL;
    ks_sched *s = NULL;
    char err[512] = "";
    if (ks_engine_open(&ep, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = 1;
    if (ks_sched_create(&sp, &s)) return 1;
    int w = 640, h = 480;
    char hdr[32];
    int hl = snprintf(hdr, sizeof hdr, "P6\n%d %d\n255\n", w, h);
    size_t n = (size_t)hl + (size_t)w * h * 3;
    unsigned char *img = malloc(n);
    memcpy(img, hdr, (size_t)hl);
    for (size_t i = (size_t)hl; i < n; i++) img[i] = (unsigned char)((i * 2654435761u) >> 13);
    ks_media_item it = {img, n};
    static char text[1 << 16];
    snprintf(text, sizeof text, "<|im_start|>system\nYou are a helpful assistant that describes screenshots."
             "<|im_end|>\n<|im_start|>user\nHere is my screen: <__media__>\nWhat do you see?<|im_end|>\n"
             "<|im_start|>assistant\n");
    int rc = 0;
    for (int turn = 1; turn <= turns && !rc; turn++) {
        ks_tokens t = {0};
        ks_media_set *set = NULL;
        rc = ks_media_tokenize(ks_engine_media(e), text, strlen(text), true, true, &it, 1, &t, &set, err,
                               sizeof err);
        if (rc) {
            fprintf(stderr, "%s\n", err);
            break;
        }
        ks_media_stats m0, m1;
        ks_media_stats_get(e, &m0);
        res x, y, z;
        rc = once(s, &t, set, true, &x);
        ks_media_stats_get(e, &m1);
        if (!rc) rc = once(s, &t, set, false, &y);
        if (!rc) rc = once(s, &t, set, true, &z); /* the slot holds the turn again for the next one */
        if (rc) break;
        bool same = x.out.n == y.out.n && !memcmp(x.out.v, y.out.v, sizeof(int32_t) * (size_t)x.out.n);
        printf("turn %d: prompt %d tokens, cached %d: TTFT %.0f ms (encodes %llu, %.0f ms); uncached %.0f ms; "
               "same output: %s\n", turn, t.n, x.r.n_cached, x.r.ttft_ms,
               (unsigned long long)(m1.encodes - m0.encodes), m1.encode_ms_total - m0.encode_ms_total, y.r.ttft_ms,
               same ? "yes" : "NO");
        size_t l = strlen(text);
        for (int i = 0; i < z.out.n && l + 256 < sizeof text; i++) {
            int k = ks_engine_piece(e, z.out.v[i], text + l, sizeof text - l - 256);
            if (k > 0 && (size_t)k < sizeof text - l - 256) l += (size_t)k;
        }
        snprintf(text + l, sizeof text - l, "<|im_end|>\n<|im_start|>user\nAnd the corner, part %d?<|im_end|>\n"
                 "<|im_start|>assistant\n", turn);
        ks_tokens_free(&x.out), ks_tokens_free(&y.out), ks_tokens_free(&z.out);
        ks_tokens_free(&t);
        ks_media_set_unref(set);
    }
    ks_sched_free(s);
    ks_engine_free(e);
    free(img);
    return rc ? 1 : 0;
}

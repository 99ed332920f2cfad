/*
 * Model tests of images and audio in the cache (engine/media.h, issue 29) on
 * the tiny model and its random-weight projector (kvstash mkmodel --mmproj
 * --mmproj-audio: 64 tokens an image, 125 per 30 s of audio): tokenization into pseudo-tokens, and through the scheduler that
 * a cached prompt with an image gives the output of an uncached one, that the
 * next turn reads the image from the cache without encoding it again, that
 * an image added to a text conversation extends the cached text, that two
 * different images of one size never share a prefix past their first
 * pseudo-token, and that another engine (a restart, another process) restores
 * the image's KV from the store with no encode at all.
 *
 * The cached scheduler decodes in batches of 32 (an image in two calls), the
 * uncached reference in batches of 64 (one call).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache/store.h"
#include "engine/engine.h"
#include "engine/media.h"
#include "sched/sched.h"
#include "media_util.h"
#include "run_util.h"

#define N_IMG 64  /* tokens of an image of the tiny projector */
#define N_AUD 125 /* tokens of each 30 s of audio (a shorter clip: one chunk) */
#define MAX_GEN 12

static ks_engine *g_e, *g_ref_e;
static ks_store *g_store;
static ks_sched *g_s;   /* cache on, the store in RAM */
static ks_sched *g_ref; /* every request uncached */

/* ------------------------------------------------------------- audio (images: media_util.h) */
/* A 16 kHz mono 16-bit WAV of n samples (miniaudio reads it). */
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static img make_wav(int n, uint32_t seed) {
    img m = {calloc(1, 44 + (size_t)n * 2), 44 + (size_t)n * 2};
    memcpy(m.b, "RIFF", 4);
    put32(m.b + 4, (uint32_t)m.n - 8);
    memcpy(m.b + 8, "WAVEfmt ", 8);
    put32(m.b + 16, 16);
    m.b[20] = 1; /* PCM */
    m.b[22] = 1; /* mono */
    put32(m.b + 24, 16000);
    put32(m.b + 28, 32000);
    m.b[32] = 2;
    m.b[34] = 16;
    memcpy(m.b + 36, "data", 4);
    put32(m.b + 40, (uint32_t)n * 2);
    uint32_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        int16_t v = (int16_t)((int)(x % 16000) - 8000);
        m.b[44 + 2 * i] = (uint8_t)(v & 0xff);
        m.b[45 + 2 * i] = (uint8_t)((uint16_t)v >> 8);
    }
    return m;
}

/* ------------------------------------------------------------- prompts */
static void once(ks_sched *s, const prompt *p, bool cache, run *x) {
    run_init(x);
    ks_req_params rp = {0};
    rp.tokens = p->t.v;
    rp.n_tokens = p->t.n;
    rp.max_tokens = MAX_GEN;
    rp.sample = ks_sample_params_default();
    rp.cache_prompt = cache;
    rp.preferred_slot = 0;
    rp.media = p->set;
    rp.on_token = run_on_token;
    rp.on_done = run_on_done;
    rp.ud = x;
    assert_int_equal(ks_sched_submit(s, &rp, NULL), 0);
    run_wait(x);
    assert_int_not_equal(x->res.finish, KS_FINISH_ERROR);
}

/* Runs the prompt cached on g_s and uncached on g_ref (each engine
 * tokenizes its own copy): the outputs must be equal token for token. */
static void twin(const char *text, const img *imgs, int n_imgs, run *x, prompt *keep) {
    prompt a, b;
    tokenize(g_e, text, imgs, n_imgs, &a);
    tokenize(g_ref_e, text, imgs, n_imgs, &b);
    assert_int_equal(a.t.n, b.t.n);
    assert_memory_equal(a.t.v, b.t.v, sizeof(int32_t) * (size_t)a.t.n);
    run y;
    once(g_s, &a, true, x);
    once(g_ref, &b, false, &y);
    fprintf(stderr, "# prompt %d tokens: cached %d (%s), generated %d\n", a.t.n, x->res.n_cached, x->res.cache_mode,
            x->out.n);
    assert_true(x->out.n > 0);
    assert_int_equal(x->out.n, y.out.n);
    assert_memory_equal(x->out.v, y.out.v, sizeof(int32_t) * (size_t)x->out.n);
    run_free(&y);
    prompt_free(&b);
    if (keep) *keep = a;
    else prompt_free(&a);
}

static ks_media_stats mstats(ks_engine *e) {
    ks_media_stats m;
    ks_media_stats_get(e, &m);
    return m;
}

/* The text of generated tokens. */
static void reply_text(ks_engine *e, const ks_tokens *t, char *buf, size_t n) {
    size_t l = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->n && l + 64 < n; i++) {
        int k = ks_engine_piece(e, t->v[i], buf + l, n - l - 1);
        if (k > 0 && (size_t)k < n - l - 1) l += (size_t)k;
        buf[l] = '\0';
    }
}

#define SYS "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
#define USER(x) "<|im_start|>user\n" x "<|im_end|>\n"
#define ASST "<|im_start|>assistant\n"

/* -------------------------------------------------------------- tests */
static void test_tokenize(void **st) {
    (void)st;
    ks_media *m = ks_engine_media(g_e);
    assert_non_null(m);
    assert_true(ks_media_vision(m));
    assert_true(ks_media_audio(m));
    assert_string_equal(ks_media_marker(), "<__media__>");
    img a = make_img(64, 64, 1), b = make_img(64, 64, 2), c = make_img(100, 80, 3);
    prompt pa, pa2, pb, pc;
    tokenize(g_e, SYS USER("see <__media__> here") ASST, &a, 1, &pa);
    tokenize(g_e, SYS USER("see <__media__> here") ASST, &a, 1, &pa2);
    tokenize(g_e, SYS USER("see <__media__> here") ASST, &b, 1, &pb);
    tokenize(g_e, SYS USER("see <__media__> here") ASST, &c, 1, &pc);
    assert_int_equal(ks_media_set_n_runs(pa.set), 1);
    int pos, n;
    ks_media_set_run(pa.set, 0, &pos, &n);
    assert_int_equal(n, N_IMG);
    assert_int_equal(pa.t.n, pb.t.n);
    for (int i = 0; i < pa.t.n; i++) assert_int_equal(ks_token_is_media(pa.t.v[i]), i >= pos && i < pos + n);
    assert_int_equal(ks_media_set_find(pa.set, pos + 5), 0);
    assert_int_equal(ks_media_set_find(pa.set, pos - 1), -1);
    /* The same image: the same tokens and item hash; another: different from
     * the first pseudo-token on (media.h note 1). */
    assert_memory_equal(pa.t.v, pa2.t.v, sizeof(int32_t) * (size_t)pa.t.n);
    assert_true(ks_media_set_item_hash(pa.set, 0) == ks_media_set_item_hash(pa2.set, 0));
    assert_true(ks_media_set_item_hash(pa.set, 0) != ks_media_set_item_hash(pb.set, 0));
    assert_memory_equal(pa.t.v, pb.t.v, sizeof(int32_t) * (size_t)pos);
    assert_int_not_equal(pa.t.v[pos], pb.t.v[pos]);
    for (int i = pos + 1; i < pos + n; i++) assert_int_not_equal(pa.t.v[i], pb.t.v[i]);
    assert_int_equal(ks_media_set_n_runs(pc.set), 1); /* any size: resized to the projector's */
    assert_true(ks_media_set_covers(pa.set, pa.t.v, pa.t.n));
    assert_false(ks_media_set_covers(pb.set, pa.t.v, pa.t.n));
    assert_false(ks_media_set_covers(NULL, pa.t.v, pa.t.n));

    /* Refusals: markers and items differ; bytes that are no image. */
    ks_tokens t = {0};
    ks_media_set *set = NULL;
    char err[256] = "";
    ks_media_item it = {a.b, a.n};
    assert_int_equal(ks_media_tokenize(m, "no marker", 9, true, true, &it, 1, &t, &set, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "0 media markers for 1"));
    uint8_t junk[64];
    memset(junk, 7, sizeof junk);
    ks_media_item bad = {junk, sizeof junk};
    const char *txt = "x <__media__> y";
    assert_int_equal(ks_media_tokenize(m, txt, strlen(txt), true, true, &bad, 1, &t, &set, err, sizeof err), KS_EINVAL);
    assert_non_null(strstr(err, "could not be decoded"));
    assert_null(set);
    assert_int_equal(t.n, 0);
    /* The scheduler refuses pseudo-tokens its set does not cover. */
    ks_req_params rp = {0};
    rp.tokens = pa.t.v;
    rp.n_tokens = pa.t.n;
    rp.max_tokens = 1;
    rp.sample = ks_sample_params_default();
    rp.media = pb.set;
    assert_int_equal(ks_sched_submit(g_s, &rp, NULL), KS_EINVAL);
    rp.media = NULL;
    assert_int_equal(ks_sched_submit(g_s, &rp, NULL), KS_EINVAL);
    prompt_free(&pa);
    prompt_free(&pa2);
    prompt_free(&pb);
    prompt_free(&pc);
    free(a.b), free(b.b), free(c.b);
}

/* Turn 1 with an image, cached == uncached; turn 2 with the same image reads
 * all of turn 1's prompt from the slot and encodes nothing. */
static void test_second_turn_reads_image_from_cache(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(64, 64, 11);
    ks_media_stats m0 = mstats(g_e);
    run x;
    prompt p1;
    char t1[4096];
    snprintf(t1, sizeof t1, SYS USER("Describe <__media__> please.") ASST);
    twin(t1, &a, 1, &x, &p1);
    ks_media_stats m1 = mstats(g_e);
    assert_int_equal(m1.encodes - m0.encodes, 1);
    assert_int_equal(m1.decoded_tokens - m0.decoded_tokens, N_IMG);

    char reply[2048], t2[8192];
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("And the colors?") ASST, t1, reply);
    ks_sched_stats s0;
    ks_sched_stats_get(g_s, &s0);
    run y;
    twin(t2, &a, 1, &y, NULL);
    ks_media_stats m2 = mstats(g_e);
    ks_sched_stats s1;
    ks_sched_stats_get(g_s, &s1);
    assert_true(y.res.n_cached >= p1.t.n);
    assert_int_equal(m2.encodes, m1.encodes);               /* no new encode */
    assert_int_equal(m2.decoded_tokens, m1.decoded_tokens); /* no media row prefilled */
    assert_int_equal(s1.cache.media_tokens_reused - s0.cache.media_tokens_reused, N_IMG);
    assert_int_equal(s1.cache.media_encodes, m2.encodes);
    run_free(&x);
    run_free(&y);
    prompt_free(&p1);
    free(a.b);
}

/* A text conversation, then an image at a later turn: the text stays cached
 * and only the new text and the image are prefilled. */
static void test_image_later_extends_text(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    run x;
    prompt p1;
    char t1[4096];
    snprintf(t1, sizeof t1, SYS USER("Hello there, how are you today?") ASST);
    twin(t1, NULL, 0, &x, &p1);
    assert_null(p1.set);
    char reply[2048], t2[8192];
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("Now look at <__media__> and tell me.") ASST, t1, reply);
    img a = make_img(64, 64, 21);
    ks_media_stats m0 = mstats(g_e);
    run y;
    twin(t2, &a, 1, &y, NULL);
    ks_media_stats m1 = mstats(g_e);
    assert_true(y.res.n_cached >= p1.t.n);
    assert_int_equal(m1.encodes - m0.encodes, 1);
    run_free(&x);
    run_free(&y);
    prompt_free(&p1);
    free(a.b);
}

/* Two conversations with different images of one size: the second never
 * reuses the first's KV past the text before its image. */
static void test_different_images_never_share(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(64, 64, 31), b = make_img(64, 64, 32);
    const char *t = SYS USER("What is in <__media__> this one?") ASST;
    run x, y;
    prompt pa, pb;
    twin(t, &a, 1, &x, &pa);
    ks_media_stats m0 = mstats(g_e);
    twin(t, &b, 1, &y, &pb);
    ks_media_stats m1 = mstats(g_e);
    int pos, n;
    ks_media_set_run(pb.set, 0, &pos, &n);
    assert_true(y.res.n_cached <= pos);
    assert_int_equal(m1.encodes - m0.encodes, 1);
    /* The image is seen: another image, another reply (with these seeds). */
    assert_true(x.out.n != y.out.n || memcmp(x.out.v, y.out.v, sizeof(int32_t) * (size_t)x.out.n) != 0);
    run_free(&x);
    run_free(&y);
    prompt_free(&pa);
    prompt_free(&pb);
    free(a.b), free(b.b);
}

/* A second engine on the same store (a restarted server, another process):
 * the next turn restores the image's KV and encodes nothing. */
static void test_other_engine_restores_without_encode(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(64, 64, 41);
    run x;
    prompt p1;
    char t1[4096], reply[2048], t2[8192];
    snprintf(t1, sizeof t1, SYS USER("Please study <__media__> closely and answer.") ASST);
    twin(t1, &a, 1, &x, &p1);
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("What else?") ASST, t1, reply);
    assert_int_equal(ks_store_flush(g_store, 30000), 0); /* the finish save written */

    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MM_MODEL");
    ep.mmproj_path = getenv("KS_TINY_MMPROJ_AV");
    ep.n_seq = 1;
    ep.n_ctx_seq = 2048;
    ep.n_batch = 32;
    ep.n_threads = 1;
    ks_engine *e2 = NULL;
    char err[256];
    assert_int_equal(ks_engine_open(&ep, &e2, err, sizeof err), 0);
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e2;
    sp.n_slots = 1;
    sp.store = g_store;
    sp.store_stride = 16;
    sp.store_min_tokens = 16;
    ks_sched *s2 = NULL;
    assert_int_equal(ks_sched_create(&sp, &s2), 0);
    prompt q, r;
    tokenize(e2, t2, &a, 1, &q);
    tokenize(g_ref_e, t2, &a, 1, &r);
    run y, z;
    once(s2, &q, true, &y);
    once(g_ref, &r, false, &z);
    assert_string_equal(y.res.cache_mode, "store");
    assert_true(y.res.n_cached >= p1.t.n);
    assert_int_equal(mstats(e2).encodes, 0);
    assert_int_equal(y.out.n, z.out.n);
    assert_memory_equal(y.out.v, z.out.v, sizeof(int32_t) * (size_t)y.out.n);
    ks_sched_free(s2);
    ks_engine_free(e2);
    run_free(&x), run_free(&y), run_free(&z);
    prompt_free(&p1), prompt_free(&q), prompt_free(&r);
    free(a.b);
}

/* Decodes toks[p0, p1) (text) into seq; logits of the last row into lg. */
static void decode_text(ks_engine *e, const prompt *p, int p0, int p1, int seq, float *lg) {
    int nb = ks_engine_n_batch(e);
    ks_batch *b = ks_batch_create(nb);
    for (int c = p0; c < p1; c += nb) {
        ks_batch_clear(b);
        for (int i = c; i < p1 && i < c + nb; i++) ks_batch_add(b, p->t.v[i], i, seq, lg && i == p1 - 1);
        assert_int_equal(ks_engine_decode(e, b), 0);
    }
    if (lg) memcpy(lg, ks_engine_logits(e, ks_batch_n(b) - 1), sizeof(float) * (size_t)ks_engine_n_vocab(e));
    ks_batch_free(b);
}

/* Media note 3: a run's rows decoded in pieces ([0, 20) then [20, 64); and
 * with pairs, a last lone row with its throwaway companion) give the bits of
 * the run decoded whole: a cached prefix may end inside a run. */
static void test_split_run_is_exact(void **st) {
    (void)st;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MM_MODEL");
    ep.mmproj_path = getenv("KS_TINY_MMPROJ_AV");
    ep.n_seq = 3;
    ep.n_ctx_seq = 512;
    ep.n_batch = 32;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    char err[256];
    assert_int_equal(ks_engine_open(&ep, &e, err, sizeof err), 0);
    img a = make_img(64, 64, 51);
    prompt p;
    tokenize(e, SYS USER("Split <__media__> rows.") ASST, &a, 1, &p);
    int pos, n, nv = ks_engine_n_vocab(e);
    ks_media_set_run(p.set, 0, &pos, &n);
    float *lg[3];
    bool enc = false;
    for (int seq = 0; seq < 3; seq++) {
        lg[seq] = malloc(sizeof(float) * (size_t)nv);
        decode_text(e, &p, 0, pos, seq, NULL);
        if (seq == 0) {
            assert_int_equal(ks_media_decode(e, p.set, 0, pos, pos + n, seq, false, &enc), 0);
            assert_true(enc); /* the first decode encodes */
        } else if (seq == 1) {
            assert_int_equal(ks_media_decode(e, p.set, 0, pos, pos + 20, seq, false, &enc), 0);
            assert_false(enc); /* once per set */
            assert_int_equal(ks_media_decode(e, p.set, 0, pos + 20, pos + n, seq, false, &enc), 0);
        } else if (ks_engine_partial_rm_ok(e)) {
            assert_int_equal(ks_media_decode(e, p.set, 0, pos, pos + n - 1, seq, true, NULL), 0);
            assert_int_equal(ks_media_decode(e, p.set, 0, pos + n - 1, pos + n, seq, true, NULL), 0);
        } else { /* a hybrid memory: no pairs, a lone last row alone */
            assert_int_equal(ks_media_decode(e, p.set, 0, pos, pos + n - 1, seq, false, NULL), 0);
            assert_int_equal(ks_media_decode(e, p.set, 0, pos + n - 1, pos + n, seq, false, NULL), 0);
        }
        assert_int_equal(ks_engine_seq_pos_max(e, seq), pos + n - 1);
        decode_text(e, &p, pos + n, p.t.n, seq, lg[seq]);
    }
    assert_memory_equal(lg[0], lg[1], sizeof(float) * (size_t)nv);
    assert_memory_equal(lg[0], lg[2], sizeof(float) * (size_t)nv);
    /* Out of the run: refused. */
    assert_int_equal(ks_media_decode(e, p.set, 0, pos - 1, pos + 1, 0, false, NULL), KS_EINVAL);
    ks_media_stats m = mstats(e);
    assert_int_equal(m.encodes, 1);
    assert_int_equal(m.decoded_tokens, 3 * N_IMG);
    for (int i = 0; i < 3; i++) free(lg[i]);
    prompt_free(&p);
    ks_engine_free(e);
    free(a.b);
}

/* Another slot holds the image's conversation: the prompt is copied from it
 * (mode "copy"), nothing encoded, the output that of an uncached run. */
static void test_copy_from_other_slot(void **st) {
    (void)st;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MM_MODEL");
    ep.mmproj_path = getenv("KS_TINY_MMPROJ_AV");
    ep.n_seq = 2;
    ep.n_ctx_seq = 1024;
    ep.n_batch = 32;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    char err[256];
    assert_int_equal(ks_engine_open(&ep, &e, err, sizeof err), 0);
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e;
    sp.n_slots = 2;
    ks_sched *s = NULL;
    assert_int_equal(ks_sched_create(&sp, &s), 0);
    img a = make_img(64, 64, 61);
    prompt p1, p2, r2;
    tokenize(e, SYS USER("Compare <__media__> with yours.") ASST, &a, 1, &p1);
    tokenize(e, SYS USER("Compare <__media__> with yours.") ASST "Sure.<|im_end|>\n" USER("More?") ASST, &a, 1, &p2);
    tokenize(g_ref_e, SYS USER("Compare <__media__> with yours.") ASST "Sure.<|im_end|>\n" USER("More?") ASST, &a, 1,
             &r2);
    run x, y, z;
    once(s, &p1, true, &x); /* slot 0 */
    ks_media_stats m0 = mstats(e);
    run_init(&y);
    ks_req_params rp = {0};
    rp.tokens = p2.t.v;
    rp.n_tokens = p2.t.n;
    rp.max_tokens = MAX_GEN;
    rp.sample = ks_sample_params_default();
    rp.cache_prompt = true;
    rp.preferred_slot = 1;
    rp.media = p2.set;
    rp.on_token = run_on_token;
    rp.on_done = run_on_done;
    rp.ud = &y;
    assert_int_equal(ks_sched_submit(s, &rp, NULL), 0);
    run_wait(&y);
    once(g_ref, &r2, false, &z);
    assert_int_equal(y.res.slot, 1);
    assert_string_equal(y.res.cache_mode, "copy");
    assert_true(y.res.n_cached >= p1.t.n - 1);
    assert_int_equal(mstats(e).encodes, m0.encodes);
    assert_int_equal(y.out.n, z.out.n);
    assert_memory_equal(y.out.v, z.out.v, sizeof(int32_t) * (size_t)y.out.n);
    ks_sched_free(s);
    ks_engine_free(e);
    run_free(&x), run_free(&y), run_free(&z);
    prompt_free(&p1), prompt_free(&p2), prompt_free(&r2);
    free(a.b);
}

/* Audio as images: a clip of 50 s is two chunks (two runs, told apart by
 * their place in the item); cached == uncached; the next turn encodes
 * nothing. */
static void test_audio(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img w = make_wav(16000 * 50, 71), w2 = make_wav(16000 * 2, 72);
    prompt pw;
    tokenize(g_e, SYS USER("Hear <__media__> now") ASST, &w, 1, &pw);
    assert_int_equal(ks_media_set_n_runs(pw.set), 2);
    int p0, n0, p1, n1;
    ks_media_set_run(pw.set, 0, &p0, &n0);
    ks_media_set_run(pw.set, 1, &p1, &n1);
    assert_int_equal(n0, N_AUD);
    assert_int_equal(p1, p0 + n0);
    assert_int_not_equal(pw.t.v[p0], pw.t.v[p1]);
    prompt_free(&pw);

    ks_media_stats m0 = mstats(g_e);
    run x;
    prompt q1;
    char t1[4096], reply[2048], t2[8192];
    snprintf(t1, sizeof t1, SYS USER("What do you hear in <__media__> this?") ASST);
    twin(t1, &w2, 1, &x, &q1);
    ks_media_stats m1 = mstats(g_e);
    assert_int_equal(m1.encodes - m0.encodes, 1);
    assert_int_equal(m1.decoded_tokens - m0.decoded_tokens, N_AUD);
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("Louder?") ASST, t1, reply);
    run y;
    twin(t2, &w2, 1, &y, NULL);
    assert_true(y.res.n_cached >= q1.t.n);
    assert_int_equal(mstats(g_e).encodes, m1.encodes);
    run_free(&x), run_free(&y);
    prompt_free(&q1);
    free(w.b), free(w2.b);
}

/* A cache pin inside an image: the pinned state ends inside the run, and a
 * prompt that shares the image but not what follows restores it and
 * prefills the rest of the run from there (media.h note 3), with the output
 * of an uncached run. */
static void test_pin_inside_image(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(64, 64, 81);
    prompt pa, pb, rb;
    tokenize(g_e, SYS USER("Keep <__media__> in mind, first.") ASST, &a, 1, &pa);
    int pos, n;
    ks_media_set_run(pa.set, 0, &pos, &n);
    ks_cache_pin pin = {pos + 20, 300};
    run x;
    run_init(&x);
    ks_req_params rp = {0};
    rp.tokens = pa.t.v;
    rp.n_tokens = pa.t.n;
    rp.max_tokens = MAX_GEN;
    rp.sample = ks_sample_params_default();
    rp.cache_prompt = true;
    rp.preferred_slot = 0;
    rp.media = pa.set;
    rp.pins = &pin;
    rp.n_pins = 1;
    rp.on_token = run_on_token;
    rp.on_done = run_on_done;
    rp.ud = &x;
    assert_int_equal(ks_sched_submit(g_s, &rp, NULL), 0);
    run_wait(&x);
    assert_int_equal(x.res.n_pinned, pos + 20);
    assert_int_equal(ks_store_flush(g_store, 30000), 0);
    ks_sched_clear_slot(g_s, 0);

    const char *tb = SYS USER("Keep <__media__> in mind, second time around.") ASST;
    tokenize(g_e, tb, &a, 1, &pb);
    tokenize(g_ref_e, tb, &a, 1, &rb);
    ks_media_stats m0 = mstats(g_e);
    run y, z;
    once(g_s, &pb, true, &y);
    once(g_ref, &rb, false, &z);
    ks_media_stats m1 = mstats(g_e);
    assert_string_equal(y.res.cache_mode, "store");
    assert_int_equal(y.res.n_cached, pos + 20);
    assert_int_equal(m1.encodes - m0.encodes, 1);
    assert_int_equal(m1.decoded_tokens - m0.decoded_tokens, n - 20); /* the rest of the run only */
    assert_int_equal(y.out.n, z.out.n);
    assert_memory_equal(y.out.v, z.out.v, sizeof(int32_t) * (size_t)y.out.n);
    run_free(&x), run_free(&y), run_free(&z);
    prompt_free(&pa), prompt_free(&pb), prompt_free(&rb);
    free(a.b);
}

/* ------------------------------------------------------------- fixture */
static ks_engine *open_engine(int n_batch) {
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_MM_MODEL");
    ep.mmproj_path = getenv("KS_TINY_MMPROJ_AV");
    ep.n_seq = 1;
    ep.n_ctx_seq = 2048;
    ep.n_batch = n_batch;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    char err[256] = "";
    int rc = ks_engine_open(&ep, &e, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    return rc ? NULL : e;
}

static media_fx g_fx;

static int setup(void **st) {
    (void)st;
    if (!getenv("KS_TINY_MM_MODEL") || !getenv("KS_TINY_MMPROJ_AV")) return -1;
    g_e = open_engine(32);
    g_ref_e = open_engine(64);
    if (!g_e || !g_ref_e || media_fx_open(&g_fx, "media", g_e, g_ref_e, 1)) return -1;
    g_store = g_fx.store;
    g_s = g_fx.s;
    g_ref = g_fx.ref;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    int rc = media_fx_close(&g_fx);
    ks_engine_free(g_e);
    ks_engine_free(g_ref_e);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_split_run_is_exact),
        cmocka_unit_test(test_second_turn_reads_image_from_cache),
        cmocka_unit_test(test_image_later_extends_text),
        cmocka_unit_test(test_different_images_never_share),
        cmocka_unit_test(test_other_engine_restores_without_encode),
        cmocka_unit_test(test_copy_from_other_slot),
        cmocka_unit_test(test_audio),
        cmocka_unit_test(test_pin_inside_image),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * Model tests of images whose projector needs non-causal attention (Gemma 3;
 * engine/media.h note 2a) on the tiny gemma3 model (tiny-swa) and its
 * random-weight Gemma 3 projector (kvstash mkmodel --preset tiny-swa
 * --mmproj: 100 tokens an image): such a run is "whole", always decoded in
 * one call with causal attention off, never cut by a prefill chunk, a cache
 * hit or a pin; a cached conversation gives the output of an uncached one,
 * its next turn reads the image from the slot without encoding it again, and
 * two different images never share a prefix into the image.
 *
 * The cached scheduler (two slots) decodes in batches of 128, the uncached
 * reference in batches of 256; an engine of batch 64 refuses the image.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cache/store.h"
#include "engine/engine.h"
#include "engine/media.h"
#include "sched/sched.h"
#include "media_util.h"
#include "run_util.h"

#define N_IMG 100 /* tokens of an image of the tiny Gemma 3 projector */
#define MAX_GEN 12

static ks_engine *g_e, *g_ref_e;
static ks_store *g_store;
static ks_sched *g_s;   /* cache on, two slots, the store in RAM */
static ks_sched *g_ref; /* every request uncached */


static void submit(ks_sched *s, const prompt *p, bool cache, int slot, int max_tokens, const ks_cache_pin *pins,
                   int n_pins, run *x) {
    run_init(x);
    ks_req_params rp = {0};
    rp.tokens = p->t.v;
    rp.n_tokens = p->t.n;
    rp.max_tokens = max_tokens;
    rp.sample = ks_sample_params_default();
    rp.cache_prompt = cache;
    rp.preferred_slot = slot;
    rp.media = p->set;
    rp.pins = pins;
    rp.n_pins = n_pins;
    rp.on_token = run_on_token;
    rp.on_done = run_on_done;
    rp.ud = x;
    assert_int_equal(ks_sched_submit(s, &rp, NULL), 0);
}

static void once(ks_sched *s, const prompt *p, bool cache, run *x) {
    submit(s, p, cache, 0, MAX_GEN, NULL, 0, x);
    run_wait(x);
    assert_int_not_equal(x->res.finish, KS_FINISH_ERROR);
}

/* The reference: the prompt uncached on g_ref (tokenized by its engine). */
static void reference(const char *text, const img *im, int n_imgs, run *y) {
    prompt b;
    tokenize(g_ref_e, text, im, n_imgs, &b);
    once(g_ref, &b, false, y);
    prompt_free(&b);
}

static void assert_same_output(const run *x, const run *y) {
    assert_true(x->out.n > 0);
    assert_int_equal(x->out.n, y->out.n);
    assert_memory_equal(x->out.v, y->out.v, sizeof(int32_t) * (size_t)x->out.n);
}

/* Runs the prompt cached on g_s and uncached on g_ref: equal outputs. */
static void twin(const char *text, const img *im, int n_imgs, run *x, prompt *keep) {
    prompt a;
    tokenize(g_e, text, im, n_imgs, &a);
    run y;
    once(g_s, &a, true, x);
    reference(text, im, n_imgs, &y);
    fprintf(stderr, "# prompt %d tokens: cached %d (%s), generated %d\n", a.t.n, x->res.n_cached, x->res.cache_mode,
            x->out.n);
    assert_same_output(x, &y);
    run_free(&y);
    if (keep) *keep = a;
    else prompt_free(&a);
}

static ks_media_stats mstats(ks_engine *e) {
    ks_media_stats m;
    ks_media_stats_get(e, &m);
    return m;
}

static void reply_text(ks_engine *e, const ks_tokens *t, char *buf, size_t n) {
    size_t l = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->n && l + 64 < n; i++) {
        int k = ks_engine_piece(e, t->v[i], buf + l, n - l - 1);
        if (k > 0 && (size_t)k < n - l - 1) l += (size_t)k;
        buf[l] = '\0';
    }
}

static ks_engine *open_engine(int n_seq, int n_batch, char *err, size_t errlen) {
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = getenv("KS_TINY_G3_MODEL");
    ep.mmproj_path = getenv("KS_TINY_G3_MMPROJ");
    ep.n_seq = n_seq;
    ep.n_ctx_seq = 2048;
    ep.n_batch = n_batch;
    ep.n_threads = 1;
    ks_engine *e = NULL;
    int rc = ks_engine_open(&ep, &e, err, errlen);
    if (rc) fprintf(stderr, "%s\n", err);
    return rc ? NULL : e;
}

#define SYS "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
#define USER(x) "<|im_start|>user\n" x "<|im_end|>\n"
#define ASST "<|im_start|>assistant\n"

/* -------------------------------------------------------------- tests */
/* The run is whole; no cache length may end inside it (ks_media_set_cut);
 * ks_media_decode takes it only whole; an engine whose batch cannot hold it
 * refuses the image with the reason. */
static void test_whole_run(void **st) {
    (void)st;
    img a = make_img(64, 64, 1);
    prompt p;
    tokenize(g_e, SYS USER("see <__media__> here") ASST, &a, 1, &p);
    assert_int_equal(ks_media_set_n_runs(p.set), 1);
    int pos, n;
    ks_media_set_run(p.set, 0, &pos, &n);
    assert_int_equal(n, N_IMG);
    assert_true(ks_media_set_run_whole(p.set, 0));
    assert_false(ks_media_set_run_whole(p.set, 1));
    assert_int_equal(ks_media_set_cut(p.set, pos), pos);
    for (int i = pos + 1; i < pos + n; i++) assert_int_equal(ks_media_set_cut(p.set, i), pos);
    assert_int_equal(ks_media_set_cut(p.set, pos + n), pos + n);
    assert_int_equal(ks_media_set_cut(p.set, p.t.n), p.t.n);
    assert_int_equal(ks_media_set_cut(NULL, pos + 1), pos + 1);
    /* Not M-RoPE: every token at its own KV position (media.h note 2). */
    assert_false(ks_media_set_shifts(p.set));
    for (int i = 0; i <= p.t.n; i++) assert_int_equal(ks_media_set_kv_pos(p.set, i), i);
    /* A prompt that cuts the run with text (or ends inside it) is refused. */
    assert_true(ks_media_set_covers(p.set, p.t.v, p.t.n));
    assert_false(ks_media_set_covers(p.set, p.t.v, pos + 20));
    int32_t saved = p.t.v[pos + 20];
    p.t.v[pos + 20] = 42;
    assert_false(ks_media_set_covers(p.set, p.t.v, p.t.n));
    p.t.v[pos + 20] = saved;
    /* Parts of a whole run: refused before anything is encoded. */
    ks_media_stats m0 = mstats(g_e);
    assert_int_equal(ks_media_decode(g_e, p.set, 0, pos, pos + 20, 1, false, NULL), KS_EINVAL);
    assert_int_equal(ks_media_decode(g_e, p.set, 0, pos + 20, pos + n, 1, false, NULL), KS_EINVAL);
    assert_int_equal(mstats(g_e).encodes, m0.encodes);
    prompt_free(&p);

    char err[256] = "";
    ks_engine *e = open_engine(1, 64, err, sizeof err);
    assert_non_null(e);
    ks_tokens t = {0};
    ks_media_set *set = NULL;
    ks_media_item it = {a.b, a.n};
    const char *txt = "x <__media__> y";
    assert_int_equal(ks_media_tokenize(ks_engine_media(e), txt, strlen(txt), true, true, &it, 1, &t, &set, err,
                                       sizeof err),
                     KS_EINVAL);
    fprintf(stderr, "# batch 64: %s\n", err);
    assert_non_null(strstr(err, "non-causal"));
    assert_non_null(strstr(err, "at least 100"));
    assert_null(set);
    assert_int_equal(t.n, 0);
    ks_tokens_free(&t); /* the caller's buffer, grown before the refusal */
    ks_engine_free(e);
    free(a.b);
}

/* The run decoded whole twice, in two sequences, gives the same bits: the
 * logits after the image agree (and the decode counts the run's rows). */
static void test_whole_run_is_deterministic(void **st) {
    (void)st;
    char err[256] = "";
    ks_engine *e = open_engine(2, 128, err, sizeof err);
    assert_non_null(e);
    img a = make_img(80, 80, 5);
    prompt p;
    tokenize(e, SYS USER("Look <__media__> twice.") ASST, &a, 1, &p);
    int pos, n, nv = ks_engine_n_vocab(e);
    ks_media_set_run(p.set, 0, &pos, &n);
    float *lg[2];
    ks_batch *b = ks_batch_create(128);
    for (int seq = 0; seq < 2; seq++) {
        ks_batch_clear(b);
        for (int i = 0; i < pos; i++) ks_batch_add(b, p.t.v[i], i, seq, false);
        assert_int_equal(ks_engine_decode(e, b), 0);
        assert_int_equal(ks_media_decode(e, p.set, 0, pos, pos + n, seq, seq == 1, NULL), 0);
        assert_int_equal(ks_engine_seq_pos_max(e, seq), pos + n - 1);
        ks_batch_clear(b);
        for (int i = pos + n; i < p.t.n; i++) ks_batch_add(b, p.t.v[i], i, seq, i == p.t.n - 1);
        assert_int_equal(ks_engine_decode(e, b), 0);
        lg[seq] = malloc(sizeof(float) * (size_t)nv);
        memcpy(lg[seq], ks_engine_logits(e, ks_batch_n(b) - 1), sizeof(float) * (size_t)nv);
    }
    assert_memory_equal(lg[0], lg[1], sizeof(float) * (size_t)nv);
    ks_media_stats m = mstats(e);
    assert_int_equal(m.encodes, 1);
    assert_int_equal(m.decoded_tokens, 2 * N_IMG);
    free(lg[0]), free(lg[1]);
    ks_batch_free(b);
    prompt_free(&p);
    ks_engine_free(e);
    free(a.b);
}

/* Turn 1 with an image, cached == uncached; turn 2 reads all of turn 1 from
 * the slot: no encode, no media row decoded. */
static void test_second_turn_reads_image_from_cache(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(80, 80, 11);
    ks_media_stats m0 = mstats(g_e);
    run x, y;
    prompt p1;
    char t1[4096], reply[2048], t2[8192];
    snprintf(t1, sizeof t1, SYS USER("Describe <__media__> please.") ASST);
    twin(t1, &a, 1, &x, &p1);
    ks_media_stats m1 = mstats(g_e);
    assert_int_equal(m1.encodes - m0.encodes, 1);
    assert_int_equal(m1.decoded_tokens - m0.decoded_tokens, N_IMG);
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("And the colors?") ASST, t1, reply);
    twin(t2, &a, 1, &y, NULL);
    ks_media_stats m2 = mstats(g_e);
    assert_true(y.res.n_cached >= p1.t.n);
    assert_int_equal(m2.encodes, m1.encodes);
    assert_int_equal(m2.decoded_tokens, m1.decoded_tokens);
    run_free(&x), run_free(&y);
    prompt_free(&p1);
    free(a.b);
}

/* Different images of one size: the second conversation reuses nothing past
 * the text before its image, and is encoded and decoded whole. */
static void test_different_images_never_share(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(80, 80, 31), b = make_img(80, 80, 32);
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
    assert_int_equal(m1.decoded_tokens - m0.decoded_tokens, N_IMG);
    assert_true(x.out.n != y.out.n || memcmp(x.out.v, y.out.v, sizeof(int32_t) * (size_t)x.out.n) != 0);
    run_free(&x), run_free(&y);
    prompt_free(&pa), prompt_free(&pb);
    free(a.b), free(b.b);
}

/* A run generating beside the image: its first token gates the image's
 * submit, so that the image's rows are prefilled while it generates. */
typedef struct gen_run {
    run r;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
} gen_run;

static int gen_on_token(void *ud, int32_t tok, const char *piece, int len) {
    gen_run *g = ud;
    run_on_token(&g->r, tok, piece, len);
    pthread_mutex_lock(&g->mu);
    g->n++;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static void gen_on_done(void *ud, const ks_req_result *res) { run_on_done(&((gen_run *)ud)->r, res); }

/* While another slot generates, a prefill chunk is 64 rows at most
 * (step.c): the 100-row image is still decoded in one step (it fails
 * otherwise: ks_media_decode refuses a part of a whole run), and its
 * conversation gives the uncached output. */
static void test_whole_run_beside_generation(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    ks_sched_clear_slot(g_s, 1);
    img a = make_img(80, 80, 21);
    prompt pt, pi;
    tokenize(g_e, SYS USER("Tell me a long story about the sea and the ships on it.") ASST, NULL, 0, &pt);
    const char *ti = SYS USER("Meanwhile, <__media__> what is this?") ASST;
    tokenize(g_e, ti, &a, 1, &pi);
    ks_media_stats m0 = mstats(g_e);
    gen_run g;
    memset(&g, 0, sizeof g);
    run_init(&g.r);
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    ks_sample_ext ext = {0};
    ext.ignore_eos = true; /* it generates all of max_tokens, well past the image */
    ks_req_params rp = {0};
    rp.tokens = pt.t.v;
    rp.n_tokens = pt.t.n;
    rp.max_tokens = 64;
    rp.sample = ks_sample_params_default();
    rp.ext = &ext;
    rp.cache_prompt = true;
    rp.preferred_slot = 0;
    rp.on_token = gen_on_token;
    rp.on_done = gen_on_done;
    rp.ud = &g;
    assert_int_equal(ks_sched_submit(g_s, &rp, NULL), 0);
    pthread_mutex_lock(&g.mu);
    while (g.n == 0) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    run y, z;
    submit(g_s, &pi, true, 1, MAX_GEN, NULL, 0, &y);
    run_wait(&y);
    run_wait(&g.r);
    fprintf(stderr, "# beside: %d generated; the image's prompt %d tokens, cached %d\n", g.r.out.n, pi.t.n,
            y.res.n_cached);
    assert_int_equal(g.r.out.n, 64);
    assert_int_not_equal(y.res.finish, KS_FINISH_ERROR);
    assert_int_equal(y.res.slot, 1);
    ks_media_stats m1 = mstats(g_e);
    assert_int_equal(m1.decoded_tokens - m0.decoded_tokens, N_IMG);
    reference(ti, &a, 1, &z);
    assert_same_output(&y, &z);
    run_free(&g.r), run_free(&y), run_free(&z);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    prompt_free(&pt), prompt_free(&pi);
    free(a.b);
}

/* A cache pin inside the image cannot be held (no state may end there): it
 * fails and is counted, nothing else changes, and a next prompt sharing the
 * image is exact. */
static void test_pin_inside_whole_run_fails(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(80, 80, 81);
    prompt pa;
    tokenize(g_e, SYS USER("Keep <__media__> in mind, first.") ASST, &a, 1, &pa);
    int pos, n;
    ks_media_set_run(pa.set, 0, &pos, &n);
    ks_cache_pin pin = {pos + 20, 300};
    ks_sched_stats s0, s1;
    ks_sched_stats_get(g_s, &s0);
    run x;
    submit(g_s, &pa, true, 0, MAX_GEN, &pin, 1, &x);
    run_wait(&x);
    assert_int_not_equal(x.res.finish, KS_FINISH_ERROR);
    assert_int_equal(x.res.n_pinned, 0);
    ks_sched_stats_get(g_s, &s1);
    assert_int_equal(s1.cache.pin_failures - s0.cache.pin_failures, 1);
    assert_int_equal(ks_store_flush(g_store, 30000), 0);
    ks_sched_clear_slot(g_s, 0);
    run y;
    twin(SYS USER("Keep <__media__> in mind, second time around.") ASST, &a, 1, &y, NULL);
    assert_true(y.res.n_cached <= pos || y.res.n_cached >= pos + n);
    run_free(&x), run_free(&y);
    prompt_free(&pa);
    free(a.b);
}

/* ------------------------------------------------------------- fixture */
static media_fx g_fx;

static int setup(void **st) {
    (void)st;
    if (!getenv("KS_TINY_G3_MODEL") || !getenv("KS_TINY_G3_MMPROJ")) return -1;
    char err[256] = "";
    g_e = open_engine(2, 128, err, sizeof err);
    g_ref_e = open_engine(1, 256, err, sizeof err);
    if (!g_e || !g_ref_e || media_fx_open(&g_fx, "media-g3", g_e, g_ref_e, 2)) return -1;
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
        cmocka_unit_test(test_whole_run),
        cmocka_unit_test(test_whole_run_is_deterministic),
        cmocka_unit_test(test_second_turn_reads_image_from_cache),
        cmocka_unit_test(test_different_images_never_share),
        cmocka_unit_test(test_whole_run_beside_generation),
        cmocka_unit_test(test_pin_inside_whole_run_fails),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * Model tests of images whose projector uses M-RoPE (Qwen2-VL; engine/media.h
 * note 2) on the tiny qwen2vl model (tiny-mrope) and its random-weight
 * Qwen2-VL projector (kvstash mkmodel --preset tiny-mrope --mmproj): a
 * 112x112 image is 4x4 = 16 tokens over max(4, 4) = 4 KV positions, so the
 * text after it sits 12 positions below its token index.
 *
 * - The position map (ks_media_set_kv_pos) and the run's wholeness.
 * - kvstash's decode of an image prompt (text, ks_media_decode, text at the
 *   mapped positions) gives the bits of llama.cpp's own path,
 *   mtmd_helper_eval_chunks on a fresh context, and the same memory
 *   positions (the image's cells at pos0, the next text at pos0 + 4).
 * - Through the scheduler, cached == uncached (greedy) on same-slot reuse
 *   (turn 2 encodes nothing), a copy from another slot, a restore from the
 *   store into another engine (a restart), text before the image, and a
 *   different image of the same size shares nothing past the text before it.
 */
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
#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"
#include "sched/sched.h"
#include "media_util.h"
#include "run_util.h"

/* The engine's internals media.cpp uses too (engine_int.h is C-only). */
struct llama_context *ks__engine_ctx(const ks_engine *e);
const struct llama_model *ks__engine_model(const ks_engine *e);

#define SIDE 112  /* the test images' side: kept as they are by Qwen2-VL's preprocessor */
#define N_IMG 16  /* their tokens: (112 / 14 / 2)^2 */
#define N_POS 4   /* their KV positions: max(4, 4) */
#define MAX_GEN 12

static ks_engine *g_e, *g_ref_e;
static ks_store *g_store;
static ks_sched *g_s;   /* cache on, two slots, the store in RAM */
static ks_sched *g_ref; /* every request uncached */


static void submit(ks_sched *s, const prompt *p, bool cache, int slot, run *x) {
    run_init(x);
    ks_req_params rp = {0};
    rp.tokens = p->t.v;
    rp.n_tokens = p->t.n;
    rp.max_tokens = MAX_GEN;
    rp.sample = ks_sample_params_default();
    rp.cache_prompt = cache;
    rp.preferred_slot = slot;
    rp.media = p->set;
    rp.on_token = run_on_token;
    rp.on_done = run_on_done;
    rp.ud = x;
    assert_int_equal(ks_sched_submit(s, &rp, NULL), 0);
}

static void once(ks_sched *s, const prompt *p, bool cache, int slot, run *x) {
    submit(s, p, cache, slot, x);
    run_wait(x);
    assert_int_not_equal(x->res.finish, KS_FINISH_ERROR);
}

static void reference(const char *text, const img *im, int n_imgs, run *y) {
    prompt b;
    tokenize(g_ref_e, text, im, n_imgs, &b);
    once(g_ref, &b, false, 0, y);
    prompt_free(&b);
}

static void assert_same_output(const run *x, const run *y) {
    assert_true(x->out.n > 0);
    assert_int_equal(x->out.n, y->out.n);
    assert_memory_equal(x->out.v, y->out.v, sizeof(int32_t) * (size_t)x->out.n);
}

/* The prompt cached on s (slot) and uncached on g_ref: equal outputs. */
static void twin_on(ks_sched *s, ks_engine *e, int slot, const char *text, const img *im, int n_imgs, run *x,
                    prompt *keep) {
    prompt a;
    tokenize(e, text, im, n_imgs, &a);
    run y;
    once(s, &a, true, slot, x);
    reference(text, im, n_imgs, &y);
    fprintf(stderr, "# prompt %d tokens: cached %d (%s), generated %d\n", a.t.n, x->res.n_cached, x->res.cache_mode,
            x->out.n);
    assert_same_output(x, &y);
    run_free(&y);
    if (keep) *keep = a;
    else prompt_free(&a);
}

static void twin(const char *text, const img *im, int n_imgs, run *x, prompt *keep) {
    twin_on(g_s, g_e, 0, text, im, n_imgs, x, keep);
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
    ep.model_path = getenv("KS_TINY_MROPE_MODEL");
    ep.mmproj_path = getenv("KS_TINY_MROPE_MMPROJ");
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
/* The projector is M-RoPE; an image is one whole run of 16 tokens over 4
 * positions: kv_pos maps the text after it 12 lower, a row inside it to its
 * first position; no cache length may end inside it. */
static void test_positions(void **st) {
    (void)st;
    assert_true(ks_media_mrope(ks_engine_media(g_e)));
    img a = make_img(SIDE, SIDE, 1), b = make_img(SIDE, SIDE, 2);
    img two[2] = {a, b};
    prompt p;
    tokenize(g_e, SYS USER("see <__media__> and <__media__> here") ASST, two, 2, &p);
    assert_int_equal(ks_media_set_n_runs(p.set), 2);
    int pos, n, pos2, n2;
    ks_media_set_run(p.set, 0, &pos, &n);
    ks_media_set_run(p.set, 1, &pos2, &n2);
    assert_int_equal(n, N_IMG);
    assert_int_equal(n2, N_IMG);
    assert_true(ks_media_set_run_whole(p.set, 0));
    assert_true(ks_media_set_run_whole(p.set, 1));
    for (int i = 0; i <= pos; i++) assert_int_equal(ks_media_set_kv_pos(p.set, i), i);
    for (int i = pos; i < pos + n; i++) assert_int_equal(ks_media_set_kv_pos(p.set, i), pos);
    for (int i = pos + n; i <= pos2; i++) assert_int_equal(ks_media_set_kv_pos(p.set, i), i - (N_IMG - N_POS));
    for (int i = pos2; i < pos2 + n2; i++) assert_int_equal(ks_media_set_kv_pos(p.set, i), pos2 - (N_IMG - N_POS));
    assert_int_equal(ks_media_set_kv_pos(p.set, p.t.n), p.t.n - 2 * (N_IMG - N_POS));
    assert_int_equal(ks_media_set_kv_pos(NULL, 77), 77);
    assert_true(ks_media_set_shifts(p.set));
    assert_false(ks_media_set_shifts(NULL));
    for (int i = pos + 1; i < pos + n; i++) assert_int_equal(ks_media_set_cut(p.set, i), pos);
    assert_int_equal(ks_media_set_cut(p.set, pos + n), pos + n);
    /* A part of the run is refused before anything is encoded. */
    ks_media_stats m0 = mstats(g_e);
    assert_int_equal(ks_media_decode(g_e, p.set, 0, pos, pos + 5, 1, false, NULL), KS_EINVAL);
    assert_int_equal(mstats(g_e).encodes, m0.encodes);
    prompt_free(&p);
    free(a.b), free(b.b);
}

/* kvstash's decode of an image prompt (the text before it, the image's rows
 * by ks_media_decode, the text after at ks_media_set_kv_pos) against
 * llama.cpp's own (mtmd_helper_eval_chunks, the same batches, on another
 * engine's fresh context): the same positions in memory and the same logits,
 * bit for bit. A small batch (8) splits the image in two decode calls. */
static void test_matches_mtmd_helper(void **st) {
    (void)st;
    for (int nb = 0; nb < 2; nb++) {
        int n_batch = nb == 0 ? 128 : 8;
        char err[256] = "";
        ks_engine *e = open_engine(1, 128, err, sizeof err), *r = open_engine(1, 128, err, sizeof err);
        assert_non_null(e);
        assert_non_null(r);
        img a = make_img(SIDE, SIDE, 5);
        const char *text = SYS USER("Look at <__media__> twice.") ASST;
        prompt p;
        tokenize(e, text, &a, 1, &p);
        int pos, n, nv = ks_engine_n_vocab(e);
        ks_media_set_run(p.set, 0, &pos, &n);
        assert_true(p.t.n - (pos + n) <= n_batch || n_batch == 8);

        /* kvstash: text [0, pos) in batches of n_batch, the image, the text after. */
        ks_batch *b = ks_batch_create(128);
        for (int i0 = 0; i0 < pos; i0 += n_batch) {
            ks_batch_clear(b);
            for (int i = i0; i < pos && i < i0 + n_batch; i++) ks_batch_add(b, p.t.v[i], i, 0, false);
            assert_int_equal(ks_engine_decode(e, b), 0);
        }
        assert_int_equal(ks_media_decode(e, p.set, 0, pos, pos + n, 0, false, NULL), 0);
        /* Every image cell is at the run's first position. */
        assert_int_equal(ks_engine_seq_pos_max(e, 0), pos);
        for (int i0 = pos + n; i0 < p.t.n; i0 += n_batch) {
            ks_batch_clear(b);
            for (int i = i0; i < p.t.n && i < i0 + n_batch; i++)
                ks_batch_add(b, p.t.v[i], ks_media_set_kv_pos(p.set, i), 0, i == p.t.n - 1);
            assert_int_equal(ks_engine_decode(e, b), 0);
            if (i0 == pos + n) assert_true(ks_engine_seq_pos_max(e, 0) >= pos + N_POS);
        }
        assert_int_equal(ks_engine_seq_pos_max(e, 0), ks_media_set_kv_pos(p.set, p.t.n) - 1);
        float *mine = malloc(sizeof(float) * (size_t)nv);
        memcpy(mine, ks_engine_logits(e, ks_batch_n(b) - 1), sizeof(float) * (size_t)nv);

        /* llama.cpp's path. */
        struct mtmd_context_params mp = mtmd_context_params_default();
        mp.use_gpu = false;
        mp.print_timings = false;
        mp.n_threads = 1;
        mp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        mtmd_context *mctx = mtmd_init_from_file(getenv("KS_TINY_MROPE_MMPROJ"), ks__engine_model(r), mp);
        assert_non_null(mctx);
        assert_true(mtmd_decode_use_mrope(mctx));
        struct mtmd_helper_bitmap_wrapper w =
            mtmd_helper_bitmap_init_from_buf(mctx, a.b, a.n, false, mtmd_helper_init_opt_default());
        assert_non_null(w.bitmap);
        mtmd_input_chunks *chunks = mtmd_input_chunks_init();
        mtmd_input_text it = {text, strlen(text), true, true};
        const mtmd_bitmap *bms[1] = {w.bitmap};
        assert_int_equal(mtmd_tokenize(mctx, chunks, &it, bms, 1), 0);
        assert_int_equal((int)mtmd_helper_get_n_tokens(chunks), p.t.n);
        assert_int_equal((int)mtmd_helper_get_n_pos(chunks), ks_media_set_kv_pos(p.set, p.t.n));
        llama_pos new_n_past = -1;
        struct llama_context *lctx = ks__engine_ctx(r);
        assert_int_equal(mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, n_batch, true, &new_n_past), 0);
        assert_int_equal(new_n_past, ks_media_set_kv_pos(p.set, p.t.n));
        assert_int_equal(llama_memory_seq_pos_max(llama_get_memory(lctx), 0), new_n_past - 1);
        const float *theirs = llama_get_logits_ith(lctx, -1);
        assert_non_null(theirs);
        fprintf(stderr, "# n_batch %d: %d tokens over %d positions; logits %s\n", n_batch, p.t.n, (int)new_n_past,
                memcmp(mine, theirs, sizeof(float) * (size_t)nv) ? "DIFFER" : "equal");
        assert_memory_equal(mine, theirs, sizeof(float) * (size_t)nv);
        free(mine);
        mtmd_input_chunks_free(chunks);
        mtmd_bitmap_free(w.bitmap);
        mtmd_free(mctx);
        ks_batch_free(b);
        prompt_free(&p);
        ks_engine_free(e);
        ks_engine_free(r);
        free(a.b);
    }
}

/* The scheduler's greedy reply to an image prompt (uncached, and cached in
 * two turns) is llama.cpp's: mtmd_helper_eval_chunks on a fresh context,
 * then greedy tokens decoded one at a time at new_n_past, new_n_past + 1...
 * (the positions kvstash must give the prompt's text after the image and
 * the reply). */
static void greedy_reference(const char *text, const img *a, ks_tokens *out) {
    char err[256] = "";
    ks_engine *r = open_engine(1, 256, err, sizeof err);
    assert_non_null(r);
    struct mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = false;
    mp.print_timings = false;
    mp.n_threads = 1;
    mp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    mtmd_context *mctx = mtmd_init_from_file(getenv("KS_TINY_MROPE_MMPROJ"), ks__engine_model(r), mp);
    assert_non_null(mctx);
    struct mtmd_helper_bitmap_wrapper w =
        mtmd_helper_bitmap_init_from_buf(mctx, a->b, a->n, false, mtmd_helper_init_opt_default());
    assert_non_null(w.bitmap);
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    mtmd_input_text it = {text, strlen(text), true, true};
    const mtmd_bitmap *bms[1] = {w.bitmap};
    assert_int_equal(mtmd_tokenize(mctx, chunks, &it, bms, 1), 0);
    llama_pos n_past = -1;
    struct llama_context *lctx = ks__engine_ctx(r);
    assert_int_equal(mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, 256, true, &n_past), 0);
    int nv = ks_engine_n_vocab(r);
    ks_batch *b = ks_batch_create(4);
    const float *lg = llama_get_logits_ith(lctx, -1);
    for (int k = 0; k < MAX_GEN; k++) {
        int best = 0;
        for (int v = 1; v < nv; v++)
            if (lg[v] > lg[best]) best = v;
        if (ks_engine_is_eog(r, best)) break;
        assert_int_equal(ks_tokens_push(out, best), 0);
        ks_batch_clear(b);
        ks_batch_add(b, best, n_past++, 0, true);
        assert_int_equal(ks_engine_decode(r, b), 0);
        lg = ks_engine_logits(r, 0);
    }
    ks_batch_free(b);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(w.bitmap);
    mtmd_free(mctx);
    ks_engine_free(r);
}

static void test_reply_matches_llama(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(SIDE, SIDE, 7);
    const char *t1 = SYS USER("Name <__media__> in a few words.") ASST;
    ks_tokens want = {0};
    greedy_reference(t1, &a, &want);
    run x;
    twin(t1, &a, 1, &x, NULL); /* cached on g_s == uncached on g_ref */
    fprintf(stderr, "# reference %d tokens, kvstash %d\n", want.n, x.out.n);
    assert_int_equal(x.out.n, want.n);
    assert_memory_equal(x.out.v, want.v, sizeof(int32_t) * (size_t)want.n);
    /* And a turn whose prompt's image is read from the slot. */
    char reply[2048], t2[8192];
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("Shorter?") ASST, t1, reply);
    ks_tokens want2 = {0};
    greedy_reference(t2, &a, &want2);
    run y;
    twin(t2, &a, 1, &y, NULL);
    assert_string_equal(y.res.cache_mode, "prefix");
    assert_int_equal(y.out.n, want2.n);
    assert_memory_equal(y.out.v, want2.v, sizeof(int32_t) * (size_t)want2.n);
    ks_tokens_free(&want), ks_tokens_free(&want2);
    run_free(&x), run_free(&y);
    free(a.b);
}

/* Turn 1 with an image, cached == uncached; turn 2 reads all of turn 1 from
 * the slot: no encode, no media row decoded, the text after the image at its
 * mapped positions. */
static void test_second_turn_reads_image_from_cache(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(SIDE, SIDE, 11);
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
    assert_string_equal(y.res.cache_mode, "prefix");
    assert_true(y.res.n_cached >= p1.t.n);
    assert_int_equal(m2.encodes, m1.encodes);
    assert_int_equal(m2.decoded_tokens, m1.decoded_tokens);
    /* Turn 3: a shorter branch of turn 2 (the slot cut back past the reply,
     * after the image: a seq_rm at a mapped position). */
    run z;
    twin(SYS USER("Describe <__media__> please.") ASST "No.<|im_end|>\n" USER("Why?") ASST, &a, 1, &z, NULL);
    assert_true(z.res.n_cached >= p1.t.n - 1);
    assert_int_equal(mstats(g_e).encodes, m1.encodes);
    run_free(&x), run_free(&y), run_free(&z);
    prompt_free(&p1);
    free(a.b);
}

/* Text first, then an image: the cached text is extended by the image. */
static void test_image_later_extends_text(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    run x, y;
    prompt p1;
    char t1[4096], reply[2048], t2[8192];
    snprintf(t1, sizeof t1, SYS USER("Hello there, how are you today?") ASST);
    twin(t1, NULL, 0, &x, &p1);
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("Now look at <__media__> and tell me.") ASST, t1, reply);
    img a = make_img(SIDE, SIDE, 21);
    twin(t2, &a, 1, &y, NULL);
    assert_true(y.res.n_cached >= p1.t.n);
    run_free(&x), run_free(&y);
    prompt_free(&p1);
    free(a.b);
}

/* Different images of one size: the second conversation reuses nothing past
 * the text before its image. */
static void test_different_images_never_share(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(SIDE, SIDE, 31), b = make_img(SIDE, SIDE, 32);
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
    run_free(&x), run_free(&y);
    prompt_free(&pa), prompt_free(&pb);
    free(a.b), free(b.b);
}

/* Another slot holds the image's conversation: the next turn on slot 1 is
 * copied from it (mode "copy"), nothing encoded, the uncached output. */
static void test_copy_from_other_slot(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    ks_sched_clear_slot(g_s, 1);
    img a = make_img(SIDE, SIDE, 61);
    run x, y;
    twin(SYS USER("Compare <__media__> with yours.") ASST, &a, 1, &x, NULL);
    ks_media_stats m0 = mstats(g_e);
    twin_on(g_s, g_e, 1, SYS USER("Compare <__media__> with yours.") ASST "Sure.<|im_end|>\n" USER("More?") ASST, &a,
            1, &y, NULL);
    assert_int_equal(y.res.slot, 1);
    assert_string_equal(y.res.cache_mode, "copy");
    assert_int_equal(mstats(g_e).encodes, m0.encodes);
    run_free(&x), run_free(&y);
    free(a.b);
}

/* A second engine on the same store (a restarted server): the next turn
 * restores the image's KV (positions and all) and encodes nothing. */
static void test_other_engine_restores_from_store(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    img a = make_img(SIDE, SIDE, 41);
    run x;
    prompt p1;
    char t1[4096], reply[2048], t2[8192];
    snprintf(t1, sizeof t1, SYS USER("Please study <__media__> closely and answer.") ASST);
    twin(t1, &a, 1, &x, &p1);
    reply_text(g_e, &x.out, reply, sizeof reply);
    snprintf(t2, sizeof t2, "%s%s<|im_end|>\n" USER("What else?") ASST, t1, reply);
    assert_int_equal(ks_store_flush(g_store, 30000), 0); /* the finish save written */
    char err[256] = "";
    ks_engine *e2 = open_engine(2, 128, err, sizeof err); /* g_e's shape: its states load */
    assert_non_null(e2);
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = e2;
    sp.n_slots = 1;
    sp.store = g_store;
    sp.store_stride = 16;
    sp.store_min_tokens = 16;
    ks_sched *s2 = NULL;
    assert_int_equal(ks_sched_create(&sp, &s2), 0);
    run y;
    twin_on(s2, e2, 0, t2, &a, 1, &y, NULL);
    assert_string_equal(y.res.cache_mode, "store");
    assert_true(y.res.n_cached >= p1.t.n);
    assert_int_equal(mstats(e2).encodes, 0);
    ks_sched_free(s2);
    ks_engine_free(e2);
    run_free(&x), run_free(&y);
    prompt_free(&p1);
    free(a.b);
}

/* Text-only prompts on the M-RoPE model: positions are the identity. */
static void test_text_only(void **st) {
    (void)st;
    ks_sched_clear_slot(g_s, 0);
    run x, y;
    twin(SYS USER("Just words, no pictures.") ASST, NULL, 0, &x, NULL);
    twin(SYS USER("Just words, no pictures.") ASST "Fine.<|im_end|>\n" USER("Good.") ASST, NULL, 0, &y, NULL);
    assert_true(y.res.n_cached > 0);
    run_free(&x), run_free(&y);
}

/* ------------------------------------------------------------- fixture */
static media_fx g_fx;

static int setup(void **st) {
    (void)st;
    if (!getenv("KS_TINY_MROPE_MODEL") || !getenv("KS_TINY_MROPE_MMPROJ")) return -1;
    char err[256] = "";
    g_e = open_engine(2, 128, err, sizeof err);
    g_ref_e = open_engine(1, 256, err, sizeof err);
    if (!g_e || !g_ref_e || media_fx_open(&g_fx, "media-mrope", g_e, g_ref_e, 2)) return -1;
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
        cmocka_unit_test(test_positions),
        cmocka_unit_test(test_matches_mtmd_helper),
        cmocka_unit_test(test_reply_matches_llama),
        cmocka_unit_test(test_second_turn_reads_image_from_cache),
        cmocka_unit_test(test_image_later_extends_text),
        cmocka_unit_test(test_different_images_never_share),
        cmocka_unit_test(test_copy_from_other_slot),
        cmocka_unit_test(test_other_engine_restores_from_store),
        cmocka_unit_test(test_text_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

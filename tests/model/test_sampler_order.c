/*
 * Model test of llama-server's "samplers" order (engine.h ks_sample_ext.order)
 * on the tiny model with Qwen2.5-Coder's FIM tokens: each ordered chain
 * draws, on the same logits and at the same seed, the very tokens of the
 * chain llama.cpp's common_sampler_init builds for that order (logit biases,
 * the listed steps with the request's values, then dist) — llama.vscode's
 * ["top_k", "top_p", "infill"] included — and an empty order is the draw
 * alone. kvstash's own chain (no order) is not llama-server's for an order
 * without temperature: the test shows the two differ, so that equality
 * above is not vacuous.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "engine/engine_int.h"
#include "engine/mkmodel.h"
#include "llama.h"

enum { DRAWS = 400 };

static char g_dir[64];
static char g_model[128];
static ks_engine *g_e;
static ks_batch *g_b;

static int setup(void **st) {
    (void)st;
    snprintf(g_dir, sizeof g_dir, "/tmp/ks_test_sampler_order.XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_model, sizeof g_model, "%s/tiny-fim.gguf", g_dir);
    ks_mkmodel_params mp = ks_mkmodel_params_default();
    mp.fim = true;
    char err[256] = "";
    if (ks_mkmodel_write(&mp, g_model, NULL, err, sizeof err)) return -1;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = g_model;
    ep.n_ctx_seq = 256;
    ep.n_threads = 1;
    if (ks_engine_open(&ep, &g_e, err, sizeof err)) return -1;
    g_b = ks_batch_create(64);
    /* a short prompt's last row: the logits every draw samples from */
    const int32_t prompt[] = {1, 300, 301, 302, 303, 304, 305, 306};
    int n = (int)(sizeof prompt / sizeof prompt[0]);
    for (int i = 0; i < n; i++)
        if (ks_batch_add(g_b, prompt[i], i, 0, i == n - 1) < 0) return -1;
    return ks_engine_decode(g_e, g_b);
}

static int teardown(void **st) {
    (void)st;
    ks_batch_free(g_b);
    ks_engine_free(g_e);
    unlink(g_model);
    rmdir(g_dir);
    return 0;
}

/* llama.cpp's chain for an order, as common_sampler_init builds it. */
static struct llama_sampler *reference(const ks_sample_params *sp, const ks_sample_ext *x) {
    const struct llama_vocab *v = ks__engine_vocab(g_e);
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (x->n_logit_bias) {
        llama_logit_bias lb[8];
        for (int k = 0; k < x->n_logit_bias; k++) lb[k] = (llama_logit_bias){x->logit_bias[k].tok, x->logit_bias[k].bias};
        llama_sampler_chain_add(c, llama_sampler_init_logit_bias(ks_engine_n_vocab(g_e), x->n_logit_bias, lb));
    }
    for (int k = 0; k < x->n_order; k++) {
        switch (x->order[k]) {
        case KS_SAMPLER_TOP_K: llama_sampler_chain_add(c, llama_sampler_init_top_k(sp->top_k)); break;
        case KS_SAMPLER_TOP_P: llama_sampler_chain_add(c, llama_sampler_init_top_p(sp->top_p, 0)); break;
        case KS_SAMPLER_MIN_P: llama_sampler_chain_add(c, llama_sampler_init_min_p(sp->min_p, 0)); break;
        case KS_SAMPLER_TEMPERATURE: llama_sampler_chain_add(c, llama_sampler_init_temp_ext(sp->temperature, 0, 1)); break;
        case KS_SAMPLER_INFILL: llama_sampler_chain_add(c, llama_sampler_init_infill(v)); break;
        case KS_SAMPLER_PENALTIES:
            llama_sampler_chain_add(c, llama_sampler_init_penalties(ks_engine_n_vocab(g_e), x->repeat_last_n,
                                                                    x->repeat_penalty, x->frequency_penalty,
                                                                    x->presence_penalty));
            break;
        default: fail_msg("order code %d", x->order[k]);
        }
    }
    llama_sampler_chain_add(c, llama_sampler_init_dist((uint32_t)sp->seed));
    return c;
}

/* DRAWS tokens from kvstash's chain and from the reference on the same row;
 * returns how many differ, and how many distinct tokens kvstash drew. */
static int differ(const ks_sample_params *sp, const ks_sample_ext *x, struct llama_sampler *ref, int *distinct) {
    int rc = 0;
    ks_sampler *s = ks_sampler_create_ext(g_e, sp, x, &rc);
    assert_non_null(s);
    int n_diff = 0;
    char *seen = calloc((size_t)ks_engine_n_vocab(g_e), 1);
    *distinct = 0;
    for (int k = 0; k < DRAWS; k++) {
        int32_t a = ks_sampler_sample(s, g_e, g_b->b.n_tokens - 1);
        int32_t b = llama_sampler_sample(ref, ks__engine_ctx(g_e), g_b->b.n_tokens - 1);
        assert_true(a >= 0);
        if (!seen[a]) seen[a] = 1, (*distinct)++;
        n_diff += a != b;
    }
    free(seen);
    ks_sampler_free(s);
    llama_sampler_free(ref);
    return n_diff;
}

static void test_orders_are_llama_servers(void **st) {
    (void)st;
    ks_sample_params sp = ks_sample_params_default();
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.99f;
    sp.seed = 1234;
    ks_logit_bias bias[1] = {{.tok = 300, .bias = 2.0f}};
    static const uint8_t orders[][6] = {
        {KS_SAMPLER_TOP_K, KS_SAMPLER_TOP_P, KS_SAMPLER_INFILL},                       /* llama.vscode */
        {KS_SAMPLER_PENALTIES, KS_SAMPLER_TOP_K, KS_SAMPLER_TOP_P, KS_SAMPLER_MIN_P, KS_SAMPLER_TEMPERATURE},
        {KS_SAMPLER_TEMPERATURE, KS_SAMPLER_MIN_P, KS_SAMPLER_TOP_K},
        {KS_SAMPLER_INFILL, KS_SAMPLER_TEMPERATURE, KS_SAMPLER_PENALTIES},
        {0}, /* empty: the draw alone */
    };
    static const int lens[] = {3, 5, 3, 3, 0};
    for (size_t o = 0; o < sizeof lens / sizeof lens[0]; o++) {
        ks_sample_ext x = {.ordered = true, .n_order = lens[o], .logit_bias = bias, .n_logit_bias = 1,
                           .repeat_penalty = 1.1f, .repeat_last_n = 64, .presence_penalty = 0.5f};
        memcpy(x.order, orders[o], (size_t)lens[o]);
        int distinct;
        int n_diff = differ(&sp, &x, reference(&sp, &x), &distinct);
        assert_int_equal(n_diff, 0);
        /* draws, not one forced token — but llama.vscode's order leaves one
         * candidate on this row (its infill step after top-k and top-p;
         * below, the same order without it draws many, and the infill step
         * first, order 3, draws several) */
        if (o != 0 && distinct <= 1) fail_msg("order %zu: %d distinct tokens", o, distinct);
    }
    ks_sample_ext no_infill = {.ordered = true, .n_order = 2, .order = {KS_SAMPLER_TOP_K, KS_SAMPLER_TOP_P},
                               .logit_bias = bias, .n_logit_bias = 1};
    int distinct;
    assert_int_equal(differ(&sp, &no_infill, reference(&sp, &no_infill), &distinct), 0);
    assert_true(distinct > 1);
    /* temperature 0 is the temperature step's argmax: one token, every time */
    sp.temperature = 0.0f;
    ks_sample_ext x = {.ordered = true, .n_order = 2, .order = {KS_SAMPLER_TOP_K, KS_SAMPLER_TEMPERATURE}};
    assert_int_equal(differ(&sp, &x, reference(&sp, &x), &distinct), 0);
    assert_int_equal(distinct, 1);
    /* ...and without that step, temperature 0 does nothing: draws */
    x.n_order = 1;
    assert_int_equal(differ(&sp, &x, reference(&sp, &x), &distinct), 0);
    assert_true(distinct > 1);
}

static void test_default_chain_is_not_an_order(void **st) {
    (void)st;
    ks_sample_params sp = ks_sample_params_default();
    sp.temperature = 0.8f;
    sp.seed = 99;
    ks_sample_ext plain = {0};
    ks_sample_ext vscode = {.ordered = true, .n_order = 3,
                            .order = {KS_SAMPLER_TOP_K, KS_SAMPLER_TOP_P, KS_SAMPLER_INFILL}};
    int distinct;
    /* kvstash's chain (temperature 0.8, min_p 0.05) against llama.vscode's order on the same seed */
    assert_true(differ(&sp, &plain, reference(&sp, &vscode), &distinct) > 0);
    /* a bad code is refused */
    ks_sample_ext bad = {.ordered = true, .n_order = 1, .order = {99}};
    int rc = 0;
    assert_null(ks_sampler_create_ext(g_e, &sp, &bad, &rc));
    assert_int_equal(rc, KS_EINVAL);
    bad.order[0] = KS_SAMPLER_TOP_K;
    bad.n_order = KS_SAMPLER_ORDER_MAX + 1;
    assert_null(ks_sampler_create_ext(g_e, &sp, &bad, &rc));
    assert_int_equal(rc, KS_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orders_are_llama_servers),
        cmocka_unit_test(test_default_chain_is_not_an_order),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

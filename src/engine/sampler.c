/*
 * sampler.c — a request's sampler (engine.h, ks_sampler_*): llama's chain
 * (temperature, top-k/p, min-p, the seed), a logit bias, penalties, and a
 * grammar kept out of the chain, applied llama-server's way (one candidate
 * first, the whole vocabulary only when it refuses); logprobs of the sampled
 * token and its alternatives. Like engine.c it includes llama.h; it reaches
 * the engine's llama objects through engine_int.h.
 */
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "engine/grammar.h"
#include "llama.h"

#define MOD "engine"

struct ks_sampler {
    struct llama_sampler *chain;
    struct llama_sampler *grammar; /* NULL: none; never in the chain */
    llama_token_data *cur;         /* with a grammar: n_vocab candidates, reused per token */
    int n_vocab;
    int n_history;                 /* penalties' window (prompt tokens accepted as history), 0: off */
    bool failed;                   /* ks_sampler_sample returned -1: it does so from now on */
};

/* --------------------------------------------------------------- sampling */
static bool tokens_in_vocab(const ks_engine *e, const int32_t *t, int n) {
    for (int k = 0; k < n; k++)
        if (t[k] < 0 || t[k] >= ks_engine_n_vocab(e)) return false;
    return true;
}

int ks_sampler_ext_check(const ks_engine *e, const ks_sample_ext *x) {
    if (!x) return 0;
    if (x->n_trigger_patterns < 0 || x->n_trigger_tokens < 0 || x->n_grammar_prefill < 0 || x->n_logit_bias < 0)
        return KS_EINVAL;
    if ((x->n_trigger_patterns && !x->trigger_patterns) || (x->n_trigger_tokens && !x->trigger_tokens) ||
        (x->n_grammar_prefill && !x->grammar_prefill) || (x->n_logit_bias && !x->logit_bias))
        return KS_EINVAL;
    if (x->n_probs < 0 || x->n_probs > KS_N_PROBS_MAX || x->repeat_last_n < -1) return KS_EINVAL;
    if (x->n_order < 0 || x->n_order > KS_SAMPLER_ORDER_MAX) return KS_EINVAL;
    for (int k = 0; k < x->n_order; k++)
        if (x->order[k] < KS_SAMPLER_TOP_K || x->order[k] > KS_SAMPLER_PENALTIES) return KS_EINVAL;
    /* llama.cpp's common_sampler_init refuses these too (it throws). */
    float rp = x->repeat_penalty;
    if (!isfinite(rp) || rp < 0.0f || (rp > 0.0f && !isfinite(1.0f / rp))) return KS_EINVAL;
    if (!isfinite(x->frequency_penalty) || !isfinite(x->presence_penalty)) return KS_EINVAL;
    for (int k = 0; k < x->n_trigger_patterns; k++)
        if (!x->trigger_patterns[k]) return KS_EINVAL;
    if (!tokens_in_vocab(e, x->trigger_tokens, x->n_trigger_tokens) ||
        !tokens_in_vocab(e, x->grammar_prefill, x->n_grammar_prefill))
        return KS_EINVAL;
    /* An out-of-range id would be written outside llama's candidate array; a
     * +INFINITY or NaN logit makes the softmax NaN. */
    for (int k = 0; k < x->n_logit_bias; k++) {
        float b = x->logit_bias[k].bias;
        if (x->logit_bias[k].tok < 0 || x->logit_bias[k].tok >= ks_engine_n_vocab(e) || isnan(b) || b == INFINITY)
            return KS_EINVAL;
    }
    return 0;
}

/* Runs ks__grammar_init with llama's error lines captured; on failure err
 * holds the best reason there is. */
static int grammar_init(const ks_engine *e, const char *gbnf, bool lazy, const ks_sample_ext *x,
                        struct llama_sampler **out, char *err, size_t errlen) {
    char ex[256] = "";
    ks__log_capture cap = {err, errlen, 0};
    if (errlen) err[0] = '\0';
    ks__log_capture *prev = ks__engine_capture(&cap);
    int rc = ks__grammar_init(ks__engine_vocab(e), gbnf, lazy, x ? x->trigger_patterns : NULL, x ? x->n_trigger_patterns : 0,
                              x ? x->trigger_tokens : NULL, x ? x->n_trigger_tokens : 0, out, ex, sizeof ex);
    ks__engine_capture(prev);
    if (rc && ex[0]) ks_set_err(err, errlen, "%s", ex); /* an exception says more than the log */
    else if (rc && cap.len == 0) ks_set_err(err, errlen, "llama.cpp refused the grammar");
    return rc;
}

int ks_engine_grammar_check(const ks_engine *e, const char *gbnf, char *err, size_t errlen) {
    if (errlen) err[0] = '\0';
    if (!gbnf || !gbnf[0]) return 0;
    struct llama_sampler *g = NULL;
    int rc = grammar_init(e, gbnf, false, NULL, &g, err, errlen);
    llama_sampler_free(g);
    return rc;
}

/* Whether the grammar in its current state allows tok (llama-server's
 * single-candidate check). Applying never throws; a lazy grammar that waits
 * for its trigger allows everything. */
static bool grammar_allows(struct llama_sampler *g, int32_t tok) {
    llama_token_data d = {tok, 1.0f, 0.0f};
    llama_token_data_array a = {&d, 1, -1, false};
    llama_sampler_apply(g, &a);
    return d.logit != -INFINITY;
}

/* The chain's front: the request's biases and ignore_eos's. */
static int add_logit_bias(const ks_engine *e, ks_sampler *s, const ks_sample_ext *x) {
    int n_eog;
    const int32_t *eogs = ks__engine_eog(e, &n_eog);
    int n = x->n_logit_bias + (x->ignore_eos ? n_eog : 0);
    if (n == 0) return 0;
    llama_logit_bias *lb = malloc(sizeof *lb * (size_t)n);
    if (!lb) return KS_ENOMEM;
    int k = 0;
    for (int j = 0; j < x->n_logit_bias; j++) lb[k++] = (llama_logit_bias){x->logit_bias[j].tok, x->logit_bias[j].bias};
    for (int j = 0; x->ignore_eos && j < n_eog; j++) lb[k++] = (llama_logit_bias){eogs[j], -INFINITY};
    llama_sampler_chain_add(s->chain, llama_sampler_init_logit_bias(ks_engine_n_vocab(e), n, lb)); /* copies lb */
    free(lb);
    return 0;
}

static void add_penalties(const ks_engine *e, ks_sampler *s, const ks_sample_ext *x) {
    int last_n = x->repeat_last_n == -1 ? ks_engine_n_ctx_seq(e) : x->repeat_last_n;
    float rp = x->repeat_penalty == 0.0f ? 1.0f : x->repeat_penalty;
    if (last_n <= 0 || (rp == 1.0f && x->frequency_penalty == 0.0f && x->presence_penalty == 0.0f)) return;
    llama_sampler_chain_add(s->chain, llama_sampler_init_penalties(ks_engine_n_vocab(e), last_n, rp, x->frequency_penalty,
                                                                    x->presence_penalty));
    s->n_history = last_n;
}

/* The grammar sampler, and for a strict grammar the prefill accepted. */
static int add_grammar(const ks_engine *e, ks_sampler *s, const ks_sample_ext *x) {
    char err[512];
    int rc = grammar_init(e, x->grammar, x->grammar_lazy, x, &s->grammar, err, sizeof err);
    if (rc) {
        KS_DEBUG(MOD, "grammar refused: %s", err);
        return rc;
    }
    for (int k = 0; !x->grammar_lazy && k < x->n_grammar_prefill; k++) {
        int32_t t = x->grammar_prefill[k];
        /* llama.cpp aborts on an end-of-generation token the grammar does not allow. */
        if (llama_vocab_is_eog(ks__engine_vocab(e), t)) {
            KS_DEBUG(MOD, "grammar prefill token %d ends generation", t);
            return KS_EINVAL;
        }
        if ((rc = ks__grammar_accept(s->grammar, t, err, sizeof err)) != 0) {
            KS_DEBUG(MOD, "grammar prefill token %d refused: %s", t, err);
            return rc;
        }
    }
    s->cur = malloc(sizeof *s->cur * (size_t)ks_engine_n_vocab(e));
    return s->cur ? 0 : KS_ENOMEM;
}

/* The draw's seed: llama.cpp's is 32 bits; a 64-bit seed folds into it
 * (one below 2^32 stays what it is, as llama-server takes it). */
static uint32_t seed32(uint64_t seed) { return (uint32_t)(seed ^ (seed >> 32)); }

/* llama-server's "samplers" order (engine.h), as common_sampler_init
 * builds its chain: each step with the request's value, even where it does
 * nothing (top-k 0, top-p 1), then the draw at the seed. */
static void add_ordered(const ks_engine *e, ks_sampler *s, const ks_sample_params *sp, const ks_sample_ext *x) {
    ks_sample_params d = ks_sample_params_default();
    const ks_sample_params *p = sp ? sp : &d;
    for (int k = 0; k < x->n_order; k++) {
        switch (x->order[k]) {
        case KS_SAMPLER_TOP_K: llama_sampler_chain_add(s->chain, llama_sampler_init_top_k(p->top_k)); break;
        case KS_SAMPLER_TOP_P: llama_sampler_chain_add(s->chain, llama_sampler_init_top_p(p->top_p, 0)); break;
        case KS_SAMPLER_MIN_P: llama_sampler_chain_add(s->chain, llama_sampler_init_min_p(p->min_p, 0)); break;
        case KS_SAMPLER_TEMPERATURE:
            llama_sampler_chain_add(s->chain, llama_sampler_init_temp_ext(p->temperature, 0.0f, 1.0f));
            break;
        case KS_SAMPLER_INFILL: llama_sampler_chain_add(s->chain, llama_sampler_init_infill(ks__engine_vocab(e))); break;
        case KS_SAMPLER_PENALTIES: add_penalties(e, s, x); break;
        default: break; /* refused by ks_sampler_ext_check */
        }
    }
    llama_sampler_chain_add(s->chain, llama_sampler_init_dist(seed32(p->seed)));
}

ks_sampler *ks_sampler_create_ext(const ks_engine *e, const ks_sample_params *sp, const ks_sample_ext *x, int *rc) {
    int rc_ = 0;
    if (!rc) rc = &rc_;
    if ((*rc = ks_sampler_ext_check(e, x)) != 0) return NULL;
    *rc = KS_ENOMEM;
    ks_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_vocab = ks_engine_n_vocab(e);
    struct llama_sampler_chain_params scp = llama_sampler_chain_default_params();
    scp.no_perf = true;
    s->chain = llama_sampler_chain_init(scp);
    if (!s->chain) goto fail;
    if (x && add_logit_bias(e, s, x)) goto fail;
    if (x && x->ordered) {
        add_ordered(e, s, sp, x);
    } else {
        if (x) add_penalties(e, s, x);
        if (!sp || sp->temperature <= 0.0f) {
            llama_sampler_chain_add(s->chain, llama_sampler_init_greedy());
        } else {
            if (sp->top_k > 0) llama_sampler_chain_add(s->chain, llama_sampler_init_top_k(sp->top_k));
            if (sp->top_p > 0.0f && sp->top_p < 1.0f)
                llama_sampler_chain_add(s->chain, llama_sampler_init_top_p(sp->top_p, 1));
            if (sp->min_p > 0.0f) llama_sampler_chain_add(s->chain, llama_sampler_init_min_p(sp->min_p, 1));
            llama_sampler_chain_add(s->chain, llama_sampler_init_temp(sp->temperature));
            llama_sampler_chain_add(s->chain, llama_sampler_init_dist(seed32(sp->seed)));
        }
    }
    if (x && x->grammar && x->grammar[0] && (*rc = add_grammar(e, s, x)) != 0) goto fail;
    *rc = 0;
    return s;
fail:
    ks_sampler_free(s);
    return NULL;
}

ks_sampler *ks_sampler_create(const ks_engine *e, const ks_sample_params *sp) {
    return ks_sampler_create_ext(e, sp, NULL, NULL);
}

void ks_sampler_free(ks_sampler *s) {
    if (!s) return;
    llama_sampler_free(s->chain);
    llama_sampler_free(s->grammar);
    free(s->cur);
    free(s);
}

void ks_sampler_accept_history(ks_sampler *s, const int32_t *toks, int n) {
    if (!s || s->n_history == 0) return;
    for (int k = n > s->n_history ? n - s->n_history : 0; k < n; k++) llama_sampler_accept(s->chain, toks[k]);
}

/* The candidates in token order, from a logits row. */
static llama_token_data_array candidates(ks_sampler *s, const float *lg) {
    for (int t = 0; t < s->n_vocab; t++) s->cur[t] = (llama_token_data){t, lg[t], 0.0f};
    return (llama_token_data_array){s->cur, (size_t)s->n_vocab, -1, false};
}

/* The token the chain selected, -1 when it selected none that is possible
 * (every candidate was -INFINITY). */
static int32_t selected(const llama_token_data_array *a) {
    if (a->selected < 0 || (size_t)a->selected >= a->size) return -1;
    float l = a->data[a->selected].logit;
    return isnan(l) || l == -INFINITY ? -1 : a->data[a->selected].id;
}

static int32_t sample_failed(ks_sampler *s) {
    s->failed = true;
    return -1;
}

int32_t ks_sampler_sample(ks_sampler *s, ks_engine *e, int i) {
    if (s->failed) return -1;
    /* llama_sampler_sample also accepts the token into the chain. */
    if (!s->grammar) return llama_sampler_sample(s->chain, ks__engine_ctx(e), i);
    const float *lg = llama_get_logits_ith(ks__engine_ctx(e), i);
    if (!lg) return sample_failed(s);
    /* Rejection sampling, as llama-server: the grammar is applied to the whole
     * vocabulary only when the chain's pick breaks it. */
    llama_token_data_array a = candidates(s, lg);
    llama_sampler_apply(s->chain, &a);
    int32_t tok = selected(&a);
    if (tok < 0 || !grammar_allows(s->grammar, tok)) {
        a = candidates(s, lg);
        llama_sampler_apply(s->grammar, &a);
        /* The grammar only masks (the array is still in token order): the
         * end-of-generation token it allows with the highest logit, for when
         * the chain's biases ban everything else it allows. */
        int32_t eog = -1;
        int n_eog;
        const int32_t *eogs = ks__engine_eog(e, &n_eog);
        for (int k = 0; k < n_eog; k++) {
            int32_t t = eogs[k];
            if (a.data[t].logit != -INFINITY && (eog < 0 || lg[t] > lg[eog])) eog = t;
        }
        llama_sampler_apply(s->chain, &a);
        tok = selected(&a);
        if (tok < 0) tok = eog; /* a complete grammar ends generation, ignore_eos or not */
        if (tok < 0) {
            KS_DEBUG(MOD, "grammar: no token is allowed");
            return sample_failed(s);
        }
    }
    /* An end-of-generation token ends the request: the grammar never needs it
     * (and llama.cpp aborts on one it does not allow). */
    if (!llama_vocab_is_eog(ks__engine_vocab(e), tok)) {
        char err[256];
        if (ks__grammar_accept(s->grammar, tok, err, sizeof err) != 0) {
            KS_DEBUG(MOD, "grammar refused token %d: %s", tok, err);
            return sample_failed(s);
        }
    }
    llama_sampler_accept(s->chain, tok);
    return tok;
}

int ks_sampler_probs(ks_sampler *s, ks_engine *e, int i, int32_t sampled, ks_token_prob *sampled_out,
                     ks_token_prob *top, int n) {
    (void)s;
    const float *lg = llama_get_logits_ith(ks__engine_ctx(e), i);
    if (sampled_out) *sampled_out = (ks_token_prob){sampled, -INFINITY};
    if (!lg) return 0;
    int nv = ks_engine_n_vocab(e);
    float mx = -INFINITY;
    for (int t = 0; t < nv; t++)
        if (lg[t] > mx) mx = lg[t];
    double sum = 0.0;
    for (int t = 0; t < nv; t++) sum += exp((double)lg[t] - mx);
    double lse = mx + log(sum);
    if (sampled_out && sampled >= 0 && sampled < nv) sampled_out->logprob = (float)(lg[sampled] - lse);
    if (!top || n < 0) n = 0;
    if (n > nv) n = nv;
    /* Top n by insertion (n <= KS_N_PROBS_MAX in use): logits first, turned
     * into log-probabilities at the end. Strict comparisons keep the lower id
     * first among equals. */
    int k = 0;
    for (int t = 0; t < nv && n > 0; t++) {
        float l = lg[t];
        if (k == n && !(l > top[n - 1].logprob)) continue;
        int j = k < n ? k++ : n - 1;
        while (j > 0 && l > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (ks_token_prob){t, l};
    }
    for (int j = 0; j < k; j++) top[j].logprob = (float)(top[j].logprob - lse);
    return k;
}

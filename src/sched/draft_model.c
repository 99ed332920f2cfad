/*
 * draft_model.c — see draft_model.h.
 *
 * A drafter holds its slot's sequence in the draft engine (`kv`: the exact
 * tokens that sequence holds) and the slot's tokens as the scheduler reports
 * them (`hist`: begin, then accept). catch_up() makes kv = hist + extra by
 * dropping kv's tail past their common prefix and decoding the rest, with
 * logits on the last row; drafting then decodes one drafted token per step
 * of its own loop. kv may end inside a draft the target rejected: the next
 * catch_up drops that tail.
 */
#include "sched/draft_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/prefix.h"
#include "engine/media.h"

#define MOD "draft"

typedef struct dm {
    ks_draft_model_cfg *c;
    int seq;
    ks_tokens kv;    /* what the draft sequence holds */
    ks_tokens hist;  /* the slot's sequence */
    ks_batch *b;
    int n_batch;
    bool off;        /* the request has media: no drafts until the next begin */
    int n_prompt;    /* the prompt's length until the request's first draft, then 0 */
    double tok_ms;   /* a drafted token's decode, a moving average (0: not measured yet) */
    uint64_t tenant; /* whose tokens it sees (drafter.h create) */
} dm;

static void *create(void *cfg, int slot, uint64_t tenant) {
    ks_draft_model_cfg *c = cfg;
    if (slot >= ks_engine_n_seq(c->engine)) return NULL;
    dm *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->c = c;
    d->seq = slot;
    d->tenant = tenant;
    d->n_batch = ks_engine_n_batch(c->engine);
    d->b = ks_batch_create(d->n_batch);
    if (!d->b) {
        free(d);
        return NULL;
    }
    ks_engine_seq_clear(c->engine, slot); /* a new drafter: nothing of an earlier one's (tenant's) tokens */
    if (slot < KS_DRAFT_LIVE_MAX) c->live[slot] = d;
    return d;
}

static bool cacheable(const dm *d);

/* The sequence to the draft's store (reason evict), when it wants it: before
 * a long tail is dropped, and at destroy. */
static void save_seq(dm *d) {
    ks_store *st = d->c->store;
    ks_engine *e = d->c->engine;
    if (!st || d->c->no_cache || d->off || d->kv.n < 1 || !cacheable(d) ||
        !ks_store_wants_in(st, d->tenant, KS_REASON_EVICT, d->kv.v, d->kv.n))
        return;
    size_t need = ks_engine_state_size(e, d->seq);
    uint8_t *p = need ? malloc(need) : NULL;
    size_t got = p ? ks_engine_state_get(e, d->seq, p, need) : 0;
    if (!got) {
        free(p);
        return;
    }
    if (ks_store_save_in(st, d->tenant, KS_REASON_EVICT, d->kv.v, d->kv.n, p, got, false) == 0)
        atomic_fetch_add(&d->c->saved, 1);
}

static void destroy(void *v) {
    dm *d = v;
    if (!d) return;
    save_seq(d);
    if (d->seq < KS_DRAFT_LIVE_MAX && d->c->live[d->seq] == d) d->c->live[d->seq] = NULL;
    ks_engine_seq_clear(d->c->engine, d->seq);
    ks_tokens_free(&d->kv);
    ks_tokens_free(&d->hist);
    ks_batch_free(d->b);
    free(d);
}

static void begin(void *v, const int32_t *toks, int n) {
    dm *d = v;
    d->off = false;
    for (int i = 0; i < n; i++)
        if (ks_token_is_media(toks[i])) d->off = true;
    if (d->off || ks_tokens_assign(&d->hist, toks, n)) {
        d->off = true;
        ks_tokens_truncate(&d->hist, 0);
    }
    d->n_prompt = n;
}

/* Drops everything from the draft sequence: kv empty. */
static void reset(dm *d) {
    ks_engine_seq_clear(d->c->engine, d->seq);
    ks_tokens_truncate(&d->kv, 0);
}

/* Whether the draft's sequence takes states of other sequences at all: a
 * memory that drops a suffix, and no sliding window (whose states restore
 * at some lengths only and whose cuts must keep the window: the target's
 * rules, policy.c; a draft model of that kind catches up by decoding). */
static bool cacheable(const dm *d) {
    return ks_engine_partial_rm_ok(d->c->engine) && ks_engine_n_swa(d->c->engine) <= 0;
}

/* A copy or a restore must bring at least this many tokens more than the
 * sequence holds (fewer decode faster than a whole state is copied). */
enum { min_gain = 16 };

/* Before catching up on t[0, n) from `common` tokens: brings in more of t
 * than the sequence holds without decoding it, when another drafter of the
 * same tenant holds more (a copy of its sequence) or the store does (the
 * longest stored prefix), by at least min_gain tokens. Returns the tokens
 * the sequence now shares with t. */
static int bring_in(dm *d, const int32_t *t, int n, int common) {
    ks_draft_model_cfg *c = d->c;
    ks_engine *e = c->engine;
    if (c->no_cache || n - 1 - common < min_gain || !cacheable(d)) return common;
    /* another drafter's sequence */
    dm *best = NULL;
    int n_best = common;
    for (int i = 0; i < KS_DRAFT_LIVE_MAX; i++) {
        dm *o = c->live[i];
        if (!o || o == d || o->tenant != d->tenant || o->off) continue;
        int k = ks_prefix_common(o->kv.v, o->kv.n, t, n - 1);
        if (k > n_best) {
            best = o;
            n_best = k;
        }
    }
    if (best && n_best - common >= min_gain) {
        /* one scratch for every drafter of the engine, as the scheduler's
         * copy_buf: the state of the longest sequence copied so far */
        size_t need = ks_engine_state_size(e, best->seq);
        if (need > c->buf_cap) {
            free(c->buf);
            c->buf = malloc(need + need / 4);
            c->buf_cap = c->buf ? need + need / 4 : 0;
        }
        size_t got = need <= c->buf_cap ? ks_engine_state_get(e, best->seq, c->buf, c->buf_cap) : 0;
        if (got) {
            reset(d); /* as the target's restores: the sequence cleared first */
            if (ks_engine_state_set(e, d->seq, c->buf, got) == 0 &&
                !ks_tokens_assign(&d->kv, best->kv.v, best->kv.n)) {
                atomic_fetch_add(&c->copied, (uint64_t)(n_best - common));
                KS_DEBUG(MOD, "draft[%d]: %d tokens from draft[%d]'s sequence", d->seq, n_best, best->seq);
                return n_best;
            }
            reset(d);
            return 0;
        }
    }
    /* the store */
    if (!c->store) return common;
    ks_store_hit hit;
    if (ks_store_lookup_range_in(c->store, d->tenant, t, n, common + min_gain, n - 1, &hit) != 0) return common;
    int got = 0;
    reset(d);
    if (ks_engine_state_set(e, d->seq, hit.payload, hit.payload_len) == 0 &&
        !ks_tokens_assign(&d->kv, t, hit.n_tokens)) {
        atomic_fetch_add(&c->restored, (uint64_t)(hit.n_tokens - common));
        KS_DEBUG(MOD, "draft[%d]: %d tokens from the store (%s)", d->seq, hit.n_tokens, ks_tier_name(hit.tier));
        got = hit.n_tokens;
    } else {
        reset(d);
    }
    ks_store_hit_free(&hit);
    return got;
}

/* kv := t[0, n), the last row's logits at batch index *i_last; false when
 * the draft engine failed (the sequence is then reset). Tokens decoded at
 * positions below n_pre count as prefilled, the others as followed. */
static bool catch_up(dm *d, const int32_t *t, int n, int n_pre, int *i_last) {
    ks_engine *e = d->c->engine;
    int common = ks_prefix_common(d->kv.v, d->kv.n, t, n);
    /* Most of the sequence is about to go (another conversation takes the
     * slot): to the store first, for when that conversation comes back. */
    if (d->kv.n - common > d->kv.n / 2) save_seq(d);
    common = bring_in(d, t, n, common);
    /* At least the last token is decoded again: its row gives the logits. */
    if (common == n) common = n - 1;
    if (common < d->kv.n) {
        if (!ks_engine_seq_rm(e, d->seq, common, -1)) {
            reset(d);
            common = 0;
        } else {
            ks_tokens_truncate(&d->kv, common);
        }
    }
    for (int p = common; p < n;) {
        int take = n - p < d->n_batch ? n - p : d->n_batch;
        ks_batch_clear(d->b);
        for (int j = 0; j < take; j++) ks_batch_add(d->b, t[p + j], p + j, d->seq, p + j == n - 1);
        if (ks_engine_decode(e, d->b) != 0 || ks_tokens_append(&d->kv, t + p, take)) {
            reset(d);
            return false;
        }
        if (p + take == n) *i_last = take - 1;
        int pre = n_pre - p < 0 ? 0 : n_pre - p > take ? take : n_pre - p;
        atomic_fetch_add(&d->c->prefilled, (uint64_t)pre);
        atomic_fetch_add(&d->c->followed, (uint64_t)(take - pre));
        p += take;
    }
    return true;
}

/* The draft's greedy token at batch index i and its probability. */
static int32_t argmax(ks_engine *e, int i, float *prob) {
    const float *lg = ks_engine_logits(e, i);
    int nv = ks_engine_n_vocab(e);
    if (!lg) return -1;
    int best = 0;
    for (int t = 1; t < nv; t++)
        if (lg[t] > lg[best]) best = t;
    if (prob) {
        double sum = 0.0;
        for (int t = 0; t < nv; t++) sum += exp((double)lg[t] - lg[best]);
        *prob = (float)(1.0 / sum);
    }
    return best;
}

static int draft(void *v, int32_t last, int n_max, int32_t *out) {
    dm *d = v;
    ks_engine *e = d->c->engine;
    if (d->off || d->hist.n == 0) return 0;
    int n_ctx = ks_engine_n_ctx_seq(e);
    if (d->hist.n + 1 + n_max > n_ctx) n_max = n_ctx - d->hist.n - 1;
    if (n_max <= 0) return 0;
    if (ks_tokens_push(&d->hist, last)) return 0;
    int i_last = 0;
    bool ok = catch_up(d, d->hist.v, d->hist.n, d->n_prompt, &i_last);
    d->n_prompt = 0; /* the prompt is in: what follows is generation's */
    d->hist.n--; /* `last` is the scheduler's to report (accept) */
    if (!ok) return 0;
    int n = 0, n_decoded = 0;
    float p;
    bool want_p = d->c->p_min > 0;
    double t0 = ks_now_ms();
    for (;;) {
        int32_t tok = argmax(e, i_last, want_p ? &p : NULL);
        if (tok < 0 || ks_engine_is_eog(e, tok) || (want_p && p < d->c->p_min)) break;
        out[n++] = tok;
        if (n == n_max) break;
        ks_batch_clear(d->b);
        ks_batch_add(d->b, tok, d->kv.n, d->seq, true);
        if (ks_engine_decode(e, d->b) != 0 || ks_tokens_push(&d->kv, tok)) {
            reset(d);
            break;
        }
        n_decoded++;
        i_last = 0;
    }
    if (n_decoded > 0) {
        double ms = (ks_now_ms() - t0) / n_decoded;
        d->tok_ms = d->tok_ms > 0 ? 0.75 * d->tok_ms + 0.25 * ms : ms;
    }
    atomic_fetch_add(&d->c->drafted, (uint64_t)n);
    return n;
}

static void accept(void *v, const int32_t *toks, int n, int n_drafted, int n_accepted) {
    (void)n_drafted;
    (void)n_accepted;
    dm *d = v;
    if (d->off) return;
    if (ks_tokens_append(&d->hist, toks, n)) {
        d->off = true; /* no memory: no drafts for this request */
        ks_tokens_truncate(&d->hist, 0);
    }
}

static double token_ms(void *v) { return ((dm *)v)->tok_ms; }

static const ks_drafter_ops k_ops = {create, destroy, begin, draft, accept, token_ms};

const ks_drafter_ops *ks_draft_model_ops(void) { return &k_ops; }

void ks_draft_model_cfg_fini(ks_draft_model_cfg *cfg) {
    if (!cfg) return;
    free(cfg->buf);
    cfg->buf = NULL;
    cfg->buf_cap = 0;
}

int ks_draft_model_same_vocab(const ks_engine *target, const ks_engine *draft, char *err, size_t n) {
    int nt = ks_engine_n_vocab(target), nd = ks_engine_n_vocab(draft);
    if (nt != nd) {
        ks_set_err(err, n, "the draft model has %d tokens, the model %d", nd, nt);
        return KS_EINVAL;
    }
    if (ks_engine_token_bos(target) != ks_engine_token_bos(draft) ||
        ks_engine_token_eos(target) != ks_engine_token_eos(draft)) {
        ks_set_err(err, n, "the draft model's BOS/EOS tokens (%d/%d) are not the model's (%d/%d)",
                   ks_engine_token_bos(draft), ks_engine_token_eos(draft), ks_engine_token_bos(target),
                   ks_engine_token_eos(target));
        return KS_EINVAL;
    }
    char a[256], b[256];
    for (int t = 0; t < nt; t++) {
        int la = ks_engine_token_text(target, t, a, sizeof a), lb = ks_engine_token_text(draft, t, b, sizeof b);
        if (la != lb || (la > 0 && la <= (int)sizeof a && memcmp(a, b, (size_t)la) != 0)) {
            if (la < 0 || la > (int)sizeof a) la = 0;
            if (lb < 0 || lb > (int)sizeof b) lb = 0;
            ks_set_err(err, n, "token %d: '%.*s' in the draft model, '%.*s' in the model", t, lb, b, la, a);
            return KS_EINVAL;
        }
    }
    return 0;
}

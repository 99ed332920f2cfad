/*
 * step.c — one decode step of the inference thread: which rows go into the
 * batch, the exactness rule, and sampling.
 *
 * NOTE ON EXACTNESS. ggml's CPU matrix multiply takes a different kernel for
 * a single row (ggml's vec_dot) than for two or more (llamafile's tinyBLAS).
 * In the prebuilt CPU backend the two round differently for F16 and F32
 * matrices (the KV cache's attention products among them).
 *
 * With the CPU backend setup builds (scripts/setup_cpu.sh: vec_dot patched to
 * sum in tinyBLAS's order) they agree, the engine's open-time probe says so
 * (ks_engine_batch_invariant), and none of what follows is needed: every row
 * of a batch computes the same bits whatever else is in it, so generated
 * tokens are decoded alone at full speed and stay exact. The rest of this
 * note is the fallback for a build that is not invariant (KS_GGML_CPU=prebuilt,
 * a CPU without AVX2/FMA): A token decoded alone — every generated
 * token, and the last token of a nearly fully cached prompt — would get K/V
 * and logits that differ in the last bits from the same token inside a
 * prefill, so a cached conversation would drift from an uncached one. With
 * tinyBLAS, each output element is summed in the same order whatever the
 * number of rows, so kvstash keeps every sequence at two or more rows in
 * every micro-batch: a lone token is decoded together with a throwaway copy
 * at the next position (causal attention: the real token never sees it),
 * whose KV cell is removed right after. Measured in docs/LLAMA_FACTS.md:
 * generated-token KV is then byte-identical to prefilled KV, and results do
 * not depend on what other slots are doing.
 *
 * llama.cpp splits a multi-sequence batch into micro-batches with an equal
 * number of rows per sequence; so that no sequence is left with a single
 * row in the last micro-batch, a decode call holds the generating slots
 * (two rows each) and at most one prefill chunk, never of exactly 3 rows.
 *
 * Invariant (sched.h, 3): a step holds one token per generating slot and at
 * most one prefill chunk, sized smaller while others generate, so a long
 * prefill never stalls the other streams for more than one step.
 *
 * Media (engine/media.h): a prompt's media run is decoded as embeddings,
 * which a token batch cannot carry, so a step that reaches one decodes up to
 * a chunk's worth of that run's rows (the prefill budget add_prefill would
 * give; never leaving a lone last row with pairs) in a call of its own and
 * nothing else: the generating slots wait one step, as they would for a text
 * chunk, and the run goes on at the next step. Text chunks end where a run
 * begins. A whole run (media.h note 2a: non-causal, Gemma 3) is never cut:
 * its step decodes all of it, up to n_batch rows, budget or not.
 *
 * Speculation (ks_sched_params.drafter). A generating slot whose drafter
 * proposes tokens d1..dk after its next token t0 puts t0, d1..dk in the
 * batch (positions n .. n + k, every row with logits), as a prefill chunk
 * of k + 1 rows would be. After the decode, row 0 is sampled exactly as
 * without a draft; while the token sampled at row j equals d(j+1), that
 * drafted token's row was computed from the very tokens the sequence holds,
 * so it is kept and row j + 1 is sampled next; at the first difference (or
 * the end of the request) the rows after the last kept one leave the KV
 * (ks_engine_seq_rm). The sampler sees the same rows in the same order as
 * one-token decoding (its RNG, grammar and penalties included), stop
 * strings, logprobs, max_tokens and cancellation apply per token as always,
 * and on a batch-invariant engine a row's bits do not depend on how many
 * rows its batch holds: a reply is the same with and without drafts. A
 * draft never crosses max_tokens (k < what is left to sample) or the
 * context, and the batch keeps one row for every generating slot (sched.h
 * invariant 3 with "one token" read as "one token and its draft").
 *
 * How much to draft. A verified drafted token costs a row of the batch
 * whether it is kept or not, and what a row costs depends on the hardware:
 * on a GPU (memory-bound) a few more rows are nearly free, on two CPU
 * cores with the bench model (0.5B, Q8_0) each costs most of a decode (docs/BENCHMARKS.md,
 * "Speculative decoding": 2 rows 1.6x, 5 rows 3.5x of one). So each step
 * verifies the k tokens of the draft (0..what the drafter proposed) that
 * maximise the expected tokens per millisecond,
 *     (G + E(k)) / c(R + k),   E(k) = 1 + p + ... + p^k,
 * where c(n) is the measured time of a decode of n rows (a moving average
 * per row count, cost_ms; a count not seen yet is interpolated from its
 * neighbours, and beyond the largest seen assumed to grow a tenth of a row
 * per row, so that larger drafts get tried once and measured), R the rows
 * of the step without this draft, G the tokens they yield (one per other
 * generating slot), and p the slot's acceptance estimate: (kept + 4) /
 * (kept + first rejections + 5), from counts decayed by 0.9 per verified
 * draft, so that it follows the text; the prior 0.8 says that an n-gram
 * match means repeating text. A step that verifies none of an offered draft
 * decays the counts by 0.98, so a slot whose drafts were rejected tries
 * again later instead of never. A drafter whose tokens cost a decode each
 * (a draft model: ks_drafter_ops.token_ms, its measured ms per token) is
 * asked for k tokens chosen the same way before it drafts, with k times
 * that cost added to c(R + k). With draft_adaptive false every draft is
 * verified whole.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched_int.h"

#define MOD "sched"

/* The text of a token, in s->piece (grown to fit: a token's text may be
 * longer than any fixed buffer); NULL when memory for it cannot be had. */
static const char *token_text(ks_sched *s, int32_t tok, int *len) {
    int n = ks_engine_piece(s->e, tok, s->piece, s->piece_cap);
    if (n > 0 && (size_t)n > s->piece_cap) {
        char *p = realloc(s->piece, (size_t)n);
        if (!p) return NULL;
        s->piece = p;
        s->piece_cap = (size_t)n;
        n = ks_engine_piece(s->e, tok, s->piece, s->piece_cap);
    }
    if (n < 0 || (size_t)n > s->piece_cap) return NULL;
    *len = n;
    return s->piece;
}

/* A request starts to generate: how much its slot drafts (note
 * "Speculation"), and the slot's drafter, made for the request's tenant
 * (one that saw another tenant's tokens is replaced), given the sequence. */
static void spec_start(ks_sched *s, slot *sl) {
    int cap = s->spec_on ? s->p.draft_max : 0;
    int want = sl->r->p.draft_max;
    if (want < 0) cap = 0;
    else if (want > 0 && want < cap) cap = want;
    sl->draft_cap = 0;
    if (cap <= 0) return;
    if (sl->drafter && sl->drafter_tenant != sl->r->p.tenant) {
        s->p.drafter->free(sl->drafter);
        sl->drafter = NULL;
    }
    if (!sl->drafter) sl->acc_hit = sl->acc_miss = 0; /* a new drafter: the prior again */
    if (!sl->drafter && !(sl->drafter = s->p.drafter->create(s->p.drafter_cfg, sl->id, sl->r->p.tenant))) {
        KS_WARN(MOD, "slot[%d]: no memory for a drafter: this request decodes without drafts", sl->id);
        return;
    }
    sl->drafter_tenant = sl->r->p.tenant;
    sl->draft_cap = cap;
    s->p.drafter->begin(sl->drafter, sl->tokens.v, sl->tokens.n);
}

/* How a sampled token ends the request, if it does (after_decode applies it). */
typedef struct ending {
    bool done;
    ks_finish f;
    int err;
    bool eog;
} ending;

#define ENDS(...) ((ending){.done = true, __VA_ARGS__})

/* Samples the slot's next token and hands it to the request (on_token):
 * returns how the request ends, or done = false when it goes on (next_tok
 * set). Nothing is decoded or saved here. */
static ending sample_slot(ks_sched *s, slot *sl) {
    sreq *r = sl->r;
    int32_t tok = ks_sampler_sample(sl->smpl, s->e, sl->i_logits);
    if (sl->state == ST_PREFILL) {
        r->t_first = ks_now_ms();
        if (r->p.want_logits) {
            const float *lg = ks_engine_logits(s->e, sl->i_logits);
            if (lg && s->logits_copy) {
                memcpy(s->logits_copy, lg, sizeof(float) * (size_t)ks_engine_n_vocab(s->e));
                r->res.logits = s->logits_copy;
            }
        }
        sl->state = ST_GEN;
        spec_start(s, sl);
    }
    if (tok < 0) {
        /* The grammar allows no next token (engine.h): the request's error.
         * Nothing was decoded for it, so the slot stays exact. */
        return ENDS(.f = KS_FINISH_ERROR, .err = KS_EINVAL);
    }
    if (ks_engine_is_eog(s->e, tok)) return ENDS(.f = KS_FINISH_STOP, .eog = true);
    sl->n_generated++;
    int n = 0;
    const char *piece = token_text(s, tok, &n);
    if (!piece) {
        /* The token is in no KV yet (it is decoded next step): the slot's
         * bookkeeping stays exact, only this request fails. */
        sl->n_generated--;
        return ENDS(.f = KS_FINISH_ERROR, .err = KS_ENOMEM);
    }
    if (r->p.ext && r->p.ext->n_probs > 0 && r->p.on_probs) {
        /* From the row's raw logits, still valid: nothing was decoded since. */
        ks_token_prob sampled;
        int n_top = ks_sampler_probs(sl->smpl, s->e, sl->i_logits, tok, &sampled, s->probs_top, r->p.ext->n_probs);
        r->p.on_probs(r->p.ud, &sampled, s->probs_top, n_top);
    }
    int stop = r->p.on_token ? r->p.on_token(r->p.ud, tok, piece, n) : 0;
    if (stop) return ENDS(.f = KS_FINISH_STOP);
    if (atomic_load(&r->cancel)) return ENDS(.f = KS_FINISH_CANCEL);
    if (sl->n_generated >= r->p.max_tokens) return ENDS(.f = KS_FINISH_LENGTH);
    sl->next_tok = tok;
    return (ending){.done = false};
}

/* Adds tokens [pos0, pos0 + n) of the slot (prompt tokens, or for a
 * generating slot its sampled token) to the batch so that the sequence
 * contributes at least two rows: a lone token gets a throwaway companion at
 * the next position, removed right after the decode (NOTE ON EXACTNESS). */
static void add_rows(ks_sched *s, ks_batch *b, slot *sl, const int32_t *toks, int pos0, int n, bool logits_last) {
    /* Text tokens: one KV position each from pos0's (media.h note 2). */
    int kv0 = ks__kv_pos(sl, pos0);
    for (int j = 0; j < n; j++) {
        int idx = ks_batch_add(b, toks[j], kv0 + j, sl->id, logits_last && j == n - 1);
        if (logits_last && j == n - 1) sl->i_logits = idx;
    }
    sl->pad_pos = -1;
    if (n == 1 && s->pairs) {
        ks_batch_add(b, toks[0], kv0 + 1, sl->id, false);
        sl->pad_pos = kv0 + 1;
    }
}

/* c(n) of note "How much to draft", in ms (> 0 once a decode was timed). */
static double cost_of(const ks_sched *s, int n) {
    enum { TOP = KS_DRAFT_MAX + 1 };
    if (n < 1) n = 1;
    if (n <= TOP && s->cost_ms[n] > 0) return s->cost_ms[n];
    int lo = n > TOP ? TOP : n - 1, hi = n + 1;
    while (lo >= 1 && s->cost_ms[lo] <= 0) lo--;
    while (hi <= TOP && s->cost_ms[hi] <= 0) hi++;
    if (lo < 1 && hi > TOP) return 1.0;             /* nothing timed yet */
    if (lo < 1) return s->cost_ms[hi] * n / hi;      /* below the least seen: proportional */
    if (hi > TOP) return s->cost_ms[lo] * (1.0 + 0.1 * (n - lo)); /* beyond: optimistic, tried once */
    return s->cost_ms[lo] + (s->cost_ms[hi] - s->cost_ms[lo]) * (n - lo) / (hi - lo);
}

/* Of the n tokens drafted (or, with tok_ms > 0, to draft at tok_ms each)
 * for sl, how many to verify (note "How much to draft"); rows: the step's
 * rows without them, others: tokens those yield besides this slot's own. */
static int draft_worth(const ks_sched *s, slot *sl, int n, int rows, int others, double tok_ms) {
    if (!s->p.draft_adaptive) return n;
    double p = (sl->acc_hit + 4.0) / (sl->acc_hit + sl->acc_miss + 5.0);
    double e = 1.0, pk = 1.0;
    double best = (others + e) / cost_of(s, rows);
    int k_best = 0;
    for (int k = 1; k <= n; k++) {
        pk *= p;
        e += pk;
        double v = (others + e) / (cost_of(s, rows + k) + k * tok_ms);
        if (v > best) best = v, k_best = k;
    }
    if (k_best == 0) { /* offered, not taken: the estimate drifts back to the prior */
        sl->acc_hit *= 0.98;
        sl->acc_miss *= 0.98;
    }
    return k_best;
}

/* The slot's draft for this step (note "Speculation") into sl->draft,
 * at most `room` tokens: none past max_tokens or the context; rows and
 * others as draft_worth takes them. */
static void draft_slot(ks_sched *s, slot *sl, int room, int rows, int others) {
    sl->n_draft = 0;
    if (sl->draft_cap <= 0) return;
    int n_max = sl->draft_cap;
    int left = sl->r->p.max_tokens - sl->n_generated - 1; /* samples after next_tok's */
    int ctx = s->n_ctx_seq - ks__kv_pos(sl, sl->tokens.n) - 1;
    if (n_max > left) n_max = left;
    if (n_max > ctx) n_max = ctx;
    if (n_max > room) n_max = room;
    if (n_max <= 0 || n_max < s->p.draft_min) return;
    /* A drafter whose tokens cost (a draft model) is asked only for what
     * is worth it; an n-gram lookup drafts first and is cut after. */
    bool costly = s->p.drafter->token_ms != NULL;
    if (costly) {
        n_max = draft_worth(s, sl, n_max, rows, others, s->p.drafter->token_ms(sl->drafter));
        if (n_max <= 0 || n_max < s->p.draft_min) return;
    }
    int n = s->p.drafter->draft(sl->drafter, sl->next_tok, n_max, sl->draft);
    if (n > n_max) n = n_max;
    /* Only text tokens of the vocabulary: an n-gram copied from a prompt
     * with images holds media pseudo-tokens (engine/media.h), which no
     * token batch can carry. */
    int nv = ks_engine_n_vocab(s->e);
    for (int j = 0; j < n; j++)
        if (sl->draft[j] < 0 || sl->draft[j] >= nv) n = j;
    if (n < s->p.draft_min) n = 0; /* (a negative count too) */
    if (n > 0 && !costly) n = draft_worth(s, sl, n, rows, others, 0.0);
    sl->n_draft = n >= s->p.draft_min ? n : 0; /* what is worth it may be shorter still */
}

/* One token per generating slot (and its draft); returns how many slots.
 * Canceled requests end here. */
static int add_generating(ks_sched *s, ks_batch *b) {
    int n_gen = 0, n_left = 0;
    for (int i = 0; i < s->n_slots; i++) n_left += s->slots[i].state == ST_GEN;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        sl->in_batch = false;
        sl->i_logits = -1;
        sl->chunk = 0;
        sl->pad_pos = -1;
        sl->n_draft = 0;
        if (sl->state == ST_IDLE) continue;
        if (atomic_load(&sl->r->cancel)) {
            n_left -= sl->state == ST_GEN;
            ks__sched_finish(s, sl, KS_FINISH_CANCEL, 0, false);
            continue;
        }
        if (sl->state != ST_GEN) continue;
        n_left--;
        draft_slot(s, sl, s->n_batch - ks_batch_n(b) - 1 - n_left, ks_batch_n(b) + 1 + n_left, n_gen + n_left);
        if (sl->n_draft > 0) {
            int kv0 = ks__kv_pos(sl, sl->tokens.n);
            sl->i_logits = ks_batch_add(b, sl->next_tok, kv0, sl->id, true);
            for (int j = 0; j < sl->n_draft; j++) ks_batch_add(b, sl->draft[j], kv0 + 1 + j, sl->id, true);
        } else {
            add_rows(s, b, sl, &sl->next_tok, sl->tokens.n, 1, true);
        }
        sl->in_batch = true;
        n_gen++;
    }
    return n_gen;
}

/* The first media run at or after prompt position p: its start, or n. */
static int next_media(const sreq *r, int p) {
    const ks_media_set *m = r->p.media;
    for (int k = 0, n = ks_media_set_n_runs(m); k < n; k++) {
        int pos, len;
        ks_media_set_run(m, k, &pos, &len);
        if (pos + len > p) return pos > p ? pos : p;
    }
    return r->prompt.n;
}

/* A prefilling slot (round-robin) whose next prompt rows are a media run's:
 * decodes the rest of that run (the step's only decode) and returns true. */
static bool media_step(ks_sched *s) {
    for (int k = 0; k < s->n_slots; k++) {
        slot *sl = &s->slots[(s->prefill_rr + k) % s->n_slots];
        if (sl->state != ST_PREFILL || !sl->r->p.media || atomic_load(&sl->r->cancel)) continue;
        sreq *r = sl->r;
        int run = ks_media_set_find(r->p.media, sl->n_past);
        if (run < 0) continue;
        int pos, len;
        ks_media_set_run(r->p.media, run, &pos, &len);
        int end = pos + len, rc = 0;
        if (ks_media_set_run_whole(r->p.media, run)) {
            /* A whole run (media.h note 2a) is one decode of all its rows,
             * whatever the budget (a non-causal one fits n_batch:
             * ks_media_tokenize; an M-RoPE image takes calls of n_batch), and no
             * reuse, restore or pin ever ends inside it (ks_media_set_cut in
             * policy.c), so the slot is at its start. */
            if (sl->n_past != pos) {
                KS_ERROR(MOD, "slot %d at %d, inside a whole media run [%d, %d)", sl->id, sl->n_past, pos, end);
                rc = KS_EINVAL;
            }
        } else {
            /* add_prefill's budget: smaller while others generate */
            int budget = s->n_batch;
            for (int i = 0; i < s->n_slots; i++)
                if (s->slots[i].state == ST_GEN) budget = s->n_batch / 4 > 64 ? s->n_batch / 4 : 64;
            if (budget > s->n_batch) budget = s->n_batch;
            if (end - sl->n_past > budget) end = sl->n_past + budget;
            if (s->pairs && pos + len - end == 1) end--; /* no lone row left: budget >= 4 */
            /* A cache pin inside the run ends the rows there, as it ends a text
             * chunk (its state then ends inside the run: media.h note 3). */
            int pin = ks__policy_pin_next(r, sl->n_past);
            if (pin > sl->n_past && pin < end) end = pin;
        }
        s->prefill_rr = (sl->id + 1) % s->n_slots;
        if (!rc) rc = ks_media_decode(s->e, r->p.media, run, sl->n_past, end, sl->id, s->pairs, NULL);
        if (rc == 0 && ks_tokens_append(&sl->tokens, r->prompt.v + sl->n_past, end - sl->n_past)) rc = KS_ENOMEM;
        if (rc) {
            KS_ERROR(MOD, "media rows [%d, %d) of slot %d: %s", sl->n_past, end, sl->id, ks_strerror(rc));
            ks__sched_fail(s, sl, rc); /* the sequence may hold part of the run: dropped */
            return true;
        }
        sl->n_past = end;
        sl->snap_store = -1;
        if (r->p.on_progress) r->p.on_progress(r->p.ud, sl->n_past, r->prompt.n);
        ks__policy_chunk_done(s, sl);
        return true;
    }
    return false;
}

/* One prefill chunk, round-robin among prefilling slots. While others
 * generate, keep it small so their streams keep flowing. */
static void add_prefill(ks_sched *s, ks_batch *b, int n_gen) {
    int budget = s->n_batch - ks_batch_n(b);
    if (n_gen > 0) {
        int cap = s->n_batch / 4 > 64 ? s->n_batch / 4 : 64;
        if (budget > cap) budget = cap;
    }
    for (int k = 0; k < s->n_slots && budget >= 2; k++) {
        slot *sl = &s->slots[(s->prefill_rr + k) % s->n_slots];
        if (sl->state != ST_PREFILL) continue;
        sreq *r = sl->r;
        int remaining = (r->p.media ? next_media(r, sl->n_past) : r->prompt.n) - sl->n_past;
        if (remaining <= 0) continue; /* a media run: media_step's */
        int take = ks__policy_chunk(s, sl, remaining < budget ? remaining : budget, budget);
        if (n_gen > 0 && take == 3) take = 2; /* see the note: never 3 beside 2-row sequences */
        if (sl->snap_store != sl->n_past + take) sl->snap_store = -1;
        add_rows(s, b, sl, r->prompt.v + sl->n_past, sl->n_past, take, sl->n_past + take == r->prompt.n);
        sl->chunk = take;
        sl->in_batch = true;
        s->prefill_rr = (sl->id + 1) % s->n_slots;
        return;
    }
}

/* After a successful decode: the slot's token list takes what was decoded
 * (S1); then the token is sampled and handed to the client, and only then
 * come the save points (snapshots, checkpoints: the sequence is still
 * exactly the token list, sampling decodes nothing), so that they never
 * delay a token — the first one included, after a prompt's last chunk; and
 * last the request's end, if the token ended it (its finish save and pins
 * come after the save points). */
/* A generating slot's rows after its decode (note "Speculation"): samples
 * row 0, then each drafted row while the draft agrees with what was
 * sampled; keeps the agreeing drafted tokens (in the token list, after
 * next_tok, which the caller appended) and removes the rest from the KV.
 * Returns how the request ends, as sample_slot; *n_acc: tokens kept. */
static ending verify(ks_sched *s, slot *sl, int *n_acc, bool *broken) {
    int base = sl->i_logits, acc = 0;
    ending e;
    *broken = false;
    for (int j = 0;; j++) {
        sl->i_logits = base + j;
        e = sample_slot(s, sl);
        if (e.done || j == sl->n_draft || sl->next_tok != sl->draft[j]) break;
        if (ks_tokens_push(&sl->tokens, sl->draft[j])) {
            *broken = true;
            e = ENDS(.f = KS_FINISH_ERROR, .err = KS_ENOMEM);
            break;
        }
        acc++;
    }
    /* The sequence keeps exactly the token list (S1): rows of drafted tokens
     * past the first difference go. */
    if (acc < sl->n_draft && !ks_engine_seq_rm(s->e, sl->id, ks__kv_pos(sl, sl->tokens.n), -1)) {
        *broken = true;
        e = ENDS(.f = KS_FINISH_ERROR, .err = KS_EIO);
    }
    sreq *r = sl->r;
    r->res.n_drafted += sl->n_draft;
    r->res.n_draft_accepted += acc;
    sl->acc_hit = 0.9 * sl->acc_hit + acc;
    sl->acc_miss = 0.9 * sl->acc_miss + (acc < sl->n_draft);
    r->draft_steps++;
    s->p.drafter->accept(sl->drafter, sl->tokens.v + sl->tokens.n - 1 - acc, acc + 1, sl->n_draft, acc);
    *n_acc = acc;
    return e;
}

static void after_decode(ks_sched *s, slot *sl) {
    bool gen = sl->state == ST_GEN;
    int n_decoded = sl->n_generated; /* before the next token is sampled */
    sreq *r = sl->r;
    if (gen) {
        if (ks_tokens_push(&sl->tokens, sl->next_tok)) {
            if (sl->n_draft > 0) ks_engine_seq_rm(s->e, sl->id, ks__kv_pos(sl, sl->tokens.n), -1);
            ks__sched_fail(s, sl, KS_ENOMEM);
            return;
        }
        if (sl->n_draft > 0) {
            int acc = 0;
            bool broken;
            ending e = verify(s, sl, &acc, &broken);
            if (broken) {
                ks__sched_fail(s, sl, e.err); /* the KV may hold more than the list: dropped */
                return;
            }
            ks__policy_token_done(s, sl, n_decoded - 1, n_decoded + acc);
            if (e.done) ks__sched_finish(s, sl, e.f, e.err, e.eog);
            return;
        }
        if (sl->draft_cap > 0) s->p.drafter->accept(sl->drafter, &sl->next_tok, 1, 0, 0);
    } else {
        if (ks_tokens_append(&sl->tokens, r->prompt.v + sl->n_past, sl->chunk)) {
            ks__sched_fail(s, sl, KS_ENOMEM);
            return;
        }
        sl->n_past += sl->chunk;
        if (r->p.on_progress) r->p.on_progress(r->p.ud, sl->n_past, r->prompt.n);
    }
    ending e = sl->i_logits >= 0 ? sample_slot(s, sl) : (ending){.done = false};
    if (gen)
        ks__policy_token_done(s, sl, n_decoded - 1, n_decoded);
    else
        ks__policy_chunk_done(s, sl);
    if (e.done) ks__sched_finish(s, sl, e.f, e.err, e.eog);
}

void ks__step(ks_sched *s) {
    ks_batch *b = s->batch;
    ks_batch_clear(b);
    if (media_step(s)) return;
    int n_gen = add_generating(s, b);
    add_prefill(s, b, n_gen);
    if (ks_batch_n(b) == 0) return;
    KS_ASSERT(ks_batch_n(b) <= s->n_batch); /* sched.h invariant 3 */

    double t0 = s->spec_on ? ks_now_ms() : 0;
    int rc = ks_engine_decode(s->e, b);
    if (s->spec_on && rc == 0) { /* note "How much to draft" */
        int n = ks_batch_n(b);
        double dt = ks_now_ms() - t0;
        if (n <= KS_DRAFT_MAX + 1) s->cost_ms[n] = s->cost_ms[n] > 0 ? 0.75 * s->cost_ms[n] + 0.25 * dt : dt;
    }
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->in_batch && sl->pad_pos >= 0) ks_engine_seq_rm(s->e, sl->id, sl->pad_pos, -1);
    }
    if (rc != 0) {
        KS_ERROR(MOD, "decode of %d tokens failed: %s", ks_batch_n(b), ks_strerror(rc));
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].in_batch && s->slots[i].state != ST_IDLE) ks__sched_fail(s, &s->slots[i], rc);
        return;
    }
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->in_batch && sl->state != ST_IDLE) after_decode(s, sl);
    }
}

/*
 * drafter.h — the interface of a source of drafts for speculative decoding
 * (ks_sched_params.drafter; sched.h, step.c "Speculation"). Plain C and
 * free of the scheduler's other types, so that a C++ drafter
 * (draft_ngram.cpp) can include it.
 *
 * Thread model: every call on the scheduler's inference thread.
 */
#ifndef KS_DRAFTER_H
#define KS_DRAFTER_H

#include <stdint.h>

/* A source of drafts (speculative decoding), one instance per slot, all
 * calls on the inference thread. The tokens a drafter sees are exactly the
 * slot's sequence: begin gets the whole of it when a request starts to
 * generate, accept every token decoded after that. */
typedef struct ks_drafter_ops {
    /* for the scheduler's slot `slot` and the tenant whose requests it serves
     * (a drafter never sees another tenant's tokens); NULL: no memory */
    void *(*create)(void *cfg, int slot, uint64_t tenant);
    void (*free)(void *d);
    void (*begin)(void *d, const int32_t *toks, int n);
    /* Up to n_max tokens likely to follow the sequence and then `last`
     * (sampled, not yet decoded) into out; returns how many (0: none). */
    int (*draft)(void *d, int32_t last, int n_max, int32_t *out);
    /* toks[0, n) were decoded after the sequence (last and the accepted
     * drafted tokens); n_drafted > 0: a draft of that many was verified and
     * n_accepted of it kept. */
    void (*accept)(void *d, const int32_t *toks, int n, int n_drafted, int n_accepted);
    /* Optional (NULL: drafting costs nothing worth counting, as an n-gram
     * lookup): what drafting costs per drafted token, in ms, as the drafter
     * measured it (0 before it knows). With it the scheduler decides how many
     * tokens to ask for before asking (step.c "How much to draft"): a draft
     * model's tokens cost a decode each, whether they are verified or not. */
    double (*token_ms)(void *d);
} ks_drafter_ops;

/* The most tokens a drafter may propose in one step. */
#define KS_DRAFT_MAX 64

#endif

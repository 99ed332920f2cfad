/*
 * admit.h — what a request may cost before it is admitted (issue 28): the
 * template renders and grammar builds run at most `max_renders` at a time
 * (a counting semaphore; the others wait their turn on their HTTP thread),
 * and the counts that show work done or avoided: renders, grammar builds,
 * and requests refused by the size bound before any render (plan.c,
 * prompt/presize.h). /metrics shows them (kvstash_template_renders_total,
 * kvstash_grammar_builds_total, kvstash_refused_before_render_total,
 * kvstash_renders_running, kvstash_renders_waiting).
 *
 * Invariants
 *  1. At most max renders or grammar builds run at once (running <= max).
 *  2. Every ks_admit_enter is followed by one ks_admit_leave on the same
 *     thread.
 *
 * Thread model: any HTTP thread; the counters are atomics, the semaphore a
 * mutex and a condition variable.
 */
#ifndef KS_ADMIT_H
#define KS_ADMIT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "server/metrics.h"

#define KS_ADMIT_DEFAULT 2   /* renders at once unless max_renders says otherwise */
#define KS_ADMIT_MAX 1024

typedef enum { KS_ADMIT_RENDER = 0, KS_ADMIT_GRAMMAR } ks_admit_kind;

typedef struct ks_admit {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int max, running, waiting;
    _Atomic uint64_t renders, grammars, refused;
} ks_admit;

/* max: 1..KS_ADMIT_MAX (out of range: KS_ADMIT_DEFAULT). 0 or KS_ENOMEM. */
int ks_admit_init(ks_admit *a, int max);
/* Frees the semaphore; nothing may be inside. */
void ks_admit_fini(ks_admit *a);
/* Waits for a free place, then counts one render or grammar build. */
void ks_admit_enter(ks_admit *a, ks_admit_kind kind);
void ks_admit_leave(ks_admit *a);
/* Counts a request refused by the size bound before any render. */
void ks_admit_note_refused(ks_admit *a);
/* The /metrics source (ud: ks_admit). */
void ks_metrics_admit(void *ud, ks_prom *p);

#endif

/*
 * run_util.h — a request run to completion through the scheduler, for the
 * model tests: collects the sampled tokens and the result, and waits.
 */
#ifndef KS_TEST_RUN_UTIL_H
#define KS_TEST_RUN_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    ks_req_result res;
    ks_tokens out;
} run;

static inline int run_on_token(void *ud, int32_t tok, const char *piece, int len) {
    (void)piece;
    (void)len;
    ks_tokens_push(&((run *)ud)->out, tok);
    return 0;
}

static inline void run_on_done(void *ud, const ks_req_result *r) {
    run *x = ud;
    pthread_mutex_lock(&x->mu);
    x->res = *r;
    x->res.logits = NULL; /* borrowed only during on_done */
    x->done = true;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* The chat prompt of m[0, n) under the model's template, tokenized into out
 * (replaced): 0, or the first error. */
static inline int run_prompt(const ks_engine *e, const ks_msg *m, int n, ks_tokens *out) {
    char *text = NULL;
    int rc = ks_engine_template(e, m, (size_t)n, true, &text);
    out->n = 0;
    if (rc == 0) rc = ks_engine_tokenize(e, text, strlen(text), true, true, out);
    free(text);
    return rc;
}

static inline void run_init(run *x) {
    memset(x, 0, sizeof *x);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
}

static inline void run_wait(run *x) {
    pthread_mutex_lock(&x->mu);
    while (!x->done) pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
}

static inline void run_free(run *x) {
    ks_tokens_free(&x->out);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
}

#endif

/*
 * admit.c — see admit.h.
 */
#include "server/admit.h"

#include "base/base.h"

int ks_admit_init(ks_admit *a, int max) {
    a->max = max >= 1 && max <= KS_ADMIT_MAX ? max : KS_ADMIT_DEFAULT;
    a->running = a->waiting = 0;
    atomic_init(&a->renders, 0);
    atomic_init(&a->grammars, 0);
    atomic_init(&a->refused, 0);
    if (pthread_mutex_init(&a->mu, NULL) != 0) return KS_ENOMEM;
    if (pthread_cond_init(&a->cv, NULL) != 0) {
        pthread_mutex_destroy(&a->mu);
        return KS_ENOMEM;
    }
    return 0;
}

void ks_admit_fini(ks_admit *a) {
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
}

void ks_admit_enter(ks_admit *a, ks_admit_kind kind) {
    pthread_mutex_lock(&a->mu);
    a->waiting++;
    while (a->running >= a->max) pthread_cond_wait(&a->cv, &a->mu);
    a->waiting--;
    a->running++;
    pthread_mutex_unlock(&a->mu);
    atomic_fetch_add(kind == KS_ADMIT_RENDER ? &a->renders : &a->grammars, 1);
}

void ks_admit_leave(ks_admit *a) {
    pthread_mutex_lock(&a->mu);
    a->running--;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void ks_admit_note_refused(ks_admit *a) { atomic_fetch_add(&a->refused, 1); }

void ks_metrics_admit(void *ud, ks_prom *p) {
    ks_admit *a = ud;
    pthread_mutex_lock(&a->mu);
    int running = a->running, waiting = a->waiting;
    pthread_mutex_unlock(&a->mu);
    ks_prom_counter(p, "kvstash_template_renders_total", "Chat template renders (prompts, breakpoints, counts).",
                    (double)atomic_load(&a->renders));
    ks_prom_counter(p, "kvstash_grammar_builds_total", "JSON schema to grammar conversions outside a render.",
                    (double)atomic_load(&a->grammars));
    ks_prom_counter(p, "kvstash_refused_before_render_total",
                    "Requests refused as longer than the context from their size alone, before any render.",
                    (double)atomic_load(&a->refused));
    ks_prom_gauge(p, "kvstash_renders_running", "Renders and grammar builds running now (at most max_renders).",
                  (double)running);
    ks_prom_gauge(p, "kvstash_renders_waiting", "Requests waiting for a render place.", (double)waiting);
}

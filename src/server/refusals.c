/*
 * refusals.c — the log of refused requests. See refusals.h.
 */
#include "server/refusals.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define MOD "http"

typedef struct cause {
    uint64_t hash; /* 0: free */
    uint64_t count;
} cause;

struct ks_refusals {
    pthread_mutex_t mu;
    cause tab[KS_REFUSALS_MAX];
    int n;
};

ks_refusals *ks_refusals_create(void) {
    ks_refusals *r = calloc(1, sizeof *r);
    if (r) pthread_mutex_init(&r->mu, NULL);
    return r;
}

void ks_refusals_free(ks_refusals *r) {
    if (!r) return;
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* FNV-1a over s, digits folded to one '#' per run (array indices). */
static uint64_t mix(uint64_t h, const char *s) {
    bool in_num = false;
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= '0' && c <= '9') {
            if (in_num) continue;
            in_num = true;
            c = '#';
        } else {
            in_num = false;
        }
        h = (h ^ c) * 1099511628211ull;
    }
    return (h ^ 0xff) * 1099511628211ull; /* a separator, so "ab","c" differs from "a","bc" */
}

static bool power_of_ten(uint64_t n) {
    while (n >= 10 && n % 10 == 0) n /= 10;
    return n == 1;
}

/* How many times the cause h has been seen, this time included; 0 when the
 * table is full and h is not in it. */
static uint64_t count(ks_refusals *r, uint64_t h) {
    if (!h) h = 1;
    uint64_t n = 0;
    pthread_mutex_lock(&r->mu);
    size_t i = (size_t)(h % KS_REFUSALS_MAX);
    for (int probe = 0; probe < KS_REFUSALS_MAX; probe++, i = (i + 1) % KS_REFUSALS_MAX) {
        if (r->tab[i].hash == h) {
            n = ++r->tab[i].count;
            break;
        }
        if (!r->tab[i].hash) {
            if (r->n < KS_REFUSALS_MAX * 3 / 4) { /* keep probes short: a full table remembers no more */
                r->tab[i].hash = h;
                r->tab[i].count = n = 1;
                r->n++;
            }
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

uint64_t ks_refusals_note(ks_refusals *r, const char *method, const char *path, int status, const char *code,
                          const char *param, const char *message) {
    if (!r) return 0;
    char st[16];
    snprintf(st, sizeof st, "%d", status);
    uint64_t n = count(r, mix(mix(mix(mix(mix(14695981039346656037ull, method), path), st), code), param));
    const char *pm = param && param[0] ? param : "-";
    const char *cd = code && code[0] ? code : "-";
    /* n == 0: not remembered (table full); logged every time. */
    if (n <= 1)
        KS_WARN(MOD, "%s %s -> %d %s (%s): %s", method, path, status, cd, pm, message ? message : "");
    else if (power_of_ten(n))
        KS_WARN(MOD, "%s %s -> %d %s (%s): %s [refused %llu times so far]", method, path, status, cd, pm,
                message ? message : "", (unsigned long long)n);
    else
        KS_DEBUG(MOD, "%s %s -> %d %s (%s): %s", method, path, status, cd, pm, message ? message : "");
    return n ? n : 1;
}

uint64_t ks_refusals_ignored(ks_refusals *r, const char *method, const char *path, const char *field,
                             const char *what) {
    if (!r) return 0;
    uint64_t n = count(r, mix(mix(mix(mix(14695981039346656037ull, method), path), field), what));
    if (n <= 1)
        KS_WARN(MOD, "%s %s: ignored %s '%s' (docs/SERVER.md, request fields)", method, path, what, field);
    else if (power_of_ten(n))
        KS_WARN(MOD, "%s %s: ignored %s '%s' [%llu times so far]", method, path, what, field, (unsigned long long)n);
    else
        KS_DEBUG(MOD, "%s %s: ignored %s '%s'", method, path, what, field);
    return n ? n : 1;
}

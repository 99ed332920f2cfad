/*
 * hdrwatch.c — see hdrwatch.h.
 */
#include "server/hdrwatch.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/base.h"

#define MOD "http"

struct ks_hdrwatch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    double deadline_ms;
    double idle_ms; /* 0: none */
    int per_addr;
    ks_hdrconn head; /* a ring: head.next is the oldest open */
    pthread_t thread;
    _Atomic uint64_t cut;
};

/* Under mu: cuts c's socket (both ways); its connection's thread sees the
 * end and closes it. Once. */
static void cut(ks_hdrwatch *w, ks_hdrconn *c, const char *why) {
    if (c->fd < 0) return;
    shutdown(c->fd, SHUT_RDWR);
    c->fd = -1;
    uint64_t n = atomic_fetch_add(&w->cut, 1) + 1;
    if ((n & (n - 1)) == 0) KS_WARN(MOD, "closed a connection %s [%llu so far]", why, (unsigned long long)n);
}

static void *run(void *arg) {
    ks_hdrwatch *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 250 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        double now = ks_now_ms();
        for (ks_hdrconn *c = w->head.next; c != &w->head; c = c->next) {
            if (c->fd < 0) continue;
            char why[96];
            if (c->phase == 0 && now - c->t0 > w->deadline_ms) {
                snprintf(why, sizeof why, "whose request headers took longer than %.0f s (--header-timeout)",
                         w->deadline_ms / 1000);
                cut(w, c, why);
            } else if (c->phase == 2 && w->idle_ms > 0 && now - c->t0 > w->idle_ms) {
                snprintf(why, sizeof why, "idle between requests longer than %.0f s (--timeout)", w->idle_ms / 1000);
                cut(w, c, why);
            }
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int ks_hdrwatch_start(unsigned deadline_s, unsigned idle_s, int per_addr, ks_hdrwatch **out) {
    *out = NULL;
    ks_hdrwatch *w = calloc(1, sizeof *w);
    if (!w) return KS_ENOMEM;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->deadline_ms = deadline_s * 1000.0;
    w->per_addr = per_addr;
    w->idle_ms = idle_s * 1000.0;
    w->head.next = w->head.prev = &w->head;
    if (pthread_create(&w->thread, NULL, run, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return KS_EIO;
    }
    *out = w;
    return 0;
}

void ks_hdrwatch_stop(ks_hdrwatch *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    while (w->head.next != &w->head) {
        ks_hdrconn *c = w->head.next;
        c->prev->next = c->next;
        c->next->prev = c->prev;
        free(c);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

ks_hdrconn *ks_hdrwatch_open(ks_hdrwatch *w, int fd, const void *addr, int addr_len) {
    ks_hdrconn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (addr && addr_len > 0 && addr_len <= (int)sizeof c->addr) {
        memcpy(c->addr, addr, (size_t)addr_len);
        c->addr_len = addr_len;
    }
    c->fd = fd;
    c->t0 = ks_now_ms();
    pthread_mutex_lock(&w->mu);
    if (w->per_addr > 0 && c->addr_len) {
        /* The address's live connections (the list runs oldest first). */
        int n = 0;
        ks_hdrconn *oldest = NULL, *oldest_idle = NULL;
        for (ks_hdrconn *o = w->head.next; o != &w->head; o = o->next) {
            if (o->fd < 0 || o->addr_len != c->addr_len || memcmp(o->addr, c->addr, (size_t)c->addr_len)) continue;
            n++;
            if (o->phase == 0 && !oldest) oldest = o;
            if (o->phase == 2 && (!oldest_idle || o->t0 < oldest_idle->t0)) oldest_idle = o;
        }
        if (n >= w->per_addr) {
            if (oldest) cut(w, oldest, "awaiting its headers, for a new one from its address (at its cap)");
            else if (oldest_idle) cut(w, oldest_idle, "idle, for a new one from its address (at its cap)");
            else cut(w, c, "beyond its address's cap (every one of the address's is in a request)");
        }
    }
    c->prev = w->head.prev;
    c->next = &w->head;
    w->head.prev->next = c;
    w->head.prev = c;
    pthread_mutex_unlock(&w->mu);
    return c;
}

static void set_phase(ks_hdrwatch *w, ks_hdrconn *c, int phase, bool restart) {
    if (!c) return;
    pthread_mutex_lock(&w->mu);
    if (restart) c->t0 = ks_now_ms();
    c->phase = phase;
    pthread_mutex_unlock(&w->mu);
}

void ks_hdrwatch_request_line(ks_hdrwatch *w, ks_hdrconn *c) {
    if (c && c->phase == 2) set_phase(w, c, 0, true);
}

void ks_hdrwatch_headers(ks_hdrwatch *w, ks_hdrconn *c) { set_phase(w, c, 1, false); }

void ks_hdrwatch_done(ks_hdrwatch *w, ks_hdrconn *c) { set_phase(w, c, 2, true); }

void ks_hdrwatch_close(ks_hdrwatch *w, ks_hdrconn *c) {
    if (!c) return;
    pthread_mutex_lock(&w->mu);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    pthread_mutex_unlock(&w->mu);
    free(c);
}

uint64_t ks_hdrwatch_cut(const ks_hdrwatch *w) { return w ? atomic_load(&w->cut) : 0; }

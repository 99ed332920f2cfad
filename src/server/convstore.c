/*
 * convstore.c — see convstore.h. A ring of entries in insertion order:
 * expiry and the count bound both drop from the oldest end, so a linear
 * lookup over at most max_entries ids is all it needs.
 */
#include "server/convstore.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

typedef struct entry {
    char id[64];
    uint64_t tenant;
    json_t *msgs;
    int64_t expires_us;
} entry;

struct ks_convstore {
    pthread_mutex_t mu;
    entry *ring;
    int cap, head, n; /* ring[(head + i) % cap], i < n, oldest first */
    int ttl_s;
};

ks_convstore *ks_convstore_create(int max_entries, int ttl_s) {
    ks_convstore *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->cap = max_entries > 0 && ttl_s > 0 ? max_entries : 0;
    cs->ttl_s = ttl_s;
    if (cs->cap && !(cs->ring = calloc((size_t)cs->cap, sizeof *cs->ring))) {
        free(cs);
        return NULL;
    }
    pthread_mutex_init(&cs->mu, NULL);
    return cs;
}

static void drop_oldest(ks_convstore *cs) {
    entry *e = &cs->ring[cs->head];
    json_decref(e->msgs);
    memset(e, 0, sizeof *e);
    cs->head = (cs->head + 1) % cs->cap;
    cs->n--;
}

static void expire(ks_convstore *cs, int64_t now) {
    while (cs->n && cs->ring[cs->head].expires_us <= now) drop_oldest(cs);
}

void ks_convstore_free(ks_convstore *cs) {
    if (!cs) return;
    while (cs->n) drop_oldest(cs);
    free(cs->ring);
    pthread_mutex_destroy(&cs->mu);
    free(cs);
}

int ks_convstore_put(ks_convstore *cs, const char *id, uint64_t tenant, json_t *msgs) {
    if (!cs->cap) {
        json_decref(msgs);
        return 0;
    }
    pthread_mutex_lock(&cs->mu);
    int64_t now = ks_now_us();
    expire(cs, now);
    if (cs->n == cs->cap) drop_oldest(cs);
    entry *e = &cs->ring[(cs->head + cs->n) % cs->cap];
    snprintf(e->id, sizeof e->id, "%s", id);
    e->tenant = tenant;
    e->msgs = msgs;
    e->expires_us = now + (int64_t)cs->ttl_s * 1000000;
    cs->n++;
    pthread_mutex_unlock(&cs->mu);
    return 0;
}

json_t *ks_convstore_get(ks_convstore *cs, const char *id, uint64_t tenant) {
    json_t *m = NULL;
    if (!cs->cap) return NULL;
    pthread_mutex_lock(&cs->mu);
    expire(cs, ks_now_us());
    for (int i = 0; i < cs->n && !m; i++) {
        entry *e = &cs->ring[(cs->head + i) % cs->cap];
        if (!strcmp(e->id, id) && e->tenant == tenant) m = json_incref(e->msgs);
    }
    pthread_mutex_unlock(&cs->mu);
    return m;
}

int ks_convstore_ttl(const ks_convstore *cs) { return cs->ttl_s; }

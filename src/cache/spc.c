/*
 * spc.c — see spc.h.
 *
 * NOTES ON THE DESIGN
 *  - The index is a doubly linked list in LRU order (head = most recently
 *    used). System prompts are few (one per distinct system prompt and model),
 *    so a linear lookup costs less than the state restore it guards.
 *  - A node is in one of three states: linked (indexed, counted in bytes),
 *    unlinked with references (evicted or replaced while being read; freed by
 *    the last release), or freed. `linked` and `refs` change only under mu.
 *  - Allocation and the token copy happen before the lock is taken, so the
 *    lock is never held across malloc of a large size.
 */
#include "cache/spc.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct node {
    ks_spc_entry pub; /* first member: a ks_spc_entry pointer is a node pointer */
    int64_t size;     /* len + 4 * n_tokens */
    int64_t last_used_us;
    uint64_t hits;
    int refs;
    bool linked;
    struct node *prev, *next;
} node;

struct ks_spc {
    pthread_mutex_t mu;
    node *head, *tail;
    ks_spc_stats st;
};

static void node_free(node *n) {
    ks_tokens_free(&n->pub.tokens);
    free((void *)n->pub.blob);
    free(n);
}

static void list_unlink(ks_spc *s, node *n) {
    if (n->prev) n->prev->next = n->next;
    else s->head = n->next;
    if (n->next) n->next->prev = n->prev;
    else s->tail = n->prev;
    n->prev = n->next = NULL;
}

static void list_push_head(ks_spc *s, node *n) {
    n->prev = NULL;
    n->next = s->head;
    if (s->head) s->head->prev = n;
    s->head = n;
    if (!s->tail) s->tail = n;
}

/* Removes n from the index; frees it unless someone holds a reference. */
static void drop(ks_spc *s, node *n) {
    list_unlink(s, n);
    n->linked = false;
    s->st.bytes -= n->size;
    s->st.entries--;
    if (n->refs == 0) node_free(n);
}

/* Invariants 1 and 2 (spc.h), under mu (KS_ASSERT): bytes and entries are
 * the linked nodes' sum and count, within max_bytes, one node per key. */
__attribute__((unused)) static bool index_ok_locked(const ks_spc *s) {
    int64_t bytes = 0, entries = 0;
    for (const node *n = s->head; n; n = n->next) {
        if (!n->linked) return false;
        for (const node *m = n->next; m; m = m->next)
            if (m->pub.key == n->pub.key) return false;
        bytes += n->size;
        entries++;
    }
    return bytes == s->st.bytes && (uint64_t)entries == (uint64_t)s->st.entries && bytes <= s->st.max_bytes;
}

static node *find(ks_spc *s, uint64_t key) {
    for (node *n = s->head; n; n = n->next)
        if (n->pub.key == key) return n;
    return NULL;
}

int ks_spc_create(int64_t max_bytes, ks_spc **out) {
    if (!out) return KS_EINVAL;
    *out = NULL;
    ks_spc *s = calloc(1, sizeof *s);
    if (!s) return KS_ENOMEM;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return KS_ENOMEM;
    }
    s->st.max_bytes = max_bytes > 0 ? max_bytes : 0;
    *out = s;
    return 0;
}

void ks_spc_free(ks_spc *s) {
    if (!s) return;
    node *n = s->head;
    while (n) {
        node *next = n->next;
        node_free(n);
        n = next;
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const ks_spc_entry *ks_spc_acquire(ks_spc *s, uint64_t key) {
    if (!s) return NULL;
    pthread_mutex_lock(&s->mu);
    node *n = find(s, key);
    if (n) {
        n->refs++;
        n->hits++;
        n->last_used_us = ks_now_us();
        list_unlink(s, n);
        list_push_head(s, n);
        s->st.hits++;
    } else {
        s->st.misses++;
    }
    pthread_mutex_unlock(&s->mu);
    return n ? &n->pub : NULL;
}

void ks_spc_release(ks_spc *s, const ks_spc_entry *e) {
    if (!s || !e) return;
    node *n = (node *)e;
    pthread_mutex_lock(&s->mu);
    n->refs--;
    bool dead = n->refs == 0 && !n->linked;
    pthread_mutex_unlock(&s->mu);
    if (dead) node_free(n);
}

bool ks_spc_contains(ks_spc *s, uint64_t key) {
    if (!s) return false;
    pthread_mutex_lock(&s->mu);
    bool found = find(s, key) != NULL;
    pthread_mutex_unlock(&s->mu);
    return found;
}

int ks_spc_insert(ks_spc *s, uint64_t key, const int32_t *tokens, int n_tokens, uint8_t *blob,
                  size_t len) {
    int rc = 0;
    node *n = NULL;
    if (!s || (!blob && len > 0) || n_tokens < 0 || (!tokens && n_tokens > 0)) {
        rc = KS_EINVAL;
        goto fail;
    }
    /* max_bytes is fixed at create, so reading it unlocked is safe. */
    int64_t max = s->st.max_bytes;
    if (len > (size_t)INT64_MAX / 2 || (int64_t)len + 4 * (int64_t)n_tokens > max) {
        pthread_mutex_lock(&s->mu);
        s->st.refused++;
        pthread_mutex_unlock(&s->mu);
        rc = KS_ENOSPC;
        goto fail;
    }
    n = calloc(1, sizeof *n);
    if (!n || ks_tokens_assign(&n->pub.tokens, tokens, n_tokens) != 0) {
        rc = KS_ENOMEM;
        goto fail;
    }
    n->pub.key = key;
    n->pub.blob = blob;
    n->pub.len = len;
    n->pub.created_us = n->last_used_us = ks_now_us();
    n->size = (int64_t)len + 4 * (int64_t)n_tokens;
    blob = NULL; /* owned by the node from here on */

    pthread_mutex_lock(&s->mu);
    node *old = find(s, key);
    if (old) drop(s, old);
    while (s->st.bytes + n->size > max) {
        /* Oldest unreferenced entry first; an entry being read only when
         * nothing else is left (it is unlinked, freed by its last release). */
        node *victim = NULL;
        for (node *v = s->tail; v; v = v->prev)
            if (v->refs == 0) {
                victim = v;
                break;
            }
        if (!victim) victim = s->tail;
        drop(s, victim);
        s->st.evictions++;
    }
    n->linked = true;
    list_push_head(s, n);
    s->st.bytes += n->size;
    s->st.entries++;
    s->st.inserts++;
    KS_ASSERT(index_ok_locked(s));
    pthread_mutex_unlock(&s->mu);
    return 0;

fail:
    if (n) {
        ks_tokens_free(&n->pub.tokens);
        free(n);
    }
    free(blob);
    return rc;
}

void ks_spc_get_stats(ks_spc *s, ks_spc_stats *out) {
    if (!s || !out) return;
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

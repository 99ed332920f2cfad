/*
 * models.c — the server's table of models (server_int.h, docs/SERVER.md
 * "Several models"): which model a request names, loading on demand,
 * unloading the least recently used, the idle and pinned ones, and the
 * status list of /v1/models.
 *
 * NOTES
 *  1. One loading thread does every load and unload, one at a time: a load
 *     is the caller's loader (engine, scheduler) then the server's part
 *     (ks__smodel_open: template, caches); an unload is the reverse after
 *     the model's scheduler was detached (gen.c H1). The HTTP threads only
 *     ask (want_load, want_unload) and wait on the condition variable, at
 *     most load_wait_ms.
 *  2. A request holds a reference from the moment its model is resolved
 *     until its generation is freed. A model is unloaded only with no
 *     reference: a request in flight is never cut (an unload asked for a
 *     busy model waits for it to go idle). At shutdown the schedulers stop
 *     first (ks__models_stop: every request left gets its on_done), and the
 *     engines and the rest go only once the daemon has stopped and no
 *     connection is left (ks__models_unload_all); a model's persistent
 *     fields (name, lock, detached) stay to the end.
 *  3. Room for a load: at most models_max loaded (or loading) at once, and
 *     their est_bytes within memory_budget. What is in the way is unloaded
 *     least recently used first, among the idle, unpinned models; when all
 *     are busy the load waits for one to go idle. A model larger than the
 *     budget alone fails with that reason.
 *  4. A failed load is listed (status.failed, the reason) and answers its
 *     requests with the reason until POST /models/load tries again; the
 *     other models serve on.
 *  5. Idle unload: a loaded, unpinned model unused for its keep_alive_s (or
 *     the table's idle_unload_s) is unloaded; its slots go to the store
 *     first (the loader's unload), where a later load finds them.
 *
 * Thread model: every field of the table and the lifecycle fields of each
 * ks_smodel under mu; the loading thread is the only one that changes a
 * model's loaded fields, and only while no request holds it.
 */
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api_int.h"
#include "server/server_int.h"

#define MOD "models"

typedef struct ks_models {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* a state changed, or work was asked for */
    pthread_t thr;
    bool thr_ok;
    bool stop;
    ks_server_loader loader;
    int models_max;
    int64_t budget;
    int idle_s;
    bool autoload;
    int wait_ms;
    int def;                    /* the default model's index, -1: none */
} ks_models;

static double now_ms(void) { return ks_now_ms(); }


/* ------------------------------------------------------------ resolving */
/* The entry name resolves to: a name, then an exact alias, then an alias
 * pattern, in table order; -1: none. */
static int find(const ks_server *s, const char *name) {
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(s->m[i].name, name)) return i;
    for (int i = 0; i < s->n_models; i++)
        for (int a = 0; a < s->m[i].n_aliases; a++)
            if (!strcmp(s->m[i].aliases[a], name)) return i;
    for (int i = 0; i < s->n_models; i++)
        for (int a = 0; a < s->m[i].n_aliases; a++)
            if (strpbrk(s->m[i].aliases[a], "*?[") && !fnmatch(s->m[i].aliases[a], name, 0)) return i;
    return -1;
}

/* The index a request's name goes to, or -1 with e filled. */
static int resolve(const ks_server *s, const char *name, ks_api_error *e) {
    const ks_models *t = s->models;
    bool given = name && name[0];
    int i = given ? find(s, name) : -1;
    if (i >= 0) return i;
    if (t->def >= 0) return t->def;
    if (!given) {
        ks_api_error_set(e, 400, T_INVALID, "model_required", "model",
                         "This server serves several models: name one in 'model' (GET /v1/models lists them).");
        return -1;
    }
    ks_api_error_set(e, 404, T_INVALID, "model_not_found", "model",
                     "The model '%.200s' does not exist (GET /v1/models lists the models of this server).", name);
    return -1;
}

/* ------------------------------------------------------------ lifecycle */
static int n_resident(const ks_server *s, int64_t *bytes) {
    int n = 0;
    *bytes = 0;
    for (int i = 0; i < s->n_models; i++)
        if (s->m[i].state != KS_SMODEL_UNLOADED) n++, *bytes += s->m[i].est_bytes;
    return n;
}

/* Unloads m (loaded, no reference): called and returns with mu held. */
static void unload_locked(ks_server *s, ks_smodel *m, bool shutdown, const char *why) {
    ks_models *t = s->models;
    m->state = KS_SMODEL_UNLOADING;
    m->want_unload = false;
    pthread_mutex_unlock(&t->mu);
    double t0 = now_ms();
    pthread_rwlock_wrlock(&m->sched_lock);
    m->detached = true;
    pthread_rwlock_unlock(&m->sched_lock);
    t->loader.unload(t->loader.ud, m->index, shutdown);
    ks__smodel_close(m);
    KS_INFO(MOD, "%s: unloaded (%s) in %.0f ms", m->name, why, now_ms() - t0);
    pthread_mutex_lock(&t->mu);
    m->state = KS_SMODEL_UNLOADED;
    m->unloads++;
    pthread_cond_broadcast(&t->cv);
}

/* Loads m (unloaded): called and returns with mu held. */
static void load_locked(ks_server *s, ks_smodel *m) {
    ks_models *t = s->models;
    m->state = KS_SMODEL_LOADING;
    m->want_load = false;
    m->failed = false;
    m->reason[0] = '\0';
    pthread_mutex_unlock(&t->mu);
    double t0 = now_ms();
    ks_server_model_parts parts = {0};
    char err[512] = "";
    KS_INFO(MOD, "%s: loading", m->name);
    int rc = t->loader.load(t->loader.ud, m->index, &parts, err, sizeof err);
    if (!rc && (rc = ks__smodel_open(s, m, &parts, err, sizeof err))) t->loader.unload(t->loader.ud, m->index, true);
    if (rc) {
        KS_WARN(MOD, "%s: cannot be loaded: %s", m->name, err[0] ? err : ks_strerror(rc));
        ks__smodel_close(m);
    } else {
        pthread_rwlock_wrlock(&m->sched_lock);
        m->detached = false;
        pthread_rwlock_unlock(&m->sched_lock);
        KS_INFO(MOD, "%s: loaded in %.0f ms", m->name, now_ms() - t0);
    }
    pthread_mutex_lock(&t->mu);
    if (rc) {
        m->state = KS_SMODEL_UNLOADED;
        m->failed = true;
        snprintf(m->reason, sizeof m->reason, "%s", err[0] ? err : ks_strerror(rc));
    } else {
        m->state = KS_SMODEL_LOADED;
        m->last_used_ms = now_ms();
        m->loads++;
    }
    pthread_cond_broadcast(&t->cv);
}

/* Makes room for m (note 3): 1 when there is room now, 0 when it must wait
 * for a busy model, -1 when it can never fit (m failed, said). mu held. */
static int make_room(ks_server *s, ks_smodel *m) {
    ks_models *t = s->models;
    if (t->budget > 0 && m->est_bytes > t->budget) {
        m->want_load = false;
        m->failed = true;
        snprintf(m->reason, sizeof m->reason,
                 "needs about %.1f MiB (weights and KV), more than the models' memory budget of %.1f MiB",
                 (double)m->est_bytes / 1048576.0, (double)t->budget / 1048576.0);
        KS_WARN(MOD, "%s: cannot be loaded: %s", m->name, m->reason);
        pthread_cond_broadcast(&t->cv);
        return -1;
    }
    for (;;) {
        int64_t bytes;
        int n = n_resident(s, &bytes);
        bool count_ok = t->models_max <= 0 || n + 1 <= t->models_max;
        bool bytes_ok = t->budget <= 0 || bytes + m->est_bytes <= t->budget;
        if (count_ok && bytes_ok) return 1;
        ks_smodel *lru = NULL;
        for (int i = 0; i < s->n_models; i++) {
            ks_smodel *o = &s->m[i];
            if (o == m || o->state != KS_SMODEL_LOADED || o->pin || o->refs > 0) continue;
            if (!lru || o->last_used_ms < lru->last_used_ms) lru = o;
        }
        if (!lru) return 0;
        char why[320];
        snprintf(why, sizeof why, "least recently used, for %s: %s", m->name,
                 !count_ok ? "--models-max reached" : "memory budget");
        unload_locked(s, lru, false, why);
    }
}

static void *thread_main(void *ud) {
    ks_server *s = ud;
    ks_models *t = s->models;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        bool did = false;
        /* Unloads asked for, and idle models (note 5). */
        double now = now_ms();
        for (int i = 0; i < s->n_models && !t->stop; i++) {
            ks_smodel *m = &s->m[i];
            if (m->state != KS_SMODEL_LOADED || m->refs > 0) continue;
            int keep = m->keep_alive_s ? m->keep_alive_s : t->idle_s;
            bool idle = !m->pin && keep > 0 && now - m->last_used_ms >= 1000.0 * keep;
            if (m->want_unload || idle) {
                unload_locked(s, m, false, m->want_unload ? "asked" : "idle");
                did = true;
                now = now_ms();
            }
        }
        /* Loads asked for, oldest index first. */
        for (int i = 0; i < s->n_models && !t->stop; i++) {
            ks_smodel *m = &s->m[i];
            if (!m->want_load || m->state != KS_SMODEL_UNLOADED) continue;
            int room = make_room(s, m);
            if (room > 0) {
                load_locked(s, m);
                did = true;
            }
        }
        if (!did) {
            struct timespec ts;
            ks_deadline_ms(&ts, 500);
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int ks__models_start(ks_server *s, const ks_server_params *p, char *err, size_t errlen) {
    if (!p->models || p->n_models < 1 || p->n_models > KS_SERVER_MODELS_MAX || !p->loader.load ||
        !p->loader.unload || p->models_max < 0 || p->memory_budget < 0 || p->idle_unload_s < 0 ||
        p->load_wait_ms < 0) {
        ks_set_err(err, errlen, "invalid model table");
        return KS_EINVAL;
    }
    ks_models *t = calloc(1, sizeof *t);
    s->m = calloc((size_t)p->n_models, sizeof *s->m);
    if (!t || !s->m) {
        free(t);
        return KS_ENOMEM;
    }
    s->models = t;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    t->loader = p->loader;
    t->models_max = p->models_max;
    t->budget = p->memory_budget;
    t->idle_s = p->idle_unload_s;
    t->autoload = p->autoload;
    t->wait_ms = p->load_wait_ms;
    t->def = -1;
    s->n_models = p->n_models;
    s->multi = p->n_models > 1;
    for (int i = 0; i < p->n_models; i++) {
        const ks_server_model_cfg *c = &p->models[i];
        ks_smodel *m = &s->m[i];
        pthread_rwlock_init(&m->sched_lock, NULL);
        m->detached = true;
        m->index = i;
        if (!c->name || !c->name[0] || strlen(c->name) >= sizeof m->name || c->n_aliases < 0 ||
            c->n_aliases > KS_SERVER_ALIASES_MAX) {
            ks_set_err(err, errlen, "model %d: a name of 1..%zu bytes and at most %d aliases", i, sizeof m->name - 1,
                       KS_SERVER_ALIASES_MAX);
            return KS_EINVAL;
        }
        snprintf(m->name, sizeof m->name, "%s", c->name);
        snprintf(m->path, sizeof m->path, "%s", c->path ? c->path : "");
        for (int a = 0; a < c->n_aliases; a++) {
            if (!c->aliases[a] || !c->aliases[a][0] || strlen(c->aliases[a]) >= sizeof m->aliases[a]) {
                ks_set_err(err, errlen, "model %s: alias %d empty or too long", c->name, a);
                return KS_EINVAL;
            }
            snprintf(m->aliases[a], sizeof m->aliases[a], "%s", c->aliases[a]);
        }
        m->n_aliases = c->n_aliases;
        m->pin = c->pin;
        m->keep_alive_s = c->keep_alive_s;
        m->est_bytes = c->est_bytes > 0 ? c->est_bytes : 0;
        if (c->fail && c->fail[0]) {
            m->failed = true;
            snprintf(m->reason, sizeof m->reason, "%s", c->fail);
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(s->m[j].name, m->name)) {
                ks_set_err(err, errlen, "two models named '%s'", m->name);
                return KS_EINVAL;
            }
    }
    if (p->default_model && p->default_model[0]) {
        t->def = find(s, p->default_model);
        if (t->def < 0) {
            ks_set_err(err, errlen, "the default model '%s' is none of the models", p->default_model);
            return KS_EINVAL;
        }
    } else if (p->n_models == 1) {
        t->def = 0;
    }
    /* The pinned models, now (note 1's thread is not running yet). */
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < s->n_models; i++) {
        ks_smodel *m = &s->m[i];
        if (!m->pin) continue;
        if (make_room(s, m) > 0) load_locked(s, m);
        else if (!m->failed) {
            m->failed = true;
            snprintf(m->reason, sizeof m->reason, "no room among the pinned models (--models-max %d)", t->models_max);
        }
        if (m->failed && s->n_models == 1) {
            ks_set_err(err, errlen, "%s", m->reason);
            pthread_mutex_unlock(&t->mu);
            return KS_EINVAL;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (pthread_create(&t->thr, NULL, thread_main, s)) return KS_ENOMEM;
    t->thr_ok = true;
    return 0;
}

void ks__models_stop(ks_server *s) {
    ks_models *t = s ? s->models : NULL;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (t->thr_ok) pthread_join(t->thr, NULL);
    t->thr_ok = false;
    /* The schedulers stop now (their requests end, their slots are saved);
     * the engines stay until no connection is left (ks__models_unload_all):
     * a utility request may still be reading one. */
    for (int i = 0; i < s->n_models; i++) {
        ks_smodel *m = &s->m[i];
        pthread_mutex_lock(&t->mu);
        bool loaded = m->state == KS_SMODEL_LOADED;
        pthread_mutex_unlock(&t->mu);
        if (!loaded) continue;
        pthread_rwlock_wrlock(&m->sched_lock);
        m->detached = true;
        pthread_rwlock_unlock(&m->sched_lock);
        if (t->loader.stop) t->loader.stop(t->loader.ud, i);
    }
}

void ks__models_unload_all(ks_server *s) {
    ks_models *t = s ? s->models : NULL;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < s->n_models; i++)
        if (s->m[i].state == KS_SMODEL_LOADED) unload_locked(s, &s->m[i], true, "shutdown");
    pthread_mutex_unlock(&t->mu);
}

void ks__models_free(ks_server *s) {
    ks_models *t = s ? s->models : NULL;
    if (t) {
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        free(t);
        s->models = NULL;
    }
    for (int i = 0; s && s->m && i < s->n_models; i++) pthread_rwlock_destroy(&s->m[i].sched_lock);
    if (s) free(s->m);
}

/* ------------------------------------------------------------- requests */
int ks__models_acquire(ks_server *s, const char *name, bool wait, ks_smodel **out, ks_api_error *e) {
    *out = NULL;
    int i = resolve(s, name, e);
    if (i < 0) return KS_ENOENT;
    ks_models *t = s->models;
    ks_smodel *m = &s->m[i];
    struct timespec dl;
    ks_deadline_ms(&dl, t->wait_ms);
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    bool asked = false;
    for (;;) {
        if (m->state == KS_SMODEL_LOADED) {
            m->refs++;
            m->last_used_ms = now_ms();
            *out = m;
            break;
        }
        if (t->stop) {
            ks_api_error_set(e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
            rc = KS_ESHUTDOWN;
            break;
        }
        if (m->state == KS_SMODEL_UNLOADED && m->failed && !m->want_load) {
            ks_api_error_set(e, 500, "server_error", "model_load_failed", "model",
                             "The model '%s' failed to load: %.300s", m->name, m->reason);
            rc = KS_EIO;
            break;
        }
        if (!wait || (!t->autoload && m->state == KS_SMODEL_UNLOADED && !m->want_load)) {
            ks_api_error_set(e, 503, "server_error", "model_not_loaded", "model",
                             "The model '%s' is not loaded (POST /models/load loads it).", m->name);
            rc = KS_EBUSY;
            break;
        }
        if (!asked && m->state == KS_SMODEL_UNLOADED) {
            m->want_load = true;
            asked = true;
            pthread_cond_broadcast(&t->cv);
        }
        if (m->state == KS_SMODEL_UNLOADING && !m->want_load) {
            m->want_load = true; /* back as soon as it is out */
            pthread_cond_broadcast(&t->cv);
        }
        if (pthread_cond_timedwait(&t->cv, &t->mu, &dl) == ETIMEDOUT && m->state != KS_SMODEL_LOADED) {
            ks_api_error_set(e, 503, "server_error", "model_loading", "model",
                             "The model '%s' is still loading (or waiting for room). Retry later.", m->name);
            rc = KS_EBUSY;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void ks__models_ref(ks_server *s, ks_smodel *m) {
    pthread_mutex_lock(&s->models->mu);
    m->refs++;
    pthread_mutex_unlock(&s->models->mu);
}

void ks__models_release(ks_server *s, ks_smodel *m) {
    if (!m) return;
    ks_models *t = s->models;
    pthread_mutex_lock(&t->mu);
    m->refs--;
    m->last_used_ms = now_ms();
    if (m->refs == 0) pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* The entry a /models/load or /models/unload names, or NULL with e filled. */
static ks_smodel *named(ks_server *s, const char *name, ks_api_error *e) {
    int i = name && name[0] ? find(s, name) : -1;
    if (i >= 0) return &s->m[i];
    ks_api_error_set(e, 404, T_INVALID, "model_not_found", "model", "The model '%.200s' does not exist.",
                     name ? name : "");
    return NULL;
}

int ks__models_load(ks_server *s, const char *name, ks_api_error *e) {
    ks_models *t = s->models;
    ks_smodel *m = named(s, name, e);
    if (!m) return KS_ENOENT;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (m->state == KS_SMODEL_LOADED || m->state == KS_SMODEL_LOADING) {
        ks_api_error_set(e, 400, T_INVALID, "model_loaded", "model", "The model '%s' is already %s.", m->name,
                         m->state == KS_SMODEL_LOADED ? "loaded" : "loading");
        rc = KS_EINVAL;
    } else {
        m->want_load = true;
        m->want_unload = false;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int ks__models_unload(ks_server *s, const char *name, ks_api_error *e) {
    ks_models *t = s->models;
    ks_smodel *m = named(s, name, e);
    if (!m) return KS_ENOENT;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (m->pin) {
        ks_api_error_set(e, 400, T_INVALID, "model_pinned", "model", "The model '%s' is pinned: never unloaded.",
                         m->name);
        rc = KS_EINVAL;
    } else if (m->state == KS_SMODEL_UNLOADED || m->state == KS_SMODEL_UNLOADING) {
        m->want_load = false;
        ks_api_error_set(e, 400, T_INVALID, "model_not_loaded", "model", "The model '%s' is not loaded.", m->name);
        rc = KS_EINVAL;
    } else {
        m->want_unload = true;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int ks__models_slots(ks_server *s, void (*fn)(void *ud, const ks_smodel *m, const ks_slot_info *info, int n),
                     void *ud) {
    int n_models = 0;
    for (int k = 0; k < s->n_models; k++) {
        ks_api_error e;
        ks_smodel *m = NULL;
        if (ks__models_acquire(s, s->m[k].name, false, &m, &e)) continue; /* a look: nothing loads */
        ks_slot_info info[KS_MAX_SLOTS];
        int n = ks__server_slots(m, info);
        fn(ud, m, info, n);
        ks__models_release(s, m);
        n_models++;
    }
    return n_models;
}

/* --------------------------------------------------------------- listing */
static const char *state_name(const ks_smodel *m) {
    switch (m->state) {
    case KS_SMODEL_LOADING: return "loading";
    case KS_SMODEL_LOADED: return "loaded";
    case KS_SMODEL_UNLOADING: return "unloading";
    default: return "unloaded";
    }
}

json_t *ks__models_router_props(ks_server *s) {
    ks_models *t = s->models;
    if (!s->multi || !t || t->def >= 0) return NULL;
    json_t *names = json_array();
    for (int i = 0; names && i < s->n_models; i++) json_array_append_new(names, json_string(s->m[i].name));
    if (!names) return NULL;
    return json_pack("{s:s, s:i, s:b, s:s, s:s, s:{s:{}, s:i}, s:s, s:{s:o}}", "role", "router", "max_instances",
                     t->models_max, "models_autoload", t->autoload, "model_alias", "kvstash", "model_path", "none",
                     "default_generation_settings", "params", "n_ctx", 0, "build_info", ks_engine_llama_version(),
                     "kvstash", "models", names);
}

json_t *ks__models_json(ks_server *s) {
    ks_models *t = s->models;
    json_t *a = json_array();
    pthread_mutex_lock(&t->mu);
    for (int i = 0; a && i < s->n_models; i++) {
        ks_smodel *m = &s->m[i];
        json_t *al = json_array();
        for (int k = 0; al && k < m->n_aliases; k++) json_array_append_new(al, json_string(m->aliases[k]));
        json_t *st = json_pack("{s:s}", "value", state_name(m));
        if (st && m->failed) {
            json_object_set_new(st, "failed", json_true());
            json_object_set_new(st, "reason", json_string(m->reason));
        }
        if (st && s->multi) {
            json_object_set_new(st, "pinned", json_boolean(m->pin));
            json_object_set_new(st, "requests", json_integer(m->refs));
            if (m->state == KS_SMODEL_LOADED)
                json_object_set_new(st, "idle_s", json_real((now_ms() - m->last_used_ms) / 1e3));
        }
        bool loaded = m->state == KS_SMODEL_LOADED;
        bool vision = loaded && (m->media.modalities & KS_MEDIA_IN_IMAGE);
        bool audio = loaded && (m->media.modalities & KS_MEDIA_IN_AUDIO);
        json_t *caps = vision || audio ? json_pack("[s,s]", "completion", "multimodal") : json_pack("[s]", "completion");
        json_t *in = json_pack("[s]", "text");
        if (in && vision) json_array_append_new(in, json_string("image"));
        if (in && audio) json_array_append_new(in, json_string("audio"));
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o, s:{s:b, s:b}, s:{s:o, s:[s]}}", "id", m->name,
                              "object", "model", "created", (json_int_t)(loaded ? m->created : s->created),
                              "owned_by", "kvstash", "aliases", al ? al : json_array(), "status", st ? st : json_object(),
                              "capabilities", caps, "modalities", "vision", vision, "audio", audio, "architecture",
                              "input_modalities", in ? in : json_array(), "output_modalities", "text");
        if (o && loaded)
            json_object_set_new(o, "meta",
                                json_pack("{s:i, s:i, s:i, s:s, s:b}", "n_ctx_seq", ks_engine_n_ctx_seq(m->engine),
                                          "n_vocab", ks_engine_n_vocab(m->engine), "n_slots",
                                          ks_engine_n_seq(m->engine), "desc", ks_engine_model_desc(m->engine),
                                          "cache_prompt", m->cache_prompt));
        if (o && s->multi && m->path[0]) json_object_set_new(o, "path", json_string(m->path));
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return a;
}

/* ---------------------------------------------------------------- metrics */
void ks__models_metrics(void *ud, ks_prom *p) {
    ks_server *s = ud;
    ks_models *t = s->models;
    if (!t || p->rc) return;
    /* Rendered under mu: an unload waits for it (note 1), so no registry is
     * freed while it is read. */
    pthread_mutex_lock(&t->mu);
    if (!s->multi) {
        /* One model: its series as they always were, without a label. */
        ks_smodel *m = &s->m[0];
        if (m->state == KS_SMODEL_LOADED && m->metrics) p->rc = ks_metrics_render_extra(m->metrics, NULL, p->out);
        pthread_mutex_unlock(&t->mu);
        return;
    }
    ks_buf *parts = calloc((size_t)s->n_models + 1, sizeof *parts);
    if (!parts) {
        pthread_mutex_unlock(&t->mu);
        p->rc = KS_ENOMEM;
        return;
    }
    int n = 0, rc = 0;
    /* The table's own series first. */
    {
        ks_prom q = {&parts[n++], 0, NULL};
        ks_prom_family(&q, "kvstash_model_loaded", "gauge", "1 while the model is loaded (0: unloaded, loading).");
        for (int i = 0; i < s->n_models; i++)
            ks_prom_sample(&q, "kvstash_model_loaded", "model", s->m[i].name, s->m[i].state == KS_SMODEL_LOADED);
        ks_prom_family(&q, "kvstash_model_loads_total", "counter", "Loads of the model that succeeded.");
        for (int i = 0; i < s->n_models; i++)
            ks_prom_sample(&q, "kvstash_model_loads_total", "model", s->m[i].name, (double)s->m[i].loads);
        ks_prom_family(&q, "kvstash_model_unloads_total", "counter",
                       "Unloads of the model (asked, idle, least recently used for another).");
        for (int i = 0; i < s->n_models; i++)
            ks_prom_sample(&q, "kvstash_model_unloads_total", "model", s->m[i].name, (double)s->m[i].unloads);
        ks_prom_family(&q, "kvstash_model_failed", "gauge", "1 when the model's last load failed.");
        for (int i = 0; i < s->n_models; i++)
            ks_prom_sample(&q, "kvstash_model_failed", "model", s->m[i].name, s->m[i].failed);
        rc = q.rc;
    }
    for (int i = 0; i < s->n_models && !rc; i++) {
        ks_smodel *m = &s->m[i];
        if (m->state != KS_SMODEL_LOADED || !m->metrics) continue;
        char extra[320];
        ks_prom_label_pair(extra, sizeof extra, "model", m->name);
        rc = ks_metrics_render_extra(m->metrics, extra, &parts[n++]);
    }
    pthread_mutex_unlock(&t->mu);
    if (!rc) rc = ks_prom_merge(parts, n, p->out);
    for (int i = 0; i < n; i++) ks_buf_free(&parts[i]);
    free(parts);
    p->rc = rc;
}

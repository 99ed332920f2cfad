/*
 * chat.c — ks_chat, the public single-conversation API (include/kvstash.h).
 *
 * A ks_chat is an engine with one sequence, a scheduler with one slot, and
 * the message history. Multi-turn reuse is the scheduler's same-slot prefix
 * reuse: each turn's prompt is the template over the whole history, and the
 * slot keeps the exact tokens of the previous prompt and reply, so only the
 * suffix after the longest common prefix is prefilled.
 *
 * Invariants
 *  C1. history holds only completed turns: a failed send leaves it unchanged.
 *  C2. Invalidation needs no bookkeeping: a changed system prompt or an edited
 *      earlier message changes the prompt's tokens, and the common-prefix
 *      check trims the KV at the first differing token. ks_chat_clear and
 *      ks_chat_set_system drop the KV explicitly as well.
 *  C3. When the history does not fit n_ctx - max_tokens, the oldest whole
 *      turns after the system prompt are dropped (cache/overflow.c), which
 *      changes the prefix and costs one full prefill; a single message that
 *      does not fit is an error (KS_ECTX).
 *
 * Thread model: see kvstash.h — calls on one ks_chat are serialised by the
 * caller; callbacks run on the scheduler's inference thread while send()
 * waits.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/textstream.h"
#include "cache/overflow.h"
#include "engine/engine.h"
#include "kvstash.h"
#include "prompt/prompt.h"
#include "sched/sched.h"

typedef struct msg {
    char *role;
    char *content;
} msg;

struct ks_chat {
    ks_engine *e;
    ks_sched *s;
    ks_chat_params p;
    char *system;
    msg *hist;
    int n_hist;
    int cap_hist;
    float *logits;
    bool have_logits;
    char devices[512];   /* ks_engine_offload_desc */
};

/* The public constants are base/offload.h's values. */
_Static_assert((int)KS_GPU_LAYERS_AUTO == (int)KS_NGL_AUTO && (int)KS_GPU_LAYERS_ALL == (int)KS_NGL_ALL,
               "kvstash.h = offload.h");
_Static_assert((int)KS_SPLIT_MODE_NONE == (int)KS_SPLIT_NONE && (int)KS_SPLIT_MODE_LAYER == (int)KS_SPLIT_LAYER &&
               (int)KS_SPLIT_MODE_ROW == (int)KS_SPLIT_ROW, "kvstash.h = offload.h");

ks_sample_params ks_sample_params_default(void) {
    ks_sample_params sp = {0};
    sp.temperature = 0.0f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;
    sp.seed = 42;
    return sp;
}

ks_chat_params ks_chat_params_default(void) {
    ks_chat_params p = {0};
    p.n_ctx = 4096;
    p.n_batch = 512;
    p.cache = true;
    p.exact = true;
    p.n_gpu_layers = KS_GPU_LAYERS_AUTO;
    p.split_mode = KS_SPLIT_MODE_LAYER;
    return p;
}

ks_gen_params ks_gen_params_default(void) {
    ks_gen_params g = {0};
    g.max_tokens = 256;
    g.sample = ks_sample_params_default();
    return g;
}

int ks_chat_create(const ks_chat_params *p, ks_chat **out, char *err, size_t errlen) {
    *out = NULL;
    ks_chat *c = calloc(1, sizeof *c);
    if (!c) return KS_ENOMEM;
    c->p = *p;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = p->model_path;
    ep.n_ctx_seq = p->n_ctx > 0 ? p->n_ctx : 4096;
    ep.n_batch = p->n_batch > 0 ? p->n_batch : 512;
    ep.n_threads = p->n_threads;
    ep.n_seq = 1;
    ep.flash_attn = p->flash_attn == KS_FLASH_ATTN_ON ? KS_FA_ON : p->flash_attn == KS_FLASH_ATTN_OFF ? KS_FA_OFF : KS_FA_AUTO;
    ep.exact = p->exact;
    ep.offload.n_gpu_layers = p->n_gpu_layers;
    ep.offload.split_mode = p->split_mode;
    ep.offload.main_gpu = p->main_gpu;
    ep.offload.kv_offload = !p->no_kv_offload;
    ep.offload.op_offload = !p->no_op_offload;
    int rc = 0;
    if (p->devices) {
        char why[256];
        if (ks_offload_check_devices(p->devices, why, sizeof why)) {
            ks_set_err(err, errlen, "devices %s", why);
            rc = KS_EINVAL;
            goto fail;
        }
        snprintf(ep.offload.devices, sizeof ep.offload.devices, "%s", p->devices);
    }
    if (p->n_tensor_split < 0 || p->n_tensor_split > KS_OFFLOAD_DEVICES_MAX || (p->n_tensor_split && !p->tensor_split)) {
        ks_set_err(err, errlen, "a tensor split has 1..%d proportions", KS_OFFLOAD_DEVICES_MAX);
        rc = KS_EINVAL;
        goto fail;
    }
    for (int i = 0; i < p->n_tensor_split; i++) ep.offload.tensor_split[i] = p->tensor_split[i];
    ep.offload.n_tensor_split = p->n_tensor_split;
    rc = ks_engine_open(&ep, &c->e, err, errlen);
    if (rc) goto fail;
    ks_sched_params sp = ks_sched_params_default();
    sp.engine = c->e;
    sp.n_slots = 1;
    sp.cache_prompt = true; /* per request: c->p.cache */
    sp.exact = p->exact;
    rc = ks_sched_create(&sp, &c->s);
    if (rc) {
        ks_set_err(err, errlen, "could not start the inference thread: %s", ks_strerror(rc));
        goto fail;
    }
    c->logits = malloc(sizeof(float) * (size_t)ks_engine_n_vocab(c->e));
    c->p.system = NULL; /* owned copy lives in c->system */
    c->p.devices = NULL; /* borrowed for create only */
    c->p.tensor_split = NULL;
    ks_engine_offload_desc(c->e, c->devices, sizeof c->devices);
    if (!c->logits || (p->system && p->system[0] && !(c->system = strdup(p->system)))) {
        ks_set_err(err, errlen, "out of memory");
        rc = KS_ENOMEM;
        goto fail;
    }
    *out = c;
    return 0;
fail:
    ks_chat_free(c);
    return rc;
}

static void hist_clear(ks_chat *c) {
    for (int i = 0; i < c->n_hist; i++) {
        free(c->hist[i].role);
        free(c->hist[i].content);
    }
    c->n_hist = 0;
}

void ks_chat_free(ks_chat *c) {
    if (!c) return;
    ks_sched_free(c->s);
    ks_engine_free(c->e);
    hist_clear(c);
    free(c->hist);
    free(c->system);
    free(c->logits);
    free(c);
}

void ks_chat_clear(ks_chat *c) {
    hist_clear(c);
    c->have_logits = false;
    ks_sched_clear_slot(c->s, 0);
}

int ks_chat_set_system(ks_chat *c, const char *system) {
    char *ns = NULL;
    if (system && system[0] && !(ns = strdup(system))) return KS_ENOMEM;
    free(c->system);
    c->system = ns;
    ks_chat_clear(c);
    return 0;
}

int ks_chat_n_messages(const ks_chat *c) { return c->n_hist + (c->system ? 1 : 0); }

const char *ks_chat_message(const ks_chat *c, int i, const char **role) {
    if (c->system) {
        if (i == 0) {
            if (role) *role = "system";
            return c->system;
        }
        i--;
    }
    if (i < 0 || i >= c->n_hist) return NULL;
    if (role) *role = c->hist[i].role;
    return c->hist[i].content;
}

int ks_chat_n_cached(const ks_chat *c) {
    ks_slot_info in;
    ks_sched_slots(c->s, &in, 1);
    return in.n_tokens;
}

const float *ks_chat_last_prompt_logits(const ks_chat *c, int *n) {
    if (n) *n = ks_engine_n_vocab(c->e);
    return c->have_logits ? c->logits : NULL;
}

/* ----------------------------------------------------------------- send */
typedef struct view {
    ks_msg *m;   /* system? + history + the new message */
    int n;
    bool has_sys;
} view;

/* Renders system? + m[first_kept..n) and tokenizes it into out. */
static int render(const ks_chat *c, const view *v, int first_kept, ks_tokens *out) {
    ks_msg *tmp = malloc(sizeof(ks_msg) * (size_t)(v->n + 1));
    if (!tmp) return KS_ENOMEM;
    int k = 0;
    if (v->has_sys) tmp[k++] = v->m[0];
    int start = first_kept > (v->has_sys ? 1 : 0) ? first_kept : (v->has_sys ? 1 : 0);
    for (int i = start; i < v->n; i++) tmp[k++] = v->m[i];
    int rc = ks_prompt_render(c->e, tmp, k, out);
    free(tmp);
    return rc;
}

typedef struct count_ctx {
    ks_chat *c;
    const view *v;
    ks_tokens scratch;
} count_ctx;

static int count_tokens(void *ud, int first_kept, int n_msgs) {
    count_ctx *cc = ud;
    (void)n_msgs;
    int rc = render(cc->c, cc->v, first_kept, &cc->scratch);
    return rc ? rc : cc->scratch.n;
}

typedef struct wait_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    ks_req_result res;
    ks_textstream *ts;
    ks_buf emitted;
    const ks_gen_params *g;
    ks_chat *c;
    double t0;
    double t_first_text;
    int user_stop;
} wait_ctx;

static int on_token(void *ud, int32_t tok, const char *piece, int len) {
    (void)tok;
    wait_ctx *w = ud;
    ks_buf_reset(&w->emitted);
    int st = ks_textstream_feed(w->ts, piece, (size_t)len, &w->emitted);
    if (w->t_first_text == 0) w->t_first_text = ks_now_ms();
    if (w->emitted.len && w->g->on_text && w->g->on_text(w->g->ud, w->emitted.s, w->emitted.len)) w->user_stop = 1;
    return st == 1 || w->user_stop;
}

static void on_progress(void *ud, int done, int total) {
    wait_ctx *w = ud;
    if (w->g->on_progress) w->g->on_progress(w->g->ud, done, total);
}

static void on_done(void *ud, const ks_req_result *r) {
    wait_ctx *w = ud;
    if (r->logits) {
        memcpy(w->c->logits, r->logits, sizeof(float) * (size_t)r->n_vocab);
        w->c->have_logits = true;
    }
    pthread_mutex_lock(&w->mu);
    w->res = *r;
    w->res.logits = NULL;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static bool blank(const char *s) {
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return false;
    return true;
}

/* Room for n more messages in the history (C1: allocate before changing it). */
static int hist_reserve(ks_chat *c, int n) {
    if (c->n_hist + n <= c->cap_hist) return 0;
    int ncap = c->cap_hist ? c->cap_hist : 16;
    while (ncap < c->n_hist + n) ncap *= 2;
    msg *nh = realloc(c->hist, sizeof(msg) * (size_t)ncap);
    if (!nh) return KS_ENOMEM;
    c->hist = nh;
    c->cap_hist = ncap;
    return 0;
}

int ks_chat_send(ks_chat *c, const char *user_msg, const ks_gen_params *gp, char **reply,
                 ks_turn_stats *stats, char *err, size_t errlen) {
    if (reply) *reply = NULL;
    if (stats) memset(stats, 0, sizeof *stats);
    ks_gen_params gdef = ks_gen_params_default();
    const ks_gen_params *g = gp ? gp : &gdef;
    if (!user_msg || blank(user_msg)) {
        ks_set_err(err, errlen, "empty message");
        return KS_EEMPTY;
    }
    int n_ctx = ks_engine_n_ctx_seq(c->e);
    if (g->max_tokens < 1 || g->max_tokens >= n_ctx) {
        ks_set_err(err, errlen, "max_tokens must be 1..%d", n_ctx - 1);
        return KS_EINVAL;
    }
    double t0 = ks_now_ms();

    /* The view: system? + history + the new user message. */
    view v = {0};
    v.m = malloc(sizeof(ks_msg) * (size_t)(c->n_hist + 2));
    if (!v.m) return KS_ENOMEM;
    if (c->system) v.m[v.n++] = (ks_msg){"system", c->system};
    v.has_sys = c->system != NULL;
    for (int i = 0; i < c->n_hist; i++) v.m[v.n++] = (ks_msg){c->hist[i].role, c->hist[i].content};
    v.m[v.n++] = (ks_msg){"user", user_msg};

    const char **roles = malloc(sizeof(char *) * (size_t)v.n);
    count_ctx cc = {.c = c, .v = &v};
    ks_tokens prompt = {0};
    wait_ctx w = {0};
    int rc = 0;
    if (!roles) { rc = KS_ENOMEM; goto out; }
    for (int i = 0; i < v.n; i++) roles[i] = v.m[i].role;
    int first_kept = 0;
    rc = ks_overflow_plan(v.n, roles, count_tokens, &cc, n_ctx - g->max_tokens, &first_kept);
    if (rc == KS_ECTX) {
        ks_set_err(err, errlen, "message too long: it does not fit the context of %d tokens with max_tokens %d",
                   n_ctx, g->max_tokens);
        goto out;
    }
    if (rc < 0) {
        ks_set_err(err, errlen, "could not render the prompt: %s", ks_strerror(rc));
        goto out;
    }
    rc = render(c, &v, first_kept, &prompt);
    if (rc) {
        ks_set_err(err, errlen, "could not render the prompt: %s", ks_strerror(rc));
        goto out;
    }
    int base = v.has_sys ? 1 : 0;
    int n_drop = first_kept > base ? first_kept - base : 0;

    w.g = g;
    w.c = c;
    w.t0 = t0;
    w.ts = ks_textstream_create(NULL, 0);
    if (!w.ts) { rc = KS_ENOMEM; goto out; }
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    ks_req_params rq = {0};
    rq.tokens = prompt.v;
    rq.n_tokens = prompt.n;
    rq.max_tokens = g->max_tokens;
    rq.sample = g->sample;
    rq.cache_prompt = c->p.cache;
    rq.want_logits = true;
    rq.preferred_slot = 0;
    rq.on_token = on_token;
    rq.on_progress = on_progress;
    rq.on_done = on_done;
    rq.ud = &w;
    rc = ks_sched_submit(c->s, &rq, NULL);
    if (rc) {
        ks_set_err(err, errlen, "could not start the turn: %s", ks_strerror(rc));
        pthread_mutex_destroy(&w.mu);
        pthread_cond_destroy(&w.cv);
        goto out;
    }
    pthread_mutex_lock(&w.mu);
    while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);

    if (w.res.finish == KS_FINISH_ERROR) {
        rc = w.res.error ? w.res.error : KS_EDECODE;
        ks_set_err(err, errlen, "generation failed: %s", ks_strerror(rc));
        goto out;
    }
    ks_buf_reset(&w.emitted);
    ks_textstream_flush(w.ts, &w.emitted);
    if (w.emitted.len && g->on_text) g->on_text(g->ud, w.emitted.s, w.emitted.len);
    size_t rlen = 0;
    const char *text = ks_textstream_text(w.ts, &rlen);

    /* Commit the turn (C1): everything that can fail comes first, then the
     * history changes (drop overflowed turns, append user + reply). */
    char *m_user = strdup("user"), *m_text = strdup(user_msg), *m_asst = strdup("assistant"),
         *m_reply = strdup(text), *out_reply = reply ? strdup(text) : NULL;
    if (!m_user || !m_text || !m_asst || !m_reply || (reply && !out_reply) || hist_reserve(c, 2)) {
        free(m_user);
        free(m_text);
        free(m_asst);
        free(m_reply);
        free(out_reply);
        ks_set_err(err, errlen, "out of memory");
        rc = KS_ENOMEM;
        goto out;
    }
    if (n_drop > 0) {
        for (int i = 0; i < n_drop; i++) {
            free(c->hist[i].role);
            free(c->hist[i].content);
        }
        memmove(c->hist, c->hist + n_drop, sizeof(msg) * (size_t)(c->n_hist - n_drop));
        c->n_hist -= n_drop;
    }
    c->hist[c->n_hist++] = (msg){m_user, m_text};
    c->hist[c->n_hist++] = (msg){m_asst, m_reply};
    if (reply) *reply = out_reply;
    if (stats) {
        stats->n_prompt = w.res.n_prompt;
        stats->n_cached = w.res.n_cached;
        stats->n_new = w.res.n_prompt - w.res.n_cached;
        stats->n_generated = w.res.n_generated;
        stats->n_dropped_msgs = n_drop;
        stats->prompt_ms = w.res.prompt_ms;
        stats->ttft_ms = w.res.ttft_ms > 0 ? w.res.ttft_ms : w.res.prompt_ms;
        stats->gen_ms = w.res.gen_ms;
        stats->stopped_eog = w.res.finish == KS_FINISH_STOP && w.res.eog;
    }
out:
    ks_textstream_free(w.ts);
    ks_buf_free(&w.emitted);
    ks_tokens_free(&prompt);
    ks_tokens_free(&cc.scratch);
    free(roles);
    free(v.m);
    return rc;
}

const char *ks_chat_devices(const ks_chat *c) { return c->devices; }

const char *ks_chat_exact_mode(const ks_chat *c, const char **reason) {
    if (reason) *reason = ks_engine_exact_reason(c->e, c->p.exact);
    return ks_engine_exact_mode(c->e, c->p.exact);
}

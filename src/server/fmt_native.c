/*
 * fmt_native.c — llama-server's own completion format (fmt.h): POST
 * /completion and POST /infill, the endpoints of llama.cpp's own clients
 * (llama.vim and llama.vscode's fill-in-the-middle, SillyTavern's and other
 * text-completion front ends, scripts written against llama-server).
 *
 * The request is a completion's (api.c: prompt, n_predict, n_probs,
 * cache_prompt, id_slot, the sampling fields); /infill's is made of
 * input_prefix, input_suffix, input_extra and prompt (api.c
 * ks_api_parse_infill, prompt.h ks_prompt_infill). The reply is
 * llama-server's object: {index, content, tokens, id_slot, stop, model,
 * tokens_predicted, tokens_evaluated, generation_settings, prompt,
 * has_new_line, truncated, stop_type, stopping_word, tokens_cached, timings,
 * completion_probabilities} plus kvstash's cache object; several prompts
 * give an array of them. Streamed: one `data: {content, stop: false, ...}`
 * event per piece of text and the whole object (content "") with stop: true
 * last, no [DONE] — as llama-server streams it.
 *
 * Thread model: a request's state is used by its connection's thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "base/textstream.h"
#include "server/api_int.h"
#include "server/fmt.h"
#include "server/reply.h"

/* The state of one request: what the reply repeats of it. */
typedef struct native {
    int n_per_prompt;     /* choices per prompt (n) */
    int n_prompts;
    const char **prompt;  /* each prompt's text as given (borrowed from root), NULL: token ids */
    char *stops[KS_API_MAX_STOPS];
    int n_stops;
    json_t *settings;     /* generation_settings */
    json_t *fields;       /* response_fields (borrowed from root): the paths a whole reply keeps,
                             NULL: all */
    json_t *root;         /* keeps prompt's strings alive */
} native;

static void free_state(void *p) {
    native *n = p;
    if (!n) return;
    free(n->prompt);
    for (int i = 0; i < n->n_stops; i++) free(n->stops[i]);
    json_decref(n->settings);
    json_decref(n->root);
    free(n);
}

/* llama-server's generation_settings: what was sampled with. */
static json_t *settings_json(const ks_api_request *rq) {
    json_t *stop = json_array();
    for (int i = 0; stop && i < rq->n_stops; i++) json_array_append_new(stop, json_string(rq->stops[i]));
    return json_pack("{s:i, s:I, s:f, s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:b, s:o, s:i, s:b, s:b}",
                     "n_predict", rq->max_tokens, "seed", rq->seed_set ? (json_int_t)rq->sample.seed : (json_int_t)4294967295u, "temperature",
                     (double)rq->sample.temperature, "top_k", rq->sample.top_k, "top_p", (double)rq->sample.top_p,
                     "min_p", (double)rq->sample.min_p, "repeat_penalty", (double)rq->repeat_penalty,
                     "repeat_last_n", rq->repeat_last_n, "presence_penalty", (double)rq->presence_penalty,
                     "frequency_penalty", (double)rq->frequency_penalty, "ignore_eos", rq->ignore_eos, "stop",
                     stop ? stop : json_array(), "n_probs", rq->logprobs ? rq->top_logprobs : 0, "stream", rq->stream,
                     "cache_prompt", rq->cache_prompt);
}

static int state_of(ks_api_request *rq, void **st, ks_api_error *e) {
    native *n = calloc(1, sizeof *n);
    if (!n) goto oom;
    n->n_per_prompt = rq->n > 0 ? rq->n : 1;
    n->n_prompts = rq->n_prompts > 0 ? rq->n_prompts : 1;
    if (!(n->prompt = calloc((size_t)n->n_prompts, sizeof *n->prompt))) goto oom;
    for (int i = 0; i < rq->n_prompts && !rq->infill; i++) n->prompt[i] = rq->prompts[i].text;
    for (int i = 0; i < rq->n_stops; i++) {
        if (!(n->stops[i] = strdup(rq->stops[i]))) goto oom;
        n->n_stops = i + 1;
    }
    if (!(n->settings = settings_json(rq))) goto oom;
    n->root = json_incref(rq->root);
    json_t *f = json_object_get(rq->root, "response_fields");
    if (f && !json_is_null(f)) {
        size_t i;
        json_t *p;
        bool ok = json_is_array(f) && json_array_size(f) <= 256;
        json_array_foreach(f, i, p) ok = ok && json_is_string(p) && json_string_length(p) <= 256;
        if (!ok) {
            free_state(n);
            ks_api_request_free(rq);
            ks_api_error_set(e, 400, T_INVALID, "invalid_type", "response_fields",
                             "Invalid 'response_fields': expected an array of at most 256 paths (strings of at most "
                             "256 bytes, keys joined by '/').");
            return KS_EINVAL;
        }
        n->fields = f;
    }
    *st = n;
    return 0;
oom:
    free_state(n);
    ks_api_request_free(rq);
    return ks__api_oom(e);
}

static int parse_completion(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    (void)env;
    int rc = ks_api_parse_root(KS_API_COMPLETION, root, rq, e);
    return rc ? rc : state_of(rq, st, e);
}

static int parse_infill(const ks_fmt_env *env, json_t *root, ks_api_request *rq, void **st, ks_api_error *e) {
    (void)env;
    int rc = ks_api_parse_infill(root, rq, e);
    return rc ? rc : state_of(rq, st, e);
}

/* llama-server's stop_type: "eos", "word" (a stop string), "limit"
 * (n_predict or the context), "none". */
static const char *stop_type(const ks_fmt_choice *ch) {
    if (ch->stop_index >= 0) return "word";
    if (ch->stop_index == KS_TEXTSTREAM_STOP_INDENT || ch->stop_index == KS_REPLY_STOP_TIME)
        return "limit"; /* n_indent, t_max_predict_ms */
    if (ch->r && ch->r->eog) return "eos";
    if (ch->finish && !strcmp(ch->finish, "length")) return "limit";
    return ch->finish && !strcmp(ch->finish, "stop") ? "eos" : "none";
}

/* llama-server's response_fields: the object with only the values at the
 * given paths ("timings/prompt_n"), each under its path as the key; a path
 * that is not there is left out (json_get_nested_values). o is stolen. */
static json_t *only_fields(json_t *o, const json_t *fields) {
    json_t *r = json_object();
    size_t i;
    json_t *p;
    json_array_foreach(fields, i, p) {
        const char *path = json_string_value(p);
        json_t *cur = o;
        const char *k = path;
        char key[257];
        while (cur) {
            const char *slash = strchr(k, '/');
            size_t len = slash ? (size_t)(slash - k) : strlen(k);
            snprintf(key, sizeof key, "%.*s", (int)len, k);
            cur = json_is_object(cur) ? json_object_get(cur, key) : NULL;
            if (!slash) break;
            k = slash + 1;
        }
        if (cur && r) json_object_set(r, path, cur);
    }
    json_decref(o);
    return r;
}

/* One choice's final object (content: its text, "" at a stream's end). */
static json_t *final_json(const native *n, const ks_fmt_gen *g, const ks_fmt_choice *ch, const char *content) {
    const ks_req_result *r = ch->r;
    /* The request's own stop strings come first (fmt.h): a template's is not
     * one the client knows of. */
    const char *word = ch->stop_index >= 0 && ch->stop_index < n->n_stops ? n->stops[ch->stop_index] : "";
    const char *prompt = n->prompt[(ch->index / n->n_per_prompt) % n->n_prompts];
    json_t *o = json_pack("{s:i, s:s, s:[], s:i, s:b, s:s, s:i, s:i, s:O, s:b, s:b, s:s, s:s, s:i}",
                          "index", ch->index, "content", content, "tokens", "id_slot", r ? r->slot : -1, "stop", 1,
                          "model", g->model ? g->model : "", "tokens_predicted", r ? r->n_generated : 0,
                          "tokens_evaluated", r ? r->n_prompt : 0, "generation_settings", n->settings,
                          "has_new_line", strchr(ch->text, '\n') != NULL, "truncated", 0, "stop_type", stop_type(ch),
                          "stopping_word", word, "tokens_cached", r ? r->n_prompt + r->n_generated : 0);
    if (!o) return NULL;
    if (prompt) json_object_set_new(o, "prompt", json_string(prompt));
    if (r) {
        json_t *t = ks_api_timings_json(r), *c = ks_api_cache_json(r);
        if (t) json_object_set_new(o, "timings", t);
        if (c) json_object_set_new(o, "cache", c);
    }
    return o;
}

/* The final object, cut to response_fields when the request gave them; lp:
 * its completion_probabilities (borrowed; entries or lptext's placeholder). */
static json_t *final_fields(const native *n, const ks_fmt_gen *g, const ks_fmt_choice *ch, const char *content,
                            const json_t *lp) {
    json_t *o = final_json(n, g, ch, content);
    if (o && lp) json_object_set(o, "completion_probabilities", (json_t *)lp);
    return o && n->fields ? only_fields(o, n->fields) : o;
}

static json_t *whole(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, int n, const ks_req_result *total) {
    (void)total;
    const native *nv = st;
    json_t *arr = n > 1 ? json_array() : NULL;
    if (n > 1 && !arr) return NULL;
    for (int i = 0; i < n; i++) {
        /* entries, or lptext's placeholder spliced as an array (lptext.h) */
        json_t *o = final_fields(nv, g, &ch[i], ch[i].text, ch[i].logprobs);
        if (!o) goto fail;
        if (n == 1) return o;
        json_array_append_new(arr, o);
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

static int sse(ks_buf *out, json_t *obj) {
    int rc = obj ? ks_api_sse(out, obj) : KS_ENOMEM;
    json_decref(obj);
    return rc;
}

static int stream_start(void *st, const ks_fmt_gen *g, ks_buf *out) {
    (void)st, (void)g, (void)out;
    return 0;
}

static int stream_delta(void *st, const ks_fmt_gen *g, int index, const json_t *delta, const json_t *logprobs,
                        ks_buf *out) {
    (void)st;
    ks_req_result r = {0};
    r.slot = -1;
    if (g->peek) g->peek(g->peek_ud, index, &r);
    json_t *t = delta ? json_object_get(delta, "content") : NULL;
    json_t *o = json_pack("{s:i, s:s, s:[], s:b, s:i, s:i}", "index", index, "content",
                          json_is_string(t) ? json_string_value(t) : "", "tokens", "stop", 0, "id_slot", r.slot,
                          "tokens_evaluated", r.n_prompt);
    if (o && logprobs) json_object_set(o, "completion_probabilities", (json_t *)logprobs);
    return sse(out, o);
}

static int stream_end(void *st, const ks_fmt_gen *g, const ks_fmt_choice *ch, ks_buf *out) {
    return sse(out, final_fields(st, g, ch, "", NULL));
}

static int stream_error(void *st, const ks_fmt_gen *g, int index, const ks_api_error *e, ks_buf *out) {
    (void)st, (void)g, (void)index;
    return sse(out, ks_api_error_json(e));
}

static int stream_done(void *st, const ks_fmt_gen *g, const ks_req_result *total, ks_buf *out) {
    (void)st, (void)g, (void)total, (void)out;
    return 0;
}

/* The two endpoints differ in their requests only. */
#define NATIVE_FMT(NAME, PARSE)                                                                                        \
    {                                                                                                                  \
        .name = NAME, .id_prefix = "cmpl-", .logprobs_bare = true, .parse = PARSE, .free_state = free_state,          \
        .error_json = ks_api_error_json, .whole = whole, .stream_start = stream_start, .stream_delta = stream_delta,   \
        .stream_end = stream_end, .stream_error = stream_error, .stream_done = stream_done,                           \
    }

const ks_fmt ks__fmt_native = NATIVE_FMT("completion", parse_completion);
const ks_fmt ks__fmt_infill = NATIVE_FMT("infill", parse_infill);

/*
 * request.c — a generation route's request, from body to reply
 * (server_int.h): the body through the route's format's parser (fmt.h) into
 * the internal request, the server's defaults, the plan (plan.c), the
 * generation (gen.c) and its reply. Also /v1/messages/count_tokens, which
 * stops after the plan's prompt (sized and bounded as a generation's).
 *
 * The path is the same for every format; which one it is, only the table
 * says.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_int.h"
#include "server/fmt.h"
#include "server/gen.h"
#include "server/keyring.h"
#include "server/plan.h"
#include "server/refusals.h"

#define MOD "http"

/* What the server sets on a request that does not: its reasoning format
 * (--reasoning-format). */
static void server_defaults(ks_server *s, ks_api_request *rq) {
    if (s->reasoning_format[0] && rq->tmpl_req && !json_object_get(rq->tmpl_req, "reasoning_format"))
        json_object_set_new(rq->tmpl_req, "reasoning_format", json_string(s->reasoning_format));
}

/* One string field of the body, subdividing tenant (docs/SECURITY.md):
 * tenant itself when the field is absent, empty or not a string. */
static uint64_t subdivide(uint64_t tenant, const char *field, const json_t *v) {
    if (!json_is_string(v) || json_string_length(v) == 0) return tenant;
    return ks_keyring_subtenant(tenant, field, json_string_value(v), json_string_length(v));
}

/* The request's tenant: its key's, subdivided by the fields the operator
 * named (--tenant-by), each under its own name. */
static uint64_t tenant_of(const ks_server *s, const conn *cn, const json_t *root) {
    uint64_t t = cn->tenant;
    if (s->tenant_by & KS_TENANT_BY_PROMPT_CACHE_KEY)
        t = subdivide(t, "prompt_cache_key", json_object_get(root, "prompt_cache_key"));
    if (s->tenant_by & KS_TENANT_BY_CACHE_SALT) t = subdivide(t, "cache_salt", json_object_get(root, "cache_salt"));
    if (s->tenant_by & KS_TENANT_BY_USER) {
        t = subdivide(t, "user", json_object_get(root, "user"));
        t = subdivide(t, "user", json_object_get(json_object_get(root, "metadata"), "user_id"));
    }
    return t;
}

/* The headers of an error reply: a model still loading (or not loaded, or
 * the server busy) says when to come back. */
static const char *const *err_hdrs(const ks_api_error *e) {
    static const char *const retry_after[] = {"Retry-After", "1", NULL};
    return e->status == 503 ? retry_after : NULL;
}

/* The model root names (its "model"), into cn->m: 0 or e filled. */
static int model_of(ks_server *s, conn *cn, const json_t *root, ks_api_error *e) {
    if (cn->m) return 0;
    json_t *mv = json_object_get(root, "model");
    return ks__util_model(s, cn, json_is_string(mv) ? json_string_value(mv) : NULL, e);
}

int ks__request_parse(ks_server *s, const ks_fmt *fmt, conn *cn, ks_api_request *rq, void **st,
                      ks_api_error *e) {
    json_t *root = NULL;
    *st = NULL;
    memset(rq, 0, sizeof *rq);
    /* Sized before the parse (server.c, ks__plan_body): a request refused
     * there cost its body's bytes, not the JSON tree they would make. */
    int rc = ks__api_load_object(cn->body.s, cn->body.len, &root, e);
    if (rc) return rc;
    if ((rc = model_of(s, cn, root, e))) {
        json_decref(root);
        return rc;
    }
    ks_fmt_env env = {.convs = s->convs, .tenant = tenant_of(s, cn, root), .media = &cn->m->media};
    if ((rc = fmt->parse(&env, root, rq, st, e))) return rc; /* root is the parser's */
    rq->tenant = env.tenant;
    if (rq->n_media) {
        int n_images = 0;
        for (int i = 0; i < rq->n_media; i++) n_images += rq->media[i].kind == KS_MEDIA_IN_IMAGE;
        ks_http_count_media(&s->http, n_images, rq->n_media - n_images, rq->media_bytes);
    }
    /* cache_salt is a field kvstash does not know, logged as ignored
     * (refusals.h), unless --tenant-by uses it. */
    for (int i = 0; (s->tenant_by & KS_TENANT_BY_CACHE_SALT) && i < rq->notes.n; i++)
        if (!strcmp(rq->notes.v[i].field, "cache_salt")) {
            memmove(&rq->notes.v[i], &rq->notes.v[i + 1], sizeof rq->notes.v[0] * (size_t)(rq->notes.n - i - 1));
            rq->notes.n--;
            rq->notes.n_total--;
            i--;
        }
    server_defaults(s, rq);
    return 0;
}

/* A parsed request (freed here) from prompt to reply; st: fmt's state (stolen). */
static enum MHD_Result run(ks_server *s, struct MHD_Connection *c, conn *cn, const ks_fmt *fmt,
                           ks_api_request *rq, void *st) {
    ks_api_error e;
    ks_plan pl = {0};
    enum MHD_Result ret;
    bool retry = false;
    ks_gen *g = NULL;

    if (atomic_load(&s->draining)) {
        ks_api_error_set(&e, 503, "server_error", "shutting_down", NULL, "The server is shutting down.");
        goto fail;
    }
    /* The time a request spends here is per request, whatever the cache
     * holds (docs/SERVER.md, "Logs": the debug line below shows it). */
    double t0 = ks_now_ms();
    ks_smodel *m = cn->m;
    if (ks__plan_prompts(s, m, rq, &pl, true, &e)) {
        if (fmt->render_error) fmt->render_error(st, &e);
        goto fail;
    }
    double t_prompt = ks_now_ms();
    /* Tools the template rendered none of (no tool grammar came back): the
     * reply can hold no tool call. Said in the log (once per route, as a
     * field ignored) and in the reply's cache object. */
    if (pl.templated && rq->has_tools && !pl.tp.grammar) {
        pl.tools_ignored = true;
        ks_refusals_ignored(s->refusals, cn->method, cn->url, "tools",
                            "tools the chat template cannot render:");
    }
    if (ks__plan_fit(s, m, rq, &pl, &e) || ks__plan_bias(s, m, rq, &pl, &e) || ks__plan_grammar(s, m, rq, &pl, &e))
        goto fail;
    double t_grammar = ks_now_ms();
    if (pl.templated) ks__plan_pins(s, m, rq, &pl);
    double t_pins = ks_now_ms();
    ks__plan_stops(rq, &pl);
    g = ks__gen_create(s, m, fmt, st, rq, &pl);
    st = NULL; /* the generation's now, also on failure */
    if (!g) {
        ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        goto fail;
    }
    if (ks__gen_submit(g, c, cn, rq, &pl, &e, &retry)) {
        const char *const retry_after[] = {"Retry-After", "1", NULL};
        ret = ks__respond_error(s, c, cn, &e, retry ? retry_after : NULL);
        goto out;
    }
    KS_DEBUG(MOD, "%s: queued %d choice(s), %d prompt tokens, max_tokens %d%s%s%s, grammar %s%s "
                  "(%d trigger patterns, %d trigger tokens, %d prefill tokens); prompt %.1f ms, grammar %.1f ms, "
                  "breakpoints %.1f ms, submit %.1f ms",
             ks__gen_id(g), pl.n_prompts * rq->n, pl.prompts[0].tokens.n, pl.max_tokens, rq->stream ? ", stream" : "",
             pl.templated ? ", format " : "", pl.templated ? pl.tp.format : "",
             pl.tp.grammar || pl.grammar ? "yes" : "no", pl.tp.grammar_lazy ? " lazy" : "", pl.tp.n_trigger_patterns,
             pl.tp.n_trigger_tokens, pl.tp.n_grammar_prefill, t_prompt - t0, t_grammar - t_prompt, t_pins - t_grammar,
             ks_now_ms() - t_pins);
    ret = ks__gen_reply(g, c, cn);
    goto out;
fail:
    ret = ks__respond_error(s, c, cn, &e, NULL);
out:
    if (st && fmt->free_state) fmt->free_state(st);
    ks_api_request_free(rq);
    ks__plan_free(&pl);
    return ret;
}

enum MHD_Result ks__request_generate(ks_server *s, struct MHD_Connection *c, conn *cn, const ks_fmt *fmt) {
    ks_api_request rq;
    ks_api_error e;
    void *st;
    if (ks__request_parse(s, fmt, cn, &rq, &st, &e)) return ks__respond_error(s, c, cn, &e, err_hdrs(&e));
    ks__log_notes(s, cn, &rq.notes);
    return run(s, c, cn, fmt, &rq, st);
}

enum MHD_Result ks__request_count_tokens(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_api_error e;
    json_t *root = NULL;
    ks_api_msg_req mr = {0};
    ks_api_request rq = {0};
    ks_plan pl = {0};
    enum MHD_Result ret;
    /* Sized and bounded as a generation is: before the parse (server.c),
     * before the render, and a render of at most the bytes the context holds. */
    if (ks__api_load_object(cn->body.s, cn->body.len, &root, &e) || model_of(s, cn, root, &e) ||
        ks_api_messages_to_chat(root, true, &mr, &e) ||
        ks_api_parse_root_media(KS_API_CHAT, json_incref(mr.chat), &cn->m->media, &rq, &e)) {
        ret = ks__respond_error(s, c, cn, &e, err_hdrs(&e));
        goto out;
    }
    /* The key's tenant (subdivided as a generation's would be): the render
     * memo and the tokenization cache are the tenant's own, and a
     * count_tokens of one key must not time another key's pieces (issue 42). */
    rq.tenant = tenant_of(s, cn, root);
    server_defaults(s, &rq);
    if (ks__plan_prompts(s, cn->m, &rq, &pl, true, &e)) {
        ret = ks__respond_error(s, c, cn, &e, NULL);
    } else {
        ks__log_notes(s, cn, &mr.notes);
        ret = ks__respond_json(s, c, cn, 200, json_pack("{s:i}", "input_tokens", pl.prompts[0].tokens.n), NULL);
    }
out:
    json_decref(root);
    ks_api_msg_req_free(&mr);
    ks_api_request_free(&rq);
    ks__plan_free(&pl);
    return ret;
}

/*
 * utility.c — the small endpoints (server_int.h): GET /health, /v1/models,
 * /metrics, /slots; and llama-server's utility endpoints: POST
 * /tokenize, POST /detokenize, GET /props. Same request and response field
 * names as llama-server's handlers (tools/server/server-context.cpp of the
 * pinned release); the differences are in docs/SERVER.md.
 *
 * Only /slots asks the scheduler (under sched_lock, gen.c H1). The others
 * never do: tokenizing and reading the model are safe from any thread
 * (engine.h), so they answer while every slot is busy and while the server
 * drains.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/textstream.h"
#include "engine/chat_tmpl.h"
#include "server/api_int.h"
#include "server/fmt.h"
#include "server/plan.h"
#include "server/server_int.h"
#include "server/keyring.h"
#include "server/tenantstats.h"

/* ------------------------------------------------------------- GET endpoints */
#define ERR(status, type, code, param, ...)                                              \
    do {                                                                                 \
        ks_api_error e_;                                                                 \
        ks_api_error_set(&e_, status, type, code, param, __VA_ARGS__);                   \
        return ks__respond_error(s, c, cn, &e_, NULL);                                         \
    } while (0)

enum MHD_Result ks__util_health(ks_server *s, struct MHD_Connection *c, conn *cn) {
    bool d = atomic_load(&s->draining);
    return ks__respond_json(s, c, cn, d ? 503 : 200, json_pack("{s:s}", "status", d ? "shutting_down" : "ok"), NULL);
}

enum MHD_Result ks__util_models(ks_server *s, struct MHD_Connection *c, conn *cn) {
    /* Each model with its status (llama-server's router shape, models.c);
     * capabilities as llama-server lists them ("multimodal" with a
     * projector), and which inputs, as /props says. */
    json_t *d = ks__models_json(s);
    json_t *o = d ? json_pack("{s:s, s:o}", "object", "list", "data", d) : NULL;
    if (!o) ERR(500, "server_error", "out_of_memory", NULL, "out of memory");
    return ks__respond_json(s, c, cn, 200, o, NULL);
}

/* The "model" string of a JSON body, copied (NULL: none, or not JSON). */
static char *body_model(const conn *cn) {
    json_t *r = cn->body.s ? json_loadb(cn->body.s, cn->body.len, 0, NULL) : NULL;
    json_t *v = json_object_get(r, "model");
    char *m = json_is_string(v) ? strdup(json_string_value(v)) : NULL;
    json_decref(r);
    return m;
}

int ks__util_model(ks_server *s, conn *cn, const char *name, ks_api_error *e) {
    if (cn->m) return 0;
    return ks__models_acquire(s, name, true, &cn->m, e) ? KS_EINVAL : 0;
}

enum MHD_Result ks__util_models_load(ks_server *s, struct MHD_Connection *c, conn *cn, bool load) {
    ks_api_error e;
    json_t *r = cn->body.s ? json_loadb(cn->body.s, cn->body.len, 0, NULL) : NULL;
    json_t *v = json_object_get(r, "model");
    if (!json_is_object(r) || !json_is_string(v)) {
        json_decref(r);
        ERR(400, T_INVALID, "invalid_request", "model", "The body must be a JSON object with a string 'model'.");
    }
    int rc = load ? ks__models_load(s, json_string_value(v), &e) : ks__models_unload(s, json_string_value(v), &e);
    json_decref(r);
    if (rc) return ks__respond_error(s, c, cn, &e, NULL);
    return ks__respond_json(s, c, cn, 200, json_pack("{s:b}", "success", 1), NULL);
}

enum MHD_Result ks__util_metrics(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_buf b = {0};
    if (ks_metrics_render(s->metrics, &b)) {
        ks_buf_free(&b);
        ERR(500, "server_error", "out_of_memory", NULL, "out of memory");
    }
    return ks__respond(s, c, cn, 200, "text/plain; version=0.0.4; charset=utf-8", b.s, b.len, NULL);
}

/* One model's slots appended to a; other tenants' slots show their state only. */
static int slots_of(ks_smodel *m, const conn *cn, bool label, json_t *a) {
    ks_slot_info info[KS_MAX_SLOTS];
    int n = ks__server_slots(m, info);
    int64_t now = ks_now_us();
    for (int i = 0; i < n; i++) {
        const ks_slot_info *si = &info[i];
        json_t *o;
        if (si->tenant != cn->tenant) {
            /* Another tenant's slot (docs/SECURITY.md): its state only, none
             * of its counts. */
            o = json_pack("{s:i, s:s, s:b, s:n, s:n, s:n, s:n, s:n, s:n, s:n, s:n}", "id", si->id, "state",
                          si->busy ? "busy" : "idle", "busy", si->busy, "req_id", "n_tokens", "n_prompt", "n_cached",
                          "n_generated", "n_drafted", "n_draft_accepted", "idle_ms");
        } else {
            o = json_pack("{s:i, s:s, s:b, s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:o}", "id", si->id, "state",
                          si->busy ? "busy" : "idle", "busy", si->busy, "req_id", (json_int_t)si->req_id,
                          "n_tokens", si->n_tokens, "n_prompt", si->n_prompt, "n_cached", si->n_cached,
                          "n_generated", si->n_generated, "n_drafted", si->n_drafted, "n_draft_accepted",
                          si->n_draft_accepted, "idle_ms",
                          si->busy || !si->last_used_us ? json_null()
                                                        : json_real((double)(now - si->last_used_us) / 1e3));
        }
        if (o && label) json_object_set_new(o, "model", json_string(m->name));
        if (!o || json_array_append_new(a, o)) return KS_ENOMEM;
    }
    return 0;
}

enum MHD_Result ks__util_slots(ks_server *s, struct MHD_Connection *c, conn *cn) {
    json_t *a = json_array();
    if (!a) ERR(500, "server_error", "out_of_memory", NULL, "out of memory");
    int rc = 0;
    if (cn->m) {
        rc = slots_of(cn->m, cn, false, a);
    } else {
        /* Several models: ?model=NAME's slots if it is loaded (no load for a
         * look), else every loaded model's, each slot naming its model. */
        const char *name = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
        for (int i = 0; i < s->n_models && !rc; i++) {
            ks_api_error e;
            ks_smodel *m = NULL;
            if (name && name[0]) {
                if (ks__models_acquire(s, name, false, &m, &e)) break;
            } else if (ks__models_acquire(s, s->m[i].name, false, &m, &e)) {
                continue;
            }
            rc = slots_of(m, cn, true, a);
            ks__models_release(s, m);
            if (name && name[0]) break;
        }
    }
    if (rc) {
        json_decref(a);
        ERR(500, "server_error", "out_of_memory", NULL, "out of memory");
    }
    return ks__respond_json(s, c, cn, 200, a, NULL);
}

/* Slots whose KV is a tenant's, over every loaded model. */
typedef struct held_ctx {
    uint64_t tenant;
    int held;
} held_ctx;

static void count_held(void *ud, const ks_smodel *m, const ks_slot_info *info, int n) {
    held_ctx *h = ud;
    (void)m;
    for (int i = 0; i < n; i++) h->held += info[i].tenant == h->tenant && ks__slot_held(&info[i]);
}

static int held_slots(ks_server *s, uint64_t tenant) {
    held_ctx h = {tenant, 0};
    ks__models_slots(s, count_held, &h);
    return h.held;
}

enum MHD_Result ks__util_tenant(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_tenant_usage u;
    ks_tenantstats_get(s->tstats, cn->tenant, &u);
    int held = held_slots(s, cn->tenant);
    char name[KS_KEYRING_NAME_MAX + 1];
    bool named = ks_keyring_name(s->keys, cn->tenant, name, sizeof name);
    json_t *o = json_pack("{s:o, s:I, s:I, s:I, s:I, s:f, s:i}", "tenant", named ? json_string(name) : json_null(),
                          "requests", (json_int_t)u.requests, "prompt_tokens", (json_int_t)u.prompt_tokens,
                          "cached_tokens", (json_int_t)u.cached_tokens, "generated_tokens",
                          (json_int_t)u.generated_tokens, "cache_hit_rate",
                          u.prompt_tokens ? (double)u.cached_tokens / (double)u.prompt_tokens : 0.0, "slots", held);
    return ks__respond_json(s, c, cn, 200, o, NULL);
}

/* ---------------------------------------------------------- llama-server's */
/* The text of a token, control tokens as their text ("<|im_end|>"), into
 * *buf (grown as needed; *cap its size). Bytes written, < 0 on error. */
static int token_text(const ks_engine *e, int32_t tok, char **buf, size_t *cap) {
    int n = ks_engine_token_text(e, tok, *buf, *cap);
    if (n >= 0 && (size_t)n > *cap) {
        char *b = realloc(*buf, (size_t)n);
        if (!b) return KS_ENOMEM;
        *buf = b;
        *cap = (size_t)n;
        n = ks_engine_token_text(e, tok, *buf, *cap);
    }
    return n < 0 || (size_t)n > *cap ? KS_EINVAL : n;
}

static enum MHD_Result reply_oom(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_api_error e;
    ks_api_error_set(&e, 500, "server_error", "out_of_memory", NULL, "out of memory");
    return ks__respond_error(s, c, cn, &e, NULL);
}

/* The model of a POST utility request: its body's "model" (several models). */
static int post_model(ks_server *s, conn *cn, ks_api_error *e) {
    if (cn->m) return 0;
    char *name = body_model(cn);
    int rc = ks__util_model(s, cn, name, e);
    free(name);
    return rc;
}

enum MHD_Result ks__util_tokenize(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_api_tokenize rq;
    ks_api_error e;
    if (post_model(s, cn, &e)) return ks__respond_error(s, c, cn, &e, NULL);
    ks_smodel *m = cn->m;
    if (ks_api_parse_tokenize(cn->body.s, cn->body.len, ks_engine_n_vocab(m->engine), &rq, &e)) {
        ks_api_tokenize_free(&rq);
        return ks__respond_error(s, c, cn, &e, NULL);
    }
    ks_tokens t = {0};
    int rc = 0;
    /* llama-server's tokenize_mixed: BOS (add_special) only before a first
     * element that is a string. */
    for (int i = 0; !rc && i < rq.n_parts; i++) {
        const ks_api_tok_part *p = &rq.parts[i];
        if (p->text)
            rc = ks_engine_tokenize(m->engine, p->text, p->len, i == 0 && rq.add_special, rq.parse_special, &t);
        else
            rc = ks_tokens_push(&t, p->tok);
    }
    json_t *a = rc ? NULL : json_array();
    char *piece = NULL;
    size_t cap = 0;
    if (rq.with_pieces && a && !(piece = malloc(cap = 256))) rc = KS_ENOMEM;
    for (int i = 0; !rc && a && i < t.n; i++) {
        json_t *v;
        if (rq.with_pieces) {
            int n = token_text(m->engine, t.v[i], &piece, &cap);
            if (n < 0) {
                rc = n;
                break;
            }
            v = ks_api_token_piece_json(t.v[i], piece, (size_t)n);
        } else {
            v = json_integer(t.v[i]);
        }
        if (!v || json_array_append_new(a, v)) rc = KS_ENOMEM;
    }
    free(piece);
    ks_tokens_free(&t);
    ks_api_tokenize_free(&rq);
    if (rc || !a) {
        json_decref(a);
        return reply_oom(s, c, cn);
    }
    return ks__respond_json(s, c, cn, 200, json_pack("{s:o}", "tokens", a), NULL);
}

enum MHD_Result ks__util_detokenize(ks_server *s, struct MHD_Connection *c, conn *cn) {
    int32_t *ids;
    int n;
    ks_api_error e;
    if (post_model(s, cn, &e)) return ks__respond_error(s, c, cn, &e, NULL);
    ks_smodel *m = cn->m;
    if (ks_api_parse_detokenize(cn->body.s, cn->body.len, ks_engine_n_vocab(m->engine), &ids, &n, &e))
        return ks__respond_error(s, c, cn, &e, NULL);
    /* The pieces concatenated (llama-server's tokens_to_str); a piece may end
     * inside a character, so the whole goes through a textstream, which turns
     * what is still invalid at the end into U+FFFD as llama-server's JSON
     * output does. */
    ks_textstream *ts = ks_textstream_create(NULL, 0);
    ks_buf raw = {0}, out = {0};
    char *piece = malloc(256);
    size_t cap = 256;
    int rc = ts && piece ? 0 : KS_ENOMEM;
    for (int i = 0; !rc && i < n; i++) {
        int k = token_text(m->engine, ids[i], &piece, &cap);
        rc = k < 0 ? k : ks_buf_append(&raw, piece, (size_t)k);
    }
    if (!rc && ks_textstream_feed(ts, raw.s ? raw.s : "", raw.len, &out) < 0) rc = KS_ENOMEM;
    if (!rc && ks_textstream_flush(ts, &out) < 0) rc = KS_ENOMEM;
    json_t *o = rc ? NULL : json_pack("{s:s%}", "content", out.s ? out.s : "", out.len);
    free(piece);
    free(ids);
    ks_buf_free(&raw);
    ks_buf_free(&out);
    ks_textstream_free(ts);
    if (!o) return reply_oom(s, c, cn);
    return ks__respond_json(s, c, cn, 200, o, NULL);
}

/* A token's text as a NUL-terminated owned string, "" when tok < 0. */
static char *special_text(const ks_engine *e, int32_t tok) {
    size_t cap = 64;
    char *b = malloc(cap);
    int n = b && tok >= 0 ? token_text(e, tok, &b, &cap) : 0;
    if (!b || n < 0) {
        free(b);
        return NULL;
    }
    char *z = realloc(b, (size_t)n + 1);
    if (!z) {
        free(b);
        return NULL;
    }
    z[n] = '\0';
    return z;
}

enum MHD_Result ks__util_props(ks_server *s, struct MHD_Connection *c, conn *cn) {
    if (cn->post) {
        /* What llama-server answers when started without --props. */
        ks_api_error e;
        ks_api_error_set(&e, 501, "not_supported_error", "not_supported", NULL,
                         "This server does not support changing global properties.");
        return ks__respond_error(s, c, cn, &e, NULL);
    }
    ks_api_error me;
    /* ?model=NAME (several models) */
    const char *want = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
    if (!cn->m && !(want && want[0])) {
        /* several models, no default: the router's own properties, as
         * llama-server's router answers (its web UI reads /props at start) */
        json_t *rp = ks__models_router_props(s);
        if (rp) return ks__respond_json(s, c, cn, 200, rp, NULL);
    }
    if (!cn->m && ks__util_model(s, cn, want, &me)) return ks__respond_error(s, c, cn, &me, NULL);
    ks_smodel *m = cn->m;
    char *bos = special_text(m->engine, ks_engine_token_bos(m->engine));
    char *eos = special_text(m->engine, ks_engine_token_eos(m->engine));
    json_t *o = NULL;
    int n_expert_used = 0, n_expert = ks_engine_n_expert(m->engine, &n_expert_used);
    if (bos && eos) {
        ks_api_props p = {
            .n_ctx = ks_engine_n_ctx_seq(m->engine),
            .total_slots = ks_engine_n_seq(m->engine),
            .default_max_tokens = s->default_max_tokens,
            .model_alias = m->name,
            .model_path = ks_engine_model_path(m->engine),
            .chat_template = ks_engine_chat_template(m->engine),
            .bos_token = bos,
            .eos_token = eos,
            .llama_version = ks_engine_llama_version(),
            .cache_prompt = m->cache_prompt,
            .exact = m->exact,
            .exact_mode = ks_engine_exact_mode(m->engine, m->exact),
            .exact_reason = ks_engine_exact_reason(m->engine, m->exact),
            .offload = ks_engine_offload_info(m->engine),
            .gpu_backends = ks_engine_gpu_backends(),
            .probe = ks_engine_batch_invariant(m->engine) ? "batch-invariant"
                     : ks_engine_pairs_exact(m->engine)   ? "pairs"
                                                          : "not invariant",
            .repacked = ks_engine_repacked(m->engine),
            .flash_attn = ks_engine_flash_attn(m->engine),
            .cache_type_k = ks_engine_kv_type_name(ks_engine_type_k(m->engine)),
            .cache_type_v = ks_engine_kv_type_name(ks_engine_type_v(m->engine)),
            .n_expert = n_expert,
            .n_expert_used = n_expert_used,
            .cpu_backend = ks_engine_cpu_backend(),
            .store = m->store_mode[0] ? m->store_mode : NULL,
            .vision = m->media.modalities & KS_MEDIA_IN_IMAGE,
            .audio = m->media.modalities & KS_MEDIA_IN_AUDIO,
            .spec_type = m->spec_type,
            .draft_max = m->draft_max,
        };
        p.spec_on = m->spec_on;
        p.spec_exact = m->spec_exact;
        p.spec_reason = m->spec_reason;
        o = ks_api_props_json(&p);
    }
    free(bos);
    free(eos);
    if (!o) return reply_oom(s, c, cn);
    return ks__respond_json(s, c, cn, 200, o, NULL);
}

/* POST /apply-template {messages, tools?, tool_choice?, chat_template_kwargs?, ...}
 * -> {prompt}: the prompt llama.cpp's common library renders for the request
 * with the model's own Jinja template, as llama-server's /apply-template.
 * The body is parsed as a chat request (the same checks, the same
 * translation into the template's request, the server's defaults), so the
 * prompt shown is the one /v1/chat/completions renders for that body; it is
 * sized and rendered under the same limits (docs/SECURITY.md "Bounded cost
 * before admission"): a request whose known strings are longer than the
 * context is refused before the render, and the render waits its turn. */
enum MHD_Result ks__util_apply_template(ks_server *s, struct MHD_Connection *c, conn *cn) {
    ks_api_error e;
    ks_api_request rq;
    void *st = NULL;
    if (ks__request_parse(s, &ks__fmt_chat, cn, &rq, &st, &e)) return ks__respond_error(s, c, cn, &e, NULL);
    ks__fmt_chat.free_state(st);
    ks__log_notes(s, cn, &rq.notes);
    char err[512] = "";
    int rc = 0;
    char *req = NULL, *res = NULL;
    if (ks__plan_presize(s, cn->m, &rq, &e)) {
        ks_api_request_free(&rq);
        return ks__respond_error(s, c, cn, &e, NULL);
    }
    if (!cn->m->tmpl) {
        rc = KS_ETEMPLATE;
        snprintf(err, sizeof err, "the model's chat template could not be loaded at start");
    } else if (!(req = ks_api_dump(rq.tmpl_req))) {
        rc = KS_ENOMEM;
    } else {
        ks_admit_enter(&s->admit, KS_ADMIT_RENDER);
        rc = ks_chat_tmpl_apply(cn->m->tmpl, req, &res, err, sizeof err);
        ks_admit_leave(&s->admit);
    }
    free(req);
    ks_api_request_free(&rq);
    if (rc == KS_EINVAL || rc == KS_ETEMPLATE) {
        ks_api_error_set(&e, 400, T_INVALID, rc == KS_EINVAL ? "invalid_value" : "template_error", NULL,
                         "The chat template could not render the request: %.300s", err);
        return ks__respond_error(s, c, cn, &e, NULL);
    }
    json_t *r = rc ? NULL : json_loads(res, 0, NULL);
    free(res);
    json_t *prompt = r ? json_object_get(r, "prompt") : NULL;
    if (!json_is_string(prompt)) {
        json_decref(r);
        KS_WARN("http", "/apply-template failed: %s", rc ? (err[0] ? err : ks_strerror(rc)) : "no prompt");
        ks_api_error_set(&e, 500, "server_error", "template_error", NULL, "The chat template is not available: %.300s",
                         err[0] ? err : ks_strerror(rc ? rc : KS_ENOMEM));
        return ks__respond_error(s, c, cn, &e, NULL);
    }
    json_t *o = json_pack("{s:O}", "prompt", prompt);
    json_decref(r);
    return o ? ks__respond_json(s, c, cn, 200, o, NULL) : reply_oom(s, c, cn);
}

/*
 * plan.c — see plan.h: from a parsed request to the scheduler's parameters.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_tmpl.h"
#include "prompt/prompt.h"
#include "server/api_int.h"
#include "server/plan.h"
#include "server/schemasize.h"

#define MOD "http"

void ks__plan_free(ks_plan *pl) {
    for (int i = 0; i < pl->n_prompts; i++) ks_prompt_free(&pl->prompts[i]);
    free(pl->prompts);
    ks_prompt_tmpl_free(&pl->tp);
    free(pl->bias);
    free(pl->grammar);
    memset(pl, 0, sizeof *pl);
}

static int template_error(int rc, const char *err, ks_api_error *e) {
    if (rc == KS_EINVAL && strstr(err, "JSON schema"))
        ks_api_error_set(e, 400, T_INVALID, "invalid_schema", "response_format", "The JSON schema cannot be used: %.300s",
                         err);
    else if (rc == KS_EINVAL)
        ks_api_error_set(e, 400, T_INVALID, "invalid_value", NULL, "The request cannot be rendered: %.300s", err);
    else if (rc == KS_ETEMPLATE)
        ks_api_error_set(e, 400, T_INVALID, "template_error", NULL,
                         "The model's chat template failed on these messages: %.300s", err);
    else
        ks_api_error_set(e, 500, "server_error", "tokenize_failed", NULL, "The prompt could not be made: %s.",
                         ks_strerror(rc));
    return rc;
}

/* The 400 of media the projector could not take (ks_prompt_tmpl_chat's
 * KS_EDECODE): the item's part when the reason names one ("media item N"),
 * a marker in the request's own text when the counts differ. */
static int media_error(const ks_api_request *rq, const char *err, ks_api_error *e) {
    const char *at = strstr(err, "media item ");
    int k = at ? atoi(at + 11) : -1;
    if (k >= 0 && k < rq->n_media) {
        const ks_api_media *m = &rq->media[k];
        ks_api_error_set(e, 400, T_INVALID, m->kind == KS_MEDIA_IN_AUDIO ? "invalid_audio_format" : "invalid_image_format",
                         m->param, "Invalid '%s': the %s could not be decoded (%.200s).", m->param,
                         m->kind == KS_MEDIA_IN_AUDIO ? "audio" : "image", err);
    } else if (strstr(err, "media markers")) {
        ks_api_error_set(e, 400, T_INVALID, "invalid_value", NULL,
                         "The request's text contains '%s', which stands for an image or audio clip in this "
                         "model's prompts (%.200s).", ks_media_marker(), err);
    } else {
        ks_api_error_set(e, 400, T_INVALID, "invalid_value", rq->n_media ? rq->media[0].param : NULL,
                         "The images or audio could not be used: %.300s", err);
    }
    return KS_EINVAL;
}

/* Where the request's cache breakpoints fall in its prompt: one render of
 * the conversation up to each marked message (a breakpoint on the tools
 * ends with the first message, where templates put them). A breakpoint
 * whose prefix the render cannot find is dropped (logged). */
void ks__plan_pins(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl) {
    const ks_tokens *full = &pl->prompts[0].tokens;
    for (int i = 0; i < rq->n_bps; i++) {
        int upto = rq->bps[i].msg < 0 ? 0 : rq->bps[i].msg;
        ks_admit_enter(&s->admit, KS_ADMIT_RENDER);
        int n = ks_prompt_tmpl_prefix_len_ns(m->engine, m->tmpl, rq->tmpl_req, upto, full, pl->tp.media,
                                             pl->tp.n_gen_prompt, m->memo, rq->tenant);
        ks_admit_leave(&s->admit);
        if (n <= 0) {
            KS_DEBUG(MOD, "cache breakpoint after message %d: no token prefix of the prompt, dropped", upto);
            continue;
        }
        int k = 0;
        while (k < pl->n_pins && pl->pins[k].n_tokens < n) k++;
        if (k < pl->n_pins && pl->pins[k].n_tokens == n) {
            if (rq->bps[i].ttl_s > pl->pins[k].ttl_s) pl->pins[k].ttl_s = rq->bps[i].ttl_s;
            continue;
        }
        memmove(&pl->pins[k + 1], &pl->pins[k], sizeof pl->pins[0] * (size_t)(pl->n_pins - k));
        pl->pins[k] = (ks_cache_pin){n, rq->bps[i].ttl_s};
        pl->n_pins++;
    }
}

/* The most bytes a prompt that fits the context can have: a text of B bytes
 * tokenizes to at least ceil(B / max_token_bytes) tokens, since each token
 * stands for at most that many of its bytes (the tokenizer adds tokens —
 * BOS, a leading space — but drops none of the text's bytes), so a text
 * longer than (n_ctx - 1) * max_token_bytes is at least n_ctx tokens: the
 * context check would refuse it after tokenizing it all (CPU time in
 * proportion to the body, not to the context). */
static int64_t prompt_max_bytes(const ks_smodel *m) {
    return (int64_t)(ks_engine_n_ctx_seq(m->engine) - 1) * m->max_token_bytes;
}

/* The 400 of a prompt refused by prompt_max_bytes, before tokenizing: the
 * context check's error, with what is known instead of the token count.
 * n_bytes: the prompt's length; 0 for a chat prompt, rendered and refused
 * inside the prompt module (only "more than the bound" is known). */
static int too_long(ks_server *s, ks_smodel *m, const ks_api_request *rq, size_t n_bytes, ks_api_error *e) {
    if (n_bytes)
        return ks__plan_ctx_error(s, m, rq, e, "is %zu bytes, which is at least %lld tokens (no token of this model is "
                                  "longer than %d bytes)", n_bytes,
                                  (long long)((n_bytes + (size_t)m->max_token_bytes - 1) / (size_t)m->max_token_bytes),
                                  m->max_token_bytes);
    return ks__plan_ctx_error(s, m, rq, e, "render to more than %lld bytes, which is at least %d tokens (no token of "
                              "this model is longer than %d bytes)", (long long)prompt_max_bytes(m),
                              ks_engine_n_ctx_seq(m->engine), m->max_token_bytes);
}

/* The most keys and values a body may hold (prescan.h ks_prescan_counts):
 * ~60 MB of parsed tree at most on a 512-token context, for any shape of
 * JSON; token arrays of four whole contexts fit. */
static size_t max_items(const ks_smodel *m) {
    /* No model yet (several models: the body names it): a context of 128K. */
    size_t ctx = m ? (size_t)ks_engine_n_ctx_seq(m->engine) : (size_t)131072;
    return (size_t)KS_BODY_ITEMS_BASE + (size_t)KS_BODY_ITEMS_PER_TOKEN * ctx;
}

int ks__plan_body(ks_server *s, ks_smodel *m, ks_prescan_shape shape, const char *body, size_t len, uint64_t *next) {
    /* The size bound is presize's: only with the Jinja template it probed. */
    int64_t max = m && m->tmpl ? prompt_max_bytes(m) : 0;
    static const ks_presize none;
    size_t items = max_items(m);
    if (next) {
        /* No prefix shorter than a bound passes it (an item takes a byte at
         * least, a counted string's byte one of the body's); after that, one
         * scan each time the body has doubled: about twice its bytes in all. */
        uint64_t first = max > 0 && (uint64_t)max < items ? (uint64_t)max : items;
        if (len <= first || len < *next) return 0;
        *next = (uint64_t)len * 2;
    }
    ks_prescan_counts n;
    ks_prescan_count(m ? &m->presize : &none, max > 0 ? shape : KS_PRESCAN_NONE, body, len, next != NULL, &n);
    if (n.items > items) return KS_BODY_TOO_MANY;
    if (n.other > KS_BODY_ELSE_MAX || n.other_items > KS_BODY_ELSE_ITEMS) return KS_BODY_TOO_MUCH_ELSE;
    if (max > 0 && n.bytes > (uint64_t)max) {
        ks_admit_note_refused(&s->admit);
        return KS_BODY_TOO_LONG;
    }
    return 0;
}

void ks__plan_body_error(ks_server *s, ks_smodel *m, int why, ks_api_error *e) {
    if (why == KS_BODY_TOO_MANY) {
        ks_api_error_set(e, 413, T_INVALID, "request_too_large", NULL,
                         "The request body holds more than %zu JSON keys and values (%d, and %d per token of the "
                         "model's context): it is refused before it is parsed.",
                         max_items(m), KS_BODY_ITEMS_BASE, KS_BODY_ITEMS_PER_TOKEN);
        return;
    }
    if (why == KS_BODY_TOO_MUCH_ELSE) {
        ks_api_error_set(e, 413, T_INVALID, "request_too_large", NULL,
                         "The request's fields outside its messages and tools (sampling, formats, metadata, "
                         "unknown fields) hold more than %u bytes or %u JSON keys and values: it is refused before "
                         "it is parsed.", (unsigned)KS_BODY_ELSE_MAX, (unsigned)KS_BODY_ELSE_ITEMS);
        return;
    }
    const ks_api_request chat = {.kind = KS_API_CHAT};
    too_long(s, m, &chat, 0, e); /* only with a model: its bound refused the body */
}

/* One schema of the request added to *sz: the 400 schema_too_large when
 * it passes a limit (schemasize.h). param: where it is. */
static int schema_add(ks_schema_size *sz, const json_t *schema, const char *param, ks_api_error *e) {
    char why[300];
    if (!ks_schema_size_add(sz, schema, why, sizeof why)) return 0;
    ks_api_error_set(e, 400, T_INVALID, "schema_too_large", param,
                     "The JSON schema in '%s' is too large to build a grammar from: %s.", param, why);
    return KS_EINVAL;
}

int ks__plan_schemas(const ks_api_request *rq, ks_api_error *e) {
    ks_schema_size sz = {0};
    int rc;
    if (rq->kind != KS_API_CHAT) return rq->json_schema ? schema_add(&sz, rq->json_schema, "response_format", e) : 0;
    /* Where chat_tmpl.cpp takes them from: json_schema, response_format's
     * schema or json_schema.schema, each tool's parameters. */
    const json_t *rf = json_object_get(rq->tmpl_req, "response_format");
    if ((rc = schema_add(&sz, json_object_get(rq->tmpl_req, "json_schema"), "json_schema", e)) ||
        (rc = schema_add(&sz, json_object_get(rf, "schema"), "response_format", e)) ||
        (rc = schema_add(&sz, json_object_get(json_object_get(rf, "json_schema"), "schema"), "response_format", e)))
        return rc;
    size_t i;
    const json_t *t;
    json_array_foreach(json_object_get(rq->tmpl_req, "tools"), i, t) {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        if ((rc = schema_add(&sz, json_object_get(json_object_get(t, "function"), "parameters"), param, e))) return rc;
    }
    return 0;
}

int ks__plan_presize(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_api_error *e) {
    int64_t max = prompt_max_bytes(m);
    int rc = ks__plan_schemas(rq, e);
    if (rc) return rc;
    if (!m->tmpl || max <= 0 || ks_presize_bytes(&m->presize, rq->tmpl_req) <= (uint64_t)max) return 0;
    ks_admit_note_refused(&s->admit);
    return too_long(s, m, rq, 0, e);
}

int ks__plan_ctx_error(const ks_server *s, const ks_smodel *m, const ks_api_request *rq, ks_api_error *e, const char *fmt, ...) {
    const char *what = rq->kind == KS_API_CHAT ? "messages" : "prompt";
    char detail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ks_api_error_set(e, 400, T_INVALID, "context_length_exceeded", what,
                     "This model's maximum context length is %d tokens. However, your %s %s, which leaves no room "
                     "for a completion. Please reduce the length of the %s.",
                     ks_engine_n_ctx_seq(m->engine), what, detail, what);
    return KS_ECTX;
}

/* The prompts of a request, and for chat requests the cache hints and what
 * the template says about sampling and parsing. bounded: refuse a prompt
 * longer than prompt_max_bytes before tokenizing it (a generation; not a
 * token count). */
/* /infill's prompt (prompt.h, ks_prompt_infill), from the model's
 * fill-in-the-middle tokens; a model without them: llama-server's 501. Its
 * parts are cut to fit the context (no bound needed before tokenizing: the
 * body's size is the bound). */
static int infill_prompt(const ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_prompt *out, ks_api_error *e) {
    ks_fim_tokens f = ks_engine_fim_tokens(m->engine);
    if (f.pre < 0 || f.suf < 0 || f.mid < 0) {
        ks_api_error_set(e, 501, "not_supported_error", "infill_unsupported", NULL,
                         "Infill is not supported by this model: %s%s%s", f.pre < 0 ? "prefix token is missing. " : "",
                         f.suf < 0 ? "suffix token is missing. " : "", f.mid < 0 ? "middle token is missing. " : "");
        return KS_EINVAL;
    }
    ks_prompt_infill_in in = {
        .prefix = rq->infill_prefix, .suffix = rq->infill_suffix, .prompt = rq->infill_prompt,
        .extra = rq->infill_extra, .n_extra = rq->n_infill_extra,
        /* llama-server's budget is its --batch, 2048 by default (kvstash's
         * --batch, 512, is a decode step's size, not this): the same request
         * gets the same prompt from both servers. */
        .n_batch = 2048, .n_ctx = ks_engine_n_ctx_seq(m->engine),
        .n_predict = -1, /* llama-server passes its server-wide n_predict, -1 unless set */
        .spm = s->spm_infill,
    };
    int rc = ks_prompt_infill(m->engine, &in, out);
    if (rc == KS_ENOMEM) return ks__api_oom(e);
    if (rc) ks_api_error_set(e, 500, "server_error", "tokenize_failed", NULL, "The prompt could not be tokenized.");
    return rc;
}

int ks__plan_prompts(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, bool bounded, ks_api_error *e) {
    int n = rq->kind == KS_API_CHAT ? 1 : rq->n_prompts;
    pl->prompts = calloc((size_t)n, sizeof *pl->prompts);
    if (!pl->prompts) return ks__api_oom(e);
    pl->n_prompts = n;
    int rc = 0;
    int64_t max_bytes = bounded ? prompt_max_bytes(m) : 0;
    if (rq->kind == KS_API_CHAT) {
        /* A tenant's renders are remembered for it alone (docs/SECURITY.md). */
        ks_prompt_opts o = {.hints = true, .model_id = m->model_id, .max_bytes = max_bytes, .memo_ns = rq->tenant};
        ks_prompt_media pm = {.mm = ks_engine_media(m->engine), .n_items = rq->n_media};
        if (rq->n_media > 0) {
            /* The parser refuses media without a projector; the built-in
             * templates (no Jinja template) have no media path. */
            if (!pm.mm || !m->tmpl) {
                ks_api_error_set(e, 400, T_INVALID, "invalid_value", rq->media[0].param,
                                 "Invalid '%s': %s.", rq->media[0].param,
                                 pm.mm ? "images and audio need the model's Jinja chat template, which is not available"
                                       : "this model takes no image or audio input");
                return KS_EINVAL;
            }
            ks_media_item *items = calloc((size_t)rq->n_media, sizeof *items);
            if (!items) return ks__api_oom(e);
            for (int i = 0; i < rq->n_media; i++) items[i] = (ks_media_item){rq->media[i].data, rq->media[i].n};
            pm.items = items;
            o.media = &pm;
        }
        if (m->tmpl) {
            char err[512] = "";
            /* Sized before any render: the strings the template is known to
             * copy (presize.h) already render to more than the bound, so the
             * render's own refusal is known without it. */
            if (bounded && (rc = ks__plan_presize(s, m, rq, e))) {
                free((void *)pm.items);
                return rc;
            }
            ks_admit_enter(&s->admit, KS_ADMIT_RENDER);
            rc = ks_prompt_tmpl_chat(m->engine, m->tmpl, rq->tmpl_req, &o, m->memo, &pl->tp, err, sizeof err);
            ks_admit_leave(&s->admit);
            free((void *)pm.items);
            if (rc == KS_ECTX) return too_long(s, m, rq, 0, e);
            if (rc == KS_EDECODE) return media_error(rq, err, e);
            if (rc) return template_error(rc, err, e);
            pl->templated = true;
            /* The prompt moves to prompts[0]; the rest stays with tp. */
            pl->prompts[0] = pl->tp.p;
            memset(&pl->tp.p, 0, sizeof pl->tp.p);
            return 0;
        }
        if (rq->has_tools || rq->structured) {
            ks_api_error_set(e, 400, T_INVALID, "unsupported_value", rq->has_tools ? "tools" : "response_format",
                             "Tools and structured output need the model's Jinja chat template, which is not available.");
            return KS_EINVAL;
        }
        ks_admit_enter(&s->admit, KS_ADMIT_RENDER);
        rc = ks_prompt_chat(m->engine, rq->msgs, rq->n_msgs, &o, &pl->prompts[0]);
        ks_admit_leave(&s->admit);
        if (rc == KS_ECTX) return too_long(s, m, rq, 0, e);
        if (rc) return template_error(rc == KS_ETEMPLATE ? rc : rc, "llama.cpp's built-in templates do not know it", e);
        return 0;
    }
    if (rq->infill) return infill_prompt(s, m, rq, &pl->prompts[0], e);
    for (int i = 0; i < n; i++) {
        const ks_api_prompt *ap = &rq->prompts[i];
        int bad = 0;
        if (ap->text) {
            size_t len = strlen(ap->text); /* what ks_prompt_text tokenizes */
            if (max_bytes > 0 && len > (uint64_t)max_bytes) return too_long(s, m, rq, len, e);
            rc = ks_prompt_text(m->engine, ap->text, &pl->prompts[i]);
        } else {
            rc = ks_prompt_ids(m->engine, ap->tokens, ap->n_tokens, &pl->prompts[i], &bad);
            if (rc == KS_EINVAL) {
                char param[48];
                if (n > 1) snprintf(param, sizeof param, "prompt[%d][%d]", i, bad);
                else snprintf(param, sizeof param, "prompt[%d]", bad);
                ks_api_error_set(e, 400, T_INVALID, "invalid_value", param,
                                 "Invalid '%s': token id %d is outside the vocabulary (%d tokens).", param,
                                 (int)ap->tokens[bad], ks_engine_n_vocab(m->engine));
                return rc;
            }
        }
        if (rc) {
            ks_api_error_set(e, 500, "server_error", "tokenize_failed", NULL, "The prompt could not be tokenized.");
            return rc;
        }
    }
    return 0;
}

/* Checks the prompts against the context and picks max_tokens: a prompt
 * that leaves no room is a 400; max_tokens beyond the room left is cut to
 * it (the generation then ends with "length" when the context is full). */
int ks__plan_fit(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, ks_api_error *e) {
    int n_ctx = ks_engine_n_ctx_seq(m->engine);
    const char *what = rq->kind == KS_API_CHAT ? "messages" : "prompt";
    int longest = 0;
    for (int i = 0; i < pl->n_prompts; i++) {
        int n_prompt = pl->prompts[i].tokens.n;
        if (n_prompt == 0) {
            ks_api_error_set(e, 400, T_INVALID, "invalid_value", what,
                             "Invalid '%s': the prompt is empty after tokenization.", what);
            return KS_EINVAL;
        }
        if (n_prompt >= n_ctx) return ks__plan_ctx_error(s, m, rq, e, "resulted in %d tokens", n_prompt);
        if (n_prompt > longest) longest = n_prompt;
    }
    /* No max_tokens and no --max-tokens: until the end of generation or of
     * the context, as llama-server (its n_predict -1). */
    pl->max_tokens = rq->max_tokens > 0 ? rq->max_tokens : s->default_max_tokens;
    if (pl->max_tokens <= 0 || pl->max_tokens > n_ctx - longest) pl->max_tokens = n_ctx - longest;
    return 0;
}

/* logit_bias strings become the bias of each of their tokens; ids are
 * checked against the vocabulary. */
int ks__plan_bias(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, ks_api_error *e) {
    if (rq->n_bias == 0 && !rq->ignore_eos) return 0;
    int n_vocab = ks_engine_n_vocab(m->engine);
    int cap = rq->n_bias + 4;
    pl->bias = malloc(sizeof *pl->bias * (size_t)cap);
    if (!pl->bias) return ks__api_oom(e);
    for (int i = 0; i < rq->n_bias; i++) {
        const ks_api_bias *b = &rq->bias[i];
        ks_tokens t = {0};
        if (b->text) {
            if (ks_engine_tokenize(m->engine, b->text, strlen(b->text), false, false, &t)) {
                ks_tokens_free(&t);
                return ks__api_oom(e);
            }
        } else {
            if (b->tok >= n_vocab) {
                char param[48];
                snprintf(param, sizeof param, "logit_bias.%d", (int)b->tok);
                ks_api_error_set(e, 400, T_INVALID, "invalid_value", param,
                                 "Invalid 'logit_bias': token id %d is outside the vocabulary (%d tokens).",
                                 (int)b->tok, n_vocab);
                return KS_EINVAL;
            }
            ks_tokens_push(&t, b->tok);
        }
        for (int k = 0; k < t.n; k++) {
            if (pl->n_bias == cap) {
                cap *= 2;
                ks_logit_bias *nb = realloc(pl->bias, sizeof *nb * (size_t)cap);
                if (!nb) {
                    ks_tokens_free(&t);
                    return ks__api_oom(e);
                }
                pl->bias = nb;
            }
            pl->bias[pl->n_bias++] = (ks_logit_bias){t.v[k], b->bias};
        }
        ks_tokens_free(&t);
    }
    return 0;
}

/* Completions: a grammar, or a JSON schema through the converter. */
int ks__plan_grammar(ks_server *s, ks_smodel *m, const ks_api_request *rq, ks_plan *pl, ks_api_error *e) {
    char err[512] = "";
    if (rq->kind == KS_API_CHAT) {
        if (!pl->tp.grammar) return 0;
        /* A grammar build waits its turn with the renders (admit.h): sized
         * (grammarsize.h, schemasize.h), but not free. */
        ks_admit_enter(&s->admit, KS_ADMIT_GRAMMAR);
        int grc = ks_engine_grammar_check(m->engine, pl->tp.grammar, err, sizeof err);
        ks_admit_leave(&s->admit);
        if (grc) {
            ks_api_error_set(e, 400, T_INVALID, "invalid_grammar", "grammar", "Invalid grammar: %.300s", err);
            return KS_EINVAL;
        }
        return 0;
    }
    if (!rq->structured) return 0;
    if (rq->grammar) {
        if (!(pl->grammar = strdup(rq->grammar))) return ks__api_oom(e);
    } else {
        int rc = ks__plan_schemas(rq, e);
        if (rc) return rc;
        char *schema = rq->json_schema ? json_dumps(rq->json_schema, JSON_COMPACT) : strdup("{}");
        if (!schema) return ks__api_oom(e);
        ks_admit_enter(&s->admit, KS_ADMIT_GRAMMAR);
        rc = ks_chat_tmpl_schema_to_grammar(schema, &pl->grammar, err, sizeof err);
        ks_admit_leave(&s->admit);
        free(schema);
        if (rc == KS_EINVAL) {
            ks_api_error_set(e, 400, T_INVALID, "invalid_schema", "response_format",
                             "The JSON schema cannot be used: %.300s", err);
            return rc;
        }
        if (rc) return ks__api_oom(e);
    }
    ks_admit_enter(&s->admit, KS_ADMIT_GRAMMAR);
    int grc = ks_engine_grammar_check(m->engine, pl->grammar, err, sizeof err);
    ks_admit_leave(&s->admit);
    if (grc) {
        ks_api_error_set(e, 400, T_INVALID, "invalid_grammar", "grammar", "Invalid grammar: %.300s", err);
        return KS_EINVAL;
    }
    return 0;
}

/* The sampling a request adds (engine.h). */
ks_sample_ext ks__plan_ext(const ks_api_request *rq, const ks_plan *pl) {
    ks_sample_ext x = {0};
    if (pl->templated && pl->tp.grammar) {
        x.grammar = pl->tp.grammar;
        x.grammar_lazy = pl->tp.grammar_lazy;
        x.trigger_patterns = (const char *const *)pl->tp.trigger_patterns;
        x.n_trigger_patterns = pl->tp.n_trigger_patterns;
        x.trigger_tokens = pl->tp.trigger_tokens;
        x.n_trigger_tokens = pl->tp.n_trigger_tokens;
        x.grammar_prefill = pl->tp.grammar_prefill;
        x.n_grammar_prefill = pl->tp.n_grammar_prefill;
    } else if (pl->grammar) {
        x.grammar = pl->grammar;
    }
    x.logit_bias = pl->bias;
    x.n_logit_bias = pl->n_bias;
    x.repeat_penalty = rq->repeat_penalty;
    x.repeat_last_n = rq->repeat_last_n;
    x.frequency_penalty = rq->frequency_penalty;
    x.presence_penalty = rq->presence_penalty;
    x.ignore_eos = rq->ignore_eos;
    x.n_probs = rq->logprobs ? (rq->top_logprobs > 0 ? rq->top_logprobs : 1) : 0;
    if (rq->samplers_given) {
        x.ordered = true;
        memcpy(x.order, rq->sampler_order, sizeof x.order);
        x.n_order = rq->n_sampler_order;
    }
    return x;
}

/* The request's stop strings, then the template's (up to the table's size). */
void ks__plan_stops(const ks_api_request *rq, ks_plan *pl) {
    for (int i = 0; i < rq->n_stops; i++) pl->stops[pl->n_stops++] = rq->stops[i];
    int room = (int)(sizeof pl->stops / sizeof pl->stops[0]);
    for (int i = 0; i < pl->tp.n_stops && pl->n_stops < room; i++) pl->stops[pl->n_stops++] = pl->tp.stops[i];
}


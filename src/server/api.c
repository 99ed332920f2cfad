/*
 * api.c — see api.h. Request validation, response and chunk JSON.
 */
#include "server/api.h"
#include "server/api_int.h"

#include "base/textstream.h"
#include "cache/key.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---------------------------------------------------------------- parsing */
/* The library's defaults (top_k, top_p and min_p are llama-server's too),
 * sampling at llama-server's temperature instead of greedily; the seed is
 * drawn per request unless given. */
ks_sample_params ks_api_sample_defaults(void) {
    ks_sample_params sp = ks_sample_params_default();
    sp.temperature = 0.8f;
    sp.seed = 0;
    return sp;
}


/* stop: a string, or an array of up to KS_API_MAX_STOPS strings. Empty
 * strings are ignored (they could never match anything useful). */
static int parse_stop(json_t *root, ks_api_request *r, ks_api_error *err) {
    json_t *v = ks__api_field(root, "stop");
    if (!v) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) > KS_API_MAX_STOP_LEN)
            BAD("string_above_max_length", "stop", "Invalid 'stop': longer than %d bytes.",
                KS_API_MAX_STOP_LEN);
        if (json_string_length(v) > 0) r->stops[r->n_stops++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v))
        BAD("invalid_type", "stop",
            "Invalid type for 'stop': expected a string or an array of strings, but got %s instead.",
            ks__api_json_type_name(v));
    if (json_array_size(v) > KS_API_MAX_STOPS)
        BAD("array_above_max_length", "stop",
            "Invalid 'stop': array too long. Expected an array with maximum length %d, but got an "
            "array with length %zu instead.", KS_API_MAX_STOPS, json_array_size(v));
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        char param[32];
        snprintf(param, sizeof param, "stop[%zu]", i);
        if (!json_is_string(s))
            BAD("invalid_type", param, "Invalid type for '%s': expected a string, but got %s instead.",
                param, ks__api_json_type_name(s));
        if (json_string_length(s) > KS_API_MAX_STOP_LEN)
            BAD("string_above_max_length", param, "Invalid '%s': longer than %d bytes.", param,
                KS_API_MAX_STOP_LEN);
        if (json_string_length(s) > 0) r->stops[r->n_stops++] = json_string_value(s);
    }
    return 0;
}

/* The fields /v1/chat/completions and /v1/completions share. */
static int parse_common(json_t *root, ks_api_request *r, ks_api_error *err) {
    int rc;
    long long x;
    bool set;
    /* max_completion_tokens is the newer name; it wins when both are given. */
    if ((rc = ks__api_get_int(root, "max_completion_tokens", 1, INT32_MAX, &x, &set, err))) return rc;
    if (set) {
        r->max_tokens = (int)x;
    } else {
        if ((rc = ks__api_get_int(root, "max_tokens", 1, INT32_MAX, &x, &set, err))) return rc;
        if (set) r->max_tokens = (int)x;
    }
    /* llama-server's name; -1 there means "until the context is full". 0
     * is one token there (its budget is checked after a token): llama.vim
     * and llama.vscode send n_predict 0 to put their files in the cache. */
    if (!set && r->max_tokens < 0) {
        if ((rc = ks__api_get_int(root, "n_predict", -1, INT32_MAX, &x, &set, err))) return rc;
        if (set && x >= 0) r->max_tokens = x > 0 ? (int)x : 1;
    }
    if ((rc = ks__api_get_number(root, "temperature", 0.0, 2.0, &r->sample.temperature, err))) return rc;
    if ((rc = ks__api_get_number(root, "top_p", 0.0, 1.0, &r->sample.top_p, err))) return rc;
    if ((rc = ks__api_get_number(root, "min_p", 0.0, 1.0, &r->sample.min_p, err))) return rc;
    if ((rc = ks__api_get_int(root, "top_k", 0, INT32_MAX, &x, &set, err))) return rc;
    if (set) r->sample.top_k = (int)x;
    if ((rc = ks__api_get_int(root, "seed", INT64_MIN, INT64_MAX, &x, &r->seed_set, err))) return rc;
    if (r->seed_set) r->sample.seed = (uint64_t)x;
    if ((rc = parse_stop(root, r, err))) return rc;
    if ((rc = ks__api_get_bool(root, "stream", &r->stream, err))) return rc;
    json_t *so = ks__api_field(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            BAD("invalid_type", "stream_options",
                "Invalid type for 'stream_options': expected an object, but got %s instead.",
                ks__api_json_type_name(so));
        json_t *iu = ks__api_field(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            BAD("invalid_type", "stream_options.include_usage",
                "Invalid type for 'stream_options.include_usage': expected a boolean, but got %s instead.",
                ks__api_json_type_name(iu));
        r->include_usage = iu && json_is_true(iu);
    }
    if ((rc = ks__api_get_bool(root, "cache_prompt", &r->cache_prompt, err))) return rc;
    /* llama-server's n_indent (llama.vim, llama.vscode): the least indentation
     * of a line after the first, else the reply ends before it. */
    if ((rc = ks__api_get_int(root, "n_indent", 0, INT32_MAX, &x, &set, err))) return rc;
    if (set) r->n_indent = (int)x;
    /* llama-server's t_max_predict_ms (llama.vscode's latency bound). */
    if ((rc = ks__api_get_int(root, "t_max_predict_ms", 0, INT32_MAX, &x, &set, err))) return rc;
    if (set) r->t_max_predict_ms = (int)x;
    /* llama-server's per-request draft cap (a flat key with a dot); 0 turns
     * speculation off for this request. It changes how fast, never what. */
    if ((rc = ks__api_get_int(root, "speculative.n_max", 0, INT32_MAX, &x, &set, err))) return rc;
    if (set) r->draft_max = x == 0 ? -1 : x > 1024 ? 1024 : (int)x;
    return 0;
}

int ks_api_parse(ks_api_kind kind, const char *body, size_t len, ks_api_request *out,
                 ks_api_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->max_tokens = -1;
    out->sample = ks_api_sample_defaults();
    out->cache_prompt = true;
    json_t *root = NULL;
    int rc = ks__api_load_object(body, len, &root, err);
    if (rc) return rc;
    return ks_api_parse_root(kind, root, out, err);
}

int ks_api_parse_root(ks_api_kind kind, json_t *root, ks_api_request *out, ks_api_error *err) {
    return ks_api_parse_root_media(kind, root, NULL, out, err);
}

static int parse_infill(json_t *root, ks_api_request *r, ks_api_error *err);

/* infill: POST /infill's request, a completion whose prompt is made of
 * its fill-in-the-middle fields. */
static int parse_root(ks_api_kind kind, bool infill, json_t *root, const ks_media_limits *media, ks_api_request *out,
                      ks_api_error *err) {
    memset(out, 0, sizeof *out);
    out->media_limits = media;
    out->kind = kind;
    out->max_tokens = -1;
    out->sample = ks_api_sample_defaults();
    out->cache_prompt = true;
    out->root = root;
    out->infill = infill;
    int rc = kind == KS_API_CHAT ? ks__api_parse_chat(out->root, out, err)
             : infill            ? parse_infill(out->root, out, err)
                                 : ks__api_parse_prompts(out->root, out, err);
    if (rc) goto fail;
    rc = parse_common(out->root, out, err);
    if (rc) goto fail;
    rc = ks__api_parse_sampling(out->root, out, err);
    if (rc) goto fail;
    rc = ks__api_check_fields(out->root, kind, infill, &out->notes, err);
    if (rc) goto fail;
    return 0;
fail:
    ks_api_request_free(out);
    return rc;
}

int ks_api_parse_root_media(ks_api_kind kind, json_t *root, const ks_media_limits *media, ks_api_request *out,
                            ks_api_error *err) {
    return parse_root(kind, false, root, media, out, err);
}

int ks_api_parse_infill(json_t *root, ks_api_request *out, ks_api_error *err) {
    return parse_root(KS_API_COMPLETION, true, root, NULL, out, err);
}

void ks_api_request_free(ks_api_request *r) {
    if (!r) return;
    for (int i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->owned);
    free(r->msgs);
    for (int i = 0; i < r->n_prompts; i++) free(r->prompts[i].tokens);
    free(r->prompts);
    free(r->bias);
    free(r->infill_extra);
    ks__api_media_free(r);
    if (r->tmpl_req) json_decref(r->tmpl_req);
    if (r->root) json_decref(r->root);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ completions */
static int completion_extras(json_t *root, ks_api_request *r, ks_api_error *err);

static int parse_ids(json_t *arr, const char *p, ks_api_prompt *out, ks_api_error *err) {
    size_t n = json_array_size(arr);
    if (n == 0) BAD("empty_array", p, "Invalid '%s': empty array.", p);
    if (n > INT32_MAX / 2) BAD("invalid_value", p, "Invalid '%s': too many tokens.", p);
    out->tokens = malloc(n * sizeof *out->tokens);
    if (!out->tokens) return ks__api_oom(err);
    size_t i;
    json_t *t;
    json_array_foreach(arr, i, t) {
        char q[64];
        snprintf(q, sizeof q, "%s[%zu]", p, i);
        if (!json_is_integer(t))
            BAD("invalid_type", q, "Invalid type for '%s': expected a token id (integer), but got %s instead.", q,
                ks__api_json_type_name(t));
        long long x = json_integer_value(t);
        if (x < 0 || x > INT32_MAX) BAD("invalid_value", q, "Invalid '%s': %lld is not a token id.", q, x);
        out->tokens[out->n_tokens++] = (int32_t)x;
    }
    return 0;
}

/* prompt: a non-empty string, an array of token ids, or an array of several
 * prompts (strings or arrays of token ids). */
int ks__api_parse_prompts(json_t *root, ks_api_request *r, ks_api_error *err) {
    json_t *p = ks__api_field(root, "prompt");
    if (!p) BAD("missing_required_parameter", "prompt", "Missing required parameter: 'prompt'.");
    size_t n = 1;
    bool many = false;
    if (json_is_array(p)) {
        if (json_array_size(p) == 0) BAD("empty_array", "prompt", "Invalid 'prompt': empty array.");
        json_t *first = json_array_get(p, 0);
        many = json_is_string(first) || json_is_array(first);
        if (many) n = json_array_size(p);
    } else if (!json_is_string(p)) {
        BAD("invalid_type", "prompt",
            "Invalid type for 'prompt': expected a string, an array of strings or an array of "
            "token ids, but got %s instead.", ks__api_json_type_name(p));
    }
    if (n > KS_API_MAX_PROMPTS)
        BAD("array_above_max_length", "prompt", "Invalid 'prompt': at most %d prompts per request, got %zu.",
            KS_API_MAX_PROMPTS, n);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts) return ks__api_oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *e = many ? json_array_get(p, i) : p;
        char q[32];
        if (many) snprintf(q, sizeof q, "prompt[%zu]", i);
        else snprintf(q, sizeof q, "prompt");
        ks_api_prompt *o = &r->prompts[i];
        r->n_prompts = (int)i + 1;
        if (json_is_string(e)) {
            if (json_string_length(e) == 0) BAD("invalid_value", q, "Invalid '%s': empty string.", q);
            o->text = json_string_value(e);
        } else if (json_is_array(e)) {
            int rc = parse_ids(e, q, o, err);
            if (rc) return rc;
        } else {
            BAD("invalid_type", q, "Invalid type for '%s': expected a string or an array of token ids, but got %s instead.",
                q, ks__api_json_type_name(e));
        }
    }
    r->prompt = r->prompts[0].text;
    r->prompt_tokens = r->prompts[0].tokens;
    r->n_prompt_tokens = r->prompts[0].n_tokens;
    return completion_extras(root, r, err);
}

/* What a completion takes besides its prompt: structured output, logprobs,
 * and OpenAI's fields kvstash has only one value of. */
static int completion_extras(json_t *root, ks_api_request *r, ks_api_error *err) {
    int rc;
    if ((rc = ks__api_parse_structured(root, r, NULL, err))) return rc;
    /* OpenAI's legacy logprobs: an integer, the alternatives per token. */
    long long x;
    if ((rc = ks__api_get_int(root, "logprobs", 0, KS_API_MAX_TOP_LOGPROBS, &x, &r->logprobs, err))) return rc;
    if (r->logprobs) r->top_logprobs = (int)x;
    json_t *echo = ks__api_field(root, "echo");
    if (echo && !json_is_false(echo))
        BAD("unsupported_value", "echo", "Unsupported value: 'echo' is only supported as false.");
    json_t *suffix = ks__api_field(root, "suffix");
    if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        BAD("unsupported_value", "suffix", "Unsupported value: 'suffix' is not supported.");
    json_t *bo = ks__api_field(root, "best_of");
    if (bo && !(json_is_integer(bo) && json_integer_value(bo) == 1))
        BAD("unsupported_value", "best_of", "Unsupported value: 'best_of' is only supported as 1.");
    return 0;
}

/* ------------------------------------------------------------------ infill */
/* A string field of /infill: *out borrowed from root ("" when absent and not
 * required). */
static int infill_string(json_t *o, const char *key, const char *param, bool required, const char **out,
                         ks_api_error *err) {
    json_t *v = ks__api_field(o, key);
    *out = "";
    if (!v) {
        if (required) BAD("missing_required_parameter", param, "Missing required parameter: '%s'.", param);
        return 0;
    }
    if (!json_is_string(v))
        BAD("invalid_type", param, "Invalid type for '%s': expected a string, but got %s instead.", param,
            ks__api_json_type_name(v));
    *out = json_string_value(v);
    return 0;
}

/* llama-server's /infill: input_prefix and input_suffix (strings, required),
 * prompt (a string, optional: text after the prefix), input_extra (optional:
 * [{filename, text}], the other files the client sends as context). */
static int parse_infill(json_t *root, ks_api_request *r, ks_api_error *err) {
    int rc;
    if ((rc = infill_string(root, "input_prefix", "input_prefix", true, &r->infill_prefix, err)) ||
        (rc = infill_string(root, "input_suffix", "input_suffix", true, &r->infill_suffix, err)) ||
        (rc = infill_string(root, "prompt", "prompt", false, &r->infill_prompt, err)))
        return rc;
    json_t *x = ks__api_field(root, "input_extra");
    if (x && !json_is_array(x))
        BAD("invalid_type", "input_extra",
            "Invalid type for 'input_extra': expected an array of {\"filename\": string, \"text\": string}, but "
            "got %s instead.", ks__api_json_type_name(x));
    size_t n = x ? json_array_size(x) : 0;
    if (n > KS_API_MAX_INFILL_EXTRA)
        BAD("array_above_max_length", "input_extra", "Invalid 'input_extra': at most %d chunks, got %zu.",
            KS_API_MAX_INFILL_EXTRA, n);
    if (n > 0 && !(r->infill_extra = calloc(n, sizeof *r->infill_extra))) return ks__api_oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(x, i);
        char q[64];
        snprintf(q, sizeof q, "input_extra[%zu]", i);
        if (!json_is_object(c))
            BAD("invalid_type", q, "Invalid type for '%s': expected an object, but got %s instead.", q,
                ks__api_json_type_name(c));
        ks_prompt_infill_chunk *ch = &r->infill_extra[i];
        snprintf(q, sizeof q, "input_extra[%zu].text", i);
        if ((rc = infill_string(c, "text", q, true, &ch->text, err))) return rc;
        snprintf(q, sizeof q, "input_extra[%zu].filename", i);
        if ((rc = infill_string(c, "filename", q, false, &ch->filename, err))) return rc;
        if (!*ch->filename) ch->filename = "tmp"; /* llama-server's */
        r->n_infill_extra = (int)i + 1;
    }
    /* One prompt, made from these in the plan (plan.c). */
    if (!(r->prompts = calloc(1, sizeof *r->prompts))) return ks__api_oom(err);
    r->n_prompts = 1;
    return completion_extras(root, r, err);
}

/* --------------------------------------------------------------- responses */
/* Every id is 128 bits fresh from the system's CSPRNG (issue 28: ids made
 * from one seed and a counter through an invertible mix let a client who
 * saw one id compute the others, and continue another client's stored
 * conversation). Nothing links two ids; a collision takes about 2^64 of
 * them. */
void ks_api_make_id(char *buf, size_t n, const char *prefix) {
    uint8_t r[KS_API_ID_BYTES];
    char hex[2 * KS_API_ID_BYTES + 1];
    if (ks_random_secure(r, sizeof r) != 0) {
        /* No kernel randomness at all (no getrandom, no /dev/urandom): the
         * id is still unique, but guessable, and the log says so. */
        KS_ERROR("http", "no system randomness: ids are unique but not secret");
        ks_random_bytes(r, sizeof r);
    }
    ks_hex_encode(r, sizeof r, hex);
    snprintf(buf, n, "%s%s", prefix, hex);
}

const char *ks_api_finish_reason(const ks_req_result *r, bool stopped_by_string) {
    if (stopped_by_string) return "stop";
    switch (r->finish) {
    case KS_FINISH_STOP: return "stop";
    case KS_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

/* jansson refuses inf/nan: a rate over a zero duration renders as 0. */
static json_t *jreal(double x) { return json_real(isfinite(x) ? x : 0.0); }
static double per(double a, double b) { return b > 0 ? a / b : 0.0; }

json_t *ks_api_usage_json(const ks_req_result *r) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}",
                     "prompt_tokens", r->n_prompt,
                     "completion_tokens", r->n_generated,
                     "total_tokens", r->n_prompt + r->n_generated,
                     "prompt_tokens_details", "cached_tokens", r->n_cached);
}

json_t *ks_api_timings_json(const ks_req_result *r) {
    int prompt_n = r->n_prompt - r->n_cached;
    json_t *t = json_pack("{s:i, s:i, s:o, s:o, s:o, s:i, s:o, s:o, s:o}",
                     "cache_n", r->n_cached,
                     "prompt_n", prompt_n,
                     "prompt_ms", jreal(r->prompt_ms),
                     "prompt_per_token_ms", jreal(per(r->prompt_ms, prompt_n)),
                     "prompt_per_second", jreal(per(1e3 * prompt_n, r->prompt_ms)),
                     "predicted_n", r->n_generated,
                     "predicted_ms", jreal(r->gen_ms),
                     "predicted_per_token_ms", jreal(per(r->gen_ms, r->n_generated)),
                     "predicted_per_second", jreal(per(1e3 * r->n_generated, r->gen_ms)));
    /* Speculative decoding, by llama-server's names: drafted tokens verified
     * and of them accepted (only where the request drafted). */
    if (t && r->n_drafted > 0) {
        json_object_set_new(t, "draft_n", json_integer(r->n_drafted));
        json_object_set_new(t, "draft_n_accepted", json_integer(r->n_draft_accepted));
    }
    return t;
}

json_t *ks_api_cache_json(const ks_req_result *r) {
    char mode[sizeof r->cache_mode + 1], reason[sizeof r->cache_reason + 1];
    /* The scheduler's fixed-size fields need not be NUL-terminated at the edge. */
    snprintf(mode, sizeof mode, "%.*s", (int)sizeof r->cache_mode, r->cache_mode);
    snprintf(reason, sizeof reason, "%.*s", (int)sizeof r->cache_reason, r->cache_reason);
    char tier[sizeof r->cache_tier + 1];
    snprintf(tier, sizeof tier, "%.*s", (int)sizeof r->cache_tier, r->cache_tier);
    json_t *o = json_pack("{s:s, s:i, s:i}", "mode", mode[0] ? mode : "none",
                          "cached_tokens", r->n_cached, "slot", r->slot);
    if (o && reason[0]) json_object_set_new(o, "reason", json_string(reason));
    /* Where a restored state came from and what restoring it cost. */
    if (o && tier[0]) json_object_set_new(o, "tier", json_string(tier));
    if (o && r->restore_ms > 0) json_object_set_new(o, "restore_ms", jreal(r->restore_ms));
    /* cache_control breakpoints: what this request wrote, how deep the pinned prefix is. */
    if (o && r->n_cache_written > 0) json_object_set_new(o, "written_tokens", json_integer(r->n_cache_written));
    if (o && r->n_pinned > 0) json_object_set_new(o, "pinned_tokens", json_integer(r->n_pinned));
    /* The request's tools were not rendered (a template without tools): no tool call can come. */
    if (o && r->tools_ignored) json_object_set_new(o, "tools_ignored", json_true());
    return o;
}

static json_t *envelope(const ks_api_gen *g, const char *object, json_t *choices) {
    char fp[48];
    snprintf(fp, sizeof fp, "kvstash-%s", ks_version());
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "id", g->id ? g->id : "", "object", object,
                     "created", (json_int_t)g->created, "model", g->model ? g->model : "",
                     "system_fingerprint", fp, "choices", choices);
}

/* usage + timings + cache on an object (the last chunk, or the full response). */
static json_t *with_stats(json_t *o, const ks_req_result *r) {
    if (!o || !r) return o;
    json_t *u = ks_api_usage_json(r), *t = ks_api_timings_json(r), *c = ks_api_cache_json(r);
    if (!u || !t || !c) {
        json_decref(u);
        json_decref(t);
        json_decref(c);
        json_decref(o);
        return NULL;
    }
    json_object_set_new(o, "usage", u);
    json_object_set_new(o, "timings", t);
    json_object_set_new(o, "cache", c);
    return o;
}

/* One choice of a whole response. */
static json_t *choice_json(const ks_api_gen *g) {
    json_t *lp = g->logprobs ? json_deep_copy(g->logprobs) : json_null();
    const char *f = g->finish ? g->finish : "stop";
    if (g->kind == KS_API_CHAT) {
        json_t *m;
        if (g->msg) {
            m = ks_api_message_json(g->msg);
        } else {
            json_t *text = json_string(g->text ? g->text : "");
            m = text ? json_pack("{s:s, s:o}", "role", "assistant", "content", text) : NULL;
        }
        if (!m || !lp) {
            json_decref(m);
            json_decref(lp);
            return NULL;
        }
        return json_pack("{s:i, s:o, s:o, s:s}", "index", g->index, "message", m, "logprobs", lp, "finish_reason", f);
    }
    json_t *text = json_string(g->text ? g->text : "");
    if (!text || !lp) { /* not UTF-8: the textstream guarantees it is */
        json_decref(text);
        json_decref(lp);
        return NULL;
    }
    return json_pack("{s:o, s:i, s:o, s:s}", "text", text, "index", g->index, "logprobs", lp, "finish_reason", f);
}

json_t *ks_api_response_multi_json(const ks_api_gen *gs, int n, const ks_req_result *r) {
    json_t *choices = json_array();
    if (!choices) return NULL;
    for (int i = 0; i < n; i++) {
        json_t *c = choice_json(&gs[i]);
        if (!c || json_array_append_new(choices, c)) {
            json_decref(choices);
            return NULL;
        }
    }
    json_t *o = envelope(&gs[0], gs[0].kind == KS_API_CHAT ? "chat.completion" : "text_completion", choices);
    return with_stats(o, r);
}

json_t *ks_api_response_json(const ks_api_gen *g) { return ks_api_response_multi_json(g, 1, g->r); }

json_t *ks_api_chunk_delta_json(const ks_api_gen *g, json_t *delta, json_t *logprobs, const char *finish) {
    bool chat = g->kind == KS_API_CHAT;
    json_t *choice = NULL;
    if (delta && json_is_object(delta)) {
        if (chat) {
            choice = json_pack("{s:i, s:O}", "index", g->index, "delta", delta);
        } else {
            /* A completion's text is the delta's content (fmt.h's internal shape). */
            json_t *t = json_object_get(delta, "content");
            choice = t ? json_pack("{s:O, s:i}", "text", t, "index", g->index)
                       : json_pack("{s:s, s:i}", "text", "", "index", g->index);
        }
    }
    json_decref(delta);
    if (!choice) {
        json_decref(logprobs);
        return NULL;
    }
    json_object_set_new(choice, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    return envelope(g, chat ? "chat.completion.chunk" : "text_completion", json_pack("[o]", choice));
}

json_t *ks_api_chunk_json(const ks_api_gen *g, ks_api_chunk_kind k) {
    bool chat = g->kind == KS_API_CHAT;
    const char *object = chat ? "chat.completion.chunk" : "text_completion";
    json_t *choice = NULL;
    switch (k) {
    case KS_API_CHUNK_ROLE:
        choice = chat ? json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", g->index, "delta", "role", "assistant",
                                  "content", "", "logprobs", "finish_reason")
                      : json_pack("{s:s, s:i, s:n, s:n}", "text", "", "index", g->index, "logprobs", "finish_reason");
        break;
    case KS_API_CHUNK_FINISH: {
        const char *f = g->finish ? g->finish : "stop";
        choice = chat ? json_pack("{s:i, s:{}, s:n, s:s}", "index", g->index, "delta", "logprobs", "finish_reason", f)
                      : json_pack("{s:s, s:i, s:n, s:s}", "text", "", "index", g->index, "logprobs", "finish_reason", f);
        break;
    }
    case KS_API_CHUNK_USAGE: {
        json_t *o = envelope(g, object, json_array());
        return with_stats(o, g->r);
    }
    }
    if (!choice) return NULL;
    json_t *o = envelope(g, object, json_pack("[o]", choice));
    if (o && k == KS_API_CHUNK_FINISH && g->r) {
        /* llama-server puts timings on the last chunk; the cache object too. */
        json_t *t = ks_api_timings_json(g->r), *c = ks_api_cache_json(g->r);
        if (t) json_object_set_new(o, "timings", t);
        if (c) json_object_set_new(o, "cache", c);
    }
    return o;
}

/* The completions API's logprobs object: parallel arrays. */
static json_t *legacy_logprobs(const json_t *entries) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i, off = 0;
    json_t *e;
    json_array_foreach(entries, i, e) {
        const char *t = json_string_value(json_object_get(e, "token"));
        json_array_append(tokens, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += t ? strlen(t) : 0;
        json_t *top = json_object();
        size_t j;
        json_t *a;
        json_array_foreach(json_object_get(e, "top_logprobs"), j, a) {
            const char *at = json_string_value(json_object_get(a, "token"));
            json_object_set(top, at ? at : "", json_object_get(a, "logprob"));
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

json_t *ks_api_logprobs_json(ks_api_kind kind, const json_t *entries) {
    if (!entries) return NULL;
    if (json_is_string(entries)) return json_incref((json_t *)entries); /* a placeholder (lptext.h) */
    if (kind == KS_API_CHAT) return json_pack("{s:O, s:[]}", "content", entries, "refusal");
    return legacy_logprobs(entries);
}

char *ks_api_dump(const json_t *obj) {
    return json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9));
}

int ks_api_sse(ks_buf *out, const json_t *obj) {
    if (!obj) return KS_EINVAL;
    char *s = ks_api_dump(obj);
    if (!s) return KS_ENOMEM;
    int rc = ks_buf_printf(out, "data: %s\n\n", s);
    free(s);
    return rc;
}

int ks_api_sse_event(ks_buf *out, const char *name, const json_t *obj) {
    if (!obj) return KS_EINVAL;
    char *s = ks_api_dump(obj);
    if (!s) return KS_ENOMEM;
    int rc = ks_buf_printf(out, "event: %s\ndata: %s\n\n", name, s);
    free(s);
    return rc;
}

int ks_api_sse_done(ks_buf *out) { return ks_buf_append(out, "data: [DONE]\n\n", 14); }

/* The assistant message of a response (api.h). */
json_t *ks_api_message_json(const json_t *parsed) {
    json_t *content = json_object_get(parsed, "content");
    json_t *reasoning = json_object_get(parsed, "reasoning_content");
    json_t *calls = json_object_get(parsed, "tool_calls");
    bool has_calls = json_is_array(calls) && json_array_size(calls) > 0;
    const char *c = json_is_string(content) ? json_string_value(content) : "";
    json_t *m = json_pack("{s:s}", "role", "assistant");
    if (!m) return NULL;
    json_object_set_new(m, "content", has_calls && !c[0] ? json_null() : json_string(c));
    if (json_is_string(reasoning) && json_string_length(reasoning) > 0)
        json_object_set(m, "reasoning_content", reasoning);
    if (has_calls) json_object_set(m, "tool_calls", calls);
    return m;
}

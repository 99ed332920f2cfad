/*
 * api_utility.c — the JSON of llama-server's utility endpoints: /tokenize,
 * /detokenize, /props (api.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/api.h"
#include "server/api_int.h"

/* -------------------------------------------------------- utility endpoints */
/* A token id at `param` into *out: an integer in [0, n_vocab). */
static int get_token(json_t *v, const char *param, int n_vocab, int32_t *out, ks_api_error *err) {
    if (!json_is_integer(v))
        BAD("invalid_type", param, "Invalid type for '%s': expected a token id (integer), but got %s instead.",
            param, ks__api_json_type_name(v));
    long long x = json_integer_value(v);
    if (x < 0 || x >= n_vocab)
        BAD("invalid_value", param, "Invalid '%s': %lld is not a token id of this model (vocabulary of %d).",
            param, x, n_vocab);
    *out = (int32_t)x;
    return 0;
}

int ks_api_parse_tokenize(const char *body, size_t len, int n_vocab, ks_api_tokenize *out, ks_api_error *err) {
    memset(out, 0, sizeof *out);
    out->parse_special = true;
    int rc = ks__api_load_object(body, len, &out->root, err);
    if (rc) return rc;
    if ((rc = ks__api_get_bool(out->root, "add_special", &out->add_special, err))) return rc;
    if ((rc = ks__api_get_bool(out->root, "parse_special", &out->parse_special, err))) return rc;
    if ((rc = ks__api_get_bool(out->root, "with_pieces", &out->with_pieces, err))) return rc;
    json_t *c = ks__api_field(out->root, "content");
    if (!c) BAD("missing_required_parameter", "content", "Missing required parameter: 'content'.");
    if (json_is_string(c)) {
        out->parts = malloc(sizeof *out->parts);
        if (!out->parts) return ks__api_oom(err);
        out->parts[0] = (ks_api_tok_part){json_string_value(c), json_string_length(c), -1};
        out->n_parts = 1;
        return 0;
    }
    if (!json_is_array(c))
        BAD("invalid_type", "content",
            "Invalid type for 'content': expected a string or an array of strings and token ids, but got %s "
            "instead.", ks__api_json_type_name(c));
    size_t n = json_array_size(c);
    if (n > INT32_MAX / 2) BAD("invalid_value", "content", "Invalid 'content': too many elements.");
    out->parts = malloc((n ? n : 1) * sizeof *out->parts);
    if (!out->parts) return ks__api_oom(err);
    size_t i;
    json_t *v;
    json_array_foreach(c, i, v) {
        char param[32];
        snprintf(param, sizeof param, "content[%zu]", i);
        ks_api_tok_part *p = &out->parts[i];
        if (json_is_string(v)) {
            *p = (ks_api_tok_part){json_string_value(v), json_string_length(v), -1};
        } else {
            *p = (ks_api_tok_part){NULL, 0, -1};
            if (!json_is_integer(v))
                BAD("invalid_type", param, "Invalid type for '%s': expected a string or a token id, but got %s "
                    "instead.", param, ks__api_json_type_name(v));
            if ((rc = get_token(v, param, n_vocab, &p->tok, err))) return rc;
        }
        out->n_parts = (int)i + 1;
    }
    return 0;
}

void ks_api_tokenize_free(ks_api_tokenize *t) {
    if (!t) return;
    free(t->parts);
    if (t->root) json_decref(t->root);
    memset(t, 0, sizeof *t);
}

/* tokens of a /detokenize body into *tokens (owned) and *n. */
static int detok_ids(json_t *root, int n_vocab, int32_t **tokens, int *n, ks_api_error *err) {
    json_t *a = ks__api_field(root, "tokens");
    if (!a) BAD("missing_required_parameter", "tokens", "Missing required parameter: 'tokens'.");
    if (!json_is_array(a))
        BAD("invalid_type", "tokens", "Invalid type for 'tokens': expected an array of token ids, but got %s instead.",
            ks__api_json_type_name(a));
    size_t m = json_array_size(a);
    if (m > INT32_MAX / 2) BAD("invalid_value", "tokens", "Invalid 'tokens': too many tokens.");
    if (m && !(*tokens = malloc(m * sizeof **tokens))) return ks__api_oom(err);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        char param[32];
        snprintf(param, sizeof param, "tokens[%zu]", i);
        int rc = get_token(v, param, n_vocab, &(*tokens)[i], err);
        if (rc) return rc;
    }
    *n = (int)m;
    return 0;
}

int ks_api_parse_detokenize(const char *body, size_t len, int n_vocab, int32_t **tokens, int *n,
                            ks_api_error *err) {
    *tokens = NULL;
    *n = 0;
    json_t *root = NULL;
    int rc = ks__api_load_object(body, len, &root, err);
    if (!rc) rc = detok_ids(root, n_vocab, tokens, n, err);
    if (rc) {
        free(*tokens);
        *tokens = NULL;
        *n = 0;
    }
    json_decref(root);
    return rc;
}

json_t *ks_api_token_piece_json(int32_t id, const char *piece, size_t len) {
    /* jansson refuses invalid UTF-8, which is exactly the test wanted. */
    json_t *p = json_stringn(piece ? piece : "", piece ? len : 0);
    if (!p) {
        p = json_array();
        for (size_t i = 0; p && i < len; i++)
            if (json_array_append_new(p, json_integer((unsigned char)piece[i]))) {
                json_decref(p);
                p = NULL;
            }
        if (!p) return NULL;
    }
    return json_pack("{s:i, s:o}", "id", (int)id, "piece", p);
}

/* A string that may not be valid UTF-8 (token texts): "" then. */
static json_t *str_or_empty(const char *s) {
    json_t *j = json_string(s ? s : "");
    return j ? j : json_string("");
}

/* A float setting as the decimal it was written as (0.8, not 0.800000012). */
static double setting(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)x);
    return strtod(b, NULL);
}

/* ["a", "b"] from "a,b" ([] from ""); NULL on ENOMEM. */
static json_t *csv_array(const char *csv) {
    json_t *a = json_array();
    for (const char *q = csv; a && *q;) {
        size_t n = strcspn(q, ",");
        if (json_array_append_new(a, json_stringn(q, n))) {
            json_decref(a);
            return NULL;
        }
        q += n + (q[n] == ',');
    }
    return a;
}

/* kvstash.offload of /props: the devices in use, the layers each holds,
 * where the KV lives, the offload settings in force. NULL on ENOMEM. */
static json_t *offload_json(const ks_engine_offload *o) {
    json_t *devs = json_array();
    for (int i = 0; devs && i < o->n_devices; i++) {
        const ks_engine_device *d = &o->dev[i];
        json_t *j = json_pack("{s:s, s:s, s:i, s:b, s:I, s:I}", "name", d->name, "description", d->desc, "layers",
                              d->n_layers, "kv", d->kv, "memory_free", (json_int_t)d->mem_free, "memory_total",
                              (json_int_t)d->mem_total);
        if (!j || json_array_append_new(devs, j)) {
            json_decref(devs);
            devs = NULL;
        }
    }
    if (!devs) return NULL;
    return json_pack("{s:o, s:i, s:i, s:s, s:b, s:b, s:s, s:i}", "devices", devs, "gpu_layers", o->n_gpu_layers,
                     "layers", o->n_layers, "kv", o->kv, "kv_offload", o->kv_offload, "op_offload", o->op_offload,
                     "split_mode", ks_offload_split_mode_name(o->split_mode), "main_gpu", o->main_gpu);
}

json_t *ks_api_props_json(const ks_api_props *p) {
    ks_sample_params sp = ks_api_sample_defaults();
    char build[96];
    snprintf(build, sizeof build, "kvstash-%s llama.cpp-%s", ks_version(),
             p->llama_version ? p->llama_version : "unknown");
    /* llama-server's names; seed 4294967295 (LLAMA_DEFAULT_SEED) means "drawn
     * per request", which is what kvstash does for a request without one. */
    json_t *params = json_pack("{s:I, s:f, s:i, s:f, s:f, s:i, s:i, s:b, s:[s,s,s,s]}",
                               "seed", (json_int_t)4294967295LL, "temperature", setting(sp.temperature),
                               "top_k", sp.top_k, "top_p", setting(sp.top_p), "min_p", setting(sp.min_p),
                               "max_tokens", p->default_max_tokens, "n_predict", p->default_max_tokens,
                               "stream", false, "samplers", "top_k", "top_p", "min_p", "temperature");
    json_t *ks = json_pack("{s:s, s:b, s:b, s:b, s:s, s:s}", "version", ks_version(), "cache_prompt", p->cache_prompt,
                           "exact", p->exact, "flash_attn", p->flash_attn, "cache_type_k",
                           p->cache_type_k ? p->cache_type_k : "f16", "cache_type_v",
                           p->cache_type_v ? p->cache_type_v : "f16");
    if (ks && p->exact_mode && json_object_set_new(ks, "exact_mode", json_string(p->exact_mode))) {
        json_decref(ks);
        ks = NULL;
    }
    if (ks && p->probe &&
        (json_object_set_new(ks, "probe", json_string(p->probe)) ||
         json_object_set_new(ks, "repacked", json_boolean(p->repacked)))) {
        json_decref(ks);
        ks = NULL;
    }
    if (ks && p->n_expert > 0 &&
        (json_object_set_new(ks, "n_expert", json_integer(p->n_expert)) ||
         json_object_set_new(ks, "n_expert_used", json_integer(p->n_expert_used)))) {
        json_decref(ks);
        ks = NULL;
    }
    if (ks && p->spec_type) {
        json_t *sp = json_pack("{s:s, s:i, s:b, s:b}", "type", p->spec_type, "draft_max", p->draft_max, "active",
                               p->spec_on, "exact", p->spec_on && p->spec_exact);
        if (sp && p->spec_reason && strcmp(p->spec_type, "none"))
            json_object_set_new(sp, "reason", json_string(p->spec_reason));
        if (!sp || json_object_set_new(ks, "speculative", sp)) {
            json_decref(ks);
            ks = NULL;
        }
        if (params) {
            json_object_set_new(params, "speculative.types", json_string(p->spec_type));
            json_object_set_new(params, "speculative.n_max", json_integer(p->draft_max));
        }
    }
    if (ks && p->exact_reason && json_object_set_new(ks, "exact_reason", json_string(p->exact_reason))) {
        json_decref(ks);
        ks = NULL;
    }
    if (ks && p->offload && json_object_set_new(ks, "offload", offload_json(p->offload))) {
        json_decref(ks);
        ks = NULL;
    }
    if (ks && p->gpu_backends && json_object_set_new(ks, "gpu_backends", csv_array(p->gpu_backends))) {
        json_decref(ks);
        ks = NULL;
    }
    if (ks && p->cpu_backend && json_object_set_new(ks, "cpu_backend", json_string(p->cpu_backend))) {
        json_decref(ks);
        ks = NULL;
    }
    if (ks && p->store && json_object_set_new(ks, "store", json_string(p->store))) {
        json_decref(ks);
        ks = NULL;
    }
    if (!params || !ks) {
        json_decref(params);
        json_decref(ks);
        return NULL;
    }
    return json_pack("{s:{s:o, s:i}, s:i, s:o, s:o, s:{s:b, s:b, s:b}, s:b, s:b, s:b, s:o, s:o, s:o, s:s, "
                     "s:b, s:o}",
                     "default_generation_settings", "params", params, "n_ctx", p->n_ctx,
                     "total_slots", p->total_slots,
                     "model_alias", str_or_empty(p->model_alias),
                     "model_path", str_or_empty(p->model_path),
                     "modalities", "vision", p->vision, "video", false, "audio", p->audio,
                     "endpoint_slots", true, "endpoint_props", false, "endpoint_metrics", true,
                     "chat_template", str_or_empty(p->chat_template),
                     "bos_token", str_or_empty(p->bos_token),
                     "eos_token", str_or_empty(p->eos_token),
                     "build_info", build,
                     "is_sleeping", false,
                     "kvstash", ks);
}


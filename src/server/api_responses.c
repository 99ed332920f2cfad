/*
 * api_responses.c — the OpenAI Responses API (POST /v1/responses) as a
 * translation: a request becomes a chat request (api_chat.c parses it, the
 * model's template renders it). Its reply, the chat output as Responses
 * output items and typed events, is api_responses_out.c's.
 *
 * Pure JSON, like api.c: unit-tested without a model (tests/unit/test_api_wire.c).
 *
 * NOTES
 *  1. Field names in errors are the Responses ones (input[2].content[0].type),
 *     because the translation checks every item before the chat parser sees
 *     it; the chat parser's own checks only meet fields both APIs share
 *     (temperature, top_p, tools[i] after the rename).
 *  2. previous_response_id is resolved by the server (it keeps conversations,
 *     fmt_responses.c); here it is the chat messages that come before the input.
 */
#include "server/api.h"
#include "server/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fields of a Responses request. */
static const char *const RESP_FIELDS[] = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "stream", "previous_response_id", "store", "reasoning",
    "truncation", "background",
    /* llama-server's extensions, as on chat */
    "seed", "top_k", "min_p", "cache_prompt", "repeat_penalty", "repeat_last_n", "presence_penalty",
    "frequency_penalty", "ignore_eos", "chat_template_kwargs", "id_slot", "stop", "logit_bias",
    "speculative.n_max",
    NULL};
/* Accepted and ignored, silently (docs/SERVER.md): they steer OpenAI's
 * service (accounting, its prompt cache's routing and retention, which extra
 * outputs its stored responses include, Codex's client_metadata) and change
 * nothing a local model generates. */
static const char *const RESP_IGNORED[] = {
    "user", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
    "include", "stream_options", "client_metadata", "top_logprobs", "max_tool_calls",
    NULL};
/* Refused: honouring them would need what this server does not have (server-
 * side conversations and prompt templates), and ignoring them would change
 * what is generated. n: a chat field, several choices (not in Responses). */
static const char *const RESP_REFUSED[] = {"n", "conversation", "prompt", NULL};
/* Passed to the chat request as they are. */
/* Nested objects (ks__api_nested). Ignored silently: reasoning.summary and
 * generate_summary (what OpenAI's service writes about its reasoning),
 * text.verbosity (a hosted model's steering; Codex sends it), a format's
 * strict and description (the schema is followed anyway). */
static const char *const N_REASONING[] = {"effort", NULL};
static const char *const N_REASONING_IGN[] = {"summary", "generate_summary", NULL};
static const char *const N_TEXT[] = {"format", NULL};
static const char *const N_TEXT_IGN[] = {"verbosity", NULL};
static const char *const N_FORMAT[] = {"type", "schema", "name", NULL};
static const char *const N_FORMAT_IGN[] = {"strict", "description", NULL};
static const ks__api_nested RESP_NESTED[] = {
    {"reasoning", N_REASONING, N_REASONING_IGN, NULL},
    {"text", N_TEXT, N_TEXT_IGN, NULL},
    {"text.format", N_FORMAT, N_FORMAT_IGN, NULL},
    {NULL, NULL, NULL, NULL},
};
static const char *const PASS_FIELDS[] = {
    "model", "temperature", "top_p", "stream", "parallel_tool_calls", "seed", "top_k", "min_p", "cache_prompt",
    "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "ignore_eos",
    "chat_template_kwargs", "id_slot", "stop", "logit_bias", "speculative.n_max",
    NULL};

int ks_api_responses_prev_id(json_t *root, const char **id, ks_api_error *err) {
    *id = NULL;
    json_t *p = ks__api_field(root, "previous_response_id");
    if (!p) return 0;
    int rc = ks__api_want(p, JSON_STRING, "a string", "previous_response_id", err);
    if (rc) return rc;
    *id = json_string_value(p);
    return 0;
}

/* ------------------------------------------------------------ input items */
typedef struct tr {
    json_t *msgs;          /* chat messages being built */
    json_t *calls;         /* the open assistant message's tool_calls (borrowed), NULL: none */
    json_t *asst;          /* the last message when it is an assistant one (borrowed) */
    char *reasoning;       /* reasoning text waiting for its assistant message */
} tr;

static json_t *new_assistant(tr *t) {
    json_t *m = json_pack("{s:s, s:n}", "role", "assistant", "content");
    if (!m || json_array_append_new(t->msgs, m)) return NULL;
    if (t->reasoning) {
        json_object_set_new(m, "reasoning_content", json_string(t->reasoning));
        free(t->reasoning);
        t->reasoning = NULL;
    }
    t->asst = m;
    t->calls = NULL;
    return m;
}

static int push_msg(tr *t, json_t *m, ks_api_error *err) {
    if (!m || json_array_append_new(t->msgs, m)) return ks__api_oom(err);
    t->asst = NULL;
    t->calls = NULL;
    return 0;
}

/* An input_image part at q ({image_url: a data URL, detail} — file_id
 * refused: there is no Files API here) as a chat image part with q's path
 * (new reference); NULL with err filled. */
static json_t *input_image(json_t *part, const char *q, ks_api_error *err) {
    json_t *url = json_object_get(part, "image_url"), *detail = json_object_get(part, "detail");
    char uq[128];
    snprintf(uq, sizeof uq, "%s.image_url", q);
    if (!url && json_object_get(part, "file_id")) {
        snprintf(uq, sizeof uq, "%s.file_id", q);
        ks_api_error_set(err, 400, T_INVALID, "unsupported_value", uq, "Invalid '%s': this server has no Files API; "
                         "send the image as 'image_url' with a base64 data URL (data:image/png;base64,...).", uq);
        return NULL;
    }
    if (!json_is_string(url)) {
        ks_api_error_set(err, 400, T_INVALID, url ? "invalid_type" : "missing_required_parameter", uq,
                         "Invalid '%s': expected a string (a base64 data URL).", uq);
        return NULL;
    }
    json_t *body = json_pack("{s:O}", "url", url);
    if (body && detail) json_object_set(body, "detail", detail);
    json_t *p = body ? ks__api_media_chat_part("image_url", body, uq) : NULL;
    json_decref(body);
    if (!p) ks__api_oom(err);
    return p;
}

/* content: a string, or parts of type input_text / output_text / text /
 * refusal joined with "\n" (the chat parser's rule), input_image and
 * input_audio as chat media parts (api_media.c checks them). The parts'
 * cache_control goes to the message. */
static int item_content(json_t *c, const char *p, json_t *msg, ks_api_error *err) {
    if (json_is_string(c)) return json_object_set(msg, "content", c) ? ks__api_oom(err) : 0;
    if (!json_is_array(c))
        BAD("invalid_type", p, "Invalid type for '%s': expected a string or an array of content parts, but got %s instead.",
            p, ks__api_json_type_name(c));
    json_t *parts = json_array();
    if (!parts) return ks__api_oom(err);
    bool media = false;
    int rc = 0;
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        char q[144], pq[112];
        snprintf(pq, sizeof pq, "%s[%zu]", p, j);
        json_t *cp = NULL;
        const char *type = json_is_object(part) ? json_string_value(json_object_get(part, "type")) : NULL;
        snprintf(q, sizeof q, "%s.type", pq);
        if (!json_is_object(part)) {
            ks_api_error_set(err, 400, T_INVALID, "invalid_type", pq, "Invalid type for '%s': expected a content part "
                             "object.", pq);
        } else if (!type) {
            ks_api_error_set(err, 400, T_INVALID, "missing_required_parameter", q, "Missing required parameter: "
                             "'%s'.", q);
        } else if (!strcmp(type, "input_image")) {
            cp = input_image(part, pq, err);
            media = true;
        } else if (!strcmp(type, "input_audio")) {
            snprintf(q, sizeof q, "%s.input_audio", pq);
            json_t *a = json_object_get(part, "input_audio");
            cp = json_is_object(a) ? ks__api_media_chat_part("input_audio", a, pq) : NULL;
            if (!cp) ks_api_error_set(err, 400, T_INVALID, "invalid_value", q, "Invalid '%s': expected {\"data\": "
                                      "base64, \"format\": \"wav\" | \"mp3\"}.", q);
            media = true;
        } else if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
                   strcmp(type, "refusal")) {
            ks_api_error_set(err, 400, T_INVALID, "unsupported_value", q,
                             "Invalid value for '%s': '%.32s' is not supported; this server takes input_text, "
                             "output_text, refusal, input_image and input_audio.", q, type);
        } else {
            const char *key = !strcmp(type, "refusal") ? "refusal" : "text";
            json_t *text = json_object_get(part, key);
            snprintf(q, sizeof q, "%s.%s", pq, key);
            if (!json_is_string(text))
                ks_api_error_set(err, 400, T_INVALID, "missing_required_parameter", q,
                                 "Missing required parameter: '%s' (a string).", q);
            else if (!(cp = json_pack("{s:s, s:O}", "type", "text", "text", text)))
                ks__api_oom(err);
        }
        if (!cp) {
            rc = ks__api_err_rc(err);
            break;
        }
        if (json_array_append_new(parts, cp)) {
            rc = ks__api_oom(err);
            break;
        }
        json_t *cc = json_object_get(part, "cache_control");
        if (cc) json_object_set(msg, "cache_control", cc);
    }
    json_t *content = rc ? NULL : ks__api_parts_content(parts, media);
    json_decref(parts);
    if (!rc && (!content || json_object_set_new(msg, "content", content))) rc = ks__api_oom(err);
    return rc;
}

/* it.key, required, into *v; a string unless any (content may be parts); q
 * receives its path "p.key". */
static int need(json_t *it, const char *p, const char *key, bool any, json_t **v, char *q, size_t qn,
                ks_api_error *err) {
    snprintf(q, qn, "%s.%s", p, key);
    *v = json_object_get(it, key);
    if (!*v) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    return any ? 0 : ks__api_want(*v, JSON_STRING, "a string", q, err);
}

static int item_message(tr *t, json_t *it, const char *p, ks_api_error *err) {
    char q[96];
    json_t *role, *c;
    int rc = need(it, p, "role", false, &role, q, sizeof q, err);
    if (rc) return rc;
    const char *r = json_string_value(role);
    if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant"))
        BAD("invalid_value", q,
            "Invalid value for '%s': '%.32s' is not supported. Supported values are: 'user', 'system', "
            "'developer' and 'assistant'.", q, r);
    if ((rc = need(it, p, "content", true, &c, q, sizeof q, err))) return rc;
    json_t *m;
    if (!strcmp(r, "assistant")) {
        if (!(m = new_assistant(t))) return ks__api_oom(err);
    } else {
        m = json_pack("{s:s}", "role", r);
        if ((rc = push_msg(t, m, err))) return rc;
    }
    if ((rc = item_content(c, q, m, err))) return rc;
    json_t *cc = json_object_get(it, "cache_control");
    if (cc) json_object_set(m, "cache_control", cc);
    return 0;
}

/* A function call, or a custom tool's call (custom: its input becomes the
 * one-string arguments {"input": ...} the template saw the tool take); a
 * function of a namespace group is called by its chat name, ns__name. */
static int item_function_call(tr *t, json_t *it, const char *p, bool custom, ks_api_error *err) {
    const char *const keys[] = {"call_id", "name", custom ? "input" : "arguments"};
    json_t *v[3];
    for (int k = 0; k < 3; k++) {
        char q[96];
        int rc = need(it, p, keys[k], false, &v[k], q, sizeof q, err);
        if (rc) return rc;
    }
    if (!t->asst && !new_assistant(t)) return ks__api_oom(err);
    if (!t->calls) {
        t->calls = json_array();
        if (!t->calls || json_object_set_new(t->asst, "tool_calls", t->calls)) return ks__api_oom(err);
    }
    const char *ns = json_string_value(json_object_get(it, "namespace"));
    char name[256];
    snprintf(name, sizeof name, "%s%s%s", ns ? ns : "", ns ? "__" : "", json_string_value(v[1]));
    char *args = NULL;
    if (custom) {
        json_t *a = json_pack("{s:O}", "input", v[2]);
        args = a ? json_dumps(a, JSON_COMPACT) : NULL;
        json_decref(a);
    }
    json_t *tc = custom && !args ? NULL
                                 : json_pack("{s:O, s:s, s:{s:s, s:s}}", "id", v[0], "type", "function", "function",
                                             "name", name, "arguments", args ? args : json_string_value(v[2]));
    free(args);
    if (!tc || json_array_append_new(t->calls, tc)) return ks__api_oom(err);
    return 0;
}

/* function_call_output and custom_tool_call_output alike. */
static int item_function_output(tr *t, json_t *it, const char *p, ks_api_error *err) {
    char q[96];
    json_t *id, *out;
    int rc = need(it, p, "call_id", false, &id, q, sizeof q, err);
    if (rc || (rc = need(it, p, "output", true, &out, q, sizeof q, err))) return rc;
    json_t *m = json_pack("{s:s, s:O}", "role", "tool", "tool_call_id", id);
    if ((rc = push_msg(t, m, err))) return rc;
    return item_content(out, q, m, err);
}

/* A reasoning item's text rides on the next assistant message. */
static int item_reasoning(tr *t, json_t *it, const char *p, ks_api_error *err) {
    (void)p;
    ks_buf b = {0};
    json_t *parts = json_object_get(it, "content");
    if (!json_array_size(parts)) parts = json_object_get(it, "summary");
    size_t j;
    json_t *part;
    json_array_foreach(parts, j, part) {
        const char *text = json_string_value(json_object_get(part, "text"));
        if (!text) continue;
        if ((b.len && ks_buf_append(&b, "\n", 1)) || ks_buf_append(&b, text, strlen(text))) {
            ks_buf_free(&b);
            return ks__api_oom(err);
        }
    }
    free(t->reasoning);
    t->reasoning = b.s;
    t->asst = NULL; /* what follows is a new assistant message */
    t->calls = NULL;
    return 0;
}

static int input_items(tr *t, json_t *input, ks_api_error *err) {
    if (json_is_string(input)) {
        if (json_string_length(input) == 0) BAD("invalid_value", "input", "Invalid 'input': empty string.");
        return push_msg(t, json_pack("{s:s, s:O}", "role", "user", "content", input), err);
    }
    if (!json_is_array(input))
        BAD("invalid_type", "input", "Invalid type for 'input': expected a string or an array of items, but got %s instead.",
            ks__api_json_type_name(input));
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it) {
        char p[48];
        snprintf(p, sizeof p, "input[%zu]", i);
        if (!json_is_object(it)) BAD("invalid_type", p, "Invalid type for '%s': expected an item object.", p);
        json_t *type = json_object_get(it, "type");
        const char *ty = json_string_value(type);
        int rc;
        if (type && !ty) {
            char q[64];
            snprintf(q, sizeof q, "%s.type", p);
            BAD("invalid_type", q, "Invalid type for '%s': expected a string.", q);
        }
        if (!ty || !strcmp(ty, "message")) rc = item_message(t, it, p, err);
        else if (!strcmp(ty, "function_call")) rc = item_function_call(t, it, p, false, err);
        else if (!strcmp(ty, "custom_tool_call")) rc = item_function_call(t, it, p, true, err);
        else if (!strcmp(ty, "function_call_output") || !strcmp(ty, "custom_tool_call_output"))
            rc = item_function_output(t, it, p, err);
        else if (!strcmp(ty, "reasoning")) rc = item_reasoning(t, it, p, err);
        else {
            char q[64];
            snprintf(q, sizeof q, "%s.type", p);
            BAD("unsupported_value", q,
                "Invalid value for '%s': '%.40s' items are not supported. Supported item types are: 'message', "
                "'function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output' and "
                "'reasoning'.", q, ty);
        }
        if (rc) return rc;
    }
    if (json_array_size(t->msgs) == 0) BAD("empty_array", "input", "Invalid 'input': empty array.");
    return 0;
}

/* ------------------------------------------------------------ tools, text */
/* A function tool t (Responses' flat shape) as a chat tool named name. */
static int add_function(json_t *out, json_t *t, const char *p, const char *name, ks_api_error *err) {
    char q[96];
    snprintf(q, sizeof q, "%s.name", p);
    if (!name) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    json_t *fn = json_pack("{s:s}", "name", name);
    if (!fn) return ks__api_oom(err);
    static const char *const keys[] = {"description", "parameters", "strict"};
    for (int k = 0; k < 3; k++) {
        json_t *v = ks__api_field(t, keys[k]);
        if (v) json_object_set(fn, keys[k], v);
    }
    json_t *o = json_pack("{s:s, s:o}", "type", "function", "function", fn);
    json_t *cc = json_object_get(t, "cache_control");
    if (o && cc) json_object_set(o, "cache_control", cc);
    return !o || json_array_append_new(out, o) ? ks__api_oom(err) : 0;
}

/* A custom (freeform) tool: the model writes its input as plain text (Codex's
 * apply_patch). The template sees a function of one string, "input"; the
 * grammar of its format (a Lark grammar) is described, not enforced. */
static int add_custom(json_t *out, json_t *t, const char *name, ks_api_error *err) {
    const char *desc = json_string_value(json_object_get(t, "description"));
    json_t *params = json_pack("{s:s, s:{s:{s:s, s:s}}, s:[s], s:b}", "type", "object", "properties", "input",
                               "type", "string", "description", "the tool's input, as plain text", "required",
                               "input", "additionalProperties", 0);
    json_t *fn = params ? json_pack("{s:s, s:s, s:o}", "name", name, "description", desc ? desc : "", "parameters",
                                    params)
                        : NULL;
    json_t *o = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
    return !o || json_array_append_new(out, o) ? ks__api_oom(err) : 0;
}

static int map_tool(json_t **map, const char *chat_name, json_t *entry, ks_api_error *err) {
    if (!entry || (!*map && !(*map = json_object())) || json_object_set_new(*map, chat_name, entry))
        return ks__api_oom(err);
    return 0;
}

/* tools: function tools as they are; the function tools of a namespace group
 * as "<namespace>__<name>" (names unique across groups, and what agents'
 * MCP tools are often called); custom tools as functions of one string;
 * OpenAI's hosted tools (web_search, file_search, code_interpreter, ...) and
 * Codex's client-side tool_search (it searches tools this server never
 * defers) dropped with a note. */
static int tools_to_chat(json_t *root, json_t *chat, ks_api_resp_req *rr, ks_api_error *err) {
    json_t *tools = ks__api_field(root, "tools");
    if (!tools) return 0;
    int rc = ks__api_want(tools, JSON_ARRAY, "an array", "tools", err);
    if (rc) return rc;
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "tools", out)) return ks__api_oom(err);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char p[48], q[64];
        snprintf(p, sizeof p, "tools[%zu]", i);
        if ((rc = ks__api_want(t, JSON_OBJECT, "an object", p, err))) return rc;
        const char *ty = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        snprintf(q, sizeof q, "%s.type", p);
        if (!ty) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
        if (!strcmp(ty, "function")) {
            if ((rc = add_function(out, t, p, name, err))) return rc;
        } else if (!strcmp(ty, "custom")) {
            snprintf(q, sizeof q, "%s.name", p);
            if (!name) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
            if ((rc = add_custom(out, t, name, err)) ||
                (rc = map_tool(&rr->tool_map, name, json_pack("{s:b, s:s}", "custom", 1, "name", name), err)))
                return rc;
        } else if (!strcmp(ty, "namespace")) {
            json_t *inner = json_object_get(t, "tools");
            snprintf(q, sizeof q, "%s.name", p);
            if (!name) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
            snprintf(q, sizeof q, "%s.tools", p);
            if (!inner) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
            if ((rc = ks__api_want(inner, JSON_ARRAY, "an array", q, err))) return rc;
            size_t j;
            json_t *u;
            json_array_foreach(inner, j, u) {
                char pj[96], full[160];
                snprintf(pj, sizeof pj, "%s.tools[%zu]", p, j);
                const char *uty = json_string_value(json_object_get(u, "type"));
                const char *un = json_string_value(json_object_get(u, "name"));
                if (!json_is_object(u) || (uty && strcmp(uty, "function"))) {
                    ks_api_note(&rr->notes, pj, "a tool of a namespace that is not a function");
                    continue;
                }
                snprintf(full, sizeof full, "%s__%s", name, un ? un : "");
                if ((rc = add_function(out, u, pj, un ? full : NULL, err)) ||
                    (rc = map_tool(&rr->tool_map, full, json_pack("{s:s, s:s}", "namespace", name, "name", un), err)))
                    return rc;
            }
        } else {
            char what[64];
            snprintf(what, sizeof what, "a hosted tool (%.40s)", ty);
            ks_api_note(&rr->notes, p, what);
        }
    }
    json_t *tc = ks__api_field(root, "tool_choice");
    if (json_is_object(tc)) {
        const char *ty = json_string_value(json_object_get(tc, "type"));
        json_t *name = json_object_get(tc, "name");
        if (!ty || (strcmp(ty, "function") && strcmp(ty, "custom")) || !json_is_string(name))
            BAD("unsupported_value", "tool_choice",
                "Invalid 'tool_choice': supported values are 'auto', 'none', 'required' and {\"type\": "
                "\"function\", \"name\": ...}.");
        tc = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
        if (!tc || json_object_set_new(chat, "tool_choice", tc)) return ks__api_oom(err);
    } else if (tc && json_object_set(chat, "tool_choice", tc)) {
        return ks__api_oom(err);
    }
    return 0;
}

/* text.format -> response_format. */
static int text_to_chat(json_t *root, json_t *chat, ks_api_error *err) {
    json_t *text = ks__api_field(root, "text");
    if (!text) return 0;
    int rc = ks__api_want(text, JSON_OBJECT, "an object", "text", err);
    if (rc) return rc;
    json_t *f = ks__api_field(text, "format");
    if (!f) return 0;
    if ((rc = ks__api_want(f, JSON_OBJECT, "an object", "text.format", err))) return rc;
    const char *ty = json_string_value(json_object_get(f, "type"));
    if (!ty) BAD("missing_required_parameter", "text.format.type", "Missing required parameter: 'text.format.type'.");
    json_t *rf = NULL;
    if (!strcmp(ty, "text")) return 0;
    if (!strcmp(ty, "json_object")) {
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (!strcmp(ty, "json_schema")) {
        json_t *schema = json_object_get(f, "schema");
        if (!schema)
            BAD("missing_required_parameter", "text.format.schema", "Missing required parameter: 'text.format.schema'.");
        if ((rc = ks__api_want(schema, JSON_OBJECT, "an object", "text.format.schema", err))) return rc;
        json_t *name = json_object_get(f, "name");
        rf = json_pack("{s:s, s:{s:O, s:O}}", "type", "json_schema", "json_schema", "name",
                       json_is_string(name) ? name : json_string("response"), "schema", schema);
    } else {
        BAD("invalid_value", "text.format.type",
            "Invalid value for 'text.format.type': '%.32s' is not supported. Supported values are: 'text', "
            "'json_object' and 'json_schema'.", ty);
    }
    if (!rf || json_object_set_new(chat, "response_format", rf)) return ks__api_oom(err);
    return 0;
}

int ks_api_responses_to_chat(json_t *root, const json_t *history, ks_api_resp_req *out, ks_api_error *err) {
    memset(out, 0, sizeof *out);
    out->store = true;
    int rc = 0;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!ks__api_in_list(RESP_REFUSED, k) || !ks__api_field(root, k)) continue;
        if (!strcmp(k, "n") && json_is_integer(v) && json_integer_value(v) == 1) continue; /* one output: as asked */
        BAD("unsupported_parameter", k,
            "Unsupported parameter: '%s' is not supported by this server (it keeps no server-side conversations "
            "or prompts, and one response has one output; docs/SERVER.md).", k);
    }
    ks__api_note_unknown(root, &out->notes, RESP_FIELDS, RESP_IGNORED, RESP_REFUSED, NULL);
    ks__api_note_nested(root, RESP_NESTED, &out->notes);
    json_t *bg = ks__api_field(root, "background");
    if (bg && !json_is_false(bg))
        BAD("unsupported_value", "background", "Invalid 'background': background responses are not supported.");
    json_t *trunc = ks__api_field(root, "truncation");
    if (trunc && !(json_is_string(trunc) && !strcmp(json_string_value(trunc), "disabled")))
        BAD("unsupported_value", "truncation",
            "Invalid 'truncation': only 'disabled' is supported (a conversation longer than the context is a 400).");
    json_t *inc = ks__api_field(root, "include");
    if (inc && (rc = ks__api_want(inc, JSON_ARRAY, "an array", "include", err))) return rc;
    json_t *st = ks__api_field(root, "store");
    if (st) {
        if ((rc = ks__api_want(st, JSON_TRUE, "a boolean", "store", err))) return rc;
        out->store = json_is_true(st);
    }
    json_t *input = ks__api_field(root, "input");
    if (!input) BAD("missing_required_parameter", "input", "Missing required parameter: 'input'.");
    json_t *ins = ks__api_field(root, "instructions");
    if (ins && (rc = ks__api_want(ins, JSON_STRING, "a string", "instructions", err))) return rc;

    tr t = {0};
    json_t *chat = json_object();
    t.msgs = json_array();
    json_t *all = json_array();
    if (!chat || !t.msgs || !all) {
        rc = ks__api_oom(err);
        goto fail;
    }
    if ((rc = input_items(&t, input, err))) goto fail;
    /* The chat request: instructions, the stored conversation, this input. */
    if (ins && json_array_append_new(all, json_pack("{s:s, s:O}", "role", "system", "content", ins))) goto oom;
    if (history && json_array_extend(all, (json_t *)history)) goto oom;
    if (json_array_extend(all, t.msgs) || json_object_set(chat, "messages", all)) goto oom;
    for (const char *const *f = PASS_FIELDS; *f; f++) {
        json_t *x = ks__api_field(root, *f);
        if (x && json_object_set(chat, *f, x)) goto oom;
    }
    json_t *mot = ks__api_field(root, "max_output_tokens");
    if (mot && json_object_set(chat, "max_tokens", mot)) goto oom;
    json_t *reason = ks__api_field(root, "reasoning");
    if (reason) {
        if ((rc = ks__api_want(reason, JSON_OBJECT, "an object", "reasoning", err))) goto fail;
        json_t *effort = ks__api_field(reason, "effort");
        if (effort && json_object_set(chat, "reasoning_effort", effort)) goto oom;
    }
    if ((rc = tools_to_chat(root, chat, out, err)) || (rc = text_to_chat(root, chat, err))) goto fail;
    out->chat = chat;
    out->input = t.msgs;
    json_decref(all);
    free(t.reasoning);
    return 0;
oom:
    rc = ks__api_oom(err);
fail:
    json_decref(chat);
    json_decref(t.msgs);
    json_decref(all);
    json_decref(out->tool_map);
    out->tool_map = NULL;
    free(t.reasoning);
    return rc;
}

void ks_api_resp_req_free(ks_api_resp_req *r) {
    if (!r) return;
    json_decref(r->chat);
    json_decref(r->input);
    json_decref(r->tool_map);
    memset(r, 0, sizeof *r);
}

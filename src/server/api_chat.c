/*
 * api_chat.c — the request fields of an agent: messages with tool calls and
 * tool results, tools, structured output, the sampling fields llama-server
 * takes, several prompts and choices; and which fields exist at all.
 *
 * Validation here names the offending field (param) so that a client sees
 * which part of a long agent request was wrong; what only the template can
 * judge (a schema the converter cannot handle, a template that raises) is
 * left to the common library, whose message the server passes on (400).
 */
#include "server/api.h"
#include "server/api_int.h"
#include "server/grammarsize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ known fields */
/* Fields a request may carry. Everything else is a 400 that names it. */
static const char *const CHAT_FIELDS[] = {
    "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "json_schema",
    "grammar", "reasoning_format", "chat_template_kwargs", "enable_thinking", "reasoning_effort",
    "continue_final_message", "add_generation_prompt", "logprobs", "top_logprobs",
    NULL};
static const char *const COMPLETION_FIELDS[] = {
    "prompt", "grammar", "json_schema", "response_format", "logprobs", "echo", "suffix", "best_of",
    NULL};
static const char *const COMMON_FIELDS[] = {
    "model", "max_tokens", "max_completion_tokens", "n_predict", "temperature", "top_p", "top_k", "min_p",
    "seed", "n", "stop", "stream", "stream_options", "cache_prompt", "logit_bias", "presence_penalty",
    "frequency_penalty", "repeat_penalty", "repeat_last_n", "ignore_eos", "id_slot", "n_probs",
    "speculative.n_max", "n_indent", "t_max_predict_ms", "response_fields", "samplers",
    NULL};
/* Accepted and ignored for compatibility (docs/SERVER.md): they change
 * nothing a local server does. */
static const char *const IGNORED_FIELDS[] = {
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
    NULL};

/* Nested objects (ks__api_nested). Ignored silently: a message's refusal
 * and annotations (what OpenAI's own replies carry, sent back as they came),
 * a function's strict (the tool grammar follows the schema anyway),
 * stream_options.include_obfuscation (padding of OpenAI's stream events). */
static const char *const N_MESSAGE[] = {"role", "content", "name", "tool_calls", "tool_call_id",
                                        "reasoning_content", "cache_control", NULL};
static const char *const N_MESSAGE_IGN[] = {"refusal", "annotations", NULL};
static const char *const N_TOOL[] = {"type", "function", "cache_control", "defer_loading", NULL};
static const char *const N_FUNCTION[] = {"name", "description", "parameters", NULL};
static const char *const N_FUNCTION_IGN[] = {"strict", NULL};
static const char *const N_STREAM[] = {"include_usage", NULL};
static const char *const N_STREAM_IGN[] = {"include_obfuscation", NULL};
static const char *const N_FORMAT[] = {"type", "json_schema", "schema", NULL};
static const char *const N_SCHEMA[] = {"name", "schema", "strict", "description", NULL};
static const ks__api_nested CHAT_NESTED[] = {
    {"messages[]", N_MESSAGE, N_MESSAGE_IGN, NULL},
    {"tools[]", N_TOOL, NULL, NULL},
    {"tools[].function", N_FUNCTION, N_FUNCTION_IGN, NULL},
    {"stream_options", N_STREAM, N_STREAM_IGN, NULL},
    {"response_format", N_FORMAT, NULL, NULL},
    {"response_format.json_schema", N_SCHEMA, NULL, NULL},
    {NULL, NULL, NULL, NULL},
};

/* /infill's own (llama-server's), beside the completion's. */
static const char *const INFILL_FIELDS[] = {"input_prefix", "input_suffix", "input_extra", NULL};

int ks__api_check_fields(json_t *root, ks_api_kind kind, bool infill, ks_api_notes *notes, ks_api_error *err) {
    /* The other endpoint's own field would change what is generated if it
     * were honoured here: a mistake worth a 400, not a silent default. */
    const char *const *other = kind == KS_API_CHAT ? COMPLETION_FIELDS : CHAT_FIELDS;
    const char *const *mine = kind == KS_API_CHAT ? CHAT_FIELDS : COMPLETION_FIELDS;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (ks__api_in_list(mine, k) || !ks__api_in_list(other, k)) continue;
        char param[96];
        snprintf(param, sizeof param, "%.80s", k);
        BAD("unsupported_parameter", param,
            "Unsupported parameter: '%s' belongs to %s, not to this endpoint.", param,
            kind == KS_API_CHAT ? "/v1/completions" : "/v1/chat/completions");
    }
    ks__api_note_unknown(root, notes, COMMON_FIELDS, IGNORED_FIELDS, mine, infill ? INFILL_FIELDS : NULL);
    ks__api_note_nested(root, CHAT_NESTED, notes);
    return 0;
}

/* ------------------------------------------------------------ helpers */
static int want_string(json_t *v, const char *param, ks_api_error *err) {
    return ks__api_want(v, JSON_STRING, "a string", param, err);
}

static int want_object(json_t *v, const char *param, ks_api_error *err) {
    return ks__api_want(v, JSON_OBJECT, "an object", param, err);
}

/* ------------------------------------------------------------ cache breakpoints */
/* cache_control: {type: "ephemeral", ttl: "5m" | "1h"} at param, a
 * breakpoint after message msg (-1: the tools). */
static int parse_cache_control(json_t *cc, const char *param, int msg, ks_api_request *r, ks_api_error *err) {
    char q[128];
    int rc;
    if ((rc = want_object(cc, param, err))) return rc;
    json_t *type = ks__api_field(cc, "type");
    snprintf(q, sizeof q, "%s.type", param);
    if (!type) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    if ((rc = want_string(type, q, err))) return rc;
    if (strcmp(json_string_value(type), "ephemeral"))
        BAD("invalid_value", q, "Invalid value for '%s': only 'ephemeral' is supported.", q);
    int ttl = 300;
    json_t *t = ks__api_field(cc, "ttl");
    snprintf(q, sizeof q, "%s.ttl", param);
    if (t) {
        if ((rc = want_string(t, q, err))) return rc;
        const char *ts = json_string_value(t);
        if (!strcmp(ts, "1h")) ttl = 3600;
        else if (strcmp(ts, "5m"))
            BAD("invalid_value", q, "Invalid value for '%s': '%.16s' is not supported. Supported values are: '5m' "
                "and '1h'.", q, ts);
    }
    const char *k;
    json_t *v;
    json_object_foreach(cc, k, v) {
        if (strcmp(k, "type") && strcmp(k, "ttl")) {
            snprintf(q, sizeof q, "%s.%.32s", param, k);
            BAD("unsupported_parameter", q, "Unsupported parameter: '%s'.", q);
        }
    }
    /* Several marks on one message (or on the tools) are one breakpoint; the longer TTL wins. */
    for (int i = 0; i < r->n_bps; i++)
        if (r->bps[i].msg == msg) {
            if (ttl > r->bps[i].ttl_s) r->bps[i].ttl_s = ttl;
            return 0;
        }
    if (r->n_bps == KS_API_MAX_BREAKPOINTS)
        BAD("invalid_value", param, "Invalid '%s': a request may have at most %d cache_control breakpoints.", param,
            KS_API_MAX_BREAKPOINTS);
    r->bps[r->n_bps++] = (ks_api_breakpoint){msg, ttl};
    return 0;
}

/* The breakpoints of messages[i]: on the message, or on any of its content parts. */
static int message_breakpoints(json_t *m, size_t i, ks_api_request *r, ks_api_error *err) {
    char q[96];
    int rc;
    json_t *cc = ks__api_field(m, "cache_control");
    if (cc) {
        snprintf(q, sizeof q, "messages[%zu].cache_control", i);
        if ((rc = parse_cache_control(cc, q, (int)i, r, err))) return rc;
    }
    json_t *c = ks__api_field(m, "content");
    size_t j;
    json_t *part;
    if (json_is_array(c)) json_array_foreach(c, j, part) {
        cc = json_is_object(part) ? ks__api_field(part, "cache_control") : NULL;
        if (!cc) continue;
        snprintf(q, sizeof q, "messages[%zu].content[%zu].cache_control", i, j);
        if ((rc = parse_cache_control(cc, q, (int)i, r, err))) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------ message content */
/* One message's content: a string, or an array of {type:"text", text} parts
 * joined with "\n" (as llama.cpp's server flattens them for templates that
 * take plain text), image and audio parts as the media marker with no "\n"
 * next to it (llama-server's rule, common/chat.cpp). null only for an
 * assistant message (a tool-call turn). */
int ks__api_parse_content(json_t *m, size_t i, const char *role, ks_api_request *r,
                          const char **out, ks_api_error *err) {
    bool assistant = !strcmp(role, "assistant"), after_marker = false;
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    json_t *c = ks__api_field(m, "content");
    if (!c) {
        if (assistant) {
            *out = "";
            return 0;
        }
        BAD("missing_required_parameter", param, "Missing required parameter: '%s'.", param);
    }
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return 0;
    }
    if (!json_is_array(c))
        BAD("invalid_type", param,
            "Invalid type for '%s': expected a string or an array of content parts, but got %s instead.",
            param, ks__api_json_type_name(c));
    ks_buf b = {0};
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        char pp[96];
        snprintf(pp, sizeof pp, "%s[%zu]", param, j);
        const char *msg = NULL, *code = NULL;
        char where[112];
        snprintf(where, sizeof where, "%s", pp);
        if (!json_is_object(part)) {
            code = "invalid_type";
            msg = "expected a content part object";
        } else {
            json_t *type = ks__api_field(part, "type");
            json_t *text = ks__api_field(part, "text");
            if (!type || !json_is_string(type)) {
                code = type ? "invalid_type" : "missing_required_parameter";
                msg = "a content part needs a string 'type'";
                snprintf(where, sizeof where, "%s.type", pp);
            } else if (ks__api_media_type(json_string_value(type))) {
                int rc = ks__api_media_part(part, json_string_value(type), pp, role, r, err);
                if (rc) {
                    ks_buf_free(&b);
                    return rc;
                }
                const char *mk = ks__api_media_marker(r);
                if (ks_buf_append(&b, mk, strlen(mk))) goto nomem;
                after_marker = true;
            } else if (strcmp(json_string_value(type), "text") != 0) {
                code = "invalid_value";
                msg = "only content parts of type 'text', 'image_url' and 'input_audio' are supported";
                snprintf(where, sizeof where, "%s.type", pp);
            } else if (!text || !json_is_string(text)) {
                code = text ? "invalid_type" : "missing_required_parameter";
                msg = "a text content part needs a string 'text'";
                snprintf(where, sizeof where, "%s.text", pp);
            } else {
                if (b.len && !after_marker && ks_buf_append(&b, "\n", 1)) goto nomem;
                if (ks_buf_append(&b, json_string_value(text), json_string_length(text))) goto nomem;
                after_marker = false;
            }
        }
        if (msg) {
            ks_buf_free(&b);
            BAD(code, where, "Invalid '%s': %s.", where, msg);
        }
    }
    if (!b.s && ks_buf_append(&b, "", 0)) goto nomem;
    if (ks__api_keep(r, b.s)) return ks__api_oom(err);
    *out = b.s;
    return 0;
nomem:
    ks_buf_free(&b);
    return ks__api_oom(err);
}

/* ------------------------------------------------------------ messages */
/* {type: "function", function: {name: string, ...}} at path p (a tool, or
 * an assistant's tool call, whose type may be absent): the function object
 * and its name. what names the items in the message ("tools"). */
static int function_ref(json_t *o, const char *p, bool type_required, const char *what, json_t **fn,
                        json_t **name, ks_api_error *err) {
    char q[128];
    int rc;
    if ((rc = want_object(o, p, err))) return rc;
    json_t *type = ks__api_field(o, "type");
    snprintf(q, sizeof q, "%s.type", p);
    if (!type && type_required) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    if (type && (rc = want_string(type, q, err))) return rc;
    if (type && strcmp(json_string_value(type), "function"))
        BAD("invalid_value", q, "Invalid value for '%s': only 'function' %s are supported.", q, what);
    *fn = ks__api_field(o, "function");
    snprintf(q, sizeof q, "%s.function", p);
    if (!*fn) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    if ((rc = want_object(*fn, q, err))) return rc;
    *name = ks__api_field(*fn, "name");
    snprintf(q, sizeof q, "%s.function.name", p);
    if (!*name) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    return want_string(*name, q, err);
}

/* One assistant tool call into the template's shape: {id, type, function:
 * {name, arguments: string}}; arguments given as an object are serialized. */
static int parse_tool_call(json_t *tc, const char *p, json_t *out_calls, ks_api_error *err) {
    char q[128];
    int rc;
    json_t *fn, *name;
    if ((rc = function_ref(tc, p, false, "tool calls", &fn, &name, err))) return rc;
    json_t *args = ks__api_field(fn, "arguments");
    snprintf(q, sizeof q, "%s.function.arguments", p);
    json_t *a;
    if (!args) a = json_string("{}");
    else if (json_is_string(args)) a = json_incref(args);
    else if (json_is_object(args)) {
        char *d = json_dumps(args, JSON_COMPACT);
        a = d ? json_string(d) : NULL;
        free(d);
    } else
        BAD("invalid_type", q, "Invalid type for '%s': expected a string, but got %s instead.", q,
            ks__api_json_type_name(args));
    json_t *id = ks__api_field(tc, "id");
    snprintf(q, sizeof q, "%s.id", p);
    if (id && (rc = want_string(id, q, err))) {
        json_decref(a);
        return rc;
    }
    json_t *o = a ? json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", name, "arguments", a)
                  : NULL;
    if (o && id) json_object_set(o, "id", id);
    if (!o || json_array_append_new(out_calls, o)) return ks__api_oom(err);
    return 0;
}

/* messages[i] into r->msgs[i] (role and flattened content, for the
 * built-in-template fallback and the logs) and into the template's array. */
static int parse_message(json_t *m, size_t i, ks_api_request *r, json_t *out, ks_api_error *err) {
    char param[40], q[96];
    int rc;
    snprintf(param, sizeof param, "messages[%zu]", i);
    if ((rc = want_object(m, param, err))) return rc;
    snprintf(q, sizeof q, "%s.role", param);
    json_t *role = ks__api_field(m, "role");
    if (!role) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    if ((rc = want_string(role, q, err))) return rc;
    const char *rs = json_string_value(role), *canon;
    if (!strcmp(rs, "system") || !strcmp(rs, "developer")) canon = "system";
    else if (!strcmp(rs, "user")) canon = "user";
    else if (!strcmp(rs, "assistant")) canon = "assistant";
    else if (!strcmp(rs, "tool")) canon = "tool";
    else
        BAD("invalid_value", q,
            "Invalid value for '%s': '%.40s' is not supported. Supported values are: 'system', "
            "'developer', 'user', 'assistant' and 'tool'.", q, rs);
    bool assistant = canon[0] == 'a';
    json_t *calls = assistant ? ks__api_field(m, "tool_calls") : NULL;
    json_t *o = json_pack("{s:s}", "role", canon);
    if (!o || json_array_append_new(out, o)) return ks__api_oom(err);

    if (calls) {
        snprintf(q, sizeof q, "%s.tool_calls", param);
        if (!json_is_array(calls))
            BAD("invalid_type", q, "Invalid type for '%s': expected an array, but got %s instead.", q,
                ks__api_json_type_name(calls));
        json_t *tc_out = json_array();
        if (!tc_out || json_object_set_new(o, "tool_calls", tc_out)) return ks__api_oom(err);
        size_t j;
        json_t *tc;
        json_array_foreach(calls, j, tc) {
            char p[96];
            snprintf(p, sizeof p, "%s.tool_calls[%zu]", param, j);
            if ((rc = parse_tool_call(tc, p, tc_out, err))) return rc;
        }
        if (json_array_size(tc_out) == 0) json_object_del(o, "tool_calls");
    }
    /* An assistant turn that only calls tools may have no content. */
    int n_media = r->n_media;
    if ((rc = ks__api_parse_content(m, i, canon, r, &r->msgs[i].content, err))) return rc;
    r->msgs[i].role = canon;
    json_t *c = ks__api_field(m, "content");
    if (json_object_set_new(o, "content", c ? json_string(r->msgs[i].content) : json_null()) ||
        ks__api_media_tag(r, n_media, o))
        return ks__api_oom(err);

    if (!strcmp(canon, "tool")) {
        json_t *id = ks__api_field(m, "tool_call_id");
        snprintf(q, sizeof q, "%s.tool_call_id", param);
        if (!id) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
        if ((rc = want_string(id, q, err))) return rc;
        json_object_set(o, "tool_call_id", id);
    }
    json_t *name = ks__api_field(m, "name");
    if (name) {
        snprintf(q, sizeof q, "%s.name", param);
        if ((rc = want_string(name, q, err))) return rc;
        json_object_set(o, "name", name);
    }
    json_t *rc_ = assistant ? ks__api_field(m, "reasoning_content") : NULL;
    if (rc_) {
        snprintf(q, sizeof q, "%s.reasoning_content", param);
        if ((rc = want_string(rc_, q, err))) return rc;
        json_object_set(o, "reasoning_content", rc_);
    }
    return 0;
}

static int parse_messages(json_t *root, ks_api_request *r, json_t *tr, ks_api_error *err) {
    json_t *ms = ks__api_field(root, "messages");
    if (!ms) BAD("missing_required_parameter", "messages", "Missing required parameter: 'messages'.");
    if (!json_is_array(ms))
        BAD("invalid_type", "messages", "Invalid type for 'messages': expected an array, but got %s instead.",
            ks__api_json_type_name(ms));
    size_t n = json_array_size(ms);
    if (n == 0)
        BAD("empty_array", "messages",
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
            "array instead.");
    if (n > INT32_MAX / 2) BAD("invalid_value", "messages", "Too many messages.");
    r->msgs = calloc(n, sizeof *r->msgs);
    json_t *out = json_array();
    if (!r->msgs || !out || json_object_set_new(tr, "messages", out)) return ks__api_oom(err);
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        int rc = parse_message(m, i, r, out, err);
        if (!rc) rc = message_breakpoints(m, i, r, err);
        if (rc) return rc;
        r->n_msgs = (int)i + 1;
    }
    return 0;
}

/* ------------------------------------------------------------ tools */
/* tools and tool_choice. A named function ({type:function, function:{name}})
 * keeps only that tool and makes the call required. A tool with the kvstash
 * extension defer_loading: true (what the Messages translation gives the
 * tools a conversation loaded through tool search, api_msg_tools.c) may be
 * called but is not rendered in the template's tool list: it goes to the
 * template request's deferred_tools (chat_tmpl.h). */
static int parse_tools(json_t *root, ks_api_request *r, json_t *tr, ks_api_error *err) {
    int rc;
    json_t *tools = ks__api_field(root, "tools");
    json_t *choice = ks__api_field(root, "tool_choice");
    const char *mode = "auto";
    const char *named = NULL;
    if (choice) {
        if (json_is_string(choice)) {
            mode = json_string_value(choice);
            if (strcmp(mode, "auto") && strcmp(mode, "none") && strcmp(mode, "required"))
                BAD("invalid_value", "tool_choice",
                    "Invalid value for 'tool_choice': '%.40s' is not supported. Supported values are: "
                    "'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                    mode);
        } else if (json_is_object(choice)) {
            json_t *fn = ks__api_field(choice, "function");
            json_t *name = fn && json_is_object(fn) ? ks__api_field(fn, "name") : NULL;
            if (!name || !json_is_string(name))
                BAD("invalid_value", "tool_choice.function.name",
                    "Invalid 'tool_choice': a named tool choice needs function.name (a string).");
            named = json_string_value(name);
            mode = "required";
        } else {
            BAD("invalid_type", "tool_choice",
                "Invalid type for 'tool_choice': expected a string or an object, but got %s instead.",
                ks__api_json_type_name(choice));
        }
    }
    if (!tools) {
        if (named)
            BAD("invalid_value", "tool_choice", "Invalid 'tool_choice': it names a function but no tools were given.");
        if (!strcmp(mode, "required"))
            BAD("invalid_value", "tool_choice", "Invalid 'tool_choice': 'required' needs 'tools'.");
        return 0;
    }
    if (!json_is_array(tools))
        BAD("invalid_type", "tools", "Invalid type for 'tools': expected an array, but got %s instead.",
            ks__api_json_type_name(tools));
    json_t *out = json_array(), *deferred = json_array();
    if (!out || json_object_set_new(tr, "tools", out) || !deferred ||
        json_object_set_new(tr, "deferred_tools", deferred))
        return ks__api_oom(err);
    size_t i;
    json_t *t;
    bool found = false;
    json_array_foreach(tools, i, t) {
        char p[64], q[96];
        snprintf(p, sizeof p, "tools[%zu]", i);
        json_t *fn, *name;
        if ((rc = function_ref(t, p, true, "tools", &fn, &name, err))) return rc;
        snprintf(q, sizeof q, "%s.function.name", p);
        if (json_string_length(name) == 0 || json_string_length(name) > 64)
            BAD("invalid_value", q, "Invalid '%s': a function name has 1 to 64 characters.", q);
        json_t *desc = ks__api_field(fn, "description");
        snprintf(q, sizeof q, "%s.function.description", p);
        if (desc && (rc = want_string(desc, q, err))) return rc;
        json_t *params = ks__api_field(fn, "parameters");
        snprintf(q, sizeof q, "%s.function.parameters", p);
        if (params && (rc = want_object(params, q, err))) return rc;
        json_t *cc = ks__api_field(t, "cache_control");
        snprintf(q, sizeof q, "%s.cache_control", p);
        if (cc && (rc = parse_cache_control(cc, q, -1, r, err))) return rc;
        bool defer = false;
        snprintf(q, sizeof q, "%s.defer_loading", p);
        if ((rc = ks__api_get_bool(t, "defer_loading", &defer, err))) {
            snprintf(err->param, sizeof err->param, "%s", q);
            return rc;
        }
        if (named && strcmp(named, json_string_value(name))) continue;
        found = true;
        json_t *f = json_pack("{s:O}", "name", name);
        if (!f) return ks__api_oom(err);
        if (desc) json_object_set(f, "description", desc);
        if (params) json_object_set(f, "parameters", params);
        else json_object_set_new(f, "parameters", json_pack("{s:s, s:{}}", "type", "object", "properties"));
        if (json_array_append_new(defer ? deferred : out, json_pack("{s:s, s:o}", "type", "function", "function", f)))
            return ks__api_oom(err);
    }
    if (named && !found)
        BAD("invalid_value", "tool_choice.function.name",
            "Invalid 'tool_choice': no tool is named '%.64s'.", named);
    size_t n_deferred = json_array_size(deferred);
    if (n_deferred == 0) json_object_del(tr, "deferred_tools"); /* frees deferred */
    if (json_array_size(out) + n_deferred == 0) {
        json_object_del(tr, "tools");
        if (!strcmp(mode, "required"))
            BAD("invalid_value", "tool_choice", "Invalid 'tool_choice': 'required' needs at least one tool.");
        return 0;
    }
    if (json_object_set_new(tr, "tool_choice", json_string(mode))) return ks__api_oom(err);
    json_t *ptc = ks__api_field(root, "parallel_tool_calls");
    if (ptc) {
        if (!json_is_boolean(ptc))
            BAD("invalid_type", "parallel_tool_calls",
                "Invalid type for 'parallel_tool_calls': expected a boolean, but got %s instead.",
                ks__api_json_type_name(ptc));
        json_object_set(tr, "parallel_tool_calls", ptc);
    }
    r->has_tools = strcmp(mode, "none") != 0;
    return 0;
}

/* ------------------------------------------------------------ structured output */
/* response_format / json_schema / grammar: checked for shape here, handed to
 * the template (chat) or kept for the server (completion). */
int ks__api_parse_structured(json_t *root, ks_api_request *r, json_t *tr, ks_api_error *err) {
    int rc;
    json_t *rf = ks__api_field(root, "response_format");
    json_t *schema = ks__api_field(root, "json_schema");
    json_t *grammar = ks__api_field(root, "grammar");
    if (rf) {
        if ((rc = want_object(rf, "response_format", err))) return rc;
        json_t *type = ks__api_field(rf, "type");
        if (!type) BAD("missing_required_parameter", "response_format.type",
                       "Missing required parameter: 'response_format.type'.");
        if ((rc = want_string(type, "response_format.type", err))) return rc;
        const char *ts = json_string_value(type);
        if (!strcmp(ts, "json_schema")) {
            json_t *js = ks__api_field(rf, "json_schema");
            if (!js) BAD("missing_required_parameter", "response_format.json_schema",
                         "Missing required parameter: 'response_format.json_schema'.");
            if ((rc = want_object(js, "response_format.json_schema", err))) return rc;
            json_t *s = ks__api_field(js, "schema");
            if (s && (rc = want_object(s, "response_format.json_schema.schema", err))) return rc;
            r->json_schema = s; /* NULL: any JSON object */
            r->structured = true;
        } else if (!strcmp(ts, "json_object")) {
            json_t *s = ks__api_field(rf, "schema");
            if (s && (rc = want_object(s, "response_format.schema", err))) return rc;
            r->json_schema = s;
            r->structured = true;
        } else if (strcmp(ts, "text")) {
            BAD("invalid_value", "response_format.type",
                "Invalid value for 'response_format.type': '%.40s' is not supported. Supported values "
                "are: 'text', 'json_object' and 'json_schema'.", ts);
        }
    }
    if (schema) {
        if ((rc = want_object(schema, "json_schema", err))) return rc;
        if (rf && r->structured)
            BAD("invalid_value", "json_schema", "Invalid 'json_schema': give either 'json_schema' or 'response_format'.");
        r->json_schema = schema;
        r->structured = true;
    }
    if (grammar) {
        if ((rc = want_string(grammar, "grammar", err))) return rc;
        if (r->structured)
            BAD("invalid_value", "grammar", "Invalid 'grammar': it cannot be combined with a JSON schema.");
        if (json_string_length(grammar) > 0) {
            /* Sized before llama.cpp parses it (grammarsize.h): a short
             * grammar can crash the parser or hold the inference thread. */
            char why[256];
            size_t fanout;
            int grc = ks_grammar_size_check(json_string_value(grammar), json_string_length(grammar), &fanout, why,
                                            sizeof why);
            if (grc == KS_ENOMEM) return ks__api_oom(err);
            if (grc) BAD("grammar_too_large", "grammar", "Invalid 'grammar': %s (docs/SERVER.md, limits).", why);
            r->grammar = json_string_value(grammar);
            r->structured = true;
        }
    }
    if (r->kind == KS_API_CHAT) {
        if (r->grammar && r->has_tools)
            BAD("invalid_value", "grammar", "Invalid 'grammar': it cannot be combined with tools.");
        if (rf && json_object_set(tr, "response_format", rf)) return ks__api_oom(err);
        if (schema && json_object_set(tr, "json_schema", schema)) return ks__api_oom(err);
        if (r->grammar && json_object_set(tr, "grammar", grammar)) return ks__api_oom(err);
    }
    return 0;
}

/* The template's own options, checked for type and passed through. */
static int parse_tmpl_options(json_t *root, json_t *tr, ks_api_error *err) {
    static const struct { const char *key; json_type type; const char *what; } opts[] = {
        {"reasoning_format", JSON_STRING, "a string"},
        {"chat_template_kwargs", JSON_OBJECT, "an object"},
        {"enable_thinking", JSON_TRUE, "a boolean"},
        {"reasoning_effort", JSON_STRING, "a string"},
        {"add_generation_prompt", JSON_TRUE, "a boolean"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        json_t *v = ks__api_field(root, opts[i].key);
        if (!v) continue;
        bool ok = opts[i].type == JSON_TRUE ? json_is_boolean(v) : json_typeof(v) == opts[i].type;
        if (!ok)
            BAD("invalid_type", opts[i].key, "Invalid type for '%s': expected %s, but got %s instead.",
                opts[i].key, opts[i].what, ks__api_json_type_name(v));
        if (json_object_set(tr, opts[i].key, v)) return ks__api_oom(err);
    }
    json_t *rf = ks__api_field(root, "reasoning_format");
    if (rf) {
        const char *s = json_string_value(rf);
        if (strcmp(s, "none") && strcmp(s, "auto") && strcmp(s, "deepseek") && strcmp(s, "deepseek-legacy"))
            BAD("invalid_value", "reasoning_format",
                "Invalid value for 'reasoning_format': '%.40s' is not supported. Supported values are: "
                "'none', 'auto', 'deepseek' and 'deepseek-legacy'.", s);
    }
    json_t *cfm = ks__api_field(root, "continue_final_message");
    if (cfm) {
        if (!json_is_boolean(cfm) && !json_is_string(cfm))
            BAD("invalid_type", "continue_final_message",
                "Invalid type for 'continue_final_message': expected a boolean or a string, but got %s instead.",
                ks__api_json_type_name(cfm));
        if (json_object_set(tr, "continue_final_message", cfm)) return ks__api_oom(err);
    }
    return 0;
}

int ks__api_parse_chat(json_t *root, ks_api_request *r, ks_api_error *err) {
    r->tmpl_req = json_object();
    if (!r->tmpl_req) return ks__api_oom(err);
    int rc;
    if ((rc = parse_messages(root, r, r->tmpl_req, err))) return rc;
    if ((rc = parse_tools(root, r, r->tmpl_req, err))) return rc;
    if ((rc = ks__api_parse_structured(root, r, r->tmpl_req, err))) return rc;
    if ((rc = parse_tmpl_options(root, r->tmpl_req, err))) return rc;
    /* logprobs (bool) + top_logprobs */
    bool lp = false;
    if ((rc = ks__api_get_bool(root, "logprobs", &lp, err))) return rc;
    r->logprobs = lp;
    long long x;
    bool set;
    if ((rc = ks__api_get_int(root, "top_logprobs", 0, KS_API_MAX_TOP_LOGPROBS, &x, &set, err))) return rc;
    if (set && !lp && x > 0)
        BAD("invalid_value", "top_logprobs", "Invalid 'top_logprobs': it requires 'logprobs' to be true.");
    if (set) r->top_logprobs = (int)x;
    return 0;
}

/* ------------------------------------------------------------ sampling */
/* logit_bias: OpenAI's {"<token id>": bias} or llama-server's [[id or
 * string, bias or false], ...]; bias in [-100, 100] (false: banned). */
static int parse_bias(json_t *root, ks_api_request *r, ks_api_error *err) {
    json_t *lb = ks__api_field(root, "logit_bias");
    if (!lb) return 0;
    size_t n = json_is_object(lb) ? json_object_size(lb) : json_is_array(lb) ? json_array_size(lb) : 0;
    if (!json_is_object(lb) && !json_is_array(lb))
        BAD("invalid_type", "logit_bias", "Invalid type for 'logit_bias': expected an object, but got %s instead.",
            ks__api_json_type_name(lb));
    if (n > 4096) BAD("invalid_value", "logit_bias", "Invalid 'logit_bias': at most 4096 entries.");
    if (n == 0) return 0;
    r->bias = calloc(n, sizeof *r->bias);
    if (!r->bias) return ks__api_oom(err);
    if (json_is_object(lb)) {
        const char *k;
        json_t *v;
        json_object_foreach(lb, k, v) {
            char q[96];
            snprintf(q, sizeof q, "logit_bias.%.64s", k);
            char *end = NULL;
            long long id = strtoll(k, &end, 10);
            ks_api_bias *b = &r->bias[r->n_bias];
            if (end && end != k && *end == 0) {
                if (id < 0 || id > INT32_MAX) BAD("invalid_value", q, "Invalid '%s': not a token id.", q);
                b->tok = (int32_t)id;
            } else {
                b->text = k; /* llama-server takes a string key as text */
            }
            if (!json_is_number(v))
                BAD("invalid_type", q, "Invalid type for '%s': expected a number, but got %s instead.", q,
                    ks__api_json_type_name(v));
            double x = json_number_value(v);
            if (!(x >= -100 && x <= 100))
                BAD("invalid_value", q, "Invalid '%s': a bias is in [-100, 100], got %g.", q, x);
            b->bias = (float)x;
            r->n_bias++;
        }
        return 0;
    }
    size_t i;
    json_t *e;
    json_array_foreach(lb, i, e) {
        char q[64];
        snprintf(q, sizeof q, "logit_bias[%zu]", i);
        json_t *t = json_is_array(e) && json_array_size(e) == 2 ? json_array_get(e, 0) : NULL;
        json_t *v = t ? json_array_get(e, 1) : NULL;
        if (!t || !(json_is_integer(t) || json_is_string(t)) || !(json_is_number(v) || json_is_false(v)))
            BAD("invalid_value", q, "Invalid '%s': expected [token id or string, bias or false].", q);
        ks_api_bias *b = &r->bias[r->n_bias];
        if (json_is_integer(t)) {
            json_int_t id = json_integer_value(t);
            if (id < 0 || id > INT32_MAX) BAD("invalid_value", q, "Invalid '%s': not a token id.", q);
            b->tok = (int32_t)id;
        } else {
            b->text = json_string_value(t);
        }
        if (json_is_false(v)) {
            b->bias = -INFINITY;
        } else {
            double x = json_number_value(v);
            if (!(x >= -100 && x <= 100)) BAD("invalid_value", q, "Invalid '%s': a bias is in [-100, 100].", q);
            b->bias = (float)x;
        }
        r->n_bias++;
    }
    return 0;
}

/* One of llama-server's sampler names (common_sampler_types_from_names:
 * canonical, kebab-case, no dash, and its aliases) or chars
 * (common_sampler_types_from_chars): 0 for one llama-server knows that is a
 * no-op at the values kvstash leaves it (dry, typ_p, xtc, top_n_sigma), -1
 * for adaptive_p (kvstash has no such draw), -2 for a name neither knows. */
static int sampler_code(const char *n) {
    static const struct { const char *name; int code; } M[] = {
        {"top_k", KS_SAMPLER_TOP_K}, {"top-k", KS_SAMPLER_TOP_K}, {"topk", KS_SAMPLER_TOP_K},
        {"top_p", KS_SAMPLER_TOP_P}, {"top-p", KS_SAMPLER_TOP_P}, {"topp", KS_SAMPLER_TOP_P},
        {"nucleus", KS_SAMPLER_TOP_P}, {"min_p", KS_SAMPLER_MIN_P}, {"min-p", KS_SAMPLER_MIN_P},
        {"minp", KS_SAMPLER_MIN_P}, {"temperature", KS_SAMPLER_TEMPERATURE}, {"temp", KS_SAMPLER_TEMPERATURE},
        {"infill", KS_SAMPLER_INFILL}, {"penalties", KS_SAMPLER_PENALTIES}, {"dry", 0}, {"typ_p", 0},
        {"typ-p", 0}, {"typp", 0}, {"typ", 0}, {"xtc", 0}, {"top_n_sigma", 0}, {"top-n-sigma", 0},
        {"topnsigma", 0}, {"adaptive_p", -1}, {"adaptive-p", -1}, {"adaptivep", -1},
    };
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++)
        if (!strcmp(n, M[i].name)) return M[i].code;
    return -2;
}

static int sampler_char(char c) {
    switch (c) {
    case 'k': return KS_SAMPLER_TOP_K;
    case 'p': return KS_SAMPLER_TOP_P;
    case 'm': return KS_SAMPLER_MIN_P;
    case 't': return KS_SAMPLER_TEMPERATURE;
    case 'i': return KS_SAMPLER_INFILL;
    case 'e': return KS_SAMPLER_PENALTIES;
    case 'd': case 'y': case 's': case 'x': return 0;
    case 'a': return -1;
    default: return -2;
    }
}

/* samplers: an array of names or a string of chars, llama-server's. Steps
 * kvstash has no parameter for are no-ops there at their defaults, and left
 * out; an unknown name is left out as llama-server leaves it out (with a
 * warning there, a note here). */
static int parse_samplers(json_t *root, ks_api_request *r, ks_api_error *err) {
    json_t *v = ks__api_field(root, "samplers");
    if (!v) return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : json_is_string(v) ? json_string_length(v) : 0;
    if (!json_is_array(v) && !json_is_string(v))
        BAD("invalid_type", "samplers",
            "Invalid type for 'samplers': expected an array of sampler names or a string of sampler characters, "
            "but got %s instead.", ks__api_json_type_name(v));
    if (n > KS_SAMPLER_ORDER_MAX)
        BAD("array_above_max_length", "samplers", "Invalid 'samplers': at most %d, got %zu.", KS_SAMPLER_ORDER_MAX, n);
    r->samplers_given = true;
    for (size_t i = 0; i < n; i++) {
        int c;
        char q[32];
        snprintf(q, sizeof q, "samplers[%zu]", i);
        if (json_is_string(v)) {
            c = sampler_char(json_string_value(v)[i]);
        } else {
            json_t *e = json_array_get(v, i);
            if (!json_is_string(e))
                BAD("invalid_type", q, "Invalid type for '%s': expected a sampler name, but got %s instead.", q,
                    ks__api_json_type_name(e));
            c = sampler_code(json_string_value(e));
        }
        if (c == -1)
            BAD("unsupported_value", q, "Unsupported value: '%s' (adaptive_p) is not a sampler kvstash has.", q);
        if (c == -2) ks_api_note(&r->notes, q, "an unknown sampler");
        if (c > 0) r->sampler_order[r->n_sampler_order++] = (uint8_t)c;
    }
    return 0;
}

int ks__api_parse_sampling(json_t *root, ks_api_request *r, ks_api_error *err) {
    int rc;
    r->repeat_penalty = 1.0f;
    r->repeat_last_n = 64;
    r->n = 1;
    r->id_slot = -1;
    if ((rc = parse_bias(root, r, err))) return rc;
    if ((rc = parse_samplers(root, r, err))) return rc;
    long long x;
    bool set;
    if ((rc = ks__api_get_number(root, "presence_penalty", -2.0, 2.0, &r->presence_penalty, err))) return rc;
    if ((rc = ks__api_get_number(root, "frequency_penalty", -2.0, 2.0, &r->frequency_penalty, err))) return rc;
    if ((rc = ks__api_get_number(root, "repeat_penalty", 0.0, 10.0, &r->repeat_penalty, err))) return rc;
    /* -1: the whole context */
    if ((rc = ks__api_get_int(root, "repeat_last_n", -1, INT32_MAX, &x, &set, err))) return rc;
    if (set) r->repeat_last_n = (int)x;
    if ((rc = ks__api_get_bool(root, "ignore_eos", &r->ignore_eos, err))) return rc;
    /* a slot index or -1; whether the server has it is the scheduler's check */
    if ((rc = ks__api_get_int(root, "id_slot", -1, 1000000, &x, &set, err))) return rc;
    if (set) r->id_slot = (int)x;
    /* llama-server's n_probs: the alternatives per token, turns logprobs on. */
    if ((rc = ks__api_get_int(root, "n_probs", 0, KS_API_MAX_TOP_LOGPROBS, &x, &set, err))) return rc;
    if (set && x > 0) {
        r->logprobs = true;
        r->top_logprobs = (int)x;
    }
    if ((rc = ks__api_get_int(root, "n", 1, KS_API_MAX_N, &x, &set, err))) return rc;
    if (set) r->n = (int)x;
    int prompts = r->kind == KS_API_COMPLETION ? r->n_prompts : 1;
    if (prompts * r->n > KS_API_MAX_CHOICES)
        BAD("invalid_value", "n", "Invalid 'n': %d prompts × n = %d choices is more than the %d a request may ask for.",
            prompts, prompts * r->n, KS_API_MAX_CHOICES);
    return 0;
}

/*
 * api_messages.c — the Anthropic Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) as a translation, like api_responses.c: a
 * request becomes a chat request; the chat output becomes content blocks
 * (thinking, text, tool_use) and Anthropic's stream events.
 *
 * Pure JSON, unit-tested without a model (tests/unit/test_api_wire.c).
 *
 * NOTES
 *  1. A user message's tool_result blocks become chat "tool" messages, in
 *     order, before the message's text (Anthropic puts results first); an
 *     assistant's thinking, text and tool_use blocks become one assistant
 *     message (reasoning_content, content, tool_calls with the input
 *     serialized as the arguments).
 *  2. cache_control on a system block, a tool, a message or a content block
 *     becomes the chat extension cache_control on the chat message that
 *     holds the block (a breakpoint at the end of that message; api.h).
 *  3. Anthropic's input_tokens count the prompt tokens that were neither read
 *     from nor written to the cache; cache_read_input_tokens is the
 *     request's n_cached and cache_creation_input_tokens what its
 *     breakpoints wrote (ks_req_result).
 */
#include "server/api.h"
#include "server/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const MSG_FIELDS[] = {
    "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
    "tools", "tool_choice", "thinking", "output_config", "output_format",
    /* llama-server's extensions, as on chat */
    "seed", "min_p", "cache_prompt", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
    "ignore_eos", "chat_template_kwargs", "id_slot", "speculative.n_max",
    NULL};
static const char *const COUNT_FIELDS[] = {"model", "messages", "system", "tools", "tool_choice", "thinking",
                                           "output_config", "output_format", NULL};
/* Accepted and ignored, silently (docs/SERVER.md): they steer Anthropic's
 * service — accounting, regions, its server-side context editing (Claude
 * Code's clear_thinking edits: which earlier thinking a local template renders
 * is the template's business), its code-execution containers — and change
 * nothing a local model generates. */
static const char *const MSG_IGNORED[] = {"metadata", "service_tier", "context_management", "container",
                                          "inference_geo", "mcp_servers", NULL};
/* Nested objects (ks__api_nested): what each one's fields are. Ignored
 * silently: eager_input_streaming (how finely Anthropic streams a tool's
 * input; kvstash streams each piece as it is generated), strict (a tool
 * call's input follows its schema here anyway: the tool grammar is built
 * from it), thinking.display (how Anthropic's apps show thinking), citations
 * (of documents, which a local model has none of). */
static const char *const N_TOOL[] = {"type", "name", "description", "input_schema", "cache_control", "defer_loading",
                                     NULL};
static const char *const N_TOOL_IGN[] = {"eager_input_streaming", "strict", NULL};
static const char *const N_CLIENT_TOOL[] = {"custom", NULL};
static const char *const N_CHOICE[] = {"type", "name", "disable_parallel_tool_use", NULL};
static const char *const N_THINKING[] = {"type", "budget_tokens", NULL};
static const char *const N_THINKING_IGN[] = {"display", NULL};
static const char *const N_OUTPUT[] = {"effort", "format", NULL};
static const char *const N_FORMAT[] = {"type", "schema", NULL};
static const char *const N_MESSAGE[] = {"role", "content", NULL};
static const char *const N_BLOCK[] = {"type", "text", "cache_control", "source", "tool_use_id", "content", "is_error",
                                      "id", "name", "input", "thinking", "signature", "data", "tool", NULL};
static const char *const N_INNER[] = {"type", "text", "cache_control", "source", "tool_name", NULL};
static const char *const N_SYSTEM[] = {"type", "text", "cache_control", NULL};
static const char *const N_CITATIONS[] = {"citations", NULL};
static const ks__api_nested MSG_NESTED[] = {
    {"tools[]", N_TOOL, N_TOOL_IGN, N_CLIENT_TOOL},
    {"tool_choice", N_CHOICE, NULL, NULL},
    {"thinking", N_THINKING, N_THINKING_IGN, NULL},
    {"output_config", N_OUTPUT, NULL, NULL},
    {"output_config.format", N_FORMAT, NULL, NULL},
    {"output_format", N_FORMAT, NULL, NULL},
    {"system[]", N_SYSTEM, N_CITATIONS, NULL},
    {"messages[]", N_MESSAGE, NULL, NULL},
    {"messages[].content[]", N_BLOCK, N_CITATIONS, NULL},
    {"messages[].content[].content[]", N_INNER, N_CITATIONS, NULL},
    {NULL, NULL, NULL, NULL},
};
static const char *const PASS_FIELDS[] = {"model", "temperature", "top_p", "top_k", "stream", "seed", "min_p",
                                          "cache_prompt", "repeat_penalty", "repeat_last_n", "presence_penalty",
                                          "frequency_penalty", "ignore_eos", "id_slot", "speculative.n_max", NULL};


/* Appends text to a buffer, "\n" between pieces. */
static int join(ks_buf *b, const char *text) {
    if (b->len && ks_buf_append(b, "\n", 1)) return KS_ENOMEM;
    return ks_buf_append(b, text, strlen(text));
}

/* ------------------------------------------------------------ system */
/* Text blocks (the system field's, or a system message's content) joined
 * with "\n" into b, the last block's cache_control into *cc. p: the path of
 * the array ("system", "messages.3.content"). */
static int text_blocks(json_t *blocks, const char *p, ks_buf *b, json_t **cc, ks_api_error *err) {
    size_t i;
    json_t *blk;
    json_array_foreach(blocks, i, blk) {
        char q[112];
        snprintf(q, sizeof q, "%s.%zu", p, i);
        if (!json_is_object(blk) || strcmp(ks__api_str(blk, "type"), "text") || !json_is_string(json_object_get(blk, "text")))
            BAD("invalid_value", q, "%s: expected a text block {\"type\": \"text\", \"text\": ...}.", q);
        if (join(b, ks__api_str(blk, "text"))) return ks__api_oom(err);
        if (json_object_get(blk, "cache_control")) *cc = json_object_get(blk, "cache_control");
    }
    return 0;
}

/* A system message of text (joined blocks) and their cache_control, appended to msgs. */
static int push_system(json_t *msgs, const ks_buf *b, json_t *cc, ks_api_error *err) {
    json_t *m = json_pack("{s:s, s:s%}", "role", "system", "content", b->s ? b->s : "", b->len);
    if (m && cc) json_object_set(m, "cache_control", cc);
    return !m || json_array_append_new(msgs, m) ? ks__api_oom(err) : 0;
}

static int system_to_chat(json_t *root, json_t *msgs, ks_api_error *err) {
    json_t *sys = ks__api_field(root, "system");
    if (!sys) return 0;
    if (json_is_string(sys)) {
        if (!json_string_length(sys)) return 0;
        return json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", sys)) ? ks__api_oom(err)
                                                                                                      : 0;
    }
    if (!json_is_array(sys))
        BAD("invalid_type", "system", "system: expected a string or an array of text blocks, but got %s instead.",
            ks__api_json_type_name(sys));
    ks_buf b = {0};
    json_t *cc = NULL;
    int rc = text_blocks(sys, "system", &b, &cc, err);
    if (!rc && b.len) rc = push_system(msgs, &b, cc, err); /* only empty blocks: no system message */
    ks_buf_free(&b);
    return rc;
}

/* ------------------------------------------------------------ messages */
/* A content block's type at q, NULL (err filled: 400) when it has none. */
static const char *block_type(json_t *blk, const char *q, ks_api_error *err) {
    const char *ty = json_is_object(blk) ? json_string_value(json_object_get(blk, "type")) : NULL;
    if (!ty) ks_api_error_set(err, 400, T_INVALID, "invalid_value", q, "%s: a content block needs a string 'type'.", q);
    return ty;
}

/* One block of a user message or tool result at q: a text block, or an
 * image block, appended to parts as a chat part (*media set). 1: neither
 * (the caller's to handle), 0, or an error. */
static int content_block(json_t *blk, const char *ty, const char *q, json_t *parts, bool *media, ks_api_error *err) {
    json_t *part;
    if (!strcmp(ty, "text")) {
        if (!json_is_string(json_object_get(blk, "text")))
            BAD("invalid_value", q, "%s.text: expected a string.", q);
        part = json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(blk, "text"));
    } else if (!strcmp(ty, "image")) {
        if (!(part = ks__api_messages_image(blk, q, err))) return KS_EINVAL;
        *media = true;
    } else {
        return 1;
    }
    return !part || json_array_append_new(parts, part) ? ks__api_oom(err) : 0;
}

/* tool_result content: a string, or text, image and tool_reference blocks
 * (api_msg_tools.c), into *content. */
static int result_content(json_t *c, const char *p, ks__msg_tools *tools, json_t **content, ks_api_error *err) {
    if (!c) c = json_string("");
    else json_incref(c);
    if (!c || json_is_string(c)) return (*content = c) ? 0 : ks__api_oom(err);
    json_t *parts = json_array();
    bool media = false;
    int rc = parts ? 0 : ks__api_oom(err);
    if (!rc && !json_is_array(c))
        ks_api_error_set(err, 400, T_INVALID, "invalid_type", p, "%s: expected a string or an array of text blocks, "
                         "but got %s instead.", p, ks__api_json_type_name(c)), rc = KS_EINVAL;
    size_t i;
    json_t *blk;
    if (!rc) json_array_foreach(c, i, blk) {
        char q[160];
        snprintf(q, sizeof q, "%s.%zu", p, i);
        const char *ty = json_is_object(blk) ? ks__api_str(blk, "type") : "";
        if ((rc = content_block(blk, ty, q, parts, &media, err)) == 1 && !strcmp(ty, "tool_reference")) {
            json_t *part = ks__msg_tools_reference(tools, blk, q, err);
            rc = !part ? ks__api_err_rc(err)
                       : json_array_append_new(parts, part) ? ks__api_oom(err) : 0;
        } else if (rc == 1) {
            ks_api_error_set(err, 400, T_INVALID, "invalid_value", p,
                             "%s: only text, image and tool_reference blocks are supported in a tool result.", p);
            rc = KS_EINVAL;
        }
        if (rc) break;
    }
    if (!rc && !(*content = ks__api_parts_content(parts, media))) rc = ks__api_oom(err);
    json_decref(parts);
    json_decref(c);
    return rc;
}

static int user_to_chat(json_t *c, const char *p, ks__msg_tools *tools, json_t *msgs, ks_api_error *err) {
    json_t *parts = json_array();
    bool media = false;
    json_t *text_cc = NULL;
    int rc = parts ? 0 : ks__api_oom(err);
    size_t i;
    json_t *blk;
    if (!rc) json_array_foreach(c, i, blk) {
        char q[96];
        snprintf(q, sizeof q, "%s.content.%zu", p, i);
        const char *ty = block_type(blk, q, err);
        if (!ty) {
            rc = KS_EINVAL;
            break;
        }
        json_t *cc = json_object_get(blk, "cache_control");
        if ((rc = content_block(blk, ty, q, parts, &media, err)) != 1) {
            if (rc) break;
            if (cc) text_cc = cc;
        } else if (!strcmp(ty, "tool_result")) {
            rc = 0;
            json_t *id = json_object_get(blk, "tool_use_id");
            if (!json_is_string(id)) {
                rc = KS_EINVAL;
                ks_api_error_set(err, 400, T_INVALID, "invalid_value", q, "%s.tool_use_id: expected a string.", q);
                break;
            }
            json_t *content = NULL;
            char rp[112];
            snprintf(rp, sizeof rp, "%s.content", q);
            if ((rc = result_content(json_object_get(blk, "content"), rp, tools, &content, err))) break;
            json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", content);
            if (m && cc) json_object_set(m, "cache_control", cc);
            if (!m || json_array_append_new(msgs, m)) {
                rc = ks__api_oom(err);
                break;
            }
        } else {
            rc = KS_EINVAL;
            ks_api_error_set(err, 400, T_INVALID, "invalid_value", q,
                             "%s: '%.32s' blocks are not supported in a user message; this server takes text, image "
                             "and tool_result blocks.", q, ty);
            break;
        }
    }
    json_t *content = rc ? NULL : ks__api_parts_content(parts, media);
    if (!rc && !content) rc = ks__api_oom(err);
    /* Text (or media) makes a user message; tool results alone do not. */
    if (!rc && (media || json_string_length(content) || json_array_size(c) == 0)) {
        json_t *m = json_pack("{s:s, s:O}", "role", "user", "content", content);
        if (m && text_cc) json_object_set(m, "cache_control", text_cc);
        if (!m || json_array_append_new(msgs, m)) rc = ks__api_oom(err);
    }
    json_decref(content);
    json_decref(parts);
    return rc;
}

static int assistant_to_chat(json_t *c, const char *p, json_t *msgs, ks_api_error *err) {
    ks_buf text = {0}, think = {0};
    json_t *calls = json_array();
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_t *cc_last = NULL;
    int rc = !calls || !m ? ks__api_oom(err) : 0;
    size_t i;
    json_t *blk;
    if (!rc) json_array_foreach(c, i, blk) {
        char q[96];
        snprintf(q, sizeof q, "%s.content.%zu", p, i);
        const char *ty = block_type(blk, q, err);
        if (!ty) {
            rc = KS_EINVAL;
            break;
        }
        if (json_object_get(blk, "cache_control")) cc_last = json_object_get(blk, "cache_control");
        if (!strcmp(ty, "text")) {
            if (join(&text, ks__api_str(blk, "text"))) rc = ks__api_oom(err);
        } else if (!strcmp(ty, "thinking")) {
            if (join(&think, ks__api_str(blk, "thinking"))) rc = ks__api_oom(err);
        } else if (!strcmp(ty, "redacted_thinking")) {
            /* opaque to a local model: left out */
        } else if (!strcmp(ty, "tool_use")) {
            json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            json_t *input = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
                rc = KS_EINVAL;
                ks_api_error_set(err, 400, T_INVALID, "invalid_value", q,
                                 "%s: a tool_use block needs a string id and name and an object input.", q);
                break;
            }
            char *args = input ? json_dumps(input, JSON_COMPACT) : strdup("{}");
            json_t *tc = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name",
                                          name, "arguments", args)
                              : NULL;
            free(args);
            if (!tc || json_array_append_new(calls, tc)) rc = ks__api_oom(err);
        } else {
            rc = KS_EINVAL;
            ks_api_error_set(err, 400, T_INVALID, "invalid_value", q,
                             "%s: '%.32s' blocks are not supported in an assistant message; this server takes text, "
                             "thinking and tool_use blocks.", q, ty);
        }
        if (rc) break;
    }
    if (!rc) {
        json_object_set_new(m, "content", json_stringn(text.s ? text.s : "", text.len));
        if (think.len) json_object_set_new(m, "reasoning_content", json_stringn(think.s, think.len));
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        if (cc_last) json_object_set(m, "cache_control", cc_last);
        if (json_array_append(msgs, m)) rc = ks__api_oom(err);
    }
    json_decref(m);
    json_decref(calls);
    ks_buf_free(&text);
    ks_buf_free(&think);
    return rc;
}

/* A system message inside messages (Claude Code sends one for model names it
 * does not know, after the first user message; and one of tool_addition and
 * tool_removal blocks with the mid-conversation tool changes beta): text
 * blocks and the tool changes' texts (api_msg_tools.c) joined with "\n",
 * rendered as a system message where it stands. Whether the template takes a
 * system message there is the template's call; fmt_messages.c answers a
 * refusal in Anthropic's words (ks_api_msg_req.mid_system). */
static int system_msg_to_chat(json_t *c, const char *p, ks__msg_tools *tools, json_t *msgs, ks_api_error *err) {
    ks_buf b = {0};
    json_t *cc = NULL;
    int rc = 0;
    size_t i;
    json_t *blk;
    json_array_foreach(c, i, blk) {
        char q[112];
        snprintf(q, sizeof q, "%s.content.%zu", p, i);
        const char *ty = json_is_object(blk) ? ks__api_str(blk, "type") : "";
        if (!strcmp(ty, "tool_addition") || !strcmp(ty, "tool_removal")) {
            json_t *part = ks__msg_tools_change(tools, blk, ty, q, err);
            if (!part) {
                rc = ks__api_err_rc(err);
                break;
            }
            rc = join(&b, ks__api_str(part, "text")) ? ks__api_oom(err) : 0;
            json_decref(part);
        } else if (strcmp(ty, "text") || !json_is_string(json_object_get(blk, "text"))) {
            ks_api_error_set(err, 400, T_INVALID, "invalid_value", q,
                             "%s: expected a text, tool_addition or tool_removal block.", q);
            rc = KS_EINVAL;
        } else {
            rc = join(&b, ks__api_str(blk, "text")) ? ks__api_oom(err) : 0;
        }
        if (rc) break;
        if (json_object_get(blk, "cache_control")) cc = json_object_get(blk, "cache_control");
    }
    if (!rc) rc = push_system(msgs, &b, cc, err);
    ks_buf_free(&b);
    return rc;
}

static int messages_to_chat(json_t *root, ks__msg_tools *tools, json_t *msgs, int *mid_system, ks_api_error *err) {
    json_t *ms = ks__api_field(root, "messages");
    if (!ms) BAD("missing_required_parameter", "messages", "messages: Field required");
    int rc = ks__api_want(ms, JSON_ARRAY, "an array", "messages", err);
    if (rc) return rc;
    if (json_array_size(ms) == 0) BAD("empty_array", "messages", "messages: at least one message is required");
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        char p[48], q[64];
        snprintf(p, sizeof p, "messages.%zu", i);
        if ((rc = ks__api_want(m, JSON_OBJECT, "an object", p, err))) return rc;
        const char *role = json_string_value(json_object_get(m, "role"));
        snprintf(q, sizeof q, "%s.role", p);
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
            BAD("invalid_value", q, "%s: Input should be 'user', 'assistant' or 'system'", q);
        if (!strcmp(role, "system") && *mid_system < 0) *mid_system = (int)i;
        json_t *c = json_object_get(m, "content");
        snprintf(q, sizeof q, "%s.content", p);
        if (!c) BAD("missing_required_parameter", q, "%s: Field required", q);
        json_t *blocks = json_is_string(c) ? json_pack("[{s:s, s:O}]", "type", "text", "text", c) : json_incref(c);
        if (!blocks) return ks__api_oom(err);
        if (!json_is_array(blocks)) {
            json_decref(blocks);
            BAD("invalid_type", q, "%s: expected a string or an array of content blocks, but got %s instead.", q,
                ks__api_json_type_name(c));
        }
        rc = !strcmp(role, "user")     ? user_to_chat(blocks, p, tools, msgs, err)
             : !strcmp(role, "system") ? system_msg_to_chat(blocks, p, tools, msgs, err)
                                       : assistant_to_chat(blocks, p, msgs, err);
        json_decref(blocks);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------ tool choice */
static int tool_choice_to_chat(json_t *root, json_t *chat, ks_api_error *err) {
    json_t *tc = ks__api_field(root, "tool_choice");
    int rc;
    if (!tc) return 0;
    if ((rc = ks__api_want(tc, JSON_OBJECT, "an object", "tool_choice", err))) return rc;
    const char *ty = ks__api_str(tc, "type");
    json_t *v;
    if (!strcmp(ty, "auto")) v = json_string("auto");
    else if (!strcmp(ty, "any")) v = json_string("required");
    else if (!strcmp(ty, "none")) v = json_string("none");
    else if (!strcmp(ty, "tool")) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) BAD("invalid_value", "tool_choice.name", "tool_choice.name: Field required");
        v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    } else
        BAD("invalid_value", "tool_choice.type",
            "tool_choice.type: expected 'auto', 'any', 'tool' or 'none'.");
    if (!v || json_object_set_new(chat, "tool_choice", v)) return ks__api_oom(err);
    if (json_is_true(json_object_get(tc, "disable_parallel_tool_use")) &&
        json_object_set_new(chat, "parallel_tool_calls", json_false()))
        return ks__api_oom(err);
    return 0;
}

/* output_config: {effort, format}; output_format (the structured-outputs
 * beta's name for format). effort becomes the chat request's
 * reasoning_effort, a template variable (gpt-oss and others read it; "max",
 * beyond what templates take, is "high"); format {type: "json_schema",
 * schema} the response_format that constrains the output to the schema. */
static int output_to_chat(json_t *root, json_t *chat, ks_api_error *err) {
    json_t *oc = ks__api_field(root, "output_config");
    int rc;
    json_t *fmt = ks__api_field(root, "output_format");
    if (oc) {
        if ((rc = ks__api_want(oc, JSON_OBJECT, "an object", "output_config", err))) return rc;
        json_t *effort = ks__api_field(oc, "effort");
        if (effort) {
            const char *e = json_string_value(effort);
            if (!e || (strcmp(e, "low") && strcmp(e, "medium") && strcmp(e, "high") && strcmp(e, "max")))
                BAD("invalid_value", "output_config.effort",
                    "output_config.effort: Input should be 'low', 'medium', 'high' or 'max'");
            if (json_object_set_new(chat, "reasoning_effort", json_string(strcmp(e, "max") ? e : "high")))
                return ks__api_oom(err);
        }
        json_t *f = ks__api_field(oc, "format");
        if (f) fmt = f;
    }
    if (!fmt) return 0;
    const char *fp = oc && ks__api_field(oc, "format") ? "output_config.format" : "output_format";
    if ((rc = ks__api_want(fmt, JSON_OBJECT, "an object", fp, err))) return rc;
    const char *ty = ks__api_str(fmt, "type");
    json_t *schema = json_object_get(fmt, "schema");
    if (strcmp(ty, "json_schema") || !json_is_object(schema))
        BAD("invalid_value", fp, "%s: expected {\"type\": \"json_schema\", \"schema\": {...}}.", fp);
    json_t *rf = json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name", "output", "schema",
                           schema);
    return !rf || json_object_set_new(chat, "response_format", rf) ? ks__api_oom(err) : 0;
}

int ks_api_messages_to_chat(json_t *root, bool count, ks_api_msg_req *out, ks_api_error *err) {
    memset(out, 0, sizeof *out);
    out->mid_system = -1;
    int rc;
    ks__api_note_unknown(root, &out->notes, count ? COUNT_FIELDS : MSG_FIELDS, MSG_IGNORED, NULL, NULL);
    ks__api_note_nested(root, MSG_NESTED, &out->notes);
    ks__msg_tools tools;
    json_t *chat = json_object(), *msgs = json_array();
    rc = ks__msg_tools_read(root, &tools, &out->notes, err);
    if (rc) goto fail;
    if (!chat || !msgs || json_object_set(chat, "messages", msgs)) goto oom;
    if ((rc = system_to_chat(root, msgs, err)) ||
        (rc = messages_to_chat(root, &tools, msgs, &out->mid_system, err)) ||
        (rc = ks__msg_tools_to_chat(&tools, chat, err)) || (rc = tool_choice_to_chat(root, chat, err)) ||
        (rc = output_to_chat(root, chat, err)))
        goto fail;
    if (!count) {
        json_t *mt = ks__api_field(root, "max_tokens");
        if (!mt) {
            rc = KS_EINVAL;
            ks_api_error_set(err, 400, T_INVALID, "missing_required_parameter", "max_tokens", "max_tokens: Field required");
            goto fail;
        }
        if (json_object_set(chat, "max_tokens", mt)) goto oom;
        for (const char *const *f = PASS_FIELDS; *f; f++) {
            json_t *x = ks__api_field(root, *f);
            if (x && json_object_set(chat, *f, x)) goto oom;
        }
        json_t *ss = ks__api_field(root, "stop_sequences");
        if (ss) {
            if ((rc = ks__api_want(ss, JSON_ARRAY, "an array of strings", "stop_sequences", err))) goto fail;
            if (json_object_set(chat, "stop", ss)) goto oom;
            out->n_user_stops = (int)json_array_size(ss);
        }
    }
    json_t *model = ks__api_field(root, "model");
    if (count && model && json_object_set(chat, "model", model)) goto oom;
    json_t *kw = ks__api_field(root, "chat_template_kwargs");
    if (kw && json_object_set(chat, "chat_template_kwargs", kw)) goto oom;
    json_t *th = ks__api_field(root, "thinking");
    if (th) {
        if ((rc = ks__api_want(th, JSON_OBJECT, "an object", "thinking", err))) goto fail;
        const char *ty = ks__api_str(th, "type");
        if (strcmp(ty, "enabled") && strcmp(ty, "disabled") && strcmp(ty, "adaptive")) {
            rc = KS_EINVAL;
            ks_api_error_set(err, 400, T_INVALID, "invalid_value", "thinking.type",
                             "thinking.type: expected 'enabled', 'adaptive' or 'disabled'.");
            goto fail;
        }
        if (json_object_set_new(chat, "enable_thinking", json_boolean(strcmp(ty, "disabled") != 0))) goto oom;
    }
    json_decref(msgs);
    ks__msg_tools_free(&tools);
    out->chat = chat;
    return 0;
oom:
    rc = ks__api_oom(err);
fail:
    ks__msg_tools_free(&tools);
    json_decref(msgs);
    json_decref(chat);
    return rc;
}

void ks_api_msg_req_free(ks_api_msg_req *r) {
    if (!r) return;
    json_decref(r->chat);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ output */
json_t *ks_api_messages_error_json(const ks_api_error *e) {
    const char *type;
    switch (e->status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 405: type = "invalid_request_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: type = e->status >= 500 ? "api_error" : "invalid_request_error";
    }
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", e->message);
}

json_t *ks_api_messages_usage(const ks_req_result *r) {
    int written = r ? r->n_cache_written : 0, read = r ? r->n_cached : 0, n = r ? r->n_prompt : 0;
    int input = n - read - written;
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", input > 0 ? input : 0, "cache_creation_input_tokens",
                     written, "cache_read_input_tokens", read, "output_tokens", r ? r->n_generated : 0);
}

json_t *ks_api_messages_object(const ks_api_msg_out *o) {
    json_t *content = json_array();
    if (!content) return NULL;
    const char *text = o->msg ? ks__api_str(o->msg, "content") : (o->text ? o->text : "");
    const char *think = o->msg ? ks__api_str(o->msg, "reasoning_content") : "";
    if (think[0])
        json_array_append_new(content, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", think, "signature", ""));
    json_t *calls = o->msg ? json_object_get(o->msg, "tool_calls") : NULL;
    if (text[0] || !json_array_size(calls)) json_array_append_new(content, json_pack("{s:s, s:s}", "type", "text", "text", text));
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        json_t *fn = json_object_get(tc, "function");
        json_t *input = json_loads(ks__api_str(fn, "arguments"), JSON_DECODE_ANY, NULL);
        if (!json_is_object(input)) {
            json_decref(input);
            input = json_object();
        }
        json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", ks__api_str(tc, "id"),
                                                 "name", ks__api_str(fn, "name"), "input", input));
    }
    json_t *m = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", o->id, "type", "message", "role",
                          "assistant", "model", o->model ? o->model : "", "content", content, "stop_reason",
                          o->stop_reason, "stop_sequence", o->stop_sequence ? json_string(o->stop_sequence) : json_null(),
                          "usage", ks_api_messages_usage(o->r));
    if (m && o->r) {
        json_t *c = ks_api_cache_json(o->r);
        if (c) json_object_set_new(m, "cache", c);
        json_t *t = ks_api_timings_json(o->r);
        if (t) json_object_set_new(m, "timings", t);
    }
    return m;
}

/* ------------------------------------------------------------ stream */
enum { B_NONE = 0, B_THINKING, B_TEXT, B_TOOL };

static int ev(ks_buf *out, const char *type, json_t *o) {
    if (!o) return KS_ENOMEM;
    json_object_set_new(o, "type", json_string(type));
    int rc = ks_api_sse_event(out, type, o);
    json_decref(o);
    return rc;
}

int ks_api_mstream_start(ks_api_mstream *st, const char *id, const char *model, const ks_req_result *r,
                         ks_buf *out) {
    memset(st, 0, sizeof *st);
    json_t *u = ks_api_messages_usage(r);
    if (u) json_object_set_new(u, "output_tokens", json_integer(r ? r->n_generated : 0));
    json_t *m = json_pack("{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:o}", "id", id, "type", "message", "role", "assistant",
                          "content", "model", model ? model : "", "stop_reason", "stop_sequence", "usage", u);
    int rc = ev(out, "message_start", json_pack("{s:o}", "message", m));
    return rc ? rc : ev(out, "ping", json_object());
}

static int close_block(ks_api_mstream *st, ks_buf *out) {
    if (st->open_kind == B_NONE) return 0;
    int rc = 0;
    if (st->open_kind == B_THINKING)
        rc = ev(out, "content_block_delta",
                json_pack("{s:i, s:{s:s, s:s}}", "index", st->n_blocks - 1, "delta", "type", "signature_delta",
                          "signature", ""));
    st->open_kind = B_NONE;
    return rc ? rc : ev(out, "content_block_stop", json_pack("{s:i}", "index", st->n_blocks - 1));
}

static int open_block(ks_api_mstream *st, ks_buf *out, int kind, json_t *block) {
    int rc = close_block(st, out);
    if (rc) {
        json_decref(block);
        return rc;
    }
    st->open_kind = kind;
    return ev(out, "content_block_start", json_pack("{s:i, s:o}", "index", st->n_blocks++, "content_block", block));
}

int ks_api_mstream_delta(ks_api_mstream *st, const json_t *d, ks_buf *out) {
    int rc;
    const char *s;
    if ((s = json_string_value(json_object_get(d, "reasoning_content")))) {
        if (st->open_kind != B_THINKING &&
            (rc = open_block(st, out, B_THINKING,
                             json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""))))
            return rc;
        return ev(out, "content_block_delta", json_pack("{s:i, s:{s:s, s:s}}", "index", st->n_blocks - 1, "delta",
                                                        "type", "thinking_delta", "thinking", s));
    }
    if ((s = json_string_value(json_object_get(d, "content")))) {
        if (st->open_kind != B_TEXT && (rc = open_block(st, out, B_TEXT, json_pack("{s:s, s:s}", "type", "text", "text", ""))))
            return rc;
        return ev(out, "content_block_delta",
                  json_pack("{s:i, s:{s:s, s:s}}", "index", st->n_blocks - 1, "delta", "type", "text_delta", "text", s));
    }
    json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
    if (!tc) return 0;
    json_t *fn = json_object_get(tc, "function");
    int index = (int)json_integer_value(json_object_get(tc, "index"));
    if (json_object_get(fn, "name")) {
        if ((rc = open_block(st, out, B_TOOL,
                             json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", ks__api_str(tc, "id"), "name",
                                       ks__api_str(fn, "name"), "input"))))
            return rc;
        st->call_index = index;
    }
    s = ks__api_str(fn, "arguments");
    if (st->open_kind != B_TOOL || st->call_index != index || !s[0]) return 0;
    return ev(out, "content_block_delta", json_pack("{s:i, s:{s:s, s:s}}", "index", st->n_blocks - 1, "delta", "type",
                                                    "input_json_delta", "partial_json", s));
}

int ks_api_mstream_end(ks_api_mstream *st, const char *stop_reason, const char *stop_sequence,
                       const ks_req_result *r, ks_buf *out) {
    int rc = close_block(st, out);
    if (!rc && st->n_blocks == 0) { /* nothing generated: one empty text block, as Anthropic sends */
        rc = open_block(st, out, B_TEXT, json_pack("{s:s, s:s}", "type", "text", "text", ""));
        if (!rc) rc = close_block(st, out);
    }
    if (rc) return rc;
    json_t *md = json_pack("{s:{s:s, s:o}, s:o}", "delta", "stop_reason", stop_reason, "stop_sequence",
                           stop_sequence ? json_string(stop_sequence) : json_null(), "usage", ks_api_messages_usage(r));
    /* kvstash's own objects, as in a whole reply: the SDKs keep fields they
     * do not know (and clients ignore them). */
    if (md && r) {
        json_t *c = ks_api_cache_json(r), *t = ks_api_timings_json(r);
        if (c) json_object_set_new(md, "cache", c);
        if (t) json_object_set_new(md, "timings", t);
    }
    rc = ev(out, "message_delta", md);
    return rc ? rc : ev(out, "message_stop", json_object());
}

int ks_api_mstream_error(const ks_api_error *e, ks_buf *out) {
    json_t *o = ks_api_messages_error_json(e);
    if (!o) return KS_ENOMEM;
    int rc = ks_api_sse_event(out, "error", o);
    json_decref(o);
    return rc;
}

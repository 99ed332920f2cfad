/*
 * api_msg_tools.c — a Messages request's tools as its conversation loads
 * them: Anthropic's tool search (defer_loading, tool_reference) and the
 * mid-conversation tool changes (tool_addition, tool_removal in a system
 * message), translated so that the rendered prompt of a conversation stays a
 * prefix of its next turn's.
 *
 * NOTES
 *  1. A tool given with defer_loading is not rendered in the template's tool
 *     list: the list at the top of the prompt stays the same whichever tools
 *     a conversation has loaded, as Anthropic keeps deferred tools out of its
 *     prompt prefix. Claude Code (2.1.3xx) sends a deferred tool in `tools`
 *     from the turn a ToolSearch first loaded it on, so rendering it there
 *     would change the prompt's first thousand tokens.
 *  2. Where a conversation loads a tool — a tool_reference block in a tool
 *     result, a tool_addition in a system message — its definition is
 *     rendered as text, "Tool loaded: " / "Tool added: " and the function
 *     object the templates render tools as ({"type": "function", "function":
 *     {name, description, parameters}}). A tool_removal renders "Tool
 *     removed: NAME". The text depends only on the block and the tool's
 *     definition, so every later turn renders it the same.
 *  3. The tools the model may call (the grammar and the output parser) are
 *     the rendered ones plus every deferred or added tool the conversation
 *     has loaded and not removed since: the chat request carries those with
 *     the kvstash extension defer_loading (api_chat.c), which the template
 *     layer adds to the grammar but not to the rendered list (chat_tmpl.h).
 *     A deferred tool that nothing loaded is left out altogether. A removed
 *     tool of the rendered list stays rendered and callable (the prefix);
 *     the removal's text tells the model.
 *  4. A reference to a tool the request does not define renders its name
 *     alone and loads nothing: a client may drop a tool (an MCP server gone)
 *     while old turns still reference it, and the turn renders as before.
 *
 * Pure JSON, no I/O; one request's tables, on the parsing thread.
 */
#include "server/api.h"
#include "server/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Anthropic's server tools run on Anthropic's side (the model calls them and
 * Anthropic executes them): a local model cannot, so they are dropped from the
 * request with a note rather than refusing it. The Anthropic-defined client
 * tools (bash_*, text_editor_*, computer_*, memory_*) run on the client with
 * schemas kvstash does not know: still a 400. */
static bool server_tool(const char *type) {
    static const char *const pfx[] = {"web_search_", "web_fetch_", "code_execution_", "tool_search_tool_", NULL};
    for (const char *const *p = pfx; *p; p++)
        if (!strncmp(type, *p, strlen(*p))) return true;
    return false;
}

/* The chat function object of an Anthropic tool definition at p: {name,
 * description?, parameters}. NULL with err filled. */
static json_t *function_of(json_t *t, const char *p, ks_api_error *err) {
    json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
    if (!json_is_string(name) || !json_string_length(name)) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", p, "%s.name: Field required (a string)", p);
        return NULL;
    }
    if (!json_is_object(schema)) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", p, "%s.input_schema: Field required (an object)", p);
        return NULL;
    }
    json_t *fn = json_pack("{s:O}", "name", name);
    json_t *d = json_object_get(t, "description");
    if (fn && json_is_string(d) && json_object_set(fn, "description", d)) fn = (json_decref(fn), NULL);
    if (fn && json_object_set(fn, "parameters", schema)) fn = (json_decref(fn), NULL);
    if (!fn) ks__api_oom(err);
    return fn;
}

void ks__msg_tools_free(ks__msg_tools *t) {
    if (!t) return;
    json_decref(t->order);
    json_decref(t->defs);
    json_decref(t->deferred);
    json_decref(t->state);
    json_decref(t->added);
    memset(t, 0, sizeof *t);
}

int ks__msg_tools_read(json_t *root, ks__msg_tools *t, ks_api_notes *notes, ks_api_error *err) {
    memset(t, 0, sizeof *t);
    t->order = json_array();
    t->defs = json_object();
    t->deferred = json_object();
    t->state = json_object();
    t->added = json_array();
    if (!t->order || !t->defs || !t->deferred || !t->state || !t->added) return ks__api_oom(err);
    json_t *tools = ks__api_field(root, "tools");
    if (!tools) return 0;
    int rc = ks__api_want(tools, JSON_ARRAY, "an array", "tools", err);
    if (rc) return rc;
    t->given = true;
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        char p[48];
        snprintf(p, sizeof p, "tools.%zu", i);
        if ((rc = ks__api_want(tool, JSON_OBJECT, "an object", p, err))) return rc;
        const char *ty = json_string_value(json_object_get(tool, "type"));
        if (ty && server_tool(ty)) {
            char what[64];
            snprintf(what, sizeof what, "a server tool (%.40s)", ty);
            ks_api_note(notes, p, what);
            continue;
        }
        if (ty && strcmp(ty, "custom"))
            BAD("invalid_value", p, "%s: '%.40s' tools are defined by Anthropic and not supported here; give "
                "client tools (name, description, input_schema).", p, ty);
        json_t *dl = json_object_get(tool, "defer_loading");
        if (dl && !json_is_null(dl) && !json_is_boolean(dl)) {
            char q[64];
            snprintf(q, sizeof q, "%s.defer_loading", p);
            BAD("invalid_type", q, "%s: expected a boolean, but got %s instead.", q, ks__api_json_type_name(dl));
        }
        json_t *fn = function_of(tool, p, err);
        if (!fn) return ks__api_err_rc(err);
        const char *name = ks__api_str(fn, "name");
        json_t *entry = json_pack("{s:o}", "function", fn);
        json_t *cc = json_object_get(tool, "cache_control");
        if (entry && cc && json_object_set(entry, "cache_control", cc)) entry = (json_decref(entry), NULL);
        if (!entry || json_array_append_new(t->order, entry)) return ks__api_oom(err);
        /* A name given twice: the first definition is the one rendered and loaded. */
        if (!json_object_get(t->defs, name) && json_object_set(t->defs, name, fn)) return ks__api_oom(err);
        if (json_is_true(dl) && json_object_set_new(t->deferred, name, json_true())) return ks__api_oom(err);
        if (json_is_true(dl)) json_object_set_new(entry, "deferred", json_true());
    }
    return 0;
}

/* "PREFIX" "TEXT" as a chat text part (new reference; NULL on ENOMEM). */
static json_t *text_part(const char *prefix, const char *text) {
    size_t n = strlen(prefix) + strlen(text) + 1;
    char *txt = malloc(n);
    json_t *part = NULL;
    if (txt) {
        snprintf(txt, n, "%s%s", prefix, text);
        part = json_pack("{s:s, s:s}", "type", "text", "text", txt);
    }
    free(txt);
    return part;
}

/* "PREFIX{"type": "function", "function": FN}" as a text part (new reference). */
static json_t *tool_text(const char *prefix, json_t *fn) {
    json_t *o = json_pack("{s:s, s:O}", "type", "function", "function", fn);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    json_t *part = s ? text_part(prefix, s) : NULL;
    free(s);
    return part;
}

/* The name of a {type: "tool_reference", tool_name | name} object at q. */
static const char *reference_name(json_t *ref, const char *q, ks_api_error *err) {
    json_t *n = json_object_get(ref, "tool_name");
    if (!n) n = json_object_get(ref, "name");
    if (!json_is_string(n) || !json_string_length(n)) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", q, "%s: a tool_reference needs a tool_name (a string).",
                         q);
        return NULL;
    }
    return json_string_value(n);
}

/* A reference that loads name: its text part (new reference), the tool marked loaded. */
static json_t *load(ks__msg_tools *t, const char *name, const char *prefix, ks_api_error *err) {
    json_t *fn = json_object_get(t->defs, name);
    json_t *bare = fn ? NULL : json_pack("{s:s}", "name", name);
    json_t *part = fn || bare ? tool_text(prefix, fn ? fn : bare) : NULL;
    json_decref(bare);
    if (part && fn && json_object_set_new(t->state, name, json_true())) part = (json_decref(part), NULL);
    if (!part) ks__api_oom(err);
    return part;
}

json_t *ks__msg_tools_reference(ks__msg_tools *t, json_t *blk, const char *q, ks_api_error *err) {
    const char *name = reference_name(blk, q, err);
    return name ? load(t, name, "Tool loaded: ", err) : NULL;
}

json_t *ks__msg_tools_change(ks__msg_tools *t, json_t *blk, const char *ty, const char *q, ks_api_error *err) {
    char qt[128];
    snprintf(qt, sizeof qt, "%s.tool", q);
    json_t *tool = json_object_get(blk, "tool");
    const char *tt = json_is_object(tool) ? ks__api_str(tool, "type") : "";
    if (!strcmp(ty, "tool_removal")) {
        if (strcmp(tt, "tool_reference")) {
            ks_api_error_set(err, 400, T_INVALID, "invalid_value", qt,
                             "%s: a tool_removal names its tool with {\"type\": \"tool_reference\", \"name\": ...}.", qt);
            return NULL;
        }
        const char *name = reference_name(tool, qt, err);
        if (!name) return NULL;
        json_t *part = text_part("Tool removed: ", name);
        if (part && json_object_set_new(t->state, name, json_false())) part = (json_decref(part), NULL);
        if (!part) ks__api_oom(err);
        return part;
    }
    /* tool_addition */
    if (!strcmp(tt, "tool_reference")) {
        const char *name = reference_name(tool, qt, err);
        return name ? load(t, name, "Tool added: ", err) : NULL;
    }
    if (strcmp(tt, "tool_definition") || !json_is_object(json_object_get(tool, "definition"))) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", qt,
                         "%s: a tool_addition carries {\"type\": \"tool_definition\", \"definition\": {name, "
                         "description, input_schema}} or {\"type\": \"tool_reference\", \"name\": ...}.", qt);
        return NULL;
    }
    char qd[160];
    snprintf(qd, sizeof qd, "%s.definition", qt);
    json_t *fn = function_of(json_object_get(tool, "definition"), qd, err);
    if (!fn) return NULL;
    const char *name = ks__api_str(fn, "name");
    json_t *part = tool_text("Tool added: ", fn);
    int rc = part ? 0 : KS_ENOMEM;
    /* A definition for a tool of the list loads that tool (its own definition
     * is the one the grammar takes); a new one joins the callable tools. */
    if (!rc && !json_object_get(t->defs, name)) rc = json_array_append(t->added, fn) || json_object_set(t->defs, name, fn);
    if (!rc) rc = json_object_set_new(t->state, name, json_true());
    json_decref(fn);
    if (rc) {
        json_decref(part);
        ks__api_oom(err);
        return NULL;
    }
    return part;
}

/* {type: "function", function: fn} (+ defer_loading, cache_control) appended to out. */
static int push(json_t *out, json_t *fn, bool deferred, json_t *cc) {
    json_t *o = json_pack("{s:s, s:O}", "type", "function", "function", fn);
    if (o && deferred && json_object_set_new(o, "defer_loading", json_true())) o = (json_decref(o), NULL);
    if (o && cc && json_object_set(o, "cache_control", cc)) o = (json_decref(o), NULL);
    return !o || json_array_append_new(out, o) ? KS_ENOMEM : 0;
}

int ks__msg_tools_to_chat(ks__msg_tools *t, json_t *chat, ks_api_error *err) {
    if (!t->given) return 0;
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "tools", out)) return ks__api_oom(err);
    size_t i;
    json_t *e;
    json_t *lost_cc = NULL; /* a breakpoint on a deferred tool left out: it marks the tools' end all the same */
    json_t *last = NULL;
    json_array_foreach(t->order, i, e) {
        json_t *fn = json_object_get(e, "function"), *cc = json_object_get(e, "cache_control");
        if (!json_is_true(json_object_get(e, "deferred"))) {
            if (push(out, fn, false, cc)) return ks__api_oom(err);
            last = json_array_get(out, json_array_size(out) - 1);
            continue;
        }
        const char *name = ks__api_str(fn, "name");
        /* the first definition of a name only (ks__msg_tools_read) */
        if (json_object_get(t->defs, name) != fn || !json_is_true(json_object_get(t->state, name))) {
            if (cc) lost_cc = cc;
            continue;
        }
        if (push(out, fn, true, cc)) return ks__api_oom(err);
    }
    json_array_foreach(t->added, i, e) {
        if (json_is_true(json_object_get(t->state, ks__api_str(e, "name"))) && push(out, e, true, NULL))
            return ks__api_oom(err);
    }
    if (lost_cc && last && !json_object_get(last, "cache_control") && json_object_set(last, "cache_control", lost_cc))
        return ks__api_oom(err);
    return 0;
}

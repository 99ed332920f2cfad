/*
 * presize.c — see presize.h.
 */
#include "prompt/presize.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Sentinels: long enough that no template writes them by chance. */
#define S_SYS "kvstashprobeSystemContentQ7vX2mL9"
#define S_USER1 "kvstashprobeUserContentOneR4kP8wZ1"
#define S_USER2 "kvstashprobeUserContentTwoJ3nB6tY5"
#define S_TOOL1 "kvstashprobe_tool_one_H2cV7qW4"
#define S_TOOL2 "kvstashprobe_tool_two_N5xD8rK3"
#define S_DESC1 "kvstashprobeToolDescriptionOneF6gT1sM8"
#define S_DESC2 "kvstashprobeToolDescriptionTwoU9hE4aC2"
#define S_PARAM "kvstashprobe_param_Z3bQ6yL1"
#define S_PDESC "kvstashprobeParamDescriptionW8jS5oI7"
#define S_ASSIST "kvstashprobeAssistantContentP4mV9cN2"
#define S_RESULT "kvstashprobeToolResultContentE7sK3wQ6"

static const char k_probe[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"" S_SYS "\"},"
    "{\"role\":\"user\",\"content\":\"" S_USER1 "\"},{\"role\":\"assistant\",\"content\":\"ok\"},"
    "{\"role\":\"user\",\"content\":\"" S_USER2 "\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"" S_TOOL1 "\",\"description\":\"" S_DESC1 "\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"" S_PARAM "\":{\"type\":\"string\",\"description\":\"" S_PDESC
    "\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"" S_TOOL2 "\",\"description\":\"" S_DESC2 "\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]}";

/* The assistant's and the tool result's probes, each alone. */
static const char k_probe_assistant[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"" S_ASSIST "\"},"
    "{\"role\":\"user\",\"content\":\"and?\"}]}";
static const char k_probe_tool[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"tool_calls\":[{\"id\":\"call12345\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call12345\",\"content\":\"" S_RESULT "\"},"
    "{\"role\":\"user\",\"content\":\"and?\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]}";

/* Whether the template renders req with sentinel whole. */
static bool shows(const ks_chat_tmpl *t, const char *req, const char *sentinel) {
    char *res = NULL, err[256] = "";
    if (ks_chat_tmpl_apply(t, req, &res, err, sizeof err) != 0) return false;
    json_t *j = json_loads(res, 0, NULL);
    free(res);
    const char *p = json_string_value(json_object_get(j, "prompt"));
    bool ok = p && strstr(p, sentinel);
    json_decref(j);
    return ok;
}

void ks_presize_probe(const ks_chat_tmpl *t, ks_presize *out) {
    memset(out, 0, sizeof *out);
    if (!t) return;
    char *res = NULL, err[256] = "";
    if (ks_chat_tmpl_apply(t, k_probe, &res, err, sizeof err) != 0) {
        KS_DEBUG("prompt", "presize probe: the template cannot render it (%s): no request is sized before rendering",
                 err);
        return;
    }
    json_t *j = json_loads(res, 0, NULL);
    free(res);
    const char *p = json_string_value(json_object_get(j, "prompt"));
    if (p) {
        out->content[0] = strstr(p, S_SYS) != NULL;
        out->content[1] = strstr(p, S_USER1) && strstr(p, S_USER2);
        out->tool_name = strstr(p, S_TOOL1) && strstr(p, S_TOOL2);
        out->tool_desc = strstr(p, S_DESC1) && strstr(p, S_DESC2);
        out->param_name = strstr(p, S_PARAM) != NULL;
        out->param_desc = strstr(p, S_PDESC) != NULL;
    }
    json_decref(j);
    out->content[KS_PRESIZE_ASSISTANT] = shows(t, k_probe_assistant, S_ASSIST);
    out->content[KS_PRESIZE_TOOL] = shows(t, k_probe_tool, S_RESULT);
}

int ks_presize_role(const char *role) {
    if (!role) return -1;
    if (!strcmp(role, "system") || !strcmp(role, "developer")) return KS_PRESIZE_SYSTEM;
    if (!strcmp(role, "user")) return KS_PRESIZE_USER;
    if (!strcmp(role, "assistant")) return KS_PRESIZE_ASSISTANT;
    if (!strcmp(role, "tool")) return KS_PRESIZE_TOOL;
    return -1;
}

static bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* A string's length without the whitespace around it. */
static size_t trimmed(const char *s, size_t n) {
    size_t a = 0;
    while (a < n && space(s[a])) a++;
    while (n > a && space(s[n - 1])) n--;
    return n - a;
}

static size_t str_len(const json_t *v) { return json_is_string(v) ? json_string_length(v) : 0; }

static const char THINK_END[] = "</think>";

/* Where the text after the last "</think>" in s[0, n) starts; NULL: none. */
static const char *after_think(const char *s, size_t n) {
    const char *last = NULL;
    size_t m = sizeof THINK_END - 1;
    for (const char *p = s; (size_t)(s + n - p) >= m; p++) {
        p = memchr(p, '<', (size_t)(s + n - p));
        if (!p || (size_t)(s + n - p) < m) break;
        if (!memcmp(p, THINK_END, m)) last = p + m;
    }
    return last;
}

size_t ks_presize_after_think(const char *s, size_t n) {
    const char *a = after_think(s, n);
    return a ? trimmed(a, (size_t)(s + n - a)) : trimmed(s, n);
}

/* A message's content: a string, or text parts (each trimmed: their sum is
 * at most the trimmed text they join to, whatever joins them). think: an
 * assistant's, counted from after its last "</think>" (the parts after the
 * last part holding one, and that part's text after it). */
static size_t content_bytes(const json_t *c, bool think) {
    if (json_is_string(c)) {
        const char *s = json_string_value(c);
        size_t n = json_string_length(c);
        return think ? ks_presize_after_think(s, n) : trimmed(s, n);
    }
    size_t n = 0, i;
    json_t *part;
    if (json_is_array(c))
        json_array_foreach(c, i, part) {
            json_t *t = json_object_get(part, "text");
            if (!json_is_string(t)) continue;
            const char *s = json_string_value(t);
            size_t len = json_string_length(t);
            if (think && after_think(s, len)) n = ks_presize_after_think(s, len);
            else n += trimmed(s, len);
        }
    return n;
}

size_t ks_presize_bytes(const ks_presize *p, const json_t *req) {
    size_t n = 0, i;
    json_t *v;
    json_array_foreach(json_object_get(req, "messages"), i, v) {
        int k = ks_presize_role(json_string_value(json_object_get(v, "role")));
        if (k >= 0 && p->content[k]) n += content_bytes(json_object_get(v, "content"), k == KS_PRESIZE_ASSISTANT);
    }
    json_array_foreach(json_object_get(req, "tools"), i, v) {
        json_t *f = json_object_get(v, "function");
        if (p->tool_name) n += str_len(json_object_get(f, "name"));
        if (p->tool_desc) n += str_len(json_object_get(f, "description"));
        if (!p->param_name && !p->param_desc) continue;
        const char *key;
        json_t *prop;
        json_object_foreach(json_object_get(json_object_get(f, "parameters"), "properties"), key, prop) {
            if (p->param_name) n += strlen(key);
            if (p->param_desc) n += str_len(json_object_get(prop, "description"));
        }
    }
    return n;
}

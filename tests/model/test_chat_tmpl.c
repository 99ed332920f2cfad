/*
 * Model tests of chat_tmpl (llama.cpp's common library behind a C interface):
 * real Jinja templates from the pinned llama.cpp source (KS_TEMPLATES_DIR,
 * installed by scripts/setup.sh), tool calls rendered and parsed back, JSON
 * schema -> GBNF, errors that must come back as codes, and the GGUF's own
 * template on the generated tiny model (KS_TINY_MODEL).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <cmocka.h>
#include <jansson.h>

#include "engine/chat_tmpl.h"
#include "kvstash.h"

/* Every template of llama.cpp's that setup installs; each must render the
 * conversation below. */
static const struct {
    const char *name;
    bool shows_system; /* Mistral Nemo shows the system message only with the last user message */
} TEMPLATES[] = {
    {"Qwen-Qwen2.5-7B-Instruct", true},
    {"Qwen-Qwen3-0.6B", true},
    {"Qwen3-Coder", true},
    {"meta-llama-Llama-3.1-8B-Instruct", true},
    {"mistralai-Mistral-Nemo-Instruct-2407", false},
    {"openai-gpt-oss-120b", true},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", true},
};

#define SYSTEM "You are a terse weather bot."
#define USER "What is the weather like in the capital of France?"
#define RESULT "Sunny and 21 degrees"
/* Mistral's template insists on 9 alphanumeric characters. */
#define CALL_ID "abcDEF123"

#define QWEN_CALL "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = '\0';
            }
        }
    }
    fclose(f);
    return buf;
}

/* The templates of one file of KS_TEMPLATES_DIR. */
static ks_chat_tmpl *open_template(const char *name) {
    const char *dir = getenv("KS_TEMPLATES_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.jinja", dir ? dir : "build/deps/common/templates", name);
    char *src = slurp(path);
    if (!src) fprintf(stderr, "cannot read %s\n", path);
    assert_non_null(src);
    char err[1024] = "";
    ks_chat_tmpl *t = NULL;
    int rc = ks_chat_tmpl_create(NULL, src, &t, err, sizeof err);
    if (rc) fprintf(stderr, "%s: %s\n", name, err);
    assert_int_equal(rc, 0);
    assert_non_null(t);
    free(src);
    return t;
}

/* System, user, an assistant tool call, its result; one tool. Owned. */
static json_t *conversation(const char *tool_choice) {
    json_error_t je;
    json_t *req = json_pack_ex(
        &je, 0,
        "{s:[{s:s,s:s},{s:s,s:s},{s:s,s:n,s:[{s:s,s:s,s:{s:s,s:s}}]},{s:s,s:s,s:s}],"
        " s:[{s:s,s:{s:s,s:s,s:{s:s,s:{s:{s:s}},s:[s]}}}]}",
        "messages", "role", "system", "content", SYSTEM, "role", "user", "content", USER, "role", "assistant",
        "content", "tool_calls", "id", CALL_ID, "type", "function", "function", "name", "get_weather",
        "arguments", "{\"city\": \"Paris\"}", "role", "tool", "tool_call_id", CALL_ID, "content", RESULT,
        "tools", "type", "function", "function", "name", "get_weather", "description",
        "Get the current weather in a city", "parameters", "type", "object", "properties", "city", "type",
        "string", "required", "city");
    if (!req) fprintf(stderr, "json_pack: %s\n", je.text);
    assert_non_null(req);
    if (tool_choice) json_object_set_new(req, "tool_choice", json_string(tool_choice));
    return req;
}

/* Applies req (borrowed) and returns the parsed result (owned). */
static json_t *apply_ok(const ks_chat_tmpl *t, const json_t *req, const char *what) {
    char *text = json_dumps(req, JSON_COMPACT);
    assert_non_null(text);
    char err[2048] = "";
    char *res = NULL;
    int rc = ks_chat_tmpl_apply(t, text, &res, err, sizeof err);
    if (rc) fprintf(stderr, "%s: apply: %s\n", what, err);
    assert_int_equal(rc, 0);
    assert_non_null(res);
    json_t *j = json_loads(res, 0, NULL);
    assert_non_null(j);
    free(res);
    free(text);
    return j;
}

static const char *str_of(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    if (!s) fprintf(stderr, "no string '%s'\n", key);
    assert_non_null(s);
    return s;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

static void assert_contains(const char *hay, const char *needle, const char *what) {
    if (!strstr(hay, needle)) fprintf(stderr, "%s: \"%s\" not in:\n%s\n", what, needle, hay);
    assert_non_null(strstr(hay, needle));
}

/* Every template renders the system text (see shows_system), the user's question, the tool, the
 * assistant's call (its "Paris" argument comes only from there) and the tool's
 * result; "required" gives a grammar naming the tool, "none" none at all. */
static void test_templates_render_tool_conversation(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof TEMPLATES / sizeof *TEMPLATES; i++) {
        const char *name = TEMPLATES[i].name;
        ks_chat_tmpl *t = open_template(name);

        json_t *req = conversation("auto");
        json_t *r = apply_ok(t, req, name);
        const char *prompt = str_of(r, "prompt");
        if (TEMPLATES[i].shows_system) assert_contains(prompt, SYSTEM, name);
        assert_contains(prompt, USER, name);
        assert_contains(prompt, "get_weather", name);
        assert_contains(prompt, "Get the current weather in a city", name);
        assert_contains(prompt, "Paris", name);
        assert_contains(prompt, RESULT, name);
        assert_true(ends_with(prompt, str_of(r, "generation_prompt")));
        assert_true(json_is_integer(json_object_get(r, "format")));
        assert_true(json_is_string(json_object_get(json_object_get(r, "parse"), "parser")));
        assert_true(json_is_true(json_object_get(json_object_get(r, "parse"), "parse_tool_calls")));
        json_decref(r);
        json_decref(req);

        req = conversation("required");
        r = apply_ok(t, req, name);
        const char *g = str_of(r, "grammar");
        assert_true(strlen(g) > 0);
        assert_contains(g, "get_weather", name);
        assert_contains(g, "root ::=", name);
        assert_true(json_is_false(json_object_get(r, "grammar_lazy")));
        assert_true(json_is_true(json_object_get(r, "grammar_prefill")));
        json_decref(r);
        json_decref(req);

        req = conversation("none");
        r = apply_ok(t, req, name);
        assert_string_equal(str_of(r, "grammar"), "");
        assert_true(json_is_false(json_object_get(json_object_get(r, "parse"), "parse_tool_calls")));
        json_decref(r);
        json_decref(req);

        ks_chat_tmpl_free(t);
    }
}

/* Qwen2.5: a lazy grammar triggered by <tool_call>, the tags preserved,
 * ChatML's assistant header as the generation prompt. */
static void test_qwen25_grammar(void **st) {
    (void)st;
    ks_chat_tmpl *t = open_template("Qwen-Qwen2.5-7B-Instruct");
    json_t *req = conversation("auto");
    json_t *r = apply_ok(t, req, "qwen2.5 auto");
    assert_true(strlen(str_of(r, "grammar")) > 0);
    assert_true(json_is_true(json_object_get(r, "grammar_lazy")));
    json_t *tr = json_object_get(r, "grammar_triggers");
    assert_true(json_array_size(tr) >= 1);
    assert_string_equal(str_of(json_array_get(tr, 0), "type"), "word");
    assert_contains(str_of(json_array_get(tr, 0), "value"), "<tool_call>", "trigger");
    assert_contains(str_of(json_array_get(tr, 0), "pattern"), "<tool_call>", "trigger pattern");
    json_t *pt = json_object_get(r, "preserved_tokens");
    bool has_open = false;
    for (size_t i = 0; i < json_array_size(pt); i++)
        if (strcmp(json_string_value(json_array_get(pt, i)), "<tool_call>") == 0) has_open = true;
    assert_true(has_open);
    assert_string_equal(str_of(r, "generation_prompt"), "<|im_start|>assistant\n");
    assert_contains(str_of(r, "prompt"), "<tool_response>\n" RESULT "\n</tool_response>", "qwen2.5");
    json_decref(r);
    json_decref(req);

    req = conversation("required");
    r = apply_ok(t, req, "qwen2.5 required");
    assert_true(strlen(str_of(r, "grammar")) > 0);
    assert_true(json_is_false(json_object_get(r, "grammar_lazy")));
    json_decref(r);
    json_decref(req);
    ks_chat_tmpl_free(t);
}

/* deferred_tools (chat_tmpl.h note 4): a deferred tool is not in the
 * rendered prompt, its name is in the grammar, and a call to it parses as a
 * call; the prompt equals the one rendered without it, on two templates of
 * other tool formats. */
static void test_deferred_tools(void **st) {
    (void)st;
    static const char *const names[] = {"Qwen-Qwen2.5-7B-Instruct", "Qwen3-Coder"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        ks_chat_tmpl *t = open_template(names[k]);
        json_t *req = conversation("auto");
        json_t *plain = apply_ok(t, req, names[k]);
        json_object_set_new(req, "deferred_tools",
                            json_pack("[{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s}}}}}]", "type", "function", "function",
                                      "name", "fetch_page", "description", "Fetches a web page", "parameters",
                                      "type", "object", "properties", "url", "type", "string"));
        json_t *r = apply_ok(t, req, names[k]);
        assert_string_equal(str_of(r, "prompt"), str_of(plain, "prompt"));
        assert_null(strstr(str_of(r, "prompt"), "fetch_page"));
        assert_contains(str_of(r, "grammar"), "fetch_page", names[k]);
        assert_contains(str_of(r, "grammar"), "get_weather", names[k]);
        assert_null(strstr(str_of(plain, "grammar"), "fetch_page"));
        assert_string_equal(str_of(r, "generation_prompt"), str_of(plain, "generation_prompt"));
        json_decref(r);
        /* No listed tool at all: the prompt has no tool section, the grammar has the deferred one. */
        json_object_del(req, "tools");
        json_t *bare = json_deep_copy(req);
        json_object_del(bare, "deferred_tools");
        json_t *rb = apply_ok(t, bare, names[k]);
        r = apply_ok(t, req, names[k]);
        assert_string_equal(str_of(r, "prompt"), str_of(rb, "prompt"));
        assert_contains(str_of(r, "grammar"), "fetch_page", names[k]);
        assert_true(json_is_true(json_object_get(json_object_get(r, "parse"), "parse_tool_calls")));
        json_decref(r);
        json_decref(rb);
        json_decref(bare);
        json_decref(plain);
        json_decref(req);
        ks_chat_tmpl_free(t);
    }
}

/* Parses text with the parse options of a Qwen2.5 tool request. Owned. */
static json_t *qwen25_parse(const char *text, bool partial) {
    ks_chat_tmpl *t = open_template("Qwen-Qwen2.5-7B-Instruct");
    json_t *req = conversation("auto");
    json_t *r = apply_ok(t, req, "qwen2.5");
    char *opts = json_dumps(json_object_get(r, "parse"), JSON_COMPACT);
    char err[1024] = "";
    char *msg = NULL;
    int rc = ks_chat_tmpl_parse(text, partial, opts, &msg, err, sizeof err);
    if (rc) fprintf(stderr, "parse: %s\n", err);
    assert_int_equal(rc, 0);
    json_t *m = json_loads(msg, 0, NULL);
    assert_non_null(m);
    free(msg);
    free(opts);
    json_decref(r);
    json_decref(req);
    ks_chat_tmpl_free(t);
    return m;
}

/* The model's <tool_call> block comes back as one call with its name and
 * arguments; text before it is content; plain text is only content. */
static void test_qwen25_parse_tool_call(void **st) {
    (void)st;
    json_t *m = qwen25_parse(QWEN_CALL, false);
    assert_string_equal(str_of(m, "role"), "assistant");
    assert_string_equal(str_of(m, "content"), "");
    json_t *calls = json_object_get(m, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_t *call = json_array_get(calls, 0);
    assert_string_equal(str_of(call, "type"), "function");
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(str_of(fn, "name"), "get_weather");
    json_t *args = json_loads(str_of(fn, "arguments"), 0, NULL);
    assert_non_null(args);
    assert_string_equal(str_of(args, "city"), "Paris");
    json_decref(args);
    json_decref(m);

    m = qwen25_parse("Let me look." QWEN_CALL, false);
    assert_string_equal(str_of(m, "content"), "Let me look.");
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 1);
    json_decref(m);

    m = qwen25_parse("It is sunny in Paris.", false);
    assert_string_equal(str_of(m, "content"), "It is sunny in Paris.");
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 0);
    json_decref(m);

    /* Streaming: a call cut in its arguments already has its name. */
    m = qwen25_parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci", true);
    calls = json_object_get(m, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    assert_string_equal(str_of(json_object_get(json_array_get(calls, 0), "function"), "name"), "get_weather");
    assert_null(strstr(str_of(m, "content"), "<tool_call>"));
    json_decref(m);

    /* Without the template's parser the same text is plain content. */
    char *msg = NULL;
    char err[256] = "";
    assert_int_equal(ks_chat_tmpl_parse(QWEN_CALL, false, NULL, &msg, err, sizeof err), 0);
    m = json_loads(msg, 0, NULL);
    assert_string_equal(str_of(m, "content"), QWEN_CALL);
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 0);
    json_decref(m);
    free(msg);
}

/* Qwen3 thinks in <think> tags: with reasoning_format "deepseek" (the
 * default) the thought goes to reasoning_content; enable_thinking false puts
 * an empty think block in the prompt. */
static void test_qwen3_reasoning(void **st) {
    (void)st;
    ks_chat_tmpl *t = open_template("Qwen-Qwen3-0.6B");
    json_t *req = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", "hi");
    json_t *r = apply_ok(t, req, "qwen3");
    assert_true(json_is_true(json_object_get(r, "supports_thinking")));
    assert_string_equal(str_of(r, "thinking_start_tag"), "<think>");
    char *opts = json_dumps(json_object_get(r, "parse"), JSON_COMPACT);
    char *msg = NULL;
    char err[1024] = "";
    assert_int_equal(ks_chat_tmpl_parse("<think>\nThe user greets me.\n</think>\n\nHello!", false, opts, &msg, err,
                                        sizeof err),
                     0);
    json_t *m = json_loads(msg, 0, NULL);
    assert_string_equal(str_of(m, "content"), "Hello!");
    assert_contains(str_of(m, "reasoning_content"), "The user greets me.", "reasoning");
    json_decref(m);
    free(msg);
    free(opts);
    json_decref(r);

    json_object_set_new(req, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
    r = apply_ok(t, req, "qwen3 no thinking");
    assert_true(ends_with(str_of(r, "prompt"), "<think>\n\n</think>\n\n"));
    json_decref(r);
    json_decref(req);
    ks_chat_tmpl_free(t);
}

/* JSON schema -> GBNF: the properties are in the grammar; a schema the
 * converter cannot handle and text that is not a schema are errors. */
static void test_json_schema(void **st) {
    (void)st;
    char err[1024] = "";
    char *g = NULL;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                         "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}";
    assert_int_equal(ks_chat_tmpl_schema_to_grammar(schema, &g, err, sizeof err), 0);
    assert_contains(g, "root ::=", "schema");
    assert_contains(g, "\\\"city\\\"", "schema");
    assert_contains(g, "\\\"days\\\"", "schema");
    free(g);

    const char *bad[] = {
        "{\"$ref\":\"#/definitions/missing\"}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"strin\"}}}",
        "{\"type\":",
        "[1, 2]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        g = (char *)1;
        assert_int_equal(ks_chat_tmpl_schema_to_grammar(bad[i], &g, err, sizeof err), KS_EINVAL);
        assert_null(g);
        assert_true(strlen(err) > 0);
    }
    assert_int_equal(ks_chat_tmpl_schema_to_grammar(NULL, &g, err, sizeof err), KS_EINVAL);

    /* Through a chat request: response_format gives a strict (not lazy)
     * grammar the template built, to be prefilled. */
    ks_chat_tmpl *t = open_template("Qwen-Qwen2.5-7B-Instruct");
    json_t *req = json_pack("{s:[{s:s,s:s}],s:{s:s,s:{s:o}}}", "messages", "role", "user", "content", "Weather?",
                            "response_format", "type", "json_schema", "json_schema", "schema", json_loads(schema, 0, NULL));
    json_t *r = apply_ok(t, req, "response_format");
    assert_contains(str_of(r, "grammar"), "city", "response_format");
    assert_true(json_is_false(json_object_get(r, "grammar_lazy")));
    assert_true(json_is_true(json_object_get(r, "grammar_prefill")));
    json_decref(r);
    json_decref(req);

    /* A caller's own GBNF is passed through, not prefilled. */
    req = json_pack("{s:[{s:s,s:s}],s:s}", "messages", "role", "user", "content", "yes?", "grammar",
                    "root ::= \"yes\" | \"no\"");
    r = apply_ok(t, req, "grammar");
    assert_string_equal(str_of(r, "grammar"), "root ::= \"yes\" | \"no\"");
    assert_true(json_is_false(json_object_get(r, "grammar_prefill")));
    json_decref(r);
    json_decref(req);
    ks_chat_tmpl_free(t);
}

/* Malformed requests are refused with KS_EINVAL and a message; a template
 * that raises gives KS_ETEMPLATE; the process goes on and renders after. */
static void test_bad_requests(void **st) {
    (void)st;
    ks_chat_tmpl *t = open_template("Qwen-Qwen2.5-7B-Instruct");
    const char *bad[] = {
        "not json",
        "",
        "[]",
        "{}",
        "{\"messages\": \"hello\"}",
        "{\"messages\": [\"hello\"]}",
        "{\"messages\": [{\"content\": \"no role\"}]}",
        "{\"messages\": [{\"role\": \"user\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": 42}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": {}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\","
        " \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"bogus\"}}}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tool_choice\": \"sometimes\"}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tool_choice\": {\"type\": \"function\"}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"json_schema\": {}, \"grammar\": \"root ::= \\\"a\\\"\"}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"json_schema\": {\"$ref\": \"#/nope\"}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"xml\"}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"reasoning_format\": \"bogus\"}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": \"yes\"}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": [1]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"a\"},"
        " {\"role\": \"assistant\", \"content\": \"b\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[1024] = "";
        char *res = (char *)1;
        int rc = ks_chat_tmpl_apply(t, bad[i], &res, err, sizeof err);
        if (rc != KS_EINVAL) fprintf(stderr, "request %zu: rc %d (%s)\n", i, rc, err);
        assert_int_equal(rc, KS_EINVAL);
        assert_null(res);
        assert_true(strlen(err) > 0);
    }
    /* Grammar and tools together. */
    json_t *req = conversation("auto");
    json_object_set_new(req, "grammar", json_string("root ::= \"a\""));
    char *text = json_dumps(req, JSON_COMPACT);
    char err[1024] = "";
    char *res = NULL;
    assert_int_equal(ks_chat_tmpl_apply(t, text, &res, err, sizeof err), KS_EINVAL);
    assert_contains(err, "grammar", "grammar with tools");
    free(text);
    json_decref(req);
    assert_int_equal(ks_chat_tmpl_apply(NULL, "{}", &res, err, sizeof err), KS_EINVAL);
    assert_int_equal(ks_chat_tmpl_apply(t, NULL, &res, err, sizeof err), KS_EINVAL);

    /* Bad parse options. */
    const char *bad_opts[] = {"nope", "[]", "{\"format\": 99}", "{\"format\": \"x\"}", "{\"parser\": \"{bad\"}",
                              "{\"reasoning_format\": \"bogus\"}"};
    for (size_t i = 0; i < sizeof bad_opts / sizeof *bad_opts; i++) {
        char *msg = (char *)1;
        err[0] = '\0';
        assert_int_equal(ks_chat_tmpl_parse("hello", false, bad_opts[i], &msg, err, sizeof err), KS_EINVAL);
        assert_null(msg);
        assert_true(strlen(err) > 0);
    }

    /* Still alive and rendering. */
    req = conversation("auto");
    json_t *r = apply_ok(t, req, "after errors");
    assert_contains(str_of(r, "prompt"), RESULT, "after errors");
    json_decref(r);
    json_decref(req);
    ks_chat_tmpl_free(t);

    /* Jinja that does not parse, and Jinja that raises. */
    ks_chat_tmpl *bt = (ks_chat_tmpl *)1;
    err[0] = '\0';
    assert_int_equal(ks_chat_tmpl_create(NULL, "{% for %}", &bt, err, sizeof err), KS_ETEMPLATE);
    assert_null(bt);
    assert_true(strlen(err) > 0);
    assert_null(strstr(err, "std::exception"));
    assert_int_equal(ks_chat_tmpl_create(NULL, "{{ raise_exception('boom') }}", &bt, err, sizeof err), 0);
    err[0] = '\0';
    res = (char *)1;
    assert_int_equal(ks_chat_tmpl_apply(bt, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &res,
                                        err, sizeof err),
                     KS_ETEMPLATE);
    assert_null(res);
    assert_contains(err, "boom", "raise_exception");
    ks_chat_tmpl_free(bt);
    ks_chat_tmpl_free(NULL);
}

/* The tiny model's GGUF carries a ChatML template: it is found, reported and
 * renders ChatML exactly. */
static void test_create_from_model(void **st) {
    (void)st;
    const char *model = getenv("KS_TINY_MODEL");
    char err[1024] = "";
    ks_chat_tmpl *t = NULL;
    int rc = ks_chat_tmpl_create_from_file(model ? model : "build/models/tiny.gguf", NULL, &t, err, sizeof err);
    if (rc) fprintf(stderr, "create_from_file: %s\n", err);
    assert_int_equal(rc, 0);

    char *info = NULL;
    assert_int_equal(ks_chat_tmpl_info(t, &info, err, sizeof err), 0);
    json_t *ji = json_loads(info, 0, NULL);
    assert_non_null(ji);
    assert_contains(str_of(ji, "source"), "<|im_start|>", "source");
    assert_string_equal(str_of(ji, "tool_use_source"), "");
    assert_true(json_is_true(json_object_get(ji, "was_explicit")));
    assert_true(json_is_true(json_object_get(json_object_get(ji, "caps"), "supports_system_role")));
    assert_true(json_is_boolean(json_object_get(json_object_get(ji, "caps"), "supports_tools")));
    json_decref(ji);
    free(info);

    json_t *req = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "messages", "role", "system", "content", "Be brief.",
                            "role", "user", "content", "hello");
    json_t *r = apply_ok(t, req, "tiny");
    assert_string_equal(str_of(r, "prompt"), "<|im_start|>system\nBe brief.<|im_end|>\n"
                                             "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
    json_decref(r);
    json_decref(req);
    ks_chat_tmpl_free(t);

    /* Errors: nothing to build from, a missing file. */
    t = (ks_chat_tmpl *)1;
    assert_int_equal(ks_chat_tmpl_create(NULL, NULL, &t, err, sizeof err), KS_EINVAL);
    assert_null(t);
    assert_int_equal(ks_chat_tmpl_create_from_file("/nonexistent/model.gguf", NULL, &t, err, sizeof err), KS_EMODEL);
    assert_null(t);
}

/* Several threads apply and parse on one template object at once (as the
 * server's HTTP threads will) and all get the single-threaded answer. */
typedef struct {
    const ks_chat_tmpl *t;
    const char *req;
    const char *want;
    int bad;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    for (int i = 0; i < 10; i++) {
        char err[512];
        char *res = NULL;
        if (ks_chat_tmpl_apply(a->t, a->req, &res, err, sizeof err) || strcmp(res, a->want) != 0) a->bad++;
        free(res);
        char *msg = NULL;
        if (ks_chat_tmpl_parse(QWEN_CALL, false, NULL, &msg, err, sizeof err)) a->bad++;
        free(msg);
    }
    return NULL;
}

static void test_concurrent_apply(void **st) {
    (void)st;
    ks_chat_tmpl *t = open_template("Qwen-Qwen2.5-7B-Instruct");
    json_t *req = conversation("auto");
    char *text = json_dumps(req, JSON_COMPACT);
    char err[512];
    char *want = NULL;
    assert_int_equal(ks_chat_tmpl_apply(t, text, &want, err, sizeof err), 0);
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){.t = t, .req = text, .want = want, .bad = 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    free(want);
    free(text);
    json_decref(req);
    ks_chat_tmpl_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_templates_render_tool_conversation),
        cmocka_unit_test(test_qwen25_grammar),
        cmocka_unit_test(test_deferred_tools),
        cmocka_unit_test(test_qwen25_parse_tool_call),
        cmocka_unit_test(test_qwen3_reasoning),
        cmocka_unit_test(test_json_schema),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_create_from_model),
        cmocka_unit_test(test_concurrent_apply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

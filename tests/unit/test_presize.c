/* test_presize.c — the size bound before a render (issue 28;
 * src/prompt/presize.c): for every template in $KS_TEMPLATES_DIR and
 * ChatML, the bound never exceeds the bytes the template really renders, for
 * requests with tools, system and user messages, text parts, padded
 * contents and multi-turn conversations (a bound above the render would
 * refuse a request that fits); the templates that render tools count them,
 * and a template that cannot render the probe counts nothing. */
#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "engine/chat_tmpl.h"
#include "prompt/presize.h"

static const char *const k_requests[] = {
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}]}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"  You are terse.\\n\\n \"},"
    "{\"role\":\"user\",\"content\":\"\\n  What is 2+2?   \"},{\"role\":\"assistant\",\"content\":\"4\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\" part one \"},{\"type\":\"text\",\"text\":\"two\"}]}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],\"tools\":["
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather in a city, now.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"the city\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noop\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Use tools.\"},{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
    "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},{\"role\":\"user\",\"content\":\"Thanks!\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"c\"}}}}}]}",
    /* Issue 42: assistants' contents (reasoning cut at "</think>" by some
     * templates, earlier turns or the last) and long tool results. */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Q1\"},{\"role\":\"assistant\",\"content\":"
    "\"<think>\\nreasoning that some templates drop\\n</think>\\n\\nThe first answer, kept.\"},"
    "{\"role\":\"user\",\"content\":\"Q2\"},{\"role\":\"assistant\",\"content\":\"A plain second answer.\"},"
    "{\"role\":\"user\",\"content\":\"Q3\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Q1\"},{\"role\":\"assistant\",\"content\":"
    "\"<think>thinking</think>The prefilled start of an answer\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Q1\"},{\"role\":\"assistant\",\"content\":"
    "[{\"type\":\"text\",\"text\":\"part a</think>\"},{\"type\":\"text\",\"text\":\"part b after\"}]},"
    "{\"role\":\"user\",\"content\":\"Q2\"}]}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Use tools.\"},{\"role\":\"user\",\"content\":\"Read it\"},"
    "{\"role\":\"assistant\",\"content\":\"Reading the file now.\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"read\",\"arguments\":\"{}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"   line one of the file\\nline two of the file   \"},"
    "{\"role\":\"assistant\",\"content\":\"It has two lines.\"},{\"role\":\"user\",\"content\":\"Thanks!\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"read\",\"parameters\":{\"type\":\"object\"}}}]}",
};

/* Every request: bound <= rendered bytes. Returns how many tools-kinds count. */
static int check_template(const char *name, const char *src) {
    ks_chat_tmpl *t = NULL;
    char err[512] = "";
    if (ks_chat_tmpl_create(NULL, src, &t, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    ks_presize p;
    ks_presize_probe(t, &p);
    for (size_t i = 0; i < sizeof k_requests / sizeof k_requests[0]; i++) {
        char *res = NULL;
        if (ks_chat_tmpl_apply(t, k_requests[i], &res, err, sizeof err) != 0) continue; /* the template refuses it */
        json_t *r = json_loads(res, 0, NULL), *q = json_loads(k_requests[i], 0, NULL);
        assert_non_null(r);
        assert_non_null(q);
        size_t rendered = strlen(json_string_value(json_object_get(r, "prompt")));
        size_t bound = ks_presize_bytes(&p, q);
        if (bound > rendered) fail_msg("%s, request %zu: bound %zu > rendered %zu", name, i, bound, rendered);
        json_decref(r);
        json_decref(q);
        free(res);
    }
    ks_chat_tmpl_free(t);
    printf("  %-55s content %d%d%d%d tools %d%d params %d%d\n", name, p.content[0], p.content[1], p.content[2],
           p.content[3], p.tool_name, p.tool_desc,
           p.param_name, p.param_desc);
    return p.tool_name + p.tool_desc;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = '\0';
    fclose(f);
    return b;
}

static void test_bound_never_above_render(void **state) {
    (void)state;
    check_template("chatml",
                   "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
    const char *dir = getenv("KS_TEMPLATES_DIR");
    if (!dir || !dir[0]) {
        printf("  KS_TEMPLATES_DIR not set: ChatML only\n");
        return;
    }
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    int n = 0, with_tools = 0;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l < 7 || strcmp(de->d_name + l - 6, ".jinja") != 0) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        char *src = slurp(path);
        assert_non_null(src);
        with_tools += check_template(de->d_name, src) > 0;
        free(src);
        n++;
    }
    closedir(d);
    assert_true(n > 0);
    assert_true(with_tools > 0); /* the bound sees tools where templates render them */
}

/* A template that raises on the probe counts nothing. */
static void test_failing_probe_counts_nothing(void **state) {
    (void)state;
    ks_chat_tmpl *t = NULL;
    char err[256];
    assert_int_equal(ks_chat_tmpl_create(NULL, "{{ raise_exception('no') }}", &t, err, sizeof err), 0);
    ks_presize p;
    ks_presize_probe(t, &p);
    json_t *q = json_loads(k_requests[2], 0, NULL);
    assert_int_equal(ks_presize_bytes(&p, q), 0);
    json_decref(q);
    ks_chat_tmpl_free(t);
    ks_presize_probe(NULL, &p);
    assert_false(p.content[1]);
}

int main(void) {
    ks_log_set_level(KS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_never_above_render),
        cmocka_unit_test(test_failing_probe_counts_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * fuzz_api.c — a request body of the OpenAI-compatible API into the
 * server's internal request (src/server/api.c, api_chat.c; the Responses and
 * Messages translations, api_responses.c and api_messages.c), and the chat
 * request rendered by the chat template (engine/chat_tmpl.cpp over
 * llama.cpp's common library): everything the server does with a body
 * before it tokenizes, which is the first step that needs a model.
 *
 * Input: the body bytes, as POSTed. Each input is parsed as
 * /v1/chat/completions, /v1/completions, /v1/responses and /v1/messages.
 * The template is Qwen2.5-Instruct's (tools, system role) from
 * $KS_TEMPLATES_DIR, which ctest and tests/fuzz/run.sh set; without it a
 * built-in ChatML template.
 *
 * Properties checked:
 *  1. a body is accepted (0), refused as the client's fault (KS_EINVAL,
 *     status 400) or out of memory (KS_ENOMEM, 500) — never a crash, a leak
 *     or a read out of bounds;
 *  2. a refusal always renders as an error body in both shapes (OpenAI's,
 *     Anthropic's): the reply to a bad request is never a 500 of its own;
 *  3. an accepted request keeps api.h's promises: every message and stop
 *     is a NUL-free valid UTF-8 string, counts are within their limits
 *     (stops, n, choices, top_logprobs, breakpoints), breakpoints name a
 *     message that exists, and tmpl_req serializes (it goes to the
 *     template as JSON text, each message also hashed as canonical JSON);
 *  4. the template either renders the chat request into a result with a
 *     prompt string, or refuses it with KS_EINVAL / KS_ETEMPLATE and a
 *     message;
 *  5. with media input on (small limits), every item of an accepted request
 *     is within the limits, its format the one its magic bytes say, an
 *     image's size within max_pixels (api_media.c).
 *  6. the size bound from the body's bytes (server/prescan.h) never
 *     exceeds presize's bound of the chat request the format's parser made
 *     of an accepted body (a request that fits is never refused), unless a
 *     named tool_choice kept only one tool (tools count whole, prescan.h
 *     invariant 1); no prefix of the body counts more than the whole.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/base.h"
#include "engine/chat_tmpl.h"
#include "fuzz.h"
#include "server/api.h"
#include "server/api_int.h"
#include "server/prescan.h"

static ks_chat_tmpl *g_tmpl;

static const char CHATML[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = malloc(1 << 20);
    size_t n = s ? fread(s, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (s) s[n] = '\0';
    return s;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* The library's logging (jansson errors are ours to report, not to print). */
    ks_log_set_level(KS_LOG_ERROR);
    const char *dir = getenv("KS_TEMPLATES_DIR");
    char *src = NULL;
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/Qwen-Qwen2.5-7B-Instruct.jinja", dir);
        src = slurp(path);
    }
    char err[256];
    FUZZ_CHECK_EQ(ks_chat_tmpl_create(NULL, src ? src : CHATML, &g_tmpl, err, sizeof err), 0);
    free(src);
    return 0;
}

static bool text_ok(const char *s) {
    if (!s) return false;
    json_t *j = json_string(s); /* valid UTF-8; strlen stops at the only NUL */
    bool ok = j != NULL;
    json_decref(j);
    return ok;
}

/* Property 2. */
static void check_refusal(int rc, const ks_api_error *e) {
    FUZZ_CHECK(rc == KS_EINVAL || rc == KS_ENOMEM);
    FUZZ_CHECK_EQ(e->status, rc == KS_EINVAL ? 400 : 500);
    FUZZ_CHECK(e->message[0] != '\0');
    json_t *a = ks_api_error_json(e), *b = ks_api_messages_error_json(e);
    FUZZ_CHECK(a != NULL && b != NULL);
    char *s = ks_api_dump(a);
    FUZZ_CHECK(s != NULL);
    free(s);
    json_decref(a);
    json_decref(b);
}

/* Property 4. */
static void check_render(const json_t *tmpl_req) {
    char *body = json_dumps(tmpl_req, JSON_COMPACT);
    FUZZ_CHECK(body != NULL);
    char *out = NULL, err[256] = "";
    int rc = ks_chat_tmpl_apply(g_tmpl, body, &out, err, sizeof err);
    free(body);
    if (rc == 0) {
        json_t *res = json_loads(out, 0, NULL);
        FUZZ_CHECK(res != NULL && json_is_string(json_object_get(res, "prompt")));
        json_decref(res);
    } else {
        FUZZ_CHECK(rc == KS_EINVAL || rc == KS_ETEMPLATE);
        FUZZ_CHECK(out == NULL && err[0] != '\0');
    }
    free(out);
}

/* Property 5: small limits, so that bodies the fuzzer finds reach each one. */
static const ks_media_limits g_media = {.modalities = KS_MEDIA_IN_IMAGE | KS_MEDIA_IN_AUDIO, .max_bytes = 4096,
                                        .max_items = 4, .max_total_bytes = 8192, .max_pixels = 1 << 20};

static void check_media(const ks_api_request *r) {
    FUZZ_CHECK(r->n_media >= 0 && r->n_media <= g_media.max_items && r->media_bytes <= g_media.max_total_bytes);
    int64_t total = 0;
    for (int i = 0; i < r->n_media; i++) {
        const ks_api_media *m = &r->media[i];
        FUZZ_CHECK(m->data && m->n > 0 && (int64_t)m->n <= g_media.max_bytes);
        FUZZ_CHECK(ks_media_in_sniff(m->data, m->n) == m->format && ks_media_in_format_kind(m->format) == m->kind);
        if (m->kind == KS_MEDIA_IN_IMAGE) FUZZ_CHECK(m->width > 0 && m->height > 0 && m->width * m->height <= g_media.max_pixels);
        total += (int64_t)m->n;
    }
    FUZZ_CHECK(total == r->media_bytes);
}

/* Property 3. */
static void check_request(const ks_api_request *r) {
    check_media(r);
    FUZZ_CHECK(r->n_stops >= 0 && r->n_stops <= KS_API_MAX_STOPS);
    /* samplers: codes the sampler takes (engine.h), never more than it holds */
    FUZZ_CHECK(r->n_sampler_order >= 0 && r->n_sampler_order <= KS_SAMPLER_ORDER_MAX);
    FUZZ_CHECK(r->samplers_given || r->n_sampler_order == 0);
    for (int k = 0; k < r->n_sampler_order; k++)
        FUZZ_CHECK(r->sampler_order[k] >= KS_SAMPLER_TOP_K && r->sampler_order[k] <= KS_SAMPLER_PENALTIES);
    FUZZ_CHECK(r->n_indent >= 0 && r->t_max_predict_ms >= 0);
    for (int i = 0; i < r->n_stops; i++) {
        FUZZ_CHECK(text_ok(r->stops[i]) && r->stops[i][0] != '\0');
        FUZZ_CHECK(strlen(r->stops[i]) <= KS_API_MAX_STOP_LEN);
    }
    FUZZ_CHECK(r->n >= 1 && r->n <= KS_API_MAX_N);
    FUZZ_CHECK(r->top_logprobs >= 0 && r->top_logprobs <= KS_API_MAX_TOP_LOGPROBS);
    FUZZ_CHECK(r->n_bias >= 0 && (r->n_bias == 0 || r->bias));
    for (int i = 0; i < r->n_bias; i++) FUZZ_CHECK(!r->bias[i].text || text_ok(r->bias[i].text));
    if (r->kind == KS_API_CHAT) {
        FUZZ_CHECK(r->tmpl_req != NULL);
        const json_t *msgs = json_object_get(r->tmpl_req, "messages");
        FUZZ_CHECK(json_is_array(msgs) && json_array_size(msgs) >= 1);
        FUZZ_CHECK(r->n_bps >= 0 && r->n_bps <= KS_API_MAX_BREAKPOINTS);
        for (int i = 0; i < r->n_bps; i++)
            FUZZ_CHECK(r->bps[i].msg >= -1 && r->bps[i].msg < (int)json_array_size(msgs) && r->bps[i].ttl_s > 0);
        size_t i;
        const json_t *m;
        json_array_foreach(msgs, i, m) {
            FUZZ_CHECK(json_is_string(json_object_get(m, "role")));
            char *c = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
            FUZZ_CHECK(c != NULL);
            free(c);
        }
        for (int k = 0; k < r->n_msgs; k++) FUZZ_CHECK(text_ok(r->msgs[k].role) && text_ok(r->msgs[k].content));
        check_render(r->tmpl_req);
    } else {
        FUZZ_CHECK(r->n_prompts >= 1 && r->prompts);
        FUZZ_CHECK((long)r->n_prompts * r->n <= KS_API_MAX_CHOICES);
        FUZZ_CHECK(!(r->prompt && r->prompt_tokens));
        for (int k = 0; k < r->n_prompts; k++) {
            const ks_api_prompt *p = &r->prompts[k];
            if (p->text) FUZZ_CHECK(text_ok(p->text));
            else FUZZ_CHECK(p->n_tokens >= 0 && (p->n_tokens == 0 || p->tokens));
        }
        if (r->infill) {
            /* /infill: one prompt, made of strings the plan tokenizes */
            FUZZ_CHECK(r->n_prompts == 1 && !r->prompts[0].text && !r->prompts[0].tokens);
            FUZZ_CHECK(text_ok(r->infill_prefix) && text_ok(r->infill_suffix) && text_ok(r->infill_prompt));
            FUZZ_CHECK(r->n_infill_extra >= 0 && r->n_infill_extra <= KS_API_MAX_INFILL_EXTRA);
            for (int k = 0; k < r->n_infill_extra; k++)
                FUZZ_CHECK(text_ok(r->infill_extra[k].filename) && text_ok(r->infill_extra[k].text));
        }
    }
}

/* Property 5. */
static void check_prescan(ks_prescan_shape sh, const uint8_t *data, size_t size, const ks_api_request *r) {
    static const ks_presize all = {{true, true, true, true}, true, true, true, true};
    ks_prescan_counts whole, part;
    ks_prescan_count(&all, sh, (const char *)data, size, false, &whole);
    /* A named tool_choice (an object but Messages' auto/any/none) keeps one tool. */
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    const json_t *tc = json_object_get(root, "tool_choice");
    const char *ty = json_string_value(json_object_get(tc, "type"));
    bool named = json_is_object(tc) && !(sh == KS_PRESCAN_MESSAGES && ty &&
                                         (!strcmp(ty, "auto") || !strcmp(ty, "any") || !strcmp(ty, "none")));
    json_decref(root);
    if (!named) FUZZ_CHECK(whole.bytes <= ks_presize_bytes(&all, r->tmpl_req));
    for (size_t n = 0; n <= size; n += size / 7 + 1) {
        ks_prescan_count(&all, sh, (const char *)data, n, true, &part);
        FUZZ_CHECK(part.bytes <= whole.bytes && part.items <= whole.items);
    }
}

static void parse_body(ks_api_kind kind, const uint8_t *data, size_t size) {
    ks_api_request r;
    ks_api_error e;
    memset(&e, 0, sizeof e);
    int rc = ks_api_parse(kind, (const char *)data, size, &r, &e);
    if (rc == 0) {
        check_request(&r);
        if (kind == KS_API_CHAT) check_prescan(KS_PRESCAN_CHAT, data, size, &r);
        ks_api_request_free(&r);
    } else {
        check_refusal(rc, &e);
    }
}

/* A translated request goes through the chat parser, as gen.c does. */
static void parse_chat(json_t *chat, ks_prescan_shape sh, const uint8_t *data, size_t size) {
    ks_api_request r;
    ks_api_error e;
    memset(&e, 0, sizeof e);
    int rc = ks_api_parse_root_media(KS_API_CHAT, json_incref(chat), &g_media, &r, &e);
    if (rc == 0) {
        check_request(&r);
        check_prescan(sh, data, size, &r);
        ks_api_request_free(&r);
    } else {
        check_refusal(rc, &e);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tmpl) LLVMFuzzerInitialize(NULL, NULL);
    parse_body(KS_API_CHAT, data, size);
    parse_body(KS_API_COMPLETION, data, size);

    json_t *root = NULL;
    ks_api_error e;
    memset(&e, 0, sizeof e);
    int rc = ks__api_load_object((const char *)data, size, &root, &e);
    if (rc) {
        check_refusal(rc, &e);
        return 0;
    }
    parse_chat(root, KS_PRESCAN_CHAT, data, size); /* /v1/chat/completions with a projector */
    { /* /infill */
        ks_api_request r;
        memset(&e, 0, sizeof e);
        rc = ks_api_parse_infill(json_incref(root), &r, &e);
        if (rc == 0) {
            FUZZ_CHECK(r.infill);
            check_request(&r);
            ks_api_request_free(&r);
        } else {
            check_refusal(rc, &e);
        }
    }
    /* /v1/responses, without a stored conversation (previous_response_id is
     * resolved by the server; an unknown one is a 400 before this). */
    const char *prev = NULL;
    rc = ks_api_responses_prev_id(root, &prev, &e);
    if (rc == 0) {
        ks_api_resp_req rr = {0};
        rc = ks_api_responses_to_chat(root, NULL, &rr, &e);
        if (rc == 0) parse_chat(rr.chat, KS_PRESCAN_RESPONSES, data, size);
        else check_refusal(rc, &e);
        ks_api_resp_req_free(&rr);
    } else {
        check_refusal(rc, &e);
    }
    /* /v1/messages and /v1/messages/count_tokens. */
    for (int count = 0; count < 2; count++) {
        ks_api_msg_req mr = {0};
        memset(&e, 0, sizeof e);
        rc = ks_api_messages_to_chat(root, count, &mr, &e);
        if (rc == 0) parse_chat(mr.chat, KS_PRESCAN_MESSAGES, data, size);
        else check_refusal(rc, &e);
        ks_api_msg_req_free(&mr);
    }
    json_decref(root);
    return 0;
}

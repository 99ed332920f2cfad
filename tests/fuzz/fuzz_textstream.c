/*
 * fuzz_textstream.c — the generated-text stream (src/base/textstream.c) and
 * the live reply it feeds, as gen.c drives them: token pieces in, text
 * deltas through the reply module (src/server/reply.c, output.c) and the
 * chat format's table (fmt_openai.c: ks_api_chunk_delta_json + ks_api_sse)
 * out as "data:" events.
 *
 * Input: byte 0 gives the number of stop strings (0..7, its low 3 bits) and
 * n_indent (0..5: its higher bits mod 6, 0 off); each stop is a
 * length byte (0..15) and that many bytes (cut at a NUL, as the C strings
 * the server passes; an empty one, or one that is not valid UTF-8, is
 * ignored by the stream); the rest are
 * pieces, each a length byte (0..31) and that many bytes. Running out of
 * bytes ends the list early.
 *
 * Properties checked, against R = the pieces' bytes through a stream with no
 * stops, fed as one piece (the UTF-8 repair alone):
 *  1. every emitted delta and the whole text are valid UTF-8, and the text
 *     is the concatenation of the deltas;
 *  2. the repair does not depend on where pieces are cut: without stops the
 *     text is R;
 *  3. with stops: the text is a prefix of R, never contains a stop string,
 *     and when the stream stopped, R continues with the stop string it
 *     reported; when it did not, the text is R;
 *  4. each delta frames as exactly one SSE event ("data: " JSON "\n\n", no
 *     other newline), whose JSON parses back to the same delta text;
 *  5. the stream ends with the choice's finish chunk and [DONE];
 *  6. n_indent: no line of the text after the first starts with fewer
 *     blanks; a stream the rule stopped stopped at R's first such line,
 *     just before its first other character; one a stop string stopped
 *     has no such line in R before the stop.
 */
#include <string.h>

#include <jansson.h>

#include "base/textstream.h"
#include "fuzz.h"
#include "server/api.h"
#include "server/fmt.h"
#include "server/reply.h"

#define MAX_STOPS 7

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader;

static bool take(reader *r, size_t want, const uint8_t **out, size_t *n) {
    if (r->left == 0) return false;
    *n = want < r->left ? want : r->left;
    *out = r->p;
    r->p += *n;
    r->left -= *n;
    return true;
}

static bool utf8_valid(const char *s, size_t n) {
    json_t *j = json_stringn(s, n); /* jansson checks RFC 3629 strictly */
    bool ok = j != NULL;
    json_decref(j);
    return ok;
}

/* A streamed chat reply of one choice of plain text, as the server makes one. */
static ks_reply *live_reply(void) {
    static const char body[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": true}";
    ks_fmt_env env = {0};
    ks_api_request rq;
    ks_api_error e;
    void *st = NULL;
    FUZZ_CHECK_EQ(ks__fmt_chat.parse(&env, json_loads(body, 0, NULL), &rq, &st, &e), 0);
    ks_api_request_free(&rq);
    ks_fmt_gen g = {.id = "chatcmpl-fuzz", .created = 1, .model = "m", .n_choices = 1};
    ks_reply *rp = ks__reply_create(&ks__fmt_chat, st, &g, NULL, false);
    FUZZ_CHECK(rp != NULL);
    ks_buf ev = {0};
    FUZZ_CHECK_EQ(ks__reply_start(rp, &ev), 0); /* the role chunk */
    FUZZ_CHECK(ev.len > 8 && memcmp(ev.s, "data: ", 6) == 0);
    ks_buf_free(&ev);
    return rp;
}

/* Property 4: one chunk per delta, framed and parsed back. */
static void check_sse(ks_reply *rp, const char *text, size_t len) {
    ks_buf ev = {0};
    FUZZ_CHECK_EQ(ks__reply_choice(rp, 0, text, len, NULL, NULL, &ev), 0);
    FUZZ_CHECK(ev.len > 8 && memcmp(ev.s, "data: ", 6) == 0);
    FUZZ_CHECK(memcmp(ev.s + ev.len - 2, "\n\n", 2) == 0);
    FUZZ_CHECK(memchr(ev.s, '\n', ev.len - 2) == NULL);
    FUZZ_CHECK(memchr(ev.s, '\r', ev.len) == NULL);
    json_error_t jerr;
    json_t *back = json_loadb(ev.s + 6, ev.len - 8, JSON_ALLOW_NUL, &jerr);
    FUZZ_CHECK(back != NULL);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(back, "choices"), 0), "delta"),
                                      "content");
    FUZZ_CHECK(json_is_string(content));
    FUZZ_CHECK(json_string_length(content) == len && memcmp(json_string_value(content), text, len) == 0);
    json_decref(back);
    ks_buf_free(&ev);
}

/* The offset of s's first character that the n_indent rule cuts before
 * (textstream.h), len when none. */
static size_t first_cut(const char *s, size_t len, int n_indent) {
    bool line_start = false;
    int blanks = 0;
    for (size_t i = 0; n_indent > 0 && i < len; i++) {
        if (s[i] == '\n') {
            line_start = true;
            blanks = 0;
        } else if (line_start && (s[i] == ' ' || s[i] == '\t')) {
            blanks++;
        } else if (line_start) {
            if (blanks < n_indent) return i;
            line_start = false;
        }
    }
    return len;
}

/* Property 5: the finish chunk, then [DONE]. */
static void check_end(ks_reply *rp, bool stopped, int stop_index) {
    ks_req_result r = {.finish = KS_FINISH_STOP};
    ks_reply_end end = {.r = &r, .stopped = stopped, .stop_index = stop_index};
    ks_buf ev = {0};
    FUZZ_CHECK_EQ(ks__reply_choice(rp, 0, NULL, 0, NULL, &end, &ev), 0);
    FUZZ_CHECK(ks__reply_finished(rp, 0));
    FUZZ_CHECK_EQ(ks__reply_done(rp, &r, &ev), 0);
    static const char done[] = "data: [DONE]\n\n";
    FUZZ_CHECK(ev.len > sizeof done && memcmp(ev.s + ev.len - (sizeof done - 1), done, sizeof done - 1) == 0);
    /* n_indent's cut is a limit, as llama-server counts it */
    FUZZ_CHECK(strstr(ev.s, stopped && stop_index == KS_TEXTSTREAM_STOP_INDENT ? "\"finish_reason\":\"length\""
                                                                                : "\"finish_reason\":\"stop\"") != NULL);
    ks_buf_free(&ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    const uint8_t *b;
    size_t n;
    if (!take(&r, 1, &b, &n)) return 0;
    int n_stops = b[0] % (MAX_STOPS + 1);
    int n_indent = (b[0] >> 3) % 6;
    char stop_buf[MAX_STOPS][16];
    const char *stops[MAX_STOPS];
    for (int i = 0; i < n_stops; i++) {
        size_t len = 0;
        if (take(&r, 1, &b, &n)) take(&r, b[0] % 16, &b, &len);
        memcpy(stop_buf[i], b, len < 15 ? len : 15);
        stop_buf[i][len < 15 ? len : 15] = '\0';
        stops[i] = stop_buf[i];
    }

    ks_reply *rp = live_reply();
    ks_textstream *ts = ks_textstream_create(stops, n_stops);
    ks_textstream *plain = ks_textstream_create(NULL, 0);
    FUZZ_CHECK(ts && plain);
    ks_textstream_set_indent(ts, n_indent);
    ks_buf text = {0}, all = {0}, ref = {0};
    bool stopped = false;
    while (take(&r, 1, &b, &n)) {
        size_t len = 0;
        const uint8_t *piece = b;
        if (!take(&r, b[0] % 32, &piece, &len)) len = 0;
        FUZZ_CHECK_EQ(ks_buf_append(&all, (const char *)piece, len), 0);
        if (stopped) continue;
        ks_buf delta = {0};
        int rc = ks_textstream_feed(ts, (const char *)piece, len, &delta);
        FUZZ_CHECK(rc == 0 || rc == 1);
        stopped = rc == 1;
        FUZZ_CHECK(stopped == ks_textstream_stopped(ts));
        if (delta.len) {
            FUZZ_CHECK(utf8_valid(delta.s, delta.len));
            check_sse(rp, delta.s, delta.len);
            FUZZ_CHECK_EQ(ks_buf_append(&text, delta.s, delta.len), 0);
        }
        ks_buf_free(&delta);
    }
    ks_buf tail = {0};
    FUZZ_CHECK_EQ(ks_textstream_flush(ts, &tail), 0);
    if (tail.len) {
        FUZZ_CHECK(utf8_valid(tail.s, tail.len));
        check_sse(rp, tail.s, tail.len);
        FUZZ_CHECK_EQ(ks_buf_append(&text, tail.s, tail.len), 0);
    }
    ks_buf_free(&tail);
    stopped = ks_textstream_stopped(ts);
    check_end(rp, stopped, ks_textstream_stop_index(ts));
    ks__reply_free(rp);

    /* Property 1: the stream's own record is the deltas, in order. */
    size_t tl = 0;
    const char *t = ks_textstream_text(ts, &tl);
    FUZZ_CHECK(tl == text.len && (tl == 0 || memcmp(t, text.s, tl) == 0));
    FUZZ_CHECK(utf8_valid(t, tl));

    /* R: the whole input in one piece, repaired only. */
    FUZZ_CHECK(ks_textstream_feed(plain, all.s ? all.s : "", all.len, &ref) == 0);
    FUZZ_CHECK_EQ(ks_textstream_flush(plain, &ref), 0);
    const char *R = ref.s ? ref.s : "";

    /* The stops the stream uses: non-empty, valid UTF-8 (textstream.h). */
    bool active[MAX_STOPS];
    for (int i = 0; i < n_stops; i++) active[i] = stops[i][0] && utf8_valid(stops[i], strlen(stops[i]));
    FUZZ_CHECK(tl <= ref.len && memcmp(t, R, tl) == 0); /* property 3: a prefix of R */
    for (int i = 0; i < n_stops; i++)
        if (active[i]) FUZZ_CHECK(memmem(t, tl, stops[i], strlen(stops[i])) == NULL);
    int si = ks_textstream_stop_index(ts);
    FUZZ_CHECK_EQ(first_cut(t, tl, n_indent), tl); /* property 6 */
    if (stopped && si == KS_TEXTSTREAM_STOP_INDENT) {
        FUZZ_CHECK(n_indent > 0);
        FUZZ_CHECK_EQ(first_cut(R, ref.len, n_indent), tl);
    } else if (stopped) {
        FUZZ_CHECK(si >= 0 && si < n_stops && active[si]);
        size_t sl = strlen(stops[si]);
        FUZZ_CHECK(tl + sl <= ref.len && memcmp(R + tl, stops[si], sl) == 0);
        FUZZ_CHECK(first_cut(R, ref.len, n_indent) >= tl);
    } else {
        FUZZ_CHECK_EQ(si, -1);
        FUZZ_CHECK_EQ(tl, ref.len); /* properties 2 and 3: everything, repaired */
        FUZZ_CHECK_EQ(first_cut(R, ref.len, n_indent), ref.len);
    }

    ks_buf_free(&text);
    ks_buf_free(&all);
    ks_buf_free(&ref);
    ks_textstream_free(ts);
    ks_textstream_free(plain);
    return 0;
}

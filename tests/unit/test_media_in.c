/* test_media_in.c — media input without a model: base64, data URLs, magic
 * bytes, image sizes from headers (media_in.c), and image / audio parts
 * through every API's parser against the limits (api_media.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "server/api.h"
#include "server/media_in.h"

/* ------------------------------------------------------------ sample files */
/* Headers only: nothing here decodes pixels, so a header is an image. */
static size_t png(uint8_t *b, uint32_t w, uint32_t h) {
    static const uint8_t sig[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
    memcpy(b, sig, sizeof sig);
    uint8_t *p = b + 16;
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(w >> (24 - 8 * i)), p[4 + i] = (uint8_t)(h >> (24 - 8 * i));
    memset(b + 24, 0, 9); /* depth, colour type, ..., CRC */
    b[24] = 8;
    b[25] = 2;
    return 33;
}

static size_t jpeg(uint8_t *b, unsigned w, unsigned h) {
    static const uint8_t head[] = {0xFF, 0xD8, 0xFF, 0xE0, 0, 16, 'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0,
                                   /* a DHT segment, to be skipped */ 0xFF, 0xC4, 0, 4, 0, 0,
                                   /* fill bytes, then SOF0 */ 0xFF, 0xFF, 0xC0, 0, 17, 8};
    memcpy(b, head, sizeof head);
    size_t n = sizeof head;
    b[n++] = (uint8_t)(h >> 8);
    b[n++] = (uint8_t)h;
    b[n++] = (uint8_t)(w >> 8);
    b[n++] = (uint8_t)w;
    memset(b + n, 0, 10);
    return n + 10;
}

static size_t gif(uint8_t *b, unsigned w, unsigned h) {
    memcpy(b, "GIF89a", 6);
    b[6] = (uint8_t)w, b[7] = (uint8_t)(w >> 8), b[8] = (uint8_t)h, b[9] = (uint8_t)(h >> 8);
    memset(b + 10, 0, 6);
    return 16;
}

static size_t bmp(uint8_t *b, int32_t w, int32_t h) {
    memset(b, 0, 54);
    b[0] = 'B', b[1] = 'M', b[14] = 40;
    for (int i = 0; i < 4; i++) b[18 + i] = (uint8_t)((uint32_t)w >> (8 * i)), b[22 + i] = (uint8_t)((uint32_t)h >> (8 * i));
    return 54;
}

static size_t wav(uint8_t *b) {
    memcpy(b, "RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data\0\0\0\0", 44);
    return 44;
}

static char *b64(const uint8_t *d, size_t n) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *s = malloc(n / 3 * 4 + 8), *o = s;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        *o++ = a[v >> 18], *o++ = a[(v >> 12) & 63], *o++ = a[(v >> 6) & 63], *o++ = a[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0);
        *o++ = a[v >> 18], *o++ = a[(v >> 12) & 63];
        *o++ = i + 1 < n ? a[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = 0;
    return s;
}

/* ------------------------------------------------------------ media_in.c */
static void test_b64(void **state) {
    (void)state;
    uint8_t out[64];
    size_t n, bad;
    assert_int_equal(ks_media_in_b64_decode("aGVsbG8=", 8, out, &n, NULL), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(out, "hello", 5);
    assert_int_equal(ks_media_in_b64_decode("aGVsbG8", 7, out, &n, NULL), 0); /* padding optional */
    assert_int_equal(n, 5);
    assert_int_equal(ks_media_in_b64_decode("aGVs\r\nbG8=", 10, out, &n, NULL), 0); /* MIME line breaks */
    assert_int_equal(n, 5);
    assert_int_equal(ks_media_in_b64_decode("aGV*bG8=", 8, out, &n, &bad), KS_EINVAL);
    assert_int_equal(bad, 3);
    assert_int_equal(ks_media_in_b64_decode("aG=sbG8=", 8, out, &n, &bad), KS_EINVAL); /* data after padding */
    assert_int_equal(bad, 3);
    assert_int_equal(ks_media_in_b64_decode("aGVsb", 5, out, &n, NULL), KS_EINVAL); /* a lone last character */
    assert_int_equal(ks_media_in_b64_decode("", 0, out, &n, NULL), 0);
    assert_int_equal(n, 0);
    assert_true(ks_media_in_b64_max(8) >= 5);
}

static void test_data_url(void **state) {
    (void)state;
    const char *mime, *data;
    size_t ml, dl;
    const char *u = "data:image/png;base64,AAAA";
    assert_int_equal(ks_media_in_data_url(u, strlen(u), &mime, &ml, &data, &dl), 0);
    assert_int_equal(ml, 9);
    assert_memory_equal(mime, "image/png", 9);
    assert_string_equal(data, "AAAA");
    u = "data:image/jpeg;name=x.jpg;base64,QQ==";
    assert_int_equal(ks_media_in_data_url(u, strlen(u), &mime, &ml, &data, &dl), 0);
    assert_int_equal(ml, 10);
    u = "data:;base64,QQ==";
    assert_int_equal(ks_media_in_data_url(u, strlen(u), &mime, &ml, &data, &dl), 0);
    assert_int_equal(ml, 0);
    u = "data:image/png,rawbytes";
    assert_int_equal(ks_media_in_data_url(u, strlen(u), &mime, &ml, &data, &dl), KS_ENOENT);
    u = "https://example.com/cat.png";
    assert_int_equal(ks_media_in_data_url(u, strlen(u), &mime, &ml, &data, &dl), KS_EINVAL);
}

static void test_sniff_and_size(void **state) {
    (void)state;
    uint8_t b[128];
    int64_t w, h;
    size_t n = png(b, 640, 480);
    assert_int_equal(ks_media_in_sniff(b, n), KS_MEDIA_IN_PNG);
    assert_int_equal(ks_media_in_image_size(b, n, KS_MEDIA_IN_PNG, &w, &h), 0);
    assert_int_equal(w, 640);
    assert_int_equal(h, 480);
    assert_int_equal(ks_media_in_image_size(b, 20, KS_MEDIA_IN_PNG, &w, &h), KS_ECORRUPT); /* cut short */
    n = png(b, 0, 480);
    assert_int_equal(ks_media_in_image_size(b, n, KS_MEDIA_IN_PNG, &w, &h), KS_ECORRUPT); /* a side of 0 */

    n = jpeg(b, 1920, 1080);
    assert_int_equal(ks_media_in_sniff(b, n), KS_MEDIA_IN_JPEG);
    assert_int_equal(ks_media_in_image_size(b, n, KS_MEDIA_IN_JPEG, &w, &h), 0);
    assert_int_equal(w, 1920);
    assert_int_equal(h, 1080);
    assert_int_equal(ks_media_in_image_size(b, 24, KS_MEDIA_IN_JPEG, &w, &h), KS_ECORRUPT);
    uint8_t sos[] = {0xFF, 0xD8, 0xFF, 0xDA, 0, 2}; /* scan data before any frame header */
    assert_int_equal(ks_media_in_image_size(sos, sizeof sos, KS_MEDIA_IN_JPEG, &w, &h), KS_ECORRUPT);

    n = gif(b, 300, 200);
    assert_int_equal(ks_media_in_sniff(b, n), KS_MEDIA_IN_GIF);
    assert_int_equal(ks_media_in_image_size(b, n, KS_MEDIA_IN_GIF, &w, &h), 0);
    assert_int_equal(w * 1000 + h, 300200);

    n = bmp(b, 64, -32); /* top-down */
    assert_int_equal(ks_media_in_sniff(b, n), KS_MEDIA_IN_BMP);
    assert_int_equal(ks_media_in_image_size(b, n, KS_MEDIA_IN_BMP, &w, &h), 0);
    assert_int_equal(w * 1000 + h, 64032);

    n = wav(b);
    assert_int_equal(ks_media_in_sniff(b, n), KS_MEDIA_IN_WAV);
    assert_int_equal(ks_media_in_format_kind(KS_MEDIA_IN_WAV), KS_MEDIA_IN_AUDIO);
    assert_int_equal(ks_media_in_image_size(b, n, KS_MEDIA_IN_WAV, &w, &h), KS_EINVAL);
    assert_int_equal(ks_media_in_sniff((const uint8_t *)"fLaC\0\0\0\x22\0\0\0\0", 12), KS_MEDIA_IN_FLAC);
    assert_int_equal(ks_media_in_sniff((const uint8_t *)"ID3\x04\0\0\0\0\0\0\0\0", 12), KS_MEDIA_IN_MP3);
    assert_int_equal(ks_media_in_sniff((const uint8_t *)"RIFF\0\0\0\0WEBPVP8 ", 16), KS_MEDIA_IN_WEBP);
    assert_int_equal(ks_media_in_sniff((const uint8_t *)"hello, world", 12), KS_MEDIA_IN_UNKNOWN);

    bool any;
    assert_int_equal(ks_media_in_mime_format("image/JPG", 9, &any), KS_MEDIA_IN_JPEG);
    assert_int_equal(ks_media_in_mime_format("image/png; charset=x", 20, &any), KS_MEDIA_IN_PNG);
    assert_int_equal(ks_media_in_mime_format("application/octet-stream", 24, &any), KS_MEDIA_IN_UNKNOWN);
    assert_true(any);
    assert_int_equal(ks_media_in_mime_format("image/tiff", 10, &any), KS_MEDIA_IN_UNKNOWN);
    assert_false(any);
    assert_int_equal(ks_media_in_audio_format("MP3"), KS_MEDIA_IN_MP3);
    assert_int_equal(ks_media_in_audio_format("ogg"), KS_MEDIA_IN_UNKNOWN);
}

/* ------------------------------------------------------------ the parsers */
static ks_media_limits limits(void) {
    ks_media_limits l = ks_media_in_limits_default();
    l.modalities = KS_MEDIA_IN_IMAGE | KS_MEDIA_IN_AUDIO;
    return l;
}

/* A chat request of one user message: text, an image_url part with url, then text. */
static char *chat_with(const char *url) {
    const char *f = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"look\"},"
                    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}},{\"type\":\"text\",\"text\":\"ok?\"}]}]}";
    char *s = malloc(strlen(f) + strlen(url) + 1);
    sprintf(s, f, url);
    return s;
}

static char *png_url(const char *mime, uint32_t w, uint32_t h) {
    uint8_t b[64];
    char *d = b64(b, png(b, w, h));
    char *u = malloc(strlen(d) + 64);
    sprintf(u, "data:%s;base64,%s", mime, d);
    free(d);
    return u;
}

/* Parses body as kind chat with lim; returns rc, the request in *r (freed by the caller). */
static int parse(const char *body, const ks_media_limits *lim, ks_api_request *r, ks_api_error *e) {
    json_t *root = json_loads(body, 0, NULL);
    assert_non_null(root);
    return ks_api_parse_root_media(KS_API_CHAT, root, lim, r, e);
}

/* body is refused with code at param. */
static void refused(const char *body, const ks_media_limits *lim, const char *code, const char *param) {
    ks_api_request r;
    ks_api_error e;
    int rc = parse(body, lim, &r, &e);
    if (rc != KS_EINVAL) fail_msg("accepted (%d): %.200s", rc, body);
    assert_int_equal(e.status, 400);
    if (strcmp(e.code, code) || strcmp(e.param, param))
        fail_msg("got %s at %s (%s), want %s at %s", e.code, e.param, e.message, code, param);
}

static void test_chat_image(void **state) {
    (void)state;
    ks_media_limits lim = limits();
    char *u = png_url("image/png", 64, 48);
    char *body = chat_with(u);
    ks_api_request r;
    ks_api_error e;
    assert_int_equal(parse(body, &lim, &r, &e), 0);
    assert_int_equal(r.n_media, 1);
    assert_int_equal(r.media[0].kind, KS_MEDIA_IN_IMAGE);
    assert_int_equal(r.media[0].format, KS_MEDIA_IN_PNG);
    assert_int_equal(r.media[0].width * 100 + r.media[0].height, 6448);
    assert_int_equal(r.media[0].n, 33);
    /* The marker stands where the part was, with no "\n" next to it (llama-server's rule). */
    assert_string_equal(r.msgs[0].content, "look" KS_MEDIA_IN_MARKER "ok?");
    json_t *m = json_array_get(json_object_get(r.tmpl_req, "messages"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "content")), "look" KS_MEDIA_IN_MARKER "ok?");
    /* The item's identity rides on the message for the hints. */
    json_t *ids = json_object_get(m, "ks_media");
    assert_int_equal(json_array_size(ids), 1);
    assert_int_equal(json_string_length(json_array_get(ids, 0)), 64);
    char first[65];
    snprintf(first, sizeof first, "%s", json_string_value(json_array_get(ids, 0)));
    ks_api_request_free(&r);
    free(body);
    free(u);

    /* A different image: a different identity, the same text. */
    u = png_url("image/png", 64, 49);
    body = chat_with(u);
    ks_api_request r2;
    assert_int_equal(parse(body, &lim, &r2, &e), 0);
    assert_string_equal(r2.msgs[0].content, "look" KS_MEDIA_IN_MARKER "ok?");
    /* The message JSON the IMC hashes and the render memo key on differs. */
    json_t *m2 = json_array_get(json_object_get(r2.tmpl_req, "messages"), 0);
    assert_string_not_equal(json_string_value(json_array_get(json_object_get(m2, "ks_media"), 0)), first);
    ks_api_request_free(&r2);
    free(body);
    free(u);
}

static void test_chat_image_errors(void **state) {
    (void)state;
    ks_media_limits lim = limits();
    const char *P = "messages[0].content[1].image_url.url";
    char *u = png_url("image/png", 64, 48), *body = chat_with(u);
    /* No projector: the model takes no images. */
    ks_media_limits none = ks_media_in_limits_default();
    refused(body, &none, "invalid_value", "messages[0].content[1]");
    refused(body, NULL, "invalid_value", "messages[0].content[1]");
    /* Too many pixels. */
    ks_media_limits small = lim;
    small.max_pixels = 64 * 48 - 1;
    refused(body, &small, "image_too_large", P);
    small = lim;
    small.max_bytes = 32;
    refused(body, &small, "media_too_large", P);
    small = lim;
    small.max_total_bytes = 32;
    refused(body, &small, "media_too_large", P);
    free(body);
    free(u);

    /* Declared JPEG, the bytes are PNG. */
    u = png_url("image/jpeg", 8, 8);
    body = chat_with(u);
    refused(body, &lim, "media_type_mismatch", P);
    free(body);
    free(u);
    u = png_url("image/tiff", 8, 8);
    body = chat_with(u);
    refused(body, &lim, "invalid_image_format", P);
    free(body);
    free(u);
    u = png_url("audio/wav", 8, 8);
    body = chat_with(u);
    refused(body, &lim, "media_type_mismatch", P);
    free(body);
    free(u);

    body = chat_with("https://example.com/cat.png");
    refused(body, &lim, "invalid_image_url", P);
    free(body);
    body = chat_with("data:image/png,raw");
    refused(body, &lim, "invalid_image_url", P);
    free(body);
    body = chat_with("data:image/png;base64,iVBO!!!!");
    refused(body, &lim, "invalid_base64", P);
    free(body);
    body = chat_with("data:image/png;base64,aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ=");
    refused(body, &lim, "invalid_image_format", P); /* text, not an image */
    free(body);
    /* WebP: recognised, refused by name. */
    char *w = b64((const uint8_t *)"RIFF\x20\0\0\0WEBPVP8 \x14\0\0\0\0\0\0\x9d\x01\x2a\x10\0\x10\0", 30);
    char url[128];
    snprintf(url, sizeof url, "data:image/webp;base64,%s", w);
    body = chat_with(url);
    refused(body, &lim, "invalid_image_format", P);
    free(body);
    free(w);
    /* A corrupt header (PNG signature, no IHDR). */
    w = b64((const uint8_t *)"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDX\0\0\0\x01\0\0\0\x01", 24);
    snprintf(url, sizeof url, "data:image/png;base64,%s", w);
    body = chat_with(url);
    refused(body, &lim, "invalid_image_format", P);
    free(body);
    free(w);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:;base64,AA\","
            "\"detail\":\"huge\"}}]}]}", &lim, "invalid_value", "messages[0].content[0].image_url.detail");
    refused("{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
            &lim, "invalid_value", "messages[0].content[0]");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video_url\"}]}]}", &lim, "invalid_value",
            "messages[0].content[0].type");
}

static void test_chat_item_count_and_audio(void **state) {
    (void)state;
    ks_media_limits lim = limits();
    lim.max_items = 2;
    char *u = png_url("image/png", 4, 4);
    ks_buf b = {0};
    ks_buf_printf(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[");
    for (int i = 0; i < 3; i++)
        ks_buf_printf(&b, "%s{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}}", i ? "," : "", u);
    ks_buf_printf(&b, "]}]}");
    refused(b.s, &lim, "too_many_media_items", "messages[0].content[2].image_url.url");
    ks_buf_free(&b);
    free(u);

    uint8_t a[64];
    char *d = b64(a, wav(a));
    ks_buf_printf(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":"
                      "{\"data\":\"%s\",\"format\":\"wav\"}}]}]}", d);
    ks_api_request r;
    ks_api_error e;
    assert_int_equal(parse(b.s, &lim, &r, &e), 0);
    assert_int_equal(r.n_media, 1);
    assert_int_equal(r.media[0].kind, KS_MEDIA_IN_AUDIO);
    ks_api_request_free(&r);
    ks_media_limits img = lim;
    img.modalities = KS_MEDIA_IN_IMAGE;
    refused(b.s, &img, "invalid_value", "messages[0].content[0]"); /* a vision-only projector */
    ks_buf_reset(&b);
    ks_buf_printf(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":"
                      "{\"data\":\"%s\",\"format\":\"mp3\"}}]}]}", d);
    refused(b.s, &lim, "media_type_mismatch", "messages[0].content[0].input_audio.data");
    ks_buf_free(&b);
    free(d);
}

/* The Messages and Responses translations: their paths in the errors. */
static void test_translations(void **state) {
    (void)state;
    ks_media_limits lim = limits();
    uint8_t b[64];
    char *d = b64(b, png(b, 16, 16));
    ks_buf body = {0};
    ks_buf_printf(&body, "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                         "\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/jpeg\",\"data\":\"%s\"}},"
                         "{\"type\":\"text\",\"text\":\"what is it?\"}]}]}", d);
    json_t *root = json_loads(body.s, 0, NULL);
    ks_api_msg_req mr = {0};
    ks_api_error e;
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &e), 0);
    ks_api_request r;
    /* image/jpeg declared, PNG sent: Anthropic's path in the error. */
    assert_int_equal(ks_api_parse_root_media(KS_API_CHAT, json_incref(mr.chat), &lim, &r, &e), KS_EINVAL);
    assert_string_equal(e.code, "media_type_mismatch");
    assert_string_equal(e.param, "messages.0.content.0.source");
    ks_api_msg_req_free(&mr);
    json_decref(root);
    ks_buf_reset(&body);

    ks_buf_printf(&body, "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                         "\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":"
                         "\"base64\",\"media_type\":\"image/png\",\"data\":\"%s\"}}]}]}]}", d);
    root = json_loads(body.s, 0, NULL);
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &e), 0);
    assert_int_equal(ks_api_parse_root_media(KS_API_CHAT, json_incref(mr.chat), &lim, &r, &e), 0);
    assert_int_equal(r.n_media, 1); /* a screenshot in a tool result */
    assert_string_equal(r.msgs[0].role, "tool");
    assert_string_equal(r.msgs[0].content, KS_MEDIA_IN_MARKER);
    ks_api_request_free(&r);
    ks_api_msg_req_free(&mr);
    json_decref(root);
    ks_buf_reset(&body);

    root = json_loads("{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                      "\"image\",\"source\":{\"type\":\"url\",\"url\":\"https://x/y.png\"}}]}]}", 0, NULL);
    /* A url source becomes an image URL, which this server (no fetch settings) refuses, by
     * Anthropic's path, before any connection. */
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &e), 0);
    assert_int_equal(ks_api_parse_root_media(KS_API_CHAT, json_incref(mr.chat), &lim, &r, &e), KS_EINVAL);
    assert_string_equal(e.code, "invalid_image_url");
    assert_string_equal(e.param, "messages.0.content.0.source");
    assert_non_null(strstr(e.message, "does not fetch remote images"));
    ks_api_request_free(&r);
    ks_api_msg_req_free(&mr);
    json_decref(root);
    root = json_loads("{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                      "\"image\",\"source\":{\"type\":\"file\",\"file_id\":\"f\"}}]}]}", 0, NULL);
    assert_int_equal(ks_api_messages_to_chat(root, false, &mr, &e), KS_EINVAL);
    assert_string_equal(e.param, "messages.0.content.0.source");
    ks_api_msg_req_free(&mr);
    json_decref(root);

    ks_buf_printf(&body, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
                         "\"text\":\"hi\"},{\"type\":\"input_image\",\"image_url\":\"data:image/png;base64,%s\"}]}]}", d);
    root = json_loads(body.s, 0, NULL);
    ks_api_resp_req rr = {0};
    assert_int_equal(ks_api_responses_to_chat(root, NULL, &rr, &e), 0);
    assert_int_equal(ks_api_parse_root_media(KS_API_CHAT, json_incref(rr.chat), &lim, &r, &e), 0);
    assert_string_equal(r.msgs[0].content, "hi" KS_MEDIA_IN_MARKER);
    ks_api_request_free(&r);
    lim.modalities = 0;
    assert_int_equal(ks_api_parse_root_media(KS_API_CHAT, json_incref(rr.chat), &lim, &r, &e), KS_EINVAL);
    assert_string_equal(e.param, "input[0].content[1].image_url");
    ks_api_resp_req_free(&rr);
    json_decref(root);
    root = json_loads("{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
                      "\"file_id\":\"file-1\"}]}]}", 0, NULL);
    assert_int_equal(ks_api_responses_to_chat(root, NULL, &rr, &e), KS_EINVAL);
    assert_string_equal(e.param, "input[0].content[0].file_id");
    ks_api_resp_req_free(&rr);
    json_decref(root);
    ks_buf_free(&body);
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64),
        cmocka_unit_test(test_data_url),
        cmocka_unit_test(test_sniff_and_size),
        cmocka_unit_test(test_chat_image),
        cmocka_unit_test(test_chat_image_errors),
        cmocka_unit_test(test_chat_item_count_and_audio),
        cmocka_unit_test(test_translations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

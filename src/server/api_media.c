/*
 * api_media.c — image and audio content parts of a chat request: OpenAI's
 * image_url and input_audio parts, and the parts the Responses and Messages
 * translations make of input_image / input_audio items and image blocks.
 *
 * Each part is checked against the request's limits (media_in.h: shape,
 * data URL, base64, format by magic bytes, declared type, size, image
 * width × height from the header) and becomes one item of the request's
 * media (ks_api_request.media, in order) and one marker in its message's
 * text where the part was (ks_media_limits.marker). The message as the
 * template request holds it also carries its items' SHA-256 ("ks_media"),
 * so every hint computed over a message's JSON (IMC message hashes, the SPC
 * key, the render memo, presize) tells two images apart though their
 * markers are the same text. The template never reads that field.
 *
 * A translated part names its own path in the client's words ("ks_param":
 * "messages.0.content.1.source"), which the errors use; on a chat request
 * the path is the chat one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/key.h"
#include "server/api_int.h"
#include "server/media_fetch.h"
#include "server/media_in.h"

#define KIND_NAME(k) ((k) == KS_MEDIA_IN_AUDIO ? "audio" : "image")

bool ks__api_media_type(const char *type) { return !strcmp(type, "image_url") || !strcmp(type, "input_audio"); }

const char *ks__api_media_marker(const ks_api_request *r) {
    return r->media_limits && r->media_limits->marker ? r->media_limits->marker : KS_MEDIA_IN_MARKER;
}

static const char *format_list(ks_media_in_kind k) {
    return k == KS_MEDIA_IN_AUDIO ? "WAV, MP3 and FLAC" : "PNG, JPEG, GIF and BMP";
}

/* The checks of one item's bytes (decoded into *data, owned on success). */
static int check_bytes(ks_api_request *r, ks_media_in_kind want, ks_media_in_format declared, const char *declared_name,
                       const uint8_t *d, size_t n, const char *param, ks_api_media *it, ks_api_error *err) {
    const ks_media_limits *lim = r->media_limits;
    ks_media_in_format f = ks_media_in_sniff(d, n);
    ks_media_in_kind k = ks_media_in_format_kind(f);
    if (f == KS_MEDIA_IN_WEBP)
        BAD("invalid_image_format", param,
            "Invalid '%s': WebP images are not supported by this server's image decoder; send %s.", param,
            format_list(KS_MEDIA_IN_IMAGE));
    if (f == KS_MEDIA_IN_UNKNOWN)
        BAD(want == KS_MEDIA_IN_AUDIO ? "invalid_audio_format" : "invalid_image_format", param,
            "Invalid '%s': the data is not %s this server decodes (%s).", param,
            want == KS_MEDIA_IN_AUDIO ? "audio" : "an image", format_list(want));
    if (k != want)
        BAD("media_type_mismatch", param, "Invalid '%s': the data is %s %s, not %s.", param,
            ks_media_in_format_name(f), KIND_NAME(k), want == KS_MEDIA_IN_AUDIO ? "audio" : "an image");
    if (declared != KS_MEDIA_IN_UNKNOWN && declared != f)
        BAD("media_type_mismatch", param, "Invalid '%s': the data is %s but its type says %s.", param,
            ks_media_in_format_name(f), declared_name);
    it->kind = k;
    it->format = f;
    if (k == KS_MEDIA_IN_IMAGE) {
        if (ks_media_in_image_size(d, n, f, &it->width, &it->height))
            BAD("invalid_image_format", param, "Invalid '%s': the %s image's header is corrupt or cut short.", param,
                ks_media_in_format_name(f));
        if (it->width * it->height > lim->max_pixels)
            BAD("image_too_large", param,
                "Invalid '%s': the image is %lld x %lld (%lld pixels); this server takes at most %lld pixels per "
                "image (--media-max-pixels).", param, (long long)it->width, (long long)it->height,
                (long long)(it->width * it->height), (long long)lim->max_pixels);
    }
    return 0;
}

static int take_bytes(ks_api_request *r, ks_media_in_kind want, ks_media_in_format declared, const char *declared_name,
                      uint8_t *d, size_t n, const char *param, ks_api_error *err);

/* --media-max-items: room for one more item, checked before its bytes are
 * decoded or fetched. */
static int room_for_one(const ks_api_request *r, const char *param, ks_api_error *err) {
    if (r->n_media >= r->media_limits->max_items)
        BAD("too_many_media_items", param,
            "Invalid '%s': a request may carry at most %d images and audio clips (--media-max-items).", param,
            r->media_limits->max_items);
    return 0;
}

/* One item from base64 text: limits, decode, checks, then appended to r->media. */
static int add_item(ks_api_request *r, ks_media_in_kind want, ks_media_in_format declared, const char *declared_name,
                    const char *b64, size_t b64_len, const char *param, ks_api_error *err) {
    const ks_media_limits *lim = r->media_limits;
    if (room_for_one(r, param, err)) return KS_EINVAL;
    /* The decoded length is known before decoding (6 bits per character that
     * is neither padding nor whitespace): a body of many megabytes is refused
     * before anything is allocated for it. */
    size_t m = 0;
    for (size_t i = 0; i < b64_len; i++) {
        char c = b64[i];
        m += c != '=' && c != ' ' && c != '\t' && c != '\r' && c != '\n';
    }
    if (m / 4 * 3 + (m % 4 ? m % 4 - 1 : 0) > (size_t)lim->max_bytes)
        BAD("media_too_large", param,
            "Invalid '%s': the %s is %zu bytes; this server takes at most %lld bytes per item (--media-max-bytes).",
            param, KIND_NAME(want), m / 4 * 3 + (m % 4 ? m % 4 - 1 : 0), (long long)lim->max_bytes);
    size_t max = ks_media_in_b64_max(b64_len);
    uint8_t *d = malloc(max ? max : 1);
    if (!d) return ks__api_oom(err);
    size_t n = 0, bad = 0;
    if (ks_media_in_b64_decode(b64, b64_len, d, &n, &bad)) {
        free(d);
        BAD("invalid_base64", param, "Invalid '%s': the data is not valid base64 (at character %zu).", param, bad);
    }
    return take_bytes(r, want, declared, declared_name, d, n, param, err);
}

/* One item's decoded bytes d[0, n) (taken: freed on failure): limits,
 * checks, identity, then appended to r->media. */
static int take_bytes(ks_api_request *r, ks_media_in_kind want, ks_media_in_format declared, const char *declared_name,
                      uint8_t *d, size_t n, const char *param, ks_api_error *err) {
    const ks_media_limits *lim = r->media_limits;
    ks_api_media *v = realloc(r->media, sizeof *v * ((size_t)r->n_media + 1));
    if (!v) {
        free(d);
        return ks__api_oom(err);
    }
    r->media = v;
    ks_api_media *it = &v[r->n_media];
    memset(it, 0, sizeof *it);
    int rc = 0;
    if (n == 0) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", param, "Invalid '%s': the %s is empty.", param,
                         KIND_NAME(want));
        rc = KS_EINVAL;
    } else if ((int64_t)n > lim->max_bytes) {
        ks_api_error_set(err, 400, T_INVALID, "media_too_large", param,
                         "Invalid '%s': the %s is %zu bytes; this server takes at most %lld bytes per item "
                         "(--media-max-bytes).", param, KIND_NAME(want), n, (long long)lim->max_bytes);
        rc = KS_EINVAL;
    } else if (r->media_bytes + (int64_t)n > lim->max_total_bytes) {
        ks_api_error_set(err, 400, T_INVALID, "media_too_large", param,
                         "Invalid '%s': the request's images and audio come to %lld bytes with this one; this "
                         "server takes at most %lld bytes per request (--media-max-total-bytes).", param,
                         (long long)(r->media_bytes + (int64_t)n), (long long)lim->max_total_bytes);
        rc = KS_EINVAL;
    } else {
        rc = check_bytes(r, want, declared, declared_name, d, n, param, it, err);
    }
    if (!rc && ks_sha256(d, n, it->sha256)) rc = ks__api_oom(err);
    if (rc) {
        free(d);
        return rc;
    }
    it->data = d;
    it->n = n;
    snprintf(it->param, sizeof it->param, "%s", param);
    r->media_bytes += (int64_t)n;
    r->n_media++;
    return 0;
}

/* An image named by an http(s):// or file:// URL: fetched where the operator
 * allows it (media_fetch.h), then checked as inline bytes are. The type the
 * remote declared is not used: servers label images loosely, the magic
 * bytes decide. */
static int remote_image(ks_api_request *r, const char *url, size_t len, const char *param, ks_api_error *err) {
    const ks_media_limits *lim = r->media_limits;
    if (room_for_one(r, param, err)) return KS_EINVAL;
    uint8_t *d = NULL;
    size_t n = 0;
    char why[320];
    ks_fetch_result fr = ks_media_fetch(lim->fetch, url, len, lim->max_bytes, &d, &n, why, sizeof why);
    switch (fr) {
    case KS_FETCH_OK: break;
    case KS_FETCH_NOMEM: return ks__api_oom(err);
    case KS_FETCH_TOO_LARGE: BAD("media_too_large", param, "Invalid '%s': %s.", param, why);
    case KS_FETCH_REFUSED:
        BAD("invalid_image_url", param, "Invalid '%s': %s; send the image inline as a base64 data URL "
            "(data:image/png;base64,...).", param, why);
    case KS_FETCH_FAILED: BAD("image_fetch_failed", param, "Invalid '%s': %s.", param, why);
    default: BAD("invalid_image_url", param, "Invalid '%s': %s.", param, why);
    }
    return take_bytes(r, KS_MEDIA_IN_IMAGE, KS_MEDIA_IN_UNKNOWN, "", d, n, param, err);
}

/* An image URL: a base64 data URL, an allowed remote or local one, else
 * refused with the reason. */
static int image_url(ks_api_request *r, const char *url, size_t len, const char *param, ks_api_error *err) {
    if (ks_media_fetch_is_url(url, len)) return remote_image(r, url, len, param, err);
    const char *mime, *b64;
    size_t mime_len, b64_len;
    int rc = ks_media_in_data_url(url, len, &mime, &mime_len, &b64, &b64_len);
    if (rc == KS_ENOENT)
        BAD("invalid_image_url", param,
            "Invalid '%s': only base64 data URLs are supported (data:image/png;base64,...).", param);
    if (rc)
        BAD("invalid_image_url", param, "Invalid '%s': expected a base64 data URL (data:image/png;base64,...).",
            param);
    bool any = false;
    ks_media_in_format declared = ks_media_in_mime_format(mime, mime_len, &any);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(mime_len < 48 ? mime_len : 48), mime);
    if (declared == KS_MEDIA_IN_UNKNOWN && !any)
        BAD("invalid_image_format", param, "Invalid '%s': '%s' is not an image type this server decodes (%s).",
            param, name, format_list(KS_MEDIA_IN_IMAGE));
    if (declared == KS_MEDIA_IN_WEBP)
        BAD("invalid_image_format", param,
            "Invalid '%s': WebP images are not supported by this server's image decoder; send %s.", param,
            format_list(KS_MEDIA_IN_IMAGE));
    if (declared != KS_MEDIA_IN_UNKNOWN && ks_media_in_format_kind(declared) != KS_MEDIA_IN_IMAGE)
        BAD("media_type_mismatch", param, "Invalid '%s': '%s' is not an image type.", param, name);
    return add_item(r, KS_MEDIA_IN_IMAGE, declared, name, b64, b64_len, param, err);
}

int ks__api_media_part(json_t *part, const char *type, const char *pp, const char *role, ks_api_request *r,
                       ks_api_error *err) {
    char param[96], q[128];
    const char *own = ks__api_str(part, "ks_param");
    snprintf(param, sizeof param, "%s", own[0] ? own : pp);
    bool audio = !strcmp(type, "input_audio");
    ks_media_in_kind want = audio ? KS_MEDIA_IN_AUDIO : KS_MEDIA_IN_IMAGE;
    unsigned have = r->media_limits ? r->media_limits->modalities : 0;
    if (!(have & want))
        BAD("invalid_value", param,
            "Invalid '%s': this model takes no %s input (the server has no projector for it: --mmproj).", param,
            audio ? "audio" : "image");
    if (strcmp(role, "user") && strcmp(role, "tool"))
        BAD("invalid_value", param, "Invalid '%s': %s parts are only supported in user and tool messages.", param,
            audio ? "audio" : "image");
    json_t *o = ks__api_field(part, type);
    snprintf(q, sizeof q, "%s.%s", param, type);
    if (!o) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    int rc = ks__api_want(o, JSON_OBJECT, "an object", q, err);
    if (rc) return rc;
    if (!audio) {
        json_t *url = ks__api_field(o, "url");
        snprintf(q, sizeof q, "%s.image_url.url", param);
        if (!url) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
        if ((rc = ks__api_want(url, JSON_STRING, "a string", q, err))) return rc;
        json_t *detail = ks__api_field(o, "detail");
        char dq[128];
        snprintf(dq, sizeof dq, "%s.image_url.detail", param);
        if (detail && (rc = ks__api_want(detail, JSON_STRING, "a string", dq, err))) return rc;
        const char *ds = detail ? json_string_value(detail) : "auto";
        if (strcmp(ds, "auto") && strcmp(ds, "low") && strcmp(ds, "high"))
            BAD("invalid_value", dq, "Invalid value for '%s': '%.16s'. Supported values are: 'auto', 'low' and "
                "'high'.", dq, ds);
        return image_url(r, json_string_value(url), json_string_length(url), own[0] ? param : q, err);
    }
    json_t *data = ks__api_field(o, "data"), *fmt = ks__api_field(o, "format");
    snprintf(q, sizeof q, "%s.input_audio.data", param);
    if (!data) BAD("missing_required_parameter", q, "Missing required parameter: '%s'.", q);
    if ((rc = ks__api_want(data, JSON_STRING, "a string", q, err))) return rc;
    char fq[128];
    snprintf(fq, sizeof fq, "%s.input_audio.format", param);
    if (!fmt) BAD("missing_required_parameter", fq, "Missing required parameter: '%s'.", fq);
    if ((rc = ks__api_want(fmt, JSON_STRING, "a string", fq, err))) return rc;
    ks_media_in_format declared = ks_media_in_audio_format(json_string_value(fmt));
    if (declared == KS_MEDIA_IN_UNKNOWN)
        BAD("invalid_value", fq, "Invalid value for '%s': '%.16s'. Supported values are: 'wav', 'mp3' and 'flac'.",
            fq, json_string_value(fmt));
    return add_item(r, KS_MEDIA_IN_AUDIO, declared, json_string_value(fmt), json_string_value(data),
                    json_string_length(data), own[0] ? param : q, err);
}

int ks__api_media_tag(const ks_api_request *r, int from, json_t *msg) {
    if (from >= r->n_media) return 0;
    json_t *a = json_array();
    if (!a || json_object_set_new(msg, "ks_media", a)) return KS_ENOMEM;
    for (int i = from; i < r->n_media; i++) {
        char hex[65];
        ks_media_in_hex(r->media[i].sha256, hex);
        if (json_array_append_new(a, json_string(hex))) return KS_ENOMEM;
    }
    return 0;
}

void ks__api_media_free(ks_api_request *r) {
    for (int i = 0; i < r->n_media; i++) free(r->media[i].data);
    free(r->media);
    r->media = NULL;
    r->n_media = 0;
}

/* ------------------------------------------------------------ translations */
json_t *ks__api_media_chat_part(const char *type, json_t *body, const char *param) {
    json_t *p = json_pack("{s:s, s:O, s:s}", "type", type, type, body, "ks_param", param);
    return p;
}

json_t *ks__api_parts_content(json_t *parts, bool has_media) {
    if (has_media) return json_incref(parts);
    ks_buf b = {0};
    size_t i;
    json_t *p;
    json_array_foreach(parts, i, p) {
        const char *t = ks__api_str(p, "text");
        if ((b.len && ks_buf_append(&b, "\n", 1)) || ks_buf_append(&b, t, strlen(t))) {
            ks_buf_free(&b);
            return NULL;
        }
    }
    json_t *s = json_stringn(b.s ? b.s : "", b.len);
    ks_buf_free(&b);
    return s;
}

/* An Anthropic image block {type: image, source: {type: base64, media_type,
 * data}} at q as a chat image part (new reference): a data URL the chat parser checks
 * and decodes, with q's path in its errors. NULL with err filled. */
json_t *ks__api_messages_image(json_t *blk, const char *q, ks_api_error *err) {
    char sq[128];
    snprintf(sq, sizeof sq, "%s.source", q);
    json_t *src = json_object_get(blk, "source");
    const char *st = json_is_object(src) ? json_string_value(json_object_get(src, "type")) : NULL;
    if (!st) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", sq, "%s: expected {\"type\": \"base64\", "
                         "\"media_type\": ..., \"data\": ...}.", sq);
        return NULL;
    }
    if (!strcmp(st, "url")) { /* fetched where allowed, as a chat image_url (remote_image) */
        json_t *u = json_object_get(src, "url");
        if (!json_is_string(u)) {
            ks_api_error_set(err, 400, T_INVALID, "invalid_value", sq, "%s.url: expected a string.", sq);
            return NULL;
        }
        json_t *body = json_pack("{s:O}", "url", u);
        json_t *part = body ? ks__api_media_chat_part("image_url", body, sq) : NULL;
        json_decref(body);
        if (!part) ks__api_oom(err);
        return part;
    }
    if (strcmp(st, "base64")) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", sq, "%s: only base64 and url image sources are "
                         "supported.", sq);
        return NULL;
    }
    const char *mt = json_string_value(json_object_get(src, "media_type"));
    json_t *data = json_object_get(src, "data");
    if (!mt || (strcmp(mt, "image/jpeg") && strcmp(mt, "image/png") && strcmp(mt, "image/gif") &&
                strcmp(mt, "image/webp"))) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", sq,
                         "%s.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'", sq);
        return NULL;
    }
    if (!json_is_string(data)) {
        ks_api_error_set(err, 400, T_INVALID, "invalid_value", sq, "%s.data: expected a string.", sq);
        return NULL;
    }
    ks_buf url = {0};
    json_t *part = NULL;
    if (!ks_buf_printf(&url, "data:%s;base64,", mt) && !ks_buf_append(&url, json_string_value(data),
                                                                        json_string_length(data))) {
        json_t *body = json_pack("{s:s%}", "url", url.s, url.len);
        part = body ? ks__api_media_chat_part("image_url", body, sq) : NULL;
        json_decref(body);
    }
    ks_buf_free(&url);
    if (!part) ks__api_oom(err);
    return part;
}


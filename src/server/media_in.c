/*
 * media_in.c — see media_in.h.
 */
#include "server/media_in.h"

#include <string.h>
#include <strings.h>

#include "kvstash.h"

ks_media_limits ks_media_in_limits_default(void) {
    return (ks_media_limits){
        .modalities = 0,
        .max_bytes = KS_MEDIA_IN_MAX_BYTES,
        .max_items = KS_MEDIA_IN_MAX_ITEMS,
        .max_total_bytes = KS_MEDIA_IN_MAX_TOTAL_BYTES,
        .max_pixels = KS_MEDIA_IN_MAX_PIXELS,
        .marker = NULL,
    };
}

const char *ks_media_in_format_name(ks_media_in_format f) {
    switch (f) {
    case KS_MEDIA_IN_PNG: return "png";
    case KS_MEDIA_IN_JPEG: return "jpeg";
    case KS_MEDIA_IN_GIF: return "gif";
    case KS_MEDIA_IN_BMP: return "bmp";
    case KS_MEDIA_IN_WEBP: return "webp";
    case KS_MEDIA_IN_WAV: return "wav";
    case KS_MEDIA_IN_MP3: return "mp3";
    case KS_MEDIA_IN_FLAC: return "flac";
    default: return "unknown";
    }
}

ks_media_in_kind ks_media_in_format_kind(ks_media_in_format f) {
    switch (f) {
    case KS_MEDIA_IN_PNG:
    case KS_MEDIA_IN_JPEG:
    case KS_MEDIA_IN_GIF:
    case KS_MEDIA_IN_BMP:
    case KS_MEDIA_IN_WEBP: return KS_MEDIA_IN_IMAGE;
    case KS_MEDIA_IN_WAV:
    case KS_MEDIA_IN_MP3:
    case KS_MEDIA_IN_FLAC: return KS_MEDIA_IN_AUDIO;
    default: return (ks_media_in_kind)0;
    }
}

/* ------------------------------------------------------------ sniffing */
ks_media_in_format ks_media_in_sniff(const uint8_t *d, size_t n) {
    if (n >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8)) return KS_MEDIA_IN_PNG;
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return KS_MEDIA_IN_JPEG;
    if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6))) return KS_MEDIA_IN_GIF;
    if (n >= 2 && d[0] == 'B' && d[1] == 'M') return KS_MEDIA_IN_BMP;
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) return KS_MEDIA_IN_WEBP;
    /* The audio checks are mtmd's (mtmd-helper.cpp is_audio_file), which
     * decides between audio and image the same way. */
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WAVE", 4)) return KS_MEDIA_IN_WAV;
    if (n >= 12 && !memcmp(d, "fLaC", 4)) return KS_MEDIA_IN_FLAC;
    if (n >= 12 && (!memcmp(d, "ID3", 3) || (d[0] == 0xFF && (d[1] & 0xE0) == 0xE0))) return KS_MEDIA_IN_MP3;
    return KS_MEDIA_IN_UNKNOWN;
}

ks_media_in_format ks_media_in_mime_format(const char *mime, size_t len, bool *any) {
    static const struct { const char *name; ks_media_in_format f; } types[] = {
        {"image/png", KS_MEDIA_IN_PNG},       {"image/jpeg", KS_MEDIA_IN_JPEG},   {"image/jpg", KS_MEDIA_IN_JPEG},
        {"image/pjpeg", KS_MEDIA_IN_JPEG},    {"image/gif", KS_MEDIA_IN_GIF},     {"image/bmp", KS_MEDIA_IN_BMP},
        {"image/x-ms-bmp", KS_MEDIA_IN_BMP},  {"image/x-bmp", KS_MEDIA_IN_BMP},   {"image/webp", KS_MEDIA_IN_WEBP},
        {"audio/wav", KS_MEDIA_IN_WAV},       {"audio/x-wav", KS_MEDIA_IN_WAV},   {"audio/wave", KS_MEDIA_IN_WAV},
        {"audio/vnd.wave", KS_MEDIA_IN_WAV},  {"audio/mpeg", KS_MEDIA_IN_MP3},    {"audio/mp3", KS_MEDIA_IN_MP3},
        {"audio/flac", KS_MEDIA_IN_FLAC},     {"audio/x-flac", KS_MEDIA_IN_FLAC},
    };
    size_t n = 0;
    while (n < len && mime[n] != ';') n++;
    while (n > 0 && (mime[n - 1] == ' ' || mime[n - 1] == '\t')) n--;
    if (any) *any = n == 0 || (n == 24 && !strncasecmp(mime, "application/octet-stream", 24));
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strlen(types[i].name) == n && !strncasecmp(mime, types[i].name, n)) return types[i].f;
    return KS_MEDIA_IN_UNKNOWN;
}

ks_media_in_format ks_media_in_audio_format(const char *name) {
    if (!strcasecmp(name, "wav")) return KS_MEDIA_IN_WAV;
    if (!strcasecmp(name, "mp3")) return KS_MEDIA_IN_MP3;
    if (!strcasecmp(name, "flac")) return KS_MEDIA_IN_FLAC;
    return KS_MEDIA_IN_UNKNOWN;
}

/* ------------------------------------------------------------ image headers */
static uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint32_t le16(const uint8_t *p) { return (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }

/* JPEG: the segments after SOI up to the first start-of-frame (SOF0..15
 * but DHT C4, JPG C8, DAC CC), whose body is precision, height, width. */
static int jpeg_size(const uint8_t *d, size_t n, int64_t *w, int64_t *h) {
    size_t i = 2;
    for (;;) {
        while (i < n && d[i] == 0xFF) i++; /* fill bytes before a marker */
        if (i >= n || i < 3 || d[i - 1] != 0xFF) return KS_ECORRUPT;
        uint8_t m = d[i++];
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue; /* no length */
        if (m == 0xD9 || m == 0xDA) return KS_ECORRUPT; /* the image ended or its data began: no frame */
        if (i + 2 > n) return KS_ECORRUPT;
        size_t len = be16(d + i);
        if (len < 2 || i + len > n) return KS_ECORRUPT;
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            if (len < 7) return KS_ECORRUPT;
            *h = be16(d + i + 3);
            *w = be16(d + i + 5);
            return 0;
        }
        i += len;
    }
}

int ks_media_in_image_size(const uint8_t *d, size_t n, ks_media_in_format f, int64_t *w, int64_t *h) {
    *w = *h = 0;
    int rc = 0;
    switch (f) {
    case KS_MEDIA_IN_PNG:
        /* signature, then the IHDR chunk: length 13, "IHDR", width, height */
        if (n < 24 || be32(d + 8) != 13 || memcmp(d + 12, "IHDR", 4)) return KS_ECORRUPT;
        *w = be32(d + 16);
        *h = be32(d + 20);
        if (*w > INT32_MAX || *h > INT32_MAX) return KS_ECORRUPT; /* the PNG spec's limit */
        break;
    case KS_MEDIA_IN_JPEG: rc = jpeg_size(d, n, w, h); break;
    case KS_MEDIA_IN_GIF:
        if (n < 13) return KS_ECORRUPT;
        *w = le16(d + 6);
        *h = le16(d + 8);
        break;
    case KS_MEDIA_IN_BMP: {
        if (n < 26) return KS_ECORRUPT;
        uint32_t hs = le32(d + 14);
        if (hs == 12) { /* BITMAPCOREHEADER: 16-bit sides */
            *w = le16(d + 18);
            *h = le16(d + 20);
        } else if (hs >= 40 && n >= 26) {
            int32_t sw = (int32_t)le32(d + 18), sh = (int32_t)le32(d + 22);
            if (sw <= 0 || sh == INT32_MIN) return KS_ECORRUPT;
            *w = sw;
            *h = sh < 0 ? -(int64_t)sh : sh; /* negative: stored top-down */
        } else {
            return KS_ECORRUPT;
        }
        break;
    }
    case KS_MEDIA_IN_WEBP: {
        /* VP8 (lossy), VP8L (lossless) or VP8X (extended) first */
        if (n < 30) return KS_ECORRUPT;
        if (!memcmp(d + 12, "VP8 ", 4)) {
            *w = le16(d + 26) & 0x3FFF;
            *h = le16(d + 28) & 0x3FFF;
        } else if (!memcmp(d + 12, "VP8L", 4)) {
            uint32_t b = le32(d + 21);
            *w = (b & 0x3FFF) + 1;
            *h = ((b >> 14) & 0x3FFF) + 1;
        } else if (!memcmp(d + 12, "VP8X", 4)) {
            *w = (int64_t)(d[24] | d[25] << 8 | d[26] << 16) + 1;
            *h = (int64_t)(d[27] | d[28] << 8 | d[29] << 16) + 1;
        } else {
            return KS_ECORRUPT;
        }
        break;
    }
    default: return KS_EINVAL;
    }
    if (rc) return rc;
    return *w > 0 && *h > 0 ? 0 : KS_ECORRUPT;
}

/* ------------------------------------------------------------ base64 */
size_t ks_media_in_b64_max(size_t len) { return len / 4 * 3 + 3; }

/* The value of a base64 character, -1: none, -2: whitespace, -3: padding. */
static int b64_val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') return -2;
    if (c == '=') return -3;
    return -1;
}

int ks_media_in_b64_decode(const char *s, size_t len, uint8_t *out, size_t *n_out, size_t *bad_at) {
    uint32_t acc = 0;
    int bits = 0, pad = 0;
    size_t o = 0;
    *n_out = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v == -2) continue;
        /* After padding only padding (and whitespace) may follow. */
        if (v == -1 || (pad && v != -3)) {
            if (bad_at) *bad_at = i;
            return KS_EINVAL;
        }
        if (v == -3) {
            pad++;
            if (pad > 2 || bits == 0) {
                if (bad_at) *bad_at = i;
                return KS_EINVAL;
            }
            continue;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* 2 or 4 bits left over are the padding of a last group of 2 or 3
     * characters; 6 is a lone character, which cannot encode a byte. */
    if (bits == 6) {
        if (bad_at) *bad_at = len;
        return KS_EINVAL;
    }
    *n_out = o;
    return 0;
}

/* ------------------------------------------------------------ data URLs */
int ks_media_in_data_url(const char *url, size_t len, const char **mime, size_t *mime_len, const char **b64,
                         size_t *b64_len) {
    if (len < 5 || strncasecmp(url, "data:", 5)) return KS_EINVAL;
    const char *comma = memchr(url + 5, ',', len - 5);
    if (!comma) return KS_EINVAL;
    const char *head = url + 5;
    size_t hn = (size_t)(comma - head);
    /* ";base64" is the last parameter of the header. */
    if (hn < 7 || strncasecmp(comma - 7, ";base64", 7)) return KS_ENOENT;
    *mime = head;
    *mime_len = 0;
    while (*mime_len < hn - 7 && head[*mime_len] != ';') (*mime_len)++;
    *b64 = comma + 1;
    *b64_len = len - (size_t)(comma + 1 - url);
    return 0;
}

void ks_media_in_hex(const uint8_t h[32], char out[65]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hx[h[i] >> 4];
        out[2 * i + 1] = hx[h[i] & 15];
    }
    out[64] = '\0';
}

/*
 * media_in.h — images and audio as a request carries them, before anything
 * decodes them: base64, data URLs, the format from the magic bytes, an
 * image's width and height from its header, and the limits (docs/SERVER.md,
 * "Media input").
 *
 * NOTES ON THE DESIGN
 *  1. Pure: no engine, no I/O, no allocation but the decoded bytes, so every
 *     rule is unit-tested without a model (tests/unit/test_media_in.c).
 *  2. Bytes from the network are never trusted: a size is checked against
 *     its limit before the buffer for it is allocated (the decoded length of
 *     base64 is known from its length), headers are read only within the
 *     bytes there are, and a header that ends early is KS_ECORRUPT.
 *  3. The formats accepted are the ones mtmd's decoders take (stb_image:
 *     PNG, JPEG, GIF, BMP; miniaudio: WAV, MP3, FLAC), told apart by their
 *     magic bytes, never by what the client declared: a declared type that
 *     names another format is a mismatch (400), one that names no format
 *     kvstash knows is refused. WebP is recognised only to say that it is
 *     not supported (stb_image cannot decode it).
 *  4. An item's identity is the SHA-256 of its decoded bytes: equal bytes,
 *     equal item; its hex is what the cache hints see (api_media.c).
 *
 * Thread model: every function is reentrant.
 */
#ifndef KS_MEDIA_IN_H
#define KS_MEDIA_IN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What an item is. The values are bits of ks_media_limits.modalities. */
typedef enum { KS_MEDIA_IN_IMAGE = 1, KS_MEDIA_IN_AUDIO = 2 } ks_media_in_kind;

/* The formats, as the magic bytes say. */
typedef enum {
    KS_MEDIA_IN_UNKNOWN = 0,
    KS_MEDIA_IN_PNG,
    KS_MEDIA_IN_JPEG,
    KS_MEDIA_IN_GIF,
    KS_MEDIA_IN_BMP,
    KS_MEDIA_IN_WEBP, /* recognised, not supported (note 3) */
    KS_MEDIA_IN_WAV,
    KS_MEDIA_IN_MP3,
    KS_MEDIA_IN_FLAC,
} ks_media_in_format;

/* Defaults of the limits (config.h media.*, serve's --media-* flags). */
#define KS_MEDIA_IN_MAX_BYTES ((int64_t)10 << 20)       /* one item, decoded: 10 MiB */
#define KS_MEDIA_IN_MAX_ITEMS 32                        /* items in one request */
#define KS_MEDIA_IN_MAX_TOTAL_BYTES ((int64_t)32 << 20) /* all items of a request, decoded */
#define KS_MEDIA_IN_MAX_PIXELS ((int64_t)16 << 20)      /* width × height: 16 Mpx (4096 × 4096) */

/* What a request's media are checked against, and what the model takes.
 * Borrowed by the parser for the parse. */
typedef struct ks_media_limits {
    unsigned modalities;     /* KS_MEDIA_IN_IMAGE | KS_MEDIA_IN_AUDIO the model takes (its
                                projector); 0: none, every media part is refused */
    int64_t max_bytes;       /* per item, decoded */
    int max_items;           /* per request */
    int64_t max_total_bytes; /* per request, decoded */
    int64_t max_pixels;      /* per image, width × height from its header */
    const char *marker;      /* the text that stands for an item in the prompt (the engine's
                                media marker); NULL: KS_MEDIA_IN_MARKER */
    const struct ks_media_fetch_cfg *fetch; /* what image URLs may be fetched (media_fetch.h);
                                NULL: none, only data URLs */
} ks_media_limits;

/* mtmd's default media marker (mtmd_default_marker()). */
#define KS_MEDIA_IN_MARKER "<__media__>"

/* The defaults above, modalities 0. */
ks_media_limits ks_media_in_limits_default(void);

/* "png", "jpeg", "gif", "bmp", "webp", "wav", "mp3", "flac", "unknown". */
const char *ks_media_in_format_name(ks_media_in_format f);
/* The kind of a format (0 for unknown). */
ks_media_in_kind ks_media_in_format_kind(ks_media_in_format f);

/* The format of data[0, n) from its magic bytes; KS_MEDIA_IN_UNKNOWN when
 * none matches. */
ks_media_in_format ks_media_in_sniff(const uint8_t *data, size_t n);

/* The format a MIME type names ("image/png", "image/jpg", "audio/x-wav",
 * ...; case-insensitive, parameters after ';' ignored); KS_MEDIA_IN_UNKNOWN
 * for a type that names none. *any is set when the type names no format on
 * purpose (empty, "application/octet-stream"): the bytes decide. any may be
 * NULL. */
ks_media_in_format ks_media_in_mime_format(const char *mime, size_t len, bool *any);

/* The format an audio "format" field names ("wav", "mp3", "flac";
 * case-insensitive); KS_MEDIA_IN_UNKNOWN otherwise. */
ks_media_in_format ks_media_in_audio_format(const char *name);

/* An image's width and height from its header, without decoding it (PNG's
 * IHDR, JPEG's first SOF segment, GIF's logical screen, BMP's info
 * header). 0; KS_ECORRUPT when the header is cut short, malformed, or a
 * side is 0; KS_EINVAL for a format that is not an image. */
int ks_media_in_image_size(const uint8_t *data, size_t n, ks_media_in_format f, int64_t *w, int64_t *h);

/* The most bytes base64 text of len characters decodes to. */
size_t ks_media_in_b64_max(size_t len);
/* Decodes standard base64 (RFC 4648 alphabet; '=' padding optional; ASCII
 * whitespace skipped, as MIME line breaks) of s[0, len) into out, which has
 * room for ks_media_in_b64_max(len) bytes; *n_out is the length. 0, or
 * KS_EINVAL at the first character that is not base64 (*bad_at: its
 * offset; may be NULL), or when the text ends in the middle of a byte. */
int ks_media_in_b64_decode(const char *s, size_t len, uint8_t *out, size_t *n_out, size_t *bad_at);

/* A data URL "data:[<mime>][;param]*;base64,<data>" split into its media
 * type (*mime, *mime_len: may be empty) and its base64 text (*b64,
 * *b64_len), borrowed from url. 0; KS_EINVAL when url is not a data URL;
 * KS_ENOENT when it is one without ";base64" (kvstash takes base64 only). */
int ks_media_in_data_url(const char *url, size_t len, const char **mime, size_t *mime_len, const char **b64,
                         size_t *b64_len);

/* Lowercase hex of 32 bytes into out[65]. */
void ks_media_in_hex(const uint8_t h[32], char out[65]);

#endif

/*
 * textstream.c — see textstream.h.
 *
 * Two stages: raw bytes -> valid UTF-8 (stage 1, `raw`), valid text -> text
 * that cannot be the start of a stop string (stage 2, `hold`).
 */
#include "base/textstream.h"

#include <stdlib.h>
#include <string.h>

#define MAX_STOPS 16

struct ks_textstream {
    char *stops[MAX_STOPS];
    size_t stop_len[MAX_STOPS];
    int stop_map[MAX_STOPS]; /* index of stops[i] in the caller's array */
    int n_stops;
    unsigned char raw[8]; /* an incomplete UTF-8 sequence (at most 3 bytes) */
    int n_raw;
    ks_buf hold;          /* valid text that may begin a stop string */
    ks_buf all;           /* everything emitted */
    bool stopped;
    int stop_index;       /* which stop string ended it, -1: none */
    int n_indent;         /* ks_textstream_set_indent; 0: off */
    bool line_start;      /* after a newline, no character but blanks yet */
    int indent;           /* the blanks of the line so far */
};

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

static bool utf8_valid(const char *s, size_t n);

ks_textstream *ks_textstream_create(const char *const *stops, int n_stops) {
    ks_textstream *ts = calloc(1, sizeof *ts);
    if (!ts) return NULL;
    ts->stop_index = -1;
    for (int i = 0; i < n_stops && ts->n_stops < MAX_STOPS; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        /* The text is valid UTF-8: a stop string that is not could only
         * match, or start to match, inside a character, and the text before
         * it would end with a cut one (found by tests/fuzz/fuzz_textstream). */
        if (!utf8_valid(stops[i], strlen(stops[i]))) continue;
        ts->stops[ts->n_stops] = strdup(stops[i]);
        if (!ts->stops[ts->n_stops]) { ks_textstream_free(ts); return NULL; }
        ts->stop_len[ts->n_stops] = strlen(stops[i]);
        ts->stop_map[ts->n_stops] = i;
        ts->n_stops++;
    }
    return ts;
}

void ks_textstream_free(ks_textstream *ts) {
    if (!ts) return;
    for (int i = 0; i < ts->n_stops; i++) free(ts->stops[i]);
    ks_buf_free(&ts->hold);
    ks_buf_free(&ts->all);
    free(ts);
}

/* Expected length of a UTF-8 sequence from its lead byte; 0 when invalid as a lead. */
static int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Is s[0..n) a valid (complete or incomplete-at-end) sequence? Checks the
 * continuation bytes and the overlong/surrogate/range rules of RFC 3629. */
static bool utf8_ok_prefix(const unsigned char *s, int n) {
    if (n >= 2) {
        unsigned char c0 = s[0], c1 = s[1];
        if ((c1 & 0xC0) != 0x80) return false;
        if (c0 == 0xE0 && c1 < 0xA0) return false;
        if (c0 == 0xED && c1 > 0x9F) return false;
        if (c0 == 0xF0 && c1 < 0x90) return false;
        if (c0 == 0xF4 && c1 > 0x8F) return false;
    }
    for (int i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return false;
    return true;
}

/* The length of the valid UTF-8 sequence at p[0, n), 0 when there is none. */
static int utf8_seq(const unsigned char *p, size_t n) {
    int len = utf8_len(p[0]);
    return len == 0 || (size_t)len > n || !utf8_ok_prefix(p, len) ? 0 : len;
}

static bool utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int len = utf8_seq(p + i, n - i);
        if (len == 0) return false;
        i += (size_t)len;
    }
    return true;
}

size_t ks_utf8_scrub(char *s, size_t n) {
    unsigned char *p = (unsigned char *)s;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        int len = utf8_seq(p + i, n - i);
        if (len == 0) {
            i++;
            continue;
        }
        memmove(p + w, p + i, (size_t)len);
        w += (size_t)len;
        i += (size_t)len;
    }
    p[w] = '\0';
    return w;
}

/* The text s[0, n) goes out, up to a line the indentation rule ends it
 * before (then 1: stopped). */
static int emit(ks_textstream *ts, const char *s, size_t n, ks_buf *out) {
    size_t cut = n;
    for (size_t i = 0; ts->n_indent > 0 && i < n; i++) {
        if (s[i] == '\n') {
            ts->line_start = true;
            ts->indent = 0;
        } else if (ts->line_start && (s[i] == ' ' || s[i] == '\t')) {
            ts->indent++;
        } else if (ts->line_start) {
            ts->line_start = false;
            if (ts->indent < ts->n_indent) {
                cut = i;
                break;
            }
        }
    }
    int rc = 0;
    if (cut) rc = ks_buf_append(out, s, cut);
    if (cut && !rc) rc = ks_buf_append(&ts->all, s, cut);
    if (rc || cut == n) return rc;
    ts->stopped = true;
    ts->stop_index = KS_TEXTSTREAM_STOP_INDENT;
    return 1;
}

void ks_textstream_set_indent(ks_textstream *ts, int n) { ts->n_indent = n > 0 ? n : 0; }

/* Stage 2: valid text into `hold`; emit what can no longer start a stop. */
static int push_text(ks_textstream *ts, const char *s, size_t n, ks_buf *out) {
    if (ts->stopped) return 1;
    if (ts->n_stops == 0) return emit(ts, s, n, out);
    int rc = ks_buf_append(&ts->hold, s, n);
    if (rc) return rc;
    const char *h = ts->hold.s;
    size_t hl = ts->hold.len;
    /* A completed stop string: emit up to its earliest start, drop the rest. */
    size_t best = hl;
    int which = -1;
    for (int i = 0; i < ts->n_stops; i++) {
        const char *p = memmem(h, hl, ts->stops[i], ts->stop_len[i]);
        if (p && (size_t)(p - h) < best) best = (size_t)(p - h), which = i;
    }
    if (best < hl) {
        ts->stop_index = ts->stop_map[which];
        rc = emit(ts, h, best, out); /* 1: the indentation rule ended it first, and says so */
        ks_buf_reset(&ts->hold);
        ts->stopped = true;
        return rc ? rc : 1;
    }
    /* Keep the longest suffix that is a proper prefix of some stop string. */
    size_t keep = 0;
    for (int i = 0; i < ts->n_stops; i++) {
        size_t max = ts->stop_len[i] - 1 < hl ? ts->stop_len[i] - 1 : hl;
        for (size_t k = max; k > keep; k--)
            if (memcmp(h + hl - k, ts->stops[i], k) == 0) { keep = k; break; }
    }
    rc = emit(ts, h, hl - keep, out);
    if (rc) {
        if (rc == 1) ks_buf_reset(&ts->hold); /* stopped by the indentation rule */
        return rc;
    }
    memmove(ts->hold.s, h + hl - keep, keep);
    ts->hold.len = keep;
    ts->hold.s[keep] = '\0';
    return 0;
}

int ks_textstream_feed(ks_textstream *ts, const char *piece, size_t len, ks_buf *out) {
    if (ts->stopped) return 1;
    const unsigned char *p = (const unsigned char *)piece;
    ks_buf valid = {0};
    int rc = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (ts->n_raw == 0) {
            int need = utf8_len(c);
            if (need == 1) { rc = ks_buf_append(&valid, (const char *)&c, 1); }
            else if (need == 0) { rc = ks_buf_append(&valid, REPLACEMENT, 3); }
            else { ts->raw[ts->n_raw++] = c; }
        } else {
            ts->raw[ts->n_raw++] = c;
            if (!utf8_ok_prefix(ts->raw, ts->n_raw)) {
                /* The lead was bad company: replace it, re-scan this byte. */
                rc = ks_buf_append(&valid, REPLACEMENT, 3);
                ts->n_raw = 0;
                i--;
            } else if (ts->n_raw == utf8_len(ts->raw[0])) {
                rc = ks_buf_append(&valid, (const char *)ts->raw, (size_t)ts->n_raw);
                ts->n_raw = 0;
            }
        }
        if (rc) goto done;
    }
    if (valid.len) rc = push_text(ts, valid.s, valid.len, out);
done:
    ks_buf_free(&valid);
    return rc;
}

int ks_textstream_flush(ks_textstream *ts, ks_buf *out) {
    int rc = 0;
    if (ts->stopped) return 0;
    if (ts->n_raw) {
        ts->n_raw = 0;
        rc = push_text(ts, REPLACEMENT, 3, out);
        if (rc < 0) return rc;
        if (rc == 1) return 0;
    }
    if (ts->hold.len) {
        rc = emit(ts, ts->hold.s, ts->hold.len, out); /* 1: the indentation rule cut it */
        ks_buf_reset(&ts->hold);
    }
    return rc < 0 ? rc : 0;
}

const char *ks_textstream_text(const ks_textstream *ts, size_t *len) {
    if (len) *len = ts->all.len;
    return ts->all.s ? ts->all.s : "";
}

bool ks_textstream_stopped(const ks_textstream *ts) { return ts->stopped; }

int ks_textstream_stop_index(const ks_textstream *ts) { return ts->stop_index; }

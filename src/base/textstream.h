/*
 * textstream.h — turns a stream of token pieces into safe text.
 *
 * Token pieces may end inside a UTF-8 character and may contain invalid
 * bytes (random-weight models emit raw byte tokens); stop strings may span
 * several pieces. A ks_textstream holds back just enough bytes:
 *  1. an incomplete UTF-8 sequence at the end is held until completed;
 *     invalid bytes become U+FFFD, so emitted text is always valid UTF-8
 *     (JSON encoders refuse anything else);
 *  2. a suffix that is a prefix of some stop string is held until it either
 *     completes the stop string (then it and everything after it is dropped,
 *     and feed() reports the stop) or stops matching (then it is emitted).
 *
 * Thread model: one stream per request, used by one thread at a time.
 */
#ifndef KS_TEXTSTREAM_H
#define KS_TEXTSTREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"

typedef struct ks_textstream ks_textstream;

/* stops: up to 16 strings, copied; an empty one, or one that is not valid
 * UTF-8 (it could only match inside a character), is ignored. NULL on
 * ENOMEM. */
ks_textstream *ks_textstream_create(const char *const *stops, int n_stops);
void ks_textstream_free(ks_textstream *ts);
/* Feeds one piece; appends the text that is safe to emit to out.
 * Returns 1 when a stop string completed (nothing after it is emitted,
 * the stream is finished), 0 otherwise, KS_ENOMEM on allocation failure. */
int ks_textstream_feed(ks_textstream *ts, const char *piece, size_t len, ks_buf *out);
/* End of generation: emits what was held back (an incomplete UTF-8 tail
 * becomes U+FFFD; a partial stop-string match is plain text after all). */
int ks_textstream_flush(ks_textstream *ts, ks_buf *out);
/* All text emitted so far (valid UTF-8, NUL-terminated, borrowed). */
const char *ks_textstream_text(const ks_textstream *ts, size_t *len);
bool ks_textstream_stopped(const ks_textstream *ts);
/* The index (in create's stops) of the stop string that ended the stream,
 * the earliest in the text (the first given on a tie); -1: none;
 * KS_TEXTSTREAM_STOP_INDENT: the indentation rule below. */
int ks_textstream_stop_index(const ks_textstream *ts);
#define KS_TEXTSTREAM_STOP_INDENT (-2)
/* llama-server's n_indent (code completion): after the first line, a line
 * whose first character that is not a space or tab comes after fewer than n
 * of them ends the text just before that character (the stream stops, as
 * at a stop string). Applied to the text as it is emitted, after the stop
 * strings. n <= 0: off (the default). */
void ks_textstream_set_indent(ks_textstream *ts, int n);

/* Removes, in place, every byte of s[0, n) that is not part of a valid
 * UTF-8 sequence (RFC 3629: no overlong forms, surrogates or values past
 * U+10FFFF) and writes a NUL at the new end (s must have room for n + 1
 * bytes). Returns the new length. For text cut at a byte limit, which may
 * end inside a character. Reentrant. */
size_t ks_utf8_scrub(char *s, size_t n);

#endif

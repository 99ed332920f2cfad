/*
 * reply.h — a generation's reply, whole or streamed, through its format's
 * table (fmt.h): each choice's text through the output module (output.h)
 * into the table's calls, in the order fmt.h's F1 promises, and a choice
 * that failed as the error the client is told.
 *
 * The generation (gen.c) owns a ks_reply and hands it, on its connection
 * thread, what each choice produced since the last call; nothing here
 * waits, locks or knows the scheduler, so a unit test drives it with a
 * recording table (tests/unit/test_reply.c).
 *
 * Thread model: one connection thread.
 */
#ifndef KS_REPLY_H
#define KS_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "server/fmt.h"

typedef struct ks_reply ks_reply;

/* How a choice ended (borrowed for the call). */
/* A reply ended by t_max_predict_ms (gen.c), as the textstream's own codes
 * (textstream.h: KS_TEXTSTREAM_STOP_INDENT) a limit. */
#define KS_REPLY_STOP_TIME (-3)

typedef struct ks_reply_end {
    const ks_req_result *r;
    bool stopped;          /* a stop string ended it */
    int stop_index;        /* which (the request's stops, then the template's), -1: none;
                              KS_TEXTSTREAM_STOP_INDENT (n_indent), KS_REPLY_STOP_TIME
                              (t_max_predict_ms): limits, "length" */
    bool failed;           /* its text could not be kept (out of memory) */
} ks_reply_end;

/* A reply in fmt's format, with the format's state st (stolen: freed with
 * the reply, also on failure). g: copied; its strings borrowed for the
 * reply's life. parse: the template's parse options (borrowed), NULL: plain
 * text; continuation: the last assistant message is continued (the
 * template's render said so). NULL on ENOMEM. */
ks_reply *ks__reply_create(const ks_fmt *fmt, void *st, const ks_fmt_gen *g, const char *parse, bool continuation);
/* NULL-safe. */
void ks__reply_free(ks_reply *rp);

/* The stream's first events. */
int ks__reply_start(ks_reply *rp, ks_buf *out);
/* What choice i produced since the last call: text[0, len) and logprob
 * entries lp (stolen, NULL: none); end: it is done (NULL: not yet). Its
 * deltas, and once done its end (or its error), go to out. Entries that
 * have no delta to ride on wait for the next one (or the choice's end).
 * 0, or KS_ENOMEM / KS_EINVAL. */
int ks__reply_choice(ks_reply *rp, int i, const char *text, size_t len, json_t *lp, const ks_reply_end *end,
                     ks_buf *out);
/* Whether choice i's end (or error) is out. */
bool ks__reply_finished(const ks_reply *rp, int i);
/* The stream's last events, once every choice is finished; nothing after
 * a choice's error (fmt.h F1). */
int ks__reply_done(ks_reply *rp, const ks_req_result *total, ks_buf *out);

/* The whole reply of every choice: texts[i], its logprob entries lps[i]
 * (borrowed; NULL: none asked) and how it ended, ends[i]. A new reference,
 * or NULL with e filled: the error of the first choice that failed, or 500
 * when the reply cannot be encoded. */
json_t *ks__reply_whole(ks_reply *rp, const char *const *texts, json_t *const *lps, const ks_reply_end *ends,
                        const ks_req_result *total, ks_api_error *e);

#endif

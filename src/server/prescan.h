/*
 * prescan.h — a request sized from its raw body bytes, before the JSON is
 * parsed, and while the body still comes in (issue 28: 3,000 tools, a
 * 1.6 MB body, took 12 MB to parse, 6,000 tools 24 MB, 100,000 short
 * messages 110 MB, before the size bound refused them).
 *
 * NOTES ON THE DESIGN OF THE PRESCAN
 *
 * presize.h bounds what a chat template renders from the strings it is
 * known to copy; it reads the parsed chat request. The prescan computes the
 * same bound from the body's bytes, for each wire format's own shape, with
 * a scanner that allocates nothing: it walks the JSON once, keeps a cursor
 * and a few counters, and decodes strings only to measure them. The server
 * runs it twice over: on the body's prefix while the body comes in (each
 * time the buffered body has doubled past the bound; ks_prescan_prefix_bytes
 * counts what the prefix holds whole), so that a request refused there
 * stops being buffered — the rest is read and dropped, as a body over the
 * limit is — and on the whole body before json_loadb builds its tree. A
 * refused request costs at most about twice the bytes at which its known
 * strings passed the bound, however long its body.
 *
 * Invariants
 *  1. Sound: the count of a valid request, or of any prefix of it, is at
 *     most ks_presize_bytes of the chat request its format's parser makes of
 *     it — with one exception: tools count whole, as they come, whatever
 *     tool_choice (which may come after them) says; a named tool_choice
 *     makes the parsers keep only that tool, but OpenAI and Anthropic render
 *     every tool for the model, and a tools array longer than the context is
 *     refused as they refuse it. Each string counted is one the parser hands
 *     the template, unchanged, in a place presize counts (message contents
 *     of the roles it counts, trimmed; function tools' names, descriptions,
 *     parameter names and descriptions); where the parser may drop or
 *     replace a string, it is not counted: tools of types the parser drops
 *     or renames, parts and blocks that are not text. Content parts count
 *     each trimmed, which is at most the trimmed text they join to. A
 *     message, part or tool counts only once its object is closed (its role
 *     or type may come last), so a prefix counts nothing of what it cuts.
 *  2. A whole body the scanner does not follow (not JSON, nested deeper
 *     than it tracks, a string with \u0000 or a lone surrogate, which the
 *     parser refuses anyway) counts 0: the parser reports it as before. A
 *     prefix counts what it holds whole up to the first byte it does not
 *     follow (an invalid body whose valid start is already too long is
 *     refused as too long; with duplicate keys, which the parser refuses, a
 *     string may count twice).
 *  3. Linear in the body, no allocation, no recursion deeper than
 *     KS_PRESCAN_MAX_DEPTH.
 *
 * Thread model: pure; any thread.
 */
#ifndef KS_PRESCAN_H
#define KS_PRESCAN_H

#include <stddef.h>

#include "prompt/presize.h"

#define KS_PRESCAN_MAX_DEPTH 64

typedef enum {
    KS_PRESCAN_NONE = 0,  /* not sized (completions: its prompt is one string, bounded after the parse) */
    KS_PRESCAN_CHAT,      /* OpenAI chat completions */
    KS_PRESCAN_RESPONSES, /* OpenAI Responses */
    KS_PRESCAN_MESSAGES,  /* Anthropic Messages (and count_tokens) */
} ks_prescan_shape;

/* The lower bound, in bytes, of what the template renders for the request
 * in body[0, len) of the given shape, counting the kinds p says the
 * template copies. 0 when nothing is counted or the body is not followed
 * (invariant 2). */
size_t ks_prescan_bytes(const ks_presize *p, ks_prescan_shape shape, const char *body, size_t len);

/* Both counts of one scan. items: the keys and values the body holds, or
 * its prefix (up to the first byte not followed): each becomes at least one
 * allocation of the parser (up to ~230 bytes for an empty object), so their
 * number bounds what the parse costs, whatever the bytes (15 MB of "{}," is
 * 5 million objects: 1.1 GB parsed). Any shape (KS_PRESCAN_NONE: items only). */
typedef struct ks_prescan_counts {
    size_t bytes; /* ks_prescan_bytes, or with prefix ks_prescan_prefix_bytes */
    size_t items;
    /* The bytes of the body's top-level values the shape's walk does not
     * read (sampling fields, response formats, grammars, metadata, unknown
     * fields: nothing the template renders), whole values only; 0 for
     * KS_PRESCAN_NONE. */
    size_t other;
    size_t other_items; /* the keys and values among them (a JSON schema's nodes) */
} ks_prescan_counts;
void ks_prescan_count(const ks_presize *p, ks_prescan_shape shape, const char *body, size_t len, bool prefix,
                      ks_prescan_counts *out);
/* The same count of what body[0, len), the start of a body still coming
 * in, holds whole (invariant 1): never more than the whole body's. */
size_t ks_prescan_prefix_bytes(const ks_presize *p, ks_prescan_shape shape, const char *body, size_t len);

#endif

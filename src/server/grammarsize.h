/*
 * grammarsize.h — a request's raw GBNF grammar sized before llama.cpp parses
 * it (issue 42), as schemasize.h sizes JSON schemas.
 *
 * llama.cpp's grammar code has costs that a short text can make huge, on
 * threads every request waits for (measured here, the pinned release):
 *   - parsing recurses once per nested group: 60,000 nested parentheses
 *     (a 120 KB grammar) overflow the thread's stack — the server dies
 *     (SIGSEGV);
 *   - setting up the grammar and each sampling step keep one "stack" per way
 *     the grammar can continue, deduplicated by a linear search (quadratic):
 *     a rule of 20,000 alternatives took 4.1 s, and 300 alternatives that each
 *     start with a rule of 300 alternatives (90,000 stacks from a 5.8 KB
 *     grammar) 70 s, on the inference thread, which every slot waits for.
 *
 * So a grammar is read here first, in time linear in its bytes and never
 * recursing with its nesting, and refused when it passes:
 *   - KS_GRAMMAR_MAX_BYTES bytes;
 *   - KS_GRAMMAR_MAX_DEPTH nested groups;
 *   - KS_GRAMMAR_MAX_FANOUT ways to continue from any one position: the
 *     number of stacks llama.cpp makes when it expands a rule reference there
 *     (a reference to a rule of n alternatives is n; each alternative that
 *     starts with another reference, that rule's count; an empty alternative
 *     or optional element, the count of what follows it), computed over every
 *     position of every rule, with groups and repetitions made rules as
 *     llama.cpp makes them.
 * A grammar with left recursion is left to llama.cpp, which refuses it.
 * What the fan-out does not bound: a grammar whose ambiguity keeps many
 * stacks alive across steps (a? a? a? …) grows them with the text, as in
 * llama.cpp's own issue 4218; the bytes limit keeps that to a grammar a
 * client can write by hand (docs/SECURITY.md).
 *
 * Thread model: pure; any thread.
 */
#ifndef KS_GRAMMARSIZE_H
#define KS_GRAMMARSIZE_H

#include <stddef.h>

#define KS_GRAMMAR_MAX_BYTES (256 * 1024)
#define KS_GRAMMAR_MAX_DEPTH 128
#define KS_GRAMMAR_MAX_FANOUT 4096

/* 0 when gbnf (len bytes) is within the limits; KS_EINVAL with why (a
 * sentence naming the limit, and the rule where it was passed) filled; or
 * KS_ENOMEM. A grammar that does not parse passes (llama.cpp's parser gives
 * the reason). *fanout (may be NULL): the largest fan-out found. */
int ks_grammar_size_check(const char *gbnf, size_t len, size_t *fanout, char *why, size_t why_len);

#endif

/*
 * schemasize.h — a request's JSON schemas sized before any grammar is built
 * from them (issue 28). The schema of response_format (json_schema, text.format,
 * output_config.format) and every tool's parameters become a grammar, in
 * llama.cpp's converter and then its grammar sampler, in a time that grows
 * faster than the schema: on the test machine 1,000 optional properties took
 * 7.4 s to convert (on the connection's thread, holding a render place),
 * an enum of 10,000 values 7.5 s and a pattern of nested quantifiers
 * (a{0,1000}){0,1000} 3.1 s to sample one token (on the inference thread,
 * which every slot waits for); 100,000 values did not finish in a minute.
 *
 * The limits are OpenAI's published limits of Structured Outputs, which
 * clients written for OpenAI already keep, and two that OpenAI needs not
 * state because its strict mode has neither (optional properties, nested
 * quantifiers):
 *   - at most KS_SCHEMA_MAX_PROPERTIES object properties in all;
 *   - at most KS_SCHEMA_MAX_ALTERNATIVES enum values, anyOf and oneOf
 *     branches in all;
 *   - at most KS_SCHEMA_MAX_STRING bytes of property names, definition
 *     names, enum and const strings in all;
 *   - nesting of at most KS_SCHEMA_MAX_DEPTH schemas;
 *   - at most KS_SCHEMA_MAX_OPTIONAL properties not in `required` in one
 *     object (the converter chains each to every later one);
 *   - a pattern's nested quantifiers multiplying to at most
 *     KS_SCHEMA_MAX_REPEAT (each counted up to 2,000, past which llama.cpp
 *     makes a repetition unbounded).
 * "In all" is over the request: its response format and every tool.
 *
 * Thread model: pure; any thread.
 */
#ifndef KS_SCHEMASIZE_H
#define KS_SCHEMASIZE_H

#include <jansson.h>
#include <stddef.h>

#define KS_SCHEMA_MAX_PROPERTIES 5000
#define KS_SCHEMA_MAX_ALTERNATIVES 1000
#define KS_SCHEMA_MAX_STRING 120000
#define KS_SCHEMA_MAX_DEPTH 32
#define KS_SCHEMA_MAX_OPTIONAL 256
#define KS_SCHEMA_MAX_REPEAT 10000

/* What a request's schemas add up to so far (zero it before the first). */
typedef struct ks_schema_size {
    size_t properties, alternatives, strings;
} ks_schema_size;

/* Adds schema (any JSON value: an object is a schema, anything else adds
 * nothing) to *sz and checks the limits. 0, or KS_EINVAL with why (a
 * sentence naming the limit and where in the schema it was passed, from
 * its root "") filled. */
int ks_schema_size_add(ks_schema_size *sz, const json_t *schema, char *why, size_t why_len);

/* The product of a regular expression's nested quantifiers (each counted
 * up to 2,000; the largest product over its groups), at least 1. */
size_t ks_schema_pattern_repeat(const char *pattern);

#endif

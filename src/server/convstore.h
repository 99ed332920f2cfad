/*
 * convstore.h — the conversations behind Responses API ids, for
 * previous_response_id: each stored response maps to the chat messages that
 * led to it and its own output (the next request's history).
 *
 * In memory only, bounded: at most max_entries conversations, each kept for
 * ttl_s seconds after it was stored; beyond the count the oldest goes first.
 * A forgotten id is a 400 previous_response_not_found for the client (fmt_responses.c),
 * never a silent fresh start. A restart forgets every id. The KV of those
 * conversations is the cache's business (slots, IMC, the store), not this
 * module's: a forgotten id loses the messages, not cached tokens.
 *
 * Each conversation belongs to the tenant that made it (docs/SECURITY.md):
 * another tenant's get finds nothing, exactly as for an id never issued.
 * Ids are the server's (ks_api_make_id: 128 random bits), so they cannot
 * be guessed either.
 *
 * Thread model: every call is safe from any thread (one mutex).
 */
#ifndef KS_CONVSTORE_H
#define KS_CONVSTORE_H

#include <jansson.h>
#include <stdint.h>

typedef struct ks_convstore ks_convstore;

/* NULL on ENOMEM; max_entries 0 or ttl_s 0: keeps nothing. */
ks_convstore *ks_convstore_create(int max_entries, int ttl_s);
void ks_convstore_free(ks_convstore *cs);
/* Keeps msgs (a chat messages array; stolen) under id (copied) for tenant.
 * 0 or KS_ENOMEM. */
int ks_convstore_put(ks_convstore *cs, const char *id, uint64_t tenant, json_t *msgs);
/* The messages of id (new reference), NULL when unknown, expired, or
 * another tenant's. */
json_t *ks_convstore_get(ks_convstore *cs, const char *id, uint64_t tenant);
int ks_convstore_ttl(const ks_convstore *cs);

#endif

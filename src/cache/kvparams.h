/*
 * kvparams.h — what a state's kv-params say, for people and for misses.
 *
 * A key hashes the engine's kv-params string (key.h: K/V cache types,
 * n_ctx_seq, flash attention, the CPU build...), and a kvfile keeps only its
 * SHA-256 (kvfile.h). Two things need the words back:
 *  - `kvstash cache ls` and `verify` show each entry's K/V cache types. A
 *    store writes its params once per file-tier directory, as
 *    <dir>/params/<64 hex of the hash>.txt (the params string, nothing
 *    else), before it saves anything there; the CLI reads them back by the
 *    hash in each file's header. An entry whose params file is absent (saved
 *    before this, or the file removed) shows "?".
 *  - a miss that a state of other K/V types would have served says so
 *    (store.h ks_store_other_kv): the params string with another pair of
 *    types gives that state's key.
 *
 * The params string starts "type_k=K;type_v=V;" (engine.c
 * ks_engine_kv_params); a string that does not has no types here.
 *
 * Invariants
 *  1. A params file is written whole or not at all (a temporary file renamed
 *     over the name), and a reader takes it only when its SHA-256 is the
 *     name's hash: a damaged or foreign file reads as absent.
 *
 * Thread model: reentrant; several processes may register the same params
 * at once (the rename makes the last one win, with the same bytes).
 */
#ifndef KS_KVPARAMS_H
#define KS_KVPARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The KV cache types llama-server's -ctk/-ctv take, in its order. */
#define KS_KVPARAMS_N_TYPES 9
extern const char *const ks_kvparams_types[KS_KVPARAMS_N_TYPES];

/* Writes <dir>/params/<hex of hash>.txt holding params[0, len) unless a
 * good one is there. 0, or KS_EIO (logged at DEBUG by the caller: the
 * names are a convenience, never needed to serve). */
int ks_kvparams_register(const char *dir, const uint8_t hash[32], const char *params, size_t len);

/* The params string registered in dir for hash into out (NUL-terminated):
 * 0, KS_ENOENT (none, or one that does not hash to hash), KS_EINVAL (out
 * too small). */
int ks_kvparams_lookup(const char *dir, const uint8_t hash[32], char *out, size_t n);

/* "K/V" of a params string into out ("q8_0/q8_0"): true, or false when the
 * string does not start with the two types. */
bool ks_kvparams_type_pair(const char *params, size_t len, char *out, size_t n);

/* params[0, len) with type_k=k and type_v=v instead of its own into out:
 * its length, or -1 when params has no types or out is too small. */
int ks_kvparams_with_types(const char *params, size_t len, const char *k, const char *v, char *out, size_t n);

#endif

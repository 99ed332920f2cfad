/*
 * keyring.h — the server's API keys and the tenant each one stands for
 * (docs/SECURITY.md "Tenants").
 *
 * Keys come from the command line or the YAML file (--api-key, repeatable;
 * api_key, api_keys) and from a key file (--api-key-file, api_key_file) that
 * the operator may rewrite at any time: it is read again, without a restart,
 * when its modification time, size or inode changed (looked at on each
 * check) or when ks_keyring_reload is called (SIGHUP).
 *
 * Key file: one key per line, optionally followed by whitespace and a tenant
 * name; blank lines and lines starting with '#' are ignored:
 *
 *   # key                          tenant name (optional)
 *   sk-2f9c0a...                   alice
 *   sk-77d1e0...                   alice      # a second key of the same tenant
 *   sk-0b4e61...
 *
 * A key is 1..255 printable ASCII bytes without whitespace; a name 1..127.
 *
 * Tenants
 *  1. No key at all: every request is allowed, tenant 0 (single tenant).
 *  2. Exactly one key given inline and no key file: tenant 0 too — one key
 *     holder is one tenant, and the cache keys stay what they were.
 *  3. Otherwise each key is a tenant: the id is a hash of its name when the
 *     file gives one (so keys with one name are one tenant, and a key can be
 *     rotated without losing the tenant's cache), else of the key itself.
 *     Ids are never 0.
 *  4. A key file that cannot be read or has a bad line is refused whole:
 *     at create, an error; on a reload, a warning, and the keys read last
 *     stay in force (a half-written file never locks everyone out, and never
 *     lets a removed key back in).
 *  5. Keys are checked as a secret is (issue 42): a key file must be a
 *     regular file of the server's user (or root) that neither its group nor
 *     others may write — else another local user could add a key and be
 *     served — checked at create (an error) and at every re-read (not read,
 *     a warning); one others may read is refused as well (as the cache
 *     secret file is), one its group may read taken with a warning. A key given
 *     twice, inline or in the file, is an error (under two names it would
 *     belong to whichever came last). (An empty --api-key or KVSTASH_API_KEY
 *     is the command line's to refuse: here "" is no key.)
 *
 * Thread model: every call is thread-safe (one mutex; a check holds it for a
 * stat and, on a change, the file's read). ks_keyring_reload only raises a
 * flag (the next check reads the file), so it may be called from anywhere.
 */
#ifndef KS_SERVER_KEYRING_H
#define KS_SERVER_KEYRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ks_keyring ks_keyring;

enum { KS_KEYRING_KEY_MAX = 255, KS_KEYRING_NAME_MAX = 127, KS_KEYRING_KEYS_MAX = 65536 };

/* keys: n_keys inline keys (copied; empty strings skipped); file: NULL or ""
 * for none (the path is copied). Returns 0 and *out (free with
 * ks_keyring_free), KS_EINVAL with the reason in err (a bad key, a key file
 * that cannot be read or has a bad line), KS_ENOMEM. */
int ks_keyring_create(const char *const *keys, int n_keys, const char *file, ks_keyring **out, char *err,
                      size_t errlen);
void ks_keyring_free(ks_keyring *k);
/* Whether any key is required (some key inline, or a key file). NULL: false. */
bool ks_keyring_required(const ks_keyring *k);
/* Checks key (NULL: none given) against the keys in force, in time that does
 * not depend on where the keys differ. true: allowed, *tenant set (note
 * "Tenants"); false: refused. Reads the key file first when it changed. A
 * NULL keyring allows everything as tenant 0. */
bool ks_keyring_check(ks_keyring *k, const char *key, uint64_t *tenant);
/* A key no API key may be, now or after a re-read of the key file (the
 * metrics key: every tenant's counters behind one tenant's key). 0, or
 * KS_EINVAL (with err) when one is already; a re-read file holding it is
 * refused as a bad file. key NULL or "": nothing. */
int ks_keyring_forbid(ks_keyring *k, const char *key, char *err, size_t errlen);

/* The key file's name of tenant into out (n bytes): true, or false when
 * the file names no such tenant (inline keys and unnamed lines have none).
 * Thread-safe. */
bool ks_keyring_name(ks_keyring *k, uint64_t tenant, char *out, size_t n);

/* Have the next check read the key file again, changed or not. */
void ks_keyring_reload(ks_keyring *k);
/* The keys in force now (for the log and tests). */
int ks_keyring_count(ks_keyring *k);
/* The tenant id of a name or key (note "Tenants" 3): never 0. */
uint64_t ks_keyring_tenant_of(const char *name_or_key);
/* tenant subdivided by a request field's value (the server's tenant_by):
 * a hash of (tenant, field, value[0, n)), never 0 and never tenant. */
uint64_t ks_keyring_subtenant(uint64_t tenant, const char *field, const char *value, size_t n);

#endif

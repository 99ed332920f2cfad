/*
 * fingerprint.h — a model's identity for cache keys: 32 bytes that change
 * whenever the model's metadata, tensor layout or weights change.
 *
 * The fingerprint is the SHA-256 of:
 *   "kvstash-model-fp-v1" ‖ file size ‖ GGUF version, alignment, data offset
 *   ‖ every metadata key/value (key, type, value; arrays element by element)
 *   ‖ every tensor descriptor (name, type, dims, offset, size)
 *   ‖ four 64 KiB samples of the tensor data at evenly spaced offsets
 *     (first, 1/3, 2/3, last), each preceded by its offset.
 * The samples make two random-weight models that differ only in their seed
 * fingerprint differently, without reading gigabytes.
 *
 * It is read with gguf.h only (metadata, no_alloc) — never llama.h — so it
 * costs milliseconds plus four 64 KiB reads. The cached variant also keeps
 * the result in <cache_dir>/fingerprints/<hash of the real path>.fp, keyed by
 * the path, size, mtime and inode, so a restart does not even do that.
 *
 * Invariants
 *  1. The same file gives the same fingerprint in every process and host.
 *  2. A cached fingerprint is used only when path, size, mtime (ns), inode
 *     and device all match the file now; any doubt recomputes. A file
 *     modified less than 3 s ago is not cached (a rewrite within the same
 *     clock tick would keep its mtime).
 *
 * Thread model: reentrant.
 */
#ifndef KS_FINGERPRINT_H
#define KS_FINGERPRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Computes the fingerprint of a GGUF file. Returns 0, KS_ENOENT (no such
 * file), KS_EMODEL (not a readable GGUF file), KS_EIO, KS_ENOMEM; message in
 * err. */
int ks_model_fingerprint(const char *gguf_path, uint8_t out[32], char *err, size_t errlen);

/* Same, through the cache in <cache_dir>/fingerprints/ (cache_dir NULL or "":
 * no cache). A cache that cannot be read or written is ignored (DEBUG log).
 * *from_cache (may be NULL) tells whether the cached value was used. */
int ks_model_fingerprint_cached(const char *gguf_path, const char *cache_dir, uint8_t out[32],
                                bool *from_cache, char *err, size_t errlen);

#endif

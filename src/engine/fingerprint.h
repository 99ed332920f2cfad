/*
 * fingerprint.h — a model's identity for cache keys: 32 bytes that change
 * whenever the model's metadata, tensor layout or weights change.
 *
 * The fingerprint is the SHA-256 of:
 *   "kvstash-model-fp-v2" ‖ file size ‖ GGUF version, alignment, data offset
 *   ‖ every metadata key/value (key, type, value; arrays element by element)
 *   ‖ every tensor descriptor (name, type, dims, offset, size)
 *   ‖ the length and XXH3-128 of ALL the tensor data.
 * Every byte that determines the model's output is in it: two models that
 * differ in one weight anywhere (a fine-tune or merged LoRA that keeps the
 * metadata) never share a state. (v1 hashed four 64 KiB samples of the data,
 * which let such models collide: issue 13.)
 *
 * The metadata is read with gguf.h only (no_alloc) — never llama.h — and the
 * data streamed in 4 MiB reads through XXH3: about a second for a few GB in
 * the page cache (docs/LLAMA_FACTS.md). The cached variant keeps the result
 * in <cache_dir>/fingerprints/<hash of the real path>.fp, keyed by the path,
 * size, mtime and inode, so a restart does not rehash.
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

/* What a model takes in memory once loaded, estimated from its GGUF: the
 * file's bytes (the weights) and an F16 KV of n_ctx positions for n_seq
 * sequences (the attention shape of the metadata). 0, KS_ENOENT, KS_EIO, or
 * KS_EMODEL (not a readable GGUF: *bytes is then the file's size); err says
 * why. */
int ks_model_estimate_bytes(const char *gguf_path, int n_ctx, int n_seq, int64_t *bytes, char *err,
                            size_t errlen);

#endif

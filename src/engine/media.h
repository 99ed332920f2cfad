/*
 * media.h — images and audio in the prompt: a projector (llama.cpp's mtmd,
 * "--mmproj FILE") beside the engine's text model, and each media item as
 * pseudo-tokens in the prompt's token array so that every cache layer keeps
 * working on exact int32 tokens.
 *
 * Owns: the projector's mtmd context (one per engine, opened by
 * ks_engine_open when ks_engine_params.mmproj_path is set), the media sets
 * (one per prompt: the side table from pseudo-token runs to mtmd's chunks and
 * their encoded embeddings), and the media counters.
 *
 * Design notes
 *  1. Pseudo-tokens. A media chunk that takes n KV cells is n tokens in the
 *     prompt, each a negative int32 (never a token id of any vocabulary):
 *     KS_MEDIA_TOK | 31 bits, from a 64-bit hash H of the decoded content
 *     (an image's RGB bytes and size, an audio clip's PCM samples), of the
 *     projector file's bytes and of the chunk's ordinal within its item:
 *     token 0 carries H's low 31 bits, token 1 the next 31, token i >= 2 a mix
 *     of H and i. So the same image in the same place gives the same tokens in
 *     any process or host (slot prefix reuse, IMC, SPC, the store's exact keys
 *     and Redis all find it), and two different images diverge at their first
 *     or second token (a 2^-62 chance otherwise).
 *  2. Positions. kvstash counts tokens everywhere (the scheduler's and the
 *     cache's lengths, trims, keys and states are per token); a token's KV
 *     position is its index, except after the images of an M-RoPE projector
 *     (Qwen2-VL and kin: mtmd_decode_use_mrope). Such an image of nx x ny
 *     tokens takes n_pos = max(nx, ny) positions: each of its rows gets 4
 *     (pos0, pos0 + y, pos0 + x, 0: mtmd_image_tokens_get_decoder_pos), so
 *     every one of its KV cells has position pos0 (the mask orders them by
 *     (y, x), causally), and the text after it goes on at pos0 + n_pos. So
 *     ks_media_set_kv_pos(set, i) = i - sum of (n - n_pos) over the runs that
 *     end at or before i (a row inside such a run: the run's pos0), the
 *     identity when no run takes fewer positions than tokens (every other
 *     projector, text-only prompts). Every position handed to llama.cpp (a
 *     decode, a seq_rm, the expected end of a sequence) goes through it, with
 *     the set of the request whose prompt the slot's tokens are a prefix of.
 *     A state carries its cells' positions, and the mapping is a function of
 *     the tokens (the same pseudo-tokens are the same runs), so states saved
 *     and restored anywhere agree. Such a run is whole (note 2a: a cut
 *     inside it would remove every row, by position), decoded causally.
 *     M-RoPE with a sliding window is refused at open (the window rules
 *     count tokens; llama.cpp cannot shift M-RoPE positions).
 *  2a. Whole runs. A chunk mtmd decodes with non-causal attention (Gemma 3's
 *     projector: mtmd_decode_use_non_causal) has rows that attend to the rows
 *     after them, so its rows computed in pieces are not its rows computed
 *     whole. Such a run is "whole": it is always decoded in one llama_decode
 *     of exactly its rows [pos, pos + n), causal attention off for that call
 *     (llama_set_causal_attn, as mtmd-helper's mtmd_helper_decode_image_chunk
 *     does), whether the prompt before it was cached or not. An M-RoPE image
 *     (note 2) is whole too, but causal: one ks_media_decode of all its rows,
 *     in calls of n_batch rows from its first (no size limit). For a
 *     non-causal run llama.cpp
 *     aborts a non-causal batch larger than n_ubatch (= the engine's
 *     n_batch), so ks_media_tokenize refuses a whole chunk of more than
 *     n_batch tokens. No cache may end strictly inside a whole run:
 *     ks_media_set_cut moves such a prefix length back to the run's start
 *     (the scheduler applies it to every reuse, copy, restore and pin), and
 *     ks_media_decode refuses any other range of a whole run. The sequence
 *     before the run is exact (each token at its KV position, the same bits
 *     cached or not) and the calls are the same, so the run's rows are too.
 *  3. Prefill. The scheduler decodes a media run's rows [p0, p1) with
 *     ks_media_decode: the chunk is encoded once per set (the embeddings kept
 *     in the set), then its rows go to llama_decode as embeddings in batches
 *     of at most n_batch rows, alone in their decode calls. The attention is
 *     causal and every row's bits do not depend on the batch (the engine's
 *     exactness modes), so decoding rows [k, n) after a restored [0, k) gives
 *     the bits of decoding [0, n): a cached prefix may end inside a run
 *     (except a whole run: note 2a).
 *     With pairs (a backend that is not batch-invariant), every call holds at
 *     least two rows: a last lone row gets a throwaway copy at the next
 *     position, removed after (sched/step.c's rule, for embeddings).
 *  4. Encoding is deterministic: the projector runs on the CPU backend with
 *     the same graph for the same input (docs/LLAMA_FACTS.md, "mtmd").
 *
 * Thread model: ks_media_tokenize, the set accessors and ks_media_set_ref /
 * _unref are safe from any thread (mtmd's tokenizer is, the set's count is
 * atomic). ks_media_decode and ks_media_stats_get belong to the inference
 * thread (the engine's context); a set is read by the inference thread only
 * after the submit that handed it over.
 */
#ifndef KS_MEDIA_H
#define KS_MEDIA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/base.h"

typedef struct ks_engine ks_engine;
typedef struct ks_media ks_media;         /* a projector (owned by its engine) */
typedef struct ks_media_set ks_media_set; /* one prompt's media (reference-counted) */

/* The bit every pseudo-token has: pseudo-tokens are the negative int32s. */
#define KS_MEDIA_TOK ((int32_t)INT32_MIN)

static inline bool ks_token_is_media(int32_t t) { return t < 0; }

/* mtmd's default marker, "<__media__>": one in the prompt text per item. */
const char *ks_media_marker(void);

/* One media item: the bytes of a file (PNG, JPEG, GIF, BMP, ... for images;
 * WAV, MP3, FLAC for audio), borrowed for the call. */
typedef struct ks_media_item {
    const uint8_t *data;
    size_t len;
} ks_media_item;

/* The engine's projector, NULL when it has none. Borrowed, valid until
 * ks_engine_free. */
ks_media *ks_engine_media(const ks_engine *e);
/* Opens the projector at path for e when ks_engine_params.mmproj_path was
 * not given (the server learns a models.<name>.mmproj only from the model's
 * name). Errors as ks_engine_open's for it (KS_ENOENT, KS_EMODEL with the
 * reason), KS_EINVAL when e has a projector already. Before e is used by a
 * scheduler (the thread that opened e). */
int ks_engine_media_open(ks_engine *e, const char *path, char *err, size_t errlen);
bool ks_media_vision(const ks_media *m);
bool ks_media_audio(const ks_media *m);
/* Whether the text model takes media with M-RoPE (note 2). */
bool ks_media_mrope(const ks_media *m);
/* The projector file's XXH3-64 (its identity in every pseudo-token). */
uint64_t ks_media_proj_hash(const ks_media *m);

/* Tokenizes a prompt whose text holds one ks_media_marker() per item, in the
 * order of items: text tokens (add_special / parse_special as
 * ks_engine_tokenize) and each media chunk's pseudo-tokens are appended to
 * out; *set gets the prompt's media set (owned: one reference, drop it with
 * ks_media_set_unref), NULL when n_items is 0. Items are decoded here (a
 * corrupt file never reaches the encoder); nothing is encoded.
 * Errors: KS_EINVAL with the reason in err (markers and items differ in
 * number; an item that is not an image or audio file mtmd decodes; audio for
 * a projector without audio or an image for one without vision; chunks whose
 * positions differ from their tokens other than M-RoPE images: note 2; a
 * non-causal chunk, note 2a, of more
 * tokens than the engine's n_batch), KS_ENOMEM. On error out keeps what it had and *set is NULL. Any thread. */
int ks_media_tokenize(ks_media *m, const char *text, size_t len, bool add_special, bool parse_special,
                      const ks_media_item *items, int n_items, ks_tokens *out, ks_media_set **set, char *err,
                      size_t errlen);

/* Takes one more reference (returns set); NULL is a no-op. */
ks_media_set *ks_media_set_ref(ks_media_set *set);
/* Drops one; the last frees the set, its chunks and embeddings. NULL: no-op. */
void ks_media_set_unref(ks_media_set *set);

/* The items, as tokenized. item_hash is the 64-bit hash of note 1 (content
 * and projector), for message hashes (IMC): equal for equal decoded content. */
int ks_media_set_n_items(const ks_media_set *set);
uint64_t ks_media_set_item_hash(const ks_media_set *set, int i);

/* The runs: chunk k covers prompt positions [pos, pos + n) (ascending, not
 * overlapping). */
int ks_media_set_n_runs(const ks_media_set *set);
void ks_media_set_run(const ks_media_set *set, int k, int *pos, int *n);
/* The KV position of prompt token i (note 2): i, less the positions the
 * M-RoPE runs ending at or before i save; a token inside such a run: the
 * run's first position. i == n (one past the end): where the next token
 * goes. NULL set: i. */
int ks_media_set_kv_pos(const ks_media_set *set, int i);
/* Whether some run takes fewer KV positions than tokens (note 2): else
 * ks_media_set_kv_pos is the identity. NULL: false. */
bool ks_media_set_shifts(const ks_media_set *set);
/* The run holding prompt position p, -1 when none. */
int ks_media_set_find(const ks_media_set *set, int p);
/* Whether run k must be decoded whole and never cut (note 2a): a non-causal
 * run (one call, causal attention off) or an M-RoPE image (note 2). */
bool ks_media_set_run_whole(const ks_media_set *set, int k);
/* The longest prefix length <= n that a cache may end at (note 2a): n, or the
 * start of the whole run that holds both positions n - 1 and n. NULL set: n. */
int ks_media_set_cut(const ks_media_set *set, int n);
/* Whether every pseudo-token of toks[0, n) lies in one of the set's runs and
 * equals the token the run put there, and every run that starts before n
 * ends at or before n with all its tokens there (a run is never cut by text
 * or by the end of toks). set may be NULL: then whether toks has no
 * pseudo-token at all. */
bool ks_media_set_covers(const ks_media_set *set, const int32_t *toks, int n);

/* Decodes prompt rows [p0, p1) of the set's run k (p0 >= its pos, p1 <= its
 * end) into sequence seq at their KV positions (notes 2, 3): encodes the chunk first
 * if this set has not yet (*encoded then true; may be NULL). pairs: no decode
 * call holds a single row (only for memories that can drop the throwaway
 * row, ks_engine_partial_rm_ok: else KS_EINVAL after the decode, the
 * sequence holding one row too many). A whole run (note 2a) takes only its
 * whole range, with no throwaway row, pairs or not (a non-causal one in one
 * call with causal attention off); the sequence must hold nothing at or after p0 (the caller's
 * duty: the run's rows would see it). Errors: KS_EINVAL (bad range; a part of
 * a whole run; a non-causal run of more rows than n_batch), KS_EDECODE (the
 * projector or llama_decode failed), KS_EFULL (no KV cell), KS_ENOMEM.
 * Inference thread. */
int ks_media_decode(ks_engine *e, ks_media_set *set, int k, int p0, int p1, int seq, bool pairs, bool *encoded);

typedef struct ks_media_stats {
    uint64_t encodes;        /* media chunks run through the projector */
    uint64_t encoded_tokens; /* their pseudo-tokens */
    double encode_ms_total;
    uint64_t decoded_tokens; /* media rows decoded into sequences */
} ks_media_stats;
/* Zeros when the engine has no projector. Inference thread (or after it stops). */
void ks_media_stats_get(const ks_engine *e, ks_media_stats *out);

/* ---- for engine.c ---- */
/* Opens the projector at path for engine e (its model and context exist):
 * KS_ENOENT, KS_EMODEL (mtmd refuses the file; M-RoPE with a sliding window,
 * note 2), KS_ENOMEM, with
 * the reason in err. n_threads: the encoder's threads. */
int ks__media_open(ks_engine *e, const char *path, int n_threads, bool gpu, ks_media **out, char *err,
                   size_t errlen);
void ks__media_close(ks_media *m);

#ifdef __cplusplus
}
#endif

#endif

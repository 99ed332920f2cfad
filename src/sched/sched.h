/*
 * sched.h — the inference scheduler: request queue, slots, continuous batching.
 *
 * Owns the inference thread, the slots and each slot's token list (the exact
 * tokens whose KV the slot's sequence holds). One ks_sched drives one
 * ks_engine; slot i uses sequence i.
 *
 * Slot life cycle (all transitions on the inference thread):
 *   IDLE --assign--> PREFILL --first token--> GENERATE --eog/length/cancel--> IDLE
 * An IDLE slot keeps its KV and token list (prompt + generated tokens that
 * were decoded) so that the next request can reuse the longest common prefix.
 *
 * Invariants
 *  1. slot.tokens[i] is exactly the token at index i of the slot's sequence,
 *     for i < slot.tokens.n; nothing else is in the sequence. Its KV position
 *     is i but after an M-RoPE image (engine/media.h note 2): always
 *     ks_media_set_kv_pos of the slot's media set (sched_int.h).
 *  2. A request is assigned only to an IDLE slot; every submitted request gets
 *     exactly one on_done call (also when canceled or failed), after which the
 *     scheduler never touches its callbacks again.
 *  3. Each llama_decode batch holds one token per generating slot plus prefill
 *     chunks of prefilling slots, at most n_batch tokens: a long prefill never
 *     stalls the other streams for more than one step. (A whole media run,
 *     engine/media.h note 2a, is one step of its own of up to n_batch rows,
 *     even where a prefill chunk would be smaller; an M-RoPE image, whole
 *     too, is one step of all its rows, in decode calls of n_batch.)
 *
 * Thread model: ks_sched_submit, ks_sched_cancel, ks_sched_slots and
 * ks_sched_stats are safe from any thread. Callbacks (on_token, on_probs,
 * on_progress, on_done) run on the inference thread; they must be quick and
 * must not call ks_sched_free.
 */
#ifndef KS_SCHED_H
#define KS_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "cache/store.h"
#include "engine/engine.h"
#include "engine/media.h"
#include "sched/drafter.h"

typedef struct ks_sched ks_sched;

/* Slots a scheduler can drive (the router's table is on the stack). */
#define KS_MAX_SLOTS 256
/* Checkpoints a slot can hold (ks_sched_params.ckpt_max). */
#define KS_SCHED_CKPT_MAX 32

typedef struct ks_sched_params {
    ks_engine *engine;     /* borrowed; must outlive the scheduler */
    int n_slots;           /* <= engine's n_seq and KS_MAX_SLOTS (default: all of them) */
    int max_queue;         /* requests waiting for a slot, >= 1; beyond: KS_EFULL (default 64) */
    bool cache_prompt;     /* server-wide switch; a request can only turn it off (default true) */
    float affinity_min;    /* prefer the slot with the longest common prefix only when it
                              covers at least this fraction of the prompt (default 0.05);
                              otherwise the least-recently-used idle slot */
    bool exact;            /* default true: cached, uncached and concurrent runs are
                              bit-identical. Free with a batch-invariant CPU backend (the
                              engine's probe); otherwise every sequence is decoded with
                              >= 2 rows per batch (see the note on exactness in step.c), and
                              false saves that extra row per generated token */
    /* Incremental Message Cache routing: slots follow conversation
     * branches, routed by message-prefix hash, token-prefix fallback. */
    bool imc;
    int cache_min_tokens;  /* IMC fallback threshold and SPC minimum (default 100) */
    /* Slot copies: a request whose prompt shares a longer prefix with another
     * slot (busy or idle) than with its own copies that slot's sequence
     * (state get + set: exact) when it gains at least this many tokens over
     * what its own slot keeps (default 16; 0: never copy, and followers
     * (share_prefill_of) do not wait for their leader). */
    int copy_min_tokens;
    /* System Prompt Cache: borrowed store of system-prompt states (NULL: off). */
    struct ks_spc *spc;
    /* Persistent tiered store (NULL: off), borrowed. Save points (savepoint.h):
     * cold (async) once per prefill: at the last stride boundary of the
     * prompt in a cold prefill (< one stride reused), else at the last
     * stride-aligned end of a chunk that is not the request's last (a warm
     * turn never pays an extra decode step for it; one prefilled in a single
     * chunk gets none), continued (async) every continued_interval
     * generated tokens, finish (async) at the end, evict (sync) before a
     * slot's unsaved KV is dropped, shutdown (sync) when the scheduler stops,
     * pin (async, not limited by store_min_tokens) at a request's cache pins
     * (ks_cache_pin). Looked up when the slot, IMC and SPC leave more than
     * the last token to prefill. */
    struct ks_store *store;
    int store_stride;          /* default 256 */
    int continued_interval;    /* 0: no continued saves (default 512) */
    int store_min_tokens;      /* no save below this (default 256) */
    bool save_on_shutdown;     /* default true */
    /* Checkpoints (hybrid models only, ks_engine_is_hybrid: a memory that
     * cannot drop a suffix). Per slot, in RAM: the sequence's partial state
     * (ks_engine_state_get_partial: the recurrent part alone, a fixed size
     * whatever the length) at the end of the system prompt (when it has at
     * least cache_min_tokens), at the end of each prompt and every
     * ckpt_gen_interval generated tokens (the last two of a reply kept). A
     * request whose common prefix ends inside the slot's tokens restores the
     * latest checkpoint at or before it and prefills from there
     * (cache_reason "checkpoint-at-token-K") instead of rebuilding the whole
     * sequence ("partial-rm-unsupported", what remains when none fits).
     * Beyond ckpt_max checkpoints or ckpt_bytes bytes per slot the lowest go
     * first; a state larger than ckpt_bytes is never taken. 0 for either:
     * no checkpoints. Ignored on other models (they trim in place). */
    int ckpt_max;              /* default 8, at most KS_SCHED_CKPT_MAX */
    size_t ckpt_bytes;         /* default 32 MiB */
    int ckpt_gen_interval;     /* default 16; 0: none while generating */
    /* Tenants (ks_req_params.tenant): true lets every tenant's request
     * restore a system prompt's SPC state whoever computed it (the operator
     * shares system prompts on purpose: docs/SECURITY.md); false (default):
     * SPC keys are per tenant like everything else. */
    bool share_system_prompt;
    /* Tests only: behave as if the memory could not remove a partial range
     * (recurrent/hybrid models), to exercise the full-rebuild fallback on
     * models that can. */
    bool simulate_no_partial_rm;
    /* Warm start (warm.c): at creation, before anything is served, up to
     * this many slots take the states most recently saved to or hit in the
     * store's file tiers (ks_store_recent: shm, disk), newest first, one per
     * conversation, so that a restarted process's first turn of each reuses
     * its slot as a warm process would. 0 (default): off; needs store. */
    int warm_slots;
    /* The finish save (a request's state at its end, KS_REASON_FINISH) is
     * copied after its on_done instead of before, so that the copy (0.7 s
     * for an 8B model's 7K tokens from a GPU) does not hold back the reply's
     * end. The save is still asked for (counted in store_save_requests)
     * before on_done, and taken before this thread does anything else; but
     * a caller that looks into the store right after on_done may not find
     * it yet. Default false (the server sets it). */
    bool finish_save_after_done;
    /* With finish_save_after_done: the finish save waits this long after the
     * request's end (policy.c "Deferred finish saves") and is not taken at
     * all when the slot's next request continues the conversation first (it
     * keeps at least half of the slot's tokens, same tenant, cache_prompt):
     * that request's own finish save follows, so an agent's next turn sent
     * right behind a reply never waits for a copy of the state it is about
     * to extend (on a GPU 0.5 s at 10K tokens of an 8B model). A save not
     * superseded is taken when due (idle or not), before anything else
     * changes the slot's KV, and at shutdown. 0: taken right after on_done.
     * Default 0 (the server sets store.finish_save_delay_ms). */
    int finish_save_delay_ms;
    /* Speculative decoding (step.c, "Speculation"): NULL: off. A generating
     * slot asks its drafter (one per slot, created on first use) for up to
     * draft_max tokens after its next token, decodes them in the same step
     * as its next token, samples each row in order with its own sampler and
     * keeps the drafted tokens up to the first one that differs from what
     * was sampled; the rows after it leave the KV. Every sampled token is
     * the one decoding without a draft would have sampled (the same rows,
     * the same sampler calls in the same order) on an engine whose rows do
     * not depend on the batch (ks_engine_exact_how INVARIANT: then a reply
     * is bit-identical with and without drafts); on others
     * (ks_sched_spec_status) it is only as exact as a prefill is. Off
     * where the memory cannot drop a suffix (recurrent, hybrid) and where
     * exactness takes pairs (step.c). */
    const struct ks_drafter_ops *drafter;
    void *drafter_cfg;     /* passed to drafter->create */
    int draft_max;         /* most tokens drafted per step (default 16) */
    int draft_min;         /* a shorter draft is not verified (default 0) */
    /* true (default): each step verifies the part of a draft that is worth
     * its cost, from the measured time of decodes by their rows and the
     * slot's measured acceptance (step.c "How much to draft"), so that
     * drafts the model rejects cost little; false: every draft is verified
     * whole (up to draft_max), for tests that must see drafts verified. */
    bool draft_adaptive;
} ks_sched_params;

ks_sched_params ks_sched_params_default(void);

typedef enum {
    KS_FINISH_STOP = 0,   /* end of generation token, or the caller stopped it (stop string) */
    KS_FINISH_LENGTH,     /* max_tokens reached */
    KS_FINISH_CANCEL,     /* canceled (client went away, shutdown) */
    KS_FINISH_ERROR       /* see result.error */
} ks_finish;

const char *ks_finish_name(ks_finish f); /* "stop", "length", "cancel", "error" */

/* Cache pins (Anthropic `cache_control` breakpoints). A pin asks the store to
 * keep the state of the prompt's prefix tokens[0, n_tokens) for at least
 * ttl_s seconds, protected from eviction within store.pin_share of each
 * tier's budget (store.h "Pins"): in the ram tier, and in the full store mode
 * also in the tier of reasons.pin (disk by default), so other processes and
 * restarts find it.
 *
 * For each pin of a request, at planning (after the slot's reuse and the
 * restores):
 *  - the state is stored or queued already: its pin is extended to now +
 *    ttl_s; nothing is copied or written ("refreshed");
 *  - n_tokens is beyond what the slot holds: a prefill chunk ends exactly at
 *    n_tokens (like the SPC capture point), and the state is copied there and
 *    saved pinned ("saved");
 *  - n_tokens is within the reused prefix (n_tokens <= n_cached) but the
 *    store does not hold it: the slot's whole state is copied, its sequence
 *    cut back to n_tokens (a partial llama_memory_seq_rm) for the pinned
 *    copy, and the whole state set again — exact (a state restore, as for a
 *    store hit), and the reuse is not shortened: no prompt token is computed
 *    twice. Where the memory cannot drop a suffix (recurrent models), or
 *    there is no memory for the copy, the reuse is cut back to the pin
 *    instead and the prompt prefilled from there (cache_reason
 *    "pin-at-token-N"; such a memory goes back to its latest checkpoint at
 *    or before the pin, "checkpoint-at-token-K" (ckpt_max), or without one
 *    rebuilds the whole sequence: "partial-rm-unsupported", n_cached 0).
 * The save is asynchronous: "saved" means handed to the store's writer,
 * which may still fail to write it (store stats count that). */
#define KS_MAX_CACHE_PINS 8

typedef struct ks_cache_pin {
    int n_tokens; /* 0 < n_tokens <= the request's n_tokens */
    int ttl_s;    /* > 0 */
} ks_cache_pin;

typedef struct ks_req_result {
    uint64_t id;
    int slot;
    int n_prompt;
    int n_cached;          /* prompt tokens whose KV was reused */
    int n_generated;
    double queue_ms;       /* submit -> slot assigned */
    double prompt_ms;      /* slot assigned -> first token sampled (prefill) */
    double ttft_ms;        /* submit -> first token sampled */
    double gen_ms;         /* first token -> done */
    ks_finish finish;
    bool eog;              /* finish == KS_FINISH_STOP by an end-of-generation token (not
                              by the caller's on_token) */
    int error;             /* KS_E* when finish == KS_FINISH_ERROR */
    char cache_mode[24];   /* "prefix", "miss", "copy" (from another slot), ... */
    char cache_reason[48]; /* why not more was cached, "" when fully cached */
    char cache_tier[8];    /* "store" mode: the tier it came from ("ram", "shm", "disk") */
    double restore_ms;     /* state restore time (store, slot copy; not SPC), included in prompt_ms */
    /* Cache pins (0 when the request has none, or they were ignored: no store,
     * cache_prompt false). n_cache_written: prompt tokens newly written to the
     * cache for the request's pins: for the deepest pin saved (not merely
     * refreshed), its n_tokens - n_cached, 0 when negative; 0 when every pin
     * was held already (Anthropic's cache_creation_input_tokens; n_cached is
     * cache_read). n_pinned: the deepest pin position the store holds after
     * the request, saved or refreshed (0: none). */
    int n_cache_written;
    int n_pinned;
    const float *logits;   /* want_logits: the first sampled token's logits (n_vocab), borrowed
                              for the duration of on_done; else NULL */
    int n_vocab;
    /* Speculative decoding: tokens drafted and verified, and of them the
     * ones kept (each a generated token that took no decode step of its own). */
    int n_drafted;
    int n_draft_accepted;
    /* Not the scheduler's: the HTTP server's note for the reply's cache
     * object (the scheduler leaves it false). */
    bool tools_ignored;    /* the request's tools were not rendered: the chat template renders none */
} ks_req_result;

typedef struct ks_req_params {
    const int32_t *tokens;  /* the whole prompt; copied by submit */
    int n_tokens;
    int max_tokens;         /* >= 1 */
    ks_sample_params sample;
    /* Sampling beyond `sample`: grammar, logit bias, penalties, ignore_eos,
     * log-probabilities (engine.h). Deep-copied by submit, so the caller's
     * memory can go after it returns; NULL: none. It changes which token is
     * sampled, never which KV is reused or how batches are built. */
    const ks_sample_ext *ext;
    bool cache_prompt;      /* false: clear the slot and prefill everything */
    bool want_logits;       /* pass the first token's logits to on_done */
    int preferred_slot;     /* -1: choose; >= 0: wait for this slot (ks_chat uses 0) */
    /* Whose request this is (docs/SECURITY.md "Tenants"); 0: the single
     * tenant. Cache state never crosses tenants: routing compares it (route.h
     * invariant 4), slot copies take only the same tenant's slots, the
     * message hashes and SPC key below are taken into its namespace at submit
     * (ks_msghash_tenant; the SPC key not with share_system_prompt), and the
     * store's keys hash it (store.h, the _in calls). A slot keeps the tenant
     * of the KV it holds, and its saves (evict, shutdown...) go to that
     * tenant's namespace. */
    uint64_t tenant;
    /* Cache hints from the HTTP layer (optional; zero/NULL when absent). */
    const uint64_t *msg_prefix_hash; /* n_msgs + 1 hashes of messages[0..k) (copied) */
    int n_msgs;
    int n_msgs_cacheable;   /* IMC: messages whose tokens form a clean prefix (all but the last) */
    uint64_t sys_key;       /* SPC: hash of the system message (0: none) */
    int n_sys_tokens;       /* SPC: tokens of the rendered system prefix, 0 when it is not a
                               clean token prefix of the prompt under this template */
    /* Shared prefill (OpenAI `n` > 1: n requests with one prompt). The id
     * (ks_sched_submit's *id) of a request submitted earlier whose prompt
     * shares a prefix with this one, 0: none. While that "leader" is queued
     * or still prefilling, this "follower" is not routed: it keeps its place
     * in the queue and later requests may pass it. Once the leader has
     * sampled its first token (or finished, failed, was canceled, or the id
     * is unknown), the follower is routed as any request, and planning
     * copies the leader's prefix from its slot (copy_min_tokens). Ignored
     * for an id not below the request's own (no request ever waits for a
     * later one), with cache_prompt false, or with copies off. */
    uint64_t share_prefill_of;
    /* Cache pins (see ks_cache_pin above), copied by submit: at most
     * KS_MAX_CACHE_PINS, n_tokens non-decreasing (equal positions are merged,
     * the longest TTL kept), each 0 < n_tokens <= n_tokens of the request and
     * ttl_s > 0; else KS_EINVAL. Ignored (result n_cache_written = n_pinned =
     * 0) with cache_prompt false, server-wide or for the request, or without a
     * store. */
    const ks_cache_pin *pins;
    int n_pins;
    /* Images and audio (engine/media.h): the prompt's media set from
     * ks_media_tokenize, whose pseudo-tokens the prompt holds; borrowed
     * (submit takes a reference of its own, dropped when the request ends).
     * NULL: the prompt has no pseudo-token. Every pseudo-token of the prompt
     * must be the set's at its position, every run the prompt reaches must
     * be all there (ks_media_set_covers), and the last token must be text;
     * else KS_EINVAL. The cache works on the tokens as on text: a cached
     * prefix may end anywhere, inside a media run too (media.h note 3), but
     * never inside a whole run (note 2a: Gemma 3's non-causal images), where
     * it falls back to the run's start; a run is encoded (once per set) only
     * when its rows are prefilled. */
    ks_media_set *media;
    /* Speculative decoding for this request: 0 the scheduler's draft_max,
     * < 0 none, > 0 at most this many tokens per step (capped by draft_max). */
    int draft_max;
    /* Called for each sampled token with its text piece (may be empty or an
     * incomplete UTF-8 sequence). Return non-zero to stop (finish = stop). */
    int (*on_token)(void *ud, int32_t tok, const char *piece, int len);
    /* With ext->n_probs > 0: called right before on_token for each sampled
     * token (not for the end-of-generation token, which ends the request)
     * with its log-probability and the top n_top (<= n_probs) candidates
     * (ks_sampler_probs). Both arrays are borrowed for the call. */
    void (*on_probs)(void *ud, const ks_token_prob *sampled, const ks_token_prob *top, int n_top);
    void (*on_progress)(void *ud, int done, int total);
    void (*on_done)(void *ud, const ks_req_result *r);
    void *ud;
} ks_req_params;

/* Starts the inference thread. Errors: KS_EINVAL (no engine, more slots than
 * the engine's sequences or KS_MAX_SLOTS, max_queue < 1, cache_min_tokens <
 * 0, copy_min_tokens < 0, ckpt_max outside 0..KS_SCHED_CKPT_MAX,
 * ckpt_gen_interval < 0), KS_ENOMEM. */
int ks_sched_create(const ks_sched_params *p, ks_sched **out);
/* Stops accepting, cancels queued requests, lets running ones finish their
 * current step and cancels them, joins the thread, frees. NULL is a no-op. */
void ks_sched_free(ks_sched *s);
/* The reason of the slots' saves when the scheduler stops (save_on_shutdown):
 * KS_REASON_SHUTDOWN (default) or KS_REASON_UNLOAD (its model is unloaded, the
 * server goes on). Call before ks_sched_free, from the thread that frees. */
void ks_sched_set_stop_reason(ks_sched *s, ks_reason r);
/* Queues a request; *id (may be NULL) receives its id. Errors: KS_EINVAL (no
 * tokens, max_tokens < 1, an ext that ks_sampler_ext_check refuses: n_probs
 * outside 0..KS_N_PROBS_MAX, repeat_last_n < -1, negative counts, token ids
 * outside the vocabulary..., pins as described at ks_req_params.pins),
 * KS_ECTX (prompt + max_tokens > context of a slot), KS_EFULL (queue full),
 * KS_ESHUTDOWN, KS_ENOMEM. On error on_done is
 * not called. The grammar is not parsed here (ks_engine_grammar_check does,
 * with a message): one llama.cpp refuses ends the request when it gets a slot,
 * with finish KS_FINISH_ERROR and error KS_EINVAL, before the slot's KV is
 * touched. So does a grammar that allows no next token while generating
 * (ks_sampler_sample returning -1), after the tokens generated so far.
 * With a store that has a redis tier (and cache_prompt on), the calling
 * thread first asks Redis for the prompt's longest stored prefix
 * (ks_store_prefetch): the call may take up to about the tier's timeout, and
 * the inference thread never waits for Redis. */
int ks_sched_submit(ks_sched *s, const ks_req_params *r, uint64_t *id);
/* Cancels a queued or running request; on_done follows with KS_FINISH_CANCEL
 * (unless it already finished). Unknown ids are ignored. */
void ks_sched_cancel(ks_sched *s, uint64_t id);
/* Drops the KV and token list of a slot (for /clear); waits if it is busy. */
void ks_sched_clear_slot(ks_sched *s, int slot);

typedef struct ks_slot_info {
    int id;
    bool busy;
    uint64_t req_id;       /* 0 when idle */
    uint64_t shown_req_id; /* the request n_prompt ... n_generated are of (the current or the last one) */
    int n_tokens;          /* tokens in the slot's KV */
    int n_prompt;          /* of the current/last request */
    int n_cached;
    int n_cache_written;   /* the request's breakpoint writes as planned (ks_req_result's, final at the end) */
    int n_generated;
    int64_t last_used_us;  /* monotonic */
    uint64_t tenant;       /* whose request or KV it is (ks_req_params.tenant) */
    int n_drafted;         /* of the current/last request (ks_req_result) */
    int n_draft_accepted;
} ks_slot_info;

/* Fills up to n slot descriptions; returns the number of slots. */
int ks_sched_slots(ks_sched *s, ks_slot_info *out, int n);

/* The token lists warm start put into slots (ks_sched_params.warm_slots), with
 * their tenants: the conversations a restarted process expects first, for
 * caches keyed by what they will send again (the server's tokenization cache,
 * engine/tokcache.h). Returns how many; the arrays are the scheduler's,
 * read-only and valid until ks_sched_free; any thread. */
int ks_sched_warm_list(const ks_sched *s, const ks_tokens **toks, const uint64_t **tenants);

/* The cache decisions, one count per request by its final mode, and the
 * store and SPC traffic. Written by the inference thread only. */
typedef struct ks_sched_cache_stats {
    uint64_t mode_prefix;          /* same-slot / affinity prefix reuse */
    uint64_t mode_miss;
    uint64_t imc_hash_hits;
    uint64_t imc_token_prefix_hits; /* salvages by token prefix */
    uint64_t imc_salvaged_tokens;
    uint64_t evictions;             /* a non-empty slot taken over for another branch */
    uint64_t rebuilds;              /* IMC: a branch built from scratch */
    uint64_t spc_hits;              /* system prompt restored from SPC */
    uint64_t spc_misses;            /* SPC had no state for the system prompt */
    uint64_t spc_builds;            /* SPC states captured (system prompt decoded for SPC) */
    uint64_t spc_restored_tokens;
    uint64_t sys_prompt_prefills;   /* requests whose system prompt was prefilled */
    uint64_t partial_rm_rebuilds;   /* memory could not drop a suffix: rebuilt */
    uint64_t slot_copies;           /* prompts whose prefix was copied from another slot */
    uint64_t slot_copied_tokens;    /* tokens kept from those copies */
    double slot_copy_ms_total;      /* state get + set + trim of the copies */
    uint64_t store_hits;            /* prompts restored from the persistent store */
    uint64_t store_restored_tokens;
    double store_restore_ms_total;  /* lookup + read + verify + state set */
    uint64_t store_save_requests[KS_REASON__N]; /* by ks_reason: states handed to the store */
    uint64_t pin_saves;             /* cache pins whose state was copied and handed to the store */
    uint64_t pin_refreshes;         /* cache pins the store held already: deadline extended */
    uint64_t pin_rewinds;           /* of pin_saves: within the reused prefix (state copied, cut
                                       back, set again; ks_cache_pin) */
    uint64_t pin_failures;          /* pins not held: no memory for the copy, the store refused it
                                       (queue full, no tier for pins), or the request ended first */
    uint64_t pin_written_tokens;    /* sum of the requests' n_cache_written */
    double snapshot_ms_total;       /* time the inference thread spent copying states */
    uint64_t finish_saves_superseded; /* deferred finish saves never taken: the slot's next request
                                         continued the conversation first */
    uint64_t deferred_saves;        /* finish saves waiting now (not yet in store_save_requests);
                                       counted from the slots at each publish */
    /* Checkpoints (hybrid models, ks_sched_params.ckpt_max) */
    uint64_t ckpt_saves;            /* partial states taken */
    uint64_t ckpt_drops;            /* dropped for the count or byte budget (not for a trim) */
    uint64_t ckpt_restores;         /* trims served by a checkpoint instead of a rebuild */
    uint64_t ckpt_restored_tokens;  /* tokens those trims kept */
    double ckpt_ms_total;           /* partial state get + set time */
    /* Warm start (ks_sched_params.warm_slots) */
    uint64_t warm_slots;            /* slots that took a stored state at creation */
    uint64_t warm_tokens;           /* the tokens they hold */
    double warm_ms_total;           /* reading, verifying and setting those states */
    /* Media (ks_req_params.media) */
    uint64_t media_encodes;         /* media chunks run through the projector */
    double media_encode_ms_total;
    uint64_t media_tokens_decoded;  /* media pseudo-tokens prefilled (embeddings decoded) */
    uint64_t media_tokens_reused;   /* media pseudo-tokens of prompts found in the cache */
} ks_sched_cache_stats;

typedef struct ks_sched_stats {
    uint64_t requests_total;
    uint64_t requests_rejected;   /* queue full */
    uint64_t requests_canceled;
    uint64_t prompt_tokens_total;
    uint64_t prompt_tokens_cached_total;
    uint64_t tokens_predicted_total;
    double prompt_seconds_total;
    double predicted_seconds_total;
    uint64_t draft_tokens_total;          /* speculative decoding: tokens drafted and verified */
    uint64_t draft_accepted_total;        /* of them kept */
    uint64_t draft_steps_total;           /* decode steps that verified a draft */
    int slots_busy;
    int queue_depth;
    int n_slots;
    ks_sched_cache_stats cache;   /* as of the last step */
} ks_sched_stats;

void ks_sched_stats_get(ks_sched *s, ks_sched_stats *out);

/* Whether speculative decoding runs (a drafter is set and the engine allows
 * it) and whether it is exact (ks_sched_params.drafter). *why (may be NULL)
 * gets the reason it is off or inexact, a static string, NULL when it runs
 * exact; "no drafter" when none is set. Any thread. */
bool ks_sched_spec_status(const ks_sched *s, bool *exact, const char **why);

#endif

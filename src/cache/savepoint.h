/*
 * savepoint.h — where a prefill chunk ends so that the store gets a `cold`
 * save of a stride-aligned prefix, without costing a warm turn a decode step.
 *
 * Owns nothing: pure arithmetic over token counts, called by the scheduler
 * while it sizes one prefilling slot's chunk of a decode step.
 *
 * The rules (why: a cold save lets a replay of the same prompt, in this or
 * another process, restore instead of prefilling; but a cut that adds a
 * decode step costs the live request time to first token):
 *  1. In a COLD prefill (fewer than a stride of the prompt reused), a chunk
 *     that is NOT the request's last (the chunk as sized does not reach the
 *     end of the prompt) may end at its last stride boundary b — when b is
 *     after the chunk's start, at least min_tokens, and moving the tokens
 *     after b to later chunks adds no decode step at the current budget. Of
 *     those chunks only the last one saves (looking ahead at the current
 *     budget), so a long prefill gets one cold save, at its last
 *     stride-aligned chunk end. A warm prefill (a conversation's next turn)
 *     saves nowhere: the finish save follows within the request, and a
 *     state copied on a GPU is the whole sequence's KV moved to host memory
 *     (1.3 GB at 10K tokens of an 8B model: most of a long turn's time to
 *     first token on an H200, docs/BENCHMARKS.md).
 *  2. The LAST chunk is cut only in a COLD prefill (fewer than a stride of
 *     the prompt reused): at the prompt's last stride boundary, if that is at
 *     least min_tokens. It costs one decode step beside a whole prompt's
 *     prefill. After a reused history it is never cut: the finish save
 *     follows within the request, and the cut cost warm turns ~150 ms of TTFT
 *     with 4 concurrent requests (docs/BENCHMARKS.md, save overhead).
 *  3. A pending snapshot point `sys` — the system-prompt capture (SPC) or a
 *     request's cache pin (sched.h ks_cache_pin), the nearer of them — also
 *     ends a chunk (the caller clamps the chunk to it); the step counts take
 *     it into account. sys < 0: none. Only the nearest is passed: with a
 *     second one further on, the look-ahead may miscount by a step, which
 *     costs at most one cold save too many or too few.
 * When the budget changes between steps (slots start or stop generating) a
 * prefill may save twice or not at all; the finish save follows either way.
 *
 * Every function returns a chunk size in (0, take] and writes the save point
 * (the prompt position the chunk ends at for the save) to *save_at, -1 when
 * the chunk is not cut for a save.
 *
 * Thread model: no state; safe from any thread.
 */
#ifndef KS_CACHE_SAVEPOINT_H
#define KS_CACHE_SAVEPOINT_H

typedef struct ks_savepoint_cfg {
    int stride;     /* > 0: the store's stride (save points are its multiples) */
    int min_tokens; /* no save point below this */
} ks_savepoint_cfg;

/* Decode steps left to prefill tokens [pos, n) at budget tokens a chunk, with
 * a chunk ending at sys when pos < sys < n. budget >= 1. */
int ks_savepoint_steps(int pos, int n, int sys, int budget);

/* Rule 2's point: where the last chunk of a prompt of n_prompt tokens ends
 * when n_cached of them were reused; -1 for a warm prefill (n_cached >=
 * stride) or when the boundary is below min_tokens. */
int ks_savepoint_last(const ks_savepoint_cfg *c, int n_cached, int n_prompt);

/* Rule 1: sizes the chunk [pos, pos + take) of a prompt of n tokens that is
 * not the request's last (pos + take < n); n_cached as for _last. */
int ks_savepoint_cut(const ks_savepoint_cfg *c, int pos, int take, int n, int sys, int budget,
                     int n_cached, int *save_at);

/* Rule 2: sizes the last chunk [pos, pos + take) (pos + take == n_prompt). */
int ks_savepoint_cut_last(const ks_savepoint_cfg *c, int pos, int take, int n_cached, int n_prompt,
                          int *save_at);

#endif

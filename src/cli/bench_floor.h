/*
 * bench_floor.h — the floor of a cached request, measured on llama.cpp alone.
 *
 * The floor of a cached request (docs/BENCHMARKS.md) is the prefill of its
 * new tokens plus the state restore. The new tokens of a turn
 * sit after the cached history and attend to all of it, so their prefill is
 * measured at that depth: the history's KV is put in place untimed, then only
 * the new tokens are decoded (timed, up to the first token's logits and an
 * argmax). No kvstash code runs in the timed part — no routing, templating,
 * tokenizing, scheduling, store or HTTP — so TTFT / floor is the overhead the
 * cache adds on top of the work no cache can skip.
 *
 * Optionally the floor adds the restore llama needs for that history: the
 * sequence state of `depth` tokens is taken out and timed back in
 * (llama_state_seq_set_data from memory; a store's file read and checksum
 * are part of what is judged, not of the floor).
 *
 * The token ids are arbitrary non-special ids (a fixed pseudo-random stream):
 * a dense model's prefill cost does not depend on which tokens it sees. The
 * history is kept between calls and trimmed or extended as needed, so a
 * series of floors at growing depths costs little beyond the timed parts.
 *
 * Thread model: one thread owns a ks_floor (it owns a llama context).
 */
#ifndef KS_BENCH_FLOOR_H
#define KS_BENCH_FLOOR_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ks_floor ks_floor;

typedef struct ks_floor_params {
    const char *model_path;
    int n_ctx;     /* context (tokens); depth + n_new must fit */
    int n_batch;   /* tokens per decode, as the server's --batch (0: 512) */
    int n_threads; /* 0: all CPUs */
} ks_floor_params;

/* Loads the model and runs one untimed warm-up prefill (graph allocation,
 * first touches of the weights). */
int ks_floor_open(const ks_floor_params *p, ks_floor **out, char *err, size_t errlen);
void ks_floor_free(ks_floor *f);

/* Prefill of n_new tokens after `depth` tokens of history: *prefill_ms. With
 * restore, also the time to set the depth-token sequence state back into the
 * context: *restore_ms (else 0). Returns 0 or a KS_E* code. */
int ks_floor_measure(ks_floor *f, int depth, int n_new, bool restore, double *prefill_ms, double *restore_ms);

/* `kvstash bench floor`: one-shot (--depth/--new) or a line protocol on
 * stdin ("DEPTH NEW [RESTORE]" → "prefill_ms restore_ms"). */
int ks_bench_floor_main(int argc, char **argv);

#endif

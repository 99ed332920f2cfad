/*
 * draft_ngram.h — n-gram drafters for speculative decoding: the pinned
 * llama.cpp common library's implementations (common/speculative.h:
 * ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod) behind the
 * scheduler's ks_drafter_ops (drafter.h).
 *
 * Contract: each drafter drafts from one slot's own tokens (its prompt and
 * reply) and nothing else: one common_speculative of one sequence per
 * drafter, so even ngram-mod's table, which llama-server shares among all
 * slots, is per slot here, and the scheduler replaces a slot's drafter when
 * the slot passes to another tenant. A draft is only a guess: what it
 * proposes changes how many tokens a decode step yields, never which.
 *
 * Thread model: ks_ngram_ops' calls run on the inference thread, one
 * drafter per slot; the parsing helpers are pure.
 *
 * C++ inside (draft_ngram.cpp, library ks_draft), C outside; exceptions
 * from the common library are caught (no draft).
 */
#ifndef KS_DRAFT_NGRAM_H
#define KS_DRAFT_NGRAM_H

#include <stdbool.h>

#include <stddef.h>

#include "sched/drafter.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KS_NGRAM_SIMPLE = 0, /* "ngram-simple": the last size_n tokens looked up in the history */
    KS_NGRAM_MAP_K,      /* "ngram-map-k": n-gram keys, with hit counts */
    KS_NGRAM_MAP_K4V,    /* "ngram-map-k4v": keys and up to 4 continuations each */
    KS_NGRAM_MOD,        /* "ngram-mod": a hashed table of n_match-grams */
    KS_NGRAM__N
} ks_ngram_type;

typedef struct ks_ngram_params {
    ks_ngram_type type;
    /* ngram-simple, ngram-map-k, ngram-map-k4v (llama-server's
     * --spec-ngram-{simple,map-k,map-k4v}-size-n/-size-m/-min-hits) */
    int size_n;   /* lookup length, 1..1024 (default 3 for ngram-simple, else 12) */
    int size_m;   /* draft length, 1..1024 (default 8 for ngram-simple, else 48) */
    int min_hits; /* >= 1 (default 1) */
    /* ngram-mod (--spec-ngram-mod-n-match/-n-min/-n-max) */
    int mod_n_match; /* 1..1024 (default 24) */
    int mod_n_min;   /* 0..1024 (default 48) */
    int mod_n_max;   /* 0..1024 (default 64) */
} ks_ngram_params;

/* llama-server's defaults for the type. */
ks_ngram_params ks_ngram_params_default(ks_ngram_type type);
/* 0, or KS_EINVAL with what is wrong (naming llama-server's flag) in err. */
int ks_ngram_params_check(const ks_ngram_params *p, char *err, size_t n);
/* "ngram-simple" ... -> the type; -1 for any other name. */
int ks_ngram_type_parse(const char *name);
const char *ks_ngram_type_name(ks_ngram_type type);
/* The drafter ops; create's cfg is a ks_ngram_params that must outlive the
 * scheduler. */
const ks_drafter_ops *ks_ngram_ops(void);

#ifdef __cplusplus
}
#endif

#endif

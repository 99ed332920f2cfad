/*
 * bench_floor.c — the floor of a cached request at its depth (bench_floor.h).
 */
#include "cli/bench_floor.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "kvstash.h"

#define CMD "kvstash bench floor"

struct ks_floor {
    ks_engine *e;
    ks_batch *b;
    int n_batch, n_ctx, n_vocab;
    int n_kv;       /* history tokens in seq 0: positions [0, n_kv) */
    int32_t *toks;  /* the token stream, n_ctx + 1 ids */
    uint8_t *state; /* restore scratch */
    size_t state_cap;
    uint8_t *full;  /* the state of the longest history decoded so far */
    size_t full_len, full_cap;
    int full_n;     /* its tokens */
};

static uint64_t mix(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int ks_floor_open(const ks_floor_params *p, ks_floor **out, char *err, size_t errlen) {
    *out = NULL;
    ks_floor *f = calloc(1, sizeof *f);
    if (!f) return KS_ENOMEM;
    ks_engine_params ep = ks_engine_params_default();
    ep.model_path = p->model_path;
    ep.n_ctx_seq = p->n_ctx > 0 ? p->n_ctx : 4096;
    ep.n_seq = 1;
    ep.n_batch = p->n_batch > 0 ? p->n_batch : 512;
    ep.n_threads = p->n_threads;
    int rc = ks_engine_open(&ep, &f->e, err, errlen);
    if (rc) {
        free(f);
        return rc;
    }
    f->n_batch = ks_engine_n_batch(f->e);
    f->n_ctx = ks_engine_n_ctx_seq(f->e);
    f->n_vocab = ks_engine_n_vocab(f->e);
    f->b = ks_batch_create(f->n_batch);
    f->toks = malloc(sizeof(int32_t) * ((size_t)f->n_ctx + 1));
    if (!f->b || !f->toks) {
        ks_floor_free(f);
        return KS_ENOMEM;
    }
    /* ids from the upper three quarters of the vocabulary: past the byte and
     * control tokens of a SentencePiece-style vocabulary */
    uint64_t s = 12345;
    int lo = f->n_vocab / 4, span = f->n_vocab - lo;
    for (int i = 0; i <= f->n_ctx; i++) f->toks[i] = lo + (int32_t)(mix(&s) % (uint64_t)span);
    /* warm-up: the first decode pays graph allocation and first touches */
    double pm, rm;
    ks_floor_measure(f, 0, 16, false, &pm, &rm);
    *out = f;
    return 0;
}

void ks_floor_free(ks_floor *f) {
    if (!f) return;
    ks_batch_free(f->b);
    ks_engine_free(f->e);
    free(f->toks);
    free(f->state);
    free(f->full);
    free(f);
}

/* Decodes stream tokens [from, to) into seq 0 in n_batch chunks; logits for
 * the last one when want_logits (its batch index in *i_last). A lone token
 * gets a throwaway companion at the next position, as kvstash's exact
 * decoding does (sched.c, NOTE ON EXACTNESS), removed right after. */
static int decode_range(ks_floor *f, int from, int to, bool want_logits, int *i_last) {
    for (int p = from; p < to;) {
        int n = to - p < f->n_batch ? to - p : f->n_batch;
        bool last = p + n == to;
        ks_batch_clear(f->b);
        for (int j = 0; j < n; j++) {
            int idx = ks_batch_add(f->b, f->toks[p + j], p + j, 0, want_logits && last && j == n - 1);
            if (want_logits && last && j == n - 1) *i_last = idx;
        }
        bool pair = n == 1;
        if (pair) ks_batch_add(f->b, f->toks[p + 1], p + 1, 0, false);
        int rc = ks_engine_decode(f->e, f->b);
        if (pair) ks_engine_seq_rm(f->e, 0, p + 1, -1);
        if (rc) return rc;
        p += n;
    }
    return 0;
}

/* Copies seq 0's state into *buf (grown to fit; *cap its size): 0 and *len,
 * or KS_ENOMEM / KS_EIO. */
static int snapshot(ks_floor *f, uint8_t **buf, size_t *cap, size_t *len) {
    size_t need = ks_engine_state_size(f->e, 0);
    *len = 0;
    if (need > *cap) {
        uint8_t *nb = realloc(*buf, need);
        if (!nb) return KS_ENOMEM;
        *buf = nb;
        *cap = need;
    }
    *len = ks_engine_state_get(f->e, 0, *buf, *cap);
    return *len ? 0 : KS_EIO;
}

int ks_floor_measure(ks_floor *f, int depth, int n_new, bool restore, double *prefill_ms, double *restore_ms) {
    *prefill_ms = *restore_ms = 0;
    if (depth < 0 || n_new < 1 || depth + n_new + 1 > f->n_ctx) return KS_EINVAL;
    /* history: trim or extend to exactly `depth` tokens (untimed) */
    if (f->n_kv > depth) {
        if (!ks_engine_seq_rm(f->e, 0, depth, -1)) {
            ks_engine_seq_clear(f->e, 0);
            f->n_kv = 0;
        } else {
            f->n_kv = depth;
        }
    }
    int i_last = -1, rc;
    if (f->n_kv < depth && f->full_n > f->n_kv) {
        /* a longer history was decoded before: setting its state back is far
         * cheaper than decoding the difference again */
        if (ks_engine_state_set(f->e, 0, f->full, f->full_len) == 0) {
            f->n_kv = f->full_n;
            if (f->n_kv > depth && !ks_engine_seq_rm(f->e, 0, depth, -1)) {
                ks_engine_seq_clear(f->e, 0);
                f->n_kv = 0;
            } else if (f->n_kv > depth) {
                f->n_kv = depth;
            }
        } else {
            f->n_kv = 0;
            f->full_n = 0;
        }
    }
    if (f->n_kv < depth) {
        if ((rc = decode_range(f, f->n_kv, depth, false, &i_last))) return rc;
        f->n_kv = depth;
        /* without the copy a longer history is just decoded again next time */
        f->full_n = snapshot(f, &f->full, &f->full_cap, &f->full_len) == 0 ? depth : 0;
    }
    if (restore && depth > 0) {
        size_t got;
        if ((rc = snapshot(f, &f->state, &f->state_cap, &got))) return rc;
        ks_engine_seq_clear(f->e, 0);
        double t0 = ks_now_ms();
        rc = ks_engine_state_set(f->e, 0, f->state, got);
        *restore_ms = ks_now_ms() - t0;
        if (rc) {
            f->n_kv = 0;
            return rc;
        }
    }
    /* the timed part: the new tokens and the first token's argmax */
    double t0 = ks_now_ms();
    rc = decode_range(f, depth, depth + n_new, true, &i_last);
    if (rc) {
        ks_engine_seq_clear(f->e, 0);
        f->n_kv = 0;
        return rc;
    }
    const float *lg = ks_engine_logits(f->e, i_last);
    int best = 0;
    for (int i = 1; lg && i < f->n_vocab; i++)
        if (lg[i] > lg[best]) best = i;
    *prefill_ms = ks_now_ms() - t0;
    f->n_kv = depth + n_new;
    (void)best;
    return lg ? 0 : KS_EDECODE;
}

/* ------------------------------------------------------ kvstash bench floor */
static void usage(FILE *out) {
    fprintf(out,
            "usage: kvstash bench floor -m MODEL [--ctx N] [--batch N] [--threads N]\n"
            "                           (--depth D --new N [--restore] [--repeat R] | --stdin)\n"
            "  The floor of a cached request: the prefill of N new tokens after D tokens of\n"
            "  history already in the KV (plus, with --restore, setting the D-token sequence\n"
            "  state back), measured on llama.cpp alone. Prints 'prefill_ms restore_ms' per\n"
            "  measurement. --stdin reads lines 'DEPTH NEW [RESTORE(0|1)]' and answers each\n"
            "  with one line ('error MESSAGE' for a bad line), for bench/http_bench.mjs.\n");
}

int ks_bench_floor_main(int argc, char **argv) {
    enum { O_CTX = 256, O_BATCH, O_THREADS, O_DEPTH, O_NEW, O_RESTORE, O_REPEAT, O_STDIN };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},     {"ctx", required_argument, 0, O_CTX},
        {"batch", required_argument, 0, O_BATCH}, {"threads", required_argument, 0, O_THREADS},
        {"depth", required_argument, 0, O_DEPTH}, {"new", required_argument, 0, O_NEW},
        {"restore", no_argument, 0, O_RESTORE},   {"repeat", required_argument, 0, O_REPEAT},
        {"stdin", no_argument, 0, O_STDIN},       {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    ks_floor_params p = {.n_ctx = 8192};
    int depth = -1, n_new = -1, repeat = 1, c;
    bool restore = false, from_stdin = false;
    optind = 1;
    /* Every number of this command is a count in [0, NUM_MAX]. */
    enum { NUM_MAX = 1 << 24 };
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': p.model_path = optarg; break;
        case O_CTX: if (ks_cli_parse_int(CMD, "--ctx", optarg, 0, NUM_MAX, &p.n_ctx)) return 2; break;
        case O_BATCH: if (ks_cli_parse_int(CMD, "--batch", optarg, 0, NUM_MAX, &p.n_batch)) return 2; break;
        case O_THREADS: if (ks_cli_parse_int(CMD, "--threads", optarg, 0, NUM_MAX, &p.n_threads)) return 2; break;
        case O_DEPTH: if (ks_cli_parse_int(CMD, "--depth", optarg, 0, NUM_MAX, &depth)) return 2; break;
        case O_NEW: if (ks_cli_parse_int(CMD, "--new", optarg, 0, NUM_MAX, &n_new)) return 2; break;
        case O_REPEAT:
            if (ks_cli_parse_int(CMD, "--repeat", optarg, 0, NUM_MAX, &repeat)) return 2;
            if (repeat == 0) repeat = 1; /* as before: 0 measures once */
            break;
        case O_RESTORE: restore = true; break;
        case O_STDIN: from_stdin = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!p.model_path || (!from_stdin && (depth < 0 || n_new < 1))) {
        usage(stderr);
        return 2;
    }
    char err[512] = "";
    ks_floor *f = NULL;
    int rc = ks_floor_open(&p, &f, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvstash bench floor: %s\n", err[0] ? err : ks_strerror(rc));
        return 1;
    }
    double pm, rm;
    if (!from_stdin) {
        for (int i = 0; i < repeat && !rc; i++) {
            rc = ks_floor_measure(f, depth, n_new, restore, &pm, &rm);
            if (!rc) printf("%.3f %.3f\n", pm, rm);
        }
        if (rc) fprintf(stderr, "kvstash bench floor: %s\n", ks_strerror(rc));
        ks_floor_free(f);
        return rc ? 1 : 0;
    }
    printf("ready %d\n", ks_engine_n_ctx_seq(f->e));
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        int d, n, r = 0;
        int k = sscanf(line, "%d %d %d", &d, &n, &r);
        if (k < 2) {
            printf("error expected 'DEPTH NEW [RESTORE]'\n");
        } else if ((rc = ks_floor_measure(f, d, n, r != 0, &pm, &rm))) {
            printf("error %s\n", ks_strerror(rc));
        } else {
            printf("%.3f %.3f\n", pm, rm);
        }
        fflush(stdout);
    }
    ks_floor_free(f);
    return 0;
}

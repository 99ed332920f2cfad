/*
 * draft_ngram.cpp — see draft_ngram.h. One common_speculative of one
 * sequence (seq 0) per drafter; its history is the slot's sequence, kept in
 * step with begin/accept.
 */
#include "sched/draft_ngram.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <vector>

#include "common.h"
#include "speculative.h"

extern "C" {
#include "base/base.h"
}

namespace {

const char *const k_names[KS_NGRAM__N] = {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"};
const common_speculative_type k_types[KS_NGRAM__N] = {
    COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE, COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K, COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V,
    COMMON_SPECULATIVE_TYPE_NGRAM_MOD};

struct drafter {
    common_params_speculative params;
    common_speculative *spec = nullptr;
    llama_tokens hist;
    llama_tokens result;
    bool drafted = false; /* the last draft call proposed tokens (accept reports to it) */
};

void *create(void *cfg, int /*slot*/, uint64_t /*tenant*/) {
    const ks_ngram_params *p = static_cast<const ks_ngram_params *>(cfg);
    drafter *d = nullptr;
    try {
        d = new drafter();
        d->params.types = {k_types[p->type]};
        common_params_speculative_ngram_map m;
        m.size_n = (uint16_t)p->size_n;
        m.size_m = (uint16_t)p->size_m;
        m.min_hits = (uint16_t)p->min_hits;
        d->params.ngram_simple = d->params.ngram_map_k = d->params.ngram_map_k4v = m;
        d->params.ngram_mod.n_match = p->mod_n_match;
        d->params.ngram_mod.n_min = p->mod_n_min;
        d->params.ngram_mod.n_max = p->mod_n_max;
        d->spec = common_speculative_init(d->params, 1);
        if (!d->spec) {
            delete d;
            return nullptr;
        }
    } catch (...) {
        if (d && d->spec) common_speculative_free(d->spec);
        delete d;
        return nullptr;
    }
    return d;
}

void destroy(void *v) {
    drafter *d = static_cast<drafter *>(v);
    if (!d) return;
    common_speculative_free(d->spec);
    delete d;
}

void begin(void *v, const int32_t *toks, int n) {
    drafter *d = static_cast<drafter *>(v);
    d->drafted = false;
    try {
        d->hist.assign(toks, toks + n);
        common_speculative_begin(d->spec, 0, d->hist);
    } catch (...) {
        d->hist.clear(); /* no draft until the next begin: draft() sees too short a history */
    }
}

int draft(void *v, int32_t last, int n_max, int32_t *out) {
    drafter *d = static_cast<drafter *>(v);
    d->drafted = false;
    try {
        d->result.clear();
        common_speculative_draft_params &dp = common_speculative_get_draft_params(d->spec, 0);
        dp.drafting = true;
        dp.n_max = n_max;
        dp.pos0 = (llama_pos)d->hist.size();
        dp.id_last = last;
        dp.prompt = &d->hist;
        dp.result = &d->result;
        common_speculative_draft(d->spec);
        int n = (int)d->result.size();
        if (n > n_max) n = n_max;
        if (n > 0) std::memcpy(out, d->result.data(), sizeof(int32_t) * (size_t)n);
        d->drafted = n > 0;
        return n;
    } catch (...) {
        return 0;
    }
}

void accept(void *v, const int32_t *toks, int n, int n_drafted, int n_accepted) {
    drafter *d = static_cast<drafter *>(v);
    try {
        if (n_drafted > 0 && d->drafted) common_speculative_accept(d->spec, 0, (uint16_t)n_accepted);
        d->drafted = false;
        d->hist.insert(d->hist.end(), toks, toks + n);
    } catch (...) {
        d->hist.clear();
    }
}

const ks_drafter_ops k_ops = {create, destroy, begin, draft, accept, nullptr};

} // namespace

extern "C" {

ks_ngram_params ks_ngram_params_default(ks_ngram_type type) {
    ks_ngram_params p;
    p.type = type;
    p.size_n = type == KS_NGRAM_SIMPLE ? 3 : 12; /* ks_config_spec_defaults: by measurement; else llama.cpp's */
    p.size_m = type == KS_NGRAM_SIMPLE ? 8 : 48;
    p.min_hits = 1;
    p.mod_n_match = 24;
    p.mod_n_min = 48;
    p.mod_n_max = 64;
    return p;
}

int ks_ngram_params_check(const ks_ngram_params *p, char *err, size_t n) {
    const char *flag = nullptr;
    const char *pre = p->type == KS_NGRAM_MAP_K ? "map-k" : p->type == KS_NGRAM_MAP_K4V ? "map-k4v" : "simple";
    char buf[64];
    if (p->type < 0 || p->type >= KS_NGRAM__N) flag = "--spec-type";
    else if (p->size_n < 1 || p->size_n > 1024) std::snprintf(buf, sizeof buf, "--spec-ngram-%s-size-n (1..1024)", pre), flag = buf;
    else if (p->size_m < 1 || p->size_m > 1024) std::snprintf(buf, sizeof buf, "--spec-ngram-%s-size-m (1..1024)", pre), flag = buf;
    else if (p->min_hits < 1 || p->min_hits > 65535) std::snprintf(buf, sizeof buf, "--spec-ngram-%s-min-hits (>= 1)", pre), flag = buf;
    else if (p->mod_n_match < 1 || p->mod_n_match > 1024) flag = "--spec-ngram-mod-n-match (1..1024)";
    else if (p->mod_n_min < 0 || p->mod_n_min > 1024) flag = "--spec-ngram-mod-n-min (0..1024)";
    else if (p->mod_n_max < 0 || p->mod_n_max > 1024) flag = "--spec-ngram-mod-n-max (0..1024)";
    if (!flag) return 0;
    std::snprintf(err, n, "%s is out of range", flag);
    return KS_EINVAL;
}

int ks_ngram_type_parse(const char *name) {
    for (int i = 0; i < KS_NGRAM__N; i++)
        if (name && std::strcmp(name, k_names[i]) == 0) return i;
    return -1;
}

const char *ks_ngram_type_name(ks_ngram_type type) {
    return type >= 0 && type < KS_NGRAM__N ? k_names[type] : "?";
}

const ks_drafter_ops *ks_ngram_ops(void) { return &k_ops; }

} // extern "C"

/*
 * tokcache.c — prompts tokenized piece by piece, pieces from a cache
 * (tokcache.h). Like engine_text.c it reaches the vocabulary through
 * engine_int.h and includes llama.h.
 *
 * Thread model: tokcache.h.
 */
#include "engine/tokcache.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "engine/engine_int.h"
#include "llama.h"

#define MOD "tokcache"

typedef struct special {
    const char *text; /* the vocabulary's, borrowed */
    int len;
    int32_t id;
    bool cut; /* may start a piece: no left strip */
} special;

/* A piece and its tokens, in one allocation: the piece's bytes are kept and
 * compared, so that no two texts ever share an entry (a hash only finds it:
 * XXH3 is not collision-resistant, and with a seed per namespace two short
 * texts one byte apart were measured to collide). */
typedef struct entry {
    uint64_t h;    /* XXH3 of ns, first and the bytes; 0: free */
    uint64_t ns;
    bool first;    /* the text's first piece: tokenized with BOS */
    int n;         /* tokens */
    size_t len;    /* bytes */
    int32_t *tok;  /* n tokens, then len bytes; owned */
    uint64_t used; /* the cache's clock when last found or stored */
} entry;

static size_t entry_size(const entry *en) { return sizeof *en + sizeof(int32_t) * (size_t)en->n + en->len; }
static const char *entry_bytes(const entry *en) { return (const char *)(en->tok + en->n); }

struct ks_tokcache {
    const struct llama_vocab *vocab;
    bool pieces;     /* whether texts are cut at all */
    bool check;      /* KS_TOKCACHE_CHECK: compare every result with the whole text's */
    special *sp;     /* the special tokens, by first byte then longest first */
    int n_sp, max_len;
    int first[257];  /* sp[first[b], first[b + 1]) start with byte b */
    bool *is_cut;    /* by token id: a special token a piece may start with */
    int n_vocab;
    pthread_mutex_t mu;
    entry *tab;
    int cap, n; /* cap a power of two; n entries in use */
    size_t bytes, max_bytes; /* what the entries take, with their tokens and texts */
    uint64_t clock, hit, miss, whole;
};

static int cmp_special(const void *a, const void *b) {
    const special *x = a, *y = b;
    unsigned char bx = (unsigned char)x->text[0], by = (unsigned char)y->text[0];
    if (bx != by) return bx < by ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first, as llama.cpp matches */
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The special tokens llama.cpp splits a text at (llama-vocab.cpp, its
 * cache_special_tokens: control, user-defined and unknown), with their texts.
 * false: a vocabulary this cache does not cut (tokcache.h). */
static bool load_specials(ks_tokcache *c, const struct llama_model *model) {
    const struct llama_vocab *v = c->vocab;
    enum llama_vocab_type vt = llama_vocab_type(v);
    char tm[32] = "";
    if (model) llama_model_meta_val_str(model, "tokenizer.ggml.model", tm, sizeof tm);
    if (!((vt == LLAMA_VOCAB_TYPE_SPM && !strcmp(tm, "llama")) || (vt == LLAMA_VOCAB_TYPE_BPE && !strcmp(tm, "gpt2"))))
        return false;
    if (llama_vocab_get_add_eos(v)) return false;
    int n = llama_vocab_n_tokens(v);
    c->n_vocab = n;
    c->is_cut = calloc((size_t)n, sizeof *c->is_cut);
    if (!c->is_cut) return false;
    const int mask = LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN;
    int k = 0;
    for (int id = 0; id < n; id++) k += (llama_vocab_get_attr(v, id) & mask) != 0;
    c->sp = calloc((size_t)(k ? k : 1), sizeof *c->sp);
    if (!c->sp) return false;
    for (int id = 0; id < n; id++) {
        int a = llama_vocab_get_attr(v, id);
        if (!(a & mask)) continue;
        const char *t = llama_vocab_get_text(v, id);
        size_t len = t ? strlen(t) : 0;
        if (len == 0 || len > 4096) return false; /* an empty special would match everywhere */
        c->sp[c->n_sp++] = (special){t, (int)len, id, !(a & LLAMA_TOKEN_ATTR_LSTRIP)};
        c->is_cut[id] = !(a & LLAMA_TOKEN_ATTR_LSTRIP);
        if ((int)len > c->max_len) c->max_len = (int)len;
    }
    if (c->n_sp == 0) return false;
    qsort(c->sp, (size_t)c->n_sp, sizeof *c->sp, cmp_special);
    for (int b = 0, i = 0; b <= 256; b++) {
        while (i < c->n_sp && (unsigned char)c->sp[i].text[0] < b) i++;
        c->first[b] = i;
    }
    return true;
}

ks_tokcache *ks_tokcache_create(const struct ks_engine *e, size_t max_bytes) {
    ks_tokcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->vocab = ks__engine_vocab(e);
    c->max_bytes = max_bytes;
    const char *chk = getenv("KS_TOKCACHE_CHECK");
    c->check = chk && chk[0] == '1';
    pthread_mutex_init(&c->mu, NULL);
    c->pieces = load_specials(c, ks__engine_model(e));
    if (!c->pieces) {
        free(c->sp), c->sp = NULL, c->n_sp = 0;
    }
    return c;
}

static void tab_clear(ks_tokcache *c);

void ks_tokcache_free(ks_tokcache *c) {
    if (!c) return;
    tab_clear(c);
    pthread_mutex_destroy(&c->mu);
    free(c->sp);
    free(c->is_cut);
    free(c);
}

/* ------------------------------------------------------------ the table */
static void tab_clear(ks_tokcache *c) {
    for (int i = 0; i < c->cap; i++) free(c->tab[i].tok);
    free(c->tab);
    c->tab = NULL;
    c->cap = c->n = 0;
    c->bytes = 0;
}

static uint64_t piece_hash(uint64_t ns, bool first, const char *p, size_t len) {
    uint64_t h = XXH3_64bits_withSeed(p, len, ns) ^ (first ? 0x9e3779b97f4a7c15ull : 0);
    return h ? h : 1;
}

/* The slot of the piece (an entry equal in ns, first and bytes), or the free
 * slot where it would go. */
static int tab_slot(const ks_tokcache *c, uint64_t h, uint64_t ns, bool first, const char *p, size_t len) {
    int m = c->cap - 1;
    for (int i = (int)(h & (uint64_t)m);; i = (i + 1) & m) {
        const entry *en = &c->tab[i];
        if (!en->h) return i;
        if (en->h == h && en->ns == ns && en->first == first && en->len == len && memcmp(entry_bytes(en), p, len) == 0)
            return i;
    }
}

/* Where an entry known to be new goes (growing, evicting: no equal one). */
static void tab_put_raw(ks_tokcache *c, entry en) {
    int m = c->cap - 1, i = (int)(en.h & (uint64_t)m);
    while (c->tab[i].h) i = (i + 1) & m;
    c->tab[i] = en;
    c->n++;
}

static bool tab_grow(ks_tokcache *c) {
    int cap = c->cap ? c->cap * 2 : 256;
    entry *old = c->tab;
    int ocap = c->cap;
    entry *t = calloc((size_t)cap, sizeof *t);
    if (!t) return false;
    c->tab = t;
    c->cap = cap;
    c->n = 0;
    for (int i = 0; i < ocap; i++)
        if (old[i].h) tab_put_raw(c, old[i]);
    free(old);
    return true;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Over the budget: the least recently used entries out, down to 3/4 of it. */
static void tab_evict(ks_tokcache *c) {
    if (c->bytes <= c->max_bytes || c->n == 0) return;
    /* the clocks of the entries, each with its size, oldest first */
    uint64_t *u = malloc(sizeof *u * 2 * (size_t)c->n);
    entry *keep = calloc((size_t)c->cap, sizeof *keep);
    if (!u || !keep) { /* no memory to choose: drop everything */
        free(u);
        free(keep);
        tab_clear(c);
        return;
    }
    int k = 0;
    for (int i = 0; i < c->cap; i++)
        if (c->tab[i].h) u[2 * k] = c->tab[i].used, u[2 * k + 1] = entry_size(&c->tab[i]), k++;
    qsort(u, (size_t)k, 2 * sizeof *u, cmp_u64); /* by clock: each entry's is its own */
    size_t goal = c->max_bytes / 4 * 3, left = c->bytes;
    uint64_t cut = 0;
    for (int j = 0; j < k && left > goal; j++) {
        cut = u[2 * j] + 1;
        left -= (size_t)u[2 * j + 1];
    }
    free(u);
    entry *old = c->tab;
    c->tab = keep;
    c->n = 0;
    c->bytes = 0;
    for (int i = 0; i < c->cap; i++) {
        if (!old[i].h) continue;
        if (old[i].used < cut) {
            free(old[i].tok);
            continue;
        }
        c->bytes += entry_size(&old[i]);
        tab_put_raw(c, old[i]);
    }
    free(old);
}

/* Under mu: appends the piece's tokens to out; false when not held. */
static bool tab_get(ks_tokcache *c, uint64_t h, uint64_t ns, bool first, const char *p, size_t len, ks_tokens *out,
                    int *rc) {
    if (!c->cap) return false;
    entry *en = &c->tab[tab_slot(c, h, ns, first, p, len)];
    if (!en->h) return false;
    en->used = ++c->clock;
    *rc = ks_tokens_append(out, en->tok, en->n);
    return true;
}

/* Under mu: keeps the piece p[0, len) with its tokens tok[0, n) (nothing when
 * out of memory, or when one piece would take a quarter of the budget). */
static void tab_put(ks_tokcache *c, uint64_t h, uint64_t ns, bool first, const char *p, size_t len,
                    const int32_t *tok, int n) {
    entry en = {h, ns, first, n, len, NULL, 0};
    if (entry_size(&en) > c->max_bytes / 4) return;
    if ((c->n + 1) * 2 > c->cap && !tab_grow(c)) return;
    int i = tab_slot(c, h, ns, first, p, len);
    if (c->tab[i].h) return; /* another thread's, the same tokens */
    if (!(en.tok = malloc(sizeof(int32_t) * (size_t)n + len + 1))) return;
    memcpy(en.tok, tok, sizeof(int32_t) * (size_t)n);
    memcpy(en.tok + n, p, len);
    en.used = ++c->clock;
    c->tab[i] = en;
    c->n++;
    c->bytes += entry_size(&en);
    tab_evict(c);
}

/* ------------------------------------------------------------ the cuts */
/* The longest special token whose text starts text[i] (as llama.cpp's split
 * tries them, longest first), or NULL. */
static const special *special_at(const ks_tokcache *c, const char *text, size_t len, size_t i) {
    unsigned char b = (unsigned char)text[i];
    for (int j = c->first[b]; j < c->first[b + 1]; j++) {
        const special *s = &c->sp[j];
        if ((size_t)s->len <= len - i && memcmp(text + i, s->text, (size_t)s->len) == 0) return s;
    }
    return NULL;
}

/* Where the pieces start: cuts[0] = 0, then each offset o where the longest
 * special token S at o may start a piece (S has no left strip) and no special
 * token's text starts before o and reaches past it. The number of pieces;
 * -1 when out of memory. */
static int find_cuts(const ks_tokcache *c, const char *text, size_t len, size_t **cuts_out, int32_t **ids_out) {
    size_t cap = 64;
    int n = 1;
    size_t *cuts = malloc(sizeof *cuts * cap);
    int32_t *ids = malloc(sizeof *ids * cap);
    if (!cuts || !ids) goto oom;
    cuts[0] = 0;
    ids[0] = -1;
    size_t reach = 0; /* the furthest end of a special token's text seen so far */
    for (size_t i = 0; i < len; i++) {
        if (c->first[(unsigned char)text[i]] == c->first[(unsigned char)text[i] + 1]) continue;
        const special *s = special_at(c, text, len, i);
        if (!s) continue;
        if (i > 0 && s->cut && reach <= i) {
            if ((size_t)n == cap) {
                cap *= 2;
                size_t *nc = realloc(cuts, sizeof *cuts * cap);
                if (nc) cuts = nc;
                int32_t *ni = realloc(ids, sizeof *ids * cap);
                if (ni) ids = ni;
                if (!nc || !ni) goto oom;
            }
            cuts[n] = i;
            ids[n] = s->id;
            n++;
        }
        if (i + (size_t)s->len > reach) reach = i + (size_t)s->len;
    }
    *cuts_out = cuts;
    *ids_out = ids;
    return n;
oom:
    free(cuts);
    free(ids);
    return -1;
}

static int tokenize_raw(const ks_tokcache *c, const char *text, size_t len, bool add_special, ks_tokens *out) {
    return ks__vocab_tokenize(c->vocab, text, len, add_special, true, out);
}

/* The pieces one by one, from the table or tokenized (then kept). 1 when a
 * piece's tokens do not start with its special token: the caller tokenizes
 * the text whole. */
static int by_pieces(ks_tokcache *c, uint64_t ns, const char *text, size_t len, const size_t *cuts,
                     const int32_t *ids, int n_cuts, ks_tokens *out) {
    int start = out->n;
    for (int i = 0; i < n_cuts; i++) {
        size_t a = cuts[i], b = i + 1 < n_cuts ? cuts[i + 1] : len;
        bool first = i == 0; /* tokenized with BOS: apart from the same bytes later in a text */
        uint64_t h = piece_hash(ns, first, text + a, b - a);
        int rc = 0;
        pthread_mutex_lock(&c->mu);
        bool got = tab_get(c, h, ns, first, text + a, b - a, out, &rc);
        if (got && !rc) c->hit += (uint64_t)(out->n - start);
        pthread_mutex_unlock(&c->mu);
        if (rc) return rc;
        if (got) {
            start = out->n;
            continue;
        }
        if ((rc = tokenize_raw(c, text + a, b - a, i == 0, out))) return rc;
        if (i > 0 && (out->n == start || out->v[start] != ids[i])) {
            KS_DEBUG(MOD, "a piece at byte %zu does not start with its special token %d: tokenized whole", a,
                     (int)ids[i]);
            return 1;
        }
        pthread_mutex_lock(&c->mu);
        c->miss += (uint64_t)(out->n - start);
        tab_put(c, h, ns, first, text + a, b - a, out->v + start, out->n - start);
        pthread_mutex_unlock(&c->mu);
        start = out->n;
    }
    return 0;
}

int ks_tokcache_tokenize(ks_tokcache *c, uint64_t ns, const char *text, size_t len, ks_tokens *out) {
    if (!c->pieces || len == 0) {
        int n0 = out->n, rc = tokenize_raw(c, text, len, true, out);
        if (!rc) {
            pthread_mutex_lock(&c->mu);
            c->miss += (uint64_t)(out->n - n0);
            c->whole++;
            pthread_mutex_unlock(&c->mu);
        }
        return rc;
    }
    int n0 = out->n;
    size_t *cuts = NULL;
    int32_t *ids = NULL;
    int n_cuts = find_cuts(c, text, len, &cuts, &ids);
    if (n_cuts < 0) return KS_ENOMEM;
    int rc = by_pieces(c, ns, text, len, cuts, ids, n_cuts, out);
    free(cuts);
    free(ids);
    if (rc == 1) {
        ks_tokens_truncate(out, n0);
        if ((rc = tokenize_raw(c, text, len, true, out))) return rc;
        pthread_mutex_lock(&c->mu);
        c->miss += (uint64_t)(out->n - n0);
        c->whole++;
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    if (rc) return rc;
    if (c->check) {
        ks_tokens w = {0};
        if (tokenize_raw(c, text, len, true, &w) == 0 &&
            (w.n != out->n - n0 || memcmp(w.v, out->v + n0, sizeof *w.v * (size_t)w.n) != 0)) {
            KS_ERROR(MOD, "KS_TOKCACHE_CHECK: %zu bytes tokenized in pieces differ from the whole (%d vs %d tokens)",
                     len, out->n - n0, w.n);
            abort();
        }
        ks_tokens_free(&w);
    }
    return 0;
}

/* One run of a token list back to text, checked and kept (ks_tokcache_seed). */
static bool seed_run(ks_tokcache *c, uint64_t ns, bool first, const int32_t *tok, int n, ks_tokens *scratch,
                     char **text, size_t *cap) {
    if (n <= 0) return false;
    int32_t len;
    for (;;) {
        len = llama_detokenize(c->vocab, tok, n, *text, (int32_t)(*cap > INT32_MAX ? INT32_MAX : *cap), false, true);
        if (len >= 0) break;
        size_t want = (size_t)-len + 1;
        char *t = realloc(*text, want);
        if (!t) return false;
        *text = t;
        *cap = want;
    }
    ks_tokens_truncate(scratch, 0);
    if (len == 0 || tokenize_raw(c, *text, (size_t)len, first, scratch) != 0) return false;
    /* the run the text tokenizes to, BOS included on the first */
    if (scratch->n != n + (first && llama_vocab_get_add_bos(c->vocab) ? 1 : 0)) return false;
    const int32_t *got = scratch->v + (scratch->n - n);
    if (memcmp(got, tok, sizeof *tok * (size_t)n) != 0) return false;
    uint64_t h = piece_hash(ns, first, *text, (size_t)len);
    pthread_mutex_lock(&c->mu);
    tab_put(c, h, ns, first, *text, (size_t)len, scratch->v, scratch->n);
    pthread_mutex_unlock(&c->mu);
    return true;
}

int ks_tokcache_seed(ks_tokcache *c, uint64_t ns, const int32_t *tok, int n) {
    if (!c->pieces || n <= 0) return 0;
    int end = 0;
    while (end < n && tok[end] >= 0 && tok[end] < c->n_vocab) end++; /* media pseudo-tokens are negative */
    int start = 0;
    bool bos = llama_vocab_get_add_bos(c->vocab);
    if (bos) {
        if (end == 0 || tok[0] != llama_vocab_bos(c->vocab)) return 0;
        start = 1;
    }
    ks_tokens scratch = {0};
    char *text = NULL;
    size_t cap = 0;
    int kept = 0;
    for (int a = start; a < end;) {
        int b = a + 1;
        while (b < end && !c->is_cut[tok[b]]) b++;
        kept += seed_run(c, ns, a == start, tok + a, b - a, &scratch, &text, &cap);
        a = b;
    }
    free(text);
    ks_tokens_free(&scratch);
    return kept;
}

void ks_tokcache_get_stats(ks_tokcache *c, ks_tokcache_stats *st) {
    memset(st, 0, sizeof *st);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    st->hit_tokens = c->hit;
    st->miss_tokens = c->miss;
    st->whole = c->whole;
    st->bytes = c->bytes;
    st->entries = c->n;
    st->pieces = c->pieces;
    pthread_mutex_unlock(&c->mu);
}

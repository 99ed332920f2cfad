/*
 * mkmodel.c — random-weight GGUF models for tests and benchmarks. See mkmodel.h.
 *
 * The GGUF header (keys, vocabulary, tensor infos) is built with gguf.h and
 * written first with gguf_get_meta_data; the tensor data then follows tensor
 * by tensor, generated in chunks of rows, so that even the 421 MiB bench model
 * needs about 32 MiB of memory (two chunk buffers). Offsets are the ones gguf
 * computed (each tensor padded to the alignment), and the writer checks that
 * it lands on every one of them.
 */
#include "engine/mkmodel.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "ggml.h"
#include "gguf.h"

#define MOD "mkmodel"

/* ------------------------------------------------------------------ presets */
typedef struct preset {
    const char *name;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
    int n_vocab_max;   /* tiny: stop adding words before this; bench: pad to it */
    bool rich_vocab;   /* capitalised and unprefixed word variants */
    bool pad_vocab;    /* fill up to n_vocab_max with synthetic "▁w<id>" pieces */
    enum ggml_type wtype;
    uint32_t ftype;    /* general.file_type (llama_ftype: 1 mostly F16, 7 mostly Q8_0) */
} preset;

enum { FTYPE_F16 = 1, FTYPE_Q8_0 = 7 };

static const preset k_presets[] = {
    {"tiny", 64, 2, 4, 2, 128, 8192, 1000, false, false, GGML_TYPE_F16, FTYPE_F16},
    {"bench", 896, 24, 14, 2, 4864, 32768, 32000, true, true, GGML_TYPE_Q8_0, FTYPE_Q8_0},
};

const char *ks_mkmodel_presets(void) { return "tiny|bench"; }

static const preset *find_preset(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(k_presets[i].name, name)) return &k_presets[i];
    return NULL;
}

/* Output-row scales (design note 4 in mkmodel.h). */
#define SCALE_WORD 1.0f
#define SCALE_PUNCT 0.8f
#define SCALE_PIECE 0.15f
#define SCALE_GLUED_WORD 0.3f  /* unprefixed "word": glues onto the previous word */
#define SCALE_CAP_WORD 0.5f    /* "▁Word": otherwise capitals crowd out lowercase */
#define SCALE_CONTROL 0.05f
#define SCALE_IM_END 1.6f

/* Standard deviation of the token embeddings. With random weights the
 * attention output drifts towards one common vector (nearly uniform attention
 * averages the context), which makes greedy output repeat one word; embeddings
 * of the size of the layers' outputs keep the current token visible in the
 * residual stream (measured: 0.4 gave "still still still ...", 1.0 varied
 * text). RMS norm removes the overall scale anyway. */
#define EMBD_STD 1.0f

/* Gain of the residual projections. Each layer's attention adds a nearly
 * context-independent vector, and over 24 layers these add up until every
 * position predicts the same word. Scaling the residual projections down with
 * depth (as GPT-2 does at init) keeps the current token and its context
 * visible: measured on bench, gain 1 repeats one word, 1/sqrt(2 n_layer)
 * makes every reply the same chain, 1.5/sqrt(n_layer) reads varied. */
static float resid_gain(const preset *p) {
    float g = 1.5f / sqrtf((float)p->n_layer);
    return g < 1.0f ? g : 1.0f;
}

static const char k_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}";

/* Common English words, most frequent first (a classic frequency list), plus a
 * few chat words. The tiny preset takes words from the front while the
 * vocabulary stays under its limit. */
static const char k_words[] =
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by not word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air "
    "well also play small end put home read hand port large spell add even land here must big high "
    "such follow act why ask men change went light kind off need house picture try us again animal "
    "point mother world near build self earth father head stand own page should country found "
    "answer school grow study still learn plant cover food sun four between state keep eye never "
    "last let thought city tree cross farm hard start might story saw far sea draw left late run "
    "while press close night real life few north open seem together next white children begin got "
    "walk example ease paper group always music those both mark often letter until mile river car "
    "feet care second book carry took science eat room friend began idea fish mountain stop once "
    "base hear horse cut sure watch color face wood main enough plain girl usual young ready above "
    "ever red list though feel talk bird soon body dog family direct pose leave song measure door "
    "product black short numeral class wind question happen complete ship area half rock order "
    "fire south problem piece told knew pass since top whole king space heard best hour better "
    "true during hundred five remember step early hold west ground interest reach fast verb sing "
    "listen six table travel less morning ten simple several vowel toward war lay against pattern "
    "slow center love person money serve appear road map rain rule govern pull cold notice voice "
    "unit power town fine certain fly fall lead cry dark machine note wait plan figure star box "
    "noun field rest correct able pound done beauty drive stood contain front teach week final "
    "gave green oh quick develop ocean warm free minute strong special mind behind clear tail "
    "produce fact street inch multiply nothing course stay wheel full force blue object decide "
    "surface deep moon island foot system busy test record boat common gold possible plane stead "
    "dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire "
    "bring yes distant fill east paint language among "
    "hello thanks please sorry okay chat model token cache prompt reply user assistant";

/* -------------------------------------------------------------------- PRNG */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct rng { uint64_t s[4]; } rng;

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng *r) { /* xoshiro256** */
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

/* One independent stream per tensor: the seed and the name, mixed. */
static void rng_seed(rng *r, uint64_t seed, const char *name) {
    uint64_t x = seed;
    uint64_t m = splitmix64(&x) ^ fnv1a64(name);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&m);
}

/* A "normal-ish" value with mean 0 and standard deviation 1: the sum of two
 * independent uniforms (a triangular distribution on [-sqrt 6, sqrt 6]). One
 * 64-bit draw gives both 24-bit uniforms, so the stream is one draw per value. */
static inline float rng_tri(rng *r) {
    uint64_t x = rng_next(r);
    float a = (float)(x >> 40) * (1.0f / 16777216.0f);
    float b = (float)((x >> 16) & 0xffffff) * (1.0f / 16777216.0f);
    return (a + b - 1.0f) * 2.44948974f; /* sqrt(6): variance of (a+b-1) is 1/6 */
}

/* -------------------------------------------------------------- vocabulary */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_BYTE = 6 };

typedef struct vocab {
    char **text;
    float *score;
    int32_t *type;
    float *out_scale;
    int n, cap;
    int *slots; /* open-addressing hash of ids (-1: empty), for dedup */
    int n_slots;
} vocab;

static void vocab_free(vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->score);
    free(v->type);
    free(v->out_scale);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

static int vocab_init(vocab *v, int cap) {
    memset(v, 0, sizeof *v);
    v->cap = cap;
    v->n_slots = 1;
    while (v->n_slots < cap * 2) v->n_slots <<= 1;
    v->text = calloc((size_t)cap, sizeof *v->text);
    v->score = calloc((size_t)cap, sizeof *v->score);
    v->type = calloc((size_t)cap, sizeof *v->type);
    v->out_scale = calloc((size_t)cap, sizeof *v->out_scale);
    v->slots = malloc((size_t)v->n_slots * sizeof *v->slots);
    if (!v->text || !v->score || !v->type || !v->out_scale || !v->slots) {
        vocab_free(v);
        return KS_ENOMEM;
    }
    for (int i = 0; i < v->n_slots; i++) v->slots[i] = -1;
    return 0;
}

/* Slot of text: where it is, or the empty slot where it would go. */
static int vocab_slot(const vocab *v, const char *text) {
    size_t mask = (size_t)v->n_slots - 1;
    size_t i = (size_t)fnv1a64(text) & mask;
    while (v->slots[i] >= 0 && strcmp(v->text[v->slots[i]], text) != 0) i = (i + 1) & mask;
    return (int)i;
}

static int vocab_find(const vocab *v, const char *text) { return v->slots[vocab_slot(v, text)]; }

/* Adds a token; returns its id, the existing id when text is already there,
 * KS_ENOMEM, or KS_ENOSPC when the vocabulary is full. */
static int vocab_add(vocab *v, const char *text, int32_t type, float out_scale) {
    int slot = vocab_slot(v, text);
    if (v->slots[slot] >= 0) return v->slots[slot];
    if (v->n >= v->cap) return KS_ENOSPC;
    char *t = strdup(text);
    if (!t) return KS_ENOMEM;
    int id = v->n++;
    v->text[id] = t;
    v->type[id] = type;
    v->out_scale[id] = out_scale;
    /* SentencePiece scores: higher merges first. Specials and bytes score 0
     * as in Llama's vocabulary; pieces get -1, -2, ... in the order added. */
    v->score[id] = type == TT_NORMAL ? -(float)(id - KS_MKMODEL_TOK_SPACE + 1) : 0.0f;
    v->slots[slot] = id;
    return id;
}

#define SPACE_UTF8 "\xe2\x96\x81" /* U+2581 "▁", SentencePiece's space */

/* How many tokens the chain of prefixes of text (a byte string; prefixes at
 * character boundaries) would add. Prefixes start at the first character after
 * `skip` bytes (the "▁" or a first ASCII letter, which always exist). */
static int chain_missing(const vocab *v, const char *text, size_t skip) {
    char buf[128];
    size_t len = strlen(text);
    int missing = 0;
    for (size_t i = skip + 1; i <= len && i < sizeof buf; i++) {
        memcpy(buf, text, i);
        buf[i] = '\0';
        if (vocab_find(v, buf) < 0) missing++;
    }
    return missing;
}

/* Adds every prefix of text (longer than skip bytes); the full text gets
 * full_scale, the partial pieces SCALE_PIECE. Returns 0 or a vocab_add error. */
static int chain_add(vocab *v, const char *text, size_t skip, float full_scale) {
    char buf[128];
    size_t len = strlen(text);
    if (len >= sizeof buf) return 0;
    for (size_t i = skip + 1; i <= len; i++) {
        memcpy(buf, text, i);
        buf[i] = '\0';
        int id = vocab_add(v, buf, TT_NORMAL, SCALE_PIECE);
        if (id < 0) return id;
        /* A word that was first added as a piece of a longer word is still a
         * whole word: raise its scale. */
        if (i == len && v->out_scale[id] < full_scale) v->out_scale[id] = full_scale;
    }
    return 0;
}

typedef int (*word_fn)(vocab *v, const char *word, void *ud);

/* Calls fn on each word of k_words until it returns non-zero. */
static int each_word(vocab *v, word_fn fn, void *ud) {
    const char *p = k_words;
    char w[64];
    while (*p) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (n == 0) break;
        if (n < sizeof w) {
            memcpy(w, p, n);
            w[n] = '\0';
            int rc = fn(v, w, ud);
            if (rc) return rc;
        }
        p += n;
    }
    return 0;
}

typedef struct word_ctx {
    const preset *p;
    int variant; /* 0 "▁word", 1 "▁Word", 2 "word", 3 "Word" */
} word_ctx;

static int add_word(vocab *v, const char *word, void *ud) {
    const word_ctx *wc = ud;
    char text[80];
    const char *pfx = wc->variant < 2 ? SPACE_UTF8 : "";
    snprintf(text, sizeof text, "%s%s", pfx, word);
    size_t skip = strlen(pfx);
    if (wc->variant == 1 || wc->variant == 3) {
        char *c = &text[skip];
        if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
        else return 0; /* "I": no second variant */
    }
    float scale = wc->variant == 0 ? SCALE_WORD : wc->variant == 1 ? SCALE_CAP_WORD : SCALE_GLUED_WORD;
    /* The tiny preset stops at the first word whose chain does not fit. */
    if (!wc->p->pad_vocab && v->n + chain_missing(v, text, skip) > wc->p->n_vocab_max) return 1;
    return chain_add(v, text, skip, scale);
}

/* ------------------------------------------------- chat template specials */
/* Template families (design note 6 in mkmodel.h), tried in this order: the
 * first whose marker the template contains. `extra`: specials the family's
 * models have although the template text may not write them (a BOS that
 * comes in through bos_token, an end-of-message token). */
typedef struct family {
    const char *name;
    const char *marker;
    const char *bos;
    bool add_bos;
    const char *eog;
    const char *extra[8];
} family;

static const family k_families[] = {
    {"llama3", "<|start_header_id|>", "<|begin_of_text|>", true, "<|eot_id|>",
     {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"}},
    {"harmony", "<|channel|>", "<s>", false, "<|return|>",
     {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>",
      "<|endoftext|>"}},
    {"mistral", "[INST]", "<s>", true, "</s>", {0}},
    {"chatml", "<|im_start|>", "<s>", false, "<|im_end|>", {"<|endoftext|>"}},
};
static const family k_family_other = {"other", NULL, "<s>", false, NULL, {0}};

/* End-of-turn tokens for a template of no known family, by preference: the
 * first one the template contains ("</s>" when none). */
static const char *const k_eog_by_presence[] = {"<|im_end|>", "<|eot_id|>", "<|return|>", "<|end|>",
                                               "<end_of_turn>", "<|endoftext|>"};

/* Tag-like specials added when the template contains them. */
static const char *const k_tags[] = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                                     "<think>", "</think>"};

/* Specials that appear in the assistant's own output, where the output
 * parser must see them: USER_DEFINED, which llama_token_to_piece renders
 * even with special=false (CONTROL tokens render as ""). llama.cpp itself
 * forces gpt-oss's <|start|>, <|message|>, <|channel|>, <|constrain|> to
 * USER_DEFINED. */
static const char *const k_user_defined[] = {"<tool_call>", "</tool_call>", "<tool_response>",
                                             "</tool_response>", "<think>", "</think>", "[TOOL_CALLS]",
                                             "<|python_tag|>", "<|start|>", "<|message|>", "<|channel|>",
                                             "<|constrain|>"};

#define TMPL_MAX_SPECIALS 1024
#define TMPL_MAX_TOKEN 64

/* What a chat template asks of the vocabulary. */
typedef struct tmpl_info {
    const family *fam;
    const char *eog;  /* static */
    bool add_bos;
    char **tok;       /* owned */
    int32_t *type;
    int n, cap;
    int bos_id, eog_id; /* set by build_vocab */
} tmpl_info;

static void tmpl_info_free(tmpl_info *ti) {
    for (int i = 0; i < ti->n; i++) free(ti->tok[i]);
    free(ti->tok);
    free(ti->type);
    memset(ti, 0, sizeof *ti);
}

static bool in_list(const char *s, size_t n, const char *const *list, size_t nlist) {
    for (size_t i = 0; i < nlist; i++)
        if (strlen(list[i]) == n && !memcmp(list[i], s, n)) return true;
    return false;
}

/* Adds the special s[0..n) once. Returns 0, KS_ENOMEM or KS_EINVAL (too many). */
static int tmpl_add(tmpl_info *ti, const char *s, size_t n) {
    for (int i = 0; i < ti->n; i++)
        if (strlen(ti->tok[i]) == n && !memcmp(ti->tok[i], s, n)) return 0;
    if (ti->n == TMPL_MAX_SPECIALS) return KS_EINVAL;
    if (ti->n == ti->cap) {
        int cap = ti->cap ? ti->cap * 2 : 32;
        char **tok = realloc(ti->tok, (size_t)cap * sizeof *tok);
        if (!tok) return KS_ENOMEM;
        ti->tok = tok;
        int32_t *type = realloc(ti->type, (size_t)cap * sizeof *type);
        if (!type) return KS_ENOMEM;
        ti->type = type;
        ti->cap = cap;
    }
    char *t = strndup(s, n);
    if (!t) return KS_ENOMEM;
    ti->tok[ti->n] = t;
    ti->type[ti->n] = in_list(s, n, k_user_defined, sizeof k_user_defined / sizeof k_user_defined[0])
                          ? TT_USER_DEFINED
                          : TT_CONTROL;
    ti->n++;
    return 0;
}

/* Length of a special at s: "<|name|>" or "[NAME]"/"[/NAME]" (name of
 * letters, digits and '_'; upper case and at least two characters in
 * brackets); 0 when there is none. */
static size_t special_at(const char *s) {
    size_t i = 0;
    if (s[0] == '<' && s[1] == '|') {
        for (i = 2; i < TMPL_MAX_TOKEN && (isalnum((unsigned char)s[i]) || s[i] == '_'); i++) {}
        return i > 2 && s[i] == '|' && s[i + 1] == '>' ? i + 2 : 0;
    }
    if (s[0] == '[') {
        size_t b = s[1] == '/' ? 2 : 1;
        for (i = b; i < TMPL_MAX_TOKEN && ((s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_'); i++) {}
        return i >= b + 2 && s[i] == ']' ? i + 1 : 0;
    }
    return 0;
}

/* Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF). Returns the offset of the first bad byte, or -1. */
static long utf8_bad_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + len > n) return (long)i;
        unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
        if (c == 0xE0) lo = 0xA0;
        else if (c == 0xED) hi = 0x9F;
        else if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F;
        if (len > 1 && (s[i + 1] < lo || s[i + 1] > hi)) return (long)i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return (long)i;
        i += len;
    }
    return -1;
}

/* Checks the template text and collects its specials, family, BOS and EOG
 * (design note 6). Errors: KS_EINVAL (empty, too long, not UTF-8, too many
 * specials; message in err), KS_ENOMEM. */
static int tmpl_analyse(const char *text, tmpl_info *ti, char *err, size_t errlen) {
    memset(ti, 0, sizeof *ti);
    size_t len = strlen(text);
    if (len == 0) {
        ks_set_err(err, errlen, "the chat template is empty");
        return KS_EINVAL;
    }
    if (len > KS_MKMODEL_TMPL_MAX) {
        ks_set_err(err, errlen, "the chat template is %zu bytes, more than the limit of %d", len,
                   KS_MKMODEL_TMPL_MAX);
        return KS_EINVAL;
    }
    long bad = utf8_bad_at((const unsigned char *)text, len);
    if (bad >= 0) {
        ks_set_err(err, errlen, "the chat template is not valid UTF-8 (byte %ld)", bad);
        return KS_EINVAL;
    }

    ti->fam = &k_family_other;
    for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++)
        if (strstr(text, k_families[i].marker)) { ti->fam = &k_families[i]; break; }
    ti->eog = ti->fam->eog;
    for (size_t i = 0; !ti->eog && i < sizeof k_eog_by_presence / sizeof k_eog_by_presence[0]; i++)
        if (strstr(text, k_eog_by_presence[i])) ti->eog = k_eog_by_presence[i];
    if (!ti->eog) ti->eog = "</s>";
    /* A template that writes bos_token itself is one of a model that starts
     * with BOS; llama.cpp's common then strips the written one. */
    ti->add_bos = ti->fam->add_bos || strstr(text, "bos_token") != NULL;

    int rc = 0;
    for (int i = 0; !rc && i < 8 && ti->fam->extra[i]; i++)
        rc = tmpl_add(ti, ti->fam->extra[i], strlen(ti->fam->extra[i]));
    if (!rc) rc = tmpl_add(ti, ti->eog, strlen(ti->eog));
    for (size_t i = 0; !rc && i < sizeof k_tags / sizeof k_tags[0]; i++)
        if (strstr(text, k_tags[i])) rc = tmpl_add(ti, k_tags[i], strlen(k_tags[i]));
    /* Jinja comments ({# ... #}) are skipped: gpt-oss's mentions a "<|final|>"
     * no model of it has. */
    for (const char *s = text; !rc && *s; s++) {
        if (s[0] == '{' && s[1] == '#') {
            const char *end = strstr(s + 2, "#}");
            if (!end) break;
            s = end + 1;
            continue;
        }
        size_t n = special_at(s);
        if (n) {
            rc = tmpl_add(ti, s, n);
            s += n - 1;
        }
    }
    if (rc == KS_EINVAL)
        ks_set_err(err, errlen, "the chat template has more than %d special tokens", TMPL_MAX_SPECIALS);
    if (rc) tmpl_info_free(ti);
    return rc;
}

/* The vocabulary of preset p (design note 3); with a template (ti not NULL)
 * its specials follow the preset's tokens and ti's bos_id/eog_id are set. */
static int build_vocab(const preset *p, tmpl_info *ti, vocab *v) {
    int rc = vocab_init(v, p->n_vocab_max + (ti ? ti->n : 0));
    if (rc) return rc;
    char buf[32];
    /* Fixed ids (mkmodel.h): checked by the asserts below. */
    vocab_add(v, "<unk>", TT_UNKNOWN, SCALE_CONTROL);
    vocab_add(v, "<s>", TT_CONTROL, SCALE_CONTROL);
    vocab_add(v, "</s>", TT_CONTROL, SCALE_CONTROL);
    for (int b = 0; b < 256; b++) {
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        vocab_add(v, buf, TT_BYTE, SCALE_CONTROL);
    }
    vocab_add(v, "<|im_start|>", TT_CONTROL, SCALE_CONTROL);
    vocab_add(v, "<|im_end|>", TT_CONTROL, SCALE_IM_END);
    rc = vocab_add(v, SPACE_UTF8, TT_NORMAL, SCALE_PIECE);
    if (rc < 0) goto fail;
    assert(rc == KS_MKMODEL_TOK_SPACE && v->n - 1 == KS_MKMODEL_TOK_SPACE);
    assert(!strcmp(v->text[KS_MKMODEL_TOK_IM_END], "<|im_end|>"));

    /* Every printable ASCII character, alone and after a space, so that any
     * ASCII text tokenizes without byte fallback. */
    for (int c = 0x21; c < 0x7f; c++) {
        bool punct = strchr(".,!?:;", c) != NULL;
        snprintf(buf, sizeof buf, "%c", c);
        if ((rc = vocab_add(v, buf, TT_NORMAL, punct ? SCALE_PUNCT : SCALE_PIECE)) < 0) goto fail;
        snprintf(buf, sizeof buf, SPACE_UTF8 "%c", c);
        if ((rc = vocab_add(v, buf, TT_NORMAL, SCALE_PIECE)) < 0) goto fail;
    }

    word_ctx wc = {p, 0};
    int nvar = p->rich_vocab ? 4 : 1;
    for (wc.variant = 0; wc.variant < nvar; wc.variant++) {
        rc = each_word(v, add_word, &wc);
        if (rc < 0) goto fail;
        if (rc > 0) break; /* full */
    }

    if (p->pad_vocab) {
        while (v->n < p->n_vocab_max) {
            snprintf(buf, sizeof buf, SPACE_UTF8 "w%d", v->n);
            if ((rc = vocab_add(v, buf, TT_NORMAL, SCALE_CONTROL)) < 0) goto fail;
        }
    }

    if (ti) {
        /* After every preset token, so that the fixed ids of mkmodel.h hold
         * for every template. A special that is already there (<s>, </s>,
         * <|im_start|>, <|im_end|>) keeps its id and takes the type the
         * template wants. */
        for (int i = 0; i < ti->n; i++) {
            if ((rc = vocab_add(v, ti->tok[i], ti->type[i], SCALE_CONTROL)) < 0) goto fail;
            v->type[rc] = ti->type[i];
        }
        ti->bos_id = vocab_find(v, ti->fam->bos);
        ti->eog_id = vocab_find(v, ti->eog);
        assert(ti->bos_id >= 0 && ti->eog_id >= 0);
        /* The template's end of turn, not ChatML's, is the one a reply ends with. */
        v->out_scale[KS_MKMODEL_TOK_IM_END] = SCALE_CONTROL;
        v->out_scale[ti->eog_id] = SCALE_IM_END;
    }
    return 0;
fail:
    vocab_free(v);
    return rc == KS_ENOSPC ? KS_EINVAL : rc; /* a preset too small for its words: a bug */
}

/* ------------------------------------------------------------------ tensors */
/* TK_RESID: the projections that write into the residual stream
 * (attn_output, ffn_down), scaled by resid_gain(). */
enum tkind { TK_NORM, TK_EMBD, TK_OUTPUT, TK_WEIGHT, TK_RESID };

typedef struct tspec {
    char name[64];
    int64_t ne0, ne1; /* ggml order: ne0 = input dimension (row length) */
    enum ggml_type type;
    enum tkind kind;
} tspec;

/* The tensors of a `llama` model in file order (shapes: docs/LLAMA_FACTS.md). */
static int make_specs(const preset *p, int n_vocab, tspec **out, int *n_out) {
    int n = 3 + 9 * p->n_layer;
    tspec *t = calloc((size_t)n, sizeof *t);
    if (!t) return KS_ENOMEM;
    int64_t E = p->n_embd, V = n_vocab, F = p->n_ff;
    int64_t d = p->n_embd / p->n_head;
    int64_t Hd = d * p->n_head, Hkvd = d * p->n_head_kv;
    int k = 0;
#define SPEC(nm, a, b, ty, kd) do { snprintf(t[k].name, sizeof t[k].name, "%s", nm); \
        t[k].ne0 = (a); t[k].ne1 = (b); t[k].type = (ty); t[k].kind = (kd); k++; } while (0)
    SPEC("token_embd.weight", E, V, p->wtype, TK_EMBD);
    SPEC("output_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
    SPEC("output.weight", E, V, p->wtype, TK_OUTPUT);
    for (int l = 0; l < p->n_layer; l++) {
        char nm[64];
#define LSPEC(suffix, a, b, ty, kd) do { snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix); \
        SPEC(nm, a, b, ty, kd); } while (0)
        LSPEC("attn_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
        LSPEC("attn_q.weight", E, Hd, p->wtype, TK_WEIGHT);
        LSPEC("attn_k.weight", E, Hkvd, p->wtype, TK_WEIGHT);
        LSPEC("attn_v.weight", E, Hkvd, p->wtype, TK_WEIGHT);
        LSPEC("attn_output.weight", Hd, E, p->wtype, TK_RESID);
        LSPEC("ffn_norm.weight", E, 1, GGML_TYPE_F32, TK_NORM);
        LSPEC("ffn_gate.weight", E, F, p->wtype, TK_WEIGHT);
        LSPEC("ffn_up.weight", E, F, p->wtype, TK_WEIGHT);
        LSPEC("ffn_down.weight", F, E, p->wtype, TK_RESID);
#undef LSPEC
    }
#undef SPEC
    assert(k == n);
    *out = t;
    *n_out = n;
    return 0;
}

/* The shape of what build_vocab and make_specs made. */
static void fill_shape(const preset *p, const vocab *v, const tspec *t, int nt, const tmpl_info *ti,
                       ks_mkmodel_shape *out) {
    memset(out, 0, sizeof *out);
    out->preset = p->name;
    out->n_vocab = v->n;
    out->n_embd = p->n_embd;
    out->n_layer = p->n_layer;
    out->n_head = p->n_head;
    out->n_head_kv = p->n_head_kv;
    out->n_ff = p->n_ff;
    out->n_ctx_train = p->n_ctx_train;
    out->wtype = (int)p->wtype;
    out->wtype_name = ggml_type_name(p->wtype);
    for (int i = 0; i < nt; i++) out->n_params += (uint64_t)(t[i].ne0 * t[i].ne1);
    out->tmpl_family = ti ? ti->fam->name : "chatml";
    out->n_tmpl_specials = ti ? ti->n : 0;
    out->bos = ti ? ti->fam->bos : "<s>";
    out->eog = ti ? ti->eog : "<|im_end|>";
    out->add_bos = ti ? ti->add_bos : true;
}

int ks_mkmodel_shape_of(const char *preset_name, ks_mkmodel_shape *out) {
    const preset *p = find_preset(preset_name);
    if (!p || !out) return KS_EINVAL;
    vocab v;
    int rc = build_vocab(p, NULL, &v);
    if (rc) return rc;
    tspec *t = NULL;
    int nt = 0;
    rc = make_specs(p, v.n, &t, &nt);
    if (rc) { vocab_free(&v); return rc; }
    fill_shape(p, &v, t, nt, NULL, out);
    free(t);
    vocab_free(&v);
    return 0;
}

/* ------------------------------------------------------------------ writing */
typedef struct writer {
    FILE *f;
    int err; /* saved errno of the first failure; later writes are skipped */
} writer;

static bool w_write(writer *w, const void *buf, size_t n) {
    if (w->err) return false;
    if (n && fwrite(buf, 1, n, w->f) != n) {
        w->err = errno ? errno : EIO;
        return false;
    }
    return true;
}

/* Generates tensor t row chunk by row chunk and writes its bytes. */
static bool write_tensor(writer *w, const tspec *t, uint64_t seed, const vocab *v, float gain,
                         float *fbuf, void *qbuf, int64_t chunk_elems) {
    rng r;
    rng_seed(&r, seed, t->name);
    int64_t rows_per_chunk = chunk_elems / t->ne0;
    if (rows_per_chunk < 1) rows_per_chunk = 1;
    float std = 1.0f / sqrtf((float)t->ne0); /* 1/sqrt(fan_in) keeps activations O(1) */
    if (t->kind == TK_EMBD) std = EMBD_STD;
    if (t->kind == TK_RESID) std *= gain;
    for (int64_t r0 = 0; r0 < t->ne1; r0 += rows_per_chunk) {
        int64_t nr = t->ne1 - r0 < rows_per_chunk ? t->ne1 - r0 : rows_per_chunk;
        for (int64_t i = 0; i < nr; i++) {
            float *row = fbuf + i * t->ne0;
            float s = std;
            if (t->kind == TK_OUTPUT) s *= v->out_scale[r0 + i];
            for (int64_t j = 0; j < t->ne0; j++)
                row[j] = t->kind == TK_NORM ? 1.0f : rng_tri(&r) * s;
        }
        int64_t ne = nr * t->ne0;
        size_t nbytes;
        const void *src;
        switch (t->type) {
        case GGML_TYPE_F32:
            src = fbuf;
            nbytes = (size_t)ne * sizeof(float);
            break;
        case GGML_TYPE_F16:
            ggml_fp32_to_fp16_row(fbuf, qbuf, ne);
            src = qbuf;
            nbytes = (size_t)ne * sizeof(ggml_fp16_t);
            break;
        default:
            nbytes = ggml_quantize_chunk(t->type, fbuf, qbuf, 0, nr, t->ne0, NULL);
            src = qbuf;
            break;
        }
        assert(nbytes == ggml_row_size(t->type, t->ne0) * (size_t)nr);
        if (!w_write(w, src, nbytes)) return false;
    }
    return true;
}

/* mkdir -p of the directory part of path. */
static int make_parents(const char *path, char *err, size_t errlen) {
    char *dir = strdup(path);
    if (!dir) return KS_ENOMEM;
    char *slash = strrchr(dir, '/');
    int rc = 0;
    if (slash && slash != dir) {
        *slash = '\0';
        for (char *p = dir + 1; ; p++) {
            if (*p == '/' || *p == '\0') {
                char c = *p;
                *p = '\0';
                if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                    int e = errno;
                    ks_set_err(err, errlen, "cannot create directory '%s': %s", dir, strerror(e));
                    rc = ks_errno_map(e);
                    break;
                }
                *p = c;
                if (c == '\0') break;
            }
        }
    }
    free(dir);
    return rc;
}

/* fsyncs the directory holding path, so that the rename is durable. */
static int fsync_parent(const char *path) {
    char *dir = strdup(path);
    if (!dir) return ENOMEM;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir) d = "/";
    else if (slash) { *slash = '\0'; d = dir; }
    int e = 0;
    int fd = open(d, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) e = errno;
    if (fd >= 0) close(fd);
    free(dir);
    return e;
}

static struct gguf_context *build_gguf(const preset *p, const vocab *v, const tmpl_info *ti,
                                       const char *chat_template, const tspec *t, int nt,
                                       struct ggml_context **gctx_out) {
    struct gguf_context *g = gguf_init_empty();
    if (!g) return NULL;
    char name[64];
    snprintf(name, sizeof name, "kvstash-%s", p->name);
    gguf_set_val_str(g, "general.architecture", "llama");
    gguf_set_val_str(g, "general.name", name);
    gguf_set_val_u32(g, "general.file_type", p->ftype);
    gguf_set_val_u32(g, "general.quantization_version", GGML_QNT_VERSION);
    gguf_set_val_u32(g, "llama.vocab_size", (uint32_t)v->n);
    gguf_set_val_u32(g, "llama.context_length", (uint32_t)p->n_ctx_train);
    gguf_set_val_u32(g, "llama.embedding_length", (uint32_t)p->n_embd);
    gguf_set_val_u32(g, "llama.block_count", (uint32_t)p->n_layer);
    gguf_set_val_u32(g, "llama.feed_forward_length", (uint32_t)p->n_ff);
    gguf_set_val_u32(g, "llama.attention.head_count", (uint32_t)p->n_head);
    gguf_set_val_u32(g, "llama.attention.head_count_kv", (uint32_t)p->n_head_kv);
    gguf_set_val_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_set_val_u32(g, "llama.rope.dimension_count", (uint32_t)(p->n_embd / p->n_head));
    gguf_set_val_f32(g, "llama.rope.freq_base", 10000.0f);

    gguf_set_val_str(g, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", (const char **)v->text, (size_t)v->n);
    gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->score, (size_t)v->n);
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->type, (size_t)v->n);
    /* Without a template the keys are exactly those of before templates
     * existed: the presets' files must not change (design note 6). */
    gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", ti ? (uint32_t)ti->bos_id : KS_MKMODEL_TOK_BOS);
    gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", ti ? (uint32_t)ti->eog_id : KS_MKMODEL_TOK_IM_END);
    /* llama.cpp guesses the end-of-turn token by its text; say it. */
    if (ti) gguf_set_val_u32(g, "tokenizer.ggml.eot_token_id", (uint32_t)ti->eog_id);
    gguf_set_val_u32(g, "tokenizer.ggml.unknown_token_id", KS_MKMODEL_TOK_UNK);
    gguf_set_val_bool(g, "tokenizer.ggml.add_bos_token", ti ? ti->add_bos : true);
    gguf_set_val_bool(g, "tokenizer.ggml.add_eos_token", false);
    /* Without this llama.cpp inserts "▁" after every special token of ChatML. */
    gguf_set_val_bool(g, "tokenizer.ggml.add_space_prefix", false);
    gguf_set_val_str(g, "tokenizer.chat_template", ti ? chat_template : k_chatml);

    /* Tensor infos only: a no_alloc ggml context holds the shapes; the data
     * is written separately (see the file comment). */
    struct ggml_init_params ip = {
        .mem_size = (size_t)nt * ggml_tensor_overhead() + 1024,
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    struct ggml_context *gctx = ggml_init(ip);
    if (!gctx) {
        gguf_free(g);
        return NULL;
    }
    for (int i = 0; i < nt; i++) {
        struct ggml_tensor *x = t[i].ne1 == 1 ? ggml_new_tensor_1d(gctx, t[i].type, t[i].ne0)
                                              : ggml_new_tensor_2d(gctx, t[i].type, t[i].ne0, t[i].ne1);
        ggml_set_name(x, t[i].name);
        gguf_add_tensor(g, x);
    }
    *gctx_out = gctx;
    return g;
}

ks_mkmodel_params ks_mkmodel_params_default(void) {
    ks_mkmodel_params mp = {.preset = "tiny", .seed = 1, .chat_template = NULL};
    return mp;
}

int ks_mkmodel(const char *preset_name, uint64_t seed, const char *out_path, char *err, size_t errlen) {
    ks_mkmodel_params mp = {.preset = preset_name, .seed = seed, .chat_template = NULL};
    return ks_mkmodel_write(&mp, out_path, NULL, err, errlen);
}

int ks_mkmodel_write(const ks_mkmodel_params *mp, const char *out_path, ks_mkmodel_shape *shape,
                     char *err, size_t errlen) {
    if (!mp) {
        ks_set_err(err, errlen, "no parameters");
        return KS_EINVAL;
    }
    const char *preset_name = mp->preset;
    const uint64_t seed = mp->seed;
    const preset *p = find_preset(preset_name);
    if (!p) {
        ks_set_err(err, errlen, "unknown preset '%s' (known: %s)", preset_name ? preset_name : "(null)",
                   ks_mkmodel_presets());
        return KS_EINVAL;
    }
    if (!out_path || !out_path[0]) {
        ks_set_err(err, errlen, "no output path");
        return KS_EINVAL;
    }

    int rc = 0;
    tmpl_info tinfo = {0};
    tmpl_info *ti = NULL;
    vocab v = {0};
    tspec *t = NULL;
    int nt = 0;
    struct gguf_context *g = NULL;
    struct ggml_context *gctx = NULL;
    void *meta = NULL;
    float *fbuf = NULL;
    void *qbuf = NULL;
    char *tmp = NULL;
    int fd = -1;
    writer w = {0};

    if (mp->chat_template) {
        if ((rc = tmpl_analyse(mp->chat_template, &tinfo, err, errlen)) != 0) goto done;
        ti = &tinfo;
    }
    if ((rc = build_vocab(p, ti, &v)) != 0) goto done;
    if ((rc = make_specs(p, v.n, &t, &nt)) != 0) goto done;
    if (shape) fill_shape(p, &v, t, nt, ti, shape);
    g = build_gguf(p, &v, ti, mp->chat_template, t, nt, &gctx);
    if (!g) { rc = KS_ENOMEM; goto done; }

    size_t meta_size = gguf_get_meta_size(g);
    meta = malloc(meta_size);
    /* Chunks of about 4 Mi floats, but at least one row. */
    int64_t chunk = 1 << 22;
    if (chunk < p->n_ff) chunk = p->n_ff;
    fbuf = malloc((size_t)chunk * sizeof(float));
    qbuf = malloc((size_t)chunk * sizeof(float));
    tmp = malloc(strlen(out_path) + 16);
    if (!meta || !fbuf || !qbuf || !tmp) { rc = KS_ENOMEM; goto done; }
    gguf_get_meta_data(g, meta);

    if ((rc = make_parents(out_path, err, errlen)) != 0) goto done;
    sprintf(tmp, "%s.tmp.XXXXXX", out_path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        ks_set_err(err, errlen, "cannot write '%s' (temporary file '%s'): %s", out_path, tmp, strerror(e));
        rc = ks_errno_map(e);
        tmp[0] = '\0'; /* nothing to remove */
        goto done;
    }
    (void)fchmod(fd, 0644); /* mkstemp makes 0600; a model is not a secret */
    w.f = fdopen(fd, "wb");
    if (!w.f) { rc = ks_errno_map(errno); goto done; }
    fd = -1; /* owned by w.f now */

    const size_t align = gguf_get_alignment(g);
    static const uint8_t zeros[64];
    assert(align <= sizeof zeros);
    w_write(&w, meta, meta_size);
    for (int i = 0; i < nt && !w.err; i++) {
        /* The data must land exactly where the header says it is. */
        long pos = ftell(w.f);
        if (pos < 0 || (size_t)pos != meta_size + gguf_get_tensor_offset(g, i)) {
            ks_set_err(err, errlen, "internal error: tensor %s at offset %ld, header says %zu", t[i].name,
                       pos, meta_size + gguf_get_tensor_offset(g, i));
            rc = KS_EIO;
            goto done;
        }
        size_t nbytes = gguf_get_tensor_size(g, i);
        if (!write_tensor(&w, &t[i], seed, &v, resid_gain(p), fbuf, qbuf, chunk)) break;
        size_t pad = GGML_PAD(nbytes, align) - nbytes;
        w_write(&w, zeros, pad);
    }
    if (!w.err && fflush(w.f) != 0) w.err = errno;
    if (!w.err && fsync(fileno(w.f)) != 0) w.err = errno;
    if (fclose(w.f) != 0 && !w.err) w.err = errno;
    w.f = NULL;
    if (w.err) {
        ks_set_err(err, errlen, "writing '%s': %s", tmp, strerror(w.err));
        rc = ks_errno_map(w.err);
        goto done;
    }
    if (rename(tmp, out_path) != 0) {
        int e = errno;
        ks_set_err(err, errlen, "cannot rename '%s' to '%s': %s", tmp, out_path, strerror(e));
        rc = ks_errno_map(e);
        goto done;
    }
    tmp[0] = '\0'; /* renamed: nothing to remove */
    int e = fsync_parent(out_path);
    if (e) KS_WARN(MOD, "fsync of the directory of '%s': %s", out_path, strerror(e));

done:
    if (w.f) fclose(w.f);
    if (fd >= 0) close(fd);
    if (rc && tmp && tmp[0]) unlink(tmp);
    free(tmp);
    free(qbuf);
    free(fbuf);
    free(meta);
    if (gctx) ggml_free(gctx);
    if (g) gguf_free(g);
    free(t);
    vocab_free(&v);
    tmpl_info_free(&tinfo);
    return rc;
}

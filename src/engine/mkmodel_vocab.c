/*
 * mkmodel_vocab.c — the vocabulary of a generated model (design notes in
 * mkmodel.h): control and byte tokens, SentencePiece-style word pieces from a
 * fixed word list, padding for the bench preset, and a chat template's
 * specials.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/mkmodel.h"
#include "engine/mkmodel_int.h"

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




void ks__mkmodel_vocab_free(vocab *v) {
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
        ks__mkmodel_vocab_free(v);
        return KS_ENOMEM;
    }
    for (int i = 0; i < v->n_slots; i++) v->slots[i] = -1;
    return 0;
}

/* Slot of text: where it is, or the empty slot where it would go. */
static int vocab_slot(const vocab *v, const char *text) {
    size_t mask = (size_t)v->n_slots - 1;
    size_t i = (size_t)ks__mkmodel_fnv1a64(text) & mask;
    while (v->slots[i] >= 0 && strcmp(v->text[v->slots[i]], text) != 0) i = (i + 1) & mask;
    return (int)i;
}

int ks__mkmodel_vocab_find(const vocab *v, const char *text) { return v->slots[vocab_slot(v, text)]; }

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
        if (ks__mkmodel_vocab_find(v, buf) < 0) missing++;
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

/* Adds every prefix of text that ends at a character boundary and is at
 * least two characters long (its first character is always a token). */
static int chain_add_chars(vocab *v, const char *text, float full_scale) {
    char buf[128];
    size_t len = strlen(text);
    if (len >= sizeof buf) return 0;
    int n_chars = 0;
    for (size_t i = 1; i <= len; i++) {
        if (i < len && ((unsigned char)text[i] & 0xC0) == 0x80) continue; /* inside a character */
        if (++n_chars < 2) continue;
        memcpy(buf, text, i);
        buf[i] = '\0';
        int id = vocab_add(v, buf, TT_NORMAL, i == len ? full_scale : SCALE_PIECE);
        if (id < 0) return id;
        if (i == len && v->out_scale[id] < full_scale) v->out_scale[id] = full_scale;
    }
    return 0;
}

/* The agent vocabulary (preset.agent_vocab): the generated words, after a
 * space ("▁word") and glued ("word", as in "additionalProperties" or after a
 * quote), and the punctuation runs, each with its chain of prefixes; a
 * newline token so that line breaks are not byte tokens. */
static int add_agent_vocab(vocab *v) {
    int rc = vocab_add(v, "\n", TT_NORMAL, SCALE_PUNCT);
    if (rc < 0) return rc;
    for (const char *const *w = ks__mkmodel_agent_words; *w; w++) {
        char text[80];
        snprintf(text, sizeof text, SPACE_UTF8 "%s", *w);
        if ((rc = chain_add(v, text, strlen(SPACE_UTF8), SCALE_WORD)) < 0) return rc;
        if ((rc = chain_add(v, *w, 0, SCALE_GLUED_WORD)) < 0) return rc;
    }
    for (const char *const *r = ks__mkmodel_agent_runs; *r; r++)
        if ((rc = chain_add_chars(v, *r, SCALE_PUNCT)) < 0) return rc;
    return 0;
}

/* Qwen2.5-Coder's fill-in-the-middle specials, which llama.cpp's vocabulary
 * finds by their text (llama-vocab.cpp: fim_pre/suf/mid/pad/rep/sep). */
static const char *const FIM_SPECIALS[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
                                           "<|repo_name|>", "<|file_sep|>"};
#define N_FIM ((int)(sizeof FIM_SPECIALS / sizeof FIM_SPECIALS[0]))

int ks__mkmodel_build_vocab(const preset *p, tmpl_info *ti, bool fim, vocab *v) {
    int rc = vocab_init(v, p->n_vocab_max + (ti ? ti->n : 0) + (fim ? N_FIM : 0));
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
    float eog = p->eog_scale > 0 ? p->eog_scale : SCALE_IM_END;
    vocab_add(v, "<|im_end|>", TT_CONTROL, eog);
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

    if (p->agent_vocab && (rc = add_agent_vocab(v)) < 0) goto fail;

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
        ti->bos_id = ks__mkmodel_vocab_find(v, ti->fam->bos);
        ti->eog_id = ks__mkmodel_vocab_find(v, ti->eog);
        assert(ti->bos_id >= 0 && ti->eog_id >= 0);
        /* The template's end of turn, not ChatML's, is the one a reply ends with. */
        v->out_scale[KS_MKMODEL_TOK_IM_END] = SCALE_CONTROL;
        v->out_scale[ti->eog_id] = eog;
    }
    /* Last, so that every other id stays what it is without them. */
    for (int i = 0; fim && i < N_FIM; i++)
        if ((rc = vocab_add(v, FIM_SPECIALS[i], TT_CONTROL, SCALE_CONTROL)) < 0) goto fail;
    return 0;
fail:
    ks__mkmodel_vocab_free(v);
    return rc == KS_ENOSPC ? KS_EINVAL : rc; /* a preset too small for its words: a bug */
}

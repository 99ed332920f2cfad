/*
 * mkmodel_tmpl.c — what a chat template asks of a generated model's
 * vocabulary: its family, BOS, end-of-turn token and special tokens
 * (design note 6 in mkmodel.h).
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/mkmodel.h"
#include "engine/mkmodel_int.h"

/* ------------------------------------------------- chat template specials */
/* Template families (design note 6 in mkmodel.h), tried in this order: the
 * first whose marker the template contains. `extra`: specials the family's
 * models have although the template text may not write them (a BOS that
 * comes in through bos_token, an end-of-message token). */
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

void ks__mkmodel_tmpl_free(tmpl_info *ti) {
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
int ks__mkmodel_tmpl_analyse(const char *text, tmpl_info *ti, char *err, size_t errlen) {
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
    if (rc) ks__mkmodel_tmpl_free(ti);
    return rc;
}

/* The vocabulary of preset p (design note 3); with a template (ti not NULL)
 * its specials follow the preset's tokens and ti's bos_id/eog_id are set. */

/*
 * api_int.h — what the request parsers share: api_fields.c's errors, notes
 * and typed field getters (every parser), api_chat.c's chat fields and
 * field policy (api.c, the Responses and Messages translations), api.c's
 * request entry. Who calls whom: api.c -> api_chat.c -> api_fields.c; the
 * translations (api_responses.c, api_messages.c) and api_utility.c call
 * down into those, never back.
 */
#ifndef KS_API_INT_H
#define KS_API_INT_H

#include "server/api.h"

#define T_INVALID "invalid_request_error"

/* Shorthand: fail with 400 invalid_request_error. */
#define BAD(code, param, ...)                                                           \
    do {                                                                                \
        ks_api_error_set(err, 400, T_INVALID, code, param, __VA_ARGS__);                \
        return KS_EINVAL;                                                               \
    } while (0)

/* api_fields.c */
/* A field counts as absent when missing or null (OpenAI accepts explicit nulls). */
json_t *ks__api_field(json_t *obj, const char *key);
/* The string of o[k], "" when it is absent or not a string (o may be NULL). */
const char *ks__api_str(const json_t *o, const char *k);
/* "a string", "an integer", ... for error messages. */
const char *ks__api_json_type_name(const json_t *v);
/* An optional boolean field into *out; 400 on a wrong type. */
int ks__api_get_bool(json_t *root, const char *key, bool *out, ks_api_error *err);
/* An optional number in [lo, hi] into *out. */
int ks__api_get_number(json_t *root, const char *key, double lo, double hi, float *out, ks_api_error *err);
/* An optional integer in [lo, hi] into *out; *set (may be NULL) tells whether it was given. */
int ks__api_get_int(json_t *root, const char *key, long long lo, long long hi, long long *out, bool *set,
                    ks_api_error *err);
/* The KS_E* code of an error a helper filled in err: KS_ENOMEM for its 500
 * out_of_memory, else KS_EINVAL (a 400). */
int ks__api_err_rc(const ks_api_error *err);
/* 500 out_of_memory into err; returns KS_ENOMEM. */
int ks__api_oom(ks_api_error *err);
/* Parses body as one JSON object into *root (owned); 400 otherwise. */
int ks__api_load_object(const char *body, size_t len, json_t **root, ks_api_error *err);

/* Owns s (freed with the request); KS_ENOMEM frees it. */
int ks__api_keep(ks_api_request *r, char *s);
/* k is one of the NULL-terminated list l. */
bool ks__api_in_list(const char *const *l, const char *k);
/* 400 invalid_type unless v has type t (JSON_TRUE: a boolean); what: "a string"... */
int ks__api_want(json_t *v, json_type t, const char *what, const char *param, ks_api_error *err);
/* Notes every field of root that is in none of the NULL-terminated lists
 * (the lists may be NULL-padded: a NULL list ends them). */
void ks__api_note_unknown(json_t *root, ks_api_notes *notes, const char *const *l1, const char *const *l2,
                          const char *const *l3, const char *const *l4);

/* The fields a parser knows in a nested object (docs/SERVER.md, "Request
 * fields", rule 5 for nested fields): path is a pattern of object keys, "[]"
 * after one for each item of its array ("tools[]", "messages[].content[]");
 * the object's fields in neither known nor ignored (NULL: none) are noted as
 * unknown, folded ("tools[].defer_loading"), once per request. when_types
 * (NULL: all): only objects whose "type" is absent or one of these. A list
 * of these ends with a NULL path. */
typedef struct ks__api_nested {
    const char *path;
    const char *const *known;
    const char *const *ignored;
    const char *const *when_types;
} ks__api_nested;
void ks__api_note_nested(json_t *root, const ks__api_nested *spec, ks_api_notes *notes);

/* api_chat.c */
/* messages[i].content of a message of role (canonical): a string, or text
 * parts joined with "\n" and image / audio parts as markers (api_media.c);
 * absent or null only for an assistant (then ""). */
int ks__api_parse_content(json_t *m, size_t i, const char *role, ks_api_request *r, const char **out,
                          ks_api_error *err);

/* The request-field policy (docs/SERVER.md, "Request fields"): a field of the
 * other endpoint (prompt on chat, messages on completions) is a 400
 * unsupported_parameter; a field none of the lists knows is noted in notes
 * and ignored. */
int ks__api_check_fields(json_t *root, ks_api_kind kind, bool infill, ks_api_notes *notes, ks_api_error *err);
/* messages, tools, structured output and template options into r->msgs and r->tmpl_req. */
int ks__api_parse_chat(json_t *root, ks_api_request *r, ks_api_error *err);
/* response_format, json_schema, grammar: into tr (chat's template request;
 * NULL for completions, whose grammar the server builds) and r->structured. */
int ks__api_parse_structured(json_t *root, ks_api_request *r, json_t *tr, ks_api_error *err);
/* logit_bias, penalties, ignore_eos, id_slot, n_probs, n. After the prompts. */
int ks__api_parse_sampling(json_t *root, ks_api_request *r, ks_api_error *err);

/* api_media.c */
/* type is a media part's type (image_url, input_audio). */
bool ks__api_media_type(const char *type);
/* The marker an item leaves in its message's text. */
const char *ks__api_media_marker(const ks_api_request *r);
/* A media part of type at pp (its "ks_param" wins: a translation's path) in
 * a message of role: checked against r->media_limits, decoded, appended to
 * r->media. 0, or a 400 (KS_EINVAL) / KS_ENOMEM with err filled. */
int ks__api_media_part(json_t *part, const char *type, const char *pp, const char *role, ks_api_request *r,
                       ks_api_error *err);
/* Sets msg's "ks_media" to the SHA-256 (hex) of r->media[from..]: the
 * message's items, for the hints computed over its JSON. KS_ENOMEM. */
int ks__api_media_tag(const ks_api_request *r, int from, json_t *msg);
/* Frees r->media. */
void ks__api_media_free(ks_api_request *r);
/* For the translations: a chat part {type, <type>: body, ks_param: param}
 * (new reference, NULL on ENOMEM); and a message's content from chat parts
 * ({type: text, text} and media parts): the parts when has_media, else the
 * texts joined with "\n" (new reference, NULL on ENOMEM). */
json_t *ks__api_media_chat_part(const char *type, json_t *body, const char *param);
json_t *ks__api_parts_content(json_t *parts, bool has_media);
/* An Anthropic image block at q as a chat image part with q's path (new
 * reference); NULL with err filled (400: a source that is not base64, a
 * media type Anthropic does not take; or ENOMEM). */
json_t *ks__api_messages_image(json_t *blk, const char *q, ks_api_error *err);

/* api_msg_tools.c: a Messages request's tools as its conversation loads
 * them (tool search, mid-conversation tool changes; NOTES there). */
typedef struct ks__msg_tools {
    bool given;        /* the request has a tools array */
    json_t *order;     /* [{function, cache_control?, deferred?}] in the request's order */
    json_t *defs;      /* name -> chat function object {name, description?, parameters} */
    json_t *deferred;  /* name -> true: given with defer_loading */
    json_t *state;     /* name -> true (loaded) / false (removed), the conversation's last word */
    json_t *added;     /* [function object] tools a tool_addition defined that tools does not */
} ks__msg_tools;
/* Reads and checks root's tools into t (server tools noted and dropped).
 * Free t with ks__msg_tools_free whatever this returns. */
int ks__msg_tools_read(json_t *root, ks__msg_tools *t, ks_api_notes *notes, ks_api_error *err);
/* A tool result's tool_reference block at q: its text part (new reference), or NULL with err filled. */
json_t *ks__msg_tools_reference(ks__msg_tools *t, json_t *blk, const char *q, ks_api_error *err);
/* A system message's tool_addition or tool_removal block (ty) at q: its text
 * part (new reference), or NULL with err filled. */
json_t *ks__msg_tools_change(ks__msg_tools *t, json_t *blk, const char *ty, const char *q, ks_api_error *err);
/* chat's tools: the rendered ones, then the loaded deferred and added ones with defer_loading. */
int ks__msg_tools_to_chat(ks__msg_tools *t, json_t *chat, ks_api_error *err);
void ks__msg_tools_free(ks__msg_tools *t);

/* api.c */
/* prompt (one or several), grammar / json_schema, logprobs, echo, suffix, best_of. */
int ks__api_parse_prompts(json_t *root, ks_api_request *r, ks_api_error *err);

#endif

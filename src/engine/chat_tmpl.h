/*
 * chat_tmpl.h — the model's own Jinja chat template, OpenAI-style tool calls
 * and JSON schema → GBNF, through llama.cpp's common library (C++).
 *
 * A C interface over common/chat.h: every structured value crosses it as a
 * JSON string, so the C side (jansson) never sees a C++ type, and no C++
 * exception crosses it (each one becomes a KS_E* code with its message in
 * err). chat_tmpl.cpp is the project's one C++ file over common (grammar.cpp
 * only guards llama.cpp's grammar sampler); like engine.c it may include
 * llama.h, nothing outside src/engine/ does.
 *
 * Design notes
 *  1. One request, two calls: ks_chat_tmpl_apply renders the prompt and says
 *     how to sample it (grammar, lazy triggers, stops); its result carries a
 *     "parse" object that is handed back unchanged (plus the caller's own
 *     options) to ks_chat_tmpl_parse, which turns the generated text into an
 *     assistant message. In this llama.cpp release the output parser is a
 *     serialized PEG grammar built by apply from the template ("parser"); the
 *     format number alone is not enough to parse.
 *  2. The template object holds only text (template sources, BOS/EOS token
 *     strings): it does not keep the llama_model it was created from.
 *  3. Defaults follow llama-server: reasoning_format "deepseek" (thinking goes
 *     to reasoning_content), enable_thinking true, add_generation_prompt true,
 *     parallel_tool_calls as the template supports.
 *  4. Deferred tools (deferred_tools): tools the model may call that the
 *     prompt does not list, because the conversation showed them itself
 *     (Anthropic's tool search: api_msg_tools.c). The template renders the
 *     prompt with tools alone; a second run with tools + deferred_tools gives
 *     the grammar, triggers and parser. Both runs must agree on the
 *     generation prompt, else the second run is taken whole.
 *
 * Thread model: create/free on any one thread. apply, parse, info and
 * ks_chat_tmpl_schema_to_grammar only read the template and may run on many
 * threads at once (llama-server calls them from concurrent HTTP threads too).
 * common logs its warnings to stderr from a thread of its own.
 *
 * Strings returned through char ** are owned by the caller: free() them. On
 * error nothing is returned (*out stays NULL) and err holds a message.
 */
#ifndef KS_CHAT_TMPL_H
#define KS_CHAT_TMPL_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct llama_model;
typedef struct ks_chat_tmpl ks_chat_tmpl;

/* Creates the templates of a model. template_override: Jinja source to use
 * instead of the GGUF's (NULL or "": the GGUF's tokenizer.chat_template and
 * its "tool_use" variant; ChatML when the GGUF has none). model may be NULL
 * when template_override is given: bos_token/eos_token then render as "".
 * model is borrowed for the call only.
 * Errors: KS_EINVAL (no model and no override), KS_ETEMPLATE (the Jinja
 * source does not parse), KS_ENOMEM. */
int ks_chat_tmpl_create(const struct llama_model *model, const char *template_override,
                        ks_chat_tmpl **out, char *err, size_t errlen);

/* The same from a GGUF file: loads its vocabulary only (no weights), creates
 * the templates and frees the vocabulary. For tools and tests that have no
 * loaded model. Errors: KS_EMODEL (the file cannot be loaded), and as above. */
int ks_chat_tmpl_create_from_file(const char *gguf_path, const char *template_override,
                                  ks_chat_tmpl **out, char *err, size_t errlen);
/* The same from a loaded engine's model (engine.h ks_engine_llama_model): no
 * second read of the GGUF. */
struct ks_engine;
int ks_chat_tmpl_create_for(const struct ks_engine *e, const char *template_override, ks_chat_tmpl **out,
                            char *err, size_t errlen);

/* NULL is a no-op. */
void ks_chat_tmpl_free(ks_chat_tmpl *t);

/* What the template is: {"source": <Jinja text in use>, "tool_use_source":
 * <the GGUF's tool_use variant or "">, "was_explicit": <the GGUF or the
 * caller gave a template>, "caps": {"supports_tools", "supports_tool_calls",
 * "supports_system_role", "supports_parallel_tool_calls",
 * "supports_preserve_reasoning", "supports_reasoning_effort",
 * "supports_string_content", "supports_typed_content",
 * "supports_object_arguments": bool}, "supports_thinking": bool}.
 * Errors: KS_EINVAL, KS_ETEMPLATE, KS_ENOMEM. */
int ks_chat_tmpl_info(const ks_chat_tmpl *t, char **info_json, char *err, size_t errlen);

/* Renders a chat request. request_json is an object with the fields of an
 * OpenAI chat completion that shape the prompt (others are ignored):
 *   messages (required): [{role, content: string | null | [{type:"text", text}],
 *       tool_calls: [{id?, type:"function", function:{name, arguments}}],
 *       tool_call_id, name, reasoning_content}]
 *   tools: [{type:"function", function:{name, description?, parameters?}}]
 *   deferred_tools: the same shape: callable but not rendered (note 4)
 *   tool_choice: "auto" (default) | "none" | "required"
 *   parallel_tool_calls: bool
 *   add_generation_prompt: bool (default true)
 *   continue_final_message: true | "content" | "reasoning_content"
 *   json_schema: object, or response_format: {type:"text"|"json_object"|
 *       "json_schema", schema?, json_schema:{schema}} (as llama-server)
 *   grammar: GBNF string (not with json_schema, not with tools)
 *   reasoning_format: "none" | "auto" | "deepseek" (default) | "deepseek-legacy"
 *   enable_thinking: bool; reasoning_effort: string ("none" disables thinking)
 *   chat_template_kwargs: object, extra variables for the template
 * *result_json receives:
 *   prompt: the text to tokenize (with parse_special; add no BOS when the
 *       template already wrote one)
 *   grammar: GBNF to constrain sampling, "" for none
 *   grammar_lazy: true: the grammar applies only from a trigger on
 *   grammar_prefill: true: feed the tokens of generation_prompt to the
 *       grammar sampler before sampling (grammars built by the template);
 *       false for a caller's grammar
 *   grammar_triggers: [{type: "word"|"pattern"|"pattern_full"|"token",
 *       value, token?, pattern}] — pattern is the regex the lazy sampler
 *       takes (a word escaped, a full pattern anchored)
 *   preserved_tokens: [string] — special tokens the grammar and parser see as
 *       text; additional_stops: [string] — stop strings to add
 *   generation_prompt: what the prompt ends with for the assistant
 *   format: int, format_name: string
 *   supports_thinking, thinking_start_tag, thinking_end_tags: [string]
 *   message_delimiters: [...] as common gives them
 *   parse: {format, parser, generation_prompt, reasoning_format,
 *       parse_tool_calls, is_continuation} — for ks_chat_tmpl_parse
 * Errors: KS_EINVAL (bad JSON, a missing or ill-typed field, an unknown
 * enum value, json_schema with grammar, grammar with tools, a schema the
 * converter cannot handle), KS_ETEMPLATE (the template raised or failed),
 * KS_ENOMEM. */
int ks_chat_tmpl_apply(const ks_chat_tmpl *t, const char *request_json, char **result_json,
                       char *err, size_t errlen);

/* Parses generated text into an assistant message. parse_json: the "parse"
 * object of the apply result, optionally with "reasoning_in_content" and
 * "echo" (bool) added; NULL or "{}" parses plain content. is_partial: text is
 * a prefix of the output (streaming): a tool call still being written comes
 * back as far as it goes. Give whole UTF-8 characters only: a cut sequence
 * is replaced by U+FFFD. *msg_json receives {"role": "assistant", "content":
 * string, "reasoning_content": string, "tool_calls": [{"id"?, "type":
 * "function", "function": {"name", "arguments": string}}]} ("" and [] when
 * absent; an id only when the model wrote one).
 * Errors: KS_EINVAL (bad parse_json, or a whole output that does not match
 * the format), KS_ENOMEM. */
int ks_chat_tmpl_parse(const char *text, bool is_partial, const char *parse_json, char **msg_json,
                       char *err, size_t errlen);

/* JSON schema (text) → GBNF grammar with root rule "root". An empty object
 * means any JSON object, as in llama-server.
 * Errors: KS_EINVAL (bad JSON, or a schema the converter cannot handle, e.g.
 * an unresolvable $ref), KS_ENOMEM. */
int ks_chat_tmpl_schema_to_grammar(const char *schema_json, char **gbnf, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif

/*
 * chat_tmpl.cpp — the C interface of chat_tmpl.h over llama.cpp's common
 * library (common/chat.h, json-schema-to-grammar.h), the project's only C++
 * besides grammar.cpp's exception guard.
 *
 * Every entry point runs its body through guarded(): a C++ exception never
 * crosses the extern "C" boundary. Which code an exception becomes depends on
 * the phase it came from: reading the caller's JSON → KS_EINVAL, running the
 * template → KS_ETEMPLATE, std::bad_alloc anywhere → KS_ENOMEM. Inputs that
 * common would GGML_ASSERT on (abort) are refused before they reach it.
 *
 * JSON goes through common_json, common's own facade over its vendored JSON
 * library, so no third-party header but common's is needed here.
 */
#include "engine/chat_tmpl.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "llama.h"

extern "C" {
#include "base/base.h"

/* engine.h's accessor (engine.h itself is C11 only). */
const struct llama_model *ks_engine_llama_model(const struct ks_engine *e);
}

struct ks_chat_tmpl {
    common_chat_templates_ptr tmpls;
};

namespace {

using json = common_json;

/* An error in the caller's input: KS_EINVAL. */
struct ks_input_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/* Runs body (returning 0 or a KS_E* code) and turns any exception it throws
 * into a code with its message in err: std::bad_alloc → KS_ENOMEM, anything
 * else → *phase, which the body advances as it goes (KS_ETEMPLATE messages
 * start with "chat template: "). */
template <typename F> int guarded(char *err, size_t errlen, const int *phase, F &&body) noexcept {
    const char *prefix = "";
    try {
        return body();
    } catch (const std::bad_alloc &) {
        ks_set_err(err, errlen, "out of memory");
        return KS_ENOMEM;
    } catch (const std::exception &e) {
        if (*phase == KS_ETEMPLATE) prefix = "chat template: ";
        ks_set_err(err, errlen, "%s%s", prefix, e.what());
    } catch (...) {
        if (*phase == KS_ETEMPLATE) prefix = "chat template: ";
        ks_set_err(err, errlen, "%sunknown error", prefix);
    }
    return *phase;
}

/* A malloc'ed copy in *out for the C side (free()). */
int give_string(const std::string &s, char **out) {
    *out = ks_strdup(s.c_str());
    if (!*out) throw std::bad_alloc();
    return 0;
}

/* The JSON text in *out. dump_safe: a template or a cut stream may leave
 * invalid UTF-8, which becomes U+FFFD instead of an exception. */
int give(const json &j, char **out) {
    return give_string(j.dump_safe(), out);
}

bool get_bool(const json &o, const char *key, bool def) {
    if (!o.contains(key) || o.at(key).is_null()) return def;
    if (!o.at(key).is_boolean()) throw ks_input_error(std::string("'") + key + "' must be a boolean");
    return o.at(key).get<bool>();
}

std::string get_string(const json &o, const char *key, const std::string &def) {
    if (!o.contains(key) || o.at(key).is_null()) return def;
    if (!o.at(key).is_string()) throw ks_input_error(std::string("'") + key + "' must be a string");
    return o.at(key).get<std::string>();
}

/* The GBNF of a schema; an unsupported or malformed schema is the caller's error. */
std::string schema_grammar(const json &schema, const std::string &what) {
    try {
        return json_schema_to_grammar(schema);
    } catch (const std::bad_alloc &) {
        throw;
    } catch (const std::exception &e) {
        throw ks_input_error(what + ": " + e.what());
    }
}

const char *trigger_type_name(common_grammar_trigger_type t) {
    switch (t) {
    case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: return "token";
    case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: return "word";
    case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: return "pattern";
    case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "unknown";
}

/* The regex llama_sampler_init_grammar_lazy_patterns takes for a trigger, as
 * common/sampling.cpp builds it. */
std::string trigger_pattern(const common_grammar_trigger &tr) {
    switch (tr.type) {
    case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: return regex_escape(tr.value);
    case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: return tr.value;
    case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
        const std::string &p = tr.value;
        if (p.empty()) return "^$";
        return (p.front() != '^' ? "^" : "") + p + (p.back() != '$' ? "$" : "");
    }
    case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: break;
    }
    return "";
}

json string_array(const std::vector<std::string> &v) {
    json a = json::array();
    for (const auto &s : v) a.push_back(s);
    return a;
}

/* What the request asks besides the inputs common takes. */
struct request_extra {
    std::string user_grammar;
    bool parse_tool_calls = false;
    std::vector<common_chat_tool> deferred; /* callable, not rendered (deferred_tools) */
};

/* Reads the request into common's inputs, the way llama-server's
 * oaicompat_chat_params_parse does. Throws ks_input_error (or common's own
 * exceptions) on anything malformed. */
void read_request(const ks_chat_tmpl *t, const json &body, common_chat_templates_inputs &in,
                  request_extra &ex) {
    if (!body.is_object()) throw ks_input_error("the request must be a JSON object");
    if (!body.contains("messages")) throw ks_input_error("'messages' is required");
    const json &messages = body.at("messages");
    if (!messages.is_array()) throw ks_input_error("'messages' must be an array");
    in.messages = common_chat_msgs_parse_oaicompat(messages);

    if (body.contains("tools") && !body.at("tools").is_null()) {
        const json &tools = body.at("tools");
        in.tools = common_chat_tools_parse_oaicompat(tools);
        /* A schema the converter rejects would otherwise fail inside the
         * template run and read as a template error. */
        for (size_t i = 0; i < tools.size(); i++) {
            schema_grammar(common_chat_tool_parameters(tools.at(i).at("function")),
                           "tools[" + std::to_string(i) + "].function.parameters");
        }
    }
    if (body.contains("deferred_tools") && !body.at("deferred_tools").is_null()) {
        const json &tools = body.at("deferred_tools");
        ex.deferred = common_chat_tools_parse_oaicompat(tools);
        for (size_t i = 0; i < tools.size(); i++) {
            schema_grammar(common_chat_tool_parameters(tools.at(i).at("function")),
                           "deferred_tools[" + std::to_string(i) + "].function.parameters");
        }
    }
    if (body.contains("tool_choice") && !body.at("tool_choice").is_null()) {
        if (!body.at("tool_choice").is_string())
            throw ks_input_error("'tool_choice' must be \"auto\", \"none\" or \"required\" "
                                 "(naming a function is not supported)");
        in.tool_choice = common_chat_tool_choice_parse_oaicompat(body.at("tool_choice").get<std::string>());
    }
    auto caps = common_chat_templates_get_caps(t->tmpls.get());
    in.parallel_tool_calls = get_bool(body, "parallel_tool_calls", caps["supports_parallel_tool_calls"]);

    /* json_schema, response_format, grammar: as llama-server. */
    json schema;
    if (body.contains("json_schema") && !body.at("json_schema").is_null()) schema = body.at("json_schema");
    ex.user_grammar = get_string(body, "grammar", "");
    if (!schema.is_null() && !ex.user_grammar.empty())
        throw ks_input_error("cannot use both json_schema and grammar");
    if (body.contains("response_format") && !body.at("response_format").is_null()) {
        const json &rf = body.at("response_format");
        if (!rf.is_object()) throw ks_input_error("'response_format' must be an object");
        std::string type = get_string(rf, "type", "");
        if (type == "json_object") {
            if (rf.contains("schema") || schema.is_null()) schema = rf.value("schema", json::object());
        } else if (type == "json_schema") {
            json wrapper = rf.value("json_schema", json::object());
            schema = wrapper.is_object() ? wrapper.value("schema", json::object()) : json::object();
        } else if (!type.empty() && type != "text") {
            throw ks_input_error("response_format type must be \"text\", \"json_object\" or "
                                 "\"json_schema\", not \"" + type + "\"");
        }
    }
    if (!schema.is_null()) {
        if (!schema.is_object()) throw ks_input_error("the JSON schema must be an object");
        if (schema.empty()) schema["type"] = "object"; /* an empty schema means any object */
        schema_grammar(schema, "json_schema");
        in.json_schema = schema.dump();
    }
    in.grammar = ex.user_grammar;

    bool has_gen = body.contains("add_generation_prompt") && !body.at("add_generation_prompt").is_null();
    in.add_generation_prompt = get_bool(body, "add_generation_prompt", true);
    if (body.contains("continue_final_message"))
        in.continue_final_message = common_chat_continuation_parse(body.at("continue_final_message"));
    if (in.continue_final_message == COMMON_CHAT_CONTINUATION_NONE && get_bool(body, "prefill_assistant", true) &&
        !in.messages.empty() && in.messages.back().role == "assistant" && !has_gen) {
        /* llama-server's default: a conversation that ends with the
         * assistant is continued, not answered. */
        if (in.messages.size() >= 2 && in.messages[in.messages.size() - 2].role == "assistant")
            throw ks_input_error("cannot have 2 or more assistant messages at the end of the list");
        in.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
    }
    if (in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE) {
        if (has_gen && in.add_generation_prompt)
            throw ks_input_error("cannot set both add_generation_prompt and continue_final_message");
        in.add_generation_prompt = false;
        if (!in.messages.empty() && in.messages.back().role == "assistant" &&
            !in.messages.back().tool_calls.empty())
            throw ks_input_error("cannot continue an assistant message that contains tool calls");
    }

    in.reasoning_format = common_reasoning_format_from_name(get_string(body, "reasoning_format", "deepseek"));
    in.enable_thinking = get_bool(body, "enable_thinking", true);
    if ((!in.tools.empty() || !ex.deferred.empty()) && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE) {
        if (!ex.user_grammar.empty()) throw ks_input_error("cannot use a custom grammar with tools");
        ex.parse_tool_calls = true;
    }

    if (body.contains("chat_template_kwargs") && !body.at("chat_template_kwargs").is_null()) {
        const json &kw = body.at("chat_template_kwargs");
        if (!kw.is_object()) throw ks_input_error("'chat_template_kwargs' must be an object");
        for (const auto &item : kw.items()) in.chat_template_kwargs[item.key()] = item.value().dump();
    }
    auto it = in.chat_template_kwargs.find("enable_thinking");
    if (it != in.chat_template_kwargs.end()) {
        if (it->second == "true") in.enable_thinking = true;
        else if (it->second == "false") in.enable_thinking = false;
        else throw ks_input_error("chat_template_kwargs.enable_thinking must be a boolean");
    }
    std::string effort = get_string(body, "reasoning_effort", "");
    if (effort == "none") {
        in.enable_thinking = false;
        in.chat_template_kwargs.erase("reasoning_effort");
    } else if (!effort.empty()) {
        in.chat_template_kwargs["reasoning_effort"] = json(effort).dump();
    }
}

json make_result(const common_chat_params &p, const common_chat_templates_inputs &in, const request_extra &ex) {
    json r = json::object();
    r["prompt"] = p.prompt;
    /* A grammar the template built (tools, JSON schema) expects the
     * generation prompt first; a caller's grammar is used as given. */
    bool from_template = !p.grammar.empty();
    r["grammar"] = from_template ? p.grammar : ex.user_grammar;
    r["grammar_lazy"] = from_template && p.grammar_lazy;
    r["grammar_prefill"] = from_template;
    json triggers = json::array();
    for (const auto &tr : p.grammar_triggers) {
        json o = json::object();
        o["type"] = trigger_type_name(tr.type);
        o["value"] = tr.value;
        if (tr.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN) o["token"] = (int)tr.token;
        else o["pattern"] = trigger_pattern(tr);
        triggers.push_back(o);
    }
    r["grammar_triggers"] = triggers;
    r["preserved_tokens"] = string_array(p.preserved_tokens);
    r["additional_stops"] = string_array(p.additional_stops);
    r["generation_prompt"] = p.generation_prompt;
    r["format"] = (int)p.format;
    r["format_name"] = common_chat_format_name(p.format);
    r["supports_thinking"] = p.supports_thinking;
    r["thinking_start_tag"] = p.thinking_start_tag;
    r["thinking_end_tags"] = string_array(p.thinking_end_tags);
    r["message_delimiters"] = p.message_delimiters.to_json();

    json parse = json::object();
    parse["format"] = (int)p.format;
    parse["parser"] = p.parser;
    parse["generation_prompt"] = p.generation_prompt;
    parse["reasoning_format"] = common_reasoning_format_name(in.reasoning_format);
    parse["parse_tool_calls"] = ex.parse_tool_calls;
    parse["is_continuation"] = in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE;
    r["parse"] = parse;
    return r;
}

/* The parse options (chat_tmpl.h) into common's parser parameters. */
void read_parse_opts(const json &o, common_chat_parser_params &pp) {
    if (!o.is_object()) throw ks_input_error("the parse options must be a JSON object");
    if (o.contains("format")) {
        if (!o.at("format").is_number_integer()) throw ks_input_error("'format' must be an integer");
        long long f = o.at("format").get<long long>();
        if (f < 0 || f >= COMMON_CHAT_FORMAT_COUNT) throw ks_input_error("unknown format " + std::to_string(f));
        pp.format = (common_chat_format)f;
    }
    std::string parser = get_string(o, "parser", "");
    if (!parser.empty()) pp.parser.load(parser);
    pp.generation_prompt = get_string(o, "generation_prompt", "");
    pp.reasoning_format = common_reasoning_format_from_name(get_string(o, "reasoning_format", "none"));
    pp.reasoning_in_content = get_bool(o, "reasoning_in_content", false);
    pp.parse_tool_calls = get_bool(o, "parse_tool_calls", false);
    pp.is_continuation = get_bool(o, "is_continuation", false);
    pp.echo = get_bool(o, "echo", false);
}

json msg_to_json(const common_chat_msg &m) {
    json o = json::object();
    o["role"] = m.role.empty() ? std::string("assistant") : m.role;
    o["content"] = m.content_parts.empty() ? m.content : m.render_content("\n");
    o["reasoning_content"] = m.reasoning_content;
    json calls = json::array();
    for (const auto &tc : m.tool_calls) {
        json c = json::object();
        if (!tc.id.empty()) c["id"] = tc.id;
        c["type"] = "function";
        json fn = json::object();
        fn["name"] = tc.name;
        fn["arguments"] = tc.arguments;
        c["function"] = fn;
        calls.push_back(c);
    }
    o["tool_calls"] = calls;
    return o;
}

/* The message of a template that common_chat_templates_init refused: it
 * rethrows a copy of the std::exception base, which says only
 * "std::exception", so the template is parsed again here for the real one. */
std::string parse_error(const llama_model *model, const std::string &override_src, const std::exception &e) {
    std::string src = override_src;
    if (src.empty() && model) {
        const char *s = llama_model_chat_template(model, nullptr);
        src = s ? s : "";
    }
    try {
        common_chat_template again(src, "", "");
    } catch (const std::bad_alloc &) {
        throw;
    } catch (const std::exception &e2) {
        return e2.what();
    }
    return e.what();
}

int create(const llama_model *model, const char *override_src, ks_chat_tmpl **out, char *err, size_t errlen) {
    if (!out) {
        ks_set_err(err, errlen, "no output pointer");
        return KS_EINVAL;
    }
    *out = nullptr;
    if (!model && (!override_src || !*override_src)) {
        /* common_chat_templates_init asserts (aborts) on this. */
        ks_set_err(err, errlen, "no model and no template text");
        return KS_EINVAL;
    }
    const int phase = KS_ETEMPLATE;
    return guarded(err, errlen, &phase, [&] {
        std::string src = override_src ? override_src : "";
        auto t = std::make_unique<ks_chat_tmpl>();
        try {
            t->tmpls = common_chat_templates_init(model, src);
        } catch (const std::bad_alloc &) {
            throw;
        } catch (const std::exception &e) {
            throw std::runtime_error(parse_error(model, src, e));
        }
        *out = t.release();
        return 0;
    });
}

} // namespace

extern "C" {

int ks_chat_tmpl_create(const struct llama_model *model, const char *template_override, ks_chat_tmpl **out,
                        char *err, size_t errlen) {
    return create(model, template_override, out, err, errlen);
}

int ks_chat_tmpl_create_for(const struct ks_engine *e, const char *template_override, ks_chat_tmpl **out,
                            char *err, size_t errlen) {
    if (out) *out = nullptr;
    if (!e) {
        ks_set_err(err, errlen, "no engine");
        return KS_EINVAL;
    }
    return create(ks_engine_llama_model(e), template_override, out, err, errlen);
}

int ks_chat_tmpl_create_from_file(const char *gguf_path, const char *template_override, ks_chat_tmpl **out,
                                  char *err, size_t errlen) {
    if (out) *out = nullptr;
    if (!gguf_path || !out) {
        ks_set_err(err, errlen, "no model path");
        return KS_EINVAL;
    }
    llama_model_params mp = llama_model_default_params();
    /* The vocabulary holds all a template needs (the Jinja text, BOS/EOS);
     * no weights, no backend. */
    mp.vocab_only = true;
    llama_model *model = llama_model_load_from_file(gguf_path, mp);
    if (!model) {
        ks_set_err(err, errlen, "cannot load the vocabulary of %s", gguf_path);
        return KS_EMODEL;
    }
    int rc = create(model, template_override, out, err, errlen);
    llama_model_free(model);
    return rc;
}

void ks_chat_tmpl_free(ks_chat_tmpl *t) {
    delete t;
}

int ks_chat_tmpl_info(const ks_chat_tmpl *t, char **info_json, char *err, size_t errlen) {
    if (info_json) *info_json = nullptr;
    if (!t || !info_json) {
        ks_set_err(err, errlen, "no template or no output pointer");
        return KS_EINVAL;
    }
    const int phase = KS_ETEMPLATE;
    return guarded(err, errlen, &phase, [&] {
        json o = json::object();
        o["source"] = common_chat_templates_source(t->tmpls.get());
        o["tool_use_source"] = common_chat_templates_source(t->tmpls.get(), "tool_use");
        o["was_explicit"] = common_chat_templates_was_explicit(t->tmpls.get());
        json caps = json::object();
        for (const auto &c : common_chat_templates_get_caps(t->tmpls.get())) caps[c.first] = c.second;
        o["caps"] = caps;
        /* This renders a one-message conversation: a template error shows here. */
        o["supports_thinking"] = common_chat_templates_support_enable_thinking(t->tmpls.get());
        return give(o, info_json);
    });
}

int ks_chat_tmpl_apply(const ks_chat_tmpl *t, const char *request_json, char **result_json, char *err,
                       size_t errlen) {
    if (result_json) *result_json = nullptr;
    if (!t || !request_json || !result_json) {
        ks_set_err(err, errlen, "no template, request or output pointer");
        return KS_EINVAL;
    }
    int phase = KS_EINVAL;
    return guarded(err, errlen, &phase, [&] {
        json body = json::parse(request_json);
        common_chat_templates_inputs in;
        request_extra ex;
        read_request(t, body, in, ex);
        phase = KS_ETEMPLATE;
        if (ex.deferred.empty() || in.tool_choice == COMMON_CHAT_TOOL_CHOICE_NONE)
            return give(make_result(common_chat_templates_apply(t->tmpls.get(), in), in, ex), result_json);
        /* Deferred tools (design note 4): the prompt renders the listed
         * tools only; the grammar, triggers and parser come from a second
         * run with every callable tool. Where the two runs disagree on how
         * the assistant's turn starts, that grammar would not fit the
         * prompt: the second run is taken whole (the deferred tools are
         * then rendered in the list, correct but not a stable prefix). */
        common_chat_templates_inputs shown = in;
        if (shown.tools.empty()) shown.tool_choice = COMMON_CHAT_TOOL_CHOICE_NONE;
        common_chat_params p = common_chat_templates_apply(t->tmpls.get(), shown);
        common_chat_templates_inputs all = in;
        all.tools.insert(all.tools.end(), ex.deferred.begin(), ex.deferred.end());
        common_chat_params g = common_chat_templates_apply(t->tmpls.get(), all);
        if (g.generation_prompt == p.generation_prompt) g.prompt = p.prompt;
        return give(make_result(g, all, ex), result_json);
    });
}

int ks_chat_tmpl_parse(const char *text, bool is_partial, const char *parse_json, char **msg_json, char *err,
                       size_t errlen) {
    if (msg_json) *msg_json = nullptr;
    if (!text || !msg_json) {
        ks_set_err(err, errlen, "no text or no output pointer");
        return KS_EINVAL;
    }
    const int phase = KS_EINVAL;
    return guarded(err, errlen, &phase, [&] {
        common_chat_parser_params pp;
        pp.reasoning_format = COMMON_REASONING_FORMAT_NONE;
        pp.parse_tool_calls = false;
        if (parse_json && *parse_json) read_parse_opts(json::parse(parse_json), pp);
        return give(msg_to_json(common_chat_parse(text, is_partial, pp)), msg_json);
    });
}

int ks_chat_tmpl_schema_to_grammar(const char *schema_json, char **gbnf, char *err, size_t errlen) {
    if (gbnf) *gbnf = nullptr;
    if (!schema_json || !gbnf) {
        ks_set_err(err, errlen, "no schema or no output pointer");
        return KS_EINVAL;
    }
    const int phase = KS_EINVAL;
    return guarded(err, errlen, &phase, [&] {
        json schema = json::parse(schema_json);
        if (!schema.is_object()) throw ks_input_error("a JSON schema must be an object");
        if (schema.empty()) schema["type"] = "object"; /* any object, as in llama-server */
        return give_string(schema_grammar(schema, "json schema"), gbnf);
    });
}

} /* extern "C" */

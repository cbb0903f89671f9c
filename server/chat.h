/* Chat prompts for the HTTP edge: which chat template the daemon uses, how
 * a conversation becomes prompt token ids, and whether a reasoning parser
 * splits the output.
 *
 * Template source, first found wins: --chat-template FILE, the model's
 * tokenizer_config.json chat_template (string or the "default" entry of a
 * named list), GGUF tokenizer.chat_template (the latter two through
 * dsq_engine_chat_template). It is compiled once at startup, so a broken
 * template stops the daemon with the interpreter's message instead of
 * failing every request. Rendering follows transformers'
 * apply_chat_template (engine/text/chat_template.h) with bos_token/eos_token set
 * to the tokenizer's BOS/EOS token text. */
#ifndef DSQ_SERVER_CHAT_H
#define DSQ_SERVER_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/text/tokenizer.h"
#include "engine/text/tool_calls.h"
#include "server/error.h"

/* Immutable after create; shared by every connection thread. */
typedef struct dsq_chat dsq_chat_t;

/* template_path: --chat-template FILE or NULL; model_template: the model's
 * own template text or NULL; tok: borrowed, must outlive the result;
 * reasoning_parser: NULL, "" or "none" (off) or "deepseek_r1";
 * tool_parser: NULL, "" or "auto" (from the template's text, Hermes when
 * it shows no call syntax), or a name of dsq_tool_parser_from_name.
 * No template at all is not an error (chat requests then get a 400).
 * Returns NULL with a one-line reason in err when the file cannot be read,
 * the template does not compile, or the parser name is unknown. */
dsq_chat_t *dsq_chat_create(const char *template_path,
                            const char *model_template,
                            const dsq_tokenizer_t *tok,
                            const char *reasoning_parser, const char *tool_parser,
                            char *err, size_t err_len);
void dsq_chat_destroy(dsq_chat_t *c);   /* NULL is a no-op */

/* users: the template's Jinja2 text as loaded (NUL-terminated, owned by
 * c), or NULL when there is none; /tokenizer_info serves it. */
const char *dsq_chat_template_source(const dsq_chat_t *c);
/* The BOS / EOS token's text as templates see it (bos_token, eos_token),
 * owned by c; NULL when the tokenizer has none. */
const char *dsq_chat_bos_text(const dsq_chat_t *c);
const char *dsq_chat_eos_text(const dsq_chat_t *c);

/* The tool-call syntax (--tool-call-parser): how calls are parsed out of
 * the output and written when tool_choice constrains decoding. */
dsq_tool_parser_t dsq_chat_tool_parser(const dsq_chat_t *c);

/* The tool-call grammar (dsq_grammar_gbnf_for_tool_calls,
 * engine/text/grammar.h) of an OpenAI tools array as the request sent it
 * (dsq_openai_parse_chat checked its shape; NULL: none): tools[i] goes to
 * the engine as its function name and its parameters printed as JSON
 * text, so errors name a tool by its index in the request
 * (/tools/N/function/parameters). name, format, parallel, *gbnf, err and
 * the return value as that function's; DSQ_ENOMEM also when the
 * parameters cannot be printed. */
int dsq_chat_gbnf_for_tool_calls(const cJSON *tools, const char *name,
                                 dsq_tool_parser_t format, bool parallel, char **gbnf,
                                 char *err, size_t err_len);

/* True when --reasoning-parser deepseek_r1 is on. */
bool dsq_chat_has_reasoning(const dsq_chat_t *c);

/* Render messages (normalised, see dsq_openai_parse_chat) and tools
 * (NULL = none) with the template. *out: malloc'd NUL-terminated prompt
 * text of *out_len bytes, caller frees. Returns 0, or DSQ_EINVAL with *err
 * set to a 400 (no template: says how to provide one; the template raised
 * an exception or failed on this input: its message for the messages as
 * sent), or DSQ_ENOMEM (a 500 in *err).
 * An assistant tool-call turn is written the way the template takes it:
 * first with each tool_calls[].function.arguments parsed to an object
 * (transformers' convention), then as the JSON string sent; each with the
 * content as sent, then with "" for a null or absent content. The first
 * that renders wins (vLLM always parses and maps null to "", which
 * DeepSeek-V3's template cannot render). */
int dsq_chat_render(const dsq_chat_t *c, const cJSON *messages,
                    const cJSON *tools, bool add_generation_prompt, char **out,
                    size_t *out_len, dsq_api_error_t *err);

/* Tokenize rendered prompt text with special tokens parsed. BOS is
 * prepended only when add_special, the tokenizer wants BOS and the text
 * does not already start with the BOS token's text (templates that emit
 * {{ bos_token }} themselves must not get a second one). *ids malloc'd
 * (caller frees). Returns 0 or DSQ_ENOMEM / DSQ_EINVAL. */
int dsq_chat_tokenize(const dsq_chat_t *c, const char *text, size_t len,
                      bool add_special, int32_t **ids, size_t *n_ids);

#endif

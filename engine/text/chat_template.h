/* Chat templates: render a conversation into a prompt string.
 *
 * Models ship a Jinja2 template (tokenizer_config.json "chat_template", GGUF
 * key "tokenizer.chat_template") that turns OpenAI-style messages into the
 * exact prompt text the model was trained on. There is no maintained C
 * Jinja2 library in Debian (apt-cache search jinja lists only the Python
 * package and its integrations), so this is a small interpreter for the
 * subset real chat templates use, rendering byte for byte what
 * transformers' apply_chat_template renders (transformers
 * utils/chat_template_utils.py: jinja2 ImmutableSandboxedEnvironment with
 * trim_blocks=True, lstrip_blocks=True, loopcontrols, a tojson filter that
 * is json.dumps(ensure_ascii=False), globals raise_exception, namespace,
 * strftime_now, dict; the template sees messages, tools (None when not
 * given), documents (None), add_generation_prompt and the special tokens).
 *
 * Supported: {{ }}, {% if/elif/else %}, {% for x in y [if c] %} with
 * loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem
 * and {% else %}, break/continue, {% set %} (names, tuples, namespace
 * attributes, block set), {% macro %} and calls, {% generation %};
 * literals, attribute/subscript/slice access, arithmetic, ~, comparisons,
 * in/not in, and/or/not, conditional expressions, the tests and filters
 * listed in engine/text/jinja.c (implemented in jinja_filters.c; map, select,
 * selectattr, items, unique, reverse give generators as in Jinja, so
 * tojson of them fails as it does in transformers), {% raw %}, Python
 * string methods (startswith, endswith,
 * strip, lstrip, rstrip, split, rsplit, replace, upper, lower, title,
 * capitalize, find, count, join) and dict methods (items, keys, values,
 * get). Anything else fails at create with "template line N: unsupported
 * ...". Known differences from Python: upper/lower/title map ASCII letters
 * only and "-" whitespace control strips ASCII whitespace only; a JSON
 * number that is integral is an int (the JSON reader cannot tell 1 from
 * 1.0); a string holding \u0000 ends there (strings are C strings); string
 * "%" formatting, str.format, loop.cycle, {% call %}, {% filter %},
 * {% include %}/{% extends %} are not supported.
 *
 * Safety: every render is bounded by DSQ_CHAT_TEMPLATE_MAX_STEPS evaluation
 * steps, DSQ_CHAT_TEMPLATE_MAX_OUTPUT_BYTES of output (and of any string it
 * builds), DSQ_CHAT_TEMPLATE_MAX_MEMORY_BYTES of scratch memory and
 * DSQ_CHAT_TEMPLATE_MAX_DEPTH nested evaluations; parse nesting is bounded
 * too. Any input gives output or an error, never a crash or a hang. */
#ifndef DSQ_CHAT_TEMPLATE_H
#define DSQ_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#define DSQ_CHAT_TEMPLATE_MAX_STEPS 1000000
#define DSQ_CHAT_TEMPLATE_MAX_OUTPUT_BYTES (16u << 20)
#define DSQ_CHAT_TEMPLATE_MAX_MEMORY_BYTES (256u << 20)
#define DSQ_CHAT_TEMPLATE_MAX_DEPTH 500

/* A parsed template. Immutable after create: any number of threads may
 * render the same template at once. */
typedef struct dsq_chat_template dsq_chat_template_t;

/* Parse template text src[0..len) (UTF-8; need not be NUL-terminated).
 * Returns the template, or NULL with a one-line reason in err, e.g.
 * "template line 12: unsupported filter 'wordwrap'" or
 * "template line 3: block opened here is never closed (expected 'endif')".
 * NULL also on out of memory. The caller may free src afterwards. */
dsq_chat_template_t *dsq_chat_template_create(const char *src, size_t len,
                                              char *err, size_t err_len);

/* Free a template. NULL is a no-op. */
void dsq_chat_template_destroy(dsq_chat_template_t *t);

/* Render a conversation. The JSON inputs are NUL-terminated JSON text
 * (one value, whitespace around it allowed), parsed here and read during
 * the call only; the template sees the values they hold.
 * messages_json: an array of message objects ({"role", "content" (string,
 *   or array of {"type":"text","text":...} parts), optional "tool_calls",
 *   "reasoning_content", ...}); passed to the template as is. Required.
 * tools_json: an array of tool schemas, or NULL / "null" (the template
 *   sees None, as with transformers' tools=None; `documents` is None too).
 * add_generation_prompt: the template variable of that name.
 * bos, eos: NUL-terminated bos_token / eos_token, or NULL to leave the
 *   variable undefined (as transformers does for a tokenizer without one).
 * extra_json: an object whose members become further template variables
 *   (e.g. {"enable_thinking": false}), or NULL.
 * out, out_len: on success *out is a malloc'd NUL-terminated string of
 *   *out_len bytes, owned by the caller (free()). On failure *out is NULL.
 * Returns 0; DSQ_EINVAL when the template fails on this input
 * (raise_exception(), an undefined value used, a type error: the message
 * is in err, fit for a 400 reply), a text is not JSON (err names it and
 * the byte its parse stopped at) or an argument is NULL/of the wrong
 * type; DSQ_ERANGE when a safety limit is hit; DSQ_ENOMEM. */
int dsq_chat_template_render(const dsq_chat_template_t *t,
                             const char *messages_json, const char *tools_json,
                             bool add_generation_prompt, const char *bos,
                             const char *eos, const char *extra_json, char **out,
                             size_t *out_len, char *err, size_t err_len);

#endif

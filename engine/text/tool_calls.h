/* Tool calls in model output: the model's own call syntax parsed out of
 * the generated text into (name, arguments) pairs, as OpenAI's
 * message.tool_calls carries them.
 *
 * Formats (each the one the model's chat template writes for an assistant
 * turn with tool_calls, so the model was trained to produce it):
 *  - DSQ_TOOL_PARSER_DEEPSEEK: DeepSeek-V2.5 / V3 / R1
 *        <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
 *        ```json
 *        ARGS
 *        ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
 *    and DeepSeek-V3.1's shorter <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
 *    <｜tool▁call▁end｜>; <｜tool▁calls▁end｜> may be missing (the V3
 *    template itself leaves it out after a single call).
 *  - DSQ_TOOL_PARSER_HERMES: Qwen2.5 and the Hermes models
 *        <tool_call>
 *        {"name": NAME, "arguments": {...}}
 *        </tool_call>
 *    repeated for parallel calls.
 * ARGS must be one JSON object. Text before the first call (and any text
 * after the last) is the message content. Output that starts a call but
 * does not finish it well (no end marker, arguments that are not a JSON
 * object, no name) gives no calls: the whole text is content, never lost.
 */
#ifndef DSQ_TOOL_CALLS_H
#define DSQ_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum dsq_tool_parser {
    DSQ_TOOL_PARSER_NONE = 0,      /* no parsing: all text is content        */
    DSQ_TOOL_PARSER_DEEPSEEK = 1,
    DSQ_TOOL_PARSER_HERMES = 2,
} dsq_tool_parser_t;

/* One parsed call; both strings malloc'd, NUL-terminated UTF-8. arguments
 * is the model's JSON object text, trimmed of surrounding whitespace. */
typedef struct dsq_tool_call {
    char *name;
    char *arguments;
} dsq_tool_call_t;

/* A parse result. content: malloc'd, NUL-terminated, content_len bytes
 * (possibly 0). calls: n_calls entries (NULL when 0). Owned by the
 * caller; free with dsq_tool_parse_free. */
typedef struct dsq_tool_parse {
    char *content;
    size_t content_len;
    dsq_tool_call_t *calls;
    int n_calls;
} dsq_tool_parse_t;

/* Parse len bytes of generated text with parser p into *out (always
 * filled on DSQ_OK, even with no calls). Errors: DSQ_ENOMEM (out left
 * empty), DSQ_EINVAL (unknown parser). */
int dsq_tool_calls_parse(dsq_tool_parser_t p, const char *text, size_t len,
                         dsq_tool_parse_t *out);

/* The same for the text of a choice cut at its token limit: a last call
 * that was begun and never ended is dropped, from its begin marker on
 * (also when the cut fell inside the marker itself), so the complete calls
 * before it still parse and no half call is returned as content. */
int dsq_tool_calls_parse_cut(dsq_tool_parser_t p, const char *text, size_t len,
                             dsq_tool_parse_t *out);

/* Free what *r owns and zero it; NULL or a zeroed result is a no-op. */
void dsq_tool_parse_free(dsq_tool_parse_t *r);

/* The parser a chat template's text implies: DEEPSEEK when it writes
 * <｜tool▁call▁begin｜>, HERMES when it writes <tool_call>, else NONE.
 * tmpl may be NULL (NONE). */
dsq_tool_parser_t dsq_tool_parser_detect(const char *tmpl);

/* "deepseek" (also "deepseek_v3", "deepseek_v31"), "hermes" (also
 * "qwen"), "none" into *out: DSQ_OK, or DSQ_EINVAL for another name
 * ("auto" is the caller's: dsq_tool_parser_detect). */
int dsq_tool_parser_from_name(const char *name, dsq_tool_parser_t *out);

/* The first bytes of text (of len) where a call of parser p could be
 * starting: the offset of the earliest call marker, or of a suffix that is
 * a prefix of one (so a stream can hold back those bytes until it knows),
 * else len. For streaming: text before that offset is content for sure. */
size_t dsq_tool_calls_safe_prefix(dsq_tool_parser_t p, const char *text, size_t len);

#endif

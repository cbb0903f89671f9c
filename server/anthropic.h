/* Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) on top of the chat machinery.
 *
 * A Messages request is translated into the OpenAI chat request it means
 * (system blocks -> a system message, tool_use blocks -> tool_calls,
 * tool_result blocks -> "tool" messages, tools' input_schema ->
 * function parameters, tool_choice any/tool -> required/named), which then
 * goes through the same validation, template, grammar and engine path as
 * /v1/chat/completions. What comes back is built here in Anthropic's
 * shapes: the message object, the SSE event sequence (message_start, ping,
 * content_block_start / delta / stop, message_delta, message_stop) and the
 * error object {"type": "error", "error": {"type", "message"}}.
 *
 * Field meanings follow Anthropic's Messages API reference (2023-06-01
 * version); where Anthropic and OpenAI name a field alike (temperature,
 * top_p, top_k, max_tokens, stream) the chat parser's rules apply and its
 * errors name that field. Pure functions over cJSON: no sockets, no engine
 * state (tests/unit/test_anthropic.c). docs/api.md lists the mapping. */
#ifndef DSQ_SERVER_ANTHROPIC_H
#define DSQ_SERVER_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/error.h"
#include "server/openai.h"

/* A translated request. chat_body is an OpenAI chat request (JSON text,
 * NUL-terminated, malloc'd, owned) that dsq_openai_parse_chat (and
 * dsq_openai_parse_tokenize_req for count_tokens) reads. */
typedef struct dsq_anthropic_req {
    char *chat_body;
    size_t chat_body_len;
    bool thinking_off;           /* thinking disabled, or display
                                    "omitted": the reasoning parser's part
                                    is not returned                      */
    int thinking_budget;         /* thinking.budget_tokens, 0 when disabled
                                    (the chat body's thinking_budget), -1
                                    when thinking is not sent            */
} dsq_anthropic_req_t;

/* Translate a Messages body (len bytes, need not be NUL-terminated).
 * count_only: the /v1/messages/count_tokens body (max_tokens, stream and
 * the sampling fields are not read). Checks what the chat parser cannot
 * see after translation: roles user/assistant only, content a string or
 * text / tool_use / tool_result / thinking blocks (image and document
 * blocks are refused as unsupported), system a string or text blocks,
 * max_tokens present, stop_sequences at most DSQ_OPENAI_MAX_STOP strings,
 * tools with a name and an object input_schema (server tools, whose type
 * is not "custom", are refused), tool_choice auto/any/tool/none, thinking
 * enabled (budget_tokens >= 1), adaptive or disabled (display summarized
 * or omitted), output_config.format json_schema (-> response_format). Returns 0 and fills *out
 * (release with dsq_anthropic_req_deinit), or DSQ_EINVAL with *err set
 * (*out empty). */
int dsq_anthropic_to_chat(const char *body, size_t len, bool count_only,
                          dsq_anthropic_req_t *out, dsq_api_error_t *err);
void dsq_anthropic_req_deinit(dsq_anthropic_req_t *r);

/* Anthropic's stop_reason of a finished choice: "max_tokens" for LENGTH
 * (calls or not), "tool_use" when it ended in tool calls, "stop_sequence"
 * when a stop sequence ended it (stop_matched), else "end_turn". Static. */
const char *dsq_anthropic_stop_reason(dsq_finish_t f, bool tool_calls, bool stop_matched);

/* The whole message object of a non-streamed answer:
 * {id, type "message", role "assistant", model, content [thinking block
 * when ch->reasoning and thinking, text block when ch->content_len or
 * nothing else, one tool_use block per call with its arguments parsed
 * into "input"], stop_reason, stop_sequence (NULL -> null), usage
 * {input_tokens (uncached prompt tokens), output_tokens,
 * cache_read_input_tokens, cache_creation_input_tokens 0}}. malloc'd,
 * NULL on ENOMEM. */
char *dsq_anthropic_message_body(const char *id, const char *model,
                                 const dsq_chat_choice_out_t *ch, bool thinking,
                                 const char *stop_sequence, const dsq_usage_t *usage);

/* State of one streamed message: which content block is open. */
typedef struct dsq_anthropic_stream {
    int index;                   /* index of the next block                 */
    int open;                    /* DSQ_ANTHROPIC_BLOCK_* of the open block */
} dsq_anthropic_stream_t;

enum { DSQ_ANTHROPIC_BLOCK_NONE = 0, DSQ_ANTHROPIC_BLOCK_TEXT, DSQ_ANTHROPIC_BLOCK_THINKING };

/* Each ev_* function returns one or more SSE events ("event: NAME\ndata:
 * JSON\n\n"), malloc'd, or NULL on ENOMEM (state then unchanged). */

/* message_start (the message with empty content, stop_reason null and
 * usage {input_tokens, output_tokens 0}) and a ping. */
char *dsq_anthropic_ev_start(const char *id, const char *model, int64_t input_tokens);
/* n bytes of text (thinking: the reasoning part) as a content_block_delta
 * (text_delta / thinking_delta), preceded by the stop of an open block of
 * the other kind and the start of this kind's block when none is open.
 * n == 0 gives "" (nothing to send). */
char *dsq_anthropic_ev_text(dsq_anthropic_stream_t *st, bool thinking, const char *s,
                            size_t n);
/* n tool calls, each a tool_use block whole: content_block_start {id,
 * name, input {}}, one input_json_delta with the arguments, stop. An open
 * text or thinking block is stopped first. */
char *dsq_anthropic_ev_tools(dsq_anthropic_stream_t *st, const dsq_tool_call_out_t *calls,
                             int n);
/* The end: stop of an open block, message_delta {stop_reason,
 * stop_sequence, usage} and message_stop. */
char *dsq_anthropic_ev_end(dsq_anthropic_stream_t *st, const char *stop_reason,
                           const char *stop_sequence, const dsq_usage_t *usage);
/* An error event inside a stream whose 200 went out. */
char *dsq_anthropic_ev_error(dsq_apierr_t kind, const char *message);

/* Anthropic's error type of a kind: invalid_request_error,
 * authentication_error, permission_error, not_found_error,
 * request_too_large, rate_limit_error, timeout_error, api_error,
 * overloaded_error. Static. */
const char *dsq_anthropic_error_type(dsq_apierr_t kind);
/* {"type": "error", "error": {"type": .., "message": ..}}; malloc'd, NULL
 * on ENOMEM. */
char *dsq_anthropic_error_json(dsq_apierr_t kind, const char *message);

#endif

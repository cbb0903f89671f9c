/* OpenAI's Responses API (POST /v1/responses), the stateless part, on top
 * of the chat machinery.
 *
 * A Responses request is translated into the chat request it means
 * (instructions -> a system message, input items -> messages,
 * function_call / function_call_output items -> tool_calls / "tool"
 * messages, function tools -> chat tools, text.format -> response_format),
 * which then takes the /v1/chat/completions path. What comes back is built
 * here: the response object (output items reasoning, message,
 * function_call) and the streamed events (response.created,
 * response.in_progress, response.output_item.added / done,
 * response.content_part.added / done, response.output_text.delta / done,
 * response.reasoning_text.delta / done,
 * response.function_call_arguments.delta / done, response.completed or
 * response.incomplete), each with its sequence_number.
 *
 * dsqd keeps no responses: `store: true`, `previous_response_id`,
 * `conversation` and `background: true` are refused with a 400 that says
 * so (send the whole conversation as input items instead). Field meanings
 * follow OpenAI's Responses API reference. Pure functions over cJSON
 * (tests/unit/test_responses.c); docs/api.md lists the mapping. */
#ifndef DSQ_SERVER_RESPONSES_H
#define DSQ_SERVER_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "server/error.h"
#include "server/openai.h"

/* A translated request. chat_body: an OpenAI chat request (JSON text,
 * malloc'd) for dsq_openai_parse_chat; echo: the request fields a
 * response object repeats (instructions, max_output_tokens, temperature,
 * top_p, tools, tool_choice, parallel_tool_calls, text, reasoning,
 * metadata, user), defaults filled in. Both owned. */
typedef struct dsq_responses_req {
    char *chat_body;
    size_t chat_body_len;
    cJSON *echo;
} dsq_responses_req_t;

/* Translate a Responses body (len bytes). input: a string (one user
 * message) or items: messages {role user/system/developer/assistant,
 * content a string or input_text / output_text parts}, function_call
 * {call_id, name, arguments}, function_call_output {call_id, output},
 * reasoning (dropped). Refused with a 400 naming the field: images and
 * files (unsupported), hosted tools (web_search, file_search, ...),
 * store true, previous_response_id, conversation, background true,
 * prompt, max_tool_calls. Returns 0 (release with
 * dsq_responses_req_deinit) or DSQ_EINVAL with *err set. */
int dsq_responses_to_chat(const char *body, size_t len, dsq_responses_req_t *out,
                          dsq_api_error_t *err);
void dsq_responses_req_deinit(dsq_responses_req_t *r);

/* What every response object carries beside its output. Borrowed. */
typedef struct dsq_responses_meta {
    const char *id;              /* "resp_..."                              */
    int64_t created;             /* unix s                                   */
    const char *model;
    const cJSON *echo;           /* dsq_responses_req_t.echo                 */
} dsq_responses_meta_t;

/* The whole response object of a finished choice: output [reasoning item
 * when ch->reasoning, message item with one output_text part when
 * ch->content_len or no calls, one function_call item per call (call_id
 * = the call's id)], status "completed", or "incomplete" with
 * incomplete_details {reason "max_output_tokens"} when it ended at the
 * length limit; usage {input_tokens, input_tokens_details.cached_tokens,
 * output_tokens, output_tokens_details.reasoning_tokens, total_tokens}.
 * malloc'd, NULL on ENOMEM. */
char *dsq_responses_body(const dsq_responses_meta_t *m, const dsq_chat_choice_out_t *ch,
                         const dsq_usage_t *usage);

/* State of one streamed response. Zero-initialise; free with
 * dsq_responses_stream_free. */
typedef struct dsq_responses_stream {
    int seq;                     /* the next event's sequence_number        */
    int open;                    /* DSQ_RESPONSES_ITEM_* of the open item   */
    char item_id[48];            /* its id                                  */
    char *text;                  /* its text so far (for the .done events)  */
    size_t text_len;
    cJSON *output;               /* the items done, in order                */
} dsq_responses_stream_t;

enum { DSQ_RESPONSES_ITEM_NONE = 0, DSQ_RESPONSES_ITEM_MESSAGE, DSQ_RESPONSES_ITEM_REASONING };

void dsq_responses_stream_free(dsq_responses_stream_t *st);

/* Each ev_* returns SSE events ("event: <type>\ndata: JSON\n\n"),
 * malloc'd, NULL on ENOMEM. */

/* response.created and response.in_progress (status "in_progress",
 * output []). */
char *dsq_responses_ev_start(dsq_responses_stream_t *st, const dsq_responses_meta_t *m);
/* n bytes of output text (reasoning: of the reasoning item) as a delta,
 * opening its item (and content part) first and closing an open item of
 * the other kind before. n == 0 gives "". */
char *dsq_responses_ev_text(dsq_responses_stream_t *st, bool reasoning, const char *s,
                            size_t n);
/* n function calls, each an item whole: added, one arguments delta,
 * arguments done, item done. An open item is closed first. */
char *dsq_responses_ev_calls(dsq_responses_stream_t *st, const dsq_tool_call_out_t *calls,
                             int n);
/* The end: the open item closed, then response.completed (or
 * response.incomplete when finish is LENGTH) with every item and the
 * usage. */
char *dsq_responses_ev_end(dsq_responses_stream_t *st, const dsq_responses_meta_t *m,
                           dsq_finish_t finish, const dsq_usage_t *usage);
/* An "error" event {code, message, param} for a stream whose 200 went
 * out. */
char *dsq_responses_ev_error(dsq_responses_stream_t *st, dsq_apierr_t kind,
                             const char *message);

#endif

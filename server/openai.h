/* OpenAI request and response JSON for the HTTP edge.
 *
 * Parsing (server/openai.c) turns a request body into a validated C struct,
 * or into a dsq_api_error_t naming the field (OpenAI's `param`); building
 * (server/openai_response.c) turns engine output into completion bodies
 * and SSE chunks. Pure functions over cJSON:
 * no sockets, no engine state, so every rule is unit-tested on its own
 * (tests/unit/test_openai.c). Field meanings and bounds follow the OpenAI
 * Completions API reference; where OpenAI is silent (top_k, min_p,
 * repetition_penalty, stop_token_ids, ignore_eos) they follow vLLM's
 * SamplingParams. docs/api.md lists every rule. */
#ifndef DSQ_SERVER_OPENAI_H
#define DSQ_SERVER_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/serve/engine.h"
#include "server/error.h"

#define DSQ_OPENAI_MAX_STOP 4        /* OpenAI: "up to 4 sequences"          */
#define DSQ_OPENAI_MAX_LOGPROBS 20   /* vLLM's default max_logprobs          */
#define DSQ_OPENAI_MAX_N 128         /* OpenAI's bound on n                  */
#define DSQ_OPENAI_MAX_PROMPTS 1024  /* prompts in one request               */
/* Default cap on len(prompts) x max(n, best_of), the sequences one
 * request creates (each holds KV blocks and a scheduler slot); above -> 400.
 * OpenAI's cap on n: a single-prompt request OpenAI takes is taken, and
 * one request stays at half of the default --max-num-seqs (256). */
#define DSQ_OPENAI_MAX_SEQS 128
/* Cap on the prompt-logprob entries one request returns (echo +
 * logprobs): sum over prompts of n x prompt tokens x (logprobs + 1). Each
 * choice repeats its prompt's entries, so without a cap a 1 MiB request
 * (8 prompts of 8k token ids, n 128, logprobs 20) asked for 176 M entries,
 * tens of GB of JSON. 2^21 entries are ~55 MB of response; above -> 400. */
#define DSQ_OPENAI_MAX_PROMPT_LOGPROB_ENTRIES (1 << 21)

/* One prompt: either text (tokenized later by the caller, who then fills
 * ids/n_ids) or token ids as sent. All memory malloc'd, owned by the
 * dsq_completion_req_t. */
typedef struct dsq_prompt {
    char *text;                  /* NUL-terminated; NULL for id prompts     */
    size_t text_len;
    int32_t *ids;
    int n_ids;
} dsq_prompt_t;

/* A validated POST /v1/completions request. sp's pointer fields point into
 * storage owned by this struct; free it all with dsq_completion_req_deinit. */
typedef struct dsq_completion_req {
    char *model;
    int n_prompts;
    dsq_prompt_t *prompts;
    dsq_sampling_t sp;           /* sp.n = choices per prompt               */
    int best_of;                 /* >= sp.n; also in sp.best_of. best_of > n
                                    with stream is rejected (400)          */
    bool echo;
    bool stream;
    bool include_usage;          /* stream_options.include_usage            */
    /* chat (dsq_openai_parse_chat) only; owned, NULL otherwise */
    bool chat;
    cJSON *messages;             /* validated, content normalised to string
                                    (text parts joined by "\n") or null    */
    cJSON *tools;                /* as sent, or NULL                        */
    /* chat: tool_choice (DSQ_TOOL_CHOICE_*; AUTO when tools are given and
     * tool_choice is not, else NONE), the function of a named choice
     * (owned), parallel_tool_calls (default true) */
    int tool_choice;
    char *tool_name;
    bool parallel_tool_calls;
    /* chat: thinking tokens allowed (thinking_budget; 0 from
     * chat_template_kwargs.enable_thinking false), -1 = not given */
    int think_budget;
    int32_t *think_ids;          /* storage behind sp.think_start/_end      */
    /* storage behind sp */
    int32_t *logit_bias_ids;
    float *logit_bias;
    int32_t *stop_token_ids;
    char **stop;
} dsq_completion_req_t;

/* tool_choice of a chat request. */
enum {
    DSQ_TOOL_CHOICE_NONE = 0,    /* no tools, or "none": text only           */
    DSQ_TOOL_CHOICE_AUTO,        /* the model may call; calls parsed out     */
    DSQ_TOOL_CHOICE_REQUIRED,    /* decoding constrained to >= 1 call        */
    DSQ_TOOL_CHOICE_NAMED,       /* constrained to a call of tool_name       */
};

/* What the parser checks against. */
typedef struct dsq_openai_limits {
    const char *served_model_name;   /* "model" must equal this             */
    int32_t n_vocab;                 /* token ids must be < n_vocab; 0: any */
    int max_seqs;                    /* cap on prompts x max(n, best_of);
                                        0 = DSQ_OPENAI_MAX_SEQS             */
} dsq_openai_limits_t;

/* Parse and validate a completions body (len bytes, need not be
 * NUL-terminated). Returns 0 and fills *out, or DSQ_EINVAL with *err set
 * (kind, param, message); *out is then empty. Unknown fields are ignored
 * (as vLLM does); `suffix` is rejected as unsupported. best_of > n sets
 * sp.best_of (400 with stream, as OpenAI); echo together with logprobs
 * sets sp.prompt_logprobs. Every parser here rejects a body whose strings
 * (values or keys, at any depth) are not valid UTF-8, naming the top-level
 * field; and len(prompts) x max(n, best_of) above lim->max_seqs (param
 * "n" or "best_of"). */
int dsq_openai_parse_completion(const char *body, size_t len,
                                const dsq_openai_limits_t *lim,
                                dsq_completion_req_t *out,
                                dsq_api_error_t *err);
void dsq_completion_req_deinit(dsq_completion_req_t *r);

/* Parse and validate a /v1/chat/completions body into the same struct
 * (prompts empty: the caller renders r->messages with the chat template
 * and tokenizes the result). messages: required non-empty array; role one
 * of system/user/assistant/tool; content a string, an array of
 * {"type":"text","text":..} parts, or null/absent for assistant only.
 * max_completion_tokens wins over max_tokens; neither given leaves
 * sp.max_tokens = -1 ("until the context is full"). logprobs is a boolean
 * and top_logprobs (0..20, needs logprobs) sets sp.logprobs. echo, suffix
 * and best_of are not chat fields and are ignored. Returns 0 or
 * DSQ_EINVAL with *err set. */
int dsq_openai_parse_chat(const char *body, size_t len,
                          const dsq_openai_limits_t *lim,
                          dsq_completion_req_t *out, dsq_api_error_t *err);
/* Every request body's first step: the strict JSON check (server/json.h),
 * then cJSON's tree, which must be an object whose strings are UTF-8.
 * Returns the tree (caller deletes) or NULL with *err set (400 naming the
 * byte, or the top-level field that holds bad UTF-8). */
cJSON *dsq__openai_parse_object(const char *body, size_t len, dsq_api_error_t *err);
/* The messages/tools part of a chat-style body (also used by /tokenize):
 * *messages gets a normalised copy (see dsq_openai_parse_chat), *tools a
 * copy of "tools" or NULL; both owned by the caller (cJSON_Delete).
 * Returns 0 or DSQ_EINVAL with *err set. */
int dsq__openai_parse_messages(const cJSON *root, cJSON **messages,
                               cJSON **tools, dsq_api_error_t *err);

/* POST /tokenize body, either {prompt, add_special_tokens?} or
 * {messages, tools?, add_generation_prompt? (default true),
 * add_special_tokens? (default true)}; model optional. Owned strings and
 * JSON are freed by dsq_tokenize_req_deinit. */
typedef struct dsq_tokenize_req {
    char *prompt;                /* NULL when messages were sent           */
    size_t prompt_len;
    cJSON *messages;             /* normalised as for chat, or NULL        */
    cJSON *tools;
    bool add_special;
    bool add_generation_prompt;
} dsq_tokenize_req_t;
/* Returns 0 or DSQ_EINVAL (*err set; *out then empty). */
int dsq_openai_parse_tokenize_req(const char *body, size_t len,
                                  const dsq_openai_limits_t *lim,
                                  dsq_tokenize_req_t *out,
                                  dsq_api_error_t *err);
void dsq_tokenize_req_deinit(dsq_tokenize_req_t *r);

/* Check n_prompt + max_tokens <= max_model_len. Returns 0, or DSQ_ERANGE
 * with err = CONTEXT_LENGTH naming both numbers (never truncates). */
int dsq_openai_check_context(int n_prompt, int max_tokens, int max_model_len,
                             dsq_api_error_t *err);

/* POST /tokenize body {model?, prompt: string, add_special_tokens?: bool
 * (default true)}. *prompt is malloc'd (caller frees). 0 or DSQ_EINVAL. */
int dsq_openai_parse_tokenize(const char *body, size_t len,
                              const dsq_openai_limits_t *lim, char **prompt,
                              size_t *prompt_len, bool *add_special,
                              dsq_api_error_t *err);
/* POST /detokenize body {model?, tokens: [int]}. *ids malloc'd (caller
 * frees). 0 or DSQ_EINVAL. */
int dsq_openai_parse_detokenize(const char *body, size_t len,
                                const dsq_openai_limits_t *lim,
                                int32_t **ids, int *n_ids,
                                dsq_api_error_t *err);

/* ---- responses (server/openai_response.c) */

/* A fresh id "<prefix><32 hex digits>" from OpenSSL RAND_bytes into buf
 * (len >= strlen(prefix) + 33). Returns 0 or DSQ_EIO if the CSPRNG fails. */
int dsq_openai_new_id(char *buf, size_t len, const char *prefix);

/* "stop", "length" or "abort" (DSQ_FINISH_ABORT), NULL for NONE. */
const char *dsq_openai_finish_reason(dsq_finish_t f);

/* Copy of len bytes with every invalid UTF-8 sequence replaced by U+FFFD;
 * malloc'd, NUL-terminated, length in *out_len (may be NULL). */
char *dsq_openai_utf8_clean(const char *s, size_t len, size_t *out_len);

/* Gives the display bytes of a token id for logprobs (not NUL-terminated),
 * NULL if unknown. u is the caller's context (the tokenizer). */
typedef const char *(*dsq_token_text_fn)(void *u, int32_t id, size_t *len);

/* New completions-format logprobs object {"tokens":[],"token_logprobs":[],
 * "top_logprobs":[],"text_offset":[]}; NULL on ENOMEM. */
cJSON *dsq_openai_logprobs_new(void);
/* Append output event o's tokens to lp: token text, logprob, a dict of the
 * top alternatives (plus the sampled token, as vLLM does) and its byte
 * offset o->token_text_offset[i] + offset_base (offset_base = length of the
 * echoed prompt). Returns 0 or DSQ_ENOMEM. */
int dsq_openai_logprobs_add(cJSON *lp, const dsq_output_t *o,
                            size_t offset_base, dsq_token_text_fn fn,
                            void *u);

/* Echo + logprobs. Append the prompt's entries to lp: token i of
 * ids[n_ids] with its text, its byte offset (sum of the display byte
 * lengths of the tokens before it), its logprob o->prompt_logprobs[i - 1]
 * and a dict of o->prompt_top's alternatives plus the token itself. Token
 * 0 has no context: its token_logprobs and top_logprobs entries are null
 * (OpenAI's format), as are entries past o->n_prompt_logprobs (not
 * computed). *text_len (may be NULL) receives the total byte length, the
 * offset_base of the completion's entries. Returns 0, DSQ_EINVAL (lp not
 * completions-format) or DSQ_ENOMEM. */
int dsq_openai_logprobs_add_prompt(cJSON *lp, const int32_t *ids, int n_ids,
                                   const dsq_output_t *o,
                                   dsq_token_text_fn fn, void *u,
                                   size_t *text_len);

/* One finished choice of a non-streaming response. */
typedef struct dsq_choice_out {
    int index;
    const char *text;
    size_t text_len;
    cJSON *logprobs;             /* borrowed; NULL -> "logprobs": null      */
    dsq_finish_t finish;
} dsq_choice_out_t;

typedef struct dsq_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens;
    bool has_cached;             /* add prompt_tokens_details.cached_tokens */
    int64_t reasoning_tokens;
    bool has_reasoning;          /* add completion_tokens_details.reasoning_tokens */
} dsq_usage_t;

/* Whole text_completion body. malloc'd string, NULL on ENOMEM. */
char *dsq_openai_completion_body(const char *id, int64_t created,
                                 const char *model,
                                 const dsq_choice_out_t *choices,
                                 int n_choices, const dsq_usage_t *usage);

/* One SSE event "data: {chunk}\n\n" carrying one choice's delta; finish may
 * be DSQ_FINISH_NONE (JSON null). logprobs is borrowed (NULL = null).
 * usage_null adds "usage": null (stream_options.include_usage). malloc'd. */
char *dsq_openai_chunk(const char *id, int64_t created, const char *model,
                       int index, const char *text, size_t text_len,
                       cJSON *logprobs, dsq_finish_t finish, bool usage_null);
/* ---- chat output (object "chat.completion" / "chat.completion.chunk") */

/* New chat-format logprobs object {"content": []}; NULL on ENOMEM. */
cJSON *dsq_openai_chat_logprobs_new(void);
/* Append o's tokens to lp["content"] as {token, logprob, bytes: [ints],
 * top_logprobs: [{token, logprob, bytes}] (o->n_top entries)}. token is
 * the token's bytes with invalid UTF-8 replaced; bytes are the raw ones.
 * Returns 0, DSQ_EINVAL (lp not chat-format) or DSQ_ENOMEM. */
int dsq_openai_chat_logprobs_add(cJSON *lp, const dsq_output_t *o,
                                 dsq_token_text_fn fn, void *u);

/* One tool call of a chat choice: id ("call_..."), function name and its
 * arguments (JSON text). Borrowed strings. */
typedef struct dsq_tool_call_out {
    const char *id;
    const char *name;
    const char *arguments;
} dsq_tool_call_out_t;

/* One finished chat choice. reasoning NULL: no "reasoning_content".
 * n_tool_calls > 0: message.tool_calls, content null when content_len is
 * 0, finish_reason "tool_calls" (OpenAI's chat completion object). */
typedef struct dsq_chat_choice_out {
    int index;
    const char *content;
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
    const dsq_tool_call_out_t *tool_calls;
    int n_tool_calls;
    cJSON *logprobs;             /* borrowed; NULL -> "logprobs": null      */
    dsq_finish_t finish;
} dsq_chat_choice_out_t;

/* Whole chat.completion body: choices[{index, message{role "assistant",
 * content, reasoning_content?}, logprobs, finish_reason}], usage.
 * malloc'd, NULL on ENOMEM. */
char *dsq_openai_chat_body(const char *id, int64_t created, const char *model,
                           const dsq_chat_choice_out_t *choices,
                           int n_choices, const dsq_usage_t *usage);

/* One chat.completion.chunk SSE event for one choice. The delta holds
 * "role" when role is non-NULL, "content" when content is non-NULL,
 * "reasoning_content" when reasoning is non-NULL (an empty delta {} when
 * all are NULL, e.g. the finish_reason chunk). logprobs borrowed (NULL =
 * null); usage_null adds "usage": null. malloc'd, NULL on ENOMEM. */
char *dsq_openai_chat_chunk(const char *id, int64_t created, const char *model,
                            int index, const char *role, const char *content,
                            size_t content_len, const char *reasoning,
                            size_t reasoning_len, cJSON *logprobs,
                            dsq_finish_t finish, bool usage_null);
/* One chat.completion.chunk whose delta carries n tool calls whole
 * (delta.tool_calls[{index: first + k, id, type "function", function
 * {name, arguments}}]), as the OpenAI SDKs assemble them. malloc'd, NULL
 * on ENOMEM. */
char *dsq_openai_chat_tool_chunk(const char *id, int64_t created, const char *model,
                                 int index, const dsq_tool_call_out_t *calls, int n,
                                 int first, bool usage_null);
/* The finish chunk of a choice that ended in tool calls
 * (finish_reason "tool_calls", empty delta). malloc'd. */
char *dsq_openai_chat_tool_finish_chunk(const char *id, int64_t created, const char *model,
                                        int index, bool usage_null);

/* The final usage event of a chat stream ("choices": []). malloc'd. */
char *dsq_openai_chat_usage_chunk(const char *id, int64_t created,
                                  const char *model, const dsq_usage_t *usage);

/* The final usage event ("choices": []). malloc'd. */
char *dsq_openai_usage_chunk(const char *id, int64_t created,
                             const char *model, const dsq_usage_t *usage);

/* ---- shared by the translating front ends (server/anthropic.c,
 * server/responses.c); not an API. dsq__json_type_name lives in
 * openai.c, the string and SSE builders in openai_response.c,
 * dsq__text_parts, dsq__chat_message_add and dsq__chat_tool_call_add in
 * translate.c */

/* "null", "boolean", "number", "string", "array", "object" (messages:
 * "got %s"). Static. */
const char *dsq__json_type_name(const cJSON *v);
/* n bytes of s (NULL: "") as a JSON string, invalid UTF-8 replaced by
 * U+FFFD. New item, NULL on ENOMEM. */
cJSON *dsq__json_clean_string(const char *s, size_t n);
/* *s (malloc'd, NUL-terminated, *n bytes) += sep (only when *s is not
 * empty) + t. Returns false on ENOMEM, *s then freed and NULL. */
bool dsq__text_join(char **s, size_t *n, const char *sep, const char *t);

/* c: a string, or an array of {"type": one of types[0..n_types), "text":
 * string} parts (other members ignored) joined by "\n". malloc'd, or NULL
 * with *err set: a part of another type is unsupported, a malformed one
 * invalid; param is the error's field, where names c in its message
 * ("'system'"). */
char *dsq__text_parts(const cJSON *c, const char *const *types, int n_types,
                      const char *param, const char *where, dsq_api_error_t *err);
/* Append {"role": role, "content": text} (text NULL: JSON null) to the
 * chat messages array msgs; the new message, or NULL on ENOMEM. */
cJSON *dsq__chat_message_add(cJSON *msgs, const char *role, const char *text);
/* Append {"id": id, "type": "function", "function": {"name": name,
 * "arguments": arguments (JSON text)}} to an assistant message's
 * tool_calls array; the new entry, or NULL on ENOMEM. */
cJSON *dsq__chat_tool_call_add(cJSON *calls, const char *id, const char *name,
                               const char *arguments);

/* A growing run of named SSE events; zero-initialise. */
typedef struct dsq_sse_buf {
    char *s;
    size_t n;
    bool fail;                   /* an append ran out of memory            */
} dsq_sse_buf_t;
/* Append "event: <o.type>\ndata: <o>\n\n" (the event's name is its
 * object's "type", as Anthropic's and OpenAI's Responses streams have it);
 * takes o (NULL: out of memory, recorded). */
void dsq__sse_typed_event(dsq_sse_buf_t *b, cJSON *o);
/* The events (malloc'd; "" when none), or NULL when an append failed
 * (then freed). */
char *dsq__sse_buf_done(dsq_sse_buf_t *b);

#endif

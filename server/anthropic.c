/* Anthropic Messages requests -> OpenAI chat requests, and chat output ->
 * Anthropic's message object and SSE events (server/anthropic.h). */
#include "server/anthropic.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/common/error.h"

static const cJSON *get(const cJSON *o, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(o, name);
}

static bool type_is(const cJSON *block, const char *type)
{
    const cJSON *t = get(block, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

#define NOMEM(err) dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory")

/* the one content part type a system prompt or tool result may hold */
static const char *const TEXT[] = {"text"};

/* One assistant tool_use block -> an OpenAI tool_calls entry (arguments:
 * the input object as JSON text). */
static int tool_use_call(const cJSON *b, int i, int j, cJSON *calls, dsq_api_error_t *err)
{
    const cJSON *id = get(b, "id"), *name = get(b, "name"), *in = get(b, "input");
    char *args;
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(in))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages[%d].content[%d]' (tool_use) must have a string "
                                 "'id', a string 'name' and an object 'input'", i, j);
    if (!(args = cJSON_PrintUnformatted(in)))
        return NOMEM(err);
    cJSON *call = dsq__chat_tool_call_add(calls, id->valuestring, name->valuestring, args);
    free(args);
    return call ? DSQ_OK : NOMEM(err);
}

/* One user tool_result block -> a "tool" message. */
static int tool_result_message(const cJSON *b, int i, int j, cJSON *msgs, dsq_api_error_t *err)
{
    const cJSON *id = get(b, "tool_use_id"), *c = get(b, "content");
    char where[64], *text;
    cJSON *m;
    if (!cJSON_IsString(id))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages[%d].content[%d]' (tool_result) needs a string "
                                 "'tool_use_id'", i, j);
    snprintf(where, sizeof(where), "'messages[%d].content[%d].content'", i, j);
    if (!(text = c ? dsq__text_parts(c, TEXT, 1, "messages", where, err) : strdup("")))
        return c ? DSQ_EINVAL : NOMEM(err);
    m = dsq__chat_message_add(msgs, "tool", text);
    free(text);
    if (!m)
        return NOMEM(err);
    cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
    return DSQ_OK;
}

/* messages[i] -> one or more OpenAI messages: a user turn's tool_result
 * blocks become "tool" messages in their place among its text; an
 * assistant turn becomes one message with its text as content and its
 * tool_use blocks as tool_calls (thinking blocks are dropped: the
 * templates of reasoning models drop them from earlier turns too). */
static int translate_message(const cJSON *m, int i, cJSON *msgs, dsq_api_error_t *err)
{
    const cJSON *role = get(m, "role"), *c = get(m, "content"), *b;
    bool user;
    char *text = NULL;
    size_t n = 0;
    int j = 0, rc = DSQ_OK;
    cJSON *calls = NULL;
    if (!cJSON_IsObject(m))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages[%d]' must be an object, got %s", i,
                                 dsq__json_type_name(m));
    if (!cJSON_IsString(role) ||
        (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages[%d].role' must be 'user' or 'assistant' (the "
                                 "system prompt goes in 'system'); got %s%.40s%s", i,
                                 cJSON_IsString(role) ? "'" : "",
                                 cJSON_IsString(role) ? role->valuestring
                                                      : dsq__json_type_name(role),
                                 cJSON_IsString(role) ? "'" : "");
    user = !strcmp(role->valuestring, "user");
    if (cJSON_IsString(c))
        return dsq__chat_message_add(msgs, role->valuestring, c->valuestring) ? DSQ_OK
                                                                              : NOMEM(err);
    if (!cJSON_IsArray(c))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages[%d].content' must be a string or an array of "
                                 "content blocks, got %s", i, dsq__json_type_name(c));
    if (!(text = calloc(1, 1)) || (!user && !(calls = cJSON_CreateArray()))) {
        free(text);
        return NOMEM(err);
    }
    bool any = false;             /* a user turn put out a message already */
    cJSON_ArrayForEach(b, c) {
        const cJSON *ty = get(b, "type"), *tx = get(b, "text");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
        if (!cJSON_IsObject(b) || !cJSON_IsString(ty)) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                   "'messages[%d].content[%d]' must be a content block "
                                   "object with a string 'type'", i, j);
            break;
        }
        if (!strcmp(t, "text")) {
            if (!cJSON_IsString(tx)) {
                rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                       "'messages[%d].content[%d].text' must be a string, "
                                       "got %s", i, j, dsq__json_type_name(tx));
                break;
            }
            if (!dsq__text_join(&text, &n, "\n", tx->valuestring)) {
                rc = NOMEM(err);
                break;
            }
        } else if (!user && !strcmp(t, "tool_use")) {
            if ((rc = tool_use_call(b, i, j, calls, err)))
                break;
        } else if (user && !strcmp(t, "tool_result")) {
            /* text before a result stays before it */
            if (n && !dsq__chat_message_add(msgs, "user", text)) {
                rc = NOMEM(err);
                break;
            }
            text[0] = '\0';
            n = 0;
            if ((rc = tool_result_message(b, i, j, msgs, err)))
                break;
            any = true;
        } else if (!user && (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking"))) {
            /* dropped, see above */
        } else {
            bool known = !strcmp(t, "tool_use") || !strcmp(t, "tool_result") ||
                         !strcmp(t, "thinking") || !strcmp(t, "redacted_thinking");
            rc = dsq_api_error_set(err, known ? DSQ_APIERR_INVALID_REQUEST
                                              : DSQ_APIERR_UNSUPPORTED, "messages",
                                   known ? "'messages[%d].content[%d]': a '%.40s' block "
                                           "cannot appear in a%s turn"
                                         : "'messages[%d].content[%d]': block type '%.40s' "
                                           "is not supported%s (text, tool_use, tool_result "
                                           "and thinking are)",
                                   i, j, t, known ? (user ? " user" : "n assistant") : "");
            break;
        }
        j++;
    }
    if (!rc && user && (n || !any) && !dsq__chat_message_add(msgs, "user", text))
        rc = NOMEM(err);
    if (!rc && !user) {
        cJSON *am = dsq__chat_message_add(msgs, "assistant",
                                n || !cJSON_GetArraySize(calls) ? text : NULL);
        if (!am)
            rc = NOMEM(err);
        else if (cJSON_GetArraySize(calls)) {
            cJSON_AddItemToObject(am, "tool_calls", calls);
            calls = NULL;
        }
    }
    cJSON_Delete(calls);
    free(text);
    return rc;
}

/* tools[] (client tools: name, description, input_schema) -> OpenAI
 * function tools. */
static int translate_tools(const cJSON *tools, cJSON *out, dsq_api_error_t *err)
{
    const cJSON *t;
    cJSON *arr;
    int k = 0;
    if (!cJSON_IsArray(tools))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                 "'tools' must be an array, got %s", dsq__json_type_name(tools));
    if (!(arr = cJSON_AddArrayToObject(out, "tools")))
        return NOMEM(err);
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = get(t, "type"), *nm = get(t, "name"), *ds = get(t, "description");
        const cJSON *sc = get(t, "input_schema");
        cJSON *f, *fn;
        if (cJSON_IsObject(t) && cJSON_IsString(ty) && strcmp(ty->valuestring, "custom"))
            return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "tools",
                                     "'tools[%d]' is a server tool (type '%.40s'); dsq runs "
                                     "client tools only ({name, description, input_schema})",
                                     k, ty->valuestring);
        if (!cJSON_IsObject(t) || !cJSON_IsString(nm) || !cJSON_IsObject(sc) ||
            (ds && !cJSON_IsString(ds)) || (ty && !cJSON_IsString(ty)))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                     "'tools[%d]' must be {\"name\": string, \"description\": "
                                     "string, \"input_schema\": object}", k);
        if (!(f = cJSON_CreateObject()))
            return NOMEM(err);
        cJSON_AddItemToArray(arr, f);
        cJSON_AddStringToObject(f, "type", "function");
        fn = cJSON_AddObjectToObject(f, "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        if (ds)
            cJSON_AddStringToObject(fn, "description", ds->valuestring);
        cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(sc, true));
        k++;
    }
    return DSQ_OK;
}

/* tool_choice {type auto|any|tool|none, name, disable_parallel_tool_use}
 * -> OpenAI tool_choice and parallel_tool_calls. */
static int translate_tool_choice(const cJSON *tc, cJSON *out, dsq_api_error_t *err)
{
    const cJSON *ty = get(tc, "type"), *nm = get(tc, "name");
    const cJSON *dp = get(tc, "disable_parallel_tool_use");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
    if (!cJSON_IsObject(tc) || (dp && !cJSON_IsBool(dp)))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tool_choice",
                                 "'tool_choice' must be {\"type\": \"auto\" | \"any\" | "
                                 "\"tool\" | \"none\", ...} with a boolean "
                                 "disable_parallel_tool_use");
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        cJSON_AddStringToObject(out, "tool_choice", t);
    } else if (!strcmp(t, "any")) {
        cJSON_AddStringToObject(out, "tool_choice", "required");
    } else if (!strcmp(t, "tool")) {
        cJSON *o, *fn;
        if (!cJSON_IsString(nm))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tool_choice",
                                     "'tool_choice' of type 'tool' needs a string 'name'");
        if (!(o = cJSON_AddObjectToObject(out, "tool_choice")))
            return NOMEM(err);
        cJSON_AddStringToObject(o, "type", "function");
        fn = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
    } else {
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tool_choice",
                                 "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'");
    }
    if (cJSON_IsTrue(dp))
        cJSON_AddFalseToObject(out, "parallel_tool_calls");
    return DSQ_OK;
}

/* thinking: disabled (a budget of 0, nothing returned), adaptive (no
 * budget of its own: --reasoning-budget applies), enabled with
 * budget_tokens; display "omitted" keeps the thinking out of the answer. */
static int translate_thinking(const cJSON *th, dsq_anthropic_req_t *r, dsq_api_error_t *err)
{
    const cJSON *bt = get(th, "budget_tokens"), *dp = get(th, "display");
    if (type_is(th, "disabled")) {
        r->thinking_off = true;
        r->thinking_budget = 0;
        return DSQ_OK;
    }
    if (!type_is(th, "enabled") && !type_is(th, "adaptive"))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "thinking",
                                 "'thinking' must be {\"type\": \"enabled\", "
                                 "\"budget_tokens\": integer}, {\"type\": \"adaptive\"} or "
                                 "{\"type\": \"disabled\"}");
    if (dp && !cJSON_IsNull(dp) &&
        !(cJSON_IsString(dp) && (!strcmp(dp->valuestring, "summarized") ||
                                 !strcmp(dp->valuestring, "omitted"))))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "thinking",
                                 "'thinking.display' must be \"summarized\" or \"omitted\"");
    r->thinking_off = cJSON_IsString(dp) && !strcmp(dp->valuestring, "omitted");
    if (type_is(th, "adaptive"))
        return DSQ_OK;
    if (!cJSON_IsNumber(bt) || bt->valuedouble < 1 || bt->valuedouble > (1 << 30) ||
        bt->valuedouble != (double)(int)bt->valuedouble)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "thinking",
                                 "'thinking.budget_tokens' must be an integer in [1, %d], got "
                                 "%s", 1 << 30, dsq__json_type_name(bt));
    r->thinking_budget = (int)bt->valuedouble;
    return DSQ_OK;
}

/* output_config {effort, format {type json_schema, schema}}: the format
 * becomes response_format (the grammar engine); effort is not read. */
static int translate_output_config(const cJSON *oc, cJSON *o, dsq_api_error_t *err)
{
    const cJSON *f = get(oc, "format"), *sc = get(f, "schema");
    cJSON *rf, *js;
    if (!cJSON_IsObject(oc))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "output_config",
                                 "'output_config' must be an object, got %s",
                                 dsq__json_type_name(oc));
    if (!f || cJSON_IsNull(f))
        return DSQ_OK;
    if (!type_is(f, "json_schema") || !cJSON_IsObject(sc))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "output_config",
                                 "'output_config.format' must be {\"type\": \"json_schema\", "
                                 "\"schema\": object}");
    if (!(rf = cJSON_AddObjectToObject(o, "response_format")))
        return NOMEM(err);
    cJSON_AddStringToObject(rf, "type", "json_schema");
    js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", "output");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(sc, true));
    return DSQ_OK;
}

/* Copy member name of in to out when present (as sent: the chat parser
 * checks it and names it). */
static void copy(const cJSON *in, cJSON *out, const char *name)
{
    const cJSON *v = get(in, name);
    if (v)
        cJSON_AddItemToObject(out, name, cJSON_Duplicate(v, true));
}

int dsq_anthropic_to_chat(const char *body, size_t len, bool count_only,
                          dsq_anthropic_req_t *out, dsq_api_error_t *err)
{
    int rc = DSQ_OK, i = 0;
    cJSON *in = dsq__openai_parse_object(body, len, err), *o = NULL, *msgs;
    const cJSON *v, *m;
    memset(out, 0, sizeof(*out));
    out->thinking_budget = -1;
    if (!in)
        return DSQ_EINVAL;
    if (!(o = cJSON_CreateObject()) || !(msgs = cJSON_AddArrayToObject(o, "messages"))) {
        rc = NOMEM(err);
        goto done;
    }
    copy(in, o, "model");
    if ((v = get(in, "system")) && !cJSON_IsNull(v)) {
        char *s = dsq__text_parts(v, TEXT, 1, "system", "'system'", err);
        if (!s || !dsq__chat_message_add(msgs, "system", s)) {
            rc = s ? NOMEM(err) : DSQ_EINVAL;
            free(s);
            goto done;
        }
        free(s);
    }
    v = get(in, "messages");
    if (!cJSON_IsArray(v) || !cJSON_GetArraySize(v)) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                               v ? "'messages' must be a non-empty array of messages, got %s"
                                 : "'messages' is required%.0s",
                               cJSON_IsArray(v) ? "an empty array" : dsq__json_type_name(v));
        goto done;
    }
    cJSON_ArrayForEach(m, v)
        if ((rc = translate_message(m, i++, msgs, err)))
            goto done;
    if ((v = get(in, "tools")) && (rc = translate_tools(v, o, err)))
        goto done;
    if ((v = get(in, "tool_choice")) && (rc = translate_tool_choice(v, o, err)))
        goto done;
    if ((v = get(in, "thinking")) && (rc = translate_thinking(v, out, err)))
        goto done;
    if (out->thinking_budget >= 0 && !count_only)
        cJSON_AddNumberToObject(o, "thinking_budget", out->thinking_budget);
    if (count_only && !get(in, "model")) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "model", "'model' is required");
        goto done;
    }
    if (!count_only) {
        if (!get(in, "max_tokens") || cJSON_IsNull(get(in, "max_tokens"))) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "max_tokens",
                                   "'max_tokens' is required");
            goto done;
        }
        copy(in, o, "max_tokens");
        copy(in, o, "temperature");
        copy(in, o, "top_p");
        copy(in, o, "top_k");
        copy(in, o, "stream");
        if (cJSON_IsTrue(get(in, "stream"))) {
            /* the message_delta event carries the usage */
            cJSON *so = cJSON_AddObjectToObject(o, "stream_options");
            cJSON_AddTrueToObject(so, "include_usage");
        }
        if ((v = get(in, "stop_sequences"))) {
            const cJSON *s;
            if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > DSQ_OPENAI_MAX_STOP) {
                rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "stop_sequences",
                                       "'stop_sequences' must be an array of at most %d "
                                       "strings", DSQ_OPENAI_MAX_STOP);
                goto done;
            }
            cJSON_ArrayForEach(s, v)
                if (!cJSON_IsString(s) || !s->valuestring[0]) {
                    rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                           "stop_sequences", "'stop_sequences' must hold "
                                           "non-empty strings, got %s", dsq__json_type_name(s));
                    goto done;
                }
            cJSON_AddItemToObject(o, "stop", cJSON_Duplicate(v, true));
        }
        if ((v = get(in, "output_config")) && !cJSON_IsNull(v) &&
            (rc = translate_output_config(v, o, err)))
            goto done;
        if ((v = get(in, "metadata")) && !cJSON_IsObject(v) && !cJSON_IsNull(v)) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "metadata",
                                   "'metadata' must be an object, got %s", dsq__json_type_name(v));
            goto done;
        }
    }
    if (!(out->chat_body = cJSON_PrintUnformatted(o)))
        rc = NOMEM(err);
    else
        out->chat_body_len = strlen(out->chat_body);
done:
    cJSON_Delete(in);
    cJSON_Delete(o);
    if (rc)
        dsq_anthropic_req_deinit(out);
    return rc ? DSQ_EINVAL : DSQ_OK;
}

void dsq_anthropic_req_deinit(dsq_anthropic_req_t *r)
{
    if (!r)
        return;
    free(r->chat_body);
    memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------ output */

const char *dsq_anthropic_stop_reason(dsq_finish_t f, bool tool_calls, bool stop_matched)
{
    if (f == DSQ_FINISH_LENGTH)
        return "max_tokens";
    if (tool_calls)
        return "tool_use";
    if (f == DSQ_FINISH_STOP && stop_matched)
        return "stop_sequence";
    return "end_turn";
}

static cJSON *usage_obj(const dsq_usage_t *u)
{
    cJSON *o = cJSON_CreateObject();
    int64_t cached = u ? u->cached_tokens : 0;
    if (!o)
        return NULL;
    /* Anthropic counts cache reads apart from input_tokens */
    cJSON_AddNumberToObject(o, "input_tokens", u ? (double)(u->prompt_tokens - cached) : 0);
    cJSON_AddNumberToObject(o, "output_tokens", u ? (double)u->completion_tokens : 0);
    cJSON_AddNumberToObject(o, "cache_read_input_tokens", (double)cached);
    cJSON_AddNumberToObject(o, "cache_creation_input_tokens", 0);
    return o;
}

/* {type tool_use, id, name, input} with the arguments parsed; arguments
 * that are not a JSON object (the tool parser only gives objects) give {}. */
static cJSON *tool_use_block(const dsq_tool_call_out_t *c, bool empty_input)
{
    cJSON *b = cJSON_CreateObject(), *in = NULL;
    if (!b)
        return NULL;
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", c->id);
    cJSON_AddStringToObject(b, "name", c->name);
    if (!empty_input)
        in = cJSON_Parse(c->arguments ? c->arguments : "");
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        in = cJSON_CreateObject();
    }
    cJSON_AddItemToObject(b, "input", in);
    return b;
}

char *dsq_anthropic_message_body(const char *id, const char *model,
                                 const dsq_chat_choice_out_t *ch, bool thinking,
                                 const char *stop_sequence, const dsq_usage_t *usage)
{
    cJSON *o = cJSON_CreateObject(), *content, *b;
    char *out = NULL;
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", model);
    content = cJSON_AddArrayToObject(o, "content");
    bool think_block = thinking && ch->reasoning;
    if (think_block && (b = cJSON_CreateObject())) {
        cJSON_AddItemToArray(content, b);
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddItemToObject(b, "thinking",
                              dsq__json_clean_string(ch->reasoning, ch->reasoning_len));
        /* no signature: nothing here is signed, and clients only echo it */
        cJSON_AddStringToObject(b, "signature", "");
    }
    /* a text block when there is text, or when there would be no block */
    if ((ch->content_len || (!ch->n_tool_calls && !think_block)) &&
        (b = cJSON_CreateObject())) {
        cJSON_AddItemToArray(content, b);
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddItemToObject(b, "text", dsq__json_clean_string(ch->content, ch->content_len));
    }
    for (int k = 0; k < ch->n_tool_calls; k++)
        cJSON_AddItemToArray(content, tool_use_block(&ch->tool_calls[k], false));
    cJSON_AddStringToObject(o, "stop_reason",
                            dsq_anthropic_stop_reason(ch->finish, ch->n_tool_calls > 0,
                                                      stop_sequence != NULL));
    if (stop_sequence)
        cJSON_AddStringToObject(o, "stop_sequence", stop_sequence);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
    cJSON_AddItemToObject(o, "usage", usage_obj(usage));
    out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

static cJSON *typed(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    if (o)
        cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *indexed(const char *type, int index)
{
    cJSON *o = typed(type);
    if (o)
        cJSON_AddNumberToObject(o, "index", index);
    return o;
}

static void block_stop(dsq_sse_buf_t *b, dsq_anthropic_stream_t *st)
{
    if (st->open == DSQ_ANTHROPIC_BLOCK_NONE)
        return;
    dsq__sse_typed_event(b, indexed("content_block_stop", st->index));
    st->index++;
    st->open = DSQ_ANTHROPIC_BLOCK_NONE;
}

char *dsq_anthropic_ev_start(const char *id, const char *model, int64_t input_tokens)
{
    dsq_sse_buf_t b = {0};
    cJSON *o = typed("message_start"), *m = o ? cJSON_AddObjectToObject(o, "message") : NULL;
    if (m) {
        dsq_usage_t u = {.prompt_tokens = input_tokens};
        cJSON_AddStringToObject(m, "id", id);
        cJSON_AddStringToObject(m, "type", "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "model", model);
        cJSON_AddArrayToObject(m, "content");
        cJSON_AddNullToObject(m, "stop_reason");
        cJSON_AddNullToObject(m, "stop_sequence");
        cJSON_AddItemToObject(m, "usage", usage_obj(&u));
    } else {
        b.fail = true;
    }
    dsq__sse_typed_event(&b, o);
    dsq__sse_typed_event(&b, typed("ping"));
    return dsq__sse_buf_done(&b);
}

char *dsq_anthropic_ev_text(dsq_anthropic_stream_t *st, bool thinking, const char *s,
                            size_t n)
{
    int want = thinking ? DSQ_ANTHROPIC_BLOCK_THINKING : DSQ_ANTHROPIC_BLOCK_TEXT;
    dsq_anthropic_stream_t next = *st;
    dsq_sse_buf_t b = {0};
    cJSON *o, *d;
    char *out;
    if (!n)
        return strdup("");
    if (next.open != want) {
        block_stop(&b, &next);
        o = indexed("content_block_start", next.index);
        d = o ? cJSON_AddObjectToObject(o, "content_block") : NULL;
        if (d) {
            cJSON_AddStringToObject(d, "type", thinking ? "thinking" : "text");
            cJSON_AddStringToObject(d, thinking ? "thinking" : "text", "");
            if (thinking)
                cJSON_AddStringToObject(d, "signature", "");
        }
        dsq__sse_typed_event(&b, o);
        next.open = want;
    }
    o = indexed("content_block_delta", next.index);
    d = o ? cJSON_AddObjectToObject(o, "delta") : NULL;
    if (d) {
        cJSON_AddStringToObject(d, "type", thinking ? "thinking_delta" : "text_delta");
        cJSON_AddItemToObject(d, thinking ? "thinking" : "text", dsq__json_clean_string(s, n));
    }
    dsq__sse_typed_event(&b, o);
    if ((out = dsq__sse_buf_done(&b)))
        *st = next;
    return out;
}

char *dsq_anthropic_ev_tools(dsq_anthropic_stream_t *st, const dsq_tool_call_out_t *calls,
                             int n)
{
    dsq_anthropic_stream_t next = *st;
    dsq_sse_buf_t b = {0};
    char *out;
    block_stop(&b, &next);
    for (int k = 0; k < n; k++) {
        cJSON *o = indexed("content_block_start", next.index), *d;
        if (o)
            cJSON_AddItemToObject(o, "content_block", tool_use_block(&calls[k], true));
        dsq__sse_typed_event(&b, o);
        o = indexed("content_block_delta", next.index);
        d = o ? cJSON_AddObjectToObject(o, "delta") : NULL;
        if (d) {
            cJSON_AddStringToObject(d, "type", "input_json_delta");
            cJSON_AddStringToObject(d, "partial_json", calls[k].arguments ? calls[k].arguments
                                                                          : "{}");
        }
        dsq__sse_typed_event(&b, o);
        dsq__sse_typed_event(&b, indexed("content_block_stop", next.index));
        next.index++;
    }
    if ((out = dsq__sse_buf_done(&b)))
        *st = next;
    return out;
}

char *dsq_anthropic_ev_end(dsq_anthropic_stream_t *st, const char *stop_reason,
                           const char *stop_sequence, const dsq_usage_t *usage)
{
    dsq_anthropic_stream_t next = *st;
    dsq_sse_buf_t b = {0};
    cJSON *o, *d;
    char *out;
    if (!next.index && next.open == DSQ_ANTHROPIC_BLOCK_NONE) {
        /* no block at all: one empty text block, as unstreamed */
        o = indexed("content_block_start", 0);
        d = o ? cJSON_AddObjectToObject(o, "content_block") : NULL;
        if (d) {
            cJSON_AddStringToObject(d, "type", "text");
            cJSON_AddStringToObject(d, "text", "");
        }
        dsq__sse_typed_event(&b, o);
        next.open = DSQ_ANTHROPIC_BLOCK_TEXT;
    }
    block_stop(&b, &next);
    o = typed("message_delta");
    d = o ? cJSON_AddObjectToObject(o, "delta") : NULL;
    if (d) {
        cJSON_AddStringToObject(d, "stop_reason", stop_reason);
        if (stop_sequence)
            cJSON_AddStringToObject(d, "stop_sequence", stop_sequence);
        else
            cJSON_AddNullToObject(d, "stop_sequence");
        cJSON_AddItemToObject(o, "usage", usage_obj(usage));
    }
    dsq__sse_typed_event(&b, o);
    dsq__sse_typed_event(&b, typed("message_stop"));
    if ((out = dsq__sse_buf_done(&b)))
        *st = next;
    return out;
}

const char *dsq_anthropic_error_type(dsq_apierr_t kind)
{
    switch (kind) {
    case DSQ_APIERR_AUTH: return "authentication_error";
    case DSQ_APIERR_FORBIDDEN: return "permission_error";
    case DSQ_APIERR_MODEL_NOT_FOUND:
    case DSQ_APIERR_NOT_FOUND: return "not_found_error";
    case DSQ_APIERR_TOO_LARGE: return "request_too_large";
    case DSQ_APIERR_RATE_LIMIT: return "rate_limit_error";
    case DSQ_APIERR_TIMEOUT: return "timeout_error";
    case DSQ_APIERR_INTERNAL: return "api_error";
    case DSQ_APIERR_UNAVAILABLE:
    case DSQ_APIERR_OVERLOADED: return "overloaded_error";
    default: return "invalid_request_error";
    }
}

static cJSON *error_obj(dsq_apierr_t kind, const char *message)
{
    cJSON *o = typed("error"), *e = o ? cJSON_AddObjectToObject(o, "error") : NULL;
    if (e) {
        cJSON_AddStringToObject(e, "type", dsq_anthropic_error_type(kind));
        cJSON_AddStringToObject(e, "message", message ? message : "");
    }
    return o;
}

char *dsq_anthropic_error_json(dsq_apierr_t kind, const char *message)
{
    cJSON *o = error_obj(kind, message);
    char *out = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return out;
}

char *dsq_anthropic_ev_error(dsq_apierr_t kind, const char *message)
{
    dsq_sse_buf_t b = {0};
    dsq__sse_typed_event(&b, error_obj(kind, message));
    return dsq__sse_buf_done(&b);
}

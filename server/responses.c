/* OpenAI Responses requests -> chat requests, and chat output -> the
 * response object and its streamed events (server/responses.h). */
#include "server/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

#define NOMEM(err) dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory")

/* the text parts an input message or a function_call_output may hold */
static const char *const PARTS[] = {"input_text", "output_text"};

static const cJSON *get(const cJSON *o, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(o, name);
}

static bool is_a(const cJSON *o, const char *type)
{
    const cJSON *t = get(o, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

/* present and not null */
static bool given(const cJSON *v)
{
    return v && !cJSON_IsNull(v);
}

/* A function_call item joins the assistant message just before it (the
 * text and calls of one turn), or starts one. */
static int function_call(const cJSON *it, int i, cJSON *msgs, dsq_api_error_t *err)
{
    const cJSON *id = get(it, "call_id"), *nm = get(it, "name"), *ar = get(it, "arguments");
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1), *calls;
    if (!cJSON_IsString(id) || !cJSON_IsString(nm) || !cJSON_IsString(ar))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "input",
                                 "'input[%d]' (function_call) needs string 'call_id', 'name' "
                                 "and 'arguments'", i);
    if (!last || strcmp(cJSON_GetStringValue(get(last, "role")), "assistant")) {
        if (!(last = dsq__chat_message_add(msgs, "assistant", NULL)))
            return NOMEM(err);
    }
    calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (!calls && !(calls = cJSON_AddArrayToObject(last, "tool_calls")))
        return NOMEM(err);
    return dsq__chat_tool_call_add(calls, id->valuestring, nm->valuestring, ar->valuestring)
               ? DSQ_OK : NOMEM(err);
}

static int translate_item(const cJSON *it, int i, cJSON *msgs, dsq_api_error_t *err)
{
    const cJSON *ty = get(it, "type"), *role = get(it, "role");
    char where[48];
    if (!cJSON_IsObject(it) || (ty && !cJSON_IsString(ty)))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "input",
                                 "'input[%d]' must be an item object, got %s", i,
                                 dsq__json_type_name(it));
    snprintf(where, sizeof(where), "'input[%d].content'", i);
    if (!ty || is_a(it, "message")) {
        static const char *const roles[] = {"user", "system", "developer", "assistant"};
        bool ok = false;
        for (size_t k = 0; cJSON_IsString(role) && k < 4; k++)
            ok = ok || !strcmp(role->valuestring, roles[k]);
        if (!ok)
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "input",
                                     "'input[%d].role' must be user, system, developer or "
                                     "assistant", i);
        char *text = dsq__text_parts(get(it, "content"), PARTS, 2, "input", where, err);
        if (!text)
            return DSQ_EINVAL;
        cJSON *m = dsq__chat_message_add(msgs, role->valuestring, text);
        free(text);
        return m ? DSQ_OK : NOMEM(err);
    }
    if (is_a(it, "function_call"))
        return function_call(it, i, msgs, err);
    if (is_a(it, "function_call_output")) {
        const cJSON *id = get(it, "call_id");
        char *text;
        cJSON *m;
        if (!cJSON_IsString(id))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "input",
                                     "'input[%d]' (function_call_output) needs a string "
                                     "'call_id'", i);
        snprintf(where, sizeof(where), "'input[%d].output'", i);
        if (!(text = dsq__text_parts(get(it, "output"), PARTS, 2, "input", where, err)))
            return DSQ_EINVAL;
        m = dsq__chat_message_add(msgs, "tool", text);
        free(text);
        if (!m)
            return NOMEM(err);
        cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
        return DSQ_OK;
    }
    if (is_a(it, "reasoning"))
        return DSQ_OK;   /* earlier reasoning: the R1 templates drop it too */
    return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "input",
                             "'input[%d]': item type '%.40s' is not supported (message, "
                             "function_call, function_call_output and reasoning are)", i,
                             ty->valuestring);
}

static int translate_tools(const cJSON *tools, cJSON *o, dsq_api_error_t *err)
{
    const cJSON *t;
    cJSON *arr;
    int k = 0;
    if (!cJSON_IsArray(tools))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                 "'tools' must be an array, got %s", dsq__json_type_name(tools));
    if (!(arr = cJSON_AddArrayToObject(o, "tools")))
        return NOMEM(err);
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = get(t, "type"), *nm = get(t, "name");
        cJSON *f, *fn;
        if (cJSON_IsString(ty) && strcmp(ty->valuestring, "function"))
            return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "tools",
                                     "'tools[%d]' is a hosted tool (type '%.40s'); dsq runs "
                                     "function tools only", k, ty->valuestring);
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || !cJSON_IsString(nm))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                     "'tools[%d]' must be {\"type\": \"function\", \"name\": "
                                     "string, \"parameters\": object, ...}", k);
        if (!(f = cJSON_CreateObject()))
            return NOMEM(err);
        cJSON_AddItemToArray(arr, f);
        cJSON_AddStringToObject(f, "type", "function");
        fn = cJSON_AddObjectToObject(f, "function");
        /* the chat parser checks name, description and parameters */
        for (const cJSON *m = t->child; m; m = m->next)
            if (strcmp(m->string, "type") && strcmp(m->string, "strict") && !cJSON_IsNull(m))
                cJSON_AddItemToObject(fn, m->string, cJSON_Duplicate(m, true));
        k++;
    }
    return DSQ_OK;
}

static int translate_tool_choice(const cJSON *tc, cJSON *o, dsq_api_error_t *err)
{
    if (cJSON_IsString(tc)) {
        cJSON_AddItemToObject(o, "tool_choice", cJSON_Duplicate(tc, true));
        return DSQ_OK;
    }
    if (is_a(tc, "function") && cJSON_IsString(get(tc, "name"))) {
        cJSON *c = cJSON_AddObjectToObject(o, "tool_choice"), *fn;
        if (!c)
            return NOMEM(err);
        cJSON_AddStringToObject(c, "type", "function");
        fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", get(tc, "name")->valuestring);
        return DSQ_OK;
    }
    return dsq_api_error_set(err, cJSON_IsObject(tc) ? DSQ_APIERR_UNSUPPORTED
                                                     : DSQ_APIERR_INVALID_REQUEST,
                             "tool_choice", "'tool_choice' must be \"none\", \"auto\", "
                             "\"required\" or {\"type\": \"function\", \"name\": ...}");
}

/* text.format -> response_format. */
static int translate_text(const cJSON *text, cJSON *o, dsq_api_error_t *err)
{
    const cJSON *f = get(text, "format");
    if (!cJSON_IsObject(text))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "text",
                                 "'text' must be an object, got %s", dsq__json_type_name(text));
    if (!given(f) || is_a(f, "text"))
        return DSQ_OK;
    if (is_a(f, "json_object")) {
        cJSON *rf = cJSON_AddObjectToObject(o, "response_format");
        if (!rf)
            return NOMEM(err);
        cJSON_AddStringToObject(rf, "type", "json_object");
        return DSQ_OK;
    }
    if (is_a(f, "json_schema")) {
        cJSON *rf = cJSON_AddObjectToObject(o, "response_format"), *js;
        if (!rf)
            return NOMEM(err);
        cJSON_AddStringToObject(rf, "type", "json_schema");
        js = cJSON_AddObjectToObject(rf, "json_schema");
        /* name, schema, strict, description: checked by the chat parser */
        for (const cJSON *m = f->child; m; m = m->next)
            if (strcmp(m->string, "type"))
                cJSON_AddItemToObject(js, m->string, cJSON_Duplicate(m, true));
        return DSQ_OK;
    }
    return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "text.format",
                             "'text.format.type' must be text, json_schema or json_object");
}

/* Fields dsqd cannot honour, refused rather than ignored. */
static int refuse_stateful(const cJSON *in, dsq_api_error_t *err)
{
    const cJSON *v;
    if (given(v = get(in, "store")) && !cJSON_IsBool(v))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "store",
                                 "'store' must be a boolean, got %s", dsq__json_type_name(v));
    if (cJSON_IsTrue(get(in, "store")))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "store",
                                 "dsqd keeps no responses: send 'store': false (or leave it "
                                 "out) and the whole conversation as 'input' items");
    if (given(get(in, "previous_response_id")) || given(get(in, "conversation")))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED,
                                 given(get(in, "conversation")) ? "conversation"
                                                                : "previous_response_id",
                                 "dsqd keeps no responses or conversations: send the whole "
                                 "conversation as 'input' items");
    if (cJSON_IsTrue(get(in, "background")))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "background",
                                 "background responses are not supported (they need a store)");
    if (given(get(in, "prompt")))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "prompt",
                                 "stored prompt templates are not supported");
    if (given(get(in, "max_tool_calls")))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "max_tool_calls",
                                 "'max_tool_calls' is not supported");
    if ((v = get(in, "truncation")) && given(v) &&
        !(cJSON_IsString(v) && !strcmp(v->valuestring, "disabled")))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "truncation",
                                 "only 'truncation': \"disabled\" is supported: a prompt "
                                 "longer than the context is a 400");
    return DSQ_OK;
}

/* echo[name] = in[name] when given, else def (parsed JSON text). */
static void echo_field(cJSON *echo, const cJSON *in, const char *name, const char *def)
{
    const cJSON *v = get(in, name);
    cJSON_AddItemToObject(echo, name, given(v) ? cJSON_Duplicate(v, true) : cJSON_Parse(def));
}

int dsq_responses_to_chat(const char *body, size_t len, dsq_responses_req_t *out,
                          dsq_api_error_t *err)
{
    cJSON *in = dsq__openai_parse_object(body, len, err), *o = NULL, *msgs = NULL;
    const cJSON *v;
    int rc = DSQ_OK;
    memset(out, 0, sizeof(*out));
    if (!in)
        return DSQ_EINVAL;
    if ((rc = refuse_stateful(in, err)))
        goto done;
    if (!(o = cJSON_CreateObject()) || !(msgs = cJSON_AddArrayToObject(o, "messages")) ||
        !(out->echo = cJSON_CreateObject())) {
        rc = NOMEM(err);
        goto done;
    }
    if ((v = get(in, "model")))
        cJSON_AddItemToObject(o, "model", cJSON_Duplicate(v, true));
    if (given(v = get(in, "instructions"))) {
        if (!cJSON_IsString(v)) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "instructions",
                                   "'instructions' must be a string, got %s",
                                   dsq__json_type_name(v));
            goto done;
        }
        if (!dsq__chat_message_add(msgs, "system", v->valuestring)) {
            rc = NOMEM(err);
            goto done;
        }
    }
    v = get(in, "input");
    if (cJSON_IsString(v)) {
        if (!dsq__chat_message_add(msgs, "user", v->valuestring)) {
            rc = NOMEM(err);
            goto done;
        }
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v)) {
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, v)
            if ((rc = translate_item(it, i++, msgs, err)))
                goto done;
    } else {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "input",
                               v ? "'input' must be a string or a non-empty array of items, "
                                   "got %s" : "'input' is required%.0s",
                               cJSON_IsArray(v) ? "an empty array" : dsq__json_type_name(v));
        goto done;
    }
    if (given(v = get(in, "max_output_tokens"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > (1 << 30) ||
            v->valuedouble != (double)(int)v->valuedouble) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "max_output_tokens",
                                   "'max_output_tokens' must be an integer >= 1");
            goto done;
        }
        cJSON_AddItemToObject(o, "max_tokens", cJSON_Duplicate(v, true));
    }
    if (given(v = get(in, "top_logprobs")) && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
        rc = dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "top_logprobs",
                               "logprobs are not returned on /v1/responses (use "
                               "/v1/chat/completions)");
        goto done;
    }
    static const char *const same[] = {"temperature", "top_p", "stream", "parallel_tool_calls",
                                       "user"};
    for (size_t k = 0; k < sizeof(same) / sizeof(same[0]); k++)
        if (given(v = get(in, same[k])))
            cJSON_AddItemToObject(o, same[k], cJSON_Duplicate(v, true));
    if (cJSON_IsTrue(get(in, "stream"))) {
        /* response.completed carries the usage */
        cJSON *so = cJSON_AddObjectToObject(o, "stream_options");
        cJSON_AddTrueToObject(so, "include_usage");
    }
    if (given(v = get(in, "tools")) && (rc = translate_tools(v, o, err)))
        goto done;
    if (given(v = get(in, "tool_choice")) && (rc = translate_tool_choice(v, o, err)))
        goto done;
    if (given(v = get(in, "text")) && (rc = translate_text(v, o, err)))
        goto done;
    if ((given(v = get(in, "reasoning")) && !cJSON_IsObject(v)) ||
        (given(v = get(in, "metadata")) && !cJSON_IsObject(v))) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, v->string,
                               "'%s' must be an object, got %s", v->string,
                               dsq__json_type_name(v));
        goto done;
    }
    echo_field(out->echo, in, "instructions", "null");
    echo_field(out->echo, in, "max_output_tokens", "null");
    echo_field(out->echo, in, "temperature", "1.0");
    echo_field(out->echo, in, "top_p", "1.0");
    echo_field(out->echo, in, "tools", "[]");
    echo_field(out->echo, in, "tool_choice", "\"auto\"");
    echo_field(out->echo, in, "parallel_tool_calls", "true");
    echo_field(out->echo, in, "text", "{\"format\":{\"type\":\"text\"}}");
    echo_field(out->echo, in, "reasoning", "{\"effort\":null,\"summary\":null}");
    echo_field(out->echo, in, "metadata", "{}");
    echo_field(out->echo, in, "user", "null");
    if (!(out->chat_body = cJSON_PrintUnformatted(o)))
        rc = NOMEM(err);
    else
        out->chat_body_len = strlen(out->chat_body);
done:
    cJSON_Delete(in);
    cJSON_Delete(o);
    if (rc)
        dsq_responses_req_deinit(out);
    return rc ? DSQ_EINVAL : DSQ_OK;
}

void dsq_responses_req_deinit(dsq_responses_req_t *r)
{
    if (!r)
        return;
    free(r->chat_body);
    cJSON_Delete(r->echo);
    memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------ output */

static cJSON *usage_obj(const dsq_usage_t *u)
{
    cJSON *o = cJSON_CreateObject(), *d;
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "input_tokens", (double)u->prompt_tokens);
    d = cJSON_AddObjectToObject(o, "input_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)u->cached_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", (double)u->completion_tokens);
    d = cJSON_AddObjectToObject(o, "output_tokens_details");
    cJSON_AddNumberToObject(d, "reasoning_tokens", (double)u->reasoning_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", (double)(u->prompt_tokens + u->completion_tokens));
    return o;
}

/* The response object; takes output. status "in_progress", "completed"
 * or "incomplete" (then incomplete_details max_output_tokens). */
static cJSON *response_obj(const dsq_responses_meta_t *m, const char *status, cJSON *output,
                           const dsq_usage_t *u)
{
    cJSON *o = cJSON_CreateObject(), *d;
    if (!o) {
        cJSON_Delete(output);
        return NULL;
    }
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)m->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddNullToObject(o, "error");
    if (!strcmp(status, "incomplete") && (d = cJSON_AddObjectToObject(o, "incomplete_details")))
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON_AddItemToObject(o, "output", output ? output : cJSON_CreateArray());
    for (const cJSON *e = m->echo ? m->echo->child : NULL; e; e = e->next)
        cJSON_AddItemToObject(o, e->string, cJSON_Duplicate(e, true));
    cJSON_AddFalseToObject(o, "store");
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddStringToObject(o, "truncation", "disabled");
    cJSON_AddFalseToObject(o, "background");
    if (u)
        cJSON_AddItemToObject(o, "usage", usage_obj(u));
    else
        cJSON_AddNullToObject(o, "usage");
    return o;
}

/* A message (reasoning false) or reasoning item; text NULL: no content
 * part yet (the added event). */
static cJSON *text_item(bool reasoning, const char *id, const char *status, const char *text,
                        size_t n)
{
    cJSON *it = cJSON_CreateObject(), *content, *p;
    if (!it)
        return NULL;
    cJSON_AddStringToObject(it, "type", reasoning ? "reasoning" : "message");
    cJSON_AddStringToObject(it, "id", id);
    if (reasoning) {
        cJSON_AddArrayToObject(it, "summary");
    } else {
        cJSON_AddStringToObject(it, "status", status);
        cJSON_AddStringToObject(it, "role", "assistant");
    }
    content = cJSON_AddArrayToObject(it, "content");
    if (text && (p = cJSON_CreateObject())) {
        cJSON_AddItemToArray(content, p);
        cJSON_AddStringToObject(p, "type", reasoning ? "reasoning_text" : "output_text");
        cJSON_AddItemToObject(p, "text", dsq__json_clean_string(text, n));
        if (!reasoning) {
            cJSON_AddArrayToObject(p, "annotations");
            cJSON_AddArrayToObject(p, "logprobs");
        }
    }
    return it;
}

static cJSON *call_item(const dsq_tool_call_out_t *c, const char *item_id, const char *status,
                        bool empty)
{
    cJSON *it = cJSON_CreateObject();
    if (!it)
        return NULL;
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "id", item_id);
    cJSON_AddStringToObject(it, "call_id", c->id);
    cJSON_AddStringToObject(it, "name", c->name);
    cJSON_AddStringToObject(it, "arguments", empty || !c->arguments ? "" : c->arguments);
    cJSON_AddStringToObject(it, "status", status);
    return it;
}

/* "fc_" + the call id's hex: the item id follows from the call */
static void call_item_id(const dsq_tool_call_out_t *c, char *buf, size_t len)
{
    const char *h = strchr(c->id, '_');
    snprintf(buf, len, "fc_%s", h ? h + 1 : c->id);
}

char *dsq_responses_body(const dsq_responses_meta_t *m, const dsq_chat_choice_out_t *ch,
                         const dsq_usage_t *usage)
{
    cJSON *out = cJSON_CreateArray(), *o;
    char id[48], *s;
    bool cut = ch->finish == DSQ_FINISH_LENGTH;
    if (!out)
        return NULL;
    if (ch->reasoning && !dsq_openai_new_id(id, sizeof(id), "rs_"))
        cJSON_AddItemToArray(out, text_item(true, id, NULL, ch->reasoning, ch->reasoning_len));
    /* a message item when there is text, or when there would be no item */
    if ((ch->content_len || (!ch->n_tool_calls && !ch->reasoning)) &&
        !dsq_openai_new_id(id, sizeof(id), "msg_"))
        cJSON_AddItemToArray(out, text_item(false, id, cut ? "incomplete" : "completed",
                                            ch->content ? ch->content : "", ch->content_len));
    for (int k = 0; k < ch->n_tool_calls; k++) {
        call_item_id(&ch->tool_calls[k], id, sizeof(id));
        cJSON_AddItemToArray(out, call_item(&ch->tool_calls[k], id, "completed", false));
    }
    o = response_obj(m, cut ? "incomplete" : "completed", out, usage);
    s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

void dsq_responses_stream_free(dsq_responses_stream_t *st)
{
    free(st->text);
    cJSON_Delete(st->output);
    memset(st, 0, sizeof(*st));
}

/* A new event object of type t with the stream's next sequence_number. */
static cJSON *event(dsq_responses_stream_t *st, const char *t)
{
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddStringToObject(o, "type", t);
        cJSON_AddNumberToObject(o, "sequence_number", st->seq++);
    }
    return o;
}

static int n_done(const dsq_responses_stream_t *st)
{
    return st->output ? cJSON_GetArraySize(st->output) : 0;
}

static cJSON *item_event(dsq_responses_stream_t *st, const char *t, cJSON *item)
{
    cJSON *o = event(st, t);
    if (o) {
        cJSON_AddNumberToObject(o, "output_index", n_done(st));
        cJSON_AddItemToObject(o, "item", item);
    } else {
        cJSON_Delete(item);
    }
    return o;
}

/* An event about the open item's content part 0. */
static cJSON *part_event(dsq_responses_stream_t *st, const char *t)
{
    cJSON *o = event(st, t);
    if (o) {
        cJSON_AddStringToObject(o, "item_id", st->item_id);
        cJSON_AddNumberToObject(o, "output_index", n_done(st));
        cJSON_AddNumberToObject(o, "content_index", 0);
    }
    return o;
}

/* response.output_item.done for item (taken), which then joins
 * st->output. */
static void item_done(dsq_sse_buf_t *b, dsq_responses_stream_t *st, cJSON *item)
{
    dsq__sse_typed_event(b, item_event(st, "response.output_item.done",
                                       cJSON_Duplicate(item, true)));
    if (!st->output)
        st->output = cJSON_CreateArray();
    if (st->output && item)
        cJSON_AddItemToArray(st->output, item);
    else
        cJSON_Delete(item);
}

/* Close the open item: its text's done events, then item done (a
 * message item with status, "completed" or "incomplete"). */
static void close_item(dsq_sse_buf_t *b, dsq_responses_stream_t *st, const char *status)
{
    bool r = st->open == DSQ_RESPONSES_ITEM_REASONING;
    cJSON *o, *p;
    if (st->open == DSQ_RESPONSES_ITEM_NONE)
        return;
    o = part_event(st, r ? "response.reasoning_text.done" : "response.output_text.done");
    if (o) {
        cJSON_AddItemToObject(o, "text", dsq__json_clean_string(st->text, st->text_len));
        if (!r)
            cJSON_AddArrayToObject(o, "logprobs");
    }
    dsq__sse_typed_event(b, o);
    if (!r) {
        o = part_event(st, "response.content_part.done");
        if (o && (p = cJSON_AddObjectToObject(o, "part"))) {
            cJSON_AddStringToObject(p, "type", "output_text");
            cJSON_AddItemToObject(p, "text", dsq__json_clean_string(st->text, st->text_len));
            cJSON_AddArrayToObject(p, "annotations");
            cJSON_AddArrayToObject(p, "logprobs");
        }
        dsq__sse_typed_event(b, o);
    }
    item_done(b, st, text_item(r, st->item_id, status, st->text ? st->text : "",
                               st->text_len));
    free(st->text);
    st->text = NULL;
    st->text_len = 0;
    st->open = DSQ_RESPONSES_ITEM_NONE;
}

char *dsq_responses_ev_start(dsq_responses_stream_t *st, const dsq_responses_meta_t *m)
{
    dsq_sse_buf_t b = {0};
    cJSON *o = event(st, "response.created");
    if (o)
        cJSON_AddItemToObject(o, "response", response_obj(m, "in_progress", NULL, NULL));
    dsq__sse_typed_event(&b, o);
    if ((o = event(st, "response.in_progress")))
        cJSON_AddItemToObject(o, "response", response_obj(m, "in_progress", NULL, NULL));
    dsq__sse_typed_event(&b, o);
    return dsq__sse_buf_done(&b);
}

/* A new item of the kind asked (its added events); none may be open. */
static void open_item(dsq_sse_buf_t *b, dsq_responses_stream_t *st, bool reasoning)
{
    cJSON *o, *p;
    if (dsq_openai_new_id(st->item_id, sizeof(st->item_id), reasoning ? "rs_" : "msg_"))
        b->fail = true;
    dsq__sse_typed_event(b, item_event(st, "response.output_item.added",
                                       text_item(reasoning, st->item_id, "in_progress", NULL,
                                                 0)));
    if (!reasoning) {
        o = part_event(st, "response.content_part.added");
        if (o && (p = cJSON_AddObjectToObject(o, "part"))) {
            cJSON_AddStringToObject(p, "type", "output_text");
            cJSON_AddStringToObject(p, "text", "");
            cJSON_AddArrayToObject(p, "annotations");
            cJSON_AddArrayToObject(p, "logprobs");
        }
        dsq__sse_typed_event(b, o);
    }
    st->open = reasoning ? DSQ_RESPONSES_ITEM_REASONING : DSQ_RESPONSES_ITEM_MESSAGE;
}

char *dsq_responses_ev_text(dsq_responses_stream_t *st, bool reasoning, const char *s,
                            size_t n)
{
    int want = reasoning ? DSQ_RESPONSES_ITEM_REASONING : DSQ_RESPONSES_ITEM_MESSAGE;
    dsq_sse_buf_t b = {0};
    cJSON *o;
    if (!n)
        return strdup("");
    if (st->open != want) {
        close_item(&b, st, "completed");
        open_item(&b, st, reasoning);
    }
    o = part_event(st, reasoning ? "response.reasoning_text.delta" : "response.output_text.delta");
    if (o) {
        cJSON_AddItemToObject(o, "delta", dsq__json_clean_string(s, n));
        if (!reasoning)
            cJSON_AddArrayToObject(o, "logprobs");
    }
    dsq__sse_typed_event(&b, o);
    /* the raw bytes: a character cut between deltas is whole in the
     * done events */
    char *t = realloc(st->text, st->text_len + n + 1);
    if (t) {
        memcpy(t + st->text_len, s, n);
        st->text_len += n;
        t[st->text_len] = '\0';
        st->text = t;
    } else {
        b.fail = true;
    }
    return dsq__sse_buf_done(&b);
}

char *dsq_responses_ev_calls(dsq_responses_stream_t *st, const dsq_tool_call_out_t *calls,
                             int n)
{
    dsq_sse_buf_t b = {0};
    char id[48];
    close_item(&b, st, "completed");
    for (int k = 0; k < n; k++) {
        cJSON *o;
        call_item_id(&calls[k], id, sizeof(id));
        dsq__sse_typed_event(&b, item_event(st, "response.output_item.added",
                                            call_item(&calls[k], id, "in_progress", true)));
        if ((o = event(st, "response.function_call_arguments.delta"))) {
            cJSON_AddStringToObject(o, "item_id", id);
            cJSON_AddNumberToObject(o, "output_index", n_done(st));
            cJSON_AddStringToObject(o, "delta", calls[k].arguments ? calls[k].arguments : "");
        }
        dsq__sse_typed_event(&b, o);
        if ((o = event(st, "response.function_call_arguments.done"))) {
            cJSON_AddStringToObject(o, "item_id", id);
            cJSON_AddNumberToObject(o, "output_index", n_done(st));
            cJSON_AddStringToObject(o, "name", calls[k].name);
            cJSON_AddStringToObject(o, "arguments", calls[k].arguments ? calls[k].arguments : "");
        }
        dsq__sse_typed_event(&b, o);
        item_done(&b, st, call_item(&calls[k], id, "completed", false));
    }
    return dsq__sse_buf_done(&b);
}

char *dsq_responses_ev_end(dsq_responses_stream_t *st, const dsq_responses_meta_t *m,
                           dsq_finish_t finish, const dsq_usage_t *usage)
{
    dsq_sse_buf_t b = {0};
    bool cut = finish == DSQ_FINISH_LENGTH;
    cJSON *o;
    /* an answer with no item at all is one empty message, as unstreamed */
    if (!n_done(st) && st->open == DSQ_RESPONSES_ITEM_NONE)
        open_item(&b, st, false);
    close_item(&b, st, st->open == DSQ_RESPONSES_ITEM_MESSAGE && cut ? "incomplete"
                                                                    : "completed");
    o = event(st, cut ? "response.incomplete" : "response.completed");
    if (o)
        cJSON_AddItemToObject(o, "response",
                              response_obj(m, cut ? "incomplete" : "completed",
                                           st->output ? cJSON_Duplicate(st->output, true)
                                                      : NULL,
                                           usage));
    dsq__sse_typed_event(&b, o);
    return dsq__sse_buf_done(&b);
}

char *dsq_responses_ev_error(dsq_responses_stream_t *st, dsq_apierr_t kind,
                             const char *message)
{
    dsq_sse_buf_t b = {0};
    cJSON *o = event(st, "error");
    if (o) {
        const char *code = dsq_apierr_code(kind);
        if (code)
            cJSON_AddStringToObject(o, "code", code);
        else
            cJSON_AddNullToObject(o, "code");
        cJSON_AddStringToObject(o, "message", message ? message : "");
        cJSON_AddNullToObject(o, "param");
    }
    dsq__sse_typed_event(&b, o);
    return dsq__sse_buf_done(&b);
}

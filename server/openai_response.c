/* Engine output -> OpenAI response JSON: text_completion and
 * chat.completion bodies, their SSE chunks, logprobs in both formats,
 * usage, ids and finish reasons. Pure functions over cJSON, like the
 * parser (openai.c). Completion text, reasoning and token strings pass
 * through dsq_openai_utf8_clean first: a token may end inside a UTF-8
 * sequence, and the JSON must stay valid UTF-8 whatever the model
 * produced. */
#include "server/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "engine/common/error.h"
#include "server/openai_internal.h"

/* ------------------------------------------------------------ output */

int dsq_openai_new_id(char *buf, size_t len, const char *prefix)
{
    unsigned char raw[16];
    size_t pl = strlen(prefix);
    if (len < pl + 33 || RAND_bytes(raw, sizeof(raw)) != 1)
        return DSQ_EIO;
    memcpy(buf, prefix, pl);
    for (int i = 0; i < 16; i++)
        snprintf(buf + pl + 2 * i, 3, "%02x", raw[i]);
    return DSQ_OK;
}

const char *dsq_openai_finish_reason(dsq_finish_t f)
{
    switch (f) {
    case DSQ_FINISH_STOP: return "stop";
    case DSQ_FINISH_LENGTH: return "length";
    case DSQ_FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

/* Length of the UTF-8 sequence at s (1..4) with *ok telling whether it is
 * valid (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). An invalid
 * one has the length of its maximal valid prefix (at least 1), so it
 * becomes one U+FFFD, as the Unicode standard (sec. 3.9, "maximal subpart")
 * and Python's errors="replace" do. */
size_t dsq__openai_utf8_seq(const unsigned char *s, size_t n, bool *ok)
{
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t len, k = 1;
    *ok = false;
    if (c < 0x80) {
        *ok = true;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3;
    else if (c >= 0xF0 && c <= 0xF4) len = 4;
    else return 1;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (n > 1 && s[1] >= lo && s[1] <= hi) {
        k = 2;
        while (k < len && k < n && (s[k] & 0xC0) == 0x80)
            k++;
    }
    *ok = k == len;
    return k;
}

char *dsq_openai_utf8_clean(const char *s, size_t len, size_t *out_len)
{
    char *out = malloc(len * 3 + 1);
    size_t o = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len;) {
        bool ok;
        size_t k = dsq__openai_utf8_seq((const unsigned char *)s + i, len - i, &ok);
        if (!ok) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        } else if (!(k == 1 && s[i] == '\0')) {   /* drop NULs */
            memcpy(out + o, s + i, k);
            o += k;
        }
        i += k;
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}

cJSON *dsq__json_clean_string(const char *s, size_t len)
{
    char *c = dsq_openai_utf8_clean(s ? s : "", s ? len : 0, NULL);
    cJSON *j = c ? cJSON_CreateString(c) : NULL;
    free(c);
    return j;
}

cJSON *dsq_openai_logprobs_new(void)
{
    cJSON *lp = cJSON_CreateObject();
    if (lp && (!cJSON_AddArrayToObject(lp, "tokens") ||
               !cJSON_AddArrayToObject(lp, "token_logprobs") ||
               !cJSON_AddArrayToObject(lp, "top_logprobs") ||
               !cJSON_AddArrayToObject(lp, "text_offset"))) {
        cJSON_Delete(lp);
        lp = NULL;
    }
    return lp;
}

static cJSON *token_string(int32_t id, dsq_token_text_fn fn, void *u)
{
    size_t len = 0;
    const char *s = fn ? fn(u, id, &len) : NULL;
    return dsq__json_clean_string(s, s ? len : 0);
}

int dsq_openai_logprobs_add(cJSON *lp, const dsq_output_t *o,
                            size_t offset_base, dsq_token_text_fn fn, void *u)
{
    cJSON *tokens = cJSON_GetObjectItem(lp, "tokens");
    cJSON *lps = cJSON_GetObjectItem(lp, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs");
    cJSON *offs = cJSON_GetObjectItem(lp, "text_offset");
    if (!tokens || !lps || !tops || !offs)
        return DSQ_EINVAL;
    for (int i = 0; i < o->n_tokens; i++) {
        int32_t id = o->tokens[i];
        cJSON *top = cJSON_CreateObject();
        bool seen = false;
        double lpv = o->logprobs ? o->logprobs[i] : 0.0;
        if (!top)
            return DSQ_ENOMEM;
        cJSON_AddItemToArray(tokens, token_string(id, fn, u));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lpv));
        for (int k = 0; o->top && k < o->n_top; k++) {
            const dsq_top_logprob_t *t = &o->top[(size_t)i * (size_t)o->n_top + (size_t)k];
            cJSON *ts = token_string(t->token, fn, u);
            if (!ts)
                continue;
            if (!cJSON_GetObjectItemCaseSensitive(top, ts->valuestring))
                cJSON_AddNumberToObject(top, ts->valuestring, t->logprob);
            if (t->token == id)
                seen = true;
            cJSON_Delete(ts);
        }
        if (!seen) {
            cJSON *ts = token_string(id, fn, u);
            if (ts && !cJSON_GetObjectItemCaseSensitive(top, ts->valuestring))
                cJSON_AddNumberToObject(top, ts->valuestring, lpv);
            cJSON_Delete(ts);
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(
            (double)(offset_base + (o->token_text_offset ? o->token_text_offset[i] : 0))));
    }
    return DSQ_OK;
}

int dsq_openai_logprobs_add_prompt(cJSON *lp, const int32_t *ids, int n_ids,
                                   const dsq_output_t *o,
                                   dsq_token_text_fn fn, void *u,
                                   size_t *text_len)
{
    cJSON *tokens = cJSON_GetObjectItem(lp, "tokens");
    cJSON *lps = cJSON_GetObjectItem(lp, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs");
    cJSON *offs = cJSON_GetObjectItem(lp, "text_offset");
    size_t off = 0;
    if (!tokens || !lps || !tops || !offs || !o || n_ids < 0)
        return DSQ_EINVAL;
    for (int i = 0; i < n_ids; i++) {
        size_t len = 0;
        const char *t = fn ? fn(u, ids[i], &len) : NULL;
        cJSON *ts = dsq__json_clean_string(t, t ? len : 0);
        bool have = i > 0 && i <= o->n_prompt_logprobs && o->prompt_logprobs;
        cJSON *top = have ? cJSON_CreateObject() : cJSON_CreateNull();
        cJSON *lv = have ? cJSON_CreateNumber(o->prompt_logprobs[i - 1])
                         : cJSON_CreateNull();
        cJSON *ov = cJSON_CreateNumber((double)off);
        if (!ts || !top || !lv || !ov) {
            cJSON_Delete(ts);
            cJSON_Delete(top);
            cJSON_Delete(lv);
            cJSON_Delete(ov);
            return DSQ_ENOMEM;
        }
        if (have) {
            for (int k = 0; o->prompt_top && k < o->n_top; k++) {
                const dsq_top_logprob_t *a =
                    &o->prompt_top[(size_t)(i - 1) * (size_t)o->n_top + (size_t)k];
                cJSON *as = token_string(a->token, fn, u);
                if (as && !cJSON_GetObjectItemCaseSensitive(top, as->valuestring))
                    cJSON_AddNumberToObject(top, as->valuestring, a->logprob);
                cJSON_Delete(as);
            }
            if (!cJSON_GetObjectItemCaseSensitive(top, ts->valuestring))
                cJSON_AddNumberToObject(top, ts->valuestring, o->prompt_logprobs[i - 1]);
        }
        cJSON_AddItemToArray(tokens, ts);
        cJSON_AddItemToArray(lps, lv);
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, ov);
        off += t ? len : 0;
    }
    if (text_len)
        *text_len = off;
    return DSQ_OK;
}

static void add_usage(cJSON *obj, const dsq_usage_t *u)
{
    cJSON *us = cJSON_AddObjectToObject(obj, "usage");
    if (!us)
        return;
    cJSON_AddNumberToObject(us, "prompt_tokens", (double)u->prompt_tokens);
    cJSON_AddNumberToObject(us, "completion_tokens", (double)u->completion_tokens);
    cJSON_AddNumberToObject(us, "total_tokens",
                            (double)(u->prompt_tokens + u->completion_tokens));
    if (u->has_cached) {
        cJSON *d = cJSON_AddObjectToObject(us, "prompt_tokens_details");
        if (d)
            cJSON_AddNumberToObject(d, "cached_tokens", (double)u->cached_tokens);
    }
    if (u->has_reasoning) {
        cJSON *d = cJSON_AddObjectToObject(us, "completion_tokens_details");
        if (d)
            cJSON_AddNumberToObject(d, "reasoning_tokens", (double)u->reasoning_tokens);
    }
}

static cJSON *head_of(const char *id, int64_t created, const char *model,
                      const char *object)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

static cJSON *head(const char *id, int64_t created, const char *model)
{
    return head_of(id, created, model, "text_completion");
}

static cJSON *choice(int index, const char *text, size_t len, cJSON *lp,
                     dsq_finish_t f)
{
    cJSON *c = cJSON_CreateObject();
    const char *fr = dsq_openai_finish_reason(f);
    if (!c)
        return NULL;
    cJSON_AddNumberToObject(c, "index", index);
    cJSON_AddItemToObject(c, "text", dsq__json_clean_string(text, len));
    if (lp)
        cJSON_AddItemToObject(c, "logprobs", cJSON_Duplicate(lp, true));
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (fr)
        cJSON_AddStringToObject(c, "finish_reason", fr);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

char *dsq_openai_completion_body(const char *id, int64_t created,
                                 const char *model,
                                 const dsq_choice_out_t *choices,
                                 int n_choices, const dsq_usage_t *usage)
{
    char *out = NULL;
    cJSON *o = head(id, created, model), *arr;
    if (!o)
        return NULL;
    arr = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; arr && i < n_choices; i++)
        cJSON_AddItemToArray(arr, choice(choices[i].index, choices[i].text,
                                         choices[i].text_len,
                                         choices[i].logprobs,
                                         choices[i].finish));
    add_usage(o, usage);
    out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

bool dsq__text_join(char **s, size_t *n, const char *sep, const char *t)
{
    size_t sl = *n ? strlen(sep) : 0, tl = strlen(t);
    char *q = realloc(*s, *n + sl + tl + 1);
    if (!q) {
        free(*s);
        *s = NULL;
        return false;
    }
    memcpy(q + *n, sep, sl);
    memcpy(q + *n + sl, t, tl + 1);
    *s = q;
    *n += sl + tl;
    return true;
}

void dsq__sse_typed_event(dsq_sse_buf_t *b, cJSON *o)
{
    char *json = o ? cJSON_PrintUnformatted(o) : NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    char *e = NULL;
    int n = -1;
    if (json && cJSON_IsString(t))
        n = asprintf(&e, "event: %s\ndata: %s\n\n", t->valuestring, json);
    if (n < 0) {
        b->fail = true;
    } else {
        char *q = realloc(b->s, b->n + (size_t)n + 1);
        if (q) {
            memcpy(q + b->n, e, (size_t)n + 1);
            b->s = q;
            b->n += (size_t)n;
        } else {
            b->fail = true;
        }
        free(e);
    }
    free(json);
    cJSON_Delete(o);
}

char *dsq__sse_buf_done(dsq_sse_buf_t *b)
{
    if (b->fail) {
        free(b->s);
        return NULL;
    }
    return b->s ? b->s : strdup("");
}

static char *sse(cJSON *o)
{
    char *json = cJSON_PrintUnformatted(o), *out = NULL;
    if (json && asprintf(&out, "data: %s\n\n", json) < 0)
        out = NULL;
    free(json);
    cJSON_Delete(o);
    return out;
}

char *dsq_openai_chunk(const char *id, int64_t created, const char *model,
                       int index, const char *text, size_t text_len,
                       cJSON *logprobs, dsq_finish_t finish, bool usage_null)
{
    cJSON *o = head(id, created, model), *arr;
    if (!o)
        return NULL;
    arr = cJSON_AddArrayToObject(o, "choices");
    if (arr)
        cJSON_AddItemToArray(arr, choice(index, text, text_len, logprobs, finish));
    if (usage_null)
        cJSON_AddNullToObject(o, "usage");
    return sse(o);
}

char *dsq_openai_usage_chunk(const char *id, int64_t created,
                             const char *model, const dsq_usage_t *usage)
{
    cJSON *o = head(id, created, model);
    if (!o)
        return NULL;
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, usage);
    return sse(o);
}

/* ------------------------------------------------------------ chat output */

cJSON *dsq_openai_chat_logprobs_new(void)
{
    cJSON *lp = cJSON_CreateObject();
    if (lp && !cJSON_AddArrayToObject(lp, "content")) {
        cJSON_Delete(lp);
        lp = NULL;
    }
    return lp;
}

/* {token, logprob, bytes} of one token id; NULL on ENOMEM. */
static cJSON *chat_token(int32_t id, double logprob, dsq_token_text_fn fn,
                         void *u)
{
    size_t len = 0;
    const char *s = fn ? fn(u, id, &len) : NULL;
    cJSON *t = cJSON_CreateObject(), *bytes;
    if (!t)
        return NULL;
    cJSON_AddItemToObject(t, "token", dsq__json_clean_string(s, s ? len : 0));
    cJSON_AddNumberToObject(t, "logprob", logprob);
    bytes = cJSON_AddArrayToObject(t, "bytes");
    for (size_t i = 0; bytes && s && i < len; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)s[i]));
    return t;
}

int dsq_openai_chat_logprobs_add(cJSON *lp, const dsq_output_t *o,
                                 dsq_token_text_fn fn, void *u)
{
    cJSON *content = cJSON_GetObjectItem(lp, "content");
    if (!cJSON_IsArray(content))
        return DSQ_EINVAL;
    for (int i = 0; i < o->n_tokens; i++) {
        cJSON *t = chat_token(o->tokens[i], o->logprobs ? o->logprobs[i] : 0.0,
                              fn, u);
        cJSON *tops;
        if (!t)
            return DSQ_ENOMEM;
        cJSON_AddItemToArray(content, t);
        tops = cJSON_AddArrayToObject(t, "top_logprobs");
        for (int k = 0; tops && o->top && k < o->n_top; k++) {
            const dsq_top_logprob_t *a =
                &o->top[(size_t)i * (size_t)o->n_top + (size_t)k];
            cJSON_AddItemToArray(tops, chat_token(a->token, a->logprob, fn, u));
        }
    }
    return DSQ_OK;
}

/* A chat.completion.chunk with one choice {index} in *choice; NULL (and
 * nothing owned) on ENOMEM. */
static cJSON *chunk_of(const char *id, int64_t created, const char *model, int index,
                       cJSON **choice)
{
    cJSON *o = head_of(id, created, model, "chat.completion.chunk"), *arr, *c;
    if (!o)
        return NULL;
    arr = cJSON_AddArrayToObject(o, "choices");
    c = cJSON_CreateObject();
    if (!arr || !c) {
        cJSON_Delete(c);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToArray(arr, c);
    cJSON_AddNumberToObject(c, "index", index);
    *choice = c;
    return o;
}

static cJSON *tool_calls_json(const dsq_tool_call_out_t *calls, int n, int first, bool stream)
{
    cJSON *arr = cJSON_CreateArray();
    for (int k = 0; arr && k < n; k++) {
        cJSON *t = cJSON_CreateObject(), *f;
        if (!t)
            break;
        cJSON_AddItemToArray(arr, t);
        if (stream)
            cJSON_AddNumberToObject(t, "index", first + k);
        cJSON_AddStringToObject(t, "id", calls[k].id);
        cJSON_AddStringToObject(t, "type", "function");
        f = cJSON_AddObjectToObject(t, "function");
        if (f) {
            cJSON_AddStringToObject(f, "name", calls[k].name);
            cJSON_AddStringToObject(f, "arguments", calls[k].arguments);
        }
    }
    return arr;
}

static cJSON *chat_choice(const dsq_chat_choice_out_t *c)
{
    cJSON *o = cJSON_CreateObject(), *m;
    const char *fr = c->n_tool_calls > 0 && c->finish == DSQ_FINISH_STOP
                         ? "tool_calls" : dsq_openai_finish_reason(c->finish);
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "index", c->index);
    m = cJSON_AddObjectToObject(o, "message");
    if (m) {
        cJSON_AddStringToObject(m, "role", "assistant");
        if (c->n_tool_calls > 0 && c->content_len == 0)
            cJSON_AddNullToObject(m, "content");
        else
            cJSON_AddItemToObject(m, "content",
                                  dsq__json_clean_string(c->content, c->content_len));
        if (c->reasoning)
            cJSON_AddItemToObject(m, "reasoning_content",
                                  dsq__json_clean_string(c->reasoning, c->reasoning_len));
        if (c->n_tool_calls > 0)
            cJSON_AddItemToObject(m, "tool_calls",
                                  tool_calls_json(c->tool_calls, c->n_tool_calls, 0, false));
    }
    if (c->logprobs)
        cJSON_AddItemToObject(o, "logprobs", cJSON_Duplicate(c->logprobs, true));
    else
        cJSON_AddNullToObject(o, "logprobs");
    if (fr)
        cJSON_AddStringToObject(o, "finish_reason", fr);
    else
        cJSON_AddNullToObject(o, "finish_reason");
    return o;
}

char *dsq_openai_chat_tool_chunk(const char *id, int64_t created, const char *model,
                                 int index, const dsq_tool_call_out_t *calls, int n,
                                 int first, bool usage_null)
{
    cJSON *c = NULL, *d, *o = chunk_of(id, created, model, index, &c);
    if (!o)
        return NULL;
    d = cJSON_AddObjectToObject(c, "delta");
    if (d)
        cJSON_AddItemToObject(d, "tool_calls", tool_calls_json(calls, n, first, true));
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    if (usage_null)
        cJSON_AddNullToObject(o, "usage");
    return sse(o);
}

char *dsq_openai_chat_tool_finish_chunk(const char *id, int64_t created, const char *model,
                                        int index, bool usage_null)
{
    cJSON *c = NULL, *o = chunk_of(id, created, model, index, &c);
    if (!o)
        return NULL;
    cJSON_AddObjectToObject(c, "delta");
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", "tool_calls");
    if (usage_null)
        cJSON_AddNullToObject(o, "usage");
    return sse(o);
}

char *dsq_openai_chat_body(const char *id, int64_t created, const char *model,
                           const dsq_chat_choice_out_t *choices,
                           int n_choices, const dsq_usage_t *usage)
{
    char *out = NULL;
    cJSON *o = head_of(id, created, model, "chat.completion"), *arr;
    if (!o)
        return NULL;
    arr = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; arr && i < n_choices; i++)
        cJSON_AddItemToArray(arr, chat_choice(&choices[i]));
    add_usage(o, usage);
    out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

char *dsq_openai_chat_chunk(const char *id, int64_t created, const char *model,
                            int index, const char *role, const char *content,
                            size_t content_len, const char *reasoning,
                            size_t reasoning_len, cJSON *logprobs,
                            dsq_finish_t finish, bool usage_null)
{
    cJSON *c = NULL, *d, *o = chunk_of(id, created, model, index, &c);
    const char *fr = dsq_openai_finish_reason(finish);
    if (!o)
        return NULL;
    d = cJSON_AddObjectToObject(c, "delta");
    if (d && role)
        cJSON_AddStringToObject(d, "role", role);
    if (d && content)
        cJSON_AddItemToObject(d, "content", dsq__json_clean_string(content, content_len));
    if (d && reasoning)
        cJSON_AddItemToObject(d, "reasoning_content",
                              dsq__json_clean_string(reasoning, reasoning_len));
    if (logprobs)
        cJSON_AddItemToObject(c, "logprobs", cJSON_Duplicate(logprobs, true));
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (fr)
        cJSON_AddStringToObject(c, "finish_reason", fr);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (usage_null)
        cJSON_AddNullToObject(o, "usage");
    return sse(o);
}

char *dsq_openai_chat_usage_chunk(const char *id, int64_t created,
                                  const char *model, const dsq_usage_t *usage)
{
    cJSON *o = head_of(id, created, model, "chat.completion.chunk");
    if (!o)
        return NULL;
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, usage);
    return sse(o);
}

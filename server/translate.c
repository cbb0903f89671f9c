/* What the translating front ends (server/anthropic.c, server/responses.c)
 * share when they build the chat request an Anthropic or Responses body
 * means: text parts joined into one string, a chat message appended
 * (server/openai.h declares them). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/openai.h"

char *dsq__text_parts(const cJSON *c, const char *const *types, int n_types,
                      const char *param, const char *where, dsq_api_error_t *err)
{
    const cJSON *p;
    char *s;
    size_t n = 0;
    int j = 0;
    if (cJSON_IsString(c)) {
        if (!(s = strdup(c->valuestring)))
            dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        return s;
    }
    if (!cJSON_IsArray(c)) {
        dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                          "%s must be a string or an array of %s parts, got %s", where,
                          types[0], dsq__json_type_name(c));
        return NULL;
    }
    if (!(s = calloc(1, 1))) {
        dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        return NULL;
    }
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        bool known = false;
        for (int k = 0; cJSON_IsString(t) && k < n_types; k++)
            known = known || !strcmp(t->valuestring, types[k]);
        if (!cJSON_IsObject(p) || !known || !cJSON_IsString(tx)) {
            bool other = cJSON_IsObject(p) && cJSON_IsString(t) && !known;
            dsq_api_error_set(err, other ? DSQ_APIERR_UNSUPPORTED : DSQ_APIERR_INVALID_REQUEST,
                              param, other ? "%s[%d]: type '%.40s' is not supported here "
                                             "(%s%s)"
                                           : "%s[%d] must be {\"type\": \"%.0s%s\", \"text\": "
                                             "string}%.0s",
                              where, j, other ? t->valuestring : "", types[0],
                              n_types > 1 ? ", ..." : "");
            free(s);
            return NULL;
        }
        if (!dsq__text_join(&s, &n, "\n", tx->valuestring)) {
            dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
            return NULL;
        }
        j++;
    }
    return s;
}

cJSON *dsq__chat_message_add(cJSON *msgs, const char *role, const char *text)
{
    cJSON *m = cJSON_CreateObject();
    if (!m)
        return NULL;
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(m, "role", role);
    if (text)
        cJSON_AddStringToObject(m, "content", text);
    else
        cJSON_AddNullToObject(m, "content");
    return m;
}

cJSON *dsq__chat_tool_call_add(cJSON *calls, const char *id, const char *name,
                               const char *arguments)
{
    cJSON *c = cJSON_CreateObject(), *fn;
    if (!c)
        return NULL;
    cJSON_AddItemToArray(calls, c);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", arguments);
    return c;
}

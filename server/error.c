/* The one table from error kinds to HTTP status, OpenAI `type` and `code`,
 * and the builder of the nested OpenAI error object. Types follow the
 * OpenAI API's error types (invalid_request_error, authentication_error,
 * ...); statuses follow the OpenAI/vLLM servers. */
#include "server/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/common/error.h"

static const struct {
    int status;
    const char *type;
    const char *code;
} table[DSQ_APIERR_COUNT_] = {
    [DSQ_APIERR_INVALID_REQUEST] = {400, "invalid_request_error", NULL},
    [DSQ_APIERR_CONTEXT_LENGTH] = {400, "invalid_request_error",
                                   "context_length_exceeded"},
    [DSQ_APIERR_MODEL_NOT_FOUND] = {404, "invalid_request_error",
                                    "model_not_found"},
    [DSQ_APIERR_UNSUPPORTED] = {400, "invalid_request_error",
                                "unsupported_parameter"},
    [DSQ_APIERR_AUTH] = {401, "authentication_error", "invalid_api_key"},
    [DSQ_APIERR_FORBIDDEN] = {403, "permission_error", "origin_not_allowed"},
    [DSQ_APIERR_NOT_FOUND] = {404, "invalid_request_error", "not_found"},
    [DSQ_APIERR_METHOD] = {405, "invalid_request_error", "method_not_allowed"},
    [DSQ_APIERR_TIMEOUT] = {408, "timeout_error", "request_timeout"},
    [DSQ_APIERR_TOO_LARGE] = {413, "invalid_request_error",
                              "request_too_large"},
    [DSQ_APIERR_MEDIA_TYPE] = {415, "invalid_request_error",
                               "unsupported_media_type"},
    [DSQ_APIERR_RATE_LIMIT] = {429, "rate_limit_error", "rate_limit_exceeded"},
    [DSQ_APIERR_INTERNAL] = {500, "internal_error", NULL},
    [DSQ_APIERR_UNAVAILABLE] = {503, "service_unavailable",
                                "service_unavailable"},
    [DSQ_APIERR_OVERLOADED] = {503, "service_unavailable", "queue_full"},
};

static int valid(dsq_apierr_t k)
{
    return (int)k >= 0 && k < DSQ_APIERR_COUNT_;
}

int dsq_api_error_set(dsq_api_error_t *e, dsq_apierr_t kind, const char *param,
                      const char *fmt, ...)
{
    va_list ap;
    e->kind = kind;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return DSQ_EINVAL;
}

int dsq_apierr_status(dsq_apierr_t kind)
{
    return valid(kind) ? table[kind].status : 500;
}

const char *dsq_apierr_type(dsq_apierr_t kind)
{
    return valid(kind) ? table[kind].type : "internal_error";
}

const char *dsq_apierr_code(dsq_apierr_t kind)
{
    return valid(kind) ? table[kind].code : NULL;
}

dsq_apierr_t dsq_apierr_from_code(int dsq_err)
{
    switch (dsq_err) {
    case DSQ_EINVAL: return DSQ_APIERR_INVALID_REQUEST;
    case DSQ_ERANGE: return DSQ_APIERR_CONTEXT_LENGTH;
    case DSQ_EFULL: return DSQ_APIERR_OVERLOADED;
    case DSQ_ESTATE: return DSQ_APIERR_UNAVAILABLE;
    case DSQ_ENOTFOUND: return DSQ_APIERR_NOT_FOUND;
    case DSQ_EUNSUPPORTED: return DSQ_APIERR_UNSUPPORTED;
    case DSQ_ECANCELLED: return DSQ_APIERR_TIMEOUT;
    default: return DSQ_APIERR_INTERNAL;
    }
}

char *dsq_apierr_json(dsq_apierr_t kind, const char *message,
                      const char *param)
{
    char *out = NULL;
    const char *code = dsq_apierr_code(kind);
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    if (!err)
        goto done;
    cJSON_AddStringToObject(err, "message", message ? message : "");
    cJSON_AddStringToObject(err, "type", dsq_apierr_type(kind));
    if (param && param[0])
        cJSON_AddStringToObject(err, "param", param);
    else
        cJSON_AddNullToObject(err, "param");
    if (code)
        cJSON_AddStringToObject(err, "code", code);
    else
        cJSON_AddNullToObject(err, "code");
    out = cJSON_PrintUnformatted(root);
done:
    cJSON_Delete(root);
    return out;
}

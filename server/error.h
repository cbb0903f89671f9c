/* OpenAI-style error objects for the HTTP edge.
 *
 * This module is the only place that builds
 * {"error":{"message","type","param","code"}}. One table maps each error
 * kind to its HTTP status, OpenAI `type` and `code`; dsq_apierr_from_code()
 * maps the engine's DSQ_E* codes onto that table, so a status never gets
 * chosen ad hoc at a call site. Pure functions: no MHD, no engine state. */
#ifndef DSQ_SERVER_ERROR_H
#define DSQ_SERVER_ERROR_H

#include <stddef.h>

typedef enum dsq_apierr {
    DSQ_APIERR_INVALID_REQUEST = 0, /* 400 invalid_request_error           */
    DSQ_APIERR_CONTEXT_LENGTH,      /* 400, code context_length_exceeded   */
    DSQ_APIERR_MODEL_NOT_FOUND,     /* 400, code model_not_found           */
    DSQ_APIERR_UNSUPPORTED,         /* 400, code unsupported_parameter     */
    DSQ_APIERR_AUTH,                /* 401, code invalid_api_key           */
    DSQ_APIERR_FORBIDDEN,           /* 403, code origin_not_allowed: a
                                       browser's cross-site request        */
    DSQ_APIERR_NOT_FOUND,           /* 404 unknown route                   */
    DSQ_APIERR_METHOD,              /* 405 (caller adds Allow)             */
    DSQ_APIERR_TIMEOUT,             /* 408 request ran past its timeout    */
    DSQ_APIERR_TOO_LARGE,           /* 413 body above --max-request-bytes  */
    DSQ_APIERR_MEDIA_TYPE,          /* 415 POST body not application/json  */
    DSQ_APIERR_RATE_LIMIT,          /* 429 a per-client rate limit (none yet:
                                       OpenAI clients read 429 as "you send too
                                       much" and back off per client)       */
    DSQ_APIERR_INTERNAL,            /* 500 our bug or out of memory        */
    DSQ_APIERR_UNAVAILABLE,         /* 503 loading or draining             */
    DSQ_APIERR_OVERLOADED,          /* 503, code queue_full: the engine's
                                       queue is full or a request waited past
                                       --max-queue-wait (Retry-After)       */
    DSQ_APIERR_COUNT_
} dsq_apierr_t;

/* A validation failure: which kind, the offending request field (may be
 * empty, then JSON null) and a human-readable message. Caller-owned. */
typedef struct dsq_api_error {
    dsq_apierr_t kind;
    char param[64];
    char message[512];
} dsq_api_error_t;

/* Fill e with kind, param (NULL = none) and a printf-style message.
 * Always returns DSQ_EINVAL so validators can `return dsq_api_error_set(..)`. */
int dsq_api_error_set(dsq_api_error_t *e, dsq_apierr_t kind, const char *param,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* HTTP status of a kind (400..503). Unknown kinds give 500. */
int dsq_apierr_status(dsq_apierr_t kind);
/* OpenAI `type` string of a kind, e.g. "invalid_request_error". Static. */
const char *dsq_apierr_type(dsq_apierr_t kind);
/* OpenAI `code` string of a kind, or NULL for JSON null. Static. */
const char *dsq_apierr_code(dsq_apierr_t kind);

/* Kind for a negative DSQ_E* code (engine/common/error.h):
 * EINVAL -> INVALID_REQUEST, ERANGE -> CONTEXT_LENGTH, EFULL -> OVERLOADED,
 * ESTATE -> UNAVAILABLE, ENOTFOUND -> NOT_FOUND, EUNSUPPORTED -> UNSUPPORTED,
 * ECANCELLED -> TIMEOUT, anything else -> INTERNAL. */
dsq_apierr_t dsq_apierr_from_code(int dsq_err);

/* The JSON body {"error":{"message":..,"type":..,"param":..,"code":..}} as
 * a malloc'd NUL-terminated string (caller frees), or NULL on ENOMEM.
 * param NULL or "" gives "param": null. */
char *dsq_apierr_json(dsq_apierr_t kind, const char *message,
                      const char *param);

#endif

/* Request tracing: W3C Trace Context propagation and an
 * OpenTelemetry span exporter over OTLP/HTTP with JSON encoding.
 *
 * Sources:
 *  - W3C Trace Context, Recommendation 2021 (https://www.w3.org/TR/trace-context/):
 *    the traceparent / tracestate headers, their grammar and validity rules.
 *  - OpenTelemetry Protocol spec 1.x (opentelemetry-proto, docs/specification.md):
 *    OTLP/HTTP, POST of an ExportTraceServiceRequest to /v1/traces,
 *    Content-Type application/json, the JSON mapping of protobuf with
 *    trace and span ids as hex strings and enums as integers.
 *  - OpenTelemetry SDK configuration (specification/configuration/sdk-environment-variables.md
 *    and protocol/exporter.md): OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER,
 *    OTEL_EXPORTER_OTLP[_TRACES]_{ENDPOINT,HEADERS,TIMEOUT,PROTOCOL},
 *    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER[_ARG],
 *    OTEL_BSP_* (the batch span processor's queue, batch, delay, timeout).
 *
 * The exporter is a batch span processor: dsq_otlp_submit() only appends
 * to a bounded in-memory queue (a full queue drops the span and counts it,
 * never waits); one background thread sends batches with libcurl. So a
 * dead or slow collector costs requests nothing but their spans.
 *
 * Thread-safe: every function may be called from any thread, except
 * dsq_otlp_destroy (once, after the last submit). */
#ifndef DSQ_SERVER_TRACE_H
#define DSQ_SERVER_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "server/options.h"

/* "00-" 32 hex "-" 16 hex "-" 2 hex */
#define DSQ_TRACEPARENT_LEN 55
/* W3C Trace Context: tracestate carries at most 32 list members; we keep
 * a header of at most this many bytes and drop a longer one. */
#define DSQ_TRACESTATE_MAX 512

/* The trace context of one request. */
typedef struct dsq_trace_ctx {
    uint8_t trace_id[16];
    uint8_t parent_id[8];            /* the caller's span (has_parent)        */
    uint8_t span_id[8];              /* this request's server span            */
    uint8_t flags;                   /* trace-flags; bit 0: sampled           */
    bool has_parent;                 /* a valid traceparent came in           */
    char tracestate[DSQ_TRACESTATE_MAX + 1];  /* as received when valid, "" */
} dsq_trace_ctx_t;

/* Parse a traceparent header (W3C Trace Context 3.2): version 00 is
 * exactly "00-<32 hex>-<16 hex>-<2 hex>" in lowercase; a higher version
 * (not ff) may carry more after a '-'. All-zero trace or parent ids are
 * invalid. Returns 0 and fills the ids and flags, or DSQ_EINVAL (the
 * caller then starts a new trace, as the spec says). */
int dsq_trace_parse_traceparent(const char *s, uint8_t trace_id[16], uint8_t parent_id[8],
                                uint8_t *flags);
/* Whether s is a tracestate header we pass on (W3C 3.3): at most
 * DSQ_TRACESTATE_MAX bytes and 32 list members, each key=value with the
 * spec's key and value characters. */
bool dsq_trace_valid_tracestate(const char *s);

/* Which traces are recorded (OTEL_TRACES_SAMPLER). */
typedef enum dsq_sampler_kind {
    DSQ_SAMPLER_PARENT_ON = 0,       /* parentbased_always_on (the default)   */
    DSQ_SAMPLER_PARENT_OFF,          /* parentbased_always_off                */
    DSQ_SAMPLER_PARENT_RATIO,        /* parentbased_traceidratio              */
    DSQ_SAMPLER_ON,                  /* always_on                             */
    DSQ_SAMPLER_OFF,                 /* always_off                            */
    DSQ_SAMPLER_RATIO,               /* traceidratio                          */
} dsq_sampler_kind_t;
typedef struct dsq_sampler {
    dsq_sampler_kind_t kind;
    double ratio;                    /* [0, 1] for the ratio kinds            */
} dsq_sampler_t;

/* Start the trace context of a request: from traceparent/tracestate
 * (either may be NULL; an invalid one is ignored) or a new trace id, a new
 * span id from the CSPRNG (OpenSSL RAND_bytes), and the sampled flag as
 * the sampler decides (parent-based kinds follow the caller's flag; the
 * ratio kinds keep a trace when its last 8 bytes, big-endian, are below
 * ratio x 2^64, so every service of a trace decides alike). */
void dsq_trace_begin(const dsq_sampler_t *smp, const char *traceparent,
                     const char *tracestate, dsq_trace_ctx_t *out);
/* The traceparent naming this request's span: out gets DSQ_TRACEPARENT_LEN
 * characters and a NUL. */
void dsq_trace_format(const dsq_trace_ctx_t *c, char out[DSQ_TRACEPARENT_LEN + 1]);
/* 8 random bytes for a child span id (never all zero). */
void dsq_trace_new_span_id(uint8_t out[8]);
/* CLOCK_REALTIME minus CLOCK_MONOTONIC, in ns: a span's epoch time is
 * monotonic seconds x 1e9 + this. */
int64_t dsq_trace_clock_offset_ns(void);

/* -------------------------------------------------------------- spans */

/* OTLP Span.SpanKind and Status.StatusCode values (trace.proto). */
enum { DSQ_SPAN_INTERNAL = 1, DSQ_SPAN_SERVER = 2 };
enum { DSQ_STATUS_UNSET = 0, DSQ_STATUS_OK = 1, DSQ_STATUS_ERROR = 2 };

/* A new OTLP JSON Span object (trace.proto Span): ids as hex strings,
 * times as decimal strings of ns since the Unix epoch. parent_id NULL for
 * a root span. The caller owns it (cJSON_Delete) until dsq_otlp_submit.
 * NULL on ENOMEM. */
cJSON *dsq_span_new(const uint8_t trace_id[16], const uint8_t span_id[8],
                    const uint8_t *parent_id, const char *name, int kind,
                    int64_t start_ns, int64_t end_ns);
/* Attributes (common.proto KeyValue / AnyValue); NULL strings are skipped.
 * Allocation failures leave the attribute out. */
void dsq_span_attr_str(cJSON *span, const char *key, const char *v);
void dsq_span_attr_strn(cJSON *span, const char *key, const char *v, size_t n);
void dsq_span_attr_int(cJSON *span, const char *key, int64_t v);
void dsq_span_attr_double(cJSON *span, const char *key, double v);
void dsq_span_attr_bool(cJSON *span, const char *key, bool v);
/* An array of strings (AnyValue arrayValue). */
void dsq_span_attr_strs(cJSON *span, const char *key, const char *const *v, int n);
/* Status (code DSQ_STATUS_*; message may be NULL) and traceState. */
void dsq_span_status(cJSON *span, int code, const char *message);
void dsq_span_trace_state(cJSON *span, const char *tracestate);

/* ----------------------------------------------------------- exporter */

/* Where and how spans go. Filled by dsq_otlp_config_load; strings owned,
 * freed by dsq_otlp_config_deinit. */
typedef struct dsq_otlp_config {
    char *endpoint;                  /* the full traces URL; NULL: tracing
                                        off (no exporter, ids still made
                                        and propagated)                     */
    cJSON *resource;                 /* OTLP Resource.attributes array:
                                        service.name first, then
                                        OTEL_RESOURCE_ATTRIBUTES           */
    char **headers;                  /* "Name: value" request headers       */
    int n_headers;
    int max_queue;                   /* spans queued at most (2048)         */
    int max_batch;                   /* spans per export (512)              */
    int delay_ms;                    /* longest a span waits for its batch
                                        (OTEL_BSP_SCHEDULE_DELAY, 5000)    */
    int timeout_ms;                  /* one export's HTTP timeout
                                        (OTEL_EXPORTER_OTLP_TIMEOUT, 10000) */
    dsq_sampler_t sampler;
    bool export_prompt;              /* --otlp-export-prompt                 */
} dsq_otlp_config_t;

/* Resolve the tracing configuration: the endpoint from --otlp-endpoint
 * (o->otlp_endpoint; env DSQ_OTLP_ENDPOINT comes through the options
 * table), else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, else
 * OTEL_EXPORTER_OTLP_ENDPOINT + "/v1/traces" (the spec's rules; the flag
 * is a base URL like the latter unless its path already ends in
 * /v1/traces). OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it
 * off. Returns 0, or DSQ_EINVAL with a one-line reason in err: a URL that
 * is not http:// or https://, a protocol other than http/json, an
 * exporter other than otlp/none, an unknown sampler or a ratio outside
 * [0, 1], a malformed number or header list. */
int dsq_otlp_config_load(dsq_otlp_config_t *c, const dsq_options_t *o, dsq_getenv_fn env,
                         char *err, size_t err_len);
void dsq_otlp_config_deinit(dsq_otlp_config_t *c);

typedef struct dsq_otlp dsq_otlp_t;

/* Counters for /metrics (since start-up, in spans). */
typedef struct dsq_otlp_stats {
    int64_t exported;                /* accepted by the collector (2xx)      */
    int64_t dropped_queue_full;      /* not queued: the queue was full       */
    int64_t dropped_export_failed;   /* sent but refused, or not delivered
                                        (connection error, timeout, non-2xx) */
    int64_t queued;                  /* waiting now                          */
    int64_t export_requests, export_failures;   /* HTTP POSTs               */
} dsq_otlp_stats_t;

/* Start the exporter thread for c (copied). Call curl_global_init before
 * any thread exists (dsqd's main does). NULL with a reason on failure. */
dsq_otlp_t *dsq_otlp_create(const dsq_otlp_config_t *c, char *err, size_t err_len);
/* Send what is queued (waiting at most flush_ms for the collector), stop
 * the thread, free everything. NULL is a no-op. */
void dsq_otlp_destroy(dsq_otlp_t *x, int flush_ms);
/* Queue span (an object from dsq_span_new); takes ownership whatever
 * happens. Returns false when it was dropped (queue full, or x NULL). */
bool dsq_otlp_submit(dsq_otlp_t *x, cJSON *span);
void dsq_otlp_stats(dsq_otlp_t *x, dsq_otlp_stats_t *out);
/* The exporter's configuration (export_prompt, sampler). */
const dsq_otlp_config_t *dsq_otlp_config(const dsq_otlp_t *x);

/* The body of one export (trace.proto ExportTraceServiceRequest in the
 * JSON mapping): one ResourceSpans with c's resource, one ScopeSpans of
 * scope "dsqd", the n spans (borrowed). malloc'd, NULL on ENOMEM.
 * Exposed for the unit test. */
char *dsq_otlp_encode(const dsq_otlp_config_t *c, cJSON *const *spans, int n);

#endif

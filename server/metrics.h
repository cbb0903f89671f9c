/* Prometheus metrics of the HTTP edge (text exposition format 0.0.4).
 *
 * Latency histograms are fed by the server (it sees every request's
 * timeline); gauges and token counters come from a dsq_engine_stats_t
 * snapshot at scrape time. Names follow vLLM's, with a `dsq:` prefix.
 * Thread-safe: one mutex, held only to add an observation or to copy. */
#ifndef DSQ_SERVER_METRICS_H
#define DSQ_SERVER_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/serve/engine.h"

typedef enum dsq_hist {
    DSQ_HIST_TTFT = 0,           /* dsq:time_to_first_token_seconds         */
    DSQ_HIST_ITL,                /* dsq:inter_token_latency_seconds         */
    DSQ_HIST_E2E,                /* dsq:e2e_request_latency_seconds         */
    DSQ_HIST_QUEUE,              /* dsq:request_queue_time_seconds          */
    DSQ_HIST_COUNT_
} dsq_hist_t;

typedef struct dsq_metrics dsq_metrics_t;

dsq_metrics_t *dsq_metrics_create(void);        /* NULL on ENOMEM */
void dsq_metrics_destroy(dsq_metrics_t *m);     /* NULL is a no-op */

/* Record one observation (seconds) in histogram h. */
void dsq_metrics_observe(dsq_metrics_t *m, dsq_hist_t h, double seconds);
/* Count one finished HTTP request by its status code. */
void dsq_metrics_count_request(dsq_metrics_t *m, int status);
/* users: add a finished request's prompt tokens (usage.prompt_tokens,
 * prefix-cached ones included) to vllm:prompt_tokens_total. n <= 0 or a
 * NULL m is a no-op. */
void dsq_metrics_add_prompt_tokens(dsq_metrics_t *m, int64_t n);

/* otel: counters of the edge's own machinery, sampled at scrape time. */
typedef struct dsq_metrics_extra {
    bool otlp_on;                    /* an OTLP exporter runs (else omitted)  */
    int64_t otlp_spans_exported;     /* server/trace.h dsq_otlp_stats_t       */
    int64_t otlp_spans_dropped_queue_full;
    int64_t otlp_spans_dropped_export_failed;
    int64_t otlp_spans_queued;
    int64_t otlp_export_requests, otlp_export_failures;
} dsq_metrics_extra_t;

/* Render everything as Prometheus text; st may be NULL (engine not up),
 * ext NULL (nothing extra). model_name labels the metrics. malloc'd
 * string, NULL on ENOMEM. */
char *dsq_metrics_render(dsq_metrics_t *m, const dsq_engine_stats_t *st,
                         const char *model_name, const dsq_metrics_extra_t *ext);

#endif

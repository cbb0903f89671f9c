/* Prometheus metrics of the HTTP edge (text exposition format 0.0.4).
 *
 * Latency histograms are fed by the server (it sees every request's
 * timeline); gauges and token counters come from a dsq_engine_stats_t
 * snapshot at scrape time. Names follow vLLM's, with a `dsq:` prefix.
 * Thread-safe: one mutex, held only to add an observation or to copy. */
#ifndef DSQ_SERVER_METRICS_H
#define DSQ_SERVER_METRICS_H

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

/* Render everything as Prometheus text; st may be NULL (engine not up).
 * model_name labels the metrics. malloc'd string, NULL on ENOMEM. */
char *dsq_metrics_render(dsq_metrics_t *m, const dsq_engine_stats_t *st,
                         const char *model_name);

#endif

/* Fixed-bucket histograms and counters rendered in the Prometheus text
 * format. Buckets are vLLM's for the same metrics so dashboards carry over. */
#include "server/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* users: vLLM V1's bucket lists (vllm/v1/metrics/loggers.py): TTFT to
 * 2560 s; time per output token; request latency (e2e and queue time) to
 * 7680 s */
static const double ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_b[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                               0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0};
static const double e2e_b[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                               15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                               240.0, 480.0, 960.0, 1920.0, 7680.0};
#define MAXB 22

/* users: vllm is the name vLLM gives the same histogram (NULL: none), so
 * vLLM's published Grafana dashboard reads dsqd unchanged */
static const struct {
    const char *name, *help, *vllm;
    const double *b;
    int n;
} hists[DSQ_HIST_COUNT_] = {
    [DSQ_HIST_TTFT] = {"dsq:time_to_first_token_seconds",
                       "Time from request arrival to its first token.",
                       "vllm:time_to_first_token_seconds", ttft_b, 22},
    [DSQ_HIST_ITL] = {"dsq:inter_token_latency_seconds",
                      "Time between successive output events of a choice.",
                      "vllm:time_per_output_token_seconds", itl_b, 19},
    [DSQ_HIST_E2E] = {"dsq:e2e_request_latency_seconds",
                      "Time from request arrival to its last token.",
                      "vllm:e2e_request_latency_seconds", e2e_b, 21},
    [DSQ_HIST_QUEUE] = {"dsq:request_queue_time_seconds",
                        "Time a request waited before its first scheduling.",
                        "vllm:request_queue_time_seconds", e2e_b, 21},
};

typedef struct hist {
    uint64_t counts[MAXB + 1];   /* per bucket, last = +Inf overflow */
    uint64_t count;
    double sum;
} hist_t;

/* 204: CORS preflight; 499: the client went away (docs/api.md) */
static const int status_codes[] = {200, 204, 400, 401, 404, 405, 408, 413,
                                   415, 429, 499, 500, 503};
#define N_STATUS (sizeof(status_codes) / sizeof(status_codes[0]))

struct dsq_metrics {
    pthread_mutex_t lock;
    hist_t h[DSQ_HIST_COUNT_];
    uint64_t by_status[N_STATUS + 1];
    uint64_t request_prompt_tokens;   /* users: vLLM's prompt_tokens_total */
};

dsq_metrics_t *dsq_metrics_create(void)
{
    dsq_metrics_t *m = calloc(1, sizeof(*m));
    if (m)
        pthread_mutex_init(&m->lock, NULL);
    return m;
}

void dsq_metrics_destroy(dsq_metrics_t *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void dsq_metrics_observe(dsq_metrics_t *m, dsq_hist_t h, double s)
{
    int b = 0;
    if (!m || (int)h < 0 || h >= DSQ_HIST_COUNT_)
        return;
    while (b < hists[h].n && s > hists[h].b[b])
        b++;
    pthread_mutex_lock(&m->lock);
    m->h[h].counts[b]++;
    m->h[h].count++;
    m->h[h].sum += s;
    pthread_mutex_unlock(&m->lock);
}

void dsq_metrics_count_request(dsq_metrics_t *m, int status)
{
    size_t i = 0;
    if (!m)
        return;
    while (i < N_STATUS && status_codes[i] != status)
        i++;
    pthread_mutex_lock(&m->lock);
    m->by_status[i]++;
    pthread_mutex_unlock(&m->lock);
}

void dsq_metrics_add_prompt_tokens(dsq_metrics_t *m, int64_t n)
{
    if (!m || n <= 0)
        return;
    pthread_mutex_lock(&m->lock);
    m->request_prompt_tokens += (uint64_t)n;
    pthread_mutex_unlock(&m->lock);
}

/* Growable text buffer. */
typedef struct buf {
    char *p;
    size_t len, cap;
    int oom;
} buf_t;

static void bprintf(buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void bprintf(buf_t *b, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (b->oom)
        return;
    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len)
            break;
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    b->len += (size_t)n;
}

static void gauge(buf_t *b, const char *type, const char *name,
                  const char *help, const char *lbl, double v)
{
    bprintf(b, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %.17g\n", name, help, name,
            type, name, lbl, v);
}

char *dsq_metrics_render(dsq_metrics_t *m, const dsq_engine_stats_t *st,
                         const char *model_name, const dsq_metrics_extra_t *ext)
{
    buf_t b = {0};
    char lbl[300];
    dsq_metrics_t snap;
    dsq_engine_stats_t zero = {0};
    b.cap = 8192;
    b.p = malloc(b.cap);
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
    /* at most 200 bytes of the name, cut at a UTF-8 character boundary */
    size_t nl = model_name ? strlen(model_name) : 0;
    if (nl > 200) {
        nl = 200;
        while (nl > 0 && ((unsigned char)model_name[nl] & 0xC0) == 0x80)
            nl--;
    }
    snprintf(lbl, sizeof(lbl), "model_name=\"%.*s\"", (int)nl, model_name ? model_name : "");
    for (char *c = lbl + 12; *c; c++)  /* keep the label value parseable */
        if (*c == '"' || *c == '\\' || *c == '\n')
            *c = '_';
    lbl[strlen(lbl) - 1] = '"';
    if (!st)
        st = &zero;
    pthread_mutex_lock(&m->lock);
    memcpy(snap.h, m->h, sizeof(snap.h));
    memcpy(snap.by_status, m->by_status, sizeof(snap.by_status));
    snap.request_prompt_tokens = m->request_prompt_tokens;
    pthread_mutex_unlock(&m->lock);

    gauge(&b, "gauge", "dsq:num_requests_running",
          "Requests in the running batch.", lbl, st->n_running);
    gauge(&b, "gauge", "dsq:num_requests_waiting",
          "Requests waiting to be scheduled.", lbl, st->n_waiting);
    gauge(&b, "gauge", "dsq:kv_cache_blocks_used", "KV cache blocks in use.",
          lbl, (double)st->kv_blocks_used);
    gauge(&b, "gauge", "dsq:kv_cache_blocks_total", "KV cache blocks in all.",
          lbl, (double)st->kv_blocks_total);
    /* hardening: backpressure and deadlines (docs/api.md) */
    gauge(&b, "gauge", "dsq:kv_cache_block_bytes",
          "Bytes of one KV cache block (all layers).", lbl, (double)st->kv_block_bytes);
    gauge(&b, "gauge", "dsq:num_requests_held",
          "Requests not scheduled because their client is not reading (--max-undelivered-bytes).",
          lbl, st->n_held);
    gauge(&b, "counter", "dsq:stream_stall_aborts_total",
          "Requests aborted after being held past --stream-stall-timeout.", lbl,
          (double)st->stream_stall_aborts_total);
    gauge(&b, "counter", "dsq:queue_timeouts_total",
          "Requests refused after waiting past --max-queue-wait.", lbl,
          (double)st->queue_timeouts_total);
    gauge(&b, "gauge", "dsq:kv_cache_usage_perc",
          "Fraction of KV cache blocks in use.", lbl,
          st->kv_blocks_total ? (double)st->kv_blocks_used / (double)st->kv_blocks_total : 0.0);
    gauge(&b, "counter", "dsq:prompt_tokens_total", "Prefill tokens processed.",
          lbl, (double)st->prompt_tokens_total);
    gauge(&b, "counter", "dsq:generation_tokens_total", "Tokens generated.",
          lbl, (double)st->generation_tokens_total);
    gauge(&b, "counter", "dsq:num_preemptions_total",
          "Sequences preempted (recomputed).", lbl, (double)st->preemptions_total);
    /* prefix: vLLM V1's prefix_cache_queries / prefix_cache_hits, in tokens */
    gauge(&b, "counter", "dsq:prefix_cache_queries_total",
          "Prompt tokens looked up in the prefix cache (--enable-prefix-caching).", lbl,
          (double)st->prefix_cache_queries_total);
    gauge(&b, "counter", "dsq:prefix_cache_hits_total",
          "Prompt tokens whose KV came from the prefix cache.", lbl,
          (double)st->prefix_cache_hits_total);
    gauge(&b, "counter", "dsq:request_success_total",
          "Requests the engine finished.", lbl, (double)st->requests_finished_total);

    bprintf(&b, "# HELP dsq:http_requests_total HTTP requests by status.\n"
                "# TYPE dsq:http_requests_total counter\n");
    for (size_t i = 0; i <= N_STATUS; i++) {
        char code[8];
        snprintf(code, sizeof(code), "%s", i < N_STATUS ? "" : "other");
        if (i < N_STATUS)
            snprintf(code, sizeof(code), "%d", status_codes[i]);
        bprintf(&b, "dsq:http_requests_total{%s,status=\"%s\"} %llu\n", lbl,
                code, (unsigned long long)snap.by_status[i]);
    }

    for (int pass = 0; pass < 2; pass++) {
        for (int h = 0; h < DSQ_HIST_COUNT_; h++) {
            const char *name = pass ? hists[h].vllm : hists[h].name;
            uint64_t cum = 0;
            if (!name)
                continue;
            bprintf(&b, "# HELP %s %s\n# TYPE %s histogram\n", name, hists[h].help, name);
            for (int i = 0; i < hists[h].n; i++) {
                cum += snap.h[h].counts[i];
                bprintf(&b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, lbl, hists[h].b[i],
                        (unsigned long long)cum);
            }
            bprintf(&b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl,
                    (unsigned long long)snap.h[h].count);
            bprintf(&b, "%s_sum{%s} %.17g\n%s_count{%s} %llu\n", name, lbl, snap.h[h].sum,
                    name, lbl, (unsigned long long)snap.h[h].count);
        }
    }

    /* users: vLLM's names for the same quantities (types as vLLM's). Its
     * prompt_tokens_total counts every request's prompt, prefix-cached
     * tokens included, where dsq:prompt_tokens_total counts the tokens
     * prefill computed. */
    gauge(&b, "gauge", "vllm:num_requests_running",
          "Requests in the running batch (vLLM name).", lbl, st->n_running);
    gauge(&b, "gauge", "vllm:num_requests_waiting",
          "Requests waiting to be scheduled (vLLM name).", lbl, st->n_waiting);
    double usage = st->kv_blocks_total
                       ? (double)st->kv_blocks_used / (double)st->kv_blocks_total : 0.0;
    gauge(&b, "gauge", "vllm:kv_cache_usage_perc",
          "Fraction of KV cache blocks in use, 1 = all (vLLM V1 name).", lbl, usage);
    gauge(&b, "gauge", "vllm:gpu_cache_usage_perc",
          "Fraction of KV cache blocks in use, 1 = all (vLLM V0 name, any device).", lbl,
          usage);
    gauge(&b, "counter", "vllm:prompt_tokens_total",
          "Prompt tokens of finished requests, prefix-cached ones included (vLLM's count).",
          lbl, (double)snap.request_prompt_tokens);
    gauge(&b, "counter", "vllm:generation_tokens_total", "Tokens generated (vLLM name).",
          lbl, (double)st->generation_tokens_total);
    gauge(&b, "counter", "vllm:num_preemptions_total",
          "Sequences preempted (vLLM name).", lbl, (double)st->preemptions_total);
    /* speculative decoding: vLLM V1's spec_decode counters (when on) */
    if (st->spec_k > 0) {
        gauge(&b, "counter", "vllm:spec_decode_num_drafts_total",
              "Speculative verifications: a sequence's draft tokens scored in one step.", lbl,
              (double)st->spec_drafts_total);
        gauge(&b, "counter", "vllm:spec_decode_num_draft_tokens_total",
              "Draft tokens scored (--speculative-ngram or --draft-model).", lbl,
              (double)st->spec_draft_tokens_total);
        gauge(&b, "counter", "vllm:spec_decode_num_accepted_tokens_total",
              "Draft tokens accepted (equal to the token sampled at their position).", lbl,
              (double)st->spec_accepted_tokens_total);
        bprintf(&b, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Draft tokens "
                    "accepted at each draft position (0-based).\n"
                    "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
        for (int i = 0; i < st->spec_k && i < DSQ_SPEC_MAX_K; i++)
            bprintf(&b, "vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} "
                        "%lld\n", lbl, i, (long long)st->spec_accepted_per_pos[i]);
    }
    if (st->draft_weight_bytes > 0) {
        gauge(&b, "gauge", "dsq:draft_kv_blocks_total",
              "KV blocks of the draft model's own cache (--draft-model).", lbl,
              (double)st->draft_kv_blocks);
        gauge(&b, "gauge", "dsq:draft_kv_blocks_used",
              "Draft KV blocks holding a sequence's tokens now.", lbl,
              (double)(st->draft_kv_blocks - st->draft_kv_free));
        gauge(&b, "counter", "dsq:draft_tokens_total",
              "Tokens the draft model computed (catch-up and drafts).", lbl,
              (double)st->draft_tokens_total);
        gauge(&b, "counter", "dsq:draft_evictions_total",
              "Sequences whose draft state was dropped for room in the draft cache.", lbl,
              (double)st->draft_evictions_total);
    }
    {
        /* admission (engine/serve/admission.h): the policy's limit and why */
        const dsq_admission_stats_t *a = &st->admission;
        bool adaptive = a->kind == DSQ_ADMISSION_ADAPTIVE;
        bprintf(&b, "# HELP dsq:admission_policy The admission policy (--admission-policy).\n"
                    "# TYPE dsq:admission_policy gauge\n"
                    "dsq:admission_policy{%s,policy=\"%s\"} 1\n", lbl,
                adaptive ? "adaptive" : "static");
        if (adaptive) {
            gauge(&b, "gauge", "dsq:admission_limit",
                  "Adaptive concurrency limit: requests admitted to the scheduler at most.", lbl,
                  a->limit);
            gauge(&b, "gauge", "dsq:admission_requests_held",
                  "Requests held back by the adaptive limit (also in num_requests_waiting).",
                  lbl, st->n_admission_held);
            bprintf(&b, "# HELP dsq:admission_refused_total Requests the adaptive policy "
                        "refused (503): limit (on arrival, queue beyond the limit full) or "
                        "queue_wait (waited past half the TTFT target).\n"
                        "# TYPE dsq:admission_refused_total counter\n"
                        "dsq:admission_refused_total{%s,reason=\"limit\"} %lld\n"
                        "dsq:admission_refused_total{%s,reason=\"queue_wait\"} %lld\n",
                    lbl, (long long)a->refused_limit, lbl, (long long)a->refused_wait);
            bprintf(&b, "# HELP dsq:admission_limit_changes_total Moves of the adaptive "
                        "limit: up (+1, under target at the limit) or down (x0.9, over "
                        "target).\n"
                        "# TYPE dsq:admission_limit_changes_total counter\n"
                        "dsq:admission_limit_changes_total{%s,direction=\"up\"} %lld\n"
                        "dsq:admission_limit_changes_total{%s,direction=\"down\"} %lld\n",
                    lbl, (long long)a->increases, lbl, (long long)a->decreases);
            gauge(&b, "gauge", "dsq:admission_window_ttft_p90_seconds",
                  "p90 time to first token of the limiter's last window (-1: none).", lbl,
                  a->window_ttft_p90_ms < 0 ? -1 : a->window_ttft_p90_ms / 1e3);
            gauge(&b, "gauge", "dsq:admission_window_itl_p90_seconds",
                  "p90 decode step time of the limiter's last window (-1: none).", lbl,
                  a->window_itl_p90_ms < 0 ? -1 : a->window_itl_p90_ms / 1e3);
        }
    }
    if (ext && ext->otlp_on) {
        /* otel: the span exporter (server/trace.h); drops never block */
        gauge(&b, "counter", "dsq:otlp_spans_exported_total",
              "Trace spans the OTLP collector accepted.", lbl, (double)ext->otlp_spans_exported);
        bprintf(&b, "# HELP dsq:otlp_spans_dropped_total Trace spans lost: queue_full (the "
                    "export queue was full; the request went on) or export_failed (the "
                    "collector refused them or could not be reached in time).\n"
                    "# TYPE dsq:otlp_spans_dropped_total counter\n"
                    "dsq:otlp_spans_dropped_total{%s,reason=\"queue_full\"} %lld\n"
                    "dsq:otlp_spans_dropped_total{%s,reason=\"export_failed\"} %lld\n",
                lbl, (long long)ext->otlp_spans_dropped_queue_full, lbl,
                (long long)ext->otlp_spans_dropped_export_failed);
        gauge(&b, "gauge", "dsq:otlp_spans_queued", "Trace spans waiting to be exported.", lbl,
              (double)ext->otlp_spans_queued);
        gauge(&b, "counter", "dsq:otlp_export_requests_total",
              "OTLP/HTTP export requests sent.", lbl, (double)ext->otlp_export_requests);
        gauge(&b, "counter", "dsq:otlp_export_failures_total",
              "OTLP/HTTP export requests that failed.", lbl, (double)ext->otlp_export_failures);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

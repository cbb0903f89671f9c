/* dsqd entry point: options -> HTTP listener (503 while loading) -> engine
 * -> ready -> wait for SIGTERM/SIGINT -> drain -> stop.
 *
 * Signals are blocked in every thread (the mask is set before any thread
 * starts) and taken synchronously with sigtimedwait() in main, so shutdown
 * runs as ordinary code rather than in a signal handler. Order of teardown
 * matters: the HTTP daemon stops (no thread calls the engine any more), then
 * the engine is destroyed (no more notify calls), then the HTTP state that
 * notify may touch is freed.
 *
 * systemd (deploy/dsqd.service, Type=notify): READY=1 with a STATUS naming
 * the model and KV blocks once the engine is up, STOPPING=1 when draining
 * starts, WATCHDOG=1 from the engine thread's heartbeat timer when
 * WATCHDOG_USEC is set (a wedged engine stops petting the watchdog even
 * though the HTTP threads still answer). SIGHUP reopens --log-file (under
 * journald, without --log-file, there is nothing to reopen). */
#include "dsq_config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <systemd/sd-daemon.h>

#include "engine/serve/engine.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/text/grammar.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/trace.h"

static const char *env_get(const char *name)
{
    return getenv(name);
}

/* Whole file as a NUL-terminated string, or NULL. */
static char *read_file(const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < (1 << 24) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
        if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = '\0';
        } else {
            free(buf);
            buf = NULL;
        }
    }
    if (!buf)
        snprintf(err, err_len, "%s: cannot read", path);
    fclose(f);
    return buf;
}

/* Basename of the model path, without a trailing slash. malloc'd. */
static char *model_basename(const char *path)
{
    char *p = strdup(path), *b;
    size_t n;
    if (!p)
        return NULL;
    n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        p[--n] = '\0';
    b = strrchr(p, '/');
    b = strdup(b ? b + 1 : p);
    free(p);
    return b;
}

static void engine_opts(const dsq_options_t *o, dsq_engine_opts_t *eo)
{
    memset(eo, 0, sizeof(*eo));
    eo->model_path = o->model;
    eo->tokenizer_path = o->tokenizer;
    eo->max_model_len = o->max_model_len;
    eo->max_num_seqs = o->max_num_seqs;
    eo->max_num_batched_tokens = o->max_num_batched_tokens;
    eo->max_prefill_tokens_with_decode = o->max_prefill_tokens_with_decode;
    eo->admission_defer_steps = o->admission_defer_steps > 0 ? o->admission_defer_steps : -1;
    eo->admission_window_ms = o->admission_window_ms > 0 ? o->admission_window_ms : -1;
    eo->max_waiting_requests = o->max_waiting_requests;
    eo->max_queue_wait_s = o->max_queue_wait;               /* hardening */
    eo->admission_policy = !strcmp(o->admission_policy, "adaptive") ? DSQ_ADMISSION_ADAPTIVE
                                                                     : DSQ_ADMISSION_STATIC;
    eo->target_ttft_ms = o->target_ttft_ms;                 /* admission */
    eo->target_itl_ms = o->target_itl_ms;
    eo->step_budget_ms = o->step_budget_ms > 0 ? o->step_budget_ms : -1;
    eo->max_undelivered_bytes = o->max_undelivered_bytes;
    eo->undelivered_timeout_s = o->stream_stall_timeout > 0 ? o->stream_stall_timeout : -1;
    eo->block_size = o->block_size;
    eo->kv_cache_dtype = !strcmp(o->kv_cache_dtype, "int8")   ? DSQ_ENGINE_KV_INT8
                         : !strcmp(o->kv_cache_dtype, "fp32") ? DSQ_ENGINE_KV_F32
                         : !strcmp(o->kv_cache_dtype, "fp16") ? DSQ_ENGINE_KV_F16
                                                              : DSQ_ENGINE_KV_AUTO;
    eo->memory_limit_bytes = o->memory_limit;
    eo->kv_cache_memory_bytes = o->kv_cache_memory;
    eo->enable_prefix_caching = o->enable_prefix_caching;
    eo->spec_k = o->speculative_ngram;
    eo->spec_ngram_min = o->speculative_ngram_min;
    eo->spec_ngram_max = o->speculative_ngram_max;
    eo->spec_max_batch = o->speculative_max_batch;
    eo->spec_fixed_len = o->speculative_fixed_len;
    eo->spec_mtp = o->speculative_mtp;
    if (o->draft_model && *o->draft_model) {      /* "" (an unset env var): none */
        eo->draft_model_path = o->draft_model;
        eo->spec_k = o->draft_max;
    }
    eo->kv_prefault = o->kv_cache_prefault;
    eo->n_threads = o->threads;
    eo->quantize = !strcmp(o->quantize, "none") ? NULL : o->quantize;
    eo->quant_group_size = o->group_size;
    eo->padding_model_path = o->padding_model;          /* pad */
    eo->activation_dtype = !strcmp(o->activation_dtype, "fp32") ? DSQ_ENGINE_ACT_F32 : DSQ_ENGINE_ACT_INT8;
    eo->dtype = o->dtype;
    eo->device = o->device;
    eo->gpu_memory_utilization = o->gpu_memory_utilization;
}

/* Engine-thread heartbeat (dsq_engine_opts_t.heartbeat): pet systemd's
 * watchdog. sd_notify opens its own datagram socket, so any thread may call
 * it. */
static void watchdog_pet(void *user)
{
    (void)user;
    sd_notify(0, "WATCHDOG=1");
}

/* Point stderr (fd 2, where dsq_log writes) at path, opened for append;
 * called at startup and on SIGHUP so logrotate can move the file away.
 * Returns 0 or -errno. */
static int reopen_log(const char *path)
{
    int rc = 0, fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
        return -errno;
    if (fd != STDERR_FILENO) {
        if (dup2(fd, STDERR_FILENO) < 0)
            rc = -errno;
        close(fd);
    }
    return rc;
}

/* Wait for in-flight requests, at most timeout_s; a second signal cuts the
 * wait short. */
static void drain(dsq_http_t *h, const sigset_t *set, double timeout_s)
{
    struct timespec t0, t, slice = {0, 100 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int n = dsq_http_n_inflight(h);
        double el;
        clock_gettime(CLOCK_MONOTONIC, &t);
        el = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9;
        if (n == 0)
            break;
        if (el >= timeout_s) {
            dsq_log(DSQ_LOG_WARN, "event=drain_timeout inflight=%d", n);
            break;
        }
        if (sigtimedwait(set, NULL, &slice) > 0) {
            dsq_log(DSQ_LOG_WARN, "event=drain_interrupted inflight=%d", n);
            break;
        }
    }
}

int main(int argc, char **argv)
{
    dsq_options_t o;
    dsq_engine_opts_t eo;
    dsq_http_config_t hc;
    dsq_metrics_t *metrics = NULL;
    dsq_otlp_config_t otc = {0};   /* otel */
    dsq_otlp_t *otlp = NULL;
    dsq_http_t *http = NULL;
    dsq_engine_t *engine = NULL;
    char err[512] = "", *cert = NULL, *key = NULL, *served = NULL;
    sigset_t set, wset;
    uint64_t watchdog_usec = 0;
    int rc = 1, sig;

    /* --help and --version answer even when the environment or a config
     * file holds a bad value */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            dsq_options_help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("dsqd %s\n", DSQ_VERSION);
            return 0;
        }
    }
    if (dsq_options_load(&o, argc, argv, env_get, err, sizeof(err))) {
        fprintf(stderr, "dsqd: %s\n", err);
        rc = 2;
        goto out;
    }
    if (o.help) {
        dsq_options_help(stdout);
        rc = 0;
        goto out;
    }
    if (o.version) {
        printf("dsqd %s\n", DSQ_VERSION);
        rc = 0;
        goto out;
    }
    if (o.log_level)
        dsq_log_set_level(o.log_level);
    if (o.log_file && *o.log_file && (sig = reopen_log(o.log_file)) < 0) {
        fprintf(stderr, "dsqd: --log-file %s: %s\n", o.log_file, strerror(-sig));
        rc = 2;
        goto out;
    }
    if (!o.model || !*o.model) {
        fprintf(stderr, "dsqd: --model is required (see --help)\n");
        rc = 2;
        goto out;
    }
    if (!strcmp(o.admission_policy, "adaptive") && !(o.target_ttft_ms > 0) &&
        !(o.target_itl_ms > 0)) {
        fprintf(stderr, "dsqd: --admission-policy adaptive needs a latency target: "
                        "--target-ttft-ms and/or --target-itl-ms\n");
        rc = 2;
        goto out;
    }
    if (o.plan) {
        /* print the memory plan and exit: 0 when it fits, 1 when not */
        char *table = NULL;
        engine_opts(&o, &eo);
        /* nothing is loaded: keep the loader's progress lines out of it */
        if (!getenv("DSQ_LOG_LEVEL") && dsq_log_threshold > DSQ_LOG_WARN)
            dsq_log_set_level("warn");
        rc = dsq_engine_plan(&eo, o.json, &table, err, sizeof(err));
        if (table)
            fputs(table, stdout);
        if (rc)
            fprintf(stderr, "dsqd: --plan: %s\n", err);
        free(table);
        rc = rc ? 1 : 0;
        goto out;
    }
    if (strcmp(o.device, "auto") && strcmp(o.device, "cpu") && !DSQ_HAVE_CUDA) {
        fprintf(stderr, "dsqd: --device %s: this build has no CUDA backend\n",
                o.device);
        rc = 1;
        goto out;
    }
    if ((o.ssl_certfile != NULL) != (o.ssl_keyfile != NULL)) {
        fprintf(stderr, "dsqd: --ssl-certfile and --ssl-keyfile go together\n");
        rc = 2;
        goto out;
    }
    if (o.ssl_certfile && (!(cert = read_file(o.ssl_certfile, err, sizeof(err))) ||
                           !(key = read_file(o.ssl_keyfile, err, sizeof(err))))) {
        fprintf(stderr, "dsqd: %s\n", err);
        rc = 2;
        goto out;
    }
    served = o.served_model_name ? strdup(o.served_model_name)
                                 : model_basename(o.model);

    /* block the shutdown signals before any thread exists */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    wset = set;
    sigaddset(&wset, SIGHUP);      /* reopen logs; never a shutdown */
    pthread_sigmask(SIG_BLOCK, &wset, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* otel: curl_global_init before any thread exists (libcurl's rule) */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (dsq_otlp_config_load(&otc, &o, env_get, err, sizeof(err))) {
        fprintf(stderr, "dsqd: tracing: %s\n", err);
        rc = 2;
        goto out;
    }
    if (otc.endpoint && !(otlp = dsq_otlp_create(&otc, err, sizeof(err)))) {
        fprintf(stderr, "dsqd: tracing: %s\n", err);
        rc = 1;
        goto out;
    }
    metrics = dsq_metrics_create();
    memset(&hc, 0, sizeof(hc));
    hc.host = o.host;
    hc.port = o.port;
    hc.api_key = o.api_key;
    hc.max_request_bytes = o.max_request_bytes;
    hc.request_timeout_s = o.request_timeout;
    hc.timeout_keep_alive_s = o.timeout_keep_alive;     /* api */
    hc.header_timeout_s = o.header_timeout;             /* hardening */
    hc.body_timeout_s = o.body_timeout;
    hc.max_connections = o.max_connections;
    hc.max_connections_per_client = o.max_connections_per_client;
    hc.http_threads = o.http_threads;
    hc.max_undelivered_bytes = o.max_undelivered_bytes;
    hc.max_seqs_per_request = o.max_seqs_per_request;   /* api */
    hc.default_seed = o.seed;                           /* users */
    hc.reasoning_budget = o.reasoning_budget;
    hc.allowed_origins = o.allowed_origins;
    hc.any_content_type = o.any_content_type;
    hc.tls_cert_pem = cert;
    hc.tls_key_pem = key;
    hc.served_model_name = served;
    hc.created = (int64_t)time(NULL);
    hc.prefix_caching = o.enable_prefix_caching;
    hc.otlp = otlp;                                     /* otel */
    hc.sampler = &otc.sampler;
    if (!metrics || !served ||
        !(http = dsq_http_create(&hc, metrics, err, sizeof(err)))) {
        dsq_log(DSQ_LOG_ERROR, "event=listen_failed reason=\"%s\"",
                err[0] ? err : "out of memory");
        goto out;
    }
    dsq_log(DSQ_LOG_INFO, "event=listening host=%s port=%d tls=%d auth=%d",
            o.host, dsq_http_port(http), cert != NULL,
            o.api_key && *o.api_key);
    sd_notifyf(0, "STATUS=loading %s", o.model);

    engine_opts(&o, &eo);
    if (sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0) {
        /* pet at half the timeout, as sd_watchdog_enabled(3) advises */
        eo.heartbeat = watchdog_pet;
        eo.heartbeat_interval_ms = watchdog_usec / 2000 > 0 ? (int)(watchdog_usec / 2000) : 1;
        dsq_log(DSQ_LOG_INFO, "event=watchdog_enabled timeout_us=%llu interval_ms=%d",
                (unsigned long long)watchdog_usec, eo.heartbeat_interval_ms);
    }
    engine = dsq_engine_create(&eo, err, sizeof(err));
    if (!engine) {
        dsq_log(DSQ_LOG_ERROR, "event=engine_failed model=%s reason=\"%s\"",
                o.model, err);
        goto out;
    }
    /* chatapi: a chat template that does not compile stops the daemon */
    if (dsq_http_set_chat(http, engine, o.chat_template, o.reasoning_parser,
                          o.tool_call_parser, err, sizeof(err))) {
        dsq_log(DSQ_LOG_ERROR, "event=chat_template_failed reason=\"%s\"", err);
        goto out;
    }
    dsq_http_set_engine(http, engine);
    {
        /* users: the address clients use, as bound (scripts/serve relays
         * this line); an IPv6 literal goes in brackets */
        const char *host = o.host && *o.host ? o.host : "0.0.0.0";
        bool v6 = strchr(host, ':') != NULL;
        dsq_log(DSQ_LOG_INFO, "event=ready model=%s served_model_name=%s "
                              "max_model_len=%d port=%d url=%s://%s%s%s:%d",
                o.model, served, dsq_engine_max_model_len(engine), dsq_http_port(http),
                cert ? "https" : "http", v6 ? "[" : "", host, v6 ? "]" : "",
                dsq_http_port(http));
    }
    {
        dsq_engine_stats_t st;
        dsq_engine_stats(engine, &st);
        sd_notifyf(0, "READY=1\nSTATUS=serving %s (model %s) on port %d, "
                   "kv_blocks=%lld block_size=%d",
                   served, o.model, dsq_http_port(http),
                   (long long)st.kv_blocks_total, o.block_size);
    }

    for (;;) {
        sig = sigwaitinfo(&wset, NULL);
        if (sig == SIGHUP) {
            int lrc = o.log_file && *o.log_file ? reopen_log(o.log_file) : 0;
            if (lrc)
                dsq_log(DSQ_LOG_ERROR, "event=log_reopen_failed path=%s reason=\"%s\"",
                        o.log_file, strerror(-lrc));
            else
                dsq_log(DSQ_LOG_INFO, "event=log_reopened target=%s",
                        o.log_file && *o.log_file ? o.log_file : "stderr");
        } else if (sig >= 0 || errno != EINTR) {
            break;
        }
    }
    dsq_log(DSQ_LOG_INFO, "event=draining signal=%d inflight=%d timeout_s=%g",
            sig, dsq_http_n_inflight(http), o.shutdown_timeout);
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    dsq_http_drain(http);
    drain(http, &set, o.shutdown_timeout);
    rc = 0;
out:
    if (http)
        dsq_http_stop(http);
    if (engine)
        dsq_engine_destroy(engine);
    if (http)
        dsq_http_destroy(http);
    dsq_grammar_registry_clear();   /* api: compiled grammars kept for reuse */
    /* otel: the last requests' spans get the export timeout to leave */
    dsq_otlp_destroy(otlp, otc.timeout_ms);
    dsq_otlp_config_deinit(&otc);
    curl_global_cleanup();
    dsq_metrics_destroy(metrics);
    if (rc == 0 && engine)
        dsq_log(DSQ_LOG_INFO, "event=stopped");
    free(cert);
    free(key);
    free(served);
    dsq_options_deinit(&o);
    return rc;
}

/* dsq-bench gpu, end to end: the whole engine (loader, planner, scheduler,
 * model graph, sampler) on the CUDA backend with a model of DeepSeek-Coder-
 * 6.7B's shapes and random weights, the `e2e` rows of `dsq-bench gpu`.
 *
 * The model: tools/bench_model.c's "6.7b" shape (DeepSeek-Coder-6.7B,
 * random Q4_0), written to $TMPDIR (default /tmp) and unlinked as soon as
 * the engine has loaded it; --quick: its 2-layer "quick" shape (the
 * simulator smoke).
 *
 * The engine runs with dsqd's defaults (device "cuda", greedy sampling with
 * ignore_eos, INT8 activations, FP16 KV, prefix caching off) but an explicit
 * KV budget (8 GiB; max_model_len 1024), so the figures do not depend on how
 * much memory the device has. Rows:
 *   load       dsq_engine_create: GGUF open, repack, upload, KV (seconds)
 *   ttft       one 512-token prompt, max_tokens 1: submit to the first
 *              token event, median of 3 (ms)
 *   decode b1  one request, 32-token prompt, 128 new tokens: (tokens - 1) /
 *              (last - first token time) (tok/s)
 *   decode b64 64 requests at once, 32-token prompts (distinct), 128 new
 *              tokens each: tokens delivered while all 64 are decoding
 *              (after the last first token, up to the first request's
 *              end) / that time (tok/s, all sequences together)
 * Target for an H200: decode b1 >= 850 tok/s (3.6 GB of weights read per
 * token at about 4 TB/s, less launch overhead). */
#include "dsq_config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/io/tensor.h"
#include "engine/serve/engine.h"

int dsq__bench_gpu_e2e(bool quick, FILE *json);

/* The model file: tools/bench_model.c. */
const char *dsq__bench_model_name(const char *shape);
int dsq__bench_model_vocab(const char *shape);
int dsq__bench_model_write(const char *shape, const char *path);

/* ------------------------------------------------------ the engine */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
} waiter_t;

static waiter_t W = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void notify(dsq_req_t *r, void *user)
{
    (void)r;
    (void)user;
    pthread_mutex_lock(&W.mu);
    W.pending = 1;
    pthread_cond_broadcast(&W.cv);
    pthread_mutex_unlock(&W.mu);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct track {
    dsq_req_t *r;
    double t_submit, t_first, t_last;
    int n_tokens;
    bool done;
    int n_ev;
    double *ev_t;                 /* [max_tokens + 2] event times */
    int *ev_n;                    /* tokens in each event */
} track_t;

/* Submit n requests (prompt_len random ids each, salted by request) and
 * collect every event with its arrival time until all ended. */
static int run_wave(dsq_engine_t *e, int n, int prompt_len, int max_tokens, int n_vocab,
                    uint64_t salt, track_t *tr, char *err, size_t err_len)
{
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt_len);
    if (!ids)
        return DSQ_ENOMEM;
    dsq_sampling_t sp = {.max_tokens = max_tokens, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
    int rc = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ salt;
    memset(tr, 0, sizeof(*tr) * (size_t)n);
    for (int i = 0; i < n && !rc; i++) {
        tr[i].ev_t = malloc(sizeof(double) * (size_t)(max_tokens + 2));
        tr[i].ev_n = malloc(sizeof(int) * (size_t)(max_tokens + 2));
        for (int j = 0; j < prompt_len; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ids[j] = 259 + (int32_t)(x % (uint64_t)(n_vocab - 259));
        }
        tr[i].r = dsq_req_create(ids, prompt_len, &sp, notify, NULL, err, err_len);
        if (!tr[i].r || !tr[i].ev_t || !tr[i].ev_n) {
            rc = tr[i].r ? DSQ_ENOMEM : DSQ_EINVAL;
            break;
        }
        tr[i].t_submit = now_s();
        rc = dsq_engine_submit(e, tr[i].r);
        if (rc)
            snprintf(err, err_len, "submit: %s", dsq_strerror(rc));
    }
    free(ids);
    for (int left = n; !rc && left > 0;) {
        pthread_mutex_lock(&W.mu);
        if (!W.pending) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&W.cv, &W.mu, &ts);
        }
        W.pending = 0;
        pthread_mutex_unlock(&W.mu);
        for (int i = 0; i < n; i++) {
            if (tr[i].done)
                continue;
            dsq_output_t ev;
            int got;
            while ((got = dsq_req_next(tr[i].r, &ev)) == 1) {
                double t = now_s();
                if (ev.n_tokens > 0) {
                    if (!tr[i].n_tokens)
                        tr[i].t_first = t;
                    tr[i].t_last = t;
                    tr[i].n_tokens += ev.n_tokens;
                    if (tr[i].n_ev < max_tokens + 2) {
                        tr[i].ev_t[tr[i].n_ev] = t;
                        tr[i].ev_n[tr[i].n_ev++] = ev.n_tokens;
                    }
                }
                bool abort = ev.finish == DSQ_FINISH_ABORT;
                dsq_output_free(&ev);
                if (abort) {
                    snprintf(err, err_len, "request %d aborted", i);
                    rc = DSQ_ESTATE;
                }
            }
            if (got < 0) {
                tr[i].done = true;
                left--;
                if (tr[i].n_tokens != max_tokens && !rc) {
                    snprintf(err, err_len, "request %d: %d tokens, wanted %d", i,
                             tr[i].n_tokens, max_tokens);
                    rc = DSQ_ESTATE;
                }
            }
        }
    }
    if (rc)
        for (int i = 0; i < n; i++)
            if (tr[i].r)
                dsq_engine_cancel(e, tr[i].r);
    return rc;
}

static void free_wave(track_t *tr, int n)
{
    for (int i = 0; i < n; i++) {
        dsq_req_unref(tr[i].r);
        free(tr[i].ev_t);
        free(tr[i].ev_n);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Decode tok/s of a wave: tokens delivered after the last first token, up
 * to the first request's last token, over that time. */
static double wave_tok_s(const track_t *tr, int n)
{
    double t0 = 0, t1 = INFINITY;
    for (int i = 0; i < n; i++) {
        if (tr[i].t_first > t0)
            t0 = tr[i].t_first;
        if (tr[i].t_last < t1)
            t1 = tr[i].t_last;
    }
    long tok = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < tr[i].n_ev; k++)
            if (tr[i].ev_t[k] > t0 && tr[i].ev_t[k] <= t1)
                tok += tr[i].ev_n[k];
    return t1 > t0 ? (double)tok / (t1 - t0) : 0;
}

int dsq__bench_gpu_e2e(bool quick, FILE *json)
{
    const char *shape = quick ? "quick" : "6.7b";
    const char *name = dsq__bench_model_name(shape);
    const int n_vocab = dsq__bench_model_vocab(shape);
    const int prompt_ttft = quick ? 16 : 512, n_ttft = quick ? 1 : 3;
    const int prompt_dec = quick ? 8 : 32, new_dec = quick ? 4 : 128;
    const int batch_big = quick ? 4 : 64;
    const char *tmpdir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/dsq-bench-e2e-%ld.gguf",
             tmpdir && *tmpdir ? tmpdir : "/tmp", (long)getpid());
    double t0 = now_s();
    int rc = dsq__bench_model_write(shape, path);
    if (rc) {
        fprintf(stderr, "dsq-bench gpu e2e: cannot write %s: %s\n", path,
                rc > 0 ? strerror(rc) : dsq_strerror(rc));
        unlink(path);
        return 1;
    }
    const double t_write = now_s() - t0;
    dsq_engine_opts_t o = {.model_path = path, .device = "cuda",
                           .max_model_len = quick ? 128 : 1024,
                           .max_num_seqs = batch_big,
                           .kv_cache_memory_bytes = quick ? 0 : 8LL << 30};
    char err[512] = "";
    t0 = now_s();
    dsq_engine_t *e = dsq_engine_create(&o, err, sizeof(err));
    const double t_load = now_s() - t0;
    unlink(path);
    if (!e) {
        fprintf(stderr, "dsq-bench gpu e2e: engine: %s\n", err);
        return 1;
    }
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    printf("e2e    %s: model written in %.1f s, engine up in %.1f s, device memory "
           "%.1f MiB (planned %.1f MiB), %lld KV blocks\n", name, t_write, t_load,
           (double)st.device_allocated_bytes / (1 << 20),
           (double)st.device_planned_bytes / (1 << 20), (long long)st.kv_blocks_total);
    if (json)
        fprintf(json, "{\"bench\":\"e2e_load\",\"model\":\"%s\",\"write_s\":%.3f,\"load_s\":%.3f,"
                "\"device_allocated_bytes\":%lld,\"device_planned_bytes\":%lld}\n", name,
                t_write, t_load, (long long)st.device_allocated_bytes,
                (long long)st.device_planned_bytes);
    track_t *tr = calloc((size_t)batch_big, sizeof(*tr));
    double ttft[3] = {0};
    if (!tr)
        rc = DSQ_ENOMEM;
    /* warm-up: one short request (first-launch costs out of the figures) */
    if (!rc) {
        rc = run_wave(e, 1, prompt_dec, 2, n_vocab, 99, tr, err, sizeof(err));
        free_wave(tr, 1);
    }
    for (int k = 0; k < n_ttft && !rc; k++) {
        rc = run_wave(e, 1, prompt_ttft, 1, n_vocab, 100 + (uint64_t)k, tr, err,
                      sizeof(err));
        ttft[k] = (tr[0].t_first - tr[0].t_submit) * 1e3;
        free_wave(tr, 1);
    }
    if (!rc) {
        qsort(ttft, (size_t)n_ttft, sizeof(double), cmp_d);
        double med = ttft[n_ttft / 2];
        printf("e2e    ttft  prompt %4d tokens: %9.2f ms (median of %d)\n", prompt_ttft, med,
               n_ttft);
        if (json)
            fprintf(json, "{\"bench\":\"e2e_ttft\",\"prompt_tokens\":%d,\"ttft_ms\":%.3f,"
                    "\"runs\":%d}\n", prompt_ttft, med, n_ttft);
    }
    const int batches[2] = {1, batch_big};
    for (int b = 0; b < 2 && !rc; b++) {
        int nb = batches[b];
        rc = run_wave(e, nb, prompt_dec, new_dec, n_vocab, 200 + (uint64_t)b, tr, err,
                      sizeof(err));
        if (!rc) {
            double tps = nb == 1 ? (tr[0].t_last > tr[0].t_first ?
                                    (tr[0].n_tokens - 1) / (tr[0].t_last - tr[0].t_first) : 0)
                                 : wave_tok_s(tr, nb);
            printf("e2e    decode batch %3d, %d new tokens each: %10.1f tok/s%s\n", nb, new_dec,
                   tps, nb == 1 && !quick ? "   (H200 target >= 850)" : "");
            if (json)
                fprintf(json, "{\"bench\":\"e2e_decode\",\"batch\":%d,\"prompt_tokens\":%d,"
                        "\"new_tokens\":%d,\"tok_s\":%.3f}\n", nb, prompt_dec, new_dec, tps);
        }
        free_wave(tr, nb);
    }
    fflush(stdout);
    if (rc)
        fprintf(stderr, "dsq-bench gpu e2e: %s%s%s\n", dsq_strerror(rc), *err ? ": " : "",
                err);
    free(tr);
    dsq_engine_destroy(e);
    return rc ? 1 : 0;
}

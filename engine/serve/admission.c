/* Admission policies: static and adaptive (AIMD). See admission.h. */
#include "admission.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SAMPLES 512                /* per window and signal; beyond, the
                                        oldest are overwritten            */
#define BACKOFF 0.9                  /* AIMDLimit's default backoffRatio  */
#define MIN_WINDOW_MS 250.0

typedef struct window {
    double v[N_SAMPLES];
    int n;                           /* samples so far (may exceed N_SAMPLES) */
} window_t;

struct dsq_admission {
    dsq_admission_opts_t o;
    pthread_mutex_t mu;              /* guards everything below              */
    double limit;
    double window_ms;
    double t_window;                 /* start of the current window; < 0: none */
    int max_inflight;                /* in the current window                */
    window_t ttft, itl;
    dsq_admission_stats_t st;
};

dsq_admission_t *dsq_admission_create(const dsq_admission_opts_t *o, char *err,
                                      size_t err_len)
{
    if (o->kind == DSQ_ADMISSION_ADAPTIVE && !(o->target_ttft_ms > 0) &&
        !(o->target_itl_ms > 0)) {
        if (err && err_len)
            snprintf(err, err_len, "the adaptive admission policy needs a latency target "
                                   "(--target-ttft-ms and/or --target-itl-ms)");
        return NULL;
    }
    dsq_admission_t *a = calloc(1, sizeof(*a));
    if (!a) {
        if (err && err_len)
            snprintf(err, err_len, "out of memory");
        return NULL;
    }
    a->o = *o;
    if (a->o.max_limit < 1)
        a->o.max_limit = 1;
    int init = o->initial_limit > 0 ? o->initial_limit : 4;
    a->limit = init < a->o.max_limit ? init : a->o.max_limit;
    if (o->kind == DSQ_ADMISSION_STATIC)
        a->limit = a->o.max_limit;
    a->window_ms = o->target_ttft_ms > MIN_WINDOW_MS ? o->target_ttft_ms : MIN_WINDOW_MS;
    a->t_window = -1;
    pthread_mutex_init(&a->mu, NULL);
    a->st.kind = o->kind;
    a->st.window_ttft_p90_ms = a->st.window_itl_p90_ms = -1;
    snprintf(a->st.reason, sizeof(a->st.reason), "initial");
    return a;
}

void dsq_admission_destroy(dsq_admission_t *a)
{
    if (!a)
        return;
    pthread_mutex_destroy(&a->mu);
    free(a);
}

dsq_admission_kind_t dsq_admission_kind(const dsq_admission_t *a) { return a->o.kind; }

static int retry_after(const dsq_admission_t *a)
{
    double s = ceil(a->o.target_ttft_ms / 1e3);
    return s >= 1 ? (int)s : 1;
}

dsq_admit_t dsq_admission_decide(dsq_admission_t *a, const dsq_admission_view_t *v,
                                 char *reason, size_t reason_len, int *retry_after_s)
{
    if (a->o.kind == DSQ_ADMISSION_STATIC)
        return DSQ_ADMIT_RUN;
    pthread_mutex_lock(&a->mu);
    int lim = (int)a->limit;
    pthread_mutex_unlock(&a->mu);
    if (lim < 1)
        lim = 1;
    /* the KV plan: what the running requests may still need, plus this one
     * (an empty engine takes any request the context length allows) */
    bool kv_fits = v->n_inflight == 0 || v->kv_tokens <= 0 ||
                   v->reserved_tokens + v->need_tokens <= v->kv_tokens;
    if (!v->held) {
        /* a new request waits behind the held-back ones, which may take the
         * free slots first: room for those slots plus one limit's worth */
        int free_slots = lim > v->n_inflight ? lim - v->n_inflight : 0;
        if (v->n_queued < free_slots + lim)
            return v->n_queued == 0 && v->n_inflight < lim && kv_fits ? DSQ_ADMIT_RUN
                                                                      : DSQ_ADMIT_QUEUE;
        if (reason && reason_len)
            snprintf(reason, reason_len, "the server is at its adaptive concurrency limit "
                     "(%d requests, %d more waiting) for its latency target; retry later", lim,
                     v->n_queued);
        *retry_after_s = retry_after(a);
        return DSQ_ADMIT_REFUSE;
    }
    if (v->n_inflight < lim && kv_fits)
        return DSQ_ADMIT_RUN;
    double max_wait = a->o.target_ttft_ms > 0 ? a->o.target_ttft_ms / 2
                                              : 10 * a->o.target_itl_ms;
    if (v->wait_ms <= max_wait)
        return DSQ_ADMIT_QUEUE;
    if (reason && reason_len)
        snprintf(reason, reason_len, "the server is at its adaptive concurrency limit (%d "
                 "requests) and this one waited %.0f ms for a slot, past half the latency "
                 "target; retry later", lim, v->wait_ms);
    *retry_after_s = retry_after(a);
    return DSQ_ADMIT_REFUSE;
}

void dsq_admission_count_refusal(dsq_admission_t *a, bool after_wait)
{
    pthread_mutex_lock(&a->mu);
    if (after_wait)
        a->st.refused_wait++;
    else
        a->st.refused_limit++;
    pthread_mutex_unlock(&a->mu);
}

static void add(window_t *w, double x)
{
    w->v[w->n % N_SAMPLES] = x;
    w->n++;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* p90 (nearest rank) of the window's samples, -1 when there are none */
static double p90(window_t *w)
{
    int n = w->n < N_SAMPLES ? w->n : N_SAMPLES;
    if (n == 0)
        return -1;
    qsort(w->v, (size_t)n, sizeof(double), cmp_double);
    int k = (int)ceil(0.9 * n) - 1;
    return w->v[k < 0 ? 0 : k];
}

void dsq_admission_observe_ttft(dsq_admission_t *a, double ttft_ms)
{
    if (a->o.kind != DSQ_ADMISSION_ADAPTIVE)
        return;
    pthread_mutex_lock(&a->mu);
    add(&a->ttft, ttft_ms);
    pthread_mutex_unlock(&a->mu);
}

void dsq_admission_observe_itl(dsq_admission_t *a, double step_ms)
{
    if (a->o.kind != DSQ_ADMISSION_ADAPTIVE)
        return;
    pthread_mutex_lock(&a->mu);
    add(&a->itl, step_ms);
    pthread_mutex_unlock(&a->mu);
}

bool dsq_admission_tick(dsq_admission_t *a, double now_ms, int n_inflight)
{
    bool moved = false;
    if (a->o.kind != DSQ_ADMISSION_ADAPTIVE)
        return false;
    pthread_mutex_lock(&a->mu);
    if (a->t_window < 0)
        a->t_window = now_ms;
    if (n_inflight > a->max_inflight)
        a->max_inflight = n_inflight;
    if (now_ms - a->t_window >= a->window_ms && (a->ttft.n > 0 || a->itl.n > 0)) {
        double t90 = p90(&a->ttft), i90 = p90(&a->itl);
        bool ttft_over = a->o.target_ttft_ms > 0 && t90 > a->o.target_ttft_ms;
        bool itl_over = a->o.target_itl_ms > 0 && i90 > a->o.target_itl_ms;
        /* growing needs evidence for every target set: a window without a
         * first token (long decodes running, new ones held) says nothing
         * about TTFT, and one without decode steps nothing about ITL */
        bool no_ttft = a->o.target_ttft_ms > 0 && a->ttft.n == 0;
        bool no_itl = a->o.target_itl_ms > 0 && a->itl.n == 0;
        double old = a->limit;
        if (ttft_over || itl_over) {
            a->limit = a->limit * BACKOFF;
            if (a->limit < 1)
                a->limit = 1;
            snprintf(a->st.reason, sizeof(a->st.reason), "%s p90 %.1f ms over the %.1f ms target",
                     ttft_over ? "ttft" : "itl", ttft_over ? t90 : i90,
                     ttft_over ? a->o.target_ttft_ms : a->o.target_itl_ms);
        } else if (no_ttft || no_itl) {
            snprintf(a->st.reason, sizeof(a->st.reason), "no %s samples in the window",
                     no_ttft ? "ttft" : "itl");
        } else if (a->max_inflight >= (int)a->limit) {
            a->limit = a->limit + 1 > a->o.max_limit ? a->o.max_limit : a->limit + 1;
            snprintf(a->st.reason, sizeof(a->st.reason), "under target at the limit");
        } else {
            snprintf(a->st.reason, sizeof(a->st.reason), "under target, limit not reached");
        }
        if (a->limit != old) {
            moved = true;
            if (a->limit > old)
                a->st.increases++;
            else
                a->st.decreases++;
        }
        a->st.window_ttft_p90_ms = t90;
        a->st.window_itl_p90_ms = i90;
        a->ttft.n = a->itl.n = 0;
        a->max_inflight = n_inflight;
        a->t_window = now_ms;
    }
    pthread_mutex_unlock(&a->mu);
    return moved;
}

void dsq_admission_stats(dsq_admission_t *a, dsq_admission_stats_t *out)
{
    pthread_mutex_lock(&a->mu);
    *out = a->st;
    out->limit = a->limit;
    pthread_mutex_unlock(&a->mu);
}

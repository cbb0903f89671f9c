/* Admission policy: decides, when a request is submitted and at
 * each engine step for the requests it holds back, whether a request runs
 * (enters the scheduler), waits, or is refused with a reason and a
 * Retry-After.
 *
 * Two policies:
 *  - static: today's fixed bounds. Every request enters the scheduler; the
 *    engine refuses at submit when --max-waiting-requests are waiting and
 *    after --max-queue-wait (engine.c). The policy itself never holds one
 *    back.
 *  - adaptive: a concurrency limit L on requests in the scheduler, moved by
 *    the latency the operator asks for (AIMD, as Netflix's
 *    concurrency-limits AIMDLimit, github.com/Netflix/concurrency-limits,
 *    itself TCP's congestion avoidance, Jacobson 1988): at the end of each
 *    window (max(250 ms, target TTFT)) with samples, when the window's p90
 *    TTFT exceeds --target-ttft-ms or its p90 inter-token latency (the
 *    duration of steps with decode rows) exceeds --target-itl-ms,
 *    L = max(1, L x 0.9); otherwise, when the window has samples of every
 *    target set and used the limit (requests in flight reached floor(L)),
 *    L += 1; else L stays (an idle server, or one without evidence for a
 *    target, does not grow it). L is bounded by max_limit (max_num_seqs) and
 *    a request enters only when the KV the running ones may still take
 *    plus its own fit the KV cache (the KV plan; each request's in whole
 *    blocks: its prompt's full blocks once, and per choice the blocks from
 *    there to prompt + max_tokens), so admitted requests are not preempted
 *    for memory.
 *    Beyond L requests wait in arrival order, at most the free slots plus
 *    floor(L) of them; more are refused at once, and one that waited past
 *    half the TTFT target (it could not meet it; 10 x the ITL target when
 *    only that is set) is refused then. Retry-After: the TTFT target in
 *    whole seconds, at least 1.
 *
 * Times in ms on one monotonic clock chosen by the caller. Engine-thread
 * only except dsq_admission_submit, which the caller serialises (engine.c
 * calls it under its submit mutex); dsq_admission_stats may be called from
 * any thread. */
#ifndef DSQ_ADMISSION_H
#define DSQ_ADMISSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum dsq_admission_kind {
    DSQ_ADMISSION_STATIC = 0,
    DSQ_ADMISSION_ADAPTIVE,
} dsq_admission_kind_t;

typedef struct dsq_admission_opts {
    dsq_admission_kind_t kind;
    double target_ttft_ms;           /* adaptive: p90 TTFT target; 0 = none   */
    double target_itl_ms;            /* adaptive: p90 step time with decode
                                        rows; 0 = none (one of the two must
                                        be set for adaptive)                */
    int max_limit;                   /* upper bound of L (max_num_seqs), >= 1 */
    int initial_limit;               /* L at start; 0 = min(4, max_limit)     */
} dsq_admission_opts_t;

/* What a decision is about. */
typedef struct dsq_admission_view {
    int n_inflight;                  /* requests in the scheduler, not ended  */
    int n_queued;                    /* requests the policy holds back (not
                                        counting the one decided on)        */
    int64_t reserved_tokens;         /* tokens the in-flight ones may reach  */
    int64_t need_tokens;             /* the most KV this one can take, tokens
                                        of whole blocks (engine.c)          */
    int64_t kv_tokens;               /* KV cache capacity in tokens          */
    double wait_ms;                  /* how long this request waited so far  */
    bool held;                       /* it is a held-back one (the oldest),
                                        decided again at a step; false: a
                                        new submit                         */
} dsq_admission_view_t;

typedef enum dsq_admit {
    DSQ_ADMIT_RUN = 0,               /* into the scheduler now                */
    DSQ_ADMIT_QUEUE,                 /* held back, decided again next step    */
    DSQ_ADMIT_REFUSE,                /* 503 with the reason and Retry-After   */
} dsq_admit_t;

/* Snapshot for /metrics and the log. */
typedef struct dsq_admission_stats {
    dsq_admission_kind_t kind;
    double limit;                    /* L (adaptive); max_limit for static    */
    int64_t increases, decreases;    /* limit moves since start              */
    int64_t refused_limit;           /* refused at submit: queue beyond L full */
    int64_t refused_wait;            /* refused after waiting half the target  */
    double window_ttft_p90_ms;       /* last window with samples; -1 = none  */
    double window_itl_p90_ms;
    char reason[96];                 /* why L last moved (or stayed)          */
} dsq_admission_stats_t;

typedef struct dsq_admission dsq_admission_t;

/* NULL on ENOMEM or when adaptive has neither target (err says which). */
dsq_admission_t *dsq_admission_create(const dsq_admission_opts_t *o, char *err,
                                      size_t err_len);
void dsq_admission_destroy(dsq_admission_t *a);   /* NULL is a no-op */
dsq_admission_kind_t dsq_admission_kind(const dsq_admission_t *a);

/* Decide on a request: at submit (v->wait_ms 0) and each step for the
 * oldest held-back one (v->held). On DSQ_ADMIT_REFUSE reason gets a one-line
 * message and *retry_after_s whole seconds (>= 1). */
dsq_admit_t dsq_admission_decide(dsq_admission_t *a, const dsq_admission_view_t *v,
                                 char *reason, size_t reason_len, int *retry_after_s);
/* Count a refusal decided on by dsq_admission_decide (engine.c knows
 * which were at submit and which after waiting). */
void dsq_admission_count_refusal(dsq_admission_t *a, bool after_wait);

/* Observations: a request's time to first token (submit to the first
 * token, ms); the duration of one step that ran decode rows (ms). */
void dsq_admission_observe_ttft(dsq_admission_t *a, double ttft_ms);
void dsq_admission_observe_itl(dsq_admission_t *a, double step_ms);
/* Once per step: note n_inflight and, when a window has ended, move L.
 * Returns whether L changed. */
bool dsq_admission_tick(dsq_admission_t *a, double now_ms, int n_inflight);

void dsq_admission_stats(dsq_admission_t *a, dsq_admission_stats_t *out);

#endif

/* A request's way from dsq_engine_submit to the scheduler. HTTP threads
 * put it on the engine's submit queue under e->mu and wake the loop with
 * uv_async_send, which coalesces, so the engine thread drains the whole
 * queue each time. The engine thread then admits each request: at once
 * under the static admission policy, or under the adaptive one
 * (admission.h) after holding it back, oldest first, until the policy lets
 * it run or refuses it. Admission makes the request's first choice; the
 * others are forked from it once the prompt is computed (choice.c).
 */
#include "engine_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include <openssl/rand.h>

#include "engine/common/clock.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/kv/kv_cache.h"
#include "admission.h"
#include "sampler.h"
#include "scheduler.h"

/* End a request that never entered the scheduler (refused by
 * the policy, or cancelled while held back): publish sends each choice's
 * final event (ABORT; queue_timeout when refused) and drops it. */
void dsq__end_unadmitted(dsq_engine_t *e, dsq_req_t *r, bool refused)
{
    r->queue_timeout = refused;
    r->n_seqs = 0;
    r->n_live = 0;
    r->counted_waiting = true;     /* submit counted it in n_waiting */
    dsq__active_add(e, r);
}

/* Move one submitted request into the scheduler. */
static void admit_one(dsq_engine_t *e, dsq_req_t *r)
{
    if (atomic_exchange(&r->adm_held, false) && r->notify)
        r->notify(r, r->user);     /* a streamed answer may start (dsq_req_held) */
    {
        r->admitted = true;
        atomic_fetch_add(&e->n_inflight, 1);
        atomic_fetch_add(&e->reserved_tokens, r->need_tokens);
        eseq_t *s = dsq__eseq_create(e, r, 0);
        int rc = s ? DSQ_OK : DSQ_ENOMEM;
        if (s) {
            s->seq.order = e->next_order++;
            for (int j = 0; j < r->n_prompt && !rc; j++)
                rc = dsq__seq_append(&s->seq, r->prompt[j]);
            s->seq.n_prompt = r->n_prompt;
            s->seq.n_max_tokens = r->n_prompt + r->sp.max_tokens;
            /* cached positions produce no logits */
            s->seq.no_prefix_cache = r->sp.prompt_logprobs;
            s->seq.prompt_logits = r->sp.prompt_logprobs;
            uint64_t seed = r->sp.seed;
            if (!r->sp.has_seed && RAND_bytes((unsigned char *)&seed, sizeof(seed)) != 1)
                seed = (uint64_t)dsq_clock_now_s() ^ r->id;
            dsq_rng_seed(&s->rng, seed);
        }
        dsq_log(DSQ_LOG_DEBUG, "event=admit req=%llu n_prompt=%d queued_ms=%.2f",
                (unsigned long long)r->id, r->n_prompt, (dsq_clock_now_s() - r->t_arrival) * 1e3);
        r->seqs[0] = s;
        r->n_seqs = s ? 1 : 0;
        r->n_live = s ? 1 : 0;
        r->counted_waiting = true;
        dsq__active_add(e, r);
        if (!rc)
            rc = dsq_sched_add(e->sched, &s->seq);
        if (rc) {
            dsq_log(DSQ_LOG_ERROR, "event=admit_failed req=%llu err=%s",
                    (unsigned long long)r->id, dsq_strerror(rc));
            if (s) {
                s->seq.state = DSQ_SEQ_DETACHED;
                dsq__finish_seq(e, s, DSQ_FINISH_ABORT, true);
            }
        }
    }
}

/* End the held-back requests that need no decision, wherever
 * they are in the queue (cancelled: the client left; past --max-queue-wait),
 * so they never count as waiting in front of a new one. */
static void reap_pending(dsq_engine_t *e, double t)
{
    int w = 0;
    for (int k = 0; k < e->pend_n; k++) {
        dsq_req_t *r = e->pend[k];
        if (atomic_load(&r->cancelled)) {
            dsq__end_unadmitted(e, r, false);
        } else if (e->o.max_queue_wait_s > 0 && t - r->t_arrival > e->o.max_queue_wait_s) {
            /* --max-queue-wait applies to held-back requests as well */
            pthread_mutex_lock(&e->mu);
            e->stats.queue_timeouts_total++;
            pthread_mutex_unlock(&e->mu);
            dsq_log(DSQ_LOG_INFO, "event=queue_timeout req=%llu waited_ms=%.0f "
                    "reason=\"not admitted within --max-queue-wait\"",
                    (unsigned long long)r->id, (t - r->t_arrival) * 1e3);
            dsq__end_unadmitted(e, r, true);
        } else {
            e->pend[w++] = r;
            continue;
        }
        atomic_fetch_sub(&e->n_pending, 1);
    }
    e->pend_n = w;
}

/* Decide on the held-back requests, oldest first, until one
 * has to wait (arrival order is kept: none overtakes an older one). */
static void admit_pending(dsq_engine_t *e)
{
    double t = dsq_clock_now_s();
    reap_pending(e, t);
    int k = 0;
    for (; k < e->pend_n; k++) {
        dsq_req_t *r = e->pend[k];
        char why[200] = "";
        int retry = 0;
        dsq_admission_view_t v = {
            .n_inflight = atomic_load(&e->n_inflight), .n_queued = e->pend_n - k - 1,
            .reserved_tokens = atomic_load(&e->reserved_tokens),
            .need_tokens = r->need_tokens, .kv_tokens = e->kv_tokens,
            .wait_ms = (t - r->t_arrival) * 1e3, .held = true};
        dsq_admit_t d = dsq_admission_decide(e->adm, &v, why, sizeof(why), &retry);
        if (d == DSQ_ADMIT_QUEUE)
            break;
        if (d == DSQ_ADMIT_RUN) {
            admit_one(e, r);
        } else {
            dsq_admission_count_refusal(e->adm, true);
            pthread_mutex_lock(&r->mu);
            snprintf(r->refusal, sizeof(r->refusal), "%s", why);
            r->retry_after_s = retry;
            pthread_mutex_unlock(&r->mu);
            dsq_log(DSQ_LOG_INFO, "event=admission_refused req=%llu waited_ms=%.0f "
                    "reason=\"%s\"", (unsigned long long)r->id, (t - r->t_arrival) * 1e3,
                    why);
            dsq__end_unadmitted(e, r, true);
        }
        atomic_fetch_sub(&e->n_pending, 1);
    }
    if (k > 0) {
        memmove(e->pend, e->pend + k, (size_t)(e->pend_n - k) * sizeof(*e->pend));
        e->pend_n -= k;
    }
}

void dsq__admit_new(dsq_engine_t *e)
{
    dsq_req_t **q;
    int n;
    pthread_mutex_lock(&e->mu);
    q = e->subq;
    n = e->subq_n;
    e->subq = NULL;
    e->subq_n = e->subq_cap = 0;
    pthread_mutex_unlock(&e->mu);
    bool adaptive = dsq_admission_kind(e->adm) == DSQ_ADMISSION_ADAPTIVE;
    for (int i = 0; i < n; i++) {
        dsq_req_t *r = q[i];
        if (!adaptive) {
            admit_one(e, r);
            continue;
        }
        if (e->pend_n == e->pend_cap) {
            int cap = e->pend_cap ? e->pend_cap * 2 : 64;
            dsq_req_t **p = realloc(e->pend, (size_t)cap * sizeof(*p));
            if (!p) {
                /* no memory to hold it back: it runs (the scheduler
                 * still bounds what is computed) */
                atomic_fetch_sub(&e->n_pending, 1);
                admit_one(e, r);
                continue;
            }
            e->pend = p;
            e->pend_cap = cap;
        }
        e->pend[e->pend_n++] = r;
    }
    free(q);
    if (adaptive)
        admit_pending(e);
}

/* The most KV cache a request can take, in tokens of whole
 * blocks (the KV cache hands out blocks, kv_cache.h): its prompt's full
 * blocks, which its choices share after the fork (dsq_kv_seq_fork), plus for each
 * of max(n, best_of) choices the blocks from there to prompt + max_tokens
 * (a choice's copy of the prompt's partial last block included). */
static int64_t kv_need_tokens(const dsq_engine_t *e, const dsq_req_t *r)
{
    int64_t bs = dsq_kv_block_size(e->kv);
    int64_t total = (int64_t)r->n_prompt + (r->sp.max_tokens > 0 ? r->sp.max_tokens : 0);
    int64_t shared = r->n_prompt / bs;
    int64_t own = (total + bs - 1) / bs - shared;
    return (shared + (int64_t)dsq__req_n_total(r) * own) * bs;
}

int dsq_engine_submit(dsq_engine_t *e, dsq_req_t *r)
{
    int rc = DSQ_OK;
    if ((int64_t)r->n_prompt + r->sp.max_tokens > e->max_model_len)
        return DSQ_ERANGE;
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->n_vocab)
            return DSQ_EINVAL;
    if (atomic_exchange(&r->submitted, true))
        return DSQ_ESTATE;
    r->need_tokens = kv_need_tokens(e, r);
    int max_wait = dsq_engine_max_waiting(e);
    pthread_mutex_lock(&e->mu);
    /* the waiting cap counts the requests that truly wait: the unscheduled
     * ones (the admission window's burst included) less those a free run
     * slot awaits */
    int n_wait = atomic_load(&e->n_waiting) - atomic_load(&e->n_free_slots);
    if (e->stopping) {
        rc = DSQ_ESTATE;
    } else if (n_wait >= max_wait) {
        rc = DSQ_EFULL;
    } else if (dsq_admission_kind(e->adm) == DSQ_ADMISSION_ADAPTIVE) {
        /* the admission policy may refuse at once; what it takes is held
         * back (the engine thread admits it in order, admit_pending) */
        char why[200] = "";
        int retry = 0;
        dsq_admission_view_t v = {
            .n_inflight = atomic_load(&e->n_inflight), .n_queued = atomic_load(&e->n_pending),
            .reserved_tokens = atomic_load(&e->reserved_tokens), .need_tokens = r->need_tokens,
            .kv_tokens = e->kv_tokens};
        if (dsq_admission_decide(e->adm, &v, why, sizeof(why), &retry) == DSQ_ADMIT_REFUSE) {
            dsq_admission_count_refusal(e->adm, false);
            pthread_mutex_lock(&r->mu);
            snprintf(r->refusal, sizeof(r->refusal), "%s", why);
            r->retry_after_s = retry;
            pthread_mutex_unlock(&r->mu);
            rc = DSQ_EFULL;
        }
    }
    if (!rc && !e->stopping) {
        if (e->subq_n == e->subq_cap) {
            int cap = e->subq_cap ? e->subq_cap * 2 : 16;
            dsq_req_t **q = realloc(e->subq, (size_t)cap * sizeof(*q));
            if (!q)
                rc = DSQ_ENOMEM;
            else {
                e->subq = q;
                e->subq_cap = cap;
            }
        }
        if (!rc) {
            dsq_req_ref(r);
            r->eng = e;
            r->t_arrival = dsq_clock_now_s();
            r->tl.t_submit = r->t_arrival;     /* not yet shared: no lock */
            e->t_last_submit = r->t_arrival;   /* the admission window's */
            e->subq[e->subq_n++] = r;
            atomic_fetch_add(&e->n_waiting, 1);
            if (dsq_admission_kind(e->adm) == DSQ_ADMISSION_ADAPTIVE) {
                atomic_fetch_add(&e->n_pending, 1);
                atomic_store(&r->adm_held, true);
            }
        }
    }
    pthread_mutex_unlock(&e->mu);
    if (rc)
        atomic_store(&r->submitted, false);
    else
        uv_async_send(&e->async);
    return rc;
}

void dsq_engine_cancel(dsq_engine_t *e, dsq_req_t *r)
{
    if (!atomic_exchange(&r->cancelled, true))
        uv_async_send(&e->async);
}

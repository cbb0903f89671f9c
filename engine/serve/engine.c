/* The engine thread: one libuv loop that owns the model, the KV cache and
 * the scheduler, and runs the steps.
 *
 * Hand-off (docs/architecture.md, "One request"): dsq_engine_submit()
 * puts a request on a locked queue and wakes the loop with uv_async_send
 * (which coalesces), so the async callback drains the whole queue. While
 * there is work an idle handle runs one step per loop iteration; without
 * work the loop sleeps in epoll. Output goes the other way through a
 * per-request locked queue and the request's notify callback.
 * Cancellation is an atomic flag on the request plus a wake-up; the engine
 * frees the request's KV blocks at the next step.
 *
 * A step (engine_step): admit submitted requests (submit.c), hold those
 * whose reader is behind, reap cancelled ones, plan the batch, run the
 * forward pass while the mask worker makes the grammar masks
 * (mask_worker.c), score prompt logprobs (prompt_logprobs.c), sample each
 * choice (choice.c), then publish the events and free what ended.
 * Creation, the memory plan and destruction are in engine_setup.c.
 */
#include "engine.h"
#include "engine_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "engine/backend/backend.h"
#include "engine/common/clock.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "admission.h"
#include "scheduler.h"
#include "step_cost.h"

void dsq__active_add(dsq_engine_t *e, dsq_req_t *r)
{
    r->next_active = e->active;
    r->prev_active = NULL;
    if (e->active)
        e->active->prev_active = r;
    e->active = r;
}

static void active_remove(dsq_engine_t *e, dsq_req_t *r)
{
    if (r->prev_active)
        r->prev_active->next_active = r->next_active;
    else
        e->active = r->next_active;
    if (r->next_active)
        r->next_active->prev_active = r->prev_active;
}

/* best_of > n. Candidates' events accumulate in their pending event
 * until every candidate ended; then the n with the highest cum_logprob are
 * renumbered 0..n-1 (best first, stable) and flushed, the others dropped
 * with their token count reported as discarded_tokens. Returns whether
 * anything was queued. */
static bool publish_best_of(dsq_req_t *r)
{
    if (r->n_live > 0)
        return false;
    int n = r->n_seqs < r->sp.n ? r->n_seqs : r->sp.n;
    int discarded = 0;
    /* selection sort of the first n places by cum_logprob, stable */
    for (int k = 0; k < n; k++) {
        int best = k;
        for (int i = k + 1; i < r->n_seqs; i++)
            if (r->seqs[i]->cum_logprob > r->seqs[best]->cum_logprob)
                best = i;
        eseq_t *t = r->seqs[best];
        memmove(r->seqs + k + 1, r->seqs + k, (size_t)(best - k) * sizeof(*r->seqs));
        r->seqs[k] = t;
    }
    for (int i = n; i < r->n_seqs; i++)
        discarded += r->seqs[i]->n_generated;
    for (int k = 0; k < n; k++) {
        eseq_t *s = r->seqs[k];
        s->seq.index = k;
        if (k == 0)
            s->ev.discarded_tokens = discarded;
        dsq__flush_event(s);
    }
    return true;
}

/* Deliver events, notify, and release requests whose choices all ended. */
static void publish(dsq_engine_t *e)
{
    dsq_req_t *r = e->active;
    while (r) {
        dsq_req_t *next = r->next_active;
        bool any = false;
        if (dsq__req_n_total(r) > r->sp.n)
            any = publish_best_of(r);
        for (int i = 0; i < r->n_seqs && dsq__req_n_total(r) <= r->sp.n; i++) {
            eseq_t *s = r->seqs[i];
            if (s->ev.n_tokens || s->ev_text_len || s->ev.finish) {
                dsq__flush_event(s);
                any = true;
            }
        }
        if (r->n_live == 0) {
            /* choices never created (abort before the fork, or max_tokens
             * 0: nothing to generate, the fork is skipped) still need a
             * final event each */
            for (int i = r->n_seqs < r->sp.n ? r->n_seqs : r->sp.n; i < r->sp.n; i++) {
                dsq_output_t ev = {0};
                ev.index = i;
                ev.text = strdup("");
                ev.finish = r->scored ? DSQ_FINISH_LENGTH : DSQ_FINISH_ABORT;
                ev.queue_timeout = r->queue_timeout;
                ev.prompt_tokens = r->n_prompt;
                dsq__req_push(r, &ev);
                any = true;
            }
        }
        if (any && r->notify)
            r->notify(r, r->user);
        if (r->n_live == 0) {
            if (r->counted_waiting)
                atomic_fetch_sub(&e->n_waiting, 1);
            r->counted_waiting = false;
            if (r->admitted) {
                r->admitted = false;
                atomic_fetch_sub(&e->n_inflight, 1);
                atomic_fetch_sub(&e->reserved_tokens, r->need_tokens);
            }
            active_remove(e, r);
            for (int i = 0; i < r->n_seqs; i++)
                dsq__eseq_destroy(r->seqs[i]);
            r->n_seqs = 0;
            dsq_req_unref(r);
        }
        r = next;
    }
}

void dsq__update_stats(dsq_engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    e->stats.n_running = dsq_sched_n_running(e->sched);
    e->stats.n_waiting = atomic_load(&e->n_waiting);
    e->stats.kv_blocks_total = dsq_kv_n_blocks(e->kv);
    e->stats.kv_blocks_used = dsq_kv_n_blocks(e->kv) - dsq_kv_n_free(e->kv);
    e->stats.preemptions_total = dsq_sched_n_preemptions(e->sched);
    e->stats.n_held = e->n_held;
    atomic_store(&e->n_free_slots, dsq_sched_n_free_slots(e->sched));
    dsq_sched_prefix_stats(e->sched, &e->stats.prefix_cache_queries_total,
                           &e->stats.prefix_cache_hits_total);
    if (e->draft) {
        dsq_draft_info_t di;
        dsq_draft_info(e->draft, &di);
        e->stats.draft_weight_bytes = (int64_t)di.weight_bytes;
        e->stats.draft_kv_blocks = di.kv_blocks;
        e->stats.draft_kv_free = di.kv_free;
        e->stats.draft_tokens_total = di.tokens_computed;
        e->stats.draft_evictions_total = di.evictions;
    }
    if (e->stats.device_planned_bytes > 0) {
        e->stats.device_allocated_bytes = (int64_t)dsq_backend_allocated_bytes(e->be);
        e->stats.device_peak_bytes = (int64_t)dsq_backend_peak_bytes(e->be);
    }
    pthread_mutex_unlock(&e->mu);
}

/* max_queue_wait_s: a request never scheduled that long after
 * its submit is cancelled, marked so that its final events say why. */
static void expire_waiting(dsq_engine_t *e)
{
    double t = dsq_clock_now_s();
    if (e->o.max_queue_wait_s <= 0)
        return;
    for (dsq_req_t *r = e->active; r; r = r->next_active) {
        if (r->t_sched > 0 || !r->counted_waiting || atomic_load(&r->cancelled) ||
            t - r->t_arrival <= e->o.max_queue_wait_s)
            continue;
        r->queue_timeout = true;
        atomic_store(&r->cancelled, true);
        pthread_mutex_lock(&e->mu);
        e->stats.queue_timeouts_total++;
        pthread_mutex_unlock(&e->mu);
        dsq_log(DSQ_LOG_INFO, "event=queue_timeout req=%llu waited_ms=%.0f "
                "reason=\"not scheduled within --max-queue-wait\"",
                (unsigned long long)r->id, (t - r->t_arrival) * 1e3);
    }
}

/* The step budget (engine.h step_budget_ms). Every step's
 * forward time is fed to the step cost model (step_cost.h: fixed + per row
 * + per attention pair, fitted online), and the scheduler sizes the next
 * step's prefill chunks by predicted time (dsq_sched_set_step_budget).
 * Until three steps were measured the prefill is capped at 16, 32, 64
 * tokens. */
static void set_prefill_cap(dsq_engine_t *e)
{
    double budget = e->o.step_budget_ms == 0 ? 250.0 : e->o.step_budget_ms;
    if (budget < 0)
        return;
    dsq_step_cost_t c;
    if (dsq_step_cost_model(&e->step_fit, &c)) {
        dsq_sched_set_prefill_cap(e->sched, 0);
        dsq_sched_set_step_budget(e->sched, budget, &c);
    } else {
        /* no fit yet: 16 prompt tokens, doubling with each measured step
         * (as the trust region grows once there is one) */
        dsq_sched_set_prefill_cap(e->sched, 16 << (int)e->step_fit.n);
    }
}

/* Attention pairs of a planned step (step_cost.h): sum of position + 1. */
static int64_t step_pairs(const dsq_sched_out_t *out)
{
    int64_t pairs = 0;
    for (int i = 0; i < out->n_tokens; i++)
        pairs += (int64_t)out->pos[i] + 1;
    return pairs;
}

/* Backpressure. A request whose undelivered output (events
 * queued, not popped by its reader) reaches max_undelivered_bytes is held:
 * its sequences are paused (not scheduled, KV kept) until the reader has
 * popped it down to half; held for undelivered_timeout_s, it is aborted
 * with a logged reason. Returns the number of requests held. */
static int hold_unread(dsq_engine_t *e)
{
    int64_t hi = e->o.max_undelivered_bytes > 0 ? e->o.max_undelivered_bytes : 16 * 1024;
    double tmo = e->o.undelivered_timeout_s == 0 ? 30.0 : e->o.undelivered_timeout_s;
    double t = dsq_clock_now_s();
    int n_held = 0;
    for (dsq_req_t *r = e->active; r; r = r->next_active) {
        if (atomic_load(&r->cancelled))
            continue;
        pthread_mutex_lock(&r->mu);
        int64_t b = r->q_bytes;
        pthread_mutex_unlock(&r->mu);
        bool was = atomic_load(&r->held);
        bool hold = b >= hi || (was && b > hi / 2);
        if (hold && !was) {
            r->t_held = t;
            dsq_log(DSQ_LOG_DEBUG, "event=hold req=%llu undelivered_bytes=%lld",
                    (unsigned long long)r->id, (long long)b);
        }
        if (hold && tmo > 0 && t - r->t_held > tmo) {
            dsq_log(DSQ_LOG_INFO, "event=abort req=%llu undelivered_bytes=%lld held_s=%.1f "
                    "reason=\"the client did not read its stream\"",
                    (unsigned long long)r->id, (long long)b, t - r->t_held);
            atomic_store(&r->cancelled, true);
            hold = false;
            pthread_mutex_lock(&e->mu);
            e->stats.stream_stall_aborts_total++;
            pthread_mutex_unlock(&e->mu);
        }
        atomic_store(&r->held, hold);
        for (int i = 0; i < r->n_seqs; i++)
            r->seqs[i]->seq.paused = hold;
        n_held += hold;
    }
    return n_held;
}

static void reap_cancelled(dsq_engine_t *e)
{
    expire_waiting(e);
    for (dsq_req_t *r = e->active; r; r = r->next_active) {
        if (!atomic_load(&r->cancelled))
            continue;
        for (int i = 0; i < r->n_seqs; i++)
            dsq__finish_seq(e, r->seqs[i], DSQ_FINISH_ABORT, true);
    }
}

/* Add the step [t_start, t_end] to the timelines of the requests it
 * ran: a prefill chunk per prefilling choice, a decode step per request
 * that decoded. One lock of each request's mutex per scheduled choice. */
static void timeline_step(dsq_engine_t *e, const dsq_sched_out_t *out, double t_start,
                          double t_end)
{
    e->n_steps++;
    for (int i = 0; i < out->n_seqs; i++) {
        eseq_t *s = (eseq_t *)out->seqs[i]->owner;
        dsq_req_t *r = s->req;
        dsq_req_timeline_t *tl = &r->tl;
        pthread_mutex_lock(&r->mu);
        if (tl->t_sched == 0)
            tl->t_sched = t_start;       /* the queue wait ends as this step begins */
        if (tl->t_first_token == 0)
            tl->t_first_token = r->t_first_token;
        if (s->step_prefill > 0) {
            dsq_req_chunk_t *c = NULL;
            if (tl->n_chunks < DSQ_REQ_MAX_CHUNKS) {
                c = &tl->chunks[tl->n_chunks++];
                *c = (dsq_req_chunk_t){.t_start = t_start, .pos = s->step_pos,
                                       .index = s->seq.index};
            } else {
                c = &tl->chunks[DSQ_REQ_MAX_CHUNKS - 1];
                tl->n_chunks_merged++;
            }
            c->t_end = t_end;
            c->n_tokens += s->step_prefill;
        }
        if (s->step_decode && r->tl_step != e->n_steps) {
            r->tl_step = e->n_steps;
            tl->n_decode_steps++;
        }
        pthread_mutex_unlock(&r->mu);
    }
}

/* One scheduler step: plan, forward, sample, publish. Returns true when
 * there may be more work. */
static bool engine_step(dsq_engine_t *e)
{
    dsq_sched_out_t out;
    /* step timings by composition, logged at debug level */
    bool timed = DSQ_LOG_DEBUG <= dsq_log_threshold;
    double t0 = dsq_clock_now_s(), t_fwd = 0, t_smp = 0;
    dsq__admit_new(e);
    e->n_held = hold_unread(e);
    reap_cancelled(e);
    set_prefill_cap(e);
    if (e->o.spec_k > 0)
        dsq__spec_propose(e);
    int rc = dsq_sched_step(e->sched, &out);
    /* the submit cap's view of the run slots: the requests this step
     * schedules leave n_waiting below, so the slots they took go now */
    atomic_store(&e->n_free_slots, dsq_sched_n_free_slots(e->sched));
    int64_t pairs = rc == DSQ_OK ? step_pairs(&out) : 0;
    double predicted_ms = -1;
    dsq_step_cost_t cost;
    if (timed && dsq_step_cost_model(&e->step_fit, &cost))
        predicted_ms = dsq_step_cost_predict(&cost, out.n_tokens, pairs);
    int n_x = 0;                   /* prompt-logprob rows */
    if (rc == DSQ_OK && out.n_tokens > 0)
        rc = dsq__plp_collect(e, &out, &n_x);
    if (rc == DSQ_OK && out.n_tokens > 0) {
        if (out.n_logits + n_x > e->logits_cap) {
            float *p = realloc(e->logits, (size_t)(out.n_logits + n_x) * (size_t)e->n_vocab *
                                          sizeof(float));
            if (p) {
                e->logits = p;
                e->logits_cap = out.n_logits + n_x;
            } else {
                rc = DSQ_ENOMEM;
            }
        }
        for (int i = 0; i < out.n_seqs && !rc; i++) {
            eseq_t *s = (eseq_t *)out.seqs[i]->owner;
            if (s->req->t_sched == 0)
                s->req->t_sched = dsq_clock_now_s();
            if (s->req->counted_waiting) {
                s->req->counted_waiting = false;
                atomic_fetch_sub(&e->n_waiting, 1);
            }
            s->step_prefill = 0;
            s->step_decode = s->seq.n_computed >= s->seq.n_prompt;
            if (s->seq.n_computed < s->seq.n_prompt) {
                int n = s->seq.sched_tokens;
                if (s->seq.n_computed + n > s->seq.n_prompt)
                    n = s->seq.n_prompt - s->seq.n_computed;
                s->step_prefill = n;
                s->step_pos = s->seq.n_computed;
                pthread_mutex_lock(&e->mu);
                e->stats.prompt_tokens_total += n;
                pthread_mutex_unlock(&e->mu);
            }
        }
        if (!rc && out.n_seqs > e->seq_dec_cap) {
            uint8_t *p = realloc(e->seq_dec, (size_t)out.n_seqs);
            if (p) {
                e->seq_dec = p;
                e->seq_dec_cap = out.n_seqs;
            } else {
                rc = DSQ_ENOMEM;
            }
        }
        /* a decoding sequence's rows (its pending token, and drafts) are
         * attended as decode rows: the bits plain decoding gives */
        for (int i = 0; !rc && i < out.n_seqs; i++)
            e->seq_dec[i] = out.seqs[i]->n_computed >= out.seqs[i]->n_prompt;
        if (!rc) {
            dsq_batch_t b = {
                .n_tokens = out.n_tokens, .tokens = out.tokens, .pos = out.pos,
                .row_seq = out.row_seq, .slot = out.slot, .n_seqs = out.n_seqs,
                .block_tables = out.block_tables, .max_blocks = out.max_blocks,
                .n_logits = out.n_logits + n_x,
                .logit_rows = n_x ? e->lrows : out.logit_rows,
                .seq_decode = e->seq_dec,
            };
            /* the grammar masks are made while the forward pass runs */
            bool masks = dsq__mask_worker_post(e, &out);
            t_fwd = dsq_clock_now_s();
            rc = dsq_model_forward(e->model, e->kv, &b, e->logits);
            t_smp = dsq_clock_now_s();
            if (masks)
                dsq__mask_worker_wait(e);
            if (!rc)
                dsq_step_cost_observe(&e->step_fit, out.n_tokens, pairs, (t_smp - t_fwd) * 1e3);
        }
        if (!rc) {
            dsq_sched_commit(e->sched, &out);
            for (int j = 0; j < n_x; j++)
                dsq__plp_store(e, e->xseq[j], e->xpos[j],
                          e->logits + (size_t)(out.n_logits + j) * (size_t)e->n_vocab);
            for (int i = 0, n_rows = 1; i < out.n_logits; i += n_rows) {
                eseq_t *s = (eseq_t *)out.logit_seqs[i]->owner;
                const float *row = e->logits + (size_t)i * (size_t)e->n_vocab;
                dsq_req_t *r = s->req;
                /* a choice with drafts has a row for each (speculate.c) */
                for (n_rows = 1; i + n_rows < out.n_logits &&
                                 out.logit_seqs[i + n_rows] == out.logit_seqs[i]; n_rows++)
                    ;
                if (s->finished)
                    continue;
                if (n_rows > 1) {
                    if ((rc = dsq__spec_verify(e, s, row, n_rows)) != DSQ_OK)
                        break;
                    continue;
                }
                if (r->sp.max_tokens == 0) {
                    r->scored = true;
                    dsq__finish_seq(e, s, DSQ_FINISH_LENGTH, false);
                    continue;
                }
                if (dsq__req_n_total(r) > 1 && !r->forked &&
                    (rc = dsq__fork_choices(e, r)) != DSQ_OK)
                    break;
                if (s->seq.index == 0 && r->forked && r->n_seqs > 1 &&
                    s->n_generated == 0) {
                    /* first token of every choice comes from the same logits */
                    for (int c = 0; c < r->n_seqs && !rc; c++)
                        rc = dsq__sample_seq(e, r->seqs[c], row);
                } else {
                    rc = dsq__sample_seq(e, s, row);
                }
                if (rc)
                    break;
            }
            /* the MTP module follows the rows just computed (its KV) and
             * drafts for the next step */
            if (!rc && e->o.spec_mtp)
                dsq__spec_mtp(e, &out);
        }
        if (!rc) {
            double t_done = dsq_clock_now_s();
            bool decoded = false;
            timeline_step(e, &out, t0, t_done);
            for (int i = 0; i < out.n_seqs && !decoded; i++)
                decoded = ((eseq_t *)out.seqs[i]->owner)->step_decode;
            /* a step with decode rows is one inter-token gap (the
             * adaptive admission policy's ITL) */
            if (decoded)
                dsq_admission_observe_itl(e->adm, (t_done - t0) * 1e3);
        }
        if (rc) {
            dsq_log(DSQ_LOG_ERROR, "event=step_failed err=%s n_tokens=%d",
                    dsq_strerror(rc), out.n_tokens);
            /* every choice of each request in the step: choices forked in
             * this step are running but not in out.seqs, and a request with
             * one choice left unfinished would never complete */
            for (int i = 0; i < out.n_seqs; i++) {
                dsq_req_t *fr = ((eseq_t *)out.seqs[i]->owner)->req;
                dsq__finish_seq(e, (eseq_t *)out.seqs[i]->owner, DSQ_FINISH_ABORT, true);
                for (int c = 0; c < fr->n_seqs; c++)
                    if (fr->seqs[c])
                        dsq__finish_seq(e, fr->seqs[c], DSQ_FINISH_ABORT, true);
            }
        }
    }
    if (n_x > 0) {
        /* a prompt-logprob prefill needed one logits row per prompt
         * token (chunk x n_vocab floats); give that memory back */
        free(e->logits);
        e->logits = NULL;
        e->logits_cap = 0;
    }
#ifndef NDEBUG
    if (!dsq_sched_check(e->sched))
        dsq_log(DSQ_LOG_ERROR, "event=kv_invariant_broken");
#endif
    /* decode rows: sequences past their prompt (counted before publish,
     * which frees finished ones); the rest is prefill */
    int n_dec = 0;
    for (int i = 0; timed && rc == DSQ_OK && i < out.n_seqs; i++) {
        int end = i + 1 < out.n_seqs ? out.seqs[i + 1]->sched_row : out.n_tokens;
        n_dec += end - out.seqs[i]->sched_row == 1 &&
                 out.seqs[i]->n_computed > out.seqs[i]->n_prompt;
    }
    double t_pub = timed ? dsq_clock_now_s() : 0;
    publish(e);
    dsq__update_stats(e);
    if (timed && rc == DSQ_OK && out.n_tokens > 0) {
        double t1 = dsq_clock_now_s();
        dsq_log(DSQ_LOG_DEBUG,
                "event=step n_seqs=%d n_decode=%d n_prefill_tokens=%d n_tokens=%d "
                "n_waiting=%d sched_ms=%.2f forward_ms=%.2f predicted_ms=%.2f sample_ms=%.2f "
                "publish_ms=%.2f step_ms=%.2f attention_pairs=%lld",
                out.n_seqs, n_dec, out.n_tokens - n_dec, out.n_tokens,
                dsq_sched_n_waiting(e->sched), (t_fwd - t0) * 1e3, (t_smp - t_fwd) * 1e3,
                predicted_ms, (t_pub - t_smp) * 1e3, (t1 - t_pub) * 1e3, (t1 - t0) * 1e3,
                (long long)pairs);
    }
    if (dsq_admission_tick(e->adm, dsq_clock_now_s() * 1e3, atomic_load(&e->n_inflight))) {
        dsq_admission_stats_t as;
        dsq_admission_stats(e->adm, &as);
        dsq_log(DSQ_LOG_DEBUG, "event=admission_limit limit=%.2f inflight=%d held=%d "
                "ttft_p90_ms=%.1f itl_p90_ms=%.1f reason=\"%s\"", as.limit,
                atomic_load(&e->n_inflight), e->pend_n, as.window_ttft_p90_ms,
                as.window_itl_p90_ms, as.reason);
    }
    bool more = dsq_sched_n_running(e->sched) + dsq_sched_n_waiting(e->sched) + e->pend_n > 0;
    if (more && rc == DSQ_OK && out.n_tokens == 0 && e->n_held > 0) {
        /* only held requests are left: sleep until a reader
         * pops (dsq__wake_engine), a submit or cancel, or the next check */
        e->held_idle = true;
        return false;
    }
    return more;
}

static void on_idle(uv_idle_t *h);

/* Any thread: e.g. a held request's reader popped output. */
void dsq__wake_engine(dsq_engine_t *e)
{
    uv_async_send(&e->async);
}

/* Milliseconds to hold back the first step of a burst. With nothing
 * running, new requests wait until no request arrived and no step ended for
 * window_ms (at most 10 x window_ms after the first wait): clients answered
 * in the same step (closed loops, agents) send their next requests within
 * milliseconds of each other, and a long prefill step started on the first
 * of them would leave the rest, and their streams for the rest of the run,
 * one prefill behind, each group stalling the other's decodes. Waiting
 * also leaves the CPUs to the HTTP threads that deliver those answers. */
static int burst_wait_ms(dsq_engine_t *e)
{
    if (e->window_ms <= 0 || dsq_sched_n_running(e->sched) > 0) {
        e->t_burst = 0;
        return 0;
    }
    pthread_mutex_lock(&e->mu);
    int n_new = e->subq_n;
    double t_sub = e->t_last_submit;
    pthread_mutex_unlock(&e->mu);
    if (n_new == 0 && dsq_sched_n_waiting(e->sched) == 0)
        return 0;
    double now = dsq_clock_now_s(), w = e->window_ms * 1e-3;
    if (e->t_burst == 0)
        e->t_burst = now;
    double last = t_sub > e->t_last_step ? t_sub : e->t_last_step;
    double left = last + w - now;
    if (e->t_burst + 10 * w - now < left)
        left = e->t_burst + 10 * w - now;
    if (left <= 0) {
        e->t_burst = 0;
        return 0;
    }
    return (int)ceil(left * 1e3);
}

static void on_burst(uv_timer_t *h)
{
    dsq_engine_t *e = h->data;
    if (!e->idle_on) {
        uv_idle_start(&e->idle, on_idle);
        e->idle_on = true;
    }
}

static void on_idle(uv_idle_t *h)
{
    dsq_engine_t *e = h->data;
    int wait_ms = burst_wait_ms(e);
    if (wait_ms > 0) {
        uv_idle_stop(&e->idle);
        e->idle_on = false;
        uv_timer_start(&e->burst, on_burst, (uint64_t)wait_ms, 0);
        return;
    }
    /* test-only wedge (debug builds), once, on the first step */
    if (e->wedge_ms > 0) {
        struct timespec ts = {e->wedge_ms / 1000, (long)(e->wedge_ms % 1000) * 1000000L};
        dsq_log(DSQ_LOG_WARN, "event=engine_wedged_for_test ms=%d", e->wedge_ms);
        e->wedge_ms = 0;
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    bool busy = engine_step(e);
    e->t_last_step = dsq_clock_now_s();
    if (!busy && e->held_idle) {
        /* every request left is held (hold_unread): look again
         * in 100 ms (timeouts) unless a reader's pop wakes the loop first */
        e->held_idle = false;
        uv_idle_stop(&e->idle);
        e->idle_on = false;
        uv_timer_start(&e->burst, on_burst, 100, 0);
        return;
    }
    if (!busy) {
        pthread_mutex_lock(&e->mu);
        bool more = e->subq_n > 0;
        pthread_mutex_unlock(&e->mu);
        if (!more) {
            uv_idle_stop(&e->idle);
            e->idle_on = false;
        }
    }
}

static void abort_all(dsq_engine_t *e)
{
    dsq__admit_new(e);
    for (int k = 0; k < e->pend_n; k++) {     /* held back by the policy */
        dsq__end_unadmitted(e, e->pend[k], false);
        atomic_fetch_sub(&e->n_pending, 1);
    }
    e->pend_n = 0;
    for (dsq_req_t *r = e->active; r; r = r->next_active)
        for (int i = 0; i < r->n_seqs; i++)
            dsq__finish_seq(e, r->seqs[i], DSQ_FINISH_ABORT, true);
    publish(e);
    dsq__update_stats(e);
}

static void on_close(uv_handle_t *h)
{
    (void)h;
}

/* The watchdog heartbeat (engine.h heartbeat), on the engine thread, so
 * that it stops when a step hangs. */
static void on_heartbeat(uv_timer_t *h)
{
    dsq_engine_t *e = h->data;
    e->o.heartbeat(e->o.heartbeat_user);
}

static void on_async(uv_async_t *h)
{
    dsq_engine_t *e = h->data;
    pthread_mutex_lock(&e->mu);
    bool stopping = e->stopping;
    pthread_mutex_unlock(&e->mu);
    if (stopping) {
        abort_all(e);
        uv_idle_stop(&e->idle);
        uv_close((uv_handle_t *)&e->idle, on_close);
        uv_close((uv_handle_t *)&e->async, on_close);
        uv_close((uv_handle_t *)&e->heartbeat, on_close);
        uv_close((uv_handle_t *)&e->burst, on_close);
        return;
    }
    if (!e->idle_on) {
        uv_idle_start(&e->idle, on_idle);
        e->idle_on = true;
    }
}

static void *engine_main(void *arg)
{
    dsq_engine_t *e = arg;
    uv_run(&e->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Start the engine thread: its loop with the async, idle and timer
 * handles (the heartbeat runs from here on), then the thread. Returns 0,
 * or DSQ_E* with the reason in err and nothing of the loop left.
 * dsq_engine_destroy stops it (stopping, then a wake-up: on_async). */
int dsq__engine_start_thread(dsq_engine_t *e, const dsq_engine_opts_t *opts, char *err,
                             size_t err_len)
{
    int rc = DSQ_OK;
    if (uv_loop_init(&e->loop) != 0) {
        snprintf(err, err_len, "uv_loop_init failed");
        return DSQ_EIO;
    }
    uv_async_init(&e->loop, &e->async, on_async);
    uv_idle_init(&e->loop, &e->idle);
    uv_timer_init(&e->loop, &e->burst);   /* admission window, held re-checks */
    e->burst.data = e;
    e->window_ms = opts->admission_window_ms == 0 ? DSQ_ENGINE_ADMISSION_WINDOW_MS
                                                  : opts->admission_window_ms;
    e->async.data = e;
    e->idle.data = e;
    /* the watchdog heartbeat and the debug-only test hooks */
    uv_timer_init(&e->loop, &e->heartbeat);
    e->heartbeat.data = e;
    if (opts->heartbeat && opts->heartbeat_interval_ms > 0)
        uv_timer_start(&e->heartbeat, on_heartbeat, (uint64_t)opts->heartbeat_interval_ms,
                       (uint64_t)opts->heartbeat_interval_ms);
#ifndef NDEBUG
    {
        const char *w = getenv("DSQ_TEST_WEDGE_ENGINE_MS");
        e->wedge_ms = w ? atoi(w) : 0;
        const char *f = getenv("DSQ_TEST_FAIL_SAMPLE_CHOICE");
        e->fail_choice = f ? atoi(f) + 1 : 0;
    }
#endif
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        snprintf(err, err_len, "cannot start the engine thread");
        uv_close((uv_handle_t *)&e->idle, NULL);
        uv_close((uv_handle_t *)&e->async, NULL);
        uv_close((uv_handle_t *)&e->heartbeat, NULL);
        uv_close((uv_handle_t *)&e->burst, NULL);
        uv_run(&e->loop, UV_RUN_DEFAULT);
        uv_loop_close(&e->loop);
        rc = DSQ_ENOMEM;
    }
    return rc;
}

void dsq_engine_stats(dsq_engine_t *e, dsq_engine_stats_t *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->n_waiting = atomic_load(&e->n_waiting);
    pthread_mutex_unlock(&e->mu);
    dsq_admission_stats(e->adm, &out->admission);
    out->n_admission_held = atomic_load(&e->n_pending);
}

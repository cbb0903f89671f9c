/* Speculative decoding in the engine (engine.h spec_k; the proposers are
 * spec.h's): before a step, each running decoding choice gets draft
 * tokens appended after its pending one (dsq_seq_t.n_draft), which the
 * scheduler runs as one chunk with logits on every row; after the step,
 * each row is sampled exactly as plain decoding would sample it, in order,
 * and the drafts are kept while they equal the tokens sampled. The first
 * row that differs gives the correction (or, when every draft was kept,
 * the last row gives one more token), so a step yields 1 + accepted
 * tokens, and the tokens, their logprobs and the RNG draws are those of
 * decoding without speculation: the sampler sees the same history, mask
 * and seed state at each position. Grammar masks past the first row are
 * made inline (the mask worker makes the first during the forward pass).
 */
#include "engine_internal.h"

#include <string.h>

#include "engine/common/error.h"
#include "spec.h"
#include "scheduler.h"

void dsq__spec_propose(dsq_engine_t *e)
{
    const dsq_engine_opts_t *o = &e->o;
    int n = 0;
    for (dsq_req_t *r = e->active; r; r = r->next_active)
        for (int i = 0; i < r->n_seqs; i++) {
            const eseq_t *s = r->seqs[i];
            n += s && !s->finished && s->seq.state == DSQ_SEQ_RUNNING && !s->seq.paused &&
                 s->seq.n_computed >= s->seq.n_prompt;
        }
    if (n == 0 || n > o->spec_max_batch)
        return;
    /* a draft row's cost against what a token costs in a step of n
     * decoding rows ((fixed + n token) / n): in a batch, a token gained
     * is worth 1/n of the step's fixed cost, so drafts must be surer */
    dsq_step_cost_t cost;
    double row_cost = 0.25 * n / (0.75 + 0.25 * n);   /* no fit yet: rows a quarter */
    if (dsq_step_cost_model(&e->step_fit, &cost) && cost.token_ms > 0)
        row_cost = n * cost.token_ms / (cost.fixed_ms + n * cost.token_ms);
    row_cost = row_cost < 0.02 ? 0.02 : row_cost > 0.9 ? 0.9 : row_cost;
    if (e->draft) {
        /* a draft pass per draft token: its cost beside the step's */
        dsq_draft_info_t di;
        dsq_draft_info(e->draft, &di);
        double step_ms = 0;
        if (di.round_ms > 0 && dsq_step_cost_model(&e->step_fit, &cost))
            step_ms = cost.fixed_ms + n * cost.token_ms;
        if (step_ms > 0)
            row_cost += di.round_ms / step_ms;
        row_cost = row_cost > 0.95 ? 0.95 : row_cost;
    }
    dsq_draft_job_t jobs[64];
    int32_t drafts[64][DSQ_SPEC_MAX_K];
    eseq_t *who[64];
    int n_jobs = 0;
    for (dsq_req_t *r = e->active; r && n_jobs < 64; r = r->next_active) {
        if (r->sp.no_speculation)
            continue;
        for (int i = 0; i < r->n_seqs && n_jobs < 64; i++) {
            eseq_t *s = r->seqs[i];
            dsq_seq_t *q = s ? &s->seq : NULL;
            if (!q || s->finished || q->state != DSQ_SEQ_RUNNING || q->paused ||
                q->n_computed < q->n_prompt || q->n_tokens - q->n_computed != 1 ||
                q->n_draft != 0)
                continue;
            int k = o->spec_fixed_len ? o->spec_k
                                      : dsq_spec_draft_len(s->spec_acc, s->spec_seen, row_cost,
                                                           o->spec_k);
            if (k == 0) {
                /* backed off: the record fades, so a choice whose text
                 * starts copying later is tried again (a few steps on) */
                s->spec_acc *= 0.9;
                s->spec_seen *= 0.9;
                continue;
            }
            /* drafts never run past max_tokens (the pending token's sample
             * and the drafts' are each one output token) or the context */
            int left = r->sp.max_tokens - s->n_generated - 1;
            if (k > left)
                k = left;
            if (k > e->max_model_len - q->n_tokens)
                k = e->max_model_len - q->n_tokens;
            if (k <= 0)
                continue;
            dsq_draft_job_t *j = &jobs[n_jobs];
            *j = (dsq_draft_job_t){.key = s->uid, .tokens = q->tokens, .n_tokens = q->n_tokens,
                                   .k = k, .out = drafts[n_jobs]};
            if (!e->draft)
                j->n_out = dsq_spec_ngram_propose(q->tokens, q->n_tokens, o->spec_ngram_min,
                                                  o->spec_ngram_max, k, j->out);
            who[n_jobs++] = s;
        }
    }
    /* a draft model that fails gives no drafts; the step goes on */
    if (e->draft)
        (void)dsq_draft_propose(e->draft, jobs, n_jobs);
    for (int i = 0; i < n_jobs; i++) {
        dsq_seq_t *q = &who[i]->seq;
        int m = jobs[i].n_out;
        for (int j = 0; j < m; j++) {
            if (dsq__seq_append(q, jobs[i].out[j]) != DSQ_OK) {
                m = j;      /* no memory: fewer drafts, not a failure */
                break;
            }
        }
        q->n_draft = m;
    }
}

int dsq__spec_verify(dsq_engine_t *e, eseq_t *s, const float *rows, int n_rows)
{
    dsq_seq_t *q = &s->seq;
    const int nd = n_rows - 1;
    int32_t d[DSQ_SPEC_MAX_K];
    memcpy(d, q->tokens + q->n_tokens - nd, (size_t)nd * sizeof(*d));
    dsq_sched_drop_drafts(q);
    int acc = 0, rc = DSQ_OK;
    for (int i = 0; i <= nd; i++) {
        rc = dsq__sample_seq(e, s, rows + (size_t)i * (size_t)e->n_vocab);
        if (rc || s->finished || i == nd || q->tokens[q->n_tokens - 1] != d[i])
            break;
        acc++;
    }
    /* a finished choice has left the scheduler with its blocks */
    if (!rc && q->state == DSQ_SEQ_RUNNING)
        dsq_sched_accept_drafts(e->sched, q, acc);
    /* the draft length's statistics: drafts checked are the kept ones and
     * the first refused (those after it were never compared) */
    s->spec_acc = 0.8 * s->spec_acc + acc;
    s->spec_seen = 0.8 * s->spec_seen + (acc < nd ? acc + 1 : acc);
    pthread_mutex_lock(&s->req->mu);
    s->req->tl.n_draft_tokens += nd;
    s->req->tl.n_draft_accepted += acc;
    pthread_mutex_unlock(&s->req->mu);
    pthread_mutex_lock(&e->mu);
    e->stats.spec_drafts_total++;
    e->stats.spec_draft_tokens_total += nd;
    e->stats.spec_accepted_tokens_total += acc;
    for (int i = 0; i < acc; i++)
        e->stats.spec_accepted_per_pos[i]++;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

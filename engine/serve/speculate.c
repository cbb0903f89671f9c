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
 *
 * Proposers: n-gram lookup (spec.h), a draft model (draft.h), or the
 * model's own multi-token prediction module (spec_mtp: dsq__spec_mtp runs
 * it after each step over the rows the step computed and keeps each
 * decoding choice's draft for the next step).
 */
#include "engine_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
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
            if (o->spec_mtp) {
                /* the module's draft made after the last step, if it is
                 * still this choice's next position */
                if (s->mtp_at != q->n_tokens)
                    continue;
                j->out[0] = s->mtp_tok;
                j->n_out = 1;
            } else if (!e->draft) {
                j->n_out = dsq_spec_ngram_propose(q->tokens, q->n_tokens, o->spec_ngram_min,
                                                  o->spec_ngram_max, k, j->out);
            }
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

/* Grow e->mtp's arrays to n rows and nl logit rows. */
static int mtp_room(dsq_engine_t *e, int n, int nl, int64_t d)
{
    if (n > e->mtp.cap) {
        int32_t **arr[] = {&e->mtp.tokens, &e->mtp.pos, &e->mtp.row_seq, &e->mtp.slot,
                           &e->mtp.lrows};
        for (size_t i = 0; i < sizeof(arr) / sizeof(arr[0]); i++) {
            int32_t *p = realloc(*arr[i], (size_t)n * sizeof(int32_t));
            if (!p)
                return DSQ_ENOMEM;
            *arr[i] = p;
        }
        eseq_t **ls = realloc(e->mtp.lseq, (size_t)n * sizeof(*ls));
        if (!ls)
            return DSQ_ENOMEM;
        e->mtp.lseq = ls;
        float *h = realloc(e->mtp.h, (size_t)n * (size_t)d * sizeof(float));
        if (!h)
            return DSQ_ENOMEM;
        e->mtp.h = h;
        e->mtp.cap = n;
    }
    if (nl > e->mtp.lcap) {
        float *p = realloc(e->mtp.logits, (size_t)nl * (size_t)e->n_vocab * sizeof(float));
        if (!p)
            return DSQ_ENOMEM;
        e->mtp.logits = p;
        e->mtp.lcap = nl;
    }
    return DSQ_OK;
}

void dsq__spec_mtp(dsq_engine_t *e, const dsq_sched_out_t *out)
{
    int n_hid = 0;
    const float *hid = dsq_model_hidden(e->model, &n_hid);
    const int64_t d = dsq_model_config(e->model)->n_embd;
    if (!hid || n_hid != out->n_tokens)
        return;
    /* the rows whose position their choice has computed: the step's
     * prompt rows, the pending token and the drafts kept (not the
     * rejected drafts, nor the rows of a choice that ended: its blocks
     * are gone), each with the token after it */
    int n = 0, nl = 0, rc = mtp_room(e, out->n_tokens, out->n_seqs, d);
    for (int r = 0; r < out->n_tokens && !rc; r++) {
        const dsq_seq_t *q = out->seqs[out->row_seq[r]];
        const eseq_t *s = (const eseq_t *)q->owner;
        const int p = out->pos[r];
        if (s->finished || q->state != DSQ_SEQ_RUNNING || p >= q->n_computed ||
            p + 1 >= q->n_tokens)
            continue;
        e->mtp.tokens[n] = q->tokens[p + 1];
        e->mtp.pos[n] = p;
        e->mtp.row_seq[n] = out->row_seq[r];
        e->mtp.slot[n] = out->slot[r];
        memcpy(e->mtp.h + (size_t)n * (size_t)d, hid + (size_t)r * (size_t)d,
               (size_t)d * sizeof(float));
        /* the last computed position of a decoding choice: its logits
         * predict the token after the pending one, the next draft */
        if (p == q->n_computed - 1 && q->n_computed >= q->n_prompt &&
            !s->req->sp.no_speculation) {
            e->mtp.lrows[nl] = n;
            e->mtp.lseq[nl++] = (eseq_t *)s;
        }
        n++;
    }
    if (rc || n == 0) {
        if (rc)
            dsq_log(DSQ_LOG_WARN, "event=mtp_failed err=%s", dsq_strerror(rc));
        return;
    }
    dsq_batch_t b = {.n_tokens = n, .tokens = e->mtp.tokens, .pos = e->mtp.pos,
                     .row_seq = e->mtp.row_seq, .slot = e->mtp.slot, .n_seqs = out->n_seqs,
                     .block_tables = out->block_tables, .max_blocks = out->max_blocks,
                     .n_logits = nl, .logit_rows = e->mtp.lrows};
    rc = dsq_model_mtp_forward(e->model, e->kv, &b, e->mtp.h, e->mtp.logits);
    if (rc) {
        dsq_log(DSQ_LOG_WARN, "event=mtp_failed err=%s", dsq_strerror(rc));
        return;
    }
    for (int i = 0; i < nl; i++) {
        const float *row = e->mtp.logits + (size_t)i * (size_t)e->n_vocab;
        int32_t best = 0;
        for (int32_t v = 1; v < e->n_vocab; v++)
            if (row[v] > row[best])
                best = v;
        e->mtp.lseq[i]->mtp_tok = best;
        e->mtp.lseq[i]->mtp_at = e->mtp.lseq[i]->seq.n_tokens;
    }
}

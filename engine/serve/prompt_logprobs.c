/* Prompt logprobs (dsq_sampling_t.prompt_logprobs): the logprob of each
 * prompt token under the raw model distribution. A step asks the model
 * for logits only where a choice samples; for a request that wants prompt
 * logprobs the rows of its prompt positions are added to the step's logit
 * rows here and scored after the forward pass, each position once, also
 * across chunked prefill and preemption by recompute. The results ride on
 * the request's first output event (choice.c).
 */
#include "engine_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

/* Add to e->lrows (after the scheduler's n_logits rows) the rows of
 * this step whose logits give prompt logprobs: for each request that wants
 * them, the rows at positions plp_n, plp_n + 1, ... < n_prompt - 1 (the
 * logits at position p score prompt token p + 1). Positions below plp_n
 * (a recompute after preemption) are never taken twice. *n_x gets the
 * count. Returns 0 or DSQ_ENOMEM. */
int dsq__plp_collect(dsq_engine_t *e, const dsq_sched_out_t *out, int *n_x)
{
    int need = out->n_logits + out->n_tokens;
    bool any = false;
    *n_x = 0;
    for (int i = 0; i < out->n_seqs && !any; i++) {
        const dsq_req_t *r = ((eseq_t *)out->seqs[i]->owner)->req;
        any = r->plp && !r->plp_sent;
    }
    if (!any)
        return DSQ_OK;    /* nobody wants prompt logprobs */
    if (need > e->lrows_cap) {
        int32_t *a = realloc(e->lrows, (size_t)need * sizeof(*a));
        if (a)
            e->lrows = a;
        int32_t *b = realloc(e->xpos, (size_t)need * sizeof(*b));
        if (b)
            e->xpos = b;
        eseq_t **c = realloc(e->xseq, (size_t)need * sizeof(*c));
        if (c)
            e->xseq = c;
        if (!a || !b || !c)
            return DSQ_ENOMEM;
        e->lrows_cap = need;
    }
    memcpy(e->lrows, out->logit_rows, (size_t)out->n_logits * sizeof(*e->lrows));
    for (int i = 0; i < out->n_seqs; i++) {
        dsq_seq_t *q = out->seqs[i];
        eseq_t *s = (eseq_t *)q->owner;
        dsq_req_t *r = s->req;
        if (!r->plp || r->plp_sent || s->seq.index != 0)
            continue;
        int next = r->plp_n;
        for (int row = q->sched_row; row < q->sched_row + q->sched_tokens; row++) {
            if (out->pos[row] != next || next >= r->n_prompt - 1)
                continue;
            e->lrows[out->n_logits + *n_x] = row;
            e->xpos[*n_x] = next++;
            e->xseq[(*n_x)++] = s;
        }
    }
    return DSQ_OK;
}

/* Log-softmax of one logits row (raw model distribution, as the
 * sampler's logprobs) -> the logprob of prompt token pos + 1 and the top
 * alternatives, stored as entry pos. */
void dsq__plp_store(dsq_engine_t *e, eseq_t *s, int pos, const float *row)
{
    dsq_req_t *r = s->req;
    int n = e->n_vocab, k = r->sp.logprobs > 0 ? r->sp.logprobs : 0;
    float mx = -INFINITY;
    double sum = 0;
    for (int i = 0; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < n; i++)
        sum += exp((double)row[i] - mx);
    double lse = mx + log(sum);
    r->plp[pos] = (float)(row[r->prompt[pos + 1]] - lse);
    if (k > 0) {
        /* top k by insertion: k <= 20, one pass over the vocabulary */
        dsq_top_logprob_t *t = r->plp_top + (size_t)pos * (size_t)k;
        int have = 0;
        for (int i = 0; i < n; i++) {
            if (have == k && row[i] <= t[k - 1].logprob)
                continue;
            int j = have < k ? have++ : k - 1;
            while (j > 0 && t[j - 1].logprob < row[i]) {
                t[j] = t[j - 1];
                j--;
            }
            t[j].token = i;
            t[j].logprob = row[i];
        }
        for (int j = 0; j < have; j++)
            t[j].logprob = (float)(t[j].logprob - lse);
    }
    if (pos + 1 > r->plp_n)
        r->plp_n = pos + 1;
}

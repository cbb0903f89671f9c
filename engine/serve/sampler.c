/* Sampler implementation (see sampler.h for the order of operations and the
 * sources). Scratch arrays live in dsq_sampler_t so a step allocates
 * nothing. Sorting is only done over the candidates left after top-k. */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

struct dsq_sampler {
    int n_vocab;
    int32_t *idx;       /* candidate ids */
    float *prob;        /* candidate probabilities */
    float *raw;         /* copy of the raw logits for logprobs */
    int32_t *count;     /* output token counts for penalties */
    uint8_t *in_prompt;
    bool warned_nan;    /* the NaN-logits warning was logged once */
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void dsq_rng_seed(dsq_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double dsq_rng_uniform(dsq_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * 0x1.0p-53;
}

dsq_sampler_t *dsq_sampler_create(int n_vocab)
{
    dsq_sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->n_vocab = n_vocab;
    s->idx = malloc((size_t)n_vocab * sizeof(*s->idx));
    s->prob = malloc((size_t)n_vocab * sizeof(*s->prob));
    s->raw = malloc((size_t)n_vocab * sizeof(*s->raw));
    s->count = calloc((size_t)n_vocab, sizeof(*s->count));
    s->in_prompt = calloc((size_t)n_vocab, 1);
    if (!s->idx || !s->prob || !s->raw || !s->count || !s->in_prompt) {
        dsq_sampler_destroy(s);
        return NULL;
    }
    return s;
}

void dsq_sampler_destroy(dsq_sampler_t *s)
{
    if (!s)
        return;
    free(s->idx);
    free(s->prob);
    free(s->raw);
    free(s->count);
    free(s->in_prompt);
    free(s);
}

/* log-sum-exp of the raw logits, for logprobs. */
static double log_norm(const float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)(x[i] - mx));
    return (double)mx + log(sum);
}

static void raw_top(const float *raw, int n, double lse, dsq_top_logprob_t *top,
                    int n_top)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        float v = raw[i];
        if (k < n_top) {
            int j = k++;
            while (j > 0 && raw[top[j - 1].token] < v) {
                top[j] = top[j - 1];
                j--;
            }
            top[j].token = i;
        } else if (v > raw[top[n_top - 1].token]) {
            int j = n_top - 1;
            while (j > 0 && raw[top[j - 1].token] < v) {
                top[j] = top[j - 1];
                j--;
            }
            top[j].token = i;
        }
    }
    for (int j = 0; j < k; j++)
        top[j].logprob = (float)((double)raw[top[j].token] - lse);
}

static int cmp_desc(const void *a, const void *b, void *arg)
{
    const float *p = arg;
    float x = p[*(const int32_t *)a], y = p[*(const int32_t *)b];
    if (x > y)
        return -1;
    if (x < y)
        return 1;
    return (*(const int32_t *)a > *(const int32_t *)b) -
           (*(const int32_t *)a < *(const int32_t *)b);
}

static void apply_penalties(dsq_sampler_t *s, const dsq_sampling_t *sp,
                            const dsq_sampler_hist_t *h, float *logits)
{
    bool rep = sp->repetition_penalty > 0 && sp->repetition_penalty != 1.0f;
    bool freq = sp->frequency_penalty != 0 || sp->presence_penalty != 0;
    if ((!rep && !freq) || !h)
        return;
    for (int i = 0; i < h->n_output; i++)
        s->count[h->output[i]]++;
    if (rep)
        for (int i = 0; i < h->n_prompt; i++)
            s->in_prompt[h->prompt[i]] = 1;
    /* Visit each touched id once. */
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *ids = pass ? h->output : h->prompt;
        int n = pass ? h->n_output : h->n_prompt;
        for (int i = 0; i < n; i++) {
            int32_t t = ids[i];
            if (s->in_prompt[t] == 2)
                continue;
            if (rep && (s->in_prompt[t] || s->count[t] > 0)) {
                float r = sp->repetition_penalty;
                logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
            }
            if (freq && s->count[t] > 0)
                logits[t] -= sp->frequency_penalty * (float)s->count[t] +
                             sp->presence_penalty;
            s->in_prompt[t] = 2; /* mark visited */
        }
    }
    for (int i = 0; i < h->n_output; i++)
        s->count[h->output[i]] = 0;
    for (int i = 0; i < h->n_prompt; i++)
        s->in_prompt[h->prompt[i]] = 0;
    for (int i = 0; i < h->n_output; i++)
        s->in_prompt[h->output[i]] = 0;
}

int dsq_sampler_pick(dsq_sampler_t *s, const dsq_sampling_t *sp,
                     const dsq_sampler_hist_t *hist, float *logits,
                     dsq_rng_t *rng, int32_t *out_token, float *out_logprob,
                     dsq_top_logprob_t *top, int n_top)
{
    int n = s->n_vocab;
    if (sp->temperature < 0 || sp->top_p <= 0 || sp->top_p > 1 ||
        sp->min_p < 0 || sp->min_p > 1)
        return DSQ_EINVAL;
    /* a NaN logit (non-finite weights or activations) is an impossible
     * token, not a candidate: NaN would win or poison every comparison and
     * turn the logprobs into NaN (JSON null) */
    int n_nan = 0;
    for (int i = 0; i < n; i++)
        if (isnan(logits[i])) {
            logits[i] = -INFINITY;
            n_nan++;
        }
    if (n_nan && !s->warned_nan) {
        s->warned_nan = true;
        dsq_log(DSQ_LOG_WARN, "event=nan_logits count=%d n_vocab=%d (treated as -inf; the "
                "model's weights or activations are not finite)", n_nan, n);
    }
    if (n_nan == n)
        return DSQ_ERANGE;
    bool want_lp = out_logprob || (top && n_top > 0);
    double lse = 0;
    if (want_lp) {
        memcpy(s->raw, logits, (size_t)n * sizeof(*logits));
        lse = log_norm(s->raw, n);
        if (top && n_top > 0)
            raw_top(s->raw, n, lse, top, n_top);
    }
    if (hist && hist->allowed) {
        int n_ok = 0;
        for (int i = 0; i < n; i++) {
            if (!((hist->allowed[i / 32] >> (i % 32)) & 1u))
                logits[i] = -INFINITY;
            else
                n_ok += logits[i] > -INFINITY;
        }
        if (n_ok == 0)
            return DSQ_ERANGE;
    }
    for (int i = 0; i < sp->n_logit_bias; i++) {
        int32_t t = sp->logit_bias_ids[i];
        if (t >= 0 && t < n)
            logits[t] += sp->logit_bias[i];
    }
    apply_penalties(s, sp, hist, logits);

    int32_t pick = 0;
    /* below 1e-5, 1/temperature overflows float: greedy (as vLLM) */
    if (sp->temperature < 1e-5f) {
        for (int i = 1; i < n; i++)
            if (logits[i] > logits[pick])
                pick = i;
    } else {
        float inv_t = 1.0f / sp->temperature;
        int m = 0;
        int k = sp->top_k > 0 && sp->top_k < n ? sp->top_k : n;
        bool need_sort = k < n || sp->top_p < 1.0f;
        for (int i = 0; i < n; i++) {
            if (isinf(logits[i]) && logits[i] < 0)
                continue;
            s->idx[m++] = i;
        }
        if (m == 0) {
            *out_token = 0;
            goto logprob;
        }
        if (need_sort) {
            if (k < m) {
                /* Partial selection: keep the k largest (ties: lower id). */
                qsort_r(s->idx, (size_t)m, sizeof(*s->idx), cmp_desc, logits);
                m = k;
            } else {
                qsort_r(s->idx, (size_t)m, sizeof(*s->idx), cmp_desc, logits);
            }
        }
        float mx = -INFINITY;
        for (int i = 0; i < m; i++)
            if (logits[s->idx[i]] > mx)
                mx = logits[s->idx[i]];
        double sum = 0;
        for (int i = 0; i < m; i++) {
            s->prob[i] = expf((logits[s->idx[i]] - mx) * inv_t);
            sum += s->prob[i];
        }
        if (sp->top_p < 1.0f) {
            double c = 0, lim = sp->top_p * sum;
            int keep = m;
            for (int i = 0; i < m; i++) {
                c += s->prob[i];
                if (c >= lim) {
                    keep = i + 1;
                    break;
                }
            }
            m = keep;
        }
        if (sp->min_p > 0) {
            float pmax = 0;
            for (int i = 0; i < m; i++)
                if (s->prob[i] > pmax)
                    pmax = s->prob[i];
            int w = 0;
            for (int i = 0; i < m; i++)
                if (s->prob[i] >= sp->min_p * pmax) {
                    s->idx[w] = s->idx[i];
                    s->prob[w++] = s->prob[i];
                }
            m = w;
        }
        sum = 0;
        for (int i = 0; i < m; i++)
            sum += s->prob[i];
        double u = dsq_rng_uniform(rng) * sum, c = 0;
        pick = s->idx[m - 1];
        for (int i = 0; i < m; i++) {
            c += s->prob[i];
            if (u < c) {
                pick = s->idx[i];
                break;
            }
        }
    }
    *out_token = pick;
logprob:
    if (out_logprob)
        *out_logprob = (float)((double)s->raw[*out_token] - lse);
    return DSQ_OK;
}

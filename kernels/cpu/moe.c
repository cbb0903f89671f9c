/* Mixture-of-experts routing on the CPU: gate scores -> top-k experts and
 * their weights per token, and the grouping of (token, expert) pairs by
 * expert so the model runs each expert once per step over all its tokens
 * (its weights are then read once per step, whatever the batch).
 *
 * Routing follows transformers' DeepseekV2Moe / DeepseekV3TopkRouter (the
 * project's reference, tests/golden/deepseek2_tiny_*): softmax or sigmoid
 * scores in fp32; "greedy" top-k over all experts; "group_limited_greedy"
 * keeps the topk_group groups with the highest max score; "noaux_tc"
 * (V3) scores each group by the sum of its two best biased scores
 * (score + e_score_correction_bias). Experts of dropped groups are masked
 * with 0, not -inf, as transformers does (DeepSeek's V3 code uses -inf;
 * the choice differs only when fewer than top_k kept experts score > 0).
 * Selection uses the biased scores, the weights the unbiased ones. Ties go
 * to the lower expert / group id. Tokens are independent, so rows are
 * split over the thread pool with dsq__parallel_for.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

/* Index of the largest of x[0..n) not yet taken; ties -> lowest index. */
static int pick_max(const float *x, const unsigned char *taken, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || x[i] > x[best]))
            best = i;
    return best;
}

struct route_ctx {
    int32_t *ids;
    float *weights;
    const float *logits;
    const dsq_moe_route_t *p;
};

static void route_rows(void *vp, int64_t r0, int64_t r1)
{
    const struct route_ctx *c = vp;
    const dsq_moe_route_t *p = c->p;
    const int E = p->n_experts, K = p->top_k, NG = p->n_group;
    const int per = E / NG;
    /* E <= 4096 (checked), so stack scratch is bounded. */
    float scores[4096], choice[4096], gscore[4096];
    unsigned char taken[4096];
    for (int64_t r = r0; r < r1; r++) {
        const float *lg = c->logits + r * E;
        if (p->scoring == DSQ_MOE_SCORE_SIGMOID) {
            for (int e = 0; e < E; e++)
                scores[e] = 1.0f / (1.0f + expf(-lg[e]));
        } else {
            float mx = lg[0], sum = 0.0f;
            for (int e = 1; e < E; e++)
                mx = lg[e] > mx ? lg[e] : mx;
            for (int e = 0; e < E; e++) {
                scores[e] = expf(lg[e] - mx);
                sum += scores[e];
            }
            for (int e = 0; e < E; e++)
                scores[e] /= sum;
        }
        for (int e = 0; e < E; e++)
            choice[e] = scores[e] + (p->bias ? p->bias[e] : 0.0f);
        if (p->method != DSQ_MOE_TOPK_GREEDY && NG > 1) {
            for (int g = 0; g < NG; g++) {
                const float *s = choice + g * per;
                if (p->method == DSQ_MOE_TOPK_NOAUX_TC) {
                    /* sum of the two best (one if the group has one) */
                    float a = -INFINITY, b = -INFINITY;
                    for (int i = 0; i < per; i++) {
                        if (s[i] > a) {
                            b = a;
                            a = s[i];
                        } else if (s[i] > b) {
                            b = s[i];
                        }
                    }
                    gscore[g] = per > 1 ? a + b : a;
                } else {
                    float a = s[0];
                    for (int i = 1; i < per; i++)
                        a = s[i] > a ? s[i] : a;
                    gscore[g] = a;
                }
            }
            memset(taken, 0, (size_t)NG);
            for (int k = 0; k < p->topk_group; k++)
                taken[pick_max(gscore, taken, NG)] = 1;
            for (int g = 0; g < NG; g++)
                if (!taken[g])
                    for (int i = 0; i < per; i++)
                        choice[g * per + i] = 0.0f;
        }
        memset(taken, 0, (size_t)E);
        int32_t *ids = c->ids + r * K;
        float *w = c->weights + r * K;
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            const int e = pick_max(choice, taken, E);
            taken[e] = 1;
            ids[k] = e;
            w[k] = scores[e];
            sum += w[k];
        }
        const float norm = p->norm_topk_prob ? 1.0f / (sum + 1e-20f) : 1.0f;
        for (int k = 0; k < K; k++)
            w[k] = w[k] * norm * p->routed_scaling_factor;
    }
}

int dsq_cpu_moe_route(int32_t *ids, float *weights, const float *logits, int64_t m,
                      const dsq_moe_route_t *p)
{
    if (!ids || !weights || !logits || !p || m < 0 || p->n_experts < 1 ||
        p->n_experts > 4096 || p->top_k < 1 || p->n_group < 1 ||
        p->n_experts % p->n_group != 0 || p->topk_group < 1 ||
        p->topk_group > p->n_group ||
        (p->method != DSQ_MOE_TOPK_GREEDY && p->method != DSQ_MOE_TOPK_GROUP_LIMITED &&
         p->method != DSQ_MOE_TOPK_NOAUX_TC) ||
        (p->scoring != DSQ_MOE_SCORE_SOFTMAX && p->scoring != DSQ_MOE_SCORE_SIGMOID))
        return DSQ_EINVAL;
    if (p->top_k > p->n_experts)
        return DSQ_EINVAL;
    struct route_ctx c = {ids, weights, logits, p};
    dsq__parallel_for(m, 64, route_rows, &c);
    return DSQ_OK;
}

int dsq_cpu_moe_group(int32_t *offsets, int32_t *rows, float *row_weights,
                      const int32_t *ids, const float *weights, int64_t m,
                      int top_k, int n_experts)
{
    if (!offsets || !rows || !row_weights || !ids || !weights || m < 0 ||
        top_k < 1 || n_experts < 1)
        return DSQ_EINVAL;
    const int64_t n = m * top_k;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_experts)
            return DSQ_ERANGE;
    /* Counting sort, stable: within an expert, rows stay in token order. */
    memset(offsets, 0, (size_t)(n_experts + 1) * sizeof(*offsets));
    for (int64_t i = 0; i < n; i++)
        offsets[ids[i] + 1]++;
    for (int e = 0; e < n_experts; e++)
        offsets[e + 1] += offsets[e];
    int32_t *fill = malloc((size_t)n_experts * sizeof(*fill));
    if (!fill)
        return DSQ_ENOMEM;
    memcpy(fill, offsets, (size_t)n_experts * sizeof(*fill));
    for (int64_t i = 0; i < n; i++) {
        const int32_t at = fill[ids[i]]++;
        rows[at] = (int32_t)(i / top_k);
        row_weights[at] = weights[i];
    }
    free(fill);
    return DSQ_OK;
}

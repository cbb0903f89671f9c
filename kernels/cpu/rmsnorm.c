/* RMSNorm (Zhang & Sennrich 2019) over the rows of an fp32 matrix.
 *
 * The sum of squares is accumulated in fp32 over 8 independent lanes (the
 * compiler vectorises it; lanes also keep the rounding error at about
 * sqrt(n/8) ulps) and eps sits inside the square root, as in llama.cpp and
 * transformers' LlamaRMSNorm. Rows are independent: the thread pool splits
 * them when there are enough (a decode row runs inline). */
#include <math.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

static void norm_row(float *y, const float *x, const float *w, int64_t n,
                     float eps)
{
    float lane[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += x[j + l] * x[j + l];
    float ss = 0.0f;
    for (; j < n; j++)
        ss += x[j] * x[j];
    for (int l = 0; l < 8; l++)
        ss += lane[l];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (j = 0; j < n; j++)
        y[j] = x[j] * r * w[j];
}

struct norm_ctx {
    float *y;
    const float *x, *w;
    int64_t n;
    float eps;
};

static void norm_rows(void *p, int64_t i0, int64_t i1)
{
    const struct norm_ctx *c = p;
    for (int64_t i = i0; i < i1; i++)
        norm_row(c->y + i * c->n, c->x + i * c->n, c->w, c->n, c->eps);
}

int dsq_cpu_rmsnorm(float *y, const float *x, const float *w, int64_t m,
                    int64_t n, float eps)
{
    if (!y || !x || !w || m < 0 || n < 1 || !(eps >= 0.0f))
        return DSQ_EINVAL;
    struct norm_ctx c = {y, x, w, n, eps};
    dsq__parallel_for(m, 16384 / n + 1, norm_rows, &c);
    return DSQ_OK;
}

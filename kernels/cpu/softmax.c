/* Row softmax, max-subtracted so exp never overflows. A row of all -inf
 * (fully masked) comes out as all zeros rather than NaN; the sum is
 * accumulated in fp64 because n can be the vocabulary size (10^5). */
#include <math.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

static void softmax_row(float *x, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < n; j++)
            x[j] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        x[j] = expf(x[j] - mx);
        sum += x[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < n; j++)
        x[j] *= inv;
}

struct softmax_ctx {
    float *x;
    int64_t n;
};

static void softmax_rows(void *p, int64_t i0, int64_t i1)
{
    const struct softmax_ctx *c = p;
    for (int64_t i = i0; i < i1; i++)
        softmax_row(c->x + i * c->n, c->n);
}

int dsq_cpu_softmax(float *x, int64_t m, int64_t n)
{
    if (!x || m < 0 || n < 1)
        return DSQ_EINVAL;
    struct softmax_ctx c = {x, n};
    dsq__parallel_for(m, 32768 / n + 1, softmax_rows, &c);
    return DSQ_OK;
}

/* Row softmax, max-subtracted so exp never overflows. A row of all -inf
 * (fully masked) comes out as all zeros rather than NaN; the sum is
 * accumulated in fp64 because n can be the vocabulary size (10^5). */
#include <math.h>

#include "error.h"
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

int dsq_cpu_softmax(float *x, int64_t m, int64_t n)
{
    if (!x || m < 0 || n < 1)
        return DSQ_EINVAL;
    #pragma omp parallel for schedule(static) if (m * n > 65536)
    for (int64_t i = 0; i < m; i++)
        softmax_row(x + i * n, n);
    return DSQ_OK;
}

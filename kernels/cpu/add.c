/* Residual add y += x. Trivial, but an op of its own so the CUDA backend
 * has a twin with the same signature. */
#include "error.h"
#include "kernels.h"

int dsq_cpu_add(float *y, const float *x, int64_t n)
{
    if (!y || !x || n < 0)
        return DSQ_EINVAL;
    #pragma omp parallel for schedule(static) if (n > 262144)
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
    return DSQ_OK;
}

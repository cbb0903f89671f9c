/* Residual add y += x. Trivial, but an op of its own so the CUDA backend
 * has a twin with the same signature. */
#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

struct add_ctx {
    float *y;
    const float *x;
};

static void add_range(void *p, int64_t i0, int64_t i1)
{
    const struct add_ctx *c = p;
    for (int64_t i = i0; i < i1; i++)
        c->y[i] += c->x[i];
}

int dsq_cpu_add(float *y, const float *x, int64_t n)
{
    if (!y || !x || n < 0)
        return DSQ_EINVAL;
    struct add_ctx c = {y, x};
    dsq__parallel_for(n, 131072, add_range, &c);
    return DSQ_OK;
}

/* SwiGLU activation (Shazeer 2020): out = silu(gate) * up, silu(g) =
 * g / (1 + exp(-g)). Written so that a very negative g gives 0 (exp
 * overflows to inf, g/inf = -0) and a large g gives g, never NaN. */
#include <math.h>

#include "error.h"
#include "kernels.h"

int dsq_cpu_swiglu(float *out, const float *gate, const float *up, int64_t m,
                   int64_t n)
{
    if (!out || !gate || !up || m < 0 || n < 0)
        return DSQ_EINVAL;
    const int64_t total = m * n;
    #pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t i = 0; i < total; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
    return DSQ_OK;
}

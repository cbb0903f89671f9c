/* Row and column gathers of fp32 matrices: the rows of a step whose logits
 * are wanted (dsq_cpu_gather_rows) and GPTQ act-order inputs, whose columns
 * follow the weight's permuted k order (dsq_cpu_gather_cols). Plain loops:
 * both are a few copies per row next to the matmul that follows. */
#include <string.h>

#include "cpu_internal.h"
#include "engine/common/error.h"

int dsq_cpu_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t m,
                        int64_t width, int64_t n_src)
{
    if (!dst || !src || !rows || m < 0 || width < 1 || n_src < 1)
        return DSQ_EINVAL;
    for (int64_t i = 0; i < m; i++)
        if (rows[i] < 0 || rows[i] >= n_src)
            return DSQ_ERANGE;
    for (int64_t i = 0; i < m; i++)
        memmove(dst + i * width, src + (int64_t)rows[i] * width,
                (size_t)width * sizeof(float));
    return DSQ_OK;
}

int dsq_cpu_gather_cols(float *dst, const float *src, const int32_t *perm, int64_t m,
                        int64_t k)
{
    if (!dst || !src || !perm || m < 0 || k < 1 || dst == src)
        return DSQ_EINVAL;
    for (int64_t j = 0; j < k; j++)
        if (perm[j] < 0 || perm[j] >= k)
            return DSQ_ERANGE;
    for (int64_t t = 0; t < m; t++)
        for (int64_t j = 0; j < k; j++)
            dst[t * k + j] = src[t * k + perm[j]];
    return DSQ_OK;
}

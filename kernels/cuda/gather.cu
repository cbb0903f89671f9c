// CUDA twin of kernels/cpu/gather.c: row gathers (the logits rows of a
// step) and column gathers (GPTQ act-order inputs), grid-stride loops over
// the output. Index arrays live on the device; an index out of range gives
// 0 (the CPU op returns DSQ_ERANGE). Rows are the fp32 residual stream;
// columns are a product's input, in the step's activation type.
#include "cuda_internal.cuh"

static __global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows,
                                          int64_t m, int64_t width, int64_t n_src)
{
    const int64_t total = m * width;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / width, j = e % width, r = rows[i];
        dst[e] = r >= 0 && r < n_src ? src[r * width + j] : 0.0f;
    }
}

template <typename T>
static __global__ void gather_cols_kernel(T *dst, const T *src, const int32_t *perm,
                                          int64_t m, int64_t k)
{
    const int64_t total = m * k;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / k, c = perm[e % k];
        if (c >= 0 && c < k)
            dst[e] = src[t * k + c];
        else
            dsq__st(dst, e, 0.0f);
    }
}

extern "C" int dsq_cuda_gather_rows(float *dst, const float *src, const int32_t *rows,
                                    int64_t m, int64_t width, int64_t n_src)
{
    if (!dst || !src || !rows || m < 0 || width < 1 || n_src < 1)
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    gather_rows_kernel<<<dsq__cuda_grid(m * width, 256), 256, 0, dsq__cuda_stream()>>>(
        dst, src, rows, m, width, n_src);
    return dsq__cuda_launched("gather_rows");
}

extern "C" int dsq_cuda_gather_cols(void *dst, const void *src, dsq_ftype_t t,
                                    const int32_t *perm, int64_t m, int64_t k)
{
    if (!dst || !src || !perm || m < 0 || k < 1 || dst == src || !dsq__ft_ok(t))
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    DSQ__FT_DISPATCH(t, T, gather_cols_kernel<T><<<dsq__cuda_grid(m * k, 256), 256, 0,
                                                   dsq__cuda_stream()>>>(
                               (T *)dst, (const T *)src, perm, m, k));
    return dsq__cuda_launched("gather_cols");
}

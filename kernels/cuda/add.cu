// CUDA twin of kernels/cpu/add.c: y += x, grid-stride elementwise; y (the
// residual stream) is fp32, x in the step's activation type.

#include "cuda_internal.cuh"

template <typename T>
static __global__ void add_kernel(float *y, const T *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += dsq__ld(x, i);
}

extern "C" int dsq_cuda_add(float *y, const void *x, dsq_ftype_t xt, int64_t n)
{
    if (!y || !x || n < 0 || !dsq__ft_ok(xt))
        return DSQ_EINVAL;
    if (n == 0)
        return DSQ_OK;
    DSQ__FT_DISPATCH(xt, T, add_kernel<T><<<dsq__cuda_grid(n, 256), 256, 0,
                                            dsq__cuda_stream()>>>(y, (const T *)x, n));
    return dsq__cuda_launched("add");
}

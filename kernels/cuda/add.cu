// CUDA twin of kernels/cpu/add.c: y += x, grid-stride elementwise.

#include "cuda_internal.cuh"

static __global__ void add_kernel(float *y, const float *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

extern "C" int dsq_cuda_add(float *y, const float *x, int64_t n)
{
    if (!y || !x || n < 0)
        return DSQ_EINVAL;
    if (n == 0)
        return DSQ_OK;
    int64_t blocks = (n + 255) / 256;
    add_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, dsq__cuda_stream()>>>(y, x, n);
    return dsq__cuda_launched("add");
}

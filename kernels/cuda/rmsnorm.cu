// CUDA twin of kernels/cpu/rmsnorm.c: one thread block per row, fp32 sum of
// squares reduced through warp shuffles and shared memory, eps inside the
// square root (Zhang & Sennrich 2019). x (the residual stream) is fp32;
// y is stored in the step's activation type.

#include "cuda_internal.cuh"

static __device__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + 31) / 32;
    v = (int)threadIdx.x < n_warps ? red[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0)
        red[0] = v;
    __syncthreads();
    return red[0];
}

template <typename T>
static __global__ void rmsnorm_kernel(T *y, const float *x, const float *w, int64_t n,
                                      float eps)
{
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * n;
    T *yr = y + (int64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        ss += xr[j] * xr[j];
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        dsq__st(yr, j, xr[j] * r * w[j]);
}

extern "C" int dsq_cuda_rmsnorm(void *y, dsq_ftype_t yt, const float *x, const float *w,
                                int64_t m, int64_t n, float eps)
{
    if (!y || !x || !w || m < 0 || n < 1 || !(eps >= 0.0f) || m > 0x7fffffff ||
        !dsq__ft_ok(yt) || (yt != DSQ_FT_F32 && (const void *)y == (const void *)x))
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    DSQ__FT_DISPATCH(yt, T, rmsnorm_kernel<T><<<(unsigned)m, 256, 0, dsq__cuda_stream()>>>(
                                (T *)y, x, w, n, eps));
    return dsq__cuda_launched("rmsnorm");
}

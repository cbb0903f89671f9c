// CUDA twin of kernels/cpu/softmax.c: one thread block per row; block max,
// then block sum of exp(x - max), then scale. A fully masked row (all -inf)
// becomes zeros, as on the CPU.
#include <math.h>

#include "cuda_internal.cuh"

template <bool IS_MAX>
static __device__ float block_reduce(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) {
        float t = __shfl_xor_sync(0xffffffffu, v, o);
        v = IS_MAX ? fmaxf(v, t) : v + t;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();                 // red may still be read by a previous call
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + 31) / 32;
    v = (int)threadIdx.x < n_warps ? red[threadIdx.x] : (IS_MAX ? -INFINITY : 0.0f);
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) {
            float t = __shfl_xor_sync(0xffffffffu, v, o);
            v = IS_MAX ? fmaxf(v, t) : v + t;
        }
    if (threadIdx.x == 0)
        red[32] = v;
    __syncthreads();
    return red[32];
}

static __global__ void softmax_kernel(float *x, int64_t n)
{
    __shared__ float red[33];
    float *xr = x + (int64_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        mx = fmaxf(mx, xr[j]);
    mx = block_reduce<true>(mx, red);
    if (mx == -INFINITY) {
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            xr[j] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(xr[j] - mx);
        xr[j] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, red);
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        xr[j] *= inv;
}

extern "C" int dsq_cuda_softmax(float *x, int64_t m, int64_t n)
{
    if (!x || m < 0 || n < 1 || m > 0x7fffffff)
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    softmax_kernel<<<(unsigned)m, 256, 0, dsq__cuda_stream()>>>(x, n);
    return dsq__cuda_launched("softmax");
}

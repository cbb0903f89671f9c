// CUDA twin of kernels/cpu/swiglu.c: out = silu(gate) * up, grid-stride
// elementwise in fp32 on the widened inputs; same overflow-safe form
// g / (1 + exp(-g)). All three arrays have the step's activation type.

#include "cuda_internal.cuh"

template <typename T>
static __global__ void swiglu_kernel(T *out, const T *gate, const T *up, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = dsq__ld(gate, i);
        dsq__st(out, i, g / (1.0f + expf(-g)) * dsq__ld(up, i));
    }
}

extern "C" int dsq_cuda_swiglu(void *out, const void *gate, const void *up, dsq_ftype_t t,
                               int64_t m, int64_t n)
{
    if (!out || !gate || !up || m < 0 || n < 0 || !dsq__ft_ok(t))
        return DSQ_EINVAL;
    const int64_t total = m * n;
    if (total == 0)
        return DSQ_OK;
    DSQ__FT_DISPATCH(t, T, swiglu_kernel<T><<<dsq__cuda_grid(total, 256), 256, 0,
                                              dsq__cuda_stream()>>>(
                               (T *)out, (const T *)gate, (const T *)up, total));
    return dsq__cuda_launched("swiglu");
}

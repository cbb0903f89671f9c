// CUDA twin of kernels/cpu/swiglu.c: out = silu(gate) * up, grid-stride
// elementwise; same overflow-safe form g / (1 + exp(-g)).

#include "cuda_internal.cuh"

static __global__ void swiglu_kernel(float *out, const float *gate,
                                     const float *up, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

extern "C" int dsq_cuda_swiglu(float *out, const float *gate, const float *up,
                               int64_t m, int64_t n)
{
    if (!out || !gate || !up || m < 0 || n < 0)
        return DSQ_EINVAL;
    const int64_t total = m * n;
    if (total == 0)
        return DSQ_OK;
    int64_t blocks = (total + 255) / 256;
    swiglu_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, dsq__cuda_stream()>>>(out, gate, up, total);
    return dsq__cuda_launched("swiglu");
}

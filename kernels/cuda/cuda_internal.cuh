// Shared by the kernels/cuda/*.cu files, not an API: the calling thread's
// stream (stream.cu), launch error checks that log the CUDA reason, fp16 /
// bf16 conversions and the per-element dequantisation of every
// dsq_wformat_t (the reference formulas of kernels.h, so embed, the
// generic products and the prefill tiles read weights exactly as the CPU
// ops do).
#ifndef DSQ_CUDA_INTERNAL_CUH
#define DSQ_CUDA_INTERNAL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "kernels/kernels.h"
}

// Stream of the calling thread's launches (dsq_cuda_set_stream; 0 = the
// legacy default stream).
cudaStream_t dsq__cuda_stream(void);

// After a launch: DSQ_OK, or DSQ_ECUDA with the CUDA error logged
// ("cuda op=<op> error=<reason>").
static inline int dsq__cuda_launched(const char *op)
{
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return DSQ_OK;
    dsq_log(DSQ_LOG_ERROR, "cuda op=%s error=\"%s\"", op, cudaGetErrorString(e));
    return DSQ_ECUDA;
}

// Grid size for a grid-stride loop over n items in blocks of bs threads.
static inline unsigned dsq__cuda_grid(int64_t n, int bs)
{
    const int64_t b = (n + bs - 1) / bs;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

static __device__ __forceinline__ float dsq__h2f(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}
static __device__ __forceinline__ float dsq__bf2f(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

// Host-side validation of a weight, the checks dsq_cpu_matmul makes.
static inline bool dsq__cuda_weight_ok(const dsq_weight_t *w)
{
    if (!w || !w->data || w->n < 1 || w->k < 1)
        return false;
    switch (w->format) {
    case DSQ_WFMT_F32:
    case DSQ_WFMT_F16:
    case DSQ_WFMT_BF16:
        return true;
    case DSQ_WFMT_Q8_0:
        return w->k % 32 == 0;
    case DSQ_WFMT_INT8:
        return w->scales != NULL;
    case DSQ_WFMT_INT4:
        return (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) &&
               w->scales && (w->zp_mode == DSQ_ZP_SYM || w->zeros) &&
               (w->zp_mode == DSQ_ZP_SYM || w->zp_mode == DSQ_ZP_INT ||
                w->zp_mode == DSQ_ZP_MIN);
    }
    return false;
}

// INT4 weight value of nibble q in a group with scale s and zero z
// (kernels.h dsq_zp_mode_t; z unused for SYM).
static __device__ __forceinline__ float dsq__int4_value(int q, float s, float z, int mode)
{
    if (mode == DSQ_ZP_SYM)
        return (float)(q - 8) * s;
    if (mode == DSQ_ZP_INT)
        return ((float)q - z) * s;
    return (float)q * s + z;
}

// Element j (< k) of row r (< n) of w, dequantised to fp32 by the format's
// formula (kernels.h); w is a host struct with device pointers.
static __device__ float dsq__weight_at(const dsq_weight_t &w, int64_t r, int64_t j)
{
    const int64_t k = w.k;
    switch (w.format) {
    case DSQ_WFMT_F32:
        return ((const float *)w.data)[r * k + j];
    case DSQ_WFMT_F16:
        return dsq__h2f(((const uint16_t *)w.data)[r * k + j]);
    case DSQ_WFMT_BF16:
        return dsq__bf2f(((const uint16_t *)w.data)[r * k + j]);
    case DSQ_WFMT_Q8_0: {
        const uint8_t *b = (const uint8_t *)w.data + (r * (k / 32) + j / 32) * 34;
        return (float)((const int8_t *)b)[2 + j % 32] * dsq__h2f(*(const uint16_t *)b);
    }
    case DSQ_WFMT_INT8:
        return (float)((const int8_t *)w.data)[r * k + j] * dsq__h2f(w.scales[r]);
    case DSQ_WFMT_INT4: {
        const int64_t nb = (k + 31) / 32, gs = w.group_size, groups = (k + gs - 1) / gs;
        const uint8_t b = ((const uint8_t *)w.data)[r * nb * 16 + (j / 32) * 16 + (j % 16)];
        const int q = (j % 32) < 16 ? (b & 15) : (b >> 4);
        const int64_t g = r * groups + j / gs;
        const float z = w.zp_mode == DSQ_ZP_SYM ? 0.0f : dsq__h2f(w.zeros[g]);
        return dsq__int4_value(q, dsq__h2f(w.scales[g]), z, w.zp_mode);
    }
    }
    return 0.0f;
}

#endif

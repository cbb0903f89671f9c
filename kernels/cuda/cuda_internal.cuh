// Shared by the kernels/cuda/*.cu files, not an API: the calling thread's
// stream (stream.cu), launch error checks that log the CUDA reason, fp16 /
// bf16 conversions, the activation element types (dsq_ftype_t) and the per-element dequantisation of every
// dsq_wformat_t (the reference formulas of kernels.h, so embed, the
// generic products and the prefill tiles read weights exactly as the CPU
// ops do).
#ifndef DSQ_CUDA_INTERNAL_CUH
#define DSQ_CUDA_INTERNAL_CUH

#include <cuda_bf16.h>
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

// fp32 -> bf16 bits rounded to nearest even (a NaN stays a quiet NaN), in
// integer operations rather than cvt.rn.bf16.f32: the same instructions on
// every arch, the simulator's included (its PTX front end has no bf16 cvt).
static __device__ __forceinline__ uint16_t dsq__f2bf_rn(float f)
{
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Activation elements (kernels.h dsq_ftype_t): dsq__ld widens one to fp32
// (exact), dsq__st stores an fp32 value rounded to nearest even.
static __device__ __forceinline__ float dsq__ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float dsq__ld(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
static __device__ __forceinline__ float dsq__ld(const __nv_bfloat16 *p, int64_t i)
{
    return dsq__bf2f(__bfloat16_as_ushort(p[i]));
}
static __device__ __forceinline__ void dsq__st(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void dsq__st(__half *p, int64_t i, float v)
{
    p[i] = __float2half_rn(v);
}
static __device__ __forceinline__ void dsq__st(__nv_bfloat16 *p, int64_t i, float v)
{
    p[i] = __ushort_as_bfloat16(dsq__f2bf_rn(v));
}

// Run `body` with T the C++ element type of ftype t (float, __half or
// __nv_bfloat16); a t outside the enum returns DSQ_EINVAL from the caller.
#define DSQ__FT_DISPATCH(t, T, ...)                 \
    switch (t) {                                    \
    case DSQ_FT_F32: {                              \
        typedef float T;                            \
        __VA_ARGS__;                                \
        break;                                      \
    }                                               \
    case DSQ_FT_F16: {                              \
        typedef __half T;                           \
        __VA_ARGS__;                                \
        break;                                      \
    }                                               \
    case DSQ_FT_BF16: {                             \
        typedef __nv_bfloat16 T;                    \
        __VA_ARGS__;                                \
        break;                                      \
    }                                               \
    default:                                        \
        return DSQ_EINVAL;                          \
    }

static inline bool dsq__ft_ok(dsq_ftype_t t)
{
    return t == DSQ_FT_F32 || t == DSQ_FT_F16 || t == DSQ_FT_BF16;
}

// Host-side validation of a weight, the checks dsq_cpu_matmul makes
// (kernels.h dsq_weight_check: every layout, pointers included).
static inline bool dsq__cuda_weight_ok(const dsq_weight_t *w)
{
    return dsq_weight_check(w) == DSQ_OK;
}

// True for the INT4 layouts gemv_int4_kernel reads (F16 scales, group >= 32,
// SYM/INT/MIN); every other INT4 layout and INT8G take the generic kernels
// through dsq__weight_at.
static inline bool dsq__cuda_int4_classic(const dsq_weight_t *w)
{
    return w->format == DSQ_WFMT_INT4 && w->scale_mode == DSQ_SCALE_F16 &&
           w->group_size >= 32 && w->zp_mode != DSQ_ZP_LUT;
}

// kernels.h dsq_iq4nl_values (IQ4_NL / IQ4_XS codebook), one copy per file.
static __constant__ int8_t dsq__iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

// Weight value of stored integer q (INT4 nibble or INT8G byte) in group g
// (of groups per row) of row r, by the formula of dsq_weight_dequant_row
// (kernels.h: same operations in the same order, so the CPU and CUDA read
// identical fp32 weights).
static __device__ float dsq__group_value(const dsq_weight_t &w, int64_t r, int64_t g,
                                         int64_t groups, int q)
{
    const int64_t i = r * groups + g;
    const bool int4 = w.format == DSQ_WFMT_INT4;
    float s;
    if (w.scale_mode == DSQ_SCALE_SUPER && w.zp_mode == DSQ_ZP_LUT) {
        // IQ4_XS: 6-bit a in the file's packing, d alone (kernels.h)
        const int64_t b = r * (w.k / 256) + g / 8;
        const int a = dsq_iq4xs_sub((const uint8_t *)w.sub_scales + b * 6, (int)(g % 8));
        return (float)dsq__iq4nl[q] * (dsq__h2f(w.super[b]) * (float)a);
    }
    if (w.scale_mode == DSQ_SCALE_SUPER) {
        const uint16_t *sb = w.super + 2 * (r * (w.k / 256) + g * w.group_size / 256);
        s = dsq__h2f(sb[0]) * (float)w.sub_scales[i];
        switch (w.zp_mode) {
        case DSQ_ZP_SYM: return int4 ? (float)(q - 8) * s : (float)q * s;
        case DSQ_ZP_INT: return (float)(q - w.sub_zeros[i]) * s;
        case DSQ_ZP_LUT: return (float)dsq__iq4nl[q] * s;
        default: return (float)q * s + dsq__h2f(sb[1]) * (float)w.sub_zeros[i];
        }
    }
    s = dsq__h2f(w.scales[i]);
    switch (w.zp_mode) {
    case DSQ_ZP_SYM: return int4 ? (float)(q - 8) * s : (float)q * s;
    case DSQ_ZP_INT: return ((float)q - dsq__h2f(w.zeros[i])) * s;
    case DSQ_ZP_LUT: return (float)dsq__iq4nl[q] * s;
    default: return (float)q * s + dsq__h2f(w.zeros[i]);
    }
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
        return dsq__group_value(w, r, j / gs, groups, q);
    }
    case DSQ_WFMT_INT8G: {
        const int64_t kp = (k + 31) / 32 * 32, gs = w.group_size, groups = (k + gs - 1) / gs;
        const int q = ((const int8_t *)w.data)[r * kp + j];
        return dsq__group_value(w, r, j / gs, groups, q);
    }
    }
    return 0.0f;
}

#endif

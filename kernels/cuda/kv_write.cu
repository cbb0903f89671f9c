// CUDA twin of kernels/cpu/kv_write.c. FP16: one thread per element,
// __float2half_rn (round to nearest even, the CPU's rounding). INT8: one
// warp per (token, kv head, group of 64): warp min/max, then lane 0 picks
// s and z with the CPU's exact float operations (no FMA contraction, IEEE
// division), so both backends store the same bytes. Slots outside the cache
// are skipped (the host cannot see device slots; see kernels.h). k and v
// come in the step's activation type and are widened to fp32 first, so the
// bytes stored are the CPU op's on the widened values.
#include <math.h>

#include "cuda_internal.cuh"

template <typename T>
static __global__ void kv_f16_kernel(uint16_t *kc, uint16_t *vc, const T *k,
                                     const T *v, const int32_t *slot,
                                     int64_t m, int row, int64_t n_slots)
{
    const int64_t total = m * row;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / row, j = e % row;
        const int64_t t = slot[i];
        if (t < 0 || t >= n_slots)
            continue;
        kc[t * row + j] = __half_as_ushort(__float2half_rn(dsq__ld(k, e)));
        vc[t * row + j] = __half_as_ushort(__float2half_rn(dsq__ld(v, e)));
    }
}

template <typename T>
static __device__ void quant_group(int8_t *q, uint16_t *s_out, uint16_t *z_out,
                                   const T *v, int n)
{
    const int lane = threadIdx.x % 32;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = lane; i < n; i += 32) {
        lo = fminf(lo, dsq__ld(v, i));
        hi = fmaxf(hi, dsq__ld(v, i));
    }
    for (int o = 16; o > 0; o >>= 1) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    const float amax = fmaxf(fabsf(lo), fabsf(hi));
    float s = __fdiv_rn(__fsub_rn(hi, lo), 254.0f);
    const float floor_s = __fdiv_rn(amax, 1000.0f);
    if (s < floor_s)
        s = floor_s;
    if (s > 65504.0f)
        s = 65504.0f;
    const __half sh = __float2half_rn(s);
    const float sf = __half2float(sh);
    if (!(sf > 0.0f)) {
        for (int i = lane; i < n; i += 32)
            q[i] = 0;
        if (lane == 0) {
            *s_out = 0;
            *z_out = 0;
        }
        return;
    }
    const __half zh = __float2half_rn(__fdiv_rn(-__fadd_rn(lo, hi), __fmul_rn(2.0f, sf)));
    const float zf = __half2float(zh);
    const float inv = __fdiv_rn(1.0f, sf);
    for (int i = lane; i < n; i += 32) {
        float t = rintf(__fadd_rn(__fmul_rn(dsq__ld(v, i), inv), zf));
        t = fminf(fmaxf(t, -128.0f), 127.0f);
        q[i] = (int8_t)t;
    }
    if (lane == 0) {
        *s_out = __half_as_ushort(sh);
        *z_out = __half_as_ushort(zh);
    }
}

// One warp per (token i, kv head h, group g); 4 warps per block.
template <typename T>
static __global__ void kv_int8_kernel(dsq_kv_layer_t kv, const T *k,
                                      const T *v, const int32_t *slot,
                                      int64_t m, int n_groups, int64_t n_slots)
{
    const int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    const int64_t per_tok = (int64_t)kv.n_kv_heads * n_groups;
    if (w >= m * per_tok)
        return;
    const int64_t i = w / per_tok;
    const int h = (int)((w % per_tok) / n_groups), g = (int)(w % n_groups);
    const int64_t t = slot[i];
    if (t < 0 || t >= n_slots)
        return;
    const int D = kv.head_dim, gs = D / n_groups, row = kv.n_kv_heads * D;
    const int64_t src = i * row + (int64_t)h * D + g * gs;
    const int64_t dst = t * row + (int64_t)h * D + g * gs;
    const int64_t sc = (t * kv.n_kv_heads + h) * n_groups + g;
    quant_group((int8_t *)kv.k + dst, kv.k_scale + sc, kv.k_zero + sc, k + src, gs);
    quant_group((int8_t *)kv.v + dst, kv.v_scale + sc, kv.v_zero + sc, v + src, gs);
}

extern "C" int dsq_cuda_kv_write(const dsq_kv_layer_t *kv, const void *k, const void *v,
                                 dsq_ftype_t ft, const int32_t *slot, int64_t m)
{
    if (!kv || !k || !v || !slot || m < 0 || !dsq__ft_ok(ft) || kv->block_size < 1 ||
        kv->n_kv_heads < 1 || kv->head_dim < 1 || kv->head_dim > 1024 ||
        kv->n_blocks < 0 || !kv->k || !kv->v)
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_INT8 &&
        (!kv->k_scale || !kv->k_zero || !kv->v_scale || !kv->v_zero))
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_F32)
        return DSQ_EUNSUPPORTED;   /* well-formed, not on CUDA (kernels.h) */
    if (kv->dtype != DSQ_KV_F16 && kv->dtype != DSQ_KV_INT8)
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    const int64_t n_slots = kv->n_blocks * kv->block_size;
    const int row = kv->n_kv_heads * kv->head_dim;
    if (kv->dtype == DSQ_KV_F16) {
        DSQ__FT_DISPATCH(ft, T, kv_f16_kernel<T><<<dsq__cuda_grid(m * row, 256), 256, 0,
                                                   dsq__cuda_stream()>>>(
                                    (uint16_t *)kv->k, (uint16_t *)kv->v, (const T *)k,
                                    (const T *)v, slot, m, row, n_slots));
    } else {
        const int n_groups = dsq_kv_n_groups(kv->head_dim);
        const int64_t warps = m * kv->n_kv_heads * n_groups;
        if ((warps + 3) / 4 > 0x7fffffff)
            return DSQ_EINVAL;
        DSQ__FT_DISPATCH(ft, T, kv_int8_kernel<T><<<(unsigned)((warps + 3) / 4), 128, 0,
                                                    dsq__cuda_stream()>>>(
                                    *kv, (const T *)k, (const T *)v, slot, m, n_groups,
                                    n_slots));
    }
    return dsq__cuda_launched("kv_write");
}

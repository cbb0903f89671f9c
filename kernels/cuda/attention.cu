// CUDA twin of kernels/cpu/attention.c (paged, causal, GQA, FP16/INT8 KV).
//
// One thread block of 4 warps per (query row, query head). The block's
// positions 0..pos are dealt round-robin to the warps; each warp keeps its
// own online-softmax state (running max, running sum, and an accumulator of
// head_dim / 32 values per lane in registers) and handles one token at a
// time: lanes split head_dim, a shuffle reduction gives the score. At the
// end the four partial states are merged through shared memory. Built for
// decode (one query per row) but correct for any row positions, so prefill
// rows work too. Rows whose position or blocks are out of range produce
// zeros (device-side index arrays cannot be validated by the host).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "engine/common/error.h"
#include "kernels/kernels.h"
}

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 32          // head_dim <= 1024

static __device__ __forceinline__ float kv_load(const dsq_kv_layer_t &kv,
                                                const void *base,
                                                const uint16_t *sc,
                                                const uint16_t *zr, int64_t t,
                                                int kh, int d, int n_groups,
                                                int gs)
{
    const int64_t e = (t * kv.n_kv_heads + kh) * (int64_t)kv.head_dim + d;
    if (kv.dtype == DSQ_KV_F16)
        return __half2float(__ushort_as_half(((const uint16_t *)base)[e]));
    const int64_t g = (t * kv.n_kv_heads + kh) * n_groups + d / gs;
    const float s = __half2float(__ushort_as_half(sc[g]));
    const float z = __half2float(__ushort_as_half(zr[g]));
    return ((float)((const int8_t *)base)[e] - z) * s;
}

static __global__ void attention_kernel(float *out, const float *q, int n_heads,
                                        dsq_kv_layer_t kv, const int32_t *row_seq,
                                        const int32_t *row_pos,
                                        const int32_t *block_tables,
                                        int max_blocks, float scale, int n_groups)
{
    extern __shared__ float sh[];             // q[D] | acc[W][D] | m[W] | l[W]
    const int D = kv.head_dim, bs = kv.block_size;
    const int h = blockIdx.x, i = blockIdx.y;
    const int kh = h / (n_heads / kv.n_kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gs = D / n_groups;
    float *qs = sh, *accs = sh + D, *ms = accs + ATT_WARPS * D, *ls = ms + ATT_WARPS;
    const int64_t qoff = ((int64_t)i * n_heads + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = q[qoff + d];
    __syncthreads();

    const int seq = row_seq[i], pos = row_pos[i];
    bool ok = seq >= 0 && pos >= 0 && pos < (int64_t)max_blocks * bs;
    const int32_t *bt = block_tables + (int64_t)(seq < 0 ? 0 : seq) * max_blocks;

    float acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int r = 0; r < ATT_MAX_PER_LANE; r++)
        acc[r] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    bool bad = false;
    const int last = ok ? pos : -1;
    for (int p = warp; p <= last; p += ATT_WARPS) {
        const int32_t b = bt[p / bs];
        if (b < 0 || b >= kv.n_blocks) {
            bad = true;
            break;
        }
        const int64_t t = (int64_t)b * bs + p % bs;
        float part = 0.0f;
#pragma unroll
        for (int r = 0; r < ATT_MAX_PER_LANE; r++) {
            const int d = lane + 32 * r;
            if (d < D)
                part += qs[d] * kv_load(kv, kv.k, kv.k_scale, kv.k_zero, t, kh, d,
                                        n_groups, gs);
        }
        for (int o = 16; o > 0; o >>= 1)
            part += __shfl_xor_sync(0xffffffffu, part, o);
        const float s = part * scale;
        const float nm = fmaxf(mx, s);
        const float corr = expf(mx - nm);      // 0 when mx == -inf
        const float pw = expf(s - nm);
        l = l * corr + pw;
#pragma unroll
        for (int r = 0; r < ATT_MAX_PER_LANE; r++) {
            const int d = lane + 32 * r;
            if (d < D)
                acc[r] = acc[r] * corr + pw * kv_load(kv, kv.v, kv.v_scale, kv.v_zero,
                                                      t, kh, d, n_groups, gs);
        }
        mx = nm;
    }
    // a bad block in any warp poisons the whole row: zeros
    ok = __syncthreads_and(ok && !bad);
#pragma unroll
    for (int r = 0; r < ATT_MAX_PER_LANE; r++) {
        const int d = lane + 32 * r;
        if (d < D)
            accs[warp * D + d] = acc[r];
    }
    if (lane == 0) {
        ms[warp] = mx;
        ls[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, ms[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (ms[w] != -INFINITY)
            L += ls[w] * expf(ms[w] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (ms[w] != -INFINITY)
                o += accs[w * D + d] * expf(ms[w] - M);
        out[qoff + d] = ok ? o / L : 0.0f;
    }
}

extern "C" int dsq_cuda_attention(float *out, const float *q, int64_t m,
                                  int n_heads, const dsq_kv_layer_t *kv,
                                  const int32_t *row_seq, const int32_t *row_pos,
                                  const int32_t *block_tables, int max_blocks,
                                  float scale)
{
    if (!out || !q || !kv || !row_seq || !row_pos || !block_tables || m < 0 ||
        n_heads < 1 || kv->n_kv_heads < 1 || n_heads % kv->n_kv_heads ||
        kv->head_dim < 1 || kv->head_dim > 32 * ATT_MAX_PER_LANE ||
        kv->block_size < 1 || max_blocks < 1 || !kv->k || !kv->v ||
        m > 65535)
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_INT8 &&
        (!kv->k_scale || !kv->k_zero || !kv->v_scale || !kv->v_zero))
        return DSQ_EINVAL;
    if (kv->dtype != DSQ_KV_F16 && kv->dtype != DSQ_KV_INT8)
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    const int D = kv->head_dim;
    const size_t shmem = sizeof(float) * ((size_t)D * (1 + ATT_WARPS) + 2 * ATT_WARPS);
    dim3 grid((unsigned)n_heads, (unsigned)m);
    attention_kernel<<<grid, 32 * ATT_WARPS, shmem>>>(
        out, q, n_heads, *kv, row_seq, row_pos, block_tables, max_blocks, scale,
        dsq_kv_n_groups(D));
    return cudaGetLastError() == cudaSuccess ? DSQ_OK : DSQ_ECUDA;
}

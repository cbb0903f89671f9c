// CUDA twin of kernels/cpu/matmul.c: y[m][n] = x[m][k] . W^T (+ bias) for
// every dsq_wformat_t, fp32 accumulation, activations fp32, fp16 or bf16
// (x and y of one type, or fp32 y from narrow x: the output head). Weights
// are dequantised by the formulas of kernels.h in registers, so results
// equal the CPU op with DSQ_ACT_F32 on the widened x up to fp32 summation
// order and the rounding of y.
//
// Decode (m <= 16): one warp per output feature, all m activation rows at
// once (MT accumulators in registers), so each weight byte is read once.
// INT4 (every layout) and INT8G: each lane takes whole 32-weight chunks,
// one 16-byte load (the native layout's chunk; INT8G two) dequantised into
// 32 registers with the group's scale and zero point, then FMA'd with each
// row's 32 activations (16-byte loads when k allows). Other formats: lanes stride over k one element at a
// time (coalesced), F32/F16 read directly, the rest dequantised each.
//
// Prefill (m > 16): 64x64 output tiles, k in steps of 32, x and the
// dequantised weight tile staged in shared memory, 4x4 fp32 outputs per
// thread: a portable kernel (any sm). Compiled with DSQ_CUDA_TC (sm_80
// and later only), quantised weights take a tensor-core tile instead:
// fp16 tiles, mma.sync with fp32 sums (tc_gemm_kernel below). The library
// does not turn it on yet: the simulator's model checks run an sm_75
// build, so a model would take the tile only on a real GPU, untested end
// to end. bf16 activations take bf16 tiles (mma .bf16). Not yet the
// packed-layout, cp.async-pipelined kernel INT4 weights want, nor cuBLAS
// for fp16 / bf16 weights.
//
// tests/meson.build compiles this file a second time for compute_80 with
// DSQ_CUDA_TC, under other entry names, to run that tile in the GPU
// simulator (and on any sm_80+ GPU) beside the library's own build.
#ifdef DSQ_CUDA_MATMUL_TEST_NAMES
#define dsq_cuda_matmul dsq_test_tc_matmul
#endif
#include "cuda_internal.cuh"

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// sum_j wv[j] * xr[j] over the nj (<= 32) valid activations of a chunk.
static __device__ __forceinline__ float chunk_dot(const float *wv, const float *xr,
                                                  int nj, bool vec)
{
    float a = 0.0f;
    if (nj == 32 && vec) {
        const float4 *x4 = (const float4 *)xr;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 v = __ldg(x4 + i);
            a += wv[4 * i] * v.x + wv[4 * i + 1] * v.y + wv[4 * i + 2] * v.z +
                 wv[4 * i + 3] * v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++)
            if (j < nj)
                a += wv[j] * xr[j];
    }
    return a;
}
// The two 16-bit activations of a 32-bit word as fp32, the low one first.
static __device__ __forceinline__ float2 widen2(uint32_t u, __half)
{
    return __half22float2(*(const __half2 *)&u);
}
static __device__ __forceinline__ float2 widen2(uint32_t u, __nv_bfloat16)
{
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// fp16 / bf16 activations: a full chunk is 4 16-byte loads of 8 values.
template <typename TX>
static __device__ __forceinline__ float chunk_dot(const float *wv, const TX *xr, int nj,
                                                  bool vec)
{
    float a = 0.0f;
    if (nj == 32 && vec) {
        const uint4 *x4 = (const uint4 *)xr;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 v = __ldg(x4 + i);
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int h = 0; h < 4; h++) {
                const float2 f = widen2(u[h], TX());
                a += wv[8 * i + 2 * h] * f.x + wv[8 * i + 2 * h + 1] * f.y;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++)
            if (j < nj)
                a += wv[j] * dsq__ld(xr, j);
    }
    return a;
}

template <int MT, typename TX, typename TY>
static __global__ void __launch_bounds__(128)
gemv_int4_kernel(TY *y, const TX *x, int m, dsq_weight_t w, bool vec)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * 4 + warp;
    if (n >= w.n)
        return;
    const int64_t k = w.k, nb = (k + 31) / 32, gs = w.group_size,
                  groups = (k + gs - 1) / gs;
    const uint4 *row = (const uint4 *)((const uint8_t *)w.data + n * nb * 16);
    const int mode = w.zp_mode;
    float acc[MT];
#pragma unroll
    for (int r = 0; r < MT; r++)
        acc[r] = 0.0f;
    for (int64_t c = lane; c < nb; c += 32) {
        const uint4 q4 = __ldg(row + c);
        const int64_t g = n * groups + (c * 32) / gs;
        const float s = dsq__h2f(w.scales[g]);
        const float z = mode == DSQ_ZP_SYM ? 0.0f : dsq__h2f(w.zeros[g]);
        const uint32_t word[4] = {q4.x, q4.y, q4.z, q4.w};
        float wv[32];
#pragma unroll
        for (int b = 0; b < 16; b++) {
            const uint32_t byte = (word[b / 4] >> (8 * (b % 4))) & 0xffu;
            wv[b] = dsq__int4_value((int)(byte & 15u), s, z, mode);
            wv[b + 16] = dsq__int4_value((int)(byte >> 4), s, z, mode);
        }
        const int64_t j0 = c * 32;
        const int nj = k - j0 < 32 ? (int)(k - j0) : 32;
#pragma unroll
        for (int r = 0; r < MT; r++)
            if (r < m)
                acc[r] += chunk_dot(wv, x + r * k + j0, nj, vec);
    }
    const float bias = w.bias ? w.bias[n] : 0.0f;
#pragma unroll
    for (int r = 0; r < MT; r++) {
        const float v = warp_sum(acc[r]);
        if (r < m && lane == 0)
            dsq__st(y, r * w.n + n, v + bias);
    }
}

// The GGUF layouts (kernels.h: INT4 with super-block scales, group 16 or
// the IQ4 codebook; INT8G): as gemv_int4_kernel, each lane a whole
// 32-weight chunk (16 bytes of nibbles or 32 int8), dequantised into 32
// registers by dsq__group_value's formula, whose scale and zero point are
// taken once per group: with group 16 the chunk's first 16 weights (the
// low nibbles) are one group and the last 16 the next.
template <int MT, typename TX, typename TY>
static __global__ void __launch_bounds__(128)
gemv_gguf_kernel(TY *y, const TX *x, int m, dsq_weight_t w, bool vec)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * 4 + warp;
    if (n >= w.n)
        return;
    const int64_t k = w.k, nb = (k + 31) / 32, gs = w.group_size,
                  groups = (k + gs - 1) / gs, kp = nb * 32;
    const bool int4 = w.format == DSQ_WFMT_INT4;
    float acc[MT];
#pragma unroll
    for (int r = 0; r < MT; r++)
        acc[r] = 0.0f;
    for (int64_t c = lane; c < nb; c += 32) {
        const int64_t g_lo = gs == 16 ? 2 * c : c * 32 / gs;
        const int64_t g_hi = gs == 16 ? 2 * c + 1 : g_lo;
        float wv[32];
        if (int4) {
            const uint4 q4 = __ldg((const uint4 *)((const uint8_t *)w.data + n * nb * 16) + c);
            const uint32_t word[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
            for (int b = 0; b < 16; b++) {
                const uint32_t byte = (word[b / 4] >> (8 * (b % 4))) & 0xffu;
                wv[b] = dsq__group_value(w, n, g_lo, groups, (int)(byte & 15u));
                wv[b + 16] = dsq__group_value(w, n, g_hi, groups, (int)(byte >> 4));
            }
        } else {
            const uint4 *p = (const uint4 *)((const int8_t *)w.data + n * kp + c * 32);
            const uint4 a = __ldg(p), b2 = __ldg(p + 1);
            const uint32_t word[8] = {a.x, a.y, a.z, a.w, b2.x, b2.y, b2.z, b2.w};
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const int q = (int)(int8_t)((word[j / 4] >> (8 * (j % 4))) & 0xffu);
                wv[j] = dsq__group_value(w, n, j < 16 ? g_lo : g_hi, groups, q);
            }
        }
        const int64_t j0 = c * 32;
        const int nj = k - j0 < 32 ? (int)(k - j0) : 32;
#pragma unroll
        for (int r = 0; r < MT; r++)
            if (r < m)
                acc[r] += chunk_dot(wv, x + r * k + j0, nj, vec);
    }
    const float bias = w.bias ? w.bias[n] : 0.0f;
#pragma unroll
    for (int r = 0; r < MT; r++) {
        const float v = warp_sum(acc[r]);
        if (r < m && lane == 0)
            dsq__st(y, r * w.n + n, v + bias);
    }
}

// Element j of row n: F32 and F16 (the plain formats of unquantised
// checkpoints) read directly; F = -1 takes dsq__weight_at's format switch.
template <int F>
static __device__ __forceinline__ float weight_elem(const dsq_weight_t &w, int64_t n,
                                                    int64_t j)
{
    if (F == DSQ_WFMT_F32)
        return __ldg((const float *)w.data + n * w.k + j);
    if (F == DSQ_WFMT_F16)
        return dsq__h2f(__ldg((const unsigned short *)w.data + n * w.k + j));
    return dsq__weight_at(w, n, j);
}

template <int MT, typename TX, typename TY, int F>
static __global__ void __launch_bounds__(128)
gemv_generic_kernel(TY *y, const TX *x, int m, dsq_weight_t w)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * 4 + warp;
    if (n >= w.n)
        return;
    const int64_t k = w.k;
    float acc[MT];
#pragma unroll
    for (int r = 0; r < MT; r++)
        acc[r] = 0.0f;
    for (int64_t j = lane; j < k; j += 32) {
        const float wv = weight_elem<F>(w, n, j);
#pragma unroll
        for (int r = 0; r < MT; r++)
            if (r < m)
                acc[r] += wv * dsq__ld(x, r * k + j);
    }
    const float bias = w.bias ? w.bias[n] : 0.0f;
#pragma unroll
    for (int r = 0; r < MT; r++) {
        const float v = warp_sum(acc[r]);
        if (r < m && lane == 0)
            dsq__st(y, r * w.n + n, v + bias);
    }
}

#define GM_TILE 64
#define GM_K 32

template <typename TX, typename TY>
static __global__ void __launch_bounds__(256)
gemm_kernel(TY *y, const TX *x, int64_t m, dsq_weight_t w)
{
    __shared__ float xs[GM_K][GM_TILE + 4];   // [kk][row]
    __shared__ float ws[GM_K][GM_TILE + 4];   // [kk][output]
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t row0 = (int64_t)blockIdx.y * GM_TILE, col0 = (int64_t)blockIdx.x * GM_TILE;
    const int64_t k = w.k, n = w.n;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += GM_K) {
#pragma unroll
        for (int i = 0; i < GM_TILE * GM_K / 256; i++) {
            const int e = threadIdx.x + 256 * i, r = e / GM_K, kk = e % GM_K;
            const int64_t gr = row0 + r, gk = k0 + kk;
            xs[kk][r] = gr < m && gk < k ? dsq__ld(x, gr * k + gk) : 0.0f;
            const int64_t gc = col0 + r;
            ws[kk][r] = gc < n && gk < k ? dsq__weight_at(w, gc, gk) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GM_K; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = xs[kk][ty * 4 + i];
                b[i] = ws[kk][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t gr = row0 + ty * 4 + i;
        if (gr >= m)
            continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t gc = col0 + tx * 4 + j;
            if (gc < n)
                dsq__st(y, gr * n + gc, acc[i][j] + (w.bias ? w.bias[gc] : 0.0f));
        }
    }
}

// ---- Tensor-core tile (sm_80 and later; DSQ_CUDA_TC) ----
// The same product with the x tile and the dequantised W tile rounded to
// fp16 in shared memory and summed in fp32 by mma.sync.m16n8k16 (PTX ISA,
// "Matrix fragments for mma.m16n8k16 with floating point type"). A block
// owns 64 rows of x by 64 outputs and walks k in steps of 32; its 4 warps
// each own 32 x 32 (2 x 4 tiles of m16n8). Fragments come from shared
// memory through ldmatrix.x4: rows are TC_LD = 40 halves (80 bytes) apart,
// so the 8 rows of one 8x8 matrix start in 8 distinct groups of 4 banks.
// Each product sees one fp16 rounding of x and of w (relative 2^-11 each)
// and exact products summed in fp32: the error bound the tests check.
// bf16 activations take bf16 tiles and mma .bf16 (x is already bf16; w
// rounds to bf16, relative 2^-8), so no value is narrowed to fp16's range.
#define TC_BM 64
#define TC_BN 64
#define TC_BK 32
#define TC_LD 40
static_assert(TC_BM == GM_TILE && TC_BN == GM_TILE, "the prefill grid is in GM_TILE blocks");

#if defined(DSQ_CUDA_TC)
// The tile element of activations TX: bf16 for bf16, fp16 otherwise.
template <typename TX> struct tc_elem {
    typedef __half type;
};
template <> struct tc_elem<__nv_bfloat16> {
    typedef __nv_bfloat16 type;
};
static __device__ __forceinline__ __half tc_round(float v, __half) { return __float2half_rn(v); }
static __device__ __forceinline__ __nv_bfloat16 tc_round(float v, __nv_bfloat16)
{
    return __ushort_as_bfloat16(dsq__f2bf_rn(v));
}

static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p)
{
#if __CUDA_ARCH__ >= 800
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

// d += a . b for one m16n8k16 tile (a: 4 registers of fp16 or bf16 pairs,
// b: 2), the element type of E
static __device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2], __half)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
static __device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2], __nv_bfloat16)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <typename TX, typename TY>
static __global__ void __launch_bounds__(128)
tc_gemm_kernel(TY *y, const TX *x, int64_t m, dsq_weight_t w)
{
    typedef typename tc_elem<TX>::type E;
    __shared__ __align__(16) E xs[TC_BM][TC_LD];   // [row][kk]
    __shared__ __align__(16) E ws[TC_BN][TC_LD];   // [output][kk]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int64_t row0 = (int64_t)blockIdx.y * TC_BM, col0 = (int64_t)blockIdx.x * TC_BN;
    const int64_t k = w.k, n = w.n;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += TC_BK) {
#pragma unroll
        for (int i = 0; i < TC_BM * TC_BK / 128; i++) {
            const int e = tid + 128 * i, r = e / TC_BK, kk = e % TC_BK;
            const int64_t gk = k0 + kk, gr = row0 + r, gc = col0 + r;
            xs[r][kk] = tc_round(gr < m && gk < k ? dsq__ld(x, gr * k + gk) : 0.0f, E());
            ws[r][kk] = tc_round(gc < n && gk < k ? dsq__weight_at(w, gc, gk) : 0.0f, E());
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < TC_BK; ks += 16) {
            // A (16 x 16, row-major): matrices rows 0-7 / 8-15 at k 0-7,
            // then at k 8-15 (a0..a3); lane l points at row l % 16, k half l / 16
            uint32_t a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                ldmatrix_x4(a[i], &xs[wm + 16 * i + (lane & 15)][ks + (lane >> 4) * 8]);
            // B (16 x 8, column-major = 8 outputs of 16 k each): per n8 tile
            // k 0-7 then k 8-15; one x4 fills two tiles (lanes 16-31 the second)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint32_t t[4];
                ldmatrix_x4(t, &ws[wn + 16 * j + (lane & 7) + (lane >> 4) * 8]
                                  [ks + ((lane >> 3) & 1) * 8]);
                b[2 * j][0] = t[0];
                b[2 * j][1] = t[1];
                b[2 * j + 1][0] = t[2];
                b[2 * j + 1][1] = t[3];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    mma_16816(acc[i][j], a[i], b[j], E());
        }
        __syncthreads();
    }
    // C fragment: c0, c1 at row l / 4, columns 2 (l % 4) + 0, 1; c2, c3 eight
    // rows below
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t gr = row0 + wm + 16 * i + (lane >> 2) + (e >> 1) * 8;
                const int64_t gc = col0 + wn + 8 * j + (lane & 3) * 2 + (e & 1);
                if (gr < m && gc < n)
                    dsq__st(y, gr * n + gc, acc[i][j][e] + (w.bias ? w.bias[gc] : 0.0f));
            }
}

// True where the tensor-core tile takes a prefill product: a device of
// compute capability 8.0 or later and a quantised weight (its dequantised
// values are small multiples of fp16 scales; fp32 / fp16 / bf16 weights
// keep the fp32 tile until cuBLAS takes them).
static bool use_tc(const dsq_weight_t *w)
{
    static int cc_major = -1;   // the process's device, asked once
    if (cc_major < 0) {
        int dev = 0, v = 0;
        cc_major = cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) ==
                       cudaSuccess ? v : 0;
    }
    return cc_major >= 8 && w->format != DSQ_WFMT_F32 && w->format != DSQ_WFMT_F16 &&
           w->format != DSQ_WFMT_BF16;
}
#endif

template <int MT, typename TX, typename TY>
static void launch_gemv(TY *y, const TX *x, int m, const dsq_weight_t *w)
{
    const unsigned grid = (unsigned)((w->n + 3) / 4);
    cudaStream_t st = dsq__cuda_stream();
    // 16-byte activation loads: every row start 16-byte aligned
    const bool vec = (w->k * sizeof(TX)) % 16 == 0 && ((uintptr_t)x % 16) == 0;
    if (dsq__cuda_int4_classic(w)) {
        gemv_int4_kernel<MT, TX, TY><<<grid, 128, 0, st>>>(y, x, m, *w, vec);
    } else if (w->format == DSQ_WFMT_INT4 || w->format == DSQ_WFMT_INT8G) {
        gemv_gguf_kernel<MT, TX, TY><<<grid, 128, 0, st>>>(y, x, m, *w, vec);
    } else if (w->format == DSQ_WFMT_F32) {
        gemv_generic_kernel<MT, TX, TY, DSQ_WFMT_F32><<<grid, 128, 0, st>>>(y, x, m, *w);
    } else if (w->format == DSQ_WFMT_F16) {
        gemv_generic_kernel<MT, TX, TY, DSQ_WFMT_F16><<<grid, 128, 0, st>>>(y, x, m, *w);
    } else {
        gemv_generic_kernel<MT, TX, TY, -1><<<grid, 128, 0, st>>>(y, x, m, *w);
    }
}

template <typename TX, typename TY>
static void launch_matmul(TY *y, const TX *x, int64_t m, const dsq_weight_t *w)
{
    const int mi = (int)m;
    if (m <= 1)
        launch_gemv<1>(y, x, mi, w);
    else if (m <= 2)
        launch_gemv<2>(y, x, mi, w);
    else if (m <= 4)
        launch_gemv<4>(y, x, mi, w);
    else if (m <= 8)
        launch_gemv<8>(y, x, mi, w);
    else if (m <= 16)
        launch_gemv<16>(y, x, mi, w);
    else {
        dim3 grid((unsigned)((w->n + GM_TILE - 1) / GM_TILE),
                  (unsigned)((m + GM_TILE - 1) / GM_TILE));
#if defined(DSQ_CUDA_TC)
        if (use_tc(w))
            tc_gemm_kernel<TX, TY><<<grid, 128, 0, dsq__cuda_stream()>>>(y, x, m, *w);
        else
#endif
            gemm_kernel<TX, TY><<<grid, 256, 0, dsq__cuda_stream()>>>(y, x, m, *w);
    }
}

extern "C" int dsq_cuda_matmul(void *y, dsq_ftype_t yt, const void *x, dsq_ftype_t xt,
                               int64_t m, const dsq_weight_t *w)
{
    if (!y || !x || m < 0 || !dsq__ft_ok(yt) || !dsq__ft_ok(xt) || !dsq__cuda_weight_ok(w) ||
        w->n > 0x7fffffffLL * 4 || m > 65535LL * GM_TILE)
        return DSQ_EINVAL;
    if (yt != xt && yt != DSQ_FT_F32)
        return DSQ_EUNSUPPORTED;
    if (m == 0)
        return DSQ_OK;
    if (yt == xt) {
        DSQ__FT_DISPATCH(xt, T, launch_matmul<T, T>((T *)y, (const T *)x, m, w));
    } else {
        DSQ__FT_DISPATCH(xt, T, launch_matmul<T, float>((float *)y, (const T *)x, m, w));
    }
    return dsq__cuda_launched("matmul");
}

// CUDA twin of kernels/cpu/attention.c (paged, causal, GQA, FP16/INT8 KV).
//
// One thread block of 4 warps per (query row, query head). Each warp is
// split into lane groups of LP = 8, 16 or 32 lanes (the smallest that
// covers head_dim), and the block's positions 0..pos are dealt round-robin
// to the lane groups; each group keeps its own online-softmax state
// (running max, running sum, and an accumulator of head_dim / LP values per
// lane in registers, the kernel built for 1..32 of them) and handles one token at a time: lanes split
// head_dim, a shuffle reduction within the group gives the score. At the
// end the partial states are merged through shared memory. Built for
// decode (one query per row) but correct for any row positions, so prefill
// rows work too. Rows whose position or blocks are out of range produce
// zeros (device-side index arrays cannot be validated by the host). q and
// out are in the step's activation type (template T); scores, softmax
// state and accumulators are fp32, and out is rounded once at the end.
#include <math.h>

#include "cuda_internal.cuh"

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

template <int LP, int R, typename T>
static __global__ void attention_kernel(T *out, const T *q, int n_heads,
                                        dsq_kv_layer_t kv, const int32_t *row_seq,
                                        const int32_t *row_pos,
                                        const int32_t *block_tables,
                                        int max_blocks, float scale, int n_groups)
{
    constexpr int PPW = 32 / LP;              // positions a warp takes at once
    constexpr int NV = ATT_WARPS * PPW;       // lane groups ("virtual warps")
    extern __shared__ float sh[];             // q[D] | acc[NV][D] | m[NV] | l[NV]
    const int D = kv.head_dim, bs = kv.block_size;
    const int h = blockIdx.x, i = blockIdx.y;
    const int kh = h / (n_heads / kv.n_kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int sub = lane % LP, vw = warp * PPW + lane / LP;
    const int gs = D / n_groups;
    float *qs = sh, *accs = sh + D, *ms = accs + NV * D, *ls = ms + NV;
    const int64_t qoff = ((int64_t)i * n_heads + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = dsq__ld(q, qoff + d);
    __syncthreads();

    const int seq = row_seq[i], pos = row_pos[i];
    bool ok = seq >= 0 && pos >= 0 && pos < (int64_t)max_blocks * bs;
    const int32_t *bt = block_tables + (int64_t)(seq < 0 ? 0 : seq) * max_blocks;

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    bool bad = false;
    const int last = ok ? pos : -1;
    // the trip count is the same for the whole warp (the shuffles need all
    // 32 lanes); a lane group past the last position idles in its round
    for (int p0 = warp * PPW; p0 <= last; p0 += NV) {
        const int p = p0 + lane / LP;
        bool live = p <= last;
        int64_t t = 0;
        if (live) {
            const int32_t b = bt[p / bs];
            if (b < 0 || b >= kv.n_blocks) {
                bad = true;
                live = false;
            } else {
                t = (int64_t)b * bs + p % bs;
            }
        }
        float part = 0.0f;
        if (live) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int d = sub + LP * r;
                if (d < D)
                    part += qs[d] * kv_load(kv, kv.k, kv.k_scale, kv.k_zero, t, kh, d,
                                            n_groups, gs);
            }
        }
        for (int o = LP / 2; o > 0; o >>= 1)
            part += __shfl_xor_sync(0xffffffffu, part, o);
        if (!live)
            continue;
        const float s = part * scale;
        const float nm = fmaxf(mx, s);
        const float corr = expf(mx - nm);      // 0 when mx == -inf
        const float pw = expf(s - nm);
        l = l * corr + pw;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int d = sub + LP * r;
            if (d < D)
                acc[r] = acc[r] * corr + pw * kv_load(kv, kv.v, kv.v_scale, kv.v_zero,
                                                      t, kh, d, n_groups, gs);
        }
        mx = nm;
    }
    // a bad block in any lane group poisons the whole row: zeros
    ok = __syncthreads_and(ok && !bad);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int d = sub + LP * r;
        if (d < D)
            accs[vw * D + d] = acc[r];
    }
    if (sub == 0) {
        ms[vw] = mx;
        ls[vw] = l;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < NV; w++)
        M = fmaxf(M, ms[w]);
    float L = 0.0f;
    for (int w = 0; w < NV; w++)
        if (ms[w] != -INFINITY)
            L += ls[w] * expf(ms[w] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < NV; w++)
            if (ms[w] != -INFINITY)
                o += accs[w * D + d] * expf(ms[w] - M);
        dsq__st(out, qoff + d, ok ? o / L : 0.0f);
    }
}

// Host-side checks shared by both launchers (the CPU op's, less the index
// arrays, which live on the device).
static int attention_check(const void *out, const void *q, dsq_ftype_t ft, int64_t m,
                           int n_heads,
                           const dsq_kv_layer_t *kv, const int32_t *row_seq,
                           const int32_t *row_pos, const int32_t *block_tables,
                           int max_blocks)
{
    if (!out || !q || !dsq__ft_ok(ft) || !kv || !row_seq || !row_pos || !block_tables || m < 0 ||
        n_heads < 1 || kv->n_kv_heads < 1 || n_heads % kv->n_kv_heads ||
        kv->head_dim < 1 || kv->head_dim > 32 * ATT_MAX_PER_LANE ||
        kv->block_size < 1 || max_blocks < 1 || !kv->k || !kv->v)
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_INT8 &&
        (!kv->k_scale || !kv->k_zero || !kv->v_scale || !kv->v_zero))
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_F32)
        return DSQ_EUNSUPPORTED;   /* well-formed, not on CUDA (kernels.h) */
    if (kv->dtype != DSQ_KV_F16 && kv->dtype != DSQ_KV_INT8)
        return DSQ_EINVAL;
    return DSQ_OK;
}

template <typename T>
static void launch_decode(T *out, const T *q, int64_t m, int n_heads,
                          const dsq_kv_layer_t *kv, const int32_t *row_seq,
                          const int32_t *row_pos, const int32_t *block_tables,
                          int max_blocks, float scale)
{
    const int D = kv->head_dim;
    // lanes per position: the smallest of 8, 16, 32 that covers head_dim
    // (narrow heads would leave most of a warp idle)
    const int lp = D <= 8 ? 8 : D <= 16 ? 16 : 32, nv = ATT_WARPS * (32 / lp);
    const size_t shmem = sizeof(float) * ((size_t)D * (1 + nv) + 2 * (size_t)nv);
    dim3 grid((unsigned)n_heads, (unsigned)m);
    const int ng = dsq_kv_n_groups(D);
    cudaStream_t st = dsq__cuda_stream();
#define ATT_LAUNCH(LP_, R_)                                                          \
    attention_kernel<LP_, R_, T><<<grid, 32 * ATT_WARPS, shmem, st>>>(                  \
        out, q, n_heads, *kv, row_seq, row_pos, block_tables, max_blocks, scale, ng)
    if (lp == 8)
        ATT_LAUNCH(8, 1);
    else if (lp == 16)
        ATT_LAUNCH(16, 1);
    else if (D <= 32)
        ATT_LAUNCH(32, 1);
    else if (D <= 64)
        ATT_LAUNCH(32, 2);
    else if (D <= 128)
        ATT_LAUNCH(32, 4);
    else if (D <= 256)
        ATT_LAUNCH(32, 8);
    else
        ATT_LAUNCH(32, ATT_MAX_PER_LANE);
#undef ATT_LAUNCH
}

extern "C" int dsq_cuda_attention(void *out, const void *q, dsq_ftype_t ft, int64_t m,
                                  int n_heads, const dsq_kv_layer_t *kv,
                                  const int32_t *row_seq, const int32_t *row_pos,
                                  const int32_t *block_tables, int max_blocks,
                                  float scale)
{
    int rc = attention_check(out, q, ft, m, n_heads, kv, row_seq, row_pos, block_tables,
                             max_blocks);
    if (rc || m == 0)
        return rc;
    if (m > 65535)
        return DSQ_EINVAL;
    DSQ__FT_DISPATCH(ft, T, launch_decode<T>((T *)out, (const T *)q, m, n_heads, kv,
                                             row_seq, row_pos, block_tables, max_blocks,
                                             scale));
    return dsq__cuda_launched("attention");
}

// ---------------------------------------------------------------- prefill
//
// dsq_cuda_attention_prefill: the same op for rows that come in runs of one
// sequence (prefill chunks). A block takes 16 consecutive (row, head) query
// pairs of one KV head -- several rows of a run and the heads of a GQA
// group -- and walks the sequence's keys in tiles of TK positions: each
// K/V tile is dequantised into shared memory once and serves all 16
// queries (scores in shared memory, online softmax per query, output
// accumulators in registers: thread t owns query t % 16 and dims
// t / 16 + 8 i). Rows of a tile that belong to different sequences are
// handled one sequence after another, so any batch is correct; only runs
// make it fast. As in the decode kernel, a row whose attended blocks
// include one outside the cache gets zeros (rows of the same sequence at
// lower positions are unaffected). head_dim <= 256; wider heads take the
// decode kernel.

#define PF_Q 16
#define PF_THREADS 128

template <int ND, int TK, typename T>
static __global__ void __launch_bounds__(PF_THREADS)
attention_prefill_kernel(T *out, const T *q, int64_t m, int n_heads,
                         dsq_kv_layer_t kv, const int32_t *row_seq,
                         const int32_t *row_pos, const int32_t *block_tables,
                         int max_blocks, float scale, int n_groups)
{
    extern __shared__ float sh[];     // Q[16][D] | K[TK][D] | V[TK][D] | S[16][TK]
    __shared__ int q_row[PF_Q], q_head[PF_Q], q_seq[PF_Q], q_pos[PF_Q];
    __shared__ int q_state[PF_Q];     // 0 pending, 1 active now, 2 done, 3 none
    __shared__ float q_corr[PF_Q], q_m[PF_Q], q_l[PF_Q];
    __shared__ int cur_seq, cur_last, first_bad;   // first_bad: lowest bad position
    const int D = kv.head_dim, bs = kv.block_size, G = n_heads / kv.n_kv_heads;
    const int kh = blockIdx.y, tid = threadIdx.x;
    const int gs = D / n_groups;
    float *Qs = sh, *Ks = Qs + PF_Q * D, *Vs = Ks + TK * D, *S = Vs + TK * D;
    const int64_t slots = (int64_t)max_blocks * bs;

    if (tid < PF_Q) {
        const int64_t f = (int64_t)blockIdx.x * PF_Q + tid;   // row * G + head in group
        int st = 3;
        if (f < m * G) {
            const int64_t i = f / G;
            q_row[tid] = (int)i;
            q_head[tid] = kh * G + (int)(f % G);
            q_seq[tid] = row_seq[i];
            q_pos[tid] = row_pos[i];
            st = q_seq[tid] >= 0 && q_pos[tid] >= 0 && q_pos[tid] < slots ? 0 : 4;
        }
        q_state[tid] = st;
    }
    __syncthreads();
    for (int e = tid; e < PF_Q * D; e += PF_THREADS) {
        const int qi = e / D, d = e % D;
        Qs[e] = q_state[qi] <= 2
                    ? dsq__ld(q, ((int64_t)q_row[qi] * n_heads + q_head[qi]) * D + d)
                    : 0.0f;
    }
    // queries of out-of-range rows get zeros now
    for (int e = tid; e < PF_Q * D; e += PF_THREADS) {
        const int qi = e / D;
        if (q_state[qi] == 4)
            dsq__st(out, ((int64_t)q_row[qi] * n_heads + q_head[qi]) * D + e % D, 0.0f);
    }
    const int my_q = tid % PF_Q, my_d0 = tid / PF_Q;
    for (;;) {
        __syncthreads();
        if (tid == 0) {
            cur_seq = -1;
            for (int i = 0; i < PF_Q; i++)
                if (q_state[i] == 0) {
                    cur_seq = q_seq[i];
                    break;
                }
            cur_last = -1;
            for (int i = 0; i < PF_Q; i++)
                if (q_state[i] == 0 && q_seq[i] == cur_seq) {
                    q_state[i] = 1;
                    cur_last = q_pos[i] > cur_last ? q_pos[i] : cur_last;
                }
            first_bad = 0x7fffffff;
        }
        if (tid < PF_Q) {
            q_m[tid] = -INFINITY;
            q_l[tid] = 0.0f;
        }
        __syncthreads();
        if (cur_seq < 0)
            break;
        const int32_t *bt = block_tables + (int64_t)cur_seq * max_blocks;
        float acc[ND];
#pragma unroll
        for (int r = 0; r < ND; r++)
            acc[r] = 0.0f;
        for (int p0 = 0; p0 <= cur_last; p0 += TK) {
            // K/V tile, dequantised
            for (int e = tid; e < TK * D; e += PF_THREADS) {
                const int tk = e / D, d = e % D, p = p0 + tk;
                float kf = 0.0f, vf = 0.0f;
                if (p <= cur_last) {
                    const int32_t b = bt[p / bs];
                    if (b < 0 || b >= kv.n_blocks) {
                        atomicMin(&first_bad, p);
                    } else {
                        const int64_t t = (int64_t)b * bs + p % bs;
                        kf = kv_load(kv, kv.k, kv.k_scale, kv.k_zero, t, kh, d, n_groups, gs);
                        vf = kv_load(kv, kv.v, kv.v_scale, kv.v_zero, t, kh, d, n_groups, gs);
                    }
                }
                Ks[e] = kf;
                Vs[e] = vf;
            }
            __syncthreads();
            // scores S[q][tk], causal per query
            for (int e = tid; e < PF_Q * TK; e += PF_THREADS) {
                const int qi = e / TK, tk = e % TK, p = p0 + tk;
                float s = -INFINITY;
                if (q_state[qi] == 1 && p <= q_pos[qi]) {
                    float a = 0.0f;
                    for (int d = 0; d < D; d++)
                        a += Qs[qi * D + d] * Ks[tk * D + d];
                    s = a * scale;
                }
                S[e] = s;
            }
            __syncthreads();
            // online softmax: running max and sum per query
            if (tid < PF_Q) {
                float mx = q_m[tid];
                for (int tk = 0; tk < TK; tk++)
                    mx = fmaxf(mx, S[tid * TK + tk]);
                float corr = 1.0f, sum = 0.0f;
                if (mx != -INFINITY) {
                    corr = expf(q_m[tid] - mx);    // 0 when q_m == -inf
                    for (int tk = 0; tk < TK; tk++) {
                        const float s = S[tid * TK + tk];
                        const float pw = s == -INFINITY ? 0.0f : expf(s - mx);
                        S[tid * TK + tk] = pw;
                        sum += pw;
                    }
                    q_m[tid] = mx;
                    q_l[tid] = q_l[tid] * corr + sum;
                } else {
                    for (int tk = 0; tk < TK; tk++)
                        S[tid * TK + tk] = 0.0f;
                }
                q_corr[tid] = corr;
            }
            __syncthreads();
            if (q_state[my_q] == 1) {
                const float corr = q_corr[my_q];
#pragma unroll
                for (int r = 0; r < ND; r++) {
                    const int d = my_d0 + 8 * r;
                    if (d < D) {
                        float o = acc[r] * corr;
                        for (int tk = 0; tk < TK; tk++)
                            o += S[my_q * TK + tk] * Vs[tk * D + d];
                        acc[r] = o;
                    }
                }
            }
            __syncthreads();
        }
        if (q_state[my_q] == 1) {
            const float L = q_l[my_q];
            T *o = out + ((int64_t)q_row[my_q] * n_heads + q_head[my_q]) * D;
#pragma unroll
            for (int r = 0; r < ND; r++) {
                const int d = my_d0 + 8 * r;
                if (d < D)
                    dsq__st(o, d, q_pos[my_q] >= first_bad ? 0.0f : acc[r] / L);
            }
        }
        __syncthreads();
        if (tid < PF_Q && q_state[tid] == 1)
            q_state[tid] = 2;
    }
}

template <int ND, int TK, typename T>
static void launch_prefill(T *out, const T *q, int64_t m, int n_heads,
                           const dsq_kv_layer_t *kv, const int32_t *row_seq,
                           const int32_t *row_pos, const int32_t *block_tables,
                           int max_blocks, float scale)
{
    const int D = kv->head_dim, G = n_heads / kv->n_kv_heads;
    const size_t shmem = sizeof(float) * ((size_t)PF_Q * D + 2 * (size_t)TK * D + PF_Q * TK);
    dim3 grid((unsigned)((m * G + PF_Q - 1) / PF_Q), (unsigned)kv->n_kv_heads);
    attention_prefill_kernel<ND, TK, T><<<grid, PF_THREADS, shmem, dsq__cuda_stream()>>>(
        out, q, m, n_heads, *kv, row_seq, row_pos, block_tables, max_blocks, scale,
        dsq_kv_n_groups(D));
}

extern "C" int dsq_cuda_attention_prefill(void *out, const void *q, dsq_ftype_t ft,
                                          int64_t m, int n_heads, const dsq_kv_layer_t *kv,
                                          const int32_t *row_seq, const int32_t *row_pos,
                                          const int32_t *block_tables, int max_blocks,
                                          float scale)
{
    int rc = attention_check(out, q, ft, m, n_heads, kv, row_seq, row_pos, block_tables,
                             max_blocks);
    if (rc || m == 0)
        return rc;
    const int D = kv->head_dim;
    const int64_t G = n_heads / kv->n_kv_heads;
    if (D > 256 || (m * G + PF_Q - 1) / PF_Q > 0x7fffffffLL)
        return dsq_cuda_attention(out, q, ft, m, n_heads, kv, row_seq, row_pos,
                                  block_tables, max_blocks, scale);
    if (D <= 128) {
        DSQ__FT_DISPATCH(ft, T, launch_prefill<16, 16, T>((T *)out, (const T *)q, m, n_heads,
                                                          kv, row_seq, row_pos, block_tables,
                                                          max_blocks, scale));
    } else {
        DSQ__FT_DISPATCH(ft, T, launch_prefill<32, 8, T>((T *)out, (const T *)q, m, n_heads,
                                                         kv, row_seq, row_pos, block_tables,
                                                         max_blocks, scale));
    }
    return dsq__cuda_launched("attention_prefill");
}

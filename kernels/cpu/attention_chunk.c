/* The per-chunk arithmetic of CPU attention (attention.c, attention_prefill.c):
 * one chunk of DSQ__ATT_BK cached positions against a set of query vectors
 * (a query vector is one query head of one row): scores, online-softmax
 * update, weighted sum of values.
 *
 * Two layouts, one recipe. A tile of many rows of one sequence (prefill)
 * keeps its query vectors as the SIMD lanes: Q and O transposed
 * ([D][rp]), scores key-major ([nj][rp]), so both products broadcast a
 * cached element into vectors of query vectors. A single row (decode)
 * has only G query vectors, too few for lanes: its scores run with keys as
 * lanes (the chunk's K transposed, [D][BK]) and its P V with head_dim as
 * lanes; it reads FP16 and F32 keys and values in place (nothing amortises
 * a copy for one row) and prefetches the next chunk's rows between its
 * blocks of arithmetic (one row alone gives the hardware too little to
 * overlap with). Both layouts do, for every query vector, the same fp32 operations
 * in the same order, so a row's output is bitwise the same whichever path
 * computes it and whatever else is in its tile or batch: the engine
 * relies on that (a prompt chunk of one row, a preempted sequence
 * recomputed as prefill must give the tokens a lone run gives). The
 * recipe, per query vector q (already scaled) and chunk of keys j < nj:
 *   s_j = sum_d k_jd q_d, one chain over d = 0..D-1 (FMA at avx2);
 *   m' = max(m, max_j s_j), c = e^(m - m'), p_j = e^(s_j - m');
 *   l' = l c + sum_j p_j (avx2: fma(l, c, even-j sum + odd-j sum), each a
 *        chain; scalar: l c, then one chain over j);
 *   o'_d = o_d c, then one chain over j of + v_jd p_j (FMA at avx2).
 * Keys a tile masks (past a row's position) enter as p_j = 0, which
 * changes no sum, so chunks always start at multiples of DSQ__ATT_BK and
 * the result does not depend on where a tile ends. e^x is expf (scalar)
 * or a polynomial (avx2, below); the levels differ from each other by
 * rounding only. Compiled as ISO C (-ffp-contract=off): the compiler
 * fuses nothing on its own, so the scalar chains stay as written.
 * AVX-512 machines run the AVX2 kernels (no 16-wide variant: none of our
 * machines could test one); AArch64 runs the scalar ones, vectorised by
 * the compiler where it can. */
#include <math.h>
#include <stdbool.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AC_X86 1
#endif

#include "cpu_internal.h"

#define BK DSQ__ATT_BK

/* --------------------------------------------------------------- scalar */

static void scores_scalar(float *restrict st, int rp, const float *restrict qt,
                          const float *restrict kb, int D, int nj)
{
    for (int j = 0; j < nj; j++) {
        float *restrict s = st + (int64_t)j * rp;
        for (int r = 0; r < rp; r++)
            s[r] = 0.0f;
        for (int d = 0; d < D; d++) {
            const float k = kb[(int64_t)j * D + d];
            const float *restrict qd = qt + (int64_t)d * rp;
            for (int r = 0; r < rp; r++)
                s[r] += k * qd[r];
        }
    }
}

static void softmax_scalar(float *restrict st, int rp, int nj, float *restrict mx,
                           float *restrict l, float *restrict cr, const int32_t *lim,
                           int32_t p0)
{
    for (int r = 0; r < rp; r++)
        cr[r] = -INFINITY;                   /* the chunk's max, for now */
    for (int j = 0; j < nj; j++) {
        float *restrict s = st + (int64_t)j * rp;
        for (int r = 0; lim && r < rp; r++)
            if (p0 + j > lim[r])
                s[r] = -INFINITY;
        for (int r = 0; r < rp; r++)
            cr[r] = s[r] > cr[r] ? s[r] : cr[r];
    }
    for (int r = 0; r < rp; r++) {
        const float mn = cr[r] > mx[r] ? cr[r] : mx[r];
        cr[r] = expf(mx[r] - mn);            /* 0 on the first chunk */
        mx[r] = mn;
        l[r] *= cr[r];
    }
    for (int j = 0; j < nj; j++) {
        float *restrict s = st + (int64_t)j * rp;
        for (int r = 0; r < rp; r++) {
            s[r] = expf(s[r] - mx[r]);
            l[r] += s[r];
        }
    }
}

static void pv_scalar(float *restrict ot, int rp, const float *restrict pt,
                      const float *restrict vb, int D, int nj, const float *restrict cr)
{
    for (int d = 0; d < D; d++) {
        float *restrict o = ot + (int64_t)d * rp;
        for (int r = 0; r < rp; r++)
            o[r] *= cr[r];
        for (int j = 0; j < nj; j++) {
            const float v = vb[(int64_t)j * D + d];
            const float *restrict p = pt + (int64_t)j * rp;
            for (int r = 0; r < rp; r++)
                o[r] += v * p[r];
        }
    }
}

/* Element d of key/value row x (fp16 or fp32), exact. */
static inline float kv_elem(const void *x, bool f16, int d)
{
    return f16 ? dsq__h2f(((const uint16_t *)x)[d]) : ((const float *)x)[d];
}

/* The row layout at scalar: the three steps above for one row's G query
 * vectors, with the same operations per query vector. */
static void row_scalar(float *restrict o, float *restrict mx, float *restrict l,
                       const float *restrict qs, int G, int D, const void *const *krow,
                       const void *const *vrow, bool f16, int nj, int nj_next,
                       float *restrict ws)
{
    (void)nj_next;
    for (int g = 0; g < G; g++) {
        const float *restrict q = qs + (int64_t)g * D;
        float *restrict p = ws;
        float bm = -INFINITY;
        for (int j = 0; j < nj; j++) {
            float s = 0.0f;
            for (int d = 0; d < D; d++)
                s += kv_elem(krow[j], f16, d) * q[d];
            p[j] = s;
            bm = s > bm ? s : bm;
        }
        const float mn = bm > mx[g] ? bm : mx[g];
        const float c = expf(mx[g] - mn);
        mx[g] = mn;
        l[g] *= c;
        for (int j = 0; j < nj; j++) {
            p[j] = expf(p[j] - mn);
            l[g] += p[j];
        }
        float *restrict og = o + (int64_t)g * D;
        for (int d = 0; d < D; d++) {
            float acc = og[d] * c;
            for (int j = 0; j < nj; j++)
                acc += kv_elem(vrow[j], f16, d) * p[j];
            og[d] = acc;
        }
    }
}

/* ----------------------------------------------------------------- AVX2 */

#ifdef AC_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE __attribute__((always_inline)) inline
#define LD(p) _mm256_loadu_ps(p)
#define BC(p) _mm256_broadcast_ss(p)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)

/* e^x for x <= 0 (the only arguments here): Cephes' expf reduction
 * x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, 2^n through the
 * exponent field; relative error ~2e-7. x < -87 (e^x below FLT_MIN, and
 * the -inf of masked scores) gives exactly 0. */
AVX2 static inline __m256 exp_avx2(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(zero, p);
}

/* ---- tile layout */

/* Score blocks: 4 keys x 24 query vectors (12 accumulators; 3 loads of Q
 * and 4 broadcasts of K per 12 FMAs), the narrow edge 4 keys x 8, and 1 key
 * x 8 with the same single chain over d (which keys of a chunk fall to
 * an edge depends on the tile, and a score must not). */
AVX2 static void scores_4x24(float *st, int rp, const float *qt, const float *kb, int D)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    const float *k0 = kb, *k1 = kb + D, *k2 = kb + 2 * D, *k3 = kb + 3 * D;
    for (int d = 0; d < D; d++) {
        const float *qd = qt + (int64_t)d * rp;
        const __m256 q0 = LD(qd), q1 = LD(qd + 8), q2 = LD(qd + 16);
        __m256 k = BC(k0 + d);
        c00 = FMA(k, q0, c00), c01 = FMA(k, q1, c01), c02 = FMA(k, q2, c02);
        k = BC(k1 + d);
        c10 = FMA(k, q0, c10), c11 = FMA(k, q1, c11), c12 = FMA(k, q2, c12);
        k = BC(k2 + d);
        c20 = FMA(k, q0, c20), c21 = FMA(k, q1, c21), c22 = FMA(k, q2, c22);
        k = BC(k3 + d);
        c30 = FMA(k, q0, c30), c31 = FMA(k, q1, c31), c32 = FMA(k, q2, c32);
    }
    _mm256_storeu_ps(st, c00), _mm256_storeu_ps(st + 8, c01), _mm256_storeu_ps(st + 16, c02);
    st += rp;
    _mm256_storeu_ps(st, c10), _mm256_storeu_ps(st + 8, c11), _mm256_storeu_ps(st + 16, c12);
    st += rp;
    _mm256_storeu_ps(st, c20), _mm256_storeu_ps(st + 8, c21), _mm256_storeu_ps(st + 16, c22);
    st += rp;
    _mm256_storeu_ps(st, c30), _mm256_storeu_ps(st + 8, c31), _mm256_storeu_ps(st + 16, c32);
}

AVX2 static void scores_4x8(float *st, int rp, const float *qt, const float *kb, int D)
{
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int d = 0; d < D; d++) {
        const __m256 q0 = LD(qt + (int64_t)d * rp);
        c0 = FMA(BC(kb + d), q0, c0);
        c1 = FMA(BC(kb + D + d), q0, c1);
        c2 = FMA(BC(kb + 2 * D + d), q0, c2);
        c3 = FMA(BC(kb + 3 * D + d), q0, c3);
    }
    _mm256_storeu_ps(st, c0);
    _mm256_storeu_ps(st + rp, c1);
    _mm256_storeu_ps(st + 2 * rp, c2);
    _mm256_storeu_ps(st + 3 * rp, c3);
}

AVX2 static void scores_1x8(float *st, const float *qt, int rp, const float *kb, int D)
{
    __m256 c0 = _mm256_setzero_ps();
    for (int d = 0; d < D; d++)
        c0 = FMA(BC(kb + d), LD(qt + (int64_t)d * rp), c0);
    _mm256_storeu_ps(st, c0);
}

AVX2 static void scores_avx2(float *st, int rp, const float *qt, const float *kb,
                             int D, int nj)
{
    for (int r = 0; r < rp;) {
        const int w = rp - r >= 24 ? 24 : 8;
        int j = 0;
        for (; j + 4 <= nj; j += 4) {
            if (w == 24)
                scores_4x24(st + (int64_t)j * rp + r, rp, qt + r, kb + (int64_t)j * D, D);
            else
                scores_4x8(st + (int64_t)j * rp + r, rp, qt + r, kb + (int64_t)j * D, D);
        }
        for (; j < nj; j++)
            for (int v = 0; v < w; v += 8)
                scores_1x8(st + (int64_t)j * rp + r + v, qt + r + v, rp, kb + (int64_t)j * D, D);
        r += w;
    }
}

AVX2 static void softmax_avx2(float *st, int rp, int nj, float *mx, float *l, float *cr,
                              const int32_t *lim, int32_t p0)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int r = 0; r < rp; r += 8) {
        float *s = st + r;
        if (lim) {
            const __m256i lv = _mm256_loadu_si256((const __m256i *)(const void *)(lim + r));
            for (int j = 0; j < nj; j++) {
                const __m256i past = _mm256_cmpgt_epi32(_mm256_set1_epi32(p0 + j), lv);
                _mm256_storeu_ps(s + (int64_t)j * rp,
                                 _mm256_blendv_ps(LD(s + (int64_t)j * rp), ninf,
                                                  _mm256_castsi256_ps(past)));
            }
        }
        __m256 bm0 = ninf, bm1 = ninf;
        int j = 0;
        for (; j + 2 <= nj; j += 2) {
            bm0 = _mm256_max_ps(bm0, LD(s + (int64_t)j * rp));
            bm1 = _mm256_max_ps(bm1, LD(s + (int64_t)(j + 1) * rp));
        }
        if (j < nj)
            bm0 = _mm256_max_ps(bm0, LD(s + (int64_t)j * rp));
        const __m256 m_old = LD(mx + r);
        const __m256 mn = _mm256_max_ps(m_old, _mm256_max_ps(bm0, bm1));
        const __m256 c = exp_avx2(_mm256_sub_ps(m_old, mn));
        _mm256_storeu_ps(mx + r, mn);
        _mm256_storeu_ps(cr + r, c);
        __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
        for (j = 0; j + 2 <= nj; j += 2) {
            const __m256 e0 = exp_avx2(_mm256_sub_ps(LD(s + (int64_t)j * rp), mn));
            const __m256 e1 = exp_avx2(_mm256_sub_ps(LD(s + (int64_t)(j + 1) * rp), mn));
            _mm256_storeu_ps(s + (int64_t)j * rp, e0);
            _mm256_storeu_ps(s + (int64_t)(j + 1) * rp, e1);
            sum0 = _mm256_add_ps(sum0, e0);
            sum1 = _mm256_add_ps(sum1, e1);
        }
        if (j < nj) {
            const __m256 e0 = exp_avx2(_mm256_sub_ps(LD(s + (int64_t)j * rp), mn));
            _mm256_storeu_ps(s + (int64_t)j * rp, e0);
            sum0 = _mm256_add_ps(sum0, e0);
        }
        _mm256_storeu_ps(l + r, FMA(LD(l + r), c, _mm256_add_ps(sum0, sum1)));
    }
}

/* P V blocks: 4 dims x 24 query vectors of O (12 accumulators; 3 loads of
 * P and 4 broadcasts of V per 12 FMAs), 4 dims x 8, 1 dim x 8 (the last
 * D % 4 dims); O is rescaled by cr on the way in. */
AVX2 static void pv_4x24(float *ot, int rp, const float *pt, const float *vb, int D, int nj,
                         const float *cr)
{
    const __m256 s0 = LD(cr), s1 = LD(cr + 8), s2 = LD(cr + 16);
    float *o0 = ot, *o1 = ot + rp, *o2 = ot + 2 * rp, *o3 = ot + 3 * rp;
    __m256 c00 = _mm256_mul_ps(LD(o0), s0), c01 = _mm256_mul_ps(LD(o0 + 8), s1);
    __m256 c02 = _mm256_mul_ps(LD(o0 + 16), s2), c10 = _mm256_mul_ps(LD(o1), s0);
    __m256 c11 = _mm256_mul_ps(LD(o1 + 8), s1), c12 = _mm256_mul_ps(LD(o1 + 16), s2);
    __m256 c20 = _mm256_mul_ps(LD(o2), s0), c21 = _mm256_mul_ps(LD(o2 + 8), s1);
    __m256 c22 = _mm256_mul_ps(LD(o2 + 16), s2), c30 = _mm256_mul_ps(LD(o3), s0);
    __m256 c31 = _mm256_mul_ps(LD(o3 + 8), s1), c32 = _mm256_mul_ps(LD(o3 + 16), s2);
    for (int j = 0; j < nj; j++) {
        const float *pj = pt + (int64_t)j * rp, *vj = vb + (int64_t)j * D;
        const __m256 p0 = LD(pj), p1 = LD(pj + 8), p2 = LD(pj + 16);
        __m256 x = BC(vj);
        c00 = FMA(x, p0, c00), c01 = FMA(x, p1, c01), c02 = FMA(x, p2, c02);
        x = BC(vj + 1);
        c10 = FMA(x, p0, c10), c11 = FMA(x, p1, c11), c12 = FMA(x, p2, c12);
        x = BC(vj + 2);
        c20 = FMA(x, p0, c20), c21 = FMA(x, p1, c21), c22 = FMA(x, p2, c22);
        x = BC(vj + 3);
        c30 = FMA(x, p0, c30), c31 = FMA(x, p1, c31), c32 = FMA(x, p2, c32);
    }
    _mm256_storeu_ps(o0, c00), _mm256_storeu_ps(o0 + 8, c01), _mm256_storeu_ps(o0 + 16, c02);
    _mm256_storeu_ps(o1, c10), _mm256_storeu_ps(o1 + 8, c11), _mm256_storeu_ps(o1 + 16, c12);
    _mm256_storeu_ps(o2, c20), _mm256_storeu_ps(o2 + 8, c21), _mm256_storeu_ps(o2 + 16, c22);
    _mm256_storeu_ps(o3, c30), _mm256_storeu_ps(o3 + 8, c31), _mm256_storeu_ps(o3 + 16, c32);
}

AVX2 static void pv_4x8(float *ot, int rp, const float *pt, const float *vb, int D, int nj,
                        const float *cr)
{
    const __m256 s0 = LD(cr);
    __m256 c0 = _mm256_mul_ps(LD(ot), s0), c1 = _mm256_mul_ps(LD(ot + rp), s0);
    __m256 c2 = _mm256_mul_ps(LD(ot + 2 * rp), s0), c3 = _mm256_mul_ps(LD(ot + 3 * rp), s0);
    for (int j = 0; j < nj; j++) {
        const float *vj = vb + (int64_t)j * D;
        const __m256 p0 = LD(pt + (int64_t)j * rp);
        c0 = FMA(BC(vj), p0, c0);
        c1 = FMA(BC(vj + 1), p0, c1);
        c2 = FMA(BC(vj + 2), p0, c2);
        c3 = FMA(BC(vj + 3), p0, c3);
    }
    _mm256_storeu_ps(ot, c0);
    _mm256_storeu_ps(ot + rp, c1);
    _mm256_storeu_ps(ot + 2 * rp, c2);
    _mm256_storeu_ps(ot + 3 * rp, c3);
}

AVX2 static void pv_1x8(float *ot, const float *pt, int rp, const float *vb, int D, int nj,
                        const float *cr)
{
    __m256 c0 = _mm256_mul_ps(LD(ot), LD(cr));
    for (int j = 0; j < nj; j++)
        c0 = FMA(BC(vb + (int64_t)j * D), LD(pt + (int64_t)j * rp), c0);
    _mm256_storeu_ps(ot, c0);
}

AVX2 static void pv_avx2(float *ot, int rp, const float *pt, const float *vb, int D, int nj,
                         const float *cr)
{
    for (int r = 0; r < rp;) {
        const int w = rp - r >= 24 ? 24 : 8;
        int d = 0;
        for (; d + 4 <= D; d += 4) {
            if (w == 24)
                pv_4x24(ot + (int64_t)d * rp + r, rp, pt + r, vb + d, D, nj, cr + r);
            else
                pv_4x8(ot + (int64_t)d * rp + r, rp, pt + r, vb + d, D, nj, cr + r);
        }
        for (; d < D; d++)
            for (int v = 0; v < w; v += 8)
                pv_1x8(ot + (int64_t)d * rp + r + v, pt + r + v, rp, vb + d, D, nj,
                       cr + r + v);
        r += w;
    }
}

/* ---- row layout */

/* Scores of nh query vectors x nv vectors of 8 keys: st[a][8v..] (row
 * stride BK) = chain over d of kt[d][8v..] x qs[a][d]. nh and nv are
 * constants at each instantiation, so acc stays in registers. */
AVX2 static INLINE void rs_blk(float *st, const float *kt, const float *qs, int D, int nh,
                               int nv)
{
    __m256 acc[4][6];
#pragma GCC unroll 4
    for (int a = 0; a < nh; a++)
#pragma GCC unroll 6
        for (int v = 0; v < nv; v++)
            acc[a][v] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++) {
        __m256 k[6];
#pragma GCC unroll 6
        for (int v = 0; v < nv; v++)
            k[v] = LD(kt + (int64_t)d * BK + 8 * v);
#pragma GCC unroll 4
        for (int a = 0; a < nh; a++) {
            const __m256 q = BC(qs + (int64_t)a * D + d);
#pragma GCC unroll 6
            for (int v = 0; v < nv; v++)
                acc[a][v] = FMA(q, k[v], acc[a][v]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < nh; a++)
#pragma GCC unroll 6
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(st + (int64_t)a * BK + 8 * v, acc[a][v]);
}

/* 8 elements of key/value row x from element d, as fp32 (fp16 exactly
 * converted by F16C). */
AVX2 static INLINE __m256 kv_ld8(const void *x, bool f16, int64_t d)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)
                                               ((const uint16_t *)x + d)));
    return LD((const float *)x + d);
}

/* P V of nh query vectors x nv vectors of 8 dims from dim d0: o[a][8v..]
 * (row stride D) = o c[a], then a chain over j of + v_j[8v..] x p[a][j]
 * (p row stride BK). */
AVX2 static INLINE void rpv_blk(float *o, const float *p, const void *const *vrow, int d0,
                                const float *c, int D, int nj, int nh, int nv, bool f16)
{
    __m256 acc[4][6];
#pragma GCC unroll 4
    for (int a = 0; a < nh; a++) {
        const __m256 ca = BC(c + a);
#pragma GCC unroll 6
        for (int v = 0; v < nv; v++)
            acc[a][v] = _mm256_mul_ps(LD(o + (int64_t)a * D + 8 * v), ca);
    }
    for (int j = 0; j < nj; j++) {
        __m256 x[6];
#pragma GCC unroll 6
        for (int v = 0; v < nv; v++)
            x[v] = kv_ld8(vrow[j], f16, d0 + 8 * v);
#pragma GCC unroll 4
        for (int a = 0; a < nh; a++) {
            const __m256 pa = BC(p + (int64_t)a * BK + j);
#pragma GCC unroll 6
            for (int v = 0; v < nv; v++)
                acc[a][v] = FMA(pa, x[v], acc[a][v]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < nh; a++)
#pragma GCC unroll 6
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(o + (int64_t)a * D + 8 * v, acc[a][v]);
}

typedef void (*rs_fn)(float *st, const float *kt, const float *qs, int D);
typedef void (*rpv_fn)(float *o, const float *p, const void *const *vrow, int d0,
                       const float *c, int D, int nj);
#define RS_INST(h, v)                                                                   \
    AVX2 static void rs_##h##_##v(float *st, const float *kt, const float *qs, int D) \
    {                                                                                   \
        rs_blk(st, kt, qs, D, h, v);                                                    \
    }                                                                                   \
    AVX2 static void rpv_##h##_##v(float *o, const float *p, const void *const *vrow,  \
                                   int d0, const float *c, int D, int nj)              \
    {                                                                                   \
        rpv_blk(o, p, vrow, d0, c, D, nj, h, v, false);                                 \
    }                                                                                   \
    AVX2 static void rpvh_##h##_##v(float *o, const float *p, const void *const *vrow, \
                                    int d0, const float *c, int D, int nj)             \
    {                                                                                   \
        rpv_blk(o, p, vrow, d0, c, D, nj, h, v, true);                                  \
    }
#define RS_ROW(h) RS_INST(h, 1) RS_INST(h, 2) RS_INST(h, 3) RS_INST(h, 4) RS_INST(h, 5) \
    RS_INST(h, 6)
RS_ROW(1)
RS_ROW(2)
RS_ROW(3)
RS_ROW(4)
#define TAB(f, h) {f##_##h##_1, f##_##h##_2, f##_##h##_3, f##_##h##_4, f##_##h##_5, f##_##h##_6}
static const rs_fn rs_tab[4][6] = {TAB(rs, 1), TAB(rs, 2), TAB(rs, 3), TAB(rs, 4)};
/* [f16][heads - 1][vectors - 1] */
static const rpv_fn rpv_tab[2][4][6] = {
    {TAB(rpv, 1), TAB(rpv, 2), TAB(rpv, 3), TAB(rpv, 4)},
    {TAB(rpvh, 1), TAB(rpvh, 2), TAB(rpvh, 3), TAB(rpvh, 4)},
};
/* vectors per block for a block of h query vectors: at most 12
 * accumulators, 6 for one (it has no other chains to hide latency) */
static const int nv_max[4] = {6, 4, 3, 2};

/* kt[d][j] = k_j[d] for j in [ja, jb) (multiples of 8), 0 where j >= nj:
 * 8x8 transposes. */
AVX2 static void transpose_keys(float *kt, const void *const *krow, bool f16, int D, int nj,
                                int ja, int jb)
{
    const int d8 = D & ~7;
    for (int j0 = ja; j0 < jb; j0 += 8)
        for (int d0 = 0; d0 < d8; d0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = j0 + i < nj ? kv_ld8(krow[j0 + i], f16, d0) : _mm256_setzero_ps();
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
            const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
            const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
            const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
            float *o = kt + (int64_t)d0 * BK + j0;
            _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(o + BK, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(o + 2 * BK, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(o + 3 * BK, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(o + 4 * BK, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(o + 5 * BK, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(o + 6 * BK, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(o + 7 * BK, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    for (int d = d8; d < D; d++)
        for (int j = ja; j < jb; j++)
            kt[(int64_t)d * BK + j] = j < nj ? kv_elem(krow[j], f16, d) : 0.0f;
}

/* Prefetch rows [j0, j1) of the next chunk (row bytes rb). */
static inline void prefetch_rows(const void *const *row, int j0, int j1, size_t rb)
{
    for (int j = j0; j < j1; j++)
        for (size_t b = 0; b < rb; b += 64)
            __builtin_prefetch((const char *)row[j] + b);
}

/* One chunk of one row's G query vectors (qs [G][D], scaled) into the
 * running state o [G][D], mx [G], l [G]. ws: DSQ__ATT_ROW_WS floats. */

AVX2 static void row_avx2(float *o, float *mx, float *l, const float *qs, int G, int D,
                          const void *const *krow, const void *const *vrow, bool f16, int nj,
                          int nj_next, float *ws)
{
    const int nj8 = (nj + 7) & ~7, nvk = nj8 / 8;
    const size_t rb = (size_t)D * (f16 ? 2 : 4);
    const void *const *kn = krow + nj, *const *vn = vrow + nj;
    int kp = 0, vp = 0;   /* next-chunk rows prefetched so far */
    float *kt = ws, *st = kt + (int64_t)D * BK, *cr = st + (int64_t)G * BK;
    /* scores, a block of keys at a time: transposed just before the
     * products that use it, so its loads overlap arithmetic */
    const int kbv = nv_max[(G < 4 ? G : 4) - 1];
    for (int v0 = 0; v0 < nvk; v0 += kbv) {
        const int v1 = v0 + kbv < nvk ? v0 + kbv : nvk;
        transpose_keys(kt, krow, f16, D, nj, 8 * v0, 8 * v1);
        for (int g0 = 0; g0 < G; g0 += 4) {
            const int nh = G - g0 < 4 ? G - g0 : 4;
            for (int u0 = v0; u0 < v1; u0 += nv_max[nh - 1]) {
                const int nv = v1 - u0 < nv_max[nh - 1] ? v1 - u0 : nv_max[nh - 1];
                rs_tab[nh - 1][nv - 1](st + (int64_t)g0 * BK + 8 * u0, kt + 8 * u0,
                                       qs + (int64_t)g0 * D, D);
            }
        }
        /* the next chunk's keys stream in behind the arithmetic */
        const int kq = nj_next * v1 / nvk;
        prefetch_rows(kn, kp, kq, rb);
        kp = kq;
    }
    for (int g0 = 0; g0 < G; g0 += 4) {
        const int nh = G - g0 < 4 ? G - g0 : 4;
        float *stg = st + (int64_t)g0 * BK;
        for (int a = 0; a < nh; a++) {
            float *s = stg + (int64_t)a * BK;
            for (int j = nj; j < nj8; j++)
                s[j] = -INFINITY;
            __m256 bm = LD(s);
            for (int v = 1; v < nvk; v++)
                bm = _mm256_max_ps(bm, LD(s + 8 * v));
            __m128 b4 = _mm_max_ps(_mm256_castps256_ps128(bm), _mm256_extractf128_ps(bm, 1));
            b4 = _mm_max_ps(b4, _mm_movehl_ps(b4, b4));
            b4 = _mm_max_ss(b4, _mm_shuffle_ps(b4, b4, 1));
            const int g = g0 + a;
            /* as the tile's max(m, chunk max), exp and fma, one lane */
            const __m128 mn = _mm_max_ss(_mm_set_ss(mx[g]), b4);
            const __m256 mn8 = _mm256_broadcastss_ps(mn);
            const __m128 c = _mm256_castps256_ps128(
                exp_avx2(_mm256_broadcastss_ps(_mm_sub_ss(_mm_set_ss(mx[g]), mn))));
            for (int v = 0; v < nvk; v++)
                _mm256_storeu_ps(s + 8 * v, exp_avx2(_mm256_sub_ps(LD(s + 8 * v), mn8)));
            float sum0 = 0.0f, sum1 = 0.0f;
            int j = 0;
            for (; j + 2 <= nj; j += 2) {
                sum0 += s[j];
                sum1 += s[j + 1];
            }
            if (j < nj)
                sum0 += s[j];
            l[g] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(l[g]), c, _mm_set_ss(sum0 + sum1)));
            mx[g] = _mm_cvtss_f32(mn);
            cr[g] = _mm_cvtss_f32(c);
        }
        float *og = o + (int64_t)g0 * D;
        const int nvd = D / 8, nvm = nv_max[nh - 1];
        for (int v0 = 0; v0 < nvd; v0 += nvm) {
            const int nv = nvd - v0 < nvm ? nvd - v0 : nvm;
            rpv_tab[f16][nh - 1][nv - 1](og + 8 * v0, stg, vrow, 8 * v0, cr + g0, D, nj);
            const int vq = (int)((int64_t)nj_next * (g0 * nvd + (v0 + nv) * nh) /
                                 ((int64_t)G * nvd));
            prefetch_rows(vn, vp, vq, rb);
            vp = vq > vp ? vq : vp;
        }
        for (int a = 0; a < nh; a++)
            for (int d = nvd * 8; d < D; d++) {
                __m128 acc = _mm_mul_ss(_mm_set_ss(og[(int64_t)a * D + d]),
                                        _mm_set_ss(cr[g0 + a]));
                for (int j = 0; j < nj; j++)
                    acc = _mm_fmadd_ss(_mm_set_ss(stg[(int64_t)a * BK + j]),
                                       _mm_set_ss(kv_elem(vrow[j], f16, d)), acc);
                og[(int64_t)a * D + d] = _mm_cvtss_f32(acc);
            }
    }
}
#undef LD
#undef BC
#undef FMA
#endif

const dsq__att_ops_t *dsq__att_ops(void)
{
    static const dsq__att_ops_t scalar = {1, scores_scalar, softmax_scalar, pv_scalar,
                                          row_scalar};
#ifdef AC_X86
    static const dsq__att_ops_t avx2 = {8, scores_avx2, softmax_avx2, pv_avx2, row_avx2};
    if (dsq__cpu_isa_level() >= DSQ__ISA_AVX2)
        return &avx2;
#endif
    return &scalar;
}

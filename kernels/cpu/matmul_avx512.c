/* AVX-512 (F/BW/VL + VNNI) tile kernels for dsq_cpu_matmul.
 *
 * Every format gets the AVX2 kernels' structure (matmul_x86.inc) on 256-bit
 * vectors with vpdpbusd doing the u8 x s8 dot product into int32 in one
 * instruction. INT4 with group size 32 (repacked GGUF Q4_0/Q4_1, the decode
 * hot path) has its own 512-bit kernel: one vector holds two 32-weight
 * chunks. The 16 nibble bytes of chunk c hold weights j (low nibble) and
 * j+16 (high), so the register is built as [bytes c | bytes c | bytes c+1 |
 * bytes c+1] (two broadcast loads, no shuffle port), shifted right by 0 or 4
 * per 128-bit lane and masked, which lays the 64 weights out in the natural
 * order of the int8 activations: one plain 64-byte load of x pairs with it.
 * The per-chunk multipliers scale*d are formed 16 chunks at a time (one
 * fp16->fp32 conversion and one multiply) and spread to the two chunks'
 * lanes with one permute. The fp32 operations are the AVX2 kernel's, in
 * its order, so results are bitwise identical to it (see int4g32_block).
 */
#include "cpu_internal.h"

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include <immintrin.h>

static inline __attribute__((always_inline)) __m256i dot_u8s8_vnni(__m256i a, __m256i b)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
}

#define DOT_U8S8(a, b) dot_u8s8_vnni((a), (b))
#define X8_VNNI 1
#define TAB_FN mm_avx512_base
#include "matmul_x86.inc"

/* Software prefetch distance in bytes of packed INT4 weights. */
#define PF_DIST 1024

/* Weight rows n..n+nr-1 (group 32) against activation rows m0..m0+mr-1,
 * nr * mr <= 4 (nr = 2 for decode gives two independent fma chains).
 * Lanes 0-7 of an accumulator take the even chunks and lanes 8-15 the odd
 * ones, with exactly the fma sequence of the AVX2 kernel's acc0 / acc1
 * (matmul_x86.inc: same lane layout of the integer dots, same multipliers,
 * same order), and the end is that kernel's hsum(acc0 + acc1) + int4_corr,
 * so this path is bitwise identical to the AVX2 one, only faster. */
INLINE void int4g32_block(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                          const int mr, const dsq_weight_t *w, int64_t n, const int nr)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, groups = xq->n_groups;
    const uint8_t *wr[2];
    const uint16_t *sc[2];
#pragma GCC unroll 2
    for (int q = 0; q < nr; q++) {
        wr[q] = (const uint8_t *)w->data + (n + q) * nb * 16;
        sc[q] = w->scales + (n + q) * groups;
    }
    const int8_t *xr = xq->q + m0 * kp;
    const float *d = xq->d + m0 * nb;
    const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i two = _mm512_set1_epi32(2);
    __m512 acc[2][4];
#pragma GCC unroll 2
    for (int q = 0; q < nr; q++)
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++)
            acc[q][r] = _mm512_setzero_ps();
    for (int64_t c0 = 0; c0 < nb; c0 += 16) {
        const int cn = nb - c0 < 16 ? (int)(nb - c0) : 16;
        const __mmask16 km = (__mmask16)((1u << cn) - 1u);
        __m512 mul[2][4];
#pragma GCC unroll 2
        for (int q = 0; q < nr; q++) {
            _mm_prefetch((const char *)(sc[q] + c0) + PF_DIST / 8, _MM_HINT_T0);
            if (w->zeros)
                _mm_prefetch((const char *)(w->zeros + (n + q) * groups + c0) + PF_DIST / 8,
                             _MM_HINT_T0);
            const __m512 sv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, sc[q] + c0));
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++)
                mul[q][r] = _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(km, d + r * nb + c0));
        }
        /* lanes 0-7 take chunk c's multiplier, lanes 8-15 chunk c+1's */
        __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        const int8_t *xc = xr + c0 * 32;
        for (int j = 0; j < cn; j += 2) {
            const bool odd = j + 1 == cn;   /* last chunk alone: x upper half 0 */
            __m512i wv[2];
#pragma GCC unroll 2
            for (int q = 0; q < nr; q++) {
                const uint8_t *wc = wr[q] + (c0 + j) * 16;
                /* decode streams the weights from L3/DRAM: fetch ahead
                 * (rows are contiguous, so this runs into the next rows) */
                _mm_prefetch((const char *)(wc + PF_DIST), _MM_HINT_T0);
                wv[q] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)wc));
                if (!odd)
                    wv[q] = _mm512_mask_broadcast_i32x4(wv[q], 0xFF00,
                                _mm_loadu_si128((const __m128i *)(wc + 16)));
                wv[q] = _mm512_and_si512(_mm512_srlv_epi64(wv[q], shift), lo4);
            }
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++) {
                const __m512i xv = odd
                    ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xc + r * kp + j * 32)
                    : _mm512_loadu_si512((const void *)(xc + r * kp + j * 32));
#pragma GCC unroll 2
                for (int q = 0; q < nr; q++) {
                    __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, wv[q], xv));
                    acc[q][r] = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(idx, mul[q][r]),
                                                acc[q][r]);
                }
            }
            idx = _mm512_add_epi32(idx, two);
        }
    }
#pragma GCC unroll 2
    for (int q = 0; q < nr; q++) {
        const uint16_t *zr = w->zeros ? w->zeros + (n + q) * groups : NULL;
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            __m256 a0 = _mm512_castps512_ps256(acc[q][r]);
            __m256 a1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[q][r]), 1));
            y[(m0 + r) * ldy + n + q] = hsum(_mm256_add_ps(a0, a1)) +
                int4_corr(sc[q], zr, w->zp_mode, xq->gsum + (m0 + r) * groups, groups);
        }
    }
}

static void tile_int4_512(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                          int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    if (w->group_size != 32) {
        tile_int4(y, ldy, xq, m0, m1, w, n0, n1);
        return;
    }
    int64_t n = n0;
    switch (m1 - m0) {
    case 4:
        for (; n < n1; n++) int4g32_block(y, ldy, xq, m0, 4, w, n, 1);
        break;
    case 3:
        for (; n < n1; n++) int4g32_block(y, ldy, xq, m0, 3, w, n, 1);
        break;
    case 2:
        for (; n + 2 <= n1; n += 2) int4g32_block(y, ldy, xq, m0, 2, w, n, 2);
        for (; n < n1; n++) int4g32_block(y, ldy, xq, m0, 2, w, n, 1);
        break;
    default:
        for (int64_t r = m0; r < m1; r++) {
            for (n = n0; n + 2 <= n1; n += 2) int4g32_block(y, ldy, xq, r, 1, w, n, 2);
            for (; n < n1; n++) int4g32_block(y, ldy, xq, r, 1, w, n, 1);
        }
        break;
    }
}

/* Q8_0 decode (one activation row): nr = 4 weight rows at once, each with
 * exactly the AVX2 kernel's per-row operation sequence (q8_0_rows), so the
 * bits are the same; the four independent fma chains hide the latency that
 * bounds a single row (one fma per 32 weights, 18 in a 576-wide row). */
INLINE void q8_0_block1(float *y, const dsq__xq_t *xq, int64_t m0,
                        const dsq_weight_t *w, int64_t n, const int nr, int64_t ldy)
{
    const int64_t nb = xq->nb, kp = xq->k_pad;
    const int8_t *xr = xq->q + m0 * kp;
    const float *d = xq->d + m0 * nb;
    const uint8_t *wr[4];
    __m256 acc[4];
#pragma GCC unroll 4
    for (int q = 0; q < nr; q++) {
        wr[q] = (const uint8_t *)w->data + (n + q) * nb * DSQ__Q8_0_BLOCK;
        acc[q] = _mm256_setzero_ps();
    }
    for (int64_t c = 0; c < nb; c++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xr + c * 32));
        const float dc = d[c];
#pragma GCC unroll 4
        for (int q = 0; q < nr; q++) {
            const uint8_t *b = wr[q] + c * DSQ__Q8_0_BLOCK;
            _mm_prefetch((const char *)(b + 4 * PF_DIST), _MM_HINT_T0);
            float dw = _cvtsh_ss((uint16_t)(b[0] | (b[1] << 8)));
            __m256i wv = _mm256_loadu_si256((const __m256i *)(b + 2));
            __m256i aw = _mm256_sign_epi8(wv, wv);
            __m256 p = _mm256_cvtepi32_ps(DOT_U8S8(aw, _mm256_sign_epi8(xv, wv)));
            acc[q] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * dc), acc[q]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < nr; q++)
        y[m0 * ldy + n + q] = hsum(acc[q]);
}

static void tile_q8_0_512(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                          int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    if (m1 - m0 != 1) {
        tile_q8_0(y, ldy, xq, m0, m1, w, n0, n1);
        return;
    }
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4)
        q8_0_block1(y, xq, m0, w, n, 4, ldy);
    for (; n < n1; n++)
        q8_0_block1(y, xq, m0, w, n, 1, ldy);
}

void dsq__mm_avx512(dsq__mm_tile_fn tab[DSQ__MM_SLOTS])
{
    mm_avx512_base(tab);
    tab[DSQ_WFMT_INT4] = tile_int4_512;
    tab[DSQ_WFMT_Q8_0] = tile_q8_0_512;
}

#else
void dsq__mm_avx512(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]) { (void)tab; }
#endif

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
 * The interleaved layouts (INT2_X8 .. INT6_X8, Q8_0_X8) take two
 * tiles of 8 rows per 512-bit vector: one broadcast of 4 activations then
 * feeds 16 rows, half the broadcasts and dot instructions of the 256-bit
 * kernels for the same bits.
 * Prefill (16 or more activation rows) against INT2/3/4/5/6_X8 takes the
 * panel path at the end of the file instead: activation rows in the
 * lanes, one broadcast of 4 weights per two dot products.
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

/* ---- INT4_X8 / INT5_X8 two tiles at a time: lanes 0-7 of every vector
 * are tile t (rows 8t..8t+7) and lanes 8-15 tile t + 1, so one broadcast
 * of 4 activations feeds 16 rows (the 256-bit kernel's feeds 8) and each
 * vpdpbusd does twice the work. Each lane does int4x8_rows' fp32
 * operations in its order, so the bits are those of the 256-bit kernel
 * and of the scalar tile. */

/* 32 bytes at a in the low half, 32 at b in the high half */
INLINE __m512i ld2x32(const uint8_t *a, const uint8_t *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* 8 fp16 at a, then 8 at b, as 16 fp32 */
INLINE __m512 ld2_f16(const uint16_t *a, const uint16_t *b)
{
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
        _mm_loadu_si128((const __m128i *)b), 1));
}

/* 8 int8 at a, then 8 at b, as 16 fp32 (exact) */
INLINE __m512 ld2_i8(const int8_t *a, const int8_t *b)
{
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                         _mm_loadl_epi64((const __m128i *)b));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}

/* 4 activations at x in every 32-bit lane */
INLINE __m512i bcast4_512(const int8_t *x)
{
    int32_t v;
    memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

/* np pairs of tiles (t, t + 1), (t + 2, t + 3), ... against activation
 * rows m0..m0+mr-1, np * mr <= 8: decode (mr = 1) takes two pairs, so a
 * thread reads four tiles side by side (four streams keep more misses in
 * flight than two; the bandwidth probe of dsq-bench shows the difference);
 * prefill one pair against 8 rows, so each unpacked register (3 operations
 * for INT4, 9 for INT5 on the two vector ports dpbusd shares) feeds 16
 * dot products: +8-10 % prefill at 6.7B against 4 rows (docs/benchmarks.md).
 * 8 rows keep 24 accumulators in the 32 registers.
 * Sums are indexed j = q * mr + r (pair q, activation row r). */
/* Part p (< 4) of one 32-weight chunk of an INT4_X8 / INT5_X8 tile pair
 * (wc: the first tile's chunk, the second's tw bytes on; tb: top45 of the
 * chunk) as two byte vectors, lanes 8-15 for the second tile: *lo weights
 * 4p..4p+3 of every row, *hi weights 16 + 4p.. (int4x8_rows' layout,
 * matmul_x86.inc). The row kernels and the panel path's prep45 share it,
 * each calling it where it uses the bytes. */
INLINE __m512i top45(const uint8_t *wc, int64_t tw, const bool five)
{
    return five ? ld2x32(wc + 128, wc + tw + 128) : _mm512_setzero_si512();
}

INLINE void unpack45(const uint8_t *wc, int64_t tw, const bool five, __m512i tb, const int p,
                     __m512i *lo_out, __m512i *hi_out)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const __m512i v = ld2x32(wc + 32 * p, wc + tw + 32 * p);
    __m512i lo = _mm512_and_si512(v, lo4);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
    if (five) {   /* the top bits as in int4x8_rows */
        const __m512i tl = p == 0 ? _mm512_slli_epi16(tb, 4)
                         : p == 1 ? _mm512_slli_epi16(tb, 2)
                         : p == 2 ? tb : _mm512_srli_epi16(tb, 2);
        const __m512i th = p == 0 ? _mm512_slli_epi16(tb, 3)
                         : p == 1 ? _mm512_slli_epi16(tb, 1)
                         : p == 2 ? _mm512_srli_epi16(tb, 1)
                                  : _mm512_srli_epi16(tb, 3);
        lo = _mm512_or_si512(lo, _mm512_and_si512(tl, b4));
        hi = _mm512_or_si512(hi, _mm512_and_si512(th, b4));
    }
    *lo_out = lo;
    *hi_out = hi;
}

/* Where the INT4_X8 / INT5_X8 tiles from t on keep their group scales:
 * st / zt (F16 mode; NULL when absent) or sup and u6 (SUPER: fp16 (d, dm)
 * per super-block, and the current super-block's 6-bit a and b of tile
 * t + o at u6[o], unpacked by unpack_sub6); tile t + o's at o * tg (st,
 * zt) and o * ts (sup). */
typedef struct sc45 {
    const uint16_t *st, *zt, *sup;
    int8_t (*u6)[128];
    int64_t tg, ts;
    bool super, five;
    dsq_zp_mode_t zp;
} sc45_t;

/* Group g's scales s for tiles t + o, t + o + 1 (16 lanes). */
INLINE __m512 scale45(const sc45_t *p, int64_t o, int64_t g)
{
    return p->super ? _mm512_mul_ps(ld2_f16(p->sup + o * p->ts + (g / 8) * 16,
                                            p->sup + (o + 1) * p->ts + (g / 8) * 16),
                                    ld2_i8(p->u6[o] + (g % 8) * 8, p->u6[o + 1] + (g % 8) * 8))
                    : ld2_f16(p->st + o * p->tg + g * 8, p->st + (o + 1) * p->tg + g * 8);
}

/* Group g's zero-point term c for the same tiles (y = s * dot + c * sum(x)
 * per group), from its s: -8 s or -16 s (SYM), -z s (INT), m (MIN; dm * b
 * under SUPER). */
INLINE __m512 corr45(const sc45_t *p, int64_t o, int64_t g, __m512 sv)
{
    __m512 zv = _mm512_setzero_ps();
    if (p->zp != DSQ_ZP_SYM)
        zv = p->super ? ld2_i8(p->u6[o] + 64 + (g % 8) * 8, p->u6[o + 1] + 64 + (g % 8) * 8)
                      : ld2_f16(p->zt + o * p->tg + g * 8, p->zt + (o + 1) * p->tg + g * 8);
    if (p->zp == DSQ_ZP_SYM)
        return _mm512_mul_ps(_mm512_set1_ps(p->five ? -16.0f : -8.0f), sv);
    if (p->zp == DSQ_ZP_INT)
        return _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), zv), sv);
    if (p->super)
        return _mm512_mul_ps(ld2_f16(p->sup + o * p->ts + (g / 8) * 16 + 8,
                                     p->sup + (o + 1) * p->ts + (g / 8) * 16 + 8), zv);
    return zv;
}

INLINE void int4x8_pairs(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                         const int mr, const dsq_weight_t *w, int64_t t, const bool five,
                         const int np)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, groups = xq->n_groups, cpg = xq->cpg;
    const int64_t cb = five ? 160 : 128;          /* bytes per chunk of a tile */
    const int64_t tw = nb * cb, tg = groups * 8, ts = (w->k / 256) * 16; /* tile strides */
    const uint8_t *wt = (const uint8_t *)w->data + t * tw;
    const bool super = w->scale_mode == DSQ_SCALE_SUPER;
    const uint16_t *st = super ? NULL : w->scales + t * tg;
    const uint16_t *zt = w->zeros ? w->zeros + t * tg : NULL;
    /* SUPER (zp MIN): 6-bit a and b, 96 bytes a super-block, unpacked
     * per super-block into u6 (unpack_sub6: a of group g at 8g, b at
     * 64 + 8g) */
    const int64_t t6 = (w->k / 256) * 96;
    const uint8_t *s6 = super ? (const uint8_t *)w->sub_scales + t * t6 : NULL;
    const uint16_t *sup = super ? w->super + t * ts : NULL;
    int8_t u6[4][128];
    const dsq_zp_mode_t zp = w->zp_mode;
    const sc45_t sp = {.st = st, .zt = zt, .sup = sup, .u6 = u6, .tg = tg, .ts = ts,
                       .super = super, .five = five, .zp = zp};
    const int8_t *xr = xq->q + m0 * kp;
    __m512 acc[8], corr[8];
    for (int j = 0; j < np * mr; j++) {
        acc[j] = _mm512_setzero_ps();
        corr[j] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < groups; g++) {
        __m512 sv[2];
        if (super && g % 8 == 0)
            for (int o = 0; o < 2 * np; o++)
                unpack_sub6(s6 + o * t6 + (g / 8) * 96, u6[o]);
#pragma GCC unroll 2
        for (int q = 0; q < np; q++)   /* pair q: tiles t + 2q and t + 2q + 1 */
            sv[q] = scale45(&sp, 2 * q, g);
        const int64_t c1 = (g + 1) * cpg < nb ? (g + 1) * cpg : nb;
        for (int64_t c = g * cpg; c < c1; c++) {
            const int8_t *xc = xr + c * 32;
            __m512i s[8];
            for (int j = 0; j < np * mr; j++)
                s[j] = _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int q = 0; q < np; q++) {
                const uint8_t *wc = wt + 2 * q * tw + c * cb;
                const __m512i tb = top45(wc, tw, five);
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    __m512i lo, hi;
                    unpack45(wc, tw, five, tb, p, &lo, &hi);
#pragma GCC unroll 8
                    for (int r = 0; r < mr; r++) {
                        const int j = q * mr + r;
                        s[j] = _mm512_dpbusd_epi32(s[j], lo, bcast4_512(xc + r * kp + 4 * p));
                        s[j] = _mm512_dpbusd_epi32(s[j], hi, bcast4_512(xc + r * kp + 16 + 4 * p));
                    }
                }
            }
#pragma GCC unroll 2
            for (int q = 0; q < np; q++)
#pragma GCC unroll 8
                for (int r = 0; r < mr; r++) {
                    const int j = q * mr + r;
                    __m512 mul = _mm512_mul_ps(sv[q], _mm512_set1_ps(xq->d[(m0 + r) * nb + c]));
                    acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(mul, _mm512_cvtepi32_ps(s[j])));
                }
        }
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            const __m512 cv = corr45(&sp, 2 * q, g, sv[q]);
            for (int r = 0; r < mr; r++)
                corr[q * mr + r] = _mm512_add_ps(corr[q * mr + r], _mm512_mul_ps(cv,
                                       _mm512_set1_ps(xq->gsum[(m0 + r) * groups + g])));
        }
    }
    for (int q = 0; q < np; q++)
        for (int r = 0; r < mr; r++)
            _mm512_storeu_ps(y + (m0 + r) * ldy + 8 * (t + 2 * q),
                             _mm512_add_ps(acc[q * mr + r], corr[q * mr + r]));
}

/* Pairs of tiles on 512-bit vectors (two pairs at once for one activation
 * row; up to 8 rows a pair, dsq__mm_avx512_rows), a last odd tile on the
 * 256-bit kernel (tile_int4x8 in matmul_x86.inc). */
static void tile_int4x8_512(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                            int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    if (w->zp_mode == DSQ_ZP_LUT) {
        tile_int4x8(y, ldy, xq, m0, m1, w, n0, n1);
        return;
    }
    const bool five = w->format == DSQ_WFMT_INT5_X8;
    int64_t t = n0 / 8;
    if (m1 - m0 == 1)
        for (; t + 4 <= n1 / 8; t += 4) {
            if (five)
                int4x8_pairs(y, ldy, xq, m0, 1, w, t, true, 2);
            else
                int4x8_pairs(y, ldy, xq, m0, 1, w, t, false, 2);
        }
    for (; t + 2 <= n1 / 8; t += 2) {
        if (m1 - m0 > 4 && m1 - m0 < 8) {   /* a prompt's last rows */
            tile_int4x8_512(y, ldy, xq, m0, m0 + 4, w, 8 * t, 8 * t + 16);
            tile_int4x8_512(y, ldy, xq, m0 + 4, m1, w, 8 * t, 8 * t + 16);
            continue;
        }
        switch ((m1 - m0) * 2 + five) {
        case 16: int4x8_pairs(y, ldy, xq, m0, 8, w, t, false, 1); break;
        case 17: int4x8_pairs(y, ldy, xq, m0, 8, w, t, true, 1); break;
        case 8: int4x8_pairs(y, ldy, xq, m0, 4, w, t, false, 1); break;
        case 6: int4x8_pairs(y, ldy, xq, m0, 3, w, t, false, 1); break;
        case 4: int4x8_pairs(y, ldy, xq, m0, 2, w, t, false, 1); break;
        case 9: int4x8_pairs(y, ldy, xq, m0, 4, w, t, true, 1); break;
        case 7: int4x8_pairs(y, ldy, xq, m0, 3, w, t, true, 1); break;
        case 5: int4x8_pairs(y, ldy, xq, m0, 2, w, t, true, 1); break;
        default:
            for (int64_t r = m0; r < m1; r++)
                if (five)
                    int4x8_pairs(y, ldy, xq, r, 1, w, t, true, 1);
                else
                    int4x8_pairs(y, ldy, xq, r, 1, w, t, false, 1);
            break;
        }
    }
    for (int64_t r = m0; t < n1 / 8 && r < m1; r += 4)   /* a last odd tile */
        tile_int4x8(y, ldy, xq, r, r + 4 < m1 ? r + 4 : m1, w, 8 * t, n1);
}

/* g16_chunk (matmul_x86.inc) on 512-bit vectors: two tiles' lanes. */
INLINE void g16_chunk512(__m512 *acc, __m512 *corr, __m512 s0, __m512 s1, __m512 c0,
                         __m512 c1, __m512i d0, __m512i d1, float xd, const float *gs)
{
    const __m512 x = _mm512_set1_ps(xd);
    *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_mul_ps(s0, x), _mm512_cvtepi32_ps(d0)));
    *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_mul_ps(s1, x), _mm512_cvtepi32_ps(d1)));
    *corr = _mm512_add_ps(*corr, _mm512_mul_ps(c0, _mm512_set1_ps(gs[0])));
    *corr = _mm512_add_ps(*corr, _mm512_mul_ps(c1, _mm512_set1_ps(gs[1])));
}

/* Quarter p = 2h + e of one 32-weight chunk of an INT6_X8 tile pair (wc:
 * the first tile's chunk, the second's tw bytes on; hb: the chunk's top
 * bits for half h, ld2x32(wc + 128 + 32h, wc + tw + 128 + 32h)) as two
 * byte vectors, lanes 8-15 for the second tile: *lo weights 4p..4p+3,
 * *hi 16 + 4p.. (int6x8_rows' layout). Shared with the panel path's
 * prep6. */
INLINE void unpack6(const uint8_t *wc, int64_t tw, __m512i hb, const int h, const int e,
                    __m512i *lo, __m512i *hi)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const int p = 2 * h + e;
    const __m512i v = ld2x32(wc + 32 * p, wc + tw + 32 * p);
    const __m512i tl = e ? hb : _mm512_slli_epi16(hb, 4);
    const __m512i th = e ? _mm512_srli_epi16(hb, 2) : _mm512_slli_epi16(hb, 2);
    *lo = _mm512_or_si512(_mm512_and_si512(v, lo4), _mm512_and_si512(tl, top));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), lo4),
                          _mm512_and_si512(th, top));
}

/* The two 16-weight groups' scales of chunk c of INT6_X8 tiles t + o and
 * t + o + 1 (sup, sst: tile t's super-block d and sub-scales, tile strides
 * ts and tg): s = d * a; the zero-point term is -32 s. */
INLINE void scales6(const uint16_t *sup, const int8_t *sst, int64_t ts, int64_t tg, int64_t o,
                    int64_t c, __m512 *s0, __m512 *s1)
{
    const __m512 dv = ld2_f16(sup + o * ts + (c / 8) * 8, sup + (o + 1) * ts + (c / 8) * 8);
    *s0 = _mm512_mul_ps(dv, ld2_i8(sst + o * tg + 16 * c, sst + (o + 1) * tg + 16 * c));
    *s1 = _mm512_mul_ps(dv, ld2_i8(sst + o * tg + 16 * c + 8, sst + (o + 1) * tg + 16 * c + 8));
}

/* INT6_X8 two tiles at a time: int6x8_rows (matmul_x86.inc) on 512-bit
 * vectors, lanes 8-15 for tile t + 1; the same fp32 operations per lane.
 * np pairs side by side as int4x8_pairs (decode: two pairs, four
 * streams); sums indexed j = q * mr + r. */
INLINE void int6x8_pairs(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                         const int mr, const dsq_weight_t *w, int64_t t, const int np)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, groups = xq->n_groups;
    const int64_t tw = nb * 192, tg = groups * 8, ts = (w->k / 256) * 8;
    const uint8_t *wt = (const uint8_t *)w->data + t * tw;
    const int8_t *sst = w->sub_scales + t * tg;
    const uint16_t *sup = w->super + t * ts;
    const __m512 m32 = _mm512_set1_ps(-32.0f);
    const int8_t *xr = xq->q + m0 * kp;
    __m512 acc[4], corr[4];
    for (int j = 0; j < np * mr; j++) {
        acc[j] = _mm512_setzero_ps();
        corr[j] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < nb; c++) {
        const int8_t *xc = xr + c * 32;
        __m512i sl[4], sh[4];
        for (int j = 0; j < np * mr; j++)
            sl[j] = sh[j] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            const uint8_t *wc = wt + 2 * q * tw + c * 192;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i hb = ld2x32(wc + 128 + 32 * h, wc + tw + 128 + 32 * h);
#pragma GCC unroll 2
                for (int e = 0; e < 2; e++) {
                    const int p = 2 * h + e;
                    __m512i lo, hi;
                    unpack6(wc, tw, hb, h, e, &lo, &hi);
#pragma GCC unroll 4
                    for (int r = 0; r < mr; r++) {
                        const int j = q * mr + r;
                        sl[j] = _mm512_dpbusd_epi32(sl[j], lo, bcast4_512(xc + r * kp + 4 * p));
                        sh[j] = _mm512_dpbusd_epi32(sh[j], hi,
                                                    bcast4_512(xc + r * kp + 16 + 4 * p));
                    }
                }
            }
        }
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            __m512 s0, s1;
            scales6(sup, sst, ts, tg, 2 * q, c, &s0, &s1);
            const __m512 c0 = _mm512_mul_ps(m32, s0), c1 = _mm512_mul_ps(m32, s1);
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++)
                g16_chunk512(&acc[q * mr + r], &corr[q * mr + r], s0, s1, c0, c1,
                             sl[q * mr + r], sh[q * mr + r], xq->d[(m0 + r) * nb + c],
                             xq->gsum + (m0 + r) * groups + 2 * c);
        }
    }
    for (int q = 0; q < np; q++)
        for (int r = 0; r < mr; r++)
            _mm512_storeu_ps(y + (m0 + r) * ldy + 8 * (t + 2 * q),
                             _mm512_add_ps(acc[q * mr + r], corr[q * mr + r]));
}

/* 8 bytes at a, then 8 at b, as 16 unsigned int32 */
INLINE __m512i ld2_u8(const uint8_t *a, const uint8_t *b)
{
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a),
                                         _mm_loadl_epi64((const __m128i *)b));
    return _mm512_cvtepu8_epi32(v);
}

/* Weights 4jj..4jj+3 of half h of one 32-weight chunk of an INT2_X8 /
 * INT3_X8 tile pair as bytes, lanes 8-15 for the second tile, from the
 * half's 2-bit planes v and (INT3) the chunk's third-bit plane tb
 * (int23x8_rows' layout). Shared with the panel path's prep23. */
INLINE __m512i unpack23(__m512i v, __m512i tb, const bool three, const int h, const int jj)
{
    const __m512i m3 = _mm512_set1_epi8(3), b2 = _mm512_set1_epi8(4);
    __m512i qv = _mm512_and_si512(jj ? _mm512_srli_epi16(v, 2 * jj) : v, m3);
    if (three) {
        const int sh2 = 4 * h + jj - 2;
        const __m512i tj = sh2 < 0 ? _mm512_slli_epi16(tb, -sh2)
                         : sh2 ? _mm512_srli_epi16(tb, sh2) : tb;
        qv = _mm512_or_si512(qv, _mm512_and_si512(tj, b2));
    }
    return qv;
}

/* Scale s and zero-point term c of 16-weight group g (of its super-block)
 * for an INT2_X8 / INT3_X8 tile pair: INT3 s = d (a - 32) from the 6-bit
 * a unpacked in u6a / u6b, c = -4 s; INT2 s = d (ab & 15), c = dm (ab >> 4)
 * from the bytes ab at a0 (the first tile's super-block; the second's t6
 * on). dv, mv: the pair's d and dm. */
INLINE void scales23(const bool three, __m512 dv, __m512 mv, const int8_t *u6a,
                     const int8_t *u6b, const uint8_t *a0, int64_t t6, int64_t g, __m512 *sv,
                     __m512 *cv)
{
    if (three) {
        *sv = _mm512_mul_ps(dv, _mm512_sub_ps(ld2_i8(u6a + 8 * g, u6b + 8 * g),
                                              _mm512_set1_ps(32.0f)));
        *cv = _mm512_mul_ps(_mm512_set1_ps(-4.0f), *sv);
    } else {
        const __m512i ab = ld2_u8(a0 + 8 * g, a0 + t6 + 8 * g);
        *sv = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_and_si512(ab, _mm512_set1_epi32(15))));
        *cv = _mm512_mul_ps(mv, _mm512_cvtepi32_ps(_mm512_srli_epi32(ab, 4)));
    }
}

/* INT2_X8 / INT3_X8 two tiles at a time: int23x8_rows (matmul_x86.inc) on
 * 512-bit vectors, lanes 8-15 for tile t + 1; the same fp32 operations per
 * lane. np pairs side by side as int4x8_pairs; sums indexed j = q * mr + r. */
INLINE void int23x8_pairs(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                          const int mr, const dsq_weight_t *w, int64_t t, const int np,
                          const bool three)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, groups = xq->n_groups, sbs = w->k / 256;
    const int64_t cb = three ? 96 : 64, tw = nb * cb;
    const int64_t t6 = sbs * (three ? 96 : 128), ts = sbs * (three ? 8 : 16);
    const uint8_t *wt = (const uint8_t *)w->data + t * tw;
    const uint8_t *sst = (const uint8_t *)w->sub_scales + t * t6;
    const uint16_t *sup = w->super + t * ts;
    const int8_t *xr = xq->q + m0 * kp;
    __m512 acc[4], corr[4], dv[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()},
                            mv[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int8_t u6[4][128];
    for (int j = 0; j < np * mr; j++) {
        acc[j] = _mm512_setzero_ps();
        corr[j] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < nb; c++) {
        const int64_t sb = c / 8, g0 = 2 * (c % 8);
        if (c % 8 == 0)
            for (int q = 0; q < np; q++) {
                const int64_t o = 2 * q;
                if (three) {
                    unpack_sub6(sst + o * t6 + sb * 96, u6[o]);
                    unpack_sub6(sst + (o + 1) * t6 + sb * 96, u6[o + 1]);
                    dv[q] = ld2_f16(sup + o * ts + sb * 8, sup + (o + 1) * ts + sb * 8);
                } else {
                    dv[q] = ld2_f16(sup + o * ts + sb * 16, sup + (o + 1) * ts + sb * 16);
                    mv[q] = ld2_f16(sup + o * ts + sb * 16 + 8,
                                    sup + (o + 1) * ts + sb * 16 + 8);
                }
            }
        const int8_t *xc = xr + c * 32;
        __m512i sl[4], sh[4];
        for (int j = 0; j < np * mr; j++)
            sl[j] = sh[j] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            const uint8_t *wc = wt + 2 * q * tw + c * cb;
            const __m512i tb = three ? ld2x32(wc + 64, wc + tw + 64) : _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i v = ld2x32(wc + 32 * h, wc + tw + 32 * h);
#pragma GCC unroll 4
                for (int jj = 0; jj < 4; jj++) {
                    const __m512i qv = unpack23(v, tb, three, h, jj);
#pragma GCC unroll 4
                    for (int r = 0; r < mr; r++) {
                        const int j = q * mr + r;
                        if (h)
                            sh[j] = _mm512_dpbusd_epi32(sh[j], qv,
                                                        bcast4_512(xc + r * kp + 16 + 4 * jj));
                        else
                            sl[j] = _mm512_dpbusd_epi32(sl[j], qv,
                                                        bcast4_512(xc + r * kp + 4 * jj));
                    }
                }
            }
        }
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            const int64_t o = 2 * q;
            const uint8_t *a0 = three ? NULL : sst + o * t6 + sb * 128;   /* INT2 only */
            __m512 s0, s1, c0, c1;
            scales23(three, dv[q], mv[q], u6[o], u6[o + 1], a0, t6, g0, &s0, &c0);
            scales23(three, dv[q], mv[q], u6[o], u6[o + 1], a0, t6, g0 + 1, &s1, &c1);
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++)
                g16_chunk512(&acc[q * mr + r], &corr[q * mr + r], s0, s1, c0, c1,
                             sl[q * mr + r], sh[q * mr + r], xq->d[(m0 + r) * nb + c],
                             xq->gsum + (m0 + r) * groups + 2 * c);
        }
    }
    for (int q = 0; q < np; q++)
        for (int r = 0; r < mr; r++)
            _mm512_storeu_ps(y + (m0 + r) * ldy + 8 * (t + 2 * q),
                             _mm512_add_ps(acc[q * mr + r], corr[q * mr + r]));
}

INLINE void int2x8_pairs(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                         const int mr, const dsq_weight_t *w, int64_t t, const int np)
{
    int23x8_pairs(y, ldy, xq, m0, mr, w, t, np, false);
}

INLINE void int3x8_pairs(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                         const int mr, const dsq_weight_t *w, int64_t t, const int np)
{
    int23x8_pairs(y, ldy, xq, m0, mr, w, t, np, true);
}

/* Q8_0_X8 two tiles at a time: q8x8_rows on 512-bit vectors. AVX-512 has
 * no vpsignb: the activations are negated under the mask of negative
 * weights instead (where a weight is 0 its |w| makes the product 0 either
 * way), so the integer sums are q8x8_rows' exactly. np pairs side by side
 * as int4x8_pairs. */
INLINE void q8x8_pairs(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                       const int mr, const dsq_weight_t *w, int64_t t, const int np)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, tw = nb * 272;
    const uint8_t *wt = (const uint8_t *)w->data + t * tw;
    const int8_t *xr = xq->q + m0 * kp;
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[4];
    for (int j = 0; j < np * mr; j++)
        acc[j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nb; c++) {
        const int8_t *xc = xr + c * 32;
        __m512i s[4];
        for (int j = 0; j < np * mr; j++)
            s[j] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            const uint8_t *wc = wt + 2 * q * tw + c * 272;
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) {
                const __m512i v = ld2x32(wc + 16 + 32 * p, wc + tw + 16 + 32 * p);
                const __m512i av = _mm512_abs_epi8(v);
                const __mmask64 neg = _mm512_movepi8_mask(v);
#pragma GCC unroll 4
                for (int r = 0; r < mr; r++) {
                    const int j = q * mr + r;
                    const __m512i xb = bcast4_512(xc + r * kp + 4 * p);
                    s[j] = _mm512_dpbusd_epi32(s[j], av, _mm512_mask_sub_epi8(xb, neg, zero, xb));
                }
            }
        }
#pragma GCC unroll 2
        for (int q = 0; q < np; q++) {
            const uint8_t *wc = wt + 2 * q * tw + c * 272;
            const __m512 dv = ld2_f16((const uint16_t *)wc, (const uint16_t *)(wc + tw));
#pragma GCC unroll 4
            for (int r = 0; r < mr; r++)
                acc[q * mr + r] = _mm512_add_ps(acc[q * mr + r], _mm512_mul_ps(
                                      _mm512_mul_ps(dv, _mm512_set1_ps(xq->d[(m0 + r) * nb + c])),
                                      _mm512_cvtepi32_ps(s[q * mr + r])));
        }
    }
    for (int q = 0; q < np; q++)
        for (int r = 0; r < mr; r++)
            _mm512_storeu_ps(y + (m0 + r) * ldy + 8 * (t + 2 * q), acc[q * mr + r]);
}

/* Pairs of tiles through PAIRS (two pairs side by side for one activation
 * row, decode), a last odd tile through the 256-bit TILE1 */
#define TILE_PAIRS(name, PAIRS, TILE1)                                          \
    static void name(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,    \
                     int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1) \
    {                                                                           \
        int64_t t = n0 / 8;                                                     \
        if (m1 - m0 == 1)                                                       \
            for (; t + 4 <= n1 / 8; t += 4)                                     \
                PAIRS(y, ldy, xq, m0, 1, w, t, 2);                              \
        for (; t + 2 <= n1 / 8; t += 2) {                                       \
            switch (m1 - m0) {                                                  \
            case 4: PAIRS(y, ldy, xq, m0, 4, w, t, 1); break;                   \
            case 3: PAIRS(y, ldy, xq, m0, 3, w, t, 1); break;                   \
            case 2: PAIRS(y, ldy, xq, m0, 2, w, t, 1); break;                   \
            default:                                                            \
                for (int64_t r = m0; r < m1; r++)                               \
                    PAIRS(y, ldy, xq, r, 1, w, t, 1);                           \
                break;                                                          \
            }                                                                   \
        }                                                                       \
        if (t < n1 / 8)                                                         \
            TILE1(y, ldy, xq, m0, m1, w, 8 * t, n1);                            \
    }
TILE_PAIRS(tile_int6x8_512, int6x8_pairs, tile_int6x8)
TILE_PAIRS(tile_int2x8_512, int2x8_pairs, tile_int23x8)
TILE_PAIRS(tile_int3x8_512, int3x8_pairs, tile_int23x8)
TILE_PAIRS(tile_q8_0x8_512, q8x8_pairs, tile_q8_0x8)

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

/* The row kernels of w's format for rows m0..m1, weight rows n0..n1. */
static void panel_fallback(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0, int64_t m1,
                           const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const bool eight = dsq__mm_avx512_rows(w) == 8;
    for (int64_t r = m0; r < m1;) {
        const int64_t r1 = r + (eight ? 8 : DSQ__MM_MR) < m1 ? r + (eight ? 8 : DSQ__MM_MR) : m1;
        switch (w->format) {
        case DSQ_WFMT_INT6_X8: tile_int6x8_512(y, ldy, xq, r, r1, w, n0, n1); break;
        case DSQ_WFMT_INT2_X8: tile_int2x8_512(y, ldy, xq, r, r1, w, n0, n1); break;
        case DSQ_WFMT_INT3_X8: tile_int3x8_512(y, ldy, xq, r, r1, w, n0, n1); break;
        default: tile_int4x8_512(y, ldy, xq, r, r1, w, n0, n1); break;
        }
        r = r1;
    }
}

/* ---- The panel path (prefill against the interleaved formats but Q8_0_X8
 * and the codebook): the kernels above broadcast 4 activations per dot
 * product, and on AVX-512 parts that load a 512-bit register once a cycle
 * those broadcasts, not the arithmetic, bound prefill (~30 multiply-adds
 * a cycle at 6.7B). Here the lanes are 16 activation rows instead
 * (xq->qt, dsq__xq_t), a tile's 16 weight rows are unpacked once per block
 * of PANEL_KB chunks into bytes that every activation row of the tile
 * reuses, and each broadcast of 4 weights feeds 2 dot products: a 2 x 4
 * block of 16-lane sums takes 6 loads per 8 dot products where the row
 * kernels take 8 per 8. Each output still gets its scalar kernel's fp32
 * operations in their order (acc += (s * d) * dot per group-sized part
 * of a chunk, corr += c * gsum per group, y = acc + corr), so results are
 * bitwise those of the scalar and the row kernels. */
#define PANEL_KB 16     /* chunks per weight block: 8 KiB of unpacked bytes */

/* One block of a strip of 16 weight rows (tiles t, t + 1 in lanes 0-7 /
 * 8-15) made ready for panel_dots. */
typedef struct panel_blk {
    __m512i wu[PANEL_KB * 8];   /* chunk c, bytes of weights 4j..4j+3 of each
                                   row: wu[8c + j] */
    float sc[PANEL_KB * 2 * 16]; /* s of part h (of hs) of chunk c at (c hs + h) 16 */
    float cg[PANEL_KB * 2 * 16]; /* c of the block's group g0 + i at 16 i */
    int64_t g0, g1;             /* its groups */
    int hs;                     /* parts a chunk: 1 (groups >= 32), 2 (16) */
} panel_blk_t;

/* INT4_X8 / INT5_X8 chunks k0..k0+nch-1 (int4x8_pairs' unpacking and
 * scales). */
static void prep45(const dsq_weight_t *w, const dsq__xq_t *xq, int64_t t, int64_t k0, int nch,
                   panel_blk_t *b)
{
    const int64_t nb = xq->nb, groups = xq->n_groups, cpg = xq->cpg;
    const bool five = w->format == DSQ_WFMT_INT5_X8;
    const int64_t cb = five ? 160 : 128, tw = nb * cb, tg = groups * 8;
    const int64_t ts = (w->k / 256) * 16, t6 = (w->k / 256) * 96;
    const uint8_t *wt = (const uint8_t *)w->data + t * tw;
    const bool super = w->scale_mode == DSQ_SCALE_SUPER;
    const uint8_t *s6 = super ? (const uint8_t *)w->sub_scales + t * t6 : NULL;
    int8_t u6[2][128];
    const sc45_t sp = {.st = super ? NULL : w->scales + t * tg,
                       .zt = w->zeros ? w->zeros + t * tg : NULL,
                       .sup = super ? w->super + t * ts : NULL, .u6 = u6, .tg = tg, .ts = ts,
                       .super = super, .five = five, .zp = w->zp_mode};
    for (int c = 0; c < nch; c++) {
        const uint8_t *wc = wt + (k0 + c) * cb;
        const __m512i tb = top45(wc, tw, five);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            unpack45(wc, tw, five, tb, p, &b->wu[8 * c + p], &b->wu[8 * c + 4 + p]);
    }
    /* PANEL_KB is a multiple of cpg: the block holds whole groups */
    b->hs = 1;
    b->g0 = k0 / cpg;
    b->g1 = (k0 + nch + cpg - 1) / cpg < groups ? (k0 + nch + cpg - 1) / cpg : groups;
    for (int64_t g = b->g0; g < b->g1; g++) {
        if (super && (g % 8 == 0 || g == b->g0))
            for (int o = 0; o < 2; o++)
                unpack_sub6(s6 + o * t6 + (g / 8) * 96, u6[o]);
        const __m512 sv = scale45(&sp, 0, g);
        _mm512_store_ps(b->cg + (g - b->g0) * 16, corr45(&sp, 0, g, sv));
        for (int64_t c = g * cpg; c < (g + 1) * cpg && c < k0 + nch; c++)
            _mm512_store_ps(b->sc + (c - k0) * 16, sv);
    }
}

/* INT6_X8 chunks k0..k0+nch-1 (int6x8_pairs' unpacking and scales). */
static void prep6(const dsq_weight_t *w, const dsq__xq_t *xq, int64_t t, int64_t k0, int nch,
                  panel_blk_t *b)
{
    const int64_t nb = xq->nb, groups = xq->n_groups;
    const int64_t tw = nb * 192, tg = groups * 8, ts = (w->k / 256) * 8;
    const uint8_t *wt = (const uint8_t *)w->data + t * tw;
    const int8_t *sst = w->sub_scales + t * tg;
    const uint16_t *sup = w->super + t * ts;
    const __m512 m32 = _mm512_set1_ps(-32.0f);
    for (int cc = 0; cc < nch; cc++) {
        const int64_t c = k0 + cc;
        const uint8_t *wc = wt + c * 192;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i hb = ld2x32(wc + 128 + 32 * h, wc + tw + 128 + 32 * h);
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++)
                unpack6(wc, tw, hb, h, e, &b->wu[8 * cc + 2 * h + e],
                        &b->wu[8 * cc + 4 + 2 * h + e]);
        }
        __m512 sv[2];
        scales6(sup, sst, ts, tg, 0, c, &sv[0], &sv[1]);
        for (int h = 0; h < 2; h++) {
            _mm512_store_ps(b->sc + (2 * cc + h) * 16, sv[h]);
            _mm512_store_ps(b->cg + (2 * cc + h) * 16, _mm512_mul_ps(m32, sv[h]));
        }
    }
    b->hs = 2;
    b->g0 = 2 * k0;
    b->g1 = 2 * (k0 + nch);
}

/* INT2_X8 / INT3_X8 chunks k0..k0+nch-1 (int23x8_pairs' unpacking and
 * scales). */
static void prep23(const dsq_weight_t *w, const dsq__xq_t *xq, int64_t t, int64_t k0, int nch,
                   panel_blk_t *b)
{
    const bool three = w->format == DSQ_WFMT_INT3_X8;
    const int64_t nb = xq->nb, sbs = w->k / 256;
    const int64_t cb = three ? 96 : 64, tw = nb * cb;
    const int64_t t6 = sbs * (three ? 96 : 128), ts = sbs * (three ? 8 : 16);
    const uint8_t *wt = (const uint8_t *)w->data + t * tw;
    const uint8_t *sst = (const uint8_t *)w->sub_scales + t * t6;
    const uint16_t *sup = w->super + t * ts;
    int8_t u6[2][128];
    __m512 dv = _mm512_setzero_ps(), mv = _mm512_setzero_ps();
    for (int cc = 0; cc < nch; cc++) {
        const int64_t c = k0 + cc, sb = c / 8, g0 = 2 * (c % 8);
        if (c % 8 == 0 || cc == 0) {
            if (three) {
                unpack_sub6(sst + sb * 96, u6[0]);
                unpack_sub6(sst + t6 + sb * 96, u6[1]);
                dv = ld2_f16(sup + sb * 8, sup + ts + sb * 8);
            } else {
                dv = ld2_f16(sup + sb * 16, sup + ts + sb * 16);
                mv = ld2_f16(sup + sb * 16 + 8, sup + ts + sb * 16 + 8);
            }
        }
        const uint8_t *wc = wt + c * cb;
        const __m512i tb = three ? ld2x32(wc + 64, wc + tw + 64) : _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i v = ld2x32(wc + 32 * h, wc + tw + 32 * h);
#pragma GCC unroll 4
            for (int jj = 0; jj < 4; jj++)
                b->wu[8 * cc + 4 * h + jj] = unpack23(v, tb, three, h, jj);
        }
        for (int h = 0; h < 2; h++) {
            __m512 sv, cv;
            scales23(three, dv, mv, u6[0], u6[1], three ? NULL : sst + sb * 128, t6, g0 + h,
                     &sv, &cv);
            _mm512_store_ps(b->sc + (2 * cc + h) * 16, sv);
            _mm512_store_ps(b->cg + (2 * cc + h) * 16, cv);
        }
    }
    b->hs = 2;
    b->g0 = 2 * k0;
    b->g1 = 2 * (k0 + nch);
}

/* ma activation blocks (16 rows each, ma <= 2) x weight rows nw..nw+3 of
 * the block over its nch chunks, hs parts a chunk: f[a][i] += (s * d) *
 * dot per part. xa / da: the first activation block's transposed bytes
 * and scales at the block's first chunk, xs / ds the strides between
 * activation blocks. */
INLINE void panel_dots(const int ma, const int hs, const int8_t *xa, int64_t xs,
                       const float *da, int64_t ds, const panel_blk_t *b, int nw, int nch,
                       __m512 f[2][4])
{
    for (int c = 0; c < nch; c++) {
        const uint8_t *wb = (const uint8_t *)(b->wu + 8 * c) + 4 * nw;
        __m512 d[2];
#pragma GCC unroll 2
        for (int a = 0; a < ma; a++)
            d[a] = _mm512_load_ps(da + a * ds + c * 16);
#pragma GCC unroll 2
        for (int h = 0; h < hs; h++) {
            __m512i s[2][4];
#pragma GCC unroll 2
            for (int a = 0; a < ma; a++)
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    s[a][i] = _mm512_setzero_si512();
            /* plain bounds: a sanitizer build's checks on h * 8 / hs in
             * the loop header would leave the annotation unusable */
            const int jn = hs == 2 ? 4 : 8;
#pragma GCC unroll 8
            for (int jj = 0; jj < jn; jj++) {
                const int j = h * jn + jj;
                __m512i x[2];
#pragma GCC unroll 2
                for (int a = 0; a < ma; a++)
                    x[a] = _mm512_load_si512((const void *)(xa + a * xs + (c * 8 + j) * 64));
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    int32_t v;
                    memcpy(&v, wb + 64 * j + 4 * i, 4);
                    const __m512i wv = _mm512_set1_epi32(v);
#pragma GCC unroll 2
                    for (int a = 0; a < ma; a++)
                        s[a][i] = _mm512_dpbusd_epi32(s[a][i], wv, x[a]);
                }
            }
            const float *sc = b->sc + (c * hs + h) * 16 + nw;
#pragma GCC unroll 2
            for (int a = 0; a < ma; a++)
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const __m512 mul = _mm512_mul_ps(_mm512_set1_ps(sc[i]), d[a]);
                    f[a][i] = _mm512_add_ps(f[a][i],
                                            _mm512_mul_ps(mul, _mm512_cvtepi32_ps(s[a][i])));
                }
        }
    }
}

/* Rows m0..m1 (m0 % 16 == 0, at most DSQ__MM_PANEL_M) x weight rows n0..n0+15 of a
 * weight dsq__mm_avx512_panel took, on the panel path; a last single
 * tile (n1 - n0 == 8) takes the row kernels. */
void dsq__mm_panel_avx512(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0, int64_t m1,
                          const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    if (n1 - n0 != 16) {
        panel_fallback(y, ldy, xq, m0, m1, w, n0, n1);
        return;
    }
    /* A last block of at most 8 real rows costs the row kernels (one call,
     * same bits) less than 16 lanes do: a speculative verification of 17
     * rows would otherwise pay for 32. */
    const int64_t tail = (m1 - m0) % 16;
    if (tail && tail <= 8) {
        if (m1 - tail > m0)
            dsq__mm_panel_avx512(y, ldy, xq, m0, m1 - tail, w, n0, n1);
        panel_fallback(y, ldy, xq, m1 - tail, m1, w, n0, n1);
        return;
    }
    const int64_t nb = xq->nb, groups = xq->n_groups, t = n0 / 8;
    const int nab = (int)((m1 - m0 + 15) / 16);
    const int64_t b0 = m0 / 16, xs = nb * 512, ds = nb * 16, gss = groups * 16;
    panel_blk_t blk;
    __m512 fa[DSQ__MM_PANEL_M / 16][16], ca[DSQ__MM_PANEL_M / 16][16];
    for (int a = 0; a < nab; a++)
        for (int i = 0; i < 16; i++) {
            fa[a][i] = _mm512_setzero_ps();
            ca[a][i] = _mm512_setzero_ps();
        }
    for (int64_t k0 = 0; k0 < nb; k0 += PANEL_KB) {
        const int nch = (int)(nb - k0 < PANEL_KB ? nb - k0 : PANEL_KB);
        if (w->format == DSQ_WFMT_INT6_X8)
            prep6(w, xq, t, k0, nch, &blk);
        else if (w->format == DSQ_WFMT_INT2_X8 || w->format == DSQ_WFMT_INT3_X8)
            prep23(w, xq, t, k0, nch, &blk);
        else
            prep45(w, xq, t, k0, nch, &blk);
        for (int a = 0; a < nab; a += 2) {
            const int ma = nab - a < 2 ? nab - a : 2;
            const int8_t *xa = xq->qt + (b0 + a) * xs + k0 * 512;
            const float *da = xq->dt + (b0 + a) * ds + k0 * 16;
            const float *ga = xq->gst + (b0 + a) * gss;
            for (int nw = 0; nw < 16; nw += 4) {
                __m512 f[2][4];
                for (int i = 0; i < ma; i++)
                    for (int q = 0; q < 4; q++)
                        f[i][q] = fa[a + i][nw + q];
                if (ma == 2 && blk.hs == 1)
                    panel_dots(2, 1, xa, xs, da, ds, &blk, nw, nch, f);
                else if (ma == 2)
                    panel_dots(2, 2, xa, xs, da, ds, &blk, nw, nch, f);
                else if (blk.hs == 1)
                    panel_dots(1, 1, xa, xs, da, ds, &blk, nw, nch, f);
                else
                    panel_dots(1, 2, xa, xs, da, ds, &blk, nw, nch, f);
                for (int i = 0; i < ma; i++) {
                    __m512 cr[4];
                    for (int q = 0; q < 4; q++) {
                        fa[a + i][nw + q] = f[i][q];
                        cr[q] = ca[a + i][nw + q];
                    }
                    for (int64_t g = blk.g0; g < blk.g1; g++) {
                        const __m512 gs = _mm512_load_ps(ga + i * gss + g * 16);
                        const float *cg = blk.cg + (g - blk.g0) * 16 + nw;
                        for (int q = 0; q < 4; q++)
                            cr[q] = _mm512_add_ps(cr[q], _mm512_mul_ps(_mm512_set1_ps(cg[q]), gs));
                    }
                    for (int q = 0; q < 4; q++)
                        ca[a + i][nw + q] = cr[q];
                }
            }
        }
    }
    for (int a = 0; a < nab; a++) {
        _Alignas(64) float out[16][16];
        for (int i = 0; i < 16; i++)
            _mm512_store_ps(out[i], _mm512_add_ps(fa[a][i], ca[a][i]));
        for (int64_t l = 0; l < 16 && m0 + 16 * a + l < m1; l++)
            for (int i = 0; i < 16; i++)
                y[(m0 + 16 * a + l) * ldy + n0 + i] = out[i][l];
    }
}

void dsq__mm_avx512(dsq__mm_tile_fn tab[DSQ__MM_SLOTS])
{
    mm_avx512_base(tab);
    tab[DSQ_WFMT_INT4] = tile_int4_512;
    tab[DSQ_WFMT_Q8_0] = tile_q8_0_512;
    tab[DSQ_WFMT_INT4_X8] = tile_int4x8_512;
    tab[DSQ_WFMT_INT5_X8] = tile_int4x8_512;
    tab[DSQ_WFMT_INT6_X8] = tile_int6x8_512;
    tab[DSQ_WFMT_Q8_0_X8] = tile_q8_0x8_512;
    tab[DSQ_WFMT_INT2_X8] = tile_int2x8_512;
    tab[DSQ_WFMT_INT3_X8] = tile_int3x8_512;
}

int dsq__mm_avx512_rows(const dsq_weight_t *w)
{
    /* a codebook weight takes the 256-bit kernel (tile_int4x8_512) */
    return (w->format == DSQ_WFMT_INT4_X8 || w->format == DSQ_WFMT_INT5_X8) &&
                   w->zp_mode != DSQ_ZP_LUT
               ? 8
               : DSQ__MM_MR;
}

bool dsq__mm_avx512_panel(const dsq_weight_t *w, int64_t m)
{
    if (m < 16 || w->act != DSQ_ACT_INT8)
        return false;
    switch (w->format) {
    case DSQ_WFMT_INT4_X8:
    case DSQ_WFMT_INT5_X8:
        return w->zp_mode != DSQ_ZP_LUT && w->group_size >= 32 &&
               PANEL_KB % (w->group_size / 32) == 0;
    case DSQ_WFMT_INT6_X8:
    case DSQ_WFMT_INT2_X8:
    case DSQ_WFMT_INT3_X8:
        return true;
    default:
        return false;
    }
}

#else
void dsq__mm_avx512(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]) { (void)tab; }
bool dsq__mm_avx512_panel(const dsq_weight_t *w, int64_t m)
{
    (void)w;
    (void)m;
    return false;
}
void dsq__mm_panel_avx512(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0, int64_t m1,
                          const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    (void)y, (void)ldy, (void)xq, (void)m0, (void)m1, (void)w, (void)n0, (void)n1;
}
int dsq__mm_avx512_rows(const dsq_weight_t *w)
{
    (void)w;
    return DSQ__MM_MR;
}
#endif

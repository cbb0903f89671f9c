/* The fp32-activation ("precise") path of dsq_cpu_matmul for quantised
 * weights (INT4, Q8_0, INT8): the weights are dequantised to fp32 in
 * registers with the format's own formula (kernels.h: INT4 w = q*s + c per
 * group, c = -8s / -z*s / m by zp_mode; Q8_0 w = q*d; INT8 w = q*s_row) and
 * multiplied with the unquantised fp32 activations by FMA, so y = W·x up to
 * fp32 rounding: no int8 activation rounding anywhere. It costs more than
 * the int8 path (one convert + two FMAs per 8 weights instead of one
 * integer dot per 32), which is why it is an option (dsq_act_dtype_t).
 *
 * Same tiling as matmul.c (matmul_tiles.c: tiles of 64 activation rows
 * x 16 weight rows split statically over the thread pool, so results do not
 * depend on the thread count; 4 activation rows per pass so each
 * dequantised weight vector is reused from registers). Scalar kernels are
 * the definition; the AVX2+FMA+F16C, AVX-512 and AArch64 NEON kernels do
 * the same fp32 operations with the sums reordered across lanes, and are
 * tested against them (tests/unit/test_matmul_f32act.c; NEON under qemu by
 * scripts/test-arm64). Each SIMD block is compiled only for its
 * architecture, so x86 builds never see the NEON code and vice versa.
 */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define FA_X86 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#define FA_NEON 1
#endif

#include "engine/common/error.h"

#define MR DSQ__MM_MR

/* Activations of one call: rows of ldx floats; for INT4 and Q8_0 ldx is a
 * multiple of 32 and the padding past k is zero, so kernels read whole
 * 32-weight chunks (padded weights are q = 0 and meet x = 0). */
typedef struct fa {
    const float *x;
    int64_t ldx;
} fa_t;

typedef void (*fa_tile_fn)(float *y, int64_t ldy, const fa_t *a, int64_t m0, int64_t m1,
                           const dsq_weight_t *w, int64_t n0, int64_t n1);

/* Additive constant of INT4 group g of a row: w = q*s + c. */
static inline float int4_c(const dsq_weight_t *w, const uint16_t *zr, int64_t g, float s)
{
    return w->zp_mode == DSQ_ZP_SYM ? -8.0f * s
         : w->zp_mode == DSQ_ZP_INT ? -dsq__h2f(zr[g]) * s
         : dsq__h2f(zr[g]);
}

/* ------------------------------------------------------------ scalar tiles */

static void tile_int4(float *y, int64_t ldy, const fa_t *a, int64_t m0, int64_t m1,
                      const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = (w->k + 31) / 32, groups = (w->k + w->group_size - 1) / w->group_size;
    const int cpg = w->group_size / 32;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)w->data + n * nb * 16;
        const uint16_t *sc = w->scales + n * groups;
        const uint16_t *zr = w->zeros ? w->zeros + n * groups : NULL;
        for (int64_t r = m0; r < m1; r++) {
            const float *xr = a->x + r * a->ldx;
            float acc = 0.0f;
            for (int64_t c = 0; c < nb; c++) {
                const int64_t g = c / cpg;
                const float s = dsq__h2f(sc[g]), cg = int4_c(w, zr, g, s);
                const uint8_t *wc = wr + c * 16;
                for (int j = 0; j < 16; j++) {
                    acc += ((float)(wc[j] & 15) * s + cg) * xr[c * 32 + j];
                    acc += ((float)(wc[j] >> 4) * s + cg) * xr[c * 32 + j + 16];
                }
            }
            y[r * ldy + n] = acc;
        }
    }
}

static void tile_q8_0(float *y, int64_t ldy, const fa_t *a, int64_t m0, int64_t m1,
                      const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = w->k / 32;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)w->data + n * nb * DSQ__Q8_0_BLOCK;
        for (int64_t r = m0; r < m1; r++) {
            const float *xr = a->x + r * a->ldx;
            float acc = 0.0f;
            for (int64_t c = 0; c < nb; c++) {
                const uint8_t *b = wr + c * DSQ__Q8_0_BLOCK;
                const float d = dsq__h2f((uint16_t)(b[0] | (b[1] << 8)));
                const int8_t *q = (const int8_t *)(b + 2);
                for (int j = 0; j < 32; j++)
                    acc += ((float)q[j] * d) * xr[c * 32 + j];
            }
            y[r * ldy + n] = acc;
        }
    }
}

static void tile_int8(float *y, int64_t ldy, const fa_t *a, int64_t m0, int64_t m1,
                      const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t k = w->k;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *wr = (const int8_t *)w->data + n * k;
        const float s = dsq__h2f(w->scales[n]);
        for (int64_t r = m0; r < m1; r++) {
            const float *xr = a->x + r * a->ldx;
            float acc = 0.0f;
            for (int64_t j = 0; j < k; j++)
                acc += (float)wr[j] * xr[j];
            y[r * ldy + n] = s * acc;
        }
    }
}

/* ------------------------------------------------------------- AVX2 tiles */
#define INL static inline __attribute__((always_inline))

/* Fix mr at compile time so the accumulators stay in registers. TGT: the
 * target attribute of the SIMD variant (empty for NEON, which is baseline
 * AArch64). */
#define FA_TILE(name, ROWS, TGT)                                               \
    static TGT void name(float *y, int64_t ldy, const fa_t *a, int64_t m0,     \
                         int64_t m1, const dsq_weight_t *w, int64_t n0,        \
                         int64_t n1)                                           \
    {                                                                          \
        for (int64_t n = n0; n < n1; n++) {                                    \
            switch (m1 - m0) {                                                 \
            case 4: ROWS(y, ldy, a, m0, 4, w, n); break;                       \
            case 3: ROWS(y, ldy, a, m0, 3, w, n); break;                       \
            case 2: ROWS(y, ldy, a, m0, 2, w, n); break;                       \
            default:                                                           \
                for (int64_t r = m0; r < m1; r++)                              \
                    ROWS(y, ldy, a, r, 1, w, n);                               \
                break;                                                         \
            }                                                                  \
        }                                                                      \
    }

#ifdef FA_X86
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))

INL T_AVX2 float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Scale s and constant c (w = q*s + c) of chunks c0..c0+cn-1 (cn <= 16) of
 * one INT4 row into sa/ca, with F16C conversions (8 chunks per instruction
 * for group size 32), so the kernels' inner loops only broadcast them. */
INL T_AVX2 void int4_consts(const dsq_weight_t *w, const uint16_t *sc, const uint16_t *zr,
                            int shift, int64_t c0, int cn, float *sa, float *ca)
{
    int i = 0;
    if (shift == 0) {
        for (; i + 8 <= cn; i += 8) {
            __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + c0 + i)));
            __m256 cv;
            if (w->zp_mode == DSQ_ZP_SYM)
                cv = _mm256_mul_ps(_mm256_set1_ps(-8.0f), sv);
            else if (w->zp_mode == DSQ_ZP_INT)
                cv = _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(
                         _mm_loadu_si128((const __m128i *)(zr + c0 + i)))), sv);
            else
                cv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(zr + c0 + i)));
            _mm256_storeu_ps(sa + i, sv);
            _mm256_storeu_ps(ca + i, cv);
        }
    }
    for (; i < cn; i++) {
        const int64_t g = (c0 + i) >> shift;
        const float sg = _cvtsh_ss(sc[g]);
        sa[i] = sg;
        ca[i] = w->zp_mode == DSQ_ZP_SYM ? -8.0f * sg
              : w->zp_mode == DSQ_ZP_INT ? -_cvtsh_ss(zr[g]) * sg : _cvtsh_ss(zr[g]);
    }
}

/* One INT4 weight row n against mr activation rows from m0. Per 32-weight
 * chunk: 4 vectors of 8 dequantised weights (fma(q, s, c)), each FMA'd into
 * one of the row's accumulators (independent chains hide FMA latency). */
INL T_AVX2 void int4_rows_avx2(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                               const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t nb = (w->k + 31) / 32, groups = (w->k + w->group_size - 1) / w->group_size;
    const int shift = __builtin_ctz((unsigned)(w->group_size / 32));
    const uint8_t *wr = (const uint8_t *)w->data + n * nb * 16;
    const uint16_t *sc = w->scales + n * groups;
    const uint16_t *zr = w->zeros ? w->zeros + n * groups : NULL;
    const float *xr = a->x + m0 * a->ldx;
    const int64_t ldx = a->ldx;
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    /* FMA chains per row: 4 when mr <= 2 (decode), else 2 (16 ymm registers) */
    const int nch = mr <= 2 ? 4 : 2;
    __m256 acc[MR][4];
    for (int r = 0; r < mr; r++)
        for (int i = 0; i < nch; i++)
            acc[r][i] = _mm256_setzero_ps();
    float sa[16], ca[16];
    for (int64_t c = 0; c < nb; c++) {
        if ((c & 15) == 0)
            int4_consts(w, sc, zr, shift, c, nb - c < 16 ? (int)(nb - c) : 16, sa, ca);
        const __m256 sv = _mm256_set1_ps(sa[c & 15]), cv = _mm256_set1_ps(ca[c & 15]);
        const __m128i raw = _mm_loadu_si128((const __m128i *)(wr + c * 16));
        const __m128i lo = _mm_and_si128(raw, lo4);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), lo4);
        __m256 wv[4];
        wv[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
        wv[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
        wv[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
        wv[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
        for (int i = 0; i < 4; i++)
            wv[i] = _mm256_fmadd_ps(wv[i], sv, cv);
        for (int r = 0; r < mr; r++) {
            const float *xc = xr + r * ldx + c * 32;
            for (int i = 0; i < 4; i++)
                acc[r][i % nch] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(xc + 8 * i),
                                                  acc[r][i % nch]);
        }
    }
    for (int r = 0; r < mr; r++) {
        __m256 t = _mm256_add_ps(acc[r][0], acc[r][1]);
        if (nch == 4)
            t = _mm256_add_ps(t, _mm256_add_ps(acc[r][2], acc[r][3]));
        y[(m0 + r) * ldy + n] = hsum8(t);
    }
}

INL T_AVX2 void q8_0_rows_avx2(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                               const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t nb = w->k / 32, ldx = a->ldx;
    const uint8_t *wr = (const uint8_t *)w->data + n * nb * DSQ__Q8_0_BLOCK;
    const float *xr = a->x + m0 * ldx;
    __m256 acc0[MR], acc1[MR];
    for (int r = 0; r < mr; r++) {
        acc0[r] = _mm256_setzero_ps();
        acc1[r] = _mm256_setzero_ps();
    }
    for (int64_t c = 0; c < nb; c++) {
        const uint8_t *b = wr + c * DSQ__Q8_0_BLOCK;
        const __m256 dv = _mm256_set1_ps(_cvtsh_ss((uint16_t)(b[0] | (b[1] << 8))));
        __m256 wv[4];
        for (int i = 0; i < 4; i++) {
            __m128i q8 = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * i));
            wv[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), dv);
        }
        for (int r = 0; r < mr; r++) {
            const float *xc = xr + r * ldx + c * 32;
            acc0[r] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xc), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xc + 8), acc1[r]);
            acc0[r] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xc + 16), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xc + 24), acc1[r]);
        }
    }
    for (int r = 0; r < mr; r++)
        y[(m0 + r) * ldy + n] = hsum8(_mm256_add_ps(acc0[r], acc1[r]));
}

INL T_AVX2 void int8_rows_avx2(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                               const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t k = w->k, ldx = a->ldx;
    const int8_t *wr = (const int8_t *)w->data + n * k;
    const float *xr = a->x + m0 * ldx;
    __m256 acc[MR];
    float tail[MR];
    for (int r = 0; r < mr; r++) {
        acc[r] = _mm256_setzero_ps();
        tail[r] = 0.0f;
    }
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256 wv = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(wr + j))));
        for (int r = 0; r < mr; r++)
            acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr + r * ldx + j), acc[r]);
    }
    for (; j < k; j++)
        for (int r = 0; r < mr; r++)
            tail[r] += (float)wr[j] * xr[r * ldx + j];
    const float s = _cvtsh_ss(w->scales[n]);
    for (int r = 0; r < mr; r++)
        y[(m0 + r) * ldy + n] = s * (hsum8(acc[r]) + tail[r]);
}

FA_TILE(tile_int4_avx2, int4_rows_avx2, T_AVX2)
FA_TILE(tile_q8_0_avx2, q8_0_rows_avx2, T_AVX2)
FA_TILE(tile_int8_avx2, int8_rows_avx2, T_AVX2)

/* ---------------------------------------------------------- AVX-512 tiles */
#define T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

/* INT4 on 16-float vectors: chunk c's low nibbles are weights 0..15 and its
 * high nibbles 16..31, so each 16-byte load widens to exactly two vectors
 * in the activations' order. */
INL T_AVX512 void int4_rows_avx512(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                                   const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t nb = (w->k + 31) / 32, groups = (w->k + w->group_size - 1) / w->group_size;
    const int shift = __builtin_ctz((unsigned)(w->group_size / 32));
    const uint8_t *wr = (const uint8_t *)w->data + n * nb * 16;
    const uint16_t *sc = w->scales + n * groups;
    const uint16_t *zr = w->zeros ? w->zeros + n * groups : NULL;
    const float *xr = a->x + m0 * a->ldx;
    const int64_t ldx = a->ldx;
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    /* two chunks per iteration into four accumulators per row, so decode
     * (mr = 1) has four independent FMA chains */
    __m512 acc[MR][4];
    for (int r = 0; r < mr; r++)
        for (int i = 0; i < 4; i++)
            acc[r][i] = _mm512_setzero_ps();
    float sa[16], ca[16];
    for (int64_t c = 0; c < nb; c += 2) {
        if ((c & 15) == 0)
            int4_consts(w, sc, zr, shift, c, nb - c < 16 ? (int)(nb - c) : 16, sa, ca);
        const int two = c + 1 < nb ? 2 : 1;
        for (int h = 0; h < two; h++) {
            const int64_t cc = c + h;
            const __m512 sv = _mm512_set1_ps(sa[cc & 15]), cv = _mm512_set1_ps(ca[cc & 15]);
            const __m128i raw = _mm_loadu_si128((const __m128i *)(wr + cc * 16));
            const __m512 w0 = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, lo4))), sv, cv);
            const __m512 w1 = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                    _mm_and_si128(_mm_srli_epi16(raw, 4), lo4))), sv, cv);
            for (int r = 0; r < mr; r++) {
                const float *xc = xr + r * ldx + cc * 32;
                acc[r][2 * h] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xc), acc[r][2 * h]);
                acc[r][2 * h + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xc + 16),
                                                    acc[r][2 * h + 1]);
            }
        }
    }
    for (int r = 0; r < mr; r++)
        y[(m0 + r) * ldy + n] = _mm512_reduce_add_ps(
            _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][2]),
                          _mm512_add_ps(acc[r][1], acc[r][3])));
}

INL T_AVX512 void q8_0_rows_avx512(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                                   const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t nb = w->k / 32, ldx = a->ldx;
    const uint8_t *wr = (const uint8_t *)w->data + n * nb * DSQ__Q8_0_BLOCK;
    const float *xr = a->x + m0 * ldx;
    __m512 acc0[MR], acc1[MR];
    for (int r = 0; r < mr; r++) {
        acc0[r] = _mm512_setzero_ps();
        acc1[r] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < nb; c++) {
        const uint8_t *b = wr + c * DSQ__Q8_0_BLOCK;
        const __m512 dv = _mm512_set1_ps(_cvtsh_ss((uint16_t)(b[0] | (b[1] << 8))));
        const __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(b + 2)))), dv);
        const __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(b + 18)))), dv);
        for (int r = 0; r < mr; r++) {
            const float *xc = xr + r * ldx + c * 32;
            acc0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xc), acc0[r]);
            acc1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xc + 16), acc1[r]);
        }
    }
    for (int r = 0; r < mr; r++)
        y[(m0 + r) * ldy + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

FA_TILE(tile_int4_avx512, int4_rows_avx512, T_AVX512)
FA_TILE(tile_q8_0_avx512, q8_0_rows_avx512, T_AVX512)
#endif /* FA_X86 */

/* ------------------------------------------------------------- NEON tiles */
#ifdef FA_NEON
/* AArch64 Advanced SIMD (every AArch64 CPU: FMA and fp16 conversion are
 * baseline, so one variant serves with or without SDOT). The same fp32
 * operations as the scalar kernels on 4-float vectors, sums reordered
 * across lanes and accumulators. */

/* 16 unsigned bytes (0..15 here) -> 4 x 4 floats, in order. */
INL void u8x16_f32(uint8x16_t v, float32x4_t f[4])
{
    const uint16x8_t l = vmovl_u8(vget_low_u8(v)), h = vmovl_high_u8(v);
    f[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(l)));
    f[1] = vcvtq_f32_u32(vmovl_high_u16(l));
    f[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(h)));
    f[3] = vcvtq_f32_u32(vmovl_high_u16(h));
}

/* 16 signed bytes -> 4 x 4 floats, in order. */
INL void s8x16_f32(int8x16_t v, float32x4_t f[4])
{
    const int16x8_t l = vmovl_s8(vget_low_s8(v)), h = vmovl_high_s8(v);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(l)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(l));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(h));
}

/* One INT4 weight row n against mr activation rows from m0. Per 32-weight
 * chunk: the low nibbles are weights 0..15, the high nibbles 16..31; 8
 * vectors of 4 dequantised weights (fma(c, q, s)), each FMA'd into one of
 * the row's accumulators: 4 chains per row when mr <= 2 (decode), else 2
 * (32 vector registers: 8 weights + 8 accumulators + loads). s and c are
 * converted once per group. */
INL void int4_rows_neon(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                        const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t nb = (w->k + 31) / 32, groups = (w->k + w->group_size - 1) / w->group_size;
    const int64_t cpg = w->group_size / 32;
    const uint8_t *wr = (const uint8_t *)w->data + n * nb * 16;
    const uint16_t *sc = w->scales + n * groups;
    const uint16_t *zr = w->zeros ? w->zeros + n * groups : NULL;
    const float *xr = a->x + m0 * a->ldx;
    const int64_t ldx = a->ldx;
    const uint8x16_t lo4 = vdupq_n_u8(0x0F);
    const int nch = mr <= 2 ? 4 : 2;
    float32x4_t acc[MR][4];
    for (int r = 0; r < mr; r++)
        for (int i = 0; i < 4; i++)
            acc[r][i] = vdupq_n_f32(0.0f);
    float s = 0.0f, cg = 0.0f;
    for (int64_t c = 0; c < nb; c++) {
        if (c % cpg == 0) {
            s = dsq__h2f(sc[c / cpg]);
            cg = int4_c(w, zr, c / cpg, s);
        }
        const float32x4_t cv = vdupq_n_f32(cg);
        const uint8x16_t raw = vld1q_u8(wr + c * 16);
        float32x4_t wv[8];
        u8x16_f32(vandq_u8(raw, lo4), wv);
        u8x16_f32(vshrq_n_u8(raw, 4), wv + 4);
        for (int i = 0; i < 8; i++)
            wv[i] = vfmaq_n_f32(cv, wv[i], s);
        for (int r = 0; r < mr; r++) {
            const float *xc = xr + r * ldx + c * 32;
            for (int i = 0; i < 8; i++)
                acc[r][i % nch] = vfmaq_f32(acc[r][i % nch], wv[i], vld1q_f32(xc + 4 * i));
        }
    }
    for (int r = 0; r < mr; r++) {
        float32x4_t t = vaddq_f32(acc[r][0], acc[r][1]);
        if (nch == 4)
            t = vaddq_f32(t, vaddq_f32(acc[r][2], acc[r][3]));
        y[(m0 + r) * ldy + n] = vaddvq_f32(t);
    }
}

INL void q8_0_rows_neon(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                        const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t nb = w->k / 32, ldx = a->ldx;
    const uint8_t *wr = (const uint8_t *)w->data + n * nb * DSQ__Q8_0_BLOCK;
    const float *xr = a->x + m0 * ldx;
    float32x4_t acc0[MR], acc1[MR];
    for (int r = 0; r < mr; r++) {
        acc0[r] = vdupq_n_f32(0.0f);
        acc1[r] = vdupq_n_f32(0.0f);
    }
    for (int64_t c = 0; c < nb; c++) {
        const uint8_t *b = wr + c * DSQ__Q8_0_BLOCK;
        const float d = dsq__h2f((uint16_t)(b[0] | (b[1] << 8)));
        float32x4_t wv[8];
        s8x16_f32(vld1q_s8((const int8_t *)(b + 2)), wv);
        s8x16_f32(vld1q_s8((const int8_t *)(b + 18)), wv + 4);
        for (int i = 0; i < 8; i++)
            wv[i] = vmulq_n_f32(wv[i], d);
        for (int r = 0; r < mr; r++) {
            const float *xc = xr + r * ldx + c * 32;
            for (int i = 0; i < 8; i += 2) {
                acc0[r] = vfmaq_f32(acc0[r], wv[i], vld1q_f32(xc + 4 * i));
                acc1[r] = vfmaq_f32(acc1[r], wv[i + 1], vld1q_f32(xc + 4 * i + 4));
            }
        }
    }
    for (int r = 0; r < mr; r++)
        y[(m0 + r) * ldy + n] = vaddvq_f32(vaddq_f32(acc0[r], acc1[r]));
}

/* INT8 rows are k bytes, unpadded: 8 weights per step, scalar tail. */
INL void int8_rows_neon(float *y, int64_t ldy, const fa_t *a, int64_t m0,
                        const int mr, const dsq_weight_t *w, int64_t n)
{
    const int64_t k = w->k, ldx = a->ldx;
    const int8_t *wr = (const int8_t *)w->data + n * k;
    const float *xr = a->x + m0 * ldx;
    float32x4_t acc0[MR], acc1[MR];
    float tail[MR];
    for (int r = 0; r < mr; r++) {
        acc0[r] = vdupq_n_f32(0.0f);
        acc1[r] = vdupq_n_f32(0.0f);
        tail[r] = 0.0f;
    }
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        const int16x8_t q = vmovl_s8(vld1_s8(wr + j));
        const float32x4_t w0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)));
        const float32x4_t w1 = vcvtq_f32_s32(vmovl_high_s16(q));
        for (int r = 0; r < mr; r++) {
            acc0[r] = vfmaq_f32(acc0[r], w0, vld1q_f32(xr + r * ldx + j));
            acc1[r] = vfmaq_f32(acc1[r], w1, vld1q_f32(xr + r * ldx + j + 4));
        }
    }
    for (; j < k; j++)
        for (int r = 0; r < mr; r++)
            tail[r] += (float)wr[j] * xr[r * ldx + j];
    const float s = dsq__h2f(w->scales[n]);
    for (int r = 0; r < mr; r++)
        y[(m0 + r) * ldy + n] = s * (vaddvq_f32(vaddq_f32(acc0[r], acc1[r])) + tail[r]);
}

FA_TILE(tile_int4_neon, int4_rows_neon, )
FA_TILE(tile_q8_0_neon, q8_0_rows_neon, )
FA_TILE(tile_int8_neon, int8_rows_neon, )
#endif /* FA_NEON */

/* ----------------------------------------------------------------- driver */

/* Any layout (the k-quant SUPER scales, group 16, the IQ4 codebook,
 * INT8G, the interleaved INT4_X8): each weight row is dequantised by dsq_weight_dequant_row (the
 * format's own formula) into a scratch row, then dotted with the fp32
 * activations. Not yet vectorised (docs/benchmarks.md). */
static void tile_generic(float *y, int64_t ldy, const fa_t *a, int64_t m0, int64_t m1,
                         const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t k = w->k;
    float stack[4096], *row = k <= 4096 ? stack : malloc((size_t)k * sizeof(*row));
    if (!row) {
        /* out of memory in a tile cannot be reported: poison the outputs */
        for (int64_t r = m0; r < m1; r++)
            for (int64_t n = n0; n < n1; n++)
                y[r * ldy + n] = NAN;
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        dsq_weight_dequant_row(w, n, row);
        for (int64_t r = m0; r < m1; r++) {
            const float *xr = a->x + r * a->ldx;
            float acc = 0.0f;
            for (int64_t j = 0; j < k; j++)
                acc += row[j] * xr[j];
            y[r * ldy + n] = acc;
        }
    }
    if (row != stack)
        free(row);
}

struct fa_ctx {
    float *y;
    const fa_t *a;
    const dsq_weight_t *w;
    fa_tile_fn fn;
};

static void fa_block(void *p, int64_t r0, int64_t r1, int64_t n0, int64_t n1)
{
    const struct fa_ctx *c = p;
    c->fn(c->y, c->w->n, c->a, r0, r1, c->w, n0, n1);
}

static fa_tile_fn pick(const dsq_weight_t *w)
{
    const dsq_wformat_t f = w->format;
    /* the layouts without an fp32-activation kernel of their own */
    if (f != DSQ_WFMT_Q8_0 && f != DSQ_WFMT_INT8 && !dsq__int4_classic(w))
        return tile_generic;
    dsq__isa_t isa = dsq__cpu_isa_level();
    (void)isa;
#ifdef FA_X86
    if (isa >= DSQ__ISA_AVX512 && f == DSQ_WFMT_INT4)
        return tile_int4_avx512;
    if (isa >= DSQ__ISA_AVX512 && f == DSQ_WFMT_Q8_0)
        return tile_q8_0_avx512;
    if (isa >= DSQ__ISA_AVX2)
        return f == DSQ_WFMT_INT4 ? tile_int4_avx2
             : f == DSQ_WFMT_Q8_0 ? tile_q8_0_avx2 : tile_int8_avx2;
#endif
#ifdef FA_NEON
    if (isa >= DSQ__ISA_NEON)
        return f == DSQ_WFMT_INT4 ? tile_int4_neon
             : f == DSQ_WFMT_Q8_0 ? tile_q8_0_neon : tile_int8_neon;
#endif
    return f == DSQ_WFMT_INT4 ? tile_int4 : f == DSQ_WFMT_Q8_0 ? tile_q8_0 : tile_int8;
}

/* Called by dsq_cpu_matmul (matmul.c) after it validated y, x, m > 0 and w
 * (format INT4, Q8_0 or INT8). */
int dsq__matmul_f32act(float *y, const float *x, int64_t m, const dsq_weight_t *w)
{
    fa_t a = {.x = x, .ldx = w->k};
    float *pad = NULL;
    if (w->format == DSQ_WFMT_INT4 && w->k % 32 != 0) {
        const int64_t kp = (w->k + 31) / 32 * 32;
        pad = calloc((size_t)(m * kp), sizeof(*pad));
        if (!pad)
            return DSQ_ENOMEM;
        for (int64_t r = 0; r < m; r++)
            memcpy(pad + r * kp, x + r * w->k, (size_t)w->k * sizeof(*pad));
        a.x = pad;
        a.ldx = kp;
    }
    struct fa_ctx c = {.y = y, .a = &a, .w = w, .fn = pick(w)};
    /* at least ~64k multiply-adds per thread */
    dsq__mm_run_tiles(y, m, w, 65536, DSQ__MM_MR, 0, fa_block, &c);
    free(pad);
    return DSQ_OK;
}

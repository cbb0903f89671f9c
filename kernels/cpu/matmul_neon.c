/* AArch64 Advanced SIMD (NEON) tile kernels for dsq_cpu_matmul, in two
 * variants picked at run time by kernels/cpu/cpu.c:
 *   - plain NEON (every AArch64 CPU): int8 x int8 products by SMULL/SMLAL
 *     into int16 (two products per lane: |q8_w * q8_x| <= 128 * 127, so a
 *     pair stays under 32767; INT4 nibbles are 0..15), then pairwise
 *     widening adds into int32;
 *   - NEON + dot product (FEAT_DotProd, HWCAP_ASIMDDP, Armv8.2+): SDOT,
 *     four int8 products per int32 lane in one instruction, compiled for
 *     that target by a pragma so the rest of the build stays Armv8.0.
 * Both compute the scalar kernels' integer dot per 32-block exactly (the
 * activation quantisation of matmul.c is shared by every ISA), so they
 * differ from the scalar path only in fp32 summation order; F32, F16 and
 * BF16 are fp32 FMA dot products (fp16 widened with FCVTL, bf16 by a shift).
 * The integer kernels live in matmul_neon.inc, included once per variant. */
#include "cpu_internal.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#define INLINE static inline __attribute__((always_inline))

/* fp16 -> fp32 with the hardware conversion (exact, as dsq__h2f). */
INLINE float h2f1(uint16_t h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

INLINE float32x4_t h2f4(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

/* sum_g c_g * gsum_g, c_g = -8 s (SYM), -z s (INT), m (MIN) */
INLINE float int4_corr(const uint16_t *sc, const uint16_t *zr, dsq_zp_mode_t zp,
                       const float *gsum, int64_t groups)
{
    float32x4_t a = vdupq_n_f32(0.0f);
    int64_t g = 0;
    for (; g + 4 <= groups; g += 4) {
        float32x4_t sv = h2f4(sc + g), cv;
        if (zp == DSQ_ZP_SYM)
            cv = vmulq_n_f32(sv, -8.0f);
        else if (zp == DSQ_ZP_INT)
            cv = vmulq_f32(vnegq_f32(h2f4(zr + g)), sv);
        else
            cv = h2f4(zr + g);
        a = vfmaq_f32(a, cv, vld1q_f32(gsum + g));
    }
    float t = vaddvq_f32(a);
    for (; g < groups; g++) {
        float sg = h2f1(sc[g]);
        float cg = zp == DSQ_ZP_SYM ? -8.0f * sg
                 : zp == DSQ_ZP_INT ? -h2f1(zr[g]) * sg : h2f1(zr[g]);
        t += cg * gsum[g];
    }
    return t;
}

/* Tile wrappers: fix mr at compile time so the accumulators stay in
 * registers. */
#define TILE(name, ROWS)                                                       \
    static void name(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,   \
                     int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)\
    {                                                                          \
        for (int64_t n = n0; n < n1; n++) {                                    \
            switch (m1 - m0) {                                                 \
            case 4: ROWS(y, ldy, xq, m0, 4, w, n); break;                      \
            case 3: ROWS(y, ldy, xq, m0, 3, w, n); break;                      \
            case 2: ROWS(y, ldy, xq, m0, 2, w, n); break;                      \
            default:                                                           \
                for (int64_t r = m0; r < m1; r++)                              \
                    ROWS(y, ldy, xq, r, 1, w, n);                              \
                break;                                                         \
            }                                                                  \
        }                                                                      \
    }

/* ----------------------------------------------------------- float rows */

INLINE void load8_f32(const float *p, float32x4_t *lo, float32x4_t *hi)
{
    *lo = vld1q_f32(p);
    *hi = vld1q_f32(p + 4);
}
INLINE void load8_f16(const uint16_t *p, float32x4_t *lo, float32x4_t *hi)
{
    float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(p));
    *lo = vcvt_f32_f16(vget_low_f16(v));
    *hi = vcvt_high_f32_f16(v);
}
INLINE void load8_bf16(const uint16_t *p, float32x4_t *lo, float32x4_t *hi)
{
    uint16x8_t v = vld1q_u16(p);
    *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
    *hi = vreinterpretq_f32_u32(vshll_high_n_u16(v, 16));
}
INLINE float cvt1_f32(float v) { return v; }
INLINE float cvt1_f16(uint16_t v) { return h2f1(v); }
INLINE float cvt1_bf16(uint16_t v) { return dsq__bf2f(v); }

#define FLOAT_ROWS(name, T, LOAD8, CVT1)                                       \
    INLINE void name(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,   \
                     const int mr, const dsq_weight_t *w, int64_t n)           \
    {                                                                          \
        const int64_t k = w->k;                                                \
        const T *wr = (const T *)w->data + n * k;                              \
        const float *xr = xq->x + m0 * k;                                      \
        float32x4_t acc0[4], acc1[4];                                          \
        float tail[4];                                                         \
        for (int r = 0; r < mr; r++) {                                         \
            acc0[r] = vdupq_n_f32(0.0f);                                       \
            acc1[r] = vdupq_n_f32(0.0f);                                       \
            tail[r] = 0.0f;                                                    \
        }                                                                      \
        int64_t j = 0;                                                         \
        for (; j + 8 <= k; j += 8) {                                           \
            float32x4_t wl, wh;                                                \
            LOAD8(wr + j, &wl, &wh);                                           \
            for (int r = 0; r < mr; r++) {                                     \
                acc0[r] = vfmaq_f32(acc0[r], wl, vld1q_f32(xr + r * k + j));   \
                acc1[r] = vfmaq_f32(acc1[r], wh, vld1q_f32(xr + r * k + j + 4));\
            }                                                                  \
        }                                                                      \
        for (; j < k; j++) {                                                   \
            float wj = CVT1(wr[j]);                                            \
            for (int r = 0; r < mr; r++)                                       \
                tail[r] += wj * xr[r * k + j];                                 \
        }                                                                      \
        for (int r = 0; r < mr; r++)                                           \
            y[(m0 + r) * ldy + n] =                                            \
                vaddvq_f32(vaddq_f32(acc0[r], acc1[r])) + tail[r];             \
    }
FLOAT_ROWS(f32_rows, float, load8_f32, cvt1_f32)
FLOAT_ROWS(f16_rows, uint16_t, load8_f16, cvt1_f16)
FLOAT_ROWS(bf16_rows, uint16_t, load8_bf16, cvt1_bf16)
TILE(tile_f32, f32_rows)
TILE(tile_f16, f16_rows)
TILE(tile_bf16, bf16_rows)

/* ------------------------------------------- integer rows, plain NEON */

INLINE int32x4_t dot2_neon(int8x16_t a0, int8x16_t b0, int8x16_t a1, int8x16_t b1)
{
    int16x8_t p0 = vmull_s8(vget_low_s8(a0), vget_low_s8(b0));
    p0 = vmlal_high_s8(p0, a0, b0);
    int16x8_t p1 = vmull_s8(vget_low_s8(a1), vget_low_s8(b1));
    p1 = vmlal_high_s8(p1, a1, b1);
    return vpadalq_s16(vpaddlq_s16(p0), p1);
}

#define DOT2 dot2_neon
#define SFX(name) name##_neon
#include "matmul_neon.inc"
#undef DOT2
#undef SFX

/* ------------------------------------- integer rows, NEON + dotprod */

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")

INLINE int32x4_t dot2_dp(int8x16_t a0, int8x16_t b0, int8x16_t a1, int8x16_t b1)
{
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), a0, b0), a1, b1);
}

#define DOT2 dot2_dp
#define SFX(name) name##_dp
#include "matmul_neon.inc"
#undef DOT2
#undef SFX

#pragma GCC pop_options

void dsq__mm_neon(dsq__mm_tile_fn tab[DSQ__MM_SLOTS])
{
    tab[DSQ_WFMT_F32] = tile_f32;
    tab[DSQ_WFMT_F16] = tile_f16;
    tab[DSQ_WFMT_BF16] = tile_bf16;
    tab[DSQ_WFMT_Q8_0] = tile_q8_0_neon;
    tab[DSQ_WFMT_INT4] = tile_int4_neon;
    tab[DSQ_WFMT_INT8] = tile_int8_neon;
    tab[DSQ_WFMT_INT8G] = tile_gen_neon;
    tab[DSQ__MM_INT4_GEN] = tile_gen_neon;
}

void dsq__mm_neon_dot(dsq__mm_tile_fn tab[DSQ__MM_SLOTS])
{
    tab[DSQ_WFMT_Q8_0] = tile_q8_0_dp;
    tab[DSQ_WFMT_INT4] = tile_int4_dp;
    tab[DSQ_WFMT_INT8] = tile_int8_dp;
    tab[DSQ_WFMT_INT8G] = tile_gen_dp;
    tab[DSQ__MM_INT4_GEN] = tile_gen_dp;
}

#else
void dsq__mm_neon(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]) { (void)tab; }
void dsq__mm_neon_dot(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]) { (void)tab; }
#endif

/* dsq_cpu_matmul: y[m][n] = x[m][k] · W^T (+ bias) for every dsq_wformat_t,
 * plus the scalar tile kernels that every SIMD path is tested against.
 *
 * Quantised weights (INT4, Q8_0, INT8) use the integer scheme of llama.cpp's
 * Q4_1 x Q8_1 dot product: each activation row is quantised once per call to
 * int8 per 32-block (d = amax/127, s = d*sum(q)); a 32-weight chunk then
 * costs one integer dot product, and per INT4 group
 *     acc += scale * sum_c d_c * dot_c  +  c * sum_c s_c
 * with c = m (ZP_MIN), -z*scale (ZP_INT), -8*scale (ZP_SYM). The result is
 * exactly W·x̂ (x̂ = the dequantised activations) up to fp32 rounding, so the
 * only approximation is |x - x̂| <= d/2 per element.
 *
 * Work split: matmul_tiles.c (tiles of 64 activation rows x 16 weight
 * rows over the thread pool; a matmul under ~128k multiply-adds runs
 * inline). Inside a tile the kernel walks 4 activation rows at a time
 * (8 for the AVX-512 interleaved kernels) against its weight rows, so each
 * unpacked weight chunk is reused from registers. Prefill against the
 * interleaved formats on AVX-512 takes the panel path instead
 * (matmul_avx512.c): tiles of 256 rows, activations copied with 16 rows
 * in the vector lanes (transpose_xq).
 */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define MM_X86 1
#endif

#include "engine/common/error.h"


/* ------------------------------------------------------------ scalar tiles */

/* Every INT4 layout (kernels.h; INT4_X8 too, byte by byte through
 * dsq__int4_byte; and INT5_X8, q through dsq__int5_q): per group, s and c from dsq__group_sc,
 * acc += s * sum_chunks d_c * dot(v(q), x^) and c * gsum. Group 16 is half
 * a 32-chunk (low nibbles, then high nibbles). */
static void tile_int4(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                      int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, gs = w->group_size;
    const int64_t groups = (w->k + gs - 1) / gs;
    const bool lut = w->zp_mode == DSQ_ZP_LUT;
    int8_t v[16];
    for (int q = 0; q < 16; q++)
        v[q] = lut ? dsq_iq4nl_values[q] : (int8_t)q;
    const bool x8 = w->format == DSQ_WFMT_INT4_X8;
    const bool five = w->format == DSQ_WFMT_INT5_X8;
    uint8_t chunk[16];
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)w->data + n * nb * 16;
        for (int64_t r = m0; r < m1; r++) {
            const int8_t *xr = xq->q + r * kp;
            const float *d = xq->d + r * nb;
            const float *gsum = xq->gsum + r * groups;
            float acc = 0.0f, corr = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                float sg, cg;
                dsq__group_sc(w, n, g, groups, &sg, &cg);
                if (gs == 16) {
                    const int64_t c = g / 2, hi = g % 2;
                    const uint8_t *wc = wr + c * 16;
                    const int8_t *xc = xr + c * 32 + hi * 16;
                    int32_t dot = 0;
                    for (int j = 0; j < 16; j++)
                        dot += v[hi ? wc[j] >> 4 : wc[j] & 15] * xc[j];
                    acc += (sg * d[c]) * (float)dot;
                } else {
                    const int64_t c0 = g * (gs / 32);
                    const int64_t c1 = c0 + gs / 32 < nb ? c0 + gs / 32 : nb;
                    for (int64_t c = c0; c < c1; c++) {
                        const uint8_t *wc = wr + c * 16;
                        if (five) {                  /* q of 5 bits, no codebook */
                            int32_t dot = 0;
                            for (int j = 0; j < 32; j++)
                                dot += (int32_t)dsq__int5_q(w, nb, n, c, j) * xr[c * 32 + j];
                            acc += (sg * d[c]) * (float)dot;
                            continue;
                        }
                        if (x8) {
                            for (int j = 0; j < 16; j++)
                                chunk[j] = dsq__int4_byte(w, nb, n, c, j);
                            wc = chunk;
                        }
                        const int8_t *xc = xr + c * 32;
                        int32_t dot = 0;
                        for (int j = 0; j < 16; j++)
                            dot += v[wc[j] & 15] * xc[j] + v[wc[j] >> 4] * xc[j + 16];
                        acc += (sg * d[c]) * (float)dot;
                    }
                }
                corr += cg * gsum[g];
            }
            y[r * ldy + n] = acc + corr;
        }
    }
}

/* The group-16 X8 formats (kernels.h): INT6_X8 (q in 0..63, c = -32 s),
 * INT3_X8 (0..7, c = -4 s) and INT2_X8 (0..3, c = dm * b), a 32-chunk's
 * two halves two groups. Per chunk: acc += (s0 * d) * dot0, acc +=
 * (s1 * d) * dot1, corr += c0 * gsum0, corr += c1 * gsum1; y = acc +
 * corr. The SIMD kernels do these fp32 operations in this order. */
static void tile_int6x8(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                        int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, groups = w->k / 16;
    const bool six = w->format == DSQ_WFMT_INT6_X8;
    uint8_t q[32];
    for (int64_t n = n0; n < n1; n++)
        for (int64_t r = m0; r < m1; r++) {
            const int8_t *xr = xq->q + r * kp;
            const float *gsum = xq->gsum + r * groups;
            float acc = 0.0f, corr = 0.0f;
            for (int64_t c = 0; c < nb; c++) {
                for (int j = 0; j < 32; j++)
                    q[j] = (uint8_t)(six ? dsq__int6_q(w, nb, n, c, j)
                                         : dsq__int23_q(w, nb, n, c, j));
                int32_t dot[2] = {0, 0};
                for (int j = 0; j < 32; j++)
                    dot[j / 16] += q[j] * xr[c * 32 + j];
                float s[2], cg[2];
                for (int h = 0; h < 2; h++)
                    dsq__group_sc(w, n, 2 * c + h, groups, &s[h], &cg[h]);
                const float d = xq->d[r * nb + c];
                acc += (s[0] * d) * (float)dot[0];
                acc += (s[1] * d) * (float)dot[1];
                corr += cg[0] * gsum[2 * c];
                corr += cg[1] * gsum[2 * c + 1];
            }
            y[r * ldy + n] = acc + corr;
        }
}

/* INT8G (kernels.h): int8 q per weight, groups of 16 or 32. */
static void tile_int8g(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                       int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, gs = w->group_size;
    const int64_t groups = (w->k + gs - 1) / gs;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *wr = (const int8_t *)w->data + n * kp;
        for (int64_t r = m0; r < m1; r++) {
            const int8_t *xr = xq->q + r * kp;
            const float *d = xq->d + r * nb;
            const float *gsum = xq->gsum + r * groups;
            float acc = 0.0f, corr = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                float sg, cg;
                dsq__group_sc(w, n, g, groups, &sg, &cg);
                const int8_t *wg = wr + g * gs, *xg = xr + g * gs;
                int32_t dot = 0;
                for (int64_t j = 0; j < gs; j++)
                    dot += wg[j] * xg[j];
                acc += (sg * d[g * gs / 32]) * (float)dot;
                if (cg != 0.0f)
                    corr += cg * gsum[g];
            }
            y[r * ldy + n] = acc + corr;
        }
    }
}

static void tile_q8_0(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                      int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = xq->nb, kp = xq->k_pad;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)w->data + n * nb * DSQ__Q8_0_BLOCK;
        for (int64_t r = m0; r < m1; r++) {
            const int8_t *xr = xq->q + r * kp;
            const float *d = xq->d + r * nb;
            float acc = 0.0f;
            for (int64_t c = 0; c < nb; c++) {
                const uint8_t *b = wr + c * DSQ__Q8_0_BLOCK;
                uint16_t dh = (uint16_t)(b[0] | (b[1] << 8));
                const int8_t *wq = (const int8_t *)(b + 2);
                int32_t dot = 0;
                for (int j = 0; j < 32; j++)
                    dot += wq[j] * xr[c * 32 + j];
                acc += (dsq__h2f(dh) * d[c]) * (float)dot;
            }
            y[r * ldy + n] = acc;
        }
    }
}

/* Q8_0_X8 (kernels.h): tile_q8_0's operations on the interleaved bytes,
 * so the results are bitwise tile_q8_0's. */
static void tile_q8_0x8(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                        int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = xq->nb, kp = xq->k_pad;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wt = (const uint8_t *)w->data + (n / 8) * nb * 272;
        const int r8 = (int)(n % 8);
        for (int64_t r = m0; r < m1; r++) {
            const int8_t *xr = xq->q + r * kp;
            const float *d = xq->d + r * nb;
            float acc = 0.0f;
            for (int64_t c = 0; c < nb; c++) {
                const uint8_t *b = wt + c * 272;
                uint16_t dh = (uint16_t)(b[2 * r8] | (b[2 * r8 + 1] << 8));
                int32_t dot = 0;
                for (int j = 0; j < 32; j++)
                    dot += (int8_t)b[16 + 32 * (j / 4) + 4 * r8 + j % 4] * xr[c * 32 + j];
                acc += (dsq__h2f(dh) * d[c]) * (float)dot;
            }
            y[r * ldy + n] = acc;
        }
    }
}

static void tile_int8(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                      int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = xq->nb, kp = xq->k_pad, k = w->k;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *wr = (const int8_t *)w->data + n * k;
        float sn = dsq__h2f(w->scales[n]);
        for (int64_t r = m0; r < m1; r++) {
            const int8_t *xr = xq->q + r * kp;
            const float *d = xq->d + r * nb;
            float acc = 0.0f;
            for (int64_t c = 0; c < nb; c++) {
                int64_t j1 = k - c * 32 < 32 ? k - c * 32 : 32;
                int32_t dot = 0;
                for (int64_t j = 0; j < j1; j++)
                    dot += wr[c * 32 + j] * xr[c * 32 + j];
                acc += d[c] * (float)dot;
            }
            y[r * ldy + n] = sn * acc;
        }
    }
}

#define FLOAT_TILE(name, T, CONV)                                              \
    static void name(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,   \
                     int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)\
    {                                                                          \
        const int64_t k = w->k;                                                \
        for (int64_t n = n0; n < n1; n++) {                                    \
            const T *wr = (const T *)w->data + n * k;                          \
            for (int64_t r = m0; r < m1; r++) {                                \
                const float *xr = xq->x + r * k;                               \
                float acc = 0.0f;                                              \
                for (int64_t j = 0; j < k; j++)                                \
                    acc += CONV(wr[j]) * xr[j];                                \
                y[r * ldy + n] = acc;                                          \
            }                                                                  \
        }                                                                      \
    }
#define CONV_F32(v) (v)
FLOAT_TILE(tile_f32, float, CONV_F32)
FLOAT_TILE(tile_f16, uint16_t, dsq__h2f)
FLOAT_TILE(tile_bf16, uint16_t, dsq__bf2f)

void dsq__mm_scalar(dsq__mm_tile_fn tab[DSQ__MM_SLOTS])
{
    tab[DSQ_WFMT_F32] = tile_f32;
    tab[DSQ_WFMT_F16] = tile_f16;
    tab[DSQ_WFMT_BF16] = tile_bf16;
    tab[DSQ_WFMT_Q8_0] = tile_q8_0;
    tab[DSQ_WFMT_INT4] = tile_int4;
    tab[DSQ_WFMT_INT8] = tile_int8;
    tab[DSQ_WFMT_INT8G] = tile_int8g;
    tab[DSQ_WFMT_INT4_X8] = tile_int4;
    tab[DSQ_WFMT_INT6_X8] = tile_int6x8;
    tab[DSQ_WFMT_Q8_0_X8] = tile_q8_0x8;
    tab[DSQ_WFMT_INT5_X8] = tile_int4;
    tab[DSQ_WFMT_INT2_X8] = tile_int6x8;
    tab[DSQ_WFMT_INT3_X8] = tile_int6x8;
    tab[DSQ__MM_INT4_GEN] = tile_int4;
}

dsq__mm_tile_fn dsq__mm_scalar_tile(const dsq_weight_t *w)
{
    dsq__mm_tile_fn tab[DSQ__MM_SLOTS];
    dsq__mm_scalar(tab);
    return tab[w->format];
}

/* ------------------------------------------------- activation quantisation */

/* The definition for all ISA levels (see file comment; the AVX2 version
 * below reproduces it bit for bit): round to nearest even, q in
 * [-127, 127], padding q = 0. Blocks b0.. of row r, then the row's INT4
 * group sums. */
static void quantize_tail(dsq__xq_t *xq, int64_t r, int64_t b0)
{
    const float *x = xq->x + r * xq->k;
    int8_t *q = xq->q + r * xq->k_pad;
    for (int64_t b = b0; b < xq->nb; b++) {
        int64_t j1 = xq->k - b * 32 < 32 ? xq->k - b * 32 : 32;
        float amax = 0.0f;
        for (int64_t j = 0; j < j1; j++) {
            float a = fabsf(x[b * 32 + j]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f;
        float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int64_t j = 0; j < 32; j++) {
            int32_t v = 0;
            if (j < j1) {
                float t = nearbyintf(x[b * 32 + j] * id);
                v = t > 127.0f ? 127 : t < -127.0f ? -127 : (int32_t)t;
            }
            q[b * 32 + j] = (int8_t)v;
            sum += v;
        }
        xq->d[r * xq->nb + b] = d;
        xq->s[r * xq->nb + b] = d * (float)sum;
    }
    if (xq->n_groups > 0 && xq->cpg == 0) {       /* group 16: half blocks */
        for (int64_t g = 0; g < xq->n_groups; g++) {
            int32_t sum = 0;
            for (int64_t j = 0; j < 16; j++)
                sum += q[g * 16 + j];
            xq->gsum[r * xq->n_groups + g] = xq->d[r * xq->nb + g / 2] * (float)sum;
        }
    } else if (xq->n_groups > 0) {
        const int64_t cpg = xq->cpg;
        for (int64_t g = 0; g < xq->n_groups; g++) {
            float gs = 0.0f;
            for (int64_t c = g * cpg; c < (g + 1) * cpg && c < xq->nb; c++)
                gs += xq->s[r * xq->nb + c];
            xq->gsum[r * xq->n_groups + g] = gs;
        }
    }
}

static void quantize_rows(dsq__xq_t *xq, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        quantize_tail(xq, r, 0);
}

#ifdef MM_X86
/* quantize_rows for full 32-blocks with AVX2, bitwise equal to the scalar
 * code: max is exact in any order, d and id are the same scalar divisions,
 * _mm256_round_ps(nearest) is nearbyintf in the default rounding mode, the
 * clamp and the integer sum are exact. Partial blocks and the group sums
 * use the scalar code. */
__attribute__((target("avx2,fma")))
static void quantize_rows_avx2(dsq__xq_t *xq, int64_t r0, int64_t r1)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const int64_t full = xq->k / 32;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = xq->x + r * xq->k;
        int8_t *q = xq->q + r * xq->k_pad;
        for (int64_t b = 0; b < full; b++) {
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(x + b * 32 + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float amax = _mm_cvtss_f32(m4);
            const float d = amax / 127.0f;
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            const __m256 idv = _mm256_set1_ps(id);
            __m256i iv[4];
            for (int i = 0; i < 4; i++) {
                __m256 t = _mm256_round_ps(_mm256_mul_ps(v[i], idv),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
                iv[i] = _mm256_cvtps_epi32(t);
            }
            __m256i sum = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]),
                                           _mm256_add_epi32(iv[2], iv[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum),
                                       _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            /* packs work per 128-bit lane: fix the order with one permute */
            __m256i p16a = _mm256_packs_epi32(iv[0], iv[1]);
            __m256i p16b = _mm256_packs_epi32(iv[2], iv[3]);
            __m256i p8 = _mm256_packs_epi16(p16a, p16b);
            p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(q + b * 32), p8);
            xq->d[r * xq->nb + b] = d;
            xq->s[r * xq->nb + b] = d * (float)_mm_cvtsi128_si32(s4);
        }
    }
}
#endif

/* Quantise rows [r0, r1) (full blocks with SIMD where the CPU has it, the
 * rest and the INT4 group sums with the scalar code). */
static void quantize_any(dsq__xq_t *xq, int64_t r0, int64_t r1)
{
#ifdef MM_X86
    if (dsq__cpu_isa_level() >= DSQ__ISA_AVX2 && xq->k >= 32) {
        quantize_rows_avx2(xq, r0, r1);
        if (xq->k % 32 == 0 && xq->n_groups == 0)
            return;
        /* tail block and group sums: scalar, on a view of the tail */
        for (int64_t r = r0; r < r1; r++)
            quantize_tail(xq, r, xq->k / 32);
        return;
    }
#endif
    quantize_rows(xq, r0, r1);
}

bool dsq_cpu_has_x8(dsq_act_dtype_t act)
{
    const dsq__isa_t isa = dsq__cpu_isa_level();
    /* AVX2, and AVX-512 + VNNI, where the interleaved kernel (vpdpbusd
     * on 256-bit vectors) beats the row layout's 512-bit one by 1.7x in
     * prefill and 1.9x in decode at 6.7B (docs/benchmarks.md, 2026-12-05);
     * NEON has no interleaved kernel yet */
    return act == DSQ_ACT_INT8 && (isa == DSQ__ISA_AVX2 || isa == DSQ__ISA_AVX512);
}

bool dsq_cpu_weight_prefers_x8(const dsq_weight_t *w)
{
    dsq_weight_t x;
    return w && w->zp_mode != DSQ_ZP_LUT && dsq_weight_check(w) == DSQ_OK &&
           dsq_weight_x8_twin(w, &x) == DSQ_OK && dsq_cpu_has_x8(w->act);
}

/* ----------------------------------------------------------------- driver */

static int check_weight(const dsq_weight_t *w)
{
    return dsq_weight_check(w);
}

static void quant_range(void *p, int64_t r0, int64_t r1)
{
    quantize_any(p, r0, r1);
}

struct mm_ctx {
    float *y;
    const dsq__xq_t *xq;
    const dsq_weight_t *w;
    dsq__mm_tile_fn fn;
};

/* Row block b of xq into xq->qt / dt / gst (dsq__xq_t). */
static void transpose_range(void *p, int64_t b0, int64_t b1)
{
    const dsq__xq_t *xq = p;
    const int64_t nb = xq->nb, ng = xq->n_groups;
    for (int64_t b = b0; b < b1; b++) {
        for (int64_t l = 0; l < 16; l++) {
            const int64_t r = 16 * b + l;
            const bool in = r < xq->m;
            const int8_t *q = in ? xq->q + r * xq->k_pad : NULL;
            for (int64_t c = 0; c < nb; c++) {
                for (int j = 0; j < 8; j++) {
                    int8_t *o = xq->qt + ((b * nb + c) * 8 + j) * 64 + 4 * l;
                    if (in)
                        memcpy(o, q + c * 32 + 4 * j, 4);
                    else
                        memset(o, 0, 4);
                }
                xq->dt[(b * nb + c) * 16 + l] = in ? xq->d[r * nb + c] : 0.0f;
            }
            for (int64_t g = 0; g < ng; g++)
                xq->gst[(b * ng + g) * 16 + l] = in ? xq->gsum[r * ng + g] : 0.0f;
        }
    }
}

/* The panel path's copies of xq (one block: the caller frees it), or NULL
 * (out of memory). */
static void *transpose_xq(dsq__xq_t *xq)
{
    const int64_t nblk = (xq->m + 15) / 16;
    const size_t qb = (size_t)(nblk * xq->nb) * 512;
    const size_t db = (size_t)(nblk * xq->nb) * 16 * sizeof(float);
    const size_t gb = (size_t)(nblk * xq->n_groups) * 16 * sizeof(float);
    char *p = aligned_alloc(64, (qb + db + gb + 63) / 64 * 64);
    if (!p)
        return NULL;
    xq->qt = (int8_t *)p;
    xq->dt = (float *)(p + qb);
    xq->gst = (float *)(p + qb + db);
    dsq__parallel_for(nblk, 1, transpose_range, xq);
    return p;
}

static void mm_block(void *p, int64_t r0, int64_t r1, int64_t n0, int64_t n1)
{
    const struct mm_ctx *c = p;
    c->fn(c->y, c->w->n, c->xq, r0, r1, c->w, n0, n1);
}

/* One product made ready to run: activations quantised (and, for the
 * panel path, transposed) and the kernel chosen. c.xq points at xq, or at
 * an earlier job's xq over the same activations (dsq_cpu_matmul_many). */
typedef struct mm_job {
    dsq__xq_t xq;
    struct mm_ctx c;
    void *buf, *tb;         /* owned: quantised and transposed activations */
    int mr, tile_m;
    bool quantised, panel;
    bool f32act;            /* runs on dsq__matmul_f32act instead */
    bool empty;             /* m == 0: nothing to compute */
} mm_job_t;

static void job_release(mm_job_t *j)
{
    free(j->tb);
    free(j->buf);
    j->tb = j->buf = NULL;
}

/* Whether job s's activations serve a product over want (same x, shape,
 * groups and path). */
static bool same_acts(const mm_job_t *s, const dsq__xq_t *want, bool quantised, bool panel)
{
    const dsq__xq_t *h = s->c.xq;
    return !s->empty && !s->f32act && s->quantised == quantised && s->panel == panel &&
           h->x == want->x && h->m == want->m && h->k == want->k &&
           h->n_groups == want->n_groups && h->cpg == want->cpg;
}

/* Checks y = x W^T and makes it ready in j; an earlier job among
 * prev[0..n_prev) whose activations match lends them instead of a second
 * quantisation. Returns 0, DSQ_EINVAL or DSQ_ENOMEM (j then owns nothing). */
static int job_prepare(mm_job_t *j, float *y, const float *x, int64_t m, const dsq_weight_t *w,
                       const mm_job_t *prev, int n_prev)
{
    memset(j, 0, sizeof(*j));
    int rc = check_weight(w);
    if (rc != DSQ_OK || !y || !x || m < 0)
        return rc != DSQ_OK ? rc : DSQ_EINVAL;
    if (w->act != DSQ_ACT_INT8 && w->act != DSQ_ACT_F32)
        return DSQ_EINVAL;
    j->xq = (dsq__xq_t){.x = x, .m = m, .k = w->k};
    j->c = (struct mm_ctx){.y = y, .xq = &j->xq, .w = w};
    if (m == 0) {
        j->empty = true;
        return DSQ_OK;
    }
    const bool int4 = w->format == DSQ_WFMT_INT4 || w->format == DSQ_WFMT_INT4_X8;
    const bool grouped = int4 || w->format == DSQ_WFMT_INT8G || w->format == DSQ_WFMT_INT6_X8 ||
                         w->format == DSQ_WFMT_INT5_X8 || w->format == DSQ_WFMT_INT2_X8 ||
                         w->format == DSQ_WFMT_INT3_X8;
    j->quantised = grouped || w->format == DSQ_WFMT_Q8_0_X8 || w->format == DSQ_WFMT_Q8_0 ||
                   w->format == DSQ_WFMT_INT8;
    if (w->act == DSQ_ACT_F32 && j->quantised) {
        j->f32act = true;
        return DSQ_OK;
    }

    dsq__xq_t *xq = &j->xq;
    xq->k_pad = (w->k + 31) / 32 * 32;
    xq->nb = xq->k_pad / 32;
    if (grouped) {
        xq->n_groups = (w->k + w->group_size - 1) / w->group_size;
        xq->cpg = w->group_size / 32;        /* 0: group 16 */
    }
    dsq__mm_tile_fn tab[DSQ__MM_SLOTS], fast[DSQ__MM_SLOTS] = {0};
    dsq__mm_scalar(tab);
    dsq__isa_t isa = dsq__cpu_isa_level();
    if (isa >= DSQ__ISA_AVX2)
        dsq__mm_avx2(fast);
    if (isa >= DSQ__ISA_AVX512)
        dsq__mm_avx512(fast);
    if (isa >= DSQ__ISA_NEON)          /* AArch64 (the x86 tables are no-ops) */
        dsq__mm_neon(fast);
    if (isa >= DSQ__ISA_NEON_DOTPROD)
        dsq__mm_neon_dot(fast);
    j->panel = isa >= DSQ__ISA_AVX512 && dsq__mm_avx512_panel(w, m);
    if (j->panel) {
        j->c.fn = dsq__mm_panel_avx512;
        j->mr = j->tile_m = DSQ__MM_PANEL_M;
    } else {
        const int slot = w->format == DSQ_WFMT_INT4 && !dsq__int4_classic(w) ? DSQ__MM_INT4_GEN
                                                                              : (int)w->format;
        j->c.fn = fast[slot] ? fast[slot] : tab[w->format];
        j->mr = isa >= DSQ__ISA_AVX512 ? dsq__mm_avx512_rows(w) : DSQ__MM_MR;
    }
    if (!j->quantised)
        return DSQ_OK;
    for (int i = 0; i < n_prev; i++) {
        if (same_acts(&prev[i], xq, j->quantised, j->panel)) {
            j->c.xq = prev[i].c.xq;
            return DSQ_OK;
        }
    }
    size_t qb = (size_t)(m * xq->k_pad + 63) / 64 * 64;
    size_t fb = (size_t)(m * xq->nb) * sizeof(float);
    size_t gb = (size_t)(m * xq->n_groups) * sizeof(float);
    j->buf = aligned_alloc(64, (qb + 2 * fb + gb + 63) / 64 * 64);
    if (!j->buf)
        return DSQ_ENOMEM;
    xq->q = j->buf;
    xq->d = (float *)((char *)j->buf + qb);
    xq->s = xq->d + m * xq->nb;
    xq->gsum = xq->s + m * xq->nb;
    dsq__parallel_for(m, 8, quant_range, xq);
    if (j->panel) {
        j->tb = transpose_xq(xq);
        if (!j->tb) {
            job_release(j);
            return DSQ_ENOMEM;
        }
    }
    return DSQ_OK;
}

/* Job j as one entry of a dsq__mm_run_many list. */
static dsq__mm_tiles_t job_tiles(mm_job_t *j)
{
    return (dsq__mm_tiles_t){.y = j->c.y, .m = j->xq.m, .w = j->c.w, .mr = j->mr,
                             .tile_m = j->tile_m, .fn = mm_block, .ctx = &j->c};
}

/* at least ~128k multiply-adds per thread */
#define MM_MIN_WORK 131072

int dsq_cpu_matmul(float *y, const float *x, int64_t m, const dsq_weight_t *w)
{
    mm_job_t j;
    int rc = job_prepare(&j, y, x, m, w, NULL, 0);
    if (rc != DSQ_OK || j.empty)
        return rc;
    if (j.f32act)
        return dsq__matmul_f32act(y, x, m, w);
    dsq__mm_tiles_t t = job_tiles(&j);
    dsq__mm_run_many(&t, 1, MM_MIN_WORK);
    job_release(&j);
    return DSQ_OK;
}

int dsq_cpu_matmul_many(int n, float *const *y, const float *const *x, const int64_t *m,
                        const dsq_weight_t *const *w)
{
    if (n < 0 || (n > 0 && (!y || !x || !m || !w)))
        return DSQ_EINVAL;
    if (n == 0)
        return DSQ_OK;
    mm_job_t *jobs = calloc((size_t)n, sizeof(*jobs));
    dsq__mm_tiles_t *t = calloc((size_t)n, sizeof(*t));
    int rc = jobs && t ? DSQ_OK : DSQ_ENOMEM, ready = 0, nt = 0;
    for (; ready < n && rc == DSQ_OK; ready++)
        rc = job_prepare(&jobs[ready], y[ready], x[ready], m[ready], w[ready], jobs, ready);
    for (int i = 0; i < ready && rc == DSQ_OK; i++) {
        if (jobs[i].f32act)
            rc = dsq__matmul_f32act(y[i], x[i], m[i], w[i]);
        else if (!jobs[i].empty)
            t[nt++] = job_tiles(&jobs[i]);
    }
    if (rc == DSQ_OK)
        dsq__mm_run_many(t, nt, MM_MIN_WORK);
    for (int i = 0; i < ready; i++)
        job_release(&jobs[i]);
    free(jobs);
    free(t);
    return rc;
}

/* fp16 activations in and out (the reference of dsq_cuda_matmul with fp16
 * x and y): x is widened to fp32, multiplied on the fp32-activation path
 * (weights dequantised exactly, whatever w->act says) and y rounded to
 * fp16 (nearest even). A reference for tests, not a fast path. */
int dsq_cpu_matmul_f16(uint16_t *y, const uint16_t *x, int64_t m, const dsq_weight_t *w)
{
    int rc = check_weight(w);
    if (rc != DSQ_OK || !y || !x || m < 0)
        return rc != DSQ_OK ? rc : DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    float *xf = malloc((size_t)(m * w->k) * sizeof(*xf));
    float *yf = malloc((size_t)(m * w->n) * sizeof(*yf));
    if (!xf || !yf) {
        rc = DSQ_ENOMEM;
        goto undo;
    }
    for (int64_t i = 0; i < m * w->k; i++)
        xf[i] = dsq__h2f(x[i]);
    dsq_weight_t wf = *w;
    wf.act = DSQ_ACT_F32;
    rc = dsq_cpu_matmul(yf, xf, m, &wf);
    for (int64_t i = 0; rc == DSQ_OK && i < m * w->n; i++)
        y[i] = dsq__f2h(yf[i]);
undo:
    free(xf);
    free(yf);
    return rc;
}

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
 * Work split: OpenMP over tiles of (64 activation rows x 16 weight rows);
 * inside a tile the kernel walks 4 activation rows at a time against one
 * weight row, so each unpacked weight chunk is reused 4 times from
 * registers and the tile's weights stay in L1 across the m loop (prefill),
 * while decode (m <= 8) streams every weight byte exactly once.
 */
#include "cpu_internal.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "error.h"

#define TILE_N 16
#define TILE_M 64
#define MR 4

/* ------------------------------------------------------------ scalar tiles */

static void tile_int4(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0,
                      int64_t m1, const dsq_weight_t *w, int64_t n0, int64_t n1)
{
    const int64_t nb = xq->nb, kp = xq->k_pad;
    const int cpg = w->group_size / 32;
    const int64_t groups = (w->k + w->group_size - 1) / w->group_size;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)w->data + n * nb * 16;
        const uint16_t *sc = w->scales + n * groups;
        const uint16_t *zr = w->zeros ? w->zeros + n * groups : NULL;
        for (int64_t r = m0; r < m1; r++) {
            const int8_t *xr = xq->q + r * kp;
            const float *d = xq->d + r * nb;
            const float *gsum = xq->gsum + r * groups;
            float acc = 0.0f, corr = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                float sg = dsq__h2f(sc[g]);
                float cg = w->zp_mode == DSQ_ZP_SYM ? -8.0f * sg
                         : w->zp_mode == DSQ_ZP_INT ? -dsq__h2f(zr[g]) * sg
                         : dsq__h2f(zr[g]);
                int64_t c1 = (g + 1) * cpg < nb ? (g + 1) * cpg : nb;
                for (int64_t c = g * cpg; c < c1; c++) {
                    const uint8_t *wc = wr + c * 16;
                    const int8_t *xc = xr + c * 32;
                    int32_t dot = 0;
                    for (int j = 0; j < 16; j++)
                        dot += (wc[j] & 15) * xc[j] + (wc[j] >> 4) * xc[j + 16];
                    acc += (sg * d[c]) * (float)dot;
                }
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

void dsq__mm_scalar(dsq__mm_tile_fn tab[6])
{
    tab[DSQ_WFMT_F32] = tile_f32;
    tab[DSQ_WFMT_F16] = tile_f16;
    tab[DSQ_WFMT_BF16] = tile_bf16;
    tab[DSQ_WFMT_Q8_0] = tile_q8_0;
    tab[DSQ_WFMT_INT4] = tile_int4;
    tab[DSQ_WFMT_INT8] = tile_int8;
}

/* ------------------------------------------------- activation quantisation */

/* One definition for all ISA levels (see file comment): round to nearest
 * even, q in [-127, 127], padding q = 0. */
static void quantize_rows(dsq__xq_t *xq, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = xq->x + r * xq->k;
        int8_t *q = xq->q + r * xq->k_pad;
        for (int64_t b = 0; b < xq->nb; b++) {
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
        if (xq->n_groups > 0) {
            const int64_t cpg = xq->cpg;
            for (int64_t g = 0; g < xq->n_groups; g++) {
                float gs = 0.0f;
                for (int64_t c = g * cpg; c < (g + 1) * cpg && c < xq->nb; c++)
                    gs += xq->s[r * xq->nb + c];
                xq->gsum[r * xq->n_groups + g] = gs;
            }
        }
    }
}

/* ----------------------------------------------------------------- driver */

static int check_weight(const dsq_weight_t *w)
{
    if (!w || !w->data || w->n <= 0 || w->k <= 0)
        return DSQ_EINVAL;
    switch (w->format) {
    case DSQ_WFMT_F32: case DSQ_WFMT_F16: case DSQ_WFMT_BF16:
        return DSQ_OK;
    case DSQ_WFMT_Q8_0:
        return w->k % 32 == 0 ? DSQ_OK : DSQ_EINVAL;
    case DSQ_WFMT_INT8:
        return w->scales ? DSQ_OK : DSQ_EINVAL;
    case DSQ_WFMT_INT4:
        if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
            return DSQ_EINVAL;
        if (!w->scales || (w->zp_mode != DSQ_ZP_SYM && !w->zeros))
            return DSQ_EINVAL;
        if (w->zp_mode != DSQ_ZP_SYM && w->zp_mode != DSQ_ZP_INT &&
            w->zp_mode != DSQ_ZP_MIN)
            return DSQ_EINVAL;
        return DSQ_OK;
    }
    return DSQ_EINVAL;
}

int dsq_cpu_matmul(float *y, const float *x, int64_t m, const dsq_weight_t *w)
{
    int rc = check_weight(w);
    if (rc != DSQ_OK || !y || !x || m < 0)
        return rc != DSQ_OK ? rc : DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;

    dsq__xq_t xq = {.x = x, .m = m, .k = w->k};
    xq.k_pad = (w->k + 31) / 32 * 32;
    xq.nb = xq.k_pad / 32;
    void *buf = NULL;
    const int nthr = dsq_cpu_get_threads();
    const bool quantised = w->format == DSQ_WFMT_INT4 ||
                           w->format == DSQ_WFMT_Q8_0 ||
                           w->format == DSQ_WFMT_INT8;
    if (quantised) {
        size_t qb = (size_t)(m * xq.k_pad + 63) / 64 * 64;
        size_t fb = (size_t)(m * xq.nb) * sizeof(float);
        if (w->format == DSQ_WFMT_INT4) {
            xq.n_groups = (w->k + w->group_size - 1) / w->group_size;
            xq.cpg = w->group_size / 32;
        }
        size_t gb = (size_t)(m * xq.n_groups) * sizeof(float);
        buf = aligned_alloc(64, (qb + 2 * fb + gb + 63) / 64 * 64);
        if (!buf)
            return DSQ_ENOMEM;
        xq.q = buf;
        xq.d = (float *)((char *)buf + qb);
        xq.s = xq.d + m * xq.nb;
        xq.gsum = xq.s + m * xq.nb;
        if (m >= 8 * nthr && nthr > 1) {
#pragma omp parallel for num_threads(nthr) schedule(static)
            for (int64_t r = 0; r < m; r++)
                quantize_rows(&xq, r, r + 1);
        } else {
            quantize_rows(&xq, 0, m);
        }
    }

    dsq__mm_tile_fn tab[6], fast[6] = {0};
    dsq__mm_scalar(tab);
    dsq__isa_t isa = dsq__cpu_isa_level();
    if (isa >= DSQ__ISA_AVX2)
        dsq__mm_avx2(fast);
    if (isa >= DSQ__ISA_AVX512)
        dsq__mm_avx512(fast);
    dsq__mm_tile_fn fn = fast[w->format] ? fast[w->format] : tab[w->format];

    const int64_t n = w->n;
    const int64_t tn = (n + TILE_N - 1) / TILE_N;
    const int64_t tm = (m + TILE_M - 1) / TILE_M;
    const int64_t n_tiles = tn * tm;
#pragma omp parallel for num_threads(nthr) schedule(static) if (n_tiles > 1 && nthr > 1)
    for (int64_t t = 0; t < n_tiles; t++) {
        int64_t im = t / tn, in = t % tn;
        int64_t n0 = in * TILE_N, n1 = n0 + TILE_N < n ? n0 + TILE_N : n;
        int64_t mb0 = im * TILE_M, mb1 = mb0 + TILE_M < m ? mb0 + TILE_M : m;
        for (int64_t r = mb0; r < mb1; r += MR) {
            int64_t r1 = r + MR < mb1 ? r + MR : mb1;
            fn(y, n, &xq, r, r1, w, n0, n1);
            if (w->bias)
                for (int64_t i = r; i < r1; i++)
                    for (int64_t j = n0; j < n1; j++)
                        y[i * n + j] += w->bias[j];
        }
    }
    free(buf);
    return DSQ_OK;
}

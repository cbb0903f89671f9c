/* Shared by test_matmul.c and test_matmul_f32act.c: random weights of
 * every dsq_wformat_t built from integers / floats, with this file's own
 * FP64 dequantisation from the layouts documented in kernels/kernels.h
 * (INT4 native: rows of k_pad/2 bytes, 32-weight chunks of 16 bytes, byte j
 * = weight j low nibble, j + 16 high nibble; Q8_0: 34-byte blocks of fp16 d
 * and 32 int8; INT8: one fp16 scale per row). Header-only (static inline);
 * include after <cmocka.h>. */
#ifndef DSQ_TEST_MATMUL_BUILD_H
#define DSQ_TEST_MATMUL_BUILD_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "engine/io/tensor.h"

/* 64-bit LCG (Knuth's MMIX constants); the caller owns *s (its
 * seed). Returns the top 31 bits. */
static inline uint32_t lcg_u32(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* Uniform float in [lo, hi) from lcg_u32. */
static inline float lcg_f(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)lcg_u32(s) / 2147483648.0f;
}

typedef struct built {
    dsq_weight_t w;         /* points at the buffers below */
    void *data;
    uint16_t *scales, *zeros;
    float *bias;
    double *wref;           /* [n][k] dequantised, FP64 */
    double *wmag;           /* [n][k] |q s| + |c|: magnitude of the terms that make w */
} built_t;

/* Frees what build_weights allocated (not b itself). */
static inline void free_built(built_t *b)
{
    free(b->data); free(b->scales); free(b->zeros); free(b->bias);
    free(b->wref); free(b->wmag);
}

/* An n x k weight of format f (INT4: zero-point mode zp, group size gs;
 * Q8_0 needs k % 32 == 0) from random values drawn from *rng, with an
 * optional random bias in [-1, 1). w.act is left 0 (DSQ_ACT_INT8 path);
 * the caller sets it. Free with free_built. */
static inline built_t build_weights(uint64_t *rng, dsq_wformat_t f, dsq_zp_mode_t zp, int gs,
                                    int64_t n, int64_t k, bool bias)
{
    built_t b;
    memset(&b, 0, sizeof(b));
    b.w.format = f;
    b.w.n = n;
    b.w.k = k;
    b.wref = calloc((size_t)(n * k), sizeof(double));
    b.wmag = calloc((size_t)(n * k), sizeof(double));
    const int64_t kp = (k + 31) / 32 * 32;
    switch (f) {
    case DSQ_WFMT_F32: {
        float *d = malloc((size_t)(n * k) * 4);
        for (int64_t i = 0; i < n * k; i++) {
            d[i] = lcg_f(rng, -0.5f, 0.5f);
            b.wref[i] = d[i];
        }
        b.data = d;
        break;
    }
    case DSQ_WFMT_F16: case DSQ_WFMT_BF16: {
        uint16_t *d = malloc((size_t)(n * k) * 2);
        for (int64_t i = 0; i < n * k; i++) {
            float v = lcg_f(rng, -0.5f, 0.5f);
            d[i] = f == DSQ_WFMT_F16 ? dsq_fp32_to_fp16(v) : dsq_fp32_to_bf16(v);
            b.wref[i] = f == DSQ_WFMT_F16 ? dsq_fp16_to_fp32(d[i]) : dsq_bf16_to_fp32(d[i]);
        }
        b.data = d;
        break;
    }
    case DSQ_WFMT_Q8_0: {
        b.w.group_size = 32;
        uint8_t *d = malloc((size_t)(n * k / 32 * 34));
        for (int64_t blk = 0; blk < n * k / 32; blk++) {
            uint16_t h = dsq_fp32_to_fp16(lcg_f(rng, 0.0005f, 0.01f));
            d[blk * 34] = (uint8_t)h;
            d[blk * 34 + 1] = (uint8_t)(h >> 8);
            for (int j = 0; j < 32; j++) {
                int8_t q = (int8_t)(lcg_u32(rng) % 256);   /* includes -128 */
                d[blk * 34 + 2 + j] = (uint8_t)q;
                b.wref[blk * 32 + j] = (double)q * dsq_fp16_to_fp32(h);
            }
        }
        b.data = d;
        break;
    }
    case DSQ_WFMT_INT8: {
        int8_t *d = malloc((size_t)(n * k));
        b.scales = malloc((size_t)n * 2);
        for (int64_t r = 0; r < n; r++) {
            b.scales[r] = dsq_fp32_to_fp16(lcg_f(rng, 0.001f, 0.01f));
            for (int64_t j = 0; j < k; j++) {
                d[r * k + j] = (int8_t)((int)(lcg_u32(rng) % 255) - 127);
                b.wref[r * k + j] = (double)d[r * k + j] * dsq_fp16_to_fp32(b.scales[r]);
            }
        }
        b.data = d;
        break;
    }
    case DSQ_WFMT_INT8G:   /* built from GGUF blocks: tests/unit/test_gguf_quant.c */
    case DSQ_WFMT_INT4_X8: /* made from INT4 by dsq_weight_interleave_x8 */
    case DSQ_WFMT_INT6_X8: /* made from Q6_K's INT8G: test_gguf_quant.c */
    case DSQ_WFMT_Q8_0_X8: /* made from Q8_0 by dsq_weight_pack_x8 */
    case DSQ_WFMT_INT5_X8: /* made from Q5's INT8G: test_gguf_quant.c */
    case DSQ_WFMT_INT2_X8: /* made from Q2_K's INT4: test_gguf_quant.c */
    case DSQ_WFMT_INT3_X8: /* made from Q3_K's INT4: test_gguf_quant.c */
        break;
    case DSQ_WFMT_INT4: {
        b.w.group_size = gs;
        b.w.zp_mode = zp;
        const int64_t G = (k + gs - 1) / gs;
        uint8_t *d = calloc((size_t)(n * kp / 2), 1);
        b.scales = malloc((size_t)(n * G) * 2);
        if (zp != DSQ_ZP_SYM)
            b.zeros = malloc((size_t)(n * G) * 2);
        for (int64_t i = 0; i < n * G; i++) {
            b.scales[i] = dsq_fp32_to_fp16(lcg_f(rng, 0.002f, 0.05f));
            if (zp == DSQ_ZP_INT)
                b.zeros[i] = dsq_fp32_to_fp16((float)(lcg_u32(rng) % 16));
            else if (zp == DSQ_ZP_MIN)
                b.zeros[i] = dsq_fp32_to_fp16(lcg_f(rng, -0.3f, 0.1f));
        }
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++) {
                unsigned q = lcg_u32(rng) % 16;
                uint8_t *p = d + r * kp / 2 + (j / 32) * 16 + (j % 16);
                *p |= (uint8_t)(j % 32 < 16 ? q : q << 4);
                double s = dsq_fp16_to_fp32(b.scales[r * G + j / gs]);
                double z = b.zeros ? dsq_fp16_to_fp32(b.zeros[r * G + j / gs]) : 0.0;
                double v = zp == DSQ_ZP_SYM ? ((double)q - 8) * s
                         : zp == DSQ_ZP_INT ? ((double)q - z) * s : (double)q * s + z;
                b.wref[r * k + j] = v;
                b.wmag[r * k + j] = zp == DSQ_ZP_SYM ? (q + 8.0) * s
                                  : zp == DSQ_ZP_INT ? (q + z) * s : q * s + fabs(z);
            }
        b.data = d;
        break;
    }
    }
    for (int64_t i = 0; i < n * k; i++)
        if (b.wmag[i] == 0.0)
            b.wmag[i] = fabs(b.wref[i]);
    if (bias) {
        b.bias = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            b.bias[i] = lcg_f(rng, -1, 1);
    }
    b.w.data = b.data;
    b.w.scales = b.scales;
    b.w.zeros = b.zeros;
    b.w.bias = b.bias;
    return b;
}

#endif

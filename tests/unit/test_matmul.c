/* tests for kernels/cpu/matmul.c (+ the AVX2 / AVX-512 tile kernels).
 *
 * Weights of every format are built here from random integers / floats and
 * dequantised by this file's own reading of the layouts in kernels.h; the
 * reference is y = W·x (+ bias) in FP64. Tolerances:
 *   quantised formats (INT4, Q8_0, INT8): the kernels quantise x to int8 per
 *     32-block, d = amax/127, so |x - x^| <= amax/254 per element and
 *     |y - y_ref| <= sum_blocks amax_b/254 * sum_{j in b} |w_j| (exactly the
 *     activation-rounding error), plus fp32 summation error;
 *   fp32 summation error, every format: 2*(k+nb)*u * mag, u = 2^-24, where
 *     mag = sum of the magnitudes of all terms summed (|w||x|; for INT4 the
 *     scale and zero-point terms separately), the standard bound for any
 *     summation order (Higham, Accuracy and Stability, ch. 4).
 * Every ISA level the CPU has (forced with dsq_cpu_force_isa: AVX2,
 * AVX-512 on x86-64; NEON, NEON+SDOT on AArch64, run under qemu by
 * scripts/test-arm64) is compared with the FP64 reference and with the
 * scalar path. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "kernels.h"
#include "engine/model/quant.h"
#include "engine/io/tensor.h"
#include "matmul_build.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float rndf(float lo, float hi) { return lcg_f(&rng, lo, hi); }

static built_t build(dsq_wformat_t f, dsq_zp_mode_t zp, int gs, int64_t n, int64_t k, int bias)
{
    return build_weights(&rng, f, zp, gs, n, k, bias != 0);
}

#define N_ISAS 5
static const char *isas[N_ISAS] = {"scalar", "avx2", "avx512", "neon", "neon_dotprod"};
static unsigned isa_run_mask;    /* bit i: isas[i] ran */
static const char *best_isa;     /* the level in force before the first check */

/* Runs all ISA levels for one weight and m; returns max abs error vs FP64. */
static void check(const built_t *b, int64_t m, double *max_abs, double *max_rel)
{
    const int64_t n = b->w.n, k = b->w.k, nb = (k + 31) / 32;
    const bool quant = b->w.format == DSQ_WFMT_INT4 || b->w.format == DSQ_WFMT_Q8_0 ||
                       b->w.format == DSQ_WFMT_INT8 || b->w.format == DSQ_WFMT_INT4_X8 ||
                       b->w.format == DSQ_WFMT_Q8_0_X8;
    float *x = malloc((size_t)(m * k) * 4);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = rndf(-1, 1) * (i % 17 == 0 ? 4.0f : 1.0f);
    float *y = malloc((size_t)(m * n) * 4), *ys = malloc((size_t)(m * n) * 4);
    double *ref = malloc((size_t)(m * n) * 8), *tol = malloc((size_t)(m * n) * 8);
    double *tolfp = malloc((size_t)(m * n) * 8);
    const double u = ldexp(1.0, -24);
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < n; c++) {
            double acc = b->bias ? b->bias[c] : 0.0, qe = 0.0, mag = b->bias ? fabs(b->bias[c]) : 0.0;
            for (int64_t blk = 0; blk < nb; blk++) {
                double amax = 0.0, sw = 0.0;
                for (int64_t j = blk * 32; j < k && j < blk * 32 + 32; j++) {
                    amax = fmax(amax, fabs(x[r * k + j]));
                    sw += fabs(b->wref[c * k + j]);
                    acc += b->wref[c * k + j] * x[r * k + j];
                    mag += b->wmag[c * k + j] * fabs(x[r * k + j]);
                }
                qe += amax / 254.0 * sw;
            }
            ref[r * n + c] = acc;
            tolfp[r * n + c] = 2.0 * (double)(k + nb + 2) * u * mag * 1.01 + 1e-7;
            tol[r * n + c] = (quant ? qe * (1.0 + 1e-5) : 0.0) + tolfp[r * n + c];
        }
    if (!best_isa)
        best_isa = dsq_cpu_isa();
    for (int i = 0; i < N_ISAS; i++) {
        if (dsq_cpu_force_isa(isas[i]) != DSQ_OK)
            continue;
        isa_run_mask |= 1u << i;
        memset(y, 0xff, (size_t)(m * n) * 4);
        assert_int_equal(dsq_cpu_matmul(y, x, m, &b->w), DSQ_OK);
        if (i == 0)
            memcpy(ys, y, (size_t)(m * n) * 4);
        for (int64_t e = 0; e < m * n; e++) {
            double err = fabs((double)y[e] - ref[e]);
            if (!(err <= tol[e]))
                fail_msg("fmt %d zp %d gs %d k %lld n %lld m %lld isa %s: y[%lld]=%.9g ref %.9g err %.3g > tol %.3g",
                         b->w.format, b->w.zp_mode, b->w.group_size, (long long)k, (long long)n,
                         (long long)m, isas[i], (long long)e, y[e], ref[e], err, tol[e]);
            /* fast path vs scalar: same integer dots, only fp32 order differs */
            double ds = fabs((double)y[e] - (double)ys[e]);
            if (!(ds <= 2.0 * tolfp[e]))
                fail_msg("isa %s vs scalar: fmt %d m %lld e %lld: %.9g vs %.9g (tol %.3g)", isas[i],
                         b->w.format, (long long)m, (long long)e, y[e], ys[e], 2.0 * tolfp[e]);
            *max_abs = fmax(*max_abs, err);
            *max_rel = fmax(*max_rel, err / tol[e]);
        }
    }
    /* back to the best level the CPU has */
    assert_int_equal(dsq_cpu_force_isa(best_isa), DSQ_OK);
    free(x); free(y); free(ys); free(ref); free(tol); free(tolfp);
}

static const int64_t ms[] = {1, 2, 3, 8, 17, 64, 70};

static void run_format(dsq_wformat_t f, dsq_zp_mode_t zp, int gs, int64_t n, int64_t k, int bias)
{
    built_t b = build(f, zp, gs, n, k, bias);
    double ma = 0.0, mr = 0.0;
    for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
        check(&b, ms[i], &ma, &mr);
    printf("# fmt %d zp %d gs %3d n %3lld k %3lld bias %d: max abs err %.3g, max err/tolerance %.3g\n",
           f, zp, gs, (long long)n, (long long)k, bias, ma, mr);
    free_built(&b);
}

static void test_int4(void **state)
{
    (void)state;
    const int gsz[3] = {32, 64, 128};
    for (int z = 0; z < 3; z++)
        for (int g = 0; g < 3; g++) {
            run_format(DSQ_WFMT_INT4, (dsq_zp_mode_t)z, gsz[g], 37, 172, z == 1);
            run_format(DSQ_WFMT_INT4, (dsq_zp_mode_t)z, gsz[g], 24, 576, z != 1);
        }
}

/* Every ISA level's product of w with the first m rows of xs (m = 1,
 * 1 + step, ... <= m_max) equals yref bit for bit; what names the case. */
static void expect_isas_bitwise(const dsq_weight_t *w, const float *xs, int64_t m_max,
                                int64_t step, const float *yref, const char *what)
{
    float *y = malloc((size_t)(m_max * w->n) * sizeof(float));
    for (int i = 0; i < N_ISAS; i++) {
        if (dsq_cpu_force_isa(isas[i]) != DSQ_OK)
            continue;
        for (int64_t mm = 1; mm <= m_max; mm += step) {
            memset(y, 0xff, (size_t)(mm * w->n) * sizeof(float));
            assert_int_equal(dsq_cpu_matmul(y, xs, mm, w), DSQ_OK);
            for (int64_t e = 0; e < mm * w->n; e++)
                if (memcmp(&y[e], &yref[e], sizeof(float)) != 0)
                    fail_msg("%s isa %s m %lld: y[%lld] = %.9g, the scalar kernel's %.9g",
                             what, isas[i], (long long)mm, (long long)e, y[e], yref[e]);
        }
    }
    assert_int_equal(dsq_cpu_force_isa(best_isa), DSQ_OK);
    free(y);
}

/* INT4_X8 (8 rows interleaved, the x86 CPU layout): built as INT4, then
 * interleaved in place; every ISA level against the FP64 reference of the
 * same weights, and each row dequantises to what the native row did. */
static void test_int4_x8(void **state)
{
    (void)state;
    const int gsz[3] = {32, 64, 128};
    const int64_t shapes[3][2] = {{40, 172}, {24, 576}, {16, 4096}};
    for (int z = 0; z < 3; z++)
        for (int g = 0; g < 3; g++)
            for (int s = 0; s < 3; s++) {
                const int64_t n = shapes[s][0], k = shapes[s][1];
                built_t b = build(DSQ_WFMT_INT4, (dsq_zp_mode_t)z, gsz[g], n, k, (z + s) % 2);
                float *native = malloc((size_t)(n * k) * sizeof(float));
                float *row = malloc((size_t)k * sizeof(float));
                for (int64_t r = 0; r < n; r++)
                    assert_int_equal(dsq_weight_dequant_row(&b.w, r, native + r * k), DSQ_OK);
                /* the native scalar kernel's results, to compare bit for bit */
                float *xs = malloc((size_t)(300 * k) * sizeof(float));
                float *yref = malloc((size_t)(300 * n) * sizeof(float));
                for (int64_t i = 0; i < 300 * k; i++)
                    xs[i] = rndf(-1, 1);
                if (!best_isa)
                    best_isa = dsq_cpu_isa();
                assert_int_equal(dsq_cpu_force_isa("scalar"), DSQ_OK);
                assert_int_equal(dsq_cpu_matmul(yref, xs, 300, &b.w), DSQ_OK);
                assert_int_equal(dsq_weight_interleave_x8(&b.w), DSQ_OK);
                assert_int_equal(b.w.format, DSQ_WFMT_INT4_X8);
                /* every ISA level's INT4_X8 kernel does the scalar kernel's
                 * fp32 operations in its order: the same bits (m = 24 on
                 * the AVX-512 panel path, m = 277 and 300 over two of its
                 * 256-row tiles) */
                char what[64];
                snprintf(what, sizeof(what), "INT4_X8 zp %d gs %d", z, gsz[g]);
                expect_isas_bitwise(&b.w, xs, 300, 23, yref, what);
                free(xs);
                free(yref);
                for (int64_t r = 0; r < n; r++) {
                    assert_int_equal(dsq_weight_dequant_row(&b.w, r, row), DSQ_OK);
                    assert_memory_equal(row, native + r * k, (size_t)k * sizeof(float));
                }
                double ma = 0.0, mr = 0.0;
                for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
                    check(&b, ms[i], &ma, &mr);
                printf("# INT4_X8 zp %d gs %3d n %3lld k %4lld: max abs err %.3g, max "
                       "err/tolerance %.3g\n", z, gsz[g], (long long)n, (long long)k, ma, mr);
                free(native);
                free(row);
                free_built(&b);
            }
    /* what cannot be interleaved is left as it was */
    built_t b = build(DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 20, 64, 0);
    assert_int_equal(dsq_weight_interleave_x8(&b.w), DSQ_EINVAL);   /* n % 8 */
    assert_int_equal(b.w.format, DSQ_WFMT_INT4);
    assert_int_equal(dsq_weight_interleave_x8(NULL), DSQ_EINVAL);
    free_built(&b);
    b = build(DSQ_WFMT_Q8_0, 0, 32, 8, 64, 0);
    assert_int_equal(dsq_weight_interleave_x8(&b.w), DSQ_EINVAL);   /* not INT4 */
    free_built(&b);
    /* row views of an interleaved weight are whole tiles */
    b = build(DSQ_WFMT_INT4, DSQ_ZP_SYM, 32, 24, 64, 0);
    assert_int_equal(dsq_weight_interleave_x8(&b.w), DSQ_OK);
    dsq_weight_t v;
    assert_int_equal(dsq_weight_rows(&b.w, 8, 16, &v), DSQ_OK);
    assert_int_equal(dsq_weight_rows(&b.w, 4, 8, &v), DSQ_EINVAL);
    assert_int_equal(dsq_weight_rows(&b.w, 8, 4, &v), DSQ_EINVAL);
    free_built(&b);
}

static void test_q8_0(void **state)
{
    (void)state;
    run_format(DSQ_WFMT_Q8_0, 0, 32, 37, 576, 0);
    run_format(DSQ_WFMT_Q8_0, 0, 32, 20, 96, 1);
}

/* Q8_0_X8 (8 rows interleaved, dsq_weight_pack_x8): every ISA level's
 * product is bitwise the row-major scalar kernel's (same fp32 operations),
 * rows dequantise to the row-major ones, and the FP64 check holds. */
static void test_q8_0_x8(void **state)
{
    (void)state;
    /* 40 rows: decode (m = 1) walks 4 tiles at once on AVX-512, then an
     * odd one */
    const int64_t shapes[3][2] = {{8, 32}, {40, 576}, {16, 4096}};
    for (int s = 0; s < 3; s++) {
        const int64_t n = shapes[s][0], k = shapes[s][1];
        built_t b = build(DSQ_WFMT_Q8_0, 0, 32, n, k, s == 1);
        float *native = malloc((size_t)(n * k) * sizeof(float));
        float *row = malloc((size_t)k * sizeof(float));
        for (int64_t r = 0; r < n; r++)
            assert_int_equal(dsq_weight_dequant_row(&b.w, r, native + r * k), DSQ_OK);
        float *xs = malloc((size_t)(9 * k) * sizeof(float));
        float *yref = malloc((size_t)(9 * n) * sizeof(float));
        for (int64_t i = 0; i < 9 * k; i++)
            xs[i] = rndf(-1, 1);
        if (!best_isa)
            best_isa = dsq_cpu_isa();
        assert_int_equal(dsq_cpu_force_isa("scalar"), DSQ_OK);
        assert_int_equal(dsq_cpu_matmul(yref, xs, 9, &b.w), DSQ_OK);
        dsq_weight_t rm = b.w, x8;
        void *st = NULL;
        assert_int_equal(dsq_weight_pack_x8(&rm, &x8, &st), DSQ_OK);
        assert_int_equal(x8.format, DSQ_WFMT_Q8_0_X8);
        b.w = x8;
        char what[64];
        snprintf(what, sizeof(what), "Q8_0_X8 n %lld k %lld", (long long)n, (long long)k);
        expect_isas_bitwise(&b.w, xs, 9, 4, yref, what);
        for (int64_t r = 0; r < n; r++) {
            assert_int_equal(dsq_weight_dequant_row(&b.w, r, row), DSQ_OK);
            assert_memory_equal(row, native + r * k, (size_t)k * sizeof(float));
        }
        double ma = 0.0, mr = 0.0;
        for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
            check(&b, ms[i], &ma, &mr);
        printf("# Q8_0_X8 n %3lld k %4lld: max abs err %.3g, max err/tolerance %.3g\n",
               (long long)n, (long long)k, ma, mr);
        b.w = rm;
        free(st);
        free(xs);
        free(yref);
        free(native);
        free(row);
        free_built(&b);
    }
    /* n % 8, or a format without an interleaved twin: refused, untouched */
    built_t b = build(DSQ_WFMT_Q8_0, 0, 32, 20, 64, 0);
    dsq_weight_t out;
    memset(&out, 0x5a, sizeof(out));
    void *st = (void *)1;
    assert_int_equal(dsq_weight_pack_x8(&b.w, &out, &st), DSQ_EINVAL);
    assert_ptr_equal(st, (void *)1);
    free_built(&b);
    b = build(DSQ_WFMT_INT8, 0, 0, 8, 64, 0);
    assert_int_equal(dsq_weight_pack_x8(&b.w, &out, &st), DSQ_EINVAL);
    assert_int_equal(dsq_weight_pack_x8(NULL, &out, &st), DSQ_EINVAL);
    free_built(&b);
}

static void test_int8(void **state)
{
    (void)state;
    run_format(DSQ_WFMT_INT8, 0, 0, 37, 172, 1);
    run_format(DSQ_WFMT_INT8, 0, 0, 16, 576, 0);
}

static void test_float(void **state)
{
    (void)state;
    for (int f = DSQ_WFMT_F32; f <= DSQ_WFMT_BF16; f++) {
        run_format((dsq_wformat_t)f, 0, 0, 37, 172, 1);
        run_format((dsq_wformat_t)f, 0, 0, 19, 576, 0);
    }
    printf("# ISA levels tested:");
    for (int i = 0; i < N_ISAS; i++)
        if (isa_run_mask & (1u << i))
            printf(" %s", isas[i]);
    printf(" (best: %s)\n", dsq_cpu_isa());
}

/* Real SmolLM2 tensors repacked by engine/model/quant.c (Q4_1 -> INT4 MIN, Q8_0
 * tied embedding / lm_head, n = 49152): reference from the GGUF bytes. */
static void test_real_model(void **state)
{
    (void)state;
    const char *dir = getenv("DSQ_MODELS_DIR");
    char path[1024], err[256] = "";
    snprintf(path, sizeof(path), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : "models");
    dsq_gguf_t *g = dsq_gguf_open(path, err, sizeof(err));
    if (!g)
        fail_msg("missing test model %s: %s", path, err);
    const char *names[2] = {"blk.0.ffn_down.weight", "token_embd.weight"};
    for (int t = 0; t < 2; t++) {
        const dsq_tensor_t *ten = dsq_gguf_find_tensor(g, names[t]);
        assert_non_null(ten);
        built_t b;
        memset(&b, 0, sizeof(b));
        void *st = NULL;
        assert_int_equal(dsq_quant_from_gguf(ten, &b.w, &st, err, sizeof(err)), DSQ_OK);
        const int64_t n = b.w.n, k = b.w.k;
        b.wref = malloc((size_t)(n * k) * sizeof(double));
        b.wmag = malloc((size_t)(n * k) * sizeof(double));
        const uint8_t *src = ten->data;
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++) {
                int64_t blk = r * (k / 32) + j / 32;
                int e = (int)(j % 32);
                if (ten->type == DSQ_TYPE_Q4_1) {
                    const uint8_t *bb = src + blk * 20;
                    double d = dsq_fp16_to_fp32((uint16_t)(bb[0] | (bb[1] << 8)));
                    double mm = dsq_fp16_to_fp32((uint16_t)(bb[2] | (bb[3] << 8)));
                    int q = e < 16 ? (bb[4 + e] & 15) : (bb[4 + e - 16] >> 4);
                    b.wref[r * k + j] = q * d + mm;
                    b.wmag[r * k + j] = q * fabs(d) + fabs(mm);
                } else {
                    assert_int_equal(ten->type, DSQ_TYPE_Q8_0);
                    const uint8_t *bb = src + blk * 34;
                    double d = dsq_fp16_to_fp32((uint16_t)(bb[0] | (bb[1] << 8)));
                    b.wref[r * k + j] = (int8_t)bb[2 + e] * d;
                    b.wmag[r * k + j] = fabs(b.wref[r * k + j]);
                }
            }
        double ma = 0.0, mr = 0.0;
        check(&b, 1, &ma, &mr);
        check(&b, 3, &ma, &mr);
        printf("# real %s (%s, n %lld k %lld): max abs err %.3g, max err/tolerance %.3g\n",
               names[t], dsq_type_name(ten->type), (long long)n, (long long)k, ma, mr);
        free(b.wref);
        free(b.wmag);
        free(st);
    }
    dsq_gguf_close(g);
}

static void test_threads(void **state)
{
    (void)state;
    /* same result (bitwise) with 1 and 2 threads: tiles are independent */
    built_t b = build(DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 100, 576, 1);
    float x[3 * 576], y1[300], y2[300];
    for (int i = 0; i < 3 * 576; i++) x[i] = rndf(-1, 1);
    int t0 = dsq_cpu_get_threads();
    assert_int_equal(dsq_cpu_set_threads(1), DSQ_OK);
    assert_int_equal(dsq_cpu_matmul(y1, x, 3, &b.w), DSQ_OK);
    assert_int_equal(dsq_cpu_set_threads(2), DSQ_OK);
    assert_int_equal(dsq_cpu_matmul(y2, x, 3, &b.w), DSQ_OK);
    assert_memory_equal(y1, y2, sizeof(y1));
    assert_int_equal(dsq_cpu_set_threads(0), DSQ_EINVAL);
    assert_int_equal(dsq_cpu_set_threads(t0), DSQ_OK);
    free_built(&b);
}

/* dsq_cpu_matmul_many: several products of different formats, shapes and
 * paths (decode rows, the AVX-512 panel path, fp32 activations, an empty
 * product, products sharing one x) in one call give each product's
 * dsq_cpu_matmul result bit for bit, at every ISA level and thread count;
 * a refused product writes no output. */
static void test_many(void **state)
{
    (void)state;
    enum { NP = 8 };
    const int64_t k = 576;
    built_t b[NP];
    b[0] = build(DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 40, k, 1);
    b[1] = build(DSQ_WFMT_INT4, DSQ_ZP_SYM, 32, 48, k, 0);
    assert_int_equal(dsq_weight_interleave_x8(&b[1].w), DSQ_OK);
    b[2] = build(DSQ_WFMT_Q8_0, 0, 32, 24, k, 1);
    b[3] = build(DSQ_WFMT_F32, 0, 0, 16, 96, 0);
    b[4] = build(DSQ_WFMT_INT4, DSQ_ZP_INT, 64, 64, k, 1);
    assert_int_equal(dsq_weight_interleave_x8(&b[4].w), DSQ_OK);
    b[5] = build(DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 8, k, 0);
    b[5].w.act = DSQ_ACT_F32;
    b[6] = build(DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 8, k, 0);
    b[7] = build(DSQ_WFMT_INT4, DSQ_ZP_MIN, 64, 32, k, 0);   /* xa, other groups */
    assert_int_equal(dsq_weight_interleave_x8(&b[7].w), DSQ_OK);
    float *xa = malloc((size_t)k * sizeof(float)), *xb = malloc(3 * 96 * sizeof(float));
    float *xc = malloc((size_t)(20 * k) * sizeof(float));
    for (int64_t i = 0; i < k; i++) xa[i] = rndf(-1, 1);
    for (int64_t i = 0; i < 3 * 96; i++) xb[i] = rndf(-1, 1);
    for (int64_t i = 0; i < 20 * k; i++) xc[i] = rndf(-1, 1);
    const float *x[NP] = {xa, xa, xa, xb, xc, xa, xa, xa};
    const int64_t m[NP] = {1, 1, 1, 3, 20, 1, 0, 1};
    const dsq_weight_t *w[NP];
    float *y[NP], *ref[NP];
    for (int i = 0; i < NP; i++) {
        w[i] = &b[i].w;
        size_t sz = (size_t)((m[i] > 0 ? m[i] : 1) * b[i].w.n) * sizeof(float);
        y[i] = malloc(sz);
        ref[i] = malloc(sz);
    }
    if (!best_isa)
        best_isa = dsq_cpu_isa();
    const char *levels[2] = {"scalar", best_isa};
    const int t0 = dsq_cpu_get_threads();
    for (int l = 0; l < 2; l++) {
        assert_int_equal(dsq_cpu_force_isa(levels[l]), DSQ_OK);
        for (int i = 0; i < NP; i++)
            assert_int_equal(dsq_cpu_matmul(ref[i], x[i], m[i], w[i]), DSQ_OK);
        for (int nt = 1; nt <= 2; nt++) {
            assert_int_equal(dsq_cpu_set_threads(nt), DSQ_OK);
            for (int i = 0; i < NP; i++)
                memset(y[i], 0x7f, (size_t)(m[i] * b[i].w.n) * sizeof(float));
            assert_int_equal(dsq_cpu_matmul_many(NP, y, x, m, w), DSQ_OK);
            for (int i = 0; i < NP; i++)
                assert_memory_equal(y[i], ref[i], (size_t)(m[i] * b[i].w.n) * sizeof(float));
        }
    }
    assert_int_equal(dsq_cpu_force_isa(best_isa), DSQ_OK);
    assert_int_equal(dsq_cpu_set_threads(t0), DSQ_OK);
    /* refusals: nothing written */
    assert_int_equal(dsq_cpu_matmul_many(0, NULL, NULL, NULL, NULL), DSQ_OK);
    assert_int_equal(dsq_cpu_matmul_many(-1, y, x, m, w), DSQ_EINVAL);
    assert_int_equal(dsq_cpu_matmul_many(NP, y, NULL, m, w), DSQ_EINVAL);
    for (int i = 0; i < NP; i++)
        memset(y[i], 0x7f, (size_t)(m[i] * b[i].w.n) * sizeof(float));
    b[3].w.n = 0;
    assert_int_equal(dsq_cpu_matmul_many(NP, y, x, m, w), DSQ_EINVAL);
    b[3].w.n = 16;
    for (int i = 0; i < NP; i++)
        for (int64_t j = 0; j < m[i] * b[i].w.n; j++) {
            uint32_t u;
            memcpy(&u, &y[i][j], 4);
            assert_int_equal(u, 0x7f7f7f7fu);
        }
    for (int i = 0; i < NP; i++) {
        free(y[i]);
        free(ref[i]);
        free_built(&b[i]);
    }
    free(xa);
    free(xb);
    free(xc);
}

static void test_errors(void **state)
{
    (void)state;
    built_t b = build(DSQ_WFMT_INT4, DSQ_ZP_INT, 32, 8, 64, 0);
    float x[64], y[8];
    memset(x, 0, sizeof(x));
    assert_int_equal(dsq_cpu_matmul(y, x, 0, &b.w), DSQ_OK);
    assert_int_equal(dsq_cpu_matmul(NULL, x, 1, &b.w), DSQ_EINVAL);
    b.w.group_size = 48;
    assert_int_equal(dsq_cpu_matmul(y, x, 1, &b.w), DSQ_EINVAL);
    b.w.group_size = 32;
    b.w.zeros = NULL;
    assert_int_equal(dsq_cpu_matmul(y, x, 1, &b.w), DSQ_EINVAL);
    assert_int_equal(dsq_cpu_force_isa("sse9"), DSQ_EINVAL);
    /* the other architecture's levels never run */
#if defined(__aarch64__)
    assert_int_equal(dsq_cpu_force_isa("avx2"), DSQ_EUNSUPPORTED);
#else
    assert_int_equal(dsq_cpu_force_isa("neon"), DSQ_EUNSUPPORTED);
    assert_int_equal(dsq_cpu_force_isa("neon_dotprod"), DSQ_EUNSUPPORTED);
#endif
    free_built(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_int4_x8),
        cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_q8_0_x8),
        cmocka_unit_test(test_int8),
        cmocka_unit_test(test_float),
        cmocka_unit_test(test_real_model),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

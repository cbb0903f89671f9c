/* tests for the fp32-activation path of dsq_cpu_matmul
 * (kernels/cpu/matmul_f32act.c, w->act == DSQ_ACT_F32).
 *
 * Weights (INT4 in all three zero-point modes and group sizes 32/64/128,
 * Q8_0, INT8) are built from random integers and dequantised here from
 * this file's own reading of the layouts in kernels.h; the reference is
 * y = W·x (+ bias) in FP64 with the UNQUANTISED activations. Bound: the
 * fp32 evaluation error of a sum of k products whose weights are
 * themselves formed in fp32 (q*s + c: two roundings),
 *     |y - y_ref| <= (k + 4) * 2u * mag,   u = 2^-24,
 * mag = sum_j (|q s| + |c|) |x_j| (Higham, Accuracy and Stability, ch. 4,
 * any summation order). That bound is ~1e-6 relative, far below the
 * int8-activation path's error, and the test checks that the int8 path
 * indeed violates it on the same data (so the test can tell the paths
 * apart). Every ISA level the CPU has is compared with the reference and
 * with the scalar path. */
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
#include "kernels.h"
#include "engine/io/tensor.h"
#include "matmul_build.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { return lcg_u32(&rng); }
static const char *detected;   /* ISA level found at start (restored after forcing) */
static float rndf(float lo, float hi) { return lcg_f(&rng, lo, hi); }

static built_t build(dsq_wformat_t f, dsq_zp_mode_t zp, int gs, int64_t n, int64_t k,
                     bool bias)
{
    built_t b = build_weights(&rng, f, zp, gs, n, k, bias);
    b.w.act = DSQ_ACT_F32;
    return b;
}

/* Checks every ISA level against FP64 and against scalar; returns the
 * worst error of the int8-activation path relative to the bound. */
static double check(const built_t *b, int64_t m)
{
    const int64_t n = b->w.n, k = b->w.k;
    float *x = malloc((size_t)(m * k) * sizeof(float));
    float *y = malloc((size_t)(m * n) * sizeof(float));
    float *ys = malloc((size_t)(m * n) * sizeof(float));
    double *ref = malloc((size_t)(m * n) * sizeof(double));
    double *bound = malloc((size_t)(m * n) * sizeof(double));
    for (int64_t i = 0; i < m * k; i++)
        x[i] = rndf(-2.0f, 2.0f) * (rnd() % 7 == 0 ? 8.0f : 1.0f);  /* some outliers */
    const double u = ldexp(1.0, -24);
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < n; c++) {
            double s = b->bias ? b->bias[c] : 0.0, mag = b->bias ? fabs(b->bias[c]) : 0.0;
            for (int64_t j = 0; j < k; j++) {
                s += b->wref[c * k + j] * x[r * k + j];
                mag += b->wmag[c * k + j] * fabs(x[r * k + j]);
            }
            ref[r * n + c] = s;
            bound[r * n + c] = (double)(k + 4) * 2.0 * u * mag + 1e-30;
        }
    const char *isas[] = {"scalar", "avx2", "avx512", "neon", "neon_dotprod"};
    for (int i = 0; i < (int)(sizeof(isas) / sizeof(isas[0])); i++) {
        if (dsq_cpu_force_isa(isas[i]) != DSQ_OK)
            continue;
        assert_int_equal(dsq_cpu_matmul(y, x, m, &b->w), DSQ_OK);
        for (int64_t e = 0; e < m * n; e++) {
            double err = fabs(y[e] - ref[e]);
            if (err > bound[e])
                print_message("# %s fmt %d zp %d gs %d m %lld k %lld elem %lld: %.9g vs "
                              "%.9g (bound %.3g)\n", isas[i], b->w.format, b->w.zp_mode,
                              b->w.group_size, (long long)m, (long long)k, (long long)e,
                              (double)y[e], ref[e], bound[e]);
            assert_true(err <= bound[e]);
        }
        if (i == 0)
            memcpy(ys, y, (size_t)(m * n) * sizeof(float));
        else
            for (int64_t e = 0; e < m * n; e++)
                assert_true(fabs(y[e] - ys[e]) <= 2.0 * bound[e]);
    }
    assert_int_equal(dsq_cpu_force_isa(detected), DSQ_OK);
    /* the int8-activation path on the same data, for contrast */
    dsq_weight_t w8 = b->w;
    w8.act = DSQ_ACT_INT8;
    assert_int_equal(dsq_cpu_matmul(y, x, m, &w8), DSQ_OK);
    double worst8 = 0.0;
    for (int64_t e = 0; e < m * n; e++)
        worst8 = fmax(worst8, fabs(y[e] - ref[e]) / bound[e]);
    free(x); free(y); free(ys); free(ref); free(bound);
    return worst8;
}

static void test_int4(void **state)
{
    (void)state;
    const dsq_zp_mode_t zps[] = {DSQ_ZP_SYM, DSQ_ZP_INT, DSQ_ZP_MIN};
    const int gss[] = {32, 64, 128};
    const int64_t ks[] = {256, 80, 200, 31};
    const int64_t ms[] = {1, 3, 5, 70};
    double worst8 = 1e30;
    for (int z = 0; z < 3; z++)
        for (int g = 0; g < 3; g++)
            for (int ki = 0; ki < 4; ki++) {
                built_t b = build(DSQ_WFMT_INT4, zps[z], gss[g], 37, ks[ki], ki == 1);
                double w8 = check(&b, ms[(z + g + ki) % 4]);
                if (ks[ki] >= 200)
                    worst8 = fmin(worst8, w8);
                free_built(&b);
            }
    print_message("# int8 path: smallest worst error / fp32 bound over k >= 200: %.1f\n",
                  worst8);
    assert_true(worst8 > 10.0);   /* the int8 path is measurably less precise */
}

static void test_q8_0_int8(void **state)
{
    (void)state;
    const int64_t ms[] = {1, 4, 66};
    for (int i = 0; i < 3; i++) {
        built_t b = build(DSQ_WFMT_Q8_0, DSQ_ZP_SYM, 32, 19, 96 + 32 * i, i == 1);
        assert_true(check(&b, ms[i]) > 10.0);
        free_built(&b);
        built_t c = build(DSQ_WFMT_INT8, DSQ_ZP_SYM, 0, 21, 37 + 64 * i, i == 2);
        check(&c, ms[2 - i]);
        free_built(&c);
    }
}

/* Thread count does not change the result (static tiling). */
static void test_threads(void **state)
{
    (void)state;
    built_t b = build(DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 300, 576, false);
    const int64_t m = 9;
    float *x = malloc((size_t)(m * 576) * sizeof(float));
    float *y1 = malloc((size_t)(m * 300) * sizeof(float));
    float *y2 = malloc((size_t)(m * 300) * sizeof(float));
    for (int64_t i = 0; i < m * 576; i++)
        x[i] = rndf(-1.0f, 1.0f);
    int nt = dsq_cpu_get_threads();
    assert_int_equal(dsq_cpu_set_threads(1), DSQ_OK);
    assert_int_equal(dsq_cpu_matmul(y1, x, m, &b.w), DSQ_OK);
    assert_int_equal(dsq_cpu_set_threads(3), DSQ_OK);
    assert_int_equal(dsq_cpu_matmul(y2, x, m, &b.w), DSQ_OK);
    assert_int_equal(dsq_cpu_set_threads(nt), DSQ_OK);
    assert_memory_equal(y1, y2, (size_t)(m * 300) * sizeof(float));
    free(x); free(y1); free(y2);
    free_built(&b);
}

static void test_bad_input(void **state)
{
    (void)state;
    built_t b = build(DSQ_WFMT_INT4, DSQ_ZP_SYM, 32, 4, 64, false);
    float x[64] = {0}, y[4];
    b.w.act = (dsq_act_dtype_t)7;
    assert_int_equal(dsq_cpu_matmul(y, x, 1, &b.w), DSQ_EINVAL);
    b.w.act = DSQ_ACT_F32;
    assert_int_equal(dsq_cpu_matmul(NULL, x, 1, &b.w), DSQ_EINVAL);
    assert_int_equal(dsq_cpu_matmul(y, NULL, 1, &b.w), DSQ_EINVAL);
    assert_int_equal(dsq_cpu_matmul(y, x, -1, &b.w), DSQ_EINVAL);
    assert_int_equal(dsq_cpu_matmul(y, x, 0, &b.w), DSQ_OK);
    b.w.group_size = 48;
    assert_int_equal(dsq_cpu_matmul(y, x, 1, &b.w), DSQ_EINVAL);
    free_built(&b);
}

int main(void)
{
    detected = dsq_cpu_isa();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_q8_0_int8),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

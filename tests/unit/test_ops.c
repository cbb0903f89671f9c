/* tests for kernels/cpu/{rmsnorm,rope,swiglu,add,softmax}.c against
 * straightforward FP64 references written here, on random inputs with a
 * fixed seed. Each test prints its max abs error and states its tolerance.
 * The YaRN test also checks the frequency table against numbers worked out
 * by hand from transformers' _compute_yarn_parameters for a
 * DeepSeek-V2-Lite-like config. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/common/error.h"
#include "kernels.h"

#define PI_D 3.14159265358979323846

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)   /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(float a) { return (float)((urand() * 2.0 - 1.0) * a); }

static void fill(float *x, int64_t n, float a)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = frand(a);
}

static void report(const char *what, double err, double tol)
{
    printf("# %-28s max_abs_err=%.3e tol=%.1e\n", what, err, tol);
    assert_true(err <= tol);
}

/* ------------------------------------------------------------- rmsnorm */

static void test_rmsnorm(void **state)
{
    (void)state;
    const int64_t m = 7, n = 1000;
    float *x = malloc(sizeof(*x) * m * n), *y = malloc(sizeof(*y) * m * n);
    float *w = malloc(sizeof(*w) * n);
    fill(x, m * n, 3.0f);
    fill(w, n, 2.0f);
    const float eps = 1e-5f;
    assert_int_equal(dsq_cpu_rmsnorm(y, x, w, m, n, eps), DSQ_OK);
    double err = 0;
    for (int64_t i = 0; i < m; i++) {
        double ss = 0;
        for (int64_t j = 0; j < n; j++)
            ss += (double)x[i * n + j] * x[i * n + j];
        double r = 1.0 / sqrt(ss / n + eps);
        for (int64_t j = 0; j < n; j++)
            err = fmax(err, fabs(y[i * n + j] - x[i * n + j] * r * w[j]));
    }
    report("rmsnorm", err, 1e-5);
    /* in place gives the same */
    assert_int_equal(dsq_cpu_rmsnorm(x, x, w, m, n, eps), DSQ_OK);
    for (int64_t i = 0; i < m * n; i++)
        assert_true(x[i] == y[i]);
    assert_int_equal(dsq_cpu_rmsnorm(y, x, w, m, 0, eps), DSQ_EINVAL);
    free(x); free(y); free(w);
}

/* ---------------------------------------------------------------- rope */

/* Reference inv_freq in fp64, written out from the transformers / DeepSeek
 * formulas (not from the kernel's code path). */
static void ref_inv_freq(double *inv, int dim, double base, double factor,
                         int yarn, double orig, double bfast, double bslow)
{
    double low = 0, high = 0;
    if (yarn) {
        low = floor(dim * log(orig / (bfast * 2 * PI_D)) / (2 * log(base)));
        high = ceil(dim * log(orig / (bslow * 2 * PI_D)) / (2 * log(base)));
        low = fmax(low, 0);
        high = fmin(high, dim - 1);
        if (low == high)
            high += 0.001;
    }
    for (int i = 0; i < dim / 2; i++) {
        double pos_freq = pow(base, (2.0 * i) / dim);
        double extra = 1.0 / pos_freq, inter = 1.0 / (factor * pos_freq);
        if (!yarn) {
            inv[i] = inter;
            continue;
        }
        double ramp = fmin(fmax((i - low) / (high - low), 0), 1);
        double mask = 1.0 - ramp;
        inv[i] = inter * (1 - mask) + extra * mask;
    }
}

static double ref_rope_check(const dsq_rope_t *p, int n_heads, int head_dim,
                             const double *inv, double msc)
{
    const int m = 5;
    const int32_t pos[5] = {0, 1, 17, 4095, 163839};
    const int64_t n = (int64_t)m * n_heads * head_dim;
    float *x = malloc(sizeof(*x) * n), *x0 = malloc(sizeof(*x0) * n);
    fill(x0, n, 2.0f);
    for (int64_t i = 0; i < n; i++)
        x[i] = x0[i];
    assert_int_equal(dsq_cpu_rope(x, m, n_heads, head_dim, pos, p), DSQ_OK);
    double err = 0;
    const int half = p->rot_dim / 2;
    for (int r = 0; r < m; r++)
        for (int h = 0; h < n_heads; h++) {
            const float *a = x0 + ((int64_t)r * n_heads + h) * head_dim;
            const float *b = x + ((int64_t)r * n_heads + h) * head_dim;
            for (int d = 0; d < head_dim; d++) {
                double want;
                if (d >= p->rot_dim) {
                    want = a[d];
                } else {
                    int i, partner;
                    double sign;
                    if (p->neox) {
                        i = d < half ? d : d - half;
                        partner = d < half ? d + half : d - half;
                        sign = d < half ? -1 : 1;
                    } else {
                        i = d / 2;
                        partner = d ^ 1;
                        sign = (d & 1) ? 1 : -1;
                    }
                    double ang = pos[r] * inv[i];
                    want = msc * (a[d] * cos(ang) + sign * a[partner] * sin(ang));
                }
                err = fmax(err, fabs(b[d] - want));
            }
        }
    free(x); free(x0);
    return err;
}

static void test_rope_plain(void **state)
{
    (void)state;
    double inv[64];
    dsq_rope_t p;
    /* normal (adjacent) pairs, full rotation */
    assert_int_equal(dsq_rope_init(&p, 64, false, 10000.0, 0, 1.0, 0, 0, 0, 0, 0), DSQ_OK);
    ref_inv_freq(inv, 64, 10000.0, 1.0, 0, 0, 0, 0);
    report("rope normal", ref_rope_check(&p, 3, 64, inv, 1.0), 2e-5);
    /* neox halves, qwen2-like theta */
    assert_int_equal(dsq_rope_init(&p, 128, true, 1000000.0, 0, 1.0, 0, 0, 0, 0, 0), DSQ_OK);
    ref_inv_freq(inv, 128, 1000000.0, 1.0, 0, 0, 0, 0);
    report("rope neox", ref_rope_check(&p, 2, 128, inv, 1.0), 2e-5);
    /* partial rotation: 64 of 192 dims (DeepSeek-V2 q: nope 128 + rope 64
     * is laid out rope-last by the model; here the rotated dims are first) */
    assert_int_equal(dsq_rope_init(&p, 64, false, 10000.0, 0, 1.0, 0, 0, 0, 0, 0), DSQ_OK);
    ref_inv_freq(inv, 64, 10000.0, 1.0, 0, 0, 0, 0);
    report("rope partial normal", ref_rope_check(&p, 2, 192, inv, 1.0), 2e-5);
    p.neox = true;
    report("rope partial neox", ref_rope_check(&p, 2, 192, inv, 1.0), 2e-5);
    /* linear scaling, DeepSeek-Coder factor 4 */
    assert_int_equal(dsq_rope_init(&p, 128, true, 100000.0, 1, 4.0, 0, 0, 0, 0, 0), DSQ_OK);
    assert_true(p.freq_scale == 0.25f);
    ref_inv_freq(inv, 128, 100000.0, 4.0, 0, 0, 0, 0);
    report("rope linear x4", ref_rope_check(&p, 2, 128, inv, 1.0), 2e-5);
    /* bad arguments */
    float small[32] = {0};
    const int32_t pos0 = 0;
    assert_int_equal(dsq_cpu_rope(small, 1, 1, 32, &pos0, &p), DSQ_EINVAL);
    assert_int_equal(dsq_rope_init(&p, 63, false, 10000.0, 0, 1.0, 0, 0, 0, 0, 0), DSQ_EINVAL);
    assert_int_equal(dsq_rope_init(&p, 64, false, 10000.0, 2, 2.0, 4096, 0, 0, 0, 0),
                     DSQ_EUNSUPPORTED);
}

static void test_rope_yarn(void **state)
{
    (void)state;
    /* DeepSeek-V2-Lite: rope_theta 10000, factor 40, original 4096,
     * beta_fast 32, beta_slow 1, mscale = mscale_all_dim = 0.707,
     * qk_rope_head_dim 64. */
    dsq_rope_t p;
    assert_int_equal(dsq_rope_init(&p, 64, false, 10000.0, 3, 40.0, 4096, 32, 1,
                                   0.707, 0.707), DSQ_OK);
    /* By hand: corr(r) = 64 ln(4096 / (2 pi r)) / (2 ln 10000);
     * corr(32) = 10.4722 -> floor 10, corr(1) = 22.5134 -> ceil 23. */
    double dims[2];
    dsq_rope_corr_dims(&p, dims);
    printf("# yarn corr dims %.1f %.1f (want 10 23)\n", dims[0], dims[1]);
    assert_true(dims[0] == 10.0 && dims[1] == 23.0);
    /* mscale / mscale_all_dim equal -> attention_factor exactly 1;
     * softmax multiplier (0.1*0.707*ln 40 + 1)^2 with 0.1*0.707*ln 40 + 1 =
     * 1.2608037774 */
    assert_true(fabs(p.attn_factor - 1.0f) < 1e-7);
    assert_true(fabs(dsq_rope_yarn_mscale(40.0, 0.707) - 1.2608037774) < 1e-9);
    assert_true(dsq_rope_yarn_mscale(1.0, 0.707) == 1.0);

    double inv_k[32];
    dsq_rope_inv_freq(&p, inv_k);
    /* Pairs below low are pure extrapolation, above high pure
     * interpolation, in between the linear ramp: spot values by hand. */
    double want0 = 1.0;
    double want31 = pow(10000.0, -62.0 / 64) / 40.0;
    double e16 = pow(10000.0, -32.0 / 64);      /* 0.01 */
    double want16 = e16 / 40.0 * (6.0 / 13) + e16 * (7.0 / 13);
    printf("# yarn inv_freq[0]=%.9g [16]=%.9g [31]=%.9g\n", inv_k[0], inv_k[16], inv_k[31]);
    assert_true(fabs(inv_k[0] - want0) <= 1e-7 * want0);
    assert_true(fabs(inv_k[16] - want16) <= 1e-6 * want16);
    assert_true(fabs(inv_k[31] - want31) <= 1e-6 * want31);

    double inv[32];
    ref_inv_freq(inv, 64, 10000.0, 40.0, 1, 4096, 32, 1);
    double ferr = 0;
    for (int i = 0; i < 32; i++)
        ferr = fmax(ferr, fabs(inv_k[i] - inv[i]) / inv[i]);
    report("yarn inv_freq (relative)", ferr, 1e-6);
    report("rope yarn normal", ref_rope_check(&p, 4, 64, inv, 1.0), 2e-5);
    /* a config with mscale != mscale_all_dim: attention_factor =
     * (0.1*1*ln 40 + 1)/(0.1*0.707*ln 40 + 1) on cos and sin */
    assert_int_equal(dsq_rope_init(&p, 64, true, 10000.0, 3, 40.0, 4096, 32, 1,
                                   1.0, 0.707), DSQ_OK);
    double af = (0.1 * log(40.0) + 1) / (0.1 * 0.707 * log(40.0) + 1);
    assert_true(fabs(p.attn_factor - af) < 1e-6);
    report("rope yarn neox mscale", ref_rope_check(&p, 2, 64, inv, af), 3e-5);
}

/* -------------------------------------------------- swiglu, add, softmax */

static void test_swiglu(void **state)
{
    (void)state;
    const int64_t m = 3, n = 777;
    float *g = malloc(sizeof(*g) * m * n), *u = malloc(sizeof(*u) * m * n);
    float *o = malloc(sizeof(*o) * m * n);
    fill(g, m * n, 8.0f);
    fill(u, m * n, 2.0f);
    g[0] = -200.0f;
    g[1] = 200.0f;
    assert_int_equal(dsq_cpu_swiglu(o, g, u, m, n), DSQ_OK);
    double err = 0;
    for (int64_t i = 0; i < m * n; i++) {
        double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        err = fmax(err, fabs(o[i] - want));
    }
    report("swiglu", err, 1e-5 * 16);
    assert_false(isnan(o[0]));
    /* aliasing out == gate */
    assert_int_equal(dsq_cpu_swiglu(g, g, u, m, n), DSQ_OK);
    for (int64_t i = 0; i < m * n; i++)
        assert_true(g[i] == o[i]);
    free(g); free(u); free(o);
}

static void test_add(void **state)
{
    (void)state;
    const int64_t n = 1001;
    float *x = malloc(sizeof(*x) * n), *y = malloc(sizeof(*y) * n);
    double *want = malloc(sizeof(*want) * n);
    fill(x, n, 5.0f);
    fill(y, n, 5.0f);
    for (int64_t i = 0; i < n; i++)
        want[i] = (double)x[i] + y[i];
    assert_int_equal(dsq_cpu_add(y, x, n), DSQ_OK);
    double err = 0;
    for (int64_t i = 0; i < n; i++)
        err = fmax(err, fabs(y[i] - want[i]));
    report("add", err, 1e-6);
    free(x); free(y); free(want);
}

static void test_softmax(void **state)
{
    (void)state;
    const int64_t m = 4, n = 50000;
    float *x = malloc(sizeof(*x) * m * n);
    double *x0 = malloc(sizeof(*x0) * m * n);
    fill(x, m * n, 20.0f);
    x[5] = 1000.0f;                 /* would overflow without max-subtract */
    for (int64_t j = 0; j < n; j++)  /* row 3: fully masked */
        x[3 * n + j] = -INFINITY;
    for (int64_t i = 0; i < m * n; i++)
        x0[i] = x[i];
    assert_int_equal(dsq_cpu_softmax(x, m, n), DSQ_OK);
    double err = 0;
    for (int64_t i = 0; i < 3; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; j++)
            mx = fmax(mx, x0[i * n + j]);
        for (int64_t j = 0; j < n; j++)
            sum += exp(x0[i * n + j] - mx);
        double rsum = 0;
        for (int64_t j = 0; j < n; j++) {
            err = fmax(err, fabs(x[i * n + j] - exp(x0[i * n + j] - mx) / sum));
            rsum += x[i * n + j];
        }
        assert_true(fabs(rsum - 1.0) < 1e-4);
    }
    report("softmax", err, 1e-6);
    for (int64_t j = 0; j < n; j++)
        assert_true(x[3 * n + j] == 0.0f);
    free(x); free(x0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope_plain),
        cmocka_unit_test(test_rope_yarn),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_softmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

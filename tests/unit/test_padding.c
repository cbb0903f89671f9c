/* tests for engine/serve/padding.c: bucket choices on small stated models (the
 * expected times are computed by hand in the comments), the least-squares
 * fit against known constants, the JSON file round trip and its errors.
 *
 * Reference values: x = pad_ratio^1.8 for the ratios used below
 *   (24/32)^1.8 = 0.595813   (12/32)^1.8 = 0.171102   (20/32)^1.8 = 0.429125
 *   (4/8)^1.8   = 0.287175   (2/8)^1.8   = 0.082469   (1/8)^1.8   = 0.023683
 *   (1/32)^1.8  = 2^-9 = 0.001953   (2/32)^1.8 = 2^-7.2 = 0.006852 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/serve/padding.h"

/* base(b) = 100 + 10·b (two points, one segment), k as given, no eager. */
static dsq_pad_model_t linear_model(double k)
{
    dsq_pad_model_t m;
    memset(&m, 0, sizeof(m));
    m.exponent = DSQ_PAD_EXPONENT;
    m.k_us = k;
    m.n_base = 2;
    m.base[0] = (dsq_pad_point_t){1, 110.0};
    m.base[1] = (dsq_pad_point_t){64, 740.0};
    return m;
}

static void test_cost_and_curve(void **state)
{
    (void)state;
    dsq_pad_model_t m = linear_model(400.0);
    double t = 0;
    /* b=20 in 32: 300 + 400·0.171102 = 368.441 */
    assert_int_equal(dsq_pad_cost(&m, 20, 32, &t), 0);
    assert_true(fabs(t - 368.441) < 1e-3);
    /* no padding: base only */
    assert_int_equal(dsq_pad_cost(&m, 8, 8, &t), 0);
    assert_true(fabs(t - 180.0) < 1e-9);
    /* beyond the last point the last segment extrapolates: 100 + 10·100 */
    assert_true(fabs(dsq_pad_base(&m, 100) - 1100.0) < 1e-9);
    assert_int_equal(dsq_pad_cost(&m, 0, 8, &t), DSQ_EINVAL);
    assert_int_equal(dsq_pad_cost(&m, 9, 8, &t), DSQ_EINVAL);

    /* below the first point: the first value; a falling curve clamps at 0 */
    dsq_pad_model_t d = linear_model(0);
    d.base[0] = (dsq_pad_point_t){4, 100.0};
    d.base[1] = (dsq_pad_point_t){8, 20.0};
    assert_true(fabs(dsq_pad_base(&d, 1) - 100.0) < 1e-9);
    assert_true(fabs(dsq_pad_base(&d, 6) - 60.0) < 1e-9);
    assert_true(dsq_pad_base(&d, 100) == 0.0);
}

static int rows_of(const dsq_pad_plan_t *p)
{
    int n = 0;
    for (int i = 0; i < p->n_groups; i++)
        n += p->groups[i].n_real * p->groups[i].count;
    return n;
}

static void test_choose_hand(void **state)
{
    (void)state;
    const int bk[] = {32, 8};
    dsq_pad_plan_t p;
    dsq_pad_model_t m = linear_model(400.0);

    /* b=8: bucket 8 = 180; bucket 32 = 180 + 400·0.595813 = 418.33;
     * 4+4 in two 8s = 2·(140 + 400·0.287175) = 509.74  -> bucket 8 */
    assert_int_equal(dsq_pad_choose(&m, 8, bk, 2, &p), 0);
    assert_false(p.eager);
    assert_int_equal(p.n_groups, 1);
    assert_int_equal(p.groups[0].bucket, 8);
    assert_int_equal(p.n_padded, 0);
    assert_true(fabs(p.cost_us - 180.0) < 1e-9);

    /* b=20: bucket 32 = 368.44; 8+8+(4 in 8) = 180+180+254.87 = 614.87 */
    assert_int_equal(dsq_pad_choose(&m, 20, bk, 2, &p), 0);
    assert_int_equal(p.n_launches, 1);
    assert_int_equal(p.groups[0].bucket, 32);
    assert_int_equal(p.n_padded, 12);
    assert_true(fabs(p.cost_us - 368.441) < 1e-3);

    /* b=40 (docs/architecture.md's example): 32 + 8 = 420 + 180 = 600; 5 x 8 = 900;
     * 20+20 in two 32s = 2·(300 + 68.44) = 736.9                 -> 32 + 8 */
    assert_int_equal(dsq_pad_choose(&m, 40, bk, 2, &p), 0);
    assert_int_equal(p.n_launches, 2);
    assert_int_equal(p.n_groups, 2);
    assert_int_equal(p.groups[0].bucket, 32);
    assert_int_equal(p.groups[0].n_real, 32);
    assert_int_equal(p.groups[1].bucket, 8);
    assert_int_equal(p.groups[1].n_real, 8);
    assert_true(fabs(p.cost_us - 600.0) < 1e-9);

    /* b=100 > largest bucket: 31+31+30 in 32s + 8 in 8 =
     * 410+410+400+180 + 400·(2·0.001953 + 0.006852) = 1404.28, cheaper than
     * 32+32+32+(4 in 8) = 1260 + 140 + 114.87 = 1514.87 */
    assert_int_equal(dsq_pad_choose(&m, 100, bk, 2, &p), 0);
    assert_int_equal(rows_of(&p), 100);
    assert_int_equal(p.n_launches, 4);
    assert_int_equal(p.n_groups, 3);
    assert_int_equal(p.groups[0].bucket, 32);
    assert_int_equal(p.groups[0].n_real, 31);
    assert_int_equal(p.groups[0].count, 2);
    assert_int_equal(p.groups[1].n_real, 30);
    assert_int_equal(p.groups[2].bucket, 8);
    assert_true(fabs(p.cost_us - 1404.283) < 1e-3);

    /* k = 2000, b=12: bucket 32 = 220 + 2000·0.429125 = 1078.25;
     * 8 + (4 in 8) = 320 + 2000·0.287175 = 894.35;
     * 7 + 5 in two 8s = 320 + 2000·(0.023683 + 0.171102) = 709.57;
     * 6 + 6 in two 8s = 2·(160 + 2000·0.082469) = 649.88   -> 6 + 6 */
    m = linear_model(2000.0);
    assert_int_equal(dsq_pad_choose(&m, 12, bk, 2, &p), 0);
    assert_int_equal(p.n_groups, 1);
    assert_int_equal(p.groups[0].bucket, 8);
    assert_int_equal(p.groups[0].n_real, 6);
    assert_int_equal(p.groups[0].count, 2);
    assert_int_equal(p.n_padded, 4);
    assert_true(fabs(p.cost_us - 649.877) < 1e-3);

    /* k < 0 (padding measured as faster): the largest bucket wins,
     * b=8: bucket 32 = 180 - 50·0.595813 = 150.21 < 180 */
    m = linear_model(-50.0);
    assert_int_equal(dsq_pad_choose(&m, 8, bk, 2, &p), 0);
    assert_int_equal(p.groups[0].bucket, 32);
    assert_true(fabs(p.cost_us - 150.209) < 1e-3);
}

static void test_choose_ties(void **state)
{
    (void)state;
    dsq_pad_plan_t p;
    /* base(b) = 10·b, k = 0: b=40 over {8, 32, 64} costs 400 whichever
     * way (64; 32 + 8; 5 x 8): fewest launches wins -> one 64 */
    dsq_pad_model_t m = linear_model(0.0);
    m.base[0] = (dsq_pad_point_t){1, 10.0};
    m.base[1] = (dsq_pad_point_t){64, 640.0};
    const int bk[] = {8, 32, 64, 8};            /* duplicates are fine */
    assert_int_equal(dsq_pad_choose(&m, 40, bk, 4, &p), 0);
    assert_int_equal(p.n_launches, 1);
    assert_int_equal(p.groups[0].bucket, 64);
    assert_true(fabs(p.cost_us - 400.0) < 1e-9);

    /* flat base 100, k = 0: b=16 in 16 or 32 both 100, one launch each:
     * fewer padding rows -> 16 */
    m.base[0] = (dsq_pad_point_t){1, 100.0};
    m.base[1] = (dsq_pad_point_t){64, 100.0};
    const int bk2[] = {32, 16, 8};
    assert_int_equal(dsq_pad_choose(&m, 16, bk2, 3, &p), 0);
    assert_int_equal(p.groups[0].bucket, 16);
    assert_int_equal(p.n_padded, 0);
}

static void test_choose_eager(void **state)
{
    (void)state;
    const int bk[] = {8, 32};
    dsq_pad_plan_t p;
    /* graph: base 100 + 10·b, k = 400; eager(b) = 50 + 15·b */
    dsq_pad_model_t m = linear_model(400.0);
    m.n_eager = 2;
    m.eager[0] = (dsq_pad_point_t){1, 65.0};
    m.eager[1] = (dsq_pad_point_t){64, 1010.0};
    /* b=8: eager 170 < bucket 8 = 180 */
    assert_int_equal(dsq_pad_choose(&m, 8, bk, 2, &p), 0);
    assert_true(p.eager);
    assert_int_equal(p.n_launches, 1);
    assert_int_equal(p.groups[0].bucket, 8);
    assert_int_equal(p.groups[0].n_real, 8);
    assert_true(fabs(p.cost_us - 170.0) < 1e-9);
    /* b=20: eager 350 < bucket 32 = 368.44 */
    assert_int_equal(dsq_pad_choose(&m, 20, bk, 2, &p), 0);
    assert_true(p.eager);
    /* b=32: bucket 32 = 420 < eager 530 */
    assert_int_equal(dsq_pad_choose(&m, 32, bk, 2, &p), 0);
    assert_false(p.eager);
    assert_true(fabs(p.cost_us - 420.0) < 1e-9);
    /* tie with an unpadded single launch: the graph plan */
    m.eager[0] = m.base[0];
    m.eager[1] = m.base[1];
    assert_int_equal(dsq_pad_choose(&m, 8, bk, 2, &p), 0);
    assert_false(p.eager);
    /* eager also carries batches of any size; b=40 graph = 600, eager 500 */
    assert_int_equal(dsq_pad_choose(&m, 40, bk, 2, &p), 0);
    assert_true(p.eager);
}

static void test_choose_errors(void **state)
{
    (void)state;
    dsq_pad_model_t m = linear_model(400.0);
    dsq_pad_plan_t p;
    const int bk[] = {8, 32}, bad[] = {8, 0};
    assert_int_equal(dsq_pad_choose(&m, 0, bk, 2, &p), DSQ_EINVAL);
    assert_int_equal(dsq_pad_choose(&m, -3, bk, 2, &p), DSQ_EINVAL);
    assert_int_equal(dsq_pad_choose(&m, 4, bk, 0, &p), DSQ_EINVAL);
    assert_int_equal(dsq_pad_choose(&m, 4, bad, 2, &p), DSQ_EINVAL);
    assert_int_equal(dsq_pad_choose(&m, 4, NULL, 2, &p), DSQ_EINVAL);
    assert_int_equal(dsq_pad_choose(NULL, 4, bk, 2, &p), DSQ_EINVAL);
    assert_int_equal(dsq_pad_choose(&m, DSQ_PAD_MAX_BATCH + 1, bk, 2, &p), DSQ_ERANGE);
    int many[DSQ_PAD_MAX_BUCKETS + 1];
    for (int i = 0; i <= DSQ_PAD_MAX_BUCKETS; i++)
        many[i] = i + 1;
    assert_int_equal(dsq_pad_choose(&m, 4, many, DSQ_PAD_MAX_BUCKETS + 1, &p), DSQ_EINVAL);
    /* the largest batch works and covers every row */
    assert_int_equal(dsq_pad_choose(&m, DSQ_PAD_MAX_BATCH, bk, 2, &p), 0);
    assert_int_equal(rows_of(&p), DSQ_PAD_MAX_BATCH);
}

/* ------------------------------------------------------------ fit */

static const int grid_b[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
static const int grid_bk[] = {1, 2, 4, 8, 16, 32, 64};

static uint32_t rng_state;
static double uniform(void)           /* [0, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (double)(rng_state >> 8) / 16777216.0;
}

/* samples of t = 1000 + 50·b + 800·x(b, B) + noise, noise in [-amp, amp] */
static int make_samples(dsq_pad_sample_t *s, double amp)
{
    int n = 0;
    rng_state = 7;
    for (size_t i = 0; i < sizeof(grid_b) / sizeof(grid_b[0]); i++)
        for (size_t j = 0; j < sizeof(grid_bk) / sizeof(grid_bk[0]); j++) {
            int b = grid_b[i], B = grid_bk[j];
            if (B < b)
                continue;
            double x = pow((double)(B - b) / B, 1.8);
            s[n++] = (dsq_pad_sample_t){b, B, 1000.0 + 50.0 * b + 800.0 * x +
                                              amp * (2.0 * uniform() - 1.0)};
        }
    return n;
}

static void test_fit_exact(void **state)
{
    (void)state;
    dsq_pad_sample_t s[128];
    int n = make_samples(s, 0.0);
    dsq_pad_model_t m;
    memset(&m, 0, sizeof(m));
    char err[256] = "";
    assert_int_equal(dsq_pad_fit(s, n, &m, err, sizeof(err)), 0);
    assert_true(fabs(m.k_us - 800.0) < 1e-6);
    assert_int_equal(m.n_base, 12);
    for (int i = 0; i < m.n_base; i++) {
        assert_int_equal(m.base[i].b, grid_b[i]);
        assert_true(fabs(m.base[i].us - (1000.0 + 50.0 * grid_b[i])) < 1e-6);
    }
    assert_true(m.exponent == DSQ_PAD_EXPONENT);
    assert_int_equal(m.fit.n_samples, n);
    assert_true(m.fit.rms_us < 1e-6);
    assert_true(fabs(m.fit.r2 - 1.0) < 1e-12);
    assert_true(fabs(m.fit.r2_pad - 1.0) < 1e-12);
}

static void test_fit_noise(void **state)
{
    (void)state;
    const double amp = 20.0;           /* us, bounded noise */
    dsq_pad_sample_t s[128];
    int n = make_samples(s, amp);
    dsq_pad_model_t m;
    memset(&m, 0, sizeof(m));
    char err[256] = "";
    assert_int_equal(dsq_pad_fit(s, n, &m, err, sizeof(err)), 0);
    /* k's error is a weighted sum of the noise: |dk| <= amp · Σ|x - x̄_b| /
     * Σ(x - x̄_b)². Computed here independently of the fit code. */
    double sum_abs = 0, sxx = 0;
    for (size_t i = 0; i < sizeof(grid_b) / sizeof(grid_b[0]); i++) {
        double xs[8], mean = 0;
        int c = 0;
        for (size_t j = 0; j < sizeof(grid_bk) / sizeof(grid_bk[0]); j++)
            if (grid_bk[j] >= grid_b[i])
                mean += xs[c++] = pow((double)(grid_bk[j] - grid_b[i]) / grid_bk[j], 1.8);
        mean /= c;
        for (int q = 0; q < c; q++) {
            sum_abs += fabs(xs[q] - mean);
            sxx += (xs[q] - mean) * (xs[q] - mean);
        }
    }
    double dk_max = amp * sum_abs / sxx;
    print_message("# k = %.2f (true 800, bound +-%.2f), r2 = %.5f, rms = %.2f us\n", m.k_us,
                  dk_max, m.fit.r2, m.fit.rms_us);
    assert_true(fabs(m.k_us - 800.0) <= dk_max);
    assert_true(fabs(m.k_us - 800.0) < 0.05 * 800.0);
    /* base(b) = mean(t - k·x): off by at most amp + |dk|·max x̄ <= amp + |dk| */
    for (int i = 0; i < m.n_base; i++)
        assert_true(fabs(m.base[i].us - (1000.0 + 50.0 * m.base[i].b)) <=
                    amp + fabs(m.k_us - 800.0) + 1e-9);
    assert_true(m.fit.max_abs_us <= 2.0 * amp + 2.0 * dk_max);
    assert_true(m.fit.rms_us <= amp);
    assert_true(m.fit.r2 > 0.99 && m.fit.r2 <= 1.0);
    assert_int_equal(m.fit.n_base_clamped, 0);
}

/* Against numpy.linalg.lstsq on data the model does not fit exactly
 * (tests/golden/padding_fit.txt, made by tests/ref/make_padding_golden.py). */
static bool close_to(double a, double b)
{
    return fabs(a - b) <= 1e-6 * fmax(1.0, fabs(b));
}

static void test_fit_golden(void **state)
{
    (void)state;
    const char *root = getenv("DSQ_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/golden/padding_fit.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("golden file missing: %s", path);
    static dsq_pad_sample_t s[256];
    dsq_pad_point_t want_base[DSQ_PAD_MAX_POINTS];
    int n = 0, n_base = 0;
    double k = NAN, r2 = NAN, r2_pad = NAN, rms = NAN, max_abs = NAN;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        int b, B;
        double v;
        if (sscanf(line, "sample: %d %d %lf", &b, &B, &v) == 3 && n < 256)
            s[n++] = (dsq_pad_sample_t){b, B, v};
        else if (sscanf(line, "base: %d %lf", &b, &v) == 2 && n_base < DSQ_PAD_MAX_POINTS)
            want_base[n_base++] = (dsq_pad_point_t){b, v};
        else {
            sscanf(line, "k_us: %lf", &k);
            sscanf(line, "r2: %lf", &r2);
            sscanf(line, "r2_pad: %lf", &r2_pad);
            sscanf(line, "rms_us: %lf", &rms);
            sscanf(line, "max_abs_us: %lf", &max_abs);
        }
    }
    fclose(f);
    assert_int_equal(n, 48);
    dsq_pad_model_t m;
    memset(&m, 0, sizeof(m));
    char err[256] = "";
    assert_int_equal(dsq_pad_fit(s, n, &m, err, sizeof(err)), 0);
    print_message("# k = %.3f (numpy %.3f), r2 = %.6f (numpy %.6f)\n", m.k_us, k, m.fit.r2, r2);
    assert_true(close_to(m.k_us, k));
    assert_true(close_to(m.fit.r2, r2));
    assert_true(close_to(m.fit.r2_pad, r2_pad));
    assert_true(close_to(m.fit.rms_us, rms));
    assert_true(close_to(m.fit.max_abs_us, max_abs));
    assert_int_equal(m.n_base, n_base);
    int n_neg = 0;
    for (int i = 0; i < n_base; i++) {
        assert_int_equal(m.base[i].b, want_base[i].b);
        n_neg += want_base[i].us < 0;
        assert_true(close_to(m.base[i].us, want_base[i].us < 0 ? 0.0 : want_base[i].us));
    }
    assert_int_equal(m.fit.n_base_clamped, n_neg);
}

/* A base(b) that comes out negative is stored as 0 and counted:
 * b=1: t = 10 at pad 0 and 1010 at pad 1/2 -> k = 1000 / 0.287175 =
 * 3482.2, base(1) = 10; b=4 measured once, in bucket 8 (pad 1/2, t = 50):
 * base(4) = 50 - 1000 = -950 -> 0. */
static void test_fit_clamp(void **state)
{
    (void)state;
    dsq_pad_sample_t s[] = {{4, 8, 50.0}, {1, 1, 10.0}, {1, 2, 1010.0}};
    dsq_pad_model_t m;
    memset(&m, 0, sizeof(m));
    char err[256] = "";
    assert_int_equal(dsq_pad_fit(s, 3, &m, err, sizeof(err)), 0);
    assert_true(fabs(m.k_us - 1000.0 / pow(0.5, 1.8)) < 1e-6);
    assert_int_equal(m.n_base, 2);
    assert_int_equal(m.base[0].b, 1);
    assert_true(fabs(m.base[0].us - 10.0) < 1e-9);
    assert_int_equal(m.base[1].b, 4);
    assert_true(m.base[1].us == 0.0);
    assert_int_equal(m.fit.n_base_clamped, 1);
    assert_true(m.fit.rms_us < 1e-9);              /* the unclamped solution is exact */
}

static void test_fit_errors(void **state)
{
    (void)state;
    dsq_pad_model_t m;
    memset(&m, 0, sizeof(m));
    char err[256] = "";
    dsq_pad_sample_t bad_b[] = {{4, 8, 10.0}, {9, 8, 10.0}};
    assert_int_equal(dsq_pad_fit(bad_b, 2, &m, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "b=9"));
    dsq_pad_sample_t neg[] = {{4, 8, 10.0}, {4, 4, -1.0}};
    assert_int_equal(dsq_pad_fit(neg, 2, &m, err, sizeof(err)), DSQ_EINVAL);
    dsq_pad_sample_t nan_t[] = {{4, 8, 10.0}, {4, 4, NAN}};
    assert_int_equal(dsq_pad_fit(nan_t, 2, &m, err, sizeof(err)), DSQ_EINVAL);
    /* every b measured in its own bucket only: k is not identifiable */
    dsq_pad_sample_t flat[] = {{4, 4, 10.0}, {8, 8, 20.0}, {16, 16, 30.0}};
    assert_int_equal(dsq_pad_fit(flat, 3, &m, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "identifiable"));
    assert_int_equal(dsq_pad_fit(flat, 1, &m, err, sizeof(err)), DSQ_EINVAL);
    assert_int_equal(dsq_pad_fit(NULL, 3, &m, err, sizeof(err)), DSQ_EINVAL);
    /* more than DSQ_PAD_MAX_POINTS distinct batch sizes */
    dsq_pad_sample_t many[2 * (DSQ_PAD_MAX_POINTS + 1)];
    for (int i = 0; i <= DSQ_PAD_MAX_POINTS; i++) {
        many[2 * i] = (dsq_pad_sample_t){i + 1, i + 1, 10.0};
        many[2 * i + 1] = (dsq_pad_sample_t){i + 1, 2 * i + 2, 20.0};
    }
    assert_int_equal(dsq_pad_fit(many, 2 * (DSQ_PAD_MAX_POINTS + 1), &m, err, sizeof(err)),
                     DSQ_EINVAL);
}

/* ------------------------------------------------------------ JSON, files */

static char tmpdir[256];

static int setup_tmp(void **state)
{
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/dsq_test_padding_XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static dsq_pad_model_t full_model(void)
{
    dsq_pad_model_t m = linear_model(123.456789012345);
    strcpy(m.backend, "cpu");
    strcpy(m.machine, "Test CPU \"quoted\"");
    strcpy(m.date, "2026-11-30T12:00:00Z");
    strcpy(m.model_name, "tiny.gguf");
    m.threads = 2;
    m.context = 128;
    m.base[1].us = 740.0 / 3.0;                  /* needs 17 digits */
    m.n_eager = 1;
    m.eager[0] = (dsq_pad_point_t){4, 99.5};
    m.fit = (dsq_pad_fit_stats_t){43, 1, 0.987654321, 0.5, 12.25, 40.0};
    return m;
}

static void test_json_round_trip(void **state)
{
    (void)state;
    dsq_pad_model_t m = full_model(), r;
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/sub/dir/padding-cpu.json", tmpdir);
    assert_int_equal(dsq_pad_model_save(&m, path, err, sizeof(err)), 0);
    memset(&r, 0xab, sizeof(r));
    assert_int_equal(dsq_pad_model_load(&r, path, err, sizeof(err)), 0);
    assert_string_equal(r.backend, "cpu");
    assert_string_equal(r.machine, m.machine);
    assert_string_equal(r.date, m.date);
    assert_string_equal(r.model_name, "tiny.gguf");
    assert_int_equal(r.threads, 2);
    assert_int_equal(r.context, 128);
    assert_true(r.k_us == m.k_us);
    assert_true(r.exponent == DSQ_PAD_EXPONENT);
    assert_int_equal(r.n_base, 2);
    assert_true(r.base[1].us == m.base[1].us);    /* exact: 17 significant digits */
    assert_int_equal(r.base[1].b, 64);
    assert_int_equal(r.n_eager, 1);
    assert_true(r.eager[0].us == 99.5);
    assert_int_equal(r.fit.n_samples, 43);
    assert_int_equal(r.fit.n_base_clamped, 1);
    assert_true(r.fit.r2 == m.fit.r2);
    assert_true(r.fit.max_abs_us == 40.0);

    /* an invalid model is not written */
    m.base[1].b = 1;
    assert_int_equal(dsq_pad_model_save(&m, path, err, sizeof(err)), DSQ_EFORMAT);
    assert_int_equal(dsq_pad_model_load(&r, path, err, sizeof(err)), 0);
    assert_int_equal(r.base[1].b, 64);
}

/* A path that is not a regular file is written in place: saving to a
 * FIFO (as `--out /dev/null` would to a device) leaves the FIFO a FIFO,
 * and what came through it loads; renaming over it would have replaced
 * the node, and a directory is refused with a reason. */
static void test_save_in_place(void **state)
{
    (void)state;
    dsq_pad_model_t m = full_model(), r;
    char fifo[512], got[512], err[512] = "";
    snprintf(fifo, sizeof(fifo), "%s/pipe", tmpdir);
    snprintf(got, sizeof(got), "%s/through-pipe.json", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the reader: the FIFO's bytes into a regular file */
        FILE *in = fopen(fifo, "rb"), *out = fopen(got, "wb");
        char buf[4096];
        size_t n;
        if (!in || !out)
            _exit(1);
        while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
            if (fwrite(buf, 1, n, out) != n)
                _exit(1);
        _exit(fclose(out) == 0 ? 0 : 1);
    }
    const int rc = dsq_pad_model_save(&m, fifo, err, sizeof(err));
    struct stat st;
    const bool still_fifo = stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode);
    if (rc != 0 || !still_fifo)
        kill(pid, SIGKILL);     /* its FIFO was replaced: it would wait forever */
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(rc, 0);
    assert_true(still_fifo);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(dsq_pad_model_load(&r, got, err, sizeof(err)), 0);
    assert_true(r.base[1].us == m.base[1].us);
    char left[600];
    snprintf(left, sizeof(left), "%s.tmp.%ld", fifo, (long)getpid());
    assert_int_equal(access(left, F_OK), -1);           /* no temporary left */
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(unlink(got), 0);
    /* a directory: a reason, nothing replaced */
    assert_int_equal(dsq_pad_model_save(&m, tmpdir, err, sizeof(err)), DSQ_EIO);
    assert_non_null(strstr(err, "is a directory"));
    assert_int_equal(stat(tmpdir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
}

static void test_json_errors(void **state)
{
    (void)state;
    static const struct { const char *text, *want; } cases[] = {
        {"{not json", "not valid JSON"},
        {"[1, 2]", "JSON object"},
        {"{\"format\": \"other\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2]]}", "format"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 2, \"k_us\": 1, \"base\": [[1, 2]]}",
         "version"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"base\": [[1, 2]]}",
         "\"k_us\" is missing"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": \"9\", \"base\": [[1, 2]]}",
         "\"k_us\" must be a finite number"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1}", "\"base\" is missing"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": []}",
         "\"base\" needs"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": {}}",
         "\"base\" must be an array"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[0, 2]]}",
         "\"base\" entries"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1.5, 2]]}",
         "\"base\" entries"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2, 3]]}",
         "\"base\" entries"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, "
         "\"base\": [[4, 2], [2, 3]]}", "increasing"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, -2]]}",
         "times >= 0"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2]], "
         "\"eager\": [[1, \"x\"]]}", "\"eager\" entries"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2]], "
         "\"exponent\": 0}", "exponent"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2]], "
         "\"threads\": -1}", "\"threads\""},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2]], "
         "\"backend\": 7}", "\"backend\" must be a string"},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2]], "
         "\"fit\": 3}", "\"fit\""},
        {"{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [[1, 2]], "
         "\"fit\": {\"r2\": \"high\"}}", "\"r2\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dsq_pad_model_t m = linear_model(5.0);
        char err[512] = "";
        int rc = dsq_pad_model_parse(&m, cases[i].text, strlen(cases[i].text), err,
                                     sizeof(err));
        if (rc != DSQ_EFORMAT || !strstr(err, cases[i].want))
            fail_msg("case %zu: rc %d err \"%s\", wanted \"%s\"", i, rc, err, cases[i].want);
        assert_true(m.k_us == 5.0);               /* untouched on failure */
    }
    /* more than 64 points */
    char big[4096];
    int n = snprintf(big, sizeof(big),
                     "{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1, \"base\": [");
    for (int i = 1; i <= DSQ_PAD_MAX_POINTS + 1; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, "%s[%d, 1]", i > 1 ? "," : "", i);
    snprintf(big + n, sizeof(big) - (size_t)n, "]}");
    dsq_pad_model_t m;
    char err[512] = "";
    assert_int_equal(dsq_pad_model_parse(&m, big, strlen(big), err, sizeof(err)), DSQ_EFORMAT);
    /* minimal valid file: defaults for the optional keys */
    const char *ok = "{\"format\": \"dsq-padding-model\", \"version\": 1, \"k_us\": 1.5, "
                     "\"base\": [[1, 2]]}";
    assert_int_equal(dsq_pad_model_parse(&m, ok, strlen(ok), err, sizeof(err)), 0);
    assert_true(m.exponent == DSQ_PAD_EXPONENT);
    assert_int_equal(m.n_eager, 0);
    assert_string_equal(m.backend, "");
}

static void test_files(void **state)
{
    (void)state;
    dsq_pad_model_t m;
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/missing.json", tmpdir);
    assert_int_equal(dsq_pad_model_load(&m, path, err, sizeof(err)), DSQ_ENOTFOUND);
    assert_non_null(strstr(err, "missing.json"));
    assert_int_equal(dsq_pad_model_load(&m, tmpdir, err, sizeof(err)), DSQ_EIO);
    snprintf(path, sizeof(path), "%s/bad.json", tmpdir);
    write_file(path, "{\"format\": \"dsq-padding-model\", \"version\": 1}");
    assert_int_equal(dsq_pad_model_load(&m, path, err, sizeof(err)), DSQ_EFORMAT);
    assert_non_null(strstr(err, "bad.json"));
    assert_non_null(strstr(err, "k_us"));

    /* default path: $XDG_CACHE_HOME first, then $HOME/.cache */
    char def[512];
    setenv("XDG_CACHE_HOME", tmpdir, 1);
    assert_int_equal(dsq_pad_default_path("cpu", def, sizeof(def)), 0);
    snprintf(path, sizeof(path), "%s/dsq/padding-cpu.json", tmpdir);
    assert_string_equal(def, path);
    assert_int_equal(dsq_pad_default_path("cpu", def, 8), DSQ_ERANGE);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/nonexistent-home", 1);
    assert_int_equal(dsq_pad_default_path("cuda", def, sizeof(def)), 0);
    assert_string_equal(def, "/nonexistent-home/.cache/dsq/padding-cuda.json");
    unsetenv("HOME");
    assert_int_equal(dsq_pad_default_path("cpu", def, sizeof(def)), DSQ_ENOTFOUND);

    /* engine start-up: no default file -> nothing, no error */
    dsq_pad_model_t *out = (dsq_pad_model_t *)1;
    assert_int_equal(dsq_pad_model_open(NULL, "cpu", &out, err, sizeof(err)), 0);
    assert_null(out);
    setenv("XDG_CACHE_HOME", tmpdir, 1);
    assert_int_equal(dsq_pad_model_open(NULL, "cpu", &out, err, sizeof(err)), 0);
    assert_null(out);
    /* a malformed default file is ignored (with a warning) */
    snprintf(path, sizeof(path), "%s/dsq", tmpdir);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/dsq/padding-cpu.json", tmpdir);
    write_file(path, "garbage");
    assert_int_equal(dsq_pad_model_open(NULL, "cpu", &out, err, sizeof(err)), 0);
    assert_null(out);
    /* ... but an explicit one is an error that names the option */
    assert_int_equal(dsq_pad_model_open(path, "cpu", &out, err, sizeof(err)), DSQ_EFORMAT);
    assert_null(out);
    assert_non_null(strstr(err, "--padding-model"));
    /* a valid default file is loaded */
    dsq_pad_model_t fm = full_model();
    assert_int_equal(dsq_pad_model_save(&fm, path, err, sizeof(err)), 0);
    assert_int_equal(dsq_pad_model_open(NULL, "cpu", &out, err, sizeof(err)), 0);
    assert_non_null(out);
    assert_true(out->k_us == fm.k_us);
    dsq_pad_model_destroy(out);
    dsq_pad_model_destroy(NULL);
    unsetenv("XDG_CACHE_HOME");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_and_curve),
        cmocka_unit_test(test_choose_hand),
        cmocka_unit_test(test_choose_ties),
        cmocka_unit_test(test_choose_eager),
        cmocka_unit_test(test_choose_errors),
        cmocka_unit_test(test_fit_exact),
        cmocka_unit_test(test_fit_noise),
        cmocka_unit_test(test_fit_golden),
        cmocka_unit_test(test_fit_clamp),
        cmocka_unit_test(test_fit_errors),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_save_in_place),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_files),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}

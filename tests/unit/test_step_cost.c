/* tests for engine/serve/step_cost.c: the online fit of the step cost model
 * (fixed + per row + per attention pair, non-negative least squares with
 * forgetting) and the chunk sizing that inverts it. Data are synthetic
 * steps from known coefficients; chunk sizes are checked against a linear
 * search over n. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "engine/serve/step_cost.h"

static uint64_t rng = 0x2545f4914f6cdd1dULL;

static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* a step of a decode rows at contexts around ctx plus a chunk of n at p */
static void step_shape(int n_dec, int ctx, int n, int p, int64_t *rows, int64_t *pairs)
{
    *rows = n_dec + n;
    *pairs = (int64_t)n_dec * (ctx + 1) + dsq_step_cost_chunk_pairs(p, n);
}

static void assert_close(double got, double want, double rel)
{
    if (fabs(got - want) > rel * fabs(want) + 1e-12) {
        print_error("got %.9g want %.9g\n", got, want);
        fail();
    }
}

/* Exact data from fixed 4 ms, 0.5 ms/row, 2 us/pair over mixed steps: the
 * fit gives the coefficients back. */
static void test_recovers_coefficients(void **state)
{
    (void)state;
    dsq_step_cost_fit_t f;
    dsq_step_cost_fit_reset(&f);
    dsq_step_cost_t c;
    assert_false(dsq_step_cost_model(&f, &c));
    for (int i = 0; i < 40; i++) {
        int64_t rows, pairs;
        step_shape(1 + (int)(urand() * 8), 50 + (int)(urand() * 3000), (int)(urand() * 300),
                   (int)(urand() * 4000), &rows, &pairs);
        dsq_step_cost_observe(&f, rows, pairs, 4.0 + 0.5 * (double)rows + 2e-3 * (double)pairs);
    }
    assert_true(dsq_step_cost_model(&f, &c));
    assert_close(c.fixed_ms, 4.0, 1e-5);
    assert_close(c.token_ms, 0.5, 1e-6);
    assert_close(c.pair_ms, 2e-3, 1e-6);
    assert_close(dsq_step_cost_predict(&c, 100, 250000), 4.0 + 50.0 + 500.0, 1e-6);
    /* invalid observations are ignored */
    int64_t n = f.n;
    dsq_step_cost_observe(&f, 0, 10, 5.0);
    dsq_step_cost_observe(&f, 5, 10, NAN);
    dsq_step_cost_observe(&f, 5, 10, -1.0);
    assert_int_equal(f.n, n);
}

/* Data whose unconstrained least-squares fit has a negative coefficient
 * (cost falling with pairs): every coefficient stays >= 0 and the model
 * still predicts the steps it saw within their spread. */
static void test_non_negative(void **state)
{
    (void)state;
    dsq_step_cost_fit_t f;
    dsq_step_cost_fit_reset(&f);
    for (int i = 0; i < 30; i++) {
        int64_t rows = 10 + i * 10, pairs = 100000 - i * 3000;
        dsq_step_cost_observe(&f, rows, pairs, 2.0 + 0.3 * (double)rows - 1e-5 * (double)pairs);
    }
    dsq_step_cost_t c;
    assert_true(dsq_step_cost_model(&f, &c));
    assert_true(c.fixed_ms >= 0 && c.token_ms >= 0 && c.pair_ms >= 0);
    double want = 2.0 + 0.3 * 150 - 1e-5 * 58000;
    assert_close(dsq_step_cost_predict(&c, 150, 58000), want, 0.1);
}

/* Decode-only history (one row each): the model predicts those steps, and
 * its trust region stays at twice what it saw, so a prefill step is not
 * sized from an unmeasured per-row cost. */
static void test_trust_region(void **state)
{
    (void)state;
    dsq_step_cost_fit_t f;
    dsq_step_cost_fit_reset(&f);
    for (int i = 0; i < 50; i++)
        dsq_step_cost_observe(&f, 1, 100 + i, 5.0 + 0.01 * (100 + i));
    dsq_step_cost_t c;
    assert_true(dsq_step_cost_model(&f, &c));
    assert_close(dsq_step_cost_predict(&c, 1, 130), 6.3, 1e-3);
    assert_close(c.trust_rows, 2.0, 1e-9);
    assert_true(c.trust_pairs >= 2 * 140 && c.trust_pairs <= 2 * 149);
    /* one big step widens it; forgetting narrows it again */
    dsq_step_cost_observe(&f, 500, 200000, 300.0);
    assert_true(dsq_step_cost_model(&f, &c));
    assert_close(c.trust_rows, 1000.0, 1e-9);
    for (int i = 0; i < 30; i++)
        dsq_step_cost_observe(&f, 1, 150, 6.5);
    assert_true(dsq_step_cost_model(&f, &c));
    assert_true(c.trust_rows < 1000.0 * 0.05);
}

/* The machine gets twice as slow (a neighbour starts): within 25 steps
 * the predictions follow to within 5%. */
static void test_follows_load(void **state)
{
    (void)state;
    dsq_step_cost_fit_t f;
    dsq_step_cost_fit_reset(&f);
    double k = 1.0;
    for (int i = 0; i < 80; i++) {
        if (i == 40)
            k = 2.0;
        int64_t rows, pairs;
        step_shape(2, 500, 20 + (int)(urand() * 200), (int)(urand() * 3000), &rows, &pairs);
        dsq_step_cost_observe(&f, rows, pairs,
                              k * (3.0 + 0.8 * (double)rows + 3e-3 * (double)pairs));
        if (i == 40 + 25) {
            dsq_step_cost_t c;
            assert_true(dsq_step_cost_model(&f, &c));
            assert_close(dsq_step_cost_predict(&c, 120, 300000), 2.0 * (3.0 + 96.0 + 900.0),
                         0.05);
        }
    }
}

static double chunk_ms(const dsq_step_cost_t *c, int64_t p, int64_t n)
{
    return c->token_ms * (double)n + c->pair_ms * (double)(n * p + n * (n + 1) / 2);
}

/* chunk_fit is the largest n whose cost fits, as a linear search finds
 * it, over random coefficients, positions and budgets (and the edges: no
 * time, no per-row cost, n_max). */
static void test_chunk_fit(void **state)
{
    (void)state;
    assert_int_equal(dsq_step_cost_chunk_pairs(0, 1), 1);
    assert_int_equal(dsq_step_cost_chunk_pairs(10, 4), 4 * 10 + 10);
    for (int t = 0; t < 2000; t++) {
        dsq_step_cost_t c = {.fixed_ms = 1, .token_ms = urand() < 0.1 ? 0 : urand() * 2,
                             .pair_ms = urand() < 0.1 ? 0 : urand() * 1e-2};
        int64_t p = (int64_t)(urand() * 8000);
        double ms = urand() * 400;
        int n_max = 1 + (int)(urand() * 3000);
        int got = dsq_step_cost_chunk_fit(&c, p, ms, n_max);
        int want = 0;
        if (c.token_ms == 0 && c.pair_ms == 0)
            want = n_max;
        else
            while (want < n_max && chunk_ms(&c, p, want + 1) <= ms)
                want++;
        if (got != want) {
            print_error("t=%d token=%g pair=%g p=%lld ms=%g n_max=%d: got %d want %d\n", t,
                        c.token_ms, c.pair_ms, (long long)p, ms, n_max, got, want);
            fail();
        }
    }
    dsq_step_cost_t c = {.token_ms = 1, .pair_ms = 0};
    assert_int_equal(dsq_step_cost_chunk_fit(&c, 0, 0, 100), 0);
    assert_int_equal(dsq_step_cost_chunk_fit(&c, 0, 50, 0), 0);
    assert_int_equal(dsq_step_cost_chunk_fit(&c, 0, 1e9, 100), 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recovers_coefficients),
        cmocka_unit_test(test_non_negative),
        cmocka_unit_test(test_trust_region),
        cmocka_unit_test(test_follows_load),
        cmocka_unit_test(test_chunk_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

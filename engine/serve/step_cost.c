/* Step cost model and its online fit (see step_cost.h). */
#include "step_cost.h"

#include <math.h>
#include <string.h>

/* Features are scaled so the normal equations stay well conditioned:
 * rows in units of 256, pairs in units of 2^20. */
#define ROW_UNIT 256.0
#define PAIR_UNIT 1048576.0
#define FORGET 0.9

void dsq_step_cost_fit_reset(dsq_step_cost_fit_t *f) { memset(f, 0, sizeof(*f)); }

void dsq_step_cost_observe(dsq_step_cost_fit_t *f, int64_t rows, int64_t pairs,
                           double forward_ms)
{
    if (rows < 1 || pairs < 0 || !isfinite(forward_ms) || forward_ms < 0)
        return;
    double x[3] = {1.0, (double)rows / ROW_UNIT, (double)pairs / PAIR_UNIT};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++)
            f->s[i][j] = FORGET * f->s[i][j] + x[i] * x[j];
        f->t[i] = FORGET * f->t[i] + x[i] * forward_ms;
    }
    f->yy = FORGET * f->yy + forward_ms * forward_ms;
    f->w = FORGET * f->w + 1.0;
    f->max_rows = FORGET * f->max_rows > (double)rows ? FORGET * f->max_rows : (double)rows;
    f->max_pairs = FORGET * f->max_pairs > (double)pairs ? FORGET * f->max_pairs : (double)pairs;
    f->n++;
}

/* Solve the normal equations restricted to the terms in mask (bit i =
 * term i). Returns false when singular; beta[i] = 0 outside the mask. */
static bool solve_subset(const dsq_step_cost_fit_t *f, int mask, double beta[3])
{
    int idx[3], k = 0;
    for (int i = 0; i < 3; i++)
        if (mask & (1 << i))
            idx[k++] = i;
    double a[3][4];
    for (int r = 0; r < k; r++) {
        for (int c = 0; c < k; c++)
            a[r][c] = f->s[idx[r]][idx[c]];
        /* a whisper of ridge keeps a constant feature solvable */
        a[r][r] += 1e-9 * (f->s[idx[r]][idx[r]] + 1e-12);
        a[r][k] = f->t[idx[r]];
    }
    for (int c = 0; c < k; c++) {
        int piv = c;
        for (int r = c + 1; r < k; r++)
            if (fabs(a[r][c]) > fabs(a[piv][c]))
                piv = r;
        if (fabs(a[piv][c]) < 1e-12 * (f->w > 0 ? f->w : 1))
            return false;
        if (piv != c)
            for (int j = 0; j <= k; j++) {
                double tmp = a[c][j];
                a[c][j] = a[piv][j];
                a[piv][j] = tmp;
            }
        for (int r = 0; r < k; r++) {
            if (r == c)
                continue;
            double m = a[r][c] / a[c][c];
            for (int j = c; j <= k; j++)
                a[r][j] -= m * a[c][j];
        }
    }
    beta[0] = beta[1] = beta[2] = 0;
    for (int r = 0; r < k; r++)
        beta[idx[r]] = a[r][k] / a[r][r];
    return true;
}

bool dsq_step_cost_model(const dsq_step_cost_fit_t *f, dsq_step_cost_t *c)
{
    if (f->n < 3)
        return false;
    double best[3] = {0, 0, 0}, best_sse = INFINITY;
    int best_terms = 0;
    bool found = false;
    for (int mask = 1; mask < 8; mask++) {
        double b[3];
        if (!solve_subset(f, mask, b) || b[0] < 0 || b[1] < 0 || b[2] < 0)
            continue;
        /* weighted residual sum of squares: yy - 2 b.t + b.S.b */
        double sse = f->yy;
        for (int i = 0; i < 3; i++) {
            sse -= 2 * b[i] * f->t[i];
            for (int j = 0; j < 3; j++)
                sse += b[i] * f->s[i][j] * b[j];
        }
        /* ties (exact data) go to the model with more terms */
        double tol = 1e-12 * (f->yy + 1);
        if (sse < best_sse - tol ||
            (sse <= best_sse + tol && __builtin_popcount(mask) > best_terms)) {
            best_terms = __builtin_popcount(mask);
            best_sse = sse;
            memcpy(best, b, sizeof(best));
            found = true;
        }
    }
    if (!found) {
        /* all-negative fits: fall back to the mean cost as fixed cost */
        best[0] = f->w > 0 ? f->t[0] / f->w : 0;
        if (best[0] < 0)
            best[0] = 0;
    }
    c->fixed_ms = best[0];
    c->token_ms = best[1] / ROW_UNIT;
    c->pair_ms = best[2] / PAIR_UNIT;
    c->trust_rows = 2 * f->max_rows;
    c->trust_pairs = 2 * f->max_pairs;
    return true;
}

double dsq_step_cost_predict(const dsq_step_cost_t *c, int64_t rows, int64_t pairs)
{
    return c->fixed_ms + c->token_ms * (double)rows + c->pair_ms * (double)pairs;
}

int64_t dsq_step_cost_chunk_pairs(int64_t p, int64_t n)
{
    return n * p + n * (n + 1) / 2;
}

static double chunk_ms(const dsq_step_cost_t *c, int64_t p, int64_t n)
{
    return c->token_ms * (double)n + c->pair_ms * (double)dsq_step_cost_chunk_pairs(p, n);
}

int dsq_step_cost_chunk_fit(const dsq_step_cost_t *c, int64_t p, double ms, int n_max)
{
    if (n_max <= 0 || !(ms > 0))
        return 0;
    /* cost(n) = (pair/2) n^2 + (token + pair (p + 1/2)) n, increasing in n */
    double qa = c->pair_ms / 2, qb = c->token_ms + c->pair_ms * ((double)p + 0.5);
    double n;
    if (qa > 0)
        n = (-qb + sqrt(qb * qb + 4 * qa * ms)) / (2 * qa);
    else if (qb > 0)
        n = ms / qb;
    else
        return n_max;
    if (!(n < (double)n_max))
        return n_max;
    int k = n < 0 ? 0 : (int)n;
    /* the root is exact up to rounding: settle on the integer boundary */
    while (k > 0 && chunk_ms(c, p, k) > ms)
        k--;
    while (k < n_max && chunk_ms(c, p, k + 1) <= ms)
        k++;
    return k;
}

/* The engine's step cost model: the forward time of one step predicted
 * from its shape, fitted online from measured steps, so the step budget
 * (engine.h step_budget_ms) can size prefill chunks on any backend.
 *
 * Model (all in ms):
 *     forward_ms = fixed_ms + token_ms * rows + pair_ms * pairs
 * where rows is the number of token rows in the step (decode rows plus
 * prefill chunk tokens) and pairs is the number of causal attention pairs,
 * the sum over rows of (position + 1): one query row against every cached
 * position it attends to. fixed_ms covers what a step costs regardless of
 * its size (reading the weights once, launches, thread wake-ups),
 * token_ms the per-row work (the weight products, norms, activations),
 * pair_ms the attention work, which for a chunk of n tokens starting at
 * position p is n*p + n*(n+1)/2 pairs and makes a long prompt's later
 * chunks dearer than its first ones. The same decomposition is the cost
 * model of Sarathi-Serve's chunk sizing (Agrawal et al., OSDI 2024,
 * section 4) and of vLLM's token budget, here with the coefficients
 * measured instead of profiled offline.
 *
 * Fit: exponentially weighted least squares over every observed step
 * (forgetting factor 0.9 per step, so load changes on the machine are
 * followed within a few steps), constrained to non-negative coefficients
 * by choosing the best-fitting non-negative solution over the subsets of
 * the three terms (an exact non-negative least squares for three
 * unknowns). Predictions are trusted only near the measured steps (the
 * trust region in dsq_step_cost_t). */
#ifndef DSQ_ENGINE_SERVE_STEP_COST_H
#define DSQ_ENGINE_SERVE_STEP_COST_H

#include <stdbool.h>
#include <stdint.h>

/* Coefficients of the model above, in ms, ms per row, ms per pair; all
 * >= 0. */
typedef struct dsq_step_cost {
    double fixed_ms;
    double token_ms;
    double pair_ms;
    /* The fit's trust region: twice the largest rows and pairs among the
     * steps it still remembers (maxima forgotten at the fit's rate). A
     * history of decode steps only (one row each) cannot tell token_ms
     * from fixed_ms, so predictions far outside what was measured are not
     * believed: the scheduler grows prefill steps at most this far (at
     * least 16 rows), doubling per step while the model keeps up. 0 = no
     * limit. */
    double trust_rows;
    double trust_pairs;
} dsq_step_cost_t;

/* Online fitter state; zero-initialise (or dsq_step_cost_fit_reset) before
 * use. Plain value, owns nothing. */
typedef struct dsq_step_cost_fit {
    double s[3][3];        /* weighted sum of x x^T, x = (1, rows, pairs) scaled */
    double t[3];           /* weighted sum of x y                                 */
    double yy;             /* weighted sum of y^2                                 */
    double w;              /* total weight                                        */
    double max_rows;       /* decayed maxima of the observations                  */
    double max_pairs;
    int64_t n;             /* steps observed                                      */
} dsq_step_cost_fit_t;

/* Forget every observation. */
void dsq_step_cost_fit_reset(dsq_step_cost_fit_t *f);

/* Add one measured step: rows >= 1 token rows, pairs attention pairs (as
 * defined above), forward_ms its measured forward time in ms. Steps with
 * rows < 1 or a non-finite or negative time are ignored. */
void dsq_step_cost_observe(dsq_step_cost_fit_t *f, int64_t rows, int64_t pairs,
                           double forward_ms);

/* The current fit into *c. Returns false (and leaves *c alone) until at
 * least 3 steps were observed; otherwise true with every coefficient >= 0. */
bool dsq_step_cost_model(const dsq_step_cost_fit_t *f, dsq_step_cost_t *c);

/* Predicted ms of a step with these rows and pairs under c. */
double dsq_step_cost_predict(const dsq_step_cost_t *c, int64_t rows, int64_t pairs);

/* Attention pairs of a prefill chunk of n tokens at positions p..p+n-1:
 * n*p + n*(n+1)/2. */
int64_t dsq_step_cost_chunk_pairs(int64_t p, int64_t n);

/* The largest n in [0, n_max] whose chunk at position p costs at most ms
 * under c (rows and pairs terms only: the fixed cost is charged once per
 * step by the caller). */
int dsq_step_cost_chunk_fit(const dsq_step_cost_t *c, int64_t p, double ms, int n_max);

#endif

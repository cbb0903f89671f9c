/* Sampler: logits of one sequence -> next token.
 *
 * Order of processing (vLLM's): logit_bias, repetition penalty (CTRL,
 * Keskar et al. 2019: positive logits divided, negative multiplied, over
 * prompt and output tokens), frequency and presence penalties (OpenAI API
 * definition, over output tokens), then temperature 0 -> argmax (lowest id
 * on ties; also below 1e-5, where 1/temperature overflows float); otherwise
 * divide by temperature, top-k, top-p (Holtzman et al.
 * 2019), min-p (Nguyen et al. 2024), and draw from the remaining
 * distribution with the sequence's own RNG (xoshiro256**, seeded per
 * request). Logprobs are the log-softmax of the raw model logits, before any
 * processing (vLLM V1's default "raw_logprobs").
 */
#ifndef DSQ_SAMPLER_H
#define DSQ_SAMPLER_H

#include <stdint.h>

#include "engine.h"

/* Per-sequence RNG state (xoshiro256**, Blackman & Vigna 2018). */
typedef struct dsq_rng {
    uint64_t s[4];
} dsq_rng_t;

/* Seed deterministically (splitmix64 expansion of seed). */
void dsq_rng_seed(dsq_rng_t *r, uint64_t seed);
/* Uniform double in [0, 1). */
double dsq_rng_uniform(dsq_rng_t *r);

/* Token history a penalty looks at. counts may be NULL when no penalty is
 * active. */
typedef struct dsq_sampler_hist {
    const int32_t *prompt;  int n_prompt;
    const int32_t *output;  int n_output;
    /* api: constrained decoding: bit (id % 32) of allowed[id / 32] set for
     * each token the grammar allows next (dsq_grammar_matcher_fill_mask), or
     * NULL for no constraint. Applied after the raw logprobs are taken (as
     * vLLM's default raw_logprobs) and before logit_bias, penalties,
     * temperature, top-k/p and min-p. */
    const uint32_t *allowed;
} dsq_sampler_hist_t;

/* Reusable scratch for the sampler (one per engine thread). */
typedef struct dsq_sampler dsq_sampler_t;
dsq_sampler_t *dsq_sampler_create(int n_vocab);
void dsq_sampler_destroy(dsq_sampler_t *s);

/* Pick the next token.
 * logits: [n_vocab] fp32, host memory; modified in place (scratch).
 * out_logprob (may be NULL): raw log-probability of the chosen token.
 * top (may be NULL): receives the n_top most likely tokens under the raw
 * distribution, most likely first.
 * NaN logits (non-finite weights or activations) are taken as -inf: never
 * picked, probability 0 in the logprobs (logged once per sampler).
 * Returns 0, DSQ_EINVAL for invalid parameters, or DSQ_ERANGE when every
 * logit is NaN or masked out (nothing can be sampled). */
int dsq_sampler_pick(dsq_sampler_t *s, const dsq_sampling_t *sp,
                     const dsq_sampler_hist_t *hist, float *logits,
                     dsq_rng_t *rng, int32_t *out_token, float *out_logprob,
                     dsq_top_logprob_t *top, int n_top);

#endif

/* Speculative decoding: proposers of draft tokens.
 *
 * Decoding one token reads every weight once; scoring k proposed tokens
 * in the same forward pass reads them once too, so each proposal the model
 * agrees with is a token for (almost) nothing (Leviathan et al., "Fast
 * Inference from Transformers via Speculative Decoding", ICML 2023; Chen
 * et al. 2023). The engine verifies the drafts (engine.c): each position
 * is sampled as it would be without speculation and a draft is kept while
 * it equals what was sampled, so the output is the one plain decoding
 * gives, greedy or sampled (a deterministic proposal is a point mass q:
 * rejection sampling's accept-with-p(d) / resample-from-p-without-d is
 * then exactly "sample from p, keep the draft if it came out").
 *
 * Proposers here need no model: n-gram prompt lookup (Saxena, "Prompt
 * Lookup Decoding", 2023; vLLM's "ngram" method, llama.cpp's lookup):
 * where the text being written repeats text already in the context (code
 * edits, quoting, extraction), the tokens that followed the last
 * occurrence of the current suffix are likely to follow again.
 */
#ifndef DSQ_SPEC_H
#define DSQ_SPEC_H

#include <stdint.h>

/* N-gram lookup over tokens[0..n) (prompt and output so far): for each
 * length g from n_max down to n_min, the most recent earlier occurrence of
 * the last g tokens that k tokens follow (else the one the most follow);
 * the first length that has one gives the tokens that followed it, at
 * most k, into out[0..k). Returns how many (0: no match,
 * or bad arguments: n_min < 1, n_max < n_min, k < 1). O(n * (n_max -
 * n_min + 1)) token comparisons at worst. */
int dsq_spec_ngram_propose(const int32_t *tokens, int n, int n_min, int n_max, int k,
                           int32_t *out);

/* How many drafts pay, at most k_max. A draft row costs row_cost of what
 * a token costs in the step (the step cost model's n token_ms / (fixed_ms
 * + n token_ms) with n decoding rows: little on a GPU at batch 1, a large
 * share on a CPU, where rows are compute, and more in a batch). Draft
 * i is kept only if the i - 1 before it are, with probability alpha^i,
 * alpha = the rate of drafts kept when checked (accepted / checked, decayed
 * counts the caller keeps, with a prior of 0.6 worth two drafts), and is
 * then worth a whole step. A step with i - 1 drafts is expected to give
 * e = 1 + alpha + ... + alpha^(i-1) tokens for c = 1 + (i - 1) row_cost;
 * draft i is proposed while it raises that rate, alpha^i / row_cost >
 * e / c, which maximises e / c (the terms fall, the rate rises while they
 * beat it): text that copies its context gets long drafts, free text a
 * short one or none, and a model whose rows are cheap more than one whose
 * rows are not (an acceptance-adaptive length, as llama.cpp's p_min or
 * dynamic speculation lengths; the cost side is the engine's own fit).
 * Returns 0..k_max (0 for row_cost >= 1 or k_max < 1). */
int dsq_spec_draft_len(double accepted, double checked, double row_cost, int k_max);

#endif

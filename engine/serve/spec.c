/* Draft-token proposers for speculative decoding (spec.h). */
#include "spec.h"

#include <string.h>

int dsq_spec_ngram_propose(const int32_t *tokens, int n, int n_min, int n_max, int k,
                           int32_t *out)
{
    if (!tokens || n_min < 1 || n_max < n_min || k < 1)
        return 0;
    for (int g = n_max < n - 1 ? n_max : n - 1; g >= n_min; g--) {
        const int32_t *suffix = tokens + n - g;
        /* start i of an earlier occurrence: i + g <= n - 1, so at least one
         * token follows it; latest first, but one right behind the suffix
         * (a repeated run) has few tokens after it: take the latest with k
         * after it, else the one with the most */
        int best = -1, best_m = 0;
        for (int i = n - g - 1; i >= 0; i--) {
            if (tokens[i] != suffix[0] ||
                memcmp(tokens + i, suffix, (size_t)g * sizeof(*tokens)) != 0)
                continue;
            int m = n - (i + g);
            if (m > best_m) {
                best = i;
                best_m = m > k ? k : m;
            }
            if (m >= k)
                break;
        }
        if (best >= 0) {
            memcpy(out, tokens + best + g, (size_t)best_m * sizeof(*out));
            return best_m;
        }
    }
    return 0;
}

int dsq_spec_draft_len(double accepted, double checked, double row_cost, int k_max)
{
    const double alpha = (accepted + 0.6 * 2.0) / (checked + 2.0);
    /* e tokens expected of a step that costs c (a plain step: 1, 1) */
    double e = 1.0, c = 1.0, p = alpha;
    int k = 0;
    while (k < k_max && p * c > row_cost * e) {
        e += p;
        c += row_cost;
        p *= alpha;
        k++;
    }
    return k;
}

/* tests for engine/serve/sampler.c: every processing stage against values worked
 * out by hand from the definitions cited in sampler.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/serve/sampler.h"

#define V 8

static dsq_sampling_t greedy(void)
{
    dsq_sampling_t sp = {.max_tokens = 1, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1};
    return sp;
}

static void test_greedy_and_logprobs(void **state)
{
    (void)state;
    dsq_sampler_t *s = dsq_sampler_create(V);
    float lg[V] = {0, 1, 3, 2, -1, 3, 0.5f, 0};
    dsq_sampling_t sp = greedy();
    dsq_rng_t rng;
    dsq_rng_seed(&rng, 1);
    int32_t t;
    float lp;
    dsq_top_logprob_t top[3];
    assert_int_equal(dsq_sampler_pick(s, &sp, NULL, lg, &rng, &t, &lp, top, 3), DSQ_OK);
    assert_int_equal(t, 2); /* tie 2 vs 5: lowest id */
    double z = 0;
    float raw[V] = {0, 1, 3, 2, -1, 3, 0.5f, 0};
    for (int i = 0; i < V; i++)
        z += exp(raw[i]);
    assert_float_equal(lp, 3 - log(z), 1e-5);
    assert_int_equal(top[0].token, 2);
    assert_int_equal(top[1].token, 5);
    assert_int_equal(top[2].token, 3);
    assert_float_equal(top[2].logprob, 2 - log(z), 1e-5);
    dsq_sampler_destroy(s);
}

static void test_bias_and_penalties(void **state)
{
    (void)state;
    dsq_sampler_t *s = dsq_sampler_create(V);
    dsq_rng_t rng;
    dsq_rng_seed(&rng, 1);
    int32_t t;
    /* logit_bias moves the argmax */
    float lg[V] = {0, 1, 3, 2, -1, 2.5f, 0.5f, 0};
    int32_t ids[] = {4};
    float bias[] = {10};
    dsq_sampling_t sp = greedy();
    sp.n_logit_bias = 1;
    sp.logit_bias_ids = ids;
    sp.logit_bias = bias;
    assert_int_equal(dsq_sampler_pick(s, &sp, NULL, lg, &rng, &t, NULL, NULL, 0), 0);
    assert_int_equal(t, 4);
    assert_float_equal(lg[4], 9.0f, 1e-6);

    /* repetition penalty 2 over prompt+output: 3 -> 1.5 (id 2 in prompt),
     * frequency 0.5 x2 + presence 0.25 on id 5 (output twice): 2.5 - 1.25 */
    float lg2[V] = {0, 1, 3, 2, -1, 2.5f, 0.5f, -2};
    int32_t prompt[] = {2, 7};
    int32_t output[] = {5, 5};
    dsq_sampler_hist_t h = {.prompt = prompt, .n_prompt = 2, .output = output, .n_output = 2};
    dsq_sampling_t sp2 = greedy();
    sp2.repetition_penalty = 2;
    sp2.frequency_penalty = 0.5f;
    sp2.presence_penalty = 0.25f;
    assert_int_equal(dsq_sampler_pick(s, &sp2, &h, lg2, &rng, &t, NULL, NULL, 0), 0);
    assert_float_equal(lg2[2], 1.5f, 1e-6);
    assert_float_equal(lg2[7], -4.0f, 1e-6);           /* negative: multiplied */
    assert_float_equal(lg2[5], 2.5f / 2 - 1.25f, 1e-6); /* rep, then freq+presence */
    assert_int_equal(t, 3);
    /* a second call with no history leaves logits alone (scratch reset) */
    float lg3[V] = {0, 1, 3, 2, -1, 2.5f, 0.5f, -2};
    assert_int_equal(dsq_sampler_pick(s, &sp2, NULL, lg3, &rng, &t, NULL, NULL, 0), 0);
    assert_float_equal(lg3[2], 3.0f, 1e-6);
    dsq_sampler_destroy(s);
}

/* Empirical frequencies of 40,000 draws against the analytic distribution. */
static void draw_hist(dsq_sampler_t *s, const dsq_sampling_t *sp, const float *base,
                      double *freq)
{
    dsq_rng_t rng;
    dsq_rng_seed(&rng, 42);
    memset(freq, 0, V * sizeof(*freq));
    const int n = 40000;
    for (int i = 0; i < n; i++) {
        float lg[V];
        memcpy(lg, base, sizeof(lg));
        int32_t t;
        assert_int_equal(dsq_sampler_pick(s, sp, NULL, lg, &rng, &t, NULL, NULL, 0), 0);
        freq[t] += 1.0 / n;
    }
}

static void test_temperature_topk_topp_minp(void **state)
{
    (void)state;
    dsq_sampler_t *s = dsq_sampler_create(V);
    const float base[V] = {1, 2, 0, 3, -1, 0.5f, 2.5f, -3};
    double f[V], p[V], z = 0;
    dsq_sampling_t sp = greedy();
    sp.temperature = 2;
    for (int i = 0; i < V; i++)
        z += exp(base[i] / 2.0);
    for (int i = 0; i < V; i++)
        p[i] = exp(base[i] / 2.0) / z;
    draw_hist(s, &sp, base, f);
    for (int i = 0; i < V; i++)
        assert_float_equal(f[i], p[i], 0.01);   /* 4 sigma at n = 40,000 */

    /* top-k 2: only ids 3 and 6, in ratio e^(3/2) : e^(2.5/2) */
    sp.top_k = 2;
    draw_hist(s, &sp, base, f);
    double a = exp(1.5), b = exp(1.25);
    assert_float_equal(f[3], a / (a + b), 0.01);
    assert_float_equal(f[6], b / (a + b), 0.01);
    assert_float_equal(f[1] + f[0] + f[2] + f[4] + f[5] + f[7], 0, 1e-12);

    /* top-p: at temperature 1 the sorted probabilities of ids 3, 6, 1 are
     * .42, .26, .15 (cumulative .84): top_p 0.8 keeps exactly {3, 6, 1} */
    sp.top_k = 0;
    sp.temperature = 1;
    sp.top_p = 0.8f;
    draw_hist(s, &sp, base, f);
    double e3 = exp(3), e6 = exp(2.5), e1 = exp(2);
    assert_float_equal(f[3], e3 / (e3 + e6 + e1), 0.01);
    assert_float_equal(f[1], e1 / (e3 + e6 + e1), 0.01);
    assert_float_equal(f[0] + f[2] + f[4] + f[5] + f[7], 0, 1e-12);

    /* min-p 0.5: keeps tokens with p >= 0.5 * p(3): ids 3 (1) and 6 (e^-.5 = .61) */
    sp.top_p = 1;
    sp.min_p = 0.5f;
    draw_hist(s, &sp, base, f);
    assert_float_equal(f[3], e3 / (e3 + e6), 0.01);
    assert_float_equal(f[6], e6 / (e3 + e6), 0.01);

    /* the same seed gives the same draws */
    double g[V];
    draw_hist(s, &sp, base, g);
    assert_memory_equal(f, g, sizeof(f));
    /* a temperature too small for 1/T in float is greedy, not NaN */
    dsq_sampling_t tiny = greedy();
    tiny.temperature = 1e-39f;
    float lt[V] = {1, 2, 0, 3, -1, 0.5f, 2.5f, -3};
    int32_t tt;
    dsq_rng_t r2;
    dsq_rng_seed(&r2, 7);
    assert_int_equal(dsq_sampler_pick(s, &tiny, NULL, lt, &r2, &tt, NULL, NULL, 0), DSQ_OK);
    assert_int_equal(tt, 3);
    dsq_sampling_t bad = greedy();
    bad.top_p = 0;
    float lg[V] = {0};
    int32_t t;
    dsq_rng_t rng;
    dsq_rng_seed(&rng, 1);
    assert_int_equal(dsq_sampler_pick(s, &bad, NULL, lg, &rng, &t, NULL, NULL, 0), DSQ_EINVAL);
    dsq_sampler_destroy(s);
}

/* NaN logits are impossible tokens: never picked (greedy or sampled), no
 * NaN in the logprobs; all NaN is DSQ_ERANGE. */
static void test_nan_logits(void **state)
{
    (void)state;
    dsq_sampler_t *s = dsq_sampler_create(V);
    const float raw[V] = {NAN, 1, 3, 2, NAN, -1, 0.5f, 0};
    double z = 0;
    for (int i = 0; i < V; i++)
        if (!isnan(raw[i]))
            z += exp(raw[i]);
    dsq_rng_t rng;
    dsq_rng_seed(&rng, 7);
    for (int temp = 0; temp < 2; temp++) {
        dsq_sampling_t sp = greedy();
        sp.temperature = temp ? 1.5f : 0.0f;
        for (int rep = 0; rep < 200; rep++) {
            float lg[V];
            memcpy(lg, raw, sizeof(lg));
            int32_t t = -1;
            float lp = NAN;
            dsq_top_logprob_t top[3];
            assert_int_equal(dsq_sampler_pick(s, &sp, NULL, lg, &rng, &t, &lp, top, 3), DSQ_OK);
            assert_true(t != 0 && t != 4);
            assert_false(isnan(lp));
            assert_float_equal(lp, raw[t] - log(z), 1e-5);
            assert_int_equal(top[0].token, 2);
            if (!temp)
                assert_int_equal(t, 2);
        }
    }
    float all[V];
    for (int i = 0; i < V; i++)
        all[i] = NAN;
    dsq_sampling_t sp = greedy();
    int32_t t;
    float lp;
    assert_int_equal(dsq_sampler_pick(s, &sp, NULL, all, &rng, &t, &lp, NULL, 0), DSQ_ERANGE);
    dsq_sampler_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_logprobs),
        cmocka_unit_test(test_bias_and_penalties),
        cmocka_unit_test(test_temperature_topk_topp_minp),
        cmocka_unit_test(test_nan_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* engine/serve/admission.c: the static policy never holds a request back;
 * the adaptive one admits up to its limit, holds back at most what the
 * free slots and one limit hold, refuses the rest with a reason and a
 * Retry-After, refuses a held-back request past half the TTFT target,
 * respects the KV plan, and moves its limit as AIMD: +1 per window under
 * target at the limit, x0.9 per window over target, unchanged when the
 * limit was not reached or a target set had no samples. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/serve/admission.h"

static dsq_admission_t *adaptive(double ttft, double itl, int max_limit, int init)
{
    dsq_admission_opts_t o = {.kind = DSQ_ADMISSION_ADAPTIVE, .target_ttft_ms = ttft,
                              .target_itl_ms = itl, .max_limit = max_limit,
                              .initial_limit = init};
    char err[128];
    dsq_admission_t *a = dsq_admission_create(&o, err, sizeof(err));
    assert_non_null(a);
    return a;
}

static double limit_of(dsq_admission_t *a)
{
    dsq_admission_stats_t s;
    dsq_admission_stats(a, &s);
    return s.limit;
}

static void test_static_and_create(void **st)
{
    (void)st;
    char err[160] = "";
    dsq_admission_opts_t o = {.kind = DSQ_ADMISSION_STATIC, .max_limit = 8};
    dsq_admission_t *a = dsq_admission_create(&o, err, sizeof(err));
    assert_non_null(a);
    dsq_admission_view_t v = {.n_inflight = 1000, .n_queued = 1000, .wait_ms = 1e9};
    int ra = 0;
    assert_int_equal(dsq_admission_decide(a, &v, err, sizeof(err), &ra), DSQ_ADMIT_RUN);
    assert_false(dsq_admission_tick(a, 1e6, 5));
    dsq_admission_destroy(a);
    /* adaptive needs a target */
    o.kind = DSQ_ADMISSION_ADAPTIVE;
    assert_null(dsq_admission_create(&o, err, sizeof(err)));
    assert_non_null(strstr(err, "--target-ttft-ms"));
}

static void test_decide(void **st)
{
    (void)st;
    dsq_admission_t *a = adaptive(1000, 0, 64, 4);
    char why[200];
    int ra = 0;
    dsq_admission_view_t v = {0};
    /* new requests: run while slots are free and nothing waits */
    v.n_inflight = 3;
    assert_int_equal(dsq_admission_decide(a, &v, why, sizeof(why), &ra), DSQ_ADMIT_RUN);
    /* at the limit: queue while fewer than free slots + limit wait */
    v.n_inflight = 4;
    v.n_queued = 3;
    assert_int_equal(dsq_admission_decide(a, &v, why, sizeof(why), &ra), DSQ_ADMIT_QUEUE);
    v.n_queued = 4;
    why[0] = '\0';
    assert_int_equal(dsq_admission_decide(a, &v, why, sizeof(why), &ra), DSQ_ADMIT_REFUSE);
    assert_non_null(strstr(why, "adaptive concurrency limit"));
    assert_int_equal(ra, 1);                  /* ceil(1000 ms) */
    /* a burst into an idle server: the free slots count */
    v.n_inflight = 0;
    v.n_queued = 7;
    assert_int_equal(dsq_admission_decide(a, &v, why, sizeof(why), &ra), DSQ_ADMIT_QUEUE);
    v.n_queued = 8;
    assert_int_equal(dsq_admission_decide(a, &v, why, sizeof(why), &ra), DSQ_ADMIT_REFUSE);
    /* new ones never overtake waiting ones */
    v.n_inflight = 1;
    v.n_queued = 1;
    assert_int_equal(dsq_admission_decide(a, &v, why, sizeof(why), &ra), DSQ_ADMIT_QUEUE);
    /* held back: runs when a slot frees, waits up to half the target, then refused */
    dsq_admission_view_t h = {.held = true, .n_inflight = 3, .wait_ms = 900};
    assert_int_equal(dsq_admission_decide(a, &h, why, sizeof(why), &ra), DSQ_ADMIT_RUN);
    h.n_inflight = 4;
    h.wait_ms = 499;
    assert_int_equal(dsq_admission_decide(a, &h, why, sizeof(why), &ra), DSQ_ADMIT_QUEUE);
    h.wait_ms = 501;
    assert_int_equal(dsq_admission_decide(a, &h, why, sizeof(why), &ra), DSQ_ADMIT_REFUSE);
    assert_non_null(strstr(why, "waited 501 ms"));
    /* the KV plan: a slot is free but the reservations would not fit */
    dsq_admission_view_t k = {.held = true, .n_inflight = 2, .reserved_tokens = 900,
                              .need_tokens = 200, .kv_tokens = 1000, .wait_ms = 10};
    assert_int_equal(dsq_admission_decide(a, &k, why, sizeof(why), &ra), DSQ_ADMIT_QUEUE);
    k.need_tokens = 100;
    assert_int_equal(dsq_admission_decide(a, &k, why, sizeof(why), &ra), DSQ_ADMIT_RUN);
    /* an empty engine takes any request */
    k.n_inflight = 0;
    k.reserved_tokens = 0;
    k.need_tokens = 5000;
    assert_int_equal(dsq_admission_decide(a, &k, why, sizeof(why), &ra), DSQ_ADMIT_RUN);
    dsq_admission_destroy(a);

    /* Retry-After follows the TTFT target in whole seconds */
    a = adaptive(2500, 0, 64, 1);
    dsq_admission_view_t f = {.n_inflight = 1, .n_queued = 1};
    assert_int_equal(dsq_admission_decide(a, &f, why, sizeof(why), &ra), DSQ_ADMIT_REFUSE);
    assert_int_equal(ra, 3);
    dsq_admission_destroy(a);
}

static void test_aimd(void **st)
{
    (void)st;
    /* window = max(250 ms, TTFT target) = 400 ms */
    dsq_admission_t *a = adaptive(400, 50, 6, 4);
    double t = 0;
    assert_true(limit_of(a) == 4);
    assert_false(dsq_admission_tick(a, t, 0));
    /* under target at the limit: +1 per window, up to max_limit */
    for (int w = 0; w < 4; w++) {
        dsq_admission_observe_ttft(a, 100);
        dsq_admission_observe_itl(a, 10);
        dsq_admission_tick(a, t + 200, (int)limit_of(a));
        t += 400;
        dsq_admission_tick(a, t, (int)limit_of(a));
    }
    assert_true(limit_of(a) == 6);            /* 4 -> 5 -> 6, capped */
    /* under target, limit not reached: unchanged */
    dsq_admission_observe_ttft(a, 100);
    t += 400;
    assert_false(dsq_admission_tick(a, t, 2));
    assert_true(limit_of(a) == 6);
    /* a window without samples: nothing decided */
    t += 400;
    assert_false(dsq_admission_tick(a, t, 6));
    /* p90 TTFT over target: x0.9 */
    for (int i = 0; i < 10; i++)
        dsq_admission_observe_ttft(a, i < 8 ? 100 : 900);   /* p90 = 900 */
    t += 400;
    assert_true(dsq_admission_tick(a, t, 6));
    assert_true(limit_of(a) > 5.39 && limit_of(a) < 5.41);
    dsq_admission_stats_t s;
    dsq_admission_stats(a, &s);
    assert_non_null(strstr(s.reason, "ttft p90 900.0 ms"));
    assert_true(s.window_ttft_p90_ms == 900);
    assert_int_equal(s.increases, 2);
    assert_int_equal(s.decreases, 1);
    /* only 1 of 10 over target: p90 under it: no decrease */
    for (int i = 0; i < 10; i++)
        dsq_admission_observe_ttft(a, i < 9 ? 100 : 900);
    t += 400;
    dsq_admission_tick(a, t, 1);
    assert_true(limit_of(a) > 5.39);          /* not decreased */
    /* ITL over target: x0.9 each window, never below 1 */
    for (int w = 0; w < 40; w++) {
        dsq_admission_observe_itl(a, 80);
        t += 400;
        dsq_admission_tick(a, t, 1);
    }
    assert_true(limit_of(a) == 1);
    dsq_admission_stats(a, &s);
    assert_non_null(strstr(s.reason, "itl"));
    dsq_admission_destroy(a);
}

/* Growing needs evidence for each target set: a window at the limit with
 * decode steps but no first token (long decodes running, new requests
 * held) leaves L alone under a TTFT target; with both targets set, each
 * needs samples. Shrinking needs only the signal that is over. */
static void test_no_growth_without_evidence(void **st)
{
    (void)st;
    dsq_admission_t *a = adaptive(400, 0, 16, 4);
    double t = 0;
    dsq_admission_tick(a, t, 0);
    for (int w = 0; w < 5; w++) {
        dsq_admission_observe_itl(a, 10);
        t += 400;
        assert_false(dsq_admission_tick(a, t, 4));
    }
    assert_true(limit_of(a) == 4);
    dsq_admission_stats_t s;
    dsq_admission_stats(a, &s);
    assert_non_null(strstr(s.reason, "no ttft samples"));
    assert_int_equal(s.increases, 0);
    /* the first token comes: the window under target at the limit grows it */
    dsq_admission_observe_ttft(a, 100);
    t += 400;
    assert_true(dsq_admission_tick(a, t, 4));
    assert_true(limit_of(a) == 5);
    dsq_admission_destroy(a);

    a = adaptive(400, 50, 16, 4);
    t = 0;
    dsq_admission_tick(a, t, 0);
    dsq_admission_observe_ttft(a, 100);           /* no decode step */
    t += 400;
    assert_false(dsq_admission_tick(a, t, 4));
    dsq_admission_stats(a, &s);
    assert_non_null(strstr(s.reason, "no itl samples"));
    dsq_admission_observe_ttft(a, 900);           /* over: shrinks alone */
    t += 400;
    assert_true(dsq_admission_tick(a, t, 4));
    assert_true(limit_of(a) > 3.59 && limit_of(a) < 3.61);
    dsq_admission_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_and_create),
        cmocka_unit_test(test_decide),
        cmocka_unit_test(test_aimd),
        cmocka_unit_test(test_no_growth_without_evidence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* tests for kernels/cpu/threadpool.c, the CPU ops' thread pool: every chunk
 * of a job runs exactly once whatever the thread count (1..4, more threads
 * than cores included), slices of dsq__parallel_for tile [0, n) exactly,
 * a job started from inside a chunk (nesting) and jobs started from two
 * threads at once both complete (the loser runs inline), the pool resizes
 * when dsq_cpu_set_threads changes, and idle workers sleep instead of
 * spinning (process CPU time while the caller sleeps stays far below the
 * wall time). The reference is plain counting, independent of the pool. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

#define MAXC 4096

typedef struct counts {
    _Atomic int hit[MAXC];
    _Atomic int bad_n;
    int n;
} counts_t;

static void count_chunk(void *p, int chunk, int n_chunks)
{
    counts_t *c = p;
    if (n_chunks != c->n || chunk < 0 || chunk >= n_chunks)
        atomic_fetch_add(&c->bad_n, 1);
    else
        atomic_fetch_add(&c->hit[chunk], 1);
}

static void check_job(int n)
{
    counts_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->n = n;
    dsq__parallel(n, count_chunk, c);
    assert_int_equal(atomic_load(&c->bad_n), 0);
    for (int i = 0; i < n; i++)
        if (atomic_load(&c->hit[i]) != 1)
            fail_msg("n %d: chunk %d ran %d times", n, i, atomic_load(&c->hit[i]));
    free(c);
}

static void test_chunks_once(void **state)
{
    (void)state;
    const int t0 = dsq_cpu_get_threads();
    static const int ns[] = {0, 1, 2, 3, 7, 64, 1000, MAXC};
    for (int t = 1; t <= 4; t++) {
        assert_int_equal(dsq_cpu_set_threads(t), DSQ_OK);
        for (int rep = 0; rep < 50; rep++)
            for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
                check_job(ns[i]);
    }
    assert_int_equal(dsq_cpu_set_threads(t0), DSQ_OK);
}

typedef struct cover {
    _Atomic int hit[10000];
    _Atomic int calls;
} cover_t;

static void cover_range(void *p, int64_t i0, int64_t i1)
{
    cover_t *c = p;
    atomic_fetch_add(&c->calls, 1);
    for (int64_t i = i0; i < i1; i++)
        atomic_fetch_add(&c->hit[i], 1);
}

static void test_parallel_for(void **state)
{
    (void)state;
    const int t0 = dsq_cpu_get_threads();
    static const int64_t ns[] = {1, 2, 5, 100, 9999};
    static const int64_t mins[] = {1, 3, 1000};
    for (int t = 1; t <= 3; t++) {
        assert_int_equal(dsq_cpu_set_threads(t), DSQ_OK);
        for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
            for (size_t b = 0; b < sizeof(mins) / sizeof(mins[0]); b++) {
                cover_t *c = calloc(1, sizeof(*c));
                assert_non_null(c);
                dsq__parallel_for(ns[a], mins[b], cover_range, c);
                for (int64_t i = 0; i < ns[a]; i++)
                    assert_int_equal(atomic_load(&c->hit[i]), 1);
                /* never more slices than n / min (so tiny work is inline) */
                int64_t max_slices = ns[a] / mins[b] > 1 ? ns[a] / mins[b] : 1;
                assert_true(atomic_load(&c->calls) <= max_slices);
                assert_true(atomic_load(&c->calls) <= 4 * t);
                free(c);
            }
    }
    assert_int_equal(dsq_cpu_set_threads(t0), DSQ_OK);
}

/* a chunk that starts a job of its own: must run inline, not deadlock */
static void nested_chunk(void *p, int chunk, int n_chunks)
{
    (void)chunk;
    (void)n_chunks;
    counts_t *inner = calloc(1, sizeof(*inner));
    if (!inner)
        return;
    inner->n = 5;
    dsq__parallel(5, count_chunk, inner);
    int ok = atomic_load(&inner->bad_n) == 0;
    for (int i = 0; i < 5; i++)
        ok &= atomic_load(&inner->hit[i]) == 1;
    if (ok)
        atomic_fetch_add((_Atomic int *)p, 1);
    free(inner);
}

static void test_nested(void **state)
{
    (void)state;
    const int t0 = dsq_cpu_get_threads();
    assert_int_equal(dsq_cpu_set_threads(2), DSQ_OK);
    _Atomic int ok = 0;
    dsq__parallel(8, nested_chunk, (void *)&ok);
    assert_int_equal(atomic_load(&ok), 8);
    assert_int_equal(dsq_cpu_set_threads(t0), DSQ_OK);
}

static void *hammer(void *arg)
{
    (void)arg;
    for (int rep = 0; rep < 300; rep++)
        check_job(1 + rep % 37);
    return NULL;
}

static void test_two_callers(void **state)
{
    (void)state;
    const int t0 = dsq_cpu_get_threads();
    assert_int_equal(dsq_cpu_set_threads(2), DSQ_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, hammer, NULL), 0);
    hammer(NULL);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(dsq_cpu_set_threads(t0), DSQ_OK);
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_idle_sleeps(void **state)
{
    (void)state;
    const int t0 = dsq_cpu_get_threads();
    assert_int_equal(dsq_cpu_set_threads(4), DSQ_OK);
    check_job(16);                         /* workers exist and ran */
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);                 /* let them pass the spin phase */
    double c0 = cpu_s();
    nap.tv_nsec = 200 * 1000 * 1000;
    nanosleep(&nap, NULL);
    double used = cpu_s() - c0;
    printf("# idle pool (3 workers) used %.1f ms CPU in 200 ms\n", used * 1e3);
    /* spinning workers would use ~600 ms; sleeping ones ~0 */
    assert_true(used < 0.05);
    assert_int_equal(dsq_cpu_set_threads(t0), DSQ_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks_once),
        cmocka_unit_test(test_parallel_for),
        cmocka_unit_test(test_nested),
        cmocka_unit_test(test_two_callers),
        cmocka_unit_test(test_idle_sleeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

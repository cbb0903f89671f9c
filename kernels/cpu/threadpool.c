/* The CPU ops' thread pool: a few persistent pthreads that run one parallel
 * job at a time for whichever thread calls an op.
 *
 * Why not OpenMP: a decode step of a small model is hundreds of parallel
 * regions of a few microseconds each. libgomp's default active wait policy
 * spins workers for ~ms after each region, which on a loaded or
 * oversubscribed machine starves the calling thread (measured 0.9 tok/s on
 * a shared 2-core box); the passive policy pays a futex round trip per
 * region instead. This pool spins for a bounded time (DSQ_CPU_SPIN_US,
 * default 200 us: enough to cover the gap between two ops of one decode
 * step), then yields, then sleeps on a futex, so an idle engine burns no
 * CPU, and the calling thread always works too.
 *
 * A job is n_chunks calls fn(ctx, i, n_chunks), i = 0..n_chunks-1, each
 * exactly once, claimed dynamically by whichever thread comes first through
 * one 64-bit word `work` = (generation << 32) | (n_chunks << 16) | next. A
 * claim is a compare-and-swap that also checks the generation, so a worker
 * that wakes late (descheduled on a busy machine) finds the job exhausted
 * or replaced and touches nothing of it; the caller never waits for a
 * worker that has not started, only for chunks already claimed (`done`
 * counts finished chunks). Which thread runs a chunk never changes what the
 * chunk computes, so results do not depend on timing or thread count.
 *
 * Wake-up: workers wait for the 32-bit futex word `gen` to move. The caller
 * publishes the job (plain fields, then `work`), bumps `gen` (seq_cst) and
 * calls FUTEX_WAKE only if some worker announced it sleeps (a sleeper
 * increments `n_sleep` before re-checking `gen` and calling FUTEX_WAIT with
 * the value it saw, so no wake-up is lost). The caller waits for `done` the
 * same way (spin, then futex, woken by whoever finishes the last chunk).
 *
 * One job at a time: `busy` is taken with a compare-and-swap; a second
 * thread calling an op concurrently, or an op called from inside a job,
 * finds it taken and runs its chunks inline, so the API is safe from any
 * thread, just not parallel from two at once. Workers are created on first
 * parallel use and re-created when dsq_cpu_set_threads changes the count;
 * an atexit handler joins them when no job is running (otherwise they live
 * for the process lifetime); a fork()ed child starts without workers.
 */
#include "cpu_internal.h"
#include "engine/common/clock.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_WORKERS 256

#define MAX_CHUNKS 0xFFFF

typedef struct pool {
    /* job: written by the caller before `work` is published, read by a
     * thread only after it claimed a chunk of that job */
    dsq__region_fn fn;
    void *ctx;

    _Atomic uint64_t work;          /* gen << 32 | n_chunks << 16 | next  */
    _Atomic uint32_t gen;           /* futex word for workers              */
    _Atomic uint32_t done;          /* chunks finished; futex for caller   */
    _Atomic int n_sleep;            /* workers in (or entering) FUTEX_WAIT  */
    _Atomic int caller_sleeps;
    _Atomic bool quit;

    int n_workers;                  /* pthreads alive (threads - 1)        */
    uint32_t start_gen;             /* gen when the workers were created   */
    pthread_t tid[MAX_WORKERS];
    long spin_ns;
} pool_t;

static pool_t pool;
static _Atomic int busy;            /* 1 while a job (or resize) runs      */
static bool atexit_done;

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

/* Wait until *word != seen: spin spin_ns, yield a little, then sleep
 * (announcing it through *sleepers so the waker knows to FUTEX_WAKE). */
static uint32_t wait_change(_Atomic uint32_t *word, uint32_t seen, long spin_ns,
                            _Atomic int *sleepers)
{
    uint32_t v;
    long t0 = 0;
    for (unsigned it = 0;; it++) {
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != seen)
            return v;
        CPU_RELAX();
        if ((it & 63) == 63) {
            long t = dsq_clock_now_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > spin_ns)
                break;
        }
    }
    for (int y = 0; y < 4; y++) {
        sched_yield();
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != seen)
            return v;
    }
    for (;;) {
        atomic_fetch_add(sleepers, 1);
        v = atomic_load(word);
        if (v == seen)
            futex(word, FUTEX_WAIT_PRIVATE, seen);
        atomic_fetch_sub(sleepers, 1);
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != seen)
            return v;
    }
}

/* Claim and run chunks of job generation g until none is left. */
static void run_chunks(uint32_t g)
{
    uint64_t v = atomic_load_explicit(&pool.work, memory_order_acquire);
    for (;;) {
        const uint32_t n = (uint32_t)(v >> 16) & 0xFFFF, i = (uint32_t)v & 0xFFFF;
        if ((uint32_t)(v >> 32) != g || i >= n)
            break;
        if (!atomic_compare_exchange_weak_explicit(&pool.work, &v, v + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;               /* v reloaded: try again */
        pool.fn(pool.ctx, (int)i, (int)n);
        uint32_t d = atomic_fetch_add(&pool.done, 1) + 1;      /* seq_cst */
        if (d == n && atomic_load(&pool.caller_sleeps))
            futex(&pool.done, FUTEX_WAKE_PRIVATE, 1);
        v = atomic_load_explicit(&pool.work, memory_order_acquire);
    }
}

static void *worker_main(void *arg)
{
    (void)arg;
    /* the generation before the first job: read at creation time, since the
     * caller may publish a job before this thread first runs */
    uint32_t seen = pool.start_gen;
    for (;;) {
        seen = wait_change(&pool.gen, seen, pool.spin_ns, &pool.n_sleep);
        if (atomic_load_explicit(&pool.quit, memory_order_acquire))
            break;
        run_chunks(seen);
    }
    return NULL;
}

static void stop_workers(void)
{
    if (pool.n_workers == 0)
        return;
    atomic_store(&pool.quit, true);
    atomic_fetch_add(&pool.gen, 1);
    futex(&pool.gen, FUTEX_WAKE_PRIVATE, INT_MAX);
    for (int i = 0; i < pool.n_workers; i++)
        pthread_join(pool.tid[i], NULL);
    pool.n_workers = 0;
    atomic_store(&pool.quit, false);
}

static void at_exit(void)
{
    int expect = 0;
    if (atomic_compare_exchange_strong(&busy, &expect, 1)) {
        stop_workers();
        atomic_store(&busy, 0);
    }
}

/* A forked child has none of the parent's workers: forget them (the next
 * job creates new ones; until then the caller would run every chunk
 * itself anyway, since chunks are claimed, not assigned). */
static void at_fork_child(void)
{
    pool.n_workers = 0;
    atomic_store(&pool.n_sleep, 0);
    atomic_store(&pool.caller_sleeps, 0);
    atomic_store(&busy, 0);
}

/* Make n_threads - 1 workers exist (busy held). Returns the count running
 * (fewer if pthread_create fails: the regions then use fewer threads). */
static int ensure_workers(int n_threads)
{
    int want = n_threads - 1;
    if (want > MAX_WORKERS)
        want = MAX_WORKERS;
    if (want == pool.n_workers)
        return want;
    stop_workers();
    if (pool.spin_ns == 0) {
        const char *e = getenv("DSQ_CPU_SPIN_US");
        long us = e ? atol(e) : 200;
        pool.spin_ns = (us < 0 ? 0 : us) * 1000L + 1;
    }
    if (!atexit_done) {
        atexit_done = true;
        atexit(at_exit);
        pthread_atfork(NULL, NULL, at_fork_child);
    }
    pool.start_gen = atomic_load(&pool.gen);
    for (int i = 0; i < want; i++) {
        if (pthread_create(&pool.tid[i], NULL, worker_main,
                           (void *)(intptr_t)(i + 1)) != 0)
            break;
        pool.n_workers++;
    }
    return pool.n_workers;
}

static void run_inline(int n_chunks, dsq__region_fn fn, void *ctx)
{
    for (int i = 0; i < n_chunks; i++)
        fn(ctx, i, n_chunks);
}

void dsq__parallel(int n_chunks, dsq__region_fn fn, void *ctx)
{
    if (n_chunks <= 0)
        return;
    const int cap = dsq_cpu_get_threads();
    int expect = 0;
    if (n_chunks == 1 || cap <= 1 || n_chunks > MAX_CHUNKS ||
        !atomic_compare_exchange_strong(&busy, &expect, 1)) {
        run_inline(n_chunks, fn, ctx);
        return;
    }
    if (ensure_workers(cap) == 0) {
        run_inline(n_chunks, fn, ctx);
    } else {
        pool.fn = fn;
        pool.ctx = ctx;
        atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
        const uint32_t g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
        atomic_store_explicit(&pool.work,
                              ((uint64_t)g << 32) | ((uint64_t)n_chunks << 16),
                              memory_order_release);
        atomic_store(&pool.gen, g);                     /* seq_cst: publish */
        if (atomic_load(&pool.n_sleep) > 0)
            futex(&pool.gen, FUTEX_WAKE_PRIVATE, INT_MAX);
        run_chunks(g);
        /* every chunk is claimed; wait for those other threads still run */
        uint32_t d = atomic_load_explicit(&pool.done, memory_order_acquire);
        while (d != (uint32_t)n_chunks)
            d = wait_change(&pool.done, d, pool.spin_ns, &pool.caller_sleeps);
    }
    atomic_store(&busy, 0);
}

struct for_ctx {
    dsq__range_fn fn;
    void *ctx;
    int64_t n;
};

static void for_region(void *p, int chunk, int n_chunks)
{
    const struct for_ctx *f = p;
    int64_t i0, i1;
    dsq__split(f->n, chunk, n_chunks, &i0, &i1);
    if (i1 > i0)
        f->fn(f->ctx, i0, i1);
}

void dsq__parallel_for(int64_t n, int64_t min_per_chunk, dsq__range_fn fn,
                       void *ctx)
{
    if (n <= 0)
        return;
    if (min_per_chunk < 1)
        min_per_chunk = 1;
    const int nt = dsq_cpu_get_threads();
    /* up to 4 chunks per thread, so a descheduled thread's share is small */
    int64_t nc = n / min_per_chunk;
    if (nc > 4 * (int64_t)nt)
        nc = 4 * (int64_t)nt;
    if (nt <= 1 || nc <= 1) {
        fn(ctx, 0, n);
        return;
    }
    struct for_ctx f = {fn, ctx, n};
    dsq__parallel((int)nc, for_region, &f);
}

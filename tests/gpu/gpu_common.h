/* Helpers of the CUDA-vs-CPU checks in tests/gpu: a fixed-seed xorshift
 * generator, device buffers filled from the host or poisoned (0xFF bytes:
 * NaN for floats, so an output the kernel forgets to write fails),
 * comparisons, the TAP report line, and the skip rule: without a CUDA
 * device a test prints "1..0 # SKIP" unless DSQ_REQUIRE_GPU=1 (set by
 * the simulator runs of scripts/test, and on a GPU machine), which makes it
 * a failure. Every array the helpers return is owned by the caller. */
#ifndef DSQ_GPU_COMMON_H
#define DSQ_GPU_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t gpu_rng = 0x13198a2e03707344ull;
static inline double urand(void)
{
    gpu_rng ^= gpu_rng << 13;
    gpu_rng ^= gpu_rng >> 7;
    gpu_rng ^= gpu_rng << 17;
    return (double)(gpu_rng >> 11) / 9007199254740992.0;
}
/* uniform in [-a, a) */
static inline float frand(float a) { return (float)((urand() * 2.0 - 1.0) * a); }

static inline void *dev_dup(const void *h, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
    if (bytes)
        assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static inline void *dev_poison(size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
    assert_int_equal(cudaMemset(d, 0xff, bytes ? bytes : 1), cudaSuccess);
    return d;
}
static inline void dev_get(void *h, const void *d, size_t bytes)
{
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}
/* max |a - b|; INFINITY when either holds a NaN */
static inline double max_diff(const float *a, const float *b, int64_t n)
{
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d))
            return INFINITY;
        e = d > e ? d : e;
    }
    return e;
}
static inline void report(const char *what, double err, double tol)
{
    printf("# %-44s max_abs_diff=%.3e tol=%.1e\n", what, err, tol);
    assert_true(err <= tol);
}

/* 0 to run the tests, else the exit code main returns after printing the
 * skip (or, with DSQ_REQUIRE_GPU=1, the failure). */
static inline int gpu_skip_code(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) == cudaSuccess && n_dev >= 1)
        return -1;
    const char *req = getenv("DSQ_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0) {
        printf("1..1\nnot ok 1 - no CUDA device but DSQ_REQUIRE_GPU=1\n");
        return 1;
    }
    printf("1..0 # SKIP no CUDA device\n");
    return 0;
}

#endif

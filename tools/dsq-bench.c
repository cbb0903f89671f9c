/* dsq-bench: per-op and end-to-end measurements.
 *
 * Subcommands so far:
 *   matmul  dsq_cpu_matmul on the SmolLM2-135M shapes (576x576, 576x1536,
 *           1536x576, 49152x576 = n x k), INT4 (ZP_MIN group 32, i.e. repacked
 *           Q4_1) and Q8_0 for the tied lm_head, at m = 1 (decode) and
 *           m = 512 (prefill), on 1 and 2 threads. Prints time per call,
 *           weight bytes streamed per second (GB/s) and GFLOP/s (2*m*n*k).
 * Weights are random: timing does not depend on values. */
#include "dsq_config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "kernels.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_matmul(int argc, char **argv)
{
    static const int64_t shapes[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
    static const int64_t ms[] = {1, 512};
    int max_threads = 2;
    double min_s = 0.3;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            max_threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            min_s = atof(argv[++i]);
    }
    printf("# isa=%s; n x k; format; m; threads; wall ms/call, GB/s (weights), GFLOP/s;"
           " then the same from process CPU time (all threads)\n",
           dsq_cpu_isa());
    int rc = 0;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]) && rc == 0; si++) {
        const int64_t n = shapes[si][0], k = shapes[si][1];
        dsq_weight_t w = {.n = n, .k = k, .group_size = 32};
        if (n == 49152) {
            w.format = DSQ_WFMT_Q8_0;
        } else {
            w.format = DSQ_WFMT_INT4;
            w.zp_mode = DSQ_ZP_MIN;
        }
        size_t db = dsq_weight_data_bytes(w.format, n, k, 32);
        size_t sb = dsq_weight_scale_bytes(w.format, n, k, 32);
        uint8_t *data = malloc(db);
        uint16_t *sc = malloc(sb ? sb : 2), *zr = malloc(sb ? sb : 2);
        float *x = malloc((size_t)(512 * k) * sizeof(float));
        float *y = malloc((size_t)(512 * n) * sizeof(float));
        if (!data || !sc || !zr || !x || !y) {
            rc = DSQ_ENOMEM;
        } else {
            srand(1);
            for (size_t i = 0; i < db; i++)
                data[i] = (uint8_t)rand();
            if (w.format == DSQ_WFMT_Q8_0)
                for (size_t b = 0; b < db; b += 34) {
                    data[b] = 0x00;
                    data[b + 1] = 0x20;    /* d = fp16 2^-7 */
                }
            for (size_t i = 0; i < sb / 2; i++) {
                sc[i] = 0x2000;
                zr[i] = 0xa000;
            }
            for (int64_t i = 0; i < 512 * k; i++)
                x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
            w.data = data;
            w.scales = sb ? sc : NULL;
            w.zeros = sb ? zr : NULL;
            for (size_t mi = 0; mi < 2; mi++)
                for (int t = 1; t <= max_threads; t++) {
                    dsq_cpu_set_threads(t);
                    int64_t m = ms[mi];
                    dsq_cpu_matmul(y, x, m, &w);    /* warm-up */
                    int iters = 0;
                    double t0 = now_s(), c0 = cpu_s(), el = 0.0;
                    do {
                        dsq_cpu_matmul(y, x, m, &w);
                        iters++;
                        el = now_s() - t0;
                    } while (el < min_s);
                    double per = el / iters;
                    /* CPU seconds per call per thread: on a shared machine
                     * this is what the kernel costs when it runs */
                    double cpu = (cpu_s() - c0) / iters / t;
                    printf("%6lld x %4lld  %-10s m=%-4lld t=%d  %9.3f ms  %7.2f GB/s  %8.2f GFLOP/s | cpu/thread %8.3f ms  %7.2f GB/s  %8.2f GFLOP/s\n",
                           (long long)n, (long long)k,
                           w.format == DSQ_WFMT_Q8_0 ? "Q8_0" : "INT4/g32", (long long)m, t,
                           per * 1e3, (double)(db + 2 * sb) / per * 1e-9,
                           2.0 * (double)m * (double)n * (double)k / per * 1e-9,
                           cpu * 1e3, (double)(db + 2 * sb) / cpu / t * 1e-9,
                           2.0 * (double)m * (double)n * (double)k / cpu / t * 1e-9);
                    fflush(stdout);
                }
        }
        free(data); free(sc); free(zr); free(x); free(y);
    }
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("dsq-bench %s\n", DSQ_VERSION);
            return 0;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: dsq-bench [--help] [--version]\n"
                   "       dsq-bench matmul [--threads N] [--seconds S]\n");
            return 0;
        }
    }
    if (argc >= 2 && strcmp(argv[1], "matmul") == 0)
        return bench_matmul(argc - 2, argv + 2);
    fprintf(stderr, "dsq-bench: unknown or missing subcommand (see --help)\n");
    return 2;
}

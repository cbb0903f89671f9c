/* dsq-bench attn: the CPU attention op alone (dsq_cpu_attention) on
 * synthetic data, timed by the wall clock and by the CPU time of the whole
 * process, so that a figure from a shared box can be read against its load
 * (with --threads 1 the CPU time hardly depends on what else runs).
 *   prefill: one sequence, --rows R consecutive rows ending at position
 *            --context C - 1 (C = R by default: a whole prompt as one chunk);
 *   decode:  --seqs S sequences, one row each at position C - 1.
 * --layers L keeps L separate caches and calls the op once for each in
 * turn, so that a decode at long context streams its KV from DRAM as a
 * forward pass does (SmolLM2's 30 layers at 4,096 positions: 94 MB).
 * Shapes default to SmolLM2-135M's: 9 heads, 3 kv heads, head_dim 64, FP16
 * KV, block_size 16, blocks of a sequence contiguous (a fresh server).
 * Prints the best of --reps repetitions (after one warm-up): milliseconds
 * per layer by wall clock and by CPU time, and GFLOP/s (4 flops per query
 * head, attended key and dim) on the wall time. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

static double now_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float rnd(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

int dsq__bench_attn(int argc, char **argv)
{
    const char *mode = "prefill", *dt = "f16";
    int rows = 0, ctx = 0, seqs = 1, layers = 1, n_heads = 9, n_kv = 3, D = 64, bs = 16;
    int threads = 0, reps = 3;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0) {
            mode = "help";
            break;
        }
        if (!v) {
            fprintf(stderr, "dsq-bench attn: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--mode") == 0)
            mode = v;
        else if (strcmp(a, "--kv-dtype") == 0)
            dt = v;
        else if (strcmp(a, "--rows") == 0)
            rows = atoi(v);
        else if (strcmp(a, "--context") == 0)
            ctx = atoi(v);
        else if (strcmp(a, "--seqs") == 0)
            seqs = atoi(v);
        else if (strcmp(a, "--layers") == 0)
            layers = atoi(v);
        else if (strcmp(a, "--heads") == 0)
            n_heads = atoi(v);
        else if (strcmp(a, "--kv-heads") == 0)
            n_kv = atoi(v);
        else if (strcmp(a, "--head-dim") == 0)
            D = atoi(v);
        else if (strcmp(a, "--block-size") == 0)
            bs = atoi(v);
        else if (strcmp(a, "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(a, "--reps") == 0)
            reps = atoi(v);
        else {
            fprintf(stderr, "dsq-bench attn: unknown argument %s\n", a);
            return 2;
        }
    }
    const bool decode = strcmp(mode, "decode") == 0;
    const dsq_kv_dtype_t kdt = strcmp(dt, "int8") == 0  ? DSQ_KV_INT8
                               : strcmp(dt, "f32") == 0 ? DSQ_KV_F32
                                                        : DSQ_KV_F16;
    if (rows <= 0)
        rows = decode ? 1 : 512;
    if (ctx <= 0)
        ctx = decode ? 1024 : rows;
    if (!decode)
        seqs = 1;
    const bool help = strcmp(mode, "help") == 0;
    if (help || (!decode && strcmp(mode, "prefill") != 0) || rows > ctx || seqs < 1 || layers < 1 ||
        n_kv < 1 || n_heads % n_kv || D < 1 || bs < 1 || reps < 1 ||
        (strcmp(dt, "f16") && strcmp(dt, "int8") && strcmp(dt, "f32"))) {
        fprintf(help ? stdout : stderr, "usage: dsq-bench attn [--mode prefill|decode] [--rows 512] "
                        "[--context N] [--seqs 1] [--layers 1] [--heads 9] [--kv-heads 3] "
                        "[--head-dim 64] [--kv-dtype f16|int8|f32] [--block-size 16] "
                        "[--threads N] [--reps 3]\n");
        return help ? 0 : 2;
    }
    if (threads > 0 && dsq_cpu_set_threads(threads) != 0) {
        fprintf(stderr, "dsq-bench attn: bad --threads %d\n", threads);
        return 2;
    }
    const int m = decode ? seqs : rows, row = n_kv * D, qrow = n_heads * D;
    const int max_blocks = (ctx + bs - 1) / bs;
    const int64_t n_blocks = (int64_t)seqs * max_blocks, n_tok = (int64_t)seqs * ctx;
    const int n_groups = dsq_kv_n_groups(D);
    const size_t es = kdt == DSQ_KV_F16 ? 2 : kdt == DSQ_KV_F32 ? 4 : 1;
    const size_t n_el = (size_t)n_blocks * bs * row, n_sc = (size_t)n_blocks * bs * n_kv * n_groups;
    dsq_kv_layer_t *kl = calloc((size_t)layers, sizeof(*kl));
    int32_t *bt = malloc(sizeof(*bt) * (size_t)n_blocks);
    int32_t *slot = malloc(sizeof(*slot) * (size_t)n_tok);
    int32_t *rseq = malloc(sizeof(*rseq) * (size_t)m), *rpos = malloc(sizeof(*rpos) * (size_t)m);
    float *kv = malloc(sizeof(*kv) * (size_t)ctx * row * 2);
    float *q = malloc(sizeof(*q) * (size_t)m * qrow), *out = malloc(sizeof(*out) * (size_t)m * qrow);
    int rc = 1;
    if (!kl || !bt || !slot || !rseq || !rpos || !kv || !q || !out)
        goto undo_alloc;
    uint32_t seed = 7;
    for (int64_t b = 0; b < n_blocks; b++)
        bt[b] = (int32_t)b;
    for (int i = 0; i < m * qrow; i++)
        q[i] = rnd(&seed);
    for (int i = 0; i < m; i++) {
        rseq[i] = decode ? i : 0;
        rpos[i] = decode ? ctx - 1 : ctx - rows + i;
    }
    for (int y = 0; y < layers; y++) {
        dsq_kv_layer_t *l = &kl[y];
        *l = (dsq_kv_layer_t){.dtype = kdt, .block_size = bs, .n_kv_heads = n_kv,
                              .head_dim = D, .n_blocks = n_blocks};
        l->k = malloc(n_el * es);
        l->v = malloc(n_el * es);
        if (kdt == DSQ_KV_INT8) {
            l->k_scale = malloc(n_sc * 2), l->k_zero = malloc(n_sc * 2);
            l->v_scale = malloc(n_sc * 2), l->v_zero = malloc(n_sc * 2);
        }
        if (!l->k || !l->v || (kdt == DSQ_KV_INT8 && (!l->k_scale || !l->k_zero ||
                                                      !l->v_scale || !l->v_zero)))
            goto undo_alloc;
        for (int s = 0; s < seqs; s++) {
            for (int64_t i = 0; i < (int64_t)ctx * row * 2; i++)
                kv[i] = rnd(&seed);
            for (int p = 0; p < ctx; p++)
                slot[p] = bt[(int64_t)s * max_blocks + p / bs] * bs + p % bs;
            if (dsq_cpu_kv_write(l, kv, kv + (size_t)ctx * row, slot, ctx) != 0)
                goto undo_alloc;
        }
    }
    double flops = 0;
    for (int i = 0; i < m; i++)
        flops += 4.0 * (rpos[i] + 1) * n_heads * D;
    double best_w = 1e30, best_c = 1e30;
    for (int r = -1; r < reps; r++) {               /* r = -1: warm-up */
        const double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        for (int y = 0; y < layers; y++)
            if (dsq_cpu_attention(out, q, m, n_heads, &kl[y], rseq, rpos, bt, max_blocks,
                                  0.125f) != 0)
                goto undo_alloc;
        const double w = now_s(CLOCK_MONOTONIC) - w0, c = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (r >= 0) {
            best_w = w < best_w ? w : best_w;
            best_c = c < best_c ? c : best_c;
        }
    }
    printf("# dsq-bench attn: %s, %d rows, context %d, %d seqs, %d layers, heads %d/%d, "
           "head_dim %d, kv %s, block_size %d, isa %s, threads %d\n",
           mode, m, ctx, seqs, layers, n_heads, n_kv, D, dt, bs, dsq_cpu_isa(),
           dsq_cpu_get_threads());
    printf("ms/layer wall %.3f  cpu %.3f  GFLOP/s (wall) %.1f\n", best_w * 1e3 / layers,
           best_c * 1e3 / layers, flops * layers / best_w * 1e-9);
    rc = 0;
undo_alloc:
    if (rc)
        fprintf(stderr, "dsq-bench attn: out of memory or op failed\n");
    for (int y = 0; kl && y < layers; y++) {
        free(kl[y].k), free(kl[y].v);
        free(kl[y].k_scale), free(kl[y].k_zero), free(kl[y].v_scale), free(kl[y].v_zero);
    }
    free(kl), free(bt), free(slot), free(rseq), free(rpos), free(kv), free(q), free(out);
    return rc;
}

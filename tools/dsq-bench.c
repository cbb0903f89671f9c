/* dsq-bench: per-op and end-to-end measurements.
 *
 * Subcommands so far:
 *   matmul  dsq_cpu_matmul on the SmolLM2-135M shapes (576x576, 576x1536,
 *           1536x576, 49152x576 = n x k), INT4 (ZP_MIN group 32, i.e. repacked
 *           Q4_1) and Q8_0 for the tied lm_head, at m = 1 (decode) and
 *           m = 512 (prefill), on 1 and 2 threads. Prints time per call,
 *           weight bytes streamed per second (GB/s) and GFLOP/s (2*m*n*k).
 *   cpu     end to end on a real model: prompt processing (one prefill of
 *           --prompt-tokens) and generation (--gen-tokens decode steps)
 *           tok/s, as llama-bench's pp512 / tg128 (see bench_cpu).
 *   pad     fits the padding cost model (engine/serve/padding.h) on a real model
 *           (bench_pad.c).
 *   attn    the CPU attention op alone, prefill chunk or decode rows, wall and
 *           CPU time (bench_attn.c).
 *   gpu     the CUDA backend's INT4 products, copy bandwidth and paged
 *           attention at DeepSeek/Qwen layer shapes (bench_gpu.c).
 *   serve   HTTP load against dsqd and/or llama.cpp's llama-server: request
 *           throughput, output tok/s, TTFT and inter-token latency under N
 *           concurrent streamed clients (bench_serve.c).
 * Weights are random: timing does not depend on values. */
#include "dsq_config.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/common/error.h"
#include "engine/common/clock.h"
#include "kernels.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The machine's ceiling for a weight-streaming step: bytes/s that n
 * threads read from DRAM (a STREAM-like sum over a buffer far larger than
 * the caches, each thread its own slice). A core reading one sequential
 * stream is bounded by the misses it keeps in flight, not by the memory
 * (on an Ice Lake guest one stream a thread read 19 GB/s where the
 * interleaved product kernels, two streams a thread, read 25), so each
 * thread reads its slice as 1, 2, 4 and 8 interleaved streams; the figure
 * is the best of every stream count and 3 passes. */
typedef unsigned long long bw_vec_t __attribute__((vector_size(32)));

typedef struct bw_job {
    const bw_vec_t *p;
    size_t n;       /* vectors in the slice */
    int streams;    /* 1, 2, 4 or 8 sub-slices read side by side */
    bw_vec_t sum;
} bw_job_t;

static inline __attribute__((always_inline)) void bw_sum(bw_job_t *j, const int S)
{
    const size_t len = j->n / (size_t)S;    /* vectors per stream */
    bw_vec_t a[8] = {{0}};
    for (size_t i = 0; i + 4 <= len; i += 4)
        for (int s = 0; s < S; s++) {
            const bw_vec_t *q = j->p + (size_t)s * len + i;
            a[s] += q[0] + q[1] + q[2] + q[3];
        }
    bw_vec_t t = {0};
    for (int s = 0; s < S; s++)
        t += a[s];
    j->sum = t;
}

static void *bw_read(void *arg)
{
    bw_job_t *j = arg;
    switch (j->streams) {   /* a constant count each, so a[] stays in registers */
    case 1: bw_sum(j, 1); break;
    case 2: bw_sum(j, 2); break;
    case 4: bw_sum(j, 4); break;
    default: bw_sum(j, 8); break;
    }
    return NULL;
}

double dsq__bench_read_bandwidth(int threads)
{
    const size_t bytes = (size_t)1 << 30, nv = bytes / sizeof(bw_vec_t);
    bw_vec_t *buf = aligned_alloc(64, bytes);
    if (!buf || threads < 1 || threads > 64) {
        free(buf);
        return 0.0;
    }
    memset(buf, 1, bytes);
    double best = 0.0;
    for (int pass = 0; pass < 12; pass++) {
        const int streams = 1 << (pass % 4);
        pthread_t th[64];
        bw_job_t jobs[64];
        const size_t per = nv / (size_t)threads / 32 * 32;   /* whole streams */
        double t0 = dsq_clock_now_s();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (bw_job_t){buf + per * (size_t)t, per, streams, {0}};
            if (t > 0)
                pthread_create(&th[t], NULL, bw_read, &jobs[t]);
        }
        bw_read(&jobs[0]);
        for (int t = 1; t < threads; t++)
            pthread_join(th[t], NULL);
        double el = dsq_clock_now_s() - t0;
        volatile unsigned long long sink = jobs[0].sum[0];
        (void)sink;
        double bw = (double)(per * (size_t)threads * sizeof(bw_vec_t)) / el;
        best = bw > best ? bw : best;
    }
    free(buf);
    return best;
}

/* matmul: the product kernels alone at a model's layer shapes. */
static int bench_matmul(int argc, char **argv)
{
    static const int64_t small[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
    /* DeepSeek-Coder-6.7B / DeepSeek-LLM-7B: q/k/v/o, gate/up, down, lm_head */
    static const int64_t big[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008},
                                     {32256, 4096}};
    static const int64_t ms[] = {1, 512};
    int max_threads = 2;
    double min_s = 0.3;
    bool use_big = false, x8 = false, probe = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            max_threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            min_s = atof(argv[++i]);
        else if (strcmp(argv[i], "--shapes") == 0 && i + 1 < argc)
            use_big = strcmp(argv[++i], "6.7b") == 0;
        else if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc)
            x8 = strcmp(argv[++i], "x8") == 0;
        else if (strcmp(argv[i], "--bandwidth") == 0)
            probe = true;
    }
    const int64_t(*shapes)[2] = use_big ? big : small;
    printf("# isa=%s; n x k; format; m; threads; wall ms/call, GB/s (weights), GFLOP/s;"
           " then the same from process CPU time (all threads)\n",
           dsq_cpu_isa());
    for (int t = 1; probe && t <= max_threads; t++)
        printf("# DRAM read bandwidth, %d thread(s): %.1f GB/s\n", t,
               dsq__bench_read_bandwidth(t) * 1e-9);
    int rc = 0;
    for (size_t si = 0; si < 4 && rc == 0; si++) {
        const int64_t n = shapes[si][0], k = shapes[si][1];
        dsq_weight_t w = {.n = n, .k = k, .group_size = 32};
        if (n == 49152 || n == 32256) {
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
            if (x8 && w.format == DSQ_WFMT_INT4)
                rc = dsq_weight_interleave_x8(&w);
            const char *fmt = w.format == DSQ_WFMT_Q8_0 ? "Q8_0"
                            : w.format == DSQ_WFMT_INT4_X8 ? "INT4x8/g32" : "INT4/g32";
            for (size_t mi = 0; mi < 2 && rc == 0; mi++)
                for (int t = 1; t <= max_threads; t++) {
                    dsq_cpu_set_threads(t);
                    int64_t m = ms[mi];
                    dsq_cpu_matmul(y, x, m, &w);    /* warm-up */
                    int iters = 0;
                    double t0 = dsq_clock_now_s(), c0 = cpu_s(), el = 0.0;
                    do {
                        dsq_cpu_matmul(y, x, m, &w);
                        iters++;
                        el = dsq_clock_now_s() - t0;
                    } while (el < min_s);
                    double per = el / iters;
                    /* CPU seconds per call per thread: on a shared machine
                     * this is what the kernel costs when it runs */
                    double cpu = (cpu_s() - c0) / iters / t;
                    printf("%6lld x %5lld  %-10s m=%-4lld t=%d  %9.3f ms  %7.2f GB/s  %8.2f GFLOP/s | cpu/thread %8.3f ms  %7.2f GB/s  %8.2f GFLOP/s\n",
                           (long long)n, (long long)k, fmt, (long long)m, t,
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

/* cpu: end-to-end prompt processing and generation on the CPU backend, like
 * llama-bench's pp/tg tests: one prefill of P tokens (all in one forward
 * step, logits of the last row only), then G decode steps of one token each
 * starting from an empty cache. Token ids are fixed pseudo-random in-vocab
 * ids (timing does not depend on them); the cache is cleared between the
 * two tests and between repetitions. Prints the best and mean tok/s over
 * --reps repetitions (plus one untimed warm-up of each test). */
static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static int cpu_steps(dsq_model_t *model, dsq_kv_cache_t *kv, const int32_t *ids,
                     int n, bool one_step, float *logits)
{
    dsq_block_table_t bt;
    dsq_block_table_init(&bt);
    int rc = dsq_kv_seq_reserve(kv, &bt, n);
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    int32_t *rs = calloc((size_t)n, sizeof(int32_t));
    int32_t *slot = malloc((size_t)n * sizeof(int32_t));
    if (!pos || !rs || !slot)
        rc = rc ? rc : DSQ_ENOMEM;
    for (int i = 0; rc == 0 && i < n; i++) {
        pos[i] = i;
        slot[i] = dsq_kv_slot(kv, &bt, i);
    }
    const int step = one_step ? n : 1;
    for (int t0 = 0; rc == 0 && t0 < n; t0 += step) {
        int32_t last = step - 1;
        dsq_batch_t b = {
            .n_tokens = step, .tokens = ids + t0, .pos = pos + t0, .row_seq = rs,
            .slot = slot + t0, .n_seqs = 1, .block_tables = bt.ids,
            .max_blocks = bt.n, .n_logits = 1, .logit_rows = &last,
        };
        rc = dsq_model_forward(model, kv, &b, logits);
    }
    free(pos);
    free(rs);
    free(slot);
    dsq_kv_seq_free(kv, &bt);
    dsq_block_table_deinit(&bt);
    return rc;
}

static int bench_cpu(int argc, char **argv)
{
    const char *path = NULL;
    int threads = 0, n_pp = 512, n_tg = 128, reps = 3;
    bool probe = false;
    dsq_model_opts_t mo = {0};
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strcmp(argv[i], "--activation-dtype") == 0 && i + 1 < argc &&
                 (strcmp(argv[i + 1], "int8") == 0 || strcmp(argv[i + 1], "fp32") == 0))
            mo.activation_dtype = strcmp(argv[++i], "fp32") == 0 ? DSQ_ACT_F32 : DSQ_ACT_INT8;
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc)
            mo.rows_layout = strcmp(argv[++i], "rows") == 0;
        else if (strcmp(argv[i], "--bandwidth") == 0)
            probe = true;
        else if (strcmp(argv[i], "--prompt-tokens") == 0 && i + 1 < argc)
            n_pp = atoi(argv[++i]);
        else if (strcmp(argv[i], "--gen-tokens") == 0 && i + 1 < argc)
            n_tg = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "dsq-bench cpu: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!path || n_pp < 0 || n_tg < 0 || reps < 1) {
        fprintf(stderr, "usage: dsq-bench cpu --model PATH [--threads N] "
                        "[--prompt-tokens 512] [--gen-tokens 128] [--reps 3] "
                        "[--activation-dtype int8|fp32] [--layout x8|rows] [--bandwidth]\n");
        return 2;
    }
    if (threads > 0 && dsq_cpu_set_threads(threads) != 0) {
        fprintf(stderr, "dsq-bench cpu: bad --threads %d\n", threads);
        return 2;
    }
    char err[512] = "";
    int rc = 1;
    dsq_model_t *model = NULL;
    dsq_kv_cache_t *kv = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    dsq_model_file_t *f = dsq_model_file_open(path, NULL, err, sizeof(err));
    if (f)
        model = dsq_model_create(f, &mo, err, sizeof(err));
    if (model) {
        const dsq_model_config_t *c = dsq_model_config(model);
        int n_max = n_pp > n_tg ? n_pp : n_tg;
        /* the cache the architecture keeps (MLA: one latent + rope key per
         * token, no V) */
        int n_kv = 0, hd = 0;
        bool has_v = true;
        dsq_model_kv_shape(model, &n_kv, &hd, &has_v);
        kv = dsq_kv_create_ex((int)c->n_layer, n_kv, hd, 16, n_max / 16 + 2, DSQ_KV_F16,
                              has_v, err, sizeof(err));
        logits = malloc((size_t)c->n_vocab * sizeof(float));
        ids = malloc((size_t)(n_max + 1) * sizeof(int32_t));
        uint32_t seed = 42;
        for (int i = 0; ids && i <= n_max; i++)
            ids[i] = (int32_t)(lcg(&seed) % (uint32_t)c->n_vocab);
    }
    if (!model || !kv || !logits || !ids) {
        fprintf(stderr, "dsq-bench cpu: %s\n", err[0] ? err : "out of memory");
        goto out;
    }
    const size_t per_tok = dsq_model_decode_bytes(model);
    printf("# dsq-bench cpu: model %s, isa %s, threads %d, weights %.1f MiB, "
           "read per decode token %.1f MiB\n", path, dsq_cpu_isa(), dsq_cpu_get_threads(),
           (double)dsq_model_weight_bytes(model) / (1024.0 * 1024.0),
           (double)per_tok / (1024.0 * 1024.0));
    printf("# test      tokens  best tok/s  mean tok/s  (reps %d)\n", reps);
    for (int test = 0; test < 2; test++) {
        const int n = test == 0 ? n_pp : n_tg;
        if (n == 0)
            continue;
        /* the decode ceiling: DRAM read bandwidth over the bytes a token
         * reads, probed right before and right after the decode runs (on
         * shared hosts it moves between modes from minute to minute; the
         * larger of the two is the ceiling) */
        double bw = 0.0, bw0 = 0.0;
        if (probe && test == 1)
            bw0 = dsq__bench_read_bandwidth(dsq_cpu_get_threads());
        double best = 0, sum = 0;
        for (int r = -1; r < reps; r++) {       /* r = -1: warm-up */
            double t0 = dsq_clock_now_s();
            int frc = cpu_steps(model, kv, ids, n, test == 0, logits);
            if (frc != 0) {
                fprintf(stderr, "dsq-bench cpu: %s of %d tokens failed: %s\n",
                        test == 0 ? "prefill" : "decode", n, dsq_strerror(frc));
                goto out;
            }
            double tps = n / (dsq_clock_now_s() - t0);
            if (r >= 0) {
                sum += tps;
                best = tps > best ? tps : best;
            }
        }
        if (probe && test == 1) {
            const double bw1 = dsq__bench_read_bandwidth(dsq_cpu_get_threads());
            bw = bw0 > bw1 ? bw0 : bw1;
            printf("# DRAM read bandwidth (%d threads), before / after the decode runs: "
                   "%.1f / %.1f GB/s; decode ceiling %.1f tok/s; decode reads %.1f GB/s\n",
                   dsq_cpu_get_threads(), bw0 * 1e-9, bw1 * 1e-9,
                   per_tok ? bw / (double)per_tok : 0.0, best * (double)per_tok * 1e-9);
        }
        if (test == 1 && bw > 0.0 && per_tok)
            printf("%-4s%-6d  %6d  %10.1f  %10.1f  (%.0f%% of the ceiling)\n", "tg", n, n,
                   best, sum / reps, 100.0 * best * (double)per_tok / bw);
        else
            printf("%-4s%-6d  %6d  %10.1f  %10.1f\n", test == 0 ? "pp" : "tg", n, n, best,
                   sum / reps);
        fflush(stdout);
    }
    rc = 0;
out:
    free(ids);
    free(logits);
    dsq_kv_destroy(kv);
    dsq_model_destroy(model);
    dsq_model_file_close(f);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "tokenize") == 0) { extern int dsq__bench_tokenize(int, char **); return dsq__bench_tokenize(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "sched") == 0) { extern int dsq__bench_sched(int, char **); return dsq__bench_sched(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "serve") == 0) { extern int dsq__bench_serve(int, char **); return dsq__bench_serve(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "soak") == 0) { extern int dsq__bench_soak(int, char **); return dsq__bench_soak(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "grammar") == 0) { extern int dsq__bench_grammar(int, char **); return dsq__bench_grammar(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "pad") == 0) { extern int dsq__bench_pad(int, char **); return dsq__bench_pad(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "write-model") == 0) { extern int dsq__bench_write_model_main(int, char **); return dsq__bench_write_model_main(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "attn") == 0) { extern int dsq__bench_attn(int, char **); return dsq__bench_attn(argc - 2, argv + 2); }
    if (argc >= 2 && strcmp(argv[1], "gpu") == 0) { extern int dsq__bench_gpu(int, char **); return dsq__bench_gpu(argc - 2, argv + 2); }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("dsq-bench %s\n", DSQ_VERSION);
            return 0;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: dsq-bench [--help] [--version]\n"
                   "       dsq-bench matmul [--threads N] [--seconds S] [--shapes 135m|6.7b]"
                   " [--layout rows|x8] [--bandwidth]\n"
                   "       dsq-bench cpu --model PATH [--threads N] [--prompt-tokens 512]"
                   " [--gen-tokens 128] [--reps 3] [--activation-dtype int8|fp32]"
                   " [--layout x8|rows] [--bandwidth]\n"
                   "       dsq-bench write-model [--shape 6.7b|v2-lite|quick] PATH\n"
                   "       dsq-bench tokenize --model PATH [--text FILE] [--mb N]\n"
                   "       dsq-bench sched [--seqs 256] [--steps 20000]\n"
                   "       dsq-bench grammar --model GGUF|TOKENIZER_DIR [--grammar FILE | --json-schema FILE | --json-object]"
                   " [--tokens 2000]\n"
                   "       dsq-bench pad --model PATH [--out FILE] [--buckets 1,2,4,8,16,32,64]"
                   " [--threads N] [--reps 3] [--context 128]\n"
                   "       dsq-bench attn [--mode prefill|decode] [--rows 512] [--context N]"
                   " [--seqs 1] [--layers 1] [--kv-dtype f16|int8|f32] [--threads N] ... (attn --help)\n"
                   "       dsq-bench gpu [--quick] [--seconds S] [--no-e2e] [--json FILE] [--write-model PATH]"
                   " (CUDA builds: kernels on the device)\n"
                   "       dsq-bench serve [--url URL]... [--dsqd PATH] [--llama-server PATH]"
                   " [--model GGUF] [--clients 8] [--requests 32] ... (serve --help)\n"
                   "       dsq-bench soak (--dsqd PATH --model FILE | --url URL [--pid PID])"
                   " [--minutes 10] [--clients 8] [--unread 4] [--slow 200] ... (soak --help)\n");
            return 0;
        }
    }
    if (argc >= 2 && strcmp(argv[1], "matmul") == 0)
        return bench_matmul(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "cpu") == 0)
        return bench_cpu(argc - 2, argv + 2);
    fprintf(stderr, "dsq-bench: unknown or missing subcommand (see --help)\n");
    return 2;
}

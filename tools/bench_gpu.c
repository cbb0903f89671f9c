/* dsq-bench gpu: the CUDA backend's kernels on the device, through the
 * backend layer (engine/backend/backend.h), at the layer shapes of the
 * models dsq is for. Weights, activations and KV values are random: timing
 * does not depend on values.
 *
 *   copy      device-to-device copy of 256 MiB: bandwidth as 2 x bytes /
 *             time (read + write, as NVIDIA's bandwidthTest counts it), the
 *             reference the INT4 products are measured against.
 *   int4      y = x . W^T with W INT4 (AWQ-style INT zero points, groups of
 *             128 and 32; kernels.h's native layout), x fp32 [m][k], at
 *             DeepSeek-Coder-6.7B (4096 / 11008), DeepSeek-Coder-1.3B
 *             (2048 / 5504) and R1-Distill-Qwen-7B (3584 / 18944, 4 KV
 *             heads of 128) layer shapes, m = 1, 4, 16, 64: time per call,
 *             weight GB/s (data + scales + zeros per call / time) and that as
 *             a share of the copy bandwidth; and cuBLAS FP16 (cublasGemmEx,
 *             fp16 A/B/C, fp32 compute) on the same m x n x k, with dsq's
 *             speedup over it. cuBLAS is absent under the simulator (n/a).
 *   attention paged decode attention, 6.7B's 32 heads of 128 (MHA), FP16 KV
 *             in blocks of 16, batch 1 and 16, contexts 512..16384: K + V
 *             bytes read per call / time.
 * Each figure is the mean over calls for at least --seconds (default 0.2)
 * after one warm-up call: batches of back-to-back calls, each batch timed
 * by the wall clock up to its dsq_backend_sync (cudaDeviceSynchronize for
 * cuBLAS), so launch overhead counts and a sync per call does not. --quick: tiny shapes and one call each (the smoke
 * mode tests/gpu/run uses under the simulator). --json FILE: the raw
 * numbers as JSON lines.
 *   e2e       the engine end to end at DeepSeek-Coder-6.7B shapes with
 *             random Q4_0 weights: load, TTFT of a 512-token prompt, decode
 *             tok/s at batch 1 and 64 (bench_gpu_e2e.c). --no-e2e skips it. */
#include "dsq_config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "kernels.h"

#if DSQ_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

typedef struct gb {
    dsq_backend_t *be;
    double min_s;
    bool quick;
    FILE *json;
    double copy_gbs;
#if DSQ_HAVE_CUDA
    cublasHandle_t cublas;
    bool have_cublas;
#endif
} gb_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rndf(void) { return (float)(rnd() & 0xffff) / 65536.0f - 0.5f; }

/* device buffer of n random floats in [-0.5, 0.5) */
static float *dev_floats(gb_t *g, size_t n)
{
    float *h = malloc(n * sizeof(float));
    float *d = dsq_backend_alloc(g->be, n * sizeof(float));
    if (!h || !d) {
        free(h);
        dsq_backend_free(g->be, d);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = rndf();
    int rc = dsq_backend_upload(g->be, d, h, n * sizeof(float));
    free(h);
    if (rc) {
        dsq_backend_free(g->be, d);
        return NULL;
    }
    return d;
}

/* Time fn(arg) per call in seconds: one warm-up call, then batches of
 * calls (1, 2, 4, ...) each followed by one sync(g), until min_s has
 * passed; launch overhead counts, a sync per call does not. */
typedef int (*call_fn)(gb_t *g, void *arg);
static int be_sync(gb_t *g) { return dsq_backend_sync(g->be); }
static double time_calls_with(gb_t *g, call_fn fn, void *arg, int (*sync)(gb_t *), int *rc)
{
    *rc = fn(g, arg);
    if (*rc || (*rc = sync(g)))
        return 0;
    long n = 0;
    double t0 = now_s(), el;
    for (long batch = 1;; batch *= 2) {
        for (long i = 0; i < batch; i++)
            if ((*rc = fn(g, arg)))
                return 0;
        if ((*rc = sync(g)))
            return 0;
        n += batch;
        el = now_s() - t0;
        if (el >= g->min_s || n >= 1 << 20)
            break;
    }
    return el / (double)n;
}
static double time_calls(gb_t *g, call_fn fn, void *arg, int *rc)
{
    return time_calls_with(g, fn, arg, be_sync, rc);
}

/* ------------------------------------------------------------ copy */

typedef struct copy_arg {
    void *dst, *src;
    size_t bytes;
} copy_arg_t;

static int do_copy(gb_t *g, void *a)
{
    copy_arg_t *c = a;
    return dsq_backend_copy(g->be, c->dst, c->src, c->bytes);
}

static int bench_copy(gb_t *g)
{
    copy_arg_t c = {.bytes = g->quick ? (1u << 20) : (256u << 20)};
    c.src = dsq_backend_alloc(g->be, c.bytes);
    c.dst = dsq_backend_alloc(g->be, c.bytes);
    int rc = c.src && c.dst ? dsq_backend_memset(g->be, c.src, 1, c.bytes) : DSQ_ENOMEM;
    double t = rc ? 0 : time_calls(g, do_copy, &c, &rc);
    if (!rc) {
        g->copy_gbs = 2.0 * (double)c.bytes / t * 1e-9;
        printf("copy      %zu MiB device to device: %.3f ms, %.1f GB/s (2 x bytes / time)\n",
               c.bytes >> 20, t * 1e3, g->copy_gbs);
        if (g->json)
            fprintf(g->json, "{\"bench\":\"copy\",\"bytes\":%zu,\"ms\":%.6f,\"gbs\":%.3f}\n",
                    c.bytes, t * 1e3, g->copy_gbs);
    }
    dsq_backend_free(g->be, c.src);
    dsq_backend_free(g->be, c.dst);
    return rc;
}

/* ------------------------------------------------------------ int4 */

typedef struct mm_arg {
    float *y, *x;
    int64_t m;
    dsq_weight_t w;
} mm_arg_t;

static int do_mm(gb_t *g, void *a)
{
    mm_arg_t *p = a;
    return dsq_backend_matmul(g->be, p->y, DSQ_FT_F32, p->x, DSQ_FT_F32, p->m, &p->w);
}

#if DSQ_HAVE_CUDA
typedef struct hgemm_arg {
    uint16_t *a, *b, *c;   /* fp16 bits */
    int m, n, k;
} hgemm_arg_t;

static int do_hgemm(gb_t *g, void *p)
{
    hgemm_arg_t *h = p;
    const float one = 1.0f, zero = 0.0f;
    /* column-major: C[n][m] = W[n][k] . X[m][k]^T, i.e. y = x . W^T */
    cublasStatus_t st = cublasGemmEx(g->cublas, CUBLAS_OP_T, CUBLAS_OP_N, h->n, h->m, h->k,
                                     &one, h->a, CUDA_R_16F, h->k, h->b, CUDA_R_16F, h->k,
                                     &zero, h->c, CUDA_R_16F, h->n, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : DSQ_ECUDA;
}

static int dev_sync(gb_t *g)
{
    (void)g;
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : DSQ_ECUDA;
}

/* cuBLAS FP16 time per call for m x n x k, or 0 when it cannot run */
static double hgemm_time(gb_t *g, int64_t m, int64_t n, int64_t k)
{
    if (!g->have_cublas)
        return 0;
    hgemm_arg_t h = {.m = (int)m, .n = (int)n, .k = (int)k};
    int rc = 0;
    double t = 0;
    if (cudaMalloc((void **)&h.a, (size_t)(n * k) * 2) != cudaSuccess ||
        cudaMalloc((void **)&h.b, (size_t)(m * k) * 2) != cudaSuccess ||
        cudaMalloc((void **)&h.c, (size_t)(m * n) * 2) != cudaSuccess) {
        rc = DSQ_ENOMEM;
    } else {
        cudaMemset(h.a, 0x11, (size_t)(n * k) * 2);
        cudaMemset(h.b, 0x11, (size_t)(m * k) * 2);
        t = time_calls_with(g, do_hgemm, &h, dev_sync, &rc);
    }
    cudaFree(h.a);
    cudaFree(h.b);
    cudaFree(h.c);
    cudaGetLastError();
    return rc ? 0 : t;
}
#else
static double hgemm_time(gb_t *g, int64_t m, int64_t n, int64_t k)
{
    (void)g, (void)m, (void)n, (void)k;
    return 0;
}
#endif

typedef struct shape {
    const char *model, *name;
    int64_t n, k;
} shape_t;

static int bench_int4(gb_t *g)
{
    static const shape_t full[] = {
        {"deepseek-coder-6.7b", "q/k/v/o", 4096, 4096},
        {"deepseek-coder-6.7b", "gate/up", 11008, 4096},
        {"deepseek-coder-6.7b", "down", 4096, 11008},
        {"deepseek-coder-1.3b", "q/k/v/o", 2048, 2048},
        {"deepseek-coder-1.3b", "gate/up", 5504, 2048},
        {"deepseek-coder-1.3b", "down", 2048, 5504},
        {"r1-distill-qwen-7b", "q/o", 3584, 3584},
        {"r1-distill-qwen-7b", "k/v", 512, 3584},
        {"r1-distill-qwen-7b", "gate/up", 18944, 3584},
        {"r1-distill-qwen-7b", "down", 3584, 18944},
    };
    static const shape_t tiny[] = {{"tiny", "smoke", 256, 256}};
    static const int64_t ms_full[] = {1, 4, 16, 64}, ms_tiny[] = {1, 4};
    static const int groups[] = {128, 32};
    const shape_t *sh = g->quick ? tiny : full;
    const size_t n_sh = g->quick ? 1 : sizeof(full) / sizeof(full[0]);
    const int64_t *ms = g->quick ? ms_tiny : ms_full;
    const size_t n_ms = g->quick ? 2 : 4;
    printf("# int4: model, matrix, n x k, group, m: dsq ms/call, weight GB/s, %% of copy;"
           " cuBLAS FP16 ms/call; dsq speedup over cuBLAS\n");
    int rc = 0;
    for (size_t si = 0; si < n_sh && !rc; si++)
        for (size_t gi = 0; gi < 2 && !rc; gi++) {
            const int64_t n = sh[si].n, k = sh[si].k;
            const int gs = groups[gi];
            const size_t db = dsq_weight_data_bytes(DSQ_WFMT_INT4, n, k, gs);
            const size_t sb = dsq_weight_scale_bytes(DSQ_WFMT_INT4, n, k, gs);
            uint8_t *data = malloc(db);
            uint16_t *sc = malloc(sb), *zr = malloc(sb);
            mm_arg_t a = {0};
            size_t wbytes = 0;
            if (!data || !sc || !zr) {
                rc = DSQ_ENOMEM;
            } else {
                for (size_t i = 0; i < db; i++)
                    data[i] = (uint8_t)rnd();
                for (size_t i = 0; i < sb / 2; i++) {
                    sc[i] = 0x2000;      /* fp16 2^-7 */
                    zr[i] = 0x4800;      /* fp16 8 */
                }
                dsq_weight_t hw = {.format = DSQ_WFMT_INT4, .n = n, .k = k, .group_size = gs,
                                   .zp_mode = DSQ_ZP_INT, .data = data, .scales = sc,
                                   .zeros = zr};
                rc = dsq_backend_weight_upload(g->be, &hw, &a.w, &wbytes);
            }
            free(data);
            free(sc);
            free(zr);
            a.x = rc ? NULL : dev_floats(g, (size_t)(64 * k));
            a.y = rc ? NULL : dsq_backend_alloc(g->be, (size_t)(64 * n) * sizeof(float));
            if (!rc && (!a.x || !a.y))
                rc = DSQ_ENOMEM;
            for (size_t mi = 0; mi < n_ms && !rc; mi++) {
                a.m = ms[mi];
                double t = time_calls(g, do_mm, &a, &rc);
                if (rc)
                    break;
                double gbs = (double)wbytes / t * 1e-9;
                double th = hgemm_time(g, a.m, n, k);
                char hb[32] = "n/a", sp[32] = "n/a";
                if (th > 0) {
                    snprintf(hb, sizeof(hb), "%.4f ms", th * 1e3);
                    snprintf(sp, sizeof(sp), "%.2fx", th / t);
                }
                printf("int4      %-20s %-8s %5lld x %5lld g%-3d m=%-3lld %9.4f ms %8.1f GB/s "
                       "%5.1f%%  cublas %-12s %s\n",
                       sh[si].model, sh[si].name, (long long)n, (long long)k, gs,
                       (long long)a.m, t * 1e3, gbs,
                       g->copy_gbs > 0 ? 100.0 * gbs / g->copy_gbs : 0.0, hb, sp);
                if (g->json)
                    fprintf(g->json,
                            "{\"bench\":\"int4\",\"model\":\"%s\",\"matrix\":\"%s\",\"n\":%lld,"
                            "\"k\":%lld,\"group_size\":%d,\"m\":%lld,\"ms\":%.6f,"
                            "\"weight_bytes\":%zu,\"gbs\":%.3f,\"copy_fraction\":%.4f,"
                            "\"cublas_fp16_ms\":%.6f}\n",
                            sh[si].model, sh[si].name, (long long)n, (long long)k, gs,
                            (long long)a.m, t * 1e3, wbytes, gbs,
                            g->copy_gbs > 0 ? gbs / g->copy_gbs : 0.0, th * 1e3);
                fflush(stdout);
            }
            dsq_backend_free(g->be, a.x);
            dsq_backend_free(g->be, a.y);
            dsq_backend_weight_free(g->be, &a.w);
        }
    return rc;
}

/* ------------------------------------------------------------ attention */

typedef struct att_arg {
    float *out, *q;
    int64_t m;
    int n_heads, max_blocks;
    dsq_kv_layer_t kv;
    int32_t *seq, *pos, *bt, *seq_host;
} att_arg_t;

static int do_att(gb_t *g, void *p)
{
    att_arg_t *a = p;
    return dsq_backend_attention(g->be, a->out, a->q, DSQ_FT_F32, a->m, a->n_heads, &a->kv,
                                 a->seq, a->pos, a->bt, a->max_blocks,
                                 1.0f / sqrtf((float)a->kv.head_dim), a->seq_host, NULL);
}

static int bench_attention(gb_t *g)
{
    static const int ctx_full[] = {512, 1024, 2048, 4096, 8192, 16384}, ctx_tiny[] = {64};
    static const int batch_full[] = {1, 16}, batch_tiny[] = {1};
    const int *ctxs = g->quick ? ctx_tiny : ctx_full, *bs = g->quick ? batch_tiny : batch_full;
    const int n_ctx = g->quick ? 1 : 6, n_b = g->quick ? 1 : 2;
    const int H = g->quick ? 4 : 32, D = g->quick ? 64 : 128, BS = 16;
    printf("# attention: decode, %d heads of %d (MHA), FP16 KV, blocks of %d: batch, context:"
           " ms/call, K+V GB/s, %% of copy\n", H, D, BS);
    int rc = 0;
    for (int bi = 0; bi < n_b && !rc; bi++)
        for (int ci = 0; ci < n_ctx && !rc; ci++) {
            const int B = bs[bi], C = ctxs[ci], mb = C / BS;
            att_arg_t a = {.m = B, .n_heads = H, .max_blocks = mb};
            a.kv = (dsq_kv_layer_t){.dtype = DSQ_KV_F16, .block_size = BS, .n_kv_heads = H,
                                    .head_dim = D, .n_blocks = (int64_t)B * mb};
            const size_t kvb = (size_t)a.kv.n_blocks * BS * H * D * 2;
            a.kv.k = dsq_backend_alloc(g->be, kvb);
            a.kv.v = dsq_backend_alloc(g->be, kvb);
            a.q = dev_floats(g, (size_t)B * H * D);
            a.out = dsq_backend_alloc(g->be, (size_t)B * H * D * sizeof(float));
            int32_t *hs = malloc(sizeof(int32_t) * (size_t)B * 2);
            int32_t *hbt = malloc(sizeof(int32_t) * (size_t)B * mb);
            a.seq = dsq_backend_alloc(g->be, sizeof(int32_t) * (size_t)B);
            a.pos = dsq_backend_alloc(g->be, sizeof(int32_t) * (size_t)B);
            a.bt = dsq_backend_alloc(g->be, sizeof(int32_t) * (size_t)B * mb);
            if (!a.kv.k || !a.kv.v || !a.q || !a.out || !hs || !hbt || !a.seq || !a.pos ||
                !a.bt) {
                rc = DSQ_ENOMEM;
            } else {
                for (int i = 0; i < B; i++) {
                    hs[i] = i;
                    hs[B + i] = C - 1;
                }
                /* each sequence's blocks scattered: block j of seq i at a stride */
                for (int64_t i = 0; i < (int64_t)B * mb; i++)
                    hbt[i] = (int32_t)((i * 7919) % ((int64_t)B * mb));
                a.seq_host = hs;
                rc = dsq_backend_memset(g->be, a.kv.k, 0x22, kvb);
                if (!rc)
                    rc = dsq_backend_memset(g->be, a.kv.v, 0x22, kvb);
                if (!rc)
                    rc = dsq_backend_upload(g->be, a.seq, hs, sizeof(int32_t) * (size_t)B);
                if (!rc)
                    rc = dsq_backend_upload(g->be, a.pos, hs + B, sizeof(int32_t) * (size_t)B);
                if (!rc)
                    rc = dsq_backend_upload(g->be, a.bt, hbt, sizeof(int32_t) * (size_t)B * mb);
            }
            double t = rc ? 0 : time_calls(g, do_att, &a, &rc);
            if (!rc) {
                double bytes = 2.0 * (double)B * C * H * D * 2;
                double gbs = bytes / t * 1e-9;
                printf("attention batch=%-3d ctx=%-6d %9.4f ms %8.1f GB/s %5.1f%%\n", B, C,
                       t * 1e3, gbs, g->copy_gbs > 0 ? 100.0 * gbs / g->copy_gbs : 0.0);
                if (g->json)
                    fprintf(g->json,
                            "{\"bench\":\"attention\",\"batch\":%d,\"context\":%d,\"heads\":%d,"
                            "\"head_dim\":%d,\"ms\":%.6f,\"kv_bytes\":%.0f,\"gbs\":%.3f}\n",
                            B, C, H, D, t * 1e3, bytes, gbs);
                fflush(stdout);
            }
            free(hs);
            free(hbt);
            dsq_backend_free(g->be, a.kv.k);
            dsq_backend_free(g->be, a.kv.v);
            dsq_backend_free(g->be, a.q);
            dsq_backend_free(g->be, a.out);
            dsq_backend_free(g->be, a.seq);
            dsq_backend_free(g->be, a.pos);
            dsq_backend_free(g->be, a.bt);
        }
    return rc;
}

int dsq__bench_gpu(int argc, char **argv)
{
    gb_t g = {.min_s = 0.2};
    const char *json = NULL;
    bool e2e = true;
    const char *write_model = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            g.quick = true;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            g.min_s = atof(argv[++i]);
        } else if (strcmp(argv[i], "--write-model") == 0 && i + 1 < argc) {
            write_model = argv[++i];
        } else if (strcmp(argv[i], "--no-e2e") == 0) {
            e2e = false;
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: dsq-bench gpu [--quick] [--seconds S] [--no-e2e] [--json FILE] [--write-model PATH]\n"
                   "  copy bandwidth, INT4 GEMV/GEMM at DeepSeek/Qwen layer shapes against "
                   "cuBLAS FP16,\n  paged decode attention, and the engine end to end at "
                   "DeepSeek-Coder-6.7B shapes\n  (random Q4_0 weights written to $TMPDIR, "
                   "3.8 GB: TTFT of 512 tokens, decode\n  tok/s at batch 1 and 64; --no-e2e "
                   "skips it); --quick: tiny shapes, one call\n  each (simulator smoke); --write-model PATH: "
                   "only write that model (GGUF)\n");
            return 0;
        } else {
            fprintf(stderr, "dsq-bench gpu: unknown argument %s (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (g.quick)
        g.min_s = 0;
    if (write_model) {
        extern int dsq__bench_write_model_main(int argc, char **argv);
        char *args[] = {"--shape", g.quick ? "quick" : "6.7b", (char *)write_model};
        return dsq__bench_write_model_main(3, args);
    }
    char err[256];
    g.be = dsq_backend_create(DSQ_BACKEND_CUDA, err, sizeof(err));
    if (!g.be) {
        fprintf(stderr, "dsq-bench gpu: %s\n", err);
        return 1;
    }
    if (json && !(g.json = fopen(json, "w"))) {
        fprintf(stderr, "dsq-bench gpu: cannot write %s\n", json);
        dsq_backend_destroy(g.be);
        return 1;
    }
    char desc[256];
    dsq_backend_describe(g.be, desc, sizeof(desc));
    printf("# dsq-bench gpu: %s%s\n", desc, g.quick ? " (quick: tiny shapes)" : "");
#if DSQ_HAVE_CUDA
    g.have_cublas = cublasCreate(&g.cublas) == CUBLAS_STATUS_SUCCESS;
    if (!g.have_cublas)
        printf("# cuBLAS unavailable here (the simulator has none): no FP16 comparison\n");
    cudaGetLastError();
#endif
    int rc = bench_copy(&g);
    if (!rc)
        rc = bench_int4(&g);
    if (!rc)
        rc = bench_attention(&g);
#if DSQ_HAVE_CUDA
    if (g.have_cublas)
        cublasDestroy(g.cublas);
#endif
    if (rc)
        fprintf(stderr, "dsq-bench gpu: %s\n", dsq_strerror(rc));
    dsq_backend_destroy(g.be);
    /* the engine makes its own backend: the kernels' one is gone first */
    if (!rc && e2e) {
        extern int dsq__bench_gpu_e2e(bool quick, FILE *json);
        rc = dsq__bench_gpu_e2e(g.quick, g.json);
    }
    if (g.json)
        fclose(g.json);
    return rc ? 1 : 0;
}

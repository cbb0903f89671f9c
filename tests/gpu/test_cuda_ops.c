/* GPU check for kernels/cuda/{rmsnorm,rope,swiglu,add,softmax,kv_write,
 * attention}.cu (attention: the decode and the prefill kernel): each CUDA op
 * against its CPU twin (the reference) on random inputs with a fixed seed.
 * Device outputs are poisoned (0xFF bytes = NaN) before each launch so an
 * element the kernel forgets to write fails. Prints the max abs difference
 * of every comparison.
 *
 * Activation types: every op runs with fp32 activations, and the typed ones
 * (rmsnorm's y, rope's x, swiglu's out/gate/up, add's x, kv_write's k/v,
 * attention's q/out) also with fp16 and bf16 on a few small shapes (the
 * simulator is slow): one rmsnorm row length, two rope layouts, one
 * elementwise shape, attention on an f16 cache (one KV head per query
 * head) and an int8 cache with GQA, and fp16 rows past a missing block.
 * Narrow inputs are made on the host with engine/io/tensor.c's conversions
 * (round to nearest even) and widened back exactly, so the CPU reference
 * runs on the very values the kernel loads; the only differences left are
 * the fp32 check's (summation order: its tolerance, tol32) and the one
 * rounding of each narrow output, at most half an ulp: 2^-11 |y| for
 * fp16 (2^-25 below its normal range), 2^-8 |y| for bf16. So an output y
 * may be off the CPU's by tol32 + rel * (|y| + tol32) + sub (report_typed).
 * add keeps y fp32 and widens x exactly: bitwise equal. kv_write stores the
 * CPU op's bytes for the widened k/v, every scale and zero point included
 * (a group with lo == -hi has the zero point -0: the check that found the
 * simulator's neg.f32 giving +0, tests/gpu/cudasim-9-neg-zero.patch). An
 * ftype outside the enum is EINVAL.
 *
 * Without a CUDA device the whole test is skipped (TAP "1..0 # SKIP"),
 * unless DSQ_REQUIRE_GPU=1, which turns that into a failure (the simulator
 * runs of scripts/test set it; so should any run on a GPU machine). */
#include "gpu_common.h"

#include "engine/common/error.h"
#include "engine/io/tensor.h"
#include "kernels/kernels.h"

static const dsq_ftype_t narrow[2] = {DSQ_FT_F16, DSQ_FT_BF16};

/* Round x[0..n) to type t in place (F32: unchanged), so x holds exactly
 * what a kernel loading the t copy widens to, and return that copy on the
 * device. */
static void *dev_typed(float *x, dsq_ftype_t t, int64_t n)
{
    if (t == DSQ_FT_F32)
        return dev_dup(x, sizeof(*x) * n);
    uint16_t *h = malloc(sizeof(*h) * n);
    for (int64_t i = 0; i < n; i++) {
        h[i] = t == DSQ_FT_F16 ? dsq_fp32_to_fp16(x[i]) : dsq_fp32_to_bf16(x[i]);
        x[i] = t == DSQ_FT_F16 ? dsq_fp16_to_fp32(h[i]) : dsq_bf16_to_fp32(h[i]);
    }
    void *d = dev_dup(h, sizeof(*h) * n);
    free(h);
    return d;
}

/* The device array d of n elements of type t, widened (exactly) into out */
static void dev_get_f32(float *out, const void *d, dsq_ftype_t t, int64_t n)
{
    if (t == DSQ_FT_F32) {
        dev_get(out, d, sizeof(*out) * n);
        return;
    }
    uint16_t *h = malloc(sizeof(*h) * n);
    dev_get(h, d, sizeof(*h) * n);
    for (int64_t i = 0; i < n; i++)
        out[i] = t == DSQ_FT_F16 ? dsq_fp16_to_fp32(h[i]) : dsq_bf16_to_fp32(h[i]);
    free(h);
}

/* Device output got (widened) of type t against the CPU's fp32 want. The
 * device's fp32 value v is within tol32 of want (the fp32 check's bound);
 * storing it rounds to nearest even, which moves it by at most half an
 * ulp: rel |v| + sub, with rel = 2^-11 and sub = 2^-25 (half the
 * subnormal step) for fp16, rel = 2^-8 for bf16 (same exponent range as
 * fp32: sub = 2^-134). With |v| <= |want| + tol32, each element must be
 * within tol32 + rel * (|want| + tol32) + sub. Prints the max abs
 * difference and the largest fraction of its element's bound; NaN fails.
 * F32 is the plain report(). */
static void report_typed(const char *what, dsq_ftype_t t, const float *want,
                         const float *got, int64_t n, double tol32)
{
    if (t == DSQ_FT_F32) {
        report(what, max_diff(want, got, n), tol32);
        return;
    }
    const int rel_exp = t == DSQ_FT_F16 ? 11 : 8;
    const double rel = ldexp(1.0, -rel_exp), sub = ldexp(1.0, t == DSQ_FT_F16 ? -25 : -134);
    double e = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)want[i] - got[i]);
        if (isnan(d)) {
            e = worst = INFINITY;
            break;
        }
        const double tol = tol32 + rel * (fabs((double)want[i]) + tol32) + sub;
        e = d > e ? d : e;
        worst = d / tol > worst ? d / tol : worst;
    }
    printf("# %-44s max_abs_diff=%.3e tol=%.1e+2^-%d|y| worst=%.2f of tol\n", what, e,
           tol32, rel_exp, worst);
    assert_true(worst <= 1.0);
}

/* x and the norm weights stay fp32 (residual stream); y is typed. The
 * narrow outputs on the shorter row only (simulator time). */
static void test_rmsnorm(void **state)
{
    (void)state;
    const int64_t m = 5, ns[2] = {4096, 1000};
    for (int c = 0; c < 2; c++) {
        const int64_t n = ns[c];
        float *x = malloc(sizeof(*x) * m * n), *w = malloc(sizeof(*w) * n);
        float *y = malloc(sizeof(*y) * m * n), *yg = malloc(sizeof(*yg) * m * n);
        for (int64_t i = 0; i < m * n; i++)
            x[i] = frand(3.0f);
        for (int64_t i = 0; i < n; i++)
            w[i] = frand(2.0f);
        float *dx = dev_dup(x, sizeof(*x) * m * n), *dw = dev_dup(w, sizeof(*w) * n);
        assert_int_equal(dsq_cpu_rmsnorm(y, x, w, m, n, 1e-6f), DSQ_OK);
        for (int k = 0; k < (c ? 3 : 1); k++) {
            const dsq_ftype_t t = k ? narrow[k - 1] : DSQ_FT_F32;
            void *dy = dev_poison(dsq_ftype_size(t) * m * n);
            assert_int_equal(dsq_cuda_rmsnorm(dy, t, dx, dw, m, n, 1e-6f), DSQ_OK);
            dev_get_f32(yg, dy, t, m * n);
            char what[64];
            snprintf(what, sizeof(what), "rmsnorm n=%lld%s%s", (long long)n, k ? " " : "",
                     k ? dsq_ftype_name(t) : "");
            report_typed(what, t, y, yg, m * n, 1e-5);
            if (k == 2) {
                assert_int_equal(dsq_cuda_rmsnorm(dy, (dsq_ftype_t)7, dx, dw, m, n, 1e-6f),
                                 DSQ_EINVAL);
                /* a narrow y cannot overwrite its own fp32 x */
                assert_int_equal(dsq_cuda_rmsnorm(dx, t, dx, dw, m, n, 1e-6f), DSQ_EINVAL);
            }
            cudaFree(dy);
        }
        cudaFree(dx); cudaFree(dw);
        free(x); free(w); free(y); free(yg);
    }
}

/* In place, so no poison: rows at position 0 are the identity and the
 * rest would show an unwritten element. */
static void rope_case(const char *what, const dsq_rope_t *p, int n_heads, int head_dim,
                      dsq_ftype_t t)
{
    enum { M = 6 };
    const int32_t pos[M] = {0, 1, 15, 4095, 40000, 163839};
    const int64_t n = (int64_t)M * n_heads * head_dim;
    float *x = malloc(sizeof(*x) * n), *xg = malloc(sizeof(*xg) * n);
    for (int64_t i = 0; i < n; i++)
        x[i] = frand(2.0f);
    void *dx = dev_typed(x, t, n);
    int32_t *dp = dev_dup(pos, sizeof(pos));
    assert_int_equal(dsq_cpu_rope(x, M, n_heads, head_dim, pos, p), DSQ_OK);
    assert_int_equal(dsq_cuda_rope(dx, t, M, n_heads, head_dim, dp, p), DSQ_OK);
    dev_get_f32(xg, dx, t, n);
    char name[64];
    snprintf(name, sizeof(name), "%s%s%s", what, t != DSQ_FT_F32 ? " " : "",
             t != DSQ_FT_F32 ? dsq_ftype_name(t) : "");
    report_typed(name, t, x, xg, n, 1e-5);
    if (t == DSQ_FT_BF16)
        assert_int_equal(dsq_cuda_rope(dx, (dsq_ftype_t)7, M, n_heads, head_dim, dp, p),
                         DSQ_EINVAL);
    cudaFree(dx); cudaFree(dp);
    free(x); free(xg);
}

static void test_rope(void **state)
{
    (void)state;
    dsq_rope_t p;
    assert_int_equal(dsq_rope_init(&p, 64, false, 10000.0, 0, 1, 0, 0, 0, 0, 0), DSQ_OK);
    rope_case("rope normal", &p, 4, 64, DSQ_FT_F32);
    assert_int_equal(dsq_rope_init(&p, 128, true, 1e6, 0, 1, 0, 0, 0, 0, 0), DSQ_OK);
    rope_case("rope neox", &p, 3, 128, DSQ_FT_F32);
    assert_int_equal(dsq_rope_init(&p, 64, true, 1e5, 1, 4.0, 0, 0, 0, 0, 0), DSQ_OK);
    rope_case("rope neox partial linear x4", &p, 2, 192, DSQ_FT_F32);
    /* narrow: both layouts (neox with untouched tail dims, interleaved) */
    for (int k = 0; k < 2; k++)
        rope_case("rope neox partial linear x4", &p, 2, 192, narrow[k]);
    assert_int_equal(dsq_rope_init(&p, 64, false, 10000.0, 3, 40.0, 4096, 32, 1,
                                   1.0, 0.707), DSQ_OK);
    rope_case("rope yarn (deepseek-v2-lite-like)", &p, 16, 64, DSQ_FT_F32);
    for (int k = 0; k < 2; k++)
        rope_case("rope yarn (deepseek-v2-lite-like)", &p, 16, 64, narrow[k]);
}

/* swiglu with narrow gate, up and out; add of a narrow x into the fp32
 * residual y, which widens x exactly and so must match the CPU add on the
 * widened x bit for bit. A smaller shape than the fp32 one (odd n). */
static void elementwise_narrow(dsq_ftype_t t)
{
    const int64_t m = 3, n = 2049;
    float *a = malloc(sizeof(*a) * m * n), *b = malloc(sizeof(*b) * m * n);
    float *r = malloc(sizeof(*r) * m * n), *rg = malloc(sizeof(*rg) * m * n);
    for (int64_t i = 0; i < m * n; i++) {
        a[i] = frand(10.0f);
        b[i] = frand(2.0f);
    }
    void *da = dev_typed(a, t, m * n);
    /* swiglu: gate a, up b, both narrow */
    float *bw = malloc(sizeof(*bw) * m * n);
    memcpy(bw, b, sizeof(*bw) * m * n);
    void *db = dev_typed(bw, t, m * n);
    void *dr = dev_poison(dsq_ftype_size(t) * m * n);
    assert_int_equal(dsq_cpu_swiglu(r, a, bw, m, n), DSQ_OK);
    assert_int_equal(dsq_cuda_swiglu(dr, da, db, t, m, n), DSQ_OK);
    dev_get_f32(rg, dr, t, m * n);
    char what[64];
    snprintf(what, sizeof(what), "swiglu %s", dsq_ftype_name(t));
    report_typed(what, t, r, rg, m * n, 1e-5);
    assert_int_equal(dsq_cuda_swiglu(dr, da, db, (dsq_ftype_t)7, m, n), DSQ_EINVAL);
    /* add: y = b in fp32 (not rounded), x = a narrow */
    float *dy = dev_dup(b, sizeof(*b) * m * n);
    memcpy(r, b, sizeof(*r) * m * n);
    assert_int_equal(dsq_cpu_add(r, a, m * n), DSQ_OK);
    assert_int_equal(dsq_cuda_add(dy, da, t, m * n), DSQ_OK);
    dev_get(rg, dy, sizeof(*rg) * m * n);
    snprintf(what, sizeof(what), "add x %s", dsq_ftype_name(t));
    report(what, max_diff(r, rg, m * n), 0.0);
    assert_int_equal(dsq_cuda_add(dy, da, (dsq_ftype_t)7, m * n), DSQ_EINVAL);
    cudaFree(da); cudaFree(db); cudaFree(dr); cudaFree(dy);
    free(a); free(b); free(bw); free(r); free(rg);
}

static void test_elementwise(void **state)
{
    (void)state;
    const int64_t m = 3, n = 50001;
    float *a = malloc(sizeof(*a) * m * n), *b = malloc(sizeof(*b) * m * n);
    float *r = malloc(sizeof(*r) * m * n), *rg = malloc(sizeof(*rg) * m * n);
    for (int64_t i = 0; i < m * n; i++) {
        a[i] = frand(10.0f);
        b[i] = frand(2.0f);
    }
    float *da = dev_dup(a, sizeof(*a) * m * n), *db = dev_dup(b, sizeof(*b) * m * n);
    float *dr = dev_poison(sizeof(*dr) * m * n);
    /* swiglu */
    assert_int_equal(dsq_cpu_swiglu(r, a, b, m, n), DSQ_OK);
    assert_int_equal(dsq_cuda_swiglu(dr, da, db, DSQ_FT_F32, m, n), DSQ_OK);
    dev_get(rg, dr, sizeof(*rg) * m * n);
    report("swiglu", max_diff(r, rg, m * n), 1e-5);
    /* add (in place on a copy of b) */
    memcpy(r, b, sizeof(*r) * m * n);
    assert_int_equal(cudaMemcpy(dr, db, sizeof(*dr) * m * n, cudaMemcpyDeviceToDevice),
                     cudaSuccess);
    assert_int_equal(dsq_cpu_add(r, a, m * n), DSQ_OK);
    assert_int_equal(dsq_cuda_add(dr, da, DSQ_FT_F32, m * n), DSQ_OK);
    dev_get(rg, dr, sizeof(*rg) * m * n);
    report("add", max_diff(r, rg, m * n), 0.0);
    /* softmax, with a fully masked row 2 */
    memcpy(r, a, sizeof(*r) * m * n);
    for (int64_t j = 0; j < n; j++)
        r[2 * n + j] = -INFINITY;
    r[7] = 300.0f;
    assert_int_equal(cudaMemcpy(dr, r, sizeof(*r) * m * n, cudaMemcpyHostToDevice),
                     cudaSuccess);
    assert_int_equal(dsq_cpu_softmax(r, m, n), DSQ_OK);
    assert_int_equal(dsq_cuda_softmax(dr, m, n), DSQ_OK);
    dev_get(rg, dr, sizeof(*rg) * m * n);
    report("softmax", max_diff(r, rg, m * n), 1e-6);
    cudaFree(da); cudaFree(db); cudaFree(dr);
    free(a); free(b); free(r); free(rg);
    for (int k = 0; k < 2; k++)
        elementwise_narrow(narrow[k]);
}

/* ------------------------------------------------- kv_write + attention */

typedef struct acase {
    dsq_kv_dtype_t dt;
    int bs, n_kv, G, D;
    dsq_ftype_t t;          /* k, v, q and out */
} acase_t;

static void kv_case(const acase_t *c)
{
    enum { NS = 4, MAXL = 70 };
    const int len[NS] = {1, 13, 37, 70};
    const int bs = c->bs, n_kv = c->n_kv, D = c->D, G = c->G;
    const int row = n_kv * D, n_heads = n_kv * G, qrow = n_heads * D;
    const int max_blocks = MAXL / bs + 2;
    const int n_groups = dsq_kv_n_groups(D);
    const dsq_ftype_t ft = c->t;
    const size_t fs = dsq_ftype_size(ft);
    /* label: the cache type, then the activation type where narrow */
    char kind[32];
    snprintf(kind, sizeof(kind), "%s%s%s", c->dt == DSQ_KV_F16 ? "f16" : "int8",
             ft != DSQ_FT_F32 ? " act " : "", ft != DSQ_FT_F32 ? dsq_ftype_name(ft) : "");
    int64_t nb = 2;
    for (int s = 0; s < NS; s++)
        nb += (len[s] + bs - 1) / bs;
    int32_t *pool = malloc(sizeof(*pool) * nb);
    for (int64_t i = 0; i < nb; i++)
        pool[i] = (int32_t)i;
    for (int64_t i = nb - 1; i > 0; i--) {
        int64_t j = (int64_t)(urand() * (double)(i + 1));
        int32_t t = pool[i];
        pool[i] = pool[j];
        pool[j] = t;
    }
    int32_t *bt = malloc(sizeof(*bt) * NS * max_blocks);
    int64_t next = 0;
    for (int s = 0; s < NS; s++)
        for (int b = 0; b < max_blocks; b++)
            bt[s * max_blocks + b] = b * bs < len[s] ? pool[next++] : -1;
    int64_t T = 0;
    for (int s = 0; s < NS; s++)
        T += len[s];
    float *K = malloc(sizeof(*K) * T * row), *V = malloc(sizeof(*V) * T * row);
    int32_t *slot = malloc(sizeof(*slot) * T);
    int64_t t = 0;
    for (int s = 0; s < NS; s++)
        for (int p = 0; p < len[s]; p++, t++)
            slot[t] = bt[s * max_blocks + p / bs] * bs + p % bs;
    for (int64_t i = 0; i < T * row; i++) {
        K[i] = frand(1.5f);
        V[i] = frand(1.0f);
    }
    /* rounded to the activation type first: the CPU op writes the widened
     * values, which are what the kernel loads */
    void *dK = dev_typed(K, ft, T * row), *dV = dev_typed(V, ft, T * row);
    /* host cache via the CPU op */
    const size_t es = c->dt == DSQ_KV_F16 ? 2 : 1;
    const size_t n_el = (size_t)nb * bs * row, n_sc = (size_t)nb * bs * n_kv * n_groups;
    dsq_kv_layer_t hk = { .dtype = c->dt, .block_size = bs, .n_kv_heads = n_kv,
                          .head_dim = D, .n_blocks = nb };
    hk.k = calloc(n_el, es);
    hk.v = calloc(n_el, es);
    if (c->dt == DSQ_KV_INT8) {
        hk.k_scale = calloc(n_sc, 2); hk.k_zero = calloc(n_sc, 2);
        hk.v_scale = calloc(n_sc, 2); hk.v_zero = calloc(n_sc, 2);
    }
    assert_int_equal(dsq_cpu_kv_write(&hk, K, V, slot, T), DSQ_OK);
    /* device cache via the CUDA op, from zeroed storage */
    dsq_kv_layer_t dk = hk;
    void *zero = calloc(n_el, es);
    dk.k = dev_dup(zero, n_el * es);
    dk.v = dev_dup(zero, n_el * es);
    if (c->dt == DSQ_KV_INT8) {
        dk.k_scale = dev_dup(zero, n_sc * 2); dk.k_zero = dev_dup(zero, n_sc * 2);
        dk.v_scale = dev_dup(zero, n_sc * 2); dk.v_zero = dev_dup(zero, n_sc * 2);
    }
    int32_t *dslot = dev_dup(slot, sizeof(*slot) * T);
    assert_int_equal(dsq_cuda_kv_write(&dk, dK, dV, ft, dslot, T), DSQ_OK);
    /* compare the stored bytes */
    uint8_t *got = malloc(n_el * es);
    int64_t bad = 0, off_by_one = 0;
    for (int kvsel = 0; kvsel < 2; kvsel++) {
        dev_get(got, kvsel ? dk.v : dk.k, n_el * es);
        const uint8_t *want = kvsel ? hk.v : hk.k;
        if (c->dt == DSQ_KV_F16) {
            bad += memcmp(got, want, n_el * es) != 0;
        } else {
            for (size_t i = 0; i < n_el; i++) {
                int dq = abs((int)(int8_t)got[i] - (int)(int8_t)want[i]);
                off_by_one += dq == 1;
                bad += dq > 1;
            }
        }
    }
    /* every scale and zero point byte (a group with lo == -hi, common once
     * inputs are narrow, has the zero point -(lo + hi) / (2 s) = -0) */
    if (c->dt == DSQ_KV_INT8) {
        uint16_t *sc = malloc(n_sc * 2);
        uint16_t *hs[4] = {hk.k_scale, hk.k_zero, hk.v_scale, hk.v_zero};
        uint16_t *ds[4] = {dk.k_scale, dk.k_zero, dk.v_scale, dk.v_zero};
        for (int i = 0; i < 4; i++) {
            dev_get(sc, ds[i], n_sc * 2);
            for (size_t j = 0; j < n_sc; j++)
                bad += sc[j] != hs[i][j];
        }
        free(sc);
    }
    printf("# kv_write %s bs=%d D=%d: mismatches=%lld int8 q off by one=%lld\n", kind, bs,
           D, (long long)bad, (long long)off_by_one);
    assert_int_equal(bad, 0);

    /* attention on identical caches: upload the CPU-written one */
    assert_int_equal(cudaMemcpy(dk.k, hk.k, n_el * es, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dk.v, hk.v, n_el * es, cudaMemcpyHostToDevice), cudaSuccess);
    if (c->dt == DSQ_KV_INT8) {
        cudaMemcpy(dk.k_scale, hk.k_scale, n_sc * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dk.k_zero, hk.k_zero, n_sc * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dk.v_scale, hk.v_scale, n_sc * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dk.v_zero, hk.v_zero, n_sc * 2, cudaMemcpyHostToDevice);
    }
    enum { M = 20 };
    int32_t rseq[M], rpos[M];
    rseq[0] = 3; rpos[0] = 69;
    for (int i = 0; i < 17; i++) {
        rseq[1 + i] = 2;
        rpos[1 + i] = 20 + i;
    }
    rseq[18] = 0; rpos[18] = 0;
    rseq[19] = 1; rpos[19] = 12;
    float *q = malloc(sizeof(*q) * M * qrow);
    float *o = malloc(sizeof(*o) * M * qrow), *og = malloc(sizeof(*og) * M * qrow);
    for (int64_t i = 0; i < (int64_t)M * qrow; i++)
        q[i] = frand(1.0f);
    const float scale = 1.0f / sqrtf((float)D);
    void *dq = dev_typed(q, ft, (int64_t)M * qrow), *dout = dev_poison(fs * M * qrow);
    int32_t *drs = dev_dup(rseq, sizeof(rseq)), *drp = dev_dup(rpos, sizeof(rpos));
    int32_t *dbt = dev_dup(bt, sizeof(*bt) * NS * max_blocks);
    assert_int_equal(dsq_cpu_attention(o, q, M, n_heads, &hk, rseq, rpos, bt,
                                       max_blocks, scale), DSQ_OK);
    assert_int_equal(dsq_cuda_attention(dout, dq, ft, M, n_heads, &dk, drs, drp, dbt,
                                        max_blocks, scale), DSQ_OK);
    dev_get_f32(og, dout, ft, (int64_t)M * qrow);
    char what[96];
    snprintf(what, sizeof(what), "attention %s bs=%d G=%d D=%d", kind, bs, G, D);
    report_typed(what, ft, o, og, (int64_t)M * qrow, 2e-5);

    /* the prefill kernel on the same rows: its 16-query tiles straddle
     * sequences (a run of 17 rows among single rows). Heads wider than 256
     * take the decode kernel (the launch just checked), which the simulator
     * would spend minutes on again. */
    if (D > 256) {
        printf("# attention_prefill D=%d > 256: the decode kernel, checked above\n", D);
        goto prefill_done;
    }
    assert_int_equal(cudaMemset(dout, 0xff, fs * M * qrow), cudaSuccess);
    assert_int_equal(dsq_cuda_attention_prefill(dout, dq, ft, M, n_heads, &dk, drs, drp,
                                                dbt, max_blocks, scale), DSQ_OK);
    dev_get_f32(og, dout, ft, (int64_t)M * qrow);
    snprintf(what, sizeof(what), "attention_prefill mixed %s bs=%d G=%d D=%d", kind, bs, G,
             D);
    report_typed(what, ft, o, og, (int64_t)M * qrow, 2e-5);

    /* one whole sequence as a prefill chunk: causal over 70 rows */
    {
        const int P = len[3];
        int32_t *ps = malloc(sizeof(*ps) * P), *pp = malloc(sizeof(*pp) * P);
        for (int i = 0; i < P; i++) {
            ps[i] = 3;
            pp[i] = i;
        }
        float *q2 = malloc(sizeof(*q2) * P * qrow);
        float *o2 = malloc(sizeof(*o2) * P * qrow), *o2g = malloc(sizeof(*o2g) * P * qrow);
        for (int64_t i = 0; i < (int64_t)P * qrow; i++)
            q2[i] = frand(1.0f);
        void *dq2 = dev_typed(q2, ft, (int64_t)P * qrow);
        void *do2 = dev_poison(fs * P * qrow);
        int32_t *dps = dev_dup(ps, sizeof(*ps) * P), *dpp = dev_dup(pp, sizeof(*pp) * P);
        assert_int_equal(dsq_cpu_attention(o2, q2, P, n_heads, &hk, ps, pp, bt, max_blocks,
                                           scale), DSQ_OK);
        assert_int_equal(dsq_cuda_attention_prefill(do2, dq2, ft, P, n_heads, &dk, dps, dpp,
                                                    dbt, max_blocks, scale), DSQ_OK);
        dev_get_f32(o2g, do2, ft, (int64_t)P * qrow);
        snprintf(what, sizeof(what), "attention_prefill chunk %s bs=%d G=%d D=%d", kind, bs,
                 G, D);
        report_typed(what, ft, o2, o2g, (int64_t)P * qrow, 2e-5);
        cudaFree(dq2); cudaFree(do2); cudaFree(dps); cudaFree(dpp);
        free(ps); free(pp); free(q2); free(o2); free(o2g);
    }
prefill_done:

    cudaFree(dq); cudaFree(dout); cudaFree(drs); cudaFree(drp); cudaFree(dbt);
    cudaFree(dK); cudaFree(dV); cudaFree(dslot);
    cudaFree(dk.k); cudaFree(dk.v);
    cudaFree(dk.k_scale); cudaFree(dk.k_zero); cudaFree(dk.v_scale); cudaFree(dk.v_zero);
    free(hk.k); free(hk.v);
    free(hk.k_scale); free(hk.k_zero); free(hk.v_scale); free(hk.v_zero);
    free(zero); free(got); free(q); free(o); free(og);
    free(K); free(V); free(slot); free(bt); free(pool);
}

static void test_kv_attention(void **state)
{
    (void)state;
    const acase_t cases[] = {
        {DSQ_KV_F16, 16, 2, 1, 64, DSQ_FT_F32},
        {DSQ_KV_F16, 4, 2, 4, 128, DSQ_FT_F32},
        {DSQ_KV_F16, 16, 1, 16, 576, DSQ_FT_F32},     /* MLA-like wide head */
        {DSQ_KV_INT8, 4, 2, 3, 64, DSQ_FT_F32},
        {DSQ_KV_INT8, 16, 2, 4, 128, DSQ_FT_F32},
        {DSQ_KV_INT8, 16, 3, 1, 40, DSQ_FT_F32},
        /* narrow heads: 8- and 16-lane groups, one value per lane */
        {DSQ_KV_F16, 16, 4, 2, 8, DSQ_FT_F32},
        {DSQ_KV_INT8, 4, 2, 2, 12, DSQ_FT_F32},
        {DSQ_KV_F16, 8, 2, 2, 16, DSQ_FT_F32},
        {DSQ_KV_F16, 16, 1, 3, 24, DSQ_FT_F32},
        {DSQ_KV_INT8, 16, 2, 2, 200, DSQ_FT_F32},    /* 8 per lane, the last partly */
        /* narrow activations: an f16 cache, one KV head per query head,
         * and an int8 cache with GQA */
        {DSQ_KV_F16, 16, 2, 1, 64, DSQ_FT_F16},
        {DSQ_KV_F16, 16, 2, 1, 64, DSQ_FT_BF16},
        {DSQ_KV_INT8, 4, 2, 3, 64, DSQ_FT_F16},
        {DSQ_KV_INT8, 4, 2, 3, 64, DSQ_FT_BF16},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        kv_case(&cases[i]);
}

/* A row that attends an out-of-cache block gets zeros from both kernels,
 * and only that row: 16 rows of one sequence at positions 0..15, block
 * size 8, the second block missing (-1). Rows 0..7 equal the CPU op on
 * those rows; rows 8..15 are zero (the CPU op refuses: DSQ_ERANGE). Also
 * with fp16 q and out (the zero rows are their own store in the prefill
 * kernel). An F32 cache is refused as unsupported, an ftype outside the
 * enum as invalid. */
static void test_attention_bad_block(void **state)
{
    (void)state;
    enum { BS = 8, D = 64, P = 16, NB = 3, MAXB = 2 };
    const size_t n_el = (size_t)NB * BS * D;
    dsq_kv_layer_t hk = {.dtype = DSQ_KV_F16, .block_size = BS, .n_kv_heads = 1,
                         .head_dim = D, .n_blocks = NB};
    hk.k = calloc(n_el, 2);
    hk.v = calloc(n_el, 2);
    float *kv = malloc(sizeof(*kv) * P * D);
    for (int i = 0; i < P * D; i++)
        kv[i] = frand(1.0f);
    int32_t slot[BS];
    for (int i = 0; i < BS; i++)
        slot[i] = 2 * BS + i;                 /* block 2 holds positions 0..7 */
    assert_int_equal(dsq_cpu_kv_write(&hk, kv, kv + BS * D, slot, BS), DSQ_OK);
    const int32_t bt[MAXB] = {2, -1};
    int32_t seq[P], pos[P];
    for (int i = 0; i < P; i++) {
        seq[i] = 0;
        pos[i] = i;
    }
    float *q = malloc(sizeof(*q) * P * D), *o = malloc(sizeof(*o) * P * D);
    float *og = malloc(sizeof(*og) * P * D);
    for (int i = 0; i < P * D; i++)
        q[i] = frand(1.0f);
    const float scale = 0.125f;
    assert_int_equal(dsq_cpu_attention(o, q, P, 1, &hk, seq, pos, bt, MAXB, scale),
                     DSQ_ERANGE);
    dsq_kv_layer_t dk = hk;
    dk.k = dev_dup(hk.k, n_el * 2);
    dk.v = dev_dup(hk.v, n_el * 2);
    int32_t *dseq = dev_dup(seq, sizeof(seq)), *dpos = dev_dup(pos, sizeof(pos));
    int32_t *dbt = dev_dup(bt, sizeof(bt));
    void *dq = NULL, *dout = NULL;
    for (int ti = 0; ti < 2; ti++) {
        const dsq_ftype_t t = ti ? DSQ_FT_F16 : DSQ_FT_F32;
        cudaFree(dq);
        cudaFree(dout);
        dq = dev_typed(q, t, P * D);
        dout = dev_poison(dsq_ftype_size(t) * P * D);
        assert_int_equal(dsq_cpu_attention(o, q, BS, 1, &hk, seq, pos, bt, MAXB, scale),
                         DSQ_OK);
        memset(o + BS * D, 0, sizeof(*o) * BS * D);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(cudaMemset(dout, 0xff, dsq_ftype_size(t) * P * D), cudaSuccess);
            int rc = k ? dsq_cuda_attention_prefill(dout, dq, t, P, 1, &dk, dseq, dpos, dbt,
                                                    MAXB, scale)
                       : dsq_cuda_attention(dout, dq, t, P, 1, &dk, dseq, dpos, dbt, MAXB,
                                            scale);
            assert_int_equal(rc, DSQ_OK);
            dev_get_f32(og, dout, t, P * D);
            char what[80];
            snprintf(what, sizeof(what), "%s, rows past a missing block = 0%s",
                     k ? "attention_prefill" : "attention", ti ? " f16" : "");
            report_typed(what, t, o, og, P * D, 2e-5);
        }
    }
    for (int k = 0; k < 2; k++) {
        int rc = k ? dsq_cuda_attention_prefill(dout, dq, (dsq_ftype_t)7, P, 1, &dk, dseq,
                                                dpos, dbt, MAXB, scale)
                   : dsq_cuda_attention(dout, dq, (dsq_ftype_t)7, P, 1, &dk, dseq, dpos, dbt,
                                        MAXB, scale);
        assert_int_equal(rc, DSQ_EINVAL);
    }
    assert_int_equal(dsq_cuda_kv_write(&dk, dq, dq, (dsq_ftype_t)7, dseq, 1), DSQ_EINVAL);
    dsq_kv_layer_t f32 = dk;
    f32.dtype = DSQ_KV_F32;
    assert_int_equal(dsq_cuda_attention(dout, dq, DSQ_FT_F32, P, 1, &f32, dseq, dpos, dbt,
                                        MAXB, scale),
                     DSQ_EUNSUPPORTED);
    assert_int_equal(dsq_cuda_kv_write(&f32, dq, dq, DSQ_FT_F32, dseq, 1), DSQ_EUNSUPPORTED);
    cudaFree(dk.k); cudaFree(dk.v); cudaFree(dq); cudaFree(dout);
    cudaFree(dseq); cudaFree(dpos); cudaFree(dbt);
    free(hk.k); free(hk.v); free(kv); free(q); free(o); free(og);
}

int main(void)
{
    int skip = gpu_skip_code();
    if (skip >= 0)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_kv_attention),
        cmocka_unit_test(test_attention_bad_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

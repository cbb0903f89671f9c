/* GPU check for kernels/cuda/{matmul,embed,gather}.cu: each CUDA op against
 * its CPU twin on random inputs (fixed seed), device outputs poisoned
 * before each launch.
 *
 * Products: every weight format (F32, F16, BF16, Q8_0, INT8 per channel,
 * INT4 with each zero-point mode SYM/INT/MIN and group 32/64/128, and the
 * layouts every GGUF type repacks into: INT4 group 16 / SUPER scales / the
 * IQ4 codebook, INT8G), k with a
 * partial last group and a partial last 32-chunk (whose padding nibbles
 * hold garbage the kernels must ignore), m = 1, 5, 16 (the decode kernel)
 * and 37 (the prefill kernel), n not a multiple of the tiles, with and
 * without bias; fp32 activations everywhere, and fp16 / bf16 activations
 * (x and y narrow, or fp32 y from narrow x: the output head) on the decode,
 * prefill, generic and GGUF kernels. The reference is dsq_cpu_matmul
 * with DSQ_ACT_F32 (weights dequantised exactly, fp32 dot products), so
 * the only difference is fp32 summation order: the tolerance per output is
 * 1e-5 * sum_j |w_ij x_j| (+1e-6), and for narrow outputs one rounding
 * step of their type (fp16 2^-10 |y|, bf16 2^-7 |y|) on top. Prints the max abs difference of each case and
 * the largest ratio to its tolerance. The tensor-core prefill tile, which
 * rounds to fp16, has its own FP64 reference and bound (test_matmul_tc). */
#include "gpu_common.h"

#include "engine/common/error.h"
#include "kernels/kernels.h"
#include "engine/backend/backend.h"
#include "engine/io/tensor.h"
#include "engine/model/quant.h"

/* fp16 bits of a random value: sign, exponent in [e_lo, e_hi], mantissa */
static uint16_t rand_h(int e_lo, int e_hi, bool sign)
{
    int e = e_lo + (int)(urand() * (e_hi - e_lo + 1));
    uint16_t s = sign && urand() < 0.5 ? 0x8000u : 0;
    return (uint16_t)(s | (e << 10) | (uint16_t)(urand() * 1024));
}
/* fp16 bits of a small non-negative integer (exact below 2048) */
static uint16_t int_h(int v)
{
    if (v == 0)
        return 0;
    int e = 0;
    while ((2 << e) <= v)
        e++;
    return (uint16_t)(((e + 15) << 10) | ((v - (1 << e)) << (10 - e)));
}

typedef struct hw {
    dsq_weight_t w;        /* host arrays */
    dsq_weight_t dw;       /* device copy */
} hw_t;

static void make_weight(hw_t *h, dsq_wformat_t f, dsq_zp_mode_t zp, int gs, int64_t n,
                        int64_t k, bool bias)
{
    dsq_weight_t *w = &h->w;
    memset(h, 0, sizeof(*h));
    w->format = f;
    w->n = n;
    w->k = k;
    w->act = DSQ_ACT_F32;
    size_t db = dsq_weight_data_bytes(f, n, k, gs);
    uint8_t *data = malloc(db);
    uint16_t *scales = NULL, *zeros = NULL;
    switch (f) {
    case DSQ_WFMT_F32:
        for (size_t i = 0; i < db / 4; i++)
            ((float *)data)[i] = frand(1.0f);
        break;
    case DSQ_WFMT_F16:
        for (size_t i = 0; i < db / 2; i++)
            ((uint16_t *)data)[i] = rand_h(11, 15, true);
        break;
    case DSQ_WFMT_BF16:
        for (size_t i = 0; i < db / 2; i++)
            ((uint16_t *)data)[i] = (uint16_t)((urand() < 0.5 ? 0x8000u : 0) |
                                               ((120 + (int)(urand() * 8)) << 7) |
                                               (uint16_t)(urand() * 128));
        break;
    case DSQ_WFMT_Q8_0:
        w->group_size = 32;
        for (size_t b = 0; b < db / 34; b++) {
            uint16_t d = rand_h(8, 11, false);
            memcpy(data + 34 * b, &d, 2);
            for (int j = 0; j < 32; j++)
                data[34 * b + 2 + j] = (uint8_t)(int)(urand() * 256);
        }
        break;
    case DSQ_WFMT_INT8:
        for (size_t i = 0; i < db; i++)
            data[i] = (uint8_t)(int)(urand() * 256);
        scales = malloc(sizeof(*scales) * n);
        for (int64_t i = 0; i < n; i++)
            scales[i] = rand_h(8, 11, false);
        break;
    case DSQ_WFMT_INT8G:   /* built from GGUF blocks: tests/unit/test_gguf_quant.c */
    case DSQ_WFMT_INT4_X8: /* host layouts (CPU kernels only): never on a device */
    case DSQ_WFMT_INT6_X8:
    case DSQ_WFMT_Q8_0_X8:
    case DSQ_WFMT_INT5_X8:
    case DSQ_WFMT_INT2_X8:
    case DSQ_WFMT_INT3_X8:
        break;
    case DSQ_WFMT_INT4: {
        w->group_size = gs;
        w->zp_mode = zp;
        for (size_t i = 0; i < db; i++)
            data[i] = (uint8_t)(int)(urand() * 256);   /* padding nibbles: garbage */
        const int64_t groups = (k + gs - 1) / gs;
        scales = malloc(sizeof(*scales) * n * groups);
        for (int64_t i = 0; i < n * groups; i++)
            scales[i] = rand_h(8, 11, false);
        if (zp != DSQ_ZP_SYM) {
            zeros = malloc(sizeof(*zeros) * n * groups);
            for (int64_t i = 0; i < n * groups; i++)
                zeros[i] = zp == DSQ_ZP_INT ? int_h((int)(urand() * 16))
                                            : rand_h(10, 14, true);
        }
        break;
    }
    }
    w->data = data;
    w->scales = scales;
    w->zeros = zeros;
    if (bias) {
        float *b = malloc(sizeof(*b) * n);
        for (int64_t i = 0; i < n; i++)
            b[i] = frand(0.5f);
        w->bias = b;
    }
    h->dw = *w;
    h->dw.data = dev_dup(data, db);
    size_t sb = dsq_weight_scale_bytes(f, n, k, gs);
    h->dw.scales = scales ? dev_dup(scales, sb) : NULL;
    h->dw.zeros = zeros ? dev_dup(zeros, sb) : NULL;
    h->dw.bias = w->bias ? dev_dup(w->bias, sizeof(float) * n) : NULL;
}

static void free_weight(hw_t *h)
{
    free((void *)h->w.data);
    free((void *)h->w.scales);
    free((void *)h->w.zeros);
    free((void *)h->w.bias);
    cudaFree((void *)h->dw.data);
    cudaFree((void *)h->dw.scales);
    cudaFree((void *)h->dw.zeros);
    cudaFree((void *)h->dw.bias);
}

/* per-output tolerance 1e-5 * sum_j |w_ij x_j| + 1e-6 (+ fp16 step) */
static void tolerances(const dsq_weight_t *w, const float *x, int64_t m, const float *y,
                       bool f16_out, double *tol)
{
    float *row = malloc(sizeof(*row) * w->k);
    for (int64_t o = 0; o < w->n; o++) {
        assert_int_equal(dsq_weight_dequant_row(w, o, row), DSQ_OK);
        for (int64_t i = 0; i < m; i++) {
            double b = 0;
            for (int64_t j = 0; j < w->k; j++)
                b += fabs((double)row[j] * x[i * w->k + j]);
            double t = 1e-5 * b + 1e-6;
            if (f16_out)
                t += fabs((double)y[i * w->n + o]) * (1.0 / 1024.0);
            tol[i * w->n + o] = t;
        }
    }
    free(row);
}

static const char *fmt_name(const dsq_weight_t *w)
{
    static const char *f[] = {"f32", "f16", "bf16", "q8_0", "int4", "int8", "int8g"};
    static const char *z[] = {"sym", "int", "min", "lut"};
    static char buf[32];
    if (w->format == DSQ_WFMT_INT4 || w->format == DSQ_WFMT_INT8G)
        snprintf(buf, sizeof(buf), "%s %s g%d%s", f[w->format], z[w->zp_mode], w->group_size,
                 w->scale_mode == DSQ_SCALE_SUPER ? " super" : "");
    else
        snprintf(buf, sizeof(buf), "%s", f[w->format]);
    return buf;
}

static void check_close(const char *what, const float *want, const float *got,
                        const double *tol, int64_t n)
{
    double err = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)want[i] - got[i]);
        if (isnan(d) || isnan(got[i])) {
            err = INFINITY;
            worst = INFINITY;
            break;
        }
        err = d > err ? d : err;
        worst = d / tol[i] > worst ? d / tol[i] : worst;
    }
    printf("# %-44s max_abs_diff=%.3e max_diff/tol=%.3f\n", what, err, worst);
    assert_true(worst <= 1.0);
}

static void matmul_case(const hw_t *h, int64_t m)
{
    const dsq_weight_t *w = &h->w;
    const int64_t n = w->n, k = w->k;
    float *x = malloc(sizeof(*x) * m * k), *y = malloc(sizeof(*y) * m * n);
    float *yg = malloc(sizeof(*yg) * m * n);
    double *tol = malloc(sizeof(*tol) * m * n);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = frand(1.0f);
    float *dx = dev_dup(x, sizeof(*x) * m * k), *dy = dev_poison(sizeof(*dy) * m * n);
    assert_int_equal(dsq_cpu_matmul(y, x, m, w), DSQ_OK);
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F32, dx, DSQ_FT_F32, m, &h->dw), DSQ_OK);
    dev_get(yg, dy, sizeof(*yg) * m * n);
    tolerances(w, x, m, y, false, tol);
    char what[96];
    snprintf(what, sizeof(what), "matmul %s m=%lld n=%lld k=%lld%s", fmt_name(w),
             (long long)m, (long long)n, (long long)k, w->bias ? " bias" : "");
    check_close(what, y, yg, tol, m * n);
    cudaFree(dx);
    cudaFree(dy);
    free(x); free(y); free(yg); free(tol);
}

/* bf16 bits of a random value: sign, exponent 2^(e_lo..e_hi), 7 mantissa
 * bits */
static uint16_t rand_bf(int e_lo, int e_hi)
{
    int e = e_lo + (int)(urand() * (e_hi - e_lo + 1));
    uint16_t s = urand() < 0.5 ? 0x8000u : 0;
    return (uint16_t)(s | ((e + 127) << 7) | (uint16_t)(urand() * 128));
}

/* fp32 value of element i of a t-typed host array (exact widening: fp16
 * through the CPU's dequantisation of a 1 x 1 F16 weight) */
static float widen(const void *a, dsq_ftype_t t, int64_t i)
{
    if (t == DSQ_FT_F32)
        return ((const float *)a)[i];
    uint16_t b = ((const uint16_t *)a)[i];
    if (t == DSQ_FT_BF16) {
        uint32_t u = (uint32_t)b << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    dsq_weight_t id = {.format = DSQ_WFMT_F16, .n = 1, .k = 1, .act = DSQ_ACT_F32,
                       .data = &b};
    float f;
    assert_int_equal(dsq_weight_dequant_row(&id, 0, &f), DSQ_OK);
    return f;
}

/* Narrow activations: x of type xt (fp16 values in [2^-5, 2), or bf16 of
 * the same range), y of type yt (xt, or fp32: the output head). The
 * reference is the fp32 product of the exactly widened x (for fp16 -> fp16
 * dsq_cpu_matmul_f16, which rounds y the same way); the bound adds one
 * rounding step of y's type (fp16 2^-10 |y|, bf16 2^-7 |y|: the device and
 * the reference may round to the two neighbours of a sum they hold 1e-5
 * apart) to the fp32 tolerance. */
static void matmul_narrow_case(const hw_t *h, int64_t m, dsq_ftype_t yt, dsq_ftype_t xt)
{
    const dsq_weight_t *w = &h->w;
    const int64_t n = w->n, k = w->k;
    const size_t xs = dsq_ftype_size(xt), ys = dsq_ftype_size(yt);
    uint16_t *xh = malloc(xs * m * k);
    void *yref = malloc(ys * m * n), *yg = malloc(ys * m * n);
    float *xf = malloc(sizeof(*xf) * m * k), *yf = malloc(sizeof(*yf) * m * n);
    float *ygf = malloc(sizeof(*ygf) * m * n);
    double *tol = malloc(sizeof(*tol) * m * n);
    for (int64_t i = 0; i < m * k; i++) {
        xh[i] = xt == DSQ_FT_F16 ? rand_h(10, 15, true) : rand_bf(-5, 0);
        xf[i] = widen(xh, xt, i);
    }
    void *dx = dev_dup(xh, xs * m * k), *dy = dev_poison(ys * m * n);
    if (xt == DSQ_FT_F16 && yt == DSQ_FT_F16) {
        assert_int_equal(dsq_cpu_matmul_f16(yref, xh, m, w), DSQ_OK);
        for (int64_t i = 0; i < m * n; i++)
            yf[i] = widen(yref, yt, i);
    } else {
        assert_int_equal(dsq_cpu_matmul(yf, xf, m, w), DSQ_OK);
    }
    assert_int_equal(dsq_cuda_matmul(dy, yt, dx, xt, m, &h->dw), DSQ_OK);
    dev_get(yg, dy, ys * m * n);
    for (int64_t i = 0; i < m * n; i++)
        ygf[i] = widen(yg, yt, i);
    tolerances(w, xf, m, yf, false, tol);
    const double step = yt == DSQ_FT_F16 ? 1.0 / 1024 : yt == DSQ_FT_BF16 ? 1.0 / 128 : 0;
    for (int64_t i = 0; i < m * n; i++)
        tol[i] += step * fabs((double)yf[i]);
    char what[96];
    snprintf(what, sizeof(what), "matmul %s<-%s %s m=%lld n=%lld k=%lld", dsq_ftype_name(yt),
             dsq_ftype_name(xt), fmt_name(w), (long long)m, (long long)n, (long long)k);
    check_close(what, yf, ygf, tol, m * n);
    cudaFree(dx);
    cudaFree(dy);
    free(xh); free(yref); free(yg); free(xf); free(yf); free(ygf); free(tol);
}

static void test_matmul_int4(void **state)
{
    (void)state;
    const dsq_zp_mode_t zps[3] = {DSQ_ZP_SYM, DSQ_ZP_INT, DSQ_ZP_MIN};
    const int gss[3] = {32, 64, 128};
    /* m = 16 (a full decode tile) for one zero-point mode only: the
     * simulator's time goes with m */
    const int64_t ks[2] = {256, 203}, ms[4] = {1, 5, 37, 16};
    for (int z = 0; z < 3; z++)
        for (int g = 0; g < 3; g++)
            for (int kk = 0; kk < 2; kk++) {
                hw_t h;
                make_weight(&h, DSQ_WFMT_INT4, zps[z], gss[g], 67, ks[kk], (z + g) % 2);
                for (int mm = 0; mm < (zps[z] == DSQ_ZP_INT ? 4 : 3); mm++)
                    matmul_case(&h, ms[mm]);
                free_weight(&h);
            }
}

static void test_matmul_other(void **state)
{
    (void)state;
    const dsq_wformat_t fs[5] = {DSQ_WFMT_F32, DSQ_WFMT_F16, DSQ_WFMT_BF16, DSQ_WFMT_Q8_0,
                                 DSQ_WFMT_INT8};
    const int64_t ks[2] = {256, 203}, ms[3] = {1, 5, 37};
    for (int f = 0; f < 5; f++)
        for (int kk = 0; kk < 2; kk++) {
            if (fs[f] == DSQ_WFMT_Q8_0 && ks[kk] % 32)
                continue;
            hw_t h;
            make_weight(&h, fs[f], DSQ_ZP_SYM, 0, 70, ks[kk], kk == 0);
            for (int mm = 0; mm < 3; mm++)
                matmul_case(&h, ms[mm]);
            free_weight(&h);
        }
}

/* Every GGUF type that repacks into a new layout (engine/model/quant.h):
 * random blocks (every quant bit random, fp16 scale fields random finite),
 * repacked by dsq_quant_from_gguf and copied to the device by
 * dsq_backend_weight_upload, then each product checked against the CPU as
 * above (the layouts take the generic decode/prefill kernels). */
static void test_matmul_gguf_layouts(void **state)
{
    (void)state;
    static const struct { dsq_type_t t; int f16[2]; } types[] = {
        {DSQ_TYPE_Q5_0, {0, -1}},   {DSQ_TYPE_Q5_1, {0, 2}},   {DSQ_TYPE_Q2_K, {80, 82}},
        {DSQ_TYPE_Q3_K, {108, -1}}, {DSQ_TYPE_Q4_K, {0, 2}},   {DSQ_TYPE_Q5_K, {0, 2}},
        {DSQ_TYPE_Q6_K, {208, -1}}, {DSQ_TYPE_IQ4_NL, {0, -1}}, {DSQ_TYPE_IQ4_XS, {0, -1}},
    };
    const int64_t n = 37, k = 512, ms[3] = {1, 5, 37};
    char err[256] = "";
    dsq_backend_t *be = dsq_backend_create(DSQ_BACKEND_CUDA, err, sizeof(err));
    if (!be)
        fail_msg("cuda backend: %s", err);
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        const int be_ = dsq_type_block_elems(types[i].t);
        const size_t bb = dsq_type_block_bytes(types[i].t), nblk = (size_t)(n * k / be_);
        uint8_t *raw = malloc(nblk * bb);
        for (size_t j = 0; j < nblk * bb; j++)
            raw[j] = (uint8_t)(int)(urand() * 256);
        for (size_t b = 0; b < nblk; b++)
            for (int f = 0; f < 2; f++)
                if (types[i].f16[f] >= 0) {
                    uint16_t h = rand_h(8, 11, true);
                    memcpy(raw + b * bb + types[i].f16[f], &h, 2);
                }
        dsq_tensor_t t = {.name = dsq_type_name(types[i].t), .type = types[i].t, .n_dims = 2,
                          .ne = {k, n, 1, 1}, .data = raw, .n_bytes = nblk * bb};
        hw_t h;
        memset(&h, 0, sizeof(h));
        void *storage = NULL;
        assert_int_equal(dsq_quant_from_gguf(&t, &h.w, &storage, err, sizeof(err)), DSQ_OK);
        h.w.act = DSQ_ACT_F32;
        size_t bytes = 0;
        assert_int_equal(dsq_backend_weight_upload(be, &h.w, &h.dw, &bytes), DSQ_OK);
        dsq_weight_bytes_t lb;
        assert_int_equal(dsq_weight_layout(&h.w, &lb), DSQ_OK);
        assert_int_equal(bytes, lb.total);
        assert_int_equal(dsq_backend_sync(be), DSQ_OK);
        printf("# %s -> %s\n", dsq_type_name(types[i].t), fmt_name(&h.w));
        for (int mm = 0; mm < 3; mm++)
            matmul_case(&h, ms[mm]);
        dsq_backend_weight_free(be, &h.dw);
        free(storage);
        free(raw);
    }
    dsq_backend_destroy(be);
}

static void test_matmul_f16act(void **state)
{
    (void)state;
    hw_t h;
    const dsq_ftype_t F16 = DSQ_FT_F16, BF16 = DSQ_FT_BF16, F32 = DSQ_FT_F32;
    make_weight(&h, DSQ_WFMT_INT4, DSQ_ZP_INT, 64, 67, 256, true);
    matmul_narrow_case(&h, 1, F16, F16);
    matmul_narrow_case(&h, 16, F16, F16);
    matmul_narrow_case(&h, 37, F16, F16);
    matmul_narrow_case(&h, 5, BF16, BF16);
    matmul_narrow_case(&h, 37, BF16, BF16);
    matmul_narrow_case(&h, 2, F32, F16);
    matmul_narrow_case(&h, 37, F32, BF16);
    free_weight(&h);
    make_weight(&h, DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 40, 203, false);
    matmul_narrow_case(&h, 3, F16, F16);
    matmul_narrow_case(&h, 1, BF16, BF16);
    free_weight(&h);
    make_weight(&h, DSQ_WFMT_Q8_0, DSQ_ZP_SYM, 0, 33, 128, false);
    matmul_narrow_case(&h, 2, F16, F16);
    free_weight(&h);
    /* the generic kernels (F16 weights) and the GGUF layouts' kernel */
    make_weight(&h, DSQ_WFMT_F16, DSQ_ZP_SYM, 0, 24, 96, false);
    matmul_narrow_case(&h, 4, BF16, BF16);
    matmul_narrow_case(&h, 20, F32, F16);
    free_weight(&h);
}

static void test_embed(void **state)
{
    (void)state;
    const dsq_wformat_t fs[6] = {DSQ_WFMT_F32, DSQ_WFMT_F16, DSQ_WFMT_BF16, DSQ_WFMT_Q8_0,
                                 DSQ_WFMT_INT8, DSQ_WFMT_INT4};
    enum { M = 7, V = 50 };
    const int32_t ids[M] = {0, 49, 3, 3, 17, 48, 1};
    for (int f = 0; f < 6; f++) {
        const int64_t k = fs[f] == DSQ_WFMT_Q8_0 ? 96 : 75;
        hw_t h;
        make_weight(&h, fs[f], DSQ_ZP_MIN, 32, V, k, false);
        float *o = malloc(sizeof(*o) * M * k), *og = malloc(sizeof(*og) * M * k);
        int32_t *dids = dev_dup(ids, sizeof(ids));
        float *dout = dev_poison(sizeof(*o) * M * k);
        assert_int_equal(dsq_cpu_embed(o, &h.w, ids, M), DSQ_OK);
        assert_int_equal(dsq_cuda_embed(dout, &h.dw, dids, M), DSQ_OK);
        dev_get(og, dout, sizeof(*og) * M * k);
        char what[64];
        snprintf(what, sizeof(what), "embed %s k=%lld", fmt_name(&h.w), (long long)k);
        report(what, max_diff(o, og, M * k), 0.0);
        /* an id outside the vocabulary: the CPU op refuses, CUDA writes 0 */
        const int32_t bad[2] = {5, V};
        assert_int_equal(dsq_cpu_embed(o, &h.w, bad, 2), DSQ_ERANGE);
        cudaFree(dids);
        dids = dev_dup(bad, sizeof(bad));
        assert_int_equal(dsq_cuda_embed(dout, &h.dw, dids, 2), DSQ_OK);
        dev_get(og, dout, sizeof(*og) * 2 * k);
        for (int64_t j = 0; j < k; j++)
            assert_true(og[k + j] == 0.0f);
        cudaFree(dids);
        cudaFree(dout);
        free(o); free(og);
        free_weight(&h);
    }
}

static void test_gather(void **state)
{
    (void)state;
    enum { R = 9, W = 130, M = 5 };
    float *src = malloc(sizeof(*src) * R * W);
    for (int i = 0; i < R * W; i++)
        src[i] = frand(4.0f);
    const int32_t rows[M] = {8, 0, 3, 3, 7};
    float *o = malloc(sizeof(*o) * R * W), *og = malloc(sizeof(*og) * R * W);
    float *dsrc = dev_dup(src, sizeof(*src) * R * W), *dout = dev_poison(sizeof(*o) * R * W);
    int32_t *drows = dev_dup(rows, sizeof(rows));
    assert_int_equal(dsq_cpu_gather_rows(o, src, rows, M, W, R), DSQ_OK);
    assert_int_equal(dsq_cuda_gather_rows(dout, dsrc, drows, M, W, R), DSQ_OK);
    dev_get(og, dout, sizeof(*og) * M * W);
    report("gather_rows", max_diff(o, og, M * W), 0.0);
    /* columns through a random permutation of W */
    int32_t perm[W];
    for (int j = 0; j < W; j++)
        perm[j] = j;
    for (int j = W - 1; j > 0; j--) {
        int r = (int)(urand() * (j + 1));
        int32_t t = perm[j];
        perm[j] = perm[r];
        perm[r] = t;
    }
    int32_t *dperm = dev_dup(perm, sizeof(perm));
    assert_int_equal(cudaMemset(dout, 0xff, sizeof(*o) * R * W), cudaSuccess);
    assert_int_equal(dsq_cpu_gather_cols(o, src, perm, R, W), DSQ_OK);
    assert_int_equal(dsq_cuda_gather_cols(dout, dsrc, DSQ_FT_F32, dperm, R, W), DSQ_OK);
    dev_get(og, dout, sizeof(*og) * R * W);
    report("gather_cols", max_diff(o, og, R * W), 0.0);
    /* 16-bit elements (fp16 / bf16 activations) move as bits: the first
     * R * W halves of src's bytes, gathered on the host the same way */
    for (int t = 0; t < 2; t++) {
        const dsq_ftype_t ft = t ? DSQ_FT_BF16 : DSQ_FT_F16;
        const uint16_t *s16 = (const uint16_t *)src;
        uint16_t want[R * W], got[R * W];
        for (int r = 0; r < R; r++)
            for (int j = 0; j < W; j++)
                want[r * W + j] = s16[r * W + perm[j]];
        assert_int_equal(cudaMemset(dout, 0xff, sizeof(*o) * R * W), cudaSuccess);
        assert_int_equal(dsq_cuda_gather_cols(dout, dsrc, ft, dperm, R, W), DSQ_OK);
        dev_get(got, dout, sizeof(got));
        assert_memory_equal(want, got, sizeof(got));
        printf("# gather_cols %s: bitwise equal\n", dsq_ftype_name(ft));
    }
    assert_int_equal(dsq_cuda_gather_cols(dout, dsrc, (dsq_ftype_t)5, dperm, R, W), DSQ_EINVAL);
    cudaFree(dsrc); cudaFree(dout); cudaFree(drows); cudaFree(dperm);
    free(src); free(o); free(og);
}

/* Launchers refuse what the CPU ops refuse, before touching the device. */
/* The tensor-core prefill tile (tc_gemm_kernel, kernels/cuda/matmul.cu),
 * built a second time for compute_80 under the entry names below
 * (tests/meson.build), on a device of compute capability 8.0 or later (the
 * simulator reports 8.0). Reference: y = W.x + b in FP64 from the weights
 * dequantised by the CPU's dsq_weight_dequant_row. Bound: each product
 * sees one fp16 rounding of w and of x (relative u = 2^-11 each, so at
 * most 2.001 u |w x|, plus 2^-25 absolute per subnormal rounding; x
 * already fp16: w's alone, 1.01 u; bf16 tiles: w's, u = 2^-8), then
 * k fp32 additions whose error is below 2^-23 of the running sum of |w x|
 * even with truncating adds: tol = (2.01 u + k 2^-23) sum |w x| + 1e-6
 * (1.01 u for narrow x).
 * m spans one and several row blocks with partial edges (17, 64, 65, 130),
 * n and k are not multiples of the 64 x 32 tile. */
int dsq_test_tc_matmul(void *y, dsq_ftype_t yt, const void *x, dsq_ftype_t xt, int64_t m,
                       const dsq_weight_t *w);

/* x of type xt, y fp32. fp32 x rounds to fp16 in the tile (2.01 u with
 * u = 2^-11 for x and w); fp16 x is exact there (w alone: 1.01 u); bf16 x
 * takes bf16 tiles, exact for x, w rounded to bf16 (1.01 u, u = 2^-8). */
static void tc_case(const hw_t *h, int64_t m, dsq_ftype_t xt)
{
    const dsq_weight_t *w = &h->w;
    const int64_t n = w->n, k = w->k;
    const size_t xs = dsq_ftype_size(xt);
    float *x = malloc(sizeof(*x) * m * k), *yg = malloc(sizeof(*yg) * m * n);
    uint16_t *xn = malloc(sizeof(*xn) * m * k);
    float *row = malloc(sizeof(*row) * k), *want = malloc(sizeof(*want) * m * n);
    double *tol = malloc(sizeof(*tol) * m * n);
    for (int64_t i = 0; i < m * k; i++) {
        if (xt == DSQ_FT_F32) {
            x[i] = frand(1.0f);
            continue;
        }
        xn[i] = xt == DSQ_FT_F16 ? rand_h(10, 15, true) : rand_bf(-5, 0);
        x[i] = widen(xn, xt, i);
    }
    void *dx = dev_dup(xt == DSQ_FT_F32 ? (void *)x : (void *)xn, xs * m * k);
    float *dy = dev_poison(sizeof(*dy) * m * n);
    assert_int_equal(dsq_test_tc_matmul(dy, DSQ_FT_F32, dx, xt, m, &h->dw), DSQ_OK);
    dev_get(yg, dy, sizeof(*yg) * m * n);
    const double u = xt == DSQ_FT_BF16 ? 1.0 / 256.0 : 1.0 / 2048.0;
    const double rel = xt == DSQ_FT_F32 ? 2.01 * u : 1.01 * u;
    for (int64_t o = 0; o < n; o++) {
        assert_int_equal(dsq_weight_dequant_row(w, o, row), DSQ_OK);
        for (int64_t i = 0; i < m; i++) {
            double s = w->bias ? w->bias[o] : 0.0, b = 0.0;
            for (int64_t j = 0; j < k; j++) {
                s += (double)row[j] * x[i * k + j];
                b += fabs((double)row[j] * x[i * k + j]);
            }
            want[i * n + o] = (float)s;
            tol[i * n + o] = (rel + (double)k * ldexp(1.0, -23)) * b + 1e-6;
        }
    }
    char what[96];
    snprintf(what, sizeof(what), "tensor-core x %s %s m=%lld n=%lld k=%lld%s",
             dsq_ftype_name(xt), fmt_name(w), (long long)m, (long long)n, (long long)k,
             w->bias ? " bias" : "");
    check_close(what, want, yg, tol, m * n);
    cudaFree(dx);
    cudaFree(dy);
    free(x); free(xn); free(yg); free(row); free(want); free(tol);
}

static void test_matmul_tc(void **state)
{
    (void)state;
    int dev = 0, major = 0;
    assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
    assert_int_equal(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                     cudaSuccess);
    if (major < 8) {
        printf("# tensor-core tile: device below compute capability 8.0, not run\n");
        return;
    }
    const struct {
        dsq_wformat_t f; dsq_zp_mode_t zp; int gs; int64_t n, k, m; bool bias; dsq_ftype_t xt;
    } cs[] = {
        {DSQ_WFMT_INT4, DSQ_ZP_SYM, 32, 72, 256, 17, true, DSQ_FT_F32},
        {DSQ_WFMT_INT4, DSQ_ZP_INT, 128, 130, 203, 65, false, DSQ_FT_F32},
        {DSQ_WFMT_INT4, DSQ_ZP_MIN, 64, 64, 96, 130, true, DSQ_FT_F32},
        {DSQ_WFMT_Q8_0, DSQ_ZP_SYM, 0, 40, 160, 64, false, DSQ_FT_F32},
        {DSQ_WFMT_INT8, DSQ_ZP_SYM, 0, 67, 75, 33, true, DSQ_FT_F32},
        {DSQ_WFMT_INT4, DSQ_ZP_INT, 64, 72, 203, 33, true, DSQ_FT_F16},
        {DSQ_WFMT_INT4, DSQ_ZP_MIN, 32, 70, 160, 65, false, DSQ_FT_BF16},
    };
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        hw_t h;
        make_weight(&h, cs[c].f, cs[c].zp, cs[c].gs, cs[c].n, cs[c].k, cs[c].bias);
        tc_case(&h, cs[c].m, cs[c].xt);
        free_weight(&h);
    }
}

static void test_matmul_errors(void **state)
{
    (void)state;
    hw_t h;
    make_weight(&h, DSQ_WFMT_INT4, DSQ_ZP_INT, 32, 8, 64, false);
    float *dx = dev_poison(sizeof(float) * 64), *dy = dev_poison(sizeof(float) * 8);
    dsq_weight_t bad = h.dw;
    bad.group_size = 48;
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F32, dx, DSQ_FT_F32, 1, &bad), DSQ_EINVAL);
    bad = h.dw;
    bad.zeros = NULL;
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F32, dx, DSQ_FT_F32, 1, &bad), DSQ_EINVAL);
    bad = h.dw;
    bad.format = DSQ_WFMT_Q8_0;
    bad.k = 40;
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F32, dx, DSQ_FT_F32, 1, &bad), DSQ_EINVAL);
    assert_int_equal(dsq_cuda_matmul(NULL, DSQ_FT_F32, dx, DSQ_FT_F32, 1, &h.dw), DSQ_EINVAL);
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F32, dx, DSQ_FT_F32, -1, &h.dw), DSQ_EINVAL);
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F32, dx, DSQ_FT_F32, 0, &h.dw), DSQ_OK);
    /* type pairs: (t, t) and (f32 <- narrow) only; an ftype outside the enum */
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F16, dx, DSQ_FT_BF16, 1, &h.dw),
                     DSQ_EUNSUPPORTED);
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_BF16, dx, DSQ_FT_F32, 1, &h.dw),
                     DSQ_EUNSUPPORTED);
    assert_int_equal(dsq_cuda_matmul(dy, (dsq_ftype_t)3, dx, DSQ_FT_F32, 1, &h.dw),
                     DSQ_EINVAL);
    assert_int_equal(dsq_cuda_matmul(dy, DSQ_FT_F32, dx, (dsq_ftype_t)-1, 1, &h.dw),
                     DSQ_EINVAL);
    assert_int_equal(dsq_cuda_embed(dy, &h.dw, NULL, 1), DSQ_EINVAL);
    cudaFree(dx);
    cudaFree(dy);
    free_weight(&h);
}

int main(void)
{
    int skip = gpu_skip_code();
    if (skip >= 0)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_int4),
        cmocka_unit_test(test_matmul_other),
        cmocka_unit_test(test_matmul_gguf_layouts),
        cmocka_unit_test(test_matmul_f16act),
        cmocka_unit_test(test_matmul_tc),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_matmul_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

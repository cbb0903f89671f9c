/* tests for kernels/cpu/kv_write.c and kernels/cpu/attention*.c.
 *
 * kv_write: fp16 bits against the compiler's _Float16 conversion (round to
 * nearest even), INT8 against the documented bound |v - v'| <= s/2 with s
 * recomputed here from the group's min/max, slot validation.
 * attention: several sequences of different lengths in one call, sharing a
 * shuffled block pool (block_size 16 and 4), GQA ratios 1, 3, 4, a prefill
 * chunk crossing block boundaries mixed with decode rows, FP16 and INT8 KV.
 * Two FP64 references: (a) on the values the cache holds (decoded here from
 * the stored bits with the format's formula): tolerance 2e-5; (b) on the
 * original fp32 K/V: a bound derived from the quantisation step. With
 * per-element K error eps_k and V error eps_v, each score moves by at most
 * D = scale * sum|q_d| * eps_k, so the softmax weights move by at most a
 * factor e^(2D) and |out' - out| <= eps_v + (e^(2D) - 1) * max|v|.
 * Also the scalar and the AVX2 paths must agree to 1e-5, and rows run one
 * at a time (which splits heads across threads) must match the batch bit
 * for bit. Prefill chunks (the tiled path) have their own test below:
 * chunks of 1..300 rows at offsets, every KV dtype, GQA 1..8, head_dim
 * 30..128, 1 and 2 threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "kernels.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(float a) { return (float)((urand() * 2.0 - 1.0) * a); }

static double h2d(uint16_t b)
{
    _Float16 h;
    memcpy(&h, &b, 2);
    return (double)h;
}
static uint16_t d2h(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

/* A KV layer with its own storage. */
typedef struct kvbuf {
    dsq_kv_layer_t l;
    int n_groups;
    size_t n_elem, n_sc;
} kvbuf_t;

static void kv_alloc(kvbuf_t *b, dsq_kv_dtype_t dt, int bs, int n_kv, int D,
                     int64_t n_blocks)
{
    memset(b, 0, sizeof(*b));
    b->n_groups = (D % 64 == 0) ? D / 64 : 1;
    assert_int_equal(dsq_kv_n_groups(D), b->n_groups);
    b->n_elem = (size_t)n_blocks * bs * n_kv * D;
    b->n_sc = (size_t)n_blocks * bs * n_kv * b->n_groups;
    size_t es = dt == DSQ_KV_F16 ? 2 : dt == DSQ_KV_F32 ? 4 : 1;
    b->l = (dsq_kv_layer_t){ .dtype = dt, .block_size = bs, .n_kv_heads = n_kv,
                             .head_dim = D, .n_blocks = n_blocks };
    b->l.k = calloc(b->n_elem, es);
    b->l.v = calloc(b->n_elem, es);
    if (dt == DSQ_KV_INT8) {
        b->l.k_scale = calloc(b->n_sc, 2);
        b->l.k_zero = calloc(b->n_sc, 2);
        b->l.v_scale = calloc(b->n_sc, 2);
        b->l.v_zero = calloc(b->n_sc, 2);
    }
}

static void kv_free(kvbuf_t *b)
{
    free(b->l.k); free(b->l.v);
    free(b->l.k_scale); free(b->l.k_zero); free(b->l.v_scale); free(b->l.v_zero);
}

/* Value the cache holds for (slot t, head h, dim d), decoded independently. */
static double kv_get(const kvbuf_t *b, int is_v, int64_t t, int h, int d)
{
    const dsq_kv_layer_t *l = &b->l;
    int64_t e = (t * l->n_kv_heads + h) * l->head_dim + d;
    const void *base = is_v ? l->v : l->k;
    if (l->dtype == DSQ_KV_F16)
        return h2d(((const uint16_t *)base)[e]);
    if (l->dtype == DSQ_KV_F32)
        return ((const float *)base)[e];
    int gs = l->head_dim / b->n_groups;
    int64_t g = (t * l->n_kv_heads + h) * b->n_groups + d / gs;
    double s = h2d((is_v ? l->v_scale : l->k_scale)[g]);
    double z = h2d((is_v ? l->v_zero : l->k_zero)[g]);
    return (((const int8_t *)base)[e] - z) * s;
}

/* Quantisation error bound of one element, from its group's original data:
 * fp16 rounding for F16; s/2 for INT8 with s recomputed from min/max. */
static double elem_bound(dsq_kv_dtype_t dt, const float *grp, int n, float v)
{
    if (dt == DSQ_KV_F16)
        return fabs(v) * (1.0 / 2048) + 6e-8;
    double lo = grp[0], hi = grp[0];
    for (int i = 1; i < n; i++) {
        lo = fmin(lo, grp[i]);
        hi = fmax(hi, grp[i]);
    }
    double amax = fmax(fabs(lo), fabs(hi));
    double s = fmax((hi - lo) / 254.0, amax / 1000.0);
    return 0.5 * s * (1.0 + 1.0 / 512) + amax * 1e-6;
}

/* ------------------------------------------------------------ kv_write */

static void test_kv_write_f16(void **state)
{
    (void)state;
    const int bs = 4, n_kv = 3, D = 40, row = n_kv * D;
    const int64_t nb = 5, m = 9;
    static const char *isas[] = {"scalar", NULL};
    isas[1] = dsq_cpu_isa();
    float *k = malloc(sizeof(*k) * m * row), *v = malloc(sizeof(*v) * m * row);
    for (int64_t i = 0; i < m * row; i++) {
        k[i] = frand(4.0f);
        v[i] = frand(1e-5f);           /* subnormal fp16 territory */
    }
    const float special[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f,
                             -1e9f, 6.1035156e-05f, 5.9604645e-08f, 2.9e-08f,
                             3.0e-08f, 1.0009765625f, 1.00146484375f, 0.33333334f};
    memcpy(k, special, sizeof(special));
    const int32_t slot[9] = {19, 0, 7, 3, 12, 4, 18, 9, 1};
    for (int p = 0; p < 2; p++) {
        assert_int_equal(dsq_cpu_force_isa(isas[p]), DSQ_OK);
        kvbuf_t b;
        kv_alloc(&b, DSQ_KV_F16, bs, n_kv, D, nb);
        assert_int_equal(dsq_cpu_kv_write(&b.l, k, v, slot, m), DSQ_OK);
        int bad = 0;
        for (int64_t i = 0; i < m; i++)
            for (int j = 0; j < row; j++) {
                bad += ((uint16_t *)b.l.k)[slot[i] * row + j] != d2h(k[i * row + j]);
                bad += ((uint16_t *)b.l.v)[slot[i] * row + j] != d2h(v[i * row + j]);
            }
        printf("# kv_write f16 isa=%s mismatched_bits=%d\n", isas[p], bad);
        assert_int_equal(bad, 0);
        /* a bad slot anywhere: nothing is written */
        memset(b.l.k, 0, b.n_elem * 2);
        const int32_t bad_slot[2] = {0, 20};
        assert_int_equal(dsq_cpu_kv_write(&b.l, k, v, bad_slot, 2), DSQ_ERANGE);
        const int32_t neg_slot[1] = {-1};
        assert_int_equal(dsq_cpu_kv_write(&b.l, k, v, neg_slot, 1), DSQ_ERANGE);
        for (size_t i = 0; i < b.n_elem; i++)
            assert_int_equal(((uint16_t *)b.l.k)[i], 0);
        kv_free(&b);
    }
    assert_int_equal(dsq_cpu_force_isa(isas[1]), DSQ_OK);
    free(k); free(v);
}

static void test_kv_write_int8(void **state)
{
    (void)state;
    const int bs = 16;
    const int dims[3] = {128, 64, 40};     /* 2 groups, 1 group, 1 odd group */
    for (int c = 0; c < 3; c++) {
        const int D = dims[c], n_kv = 2, row = n_kv * D;
        const int64_t m = 6;
        kvbuf_t b;
        kv_alloc(&b, DSQ_KV_INT8, bs, n_kv, D, 2);
        float *k = malloc(sizeof(*k) * m * row), *v = malloc(sizeof(*v) * m * row);
        for (int64_t i = 0; i < m * row; i++) {
            k[i] = frand(3.0f);
            v[i] = frand(0.5f);
        }
        for (int j = 0; j < D; j++) {
            k[j] = 0.0f;                          /* all-zero group     */
            k[row + j] = 100.0f + (float)urand() * 0.5f; /* far from 0  */
            v[j] = -7.0f + (float)urand() * 1e-3f;
        }
        k[2 * row + 3] = 50.0f;                   /* an outlier        */
        const int32_t slot[6] = {31, 2, 17, 0, 16, 15};
        assert_int_equal(dsq_cpu_kv_write(&b.l, k, v, slot, m), DSQ_OK);
        const int gs = D / b.n_groups;
        double err = 0, worst = 0;
        for (int is_v = 0; is_v < 2; is_v++)
            for (int64_t i = 0; i < m; i++)
                for (int h = 0; h < n_kv; h++)
                    for (int d = 0; d < D; d++) {
                        const float *src = (is_v ? v : k) + i * row + h * D;
                        const float *grp = src + (d / gs) * gs;
                        double e = fabs(kv_get(&b, is_v, slot[i], h, d) - src[d]);
                        double bnd = elem_bound(DSQ_KV_INT8, grp, gs, src[d]);
                        err = fmax(err, e);
                        worst = fmax(worst, e / bnd);
                    }
        printf("# kv_write int8 D=%-3d max_abs_err=%.3e max err/bound=%.3f (<= 1)\n",
               D, err, worst);
        assert_true(worst <= 1.0);
        for (int d = 0; d < D; d++)
            assert_true(kv_get(&b, 0, 31, 0, d) == 0.0);
        kv_free(&b);
        free(k); free(v);
    }
}

/* ----------------------------------------------------------- attention */

typedef struct acase {
    dsq_kv_dtype_t dt;
    int bs, n_kv, G, D;
} acase_t;

static void run_case(const acase_t *c)
{
    enum { NS = 4 };
    const int len[NS] = {1, 13, 37, 70};
    const int n_kv = c->n_kv, D = c->D, bs = c->bs, G = c->G;
    const int n_heads = n_kv * G, row = n_kv * D, qrow = n_heads * D;
    const int max_blocks = 70 / bs + 2;
    int64_t nb = 3;
    for (int s = 0; s < NS; s++)
        nb += (len[s] + bs - 1) / bs;
    /* shuffled pool */
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

    kvbuf_t kb;
    kv_alloc(&kb, c->dt, bs, n_kv, D, nb);
    /* original K/V [NS][70][row], written in two calls */
    float *K = malloc(sizeof(*K) * NS * 70 * row), *V = malloc(sizeof(*V) * NS * 70 * row);
    for (int64_t i = 0; i < (int64_t)NS * 70 * row; i++) {
        K[i] = frand(1.5f);
        V[i] = frand(1.0f);
    }
    for (int s = 0; s < NS; s++) {
        int32_t *slot = malloc(sizeof(*slot) * len[s]);
        for (int p = 0; p < len[s]; p++)
            slot[p] = bt[s * max_blocks + p / bs] * bs + p % bs;
        int half = len[s] / 2;
        const float *ks = K + (int64_t)s * 70 * row, *vs = V + (int64_t)s * 70 * row;
        assert_int_equal(dsq_cpu_kv_write(&kb.l, ks, vs, slot, half), DSQ_OK);
        assert_int_equal(dsq_cpu_kv_write(&kb.l, ks + half * row, vs + half * row,
                                          slot + half, len[s] - half), DSQ_OK);
        free(slot);
    }

    /* rows: decode seq 3, prefill chunk of seq 2 (positions 20..36),
     * decode seq 0 and seq 1 */
    enum { M = 20 };
    int32_t rseq[M], rpos[M];
    rseq[0] = 3; rpos[0] = 69;
    for (int i = 0; i < 17; i++) {
        rseq[1 + i] = 2;
        rpos[1 + i] = 20 + i;
    }
    rseq[18] = 0; rpos[18] = 0;
    rseq[19] = 1; rpos[19] = 12;
    float *q = malloc(sizeof(*q) * M * qrow), *out = malloc(sizeof(*out) * M * qrow);
    float *out_s = malloc(sizeof(*out_s) * M * qrow);
    for (int64_t i = 0; i < (int64_t)M * qrow; i++) {
        q[i] = frand(1.0f);
        out[i] = NAN;
    }
    const float scale = 1.0f / sqrtf((float)D);
    assert_int_equal(dsq_cpu_attention(out, q, M, n_heads, &kb.l, rseq, rpos, bt,
                                       max_blocks, scale), DSQ_OK);
    const char *isa = dsq_cpu_isa();
    assert_int_equal(dsq_cpu_force_isa("scalar"), DSQ_OK);
    assert_int_equal(dsq_cpu_attention(out_s, q, M, n_heads, &kb.l, rseq, rpos, bt,
                                       max_blocks, scale), DSQ_OK);
    assert_int_equal(dsq_cpu_force_isa(isa), DSQ_OK);

    /* global per-element quantisation bounds of K and V */
    const int gs = c->dt == DSQ_KV_INT8 ? D / kb.n_groups : 1;
    double eps_k = 0, eps_v = 0, vmax = 0;
    for (int s = 0; s < NS; s++)
        for (int p = 0; p < len[s]; p++)
            for (int j = 0; j < row; j++) {
                int64_t e = ((int64_t)s * 70 + p) * row + j;
                int64_t g0 = ((int64_t)s * 70 + p) * row + (j / D) * D + ((j % D) / gs) * gs;
                eps_k = fmax(eps_k, elem_bound(c->dt, K + g0, gs, K[e]));
                eps_v = fmax(eps_v, elem_bound(c->dt, V + g0, gs, V[e]));
                vmax = fmax(vmax, fabs(V[e]));
            }

    double err_held = 0, err_orig = 0, ratio = 0, err_isa = 0;
    double *sc = malloc(sizeof(*sc) * 70), *sc2 = malloc(sizeof(*sc2) * 70);
    for (int i = 0; i < M; i++)
        for (int h = 0; h < n_heads; h++) {
            const int kh = h / G, s = rseq[i], P = rpos[i];
            const float *qh = q + (int64_t)i * qrow + h * D;
            double mx = -INFINITY, mx2 = -INFINITY, qabs = 0;
            for (int d = 0; d < D; d++)
                qabs += fabs(qh[d]);
            for (int p = 0; p <= P; p++) {
                int64_t t = (int64_t)bt[s * max_blocks + p / bs] * bs + p % bs;
                const float *kp = K + ((int64_t)s * 70 + p) * row + kh * D;
                double a = 0, a2 = 0;
                for (int d = 0; d < D; d++) {
                    a += qh[d] * kv_get(&kb, 0, t, kh, d);
                    a2 += (double)qh[d] * kp[d];
                }
                sc[p] = a * scale;
                sc2[p] = a2 * scale;
                mx = fmax(mx, sc[p]);
                mx2 = fmax(mx2, sc2[p]);
            }
            double l = 0, l2 = 0;
            for (int p = 0; p <= P; p++) {
                sc[p] = exp(sc[p] - mx);
                sc2[p] = exp(sc2[p] - mx2);
                l += sc[p];
                l2 += sc2[p];
            }
            double bound = eps_v + (exp(2.0 * scale * qabs * eps_k) - 1.0) * vmax + 1e-5;
            for (int d = 0; d < D; d++) {
                double w = 0, w2 = 0;
                for (int p = 0; p <= P; p++) {
                    int64_t t = (int64_t)bt[s * max_blocks + p / bs] * bs + p % bs;
                    w += sc[p] * kv_get(&kb, 1, t, kh, d);
                    w2 += sc2[p] * V[((int64_t)s * 70 + p) * row + kh * D + d];
                }
                double got = out[(int64_t)i * qrow + h * D + d];
                double gs_ = out_s[(int64_t)i * qrow + h * D + d];
                err_held = fmax(err_held, fabs(got - w / l));
                double eo = fabs(got - w2 / l2);
                err_orig = fmax(err_orig, eo);
                ratio = fmax(ratio, eo / bound);
                err_isa = fmax(err_isa, fabs(got - gs_));
            }
        }
    printf("# attn %s bs=%-2d G=%d D=%-3d held-KV err=%.2e (tol 2e-5) "
           "orig-KV err=%.2e (err/bound %.3f <= 1) %s-vs-scalar %.2e (tol 1e-5)\n",
           c->dt == DSQ_KV_F16 ? "f16 " : "int8", bs, G, D, err_held, err_orig,
           ratio, isa, err_isa);
    assert_true(err_held <= 2e-5);
    assert_true(ratio <= 1.0);
    assert_true(err_isa <= 1e-5);

    /* one row at a time (few tasks: the op splits a kv head's query heads
     * into chunks across threads; the prefill chunk's rows leave the tiled
     * path) must give the same bits: these contexts are too short for a
     * flash-decoding split at any thread count */
    double err_row = 0;
    float *o1 = malloc(sizeof(*o1) * qrow);
    for (int i = 0; i < M; i++) {
        assert_int_equal(dsq_cpu_attention(o1, q + (int64_t)i * qrow, 1, n_heads, &kb.l,
                                           rseq + i, rpos + i, bt, max_blocks, scale),
                         DSQ_OK);
        for (int j = 0; j < qrow; j++)
            err_row = fmax(err_row, fabs(o1[j] - out[(int64_t)i * qrow + j]));
    }
    free(o1);
    printf("# attn single-row vs batched max_abs_diff=%.2e (bitwise)\n", err_row);
    assert_true(err_row == 0.0);

    /* errors: position past the table, unmapped block, bad GQA ratio */
    int32_t p_bad = max_blocks * bs;
    assert_int_equal(dsq_cpu_attention(out, q, 1, n_heads, &kb.l, rseq, &p_bad, bt,
                                       max_blocks, scale), DSQ_ERANGE);
    int32_t s0 = 0, p_unmapped = bs;   /* seq 0 has one block only */
    assert_int_equal(dsq_cpu_attention(out, q, 1, n_heads, &kb.l, &s0, &p_unmapped,
                                       bt, max_blocks, scale), DSQ_ERANGE);
    if (n_kv > 1)
        assert_int_equal(dsq_cpu_attention(out, q, 1, n_kv + 1, &kb.l, rseq, rpos, bt,
                                           max_blocks, scale), DSQ_EINVAL);

    free(sc); free(sc2); free(q); free(out); free(out_s);
    free(K); free(V); free(bt); free(pool);
    kv_free(&kb);
}

static void test_attention(void **state)
{
    (void)state;
    const acase_t cases[] = {
        {DSQ_KV_F16, 16, 2, 1, 64},
        {DSQ_KV_F16, 4, 2, 4, 64},
        {DSQ_KV_F16, 4, 1, 3, 40},
        {DSQ_KV_F16, 16, 3, 3, 64},      /* SmolLM2's shape (fused fp16 path) */
        {DSQ_KV_F16, 16, 1, 7, 128},     /* a head tile of 4 and one of 3 */
        {DSQ_KV_INT8, 4, 2, 3, 64},
        {DSQ_KV_INT8, 16, 2, 4, 128},
        {DSQ_KV_INT8, 16, 3, 1, 40},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}

/* One decode row over a long context (2,000 and 1,001
 * positions, shuffled blocks), where the kernel splits each kv head's KV
 * range across threads and merges the parts' softmax states
 * (flash-decoding): against the FP64 reference on the values the cache
 * holds, at 1, 2 and 4 threads (1 = no split), scalar and SIMD, FP16 and
 * INT8; the threads' results agree to 1e-5. */
static void test_attention_long(void **state)
{
    (void)state;
    const int bs = 16, n_kv = 3, G = 3, D = 64, n_heads = n_kv * G, row = n_kv * D;
    const int lens[2] = {2000, 1001};
    const int saved_thr = dsq_cpu_get_threads();
    const char *isa = dsq_cpu_isa();
    for (int dt = 0; dt < 2; dt++)
        for (int li = 0; li < 2; li++) {
            const int L = lens[li], nb = (L + bs - 1) / bs + 3;
            kvbuf_t kb;
            kv_alloc(&kb, dt ? DSQ_KV_INT8 : DSQ_KV_F16, bs, n_kv, D, nb);
            int32_t *bt = malloc(sizeof(*bt) * nb), *slot = malloc(sizeof(*slot) * L);
            for (int b = 0; b < nb; b++)
                bt[b] = b;
            for (int b = nb - 1; b > 0; b--) {
                int j = (int)(urand() * (b + 1)), t = bt[b];
                bt[b] = bt[j];
                bt[j] = t;
            }
            float *K = malloc(sizeof(*K) * L * row), *V = malloc(sizeof(*V) * L * row);
            for (int64_t i = 0; i < (int64_t)L * row; i++) {
                K[i] = frand(2.0f);
                V[i] = frand(1.0f);
            }
            for (int p = 0; p < L; p++)
                slot[p] = bt[p / bs] * bs + p % bs;
            assert_int_equal(dsq_cpu_kv_write(&kb.l, K, V, slot, L), DSQ_OK);
            float q[9 * 64], out[9 * 64], out1[9 * 64];
            for (int i = 0; i < n_heads * D; i++)
                q[i] = frand(1.0f);
            const int32_t rseq[1] = {0}, rpos[1] = {L - 1};
            const float scale = 1.0f / sqrtf((float)D);
            /* the reference */
            double *ref = malloc(sizeof(*ref) * n_heads * D), *sc = malloc(sizeof(*sc) * L);
            for (int h = 0; h < n_heads; h++) {
                double mx = -INFINITY, l = 0;
                for (int p = 0; p < L; p++) {
                    double a = 0;
                    for (int d = 0; d < D; d++)
                        a += q[h * D + d] * kv_get(&kb, 0, slot[p], h / G, d);
                    sc[p] = a * scale;
                    mx = fmax(mx, sc[p]);
                }
                for (int p = 0; p < L; p++)
                    l += (sc[p] = exp(sc[p] - mx));
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int p = 0; p < L; p++)
                        o += sc[p] * kv_get(&kb, 1, slot[p], h / G, d);
                    ref[h * D + d] = o / l;
                }
            }
            static const int thr[3] = {1, 2, 4};
            for (int pi = 0; pi < 2; pi++) {
                assert_int_equal(dsq_cpu_force_isa(pi ? isa : "scalar"), DSQ_OK);
                for (int ti = 0; ti < 3; ti++) {
                    assert_int_equal(dsq_cpu_set_threads(thr[ti]), DSQ_OK);
                    for (int i = 0; i < n_heads * D; i++)
                        out[i] = NAN;
                    assert_int_equal(dsq_cpu_attention(out, q, 1, n_heads, &kb.l, rseq, rpos,
                                                       bt, nb, scale), DSQ_OK);
                    double err = 0, dif = 0;
                    for (int i = 0; i < n_heads * D; i++) {
                        err = fmax(err, fabs(out[i] - ref[i]));
                        if (ti == 0)
                            out1[i] = out[i];
                        dif = fmax(dif, fabs(out[i] - out1[i]));
                    }
                    printf("# attn long %s L=%d isa=%s threads=%d err=%.2e vs-1-thread %.2e\n",
                           dt ? "int8" : "f16", L, pi ? isa : "scalar", thr[ti], err, dif);
                    assert_true(err <= 2e-5);
                    assert_true(dif <= 1e-5);
                }
            }
            assert_int_equal(dsq_cpu_force_isa(isa), DSQ_OK);
            assert_int_equal(dsq_cpu_set_threads(saved_thr), DSQ_OK);
            free(ref); free(sc); free(K); free(V); free(bt); free(slot);
            kv_free(&kb);
        }
}

/* Prefill chunks (rows of one sequence with increasing positions), which
 * the op computes in tiles (attention_prefill.c): a chunk of n rows at
 * positions off..off+n-1 over a cache already holding 0..off-1, in a batch
 * with a decode row of another sequence on either side and a 3-row run
 * with gaps in its positions (5, 9, 10), all sequences on one shuffled
 * block pool. At ISA scalar and the machine's own level, at 1 and 2
 * threads, checked against
 *  (a) an FP64 reference on the values the cache holds, tolerance 2e-5
 *      as above;
 *  (b) the same rows sent one at a time (the decode path): bitwise equal.
 *      The engine relies on this: a prompt chunk of one row, or a
 *      preempted sequence recomputed as a prefill, must give the bits the
 *      other path gave, and a decode row the bits it has in any batch.
 *      Tiled rows equal the rows alone on one thread (one walk over the
 *      context each); decode rows equal the rows alone at the same thread
 *      count (a long context is split across threads at positions fixed
 *      by the position and thread count only: flash-decoding), and so do
 *      the chunk's rows when dsq_cpu_attention_ex marks the chunk's
 *      sequence as decoding (a speculative verification); a split row is
 *      within 1e-5 of its one-walk bits;
 *  (c) the scalar level: 1e-5 (fp32 rounding, FMA and exp differ). */
typedef struct pcase {
    dsq_kv_dtype_t dt;
    int bs, n_kv, G, D, off, n;
} pcase_t;

static void run_prefill_case(const pcase_t *c)
{
    enum { NS = 4 };
    const int n_kv = c->n_kv, D = c->D, bs = c->bs, G = c->G;
    const int n_heads = n_kv * G, row = n_kv * D, qrow = n_heads * D;
    /* seq 0: the chunk; 1, 2: one decode row each; 3: the gapped run */
    const int len[NS] = {c->off + c->n, 45, 17, 11};
    int max_len = 0;
    for (int s = 0; s < NS; s++)
        max_len = len[s] > max_len ? len[s] : max_len;
    const int max_blocks = max_len / bs + 2;
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
    kvbuf_t kb;
    kv_alloc(&kb, c->dt, bs, n_kv, D, nb);
    float *K = malloc(sizeof(*K) * max_len * row), *V = malloc(sizeof(*V) * max_len * row);
    int32_t *slot = malloc(sizeof(*slot) * max_len);
    for (int s = 0; s < NS; s++) {
        for (int64_t i = 0; i < (int64_t)len[s] * row; i++) {
            K[i] = frand(1.5f);
            V[i] = frand(1.0f);
        }
        for (int p = 0; p < len[s]; p++)
            slot[p] = bt[s * max_blocks + p / bs] * bs + p % bs;
        assert_int_equal(dsq_cpu_kv_write(&kb.l, K, V, slot, len[s]), DSQ_OK);
    }

    const int M = c->n + 5;
    int32_t *rseq = malloc(sizeof(*rseq) * M), *rpos = malloc(sizeof(*rpos) * M);
    rseq[0] = 1, rpos[0] = len[1] - 1;
    for (int i = 0; i < c->n; i++)
        rseq[1 + i] = 0, rpos[1 + i] = c->off + i;
    rseq[c->n + 1] = 2, rpos[c->n + 1] = len[2] - 1;
    rseq[c->n + 2] = 3, rpos[c->n + 2] = 5;
    rseq[c->n + 3] = 3, rpos[c->n + 3] = 9;
    rseq[c->n + 4] = 3, rpos[c->n + 4] = 10;
    const size_t n_out = (size_t)M * qrow;
    float *q = malloc(sizeof(*q) * n_out), *out = malloc(sizeof(*out) * n_out);
    float *alone = malloc(sizeof(*alone) * n_out), *out_s = malloc(sizeof(*out_s) * n_out);
    float *alone_t = malloc(sizeof(*alone_t) * n_out);
    for (size_t i = 0; i < n_out; i++)
        q[i] = frand(1.0f);
    const float scale = 1.0f / sqrtf((float)D);

    /* FP64 reference on the held values (decoded once per position) */
    double *held = malloc(sizeof(*held) * 2 * (size_t)max_len * row);
    double *ref = malloc(sizeof(*ref) * n_out), *sc = malloc(sizeof(*sc) * max_len);
    for (int i = 0; i < M; i++) {
        const int s = rseq[i];
        if (i == 0 || rseq[i - 1] != s)
            for (int p = 0; p < len[s]; p++) {
                const int64_t t = (int64_t)bt[s * max_blocks + p / bs] * bs + p % bs;
                for (int j = 0; j < row; j++) {
                    held[(int64_t)p * row + j] = kv_get(&kb, 0, t, j / D, j % D);
                    held[((int64_t)max_len + p) * row + j] = kv_get(&kb, 1, t, j / D, j % D);
                }
            }
        for (int h = 0; h < n_heads; h++) {
            const int kh = h / G;
            const float *qh = q + (int64_t)i * qrow + h * D;
            double mx = -INFINITY, l = 0;
            for (int p = 0; p <= rpos[i]; p++) {
                const double *kp = held + (int64_t)p * row + kh * D;
                double a = 0;
                for (int d = 0; d < D; d++)
                    a += qh[d] * kp[d];
                sc[p] = a * scale;
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p <= rpos[i]; p++)
                l += (sc[p] = exp(sc[p] - mx));
            double *o = ref + (int64_t)i * qrow + h * D;
            for (int d = 0; d < D; d++)
                o[d] = 0;
            for (int p = 0; p <= rpos[i]; p++) {
                const double *vp = held + ((int64_t)max_len + p) * row + kh * D;
                for (int d = 0; d < D; d++)
                    o[d] += sc[p] * vp[d];
            }
            for (int d = 0; d < D; d++)
                o[d] /= l;
        }
    }

    const char *isa = dsq_cpu_isa();
    const int saved_thr = dsq_cpu_get_threads();
    const char *dts = c->dt == DSQ_KV_F16 ? "f16 " : c->dt == DSQ_KV_INT8 ? "int8" : "f32 ";
    for (int pi = 0; pi < 2; pi++) {
        const char *lvl = pi ? isa : "scalar";
        assert_int_equal(dsq_cpu_force_isa(lvl), DSQ_OK);
        assert_int_equal(dsq_cpu_set_threads(1), DSQ_OK);
        for (int i = 0; i < M; i++)
            assert_int_equal(dsq_cpu_attention(alone + (int64_t)i * qrow, q + (int64_t)i * qrow,
                                               1, n_heads, &kb.l, rseq + i, rpos + i, bt,
                                               max_blocks, scale), DSQ_OK);
        for (int thr = 1; thr <= 2; thr++) {
            assert_int_equal(dsq_cpu_set_threads(thr), DSQ_OK);
            for (int i = 0; i < M; i++)
                assert_int_equal(dsq_cpu_attention(alone_t + (int64_t)i * qrow,
                                                   q + (int64_t)i * qrow, 1, n_heads, &kb.l,
                                                   rseq + i, rpos + i, bt, max_blocks, scale),
                                 DSQ_OK);
            for (size_t e = 0; e < n_out; e++)
                out[e] = NAN;
            assert_int_equal(dsq_cpu_attention(out, q, M, n_heads, &kb.l, rseq, rpos, bt,
                                               max_blocks, scale), DSQ_OK);
            double err_ref = 0, dif_pf = 0, dif_dec = 0, dif_scalar = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < qrow; j++) {
                    const size_t e = (size_t)i * qrow + j;
                    err_ref = fmax(err_ref, fabs(out[e] - ref[e]));
                    if (pi == 0 && thr == 1)
                        out_s[e] = out[e];
                    dif_scalar = fmax(dif_scalar, fabs(out[e] - out_s[e]));
                    /* decode rows: the rows alone at this thread count;
                     * tiled rows: alone on one thread (both bitwise) */
                    const bool dec = i == 0 || i == c->n + 1 || (c->n == 1 && i == 1);
                    const float *want = dec ? alone_t : alone;
                    dif_dec = fmax(dif_dec, fabs(out[e] - alone[e]));
                    if (memcmp(&out[e], &want[e], sizeof(float)))
                        dif_pf = 1.0;
                }
            /* the chunk's sequence marked decoding: its rows as decode rows */
            uint8_t seq_dec[NS] = {1, 0, 0, 0};
            assert_int_equal(dsq_cpu_attention_ex(out, q, M, n_heads, &kb.l, rseq, rpos, bt,
                                                  max_blocks, scale, seq_dec), DSQ_OK);
            for (int i = 1; i <= c->n; i++)
                if (memcmp(out + (size_t)i * qrow, alone_t + (size_t)i * qrow,
                           sizeof(float) * (size_t)qrow))
                    dif_pf = 1.0;
            printf("# attn prefill %s bs=%-2d G=%d n_kv=%d D=%-3d off=%-3d n=%-3d %-6s thr=%d: "
                   "vs FP64 %.2e (tol 2e-5), vs rows alone: prefill %.1e (bitwise), "
                   "one walk %.1e (tol 1e-5), vs scalar %.2e (tol 1e-5)\n",
                   dts, bs, G, n_kv, D, c->off, c->n, lvl, thr, err_ref, dif_pf, dif_dec,
                   dif_scalar);
            assert_true(err_ref <= 2e-5);
            assert_true(dif_pf == 0.0);
            assert_true(dif_dec <= 1e-5);
            assert_true(dif_scalar <= 1e-5);
        }
    }
    assert_int_equal(dsq_cpu_force_isa(isa), DSQ_OK);
    assert_int_equal(dsq_cpu_set_threads(saved_thr), DSQ_OK);
    free(held); free(ref); free(sc);
    free(q); free(out); free(alone); free(alone_t); free(out_s); free(rseq); free(rpos);
    free(K); free(V); free(slot); free(bt); free(pool);
    kv_free(&kb);
}

static void test_attention_prefill(void **state)
{
    (void)state;
    const pcase_t cases[] = {
        {DSQ_KV_F16, 16, 3, 3, 64, 0, 300},     /* SmolLM2's shape, whole prompt */
        {DSQ_KV_F16, 16, 3, 3, 64, 200, 37},    /* a later chunk              */
        {DSQ_KV_F16, 5, 2, 4, 128, 77, 150},
        {DSQ_KV_F16, 16, 2, 8, 80, 250, 17},
        {DSQ_KV_F16, 16, 1, 3, 64, 9, 2},
        {DSQ_KV_INT8, 16, 1, 8, 128, 33, 64},
        {DSQ_KV_INT8, 7, 4, 1, 80, 0, 129},
        {DSQ_KV_INT8, 16, 3, 3, 64, 130, 300},
        {DSQ_KV_INT8, 16, 2, 3, 64, 40, 1},     /* one row: the decode path   */
        {DSQ_KV_F32, 16, 2, 3, 80, 100, 1},
        {DSQ_KV_F32, 3, 1, 1, 64, 5, 2},
        {DSQ_KV_F32, 16, 2, 4, 128, 1, 97},
        {DSQ_KV_F32, 16, 3, 1, 64, 63, 66},
        {DSQ_KV_F16, 16, 1, 5, 36, 70, 40},     /* head_dim tails, 4 + 1 heads */
        {DSQ_KV_F32, 4, 2, 6, 30, 0, 33},
        {DSQ_KV_INT8, 16, 1, 6, 30, 64, 65},
        {DSQ_KV_F16, 16, 2, 2, 16, 3, 130},     /* qwen2-tiny's shape, 3 tiles */
        {DSQ_KV_F16, 16, 8, 4, 128, 0, 70},     /* llama's 32/8 heads, D 128  */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_prefill_case(&cases[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_write_f16),
        cmocka_unit_test(test_kv_write_int8),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_attention_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

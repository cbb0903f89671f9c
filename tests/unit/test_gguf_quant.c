/* tests for the exact repacking of every GGUF block type dsq reads
 * (engine/model/quant.c dsq_quant_from_gguf) and the kernels on the layouts
 * they land in (kernels.h: INT4 with group 16 / SUPER scales / the IQ4
 * codebook, INT8G).
 *
 * Reference: tests/golden/gguf_quant_blocks.txt, random blocks of each type
 * dequantised by gguf-py (tests/ref/make_gguf_quant_blocks.py), no code
 * shared with dsq. Checks, per type:
 *   - dsq_weight_dequant_row equals gguf-py's float32 bit for bit;
 *   - dsq_quant_gguf_bytes (the planner's count) equals the layout's bytes;
 *   - dsq_cpu_matmul at every ISA level the CPU has (DSQ_CPU_ISA levels via
 *     dsq_cpu_force_isa) and both activation dtypes against y = W·x in FP64
 *     with W the golden weights. Bounds: fp32 summation 2*(k+nb)*u*sum|w||x|
 *     (Higham ch. 4) for both; the int8-activation path adds the rounding of
 *     x to int8 per 32-block, sum_b amax_b/254 * sum_{j in b} |w_j|;
 *   - row views (dsq_weight_rows) multiply like the rows of the whole;
 * and the errors: a type dsq does not read names the tensor and the type;
 * short data is refused. */
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
#include "engine/io/tensor.h"
#include "engine/model/quant.h"
#include "kernels.h"
#include "cpu/cpu_internal.h"

typedef struct golden {
    char name[16];
    int64_t n, k;
    uint8_t *bytes;
    size_t n_bytes;
    float *values;
} golden_t;

#define MAX_TYPES 16
static golden_t gold[MAX_TYPES];
static int n_gold;

static dsq_type_t type_of(const char *name)
{
    for (int t = 0; t < DSQ_TYPE_COUNT_; t++)
        if (strcmp(dsq_type_name((dsq_type_t)t), name) == 0)
            return (dsq_type_t)t;
    return DSQ_TYPE_COUNT_;
}

static int load_golden(void **state)
{
    (void)state;
    const char *root = getenv("DSQ_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/golden/gguf_quant_blocks.txt", root ? root : ".");
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    while (fgets(line, (int)cap, f)) {
        if (line[0] == '#')
            continue;
        if (strncmp(line, "type ", 5) == 0) {
            golden_t *g = &gold[n_gold++];
            long long n, k;
            if (sscanf(line, "type %15s n %lld k %lld", g->name, &n, &k) != 3)
                return -1;
            g->n = n;
            g->k = k;
        } else if (strncmp(line, "bytes ", 6) == 0) {
            golden_t *g = &gold[n_gold - 1];
            size_t len = strcspn(line + 6, "\n");
            g->n_bytes = len / 2;
            g->bytes = aligned_alloc(64, (g->n_bytes + 63) / 64 * 64);
            for (size_t i = 0; i < g->n_bytes; i++) {
                unsigned v;
                sscanf(line + 6 + 2 * i, "%2x", &v);
                g->bytes[i] = (uint8_t)v;
            }
        } else if (strncmp(line, "values ", 7) == 0) {
            golden_t *g = &gold[n_gold - 1];
            g->values = malloc((size_t)(g->n * g->k) * sizeof(float));
            const char *p = line + 7;
            for (int64_t i = 0; i < g->n * g->k; i++) {
                char *e;
                uint32_t u = (uint32_t)strtoul(p, &e, 16);
                memcpy(&g->values[i], &u, 4);
                p = e;
            }
        }
    }
    free(line);
    fclose(f);
    return n_gold == 12 ? 0 : -1;
}

static int free_golden(void **state)
{
    (void)state;
    for (int i = 0; i < n_gold; i++) {
        free(gold[i].bytes);
        free(gold[i].values);
    }
    return 0;
}

static dsq_tensor_t view_of(const golden_t *g)
{
    dsq_tensor_t t = {.name = g->name, .type = type_of(g->name), .n_dims = 2,
                      .ne = {g->k, g->n, 1, 1}, .data = g->bytes, .n_bytes = g->n_bytes};
    return t;
}

static void test_dequant_exact(void **state)
{
    (void)state;
    for (int i = 0; i < n_gold; i++) {
        const golden_t *g = &gold[i];
        dsq_tensor_t t = view_of(g);
        assert_true(t.type != DSQ_TYPE_COUNT_);
        assert_true(dsq_quant_gguf_readable(t.type));
        dsq_weight_t w;
        void *st = NULL;
        char err[256] = "";
        assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_OK);
        dsq_weight_bytes_t b;
        assert_int_equal(dsq_weight_layout(&w, &b), DSQ_OK);
        size_t planned = 0;
        assert_int_equal(dsq_quant_gguf_bytes(t.type, g->n, g->k, &planned), DSQ_OK);
        assert_int_equal(planned, b.total);
        float *row = malloc((size_t)g->k * sizeof(float));
        int64_t bad = 0;
        for (int64_t r = 0; r < g->n; r++) {
            assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
            for (int64_t j = 0; j < g->k; j++) {
                uint32_t a, e;
                memcpy(&a, &row[j], 4);
                memcpy(&e, &g->values[r * g->k + j], 4);
                if (a != e && bad++ < 4)
                    fprintf(stderr, "%s row %lld col %lld: dsq %.9g, gguf-py %.9g\n", g->name,
                            (long long)r, (long long)j, row[j], g->values[r * g->k + j]);
            }
        }
        if (bad)
            fprintf(stderr, "%s: %lld weights differ\n", g->name, (long long)bad);
        assert_int_equal(bad, 0);
        free(row);
        free(st);
    }
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rndf(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

/* max over outputs of |y - ref| / bound (must be <= 1) for one weight */
static double check_matmul(const dsq_weight_t *w, const float *wv, int64_t m,
                           dsq_act_dtype_t act)
{
    const int64_t n = w->n, k = w->k, nb = (k + 31) / 32;
    float *x = malloc((size_t)(m * k) * 4), *y = malloc((size_t)(m * n) * 4);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = rndf() * (i % 13 == 0 ? 3.0f : 1.0f);
    dsq_weight_t wa = *w;
    wa.act = act;
    assert_int_equal(dsq_cpu_matmul(y, x, m, &wa), DSQ_OK);
    const double u = ldexp(1.0, -24);
    double worst = 0.0;
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * k;
        for (int64_t c = 0; c < n; c++) {
            const float *wr = wv + c * k;
            double ref = 0.0, mag = 0.0, qerr = 0.0;
            for (int64_t b = 0; b < nb; b++) {
                double amax = 0.0, wsum = 0.0;
                for (int64_t j = b * 32; j < (b + 1) * 32 && j < k; j++) {
                    ref += (double)wr[j] * xr[j];
                    mag += fabs((double)wr[j] * xr[j]);
                    amax = fmax(amax, fabs(xr[j]));
                    wsum += fabs(wr[j]);
                }
                qerr += amax / 254.0 * wsum;
            }
            /* the scale/zero-point split (s*dot + c*sum) sums terms up to
             * twice |w||x|: count it in the magnitude */
            double bound = 2.0 * (double)(k + nb) * u * 3.0 * mag + 1e-30;
            if (act == DSQ_ACT_INT8)
                bound += qerr * (1.0 + 1e-6) + 2.0 * (double)(k + nb) * u * 3.0 * qerr;
            double e = fabs((double)y[r * n + c] - ref) / bound;
            worst = fmax(worst, e);
        }
    }
    free(x);
    free(y);
    return worst;
}

static const char *isas[] = {"scalar", "avx2", "avx512", "neon", "neon_dotprod"};

static void test_matmul_every_isa(void **state)
{
    (void)state;
    const char *best = dsq_cpu_isa();
    const int64_t ms[] = {1, 3, 8, 17, 70};
    int levels = 0;
    for (size_t li = 0; li < sizeof(isas) / sizeof(isas[0]); li++) {
        if (dsq_cpu_force_isa(isas[li]) != DSQ_OK)
            continue;
        levels++;
        for (int i = 0; i < n_gold; i++) {
            const golden_t *g = &gold[i];
            dsq_tensor_t t = view_of(g);
            dsq_weight_t w;
            void *st = NULL;
            char err[256];
            assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_OK);
            for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
                for (int a = 0; a < 2; a++) {
                    double e = check_matmul(&w, g->values, ms[mi], a ? DSQ_ACT_F32
                                                                     : DSQ_ACT_INT8);
                    if (e > 1.0)
                        fprintf(stderr, "%s isa %s m %lld act %s: error %.3g x bound\n",
                                g->name, isas[li], (long long)ms[mi], a ? "fp32" : "int8",
                                e);
                    assert_true(e <= 1.0);
                }
            free(st);
        }
    }
    assert_int_equal(dsq_cpu_force_isa(best), DSQ_OK);
    assert_true(levels >= 1);
    fprintf(stderr, "gguf_quant: matmul checked on %d ISA levels\n", levels);
}

/* The interleaved CPU layouts of the GGUF types that have one: Q4_K in
 * INT4_X8, Q6_K in INT6_X8, Q5_0 / Q5_1 / Q5_K in INT5_X8, Q2_K in
 * INT2_X8 and Q3_K in INT3_X8 (dsq_weight_pack_x8; every k-quant in
 * exactly the file's bytes, its sub-scales in the file's bits); IQ4_XS has none (signed sub-scales, a codebook:
 * it stays on the row kernels, its row-major layout the file's bytes too). Random blocks
 * of 40 rows (5 tiles), their fp16 fields set to finite scales. Every row dequantises to the
 * bits of the row-major weight (whose values the golden test ties to
 * gguf-py); every ISA level's product equals the scalar kernel's bit for
 * bit (INT4_X8: the row-major one's, whose operations it repeats; the
 * others: their own scalar kernel's); each is within the FP64 bound
 * of the dequantised W. */
static void test_interleaved_x8(void **state)
{
    (void)state;
    static const struct { const char *name; int f16[2]; int n_f16; } types[] = {
        {"Q4_K", {0, 2}, 2}, {"IQ4_XS", {0, 0}, 1}, {"Q6_K", {208, 0}, 1},
        {"Q5_0", {0, 0}, 1}, {"Q5_1", {0, 2}, 2},   {"Q5_K", {0, 2}, 2},
        {"Q2_K", {80, 82}, 2}, {"Q3_K", {108, 0}, 1},
    };
    const char *best = dsq_cpu_isa();
    /* 5 tiles of 8 rows: decode (m = 1) walks 4 of them at once on
     * AVX-512, then a last odd one; m = 4 two pairs; m = 7 rows 4 + 3;
     * m = 10 the 8-row kernel of INT4_X8 / INT5_X8, then 2; from m = 16
     * on the panel path of every type here but IQ4_XS (two strips of 16
     * rows, the fifth tile on the row kernels; k = 768 / 1024 two weight
     * blocks, the last one short / full; m = 37, 40 a pair of activation
     * blocks and a single one, the last one partial; a last activation
     * block of <= 8 rows goes to the row kernels (m = 19, 22, 37, 40: after
     * whole blocks; m = 262: a second 256-row tile of 6 rows, alone); m =
     * 300 two tiles of 256 rows). m = 1, 4, ..., 40, then 262 and 300. */
    const int64_t n = 40, ks[3] = {256, 768, 1024}, m = 300;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (int ki = 0; ki < 3; ki++) {
            const int64_t k = ks[ki];
            const dsq_type_t ty = type_of(types[ti].name);
            /* packed into a copy of fewer bits (INT6_X8, INT5_X8, Q4_K's
             * sub-scales in INT4_X8) */
            const bool six = ty == DSQ_TYPE_Q6_K;
            const bool five = ty == DSQ_TYPE_Q5_0 || ty == DSQ_TYPE_Q5_1 || ty == DSQ_TYPE_Q5_K;
            const bool low = ty == DSQ_TYPE_Q2_K || ty == DSQ_TYPE_Q3_K;
            const size_t bb = dsq_type_block_bytes(ty),
                         nblk = (size_t)(n * k / dsq_type_block_elems(ty));
            uint8_t *bytes = aligned_alloc(64, (nblk * bb + 63) / 64 * 64);
            for (size_t i = 0; i < nblk * bb; i++)
                bytes[i] = (uint8_t)((rndf() + 1.0f) * 127.99f);
            for (size_t b = 0; b < nblk; b++)
                for (int f = 0; f < types[ti].n_f16; f++) {
                    /* 2^-10 .. 2^-4 with a random significand */
                    const uint16_t h = (uint16_t)((5 + (b + (size_t)f) % 7) << 10 |
                                                  (bytes[b * bb + 4] * 4 + f) % 1024);
                    memcpy(bytes + b * bb + types[ti].f16[f], &h, 2);
                }
            dsq_tensor_t t = {.name = types[ti].name, .type = ty, .n_dims = 2,
                              .ne = {k, n, 1, 1}, .data = bytes, .n_bytes = nblk * bb};
            dsq_weight_t w, rm;
            void *st = NULL, *st6 = NULL;
            char err[256];
            assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_OK);
            assert_int_equal(w.scale_mode, ty == DSQ_TYPE_Q5_0 || ty == DSQ_TYPE_Q5_1
                                               ? DSQ_SCALE_F16 : DSQ_SCALE_SUPER);
            rm = w;
            dsq_weight_bytes_t before, after;
            assert_int_equal(dsq_weight_layout(&w, &before), DSQ_OK);
            float *native = malloc((size_t)(n * k) * sizeof(float));
            for (int64_t r = 0; r < n; r++)
                assert_int_equal(dsq_weight_dequant_row(&w, r, native + r * k), DSQ_OK);
            float *x = malloc((size_t)(m * k) * sizeof(float));
            float *yref = malloc((size_t)(m * n) * sizeof(float));
            float *y = malloc((size_t)(m * n) * sizeof(float));
            for (int64_t i = 0; i < m * k; i++)
                x[i] = rndf();
            assert_int_equal(dsq_cpu_force_isa("scalar"), DSQ_OK);
            if (ty == DSQ_TYPE_IQ4_XS) {
                /* resident as in the file: 6-bit sub-scales, d alone */
                assert_int_equal(before.total, nblk * bb);
                assert_int_equal(before.scales, nblk * 6);
                /* no X8 twin: both ways refuse and leave it as it was */
                dsq_weight_t w2 = w, tw;
                void *st2 = (void *)1;
                assert_int_equal(dsq_weight_x8_twin(&w, &tw), DSQ_EINVAL);
                assert_int_equal(dsq_weight_interleave_x8(&w2), DSQ_EINVAL);
                assert_int_equal(dsq_weight_pack_x8(&rm, &w2, &st2), DSQ_EINVAL);
                assert_ptr_equal(st2, (void *)1);
                assert_memory_equal(&w2, &w, sizeof(w));
                free(native);
                free(x);
                free(yref);
                free(y);
                free(st);
                free(bytes);
                continue;
            }
            if (five) {
                assert_int_equal(dsq_weight_pack_x8(&rm, &w, &st6), DSQ_OK);
                assert_int_equal(w.format, DSQ_WFMT_INT5_X8);
                assert_int_equal(dsq_weight_layout(&w, &after), DSQ_OK);
                /* 5 bits a weight, where INT8G spends 8; Q5_K's sub-scales
                 * in 6 bits: the file's own size */
                assert_int_equal(after.data, (size_t)(n * k) * 5 / 8);
                if (ty == DSQ_TYPE_Q5_K)
                    assert_int_equal(after.total, nblk * bb);
                else
                    assert_int_equal(after.total, before.total - (size_t)(n * k) * 3 / 8);
                assert_int_equal(dsq_cpu_matmul(yref, x, m, &w), DSQ_OK);
            } else if (low) {
                /* 2 or 3 bits a weight where INT4 spends 4, the sub-scales
                 * in the file's bits: Q2_K's and Q3_K's own sizes */
                const bool q3 = ty == DSQ_TYPE_Q3_K;
                assert_int_equal(dsq_weight_pack_x8(&rm, &w, &st6), DSQ_OK);
                assert_int_equal(w.format, q3 ? DSQ_WFMT_INT3_X8 : DSQ_WFMT_INT2_X8);
                assert_int_equal(dsq_weight_layout(&w, &after), DSQ_OK);
                assert_int_equal(after.data, (size_t)(n * k) * (q3 ? 3 : 2) / 8);
                assert_int_equal(after.total, nblk * bb);
                assert_int_equal(dsq_cpu_matmul(yref, x, m, &w), DSQ_OK);
            } else if (six) {
                assert_int_equal(dsq_weight_pack_x8(&rm, &w, &st6), DSQ_OK);
                assert_int_equal(w.format, DSQ_WFMT_INT6_X8);
                assert_int_equal(dsq_weight_layout(&w, &after), DSQ_OK);
                /* 6 bits a weight, where INT8G spends 8, and d alone per
                 * super-block: Q6_K's own size */
                assert_int_equal(after.data, (size_t)(n * k) * 6 / 8);
                assert_int_equal(after.total, nblk * bb);
                assert_int_equal(dsq_cpu_matmul(yref, x, m, &w), DSQ_OK);
            } else {
                assert_int_equal(dsq_cpu_matmul(yref, x, m, &w), DSQ_OK);
                dsq_weight_t w2 = w;
                assert_int_equal(dsq_weight_interleave_x8(&w2), DSQ_EINVAL);
                assert_int_equal(dsq_weight_pack_x8(&rm, &w, &st6), DSQ_OK);
                assert_int_equal(w.format, DSQ_WFMT_INT4_X8);
                assert_int_equal(dsq_weight_layout(&w, &after), DSQ_OK);
                /* Q4_K's 144 bytes per 256 weights, 4 fewer than the
                 * row-major int8 sub-scales */
                assert_int_equal(after.total, nblk * bb);
                assert_int_equal(after.total, before.total - (size_t)(n * k) / 64);
            }
            float *row = malloc((size_t)k * sizeof(float));
            for (int64_t r = 0; r < n; r++) {
                assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
                assert_memory_equal(row, native + r * k, (size_t)k * sizeof(float));
            }
            for (size_t li = 0; li < sizeof(isas) / sizeof(isas[0]); li++) {
                if (dsq_cpu_force_isa(isas[li]) != DSQ_OK)
                    continue;
                for (int64_t mm = 1; mm <= m; mm = mm < 40 ? mm + 3 : mm < 262 ? 262 : m + (mm == m)) {
                    memset(y, 0xff, (size_t)(mm * n) * sizeof(float));
                    assert_int_equal(dsq_cpu_matmul(y, x, mm, &w), DSQ_OK);
                    for (int64_t e = 0; e < mm * n; e++)
                        if (memcmp(&y[e], &yref[e], sizeof(float)) != 0)
                            fail_msg("%s x8 k %lld isa %s m %lld: y[%lld] = %.9g, the "
                                     "scalar kernel's %.9g", types[ti].name, (long long)k,
                                     isas[li], (long long)mm, (long long)e, y[e], yref[e]);
                }
                for (int a = 0; a < 2; a++)
                    assert_true(check_matmul(&w, native, 5, a ? DSQ_ACT_F32 : DSQ_ACT_INT8)
                                <= 1.0);
            }
            assert_int_equal(dsq_cpu_force_isa(best), DSQ_OK);
            /* where the CPU has AVX-512 + VNNI, m >= 16 above was the panel
             * path's (dsq_cpu_matmul's own test of it) */
            if (dsq_cpu_force_isa("avx512") == DSQ_OK) {
                assert_true(dsq__mm_avx512_panel(&w, 16));
                assert_false(dsq__mm_avx512_panel(&w, 15));
                assert_int_equal(dsq_cpu_force_isa(best), DSQ_OK);
            }
            /* tiles only: a row view must start and end on one */
            dsq_weight_t v;
            assert_int_equal(dsq_weight_rows(&w, 8, 16, &v), DSQ_OK);
            assert_int_equal(dsq_weight_dequant_row(&v, 3, row), DSQ_OK);
            assert_memory_equal(row, native + 11 * k, (size_t)k * sizeof(float));
            assert_int_equal(dsq_weight_rows(&w, 4, 8, &v), DSQ_EINVAL);
            if (ty == DSQ_TYPE_Q4_K || ty == DSQ_TYPE_Q5_K) {
                /* a sub-scale or min beyond 6 bits cannot be packed */
                for (int z = 0; z < 2; z++) {
                    int8_t *a = (int8_t *)(z ? rm.sub_zeros : rm.sub_scales);
                    const int8_t keep = a[9 * (k / 32) + 2];
                    a[9 * (k / 32) + 2] = z ? -1 : 64;
                    dsq_weight_t w2 = w;
                    void *st2 = (void *)1;
                    assert_int_equal(dsq_weight_pack_x8(&rm, &w2, &st2), DSQ_EINVAL);
                    assert_ptr_equal(st2, (void *)1);
                    assert_memory_equal(&w2, &w, sizeof(w));
                    a[9 * (k / 32) + 2] = keep;
                }
            }
            if (low) {
                /* a q beyond 2 (Q2_K) or 3 bits (Q3_K), a sub-scale beyond
                 * 4 / 6 bits, or a Q3_K zero other than 4 cannot be packed:
                 * nothing changes */
                const bool q3 = ty == DSQ_TYPE_Q3_K;
                uint8_t *q4 = (uint8_t *)rm.data;
                int8_t *sa = (int8_t *)rm.sub_scales, *sz = (int8_t *)rm.sub_zeros;
                const int64_t qi = 5 * k / 2 + 3, gi = 9 * (k / 16) + 2;
                for (int z = 0; z < 3; z++) {
                    const uint8_t kq = q4[qi];
                    const int8_t ka = sa[gi], kz = sz[gi];
                    if (z == 0)
                        q4[qi] = (uint8_t)((kq & 0xF0) | (q3 ? 8 : 4));
                    else if (z == 1)
                        sa[gi] = q3 ? 32 : 16;
                    else
                        sz[gi] = q3 ? 3 : 16;
                    dsq_weight_t w2 = w;
                    void *st2 = (void *)1;
                    assert_int_equal(dsq_weight_pack_x8(&rm, &w2, &st2), DSQ_EINVAL);
                    assert_ptr_equal(st2, (void *)1);
                    assert_memory_equal(&w2, &w, sizeof(w));
                    q4[qi] = kq;
                    sa[gi] = ka;
                    sz[gi] = kz;
                }
            }
            if (six) {
                /* a q outside Q6_K's range cannot be packed: nothing changes */
                int8_t *q8 = (int8_t *)rm.data;
                q8[5 * k + 3] = 32;
                dsq_weight_t w2 = w;
                void *st2 = (void *)1;
                assert_int_equal(dsq_weight_pack_x8(&rm, &w2, &st2), DSQ_EINVAL);
                assert_ptr_equal(st2, (void *)1);
                assert_memory_equal(&w2, &w, sizeof(w));
                rm.n = 20;                                    /* n % 8 */
                assert_int_equal(dsq_weight_pack_x8(&rm, &w2, &st2), DSQ_EINVAL);
            }
            free(row);
            free(x);
            free(yref);
            free(y);
            free(native);
            free(st);
            free(st6);
            free(bytes);
        }
}

static void test_row_views(void **state)
{
    (void)state;
    for (int i = 0; i < n_gold; i++) {
        const golden_t *g = &gold[i];
        dsq_tensor_t t = view_of(g);
        dsq_weight_t w, v;
        void *st = NULL;
        char err[256];
        assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_OK);
        assert_int_equal(dsq_weight_rows(&w, 1, 1, &v), DSQ_OK);
        assert_int_equal(v.n, 1);
        float *row = malloc((size_t)g->k * sizeof(float));
        assert_int_equal(dsq_weight_dequant_row(&v, 0, row), DSQ_OK);
        assert_memory_equal(row, g->values + g->k, (size_t)g->k * sizeof(float));
        assert_int_equal(dsq_weight_rows(&w, 1, 2, &v), DSQ_EINVAL);
        assert_int_equal(dsq_weight_rows(&w, -1, 1, &v), DSQ_EINVAL);
        free(row);
        free(st);
    }
}

static void test_errors(void **state)
{
    (void)state;
    static uint8_t buf[4096];
    const dsq_type_t refused[] = {DSQ_TYPE_IQ2_XXS, DSQ_TYPE_IQ2_XS, DSQ_TYPE_IQ3_XXS,
                                  DSQ_TYPE_IQ1_S, DSQ_TYPE_IQ3_S, DSQ_TYPE_IQ2_S,
                                  DSQ_TYPE_IQ1_M, DSQ_TYPE_TQ1_0, DSQ_TYPE_TQ2_0,
                                  DSQ_TYPE_Q8_1, DSQ_TYPE_Q8_K};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        dsq_tensor_t t = {.name = "blk.3.ffn_down.weight", .type = refused[i], .n_dims = 2,
                          .ne = {256, 1, 1, 1}, .data = buf, .n_bytes = sizeof(buf)};
        dsq_weight_t w;
        void *st = (void *)1;
        char err[256] = "";
        assert_false(dsq_quant_gguf_readable(refused[i]));
        assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)),
                         DSQ_EUNSUPPORTED);
        assert_null(st);
        assert_non_null(strstr(err, "blk.3.ffn_down.weight"));
        assert_non_null(strstr(err, dsq_type_name(refused[i])));
        size_t bytes = 1;
        assert_int_equal(dsq_quant_gguf_bytes(refused[i], 1, 256, &bytes), DSQ_EUNSUPPORTED);
    }
    for (int i = 0; i < n_gold; i++) {
        dsq_tensor_t t = view_of(&gold[i]);
        t.n_bytes -= 1;                        /* one byte short */
        dsq_weight_t w;
        void *st = NULL;
        char err[256];
        assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_EINVAL);
        assert_null(st);
        t = view_of(&gold[i]);
        t.ne[0] = 16;                          /* not whole blocks */
        t.ne[1] = 1;
        assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_EINVAL);
    }
}

/* A block whose fp16 scale (d, or Q4_1/Q5_1's m) is inf or NaN makes the
 * repack fail with DSQ_EFORMAT naming the tensor and the block, freeing
 * what it allocated; Q8_0 (a zero-copy view) is not scanned. */
static void test_nonfinite_scale(void **state)
{
    (void)state;
    static const struct { const char *name; int off; } f16[] = {
        {"Q4_0", 0}, {"Q4_1", 2}, {"Q5_0", 0}, {"Q5_1", 2}, {"Q2_K", 80}, {"Q3_K", 108},
        {"Q4_K", 0}, {"Q5_K", 2}, {"Q6_K", 208}, {"IQ4_NL", 0}, {"IQ4_XS", 0},
    };
    for (size_t i = 0; i < sizeof(f16) / sizeof(f16[0]); i++) {
        const golden_t *g = NULL;
        for (int j = 0; j < n_gold; j++)
            if (!strcmp(gold[j].name, f16[i].name))
                g = &gold[j];
        assert_non_null(g);
        const dsq_type_t ty = type_of(g->name);
        const size_t bb = dsq_type_block_bytes(ty);
        for (int v = 0; v < 2; v++) {
            uint8_t *copy = malloc(g->n_bytes);
            memcpy(copy, g->bytes, g->n_bytes);
            const uint16_t bad = v ? 0x7E00 : 0xFC00;       /* NaN, -inf */
            memcpy(copy + 3 * bb + (size_t)f16[i].off, &bad, 2);
            dsq_tensor_t t = view_of(g);
            t.data = copy;
            dsq_weight_t w;
            void *st = (void *)1;
            char err[256] = "";
            assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_EFORMAT);
            assert_null(st);
            assert_non_null(strstr(err, g->name));
            assert_non_null(strstr(err, "block 3 "));
            assert_non_null(strstr(err, "non-finite"));
            free(copy);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_exact),
        cmocka_unit_test(test_matmul_every_isa),
        cmocka_unit_test(test_row_views),
        cmocka_unit_test(test_interleaved_x8),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_nonfinite_scale),
    };
    return cmocka_run_group_tests(tests, load_golden, free_golden);
}

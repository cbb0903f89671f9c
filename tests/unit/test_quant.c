/* tests for engine/model/quant.c: every repack, dequantised row by row, must equal
 * the source format's own dequantisation formula computed here from the raw
 * bytes (exact equality; Q4_K within its documented fp16 rounding), on real
 * SmolLM2 tensors (Q4_1 weights, Q8_0 token_embd) and on synthetic
 * AWQ / GPTQ / Q4_0 / Q4_K tensors packed here from the published rules.
 * RTN and INT8: every element within s/2 of the source. */
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
#include "engine/io/gguf.h"
#include "kernels.h"
#include "engine/model/quant.h"
#include "engine/io/tensor.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)rnd() / 2147483648.0f; }
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static dsq_gguf_t *open_model(void)
{
    const char *dir = getenv("DSQ_MODELS_DIR");
    char path[1024], err[256] = "";
    snprintf(path, sizeof(path), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : "models");
    dsq_gguf_t *g = dsq_gguf_open(path, err, sizeof(err));
    if (!g)
        fail_msg("missing test model %s: %s", path, err);
    return g;
}

/* Q4_1 tensors of the real model: repack == q*d + m for every element. */
static void test_gguf_q4_1_real(void **state)
{
    (void)state;
    dsq_gguf_t *g = open_model();
    int n_checked = 0;
    for (int i = 0; i < dsq_gguf_n_tensors(g) && n_checked < 6; i++) {
        const dsq_tensor_t *t = dsq_gguf_tensor(g, i);
        if (t->type != DSQ_TYPE_Q4_1)
            continue;
        dsq_weight_t w;
        void *st = NULL;
        char err[256];
        assert_int_equal(dsq_quant_from_gguf(t, &w, &st, err, sizeof(err)), DSQ_OK);
        assert_int_equal(w.format, DSQ_WFMT_INT4);
        assert_int_equal(w.zp_mode, DSQ_ZP_MIN);
        assert_int_equal(w.k, t->ne[0]);
        assert_int_equal(w.n, t->ne[1]);
        float *row = malloc((size_t)w.k * sizeof(float));
        const uint8_t *src = t->data;
        for (int64_t r = 0; r < w.n; r++) {
            assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
            for (int64_t j = 0; j < w.k; j++) {
                const uint8_t *b = src + (size_t)(r * (w.k / 32) + j / 32) * 20;
                float d = dsq_fp16_to_fp32(rd16(b)), m = dsq_fp16_to_fp32(rd16(b + 2));
                int e = (int)(j % 32);
                int q = e < 16 ? (b[4 + e] & 15) : (b[4 + e - 16] >> 4);
                float ref = (float)q * d + m;
                if (row[j] != ref)
                    fail_msg("%s row %lld col %lld: %g != %g", t->name, (long long)r,
                             (long long)j, row[j], ref);
            }
        }
        free(row);
        free(st);
        n_checked++;
    }
    assert_true(n_checked > 0);
    dsq_gguf_close(g);
}

/* Q8_0 token_embd: zero-copy view, dequant == q*d. */
static void test_gguf_q8_0_real(void **state)
{
    (void)state;
    dsq_gguf_t *g = open_model();
    const dsq_tensor_t *t = dsq_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, DSQ_TYPE_Q8_0);
    dsq_weight_t w;
    void *st = (void *)1;
    char err[256];
    assert_int_equal(dsq_quant_from_gguf(t, &w, &st, err, sizeof(err)), DSQ_OK);
    assert_null(st);
    assert_ptr_equal(w.data, t->data);
    assert_int_equal(w.format, DSQ_WFMT_Q8_0);
    float *row = malloc((size_t)w.k * sizeof(float));
    for (int64_t r = 0; r < w.n; r += 97) {
        assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
        for (int64_t j = 0; j < w.k; j++) {
            const uint8_t *b = (const uint8_t *)t->data + (size_t)(r * (w.k / 32) + j / 32) * 34;
            float ref = (float)(int8_t)b[2 + j % 32] * dsq_fp16_to_fp32(rd16(b));
            assert_true(row[j] == ref);
        }
    }
    free(row);
    dsq_gguf_close(g);
}

/* Synthetic Q4_0: (q - 8) * d, exact. */
static void test_gguf_q4_0_synth(void **state)
{
    (void)state;
    const int64_t n = 5, k = 96;
    uint8_t *buf = malloc((size_t)(n * k / 32 * 18));
    for (int64_t i = 0; i < n * k / 32 * 18; i++)
        buf[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < n * k / 32; b++) {
        uint16_t h = dsq_fp32_to_fp16(rndf(-0.1f, 0.1f));
        buf[b * 18] = (uint8_t)h;
        buf[b * 18 + 1] = (uint8_t)(h >> 8);
    }
    dsq_tensor_t t = {.name = "q40", .type = DSQ_TYPE_Q4_0, .n_dims = 2,
                      .ne = {k, n, 1, 1}, .data = buf, .n_bytes = (size_t)(n * k / 32 * 18)};
    dsq_weight_t w;
    void *st;
    char err[256];
    assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_OK);
    assert_int_equal(w.zp_mode, DSQ_ZP_SYM);
    float row[96];
    for (int64_t r = 0; r < n; r++) {
        assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
        for (int64_t j = 0; j < k; j++) {
            const uint8_t *b = buf + (r * k / 32 + j / 32) * 18;
            int e = (int)(j % 32);
            int q = e < 16 ? (b[2 + e] & 15) : (b[2 + e - 16] >> 4);
            assert_true(row[j] == (float)(q - 8) * dsq_fp16_to_fp32(rd16(b)));
        }
    }
    free(st);
    free(buf);
}

/* Synthetic Q4_K from known 6-bit scales/mins and nibbles: the repack is
 * within one fp16 rounding of d*sc and dmin*m (the documented inexact case). */
static void test_gguf_q4_k_synth(void **state)
{
    (void)state;
    const int64_t n = 3, k = 512, nsb = n * k / 256;
    uint8_t *buf = calloc((size_t)nsb, 144);
    int *qv = malloc((size_t)(n * k) * sizeof(int));
    unsigned scv[6][8], mv[6][8];
    float dv[6], dminv[6];
    for (int64_t s = 0; s < nsb; s++) {
        uint8_t *b = buf + s * 144;
        uint16_t dh = dsq_fp32_to_fp16(rndf(0.001f, 0.01f));
        uint16_t mh = dsq_fp32_to_fp16(rndf(0.001f, 0.01f));
        dv[s] = dsq_fp16_to_fp32(dh);
        dminv[s] = dsq_fp16_to_fp32(mh);
        b[0] = (uint8_t)dh; b[1] = (uint8_t)(dh >> 8);
        b[2] = (uint8_t)mh; b[3] = (uint8_t)(mh >> 8);
        for (int j = 0; j < 8; j++) {
            scv[s][j] = rnd() % 64;
            mv[s][j] = rnd() % 64;
        }
        uint8_t *q = b + 4;
        for (int j = 0; j < 4; j++) {
            q[j] = (uint8_t)(scv[s][j] | ((scv[s][j + 4] >> 4) << 6));
            q[j + 4] = (uint8_t)(mv[s][j] | ((mv[s][j + 4] >> 4) << 6));
            q[j + 8] = (uint8_t)((scv[s][j + 4] & 15) | ((mv[s][j + 4] & 15) << 4));
        }
        for (int e = 0; e < 256; e++) {
            int v = (int)(rnd() % 16);
            qv[s * 256 + e] = v;
            int sub = e / 32, i = e % 32;
            uint8_t *qs = b + 16 + 32 * (sub / 2) + i;
            *qs |= (uint8_t)(sub % 2 ? v << 4 : v);
        }
    }
    dsq_tensor_t t = {.name = "q4k", .type = DSQ_TYPE_Q4_K, .n_dims = 2,
                      .ne = {k, n, 1, 1}, .data = buf, .n_bytes = (size_t)nsb * 144};
    dsq_weight_t w;
    void *st;
    char err[256];
    assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_OK);
    float row[512];
    for (int64_t r = 0; r < n; r++) {
        assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
        for (int64_t j = 0; j < k; j++) {
            int64_t s = (r * k + j) / 256;
            int sub = (int)(j % 256) / 32;
            double a = (double)dv[s] * scv[s][sub], mm = (double)dminv[s] * mv[s][sub];
            double ref = a * qv[r * k + j] - mm;
            double tol = (fabs(a) * qv[r * k + j] + mm) * (1.0 / 1024.0) + 1e-7;
            if (fabs(row[j] - ref) > tol)
                fail_msg("q4k r%lld j%lld: %g vs %g", (long long)r, (long long)j, row[j], ref);
        }
    }
    free(st);
    free(qv);
    free(buf);
}

/* AWQ: pack a known integer matrix with AWQ_ORDER and check the unpack. */
static void test_awq(void **state)
{
    (void)state;
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    const int gsz[3] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++) {
        const int gs = gsz[gi];
        const int64_t k = 256, n = 24, G = k / gs;
        uint8_t *q = malloc((size_t)(k * n)), *z = malloc((size_t)(G * n));
        uint16_t *s = malloc((size_t)(G * n) * 2);
        int32_t *qw = calloc((size_t)(k * n / 8), 4), *qz = calloc((size_t)(G * n / 8), 4);
        for (int64_t i = 0; i < k * n; i++) q[i] = (uint8_t)(rnd() % 16);
        for (int64_t i = 0; i < G * n; i++) {
            z[i] = (uint8_t)(rnd() % 16);
            s[i] = dsq_fp32_to_fp16(rndf(0.001f, 0.05f));
        }
        for (int64_t r = 0; r < k; r++)
            for (int64_t j = 0; j < n / 8; j++) {
                uint32_t v = 0;
                for (int i = 0; i < 8; i++)
                    v |= (uint32_t)q[r * n + 8 * j + order[i]] << (4 * i);
                qw[r * (n / 8) + j] = (int32_t)v;
            }
        for (int64_t g = 0; g < G; g++)
            for (int64_t j = 0; j < n / 8; j++) {
                uint32_t v = 0;
                for (int i = 0; i < 8; i++)
                    v |= (uint32_t)z[g * n + 8 * j + order[i]] << (4 * i);
                qz[g * (n / 8) + j] = (int32_t)v;
            }
        dsq_weight_t w;
        void *st;
        char err[256];
        assert_int_equal(dsq_quant_from_awq(qw, qz, s, k, n, gs, &w, &st, err, sizeof(err)), DSQ_OK);
        assert_int_equal(w.n, n);
        assert_int_equal(w.k, k);
        float row[256];
        for (int64_t c = 0; c < n; c++) {
            assert_int_equal(dsq_weight_dequant_row(&w, c, row), DSQ_OK);
            for (int64_t r = 0; r < k; r++) {
                int64_t g = r / gs;
                float ref = ((float)q[r * n + c] - (float)z[g * n + c]) *
                            dsq_fp16_to_fp32(s[g * n + c]);
                assert_true(row[r] == ref);
            }
        }
        free(st); free(q); free(z); free(s); free(qw); free(qz);
    }
}

/* GPTQ (v1 zeros offset), desc_act false and true (shuffled g_idx). */
static void run_gptq(int gs, int act_order)
{
    const int64_t k = 384, n = 16, G = k / gs;
    uint8_t *q = malloc((size_t)(k * n)), *z = malloc((size_t)(G * n));
    uint16_t *s = malloc((size_t)(G * n) * 2);
    int32_t *qw = calloc((size_t)(k / 8 * n), 4), *qz = calloc((size_t)(G * n / 8), 4);
    int32_t *gidx = malloc((size_t)k * 4), *pi = malloc((size_t)k * 4);
    for (int64_t i = 0; i < k; i++) pi[i] = (int32_t)i;
    if (act_order)
        for (int64_t i = k - 1; i > 0; i--) {
            int64_t j = rnd() % (uint32_t)(i + 1);
            int32_t t = pi[i]; pi[i] = pi[j]; pi[j] = t;
        }
    for (int64_t i = 0; i < k; i++) gidx[pi[i]] = (int32_t)(i / gs);
    for (int64_t i = 0; i < k * n; i++) q[i] = (uint8_t)(rnd() % 16);
    for (int64_t i = 0; i < G * n; i++) {
        z[i] = (uint8_t)(1 + rnd() % 15);     /* stored z-1 in 0..14 */
        s[i] = dsq_fp32_to_fp16(rndf(0.001f, 0.05f));
    }
    for (int64_t r = 0; r < k; r++)
        for (int64_t c = 0; c < n; c++)
            qw[(r / 8) * n + c] |= (int32_t)((uint32_t)q[r * n + c] << (4 * (r % 8)));
    for (int64_t g = 0; g < G; g++)
        for (int64_t c = 0; c < n; c++)
            qz[g * (n / 8) + c / 8] |= (int32_t)((uint32_t)(z[g * n + c] - 1) << (4 * (c % 8)));
    dsq_weight_t w;
    void *st;
    int32_t *perm = NULL;
    char err[256];
    assert_int_equal(dsq_quant_from_gptq(qw, qz, s, gidx, k, n, gs, &w, &st, &perm,
                                         err, sizeof(err)), DSQ_OK);
    if (!act_order)
        assert_null(perm);
    else
        assert_non_null(perm);
    float row[384];
    for (int64_t c = 0; c < n; c++) {
        assert_int_equal(dsq_weight_dequant_row(&w, c, row), DSQ_OK);
        for (int64_t j = 0; j < k; j++) {
            int64_t r = perm ? perm[j] : j;
            int64_t g = gidx[r];
            assert_int_equal(g, j / gs);
            float ref = ((float)q[r * n + c] - (float)z[g * n + c]) * dsq_fp16_to_fp32(s[g * n + c]);
            assert_true(row[j] == ref);
        }
    }
    /* the documented contract: matmul(x permuted, W') == W x */
    float x[384], xp[384], y[16];
    for (int64_t j = 0; j < k; j++) x[j] = rndf(-1, 1);
    for (int64_t j = 0; j < k; j++) xp[j] = x[perm ? perm[j] : j];
    assert_int_equal(dsq_cpu_matmul(y, xp, 1, &w), DSQ_OK);
    for (int64_t c = 0; c < n; c++) {
        double ref = 0, mag = 0;
        for (int64_t r = 0; r < k; r++) {
            int64_t g = gidx[r];
            double wv = ((double)q[r * n + c] - z[g * n + c]) * dsq_fp16_to_fp32(s[g * n + c]);
            ref += wv * x[r];
            mag += fabs(wv);
        }
        /* activation int8 quantisation: |x - x^| <= amax/254 <= 1/254 */
        assert_true(fabs(y[c] - ref) <= mag / 254.0 + 1e-4);
    }
    free(perm); free(st); free(q); free(z); free(s); free(qw); free(qz); free(gidx); free(pi);
}

static void test_gptq(void **state)
{
    (void)state;
    run_gptq(32, 0); run_gptq(64, 0); run_gptq(128, 0);
    run_gptq(32, 1); run_gptq(64, 1); run_gptq(128, 1);
}

static void test_gptq_bad_gidx(void **state)
{
    (void)state;
    int32_t qw[8 * 8] = {0}, qz[8] = {0}, gidx[64];
    uint16_t s[16] = {0};
    for (int i = 0; i < 64; i++) gidx[i] = i < 40 ? 0 : 1;  /* group 0 has 40 rows */
    dsq_weight_t w;
    void *st;
    int32_t *perm;
    char err[256];
    assert_int_equal(dsq_quant_from_gptq(qw, qz, s, gidx, 64, 8, 32, &w, &st, &perm,
                                         err, sizeof(err)), DSQ_EUNSUPPORTED);
    assert_null(st);
}

/* RTN INT4 (asym and sym, groups 32/64/128, k = 172 as stories260K's w2)
 * from F32, F16 and the real Q8_0 embedding: error <= s/2 per element. */
static void check_rtn(const dsq_tensor_t *t, const float *ref_rows)
{
    const int gsz[3] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++)
        for (int sym = 0; sym < 2; sym++) {
            dsq_weight_t w;
            void *st;
            char err[256];
            assert_int_equal(dsq_quant_rtn_int4(t, gsz[gi], sym, &w, &st, err, sizeof(err)), DSQ_OK);
            int64_t k = w.k, G = (k + gsz[gi] - 1) / gsz[gi];
            float *row = malloc((size_t)k * 4);
            for (int64_t r = 0; r < w.n; r++) {
                assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
                for (int64_t j = 0; j < k; j++) {
                    float sc = dsq_fp16_to_fp32(w.scales[r * G + j / gsz[gi]]);
                    float e = fabsf(row[j] - ref_rows[r * k + j]);
                    if (e > sc * 0.5f * (1 + 1e-6f) + 1e-12f)
                        fail_msg("rtn g%d sym%d r%lld j%lld err %g > s/2 %g", gsz[gi], sym,
                                 (long long)r, (long long)j, e, sc / 2);
                }
                /* padding nibbles are zero */
                const uint8_t *d = (const uint8_t *)w.data + r * ((k + 31) / 32) * 16;
                for (int64_t j = k; j < (k + 31) / 32 * 32; j++) {
                    uint8_t b = d[(j / 32) * 16 + j % 16];
                    assert_int_equal(j % 32 < 16 ? (b & 15) : (b >> 4), 0);
                }
            }
            free(row);
            free(st);
        }
}

static void test_rtn(void **state)
{
    (void)state;
    const int64_t n = 7, k = 172;
    float *f = malloc((size_t)(n * k) * 4);
    uint16_t *h = malloc((size_t)(n * k) * 2);
    float *fh = malloc((size_t)(n * k) * 4);
    for (int64_t i = 0; i < n * k; i++) {
        f[i] = rndf(-1, 1) * (i % 13 == 0 ? 5.0f : 1.0f) + (i / k == 3 ? 2.0f : 0.0f);
        h[i] = dsq_fp32_to_fp16(f[i]);
        fh[i] = dsq_fp16_to_fp32(h[i]);
    }
    dsq_tensor_t t = {.name = "f", .type = DSQ_TYPE_F32, .n_dims = 2, .ne = {k, n, 1, 1},
                      .data = f, .n_bytes = (size_t)(n * k) * 4};
    check_rtn(&t, f);
    dsq_tensor_t th = {.name = "h", .type = DSQ_TYPE_F16, .n_dims = 2, .ne = {k, n, 1, 1},
                       .data = h, .n_bytes = (size_t)(n * k) * 2};
    check_rtn(&th, fh);
    /* all-zero rows */
    memset(f, 0, (size_t)(n * k) * 4);
    check_rtn(&t, f);

    dsq_gguf_t *g = open_model();
    const dsq_tensor_t *te = dsq_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(te);
    dsq_tensor_t sub = *te;
    sub.ne[1] = 40;
    sub.n_bytes = (size_t)(40 * te->ne[0] / 32 * 34);
    float *ref = malloc((size_t)(40 * te->ne[0]) * 4);
    for (int64_t i = 0; i < 40 * te->ne[0]; i++) {
        const uint8_t *b = (const uint8_t *)te->data + (i / 32) * 34;
        ref[i] = (float)(int8_t)b[2 + i % 32] * dsq_fp16_to_fp32(rd16(b));
    }
    check_rtn(&sub, ref);
    free(ref);
    dsq_gguf_close(g);
    free(f); free(h); free(fh);
}

static void test_int8_channel(void **state)
{
    (void)state;
    const int64_t n = 9, k = 172;
    float *f = malloc((size_t)(n * k) * 4);
    for (int64_t i = 0; i < n * k; i++) f[i] = rndf(-3, 3) * (float)(1 + i / k);
    dsq_tensor_t t = {.name = "f", .type = DSQ_TYPE_F32, .n_dims = 2, .ne = {k, n, 1, 1},
                      .data = f, .n_bytes = (size_t)(n * k) * 4};
    dsq_weight_t w;
    void *st;
    char err[256];
    assert_int_equal(dsq_quant_int8_channel(&t, &w, &st, err, sizeof(err)), DSQ_OK);
    assert_int_equal(w.format, DSQ_WFMT_INT8);
    float row[172];
    for (int64_t r = 0; r < n; r++) {
        assert_int_equal(dsq_weight_dequant_row(&w, r, row), DSQ_OK);
        float s = dsq_fp16_to_fp32(w.scales[r]);
        for (int64_t j = 0; j < k; j++)
            assert_true(fabsf(row[j] - f[r * k + j]) <= s * 0.5f * (1 + 1e-6f));
    }
    free(st);
    free(f);
}

static void test_errors(void **state)
{
    (void)state;
    dsq_weight_t w;
    void *st;
    char err[256] = "";
    uint8_t b[128] = {0};
    dsq_tensor_t t = {.name = "blk.0.x", .type = DSQ_TYPE_IQ2_XXS, .n_dims = 2,
                      .ne = {256, 1, 1, 1}, .data = b, .n_bytes = sizeof(b)};
    assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_EUNSUPPORTED);
    assert_non_null(strstr(err, "blk.0.x"));
    assert_non_null(strstr(err, "IQ2_XXS"));
    t.type = DSQ_TYPE_Q4_0;
    t.ne[0] = 48;
    assert_int_equal(dsq_quant_from_gguf(&t, &w, &st, err, sizeof(err)), DSQ_EINVAL);
    t.type = DSQ_TYPE_F32;
    t.ne[0] = 16;
    assert_int_equal(dsq_quant_rtn_int4(&t, 48, false, &w, &st, err, sizeof(err)), DSQ_EUNSUPPORTED);
    assert_null(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_q4_1_real),
        cmocka_unit_test(test_gguf_q8_0_real),
        cmocka_unit_test(test_gguf_q4_0_synth),
        cmocka_unit_test(test_gguf_q4_k_synth),
        cmocka_unit_test(test_awq),
        cmocka_unit_test(test_gptq),
        cmocka_unit_test(test_gptq_bad_gidx),
        cmocka_unit_test(test_rtn),
        cmocka_unit_test(test_int8_channel),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

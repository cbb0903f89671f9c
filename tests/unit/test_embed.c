/* tests for kernels/cpu/embed.c: gathered rows equal each format's
 * dequantisation formula computed here from the raw bytes (exact), on the
 * real SmolLM2 Q8_0 token_embd and on synthetic INT4 (all zero-point modes,
 * k = 172), INT8, F16 and BF16 tables; bad ids give DSQ_ERANGE. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "kernels.h"
#include "engine/io/tensor.h"

static uint64_t rng = 0x13198A2E03707344ull;
static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static void test_real_q8_0(void **state)
{
    (void)state;
    const char *dir = getenv("DSQ_MODELS_DIR");
    char path[1024], err[256] = "";
    snprintf(path, sizeof(path), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : "models");
    dsq_gguf_t *g = dsq_gguf_open(path, err, sizeof(err));
    if (!g)
        fail_msg("missing test model %s: %s", path, err);
    const dsq_tensor_t *t = dsq_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, DSQ_TYPE_Q8_0);
    dsq_weight_t w = {.format = DSQ_WFMT_Q8_0, .n = t->ne[1], .k = t->ne[0],
                      .group_size = 32, .data = t->data};
    const int32_t ids[5] = {0, 1, 12345, (int32_t)t->ne[1] - 1, 7};
    float *out = malloc((size_t)(5 * w.k) * 4);
    assert_int_equal(dsq_cpu_embed(out, &w, ids, 5), DSQ_OK);
    for (int i = 0; i < 5; i++)
        for (int64_t j = 0; j < w.k; j++) {
            const uint8_t *b = (const uint8_t *)t->data + ((int64_t)ids[i] * w.k + j) / 32 * 34;
            float d = dsq_fp16_to_fp32((uint16_t)(b[0] | (b[1] << 8)));
            assert_true(out[i * w.k + j] == (float)(int8_t)b[2 + j % 32] * d);
        }
    const int32_t bad[2] = {3, (int32_t)t->ne[1]};
    assert_int_equal(dsq_cpu_embed(out, &w, bad, 2), DSQ_ERANGE);
    const int32_t neg[1] = {-1};
    assert_int_equal(dsq_cpu_embed(out, &w, neg, 1), DSQ_ERANGE);
    free(out);
    dsq_gguf_close(g);
}

static void test_int4(void **state)
{
    (void)state;
    const int64_t n = 11, k = 172, kp = 192, gs = 64, G = 3;
    uint8_t *d = calloc((size_t)(n * kp / 2), 1);
    uint8_t *q = malloc((size_t)(n * k));
    uint16_t sc[11 * 3], zi[11 * 3], zm[11 * 3];
    for (int64_t i = 0; i < n * G; i++) {
        sc[i] = dsq_fp32_to_fp16((float)(rnd() % 1000 + 1) * 1e-4f);
        zi[i] = dsq_fp32_to_fp16((float)(rnd() % 16));
        zm[i] = dsq_fp32_to_fp16(-(float)(rnd() % 1000) * 1e-4f);
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) {
            q[r * k + j] = (uint8_t)(rnd() % 16);
            d[r * kp / 2 + (j / 32) * 16 + j % 16] |=
                (uint8_t)(j % 32 < 16 ? q[r * k + j] : q[r * k + j] << 4);
        }
    const int32_t ids[4] = {10, 0, 5, 5};
    float out[4 * 172];
    for (int zp = 0; zp < 3; zp++) {
        dsq_weight_t w = {.format = DSQ_WFMT_INT4, .n = n, .k = k, .group_size = (int)gs,
                          .zp_mode = (dsq_zp_mode_t)zp, .data = d, .scales = sc,
                          .zeros = zp == 0 ? NULL : zp == 1 ? zi : zm};
        assert_int_equal(dsq_cpu_embed(out, &w, ids, 4), DSQ_OK);
        for (int i = 0; i < 4; i++)
            for (int64_t j = 0; j < k; j++) {
                int64_t gi = ids[i] * G + j / gs;
                float s = dsq_fp16_to_fp32(sc[gi]);
                float qq = (float)q[ids[i] * k + j];
                float ref = zp == 0 ? (qq - 8.0f) * s
                          : zp == 1 ? (qq - dsq_fp16_to_fp32(zi[gi])) * s
                          : qq * s + dsq_fp16_to_fp32(zm[gi]);
                assert_true(out[i * k + j] == ref);
            }
    }
    free(d);
    free(q);
}

static void test_plain(void **state)
{
    (void)state;
    const int64_t n = 6, k = 172;
    int8_t q8[6 * 172];
    uint16_t h[6 * 172], sc[6];
    for (int64_t i = 0; i < n * k; i++) {
        q8[i] = (int8_t)((int)(rnd() % 255) - 127);
        h[i] = (uint16_t)(rnd() & 0x7bff);   /* finite fp16 / bf16 patterns */
    }
    for (int i = 0; i < n; i++)
        sc[i] = dsq_fp32_to_fp16(0.01f * (float)(i + 1));
    const int32_t ids[3] = {5, 2, 0};
    float out[3 * 172];
    dsq_weight_t w8 = {.format = DSQ_WFMT_INT8, .n = n, .k = k, .data = q8, .scales = sc};
    assert_int_equal(dsq_cpu_embed(out, &w8, ids, 3), DSQ_OK);
    for (int i = 0; i < 3; i++)
        for (int64_t j = 0; j < k; j++)
            assert_true(out[i * k + j] == (float)q8[ids[i] * k + j] * dsq_fp16_to_fp32(sc[ids[i]]));
    dsq_weight_t wh = {.format = DSQ_WFMT_F16, .n = n, .k = k, .data = h};
    assert_int_equal(dsq_cpu_embed(out, &wh, ids, 3), DSQ_OK);
    for (int i = 0; i < 3; i++)
        for (int64_t j = 0; j < k; j++)
            assert_true(out[i * k + j] == dsq_fp16_to_fp32(h[ids[i] * k + j]));
    dsq_weight_t wb = {.format = DSQ_WFMT_BF16, .n = n, .k = k, .data = h};
    assert_int_equal(dsq_cpu_embed(out, &wb, ids, 3), DSQ_OK);
    for (int i = 0; i < 3; i++)
        for (int64_t j = 0; j < k; j++)
            assert_true(out[i * k + j] == dsq_bf16_to_fp32(h[ids[i] * k + j]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_q8_0),
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

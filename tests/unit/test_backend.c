/* tests for engine/backend/backend.c: the CPU backend behind the backend
 * layer. Its ops must be exactly today's kernels (the same bytes out as a
 * direct dsq_cpu_* call on the same inputs), its memory accounting must add
 * up, a host weight "upload" is a view, and asking for CUDA where it cannot
 * run fails with a one-line reason instead of falling back. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsq_config.h"
#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "kernels.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 4503599627370496.0 - 1.0);
}

static void test_identity(void **state)
{
    (void)state;
    dsq_backend_t *be = dsq_backend_cpu();
    assert_ptr_equal(be, dsq_backend_cpu());
    assert_int_equal(dsq_backend_kind(be), DSQ_BACKEND_CPU);
    assert_string_equal(dsq_backend_name(be), "cpu");
    assert_true(dsq_backend_is_host(be));
    char d[128];
    dsq_backend_describe(be, d, sizeof(d));
    assert_non_null(strstr(d, "cpu "));
    assert_non_null(strstr(d, dsq_cpu_isa()));
    dsq_backend_destroy(be);       /* the singleton survives */
    assert_string_equal(dsq_backend_name(dsq_backend_cpu()), "cpu");
    char err[256] = "";
    dsq_backend_t *own = dsq_backend_create(DSQ_BACKEND_CPU, err, sizeof(err));
    assert_non_null(own);
    assert_true(own != be);
    dsq_backend_destroy(own);
    dsq_backend_destroy(NULL);
    assert_null(dsq_backend_create((dsq_backend_kind_t)7, err, sizeof(err)));
    assert_non_null(strstr(err, "unknown backend kind"));
}

/* Every row of the op table has a CPU entry (the CPU backend is the
 * reference every other one is tested against), each name once; a name
 * outside the table is no op. */
static void test_op_table(void **state)
{
    (void)state;
    dsq_backend_t *be = dsq_backend_cpu();
    int n = 0;
    for (const char *name; (name = dsq_backend_op_name(n)) != NULL; n++) {
        assert_true(dsq_backend_has_op(be, name));
        for (int j = 0; j < n; j++)
            assert_string_not_equal(name, dsq_backend_op_name(j));
    }
    assert_true(n >= 17);
    assert_string_equal(dsq_backend_op_name(0), "matmul");
    assert_null(dsq_backend_op_name(-1));
    assert_false(dsq_backend_has_op(be, "no_such_op"));
    assert_false(dsq_backend_has_op(be, NULL));
    assert_false(dsq_backend_has_op(NULL, "matmul"));
}

/* No CUDA build, or no device (this test runs on machines without one):
 * NULL and a reason, never a CPU backend in disguise. */
static void test_cuda_unavailable(void **state)
{
    (void)state;
    char err[256] = "";
    dsq_backend_t *be = dsq_backend_create(DSQ_BACKEND_CUDA, err, sizeof(err));
    if (be) {                      /* a GPU machine: it must be the real thing */
        assert_string_equal(dsq_backend_name(be), "cuda");
        assert_false(dsq_backend_is_host(be));
        dsq_backend_destroy(be);
        return;
    }
    printf("# cuda backend refused: %s\n", err);
#if DSQ_HAVE_CUDA
    assert_non_null(strstr(err, "no CUDA device"));
#else
    assert_non_null(strstr(err, "built without CUDA"));
#endif
}

static void test_memory(void **state)
{
    (void)state;
    char err[256];
    dsq_backend_t *be = dsq_backend_create(DSQ_BACKEND_CPU, err, sizeof(err));
    assert_non_null(be);
    assert_int_equal(dsq_backend_allocated_bytes(be), 0);
    uint8_t *a = dsq_backend_alloc(be, 1000), *b = dsq_backend_alloc(be, 24);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 256, 0);
    assert_int_equal(dsq_backend_allocated_bytes(be), 1024);
    uint8_t src[1000];
    for (int i = 0; i < 1000; i++)
        src[i] = (uint8_t)i;
    assert_int_equal(dsq_backend_upload(be, a, src, 1000), DSQ_OK);
    assert_int_equal(dsq_backend_memset(be, b, 7, 24), DSQ_OK);
    assert_int_equal(dsq_backend_copy(be, b, a + 10, 8), DSQ_OK);
    uint8_t got[24];
    assert_int_equal(dsq_backend_download(be, got, b, 24), DSQ_OK);
    for (int i = 0; i < 8; i++)
        assert_int_equal(got[i], 10 + i);
    assert_int_equal(got[8], 7);
    dsq_backend_free(be, a);
    assert_int_equal(dsq_backend_allocated_bytes(be), 24);
    dsq_backend_free(be, b);
    dsq_backend_free(be, NULL);
    assert_int_equal(dsq_backend_allocated_bytes(be), 0);
    assert_int_equal(dsq_backend_peak_bytes(be), 1024);
    assert_null(dsq_backend_alloc(be, 0));
    assert_int_equal(dsq_backend_upload(be, NULL, src, 1), DSQ_EINVAL);
    assert_int_equal(dsq_backend_download(be, src, NULL, 1), DSQ_EINVAL);
    assert_int_equal(dsq_backend_upload(be, NULL, NULL, 0), DSQ_OK);
    assert_int_equal(dsq_backend_sync(be), DSQ_OK);
    dsq_backend_destroy(be);
}

/* Every op of the table gives the kernel's own result, byte for byte. */
static void test_ops_are_the_kernels(void **state)
{
    (void)state;
    dsq_backend_t *be = dsq_backend_cpu();
    enum { M = 6, K = 64, N = 40 };
    float x[M * K], w32[N * K], norm[K];
    for (int i = 0; i < M * K; i++)
        x[i] = frand();
    for (int i = 0; i < N * K; i++)
        w32[i] = frand();
    for (int i = 0; i < K; i++)
        norm[i] = 1.0f + 0.1f * frand();
    dsq_weight_t w = {.format = DSQ_WFMT_F32, .n = N, .k = K, .data = w32};
    dsq_weight_t v;
    size_t vb = 99;
    assert_int_equal(dsq_backend_weight_upload(be, &w, &v, &vb), DSQ_OK);
    assert_memory_equal(&v, &w, sizeof(w));
    assert_int_equal(vb, 0);
    float a[M * N], b[M * N];
    assert_int_equal(dsq_cpu_matmul(a, x, M, &w), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(be, b, DSQ_FT_F32, x, DSQ_FT_F32, M, &v), DSQ_OK);
    assert_memory_equal(a, b, sizeof(a));
    /* the CPU backend computes in fp32: a narrow activation type is a
     * device's, refused whole */
    assert_int_equal(dsq_backend_matmul(be, b, DSQ_FT_F16, x, DSQ_FT_F16, M, &v),
                     DSQ_EUNSUPPORTED);
    assert_int_equal(dsq_backend_matmul(be, b, DSQ_FT_F32, x, DSQ_FT_BF16, M, &v),
                     DSQ_EUNSUPPORTED);
    assert_int_equal(dsq_backend_add(be, b, x, DSQ_FT_F16, M), DSQ_EUNSUPPORTED);
    float r1[M * K], r2[M * K];
    assert_int_equal(dsq_cpu_rmsnorm(r1, x, norm, M, K, 1e-6f), DSQ_OK);
    assert_int_equal(dsq_backend_rmsnorm(be, r2, DSQ_FT_F32, x, norm, M, K, 1e-6f), DSQ_OK);
    assert_memory_equal(r1, r2, sizeof(r1));
    const int32_t rows[3] = {5, 0, 5};
    assert_int_equal(dsq_backend_gather_rows(be, r2, x, rows, 3, K, M), DSQ_OK);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(r2 + i * K, x + rows[i] * K, K * sizeof(float));
    const int32_t bad[1] = {M};
    assert_int_equal(dsq_backend_gather_rows(be, r2, x, bad, 1, K, M), DSQ_ERANGE);
    int32_t perm[K];
    for (int j = 0; j < K; j++)
        perm[j] = (j * 7 + 3) % K;          /* 7 is coprime with 64 */
    assert_int_equal(dsq_backend_gather_cols(be, r2, x, DSQ_FT_F32, perm, M, K), DSQ_OK);
    for (int t = 0; t < M; t++)
        for (int j = 0; j < K; j++)
            assert_true(r2[t * K + j] == x[t * K + perm[j]]);
    perm[3] = K;
    assert_int_equal(dsq_backend_gather_cols(be, r2, x, DSQ_FT_F32, perm, M, K), DSQ_ERANGE);
    assert_int_equal(dsq_backend_gather_cols(be, x, x, DSQ_FT_F32, perm, M, K), DSQ_EINVAL);
    memcpy(r1, x, sizeof(r1));
    memcpy(r2, x, sizeof(r2));
    assert_int_equal(dsq_cpu_softmax(r1, M, K), DSQ_OK);
    assert_int_equal(dsq_backend_softmax(be, r2, M, K), DSQ_OK);
    assert_memory_equal(r1, r2, sizeof(r1));
    /* the MoE router is on the CPU backend */
    float logits[2 * 4] = {0.1f, 2.0f, -1.0f, 0.5f, 3.0f, 0.0f, 0.0f, 1.0f};
    dsq_moe_route_t rt = {.n_experts = 4, .top_k = 2, .n_group = 1, .topk_group = 1,
                          .routed_scaling_factor = 1.0f};
    int32_t ids[4];
    float wts[4];
    assert_int_equal(dsq_backend_moe_route(be, ids, wts, logits, 2, &rt), DSQ_OK);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[2], 0);
    dsq_backend_weight_free(be, &v);
    assert_null(v.data);
    /* a weight missing what its format needs is refused, not viewed */
    dsq_weight_t badw = {.format = DSQ_WFMT_INT4, .n = 4, .k = 32, .group_size = 32,
                        .zp_mode = DSQ_ZP_INT, .data = w32, .scales = (uint16_t *)w32};
    assert_int_equal(dsq_backend_weight_upload(be, &badw, &v, NULL), DSQ_EINVAL);
    badw.zp_mode = DSQ_ZP_SYM;
    badw.scales = NULL;
    assert_int_equal(dsq_backend_weight_upload(be, &badw, &v, NULL), DSQ_EINVAL);
    badw.format = (dsq_wformat_t)42;
    assert_int_equal(dsq_backend_weight_upload(be, &badw, &v, NULL), DSQ_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_op_table),
        cmocka_unit_test(test_cuda_unavailable),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_ops_are_the_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

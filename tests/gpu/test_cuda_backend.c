/* GPU check for engine/backend/backend_cuda.c: the CUDA backend against
 * the CPU backend through the backend layer (engine/backend/backend.h),
 * as the model graphs use it: device memory accounting, copies, weight
 * upload, every op of the llama/qwen2 graph on the same inputs, and the
 * attention split of a batch into decode and prefill launches by its host
 * row_seq. Tolerances as in test_cuda_ops / test_cuda_matmul (products:
 * 1e-5 relative to sum |w x|, fp32 summation order only). */
#include "gpu_common.h"

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "kernels/kernels.h"

static dsq_backend_t *cuda_be(void)
{
    char err[256] = "";
    dsq_backend_t *be = dsq_backend_create(DSQ_BACKEND_CUDA, err, sizeof(err));
    if (!be)
        printf("# dsq_backend_create(cuda): %s\n", err);
    assert_non_null(be);
    return be;
}

static void *up(dsq_backend_t *be, const void *h, size_t bytes)
{
    void *d = dsq_backend_alloc(be, bytes);
    assert_non_null(d);
    assert_int_equal(dsq_backend_upload(be, d, h, bytes), DSQ_OK);
    return d;
}

static void test_memory(void **state)
{
    (void)state;
    dsq_backend_t *be = cuda_be();
    char desc[256];
    dsq_backend_describe(be, desc, sizeof(desc));
    printf("# %s\n", desc);
    assert_string_equal(dsq_backend_name(be), "cuda");
    assert_false(dsq_backend_is_host(be));
    assert_int_equal(dsq_backend_allocated_bytes(be), 0);
    enum { N = 1000 };
    uint8_t h[N], back[N];
    for (int i = 0; i < N; i++)
        h[i] = (uint8_t)(i * 7 + 3);
    void *a = up(be, h, N);
    void *b = dsq_backend_alloc(be, 3 * N);
    assert_non_null(b);
    assert_int_equal(dsq_backend_allocated_bytes(be), 4 * N);
    assert_int_equal(dsq_backend_memset(be, b, 0x5a, 3 * N), DSQ_OK);
    assert_int_equal(dsq_backend_copy(be, (uint8_t *)b + N, a, N), DSQ_OK);
    uint8_t got[3 * N];
    assert_int_equal(dsq_backend_download(be, got, b, 3 * N), DSQ_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(got[i], 0x5a);
        assert_int_equal(got[N + i], h[i]);
        assert_int_equal(got[2 * N + i], 0x5a);
    }
    assert_int_equal(dsq_backend_download(be, back, a, N), DSQ_OK);
    assert_memory_equal(back, h, N);
    dsq_backend_free(be, a);
    assert_int_equal(dsq_backend_allocated_bytes(be), 3 * N);
    dsq_backend_free(be, b);
    assert_int_equal(dsq_backend_allocated_bytes(be), 0);
    assert_int_equal(dsq_backend_peak_bytes(be), 4 * N);
    assert_null(dsq_backend_alloc(be, 0));
    assert_int_equal(dsq_backend_upload(be, NULL, h, 1), DSQ_EINVAL);
    assert_int_equal(dsq_backend_sync(be), DSQ_OK);
    /* the MLA/MoE ops are not on CUDA yet: refused, not run */
    assert_int_equal(dsq_backend_moe_route(be, NULL, NULL, NULL, 1, NULL), DSQ_EUNSUPPORTED);
    assert_false(dsq_backend_has_op(be, "moe_route"));
    assert_false(dsq_backend_has_op(be, "mla_attention"));
    assert_true(dsq_backend_has_op(be, "matmul"));
    assert_true(dsq_backend_has_op(be, "attention"));
    dsq_backend_destroy(be);
}

/* An INT4 (AWQ-like, group 32) weight [n][k] with random contents. */
static dsq_weight_t rand_int4(int64_t n, int64_t k)
{
    dsq_weight_t w = {.format = DSQ_WFMT_INT4, .n = n, .k = k, .group_size = 32,
                      .zp_mode = DSQ_ZP_INT, .act = DSQ_ACT_F32};
    size_t db = dsq_weight_data_bytes(w.format, n, k, 32);
    size_t sb = dsq_weight_scale_bytes(w.format, n, k, 32);
    uint8_t *q = malloc(db);
    uint16_t *s = malloc(sb), *z = malloc(sb);
    float *bias = malloc(sizeof(*bias) * n);
    for (size_t i = 0; i < db; i++)
        q[i] = (uint8_t)(int)(urand() * 256);
    for (size_t i = 0; i < sb / 2; i++) {
        s[i] = (uint16_t)((9 << 10) | (int)(urand() * 1024));   /* 2^-6 .. 2^-5 */
        z[i] = 0x4800;                                            /* 8.0 */
    }
    for (int64_t i = 0; i < n; i++)
        bias[i] = frand(0.1f);
    w.data = q;
    w.scales = s;
    w.zeros = z;
    w.bias = bias;
    return w;
}

static void free_host_weight(dsq_weight_t *w)
{
    free((void *)w->data);
    free((void *)w->scales);
    free((void *)w->zeros);
    free((void *)w->bias);
}

static float *fdup(dsq_backend_t *be, const float *h, int64_t n)
{
    return up(be, h, sizeof(float) * (size_t)n);
}

static void get(dsq_backend_t *be, float *h, const float *d, int64_t n)
{
    assert_int_equal(dsq_backend_download(be, h, d, sizeof(float) * (size_t)n), DSQ_OK);
}

/* One attention layer's worth of the llama graph on both backends:
 * embed -> rmsnorm -> q/k/v products -> rope -> kv_write -> attention ->
 * o product -> add -> swiglu, on a ragged batch of two decode rows and a
 * prefill chunk of 20 rows (so attention takes both kernels), then the
 * output head on gathered rows. Compared after every op. */
static void test_graph_ops(void **state)
{
    (void)state;
    dsq_backend_t *cpu = dsq_backend_cpu(), *be = cuda_be();
    enum { V = 97, D = 128, NH = 4, NKV = 2, HD = 32, BS = 8, NB = 12, MAXB = 5 };
    enum { T = 22 };
    /* rows: seq 0 decode at 9, seq 2 prefill 0..19, seq 1 decode at 3 */
    int32_t tokens[T], pos[T], seq[T], slot[T];
    const int32_t bt[3 * MAXB] = {4, 7, -1, -1, -1,   0, -1, -1, -1, -1,
                                  11, 2, 9, -1, -1};
    for (int i = 0; i < T; i++)
        tokens[i] = (int32_t)(urand() * V);
    seq[0] = 0; pos[0] = 9;
    for (int i = 1; i < 21; i++) {
        seq[i] = 2;
        pos[i] = i - 1;
    }
    seq[21] = 1; pos[21] = 3;
    for (int i = 0; i < T; i++)
        slot[i] = bt[seq[i] * MAXB + pos[i] / BS] * BS + pos[i] % BS;

    /* weights */
    float *emb_h = malloc(sizeof(*emb_h) * V * D), *norm = malloc(sizeof(*norm) * D);
    for (int i = 0; i < V * D; i++)
        emb_h[i] = frand(1.0f);
    for (int i = 0; i < D; i++)
        norm[i] = 1.0f + frand(0.2f);
    dsq_weight_t emb = {.format = DSQ_WFMT_F32, .n = V, .k = D, .data = emb_h};
    dsq_weight_t wq = rand_int4(NH * HD, D), wk = rand_int4(NKV * HD, D),
                 wv = rand_int4(NKV * HD, D), wo = rand_int4(D, NH * HD);
    dsq_weight_t demb, dwq, dwk, dwv, dwo;
    size_t wbytes = 0, b1;
    assert_int_equal(dsq_backend_weight_upload(be, &emb, &demb, &b1), DSQ_OK);
    wbytes += b1;
    assert_int_equal(b1, (size_t)V * D * 4);
    dsq_weight_t *hws[4] = {&wq, &wk, &wv, &wo}, *dws[4] = {&dwq, &dwk, &dwv, &dwo};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(dsq_backend_weight_upload(be, hws[i], dws[i], &b1), DSQ_OK);
        const dsq_weight_t *w = hws[i];
        assert_int_equal(b1, dsq_weight_data_bytes(w->format, w->n, w->k, 32) +
                                 2 * dsq_weight_scale_bytes(w->format, w->n, w->k, 32) +
                                 (size_t)w->n * 4);
        wbytes += b1;
    }
    assert_int_equal(dsq_backend_allocated_bytes(be), wbytes);
    /* the CPU backend's upload is a view */
    dsq_weight_t view;
    size_t vb = 1;
    assert_int_equal(dsq_backend_weight_upload(cpu, &wq, &view, &vb), DSQ_OK);
    assert_ptr_equal(view.data, wq.data);
    assert_int_equal(vb, 0);

    /* KV layers: host (CPU backend) and device, f16 */
    const size_t n_el = (size_t)NB * BS * NKV * HD;
    dsq_kv_layer_t hk = {.dtype = DSQ_KV_F16, .block_size = BS, .n_kv_heads = NKV,
                         .head_dim = HD, .n_blocks = NB};
    hk.k = calloc(n_el, 2);
    hk.v = calloc(n_el, 2);
    /* positions of seq 0 and 1 before this step: already in the cache */
    float *kv0 = malloc(sizeof(*kv0) * NKV * HD);
    for (int s = 0; s < 2; s++)
        for (int p = 0; p < pos[s == 0 ? 0 : 21]; p++) {
            int32_t sl = bt[s * MAXB + p / BS] * BS + p % BS;
            for (int i = 0; i < NKV * HD; i++)
                kv0[i] = frand(1.0f);
            assert_int_equal(dsq_cpu_kv_write(&hk, kv0, kv0, &sl, 1), DSQ_OK);
        }
    dsq_kv_layer_t dk = hk;
    dk.k = up(be, hk.k, n_el * 2);
    dk.v = up(be, hk.v, n_el * 2);

    dsq_rope_t rope;
    assert_int_equal(dsq_rope_init(&rope, HD, true, 10000.0, 0, 1, 0, 0, 0, 0, 0), DSQ_OK);
    int32_t *d_tok = up(be, tokens, sizeof(tokens)), *d_pos = up(be, pos, sizeof(pos));
    int32_t *d_seq = up(be, seq, sizeof(seq)), *d_slot = up(be, slot, sizeof(slot));
    int32_t *d_bt = up(be, bt, sizeof(bt));
    float *d_norm = fdup(be, norm, D);

    /* host buffers (CPU backend) and device buffers */
    float *x = malloc(sizeof(*x) * T * D), *h = malloc(sizeof(*h) * T * D);
    float *q = malloc(sizeof(*q) * T * NH * HD), *k = malloc(sizeof(*k) * T * NKV * HD);
    float *v = malloc(sizeof(*v) * T * NKV * HD), *att = malloc(sizeof(*att) * T * NH * HD);
    float *chk = malloc(sizeof(*chk) * T * NH * HD);
    float *dx = dsq_backend_alloc(be, sizeof(float) * T * D);
    float *dh = dsq_backend_alloc(be, sizeof(float) * T * D);
    float *dq = dsq_backend_alloc(be, sizeof(float) * T * NH * HD);
    float *dkk = dsq_backend_alloc(be, sizeof(float) * T * NKV * HD);
    float *dv = dsq_backend_alloc(be, sizeof(float) * T * NKV * HD);
    float *datt = dsq_backend_alloc(be, sizeof(float) * T * NH * HD);
    assert_non_null(datt);
    const float scale = 1.0f / sqrtf((float)HD);
#define SAME(what, hbuf, dbuf, n, tol) \
    do { get(be, chk, dbuf, n); report(what, max_diff(hbuf, chk, n), tol); } while (0)

    assert_int_equal(dsq_backend_embed(cpu, x, &emb, tokens, T), DSQ_OK);
    assert_int_equal(dsq_backend_embed(be, dx, &demb, d_tok, T), DSQ_OK);
    SAME("backend embed", x, dx, T * D, 0.0);
    assert_int_equal(dsq_backend_rmsnorm(cpu, h, DSQ_FT_F32, x, norm, T, D, 1e-5f), DSQ_OK);
    assert_int_equal(dsq_backend_rmsnorm(be, dh, DSQ_FT_F32, dx, d_norm, T, D, 1e-5f), DSQ_OK);
    SAME("backend rmsnorm", h, dh, T * D, 1e-5);
    /* products from identical inputs (upload the CPU's h) */
    assert_int_equal(dsq_backend_upload(be, dh, h, sizeof(float) * T * D), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(cpu, q, DSQ_FT_F32, h, DSQ_FT_F32, T, &wq), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(cpu, k, DSQ_FT_F32, h, DSQ_FT_F32, T, &wk), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(cpu, v, DSQ_FT_F32, h, DSQ_FT_F32, T, &wv), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(be, dq, DSQ_FT_F32, dh, DSQ_FT_F32, T, &dwq), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(be, dkk, DSQ_FT_F32, dh, DSQ_FT_F32, T, &dwk), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(be, dv, DSQ_FT_F32, dh, DSQ_FT_F32, T, &dwv), DSQ_OK);
    SAME("backend matmul q (int4, prefill kernel)", q, dq, T * NH * HD, 1e-4);
    SAME("backend matmul k", k, dkk, T * NKV * HD, 1e-4);
    assert_int_equal(dsq_backend_upload(be, dq, q, sizeof(float) * T * NH * HD), DSQ_OK);
    assert_int_equal(dsq_backend_upload(be, dkk, k, sizeof(float) * T * NKV * HD), DSQ_OK);
    assert_int_equal(dsq_backend_upload(be, dv, v, sizeof(float) * T * NKV * HD), DSQ_OK);
    assert_int_equal(dsq_backend_rope(cpu, q, DSQ_FT_F32, T, NH, HD, pos, &rope), DSQ_OK);
    assert_int_equal(dsq_backend_rope(cpu, k, DSQ_FT_F32, T, NKV, HD, pos, &rope), DSQ_OK);
    assert_int_equal(dsq_backend_rope(be, dq, DSQ_FT_F32, T, NH, HD, d_pos, &rope), DSQ_OK);
    assert_int_equal(dsq_backend_rope(be, dkk, DSQ_FT_F32, T, NKV, HD, d_pos, &rope), DSQ_OK);
    SAME("backend rope q", q, dq, T * NH * HD, 1e-5);
    assert_int_equal(dsq_backend_upload(be, dq, q, sizeof(float) * T * NH * HD), DSQ_OK);
    assert_int_equal(dsq_backend_upload(be, dkk, k, sizeof(float) * T * NKV * HD), DSQ_OK);
    assert_int_equal(dsq_backend_kv_write(cpu, &hk, k, v, DSQ_FT_F32, slot, T), DSQ_OK);
    assert_int_equal(dsq_backend_kv_write(be, &dk, dkk, dv, DSQ_FT_F32, d_slot, T), DSQ_OK);
    uint16_t *kb = malloc(n_el * 2);
    assert_int_equal(dsq_backend_download(be, kb, dk.k, n_el * 2), DSQ_OK);
    assert_memory_equal(kb, hk.k, n_el * 2);
    printf("# backend kv_write f16                           bytes equal\n");
    free(kb);
    /* attention: with the host row_seq (decode + prefill + decode launches)
     * and without it (all decode), both equal the CPU op */
    assert_int_equal(dsq_backend_attention(cpu, att, q, DSQ_FT_F32, T, NH, &hk, seq, pos, bt, MAXB,
                                           scale, seq, NULL), DSQ_OK);
    assert_int_equal(dsq_backend_attention(be, datt, dq, DSQ_FT_F32, T, NH, &dk, d_seq, d_pos, d_bt,
                                           MAXB, scale, seq, NULL), DSQ_OK);
    SAME("backend attention split by row_seq_host", att, datt, T * NH * HD, 2e-5);
    assert_int_equal(dsq_backend_memset(be, datt, 0xff, sizeof(float) * T * NH * HD),
                     DSQ_OK);
    assert_int_equal(dsq_backend_attention(be, datt, dq, DSQ_FT_F32, T, NH, &dk, d_seq, d_pos, d_bt,
                                           MAXB, scale, NULL, NULL), DSQ_OK);
    SAME("backend attention, decode kernel only", att, datt, T * NH * HD, 2e-5);
    /* o product, residual add, swiglu */
    assert_int_equal(dsq_backend_upload(be, datt, att, sizeof(float) * T * NH * HD), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(cpu, h, DSQ_FT_F32, att, DSQ_FT_F32, T, &wo), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(be, dh, DSQ_FT_F32, datt, DSQ_FT_F32, T, &dwo), DSQ_OK);
    SAME("backend matmul o", h, dh, T * D, 1e-4);
    assert_int_equal(dsq_backend_upload(be, dh, h, sizeof(float) * T * D), DSQ_OK);
    assert_int_equal(dsq_backend_add(cpu, x, h, DSQ_FT_F32, T * D), DSQ_OK);
    assert_int_equal(dsq_backend_add(be, dx, dh, DSQ_FT_F32, T * D), DSQ_OK);
    SAME("backend add", x, dx, T * D, 0.0);
    assert_int_equal(dsq_backend_swiglu(cpu, h, x, h, DSQ_FT_F32, T, D), DSQ_OK);
    assert_int_equal(dsq_backend_swiglu(be, dh, dx, dh, DSQ_FT_F32, T, D), DSQ_OK);
    SAME("backend swiglu", h, dh, T * D, 1e-5);
    /* logits rows: gather then the head (decode kernel: 3 rows) */
    const int32_t lrows[3] = {0, 20, 21};
    int32_t *d_lrows = up(be, lrows, sizeof(lrows));
    assert_int_equal(dsq_backend_gather_rows(cpu, q, x, lrows, 3, D, T), DSQ_OK);
    assert_int_equal(dsq_backend_gather_rows(be, dq, dx, d_lrows, 3, D, T), DSQ_OK);
    SAME("backend gather_rows", q, dq, 3 * D, 0.0);
    float logits[3 * V], dlog[3 * V];
    float *d_logits = dsq_backend_alloc(be, sizeof(dlog));
    assert_int_equal(dsq_backend_matmul(cpu, logits, DSQ_FT_F32, q, DSQ_FT_F32, 3, &emb), DSQ_OK);
    assert_int_equal(dsq_backend_matmul(be, d_logits, DSQ_FT_F32, dq, DSQ_FT_F32, 3, &demb), DSQ_OK);
    assert_int_equal(dsq_backend_sync(be), DSQ_OK);
    get(be, dlog, d_logits, 3 * V);
    report("backend output head (f32, tied)", max_diff(logits, dlog, 3 * V), 1e-4);
#undef SAME

    void *dev[] = {d_tok, d_pos, d_seq, d_slot, d_bt, d_norm, dx, dh, dq, dkk, dv, datt,
                   dk.k, dk.v, d_lrows, d_logits};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        dsq_backend_free(be, dev[i]);
    dsq_backend_weight_free(be, &demb);
    for (int i = 0; i < 4; i++) {
        dsq_backend_weight_free(be, dws[i]);
        free_host_weight(hws[i]);
    }
    assert_null(dwq.data);
    assert_int_equal(dsq_backend_allocated_bytes(be), 0);
    dsq_backend_destroy(be);
    free(emb_h); free(norm); free(hk.k); free(hk.v); free(kv0);
    free(x); free(h); free(q); free(k); free(v); free(att); free(chk);
}

int main(void)
{
    int skip = gpu_skip_code();
    if (skip >= 0)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_graph_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

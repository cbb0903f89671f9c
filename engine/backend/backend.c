/* The backend layer's public functions (backend.h), the byte accounting
 * every backend shares, weight upload, and the CPU backend: today's
 * kernels/cpu ops behind the op table, memory from the host heap.
 *
 * Dispatch costs one indirect call per op; the CPU ops themselves take
 * microseconds or more, so the graphs pay nothing measurable for it
 * (docs/benchmarks.md, "backend layer"). */
#include "backend_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsq_config.h"
#include "engine/common/error.h"

#define ALIGN 256u

/* ---------------------------------------------------------------- CPU */

/* Host blocks carry their size in a 256-byte header, so free can account
 * for them without a table. */
static void *cpu_alloc(dsq_backend_t *be, size_t bytes)
{
    (void)be;
    if (bytes > SIZE_MAX - 2 * ALIGN)
        return NULL;
    size_t total = ALIGN + (bytes + ALIGN - 1) / ALIGN * ALIGN;
    unsigned char *p = aligned_alloc(ALIGN, total);
    if (!p)
        return NULL;
    memcpy(p, &bytes, sizeof(bytes));
    return p + ALIGN;
}

static size_t cpu_free(dsq_backend_t *be, void *p)
{
    (void)be;
    unsigned char *base = (unsigned char *)p - ALIGN;
    size_t bytes;
    memcpy(&bytes, base, sizeof(bytes));
    free(base);
    return bytes;
}

static int cpu_upload(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
    return DSQ_OK;
}

static int cpu_memset(dsq_backend_t *be, void *dst, int value, size_t bytes)
{
    (void)be;
    memset(dst, value, bytes);
    return DSQ_OK;
}

static int cpu_sync(dsq_backend_t *be)
{
    (void)be;
    return DSQ_OK;
}

static void cpu_describe(const dsq_backend_t *be, char *buf, size_t len)
{
    (void)be;
    snprintf(buf, len, "cpu %s %d threads", dsq_cpu_isa(), dsq_cpu_get_threads());
}

static int cpu_matmul(dsq_backend_t *be, float *y, const float *x, int64_t m,
                      const dsq_weight_t *w)
{
    (void)be;
    return dsq_cpu_matmul(y, x, m, w);
}
static int cpu_embed(dsq_backend_t *be, float *out, const dsq_weight_t *emb,
                     const int32_t *ids, int64_t m)
{
    (void)be;
    return dsq_cpu_embed(out, emb, ids, m);
}
static int cpu_rmsnorm(dsq_backend_t *be, float *y, const float *x, const float *w,
                       int64_t m, int64_t n, float eps)
{
    (void)be;
    return dsq_cpu_rmsnorm(y, x, w, m, n, eps);
}
static int cpu_rope(dsq_backend_t *be, float *x, int64_t m, int n_heads, int head_dim,
                    const int32_t *pos, const dsq_rope_t *p)
{
    (void)be;
    return dsq_cpu_rope(x, m, n_heads, head_dim, pos, p);
}
static int cpu_swiglu(dsq_backend_t *be, float *out, const float *gate, const float *up,
                      int64_t m, int64_t n)
{
    (void)be;
    return dsq_cpu_swiglu(out, gate, up, m, n);
}
static int cpu_add(dsq_backend_t *be, float *y, const float *x, int64_t n)
{
    (void)be;
    return dsq_cpu_add(y, x, n);
}
static int cpu_softmax(dsq_backend_t *be, float *x, int64_t m, int64_t n)
{
    (void)be;
    return dsq_cpu_softmax(x, m, n);
}
static int cpu_gather_rows(dsq_backend_t *be, float *dst, const float *src,
                           const int32_t *rows, int64_t m, int64_t width, int64_t n_src)
{
    (void)be;
    return dsq_cpu_gather_rows(dst, src, rows, m, width, n_src);
}
static int cpu_gather_cols(dsq_backend_t *be, float *dst, const float *src,
                           const int32_t *perm, int64_t m, int64_t k)
{
    (void)be;
    return dsq_cpu_gather_cols(dst, src, perm, m, k);
}
static int cpu_kv_write(dsq_backend_t *be, const dsq_kv_layer_t *kv, const float *k,
                        const float *v, const int32_t *slot, int64_t m)
{
    (void)be;
    return dsq_cpu_kv_write(kv, k, v, slot, m);
}
static int cpu_attention(dsq_backend_t *be, float *out, const float *q, int64_t m,
                         int n_heads, const dsq_kv_layer_t *kv, const int32_t *row_seq,
                         const int32_t *row_pos, const int32_t *block_tables,
                         int max_blocks, float scale, const int32_t *row_seq_host)
{
    (void)be;
    (void)row_seq_host;
    return dsq_cpu_attention(out, q, m, n_heads, kv, row_seq, row_pos, block_tables,
                             max_blocks, scale);
}
static int cpu_mla_attention(dsq_backend_t *be, float *out, const float *q, int64_t m,
                             int n_heads, int kv_lora_rank, const dsq_kv_layer_t *kv,
                             const int32_t *row_seq, const int32_t *row_pos,
                             const int32_t *block_tables, int max_blocks, float scale)
{
    (void)be;
    return dsq_cpu_mla_attention(out, q, m, n_heads, kv_lora_rank, kv, row_seq, row_pos,
                                 block_tables, max_blocks, scale);
}
static int cpu_mla_kv_write(dsq_backend_t *be, const dsq_kv_layer_t *kv,
                            const float *latent, const int32_t *slot, int64_t m)
{
    (void)be;
    return dsq_cpu_mla_kv_write(kv, latent, slot, m);
}
static int cpu_mla_kv_read(dsq_backend_t *be, const dsq_kv_layer_t *kv,
                           const int32_t *slot, int64_t m, float *out)
{
    (void)be;
    return dsq_cpu_mla_kv_read(kv, slot, m, out);
}
static int cpu_mla_attention_dense(dsq_backend_t *be, float *out, const float *q,
                                   int64_t m, int n_heads, const int32_t *row_pos,
                                   const float *kv, const float *k_pe, int64_t n_ctx,
                                   int qk_nope_dim, int qk_rope_dim, int v_dim,
                                   float scale)
{
    (void)be;
    return dsq_cpu_mla_attention_dense(out, q, m, n_heads, row_pos, kv, k_pe, n_ctx,
                                       qk_nope_dim, qk_rope_dim, v_dim, scale);
}
static int cpu_moe_route(dsq_backend_t *be, int32_t *ids, float *weights,
                         const float *logits, int64_t m, const dsq_moe_route_t *p)
{
    (void)be;
    return dsq_cpu_moe_route(ids, weights, logits, m, p);
}
static int cpu_moe_group(dsq_backend_t *be, int32_t *offsets, int32_t *rows,
                         float *row_weights, const int32_t *ids, const float *weights,
                         int64_t m, int top_k, int n_experts)
{
    (void)be;
    return dsq_cpu_moe_group(offsets, rows, row_weights, ids, weights, m, top_k,
                             n_experts);
}

static const dsq_backend_ops_t cpu_ops = {
    .name = "cpu",
    .is_host = true,
    .describe = cpu_describe,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_upload,
    .copy = cpu_upload,
    .memset = cpu_memset,
    .sync = cpu_sync,
    .matmul = cpu_matmul,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .softmax = cpu_softmax,
    .gather_rows = cpu_gather_rows,
    .gather_cols = cpu_gather_cols,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .mla_attention = cpu_mla_attention,
    .mla_kv_write = cpu_mla_kv_write,
    .mla_kv_read = cpu_mla_kv_read,
    .mla_attention_dense = cpu_mla_attention_dense,
    .moe_route = cpu_moe_route,
    .moe_group = cpu_moe_group,
};

static dsq_backend_t cpu_singleton = {
    .ops = &cpu_ops,
    .kind = DSQ_BACKEND_CPU,
    .is_singleton = true,
};

dsq_backend_t *dsq_backend_cpu(void) { return &cpu_singleton; }

/* ------------------------------------------------------- create/destroy */

dsq_backend_t *dsq_backend_create(dsq_backend_kind_t kind, char *err, size_t err_len)
{
    dsq_backend_t *be = calloc(1, sizeof(*be));
    if (!be) {
        snprintf(err, err_len, "backend: out of memory");
        return NULL;
    }
    be->kind = kind;
    switch (kind) {
    case DSQ_BACKEND_CPU:
        be->ops = &cpu_ops;
        return be;
    case DSQ_BACKEND_CUDA:
#if DSQ_HAVE_CUDA
        if (dsq__backend_cuda_init(be, err, err_len) == DSQ_OK)
            return be;
#else
        snprintf(err, err_len,
                 "backend: this dsq was built without CUDA (meson setup -Dcuda=enabled "
                 "on a machine with the CUDA toolkit)");
#endif
        break;
    default:
        snprintf(err, err_len, "backend: unknown backend kind %d", (int)kind);
        break;
    }
    free(be);
    return NULL;
}

void dsq_backend_destroy(dsq_backend_t *be)
{
    if (!be || be->is_singleton)
        return;
    if (be->ops->destroy)
        be->ops->destroy(be);
    free(be);
}

dsq_backend_kind_t dsq_backend_kind(const dsq_backend_t *be) { return be->kind; }
const char *dsq_backend_name(const dsq_backend_t *be) { return be->ops->name; }
bool dsq_backend_is_host(const dsq_backend_t *be) { return be->ops->is_host; }

void dsq_backend_describe(const dsq_backend_t *be, char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    buf[0] = '\0';
    be->ops->describe(be, buf, len);
}

/* ------------------------------------------------------------- memory */

void *dsq_backend_alloc(dsq_backend_t *be, size_t bytes)
{
    if (bytes == 0)
        return NULL;
    void *p = be->ops->alloc(be, bytes);
    if (!p)
        return NULL;
    size_t now = atomic_fetch_add(&be->allocated, bytes) + bytes;
    size_t peak = atomic_load(&be->peak);
    while (now > peak && !atomic_compare_exchange_weak(&be->peak, &peak, now))
        ;
    return p;
}

void dsq_backend_free(dsq_backend_t *be, void *p)
{
    if (!p)
        return;
    atomic_fetch_sub(&be->allocated, be->ops->free(be, p));
}

size_t dsq_backend_allocated_bytes(const dsq_backend_t *be)
{
    return atomic_load(&((dsq_backend_t *)be)->allocated);
}

size_t dsq_backend_peak_bytes(const dsq_backend_t *be)
{
    return atomic_load(&((dsq_backend_t *)be)->peak);
}

int dsq_backend_upload(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst || !src)
        return DSQ_EINVAL;
    return be->ops->upload(be, dst, src, bytes);
}

int dsq_backend_download(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst || !src)
        return DSQ_EINVAL;
    return be->ops->download(be, dst, src, bytes);
}

int dsq_backend_copy(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst || !src)
        return DSQ_EINVAL;
    return be->ops->copy(be, dst, src, bytes);
}

int dsq_backend_memset(dsq_backend_t *be, void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst)
        return DSQ_EINVAL;
    return be->ops->memset(be, dst, value, bytes);
}

int dsq_backend_sync(dsq_backend_t *be) { return be->ops->sync(be); }

int dsq_backend_mem_info(dsq_backend_t *be, size_t *free_bytes, size_t *total_bytes)
{
    return be->ops->mem_info ? be->ops->mem_info(be, free_bytes, total_bytes)
                             : DSQ_EUNSUPPORTED;
}

/* ------------------------------------------------------------- weights */

static int upload_part(dsq_backend_t *be, const void *src, size_t bytes, void **out,
                       size_t *total)
{
    *out = NULL;
    if (!src || bytes == 0)
        return DSQ_OK;
    *out = dsq_backend_alloc(be, bytes);
    if (!*out)
        return DSQ_ENOMEM;
    *total += bytes;
    return dsq_backend_upload(be, *out, src, bytes);
}

int dsq_backend_weight_upload(dsq_backend_t *be, const dsq_weight_t *w,
                              dsq_weight_t *out, size_t *bytes)
{
    if (bytes)
        *bytes = 0;
    dsq_weight_bytes_t lb;
    if (!w || !out || dsq_weight_check(w) != DSQ_OK || dsq_weight_layout(w, &lb) != DSQ_OK)
        return DSQ_EINVAL;
    if (be->ops->is_host) {
        *out = *w;
        return DSQ_OK;
    }
    dsq_weight_t d = *w;
    size_t total = 0;
    void *data = NULL, *scales = NULL, *zeros = NULL, *bias = NULL;
    void *sub_s = NULL, *sub_z = NULL, *sup = NULL;
    int rc = upload_part(be, w->data, lb.data, &data, &total);
    if (!rc)
        rc = upload_part(be, w->scales, lb.scales, &scales, &total);
    if (!rc)
        rc = upload_part(be, w->zeros, lb.zeros, &zeros, &total);
    if (!rc)
        rc = upload_part(be, w->sub_scales, lb.scales, &sub_s, &total);
    if (!rc)
        rc = upload_part(be, w->sub_zeros, lb.zeros, &sub_z, &total);
    if (!rc)
        rc = upload_part(be, w->super, lb.super, &sup, &total);
    if (!rc)
        rc = upload_part(be, w->bias, (size_t)w->n * sizeof(float), &bias, &total);
    if (rc) {
        void *all[] = {data, scales, zeros, sub_s, sub_z, sup, bias};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            dsq_backend_free(be, all[i]);
        return rc;
    }
    d.data = data;
    d.scales = scales;
    d.zeros = zeros;
    d.sub_scales = sub_s;
    d.sub_zeros = sub_z;
    d.super = sup;
    d.bias = bias;
    *out = d;
    if (bytes)
        *bytes = total;
    return DSQ_OK;
}

void dsq_backend_weight_free(dsq_backend_t *be, dsq_weight_t *w)
{
    if (!w)
        return;
    if (!be->ops->is_host) {
        dsq_backend_free(be, (void *)w->data);
        dsq_backend_free(be, (void *)w->scales);
        dsq_backend_free(be, (void *)w->zeros);
        dsq_backend_free(be, (void *)w->sub_scales);
        dsq_backend_free(be, (void *)w->sub_zeros);
        dsq_backend_free(be, (void *)w->super);
        dsq_backend_free(be, (void *)w->bias);
    }
    memset(w, 0, sizeof(*w));
}

/* ----------------------------------------------------------------- ops */

#define DISPATCH(op, ...) \
    (be->ops->op ? be->ops->op(be, __VA_ARGS__) : DSQ_EUNSUPPORTED)

int dsq_backend_matmul(dsq_backend_t *be, float *y, const float *x, int64_t m,
                       const dsq_weight_t *w)
{
    return DISPATCH(matmul, y, x, m, w);
}
int dsq_backend_embed(dsq_backend_t *be, float *out, const dsq_weight_t *emb,
                      const int32_t *ids, int64_t m)
{
    return DISPATCH(embed, out, emb, ids, m);
}
int dsq_backend_rmsnorm(dsq_backend_t *be, float *y, const float *x, const float *w,
                        int64_t m, int64_t n, float eps)
{
    return DISPATCH(rmsnorm, y, x, w, m, n, eps);
}
int dsq_backend_rope(dsq_backend_t *be, float *x, int64_t m, int n_heads, int head_dim,
                     const int32_t *pos, const dsq_rope_t *p)
{
    return DISPATCH(rope, x, m, n_heads, head_dim, pos, p);
}
int dsq_backend_swiglu(dsq_backend_t *be, float *out, const float *gate,
                       const float *up, int64_t m, int64_t n)
{
    return DISPATCH(swiglu, out, gate, up, m, n);
}
int dsq_backend_add(dsq_backend_t *be, float *y, const float *x, int64_t n)
{
    return DISPATCH(add, y, x, n);
}
int dsq_backend_softmax(dsq_backend_t *be, float *x, int64_t m, int64_t n)
{
    return DISPATCH(softmax, x, m, n);
}
int dsq_backend_gather_rows(dsq_backend_t *be, float *dst, const float *src,
                            const int32_t *rows, int64_t m, int64_t width,
                            int64_t n_src)
{
    return DISPATCH(gather_rows, dst, src, rows, m, width, n_src);
}
int dsq_backend_gather_cols(dsq_backend_t *be, float *dst, const float *src,
                            const int32_t *perm, int64_t m, int64_t k)
{
    return DISPATCH(gather_cols, dst, src, perm, m, k);
}
int dsq_backend_kv_write(dsq_backend_t *be, const dsq_kv_layer_t *kv, const float *k,
                         const float *v, const int32_t *slot, int64_t m)
{
    return DISPATCH(kv_write, kv, k, v, slot, m);
}
int dsq_backend_attention(dsq_backend_t *be, float *out, const float *q, int64_t m,
                          int n_heads, const dsq_kv_layer_t *kv,
                          const int32_t *row_seq, const int32_t *row_pos,
                          const int32_t *block_tables, int max_blocks, float scale,
                          const int32_t *row_seq_host)
{
    return DISPATCH(attention, out, q, m, n_heads, kv, row_seq, row_pos, block_tables,
                    max_blocks, scale, row_seq_host);
}
int dsq_backend_mla_attention(dsq_backend_t *be, float *out, const float *q, int64_t m,
                              int n_heads, int kv_lora_rank, const dsq_kv_layer_t *kv,
                              const int32_t *row_seq, const int32_t *row_pos,
                              const int32_t *block_tables, int max_blocks,
                              float scale)
{
    return DISPATCH(mla_attention, out, q, m, n_heads, kv_lora_rank, kv, row_seq,
                    row_pos, block_tables, max_blocks, scale);
}
int dsq_backend_mla_kv_write(dsq_backend_t *be, const dsq_kv_layer_t *kv,
                             const float *latent, const int32_t *slot, int64_t m)
{
    return DISPATCH(mla_kv_write, kv, latent, slot, m);
}
int dsq_backend_mla_kv_read(dsq_backend_t *be, const dsq_kv_layer_t *kv,
                            const int32_t *slot, int64_t m, float *out)
{
    return DISPATCH(mla_kv_read, kv, slot, m, out);
}
int dsq_backend_mla_attention_dense(dsq_backend_t *be, float *out, const float *q,
                                    int64_t m, int n_heads, const int32_t *row_pos,
                                    const float *kv, const float *k_pe, int64_t n_ctx,
                                    int qk_nope_dim, int qk_rope_dim, int v_dim,
                                    float scale)
{
    return DISPATCH(mla_attention_dense, out, q, m, n_heads, row_pos, kv, k_pe, n_ctx,
                    qk_nope_dim, qk_rope_dim, v_dim, scale);
}
int dsq_backend_moe_route(dsq_backend_t *be, int32_t *ids, float *weights,
                          const float *logits, int64_t m, const dsq_moe_route_t *p)
{
    return DISPATCH(moe_route, ids, weights, logits, m, p);
}
int dsq_backend_moe_group(dsq_backend_t *be, int32_t *offsets, int32_t *rows,
                          float *row_weights, const int32_t *ids, const float *weights,
                          int64_t m, int top_k, int n_experts)
{
    return DISPATCH(moe_group, offsets, rows, row_weights, ids, weights, m, top_k,
                    n_experts);
}

/* The CPU backend: the kernels/cpu ops behind the op table, memory from
 * the host heap. Every op runs before it returns, so sync is a no-op and
 * the "device" copies are memcpy; host pointers (mmapped weights, caller
 * arrays) are valid op arguments, which is why weights are never copied
 * here. Entries are generated from backend_ops.inc (column cpu): TWIN rows
 * call dsq_cpu_<op> with the same arguments; the rows with activation
 * types are OWN below: fp32 only, then the fp32 kernel. */
#include "backend_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

#define ALIGN 256u

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

#define BACKEND_BEFORE_OP(be) (void)(be)
#define DSQ_BACKEND_OP(op, params, args, on_cpu, on_cuda) \
    DSQ__BACKEND_ENTRY_##on_cpu(cpu, op, params, args, dsq_cpu_##op)
#include "backend_ops.inc"

/* The CPU kernels' activations are fp32; a narrow type is a device
 * backend's (the graph asks for what dsq_backend_is_host allows). */
#define F32_ONLY(t) \
    do { if ((t) != DSQ_FT_F32) return DSQ_EUNSUPPORTED; } while (0)

static int cpu_matmul(dsq_backend_t *be, void *y, dsq_ftype_t yt, const void *x,
                      dsq_ftype_t xt, int64_t m, const dsq_weight_t *w)
{
    (void)be;
    F32_ONLY(yt);
    F32_ONLY(xt);
    return dsq_cpu_matmul(y, x, m, w);
}

static int cpu_rmsnorm(dsq_backend_t *be, void *y, dsq_ftype_t yt, const float *x,
                       const float *w, int64_t m, int64_t n, float eps)
{
    (void)be;
    F32_ONLY(yt);
    return dsq_cpu_rmsnorm(y, x, w, m, n, eps);
}

static int cpu_rope(dsq_backend_t *be, void *x, dsq_ftype_t t, int64_t m, int n_heads,
                    int head_dim, const int32_t *pos, const dsq_rope_t *p)
{
    (void)be;
    F32_ONLY(t);
    return dsq_cpu_rope(x, m, n_heads, head_dim, pos, p);
}

static int cpu_swiglu(dsq_backend_t *be, void *out, const void *gate, const void *up,
                      dsq_ftype_t t, int64_t m, int64_t n)
{
    (void)be;
    F32_ONLY(t);
    return dsq_cpu_swiglu(out, gate, up, m, n);
}

static int cpu_add(dsq_backend_t *be, float *y, const void *x, dsq_ftype_t xt, int64_t n)
{
    (void)be;
    F32_ONLY(xt);
    return dsq_cpu_add(y, x, n);
}

static int cpu_gather_cols(dsq_backend_t *be, void *dst, const void *src, dsq_ftype_t t,
                           const int32_t *perm, int64_t m, int64_t k)
{
    (void)be;
    F32_ONLY(t);
    return dsq_cpu_gather_cols(dst, src, perm, m, k);
}

static int cpu_kv_write(dsq_backend_t *be, const dsq_kv_layer_t *kv, const void *k,
                        const void *v, dsq_ftype_t t, const int32_t *slot, int64_t m)
{
    (void)be;
    F32_ONLY(t);
    return dsq_cpu_kv_write(kv, k, v, slot, m);
}

/* The CPU twin has no use for the host copy of row_seq: it walks the rows
 * itself. */
static int cpu_attention(dsq_backend_t *be, void *out, const void *q, dsq_ftype_t t,
                         int64_t m, int n_heads, const dsq_kv_layer_t *kv,
                         const int32_t *row_seq, const int32_t *row_pos,
                         const int32_t *block_tables, int max_blocks, float scale,
                         const int32_t *row_seq_host, const uint8_t *seq_decode_host)
{
    (void)be;
    (void)row_seq_host;
    F32_ONLY(t);
    return dsq_cpu_attention_ex(out, q, m, n_heads, kv, row_seq, row_pos, block_tables,
                                max_blocks, scale, seq_decode_host);
}

const dsq_backend_ops_t dsq__backend_cpu_ops = {
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
#define DSQ_BACKEND_OP(op, params, args, on_cpu, on_cuda) DSQ__BACKEND_SLOT_##on_cpu(cpu, op)
#include "backend_ops.inc"
};

static dsq_backend_t cpu_singleton = {
    .ops = &dsq__backend_cpu_ops,
    .kind = DSQ_BACKEND_CPU,
    .is_singleton = true,
};

dsq_backend_t *dsq_backend_cpu(void) { return &cpu_singleton; }

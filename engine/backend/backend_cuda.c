/* The CUDA backend: device 0, one non-blocking stream, device memory from
 * cudaMalloc, and the kernels/cuda launchers behind the op table. Built
 * only with meson's cuda feature.
 *
 * Every op first points the calling thread's launches at this backend's
 * stream (dsq_cuda_set_stream), so ops queue in call order on it; copies go
 * on the same stream. Attention splits a batch by the host copy of its
 * row_seq: runs of rows of one sequence (prefill chunks) go to the prefill
 * kernel, the rest to the decode kernel. The other entries are generated
 * from backend_ops.inc (column cuda); the DeepSeek-V2 MLA/MoE ops are NONE
 * there (DSQ_EUNSUPPORTED). */
#include "backend_internal.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

typedef struct block {
    void *p;
    size_t bytes;
} block_t;

typedef struct cuda_impl {
    cudaStream_t stream;
    int device;
    char name[256];
    int cc_major, cc_minor;
    size_t total_mem;
    block_t *blocks;            /* live allocations, for their sizes */
    size_t n_blocks, cap_blocks;
} cuda_impl_t;

static cuda_impl_t *impl_of(const dsq_backend_t *be) { return be->impl; }

/* DSQ_OK, or DSQ_ECUDA with the failed call and CUDA's reason logged. */
static int check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return DSQ_OK;
    dsq_log(DSQ_LOG_ERROR, "cuda call=%s error=\"%s\"", what, cudaGetErrorString(e));
    return DSQ_ECUDA;
}

static void on_stream(const dsq_backend_t *be)
{
    dsq_cuda_set_stream((dsq_cuda_stream_t *)impl_of(be)->stream);
}

static void cuda_destroy(dsq_backend_t *be)
{
    cuda_impl_t *c = impl_of(be);
    if (!c)
        return;
    if (c->n_blocks)
        dsq_log(DSQ_LOG_WARN, "backend=cuda event=destroy leaked_blocks=%zu "
                "leaked_bytes=%zu", c->n_blocks, atomic_load(&be->allocated));
    cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < c->n_blocks; i++)
        cudaFree(c->blocks[i].p);
    if (dsq_cuda_get_stream() == (dsq_cuda_stream_t *)c->stream)
        dsq_cuda_set_stream(NULL);
    cudaStreamDestroy(c->stream);
    free(c->blocks);
    free(c);
    be->impl = NULL;
}

static void cuda_describe(const dsq_backend_t *be, char *buf, size_t len)
{
    const cuda_impl_t *c = impl_of(be);
    snprintf(buf, len, "cuda device=%d name=\"%s\" sm_%d%d memory_bytes=%zu", c->device,
             c->name, c->cc_major, c->cc_minor, c->total_mem);
}

static void *cuda_alloc(dsq_backend_t *be, size_t bytes)
{
    cuda_impl_t *c = impl_of(be);
    if (c->n_blocks == c->cap_blocks) {
        size_t cap = c->cap_blocks ? 2 * c->cap_blocks : 256;
        block_t *b = realloc(c->blocks, cap * sizeof(*b));
        if (!b)
            return NULL;
        c->blocks = b;
        c->cap_blocks = cap;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        dsq_log(DSQ_LOG_WARN, "cuda call=cudaMalloc bytes=%zu error=\"%s\"", bytes,
                cudaGetErrorString(e));
        cudaGetLastError();   /* clear the sticky-less allocation error */
        return NULL;
    }
    c->blocks[c->n_blocks++] = (block_t){p, bytes};
    return p;
}

static size_t cuda_free(dsq_backend_t *be, void *p)
{
    cuda_impl_t *c = impl_of(be);
    size_t bytes = 0;
    for (size_t i = c->n_blocks; i-- > 0;) {
        if (c->blocks[i].p == p) {
            bytes = c->blocks[i].bytes;
            c->blocks[i] = c->blocks[--c->n_blocks];
            break;
        }
    }
    cudaStreamSynchronize(c->stream);
    check(cudaFree(p), "cudaFree");
    return bytes;
}

static int cuda_copy_kind(dsq_backend_t *be, void *dst, const void *src, size_t bytes,
                          enum cudaMemcpyKind kind, const char *what)
{
    cuda_impl_t *c = impl_of(be);
    int rc = check(cudaMemcpyAsync(dst, src, bytes, kind, c->stream), what);
    /* host memory involved: wait, so an upload's source may be reused (and
     * a download's result read) on return; the host buffers are pageable,
     * where CUDA would stage the copy anyway */
    if (!rc && kind != cudaMemcpyDeviceToDevice)
        rc = check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return rc;
}

static int cuda_upload(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyHostToDevice, "upload");
}
static int cuda_download(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}
static int cuda_copy(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToDevice, "copy");
}
static int cuda_memset(dsq_backend_t *be, void *dst, int value, size_t bytes)
{
    return check(cudaMemsetAsync(dst, value, bytes, impl_of(be)->stream), "memset");
}
static int cuda_sync(dsq_backend_t *be)
{
    return check(cudaStreamSynchronize(impl_of(be)->stream), "cudaStreamSynchronize");
}

static int cuda_mem_info(dsq_backend_t *be, size_t *free_bytes, size_t *total_bytes)
{
    (void)be;
    return check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

#define BACKEND_BEFORE_OP(be) on_stream(be)
#define DSQ_BACKEND_OP(op, params, args, on_cpu, on_cuda) \
    DSQ__BACKEND_ENTRY_##on_cuda(cuda, op, params, args, dsq_cuda_##op)
#include "backend_ops.inc"

/* Rows [r0, r1) as one launch of the decode or the prefill kernel. */
static int attention_range(void *out, const void *q, dsq_ftype_t t, int64_t r0, int64_t r1,
                           int n_heads, const dsq_kv_layer_t *kv, const int32_t *row_seq,
                           const int32_t *row_pos, const int32_t *block_tables,
                           int max_blocks, float scale, bool prefill)
{
    const size_t off = (size_t)r0 * (size_t)n_heads * (size_t)kv->head_dim * dsq_ftype_size(t);
    int (*fn)(void *, const void *, dsq_ftype_t, int64_t, int, const dsq_kv_layer_t *,
              const int32_t *, const int32_t *, const int32_t *, int, float) =
        prefill ? dsq_cuda_attention_prefill : dsq_cuda_attention;
    return fn((char *)out + off, (const char *)q + off, t, r1 - r0, n_heads, kv,
              row_seq + r0, row_pos + r0, block_tables, max_blocks, scale);
}

static int cuda_attention(dsq_backend_t *be, void *out, const void *q, dsq_ftype_t t,
                          int64_t m, int n_heads, const dsq_kv_layer_t *kv,
                          const int32_t *row_seq, const int32_t *row_pos,
                          const int32_t *block_tables, int max_blocks, float scale,
                          const int32_t *row_seq_host, const uint8_t *seq_decode_host)
{
    (void)seq_decode_host;     /* GPU numerics: runs keep the prefill kernel */
    on_stream(be);
    if (!row_seq_host || m < 2)
        return dsq_cuda_attention(out, q, t, m, n_heads, kv, row_seq, row_pos, block_tables,
                                  max_blocks, scale);
    if (!kv || dsq_ftype_size(t) == 0)
        return DSQ_EINVAL;
    /* maximal segments: runs of >= 2 rows of one sequence are prefill;
     * consecutive single rows form one decode launch */
    int rc = DSQ_OK;
    int64_t seg = 0;
    bool seg_prefill = false;
    for (int64_t i = 0; i < m && !rc;) {
        int64_t j = i + 1;
        while (j < m && row_seq_host[j] == row_seq_host[i])
            j++;
        const bool run = j - i >= 2;
        if (i > seg && run != seg_prefill) {
            rc = attention_range(out, q, t, seg, i, n_heads, kv, row_seq, row_pos,
                                 block_tables, max_blocks, scale, seg_prefill);
            seg = i;
        }
        if (i == seg)
            seg_prefill = run;
        i = j;
    }
    if (!rc)
        rc = attention_range(out, q, t, seg, m, n_heads, kv, row_seq, row_pos, block_tables,
                             max_blocks, scale, seg_prefill);
    return rc;
}

static const dsq_backend_ops_t cuda_ops = {
    .name = "cuda",
    .is_host = false,
    .destroy = cuda_destroy,
    .describe = cuda_describe,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .sync = cuda_sync,
    .mem_info = cuda_mem_info,
#define DSQ_BACKEND_OP(op, params, args, on_cpu, on_cuda) DSQ__BACKEND_SLOT_##on_cuda(cuda, op)
#include "backend_ops.inc"
};

int dsq__backend_cuda_init(dsq_backend_t *be, char *err, size_t err_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        snprintf(err, err_len, "backend: no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0");
        cudaGetLastError();
        return DSQ_EUNSUPPORTED;
    }
    cuda_impl_t *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, err_len, "backend: out of memory");
        return DSQ_ENOMEM;
    }
    struct cudaDeviceProp prop;
    e = cudaSetDevice(0);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, 0);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "backend: CUDA device 0 unusable: %s", cudaGetErrorString(e));
        free(c);
        return DSQ_ECUDA;
    }
    snprintf(c->name, sizeof(c->name), "%s", prop.name);
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    c->total_mem = prop.totalGlobalMem;
    be->ops = &cuda_ops;
    be->impl = c;
    return DSQ_OK;
}

/* Shared by the backend files (backend.c: the public functions, memory
 * accounting and the CPU backend; backend_cuda.c: the CUDA backend). Not
 * an API: the model graphs see only backend.h.
 *
 * A backend is an op table plus the backend's own state. Every public
 * dsq_backend_* op dispatches through the table; a NULL entry answers
 * DSQ_EUNSUPPORTED. Allocation goes through backend.c so that
 * dsq_backend_allocated_bytes counts every byte whichever backend it is. */
#ifndef DSQ_BACKEND_INTERNAL_H
#define DSQ_BACKEND_INTERNAL_H

#include <stdatomic.h>

#include "backend.h"

typedef struct dsq_backend_ops {
    const char *name;
    bool is_host;
    void (*destroy)(dsq_backend_t *be);
    void (*describe)(const dsq_backend_t *be, char *buf, size_t len);
    /* raw allocation; free returns the bytes the pointer held */
    void *(*alloc)(dsq_backend_t *be, size_t bytes);
    size_t (*free)(dsq_backend_t *be, void *p);
    int (*upload)(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
    int (*download)(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
    int (*copy)(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
    int (*memset)(dsq_backend_t *be, void *dst, int value, size_t bytes);
    int (*sync)(dsq_backend_t *be);
    int (*mem_info)(dsq_backend_t *be, size_t *free_bytes, size_t *total_bytes);

    int (*matmul)(dsq_backend_t *be, float *y, const float *x, int64_t m,
                  const dsq_weight_t *w);
    int (*embed)(dsq_backend_t *be, float *out, const dsq_weight_t *emb,
                 const int32_t *ids, int64_t m);
    int (*rmsnorm)(dsq_backend_t *be, float *y, const float *x, const float *w,
                   int64_t m, int64_t n, float eps);
    int (*rope)(dsq_backend_t *be, float *x, int64_t m, int n_heads, int head_dim,
                const int32_t *pos, const dsq_rope_t *p);
    int (*swiglu)(dsq_backend_t *be, float *out, const float *gate, const float *up,
                  int64_t m, int64_t n);
    int (*add)(dsq_backend_t *be, float *y, const float *x, int64_t n);
    int (*softmax)(dsq_backend_t *be, float *x, int64_t m, int64_t n);
    int (*gather_rows)(dsq_backend_t *be, float *dst, const float *src,
                       const int32_t *rows, int64_t m, int64_t width, int64_t n_src);
    int (*gather_cols)(dsq_backend_t *be, float *dst, const float *src,
                       const int32_t *perm, int64_t m, int64_t k);
    int (*kv_write)(dsq_backend_t *be, const dsq_kv_layer_t *kv, const float *k,
                    const float *v, const int32_t *slot, int64_t m);
    int (*attention)(dsq_backend_t *be, float *out, const float *q, int64_t m,
                     int n_heads, const dsq_kv_layer_t *kv, const int32_t *row_seq,
                     const int32_t *row_pos, const int32_t *block_tables,
                     int max_blocks, float scale, const int32_t *row_seq_host);
    int (*mla_attention)(dsq_backend_t *be, float *out, const float *q, int64_t m,
                         int n_heads, int kv_lora_rank, const dsq_kv_layer_t *kv,
                         const int32_t *row_seq, const int32_t *row_pos,
                         const int32_t *block_tables, int max_blocks, float scale);
    int (*mla_kv_write)(dsq_backend_t *be, const dsq_kv_layer_t *kv,
                        const float *latent, const int32_t *slot, int64_t m);
    int (*mla_kv_read)(dsq_backend_t *be, const dsq_kv_layer_t *kv, const int32_t *slot,
                       int64_t m, float *out);
    int (*mla_attention_dense)(dsq_backend_t *be, float *out, const float *q, int64_t m,
                               int n_heads, const int32_t *row_pos, const float *kv,
                               const float *k_pe, int64_t n_ctx, int qk_nope_dim,
                               int qk_rope_dim, int v_dim, float scale);
    int (*moe_route)(dsq_backend_t *be, int32_t *ids, float *weights,
                     const float *logits, int64_t m, const dsq_moe_route_t *p);
    int (*moe_group)(dsq_backend_t *be, int32_t *offsets, int32_t *rows,
                     float *row_weights, const int32_t *ids, const float *weights,
                     int64_t m, int top_k, int n_experts);
} dsq_backend_ops_t;

/* Visible to every thread that shares the backend (the CPU singleton):
 * the counters are atomic, the rest is written once at creation. */
struct dsq_backend {
    const dsq_backend_ops_t *ops;
    dsq_backend_kind_t kind;
    bool is_singleton;         /* dsq_backend_cpu(): destroy is a no-op */
    atomic_size_t allocated;   /* bytes held now                        */
    atomic_size_t peak;        /* most bytes held at once               */
    void *impl;                /* the backend's own state               */
};

/* The CUDA backend (backend_cuda.c; only in CUDA builds): fills *be or
 * returns an error with a one-line reason in err. */
int dsq__backend_cuda_init(dsq_backend_t *be, char *err, size_t err_len);

#endif

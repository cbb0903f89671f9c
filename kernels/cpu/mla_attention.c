/* Multi-head latent attention (DeepSeek-V2 MLA) over the paged latent cache,
 * in the absorbed form, on the CPU.
 *
 * The cache holds, per token, one vector of D = kv_lora_rank + rope dims:
 * the normalised KV latent c followed by the RoPE'd decoupled key k_pe (a
 * dsq_kv_layer_t with n_kv_heads = 1 and no V pool). With W_UK folded into
 * the query (q_h = [W_UK_h^T q_nope_h, q_pe_h]) every head's score is one
 * D-long dot product with the cached vector, and its output is the
 * softmax-weighted sum of the cached latents (the first kv_lora_rank
 * values of the same vector); W_UV is applied by the caller afterwards. So
 * the latent is never expanded per head (DeepSeek-V2 paper, section 2.1.2,
 * "absorb W_UK into W_Q and W_UV into W_O").
 *
 * One task is one query row and a chunk of its heads, run through the
 * attention row kernel of kernels/cpu/attention_chunk.c (dsq__att_ops):
 * per block of DSQ__ATT_BK cached vectors, every head of the chunk scores
 * the block with the vectors read once, then accumulates them (online
 * softmax: running max and sum, one rescale per block). The cached vector
 * serves as key and as value, so the heads share each load twice.
 * Tasks are claimed through an atomic counter inside dsq__parallel
 * (kernels/cpu/cpu_internal.h); results do not depend on the thread count.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

/* Dequantise the cached vector of slot t into dst[D]. */
static void load_latent(float *dst, const dsq_kv_layer_t *kv, int64_t t,
                        int n_groups, const dsq__vec_ops_t *ops)
{
    const int D = kv->head_dim;
    if (kv->dtype == DSQ_KV_F16) {
        ops->f16(dst, (const uint16_t *)kv->k + t * D, D);
        return;
    }
    if (kv->dtype == DSQ_KV_F32) {
        memcpy(dst, (const float *)kv->k + t * D, (size_t)D * sizeof(*dst));
        return;
    }
    const int gs = D / n_groups;
    const int8_t *q = (const int8_t *)kv->k + t * D;
    for (int g = 0; g < n_groups; g++) {
        const float s = dsq__h2f(kv->k_scale[t * n_groups + g]);
        const float z = dsq__h2f(kv->k_zero[t * n_groups + g]);
        for (int i = g * gs; i < (g + 1) * gs; i++)
            dst[i] = ((float)q[i] - z) * s;
    }
}

typedef struct scratch {
    float *qs, *acc;  /* [G][D]: scaled queries, unnormalised output    */
    float *mx, *l;    /* [G]                                            */
    float *kb;        /* [DSQ__ATT_BK][D]: an INT8 chunk, dequantised    */
    float *ws;        /* DSQ__ATT_ROW_WS(G, D)                          */
} scratch_t;

/* Floats of one task's scratch for G heads of dimension D. */
static size_t scratch_floats(int G, int D)
{
    return 2 * (size_t)G * D + 2 * (size_t)G + (size_t)DSQ__ATT_BK * D +
           DSQ__ATT_ROW_WS(G, D);
}

/* G heads of one query row: q [G][D] -> out [G][R]. The context runs in
 * chunks of DSQ__ATT_BK positions through the attention row kernel
 * (dsq__att_ops: every head of the chunk scores a block of cached
 * vectors read once, then accumulates them), with keys and values the
 * same cached vectors: the values' last D - R elements (k_pe) are
 * accumulated too and dropped, cheaper than a second kernel. */
static void attend_row(float *out, const float *q, const dsq_kv_layer_t *kv,
                       int G, int R, const int32_t *btab, int32_t pos, float scale,
                       int n_groups, const dsq__vec_ops_t *ops, const dsq__att_ops_t *k,
                       scratch_t *w)
{
    const int D = kv->head_dim, bs = kv->block_size, BK = DSQ__ATT_BK;
    for (int i = 0; i < G * D; i++) {
        w->qs[i] = q[i] * scale;
        w->acc[i] = 0.0f;
    }
    for (int g = 0; g < G; g++) {
        w->mx[g] = -INFINITY;
        w->l[g] = 0.0f;
    }
    /* FP16 and FP32 vectors are read in place (the next chunk's
     * prefetched by the kernel); INT8 ones dequantised into kb first */
    const bool f16 = kv->dtype == DSQ_KV_F16, i8 = kv->dtype == DSQ_KV_INT8;
    const size_t es = f16 ? 2 : 4;
    const void *rows[2 * DSQ__ATT_BK];
    for (int32_t p0 = 0; p0 <= pos; p0 += BK) {
        const int nj = pos + 1 - p0 < BK ? pos + 1 - p0 : BK;
        const int rest = pos + 1 - p0 - nj;
        const int nj_next = i8 ? 0 : rest < BK ? rest : BK;
        for (int j = 0; j < nj + nj_next; j++) {
            const int32_t p = p0 + j;
            const int64_t t = (int64_t)btab[p / bs] * bs + p % bs;
            if (i8) {
                load_latent(w->kb + (int64_t)j * D, kv, t, n_groups, ops);
                rows[j] = w->kb + (int64_t)j * D;
            } else {
                rows[j] = (const char *)kv->k + t * D * (int64_t)es;
            }
        }
        k->row(w->acc, w->mx, w->l, w->qs, G, D, rows, rows, f16, nj, nj_next, w->ws);
    }
    for (int g = 0; g < G; g++) {
        const float inv = 1.0f / w->l[g];
        for (int i = 0; i < R; i++)
            out[(size_t)g * R + i] = w->acc[(size_t)g * D + i] * inv;
    }
}

struct mla_ctx {
    float *out;
    const float *q;
    const dsq_kv_layer_t *kv;
    const int32_t *row_seq, *row_pos, *block_tables;
    int max_blocks, n_heads, R, chunk, n_chunks, n_groups;
    float scale;
    const dsq__vec_ops_t *ops;
    const dsq__att_ops_t *k;
    int64_t n_tasks;
    float *mem;
    size_t per_thr;
    _Atomic int64_t next;
};

static void mla_region(void *p, int tid, int n_thr)
{
    struct mla_ctx *c = p;
    (void)n_thr;
    const int D = c->kv->head_dim, chunk = c->chunk, R = c->R;
    scratch_t w;
    w.qs = c->mem + (size_t)tid * c->per_thr;
    w.acc = w.qs + (size_t)chunk * D;
    w.mx = w.acc + (size_t)chunk * D;
    w.l = w.mx + chunk;
    w.kb = w.l + chunk;
    w.ws = w.kb + (size_t)DSQ__ATT_BK * D;
    for (;;) {
        const int64_t task = atomic_fetch_add_explicit(&c->next, 1,
                                                       memory_order_relaxed);
        if (task >= c->n_tasks)
            break;
        const int64_t i = task / c->n_chunks;
        const int ci = (int)(task % c->n_chunks);
        const int h0 = ci * chunk;
        const int nh = h0 + chunk <= c->n_heads ? chunk : c->n_heads - h0;
        attend_row(c->out + (i * c->n_heads + h0) * (int64_t)R,
                   c->q + (i * c->n_heads + h0) * (int64_t)D, c->kv, nh, R,
                   c->block_tables + (int64_t)c->row_seq[i] * c->max_blocks,
                   c->row_pos[i], c->scale, c->n_groups, c->ops, c->k, &w);
    }
}

static int check_layer(const dsq_kv_layer_t *kv)
{
    if (!kv || !kv->k || kv->n_kv_heads != 1 || kv->head_dim < 1 ||
        kv->block_size < 1 || kv->n_blocks < 0)
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_INT8 && (!kv->k_scale || !kv->k_zero))
        return DSQ_EINVAL;
    if (kv->dtype != DSQ_KV_F16 && kv->dtype != DSQ_KV_INT8 && kv->dtype != DSQ_KV_F32)
        return DSQ_EINVAL;
    return DSQ_OK;
}

int dsq_cpu_mla_attention(float *out, const float *q, int64_t m, int n_heads,
                          int kv_lora_rank, const dsq_kv_layer_t *kv,
                          const int32_t *row_seq, const int32_t *row_pos,
                          const int32_t *block_tables, int max_blocks, float scale)
{
    int rc = check_layer(kv);
    if (rc == DSQ_OK && (!out || !q || !row_seq || !row_pos || !block_tables ||
                         m < 0 || n_heads < 1 || max_blocks < 1 ||
                         kv_lora_rank < 1 || kv_lora_rank > kv->head_dim))
        rc = DSQ_EINVAL;
    for (int64_t i = 0; rc == DSQ_OK && i < m; i++) {
        if (row_seq[i] < 0) {
            rc = DSQ_EINVAL;
            break;
        }
        if (row_pos[i] < 0 || row_pos[i] >= (int64_t)max_blocks * kv->block_size) {
            rc = DSQ_ERANGE;
            break;
        }
        const int32_t *bt = block_tables + (int64_t)row_seq[i] * max_blocks;
        for (int b = 0; b <= row_pos[i] / kv->block_size; b++)
            if (bt[b] < 0 || bt[b] >= kv->n_blocks)
                rc = DSQ_ERANGE;
    }
    if (rc != DSQ_OK || m == 0)
        return rc;

    const dsq__vec_ops_t *ops = dsq__vec_ops();
    const int D = kv->head_dim, R = kv_lora_rank;
    int64_t work = 0;
    for (int64_t i = 0; i < m; i++)
        work += ((int64_t)row_pos[i] + 1) * n_heads * (D + R);
    int n_thr = work < 65536 ? 1 : dsq_cpu_get_threads();
    /* Few rows (decode): split the heads so every thread has a task, at
     * the price of reading the cache once per chunk; no further, since
     * the row kernel gains from many heads a task (V2-Lite's 16 heads at
     * 2 threads: 8 a task run 1.5-2x faster than 4, 2026-12-06). */
    int chunk = n_heads;
    while (chunk > 1 && m * ((n_heads + chunk - 1) / chunk) < (int64_t)n_thr)
        chunk = (chunk + 1) / 2;
    const int n_chunks = (n_heads + chunk - 1) / chunk;
    const int64_t n_tasks = m * n_chunks;
    if (n_tasks < n_thr)
        n_thr = (int)n_tasks;
    const size_t per_thr = scratch_floats(chunk, D);
    float *mem = malloc(sizeof(*mem) * per_thr * (size_t)n_thr);
    if (!mem)
        return DSQ_ENOMEM;
    struct mla_ctx c = {out, q, kv, row_seq, row_pos, block_tables, max_blocks,
                        n_heads, R, chunk, n_chunks, dsq_kv_n_groups(D), scale,
                        ops, dsq__att_ops(), n_tasks, mem, per_thr, 0};
    dsq__parallel(n_thr, mla_region, &c);
    free(mem);
    return DSQ_OK;
}

int dsq_cpu_mla_kv_write(const dsq_kv_layer_t *kv, const float *latent,
                         const int32_t *slot, int64_t m)
{
    int rc = check_layer(kv);
    if (rc != DSQ_OK || !latent || !slot || m < 0)
        return rc != DSQ_OK ? rc : DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_F32) {
        const int64_t n_slots = kv->n_blocks * kv->block_size, D = kv->head_dim;
        for (int64_t i = 0; i < m; i++)
            if (slot[i] < 0 || slot[i] >= n_slots)
                return DSQ_ERANGE;
        for (int64_t i = 0; i < m; i++)
            memcpy((float *)kv->k + slot[i] * D, latent + i * D,
                   (size_t)D * sizeof(*latent));
        return DSQ_OK;
    }
    /* The K-and-V writer with V aliased onto K: the same row goes to the
     * same place twice (identical bits), so the shared writer's rounding
     * and INT8 scheme apply unchanged to the latent cache. */
    dsq_kv_layer_t one = *kv;
    one.v = one.k;
    one.v_scale = one.k_scale;
    one.v_zero = one.k_zero;
    return dsq_cpu_kv_write(&one, latent, latent, slot, m);
}

int dsq_cpu_mla_kv_read(const dsq_kv_layer_t *kv, const int32_t *slot, int64_t m,
                        float *out)
{
    int rc = check_layer(kv);
    if (rc != DSQ_OK || !slot || !out || m < 0)
        return rc != DSQ_OK ? rc : DSQ_EINVAL;
    const int64_t n_slots = kv->n_blocks * kv->block_size;
    for (int64_t i = 0; i < m; i++)
        if (slot[i] < 0 || slot[i] >= n_slots)
            return DSQ_ERANGE;
    const dsq__vec_ops_t *ops = dsq__vec_ops();
    const int n_groups = dsq_kv_n_groups(kv->head_dim);
    for (int64_t i = 0; i < m; i++)
        load_latent(out + i * kv->head_dim, kv, slot[i], n_groups, ops);
    return DSQ_OK;
}

/* ------------------------------------------- expanded (prefill) form */

struct dense_ctx {
    float *out;
    const float *q, *kv, *k_pe;
    const int32_t *row_pos;
    int n_heads, dn, dr, dv;
    int64_t n_ctx;
    float scale;
    const dsq__vec_ops_t *ops;
    _Atomic int failed;
};

static void dense_tasks(void *p, int64_t i0, int64_t i1)
{
    struct dense_ctx *c = p;
    const int H = c->n_heads, dn = c->dn, dr = c->dr, dv = c->dv;
    const int64_t kvw = (int64_t)H * (dn + dv);
    float *sc = malloc(sizeof(*sc) * (size_t)c->n_ctx);
    if (!sc) {
        atomic_store(&c->failed, 1);
        return;
    }
    for (int64_t task = i0; task < i1; task++) {
        const int64_t i = task / H;
        const int h = (int)(task % H);
        const float *q = c->q + (i * H + h) * (int64_t)(dn + dr);
        const int64_t n = (int64_t)c->row_pos[i] + 1;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            const float *k = c->kv + t * kvw + (int64_t)h * (dn + dv);
            sc[t] = (c->ops->dot(q, k, dn) + c->ops->dot(q + dn, c->k_pe + t * dr, dr)) *
                    c->scale;
            mx = sc[t] > mx ? sc[t] : mx;
        }
        float *o = c->out + (i * H + h) * (int64_t)dv;
        for (int j = 0; j < dv; j++)
            o[j] = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            sc[t] = expf(sc[t] - mx);
            sum += sc[t];
        }
        for (int64_t t = 0; t < n; t++)
            c->ops->axpy(o, sc[t], c->kv + t * kvw + (int64_t)h * (dn + dv) + dn, dv);
        const float inv = 1.0f / sum;
        for (int j = 0; j < dv; j++)
            o[j] *= inv;
    }
    free(sc);
}

int dsq_cpu_mla_attention_dense(float *out, const float *q, int64_t m, int n_heads,
                                const int32_t *row_pos, const float *kv,
                                const float *k_pe, int64_t n_ctx, int qk_nope_dim,
                                int qk_rope_dim, int v_dim, float scale)
{
    if (!out || !q || !row_pos || !kv || !k_pe || m < 0 || n_heads < 1 ||
        qk_nope_dim < 0 || qk_rope_dim < 1 || v_dim < 1 || n_ctx < 1)
        return DSQ_EINVAL;
    for (int64_t i = 0; i < m; i++)
        if (row_pos[i] < 0 || row_pos[i] >= n_ctx)
            return DSQ_ERANGE;
    const dsq__vec_ops_t *ops = dsq__vec_ops();
    struct dense_ctx c = {out, q, kv, k_pe, row_pos, n_heads, qk_nope_dim, qk_rope_dim,
                          v_dim, n_ctx, scale, ops, 0};
    /* a task is (row, head); ~n_ctx * (dn + dr + dv) flops each */
    const int64_t per_task = n_ctx * (qk_nope_dim + qk_rope_dim + v_dim);
    dsq__parallel_for(m * n_heads, per_task >= 16384 ? 1 : 16384 / per_task + 1,
                      dense_tasks, &c);
    return atomic_load(&c.failed) ? DSQ_ENOMEM : DSQ_OK;
}

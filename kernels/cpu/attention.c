/* Paged causal attention on the CPU (GQA, FP16 or INT8 KV cache).
 *
 * One task is one (query row, kv head) pair: the n_heads/n_kv_heads query
 * heads that share a kv head are processed together, so each cached key and
 * value is dequantised once per task however large the GQA ratio (when
 * there are fewer tasks than threads, the heads are split into chunks). Positions
 * are walked block by block through the sequence's block table with an
 * online softmax (running max m, running sum l; Milakov & Gimelshein 2018,
 * FlashAttention): per block, scores for all its tokens, one rescale of the
 * accumulator if the max grew, then the weighted V sum. Memory per thread is
 * the accumulator plus one block of scores, independent of context length.
 * Tasks are handed out by an atomic counter (rows attend to different
 * lengths); a small total (decode at short context) runs inline, without a
 * thread-pool dispatch.
 * Dot products, axpy and fp16/int8 dequantisation have AVX2+FMA+F16C
 * versions picked at run time from dsq__cpu_isa_level(), scalar otherwise. */
#include <math.h>
#include <string.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

/* -------------------------------------------------------------- the op */

/* Dequantise head kh of slot t (K or V) into dst[head_dim]. */
static void load_kv(float *dst, const dsq_kv_layer_t *kv, const void *base,
                    const uint16_t *sc, const uint16_t *zr, int64_t t, int kh,
                    int n_groups, const dsq__vec_ops_t *ops)
{
    const int D = kv->head_dim;
    const int64_t e = (t * kv->n_kv_heads + kh) * (int64_t)D;
    if (kv->dtype == DSQ_KV_F16) {
        ops->f16(dst, (const uint16_t *)base + e, D);
        return;
    }
    if (kv->dtype == DSQ_KV_F32) {
        memcpy(dst, (const float *)base + e, (size_t)D * sizeof(float));
        return;
    }
    const int gs = D / n_groups;
    const int64_t g0 = (t * kv->n_kv_heads + kh) * (int64_t)n_groups;
    for (int g = 0; g < n_groups; g++) {
        float s = dsq__h2f(sc[g0 + g]);
        float c = -dsq__h2f(zr[g0 + g]) * s;
        ops->i8(dst + g * gs, (const int8_t *)base + e + g * gs, s, c, gs);
    }
}

/* Per-thread scratch. */
typedef struct scratch {
    float *acc;     /* [G][D]          */
    float *kbuf;    /* [D]             */
    float *sc;      /* [G][block_size] */
    float *mx, *l;  /* [G]             */
} scratch_t;

/* The unnormalised online-softmax state of query heads [G] of kv head kh
 * over the sequence's blocks [b0, b1) (positions up to pos): w->acc [G][D]
 * (sum of weights x V), w->mx [G] (running max, -inf for an empty range),
 * w->l [G] (sum of weights relative to mx). */
static void attend_range(const float *q, const dsq_kv_layer_t *kv, int G, int kh,
                         const int32_t *btab, int32_t pos, int b0, int b1, float scale,
                         int n_groups, const dsq__vec_ops_t *ops, scratch_t *w)
{
    const int D = kv->head_dim, bs = kv->block_size;
    for (int i = 0; i < G * D; i++)
        w->acc[i] = 0.0f;
    for (int g = 0; g < G; g++) {
        w->mx[g] = -INFINITY;
        w->l[g] = 0.0f;
    }
    const int n_blk = pos / bs + 1;
    /* FP16 cache with a fused path: keys and values read in
     * place, each once per tile of query heads */
    const bool fused = kv->dtype == DSQ_KV_F16 && ops->f16_scores && D % 8 == 0;
    const int64_t tstride = (int64_t)kv->n_kv_heads * D;
    for (int b = b0; b < b1; b++) {
        const int n_t = (b == n_blk - 1) ? pos - b * bs + 1 : bs;
        const int64_t t0 = (int64_t)btab[b] * bs;
        if (fused)
            ops->f16_scores(w->sc, bs, q, G, D,
                            (const uint16_t *)kv->k + (t0 * kv->n_kv_heads + kh) * D, tstride,
                            n_t, scale);
        for (int j = 0; !fused && j < n_t; j++) {
            load_kv(w->kbuf, kv, kv->k, kv->k_scale, kv->k_zero, t0 + j, kh,
                    n_groups, ops);
            for (int g = 0; g < G; g++)
                w->sc[g * bs + j] = ops->dot(q + g * D, w->kbuf, D) * scale;
        }
        for (int g = 0; g < G; g++) {
            float *s = w->sc + g * bs;
            float bm = s[0];
            for (int j = 1; j < n_t; j++)
                bm = s[j] > bm ? s[j] : bm;
            if (bm > w->mx[g]) {
                float corr = expf(w->mx[g] - bm);   /* 0 on the first block */
                w->l[g] *= corr;
                float *a = w->acc + g * D;
                for (int i = 0; i < D; i++)
                    a[i] *= corr;
                w->mx[g] = bm;
            }
            float sum = 0.0f;
            for (int j = 0; j < n_t; j++) {
                s[j] = expf(s[j] - w->mx[g]);
                sum += s[j];
            }
            w->l[g] += sum;
        }
        if (fused)
            ops->f16_wsum(w->acc, G, D, w->sc, bs,
                          (const uint16_t *)kv->v + (t0 * kv->n_kv_heads + kh) * D, tstride, n_t);
        for (int j = 0; !fused && j < n_t; j++) {
            load_kv(w->kbuf, kv, kv->v, kv->v_scale, kv->v_zero, t0 + j, kh,
                    n_groups, ops);
            for (int g = 0; g < G; g++)
                ops->axpy(w->acc + g * D, w->sc[g * bs + j], w->kbuf, D);
        }
    }
}

static void attend_one(float *out, const float *q, const dsq_kv_layer_t *kv,
                       int G, int kh, const int32_t *btab, int32_t pos,
                       float scale, int n_groups, const dsq__vec_ops_t *ops,
                       scratch_t *w)
{
    const int D = kv->head_dim;
    attend_range(q, kv, G, kh, btab, pos, 0, pos / kv->block_size + 1, scale, n_groups, ops,
                 w);
    for (int g = 0; g < G; g++) {
        const float inv = 1.0f / w->l[g];
        for (int i = 0; i < D; i++)
            out[g * D + i] = w->acc[g * D + i] * inv;
    }
}

static int check_args(const float *out, const float *q, int64_t m, int n_heads,
                      const dsq_kv_layer_t *kv, const int32_t *row_seq,
                      const int32_t *row_pos, const int32_t *block_tables,
                      int max_blocks)
{
    if (!out || !q || !kv || !row_seq || !row_pos || !block_tables || m < 0 ||
        n_heads < 1 || kv->n_kv_heads < 1 || n_heads % kv->n_kv_heads ||
        kv->head_dim < 1 || kv->block_size < 1 || max_blocks < 1 ||
        !kv->k || !kv->v)
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_INT8 &&
        (!kv->k_scale || !kv->k_zero || !kv->v_scale || !kv->v_zero))
        return DSQ_EINVAL;
    if (kv->dtype != DSQ_KV_F16 && kv->dtype != DSQ_KV_INT8 && kv->dtype != DSQ_KV_F32)
        return DSQ_EINVAL;
    for (int64_t i = 0; i < m; i++) {
        if (row_seq[i] < 0)
            return DSQ_EINVAL;
        if (row_pos[i] < 0 || row_pos[i] >= (int64_t)max_blocks * kv->block_size)
            return DSQ_ERANGE;
        const int32_t *bt = block_tables + (int64_t)row_seq[i] * max_blocks;
        for (int b = 0; b <= row_pos[i] / kv->block_size; b++)
            if (bt[b] < 0 || bt[b] >= kv->n_blocks)
                return DSQ_ERANGE;
    }
    return DSQ_OK;
}

struct att_ctx {
    float *out;
    const float *q;
    const dsq_kv_layer_t *kv;
    const int32_t *row_seq, *row_pos, *block_tables;
    int max_blocks;
    float scale;
    const dsq__vec_ops_t *ops;
    int G, chunk, n_chunks;
    int n_parts;           /* > 1: each (row, kv head) split by KV range */
    float *part;           /* [row][kv head][part]: acc [G][D], mx [G], l [G] */
    int64_t n_tasks;
    int n_groups;
    int64_t row;
    float *mem;            /* [n_thr][per_thr] scratch */
    size_t per_thr;
    _Atomic int64_t next;  /* next task to hand out */
};

static void att_region(void *p, int tid, int n_thr)
{
    struct att_ctx *c = p;
    (void)n_thr;
    const int D = c->kv->head_dim, n_kv = c->kv->n_kv_heads, chunk = c->chunk;
    scratch_t w;
    w.acc = c->mem + (size_t)tid * c->per_thr;
    w.kbuf = w.acc + (size_t)chunk * D;
    w.sc = w.kbuf + D;
    w.mx = w.sc + (size_t)chunk * c->kv->block_size;
    w.l = w.mx + chunk;
    for (;;) {
        const int64_t task = atomic_fetch_add_explicit(&c->next, 1,
                                                       memory_order_relaxed);
        if (task >= c->n_tasks)
            break;
        if (c->n_parts > 1) {
            /* flash-decoding: part p of (row i, kv head kh) attends to its
             * share of the blocks; the parts are merged after the region */
            const int64_t i = task / ((int64_t)n_kv * c->n_parts);
            const int kh = (int)(task / c->n_parts % n_kv);
            const int p = (int)(task % c->n_parts);
            const int G = c->G;
            const int n_blk = c->row_pos[i] / c->kv->block_size + 1;
            const int b0 = (int)((int64_t)n_blk * p / c->n_parts);
            const int b1 = (int)((int64_t)n_blk * (p + 1) / c->n_parts);
            const int64_t off = i * c->row + (int64_t)kh * G * D;
            attend_range(c->q + off, c->kv, G, kh,
                         c->block_tables + (int64_t)c->row_seq[i] * c->max_blocks,
                         c->row_pos[i], b0, b1, c->scale, c->n_groups, c->ops, &w);
            float *dst = c->part + (size_t)task * ((size_t)G * D + 2 * (size_t)G);
            memcpy(dst, w.acc, sizeof(float) * (size_t)G * D);
            memcpy(dst + (size_t)G * D, w.mx, sizeof(float) * (size_t)G);
            memcpy(dst + (size_t)G * D + G, w.l, sizeof(float) * (size_t)G);
            continue;
        }
        const int64_t i = task / ((int64_t)n_kv * c->n_chunks);
        const int kh = (int)(task / c->n_chunks % n_kv);
        const int ci = (int)(task % c->n_chunks);
        const int h0 = kh * c->G + ci * chunk;
        const int nh = (ci + 1) * chunk <= c->G ? chunk : c->G - ci * chunk;
        const int64_t off = i * c->row + (int64_t)h0 * D;
        attend_one(c->out + off, c->q + off, c->kv, nh, kh,
                   c->block_tables + (int64_t)c->row_seq[i] * c->max_blocks,
                   c->row_pos[i], c->scale, c->n_groups, c->ops, &w);
    }
}

int dsq_cpu_attention(float *out, const float *q, int64_t m, int n_heads,
                      const dsq_kv_layer_t *kv, const int32_t *row_seq,
                      const int32_t *row_pos, const int32_t *block_tables,
                      int max_blocks, float scale)
{
    int rc = check_args(out, q, m, n_heads, kv, row_seq, row_pos, block_tables,
                        max_blocks);
    if (rc != DSQ_OK || m == 0)
        return rc;

    const dsq__vec_ops_t *ops = dsq__vec_ops();
    const int n_kv = kv->n_kv_heads, D = kv->head_dim;
    const int G = n_heads / n_kv;
    const int n_groups = dsq_kv_n_groups(D);
    const int64_t row = (int64_t)n_heads * D;
    /* Few (row, kv head) tasks (a decode step of one sequence, MLA's single
     * kv head): split the query heads of a kv head into chunks so every
     * thread gets work, at the price of dequantising K/V once per chunk.
     * Below ~64k multiply-adds in all, one thread does everything. */
    int64_t work = 0;
    for (int64_t i = 0; i < m; i++)
        work += ((int64_t)row_pos[i] + 1) * row;
    int n_thr = work < 65536 ? 1 : dsq_cpu_get_threads();
    /* few (row, kv head) pairs over a long context (a decode
     * step of one sequence): split each pair's KV range across the
     * threads instead of its query heads, so every key and value is read
     * once (a head split reads the pair's whole cache once per chunk), and
     * merge the parts' softmax states after (flash-decoding: Dao et al.,
     * "Flash-Decoding for long-context inference", 2023). Parts keep at
     * least 8 blocks each. */
    int n_parts = 1;
    if (n_thr > 1 && m * n_kv < 2 * (int64_t)n_thr) {
        int32_t min_blk = INT32_MAX;
        for (int64_t i = 0; i < m; i++) {
            int32_t nb = row_pos[i] / kv->block_size + 1;
            min_blk = nb < min_blk ? nb : min_blk;
        }
        int want = (int)((2 * (int64_t)n_thr + m * n_kv - 1) / (m * n_kv));
        while (want > 1 && min_blk / want < 8)
            want--;
        n_parts = want;
    }
    int chunk = G;
    while (n_parts == 1 && chunk > 1 && m * n_kv * ((G + chunk - 1) / chunk) < 2 * (int64_t)n_thr)
        chunk = (chunk + 1) / 2;
    const int n_chunks = (G + chunk - 1) / chunk;
    const int64_t n_tasks = m * n_kv * (n_parts > 1 ? n_parts : n_chunks);
    if (n_tasks < n_thr)
        n_thr = (int)n_tasks;
    const size_t per_thr = (size_t)chunk * D + D + (size_t)chunk * kv->block_size +
                           2 * (size_t)chunk;
    const size_t per_part = (size_t)G * D + 2 * (size_t)G;
    float *mem = malloc(sizeof(*mem) * (per_thr * (size_t)n_thr +
                                        (n_parts > 1 ? per_part * (size_t)n_tasks : 0)));
    if (!mem)
        return DSQ_ENOMEM;
    struct att_ctx c = {out, q, kv, row_seq, row_pos, block_tables, max_blocks,
                        scale, ops, G, chunk, n_chunks, n_parts,
                        mem + per_thr * (size_t)n_thr, n_tasks, n_groups, row,
                        mem, per_thr, 0};
    dsq__parallel(n_thr, att_region, &c);
    /* merge: out = sum_p e^(mx_p - M) acc_p / sum_p e^(mx_p - M) l_p */
    for (int64_t pair = 0; n_parts > 1 && pair < m * n_kv; pair++) {
        const float *pp = c.part + (size_t)pair * n_parts * per_part;
        float *o = out + (pair / n_kv) * row + (int64_t)(pair % n_kv) * G * D;
        for (int g = 0; g < G; g++) {
            float M = -INFINITY, L = 0.0f;
            for (int p = 0; p < n_parts; p++) {
                float mp = pp[p * per_part + (size_t)G * D + g];
                M = mp > M ? mp : M;
            }
            for (int d = 0; d < D; d++)
                o[g * D + d] = 0.0f;
            for (int p = 0; p < n_parts; p++) {
                const float *a = pp + p * per_part;
                float mp = a[(size_t)G * D + g];
                if (mp == -INFINITY)
                    continue;                 /* an empty range */
                float f = expf(mp - M);
                L += f * a[(size_t)G * D + G + g];
                ops->axpy(o + g * D, f, a + (size_t)g * D, D);
            }
            const float inv = 1.0f / L;
            for (int d = 0; d < D; d++)
                o[g * D + d] *= inv;
        }
    }
    free(mem);
    return rc;
}

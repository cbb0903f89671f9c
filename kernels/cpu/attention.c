/* Paged causal attention on the CPU (GQA; FP16, INT8 or F32 KV cache).
 *
 * Rows are first sorted into prefill runs (two or more consecutive rows of
 * one sequence with increasing positions), which attention_prefill.c
 * computes in tiles, and single rows (decode), computed here. Both walk a
 * row's context in chunks of DSQ__ATT_BK positions with the kernels of
 * attention_chunk.c and do the same arithmetic per query head, so a row's
 * output does not depend on which path, batch or tile it was in.
 *
 * Decode: one task is one (row, kv head) pair: the n_heads/n_kv_heads
 * query heads that share a kv head are processed together, so each cached
 * key and value is dequantised once per task however large the GQA ratio
 * (when there are fewer tasks than threads, the heads are split into
 * chunks, or the context into parts, below). Chunks are walked through the
 * sequence's block table with an online softmax (running max m, running
 * sum l; Milakov & Gimelshein 2018, FlashAttention). Memory per thread is
 * the accumulator plus one chunk of K, V and scores, independent of
 * context length. Tasks are handed out by an atomic counter (rows attend
 * to different lengths); a small total (decode at short context) runs
 * inline, without a thread-pool dispatch. */
#include <math.h>
#include <string.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

#define BK DSQ__ATT_BK

void dsq__kv_load(float *dst, const dsq_kv_layer_t *kv, bool is_v, int64_t t, int kh,
                  const dsq__vec_ops_t *ops)
{
    const int D = kv->head_dim, n_groups = dsq_kv_n_groups(D);
    const void *base = is_v ? kv->v : kv->k;
    const uint16_t *sc = is_v ? kv->v_scale : kv->k_scale;
    const uint16_t *zr = is_v ? kv->v_zero : kv->k_zero;
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

void dsq__kv_load_chunk(float *dst, const dsq_kv_layer_t *kv, bool is_v,
                        const int32_t *btab, int32_t p0, int nj, int kh,
                        const dsq__vec_ops_t *ops)
{
    const int bs = kv->block_size, D = kv->head_dim;
    for (int j = 0; j < nj; j++) {
        const int32_t p = p0 + j;
        const int64_t t = (int64_t)btab[p / bs] * bs + p % bs;
        dsq__kv_load(dst + (int64_t)j * D, kv, is_v, t, kh, ops);
    }
}

/* -------------------------------------------------------- decode rows */

/* Per-thread scratch. */
typedef struct scratch {
    float *qs, *acc;   /* [chunk][D]: scaled queries, accumulator */
    float *mx, *l;     /* [chunk]                                  */
    float *kb, *vb;    /* [BK][D]                                  */
    float *ws;         /* DSQ__ATT_ROW_WS(chunk, D)                */
} scratch_t;

/* The unnormalised online-softmax state of the nh query heads q [nh][D]
 * of kv head kh over the sequence's chunks [c0, c1) (positions up to pos):
 * w->acc [nh][D] (sum of weights x V), w->mx [nh] (running max, -inf for
 * an empty range), w->l [nh] (sum of weights relative to mx). */
static void attend_range(const float *q, int nh, int kh, const dsq_kv_layer_t *kv,
                         const int32_t *btab, int32_t pos, int c0, int c1, float scale,
                         const dsq__vec_ops_t *ops, const dsq__att_ops_t *k, scratch_t *w)
{
    const int D = kv->head_dim;
    for (int i = 0; i < nh * D; i++) {
        w->qs[i] = q[i] * scale;
        w->acc[i] = 0.0f;
    }
    for (int g = 0; g < nh; g++) {
        w->mx[g] = -INFINITY;
        w->l[g] = 0.0f;
    }
    /* the row kernel reads FP16 and F32 keys and values in place (and
     * prefetches the next chunk's as it goes); INT8 ones are dequantised
     * into kb/vb first, and their next chunk prefetched here */
    const bool f16 = kv->dtype == DSQ_KV_F16, i8 = kv->dtype == DSQ_KV_INT8;
    const size_t es = f16 ? 2 : i8 ? 1 : 4;
    const int bs = kv->block_size;
    const void *krow[2 * BK], *vrow[2 * BK];
    for (int c = c0; c < c1; c++) {
        const int32_t p0 = c * BK;
        const int nj = pos + 1 - p0 < BK ? pos + 1 - p0 : BK;
        const int nj_next = c + 1 >= c1 ? 0 : pos + 1 - p0 - BK < BK ? pos + 1 - p0 - BK : BK;
        if (i8) {
            dsq__kv_load_chunk(w->kb, kv, false, btab, p0, nj, kh, ops);
            dsq__kv_load_chunk(w->vb, kv, true, btab, p0, nj, kh, ops);
        }
        int32_t b = p0 / bs, off = p0 % bs;
        for (int j = 0; j < nj + nj_next; j++) {
            const int64_t e = (((int64_t)btab[b] * bs + off) * kv->n_kv_heads + kh) * D;
            krow[j] = (const char *)kv->k + e * es;
            vrow[j] = (const char *)kv->v + e * es;
            if (++off == bs)
                b++, off = 0;
        }
        if (i8) {
            for (int j = nj; j < nj + nj_next; j++)
                for (int64_t x = 0; x < D; x += 64) {
                    __builtin_prefetch((const char *)krow[j] + x);
                    __builtin_prefetch((const char *)vrow[j] + x);
                }
            for (int j = 0; j < nj; j++) {
                krow[j] = w->kb + (int64_t)j * D;
                vrow[j] = w->vb + (int64_t)j * D;
            }
        }
        k->row(w->acc, w->mx, w->l, w->qs, nh, D, krow, vrow, f16, nj, i8 ? 0 : nj_next,
               w->ws);
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
    dsq__tile_in_t in;     /* q, cache, rows, block tables, scale, kernels: what
                            * the row walks and the tiles read             */
    int chunk, n_chunks;
    const int *n_parts;    /* [m]: > 1: the row's context in that many parts */
    const int *grp;        /* [m]: rows of the tile a split row leads (1:
                            * alone; 0: in the tile of a row before it)   */
    const int64_t *toff;   /* [m + 1]: first task of each row                */
    const int64_t *poff;   /* [m]: first part slot of a split row            */
    float *part;           /* [slot]: acc [G][D], mx [G], l [G]              */
    int64_t m, n_tasks;
    const int64_t *rows;   /* the rows this path owns; NULL: all of them */
    int64_t row;
    float *mem;            /* [n_thr][per_thr] scratch */
    size_t per_thr;
    _Atomic int64_t next;  /* next task to hand out */
};

/* Parts a decode row at position pos splits its context into (split-KV,
 * flash-decoding: Dao et al., "Flash-Decoding for long-context
 * inference", 2023): enough for two tasks a thread over the n_kv heads of
 * one row, each part at least 2 chunks. A function of the position, the
 * kv heads and the thread count only, never of the batch: the parts'
 * merge rounds differently from one walk over the context, so a row split
 * in one step and not in another (alone, then beside other rows, or as a
 * speculative verification row) would give other bits, and with INT8
 * activations other logprobs by a few hundredths of a nat. */
static int row_parts(int32_t pos, int n_kv)
{
    const int n_thr = dsq_cpu_get_threads();
    if (n_thr <= 1)
        return 1;          /* nothing to share the context with */
    int want = (2 * n_thr + n_kv - 1) / n_kv;
    const int n_ch = pos / BK + 1;
    while (want > 1 && n_ch / want < 2)
        want--;
    return want;
}

static void att_region(void *p, int tid, int n_thr)
{
    struct att_ctx *c = p;
    const dsq__tile_in_t *in = &c->in;
    (void)n_thr;
    const int D = in->kv->head_dim, chunk = c->chunk, G = in->G;
    /* scratch for G heads: a part task holds all G, a chunk task <= G */
    scratch_t w;
    w.qs = c->mem + (size_t)tid * c->per_thr;
    w.acc = w.qs + (size_t)G * D;
    w.mx = w.acc + (size_t)G * D;
    w.l = w.mx + G;
    w.kb = w.l + chunk;
    w.vb = w.kb + (size_t)BK * D;
    w.ws = w.vb + (size_t)BK * D;
    int64_t ii = 0;
    for (;;) {
        const int64_t task = atomic_fetch_add_explicit(&c->next, 1,
                                                       memory_order_relaxed);
        if (task >= c->n_tasks)
            break;
        /* tasks are handed out in order, so the row only moves forward */
        if (task < c->toff[ii])
            ii = 0;
        while (c->toff[ii + 1] <= task)
            ii++;
        const int64_t i = c->rows ? c->rows[ii] : ii;
        const int64_t t = task - c->toff[ii];
        const int32_t *btab = in->block_tables + (int64_t)in->row_seq[i] * in->max_blocks;
        const int np = c->n_parts[ii];
        if (np > 1) {
            /* part pp of (row i, kv head kh) attends to its share of the
             * chunks; the parts are merged after the region. A tile of
             * rows (grp) does it for all of them at once: the chunks' K/V
             * are read once. */
            const int kh = (int)(t / np), pp = (int)(t % np);
            const int n_ch = in->row_pos[i] / BK + 1;
            const int c0 = (int)((int64_t)n_ch * pp / np);
            const int c1 = (int)((int64_t)n_ch * (pp + 1) / np);
            const size_t per_part = (size_t)G * D + 2 * (size_t)G;
            float *dst = c->part + (size_t)(c->poff[ii] + t) * per_part;
            if (c->grp[ii] > 1) {
                dsq__att_tile_part(in, i, c->grp[ii], kh, c0, c1, w.qs, dst,
                                   (size_t)in->kv->n_kv_heads * (size_t)np * per_part);
                continue;
            }
            const int64_t off = i * c->row + (int64_t)kh * G * D;
            attend_range(in->q + off, G, kh, in->kv, btab, in->row_pos[i], c0, c1, in->scale,
                         in->ops, in->k, &w);
            memcpy(dst, w.acc, sizeof(float) * (size_t)G * D);
            memcpy(dst + (size_t)G * D, w.mx, sizeof(float) * (size_t)G);
            memcpy(dst + (size_t)G * D + G, w.l, sizeof(float) * (size_t)G);
            continue;
        }
        const int kh = (int)(t / c->n_chunks);
        const int ci = (int)(t % c->n_chunks);
        const int h0 = kh * G + ci * chunk;
        const int nh = (ci + 1) * chunk <= G ? chunk : G - ci * chunk;
        const int64_t off = i * c->row + (int64_t)h0 * D;
        attend_range(in->q + off, nh, kh, in->kv, btab, in->row_pos[i], 0,
                     in->row_pos[i] / BK + 1, in->scale, in->ops, in->k, &w);
        for (int g = 0; g < nh; g++) {
            const float inv = 1.0f / w.l[g];
            for (int d = 0; d < D; d++)
                c->out[off + (int64_t)g * D + d] = w.acc[(int64_t)g * D + d] * inv;
        }
    }
}

/* The decode rows: rows[0..m) of the call (rows NULL: rows 0..m-1). */
static int attend_rows(float *out, const float *q, const int64_t *rows, int64_t m,
                       int n_heads, const dsq_kv_layer_t *kv, const int32_t *row_seq,
                       const int32_t *row_pos, const int32_t *block_tables,
                       int max_blocks, float scale)
{
#define ROW(ii) (rows ? rows[ii] : (ii))
    const dsq__vec_ops_t *ops = dsq__vec_ops();
    const int n_kv = kv->n_kv_heads, D = kv->head_dim;
    const int G = n_heads / n_kv;
    const int64_t row = (int64_t)n_heads * D;
    /* Below ~64k multiply-adds in all, one thread does everything (the
     * same tasks, so the same bits). */
    int64_t work = 0;
    for (int64_t i = 0; i < m; i++)
        work += ((int64_t)row_pos[ROW(i)] + 1) * row;
    int n_thr = work < 65536 ? 1 : dsq_cpu_get_threads();
    int *np = malloc(sizeof(*np) * (size_t)(2 * m));
    int64_t *toff = malloc(sizeof(*toff) * (size_t)(2 * m + 1));
    if (!np || !toff) {
        free(np);
        free(toff);
        return DSQ_ENOMEM;
    }
    int64_t *poff = toff + m + 1, m1 = 0, n_slots = 0;
    int *grp = np + m;
    for (int64_t i = 0; i < m; i++) {
        np[i] = row_parts(row_pos[ROW(i)], n_kv);
        m1 += np[i] == 1;
    }
    /* Split rows of one sequence that end in the same chunk (a speculative
     * verification's rows) have the same parts: each part of them is one
     * tile, which reads the part's K/V once for all its rows and gives
     * every row the bits of its own walk (dsq__att_tile_part). */
    const int cap = DSQ__ATT_TILE_VECS / G > 1 ? DSQ__ATT_TILE_VECS / G : 1;
    int max_grp = 1;
    for (int64_t i = 0, j; i < m; i = j) {
        const int64_t r0 = ROW(i);
        for (j = i + 1; np[i] > 1 && j < m && j - i < cap; j++) {
            const int64_t r = ROW(j);
            if (r != ROW(j - 1) + 1 || row_seq[r] != row_seq[r0] ||
                row_pos[r] <= row_pos[r - 1] || row_pos[r] / BK != row_pos[r0] / BK ||
                np[j] != np[i])
                break;
        }
        grp[i] = (int)(j - i);
        for (int64_t k = i + 1; k < j; k++)
            grp[k] = 0;
        max_grp = grp[i] > max_grp ? grp[i] : max_grp;
    }
    /* Rows walked whole: split the query heads of a kv head into chunks
     * while there are fewer tasks than two a thread (at the price of
     * dequantising K/V once per chunk); a head's arithmetic does not
     * depend on its chunk. */
    int chunk = G;
    while (m1 > 0 && chunk > 1 &&
           (m - m1) * n_kv + m1 * n_kv * ((G + chunk - 1) / chunk) < 2 * (int64_t)n_thr)
        chunk = (chunk + 1) / 2;
    const int n_chunks = (G + chunk - 1) / chunk;
    toff[0] = 0;
    for (int64_t i = 0; i < m; i++) {
        poff[i] = n_slots;
        const int64_t nt = (int64_t)n_kv * (np[i] > 1 ? np[i] : n_chunks);
        toff[i + 1] = toff[i] + (grp[i] ? nt : 0);
        n_slots += np[i] > 1 ? nt : 0;
    }
    const int64_t n_tasks = toff[m];
    if (n_tasks < n_thr)
        n_thr = (int)n_tasks;
    const dsq__att_ops_t *k = dsq__att_ops();
    size_t per_thr = 2 * (size_t)G * D + 2 * (size_t)G + 2 * (size_t)BK * D +
                     DSQ__ATT_ROW_WS(G, D);
    if (max_grp > 1 && dsq__att_tile_ws(k, max_grp * G, D) > per_thr)
        per_thr = dsq__att_tile_ws(k, max_grp * G, D);
    per_thr = (per_thr + 15) & ~(size_t)15;     /* each thread on its own lines */
    const size_t per_part = (size_t)G * D + 2 * (size_t)G;
    const size_t mem_bytes = sizeof(float) * (per_thr * (size_t)n_thr + per_part * (size_t)n_slots);
    float *mem = aligned_alloc(64, (mem_bytes + 63) & ~(size_t)63);
    if (!mem) {
        free(np);
        free(toff);
        return DSQ_ENOMEM;
    }
    struct att_ctx c = {out,
                        {q, kv, row_seq, row_pos, block_tables, max_blocks, G, scale, ops, k},
                        chunk, n_chunks, np, grp, toff, poff, mem + per_thr * (size_t)n_thr,
                        m, n_tasks, rows, row, mem, per_thr, 0};
    dsq__parallel(n_thr, att_region, &c);
    /* merge, parts in order: out = sum_p e^(mx_p - M) acc_p / sum_p e^(mx_p - M) l_p */
    for (int64_t ii = 0; ii < m; ii++) {
        if (np[ii] == 1)
            continue;
        for (int kh = 0; kh < n_kv; kh++) {
            const float *pp = c.part + (size_t)(poff[ii] + (int64_t)kh * np[ii]) * per_part;
            float *o = out + ROW(ii) * row + (int64_t)kh * G * D;
            for (int g = 0; g < G; g++) {
                float M = -INFINITY, L = 0.0f;
                for (int p = 0; p < np[ii]; p++) {
                    float mp = pp[p * per_part + (size_t)G * D + g];
                    M = mp > M ? mp : M;
                }
                for (int d = 0; d < D; d++)
                    o[g * D + d] = 0.0f;
                for (int p = 0; p < np[ii]; p++) {
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
    }
    free(mem);
    free(np);
    free(toff);
    return DSQ_OK;
#undef ROW
}

/* End of the run that starts at row i: rows of one sequence with strictly
 * increasing positions. */
static int64_t run_end(const int32_t *row_seq, const int32_t *row_pos, int64_t m, int64_t i)
{
    int64_t j = i + 1;
    while (j < m && row_seq[j] == row_seq[i] && row_pos[j] > row_pos[j - 1])
        j++;
    return j;
}

int dsq_cpu_attention(float *out, const float *q, int64_t m, int n_heads,
                      const dsq_kv_layer_t *kv, const int32_t *row_seq,
                      const int32_t *row_pos, const int32_t *block_tables,
                      int max_blocks, float scale)
{
    return dsq_cpu_attention_ex(out, q, m, n_heads, kv, row_seq, row_pos, block_tables,
                                max_blocks, scale, NULL);
}

/* Whether run [i, j) goes to the whole-context tiles (attention_prefill.c):
 * every run of >= 2 rows, but a decoding sequence's whose last row decode
 * would split (row_parts; below that a tile row has a decode row's bits).
 * Those go to attend_rows, which splits them as decode rows and still
 * walks each part once for all of them (dsq__att_tile_part). */
static bool tiled_run(const int32_t *row_seq, const int32_t *row_pos,
                      const uint8_t *seq_decode, int64_t i, int64_t j, int n_kv)
{
    if (j - i < 2)
        return false;
    return !(seq_decode && seq_decode[row_seq[i]]) || row_parts(row_pos[j - 1], n_kv) == 1;
}

int dsq_cpu_attention_ex(float *out, const float *q, int64_t m, int n_heads,
                         const dsq_kv_layer_t *kv, const int32_t *row_seq,
                         const int32_t *row_pos, const int32_t *block_tables,
                         int max_blocks, float scale, const uint8_t *seq_decode)
{
    int rc = check_args(out, q, m, n_heads, kv, row_seq, row_pos, block_tables,
                        max_blocks);
    if (rc != DSQ_OK || m == 0)
        return rc;
    /* runs of >= 2 rows are prefill (tiled); single rows are decode, and
     * so are the rows of a sequence seq_decode marks (a decoding
     * sequence's pending token and speculative drafts), so each of them
     * has the bits a decode row at its position has */
    int n_runs = 0;
    int64_t n_dec = 0;
    for (int64_t i = 0, j; i < m; i = j) {
        j = run_end(row_seq, row_pos, m, i);
        bool tiled = tiled_run(row_seq, row_pos, seq_decode, i, j, kv->n_kv_heads);
        n_runs += tiled;
        n_dec += tiled ? 0 : j - i;
    }
    if (n_runs == 0)
        return attend_rows(out, q, NULL, m, n_heads, kv, row_seq, row_pos, block_tables,
                           max_blocks, scale);
    int64_t *idx = malloc(sizeof(*idx) * (size_t)(2 * n_runs + n_dec));
    if (!idx)
        return DSQ_ENOMEM;
    int64_t *run_i0 = idx, *run_n = idx + n_runs, *dec = idx + 2 * n_runs;
    int k = 0;
    n_dec = 0;
    for (int64_t i = 0, j; i < m; i = j) {
        j = run_end(row_seq, row_pos, m, i);
        if (tiled_run(row_seq, row_pos, seq_decode, i, j, kv->n_kv_heads)) {
            run_i0[k] = i;
            run_n[k++] = j - i;
        } else {
            for (int64_t r = i; r < j; r++)
                dec[n_dec++] = r;
        }
    }
    rc = dsq__attention_prefill(out, q, n_heads, kv, row_seq, row_pos, block_tables,
                                max_blocks, scale, run_i0, run_n, n_runs);
    if (rc == DSQ_OK && n_dec > 0)
        rc = attend_rows(out, q, dec, n_dec, n_heads, kv, row_seq, row_pos, block_tables,
                         max_blocks, scale);
    free(idx);
    return rc;
}

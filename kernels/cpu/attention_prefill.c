/* Tiled causal attention for prefill chunks (runs of rows of one sequence
 * with increasing positions) on the CPU: the prefill half of
 * dsq_cpu_attention.
 *
 * Why tiles: attending row by row reads the sequence's whole K/V once per
 * row, so a chunk of m rows moves O(m^2 D) bytes and every score is a lone
 * dot product. Here one task is one tile: up to TILE_VECS query vectors
 * (TILE_VECS / G consecutive rows x the G query heads that share kv head
 * kh) against the context, walked in chunks of DSQ__ATT_BK positions
 * (flash attention, Dao et al. 2022, laid out for a CPU). Each
 * chunk's keys and values are dequantised (FP16, INT8 group-wise, or
 * copied from F32) once per tile into small fp32 buffers; then the chunk
 * kernels of attention_chunk.c compute the scores as one small matrix
 * product, mask the causal diagonal (only chunks that pass the tile's
 * first row), update each query vector's online softmax and add P V.
 * The tile keeps its query vectors as the SIMD lanes (Q and O stored
 * transposed, [D][rp], rp = R padded to the kernels' lane count with zero
 * queries whose results are dropped), so head_dim is only a loop count
 * and any head_dim works.
 *
 * Memory per thread: the tile's Q and O, one chunk of scores and one
 * chunk of K and V, (2 rp + 2 BK) x D + BK x rp floats, independent of the
 * context length (about 100 KiB at D = 64, rp = 96: in L2, while a
 * 24-vector slice of Q or P and the chunk's K or V stay in L1).
 *
 * Work split: tasks are (tile, kv head) pairs handed out by an atomic
 * counter, largest context first (causal tiles differ in cost). A query
 * vector's arithmetic does not depend on its tile (attention_chunk.c), so
 * results are bitwise the same for any thread count and tile size; few
 * tasks (a short chunk) shrink the tiles until every thread has two, and
 * a small total runs inline. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

#define BK DSQ__ATT_BK
#define TILE_VECS DSQ__ATT_TILE_VECS

/* ---------------------------------------------------------------- tiles */

typedef struct task {
    int64_t i0;          /* first row of the tile          */
    int32_t n;           /* rows                           */
    int32_t kh;          /* kv head                        */
} task_t;

typedef struct pf_ctx {
    float *out;
    dsq__tile_in_t in;
    const task_t *tasks;
    int64_t n_tasks;
    int rp_max;
    float *mem;          /* [n_thr][per_thr] scratch */
    size_t per_thr;
    _Atomic int64_t next;
} pf_ctx_t;

/* A tile's scratch, carved from ws for tiles of at most rpm vectors. */
typedef struct tile_ws {
    float *qt, *ot;      /* [D][rp]  */
    float *st;           /* [BK][rp] */
    float *kb, *vb;      /* [BK][D]  */
    float *mx, *l, *cr;  /* [rp]     */
    int32_t *lim;        /* [rp]     */
} tile_ws_t;

static tile_ws_t tile_ws(float *ws, int D, int rpm)
{
    tile_ws_t t;
    t.qt = ws;
    t.ot = t.qt + (size_t)D * rpm;
    t.st = t.ot + (size_t)D * rpm;
    t.kb = t.st + (size_t)BK * rpm;
    t.vb = t.kb + (size_t)BK * D;
    t.mx = t.vb + (size_t)BK * D;
    t.l = t.mx + rpm;
    t.cr = t.l + rpm;
    t.lim = (int32_t *)(t.cr + rpm);
    return t;
}

static int tile_rp(const dsq__att_ops_t *k, int vecs)
{
    return (vecs + k->lanes - 1) / k->lanes * k->lanes;
}

size_t dsq__att_tile_ws(const dsq__att_ops_t *k, int vecs, int D)
{
    const size_t rp = (size_t)tile_rp(k, vecs);
    /* rounded to 16 floats so a thread's block can start on a cache line */
    return ((2 * (size_t)D * rp + (size_t)BK * rp + 2 * (size_t)BK * D + 4 * rp) + 15) &
           ~(size_t)15;
}

/* Rows i0..i0+n-1 (one sequence, increasing positions) x the G query
 * heads of kv head kh against the chunks [c0, c1) of their context (the
 * last one cut at the last row's position): leaves each vector's
 * unnormalised output in t->ot and its online-softmax state in t->mx,
 * t->l, starting from an empty state. Returns rp. */
static int tile_walk(const dsq__tile_in_t *c, int64_t i0, int n, int kh, int c0, int c1,
                     const tile_ws_t *t)
{
    const dsq_kv_layer_t *kv = c->kv;
    const int D = kv->head_dim, G = c->G;
    const int R = n * G, rp = tile_rp(c->k, R);
    const int64_t row = (int64_t)kv->n_kv_heads * G * D;
    const int32_t pos_lo = c->row_pos[i0], pos_hi = c->row_pos[i0 + n - 1];
    const int32_t *btab = c->block_tables + (int64_t)c->row_seq[i0] * c->max_blocks;
    float *qt = t->qt, *ot = t->ot, *mx = t->mx, *l = t->l;

    /* Q^T with the scale folded in; padding vectors are zero queries
     * that see every key (finite, ignored) */
    for (int i = 0; i < n; i++)
        for (int g = 0; g < G; g++) {
            const int r = i * G + g;
            const float *src = c->q + (i0 + i) * row + (int64_t)(kh * G + g) * D;
            for (int d = 0; d < D; d++)
                qt[(int64_t)d * rp + r] = src[d] * c->scale;
            t->lim[r] = c->row_pos[i0 + i];
        }
    for (int r = R; r < rp; r++) {
        for (int d = 0; d < D; d++)
            qt[(int64_t)d * rp + r] = 0.0f;
        t->lim[r] = pos_hi;
    }
    for (int r = 0; r < rp; r++) {
        mx[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(ot, 0, sizeof(*ot) * (size_t)D * rp);

    const int32_t p_end = (int64_t)c1 * BK - 1 < pos_hi ? c1 * BK - 1 : pos_hi;
    for (int32_t p0 = c0 * BK; p0 <= p_end; p0 += BK) {
        const int nj = p_end + 1 - p0 < BK ? p_end + 1 - p0 : BK;
        dsq__kv_load_chunk(t->kb, kv, false, btab, p0, nj, kh, c->ops);
        c->k->scores(t->st, rp, qt, t->kb, D, nj);
        /* the mask matters only where the chunk passes the first row */
        c->k->softmax(t->st, rp, nj, mx, l, t->cr, p0 + nj - 1 > pos_lo ? t->lim : NULL, p0);
        dsq__kv_load_chunk(t->vb, kv, true, btab, p0, nj, kh, c->ops);
        c->k->pv(ot, rp, t->st, t->vb, D, nj, t->cr);
    }
    return rp;
}

static void run_tile(const pf_ctx_t *c, const task_t *tk, float *ws)
{
    const int D = c->in.kv->head_dim, G = c->in.G, kh = tk->kh, n = tk->n;
    const int64_t row = (int64_t)c->in.kv->n_kv_heads * G * D;
    const tile_ws_t t = tile_ws(ws, D, c->rp_max);
    const int rp = tile_walk(&c->in, tk->i0, n, kh, 0,
                             c->in.row_pos[tk->i0 + n - 1] / BK + 1, &t);
    for (int i = 0; i < n; i++)
        for (int g = 0; g < G; g++) {
            const int r = i * G + g;
            const float inv = 1.0f / t.l[r];
            float *dst = c->out + (tk->i0 + i) * row + (int64_t)(kh * G + g) * D;
            for (int d = 0; d < D; d++)
                dst[d] = t.ot[(int64_t)d * rp + r] * inv;
        }
}

void dsq__att_tile_part(const dsq__tile_in_t *in, int64_t i0, int n, int kh, int c0, int c1,
                        float *ws, float *dst, size_t stride)
{
    const int D = in->kv->head_dim, G = in->G;
    const tile_ws_t t = tile_ws(ws, D, tile_rp(in->k, n * G));
    const int rp = tile_walk(in, i0, n, kh, c0, c1, &t);
    for (int i = 0; i < n; i++) {
        float *acc = dst + (size_t)i * stride, *mx = acc + (size_t)G * D, *l = mx + G;
        for (int g = 0; g < G; g++) {
            const int r = i * G + g;
            for (int d = 0; d < D; d++)
                acc[(int64_t)g * D + d] = t.ot[(int64_t)d * rp + r];
            mx[g] = t.mx[r];
            l[g] = t.l[r];
        }
    }
}

static void pf_region(void *p, int chunk, int n_chunks)
{
    pf_ctx_t *c = p;
    (void)n_chunks;
    float *ws = c->mem + (size_t)chunk * c->per_thr;
    for (;;) {
        const int64_t t = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (t >= c->n_tasks)
            break;
        run_tile(c, &c->tasks[t], ws);
    }
}

/* Tiles of at most `rows` rows over the runs, n_kv tasks each, largest
 * context first. Fills tasks (NULL: count only); returns the count. */
static int64_t make_tasks(task_t *tasks, const int64_t *run_i0, const int64_t *run_n,
                          int n_runs, int rows, int n_kv)
{
    int64_t n_tiles = 0;
    for (int k = 0; k < n_runs; k++)
        n_tiles += (run_n[k] + rows - 1) / rows;
    if (!tasks)
        return n_tiles * n_kv;
    int64_t t = 0;
    for (int k = 0; k < n_runs; k++)
        for (int64_t i = 0; i < run_n[k]; i += rows)
            for (int kh = 0; kh < n_kv; kh++)
                tasks[t++] = (task_t){run_i0[k] + i,
                                      (int32_t)(run_n[k] - i < rows ? run_n[k] - i : rows),
                                      kh};
    return t;
}

static int cmp_task_cost(const void *a, const void *b, void *pos)
{
    const task_t *x = a, *y = b;
    const int32_t *rp = pos;
    const int32_t px = rp[x->i0 + x->n - 1], py = rp[y->i0 + y->n - 1];
    if (px != py)
        return px > py ? -1 : 1;
    if (x->i0 != y->i0)
        return x->i0 < y->i0 ? -1 : 1;
    return x->kh - y->kh;
}

int dsq__attention_prefill(float *out, const float *q, int n_heads,
                           const dsq_kv_layer_t *kv, const int32_t *row_seq,
                           const int32_t *row_pos, const int32_t *block_tables,
                           int max_blocks, float scale, const int64_t *run_i0,
                           const int64_t *run_n, int n_runs)
{
    const int n_kv = kv->n_kv_heads, D = kv->head_dim, G = n_heads / n_kv;
    int64_t work = 0;              /* multiply-adds of the scores, roughly */
    for (int k = 0; k < n_runs; k++)
        work += run_n[k] * ((int64_t)row_pos[run_i0[k] + run_n[k] - 1] + 1);
    work *= (int64_t)n_heads * D;
    int n_thr = work < 65536 ? 1 : dsq_cpu_get_threads();
    int rows = TILE_VECS / G > 1 ? TILE_VECS / G : 1;
    while (rows > 1 && make_tasks(NULL, run_i0, run_n, n_runs, rows, n_kv) < 2 * (int64_t)n_thr)
        rows = (rows + 1) / 2;
    const int64_t n_tasks = make_tasks(NULL, run_i0, run_n, n_runs, rows, n_kv);
    if (n_tasks < n_thr)
        n_thr = (int)n_tasks;
    const dsq__att_ops_t *k = dsq__att_ops();
    const int rp_max = tile_rp(k, rows * G);
    const size_t per_thr = dsq__att_tile_ws(k, rows * G, D);
    const size_t mem_bytes = sizeof(float) * per_thr * (size_t)n_thr;
    float *mem = aligned_alloc(64, (mem_bytes + 63) & ~(size_t)63);
    task_t *tasks = malloc(sizeof(*tasks) * (size_t)n_tasks);
    int rc = DSQ_OK;
    if (!mem || !tasks) {
        rc = DSQ_ENOMEM;
        goto undo_mem;
    }
    make_tasks(tasks, run_i0, run_n, n_runs, rows, n_kv);
    qsort_r(tasks, (size_t)n_tasks, sizeof(*tasks), cmp_task_cost, (void *)row_pos);
    pf_ctx_t c = {out,
                  {q, kv, row_seq, row_pos, block_tables, max_blocks, G, scale,
                   dsq__vec_ops(), k},
                  tasks, n_tasks, rp_max, mem, per_thr, 0};
    dsq__parallel(n_thr, pf_region, &c);
undo_mem:
    free(tasks);
    free(mem);
    return rc;
}

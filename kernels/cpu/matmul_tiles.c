/* The work split both product paths share (matmul.c's int8 activations,
 * matmul_f32act.c's fp32 ones): y[m][n] in tiles of tile_m (DSQ__MM_TILE_M,
 * or DSQ__MM_PANEL_M for the AVX-512 panel path)
 * activation rows x DSQ__MM_TILE_N weight rows, handed out as contiguous
 * static ranges over the thread pool so that results never depend on the
 * thread count or timing, and a product under the caller's minimum work
 * runs inline without a dispatch. Each tile is walked mr activation rows
 * at a time (DSQ__MM_MR, or what the kernel takes), so the kernel reuses
 * an unpacked weight
 * chunk from registers while the tile's weights stay in L1 (prefill), and
 * decode (m <= 4) streams every weight byte once.
 *
 * Several independent products can share one dispatch (dsq__mm_run_many):
 * their tiles are numbered one after another and split as one list, so a
 * layer of small products (a MoE layer's experts at decode) waits at one
 * barrier instead of one per product, and the last thread to finish holds
 * up the others by at most one chunk of the whole list. */
#include "cpu_internal.h"

#define TILE_N DSQ__MM_TILE_N
#define TILE_M DSQ__MM_TILE_M

struct many_ctx {
    dsq__mm_tiles_t *p;
    int n;
};

/* Tile t of product p: activation rows (t / tn) * tile_m.. and weight
 * rows (t % tn) * tile_n.. */
static void run_tile(const dsq__mm_tiles_t *p, int64_t t)
{
    const int64_t n = p->w->n, m = p->m;
    int64_t im = t / p->tn, in = t % p->tn;
    int64_t n0 = in * p->tile_n, n1 = n0 + p->tile_n < n ? n0 + p->tile_n : n;
    int64_t mb0 = im * p->tile_m, mb1 = mb0 + p->tile_m < m ? mb0 + p->tile_m : m;
    for (int64_t r = mb0; r < mb1; r += p->mr) {
        int64_t r1 = r + p->mr < mb1 ? r + p->mr : mb1;
        p->fn(p->ctx, r, r1, n0, n1);
        if (p->w->bias)
            for (int64_t i = r; i < r1; i++)
                for (int64_t j = n0; j < n1; j++)
                    p->y[i * n + j] += p->w->bias[j];
    }
}

/* Tiles [t0, t1) of the list numbered over every product in order. */
static void run_tiles(void *arg, int64_t t0, int64_t t1)
{
    const struct many_ctx *c = arg;
    int i = 0;
    for (int64_t t = t0; t < t1; t++) {
        while (t >= c->p[i].first + c->p[i].n_tiles)
            i++;
        run_tile(&c->p[i], t - c->p[i].first);
    }
}

void dsq__mm_run_many(dsq__mm_tiles_t *p, int n, int64_t min_work)
{
    int64_t total = 0, work = 0;
    for (int i = 0; i < n; i++) {
        const int64_t m = p[i].m;
        if (p[i].tile_m <= 0)
            p[i].tile_m = TILE_M;
        /* decode (m <= mr) keeps nothing in L1 between activation rows, so
         * its tiles are twice as wide: a kernel may stream 4 interleaved
         * 8-row tiles side by side (more misses in flight per core than 2) */
        p[i].tile_n = m <= DSQ__MM_MR ? 2 * TILE_N : TILE_N;
        p[i].tn = (p[i].w->n + p[i].tile_n - 1) / p[i].tile_n;
        p[i].n_tiles = m > 0 ? p[i].tn * ((m + p[i].tile_m - 1) / p[i].tile_m) : 0;
        p[i].first = total;
        total += p[i].n_tiles;
        work += p[i].w->n * p[i].w->k * m;
    }
    if (total == 0)
        return;
    /* at least min_work multiply-adds per thread, in whole tiles of the
     * list's mean size */
    const int64_t tile_work = work / total > 0 ? work / total : 1;
    struct many_ctx c = {p, n};
    dsq__parallel_for(total, min_work / tile_work + 1, run_tiles, &c);
}

void dsq__mm_run_tiles(float *y, int64_t m, const dsq_weight_t *w, int64_t min_work, int mr,
                       int tile_m, dsq__mm_block_fn fn, void *ctx)
{
    dsq__mm_tiles_t p = {.y = y, .m = m, .w = w, .mr = mr, .tile_m = tile_m, .fn = fn,
                         .ctx = ctx};
    dsq__mm_run_many(&p, 1, min_work);
}

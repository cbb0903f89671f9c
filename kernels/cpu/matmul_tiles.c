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
 * decode (m <= 4) streams every weight byte once. */
#include "cpu_internal.h"

#define TILE_N DSQ__MM_TILE_N
#define TILE_M DSQ__MM_TILE_M
#define MR DSQ__MM_MR

struct tiles_ctx {
    float *y;
    const dsq_weight_t *w;
    int64_t m, tn, tile_n, tile_m, mr;
    dsq__mm_block_fn fn;
    void *fn_ctx;
};

/* Tiles [t0, t1): tile t covers activation rows (t / tn) * tile_m.. and
 * weight rows (t % tn) * tile_n.. */
static void run_tiles(void *p, int64_t t0, int64_t t1)
{
    const struct tiles_ctx *c = p;
    const int64_t n = c->w->n, m = c->m;
    for (int64_t t = t0; t < t1; t++) {
        int64_t im = t / c->tn, in = t % c->tn;
        int64_t n0 = in * c->tile_n, n1 = n0 + c->tile_n < n ? n0 + c->tile_n : n;
        int64_t mb0 = im * c->tile_m, mb1 = mb0 + c->tile_m < m ? mb0 + c->tile_m : m;
        for (int64_t r = mb0; r < mb1; r += c->mr) {
            int64_t r1 = r + c->mr < mb1 ? r + c->mr : mb1;
            c->fn(c->fn_ctx, r, r1, n0, n1);
            if (c->w->bias)
                for (int64_t i = r; i < r1; i++)
                    for (int64_t j = n0; j < n1; j++)
                        c->y[i * n + j] += c->w->bias[j];
        }
    }
}

void dsq__mm_run_tiles(float *y, int64_t m, const dsq_weight_t *w, int64_t min_work, int mr,
                       int tile_m, dsq__mm_block_fn fn, void *ctx)
{
    struct tiles_ctx c = {.y = y, .w = w, .m = m, .fn = fn, .fn_ctx = ctx, .mr = mr,
                          .tile_m = tile_m ? tile_m : TILE_M};
    /* decode (m <= MR) keeps nothing in L1 between activation rows, so its
     * tiles are twice as wide: a kernel may stream 4 interleaved 8-row
     * tiles side by side (more misses in flight per core than 2) */
    c.tile_n = m <= MR ? 2 * TILE_N : TILE_N;
    c.tn = (w->n + c.tile_n - 1) / c.tile_n;
    const int64_t n_tiles = c.tn * ((m + c.tile_m - 1) / c.tile_m);
    /* at least min_work multiply-adds per thread, in whole tiles */
    int64_t tile_work = c.tile_n * w->k * (m < c.tile_m ? m : c.tile_m);
    dsq__parallel_for(n_tiles, min_work / tile_work + 1, run_tiles, &c);
}

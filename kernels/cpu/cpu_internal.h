/* Internals shared by the CPU kernel files (not an API).
 *
 * Holds the instruction-set dispatch level, the fp16/bf16 scalar helpers the
 * kernels use (kernels do not link the engine), and the activation
 * quantisation shared by every matmul path: each activation row is
 * quantised once per call to int8 per 32-element block (fp32 scale d, and
 * s = d * sum(q)), so that the scalar path and every SIMD path compute the
 * same integer dot products and differ only in fp32 summation order.
 */
#ifndef DSQ_CPU_INTERNAL_H
#define DSQ_CPU_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

typedef enum dsq__isa {
    DSQ__ISA_SCALAR = 0,
    DSQ__ISA_AVX2 = 1,     /* AVX2 + FMA + F16C                              */
    DSQ__ISA_AVX512 = 2,   /* AVX-512 F/BW/VL + VNNI (+ the AVX2 set)         */
    /* AArch64 levels (x86 code never sees them: it is compiled out there) */
    DSQ__ISA_NEON = 3,     /* Advanced SIMD, every AArch64 CPU               */
    DSQ__ISA_NEON_DOTPROD = 4, /* + SDOT (HWCAP_ASIMDDP)                     */
} dsq__isa_t;

/* Level in effect (CPUID at first use, lowered by DSQ_CPU_ISA or
 * dsq_cpu_force_isa). */
dsq__isa_t dsq__cpu_isa_level(void);

/* ------------------------------------------------ thread pool (threadpool.c)
 *
 * A job is n_chunks calls fn(ctx, chunk, n_chunks), chunk = 0..n_chunks-1,
 * each exactly once, spread over the pool's threads (the calling thread
 * included) by an atomic claim counter; it returns when all have returned.
 * A chunk's result must not depend on which thread runs it or in what
 * order (so results do not depend on timing or thread count). Chunks run
 * inline on the caller when n_chunks is 1, the thread count is 1, or the
 * pool is in use by another thread or by an enclosing job. Chunks cannot
 * fail half-way: a chunk that can fail records the error in ctx
 * (atomically). Per-chunk scratch is indexed by chunk (a thread may run
 * several chunks, one after the other). */
typedef void (*dsq__region_fn)(void *ctx, int chunk, int n_chunks);
void dsq__parallel(int n_chunks, dsq__region_fn fn, void *ctx);

/* Runs fn(ctx, i0, i1) over contiguous static slices of [0, n): at most
 * n / min_per_chunk slices (so small n runs inline with no dispatch at all)
 * and at most 4 per thread. Slices depend only on n and the thread count. */
typedef void (*dsq__range_fn)(void *ctx, int64_t i0, int64_t i1);
void dsq__parallel_for(int64_t n, int64_t min_per_chunk, dsq__range_fn fn,
                       void *ctx);

/* Static slice tid of n_thr of [0, n): sizes differ by at most one. */
static inline void dsq__split(int64_t n, int tid, int n_thr, int64_t *i0,
                              int64_t *i1)
{
    int64_t q = n / n_thr, r = n % n_thr;
    *i0 = tid * q + (tid < r ? tid : r);
    *i1 = *i0 + q + (tid < r ? 1 : 0);
}

/* ------------------------------------ product tiling (matmul_tiles.c)
 *
 * Both product paths (matmul.c's int8 activations, matmul_f32act.c's fp32
 * ones) split y[m][n] the same way: tiles of DSQ__MM_TILE_M activation rows
 * (DSQ__MM_PANEL_M on the AVX-512 panel path) x DSQ__MM_TILE_N weight rows,
 * handed out as contiguous static ranges over the thread pool (so results
 * never depend on the thread count), each tile walked mr activation rows
 * at a time (DSQ__MM_MR, or what the kernel takes: dsq__mm_avx512_rows;
 * the panel path takes whole tiles) so an unpacked weight chunk is reused
 * from registers while the tile's weights stay in L1. */
#define DSQ__MM_TILE_N 16
#define DSQ__MM_TILE_M 64
#define DSQ__MM_MR 4

/* Computes y rows [r0, r1) (at most mr of them) x columns [n0, n1)
 * of one product; ctx is the path's own call state. */
typedef void (*dsq__mm_block_fn)(void *ctx, int64_t r0, int64_t r1, int64_t n0, int64_t n1);

/* Runs fn over every block of y[m][w->n] (row stride w->n) in tiles of
 * tile_m activation rows (0: DSQ__MM_TILE_M), mr rows a call (1..8, or
 * tile_m for a path that takes whole tiles), and adds w->bias (when set)
 * to each block after it is computed. A call of fewer than min_work
 * multiply-adds per thread runs inline. */
void dsq__mm_run_tiles(float *y, int64_t m, const dsq_weight_t *w, int64_t min_work, int mr,
                       int tile_m, dsq__mm_block_fn fn, void *ctx);

/* One product of a dsq__mm_run_many list: y[m][w->n], fn over its blocks
 * with ctx, mr rows a call, tiles of tile_m rows (0: DSQ__MM_TILE_M). The
 * last four fields are dsq__mm_run_many's own (the tile grid and where the
 * product's tiles start in the list). */
typedef struct dsq__mm_tiles {
    float *y;
    int64_t m;
    const dsq_weight_t *w;
    int mr, tile_m;
    dsq__mm_block_fn fn;
    void *ctx;
    int64_t tile_n, tn, n_tiles, first;
} dsq__mm_tiles_t;

/* dsq__mm_run_tiles over n independent products in one dispatch: their
 * tiles form one list split over the thread pool (min_work multiply-adds
 * per thread at least, counted at the list's mean tile size). Each tile is
 * computed as dsq__mm_run_tiles computes it, so results equal n separate
 * calls. The products' y must not overlap. */
void dsq__mm_run_many(dsq__mm_tiles_t *p, int n, int64_t min_work);

/* IEEE binary16 -> binary32, exact. */
static inline float dsq__h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* IEEE binary32 -> binary16, round to nearest even, overflow to inf. */
static inline uint16_t dsq__f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint16_t h;
    if (ax >= 0x7f800000u) {                 /* inf or NaN (kept quiet)   */
        h = (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    } else if (ax >= 0x477ff000u) {          /* >= 65520 rounds to inf    */
        h = (uint16_t)(sign | 0x7c00u);
    } else if (ax < 0x38800000u) {           /* below 2^-14: subnormal    */
        float a;
        memcpy(&a, &ax, 4);
        h = (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    } else {
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
        h = (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    return h;
}

static inline float dsq__bf2f(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Value j (0..127) of one 96-byte super-block of 6-bit sub-scales
 * (kernels.h): INT4_X8 / INT5_X8 keep the 8 rows' a of its 8 groups at
 * 8g + r and their b at 64 + 8g + r; INT3_X8 the a + 32 of its 16 groups
 * at 8g + r. */
static inline int dsq__sub6(const uint8_t *p, int j)
{
    const int lo = (j < 64 ? p[j] : p[j - 64] >> 4) & 15;
    return lo | ((p[64 + (j & 31)] >> (2 * (j >> 5))) & 3) << 4;
}

/* Scale s and additive constant c of group g (of `groups`) of row `row` of
 * an INT4 / INT8G weight, so that weight = s * v(q) + c with v(q) = q
 * (LUT: dsq_iq4nl_values[q]); kernels.h dsq_zp_mode_t / dsq_scale_mode_t.
 * SUPER: s = d*a is exact in fp32; c = -z*s (INT), dm*b (MIN). */
static inline void dsq__group_sc(const dsq_weight_t *w, int64_t row, int64_t g,
                                 int64_t groups, float *s, float *c)
{
    const bool x8 = w->format == DSQ_WFMT_INT4_X8 || w->format == DSQ_WFMT_INT6_X8 ||
                    w->format == DSQ_WFMT_INT5_X8;
    const int64_t i = x8 ? ((row / 8) * groups + g) * 8 + row % 8 : row * groups + g;
    float sg, cg = 0.0f;
    if (w->format == DSQ_WFMT_INT2_X8 || w->format == DSQ_WFMT_INT3_X8) {
        /* group 16: 16 groups a super-block, the file's bits (kernels.h) */
        const int64_t sbs = w->k / 256, t = row / 8, b = g / 16;
        const int j = (int)(g % 16) * 8 + (int)(row % 8);
        if (w->format == DSQ_WFMT_INT3_X8) {
            const uint8_t *p6 = (const uint8_t *)w->sub_scales + (t * sbs + b) * 96;
            sg = dsq__h2f(w->super[(t * sbs + b) * 8 + row % 8]) *
                 (float)(dsq__sub6(p6, j) - 32);
            cg = -4.0f * sg;
        } else {
            const uint8_t ab = ((const uint8_t *)w->sub_scales)[(t * sbs + b) * 128 + j];
            const uint16_t *sb = w->super + (t * sbs + b) * 16 + row % 8;
            sg = dsq__h2f(sb[0]) * (float)(ab & 15);
            cg = dsq__h2f(sb[8]) * (float)(ab >> 4);
        }
        *s = sg;
        *c = cg;
        return;
    }
    if (w->scale_mode == DSQ_SCALE_SUPER && !x8 && w->zp_mode == DSQ_ZP_LUT) {
        /* IQ4_XS's 6-bit sub-scales and d (kernels.h) */
        const int64_t sbs = w->k / 256, b = g / 8;
        *s = dsq__h2f(w->super[row * sbs + b]) *
             (float)dsq_iq4xs_sub((const uint8_t *)w->sub_scales + (row * sbs + b) * 6,
                                  (int)(g % 8));
        *c = 0.0f;
        return;
    }
    if (w->scale_mode == DSQ_SCALE_SUPER) {
        /* (d, dm): adjacent in a row-major weight, 8 apart in an INT4_X8 one */
        const int64_t sbs = w->k / 256, b = g * w->group_size / 256;
        /* INT6_X8 keeps d alone (SYM: dm unused) */
        const int64_t per = w->format == DSQ_WFMT_INT6_X8 ? 8 : 16;
        const uint16_t *sb = x8 ? w->super + ((row / 8) * sbs + b) * per + row % 8
                                : w->super + 2 * (row * sbs + b);
        const int64_t dm = x8 ? 8 : 1;
        if (x8 && w->format != DSQ_WFMT_INT6_X8) {
            /* 6-bit a and b, zp MIN only */
            const uint8_t *p6 = (const uint8_t *)w->sub_scales + ((row / 8) * sbs + b) * 96;
            const int j = (int)(g % 8) * 8 + (int)(row % 8);
            sg = dsq__h2f(sb[0]) * (float)dsq__sub6(p6, j);
            cg = dsq__h2f(sb[dm]) * (float)dsq__sub6(p6, 64 + j);
        } else {
            sg = dsq__h2f(sb[0]) * (float)w->sub_scales[i];
            if (w->zp_mode == DSQ_ZP_INT)
                cg = -(float)w->sub_zeros[i] * sg;
            else if (w->zp_mode == DSQ_ZP_MIN)
                cg = dsq__h2f(sb[dm]) * (float)w->sub_zeros[i];
        }
    } else {
        sg = dsq__h2f(w->scales[i]);
        if (w->zp_mode == DSQ_ZP_INT)
            cg = -dsq__h2f(w->zeros[i]) * sg;
        else if (w->zp_mode == DSQ_ZP_MIN)
            cg = dsq__h2f(w->zeros[i]);
    }
    if (w->zp_mode == DSQ_ZP_SYM && w->format == DSQ_WFMT_INT6_X8)
        cg = -32.0f * sg;
    else if (w->zp_mode == DSQ_ZP_SYM && w->format == DSQ_WFMT_INT5_X8)
        cg = -16.0f * sg;
    else if (w->zp_mode == DSQ_ZP_SYM && w->format != DSQ_WFMT_INT8G)
        cg = -8.0f * sg;
    *s = sg;
    *c = cg;
}

/* True for the INT4 layouts the SIMD kernels of matmul*.c implement: F16
 * scales, group_size >= 32, zp_mode SYM/INT/MIN. The other layouts (k-quant
 * SUPER scales, group 16, the IQ4 codebook, INT8G) take the scalar
 * kernels. */
static inline bool dsq__int4_classic(const dsq_weight_t *w)
{
    return w->format == DSQ_WFMT_INT4 && w->scale_mode == DSQ_SCALE_F16 &&
           w->group_size >= 32 && w->zp_mode != DSQ_ZP_LUT;
}

/* Byte j (< 16) of 32-weight chunk c of row `row` of an INT4 weight, in
 * the native chunk order (kernels.h: low nibble weight j, high nibble
 * weight j + 16) whether the rows are native or interleaved (INT4_X8). */
static inline uint8_t dsq__int4_byte(const dsq_weight_t *w, int64_t nb, int64_t row,
                                     int64_t c, int j)
{
    const uint8_t *d = (const uint8_t *)w->data;
    if (w->format == DSQ_WFMT_INT4_X8)
        return d[((row / 8) * nb + c) * 128 + (j / 4) * 32 + (row % 8) * 4 + j % 4];
    return d[(row * nb + c) * 16 + j];
}

/* q (0..63) of weight j (< 32) of 32-weight chunk c of row `row` of an
 * INT6_X8 weight (kernels.h). */
static inline unsigned dsq__int6_q(const dsq_weight_t *w, int64_t nb, int64_t row,
                                   int64_t c, int j)
{
    const uint8_t *ch = (const uint8_t *)w->data + ((row / 8) * nb + c) * 192;
    const int jj = j % 16, p = jj / 4, i = jj % 4, hi = j >= 16, r = (int)(row % 8);
    const unsigned lo = (ch[32 * p + 4 * r + i] >> (4 * hi)) & 15;
    const unsigned top = (ch[128 + 32 * (p / 2) + 4 * r + i] >> (2 * (2 * (p % 2) + hi))) & 3;
    return lo | top << 4;
}

/* q (0..3 / 0..7) of weight j (< 32) of 32-weight chunk c of row `row`
 * of an INT2_X8 / INT3_X8 weight (kernels.h). */
static inline unsigned dsq__int23_q(const dsq_weight_t *w, int64_t nb, int64_t row,
                                    int64_t c, int j)
{
    const bool three = w->format == DSQ_WFMT_INT3_X8;
    const uint8_t *ch = (const uint8_t *)w->data + ((row / 8) * nb + c) * (three ? 96 : 64);
    const int h = j / 16, jj = (j % 16) / 4, i = j % 4, r = (int)(row % 8);
    const unsigned lo = (ch[32 * h + 4 * r + i] >> (2 * jj)) & 3;
    return three ? lo | ((ch[64 + 4 * r + i] >> (4 * h + jj)) & 1u) << 2 : lo;
}

/* q (0..31) of weight j (< 32) of 32-weight chunk c of row `row` of an
 * INT5_X8 weight (kernels.h). */
static inline unsigned dsq__int5_q(const dsq_weight_t *w, int64_t nb, int64_t row,
                                   int64_t c, int j)
{
    const uint8_t *ch = (const uint8_t *)w->data + ((row / 8) * nb + c) * 160;
    const int jj = j % 16, p = jj / 4, i = jj % 4, hi = j >= 16, r = (int)(row % 8);
    const unsigned lo = (ch[32 * p + 4 * r + i] >> (4 * hi)) & 15;
    return lo | ((ch[128 + 4 * r + i] >> (2 * p + hi)) & 1u) << 4;
}

/* Activations of one matmul call, quantised per 32-block (see top). */
typedef struct dsq__xq {
    const float *x;      /* fp32 [m][k] original activations               */
    int64_t m, k;
    int64_t k_pad;       /* k rounded up to 32                              */
    int64_t nb;          /* k_pad / 32                                       */
    int8_t *q;           /* [m][k_pad], padding 0                            */
    float *d;            /* [m][nb] block scale: amax / 127                  */
    float *s;            /* [m][nb] d * sum(q of the block)                  */
    int64_t n_groups;    /* INT4/INT8G: groups of the weight (else 0)         */
    int64_t cpg;         /* INT4/INT8G: 32-blocks per group; 0 = group 16     */
    float *gsum;         /* INT4/INT8G: [m][n_groups] sum of x^ over the group
                            (group 16: d * sum(q) of the half block)          */
    /* The panel path only (dsq__mm_avx512_panel; else NULL): the same
     * values with 16 rows in the lanes, rows past m zero. Row block b =
     * rows 16b..16b+15: */
    int8_t *qt;          /* [ceil(m/16)][nb][8][16][4]: bytes 4j..4j+3 of
                            block c                                         */
    float *dt;           /* [ceil(m/16)][nb][16]: d                          */
    float *gst;          /* [ceil(m/16)][n_groups][16]: gsum                 */
} dsq__xq_t;

/* Computes y[m0..m1)[n0..n1) (row stride ldy) for one weight. m1 - m0 is
 * at most the rows the kernel takes a call (DSQ__MM_MR, 8 for
 * dsq__mm_avx512_rows' formats, a whole DSQ__MM_PANEL_M tile for
 * dsq__mm_panel_avx512); callers loop. */
typedef void (*dsq__mm_tile_fn)(float *y, int64_t ldy, const dsq__xq_t *xq,
                                int64_t m0, int64_t m1, const dsq_weight_t *w,
                                int64_t n0, int64_t n1);

/* Tile kernels by format: index DSQ_WFMT_*, plus slot DSQ__MM_INT4_GEN for
 * the INT4 layouts that are not dsq__int4_classic; NULL = use scalar. */
#define DSQ__MM_INT4_GEN DSQ_WFMT_COUNT
#define DSQ__MM_SLOTS (DSQ_WFMT_COUNT + 1)
void dsq__mm_scalar(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]);
void dsq__mm_avx2(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]);
/* The scalar tile of w's format (the SIMD tiles' fallback). */
dsq__mm_tile_fn dsq__mm_scalar_tile(const dsq_weight_t *w);
void dsq__mm_avx512(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]);
/* Activation rows the AVX-512 kernel of w takes per call: 8 for INT4_X8 /
 * INT5_X8 without a codebook (their unpacking then feeds 16 dot products
 * where 4 rows fed 8), else DSQ__MM_MR (also on AArch64). */
int dsq__mm_avx512_rows(const dsq_weight_t *w);
/* Whether dsq_cpu_matmul takes the AVX-512 panel path for m activation
 * rows against w (m >= 16; INT4_X8 / INT5_X8 with group >= 32 and no
 * codebook, INT6_X8, INT2_X8, INT3_X8): whole tiles of DSQ__MM_PANEL_M
 * rows go to dsq__mm_panel_avx512, which reads xq->qt / dt / gst. False
 * off x86 and below AVX-512. */
#define DSQ__MM_PANEL_M 256
bool dsq__mm_avx512_panel(const dsq_weight_t *w, int64_t m);
void dsq__mm_panel_avx512(float *y, int64_t ldy, const dsq__xq_t *xq, int64_t m0, int64_t m1,
                          const dsq_weight_t *w, int64_t n0, int64_t n1);
/* AArch64 (matmul_neon.c): all six formats with plain NEON; the _dot
 * variant then replaces the integer ones with SDOT versions. No-ops
 * elsewhere. */
void dsq__mm_neon(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]);
void dsq__mm_neon_dot(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]);

/* The fp32-activation path of dsq_cpu_matmul (matmul_f32act.c) for
 * w->act == DSQ_ACT_F32 and an INT4/Q8_0/INT8 weight that dsq_cpu_matmul
 * already validated (y, x non-NULL, m > 0). Returns 0 or DSQ_ENOMEM. */
int dsq__matmul_f32act(float *y, const float *x, int64_t m, const dsq_weight_t *w);

/* Row bytes of Q8_0 weights: 34 bytes per 32 weights. */
#define DSQ__Q8_0_BLOCK 34

/* fp32 vector helpers of the attention kernels (kernels/cpu/vec_ops.c):
 * KV dequantisation, and the merge of flash-decoding parts and MLA.
 * n elements, no alignment needed; dot sums in fp32. */
typedef struct dsq__vec_ops {
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);              /* y += a*x  */
    void (*f16)(float *dst, const uint16_t *src, int n);                 /* fp16 -> fp32 */
    void (*i8)(float *dst, const int8_t *q, float s, float c, int n);   /* q*s + c   */
} dsq__vec_ops_t;

/* The helpers for the ISA level in force now (scalar or AVX2). */
const dsq__vec_ops_t *dsq__vec_ops(void);

/* ------------------------------------- attention (attention*.c) */

/* Dequantise kv head kh of cache slot t (K, or V when is_v) into
 * dst[head_dim] fp32 (attention.c). */
void dsq__kv_load(float *dst, const dsq_kv_layer_t *kv, bool is_v, int64_t t, int kh,
                  const dsq__vec_ops_t *ops);

/* Positions [p0, p0 + nj) of kv head kh (K or V) of the sequence with block
 * table btab, dequantised into dst[nj][head_dim] (attention.c). */
void dsq__kv_load_chunk(float *dst, const dsq_kv_layer_t *kv, bool is_v,
                        const int32_t *btab, int32_t p0, int nj, int kh,
                        const dsq__vec_ops_t *ops);

/* Both attention paths walk a row's context in chunks of DSQ__ATT_BK
 * positions starting at multiples of it, and do the same fp32 operations
 * per query vector in either layout (attention_chunk.c says which), so a
 * row's output is bitwise the same in a tile of a prefill chunk and alone
 * as a decode row. */
#define DSQ__ATT_BK 64
/* Scratch floats of one row-layout call of G query vectors. */
#define DSQ__ATT_ROW_WS(G, D) (((size_t)(D) + (size_t)(G)) * DSQ__ATT_BK + (size_t)(G) + 8)

typedef struct dsq__att_ops {
    int lanes;   /* tiles pad their query vectors to a multiple of this */
    /* Tile layout: rp query vectors (rp % lanes == 0) as columns.
     * scores:  st[j][r] = sum_d kb[j][d] qt[d][r], j < nj.
     * softmax: when lim is set, st[j][r] = -inf where p0 + j > lim[r];
     *          then per r: mx' = max(mx, max_j st), cr = e^(mx - mx'),
     *          st = e^(st - mx'), l = l cr + sum_j st; mx = mx'.
     * pv:      ot[d][r] = ot[d][r] cr[r] + sum_j vb[j][d] pt[j][r]. */
    void (*scores)(float *st, int rp, const float *qt, const float *kb, int D, int nj);
    void (*softmax)(float *st, int rp, int nj, float *mx, float *l, float *cr,
                    const int32_t *lim, int32_t p0);
    void (*pv)(float *ot, int rp, const float *pt, const float *vb, int D, int nj,
               const float *cr);
    /* Row layout: the same three steps for the G query vectors qs [G][D]
     * of one row, all keys j < nj visible, state o [G][D], mx [G], l [G].
     * Key j's K and V vectors are read from krow[j] and vrow[j]: fp16
     * when f16, else fp32 (the cache itself for F16 and F32; INT8 is
     * dequantised first, by the same helper the tiles use). The next
     * chunk's nj_next rows follow in krow/vrow (for prefetching; 0 if
     * none). ws: DSQ__ATT_ROW_WS(G, D) floats. */
    void (*row)(float *o, float *mx, float *l, const float *qs, int G, int D,
                const void *const *krow, const void *const *vrow, bool f16, int nj,
                int nj_next, float *ws);
} dsq__att_ops_t;

/* The kernels for the ISA level in force now (scalar or AVX2). */
const dsq__att_ops_t *dsq__att_ops(void);

/* Query vectors (rows x the query heads of a kv head) a tile aims for. */
#define DSQ__ATT_TILE_VECS 96

/* What a tile reads (attention_prefill.c): q [m][n_kv_heads * G][D] fp32,
 * the rows' sequences and positions, the block tables [seq][max_blocks],
 * the softmax scale and the kernels to use. */
typedef struct dsq__tile_in {
    const float *q;
    const dsq_kv_layer_t *kv;
    const int32_t *row_seq, *row_pos, *block_tables;
    int max_blocks, G;
    float scale;
    const dsq__vec_ops_t *ops;
    const dsq__att_ops_t *k;
} dsq__tile_in_t;

/* Scratch floats of one tile of up to `vecs` query vectors (a multiple of
 * 16, so consecutive threads' blocks stay cache-line aligned). */
size_t dsq__att_tile_ws(const dsq__att_ops_t *k, int vecs, int D);

/* One part of a split-KV walk for several rows at once: rows i0..i0+n-1
 * (one sequence, increasing positions, all in the same last chunk) x the
 * G query heads of kv head kh over the chunks [c0, c1) of their context,
 * from an empty state. Writes row i's unnormalised state to dst + i *
 * stride: acc [G][D], then mx [G] (running max), then l [G] (sum of
 * weights relative to mx): per vector the bits attention.c's row walk of
 * the same chunks gives, so the split rows' merge is unchanged. ws:
 * dsq__att_tile_ws(k, n * G, D) floats. */
void dsq__att_tile_part(const dsq__tile_in_t *in, int64_t i0, int n, int kh, int c0, int c1,
                        float *ws, float *dst, size_t stride);

/* The tiled prefill path of dsq_cpu_attention (attention_prefill.c), for
 * arguments it already checked: run k is rows [run_i0[k], run_i0[k] +
 * run_n[k]) of one sequence with strictly increasing positions; writes
 * those rows of out and nothing else. Returns 0 or DSQ_ENOMEM. */
int dsq__attention_prefill(float *out, const float *q, int n_heads,
                           const dsq_kv_layer_t *kv, const int32_t *row_seq,
                           const int32_t *row_pos, const int32_t *block_tables,
                           int max_blocks, float scale, const int64_t *run_i0,
                           const int64_t *run_n, int n_runs);

#endif

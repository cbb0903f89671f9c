/* The dsq_weight_t layouts of kernels.h as code: byte sizes, validation,
 * row views and the IQ4_NL codebook. It sits beside kernels.h, not under
 * cpu/ or cuda/, because it is the specification every side reads: the
 * memory planner, the repackers (engine/model/quant.c), both backends'
 * weight uploads and every kernel agree on a layout by calling it. Each
 * format's reference dequantisation is a CPU op (kernels/cpu/dequant.c). */
#include "kernels.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

size_t dsq_weight_data_bytes(dsq_wformat_t f, int64_t n, int64_t k, int group_size)
{
    (void)group_size;
    if (n < 0 || k < 0)
        return 0;
    size_t un = (size_t)n, uk = (size_t)k;
    switch (f) {
    case DSQ_WFMT_F32:  return un * uk * 4;
    case DSQ_WFMT_F16:
    case DSQ_WFMT_BF16: return un * uk * 2;
    case DSQ_WFMT_Q8_0: return un * ((uk + 31) / 32) * 34;
    case DSQ_WFMT_INT4:
    case DSQ_WFMT_INT4_X8: return un * ((uk + 31) / 32) * 16;
    case DSQ_WFMT_INT8: return un * uk;
    case DSQ_WFMT_INT8G: return un * ((uk + 31) / 32) * 32;
    case DSQ_WFMT_INT6_X8: return un * ((uk + 31) / 32) * 24;
    case DSQ_WFMT_Q8_0_X8: return un * ((uk + 31) / 32) * 34;
    case DSQ_WFMT_INT5_X8: return un * ((uk + 31) / 32) * 20;
    case DSQ_WFMT_INT2_X8: return un * ((uk + 31) / 32) * 8;
    case DSQ_WFMT_INT3_X8: return un * ((uk + 31) / 32) * 12;
    }
    return 0;
}

size_t dsq_weight_scale_bytes(dsq_wformat_t f, int64_t n, int64_t k, int group_size)
{
    if (n < 0 || k < 0)
        return 0;
    switch (f) {
    case DSQ_WFMT_INT4:
    case DSQ_WFMT_INT4_X8:
        if (group_size <= 0)
            return 0;
        return (size_t)n * (size_t)((k + group_size - 1) / group_size) * 2;
    case DSQ_WFMT_INT8G:
        if (group_size <= 0)
            return 0;
        return (size_t)n * (size_t)((k + group_size - 1) / group_size) * 2;
    case DSQ_WFMT_INT8:
        return (size_t)n * 2;
    default:
        return 0;
    }
}


const int8_t dsq_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

int dsq_weight_layout(const dsq_weight_t *w, dsq_weight_bytes_t *b)
{
    if (!w || !b || w->n < 1 || w->k < 1)
        return DSQ_EINVAL;
    memset(b, 0, sizeof(*b));
    const size_t n = (size_t)w->n, kp = (size_t)((w->k + 31) / 32 * 32);
    const int gs = w->group_size;
    if (w->format == DSQ_WFMT_INT4_X8 || w->format == DSQ_WFMT_INT5_X8) {
        /* the INT4 layout's arrays, rows regrouped 8 at a time (INT5: plus
         * a plane of top bits; group 32, SYM or MIN, as the Q5 types) */
        const bool super = w->scale_mode == DSQ_SCALE_SUPER;
        const bool five = w->format == DSQ_WFMT_INT5_X8;
        if (w->n % 8 || (w->scale_mode != DSQ_SCALE_F16 && !super) ||
            (gs != 32 && gs != 64 && gs != 128) || (super && (gs != 32 || w->k % 256)))
            return DSQ_EINVAL;
        if (w->zp_mode != DSQ_ZP_SYM && w->zp_mode != DSQ_ZP_INT &&
            w->zp_mode != DSQ_ZP_MIN && w->zp_mode != DSQ_ZP_LUT)
            return DSQ_EINVAL;
        if (five && (gs != 32 || (w->zp_mode != DSQ_ZP_SYM && w->zp_mode != DSQ_ZP_MIN)))
            return DSQ_EINVAL;
        /* SUPER: Q4_K / Q5_K's 6-bit sub-scales and mins, 12 bytes a
         * super-block row as in the file (no sub_zeros array) */
        if (super && w->zp_mode != DSQ_ZP_MIN)
            return DSQ_EINVAL;
        b->data = five ? n * kp / 32 * 20 : n * kp / 2;
        b->scales = super ? n * (size_t)(w->k / 256) * 12
                          : n * (size_t)((w->k + gs - 1) / gs) * 2;
        b->zeros = !super && (w->zp_mode == DSQ_ZP_INT || w->zp_mode == DSQ_ZP_MIN)
                       ? b->scales : 0;
        b->super = super ? n * (size_t)(w->k / 256) * 4 : 0;
        b->total = b->data + b->scales + b->zeros + b->super;
        return DSQ_OK;
    }
    if (w->format == DSQ_WFMT_INT6_X8) {
        /* GGUF Q6_K's layout only: SUPER, group 16, q - 32 */
        if (w->n % 8 || w->k % 256 || w->scale_mode != DSQ_SCALE_SUPER || gs != 16 ||
            w->zp_mode != DSQ_ZP_SYM)
            return DSQ_EINVAL;
        b->data = n * kp / 32 * 24;
        b->scales = n * (size_t)(w->k / 16);
        b->super = n * (size_t)(w->k / 256) * 2;    /* d alone */
        b->total = b->data + b->scales + b->super;
        return DSQ_OK;
    }
    if (w->format == DSQ_WFMT_INT2_X8 || w->format == DSQ_WFMT_INT3_X8) {
        /* GGUF Q2_K's and Q3_K's layouts only: SUPER, group 16 */
        const bool three = w->format == DSQ_WFMT_INT3_X8;
        if (w->n % 8 || w->k % 256 || w->scale_mode != DSQ_SCALE_SUPER || gs != 16 ||
            w->zp_mode != (three ? DSQ_ZP_SYM : DSQ_ZP_MIN))
            return DSQ_EINVAL;
        const size_t sbs = (size_t)(w->k / 256);
        b->data = n * kp / 32 * (three ? 12 : 8);
        b->scales = n * sbs * (three ? 12 : 16);
        b->super = n * sbs * (three ? 2 : 4);
        b->total = b->data + b->scales + b->super;
        return DSQ_OK;
    }
    if (w->format != DSQ_WFMT_INT4 && w->format != DSQ_WFMT_INT8G) {
        if (w->scale_mode != DSQ_SCALE_F16)
            return DSQ_EINVAL;
        if ((w->format == DSQ_WFMT_Q8_0 || w->format == DSQ_WFMT_Q8_0_X8) && w->k % 32)
            return DSQ_EINVAL;
        if (w->format == DSQ_WFMT_Q8_0_X8 && w->n % 8)
            return DSQ_EINVAL;
        b->data = dsq_weight_data_bytes(w->format, w->n, w->k, gs);
        b->scales = dsq_weight_scale_bytes(w->format, w->n, w->k, gs);
        b->total = b->data + b->scales;
        return b->data ? DSQ_OK : DSQ_EINVAL;
    }
    const bool int4 = w->format == DSQ_WFMT_INT4;
    const dsq_zp_mode_t zp = w->zp_mode;
    if (int4 ? (gs != 16 && gs != 32 && gs != 64 && gs != 128) : (gs != 16 && gs != 32))
        return DSQ_EINVAL;
    if (zp != DSQ_ZP_SYM && zp != DSQ_ZP_INT && zp != DSQ_ZP_MIN && zp != DSQ_ZP_LUT)
        return DSQ_EINVAL;
    if (!int4 && zp != DSQ_ZP_SYM && zp != DSQ_ZP_MIN)
        return DSQ_EINVAL;
    const size_t groups = (size_t)((w->k + gs - 1) / gs);
    const bool has_zero = zp == DSQ_ZP_INT || zp == DSQ_ZP_MIN;
    b->data = int4 ? n * kp / 2 : n * kp;
    if (w->scale_mode == DSQ_SCALE_F16) {
        b->scales = n * groups * 2;
        b->zeros = has_zero ? b->scales : 0;
    } else if (w->scale_mode == DSQ_SCALE_SUPER) {
        if (w->k % 256 || gs > 32)
            return DSQ_EINVAL;
        if (zp == DSQ_ZP_LUT) {
            /* IQ4_XS's own bytes: 6-bit sub-scales, d alone */
            if (!int4 || gs != 32)
                return DSQ_EINVAL;
            b->scales = n * (size_t)(w->k / 256) * 6;
            b->super = n * (size_t)(w->k / 256) * 2;
            b->total = b->data + b->scales + b->super;
            return DSQ_OK;
        }
        b->scales = n * groups;
        b->zeros = has_zero ? b->scales : 0;
        b->super = n * (size_t)(w->k / 256) * 4;
    } else {
        return DSQ_EINVAL;
    }
    b->total = b->data + b->scales + b->zeros + b->super;
    return DSQ_OK;
}

int dsq_weight_check(const dsq_weight_t *w)
{
    dsq_weight_bytes_t b;
    if (dsq_weight_layout(w, &b) != DSQ_OK || !w->data)
        return DSQ_EINVAL;
    if (w->format == DSQ_WFMT_INT8 && !w->scales)
        return DSQ_EINVAL;
    if (w->format != DSQ_WFMT_INT4 && w->format != DSQ_WFMT_INT8G &&
        w->format != DSQ_WFMT_INT4_X8 && w->format != DSQ_WFMT_INT6_X8 &&
        w->format != DSQ_WFMT_INT5_X8 && w->format != DSQ_WFMT_INT2_X8 &&
        w->format != DSQ_WFMT_INT3_X8)
        return DSQ_OK;
    if (w->scale_mode == DSQ_SCALE_SUPER)
        return w->sub_scales && w->super && (!b.zeros || w->sub_zeros) ? DSQ_OK
                                                                      : DSQ_EINVAL;
    return w->scales && (!b.zeros || w->zeros) ? DSQ_OK : DSQ_EINVAL;
}

int dsq_weight_rows(const dsq_weight_t *w, int64_t r0, int64_t n, dsq_weight_t *out)
{
    dsq_weight_bytes_t b;
    if (!out || dsq_weight_layout(w, &b) != DSQ_OK || r0 < 0 || n < 1 || r0 + n > w->n)
        return DSQ_EINVAL;
    /* an interleaved weight keeps whole tiles contiguous, not rows */
    if ((w->format == DSQ_WFMT_INT4_X8 || w->format == DSQ_WFMT_INT6_X8 ||
         w->format == DSQ_WFMT_Q8_0_X8 || w->format == DSQ_WFMT_INT5_X8 ||
         w->format == DSQ_WFMT_INT2_X8 || w->format == DSQ_WFMT_INT3_X8) &&
        (r0 % 8 || n % 8))
        return DSQ_EINVAL;
    const size_t rn = (size_t)w->n, o = (size_t)r0;
    dsq_weight_t v = *w;
    v.n = n;
    v.data = (const uint8_t *)w->data + o * (b.data / rn);
    if (w->scales)
        v.scales = (const uint16_t *)((const uint8_t *)w->scales + o * (b.scales / rn));
    if (w->zeros)
        v.zeros = (const uint16_t *)((const uint8_t *)w->zeros + o * (b.zeros / rn));
    if (w->sub_scales)
        v.sub_scales = w->sub_scales + o * (b.scales / rn);
    if (w->sub_zeros)
        v.sub_zeros = w->sub_zeros + o * (b.zeros / rn);
    if (w->super)
        v.super = (const uint16_t *)((const uint8_t *)w->super + o * (b.super / rn));
    if (w->bias)
        v.bias = w->bias + r0;
    *out = v;
    return DSQ_OK;
}

/* Rows [r0, r0 + 8) of one array of `per_row` bytes a row: from row-major
 * (native) to tile order, where unit u (of `unit` bytes) of row r goes to
 * position u * 8 + r (scales, zeros: unit 2; qweight: unit 4 within each
 * 16-byte chunk, handled by the caller through chunk-sized calls). */
static void tile_transpose(uint8_t *tile, uint8_t *tmp, size_t per_row, size_t unit)
{
    memcpy(tmp, tile, 8 * per_row);
    const size_t units = per_row / unit;
    for (size_t r = 0; r < 8; r++)
        for (size_t u = 0; u < units; u++)
            memcpy(tile + (u * 8 + r) * unit, tmp + r * per_row + u * unit, unit);
}

/* 128 values of 6 bits into 96 bytes: low nibbles in pairs, then 2-bit
 * planes (the X8 formats' 6-bit sub-scale packing, kernels.h). */
static void sub6_bytes(const uint8_t v[128], uint8_t *o)
{
    for (int j = 0; j < 64; j++)
        o[j] = (uint8_t)((v[j] & 15) | (v[64 + j] & 15) << 4);
    for (int j = 0; j < 32; j++)
        o[64 + j] = (uint8_t)(v[j] >> 4 | (v[32 + j] >> 4) << 2 | (v[64 + j] >> 4) << 4 |
                              (v[96 + j] >> 4) << 6);
}

/* The sub-scales a and mins b of a SUPER group-32 weight (row-major int8
 * [n][k/32] each, every one 0..63: GGUF Q4_K, Q5_K) into the X8 formats'
 * 6-bit array at dst, [n/8][k/256][96] (kernels.h). DSQ_EINVAL when one
 * does not fit 6 bits. */
static int pack_sub6(const dsq_weight_t *src, uint8_t *dst)
{
    const int64_t groups = src->k / 32, sbs = src->k / 256;
    for (int64_t t = 0; t < src->n / 8; t++)
        for (int64_t s = 0; s < sbs; s++) {
            uint8_t v[128], *o = dst + (t * sbs + s) * 96;
            for (int g = 0; g < 8; g++)
                for (int r = 0; r < 8; r++) {
                    const int64_t i = (8 * t + r) * groups + 8 * s + g;
                    const int a = src->sub_scales[i], b = src->sub_zeros[i];
                    if (a < 0 || a > 63 || b < 0 || b > 63)
                        return DSQ_EINVAL;
                    v[8 * g + r] = (uint8_t)a;
                    v[64 + 8 * g + r] = (uint8_t)b;
                }
            sub6_bytes(v, o);
        }
    return DSQ_OK;
}

int dsq_weight_interleave_x8(dsq_weight_t *w)
{
    /* SUPER weights shrink (6-bit sub-scales): dsq_weight_pack_x8 */
    if (!w || w->format != DSQ_WFMT_INT4 || w->scale_mode != DSQ_SCALE_F16 ||
        dsq_weight_check(w) != DSQ_OK)
        return DSQ_EINVAL;
    dsq_weight_t x = *w;
    x.format = DSQ_WFMT_INT4_X8;
    dsq_weight_bytes_t b;
    if (dsq_weight_layout(&x, &b) != DSQ_OK)
        return DSQ_EINVAL;
    const size_t tiles = (size_t)w->n / 8, row_data = b.data / (size_t)w->n,
                 row_sc = b.scales / (size_t)w->n;
    uint8_t *tmp = malloc(8 * (row_data > row_sc ? row_data : row_sc));
    if (!tmp)
        return DSQ_ENOMEM;
    uint8_t *data = (uint8_t *)w->data;
    const size_t chunks = row_data / 16;
    for (size_t t = 0; t < tiles; t++) {
        /* qweight: [8 rows][chunks][4 units of 4 bytes] -> [chunks][4][8 rows][4] */
        uint8_t *td = data + t * 8 * row_data;
        memcpy(tmp, td, 8 * row_data);
        for (size_t c = 0; c < chunks; c++)
            for (size_t p = 0; p < 4; p++)
                for (size_t r = 0; r < 8; r++)
                    memcpy(td + c * 128 + p * 32 + r * 4, tmp + r * row_data + c * 16 + p * 4, 4);
        tile_transpose((uint8_t *)w->scales + t * 8 * row_sc, tmp, row_sc, 2);
        if (w->zeros && b.zeros)
            tile_transpose((uint8_t *)w->zeros + t * 8 * row_sc, tmp, row_sc, 2);
    }
    free(tmp);
    w->format = DSQ_WFMT_INT4_X8;
    return DSQ_OK;
}

/* Q8_0 -> Q8_0_X8 (kernels.h): per tile and block, the 8 rows' d, then
 * their q in units of 4 bytes, row-minor. */
static int pack_q8_0_x8(const dsq_weight_t *src, dsq_weight_t *dst, void **storage)
{
    dsq_weight_t x = *src;
    x.format = DSQ_WFMT_Q8_0_X8;
    dsq_weight_bytes_t b;
    if (dsq_weight_layout(&x, &b) != DSQ_OK)
        return DSQ_EINVAL;
    uint8_t *p = aligned_alloc(64, (b.data + 63) / 64 * 64);
    if (!p)
        return DSQ_ENOMEM;
    const int64_t nb = src->k / 32;
    const uint8_t *q = src->data;
    for (int64_t row = 0; row < src->n; row++) {
        const int64_t t = row / 8, r = row % 8;
        for (int64_t c = 0; c < nb; c++) {
            const uint8_t *blk = q + (row * nb + c) * 34;
            uint8_t *o = p + (t * nb + c) * 272;
            memcpy(o + 2 * r, blk, 2);
            for (int u = 0; u < 8; u++)
                memcpy(o + 16 + 32 * u + 4 * r, blk + 2 + 4 * u, 4);
        }
    }
    memset(p + b.data, 0, (b.data + 63) / 64 * 64 - b.data);
    x.data = p;
    *dst = x;
    *storage = p;
    return DSQ_OK;
}

int dsq_weight_x8_twin(const dsq_weight_t *w, dsq_weight_t *out)
{
    dsq_weight_bytes_t b;
    if (!w || !out || dsq_weight_layout(w, &b) != DSQ_OK)
        return DSQ_EINVAL;
    dsq_weight_t x = *w;
    switch (w->format) {
    case DSQ_WFMT_INT4:
        x.format = DSQ_WFMT_INT4_X8;
        if (w->scale_mode == DSQ_SCALE_SUPER && w->group_size == 16) {
            /* Q2_K's 2 bits and mins, Q3_K's 3 bits less 4 (pack checks) */
            x.format = w->zp_mode == DSQ_ZP_INT ? DSQ_WFMT_INT3_X8 : DSQ_WFMT_INT2_X8;
            if (w->zp_mode == DSQ_ZP_INT)
                x.zp_mode = DSQ_ZP_SYM;
        }
        break;
    case DSQ_WFMT_INT8G:
        x.format = w->group_size == 16 ? DSQ_WFMT_INT6_X8 : DSQ_WFMT_INT5_X8;
        break;
    case DSQ_WFMT_Q8_0: x.format = DSQ_WFMT_Q8_0_X8; break;
    default: return DSQ_EINVAL;
    }
    if (dsq_weight_layout(&x, &b) != DSQ_OK)
        return DSQ_EINVAL;
    *out = x;
    return DSQ_OK;
}

/* A new 64-byte aligned block for x (INT4_X8 or INT5_X8, made from src:
 * INT4 or INT8G, group 32), data | scales | zeros | super as kernels.h
 * lays them out, with src's scale arrays in tile order: F16 scales (and
 * zeros) [n/8][groups][8]; SUPER the 6-bit sub-scales and the (d, dm)
 * pairs [n/8][k/256][2][8]. Points x's arrays at them (x->data at the
 * block, its bytes the caller's to fill) and returns the block in *out
 * (free()). DSQ_EINVAL (a sub-scale does not fit 6 bits) or DSQ_ENOMEM:
 * nothing allocated. */
static int x8_block(const dsq_weight_t *src, dsq_weight_t *x, uint8_t **out)
{
    dsq_weight_bytes_t bb;
    if (dsq_weight_layout(x, &bb) != DSQ_OK)
        return DSQ_EINVAL;
    const dsq_weight_bytes_t *b = &bb;
    const size_t zb = (b->zeros + 63) / 64 * 64, pb = (b->super + 63) / 64 * 64;
    const size_t db = (b->data + 63) / 64 * 64, sb = (b->scales + 63) / 64 * 64;
    const int64_t groups = (src->k + 31) / 32, sbs = src->k / 256;
    uint8_t *p = aligned_alloc(64, db + sb + zb + pb);
    if (!p)
        return DSQ_ENOMEM;
    memset(p + b->data, 0, db + sb + zb + pb - b->data);
    x->data = p;
    *out = p;
    x->scales = x->zeros = NULL;
    x->sub_scales = x->sub_zeros = NULL;
    x->super = NULL;
    if (src->scale_mode == DSQ_SCALE_SUPER) {
        if (pack_sub6(src, p + db) != DSQ_OK) {
            free(p);
            *out = NULL;
            return DSQ_EINVAL;
        }
        uint16_t *sup = (uint16_t *)(p + db + sb);
        for (int64_t row = 0; row < src->n; row++)
            for (int64_t s2 = 0; s2 < sbs; s2++) {
                const int64_t t = row / 8, r = row % 8;
                sup[(t * sbs + s2) * 16 + r] = src->super[2 * (row * sbs + s2)];
                sup[(t * sbs + s2) * 16 + 8 + r] = src->super[2 * (row * sbs + s2) + 1];
            }
        x->sub_scales = (const int8_t *)(p + db);
        x->super = sup;
        return DSQ_OK;
    }
    uint16_t *sc = (uint16_t *)(p + db), *zr = (uint16_t *)(p + db + sb);
    for (int64_t row = 0; row < src->n; row++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t i = ((row / 8) * groups + g) * 8 + row % 8;
            sc[i] = src->scales[row * groups + g];
            if (b->zeros)
                zr[i] = src->zeros[row * groups + g];
        }
    x->scales = sc;
    x->zeros = b->zeros ? zr : NULL;
    return DSQ_OK;
}

/* INT4 SUPER (group 32, MIN: GGUF Q4_K) -> INT4_X8: the nibbles regrouped
 * as dsq_weight_interleave_x8 does, the sub-scales packed to 6 bits, into
 * a new block (the file's 144 bytes per 256 weights of a row). */
static int pack_int4_x8(const dsq_weight_t *src, const dsq_weight_t *x0, void **storage,
                        dsq_weight_t *dst)
{
    dsq_weight_t x = *x0;
    uint8_t *p;
    const int rc = x8_block(src, &x, &p);
    if (rc != DSQ_OK)
        return rc;
    const int64_t nb = (src->k + 31) / 32;
    const uint8_t *q = src->data;
    for (int64_t row = 0; row < src->n; row++)
        for (int64_t c = 0; c < nb; c++)
            for (int pp = 0; pp < 4; pp++)
                memcpy(p + ((row / 8) * nb + c) * 128 + 32 * pp + 4 * (row % 8),
                       q + (row * nb + c) * 16 + 4 * pp, 4);
    *dst = x;
    *storage = p;
    return DSQ_OK;
}

/* INT8G (group 32, SYM or MIN) -> INT5_X8 (kernels.h): q made 0..31 (SYM:
 * + 16), nibbles as INT4_X8's, top bits in the plane after them; the
 * scale arrays as INT4_X8's. */
static int pack_int5_x8(const dsq_weight_t *src, const dsq_weight_t *x0, void **storage,
                        dsq_weight_t *dst)
{
    dsq_weight_t x = *x0;
    const int64_t kp = (src->k + 31) / 32 * 32, nb = kp / 32;
    const int off = src->zp_mode == DSQ_ZP_SYM ? 16 : 0;
    const int8_t *q8 = src->data;
    for (int64_t i = 0; i < src->n * kp; i++)
        if (q8[i] + off < 0 || q8[i] + off > 31)
            return DSQ_EINVAL;
    uint8_t *p;
    const int rc = x8_block(src, &x, &p);
    if (rc != DSQ_OK)
        return rc;
    for (int64_t row = 0; row < src->n; row++) {
        const int64_t t = row / 8, r = row % 8;
        for (int64_t c = 0; c < nb; c++) {
            uint8_t *ch = p + (t * nb + c) * 160 + 4 * r, q[32];
            for (int j = 0; j < 32; j++)
                q[j] = (uint8_t)(q8[row * kp + c * 32 + j] + off);
            for (int pp = 0; pp < 4; pp++)
                for (int i = 0; i < 4; i++)
                    ch[32 * pp + i] =
                        (uint8_t)((q[4 * pp + i] & 15) | (q[16 + 4 * pp + i] & 15) << 4);
            for (int i = 0; i < 4; i++) {
                unsigned top = 0;
                for (int pp = 0; pp < 4; pp++)
                    top |= (unsigned)(q[4 * pp + i] >> 4) << (2 * pp) |
                           (unsigned)(q[16 + 4 * pp + i] >> 4) << (2 * pp + 1);
                ch[128 + i] = (uint8_t)top;
            }
        }
    }
    *dst = x;
    *storage = p;
    return DSQ_OK;
}

/* INT4 SUPER group 16 -> INT2_X8 (MIN: GGUF Q2_K) or INT3_X8 (INT with
 * z = 4: Q3_K), kernels.h: q's low 2 bits by group and shift, Q3_K's bit
 * 2 in a plane after them, the sub-scales in the file's bits. Checks every
 * value first: DSQ_EINVAL with nothing allocated when one does not fit. */
static int pack_low_x8(const dsq_weight_t *src, const dsq_weight_t *x0, void **storage,
                       dsq_weight_t *dst)
{
    dsq_weight_t x = *x0;
    dsq_weight_bytes_t b;
    if (dsq_weight_layout(&x, &b) != DSQ_OK)
        return DSQ_EINVAL;
    const bool three = x.format == DSQ_WFMT_INT3_X8;
    const int64_t nb = src->k / 32, groups = src->k / 16, sbs = src->k / 256;
    const int64_t cb = three ? 96 : 64;
    const uint8_t *q4 = src->data;
    const int qmax = three ? 7 : 3;
    for (int64_t i = 0; i < src->n * nb * 16; i++)
        if ((q4[i] & 15) > qmax || (q4[i] >> 4) > qmax)
            return DSQ_EINVAL;
    for (int64_t i = 0; i < src->n * groups; i++) {
        const int a = src->sub_scales[i], z = src->sub_zeros[i];
        if (three ? (a < -32 || a > 31 || z != 4) : (a < 0 || a > 15 || z < 0 || z > 15))
            return DSQ_EINVAL;
    }
    const size_t db = (b.data + 63) / 64 * 64, sb = (b.scales + 63) / 64 * 64,
                 pb = (b.super + 63) / 64 * 64;
    uint8_t *p = aligned_alloc(64, db + sb + pb);
    if (!p)
        return DSQ_ENOMEM;
    memset(p, 0, db + sb + pb);
    uint8_t *ss = p + db;
    uint16_t *sup = (uint16_t *)(p + db + sb);
    for (int64_t row = 0; row < src->n; row++) {
        const int64_t t = row / 8, r = row % 8;
        for (int64_t c = 0; c < nb; c++) {
            uint8_t *ch = p + (t * nb + c) * cb + 4 * r, q[32];
            for (int j = 0; j < 16; j++) {
                q[j] = q4[(row * nb + c) * 16 + j] & 15;
                q[j + 16] = q4[(row * nb + c) * 16 + j] >> 4;
            }
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 4; j++)
                    for (int i = 0; i < 4; i++) {
                        const int v = q[16 * h + 4 * j + i];
                        ch[32 * h + i] |= (uint8_t)((v & 3) << 2 * j);
                        if (three)
                            ch[64 + i] |= (uint8_t)((v >> 2) << (4 * h + j));
                    }
        }
        for (int64_t s = 0; s < sbs; s++) {
            const int64_t i0 = row * groups + 16 * s;
            if (three) {
                sup[(t * sbs + s) * 8 + r] = src->super[2 * (row * sbs + s)];
            } else {
                for (int g = 0; g < 16; g++)
                    ss[(t * sbs + s) * 128 + 8 * g + r] =
                        (uint8_t)(src->sub_scales[i0 + g] | src->sub_zeros[i0 + g] << 4);
                sup[(t * sbs + s) * 16 + r] = src->super[2 * (row * sbs + s)];
                sup[(t * sbs + s) * 16 + 8 + r] = src->super[2 * (row * sbs + s) + 1];
            }
        }
    }
    if (three)
        for (int64_t t = 0; t < src->n / 8; t++)
            for (int64_t s = 0; s < sbs; s++) {
                uint8_t v[128];
                for (int g = 0; g < 16; g++)
                    for (int r = 0; r < 8; r++)
                        v[8 * g + r] =
                            (uint8_t)(src->sub_scales[(8 * t + r) * groups + 16 * s + g] + 32);
                sub6_bytes(v, ss + (t * sbs + s) * 96);
            }
    x.data = p;
    x.scales = x.zeros = NULL;
    x.sub_scales = (const int8_t *)ss;
    x.sub_zeros = NULL;
    x.super = sup;
    *dst = x;
    *storage = p;
    return DSQ_OK;
}

int dsq_weight_pack_x8(const dsq_weight_t *src, dsq_weight_t *dst, void **storage)
{
    dsq_weight_t x;
    if (!src || !dst || !storage || dsq_weight_check(src) != DSQ_OK ||
        dsq_weight_x8_twin(src, &x) != DSQ_OK)
        return DSQ_EINVAL;
    if (x.format == DSQ_WFMT_Q8_0_X8)
        return pack_q8_0_x8(src, dst, storage);
    if (x.format == DSQ_WFMT_INT5_X8)
        return pack_int5_x8(src, &x, storage, dst);
    if (x.format == DSQ_WFMT_INT2_X8 || x.format == DSQ_WFMT_INT3_X8)
        return pack_low_x8(src, &x, storage, dst);
    if (x.format == DSQ_WFMT_INT4_X8 && src->scale_mode == DSQ_SCALE_SUPER)
        return pack_int4_x8(src, &x, storage, dst);
    if (x.format != DSQ_WFMT_INT6_X8)
        return DSQ_EINVAL;
    dsq_weight_bytes_t b;
    if (dsq_weight_layout(&x, &b) != DSQ_OK)
        return DSQ_EINVAL;
    const int64_t kp = (src->k + 31) / 32 * 32, nb = kp / 32, groups = src->k / 16,
                  sbs = src->k / 256;
    const int8_t *q8 = src->data;
    for (int64_t i = 0; i < src->n * kp; i++)
        if (q8[i] < -32 || q8[i] > 31)
            return DSQ_EINVAL;
    const size_t db = (b.data + 63) / 64 * 64, sb = (b.scales + 63) / 64 * 64;
    uint8_t *p = aligned_alloc(64, db + sb + (b.super + 63) / 64 * 64);
    if (!p)
        return DSQ_ENOMEM;
    memset(p + b.data, 0, db + sb + (b.super + 63) / 64 * 64 - b.data);
    int8_t *ss = (int8_t *)(p + db);
    uint16_t *sup = (uint16_t *)(p + db + sb);
    for (int64_t row = 0; row < src->n; row++) {
        const int64_t t = row / 8, r = row % 8;
        for (int64_t c = 0; c < nb; c++) {
            uint8_t *ch = p + (t * nb + c) * 192 + 4 * r, q[32];
            for (int j = 0; j < 32; j++)
                q[j] = (uint8_t)(q8[row * kp + c * 32 + j] + 32);
            /* nibble load pp: low nibbles weights 4pp + i, high 16 + 4pp + i */
            for (int pp = 0; pp < 4; pp++)
                for (int i = 0; i < 4; i++)
                    ch[32 * pp + i] =
                        (uint8_t)((q[4 * pp + i] & 15) | (q[16 + 4 * pp + i] & 15) << 4);
            /* top bits, byte h: weights 8h + i, 16 + 8h + i, 8h + 4 + i, 20 + 8h + i */
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 4; i++)
                    ch[128 + 32 * h + i] =
                        (uint8_t)(q[8 * h + i] >> 4 | (q[16 + 8 * h + i] >> 4) << 2 |
                                  (q[8 * h + 4 + i] >> 4) << 4 | (q[20 + 8 * h + i] >> 4) << 6);
        }
        for (int64_t g = 0; g < groups; g++)
            ss[(t * groups + g) * 8 + r] = src->sub_scales[row * groups + g];
        for (int64_t s = 0; s < sbs; s++)
            sup[(t * sbs + s) * 8 + r] = src->super[2 * (row * sbs + s)];
    }
    x.data = p;
    x.scales = x.zeros = NULL;
    x.sub_scales = ss;
    x.sub_zeros = NULL;
    x.super = sup;
    *dst = x;
    *storage = p;
    return DSQ_OK;
}

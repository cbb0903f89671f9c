/* Repacking into the kernels' native weight layout (see quant.h and
 * kernels.h), done once at load.
 *
 * Exact formats are moved nibble by nibble (Q4_0/Q4_1: block copy; AWQ and
 * GPTQ: unpack, transpose to [n][k], repack into 32-weight chunks whose byte
 * j holds weights j and j+16). Float weights become zero-copy views. RTN
 * rounds scales up to fp16 before quantising, so the stored scale is the
 * one the error bound s/2 holds for. All results live in one malloc'd block
 * per weight (data | scales | zeros, each 64-byte aligned).
 */
#include "quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

static int fail(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static size_t align64(size_t b) { return (b + 63) / 64 * 64; }

/* Allocate one zeroed block for an INT4/INT8/copied weight and point w's
 * arrays into it. */
static int alloc_weight(dsq_weight_t *w, void **storage, bool with_zeros)
{
    size_t db = align64(dsq_weight_data_bytes(w->format, w->n, w->k, w->group_size));
    size_t sb = align64(dsq_weight_scale_bytes(w->format, w->n, w->k, w->group_size));
    size_t zb = with_zeros ? sb : 0;
    char *p = aligned_alloc(64, db + sb + zb > 0 ? db + sb + zb : 64);
    if (!p)
        return DSQ_ENOMEM;
    memset(p, 0, db + sb + zb);
    w->data = p;
    w->scales = sb ? (const uint16_t *)(p + db) : NULL;
    w->zeros = zb ? (const uint16_t *)(p + db + sb) : NULL;
    *storage = p;
    return DSQ_OK;
}

static int64_t n_groups(const dsq_weight_t *w)
{
    return (w->k + w->group_size - 1) / w->group_size;
}

/* Put nibble q of weight (row, j) into the native INT4 layout. */
static inline void put_nibble(uint8_t *data, int64_t k, int64_t row, int64_t j, unsigned q)
{
    int64_t rb = (k + 31) / 32 * 16;
    uint8_t *b = data + row * rb + (j / 32) * 16 + (j % 16);
    if (j % 32 < 16)
        *b = (uint8_t)((*b & 0xF0) | (q & 15));
    else
        *b = (uint8_t)((*b & 0x0F) | ((q & 15) << 4));
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* fp16 of v >= 0 rounded up (never below v); 0 for v == 0. */
static uint16_t fp16_up(float v)
{
    uint16_t h = dsq_fp32_to_fp16(v);
    if (dsq_fp16_to_fp32(h) < v)
        h++;
    return h;
}

static int tensor_dims(const dsq_tensor_t *t, int64_t *n, int64_t *k)
{
    if (!t || !t->data || t->n_dims < 1 || t->n_dims > 4)
        return DSQ_EINVAL;
    *k = t->ne[0];
    *n = 1;
    for (int i = 1; i < 4; i++) {
        if (t->ne[i] < 1)
            return DSQ_EINVAL;
        *n *= t->ne[i];
    }
    return *k > 0 ? DSQ_OK : DSQ_EINVAL;
}

/* ------------------------------------------------------------------ GGUF */

/* k-quant 6-bit scale/min of sub-block j from the 12 packed bytes (ggml's
 * get_scale_min_k4, used by Q4_K and Q5_K: j<4 low 6 bits of bytes j / j+4;
 * j>=4 nibbles of byte j+4 plus the top 2 bits of bytes j-4 / j). */
static void q4k_scale_min(const uint8_t *q, int j, unsigned *sc, unsigned *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The native layout one GGUF type repacks into (quant.h). Returns 0 or
 * DSQ_EUNSUPPORTED. */
static int gguf_native(dsq_type_t type, dsq_weight_t *w)
{
    w->scale_mode = DSQ_SCALE_F16;
    switch (type) {
    case DSQ_TYPE_F32: w->format = DSQ_WFMT_F32; break;
    case DSQ_TYPE_F16: w->format = DSQ_WFMT_F16; break;
    case DSQ_TYPE_BF16: w->format = DSQ_WFMT_BF16; break;
    case DSQ_TYPE_Q8_0: w->format = DSQ_WFMT_Q8_0; w->group_size = 32; break;
#define NATIVE(T, F, G, Z, S) \
    case T: w->format = F; w->group_size = G; w->zp_mode = Z; w->scale_mode = S; break;
    NATIVE(DSQ_TYPE_Q4_0, DSQ_WFMT_INT4, 32, DSQ_ZP_SYM, DSQ_SCALE_F16)
    NATIVE(DSQ_TYPE_Q4_1, DSQ_WFMT_INT4, 32, DSQ_ZP_MIN, DSQ_SCALE_F16)
    NATIVE(DSQ_TYPE_IQ4_NL, DSQ_WFMT_INT4, 32, DSQ_ZP_LUT, DSQ_SCALE_F16)
    NATIVE(DSQ_TYPE_Q2_K, DSQ_WFMT_INT4, 16, DSQ_ZP_MIN, DSQ_SCALE_SUPER)
    NATIVE(DSQ_TYPE_Q3_K, DSQ_WFMT_INT4, 16, DSQ_ZP_INT, DSQ_SCALE_SUPER)
    NATIVE(DSQ_TYPE_Q4_K, DSQ_WFMT_INT4, 32, DSQ_ZP_MIN, DSQ_SCALE_SUPER)
    NATIVE(DSQ_TYPE_IQ4_XS, DSQ_WFMT_INT4, 32, DSQ_ZP_LUT, DSQ_SCALE_SUPER)
    NATIVE(DSQ_TYPE_Q5_0, DSQ_WFMT_INT8G, 32, DSQ_ZP_SYM, DSQ_SCALE_F16)
    NATIVE(DSQ_TYPE_Q5_1, DSQ_WFMT_INT8G, 32, DSQ_ZP_MIN, DSQ_SCALE_F16)
    NATIVE(DSQ_TYPE_Q5_K, DSQ_WFMT_INT8G, 32, DSQ_ZP_MIN, DSQ_SCALE_SUPER)
    NATIVE(DSQ_TYPE_Q6_K, DSQ_WFMT_INT8G, 16, DSQ_ZP_SYM, DSQ_SCALE_SUPER)
#undef NATIVE
    default:
        return DSQ_EUNSUPPORTED;
    }
    return DSQ_OK;
}

bool dsq_quant_gguf_readable(dsq_type_t type)
{
    dsq_weight_t w = {0};
    return gguf_native(type, &w) == DSQ_OK;
}

int dsq_quant_gguf_layout(dsq_type_t type, int64_t n, int64_t k, dsq_weight_t *w)
{
    dsq_weight_bytes_t b;
    if (!w)
        return DSQ_EINVAL;
    memset(w, 0, sizeof(*w));
    w->n = n;
    w->k = k;
    int rc = gguf_native(type, w);
    if (rc != DSQ_OK)
        return rc;
    return dsq_weight_layout(w, &b) == DSQ_OK ? DSQ_OK : DSQ_EINVAL;
}

int dsq_quant_gguf_bytes(dsq_type_t type, int64_t n, int64_t k, size_t *bytes)
{
    dsq_weight_t w;
    dsq_weight_bytes_t b;
    if (!bytes)
        return DSQ_EINVAL;
    *bytes = 0;
    int rc = dsq_quant_gguf_layout(type, n, k, &w);
    if (rc != DSQ_OK)
        return rc;
    if (dsq_weight_layout(&w, &b) != DSQ_OK)
        return DSQ_EINVAL;
    /* plain types are zero-copy views of the mapping: their bytes are the
     * tensor's, counted where the mapping is */
    *bytes = b.total;
    return DSQ_OK;
}

/* One GGUF block of a type that repacks: its weights as integers q[e] in
 * natural order (the value the native layout stores: INT4 a nibble, INT8G a
 * signed byte) and its scales: fp16 d (and dm) plus per-group sub-scales a[]
 * and sub-zeros b[] (SUPER), or fp16 scale/zero of the one group (F16).
 * Formulas: ggml-quants.c dequantize_row_* (each case names its struct). */
typedef struct kblock {
    int8_t q[256];
    int8_t a[16], b[16];
    uint16_t d, dm;
} kblock_t;

static void decode_block(dsq_type_t type, const uint8_t *x, kblock_t *o)
{
    switch (type) {
    case DSQ_TYPE_Q5_0:   /* block_q5_0: d, qh[4], qs[16]; w = (q - 16) * d */
    case DSQ_TYPE_Q5_1: { /* block_q5_1: d, m, qh[4], qs[16]; w = q * d + m */
        const bool q51 = type == DSQ_TYPE_Q5_1;
        const uint8_t *qh = x + (q51 ? 4 : 2), *qs = qh + 4;
        uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                     (uint32_t)qh[3] << 24;
        const int off = q51 ? 0 : 16;
        for (int j = 0; j < 16; j++) {
            o->q[j] = (int8_t)(((qs[j] & 15) | ((h >> j) & 1) << 4) - off);
            o->q[j + 16] = (int8_t)(((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4) - off);
        }
        o->d = rd16(x);
        o->dm = q51 ? rd16(x + 2) : 0;
        break;
    }
    case DSQ_TYPE_Q2_K: { /* block_q2_K: scales[16], qs[64], d, dmin */
        const uint8_t *sc = x, *qs = x + 16;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    o->q[128 * h + 32 * j + l] = (int8_t)((qs[32 * h + l] >> (2 * j)) & 3);
        for (int g = 0; g < 16; g++) {
            o->a[g] = (int8_t)(sc[g] & 15);
            o->b[g] = (int8_t)(sc[g] >> 4);
        }
        o->d = rd16(x + 80);
        o->dm = rd16(x + 82) ^ 0x8000u;         /* m = -dmin * min */
        break;
    }
    case DSQ_TYPE_Q3_K: { /* block_q3_K: hmask[32], qs[64], scales[12], d;
                             w = d*(sc-32) * (low2 + 4*hbit - 4)          */
        const uint8_t *hm = x, *qs = x + 32, *sc = x + 96;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    int lo = (qs[32 * h + l] >> (2 * j)) & 3;
                    int hb = (hm[l] >> (4 * h + j)) & 1;
                    o->q[128 * h + 32 * j + l] = (int8_t)(lo + 4 * hb);
                }
        for (int g = 0; g < 16; g++) {
            int lo = g < 8 ? sc[g] & 15 : sc[g - 8] >> 4;
            int hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
            o->a[g] = (int8_t)((lo | hi << 4) - 32);
            o->b[g] = 4;
        }
        o->d = rd16(x + 108);
        o->dm = 0;
        break;
    }
    case DSQ_TYPE_Q4_K:   /* block_q4_K: d, dmin, scales[12], qs[128] */
    case DSQ_TYPE_Q5_K: { /* block_q5_K: d, dmin, scales[12], qh[32], qs[128] */
        const bool q5 = type == DSQ_TYPE_Q5_K;
        const uint8_t *sc = x + 4, *qh = x + 16, *qs = x + (q5 ? 48 : 16);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * j + l] & 15, hi = qs[32 * j + l] >> 4;
                if (q5) {
                    lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                }
                o->q[64 * j + l] = (int8_t)lo;
                o->q[64 * j + 32 + l] = (int8_t)hi;
            }
        for (int g = 0; g < 8; g++) {
            unsigned s6, m6;
            q4k_scale_min(sc, g, &s6, &m6);
            o->a[g] = (int8_t)s6;
            o->b[g] = (int8_t)m6;
        }
        o->d = rd16(x);
        o->dm = rd16(x + 2) ^ 0x8000u;          /* m = -dmin * min */
        break;
    }
    case DSQ_TYPE_Q6_K: { /* block_q6_K: ql[128], qh[64], scales[16], d;
                             w = d*sc * (q - 32)                          */
        const uint8_t *ql = x, *qh = x + 128;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
                int8_t *q = o->q + 128 * h;
                q[l] = (int8_t)(((L[l] & 15) | ((H[l] >> 0) & 3) << 4) - 32);
                q[l + 32] = (int8_t)(((L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4) - 32);
                q[l + 64] = (int8_t)(((L[l] >> 4) | ((H[l] >> 4) & 3) << 4) - 32);
                q[l + 96] = (int8_t)(((L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4) - 32);
            }
        for (int g = 0; g < 16; g++)
            o->a[g] = (int8_t)x[192 + g];
        o->d = rd16(x + 208);
        o->dm = 0;
        break;
    }
    case DSQ_TYPE_IQ4_XS: { /* block_iq4_xs: d, scales_h, scales_l[4], qs[128];
                               w = d*(ls-32) * kvalues_iq4nl[q]            */
        const uint16_t sh = rd16(x + 2);
        const uint8_t *sl = x + 4, *qs = x + 8;
        for (int g = 0; g < 8; g++) {
            int ls = ((sl[g / 2] >> (4 * (g % 2))) & 15) | ((sh >> (2 * g)) & 3) << 4;
            o->a[g] = (int8_t)(ls - 32);
            for (int j = 0; j < 16; j++) {
                o->q[32 * g + j] = (int8_t)(qs[16 * g + j] & 15);
                o->q[32 * g + j + 16] = (int8_t)(qs[16 * g + j] >> 4);
            }
        }
        o->d = rd16(x);
        o->dm = 0;
        break;
    }
    default:
        break;
    }
}

struct gguf_rows {
    const uint8_t *src;
    dsq_type_t type;
    dsq_weight_t *w;
};

static bool fp16_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

/* Rows [r0, r1) of a block type that needs decoding (quant.h). Returns the
 * index of the first block whose fp16 scale or min is not finite (then
 * the file is malformed: every weight of the block would be NaN / inf),
 * or -1. */
static int64_t repack_rows(const struct gguf_rows *c, int64_t r0, int64_t r1)
{
    const dsq_weight_t *w = c->w;
    const int64_t k = w->k, be = dsq_type_block_elems(c->type);
    const size_t bb = dsq_type_block_bytes(c->type);
    const int64_t nblk = k / be, gs = w->group_size, gpb = be / gs;
    const bool int4 = w->format == DSQ_WFMT_INT4;
    const bool super = w->scale_mode == DSQ_SCALE_SUPER;
    const int64_t groups = k / gs;
    uint8_t *d4 = (uint8_t *)w->data;
    int8_t *d8 = (int8_t *)w->data;
    kblock_t o;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t i = 0; i < nblk; i++) {
            decode_block(c->type, c->src + (size_t)(r * nblk + i) * bb, &o);
            if (!fp16_finite(o.d) || !fp16_finite(o.dm))
                return r * nblk + i;
            const int64_t e0 = i * be;
            if (int4) {
                uint8_t *p = d4 + (r * k + e0) / 2;
                for (int64_t ch = 0; ch < be / 32; ch++)
                    for (int j = 0; j < 16; j++)
                        p[ch * 16 + j] = (uint8_t)((o.q[ch * 32 + j] & 15) |
                                                   (o.q[ch * 32 + j + 16] & 15) << 4);
            } else {
                memcpy(d8 + r * k + e0, o.q, (size_t)be);
            }
            const int64_t g0 = r * groups + i * gpb;
            if (super && w->zp_mode == DSQ_ZP_LUT) {
                /* IQ4_XS: a + 32 in the file's 6-bit packing, d alone
                 * (kernels.h) */
                uint8_t *s6 = (uint8_t *)w->sub_scales + (r * nblk + i) * 6;
                unsigned hi = 0;
                memset(s6, 0, 6);
                for (int g = 0; g < 8; g++) {
                    const unsigned v = (unsigned)(o.a[g] + 32);
                    hi |= (v >> 4) << (2 * g);
                    s6[2 + g / 2] |= (uint8_t)((v & 15) << (4 * (g % 2)));
                }
                s6[0] = (uint8_t)(hi & 255);
                s6[1] = (uint8_t)(hi >> 8);
                ((uint16_t *)w->super)[r * nblk + i] = o.d;
            } else if (super) {
                uint16_t *sp = (uint16_t *)w->super + 2 * (r * nblk + i);
                sp[0] = o.d;
                sp[1] = o.dm;
                memcpy((int8_t *)w->sub_scales + g0, o.a, (size_t)gpb);
                if (w->sub_zeros)
                    memcpy((int8_t *)w->sub_zeros + g0, o.b, (size_t)gpb);
            } else {
                ((uint16_t *)w->scales)[g0] = o.d;
                if (w->zeros)
                    ((uint16_t *)w->zeros)[g0] = o.dm;
            }
        }
    }
    return -1;
}

/* A block with a non-finite fp16 scale or min: undo the repack, say which. */
static int bad_scale(const dsq_tensor_t *t, dsq_weight_t *w, void **storage, int64_t block,
                     char *err, size_t err_len)
{
    free(*storage);
    *storage = NULL;
    memset(w, 0, sizeof(*w));
    return fail(err, err_len, DSQ_EFORMAT, "quant: tensor %s (%s): block %lld has a "
                "non-finite fp16 scale or min (the file is damaged)",
                t->name ? t->name : "?", dsq_type_name(t->type), (long long)block);
}

int dsq_quant_from_gguf(const dsq_tensor_t *t, dsq_weight_t *w, void **storage,
                        char *err, size_t err_len)
{
    int64_t n = 0, k = 0;
    if (!w || !storage)
        return fail(err, err_len, DSQ_EINVAL, "quant: NULL argument");
    memset(w, 0, sizeof(*w));
    *storage = NULL;
    if (tensor_dims(t, &n, &k) != DSQ_OK)
        return fail(err, err_len, DSQ_EINVAL, "quant: bad tensor view");
    const char *nm = t->name ? t->name : "?";
    if (gguf_native(t->type, w) != DSQ_OK) {
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, DSQ_EUNSUPPORTED, "quant: tensor %s: type %s not supported "
                    "(dsq reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, "
                    "IQ4_NL, IQ4_XS)", nm, dsq_type_name(t->type));
    }
    w->n = n;
    w->k = k;
    const uint8_t *src = t->data;
    const int blk = dsq_type_block_elems(t->type);
    size_t need = 0;
    dsq_weight_bytes_t lb;
    if (blk < 1 || k % blk != 0 || dsq_type_bytes(t->type, n * k, &need) != DSQ_OK ||
        need > t->n_bytes || dsq_weight_layout(w, &lb) != DSQ_OK) {
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, DSQ_EINVAL,
                    "quant: tensor %s: k=%lld not a multiple of %d or data short", nm,
                    (long long)k, blk);
    }
    if (w->format != DSQ_WFMT_INT4 && w->format != DSQ_WFMT_INT8G) {
        /* zero-copy view unless misaligned */
        const size_t elem = w->format == DSQ_WFMT_F32 ? 4 : 2;
        if ((uintptr_t)src % elem == 0) {
            w->data = src;
        } else {
            void *p = malloc(lb.data);
            if (!p) {
                memset(w, 0, sizeof(*w));
                return fail(err, err_len, DSQ_ENOMEM, "quant: out of memory");
            }
            memcpy(p, src, lb.data);
            w->data = p;
            *storage = p;
        }
        return DSQ_OK;
    }
    /* one block: data | scales | zeros | super, each 64-byte aligned */
    const size_t db = align64(lb.data), sb = align64(lb.scales), zb = align64(lb.zeros);
    char *p = aligned_alloc(64, db + sb + zb + align64(lb.super));
    if (!p) {
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, DSQ_ENOMEM, "quant: out of memory");
    }
    memset(p, 0, db + sb + zb + align64(lb.super));
    *storage = p;
    w->data = p;
    if (w->scale_mode == DSQ_SCALE_SUPER) {
        w->sub_scales = (const int8_t *)(p + db);
        w->sub_zeros = lb.zeros ? (const int8_t *)(p + db + sb) : NULL;
        w->super = (const uint16_t *)(p + db + sb + zb);
    } else {
        w->scales = (const uint16_t *)(p + db);
        w->zeros = lb.zeros ? (const uint16_t *)(p + db + sb) : NULL;
    }
    uint8_t *dst = p;
    uint16_t *sc = (uint16_t *)w->scales, *zr = (uint16_t *)w->zeros;
    if (t->type == DSQ_TYPE_Q4_0 || t->type == DSQ_TYPE_Q4_1 || t->type == DSQ_TYPE_IQ4_NL) {
        /* the native nibble order: a block copy */
        const size_t bb = dsq_type_block_bytes(t->type);
        int64_t bad = -1;
        for (int64_t i = 0; i < n * (k / 32) && bad < 0; i++) {
            const uint8_t *b = src + (size_t)i * bb;
            sc[i] = rd16(b);
            if (zr)
                zr[i] = rd16(b + 2);
            if (!fp16_finite(sc[i]) || (zr && !fp16_finite(zr[i])))
                bad = i;
            memcpy(dst + i * 16, b + bb - 16, 16);
        }
        return bad < 0 ? DSQ_OK : bad_scale(t, w, storage, bad, err, err_len);
    }
    struct gguf_rows c = {.src = src, .type = t->type, .w = w};
    int64_t bad = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : bad) if (n * k >= (1 << 20))
    for (int64_t r = 0; r < n; r++) {
        int64_t b = repack_rows(&c, r, r + 1);
        if (b >= 0 && b < bad)
            bad = b;
    }
    return bad == INT64_MAX ? DSQ_OK : bad_scale(t, w, storage, bad, err, err_len);
}

/* ------------------------------------------------------------- AWQ, GPTQ */

static int check_group(int g, char *err, size_t err_len)
{
    if (g != 32 && g != 64 && g != 128)
        return fail(err, err_len, DSQ_EUNSUPPORTED,
                    "quant: group_size %d not supported (32, 64, 128)", g);
    return DSQ_OK;
}

int dsq_quant_from_awq(const int32_t *qweight, const int32_t *qzeros,
                       const uint16_t *scales, int64_t k, int64_t n,
                       int group_size, dsq_weight_t *w, void **storage,
                       char *err, size_t err_len)
{
    static const int pos[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    if (!w || !storage)
        return fail(err, err_len, DSQ_EINVAL, "quant: NULL argument");
    memset(w, 0, sizeof(*w));
    *storage = NULL;
    int rc = check_group(group_size, err, err_len);
    if (rc != DSQ_OK)
        return rc;
    if (!qweight || !qzeros || !scales || k <= 0 || n <= 0 || n % 8 ||
        k % group_size)
        return fail(err, err_len, DSQ_EINVAL,
                    "quant: awq: bad shape k=%lld n=%lld g=%d", (long long)k,
                    (long long)n, group_size);
    *w = (dsq_weight_t){.format = DSQ_WFMT_INT4, .n = n, .k = k,
                        .group_size = group_size, .zp_mode = DSQ_ZP_INT};
    rc = alloc_weight(w, storage, true);
    if (rc != DSQ_OK) {
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, rc, "quant: out of memory");
    }
    uint8_t *dst = (uint8_t *)w->data;
    uint16_t *sc = (uint16_t *)w->scales, *zr = (uint16_t *)w->zeros;
    const int64_t groups = k / group_size, n8 = n / 8;
    for (int64_t r = 0; r < k; r++)
        for (int64_t c = 0; c < n; c++) {
            uint32_t v = (uint32_t)qweight[r * n8 + c / 8];
            put_nibble(dst, k, c, r, (v >> (4 * pos[c % 8])) & 15);
        }
    for (int64_t g = 0; g < groups; g++)
        for (int64_t c = 0; c < n; c++) {
            uint32_t z = ((uint32_t)qzeros[g * n8 + c / 8] >> (4 * pos[c % 8])) & 15;
            zr[c * groups + g] = dsq_fp32_to_fp16((float)z);
            sc[c * groups + g] = scales[g * n + c];
        }
    return DSQ_OK;
}

int dsq_quant_from_gptq(const int32_t *qweight, const int32_t *qzeros,
                        const uint16_t *scales, const int32_t *g_idx,
                        int64_t k, int64_t n, int group_size,
                        dsq_weight_t *w, void **storage, int32_t **perm,
                        char *err, size_t err_len)
{
    if (!w || !storage || !perm)
        return fail(err, err_len, DSQ_EINVAL, "quant: NULL argument");
    memset(w, 0, sizeof(*w));
    *storage = NULL;
    *perm = NULL;
    int rc = check_group(group_size, err, err_len);
    if (rc != DSQ_OK)
        return rc;
    if (!qweight || !qzeros || !scales || k <= 0 || n <= 0 || n % 8 || k % 8)
        return fail(err, err_len, DSQ_EINVAL, "quant: gptq: bad shape k=%lld n=%lld",
                    (long long)k, (long long)n);
    const int64_t groups = (k + group_size - 1) / group_size, n8 = n / 8;
    int32_t *p = NULL;
    if (g_idx) {
        bool identity = true;
        for (int64_t r = 0; r < k; r++) {
            if (g_idx[r] < 0 || g_idx[r] >= groups)
                return fail(err, err_len, DSQ_EINVAL,
                            "quant: gptq: g_idx[%lld]=%d out of range",
                            (long long)r, g_idx[r]);
            identity &= g_idx[r] == r / group_size;
        }
        if (!identity) {
            /* counting sort by group: stable, so rows keep their order
             * within a group */
            p = malloc((size_t)k * sizeof(*p));
            int64_t *start = calloc((size_t)groups + 1, sizeof(*start));
            if (!p || !start) {
                free(p);
                free(start);
                return fail(err, err_len, DSQ_ENOMEM, "quant: out of memory");
            }
            for (int64_t r = 0; r < k; r++)
                start[g_idx[r] + 1]++;
            for (int64_t g = 0; g < groups; g++) {
                int64_t want = g + 1 < groups ? group_size : k - g * group_size;
                if (start[g + 1] != want)
                    rc = DSQ_EUNSUPPORTED;
                start[g + 1] += start[g];
            }
            if (rc != DSQ_OK) {
                free(p);
                free(start);
                return fail(err, err_len, rc,
                            "quant: gptq: g_idx groups are not all of size %d",
                            group_size);
            }
            for (int64_t r = 0; r < k; r++)
                p[start[g_idx[r]]++] = (int32_t)r;
            free(start);
        }
    }
    *w = (dsq_weight_t){.format = DSQ_WFMT_INT4, .n = n, .k = k,
                        .group_size = group_size, .zp_mode = DSQ_ZP_INT};
    rc = alloc_weight(w, storage, true);
    if (rc != DSQ_OK) {
        free(p);
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, rc, "quant: out of memory");
    }
    uint8_t *dst = (uint8_t *)w->data;
    uint16_t *sc = (uint16_t *)w->scales, *zr = (uint16_t *)w->zeros;
    for (int64_t j = 0; j < k; j++) {
        int64_t r = p ? p[j] : j;   /* source input row of native column j */
        for (int64_t c = 0; c < n; c++) {
            uint32_t v = (uint32_t)qweight[(r / 8) * n + c];
            put_nibble(dst, k, c, j, (v >> (4 * (r % 8))) & 15);
        }
    }
    for (int64_t g = 0; g < groups; g++)
        for (int64_t c = 0; c < n; c++) {
            uint32_t z = (((uint32_t)qzeros[g * n8 + c / 8] >> (4 * (c % 8))) & 15) + 1;
            zr[c * groups + g] = dsq_fp32_to_fp16((float)z);
            sc[c * groups + g] = scales[g * n + c];
        }
    *perm = p;
    return DSQ_OK;
}

/* -------------------------------------------------------------------- RTN */

/* View a float / Q8_0 tensor as a weight to read rows with
 * dsq_weight_dequant_row. */
static int source_view(const dsq_tensor_t *t, dsq_weight_t *src, void **copy,
                       char *err, size_t err_len)
{
    int rc = DSQ_OK;
    if (!t || (t->type != DSQ_TYPE_F32 && t->type != DSQ_TYPE_F16 &&
               t->type != DSQ_TYPE_BF16 && t->type != DSQ_TYPE_Q8_0))
        rc = fail(err, err_len, t ? DSQ_EUNSUPPORTED : DSQ_EINVAL,
                  "quant: rtn source must be F32/F16/BF16/Q8_0 (got %s)",
                  t ? dsq_type_name(t->type) : "NULL");
    else
        rc = dsq_quant_from_gguf(t, src, copy, err, err_len);
    return rc;
}

int dsq_quant_rtn_int4(const dsq_tensor_t *t, int group_size, bool sym,
                       dsq_weight_t *w, void **storage, char *err,
                       size_t err_len)
{
    if (!w || !storage)
        return fail(err, err_len, DSQ_EINVAL, "quant: NULL argument");
    memset(w, 0, sizeof(*w));
    *storage = NULL;
    int rc = check_group(group_size, err, err_len);
    if (rc != DSQ_OK)
        return rc;
    dsq_weight_t src;
    void *copy = NULL;
    rc = source_view(t, &src, &copy, err, err_len);
    if (rc != DSQ_OK)
        return rc;
    *w = (dsq_weight_t){.format = DSQ_WFMT_INT4, .n = src.n, .k = src.k,
                        .group_size = group_size,
                        .zp_mode = sym ? DSQ_ZP_SYM : DSQ_ZP_INT};
    rc = alloc_weight(w, storage, !sym);
    if (rc != DSQ_OK) {
        free(copy);
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, rc, "quant: out of memory");
    }
    const int64_t k = w->k, groups = n_groups(w);
    uint8_t *dst = (uint8_t *)w->data;
    uint16_t *sc = (uint16_t *)w->scales, *zr = (uint16_t *)w->zeros;
    int bad = 0;
#pragma omp parallel reduction(|:bad)
    {
        float *row = malloc((size_t)k * sizeof(*row));
        bad |= row == NULL;
#pragma omp for schedule(static)
        for (int64_t c = 0; c < w->n; c++) {
            if (!row || dsq_weight_dequant_row(&src, c, row) != DSQ_OK) {
                bad = 1;
                continue;
            }
            for (int64_t g = 0; g < groups; g++) {
                int64_t j0 = g * group_size;
                int64_t j1 = j0 + group_size < k ? j0 + group_size : k;
                float mn = 0.0f, mx = 0.0f;
                for (int64_t j = j0; j < j1; j++) {
                    mn = row[j] < mn ? row[j] : mn;
                    mx = row[j] > mx ? row[j] : mx;
                }
                float range = sym ? fmaxf(-mn, mx) / 7.0f : (mx - mn) / 15.0f;
                uint16_t sh = fp16_up(range);
                float s = dsq_fp16_to_fp32(sh);
                if (!isfinite(s))
                    bad = 2;
                float z = sym ? 8.0f : s > 0.0f ? fminf(fmaxf(nearbyintf(-mn / s), 0.0f), 15.0f) : 0.0f;
                sc[c * groups + g] = sh;
                if (!sym)
                    zr[c * groups + g] = dsq_fp32_to_fp16(z);
                for (int64_t j = j0; j < j1; j++) {
                    /* divide (not multiply by inv) so round() sees x/s */
                    float q = s > 0.0f ? nearbyintf(row[j] / s) + z : z;
                    q = fminf(fmaxf(q, 0.0f), 15.0f);
                    put_nibble(dst, k, c, j, (unsigned)q);
                }
            }
        }
        free(row);
    }
    free(copy);
    if (bad) {
        free(*storage);
        *storage = NULL;
        memset(w, 0, sizeof(*w));
        rc = bad & 2 ? fail(err, err_len, DSQ_ERANGE, "quant: rtn scale overflows fp16")
                     : fail(err, err_len, DSQ_ENOMEM, "quant: rtn failed (memory)");
    }
    return rc;
}

int dsq_quant_int8_channel(const dsq_tensor_t *t, dsq_weight_t *w,
                           void **storage, char *err, size_t err_len)
{
    if (!w || !storage)
        return fail(err, err_len, DSQ_EINVAL, "quant: NULL argument");
    memset(w, 0, sizeof(*w));
    *storage = NULL;
    dsq_weight_t src;
    void *copy = NULL;
    int rc = source_view(t, &src, &copy, err, err_len);
    if (rc != DSQ_OK)
        return rc;
    *w = (dsq_weight_t){.format = DSQ_WFMT_INT8, .n = src.n, .k = src.k};
    rc = alloc_weight(w, storage, false);
    if (rc != DSQ_OK) {
        free(copy);
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, rc, "quant: out of memory");
    }
    const int64_t k = w->k;
    int8_t *dst = (int8_t *)w->data;
    uint16_t *sc = (uint16_t *)w->scales;
    int bad = 0;
#pragma omp parallel reduction(|:bad)
    {
        float *row = malloc((size_t)k * sizeof(*row));
        bad |= row == NULL;
#pragma omp for schedule(static)
        for (int64_t c = 0; c < w->n; c++) {
            if (!row || dsq_weight_dequant_row(&src, c, row) != DSQ_OK) {
                bad = 1;
                continue;
            }
            float amax = 0.0f;
            for (int64_t j = 0; j < k; j++)
                amax = fmaxf(amax, fabsf(row[j]));
            uint16_t sh = fp16_up(amax / 127.0f);
            float s = dsq_fp16_to_fp32(sh);
            if (!isfinite(s))
                bad = 2;
            sc[c] = sh;
            for (int64_t j = 0; j < k; j++) {
                float q = s > 0.0f ? nearbyintf(row[j] / s) : 0.0f;
                dst[c * k + j] = (int8_t)fminf(fmaxf(q, -127.0f), 127.0f);
            }
        }
        free(row);
    }
    free(copy);
    if (bad) {
        free(*storage);
        *storage = NULL;
        memset(w, 0, sizeof(*w));
        rc = bad & 2 ? fail(err, err_len, DSQ_ERANGE, "quant: int8 scale overflows fp16")
                     : fail(err, err_len, DSQ_ENOMEM, "quant: int8 failed (memory)");
    }
    return rc;
}

/* ------------------------------------------------------------ GPTQ 8-bit */

int dsq_quant_from_gptq8(const int32_t *qweight, const int32_t *qzeros,
                         const uint16_t *scales, const int32_t *g_idx, int64_t k,
                         int64_t n, int64_t n_groups, dsq_weight_t *w, void **storage,
                         char *err, size_t err_len)
{
    if (!w || !storage)
        return fail(err, err_len, DSQ_EINVAL, "quant: NULL argument");
    memset(w, 0, sizeof(*w));
    *storage = NULL;
    if (!qweight || !qzeros || !scales || k <= 0 || n <= 0 || n % 4 || k % 4)
        return fail(err, err_len, DSQ_EINVAL, "quant: gptq8: bad shape k=%lld n=%lld "
                    "(both must be multiples of 4)", (long long)k, (long long)n);
    if (n_groups != 1)
        return fail(err, err_len, DSQ_EUNSUPPORTED, "quant: gptq8: %lld groups along k; "
                    "only per-channel 8-bit (group_size -1, one group) maps exactly onto "
                    "the INT8 kernels", (long long)n_groups);
    if (g_idx)
        for (int64_t r = 0; r < k; r++)
            if (g_idx[r] != 0)
                return fail(err, err_len, DSQ_EINVAL, "quant: gptq8: g_idx[%lld]=%d, "
                            "expected 0 (one group)", (long long)r, g_idx[r]);
    *w = (dsq_weight_t){.format = DSQ_WFMT_INT8, .n = n, .k = k};
    int rc = alloc_weight(w, storage, false);
    if (rc != DSQ_OK) {
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, rc, "quant: out of memory");
    }
    int8_t *dst = (int8_t *)w->data;
    uint16_t *sc = (uint16_t *)w->scales;
    for (int64_t c = 0; c < n && rc == DSQ_OK; c++) {
        /* v1 stores z - 1 (AutoGPTQ pack(): zeros -= 1) */
        int z = (int)(((uint32_t)qzeros[c / 4] >> (8 * (c % 4))) & 255) + 1;
        sc[c] = scales[c];
        for (int64_t r = 0; r < k; r++) {
            int q = (int)(((uint32_t)qweight[(r / 4) * n + c] >> (8 * (r % 4))) & 255);
            int v = q - z;
            if (v < -128 || v > 127) {
                rc = fail(err, err_len, DSQ_EUNSUPPORTED, "quant: gptq8: column %lld: q=%d "
                          "z=%d gives %d, outside int8 (zero point far from 128)",
                          (long long)c, q, z, v);
                break;
            }
            dst[c * k + r] = (int8_t)v;
        }
    }
    if (rc != DSQ_OK) {
        free(*storage);
        *storage = NULL;
        memset(w, 0, sizeof(*w));
    }
    return rc;
}

int dsq_quant_from_gptq_tensors(const dsq_tensor_t *qweight, const dsq_tensor_t *qzeros,
                                const dsq_tensor_t *scales, const dsq_tensor_t *g_idx,
                                int64_t k, int64_t n, int group_size, dsq_weight_t *w,
                                void **storage, int32_t **perm, char *err,
                                size_t err_len)
{
    if (!w || !storage || !perm)
        return fail(err, err_len, DSQ_EINVAL, "quant: NULL argument");
    memset(w, 0, sizeof(*w));
    *storage = NULL;
    *perm = NULL;
    if (!qweight || !qzeros || !scales || k <= 0 || n <= 0)
        return fail(err, err_len, DSQ_EINVAL, "quant: gptq: missing tensor or bad shape");
    const char *nm = qweight->name ? qweight->name : "?";
    if (qweight->type != DSQ_TYPE_I32 || qzeros->type != DSQ_TYPE_I32 ||
        scales->type != DSQ_TYPE_F16 || (g_idx && g_idx->type != DSQ_TYPE_I32))
        return fail(err, err_len, DSQ_EFORMAT, "quant: gptq %s: qweight/qzeros must be I32, "
                    "scales F16, g_idx I32", nm);
    const int64_t rows = qweight->ne[1];
    const int bits = qweight->n_dims == 2 && qweight->ne[0] == n
                     ? (rows * 8 == k ? 4 : rows * 4 == k ? 8 : 0) : 0;
    if (bits == 0)
        return fail(err, err_len, DSQ_EFORMAT, "quant: gptq %s: qweight [%lld][%lld] is "
                    "neither 4-bit [k/8][n] nor 8-bit [k/4][n] for k=%lld n=%lld", nm,
                    (long long)qweight->ne[1], (long long)qweight->ne[0], (long long)k,
                    (long long)n);
    const int64_t groups = scales->ne[1], per = 32 / bits;
    if (scales->n_dims != 2 || scales->ne[0] != n || groups < 1 ||
        qzeros->n_dims != 2 || n % per || qzeros->ne[0] != n / per || qzeros->ne[1] != groups ||
        (g_idx && (g_idx->n_dims != 1 || g_idx->ne[0] != k)))
        return fail(err, err_len, DSQ_EFORMAT, "quant: gptq %s (%d-bit): scales [%lld][%lld], "
                    "qzeros [%lld][%lld]%s do not match k=%lld n=%lld", nm, bits,
                    (long long)scales->ne[1], (long long)scales->ne[0],
                    (long long)qzeros->ne[1], (long long)qzeros->ne[0],
                    g_idx ? " or g_idx" : "", (long long)k, (long long)n);
    if (bits == 8)
        return dsq_quant_from_gptq8(qweight->data, qzeros->data, scales->data,
                                    g_idx ? g_idx->data : NULL, k, n, groups, w, storage,
                                    err, err_len);
    if (group_size > 0 && groups != (k + group_size - 1) / group_size)
        return fail(err, err_len, DSQ_EFORMAT, "quant: gptq %s: %lld scale rows, expected "
                    "ceil(%lld / %d)", nm, (long long)groups, (long long)k, group_size);
    return dsq_quant_from_gptq(qweight->data, qzeros->data, scales->data,
                               g_idx ? g_idx->data : NULL, k, n, group_size, w, storage,
                               perm, err, err_len);
}

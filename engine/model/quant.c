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

/* Q4_K 6-bit scale/min of sub-block j from the 12 packed bytes (ggml's
 * get_scale_min_k4 layout: j<4 low 6 bits of bytes j / j+4; j>=4 nibbles of
 * byte j+4 plus the top 2 bits of bytes j-4 / j). */
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
    w->n = n;
    w->k = k;
    const uint8_t *src = t->data;
    int rc = DSQ_OK;
    size_t elem = 0;
    switch (t->type) {
    case DSQ_TYPE_F32: w->format = DSQ_WFMT_F32; elem = 4; break;
    case DSQ_TYPE_F16: w->format = DSQ_WFMT_F16; elem = 2; break;
    case DSQ_TYPE_BF16: w->format = DSQ_WFMT_BF16; elem = 2; break;
    case DSQ_TYPE_Q8_0: w->format = DSQ_WFMT_Q8_0; w->group_size = 32; elem = 2; break;
    case DSQ_TYPE_Q4_0: case DSQ_TYPE_Q4_1: case DSQ_TYPE_Q4_K:
        w->format = DSQ_WFMT_INT4;
        w->group_size = 32;
        w->zp_mode = t->type == DSQ_TYPE_Q4_0 ? DSQ_ZP_SYM : DSQ_ZP_MIN;
        break;
    default:
        rc = fail(err, err_len, DSQ_EUNSUPPORTED, "quant: tensor %s: type %s not supported",
                  t->name ? t->name : "?", dsq_type_name(t->type));
        memset(w, 0, sizeof(*w));
        return rc;
    }
    int blk = t->type == DSQ_TYPE_Q4_K ? 256 : (w->format == DSQ_WFMT_INT4 ||
              w->format == DSQ_WFMT_Q8_0) ? 32 : 1;
    size_t need = 0;
    if (k % blk != 0 || dsq_type_bytes(t->type, n * k, &need) != DSQ_OK ||
        need > t->n_bytes) {
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, DSQ_EINVAL,
                    "quant: tensor %s: k=%lld not a multiple of %d or data short",
                    t->name ? t->name : "?", (long long)k, blk);
    }
    if (w->format != DSQ_WFMT_INT4) {
        /* zero-copy view unless misaligned */
        if ((uintptr_t)src % elem == 0) {
            w->data = src;
        } else {
            size_t db = dsq_weight_data_bytes(w->format, n, k, 0);
            void *p = malloc(db);
            if (!p) {
                memset(w, 0, sizeof(*w));
                return fail(err, err_len, DSQ_ENOMEM, "quant: out of memory");
            }
            memcpy(p, src, db);
            w->data = p;
            *storage = p;
        }
        return DSQ_OK;
    }
    rc = alloc_weight(w, storage, w->zp_mode != DSQ_ZP_SYM);
    if (rc != DSQ_OK) {
        memset(w, 0, sizeof(*w));
        return fail(err, err_len, rc, "quant: out of memory");
    }
    uint8_t *dst = (uint8_t *)w->data;
    uint16_t *sc = (uint16_t *)w->scales, *zr = (uint16_t *)w->zeros;
    const int64_t nb = k / 32;
    if (t->type == DSQ_TYPE_Q4_0 || t->type == DSQ_TYPE_Q4_1) {
        const size_t bb = t->type == DSQ_TYPE_Q4_0 ? 18 : 20;
        for (int64_t i = 0; i < n * nb; i++) {
            const uint8_t *b = src + (size_t)i * bb;
            sc[i] = rd16(b);
            if (zr)
                zr[i] = rd16(b + 2);
            memcpy(dst + i * 16, b + bb - 16, 16);
        }
    } else { /* Q4_K: 144-byte super-blocks of 256 */
        for (int64_t i = 0; i < n * (k / 256); i++) {
            const uint8_t *b = src + (size_t)i * 144;
            float d = dsq_fp16_to_fp32(rd16(b)), dmin = dsq_fp16_to_fp32(rd16(b + 2));
            const uint8_t *scl = b + 4, *qs = b + 16;
            for (int j = 0; j < 8; j++) {
                unsigned s6, m6;
                q4k_scale_min(scl, j, &s6, &m6);
                int64_t c = i * 8 + j;   /* global 32-chunk index */
                sc[c] = dsq_fp32_to_fp16(d * (float)s6);
                zr[c] = dsq_fp32_to_fp16(-(dmin * (float)m6));
                const uint8_t *q = qs + 32 * (j / 2);
                for (int e = 0; e < 16; e++) {
                    unsigned lo = j % 2 ? q[e] >> 4 : q[e] & 15;
                    unsigned hi = j % 2 ? q[e + 16] >> 4 : q[e + 16] & 15;
                    dst[c * 16 + e] = (uint8_t)(lo | (hi << 4));
                }
            }
        }
    }
    return DSQ_OK;
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

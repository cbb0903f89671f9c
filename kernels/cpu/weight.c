/* Byte sizes of the dsq_weight_t arrays, in one place so the memory planner,
 * the repackers (engine/model/quant.c) and the kernels agree on the layout
 * documented in kernels.h. */
#include "kernels.h"

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
    case DSQ_WFMT_INT4: return un * ((uk + 31) / 32) * 16;
    case DSQ_WFMT_INT8: return un * uk;
    }
    return 0;
}

size_t dsq_weight_scale_bytes(dsq_wformat_t f, int64_t n, int64_t k, int group_size)
{
    if (n < 0 || k < 0)
        return 0;
    switch (f) {
    case DSQ_WFMT_INT4:
        if (group_size <= 0)
            return 0;
        return (size_t)n * (size_t)((k + group_size - 1) / group_size) * 2;
    case DSQ_WFMT_INT8:
        return (size_t)n * 2;
    default:
        return 0;
    }
}

/* Row dequantisation, the reference formula of each format (kernels.h).
 * Used by dsq_cpu_embed and by tests; not a hot path. */
#include "cpu_internal.h"
#include "engine/common/error.h"

int dsq_weight_dequant_row(const dsq_weight_t *w, int64_t row, float *out)
{
    if (!w || !out || !w->data || row < 0 || row >= w->n || w->k <= 0)
        return DSQ_EINVAL;
    const int64_t k = w->k;
    int rc = DSQ_OK;
    switch (w->format) {
    case DSQ_WFMT_F32: {
        const float *r = (const float *)w->data + row * k;
        memcpy(out, r, (size_t)k * sizeof(float));
        break;
    }
    case DSQ_WFMT_F16: {
        const uint16_t *r = (const uint16_t *)w->data + row * k;
        for (int64_t j = 0; j < k; j++)
            out[j] = dsq__h2f(r[j]);
        break;
    }
    case DSQ_WFMT_BF16: {
        const uint16_t *r = (const uint16_t *)w->data + row * k;
        for (int64_t j = 0; j < k; j++)
            out[j] = dsq__bf2f(r[j]);
        break;
    }
    case DSQ_WFMT_Q8_0: {
        if (k % 32) {
            rc = DSQ_EINVAL;
            break;
        }
        const uint8_t *r = (const uint8_t *)w->data + row * (k / 32) * DSQ__Q8_0_BLOCK;
        for (int64_t c = 0; c < k / 32; c++) {
            const uint8_t *b = r + c * DSQ__Q8_0_BLOCK;
            float d = dsq__h2f((uint16_t)(b[0] | (b[1] << 8)));
            for (int j = 0; j < 32; j++)
                out[c * 32 + j] = (float)((const int8_t *)(b + 2))[j] * d;
        }
        break;
    }
    case DSQ_WFMT_INT8: {
        if (!w->scales) {
            rc = DSQ_EINVAL;
            break;
        }
        const int8_t *r = (const int8_t *)w->data + row * k;
        float s = dsq__h2f(w->scales[row]);
        for (int64_t j = 0; j < k; j++)
            out[j] = (float)r[j] * s;
        break;
    }
    case DSQ_WFMT_INT4: {
        const int gs = w->group_size;
        if ((gs != 32 && gs != 64 && gs != 128) || !w->scales ||
            (w->zp_mode != DSQ_ZP_SYM && !w->zeros)) {
            rc = DSQ_EINVAL;
            break;
        }
        const int64_t nb = (k + 31) / 32, groups = (k + gs - 1) / gs;
        const uint8_t *r = (const uint8_t *)w->data + row * nb * 16;
        for (int64_t j = 0; j < k; j++) {
            const uint8_t b = r[(j / 32) * 16 + (j % 16)];
            int q = (j % 32) < 16 ? (b & 15) : (b >> 4);
            int64_t g = j / gs;
            float s = dsq__h2f(w->scales[row * groups + g]);
            switch (w->zp_mode) {
            case DSQ_ZP_SYM: out[j] = (float)(q - 8) * s; break;
            case DSQ_ZP_INT:
                out[j] = ((float)q - dsq__h2f(w->zeros[row * groups + g])) * s;
                break;
            default:
                out[j] = (float)q * s + dsq__h2f(w->zeros[row * groups + g]);
                break;
            }
        }
        break;
    }
    default:
        rc = DSQ_EINVAL;
        break;
    }
    return rc;
}

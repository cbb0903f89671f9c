/* dsq_weight_dequant_row: one weight row back to fp32 by the reference
 * formula of its format (kernels.h), operation by operation as ggml's
 * dequantize_row_* does it, so tests and dsq_cpu_embed see exactly the
 * values every product kernel means. Not a hot path. */
#include "cpu_internal.h"

#include <stdbool.h>
#include <string.h>

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
    case DSQ_WFMT_Q8_0_X8: {
        if (dsq_weight_check(w) != DSQ_OK) {
            rc = DSQ_EINVAL;
            break;
        }
        const int64_t nb = k / 32, r8 = row % 8;
        const uint8_t *t = (const uint8_t *)w->data + (row / 8) * nb * 272;
        for (int64_t c = 0; c < nb; c++) {
            const uint8_t *b = t + c * 272;
            float d = dsq__h2f((uint16_t)(b[2 * r8] | (b[2 * r8 + 1] << 8)));
            for (int j = 0; j < 32; j++)
                out[c * 32 + j] = (float)(int8_t)b[16 + 32 * (j / 4) + 4 * r8 + j % 4] * d;
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
    case DSQ_WFMT_INT4:
    case DSQ_WFMT_INT4_X8:
    case DSQ_WFMT_INT6_X8:
    case DSQ_WFMT_INT5_X8:
    case DSQ_WFMT_INT2_X8:
    case DSQ_WFMT_INT3_X8:
    case DSQ_WFMT_INT8G: {
        if (dsq_weight_check(w) != DSQ_OK) {
            rc = DSQ_EINVAL;
            break;
        }
        const int64_t gs = w->group_size, nb = (k + 31) / 32, groups = (k + gs - 1) / gs;
        const bool int6 = w->format == DSQ_WFMT_INT6_X8, int5 = w->format == DSQ_WFMT_INT5_X8;
        const bool int23 = w->format == DSQ_WFMT_INT2_X8 || w->format == DSQ_WFMT_INT3_X8;
        const bool int4 = w->format == DSQ_WFMT_INT4 || w->format == DSQ_WFMT_INT4_X8;
        const int8_t *r8 = (const int8_t *)w->data + row * nb * 32;
        for (int64_t g = 0; g < groups; g++) {
            float s, c;
            dsq__group_sc(w, row, g, groups, &s, &c);
            const int64_t zi = w->format == DSQ_WFMT_INT4_X8 || int6 || int5
                                   ? ((row / 8) * groups + g) * 8 + row % 8
                                   : row * groups + g;
            const int64_t j1 = (g + 1) * gs < k ? (g + 1) * gs : k;
            for (int64_t j = g * gs; j < j1; j++) {
                int q;
                if (int4) {
                    const uint8_t b = dsq__int4_byte(w, nb, row, j / 32, (int)(j % 16));
                    q = (j % 32) < 16 ? (b & 15) : (b >> 4);
                } else if (int6) {
                    q = (int)dsq__int6_q(w, nb, row, j / 32, (int)(j % 32)) - 32;
                } else if (int23) {
                    /* INT3: q - 4, so SYM's q * s below is Q3_K's formula */
                    q = (int)dsq__int23_q(w, nb, row, j / 32, (int)(j % 32)) -
                        (w->format == DSQ_WFMT_INT3_X8 ? 4 : 0);
                } else if (int5) {
                    /* back to INT8G's q: SYM -16..15, MIN 0..31 */
                    q = (int)dsq__int5_q(w, nb, row, j / 32, (int)(j % 32)) -
                        (w->zp_mode == DSQ_ZP_SYM ? 16 : 0);
                } else {
                    q = r8[j];
                }
                /* the formula of the source format, operation by operation
                 * (ggml's dequantize_row_*): see kernels.h */
                switch (w->zp_mode) {
                case DSQ_ZP_SYM: out[j] = int4 ? (float)(q - 8) * s : (float)q * s; break;
                case DSQ_ZP_INT:
                    out[j] = w->scale_mode == DSQ_SCALE_SUPER
                                 ? (float)(q - w->sub_zeros[zi]) * s
                                 : ((float)q - dsq__h2f(w->zeros[zi])) * s;
                    break;
                case DSQ_ZP_LUT: out[j] = (float)dsq_iq4nl_values[q] * s; break;
                default: out[j] = (float)q * s + c; break;
                }
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

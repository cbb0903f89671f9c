/* Rotary position embedding (RoPE) on the CPU, with linear and YaRN scaling.
 *
 * The frequency table is computed once per call in fp64 from dsq_rope_t
 * (see kernels.h for the exact YaRN mix, which follows transformers'
 * _compute_yarn_parameters / DeepSeek-V2's YaRN rotary embedding), then each
 * row's cos/sin are formed in fp64 once and reused for every head, so a
 * prefill of m rows costs m * rot_dim/2 sincos calls, not m * n_heads * ... */
#include <math.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

#define ROPE_PI 3.14159265358979323846

double dsq_rope_yarn_mscale(double factor, double mscale)
{
    if (factor <= 1.0)
        return 1.0;
    return 0.1 * mscale * log(factor) + 1.0;
}

static double corr_dim(double n_rot, int dim, double base, double orig_ctx)
{
    return dim * log(orig_ctx / (n_rot * 2.0 * ROPE_PI)) / (2.0 * log(base));
}

void dsq_rope_corr_dims(const dsq_rope_t *p, double dims[2])
{
    double bf = p->beta_fast > 0 ? p->beta_fast : 32.0;
    double bs = p->beta_slow > 0 ? p->beta_slow : 1.0;
    double lo = floor(corr_dim(bf, p->rot_dim, p->theta, p->orig_ctx));
    double hi = ceil(corr_dim(bs, p->rot_dim, p->theta, p->orig_ctx));
    dims[0] = lo > 0 ? lo : 0;
    dims[1] = hi < p->rot_dim - 1 ? hi : p->rot_dim - 1;
}

void dsq_rope_inv_freq(const dsq_rope_t *p, double *out)
{
    int half = p->rot_dim / 2;
    double fs = p->freq_scale != 0.0f ? p->freq_scale : 1.0;
    double dims[2] = {0, 0};
    if (p->ext_factor != 0.0f) {
        dsq_rope_corr_dims(p, dims);
        if (dims[1] == dims[0])
            dims[1] += 0.001;
    }
    for (int i = 0; i < half; i++) {
        double e = pow((double)p->theta, -2.0 * i / p->rot_dim);
        double f = fs * e;
        double v = f;
        if (p->ext_factor != 0.0f) {
            double ramp = (i - dims[0]) / (dims[1] - dims[0]);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double w = (1.0 - ramp) * p->ext_factor;
            v = f * (1.0 - w) + e * w;
        }
        out[i] = v;
    }
}

int dsq_rope_init(dsq_rope_t *p, int rot_dim, bool neox, double theta,
                  int scaling, double factor, int orig_ctx, double beta_fast,
                  double beta_slow, double mscale, double mscale_all_dim)
{
    int rc = DSQ_OK;
    if (!p || rot_dim <= 0 || rot_dim % 2 || theta <= 0) {
        rc = DSQ_EINVAL;
        goto out;
    }
    *p = (dsq_rope_t){ .rot_dim = rot_dim, .neox = neox, .theta = (float)theta,
                       .freq_scale = 1.0f, .attn_factor = 1.0f,
                       .beta_fast = 32.0f, .beta_slow = 1.0f };
    switch (scaling) {
    case 0:
        break;
    case 1:
        if (factor <= 0) {
            rc = DSQ_EINVAL;
            break;
        }
        p->freq_scale = (float)(1.0 / factor);
        break;
    case 3:
        if (factor <= 0 || orig_ctx <= 0) {
            rc = DSQ_EINVAL;
            break;
        }
        p->freq_scale = (float)(1.0 / factor);
        p->ext_factor = 1.0f;
        p->orig_ctx = orig_ctx;
        p->beta_fast = (float)(beta_fast > 0 ? beta_fast : 32.0);
        p->beta_slow = (float)(beta_slow > 0 ? beta_slow : 1.0);
        if (mscale > 0 && mscale_all_dim > 0)
            p->attn_factor = (float)(dsq_rope_yarn_mscale(factor, mscale) /
                                     dsq_rope_yarn_mscale(factor, mscale_all_dim));
        else
            p->attn_factor = (float)dsq_rope_yarn_mscale(factor, 1.0);
        break;
    default:
        rc = DSQ_EUNSUPPORTED;
        break;
    }
out:
    return rc;
}

struct rope_ctx {
    float *x;
    int64_t m;
    int n_heads, head_dim, half;
    bool neox;
    double mscale;
    const int32_t *pos;
    const double *inv;
    float *cs;              /* [n_thr][2 * half] cos/sin of the current row */
};

static void rope_region(void *p, int tid, int n_thr)
{
    const struct rope_ctx *c = p;
    const int half = c->half;
    float *cs = c->cs + (size_t)tid * 2 * (size_t)half;
    int64_t r0, r1;
    dsq__split(c->m, tid, n_thr, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        for (int i = 0; i < half; i++) {
            double a = (double)c->pos[r] * c->inv[i];
            cs[2 * i] = (float)(cos(a) * c->mscale);
            cs[2 * i + 1] = (float)(sin(a) * c->mscale);
        }
        for (int h = 0; h < c->n_heads; h++) {
            float *v = c->x + (r * c->n_heads + h) * (int64_t)c->head_dim;
            /* index pair (i0, i1) of pair i */
            const int stride = c->neox ? 1 : 2;
            const int off = c->neox ? half : 1;
            for (int i = 0; i < half; i++) {
                float co = cs[2 * i], s = cs[2 * i + 1];
                float *a = v + i * stride, *b = a + off;
                float x0 = *a, x1 = *b;
                *a = x0 * co - x1 * s;
                *b = x0 * s + x1 * co;
            }
        }
    }
}

int dsq_cpu_rope(float *x, int64_t m, int n_heads, int head_dim,
                 const int32_t *pos, const dsq_rope_t *p)
{
    if (!x || !pos || !p || m < 0 || n_heads < 1 || p->rot_dim <= 0 ||
        p->rot_dim % 2 || p->rot_dim > head_dim)
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    const int half = p->rot_dim / 2;
    const double mscale = p->attn_factor != 0.0f ? p->attn_factor : 1.0;
    double *inv = malloc(sizeof(*inv) * (size_t)half);
    if (!inv)
        return DSQ_ENOMEM;
    dsq_rope_inv_freq(p, inv);
    int rc = DSQ_OK;
    /* one thread per 8 rows at most: a decode row runs inline */
    int n_thr = dsq_cpu_get_threads();
    if (m / 8 < n_thr)
        n_thr = m / 8 > 1 ? (int)(m / 8) : 1;
    float *cs = malloc(sizeof(*cs) * 2 * (size_t)half * (size_t)n_thr);
    if (!cs) {
        rc = DSQ_ENOMEM;
    } else {
        struct rope_ctx c = {x, m, n_heads, head_dim, half, p->neox, mscale,
                             pos, inv, cs};
        dsq__parallel(n_thr, rope_region, &c);
    }
    free(cs);
    free(inv);
    return rc;
}

/* Offline quantisation math for dsq-quantize (see quantizer.h): calibration
 * bound, recipes, RTN with clip search, AWQ scale search, GPTQ, packing and
 * the --search Pareto front.
 *
 * Built for clarity over speed: the expensive inner products go through
 * dsq_cpu_matmul (F32 weights) or OpenMP loops; clip search works on the
 * per-group Gram blocks X_g^T X_g so a candidate costs g^2, not t*g. GPTQ's
 * linear algebra uses Debian's LAPACKE (dpotrf/dpotri, fp64) and OpenBLAS
 * (sgemm for the lazy block updates). */
#include "quantizer.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "kernels.h"

/* ---- calibration ---- */

int64_t dsq_quantizer_calib_samples(double eps, double delta)
{
    if (!(eps > 0.0 && eps < 1.0 && delta > 0.0 && delta < 1.0))
        return -1;
    double n = 2.0 * log(2.0 / delta) / (eps * eps);
    /* ceil with a small tolerance so an exact integer is not bumped by
     * rounding noise in log() */
    double c = ceil(n - 1e-9);
    return c < 1.0 ? 1 : (int64_t)c;
}

/* ---- recipes ---- */

int dsq_quantizer_recipe_parse(const char *name, dsq_qrecipe_t *out)
{
    if (!name || !out)
        return DSQ_EINVAL;
    if (strcmp(name, "default") == 0)
        *out = DSQ_QRECIPE_DEFAULT;
    else if (strcmp(name, "deepseek-moe") == 0)
        *out = DSQ_QRECIPE_DEEPSEEK_MOE;
    else
        return DSQ_EINVAL;
    return DSQ_OK;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

dsq_qscheme_t dsq_quantizer_recipe_select(dsq_qrecipe_t r, const char *name,
                                          int w_bit, int group_size, bool sym)
{
    dsq_qscheme_t keep = {0, 0, false};
    if (!name || strncmp(name, "blk.", 4) != 0 || !ends_with(name, ".weight"))
        return keep;
    /* blk.N.<linear>[.E].weight */
    const char *p = name + 4;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p != '.')
        return keep;
    p++;
    char lin[64];
    size_t n = strcspn(p, ".");
    if (n == 0 || n >= sizeof(lin))
        return keep;
    memcpy(lin, p, n);
    lin[n] = '\0';
    bool expert = false;           /* a numeric component follows: routed expert */
    const char *e = p + n;
    if (*e == '.' && e[1] >= '0' && e[1] <= '9')
        expert = true;
    bool is_attn = strncmp(lin, "attn_", 5) == 0 && !ends_with(lin, "_norm");
    bool is_ffn = strncmp(lin, "ffn_", 4) == 0 && strcmp(lin, "ffn_gate_inp") != 0 &&
                  !ends_with(lin, "_norm");
    if (!is_attn && !is_ffn)
        return keep;
    bool exps = ends_with(lin, "_exps");   /* llama.cpp stacked experts */
    if (r == DSQ_QRECIPE_DEFAULT)
        return (dsq_qscheme_t){w_bit, group_size, sym};
    if (is_ffn && (expert || exps))
        return (dsq_qscheme_t){4, group_size, false};
    return (dsq_qscheme_t){8, 0, true};
}

/* ---- RTN ---- */

static float h2f(uint16_t h) { return dsq_fp16_to_fp32(h); }

/* Quantise one group v[0..g) with range [lo, hi] (lo <= 0 <= hi asym;
 * sym uses hi as absmax). Writes q[0..g) (stride 1), *s16, *z. */
static void quant_group(const float *v, int g, bool sym, float lo, float hi,
                        uint8_t *q, uint16_t *s16, uint8_t *z)
{
    float s, zf;
    if (sym) {
        s = hi / 7.0f;
        zf = 8.0f;
    } else {
        s = (hi - lo) / 15.0f;
        zf = 0.0f;
    }
    uint16_t sh = dsq_fp32_to_fp16(s);
    float sf = h2f(sh);
    if (!(sf > 0.0f) || !isfinite(sf)) {         /* all-zero (or tiny) group */
        sh = dsq_fp32_to_fp16(1.0f);
        sf = 1.0f;
        zf = 8.0f;
        for (int i = 0; i < g; i++)
            q[i] = 8;
        *s16 = sh;
        *z = 8;
        return;
    }
    if (!sym) {
        zf = rintf(-lo / sf);
        zf = zf < 0 ? 0 : zf > 15 ? 15 : zf;
    }
    for (int i = 0; i < g; i++) {
        float x = rintf(v[i] / sf) + zf;
        q[i] = (uint8_t)(x < 0 ? 0 : x > 15 ? 15 : x);
    }
    *s16 = sh;
    *z = (uint8_t)zf;
}

/* Base range of a group: [min(v,0), max(v,0)] (asym) or [-amax, amax]
 * (sym), clamped by quantile clipping when the group is long-tailed. */
static void group_range(const float *v, int g, const dsq_qopts_t *o, float *tmp,
                        float *lo, float *hi)
{
    float mn = 0, mx = 0, amax = 0;
    for (int i = 0; i < g; i++) {
        mn = v[i] < mn ? v[i] : mn;
        mx = v[i] > mx ? v[i] : mx;
        float a = fabsf(v[i]);
        amax = a > amax ? a : amax;
    }
    if (o->clip_quantile > 0 && o->clip_quantile < 1 && o->clip_ratio > 0) {
        for (int i = 0; i < g; i++)
            tmp[i] = fabsf(v[i]);
        /* insertion sort: g <= 128 */
        for (int i = 1; i < g; i++) {
            float x = tmp[i];
            int j = i - 1;
            while (j >= 0 && tmp[j] > x) {
                tmp[j + 1] = tmp[j];
                j--;
            }
            tmp[j + 1] = x;
        }
        int qi = (int)floor(o->clip_quantile * (g - 1));
        float lim = (float)(o->clip_ratio * tmp[qi]);
        if (amax > lim && lim > 0) {
            mx = mx > lim ? lim : mx;
            mn = mn < -lim ? -lim : mn;
            amax = lim;
        }
    }
    if (o->sym) {
        *lo = -amax;
        *hi = amax;
    } else {
        *lo = mn;
        *hi = mx;
    }
}

double dsq_quantizer_clip_kl(const float *v, int n, float lo, float hi)
{
    float mn = v[0], mx = v[0];
    for (int i = 1; i < n; i++) {
        mn = v[i] < mn ? v[i] : mn;
        mx = v[i] > mx ? v[i] : mx;
    }
    if (!(mx > mn))
        return 0.0;
    double p[16] = {0}, q[16] = {0};
    double w = (mx - mn) / 16.0;
    for (int i = 0; i < n; i++) {
        float c = v[i] < lo ? lo : v[i] > hi ? hi : v[i];
        int a = (int)((v[i] - mn) / w), b = (int)((c - mn) / w);
        a = a < 0 ? 0 : a > 15 ? 15 : a;
        b = b < 0 ? 0 : b > 15 ? 15 : b;
        p[a] += 1;
        q[b] += 1;
    }
    double kl = 0, tot = n + 8.0;       /* add-half smoothing over 16 bins */
    for (int i = 0; i < 16; i++) {
        double pi = (p[i] + 0.5) / tot, qi = (q[i] + 0.5) / tot;
        kl += pi * log(pi / qi);
    }
    return kl;
}

/* Groups run along k; the last one may be partial (k % g != 0), as in
 * AutoGPTQ (ceil(k / g) groups, g_idx = j / g) and GGUF. */
static int check_shape(int64_t n, int64_t k, int g)
{
    if (n <= 0 || k <= 0 || (g != 32 && g != 64 && g != 128))
        return DSQ_EINVAL;
    return DSQ_OK;
}

static int64_t n_groups(int64_t k, int g)
{
    return (k + g - 1) / g;
}

/* Length of group b (g, or the remainder for the last one). */
static int group_len(int64_t k, int g, int64_t b)
{
    int64_t l = k - b * g;
    return (int)(l < g ? l : g);
}

/* Gram blocks G_b = X_b^T X_b / t, [nb][g][g] (a partial last block uses
 * its top-left gl x gl corner), for the clip search. */
static float *gram_blocks(const float *x, int64_t t, int64_t k, int g)
{
    int64_t nb = n_groups(k, g);
    float *G = calloc((size_t)(nb * g * g), sizeof(*G));
    if (!G)
        return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        float *gb = G + b * g * g;
        int gl = group_len(k, g, b);
        for (int64_t r = 0; r < t; r++) {
            const float *xr = x + r * k + b * g;
            for (int i = 0; i < gl; i++) {
                float xi = xr[i];
                for (int j = 0; j < gl; j++)
                    gb[i * g + j] += xi * xr[j];
            }
        }
        for (int i = 0; i < g * g; i++)
            gb[i] /= (float)t;
    }
    return G;
}

int dsq_quantizer_quantize(const float *w, int64_t n, int64_t k,
                           const float *x, int64_t t, const dsq_qopts_t *o,
                           uint8_t *q, uint16_t *scales, uint8_t *zeros)
{
    if (!w || !o || !q || !scales || !zeros || check_shape(n, k, o->group_size))
        return DSQ_EINVAL;
    const int g = o->group_size;
    const int64_t nb = n_groups(k, g);
    bool search = o->clip_search && x && t > 0;
    float *G = NULL;
    if (search) {
        G = gram_blocks(x, t, k, g);
        if (!G)
            return DSQ_ENOMEM;
    }
    int grid = o->clip_grid > 0 ? o->clip_grid : 20;
    float min_ratio = o->clip_min_ratio > 0 ? o->clip_min_ratio : 0.5f;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t r = 0; r < n; r++) {
        float tmp[128], d[128];
        uint8_t qq[128];
        for (int64_t b = 0; b < nb; b++) {
            const float *v = w + r * k + b * g;
            uint8_t *qo = q + r * k + b * g;
            const int gl = group_len(k, g, b);
            float lo, hi;
            group_range(v, gl, o, tmp, &lo, &hi);
            quant_group(v, gl, o->sym, lo, hi, qo, &scales[r * nb + b], &zeros[r * nb + b]);
            if (o->zero_min1 && zeros[r * nb + b] == 0)
                quant_group(v, gl, o->sym, -hi / 14.0f, hi, qo, &scales[r * nb + b],
                            &zeros[r * nb + b]);
            if (!search)
                continue;
            const float *gb = G + b * g * g;
            double best = INFINITY;
            for (int i = 0; 1.0f - (float)i / grid >= min_ratio - 1e-6f; i++) {
                float ratio = 1.0f - (float)i / grid;
                float clo = lo * ratio, chi = hi * ratio;
                if (i > 0 && o->clip_kl_bound > 0 &&
                    dsq_quantizer_clip_kl(v, gl, clo, chi) > o->clip_kl_bound)
                    break;
                uint16_t s16;
                uint8_t z;
                quant_group(v, gl, o->sym, clo, chi, qq, &s16, &z);
                if (o->zero_min1 && z == 0)
                    quant_group(v, gl, o->sym, -chi / 14.0f, chi, qq, &s16, &z);
                float sf = h2f(s16);
                for (int j = 0; j < gl; j++)
                    d[j] = v[j] - ((float)qq[j] - (float)z) * sf;
                double e = 0;
                for (int a = 0; a < gl; a++) {
                    double acc = 0;
                    for (int c = 0; c < gl; c++)
                        acc += (double)gb[a * g + c] * d[c];
                    e += acc * d[a];
                }
                if (e < best) {
                    best = e;
                    memcpy(qo, qq, (size_t)gl);
                    scales[r * nb + b] = s16;
                    zeros[r * nb + b] = z;
                }
            }
        }
    }
    free(G);
    return DSQ_OK;
}

void dsq_quantizer_dequant(const uint8_t *q, const uint16_t *scales,
                           const uint8_t *zeros, int64_t n, int64_t k,
                           int group_size, float *w_out)
{
    int64_t nb = n_groups(k, group_size);
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c++) {
            int64_t b = c / group_size;
            w_out[r * k + c] = ((float)q[r * k + c] - (float)zeros[r * nb + b]) *
                               h2f(scales[r * nb + b]);
        }
}

double dsq_quantizer_output_error(const float *w, const float *wq, int64_t n,
                                  int64_t k, const float *x, int64_t t)
{
    float *d = malloc((size_t)(n * k) * sizeof(*d));
    float *y = malloc((size_t)(n * t) * sizeof(*y));
    double e = NAN;
    if (d && y) {
        for (int64_t i = 0; i < n * k; i++)
            d[i] = w[i] - wq[i];
        dsq_weight_t dw = {.format = DSQ_WFMT_F32, .n = n, .k = k, .data = d};
        if (dsq_cpu_matmul(y, x, t, &dw) == DSQ_OK) {
            e = 0;
            for (int64_t i = 0; i < n * t; i++)
                e += (double)y[i] * y[i];
            e /= (double)t;
        }
    }
    free(d);
    free(y);
    return e;
}

/* ---- AWQ scale search ---- */

int dsq_quantizer_awq_scales(const float *const *ws, const int64_t *ns,
                             int n_w, int64_t k, const float *x, int64_t t,
                             const float *x_mean, int grid,
                             const dsq_qopts_t *o, float *s_out,
                             double *err_out, double *alpha_out)
{
    if (!ws || !ns || n_w <= 0 || !x || t <= 0 || !x_mean || !o || !s_out)
        return DSQ_EINVAL;
    for (int i = 0; i < n_w; i++)
        if (check_shape(ns[i], k, o->group_size))
            return DSQ_EINVAL;
    if (grid <= 0)
        grid = 20;
    const int g = o->group_size;
    int64_t nmax = 0, nrows = 0;
    for (int i = 0; i < n_w; i++) {
        nmax = ns[i] > nmax ? ns[i] : nmax;
        nrows += ns[i];
    }
    dsq_qopts_t ro = *o;
    ro.clip_search = false;
    int rc = DSQ_OK;
    float *wmean = calloc((size_t)k, sizeof(*wmean));
    float *s = malloc((size_t)k * sizeof(*s));
    float *wsc = malloc((size_t)(nmax * k) * sizeof(*wsc));
    uint8_t *q = malloc((size_t)(nmax * k));
    const int64_t nb = n_groups(k, g);
    uint16_t *sc = malloc((size_t)(nmax * nb) * sizeof(*sc));
    uint8_t *z = malloc((size_t)(nmax * nb));
    if (!wmean || !s || !wsc || !q || !sc || !z) {
        rc = DSQ_ENOMEM;
        goto undo;
    }
    /* w_mean: |w| normalised by its group's absmax, averaged over all rows */
    for (int i = 0; i < n_w; i++)
        for (int64_t r = 0; r < ns[i]; r++)
            for (int64_t b = 0; b < nb; b++) {
                const float *v = ws[i] + r * k + b * g;
                const int gl = group_len(k, g, b);
                float amax = 0;
                for (int j = 0; j < gl; j++)
                    amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
                if (amax > 0)
                    for (int j = 0; j < gl; j++)
                        wmean[b * g + j] += fabsf(v[j]) / amax;
            }
    for (int64_t j = 0; j < k; j++)
        wmean[j] /= (float)nrows;
    double best = INFINITY, best_alpha = 0;
    for (int gi = 0; gi <= grid; gi++) {
        double alpha = (double)gi / grid;
        float smax = 0, smin = INFINITY;
        for (int64_t j = 0; j < k; j++) {
            double v = gi == 0 ? 1.0
                               : pow(fmax(x_mean[j], 1e-8), alpha) /
                                     (pow(fmax(wmean[j], 1e-8), 1.0 - alpha) + 1e-4);
            s[j] = (float)fmax(v, 1e-4);
            smax = s[j] > smax ? s[j] : smax;
            smin = s[j] < smin ? s[j] : smin;
        }
        float norm = sqrtf(smax * smin);
        for (int64_t j = 0; j < k; j++)
            s[j] /= norm;
        double e = 0;
        for (int i = 0; i < n_w && rc == DSQ_OK; i++) {
            int64_t n = ns[i];
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = 0; j < k; j++)
                    wsc[r * k + j] = ws[i][r * k + j] * s[j];
            rc = dsq_quantizer_quantize(wsc, n, k, NULL, 0, &ro, q, sc, z);
            if (rc)
                break;
            dsq_quantizer_dequant(q, sc, z, n, k, g, wsc);
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = 0; j < k; j++)
                    wsc[r * k + j] /= s[j];
            double ei = dsq_quantizer_output_error(ws[i], wsc, n, k, x, t);
            if (isnan(ei)) {
                rc = DSQ_ENOMEM;
                break;
            }
            e += ei;
        }
        if (rc)
            goto undo;
        if (e < best) {
            best = e;
            best_alpha = alpha;
            memcpy(s_out, s, (size_t)k * sizeof(*s));
        }
    }
    if (err_out)
        *err_out = best;
    if (alpha_out)
        *alpha_out = best_alpha;
undo:
    free(wmean);
    free(s);
    free(wsc);
    free(q);
    free(sc);
    free(z);
    return rc;
}

/* ---- GPTQ ---- */

int dsq_quantizer_hinv_chol(double *h, int64_t k)
{
    if (!h || k <= 0 || k > INT32_MAX)
        return DSQ_EINVAL;
    const lapack_int n = (lapack_int)k;
    /* h = U^T U (upper), then h^{-1} in the upper triangle, then the
     * Cholesky factor of h^{-1}. LAPACK's info > 0: a leading minor is not
     * positive definite (or U is singular for dpotri). */
    lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, h, n);
    if (info == 0)
        info = LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'U', n, h, n);
    if (info == 0)
        info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, h, n);
    if (info < 0)
        return DSQ_EINVAL;
    if (info > 0)
        return DSQ_ERANGE;
    for (int64_t i = 1; i < k; i++)
        for (int64_t j = 0; j < i; j++)
            h[i * k + j] = 0;
    return DSQ_OK;
}

typedef struct gptq_sort {
    double d;
    int32_t i;
} gptq_sort_t;

static int cmp_desc(const void *a, const void *b)
{
    const gptq_sort_t *x = a, *y = b;
    if (x->d != y->d)
        return x->d > y->d ? -1 : 1;
    return x->i - y->i;
}

int dsq_quantizer_gptq(const float *w, int64_t n, int64_t k, const double *h,
                       double damp, bool desc_act, const dsq_qopts_t *o,
                       uint8_t *q, uint16_t *scales, uint8_t *zeros,
                       int32_t *g_idx)
{
    if (!w || !h || !o || !q || !scales || !zeros || !g_idx ||
        check_shape(n, k, o->group_size))
        return DSQ_EINVAL;
    const int g = o->group_size;
    const int64_t nb = n_groups(k, g), B = 128;
    int rc = DSQ_OK;
    float *W = malloc((size_t)(n * k) * sizeof(*W));        /* processing order */
    double *H = malloc((size_t)(k * k) * sizeof(*H));
    float *E = malloc((size_t)(n * B) * sizeof(*E));
    int32_t *perm = malloc((size_t)k * sizeof(*perm));
    gptq_sort_t *srt = malloc((size_t)k * sizeof(*srt));
    uint8_t *qp = malloc((size_t)(n * k));
    float *Hf = malloc((size_t)(k * k) * sizeof(*Hf));      /* fp32 copy of U */
    if (!W || !H || !E || !perm || !srt || !qp || !Hf) {
        rc = DSQ_ENOMEM;
        goto undo;
    }
    for (int64_t j = 0; j < k; j++) {
        srt[j].d = h[j * k + j];
        srt[j].i = (int32_t)j;
    }
    if (desc_act)
        qsort(srt, (size_t)k, sizeof(*srt), cmp_desc);
    for (int64_t j = 0; j < k; j++)
        perm[j] = srt[j].i;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++)
            W[r * k + j] = w[r * k + perm[j]];
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++)
            H[i * k + j] = h[(int64_t)perm[i] * k + perm[j]];
    /* dead columns (never activated): any value works, quantise zeros */
    double mean_diag = 0;
    for (int64_t j = 0; j < k; j++) {
        if (H[j * k + j] == 0) {
            H[j * k + j] = 1;
            for (int64_t r = 0; r < n; r++)
                W[r * k + j] = 0;
        }
        mean_diag += H[j * k + j];
    }
    mean_diag /= (double)k;
    for (int64_t j = 0; j < k; j++)
        H[j * k + j] += damp * mean_diag;
    rc = dsq_quantizer_hinv_chol(H, k);
    if (rc)
        goto undo;
    for (int64_t i = 0; i < k * k; i++)
        Hf[i] = (float)H[i];
    for (int64_t i1 = 0; i1 < k; i1 += B) {
        int64_t i2 = i1 + B < k ? i1 + B : k, cnt = i2 - i1;
        for (int64_t i = i1; i < i2; i++) {
            if (i % g == 0) {
                /* group parameters from the error-compensated columns */
                int64_t b = i / g;
                const int gl = group_len(k, g, b);
#pragma omp parallel for schedule(static)
                for (int64_t r = 0; r < n; r++) {
                    float tmp[128], lo, hi;
                    uint8_t qq[128];
                    group_range(W + r * k + i, gl, o, tmp, &lo, &hi);
                    quant_group(W + r * k + i, gl, o->sym, lo, hi, qq,
                                &scales[r * nb + b], &zeros[r * nb + b]);
                    /* GPTQ v1 stores z - 1: keep z >= 1 (range [-hi/14, hi]) */
                    if (zeros[r * nb + b] == 0)
                        quant_group(W + r * k + i, gl, o->sym, -hi / 14.0f, hi, qq,
                                    &scales[r * nb + b], &zeros[r * nb + b]);
                }
            }
            double d = H[i * k + i];
            int64_t b = i / g;
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < n; r++) {
                float sf = h2f(scales[r * nb + b]), zf = (float)zeros[r * nb + b];
                float wv = W[r * k + i];
                float x = rintf(wv / sf) + zf;
                x = x < 0 ? 0 : x > 15 ? 15 : x;
                qp[r * k + i] = (uint8_t)x;
                float err = (float)((wv - (x - zf) * sf) / d);
                for (int64_t j = i + 1; j < i2; j++)
                    W[r * k + j] -= err * Hf[i * k + j];
                E[r * B + (i - i1)] = err;
            }
        }
        /* lazy batch update: W[:, i2:] -= E[:, :cnt] U[i1:i2, i2:] */
        if (i2 < k)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)n,
                        (blasint)(k - i2), (blasint)cnt, -1.0f, E, (blasint)B,
                        Hf + i1 * k + i2, (blasint)k, 1.0f, W + i2, (blasint)k);
    }
    for (int64_t j = 0; j < k; j++)
        g_idx[perm[j]] = (int32_t)(j / g);
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++)
            q[r * k + perm[j]] = qp[r * k + j];
undo:
    free(W);
    free(H);
    free(E);
    free(perm);
    free(srt);
    free(qp);
    free(Hf);
    return rc;
}

/* ---- packing ---- */

int dsq_quantizer_pack_awq(const uint8_t *q, const uint16_t *scales_in,
                           const uint8_t *zeros, int64_t n, int64_t k,
                           int group_size, int32_t *qweight, int32_t *qzeros,
                           uint16_t *scales)
{
    static const int pos[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    if (!q || !scales_in || !zeros || !qweight || !qzeros || !scales || n <= 0 ||
        n % 8 || check_shape(n, k, group_size) || k % group_size)
        return DSQ_EINVAL;   /* AutoAWQ's WQLinear_GEMM: in_features % group_size == 0 */
    const int64_t n8 = n / 8, nb = k / group_size;
    for (int64_t r = 0; r < k; r++)
        for (int64_t j = 0; j < n8; j++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++)
                v |= (uint32_t)(q[(8 * j + i) * k + r] & 15) << (4 * pos[i]);
            qweight[r * n8 + j] = (int32_t)v;
        }
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t j = 0; j < n8; j++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++)
                v |= (uint32_t)(zeros[(8 * j + i) * nb + b] & 15) << (4 * pos[i]);
            qzeros[b * n8 + j] = (int32_t)v;
        }
        for (int64_t c = 0; c < n; c++)
            scales[b * n + c] = scales_in[c * nb + b];
    }
    return DSQ_OK;
}

int dsq_quantizer_pack_gptq(const uint8_t *q, const uint16_t *scales_in,
                            const uint8_t *zeros, int64_t n, int64_t k,
                            int64_t n_groups, int32_t *qweight,
                            int32_t *qzeros, uint16_t *scales)
{
    if (!q || !scales_in || !zeros || !qweight || !qzeros || !scales || n <= 0 ||
        k <= 0 || n % 8 || k % 8 || n_groups <= 0)
        return DSQ_EINVAL;
    const int64_t n8 = n / 8;
    for (int64_t j = 0; j < k / 8; j++)
        for (int64_t c = 0; c < n; c++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++)
                v |= (uint32_t)(q[c * k + 8 * j + i] & 15) << (4 * i);
            qweight[j * n + c] = (int32_t)v;
        }
    for (int64_t b = 0; b < n_groups; b++) {
        for (int64_t j = 0; j < n8; j++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++)
                v |= (uint32_t)((zeros[(8 * j + i) * n_groups + b] - 1) & 15) << (4 * i);
            qzeros[b * n8 + j] = (int32_t)v;
        }
        for (int64_t c = 0; c < n; c++)
            scales[b * n + c] = scales_in[c * n_groups + b];
    }
    return DSQ_OK;
}

int dsq_quantizer_pack_gptq8(const int8_t *q, const uint16_t *scales_in, int64_t n,
                             int64_t k, int32_t *qweight, int32_t *qzeros,
                             uint16_t *scales)
{
    if (!q || !scales_in || !qweight || !qzeros || !scales || n <= 0 || k <= 0 ||
        n % 4 || k % 4)
        return DSQ_EINVAL;
    for (int64_t j = 0; j < k / 4; j++)
        for (int64_t c = 0; c < n; c++) {
            uint32_t v = 0;
            for (int i = 0; i < 4; i++)
                v |= (uint32_t)(uint8_t)(q[c * k + 4 * j + i] + 128) << (8 * i);
            qweight[j * n + c] = (int32_t)v;
        }
    for (int64_t j = 0; j < n / 4; j++)   /* z = 128 stored as 127 in each byte */
        qzeros[j] = (int32_t)0x7F7F7F7Fu;
    memcpy(scales, scales_in, (size_t)n * sizeof(*scales));
    return DSQ_OK;
}

/* ---- Pareto front ---- */

typedef struct pareto_key {
    double gain;
    int layer;
} pareto_key_t;

static int cmp_gain(const void *a, const void *b)
{
    const pareto_key_t *x = a, *y = b;
    if (x->gain != y->gain)
        return x->gain > y->gain ? -1 : 1;
    return x->layer - y->layer;
}

int dsq_quantizer_pareto(const dsq_qlayer_cost_t *layers, int n_layers,
                         int group_size, double bw_gbs,
                         double layer_overhead_us, dsq_qpoint_t *pts,
                         int *n_pts, int *order)
{
    if (!layers || n_layers <= 0 || group_size <= 0 || !(bw_gbs > 0) || !pts ||
        !n_pts || !order)
        return DSQ_EINVAL;
    double b4 = 4.0 + 32.0 / group_size, b8 = 8.0;
    pareto_key_t *key = malloc((size_t)n_layers * sizeof(*key));
    if (!key)
        return DSQ_ENOMEM;
    double bits = 0, err = 0, nw = 0;
    for (int l = 0; l < n_layers; l++) {
        double extra = (b8 - b4) * (double)layers[l].n_weights;
        key[l].gain = extra > 0 ? (layers[l].err4 - layers[l].err8) / extra : 0;
        key[l].layer = l;
        bits += b4 * (double)layers[l].n_weights;
        err += layers[l].err4;
        nw += (double)layers[l].n_weights;
    }
    qsort(key, (size_t)n_layers, sizeof(*key), cmp_gain);
    int np = 0;
    for (int i = 0; i <= n_layers; i++) {
        if (i > 0) {
            const dsq_qlayer_cost_t *c = &layers[key[i - 1].layer];
            if (!(c->err8 < c->err4))
                break;                    /* promotion no longer lowers error */
            bits += (b8 - b4) * (double)c->n_weights;
            err += c->err8 - c->err4;
        }
        pts[np].bpw = bits / nw;
        pts[np].err = err;
        pts[np].latency_us = bits / 8.0 / (bw_gbs * 1e3) + n_layers * layer_overhead_us;
        pts[np].n_8bit = i;
        np++;
    }
    for (int l = 0; l < n_layers; l++)
        order[l] = key[l].layer;
    *n_pts = np;
    free(key);
    return DSQ_OK;
}

int dsq_quantizer_pareto_pick(const dsq_qpoint_t *pts, int n_pts, double max_bpw)
{
    int best = 0;
    for (int i = 0; i < n_pts; i++)
        if (pts[i].bpw <= max_bpw + 1e-12 && pts[i].err < pts[best].err)
            best = i;
    return best;
}

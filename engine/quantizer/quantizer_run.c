/* The dsq-quantize pipeline (quantizer.h, dsq_quantizer_run): open the
 * source, run the calibration text through the fp model with the
 * activation tap, quantise layer by layer (RTN / AWQ / GPTQ, recipe,
 * optional {4, 8}-bit Pareto search), then write an AutoAWQ- or
 * AutoGPTQ-style Hugging Face directory.
 *
 * Built on the engine's own loader and forward pass so calibration sees the
 * exact activations dsq computes. All layers' activation statistics are
 * collected in one calibration pass (fp inputs everywhere), which keeps the
 * cost at one forward pass per sample; the price is that layer l's
 * quantisation does not see layer l-1's quantisation error. */
#include "quantizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cblas.h>

#include "engine/common/error.h"
#include "engine/common/clock.h"
#include "kernels.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/model/quant.h"

enum { SITE_ATTN_IN, SITE_ATTN_OUT, SITE_FFN_IN, SITE_FFN_DOWN, N_SITES };
static const char *const site_names[N_SITES] = {"attn_q", "attn_output", "ffn_gate",
                                                "ffn_down"};

/* Activation statistics of one (layer, site). */
typedef struct site_stats {
    int64_t k;
    double *abs_sum;       /* [k] sum |x|                                  */
    int64_t n_seen;        /* tokens seen                                  */
    float *rows;           /* [cap][k] reservoir sample of rows            */
    int64_t n_rows, cap;
    double *h;             /* [k][k] sum x x^T, upper triangle (gptq only) */
} site_stats_t;

typedef struct calib {
    site_stats_t *s;       /* [n_layer][N_SITES] */
    int n_layer;
    bool want_h;
    uint64_t rng;
    int rc;
} calib_t;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void tap(void *user, int layer, const char *site, const float *x, int n_tokens,
                int64_t k)
{
    calib_t *c = user;
    int si = -1;
    for (int i = 0; i < N_SITES; i++)
        if (strcmp(site, site_names[i]) == 0)
            si = i;
    if (si < 0 || layer < 0 || layer >= c->n_layer || c->rc)
        return;
    site_stats_t *s = &c->s[layer * N_SITES + si];
    if (!s->abs_sum) {
        s->k = k;
        s->abs_sum = calloc((size_t)k, sizeof(*s->abs_sum));
        s->rows = malloc((size_t)(s->cap * k) * sizeof(*s->rows));
        if (c->want_h)
            s->h = calloc((size_t)(k * k), sizeof(*s->h));
        if (!s->abs_sum || !s->rows || (c->want_h && !s->h)) {
            c->rc = DSQ_ENOMEM;
            return;
        }
    }
    for (int t = 0; t < n_tokens; t++) {
        const float *xr = x + (int64_t)t * k;
        for (int64_t j = 0; j < k; j++)
            s->abs_sum[j] += fabsf(xr[j]);
        /* reservoir sampling (Algorithm R) */
        int64_t slot = s->n_seen < s->cap ? s->n_seen
                                          : (int64_t)(rng_next(&c->rng) % (uint64_t)(s->n_seen + 1));
        if (slot < s->cap)
            memcpy(s->rows + slot * k, xr, (size_t)k * sizeof(*xr));
        s->n_seen++;
    }
    s->n_rows = s->n_seen < s->cap ? s->n_seen : s->cap;
    if (s->h) {
        /* upper triangle of h += X^T X (BLAS dsyrk, fp64) */
        double *xd = malloc((size_t)n_tokens * (size_t)k * sizeof(*xd));
        if (!xd) {
            c->rc = DSQ_ENOMEM;
            return;
        }
        for (int64_t i = 0; i < (int64_t)n_tokens * k; i++)
            xd[i] = x[i];
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (blasint)k, n_tokens, 1.0, xd,
                    (blasint)k, 1.0, s->h, (blasint)k);
        free(xd);
    }
}

static void calib_free(calib_t *c)
{
    if (!c->s)
        return;
    for (int i = 0; i < c->n_layer * N_SITES; i++) {
        free(c->s[i].abs_sum);
        free(c->s[i].rows);
        free(c->s[i].h);
    }
    free(c->s);
    c->s = NULL;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = '\0';
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

/* Run one sequence of n tokens through the model (positions 0..n-1). */
static int run_seq(dsq_model_t *m, dsq_kv_cache_t *kv, const int32_t *tok, int n)
{
    dsq_block_table_t bt;
    dsq_block_table_init(&bt);
    int rc = dsq_kv_seq_reserve(kv, &bt, n);
    int32_t *pos = malloc((size_t)n * sizeof(*pos));
    int32_t *rs = calloc((size_t)n, sizeof(*rs));
    int32_t *slot = malloc((size_t)n * sizeof(*slot));
    if (!rc && (!pos || !rs || !slot))
        rc = DSQ_ENOMEM;
    if (!rc) {
        for (int i = 0; i < n; i++) {
            pos[i] = i;
            slot[i] = dsq_kv_slot(kv, &bt, i);
        }
        dsq_batch_t b = {.n_tokens = n, .tokens = tok, .pos = pos, .row_seq = rs,
                         .slot = slot, .n_seqs = 1, .block_tables = bt.ids,
                         .max_blocks = bt.n, .n_logits = 0, .logit_rows = NULL};
        rc = dsq_model_forward(m, kv, &b, NULL);
    }
    free(pos);
    free(rs);
    free(slot);
    dsq_kv_seq_free(kv, &bt);
    dsq_block_table_deinit(&bt);
    return rc;
}

/* fp32 copy of a whole tensor (any loadable format) as [rows][ne0]. */
static float *tensor_f32(const dsq_tensor_t *t, int64_t *rows, int64_t *cols)
{
    dsq_weight_t w;
    void *storage = NULL;
    char e[256];
    float *out = NULL;
    int64_t r = t->ne[1] * t->ne[2] * t->ne[3], c = t->ne[0];
    if (t->n_dims == 1 || r == 1) {
        /* vectors: F32/F16/BF16 only */
        out = malloc((size_t)c * sizeof(*out));
        if (!out)
            return NULL;
        const uint8_t *p = t->data;
        for (int64_t i = 0; i < c; i++) {
            uint16_t h;
            if (t->type == DSQ_TYPE_F32) {
                memcpy(&out[i], p + 4 * i, 4);
            } else if (t->type == DSQ_TYPE_F16 || t->type == DSQ_TYPE_BF16) {
                memcpy(&h, p + 2 * i, 2);
                out[i] = t->type == DSQ_TYPE_F16 ? dsq_fp16_to_fp32(h) : dsq_bf16_to_fp32(h);
            } else {
                free(out);
                return NULL;
            }
        }
        *rows = 1;
        *cols = c;
        return out;
    }
    if (dsq_quant_from_gguf(t, &w, &storage, e, sizeof(e)) != DSQ_OK)
        return NULL;
    out = malloc((size_t)(r * c) * sizeof(*out));
    for (int64_t i = 0; out && i < r; i++)
        if (dsq_weight_dequant_row(&w, i, out + i * c) != DSQ_OK) {
            free(out);
            out = NULL;
        }
    free(storage);
    *rows = r;
    *cols = c;
    return out;
}

/* HF (neox) row order from adjacent-pair order: HF row h*hd + t*hd/2 + i
 * takes source row h*hd + 2i + t (transformers' convert_llama_weights_to_hf
 * permute, which llama.cpp's converter undoes). */
static int permute_rows_to_neox(float *w, int64_t n_heads, int64_t hd, int64_t k)
{
    float *tmp = malloc((size_t)(hd * k) * sizeof(*tmp));
    if (!tmp)
        return DSQ_ENOMEM;
    for (int64_t h = 0; h < n_heads; h++) {
        float *base = w + h * hd * k;
        for (int64_t t = 0; t < 2; t++)
            for (int64_t i = 0; i < hd / 2; i++)
                memcpy(tmp + (t * (hd / 2) + i) * k, base + (2 * i + t) * k,
                       (size_t)k * sizeof(*tmp));
        memcpy(base, tmp, (size_t)(hd * k) * sizeof(*tmp));
    }
    free(tmp);
    return DSQ_OK;
}

static int add_f16(dsq_st_writer_t *w, const char *name, const float *v, int64_t rows,
                   int64_t cols, bool as_matrix)
{
    size_t n = (size_t)(rows * cols);
    uint16_t *h = malloc(n * sizeof(*h));
    if (!h)
        return DSQ_ENOMEM;
    for (size_t i = 0; i < n; i++)
        h[i] = dsq_fp32_to_fp16(v[i]);
    int64_t sh[2] = {rows, cols};
    int rc = as_matrix ? dsq_st_writer_add(w, name, DSQ_TYPE_F16, 2, sh, h, n * 2)
                       : dsq_st_writer_add(w, name, DSQ_TYPE_F16, 1, &sh[1], h, n * 2);
    free(h);
    return rc;
}

static int copy_file(const char *src, const char *dst)
{
    size_t len = 0;
    char *buf = read_file(src, &len);
    if (!buf)
        return DSQ_EIO;
    FILE *f = fopen(dst, "wb");
    int rc = f && fwrite(buf, 1, len, f) == len ? DSQ_OK : DSQ_EIO;
    if (f && fclose(f) != 0)
        rc = DSQ_EIO;
    free(buf);
    return rc;
}

static bool is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* One linear of the current layer. */
typedef struct lin {
    const char *cname;     /* canonical: attn_q ...   */
    const char *hf;        /* HF: self_attn.q_proj ... */
    int site;
    int64_t n, k;
    float *w;              /* fp32 [n][k], AWQ-scaled in place */
    float *bias;
    dsq_qscheme_t sch;
    bool packable;         /* INT4 and the packing can hold it */
    /* results */
    uint8_t *q;
    uint16_t *scales;
    uint8_t *zeros;
    int32_t *g_idx;
    float *w8;             /* 8-bit variant (search / recipe), dequantised */
    double err4, err8;
} lin_t;

static void lin_free(lin_t *l)
{
    free(l->w);
    free(l->bias);
    free(l->q);
    free(l->scales);
    free(l->zeros);
    free(l->g_idx);
    free(l->w8);
}

/* INT8 per-channel sym fake quantisation (recipe INT8 and --search 8 bit):
 * s = amax/127 in fp16, q = clamp(round(w/s), -127, 127), out = q*s. */
static void int8_channel(const float *w, int64_t n, int64_t k, float *out)
{
    for (int64_t r = 0; r < n; r++) {
        float amax = 0;
        for (int64_t j = 0; j < k; j++)
            amax = fabsf(w[r * k + j]) > amax ? fabsf(w[r * k + j]) : amax;
        float s = dsq_fp16_to_fp32(dsq_fp32_to_fp16(amax / 127.0f));
        for (int64_t j = 0; j < k; j++) {
            float q = s > 0 ? rintf(w[r * k + j] / s) : 0;
            q = q < -127 ? -127 : q > 127 ? 127 : q;
            out[r * k + j] = q * s;
        }
    }
}

static void scale_cols(float *w, int64_t n, int64_t k, const float *s, bool divide)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++)
            w[r * k + j] = divide ? w[r * k + j] / s[j] : w[r * k + j] * s[j];
}

typedef enum { M_RTN, M_AWQ, M_GPTQ } method_t;

/* Write a JSON object to dir/name. */
static int write_json(const char *dir, const char *name, cJSON *j, char *err, size_t err_len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *txt = cJSON_Print(j);
    FILE *f = txt ? fopen(path, "wb") : NULL;
    int rc = f && fputs(txt, f) >= 0 && fputc('\n', f) != EOF ? DSQ_OK : DSQ_EIO;
    if (f && fclose(f) != 0)
        rc = DSQ_EIO;
    if (rc)
        snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
    free(txt);
    return rc;
}

#define FAIL(code, ...)                                   \
    do {                                                  \
        snprintf(err, err_len, __VA_ARGS__);              \
        rc = (code);                                      \
        goto undo;                                        \
    } while (0)

int dsq_quantizer_run(const dsq_qrun_opts_t *o, char *err, size_t err_len)
{
    int rc = DSQ_OK;
    dsq_model_file_t *f = NULL;
    dsq_model_t *model = NULL;
    dsq_kv_cache_t *kv = NULL;
    dsq_st_writer_t *wr = NULL;
    calib_t cal = {0};
    int32_t *ids = NULL;
    char *text = NULL;
    lin_t *all = NULL;               /* [n_layer][7] kept for --search */
    float **norms = NULL;            /* [n_layer][2]                   */
    dsq_qlayer_cost_t *costs = NULL;
    dsq_qpoint_t *pts = NULL;
    int *order = NULL;
    cJSON *cfgj = NULL;
    bool *layer8 = NULL;
    int L = 0;
    char e2[512] = "";

    if (!o || !o->model || !o->out_dir)
        FAIL(DSQ_EINVAL, "quantize: --model and --out are required");
    /* The parallelism is OpenMP's (loops around the BLAS calls); OpenBLAS's
     * own pthreads on top of spinning OpenMP workers oversubscribe the
     * cores (measured: GPTQ crawled on a loaded 2-core box), so BLAS runs
     * single-threaded here. */
    openblas_set_num_threads(1);
    method_t method;
    const char *mname = o->method ? o->method : "rtn";
    if (strcmp(mname, "rtn") == 0)
        method = M_RTN;
    else if (strcmp(mname, "awq") == 0)
        method = M_AWQ;
    else if (strcmp(mname, "gptq") == 0)
        method = M_GPTQ;
    else
        FAIL(DSQ_EINVAL, "quantize: --method must be rtn, awq or gptq, not '%s'", mname);
    int wbit = o->w_bit ? o->w_bit : 4;
    int g = o->group_size ? o->group_size : 128;
    if (wbit != 4)
        FAIL(DSQ_EINVAL, "quantize: --w-bit %d: only 4 is supported", wbit);
    if (g != 32 && g != 64 && g != 128)
        FAIL(DSQ_EINVAL, "quantize: --group-size %d: use 32, 64 or 128", g);
    bool need_calib = method != M_RTN || o->search;
    if (need_calib && !o->calib)
        FAIL(DSQ_EINVAL, "quantize: --method %s%s needs --calib FILE", mname,
             o->search ? " / --search" : "");

    f = dsq_model_file_open(o->model, o->tokenizer, e2, sizeof(e2));
    if (!f)
        FAIL(DSQ_ENOTFOUND, "quantize: %s", e2);
    const dsq_model_config_t *c = dsq_model_file_config(f);
    if (c->arch == DSQ_ARCH_DEEPSEEK2 && c->ckpt_quant == DSQ_CKPT_QUANT_NONE) {
        /* engine/quantizer/quantizer_ds2.c: RTN + recipe, mixed 4/8-bit GPTQ */
        if (method != M_RTN || o->search)
            FAIL(DSQ_EUNSUPPORTED, "quantize: deepseek2: only --method rtn (no --search): "
                 "AWQ/GPTQ/--search need calibration activations, and the activation tap "
                 "is in the llama/qwen2 graph only");
        if (o->format && strcmp(o->format, "auto") && strcmp(o->format, "gptq"))
            FAIL(DSQ_EINVAL, "quantize: deepseek2 is written as GPTQ (--format gptq|auto)");
        rc = dsq__quantizer_run_ds2(o, f, g, err, err_len);
        goto undo;
    }
    if (c->arch != DSQ_ARCH_LLAMA && c->arch != DSQ_ARCH_QWEN2)
        FAIL(DSQ_EUNSUPPORTED, "quantize: architecture %s: only llama and qwen2 can be "
             "calibrated and written (the activation tap is in the llama/qwen2 graph only)",
             dsq_arch_name(c->arch));
    if (c->ckpt_quant != DSQ_CKPT_QUANT_NONE)
        FAIL(DSQ_EUNSUPPORTED, "quantize: %s is already AWQ/GPTQ-packed; give an fp or "
             "GGUF source", o->model);
    L = (int)c->n_layer;
    const int64_t d = c->n_embd, hd = c->head_dim, qd = c->n_head * hd,
                  kvd = c->n_head_kv * hd, ff = c->n_ff;
    bool gptq_fmt;
    if (!o->format || strcmp(o->format, "auto") == 0) {
        /* GPTQ when it packs a linear AWQ cannot (k % g, partial group) */
        const int64_t nk[7][2] = {{qd, d}, {kvd, d}, {kvd, d}, {d, qd},
                                  {ff, d}, {ff, d}, {d, ff}};
        /* ... or when INT8 modules are written: AWQ has no 8-bit format,
         * GPTQ does (8-bit per-channel, declared in `dynamic`) */
        gptq_fmt = method == M_GPTQ || o->recipe == DSQ_QRECIPE_DEEPSEEK_MOE || o->search;
        for (int i = 0; i < 7; i++)
            if (nk[i][0] % 8 == 0 && nk[i][1] % 8 == 0 && nk[i][1] % g)
                gptq_fmt = true;
    }
    else if (strcmp(o->format, "gptq") == 0)
        gptq_fmt = true;
    else if (strcmp(o->format, "awq") == 0)
        gptq_fmt = false;
    else
        FAIL(DSQ_EINVAL, "quantize: --format must be auto, awq or gptq, not '%s'", o->format);
    if (gptq_fmt && method != M_GPTQ && !o->quiet && (!o->format || strcmp(o->format, "gptq")))
        fprintf(stderr, "quantize: group %d does not divide every input width (%lld, %lld, "
                "%lld): writing the GPTQ format, whose ceil(k/g) groups hold the partial "
                "last group (AutoAWQ requires k %% g == 0)\n", g, (long long)d,
                (long long)qd, (long long)ff);

    /* ---- calibration ---- */
    int L_seq = o->calib_seq_len ? o->calib_seq_len : 512;
    int n_samples = 0;
    if (need_calib) {
        double eps = o->calib_eps > 0 ? o->calib_eps : 0.25;
        double delta = o->calib_delta > 0 ? o->calib_delta : 0.1;
        int64_t need = dsq_quantizer_calib_samples(eps, delta);
        if (need < 0)
            FAIL(DSQ_EINVAL, "quantize: --calib-epsilon and --calib-delta must be in (0, 1)");
        const dsq_tokenizer_t *tk = dsq_model_file_tokenizer(f);
        if (!tk)
            FAIL(DSQ_EINVAL, "quantize: %s has no tokenizer; give --tokenizer", o->model);
        size_t len = 0, n_ids = 0;
        text = read_file(o->calib, &len);
        if (!text)
            FAIL(DSQ_ENOTFOUND, "quantize: cannot read --calib %s: %s", o->calib,
                 strerror(errno));
        rc = dsq_tokenizer_encode(tk, text, len, 0, &ids, &n_ids);
        if (rc)
            FAIL(rc, "quantize: tokenizing %s failed", o->calib);
        if (L_seq > c->n_ctx_train && c->n_ctx_train > 0)
            L_seq = (int)c->n_ctx_train;
        int avail = (int)(n_ids / (size_t)L_seq);
        n_samples = o->calib_samples > 0 ? o->calib_samples : (int)need;
        if (n_samples > avail) {
            if (!o->force || avail == 0)
                FAIL(DSQ_EINVAL, "quantize: %s gives %d samples of %d tokens, %d asked%s",
                     o->calib, avail, L_seq, n_samples,
                     avail ? " (--force to use what there is)" : "");
            n_samples = avail;
        }
        if (n_samples < need && !o->force)
            FAIL(DSQ_EINVAL, "quantize: %d calibration samples; eps=%g delta=%g need "
                 "n = ceil(2 ln(2/delta)/eps^2) = %lld (--force to go on anyway)",
                 n_samples, eps, delta, (long long)need);
        if (n_samples < need && !o->quiet)
            fprintf(stderr, "quantize: warning: %d calibration samples < %lld needed for "
                    "eps=%g delta=%g (--force)\n", n_samples, (long long)need, eps, delta);
        dsq_model_opts_t mo = {0};
        model = dsq_model_create(f, &mo, e2, sizeof(e2));
        if (!model)
            FAIL(DSQ_EFORMAT, "quantize: %s", e2);
        kv = dsq_kv_create(L, (int)c->n_head_kv, (int)hd, 16, (L_seq + 15) / 16 + 1,
                           DSQ_KV_F16, e2, sizeof(e2));
        if (!kv)
            FAIL(DSQ_ENOMEM, "quantize: kv cache: %s", e2);
        cal.n_layer = L;
        cal.want_h = method == M_GPTQ;
        cal.rng = 0x9e3779b97f4a7c15ull;
        cal.s = calloc((size_t)(L * N_SITES), sizeof(*cal.s));
        if (!cal.s)
            FAIL(DSQ_ENOMEM, "quantize: out of memory");
        for (int i = 0; i < L * N_SITES; i++)
            cal.s[i].cap = o->calib_rows > 0 ? o->calib_rows : 512;
        dsq_model_set_tap(model, tap, &cal);
        double t0 = dsq_clock_now_s();
        for (int s = 0; s < n_samples && !rc; s++) {
            rc = run_seq(model, kv, ids + (size_t)s * L_seq, L_seq);
            if (!rc)
                rc = cal.rc;
        }
        dsq_model_set_tap(model, NULL, NULL);
        if (rc)
            FAIL(rc, "quantize: calibration forward pass failed (%d)", rc);
        if (!o->quiet)
            fprintf(stderr, "quantize: calibration samples=%d seq_len=%d tokens=%d "
                    "elapsed=%.1fs\n", n_samples, L_seq, n_samples * L_seq, dsq_clock_now_s() - t0);
        dsq_model_destroy(model);
        model = NULL;
    }

    /* ---- per layer ---- */
    wr = dsq_st_writer_create();
    all = calloc((size_t)L * 7, sizeof(*all));
    norms = calloc((size_t)L * 2, sizeof(*norms));
    costs = calloc((size_t)L, sizeof(*costs));
    if (!wr || !all || !norms || !costs)
        FAIL(DSQ_ENOMEM, "quantize: out of memory");
    dsq_qopts_t qo = o->q;
    qo.group_size = g;
    qo.sym = o->sym;
    qo.clip_search = method == M_AWQ;
    qo.zero_min1 = gptq_fmt;
    bool permute = c->arch == DSQ_ARCH_LLAMA && !c->rope_neox;
    double t_start = dsq_clock_now_s();
    double sum_err = 0;
    for (int l = 0; l < L; l++) {
        lin_t *ln = all + (size_t)l * 7;
        const struct { const char *c, *hf; int site; int64_t n, k; } spec[7] = {
            {"attn_q", "self_attn.q_proj", SITE_ATTN_IN, qd, d},
            {"attn_k", "self_attn.k_proj", SITE_ATTN_IN, kvd, d},
            {"attn_v", "self_attn.v_proj", SITE_ATTN_IN, kvd, d},
            {"attn_output", "self_attn.o_proj", SITE_ATTN_OUT, d, qd},
            {"ffn_gate", "mlp.gate_proj", SITE_FFN_IN, ff, d},
            {"ffn_up", "mlp.up_proj", SITE_FFN_IN, ff, d},
            {"ffn_down", "mlp.down_proj", SITE_FFN_DOWN, d, ff},
        };
        char name[160];
        for (int i = 0; i < 7; i++) {
            lin_t *x = &ln[i];
            x->cname = spec[i].c;
            x->hf = spec[i].hf;
            x->site = spec[i].site;
            x->n = spec[i].n;
            x->k = spec[i].k;
            snprintf(name, sizeof(name), "blk.%d.%s.weight", l, x->cname);
            const dsq_tensor_t *t = dsq_model_file_find(f, name);
            int64_t r, cc;
            if (!t || !(x->w = tensor_f32(t, &r, &cc)) || r != x->n || cc != x->k)
                FAIL(DSQ_EFORMAT, "quantize: tensor %s missing, unreadable or not "
                     "[%lld, %lld]", name, (long long)x->k, (long long)x->n);
            snprintf(name, sizeof(name), "blk.%d.%s.bias", l, x->cname);
            if ((t = dsq_model_file_find(f, name)) && !(x->bias = tensor_f32(t, &r, &cc)))
                FAIL(DSQ_EFORMAT, "quantize: bias %s unreadable", name);
            if (permute && (i == 0 || i == 1)) {
                int64_t nh = i == 0 ? c->n_head : c->n_head_kv;
                if (permute_rows_to_neox(x->w, nh, hd, x->k))
                    FAIL(DSQ_ENOMEM, "quantize: out of memory");
            }
            snprintf(name, sizeof(name), "blk.%d.%s.weight", l, x->cname);
            x->sch = dsq_quantizer_recipe_select(o->recipe, name, wbit, g, o->sym);
            x->packable = x->sch.bits == 4 && x->n % 8 == 0 &&
                          (gptq_fmt ? x->k % 8 == 0 : x->k % g == 0);
        }
        for (int i = 0; i < 2; i++) {
            snprintf(name, sizeof(name), "blk.%d.%s.weight", l, i ? "ffn_norm" : "attn_norm");
            const dsq_tensor_t *t = dsq_model_file_find(f, name);
            int64_t r, cc;
            if (!t || !(norms[l * 2 + i] = tensor_f32(t, &r, &cc)) || cc != d)
                FAIL(DSQ_EFORMAT, "quantize: tensor %s missing or not [%lld]", name,
                     (long long)d);
        }
        site_stats_t *st = need_calib ? &cal.s[l * N_SITES] : NULL;
        if (st)
            for (int si = 0; si < N_SITES; si++)
                if (!st[si].abs_sum)
                    FAIL(DSQ_EFORMAT, "quantize: layer %d site %s saw no activations", l,
                         site_names[si]);

        /* AWQ: scale search per linear group, scales folded into the
         * previous op (norm weight or the previous linear's rows). */
        if (method == M_AWQ) {
            struct { int m[3]; int n_m; int site; int prev_lin; int prev_norm; } grp[4] = {
                {{0, 1, 2}, 3, SITE_ATTN_IN, -1, 0},
                {{3}, 1, SITE_ATTN_OUT, c->n_head == c->n_head_kv ? 2 : -2, -1},
                {{4, 5}, 2, SITE_FFN_IN, -1, 1},
                {{6}, 1, SITE_FFN_DOWN, 5, -1},
            };
            for (int gi = 0; gi < 4; gi++) {
                if (grp[gi].prev_lin == -2)
                    continue;                /* GQA: v rows cannot absorb o's scale */
                if (grp[gi].prev_lin >= 0 && ln[grp[gi].prev_lin].bias)
                    continue;                /* keep biased rows untouched */
                const float *wsp[3];
                int64_t nsp[3];
                int nq = 0;
                for (int j = 0; j < grp[gi].n_m; j++)
                    if (ln[grp[gi].m[j]].packable) {
                        wsp[nq] = ln[grp[gi].m[j]].w;
                        nsp[nq++] = ln[grp[gi].m[j]].n;
                    }
                if (nq == 0)
                    continue;
                site_stats_t *ss = &st[grp[gi].site];
                int64_t k = ss->k;
                float *xm = malloc((size_t)k * sizeof(*xm));
                float *s = malloc((size_t)k * sizeof(*s));
                if (!xm || !s) {
                    free(xm);
                    free(s);
                    FAIL(DSQ_ENOMEM, "quantize: out of memory");
                }
                for (int64_t j = 0; j < k; j++)
                    xm[j] = (float)(ss->abs_sum[j] / (double)ss->n_seen);
                rc = dsq_quantizer_awq_scales(wsp, nsp, nq, k, ss->rows, ss->n_rows, xm,
                                              o->awq_grid, &qo, s, NULL, NULL);
                if (!rc) {
                    for (int j = 0; j < grp[gi].n_m; j++)
                        scale_cols(ln[grp[gi].m[j]].w, ln[grp[gi].m[j]].n, k, s, false);
                    if (grp[gi].prev_norm >= 0)
                        for (int64_t j = 0; j < k; j++)
                            norms[l * 2 + grp[gi].prev_norm][j] /= s[j];
                    else {
                        lin_t *p = &ln[grp[gi].prev_lin];
                        for (int64_t r = 0; r < p->n; r++)
                            for (int64_t j = 0; j < p->k; j++)
                                p->w[r * p->k + j] /= s[r];
                    }
                    scale_cols(ss->rows, ss->n_rows, k, s, true);
                }
                free(xm);
                free(s);
                if (rc)
                    FAIL(rc, "quantize: layer %d AWQ scale search failed", l);
            }
        }
        /* quantise */
        for (int i = 0; i < 7; i++) {
            lin_t *x = &ln[i];
            site_stats_t *ss = st ? &st[x->site] : NULL;
            if (x->sch.bits == 8 || (o->search && x->sch.bits == 4)) {
                x->w8 = malloc((size_t)(x->n * x->k) * sizeof(*x->w8));
                if (!x->w8)
                    FAIL(DSQ_ENOMEM, "quantize: out of memory");
                int8_channel(x->w, x->n, x->k, x->w8);
                if (ss)
                    x->err8 = dsq_quantizer_output_error(x->w, x->w8, x->n, x->k, ss->rows,
                                                         ss->n_rows);
            }
            if (!x->packable)
                continue;
            int64_t nb = (x->k + g - 1) / g;
            x->q = malloc((size_t)(x->n * x->k));
            x->scales = malloc((size_t)(x->n * nb) * sizeof(*x->scales));
            x->zeros = malloc((size_t)(x->n * nb));
            x->g_idx = malloc((size_t)x->k * sizeof(*x->g_idx));
            if (!x->q || !x->scales || !x->zeros || !x->g_idx)
                FAIL(DSQ_ENOMEM, "quantize: out of memory");
            if (method == M_GPTQ) {
                site_stats_t *s2 = &st[x->site];
                double *h = malloc((size_t)(x->k * x->k) * sizeof(*h));
                if (!h)
                    FAIL(DSQ_ENOMEM, "quantize: out of memory");
                for (int64_t a = 0; a < x->k; a++)
                    for (int64_t b = a; b < x->k; b++)
                        h[a * x->k + b] = h[b * x->k + a] =
                            2.0 * s2->h[a * x->k + b] / (double)s2->n_seen;
                rc = dsq_quantizer_gptq(x->w, x->n, x->k, h,
                                        o->gptq_damp > 0 ? o->gptq_damp : 0.01, o->desc_act,
                                        &qo, x->q, x->scales, x->zeros, x->g_idx);
                free(h);
            } else {
                rc = dsq_quantizer_quantize(x->w, x->n, x->k, ss ? ss->rows : NULL,
                                            ss ? ss->n_rows : 0, &qo, x->q, x->scales,
                                            x->zeros);
                for (int64_t j = 0; j < x->k; j++)
                    x->g_idx[j] = (int32_t)(j / g);
            }
            if (rc)
                FAIL(rc, "quantize: layer %d %s: quantisation failed (%d)", l, x->cname, rc);
            if (ss) {
                float *wq = malloc((size_t)(x->n * x->k) * sizeof(*wq));
                if (!wq)
                    FAIL(DSQ_ENOMEM, "quantize: out of memory");
                /* GPTQ groups follow g_idx: dequantise column by column */
                int64_t nb2 = (x->k + g - 1) / g;
                for (int64_t r = 0; r < x->n; r++)
                    for (int64_t j = 0; j < x->k; j++) {
                        int64_t b = x->g_idx[j];
                        wq[r * x->k + j] = ((float)x->q[r * x->k + j] -
                                            (float)x->zeros[r * nb2 + b]) *
                                           dsq_fp16_to_fp32(x->scales[r * nb2 + b]);
                    }
                x->err4 = dsq_quantizer_output_error(x->w, wq, x->n, x->k, ss->rows,
                                                     ss->n_rows);
                free(wq);
            }
        }
        /* the fp32 copy is only needed again for fp16 / 8-bit output */
        for (int i = 0; i < 7; i++)
            if (ln[i].packable && !o->search) {
                free(ln[i].w);
                ln[i].w = NULL;
            }
        costs[l].err4 = costs[l].err8 = 0;
        costs[l].n_weights = 0;
        for (int i = 0; i < 7; i++) {
            if (ln[i].packable) {
                costs[l].err4 += ln[i].err4;
                costs[l].err8 += ln[i].err8;
                costs[l].n_weights += ln[i].n * ln[i].k;
            }
        }
        sum_err += costs[l].err4;
        if (!o->quiet) {
            double el = dsq_clock_now_s() - t_start;
            fprintf(stderr, "quantize: layer %d/%d elapsed=%.1fs eta=%.1fs out_mse=%.4g\n",
                    l + 1, L, el, el / (l + 1) * (L - l - 1), costs[l].err4);
        }
        /* drop what is no longer needed (activations) */
        if (st)
            for (int si = 0; si < N_SITES; si++) {
                free(st[si].rows);
                free(st[si].h);
                st[si].rows = NULL;
                st[si].h = NULL;
            }
    }

    /* ---- --search ---- */
    int n_pts = 0, pick = 0;
    if (o->search) {
        pts = calloc((size_t)L + 1, sizeof(*pts));
        order = calloc((size_t)L, sizeof(*order));
        if (!pts || !order)
            FAIL(DSQ_ENOMEM, "quantize: out of memory");
        rc = dsq_quantizer_pareto(costs, L, g, o->bw_gbs > 0 ? o->bw_gbs : 100.0, 0.0, pts,
                                  &n_pts, order);
        if (rc)
            FAIL(rc, "quantize: pareto search failed");
        pick = dsq_quantizer_pareto_pick(pts, n_pts,
                                         o->search_max_bpw > 0 ? o->search_max_bpw : 5.0);
        printf("pareto front (layers promoted to 8 bits in order of error saved per bit):\n");
        printf("  %-4s %-8s %-12s %-12s %s\n", "pt", "bpw", "out_mse", "latency_us", "8-bit layers");
        for (int i = 0; i < n_pts; i++) {
            printf("  %-4d %-8.3f %-12.5g %-12.2f", i, pts[i].bpw, pts[i].err,
                   pts[i].latency_us);
            for (int j = 0; j < pts[i].n_8bit; j++)
                printf("%s%d", j ? "," : " ", order[j]);
            printf("%s\n", i == pick ? "   <- chosen" : "");
        }
        layer8 = calloc((size_t)L, sizeof(*layer8));
        if (!layer8)
            FAIL(DSQ_ENOMEM, "quantize: out of memory");
        for (int j = 0; j < pts[pick].n_8bit; j++)
            layer8[order[j]] = true;
    }

    /* ---- write ---- */
    if (!is_dir(o->out_dir) && mkdir(o->out_dir, 0755) != 0)
        FAIL(DSQ_EIO, "quantize: cannot create %s: %s", o->out_dir, strerror(errno));
    {
        const dsq_tensor_t *t = dsq_model_file_find(f, "token_embd.weight");
        int64_t r, cc;
        float *v = t ? tensor_f32(t, &r, &cc) : NULL;
        if (!v)
            FAIL(DSQ_EFORMAT, "quantize: token_embd.weight unreadable");
        rc = add_f16(wr, "model.embed_tokens.weight", v, r, cc, true);
        free(v);
        if (!rc && (t = dsq_model_file_find(f, "output.weight"))) {
            v = tensor_f32(t, &r, &cc);
            rc = v ? add_f16(wr, "lm_head.weight", v, r, cc, true) : DSQ_EFORMAT;
            free(v);
        }
        if (!rc && (t = dsq_model_file_find(f, "output_norm.weight"))) {
            v = tensor_f32(t, &r, &cc);
            rc = v ? add_f16(wr, "model.norm.weight", v, 1, cc, false) : DSQ_EFORMAT;
            free(v);
        }
        if (rc)
            FAIL(rc, "quantize: writing embeddings/norm failed");
    }
    cJSON *skip = cJSON_CreateArray();
    cJSON *dyn = cJSON_CreateObject();     /* GPTQModel per-module overrides */
    int n_packed = 0, n_fp16 = 0, n_int8 = 0;
    for (int l = 0; l < L && !rc; l++) {
        char name[200];
        snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", l);
        rc = add_f16(wr, name, norms[l * 2], 1, d, false);
        snprintf(name, sizeof(name), "model.layers.%d.post_attention_layernorm.weight", l);
        if (!rc)
            rc = add_f16(wr, name, norms[l * 2 + 1], 1, d, false);
        for (int i = 0; i < 7 && !rc; i++) {
            lin_t *x = all + (size_t)l * 7 + i;
            char base[160];
            snprintf(base, sizeof(base), "model.layers.%d.%s", l, x->hf);
            if (x->bias) {
                snprintf(name, sizeof(name), "%s.bias", base);
                rc = add_f16(wr, name, x->bias, 1, x->n, false);
            }
            bool as8 = x->sch.bits == 8 || (layer8 && layer8[l] && x->packable);
            char re[200], hfe[64];                /* module regex, dots escaped */
            size_t he = 0;
            for (const char *c2 = x->hf; *c2 && he + 3 < sizeof(hfe); c2++) {
                if (*c2 == '.')
                    hfe[he++] = '\\';
                hfe[he++] = *c2;
            }
            hfe[he] = '\0';
            snprintf(re, sizeof(re), "^model\\.layers\\.%d\\.%s$", l, hfe);
            if (!rc && as8 && gptq_fmt && x->n % 4 == 0 && x->k % 4 == 0) {
                /* real 8-bit: GPTQ bits=8 per channel (z = 128) */
                dsq_tensor_t tv = {base, DSQ_TYPE_F32, 2, {x->k, x->n, 1, 1}, x->w,
                                   (size_t)(x->n * x->k) * sizeof(float)};
                rc = dsq__qwrite_gptq8(wr, base, &tv, err, err_len);
                char key[220];
                snprintf(key, sizeof(key), "+:%s", re);
                cJSON *ov = cJSON_AddObjectToObject(dyn, key);
                cJSON_AddNumberToObject(ov, "bits", 8);
                cJSON_AddNumberToObject(ov, "group_size", -1);
                cJSON_AddBoolToObject(ov, "sym", true);
                cJSON_AddBoolToObject(ov, "desc_act", false);
                n_int8++;
                continue;
            }
            if (!rc && (as8 || !x->packable)) {
                snprintf(name, sizeof(name), "%s.weight", base);
                rc = add_f16(wr, name, as8 ? x->w8 : x->w, x->n, x->k, true);
                if (as8)
                    n_int8++;
                else
                    n_fp16++;
                if (as8 || x->sch.bits == 4) {
                    char key[220];
                    snprintf(key, sizeof(key), "-:%s", re);
                    cJSON_AddItemToObject(dyn, key, cJSON_CreateObject());
                }
                if (!as8 && x->sch.bits == 4)
                    cJSON_AddItemToArray(skip, cJSON_CreateString(base));
                continue;
            }
            if (rc)
                break;
            int64_t nb = (x->k + g - 1) / g;
            n_packed++;
            if (gptq_fmt) {
                int32_t *qw = malloc((size_t)(x->k / 8 * x->n) * 4);
                int32_t *qz = malloc((size_t)(nb * x->n / 8) * 4);
                uint16_t *sc = malloc((size_t)(nb * x->n) * 2);
                rc = qw && qz && sc ? dsq_quantizer_pack_gptq(x->q, x->scales, x->zeros,
                                                              x->n, x->k, nb, qw, qz, sc)
                                    : DSQ_ENOMEM;
                int64_t s1[2] = {x->k / 8, x->n}, s2[2] = {nb, x->n / 8}, s3[2] = {nb, x->n},
                        s4[1] = {x->k};
                snprintf(name, sizeof(name), "%s.qweight", base);
                if (!rc) rc = dsq_st_writer_add(wr, name, DSQ_TYPE_I32, 2, s1, qw, (size_t)(s1[0] * s1[1]) * 4);
                snprintf(name, sizeof(name), "%s.qzeros", base);
                if (!rc) rc = dsq_st_writer_add(wr, name, DSQ_TYPE_I32, 2, s2, qz, (size_t)(s2[0] * s2[1]) * 4);
                snprintf(name, sizeof(name), "%s.scales", base);
                if (!rc) rc = dsq_st_writer_add(wr, name, DSQ_TYPE_F16, 2, s3, sc, (size_t)(s3[0] * s3[1]) * 2);
                snprintf(name, sizeof(name), "%s.g_idx", base);
                if (!rc) rc = dsq_st_writer_add(wr, name, DSQ_TYPE_I32, 1, s4, x->g_idx, (size_t)x->k * 4);
                free(qw);
                free(qz);
                free(sc);
            } else {
                int32_t *qw = malloc((size_t)(x->k * x->n / 8) * 4);
                int32_t *qz = malloc((size_t)(nb * x->n / 8) * 4);
                uint16_t *sc = malloc((size_t)(nb * x->n) * 2);
                rc = qw && qz && sc ? dsq_quantizer_pack_awq(x->q, x->scales, x->zeros, x->n,
                                                             x->k, g, qw, qz, sc)
                                    : DSQ_ENOMEM;
                int64_t s1[2] = {x->k, x->n / 8}, s2[2] = {nb, x->n / 8}, s3[2] = {nb, x->n};
                snprintf(name, sizeof(name), "%s.qweight", base);
                if (!rc) rc = dsq_st_writer_add(wr, name, DSQ_TYPE_I32, 2, s1, qw, (size_t)(s1[0] * s1[1]) * 4);
                snprintf(name, sizeof(name), "%s.qzeros", base);
                if (!rc) rc = dsq_st_writer_add(wr, name, DSQ_TYPE_I32, 2, s2, qz, (size_t)(s2[0] * s2[1]) * 4);
                snprintf(name, sizeof(name), "%s.scales", base);
                if (!rc) rc = dsq_st_writer_add(wr, name, DSQ_TYPE_F16, 2, s3, sc, (size_t)(s3[0] * s3[1]) * 2);
                free(qw);
                free(qz);
                free(sc);
            }
        }
    }
    if (rc) {
        cJSON_Delete(skip);
        cJSON_Delete(dyn);
        FAIL(rc, "quantize: building model.safetensors failed (%d)", rc);
    }
    {
        char path[4096];
        snprintf(path, sizeof(path), "%s/model.safetensors", o->out_dir);
        const char *md[] = {"format", "pt", "quantized_by", "dsq-quantize", NULL, NULL};
        rc = dsq_st_writer_save(wr, path, md, err, err_len);
        if (rc) {
            cJSON_Delete(skip);
            cJSON_Delete(dyn);
            goto undo;
        }
    }
    /* config.json */
    cfgj = cJSON_CreateObject();
    bool qwen = c->arch == DSQ_ARCH_QWEN2;
    cJSON *arr = cJSON_AddArrayToObject(cfgj, "architectures");
    cJSON_AddItemToArray(arr, cJSON_CreateString(qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(cfgj, "model_type", qwen ? "qwen2" : "llama");
    cJSON_AddNumberToObject(cfgj, "vocab_size", (double)c->n_vocab);
    cJSON_AddNumberToObject(cfgj, "hidden_size", (double)d);
    cJSON_AddNumberToObject(cfgj, "intermediate_size", (double)ff);
    cJSON_AddNumberToObject(cfgj, "num_hidden_layers", (double)L);
    cJSON_AddNumberToObject(cfgj, "num_attention_heads", (double)c->n_head);
    cJSON_AddNumberToObject(cfgj, "num_key_value_heads", (double)c->n_head_kv);
    cJSON_AddNumberToObject(cfgj, "head_dim", (double)hd);
    cJSON_AddNumberToObject(cfgj, "max_position_embeddings",
                            (double)(c->n_ctx_train > 0 ? c->n_ctx_train : DSQ_MODEL_CTX_DEFAULT));
    cJSON_AddNumberToObject(cfgj, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(cfgj, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(cfgj, "tie_word_embeddings", !dsq_model_file_find(f, "output.weight"));
    if (c->bos_token_id >= 0)
        cJSON_AddNumberToObject(cfgj, "bos_token_id", (double)c->bos_token_id);
    if (c->eos_token_id >= 0)
        cJSON_AddNumberToObject(cfgj, "eos_token_id", (double)c->eos_token_id);
    cJSON_AddStringToObject(cfgj, "torch_dtype", "float16");
    cJSON *qc = cJSON_AddObjectToObject(cfgj, "quantization_config");
    if (gptq_fmt) {
        cJSON_AddStringToObject(qc, "quant_method", "gptq");
        cJSON_AddNumberToObject(qc, "bits", wbit);
        cJSON_AddNumberToObject(qc, "group_size", g);
        cJSON_AddBoolToObject(qc, "desc_act", o->desc_act);
        cJSON_AddBoolToObject(qc, "sym", o->sym);
        cJSON_AddNumberToObject(qc, "damp_percent", o->gptq_damp > 0 ? o->gptq_damp : 0.01);
        cJSON_AddStringToObject(qc, "checkpoint_format", "gptq");
        cJSON_AddItemToObject(qc, "dynamic", dyn);
        dyn = NULL;
    } else {
        cJSON_AddStringToObject(qc, "quant_method", "awq");
        cJSON_AddNumberToObject(qc, "bits", wbit);
        cJSON_AddNumberToObject(qc, "group_size", g);
        cJSON_AddBoolToObject(qc, "zero_point", !o->sym);
        cJSON_AddStringToObject(qc, "version", "gemm");
    }
    cJSON_Delete(dyn);
    cJSON_AddItemToObject(qc, "modules_to_not_convert", skip);
    cJSON_AddStringToObject(qc, "dsq_method", mname);
    rc = write_json(o->out_dir, "config.json", cfgj, err, err_len);
    if (rc)
        goto undo;
    /* tokenizer files */
    {
        char src[8300], dst[8300];
        const char *fmt = dsq_model_file_format(f);
        if (o->tokenizer && is_file(o->tokenizer)) {
            const char *bn = strrchr(o->tokenizer, '/');
            snprintf(dst, sizeof(dst), "%s/%s", o->out_dir, bn ? bn + 1 : o->tokenizer);
            if (copy_file(o->tokenizer, dst))
                FAIL(DSQ_EIO, "quantize: cannot copy %s", o->tokenizer);
        } else {
            const char *dir = o->tokenizer ? o->tokenizer : o->model;
            char dbuf[4096];
            if (!is_dir(dir)) {
                snprintf(dbuf, sizeof(dbuf), "%s", dir);
                char *sl = strrchr(dbuf, '/');
                if (sl)
                    *sl = '\0';
                else
                    snprintf(dbuf, sizeof(dbuf), ".");
                dir = dbuf;
            }
            char tokn[64];
            snprintf(tokn, sizeof(tokn), "tok%lld.bin", (long long)c->n_vocab);
            const bool l2c = strcmp(fmt, "llama2c") == 0;
            const char *names[] = {"tokenizer.json", "tokenizer_config.json",
                                   "special_tokens_map.json", "chat_template.jinja",
                                   "generation_config.json", l2c ? "tokenizer.bin" : NULL,
                                   l2c ? tokn : NULL};
            int n_copied = 0;
            for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
                if (!names[i])
                    continue;
                snprintf(src, sizeof(src), "%s/%s", dir, names[i]);
                snprintf(dst, sizeof(dst), "%s/%s", o->out_dir, names[i]);
                if (!is_file(src))
                    continue;
                if (copy_file(src, dst))
                    FAIL(DSQ_EIO, "quantize: cannot copy %s", src);
                n_copied++;
            }
            /* a GGUF carries its tokenizer; anything else without one in
             * the output needs --tokenizer wherever it is loaded */
            if (n_copied == 0 && strcmp(fmt, "gguf") != 0 && !o->quiet)
                fprintf(stderr, "quantize: warning: no tokenizer file in %s: %s has none "
                        "(give --tokenizer to copy one in)\n", dir, o->out_dir);
        }
    }
    if (!o->quiet)
        printf("quantize: method=%s bits=%d group_size=%d sym=%d recipe=%s layers=%d "
           "packed=%d int8=%d fp16=%d calib_samples=%d sum_out_mse=%.6g elapsed=%.1fs "
           "out=%s\n", mname, wbit, g, o->sym ? 1 : 0,
           o->recipe == DSQ_QRECIPE_DEEPSEEK_MOE ? "deepseek-moe" : "default", L, n_packed,
           n_int8, n_fp16, n_samples, sum_err, dsq_clock_now_s() - t_start, o->out_dir);
    if (o->search && !o->quiet)
        printf("quantize: search chose point %d: bpw=%.3f out_mse=%.6g latency_us=%.2f\n",
               pick, pts[pick].bpw, pts[pick].err, pts[pick].latency_us);
undo:
    free(layer8);
    if (all)
        for (int i = 0; i < L * 7; i++)
            lin_free(&all[i]);
    if (norms)
        for (int i = 0; i < 2 * L; i++)
            free(norms[i]);
    free(all);
    free(norms);
    free(costs);
    free(pts);
    free(order);
    cJSON_Delete(cfgj);
    calib_free(&cal);
    free(ids);
    free(text);
    dsq_st_writer_destroy(wr);
    dsq_kv_destroy(kv);
    dsq_model_destroy(model);
    dsq_model_file_close(f);
    return rc;
}

/* Offline weight quantisation for dsq-quantize: the math, not the I/O.
 *
 *  - calibration size bound (Hoeffding): n = ceil(2 ln(2/delta) / eps^2);
 *  - recipes: which tensor gets which scheme (default, deepseek-moe);
 *  - group quantisation of one fp32 matrix to 4-bit codes + fp16 scales and
 *    integer zero points (RTN), with AWQ's activation-aware scale search
 *    (Lin et al. 2023, arXiv:2306.00978, sec. 3.2) and per-group clip
 *    search stopped by a KL bound, quantile clipping of long-tailed groups,
 *    and GPTQ (Frantar et al. 2022, arXiv:2210.17323, Algorithm 1);
 *  - AutoAWQ GEMM packing (the exact inverse of dsq_quant_from_awq) and
 *    AutoGPTQ v1 packing (inverse of dsq_quant_from_gptq);
 *  - the (bits, error, latency) Pareto front of per-layer {4, 8}-bit
 *    allocation for --search.
 *
 * Matrices are fp32 row-major W[n][k] (n outputs, k inputs, PyTorch's
 * [out, in]); groups of group_size run along k. Activations X are fp32
 * [t][k]. Codes q are uint8 0..15 [n][k]; scales are fp16 bits and zero
 * points uint8 0..15, both [n][k/group_size]. Dequantised w = (q - z) * s.
 * Everything here is single-model, caller-owned memory, thread-compatible.
 */
#ifndef DSQ_QUANTIZER_H
#define DSQ_QUANTIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/io/tensor.h"

/* ---- calibration ---- */

/* Samples needed so that a mean of bounded per-sample quantities is within
 * eps of its expectation with probability >= 1 - delta (Hoeffding, range
 * normalised to 1): n = ceil(2 * ln(2 / delta) / eps^2).
 * Returns n >= 1, or -1 if eps or delta is outside (0, 1). */
int64_t dsq_quantizer_calib_samples(double eps, double delta);

/* ---- recipes ---- */

typedef enum dsq_qrecipe {
    DSQ_QRECIPE_DEFAULT = 0,   /* every transformer linear INT4 group-wise     */
    DSQ_QRECIPE_DEEPSEEK_MOE,  /* routed experts INT4 group asym; attention,
                                  shared experts and dense FFN INT8 per output
                                  channel sym; router, norms, embeddings kept */
} dsq_qrecipe_t;

/* How one tensor is stored. bits 0 = kept in its source precision (fp16). */
typedef struct dsq_qscheme {
    int bits;          /* 0, 4 or 8                                           */
    int group_size;    /* bits 4: 32/64/128 along k; bits 8: 0 = per channel  */
    bool sym;          /* symmetric (no zero point)                           */
} dsq_qscheme_t;

/* "default" / "deepseek-moe" -> *out. Returns 0 or DSQ_EINVAL. */
int dsq_quantizer_recipe_parse(const char *name, dsq_qrecipe_t *out);

/* Scheme for the canonical tensor name (engine/loader/loader.h), e.g.
 * "blk.3.attn_q.weight", "blk.3.ffn_up.17.weight" (routed expert 17),
 * "blk.3.ffn_down_shexp.weight", "blk.3.ffn_gate_inp.weight" (router).
 * Only blk.N.<linear>.weight names are quantised: token_embd, output,
 * norms, biases and the router are {0}. default: {w_bit, group_size, sym}
 * for every linear. deepseek-moe: routed experts {4, group_size, false};
 * attn_* linears, *_shexp and dense (non-expert) ffn_* {8, 0, true}. */
dsq_qscheme_t dsq_quantizer_recipe_select(dsq_qrecipe_t r, const char *name,
                                          int w_bit, int group_size, bool sym);

/* ---- one matrix ---- */

/* Options of the INT4 group quantiser. Zero-initialised = plain RTN. */
typedef struct dsq_qopts {
    int group_size;        /* 32, 64 or 128 along k; when k % group_size != 0
                              the last group is partial (k - (nb-1) g wide),
                              nb = ceil(k / group_size) groups per row      */
    bool sym;              /* absmax, z = 8; else min/max with zero point    */
    /* AWQ-style clip search (needs activations): shrink each group's range
     * by ratios 1, 1 - 1/clip_grid, ... down to clip_min_ratio, keep the
     * ratio with the smallest output error sum_t (x_t . (w - w_q))^2. The
     * search along decreasing ratios stops once the KL divergence between
     * the group's 16-bin weight histogram before and after clipping exceeds
     * clip_kl_bound (nats; <= 0: no bound). */
    bool clip_search;
    int clip_grid;         /* default 20                                     */
    float clip_min_ratio;  /* default 0.5                                    */
    double clip_kl_bound;  /* default 0 (off)                                */
    /* Quantile clipping of long-tailed groups: if a group's absmax exceeds
     * clip_ratio * Q(|w|, clip_quantile), its range is clamped to that
     * value before RTN/clip search. clip_quantile <= 0: off. */
    double clip_quantile;  /* e.g. 0.99                                      */
    double clip_ratio;     /* e.g. 1.5                                       */
    /* Keep every zero point >= 1 (AutoGPTQ v1 stores z - 1 in 4 bits): an
     * asymmetric group that would get z = 0 (all weights >= 0) is
     * re-quantised on [-hi/14, hi]. dsq_quantizer_gptq always does this. */
    bool zero_min1;
} dsq_qopts_t;

/* RTN group quantisation of W [n][k] (optionally with clip search over the
 * activations x [t][k], which may be NULL when !o->clip_search).
 * asym: range [min(w, 0), max(w, 0)] (ratio-shrunk), s = range / 15 rounded
 * to fp16, z = clamp(round(-min / s), 0, 15); sym: s = absmax / 7, z = 8
 * (AWQ checkpoints always carry a zero point). q = clamp(round(w / s) + z,
 * 0, 15). Outputs q [n][k], scales fp16 [n][nb], zeros [n][nb],
 * nb = ceil(k / g) (a partial last group is quantised on its own values).
 * Returns 0 or DSQ_EINVAL (shape, group), DSQ_ENOMEM. */
int dsq_quantizer_quantize(const float *w, int64_t n, int64_t k,
                           const float *x, int64_t t, const dsq_qopts_t *o,
                           uint8_t *q, uint16_t *scales, uint8_t *zeros);

/* w_out [n][k] = (q - z) * s (fp32). */
void dsq_quantizer_dequant(const uint8_t *q, const uint16_t *scales,
                           const uint8_t *zeros, int64_t n, int64_t k,
                           int group_size, float *w_out);

/* KL divergence (nats) between the 16-bin histograms of a group's values
 * before (v) and after clipping to [lo, hi], bins spanning [min v, max v],
 * add-half smoothing. Used by the clip search stop rule. */
double dsq_quantizer_clip_kl(const float *v, int n, float lo, float hi);

/* AWQ per-input-channel scale search for a group of linears sharing the
 * input x [t][k] (q/k/v, gate/up, o, down): for alpha = 0, 1/grid, ..., 1
 *   s_j = x_mean_j^alpha / w_mean_j^(1 - alpha), normalised by
 *   sqrt(max s * min s); x_mean_j = mean |x_tj| (given, from all
 *   calibration tokens), w_mean_j = mean over rows of |w_rj| / max |w_r,group|,
 * quantise W diag(s) by RTN (options o, no clip search) and keep the alpha
 * whose output error sum_i ||x W_i^T - x diag(1/s) Q(W_i diag(s))^T||^2 is
 * smallest. alpha = 0 with w_mean ignored is s = 1 (plain RTN), so the
 * result is never worse than RTN on x. ws[i]: [ns[i]][k]. s_out: [k].
 * *err_out (may be NULL): the best error; *alpha_out likewise.
 * Returns 0, DSQ_EINVAL, DSQ_ENOMEM. */
int dsq_quantizer_awq_scales(const float *const *ws, const int64_t *ns,
                             int n_w, int64_t k, const float *x, int64_t t,
                             const float *x_mean, int grid,
                             const dsq_qopts_t *o, float *s_out,
                             double *err_out, double *alpha_out);

/* Sum over rows of ||x (W - Wq)^T||^2 / t: the output mean squared error
 * of a matrix and its quantised version on x [t][k]. */
double dsq_quantizer_output_error(const float *w, const float *wq, int64_t n,
                                  int64_t k, const float *x, int64_t t);

/* GPTQ (Frantar et al. 2022, Algorithm 1, lazy batch updates of blocksize
 * 128) of W [n][k] given the Hessian h = 2 X^T X / t, fp64 [k][k]
 * dampened by damp * mean(diag) (0.01 in the paper), dead columns zeroed.
 * h is read-only (copied, permuted, dampened internally).
 * Per-group scales/zeros (RTN on the error-compensated columns as each
 * group starts; options o, group along k in processing order). desc_act:
 * process columns in order of decreasing diag(H) (act-order); then perm
 * (out, [k], may be NULL otherwise) gets the processing order and
 * g_idx (out, [k]) the group of each ORIGINAL column. Without desc_act
 * g_idx[j] = j / g. q/scales/zeros as dsq_quantizer_quantize, but groups
 * index processing order: group of column perm[j] is j / g.
 * Returns 0, DSQ_EINVAL, DSQ_ENOMEM, DSQ_ERANGE (H not positive definite
 * after dampening). */
int dsq_quantizer_gptq(const float *w, int64_t n, int64_t k, const double *h,
                       double damp, bool desc_act, const dsq_qopts_t *o,
                       uint8_t *q, uint16_t *scales, uint8_t *zeros,
                       int32_t *g_idx);

/* GPTQ's inverse-Hessian factor, in place: h (SPD, fp64 row-major [k][k],
 * both triangles or just the upper one) becomes the upper-triangular U with
 * h^{-1} = U^T U (lower triangle zeroed). LAPACK: dpotrf ('U', h = R^T R),
 * dpotri (h^{-1} from R), dpotrf again (Frantar et al. 2022, sec. 3.3 / the
 * reference code's torch.linalg.cholesky(H^{-1}, upper=True)).
 * Returns 0, DSQ_EINVAL (NULL, k <= 0 or k > INT32_MAX), DSQ_ERANGE (not
 * positive definite; h is then garbage). */
int dsq_quantizer_hinv_chol(double *h, int64_t k);

/* ---- packing ---- */

/* AutoAWQ GEMM packing, the exact inverse of dsq_quant_from_awq (quant.h):
 *   qweight int32 [k][n/8]: column 8j+i of row r in bits 4*p..4*p+3 of
 *   element (r, j), p = {0,4,1,5,2,6,3,7}[i] (AWQ_ORDER {0,2,4,6,1,3,5,7}
 *   inverted); qzeros int32 [k/g][n/8] likewise; scales fp16 [k/g][n].
 * q [n][k], scales_in / zeros [n][k/g]. Requires n % 8 == 0, k % g == 0
 * (AutoAWQ's WQLinear_GEMM has k / g groups and asserts in_features %
 * group_size == 0, so the AWQ format has no partial groups; write GPTQ,
 * which has ceil(k / g) groups, for such shapes).
 * Returns 0 or DSQ_EINVAL. */
int dsq_quantizer_pack_awq(const uint8_t *q, const uint16_t *scales_in,
                           const uint8_t *zeros, int64_t n, int64_t k,
                           int group_size, int32_t *qweight, int32_t *qzeros,
                           uint16_t *scales);

/* AutoGPTQ v1 packing, inverse of dsq_quant_from_gptq: qweight int32
 * [k/8][n], rows 8j..8j+7 of column c in bits 4i (low first); qzeros int32
 * [groups][n/8] holding z - 1 (z must be >= 1; 0 is stored as 15 wrapped,
 * which dsq_quant_from_gptq reads as 16 — callers keep z >= 1);
 * scales fp16 [groups][n]. q [n][k] indexed by ORIGINAL column; scales /
 * zeros [n][groups]. Requires k % 8 == 0, n % 8 == 0.
 * Returns 0 or DSQ_EINVAL. */
int dsq_quantizer_pack_gptq(const uint8_t *q, const uint16_t *scales_in,
                            const uint8_t *zeros, int64_t n, int64_t k,
                            int64_t n_groups, int32_t *qweight,
                            int32_t *qzeros, uint16_t *scales);

/* AutoGPTQ v1 packing at bits = 8, per output channel (group_size -1), the
 * exact inverse of dsq_quant_from_gptq8 (quant.h) for symmetric INT8:
 * q int8 [n][k] (-128..127, dsq's DSQ_WFMT_INT8 data) is stored unsigned as
 * q + 128 (z = 128); qweight int32 [k/4][n] (rows 4j..4j+3 of column c in
 * bits 0-7, 8-15, 16-23, 24-31), qzeros int32 [1][n/4] all 0x7F7F7F7F (z - 1
 * = 127 per byte), scales fp16 [1][n] copied from scales_in [n]. The caller
 * writes g_idx as k zeros. Dequant (GPTQ): w = (q_u8 - (stored_z + 1)) * s.
 * Returns 0 or DSQ_EINVAL (NULL, n or k not a multiple of 4). */
int dsq_quantizer_pack_gptq8(const int8_t *q, const uint16_t *scales_in, int64_t n,
                             int64_t k, int32_t *qweight, int32_t *qzeros,
                             uint16_t *scales);

/* ---- --search: per-layer bit allocation ---- */

/* One layer's measured output errors and weight count. */
typedef struct dsq_qlayer_cost {
    double err4, err8;     /* summed output MSE at 4 and 8 bits            */
    int64_t n_weights;
} dsq_qlayer_cost_t;

/* One point of the front. bits8: [n_layers] 1 where the layer is 8-bit
 * (caller-owned arrays inside the caller's point array, see below). */
typedef struct dsq_qpoint {
    double bpw;            /* bits per weight incl. fp16 scale/zero overhead */
    double err;            /* sum of the layers' errors                     */
    double latency_us;     /* modelled decode latency per token             */
    int n_8bit;            /* layers at 8 bits (the first n_8bit of order)   */
} dsq_qpoint_t;

/* Latency model: memory-bound decode, latency_us = bytes / (bw_gbs * 1e3)
 * + n_layers * layer_overhead_us; bytes from bpw * n_weights / 8.
 * Bits per weight: INT4 group g: 4 + 32 / g (fp16 scale + zero);
 * INT8 per channel: 8 + 16 / k ~ 8 (k ignored: + 0).
 * The front is the convex (supported) Pareto front: layers are promoted to
 * 8 bits in order of decreasing (err4 - err8) / extra_bits; every prefix
 * minimises err + lambda * latency for some lambda >= 0, so it is Pareto
 * optimal. pts: [n_layers + 1] out (prefix lengths 0..n_layers; a prefix
 * that does not lower the error is dropped, so *n_pts may be smaller);
 * order: [n_layers] out, the promotion order.
 * Returns 0, DSQ_EINVAL. */
int dsq_quantizer_pareto(const dsq_qlayer_cost_t *layers, int n_layers,
                         int group_size, double bw_gbs,
                         double layer_overhead_us, dsq_qpoint_t *pts,
                         int *n_pts, int *order);

/* The point with the lowest error among those with bpw <= max_bpw (the
 * 4-bit-everywhere point if none fits). Returns its index. */
int dsq_quantizer_pareto_pick(const dsq_qpoint_t *pts, int n_pts,
                              double max_bpw);

/* ---- safetensors writer ---- */

typedef struct dsq_st_writer dsq_st_writer_t;

dsq_st_writer_t *dsq_st_writer_create(void);
void dsq_st_writer_destroy(dsq_st_writer_t *w);   /* NULL is a no-op */

/* Add a tensor (data copied). shape in safetensors (PyTorch) order, e.g.
 * [out, in]; type F32, F16, BF16, I32 or I64. Returns 0, DSQ_EINVAL
 * (duplicate name, bad type/shape, n_bytes mismatch), DSQ_ENOMEM. */
int dsq_st_writer_add(dsq_st_writer_t *w, const char *name, dsq_type_t type,
                      int n_dims, const int64_t *shape, const void *data,
                      size_t n_bytes);

/* Write the file (huggingface/safetensors "Format": u64 LE header length,
 * JSON header padded with spaces to a multiple of 8, data in add order).
 * metadata: optional {"format": "pt"}-style string pairs, NULL-terminated
 * key/value array, or NULL. Returns 0, DSQ_EIO (with err), DSQ_ENOMEM. */
int dsq_st_writer_save(const dsq_st_writer_t *w, const char *path,
                       const char *const *metadata, char *err,
                       size_t err_len);

/* ---- the whole pipeline (tools/dsq-quantize) ---- */

/* Options of dsq_quantizer_run; zero = default where noted. */
typedef struct dsq_qrun_opts {
    const char *model;         /* HF dir, .gguf or llama2.c .bin (required)    */
    const char *tokenizer;     /* optional tokenizer override (loader.h)       */
    const char *out_dir;       /* created if missing (required)                */
    const char *method;        /* "rtn", "awq" or "gptq" (NULL: rtn)           */
    /* Checkpoint format: "awq" (AutoAWQ GEMM), "gptq" (AutoGPTQ v1) or
     * NULL/"auto": gptq for --method gptq; for rtn/awq the AWQ format
     * unless some linear that GPTQ can pack (n % 8 == 0, k % 8 == 0) has
     * k % group_size != 0 (a partial last group, which only GPTQ's
     * ceil(k/g) groups hold), then gptq. */
    const char *format;
    int w_bit;                 /* 4 (0: 4)                                      */
    int group_size;            /* 32/64/128 (0: 128)                            */
    bool sym;
    const char *calib;         /* calibration text file (awq, gptq, --search)  */
    int calib_samples;         /* 0: the calibration bound's n                 */
    int calib_seq_len;         /* tokens per sample (0: 512)                   */
    double calib_eps, calib_delta;  /* 0: 0.25 / 0.1                          */
    bool force;                /* accept fewer samples than the bound needs    */
    int calib_rows;            /* activation rows kept per site (0: 512)       */
    dsq_qrecipe_t recipe;
    bool search;               /* per-layer {4, 8} bits Pareto search          */
    double search_max_bpw;     /* budget for the chosen point (0: 5.0)         */
    double bw_gbs;             /* latency model bandwidth (0: 100 GB/s)        */
    int awq_grid;              /* alpha grid (0: 20)                           */
    dsq_qopts_t q;             /* clip options (group_size/sym taken above)    */
    double gptq_damp;          /* 0: 0.01                                      */
    bool desc_act;             /* GPTQ act-order                               */
    bool quiet;                /* no progress lines and no summary             */
} dsq_qrun_opts_t;

/* Quantise o->model into o->out_dir: model.safetensors (AWQ GEMM or GPTQ v1
 * tensors, see o->format, under Hugging Face names; embeddings, norms and
 * linears that the packing cannot hold (n % 8; AWQ k % group, GPTQ k % 8)
 * in fp16), config.json with
 * quantization_config, and the tokenizer files (HF: tokenizer.json,
 * tokenizer_config.json...; llama2.c: its tok*.bin). llama2.c / GGUF llama
 * q/k rows are permuted from adjacent-pair to HF (neox) RoPE order.
 * Activations come from running the calibration text through the fp model
 * (engine/model/model_llama.c tap), all layers at once from fp inputs (not from the
 * already-quantised previous layers). One progress line per layer on
 * stderr, a summary on stdout.
 * Returns 0, DSQ_EINVAL (options incl. --format; too few calibration samples without
 * force), DSQ_ENOTFOUND/DSQ_EFORMAT (model, text), DSQ_EUNSUPPORTED
 * (architecture, packed source), DSQ_EIO, DSQ_ENOMEM; err says why. */
int dsq_quantizer_run(const dsq_qrun_opts_t *o, char *err, size_t err_len);

/* The deepseek2 branch of dsq_quantizer_run (engine/quantizer/quantizer_ds2.c), not
 * an API: f is the open source (a Hugging Face directory, checked), g the
 * 4-bit group. RTN with o->recipe into o->out_dir as one AutoGPTQ v1
 * checkpoint mixing 4-bit group-g and 8-bit per-channel modules, declared
 * with GPTQModel's `dynamic` overrides in config.json. Same returns as
 * dsq_quantizer_run. */
struct dsq_model_file;
/* Quantise the F32/F16/BF16 linear t [n][k] (ne[0] = k) to INT8 per output
 * channel (dsq_quant_int8_channel) and add it to wr as an 8-bit GPTQ v1
 * module base.{qweight,qzeros,scales,g_idx} (dsq_quantizer_pack_gptq8).
 * n, k multiples of 4. Returns 0 or the DSQ_E* of the quantiser / writer,
 * err set. Shared by quantizer_run.c and quantizer_ds2.c, not an API. */
int dsq__qwrite_gptq8(dsq_st_writer_t *wr, const char *base, const dsq_tensor_t *t,
                      char *err, size_t err_len);
int dsq__quantizer_run_ds2(const dsq_qrun_opts_t *o, const struct dsq_model_file *f,
                           int g, char *err, size_t err_len);

#endif

/* The DeepSeek-V2/V3 graph: multi-head latent attention (MLA) and a
 * mixture of experts with shared experts (DeepSeek-V2, arXiv:2405.04434;
 * DeepSeek-V3, arXiv:2412.19437), as implemented by transformers'
 * modeling_deepseek_v2.py / modeling_deepseek_v3.py, the project's
 * reference (tests/golden/deepseek2_tiny_*_logits.txt).
 *
 * Attention. Per token: q from q_proj, or q_a_proj -> RMSNorm -> q_b_proj
 * when q_lora_rank > 0; kv_a_proj_with_mqa gives the latent (kv_lora_rank,
 * RMSNorm'd) and one shared rope key (qk_rope_head_dim), both RoPE'd parts
 * with interleaved pairs and YaRN. Only [latent, k_pe] is cached (one
 * vector of kv_lora_rank + qk_rope_head_dim per token and layer; a KV
 * cache made with dsq_model_kv_shape). Decode rows use the absorbed form:
 * W_UK (the k_nope rows of kv_b_proj) is folded into the query (q_lat_h =
 * W_UK_h^T q_nope_h), attention runs over the cached vectors
 * (dsq_backend_mla_attention) and W_UV (the v rows of kv_b_proj) is applied to
 * each head's attended latent, so the latent is never expanded per head.
 * W_UV_h [dv, kvl] is a row view of kv_b_proj; W_UK_h^T [kvl, dn] is built
 * once at load from kv_b_proj (dequantised, transposed, then RTN INT4 again
 * with --quantize int4). llama.cpp GGUFs that store both split (attn_k_b /
 * attn_v_b, one slice per head) are used in place, with no copy. A
 * sequence with many rows in one step (prefill) may instead expand its
 * context's latents once to per-head k_nope / v with kv_b_proj (not in
 * split GGUFs: those always run absorbed) and run plain attention
 * (dsq_backend_mla_attention_dense), which costs fewer multiply-adds beyond
 * ~170 rows at V2-Lite's shapes (rule at use_expanded;
 * DSQ_MLA_PREFILL=absorbed|expanded forces one). Softmax scale:
 * 1/sqrt(qk_nope + qk_rope) times yarn_mscale(factor, mscale_all_dim)^2
 * under YaRN (DeepSeek's rule; transformers' V2 port ignores rope_scaling,
 * its V3 port applies it as here).
 *
 * MoE. Layers l >= first_k_dense_replace with l % moe_layer_freq == 0 are
 * MoE: the fp32 router (kept in the file's precision, never quantised)
 * scores experts (dsq_backend_moe_route: softmax/sigmoid, greedy /
 * group-limited / noaux_tc, norm_topk_prob, routed_scaling_factor), the
 * (token, expert) pairs are grouped by expert (dsq_backend_moe_group), and each
 * expert with tokens runs once over its gathered rows, so its weights are
 * read once per step. Shared experts are one SwiGLU MLP over every token.
 * Steps of up to batch_rows tokens (decode) hand a layer's small products
 * to the thread pool a few at a time (dsq_backend_matmul_many), not one by
 * one: moe_batched and attend_absorbed_batched.
 *
 * MTP. With dsq_model_opts_t.mtp, DeepSeek-V3's multi-token prediction
 * module (blk.<n_layer>.*: nextn.embed_tokens, nextn.enorm / hnorm,
 * nextn.eh_proj, one MoE decoder layer, nextn.shared_head_norm / _head) is
 * loaded and ds2_mtp_forward runs it as vLLM's deepseek_mtp.py does: x =
 * eh_proj([enorm(E(t_{i+1})); hnorm(norm(h_i))]) with the main model's
 * output norm applied to h_i first (vLLM hands the module the model's
 * normed output) and E zero at position 0 (vLLM masks it), the decoder
 * layer over its own KV (cache layer n_layer), then shared_head_norm and
 * shared_head_head. Reference: tests/golden/deepseek2_tiny_v3_mtp_logits.txt
 * (tests/ref/make_deepseek2_tiny.py mtp_golden).
 *
 * The graph is the deepseek2 row of the architecture table (model_arch.c);
 * it moves activations with host loops between ops, so the row marks it
 * host-only and dsq_model_create refuses a device backend for it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "engine/common/log.h"
#include "model_internal.h"
#include "quant.h"
#include "engine/io/tensor.h"

/* The graph runs on host backends only, whose activations are fp32. */
#define F32 DSQ_FT_F32

typedef struct ds2_layer {
    const float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm;
    dsq_weight_t wq, wq_a, wq_b, wkv_a, wo;
    dsq_weight_t *wuk, *wuv;       /* [n_head]: W_UK_h^T [kvl x dn], W_UV_h [dv x kvl] */
    dsq_weight_t wkv_b;            /* kv_b_proj [H*(dn+dv), kvl], expanded form  */
    bool moe, has_shared;
    dsq_weight_t w_gate, w_up, w_down;          /* dense FFN, or shared experts */
    dsq_weight_t router;                        /* [n_exp, d], file precision   */
    const float *router_bias;                   /* V3 e_score_correction_bias   */
    dsq_weight_t *exp_gate, *exp_up, *exp_down; /* [n_exp]                       */
} ds2_layer_t;

/* Attention form for multi-row (prefill) sequences; DSQ_MLA_PREFILL in the
 * environment at load ("absorbed", "expanded", "auto") overrides auto,
 * so tests can check the two forms against each other. GGUFs in llama.cpp's
 * split attn_k_b/attn_v_b layout hold no kv_b_proj: always absorbed. */
typedef enum ds2_prefill {
    DS2_PREFILL_AUTO = 0,
    DS2_PREFILL_ABSORBED,
    DS2_PREFILL_EXPANDED,
} ds2_prefill_t;

/* DeepSeek-V3's multi-token prediction module; its decoder layer is
 * layers[n_layer]. */
typedef struct ds2_mtp {
    dsq_weight_t embed, eh_proj, head;
    const float *enorm, *hnorm, *head_norm;
} ds2_mtp_t;

typedef struct dsq_ds2 {
    dsq_model_t *m;
    dsq_backend_t *be;       /* the model's; a host backend (the row is host_only) */
    ds2_prefill_t prefill_mode;
    bool split_kv_b;               /* GGUF attn_k_b/attn_v_b: no kv_b, absorbed only */
    dsq_model_config_t c;
    dsq_weight_t tok_embd, output;
    const float *output_norm;
    ds2_layer_t *layers;           /* [n_layer + n_mtp]                      */
    int n_mtp;                     /* 0 or 1                                 */
    ds2_mtp_t mtp;
    int hidden_rows;               /* rows of x the last forward left, or 0  */
    float *mcat;                   /* MTP input [ws_tokens][2 d]             */
    dsq_rope_t rope;
    float attn_scale;
    dsq_moe_route_t route;
    int64_t d, H, dn, dr, dv, kvl, ql, D, n_exp, top_k, mi, ff, ff_sh;

    int ws_tokens;
    int batch_rows;
    float *x, *h, *o, *qa, *q, *ckv, *qpe, *kpe, *qabs, *olat, *att, *tin, *tout,
          *g, *u, *y, *xe, *ye, *rlog, *wts, *roww, *lg;
    /* moe_batched's rows (steps of <= batch_rows tokens): every routed
     * row's input and output [T*top_k][d], gate and up [T*top_k][mi]
     * followed by the shared experts' [T][ff_sh] */
    float *bx, *by, *bg, *bu;
    /* attend_absorbed's per-head rows (<= batch_rows of them): inputs
     * [H][T][max(dn, kvl)], outputs [H][T][max(kvl, dv)] */
    float *hin, *hout;
    int32_t *ids, *rows, *offsets;
} dsq_ds2_t;

/* Steps of at most batch_rows tokens (default DS2_BATCH_ROWS; DSQ_DS2_BATCH
 * in the environment at load, so tests can compare both paths) run a MoE
 * layer's products in three dispatches (moe_batched) and the absorbed
 * form's per-head products in one each way (attend_absorbed_batched);
 * longer steps (prefill) product by product, as each product is large
 * enough there that one barrier apiece costs little and the batched
 * buffers would grow with top_k times the step. */
#define DS2_BATCH_ROWS 64
#define DS2_BATCH_MAX 1024

/* fp32 [n][k] buffer -> weight: a plain F32 view (buf kept by the model) or,
 * with quantize, RTN INT4 (buf freed). Ownership of buf always moves. */
static int make_weight(dsq_model_t *m, float *buf, int64_t n, int64_t k,
                       const dsq_model_opts_t *opts, dsq_weight_t *w, char *err,
                       size_t err_len)
{
    int rc;
    memset(w, 0, sizeof(*w));
    if (opts && opts->quantize && strcmp(opts->quantize, "int4") == 0) {
        dsq_tensor_t t = {"ds2.absorbed", DSQ_TYPE_F32, 2, {k, n, 1, 1}, buf,
                          (size_t)(n * k) * sizeof(float)};
        void *storage = NULL;
        int gs = opts->group_size ? opts->group_size : 32;
        rc = dsq_quant_rtn_int4(&t, gs, false, w, &storage, err, err_len);
        free(buf);
        if (rc == DSQ_OK) {
            dsq_weight_bytes_t b;
            rc = dsq_weight_layout(w, &b);
            if (rc == DSQ_OK)
                rc = dsq__model_keep_weight(m, storage, storage ? b.total : 0);
            else
                free(storage);
        }
        return rc;
    }
    w->format = DSQ_WFMT_F32;
    w->n = n;
    w->k = k;
    w->data = buf;
    return dsq__model_keep_weight(m, buf, (size_t)(n * k) * sizeof(float));
}

static int lin(dsq_ds2_t *g, const dsq_model_file_t *f, const dsq_model_opts_t *o,
               int64_t l, const char *nm, int64_t n, int64_t k, bool quantize,
               dsq_weight_t *w, char *err, size_t err_len)
{
    char base[96];
    snprintf(base, sizeof(base), "blk.%lld.%s", (long long)l, nm);
    return dsq__model_load_linear(g->m, f, o, base, n, k, quantize, w, err, err_len);
}

static int vec(dsq_ds2_t *g, const dsq_model_file_t *f, int64_t l, const char *nm,
               int64_t n, bool required, const float **out, char *err, size_t err_len)
{
    char name[96];
    snprintf(name, sizeof(name), "blk.%lld.%s", (long long)l, nm);
    return dsq__model_load_vec(g->m, f, name, n, required, out, err, err_len);
}

/* W_UK_h^T / W_UV_h as views of the per-head slices of llama.cpp's split
 * GGUF layout (blk.l.attn_k_b.H / attn_v_b.H, split by the loader); nothing
 * is copied unless --quantize int4 repacks them. There is no kv_b_proj, so
 * L->wkv_b stays empty and prefill uses the absorbed form (use_expanded). */
static int load_split(dsq_ds2_t *g, const dsq_model_file_t *f, const dsq_model_opts_t *o,
                      int64_t l, ds2_layer_t *L, char *err, size_t err_len)
{
    char nm[64];
    int rc = DSQ_OK;
    L->wuk = calloc((size_t)g->H, sizeof(*L->wuk));
    L->wuv = calloc((size_t)g->H, sizeof(*L->wuv));
    if (!L->wuk || !L->wuv) {
        snprintf(err, err_len, "model: out of memory");
        return DSQ_ENOMEM;
    }
    for (int64_t hh = 0; hh < g->H && !rc; hh++) {
        snprintf(nm, sizeof(nm), "attn_k_b.%lld", (long long)hh);
        rc = lin(g, f, o, l, nm, g->kvl, g->dn, true, &L->wuk[hh], err, err_len);
        snprintf(nm, sizeof(nm), "attn_v_b.%lld", (long long)hh);
        if (!rc) rc = lin(g, f, o, l, nm, g->dv, g->kvl, true, &L->wuv[hh], err, err_len);
    }
    return rc;
}

/* Rows [r0, r0 + n) of w as a weight of its own (same storage, no copy):
 * every format keeps whole rows contiguous (kernels.h), so the view starts
 * r0 rows into data, scales and zeros. */
static dsq_weight_t row_view(const dsq_weight_t *w, int64_t r0, int64_t n)
{
    dsq_weight_t v;
    if (dsq_weight_rows(w, r0, n, &v) != DSQ_OK)
        memset(&v, 0, sizeof(v));       /* callers' shapes are the model's own */
    return v;
}

/* Per-head absorbed weights from kv_b_proj [H*(dn+dv), kvl] (HF checkpoints
 * and GGUFs from converters before the k_b/v_b split). kv_b_proj is loaded
 * once (L->wkv_b, INT4 with --quantize int4); it serves the expanded prefill
 * form, and its v rows serve as W_UV_h [dv, kvl] in place (row views: the
 * grouping is along kvl either way, so INT4 is the same as quantising each
 * head's block alone). W_UK_h^T [kvl, dn] is a transpose and must be built:
 * from the file's own precision (a temporary view, not kept) when it has a
 * plain .weight, else from L->wkv_b (AWQ/GPTQ), kept as F32, or RTN INT4
 * with --quantize int4. These copies are the "mla_absorbed" bytes
 * engine/serve/planner.c adds to the prediction: n_layer x n_head x kvl x dn
 * weights. */
static int load_absorbed(dsq_ds2_t *g, const dsq_model_file_t *f,
                         const dsq_model_opts_t *opts, int64_t l, ds2_layer_t *L,
                         char *err, size_t err_len)
{
    const int64_t H = g->H, dn = g->dn, dv = g->dv, kvl = g->kvl;
    char base[96], name[112];
    dsq_weight_t tmp;
    const dsq_weight_t *src = &L->wkv_b;
    void *tmp_storage = NULL;
    int rc;
    float *row = NULL;
    snprintf(base, sizeof(base), "blk.%lld.attn_kv_b", (long long)l);
    rc = dsq__model_load_linear_rows(g->m, f, opts, base, H * (dn + dv), kvl, true,
                                     &L->wkv_b, err, err_len);
    if (rc)
        return rc;
    snprintf(name, sizeof(name), "%s.weight", base);
    const dsq_tensor_t *t = dsq_model_file_find(f, name);
    if (t && L->wkv_b.format == DSQ_WFMT_INT4 && dsq__rtn_source(t->type)) {
        rc = dsq_quant_from_gguf(t, &tmp, &tmp_storage, err, err_len);
        if (rc)
            return rc;
        src = &tmp;
    }
    L->wuk = calloc((size_t)H, sizeof(*L->wuk));
    L->wuv = calloc((size_t)H, sizeof(*L->wuv));
    row = malloc((size_t)kvl * sizeof(*row));
    if (!L->wuk || !L->wuv || !row) {
        rc = DSQ_ENOMEM;
        goto undo;
    }
    for (int64_t hh = 0; hh < H && rc == DSQ_OK; hh++) {
        float *uk = malloc((size_t)(kvl * dn) * sizeof(*uk));
        if (!uk) {
            rc = DSQ_ENOMEM;
            break;
        }
        for (int64_t c = 0; c < dn && rc == DSQ_OK; c++) {   /* W_UK_h^T: [kvl][dn] */
            rc = dsq_weight_dequant_row(src, hh * (dn + dv) + c, row);
            for (int64_t r = 0; r < kvl && rc == DSQ_OK; r++)
                uk[r * dn + c] = row[r];
        }
        if (rc) {
            free(uk);
            snprintf(err, err_len, "model: %s: cannot dequantise", base);
            break;
        }
        rc = make_weight(g->m, uk, kvl, dn, opts, &L->wuk[hh], err, err_len);
        L->wuv[hh] = row_view(&L->wkv_b, hh * (dn + dv) + dn, dv);
    }
undo:
    free(row);
    free(tmp_storage);
    if (rc == DSQ_ENOMEM)
        snprintf(err, err_len, "model: out of memory building %s absorbed weights", base);
    return rc;
}

static int load_layer(dsq_ds2_t *g, const dsq_model_file_t *f,
                      const dsq_model_opts_t *o, int64_t l, char *err, size_t err_len)
{
    ds2_layer_t *L = &g->layers[l];
    const dsq_model_config_t *c = &g->c;
    const int64_t d = g->d, qd = g->H * (g->dn + g->dr);
    int rc = vec(g, f, l, "attn_norm.weight", d, true, &L->attn_norm, err, err_len);
    if (!rc) rc = vec(g, f, l, "ffn_norm.weight", d, true, &L->ffn_norm, err, err_len);
    if (g->ql > 0) {
        if (!rc) rc = lin(g, f, o, l, "attn_q_a", g->ql, d, true, &L->wq_a, err, err_len);
        if (!rc) rc = vec(g, f, l, "attn_q_a_norm.weight", g->ql, true, &L->q_a_norm,
                          err, err_len);
        if (!rc) rc = lin(g, f, o, l, "attn_q_b", qd, g->ql, true, &L->wq_b, err, err_len);
    } else if (!rc) {
        rc = lin(g, f, o, l, "attn_q", qd, d, true, &L->wq, err, err_len);
    }
    if (!rc) rc = lin(g, f, o, l, "attn_kv_a_mqa", g->D, d, true, &L->wkv_a, err, err_len);
    if (!rc) rc = vec(g, f, l, "attn_kv_a_norm.weight", g->kvl, true, &L->kv_a_norm,
                      err, err_len);
    if (!rc) rc = g->split_kv_b ? load_split(g, f, o, l, L, err, err_len)
                                : load_absorbed(g, f, o, l, L, err, err_len);
    if (!rc) rc = lin(g, f, o, l, "attn_output", d, g->H * g->dv, true, &L->wo, err, err_len);
    if (rc)
        return rc;
    L->moe = g->n_exp > 0 && l >= c->first_k_dense_replace &&
             l % (c->moe_layer_freq > 0 ? c->moe_layer_freq : 1) == 0;
    if (!L->moe) {
        rc = lin(g, f, o, l, "ffn_gate", g->ff, d, true, &L->w_gate, err, err_len);
        if (!rc) rc = lin(g, f, o, l, "ffn_up", g->ff, d, true, &L->w_up, err, err_len);
        if (!rc) rc = lin(g, f, o, l, "ffn_down", d, g->ff, true, &L->w_down, err, err_len);
        return rc;
    }
    rc = lin(g, f, o, l, "ffn_gate_inp", g->n_exp, d, false, &L->router, err, err_len);
    if (!rc) rc = vec(g, f, l, "exp_probs_b.bias", g->n_exp, false, &L->router_bias,
                      err, err_len);
    L->has_shared = g->ff_sh > 0;
    if (!rc && L->has_shared) {
        rc = lin(g, f, o, l, "ffn_gate_shexp", g->ff_sh, d, true, &L->w_gate, err, err_len);
        if (!rc) rc = lin(g, f, o, l, "ffn_up_shexp", g->ff_sh, d, true, &L->w_up, err,
                          err_len);
        if (!rc) rc = lin(g, f, o, l, "ffn_down_shexp", d, g->ff_sh, true, &L->w_down,
                          err, err_len);
    }
    if (rc)
        return rc;
    L->exp_gate = calloc((size_t)g->n_exp, sizeof(*L->exp_gate));
    L->exp_up = calloc((size_t)g->n_exp, sizeof(*L->exp_up));
    L->exp_down = calloc((size_t)g->n_exp, sizeof(*L->exp_down));
    if (!L->exp_gate || !L->exp_up || !L->exp_down) {
        snprintf(err, err_len, "model: out of memory");
        return DSQ_ENOMEM;
    }
    char nm[64];
    for (int64_t e = 0; e < g->n_exp && !rc; e++) {
        snprintf(nm, sizeof(nm), "ffn_gate.%lld", (long long)e);
        rc = lin(g, f, o, l, nm, g->mi, d, true, &L->exp_gate[e], err, err_len);
        snprintf(nm, sizeof(nm), "ffn_up.%lld", (long long)e);
        if (!rc) rc = lin(g, f, o, l, nm, g->mi, d, true, &L->exp_up[e], err, err_len);
        snprintf(nm, sizeof(nm), "ffn_down.%lld", (long long)e);
        if (!rc) rc = lin(g, f, o, l, nm, d, g->mi, true, &L->exp_down[e], err, err_len);
    }
    return rc;
}

/* The MTP module's own weights (its decoder layer is load_layer's): the
 * embedding and head as the main ones (never requantised), eh_proj as any
 * linear weight. */
static int load_mtp(dsq_ds2_t *g, const dsq_model_file_t *f, const dsq_model_opts_t *o,
                    char *err, size_t err_len)
{
    const int64_t l = g->c.n_layer, d = g->d, V = g->c.n_vocab;
    ds2_mtp_t *t = &g->mtp;
    int rc = lin(g, f, o, l, "nextn.embed_tokens", V, d, false, &t->embed, err, err_len);
    if (!rc) rc = lin(g, f, o, l, "nextn.eh_proj", d, 2 * d, true, &t->eh_proj, err, err_len);
    if (!rc) rc = lin(g, f, o, l, "nextn.shared_head_head", V, d, false, &t->head, err,
                      err_len);
    if (!rc) rc = vec(g, f, l, "nextn.enorm.weight", d, true, &t->enorm, err, err_len);
    if (!rc) rc = vec(g, f, l, "nextn.hnorm.weight", d, true, &t->hnorm, err, err_len);
    if (!rc) rc = vec(g, f, l, "nextn.shared_head_norm.weight", d, true, &t->head_norm, err,
                      err_len);
    return rc;
}

static int setup_route(dsq_ds2_t *g, char *err, size_t err_len)
{
    const dsq_model_config_t *c = &g->c;
    dsq_moe_route_t *r = &g->route;
    memset(r, 0, sizeof(*r));
    r->n_experts = (int)g->n_exp;
    r->top_k = (int)g->top_k;
    r->n_group = c->n_group > 0 ? (int)c->n_group : 1;
    r->topk_group = c->topk_group > 0 ? (int)c->topk_group : 1;
    r->norm_topk_prob = c->norm_topk_prob;
    r->routed_scaling_factor = (float)c->routed_scaling_factor;
    if (strcmp(c->topk_method, "greedy") == 0 || c->topk_method[0] == '\0') {
        r->method = DSQ_MOE_TOPK_GREEDY;
    } else if (strcmp(c->topk_method, "group_limited_greedy") == 0) {
        r->method = DSQ_MOE_TOPK_GROUP_LIMITED;
    } else if (strcmp(c->topk_method, "noaux_tc") == 0) {
        r->method = DSQ_MOE_TOPK_NOAUX_TC;
    } else {
        snprintf(err, err_len, "model: topk_method '%s' not supported (greedy, "
                 "group_limited_greedy, noaux_tc)", c->topk_method);
        return DSQ_EUNSUPPORTED;
    }
    if (strcmp(c->scoring_func, "sigmoid") == 0) {
        r->scoring = DSQ_MOE_SCORE_SIGMOID;
    } else if (strcmp(c->scoring_func, "softmax") == 0 || c->scoring_func[0] == '\0') {
        r->scoring = DSQ_MOE_SCORE_SOFTMAX;
    } else {
        snprintf(err, err_len, "model: scoring_func '%s' not supported (softmax, sigmoid)",
                 c->scoring_func);
        return DSQ_EUNSUPPORTED;
    }
    if (g->n_exp > 0 && (g->top_k < 1 || g->top_k > g->n_exp || g->n_exp > 4096 ||
                         g->n_exp % r->n_group != 0 || r->topk_group > r->n_group ||
                         g->mi <= 0)) {
        snprintf(err, err_len, "model: inconsistent MoE config (n_routed_experts=%lld "
                 "num_experts_per_tok=%lld n_group=%d topk_group=%d "
                 "moe_intermediate_size=%lld)", (long long)g->n_exp,
                 (long long)g->top_k, r->n_group, r->topk_group, (long long)g->mi);
        return DSQ_EFORMAT;
    }
    return DSQ_OK;
}

static void ds2_destroy(void *graph);

/* dsq_model_arch_t.create: m has its config and a host backend. */
static void *ds2_create(dsq_model_t *m, const dsq_model_file_t *f,
                        const dsq_model_opts_t *opts, char *err, size_t err_len)
{
    const dsq_model_config_t *c = dsq_model_file_config(f);
    dsq_ds2_t *g = calloc(1, sizeof(*g));
    int rc = DSQ_OK;
    if (!g) {
        snprintf(err, err_len, "model: out of memory");
        return NULL;
    }
    g->m = m;
    g->be = dsq__model_backend(m);
    g->c = *c;
    g->batch_rows = DS2_BATCH_ROWS;
    const char *br = getenv("DSQ_DS2_BATCH");
    if (br) {
        /* its buffers grow with top_k times the bound: keep it modest */
        char *end;
        long v = strtol(br, &end, 10);
        if (end == br || *end != '\0' || v < 0 || v > DS2_BATCH_MAX)
            dsq_log(DSQ_LOG_WARN, "model ds2_batch=%d reason=\"DSQ_DS2_BATCH=%s is not a whole "
                    "number from 0 to %d; default kept\"", DS2_BATCH_ROWS, br, DS2_BATCH_MAX);
        else
            g->batch_rows = (int)v;
    }
    const char *pm = getenv("DSQ_MLA_PREFILL");
    g->prefill_mode = !pm ? DS2_PREFILL_AUTO :
                      strcmp(pm, "absorbed") == 0 ? DS2_PREFILL_ABSORBED :
                      strcmp(pm, "expanded") == 0 ? DS2_PREFILL_EXPANDED : DS2_PREFILL_AUTO;
    /* llama.cpp's newer GGUF layout: kv_b_proj split into attn_k_b/attn_v_b */
    g->split_kv_b = !dsq_model_file_find(f, "blk.0.attn_kv_b.weight") &&
                    !dsq_model_file_find(f, "blk.0.attn_kv_b.qweight") &&
                    dsq_model_file_find(f, "blk.0.attn_k_b.0.weight") != NULL;
    if (g->split_kv_b && g->prefill_mode == DS2_PREFILL_EXPANDED)
        dsq_log(DSQ_LOG_WARN, "model mla_prefill=absorbed reason=\"no attn_kv_b in this GGUF "
                "(split attn_k_b/attn_v_b layout); DSQ_MLA_PREFILL=expanded ignored\"");
    g->d = c->n_embd;
    g->H = c->n_head;
    g->dn = c->qk_nope_head_dim;
    g->dr = c->qk_rope_head_dim;
    g->dv = c->v_head_dim;
    g->kvl = c->kv_lora_rank;
    g->ql = c->q_lora_rank;
    g->D = g->kvl + g->dr;
    g->n_exp = c->n_routed_experts;
    g->top_k = c->n_experts_per_tok;
    g->mi = c->moe_intermediate_size;
    g->ff = c->n_ff;
    g->ff_sh = c->moe_intermediate_size * c->n_shared_experts;
    if (g->d <= 0 || c->n_layer <= 0 || g->H <= 0 || g->dn < 0 || g->dr <= 0 ||
        g->dr % 2 || g->dv <= 0 || g->kvl <= 0 || g->ql < 0 || c->n_vocab <= 0 ||
        (c->first_k_dense_replace > 0 && g->ff <= 0)) {
        snprintf(err, err_len, "model: inconsistent deepseek2 shape (n_embd=%lld "
                 "n_head=%lld qk_nope=%lld qk_rope=%lld v_head=%lld kv_lora_rank=%lld "
                 "q_lora_rank=%lld n_ff=%lld)", (long long)g->d, (long long)g->H,
                 (long long)g->dn, (long long)g->dr, (long long)g->dv,
                 (long long)g->kvl, (long long)g->ql, (long long)g->ff);
        rc = DSQ_EFORMAT;
        goto fail;
    }
    rc = setup_route(g, err, err_len);
    if (rc)
        goto fail;
    rc = dsq_rope_init(&g->rope, (int)g->dr, c->rope_neox, c->rope_theta,
                       (int)c->rope_scaling, c->rope_factor, (int)c->rope_orig_ctx,
                       c->yarn_beta_fast, c->yarn_beta_slow, c->yarn_mscale,
                       c->yarn_mscale_all_dim);
    if (rc) {
        snprintf(err, err_len, "model: rope scaling %d (factor %g) not supported for "
                 "deepseek2", (int)c->rope_scaling, c->rope_factor);
        goto fail;
    }
    g->attn_scale = (float)(1.0 / sqrt((double)(g->dn + g->dr)));
    if (c->rope_scaling == DSQ_ROPE_SCALING_YARN && c->yarn_mscale_all_dim > 0) {
        double ms = dsq_rope_yarn_mscale(c->rope_factor, c->yarn_mscale_all_dim);
        g->attn_scale = (float)(1.0 / sqrt((double)(g->dn + g->dr)) * ms * ms);
    }
    /* the MTP module only when asked and the checkpoint has it */
    if (opts && opts->mtp && c->n_nextn_layers > 0) {
        char nm[96];
        snprintf(nm, sizeof(nm), "blk.%lld.nextn.eh_proj.weight", (long long)c->n_layer);
        if (dsq_model_file_find(f, nm))
            g->n_mtp = 1;
        else
            dsq_log(DSQ_LOG_WARN, "model mtp=0 reason=\"num_nextn_predict_layers is %lld but "
                    "the file has no %s\"", (long long)c->n_nextn_layers, nm);
    }
    g->layers = calloc((size_t)(c->n_layer + g->n_mtp), sizeof(*g->layers));
    if (!g->layers) {
        rc = DSQ_ENOMEM;
        snprintf(err, err_len, "model: out of memory");
        goto fail;
    }
    rc = dsq__model_load_linear(m, f, opts, "token_embd", c->n_vocab, g->d, false,
                                &g->tok_embd, err, err_len);
    if (!rc) {
        if (dsq_model_file_find(f, "output.weight") ||
            dsq_model_file_find(f, "output.qweight"))
            rc = dsq__model_load_linear(m, f, opts, "output", c->n_vocab, g->d, false,
                                        &g->output, err, err_len);
        else
            g->output = g->tok_embd;
    }
    if (!rc)
        rc = dsq__model_load_vec(m, f, "output_norm.weight", g->d, true, &g->output_norm,
                                 err, err_len);
    for (int64_t l = 0; l < c->n_layer + g->n_mtp && !rc; l++)
        rc = load_layer(g, f, opts, l, err, err_len);
    if (!rc && g->n_mtp)
        rc = load_mtp(g, f, opts, err, err_len);
    if (rc)
        goto fail;
    return g;
fail:
    if (rc == DSQ_ENOMEM)
        snprintf(err, err_len, "model: out of memory while loading deepseek2 weights");
    ds2_destroy(g);
    return NULL;
}

static void ds2_destroy(void *graph)
{
    dsq_ds2_t *g = graph;
    if (!g)
        return;
    for (int64_t l = 0; g->layers && l < g->c.n_layer + g->n_mtp; l++) {
        ds2_layer_t *L = &g->layers[l];
        free(L->wuk);
        free(L->wuv);
        free(L->exp_gate);
        free(L->exp_up);
        free(L->exp_down);
    }
    free(g->layers);
    float *ws[] = {g->x, g->h, g->o, g->qa, g->q, g->ckv, g->qpe, g->kpe, g->qabs,
                   g->olat, g->att, g->tin, g->tout, g->g, g->u, g->y, g->xe, g->ye,
                   g->rlog, g->wts, g->roww, g->lg, g->bx, g->by, g->bg, g->bu,
                   g->hin, g->hout};
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
        free(ws[i]);
    free(g->ids);
    free(g->rows);
    free(g->offsets);
    free(g->mcat);
    free(g);
}

static size_t max3(size_t a, size_t b, size_t c)
{
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

static int ensure_ws(dsq_ds2_t *g, int n_tokens)
{
    if (n_tokens <= g->ws_tokens)
        return DSQ_OK;
    const size_t t = (size_t)n_tokens, d = (size_t)g->d, H = (size_t)g->H;
    const size_t kk = (size_t)(g->top_k > 0 ? g->top_k : 1);
    const size_t ffm = max3((size_t)g->ff, (size_t)g->ff_sh, (size_t)g->mi);
    /* at least one row: realloc(p, 0) may return NULL */
    const size_t tb = max3(1, t < (size_t)g->batch_rows ? t : (size_t)g->batch_rows, 0);
    struct { float **p; size_t n; } bufs[] = {
        {&g->x, t * d}, {&g->h, t * d}, {&g->o, t * d},
        {&g->qa, t * (size_t)(g->ql > 0 ? g->ql : 1)},
        {&g->q, t * H * (size_t)(g->dn + g->dr)}, {&g->ckv, t * (size_t)g->D},
        {&g->qpe, t * H * (size_t)g->dr}, {&g->kpe, t * (size_t)g->dr},
        {&g->qabs, t * H * (size_t)g->D}, {&g->olat, t * H * (size_t)g->kvl},
        {&g->att, t * H * (size_t)g->dv},
        {&g->tin, t * max3((size_t)g->dn, (size_t)g->kvl, 1)},
        {&g->tout, t * max3((size_t)g->kvl, (size_t)g->dv, 1)},
        {&g->g, t * ffm}, {&g->u, t * ffm}, {&g->y, t * d}, {&g->xe, t * d},
        {&g->ye, t * d}, {&g->rlog, t * (size_t)(g->n_exp > 0 ? g->n_exp : 1)},
        {&g->wts, t * kk}, {&g->roww, t * kk}, {&g->lg, t * d},
        {&g->bx, tb * kk * d}, {&g->by, tb * kk * d},
        {&g->bg, tb * (kk * (size_t)g->mi + (size_t)g->ff_sh)},
        {&g->bu, tb * (kk * (size_t)g->mi + (size_t)g->ff_sh)},
        {&g->hin, tb * H * max3((size_t)g->dn, (size_t)g->kvl, 1)},
        {&g->hout, tb * H * max3((size_t)g->kvl, (size_t)g->dv, 1)},
        {&g->mcat, g->n_mtp ? t * 2 * d : 1},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        float *p = realloc(*bufs[i].p, bufs[i].n * sizeof(float));
        if (!p)
            return DSQ_ENOMEM;
        *bufs[i].p = p;
    }
    int32_t *ids = realloc(g->ids, t * kk * sizeof(*ids));
    if (!ids)
        return DSQ_ENOMEM;
    g->ids = ids;
    int32_t *rows = realloc(g->rows, t * kk * sizeof(*rows));
    if (!rows)
        return DSQ_ENOMEM;
    g->rows = rows;
    if (!g->offsets) {
        g->offsets = malloc((size_t)(g->n_exp + 1) * sizeof(*g->offsets));
        if (!g->offsets)
            return DSQ_ENOMEM;
    }
    g->ws_tokens = n_tokens;
    return DSQ_OK;
}

/* out[T][d] = SwiGLU MLP of in[T][d] (gate/up/down). */
static int mlp(dsq_ds2_t *g, float *out, const float *in, int64_t T,
               const dsq_weight_t *wg, const dsq_weight_t *wu, const dsq_weight_t *wd)
{
    int rc = dsq_backend_matmul(g->be, g->g, F32, in, F32, T, wg);
    if (!rc) rc = dsq_backend_matmul(g->be, g->u, F32, in, F32, T, wu);
    if (!rc) rc = dsq_backend_swiglu(g->be, g->g, g->g, g->u, F32, T, wg->n);
    if (!rc) rc = dsq_backend_matmul(g->be, out, F32, g->g, F32, T, wd);
    return rc;
}

/* H products of [m][k] rows into [H][m][n] in one matmul_many call:
 * head h's input at in + h * m * k, output at out + h * m * n. */
static int per_head(dsq_ds2_t *g, float *out, const float *in, int64_t m, int64_t k, int64_t n,
                    const dsq_weight_t *w)
{
    const int64_t H = g->H;
    float **y = malloc((size_t)H * sizeof(*y));
    const float **x = malloc((size_t)H * sizeof(*x));
    int64_t *mm = malloc((size_t)H * sizeof(*mm));
    const dsq_weight_t **ww = malloc((size_t)H * sizeof(*ww));
    int rc = y && x && mm && ww ? DSQ_OK : DSQ_ENOMEM;
    for (int64_t h = 0; h < H && !rc; h++) {
        y[h] = out + h * m * n;
        x[h] = in + h * m * k;
        mm[h] = m;
        ww[h] = &w[h];
    }
    if (!rc) rc = dsq_backend_matmul_many(g->be, (int)H, y, x, mm, ww);
    free(y);
    free(x);
    free(mm);
    free(ww);
    return rc;
}

/* attend_absorbed for nA <= batch_rows rows: each head's W_UK and W_UV
 * products are small (512 x 128 at V2-Lite's shapes, under the size worth a
 * dispatch), so the H of them run as one dispatch each way instead of 2H
 * on the calling thread. Same products, same bits. */
static int attend_absorbed_batched(dsq_ds2_t *g, const ds2_layer_t *L,
                                   const dsq_kv_layer_t *kl, const dsq_batch_t *b,
                                   const int32_t *A, int64_t nA, const int32_t *rs_c,
                                   const int32_t *pos_c)
{
    const int64_t H = g->H, dn = g->dn, dr = g->dr, dv = g->dv, kvl = g->kvl, D = g->D,
                  qw = dn + dr;
    int rc = DSQ_OK;
    for (int64_t hh = 0; hh < H; hh++)
        for (int64_t j = 0; j < nA; j++)
            memcpy(g->hin + (hh * nA + j) * dn, g->q + (A[j] * H + hh) * qw,
                   (size_t)dn * sizeof(float));
    if (dn > 0)
        rc = per_head(g, g->hout, g->hin, nA, dn, kvl, L->wuk);
    else
        memset(g->hout, 0, (size_t)(H * nA * kvl) * sizeof(float));
    for (int64_t hh = 0; hh < H && !rc; hh++) {
        for (int64_t j = 0; j < nA; j++) {
            float *qa = g->qabs + (j * H + hh) * D;
            memcpy(qa, g->hout + (hh * nA + j) * kvl, (size_t)kvl * sizeof(float));
            memcpy(qa + kvl, g->q + (A[j] * H + hh) * qw + dn, (size_t)dr * sizeof(float));
        }
    }
    if (!rc) rc = dsq_backend_mla_attention(g->be, g->olat, g->qabs, nA, (int)H, (int)kvl, kl,
                                        rs_c, pos_c, b->block_tables, b->max_blocks,
                                        g->attn_scale);
    for (int64_t hh = 0; hh < H && !rc; hh++)
        for (int64_t j = 0; j < nA; j++)
            memcpy(g->hin + (hh * nA + j) * kvl, g->olat + (j * H + hh) * kvl,
                   (size_t)kvl * sizeof(float));
    if (!rc) rc = per_head(g, g->hout, g->hin, nA, kvl, dv, L->wuv);
    for (int64_t hh = 0; hh < H && !rc; hh++)
        for (int64_t j = 0; j < nA; j++)
            memcpy(g->att + (A[j] * H + hh) * dv, g->hout + (hh * nA + j) * dv,
                   (size_t)dv * sizeof(float));
    return rc;
}

/* Absorbed form for the nA rows listed in A (W_UK into the query, attention
 * over the cached vectors, W_UV after). g->q holds RoPE'd q_pe. */
static int attend_absorbed(dsq_ds2_t *g, const ds2_layer_t *L, const dsq_kv_layer_t *kl,
                           const dsq_batch_t *b, const int32_t *A, int64_t nA,
                           int32_t *rs_c, int32_t *pos_c)
{
    const int64_t H = g->H, dn = g->dn, dr = g->dr, dv = g->dv, kvl = g->kvl, D = g->D,
                  qw = dn + dr;
    int rc = DSQ_OK;
    for (int64_t j = 0; j < nA; j++) {
        rs_c[j] = b->row_seq[A[j]];
        pos_c[j] = b->pos[A[j]];
    }
    if (nA <= g->batch_rows)
        return attend_absorbed_batched(g, L, kl, b, A, nA, rs_c, pos_c);
    for (int64_t hh = 0; hh < H && !rc; hh++) {
        for (int64_t j = 0; j < nA; j++)
            memcpy(g->tin + j * dn, g->q + (A[j] * H + hh) * qw, (size_t)dn * sizeof(float));
        if (dn > 0)
            rc = dsq_backend_matmul(g->be, g->tout, F32, g->tin, F32, nA, &L->wuk[hh]);
        else
            memset(g->tout, 0, (size_t)(nA * kvl) * sizeof(float));
        for (int64_t j = 0; j < nA && !rc; j++) {
            float *qa = g->qabs + (j * H + hh) * D;
            memcpy(qa, g->tout + j * kvl, (size_t)kvl * sizeof(float));
            memcpy(qa + kvl, g->q + (A[j] * H + hh) * qw + dn, (size_t)dr * sizeof(float));
        }
    }
    if (!rc) rc = dsq_backend_mla_attention(g->be, g->olat, g->qabs, nA, (int)H, (int)kvl, kl, rs_c,
                                        pos_c, b->block_tables, b->max_blocks,
                                        g->attn_scale);
    for (int64_t hh = 0; hh < H && !rc; hh++) {
        for (int64_t j = 0; j < nA; j++)
            memcpy(g->tin + j * kvl, g->olat + (j * H + hh) * kvl,
                   (size_t)kvl * sizeof(float));
        rc = dsq_backend_matmul(g->be, g->tout, F32, g->tin, F32, nA, &L->wuv[hh]);
        for (int64_t j = 0; j < nA && !rc; j++)
            memcpy(g->att + (A[j] * H + hh) * dv, g->tout + j * dv, (size_t)dv * sizeof(float));
    }
    return rc;
}

/* Expanded form for the n rows listed in E, all of sequence seq, whose
 * largest position is max_pos: the context's cached latents are expanded
 * to per-head k_nope and v with kv_b_proj once, then plain attention. */
static int attend_expanded(dsq_ds2_t *g, const ds2_layer_t *L, const dsq_kv_layer_t *kl,
                           const dsq_batch_t *b, int32_t seq, const int32_t *E, int64_t n,
                           int32_t max_pos)
{
    const int64_t H = g->H, dn = g->dn, dr = g->dr, dv = g->dv, kvl = g->kvl, D = g->D,
                  qw = dn + dr, ctx = (int64_t)max_pos + 1, bs = kl->block_size;
    int rc = DSQ_OK;
    if (ctx > (int64_t)b->max_blocks * bs)
        return DSQ_ERANGE;
    int32_t *slot = malloc((size_t)ctx * sizeof(*slot));
    int32_t *pos = malloc((size_t)n * sizeof(*pos));
    float *lat = malloc((size_t)(ctx * D) * sizeof(*lat));
    float *latc = malloc((size_t)(ctx * kvl) * sizeof(*latc));
    float *kpe = malloc((size_t)(ctx * dr) * sizeof(*kpe));
    float *kvx = malloc((size_t)(ctx * H * (dn + dv)) * sizeof(*kvx));
    float *qc = malloc((size_t)(n * H * qw) * sizeof(*qc));
    float *oc = malloc((size_t)(n * H * dv) * sizeof(*oc));
    if (!slot || !pos || !lat || !latc || !kpe || !kvx || !qc || !oc) {
        rc = DSQ_ENOMEM;
        goto undo;
    }
    const int32_t *bt = b->block_tables + (int64_t)seq * b->max_blocks;
    for (int64_t t = 0; t < ctx; t++)
        slot[t] = (int32_t)(bt[t / bs] * bs + t % bs);
    rc = dsq_backend_mla_kv_read(g->be, kl, slot, ctx, lat);
    if (rc)
        goto undo;
    for (int64_t t = 0; t < ctx; t++) {
        memcpy(latc + t * kvl, lat + t * D, (size_t)kvl * sizeof(float));
        memcpy(kpe + t * dr, lat + t * D + kvl, (size_t)dr * sizeof(float));
    }
    rc = dsq_backend_matmul(g->be, kvx, F32, latc, F32, ctx, &L->wkv_b);
    if (rc)
        goto undo;
    for (int64_t j = 0; j < n; j++) {
        pos[j] = b->pos[E[j]];
        memcpy(qc + j * H * qw, g->q + E[j] * H * qw, (size_t)(H * qw) * sizeof(float));
    }
    rc = dsq_backend_mla_attention_dense(g->be, oc, qc, n, (int)H, pos, kvx, kpe, ctx, (int)dn,
                                     (int)dr, (int)dv, g->attn_scale);
    for (int64_t j = 0; j < n && !rc; j++)
        memcpy(g->att + E[j] * H * dv, oc + j * H * dv, (size_t)(H * dv) * sizeof(float));
undo:
    free(slot);
    free(pos);
    free(lat);
    free(latc);
    free(kpe);
    free(kvx);
    free(qc);
    free(oc);
    return rc;
}

/* Whether a sequence with n_rows rows in this step runs the expanded form.
 * Auto: expanding costs kvl * H * (dn + dv) multiply-adds per context
 * token, once; per row and context token the absorbed form reads H * (D +
 * kvl) values against the expanded H * (dn + dr + dv). Decode (one row)
 * always uses the absorbed form. */
static bool use_expanded(const dsq_ds2_t *g, int64_t n_rows)
{
    if (n_rows <= 1 || g->split_kv_b || g->prefill_mode == DS2_PREFILL_ABSORBED)
        return false;
    if (g->prefill_mode == DS2_PREFILL_EXPANDED)
        return true;
    return n_rows * (g->D + g->kvl - (g->dn + g->dr + g->dv)) >
           g->kvl * (g->dn + g->dv);
}

/* MLA attention of one layer for the batch; result (before o_proj) in
 * g->att [T][H*dv]. */
static int attention(dsq_ds2_t *g, const ds2_layer_t *L, const dsq_kv_layer_t *kl,
                     const dsq_batch_t *b)
{
    const int64_t T = b->n_tokens, H = g->H, dn = g->dn, dr = g->dr, kvl = g->kvl,
                  D = g->D, qw = dn + dr;
    const float eps = (float)g->c.rms_eps;
    int rc;
    /* the query's first product and kv_a share h: one dispatch */
    float *y2[2] = {g->ql > 0 ? g->qa : g->q, g->ckv};
    const float *x2[2] = {g->h, g->h};
    const int64_t m2[2] = {T, T};
    const dsq_weight_t *w2[2] = {g->ql > 0 ? &L->wq_a : &L->wq, &L->wkv_a};
    rc = dsq_backend_matmul_many(g->be, 2, y2, x2, m2, w2);
    if (!rc && g->ql > 0) {
        rc = dsq_backend_rmsnorm(g->be, g->qa, F32, g->qa, L->q_a_norm, T, g->ql, eps);
        if (!rc) rc = dsq_backend_matmul(g->be, g->q, F32, g->qa, F32, T, &L->wq_b);
    }
    if (rc)
        return rc;
    /* latent: RMSNorm of the first kvl values; k_pe, q_pe: RoPE */
    for (int64_t t = 0; t < T && !rc; t++) {
        float *row = g->ckv + t * D;
        rc = dsq_backend_rmsnorm(g->be, row, F32, row, L->kv_a_norm, 1, kvl, eps);
        memcpy(g->kpe + t * dr, row + kvl, (size_t)dr * sizeof(float));
        for (int64_t hh = 0; hh < H; hh++)
            memcpy(g->qpe + (t * H + hh) * dr, g->q + (t * H + hh) * qw + dn,
                   (size_t)dr * sizeof(float));
    }
    if (!rc) rc = dsq_backend_rope(g->be, g->kpe, F32, T, 1, (int)dr, b->pos, &g->rope);
    if (!rc) rc = dsq_backend_rope(g->be, g->qpe, F32, T, (int)H, (int)dr, b->pos, &g->rope);
    if (rc)
        return rc;
    for (int64_t t = 0; t < T; t++) {
        memcpy(g->ckv + t * D + kvl, g->kpe + t * dr, (size_t)dr * sizeof(float));
        for (int64_t hh = 0; hh < H; hh++)
            memcpy(g->q + (t * H + hh) * qw + dn, g->qpe + (t * H + hh) * dr,
                   (size_t)dr * sizeof(float));
    }
    rc = dsq_backend_mla_kv_write(g->be, kl, g->ckv, b->slot, T);
    if (rc)
        return rc;
    /* split rows: sequences with many rows here (prefill) may run expanded */
    int32_t *cnt = calloc((size_t)b->n_seqs, sizeof(*cnt));
    int32_t *maxp = calloc((size_t)b->n_seqs, sizeof(*maxp));
    int32_t *idx = malloc((size_t)(3 * T) * sizeof(*idx));
    if (!cnt || !maxp || !idx) {
        rc = DSQ_ENOMEM;
        goto undo;
    }
    for (int64_t t = 0; t < T; t++) {
        cnt[b->row_seq[t]]++;
        maxp[b->row_seq[t]] = b->pos[t] > maxp[b->row_seq[t]] ? b->pos[t]
                                                               : maxp[b->row_seq[t]];
    }
    int64_t nA = 0;
    for (int64_t t = 0; t < T; t++)
        if (!use_expanded(g, cnt[b->row_seq[t]]))
            idx[nA++] = (int32_t)t;
    if (nA > 0)
        rc = attend_absorbed(g, L, kl, b, idx, nA, idx + T, idx + 2 * T);
    for (int32_t s = 0; s < b->n_seqs && !rc; s++) {
        if (cnt[s] == 0 || !use_expanded(g, cnt[s]))
            continue;
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            if (b->row_seq[t] == s)
                idx[n++] = (int32_t)t;
        rc = attend_expanded(g, L, kl, b, s, idx, n, maxp[s]);
    }
undo:
    free(cnt);
    free(maxp);
    free(idx);
    return rc;
}

/* moe for T <= batch_rows tokens, the same products in three
 * dispatches (router with the shared gate and up; every routed expert's
 * gate and up; every down) instead of one per product: at decode each
 * product is small (V2-Lite: 1408 x 2048), and waiting for the slower
 * thread at 26 barriers a layer cost more than a tenth of a step. Same
 * operations in the same order as the loop in moe, so the same bits. */
static int moe_batched(dsq_ds2_t *g, const ds2_layer_t *L, int64_t T)
{
    const int64_t d = g->d, K = g->top_k, mi = g->mi, R = T * K;
    const int64_t fs = L->has_shared ? L->w_gate.n : 0;
    const int cap = 2 * (int)(R < g->n_exp ? R : g->n_exp) + 3;
    float **y = malloc((size_t)cap * sizeof(*y));
    const float **x = malloc((size_t)cap * sizeof(*x));
    int64_t *m = malloc((size_t)cap * sizeof(*m));
    const dsq_weight_t **w = malloc((size_t)cap * sizeof(*w));
    int rc = y && x && m && w ? DSQ_OK : DSQ_ENOMEM, n = 0;
    float *gs = g->bg + R * mi, *us = g->bu + R * mi;    /* shared rows */
#define ADD(Y, X, M, W) (y[n] = (Y), x[n] = (X), m[n] = (M), w[n] = (W), n++)
    if (!rc) {
        ADD(g->rlog, g->h, T, &L->router);
        if (L->has_shared) {
            ADD(gs, g->h, T, &L->w_gate);
            ADD(us, g->h, T, &L->w_up);
        }
        rc = dsq_backend_matmul_many(g->be, n, y, x, m, w);
    }
    dsq_moe_route_t r = g->route;
    r.bias = L->router_bias;
    if (!rc) rc = dsq_backend_moe_route(g->be, g->ids, g->wts, g->rlog, T, &r);
    if (!rc) rc = dsq_backend_moe_group(g->be, g->offsets, g->rows, g->roww, g->ids, g->wts, T,
                                    (int)K, (int)g->n_exp);
    for (int64_t j = 0; j < R && !rc; j++)
        memcpy(g->bx + j * d, g->h + (int64_t)g->rows[j] * d, (size_t)d * sizeof(float));
    n = 0;
    for (int64_t e = 0; e < g->n_exp && !rc; e++) {
        const int64_t o0 = g->offsets[e], ne = g->offsets[e + 1] - o0;
        if (ne == 0)
            continue;
        ADD(g->bg + o0 * mi, g->bx + o0 * d, ne, &L->exp_gate[e]);
        ADD(g->bu + o0 * mi, g->bx + o0 * d, ne, &L->exp_up[e]);
    }
    if (!rc) rc = dsq_backend_matmul_many(g->be, n, y, x, m, w);
    /* gate and up rows are contiguous, the shared ones after the routed */
    if (!rc) rc = dsq_backend_swiglu(g->be, g->bg, g->bg, g->bu, F32, 1, R * mi + T * fs);
    n = 0;
    if (!rc && L->has_shared)
        ADD(g->y, gs, T, &L->w_down);
    else if (!rc)
        memset(g->y, 0, (size_t)(T * d) * sizeof(float));
    for (int64_t e = 0; e < g->n_exp && !rc; e++) {
        const int64_t o0 = g->offsets[e], ne = g->offsets[e + 1] - o0;
        if (ne > 0)
            ADD(g->by + o0 * d, g->bg + o0 * mi, ne, &L->exp_down[e]);
    }
#undef ADD
    if (!rc) rc = dsq_backend_matmul_many(g->be, n, y, x, m, w);
    for (int64_t j = 0; j < R && !rc; j++) {
        float *dst = g->y + (int64_t)g->rows[j] * d;
        const float *src = g->by + j * d, wj = g->roww[j];
        for (int64_t i = 0; i < d; i++)
            dst[i] += wj * src[i];
    }
    free(y);
    free(x);
    free(m);
    free(w);
    return rc;
}

/* Routed + shared experts of g->h into g->y. */
static int moe(dsq_ds2_t *g, const ds2_layer_t *L, int64_t T)
{
    const int64_t d = g->d, K = g->top_k;
    int rc = DSQ_OK;
    if (T <= g->batch_rows)
        return moe_batched(g, L, T);
    if (L->has_shared)
        rc = mlp(g, g->y, g->h, T, &L->w_gate, &L->w_up, &L->w_down);
    else
        memset(g->y, 0, (size_t)(T * d) * sizeof(float));
    if (!rc) rc = dsq_backend_matmul(g->be, g->rlog, F32, g->h, F32, T, &L->router);
    if (rc)
        return rc;
    dsq_moe_route_t r = g->route;
    r.bias = L->router_bias;
    rc = dsq_backend_moe_route(g->be, g->ids, g->wts, g->rlog, T, &r);
    if (!rc) rc = dsq_backend_moe_group(g->be, g->offsets, g->rows, g->roww, g->ids, g->wts, T,
                                    (int)K, (int)g->n_exp);
    for (int64_t e = 0; e < g->n_exp && !rc; e++) {
        const int32_t o0 = g->offsets[e], n = g->offsets[e + 1] - o0;
        if (n == 0)
            continue;
        for (int32_t j = 0; j < n; j++)
            memcpy(g->xe + (int64_t)j * d, g->h + (int64_t)g->rows[o0 + j] * d,
                   (size_t)d * sizeof(float));
        rc = mlp(g, g->ye, g->xe, n, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]);
        for (int32_t j = 0; j < n && !rc; j++) {
            float *dst = g->y + (int64_t)g->rows[o0 + j] * d;
            const float *src = g->ye + (int64_t)j * d, w = g->roww[o0 + j];
            for (int64_t i = 0; i < d; i++)
                dst[i] += w * src[i];
        }
    }
    return rc;
}

static int check_batch(const dsq_batch_t *b)
{
    const int T = b->n_tokens;
    if (T <= 0 || b->n_logits < 0 || b->n_logits > T)
        return DSQ_EINVAL;
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= T)
            return DSQ_EINVAL;
    for (int i = 0; i < T; i++)
        if (b->row_seq[i] < 0 || b->row_seq[i] >= b->n_seqs || b->pos[i] < 0)
            return DSQ_EINVAL;
    return DSQ_OK;
}

/* Decoder layer l (n_layer: the MTP module's) over the residual stream x. */
static int block(dsq_ds2_t *g, int64_t l, dsq_kv_cache_t *kv, const dsq_batch_t *b)
{
    const ds2_layer_t *L = &g->layers[l];
    const int64_t T = b->n_tokens, d = g->d;
    const float eps = (float)g->c.rms_eps;
    const dsq_kv_layer_t *kl = dsq_kv_layer(kv, (int)l);
    if (!kl || kl->n_kv_heads != 1 || kl->head_dim != g->D)
        return DSQ_EINVAL;     /* cache not made with dsq_model_kv_shape / _kv_layers */
    int rc = dsq_backend_rmsnorm(g->be, g->h, F32, g->x, L->attn_norm, T, d, eps);
    if (!rc) rc = attention(g, L, kl, b);
    if (!rc) rc = dsq_backend_matmul(g->be, g->o, F32, g->att, F32, T, &L->wo);
    if (!rc) rc = dsq_backend_add(g->be, g->x, g->o, F32, T * d);
    if (!rc) rc = dsq_backend_rmsnorm(g->be, g->h, F32, g->x, L->ffn_norm, T, d, eps);
    if (!rc && L->moe)
        rc = moe(g, L, T);
    else if (!rc)
        rc = mlp(g, g->y, g->h, T, &L->w_gate, &L->w_up, &L->w_down);
    if (!rc) rc = dsq_backend_add(g->be, g->x, g->y, F32, T * d);
    return rc;
}

/* logits of b's logit rows of x through norm and the head. */
static int head(dsq_ds2_t *g, const dsq_batch_t *b, const float *norm,
                const dsq_weight_t *w, float *logits)
{
    const int64_t d = g->d;
    if (b->n_logits == 0)
        return DSQ_OK;
    for (int i = 0; i < b->n_logits; i++)
        memcpy(g->lg + (size_t)i * d, g->x + (size_t)b->logit_rows[i] * d,
               (size_t)d * sizeof(float));
    int rc = dsq_backend_rmsnorm(g->be, g->lg, F32, g->lg, norm, b->n_logits, d,
                                 (float)g->c.rms_eps);
    if (!rc)
        rc = dsq_backend_matmul(g->be, logits, F32, g->lg, F32, b->n_logits, w);
    return rc;
}

static int ds2_forward(void *graph, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                       float *logits)
{
    dsq_ds2_t *g = graph;
    const dsq_model_config_t *c = &g->c;
    const int T = b->n_tokens;
    int rc = check_batch(b);
    if (!rc) rc = ensure_ws(g, T);
    if (rc)
        return rc;

    g->hidden_rows = 0;
    rc = dsq_backend_embed(g->be, g->x, &g->tok_embd, b->tokens, T);
    for (int64_t l = 0; l < c->n_layer && rc == DSQ_OK; l++)
        rc = block(g, l, kv, b);
    if (rc)
        return rc;
    g->hidden_rows = T;
    return head(g, b, g->output_norm, &g->output, logits);
}

/* ds2_mtp_forward's input: x = eh_proj([enorm(E(tokens)); hnorm(norm(hidden))]),
 * E zero at position 0; hidden is read before x is written, so it may be x. */
static int mtp_input(dsq_ds2_t *g, const dsq_batch_t *b, const float *hidden)
{
    const int64_t T = b->n_tokens, d = g->d;
    const float eps = (float)g->c.rms_eps;
    int rc = DSQ_OK;
    for (int64_t t = 0; t < T && !rc; t++) {
        float *right = g->mcat + t * 2 * d + d;
        rc = dsq_backend_rmsnorm(g->be, right, F32, hidden + t * d, g->output_norm, 1, d, eps);
        if (!rc) rc = dsq_backend_rmsnorm(g->be, right, F32, right, g->mtp.hnorm, 1, d, eps);
    }
    if (!rc) rc = dsq_backend_embed(g->be, g->h, &g->mtp.embed, b->tokens, (int)T);
    for (int64_t t = 0; t < T && !rc; t++) {
        float *left = g->mcat + t * 2 * d;
        if (b->pos[t] == 0)
            memset(left, 0, (size_t)d * sizeof(float));
        else
            rc = dsq_backend_rmsnorm(g->be, left, F32, g->h + t * d, g->mtp.enorm, 1, d, eps);
    }
    if (!rc) rc = dsq_backend_matmul(g->be, g->x, F32, g->mcat, F32, T, &g->mtp.eh_proj);
    return rc;
}

static int ds2_mtp_forward(void *graph, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                           const float *hidden, float *logits)
{
    dsq_ds2_t *g = graph;
    int rc = check_batch(b);
    if (!rc && g->n_mtp == 0)
        rc = DSQ_EUNSUPPORTED;
    if (!rc) rc = ensure_ws(g, b->n_tokens);
    if (rc)
        return rc;
    g->hidden_rows = 0;            /* x is the module's from here */
    rc = mtp_input(g, b, hidden);
    if (!rc) rc = block(g, g->c.n_layer, kv, b);
    if (!rc) rc = head(g, b, g->mtp.head_norm, &g->mtp.head, logits);
    return rc;
}

static int ds2_n_mtp(const void *graph)
{
    return ((const dsq_ds2_t *)graph)->n_mtp;
}

static const float *ds2_hidden(const void *graph, int *n_rows)
{
    const dsq_ds2_t *g = graph;
    *n_rows = g->hidden_rows;
    return g->hidden_rows ? g->x : NULL;
}

/* MLA: one vector per token and layer, the latent and the rope key, and
 * no V; without kv_lora_rank, n_head_kv keys and values of head_dim. */
static void ds2_kv_shape(const dsq_model_config_t *c, int *n_kv_heads, int *head_dim,
                         bool *has_v)
{
    if (c->kv_lora_rank > 0) {
        *n_kv_heads = 1;
        *head_dim = (int)(c->kv_lora_rank + c->qk_rope_head_dim);
        *has_v = false;
    } else {
        *n_kv_heads = (int)c->n_head_kv;
        *head_dim = (int)c->head_dim;
        *has_v = true;
    }
}

/* blk.<l>.<nm> of [n, k], for ds2_tensors. */
static void tensor(dsq_model_tensor_fn fn, void *user, int64_t l, const char *nm,
                   int64_t n, int64_t k)
{
    char name[96];
    snprintf(name, sizeof(name), "blk.%lld.%s", (long long)l, nm);
    fn(user, name, n, k);
}

/* What ds2_create loads from a Hugging Face checkpoint (a whole kv_b_proj
 * per layer, as config.json directories hold), for a plan without a
 * file; MoE layers as load_layer picks them. */
static void ds2_tensors(const dsq_model_config_t *c, dsq_model_tensor_fn fn, void *user)
{
    const int64_t d = c->n_embd, nh = c->n_head,
                  qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    char nm[64];
    fn(user, "token_embd.weight", c->n_vocab, d);
    if (!c->tie_word_embeddings)
        fn(user, "output.weight", c->n_vocab, d);
    fn(user, "output_norm.weight", d, 1);
    for (int64_t l = 0; l < c->n_layer; l++) {
        tensor(fn, user, l, "attn_norm.weight", d, 1);
        tensor(fn, user, l, "ffn_norm.weight", d, 1);
        if (c->q_lora_rank > 0) {
            tensor(fn, user, l, "attn_q_a.weight", c->q_lora_rank, d);
            tensor(fn, user, l, "attn_q_a_norm.weight", c->q_lora_rank, 1);
            tensor(fn, user, l, "attn_q_b.weight", nh * qk, c->q_lora_rank);
        } else {
            tensor(fn, user, l, "attn_q.weight", nh * qk, d);
        }
        tensor(fn, user, l, "attn_kv_a_mqa.weight", c->kv_lora_rank + c->qk_rope_head_dim,
               d);
        tensor(fn, user, l, "attn_kv_a_norm.weight", c->kv_lora_rank, 1);
        tensor(fn, user, l, "attn_kv_b.weight", nh * (c->qk_nope_head_dim + c->v_head_dim),
               c->kv_lora_rank);
        tensor(fn, user, l, "attn_output.weight", d, nh * c->v_head_dim);
        const bool is_moe = c->n_routed_experts > 0 && l >= c->first_k_dense_replace &&
                            l % (c->moe_layer_freq > 0 ? c->moe_layer_freq : 1) == 0;
        if (!is_moe) {
            tensor(fn, user, l, "ffn_gate.weight", c->n_ff, d);
            tensor(fn, user, l, "ffn_up.weight", c->n_ff, d);
            tensor(fn, user, l, "ffn_down.weight", d, c->n_ff);
            continue;
        }
        const int64_t mi = c->moe_intermediate_size, fs = mi * c->n_shared_experts;
        tensor(fn, user, l, "ffn_gate_inp.weight", c->n_routed_experts, d);
        for (int64_t e = 0; e < c->n_routed_experts; e++) {
            snprintf(nm, sizeof(nm), "ffn_gate.%lld.weight", (long long)e);
            tensor(fn, user, l, nm, mi, d);
            snprintf(nm, sizeof(nm), "ffn_up.%lld.weight", (long long)e);
            tensor(fn, user, l, nm, mi, d);
            snprintf(nm, sizeof(nm), "ffn_down.%lld.weight", (long long)e);
            tensor(fn, user, l, nm, d, mi);
        }
        if (c->n_shared_experts > 0) {
            tensor(fn, user, l, "ffn_gate_shexp.weight", fs, d);
            tensor(fn, user, l, "ffn_up_shexp.weight", fs, d);
            tensor(fn, user, l, "ffn_down_shexp.weight", d, fs);
        }
    }
}

/* load_absorbed's copies: n_head W_UK_h^T [kv_lora_rank, qk_nope] from a
 * whole kv_b_proj (.weight, or AWQ/GPTQ .qweight); the split attn_k_b /
 * attn_v_b slices of newer GGUFs are used in place. */
static int64_t ds2_built_weights(const dsq_model_config_t *c, const char *name,
                                 int64_t *n, int64_t *k)
{
    const char *p = strstr(name, ".attn_kv_b.");
    if (!p || (strcmp(p, ".attn_kv_b.weight") && strcmp(p, ".attn_kv_b.qweight")))
        return 0;
    *n = c->kv_lora_rank;
    *k = c->qk_nope_head_dim;
    return c->n_head;
}

/* Decode reads the absorbed form: W_UK_h^T and W_UV_h of every head, not
 * kv_b_proj (the expanded prefill form's). */
static size_t ds2_decode_bytes(const void *graph)
{
    const dsq_ds2_t *g = graph;
    size_t b = dsq__model_weight_size(&g->output);
    for (int64_t l = 0; l < g->c.n_layer; l++) {
        const ds2_layer_t *L = &g->layers[l];
        b += dsq__model_weight_size(&L->wq) + dsq__model_weight_size(&L->wq_a) +
             dsq__model_weight_size(&L->wq_b) + dsq__model_weight_size(&L->wkv_a) +
             dsq__model_weight_size(&L->wo);
        for (int64_t h = 0; h < g->H; h++)
            b += dsq__model_weight_size(&L->wuk[h]) + dsq__model_weight_size(&L->wuv[h]);
        b += dsq__model_weight_size(&L->w_gate) + dsq__model_weight_size(&L->w_up) +
             dsq__model_weight_size(&L->w_down);      /* dense FFN or shared experts */
        if (L->moe) {
            size_t e = 0;
            for (int64_t x = 0; x < g->n_exp; x++)
                e += dsq__model_weight_size(&L->exp_gate[x]) +
                     dsq__model_weight_size(&L->exp_up[x]) +
                     dsq__model_weight_size(&L->exp_down[x]);
            b += dsq__model_weight_size(&L->router) +
                 (g->n_exp ? e / (size_t)g->n_exp * (size_t)g->top_k : 0);
        }
    }
    return b;
}

const dsq_model_arch_t dsq__model_arch_deepseek2 = {
    .name = "deepseek2",
    .host_only = true,
    .create = ds2_create,
    .destroy = ds2_destroy,
    .forward = ds2_forward,
    .kv_shape = ds2_kv_shape,
    .tensors = ds2_tensors,
    .built_weights = ds2_built_weights,
    .decode_bytes = ds2_decode_bytes,
    .n_mtp = ds2_n_mtp,
    .hidden = ds2_hidden,
    .mtp_forward = ds2_mtp_forward,
};

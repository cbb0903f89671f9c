/* Model graph for the llama and qwen2 architectures (see model.h): the
 * architecture table's row for both (model_arch.c).
 *
 * Weights: every linear layer becomes a dsq_weight_t through the shared
 * loaders (model_weights.c over engine/model/quant.c: zero-copy views for
 * formats the kernels read directly, exact repacking for Q4_0/Q4_1/AWQ/
 * GPTQ, RTN INT4 with --quantize int4). Norm weights and biases are
 * converted to fp32 once. The workspace grows to the largest step seen
 * and is reused. opts->activation_dtype is stamped on every linear weight
 * (kernels.h dsq_act_dtype_t).
 *
 * Activations: the residual stream x (embedding rows, the adds) and the
 * logits are fp32 on every backend; what flows between products (norm
 * outputs, q/k/v, attention outputs, gate/up and their SwiGLU, product
 * outputs before the add) is in the model's activation type (dsq_model_act:
 * fp32 on the CPU, fp16 or bf16 on a device), so a device moves half the
 * activation bytes while sums, norm statistics and softmax stay fp32 in
 * the kernels. The output head reads the normed rows in that type and
 * writes fp32 logits.
 *
 * GPTQ act-order (desc_act): the repacked weight's k dimension is permuted
 * so that groups are contiguous (engine/model/quant.h, dsq_quant_from_gptq), and
 * y = W'·x' with x'[j] = x[perm[j]]. The permutation cannot be folded into
 * the weights at load time without breaking group contiguity, nor into the
 * previous op (the residual stream and attention heads are shared), so the
 * graph gathers the activation rows at run time (T*k copies, negligible
 * next to the matmul), once per distinct (input, permutation) pair: q/k/v
 * and gate/up of a GPTQ checkpoint normally share one permutation (the same
 * input, hence the same Hessian order), which the loader keeps once.
 *
 * Backend (engine/backend/backend.h): every op goes through the model's
 * backend, and the workspace lives in its memory. Weights load into host
 * memory as above; on a device backend (not host memory) they are then
 * copied to the device once (upload_weights), and each step uploads the
 * batch's index arrays and downloads only the logits. On the CPU backend
 * host pointers are used as they are, so nothing is copied. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "kernels.h"
#include "engine/common/log.h"
#include "engine/common/clock.h"
#include "model_internal.h"

typedef struct layer_weights {
    dsq_weight_t wq, wk, wv, wo, w_gate, w_up, w_down;
    const float *attn_norm, *ffn_norm;
    /* GPTQ act-order input permutations (NULL = none), owned by the model */
    const int32_t *perm_q, *perm_k, *perm_v, *perm_o, *perm_gate, *perm_up, *perm_down;
} layer_weights_t;

/* The graph's state. The weights' host memory is recorded in the model
 * (model_internal.h); what this struct allocates it frees. */
typedef struct llama {
    dsq_model_t *model;      /* the owner of the weights, and the tap */
    dsq_model_config_t cfg;
    dsq_backend_t *be;       /* not owned: the model's */
    dsq_weight_t tok_embd, output;
    const float *output_norm;
    layer_weights_t *layers;
    dsq_rope_t rope;
    float attn_scale;

    /* workspace, sized for ws_tokens rows: the residual stream x and the
     * logits rows lg in fp32, the rest in the activation type at (the
     * model's, dsq_model_act: fp32 on the CPU, fp16 or bf16 on a device) */
    int ws_tokens;
    dsq_ftype_t at;
    void *x, *lg;            /* fp32 */
    void *h, *q, *k, *v, *att, *g, *u;

    /* GPTQ act-order: the permuted copy xp of input xp_src under xp_perm
     * (NULL = stale) */
    void *xp;
    const void *xp_src;
    const int32_t *xp_perm;

    /* device backends only: backend memory the model allocated (weights,
     * vectors, permutations; freed at destroy) and the step's uploaded
     * index arrays (dix: tokens | pos | row_seq | slot | logit_rows |
     * block_tables, resized as needed) and logits */
    void **dev_owned;
    int n_dev_owned, cap_dev_owned;
    int32_t *dix, *hix;      /* hix: host staging of dix */
    size_t dix_bytes;
    int32_t *need;           /* check_batch: blocks each sequence attends */
    size_t need_cap;
    /* upload progress (upload_weights): bytes copied, of total, next
     * percentage to log, start time */
    size_t up_done, up_total;
    int up_next_pct;
    double up_t0;
    float *dlogits;
    size_t dlogits_bytes;
} llama_t;

static int upload_weights(llama_t *m);

/* Hand one linear input site to the model's tap, if any (host memory
 * only: a device backend's activations are not visible to the tap). */
#define TAP(site, ptr, kk) \
    do { if (m->model->tap && dsq_backend_is_host(m->be)) \
            m->model->tap(m->model->tap_user, (int)l, site, ptr, T, kk); } while (0)

static int load_bias(dsq_model_t *m, const dsq_model_file_t *f, const char *base,
                     int64_t n, dsq_weight_t *w, char *err, size_t err_len)
{
    char name[160];
    snprintf(name, sizeof(name), "%s.bias", base);
    return dsq__model_load_vec(m, f, name, n, false, &w->bias, err, err_len);
}

static void setup_rope(llama_t *m)
{
    const dsq_model_config_t *c = &m->cfg;
    dsq_rope_t *r = &m->rope;
    memset(r, 0, sizeof(*r));
    r->rot_dim = (int)(c->rope_dim > 0 ? c->rope_dim : c->head_dim);
    r->neox = c->rope_neox;
    r->theta = (float)(c->rope_theta > 0 ? c->rope_theta : 10000.0);
    r->freq_scale = 1.0f;
    r->attn_factor = 1.0f;
    if (c->rope_scaling == DSQ_ROPE_SCALING_LINEAR && c->rope_factor > 0)
        r->freq_scale = (float)(1.0 / c->rope_factor);
}

static void llama_destroy(void *graph);

/* dsq_model_arch_t.create: model has its config and backend set. */
static void *llama_create(dsq_model_t *model, const dsq_model_file_t *f,
                          const dsq_model_opts_t *opts, char *err, size_t err_len)
{
    const dsq_model_config_t *c = dsq_model_file_config(f);
    llama_t *m = NULL;
    int rc = DSQ_OK;
    char base[128];

    if (c->arch != DSQ_ARCH_LLAMA && c->arch != DSQ_ARCH_QWEN2) {
        snprintf(err, err_len, "model: architecture %s is not supported by the "
                 "llama/qwen2 graph", dsq_arch_name(c->arch));
        return NULL;
    }
    if (c->n_embd <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 ||
        c->head_dim <= 0 || c->n_ff <= 0 || c->n_vocab <= 0 ||
        c->n_head % c->n_head_kv != 0) {
        snprintf(err, err_len, "model: inconsistent shape (n_embd=%lld n_layer=%lld "
                 "n_head=%lld n_head_kv=%lld head_dim=%lld n_ff=%lld n_vocab=%lld)",
                 (long long)c->n_embd, (long long)c->n_layer, (long long)c->n_head,
                 (long long)c->n_head_kv, (long long)c->head_dim, (long long)c->n_ff,
                 (long long)c->n_vocab);
        return NULL;
    }
    m = calloc(1, sizeof(*m));
    if (!m)
        goto oom;
    m->model = model;
    m->cfg = *c;
    m->be = model->be;
    m->at = model->act;
    m->layers = calloc((size_t)c->n_layer, sizeof(*m->layers));
    if (!m->layers)
        goto oom;
    int64_t d = c->n_embd, hd = c->head_dim;
    int64_t q_dim = c->n_head * hd, kv_dim = c->n_head_kv * hd;

    rc = dsq__model_load_linear(model, f, opts, "token_embd", c->n_vocab, d, false,
                                &m->tok_embd, err, err_len);
    if (rc)
        goto fail;
    if (dsq_model_file_find(f, "output.weight") || dsq_model_file_find(f, "output.qweight"))
        rc = dsq__model_load_linear(model, f, opts, "output", c->n_vocab, d, false,
                                    &m->output, err, err_len);
    else
        m->output = m->tok_embd;          /* tied embeddings */
    if (rc)
        goto fail;
    rc = dsq__model_load_vec(model, f, "output_norm.weight", d, true, &m->output_norm,
                             err, err_len);
    if (rc)
        goto fail;
    for (int64_t l = 0; l < c->n_layer; l++) {
        layer_weights_t *L = &m->layers[l];
        struct { const char *nm; dsq_weight_t *w; int64_t n, k; bool bias;
                 const int32_t **perm; } lin[] = {
            {"attn_q", &L->wq, q_dim, d, true, &L->perm_q},
            {"attn_k", &L->wk, kv_dim, d, true, &L->perm_k},
            {"attn_v", &L->wv, kv_dim, d, true, &L->perm_v},
            {"attn_output", &L->wo, d, q_dim, false, &L->perm_o},
            {"ffn_gate", &L->w_gate, c->n_ff, d, false, &L->perm_gate},
            {"ffn_up", &L->w_up, c->n_ff, d, false, &L->perm_up},
            {"ffn_down", &L->w_down, d, c->n_ff, false, &L->perm_down},
        };
        for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++) {
            snprintf(base, sizeof(base), "blk.%lld.%s", (long long)l, lin[i].nm);
            rc = dsq__model_load_linear_perm(model, f, opts, base, lin[i].n, lin[i].k,
                                             true, lin[i].w, lin[i].perm, err, err_len);
            if (!rc && lin[i].bias)
                rc = load_bias(model, f, base, lin[i].n, lin[i].w, err, err_len);
            if (rc)
                goto fail;
        }
        snprintf(base, sizeof(base), "blk.%lld.attn_norm.weight", (long long)l);
        rc = dsq__model_load_vec(model, f, base, d, true, &L->attn_norm, err, err_len);
        if (rc)
            goto fail;
        snprintf(base, sizeof(base), "blk.%lld.ffn_norm.weight", (long long)l);
        rc = dsq__model_load_vec(model, f, base, d, true, &L->ffn_norm, err, err_len);
        if (rc)
            goto fail;
    }
    setup_rope(m);
    m->attn_scale = 1.0f / sqrtf((float)hd);
    if (!dsq_backend_is_host(m->be)) {
        rc = upload_weights(m);
        if (rc) {
            char desc[256];
            dsq_backend_describe(m->be, desc, sizeof(desc));
            snprintf(err, err_len, "model: copying %zu bytes of weights to the %s backend "
                     "failed (%s; device: %s)", model->weight_bytes,
                     dsq_backend_name(m->be), dsq_strerror(rc), desc);
            llama_destroy(m);
            return NULL;
        }
    }
    return m;
oom:
    snprintf(err, err_len, "model: out of memory");
fail:
    if (rc == DSQ_ENOMEM)
        snprintf(err, err_len, "model: out of memory while loading weights");
    llama_destroy(m);
    return NULL;
}

static void llama_destroy(void *graph)
{
    llama_t *m = graph;
    if (!m)
        return;
    free(m->layers);
    void *ws[] = {m->x, m->h, m->q, m->k, m->v, m->att, m->g, m->u, m->lg, m->xp};
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
        dsq_backend_free(m->be, ws[i]);
    for (int i = 0; i < m->n_dev_owned; i++)
        dsq_backend_free(m->be, m->dev_owned[i]);
    free(m->dev_owned);
    dsq_backend_free(m->be, m->dix);
    free(m->hix);
    free(m->need);
    dsq_backend_free(m->be, m->dlogits);
    free(m);
}

static int ensure_ws(llama_t *m, int n_tokens)
{
    if (n_tokens <= m->ws_tokens)
        return DSQ_OK;
    const dsq_model_config_t *c = &m->cfg;
    size_t t = (size_t)n_tokens;
    size_t d = (size_t)c->n_embd, qd = (size_t)(c->n_head * c->head_dim),
           kvd = (size_t)(c->n_head_kv * c->head_dim), ff = (size_t)c->n_ff;
    const size_t a = dsq_ftype_size(m->at);
    struct { void **p; size_t n, size; } bufs[] = {
        {&m->x, t * d, 4}, {&m->h, t * (d > qd ? d : qd), a}, {&m->q, t * qd, a},
        {&m->k, t * kvd, a}, {&m->v, t * kvd, a}, {&m->att, t * qd, a}, {&m->g, t * ff, a},
        {&m->u, t * ff, a}, {&m->lg, t * d, 4},
        /* act-order gathers: any linear input (d, q_dim or n_ff wide) */
        {&m->xp, m->model->has_perm ? t * (ff > d ? (ff > qd ? ff : qd) : (d > qd ? d : qd)) : 0,
         a},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        if (bufs[i].n == 0)
            continue;                /* xp without act-order weights */
        /* contents need not survive: a step rewrites its workspace */
        dsq_backend_free(m->be, *bufs[i].p);
        *bufs[i].p = dsq_backend_alloc(m->be, bufs[i].n * bufs[i].size);
        if (!*bufs[i].p) {
            m->ws_tokens = 0;
            return DSQ_ENOMEM;
        }
    }
    m->ws_tokens = n_tokens;
    return DSQ_OK;
}

/* y = W·x for a linear layer whose input is x itself, or (GPTQ act-order)
 * x's columns gathered through perm into m->xp, reused while (x, perm) is
 * unchanged; the forward pass sets m->xp_src = NULL whenever an input is
 * rewritten. */
static int linear(llama_t *m, void *y, const void *x, int T, int64_t k,
                  const int32_t *perm, const dsq_weight_t *w)
{
    if (perm && (m->xp_src != x || m->xp_perm != perm)) {
        int rc = dsq_backend_gather_cols(m->be, m->xp, x, m->at, perm, T, k);
        if (rc)
            return rc;
        m->xp_src = x;
        m->xp_perm = perm;
    }
    return dsq_backend_matmul(m->be, y, m->at, perm ? m->xp : x, m->at, T, w);
}

/* ---- device backends: weights uploaded once, index arrays per step ---- */

/* Room for n more entries in m->dev_owned, so that recording the parts
 * of one allocation cannot fail half-way (a half-recorded weight would be
 * freed twice: once by its own undo, once at destroy). */
static int dev_reserve(llama_t *m, int n)
{
    if (m->n_dev_owned + n <= m->cap_dev_owned)
        return DSQ_OK;
    int cap = m->cap_dev_owned ? 2 * m->cap_dev_owned : 256;
    while (cap < m->n_dev_owned + n)
        cap *= 2;
    void **o = realloc(m->dev_owned, (size_t)cap * sizeof(*o));
    if (!o)
        return DSQ_ENOMEM;
    m->dev_owned = o;
    m->cap_dev_owned = cap;
    return DSQ_OK;
}

/* Record p (after dev_reserve). */
static void dev_keep(llama_t *m, const void *p)
{
    if (p)
        m->dev_owned[m->n_dev_owned++] = (void *)p;
}

/* bytes more are on the device: one log line per 10 % (and the last) */
static void up_progress(llama_t *m, size_t bytes)
{
    m->up_done += bytes;
    int pct = m->up_total ? (int)(100.0 * (double)m->up_done / (double)m->up_total) : 100;
    if (pct > 100)
        pct = 100;
    if (pct < m->up_next_pct)
        return;
    double dt = dsq_clock_now_s() - m->up_t0;
    dsq_log(DSQ_LOG_INFO, "event=weights_upload backend=%s bytes=%zu total_bytes=%zu pct=%d "
            "seconds=%.2f", dsq_backend_name(m->be), m->up_done, m->up_total, pct, dt);
    m->up_next_pct = pct / 10 * 10 + 10;
}

static int up_weight(llama_t *m, dsq_weight_t *w)
{
    dsq_weight_t d;
    size_t bytes = 0;
    int rc = dev_reserve(m, 7);
    if (!rc)
        rc = dsq_backend_weight_upload(m->be, w, &d, &bytes);
    if (rc)
        return rc;
    up_progress(m, bytes);
    dev_keep(m, d.data);
    dev_keep(m, d.scales);
    dev_keep(m, d.zeros);
    dev_keep(m, d.sub_scales);
    dev_keep(m, d.sub_zeros);
    dev_keep(m, d.super);
    dev_keep(m, d.bias);
    *w = d;
    return DSQ_OK;
}

static int up_array(llama_t *m, const void **p, size_t bytes)
{
    if (!*p)
        return DSQ_OK;
    int rc = dev_reserve(m, 1);
    void *d = rc ? NULL : dsq_backend_alloc(m->be, bytes);
    if (!d)
        return DSQ_ENOMEM;
    rc = dsq_backend_upload(m->be, d, *p, bytes);
    if (rc) {
        dsq_backend_free(m->be, d);
        return rc;
    }
    dev_keep(m, d);
    *p = d;
    up_progress(m, bytes);
    return DSQ_OK;
}

/* Permutations are shared between the weights of a layer (keep_perm):
 * upload each once; seen_* (at most one entry per linear weight of the
 * layer) map host copies to device ones. */
static int up_perm(llama_t *m, const int32_t **p, int64_t k, const int32_t **seen_host,
                   const int32_t **seen_dev, int *n_seen)
{
    if (!*p)
        return DSQ_OK;
    for (int i = 0; i < *n_seen; i++)
        if (seen_host[i] == *p) {
            *p = seen_dev[i];
            return DSQ_OK;
        }
    const int32_t *h = *p;
    int rc = up_array(m, (const void **)p, (size_t)k * sizeof(int32_t));
    if (!rc && *n_seen < 7) {
        seen_host[*n_seen] = h;
        seen_dev[(*n_seen)++] = *p;
    }
    return rc;
}

/* Copy every weight, norm vector and permutation into backend memory and
 * point the model at the copies (the host ones stay owned by m). */
static int upload_weights(llama_t *m)
{
    const dsq_model_config_t *c = &m->cfg;
    m->up_total = m->model->weight_bytes;
    m->up_done = 0;
    m->up_next_pct = 10;
    m->up_t0 = dsq_clock_now_s();
    const int64_t d = c->n_embd, q_dim = c->n_head * c->head_dim;
    const bool tied = m->output.data == m->tok_embd.data;
    int rc = up_weight(m, &m->tok_embd);
    if (!rc && tied)
        m->output = m->tok_embd;
    else if (!rc)
        rc = up_weight(m, &m->output);
    if (!rc)
        rc = up_array(m, (const void **)&m->output_norm, (size_t)d * sizeof(float));
    for (int64_t l = 0; l < c->n_layer && !rc; l++) {
        layer_weights_t *L = &m->layers[l];
        const int32_t *seen_h[7], *seen_d[7];
        int n_seen = 0;
        dsq_weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                              &L->w_down};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]) && !rc; i++)
            rc = up_weight(m, ws[i]);
        if (!rc)
            rc = up_array(m, (const void **)&L->attn_norm, (size_t)d * sizeof(float));
        if (!rc)
            rc = up_array(m, (const void **)&L->ffn_norm, (size_t)d * sizeof(float));
        struct { const int32_t **p; int64_t k; } perms[] = {
            {&L->perm_q, d}, {&L->perm_k, d}, {&L->perm_v, d}, {&L->perm_o, q_dim},
            {&L->perm_gate, d}, {&L->perm_up, d}, {&L->perm_down, c->n_ff},
        };
        for (size_t i = 0; i < sizeof(perms) / sizeof(perms[0]) && !rc; i++)
            rc = up_perm(m, perms[i].p, perms[i].k, seen_h, seen_d, &n_seen);
    }
    return rc;
}

/* The step's index arrays in backend memory (on a host backend, b's own)
 * and the row stride of its block tables. */
typedef struct dev_batch {
    const int32_t *tokens, *pos, *row_seq, *slot, *logit_rows, *block_tables;
    int max_blocks;
} dev_batch_t;

/* Device backends cannot validate index arrays on the device (kernels.h,
 * "CUDA twins"), so the host checks what the CPU ops would: token ids in
 * the vocabulary, slots in the cache, and each sequence's attended blocks
 * (the first need[s] = max over its rows of pos / block_size + 1) in the
 * cache, once per sequence. Returns the widest need in *width. */
static int check_batch(llama_t *m, const dsq_kv_layer_t *kl, const dsq_batch_t *b,
                       int *width)
{
    const int64_t n_slots = kl->n_blocks * kl->block_size;
    if ((size_t)b->n_seqs > m->need_cap) {
        int32_t *p = realloc(m->need, (size_t)b->n_seqs * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        m->need = p;
        m->need_cap = (size_t)b->n_seqs;
    }
    memset(m->need, 0, (size_t)b->n_seqs * sizeof(*m->need));
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.n_vocab)
            return DSQ_ERANGE;
        if (b->slot[i] < 0 || b->slot[i] >= n_slots)
            return DSQ_ERANGE;
        if (b->pos[i] >= (int64_t)b->max_blocks * kl->block_size)
            return DSQ_ERANGE;
        const int32_t n = b->pos[i] / kl->block_size + 1;
        if (n > m->need[b->row_seq[i]])
            m->need[b->row_seq[i]] = n;
    }
    *width = 1;
    for (int s = 0; s < b->n_seqs; s++) {
        const int32_t *bt = b->block_tables + (int64_t)s * b->max_blocks;
        for (int j = 0; j < m->need[s]; j++)
            if (bt[j] < 0 || bt[j] >= kl->n_blocks)
                return DSQ_ERANGE;
        if (m->need[s] > *width)
            *width = m->need[s];
    }
    return DSQ_OK;
}

/* On a device backend: check the batch, pack its arrays on the host (block
 * tables cut to the widest row the step attends, not max_blocks) and send
 * them in one upload. */
static int upload_batch(llama_t *m, const dsq_kv_layer_t *kl, const dsq_batch_t *b,
                        dev_batch_t *d)
{
    *d = (dev_batch_t){b->tokens, b->pos, b->row_seq, b->slot, b->logit_rows,
                       b->block_tables, b->max_blocks};
    if (dsq_backend_is_host(m->be))
        return DSQ_OK;
    int width = 0;
    int rc = check_batch(m, kl, b, &width);
    if (rc)
        return rc;
    const size_t T = (size_t)b->n_tokens, nl = (size_t)b->n_logits,
                 nbt = (size_t)b->n_seqs * (size_t)width;
    const size_t n = 4 * T + nl + nbt, bytes = n * sizeof(int32_t);
    if (bytes > m->dix_bytes) {
        int32_t *h = realloc(m->hix, bytes);
        if (!h)
            return DSQ_ENOMEM;
        m->hix = h;
        dsq_backend_free(m->be, m->dix);
        m->dix = dsq_backend_alloc(m->be, bytes);
        m->dix_bytes = m->dix ? bytes : 0;
        if (!m->dix)
            return DSQ_ENOMEM;
    }
    const int32_t *src[5] = {b->tokens, b->pos, b->row_seq, b->slot, b->logit_rows};
    const size_t len[5] = {T, T, T, T, nl};
    const int32_t **dst[5] = {&d->tokens, &d->pos, &d->row_seq, &d->slot, &d->logit_rows};
    size_t off = 0;
    for (int i = 0; i < 5; i++) {
        if (len[i])
            memcpy(m->hix + off, src[i], len[i] * sizeof(int32_t));
        *dst[i] = m->dix + off;
        off += len[i];
    }
    for (int s = 0; s < b->n_seqs; s++)
        memcpy(m->hix + off + (size_t)s * width,
               b->block_tables + (int64_t)s * b->max_blocks, (size_t)width * sizeof(int32_t));
    d->block_tables = m->dix + off;
    d->max_blocks = width;
    return dsq_backend_upload(m->be, m->dix, m->hix, bytes);
}

/* Output head on a device backend: logits into backend memory, then to
 * the caller's host buffer. */
static int device_logits(llama_t *m, float *logits, int n_logits)
{
    const size_t bytes = (size_t)n_logits * (size_t)m->cfg.n_vocab * sizeof(float);
    if (bytes > m->dlogits_bytes) {
        dsq_backend_free(m->be, m->dlogits);
        m->dlogits = dsq_backend_alloc(m->be, bytes);
        m->dlogits_bytes = m->dlogits ? bytes : 0;
        if (!m->dlogits)
            return DSQ_ENOMEM;
    }
    int rc = dsq_backend_matmul(m->be, m->dlogits, DSQ_FT_F32, m->h, m->at, n_logits,
                                &m->output);
    if (!rc)
        rc = dsq_backend_download(m->be, logits, m->dlogits, bytes);
    return rc;
}

static int llama_forward(void *graph, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                         float *logits)
{
    llama_t *m = graph;
    const dsq_model_config_t *c = &m->cfg;
    int T = b->n_tokens;
    int rc;
    if (T <= 0 || b->n_logits < 0 || b->n_logits > T)
        return DSQ_EINVAL;
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= T)
            return DSQ_EINVAL;
    for (int i = 0; i < T; i++)
        if (b->row_seq[i] < 0 || b->row_seq[i] >= b->n_seqs || b->pos[i] < 0)
            return DSQ_EINVAL;
    rc = ensure_ws(m, T);
    if (rc)
        return rc;
    int64_t d = c->n_embd, hd = c->head_dim, nh = c->n_head, nkv = c->n_head_kv;
    int64_t ff = c->n_ff;
    float eps = (float)c->rms_eps;
    dsq_backend_t *be = m->be;
    const bool host = dsq_backend_is_host(be);
    const dsq_ftype_t at = m->at;
    dev_batch_t db;
    rc = upload_batch(m, dsq_kv_layer(kv, 0), b, &db);
    if (rc)
        return rc;

    rc = dsq_backend_embed(be, m->x, &m->tok_embd, db.tokens, T);
    if (rc)
        return rc;
    for (int64_t l = 0; l < c->n_layer && rc == DSQ_OK; l++) {
        const layer_weights_t *L = &m->layers[l];
        const dsq_kv_layer_t *kl = dsq_kv_layer(kv, (int)l);
        rc = dsq_backend_rmsnorm(be, m->h, at, m->x, L->attn_norm, T, d, eps);
        m->xp_src = NULL;
        if (!rc) TAP("attn_q", m->h, d);
        if (!rc) rc = linear(m, m->q, m->h, T, d, L->perm_q, &L->wq);
        if (!rc) rc = linear(m, m->k, m->h, T, d, L->perm_k, &L->wk);
        if (!rc) rc = linear(m, m->v, m->h, T, d, L->perm_v, &L->wv);
        if (!rc) rc = dsq_backend_rope(be, m->q, at, T, (int)nh, (int)hd, db.pos, &m->rope);
        if (!rc) rc = dsq_backend_rope(be, m->k, at, T, (int)nkv, (int)hd, db.pos, &m->rope);
        if (!rc) rc = dsq_backend_kv_write(be, kl, m->k, m->v, at, db.slot, T);
        if (!rc) rc = dsq_backend_attention(be, m->att, m->q, at, T, (int)nh, kl, db.row_seq,
                                            db.pos, db.block_tables, db.max_blocks,
                                            m->attn_scale, b->row_seq, b->seq_decode);
        m->xp_src = NULL;
        if (!rc) TAP("attn_output", m->att, nh * hd);
        if (!rc) rc = linear(m, m->h, m->att, T, nh * hd, L->perm_o, &L->wo);
        if (!rc) rc = dsq_backend_add(be, m->x, m->h, at, T * d);
        if (!rc) rc = dsq_backend_rmsnorm(be, m->h, at, m->x, L->ffn_norm, T, d, eps);
        m->xp_src = NULL;
        if (!rc) TAP("ffn_gate", m->h, d);
        if (!rc) rc = linear(m, m->g, m->h, T, d, L->perm_gate, &L->w_gate);
        if (!rc) rc = linear(m, m->u, m->h, T, d, L->perm_up, &L->w_up);
        if (!rc) rc = dsq_backend_swiglu(be, m->g, m->g, m->u, at, T, ff);
        m->xp_src = NULL;
        if (!rc) TAP("ffn_down", m->g, ff);
        if (!rc) rc = linear(m, m->h, m->g, T, ff, L->perm_down, &L->w_down);
        if (!rc) rc = dsq_backend_add(be, m->x, m->h, at, T * d);
    }
    if (!rc && b->n_logits > 0) {
        rc = dsq_backend_gather_rows(be, m->lg, m->x, db.logit_rows, b->n_logits, d, T);
        if (!rc) rc = dsq_backend_rmsnorm(be, m->h, at, m->lg, m->output_norm, b->n_logits,
                                          d, eps);
        if (!rc && host)
            rc = dsq_backend_matmul(be, logits, DSQ_FT_F32, m->h, at, b->n_logits,
                                    &m->output);
        else if (!rc)
            rc = device_logits(m, logits, b->n_logits);
    }
    /* one synchronisation point per step: queued work done, async errors seen */
    if (!rc)
        rc = dsq_backend_sync(be);
    return rc;
}

/* n_head_kv keys and values of head_dim per token and layer. */
static void llama_kv_shape(const dsq_model_config_t *c, int *n_kv_heads, int *head_dim,
                           bool *has_v)
{
    *n_kv_heads = (int)c->n_head_kv;
    *head_dim = (int)c->head_dim;
    *has_v = true;
}

/* What llama_create loads, for a plan without a file; the q/k/v biases
 * when the config declares them (qwen2). */
static void llama_tensors(const dsq_model_config_t *c, dsq_model_tensor_fn fn, void *user)
{
    const int64_t d = c->n_embd, qd = c->n_head * c->head_dim,
                  kvd = c->n_head_kv * c->head_dim, ff = c->n_ff;
    char name[96];
    fn(user, "token_embd.weight", c->n_vocab, d);
    if (!c->tie_word_embeddings)
        fn(user, "output.weight", c->n_vocab, d);
    fn(user, "output_norm.weight", d, 1);
    for (int64_t l = 0; l < c->n_layer; l++) {
        const struct { const char *nm; int64_t n, k; bool on; } t[] = {
            {"attn_norm.weight", d, 1, true},
            {"ffn_norm.weight", d, 1, true},
            {"attn_q.weight", qd, d, true},
            {"attn_k.weight", kvd, d, true},
            {"attn_v.weight", kvd, d, true},
            {"attn_output.weight", d, qd, true},
            {"attn_q.bias", qd, 1, c->attn_qkv_bias},
            {"attn_k.bias", kvd, 1, c->attn_qkv_bias},
            {"attn_v.bias", kvd, 1, c->attn_qkv_bias},
            {"ffn_gate.weight", ff, d, true},
            {"ffn_up.weight", ff, d, true},
            {"ffn_down.weight", d, ff, true},
        };
        for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
            if (!t[i].on)
                continue;
            snprintf(name, sizeof(name), "blk.%lld.%s", (long long)l, t[i].nm);
            fn(user, name, t[i].n, t[i].k);
        }
    }
}

static size_t llama_decode_bytes(const void *graph)
{
    const llama_t *m = graph;
    const int64_t d = m->cfg.n_embd;
    size_t b = dsq__model_weight_size(&m->output) + (size_t)d * sizeof(float);
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        const layer_weights_t *L = &m->layers[l];
        const dsq_weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                    &L->w_down};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
            b += dsq__model_weight_size(ws[i]);
        b += 2 * (size_t)d * sizeof(float);      /* the two norms */
    }
    return b;
}

const dsq_model_arch_t dsq__model_arch_llama = {
    .name = "llama/qwen2",
    .host_only = false,
    .create = llama_create,
    .destroy = llama_destroy,
    .forward = llama_forward,
    .kv_shape = llama_kv_shape,
    .tensors = llama_tensors,
    .built_weights = NULL,       /* every weight is the file's own */
    .decode_bytes = llama_decode_bytes,
};

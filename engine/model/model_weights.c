/* Weight loading shared by the graphs: every linear weight, norm vector
 * and bias a graph reads goes through here into kernel layout, and the
 * model records each block it allocates (freed by dsq_model_destroy) and
 * its bytes (dsq_model_owned_bytes / dsq_model_weight_bytes, which the
 * memory planner's prediction is checked against). The graphs call these
 * and nothing of each other's.
 *
 * Linear weights become a dsq_weight_t through engine/model/quant.c:
 * zero-copy views for the formats the kernels read directly, exact
 * repacking of the other GGUF types and of AWQ/GPTQ, RTN INT4 with
 * --quantize int4. opts->activation_dtype is stamped on each. Vectors are
 * fp32 views of aligned F32 tensors, else fp32 copies. A GPTQ act-order permutation is
 * kept once for consecutive weights that share it (q/k/v, gate/up: same
 * input, same Hessian order); model_llama.c says how the graph applies it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "model_internal.h"
#include "quant.h"
#include "engine/io/tensor.h"

static int keep(dsq_model_t *m, void *p, size_t bytes)
{
    if (!p)
        return DSQ_OK;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **o = realloc(m->owned, (size_t)cap * sizeof(*o));
        if (!o) {
            free(p);
            return DSQ_ENOMEM;
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    m->owned_bytes += bytes;
    return DSQ_OK;
}

/* fp32 copy (or view) of a 1-D tensor of n elements. */
static int load_vec(dsq_model_t *m, const dsq_model_file_t *f, const char *name,
                    int64_t n, bool required, const float **out, char *err,
                    size_t err_len)
{
    const dsq_tensor_t *t = dsq_model_file_find(f, name);
    *out = NULL;
    if (!t) {
        if (required)
            snprintf(err, err_len, "model: tensor %s missing", name);
        return required ? DSQ_ENOTFOUND : DSQ_OK;
    }
    int64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (ne != n) {
        snprintf(err, err_len, "model: tensor %s has %lld elements, expected %lld",
                 name, (long long)ne, (long long)n);
        return DSQ_EFORMAT;
    }
    if (t->type == DSQ_TYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
        *out = t->data;
        m->weight_bytes += (size_t)n * 4;
        return DSQ_OK;
    }
    float *v = malloc((size_t)n * sizeof(*v));
    if (!v)
        return DSQ_ENOMEM;
    const uint8_t *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t->type) {
        case DSQ_TYPE_F32:
            memcpy(&v[i], src + 4 * i, 4);
            break;
        case DSQ_TYPE_F16:
            memcpy(&h, src + 2 * i, 2);
            v[i] = dsq_fp16_to_fp32(h);
            break;
        case DSQ_TYPE_BF16:
            memcpy(&h, src + 2 * i, 2);
            v[i] = dsq_bf16_to_fp32(h);
            break;
        default:
            free(v);
            snprintf(err, err_len, "model: tensor %s has type %s, expected F32/F16/BF16",
                     name, dsq_type_name(t->type));
            return DSQ_EFORMAT;
        }
    }
    *out = v;
    m->weight_bytes += (size_t)n * 4;
    return keep(m, v, (size_t)n * 4);
}

/* Bytes a weight's arrays occupy (data + scales + zeros + super). */
static size_t weight_bytes(const dsq_weight_t *w)
{
    dsq_weight_bytes_t b;
    return dsq_weight_layout(w, &b) == DSQ_OK ? b.total : 0;
}

/* Keep a GPTQ act-order permutation of k entries: reuse the previous one
 * when equal (q/k/v, gate/up), else the model takes ownership. */
static int keep_perm(dsq_model_t *m, int32_t *perm, int64_t k, const int32_t **out)
{
    if (m->last_perm && m->last_perm_k == k &&
        memcmp(m->last_perm, perm, (size_t)k * sizeof(*perm)) == 0) {
        free(perm);
        *out = m->last_perm;
        return DSQ_OK;
    }
    int rc = keep(m, perm, (size_t)k * sizeof(*perm));
    if (rc == DSQ_OK) {
        m->last_perm = perm;
        m->last_perm_k = k;
        m->has_perm = true;
        *out = perm;
    }
    return rc;
}

/* Linear weight named base + ".weight" (or AWQ/GPTQ parts) of shape [n, k].
 * perm_out: where a GPTQ act-order permutation goes (see the file comment);
 * NULL refuses such weights (callers that cannot apply one). */
static int load_linear_p(dsq_model_t *m, const dsq_model_file_t *f,
                         const dsq_model_opts_t *opts, const char *base, int64_t n,
                         int64_t k, bool quantize, bool row_views, dsq_weight_t *w,
                         const int32_t **perm_out, char *err, size_t err_len)
{
    char name[160];
    void *storage = NULL;
    int32_t *perm = NULL;
    int rc;
    memset(w, 0, sizeof(*w));
    snprintf(name, sizeof(name), "%s.weight", base);
    const dsq_tensor_t *t = dsq_model_file_find(f, name);
    if (t) {
        if (t->ne[0] != k || t->ne[1] != n || t->ne[2] != 1 || t->ne[3] != 1) {
            snprintf(err, err_len, "model: tensor %s has shape [%lld, %lld], expected "
                     "[%lld, %lld] (ne[0] = inputs)", name, (long long)t->ne[0],
                     (long long)t->ne[1], (long long)k, (long long)n);
            return DSQ_EFORMAT;
        }
        /* --quantize int4 quantises float (and Q8_0) weights; what the
         * file already quantised lower is kept, repacked exactly */
        if (quantize && opts && opts->quantize && strcmp(opts->quantize, "int4") == 0 &&
            dsq__rtn_source(t->type))
            rc = dsq_quant_rtn_int4(t, opts->group_size ? opts->group_size : 32,
                                    false, w, &storage, err, err_len);
        else
            rc = dsq_quant_from_gguf(t, w, &storage, err, err_len);
    } else {
        const dsq_tensor_t *qw, *qz, *sc, *gi;
        snprintf(name, sizeof(name), "%s.qweight", base);
        qw = dsq_model_file_find(f, name);
        snprintf(name, sizeof(name), "%s.qzeros", base);
        qz = dsq_model_file_find(f, name);
        snprintf(name, sizeof(name), "%s.scales", base);
        sc = dsq_model_file_find(f, name);
        snprintf(name, sizeof(name), "%s.g_idx", base);
        gi = dsq_model_file_find(f, name);
        const dsq_model_config_t *c = dsq_model_file_config(f);
        if (!qw || !sc || !qz) {
            snprintf(err, err_len, "model: tensor %s.weight (or .qweight/.qzeros/.scales) "
                     "missing", base);
            return DSQ_ENOTFOUND;
        }
        if (qw->type != DSQ_TYPE_I32 || qz->type != DSQ_TYPE_I32 ||
            sc->type != DSQ_TYPE_F16 || (gi && gi->type != DSQ_TYPE_I32)) {
            snprintf(err, err_len, "model: %s: packed tensors must be I32 qweight/qzeros, "
                     "F16 scales, I32 g_idx", base);
            return DSQ_EFORMAT;
        }
        if (c->ckpt_quant == DSQ_CKPT_QUANT_AWQ)
            rc = dsq_quant_from_awq(qw->data, qz->data, sc->data, k, n,
                                    c->ckpt_group_size, w, &storage, err, err_len);
        else if (c->ckpt_quant == DSQ_CKPT_QUANT_GPTQ)
            rc = dsq_quant_from_gptq_tensors(qw, qz, sc, gi, k, n, c->ckpt_group_size, w,
                                             &storage, &perm, err, err_len);
        else {
            snprintf(err, err_len, "model: %s is packed but config.json declares no "
                     "AWQ/GPTQ quantization_config", base);
            rc = DSQ_EFORMAT;
        }
    }
    if (perm_out)
        *perm_out = NULL;
    if (rc == DSQ_OK && perm && !perm_out) {
        snprintf(err, err_len, "model: %s uses GPTQ act-order (desc_act) with a row "
                 "permutation, not supported for this tensor", base);
        rc = DSQ_EUNSUPPORTED;
    } else if (rc == DSQ_OK && perm) {
        rc = keep_perm(m, perm, k, perm_out);
        perm = NULL;
        if (rc == DSQ_ENOMEM)
            snprintf(err, err_len, "model: out of memory");
    }
    free(perm);
    if (rc == DSQ_OK && opts)
        w->act = opts->activation_dtype;
    /* On the host, a weight goes into the CPU products' interleaved layout
     * when the CPU has a kernel for it: an INT4 weight with fp16 scales
     * the model owns is regrouped in place (same bytes); Q4_K's and
     * Q5_K's sub-scales are packed to 6 bits as in the file, Q2_K's and
     * Q3_K's INT4 to 2 and 3 bits a weight, Q5_*'s and Q6_K's INT8G to 5
     * and 6, and Q8_0 (a view of the file) copied into tiles,
     * each into a new block, the source released (a weight whose values
     * do not fit stays as it was). Not for weights
     * the graph takes row views of, which need whole rows (an interleaved
     * weight keeps whole tiles of 8). */
    if (rc == DSQ_OK && !row_views && !(opts && opts->rows_layout) &&
        dsq_backend_is_host(m->be) && dsq_cpu_weight_prefers_x8(w)) {
        if (w->format == DSQ_WFMT_INT4 && w->scale_mode == DSQ_SCALE_F16) {
            if (storage)
                rc = dsq_weight_interleave_x8(w);
        } else {
            void *packed = NULL;
            dsq_weight_t p;
            rc = dsq_weight_pack_x8(w, &p, &packed);
            if (rc == DSQ_OK) {
                free(storage);
                storage = packed;
                *w = p;
            } else if (rc == DSQ_EINVAL) {
                rc = DSQ_OK;
            }
        }
        if (rc == DSQ_ENOMEM)
            snprintf(err, err_len, "model: out of memory");
    }
    if (rc == DSQ_OK) {
        size_t b = weight_bytes(w);
        m->weight_bytes += b;
        rc = keep(m, storage, storage ? b : 0);
    } else {
        free(storage);
    }
    return rc;
}

/* ---- shared with the graph files (model_internal.h) */

int dsq__model_load_linear(dsq_model_t *m, const dsq_model_file_t *f,
                           const dsq_model_opts_t *opts, const char *base,
                           int64_t n, int64_t k, bool quantize, dsq_weight_t *w,
                           char *err, size_t err_len)
{
    return load_linear_p(m, f, opts, base, n, k, quantize, false, w, NULL, err, err_len);
}

int dsq__model_load_linear_rows(dsq_model_t *m, const dsq_model_file_t *f,
                                const dsq_model_opts_t *opts, const char *base,
                                int64_t n, int64_t k, bool quantize, dsq_weight_t *w,
                                char *err, size_t err_len)
{
    return load_linear_p(m, f, opts, base, n, k, quantize, true, w, NULL, err, err_len);
}

int dsq__model_load_linear_perm(dsq_model_t *m, const dsq_model_file_t *f,
                                const dsq_model_opts_t *opts, const char *base,
                                int64_t n, int64_t k, bool quantize, dsq_weight_t *w,
                                const int32_t **perm_out, char *err, size_t err_len)
{
    return load_linear_p(m, f, opts, base, n, k, quantize, false, w, perm_out, err,
                         err_len);
}

int dsq__model_load_vec(dsq_model_t *m, const dsq_model_file_t *f, const char *name,
                        int64_t n, bool required, const float **out, char *err,
                        size_t err_len)
{
    return load_vec(m, f, name, n, required, out, err, err_len);
}

dsq_backend_t *dsq__model_backend(const dsq_model_t *m) { return m->be; }

int dsq__model_keep_weight(dsq_model_t *m, void *p, size_t bytes)
{
    if (p)
        m->weight_bytes += bytes;
    return keep(m, p, bytes);
}

size_t dsq__model_weight_size(const dsq_weight_t *w)
{
    dsq_weight_bytes_t b;
    if (!w || w->n < 1 || dsq_weight_layout(w, &b) != DSQ_OK)
        return 0;
    return b.total + (w->bias ? (size_t)w->n * sizeof(float) : 0);
}

/* The public model calls (model.h): what every architecture shares (the
 * load options, the checks on the file made before any weight is
 * allocated, the backend, the record of owned weight memory, the tap),
 * and dispatch of everything else through the architecture's row of the
 * table (model_arch.c). Nothing here depends on one architecture, so a
 * new graph needs no change in this file. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "kernels.h"
#include "model_internal.h"
#include "quant.h"
#include "engine/io/tensor.h"

void dsq_model_set_tap(dsq_model_t *m, dsq_model_tap_fn fn, void *user)
{
    m->tap = fn;
    m->tap_user = user;
}

const dsq_model_config_t *dsq_model_config(const dsq_model_t *m) { return &m->cfg; }
size_t dsq_model_owned_bytes(const dsq_model_t *m) { return m->owned_bytes; }
size_t dsq_model_weight_bytes(const dsq_model_t *m) { return m->weight_bytes; }
size_t dsq_model_decode_bytes(const dsq_model_t *m)
{
    return m->arch->decode_bytes ? m->arch->decode_bytes(m->graph) : 0;
}

/* Every block-quantised tensor of the file is of a type dsq reads
 * (dsq_quant_gguf_readable): checked before any weight is allocated, so a
 * file dsq cannot serve fails at once with the tensor's name and type.
 * Returns 0 or DSQ_EUNSUPPORTED with err set. */
static int check_tensor_types(const dsq_model_file_t *f, char *err, size_t err_len)
{
    const int n = dsq_model_file_n_tensors(f);
    for (int i = 0; i < n; i++) {
        const dsq_tensor_t *t = dsq_model_file_tensor(f, i);
        if (!t || dsq_type_block_elems(t->type) <= 1)
            continue;
        if (!dsq_quant_gguf_readable(t->type)) {
            snprintf(err, err_len, "model: tensor %s has type %s, which dsq does not read "
                     "(docs/quantization.md, GGUF types)", t->name,
                     dsq_type_name(t->type));
            return DSQ_EUNSUPPORTED;
        }
    }
    return DSQ_OK;
}

int dsq_model_act_type(const dsq_model_file_t *f, const char *dtype, bool host,
                       dsq_ftype_t *out, char *err, size_t err_len)
{
    static const struct { const char *name; dsq_ftype_t t; } names[] = {
        {"float16", DSQ_FT_F16}, {"half", DSQ_FT_F16}, {"bfloat16", DSQ_FT_BF16},
        {"float32", DSQ_FT_F32}, {"float", DSQ_FT_F32},
    };
    if (!dtype || !strcmp(dtype, "auto")) {
        *out = DSQ_FT_F32;
        if (host)
            return DSQ_OK;
        *out = DSQ_FT_F16;
        for (int i = 0, n = dsq_model_file_n_tensors(f); i < n; i++) {
            const dsq_tensor_t *t = dsq_model_file_tensor(f, i);
            if (t && t->type == DSQ_TYPE_BF16) {
                *out = DSQ_FT_BF16;
                break;
            }
        }
        return DSQ_OK;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(dtype, names[i].name))
            continue;
        if (host && names[i].t != DSQ_FT_F32) {
            snprintf(err, err_len, "model: dtype %s needs a device backend (the CPU "
                     "backend's activations are float32)", dtype);
            return DSQ_EINVAL;
        }
        *out = names[i].t;
        return DSQ_OK;
    }
    snprintf(err, err_len, "model: unknown dtype '%s' (auto, float16, bfloat16, float32)",
             dtype);
    return DSQ_EINVAL;
}

dsq_ftype_t dsq_model_act(const dsq_model_t *m) { return m->act; }

dsq_model_t *dsq_model_create(const dsq_model_file_t *f,
                              const dsq_model_opts_t *opts, char *err,
                              size_t err_len)
{
    const dsq_model_config_t *c = dsq_model_file_config(f);
    const dsq_model_arch_t *arch = dsq__model_arch_find(c->arch);
    dsq_model_t *m = NULL;

    if (opts && opts->activation_dtype != DSQ_ACT_INT8 &&
        opts->activation_dtype != DSQ_ACT_F32) {
        snprintf(err, err_len, "model: unknown activation dtype %d",
                 (int)opts->activation_dtype);
        return NULL;
    }

    dsq_backend_t *be = opts && opts->backend ? opts->backend : dsq_backend_cpu();
    if (check_tensor_types(f, err, err_len) != DSQ_OK)
        return NULL;
    dsq_ftype_t act;
    if (dsq_model_act_type(f, opts ? opts->dtype : NULL, dsq_backend_is_host(be), &act, err,
                           err_len) != DSQ_OK)
        return NULL;
    if (arch->host_only && !dsq_backend_is_host(be)) {
        snprintf(err, err_len, "model: the %s graph runs on the CPU backend only "
                 "(not yet on %s)", arch->name, dsq_backend_name(be));
        return NULL;
    }
    m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, err_len, "model: out of memory");
        return NULL;
    }
    m->cfg = *c;
    m->be = be;
    m->act = act;
    m->arch = arch;
    m->graph = arch->create(m, f, opts, err, err_len);
    if (!m->graph) {
        dsq_model_destroy(m);
        m = NULL;
    }
    return m;
}

void dsq_model_destroy(dsq_model_t *m)
{
    if (!m)
        return;
    if (m->graph)
        m->arch->destroy(m->graph);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m);
}

int dsq_model_forward(dsq_model_t *m, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                      float *logits)
{
    return m->arch->forward(m->graph, kv, b, logits);
}

int dsq_model_n_mtp(const dsq_model_t *m)
{
    return m->arch->n_mtp ? m->arch->n_mtp(m->graph) : 0;
}

int dsq_model_kv_layers(const dsq_model_t *m)
{
    return (int)m->cfg.n_layer + dsq_model_n_mtp(m);
}

const float *dsq_model_hidden(const dsq_model_t *m, int *n_rows)
{
    *n_rows = 0;
    return m->arch->hidden ? m->arch->hidden(m->graph, n_rows) : NULL;
}

int dsq_model_mtp_forward(dsq_model_t *m, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                          const float *hidden, float *logits)
{
    if (dsq_model_n_mtp(m) == 0)
        return DSQ_EUNSUPPORTED;
    return m->arch->mtp_forward(m->graph, kv, b, hidden, logits);
}

void dsq_model_kv_shape(const dsq_model_t *m, int *n_kv_heads, int *head_dim,
                        bool *has_v)
{
    m->arch->kv_shape(&m->cfg, n_kv_heads, head_dim, has_v);
}

void dsq_model_arch_kv_shape(const dsq_model_config_t *c, int *n_kv_heads,
                             int *head_dim, bool *has_v)
{
    dsq__model_arch_find(c->arch)->kv_shape(c, n_kv_heads, head_dim, has_v);
}

void dsq_model_arch_tensors(const dsq_model_config_t *c, dsq_model_tensor_fn fn,
                            void *user)
{
    dsq__model_arch_find(c->arch)->tensors(c, fn, user);
}

int64_t dsq_model_arch_built_weights(const dsq_model_config_t *c, const char *name,
                                     int64_t *n, int64_t *k)
{
    const dsq_model_arch_t *arch = dsq__model_arch_find(c->arch);
    return arch->built_weights ? arch->built_weights(c, name, n, k) : 0;
}

bool dsq_model_arch_host_only(dsq_arch_t arch)
{
    return dsq__model_arch_find(arch)->host_only;
}

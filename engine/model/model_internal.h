/* Internals shared by the model graph files (engine/model/model.c, the llama/qwen2
 * graph and the owner of dsq_model_t, and engine/model/model_deepseek2.c, the
 * DeepSeek-V2/V3 MLA + MoE graph). Not an API.
 *
 * dsq_model_t stays opaque to the DeepSeek graph: it borrows model.c's
 * weight loaders (which record every allocation and byte count in the
 * model) and model.c dispatches create/forward/destroy to it when the
 * architecture is deepseek2. */
#ifndef DSQ_MODEL_INTERNAL_H
#define DSQ_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "kernels.h"
#include "model.h"

typedef struct dsq_ds2 dsq_ds2_t;

/* Load the linear weight base + ".weight" (or AWQ/GPTQ parts) of shape
 * [n, k] (n outputs) into *w; RTN INT4 when quantize is true and opts ask
 * for int4. Storage is owned by m. Returns 0 or a DSQ_E* with err set. */
int dsq__model_load_linear(dsq_model_t *m, const dsq_model_file_t *f,
                           const dsq_model_opts_t *opts, const char *base,
                           int64_t n, int64_t k, bool quantize, dsq_weight_t *w,
                           char *err, size_t err_len);
/* fp32 view or copy of a 1-D tensor of n elements (NULL + 0 if absent and
 * not required). Storage is owned by m. */
int dsq__model_load_vec(dsq_model_t *m, const dsq_model_file_t *f, const char *name,
                        int64_t n, bool required, const float **out, char *err,
                        size_t err_len);
/* True for the GGUF tensor types --quantize int4 requantises (F32, F16,
 * BF16, Q8_0); every lower-bit type is kept as the file quantised it. */
static inline bool dsq__rtn_source(dsq_type_t t)
{
    return t == DSQ_TYPE_F32 || t == DSQ_TYPE_F16 || t == DSQ_TYPE_BF16 ||
           t == DSQ_TYPE_Q8_0;
}

/* m takes ownership of the malloc'd block p (weight memory of `bytes`
 * bytes, counted in both owned and weight bytes). On DSQ_ENOMEM p is
 * freed. p == NULL is a no-op. */
int dsq__model_keep_weight(dsq_model_t *m, void *p, size_t bytes);

/* The backend m runs on (opts->backend, else dsq_backend_cpu()). */
dsq_backend_t *dsq__model_backend(const dsq_model_t *m);

/* The DeepSeek-V2/V3 graph (engine/model/model_deepseek2.c). create loads every
 * weight through the helpers above; NULL + err on failure. */
dsq_ds2_t *dsq__ds2_create(dsq_model_t *m, const dsq_model_file_t *f,
                           const dsq_model_opts_t *opts, char *err, size_t err_len);
void dsq__ds2_destroy(dsq_ds2_t *g);
int dsq__ds2_forward(dsq_ds2_t *g, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                     float *logits);

#endif

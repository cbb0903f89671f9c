/* Internals shared by the files of engine/model/. Not an API.
 *
 * A model is the part every architecture shares (struct dsq_model below:
 * config, backend, the record of the weight memory it owns, the
 * activation tap) plus the state of its architecture's graph, which only
 * that graph's file knows. model.c runs every public call through the
 * graph's row of the architecture table (model_arch.c), so adding an
 * architecture is one file defining a dsq_model_arch_t and one row there;
 * model.c names no architecture. The graphs load their weights with the
 * shared helpers below, never through each other. */
#ifndef DSQ_MODEL_INTERNAL_H
#define DSQ_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "kernels.h"
#include "model.h"

/* One architecture's graph. The functions run on the engine thread, like
 * the public calls that reach them. */
typedef struct dsq_model_arch {
    const char *name;        /* the graph, in messages ("deepseek2")         */
    bool host_only;          /* runs on host backends only: dsq_model_create
                                refuses a device backend before loading     */
    /* Check m->cfg, load every weight through the helpers below (they
     * record the memory in m) and build the graph's state. Returns the
     * state, or NULL + err; the state frees itself on failure. */
    void *(*create)(dsq_model_t *m, const dsq_model_file_t *f,
                    const dsq_model_opts_t *opts, char *err, size_t err_len);
    /* Free the state (not the weights recorded in the model, which
     * dsq_model_destroy frees after). */
    void (*destroy)(void *graph);
    /* dsq_model_forward, with the same contract. */
    int (*forward)(void *graph, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                   float *logits);
    /* dsq_model_kv_shape, from the config alone. */
    void (*kv_shape)(const dsq_model_config_t *c, int *n_kv_heads, int *head_dim,
                     bool *has_v);
    /* dsq_model_arch_tensors: the tensors create loads. */
    void (*tensors)(const dsq_model_config_t *c, dsq_model_tensor_fn fn, void *user);
    /* dsq_model_arch_built_weights; NULL when the graph builds none. */
    int64_t (*built_weights)(const dsq_model_config_t *c, const char *name, int64_t *n,
                             int64_t *k);
    /* dsq_model_decode_bytes of the loaded graph. */
    size_t (*decode_bytes)(const void *graph);
    /* The multi-token prediction module, all NULL for a graph without one:
     * modules loaded, the last forward's hidden states, the module's
     * forward (dsq_model_n_mtp, dsq_model_hidden, dsq_model_mtp_forward). */
    int (*n_mtp)(const void *graph);
    const float *(*hidden)(const void *graph, int *n_rows);
    int (*mtp_forward)(void *graph, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                       const float *hidden, float *logits);
} dsq_model_arch_t;

/* The rows (model_llama.c, model_deepseek2.c). */
extern const dsq_model_arch_t dsq__model_arch_llama;
extern const dsq_model_arch_t dsq__model_arch_deepseek2;

/* The row serving arch (model_arch.c). An architecture without a row
 * gets the first one (llama): its create refuses it by name, and its
 * config queries answer as they would for llama. */
const dsq_model_arch_t *dsq__model_arch_find(dsq_arch_t arch);

/* Written by dsq_model_create (cfg, be, arch, graph), by the weight
 * helpers (owned .. has_perm) and by dsq_model_set_tap; the graphs read
 * cfg, be, has_perm and the tap. */
struct dsq_model {
    dsq_model_config_t cfg;
    dsq_backend_t *be;       /* not owned: opts->backend or dsq_backend_cpu() */
    const dsq_model_arch_t *arch;
    void *graph;             /* arch's state, freed by arch->destroy */
    dsq_ftype_t act;         /* activations between products (model.h)  */

    void **owned;            /* malloc'd blocks the model frees */
    int n_owned, cap_owned;
    size_t owned_bytes, weight_bytes;

    /* GPTQ act-order: the last permutation loaded (shared when equal) */
    const int32_t *last_perm;
    int64_t last_perm_k;
    bool has_perm;           /* some weight carries a permutation */

    dsq_model_tap_fn tap;    /* == activation tap (quant): see model.h == */
    void *tap_user;
};

/* ---- weight loading (model_weights.c) */

/* Bytes of w's arrays (dsq_weight_layout) plus its bias; 0 for an empty
 * or invalid weight. */
size_t dsq__model_weight_size(const dsq_weight_t *w);

/* Load the linear weight base + ".weight" (or AWQ/GPTQ parts) of shape
 * [n, k] (n outputs) into *w; RTN INT4 when quantize is true and opts ask
 * for int4. On the host backend an INT4 weight may come back as
 * DSQ_WFMT_INT4_X8 (dsq_cpu_weight_prefers_x8), whose row views must be
 * whole tiles of 8 rows. Storage is owned by m. Returns 0 or a DSQ_E* with
 * err set. */
int dsq__model_load_linear(dsq_model_t *m, const dsq_model_file_t *f,
                           const dsq_model_opts_t *opts, const char *base,
                           int64_t n, int64_t k, bool quantize, dsq_weight_t *w,
                           char *err, size_t err_len);
/* As dsq__model_load_linear, but the weight keeps whole rows (never
 * interleaved): for a graph that takes row views at any offset. */
int dsq__model_load_linear_rows(dsq_model_t *m, const dsq_model_file_t *f,
                                const dsq_model_opts_t *opts, const char *base,
                                int64_t n, int64_t k, bool quantize, dsq_weight_t *w,
                                char *err, size_t err_len);
/* As dsq__model_load_linear, for a graph that applies GPTQ act-order
 * permutations: *perm_out is the weight's permutation of its k inputs
 * (NULL for none; owned by m, shared between consecutive weights with
 * the same one). dsq__model_load_linear refuses such weights. */
int dsq__model_load_linear_perm(dsq_model_t *m, const dsq_model_file_t *f,
                                const dsq_model_opts_t *opts, const char *base,
                                int64_t n, int64_t k, bool quantize, dsq_weight_t *w,
                                const int32_t **perm_out, char *err, size_t err_len);
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

#endif

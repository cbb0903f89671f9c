/* Memory planner: how much memory a model will take and how many KV-cache
 * blocks fit, computed before a byte of weights is loaded.
 *
 * Sources of the formulas:
 *  - weights: exact, from the tensor table (shape x format after repacking,
 *    the same byte counts as kernels/kernels.h dsq_weight_*_bytes), or, for
 *    a directory holding only config.json, from the architecture's tensor
 *    shapes in the --quantize format (INT4) or FP16;
 *  - KV bytes per token: 2 x n_layers x n_kv_heads x head_dim x
 *    bytes_per_elem for MHA/GQA (vLLM, "PagedAttention", Kwon et al. 2023);
 *    for MLA (DeepSeek-V2, arXiv:2405.04434 sec. 2.1) the cached compressed
 *    latent plus the decoupled RoPE key: n_layers x (kv_lora_rank +
 *    qk_rope_head_dim) x bytes_per_elem. INT8 KV adds one fp16 scale and one
 *    fp16 zero per 64 values;
 *  - activation workspace of the largest step (max_num_batched_tokens rows
 *    of every intermediate buffer plus logits for max_num_seqs rows, and
 *    for the draft rows speculative decoding may add);
 *  - the coarse rule 1.25 x params / 2 bytes for INT4 weights, printed
 *    beside the exact figure so users see how far off it is.
 */
#ifndef DSQ_PLANNER_H
#define DSQ_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "engine/io/model_config.h"
#include "engine/io/tensor.h"

/* Inputs of a plan (zero = default for every numeric field). */
typedef struct dsq_plan_opts {
    int block_size;               /* tokens per block, default 16             */
    dsq_kv_dtype_t kv_dtype;
    int max_model_len;            /* default: the model's n_ctx_train         */
    int max_num_seqs;             /* default 256                              */
    int max_num_batched_tokens;   /* default 2048                             */
    int64_t budget_bytes;         /* total memory for weights+KV+workspace;
                                     default: half of physical RAM (CPU)      */
    int64_t kv_cache_bytes;       /* explicit KV budget: overrides the rest;
                                     default: what the budget leaves after
                                     weights and workspace, capped at 4 GiB
                                     (vLLM CPU's default KV space) and at
                                     max_num_seqs x max_model_len tokens      */
    const char *quantize;         /* "int4" = RTN linear weights at load      */
    bool host_x8;                 /* the host moves weights into their
                                     interleaved twins (dsq_cpu_has_x8 for
                                     the activation dtype): the GGUF tensors
                                     with one (dsq_weight_x8_twin), but the
                                     row-viewed attn_kv_b, count its bytes
                                     (Q2_K .. Q6_K, Q5_0, Q5_1 in their
                                     file's bits, not 4 or 8)               */
    int group_size;               /* INT4 group with quantize (default 32)    */
    int spec_rows;                /* speculative decoding: logits rows a step
                                     may add for drafts (engine.h: spec_k x
                                     spec_max_batch); 0 without it          */
    bool mtp;                     /* the model loads its multi-token
                                     prediction modules (model.h): their
                                     tensors (blk.<n_layer + i>.*) count,
                                     and their KV layers; without it those
                                     tensors are not loaded, so not counted */
    int64_t draft_bytes;          /* a speculative draft model's weights, KV
                                     cache and workspace (its own plan, made
                                     by the caller): taken from the budget
                                     before the KV cache, like the weights  */
    /* A device backend (CUDA): budget_bytes is then the caller's
     * min(total x gpu_memory_utilization - in use, free) of the device_* figures;
     * KV takes all the budget leaves (no CPU 4 GiB cap, still at most
     * max_num_seqs x max_model_len tokens) and overhead_bytes counts the
     * device buffers a step needs besides the workspace (below). */
    bool device;
    int act_bytes;                /* bytes of an activation element between
                                     products (dsq_model_act: 2 for fp16 /
                                     bf16 on a device; 0 or 4: fp32); the
                                     residual stream and logits are fp32    */
    const char *device_desc;      /* dsq_backend_describe, for the output     */
    int64_t device_total_bytes, device_free_bytes;
    double gpu_memory_utilization;
} dsq_plan_opts_t;

/* Weight classes reported separately. */
enum {
    DSQ_PLAN_EMBED = 0,   /* token embedding                                */
    DSQ_PLAN_ATTN,        /* attention projections (+ MLA low-rank parts)   */
    DSQ_PLAN_FFN,         /* dense MLP and shared experts                   */
    DSQ_PLAN_EXPERTS,     /* routed experts and the router                  */
    DSQ_PLAN_OUTPUT,      /* lm_head (0 when tied)                          */
    DSQ_PLAN_NORM,        /* norms and biases (fp32)                        */
    DSQ_PLAN_MLA_ABSORBED,/* deepseek2 with a whole kv_b_proj (HF, older
                             GGUF): the per-head W_UK_h^T [kv_lora_rank,
                             qk_nope] copies the engine builds for the
                             absorbed MLA form (a transpose; W_UV_h is a
                             view of kv_b_proj), F32 or INT4 with quantize;
                             0 for llama.cpp's split attn_k_b/attn_v_b
                             GGUFs, whose slices are used in place          */
    DSQ_PLAN_N_CLASSES
};

/* A plan. All sizes in bytes, counts in tokens/blocks/sequences. */
typedef struct dsq_plan {
    int64_t weight_bytes;                        /* exact, all classes      */
    int64_t class_bytes[DSQ_PLAN_N_CLASSES];
    int64_t n_params;                            /* weights' element count  */
    int64_t coarse_estimate_bytes;               /* 1.25 * n_params / 2     */
    int64_t kv_bytes_per_token;
    int64_t block_bytes;                         /* kv_bytes_per_token*bs   */
    int64_t workspace_bytes;
    int64_t overhead_bytes;                      /* CPU: 0. Device: the step's
                                                    index arrays, GPTQ
                                                    act-order permutations
                                                    and gather buffer      */
    int64_t budget_bytes;
    int64_t draft_bytes;                         /* dsq_plan_opts_t's       */
    int64_t kv_budget_bytes;
    const char *kv_budget_source;                /* users: why the KV budget
                                                    is what it is (static
                                                    text: the flag that set
                                                    it, or the cap that
                                                    bounded it and the flag
                                                    that lifts it)         */
    int64_t num_blocks;
    int64_t max_tokens;                          /* num_blocks * block_size */
    int max_model_len;
    int block_size;
    double max_concurrent_seqs;                  /* max_tokens/max_model_len*/
    bool weights_from_config;                    /* no tensor table given   */
    bool device;                                 /* planned for a device    */
    char device_desc[192];
    int64_t device_total_bytes, device_free_bytes;
    double gpu_memory_utilization;
} dsq_plan_t;

/* KV-cache bytes per token for the architecture (all layers, K and V or the
 * MLA latent). */
int64_t dsq_plan_kv_bytes_per_token(const dsq_model_config_t *c, dsq_kv_dtype_t dt);

/* Build a plan. tensors may be NULL (n_tensors 0): weight shapes then come
 * from the config. Returns 0, DSQ_EINVAL (bad config/options, err says
 * which) or DSQ_ERANGE (the budget does not even hold the weights, or an
 * explicit kv_cache_bytes with the weights and workspace exceeds it; err
 * names the flags that fix it; the plan is still filled so the caller can
 * print the numbers). */
int dsq_plan_compute(const dsq_model_config_t *c, const dsq_tensor_t *const *tensors,
                     int n_tensors, const dsq_plan_opts_t *o, dsq_plan_t *out,
                     char *err, size_t err_len);

/* users: when one sequence of max_model_len does not fit the plan's KV
 * blocks, write the refusal into buf: the numbers and what to do ("use
 * --max-model-len N or lower", N the tokens the blocks hold, "or raise
 * --kv-cache-memory / --memory-limit" or "--gpu-memory-utilization" on a
 * device) and return true; false (buf untouched) when it fits. */
bool dsq_plan_fit_advice(const dsq_plan_t *p, char *buf, size_t n);

/* Half of physical memory, the default CPU budget. */
int64_t dsq_plan_default_budget(void);

/* Human-readable table / JSON object of a plan into a malloc'd string the
 * caller frees (NULL on out-of-memory). JSON keys: weight_bytes,
 * kv_bytes_per_token, block_bytes, num_blocks, max_tokens,
 * max_concurrent_seqs, coarse_estimate_bytes, workspace_bytes,
 * overhead_bytes, budget_bytes, draft_bytes, kv_budget_bytes, kv_budget_source, max_model_len,
 * block_size, n_params, weights_by_class{...}, and "device": "cpu", or
 * for a device plan an object {backend, total_bytes, free_bytes,
 * gpu_memory_utilization}. */
char *dsq_plan_format_table(const dsq_plan_t *p, const dsq_model_config_t *c);
char *dsq_plan_format_json(const dsq_plan_t *p, const dsq_model_config_t *c);

#endif

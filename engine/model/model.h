/* The model graph: weights in kernel layout and the forward pass over a
 * ragged batch, one graph per architecture behind the same calls:
 * llama and qwen2 (engine/model/model_llama.c), deepseek2, MLA + MoE
 * (engine/model/model_deepseek2.c).
 *
 * Architecture sources: LLaMA (Touvron et al. 2023; pre-RMSNorm, SwiGLU,
 * RoPE, GQA), Qwen2 (Yang et al. 2024; biases on q/k/v), as implemented by
 * transformers' modeling_llama.py / modeling_qwen2.py and llama.cpp.
 *
 * A forward call takes any mix of prefill chunks and decode tokens (no
 * padding): each token row carries its sequence (block table row) and
 * position; logits are computed only for the rows that ask for them.
 * Not thread-safe: one engine thread owns a model (the CPU ops parallelise
 * internally). Ops run on the model's backend (engine/backend/backend.h);
 * a forward call ends with the backend's synchronisation point, so its
 * logits are in host memory when it returns.
 */
#ifndef DSQ_MODEL_H
#define DSQ_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/io/model_config.h"

typedef struct dsq_model dsq_model_t;

/* Load options. */
typedef struct dsq_model_opts {
    const char *quantize;      /* NULL/"none": keep file formats; "int4": RTN
                                  every 16/32-bit or Q8_0 linear weight      */
    int group_size;            /* for quantize=int4: 32, 64 or 128 (def. 32) */
    dsq_act_dtype_t activation_dtype; /* set on every quantised linear weight
                                  (kernels.h): DSQ_ACT_INT8 (0, default) or
                                  DSQ_ACT_F32 (fp32 activations, exact up to
                                  fp32 rounding, slower)                     */
    dsq_backend_t *backend;    /* where weights live and ops run; not owned,
                                  must outlive the model. NULL: the CPU
                                  backend (dsq_backend_cpu). A device backend
                                  gets a copy of every weight at create; the
                                  KV cache passed to forward must then be in
                                  its memory too. deepseek2 needs a host
                                  backend (for now).                         */
    bool rows_layout;          /* keep INT4 weights in row order on the host
                                  instead of the CPU products' interleaved
                                  layout (dsq_cpu_weight_prefers_x8): for
                                  measuring the layout, dsq-bench cpu
                                  --layout rows; results are bitwise equal   */
    const char *dtype;         /* activation type between the products on a
                                  device backend (vLLM's --dtype): NULL or
                                  "auto", "float16"/"half", "bfloat16",
                                  "float32"/"float"; dsq_model_act_type
                                  resolves it. Host backends take fp32 only
                                  (auto, float32).                          */
    bool mtp;                  /* also load the multi-token prediction
                                  modules a DeepSeek-V3 checkpoint carries
                                  (dsq_model_n_mtp); off: they are not read */
} dsq_model_opts_t;

/* Build the model from an open model file (which must outlive the model:
 * weights may point into its mapping). NULL + err on failure (missing or
 * mis-shaped tensor named in err, unsupported architecture or format). */
dsq_model_t *dsq_model_create(const dsq_model_file_t *f,
                              const dsq_model_opts_t *opts, char *err,
                              size_t err_len);
void dsq_model_destroy(dsq_model_t *m);   /* NULL is a no-op */

const dsq_model_config_t *dsq_model_config(const dsq_model_t *m);

/* The activation type a model of file f gets on a host (host true) or
 * device backend with the opts->dtype string dtype (NULL = "auto"): host:
 * fp32; device: the named type, or for auto bf16 when the file stores any
 * BF16 tensor (a bf16-trained model's activations may leave fp16's range,
 * 65504) and fp16 otherwise. The residual stream, norm statistics and
 * logits stay fp32 whatever the type (engine/model/model_llama.c).
 * Returns 0, or DSQ_EINVAL with a one-line reason in err (an unknown
 * name, or a narrow type asked of a host backend). */
int dsq_model_act_type(const dsq_model_file_t *f, const char *dtype, bool host,
                       dsq_ftype_t *out, char *err, size_t err_len);
/* The loaded model's activation type (dsq_model_act_type). */
dsq_ftype_t dsq_model_act(const dsq_model_t *m);
/* Bytes of weight memory the model allocated itself (repacked or
 * converted weights; zero-copy views of the file are not counted). */
size_t dsq_model_owned_bytes(const dsq_model_t *m);
/* Bytes of all weights as the kernels read them (owned + mapped views). */
size_t dsq_model_weight_bytes(const dsq_model_t *m);
/* Bytes of weights one decode step reads per token: every linear weight
 * the token passes through and the output head, the embedding row not;
 * for a MoE layer the router, the shared experts and num_experts_per_tok
 * routed experts. Over DRAM bandwidth it is the decode ceiling
 * (dsq-bench cpu). */
size_t dsq_model_decode_bytes(const dsq_model_t *m);

/* Shape of the KV cache the model's forward pass expects, for
 * dsq_kv_create_ex: llama/qwen2 n_head_kv x head_dim keys and values;
 * deepseek2 (MLA) one vector of kv_lora_rank + qk_rope_head_dim values per
 * token and layer (latent + rope key) and no V pool (*has_v false). This is
 * what dsq_plan_kv_bytes_per_token counts. */
void dsq_model_kv_shape(const dsq_model_t *m, int *n_kv_heads, int *head_dim,
                        bool *has_v);

/* == per architecture, from a config alone: what the memory planner
 * (engine/serve/planner.c) asks before any weight is loaded. An
 * architecture without a graph is answered as llama. == */

/* dsq_model_kv_shape of a model with config c. */
void dsq_model_arch_kv_shape(const dsq_model_config_t *c, int *n_kv_heads,
                             int *head_dim, bool *has_v);

/* One weight tensor: its name as the loader spells it
 * ("blk.3.attn_q.weight"), n outputs x k inputs (k = 1 for a vector). */
typedef void (*dsq_model_tensor_fn)(void *user, const char *name, int64_t n,
                                    int64_t k);
/* Call fn once per weight tensor the graph of c loads, in no particular
 * order: the tensor table of a Hugging Face checkpoint with this
 * config.json, for a plan made without one. */
void dsq_model_arch_tensors(const dsq_model_config_t *c, dsq_model_tensor_fn fn,
                            void *user);

/* Weights the graph of c builds at load from the file tensor `name`, on
 * top of the file's own: returns how many, each [*n, *k], F32 (RTN INT4
 * with quantize "int4"); 0 for none. deepseek2 builds n_head W_UK_h^T
 * [kv_lora_rank, qk_nope_head_dim] from each whole kv_b_proj. */
int64_t dsq_model_arch_built_weights(const dsq_model_config_t *c, const char *name,
                                     int64_t *n, int64_t *k);

/* True when the architecture's graph runs on host backends only (then
 * dsq_model_create refuses a device backend). */
bool dsq_model_arch_host_only(dsq_arch_t arch);

/* One forward step.
 *   tokens/pos/row_seq/slot: [n_tokens]; token ids, positions, the block
 *     table row of each token, and its KV cache slot.
 *   block_tables: [n_seqs][max_blocks] int32.
 *   logit_rows: [n_logits] token rows whose logits are wanted.
 * KV entries for every (row_seq, pos) are written before attention, so a
 * token attends to itself and everything before it in its sequence. */
typedef struct dsq_batch {
    int n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *row_seq;
    const int32_t *slot;
    int n_seqs;
    const int32_t *block_tables;
    int max_blocks;
    int n_logits;
    const int32_t *logit_rows;
    const uint8_t *seq_decode;   /* [n_seqs] or NULL: sequence s is decoding
                                    (its rows are its pending token and
                                    speculative drafts), so its rows are
                                    attended as decode rows, with the bits
                                    plain decoding gives (kernels.h
                                    dsq_cpu_attention_ex)                 */
} dsq_batch_t;

/* Run one step. logits: [n_logits][n_vocab] fp32, caller-owned (host).
 * Returns 0, DSQ_EINVAL (bad batch), DSQ_ERANGE (token id out of vocab,
 * slot or attended block out of the cache), DSQ_ENOMEM, and on a device
 * backend DSQ_EUNSUPPORTED (an op or KV dtype the backend lacks, e.g. an
 * F32 KV cache on CUDA) or DSQ_ECUDA (a launch or the step's
 * synchronisation failed; the CUDA reason is logged). */
int dsq_model_forward(dsq_model_t *m, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                      float *logits);

/* == multi-token prediction (DeepSeek-V3, arXiv:2412.19437 sec. 2.2; served
 * as vLLM's deepseek_mtp.py runs it) ==
 * A module after the decoder layers that, at position i, takes the main
 * model's final hidden state h_i and the embedding of token i + 1 and
 * predicts token i + 2: a speculative decoding proposer (engine.h
 * spec_mtp). Its attention has its own KV: the cache's layer n_layer. */

/* MTP modules loaded (dsq_model_opts_t.mtp and the checkpoint has them):
 * 0 or 1 (the first of num_nextn_predict_layers; V3 ships one). */
int dsq_model_n_mtp(const dsq_model_t *m);
/* Layers a KV cache for m must have: n_layer + dsq_model_n_mtp. */
int dsq_model_kv_layers(const dsq_model_t *m);
/* The last dsq_model_forward's final hidden states, before the output
 * norm: [*n_rows][n_embd] fp32 in batch row order, owned by the model,
 * valid until its next forward or MTP forward. NULL (and *n_rows 0) for a
 * graph that keeps none (llama) or before any forward. */
const float *dsq_model_hidden(const dsq_model_t *m, int *n_rows);
/* Run the MTP module over b, whose row r is the pair (h, token): tokens[r]
 * = the token after position pos[r] (token pos + 1), hidden + r * n_embd =
 * the main model's final hidden state at pos[r] (dsq_model_hidden's rows,
 * before the output norm; may be that very buffer); slots and block tables
 * as the main forward's for pos[r] (the module's KV is written to layer
 * n_layer of the same slots). logits: [n_logits][n_vocab] fp32, the
 * module's prediction of token pos + 2 at each logit row. Returns as
 * dsq_model_forward; DSQ_EUNSUPPORTED when no module is loaded. */
int dsq_model_mtp_forward(dsq_model_t *m, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                          const float *hidden, float *logits);

/* == activation tap (owner: quant; used by tools/dsq-quantize for AWQ/GPTQ
 * calibration) ==
 * Called by dsq_model_forward with the fp32 input activations of each linear
 * input site, before the matmul, on the engine thread:
 *   layer: 0..n_layer-1; site: "attn_q" (input of q/k/v, after attn_norm),
 *   "attn_output" (input of o_proj), "ffn_gate" (input of gate/up, after
 *   ffn_norm), "ffn_down" (input of down_proj, after SwiGLU);
 *   x: [n_tokens][k] fp32 row-major, read-only, valid only during the call.
 * fn NULL removes the tap. No effect on the forward result. Host backends
 * only: on a device backend the tap is never called. */
typedef void (*dsq_model_tap_fn)(void *user, int layer, const char *site,
                                 const float *x, int n_tokens, int64_t k);
void dsq_model_set_tap(dsq_model_t *m, dsq_model_tap_fn fn, void *user);

#endif

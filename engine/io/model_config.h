/* One architecture description for every model format.
 *
 * Filled from Hugging Face config.json (field names of transformers'
 * LlamaConfig, Qwen2Config, DeepseekV2Config), from GGUF metadata
 * (`<arch>.*` keys, ggml docs/gguf.md "Standardized key-value pairs"), or from
 * a llama2.c header. Shape fields are element counts; lengths are tokens.
 */
#ifndef DSQ_MODEL_CONFIG_H
#define DSQ_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Context length (n_ctx_train) bounds, tokens. A file that gives none gets
 * DSQ_MODEL_CTX_DEFAULT, transformers' LlamaConfig max_position_embeddings
 * default (and what the planner assumed before it was filled in here).
 * DSQ_MODEL_CTX_MAX = 2^24 is dsqd's --max-model-len bound and above every
 * model we know of (the longest, such as Llama 4 Scout, declare about 10M):
 * a larger value is a damaged field, e.g. 2^32-1 written for "unknown". */
#define DSQ_MODEL_CTX_DEFAULT 2048
#define DSQ_MODEL_CTX_MAX (1 << 24)

typedef enum dsq_arch {
    DSQ_ARCH_UNKNOWN = 0,
    DSQ_ARCH_LLAMA,      /* DeepSeek-Coder/LLM, R1-Distill-Llama, SmolLM2, TinyStories */
    DSQ_ARCH_QWEN2,      /* R1-Distill-Qwen: QKV bias                                  */
    DSQ_ARCH_DEEPSEEK2,  /* DeepSeek-V2/V2-Lite/Coder-V2/V3: MLA + MoE                 */
} dsq_arch_t;

typedef enum dsq_rope_scaling {
    DSQ_ROPE_SCALING_NONE = 0,
    DSQ_ROPE_SCALING_LINEAR,
    DSQ_ROPE_SCALING_DYNAMIC,
    DSQ_ROPE_SCALING_YARN,
    DSQ_ROPE_SCALING_LLAMA3,     /* HF rope_type "llama3" (R1-Distill-Llama-8B) */
} dsq_rope_scaling_t;

/* Which checkpoint quantization the file declares (HF quantization_config). */
typedef enum dsq_ckpt_quant {
    DSQ_CKPT_QUANT_NONE = 0,
    DSQ_CKPT_QUANT_AWQ,
    DSQ_CKPT_QUANT_GPTQ,
} dsq_ckpt_quant_t;

typedef struct dsq_model_config {
    dsq_arch_t arch;
    char name[128];              /* general.name / _name_or_path, may be empty */

    int64_t n_vocab;             /* embedding rows (vocab_size)                 */
    int64_t n_embd;              /* hidden_size                                 */
    int64_t n_layer;             /* num_hidden_layers                           */
    int64_t n_head;              /* num_attention_heads                         */
    int64_t n_head_kv;           /* num_key_value_heads (= n_head if absent)    */
    int64_t head_dim;            /* head_dim (default n_embd / n_head)          */
    int64_t n_ff;                /* intermediate_size                           */
    int64_t n_ctx_train;         /* max_position_embeddings: 1..DSQ_MODEL_CTX_MAX */
    double rms_eps;              /* rms_norm_eps                                */
    bool tie_word_embeddings;    /* lm_head shares token_embd                   */
    bool attn_qkv_bias;          /* qwen2: biases on q/k/v projections          */
    bool rope_neox;              /* rotate halves (HF/neox) vs adjacent pairs   */

    /* RoPE */
    double rope_theta;
    int64_t rope_dim;            /* rotated dims per head (= head_dim usually)  */
    dsq_rope_scaling_t rope_scaling;
    double rope_factor;          /* linear/dynamic/yarn factor                  */
    int64_t rope_orig_ctx;       /* original_max_position_embeddings (yarn)     */
    double yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    double rope_low_freq_factor, rope_high_freq_factor;  /* llama3 scaling   */

    /* DeepSeek-V2 MLA */
    int64_t q_lora_rank;         /* 0 = no query low-rank path (V2-Lite)        */
    int64_t kv_lora_rank;
    int64_t qk_nope_head_dim;
    int64_t qk_rope_head_dim;
    int64_t v_head_dim;

    /* DeepSeek-V2 MoE */
    int64_t first_k_dense_replace;
    int64_t moe_layer_freq;
    int64_t n_routed_experts;
    int64_t n_shared_experts;
    int64_t n_experts_per_tok;
    int64_t moe_intermediate_size;
    bool norm_topk_prob;
    double routed_scaling_factor;
    char topk_method[32];        /* "greedy", "group_limited_greedy", "noaux_tc" */
    char scoring_func[16];       /* "softmax" or "sigmoid"                      */
    int64_t n_group, topk_group;
    /* DeepSeek-V3 multi-token prediction modules after the n_layer decoder
     * layers (HF num_nextn_predict_layers; their tensors are
     * blk.<n_layer + i>.*); 0 = none. GGUF conversions of DeepSeek models
     * drop these layers, so a GGUF always reads 0. */
    int64_t n_nextn_layers;

    /* Checkpoint quantization declared by the file */
    dsq_ckpt_quant_t ckpt_quant;
    int ckpt_bits;
    int ckpt_group_size;         /* -1 = per channel                            */
    bool ckpt_zero_point;        /* AWQ zero_point / GPTQ !sym                  */
    bool ckpt_desc_act;          /* GPTQ act-order                              */

    /* Special tokens as declared by the model config: -1 (none) or an id
     * below n_vocab */
    int64_t bos_token_id, eos_token_id, pad_token_id;
} dsq_model_config_t;

/* "llama", "qwen2", "deepseek2" or "unknown". */
const char *dsq_arch_name(dsq_arch_t arch);

struct dsq_gguf;

/* Neutral defaults: arch unknown, all sizes 0, rope_theta 10000, rms_eps 1e-6,
 * rope_factor 1, yarn beta_fast 32 / beta_slow 1 / mscale 1 / mscale_all_dim
 * 0, moe_layer_freq 1, routed_scaling_factor 1, n_group = topk_group = 1,
 * topk_method "greedy", scoring_func "softmax", bos/eos/pad -1. */
void dsq_model_config_defaults(dsq_model_config_t *c);

/* Fill *out from GGUF metadata (ggml docs/gguf.md, "LLM" keys, with the
 * DeepSeek-V2 keys llama.cpp writes). general.architecture must be "llama",
 * "qwen2" or "deepseek2". Keys read, all prefixed with "<arch>.":
 * block_count, embedding_length, attention.head_count (required),
 * feed_forward_length, attention.head_count_kv (default head_count),
 * attention.key_length (default embd/heads; deepseek2: qk_nope+qk_rope, or
 * attention.key_length_mla when present), attention.value_length(_mla),
 * rope.freq_base, rope.dimension_count, rope.scaling.{type,factor,
 * original_context_length,yarn_log_multiplier} (mscale_all_dim =
 * yarn_log_multiplier / 0.1, as llama.cpp's converter writes 0.1*mscale_all_dim),
 * attention.layer_norm_rms_epsilon, context_length (missing:
 * DSQ_MODEL_CTX_DEFAULT, with a warning), vocab_size (else
 * tokenizer.ggml.tokens length, else token_embd.weight ne[1]); deepseek2:
 * attention.q_lora_rank, attention.kv_lora_rank, expert_count,
 * expert_shared_count, expert_used_count, expert_feed_forward_length,
 * leading_dense_block_count, expert_weights_scale, expert_weights_norm,
 * expert_gating_func (1 softmax, 2 sigmoid: topk_method noaux_tc),
 * expert_group_count, expert_group_used_count (softmax with more than one
 * group: topk_method group_limited_greedy; llama.cpp's converter writes the
 * group keys only since late 2025, older files route greedily). RoPE pairing as llama.cpp: llama and deepseek2
 * adjacent pairs (rope_neox false), qwen2 neox. tie_word_embeddings is true
 * when the file has no output.weight tensor; attn_qkv_bias when qwen2 or
 * blk.0.attn_q.bias exists. bos/eos/pad from tokenizer.ggml.{bos,eos,
 * padding}_token_id. Returns 0, DSQ_EUNSUPPORTED (other architecture) or
 * DSQ_EFORMAT (missing or inconsistent field; context_length outside
 * 1..DSQ_MODEL_CTX_MAX; a token id other than -1 that is not below
 * n_vocab; err names the file, the key and the value). */
int dsq_model_config_from_gguf(const struct dsq_gguf *g, dsq_model_config_t *out,
                               char *err, size_t err_len);

/* Fill *out from a Hugging Face config.json text (len bytes, need not be
 * NUL-terminated). model_type "llama", "qwen2", "deepseek_v2"/"deepseek_v3"
 * (or architectures[0] LlamaForCausalLM / Qwen2ForCausalLM /
 * DeepseekV2ForCausalLM / DeepseekV3ForCausalLM). Field names and defaults
 * of transformers' LlamaConfig / Qwen2Config / DeepseekV2Config:
 * num_key_value_heads defaults to num_attention_heads, head_dim to
 * hidden_size / num_attention_heads (deepseek: qk_nope + qk_rope),
 * rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false.
 * rope_scaling {type|rope_type: linear, dynamic, yarn (factor,
 * original_max_position_embeddings, beta_fast, beta_slow, mscale,
 * mscale_all_dim), llama3 (factor, low/high_freq_factor,
 * original_max_position_embeddings), default}. quantization_config:
 * quant_method "awq" (bits|w_bit, group_size|q_group_size, zero_point,
 * version must be gemm) or "gptq" (bits, group_size (-1 per channel),
 * desc_act, sym). RoPE pairing: HF llama/qwen2 neox (rope_neox true);
 * deepseek_v2 interleaved (rope_neox false: its modeling code de-interleaves
 * q_pe/k_pe before rotate_half). max_position_embeddings missing or null:
 * DSQ_MODEL_CTX_DEFAULT, with a warning. bos/eos/pad_token_id: null or -1
 * is none; eos_token_id may be a list (first is kept, every element is
 * checked). Returns 0, DSQ_EFORMAT (bad JSON or field; err names the
 * field and, for these checks, the value: max_position_embeddings outside
 * 1..DSQ_MODEL_CTX_MAX, a token id not below vocab_size) or
 * DSQ_EUNSUPPORTED (other model_type / quant_method). */
int dsq_model_config_from_hf_json(const char *json_text, size_t len,
                                  dsq_model_config_t *out, char *err,
                                  size_t err_len);

/* Fill *out from the 7 int32 llama.c header fields {dim, hidden_dim,
 * n_layers, n_heads, n_kv_heads, vocab_size, seq_len} (karpathy/llama2.c
 * run.c, version-0 export). vocab_size < 0 means an unshared classifier.
 * arch llama, rope_theta 10000, rms_eps 1e-5, rope_neox false, head_dim =
 * dim / n_heads. Returns 0 or DSQ_EFORMAT (non-positive or inconsistent
 * field, or seq_len above DSQ_MODEL_CTX_MAX, named in err). */
int dsq_model_config_from_llama2c(const int32_t hdr[7], dsq_model_config_t *out,
                                  char *err, size_t err_len);

#endif

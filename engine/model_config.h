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
    int64_t n_ctx_train;         /* max_position_embeddings                     */
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

    /* Checkpoint quantization declared by the file */
    dsq_ckpt_quant_t ckpt_quant;
    int ckpt_bits;
    int ckpt_group_size;         /* -1 = per channel                            */
    bool ckpt_zero_point;        /* AWQ zero_point / GPTQ !sym                  */
    bool ckpt_desc_act;          /* GPTQ act-order                              */

    /* Special tokens as declared by the model config (-1 = unknown) */
    int64_t bos_token_id, eos_token_id;
} dsq_model_config_t;

/* "llama", "qwen2", "deepseek2" or "unknown". */
const char *dsq_arch_name(dsq_arch_t arch);

#endif

/* The loader front door: given a path, work out the format and return the
 * architecture config, the tensors (as views into mmapped files) and the
 * tokenizer.
 *
 * Formats: a .gguf file; a Hugging Face directory (config.json,
 * model.safetensors or a sharded model.safetensors.index.json,
 * tokenizer.json, tokenizer_config.json), FP16/BF16/FP32, AWQ or GPTQ; a
 * llama2.c legacy checkpoint (.bin, with the tokenizer given separately).
 *
 * Tensor names are canonical GGUF names whatever the source format
 * ("token_embd.weight", "output_norm.weight", "output.weight",
 * "blk.N.attn_norm.weight", "blk.N.attn_{q,k,v,output}.{weight,bias}",
 * "blk.N.ffn_norm.weight", "blk.N.ffn_{gate,up,down}.weight"; AWQ/GPTQ
 * tensors keep their suffixes: "blk.N.attn_q.qweight", ".qzeros", ".scales",
 * ".g_idx"). config.rope_neox tells the model which RoPE pairing the
 * weights expect (HF llama and qwen2: neox; GGUF llama and llama2.c: pairs).
 *
 * Hugging Face -> canonical names (dsq_loader_canonical_name):
 *   model.embed_tokens.weight            token_embd.weight
 *   model.norm.weight                    output_norm.weight
 *   lm_head.weight                       output.weight
 *   model.layers.N.<module>.<suffix>     blk.N.<name>.<suffix>, with
 *     input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm,
 *     self_attn.{q,k,v,o}_proj -> attn_{q,k,v,output},
 *     mlp.{gate,up,down}_proj -> ffn_{gate,up,down}, and for deepseek2
 *     self_attn.q_a_proj -> attn_q_a, self_attn.q_a_layernorm ->
 *     attn_q_a_norm, self_attn.q_b_proj -> attn_q_b,
 *     self_attn.kv_a_proj_with_mqa -> attn_kv_a_mqa,
 *     self_attn.kv_a_layernorm -> attn_kv_a_norm, self_attn.kv_b_proj ->
 *     attn_kv_b, mlp.gate -> ffn_gate_inp (router, [n_embd, n_experts]),
 *     mlp.gate.e_score_correction_bias -> blk.N.exp_probs_b.bias (V3),
 *     mlp.shared_experts.{gate,up,down}_proj -> ffn_{gate,up,down}_shexp,
 *     mlp.experts.E.{gate,up,down}_proj -> blk.N.ffn_{gate,up,down}.E.<suffix>
 *     (one tensor per routed expert, not llama.cpp's stacked *_exps).
 *
 * deepseek2 GGUF (llama.cpp's convert_hf_to_gguf.py layout): the stacked 3-D
 * tensors are listed as per-slice views (no copy) and not themselves:
 *   blk.N.ffn_{gate,up,down}_exps.weight [k, n, n_expert]
 *       -> blk.N.ffn_{gate,up,down}.E.weight [k, n]  (as from safetensors)
 *   blk.N.attn_k_b.weight [qk_nope, kv_lora_rank, n_head]
 *       -> blk.N.attn_k_b.H.weight [qk_nope, kv_lora_rank]  (W_UK_h^T)
 *   blk.N.attn_v_b.weight [kv_lora_rank, v_head_dim, n_head]
 *       -> blk.N.attn_v_b.H.weight [kv_lora_rank, v_head_dim]  (W_UV_h)
 *   A stacked tensor that is not 3-D is DSQ_EFORMAT at open.
 *   suffix is one of weight, bias, qweight, qzeros, scales, g_idx. Other
 *   names (e.g. rotary_emb.inv_freq) are skipped with a warning. AWQ/GPTQ
 *   tensors keep the checkpoint's raw layout, shape reversed as for every
 *   safetensors tensor (JSON [a, b] -> ne[0] = b, ne[1] = a).
 *
 * Loading: after validation the loader walks the tensors once, asking the
 * kernel to read ahead (madvise WILLNEED), and reports progress: on a
 * terminal one rewritten stderr line (tensors, MiB, percent), otherwise one
 * dsq_log INFO line per 10%.
 */
#ifndef DSQ_LOADER_H
#define DSQ_LOADER_H

#include <stddef.h>

#include "engine/io/model_config.h"
#include "engine/io/tensor.h"
#include "engine/text/tokenizer.h"

typedef struct dsq_model_file dsq_model_file_t;

/* Open path (tokenizer_path optional: a tokenizer file or directory that
 * overrides/provides the tokenizer, as llama2.c checkpoints need). Returns
 * NULL on failure with one line in err naming the file, the offending field
 * or tensor and what was expected.
 * Format: a directory is a HF checkpoint (config.json + model.safetensors
 * or model.safetensors.index.json whose weight_map shard names must be
 * plain file names in that directory; its tokenizer: tokenizer.json, else
 * a llama2.c tok<n_vocab>.bin or tokenizer.bin, as dsq-quantize copies); a *.safetensors path is a one-file
 * HF checkpoint with config.json beside it; a file starting with "GGUF" or
 * named *.gguf is GGUF; *.bin is a llama2.c checkpoint (without
 * tokenizer_path, tok<n_vocab>.bin or tokenizer.bin beside it is used if
 * present). tokenizer_path: *.gguf (its tokenizer.ggml.*), a directory or
 * *.json (HF tokenizer.json), anything else a llama2.c tok*.bin.
 * Checked here: token_embd.weight is [n_embd, n_vocab] and output.weight
 * exists unless embeddings are tied (files with no tensors, e.g. vocab-only
 * GGUFs, skip these checks); by the readers: context length, special token
 * ids and tensor byte ranges (docs/models.md). Chat template: GGUF tokenizer.chat_template;
 * HF tokenizer_config.json chat_template (a string, or the "default" entry
 * of a list) or chat_template.jinja. */
dsq_model_file_t *dsq_model_file_open(const char *path,
                                      const char *tokenizer_path, char *err,
                                      size_t err_len);
void dsq_model_file_close(dsq_model_file_t *f);  /* NULL is a no-op */

/* Map a Hugging Face tensor name to its canonical name (table above).
 * Returns 0, DSQ_ENOTFOUND (name outside the map; out untouched),
 * DSQ_ERANGE (out_len too small) or DSQ_EINVAL (NULL args). */
int dsq_loader_canonical_name(const char *hf_name, char *out, size_t out_len);

/* Path as given to dsq_model_file_open (owned by f). */
const char *dsq_model_file_path(const dsq_model_file_t *f);
/* The GGUF reader behind a "gguf" file (metadata access), else NULL. */
const struct dsq_gguf *dsq_model_file_gguf(const dsq_model_file_t *f);

/* "gguf", "safetensors" or "llama2c". */
const char *dsq_model_file_format(const dsq_model_file_t *f);
const dsq_model_config_t *dsq_model_file_config(const dsq_model_file_t *f);
int dsq_model_file_n_tensors(const dsq_model_file_t *f);
const dsq_tensor_t *dsq_model_file_tensor(const dsq_model_file_t *f, int i);
/* Look a tensor up by canonical name; NULL if absent. */
const dsq_tensor_t *dsq_model_file_find(const dsq_model_file_t *f,
                                        const char *name);
/* Tokenizer owned by f (NULL if the file has none and none was given). */
const dsq_tokenizer_t *dsq_model_file_tokenizer(const dsq_model_file_t *f);
/* Chat template text (NUL-terminated, owned by f) or NULL. */
const char *dsq_model_file_chat_template(const dsq_model_file_t *f);

#endif

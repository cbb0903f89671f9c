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
 */
#ifndef DSQ_LOADER_H
#define DSQ_LOADER_H

#include <stddef.h>

#include "model_config.h"
#include "tensor.h"
#include "tokenizer.h"

typedef struct dsq_model_file dsq_model_file_t;

/* Open path (tokenizer_path optional: a tokenizer file or directory that
 * overrides/provides the tokenizer, as llama2.c checkpoints need). Returns
 * NULL on failure with one line in err naming the file, the offending field
 * or tensor and what was expected. */
dsq_model_file_t *dsq_model_file_open(const char *path,
                                      const char *tokenizer_path, char *err,
                                      size_t err_len);
void dsq_model_file_close(dsq_model_file_t *f);  /* NULL is a no-op */

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

/* llama2.c legacy checkpoint reader (karpathy/llama2.c, run.c "version 0"
 * export: 7 int32 header fields, then fp32 weights; no magic number).
 *
 * Header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len (vocab_size < 0: unshared classifier stored at the end). Weights,
 * each block for all layers back to back: token_embedding [vocab][dim],
 * rms_att [L][dim], wq [L][dim][dim], wk [L][kv_dim][dim],
 * wv [L][kv_dim][dim], wo [L][dim][dim], rms_ffn [L][dim],
 * w1 [L][hidden][dim], w2 [L][dim][hidden], w3 [L][hidden][dim],
 * rms_final [dim], freq_cis_real [seq_len][head_size/2], freq_cis_imag
 * (same, unused), then wcls [vocab][dim] if unshared.
 *
 * The reader exposes canonical GGUF-named F32 views in GGUF dim order
 * (ne[0] = input dim): token_embd.weight [dim, vocab], blk.N.attn_norm.weight
 * [dim], blk.N.attn_q.weight [dim, dim], blk.N.attn_k/attn_v.weight
 * [dim, kv_dim], blk.N.attn_output.weight [dim, dim], blk.N.ffn_norm.weight,
 * blk.N.ffn_gate.weight (w1) [dim, hidden], blk.N.ffn_down.weight (w2)
 * [hidden, dim], blk.N.ffn_up.weight (w3) [dim, hidden],
 * output_norm.weight [dim], output.weight [dim, vocab] only if unshared.
 * RoPE is llama2.c's adjacent-pair rotation (config rope_neox = false).
 */
#ifndef DSQ_LLAMA2C_H
#define DSQ_LLAMA2C_H

#include <stddef.h>

#include "model_config.h"
#include "tensor.h"

typedef struct dsq_llama2c dsq_llama2c_t;

/* mmap and validate: header fields positive (vocab_size non-zero),
 * dim % n_heads == 0, n_heads % n_kv_heads == 0, and the file size equal to
 * 28 + 4 x (the float count the layout needs) — a short or long file is an
 * error naming the expected size. NULL + one line in err on failure. */
dsq_llama2c_t *dsq_llama2c_open(const char *path, char *err, size_t err_len);
void dsq_llama2c_close(dsq_llama2c_t *m);  /* NULL is a no-op */

/* Config (see dsq_model_config_from_llama2c); owned by m. */
const dsq_model_config_t *dsq_llama2c_config(const dsq_llama2c_t *m);
/* Tensors in the order listed above; views owned by m. */
int dsq_llama2c_n_tensors(const dsq_llama2c_t *m);
const dsq_tensor_t *dsq_llama2c_tensor(const dsq_llama2c_t *m, int i);

#endif

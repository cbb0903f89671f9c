/* The model graph: weights in kernel layout and the forward pass of the
 * llama and qwen2 architectures over a ragged batch.
 *
 * Architecture sources: LLaMA (Touvron et al. 2023; pre-RMSNorm, SwiGLU,
 * RoPE, GQA), Qwen2 (Yang et al. 2024; biases on q/k/v), as implemented by
 * transformers' modeling_llama.py / modeling_qwen2.py and llama.cpp.
 *
 * A forward call takes any mix of prefill chunks and decode tokens (no
 * padding): each token row carries its sequence (block table row) and
 * position; logits are computed only for the rows that ask for them.
 * Not thread-safe: one engine thread owns a model (the CPU ops parallelise
 * internally).
 */
#ifndef DSQ_MODEL_H
#define DSQ_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"
#include "loader.h"
#include "model_config.h"

typedef struct dsq_model dsq_model_t;

/* Load options. */
typedef struct dsq_model_opts {
    const char *quantize;      /* NULL/"none": keep file formats; "int4": RTN
                                  every 16/32-bit or Q8_0 linear weight      */
    int group_size;            /* for quantize=int4: 32, 64 or 128 (def. 32) */
} dsq_model_opts_t;

/* Build the model from an open model file (which must outlive the model:
 * weights may point into its mapping). NULL + err on failure (missing or
 * mis-shaped tensor named in err, unsupported architecture or format). */
dsq_model_t *dsq_model_create(const dsq_model_file_t *f,
                              const dsq_model_opts_t *opts, char *err,
                              size_t err_len);
void dsq_model_destroy(dsq_model_t *m);   /* NULL is a no-op */

const dsq_model_config_t *dsq_model_config(const dsq_model_t *m);
/* Bytes of weight memory the model allocated itself (repacked or
 * converted weights; zero-copy views of the file are not counted). */
size_t dsq_model_owned_bytes(const dsq_model_t *m);
/* Bytes of all weights as the kernels read them (owned + mapped views). */
size_t dsq_model_weight_bytes(const dsq_model_t *m);

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
} dsq_batch_t;

/* Run one step. logits: [n_logits][n_vocab] fp32, caller-owned.
 * Returns 0, DSQ_EINVAL (bad batch), DSQ_ERANGE (token id out of vocab,
 * slot out of the cache) or DSQ_ENOMEM. */
int dsq_model_forward(dsq_model_t *m, dsq_kv_cache_t *kv, const dsq_batch_t *b,
                      float *logits);

#endif

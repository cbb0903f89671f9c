/* Paged KV cache: fixed-size blocks of block_size tokens for every layer, a
 * free list, per-sequence block tables and reference counts for
 * copy-on-write sharing (n > 1 forks).
 *
 * Design follows vLLM's PagedAttention (Kwon et al., SOSP 2023): a block id
 * names the same token range in every layer, so one block table per sequence
 * serves all layers. Storage per layer is the dsq_kv_layer_t of
 * kernels/kernels.h. All operations are O(1) per block. Not thread-safe: only
 * the engine thread uses it.
 */
#ifndef DSQ_KV_CACHE_H
#define DSQ_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef struct dsq_kv_cache dsq_kv_cache_t;

/* A sequence's block table: ids[i] holds tokens [i*block_size,
 * (i+1)*block_size). Caller-provided storage (init/deinit). */
typedef struct dsq_block_table {
    int32_t *ids;
    int n;        /* blocks in use */
    int cap;      /* allocated entries */
} dsq_block_table_t;

/* Bytes of KV storage per token per layer (K and V, incl. INT8 scales). */
size_t dsq_kv_bytes_per_token_layer(int n_kv_heads, int head_dim,
                                    dsq_kv_dtype_t dtype);

/* Allocate n_blocks blocks for n_layers layers. Memory is calloc'd, so pages
 * are committed only when first written. NULL + err on failure. */
dsq_kv_cache_t *dsq_kv_create(int n_layers, int n_kv_heads, int head_dim,
                              int block_size, int64_t n_blocks,
                              dsq_kv_dtype_t dtype, char *err, size_t err_len);
/* As dsq_kv_create; has_v false (ds2: DeepSeek-V2 MLA, see
 * dsq_model_kv_shape) allocates only the K pool and its INT8 scale/zero
 * arrays: each layer's v, v_scale, v_zero are NULL and the cache holds one
 * head_dim vector per token per layer (the latent + rope key), written with
 * dsq_cpu_mla_kv_write and read by dsq_cpu_mla_attention. Bytes per token
 * per layer are then half of dsq_kv_bytes_per_token_layer's. */
dsq_kv_cache_t *dsq_kv_create_ex(int n_layers, int n_kv_heads, int head_dim,
                                 int block_size, int64_t n_blocks,
                                 dsq_kv_dtype_t dtype, bool has_v, char *err,
                                 size_t err_len);
void dsq_kv_destroy(dsq_kv_cache_t *kv);   /* NULL is a no-op */

const dsq_kv_layer_t *dsq_kv_layer(const dsq_kv_cache_t *kv, int layer);
int dsq_kv_block_size(const dsq_kv_cache_t *kv);
int64_t dsq_kv_n_blocks(const dsq_kv_cache_t *kv);
int64_t dsq_kv_n_free(const dsq_kv_cache_t *kv);
int dsq_kv_refcount(const dsq_kv_cache_t *kv, int32_t block);

void dsq_block_table_init(dsq_block_table_t *bt);
void dsq_block_table_deinit(dsq_block_table_t *bt);

/* Blocks needed to hold n_tokens tokens. */
int dsq_kv_blocks_for(const dsq_kv_cache_t *kv, int64_t n_tokens);

/* Make bt cover n_tokens tokens, allocating new blocks at the end. All or
 * nothing: returns DSQ_EFULL (bt unchanged) if not enough blocks are free,
 * DSQ_ENOMEM if the table cannot grow. */
int dsq_kv_seq_reserve(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                       int64_t n_tokens);

/* Prepare writes to token positions [pos_begin, pos_end): every block in
 * that range whose refcount is > 1 is replaced by a private copy (copy on
 * write). Returns 0 or DSQ_EFULL (no free block for the copy; the blocks
 * already copied stay copied, which is harmless). */
int dsq_kv_seq_cow(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                   int64_t pos_begin, int64_t pos_end);

/* dst becomes a copy of src's table, sharing every block (refcount + 1).
 * dst must be empty. Returns 0 or DSQ_ENOMEM. */
int dsq_kv_seq_fork(dsq_kv_cache_t *kv, dsq_block_table_t *dst,
                    const dsq_block_table_t *src);

/* Drop bt's references (blocks return to the free list at refcount 0) and
 * empty the table. */
void dsq_kv_seq_free(dsq_kv_cache_t *kv, dsq_block_table_t *bt);

/* Cache slot (block * block_size + offset) of token position pos. */
int32_t dsq_kv_slot(const dsq_kv_cache_t *kv, const dsq_block_table_t *bt,
                    int64_t pos);

/* Check the invariants: every block is free xor referenced, free count
 * matches, and the references from the given tables add up to the
 * refcounts (pass all live tables). Returns true when consistent. */
bool dsq_kv_check(const dsq_kv_cache_t *kv, const dsq_block_table_t *const *tables,
                  int n_tables);

#endif

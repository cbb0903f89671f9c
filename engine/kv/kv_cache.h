/* Paged KV cache: fixed-size blocks of block_size tokens for every layer, a
 * free list, per-sequence block tables and reference counts for
 * copy-on-write sharing (n > 1 forks), and automatic prefix caching.
 *
 * Design follows vLLM's PagedAttention (Kwon et al., SOSP 2023): a block id
 * names the same token range in every layer, so one block table per sequence
 * serves all layers. Storage per layer is the dsq_kv_layer_t of
 * kernels/kernels.h. All operations are O(1) per block. Not thread-safe: only
 * the engine thread uses it.
 *
 * Prefix caching (off unless dsq_kv_set_prefix_caching; vLLM's automatic
 * prefix caching design): a FULL block is named by the SHA-256 of its
 * parent block's digest followed by its block_size token ids (little-endian
 * int32), so equal digests mean equal whole prefixes. A hash table maps
 * digest -> block id; a lookup also compares the stored token ids. A block
 * whose refcount drops to 0 and carries a digest goes to an LRU evictable
 * list instead of the free stack; allocation takes truly free blocks first,
 * then evicts the least recently used cached block (dropping its digest).
 * Every block is exactly one of: free, evictable (refcount 0, cached),
 * referenced (refcount > 0, cached or not). Only full, computed blocks are
 * cached, so a cached block is never written.
 */
#ifndef DSQ_KV_CACHE_H
#define DSQ_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "kernels.h"

typedef struct dsq_kv_cache dsq_kv_cache_t;

/* SHA-256 digest naming a full block and its whole prefix. */
typedef struct dsq_block_hash {
    uint8_t b[32];
} dsq_block_hash_t;

/* A sequence's block table: ids[i] holds tokens [i*block_size,
 * (i+1)*block_size). Caller-provided storage (init/deinit). With prefix
 * caching, hashes[0..n_hashed) are the digests of the sequence's first
 * n_hashed full blocks (the chain continues from hashes[n_hashed-1]). */
typedef struct dsq_block_table {
    int32_t *ids;
    int n;        /* blocks in use */
    int cap;      /* allocated entries (ids and hashes) */
    dsq_block_hash_t *hashes;
    int n_hashed; /* <= n */
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
/* As dsq_kv_create_ex, with every layer's storage in be's memory
 * (engine/backend/backend.h), zero-filled: on the CUDA backend the cache
 * lives on the device and copy-on-write copies blocks there. be NULL, or a
 * host backend: the calloc'd host storage of dsq_kv_create_ex. be is not
 * owned and must outlive the cache. Bytes allocated through be:
 * dsq_kv_storage_bytes. */
dsq_kv_cache_t *dsq_kv_create_on(dsq_backend_t *be, int n_layers, int n_kv_heads,
                                 int head_dim, int block_size, int64_t n_blocks,
                                 dsq_kv_dtype_t dtype, bool has_v, char *err,
                                 size_t err_len);
/* Bytes of KV storage (all layers: K, V and INT8 scales/zeros) the cache
 * holds, wherever it lives. */
size_t dsq_kv_storage_bytes(const dsq_kv_cache_t *kv);
void dsq_kv_destroy(dsq_kv_cache_t *kv);   /* NULL is a no-op */

/* hardening: commit every page of a host cache's storage now (it is
 * calloc'd, so pages are otherwise committed when a block is first
 * written): the resident memory of an idle server is then what the memory
 * plan reserved, and a load never grows it (the held sequences of clients
 * that stopped reading included). Contents are unchanged (zero). Runs on
 * the calling thread's OpenMP team. Returns the bytes committed; 0 for a
 * device cache (dsq_kv_create_on: already zero-filled device memory) or
 * NULL. Cannot fail: a page the kernel cannot commit is the OOM killer's,
 * as it would be at first write. */
size_t dsq_kv_prefault(dsq_kv_cache_t *kv);

const dsq_kv_layer_t *dsq_kv_layer(const dsq_kv_cache_t *kv, int layer);
int dsq_kv_block_size(const dsq_kv_cache_t *kv);
int64_t dsq_kv_n_blocks(const dsq_kv_cache_t *kv);
/* Blocks an allocation can take: truly free plus evictable cached ones. */
int64_t dsq_kv_n_free(const dsq_kv_cache_t *kv);
/* Of those, cached blocks on the LRU evictable list (refcount 0). */
int64_t dsq_kv_n_evictable(const dsq_kv_cache_t *kv);
/* Blocks that carry a digest (referenced or evictable). */
int64_t dsq_kv_n_cached(const dsq_kv_cache_t *kv);
/* Refcount of block, or -1 for an id out of range. */
int dsq_kv_refcount(const dsq_kv_cache_t *kv, int32_t block);
/* Whether block carries a digest (is in the prefix cache). */
bool dsq_kv_block_is_cached(const dsq_kv_cache_t *kv, int32_t block);

/* Turn prefix caching on or off. Only while no block is referenced or
 * cached (right after create); allocates the hash table and the per-block
 * token copies (block_size int32 per block). Returns 0, DSQ_ESTATE (blocks
 * in use) or DSQ_ENOMEM. Turning it off drops nothing (nothing is cached). */
int dsq_kv_set_prefix_caching(dsq_kv_cache_t *kv, bool on);
bool dsq_kv_prefix_caching(const dsq_kv_cache_t *kv);

/* Digest of a full block: SHA-256(parent digest || tokens[0..block_size) as
 * little-endian int32). parent NULL (the first block) hashes 32 zero bytes
 * in its place. out receives the digest. */
void dsq_kv_block_hash(const dsq_kv_cache_t *kv, const dsq_block_hash_t *parent,
                       const int32_t *tokens, dsq_block_hash_t *out);

/* Longest cached prefix of tokens[0..n_tokens): walks full blocks from the
 * start, hashing each into the chain, while a cached block holds the same
 * digest and token ids. At most max_blocks blocks are matched (callers pass
 * (n_tokens - 1) / block_size so at least the last token is recomputed, as
 * vLLM does, and a matched block is never written). Read-only. ids[] gets
 * the matched block ids, hashes[] (may be NULL) their digests; both need
 * max_blocks entries. *n_evictable (may be NULL) receives how many of the
 * matched blocks are on the evictable list (sharing them lowers
 * dsq_kv_n_free by that much). Returns the number of blocks matched (0 when
 * prefix caching is off). */
int dsq_kv_prefix_lookup(const dsq_kv_cache_t *kv, const int32_t *tokens,
                         int64_t n_tokens, int max_blocks, int32_t *ids,
                         dsq_block_hash_t *hashes, int *n_evictable);

/* Make the empty table bt share n blocks found by dsq_kv_prefix_lookup
 * (refcount + 1, evictable ones leave the LRU list) and record their
 * digests. Returns 0, DSQ_EINVAL (bt not empty, or a block not cached) or
 * DSQ_ENOMEM. */
int dsq_kv_seq_share_prefix(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                            const int32_t *ids, const dsq_block_hash_t *hashes,
                            int n);

/* After the KV of tokens[0..n_computed) is in bt's blocks: hash every full
 * block not yet hashed (bt->n_hashed up to n_computed / block_size) and
 * cache it, unless a block with the same digest is cached already (then
 * the duplicate stays uncached and is freed normally, as in vLLM). No-op
 * when prefix caching is off. Returns 0. */
int dsq_kv_seq_cache_blocks(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                            const int32_t *tokens, int64_t n_computed);

void dsq_block_table_init(dsq_block_table_t *bt);
void dsq_block_table_deinit(dsq_block_table_t *bt);

/* Blocks needed to hold n_tokens tokens. */
int dsq_kv_blocks_for(const dsq_kv_cache_t *kv, int64_t n_tokens);

/* Make bt cover n_tokens tokens, allocating new blocks at the end (truly
 * free ones first, then evicting cached ones, least recently used first).
 * All or nothing: returns DSQ_EFULL (bt unchanged) if fewer than needed
 * are free or evictable, DSQ_ENOMEM if the table cannot grow. */
int dsq_kv_seq_reserve(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                       int64_t n_tokens);

/* Prepare writes to token positions [pos_begin, pos_end): every block in
 * that range whose refcount is > 1 is replaced by a private copy (copy on
 * write; the copy is never cached, the original keeps its digest). Returns
 * 0 or DSQ_EFULL (no free block for the copy; the blocks already copied
 * stay copied, which is harmless). */
int dsq_kv_seq_cow(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                   int64_t pos_begin, int64_t pos_end);

/* dst becomes a copy of src's table, sharing every block (refcount + 1)
 * and copying its digests (n_hashed). dst must be empty. Returns 0 or
 * DSQ_ENOMEM. */
int dsq_kv_seq_fork(dsq_kv_cache_t *kv, dsq_block_table_t *dst,
                    const dsq_block_table_t *src);

/* Drop bt's references and empty the table. A block at refcount 0 returns
 * to the free stack, or, when cached, to the evictable list; the table's
 * blocks are released last to first, so a sequence's tail blocks (the least
 * likely to be shared) are evicted before its head (vLLM's order). */
void dsq_kv_seq_free(dsq_kv_cache_t *kv, dsq_block_table_t *bt);

/* Shrink bt to the blocks n_tokens tokens need, dropping the references
 * to the blocks past them (last first, as dsq_kv_seq_free) and their
 * digests: for KV written past a sequence's end that will not be kept
 * (rejected speculative rows). No-op when bt needs them all. */
void dsq_kv_seq_truncate(dsq_kv_cache_t *kv, dsq_block_table_t *bt, int64_t n_tokens);

/* Cache slot (block * block_size + offset) of token position pos. */
int32_t dsq_kv_slot(const dsq_kv_cache_t *kv, const dsq_block_table_t *bt,
                    int64_t pos);

/* Check the invariants: every block is exactly one of free, evictable or
 * referenced; the free and evictable counts match their lists; the
 * references from the given tables add up to the refcounts (pass all live
 * tables); cached blocks and the hash table agree (each cached block is
 * found under its digest, no digest twice, free blocks carry none);
 * evictable blocks are cached; and each table's n_hashed <= n with the
 * digest of every cached block it holds matching. Returns true when
 * consistent. */
bool dsq_kv_check(const dsq_kv_cache_t *kv, const dsq_block_table_t *const *tables,
                  int n_tables);

#endif

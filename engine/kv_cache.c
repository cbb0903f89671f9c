/* Paged KV cache block manager and storage (see kv_cache.h).
 *
 * The free list is a stack of block ids; refcounts live in one int array.
 * Storage for every layer is one calloc'd region per K and V (and the INT8
 * scale/zero arrays), so untouched blocks cost no resident memory. */
#include "kv_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

struct dsq_kv_cache {
    int n_layers, n_kv_heads, head_dim, block_size, n_groups;
    bool has_v;              /* ds2: false for MLA (latent cache, K pool only) */
    int64_t n_blocks;
    dsq_kv_dtype_t dtype;
    dsq_kv_layer_t *layers;
    int32_t *free_stack;
    int64_t n_free;
    int32_t *refcount;
};

static int kv_groups(int head_dim)
{
    return (head_dim % 64 == 0) ? head_dim / 64 : 1;
}

size_t dsq_kv_bytes_per_token_layer(int n_kv_heads, int head_dim,
                                    dsq_kv_dtype_t dtype)
{
    size_t vals = (size_t)n_kv_heads * (size_t)head_dim;
    if (dtype == DSQ_KV_INT8)
        return 2 * (vals + (size_t)n_kv_heads * (size_t)kv_groups(head_dim) * 4);
    if (dtype == DSQ_KV_F32)    /* ds2 */
        return 2 * vals * 4;
    return 2 * vals * 2;
}

dsq_kv_cache_t *dsq_kv_create(int n_layers, int n_kv_heads, int head_dim,
                              int block_size, int64_t n_blocks,
                              dsq_kv_dtype_t dtype, char *err, size_t err_len)
{
    return dsq_kv_create_ex(n_layers, n_kv_heads, head_dim, block_size, n_blocks,
                            dtype, true, err, err_len);
}

/* ds2: has_v false allocates only the K pool (and its INT8 scales). */
dsq_kv_cache_t *dsq_kv_create_ex(int n_layers, int n_kv_heads, int head_dim,
                                 int block_size, int64_t n_blocks,
                                 dsq_kv_dtype_t dtype, bool has_v, char *err,
                                 size_t err_len)
{
    dsq_kv_cache_t *kv = NULL;
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 ||
        n_blocks <= 0 || n_blocks > INT32_MAX) {
        snprintf(err, err_len, "kv cache: invalid shape (layers=%d kv_heads=%d "
                 "head_dim=%d block_size=%d blocks=%lld)", n_layers, n_kv_heads,
                 head_dim, block_size, (long long)n_blocks);
        return NULL;
    }
    kv = calloc(1, sizeof(*kv));
    if (!kv)
        goto fail;
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->dtype = dtype;
    kv->has_v = has_v;
    kv->n_groups = kv_groups(head_dim);
    kv->layers = calloc((size_t)n_layers, sizeof(*kv->layers));
    kv->free_stack = malloc((size_t)n_blocks * sizeof(*kv->free_stack));
    kv->refcount = calloc((size_t)n_blocks, sizeof(*kv->refcount));
    if (!kv->layers || !kv->free_stack || !kv->refcount)
        goto fail;
    size_t n_vals = (size_t)n_blocks * (size_t)block_size * (size_t)n_kv_heads *
                    (size_t)head_dim;
    size_t n_sc = (size_t)n_blocks * (size_t)block_size * (size_t)n_kv_heads *
                  (size_t)kv->n_groups;
    size_t elem = dtype == DSQ_KV_INT8 ? 1 : dtype == DSQ_KV_F32 ? 4 : 2;
    for (int l = 0; l < n_layers; l++) {
        dsq_kv_layer_t *L = &kv->layers[l];
        L->dtype = dtype;
        L->block_size = block_size;
        L->n_kv_heads = n_kv_heads;
        L->head_dim = head_dim;
        L->n_blocks = n_blocks;
        L->k = calloc(n_vals, elem);
        L->v = has_v ? calloc(n_vals, elem) : NULL;
        if (!L->k || (has_v && !L->v))
            goto fail;
        if (dtype == DSQ_KV_INT8) {
            L->k_scale = calloc(n_sc, 2);
            L->k_zero = calloc(n_sc, 2);
            L->v_scale = has_v ? calloc(n_sc, 2) : NULL;
            L->v_zero = has_v ? calloc(n_sc, 2) : NULL;
            if (!L->k_scale || !L->k_zero || (has_v && (!L->v_scale || !L->v_zero)))
                goto fail;
        }
    }
    /* Pop order: low ids first, so a fresh cache fills from the start. */
    for (int64_t i = 0; i < n_blocks; i++)
        kv->free_stack[i] = (int32_t)(n_blocks - 1 - i);
    kv->n_free = n_blocks;
    return kv;
fail:
    snprintf(err, err_len, "kv cache: out of memory for %lld blocks of %d tokens",
             (long long)n_blocks, block_size);
    dsq_kv_destroy(kv);
    return NULL;
}

void dsq_kv_destroy(dsq_kv_cache_t *kv)
{
    if (!kv)
        return;
    for (int l = 0; kv->layers && l < kv->n_layers; l++) {
        dsq_kv_layer_t *L = &kv->layers[l];
        free(L->k);
        free(L->v);
        free(L->k_scale);
        free(L->k_zero);
        free(L->v_scale);
        free(L->v_zero);
    }
    free(kv->layers);
    free(kv->free_stack);
    free(kv->refcount);
    free(kv);
}

const dsq_kv_layer_t *dsq_kv_layer(const dsq_kv_cache_t *kv, int layer)
{
    return &kv->layers[layer];
}

int dsq_kv_block_size(const dsq_kv_cache_t *kv) { return kv->block_size; }
int64_t dsq_kv_n_blocks(const dsq_kv_cache_t *kv) { return kv->n_blocks; }
int64_t dsq_kv_n_free(const dsq_kv_cache_t *kv) { return kv->n_free; }

int dsq_kv_refcount(const dsq_kv_cache_t *kv, int32_t block)
{
    if (block < 0 || block >= kv->n_blocks)
        return -1;
    return kv->refcount[block];
}

void dsq_block_table_init(dsq_block_table_t *bt)
{
    bt->ids = NULL;
    bt->n = 0;
    bt->cap = 0;
}

void dsq_block_table_deinit(dsq_block_table_t *bt)
{
    free(bt->ids);
    dsq_block_table_init(bt);
}

int dsq_kv_blocks_for(const dsq_kv_cache_t *kv, int64_t n_tokens)
{
    return (int)((n_tokens + kv->block_size - 1) / kv->block_size);
}

static int bt_grow(dsq_block_table_t *bt, int need)
{
    if (need <= bt->cap)
        return DSQ_OK;
    int cap = bt->cap ? bt->cap : 8;
    while (cap < need)
        cap *= 2;
    int32_t *ids = realloc(bt->ids, (size_t)cap * sizeof(*ids));
    if (!ids)
        return DSQ_ENOMEM;
    bt->ids = ids;
    bt->cap = cap;
    return DSQ_OK;
}

static int32_t pop_free(dsq_kv_cache_t *kv)
{
    int32_t b = kv->free_stack[--kv->n_free];
    kv->refcount[b] = 1;
    return b;
}

static void unref(dsq_kv_cache_t *kv, int32_t b)
{
    if (--kv->refcount[b] == 0)
        kv->free_stack[kv->n_free++] = b;
}

int dsq_kv_seq_reserve(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                       int64_t n_tokens)
{
    int need = dsq_kv_blocks_for(kv, n_tokens);
    if (need <= bt->n)
        return DSQ_OK;
    if (need - bt->n > kv->n_free)
        return DSQ_EFULL;
    int rc = bt_grow(bt, need);
    if (rc)
        return rc;
    while (bt->n < need)
        bt->ids[bt->n++] = pop_free(kv);
    return DSQ_OK;
}

static void copy_block(dsq_kv_cache_t *kv, int32_t dst, int32_t src)
{
    size_t per_block = (size_t)kv->block_size * (size_t)kv->n_kv_heads *
                       (size_t)kv->head_dim;
    size_t elem = kv->dtype == DSQ_KV_INT8 ? 1 : kv->dtype == DSQ_KV_F32 ? 4 : 2;
    size_t sc = (size_t)kv->block_size * (size_t)kv->n_kv_heads *
                (size_t)kv->n_groups * 2;
    for (int l = 0; l < kv->n_layers; l++) {
        dsq_kv_layer_t *L = &kv->layers[l];
        memcpy((char *)L->k + (size_t)dst * per_block * elem,
               (char *)L->k + (size_t)src * per_block * elem, per_block * elem);
        if (kv->has_v)
            memcpy((char *)L->v + (size_t)dst * per_block * elem,
                   (char *)L->v + (size_t)src * per_block * elem, per_block * elem);
        if (kv->dtype == DSQ_KV_INT8) {
            uint16_t *arrs[4] = {L->k_scale, L->k_zero, L->v_scale, L->v_zero};
            for (int a = 0; a < (kv->has_v ? 4 : 2); a++)
                memcpy((char *)arrs[a] + (size_t)dst * sc,
                       (char *)arrs[a] + (size_t)src * sc, sc);
        }
    }
}

int dsq_kv_seq_cow(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                   int64_t pos_begin, int64_t pos_end)
{
    if (pos_end <= pos_begin)
        return DSQ_OK;
    int first = (int)(pos_begin / kv->block_size);
    int last = (int)((pos_end - 1) / kv->block_size);
    for (int i = first; i <= last && i < bt->n; i++) {
        int32_t b = bt->ids[i];
        if (kv->refcount[b] <= 1)
            continue;
        if (kv->n_free == 0)
            return DSQ_EFULL;
        int32_t nb = pop_free(kv);
        copy_block(kv, nb, b);
        unref(kv, b);
        bt->ids[i] = nb;
    }
    return DSQ_OK;
}

int dsq_kv_seq_fork(dsq_kv_cache_t *kv, dsq_block_table_t *dst,
                    const dsq_block_table_t *src)
{
    int rc = bt_grow(dst, src->n);
    if (rc)
        return rc;
    for (int i = 0; i < src->n; i++) {
        dst->ids[i] = src->ids[i];
        kv->refcount[src->ids[i]]++;
    }
    dst->n = src->n;
    return DSQ_OK;
}

void dsq_kv_seq_free(dsq_kv_cache_t *kv, dsq_block_table_t *bt)
{
    for (int i = 0; i < bt->n; i++)
        unref(kv, bt->ids[i]);
    bt->n = 0;
}

int32_t dsq_kv_slot(const dsq_kv_cache_t *kv, const dsq_block_table_t *bt,
                    int64_t pos)
{
    return bt->ids[pos / kv->block_size] * kv->block_size +
           (int32_t)(pos % kv->block_size);
}

bool dsq_kv_check(const dsq_kv_cache_t *kv, const dsq_block_table_t *const *tables,
                  int n_tables)
{
    bool ok = true;
    int32_t *seen = calloc((size_t)kv->n_blocks, sizeof(*seen));
    if (!seen)
        return false;
    for (int t = 0; t < n_tables; t++)
        for (int i = 0; i < tables[t]->n; i++) {
            int32_t b = tables[t]->ids[i];
            if (b < 0 || b >= kv->n_blocks)
                ok = false;
            else
                seen[b]++;
        }
    for (int64_t i = 0; i < kv->n_free; i++) {
        int32_t b = kv->free_stack[i];
        if (b < 0 || b >= kv->n_blocks || seen[b] != 0 || kv->refcount[b] != 0)
            ok = false;
        else
            seen[b] = -1;
    }
    int64_t n_ref = 0;
    for (int64_t b = 0; b < kv->n_blocks; b++) {
        if (seen[b] == -1)
            continue;
        if (seen[b] != kv->refcount[b] || seen[b] == 0)
            ok = false;
        n_ref++;
    }
    if (n_ref + kv->n_free != kv->n_blocks)
        ok = false;
    free(seen);
    return ok;
}

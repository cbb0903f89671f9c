/* Paged KV cache block manager and storage (see kv_cache.h).
 *
 * The free list is a stack of block ids; refcounts live in one int array.
 * Storage for every layer is one calloc'd region per K and V (and the INT8
 * scale/zero arrays), so untouched blocks cost no resident memory; or, for
 * a device backend (dsq_kv_create_on), zero-filled backend memory, where
 * copy-on-write queues its block copies on the backend. The block manager
 * itself (free stack, refcounts, prefix cache) is always host memory.
 *
 * Prefix cache: per-block digest, cached flag and token copy; a chained
 * hash table (bucket heads + per-block next links, >= 2 buckets per block,
 * so chains stay O(1) long); the evictable blocks form a doubly linked LRU
 * list through per-block prev/next ids (head = least recently used). A
 * 64-bit hash with a token compare would do for the table key, but SHA-256
 * (OpenSSL, already a dependency) makes the chain digest itself collision
 * resistant: a hit never depends on luck, and the cost (~1 us per block of
 * 16 tokens) is noise next to a forward pass. */
#include "kv_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/sha.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

struct dsq_kv_cache {
    dsq_backend_t *be;       /* device storage's backend; NULL = host calloc */
    size_t val_bytes;        /* bytes of each layer's k (and v) array        */
    size_t sc_bytes;         /* bytes of each INT8 scale / zero array (or 0) */
    size_t storage_bytes;
    int n_layers, n_kv_heads, head_dim, block_size, n_groups;
    bool has_v;              /* ds2: false for MLA (latent cache, K pool only) */
    int64_t n_blocks;
    dsq_kv_dtype_t dtype;
    dsq_kv_layer_t *layers;
    int32_t *free_stack;
    int64_t n_free;
    int32_t *refcount;
    /* prefix cache; arrays NULL while off */
    bool pc_on;
    dsq_block_hash_t *hash;    /* [n_blocks] digest of a cached block       */
    uint8_t *cached;           /* [n_blocks] 1 = carries a digest           */
    int32_t *tok;              /* [n_blocks][block_size] its token ids      */
    int32_t *hnext;            /* [n_blocks] next block in the hash chain   */
    int32_t *buckets;          /* [bucket_mask + 1] chain heads, -1 = none  */
    uint32_t bucket_mask;
    int32_t *lru_prev, *lru_next;   /* [n_blocks] evictable list links     */
    int32_t lru_head, lru_tail;     /* head: least recently used            */
    int64_t n_evictable, n_cached;
    uint8_t *hbuf;             /* hash input: 32 + 4 * block_size bytes     */
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
    return dsq_kv_create_on(NULL, n_layers, n_kv_heads, head_dim, block_size, n_blocks,
                            dtype, has_v, err, err_len);
}

/* count elements of size bytes each: host calloc (pages committed when
 * first written) or zero-filled backend memory */
static void *storage_alloc(dsq_kv_cache_t *kv, size_t count, size_t size)
{
    if (!kv->be)
        return calloc(count, size);
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = dsq_backend_alloc(kv->be, count * size);
    if (p && dsq_backend_memset(kv->be, p, 0, count * size) != DSQ_OK) {
        dsq_backend_free(kv->be, p);
        p = NULL;
    }
    return p;
}

static void storage_free(dsq_kv_cache_t *kv, void *p)
{
    if (kv->be)
        dsq_backend_free(kv->be, p);
    else
        free(p);
}

dsq_kv_cache_t *dsq_kv_create_on(dsq_backend_t *be, int n_layers, int n_kv_heads,
                                 int head_dim, int block_size, int64_t n_blocks,
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
    kv->be = be && !dsq_backend_is_host(be) ? be : NULL;
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
    kv->val_bytes = n_vals * elem;
    kv->sc_bytes = dtype == DSQ_KV_INT8 ? n_sc * 2 : 0;
    for (int l = 0; l < n_layers; l++) {
        dsq_kv_layer_t *L = &kv->layers[l];
        L->dtype = dtype;
        L->block_size = block_size;
        L->n_kv_heads = n_kv_heads;
        L->head_dim = head_dim;
        L->n_blocks = n_blocks;
        L->k = storage_alloc(kv, n_vals, elem);
        L->v = has_v ? storage_alloc(kv, n_vals, elem) : NULL;
        if (!L->k || (has_v && !L->v))
            goto fail;
        kv->storage_bytes += (has_v ? 2 : 1) * n_vals * elem;
        if (dtype == DSQ_KV_INT8) {
            L->k_scale = storage_alloc(kv, n_sc, 2);
            L->k_zero = storage_alloc(kv, n_sc, 2);
            L->v_scale = has_v ? storage_alloc(kv, n_sc, 2) : NULL;
            L->v_zero = has_v ? storage_alloc(kv, n_sc, 2) : NULL;
            if (!L->k_scale || !L->k_zero || (has_v && (!L->v_scale || !L->v_zero)))
                goto fail;
            kv->storage_bytes += (has_v ? 4 : 2) * n_sc * 2;
        }
    }
    /* Pop order: low ids first, so a fresh cache fills from the start. */
    for (int64_t i = 0; i < n_blocks; i++)
        kv->free_stack[i] = (int32_t)(n_blocks - 1 - i);
    kv->n_free = n_blocks;
    kv->lru_head = kv->lru_tail = -1;
    return kv;
fail:
    snprintf(err, err_len, "kv cache: out of %s memory for %lld blocks of %d tokens",
             kv && kv->be ? dsq_backend_name(kv->be) : "host", (long long)n_blocks,
             block_size);
    dsq_kv_destroy(kv);
    return NULL;
}

/* Frees the prefix-cache tables (allocated by dsq_kv_set_prefix_caching)
 * and leaves their pointers NULL. */
static void pc_free(dsq_kv_cache_t *kv)
{
    free(kv->hash);
    free(kv->cached);
    free(kv->tok);
    free(kv->hnext);
    free(kv->buckets);
    free(kv->lru_prev);
    free(kv->lru_next);
    free(kv->hbuf);
    kv->hash = NULL;
    kv->cached = NULL;
    kv->tok = kv->hnext = kv->buckets = kv->lru_prev = kv->lru_next = NULL;
    kv->hbuf = NULL;
}

void dsq_kv_destroy(dsq_kv_cache_t *kv)
{
    if (!kv)
        return;
    for (int l = 0; kv->layers && l < kv->n_layers; l++) {
        dsq_kv_layer_t *L = &kv->layers[l];
        void *arrs[6] = {L->k, L->v, L->k_scale, L->k_zero, L->v_scale, L->v_zero};
        for (int a = 0; a < 6; a++)
            storage_free(kv, arrs[a]);
    }
    free(kv->layers);
    free(kv->free_stack);
    free(kv->refcount);
    pc_free(kv);
    free(kv);
}

size_t dsq_kv_storage_bytes(const dsq_kv_cache_t *kv) { return kv->storage_bytes; }

/* hardening: commit the pages of one calloc'd region. MADV_POPULATE_WRITE
 * (Linux 5.14) faults them in writable in one call; where the kernel lacks
 * it, a write of zero to one byte per page does the same (the region is
 * zero already, so the contents do not change). No MADV_HUGEPAGE: with
 * THP in "madvise" mode the kernel then compacts memory for 2 MiB pages,
 * which made committing 4 GiB take 7.1 s instead of 1.3 s on the dev box. */
static size_t prefault_region(void *p, size_t n, size_t page)
{
    if (!p || !n)
        return 0;
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(uintptr_t)(page - 1);
    int done = 0;
#ifdef MADV_POPULATE_WRITE
    done = hi > lo && madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0;
#endif
    volatile unsigned char *b = p;
    if (!done)
        for (size_t i = 0; i < n; i += page)
            b[i] = 0;
    b[0] = 0;        /* the partial pages at either end */
    b[n - 1] = 0;
    return n;
}

size_t dsq_kv_prefault(dsq_kv_cache_t *kv)
{
    if (!kv || kv->be)
        return 0;
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    size_t total = 0;
    /* one region at a time across the threads: the pages land on the NUMA
     * nodes of the threads that will read them, as first touch in a step would */
    int n = kv->n_layers * 6;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : total)
    for (int i = 0; i < n; i++) {
        dsq_kv_layer_t *L = &kv->layers[i / 6];
        void *arrs[6] = {L->k, L->v, L->k_scale, L->k_zero, L->v_scale, L->v_zero};
        total += prefault_region(arrs[i % 6], i % 6 < 2 ? kv->val_bytes : kv->sc_bytes, page);
    }
    return total;
}

const dsq_kv_layer_t *dsq_kv_layer(const dsq_kv_cache_t *kv, int layer)
{
    return &kv->layers[layer];
}

int dsq_kv_block_size(const dsq_kv_cache_t *kv) { return kv->block_size; }
int64_t dsq_kv_n_blocks(const dsq_kv_cache_t *kv) { return kv->n_blocks; }
int64_t dsq_kv_n_free(const dsq_kv_cache_t *kv) { return kv->n_free + kv->n_evictable; }
int64_t dsq_kv_n_evictable(const dsq_kv_cache_t *kv) { return kv->n_evictable; }
int64_t dsq_kv_n_cached(const dsq_kv_cache_t *kv) { return kv->n_cached; }
bool dsq_kv_prefix_caching(const dsq_kv_cache_t *kv) { return kv->pc_on; }

bool dsq_kv_block_is_cached(const dsq_kv_cache_t *kv, int32_t block)
{
    return kv->pc_on && block >= 0 && block < kv->n_blocks && kv->cached[block];
}

int dsq_kv_set_prefix_caching(dsq_kv_cache_t *kv, bool on)
{
    if (on == kv->pc_on)
        return DSQ_OK;
    if (kv->n_free != kv->n_blocks || kv->n_cached != 0)
        return DSQ_ESTATE;
    if (!on) {
        kv->pc_on = false;
        return DSQ_OK;
    }
    if (!kv->hash) {
        size_t nb = (size_t)kv->n_blocks;
        uint32_t nbk = 16;
        while (nbk < 2 * nb && nbk < (1u << 30))
            nbk <<= 1;
        kv->hash = calloc(nb, sizeof(*kv->hash));
        kv->cached = calloc(nb, 1);
        kv->tok = malloc(nb * (size_t)kv->block_size * sizeof(*kv->tok));
        kv->hnext = malloc(nb * sizeof(*kv->hnext));
        kv->buckets = malloc((size_t)nbk * sizeof(*kv->buckets));
        kv->lru_prev = malloc(nb * sizeof(*kv->lru_prev));
        kv->lru_next = malloc(nb * sizeof(*kv->lru_next));
        kv->hbuf = malloc(32 + 4 * (size_t)kv->block_size);
        if (!kv->hash || !kv->cached || !kv->tok || !kv->hnext || !kv->buckets ||
            !kv->lru_prev || !kv->lru_next || !kv->hbuf) {
            pc_free(kv);
            return DSQ_ENOMEM;
        }
        kv->bucket_mask = nbk - 1;
        for (uint32_t i = 0; i < nbk; i++)
            kv->buckets[i] = -1;
    }
    kv->pc_on = true;
    return DSQ_OK;
}

static uint32_t bucket_of(const dsq_kv_cache_t *kv, const dsq_block_hash_t *h)
{
    uint32_t x = (uint32_t)h->b[0] | (uint32_t)h->b[1] << 8 | (uint32_t)h->b[2] << 16 |
                 (uint32_t)h->b[3] << 24;
    return x & kv->bucket_mask;
}

void dsq_kv_block_hash(const dsq_kv_cache_t *kv, const dsq_block_hash_t *parent,
                       const int32_t *tokens, dsq_block_hash_t *out)
{
    /* hbuf is scratch, not state: the cache stays logically const. */
    uint8_t *p = kv->hbuf, stack[32 + 4 * 64], *heap = NULL;
    size_t n = 32 + 4 * (size_t)kv->block_size;
    if (!p) {
        p = n <= sizeof(stack) ? stack : (heap = malloc(n));
        if (!p) {   /* only with prefix caching off and a huge block_size */
            memset(out, 0, sizeof(*out));
            return;
        }
    }
    if (parent)
        memcpy(p, parent->b, 32);
    else
        memset(p, 0, 32);
    for (int i = 0; i < kv->block_size; i++) {
        uint32_t t = (uint32_t)tokens[i];
        p[32 + 4 * i] = (uint8_t)t;
        p[33 + 4 * i] = (uint8_t)(t >> 8);
        p[34 + 4 * i] = (uint8_t)(t >> 16);
        p[35 + 4 * i] = (uint8_t)(t >> 24);
    }
    SHA256(p, n, out->b);
    free(heap);
}

/* The cached block holding digest h and tokens, or -1. */
static int32_t cache_find(const dsq_kv_cache_t *kv, const dsq_block_hash_t *h,
                          const int32_t *tokens)
{
    size_t tb = (size_t)kv->block_size * sizeof(*tokens);
    for (int32_t b = kv->buckets[bucket_of(kv, h)]; b >= 0; b = kv->hnext[b])
        if (memcmp(kv->hash[b].b, h->b, 32) == 0 &&
            memcmp(kv->tok + (size_t)b * (size_t)kv->block_size, tokens, tb) == 0)
            return b;
    return -1;
}

static void cache_insert(dsq_kv_cache_t *kv, int32_t b, const dsq_block_hash_t *h,
                         const int32_t *tokens)
{
    uint32_t k = bucket_of(kv, h);
    kv->hash[b] = *h;
    memcpy(kv->tok + (size_t)b * (size_t)kv->block_size, tokens,
           (size_t)kv->block_size * sizeof(*tokens));
    kv->cached[b] = 1;
    kv->hnext[b] = kv->buckets[k];
    kv->buckets[k] = b;
    kv->n_cached++;
}

static void cache_remove(dsq_kv_cache_t *kv, int32_t b)
{
    int32_t *link = &kv->buckets[bucket_of(kv, &kv->hash[b])];
    while (*link != b)
        link = &kv->hnext[*link];
    *link = kv->hnext[b];
    kv->cached[b] = 0;
    kv->n_cached--;
}

static void lru_unlink(dsq_kv_cache_t *kv, int32_t b)
{
    int32_t p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0)
        kv->lru_next[p] = n;
    else
        kv->lru_head = n;
    if (n >= 0)
        kv->lru_prev[n] = p;
    else
        kv->lru_tail = p;
    kv->n_evictable--;
}

static void lru_push_tail(dsq_kv_cache_t *kv, int32_t b)
{
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0)
        kv->lru_next[kv->lru_tail] = b;
    else
        kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_evictable++;
}

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
    bt->hashes = NULL;
    bt->n_hashed = 0;
}

void dsq_block_table_deinit(dsq_block_table_t *bt)
{
    free(bt->ids);
    free(bt->hashes);
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
    dsq_block_hash_t *h = realloc(bt->hashes, (size_t)cap * sizeof(*h));
    if (!h)
        return DSQ_ENOMEM;   /* ids grew, cap did not: still consistent */
    bt->hashes = h;
    bt->cap = cap;
    return DSQ_OK;
}

/* A block for new writes: a truly free one, else the least recently used
 * evictable cached block, whose digest is dropped. Caller checked
 * dsq_kv_n_free() > 0. */
static int32_t pop_free(dsq_kv_cache_t *kv)
{
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_stack[--kv->n_free];
    } else {
        b = kv->lru_head;
        lru_unlink(kv, b);
        cache_remove(kv, b);
    }
    kv->refcount[b] = 1;
    return b;
}

static void unref(dsq_kv_cache_t *kv, int32_t b)
{
    if (--kv->refcount[b] == 0) {
        if (kv->pc_on && kv->cached[b])
            lru_push_tail(kv, b);
        else
            kv->free_stack[kv->n_free++] = b;
    }
}

int dsq_kv_seq_reserve(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                       int64_t n_tokens)
{
    int need = dsq_kv_blocks_for(kv, n_tokens);
    if (need <= bt->n)
        return DSQ_OK;
    if (need - bt->n > dsq_kv_n_free(kv))
        return DSQ_EFULL;
    int rc = bt_grow(bt, need);
    if (rc)
        return rc;
    while (bt->n < need)
        bt->ids[bt->n++] = pop_free(kv);
    return DSQ_OK;
}

/* dst <- src bytes: host memcpy, or a copy queued on the cache's backend */
static void copy_bytes(dsq_kv_cache_t *kv, void *dst, const void *src, size_t n)
{
    if (!kv->be)
        memcpy(dst, src, n);
    else if (dsq_backend_copy(kv->be, dst, src, n) != DSQ_OK)
        dsq_log(DSQ_LOG_ERROR, "event=kv_copy_failed bytes=%zu backend=%s", n,
                dsq_backend_name(kv->be));
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
        copy_bytes(kv, (char *)L->k + (size_t)dst * per_block * elem,
                   (char *)L->k + (size_t)src * per_block * elem, per_block * elem);
        if (kv->has_v)
            copy_bytes(kv, (char *)L->v + (size_t)dst * per_block * elem,
                       (char *)L->v + (size_t)src * per_block * elem, per_block * elem);
        if (kv->dtype == DSQ_KV_INT8) {
            uint16_t *arrs[4] = {L->k_scale, L->k_zero, L->v_scale, L->v_zero};
            for (int a = 0; a < (kv->has_v ? 4 : 2); a++)
                copy_bytes(kv, (char *)arrs[a] + (size_t)dst * sc,
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
        if (dsq_kv_n_free(kv) == 0)
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
    if (src->n_hashed > 0)
        memcpy(dst->hashes, src->hashes, (size_t)src->n_hashed * sizeof(*dst->hashes));
    dst->n = src->n;
    dst->n_hashed = src->n_hashed;
    return DSQ_OK;
}

void dsq_kv_seq_free(dsq_kv_cache_t *kv, dsq_block_table_t *bt)
{
    for (int i = bt->n - 1; i >= 0; i--)
        unref(kv, bt->ids[i]);
    bt->n = 0;
    bt->n_hashed = 0;
}

void dsq_kv_seq_truncate(dsq_kv_cache_t *kv, dsq_block_table_t *bt, int64_t n_tokens)
{
    int keep = dsq_kv_blocks_for(kv, n_tokens);
    while (bt->n > keep)
        unref(kv, bt->ids[--bt->n]);
    if (bt->n_hashed > bt->n)
        bt->n_hashed = bt->n;
}

int dsq_kv_prefix_lookup(const dsq_kv_cache_t *kv, const int32_t *tokens,
                         int64_t n_tokens, int max_blocks, int32_t *ids,
                         dsq_block_hash_t *hashes, int *n_evictable)
{
    int n = 0, ev = 0;
    if (kv->pc_on && tokens && n_tokens > 0 && kv->n_cached > 0) {
        int64_t n_full = n_tokens / kv->block_size;
        if (n_full > max_blocks)
            n_full = max_blocks;
        dsq_block_hash_t h[2];
        for (; n < n_full; n++) {
            const int32_t *t = tokens + (size_t)n * (size_t)kv->block_size;
            dsq_kv_block_hash(kv, n ? &h[(n - 1) & 1] : NULL, t, &h[n & 1]);
            int32_t b = cache_find(kv, &h[n & 1], t);
            if (b < 0)
                break;
            ids[n] = b;
            if (hashes)
                hashes[n] = h[n & 1];
            ev += kv->refcount[b] == 0;
        }
    }
    if (n_evictable)
        *n_evictable = ev;
    return n;
}

int dsq_kv_seq_share_prefix(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                            const int32_t *ids, const dsq_block_hash_t *hashes,
                            int n)
{
    if (bt->n != 0 || n < 0)
        return DSQ_EINVAL;
    for (int i = 0; i < n; i++)
        if (!dsq_kv_block_is_cached(kv, ids[i]))
            return DSQ_EINVAL;
    int rc = bt_grow(bt, n);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        int32_t b = ids[i];
        if (kv->refcount[b]++ == 0)
            lru_unlink(kv, b);
        bt->ids[i] = b;
        bt->hashes[i] = hashes ? hashes[i] : kv->hash[b];
    }
    bt->n = bt->n_hashed = n;
    return DSQ_OK;
}

int dsq_kv_seq_cache_blocks(dsq_kv_cache_t *kv, dsq_block_table_t *bt,
                            const int32_t *tokens, int64_t n_computed)
{
    if (!kv->pc_on)
        return DSQ_OK;
    int64_t n_full = n_computed / kv->block_size;
    if (n_full > bt->n)
        n_full = bt->n;
    for (int i = bt->n_hashed; i < n_full; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)kv->block_size;
        dsq_kv_block_hash(kv, i ? &bt->hashes[i - 1] : NULL, t, &bt->hashes[i]);
        int32_t b = bt->ids[i];
        if (!kv->cached[b] && cache_find(kv, &bt->hashes[i], t) < 0)
            cache_insert(kv, b, &bt->hashes[i], t);
        bt->n_hashed = i + 1;
    }
    return DSQ_OK;
}

int32_t dsq_kv_slot(const dsq_kv_cache_t *kv, const dsq_block_table_t *bt,
                    int64_t pos)
{
    return bt->ids[pos / kv->block_size] * kv->block_size +
           (int32_t)(pos % kv->block_size);
}

/* Prefix-cache half of dsq_kv_check: LRU list links and membership, hash
 * chains against the cached flags and digests, no digest twice. mark[] has
 * -2 for every block the LRU walk visits. */
static bool check_prefix(const dsq_kv_cache_t *kv, int32_t *mark)
{
    bool ok = true;
    int64_t n = 0;
    int32_t prev = -1;
    for (int32_t b = kv->lru_head; b >= 0 && n <= kv->n_blocks; b = kv->lru_next[b], n++) {
        if (kv->lru_prev[b] != prev || !kv->cached[b] || kv->refcount[b] != 0 ||
            mark[b] != 0)
            ok = false;
        mark[b] = -2;
        prev = b;
    }
    if (n != kv->n_evictable || prev != kv->lru_tail)
        ok = false;
    int64_t n_chain = 0;
    for (uint32_t k = 0; k <= kv->bucket_mask; k++) {
        int len = 0;
        for (int32_t b = kv->buckets[k]; b >= 0; b = kv->hnext[b], len++) {
            if (b >= kv->n_blocks || !kv->cached[b] || bucket_of(kv, &kv->hash[b]) != k ||
                len > kv->n_blocks || ++n_chain > kv->n_blocks) {
                ok = false;
                break;
            }
            for (int32_t c = kv->hnext[b]; c >= 0 && c < kv->n_blocks; c = kv->hnext[c])
                if (memcmp(kv->hash[c].b, kv->hash[b].b, 32) == 0 || c == b) {
                    ok = false;
                    break;
                }
        }
    }
    int64_t n_flag = 0;
    for (int64_t b = 0; b < kv->n_blocks; b++)
        n_flag += kv->cached[b];
    if (n_chain != kv->n_cached || n_flag != kv->n_cached)
        ok = false;
    return ok;
}

bool dsq_kv_check(const dsq_kv_cache_t *kv, const dsq_block_table_t *const *tables,
                  int n_tables)
{
    bool ok = true;
    int32_t *seen = calloc((size_t)kv->n_blocks, sizeof(*seen));
    if (!seen)
        return false;
    for (int t = 0; t < n_tables; t++) {
        const dsq_block_table_t *bt = tables[t];
        if (bt->n_hashed < 0 || bt->n_hashed > bt->n)
            ok = false;
        for (int i = 0; i < bt->n; i++) {
            int32_t b = bt->ids[i];
            if (b < 0 || b >= kv->n_blocks) {
                ok = false;
                continue;
            }
            seen[b]++;
            /* a cached block sits in the table only where its digest fits */
            if (kv->pc_on && kv->cached[b] &&
                (i >= bt->n_hashed || memcmp(bt->hashes[i].b, kv->hash[b].b, 32) != 0))
                ok = false;
        }
    }
    for (int64_t i = 0; i < kv->n_free; i++) {
        int32_t b = kv->free_stack[i];
        if (b < 0 || b >= kv->n_blocks || seen[b] != 0 || kv->refcount[b] != 0 ||
            (kv->pc_on && kv->cached[b]))
            ok = false;
        else
            seen[b] = -1;
    }
    if (kv->pc_on) {
        ok = check_prefix(kv, seen) && ok;
    } else if (kv->n_evictable != 0 || kv->n_cached != 0) {
        ok = false;
    }
    int64_t n_ref = 0;
    for (int64_t b = 0; b < kv->n_blocks; b++) {
        if (seen[b] < 0)
            continue;
        if (seen[b] != kv->refcount[b] || seen[b] == 0)
            ok = false;
        n_ref++;
    }
    if (n_ref + kv->n_free + kv->n_evictable != kv->n_blocks)
        ok = false;
    free(seen);
    return ok;
}

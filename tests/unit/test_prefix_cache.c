/* tests for the prefix cache of engine/kv/kv_cache.c and its use by
 * engine/serve/scheduler.c (vLLM's automatic prefix caching).
 *
 * Block digests are checked against hashlib's SHA-256
 * (tests/ref/make_prefix_hash.py prints the expected values); the rest
 * checks the block states (free / evictable / referenced), refcounts, LRU
 * eviction order, copy-on-write next to cached blocks, the scheduler's
 * reuse rules (full blocks only, the last token always recomputed) and
 * dsq_kv_check after every operation, including that it notices damage. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/serve/scheduler.h"

#define BS 4

static dsq_kv_cache_t *make_kv(int n_blocks, bool prefix)
{
    char err[256];
    dsq_kv_cache_t *kv = dsq_kv_create(1, 1, 4, BS, n_blocks, DSQ_KV_F16, err, sizeof(err));
    assert_non_null(kv);
    if (prefix)
        assert_int_equal(dsq_kv_set_prefix_caching(kv, true), DSQ_OK);
    return kv;
}

static void hex_of(const dsq_block_hash_t *h, char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", h->b[i]);
}

static bool check1(const dsq_kv_cache_t *kv, const dsq_block_table_t *a,
                   const dsq_block_table_t *b)
{
    const dsq_block_table_t *t[2];
    int n = 0;
    if (a)
        t[n++] = a;
    if (b)
        t[n++] = b;
    return dsq_kv_check(kv, t, n);
}

/* Digests equal hashlib's, and the chain makes them depend on the prefix. */
static void test_hash_chain(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = make_kv(4, true);
    const int32_t t1[BS] = {1, 2, 3, 4}, t2[BS] = {5, 6, 7, 8};
    const int32_t t3[BS] = {-1, 70000, 0, INT32_MAX};
    dsq_block_hash_t a, b, c, d;
    char hex[65];
    dsq_kv_block_hash(kv, NULL, t1, &a);
    dsq_kv_block_hash(kv, &a, t2, &b);
    dsq_kv_block_hash(kv, NULL, t2, &c);
    dsq_kv_block_hash(kv, NULL, t3, &d);
    hex_of(&a, hex);
    assert_string_equal(hex, "d8faa8ec8c0500567ca87b56e4bb666d69cb512e638103891defea24e88cbc92");
    hex_of(&b, hex);
    assert_string_equal(hex, "d1637bc3762f67abb1ac6b35e87c7ddaee8d04b0c3879d2d3afb2f6dc3f6a56a");
    hex_of(&c, hex);
    assert_string_equal(hex, "5a1cf0f16965be573c9baec69623d6f26bc14da8f3abae7986d9156850c7c852");
    hex_of(&d, hex);
    assert_string_equal(hex, "7dc97ff2c171df6d6da7a9043c14b02ee23b907cb88b7ed7d82e44dc61c94cea");
    /* same tokens, different prefix: different digest */
    assert_memory_not_equal(b.b, c.b, 32);
    /* the digest does not depend on whether the cache is on */
    dsq_kv_cache_t *off = make_kv(4, false);
    dsq_block_hash_t a2;
    dsq_kv_block_hash(off, NULL, t1, &a2);
    assert_memory_equal(a.b, a2.b, 32);
    dsq_kv_destroy(off);
    dsq_kv_destroy(kv);
}

/* A sequence's full blocks are cached as they are computed, the partial
 * last one never; another sequence with the same prefix reuses them. */
static void test_reuse(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = make_kv(16, true);
    int32_t ta[14], tb[20], tc[14];
    for (int i = 0; i < 14; i++)
        ta[i] = tc[i] = 100 + i;
    for (int i = 0; i < 20; i++)
        tb[i] = i < 14 ? ta[i] : 7;
    tc[5] = 999;                                    /* differs in block 1 */
    dsq_block_table_t a, b;
    dsq_block_table_init(&a);
    dsq_block_table_init(&b);
    assert_int_equal(dsq_kv_seq_reserve(kv, &a, 14), DSQ_OK);   /* 4 blocks */
    /* computed so far: 6 tokens -> only block 0 is full */
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &a, ta, 6), DSQ_OK);
    assert_int_equal(a.n_hashed, 1);
    assert_int_equal(dsq_kv_n_cached(kv), 1);
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &a, ta, 14), DSQ_OK);
    assert_int_equal(a.n_hashed, 3);
    assert_int_equal(dsq_kv_n_cached(kv), 3);
    assert_false(dsq_kv_block_is_cached(kv, a.ids[3]));        /* partial */
    assert_true(check1(kv, &a, NULL));

    int32_t ids[8];
    dsq_block_hash_t hs[8];
    int n_ev = -1;
    assert_int_equal(dsq_kv_prefix_lookup(kv, tb, 20, 8, ids, hs, &n_ev), 3);
    assert_int_equal(n_ev, 0);                    /* all held by a */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ids[i], a.ids[i]);
        assert_memory_equal(hs[i].b, a.hashes[i].b, 32);
    }
    /* max_blocks caps the match ((n - 1) / block_size for a 12-token prompt) */
    assert_int_equal(dsq_kv_prefix_lookup(kv, tb, 12, (12 - 1) / BS, ids, NULL, NULL), 2);
    /* a change in block 1 stops the chain there, later blocks included */
    assert_int_equal(dsq_kv_prefix_lookup(kv, tc, 14, 8, ids, NULL, NULL), 1);
    /* same block-1 tokens after a different block 0: no match at all */
    int32_t td[8] = {1, 1, 1, 1, 104, 105, 106, 107};
    assert_int_equal(dsq_kv_prefix_lookup(kv, td, 8, 8, ids, NULL, NULL), 0);

    assert_int_equal(dsq_kv_prefix_lookup(kv, tb, 20, 8, ids, hs, NULL), 3);
    assert_int_equal(dsq_kv_seq_share_prefix(kv, &b, ids, hs, 3), DSQ_OK);
    assert_int_equal(b.n, 3);
    assert_int_equal(b.n_hashed, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(dsq_kv_refcount(kv, a.ids[i]), 2);
    assert_int_equal(dsq_kv_seq_share_prefix(kv, &b, ids, hs, 3), DSQ_EINVAL);  /* not empty */
    assert_int_equal(dsq_kv_seq_reserve(kv, &b, 20), DSQ_OK);
    assert_int_equal(dsq_kv_seq_cow(kv, &b, 12, 20), DSQ_OK);   /* only new blocks */
    for (int i = 0; i < 3; i++)
        assert_int_equal(b.ids[i], a.ids[i]);
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &b, tb, 20), DSQ_OK);
    assert_int_equal(b.n_hashed, 5);
    assert_int_equal(dsq_kv_n_cached(kv), 5);
    assert_true(check1(kv, &a, &b));
    /* a block that is not cached cannot be shared */
    dsq_block_table_t c;
    dsq_block_table_init(&c);
    int32_t bad = a.ids[3];
    assert_int_equal(dsq_kv_seq_share_prefix(kv, &c, &bad, NULL, 1), DSQ_EINVAL);
    assert_int_equal(c.n, 0);
    /* the check notices a missing reference */
    assert_false(check1(kv, &a, NULL));

    dsq_kv_seq_free(kv, &a);
    dsq_kv_seq_free(kv, &b);
    assert_int_equal(dsq_kv_n_free(kv), 16);
    assert_int_equal(dsq_kv_n_evictable(kv), 5);
    assert_true(check1(kv, NULL, NULL));
    /* cached blocks outlive their sequences */
    assert_int_equal(dsq_kv_prefix_lookup(kv, tb, 20, 8, ids, NULL, &n_ev), 5);
    assert_int_equal(n_ev, 5);
    /* and prefix caching cannot be switched while blocks are cached */
    assert_int_equal(dsq_kv_set_prefix_caching(kv, false), DSQ_ESTATE);
    dsq_block_table_deinit(&a);
    dsq_block_table_deinit(&b);
    dsq_block_table_deinit(&c);
    dsq_kv_destroy(kv);
}

/* Truly free blocks go first; then cached ones, least recently used first,
 * a sequence's tail before its head; reuse refreshes recency. */
static void test_lru_eviction(void **state)
{
    (void)state;
    const int nb = 8;
    dsq_kv_cache_t *kv = make_kv(nb, true);
    int32_t t[16];
    for (int i = 0; i < 16; i++)
        t[i] = 1000 + i;
    dsq_block_table_t a, f;
    dsq_block_table_init(&a);
    dsq_block_table_init(&f);
    assert_int_equal(dsq_kv_seq_reserve(kv, &a, 16), DSQ_OK);
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &a, t, 16), DSQ_OK);
    int32_t blk[4];
    memcpy(blk, a.ids, sizeof(blk));
    dsq_kv_seq_free(kv, &a);
    assert_int_equal(dsq_kv_n_evictable(kv), 4);
    assert_int_equal(dsq_kv_n_free(kv), nb);
    for (int i = 0; i < 4; i++)
        assert_int_equal(dsq_kv_refcount(kv, blk[i]), 0);

    /* 4 truly free blocks are taken before any cached one */
    assert_int_equal(dsq_kv_seq_reserve(kv, &f, 4 * BS), DSQ_OK);
    assert_int_equal(dsq_kv_n_cached(kv), 4);
    assert_int_equal(dsq_kv_n_free(kv), 4);
    assert_true(check1(kv, &f, NULL));

    /* touch block 0 again (share + free): it becomes the most recent */
    int32_t ids[4];
    assert_int_equal(dsq_kv_prefix_lookup(kv, t, 4, 1, ids, NULL, NULL), 1);
    assert_int_equal(ids[0], blk[0]);
    assert_int_equal(dsq_kv_seq_share_prefix(kv, &a, ids, NULL, 1), DSQ_OK);
    assert_int_equal(dsq_kv_n_evictable(kv), 3);
    assert_int_equal(dsq_kv_n_free(kv), 3);
    assert_true(check1(kv, &f, &a));
    dsq_kv_seq_free(kv, &a);

    /* eviction order now: block 3, 2, 1 (freed tail first), then 0 */
    const int order[4] = {3, 2, 1, 0};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(dsq_kv_seq_reserve(kv, &f, (4 + k + 1) * BS), DSQ_OK);
        assert_int_equal(f.ids[f.n - 1], blk[order[k]]);
        assert_false(dsq_kv_block_is_cached(kv, blk[order[k]]));
        assert_int_equal(dsq_kv_n_cached(kv), 3 - k);
        assert_true(check1(kv, &f, NULL));
        /* the chain is cut at the first evicted block */
        assert_int_equal(dsq_kv_prefix_lookup(kv, t, 16, 4, ids, NULL, NULL), 3 - k);
    }
    /* all or nothing counts evictable blocks too: none left now */
    assert_int_equal(dsq_kv_seq_reserve(kv, &f, 9 * BS), DSQ_EFULL);
    assert_int_equal(f.n, nb);
    dsq_kv_seq_free(kv, &f);
    assert_int_equal(dsq_kv_n_free(kv), nb);
    assert_int_equal(dsq_kv_n_evictable(kv), 0);
    assert_true(check1(kv, NULL, NULL));
    dsq_block_table_deinit(&a);
    dsq_block_table_deinit(&f);
    dsq_kv_destroy(kv);
}

/* n > 1 forks share cached and partial blocks; copy on write copies only
 * the partial one, a duplicate full block stays uncached, the fork keeps
 * the digests, and blocks come back exactly once. */
static void test_fork_cow(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = make_kv(12, true);
    int32_t t[12];
    for (int i = 0; i < 12; i++)
        t[i] = 7 * i;
    dsq_block_table_t a, b;
    dsq_block_table_init(&a);
    dsq_block_table_init(&b);
    assert_int_equal(dsq_kv_seq_reserve(kv, &a, 10), DSQ_OK);  /* 2 full + 2 */
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &a, t, 10), DSQ_OK);
    assert_int_equal(dsq_kv_seq_fork(kv, &b, &a), DSQ_OK);
    assert_int_equal(b.n_hashed, 2);
    assert_memory_equal(b.hashes, a.hashes, 2 * sizeof(*a.hashes));
    assert_int_equal(dsq_kv_refcount(kv, a.ids[0]), 2);
    assert_true(check1(kv, &a, &b));
    /* both write position 10: each gets its own block 2 */
    assert_int_equal(dsq_kv_seq_cow(kv, &a, 10, 11), DSQ_OK);
    assert_int_equal(dsq_kv_seq_cow(kv, &b, 10, 11), DSQ_OK);
    assert_int_equal(a.ids[0], b.ids[0]);
    assert_int_equal(a.ids[1], b.ids[1]);
    assert_int_equal(dsq_kv_refcount(kv, a.ids[2]), 1);
    assert_int_equal(dsq_kv_refcount(kv, b.ids[2]), 1);
    /* both fill block 2 with the same tokens: one copy is cached, the other
     * is a duplicate and stays uncached */
    assert_int_equal(dsq_kv_seq_reserve(kv, &a, 12), DSQ_OK);
    assert_int_equal(dsq_kv_seq_reserve(kv, &b, 12), DSQ_OK);
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &a, t, 12), DSQ_OK);
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &b, t, 12), DSQ_OK);
    assert_true(dsq_kv_block_is_cached(kv, a.ids[2]));
    assert_false(dsq_kv_block_is_cached(kv, b.ids[2]));
    assert_int_equal(b.n_hashed, 3);
    assert_int_equal(dsq_kv_n_cached(kv), 3);
    assert_true(check1(kv, &a, &b));
    /* COW of a shared cached block (not something the scheduler asks for,
     * but it must stay correct): b gets an uncached private copy */
    int32_t shared = a.ids[0];
    assert_int_equal(dsq_kv_seq_cow(kv, &b, 0, 1), DSQ_OK);
    assert_int_not_equal(b.ids[0], shared);
    assert_false(dsq_kv_block_is_cached(kv, b.ids[0]));
    assert_true(dsq_kv_block_is_cached(kv, shared));
    assert_int_equal(dsq_kv_refcount(kv, shared), 1);
    assert_true(check1(kv, &a, &b));
    dsq_kv_seq_free(kv, &b);
    assert_true(check1(kv, &a, NULL));
    dsq_kv_seq_free(kv, &a);
    assert_int_equal(dsq_kv_n_free(kv), 12);
    assert_int_equal(dsq_kv_n_evictable(kv), 3);
    assert_true(check1(kv, NULL, NULL));
    dsq_block_table_deinit(&a);
    dsq_block_table_deinit(&b);
    dsq_kv_destroy(kv);
}

/* Off: nothing is cached, freed blocks go straight back, lookups miss. */
static void test_off(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = make_kv(8, false);
    assert_false(dsq_kv_prefix_caching(kv));
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8}, ids[2];
    dsq_block_table_t a;
    dsq_block_table_init(&a);
    assert_int_equal(dsq_kv_seq_reserve(kv, &a, 8), DSQ_OK);
    assert_int_equal(dsq_kv_seq_cache_blocks(kv, &a, t, 8), DSQ_OK);
    assert_int_equal(dsq_kv_n_cached(kv), 0);
    assert_int_equal(a.n_hashed, 0);
    assert_int_equal(dsq_kv_prefix_lookup(kv, t, 8, 2, ids, NULL, NULL), 0);
    assert_int_equal(dsq_kv_set_prefix_caching(kv, true), DSQ_ESTATE);  /* in use */
    dsq_kv_seq_free(kv, &a);
    assert_int_equal(dsq_kv_n_evictable(kv), 0);
    assert_true(check1(kv, NULL, NULL));
    assert_int_equal(dsq_kv_set_prefix_caching(kv, true), DSQ_OK);
    assert_int_equal(dsq_kv_set_prefix_caching(kv, false), DSQ_OK);
    dsq_block_table_deinit(&a);
    dsq_kv_destroy(kv);
}

/* ------------------------------------------------------------ scheduler */

static dsq_seq_t *mk_seq(uint64_t order, const int32_t *t, int n)
{
    dsq_seq_t *s = calloc(1, sizeof(*s));
    s->order = order;
    s->cap_tokens = n + 16;
    s->tokens = calloc((size_t)s->cap_tokens, sizeof(int32_t));
    memcpy(s->tokens, t, (size_t)n * sizeof(*t));
    s->n_tokens = s->n_prompt = n;
    dsq_block_table_init(&s->bt);
    return s;
}

static void rm_seq(dsq_sched_t *sch, dsq_seq_t *s)
{
    dsq_sched_remove(sch, s);
    dsq_block_table_deinit(&s->bt);
    free(s->tokens);
    free(s);
}

/* Run seq until its prompt is computed; returns the tokens computed in
 * its first step. */
static int prefill(dsq_sched_t *sch, dsq_seq_t *s, int *n_first_computed)
{
    dsq_sched_out_t out;
    int first = -1;
    while (s->n_computed < s->n_tokens) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        if (first < 0) {
            *n_first_computed = s->n_computed;   /* set at admission */
            first = s->sched_tokens;
        }
        dsq_sched_commit(sch, &out);
        assert_true(dsq_sched_check(sch));
    }
    return first;
}

static void test_sched_reuse(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = make_kv(64, true);
    dsq_sched_opts_t so = {.max_num_seqs = 4, .max_num_batched_tokens = 16};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    int32_t t[41];
    for (int i = 0; i < 41; i++)
        t[i] = 3 * i + 1;
    int pre = -1;
    /* first time: nothing cached, chunked prefill from 0 */
    dsq_seq_t *a = mk_seq(0, t, 40);
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(prefill(sch, a, &pre), 16);
    assert_int_equal(pre, 0);
    assert_int_equal(a->n_cached_prompt, 0);
    assert_int_equal(a->bt.n_hashed, 10);
    rm_seq(sch, a);
    /* same 40-token prompt: 9 blocks reused, the last block recomputed */
    dsq_seq_t *b = mk_seq(1, t, 40);
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    assert_int_equal(prefill(sch, b, &pre), 4);
    assert_int_equal(pre, 36);
    assert_int_equal(b->n_cached_prompt, 36);
    /* 41 tokens, the first 40 cached: only the last token is computed,
     * while b still holds the shared blocks */
    dsq_seq_t *c = mk_seq(2, t, 41);
    assert_int_equal(dsq_sched_add(sch, c), DSQ_OK);
    assert_int_equal(prefill(sch, c, &pre), 1);
    assert_int_equal(pre, 40);
    assert_int_equal(c->n_cached_prompt, 40);
    assert_int_equal(dsq_kv_refcount(kv, c->bt.ids[0]), 2);
    /* a sequence that must not reuse (prompt logprobs) computes all */
    dsq_seq_t *d = mk_seq(3, t, 40);
    d->no_prefix_cache = true;
    assert_int_equal(dsq_sched_add(sch, d), DSQ_OK);
    assert_int_equal(prefill(sch, d, &pre), 16);
    assert_int_equal(pre, 0);
    assert_int_equal(d->n_cached_prompt, 0);
    int64_t q, h;
    dsq_sched_prefix_stats(sch, &q, &h);
    assert_int_equal(q, 40 + 40 + 41 + 40);
    assert_int_equal(h, 36 + 40);
    rm_seq(sch, b);
    rm_seq(sch, c);
    rm_seq(sch, d);
    assert_int_equal(dsq_kv_n_free(kv), 64);
    assert_true(dsq_kv_check(kv, NULL, 0));
    dsq_sched_destroy(sch);
    dsq_kv_destroy(kv);
}

/* Admission counts evictable blocks as free, but not the ones the new
 * sequence reuses: with 12 blocks, 10 cached and evictable, a 40-token
 * prompt sharing 9 of them needs 1 new block and fits; a different 40-token
 * prompt needs 10 and fits only by evicting. */
static void test_sched_budget(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = make_kv(12, true);
    dsq_sched_opts_t so = {.max_num_seqs = 4, .max_num_batched_tokens = 64};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    int32_t t[40], u[40];
    for (int i = 0; i < 40; i++) {
        t[i] = i;
        u[i] = 500 + i;
    }
    int pre;
    dsq_seq_t *a = mk_seq(0, t, 40);
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    prefill(sch, a, &pre);
    rm_seq(sch, a);
    assert_int_equal(dsq_kv_n_evictable(kv), 10);
    dsq_seq_t *b = mk_seq(1, t, 40);
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    prefill(sch, b, &pre);
    assert_int_equal(pre, 36);
    assert_int_equal(dsq_kv_n_free(kv), 2);   /* 1 free + 1 evictable (a's last) */
    /* u needs 10 blocks, only 2 can be had: waits, nothing changes */
    dsq_seq_t *c = mk_seq(2, u, 40);
    assert_int_equal(dsq_sched_add(sch, c), DSQ_OK);
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(c->state, DSQ_SEQ_WAITING);
    dsq_sched_commit(sch, &out);
    rm_seq(sch, b);
    /* now 12 can be had: 2 free, then t's blocks are evicted, the freed
     * tails first (a's last block, then b's from its end), so t's first two
     * blocks survive */
    prefill(sch, c, &pre);
    assert_int_equal(pre, 0);
    assert_int_equal(dsq_kv_n_cached(kv), 12);
    int32_t ids[10];
    assert_int_equal(dsq_kv_prefix_lookup(kv, t, 40, 9, ids, NULL, NULL), 2);
    rm_seq(sch, c);
    assert_true(dsq_kv_check(kv, NULL, 0));
    dsq_sched_destroy(sch);
    dsq_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_chain),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_fork_cow),
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_sched_reuse),
        cmocka_unit_test(test_sched_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

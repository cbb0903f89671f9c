/* tests for engine/serve/scheduler.c and engine/kv/kv_cache.c.
 *
 * The property test drives the scheduler and the KV block manager through
 * 100,000 steps of random arrivals, prompt lengths, max_tokens,
 * cancellations and n > 1 forks under a tight block budget, the way the
 * engine does (forward pass replaced by "commit + sample a random token"),
 * and checks after every step: the KV invariants (no block leaked or shared
 * without a reference), FCFS admission among new requests (one is never
 * admitted while an older new one still waits), the token budget and the
 * sequence budget (max_num_seqs running, forks included: they wait for a
 * slot), and at the end that every request finished and every block is
 * free again.
 *
 * The "forward pass" writes, for every scheduled position, a 64-bit digest
 * of the sequence's tokens up to that position into the position's K slot,
 * and every step re-reads the slots of all computed positions: a block that
 * was shared, copied, cached or evicted wrongly shows up as a stale digest.
 * The test runs twice: prefix caching off, and on with prompts drawn from a
 * few shared prefixes (so blocks are reused, evicted and reused again);
 * then both again with speculative decoding: half the decoding sequences
 * get 1-4 drafts before a step, and the "sample" keeps each while a coin
 * (60 %) says the model agreed, as the engine's verification does. A
 * rejected draft's KV counted as computed, or cached, shows up as a stale
 * digest when its position is read again (the token there changed). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/common/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/serve/scheduler.h"

/* resident bytes of this process (/proc/self/statm, field 2, in pages) */
static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lu %lu", &size, &res), 2);
    fclose(f);
    return (size_t)res * 4096;
}

/* madvise(MADV_DONTNEED) the whole pages inside [p, p+n): anonymous
 * memory reads back as zero, not resident until touched again */
static void drop_pages(void *p, size_t n)
{
    if (!p)
        return;
    uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
    uintptr_t hi = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (hi > lo)
        assert_int_equal(madvise((void *)lo, hi - lo, MADV_DONTNEED), 0);
}

/* hardening: dsq_kv_prefault commits the calloc'd storage (RSS grows by
 * the storage, which a fresh cache does not hold resident) and leaves it
 * zero; FP16 with K and V, INT8 with its scale/zero arrays, K only (MLA). */
static void test_kv_prefault(void **state)
{
    (void)state;
    static const struct { dsq_kv_dtype_t dt; bool has_v; } cases[] = {
        {DSQ_KV_F16, true}, {DSQ_KV_INT8, true}, {DSQ_KV_F16, false}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char err[256];
        /* 4 layers x 2 heads x 64 dims x 16 tokens x 1024 blocks: 8-32 MiB */
        dsq_kv_cache_t *kv = dsq_kv_create_ex(4, 2, 64, 16, 1024, cases[c].dt,
                                              cases[c].has_v, err, sizeof(err));
        assert_non_null(kv);
        size_t want = dsq_kv_storage_bytes(kv);
        /* drop the pages first: calloc may have written them already
         * (glibc does under MALLOC_PERTURB_, which meson sets) */
        size_t vb = (size_t)1024 * 16 * 2 * 64 * (cases[c].dt == DSQ_KV_INT8 ? 1 : 2);
        size_t sb = (size_t)1024 * 16 * 2 * 1 * 2;   /* 1 group (head_dim 64) x fp16 */
        for (int l = 0; l < 4; l++) {
            const dsq_kv_layer_t *L = dsq_kv_layer(kv, l);
            drop_pages(L->k, vb);
            drop_pages(L->v, vb);
            drop_pages(L->k_scale, sb);
            drop_pages(L->k_zero, sb);
            drop_pages(L->v_scale, sb);
            drop_pages(L->v_zero, sb);
        }
        size_t r0 = rss_bytes();
        assert_int_equal(dsq_kv_prefault(kv), want);
        size_t r1 = rss_bytes();
        assert_true(r1 > r0 && r1 - r0 >= want / 10 * 9);
        for (int l = 0; l < 4; l++) {
            const dsq_kv_layer_t *L = dsq_kv_layer(kv, l);
            const unsigned char *k = L->k;
            size_t n = (size_t)1024 * 16 * 2 * 64 * (cases[c].dt == DSQ_KV_INT8 ? 1 : 2);
            for (size_t i = 0; i < n; i += 509)
                assert_int_equal(k[i], 0);
            assert_true(cases[c].has_v ? L->v != NULL : L->v == NULL);
        }
        dsq_kv_destroy(kv);
    }
    assert_int_equal(dsq_kv_prefault(NULL), 0);
}

static uint64_t rng_state = 0x1234567;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void test_kv_basic(void **state)
{
    (void)state;
    char err[256];
    dsq_kv_cache_t *kv = dsq_kv_create(2, 2, 8, 4, 8, DSQ_KV_F16, err, sizeof(err));
    assert_non_null(kv);
    dsq_block_table_t a, b;
    dsq_block_table_init(&a);
    dsq_block_table_init(&b);
    assert_int_equal(dsq_kv_seq_reserve(kv, &a, 9), DSQ_OK);   /* 3 blocks */
    assert_int_equal(a.n, 3);
    assert_int_equal(dsq_kv_n_free(kv), 5);
    assert_int_equal(dsq_kv_seq_reserve(kv, &a, 40), DSQ_EFULL); /* all or nothing */
    assert_int_equal(a.n, 3);
    assert_int_equal(dsq_kv_n_free(kv), 5);
    assert_int_equal(dsq_kv_seq_fork(kv, &b, &a), DSQ_OK);
    assert_int_equal(dsq_kv_refcount(kv, a.ids[2]), 2);
    /* Writing position 9 of b copies only the shared last block. */
    int32_t old = b.ids[2];
    const dsq_kv_layer_t *L = dsq_kv_layer(kv, 1);
    uint16_t *k = L->k;
    size_t per_block = 4 * 2 * 8;
    k[(size_t)old * per_block + 5] = 0x3c00;
    assert_int_equal(dsq_kv_seq_cow(kv, &b, 9, 10), DSQ_OK);
    assert_int_not_equal(b.ids[2], old);
    assert_int_equal(b.ids[0], a.ids[0]);
    assert_int_equal(k[(size_t)b.ids[2] * per_block + 5], 0x3c00);
    assert_int_equal(dsq_kv_refcount(kv, old), 1);
    const dsq_block_table_t *tabs[] = {&a, &b};
    assert_true(dsq_kv_check(kv, tabs, 2));
    assert_int_equal(dsq_kv_slot(kv, &a, 5), a.ids[1] * 4 + 1);
    dsq_kv_seq_free(kv, &a);
    dsq_kv_seq_free(kv, &b);
    assert_int_equal(dsq_kv_n_free(kv), 8);
    assert_true(dsq_kv_check(kv, NULL, 0));
    dsq_block_table_deinit(&a);
    dsq_block_table_deinit(&b);
    dsq_kv_destroy(kv);
    dsq_kv_destroy(NULL);
}

typedef struct sim_req {
    dsq_seq_t *seqs[4];
    bool was_waiting;
    int n, n_live;
    int max_tokens;
    int generated[4];
    bool forked, done, cancel_at_step_set;
    long cancel_step;
    long arrival_step;
} sim_req_t;

#define N_BASES 4
#define BASE_LEN 130
static int32_t bases[N_BASES][BASE_LEN];

static dsq_seq_t *new_seq(uint64_t order, int index, int n_prompt, bool shared)
{
    dsq_seq_t *s = calloc(1, sizeof(*s));
    s->order = order;
    s->index = index;
    s->cap_tokens = n_prompt + 64;
    s->tokens = calloc((size_t)s->cap_tokens, sizeof(int32_t));
    int n_shared = 0;
    if (shared && n_prompt > 0) {
        /* most of the prompt from one of a few common prefixes */
        const int32_t *base = bases[rnd(N_BASES)];
        n_shared = n_prompt - (int)rnd(n_prompt < 6 ? (uint32_t)n_prompt : 6);
        memcpy(s->tokens, base, (size_t)n_shared * sizeof(int32_t));
        /* the same later blocks after different first tokens: only the
         * hash chain tells them apart */
        if (n_shared > 0)
            s->tokens[0] = 1000 + (int32_t)rnd(2);
    }
    for (int i = n_shared; i < n_prompt; i++)
        s->tokens[i] = (int32_t)rnd(1000);
    s->n_tokens = s->n_prompt = n_prompt;
    dsq_block_table_init(&s->bt);
    return s;
}

static void free_seq(dsq_seq_t *s)
{
    dsq_block_table_deinit(&s->bt);
    free(s->tokens);
    free(s);
}

static void push_tok(dsq_seq_t *s, int32_t t)
{
    if (s->n_tokens == s->cap_tokens) {
        s->cap_tokens *= 2;
        s->tokens = realloc(s->tokens, (size_t)s->cap_tokens * sizeof(int32_t));
    }
    s->tokens[s->n_tokens++] = t;
}

static void push_token(dsq_seq_t *s)
{
    push_tok(s, (int32_t)rnd(1000));
}

static void end_seq(dsq_sched_t *sch, sim_req_t *r, int i)
{
    if (r->seqs[i]->state == DSQ_SEQ_DETACHED)
        return;
    dsq_sched_remove(sch, r->seqs[i]);
    r->n_live--;
    if (r->n_live == 0)
        r->done = true;
}

/* The simulated KV of position p: a digest of tokens[0..p], 4 x 16 bits. */
static uint64_t prefix_digest(uint64_t h, int32_t tok, int pos)
{
    h ^= (uint64_t)(uint32_t)tok + ((uint64_t)pos << 32);
    h *= 0x100000001b3ULL;
    return h ^ (h >> 29);
}

/* Verify the K slots of seq's computed positions, then write those it is
 * scheduled to compute (the simulated forward pass). */
static void sim_forward(dsq_kv_cache_t *kv, const dsq_seq_t *seq, long *n_verified)
{
    uint16_t *k = dsq_kv_layer(kv, 0)->k;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int p = 0; p < seq->n_computed + seq->sched_tokens; p++) {
        h = prefix_digest(h, seq->tokens[p], p);
        uint16_t *v = k + (size_t)dsq_kv_slot(kv, &seq->bt, p) * 4;
        if (p < seq->n_computed) {
            uint64_t got = (uint64_t)v[0] | (uint64_t)v[1] << 16 | (uint64_t)v[2] << 32 |
                           (uint64_t)v[3] << 48;
            if (got != h)
                fail_msg("seq order=%llu index=%d pos=%d: stale KV",
                         (unsigned long long)seq->order, seq->index, p);
            (*n_verified)++;
        } else {
            for (int d = 0; d < 4; d++)
                v[d] = (uint16_t)(h >> (16 * d));
        }
    }
}

static void run_property(bool prefix, bool spec)
{
    char err[256];
    const int block_size = 4, n_blocks = 48;
    const int max_seqs = 8, max_tokens_step = 24;
    const long n_steps = 110000;   /* arrivals for 100,000 steps, then drain */
    dsq_kv_cache_t *kv = dsq_kv_create(1, 1, 4, block_size, n_blocks, DSQ_KV_F16, err,
                                       sizeof(err));
    assert_non_null(kv);
    long n_verified = 0;
    if (prefix) {
        assert_int_equal(dsq_kv_set_prefix_caching(kv, true), DSQ_OK);
        for (int b = 0; b < N_BASES; b++)
            for (int i = 0; i < BASE_LEN; i++)
                bases[b][i] = (int32_t)rnd(1000);
    }
    dsq_sched_opts_t so = {.max_num_seqs = max_seqs, .max_num_batched_tokens = max_tokens_step};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);

    int cap = 20000, n_req = 0;
    sim_req_t *reqs = calloc((size_t)cap, sizeof(*reqs));
    uint64_t order = 0;
    long total_preempt = 0, max_wait = 0, total_drafted = 0, total_accepted = 0;
    long step;
    for (step = 0; step < n_steps; step++) {
        /* arrivals: stop arriving for the last 10,000 steps so everything drains */
        if (step < n_steps - 10000 && rnd(100) < 12 && n_req < cap) {
            sim_req_t *r = &reqs[n_req++];
            /* the longest sequence must fit the whole cache: 1 + 120 + 64 < 48*4 */
            int n_prompt = 1 + (int)rnd(rnd(10) == 0 ? 120 : 20);
            r->n = rnd(8) == 0 ? 1 + (int)rnd(3) : 1;
            r->max_tokens = 1 + (int)rnd(rnd(5) == 0 ? 60 : 12);
            r->seqs[0] = new_seq(order++, 0, n_prompt, prefix && rnd(4) != 0);
            r->seqs[0]->owner = r;
            r->n_live = 1;
            r->arrival_step = step;
            if (rnd(10) == 0) {
                r->cancel_at_step_set = true;
                r->cancel_step = step + (long)rnd(40);
            }
            assert_int_equal(dsq_sched_add(sch, r->seqs[0]), DSQ_OK);
        }
        /* cancellations */
        for (int i = 0; i < n_req; i++) {
            sim_req_t *r = &reqs[i];
            if (!r->done && r->cancel_at_step_set && r->cancel_step == step) {
                int nseq = r->forked ? r->n : 1;
                for (int j = 0; j < nseq; j++)
                    end_seq(sch, r, j);
            }
        }
        /* speculation: drafts for half the decoding sequences, never
         * past max_tokens */
        long n_drafted = 0;
        for (int i = 0; spec && i < n_req; i++) {
            sim_req_t *r = &reqs[i];
            int nseq = r->forked ? r->n : 1;
            for (int j = 0; !r->done && j < nseq; j++) {
                dsq_seq_t *q = r->seqs[j];
                int left = r->max_tokens - r->generated[j] - 1;
                if (q->state != DSQ_SEQ_RUNNING || q->n_computed < q->n_prompt ||
                    q->n_tokens - q->n_computed != 1 || left <= 0 || rnd(2))
                    continue;
                int nd = 1 + (int)rnd(4);
                nd = nd < left ? nd : left;
                for (int d = 0; d < nd; d++)
                    push_token(q);
                q->n_draft = nd;
                n_drafted++;
            }
        }
        total_drafted += n_drafted;
        /* remember who waits, to check FCFS admission */
        for (int i = 0; i < n_req; i++)
            reqs[i].was_waiting = !reqs[i].done && reqs[i].seqs[0]->state == DSQ_SEQ_WAITING;
        dsq_sched_out_t out;
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        total_preempt += out.n_preempted;
        assert_true(out.n_tokens <= max_tokens_step);
        /* max_num_seqs bounds the running sequences, forks included */
        assert_true(out.n_seqs <= max_seqs);
        assert_true(dsq_sched_n_running(sch) <= max_seqs);
        int sum = 0;
        for (int i = 0; i < out.n_seqs; i++) {
            dsq_seq_t *s = out.seqs[i];
            assert_int_equal(s->state, DSQ_SEQ_RUNNING);
            assert_true(s->sched_tokens > 0);
            /* drafts are scheduled whole with their pending token */
            assert_true(s->n_draft == 0 || s->sched_tokens == 1 + s->n_draft);
            assert_true(s->bt.n * block_size >= s->n_computed + s->sched_tokens);
            sum += s->sched_tokens;
            /* every running sequence is older than every waiting one that
             * arrived fresh (FCFS, no overtaking) */
        }
        assert_int_equal(sum, out.n_tokens);
        for (int i = 0; i < out.n_tokens; i++) {
            int32_t slot = out.slot[i];
            assert_true(slot >= 0 && slot < n_blocks * block_size);
        }
        /* FCFS: no waiting sequence is older than a sequence that was
         * admitted fresh in this step (waiting before it, never preempted). */
        uint64_t youngest_admitted = 0;
        bool any_admitted = false;
        for (int i = 0; i < out.n_seqs; i++) {
            sim_forward(kv, out.seqs[i], &n_verified);
            if (!prefix)
                assert_int_equal(out.seqs[i]->n_cached_prompt, 0);
        }
        for (int i = 0; i < out.n_seqs; i++)
            if (((sim_req_t *)out.seqs[i]->owner)->was_waiting &&
                out.seqs[i]->n_preempted == 0 && out.seqs[i]->index == 0) {
                any_admitted = true;
                if (out.seqs[i]->order > youngest_admitted)
                    youngest_admitted = out.seqs[i]->order;
            }
        dsq_sched_commit(sch, &out);
        for (int i = 0; any_admitted && i < n_req; i++) {
            sim_req_t *r = &reqs[i];
            if (!r->done && r->seqs[0]->state == DSQ_SEQ_WAITING &&
                r->seqs[0]->n_preempted == 0 && r->seqs[0]->n_computed == 0)
                assert_true(r->seqs[0]->order > youngest_admitted);
        }
        /* drafts of sequences the step did not run are gone */
        for (int i = 0; i < n_req; i++)
            for (int j = 0; !reqs[i].done && j < (reqs[i].forked ? reqs[i].n : 1); j++)
                assert_true(reqs[i].seqs[j]->n_draft == 0 ||
                            reqs[i].seqs[j]->sched_tokens == 0 /* committed */);
        /* "sample" for fully computed sequences */
        for (int i = 0, n_rows = 1; i < out.n_logits; i += n_rows) {
            dsq_seq_t *s = out.logit_seqs[i];
            sim_req_t *r = s->owner;
            for (n_rows = 1; i + n_rows < out.n_logits && out.logit_seqs[i + n_rows] == s;
                 n_rows++)
                ;
            assert_int_equal(n_rows, 1 + s->n_draft);
            if (s->state == DSQ_SEQ_DETACHED)
                continue;
            if (n_rows > 1) {
                /* verification: row k's token is draft k while the model
                 * agrees, then one of its own */
                int nd = n_rows - 1, acc = 0;
                int32_t d[8];
                memcpy(d, s->tokens + s->n_tokens - nd, (size_t)nd * sizeof(*d));
                dsq_sched_drop_drafts(s);
                for (int k = 0; k <= nd; k++) {
                    bool agree = k < nd && rnd(10) < 6;
                    push_tok(s, agree ? d[k] : (int32_t)(1000 + rnd(1000)));
                    r->generated[s->index]++;
                    if (r->generated[s->index] >= r->max_tokens || rnd(40) == 0) {
                        end_seq(sch, r, s->index);
                        break;
                    }
                    if (!agree)
                        break;
                    acc++;
                }
                if (s->state != DSQ_SEQ_DETACHED) {
                    dsq_sched_accept_drafts(sch, s, acc);
                    assert_int_equal(s->n_tokens, s->n_computed + 1);
                    /* the blocks of the kept rows, none past the
                     * pending token's (the next step reserves that) */
                    assert_true(s->bt.n >= dsq_kv_blocks_for(kv, s->n_computed) &&
                                s->bt.n <= dsq_kv_blocks_for(kv, s->n_tokens));
                }
                total_accepted += acc;
                continue;
            }
            if (r->n > 1 && !r->forked) {
                for (int c = 1; c < r->n; c++) {
                    dsq_seq_t *f = new_seq(s->order, c, 0, false);
                    free(f->tokens);
                    f->cap_tokens = s->cap_tokens;
                    f->tokens = malloc((size_t)f->cap_tokens * sizeof(int32_t));
                    memcpy(f->tokens, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
                    f->n_tokens = s->n_tokens;
                    f->n_prompt = s->n_prompt;
                    f->n_computed = s->n_computed;
                    f->n_cached_prompt = s->n_cached_prompt;
                    f->owner = r;
                    assert_int_equal(dsq_kv_seq_fork(kv, &f->bt, &s->bt), DSQ_OK);
                    assert_int_equal(dsq_sched_add_fork(sch, f), DSQ_OK);
                    r->seqs[c] = f;
                    r->n_live++;
                }
                r->forked = true;
                for (int c = 1; c < r->n; c++) {
                    push_token(r->seqs[c]);
                    r->generated[c]++;
                }
            }
            push_token(s);
            r->generated[s->index]++;
            if (r->generated[s->index] >= r->max_tokens || rnd(40) == 0)
                end_seq(sch, r, s->index);
        }
        assert_true(dsq_sched_check(sch));
        /* starvation bound: the oldest waiting request is served eventually */
        for (int i = 0; i < n_req; i++)
            if (!reqs[i].done && reqs[i].seqs[0]->n_computed == 0 &&
                reqs[i].seqs[0]->state == DSQ_SEQ_WAITING &&
                step - reqs[i].arrival_step > max_wait)
                max_wait = step - reqs[i].arrival_step;
        if (step >= n_steps - 10000 && dsq_sched_n_running(sch) == 0 &&
            dsq_sched_n_waiting(sch) == 0)
            break;
    }
    int64_t q_tokens, hit_tokens;
    dsq_sched_prefix_stats(sch, &q_tokens, &hit_tokens);
    print_message("# prefix=%d spec=%d requests=%d steps=%ld preemptions=%ld "
                  "longest_wait_steps=%ld kv_positions_verified=%ld prefix_queries=%lld "
                  "prefix_hits=%lld drafted=%ld accepted=%ld\n",
                  prefix, spec, n_req, step, total_preempt, max_wait, n_verified,
                  (long long)q_tokens, (long long)hit_tokens, total_drafted, total_accepted);
    if (spec)
        assert_true(total_accepted > 10000);   /* drafts really ran and were kept */
    assert_true(n_req > 1000);
    assert_true(n_verified > 100000);
    if (prefix)
        assert_true(hit_tokens > q_tokens / 10);   /* the cache really was used */
    else
        assert_int_equal(hit_tokens, 0);
    assert_true(total_preempt > 0);      /* the budget really was tight */
    assert_true(max_wait < 5000);        /* nobody starved */
    for (int i = 0; i < n_req; i++) {
        assert_true(reqs[i].done);
        int nseq = reqs[i].forked ? reqs[i].n : 1;
        for (int j = 0; j < nseq; j++)
            free_seq(reqs[i].seqs[j]);
    }
    assert_int_equal(dsq_kv_n_free(kv), n_blocks);
    assert_true(dsq_kv_check(kv, NULL, 0));
    free(reqs);
    dsq_sched_destroy(sch);
    dsq_kv_destroy(kv);
}

static void test_property(void **state)
{
    (void)state;
    run_property(false, false);
}

static void test_property_prefix(void **state)
{
    (void)state;
    run_property(true, false);
}

static void test_property_spec(void **state)
{
    (void)state;
    run_property(false, true);
}

static void test_property_prefix_spec(void **state)
{
    (void)state;
    run_property(true, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_basic),
        cmocka_unit_test(test_kv_prefault),
        cmocka_unit_test(test_property),
        cmocka_unit_test(test_property_prefix),
        cmocka_unit_test(test_property_spec),
        cmocka_unit_test(test_property_prefix_spec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* tests for the latency policies of engine/serve/scheduler.c: the prefill-token
 * cap of steps that carry decodes (max_prefill_tokens_with_decode,
 * Sarathi-Serve's stall-free batching) and drain-aligned admission
 * (admission_defer_steps). Expected batches are worked out by hand from the
 * policy text in scheduler.h; a property run checks, over random traffic,
 * that the cap and the deferral bound hold every step and that every
 * request still finishes (no starvation). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/serve/scheduler.h"

static dsq_seq_t *new_seq(uint64_t order, int n_prompt, int max_tokens)
{
    dsq_seq_t *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    s->order = order;
    s->cap_tokens = n_prompt + max_tokens + 1;
    s->tokens = calloc((size_t)s->cap_tokens, sizeof(int32_t));
    assert_non_null(s->tokens);
    for (int i = 0; i < n_prompt; i++)
        s->tokens[i] = 100 + i;
    s->n_tokens = n_prompt;
    s->n_prompt = n_prompt;
    s->n_max_tokens = max_tokens > 0 ? n_prompt + max_tokens : 0;
    dsq_block_table_init(&s->bt);
    return s;
}

static void free_seq(dsq_seq_t *s)
{
    dsq_block_table_deinit(&s->bt);
    free(s->tokens);
    free(s);
}

/* Commit a step and append one sampled token to every sequence that got
 * logits, as the engine does. */
static void commit(dsq_sched_t *sch, const dsq_sched_out_t *out)
{
    dsq_sched_commit(sch, out);
    for (int i = 0; i < out->n_logits; i++) {
        dsq_seq_t *s = out->logit_seqs[i];
        s->tokens[s->n_tokens++] = 7;
    }
}

static int tokens_of(const dsq_sched_out_t *out, const dsq_seq_t *s)
{
    for (int i = 0; i < out->n_seqs; i++)
        if (out->seqs[i] == s)
            return s->sched_tokens;
    return 0;
}

static dsq_kv_cache_t *kv_new(int n_blocks)
{
    char err[256];
    dsq_kv_cache_t *kv = dsq_kv_create(1, 1, 4, 16, n_blocks, DSQ_KV_F16, err, sizeof(err));
    assert_non_null(kv);
    return kv;
}

/* Two decoders run; a 100-token prompt arrives. With the cap at 16 the
 * step carries the 2 decode rows + 16 prompt tokens; with nothing decoding
 * a prompt gets the whole max_num_batched_tokens budget. */
static void test_prefill_cap(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(64);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = 64,
                           .max_prefill_tokens_with_decode = 16};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *a = new_seq(0, 10, 50), *b = new_seq(1, 10, 50), *c = new_seq(2, 100, 50);
    dsq_sched_out_t out;

    /* nothing decodes yet: a and b prefill in one step, uncapped (20 > 16) */
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_tokens, 20);
    commit(sch, &out);

    assert_int_equal(dsq_sched_add(sch, c), DSQ_OK);
    int left = 100;
    while (left > 0) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(tokens_of(&out, a), 1);
        assert_int_equal(tokens_of(&out, b), 1);
        int want = left < 16 ? left : 16;
        assert_int_equal(tokens_of(&out, c), want);
        assert_int_equal(out.n_tokens, 2 + want);
        left -= want;
        commit(sch, &out);
    }
    /* c decodes now */
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_tokens, 3);
    commit(sch, &out);

    /* alone, a long prompt takes the full budget (no decode to protect) */
    dsq_sched_remove(sch, a);
    dsq_sched_remove(sch, b);
    dsq_sched_remove(sch, c);
    dsq_seq_t *d = new_seq(3, 100, 5);
    assert_int_equal(dsq_sched_add(sch, d), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_tokens, 64);
    dsq_sched_remove(sch, d);
    assert_int_equal(dsq_kv_n_free(kv), 64);
    dsq_sched_destroy(sch);
    free_seq(a);
    free_seq(b);
    free_seq(c);
    free_seq(d);
    dsq_kv_destroy(kv);
}

/* Decoders 3 and 4 steps from their end hold a new prompt back (K = 4)
 * until both ended; then it prefills in a step without decodes. A decoder
 * further than K from its end, or one whose end is unknown, does not. */
static void test_defer(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(64);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = 256,
                           .admission_defer_steps = 4};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    /* a ends after 4 tokens, b after 5 */
    dsq_seq_t *a = new_seq(0, 8, 4), *b = new_seq(1, 8, 5), *c = new_seq(2, 30, 4);
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);   /* both prompts */
    commit(sch, &out);
    /* a: 3 steps left, b: 4 steps left -> c waits */
    assert_int_equal(dsq_sched_add(sch, c), DSQ_OK);
    int steps = 0;
    while (a->state == DSQ_SEQ_RUNNING || b->state == DSQ_SEQ_RUNNING) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(tokens_of(&out, c), 0);
        assert_int_equal(c->state, DSQ_SEQ_WAITING);
        commit(sch, &out);
        steps++;
        if (a->state == DSQ_SEQ_RUNNING && a->n_tokens == a->n_max_tokens)
            dsq_sched_remove(sch, a);
        if (b->state == DSQ_SEQ_RUNNING && b->n_tokens == b->n_max_tokens)
            dsq_sched_remove(sch, b);
    }
    assert_int_equal(steps, 4);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 1);
    assert_int_equal(tokens_of(&out, c), 30);
    commit(sch, &out);

    /* c has 3 steps left; with e decoding far from its end, f is admitted */
    dsq_seq_t *e = new_seq(3, 4, 40), *f = new_seq(4, 6, 4), *g = new_seq(5, 6, 4);
    assert_int_equal(dsq_sched_add(sch, e), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);   /* deferred: c is near */
    assert_int_equal(tokens_of(&out, e), 0);
    commit(sch, &out);
    dsq_sched_remove(sch, c);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);   /* e prefills alone */
    assert_int_equal(tokens_of(&out, e), 4);
    commit(sch, &out);
    assert_int_equal(dsq_sched_add(sch, f), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, e), 1);
    assert_int_equal(tokens_of(&out, f), 6);
    commit(sch, &out);
    /* f alone, 3 steps left: g would wait, but not when f's end is unknown */
    dsq_sched_remove(sch, e);
    f->n_max_tokens = 0;
    assert_int_equal(dsq_sched_add(sch, g), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, g), 6);
    dsq_sched_remove(sch, f);
    dsq_sched_remove(sch, g);
    assert_int_equal(dsq_kv_n_free(kv), 64);
    dsq_sched_destroy(sch);
    free_seq(a);
    free_seq(b);
    free_seq(c);
    free_seq(e);
    free_seq(f);
    free_seq(g);
    dsq_kv_destroy(kv);
}

/* The step budget in predicted ms (dsq_sched_set_step_budget). Model:
 * fixed 2 ms, 1 ms per row, 0.01 ms per attention pair; budget 100 ms, so
 * a step's prefill gets 0.9 * 100 - 2 - (the decode rows' cost) ms, and a
 * chunk of n at position p costs n + 0.01 (n p + n (n + 1) / 2): with one
 * decoder beside it a 400-token prompt goes in chunks that are each the
 * largest n that fits (largest_fit, a linear search), shrinking as p
 * grows. A decode cost near the budget or above it leaves prefill as
 * much as itself; the trust region caps rows and pairs; with no time at
 * all one token moves. */
static int largest_fit(double token_ms, double pair_ms, int p, double ms)
{
    int n = 0;
    while (token_ms * (n + 1) + pair_ms * ((double)(n + 1) * p + (n + 1) * (n + 2) / 2.0) <= ms)
        n++;
    return n;
}

static void test_step_budget(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(128);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = 2048};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *a = new_seq(0, 10, 500), *b = new_seq(1, 400, 50);
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    commit(sch, &out);
    dsq_step_cost_t c = {.fixed_ms = 2, .token_ms = 1, .pair_ms = 0.01};
    dsq_sched_set_step_budget(sch, 100, &c);
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    int prev = 1 << 30, steps = 0;
    while (b->n_computed < b->n_prompt) {
        int p = b->n_computed;
        double left = 0.9 * 100 - 2 - (1 + 0.01 * (a->n_computed + 1));
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(tokens_of(&out, a), 1);
        int want = largest_fit(1, 0.01, p, left);
        if (want > b->n_prompt - p)
            want = b->n_prompt - p;
        assert_int_equal(tokens_of(&out, b), want);
        assert_true(want <= prev);   /* dearer with position */
        prev = want;
        commit(sch, &out);
        steps++;
    }
    assert_true(steps >= 6);
    /* decodes near the budget: prefill gets as much as the step without
     * it (fixed 80 + a's and b's decode rows), not the 8 ms left of 90 */
    dsq_seq_t *d = new_seq(2, 400, 5);
    dsq_step_cost_t heavy = {.fixed_ms = 80, .token_ms = 1, .pair_ms = 0.01};
    dsq_sched_set_step_budget(sch, 100, &heavy);
    assert_int_equal(dsq_sched_add(sch, d), DSQ_OK);
    double near = 80 + 2 + 0.01 * (a->n_computed + 1 + b->n_computed + 1);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), largest_fit(1, 0.01, 0, near));
    commit(sch, &out);
    /* a step the budget cannot hold at all (fixed 300 ms): prefill gets as
     * much as the rest of the step, not a crawl */
    heavy.fixed_ms = 300;
    dsq_sched_set_step_budget(sch, 100, &heavy);
    int p0 = d->n_computed;
    /* a and b decode beside it */
    double base = 300 + 2 + 0.01 * (a->n_computed + 1 + b->n_computed + 1);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), largest_fit(1, 0.01, p0, base));
    commit(sch, &out);
    /* the trust region caps the rows, and the pairs, of a step */
    dsq_step_cost_t trust = {.fixed_ms = 2, .token_ms = 0.01, .pair_ms = 0,
                             .trust_rows = 32, .trust_pairs = 1e9};
    dsq_sched_set_step_budget(sch, 100, &trust);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), 32);
    commit(sch, &out);
    trust.trust_rows = 1e9;
    trust.trust_pairs = 10.0 * d->n_computed + 55;   /* exactly 10 rows */
    dsq_sched_set_step_budget(sch, 100, &trust);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), 10);
    commit(sch, &out);
    /* the region alone would stop it: 16 rows or, when the time allows
     * fewer (6 here: 90 - 2 fixed - 2 decode rows of 10 ms, 10 ms per
     * token), those */
    dsq_step_cost_t tight = {.fixed_ms = 2, .token_ms = 10, .pair_ms = 0,
                             .trust_rows = 0.5, .trust_pairs = 1e9};
    dsq_sched_set_step_budget(sch, 100, &tight);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), largest_fit(10, 0, d->n_computed, 68));
    assert_int_equal(tokens_of(&out, d), 6);
    commit(sch, &out);
    tight.token_ms = 0.1;
    dsq_sched_set_step_budget(sch, 100, &tight);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), 16);
    commit(sch, &out);
    /* d alone, deep in its prompt (past position 100): no token fits
     * the prefill's 90 ms (a token at position p costs 1 + (p + 1) ms),
     * yet one moves */
    dsq_sched_remove(sch, a);
    dsq_sched_remove(sch, b);
    assert_true(d->n_computed > 100);
    dsq_step_cost_t stuck = {.fixed_ms = 0, .token_ms = 1, .pair_ms = 1};
    dsq_sched_set_step_budget(sch, 100, &stuck);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), 1);
    commit(sch, &out);
    /* removed: back to the token budget */
    dsq_sched_set_step_budget(sch, 0, NULL);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, d), 400 - d->n_computed);
    dsq_sched_remove(sch, d);
    assert_int_equal(dsq_kv_n_free(kv), 128);
    dsq_sched_destroy(sch);
    free_seq(a);
    free_seq(b);
    free_seq(d);
    dsq_kv_destroy(kv);
}

/* The step budget's floors (dsq_sched_set_step_budget) for a model whose
 * fixed cost is a large part of the budget (a 6.7B model on 2 cores:
 * ~140 ms fixed, ~31 ms a prompt token, budget 250 ms). Budget 100 ms
 * here. Fixed 60 ms, 1 ms a row: a prompt alone gets 8 one-row steps
 * (8 x 61 ms), 0.9 * 488 - 60 = 379 tokens (not 0.9 * 100 - 60 = 30);
 * beside one decode
 * row (a step of 61 ms) 61 tokens, as much as the decode step (not 29).
 * Fixed 2 ms, 10 ms a row: 78 ms of prefill is less than two prompts'
 * minimum share (4 rows each), yet a new 4-token prompt goes beside the
 * long one's chunk (3 tokens, half the time; the new one the rest).
 * Fixed 60 ms, 20 ms a row: decode rows get 7 one-row steps (7 x 80 ms):
 * 28 of 32 streams in one step (not 3 in the 60 ms the budget alone left
 * them). A model the budget fits keeps the budget's bound. */
static void test_fixed_cost_floors(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(256);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = 2048};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_step_cost_t c = {.fixed_ms = 60, .token_ms = 1, .pair_ms = 0};
    dsq_sched_set_step_budget(sch, 100, &c);
    dsq_sched_out_t out;
    dsq_seq_t *z = new_seq(3, 1000, 5);
    assert_int_equal(dsq_sched_add(sch, z), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, z), 379);
    commit(sch, &out);
    dsq_sched_remove(sch, z);
    free_seq(z);
    dsq_seq_t *a = new_seq(0, 4, 500), *b = new_seq(1, 1000, 5);
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    commit(sch, &out);                       /* a's prompt */
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, a), 1);
    assert_int_equal(tokens_of(&out, b), 61);
    commit(sch, &out);
    dsq_step_cost_t slow = {.fixed_ms = 2, .token_ms = 10, .pair_ms = 0};
    dsq_sched_set_step_budget(sch, 100, &slow);
    dsq_seq_t *d = new_seq(2, 4, 500);
    assert_int_equal(dsq_sched_add(sch, d), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, a), 1);
    assert_int_equal(tokens_of(&out, b), 3);
    assert_int_equal(tokens_of(&out, d), 4);
    commit(sch, &out);
    dsq_sched_remove(sch, a);
    dsq_sched_remove(sch, b);
    dsq_sched_remove(sch, d);
    free_seq(a);
    free_seq(b);
    free_seq(d);
    dsq_sched_destroy(sch);
    /* 32 streams: 28 decode rows fit 7 one-row steps of 80 ms */
    so.max_num_seqs = 33;
    sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *e[32];
    for (int i = 0; i < 32; i++) {
        e[i] = new_seq(10 + (uint64_t)i, 4, 50);
        assert_int_equal(dsq_sched_add(sch, e[i]), DSQ_OK);
    }
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    commit(sch, &out);                       /* their prompts */
    dsq_step_cost_t dec = {.fixed_ms = 60, .token_ms = 20, .pair_ms = 0};
    dsq_sched_set_step_budget(sch, 100, &dec);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 28);
    commit(sch, &out);
    /* a model the budget fits (8 one-row steps of 12 ms < 100): the
     * budget bounds the step as before. Decode rows get 90 - 2 - 25 = 63
     * ms (6 rows), the prompt 90 - 62 = 28 ms (2 tokens), not the 62 ms
     * the decode step costs */
    dsq_step_cost_t fits = {.fixed_ms = 2, .token_ms = 10, .pair_ms = 0};
    dsq_sched_set_step_budget(sch, 100, &fits);
    dsq_seq_t *p = new_seq(50, 100, 5);
    assert_int_equal(dsq_sched_add(sch, p), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, p), 2);
    assert_int_equal(out.n_seqs, 7);
    commit(sch, &out);
    dsq_sched_remove(sch, p);
    free_seq(p);
    for (int i = 0; i < 32; i++) {
        dsq_sched_remove(sch, e[i]);
        free_seq(e[i]);
    }
    assert_int_equal(dsq_kv_n_free(kv), 256);
    dsq_sched_destroy(sch);
    dsq_kv_destroy(kv);
}

/* A running prompt deep in its context whose every token costs more than
 * the step's time (fixed 0, 1 ms a row, 1 ms a pair, budget 100 ms, past
 * position 200) moves a token a step; a new prompt beside it still
 * starts, a token a step, instead of waiting for all of the long one's
 * chunks (it got none, which stopped admission); then the two take
 * turns. With one slot free, one prompt is picked whatever the
 * two-prompt rule wants, and gets all of the prefill time. */
static void test_waiting_floor(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(128);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = 200};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *b = new_seq(0, 400, 5), *w = new_seq(1, 8, 5);
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, b), 200);
    commit(sch, &out);
    dsq_step_cost_t stuck = {.fixed_ms = 0, .token_ms = 1, .pair_ms = 1};
    dsq_sched_set_step_budget(sch, 100, &stuck);
    assert_int_equal(dsq_sched_add(sch, w), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, w), 1);
    assert_int_equal(w->state, DSQ_SEQ_RUNNING);
    commit(sch, &out);
    /* then the two running prompts take turns at the step's one token */
    int w_got = 0;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_true(tokens_of(&out, b) + tokens_of(&out, w) >= 1);
        w_got += tokens_of(&out, w);
        commit(sch, &out);
    }
    assert_true(w_got >= 2);
    dsq_sched_remove(sch, b);
    dsq_sched_remove(sch, w);
    free_seq(b);
    free_seq(w);
    dsq_sched_destroy(sch);
    /* two slots: a decoding sequence and two new prompts under a budget
     * that wants two prompts a step; one slot is free, so one goes */
    so.max_num_seqs = 2;
    sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *a = new_seq(2, 4, 50), *p = new_seq(3, 40, 5), *q = new_seq(4, 40, 5);
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    commit(sch, &out);
    dsq_step_cost_t slow = {.fixed_ms = 2, .token_ms = 10, .pair_ms = 0};
    dsq_sched_set_step_budget(sch, 100, &slow);
    assert_int_equal(dsq_sched_add(sch, p), DSQ_OK);
    assert_int_equal(dsq_sched_add(sch, q), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 2);
    assert_int_equal(tokens_of(&out, a), 1);
    /* all of the prefill's 90 - 2 - 10 = 78 ms (7 tokens), none shared
     * with a prompt that cannot be admitted */
    assert_int_equal(tokens_of(&out, p), 7);
    assert_int_equal(tokens_of(&out, q), 0);
    assert_int_equal(q->state, DSQ_SEQ_WAITING);
    commit(sch, &out);
    dsq_sched_remove(sch, a);
    dsq_sched_remove(sch, p);
    dsq_sched_remove(sch, q);
    free_seq(a);
    free_seq(p);
    free_seq(q);
    assert_int_equal(dsq_kv_n_free(kv), 128);
    dsq_sched_destroy(sch);
    dsq_kv_destroy(kv);
}

/* Paused sequences (their client is not reading) keep their KV but not a
 * max_num_seqs slot: with both slots held, a new request is admitted; once
 * they resume, a step still carries at most max_num_seqs sequences, and
 * the three take turns (round-robin across requests: each decodes in two
 * steps of three; before, the youngest waited until an older one ended). */
static void test_paused_free_slots(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(64);
    dsq_sched_opts_t so = {.max_num_seqs = 2, .max_num_batched_tokens = 256};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *a = new_seq(0, 8, 50), *b = new_seq(1, 8, 50), *c = new_seq(2, 8, 50);
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    assert_int_equal(dsq_sched_add(sch, c), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 2);                 /* c waits: 2 slots */
    assert_int_equal(tokens_of(&out, c), 0);
    commit(sch, &out);
    a->paused = b->paused = true;
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 1);
    assert_int_equal(tokens_of(&out, c), 8);         /* admitted beside them */
    assert_int_equal(a->state, DSQ_SEQ_RUNNING);     /* KV kept */
    commit(sch, &out);
    a->paused = b->paused = false;
    int turns[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(out.n_seqs, 2);
        turns[0] += tokens_of(&out, a);
        turns[1] += tokens_of(&out, b);
        turns[2] += tokens_of(&out, c);
        commit(sch, &out);
    }
    for (int k = 0; k < 3; k++)
        assert_int_equal(turns[k], 2);
    dsq_sched_remove(sch, a);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, c), 1);
    dsq_sched_remove(sch, b);
    dsq_sched_remove(sch, c);
    assert_int_equal(dsq_kv_n_free(kv), 64);
    dsq_sched_destroy(sch);
    free_seq(a);
    free_seq(b);
    free_seq(c);
    dsq_kv_destroy(kv);
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static int rnd(int n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

/* Random arrivals under both policies and a tight block budget: every
 * step keeps prefill tokens <= the cap whenever it carries a decode, a
 * waiting sequence is held back only while every running one decodes
 * within K steps of its end, and all requests finish. */
static void test_property(void **state)
{
    (void)state;
    enum { N = 400, CAP = 12, K = 3 };
    dsq_kv_cache_t *kv = kv_new(24);
    dsq_sched_opts_t so = {.max_num_seqs = 6, .max_num_batched_tokens = 40,
                           .max_prefill_tokens_with_decode = CAP,
                           .admission_defer_steps = K};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *seqs[N];
    int n = 0, n_done = 0;
    uint64_t order = 0;
    for (long step = 0; n_done < N; step++) {
        assert_true(step < 200000);
        if (n < N && rnd(100) < 20) {
            seqs[n] = new_seq(order++, 1 + rnd(rnd(6) == 0 ? 150 : 30), 1 + rnd(40));
            assert_int_equal(dsq_sched_add(sch, seqs[n]), DSQ_OK);
            n++;
        }
        /* state before the step */
        int n_run = 0, n_wait = 0;
        bool all_near = true;
        for (int i = 0; i < n; i++) {
            dsq_seq_t *s = seqs[i];
            if (s->state == DSQ_SEQ_RUNNING) {
                n_run++;
                all_near = all_near && s->n_computed >= s->n_prompt &&
                           s->n_tokens - s->n_computed == 1 &&
                           s->n_max_tokens - s->n_tokens <= K;
            } else if (s->state == DSQ_SEQ_WAITING) {
                n_wait++;
            }
        }
        dsq_sched_out_t out;
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        int n_dec = 0, n_pre = 0;
        bool admitted = false;
        for (int i = 0; i < out.n_seqs; i++) {
            dsq_seq_t *s = out.seqs[i];
            bool dec = s->n_computed >= s->n_prompt && s->n_tokens - s->n_computed == 1;
            if (dec)
                n_dec++;
            else
                n_pre += s->sched_tokens;
            if (s->n_computed == 0)
                admitted = true;
        }
        assert_true(out.n_tokens <= 40);
        if (n_dec > 0)
            assert_true(n_pre <= CAP);
        if (n_run > 0 && n_wait > 0 && all_near && out.n_preempted == 0)
            assert_false(admitted);
        commit(sch, &out);
        for (int i = 0; i < n; i++) {
            dsq_seq_t *s = seqs[i];
            if (s->state == DSQ_SEQ_RUNNING && s->n_tokens == s->n_max_tokens) {
                dsq_sched_remove(sch, s);
                s->state = DSQ_SEQ_DETACHED;
                n_done++;
            }
        }
    }
    assert_int_equal(dsq_kv_n_free(kv), 24);
    dsq_sched_destroy(sch);
    for (int i = 0; i < n; i++)
        free_seq(seqs[i]);
    dsq_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_cap),
        cmocka_unit_test(test_defer),
        cmocka_unit_test(test_step_budget),
        cmocka_unit_test(test_fixed_cost_floors),
        cmocka_unit_test(test_waiting_floor),
        cmocka_unit_test(test_paused_free_slots),
        cmocka_unit_test(test_property),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* tests for the fair share of engine/serve/scheduler.c: how one step's
 * slots, decode rows and prefill tokens are split between requests
 * (dsq_seq_t.req), worked out by hand from the policy in scheduler.h.
 *  - forks of an n > 1 request wait for a slot (max_num_seqs bounds the
 *    running sequences, forks included) and keep their shared KV while
 *    they wait;
 *  - a new request takes a slot from a request that holds them all (slot
 *    reclaim: one of its sequences is parked with its KV, not recomputed),
 *    and slots keep moving, one a step, while a request runs two fewer
 *    than another (max-min fair share);
 *  - decode rows beyond the step budget go round-robin across requests: a
 *    one-sequence request decodes every step, a 16-sequence one takes
 *    turns;
 *  - prefill tokens are shared max-min fairly: a short prompt that
 *    arrives behind four long ones is computed in the next step;
 *  - out of blocks, the request with the most running sequences gives
 *    one up (not the youngest request);
 *  - dsq_sched_n_free_slots (the engine's waiting cap counts on it).
 * Before this policy the same traffic ran 1 + n forks past max_num_seqs,
 * left a new request waiting for a slot until the big one ended, queued a
 * short prompt behind every long one, and preempted the youngest request
 * first. */
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

/* owners: the requests (only their addresses matter) */
static char H, S, A, B, C, D, E;

static dsq_seq_t *new_seq(void *owner, uint64_t order, int n_prompt, int max_tokens)
{
    dsq_seq_t *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    s->owner = s;                  /* as the engine: each its own handle */
    s->req = owner;
    s->order = order;
    s->cap_tokens = n_prompt + max_tokens + 1;
    s->tokens = calloc((size_t)s->cap_tokens, sizeof(int32_t));
    assert_non_null(s->tokens);
    for (int i = 0; i < n_prompt; i++)
        s->tokens[i] = 100 + i + (int)order;
    s->n_tokens = n_prompt;
    s->n_prompt = n_prompt;
    s->n_max_tokens = n_prompt + max_tokens;
    dsq_block_table_init(&s->bt);
    return s;
}

static void free_seq(dsq_seq_t *s)
{
    dsq_block_table_deinit(&s->bt);
    free(s->tokens);
    free(s);
}

/* A fork of p as the engine makes one (choice.c): p's tokens and
 * computed positions, its blocks shared, queued with dsq_sched_add_fork. */
static dsq_seq_t *fork_of(dsq_kv_cache_t *kv, dsq_sched_t *sch, const dsq_seq_t *p, int index)
{
    dsq_seq_t *c = new_seq((void *)p->req, p->order, 0, p->cap_tokens);
    c->index = index;
    memcpy(c->tokens, p->tokens, (size_t)p->n_tokens * sizeof(int32_t));
    c->n_tokens = p->n_tokens;
    c->n_prompt = p->n_prompt;
    c->n_computed = p->n_computed;
    c->n_max_tokens = p->n_max_tokens;
    assert_int_equal(dsq_kv_seq_fork(kv, &c->bt, &p->bt), DSQ_OK);
    assert_int_equal(dsq_sched_add_fork(sch, c), DSQ_OK);
    return c;
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

static dsq_kv_cache_t *kv_new(int block_size, int n_blocks)
{
    char err[256];
    dsq_kv_cache_t *kv = dsq_kv_create(1, 1, 4, block_size, n_blocks, DSQ_KV_F16, err,
                                       sizeof(err));
    assert_non_null(kv);
    return kv;
}

/* End every running sequence that reached its max_tokens; returns how many. */
static int end_finished(dsq_sched_t *sch, dsq_seq_t **v, int n)
{
    int done = 0;
    for (int i = 0; i < n; i++)
        if (v[i]->state == DSQ_SEQ_RUNNING && v[i]->n_tokens == v[i]->n_max_tokens) {
            dsq_sched_remove(sch, v[i]);
            done++;
        }
    return done;
}

/* Request H of n = 8 (prompt 10, 40 tokens) on 4 slots: the prompt, its
 * seven forks, then three steps of 4 decode rows. */
static void start_h8(dsq_kv_cache_t *kv, dsq_sched_t *sch, dsq_seq_t **h)
{
    dsq_sched_out_t out;
    h[0] = new_seq(&H, 0, 10, 40);
    assert_int_equal(dsq_sched_add(sch, h[0]), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    dsq_sched_commit(sch, &out);
    for (int i = 1; i < 8; i++)
        h[i] = fork_of(kv, sch, h[0], i);
    for (int i = 0; i < 8; i++)
        h[i]->tokens[h[i]->n_tokens++] = 7;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(out.n_seqs, 4);
        commit(sch, &out);
    }
}

/* Run H to its end (never more than 4 running, none recomputed), then
 * free it and the scheduler; every block is back. */
static void finish_h8(dsq_kv_cache_t *kv, dsq_sched_t *sch, dsq_seq_t **h)
{
    dsq_sched_out_t out;
    int done = 0, steps = 0;
    while (done < 8) {
        assert_true(++steps < 1000);
        done += end_finished(sch, h, 8);
        if (done == 8)
            break;
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_true(dsq_sched_n_running(sch) <= 4);
        commit(sch, &out);
    }
    for (int i = 0; i < 8; i++) {
        assert_int_equal(h[i]->n_tokens, 50);
        assert_int_equal(h[i]->n_preempted, 0);
    }
    assert_int_equal(dsq_kv_n_free(kv), 128);
    dsq_sched_destroy(sch);
    for (int i = 0; i < 8; i++)
        free_seq(h[i]);
}

/* A request of n = 6 on max_num_seqs 4: after the prompt the five forks
 * wait; three take the free slots at once, the other two when choices
 * end. Never more than 4 running, no fork recomputed (they waited with
 * the prompt's blocks), every choice complete. */
static void test_forks_wait_for_slots(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(16, 64);
    dsq_sched_opts_t so = {.max_num_seqs = 4, .max_num_batched_tokens = 256};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *v[6];
    v[0] = new_seq(&H, 0, 10, 5);
    assert_int_equal(dsq_sched_add(sch, v[0]), DSQ_OK);
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, v[0]), 10);
    dsq_sched_commit(sch, &out);
    for (int i = 1; i < 6; i++)
        v[i] = fork_of(kv, sch, v[0], i);
    for (int i = 0; i < 6; i++)      /* the first token of each, one logits row */
        v[i]->tokens[v[i]->n_tokens++] = 7;
    assert_int_equal(dsq_sched_n_running(sch), 1);
    assert_int_equal(dsq_sched_n_waiting(sch), 5);
    assert_true(dsq_sched_check(sch));

    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 4);
    assert_int_equal(dsq_sched_n_running(sch), 4);
    assert_int_equal(dsq_sched_n_waiting(sch), 2);
    for (int i = 0; i < 4; i++)
        assert_int_equal(tokens_of(&out, v[i]), 1);   /* oldest forks first */
    commit(sch, &out);
    int done = 0, steps = 0;
    while (done < 6) {
        assert_true(++steps < 100);
        done += end_finished(sch, v, 6);
        if (done == 6)
            break;
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_true(out.n_seqs <= 4);
        assert_true(dsq_sched_n_running(sch) <= 4);
        commit(sch, &out);
        assert_true(dsq_sched_check(sch));
    }
    for (int i = 0; i < 6; i++) {
        assert_int_equal(v[i]->n_tokens, 15);
        assert_int_equal(v[i]->n_preempted, 0);
    }
    assert_int_equal(dsq_kv_n_free(kv), 64);
    dsq_sched_destroy(sch);
    for (int i = 0; i < 6; i++)
        free_seq(v[i]);
    dsq_kv_destroy(kv);
}

/* Request H (n = 8) holds all 4 slots and has 4 forks waiting. A new
 * request S runs in the very next step: H's youngest running choice is
 * parked (back to waiting with its KV), S prefills and then decodes every
 * step. H's parked choice resumes without recompute. */
static void test_new_request_gets_a_slot(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(16, 128);
    dsq_sched_opts_t so = {.max_num_seqs = 4, .max_num_batched_tokens = 256};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *h[8];
    dsq_sched_out_t out;
    start_h8(kv, sch, h);
    assert_int_equal(h[3]->state, DSQ_SEQ_RUNNING);
    int h3_computed = h[3]->n_computed;

    dsq_seq_t *s = new_seq(&S, 1, 8, 3);
    assert_int_equal(dsq_sched_add(sch, s), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, s), 8);            /* no wait for a slot */
    assert_int_equal(dsq_sched_n_running(sch), 4);
    assert_int_equal(h[3]->state, DSQ_SEQ_WAITING);     /* parked, */
    assert_int_equal(h[3]->n_computed, h3_computed);    /* its KV kept */
    assert_true(h[3]->bt.n > 0);
    commit(sch, &out);
    while (s->state == DSQ_SEQ_RUNNING && s->n_tokens < s->n_max_tokens) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(tokens_of(&out, s), 1);         /* every step */
        assert_true(dsq_sched_n_running(sch) <= 4);
        commit(sch, &out);
    }
    dsq_sched_remove(sch, s);
    finish_h8(kv, sch, h);
    free_seq(s);
    dsq_kv_destroy(kv);
}

static int n_running_of(dsq_seq_t **v, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += v[i]->state == DSQ_SEQ_RUNNING;
    return k;
}

/* Slots move to the max-min fair share, a slot a step: H (n = 8) holds
 * all 4; S (n = 2) gets one for its prompt, and once its fork waits, a
 * second one, so both of S's choices decode every step beside two of H's,
 * and no slot moves back and forth after that. Keyed per sequence instead
 * (dsq_seq_t.req unset), S's fork would wait for one of H's to end. */
static void test_slots_move_to_fair_share(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(16, 128);
    dsq_sched_opts_t so = {.max_num_seqs = 4, .max_num_batched_tokens = 256};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *h[8], *s[2];
    dsq_sched_out_t out;
    start_h8(kv, sch, h);
    assert_int_equal(n_running_of(h, 8), 4);

    s[0] = new_seq(&S, 1, 8, 10);
    assert_int_equal(dsq_sched_add(sch, s[0]), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, s[0]), 8);
    assert_int_equal(n_running_of(h, 8), 3);
    commit(sch, &out);                    /* s[0]'s first token too */
    s[1] = fork_of(kv, sch, s[0], 1);
    for (int k = 0; k < 8; k++) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(tokens_of(&out, s[0]), 1);
        assert_int_equal(tokens_of(&out, s[1]), 1);   /* from the first step on */
        assert_int_equal(n_running_of(h, 8), 2);
        assert_int_equal(out.n_seqs, 4);
        commit(sch, &out);
    }
    for (int i = 0; i < 2; i++)
        dsq_sched_remove(sch, s[i]);
    finish_h8(kv, sch, h);
    for (int i = 0; i < 2; i++)
        free_seq(s[i]);
    dsq_kv_destroy(kv);
}

/* Step budget 100 ms, 10 ms per decode row, nothing to prefill: 9 rows
 * a step (90% of the budget). Request H has 16 decoding sequences,
 * request S one. S decodes in every step; H's take turns, 8 rows a step,
 * so over 16 steps each of them decodes exactly 8 times. */
static void test_decode_round_robin(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(16, 256);
    dsq_sched_opts_t so = {.max_num_seqs = 32, .max_num_batched_tokens = 256};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *h[16];
    for (int i = 0; i < 16; i++) {
        h[i] = new_seq(&H, 0, 4, 100);
        h[i]->index = i;
        assert_int_equal(dsq_sched_add(sch, h[i]), DSQ_OK);
    }
    dsq_seq_t *s = new_seq(&S, 1, 4, 100);
    assert_int_equal(dsq_sched_add(sch, s), DSQ_OK);
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 17);
    commit(sch, &out);
    dsq_step_cost_t c = {.fixed_ms = 0, .token_ms = 10, .pair_ms = 0};
    dsq_sched_set_step_budget(sch, 100, &c);
    int turns[16] = {0};
    for (int k = 0; k < 16; k++) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        assert_int_equal(out.n_seqs, 9);
        assert_int_equal(tokens_of(&out, s), 1);
        for (int i = 0; i < 16; i++)
            turns[i] += tokens_of(&out, h[i]);
        commit(sch, &out);
    }
    for (int i = 0; i < 16; i++)
        assert_int_equal(turns[i], 8);
    /* without the budget every row runs again */
    dsq_sched_set_step_budget(sch, 0, NULL);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(out.n_seqs, 17);
    for (int i = 0; i < 16; i++)
        dsq_sched_remove(sch, h[i]);
    dsq_sched_remove(sch, s);
    assert_int_equal(dsq_kv_n_free(kv), 256);
    dsq_sched_destroy(sch);
    for (int i = 0; i < 16; i++)
        free_seq(h[i]);
    free_seq(s);
    dsq_kv_destroy(kv);
}

/* 64 prefill tokens a step. Four 400-token prompts share them (16 each);
 * an 8-token prompt E that arrives behind them gets all 8 in the next
 * step, beside a share for each long one (the one scheduled least
 * recently first: 64 / 5 = 12, then E's 8, then 44 split evenly: 14, 15,
 * 15), and decodes from the step after. */
static void test_prefill_shares(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(16, 256);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = 64};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    void *owners[4] = {&A, &B, &C, &D};
    dsq_seq_t *l[4];
    for (int i = 0; i < 4; i++) {
        l[i] = new_seq(owners[i], (uint64_t)i, 400, 1);
        assert_int_equal(dsq_sched_add(sch, l[i]), DSQ_OK);
    }
    dsq_sched_out_t out;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        for (int i = 0; i < 4; i++)
            assert_int_equal(tokens_of(&out, l[i]), 16);
        commit(sch, &out);
    }
    dsq_seq_t *e = new_seq(&E, 4, 8, 4);
    assert_int_equal(dsq_sched_add(sch, e), DSQ_OK);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, e), 8);
    assert_int_equal(out.n_tokens, 64);
    assert_int_equal(tokens_of(&out, l[0]), 12);     /* least recently scheduled */
    assert_int_equal(tokens_of(&out, l[1]), 14);
    assert_int_equal(tokens_of(&out, l[2]), 15);
    assert_int_equal(tokens_of(&out, l[3]), 15);
    commit(sch, &out);
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    assert_int_equal(tokens_of(&out, e), 1);
    for (int i = 0; i < 4; i++)
        assert_true(tokens_of(&out, l[i]) >= 15);
    assert_int_equal(out.n_tokens, 64);
    for (int i = 0; i < 4; i++)
        dsq_sched_remove(sch, l[i]);
    dsq_sched_remove(sch, e);
    assert_int_equal(dsq_kv_n_free(kv), 256);
    dsq_sched_destroy(sch);
    for (int i = 0; i < 4; i++)
        free_seq(l[i]);
    free_seq(e);
    dsq_kv_destroy(kv);
}

/* Out of blocks, the request with the most running sequences (then the
 * most sequences) gives one up: H (three sequences) and S (one, the
 * youngest request) decode in a cache that holds far less than they
 * want. S is never preempted and decodes every step; H is preempted. */
static void test_preempt_the_largest(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(4, 12);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = 64};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    dsq_seq_t *h[3];
    for (int i = 0; i < 3; i++) {
        h[i] = new_seq(&H, 0, 4, 30);
        h[i]->index = i;
        assert_int_equal(dsq_sched_add(sch, h[i]), DSQ_OK);
    }
    dsq_seq_t *s = new_seq(&S, 1, 4, 30);
    assert_int_equal(dsq_sched_add(sch, s), DSQ_OK);
    dsq_sched_out_t out;
    int64_t pre = 0;
    while (s->state != DSQ_SEQ_DETACHED) {
        assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
        pre += out.n_preempted;
        assert_int_equal(s->n_preempted, 0);
        assert_true(tokens_of(&out, s) > 0);
        commit(sch, &out);
        assert_true(dsq_sched_check(sch));
        if (s->n_tokens == s->n_max_tokens)
            dsq_sched_remove(sch, s);
    }
    assert_true(pre > 0);
    for (int i = 0; i < 3; i++)
        dsq_sched_remove(sch, h[i]);
    assert_int_equal(dsq_kv_n_free(kv), 12);
    dsq_sched_destroy(sch);
    for (int i = 0; i < 3; i++)
        free_seq(h[i]);
    free_seq(s);
    dsq_kv_destroy(kv);
}

/* The free slots the engine's waiting cap subtracts: max_num_seqs less the
 * running sequences that are not paused. */
static void test_free_slots(void **state)
{
    (void)state;
    dsq_kv_cache_t *kv = kv_new(16, 64);
    dsq_sched_opts_t so = {.max_num_seqs = 4, .max_num_batched_tokens = 256};
    dsq_sched_t *sch = dsq_sched_create(kv, &so);
    assert_non_null(sch);
    assert_int_equal(dsq_sched_n_free_slots(sch), 4);
    dsq_seq_t *a = new_seq(&A, 0, 4, 10), *b = new_seq(&B, 1, 4, 10);
    assert_int_equal(dsq_sched_add(sch, a), DSQ_OK);
    assert_int_equal(dsq_sched_add(sch, b), DSQ_OK);
    assert_int_equal(dsq_sched_n_free_slots(sch), 4);   /* waiting: no slot yet */
    dsq_sched_out_t out;
    assert_int_equal(dsq_sched_step(sch, &out), DSQ_OK);
    commit(sch, &out);
    assert_int_equal(dsq_sched_n_free_slots(sch), 2);
    a->paused = true;
    assert_int_equal(dsq_sched_n_free_slots(sch), 3);
    dsq_sched_remove(sch, a);
    dsq_sched_remove(sch, b);
    assert_int_equal(dsq_sched_n_free_slots(sch), 4);
    dsq_sched_destroy(sch);
    free_seq(a);
    free_seq(b);
    dsq_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forks_wait_for_slots),
        cmocka_unit_test(test_new_request_gets_a_slot),
        cmocka_unit_test(test_slots_move_to_fair_share),
        cmocka_unit_test(test_decode_round_robin),
        cmocka_unit_test(test_prefill_shares),
        cmocka_unit_test(test_preempt_the_largest),
        cmocka_unit_test(test_free_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

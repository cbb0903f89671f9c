/* tests for the scheduler's cap on prompt-logprob rows per step
 * (dsq_sched_opts_t.max_prompt_logit_rows, engine/serve/scheduler.h).
 *
 * A prompt-logprob request (echo + logprobs) needs one logits row of
 * n_vocab floats per prompt token of its chunk, so without a cap one step
 * of max_num_batched_tokens such tokens held max_num_batched_tokens rows
 * (2048 x 100k floats = 800 MB) whatever the memory planner sized. The
 * test checks, step by step until every prompt is computed: the prompt
 * tokens of flagged sequences scheduled in a step never exceed the cap,
 * other sequences still use the rest of the token budget, every flagged
 * prompt is computed completely and in order, and FCFS admission holds. */
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

static void seq_make(dsq_seq_t *s, int n_prompt, uint64_t order, bool plogits)
{
    memset(s, 0, sizeof(*s));
    s->cap_tokens = n_prompt + 1;
    s->tokens = calloc((size_t)s->cap_tokens, sizeof(int32_t));
    assert_non_null(s->tokens);
    for (int i = 0; i < n_prompt; i++)
        s->tokens[i] = 1 + i % 97;
    s->n_tokens = s->n_prompt = n_prompt;
    s->order = order;
    s->prompt_logits = plogits;
    dsq_block_table_init(&s->bt);
}

static void run(int cap)
{
    char err[128];
    enum { N = 4, STEP = 64 };
    const int n_prompt[N] = {150, 40, 200, 90};
    const bool plogits[N] = {true, false, true, true};
    dsq_kv_cache_t *kv = dsq_kv_create(1, 1, 4, 16, 256, DSQ_KV_F16, err, sizeof(err));
    assert_non_null(kv);
    dsq_sched_opts_t so = {.max_num_seqs = 8, .max_num_batched_tokens = STEP,
                           .max_prompt_logit_rows = cap};
    dsq_sched_t *sc = dsq_sched_create(kv, &so);
    assert_non_null(sc);
    dsq_seq_t seqs[N];
    for (int i = 0; i < N; i++) {
        seq_make(&seqs[i], n_prompt[i], (uint64_t)i, plogits[i]);
        assert_int_equal(dsq_sched_add(sc, &seqs[i]), DSQ_OK);
    }
    int steps = 0, max_plr = 0;
    bool other_shared = false;
    for (;;) {
        bool all_done = true;
        for (int i = 0; i < N; i++)
            all_done = all_done && seqs[i].n_computed >= seqs[i].n_prompt;
        if (all_done)
            break;
        assert_true(++steps < 1000);
        dsq_sched_out_t out;
        assert_int_equal(dsq_sched_step(sc, &out), DSQ_OK);
        assert_true(out.n_tokens > 0);
        assert_true(out.n_tokens <= STEP);
        int plr = 0;
        bool other = false;
        for (int i = 0; i < out.n_seqs; i++) {
            dsq_seq_t *q = out.seqs[i];
            /* rows come in position order from n_computed */
            for (int r = 0; r < q->sched_tokens; r++)
                assert_int_equal(out.pos[q->sched_row + r], q->n_computed + r);
            if (q->prompt_logits && q->n_computed < q->n_prompt)
                plr += q->sched_tokens;
            else
                other = true;
        }
        if (cap > 0)
            assert_true(plr <= cap);
        if (plr > max_plr)
            max_plr = plr;
        other_shared = other_shared || (other && plr > 0);
        dsq_sched_commit(sc, &out);
        /* FCFS: a younger sequence never has KV while an older one has none */
        for (int i = 1; i < N; i++)
            if (seqs[i].n_computed > 0)
                assert_true(seqs[i - 1].n_computed > 0);
        /* the prompts are only prefilled here: take finished ones out so
         * the test does not need to sample */
        for (int i = 0; i < N; i++)
            if (seqs[i].state == DSQ_SEQ_RUNNING && seqs[i].n_computed >= seqs[i].n_prompt)
                dsq_sched_remove(sc, &seqs[i]);
    }
    if (cap > 0) {
        assert_int_equal(max_plr, cap);   /* the cap is used, not undershot */
        assert_true(other_shared);        /* the rest of a step still runs */
    } else {
        assert_int_equal(max_plr, STEP);  /* uncapped: a whole step */
    }
    assert_int_equal(dsq_kv_n_free(kv), 256);
    for (int i = 0; i < N; i++) {
        assert_int_equal(seqs[i].n_computed, seqs[i].n_prompt);
        dsq_block_table_deinit(&seqs[i].bt);
        free(seqs[i].tokens);
    }
    dsq_sched_destroy(sc);
    dsq_kv_destroy(kv);
}

static void test_plogit_rows_capped(void **state)
{
    (void)state;
    run(24);
    run(1);
}

static void test_plogit_rows_uncapped(void **state)
{
    (void)state;
    run(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plogit_rows_capped),
        cmocka_unit_test(test_plogit_rows_uncapped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

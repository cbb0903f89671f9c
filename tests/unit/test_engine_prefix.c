/* tests for prefix caching through engine/serve/engine.c on the real
 * SmolLM2-135M-Instruct Q4_1 model.
 *
 * The reference is the same engine with prefix caching off (whose greedy
 * output test_engine and test_model check against llama.cpp): with caching
 * on, greedy tokens must be identical for
 *  - the same request twice (the second reuses all full blocks but the
 *    last, cached_tokens = floor((n_prompt - 1) / 16) * 16),
 *  - prompts sharing a long prefix (about 40+ tokens),
 *  - an n = 2 request forking cached blocks,
 *  - all prompts at once under a KV budget of 12 blocks, where blocks are
 *    evicted and sequences preempted,
 * and cached_tokens must be 0 with caching off. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/serve/engine.h"
#include "engine/common/error.h"
#include "engine/text/tokenizer.h"
#include "engine_test.h"

#define MAX_NEW 16
#define BLOCK 16
#define N_SHARED 4
#define N_OTHER 3
#define N_ALL (N_SHARED + N_OTHER)

#define SHARED_HEAD                                                                     \
    "The following notes describe the history of the city of Rome, from its legendary " \
    "founding by Romulus and Remus, through the kingdom, the republic and the empire, " \
    "for students who are new to the subject. "

static const char *const prompts[N_ALL] = {
    SHARED_HEAD "Question: who founded the city?",
    SHARED_HEAD "Question: when did the republic begin?",
    SHARED_HEAD "Summarize the notes in one sentence.",
    SHARED_HEAD "List three emperors:",
    /* unrelated prompts of about 100 tokens each: they push the shared
     * blocks out of a 12-block cache */
    "In a quiet village at the edge of a dark forest there lived an old clockmaker who "
    "repaired every clock in the region, from tiny pocket watches to the great tower clock "
    "of the cathedral, and every evening he walked to the river to watch the boats return "
    "with their catch while the children ran along the bank shouting the names of the "
    "boats they knew. One day a stranger",
    "import numpy as np\nimport matplotlib.pyplot as plt\n\n"
    "def simulate(n_steps, dt, mass, spring_constant, damping):\n"
    "    position = np.zeros(n_steps)\n    velocity = np.zeros(n_steps)\n"
    "    position[0] = 1.0\n    for i in range(1, n_steps):\n"
    "        force = -spring_constant * position[i - 1] - damping * velocity[i - 1]\n"
    "        velocity[i] =",
    "Dear members of the committee, thank you for the opportunity to present our annual "
    "report. This year the organisation grew in every region, opened four new offices, hired "
    "more than two hundred people and, most importantly, served twice as many families as in "
    "the previous year. In the following pages we describe",
};

typedef struct result {
    int32_t tokens[2][64];
    int n_tokens[2];
    int cached_tokens, prompt_tokens;
} result_t;

static waiter_t W = WAITER_INIT;
static dsq_engine_t *open_engine(int64_t kv_bytes, bool prefix)
{
    dsq_engine_opts_t o = {.kv_cache_memory_bytes = kv_bytes,
                           .max_model_len = 160, .block_size = BLOCK,
                           .enable_prefix_caching = prefix};
    return smollm2_engine(&o);
}

static dsq_req_t *submit(dsq_engine_t *e, const char *text, int n)
{
    dsq_sampling_t sp = {.max_tokens = MAX_NEW, .temperature = 0, .top_p = 1, .n = n,
                         .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
    return req_submit_text(e, &W, text, &sp);
}

static void collect(dsq_req_t *r, result_t *res)
{
    memset(res, 0, sizeof(*res));
    dsq_output_t ev;
    while (wait_next(&W, r, &ev) > 0) {
        for (int i = 0; i < ev.n_tokens && ev.index < 2; i++)
            if (res->n_tokens[ev.index] < 64)
                res->tokens[ev.index][res->n_tokens[ev.index]++] = ev.tokens[i];
        if (ev.finish != DSQ_FINISH_NONE) {
            assert_int_equal(ev.finish, DSQ_FINISH_LENGTH);
            res->cached_tokens = ev.cached_tokens;
            res->prompt_tokens = ev.prompt_tokens;
        }
        dsq_output_free(&ev);
    }
    dsq_req_unref(r);
}

static void run_one(dsq_engine_t *e, int p, int n, result_t *res)
{
    collect(submit(e, prompts[p], n), res);
}

static void same_tokens(const result_t *got, const result_t *want, int choice, int p)
{
    assert_int_equal(got->n_tokens[choice], MAX_NEW);
    if (memcmp(got->tokens[choice], want->tokens[0], sizeof(int32_t) * MAX_NEW) != 0)
        fail_msg("prompt %d choice %d: output differs with prefix caching on", p, choice);
}

static int cacheable(int n_prompt)
{
    return (n_prompt - 1) / BLOCK * BLOCK;
}

static void test_prefix_on_off(void **state)
{
    (void)state;
    const int64_t per_block = 2LL * 30 * 3 * 64 * 2 * BLOCK;
    result_t ref[N_ALL], res;

    /* reference: caching off, generous budget, one request at a time */
    dsq_engine_t *e = open_engine(64 * per_block, false);
    for (int p = 0; p < N_ALL; p++) {
        run_one(e, p, 1, &ref[p]);
        assert_int_equal(ref[p].cached_tokens, 0);
        assert_true(ref[p].prompt_tokens >= 40);
    }
    run_one(e, 0, 1, &res);                       /* off: never cached */
    assert_int_equal(res.cached_tokens, 0);
    same_tokens(&res, &ref[0], 0, 0);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    assert_int_equal(st.prefix_cache_queries_total, 0);
    dsq_engine_destroy(e);

    /* caching on, 12 blocks (192 tokens) */
    e = open_engine(12 * per_block, true);
    run_one(e, 0, 1, &res);
    assert_int_equal(res.cached_tokens, 0);
    same_tokens(&res, &ref[0], 0, 0);
    /* the same request again: every full block but the last position's */
    run_one(e, 0, 1, &res);
    print_message("# prompt 0: %d tokens, %d cached on the second run\n", res.prompt_tokens,
                  res.cached_tokens);
    assert_int_equal(res.cached_tokens, cacheable(res.prompt_tokens));
    assert_true(res.cached_tokens >= 32);
    same_tokens(&res, &ref[0], 0, 0);
    /* prompts sharing the head reuse its full blocks */
    int shared_cached = res.cached_tokens;
    for (int p = 1; p < N_SHARED; p++) {
        run_one(e, p, 1, &res);
        print_message("# prompt %d: %d tokens, %d cached\n", p, res.prompt_tokens,
                      res.cached_tokens);
        assert_true(res.cached_tokens >= 32);
        assert_true(res.cached_tokens % BLOCK == 0);
        assert_true(res.cached_tokens < res.prompt_tokens);
        same_tokens(&res, &ref[p], 0, p);
    }
    /* n = 2 on a cached prompt: both choices fork the cached blocks */
    run_one(e, 1, 2, &res);
    assert_int_equal(res.cached_tokens, cacheable(res.prompt_tokens));
    same_tokens(&res, &ref[1], 0, 1);
    same_tokens(&res, &ref[1], 1, 1);
    /* unrelated long prompts fill the cache and evict the shared head */
    for (int p = N_SHARED; p < N_ALL; p++) {
        run_one(e, p, 1, &res);
        same_tokens(&res, &ref[p], 0, p);
    }
    run_one(e, 0, 1, &res);
    print_message("# prompt 0 after eviction: %d cached (was %d)\n", res.cached_tokens,
                  shared_cached);
    assert_true(res.cached_tokens < shared_cached);
    same_tokens(&res, &ref[0], 0, 0);

    /* everything at once: preemption, eviction and reuse together */
    dsq_req_t *rs[N_ALL];
    for (int p = 0; p < N_ALL; p++)
        rs[p] = submit(e, prompts[p], 1);
    for (int p = 0; p < N_ALL; p++) {
        collect(rs[p], &res);
        same_tokens(&res, &ref[p], 0, p);
    }
    for (int i = 0; i < 2000; i++) {
        dsq_engine_stats(e, &st);
        if (st.n_running == 0 && st.n_waiting == 0 && st.kv_blocks_used == 0)
            break;
        usleep(1000);
    }
    print_message("# on: %lld blocks, %lld preemptions, prefix queries %lld hits %lld "
                  "tokens\n", (long long)st.kv_blocks_total, (long long)st.preemptions_total,
                  (long long)st.prefix_cache_queries_total,
                  (long long)st.prefix_cache_hits_total);
    assert_int_equal(st.kv_blocks_used, 0);    /* cached blocks count as free */
    assert_true(st.prefix_cache_hits_total > 0);
    assert_true(st.prefix_cache_hits_total < st.prefix_cache_queries_total);
    dsq_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_on_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

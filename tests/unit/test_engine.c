/* tests for engine/serve/engine.c: the engine thread, requests and outputs, on the
 * real SmolLM2-135M-Instruct Q4_1 model.
 *  - batch invariance: the greedy output of each of 16 prompts is the same
 *    alone, among the 15 others, and under preemption forced by a tiny KV
 *    budget (preemption by recompute must be invisible);
 *  - n > 1 shares the prompt (fork) and seeded sampling is reproducible;
 *  - stop strings end the choice and are never emitted;
 *  - cancellation ends a request with "abort" and frees its KV blocks;
 *  - prompt + max_tokens > max_model_len is refused with DSQ_ERANGE;
 *  - prompt logprobs come once, unchanged by chunking and preemption, and
 *    best_of > n returns the n best candidates (api);
 *  - a step that fails while a request forks its choices (debug hook
 *    DSQ_TEST_FAIL_SAMPLE_CHOICE) ends every choice with "abort", never
 *    leaving one unfinished, and the engine serves the next request;
 *  - the waiting cap counts only requests no free run slot awaits, and
 *    max_num_seqs bounds an n > 1 request's running choices;
 *  - a new request is served beside an n > 1 request that holds every run
 *    slot, before any of its choices ends. */
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

#define N_PROMPTS 16
#define MAX_NEW 12

/* s with line breaks shown as "\\n", for one TAP comment line (a static
 * buffer per call slot: two per print at most) */
static const char *one_line(const char *s)
{
    static char buf[2][2048];
    static int k;
    char *o = buf[k++ & 1];
    size_t n = 0;
    for (; s && *s && n + 3 < sizeof(buf[0]); s++) {
        if (*s == '\n' || *s == '\r') {
            o[n++] = '\\';
            o[n++] = *s == '\n' ? 'n' : 'r';
        } else {
            o[n++] = *s;
        }
    }
    o[n] = '\0';
    return o;
}

static const char *const prompts[N_PROMPTS] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
    "Water boils at",
    "In computer science, a linked list is",
    "Dear Sir or Madam, I am writing to",
    "The three primary colors are",
    "import numpy as np\nx =",
    "Paris, London, Berlin,",
    "The sun rises in the",
    "A haiku about autumn:",
    "Q: What is 2 + 2?\nA:",
    "The best way to learn a language is",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
};

typedef struct result {
    int32_t tokens[256];
    int n_tokens;
    char text[4096];
    size_t text_len;
    dsq_finish_t finish[8];
    int stop_matched[8];
    int reasoning_tokens[8];
    int n_choices_done;
    int32_t choice_tokens[8][64];
    int choice_n[8];
} result_t;

static waiter_t W = WAITER_INIT;

static dsq_engine_t *open_engine(int64_t kv_bytes, int max_model_len)
{
    dsq_engine_opts_t o = {.kv_cache_memory_bytes = kv_bytes,
                           .max_model_len = max_model_len, .block_size = 16};
    return smollm2_engine(&o);
}

static dsq_sampling_t greedy(int max_tokens)
{
    dsq_sampling_t sp = {.max_tokens = max_tokens, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
    return sp;
}

static dsq_req_t *submit(dsq_engine_t *e, const char *text, const dsq_sampling_t *sp)
{
    return req_submit_text(e, &W, text, sp);
}

/* The preemption checks need every request of submit_all competing for
 * the KV blocks in the same steps, however slow the box: a quiet time
 * before the first step of a burst long enough that all are waiting when
 * it runs, and no step budget (on a slow or loaded box the measured step
 * cost would cut the prefill chunks, so fewer sequences would hold blocks
 * at once; the budget has its own tests in test_sched_latency.c). */
#define BURST_WINDOW_MS 1000
#define NO_STEP_BUDGET (-1.0)

/* Every prompt, encoded first, then submitted back to back into rs. */
static void submit_all(dsq_engine_t *e, const dsq_sampling_t *sp, dsq_req_t **rs)
{
    int32_t *ids[N_PROMPTS];
    size_t n[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        ids[i] = NULL;
        assert_int_equal(dsq_tokenizer_encode(dsq_engine_tokenizer(e), prompts[i],
                                              strlen(prompts[i]), DSQ_TOK_PARSE_SPECIAL,
                                              &ids[i], &n[i]), 0);
    }
    for (int i = 0; i < N_PROMPTS; i++)
        rs[i] = req_submit_ids(e, &W, ids[i], (int)n[i], sp);
    for (int i = 0; i < N_PROMPTS; i++)
        free(ids[i]);
}

/* Drain events until every choice of r has finished. */
static void collect(dsq_req_t *r, result_t *res)
{
    memset(res, 0, sizeof(*res));
    dsq_output_t ev;
    while (wait_next(&W, r, &ev) > 0) {
        for (int i = 0; i < ev.n_tokens; i++) {
            if (ev.index == 0 && res->n_tokens < 256)
                res->tokens[res->n_tokens++] = ev.tokens[i];
            if (ev.index < 8 && res->choice_n[ev.index] < 64)
                res->choice_tokens[ev.index][res->choice_n[ev.index]++] = ev.tokens[i];
        }
        if (ev.index == 0 && res->text_len + ev.text_len < sizeof(res->text)) {
            memcpy(res->text + res->text_len, ev.text, ev.text_len);
            res->text_len += ev.text_len;
        }
        if (ev.finish != DSQ_FINISH_NONE && ev.index < 8) {
            res->finish[ev.index] = ev.finish;
            res->stop_matched[ev.index] = ev.stop_matched;
            res->reasoning_tokens[ev.index] = ev.reasoning_tokens;
            res->n_choices_done++;
        }
        dsq_output_free(&ev);
    }
}

static result_t alone[N_PROMPTS];

static void test_batch_invariance(void **state)
{
    (void)state;
    dsq_engine_t *e = open_engine(64 << 20, 512);
    dsq_sampling_t sp = greedy(MAX_NEW);
    for (int i = 0; i < N_PROMPTS; i++) {
        dsq_req_t *r = submit(e, prompts[i], &sp);
        collect(r, &alone[i]);
        assert_int_equal(alone[i].n_tokens, MAX_NEW);
        assert_int_equal(alone[i].finish[0], DSQ_FINISH_LENGTH);
        assert_int_equal(alone[i].stop_matched[0], 0);
        dsq_req_unref(r);
    }
    /* all together */
    dsq_req_t *rs[N_PROMPTS];
    result_t together;
    for (int i = 0; i < N_PROMPTS; i++)
        rs[i] = submit(e, prompts[i], &sp);
    for (int i = 0; i < N_PROMPTS; i++) {
        collect(rs[i], &together);
        assert_int_equal(together.n_tokens, MAX_NEW);
        assert_memory_equal(together.tokens, alone[i].tokens, sizeof(int32_t) * MAX_NEW);
        assert_string_equal(together.text, alone[i].text);
        dsq_req_unref(rs[i]);
    }
    wait_engine_idle(e);
    dsq_engine_destroy(e);

    /* a KV budget of 8 blocks (128 tokens): the 16 sequences cannot all
     * fit, so the scheduler must preempt and recompute */
    int64_t per_block = 2LL * 30 * 3 * 64 * 2 * 16;
    dsq_engine_opts_t tiny = {.kv_cache_memory_bytes = 8 * per_block, .max_model_len = 128,
                              .block_size = 16, .admission_window_ms = BURST_WINDOW_MS,
                              .step_budget_ms = NO_STEP_BUDGET};
    e = smollm2_engine(&tiny);
    submit_all(e, &sp, rs);
    for (int i = 0; i < N_PROMPTS; i++) {
        collect(rs[i], &together);
        assert_int_equal(together.n_tokens, MAX_NEW);
        assert_memory_equal(together.tokens, alone[i].tokens, sizeof(int32_t) * MAX_NEW);
        dsq_req_unref(rs[i]);
    }
    wait_engine_idle(e);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    print_message("# tiny KV budget: %lld blocks, %lld preemptions\n",
                  (long long)st.kv_blocks_total, (long long)st.preemptions_total);
    assert_true(st.preemptions_total > 0);
    dsq_engine_destroy(e);
}

static void test_n_seed_stop_cancel(void **state)
{
    (void)state;
    dsq_engine_t *e = open_engine(64 << 20, 512);
    /* n = 3 greedy: every choice equals the single greedy answer */
    dsq_sampling_t sp = greedy(MAX_NEW);
    sp.n = 3;
    result_t res;
    dsq_req_t *r = submit(e, prompts[0], &sp);
    collect(r, &res);
    dsq_req_unref(r);
    assert_int_equal(res.n_choices_done, 3);
    result_t one;
    dsq_sampling_t sp1 = greedy(MAX_NEW);
    r = submit(e, prompts[0], &sp1);
    collect(r, &one);
    dsq_req_unref(r);
    for (int c = 0; c < 3; c++) {
        assert_int_equal(res.choice_n[c], MAX_NEW);
        assert_memory_equal(res.choice_tokens[c], one.tokens, sizeof(int32_t) * MAX_NEW);
    }
    /* seeded sampling: same seed, same tokens; choices differ from each other */
    dsq_sampling_t ss = greedy(MAX_NEW);
    ss.temperature = 1.0f;
    ss.n = 2;
    ss.has_seed = true;
    ss.seed = 1234;
    result_t s1, s2;
    r = submit(e, prompts[1], &ss);
    collect(r, &s1);
    dsq_req_unref(r);
    r = submit(e, prompts[1], &ss);
    collect(r, &s2);
    dsq_req_unref(r);
    assert_memory_equal(s1.choice_tokens, s2.choice_tokens, sizeof(s1.choice_tokens));
    assert_memory_not_equal(s1.choice_tokens[0], s1.choice_tokens[1], sizeof(int32_t) * MAX_NEW);

    /* stop string: take a word from the middle of the greedy text */
    const char *text = alone[1].text[0] ? alone[1].text : one.text;
    const char *prompt = alone[1].text[0] ? prompts[1] : prompts[0];
    size_t tl = strlen(text);
    assert_true(tl > 8);
    char stop[8];
    memcpy(stop, text + tl / 2, 3);
    stop[3] = 0;
    /* the second stop string is the one that ends it: stop_matched
     * names it (1-based) */
    const char *stops[] = {"\x01never", stop};
    dsq_sampling_t st = greedy(MAX_NEW);
    st.n_stop = 2;
    st.stop = stops;
    r = submit(e, prompt, &st);
    collect(r, &res);
    dsq_req_unref(r);
    const char *at = strstr(text, stop);
    assert_non_null(at);
    print_message("# stop %s: got [%s]\n", one_line(stop), one_line(res.text));
    assert_int_equal(res.finish[0], DSQ_FINISH_STOP);
    assert_int_equal(res.stop_matched[0], 2);
    assert_int_equal(res.text_len, (size_t)(at - text));
    assert_memory_equal(res.text, text, res.text_len);
    assert_null(strstr(res.text, stop));

    /* cancel a long request after its first output */
    dsq_sampling_t lg = greedy(400);
    r = submit(e, prompts[2], &lg);
    dsq_output_t ev;
    int got;
    while ((got = dsq_req_next(r, &ev)) == 0)
        usleep(1000);
    assert_int_equal(got, 1);
    dsq_output_free(&ev);
    dsq_engine_cancel(e, r);
    collect(r, &res);
    assert_int_equal(res.finish[0], DSQ_FINISH_ABORT);
    dsq_req_unref(r);
    wait_engine_idle(e);

    /* context too long */
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    dsq_sampling_t big = greedy(510);
    char err[128];
    r = dsq_req_create(ids, 8, &big, notify, &W, err, sizeof(err));
    assert_int_equal(dsq_engine_submit(e, r), DSQ_ERANGE);
    dsq_req_unref(r);
    dsq_engine_destroy(e);
}

/* api: prompt logprobs (sp.prompt_logprobs). The request's first event
 * carries exactly n_prompt - 1 of them, no other event carries any, and the
 * values do not depend on how the prompt was computed: alone in one
 * prefill, in chunks of 8 tokens among 16 other requests, and under the
 * preemption a tiny KV budget forces (recompute must not emit them twice or
 * shift them). Their agreement with llama.cpp is checked end to end
 * (tests/e2e/test_api_gaps.py). best_of > n: n choices, the best first. */
typedef struct plp_result {
    float lp[128];
    dsq_top_logprob_t top[128][2];
    int n, n_events_with_plp, n_choices;
    float cum[4];
} plp_result_t;

static void collect_plp(dsq_req_t *r, plp_result_t *res)
{
    memset(res, 0, sizeof(*res));
    dsq_output_t ev;
    while (wait_next(&W, r, &ev) > 0) {
        if (ev.prompt_logprobs) {
            res->n_events_with_plp++;
            assert_true(ev.n_prompt_logprobs <= 128);
            res->n = ev.n_prompt_logprobs;
            memcpy(res->lp, ev.prompt_logprobs, (size_t)res->n * sizeof(float));
            assert_int_equal(ev.n_top, 2);
            for (int i = 0; i < res->n; i++)
                memcpy(res->top[i], ev.prompt_top + (size_t)i * 2, sizeof(res->top[i]));
        }
        for (int i = 0; ev.logprobs && i < ev.n_tokens && ev.index < 4; i++)
            res->cum[ev.index] += ev.logprobs[i];
        if (ev.finish != DSQ_FINISH_NONE)
            res->n_choices++;
        dsq_output_free(&ev);
    }
}

static dsq_req_t *submit_ids(dsq_engine_t *e, const int32_t *ids, int n,
                             const dsq_sampling_t *sp)
{
    return req_submit_ids(e, &W, ids, n, sp);
}

static void test_prompt_logprobs_and_best_of(void **state)
{
    (void)state;
    const char *text = prompts[6];
    int32_t *ids = NULL;
    size_t n = 0;
    dsq_engine_t *e = open_engine(64 << 20, 512);
    assert_int_equal(dsq_tokenizer_encode(dsq_engine_tokenizer(e), text, strlen(text), 0,
                                          &ids, &n), 0);
    assert_true(n > 4 && n < 100);
    dsq_sampling_t sp = greedy(0);
    sp.prompt_logprobs = true;
    sp.logprobs = 2;
    plp_result_t alone, crowd;
    dsq_req_t *r = submit_ids(e, ids, (int)n, &sp);
    collect_plp(r, &alone);
    dsq_req_unref(r);
    assert_int_equal(alone.n_events_with_plp, 1);
    assert_int_equal(alone.n, (int)n - 1);
    assert_int_equal(alone.n_choices, 1);
    for (int i = 0; i < alone.n; i++) {
        /* a log-probability, and the top list is sorted and bounds it */
        assert_true(alone.lp[i] <= 0 && alone.top[i][0].logprob >= alone.top[i][1].logprob);
        assert_true(alone.lp[i] <= alone.top[i][0].logprob + 1e-6f);
    }
    /* best_of 3, n 2, seeded: 2 choices, ordered by cumulative logprob */
    dsq_sampling_t bo = greedy(6);
    bo.temperature = 1.0f;
    bo.has_seed = true;
    bo.seed = 99;
    bo.logprobs = 0;
    bo.n = 2;
    bo.best_of = 3;
    plp_result_t b;
    r = submit_ids(e, ids, (int)n, &bo);
    collect_plp(r, &b);
    dsq_req_unref(r);
    assert_int_equal(b.n_choices, 2);
    assert_true(b.cum[0] >= b.cum[1]);
    assert_int_equal(b.n_events_with_plp, 0);
    wait_engine_idle(e);
    dsq_engine_destroy(e);

    /* chunks of 8 tokens, 16 other requests, 8 KV blocks: preemption */
    int64_t per_block = 2LL * 30 * 3 * 64 * 2 * 16;
    dsq_engine_opts_t o = {.kv_cache_memory_bytes = 8 * per_block,
                           .max_model_len = 128, .block_size = 16,
                           .max_num_batched_tokens = 8,
                           .admission_window_ms = BURST_WINDOW_MS,
                           .step_budget_ms = NO_STEP_BUDGET};
    e = smollm2_engine(&o);
    dsq_sampling_t other = greedy(MAX_NEW);
    dsq_req_t *rs[N_PROMPTS];
    submit_all(e, &other, rs);
    sp.max_tokens = 8;
    r = submit_ids(e, ids, (int)n, &sp);
    collect_plp(r, &crowd);
    dsq_req_unref(r);
    for (int i = 0; i < N_PROMPTS; i++) {
        result_t res;
        collect(rs[i], &res);
        dsq_req_unref(rs[i]);
    }
    wait_engine_idle(e);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    print_message("# prompt logprobs under load: %lld preemptions\n",
                  (long long)st.preemptions_total);
    assert_true(st.preemptions_total > 0);
    dsq_engine_destroy(e);
    assert_int_equal(crowd.n_events_with_plp, 1);
    assert_int_equal(crowd.n, alone.n);
    for (int i = 0; i < alone.n; i++) {
        /* same positions; chunk shape may change fp rounding a little */
        if (!(crowd.lp[i] > alone.lp[i] - 1e-2f && crowd.lp[i] < alone.lp[i] + 1e-2f))
            fail_msg("position %d: %f alone, %f under load", i, alone.lp[i], crowd.lp[i]);
    }
    free(ids);
}

static void test_failed_step_ends_all_choices(void **state)
{
    (void)state;
#ifdef NDEBUG
    skip();   /* the hook exists only in debug builds */
#else
    setenv("DSQ_TEST_FAIL_SAMPLE_CHOICE", "1", 1);
    dsq_engine_t *e = open_engine(64 << 20, 512);
    unsetenv("DSQ_TEST_FAIL_SAMPLE_CHOICE");
    /* choice 1's first token is sampled in the step that forks choices
     * 1 and 2 off choice 0: the step fails after the fork */
    dsq_sampling_t sp = greedy(MAX_NEW);
    sp.n = 3;
    result_t res;
    dsq_req_t *r = submit(e, prompts[0], &sp);
    collect(r, &res);
    dsq_req_unref(r);
    assert_int_equal(res.n_choices_done, 3);
    for (int c = 0; c < 3; c++)
        assert_int_equal(res.finish[c], DSQ_FINISH_ABORT);
    wait_engine_idle(e);
    /* the hook fires once: the same request now completes */
    r = submit(e, prompts[0], &sp);
    collect(r, &res);
    dsq_req_unref(r);
    assert_int_equal(res.n_choices_done, 3);
    for (int c = 0; c < 3; c++) {
        assert_int_equal(res.finish[c], DSQ_FINISH_LENGTH);
        assert_int_equal(res.choice_n[c], MAX_NEW);
    }
    wait_engine_idle(e);
    dsq_engine_destroy(e);
#endif
}

/* Run slots (max_num_seqs 4) and the waiting cap (2): six requests
 * submitted at once are all taken, four for the free slots and two to
 * wait, and only a seventh is refused (before, the cap counted the
 * burst the admission window held, so the third was refused with every
 * slot free). An n = 6 request never runs more than 4 sequences at once
 * (its forks wait for slots) and still returns all 6 choices. */
static void test_waiting_cap_and_slots(void **state)
{
    (void)state;
    dsq_engine_opts_t o = {.kv_cache_memory_bytes = 64 << 20, .max_model_len = 512,
                           .block_size = 16, .max_num_seqs = 4, .max_waiting_requests = 2};
    dsq_engine_t *e = smollm2_engine(&o);
    dsq_sampling_t sp = greedy(400);          /* none ends meanwhile */
    dsq_req_t *rs[6];
    for (int i = 0; i < 6; i++)
        rs[i] = submit(e, prompts[i], &sp);   /* each DSQ_OK */
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256];
    assert_int_equal(dsq_tokenizer_encode(dsq_engine_tokenizer(e), prompts[6],
                                          strlen(prompts[6]), DSQ_TOK_PARSE_SPECIAL, &ids, &n),
                     0);
    dsq_req_t *r = dsq_req_create(ids, (int)n, &sp, notify, &W, err, sizeof(err));
    assert_non_null(r);
    assert_int_equal(dsq_engine_submit(e, r), DSQ_EFULL);
    dsq_req_unref(r);
    free(ids);
    result_t res;
    for (int i = 0; i < 6; i++) {
        dsq_engine_cancel(e, rs[i]);
        collect(rs[i], &res);
        dsq_req_unref(rs[i]);
    }
    wait_engine_idle(e);

    sp = greedy(24);
    sp.n = 6;
    r = submit(e, prompts[1], &sp);
    int max_running = 0, choices = 0, tokens[6] = {0};
    for (;;) {
        dsq_engine_stats_t st;
        dsq_engine_stats(e, &st);
        if (st.n_running > max_running)
            max_running = st.n_running;
        dsq_output_t ev;
        int got = dsq_req_next(r, &ev);
        if (got < 0)
            break;
        if (got == 0) {
            usleep(1000);
            continue;
        }
        assert_true(ev.index >= 0 && ev.index < 6);
        tokens[ev.index] += ev.n_tokens;
        choices += ev.finish != DSQ_FINISH_NONE;
        dsq_output_free(&ev);
    }
    dsq_req_unref(r);
    print_message("# n = 6 on max_num_seqs 4: at most %d running\n", max_running);
    assert_true(max_running <= 4);
    assert_int_equal(choices, 6);
    for (int c = 0; c < 6; c++)
        assert_int_equal(tokens[c], 24);
    wait_engine_idle(e);
    dsq_engine_destroy(e);
}

/* Events of r ready now (none waited for): tokens and finished choices
 * are added to *n_tokens and *n_done. Returns false once r has ended. */
static bool drain_ready(dsq_req_t *r, int *n_tokens, int *n_done)
{
    dsq_output_t ev;
    int got;
    while ((got = dsq_req_next(r, &ev)) > 0) {
        *n_tokens += ev.n_tokens;
        *n_done += ev.finish != DSQ_FINISH_NONE;
        dsq_output_free(&ev);
    }
    return got == 0;
}

/* An engine of 4 run slots and a request of n = 6, 400 tokens each,
 * running (8 tokens out); its tokens and ended choices counted so far. */
static dsq_req_t *start_n6_on_4_slots(dsq_engine_t **e, int *n_tokens, int *n_done)
{
    dsq_engine_opts_t o = {.kv_cache_memory_bytes = 64 << 20, .max_model_len = 512,
                           .block_size = 16, .max_num_seqs = 4};
    *e = smollm2_engine(&o);
    dsq_sampling_t sp = greedy(400);
    sp.n = 6;
    dsq_req_t *r = submit(*e, prompts[1], &sp);
    for (int i = 0; i < 10000 && *n_tokens < 8; i++) {
        assert_true(drain_ready(r, n_tokens, n_done));
        usleep(1000);
    }
    assert_true(*n_tokens >= 8);
    return r;
}

/* A request of n = 6 holds all 4 run slots (two forks wait); a one-choice
 * request submitted then is answered while every choice of the big one
 * is still generating: the fair share is per request (dsq_seq_t.req), so
 * the big one gives up a slot. Keyed on each choice instead, every choice
 * looked like a request of its own and the small one waited for one of
 * the big one's choices to end. */
static void test_new_request_beside_n_request(void **state)
{
    (void)state;
    dsq_engine_t *e;
    int n_big = 0, n_big_done = 0;
    dsq_req_t *big = start_n6_on_4_slots(&e, &n_big, &n_big_done);
    dsq_sampling_t one = greedy(2);
    dsq_req_t *small = submit(e, prompts[0], &one);
    result_t res;
    collect(small, &res);
    dsq_req_unref(small);
    assert_int_equal(res.n_tokens, 2);
    assert_true(drain_ready(big, &n_big, &n_big_done));
    print_message("# beside n = 6 on 4 slots: answered after %d of its tokens\n", n_big);
    assert_int_equal(n_big_done, 0);
    /* a slot within a step, then 2 tokens: ~20 of the big one's (3 a
     * step); with each choice taken for a request of its own, no request
     * would hold two slots to give one up, and the small one would wait
     * for a choice of the big one to end (~130 with these lengths) */
    assert_true(n_big <= 60);
    dsq_engine_cancel(e, big);
    collect(big, &res);
    dsq_req_unref(big);
    wait_engine_idle(e);
    dsq_engine_destroy(e);
}

/* The fair share is per request, not per sequence. Beside A (n = 6 on 4
 * run slots), B (n = 2) gets half the slots: both of B's choices decode
 * every step while A runs two. Were the share kept per sequence (each fork
 * a request of its own: the engine not telling the scheduler which request
 * a choice belongs to), B's two forks would take turns with A's six, one
 * step in four each, and A would emit about three times B's tokens while B
 * runs, not about as many. */
static void test_fair_share_is_per_request(void **state)
{
    (void)state;
    dsq_engine_t *e;
    int n_a = 0, n_a_done = 0;
    dsq_req_t *a = start_n6_on_4_slots(&e, &n_a, &n_a_done);
    dsq_sampling_t two = greedy(8);
    two.n = 2;
    int a_before = n_a;
    dsq_req_t *b = submit(e, prompts[0], &two);
    result_t res;
    collect(b, &res);
    assert_true(drain_ready(a, &n_a, &n_a_done));
    dsq_req_unref(b);
    assert_int_equal(res.choice_n[0], 8);
    assert_int_equal(res.choice_n[1], 8);
    int a_during = n_a - a_before;
    print_message("# A (n = 6) emitted %d tokens while B (n = 2) emitted 16\n", a_during);
    /* 16 and a step or two around B's ends when shared per request, ~48
     * when per sequence */
    assert_true(a_during <= 28);
    assert_int_equal(n_a_done, 0);
    dsq_engine_cancel(e, a);
    collect(a, &res);
    dsq_req_unref(a);
    wait_engine_idle(e);
    dsq_engine_destroy(e);
}

/* The reasoning budget: a choice inside its thinking section writes
 * budget tokens as it would without one, then the end marker's ids, then
 * goes on; the tokens inside are counted. The marker is "</think>" as
 * SmolLM2's tokenizer splits it (several ids), so the forced end spans
 * steps. */
static void test_think_budget(void **state)
{
    (void)state;
    dsq_engine_t *e = open_engine(64 << 20, 512);
    const dsq_tokenizer_t *tok = dsq_engine_tokenizer(e);
    int32_t *end = NULL, *start = NULL;
    size_t n_end = 0, n_start = 0;
    assert_int_equal(dsq_tokenizer_encode(tok, "</think>", 8, DSQ_TOK_PARSE_SPECIAL, &end,
                                          &n_end), 0);
    assert_int_equal(dsq_tokenizer_encode(tok, "<think>", 7, DSQ_TOK_PARSE_SPECIAL, &start,
                                          &n_start), 0);
    assert_true(n_end >= 2);
    result_t plain, res;
    dsq_sampling_t sp = greedy(24);
    dsq_req_t *r = submit(e, prompts[3], &sp);
    collect(r, &plain);
    dsq_req_unref(r);
    assert_int_equal(plain.reasoning_tokens[0], 0);   /* nothing tracked */
    sp.n_think_start = (int)n_start;
    sp.think_start = start;
    sp.n_think_end = (int)n_end;
    sp.think_end = end;
    /* tracked, no budget: the prompt opened the section and SmolLM2
     * never closes it, so every token is reasoning */
    sp.think_open = true;
    r = submit(e, prompts[3], &sp);
    collect(r, &res);
    dsq_req_unref(r);
    assert_memory_equal(res.tokens, plain.tokens, 24 * sizeof(int32_t));
    assert_int_equal(res.reasoning_tokens[0], 24);
    /* not opened by the prompt, and SmolLM2 never writes <think>: none */
    sp.think_open = false;
    r = submit(e, prompts[3], &sp);
    collect(r, &res);
    dsq_req_unref(r);
    assert_int_equal(res.reasoning_tokens[0], 0);
    for (int budget = 0; budget <= 5; budget += 5) {
        sp.think_open = true;
        sp.has_think_budget = true;
        sp.think_budget = budget;
        r = submit(e, prompts[3], &sp);
        collect(r, &res);
        dsq_req_unref(r);
        print_message("# budget %d: [%s]\n", budget, one_line(res.text));
        assert_int_equal(res.n_tokens, 24);
        assert_memory_equal(res.tokens, plain.tokens, (size_t)budget * sizeof(int32_t));
        assert_memory_equal(res.tokens + budget, end, n_end * sizeof(int32_t));
        assert_int_equal(res.reasoning_tokens[0], budget + (int)n_end);
        /* one forced end only: the answer after it is free */
        assert_non_null(strstr(res.text, "</think>"));
        assert_null(strstr(strstr(res.text, "</think>") + 1, "</think>"));
    }
    free(end);
    free(start);
    wait_engine_idle(e);
    dsq_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_n_seed_stop_cancel),
        cmocka_unit_test(test_prompt_logprobs_and_best_of),
        cmocka_unit_test(test_failed_step_ends_all_choices),
        cmocka_unit_test(test_waiting_cap_and_slots),
        cmocka_unit_test(test_new_request_beside_n_request),
        cmocka_unit_test(test_fair_share_is_per_request),
        cmocka_unit_test(test_think_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* tests for speculative decoding (engine/serve/spec.c, speculate.c and the
 * scheduler's draft rows), on the real SmolLM2-135M-Instruct Q4_1 model.
 *
 *  - the n-gram proposer against cases worked by hand from its definition
 *    (spec.h): longest suffix first, latest occurrence with k tokens after
 *    it, else the one with the most; the draft length rule likewise;
 *  - the output with speculation is the output without it, token for
 *    token, for every kind of request the engine serves side by side in
 *    one batch: greedy, seeded sampling (temperature, top-k, top-p,
 *    penalties), n = 2, logprobs with alternatives, a stop string, a
 *    request that opts out; and the logprobs are the same numbers (the
 *    draft rows go through the multi-row forward path, whose products and
 *    attention are the same per row as the one-row path's: the engine's
 *    batch invariance, test_engine.c; the tolerance below only absorbs
 *    what a different summation order would give);
 *  - speculation did happen and pay: drafts were accepted on prompts whose
 *    continuation copies them;
 *  - the same on the tiny llama (GGUF), GPTQ, qwen2 and deepseek2 (V2-Lite,
 *    V3, group routing) models;
 *  - over independent seeds, sampled speculative decoding draws from plain
 *    sampling's distribution (chi-square on stories260K, vocabulary 512);
 *  - 1,000 speculative requests (stories260K), a third cancelled
 *    mid-stream, in a KV cache small enough to preempt them, leave every
 *    KV block free and the counters consistent (accepted <= drafted; the
 *    per-position counts never grow with the position).
 * The engines here propose all K drafts wherever the lookup has them
 * (spec_fixed_len): these are checks of correctness in any batch, not of
 * the draft length policy (test_draft_len is). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/serve/engine.h"
#include "engine/serve/spec.h"
#include "engine/common/error.h"
#include "engine/text/tokenizer.h"
#include "engine_test.h"
#include "test_common.h"

static waiter_t W = WAITER_INIT;

/* ------------------------------------------------------------ proposer */

static void expect_propose(const int32_t *t, int n, int n_min, int n_max, int k,
                           const int32_t *want, int n_want)
{
    int32_t out[16] = {0};
    int got = dsq_spec_ngram_propose(t, n, n_min, n_max, k, out);
    assert_int_equal(got, n_want);
    for (int i = 0; i < n_want; i++)
        assert_int_equal(out[i], want[i]);
}

static void test_ngram_propose(void **state)
{
    (void)state;
    /* suffix "2 3" occurs at 1: "4 5 6" follows */
    const int32_t a[] = {1, 2, 3, 4, 5, 6, 7, 2, 3};
    expect_propose(a, 9, 2, 2, 3, (const int32_t[]){4, 5, 6}, 3);
    /* k caps it; the text's end caps it (the match at 1 has 5 after it) */
    expect_propose(a, 9, 2, 2, 2, (const int32_t[]){4, 5}, 2);
    expect_propose(a, 9, 1, 1, 8, (const int32_t[]){4, 5, 6, 7, 2, 3}, 6);
    /* no earlier "7 2 3": the 3-gram fails, the 2-gram answers */
    expect_propose(a, 9, 2, 3, 3, (const int32_t[]){4, 5, 6}, 3);
    /* no match at all */
    const int32_t b[] = {1, 2, 3, 4};
    expect_propose(b, 4, 1, 3, 4, NULL, 0);
    /* longest first: "8 9" matches at 0 and (later) at 4; "7 8 9" only
     * at 3, so the 3-gram's continuation wins */
    const int32_t c[] = {8, 9, 1, 7, 8, 9, 2, 7, 8, 9};
    expect_propose(c, 10, 2, 3, 1, (const int32_t[]){2}, 1);
    expect_propose(c, 10, 2, 2, 1, (const int32_t[]){2}, 1);  /* latest "8 9": 4 */
    /* a repeated run: the latest "5 5" (just behind the suffix) has one
     * token after it, an earlier one k: that one is taken */
    const int32_t d[] = {5, 5, 5, 5, 5, 5};
    expect_propose(d, 6, 2, 2, 3, (const int32_t[]){5, 5, 5}, 3);
    /* when no occurrence has k after it, the one with the most */
    const int32_t e[] = {4, 6, 1, 4, 6, 2, 3, 4, 6};
    expect_propose(e, 9, 2, 2, 8, (const int32_t[]){1, 4, 6, 2, 3, 4, 6}, 7);
    /* bad arguments propose nothing */
    int32_t out[4];
    assert_int_equal(dsq_spec_ngram_propose(a, 9, 0, 2, 3, out), 0);
    assert_int_equal(dsq_spec_ngram_propose(a, 9, 3, 2, 3, out), 0);
    assert_int_equal(dsq_spec_ngram_propose(a, 9, 2, 2, 0, out), 0);
    assert_int_equal(dsq_spec_ngram_propose(a, 1, 1, 2, 3, out), 0);
}

/* The draft length: draft i joins while what it adds, alpha^i tokens for
 * row_cost, beats the tokens per cost e / c of the step so far (a plain
 * step: e = c = 1), alpha = (accepted + 1.2) / (checked + 2); worked by
 * hand (tests/ref has no model of it: the numbers below are the rule's
 * arithmetic, step by step). */
static void test_draft_len(void **state)
{
    (void)state;
    /* no record: alpha 0.6, rows 0.1: 0.6 / 0.1 = 6 > 1 -> e/c = 1.6 / 1.1
     * = 1.4545; 3.6 > 1.4545 -> 1.96 / 1.2 = 1.6333; 2.16 > 1.6333 ->
     * 2.176 / 1.3 = 1.6738; 1.296 < 1.6738: 3 */
    assert_int_equal(dsq_spec_draft_len(0, 0, 0.1, 16), 3);
    assert_int_equal(dsq_spec_draft_len(0, 0, 0.1, 2), 2);
    assert_int_equal(dsq_spec_draft_len(0, 0, 0.6, 16), 0);
    /* 18.6 of 20 kept: alpha 0.9, rows 0.2: e/c climbs 1.5833, 1.9357,
     * 2.1494, 2.2751, 2.3428, 2.3714, 2.3731 (7 drafts), and the eighth
     * adds 0.9^8 / 0.2 = 2.152 < 2.3731: 7 (a plain-rate rule, alpha^i >
     * row_cost, would take 15: 2.037 tokens per cost, 14 % fewer) */
    assert_int_equal(dsq_spec_draft_len(18.6, 20, 0.2, 16), 7);
    /* cheap rows: 0.9^16 / 0.02 = 9.26 > e/c = 6.27 after 15: k_max */
    assert_int_equal(dsq_spec_draft_len(18.6, 20, 0.02, 16), 16);
    /* nothing kept of 5: alpha 0.1714; 0.1714 < 0.25 */
    assert_int_equal(dsq_spec_draft_len(0, 5, 0.25, 16), 0);
    /* 0.1714 / 0.1 > 1 -> e/c 1.0649; 0.0294 / 0.1 = 0.294 < 1.0649: 1 */
    assert_int_equal(dsq_spec_draft_len(0, 5, 0.1, 16), 1);
    /* dear rows: nothing pays; k_max 0 */
    assert_int_equal(dsq_spec_draft_len(100, 100, 1.0, 16), 0);
    assert_int_equal(dsq_spec_draft_len(100, 100, 0.1, 0), 0);
}

/* ------------------------------------------------------------ engine */

#define MAX_NEW 48
#define N_REQ 10

/* prompts whose continuation repeats them (where n-gram lookup pays) and
 * ordinary ones */
static const char *const prompts[N_REQ] = {
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "def add(a, b):\n",
    "<|im_start|>user\nRepeat this sentence exactly: The quick brown fox jumps over the "
    "lazy dog near the river bank.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4,",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "import numpy as np\nx = np.zeros(3)\ny = np.ones(3)\nimport numpy as np\nx =",
    "Paris, London, Berlin, Paris, London,",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "A haiku about autumn:",
    "Q: What is 2 + 2?\nA:",
};

typedef struct out {
    int32_t tok[2][MAX_NEW];
    float lp[2][MAX_NEW];
    dsq_top_logprob_t top[MAX_NEW][2];
    int n[2];
    char text[2048];
    size_t text_len;
    dsq_finish_t finish[2];
} out_t;

static const char *const STOPS[] = {"return"};

/* The sampling of request i: a mix of what the engine serves. */
static dsq_sampling_t sampling_of(int i)
{
    dsq_sampling_t sp = {.max_tokens = MAX_NEW, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
    switch (i) {
    case 1:  /* logprobs with two alternatives */
        sp.logprobs = 2;
        break;
    case 2:  /* seeded sampling */
        sp.temperature = 0.8f;
        sp.has_seed = true;
        sp.seed = 1234;
        sp.logprobs = 0;
        break;
    case 3:  /* n = 2, seeded, top-k / top-p */
        sp.temperature = 1.0f;
        sp.top_k = 40;
        sp.top_p = 0.9f;
        sp.has_seed = true;
        sp.seed = 99;
        sp.n = 2;
        break;
    case 4:  /* penalties */
        sp.repetition_penalty = 1.3f;
        sp.presence_penalty = 0.5f;
        sp.frequency_penalty = 0.5f;
        break;
    case 0:  /* a stop string (the copied code has "return" in it) */
        sp.n_stop = 1;
        sp.stop = STOPS;
        break;
    case 6:  /* opts out */
        sp.no_speculation = true;
        break;
    case 7:  /* short: max_tokens ends it inside a verification */
        sp.max_tokens = 5;
        break;
    default:
        break;
    }
    return sp;
}

static void collect(dsq_req_t *r, out_t *o)
{
    memset(o, 0, sizeof(*o));
    dsq_output_t ev;
    while (wait_next(&W, r, &ev) > 0) {
        int c = ev.index;
        assert_true(c >= 0 && c < 2);
        for (int i = 0; i < ev.n_tokens && o->n[c] < MAX_NEW; i++) {
            o->tok[c][o->n[c]] = ev.tokens[i];
            o->lp[c][o->n[c]] = ev.logprobs ? ev.logprobs[i] : 0;
            if (c == 0 && ev.top && ev.n_top == 2)
                memcpy(o->top[o->n[c]], ev.top + (size_t)i * 2, sizeof(o->top[0]));
            o->n[c]++;
        }
        if (c == 0 && o->text_len + ev.text_len < sizeof(o->text)) {
            memcpy(o->text + o->text_len, ev.text, ev.text_len);
            o->text_len += ev.text_len;
        }
        if (ev.finish != DSQ_FINISH_NONE)
            o->finish[c] = ev.finish;
        dsq_output_free(&ev);
    }
}

static dsq_engine_t *open_engine(int spec_k)
{
    dsq_engine_opts_t o = {.kv_cache_memory_bytes = 64 << 20, .max_model_len = 512,
                           .block_size = 16, .spec_k = spec_k, .spec_max_batch = 16,
                           .spec_fixed_len = true, .step_budget_ms = -1};
    return smollm2_engine(&o);
}

/* Every request at once (one batch: speculating, plain and prefill rows
 * mixed in the same steps). */
static void run_all(dsq_engine_t *e, out_t *res)
{
    dsq_req_t *rs[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        dsq_sampling_t sp = sampling_of(i);
        rs[i] = req_submit_text(e, &W, prompts[i], &sp);
    }
    for (int i = 0; i < N_REQ; i++) {
        collect(rs[i], &res[i]);
        dsq_req_unref(rs[i]);
    }
}

static out_t plain[N_REQ], spec[N_REQ];

static void test_same_output(void **state)
{
    (void)state;
    dsq_engine_t *e = open_engine(0);
    run_all(e, plain);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    assert_int_equal(st.spec_drafts_total, 0);
    dsq_engine_destroy(e);

    e = open_engine(4);
    run_all(e, spec);
    wait_engine_idle(e);
    dsq_engine_stats(e, &st);
    dsq_engine_destroy(e);

    for (int i = 0; i < N_REQ; i++) {
        int nc = sampling_of(i).n;
        for (int c = 0; c < nc; c++) {
            if (plain[i].n[c] != spec[i].n[c] ||
                memcmp(plain[i].tok[c], spec[i].tok[c], sizeof(int32_t) * (size_t)plain[i].n[c]))
                fail_msg("request %d choice %d: %d tokens without speculation, %d with, or "
                         "different ids", i, c, plain[i].n[c], spec[i].n[c]);
            assert_int_equal(plain[i].finish[c], spec[i].finish[c]);
            /* raw logprobs of the same tokens: equal up to fp32 summation
             * order (1e-3 nats is far below what a different token or
             * context would move) */
            for (int t = 0; t < plain[i].n[c]; t++)
                if (fabsf(plain[i].lp[c][t] - spec[i].lp[c][t]) > 1e-3f)
                    fail_msg("request %d token %d: logprob %g vs %g", i, t,
                             (double)plain[i].lp[c][t], (double)spec[i].lp[c][t]);
        }
        for (int t = 0; i == 1 && t < plain[i].n[0]; t++)
            for (int a = 0; a < 2; a++)
                assert_int_equal(plain[i].top[t][a].token, spec[i].top[t][a].token);
        assert_int_equal(plain[i].text_len, spec[i].text_len);
        assert_memory_equal(plain[i].text, spec[i].text, plain[i].text_len);
    }
    assert_int_equal(spec[7].n[0], 5);
    assert_int_equal(spec[0].finish[0], DSQ_FINISH_STOP);
    print_message("# drafts=%lld draft_tokens=%lld accepted=%lld per_pos=%lld,%lld,%lld,%lld\n",
                  (long long)st.spec_drafts_total, (long long)st.spec_draft_tokens_total,
                  (long long)st.spec_accepted_tokens_total,
                  (long long)st.spec_accepted_per_pos[0], (long long)st.spec_accepted_per_pos[1],
                  (long long)st.spec_accepted_per_pos[2], (long long)st.spec_accepted_per_pos[3]);
    /* speculation ran and kept drafts: the copying prompts make most of
     * them right */
    assert_int_equal(st.spec_k, 4);
    assert_true(st.spec_drafts_total > 0);
    assert_true(st.spec_accepted_tokens_total > st.spec_draft_tokens_total / 4);
    assert_true(st.spec_accepted_tokens_total <= st.spec_draft_tokens_total);
}

/* request k of the 1,000: request k % N_REQ's sampling, one choice, 4 to
 * 16 tokens */
static dsq_sampling_t many_sampling(int k)
{
    dsq_sampling_t sp = sampling_of(k % N_REQ);
    sp.max_tokens = 4 + k % 13;
    sp.n = 1;
    return sp;
}

/* 1,000 speculative requests, 8 at a time, every third cancelled after
 * its first event, in a KV cache small enough that they preempt each
 * other: the KV blocks all come back and the counters agree. */
static void test_kv_after_many(void **state)
{
    (void)state;
    /* stories260K: the accounting does not depend on the model's size,
     * and a tiny one keeps 1,000 requests cheap (also under ASan) */
    char *model, *tok;
    stories260k_paths(&model, &tok);
    dsq_engine_opts_t o = {.model_path = model, .tokenizer_path = tok,
                           .kv_cache_memory_bytes = 120 << 10, .max_model_len = 128,
                           .block_size = 16, .spec_k = 4, .spec_max_batch = 16,
                           .spec_fixed_len = true, .step_budget_ms = -1};
    char err[256];
    dsq_engine_t *e = dsq_engine_create(&o, err, sizeof(err));
    if (!e)
        fail_msg("engine: %s", err);
    free(model);
    free(tok);
    run_with_cancels(e, &W, 1000, prompts, N_REQ, many_sampling);
    wait_engine_idle(e);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    print_message("# 1,000 requests: drafts %lld, kept %lld, preemptions %lld, kv blocks %lld\n",
                  (long long)st.spec_drafts_total, (long long)st.spec_accepted_tokens_total,
                  (long long)st.preemptions_total, (long long)st.kv_blocks_total);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_true(st.preemptions_total > 0);
    assert_true(st.spec_drafts_total > 100);
    assert_true(st.spec_accepted_tokens_total <= st.spec_draft_tokens_total);
    int64_t sum = 0;
    for (int i = 0; i < DSQ_SPEC_MAX_K; i++) {
        sum += st.spec_accepted_per_pos[i];
        if (i > 0)
            assert_true(st.spec_accepted_per_pos[i] <= st.spec_accepted_per_pos[i - 1]);
    }
    assert_int_equal(sum, st.spec_accepted_tokens_total);
    dsq_engine_destroy(e);
}

/* ------------------------------------------------------ tiny models */

/* Greedy ids of each prompt of ids (every request at once) on model (a
 * path under $DSQ_MODELS_DIR) with the stories260K tokenizer when the
 * file has none; drafts kept into *accepted. */
#define TINY_OUT 32
static void tiny_run(const char *rel, bool own_tok, int spec_k, const int32_t (*p)[12], int n_p,
                     int32_t (*out)[TINY_OUT], int64_t *accepted, int64_t *drafted)
{
    char *model = path_join("DSQ_MODELS_DIR", "models", rel), *mp, *tok = NULL;
    require_file_hint(model, "made by tests/ref (scripts/test runs it)");
    if (!own_tok) {
        stories260k_paths(&mp, &tok);
        free(mp);
    }
    dsq_engine_opts_t o = {.model_path = model, .tokenizer_path = tok,
                           .kv_cache_memory_bytes = 4 << 20, .max_model_len = 64,
                           .block_size = 16, .spec_k = spec_k, .spec_max_batch = 16,
                           .spec_ngram_min = 1, .spec_fixed_len = true,
                           .step_budget_ms = -1};
    char err[256];
    dsq_engine_t *e = dsq_engine_create(&o, err, sizeof(err));
    if (!e)
        fail_msg("%s: %s", rel, err);
    dsq_sampling_t sp = {.max_tokens = TINY_OUT, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
    run_prompt_ids(e, &W, p[0], 12, n_p, &sp, out[0], TINY_OUT);
    wait_engine_idle(e);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    *accepted = st.spec_accepted_tokens_total;
    *drafted = st.spec_draft_tokens_total;
    dsq_engine_destroy(e);
    free(model);
    free(tok);
}

/* Greedy output with speculation equals greedy output without it on the
 * tiny models tests/ref makes, one per weight source and architecture the
 * engine loads: llama GGUF Q4_0 (vocabulary 256), GPTQ, qwen2 (HF), and
 * deepseek2 (MLA + MoE) V2-Lite, V3 and group-limited routing (GGUF Q8_0).
 * Their random weights seldom copy the context, so drafts are looked up
 * from single repeated tokens (n-gram min 1): every model scores drafts
 * (rejected ones are rolled back), and some are kept. */
static void test_tiny_models(void **state)
{
    (void)state;
    static const struct { const char *rel; bool own_tok; } models[] = {
        {"llama-tiny-gguf/llama-tiny.q4_0.gguf", false},
        {"gptq-tiny", false},
        {"qwen2-tiny", false},
        {"deepseek2-tiny-gguf/v2_lite.q8_0.gguf", true},
        {"deepseek2-tiny-gguf/v3.q8_0.gguf", true},
        {"deepseek2-tiny-gguf/v2_group.q8_0.gguf", true},
    };
    static const int32_t prompts[4][12] = {
        {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8},
        {40, 41, 42, 40, 41, 42, 40, 41, 42, 40, 41, 42},
        {9, 200, 13, 77, 120, 3, 250, 18, 64, 99, 31, 7},
        {100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100},
    };
    int64_t kept = 0;
    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); m++) {
        int32_t a[4][TINY_OUT], b[4][TINY_OUT];
        int64_t acc_a, acc_b, dr_a, dr_b;
        tiny_run(models[m].rel, models[m].own_tok, 0, prompts, 4, a, &acc_a, &dr_a);
        tiny_run(models[m].rel, models[m].own_tok, 4, prompts, 4, b, &acc_b, &dr_b);
        print_message("# %s: drafts scored %lld, kept %lld\n", models[m].rel, (long long)dr_b,
                      (long long)acc_b);
        for (int i = 0; i < 4; i++)
            if (memcmp(a[i], b[i], sizeof(a[i])))
                fail_msg("%s prompt %d: greedy ids differ with speculation", models[m].rel, i);
        assert_int_equal(acc_a + dr_a, 0);
        assert_true(dr_b > 0);
        kept += acc_b;
    }
    assert_true(kept > 0);
}

/* ------------------------------------------------------ distribution */

/* Upper quantile of chi-square with df degrees of freedom at z standard
 * deviations (Wilson & Hilferty 1931): df (1 - 2/(9df) + z sqrt(2/(9df)))^3;
 * z = 3.09 is p = 0.001. */
static double chi2_crit(int df, double z)
{
    double a = 2.0 / (9.0 * df), b = 1.0 - a + z * sqrt(a);
    return df * b * b * b;
}

#define DRAWS 1500
#define OUT 24                  /* output tokens of each draw */
/* a story the model tends to continue by repeating it (n-gram drafts) */
#define PROMPT "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had a"

/* DRAWS seeded samples (temperature 0.8) of OUT tokens of stories260K
 * continuing PROMPT, seeds seed0 + i, into out[i][0..OUT); the prompt's
 * ids into prompt[0..*n_prompt). */
static void draws(int spec_k, uint64_t seed0, int32_t (*out)[OUT], int32_t *prompt,
                  int *n_prompt, int64_t *accepted)
{
    char *model, *tok;
    stories260k_paths(&model, &tok);
    dsq_engine_opts_t o = {.model_path = model, .tokenizer_path = tok,
                           .kv_cache_memory_bytes = 8 << 20, .max_model_len = 64,
                           .block_size = 16, .spec_k = spec_k, .spec_max_batch = 16,
                           .spec_fixed_len = true, .step_budget_ms = -1};
    char err[256];
    dsq_engine_t *e = dsq_engine_create(&o, err, sizeof(err));
    if (!e)
        fail_msg("engine: %s", err);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(dsq_tokenizer_encode(dsq_engine_tokenizer(e), PROMPT, strlen(PROMPT),
                                          DSQ_TOK_PARSE_SPECIAL, &ids, &n_ids), 0);
    assert_true(n_ids > 0 && n_ids <= 40);
    memcpy(prompt, ids, n_ids * sizeof(*ids));
    *n_prompt = (int)n_ids;
    enum { AT_ONCE = 16 };
    dsq_req_t *live[AT_ONCE] = {0};
    int id[AT_ONCE], n_out[AT_ONCE], next = 0, done = 0;
    while (done < DRAWS) {
        for (int s = 0; s < AT_ONCE && next < DRAWS; s++) {
            if (live[s])
                continue;
            dsq_sampling_t sp = {.max_tokens = OUT, .temperature = 0.8f, .top_p = 1,
                                 .n = 1, .repetition_penalty = 1, .logprobs = -1,
                                 .ignore_eos = true, .has_seed = true,
                                 .seed = seed0 + (uint64_t)next};
            live[s] = req_submit_ids(e, &W, ids, (int)n_ids, &sp);
            id[s] = next++;
            n_out[s] = 0;
        }
        for (int s = 0; s < AT_ONCE; s++) {
            if (!live[s])
                continue;
            dsq_output_t ev;
            if (wait_next(&W, live[s], &ev) > 0) {
                for (int i = 0; i < ev.n_tokens && n_out[s] < OUT; i++)
                    out[id[s]][n_out[s]++] = ev.tokens[i];
                dsq_output_free(&ev);
                continue;
            }
            assert_int_equal(n_out[s], OUT);
            dsq_req_unref(live[s]);
            live[s] = NULL;
            done++;
        }
    }
    free(ids);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    *accepted = st.spec_accepted_tokens_total;
    dsq_engine_destroy(e);
    free(model);
    free(tok);
}

/* Chi-square statistic of homogeneity of two equal-sized samples given as
 * counts ca[i], cb[i] over n classes; classes with fewer than 10 draws in
 * both pooled into one. *df receives the degrees of freedom. */
static double chi2_two(const int *ca, const int *cb, int n, int *df)
{
    double x2 = 0;
    int k = 0, oa = 0, ob = 0;
    for (int t = 0; t <= n; t++) {
        if (t < n && ca[t] + cb[t] < 10) {
            oa += ca[t];
            ob += cb[t];
            continue;
        }
        int na = t < n ? ca[t] : oa, nb = t < n ? cb[t] : ob;
        if (na + nb == 0)
            continue;
        double ex = (na + nb) / 2.0;
        x2 += (na - ex) * (na - ex) / ex + (nb - ex) * (nb - ex) / ex;
        k++;
    }
    *df = k - 1;
    return x2;
}

/* Copy events of one draw: output positions whose token is the one the
 * n-gram lookup (defaults: suffixes of 4 down to 2 tokens) would have
 * drafted first there, the events speculation could bias. */
static int copies(const int32_t *prompt, int n_prompt, const int32_t *out)
{
    int32_t t[64], d[1];
    memcpy(t, prompt, (size_t)n_prompt * sizeof(*t));
    int c = 0;
    for (int j = 0; j < OUT; j++) {
        c += dsq_spec_ngram_propose(t, n_prompt + j, 2, 4, 1, d) == 1 && d[0] == out[j];
        t[n_prompt + j] = out[j];
    }
    return c;
}

/* Sampled speculative decoding draws from the distribution plain sampling
 * draws from, over independent seeds, in chi-square tests of homogeneity
 * at p = 0.001 each: the last token's distribution (drafts were kept
 * before it), and the distribution of copy events per draw (how often the
 * output took the token the lookup drafts, which a verification biased
 * towards drafts raises). The seeds are fixed, so the outcome is too (no
 * flaky test). Watched fail: a verification that added 1 to the drafted
 * token's logit (copy events 814 vs 1,175 of 36,000 positions, chi2 37.1
 * against 22.7). */
static void test_sampled_distribution(void **state)
{
    (void)state;
    static int32_t a[DRAWS][OUT], b[DRAWS][OUT];
    int32_t prompt[64];
    int n_prompt;
    int64_t acc_a, acc_b;
    draws(0, 1, a, prompt, &n_prompt, &acc_a);
    draws(4, 1000001, b, prompt, &n_prompt, &acc_b);
    assert_int_equal(acc_a, 0);
    enum { V = 512 };                /* stories260K's vocabulary */
    static int ca[V], cb[V], ka[OUT + 1], kb[OUT + 1];
    memset(ca, 0, sizeof(ca));
    memset(cb, 0, sizeof(cb));
    memset(ka, 0, sizeof(ka));
    memset(kb, 0, sizeof(kb));
    long sum_a = 0, sum_b = 0;
    for (int i = 0; i < DRAWS; i++) {
        assert_true(a[i][OUT - 1] >= 0 && a[i][OUT - 1] < V);
        assert_true(b[i][OUT - 1] >= 0 && b[i][OUT - 1] < V);
        ca[a[i][OUT - 1]]++;
        cb[b[i][OUT - 1]]++;
        int na = copies(prompt, n_prompt, a[i]), nb = copies(prompt, n_prompt, b[i]);
        ka[na]++;
        kb[nb]++;
        sum_a += na;
        sum_b += nb;
    }
    int df1, df2;
    double x1 = chi2_two(ca, cb, V, &df1), x2 = chi2_two(ka, kb, OUT + 1, &df2);
    double c1 = chi2_crit(df1, 3.09), c2 = chi2_crit(df2, 3.09);
    print_message("# last token: chi2=%.1f df=%d crit=%.1f; copy events: %ld vs %ld, chi2=%.1f "
                  "df=%d crit=%.1f; drafts kept %lld\n", x1, df1, c1, sum_a, sum_b, x2, df2,
                  c2, (long long)acc_b);
    assert_true(acc_b > DRAWS / 4);  /* drafts were kept, many times */
    assert_true(df1 >= 4 && df2 >= 4);
    assert_true(x1 < c1);
    assert_true(x2 < c2);
}

/* Options out of range are refused with a reason, not clamped. */
static void test_bad_options(void **state)
{
    (void)state;
    const struct { int k, lo, hi, batch; } bad[] = {
        {DSQ_SPEC_MAX_K + 1, 0, 0, 0}, {-1, 0, 0, 0}, {4, 5, 3, 0}, {4, 0, 0, -2}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dsq_engine_opts_t o = {.model_path = "unused.gguf", .spec_k = bad[i].k,
                               .spec_ngram_min = bad[i].lo, .spec_ngram_max = bad[i].hi,
                               .spec_max_batch = bad[i].batch};
        char err[256] = "";
        assert_null(dsq_engine_create(&o, err, sizeof(err)));
        assert_non_null(strstr(err, "speculative decoding"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_propose),
        cmocka_unit_test(test_draft_len),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_same_output),
        cmocka_unit_test(test_kv_after_many),
        cmocka_unit_test(test_sampled_distribution),
        cmocka_unit_test(test_tiny_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

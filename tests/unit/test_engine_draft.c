/* tests for speculative decoding with a draft model (engine/serve/draft.c
 * and its use in speculate.c), on the real SmolLM2-135M-Instruct in two
 * quantizations and on the tiny models tests/ref makes.
 *
 *  - a model drafting for itself: the output equals the output without
 *    speculation and every draft is kept. A draft is the draft model's
 *    greedy token, so with the same weights it is the token the target's
 *    greedy sampling picks, provided the draft's KV holds exactly the
 *    sequence's tokens (catch-up, the prefix kept after a rejection or a
 *    dropped draft, forks) and its rows compute what the target's do (the
 *    engine's batch invariance, test_engine.c): a wrong KV slot, a
 *    position off by one or a stale token shows up as a rejected draft.
 *    On SmolLM2 (its own tokenizer), stories260K (llama2.c, no tokenizer
 *    in the file: the target's is used), the tiny llama GGUF and the tiny
 *    DeepSeek-V2-Lite (MLA: a cache without V); and an AutoAWQ checkpoint
 *    made by dsq's quantizer (n-gram lookup too);
 *  - SmolLM2 Q8_0 with SmolLM2 Q4_1 as its draft: greedy, seeded
 *    sampling, n = 2, logprobs, penalties, a stop string, an opt-out and
 *    max_tokens inside a verification, all in one batch, give the output
 *    plain decoding gives, and most drafts are kept (the two quantizations
 *    mostly agree);
 *  - a draft cache too small for the sequences at once evicts states and
 *    still gives the same output; every draft block is free afterwards;
 *  - refusals: a draft of another vocabulary, a missing file, a draft
 *    model without a draft length;
 *  - the memory plan: the draft's line is taken from the KV budget, and
 *    holds at least its measured weights and its KV cache.
 * Engines propose all K drafts (spec_fixed_len): the SmolLM2 draft costs
 * about what its target does, so the adaptive length would switch it off,
 * and these are checks of correctness, not of the length policy. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/serve/engine.h"
#include "engine/common/error.h"
#include "engine/quantizer/quantizer.h"
#include "engine_test.h"
#include "test_common.h"

static waiter_t W = WAITER_INIT;

#define MAX_NEW 40

static char *smollm2(const char *file)
{
    char *p = path_join("DSQ_MODELS_DIR", "models", file);
    require_file_hint(p, "scripts/test fetches and makes it");
    return p;
}

static dsq_engine_t *engine_of(dsq_engine_opts_t *o)
{
    o->kv_cache_memory_bytes = o->kv_cache_memory_bytes ? o->kv_cache_memory_bytes : 64 << 20;
    o->max_model_len = o->max_model_len ? o->max_model_len : 512;
    o->block_size = 16;
    o->spec_max_batch = 16;
    o->spec_fixed_len = true;
    o->step_budget_ms = -1;
    char err[512];
    dsq_engine_t *e = dsq_engine_create(o, err, sizeof(err));
    if (!e)
        fail_msg("engine: %s", err);
    return e;
}

typedef struct out {
    int32_t tok[2][MAX_NEW];
    float lp[2][MAX_NEW];
    int n[2];
    char text[2048];
    size_t text_len;
    dsq_finish_t finish[2];
} out_t;

/* Read r's events into o until its end, or only the first one (first). */
static void collect_some(dsq_req_t *r, out_t *o, bool first)
{
    dsq_output_t ev;
    while (wait_next(&W, r, &ev) > 0) {
        int c = ev.index;
        assert_true(c >= 0 && c < 2);
        for (int i = 0; i < ev.n_tokens && o->n[c] < MAX_NEW; i++) {
            o->tok[c][o->n[c]] = ev.tokens[i];
            o->lp[c][o->n[c]] = ev.logprobs ? ev.logprobs[i] : 0;
            o->n[c]++;
        }
        if (c == 0 && o->text_len + ev.text_len < sizeof(o->text)) {
            memcpy(o->text + o->text_len, ev.text, ev.text_len);
            o->text_len += ev.text_len;
        }
        if (ev.finish != DSQ_FINISH_NONE)
            o->finish[c] = ev.finish;
        dsq_output_free(&ev);
        if (first)
            return;
    }
}

static void collect(dsq_req_t *r, out_t *o)
{
    memset(o, 0, sizeof(*o));
    collect_some(r, o, false);
}

static void expect_same(const out_t *a, const out_t *b, int n_req, const int *n_choices)
{
    for (int i = 0; i < n_req; i++)
        for (int c = 0; c < n_choices[i]; c++) {
            if (a[i].n[c] != b[i].n[c] ||
                memcmp(a[i].tok[c], b[i].tok[c], sizeof(int32_t) * (size_t)a[i].n[c]))
                fail_msg("request %d choice %d: %d tokens without a draft model, %d with, "
                         "or different ids", i, c, a[i].n[c], b[i].n[c]);
            assert_int_equal(a[i].finish[c], b[i].finish[c]);
            /* the same rows scored in a batch of another shape: equal up
             * to fp32 summation order */
            for (int t = 0; t < a[i].n[c]; t++)
                if (fabsf(a[i].lp[c][t] - b[i].lp[c][t]) > 1e-3f)
                    fail_msg("request %d token %d: logprob %g vs %g", i, t,
                             (double)a[i].lp[c][t], (double)b[i].lp[c][t]);
            if (c == 0) {
                assert_int_equal(a[i].text_len, b[i].text_len);
                assert_memory_equal(a[i].text, b[i].text, a[i].text_len);
            }
        }
}

/* ------------------------------------------------------ a model as its own draft */

#define TINY_OUT 24

/* Greedy ids of prompts p (all at once) on model/tok, with draft (NULL:
 * none) proposing 4; the stats after. */
static void greedy_run_k(const char *model, const char *tok, const char *draft, int k,
                         const int32_t (*p)[12], int n_p, int32_t (*out)[TINY_OUT],
                         dsq_engine_stats_t *st)
{
    dsq_engine_opts_t o = {.model_path = model, .tokenizer_path = tok,
                           .draft_model_path = draft, .spec_k = k, .spec_ngram_min = 1,
                           .kv_cache_memory_bytes = 4 << 20, .max_model_len = 64};
    dsq_engine_t *e = engine_of(&o);
    dsq_sampling_t sp = {.max_tokens = TINY_OUT, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
    run_prompt_ids(e, &W, p[0], 12, n_p, &sp, out[0], TINY_OUT);
    wait_engine_idle(e);
    dsq_engine_stats(e, st);
    dsq_engine_destroy(e);
}

/* greedy_run_k with 4 drafts from draft, or none without one */
static void greedy_run(const char *model, const char *tok, const char *draft,
                       const int32_t (*p)[12], int n_p, int32_t (*out)[TINY_OUT],
                       dsq_engine_stats_t *st)
{
    greedy_run_k(model, tok, draft, draft ? 4 : 0, p, n_p, out, st);
}

/* ids every vocabulary here holds (the smallest has 256) */
static const int32_t tiny_prompts[4][12] = {
    {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8},
    {40, 41, 42, 40, 41, 42, 40, 41, 42, 40, 41, 42},
    {9, 200, 13, 77, 120, 3, 250, 18, 64, 99, 31, 7},
    {100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111},
};

/* An AutoAWQ checkpoint (stories260K quantised by dsq's own quantizer,
 * RTN, group 32, into a temporary directory): greedy output with n-gram
 * lookup and with the checkpoint drafting for itself equals the output
 * without speculation, and a self-draft keeps every draft. */
static void test_awq(void **state)
{
    (void)state;
    char *model, *tok;
    stories260k_paths(&model, &tok);
    char tmpl[] = "/tmp/dsq-draft-awq-XXXXXX", dir[300], p[400], err[1024] = "";
    assert_non_null(mkdtemp(tmpl));
    snprintf(dir, sizeof(dir), "%s/awq", tmpl);
    dsq_qrun_opts_t qo = {.model = model, .out_dir = dir, .method = "rtn", .format = "awq",
                          .group_size = 32, .quiet = true};
    if (dsq_quantizer_run(&qo, err, sizeof(err)))
        fail_msg("quantizer: %s", err);
    snprintf(p, sizeof(p), "%s/tok512.bin", dir);
    int32_t a[4][TINY_OUT], b[4][TINY_OUT], c[4][TINY_OUT];
    dsq_engine_stats_t sa, sb, sc;
    greedy_run(dir, p, NULL, tiny_prompts, 4, a, &sa);
    greedy_run_k(dir, p, NULL, 4, tiny_prompts, 4, b, &sb);       /* n-gram */
    greedy_run(dir, p, dir, tiny_prompts, 4, c, &sc);               /* itself */
    print_message("# AWQ stories260K: n-gram drafts %lld kept %lld; self-draft %lld kept %lld\n",
                  (long long)sb.spec_draft_tokens_total, (long long)sb.spec_accepted_tokens_total,
                  (long long)sc.spec_draft_tokens_total, (long long)sc.spec_accepted_tokens_total);
    const char *files[] = {"model.safetensors", "config.json", "tok512.bin"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
    rmdir(tmpl);
    free(model);
    free(tok);
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_equal(a, c, sizeof(a));
    assert_true(sb.spec_draft_tokens_total > 0);
    assert_true(sc.spec_draft_tokens_total > 0);
    assert_int_equal(sc.spec_accepted_tokens_total, sc.spec_draft_tokens_total);
}

static void test_self_draft(void **state)
{
    (void)state;
    char *sm = smollm2("SmolLM2-135M-Instruct.Q4_1.gguf"), *st_model, *st_tok;
    stories260k_paths(&st_model, &st_tok);
    char *llama = path_join("DSQ_MODELS_DIR", "models", "llama-tiny-gguf/llama-tiny.q4_0.gguf");
    char *ds2 = path_join("DSQ_MODELS_DIR", "models", "deepseek2-tiny-gguf/v2_lite.q8_0.gguf");
    require_file_hint(llama, "made by tests/ref (scripts/test runs it)");
    require_file_hint(ds2, "made by tests/ref (scripts/test runs it)");
    const struct { const char *name, *model, *tok; } models[] = {
        {"SmolLM2 Q4_1", sm, NULL},
        {"stories260K", st_model, st_tok},
        {"llama-tiny", llama, st_tok},
        {"deepseek2 v2_lite", ds2, NULL},
    };
    for (size_t m = 0; m < sizeof(models) / sizeof(models[0]); m++) {
        int32_t a[4][TINY_OUT], b[4][TINY_OUT];
        dsq_engine_stats_t sa, sb;
        greedy_run(models[m].model, models[m].tok, NULL, tiny_prompts, 4, a, &sa);
        greedy_run(models[m].model, models[m].tok, models[m].model, tiny_prompts, 4, b, &sb);
        print_message("# %s drafting for itself: drafts %lld, kept %lld, draft tokens "
                      "computed %lld\n", models[m].name, (long long)sb.spec_draft_tokens_total,
                      (long long)sb.spec_accepted_tokens_total, (long long)sb.draft_tokens_total);
        for (int i = 0; i < 4; i++)
            if (memcmp(a[i], b[i], sizeof(a[i])))
                fail_msg("%s prompt %d: greedy ids differ with a draft model", models[m].name,
                         i);
        assert_int_equal(sa.spec_draft_tokens_total, 0);
        assert_int_equal(sa.draft_weight_bytes, 0);
        assert_true(sb.spec_draft_tokens_total > 0);
        assert_int_equal(sb.spec_accepted_tokens_total, sb.spec_draft_tokens_total);
        assert_true(sb.draft_weight_bytes > 0);
        assert_int_equal(sb.draft_kv_free, sb.draft_kv_blocks);
    }
    free(sm);
    free(st_model);
    free(st_tok);
    free(llama);
    free(ds2);
}

/* A long prompt beside short ones: the draft reads the long one over
 * several steps (one pass of 256 tokens a step, the short sequences' few
 * tokens first), the short ones draft meanwhile, and every draft is still
 * the model's own greedy token. At this length (~800 tokens) a decode row
 * splits its context into parts (kernels/cpu/attention.c row_parts), and
 * the verification rows must get the same parts: before they did (they
 * were walked whole, as prefill tiles), logprobs came out a few
 * hundredths of a nat apart and drafts were rejected. The short ones come
 * once the long prompt's first token is out, so its prefill is one chunk
 * in both runs (prefill tiles walk a long context whole: prompt scoring
 * is not decode's bits there). */
static void test_long_prompt(void **state)
{
    (void)state;
    char *sm = smollm2("SmolLM2-135M-Instruct.Q4_1.gguf");
    char longp[8192];
    size_t n = 0;
    for (int i = 0; i < 60 && n + 120 < sizeof(longp); i++)
        n += (size_t)snprintf(longp + n, sizeof(longp) - n, "Line %d: the river runs past "
                              "the mill and the bridge. ", i);
    const char *texts[3] = {longp, "The first month of the year is", "def square(x):\n"};
    out_t res[2][3];
    dsq_engine_stats_t st;
    for (int pass = 0; pass < 2; pass++) {
        dsq_engine_opts_t o = {.model_path = sm, .draft_model_path = pass ? sm : NULL,
                               .spec_k = pass ? 4 : 0, .max_model_len = 1024};
        dsq_engine_t *e = engine_of(&o);
        dsq_req_t *rs[3];
        dsq_sampling_t sp = {.max_tokens = MAX_NEW, .temperature = 0, .top_p = 1, .n = 1,
                             .repetition_penalty = 1, .logprobs = 0, .ignore_eos = true};
        rs[0] = req_submit_text(e, &W, texts[0], &sp);
        memset(&res[pass][0], 0, sizeof(res[pass][0]));
        collect_some(rs[0], &res[pass][0], true);
        for (int i = 1; i < 3; i++)
            rs[i] = req_submit_text(e, &W, texts[i], &sp);
        for (int i = 0; i < 3; i++) {
            if (i)
                collect(rs[i], &res[pass][i]);
            else
                collect_some(rs[0], &res[pass][0], false);
            dsq_req_unref(rs[i]);
        }
        wait_engine_idle(e);
        dsq_engine_stats(e, &st);
        dsq_engine_destroy(e);
    }
    int nc[3] = {1, 1, 1};
    expect_same(res[0], res[1], 3, nc);
    print_message("# long prompt: drafts %lld, kept %lld, draft tokens computed %lld\n",
                  (long long)st.spec_draft_tokens_total, (long long)st.spec_accepted_tokens_total,
                  (long long)st.draft_tokens_total);
    assert_true(st.spec_draft_tokens_total > 0);
    assert_int_equal(st.spec_accepted_tokens_total, st.spec_draft_tokens_total);
    assert_int_equal(st.draft_kv_free, st.draft_kv_blocks);
    free(sm);
}

/* ------------------------------------------------------ SmolLM2 Q8_0 + Q4_1 */

#define N_REQ 8
static const char *const prompts[N_REQ] = {
    "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n\ndef mul(a, b):\n",
    "<|im_start|>user\nRepeat exactly: the cat sat on the mat by the door.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "The tallest mountain in the world is",
    "Once upon a time, a little robot",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    "Monday, Tuesday, Wednesday,",
    "The recipe needs flour, sugar and",
};

static const char *const STOPS[] = {"return"};

static dsq_sampling_t sampling_of(int i)
{
    dsq_sampling_t sp = {.max_tokens = MAX_NEW, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = 0, .ignore_eos = true};
    switch (i) {
    case 0:
        sp.n_stop = 1;
        sp.stop = STOPS;
        break;
    case 1:
        sp.logprobs = 2;
        break;
    case 2:
        sp.temperature = 0.7f;
        sp.has_seed = true;
        sp.seed = 77;
        break;
    case 3:
        sp.temperature = 1.0f;
        sp.top_k = 30;
        sp.top_p = 0.9f;
        sp.has_seed = true;
        sp.seed = 5;
        sp.n = 2;
        break;
    case 4:
        sp.repetition_penalty = 1.2f;
        sp.frequency_penalty = 0.4f;
        break;
    case 5:
        sp.no_speculation = true;
        break;
    case 6:
        sp.max_tokens = 3;
        break;
    default:
        break;
    }
    return sp;
}

static void run_mix(dsq_engine_t *e, out_t *res, int n_req)
{
    dsq_req_t *rs[N_REQ];
    for (int i = 0; i < n_req; i++) {
        dsq_sampling_t sp = sampling_of(i);
        rs[i] = req_submit_text(e, &W, prompts[i], &sp);
    }
    for (int i = 0; i < n_req; i++) {
        collect(rs[i], &res[i]);
        dsq_req_unref(rs[i]);
    }
}

static out_t plain[N_REQ], drafted[N_REQ];

static void test_q8_with_q4_draft(void **state)
{
    (void)state;
    char *target = smollm2("smollm2-quants/SmolLM2-135M-Instruct.Q8_0.gguf");
    char *draft = smollm2("SmolLM2-135M-Instruct.Q4_1.gguf");
    int nc[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        nc[i] = sampling_of(i).n;
    dsq_engine_opts_t o = {.model_path = target};
    dsq_engine_t *e = engine_of(&o);
    run_mix(e, plain, N_REQ);
    dsq_engine_destroy(e);

    o = (dsq_engine_opts_t){.model_path = target, .draft_model_path = draft, .spec_k = 4};
    e = engine_of(&o);
    run_mix(e, drafted, N_REQ);
    wait_engine_idle(e);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    dsq_engine_destroy(e);
    expect_same(plain, drafted, N_REQ, nc);
    assert_int_equal(drafted[6].n[0], 3);
    assert_int_equal(drafted[0].finish[0], DSQ_FINISH_STOP);
    print_message("# Q8_0 with a Q4_1 draft: drafts %lld, kept %lld, per position %lld %lld "
                  "%lld %lld\n", (long long)st.spec_draft_tokens_total,
                  (long long)st.spec_accepted_tokens_total,
                  (long long)st.spec_accepted_per_pos[0], (long long)st.spec_accepted_per_pos[1],
                  (long long)st.spec_accepted_per_pos[2], (long long)st.spec_accepted_per_pos[3]);
    assert_int_equal(st.spec_k, 4);
    assert_true(st.spec_draft_tokens_total > 0);
    /* the two quantizations of one model agree on many tokens (fewer
     * under temperature: a draft is the draft's greedy token) */
    assert_true(st.spec_accepted_tokens_total > st.spec_draft_tokens_total / 4);
    assert_int_equal(st.draft_kv_free, st.draft_kv_blocks);
    assert_int_equal(st.kv_blocks_used, 0);

    /* a draft cache of 8 blocks holds one of these sequences (about 60
     * tokens each, plus the drafts) at a time: the states evict each
     * other, some steps go without drafts, the output does not change */
    o = (dsq_engine_opts_t){.model_path = target, .draft_model_path = draft, .spec_k = 4,
                            .draft_kv_tokens = 128};
    e = engine_of(&o);
    run_mix(e, drafted, N_REQ);
    wait_engine_idle(e);
    dsq_engine_stats(e, &st);
    dsq_engine_destroy(e);
    expect_same(plain, drafted, N_REQ, nc);
    print_message("# 8-block draft cache: evictions %lld, drafts %lld\n",
                  (long long)st.draft_evictions_total, (long long)st.spec_draft_tokens_total);
    assert_int_equal(st.draft_kv_blocks, 8);
    assert_true(st.draft_evictions_total > 0);
    assert_true(st.spec_draft_tokens_total > 0);
    assert_int_equal(st.draft_kv_free, st.draft_kv_blocks);
    free(target);
    free(draft);
}

/* greedy, 4 to 16 tokens */
static dsq_sampling_t greedy_short(int k)
{
    return (dsq_sampling_t){.max_tokens = 4 + k % 13, .temperature = 0, .top_p = 1, .n = 1,
                            .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
}

/* 400 requests on stories260K drafting for itself, 8 at a time, every
 * third cancelled after its first event, a small KV cache (which preempts
 * now and then, timing allowing) and a draft cache of 6 blocks that
 * evicts: every block of both caches comes back, and every draft is still
 * kept. */
static void test_many_with_cancels(void **state)
{
    (void)state;
    char *model, *tok;
    stories260k_paths(&model, &tok);
    dsq_engine_opts_t o = {.model_path = model, .tokenizer_path = tok,
                           .draft_model_path = model, .spec_k = 4, .draft_kv_tokens = 96,
                           .kv_cache_memory_bytes = 120 << 10, .max_model_len = 128};
    dsq_engine_t *e = engine_of(&o);
    run_with_cancels(e, &W, 400, prompts, N_REQ, greedy_short);
    wait_engine_idle(e);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    dsq_engine_destroy(e);
    print_message("# 400 requests: drafts %lld kept %lld, preemptions %lld, draft evictions "
                  "%lld\n", (long long)st.spec_draft_tokens_total,
                  (long long)st.spec_accepted_tokens_total, (long long)st.preemptions_total,
                  (long long)st.draft_evictions_total);
    free(model);
    free(tok);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.draft_kv_free, st.draft_kv_blocks);
    assert_true(st.draft_evictions_total > 0);
    assert_true(st.spec_draft_tokens_total > 100);
    assert_int_equal(st.spec_accepted_tokens_total, st.spec_draft_tokens_total);
}

/* ------------------------------------------------------ refusals, plan */

static void test_refused(void **state)
{
    (void)state;
    char *sm = smollm2("SmolLM2-135M-Instruct.Q4_1.gguf"), *st_model, *st_tok;
    stories260k_paths(&st_model, &st_tok);
    struct { const char *draft; int k; const char *says; } cases[] = {
        {st_model, 4, "vocabulary has 512 tokens"},    /* another tokenizer */
        {"no/such/draft.gguf", 4, "--draft-model"},
        {sm, 0, "needs a draft length"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dsq_engine_opts_t o = {.model_path = sm, .draft_model_path = cases[i].draft,
                               .spec_k = cases[i].k, .kv_cache_memory_bytes = 16 << 20,
                               .max_model_len = 256};
        char err[512] = "";
        dsq_engine_t *e = dsq_engine_create(&o, err, sizeof(err));
        if (e)
            fail_msg("case %zu: a draft model was taken", i);
        if (!strstr(err, cases[i].says))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, cases[i].says);
        assert_null(strchr(err, '\n'));
    }
    free(sm);
    free(st_model);
    free(st_tok);
}

static json_int_t plan_num(const dsq_engine_opts_t *o, const char *key)
{
    char *out = NULL, err[512];
    int rc = dsq_engine_plan(o, true, &out, err, sizeof(err));
    if (rc)
        fail_msg("plan: %s", err);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    json_t *v = json_object_get(j, key);
    assert_true(json_is_number(v));
    json_int_t n = (json_int_t)json_number_value(v);
    json_decref(j);
    free(out);
    return n;
}

static void test_plan(void **state)
{
    (void)state;
    char *target = smollm2("smollm2-quants/SmolLM2-135M-Instruct.Q8_0.gguf");
    char *draft = smollm2("SmolLM2-135M-Instruct.Q4_1.gguf");
    /* a fixed budget below the KV caps: the KV cache gets what is left;
     * n-gram speculation first, whose draft rows the workspace holds too */
    dsq_engine_opts_t o = {.model_path = target, .memory_limit_bytes = (int64_t)1 << 30,
                           .max_model_len = 512, .spec_max_batch = 4, .spec_k = 4};
    json_int_t kv0 = plan_num(&o, "kv_budget_bytes");
    assert_int_equal(plan_num(&o, "draft_bytes"), 0);
    o.draft_model_path = draft;
    json_int_t kv1 = plan_num(&o, "kv_budget_bytes"), db = plan_num(&o, "draft_bytes");
    assert_int_equal(kv0 - kv1, db);
    /* at least the draft's resident weights (measured after loading) and
     * its cache: 4 sequences x (512 + 16) tokens x SmolLM2's 30 layers x
     * K and V x 3 heads x 64 x 2 bytes (fp16) */
    o.kv_cache_memory_bytes = 16 << 20;
    o.memory_limit_bytes = 0;
    dsq_engine_t *e = dsq_engine_create(&o, (char[512]){0}, 512);
    assert_non_null(e);
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    dsq_engine_destroy(e);
    int64_t kv = 4LL * (512 + 16) * 30 * 2 * 3 * 64 * 2;
    print_message("# draft line %lld bytes: weights %lld, KV %lld\n", (long long)db,
                  (long long)st.draft_weight_bytes, (long long)kv);
    assert_true(st.draft_weight_bytes > 0);
    assert_true(db >= st.draft_weight_bytes + kv);
    assert_true(st.draft_kv_blocks * 16 >= 4 * (512 + 16));
    free(target);
    free(draft);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_self_draft),
        cmocka_unit_test(test_awq),
        cmocka_unit_test(test_long_prompt),
        cmocka_unit_test(test_q8_with_q4_draft),
        cmocka_unit_test(test_many_with_cancels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

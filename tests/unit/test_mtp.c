/* tests for DeepSeek-V3's multi-token prediction module
 * (engine/model/model_deepseek2.c ds2_mtp_forward) and its use as a
 * speculative proposer (engine/serve/speculate.c dsq__spec_mtp):
 *
 *  - the module's logits at every position of v3's prompt and greedy
 *    continuation against tests/golden/deepseek2_tiny_v3_mtp_logits.txt,
 *    made by tests/ref/make_deepseek2_tiny.py from transformers'
 *    DeepseekV3DecoderLayer and RMSNorm wired as vLLM's deepseek_mtp.py
 *    (an FP32 reference: |d| <= 1e-4 max(1, |ref|)), with the 32 rows in
 *    one pass and in two chunks (the second reads the module's own KV of
 *    the first);
 *  - loading it changes nothing of the main model (v3's golden logits), it
 *    is loaded only when asked, and the memory plan counts its weights
 *    exactly and its KV layer;
 *  - in the engine (--speculative-mtp): greedy and seeded output equal the
 *    output without it, drafts are scored, every KV block comes back; a
 *    model without the module is refused with a reason.
 * The tiny model's weights are random, so its drafts are seldom right:
 * these are checks of the wiring and the numbers, not of acceptance. */
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
#include "engine/serve/planner.h"
#include "ds2_tiny.h"
#include "engine_test.h"

static waiter_t W = WAITER_INIT;

#define T_IDS 32

typedef struct mtp_golden {
    int32_t ids[MAX_IDS];
    int n_ids;
    float *logits;        /* [n_ids - 1][N_VOCAB] */
} mtp_golden_t;

static void mtp_golden_read(mtp_golden_t *g)
{
    char *path = path_join("DSQ_SOURCE_ROOT", ".",
                           "tests/golden/deepseek2_tiny_v3_mtp_logits.txt");
    require_file_hint(path, DS2_TINY_HINT);
    FILE *f = fopen(path, "r");
    static char line[1 << 16];
    int rows = 0;
    memset(g, 0, sizeof(*g));
    g->logits = calloc(MAX_IDS * N_VOCAB, sizeof(float));
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "ids:", 4) == 0) {
            g->n_ids = parse_ids(line + 4, g->ids, MAX_IDS);
        } else if (strncmp(line, "mtp_logits:", 11) == 0) {
            char *s = line + 11, *end;
            int p = (int)strtol(s, &end, 10);
            assert_true(p >= 0 && p < MAX_IDS);
            s = end;
            for (int i = 0; i < N_VOCAB; i++) {
                g->logits[(size_t)p * N_VOCAB + i] = strtof(s, &end);
                assert_true(end != s);
                s = end;
            }
            rows++;
        }
    }
    fclose(f);
    free(path);
    assert_int_equal(g->n_ids, T_IDS);
    assert_int_equal(rows, T_IDS - 1);
}

typedef struct mrun {
    dsq_model_file_t *file;
    dsq_model_t *model;
    dsq_kv_cache_t *kv;
    dsq_block_table_t bt;
} mrun_t;

static void mrun_open(mrun_t *r, const char *variant, bool mtp, dsq_kv_dtype_t kvt)
{
    char rel[96], err[512];
    snprintf(rel, sizeof(rel), "deepseek2-tiny/%s", variant);
    char *dir = path_join("DSQ_MODELS_DIR", "models", rel);
    memset(r, 0, sizeof(*r));
    r->file = dsq_model_file_open(dir, NULL, err, sizeof(err));
    if (!r->file)
        fail_msg("open %s: %s (%s)", dir, err, DS2_TINY_HINT);
    dsq_model_opts_t mo = {.mtp = mtp};
    r->model = dsq_model_create(r->file, &mo, err, sizeof(err));
    if (!r->model)
        fail_msg("model %s: %s", dir, err);
    int nkv, hd;
    bool has_v;
    dsq_model_kv_shape(r->model, &nkv, &hd, &has_v);
    r->kv = dsq_kv_create_ex(dsq_model_kv_layers(r->model), nkv, hd, 4, 64, kvt, has_v, err,
                             sizeof(err));
    assert_non_null(r->kv);
    dsq_block_table_init(&r->bt);
    free(dir);
}

static void mrun_close(mrun_t *r)
{
    dsq_kv_seq_free(r->kv, &r->bt);
    dsq_block_table_deinit(&r->bt);
    dsq_kv_destroy(r->kv);
    dsq_model_destroy(r->model);
    dsq_model_file_close(r->file);
}

/* Rows [a, b) of ids: the main forward (logits of every row into main,
 * when not NULL), then the module over the same positions with the next
 * tokens and the hidden states just computed (logits into mtp). */
static void run_rows(mrun_t *r, const int32_t *ids, int a, int b, float *main, float *mtp)
{
    const int n = b - a;
    assert_int_equal(dsq_kv_seq_reserve(r->kv, &r->bt, b), DSQ_OK);
    int32_t pos[MAX_IDS], rs[MAX_IDS], slot[MAX_IDS], rows[MAX_IDS];
    for (int i = 0; i < n; i++) {
        pos[i] = a + i;
        rs[i] = 0;
        slot[i] = dsq_kv_slot(r->kv, &r->bt, a + i);
        rows[i] = i;
    }
    dsq_batch_t bm = {.n_tokens = n, .tokens = ids + a, .pos = pos, .row_seq = rs,
                      .slot = slot, .n_seqs = 1, .block_tables = r->bt.ids,
                      .max_blocks = r->bt.n, .n_logits = main ? n : 0, .logit_rows = rows};
    assert_int_equal(dsq_model_forward(r->model, r->kv, &bm, main), DSQ_OK);
    int n_hid = 0;
    const float *hid = dsq_model_hidden(r->model, &n_hid);
    assert_non_null(hid);
    assert_int_equal(n_hid, n);
    /* the module's rows: every position with a next token, reading the
     * model's own hidden buffer in place */
    int m = b < T_IDS ? n : n - 1;
    dsq_batch_t bt = bm;
    bt.n_tokens = m;
    bt.tokens = ids + a + 1;
    bt.n_logits = m;
    assert_int_equal(dsq_model_mtp_forward(r->model, r->kv, &bt, hid, mtp), DSQ_OK);
    int n_after = 0;
    assert_null(dsq_model_hidden(r->model, &n_after));     /* spent by the module */
}

static double worst_rel(const float *a, const float *ref, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / fmax(1.0, fabs((double)ref[i]));
        w = d > w ? d : w;
    }
    return w;
}

static void test_module_golden(void **state)
{
    (void)state;
    mtp_golden_t g;
    mtp_golden_read(&g);
    golden_t main_g;
    golden_read(&main_g, "v3");
    const size_t nl = (size_t)(T_IDS - 1) * N_VOCAB;
    float *main = malloc((size_t)T_IDS * N_VOCAB * sizeof(float));
    float *lg = malloc(nl * sizeof(float));
    for (int chunks = 1; chunks <= 2; chunks++) {
        mrun_t r;
        mrun_open(&r, "v3_mtp", true, DSQ_KV_F32);
        assert_int_equal(dsq_model_n_mtp(r.model), 1);
        assert_int_equal(dsq_model_kv_layers(r.model), 4);
        if (chunks == 1) {
            run_rows(&r, g.ids, 0, T_IDS, main, lg);
        } else {
            run_rows(&r, g.ids, 0, 16, main, lg);
            run_rows(&r, g.ids, 16, T_IDS, main + 16 * N_VOCAB, lg + 16 * N_VOCAB);
        }
        double wm = worst_rel(main, main_g.logits, (size_t)16 * N_VOCAB);
        double w = worst_rel(lg, g.logits, nl);
        print_message("# MTP module, %d pass(es): %zu logits, max |d|/max(1,|ref|) = %.2e; "
                      "main model's prompt logits %.2e (tol 1e-4)\n", chunks, nl, w, wm);
        assert_true(w <= 1e-4);
        assert_true(wm <= 1e-4);
        mrun_close(&r);
    }
    /* not asked: not loaded, and the cache has the model's layers only;
     * asked of a model without one: none */
    mrun_t r;
    mrun_open(&r, "v3_mtp", false, DSQ_KV_F32);
    assert_int_equal(dsq_model_n_mtp(r.model), 0);
    assert_int_equal(dsq_model_kv_layers(r.model), 3);
    assert_int_equal(dsq_model_mtp_forward(r.model, r.kv, &(dsq_batch_t){0}, NULL, NULL),
                     DSQ_EUNSUPPORTED);
    mrun_close(&r);
    mrun_open(&r, "v3", true, DSQ_KV_F32);
    assert_int_equal(dsq_model_n_mtp(r.model), 0);
    mrun_close(&r);
    free(main);
    free(lg);
    free(g.logits);
    free(main_g.logits);
}

/* The plan counts the module's weights (exactly what the load allocates
 * and maps) and its KV layer only when it is loaded. */
static void test_plan(void **state)
{
    (void)state;
    for (int q = 0; q < 2; q++) {
        for (int mtp = 0; mtp < 2; mtp++) {
            mrun_t r;
            char err[512];
            char *dir = path_join("DSQ_MODELS_DIR", "models", "deepseek2-tiny/v3_mtp");
            memset(&r, 0, sizeof(r));
            r.file = dsq_model_file_open(dir, NULL, err, sizeof(err));
            assert_non_null(r.file);
            dsq_model_opts_t mo = {.mtp = mtp, .quantize = q ? "int4" : NULL};
            r.model = dsq_model_create(r.file, &mo, err, sizeof(err));
            assert_non_null(r.model);
            int n_t = dsq_model_file_n_tensors(r.file);
            const dsq_tensor_t **tv = calloc((size_t)n_t, sizeof(*tv));
            for (int i = 0; i < n_t; i++)
                tv[i] = dsq_model_file_tensor(r.file, i);
            dsq_plan_opts_t po = {.mtp = mtp, .quantize = q ? "int4" : NULL,
                                  .kv_dtype = DSQ_KV_F16, .budget_bytes = 1 << 30,
                                  .host_x8 = dsq_cpu_has_x8(DSQ_ACT_INT8)};
            dsq_plan_t p;
            assert_int_equal(dsq_plan_compute(dsq_model_file_config(r.file), tv, n_t, &po, &p,
                                              err, sizeof(err)), DSQ_OK);
            print_message("# %s, module %s: planned %lld, loaded %zu bytes; KV %lld bytes a "
                          "token\n", q ? "int4" : "fp32", mtp ? "on" : "off",
                          (long long)p.weight_bytes, dsq_model_weight_bytes(r.model),
                          (long long)p.kv_bytes_per_token);
            assert_int_equal(p.weight_bytes, (int64_t)dsq_model_weight_bytes(r.model));
            /* (kv_lora_rank 32 + rope 8) fp16 values a layer */
            assert_int_equal(p.kv_bytes_per_token, (3 + mtp) * 40 * 2);
            free(tv);
            free(dir);
            dsq_model_destroy(r.model);
            dsq_model_file_close(r.file);
        }
    }
}

/* ------------------------------------------------------ the engine */

#define OUT 24

static dsq_engine_t *engine(const char *variant, bool mtp, char *err, size_t err_len)
{
    char rel[96];
    snprintf(rel, sizeof(rel), "deepseek2-tiny/%s", variant);
    char *dir = path_join("DSQ_MODELS_DIR", "models", rel), *model, *tok;
    stories260k_paths(&model, &tok);    /* the tiny models' 512 ids, a tokenizer */
    dsq_engine_opts_t o = {.model_path = dir, .tokenizer_path = tok,
                           .kv_cache_memory_bytes = 4 << 20, .max_model_len = 64,
                           .block_size = 16, .spec_mtp = mtp, .spec_max_batch = 16,
                           .spec_fixed_len = true, .step_budget_ms = -1};
    dsq_engine_t *e = dsq_engine_create(&o, err, err_len);
    free(dir);
    free(model);
    free(tok);
    return e;
}

static void run(bool mtp, int32_t (*out)[OUT], dsq_engine_stats_t *st)
{
    static const int32_t prompts[4][12] = {
        {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8},
        {1, 17, 300, 42, 511, 0, 256, 99, 7, 128, 64, 450},
        {9, 200, 13, 77, 120, 3, 250, 18, 64, 99, 31, 7},
        {100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111},
    };
    char err[512];
    dsq_engine_t *e = engine("v3_mtp", mtp, err, sizeof(err));
    if (!e)
        fail_msg("engine: %s", err);
    dsq_req_t *rs[4];
    for (int i = 0; i < 4; i++) {
        /* two greedy, two seeded samples */
        dsq_sampling_t sp = {.max_tokens = OUT, .temperature = i < 2 ? 0 : 0.9f, .top_p = 1,
                             .n = 1, .repetition_penalty = 1, .logprobs = -1,
                             .ignore_eos = true, .has_seed = i >= 2, .seed = 11u * i};
        rs[i] = req_submit_ids(e, &W, prompts[i], 12, &sp);
    }
    for (int i = 0; i < 4; i++) {
        dsq_output_t ev;
        int n = 0;
        while (wait_next(&W, rs[i], &ev) > 0) {
            for (int t = 0; t < ev.n_tokens && n < OUT; t++)
                out[i][n++] = ev.tokens[t];
            dsq_output_free(&ev);
        }
        assert_int_equal(n, OUT);
        dsq_req_unref(rs[i]);
    }
    wait_engine_idle(e);
    dsq_engine_stats(e, st);
    dsq_engine_destroy(e);
}

static void test_engine(void **state)
{
    (void)state;
    int32_t a[4][OUT], b[4][OUT];
    dsq_engine_stats_t sa, sb;
    run(false, a, &sa);
    run(true, b, &sb);
    for (int i = 0; i < 4; i++)
        if (memcmp(a[i], b[i], sizeof(a[i])))
            fail_msg("request %d: ids differ with the MTP module drafting", i);
    print_message("# MTP drafts scored %lld, kept %lld\n",
                  (long long)sb.spec_draft_tokens_total, (long long)sb.spec_accepted_tokens_total);
    assert_int_equal(sa.spec_draft_tokens_total, 0);
    assert_int_equal(sb.spec_k, 1);
    assert_true(sb.spec_draft_tokens_total > 0);
    /* a random module seldom guesses right (about 1 in 512); while it
     * never does, every decode step of every request has its draft ready:
     * OUT tokens are 1 from the prompt's step and OUT - 1 steps, all but
     * the last of which may draft (max_tokens) */
    if (sb.spec_accepted_tokens_total == 0)
        assert_int_equal(sb.spec_draft_tokens_total, 4 * (OUT - 2));
    assert_int_equal(sb.kv_blocks_used, 0);

    char err[512] = "";
    assert_null(engine("v3", true, err, sizeof(err)));
    if (!strstr(err, "no multi-token prediction module"))
        fail_msg("refusal says \"%s\"", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_module_golden),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_engine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

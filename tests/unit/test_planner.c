/* tests for engine/serve/planner.c.
 *
 * KV bytes per token of the real configs in $DSQ_TEST_DATA/configs/hf/
 * against values derived by hand (derivations inline), the plan arithmetic
 * (blocks, tokens, concurrent sequences), the config-only weight estimate,
 * and the exact weight prediction for SmolLM2 against the bytes the model
 * actually builds (dsq_model_weight_bytes). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/io/model_config.h"
#include "engine/serve/planner.h"

static void load_cfg(const char *dir, dsq_model_config_t *c)
{
    const char *root = getenv("DSQ_TEST_DATA");
    char path[1024], err[256];
    snprintf(path, sizeof(path), "%s/configs/hf/%s/config.json", root ? root : "tests/data",
             dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("required test file missing: %s", path);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    if (dsq_model_config_from_hf_json(buf, n, c, err, sizeof(err)) != 0)
        fail_msg("%s: %s", path, err);
}

static void test_kv_bytes_per_token(void **state)
{
    (void)state;
    struct { const char *dir; int64_t want; const char *why; } cases[] = {
        /* 2 (K,V) x 24 layers x 16 kv heads x 128 (2048/16) x 2 bytes */
        {"deepseek-coder-1.3b-instruct", 2 * 24 * 16 * 128 * 2, "196,608"},
        /* 2 x 32 x 32 x 128 (4096/32) x 2 */
        {"deepseek-coder-6.7b-instruct", 2 * 32 * 32 * 128 * 2, "524,288"},
        /* 2 x 30 x 32 x 128 x 2 */
        {"deepseek-llm-7b-chat", 2 * 30 * 32 * 128 * 2, "491,520"},
        /* MLA: 27 layers x (512 latent + 64 rope key) x 2 bytes */
        {"DeepSeek-V2-Lite-Chat", 27 * (512 + 64) * 2, "31,104"},
        /* 2 x 28 x 2 kv heads x 128 (1536/12) x 2 */
        {"DeepSeek-R1-Distill-Qwen-1.5B", 2 * 28 * 2 * 128 * 2, "28,672"},
        /* 2 x 28 x 4 kv heads x 128 (3584/28) x 2 */
        {"DeepSeek-R1-Distill-Qwen-7B", 2 * 28 * 4 * 128 * 2, "57,344"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dsq_model_config_t c;
        load_cfg(cases[i].dir, &c);
        int64_t got = dsq_plan_kv_bytes_per_token(&c, DSQ_KV_F16);
        print_message("# %-32s kv bytes/token %lld (want %s)\n", cases[i].dir, (long long)got,
                      cases[i].why);
        assert_int_equal(got, cases[i].want);
    }
    /* INT8 KV: per 128-wide head 128 bytes + 2 groups x (fp16 scale + zero) */
    dsq_model_config_t c;
    load_cfg("deepseek-coder-1.3b-instruct", &c);
    assert_int_equal(dsq_plan_kv_bytes_per_token(&c, DSQ_KV_INT8), 2 * 24 * 16 * (128 + 2 * 4));
}

static void test_plan_arithmetic(void **state)
{
    (void)state;
    dsq_model_config_t c;
    load_cfg("deepseek-coder-6.7b-instruct", &c);
    char err[256];
    dsq_plan_t p;
    dsq_plan_opts_t o = {.quantize = "int4", .group_size = 128, .max_model_len = 4096,
                         .kv_cache_bytes = (int64_t)8 << 30, .budget_bytes = (int64_t)64 << 30};
    assert_int_equal(dsq_plan_compute(&c, NULL, 0, &o, &p, err, sizeof(err)), DSQ_OK);
    assert_true(p.weights_from_config);
    assert_int_equal(p.block_bytes, 524288LL * 16);
    assert_int_equal(p.num_blocks, ((int64_t)8 << 30) / (524288LL * 16));   /* 1024 */
    assert_int_equal(p.max_tokens, 1024 * 16);
    assert_float_equal(p.max_concurrent_seqs, 4.0, 1e-9);
    /* params: 32 layers x (4 x 4096^2 + 3 x 4096 x 11008) + 2 x 32256 x 4096
     * + norms (65 x 4096) = 6,740,512,768 */
    assert_int_equal(p.n_params, 32LL * (4LL * 4096 * 4096 + 3LL * 4096 * 11008) +
                                 2LL * 32256 * 4096 + 65LL * 4096);
    /* INT4 g128 linear layers: 0.5 byte + 2 fp16 (scale, zero) per 128 */
    int64_t lin = 32LL * (4LL * 4096 * 4096 + 3LL * 4096 * 11008);
    int64_t want = lin / 2 + lin / 128 * 4 + 2LL * 32256 * 4096 * 2 + 65LL * 4096 * 4;
    assert_int_equal(p.weight_bytes, want);
    print_message("# 6.7B int4 g128: exact %lld bytes, coarse %lld bytes\n",
                  (long long)p.weight_bytes, (long long)p.coarse_estimate_bytes);
    char *t = dsq_plan_format_table(&p, &c), *j = dsq_plan_format_json(&p, &c);
    assert_non_null(strstr(t, "KV blocks"));
    assert_non_null(strstr(j, "\"num_blocks\":\t1024"));
    free(t);
    free(j);
    /* a budget that does not hold the weights */
    dsq_plan_opts_t small = {.budget_bytes = 1 << 20};
    assert_int_equal(dsq_plan_compute(&c, NULL, 0, &small, &p, err, sizeof(err)), DSQ_ERANGE);
    assert_non_null(strstr(err, "exceed"));
    assert_non_null(strstr(err, "--memory-limit"));
    /* users: an explicit KV budget that, with the weights, exceeds the
     * memory budget is an error naming both flags, not a silent overcommit */
    dsq_plan_opts_t over = o;
    over.budget_bytes = (int64_t)10 << 30;
    assert_int_equal(dsq_plan_compute(&c, NULL, 0, &over, &p, err, sizeof(err)), DSQ_ERANGE);
    assert_non_null(strstr(err, "--kv-cache-memory"));
    assert_non_null(strstr(err, "--memory-limit"));
    print_message("# %s\n", err);
    /* users: the CPU default is capped at 4 GiB, and the plan says so */
    dsq_plan_opts_t dflt = {.quantize = "int4", .group_size = 128, .max_model_len = 16384,
                            .budget_bytes = (int64_t)64 << 30};
    assert_int_equal(dsq_plan_compute(&c, NULL, 0, &dflt, &p, err, sizeof(err)), DSQ_OK);
    assert_int_equal(p.kv_budget_bytes, (int64_t)4 << 30);
    assert_non_null(strstr(p.kv_budget_source, "4 GiB"));
    assert_non_null(strstr(p.kv_budget_source, "--kv-cache-memory"));
    t = dsq_plan_format_table(&p, &c);
    assert_non_null(strstr(t, "VLLM_CPU_KVCACHE_SPACE"));
    free(t);
    /* 4 GiB = 8192 tokens of 512 KiB: max_model_len 16384 does not fit, and
     * the refusal names the largest max_model_len that does */
    char advice[640];
    assert_true(dsq_plan_fit_advice(&p, advice, sizeof(advice)));
    print_message("# %s\n", advice);
    assert_non_null(strstr(advice, "--max-model-len 8192 or lower"));
    assert_non_null(strstr(advice, "--kv-cache-memory"));
    dflt.max_model_len = 8192;
    assert_int_equal(dsq_plan_compute(&c, NULL, 0, &dflt, &p, err, sizeof(err)), DSQ_OK);
    assert_false(dsq_plan_fit_advice(&p, advice, sizeof(advice)));
}

static void test_smollm2_predicted_equals_allocated(void **state)
{
    (void)state;
    const char *dir = getenv("DSQ_MODELS_DIR");
    char path[1024], err[512];
    snprintf(path, sizeof(path), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : "models");
    dsq_model_file_t *f = dsq_model_file_open(path, NULL, err, sizeof(err));
    if (!f)
        fail_msg("required test model: %s", err);
    int n = dsq_model_file_n_tensors(f);
    const dsq_tensor_t **tv = calloc((size_t)n, sizeof(*tv));
    for (int i = 0; i < n; i++)
        tv[i] = dsq_model_file_tensor(f, i);
    dsq_plan_opts_t o = {.kv_cache_bytes = 1 << 26};
    dsq_plan_t p;
    assert_int_equal(dsq_plan_compute(dsq_model_file_config(f), tv, n, &o, &p, err,
                                      sizeof(err)), DSQ_OK);
    dsq_model_opts_t mo = {0};
    dsq_model_t *m = dsq_model_create(f, &mo, err, sizeof(err));
    assert_non_null(m);
    print_message("# smollm2: predicted %lld, model %zu weight bytes; kv %lld bytes/token\n",
                  (long long)p.weight_bytes, dsq_model_weight_bytes(m),
                  (long long)p.kv_bytes_per_token);
    assert_int_equal((size_t)p.weight_bytes, dsq_model_weight_bytes(m));
    /* 2 x 30 layers x 3 kv heads x 64 x 2 bytes */
    assert_int_equal(p.kv_bytes_per_token, 2 * 30 * 3 * 64 * 2);
    dsq_model_destroy(m);
    dsq_model_file_close(f);
    free(tv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_bytes_per_token),
        cmocka_unit_test(test_plan_arithmetic),
        cmocka_unit_test(test_smollm2_predicted_equals_allocated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

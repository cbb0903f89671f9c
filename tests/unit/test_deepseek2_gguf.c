/* tests for llama.cpp's deepseek2 GGUF layout (engine/loader/loader.c splitting
 * the stacked tensors, engine/io/model_config.c's deepseek2.* keys,
 * engine/model/model_deepseek2.c's split attn_k_b/attn_v_b path) and the memory
 * planner's prediction for DeepSeek models (engine/serve/planner.c).
 * References, all independent of dsq:
 *  - the tiny random-weight models of tests/ref/make_deepseek2_tiny.py,
 *    converted to GGUF by llama.cpp's own convert_hf_to_gguf.py
 *    (tests/ref/convert_deepseek2_gguf.py: f32, f16, q8_0, and an f32 file
 *    in the older single attn_kv_b layout; CI rebuilds the same bytes
 *    without torch with tests/ref/write_deepseek2_gguf.py and checks them
 *    against the converter's manifest), checked against the
 *    transformers golden logits tests/golden/deepseek2_tiny_*_logits.txt;
 *  - the HF config.json of the same model (what the GGUF metadata must
 *    reproduce);
 *  - for the planner, the bytes the model actually allocates
 *    (dsq_model_weight_bytes), and a hand-derived DeepSeek-Coder-V2-Lite
 *    figure. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/io/model_config.h"
#include "engine/serve/planner.h"

#include "ds2_tiny.h"

/* ------------------------------------------------------------ GGUF logits */

/* One GGUF against the golden: every logit of the 16 prompt positions
 * within tol * max(1, |ref|), rms(d)/rms(ref) <= rms_tol, greedy
 * continuation identical when want_greedy. Prefill form per DSQ_MLA_PREFILL (set by the caller). */
static double check_gguf(const char *variant, const char *file, dsq_kv_dtype_t kvt,
                         double tol, double rms_tol, bool want_greedy)
{
    golden_t g;
    golden_read(&g, variant);
    char rel[160];
    snprintf(rel, sizeof(rel), "deepseek2-tiny-gguf/%s", file);
    runner_t r;
    runner_open(&r, rel, NULL, kvt);
    float *lg = malloc((size_t)g.n_prompt * N_VOCAB * sizeof(float));
    run_tokens(&r, g.prompt, g.n_prompt, 0, true, lg);
    dsq_kv_seq_free(r.kv, &r.bt);
    double worst = max_rel(lg, g.logits, (size_t)g.n_prompt * N_VOCAB);
    double sd = 0, sr = 0;
    for (size_t i = 0; i < (size_t)g.n_prompt * N_VOCAB; i++) {
        sd += ((double)lg[i] - g.logits[i]) * ((double)lg[i] - g.logits[i]);
        sr += (double)g.logits[i] * g.logits[i];
    }
    int32_t got[MAX_IDS];
    greedy(&r, &g, g.n_out, got);
    int same = 0;
    while (same < g.n_out && got[same] == g.out[same])
        same++;
    print_message("# %s (%s cache): max |d|/max(1,|ref|) = %.2e (tol %.0e), rms(d)/rms(ref) "
                  "= %.2e; greedy %d/%d tokens equal\n", file,
                  kvt == DSQ_KV_F32 ? "fp32" : "fp16", worst, tol, sqrt(sd / sr), same,
                  g.n_out);
    assert_true(worst <= tol);
    assert_true(sqrt(sd / sr) <= rms_tol);
    if (want_greedy)
        assert_memory_equal(got, g.out, (size_t)g.n_out * sizeof(int32_t));
    free(lg);
    free(g.logits);
    runner_close(&r);
    return worst;
}

/* F32 GGUF (converter's split attn_k_b/attn_v_b layout): the golden's own
 * FP32 tolerance 1e-4 with an FP32 cache (1e-3 is the bound asked of it), 5e-3 with
 * the FP16 cache (see test_deepseek2.c check_variant_kv for why); greedy
 * identical. The split layout has no kv_b_proj, so prefill is absorbed. */
static void test_f32(void **state)
{
    (void)state;
    const char *v[] = {"v2_lite", "v2_group", "v3"};
    char file[64];
    for (int i = 0; i < 3; i++) {
        snprintf(file, sizeof(file), "%s.f32.gguf", v[i]);
        check_gguf(v[i], file, DSQ_KV_F32, 1e-4, 1e-4, true);
        check_gguf(v[i], file, DSQ_KV_F16, 5e-3, 5e-3, true);
    }
}

/* The older layout (one attn_kv_b per layer, llama.cpp converters before
 * the k_b/v_b split): both prefill forms, FP32 bound 1e-4. */
static void test_legacy_kv_b(void **state)
{
    (void)state;
    setenv("DSQ_MLA_PREFILL", "absorbed", 1);
    check_gguf("v2_lite", "v2_lite.kvb.f32.gguf", DSQ_KV_F32, 1e-4, 1e-4, true);
    setenv("DSQ_MLA_PREFILL", "expanded", 1);
    check_gguf("v2_lite", "v2_lite.kvb.f32.gguf", DSQ_KV_F32, 1e-4, 1e-4, true);
    unsetenv("DSQ_MLA_PREFILL");
}

/* F16 and Q8_0 GGUFs, FP32 cache: the weights themselves are rounded, so
 * the bounds are about 3x what was measured (printed), not FP32's.
 *  - F16: 2^-11 relative per weight (norms and the router stay F32).
 *    Measured max |d|/max(1,|ref|) 5.1e-3 .. 8.3e-3, rms(d)/rms(ref)
 *    6.6e-4 .. 9.0e-4: bounds 2.5e-2 and 3e-3, greedy identical.
 *  - Q8_0: up to 1/254 of each 32-weight block's max per weight, and the
 *    Q8_0 matmul rounds activations to int8 as llama.cpp does (the
 *    converter keeps attn_k_b, 16 wide, in F16). Measured rms(d)/rms(ref)
 *    2.3e-2 .. 3.2e-2 (int4 g32 is ~0.2-0.4, test_deepseek2.c test_int4),
 *    max |d|/max(1,|ref|) up to 0.68 on one logit: bounds rms 0.1, max
 *    2.0. Greedy is identical for v2_lite and v3 but not asserted: v2_group
 *    leaves the golden at token 10 (its smallest top-2 gap is 0.03). */
static void test_f16_q8_0(void **state)
{
    (void)state;
    const char *v[] = {"v2_lite", "v2_group", "v3"};
    char file[64];
    for (int i = 0; i < 3; i++) {
        snprintf(file, sizeof(file), "%s.f16.gguf", v[i]);
        check_gguf(v[i], file, DSQ_KV_F32, 2.5e-2, 3e-3, true);
        snprintf(file, sizeof(file), "%s.q8_0.gguf", v[i]);
        check_gguf(v[i], file, DSQ_KV_F32, 2.0, 0.1, false);
    }
}

/* ---------------------------------------------------------- GGUF metadata */

static dsq_model_file_t *open_rel(const char *rel)
{
    char err[512] = "";
    char *p = path_join("DSQ_MODELS_DIR", "models", rel);
    dsq_model_file_t *f = dsq_model_file_open(p, NULL, err, sizeof(err));
    if (!f)
        fail_msg("required test model %s: %s (scripts/test makes it)", p, err);
    free(p);
    return f;
}

/* The GGUF's deepseek2.* keys give the same config as the HF config.json
 * (the converter's input), and the stacked tensors are listed as per-slice
 * views of the right shape and bytes. */
static void test_config_and_views(void **state)
{
    (void)state;
    const char *v[] = {"v2_lite", "v2_group", "v3"};
    char rel[128];
    for (int i = 0; i < 3; i++) {
        snprintf(rel, sizeof(rel), "deepseek2-tiny/%s", v[i]);
        dsq_model_file_t *hf = open_rel(rel);
        snprintf(rel, sizeof(rel), "deepseek2-tiny-gguf/%s.q8_0.gguf", v[i]);
        dsq_model_file_t *gg = open_rel(rel);
        const dsq_model_config_t *a = dsq_model_file_config(hf), *b = dsq_model_file_config(gg);
        assert_int_equal(b->arch, DSQ_ARCH_DEEPSEEK2);
#define SAME_I(x) assert_int_equal(a->x, b->x)
#define SAME_F(x) assert_float_equal(a->x, b->x, 1e-6 * fabs(a->x))
        SAME_I(n_layer); SAME_I(n_embd); SAME_I(n_ff); SAME_I(n_head); SAME_I(n_vocab);
        SAME_I(q_lora_rank); SAME_I(kv_lora_rank); SAME_I(qk_nope_head_dim);
        SAME_I(qk_rope_head_dim); SAME_I(v_head_dim); SAME_I(first_k_dense_replace);
        SAME_I(n_routed_experts); SAME_I(n_shared_experts); SAME_I(n_experts_per_tok);
        SAME_I(moe_intermediate_size); SAME_I(norm_topk_prob); SAME_I(n_group);
        SAME_I(topk_group); SAME_I(rope_neox); SAME_I(rope_scaling); SAME_I(rope_orig_ctx);
        SAME_F(routed_scaling_factor); SAME_F(rope_theta); SAME_F(rope_factor);
        SAME_F(yarn_mscale_all_dim); SAME_F(yarn_beta_fast); SAME_F(yarn_beta_slow);
        SAME_F(rms_eps);
#undef SAME_I
#undef SAME_F
        assert_string_equal(a->topk_method, b->topk_method);
        assert_string_equal(a->scoring_func, b->scoring_func);
        /* expert 3 of layer 1: its own [d, mi] view inside the stacked tensor */
        const dsq_tensor_t *e3 = dsq_model_file_find(gg, "blk.1.ffn_gate.3.weight");
        const dsq_tensor_t *e0 = dsq_model_file_find(gg, "blk.1.ffn_gate.0.weight");
        assert_non_null(e3);
        assert_non_null(e0);
        assert_null(dsq_model_file_find(gg, "blk.1.ffn_gate_exps.weight"));
        assert_int_equal(e3->ne[0], a->n_embd);
        assert_int_equal(e3->ne[1], a->moe_intermediate_size);
        assert_int_equal(e3->ne[2], 1);
        assert_int_equal(e3->n_bytes, e0->n_bytes);
        assert_ptr_equal((const char *)e3->data, (const char *)e0->data + 3 * e0->n_bytes);
        const dsq_tensor_t *kb = dsq_model_file_find(gg, "blk.0.attn_k_b.3.weight");
        const dsq_tensor_t *vb = dsq_model_file_find(gg, "blk.0.attn_v_b.3.weight");
        assert_non_null(kb);
        assert_non_null(vb);
        assert_int_equal(kb->ne[0], a->qk_nope_head_dim);
        assert_int_equal(kb->ne[1], a->kv_lora_rank);
        assert_int_equal(vb->ne[0], a->kv_lora_rank);
        assert_int_equal(vb->ne[1], a->v_head_dim);
        assert_null(dsq_model_file_find(gg, "blk.0.attn_k_b.4.weight"));
        dsq_model_file_close(hf);
        dsq_model_file_close(gg);
    }
}

/* ---------------------------------------------------------------- planner */

/* Predicted weight bytes (dsq_plan_compute over the tensor table) equal
 * what the model allocates, for every layout and format, with and without
 * --quantize int4: HF safetensors (kv_b_proj plus the per-head absorbed
 * copies the planner adds as a class of their own), GGUF split (views),
 * GGUF legacy kv_b. */
static void test_planner_predicted_equals_allocated(void **state)
{
    (void)state;
    const char *rels[] = {
        "deepseek2-tiny/v2_lite", "deepseek2-tiny/v2_group", "deepseek2-tiny/v3",
        "deepseek2-tiny-gguf/v2_lite.f32.gguf", "deepseek2-tiny-gguf/v2_group.f16.gguf",
        "deepseek2-tiny-gguf/v3.q8_0.gguf", "deepseek2-tiny-gguf/v2_lite.kvb.f32.gguf",
    };
    const char *quant[] = {NULL, "int4"};
    for (size_t i = 0; i < sizeof(rels) / sizeof(rels[0]); i++) {
        for (int q = 0; q < 2; q++) {
            char err[512] = "";
            dsq_model_file_t *f = open_rel(rels[i]);
            int n = dsq_model_file_n_tensors(f);
            const dsq_tensor_t **tv = calloc((size_t)n, sizeof(*tv));
            for (int t = 0; t < n; t++)
                tv[t] = dsq_model_file_tensor(f, t);
            dsq_plan_opts_t o = {.kv_cache_bytes = 1 << 26, .quantize = quant[q],
                                 .group_size = 32};
            dsq_plan_t p;
            assert_int_equal(dsq_plan_compute(dsq_model_file_config(f), tv, n, &o, &p, err,
                                              sizeof(err)), DSQ_OK);
            dsq_model_opts_t mo = {.quantize = quant[q], .group_size = 32};
            dsq_model_t *m = dsq_model_create(f, &mo, err, sizeof(err));
            if (!m)
                fail_msg("%s: %s", rels[i], err);
            print_message("# %s %s: predicted %lld, allocated %zu weight bytes (absorbed "
                          "%lld)\n", rels[i], quant[q] ? quant[q] : "none",
                          (long long)p.weight_bytes, dsq_model_weight_bytes(m),
                          (long long)p.class_bytes[DSQ_PLAN_MLA_ABSORBED]);
            assert_int_equal((size_t)p.weight_bytes, dsq_model_weight_bytes(m));
            dsq_model_destroy(m);
            dsq_model_file_close(f);
            free(tv);
        }
    }
}

/* Config-only plan of DeepSeek-V2-Lite(-Chat) ($DSQ_TEST_DATA/configs/hf;
 * DeepSeek-Coder-V2-Lite has the same shapes: 27 layers, hidden 2048, 16
 * heads, no q_lora, kv_lora 512, qk 128+64, v 128, dense ff 10944 in layer
 * 0, then 64 routed experts of 1408 + 2 shared, vocab 102400) with
 * --quantize int4, group 128, against a figure derived by hand:
 *   INT4 with fp16 scale + zero per 128 weights: n*k*(1/2 + 4/128) =
 *   n*k*17/32 bytes. INT4 weights, per layer:
 *     q_proj 3072x2048 = 6,291,456; kv_a_mqa 576x2048 = 1,179,648;
 *     kv_b 4096x512 = 2,097,152; o_proj 2048x2048 = 4,194,304
 *     -> 13,762,560 x 27 = 371,589,120
 *     absorbed W_UK^T copies 16 x 512x128 = 1,048,576 x 27 = 28,311,552
 *     layer 0 MLP 3 x 10944x2048 = 67,239,936
 *     routed 64 x 3 x 1408x2048 = 553,648,128 x 26 = 14,394,851,328
 *     shared 3 x 2816x2048 = 17,301,504 x 26 = 449,839,104
 *   sum 15,311,831,040 weights x 17/32 = 8,134,410,240 bytes;
 *   embedding + lm_head fp16 2 x 102400x2048x2 = 838,860,800;
 *   routers fp32 26 x 64x2048x4 = 13,631,488;
 *   norms fp32 (2048 + 27 x (2048+2048+512)) x 4 = 505,856;
 *   layer 0's down_proj has k = 10944 = 85.5 groups of 128: the partial
 *   group has its own scale + zero, + 2048 x 4 / 2 = 4,096;
 *   total 8,987,412,480 bytes (8.37 GiB). */
static void test_plan_v2_lite_int4(void **state)
{
    (void)state;
    const char *root = getenv("DSQ_TEST_DATA");
    char path[1024], err[256];
    snprintf(path, sizeof(path), "%s/configs/hf/DeepSeek-V2-Lite-Chat/config.json",
             root ? root : "tests/data");
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("required test file missing: %s", path);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    dsq_model_config_t c;
    if (dsq_model_config_from_hf_json(buf, n, &c, err, sizeof(err)) != 0)
        fail_msg("%s: %s", path, err);
    dsq_plan_opts_t o = {.quantize = "int4", .group_size = 128, .kv_cache_bytes = 1 << 26};
    dsq_plan_t p;
    assert_int_equal(dsq_plan_compute(&c, NULL, 0, &o, &p, err, sizeof(err)), DSQ_OK);
    print_message("# V2-Lite int4 g128: %lld weight bytes (hand: 8987412480), absorbed %lld, "
                  "experts %lld; kv %lld bytes/token\n", (long long)p.weight_bytes,
                  (long long)p.class_bytes[DSQ_PLAN_MLA_ABSORBED],
                  (long long)p.class_bytes[DSQ_PLAN_EXPERTS], (long long)p.kv_bytes_per_token);
    assert_true(p.weights_from_config);
    assert_int_equal(p.class_bytes[DSQ_PLAN_MLA_ABSORBED], 28311552LL * 17 / 32);
    assert_int_equal(p.class_bytes[DSQ_PLAN_EXPERTS], 14394851328LL * 17 / 32 + 13631488LL);
    assert_int_equal(p.weight_bytes, 8987412480LL);
}

/* ---------------------------------------------------------- bad GGUFs */

/* Copy of models/deepseek2-tiny-gguf/<file> with the header edited in place:
 * the tensor info named `name` gets ne[dim] = value (dim >= 0), or its name
 * replaced by `rename` (same length). Written to a temp file in the build
 * directory whose path is returned (caller unlinks and frees). */
static char *patched_copy(const char *file, const char *name, int dim, uint64_t value,
                          const char *rename)
{
    char rel[160];
    snprintf(rel, sizeof(rel), "deepseek2-tiny-gguf/%s", file);
    char *src = path_join("DSQ_MODELS_DIR", "models", rel);
    require_file(src);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    /* a tensor info is: u64 name length, name, u32 n_dims, u64 ne[n_dims], ... */
    size_t nl = strlen(name);
    uint8_t *hit = NULL;
    for (long i = 8; i + (long)nl + 12 < n && !hit; i++) {
        uint64_t len;
        memcpy(&len, b + i - 8, 8);
        if (len == nl && memcmp(b + i, name, nl) == 0)
            hit = b + i;
    }
    if (!hit)
        fail_msg("%s: tensor info %s not found", src, name);
    if (rename) {
        assert_int_equal(strlen(rename), nl);
        memcpy(hit, rename, nl);
    } else {
        memcpy(hit + nl + 4 + 8 * (size_t)dim, &value, 8);
    }
    const char *dir = getenv("DSQ_BUILD_ROOT");
    char tmpl[1024];
    snprintf(tmpl, sizeof(tmpl), "%s/ds2gguf_bad_XXXXXX", dir ? dir : ".");
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    FILE *o = fdopen(fd, "wb");
    assert_int_equal(fwrite(b, 1, (size_t)n, o), (size_t)n);
    fclose(o);
    free(b);
    free(src);
    return strdup(tmpl);
}

/* Opening and loading must fail with a message naming the problem. */
static void expect_load_error(char *path, const char *want)
{
    char err[512] = "";
    dsq_model_file_t *f = dsq_model_file_open(path, NULL, err, sizeof(err));
    dsq_model_t *m = NULL;
    if (f) {
        dsq_model_opts_t mo = {0};
        m = dsq_model_create(f, &mo, err, sizeof(err));
    }
    print_message("# bad GGUF: %s\n", err);
    assert_null(m);
    if (!strstr(err, want))
        fail_msg("error '%s' does not mention '%s'", err, want);
    dsq_model_file_close(f);
    unlink(path);
    free(path);
}

/* Broken llama.cpp-layout files: fewer stacked experts than expert_count,
 * W_UK^T slices of the wrong shape (narrower: a wider one would overlap
 * the next tensor's bytes and fail at open), no kv_b and no k_b, a stacked
 * name on a tensor that is not 3-D. */
static void test_bad_gguf(void **state)
{
    (void)state;
    expect_load_error(patched_copy("v2_lite.f32.gguf", "blk.1.ffn_up_exps.weight", 2, 7,
                                   NULL), "blk.1.ffn_up.7.weight");
    expect_load_error(patched_copy("v2_lite.f32.gguf", "blk.0.attn_k_b.weight", 0, 8,
                                   NULL), "blk.0.attn_k_b.0.weight");
    expect_load_error(patched_copy("v2_lite.f32.gguf", "blk.0.attn_k_b.weight", 0, 0,
                                   "blk.0.attn_k_x.weight"), "attn_kv_b");
    /* a 1-D tensor under a stacked name: refused at open */
    expect_load_error(patched_copy("v2_lite.f32.gguf", "blk.1.ffn_norm.weight", 0, 0,
                                   "blk.7.attn_k_b.weight"), "must be 3-D");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_and_views),
        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_legacy_kv_b),
        cmocka_unit_test(test_f16_q8_0),
        cmocka_unit_test(test_planner_predicted_equals_allocated),
        cmocka_unit_test(test_plan_v2_lite_int4),
        cmocka_unit_test(test_bad_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* GPU check for the model graph on the CUDA backend (engine/model/model.c
 * on engine/backend/backend_cuda.c): each tiny real or tests/ref model runs
 * a 20-token prefill and 32 greedy decode steps on the CPU backend (fp32
 * activations, DSQ_ACT_F32: weights dequantised exactly, as the CUDA
 * kernels do) and on the CUDA backend with the activation type under test
 * (model.h dtype: auto gives fp16 for every file here, and one group runs
 * bf16 and one fp32), each with its own paged KV cache (fp16, the blocks of
 * the sequence scattered over the cache). Both sides take the CPU's greedy
 * token at every step (so a near-tie taken the other way cannot leave them
 * on different texts); every step's logits must agree within a bound, the
 * greedy ids must agree (narrow types: all but at most one step, where the
 * CPU's top two are then within 2 x the measured difference, i.e. a
 * near-tie), and after the last step the two caches must agree value by
 * value.
 *
 * fp32 activations: the products differ by fp32 summation order only (1e-6
 * relative, seen: 1e-6..1e-5 on most steps). The KV cache is fp16 on
 * both, and a key or value whose fp32 inputs differ in the last bits may
 * round to the neighbouring fp16 (one ulp, 2^-11 = 4.9e-4 relative); a
 * step that attends mostly to such a value moves its logits by up to that
 * much (seen once: 2.4e-4 relative, stories260K int4 step 20). So the
 * bound is one fp16 ulp of the largest logit,
 *     |cuda - cpu| <= 2^-11 * max(1, max |cpu logits of that step|),
 * greedy ids identical at every step, and fewer than 2 % of the cached
 * values different at all. Layer 0 (whose keys and values depend on the
 * token embeddings only): within one fp16 step of the larger value (2^-10
 * relative: a rounding to the other neighbour) or, for values near zero,
 * within 1e-4 of the layer's largest magnitude (fp32 noise there spans
 * many small-number ulps). Deeper layers read attention over flipped
 * values of the layers and steps before, so a value can move by several
 * of its own ulps (seen 2.4); they must agree within one fp16 step of the
 * layer's largest magnitude (amax / 1024; seen at most 0.56 of that).
 *
 * fp16 / bf16 activations (unit roundoff u = 2^-11 / 2^-8): a llama layer
 * stores 13 arrays in the narrow type (attention norm output, q, k, v, q
 * and k after RoPE, attention output, o-projection output, FFN norm
 * output, gate, up, SwiGLU output, down-projection output), the head one
 * more (the final norm's output); every sum stays fp32 and the residual
 * stream is fp32, so each store perturbs what it adds by at most u of its
 * size. RMSNorm rescales the stream to unit RMS before every product, so
 * each rounding moves the logits in proportion to their scale; the R =
 * 13 L + 1 roundings are independent, so their effect adds in quadrature:
 * about u sqrt(R) of the largest logit (seen: 8-9 u on stories260K, L = 5,
 * sqrt(R) = 8.1). The bound is four times that,
 *     |cuda - cpu| <= 4 sqrt(13 L + 1) u * max(1, max |cpu logits|),
 * and a cached key or value of layer l (13 l + 4 roundings before it) must
 * agree within 4 sqrt(13 l + 4) u of the layer's largest magnitude, plus
 * one fp16 step (2^-10) of the cache's own rounding. A misplaced slot or
 * block, a wrong element type or a lost row differs by O(max) instead.
 *
 * Models (formats of kernels.h / engine/model/quant.h):
 *   stories260K (llama2.c, F32), and the same with --quantize int4 (RTN,
 *   group 32) and written by dsq_quantizer_run as an AWQ checkpoint (INT4
 *   INT zero points; its 172-wide down projection stays F16);
 *   qwen2-tiny (HF F32, q/k/v bias), gptq-tiny (GPTQ INT4 with act-order:
 *   the column gathers), llama-tiny F16 / Q4_0 (SYM) / Q4_1 (MIN) GGUFs
 *   (tests/ref/make_llama_tiny_gguf.py, gguf-py's quantizers).
 * Each case prints the largest logit difference, its bound, and the
 * device bytes the model and cache took. */
#include "gpu_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/quantizer/quantizer.h"
#include "kernels/kernels.h"

enum { PROMPT = 20, STEPS = 32, BS = 16, NB = 6, MAXB = 4 };
/* the sequence's blocks, out of order in the cache */
static const int32_t block_table[MAXB] = {4, 1, 5, 2};

/* Unit roundoff of a narrow activation type (fp16 2^-11, bf16 2^-8). */
static double unit_roundoff(dsq_ftype_t at)
{
    return at == DSQ_FT_BF16 ? 1.0 / 256.0 : 1.0 / 2048.0;
}

/* Logit bound relative to max(1, max |cpu logit|) of the step (file
 * comment): fp32 one fp16 ulp; narrow 4 sqrt(13 L + 1) u. */
static double logit_bound(dsq_ftype_t at, int n_layer)
{
    if (at == DSQ_FT_F32)
        return 1.0 / 2048.0;
    return 4.0 * sqrt(13.0 * n_layer + 1.0) * unit_roundoff(at);
}

/* Narrow activations: bound on a cached K/V value of layer l relative to
 * the layer's largest magnitude (file comment): 4 sqrt(13 l + 4) u, plus
 * one fp16 step of the cache's own rounding. */
static double kv_bound(dsq_ftype_t at, int l)
{
    return 4.0 * sqrt(13.0 * l + 4.0) * unit_roundoff(at) + 1.0 / 1024.0;
}

static char *path_of(const char *env, const char *def, const char *rel)
{
    const char *root = getenv(env);
    size_t n = strlen(root ? root : def) + strlen(rel) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", root ? root : def, rel);
    struct stat st;
    if (stat(p, &st) != 0)
        fail_msg("required test file missing: %s (scripts/test makes models/, "
                 "tests/data holds stories260K)", p);
    return p;
}

typedef struct side {
    dsq_backend_t *be;
    dsq_model_t *m;
    dsq_kv_cache_t *kv;
    float *logits;
} side_t;

static void side_open(side_t *s, dsq_backend_t *be, const dsq_model_file_t *f,
                      const char *quantize, const char *dtype)
{
    char err[512] = "";
    memset(s, 0, sizeof(*s));
    s->be = be;
    dsq_model_opts_t mo = {.quantize = quantize, .group_size = 32,
                           .activation_dtype = DSQ_ACT_F32, .backend = be, .dtype = dtype};
    s->m = dsq_model_create(f, &mo, err, sizeof(err));
    if (!s->m)
        fail_msg("dsq_model_create on %s: %s", dsq_backend_name(be), err);
    int nkv, hd;
    bool has_v;
    dsq_model_kv_shape(s->m, &nkv, &hd, &has_v);
    const dsq_model_config_t *c = dsq_model_config(s->m);
    s->kv = dsq_kv_create_on(be, (int)c->n_layer, nkv, hd, BS, NB, DSQ_KV_F16, has_v, err,
                             sizeof(err));
    if (!s->kv)
        fail_msg("dsq_kv_create_on: %s", err);
    s->logits = malloc(sizeof(float) * (size_t)c->n_vocab);
    assert_non_null(s->logits);
}

static void side_close(side_t *s)
{
    dsq_kv_destroy(s->kv);
    dsq_model_destroy(s->m);
    free(s->logits);
}

static int32_t step(side_t *s, const int32_t *tokens, int n, int pos0)
{
    int32_t pos[PROMPT], seq[PROMPT], slot[PROMPT], lrow = n - 1;
    for (int i = 0; i < n; i++) {
        pos[i] = pos0 + i;
        seq[i] = 0;
        slot[i] = block_table[pos[i] / BS] * BS + pos[i] % BS;
    }
    dsq_batch_t b = {.n_tokens = n, .tokens = tokens, .pos = pos, .row_seq = seq,
                     .slot = slot, .n_seqs = 1, .block_tables = block_table,
                     .max_blocks = MAXB, .n_logits = 1, .logit_rows = &lrow};
    assert_int_equal(dsq_model_forward(s->m, s->kv, &b, s->logits), DSQ_OK);
    int64_t V = dsq_model_config(s->m)->n_vocab;
    int32_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (s->logits[v] > s->logits[best])
            best = (int32_t)v;
    return best;
}

/* dtype: the CUDA side's activations (model.h; NULL = auto: fp16 for
 * these files, none of which stores bf16 tensors). */
static void run_case(const char *what, const char *path, const char *quantize,
                     const char *dtype)
{
    char err[512] = "";
    dsq_model_file_t *f = dsq_model_file_open(path, NULL, err, sizeof(err));
    if (!f)
        fail_msg("%s: %s", path, err);
    dsq_backend_t *cuda = dsq_backend_create(DSQ_BACKEND_CUDA, err, sizeof(err));
    if (!cuda)
        fail_msg("cuda backend: %s", err);
    side_t cpu, dev;
    side_open(&cpu, dsq_backend_cpu(), f, quantize, NULL);
    side_open(&dev, cuda, f, quantize, dtype);
    const dsq_ftype_t at = dsq_model_act(dev.m);
    if (!dtype)
        assert_int_equal(at, DSQ_FT_F16);
    const int L = (int)dsq_model_config(cpu.m)->n_layer;
    const double lb = logit_bound(at, L);
    const size_t dev_bytes = dsq_backend_allocated_bytes(cuda);
    const int64_t V = dsq_model_config(cpu.m)->n_vocab;
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % V);
    double worst = 0, worst_tol = 0, ratio = 0;
    int n_flips = 0;
    int32_t tc = step(&cpu, prompt, PROMPT, 0), td = step(&dev, prompt, PROMPT, 0);
    for (int t = 0;; t++) {
        double mx = 1, d = 0;
        for (int64_t v = 0; v < V; v++) {
            mx = fabs(cpu.logits[v]) > mx ? fabs(cpu.logits[v]) : mx;
            double e = fabs((double)cpu.logits[v] - dev.logits[v]);
            d = isnan(e) ? INFINITY : e > d ? e : d;
        }
        const double tol = lb * mx;
        if (d / tol > ratio) {
            ratio = d / tol;
            worst = d;
            worst_tol = tol;
        }
        if (d > tol)
            fail_msg("%s step %d: max |logit diff| %.3e (bound %.3e), greedy cpu %d cuda %d",
                     what, t, d, tol, tc, td);
        if (tc != td) {
            /* narrow only, and at most one step: the CPU's top two within
             * 2 d of each other (necessarily, as d bounds both logits) */
            const double gap = (double)cpu.logits[tc] - cpu.logits[td];
            printf("# %s %s step %d: greedy cpu %d cuda %d, a near-tie (cpu gap %.3e, "
                   "max |logit diff| %.3e)\n", what, dsq_ftype_name(at), t, tc, td, gap, d);
            if (at == DSQ_FT_F32 || ++n_flips > 1)
                fail_msg("%s step %d: greedy cpu %d cuda %d", what, t, tc, td);
        }
        if (t == STEPS)
            break;
        /* both continue from the CPU's choice, so that a near-tie taken the
         * other way does not leave the two on different texts */
        const int32_t next = tc;
        tc = step(&cpu, &next, 1, PROMPT + t);
        td = step(&dev, &next, 1, PROMPT + t);
    }
    /* the caches, value by value */
    const dsq_model_config_t *c = dsq_model_config(cpu.m);
    int64_t n_diff = 0, n_all = 0, n_bad = 0;
    double kv_worst0 = 0, kv_worst = 0;
    dsq_weight_t h1 = {.format = DSQ_WFMT_F16, .n = 1, .k = 1};
    for (int l = 0; l < (int)c->n_layer; l++) {
        const dsq_kv_layer_t *hk = dsq_kv_layer(cpu.kv, l), *dk = dsq_kv_layer(dev.kv, l);
        const size_t n = (size_t)NB * BS * (size_t)hk->n_kv_heads * (size_t)hk->head_dim;
        uint16_t *got = malloc(n * 2);
        float *a = malloc(n * 4), *b = malloc(n * 4);
        assert_true(got && a && b);
        for (int kvsel = 0; kvsel < 2; kvsel++) {
            assert_int_equal(dsq_backend_download(cuda, got, kvsel ? dk->v : dk->k, n * 2),
                             DSQ_OK);
            const uint16_t *want = kvsel ? hk->v : hk->k;
            double amax = 0;
            for (size_t i = 0; i < n; i++) {
                h1.data = &want[i];
                assert_int_equal(dsq_weight_dequant_row(&h1, 0, &a[i]), DSQ_OK);
                h1.data = &got[i];
                assert_int_equal(dsq_weight_dequant_row(&h1, 0, &b[i]), DSQ_OK);
                amax = fabs(a[i]) > amax ? fabs(a[i]) : amax;
            }
            for (size_t i = 0; i < n; i++) {
                double d = fabs((double)a[i] - b[i]);
                double big = fabs(a[i]) > fabs(b[i]) ? fabs(a[i]) : fabs(b[i]);
                double lim = at != DSQ_FT_F32 ? kv_bound(at, l) * amax
                             : l == 0 ? (big / 1024.0 > 1e-4 * amax ? big / 1024.0 : 1e-4 * amax)
                                      : amax / 1024.0;
                n_diff += d != 0;
                n_bad += !(d <= lim);
                if (l == 0)
                    kv_worst0 = d / lim > kv_worst0 ? d / lim : kv_worst0;
                else
                    kv_worst = d / lim > kv_worst ? d / lim : kv_worst;
            }
            n_all += (int64_t)n;
        }
        free(got);
        free(a);
        free(b);
    }
    printf("# %-26s %-4s activations, %d steps, greedy ids equal at %d; max_abs_diff=%.3e "
           "(bound there %.3e, worst diff/bound %.3f); kv values differing %lld of %lld "
           "(worst diff/bound layer 0 %.3f, others %.3f); device bytes %zu\n",
           what, dsq_ftype_name(at), STEPS + 1, STEPS + 1 - n_flips, worst, worst_tol, ratio,
           (long long)n_diff, (long long)n_all, kv_worst0, kv_worst, dev_bytes);
    assert_int_equal(n_bad, 0);
    if (at == DSQ_FT_F32)
        assert_true(n_diff * 50 < n_all);
    side_close(&dev);
    side_close(&cpu);
    assert_int_equal(dsq_backend_allocated_bytes(cuda), 0);
    dsq_backend_destroy(cuda);
    dsq_model_file_close(f);
}

static void test_stories_f32(void **state)
{
    (void)state;
    char *p = path_of("DSQ_TEST_DATA", "tests/data", "models/stories260K/stories260K.bin");
    run_case("stories260K f32", p, NULL, NULL);
    free(p);
}

static void test_stories_int4(void **state)
{
    (void)state;
    char *p = path_of("DSQ_TEST_DATA", "tests/data", "models/stories260K/stories260K.bin");
    run_case("stories260K rtn int4 g32", p, "int4", NULL);
    free(p);
}

/* An AWQ checkpoint of stories260K written by the quantizer (RTN). */
static void test_awq(void **state)
{
    (void)state;
    char *p = path_of("DSQ_TEST_DATA", "tests/data", "models/stories260K/stories260K.bin");
    char dir[] = "/tmp/dsq-cuda-awq-XXXXXX", err[512] = "";
    assert_non_null(mkdtemp(dir));
    dsq_qrun_opts_t o = {.model = p, .out_dir = dir, .method = "rtn", .format = "awq",
                         .group_size = 32, .quiet = true};
    if (dsq_quantizer_run(&o, err, sizeof(err)) != DSQ_OK)
        fail_msg("dsq_quantizer_run: %s", err);
    run_case("stories260K awq (rtn g32)", dir, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(p);
}

static void test_hf_tiny(void **state)
{
    (void)state;
    char *q = path_of("DSQ_MODELS_DIR", "models", "qwen2-tiny");
    run_case("qwen2-tiny f32 (qkv bias)", q, NULL, NULL);
    char *g = path_of("DSQ_MODELS_DIR", "models", "gptq-tiny");
    run_case("gptq-tiny int4 act-order", g, NULL, NULL);
    free(q);
    free(g);
}

static void test_gguf_tiny(void **state)
{
    (void)state;
    const char *kinds[3] = {"f16", "q4_0", "q4_1"};
    for (int i = 0; i < 3; i++) {
        char rel[64], what[64];
        snprintf(rel, sizeof(rel), "llama-tiny-gguf/llama-tiny.%s.gguf", kinds[i]);
        snprintf(what, sizeof(what), "llama-tiny %s gguf", kinds[i]);
        char *p = path_of("DSQ_MODELS_DIR", "models", rel);
        run_case(what, p, NULL, NULL);
        free(p);
    }
}

/* fp32 activations (--dtype float32): the fp32 bounds */
static void test_f32(void **state)
{
    (void)state;
    char *p = path_of("DSQ_TEST_DATA", "tests/data", "models/stories260K/stories260K.bin");
    run_case("stories260K rtn int4 g32", p, "int4", "float32");
    free(p);
}

/* bf16 activations (what auto picks for a checkpoint that stores bf16) */
static void test_bf16(void **state)
{
    (void)state;
    char *p = path_of("DSQ_TEST_DATA", "tests/data", "models/stories260K/stories260K.bin");
    run_case("stories260K f32", p, NULL, "bfloat16");
    free(p);
    p = path_of("DSQ_MODELS_DIR", "models", "llama-tiny-gguf/llama-tiny.q4_0.gguf");
    run_case("llama-tiny q4_0 gguf", p, NULL, "bfloat16");
    free(p);
}

/* argv[1] (optional): one group, "stories_f32", "stories_int4", "awq",
 * "hf", "gguf", "bf16" or "f32" (meson runs the seven as separate tests so
 * that they share the cores and each stays far inside its timeout under
 * the simulator). */
int main(int argc, char **argv)
{
    char filter[64];
    if (argc > 1) {
        snprintf(filter, sizeof(filter), "test_%s*", argv[1]);
        cmocka_set_test_filter(filter);
    }
    int skip = gpu_skip_code();
    if (skip >= 0)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_f32),
        cmocka_unit_test(test_stories_int4),
        cmocka_unit_test(test_awq),
        cmocka_unit_test(test_hf_tiny),
        cmocka_unit_test(test_gguf_tiny),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* End-to-end checks of the fp32-activation path (dsq_model_opts_t
 * .activation_dtype = DSQ_ACT_F32, dsqd/dsq-run --activation-dtype fp32)
 * and of GPTQ act-order (desc_act) checkpoints in the llama graph, against
 * independent references:
 *  - SmolLM2-135M-Instruct Q4_1: logits of the first 8 positions of a fixed
 *    prompt against transformers' fp32 forward of the same GGUF
 *    (tests/ref/make_smollm2_transformers.py, cross-checked there against
 *    the float64 numpy forward) and against that float64 forward itself;
 *  - a tiny random llama in GPTQ format with act-order
 *    (tests/ref/make_gptq_tiny.py: GPTQ packing with a non-trivial g_idx,
 *    reference logits by transformers on the weights dequantised with the
 *    GPTQ formula in Python).
 * The model is run as one sequence, all prompt positions in one prefill,
 * FP32 KV cache (the references keep K/V in fp32 too). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "test_common.h"

typedef struct runner {
    dsq_model_file_t *file;
    dsq_model_t *model;
    dsq_kv_cache_t *kv;
    dsq_block_table_t bt;
    int n_vocab;
} runner_t;

static void runner_open(runner_t *r, const char *path, dsq_act_dtype_t act)
{
    char err[512] = "";
    memset(r, 0, sizeof(*r));
    r->file = dsq_model_file_open(path, NULL, err, sizeof(err));
    if (!r->file)
        fail_msg("open %s: %s", path, err);
    dsq_model_opts_t mo = {.activation_dtype = act};
    r->model = dsq_model_create(r->file, &mo, err, sizeof(err));
    if (!r->model)
        fail_msg("model %s: %s", path, err);
    const dsq_model_config_t *c = dsq_model_config(r->model);
    r->n_vocab = (int)c->n_vocab;
    r->kv = dsq_kv_create((int)c->n_layer, (int)c->n_head_kv, (int)c->head_dim, 16, 8,
                          DSQ_KV_F32, err, sizeof(err));
    assert_non_null(r->kv);
    dsq_block_table_init(&r->bt);
}

static void runner_close(runner_t *r)
{
    dsq_kv_seq_free(r->kv, &r->bt);
    dsq_block_table_deinit(&r->bt);
    dsq_kv_destroy(r->kv);
    dsq_model_destroy(r->model);
    dsq_model_file_close(r->file);
}

/* Run ids[0..n) at positions start..start+n-1 of the runner's sequence;
 * logits of all n rows into out [n][n_vocab]. */
static void run_tokens(runner_t *r, const int32_t *ids, int n, int start, float *out)
{
    int32_t pos[64], rs[64] = {0}, slot[64], rows[64];
    assert_true(n <= 64);
    assert_int_equal(dsq_kv_seq_reserve(r->kv, &r->bt, start + n), DSQ_OK);
    for (int i = 0; i < n; i++) {
        pos[i] = start + i;
        slot[i] = dsq_kv_slot(r->kv, &r->bt, start + i);
        rows[i] = i;
    }
    dsq_batch_t b = {
        .n_tokens = n, .tokens = ids, .pos = pos, .row_seq = rs, .slot = slot,
        .n_seqs = 1, .block_tables = r->bt.ids, .max_blocks = r->bt.n,
        .n_logits = n, .logit_rows = rows,
    };
    assert_int_equal(dsq_model_forward(r->model, r->kv, &b, out), DSQ_OK);
}

/* Open model at path with the given activation dtype and run ids[0..n) in
 * one prefill at positions 0..n-1; returns malloc'd logits [n][*n_vocab]. */
static float *run_prompt(const char *path, dsq_act_dtype_t act, const int32_t *ids, int n,
                         int *n_vocab)
{
    runner_t r;
    runner_open(&r, path, act);
    *n_vocab = r.n_vocab;
    float *lg = malloc((size_t)n * (size_t)r.n_vocab * sizeof(float));
    run_tokens(&r, ids, n, 0, lg);
    runner_close(&r);
    return lg;
}

/* Errors of logits lg against a SmolLM2 golden file (smollm2_logits.txt
 * format) over the ids it lists (top-32 and the strided subset of 1024),
 * per position p: rel_max[p] = max|d| / max|ref|, rel_l2[p] = ||d|| / ||ref||.
 * Argmax must agree where the reference's top-2 gap >= gap. Returns the
 * number of positions. */
static int smollm2_errors(const char *gold, const float *lg, int n_vocab, int n_p,
                          double gap, double *rel_max, double *rel_l2)
{
    FILE *f = fopen(gold, "r");
    static char line[1 << 20];
    int p = -1, stride = 0, n_pos = 0;
    double emax = 0, rmax = 0, e2 = 0, r2 = 0;
    assert_non_null(f);
    while (fgets(line, sizeof(line), f)) {
        char *s, *end;
        if (line[0] == '#')
            continue;
        if (strncmp(line, "subset_stride:", 14) == 0)
            stride = atoi(line + 14);
        if (strncmp(line, "pos:", 4) == 0) {
            p = atoi(line + 4);
            assert_true(p >= 0 && p < n_p);
            emax = rmax = e2 = r2 = 0;
        } else if (strncmp(line, "top32:", 6) == 0 || strncmp(line, "subset:", 7) == 0) {
            const float *row = lg + (size_t)p * (size_t)n_vocab;
            bool subset = line[0] == 's';
            float ref[1024];
            int ids[1024], n = 0;
            s = line + (subset ? 7 : 6);
            for (;;) {
                long id;
                float v;
                if (subset) {
                    v = strtof(s, &end);
                    if (end == s || n >= 1024)
                        break;
                    id = (long)n * stride;
                } else {
                    id = strtol(s, &end, 10);
                    if (end == s || *end != ':' || n >= 1024)
                        break;
                    v = strtof(end + 1, &end);
                }
                s = end;
                assert_true(id >= 0 && id < n_vocab);
                ids[n] = (int)id;
                ref[n++] = v;
            }
            for (int i = 0; i < n; i++) {
                double d = (double)row[ids[i]] - ref[i];
                emax = fmax(emax, fabs(d));
                rmax = fmax(rmax, fabs((double)ref[i]));
                e2 += d * d;
                r2 += (double)ref[i] * ref[i];
            }
            if (!subset) {
                /* top32 is sorted: ref[0] is the argmax, ref[1] the runner-up */
                int ours = 0;
                for (int i = 1; i < n_vocab; i++)
                    if (row[i] > row[ours])
                        ours = i;
                if (ref[0] - ref[1] >= gap)
                    assert_int_equal(ours, ids[0]);
            } else {
                rel_max[p] = emax / rmax;
                rel_l2[p] = sqrt(e2 / r2);
                n_pos++;
            }
        }
    }
    fclose(f);
    return n_pos;
}

static const int32_t smol_ids[8] = {504, 2365, 6354, 16438, 27003, 690, 260, 23790};

/* SmolLM2 with fp32 activations, first 8 positions of the fixed prompt of
 * tests/golden/smollm2_logits*.txt. Error measures, per position p, over the
 * ids the golden lists (its top 32 and ids 0, 48, ..., 49104):
 *   rel_max = max_i |ours_i - ref_i| / max_i |ref_i|
 *   rel_l2  = sqrt(sum_i (ours_i - ref_i)^2 / sum_i ref_i^2)
 * Asserted: both <= 1e-2 at every position against transformers
 * (the bound the fp32-activation path was built to) and against the float64 numpy forward, and argmax
 * equal to the reference's wherever its top-2 gap >= 0.05. Measured: <=
 * 7e-6 (fp32 rounding only), so 1e-4 is asserted as well to catch a
 * regression the loose bound would hide; the int8-activation path is
 * ~0.1 rel_l2 away (printed; test_model.c bounds it against llama.cpp). */
static void test_smollm2_fp32_logits(void **state)
{
    (void)state;
    char *model = path_join("DSQ_MODELS_DIR", "models", "SmolLM2-135M-Instruct.Q4_1.gguf");
    char *tf = path_join("DSQ_SOURCE_ROOT", ".", "tests/golden/smollm2_logits_transformers.txt");
    char *ex = path_join("DSQ_SOURCE_ROOT", ".", "tests/golden/smollm2_logits_exact.txt");
    require_file(model);
    require_file(tf);
    require_file(ex);
    int nv;
    float *lg = run_prompt(model, DSQ_ACT_F32, smol_ids, 8, &nv);
    double rm_tf[8], rl_tf[8], rm_ex[8], rl_ex[8];
    assert_int_equal(smollm2_errors(tf, lg, nv, 8, 0.05, rm_tf, rl_tf), 8);
    assert_int_equal(smollm2_errors(ex, lg, nv, 8, 0.05, rm_ex, rl_ex), 8);
    double worst = 0;
    for (int p = 0; p < 8; p++) {
        print_message("# pos %d vs transformers: rel_max %.2e rel_l2 %.2e; vs float64: "
                      "rel_max %.2e rel_l2 %.2e\n", p, rm_tf[p], rl_tf[p], rm_ex[p], rl_ex[p]);
        worst = fmax(worst, fmax(fmax(rm_tf[p], rl_tf[p]), fmax(rm_ex[p], rl_ex[p])));
    }
    print_message("# smollm2 fp32 activations: worst relative error %.2e (bound 1e-2)\n", worst);
    assert_true(worst <= 1e-2);
    /* and the guard that keeps it exact: fp32 rounding alone stays ~1e-5 */
    assert_true(worst <= 1e-4);
    /* the int8 path on the same prompt, for the record (test_model.c
     * bounds it against llama.cpp) */
    float *lg8 = run_prompt(model, DSQ_ACT_INT8, smol_ids, 8, &nv);
    assert_int_equal(smollm2_errors(tf, lg8, nv, 8, 1e9, rm_tf, rl_tf), 8);
    double worst8 = 0;
    for (int p = 0; p < 8; p++)
        worst8 = fmax(worst8, rl_tf[p]);
    print_message("# smollm2 int8 activations: worst rel_l2 vs transformers %.2e\n", worst8);
    free(lg8);
    free(lg);
    free(model);
    free(tf);
    free(ex);
}

/* An unknown activation dtype is refused with a reason, not a crash. */
static void test_bad_activation_dtype(void **state)
{
    (void)state;
    char *model = path_join("DSQ_MODELS_DIR", "models", "SmolLM2-135M-Instruct.Q4_1.gguf");
    require_file(model);
    char err[512] = "";
    dsq_model_file_t *file = dsq_model_file_open(model, NULL, err, sizeof(err));
    assert_non_null(file);
    dsq_model_opts_t mo = {.activation_dtype = (dsq_act_dtype_t)5};
    assert_null(dsq_model_create(file, &mo, err, sizeof(err)));
    assert_non_null(strstr(err, "activation"));
    dsq_model_file_close(file);
    free(model);
}

/* The tiny GPTQ act-order llama (tests/ref/make_gptq_tiny.py, regenerated
 * into models/gptq-tiny by scripts/test) against transformers on the
 * GPTQ-formula dequantised weights (tests/golden/gptq_tiny_logits.txt),
 * with fp32 activations: |ours - ref| <= 1e-3 * max(1, |ref|) for every
 * logit of the 16 prompt positions (one prefill), and the 16-token greedy
 * continuation (one decode step per token, which exercises the act-order
 * gather at m = 1) identical. The int8-activation path is printed for
 * comparison only. */
static void test_gptq_act_order(void **state)
{
    (void)state;
    char *dir = path_join("DSQ_MODELS_DIR", "models", "gptq-tiny");
    char *st = path_join("DSQ_MODELS_DIR", "models", "gptq-tiny/model.safetensors");
    char *gold = path_join("DSQ_SOURCE_ROOT", ".", "tests/golden/gptq_tiny_logits.txt");
    require_file(st);
    require_file(gold);
    FILE *f = fopen(gold, "r");
    assert_non_null(f);
    static char line[1 << 16];
    static float ref[64][512];
    int32_t pids[64], ref_out[64], got[64];
    int n_p = 0, n_out = 0, n_rows = 0;
    while (fgets(line, sizeof(line), f)) {
        char *s, *end;
        if (strncmp(line, "prompt_ids:", 11) == 0) {
            n_p = parse_ids(line + 11, pids, 64);
        } else if (strncmp(line, "logits:", 7) == 0) {
            int p = (int)strtol(line + 7, &end, 10);
            assert_true(p >= 0 && p < 64);
            s = end;
            for (int i = 0; i < 512; i++) {
                ref[p][i] = strtof(s, &end);
                assert_true(end != s);
                s = end;
            }
            n_rows++;
        } else if (strncmp(line, "output_ids:", 11) == 0) {
            n_out = parse_ids(line + 11, ref_out, 64);
        }
    }
    fclose(f);
    assert_int_equal(n_p, 16);
    assert_int_equal(n_rows, 16);
    assert_int_equal(n_out, 16);
    const dsq_act_dtype_t acts[2] = {DSQ_ACT_F32, DSQ_ACT_INT8};
    for (int a = 0; a < 2; a++) {
        runner_t r;
        runner_open(&r, dir, acts[a]);
        assert_int_equal(r.n_vocab, 512);
        float *lg = malloc((size_t)n_p * 512 * sizeof(float));
        run_tokens(&r, pids, n_p, 0, lg);
        double worst = 0, worst_rel = 0;
        for (int p = 0; p < n_p; p++) {
            double mx = 0, e = 0;
            for (int i = 0; i < 512; i++) {
                double d = fabs((double)lg[p * 512 + i] - ref[p][i]);
                worst = fmax(worst, d / fmax(1.0, fabs((double)ref[p][i])));
                e = fmax(e, d);
                mx = fmax(mx, fabs((double)ref[p][i]));
            }
            worst_rel = fmax(worst_rel, e / mx);
        }
        /* greedy continuation, one decode step per token */
        int pos = n_p;
        int32_t t = (int32_t)argmax(lg + (n_p - 1) * 512, 512);
        int same = 0;
        for (int i = 0; i < n_out; i++) {
            got[i] = t;
            same += got[i] == ref_out[i];
            run_tokens(&r, &t, 1, pos++, lg);
            t = (int32_t)argmax(lg, 512);
        }
        print_message("# gptq act-order tiny, %s activations: max |d|/max(1,|ref|) %.2e, "
                      "max_p max|d|/max|ref| %.2e; greedy %d/%d ids equal\n",
                      a == 0 ? "fp32" : "int8", worst, worst_rel, same, n_out);
        if (acts[a] == DSQ_ACT_F32) {
            assert_true(worst <= 1e-3);
            assert_memory_equal(got, ref_out, (size_t)n_out * sizeof(int32_t));
        }
        free(lg);
        runner_close(&r);
    }
    free(dir);
    free(st);
    free(gold);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_fp32_logits),
        cmocka_unit_test(test_bad_activation_dtype),
        cmocka_unit_test(test_gptq_act_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

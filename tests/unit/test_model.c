/* tests for engine/model/model.c against independent references:
 *  - stories260K (real FP32 llama2.c weights): greedy continuations equal
 *    llama2.c run.c's, token for token ($DSQ_TEST_DATA/models/stories260K/
 *    stories260K.greedy-reference.txt);
 *  - stories260K with RTN INT4 (group 32, k = 172 has a partial group): the
 *    logits stay within a stated bound of the FP32 logits;
 *  - SmolLM2-135M-Instruct Q4_1: greedy continuations equal llama.cpp's
 *    (tests/golden/smollm2_greedy.txt, made by tests/ref/make_smollm2_golden.py);
 *    a differing token is accepted only where llama.cpp's own top-2 logits
 *    were within rounding of each other;
 *  - SmolLM2 logits of the first 8 positions against an exact float64
 *    reference and llama.cpp's (bound explained at test_smollm2_logits).
 * The forward pass is driven directly (model + KV cache, no engine thread),
 * one sequence, prefill then one token per step, as llama.cpp/run.c do. */
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
#include "engine/text/tokenizer.h"
#include "test_common.h"

typedef struct runner {
    dsq_model_file_t *file;
    dsq_model_t *model;
    dsq_kv_cache_t *kv;
    dsq_block_table_t bt;
    int n_vocab;
} runner_t;

static void runner_open_kv(runner_t *r, const char *model, const char *tok,
                           const char *quantize, int group, dsq_kv_dtype_t kvt,
                           int n_blocks)
{
    char err[512] = "";
    memset(r, 0, sizeof(*r));
    r->file = dsq_model_file_open(model, tok, err, sizeof(err));
    if (!r->file)
        fail_msg("open %s: %s", model, err);
    dsq_model_opts_t mo = {.quantize = quantize, .group_size = group};
    r->model = dsq_model_create(r->file, &mo, err, sizeof(err));
    if (!r->model)
        fail_msg("model %s: %s", model, err);
    const dsq_model_config_t *c = dsq_model_config(r->model);
    r->n_vocab = (int)c->n_vocab;
    r->kv = dsq_kv_create((int)c->n_layer, (int)c->n_head_kv, (int)c->head_dim, 16, n_blocks,
                          kvt, err, sizeof(err));
    assert_non_null(r->kv);
    dsq_block_table_init(&r->bt);
}

static void runner_open(runner_t *r, const char *model, const char *tok,
                        const char *quantize, int group)
{
    runner_open_kv(r, model, tok, quantize, group, DSQ_KV_F16, 64);
}

static void runner_close(runner_t *r)
{
    dsq_kv_seq_free(r->kv, &r->bt);
    dsq_block_table_deinit(&r->bt);
    dsq_kv_destroy(r->kv);
    dsq_model_destroy(r->model);
    dsq_model_file_close(r->file);
}

/* Run tokens[0..n) at positions start..start+n-1; logits of the last one
 * (or of all of them when all_logits) into out. */
static void run_tokens(runner_t *r, const int32_t *tokens, int n, int start, bool all_logits,
                       float *out)
{
    assert_int_equal(dsq_kv_seq_reserve(r->kv, &r->bt, start + n), DSQ_OK);
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    int32_t *rs = calloc((size_t)n, sizeof(int32_t));
    int32_t *slot = malloc((size_t)n * sizeof(int32_t));
    int32_t *rows = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        pos[i] = start + i;
        slot[i] = dsq_kv_slot(r->kv, &r->bt, start + i);
        rows[i] = i;
    }
    int32_t last = n - 1;
    dsq_batch_t b = {
        .n_tokens = n, .tokens = tokens, .pos = pos, .row_seq = rs, .slot = slot,
        .n_seqs = 1, .block_tables = r->bt.ids, .max_blocks = r->bt.n,
        .n_logits = all_logits ? n : 1, .logit_rows = all_logits ? rows : &last,
    };
    assert_int_equal(dsq_model_forward(r->model, r->kv, &b, out), DSQ_OK);
    free(pos);
    free(rs);
    free(slot);
    free(rows);
}

/* Greedy: prefill prompt, then n_new tokens; stops early at stop_id >= 0. */
static int greedy(runner_t *r, const int32_t *prompt, int n_prompt, int n_new, int stop_id,
                  int32_t *out, float (*top2)[2])
{
    float *lg = malloc((size_t)r->n_vocab * sizeof(float));
    run_tokens(r, prompt, n_prompt, 0, false, lg);
    int n = 0, pos = n_prompt;
    for (; n < n_new; n++) {
        int t = argmax(lg, r->n_vocab);
        if (top2) {
            float best2 = -INFINITY;
            for (int i = 0; i < r->n_vocab; i++)
                if (i != t && lg[i] > best2)
                    best2 = lg[i];
            top2[n][0] = lg[t];
            top2[n][1] = best2;
        }
        out[n] = t;
        if (t == stop_id) {
            n++;
            break;
        }
        int32_t tt = t;
        run_tokens(r, &tt, 1, pos++, false, lg);
    }
    free(lg);
    dsq_kv_seq_free(r->kv, &r->bt);
    return n;
}

static void test_stories260k_greedy(void **state)
{
    (void)state;
    char *model, *tok;
    stories260k_paths(&model, &tok);
    char *ref = path_join("DSQ_TEST_DATA", "tests/data",
                          "models/stories260K/stories260K.greedy-reference.txt");
    require_file(ref);
    runner_t r;
    runner_open(&r, model, tok, NULL, 0);
    FILE *f = fopen(ref, "r");
    char line[8192], prompt[256] = "";
    int steps = 0, n_cases = 0;
    int32_t pids[512], oids[512];
    int n_p = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "PROMPT ", 7) == 0) {
            char *q1 = strchr(line, '\'');
            char *q2 = q1 ? strchr(q1 + 1, '\'') : NULL;
            assert_non_null(q2);
            snprintf(prompt, sizeof(prompt), "%.*s", (int)(q2 - q1 - 1), q1 + 1);
            steps = atoi(strstr(line, "steps=") + 6);
        } else if (strncmp(line, "PROMPT_IDS", 10) == 0) {
            n_p = parse_ids(line + 10, pids, 512);
            /* our tokenizer must give the same prompt ids */
            const dsq_tokenizer_t *t = dsq_model_file_tokenizer(r.file);
            int32_t *ids = NULL;
            size_t n_ids = 0;
            assert_int_equal(dsq_tokenizer_encode(t, prompt, strlen(prompt), DSQ_TOK_ADD_BOS,
                                                  &ids, &n_ids), 0);
            assert_int_equal((int)n_ids, n_p);
            assert_memory_equal(ids, pids, (size_t)n_p * sizeof(int32_t));
            free(ids);
        } else if (strncmp(line, "OUTPUT_IDS", 10) == 0) {
            int n_o = parse_ids(line + 10, oids, 512);
            /* OUTPUT_IDS = prompt tokens after BOS, then generated ones;
             * steps counts positions incl. BOS; generation stops at BOS. */
            int n_new = steps - n_p + 1;   /* run.c samples at pos n_p-1 .. steps-1 */
            int32_t got[512];
            int n_got = greedy(&r, pids, n_p, n_new, 1, got, NULL);
            int n_ref_gen = n_o - (n_p - 1);
            if (n_got > 0 && got[n_got - 1] == 1)
                n_got--;      /* run.c stops before printing BOS */
            print_message("# stories260K prompt '%s': %d generated, reference %d\n", prompt,
                          n_got, n_ref_gen);
            assert_int_equal(n_got, n_ref_gen);
            assert_memory_equal(got, oids + (n_p - 1), (size_t)n_got * sizeof(int32_t));
            n_cases++;
        }
    }
    fclose(f);
    assert_int_equal(n_cases, 3);
    runner_close(&r);
    free(model);
    free(tok);
    free(ref);
}

/* INT4 RTN (group 32, asymmetric, K = 172 in w2 with a partial last
 * group) against FP32 on stories260K, over a 64-token greedy window.
 * Bound, derived from the quantiser: RTN with s = range/15 per 32 weights
 * errs uniformly in +-s/2, i.e. RMS s/sqrt(12); for roughly Gaussian groups
 * range ~ 4 sigma, so every linear layer's weights carry ~8% relative RMS
 * noise and so does each layer's output. The 35 quantized matmuls of this
 * 5-layer model add independent noise to the residual stream; with the
 * residual carrying the signal forward, the logit error stays of the same
 * order as the per-layer noise. We assert a relative RMS logit error
 * ||dlogits|| / ||logits - mean|| <= 0.20 (2.5x the per-layer figure) over
 * the window (single positions whose FP32 logits are nearly flat can show a
 * larger ratio; DSQ_TEST_VERBOSE=1 prints each) and argmax agreement on
 * >= 85% of positions. The measured values are printed. */
static void test_stories260k_int4(void **state)
{
    (void)state;
    char *model, *tok;
    stories260k_paths(&model, &tok);
    runner_t a, b;
    runner_open(&a, model, tok, NULL, 0);
    runner_open(&b, model, tok, "int4", 32);
    int32_t prompt[64];
    int32_t gen[64];
    int32_t bos = 1;
    prompt[0] = bos;
    int n = greedy(&a, &bos, 1, 63, -1, gen, NULL);
    memcpy(prompt + 1, gen, (size_t)n * sizeof(int32_t));
    int T = 1 + n;
    float *la = malloc((size_t)T * 512 * sizeof(float));
    float *lb = malloc((size_t)T * 512 * sizeof(float));
    run_tokens(&a, prompt, T, 0, true, la);
    run_tokens(&b, prompt, T, 0, true, lb);
    double worst = 0, worst_max = 0, sum_num = 0, sum_den = 0;
    int agree = 0;
    for (int t = 0; t < T; t++) {
        const float *x = la + (size_t)t * 512, *y = lb + (size_t)t * 512;
        double mean = 0, num = 0, den = 0, mx = 0;
        for (int i = 0; i < 512; i++)
            mean += x[i] / 512.0;
        for (int i = 0; i < 512; i++) {
            double dd = (double)x[i] - y[i];
            num += dd * dd;
            den += (x[i] - mean) * (x[i] - mean);
            mx = fmax(mx, fabs(dd));
        }
        if (getenv("DSQ_TEST_VERBOSE"))
            print_message("#   pos %d rel %.4f max %.3f\n", t, sqrt(num / den), mx);
        worst = fmax(worst, sqrt(num / den));
        sum_num += num;
        sum_den += den;
        worst_max = fmax(worst_max, mx);
        agree += argmax(x, 512) == argmax(y, 512);
    }
    double rel = sqrt(sum_num / sum_den);
    print_message("# stories260K int4 g32: relative RMS logit error %.4f over the window "
                  "(worst single position %.4f, max |dlogit| %.3f), argmax agree %d/%d\n",
                  rel, worst, worst_max, agree, T);
    assert_true(rel <= 0.20);
    assert_true(agree * 100 >= T * 85);
    free(la);
    free(lb);
    runner_close(&a);
    runner_close(&b);
    free(model);
    free(tok);
}

static char *golden_path(const char *name)
{
    return path_join("DSQ_SOURCE_ROOT", ".", name);
}

/* Greedy continuations vs llama.cpp. Tolerance (stated in the golden file):
 * ids must match exactly up to the first step where llama.cpp's own top-2
 * logit gap is < 0.25 (first_close_step); at that step any id llama.cpp
 * had within 0.25 of its top logit (close_ids) is accepted, since another
 * fp32 summation order legitimately picks another of them, and later steps
 * are not compared. */
static void test_smollm2_greedy(void **state)
{
    (void)state;
    char *model = path_join("DSQ_MODELS_DIR", "models", "SmolLM2-135M-Instruct.Q4_1.gguf");
    char *gold = golden_path("tests/golden/smollm2_greedy.txt");
    require_file(model);
    require_file(gold);
    runner_t r;
    runner_open(&r, model, NULL, NULL, 0);
    FILE *f = fopen(gold, "r");
    static char line[65536];
    int32_t pids[4096], ref[256], got[256], alt[256], close_ids[64];
    int n_close = 0;
    float top2[256][2];
    int n_p = 0, n_ref = 0, n_cases = 0, n_ties = 0, close_step = -1;
    const char *name = "?";
    static char name_buf[128];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "prompt_name:", 12) == 0) {
            snprintf(name_buf, sizeof(name_buf), "%.127s", line + 13);
            name = name_buf;
        } else if (strncmp(line, "prompt_ids:", 11) == 0) {
            n_p = parse_ids(line + 11, pids, 4096);
        } else if (strncmp(line, "output_ids:", 11) == 0) {
            n_ref = parse_ids(line + 11, ref, 256);
        } else if (strncmp(line, "top2:", 5) == 0) {
            /* items "id1:logit1,id2:logit2"; keep id2 as the accepted alternative */
            char *s = line + 5, *end;
            for (int i = 0; i < n_ref; i++) {
                strtol(s, &end, 10);
                strtof(end + 1, &end);
                alt[i] = (int32_t)strtol(end + 1, &end, 10);
                strtof(end + 1, &end);
                s = end;
            }
        } else if (strncmp(line, "first_close_step:", 17) == 0) {
            close_step = atoi(line + 17);
        } else if (strncmp(line, "close_ids:", 10) == 0) {
            n_close = parse_ids(line + 10, close_ids, 64);
        } else if (strcmp(line, "end") == 0) {
            assert_true(n_p > 0 && n_ref > 0 && close_step >= 0);
            int n = greedy(&r, pids, n_p, n_ref, -1, got, top2);
            assert_int_equal(n, n_ref);
            int first_diff = -1;
            for (int i = 0; i < n; i++)
                if (got[i] != ref[i]) {
                    first_diff = i;
                    break;
                }
            if (first_diff >= 0) {
                print_message("# %s: token %d differs (ours %d, llama.cpp %d, its runner-up %d); "
                              "llama.cpp's first near-tie step %d; our top-2 gap there %.4f\n",
                              name, first_diff, got[first_diff], ref[first_diff],
                              alt[first_diff], close_step,
                              top2[first_diff][0] - top2[first_diff][1]);
                if (first_diff < close_step)
                    fail_msg("%s diverges at token %d, before llama.cpp's first near-tie "
                             "step %d", name, first_diff, close_step);
                /* at the near tie, any id llama.cpp had within the close gap
                 * of its top logit: another fp32 summation order may pick it */
                bool near = false;
                for (int j = 0; j < n_close; j++)
                    near = near || got[first_diff] == close_ids[j];
                if (first_diff == close_step && !near)
                    fail_msg("%s: at the near-tie step %d our token %d is none of "
                             "llama.cpp's near-tied ids (top %d, runner-up %d, %d in all)",
                             name, first_diff, got[first_diff], ref[first_diff],
                             alt[first_diff], n_close);
                n_ties++;
            }
            n_cases++;
            close_step = -1;
            n_close = 0;
        }
    }
    fclose(f);
    print_message("# smollm2 greedy: %d cases, %d identical for all 32 tokens, %d diverged "
                  "at or after a near-tie\n", n_cases, n_cases - n_ties, n_ties);
    assert_true(n_cases >= 5);
    runner_close(&r);
    free(model);
    free(gold);
}

/* Compare the logits of the golden's prompt with ours. Per position p:
 * err[p] = max |ours - ref| over the listed ids (top-32 and a strided
 * subset of 1024), scale[p] = max |ref| over the same ids. Argmax must
 * agree where the reference's top-2 gap >= 0.25. Returns the number of
 * positions. */
static int compare_logits(runner_t *r, const char *gold, double *err, double *scale,
                          float (*subset_out)[1024])
{
    FILE *f = fopen(gold, "r");
    static char line[1 << 20];
    int32_t pids[64];
    int n_p = 0, p = -1, stride = 0, n_pos = 0;
    float *lg = NULL;
    assert_non_null(f);
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#')
            continue;
        char *s, *end;
        if (strncmp(line, "prompt_ids:", 11) == 0) {
            n_p = parse_ids(line + 11, pids, 64);
            lg = malloc((size_t)n_p * (size_t)r->n_vocab * sizeof(float));
            run_tokens(r, pids, n_p, 0, true, lg);
            dsq_kv_seq_free(r->kv, &r->bt);
        } else if (strncmp(line, "subset_stride:", 14) == 0) {
            stride = atoi(line + 14);
        } else if (strncmp(line, "pos:", 4) == 0) {
            p = atoi(line + 4);
            assert_true(lg && p >= 0 && p < n_p && p < 64);
            err[p] = scale[p] = 0;
            n_pos++;
        } else if (strncmp(line, "argmax:", 7) == 0) {
            const float *row = lg + (size_t)p * (size_t)r->n_vocab;
            int id = (int)strtol(line + 7, &end, 10);
            int ours = argmax(row, r->n_vocab);
            float second = -INFINITY;
            for (int i = 0; i < r->n_vocab; i++)
                if (i != id && row[i] > second)
                    second = row[i];
            if (row[id] - second >= 0.25f)
                assert_int_equal(ours, id);
        } else if (strncmp(line, "top32:", 6) == 0 || strncmp(line, "subset:", 7) == 0) {
            const float *row = lg + (size_t)p * (size_t)r->n_vocab;
            bool subset = line[0] == 's';
            s = line + (subset ? 7 : 6);
            for (int i = 0;; i++) {
                long id;
                float v;
                if (subset) {
                    v = strtof(s, &end);
                    if (end == s || i >= 1024)
                        break;
                    id = (long)i * stride;
                    subset_out[p][i] = v;
                } else {
                    id = strtol(s, &end, 10);
                    if (end == s || *end != ':')
                        break;
                    v = strtof(end + 1, &end);
                }
                s = end;
                assert_true(id >= 0 && id < r->n_vocab);
                err[p] = fmax(err[p], fabs((double)row[id] - v));
                scale[p] = fmax(scale[p], fabs((double)v));
            }
        }
    }
    fclose(f);
    free(lg);
    return n_pos;
}

/* Logits of the first 8 positions of a fixed prompt, against two
 * independent references:
 *  - exact: a float64 numpy forward of the dequantized weights
 *    (tests/ref/make_smollm2_exact.py, no activation quantization);
 *  - llama.cpp (tests/golden/smollm2_logits.txt).
 * Both dsq and llama.cpp quantize activations to int8 per 32 values for
 * the Q4_1/Q8_0 dot products (and llama.cpp rounds Q and the attention
 * weights to fp16), which on this model moves logits by up to 1.5 (1.5-7%
 * of the largest logit) away from the exact values: llama.cpp itself is
 * that far from exact. A flat 1e-2 relative bound therefore holds for
 * neither implementation. The bound asserted, over the 8 positions:
 *   max_p max|ours - exact| <= max(1e-2 * max|exact|, 1.5 * max_p max|llama.cpp - exact|)
 * i.e. dsq's worst logit is never more than 1.5x as far from the exact
 * value as llama.cpp's worst (measured on the same 1024 strided ids per
 * position; per position the two rounding noises vary independently), and
 * argmax agrees with both references away from near-ties (gap >= 0.25). */
static void test_smollm2_logits(void **state)
{
    (void)state;
    char *model = path_join("DSQ_MODELS_DIR", "models", "SmolLM2-135M-Instruct.Q4_1.gguf");
    char *gold = golden_path("tests/golden/smollm2_logits.txt");
    char *exact = golden_path("tests/golden/smollm2_logits_exact.txt");
    require_file(model);
    require_file(gold);
    require_file(exact);
    runner_t r;
    runner_open(&r, model, NULL, NULL, 0);
    double e_ex[64], s_ex[64], e_lc[64], s_lc[64];
    static float sub_ex[64][1024], sub_lc[64][1024];
    int n_ex = compare_logits(&r, exact, e_ex, s_ex, sub_ex);
    int n_lc = compare_logits(&r, gold, e_lc, s_lc, sub_lc);
    assert_int_equal(n_ex, 8);
    assert_int_equal(n_lc, 8);
    double ours = 0, theirs = 0, scale = 0;
    for (int p = 0; p < 8; p++) {
        double lc_ex = 0;
        for (int i = 0; i < 1024; i++)
            lc_ex = fmax(lc_ex, fabs((double)sub_lc[p][i] - sub_ex[p][i]));
        print_message("# pos %d: |ours-exact| %.4f (%.4f of max %.2f), |llama.cpp-exact| %.4f, "
                      "|ours-llama.cpp| %.4f\n", p, e_ex[p], e_ex[p] / s_ex[p], s_ex[p], lc_ex,
                      e_lc[p]);
        ours = fmax(ours, e_ex[p]);
        theirs = fmax(theirs, lc_ex);
        scale = fmax(scale, s_ex[p]);
    }
    double bound = fmax(1e-2 * scale, 1.5 * theirs);
    print_message("# smollm2 logits: worst |ours-exact| %.4f, worst |llama.cpp-exact| %.4f, "
                  "bound %.4f\n", ours, theirs, bound);
    assert_true(ours <= bound);
    runner_close(&r);
    free(model);
    free(gold);
    free(exact);
}

/* INT8 KV cache (group 64 along head_dim, fp16 scale and zero per group)
 * against the FP16 cache on SmolLM2 over 256 positions (a 256-token window
 * of the model's own greedy text, evaluated in one prefill so both caches
 * see the same inputs). Bound: each cached value moves by at most s/2 with
 * s = (max - min)/254 of its group (the kernel test checks this). Keys of
 * this model have a few outlier channels (as KIVI, Liu et al. 2024, reports
 * for LLaMA-family keys), so a group's range is set by the outliers and the
 * other 60-odd values get a coarse step; the logits move by 5-6% relative
 * RMS (measured), the same order as the noise int8 activation quantisation
 * already puts on them (llama.cpp's own logits are 3-10% relative L2 from
 * the exact float64 ones, see test_smollm2_logits). We assert the aggregate
 * relative RMS logit error <= 0.10 (that noise level) and argmax agreement
 * on >= 90% of the 256 positions; measured values are printed. */
static void test_smollm2_int8_kv(void **state)
{
    (void)state;
    char *model = path_join("DSQ_MODELS_DIR", "models", "SmolLM2-135M-Instruct.Q4_1.gguf");
    require_file(model);
    runner_t a, b;
    runner_open_kv(&a, model, NULL, NULL, 0, DSQ_KV_F16, 32);
    runner_open_kv(&b, model, NULL, NULL, 0, DSQ_KV_INT8, 32);
    const int T = 256;
    int32_t ids[256];
    const dsq_tokenizer_t *tok = dsq_model_file_tokenizer(a.file);
    const char *text = "Once upon a time, in a small village by the sea, there lived";
    int32_t *p = NULL;
    size_t n_p = 0;
    assert_int_equal(dsq_tokenizer_encode(tok, text, strlen(text), 0, &p, &n_p), 0);
    memcpy(ids, p, n_p * sizeof(int32_t));
    int n = greedy(&a, p, (int)n_p, T - (int)n_p, -1, ids + n_p, NULL);
    assert_int_equal((int)n_p + n, T);
    free(p);
    float *la = malloc((size_t)T * (size_t)a.n_vocab * sizeof(float));
    float *lb = malloc((size_t)T * (size_t)a.n_vocab * sizeof(float));
    run_tokens(&a, ids, T, 0, true, la);
    run_tokens(&b, ids, T, 0, true, lb);
    double sum_num = 0, sum_den = 0, worst = 0;
    int agree = 0;
    for (int t = 0; t < T; t++) {
        const float *x = la + (size_t)t * (size_t)a.n_vocab, *y = lb + (size_t)t * (size_t)a.n_vocab;
        double mean = 0;
        for (int i = 0; i < a.n_vocab; i++)
            mean += x[i];
        mean /= a.n_vocab;
        for (int i = 0; i < a.n_vocab; i++) {
            double d = (double)x[i] - y[i];
            sum_num += d * d;
            sum_den += (x[i] - mean) * (x[i] - mean);
            worst = fmax(worst, fabs(d));
        }
        agree += argmax(x, a.n_vocab) == argmax(y, a.n_vocab);
    }
    double rel = sqrt(sum_num / sum_den);
    print_message("# int8 KV vs fp16 KV over %d positions: relative RMS logit error %.5f, "
                  "max |dlogit| %.4f, argmax agree %d/%d\n", T, rel, worst, agree, T);
    assert_true(rel <= 0.10);
    assert_true(agree * 100 >= T * 90);
    free(la);
    free(lb);
    runner_close(&a);
    runner_close(&b);
    free(model);
}

/* Tiny random-weight Qwen2 (FP32 HF safetensors, QKV bias, untied head)
 * against transformers' Qwen2ForCausalLM (tests/ref/make_qwen2_tiny.py;
 * scripts/test regenerates the weights with numpy before the tests).
 * Tolerance: |ours - ref| <= 1e-3 * max(1, |ref|) for every logit of the 16
 * prompt positions, with FP32 weights, activations and KV cache (what the
 * engine's "auto" KV type picks for an FP32 model; an fp16 cache alone
 * moves these logits by ~1.6e-3), and the greedy continuation identical
 * (its smallest top-2 margin is 0.07). */
static void test_qwen2_tiny(void **state)
{
    (void)state;
    char *dir = path_join("DSQ_MODELS_DIR", "models", "qwen2-tiny");
    char *gold = golden_path("tests/golden/qwen2_tiny_logits.txt");
    char *st = path_join("DSQ_MODELS_DIR", "models", "qwen2-tiny/model.safetensors");
    require_file(st);
    require_file(gold);
    runner_t r;
    runner_open_kv(&r, dir, NULL, NULL, 0, DSQ_KV_F32, 64);
    assert_int_equal(dsq_model_config(r.model)->arch, DSQ_ARCH_QWEN2);
    FILE *f = fopen(gold, "r");
    static char line[1 << 16];
    int32_t pids[64], ref_out[64], got[64];
    int n_p = 0, n_out = 0, n_checked = 0;
    float *lg = NULL;
    double worst = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "prompt_ids:", 11) == 0) {
            n_p = parse_ids(line + 11, pids, 64);
            lg = malloc((size_t)n_p * 512 * sizeof(float));
            run_tokens(&r, pids, n_p, 0, true, lg);
            dsq_kv_seq_free(r.kv, &r.bt);
        } else if (strncmp(line, "logits:", 7) == 0) {
            char *s = line + 7, *end;
            int p = (int)strtol(s, &end, 10);
            assert_true(lg && p >= 0 && p < n_p);
            s = end;
            for (int i = 0; i < 512; i++) {
                float v = strtof(s, &end);
                assert_true(end != s);
                s = end;
                double e = fabs((double)lg[(size_t)p * 512 + i] - v) / fmax(1.0, fabs((double)v));
                worst = fmax(worst, e);
                n_checked++;
            }
        } else if (strncmp(line, "output_ids:", 11) == 0) {
            n_out = parse_ids(line + 11, ref_out, 64);
        }
    }
    fclose(f);
    int n = greedy(&r, pids, n_p, n_out, -1, got, NULL);
    print_message("# qwen2 tiny: %d logits, max |d|/max(1,|ref|) = %.2e (tol 1e-3); greedy %d "
                  "tokens\n", n_checked, worst, n);
    assert_int_equal(n_checked, 16 * 512);
    assert_true(worst <= 1e-3);
    assert_int_equal(n, n_out);
    assert_memory_equal(got, ref_out, (size_t)n_out * sizeof(int32_t));
    free(lg);
    runner_close(&r);
    free(dir);
    free(gold);
    free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k_greedy),
        cmocka_unit_test(test_stories260k_int4),
        cmocka_unit_test(test_smollm2_greedy),
        cmocka_unit_test(test_smollm2_logits),
        cmocka_unit_test(test_smollm2_int8_kv),
        cmocka_unit_test(test_qwen2_tiny),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

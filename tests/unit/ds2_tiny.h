/* Shared by test_deepseek2.c and test_deepseek2_gguf.c: the tiny
 * DeepSeek-V2/V3 golden files (tests/golden/deepseek2_tiny_*_logits.txt,
 * transformers logits and greedy ids made by tests/ref/make_deepseek2_tiny.py)
 * and a one-sequence runner that drives dsq_model_forward directly (model +
 * KV cache, no engine). Header-only (static inline); include after <cmocka.h>.
 * The includer may set quant_group (group size for quantize = "int4"). */
#ifndef DSQ_TEST_DS2_TINY_H
#define DSQ_TEST_DS2_TINY_H

#include <stdbool.h>

#include "engine/common/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "test_common.h"

#define N_VOCAB 512
#define MAX_IDS 64
#define DS2_TINY_HINT "scripts/test makes the tiny models with tests/ref/make_deepseek2_tiny.py " \
                      "and their GGUFs with tests/ref/write_deepseek2_gguf.py"

/* ------------------------------------------------------------ golden file */

typedef struct golden {
    int32_t prompt[MAX_IDS], out[MAX_IDS];
    int n_prompt, n_out;
    float *logits;          /* [n_prompt][N_VOCAB] */
    int n_logit_rows;
} golden_t;

/* Reads tests/golden/deepseek2_tiny_<variant>_logits.txt under
 * DSQ_SOURCE_ROOT: "prompt_ids:", "output_ids:", "n_vocab:" and one
 * "logits: <pos> <N_VOCAB floats>" line per prompt position. Asserts 16
 * prompt ids, one logit row each and a non-empty continuation; the caller
 * frees g->logits. */
static inline void golden_read(golden_t *g, const char *variant)
{
    char rel[128];
    snprintf(rel, sizeof(rel), "tests/golden/deepseek2_tiny_%s_logits.txt", variant);
    char *path = path_join("DSQ_SOURCE_ROOT", ".", rel);
    require_file_hint(path, DS2_TINY_HINT);
    FILE *f = fopen(path, "r");
    static char line[1 << 16];
    memset(g, 0, sizeof(*g));
    g->logits = calloc(MAX_IDS * N_VOCAB, sizeof(float));
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "prompt_ids:", 11) == 0) {
            g->n_prompt = parse_ids(line + 11, g->prompt, MAX_IDS);
        } else if (strncmp(line, "output_ids:", 11) == 0) {
            g->n_out = parse_ids(line + 11, g->out, MAX_IDS);
        } else if (strncmp(line, "n_vocab:", 8) == 0) {
            assert_int_equal(atoi(line + 8), N_VOCAB);
        } else if (strncmp(line, "logits:", 7) == 0) {
            char *s = line + 7, *end;
            int p = (int)strtol(s, &end, 10);
            assert_true(p >= 0 && p < MAX_IDS);
            s = end;
            for (int i = 0; i < N_VOCAB; i++) {
                float v = strtof(s, &end);
                assert_true(end != s);
                s = end;
                g->logits[(size_t)p * N_VOCAB + i] = v;
            }
            g->n_logit_rows++;
        }
    }
    fclose(f);
    free(path);
    assert_int_equal(g->n_prompt, 16);
    assert_int_equal(g->n_logit_rows, g->n_prompt);
    assert_true(g->n_out > 0);
}

/* ------------------------------------------------------------------ runner */

typedef struct runner {
    dsq_model_file_t *file;
    dsq_model_t *model;
    dsq_kv_cache_t *kv;
    dsq_block_table_t bt;
} runner_t;

static int quant_group = 32;   /* group size for quantize = "int4" */

/* Opens rel (path under DSQ_MODELS_DIR of a GGUF file or HF directory) with
 * quantize (NULL or "int4" at quant_group) and a kvt latent cache of 64
 * blocks of 4 tokens; asserts the DeepSeek-2 MLA KV shape. runner_close
 * frees it. */
static inline void runner_open(runner_t *r, const char *rel, const char *quantize,
                               dsq_kv_dtype_t kvt)
{
    char err[512] = "";
    char *dir = path_join("DSQ_MODELS_DIR", "models", rel);
    size_t sl = strlen(dir) + 32;
    char *st = malloc(sl);
    if (!st) {
        fail_msg("out of memory");
        exit(1);    /* not reached: fail_msg does not return (gcc can't tell) */
    }
    snprintf(st, sl, strstr(rel, ".gguf") ? "%s" : "%s/model.safetensors", dir);
    require_file_hint(st, DS2_TINY_HINT);
    memset(r, 0, sizeof(*r));
    r->file = dsq_model_file_open(dir, NULL, err, sizeof(err));
    if (!r->file)
        fail_msg("open %s: %s", dir, err);
    dsq_model_opts_t mo = {.quantize = quantize, .group_size = quant_group};
    r->model = dsq_model_create(r->file, &mo, err, sizeof(err));
    if (!r->model)
        fail_msg("model %s: %s", dir, err);
    const dsq_model_config_t *c = dsq_model_config(r->model);
    assert_int_equal(c->arch, DSQ_ARCH_DEEPSEEK2);
    assert_int_equal(c->n_vocab, N_VOCAB);
    int n_kv_heads, head_dim;
    bool has_v;
    dsq_model_kv_shape(r->model, &n_kv_heads, &head_dim, &has_v);
    assert_int_equal(n_kv_heads, 1);
    assert_int_equal(head_dim, c->kv_lora_rank + c->qk_rope_head_dim);
    assert_false(has_v);
    /* small blocks so a 32-token sequence spans several of them */
    r->kv = dsq_kv_create_ex((int)c->n_layer, n_kv_heads, head_dim, 4, 64, kvt, has_v,
                             err, sizeof(err));
    assert_non_null(r->kv);
    assert_null(dsq_kv_layer(r->kv, 0)->v);
    dsq_block_table_init(&r->bt);
    free(dir);
    free(st);
}

static inline void runner_close(runner_t *r)
{
    dsq_kv_seq_free(r->kv, &r->bt);
    dsq_block_table_deinit(&r->bt);
    dsq_kv_destroy(r->kv);
    dsq_model_destroy(r->model);
    dsq_model_file_close(r->file);
}

/* tokens[0..n) at positions start..; logits of every row (all) or the last. */
static inline void run_tokens(runner_t *r, const int32_t *tokens, int n, int start, bool all,
                              float *out)
{
    assert_int_equal(dsq_kv_seq_reserve(r->kv, &r->bt, start + n), DSQ_OK);
    int32_t pos[MAX_IDS], rs[MAX_IDS], slot[MAX_IDS], rows[MAX_IDS];
    assert_true(n <= MAX_IDS);
    for (int i = 0; i < n; i++) {
        pos[i] = start + i;
        rs[i] = 0;
        slot[i] = dsq_kv_slot(r->kv, &r->bt, start + i);
        rows[i] = i;
    }
    int32_t last = n - 1;
    dsq_batch_t b = {
        .n_tokens = n, .tokens = tokens, .pos = pos, .row_seq = rs, .slot = slot,
        .n_seqs = 1, .block_tables = r->bt.ids, .max_blocks = r->bt.n,
        .n_logits = all ? n : 1, .logit_rows = all ? rows : &last,
    };
    assert_int_equal(dsq_model_forward(r->model, r->kv, &b, out), DSQ_OK);
}

/* Greedy continuation of n_new tokens after a batched prefill. */
static inline void greedy(runner_t *r, const golden_t *g, int n_new, int32_t *got)
{
    float lg[N_VOCAB];
    run_tokens(r, g->prompt, g->n_prompt, 0, false, lg);
    for (int i = 0; i < n_new; i++) {
        int32_t t = argmax(lg, N_VOCAB);
        got[i] = t;
        if (i + 1 < n_new)
            run_tokens(r, &t, 1, g->n_prompt + i, false, lg);
    }
    dsq_kv_seq_free(r->kv, &r->bt);
}

#endif

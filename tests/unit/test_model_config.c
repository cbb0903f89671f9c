/* tests for engine/io/model_config.c: GGUF metadata (the real SmolLM2 file, the
 * llama.cpp vocab-only files, a deepseek2 metadata block written here),
 * the HF config.json files in tests/data/configs/hf (expected numbers typed
 * in from reading those files), inline JSON snippets (AWQ, GPTQ, rope
 * scaling variants, errors) and a llama2.c header. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/io/model_config.h"
#include "test_common.h"

static void gguf_cfg(const char *env, const char *rel, dsq_model_config_t *c,
                     int want_rc)
{
    char *path = data_path(env, rel);
    char err[512] = "";
    dsq_gguf_t *g = dsq_gguf_open(path, err, sizeof(err));
    if (!g)
        fail_msg("%s", err);
    int rc = dsq_model_config_from_gguf(g, c, err, sizeof(err));
    if (rc != want_rc)
        fail_msg("%s: rc %d, want %d (%s)", rel, rc, want_rc, err);
    dsq_gguf_close(g);
    free(path);
}

static void test_gguf_smollm2(void **state)
{
    (void)state;
    dsq_model_config_t c;
    gguf_cfg("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf", &c, 0);
    assert_int_equal(c.arch, DSQ_ARCH_LLAMA);
    assert_string_equal(dsq_arch_name(c.arch), "llama");
    assert_int_equal(c.n_layer, 30);
    assert_int_equal(c.n_embd, 576);
    assert_int_equal(c.n_ff, 1536);
    assert_int_equal(c.n_head, 9);
    assert_int_equal(c.n_head_kv, 3);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.rope_dim, 64);
    assert_int_equal(c.n_vocab, 49152);
    assert_int_equal(c.n_ctx_train, 8192);
    assert_true(c.rope_theta == 100000.0);
    assert_true(fabs(c.rms_eps - 1e-5) < 1e-12);
    assert_true(c.tie_word_embeddings);
    assert_false(c.rope_neox);
    assert_false(c.attn_qkv_bias);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_NONE);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.eos_token_id, 2);
    assert_int_equal(c.ckpt_quant, DSQ_CKPT_QUANT_NONE);
}

static void test_gguf_vocab(void **state)
{
    (void)state;
    dsq_model_config_t c;
    gguf_cfg("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-deepseek-coder.gguf", &c, 0);
    assert_int_equal(c.n_layer, 32);
    assert_int_equal(c.n_embd, 4096);
    assert_int_equal(c.n_ff, 11008);
    assert_int_equal(c.n_head, 32);
    assert_int_equal(c.n_head_kv, 32);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.n_ctx_train, 16384);
    assert_int_equal(c.n_vocab, 32256);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_LINEAR);
    assert_true(c.rope_factor == 4.0);
    assert_true(c.rope_theta == 100000.0);
    assert_true(fabs(c.rms_eps - 1e-6) < 1e-12);
    assert_int_equal(c.bos_token_id, 32013);
    assert_int_equal(c.eos_token_id, 32014);

    gguf_cfg("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-deepseek-llm.gguf", &c, 0);
    assert_int_equal(c.n_layer, 30);
    assert_int_equal(c.n_vocab, 102400);
    assert_int_equal(c.n_ctx_train, 4096);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.bos_token_id, 100000);

    gguf_cfg("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-gpt-2.gguf", &c, DSQ_EUNSUPPORTED);
    gguf_cfg("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-starcoder.gguf", &c, DSQ_EUNSUPPORTED);
}

/* ---- minimal metadata-only GGUF writer ---- */
typedef struct buf {
    uint8_t *b;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->b = realloc(b->b, b->cap);
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf_t *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_u32(buf_t *b, const char *k, uint32_t v)
{
    put_str(b, k);
    put_u32(b, DSQ_GGUF_U32);
    put_u32(b, v);
}
static void kv_f32(buf_t *b, const char *k, float v)
{
    put_str(b, k);
    put_u32(b, DSQ_GGUF_F32);
    put(b, &v, 4);
}
static void kv_str(buf_t *b, const char *k, const char *v)
{
    put_str(b, k);
    put_u32(b, DSQ_GGUF_STRING);
    put_str(b, v);
}
static void kv_bool(buf_t *b, const char *k, bool v)
{
    uint8_t x = v;
    put_str(b, k);
    put_u32(b, DSQ_GGUF_BOOL);
    put(b, &x, 1);
}

/* DeepSeek-V2-Lite as llama.cpp's converter writes it (values from the HF
 * config in tests/data/configs/hf/DeepSeek-V2-Lite-Chat). */
static void test_gguf_deepseek2(void **state)
{
    (void)state;
    buf_t b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 26);
    kv_str(&b, "general.architecture", "deepseek2");
    kv_str(&b, "general.name", "DeepSeek-V2-Lite-Chat");
    kv_u32(&b, "deepseek2.block_count", 27);
    kv_u32(&b, "deepseek2.context_length", 163840);
    kv_u32(&b, "deepseek2.embedding_length", 2048);
    kv_u32(&b, "deepseek2.feed_forward_length", 10944);
    kv_u32(&b, "deepseek2.attention.head_count", 16);
    kv_u32(&b, "deepseek2.attention.head_count_kv", 16);
    kv_f32(&b, "deepseek2.rope.freq_base", 10000.0f);
    kv_f32(&b, "deepseek2.attention.layer_norm_rms_epsilon", 1e-6f);
    kv_u32(&b, "deepseek2.vocab_size", 102400);
    kv_u32(&b, "deepseek2.attention.kv_lora_rank", 512);
    kv_u32(&b, "deepseek2.attention.key_length", 192);
    kv_u32(&b, "deepseek2.attention.value_length", 128);
    kv_u32(&b, "deepseek2.rope.dimension_count", 64);
    kv_u32(&b, "deepseek2.leading_dense_block_count", 1);
    kv_u32(&b, "deepseek2.expert_feed_forward_length", 1408);
    kv_u32(&b, "deepseek2.expert_count", 64);
    kv_u32(&b, "deepseek2.expert_shared_count", 2);
    kv_u32(&b, "deepseek2.expert_used_count", 6);
    kv_f32(&b, "deepseek2.expert_weights_scale", 1.0f);
    kv_bool(&b, "deepseek2.expert_weights_norm", false);
    kv_str(&b, "deepseek2.rope.scaling.type", "yarn");
    kv_f32(&b, "deepseek2.rope.scaling.factor", 40.0f);
    kv_u32(&b, "deepseek2.rope.scaling.original_context_length", 4096);
    kv_f32(&b, "deepseek2.rope.scaling.yarn_log_multiplier", 0.0707f);
    char err[512] = "";
    dsq_gguf_t *g = dsq_gguf_open_buffer(b.b, b.n, "ds2.gguf", err, sizeof(err));
    if (!g)
        fail_msg("%s", err);
    dsq_model_config_t c;
    int rc = dsq_model_config_from_gguf(g, &c, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_int_equal(c.arch, DSQ_ARCH_DEEPSEEK2);
    assert_string_equal(c.name, "DeepSeek-V2-Lite-Chat");
    assert_int_equal(c.n_layer, 27);
    assert_int_equal(c.q_lora_rank, 0);
    assert_int_equal(c.kv_lora_rank, 512);
    assert_int_equal(c.qk_nope_head_dim, 128);
    assert_int_equal(c.qk_rope_head_dim, 64);
    assert_int_equal(c.v_head_dim, 128);
    assert_int_equal(c.head_dim, 192);
    assert_int_equal(c.rope_dim, 64);
    assert_int_equal(c.n_routed_experts, 64);
    assert_int_equal(c.n_shared_experts, 2);
    assert_int_equal(c.n_experts_per_tok, 6);
    assert_int_equal(c.moe_intermediate_size, 1408);
    assert_int_equal(c.first_k_dense_replace, 1);
    assert_false(c.norm_topk_prob);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_YARN);
    assert_true(c.rope_factor == 40.0);
    assert_int_equal(c.rope_orig_ctx, 4096);
    assert_true(fabs(c.yarn_mscale_all_dim - 0.707) < 1e-5);
    assert_false(c.rope_neox);
    assert_string_equal(c.scoring_func, "softmax");
    dsq_gguf_close(g);
    free(b.b);
}

/* qwen2 metadata: neox RoPE and QKV bias; unknown rope scaling rejected */
static void test_gguf_qwen2(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        buf_t b = {0};
        put(&b, "GGUF", 4);
        put_u32(&b, 3);
        put_u64(&b, 0);
        put_u64(&b, variant ? 7 : 6);
        kv_str(&b, "general.architecture", "qwen2");
        kv_u32(&b, "qwen2.block_count", 28);
        kv_u32(&b, "qwen2.embedding_length", 1536);
        kv_u32(&b, "qwen2.attention.head_count", 12);
        kv_u32(&b, "qwen2.attention.head_count_kv", 2);
        kv_u32(&b, "qwen2.vocab_size", 151936);
        if (variant)
            kv_str(&b, "qwen2.rope.scaling.type", "longrope");
        char err[512] = "";
        dsq_gguf_t *g = dsq_gguf_open_buffer(b.b, b.n, "qwen2.gguf", err, sizeof(err));
        if (!g)
            fail_msg("%s", err);
        dsq_model_config_t c;
        int rc = dsq_model_config_from_gguf(g, &c, err, sizeof(err));
        if (variant) {
            assert_int_equal(rc, DSQ_EUNSUPPORTED);
            assert_non_null(strstr(err, "longrope"));
            assert_non_null(strstr(err, "qwen2.gguf"));
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(c.arch, DSQ_ARCH_QWEN2);
            assert_true(c.rope_neox);
            assert_true(c.attn_qkv_bias);
            assert_int_equal(c.head_dim, 128);
            assert_int_equal(c.n_head_kv, 2);
            assert_true(c.rms_eps == 1e-5);   /* GGUF default when absent */
        }
        dsq_gguf_close(g);
        free(b.b);
    }
}

/* A llama metadata block (vocab 100) plus key = val as u32 (key NULL:
 * nothing more); returns dsq_model_config_from_gguf's rc, reason in err. */
static int llama_gguf_with(const char *key, uint32_t val, dsq_model_config_t *c,
                           char *err, size_t err_len)
{
    buf_t b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, key ? 6 : 5);
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 2);
    kv_u32(&b, "llama.embedding_length", 64);
    kv_u32(&b, "llama.attention.head_count", 4);
    kv_u32(&b, "llama.vocab_size", 100);
    if (key)
        kv_u32(&b, key, val);
    dsq_gguf_t *g = dsq_gguf_open_buffer(b.b, b.n, "tiny.gguf", err, err_len);
    if (!g)
        fail_msg("%s", err);
    int rc = dsq_model_config_from_gguf(g, c, err, err_len);
    dsq_gguf_close(g);
    free(b.b);
    return rc;
}

/* rc must be DSQ_EFORMAT and err must hold each of the needles */
static void expect_format(int rc, const char *err, const char *n1, const char *n2)
{
    if (rc != DSQ_EFORMAT)
        fail_msg("rc %d, want DSQ_EFORMAT (err '%s', expected '%s')", rc, err, n1);
    if (!strstr(err, n1) || (n2 && !strstr(err, n2)))
        fail_msg("error '%s' lacks '%s' or '%s'", err, n1, n2 ? n2 : "");
}

/* context_length must be 1..2^24 (missing: 2048); special ids -1 or
 * below the vocabulary size (docs/models.md) */
static void test_gguf_bounds(void **state)
{
    (void)state;
    dsq_model_config_t c;
    char err[512] = "";
    int rc = llama_gguf_with(NULL, 0, &c, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_int_equal(c.n_ctx_train, 2048);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.pad_token_id, -1);
    assert_int_equal(llama_gguf_with("llama.context_length", 1 << 24, &c, err, sizeof(err)), 0);
    assert_int_equal(c.n_ctx_train, 1 << 24);
    rc = llama_gguf_with("llama.context_length", 0, &c, err, sizeof(err));
    expect_format(rc, err, "tiny.gguf", "llama.context_length = 0 ");
    rc = llama_gguf_with("llama.context_length", UINT32_MAX, &c, err, sizeof(err));
    expect_format(rc, err, "tiny.gguf", "llama.context_length = 4294967295 ");
    rc = llama_gguf_with("llama.context_length", (1 << 24) + 1, &c, err, sizeof(err));
    expect_format(rc, err, "llama.context_length = 16777217 ", NULL);

    static const char *const ids[] = {"tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        char want[128];
        assert_int_equal(llama_gguf_with(ids[i], 99, &c, err, sizeof(err)), 0);
        rc = llama_gguf_with(ids[i], 100, &c, err, sizeof(err));
        snprintf(want, sizeof(want), "%s = 100 ", ids[i]);
        expect_format(rc, err, "tiny.gguf", want);
        rc = llama_gguf_with(ids[i], UINT32_MAX, &c, err, sizeof(err));
        snprintf(want, sizeof(want), "%s = 4294967295 ", ids[i]);
        expect_format(rc, err, "tiny.gguf", want);
    }
    assert_int_equal(llama_gguf_with("tokenizer.ggml.padding_token_id", 7, &c, err, sizeof(err)), 0);
    assert_int_equal(c.pad_token_id, 7);
}

static void hf_file(const char *dir, dsq_model_config_t *c)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "configs/hf/%s/config.json", dir);
    char *path = data_path("DSQ_TEST_DATA", rel);
    size_t len;
    char *txt = read_all(path, &len);
    char err[512] = "";
    int rc = dsq_model_config_from_hf_json(txt, len, c, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", rel, err);
    free(txt);
    free(path);
}

static void test_hf_files(void **state)
{
    (void)state;
    dsq_model_config_t c;
    hf_file("deepseek-coder-1.3b-instruct", &c);
    assert_int_equal(c.arch, DSQ_ARCH_LLAMA);
    assert_int_equal(c.n_embd, 2048);
    assert_int_equal(c.n_ff, 5504);
    assert_int_equal(c.n_layer, 24);
    assert_int_equal(c.n_head, 16);
    assert_int_equal(c.n_head_kv, 16);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.n_vocab, 32256);
    assert_int_equal(c.n_ctx_train, 16384);
    assert_true(c.rope_theta == 100000.0);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_LINEAR);
    assert_true(c.rope_factor == 4.0);
    assert_int_equal(c.bos_token_id, 32013);
    assert_int_equal(c.eos_token_id, 32021);
    assert_false(c.tie_word_embeddings);
    assert_true(c.rope_neox);
    assert_false(c.attn_qkv_bias);

    hf_file("deepseek-coder-6.7b-instruct", &c);
    assert_int_equal(c.n_embd, 4096);
    assert_int_equal(c.n_layer, 32);
    assert_int_equal(c.head_dim, 128);

    hf_file("deepseek-llm-7b-chat", &c);
    assert_int_equal(c.n_layer, 30);
    assert_int_equal(c.n_vocab, 102400);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_NONE);
    assert_true(c.rope_theta == 10000.0);

    hf_file("DeepSeek-R1-Distill-Qwen-1.5B", &c);
    assert_int_equal(c.arch, DSQ_ARCH_QWEN2);
    assert_int_equal(c.n_embd, 1536);
    assert_int_equal(c.n_ff, 8960);
    assert_int_equal(c.n_layer, 28);
    assert_int_equal(c.n_head, 12);
    assert_int_equal(c.n_head_kv, 2);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.n_vocab, 151936);
    assert_int_equal(c.n_ctx_train, 131072);
    assert_true(c.attn_qkv_bias);
    assert_true(c.rope_neox);
    assert_int_equal(c.bos_token_id, 151643);

    hf_file("DeepSeek-R1-Distill-Qwen-7B", &c);
    assert_int_equal(c.n_embd, 3584);
    assert_int_equal(c.n_ff, 18944);
    assert_int_equal(c.n_head, 28);
    assert_int_equal(c.n_head_kv, 4);
    assert_int_equal(c.n_vocab, 152064);
    assert_int_equal(c.bos_token_id, 151646);

    hf_file("DeepSeek-V2-Lite-Chat", &c);
    assert_int_equal(c.arch, DSQ_ARCH_DEEPSEEK2);
    assert_int_equal(c.n_embd, 2048);
    assert_int_equal(c.n_ff, 10944);
    assert_int_equal(c.moe_intermediate_size, 1408);
    assert_int_equal(c.n_layer, 27);
    assert_int_equal(c.n_head, 16);
    assert_int_equal(c.n_routed_experts, 64);
    assert_int_equal(c.n_shared_experts, 2);
    assert_int_equal(c.n_experts_per_tok, 6);
    assert_int_equal(c.first_k_dense_replace, 1);
    assert_int_equal(c.moe_layer_freq, 1);
    assert_int_equal(c.q_lora_rank, 0);
    assert_int_equal(c.kv_lora_rank, 512);
    assert_int_equal(c.qk_nope_head_dim, 128);
    assert_int_equal(c.qk_rope_head_dim, 64);
    assert_int_equal(c.v_head_dim, 128);
    assert_int_equal(c.head_dim, 192);
    assert_int_equal(c.rope_dim, 64);
    assert_int_equal(c.n_ctx_train, 163840);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_YARN);
    assert_true(c.rope_factor == 40.0);
    assert_int_equal(c.rope_orig_ctx, 4096);
    assert_true(c.yarn_beta_fast == 32.0);
    assert_true(c.yarn_beta_slow == 1.0);
    assert_true(c.yarn_mscale == 0.707);
    assert_true(c.yarn_mscale_all_dim == 0.707);
    assert_string_equal(c.topk_method, "greedy");
    assert_string_equal(c.scoring_func, "softmax");
    assert_false(c.norm_topk_prob);
    assert_false(c.rope_neox);
    assert_int_equal(c.eos_token_id, 100001);
}

static int hf_str(const char *json, dsq_model_config_t *c, char *err,
                  size_t err_len)
{
    return dsq_model_config_from_hf_json(json, strlen(json), c, err, err_len);
}

#define BASE_LLAMA "\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2," \
                   "\"num_attention_heads\":4,\"vocab_size\":100,\"intermediate_size\":128"

static void test_hf_inline(void **state)
{
    (void)state;
    dsq_model_config_t c;
    char err[512] = "";
    /* defaults */
    assert_int_equal(hf_str("{" BASE_LLAMA "}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.n_head_kv, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.bos_token_id, -1);
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.rms_eps == 1e-6);
    /* explicit head_dim, list eos, attention_bias, llama3 rope scaling */
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"head_dim\":32,\"num_key_value_heads\":2,"
        "\"eos_token_id\":[7,9],\"attention_bias\":true,\"tie_word_embeddings\":true,"
        "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
        "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}",
        &c, err, sizeof(err)), 0);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.n_head_kv, 2);
    assert_int_equal(c.eos_token_id, 7);
    assert_true(c.attn_qkv_bias);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_LLAMA3);
    assert_true(c.rope_factor == 8.0);
    assert_int_equal(c.rope_orig_ctx, 8192);
    /* dynamic */
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2}}",
        &c, err, sizeof(err)), 0);
    assert_int_equal(c.rope_scaling, DSQ_ROPE_SCALING_DYNAMIC);
    assert_true(c.rope_factor == 2.0);
    /* AWQ */
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"quantization_config\":{\"quant_method\":\"awq\","
        "\"bits\":4,\"group_size\":128,\"zero_point\":true,\"version\":\"gemm\"}}",
        &c, err, sizeof(err)), 0);
    assert_int_equal(c.ckpt_quant, DSQ_CKPT_QUANT_AWQ);
    assert_int_equal(c.ckpt_bits, 4);
    assert_int_equal(c.ckpt_group_size, 128);
    assert_true(c.ckpt_zero_point);
    assert_false(c.ckpt_desc_act);
    /* AWQ, old field names */
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"quantization_config\":{\"quant_method\":\"awq\","
        "\"w_bit\":4,\"q_group_size\":64,\"zero_point\":false}}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.ckpt_group_size, 64);
    assert_false(c.ckpt_zero_point);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"quantization_config\":{\"quant_method\":\"awq\","
        "\"bits\":4,\"version\":\"gemv\"}}", &c, err, sizeof(err)), DSQ_EUNSUPPORTED);
    /* GPTQ act-order, asymmetric, per channel */
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"quantization_config\":{\"quant_method\":\"gptq\","
        "\"bits\":4,\"group_size\":-1,\"desc_act\":true,\"sym\":false}}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.ckpt_quant, DSQ_CKPT_QUANT_GPTQ);
    assert_int_equal(c.ckpt_group_size, -1);
    assert_true(c.ckpt_desc_act);
    assert_true(c.ckpt_zero_point);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"quantization_config\":{\"quant_method\":\"gptq\","
        "\"bits\":4,\"group_size\":32,\"desc_act\":false,\"sym\":true}}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.ckpt_group_size, 32);
    assert_false(c.ckpt_desc_act);
    assert_false(c.ckpt_zero_point);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"quantization_config\":{\"quant_method\":\"gptq\","
        "\"bits\":8}}", &c, err, sizeof(err)), DSQ_EUNSUPPORTED);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"quantization_config\":{\"quant_method\":\"fp8\"}}",
        &c, err, sizeof(err)), DSQ_EUNSUPPORTED);
    assert_non_null(strstr(err, "fp8"));
    /* arch from architectures[] */
    assert_int_equal(hf_str("{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.arch, DSQ_ARCH_QWEN2);
    /* errors */
    assert_int_equal(hf_str("{" BASE_LLAMA, &c, err, sizeof(err)), DSQ_EFORMAT);
    assert_int_equal(hf_str("[1,2]", &c, err, sizeof(err)), DSQ_EFORMAT);
    assert_int_equal(hf_str("{\"model_type\":\"mistral\"}", &c, err, sizeof(err)), DSQ_EUNSUPPORTED);
    assert_non_null(strstr(err, "mistral"));
    assert_int_equal(hf_str("{\"model_type\":\"llama\",\"hidden_size\":\"64\",\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"vocab_size\":100}", &c, err, sizeof(err)), DSQ_EFORMAT);
    assert_non_null(strstr(err, "hidden_size"));
    assert_int_equal(hf_str("{\"model_type\":\"llama\",\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"vocab_size\":100}", &c, err, sizeof(err)), DSQ_EFORMAT);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"num_key_value_heads\":3}", &c, err, sizeof(err)), DSQ_EFORMAT);
    assert_non_null(strstr(err, "kv head"));
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"rope_scaling\":{\"type\":\"longrope\"}}", &c, err,
        sizeof(err)), DSQ_EUNSUPPORTED);
    assert_int_equal(dsq_model_config_from_hf_json(NULL, 0, &c, err, sizeof(err)), DSQ_EFORMAT);
}

static void test_hf_bounds(void **state)
{
    (void)state;
    dsq_model_config_t c;
    char err[512] = "";
    /* missing, null: the 2048 default (transformers' LlamaConfig) */
    assert_int_equal(hf_str("{" BASE_LLAMA "}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.n_ctx_train, 2048);
    assert_int_equal(c.pad_token_id, -1);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"max_position_embeddings\":null}", &c, err,
                            sizeof(err)), 0);
    assert_int_equal(c.n_ctx_train, 2048);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"max_position_embeddings\":16777216}", &c, err,
                            sizeof(err)), 0);
    assert_int_equal(c.n_ctx_train, 16777216);
    expect_format(hf_str("{" BASE_LLAMA ",\"max_position_embeddings\":0}", &c, err, sizeof(err)),
                  err, "config.json", "max_position_embeddings = 0 ");
    expect_format(hf_str("{" BASE_LLAMA ",\"max_position_embeddings\":4294967295}", &c, err,
                         sizeof(err)), err, "config.json", "max_position_embeddings = 4294967295 ");
    expect_format(hf_str("{" BASE_LLAMA ",\"max_position_embeddings\":-1}", &c, err, sizeof(err)),
                  err, "max_position_embeddings = -1 ", NULL);
    /* ids: -1 and null are "none"; 99 is the last id of vocab_size 100 */
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"bos_token_id\":99,\"eos_token_id\":[1,99],"
                            "\"pad_token_id\":-1}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.bos_token_id, 99);
    assert_int_equal(c.pad_token_id, -1);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"pad_token_id\":null,\"eos_token_id\":null}",
                            &c, err, sizeof(err)), 0);
    assert_int_equal(hf_str("{" BASE_LLAMA ",\"pad_token_id\":5}", &c, err, sizeof(err)), 0);
    assert_int_equal(c.pad_token_id, 5);
    expect_format(hf_str("{" BASE_LLAMA ",\"bos_token_id\":100}", &c, err, sizeof(err)),
                  err, "config.json", "bos_token_id = 100 ");
    expect_format(hf_str("{" BASE_LLAMA ",\"eos_token_id\":100}", &c, err, sizeof(err)),
                  err, "config.json", "eos_token_id = 100 ");
    expect_format(hf_str("{" BASE_LLAMA ",\"pad_token_id\":100}", &c, err, sizeof(err)),
                  err, "config.json", "pad_token_id = 100 ");
    expect_format(hf_str("{" BASE_LLAMA ",\"eos_token_id\":[2,100]}", &c, err, sizeof(err)),
                  err, "config.json", "eos_token_id[1] = 100 ");
    expect_format(hf_str("{" BASE_LLAMA ",\"bos_token_id\":-2}", &c, err, sizeof(err)),
                  err, "bos_token_id = -2 ", NULL);
}

static void test_llama2c(void **state)
{
    (void)state;
    dsq_model_config_t c;
    char err[256] = "";
    const int32_t hdr[7] = {64, 172, 5, 8, 4, 512, 512};
    assert_int_equal(dsq_model_config_from_llama2c(hdr, &c, err, sizeof(err)), 0);
    assert_int_equal(c.arch, DSQ_ARCH_LLAMA);
    assert_int_equal(c.n_embd, 64);
    assert_int_equal(c.n_ff, 172);
    assert_int_equal(c.n_layer, 5);
    assert_int_equal(c.n_head, 8);
    assert_int_equal(c.n_head_kv, 4);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.n_vocab, 512);
    assert_int_equal(c.n_ctx_train, 512);
    assert_true(c.tie_word_embeddings);
    assert_false(c.rope_neox);
    assert_true(c.rms_eps == 1e-5);
    const int32_t unshared[7] = {64, 172, 5, 8, 4, -512, 512};
    assert_int_equal(dsq_model_config_from_llama2c(unshared, &c, err, sizeof(err)), 0);
    assert_int_equal(c.n_vocab, 512);
    assert_false(c.tie_word_embeddings);
    const int32_t bad[7] = {64, 172, 5, 8, 3, 512, 512};
    assert_int_equal(dsq_model_config_from_llama2c(bad, &c, err, sizeof(err)), DSQ_EFORMAT);
    const int32_t bad2[7] = {64, 172, 0, 8, 4, 512, 512};
    assert_int_equal(dsq_model_config_from_llama2c(bad2, &c, err, sizeof(err)), DSQ_EFORMAT);
    assert_non_null(strstr(err, "n_layers"));
    const int32_t long_ctx[7] = {64, 172, 5, 8, 4, 512, (1 << 24) + 1};
    expect_format(dsq_model_config_from_llama2c(long_ctx, &c, err, sizeof(err)), err,
                  "llama2.c header", "seq_len = 16777217 ");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_smollm2),
        cmocka_unit_test(test_gguf_vocab),
        cmocka_unit_test(test_gguf_deepseek2),
        cmocka_unit_test(test_gguf_qwen2),
        cmocka_unit_test(test_gguf_bounds),
        cmocka_unit_test(test_hf_files),
        cmocka_unit_test(test_hf_inline),
        cmocka_unit_test(test_hf_bounds),
        cmocka_unit_test(test_llama2c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

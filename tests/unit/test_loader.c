/* tests for engine/loader/loader.c and engine/io/llama2c.c: the real SmolLM2 GGUF, a
 * vocab-only GGUF, the real stories260K llama2.c checkpoint (shapes and
 * offsets from tests/data/SOURCES.md section 1, values re-read from the file
 * with stdio), and Hugging Face directories written here (config.json,
 * single and sharded safetensors, tokenizer_config.json chat template). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/io/llama2c.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/io/tensor.h"
#include "engine/text/tokenizer.h"

#include "test_common.h"

static char tmpdir[256];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/dsq_test_loader_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static char *tmp_path(const char *rel)
{
    size_t n = strlen(tmpdir) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", tmpdir, rel);
    return p;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("cannot write %s", path);
    if (n)
        assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static dsq_model_file_t *open_ok(const char *path, const char *tok)
{
    char err[512] = "";
    dsq_model_file_t *f = dsq_model_file_open(path, tok, err, sizeof(err));
    if (!f)
        fail_msg("dsq_model_file_open(%s): %s", path, err);
    return f;
}

static void expect_open_fail(const char *path, const char *tok,
                             const char *needle)
{
    char err[512] = "";
    dsq_model_file_t *f = dsq_model_file_open(path, tok, err, sizeof(err));
    if (f) {
        dsq_model_file_close(f);
        fail_msg("%s opened (expected error with '%s')", path, needle);
    }
    if (!strstr(err, needle))
        fail_msg("error '%s' lacks '%s'", err, needle);
}

/* ---- GGUF ---- */

static void test_gguf_smollm2(void **state)
{
    (void)state;
    char *path = data_path("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    dsq_model_file_t *f = open_ok(path, NULL);
    assert_string_equal(dsq_model_file_format(f), "gguf");
    assert_string_equal(dsq_model_file_path(f), path);
    assert_non_null(dsq_model_file_gguf(f));
    const dsq_model_config_t *c = dsq_model_file_config(f);
    assert_int_equal(c->arch, DSQ_ARCH_LLAMA);
    assert_int_equal(c->n_layer, 30);
    assert_int_equal(dsq_model_file_n_tensors(f), 272);
    const dsq_tensor_t *t = dsq_model_file_find(f, "blk.7.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 1536);
    assert_int_equal(t->ne[1], 576);
    assert_null(dsq_model_file_find(f, "output.weight"));
    assert_null(dsq_model_file_tensor(f, 272));
    const dsq_tokenizer_t *tok = dsq_model_file_tokenizer(f);
    assert_non_null(tok);
    assert_int_equal(dsq_tokenizer_n_vocab(tok), 49152);
    assert_int_equal(dsq_tokenizer_bos(tok), 1);
    assert_int_equal(dsq_tokenizer_eos(tok), 2);
    const char *ct = dsq_model_file_chat_template(f);
    assert_non_null(ct);
    assert_non_null(strstr(ct, "<|im_start|>"));
    dsq_model_file_close(f);
    dsq_model_file_close(NULL);
    free(path);
}

static void test_gguf_vocab_only(void **state)
{
    (void)state;
    char *path = data_path("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-deepseek-coder.gguf");
    dsq_model_file_t *f = open_ok(path, NULL);
    assert_int_equal(dsq_model_file_n_tensors(f), 0);
    assert_null(dsq_model_file_find(f, "token_embd.weight"));
    assert_non_null(dsq_model_file_tokenizer(f));
    assert_int_equal(dsq_tokenizer_n_vocab(dsq_model_file_tokenizer(f)), 32256);
    assert_int_equal(dsq_tokenizer_bos(dsq_model_file_tokenizer(f)), 32013);
    assert_null(dsq_model_file_chat_template(f));
    dsq_model_file_close(f);
    /* tokenizer override from another GGUF */
    char *smol = data_path("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    f = open_ok(smol, path);
    assert_int_equal(dsq_tokenizer_n_vocab(dsq_model_file_tokenizer(f)), 32256);
    assert_int_equal(dsq_model_file_n_tensors(f), 272);
    dsq_model_file_close(f);
    expect_open_fail(smol, "/nonexistent/tok.bin", "/nonexistent/tok.bin");
    free(smol);
    /* an unsupported architecture names the file and the field */
    char *gpt2 = data_path("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-gpt-2.gguf");
    expect_open_fail(gpt2, NULL, "general.architecture 'gpt2'");
    free(gpt2);
    free(path);
}

/* ---- llama2.c ---- */

static float file_float(const char *path, long float_index)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    float v;
    assert_int_equal(fseek(fp, 28 + 4 * float_index, SEEK_SET), 0);
    assert_int_equal(fread(&v, 4, 1, fp), 1);
    fclose(fp);
    return v;
}

static void check_shape(const dsq_model_file_t *f, const char *name,
                        int64_t ne0, int64_t ne1)
{
    const dsq_tensor_t *t = dsq_model_file_find(f, name);
    if (!t)
        fail_msg("tensor %s missing", name);
    assert_int_equal(t->type, DSQ_TYPE_F32);
    if (t->ne[0] != ne0 || t->ne[1] != ne1)
        fail_msg("%s is [%lld, %lld], want [%lld, %lld]", name, (long long)t->ne[0],
                 (long long)t->ne[1], (long long)ne0, (long long)ne1);
    assert_int_equal(t->n_bytes, (size_t)(ne0 * ne1 * 4));
}

static void test_llama2c(void **state)
{
    (void)state;
    char *bin = data_path("DSQ_TEST_DATA", "models/stories260K/stories260K.bin");
    char *tokp = data_path("DSQ_TEST_DATA", "models/stories260K/tok512.bin");
    dsq_model_file_t *f = open_ok(bin, tokp);
    assert_string_equal(dsq_model_file_format(f), "llama2c");
    const dsq_model_config_t *c = dsq_model_file_config(f);
    assert_int_equal(c->n_embd, 64);
    assert_int_equal(c->n_ff, 172);
    assert_int_equal(c->n_layer, 5);
    assert_int_equal(c->n_head, 8);
    assert_int_equal(c->n_head_kv, 4);
    assert_int_equal(c->head_dim, 8);
    assert_int_equal(c->n_vocab, 512);
    assert_int_equal(c->n_ctx_train, 512);
    assert_true(c->tie_word_embeddings);
    assert_false(c->rope_neox);
    assert_true(c->rope_theta == 10000.0);
    assert_int_equal(dsq_model_file_n_tensors(f), 1 + 5 * 9 + 1);
    check_shape(f, "token_embd.weight", 64, 512);
    check_shape(f, "output_norm.weight", 64, 1);
    assert_null(dsq_model_file_find(f, "output.weight"));
    char nm[64];
    for (int l = 0; l < 5; l++) {
        snprintf(nm, sizeof(nm), "blk.%d.attn_norm.weight", l); check_shape(f, nm, 64, 1);
        snprintf(nm, sizeof(nm), "blk.%d.attn_q.weight", l); check_shape(f, nm, 64, 64);
        snprintf(nm, sizeof(nm), "blk.%d.attn_k.weight", l); check_shape(f, nm, 64, 32);
        snprintf(nm, sizeof(nm), "blk.%d.attn_v.weight", l); check_shape(f, nm, 64, 32);
        snprintf(nm, sizeof(nm), "blk.%d.attn_output.weight", l); check_shape(f, nm, 64, 64);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_norm.weight", l); check_shape(f, nm, 64, 1);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_gate.weight", l); check_shape(f, nm, 64, 172);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_down.weight", l); check_shape(f, nm, 172, 64);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_up.weight", l); check_shape(f, nm, 64, 172);
    }
    /* offsets, in floats after the header, from the SOURCES.md layout */
    const long emb = 512 * 64, att = 5 * 64, wq = 5 * 64 * 64, wk = 5 * 32 * 64;
    const long wo = wq, ffn = att, w1 = 5 * 172 * 64;
    struct { const char *name; long off; } probes[] = {
        {"token_embd.weight", 0},
        {"blk.0.attn_norm.weight", emb},
        {"blk.2.attn_norm.weight", emb + 2 * 64},
        {"blk.1.attn_q.weight", emb + att + 64 * 64},
        {"blk.3.attn_k.weight", emb + att + wq + 3 * 32 * 64},
        {"blk.4.attn_v.weight", emb + att + wq + wk + 4 * 32 * 64},
        {"blk.0.attn_output.weight", emb + att + wq + 2 * wk},
        {"blk.4.ffn_norm.weight", emb + att + wq + 2 * wk + wo + 4 * 64},
        {"blk.0.ffn_gate.weight", emb + att + wq + 2 * wk + wo + ffn},
        {"blk.2.ffn_down.weight", emb + att + wq + 2 * wk + wo + ffn + w1 + 2 * 64 * 172},
        {"blk.4.ffn_up.weight", emb + att + wq + 2 * wk + wo + ffn + 2 * w1 + 4 * 172 * 64},
        {"output_norm.weight", emb + att + wq + 2 * wk + wo + ffn + 3 * w1},
    };
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        const dsq_tensor_t *t = dsq_model_file_find(f, probes[i].name);
        float want0 = file_float(bin, probes[i].off);
        float got0;
        memcpy(&got0, t->data, 4);
        if (got0 != want0)
            fail_msg("%s: first float %g, file has %g at float %ld", probes[i].name,
                     (double)got0, (double)want0, probes[i].off);
        long last = (long)(t->n_bytes / 4) - 1;
        float wantl = file_float(bin, probes[i].off + last), gotl;
        memcpy(&gotl, (const uint8_t *)t->data + 4 * last, 4);
        assert_true(gotl == wantl);
    }
    /* RMSNorm gains of a trained model are mostly positive, around 1 */
    const dsq_tensor_t *fin = dsq_model_file_find(f, "output_norm.weight");
    double mean = 0;
    for (int i = 0; i < 64; i++) {
        float v;
        memcpy(&v, (const uint8_t *)fin->data + 4 * i, 4);
        mean += v / 64.0;
    }
    assert_true(mean > 0.2 && mean < 10.0);
    const dsq_tokenizer_t *tok = dsq_model_file_tokenizer(f);
    assert_non_null(tok);
    assert_int_equal(dsq_tokenizer_n_vocab(tok), 512);
    assert_int_equal(dsq_tokenizer_bos(tok), 1);
    dsq_model_file_close(f);

    /* tokenizer found beside the checkpoint (tok512.bin) without a path */
    f = open_ok(bin, NULL);
    assert_non_null(dsq_model_file_tokenizer(f));
    dsq_model_file_close(f);

    /* a truncated copy names the expected size */
    FILE *in = fopen(bin, "rb");
    assert_non_null(in);
    size_t n = 1056540 - 4;
    char *buf = malloc(n);
    assert_int_equal(fread(buf, 1, n, in), n);
    fclose(in);
    char *cut = tmp_path("cut.bin");
    write_file(cut, buf, n);
    expect_open_fail(cut, tokp, "needs 1056540");
    /* unshared classifier: header vocab_size -512 needs 512*64 more floats */
    int32_t neg = -512;
    memcpy(buf + 20, &neg, 4);
    write_file(cut, buf, n);
    expect_open_fail(cut, NULL, "needs 1187612");
    /* a header field of 0 */
    int32_t zero = 0;
    memcpy(buf + 8, &zero, 4);
    write_file(cut, buf, n);
    expect_open_fail(cut, NULL, "n_layers");
    /* huge header values must not overflow into a small expected size
     * (seq_len stays in range: above 2^24 it is refused before that) */
    int32_t hdr[7] = {0x7fffffff, 0x7fffffff, 0x7fffffff, 1, 1, 0x7fffffff, 1 << 24};
    write_file(cut, hdr, sizeof(hdr));
    expect_open_fail(cut, NULL, "needs");
    hdr[6] = 0x7fffffff;
    write_file(cut, hdr, sizeof(hdr));
    expect_open_fail(cut, NULL, "seq_len = 2147483647 is out of range");
    free(cut);
    free(buf);
    free(bin);
    free(tokp);
}

/* ---- Hugging Face directories ---- */

/* tiny safetensors writer: n entries, F16 zeros except a marker value */
typedef struct st_entry {
    const char *name;
    const char *dtype;
    int64_t dims[2];   /* JSON order, dims[1] = 0 for 1-D */
} st_entry_t;

static void write_safetensors(const char *path, const st_entry_t *e, int n)
{
    char header[8192];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(header + hl, sizeof(header) - hl, "{");
    for (int i = 0; i < n; i++) {
        int64_t ne = e[i].dims[0] * (e[i].dims[1] ? e[i].dims[1] : 1);
        size_t sz = (size_t)ne * (strcmp(e[i].dtype, "F32") == 0 || strcmp(e[i].dtype, "I32") == 0 ? 4 : 2);
        if (e[i].dims[1])
            hl += (size_t)snprintf(header + hl, sizeof(header) - hl,
                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                i ? "," : "", e[i].name, e[i].dtype, (long long)e[i].dims[0],
                (long long)e[i].dims[1], off, off + sz);
        else
            hl += (size_t)snprintf(header + hl, sizeof(header) - hl,
                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                i ? "," : "", e[i].name, e[i].dtype, (long long)e[i].dims[0], off, off + sz);
        off += sz;
    }
    hl += (size_t)snprintf(header + hl, sizeof(header) - hl, "}");
    size_t total = 8 + hl + off;
    uint8_t *buf = calloc(1, total);
    uint64_t h64 = hl;
    memcpy(buf, &h64, 8);
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < off; i++)
        buf[8 + hl + i] = (uint8_t)(i * 7 + 1);
    write_file(path, buf, total);
    free(buf);
}

static const char *TINY_CONFIG =
    "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"vocab_size\":16,"
    "\"intermediate_size\":12,\"tie_word_embeddings\":false,\"rms_norm_eps\":1e-5}";

static const st_entry_t TINY[] = {
    {"model.embed_tokens.weight", "F16", {16, 8}},
    {"model.layers.0.input_layernorm.weight", "F32", {8, 0}},
    {"model.layers.0.self_attn.q_proj.weight", "F16", {8, 8}},
    {"model.layers.0.self_attn.k_proj.weight", "BF16", {4, 8}},
    {"model.layers.0.self_attn.v_proj.weight", "F16", {4, 8}},
    {"model.layers.0.self_attn.o_proj.weight", "F16", {8, 8}},
    {"model.layers.0.post_attention_layernorm.weight", "F32", {8, 0}},
    {"model.layers.0.mlp.gate_proj.weight", "F16", {12, 8}},
    {"model.layers.0.mlp.up_proj.weight", "F16", {12, 8}},
    {"model.layers.0.mlp.down_proj.weight", "F16", {8, 12}},
    {"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2, 0}},
    {"model.norm.weight", "F32", {8, 0}},
    {"lm_head.weight", "F16", {16, 8}},
};
#define N_TINY ((int)(sizeof(TINY) / sizeof(TINY[0])))

static char *make_dir(const char *name)
{
    char *d = tmp_path(name);
    assert_int_equal(mkdir(d, 0700), 0);
    return d;
}

static void put_text(const char *dir, const char *file, const char *text)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, file);
    write_file(p, text, strlen(text));
    free(p);
}

static void check_tiny(const dsq_model_file_t *f)
{
    assert_string_equal(dsq_model_file_format(f), "safetensors");
    const dsq_model_config_t *c = dsq_model_file_config(f);
    assert_int_equal(c->n_embd, 8);
    assert_true(c->rope_neox);
    assert_int_equal(dsq_model_file_n_tensors(f), N_TINY - 1);  /* inv_freq skipped */
    const dsq_tensor_t *t = dsq_model_file_find(f, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, DSQ_TYPE_F16);
    assert_int_equal(t->ne[0], 8);
    assert_int_equal(t->ne[1], 16);
    t = dsq_model_file_find(f, "blk.0.attn_k.weight");
    assert_non_null(t);
    assert_int_equal(t->type, DSQ_TYPE_BF16);
    assert_int_equal(t->ne[0], 8);
    assert_int_equal(t->ne[1], 4);
    t = dsq_model_file_find(f, "blk.0.ffn_down.weight");
    assert_int_equal(t->ne[0], 12);
    assert_int_equal(t->ne[1], 8);
    static const char *const names[] = {"blk.0.attn_norm.weight", "blk.0.attn_q.weight",
        "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
        "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "output_norm.weight", "output.weight"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!dsq_model_file_find(f, names[i]))
            fail_msg("%s missing", names[i]);
}

static void test_hf_single(void **state)
{
    (void)state;
    char *d = make_dir("hf1");
    put_text(d, "config.json", TINY_CONFIG);
    put_text(d, "tokenizer_config.json",
             "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},"
             "{\"name\":\"default\",\"template\":\"{{ messages }}\"}]}");
    char *st = tmp_path("hf1/model.safetensors");
    write_safetensors(st, TINY, N_TINY);
    dsq_model_file_t *f = open_ok(d, NULL);
    check_tiny(f);
    assert_null(dsq_model_file_tokenizer(f));   /* no tokenizer.json */
    assert_null(dsq_model_file_gguf(f));
    assert_string_equal(dsq_model_file_chat_template(f), "{{ messages }}");
    dsq_model_file_close(f);
    /* HF tokenizer given as a directory */
    char *tokdir = data_path("DSQ_TEST_DATA", "tokenizers/deepseek-v3");
    f = open_ok(d, tokdir);
    assert_non_null(dsq_model_file_tokenizer(f));
    assert_int_equal(dsq_tokenizer_bos(dsq_model_file_tokenizer(f)), 0);
    dsq_model_file_close(f);
    free(tokdir);
    /* the .safetensors path itself works too */
    f = open_ok(st, NULL);
    check_tiny(f);
    /* activation types (model.h): a file storing a bf16 tensor gets bf16 on
     * a device under auto; the host computes in fp32 and refuses narrow */
    dsq_ftype_t at = (dsq_ftype_t)9;
    char why[256] = "";
    assert_int_equal(dsq_model_act_type(f, NULL, false, &at, why, sizeof(why)), DSQ_OK);
    assert_int_equal(at, DSQ_FT_BF16);
    assert_int_equal(dsq_model_act_type(f, "auto", true, &at, why, sizeof(why)), DSQ_OK);
    assert_int_equal(at, DSQ_FT_F32);
    assert_int_equal(dsq_model_act_type(f, "half", false, &at, why, sizeof(why)), DSQ_OK);
    assert_int_equal(at, DSQ_FT_F16);
    assert_int_equal(dsq_model_act_type(f, "float", true, &at, why, sizeof(why)), DSQ_OK);
    assert_int_equal(at, DSQ_FT_F32);
    assert_int_equal(dsq_model_act_type(f, "bfloat16", true, &at, why, sizeof(why)),
                     DSQ_EINVAL);
    assert_non_null(strstr(why, "needs a device backend"));
    assert_int_equal(dsq_model_act_type(f, "fp8", false, &at, why, sizeof(why)), DSQ_EINVAL);
    assert_non_null(strstr(why, "unknown dtype 'fp8'"));
    dsq_model_file_close(f);

    /* untied config without lm_head */
    write_safetensors(st, TINY, N_TINY - 1);
    expect_open_fail(d, NULL, "'output.weight' missing");
    /* embedding shape against the config */
    put_text(d, "config.json",
             "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1,"
             "\"num_attention_heads\":2,\"vocab_size\":17,\"tie_word_embeddings\":true}");
    expect_open_fail(d, NULL, "n_vocab=17");
    /* bad config */
    put_text(d, "config.json", "{\"model_type\":\"gpt2\"}");
    expect_open_fail(d, NULL, "config.json");
    free(st);
    free(d);
}

static void test_hf_sharded(void **state)
{
    (void)state;
    char *d = make_dir("hf2");
    put_text(d, "config.json", TINY_CONFIG);
    char *s1 = tmp_path("hf2/model-00001-of-00002.safetensors");
    char *s2 = tmp_path("hf2/model-00002-of-00002.safetensors");
    write_safetensors(s1, TINY, 6);
    write_safetensors(s2, TINY + 6, N_TINY - 6);
    char idx[8192];
    size_t n = (size_t)snprintf(idx, sizeof(idx), "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < N_TINY; i++)
        n += (size_t)snprintf(idx + n, sizeof(idx) - n, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"",
                              i ? "," : "", TINY[i].name, i < 6 ? 1 : 2);
    snprintf(idx + n, sizeof(idx) - n, "}}");
    put_text(d, "model.safetensors.index.json", idx);
    dsq_model_file_t *f = open_ok(d, NULL);
    check_tiny(f);
    dsq_model_file_close(f);

    /* a weight_map entry pointing at the wrong shard */
    char bad[8192];
    snprintf(bad, sizeof(bad), "{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}");
    put_text(d, "model.safetensors.index.json", bad);
    expect_open_fail(d, NULL, "'model.norm.weight' mapped to model-00001-of-00002.safetensors");
    /* path traversal in a shard name */
    put_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"../evil.safetensors\"}}");
    expect_open_fail(d, NULL, "not a plain file name");
    /* missing shard file */
    put_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"nope.safetensors\"}}");
    expect_open_fail(d, NULL, "nope.safetensors");
    free(s1);
    free(s2);
    free(d);
}

static void test_canonical_names(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
        {"model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias"},
        {"model.layers.12.self_attn.o_proj.weight", "blk.12.attn_output.weight"},
        {"model.layers.3.self_attn.k_proj.qweight", "blk.3.attn_k.qweight"},
        {"model.layers.3.self_attn.v_proj.qzeros", "blk.3.attn_v.qzeros"},
        {"model.layers.3.mlp.down_proj.scales", "blk.3.ffn_down.scales"},
        {"model.layers.3.mlp.up_proj.g_idx", "blk.3.ffn_up.g_idx"},
        {"model.layers.1.input_layernorm.weight", "blk.1.attn_norm.weight"},
        {"model.layers.1.post_attention_layernorm.weight", "blk.1.ffn_norm.weight"},
        {"model.layers.5.self_attn.q_a_proj.weight", "blk.5.attn_q_a.weight"},
        {"model.layers.5.self_attn.q_a_layernorm.weight", "blk.5.attn_q_a_norm.weight"},
        {"model.layers.5.self_attn.q_b_proj.weight", "blk.5.attn_q_b.weight"},
        {"model.layers.5.self_attn.kv_a_proj_with_mqa.weight", "blk.5.attn_kv_a_mqa.weight"},
        {"model.layers.5.self_attn.kv_a_layernorm.weight", "blk.5.attn_kv_a_norm.weight"},
        {"model.layers.5.self_attn.kv_b_proj.weight", "blk.5.attn_kv_b.weight"},
        {"model.layers.5.mlp.gate.weight", "blk.5.ffn_gate_inp.weight"},
        {"model.layers.5.mlp.gate.e_score_correction_bias", "blk.5.exp_probs_b.bias"},
        {"model.layers.5.mlp.experts.63.gate_proj.weight", "blk.5.ffn_gate.63.weight"},
        {"model.layers.5.mlp.experts.0.down_proj.qweight", "blk.5.ffn_down.0.qweight"},
        {"model.layers.5.mlp.shared_experts.up_proj.weight", "blk.5.ffn_up_shexp.weight"},
    };
    char out[128];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = dsq_loader_canonical_name(cases[i][0], out, sizeof(out));
        if (rc != 0 || strcmp(out, cases[i][1]) != 0)
            fail_msg("%s -> rc %d '%s', want '%s'", cases[i][0], rc, rc ? "" : out, cases[i][1]);
    }
    static const char *const unknown[] = {
        "model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.x.mlp.gate_proj.weight",
        "model.layers.0.mlp.gate_proj.foo", "model.layers.0.mlp.experts.a.gate_proj.weight",
        "model.layers.0", "transformer.h.0.attn.c_attn.weight", "model.layers.0.mlp.gate",
    };
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++)
        assert_int_equal(dsq_loader_canonical_name(unknown[i], out, sizeof(out)), DSQ_ENOTFOUND);
    assert_int_equal(dsq_loader_canonical_name("model.layers.0.mlp.up_proj.weight", out, 8), DSQ_ERANGE);
    assert_int_equal(dsq_loader_canonical_name(NULL, out, 8), DSQ_EINVAL);
}

static void test_bad_paths(void **state)
{
    (void)state;
    expect_open_fail("/nonexistent/m.gguf", NULL, "/nonexistent/m.gguf");
    char *p = tmp_path("x.onnx");
    write_file(p, "abcd", 4);
    expect_open_fail(p, NULL, "unknown model format");
    free(p);
    p = tmp_path("bad.gguf");
    write_file(p, "GGUX\3\0\0\0", 8);
    expect_open_fail(p, NULL, "magic");
    free(p);
    char *d = make_dir("empty");
    expect_open_fail(d, NULL, "config.json");
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_smollm2),
        cmocka_unit_test(test_gguf_vocab_only),
        cmocka_unit_test(test_llama2c),
        cmocka_unit_test(test_hf_single),
        cmocka_unit_test(test_hf_sharded),
        cmocka_unit_test(test_canonical_names),
        cmocka_unit_test(test_bad_paths),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}

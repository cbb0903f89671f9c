/* tests for engine/io/gguf.c and engine/io/tensor.c: the real SmolLM2 Q4_1 GGUF and
 * llama.cpp's vocab-only GGUFs (expected values from the task brief and
 * tests/data/SOURCES.md, read independently with a Python parser), and a
 * small GGUF written here byte by byte, then truncated and corrupted. */
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
#include "engine/io/tensor.h"

#include "test_common.h"

/* ---- helpers ---- */

static dsq_gguf_t *open_ok(const char *path)
{
    char err[512] = "";
    dsq_gguf_t *g = dsq_gguf_open(path, err, sizeof(err));
    if (!g)
        fail_msg("dsq_gguf_open(%s): %s", path, err);
    return g;
}

/* growing byte buffer for the hand-written GGUF */
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
static void put_pad(buf_t *b, size_t align)
{
    while (b->n % align)
        put(b, "\0", 1);
}

/* positions of the fields the corruption tests patch */
typedef struct layout {
    size_t version, n_tensors, key2, str_len, arr_len, name_b, ndims_a,
        ne0_a, ne1_a, type_a, off_b, data;
} layout_t;

/* Two tensors: "a" F32 [4,2] at 0 (32 bytes) and "b" Q8_0 [32] at 32 (34). */
static buf_t make_gguf(layout_t *L)
{
    buf_t b = {0};
    put(&b, "GGUF", 4);
    L->version = b.n;
    put_u32(&b, 3);
    L->n_tensors = b.n;
    put_u64(&b, 2);
    put_u64(&b, 8);                       /* kv count */
    put_str(&b, "general.architecture");
    put_u32(&b, DSQ_GGUF_STRING);
    L->str_len = b.n;
    put_str(&b, "llama");
    put_str(&b, "test.k1");
    put_u32(&b, DSQ_GGUF_U32);
    put_u32(&b, 7);
    L->key2 = b.n;
    put_str(&b, "test.k2");
    put_u32(&b, DSQ_GGUF_F32);
    float f = 0.5f;
    put(&b, &f, 4);
    put_str(&b, "test.bool");
    put_u32(&b, DSQ_GGUF_BOOL);
    put(&b, "\1", 1);
    put_str(&b, "test.u8s");
    put_u32(&b, DSQ_GGUF_ARRAY);
    put_u32(&b, DSQ_GGUF_U8);
    L->arr_len = b.n;
    put_u64(&b, 3);
    put(&b, "\1\2\3", 3);
    put_str(&b, "test.strs");
    put_u32(&b, DSQ_GGUF_ARRAY);
    put_u32(&b, DSQ_GGUF_STRING);
    put_u64(&b, 3);
    put_str(&b, "a");
    put_str(&b, "");
    put_str(&b, "xyz");
    put_str(&b, "test.nested");          /* [[1,2],[3]] of i32 */
    put_u32(&b, DSQ_GGUF_ARRAY);
    put_u32(&b, DSQ_GGUF_ARRAY);
    put_u64(&b, 2);
    put_u32(&b, DSQ_GGUF_I32);
    put_u64(&b, 2);
    put_u32(&b, 1);
    put_u32(&b, 2);
    put_u32(&b, DSQ_GGUF_I32);
    put_u64(&b, 1);
    put_u32(&b, 3);
    put_str(&b, "test.i64");
    put_u32(&b, DSQ_GGUF_I64);
    put_u64(&b, (uint64_t)-5);
    /* tensor infos */
    put_str(&b, "a");
    L->ndims_a = b.n;
    put_u32(&b, 2);
    L->ne0_a = b.n;
    put_u64(&b, 4);
    L->ne1_a = b.n;
    put_u64(&b, 2);
    L->type_a = b.n;
    put_u32(&b, DSQ_TYPE_F32);
    put_u64(&b, 0);
    L->name_b = b.n + 8;
    put_str(&b, "b");
    put_u32(&b, 1);
    put_u64(&b, 32);
    put_u32(&b, DSQ_TYPE_Q8_0);
    L->off_b = b.n;
    put_u64(&b, 32);
    put_pad(&b, 32);
    L->data = b.n;
    for (int i = 0; i < 8; i++) {
        float v = (float)i + 0.25f;
        put(&b, &v, 4);
    }
    uint16_t d = dsq_fp32_to_fp16(2.0f);
    put(&b, &d, 2);
    for (int i = 0; i < 32; i++) {
        int8_t q = (int8_t)(i - 16);
        put(&b, &q, 1);
    }
    return b;
}

static char tmpdir[256];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/dsq_test_gguf_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (n)
        assert_int_equal(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

/* Write bytes to a temp file and open; returns the reader or NULL with err. */
static dsq_gguf_t *open_bytes(const uint8_t *p, size_t n, char *err,
                              size_t err_len)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/t.gguf", tmpdir);
    write_file(path, p, n);
    return dsq_gguf_open(path, err, err_len);
}

static void expect_fail(const buf_t *b, const char *needle)
{
    char err[512] = "";
    dsq_gguf_t *g = open_bytes(b->b, b->n, err, sizeof(err));
    if (g) {
        dsq_gguf_close(g);
        fail_msg("corrupt file opened (expected error containing '%s')", needle);
    }
    if (!strstr(err, needle))
        fail_msg("error '%s' does not contain '%s'", err, needle);
    if (!strstr(err, "t.gguf"))
        fail_msg("error '%s' does not name the file", err);
}

/* ---- tensor.c ---- */

static void test_types(void **state)
{
    (void)state;
    size_t n = 0;
    assert_string_equal(dsq_type_name(DSQ_TYPE_Q4_1), "Q4_1");
    assert_string_equal(dsq_type_name((dsq_type_t)4), "?");
    assert_int_equal(dsq_type_block_elems(DSQ_TYPE_Q4_K), 256);
    assert_int_equal(dsq_type_block_bytes(DSQ_TYPE_Q4_K), 144);
    assert_int_equal(dsq_type_block_bytes(DSQ_TYPE_Q4_0), 18);
    assert_int_equal(dsq_type_block_bytes(DSQ_TYPE_Q4_1), 20);
    assert_int_equal(dsq_type_block_bytes(DSQ_TYPE_Q8_0), 34);
    assert_int_equal(dsq_type_block_bytes(DSQ_TYPE_Q6_K), 210);
    assert_int_equal(dsq_type_bytes(DSQ_TYPE_Q8_0, 576 * 49152, &n), 0);
    assert_int_equal(n, 576u * 49152u / 32u * 34u);
    assert_int_equal(dsq_type_bytes(DSQ_TYPE_Q8_0, 33, &n), DSQ_EINVAL);
    assert_int_equal(dsq_type_bytes(DSQ_TYPE_F32, INT64_MAX, &n), DSQ_ERANGE);
    assert_int_equal(dsq_type_bytes((dsq_type_t)99, 1, &n), DSQ_EINVAL);
    assert_int_equal(dsq_type_bytes(DSQ_TYPE_F32, -1, &n), DSQ_EINVAL);
}

static void test_fp16(void **state)
{
    (void)state;
    /* reference bit patterns from IEEE 754 binary16 */
    assert_int_equal(dsq_fp32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(dsq_fp32_to_fp16(-2.0f), 0xc000);
    assert_int_equal(dsq_fp32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(dsq_fp32_to_fp16(65520.0f), 0x7c00);      /* ties to inf */
    assert_int_equal(dsq_fp32_to_fp16(65519.0f), 0x7bff);
    assert_int_equal(dsq_fp32_to_fp16(5.9604645e-8f), 0x0001);  /* 2^-24 */
    assert_int_equal(dsq_fp32_to_fp16(2.9802322e-8f), 0x0000);  /* 2^-25 tie->0 */
    assert_int_equal(dsq_fp32_to_fp16(6.1035156e-5f), 0x0400);  /* 2^-14 */
    assert_int_equal(dsq_fp32_to_fp16(1.0f + 1.0f / 2048.0f), 0x3c00); /* tie even */
    assert_int_equal(dsq_fp32_to_fp16(1.0f + 3.0f / 2048.0f), 0x3c02);
    assert_int_equal(dsq_fp32_to_fp16(INFINITY), 0x7c00);
    assert_true((dsq_fp32_to_fp16(NAN) & 0x7fff) > 0x7c00);
    assert_true(dsq_fp16_to_fp32(0x3c00) == 1.0f);
    assert_true(dsq_fp16_to_fp32(0x0001) == 5.9604645e-8f);
    assert_true(dsq_fp16_to_fp32(0x03ff) == 6.0975552e-5f);
    assert_true(dsq_fp16_to_fp32(0xfbff) == -65504.0f);
    assert_true(isinf(dsq_fp16_to_fp32(0x7c00)));
    assert_true(isnan(dsq_fp16_to_fp32(0x7e00)));
    /* round trip of every finite half */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        assert_int_equal(dsq_fp32_to_fp16(dsq_fp16_to_fp32((uint16_t)h)), h);
    }
    assert_int_equal(dsq_fp32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(dsq_fp32_to_bf16(1.00390625f), 0x3f80);    /* tie even */
    assert_int_equal(dsq_fp32_to_bf16(1.01171875f), 0x3f82);    /* tie up */
    assert_true(dsq_bf16_to_fp32(0xc040) == -3.0f);
    assert_true(isnan(dsq_bf16_to_fp32(dsq_fp32_to_bf16(NAN))));
}

/* ---- real files ---- */

static void test_smollm2(void **state)
{
    (void)state;
    char *path = data_path("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    dsq_gguf_t *g = open_ok(path);
    assert_int_equal(dsq_gguf_version(g), 3);
    assert_int_equal(dsq_gguf_alignment(g), 32);
    assert_int_equal(dsq_gguf_n_tensors(g), 272);
    int n_q41 = 0, n_f32 = 0, n_q80 = 0;
    for (int i = 0; i < dsq_gguf_n_tensors(g); i++) {
        const dsq_tensor_t *t = dsq_gguf_tensor(g, i);
        n_q41 += t->type == DSQ_TYPE_Q4_1;
        n_f32 += t->type == DSQ_TYPE_F32;
        n_q80 += t->type == DSQ_TYPE_Q8_0;
        assert_ptr_equal(dsq_gguf_find_tensor(g, t->name), t);
    }
    assert_int_equal(n_q41, 210);
    assert_int_equal(n_f32, 61);
    assert_int_equal(n_q80, 1);
    const dsq_tensor_t *te = dsq_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(te);
    assert_int_equal(te->type, DSQ_TYPE_Q8_0);
    assert_int_equal(te->n_dims, 2);
    assert_int_equal(te->ne[0], 576);
    assert_int_equal(te->ne[1], 49152);
    assert_int_equal(te->n_bytes, 576u * 49152u / 32u * 34u);
    assert_null(dsq_gguf_find_tensor(g, "output.weight"));
    assert_null(dsq_gguf_find_tensor(g, "nope"));
    const dsq_tensor_t *q = dsq_gguf_find_tensor(g, "blk.0.attn_q.weight");
    assert_non_null(q);
    assert_int_equal(q->type, DSQ_TYPE_Q4_1);
    assert_int_equal(q->ne[0], 576);
    assert_int_equal(q->ne[1], 576);
    const dsq_tensor_t *k = dsq_gguf_find_tensor(g, "blk.29.attn_k.weight");
    assert_non_null(k);
    assert_int_equal(k->ne[1], 192);   /* 3 kv heads x 64 */

    size_t slen;
    const char *arch = dsq_gguf_get_str(g, "general.architecture", &slen);
    assert_non_null(arch);
    assert_int_equal(slen, 5);
    assert_memory_equal(arch, "llama", 5);
    assert_int_equal(dsq_gguf_get_int(g, "llama.block_count", -1), 30);
    assert_int_equal(dsq_gguf_get_int(g, "llama.embedding_length", -1), 576);
    assert_int_equal(dsq_gguf_get_int(g, "llama.attention.head_count", -1), 9);
    assert_int_equal(dsq_gguf_get_int(g, "llama.attention.head_count_kv", -1), 3);
    assert_true(dsq_gguf_get_float(g, "llama.rope.freq_base", 0) == 100000.0);
    assert_int_equal(dsq_gguf_get_int(g, "no.such.key", -7), -7);
    assert_null(dsq_gguf_get_str(g, "llama.block_count", NULL));
    dsq_gguf_vtype_t et;
    assert_int_equal(dsq_gguf_arr_n(g, "tokenizer.ggml.tokens", &et), 49152);
    assert_int_equal(et, DSQ_GGUF_STRING);
    assert_int_equal(dsq_gguf_arr_n(g, "tokenizer.ggml.merges", &et), 48900);
    assert_null(dsq_gguf_arr_data(g, "tokenizer.ggml.tokens"));
    assert_null(dsq_gguf_arr_str(g, "tokenizer.ggml.tokens", 49152, NULL));
    /* the last token string must end inside the file and be non-empty */
    const char *s = dsq_gguf_arr_str(g, "tokenizer.ggml.tokens", 49151, &slen);
    assert_non_null(s);
    assert_true(slen > 0);
    /* all tensor data lies in the data section */
    size_t data0 = dsq_gguf_data_offset(g);
    assert_int_equal(data0 % 32, 0);
    for (int i = 0; i < dsq_gguf_n_tensors(g); i++) {
        const dsq_tensor_t *t = dsq_gguf_tensor(g, i);
        assert_true(t->n_bytes > 0);
        assert_true((uintptr_t)t->data % 32 == 0);
    }
    dsq_gguf_close(g);
    free(path);
}

typedef struct vocab_case {
    const char *file, *arch, *model, *pre;
    int64_t block_count, n_tokens, n_merges, bos, eos;
} vocab_case_t;

static void test_vocab_files(void **state)
{
    (void)state;
    static const vocab_case_t cases[] = {
        {"ggml-vocab-deepseek-coder.gguf", "llama", "gpt2", "deepseek-coder", 32, 32256, 31757, 32013, 32014},
        {"ggml-vocab-deepseek-llm.gguf", "llama", "gpt2", "deepseek-llm", 30, 102400, 99757, 100000, 100001},
        {"ggml-vocab-gpt-2.gguf", "gpt2", "gpt2", "gpt-2", 12, 50257, 50000, 50256, 50256},
        {"ggml-vocab-llama-spm.gguf", "llama", "llama", "default", 32, 32000, -1, 1, 2},
        {"ggml-vocab-starcoder.gguf", "starcoder2", "gpt2", "starcoder", 30, 49152, 48872, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const vocab_case_t *c = &cases[i];
        char rel[256];
        snprintf(rel, sizeof(rel), "vocab/llama.cpp/%s", c->file);
        char *path = data_path("DSQ_TEST_DATA", rel);
        dsq_gguf_t *g = open_ok(path);
        size_t len;
        const char *s;
        char key[128];
        assert_int_equal(dsq_gguf_version(g), 3);
        assert_int_equal(dsq_gguf_n_tensors(g), 0);
        s = dsq_gguf_get_str(g, "general.architecture", &len);
        assert_non_null(s);
        assert_int_equal(len, strlen(c->arch));
        assert_memory_equal(s, c->arch, len);
        s = dsq_gguf_get_str(g, "tokenizer.ggml.model", &len);
        assert_non_null(s);
        assert_int_equal(len, strlen(c->model));
        assert_memory_equal(s, c->model, len);
        s = dsq_gguf_get_str(g, "tokenizer.ggml.pre", &len);
        assert_non_null(s);
        assert_int_equal(len, strlen(c->pre));
        assert_memory_equal(s, c->pre, len);
        snprintf(key, sizeof(key), "%s.block_count", c->arch);
        assert_int_equal(dsq_gguf_get_int(g, key, -1), c->block_count);
        assert_int_equal(dsq_gguf_arr_n(g, "tokenizer.ggml.tokens", NULL), c->n_tokens);
        assert_int_equal(dsq_gguf_arr_n(g, "tokenizer.ggml.merges", NULL), c->n_merges);
        assert_int_equal(dsq_gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1), c->bos);
        assert_int_equal(dsq_gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1), c->eos);
        if (strcmp(c->model, "llama") == 0) {
            dsq_gguf_vtype_t et;
            assert_int_equal(dsq_gguf_arr_n(g, "tokenizer.ggml.scores", &et), 32000);
            assert_int_equal(et, DSQ_GGUF_F32);
            assert_non_null(dsq_gguf_arr_data(g, "tokenizer.ggml.scores"));
            s = dsq_gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &len);
            assert_int_equal(len, 5);
            assert_memory_equal(s, "<unk>", 5);
            s = dsq_gguf_arr_str(g, "tokenizer.ggml.tokens", 3, &len);
            assert_int_equal(len, 6);
            assert_memory_equal(s, "<0x00>", 6);
        }
        dsq_gguf_close(g);
        free(path);
    }
}

/* ---- hand-written file ---- */

static void test_small_valid(void **state)
{
    (void)state;
    layout_t L;
    buf_t b = make_gguf(&L);
    char err[512] = "";
    dsq_gguf_t *g = open_bytes(b.b, b.n, err, sizeof(err));
    if (!g)
        fail_msg("%s", err);
    assert_int_equal(dsq_gguf_n_kv(g), 8);
    assert_int_equal(dsq_gguf_get_int(g, "test.k1", 0), 7);
    assert_true(dsq_gguf_get_float(g, "test.k2", 0) == 0.5);
    assert_true(dsq_gguf_get_bool(g, "test.bool", false));
    assert_int_equal(dsq_gguf_get_int(g, "test.i64", 0), -5);
    assert_int_equal(dsq_gguf_kv_type(g, dsq_gguf_find_key(g, "test.k2")), DSQ_GGUF_F32);
    assert_string_equal(dsq_gguf_key(g, 1), "test.k1");
    dsq_gguf_vtype_t et;
    assert_int_equal(dsq_gguf_arr_n(g, "test.u8s", &et), 3);
    assert_int_equal(et, DSQ_GGUF_U8);
    assert_memory_equal(dsq_gguf_arr_data(g, "test.u8s"), "\1\2\3", 3);
    assert_int_equal(dsq_gguf_arr_n(g, "test.nested", &et), 2);
    assert_int_equal(et, DSQ_GGUF_ARRAY);
    assert_null(dsq_gguf_arr_data(g, "test.nested"));
    size_t len;
    const char *s = dsq_gguf_arr_str(g, "test.strs", 2, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "xyz", 3);
    s = dsq_gguf_arr_str(g, "test.strs", 1, &len);
    assert_non_null(s);
    assert_int_equal(len, 0);
    const dsq_tensor_t *a = dsq_gguf_find_tensor(g, "a");
    const dsq_tensor_t *tb = dsq_gguf_find_tensor(g, "b");
    assert_non_null(a);
    assert_non_null(tb);
    assert_int_equal(a->ne[0], 4);
    assert_int_equal(a->ne[1], 2);
    assert_int_equal(a->ne[2], 1);
    assert_int_equal(a->n_bytes, 32);
    assert_int_equal(tb->n_bytes, 34);
    float v;
    memcpy(&v, (const uint8_t *)a->data + 4 * 5, 4);
    assert_true(v == 5.25f);
    assert_int_equal(((const int8_t *)tb->data)[2 + 31], 15);
    assert_int_equal(dsq_gguf_data_offset(g), L.data);
    dsq_gguf_close(g);

    /* open_buffer gives the same answer */
    g = dsq_gguf_open_buffer(b.b, b.n, "mem", err, sizeof(err));
    assert_non_null(g);
    assert_string_equal(dsq_gguf_path(g), "mem");
    dsq_gguf_close(g);
    free(b.b);
}

static void test_truncated_everywhere(void **state)
{
    (void)state;
    layout_t L;
    buf_t b = make_gguf(&L);
    /* every strict prefix must fail cleanly (tensor b ends at the last byte) */
    for (size_t n = 0; n < b.n; n++) {
        char err[512] = "";
        dsq_gguf_t *g = open_bytes(b.b, n, err, sizeof(err));
        if (g) {
            dsq_gguf_close(g);
            fail_msg("prefix of %zu/%zu bytes opened", n, b.n);
        }
        assert_true(strlen(err) > 0);
    }
    free(b.b);
}

static void patch_u32(buf_t *b, size_t at, uint32_t v) { memcpy(b->b + at, &v, 4); }
static void patch_u64(buf_t *b, size_t at, uint64_t v) { memcpy(b->b + at, &v, 8); }

static void test_corrupt(void **state)
{
    (void)state;
    layout_t L;
    buf_t b;

    b = make_gguf(&L);
    b.b[0] = 'X';
    expect_fail(&b, "magic");
    free(b.b);

    b = make_gguf(&L);
    patch_u32(&b, L.version, 99);
    expect_fail(&b, "version 99");
    free(b.b);

    b = make_gguf(&L);
    patch_u32(&b, L.ndims_a, 5);
    expect_fail(&b, "n_dims 5");
    free(b.b);

    b = make_gguf(&L);
    patch_u64(&b, L.off_b, 33);
    expect_fail(&b, "not aligned");
    free(b.b);

    b = make_gguf(&L);
    patch_u64(&b, L.off_b, 64);
    expect_fail(&b, "past end of file");
    free(b.b);

    b = make_gguf(&L);
    patch_u64(&b, L.off_b, (uint64_t)1 << 62);
    expect_fail(&b, "'b'");
    free(b.b);

    b = make_gguf(&L);           /* b [0, +34) over a [0, +32): aliased data */
    patch_u64(&b, L.off_b, 0);
    expect_fail(&b, "tensors 'a' [0, +32) and 'b' [0, +34) overlap");
    free(b.b);

    b = make_gguf(&L);           /* element count overflow */
    patch_u64(&b, L.ne0_a, (uint64_t)1 << 62);
    patch_u64(&b, L.ne1_a, (uint64_t)1 << 62);
    expect_fail(&b, "overflow");
    free(b.b);

    b = make_gguf(&L);           /* byte size overflow: 2^62 F32 = 2^64 bytes */
    patch_u64(&b, L.ne0_a, (uint64_t)1 << 62);
    patch_u64(&b, L.ne1_a, 1);
    expect_fail(&b, "byte size overflows");
    free(b.b);

    b = make_gguf(&L);
    patch_u32(&b, L.type_a, 4);  /* removed Q4_2 */
    expect_fail(&b, "type 4");
    free(b.b);

    b = make_gguf(&L);
    b.b[L.name_b] = 'a';
    expect_fail(&b, "duplicate tensor name 'a'");
    free(b.b);

    b = make_gguf(&L);
    b.b[L.key2 + 8 + 6] = '1';   /* "test.k2" -> "test.k1" */
    expect_fail(&b, "duplicate metadata key 'test.k1'");
    free(b.b);

    b = make_gguf(&L);
    patch_u64(&b, L.str_len, (uint64_t)1 << 62);
    expect_fail(&b, "general.architecture");
    free(b.b);

    b = make_gguf(&L);
    patch_u64(&b, L.arr_len, (uint64_t)1 << 62);
    expect_fail(&b, "test.u8s");
    free(b.b);

    b = make_gguf(&L);
    patch_u64(&b, L.n_tensors, (uint64_t)1 << 62);
    expect_fail(&b, "tensor_count");
    free(b.b);

    /* empty file */
    b = make_gguf(&L);
    b.n = 0;
    expect_fail(&b, "too short");
    free(b.b);

    /* missing file */
    char err[256] = "";
    assert_null(dsq_gguf_open("/nonexistent/dsq.gguf", err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/dsq.gguf"));
    dsq_gguf_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_vocab_files),
        cmocka_unit_test(test_small_valid),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_corrupt),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}

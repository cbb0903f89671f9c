/* tests for engine/io/safetensors.c: small files written here byte by byte
 * (format per the huggingface/safetensors README), then truncated and
 * corrupted. No python needed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/io/safetensors.h"
#include "engine/io/tensor.h"

static char tmpdir[256];
static char fpath[300];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/dsq_test_st_XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    snprintf(fpath, sizeof(fpath), "%s/t.safetensors", tmpdir);
    return 0;
}

static int teardown_tmp(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* file = u64 header length + header + data */
static size_t build(uint8_t *out, size_t cap, const char *header,
                    const void *data, size_t data_len)
{
    uint64_t n = strlen(header);
    size_t total = 8 + (size_t)n + data_len;
    assert_true(total <= cap);
    memcpy(out, &n, 8);
    memcpy(out + 8, header, (size_t)n);
    if (data_len)
        memcpy(out + 8 + n, data, data_len);
    return total;
}

static void write_file(const void *p, size_t n)
{
    FILE *f = fopen(fpath, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static const char *GOOD_HEADER =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[32,33]},"
    "\"e\":{\"dtype\":\"I32\",\"shape\":[0,5],\"data_offsets\":[33,33]},"
    "\"q\":{\"dtype\":\"I64\",\"shape\":[1,1,1,2],\"data_offsets\":[33,49]}}    ";

static size_t good_file(uint8_t *buf, size_t cap)
{
    uint8_t data[49];
    float a[6] = {1, 2, 3, 4, 5, 6};
    memcpy(data, a, 24);
    for (int i = 0; i < 4; i++) {
        uint16_t h = dsq_fp32_to_bf16((float)(i + 1) * 0.5f);
        memcpy(data + 24 + 2 * i, &h, 2);
    }
    data[32] = 200;
    int64_t q[2] = {-1, 1LL << 40};
    memcpy(data + 33, q, 16);
    return build(buf, cap, GOOD_HEADER, data, sizeof(data));
}

static void test_valid(void **state)
{
    (void)state;
    uint8_t buf[1024];
    size_t n = good_file(buf, sizeof(buf));
    write_file(buf, n);
    char err[512] = "";
    dsq_safetensors_t *s = dsq_safetensors_open(fpath, err, sizeof(err));
    if (!s)
        fail_msg("%s", err);
    assert_int_equal(dsq_safetensors_n_tensors(s), 5);
    assert_string_equal(dsq_safetensors_tensor(s, 0)->name, "a");
    const dsq_tensor_t *a = dsq_safetensors_find(s, "a");
    assert_non_null(a);
    assert_int_equal(a->type, DSQ_TYPE_F32);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->ne[0], 3);   /* JSON [2,3] -> ne[0]=3 */
    assert_int_equal(a->ne[1], 2);
    assert_int_equal(a->n_bytes, 24);
    float v;
    memcpy(&v, (const uint8_t *)a->data + 4 * 5, 4);
    assert_true(v == 6.0f);
    const dsq_tensor_t *b = dsq_safetensors_find(s, "b");
    assert_int_equal(b->type, DSQ_TYPE_BF16);
    uint16_t h;
    memcpy(&h, (const uint8_t *)b->data + 6, 2);
    assert_true(dsq_bf16_to_fp32(h) == 2.0f);
    const dsq_tensor_t *sc = dsq_safetensors_find(s, "s");
    assert_int_equal(sc->n_dims, 1);
    assert_int_equal(sc->ne[0], 1);
    assert_int_equal(*(const uint8_t *)sc->data, 200);
    const dsq_tensor_t *e = dsq_safetensors_find(s, "e");
    assert_int_equal(e->n_bytes, 0);
    assert_int_equal(e->ne[0], 5);
    assert_int_equal(e->ne[1], 0);
    const dsq_tensor_t *q = dsq_safetensors_find(s, "q");
    assert_int_equal(q->n_dims, 4);
    assert_int_equal(q->ne[0], 2);
    int64_t qv;
    memcpy(&qv, (const uint8_t *)q->data + 8, 8);
    assert_true(qv == (1LL << 40));
    assert_null(dsq_safetensors_find(s, "__metadata__"));
    assert_null(dsq_safetensors_find(s, "zz"));
    dsq_safetensors_close(s);

    s = dsq_safetensors_open_buffer(buf, n, "mem", err, sizeof(err));
    assert_non_null(s);
    assert_string_equal(dsq_safetensors_path(s), "mem");
    dsq_safetensors_close(s);
    dsq_safetensors_close(NULL);
}

static void expect_fail(const void *p, size_t n, const char *needle)
{
    char err[512] = "";
    write_file(p, n);
    dsq_safetensors_t *s = dsq_safetensors_open(fpath, err, sizeof(err));
    if (s) {
        dsq_safetensors_close(s);
        fail_msg("bad file opened (expected '%s')", needle);
    }
    if (!strstr(err, needle))
        fail_msg("error '%s' lacks '%s'", err, needle);
    if (!strstr(err, "t.safetensors"))
        fail_msg("error '%s' does not name the file", err);
}

static void test_truncated(void **state)
{
    (void)state;
    uint8_t buf[1024];
    size_t n = good_file(buf, sizeof(buf));
    for (size_t k = 0; k < n; k++) {
        char err[512] = "";
        write_file(buf, k);
        dsq_safetensors_t *s = dsq_safetensors_open(fpath, err, sizeof(err));
        if (s) {
            dsq_safetensors_close(s);
            fail_msg("prefix %zu/%zu opened", k, n);
        }
    }
}

static void one_bad(const char *header, size_t data_len, const char *needle)
{
    uint8_t buf[2048];
    uint8_t data[64] = {0};
    size_t n = build(buf, sizeof(buf), header, data, data_len);
    expect_fail(buf, n, needle);
}

static void test_corrupt(void **state)
{
    (void)state;
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, "past end of file");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 16, "needs 8");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, "bad data_offsets");
    one_bad("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "F8_E4M3");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "5 dims");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
            4, "overflow");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate tensor name 'a'");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets");
    /* b's bytes [4, 12) reuse the second half of a's [0, 8) */
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
            "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
    /* listed in the other order, and one range inside the other */
    one_bad("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
            "\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8,
            "tensors 'a' [0, 8) and 'b' [2, 4) overlap");
    one_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "JSON");
    one_bad("[1,2,3]", 0, "JSON");

    /* header length bigger than the file, and 2^62 */
    uint8_t buf[64];
    uint64_t big = 1000;
    memcpy(buf, &big, 8);
    memcpy(buf + 8, "{}", 2);
    expect_fail(buf, 10, "header length 1000");
    big = (uint64_t)1 << 62;
    memcpy(buf, &big, 8);
    expect_fail(buf, 10, "header length");
    expect_fail(buf, 4, "shorter than 8");

    /* 100 MB cap: a sparse 160 MB file whose header claims 150 MB */
    big = 150u * 1000u * 1000u;
    memcpy(buf, &big, 8);
    write_file(buf, 10);
    assert_int_equal(truncate(fpath, 160L * 1000L * 1000L), 0);
    char err[512] = "";
    dsq_safetensors_t *s = dsq_safetensors_open(fpath, err, sizeof(err));
    assert_null(s);
    assert_non_null(strstr(err, "100 MB"));
    assert_int_equal(unlink(fpath), 0);

    assert_null(dsq_safetensors_open("/nonexistent/x.safetensors", err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/x.safetensors"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_corrupt),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}

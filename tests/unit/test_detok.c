/* tests for engine/text/detok.c: the streaming detokenizer.
 *
 * Property (fixed seed, random valid UTF-8 incl. CJK and emoji, which
 * byte-level BPE and SPM byte fallback split across tokens): every delta
 * is valid UTF-8 (checked by an independent validator here) and the
 * concatenated deltas plus flush equal dsq_tokenizer_decode() of the same
 * ids. Plus hand-made cases: a character split across tokens is held back,
 * an unfinished tail flushes as one U+FFFD, invalid bytes become U+FFFD.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/text/detok.h"
#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/text/tokenizer.h"

static dsq_tokenizer_t *load_gguf(const char *rel)
{
    const char *base = getenv("DSQ_TEST_DATA");
    if (!base) fail_msg("DSQ_TEST_DATA is not set");
    char p[1024], err[256] = "";
    snprintf(p, sizeof(p), "%s/%s", base, rel);
    struct stat st;
    if (stat(p, &st) != 0) fail_msg("missing test file %s", p);
    dsq_gguf_t *g = dsq_gguf_open(p, err, sizeof(err));
    if (!g) fail_msg("dsq_gguf_open %s: %s", p, err);
    dsq_tokenizer_t *t = dsq_tokenizer_from_gguf(g, err, sizeof(err));
    dsq_gguf_close(g);
    if (!t) fail_msg("tokenizer from %s: %s", p, err);
    return t;
}

static bool valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t need = c < 0x80 ? 1 : (c >= 0xc2 && c < 0xe0) ? 2 : (c >= 0xe0 && c < 0xf0) ? 3
                    : (c >= 0xf0 && c < 0xf5) ? 4 : 0;
        if (!need || i + need > n) return false;
        uint32_t v = need == 1 ? c : c & (0x7fu >> need);
        for (size_t k = 1; k < need; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            v = (v << 6) | (s[i + k] & 0x3fu);
        }
        if ((need == 3 && (v < 0x800 || (v >= 0xd800 && v < 0xe000))) ||
            (need == 4 && (v < 0x10000 || v > 0x10ffff)))
            return false;
        i += need;
    }
    return true;
}

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static size_t put_cp(char *o, uint32_t c)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xc0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3f)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f)); return 3;
    }
    o[0] = (char)(0xf0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f)); o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

static size_t random_text(char *buf)
{
    size_t n = 0, n_cp = rnd() % 40;
    for (size_t i = 0; i < n_cp; i++) {
        uint32_t k = rnd() % 100, c;
        if (k < 40) c = 0x20 + rnd() % 95;
        else if (k < 50) c = (k & 1) ? ' ' : '\n';
        else if (k < 65) c = 0x4e00 + rnd() % 0x5200;
        else if (k < 80) c = 0x1f300 + rnd() % 0x300;
        else do c = 0x80 + rnd() % 0x10ff80; while (c >= 0xd800 && c < 0xe000);
        n += put_cp(buf + n, c);
    }
    buf[n] = '\0';
    return n;
}

static void append(char **acc, size_t *acc_len, const char *s, size_t n)
{
    char *p = realloc(*acc, *acc_len + n + 1);
    assert_non_null(p);
    memcpy(p + *acc_len, s, n);
    *acc_len += n;
    p[*acc_len] = '\0';
    *acc = p;
}

static void stream_property(const dsq_tokenizer_t *t, const char *name, bool strip)
{
    char buf[40 * 4 + 1];
    int n_split = 0;
    rng_state = 0x2545f4914f6cdd1dull;
    for (int it = 0; it < 2000; it++) {
        size_t len = random_text(buf);
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(dsq_tokenizer_encode(t, buf, len, 0, &ids, &n), 0);
        char *full = NULL;
        size_t fl = 0;
        assert_int_equal(dsq_tokenizer_decode(t, ids, n, false, &full, &fl), 0);
        dsq_detok_t *d = dsq_detok_create(t, false, strip);
        assert_non_null(d);
        char *acc = NULL;
        size_t acc_len = 0;
        for (size_t i = 0; i < n; i++) {
            char *delta = NULL;
            size_t dl = 0;
            assert_int_equal(dsq_detok_push(d, ids[i], &delta, &dl), 0);
            if (!delta) assert_int_equal(dl, 0);
            assert_true(valid_utf8((const unsigned char *)delta, dl));
            size_t tb = 0;
            dsq_tokenizer_token_bytes(t, ids[i], &tb);
            n_split += tb > 0 && dl == 0;   /* token held back */
            if (dl) append(&acc, &acc_len, delta, dl);
            free(delta);
        }
        char *tail = NULL;
        size_t tl = 0;
        assert_int_equal(dsq_detok_flush(d, &tail, &tl), 0);
        assert_int_equal(tl, 0);  /* valid input leaves nothing behind */
        free(tail);
        assert_int_equal(acc_len, fl);
        assert_memory_equal(acc ? acc : "", full, fl);
        free(acc);
        free(full);
        free(ids);
        dsq_detok_destroy(d);
    }
    printf("# detok %s: 2000 strings streamed exact, %d pushes held back\n", name, n_split);
    assert_true(n_split > 0);  /* the property did exercise partial chars */
}

static void test_stream_bpe(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_gguf("vocab/llama.cpp/ggml-vocab-gpt-2.gguf");
    stream_property(t, "gpt-2", false);
    dsq_tokenizer_destroy(t);
    t = load_gguf("vocab/llama.cpp/ggml-vocab-deepseek-llm.gguf");
    stream_property(t, "deepseek-llm", false);
    dsq_tokenizer_destroy(t);
}

static void test_stream_spm(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_gguf("vocab/llama.cpp/ggml-vocab-llama-spm.gguf");
    stream_property(t, "llama-spm", true);
    dsq_tokenizer_destroy(t);
}

/* GPT-2 byte tokens: the token of a byte is the vocab entry of its
 * bytes_to_unicode char; find them through encode of single bytes. */
static int32_t byte_tok(const dsq_tokenizer_t *t, unsigned char b)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char c = (char)b;
    assert_int_equal(dsq_tokenizer_encode(t, &c, 1, 0, &ids, &n), 0);
    assert_int_equal(n, 1);
    int32_t id = ids[0];
    free(ids);
    return id;
}

static void test_partial_and_invalid(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_gguf("vocab/llama.cpp/ggml-vocab-gpt-2.gguf");
    /* "€" = E2 82 AC split over three tokens */
    int32_t e2 = byte_tok(t, 0xe2), x82 = byte_tok(t, 0x82), xac = byte_tok(t, 0xac);
    dsq_detok_t *d = dsq_detok_create(t, true, false);
    char *out = NULL;
    size_t n = 0;
    assert_int_equal(dsq_detok_push(d, e2, &out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dsq_detok_push(d, x82, &out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dsq_detok_push(d, xac, &out, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(out, "\xe2\x82\xac");
    /* unfinished tail flushes as one U+FFFD, appended after what is there */
    assert_int_equal(dsq_detok_push(d, e2, &out, &n), 0);
    assert_int_equal(dsq_detok_push(d, x82, &out, &n), 0);
    assert_int_equal(dsq_detok_flush(d, &out, &n), 0);
    assert_string_equal(out, "\xe2\x82\xac\xef\xbf\xbd");
    free(out);
    out = NULL;
    n = 0;
    /* a lone continuation byte and a broken sequence: U+FFFD at once */
    assert_int_equal(dsq_detok_push(d, x82, &out, &n), 0);
    assert_string_equal(out, "\xef\xbf\xbd");
    assert_int_equal(dsq_detok_push(d, e2, &out, &n), 0);
    assert_int_equal(dsq_detok_push(d, byte_tok(t, 'a'), &out, &n), 0);
    assert_string_equal(out, "\xef\xbf\xbd\xef\xbf\xbd" "a");
    free(out);
    out = NULL;
    n = 0;
    /* control token skipped; bad id rejected */
    assert_int_equal(dsq_detok_push(d, 50256, &out, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dsq_detok_push(d, 50257, &out, &n), DSQ_ERANGE);
    assert_int_equal(dsq_detok_push(d, -1, &out, &n), DSQ_ERANGE);
    free(out);
    dsq_detok_destroy(d);
    d = dsq_detok_create(t, false, false);
    out = NULL;
    n = 0;
    assert_int_equal(dsq_detok_push(d, 50256, &out, &n), 0);
    assert_string_equal(out, "<|endoftext|>");
    free(out);
    dsq_detok_destroy(d);
    dsq_detok_destroy(NULL);
    assert_null(dsq_detok_create(NULL, false, false));
    dsq_tokenizer_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partial_and_invalid),
        cmocka_unit_test(test_stream_bpe),
        cmocka_unit_test(test_stream_spm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

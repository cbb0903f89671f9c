/* libFuzzer target for the tokenizers (engine/text/tokenizer*.c) and the
 * incremental detokenizer (engine/text/detok.c).
 *
 * Real vocabularies are loaded once, in LLVMFuzzerInitialize, from
 * $DSQ_TEST_DATA/vocab/llama.cpp: deepseek-llm and deepseek-coder (byte-level
 * BPE with their own pre-tokenizer regexes) and llama-spm (SentencePiece
 * with byte fallback). Each input is arbitrary bytes, encoded with and
 * without DSQ_TOK_PARSE_SPECIAL (and with BOS), then
 *  - every id must be inside the vocabulary;
 *  - dsq_tokenizer_decode must succeed;
 *  - the incremental detokenizer, fed id by id (with and without
 *    skip_special), must only ever hand out valid UTF-8 (RFC 3629; checked
 *    here by an independent validator), and when the matching full decode
 *    is valid UTF-8 its deltas must concatenate to it;
 *  - byte-level BPE: decode(encode(s)) == s whenever s is valid UTF-8
 *    (without BOS; special tokens decode to their own text, so this holds
 *    with DSQ_TOK_PARSE_SPECIAL too).
 * A violated property aborts (libFuzzer reports it as a crash and saves the
 * input). A missing vocabulary file aborts at start-up with its name.
 *
 * Build (clang only; from the repo root):
 *   clang -g -O1 -std=c17 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
 *     -Iengine tests/fuzz/fuzz_tokenizer.c engine/text/tokenizer.c \
 *     engine/text/tokenizer_bpe.c engine/text/tokenizer_spm.c engine/text/detok.c \
 *     engine/io/gguf.c engine/io/mapfile.c engine/io/tensor.c engine/common/log.c \
 *     -lcjson -lpcre2-8 -lm -o fuzz_tokenizer
 * Run with DSQ_TEST_DATA set, seeded with the llama.cpp .inp test vectors
 * (tests/fuzz/meson.build does both).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/detok.h"
#include "engine/io/gguf.h"
#include "engine/common/log.h"
#include "engine/text/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_VOCABS 3
static const char *const vocab_files[N_VOCABS] = {
    "ggml-vocab-deepseek-llm.gguf",
    "ggml-vocab-deepseek-coder.gguf",
    "ggml-vocab-llama-spm.gguf",
};
static dsq_tokenizer_t *toks[N_VOCABS];

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, detail);
    abort();
}

/* Strict UTF-8 check (RFC 3629, Unicode Table 3-7), written independently of
 * engine/text/detok.c so that the two can disagree. */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) { len = 3; lo = 0xA0; }
        else if (c == 0xED) { len = 3; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) len = 3;
        else if (c == 0xF0) { len = 4; lo = 0x90; }
        else if (c == 0xF4) { len = 4; hi = 0x8F; }
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else return false;
        if (i + len > n) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return false;
        i += len;
    }
    return true;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    dsq_log_set_level("error");
    const char *data = getenv("DSQ_TEST_DATA");
    if (!data || !*data)
        die("DSQ_TEST_DATA is not set", "point it at the shared test data");
    for (int v = 0; v < N_VOCABS; v++) {
        char path[4096], err[256];
        snprintf(path, sizeof(path), "%s/vocab/llama.cpp/%s", data, vocab_files[v]);
        dsq_gguf_t *g = dsq_gguf_open(path, err, sizeof(err));
        if (!g)
            die(path, err);
        toks[v] = dsq_tokenizer_from_gguf(g, err, sizeof(err));
        dsq_gguf_close(g);
        if (!toks[v])
            die(path, err);
    }
    return 0;
}

/* Feed ids one by one; every delta must be valid UTF-8. Returns the
 * concatenation (malloc'd) in *all, its length in *all_len. */
static void detok_all(const dsq_tokenizer_t *t, const int32_t *ids, size_t n,
                      bool skip, bool strip, char **all, size_t *all_len)
{
    dsq_detok_t *d = dsq_detok_create(t, skip, strip);
    if (!d)
        die("dsq_detok_create", "NULL");
    char *acc = NULL;
    size_t acc_len = 0;
    for (size_t i = 0; i <= n; i++) {
        char *delta = NULL;
        size_t dl = 0;
        int rc = i < n ? dsq_detok_push(d, ids[i], &delta, &dl)
                       : dsq_detok_flush(d, &delta, &dl);
        if (rc != 0)
            die("dsq_detok_push/flush", "failed on an id from encode");
        if (dl && !utf8_valid((const unsigned char *)delta, dl))
            die("detok", "delta is not valid UTF-8");
        if (dl) {
            char *p = realloc(acc, acc_len + dl + 1);
            if (!p)
                die("detok", "out of memory");
            acc = p;
            memcpy(acc + acc_len, delta, dl);
            acc_len += dl;
            acc[acc_len] = 0;
        }
        free(delta);
    }
    dsq_detok_destroy(d);
    *all = acc;
    *all_len = acc_len;
}

static void check_one(const dsq_tokenizer_t *t, const uint8_t *data,
                      size_t size, unsigned flags, bool valid)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (dsq_tokenizer_encode(t, (const char *)data, size, flags, &ids, &n) != 0)
        die("dsq_tokenizer_encode", "failed");
    int32_t nv = dsq_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            die("dsq_tokenizer_encode", "id out of range");
    char *text = NULL;
    size_t tl = 0;
    if (dsq_tokenizer_decode(t, ids, n, false, &text, &tl) != 0)
        die("dsq_tokenizer_decode", "failed");
    bool spm = dsq_tokenizer_kind(t) == DSQ_TOKENIZER_SPM;
    if (!spm && valid && !(flags & DSQ_TOK_ADD_BOS) &&
        (tl != size || (size && memcmp(text, data, size) != 0)))
        die("byte-level BPE", "decode(encode(s)) != s for valid UTF-8 s");
    for (int skip = 0; skip < 2; skip++) {
        if (skip) {   /* compare with the decode that drops control tokens */
            free(text);
            text = NULL;
            if (dsq_tokenizer_decode(t, ids, n, true, &text, &tl) != 0)
                die("dsq_tokenizer_decode", "failed (skip_special)");
        }
        char *inc = NULL;
        size_t il = 0;
        detok_all(t, ids, n, skip, spm, &inc, &il);
        if (utf8_valid((const unsigned char *)text, tl) &&
            (il != tl || (il && memcmp(inc, text, il) != 0)))
            die("detok", "concatenated deltas differ from dsq_tokenizer_decode");
        free(inc);
    }
    free(text);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384)   /* pre-tokenizer cost is linear; keep runs fast */
        size = 16384;
    bool valid = utf8_valid(data, size);
    for (int v = 0; v < N_VOCABS; v++) {
        check_one(toks[v], data, size, 0, valid);
        check_one(toks[v], data, size, DSQ_TOK_PARSE_SPECIAL, valid);
        check_one(toks[v], data, size, DSQ_TOK_ADD_BOS | DSQ_TOK_PARSE_SPECIAL, valid);
    }
    return 0;
}

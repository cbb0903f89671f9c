/* tests for engine/text/tokenizer*.c.
 *
 * References, all independent of this code:
 * - llama.cpp's tokenizer test vectors ($DSQ_TEST_DATA/vocab/llama.cpp/
 *   *.gguf.inp/.out, made with HF tokenizers): every string must encode to
 *   exactly the listed ids (no BOS, special text not parsed). GGUF vocabs
 *   present there: gpt-2, deepseek-coder, deepseek-llm, starcoder,
 *   llama-spm. qwen2 vectors (llama.cpp's deepseek-r1-qwen vectors were
 *   the same ids and left its tree) run on the Qwen3 tokenizer.json (same
 *   vocab, merges and pre-tokenizer as Qwen2 and R1-Distill-Qwen), deepseek-v3
 *   vectors on its tokenizer.json, smollm vectors on the SmolLM2 GGUF in
 *   $DSQ_MODELS_DIR (same tokenizer as SmolLM), llama-bpe vectors on
 *   llama.cpp's ggml-vocab-llama-bpe.gguf, which scripts/fetch-model
 *   llama-bpe-vocab extracts from the llama-cpp-python sdist into
 *   $DSQ_MODELS_DIR.
 * - stories260K greedy reference (llama2.c run.c): prompt ids and text.
 * - a hand-computed tiny BPE (merge order and leftmost tie-break).
 * - property: decode(encode(s)) == s on random valid UTF-8 (fixed seed),
 *   for every vocab above; invalid UTF-8 comes back byte-exact.
 * Per-vocab pass counts are printed as TAP comments.
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
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/text/tokenizer.h"

#include "test_common.h"

/* ---- helpers ---- */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static dsq_tokenizer_t *load_gguf(const char *env, const char *rel)
{
    char *p = data_path(env, rel);
    char err[256] = "";
    dsq_gguf_t *g = dsq_gguf_open(p, err, sizeof(err));
    if (!g) fail_msg("dsq_gguf_open %s: %s", p, err);
    dsq_tokenizer_t *t = dsq_tokenizer_from_gguf(g, err, sizeof(err));
    dsq_gguf_close(g);
    if (!t) fail_msg("tokenizer from %s: %s", p, err);
    free(p);
    return t;
}

static dsq_tokenizer_t *load_hf(const char *rel)
{
    char *p = data_path("DSQ_TEST_DATA", rel);
    char err[256] = "";
    dsq_tokenizer_t *t = dsq_tokenizer_from_hf(p, err, sizeof(err));
    if (!t) fail_msg("tokenizer from %s: %s", p, err);
    free(p);
    return t;
}

/* Run one .inp/.out pair; returns the number of strings that match. */
static int run_vectors(const dsq_tokenizer_t *t, const char *name,
                       const char *inp_rel, const char *out_rel, int *n_total)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *ip = data_path("DSQ_TEST_DATA", inp_rel);
    char *op = data_path("DSQ_TEST_DATA", out_rel);
    size_t il, ol;
    char *in = slurp(ip, &il), *out = slurp(op, &ol);
    char *s = in, *line = out;
    int pass = 0, total = 0;
    while (s < in + il) {
        char *e = strstr(s, sep);
        if (!e) break;
        char *nl = strchr(line, '\n');
        if (!nl) fail_msg("%s: fewer lines than strings", op);
        *nl = '\0';
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(dsq_tokenizer_encode(t, s, (size_t)(e - s), 0, &ids, &n), 0);
        /* compare with the expected line */
        char *q = line;
        bool ok = true;
        size_t k = 0;
        for (;;) {
            while (*q == ' ') q++;
            if (!*q) break;
            long v = strtol(q, &q, 10);
            if (k >= n || ids[k] != v) ok = false;
            k++;
        }
        if (k != n) ok = false;
        if (ok) {
            pass++;
        } else {
            printf("# %s: string %d differs: expected [%s], got", name, total, line);
            for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
            printf("\n");
        }
        free(ids);
        total++;
        s = e + strlen(sep);
        line = nl + 1;
    }
    printf("# vocab %s: %d/%d strings exact\n", name, pass, total);
    free(in);
    free(out);
    free(ip);
    free(op);
    *n_total = total;
    return pass;
}

static void check_vectors(const dsq_tokenizer_t *t, const char *name,
                          const char *inp, const char *out)
{
    int total = 0;
    int pass = run_vectors(t, name, inp, out, &total);
    assert_true(total >= 40);
    assert_int_equal(pass, total);
}

/* ---- tiny hand-made BPE ---- */

static void test_bpe_small(void **state)
{
    (void)state;
    char dir[] = "/tmp/dsq_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    /* "\u0120" is GPT-2's char for the space byte. */
    fputs("{\"added_tokens\":[{\"id\":9,\"content\":\"<|x|>\",\"special\":true}],"
          "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
          "\"use_regex\":true},"
          "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,"
          "\"\\u0120\":3,\"ab\":4,\"abc\":5,\"\\u0120a\":6,\"bc\":7,\"aa\":8},"
          "\"merges\":[\"a b\",[\"b\",\"c\"],\"ab c\",\"\\u0120 a\",\"a a\"]}}",
          f);
    fclose(f);
    char err[256] = "";
    dsq_tokenizer_t *t = dsq_tokenizer_from_hf(dir, err, sizeof(err));
    unlink(path);
    rmdir(dir);
    if (!t) fail_msg("%s", err);
    assert_int_equal(dsq_tokenizer_kind(t), DSQ_TOKENIZER_BPE);
    assert_int_equal(dsq_tokenizer_n_vocab(t), 10);
    static const struct { const char *text; unsigned flags; int n; int32_t ids[4]; } cases[] = {
        /* "abc": a+b (rank 0) first, then ab+c (rank 2) */
        { "abc", 0, 1, { 5 } },
        /* " abc" is one piece: a+b beats Ġ+a, then ab+c; Ġ stays alone */
        { "abc abc", 0, 3, { 5, 3, 5 } },
        { "bcb", 0, 2, { 7, 1 } },
        /* equal ranks: leftmost pair first */
        { "aaa", 0, 2, { 8, 0 } },
        { "a<|x|>b", DSQ_TOK_PARSE_SPECIAL, 3, { 0, 9, 1 } },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(dsq_tokenizer_encode(t, cases[i].text, strlen(cases[i].text),
                                              cases[i].flags, &ids, &n), 0);
        assert_int_equal(n, (size_t)cases[i].n);
        for (int k = 0; k < cases[i].n; k++) assert_int_equal(ids[k], cases[i].ids[k]);
        free(ids);
    }
    int32_t ids[] = { 5, 3, 5, 9 };
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(dsq_tokenizer_decode(t, ids, 4, false, &text, &len), 0);
    assert_string_equal(text, "abc abc<|x|>");
    free(text);
    assert_int_equal(dsq_tokenizer_decode(t, ids, 4, true, &text, &len), 0);
    assert_string_equal(text, "abc abc");
    free(text);
    int32_t bad = 10;
    assert_int_equal(dsq_tokenizer_decode(t, &bad, 1, false, &text, &len), DSQ_ERANGE);
    assert_true(dsq_tokenizer_is_special(t, 9));
    assert_false(dsq_tokenizer_is_special(t, 5));
    assert_int_equal(dsq_tokenizer_find(t, "abc", 3), 5);
    dsq_tokenizer_destroy(t);
}

/* ---- llama.cpp vectors ---- */

static void test_vectors_gguf(void **state)
{
    (void)state;
    static const char *const names[] = { "gpt-2", "deepseek-coder", "deepseek-llm",
                                         "starcoder", "llama-spm" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char g[128], inp[160], out[160];
        snprintf(g, sizeof(g), "vocab/llama.cpp/ggml-vocab-%s.gguf", names[i]);
        snprintf(inp, sizeof(inp), "%s.inp", g);
        snprintf(out, sizeof(out), "%s.out", g);
        dsq_tokenizer_t *t = load_gguf("DSQ_TEST_DATA", g);
        check_vectors(t, names[i], inp, out);
        dsq_tokenizer_destroy(t);
    }
}

static void test_vectors_qwen2(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_hf("tokenizers/qwen3");
    check_vectors(t, "qwen2 (qwen3 tokenizer.json)",
                  "vocab/llama.cpp/ggml-vocab-qwen2.gguf.inp",
                  "vocab/llama.cpp/ggml-vocab-qwen2.gguf.out");
    /* specials and end-of-generation */
    int32_t im_end = dsq_tokenizer_find(t, "<|im_end|>", 10);
    assert_int_equal(im_end, 151645);
    assert_true(dsq_tokenizer_is_eog(t, im_end));
    assert_true(dsq_tokenizer_is_eog(t, 151643));  /* <|endoftext|> */
    assert_false(dsq_tokenizer_is_eog(t, 151644)); /* <|im_start|> */
    assert_int_equal(dsq_tokenizer_eos(t), im_end);
    assert_int_equal(dsq_tokenizer_bos(t), -1);
    assert_false(dsq_tokenizer_add_bos(t));
    assert_non_null(dsq_tokenizer_chat_template(t));
    const char *s = "hi<|im_end|>";
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(dsq_tokenizer_encode(t, s, strlen(s), DSQ_TOK_PARSE_SPECIAL, &ids, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], im_end);
    free(ids);
    assert_int_equal(dsq_tokenizer_encode(t, s, strlen(s), 0, &ids, &n), 0);
    assert_true(n > 2);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], im_end);
    free(ids);
    dsq_tokenizer_destroy(t);
}

static void test_vectors_deepseek_v3(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_hf("tokenizers/deepseek-v3");
    check_vectors(t, "deepseek-v3 (tokenizer.json)",
                  "tokenizers/deepseek-v3/deepseek-v3.vectors.inp",
                  "tokenizers/deepseek-v3/deepseek-v3.vectors.out");
    assert_int_equal(dsq_tokenizer_bos(t), 0);
    assert_int_equal(dsq_tokenizer_eos(t), 1);
    assert_true(dsq_tokenizer_add_bos(t));
    assert_true(dsq_tokenizer_is_eog(t, 1));
    /* <｜User｜> is a non-special added token: user-defined, so it is cut
     * out of plain text even without PARSE_SPECIAL (as HF does). */
    assert_false(dsq_tokenizer_is_special(t, 128803));
    assert_true(dsq_tokenizer_is_special(t, 128805));   /* <|EOT|> */
    assert_true(dsq_tokenizer_is_eog(t, 128805));
    int32_t *ids = NULL;
    size_t n = 0;
    const char *u = "<\xef\xbd\x9cUser\xef\xbd\x9c>";
    assert_int_equal(dsq_tokenizer_encode(t, u, strlen(u), 0, &ids, &n), 0);
    assert_true(n == 1 && ids[0] == 128803);
    free(ids);
    assert_int_equal(dsq_tokenizer_encode(t, "<|EOT|>", 7, 0, &ids, &n), 0);
    assert_true(n > 1);
    free(ids);
    assert_int_equal(dsq_tokenizer_encode(t, "<|EOT|>", 7, DSQ_TOK_PARSE_SPECIAL, &ids, &n), 0);
    assert_true(n == 1 && ids[0] == 128805);
    free(ids);
    assert_int_equal(dsq_tokenizer_encode(t, "x", 1, DSQ_TOK_ADD_BOS, &ids, &n), 0);
    assert_true(n == 2 && ids[0] == 0);
    free(ids);
    dsq_tokenizer_destroy(t);
}

static void test_vectors_smollm(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_gguf("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    check_vectors(t, "smollm (SmolLM2 GGUF)",
                  "vocab/llama.cpp/ggml-vocab-smollm.gguf.inp",
                  "vocab/llama.cpp/ggml-vocab-smollm.gguf.out");
    assert_true(dsq_tokenizer_is_eog(t, dsq_tokenizer_eos(t)));
    dsq_tokenizer_destroy(t);
}

static void test_vectors_llama_bpe(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_gguf("DSQ_MODELS_DIR", "ggml-vocab-llama-bpe.gguf");
    check_vectors(t, "llama-bpe (Llama 3)",
                  "vocab/llama.cpp/ggml-vocab-llama-bpe.gguf.inp",
                  "vocab/llama.cpp/ggml-vocab-llama-bpe.gguf.out");
    dsq_tokenizer_destroy(t);
}

/* ---- llama2.c stories260K ---- */

/* Parse a Python repr string literal ('...' or "..."); malloc'd. */
static char *parse_repr(const char *s)
{
    char q = *s++;
    char *out = malloc(strlen(s) + 1), *o = out;
    assert_non_null(out);
    while (*s && *s != q) {
        if (*s == '\\') {
            s++;
            switch (*s) {
            case 'n': *o++ = '\n'; break;
            case 't': *o++ = '\t'; break;
            case '\\': *o++ = '\\'; break;
            case '\'': *o++ = '\''; break;
            case '"': *o++ = '"'; break;
            default: fail_msg("unhandled escape \\%c", *s);
            }
            s++;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    return out;
}

static void test_llama2c(void **state)
{
    (void)state;
    char *tp = data_path("DSQ_TEST_DATA", "models/stories260K/tok512.bin");
    char err[256] = "";
    dsq_tokenizer_t *t = dsq_tokenizer_from_llama2c(tp, err, sizeof(err));
    if (!t) fail_msg("%s", err);
    free(tp);
    assert_int_equal(dsq_tokenizer_n_vocab(t), 512);
    assert_int_equal(dsq_tokenizer_kind(t), DSQ_TOKENIZER_SPM);
    assert_int_equal(dsq_tokenizer_bos(t), 1);
    assert_true(dsq_tokenizer_is_eog(t, 2));

    char *rp = data_path("DSQ_TEST_DATA", "models/stories260K/stories260K.greedy-reference.txt");
    size_t len;
    char *ref = slurp(rp, &len);
    int n_prompts = 0;
    char *prompt = NULL;
    int32_t want[1024], got_out[1024];
    size_t n_out = 0;
    for (char *line = strtok(ref, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "PROMPT ", 7) == 0) {
            free(prompt);
            prompt = parse_repr(line + 7);
        } else if (strncmp(line, "PROMPT_IDS ", 11) == 0) {
            size_t n = parse_ids(line + 11, want, 1024);
            int32_t *ids = NULL;
            size_t m = 0;
            assert_non_null(prompt);
            assert_int_equal(dsq_tokenizer_encode(t, prompt, strlen(prompt),
                                                  DSQ_TOK_ADD_BOS, &ids, &m), 0);
            assert_int_equal(m, n);
            for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
            /* round trip */
            char *text = NULL;
            assert_int_equal(dsq_tokenizer_decode(t, ids, m, true, &text, NULL), 0);
            assert_string_equal(text, prompt);
            free(text);
            free(ids);
            n_prompts++;
        } else if (strncmp(line, "OUTPUT_IDS ", 11) == 0) {
            n_out = parse_ids(line + 11, got_out, 1024);
        } else if (strncmp(line, "TEXT_REPR ", 10) == 0) {
            char *want_text = parse_repr(line + 10);
            char *text = NULL;
            assert_int_equal(dsq_tokenizer_decode(t, got_out, n_out, true, &text, NULL), 0);
            assert_string_equal(text, want_text);
            free(text);
            free(want_text);
        }
    }
    printf("# vocab tok512: %d/3 prompts exact\n", n_prompts);
    assert_int_equal(n_prompts, 3);
    free(prompt);
    free(ref);
    free(rp);
    dsq_tokenizer_destroy(t);
}

/* ---- properties ---- */

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

/* Random valid UTF-8: ASCII, whitespace runs, Latin, CJK, emoji, anything. */
static size_t random_text(char *buf, uint32_t max_cp)
{
    static const char *const ws[] = { " ", "  ", "\n", "\t", "\r\n", "   " };
    size_t n = 0, n_cp = rnd() % 48;
    for (size_t i = 0; i < n_cp; i++) {
        uint32_t k = rnd() % 100, c;
        if (k < 45) c = 0x20 + rnd() % 95;
        else if (k < 60) { const char *w = ws[rnd() % 6]; memcpy(buf + n, w, strlen(w)); n += strlen(w); continue; }
        else if (k < 70) c = 0xa0 + rnd() % 0x1e0;
        else if (k < 80) c = 0x4e00 + rnd() % 0x5200;
        else if (k < 85) c = 0x1f600 + rnd() % 0x50;
        else if (k < 90) c = 0x30 + rnd() % 10;
        else {
            do c = 0x80 + rnd() % (max_cp - 0x7f); while (c >= 0xd800 && c < 0xe000);
        }
        n += put_cp(buf + n, c);
    }
    buf[n] = '\0';
    return n;
}

/* decode(encode(s)) == s (streaming is checked in test_detok.c). */
static void roundtrip(const dsq_tokenizer_t *t, const char *name, int n_strings,
                      uint32_t max_cp)
{
    char buf[48 * 8 + 1];
    int ok = 0;
    rng_state = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < n_strings; it++) {
        size_t len = random_text(buf, max_cp);
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(dsq_tokenizer_encode(t, buf, len, 0, &ids, &n), 0);
        char *text = NULL;
        size_t tl = 0;
        assert_int_equal(dsq_tokenizer_decode(t, ids, n, false, &text, &tl), 0);
        bool same = tl == len && memcmp(text, buf, len) == 0;
        if (!same && ok == it) printf("# %s: round trip differs for '%s' -> '%s'\n", name, buf, text);
        ok += same;
        free(text);
        free(ids);
    }
    printf("# vocab %s: round trip %d/%d random strings\n", name, ok, n_strings);
    assert_int_equal(ok, n_strings);
}

static void test_roundtrip(void **state)
{
    (void)state;
    static const char *const names[] = { "gpt-2", "deepseek-coder", "deepseek-llm",
                                         "starcoder", "llama-spm" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char g[128];
        snprintf(g, sizeof(g), "vocab/llama.cpp/ggml-vocab-%s.gguf", names[i]);
        dsq_tokenizer_t *t = load_gguf("DSQ_TEST_DATA", g);
        /* StarCoder2's (and SmolLM's) vocab has no token for bytes F1,
         * F5..FF, C0, C1: characters of planes 4-16 cannot be represented
         * (they encode as unk), so the property is limited to planes 0-3. */
        roundtrip(t, names[i], 2000, strcmp(names[i], "starcoder") ? 0x10ffff : 0x3ffff);
        dsq_tokenizer_destroy(t);
    }
    dsq_tokenizer_t *t = load_hf("tokenizers/qwen3");
    roundtrip(t, "qwen3", 2000, 0x10ffff);
    dsq_tokenizer_destroy(t);
    t = load_hf("tokenizers/deepseek-v3");
    roundtrip(t, "deepseek-v3", 2000, 0x10ffff);
    dsq_tokenizer_destroy(t);
    t = load_gguf("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    roundtrip(t, "smollm2", 2000, 0x3ffff);  /* same byte gap */
    dsq_tokenizer_destroy(t);
}

/* Invalid UTF-8 is encoded byte-wise and comes back byte-exact; a long
 * run does not blow up the merge loop. */
static void test_bytes_and_long(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_gguf("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-gpt-2.gguf");
    const char bad[] = "a\xff\xfe b\xc3(\xe2\x82 \xf0\x9f";
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    size_t tl = 0;
    assert_int_equal(dsq_tokenizer_encode(t, bad, sizeof(bad) - 1, 0, &ids, &n), 0);
    assert_int_equal(dsq_tokenizer_decode(t, ids, n, false, &text, &tl), 0);
    assert_int_equal(tl, sizeof(bad) - 1);
    assert_memory_equal(text, bad, tl);
    free(text);
    free(ids);
    /* random bytes (mostly invalid UTF-8) come back byte-exact */
    rng_state = 0x1234567887654321ull;
    for (int it = 0; it < 1000; it++) {
        char rb[64];
        size_t rl = rnd() % sizeof(rb);
        for (size_t i = 0; i < rl; i++) rb[i] = (char)(rnd() & 0xff);
        assert_int_equal(dsq_tokenizer_encode(t, rb, rl, 0, &ids, &n), 0);
        assert_int_equal(dsq_tokenizer_decode(t, ids, n, false, &text, &tl), 0);
        assert_int_equal(tl, rl);
        assert_memory_equal(text, rb, rl);
        free(text);
        free(ids);
    }
    size_t big = 200000;
    char *s = malloc(big);
    assert_non_null(s);
    for (size_t i = 0; i < big; i++) s[i] = (i % 1000 == 999) ? ' ' : 'a' + (char)(i % 3);
    assert_int_equal(dsq_tokenizer_encode(t, s, big, 0, &ids, &n), 0);
    assert_int_equal(dsq_tokenizer_decode(t, ids, n, false, &text, &tl), 0);
    assert_int_equal(tl, big);
    assert_memory_equal(text, s, big);
    free(text);
    free(ids);
    memset(s, 'x', big);  /* one 200 kB word */
    assert_int_equal(dsq_tokenizer_encode(t, s, big, 0, &ids, &n), 0);
    assert_true(n > 0 && n < big);
    free(ids);
    free(s);
    assert_int_equal(dsq_tokenizer_encode(t, "", 0, 0, &ids, &n), 0);
    assert_int_equal(n, 0);
    free(ids);
    assert_int_equal(dsq_tokenizer_encode(NULL, "a", 1, 0, &ids, &n), DSQ_EINVAL);
    dsq_tokenizer_destroy(t);
}

/* GGUF special ids are -1 (none) or a token: each key of a real vocab
 * (llama-spm: 32000 tokens, unk 0, bos 1, eos 2; deepseek-coder: 32256,
 * padding 32014; all u32), patched in memory to the vocabulary size, is
 * refused naming the file, the key and the value. */
static void test_gguf_special_ids(void **state)
{
    (void)state;
    static const struct { const char *file, *key; uint32_t n_vocab; } cases[] = {
        {"ggml-vocab-llama-spm.gguf", "tokenizer.ggml.unknown_token_id", 32000},
        {"ggml-vocab-llama-spm.gguf", "tokenizer.ggml.bos_token_id", 32000},
        {"ggml-vocab-llama-spm.gguf", "tokenizer.ggml.eos_token_id", 32000},
        {"ggml-vocab-deepseek-coder.gguf", "tokenizer.ggml.padding_token_id", 32256},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char rel[128];
        snprintf(rel, sizeof(rel), "vocab/llama.cpp/%s", cases[i].file);
        char *p = data_path("DSQ_TEST_DATA", rel);
        size_t len = 0;
        char *buf = slurp(p, &len);
        /* the key is stored as u64 length + bytes, then u32 type, value */
        size_t kl = strlen(cases[i].key), at = 0;
        for (size_t k = 8; k + kl + 8 <= len && !at; k++) {
            uint64_t n;
            memcpy(&n, buf + k - 8, 8);
            if (n == kl && memcmp(buf + k, cases[i].key, kl) == 0)
                at = k + kl;
        }
        if (!at)
            fail_msg("%s: key %s not found", p, cases[i].key);
        uint32_t type, v = cases[i].n_vocab;
        memcpy(&type, buf + at, 4);
        assert_int_equal(type, DSQ_GGUF_U32);
        memcpy(buf + at + 4, &v, 4);
        char err[512] = "";
        dsq_gguf_t *g = dsq_gguf_open_buffer(buf, len, cases[i].file, err, sizeof(err));
        if (!g)
            fail_msg("%s", err);
        dsq_tokenizer_t *t = dsq_tokenizer_from_gguf(g, err, sizeof(err));
        if (t)
            fail_msg("%s with %s = %u loaded", cases[i].file, cases[i].key, v);
        char want[128];
        snprintf(want, sizeof(want), "%s = %u ", cases[i].key, v);
        if (!strstr(err, want) || !strstr(err, cases[i].file))
            fail_msg("error '%s' lacks '%s' or the file name", err, want);
        dsq_gguf_close(g);
        free(buf);
        free(p);
    }
}

static void test_errors(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(dsq_tokenizer_from_llama2c("/nonexistent/tok.bin", err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/tok.bin"));
    err[0] = '\0';
    assert_null(dsq_tokenizer_from_hf("/nonexistent", err, sizeof(err)));
    assert_true(err[0] != '\0');
    char *p = data_path("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-gpt-2.gguf.inp");
    err[0] = '\0';
    assert_null(dsq_tokenizer_from_hf(p, err, sizeof(err)));
    assert_true(err[0] != '\0');
    err[0] = '\0';
    assert_null(dsq_tokenizer_from_llama2c(p, err, sizeof(err)));
    assert_true(err[0] != '\0');
    free(p);
    dsq_tokenizer_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_small),
        cmocka_unit_test(test_vectors_gguf),
        cmocka_unit_test(test_vectors_qwen2),
        cmocka_unit_test(test_vectors_deepseek_v3),
        cmocka_unit_test(test_vectors_smollm),
        cmocka_unit_test(test_vectors_llama_bpe),
        cmocka_unit_test(test_llama2c),
        cmocka_unit_test(test_bytes_and_long),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_gguf_special_ids),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

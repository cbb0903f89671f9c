/* libFuzzer target for the grammar engine (engine/text/grammar.c,
 * grammar_match.c, grammar_vocab.c): GBNF text is untrusted request input.
 *
 * An input is GBNF text, a NUL byte, then bytes to match (no NUL: all
 * grammar). Each input is compiled; a refusal must come with a message.
 * A compiled grammar is then checked for these properties:
 *  - the bytes fed one at a time and all at once give the same verdict
 *    (a prefix is accepted byte by byte iff it is accepted whole), and the
 *    same can_end;
 *  - at the start state and at the last accepted state, the token mask
 *    over the real 512-token TinyStories vocabulary (llama2.c tok512.bin,
 *    SentencePiece-style with byte fallback, from $DSQ_TEST_DATA) equals
 *    brute force: every token tried on a clone of the matcher, and
 *    fill_mask's count equals the mask's population;
 *  - the same state's mask a second time (from the cache) is identical.
 * A violated property aborts (libFuzzer saves the input). A missing
 * vocabulary aborts at start-up with its name.
 *
 * Build: tests/fuzz/meson.build (clang, -fsanitize=fuzzer,address,undefined).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dsq_tokenizer_t *tok;
static dsq_grammar_vocab_t *vocab;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_grammar: property violated: %s\n", what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    dsq_log_set_level("error");
    const char *dir = getenv("DSQ_TEST_DATA");
    char path[1024], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/tok512.bin", dir ? dir : "tests/data");
    tok = dsq_tokenizer_from_llama2c(path, err, sizeof(err));
    if (!tok) {
        fprintf(stderr, "fuzz_grammar: %s: %s\n", path, err);
        abort();
    }
    vocab = dsq_grammar_vocab_create(tok);
    if (!vocab) {
        fprintf(stderr, "fuzz_grammar: vocabulary index failed\n");
        abort();
    }
    return 0;
}

static void check_mask(dsq_grammar_matcher_t *m)
{
    int32_t nv = dsq_grammar_vocab_size(vocab);
    size_t words = ((size_t)nv + 31) / 32;
    uint32_t mask[(512 + 31) / 32 + 8], again[(512 + 31) / 32 + 8];
    if (words > sizeof(mask) / sizeof(mask[0]))
        fail("vocabulary larger than expected");
    bool cached = false;
    int n = dsq_grammar_matcher_fill_mask(m, vocab, mask, &cached);
    if (n == DSQ_ENOMEM || n == DSQ_ERANGE)   /* ERANGE: beyond the mask's limits */
        return;
    if (n < 0)
        fail("fill_mask failed");
    int pop = 0;
    for (int32_t id = 0; id < nv; id++) {
        bool bit = (mask[id / 32] >> (id % 32)) & 1u;
        pop += bit;
        dsq_grammar_matcher_t *c = dsq_grammar_matcher_clone(m);
        if (!c)
            return;
        int rc = dsq_grammar_matcher_accept_token(c, vocab, id);
        dsq_grammar_matcher_free(c);
        if (rc == DSQ_ENOMEM)
            return;
        if ((rc == DSQ_OK) != bit)
            fail(bit ? "mask allows a token the matcher refuses"
                     : "mask refuses a token the matcher takes");
    }
    if (pop != n)
        fail("fill_mask count differs from the mask");
    if (dsq_grammar_matcher_fill_mask(m, vocab, again, &cached) != n || !cached ||
        memcmp(mask, again, words * sizeof(*mask)) != 0)
        fail("cached mask differs from the computed one");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    const uint8_t *text = nul ? nul + 1 : data + size;
    size_t tlen = nul ? size - glen - 1 : 0;
    if (tlen > 256)
        tlen = 256;
    char err[256];
    dsq_grammar_t *g = NULL;
    int rc = dsq_grammar_from_gbnf((const char *)data, glen, NULL, &g, err, sizeof(err));
    if (rc != DSQ_OK) {
        if (g || !err[0])
            fail("refused without a message (or with a grammar)");
        return 0;
    }
    dsq_grammar_matcher_t *one = dsq_grammar_matcher_create(g);
    dsq_grammar_matcher_t *all = dsq_grammar_matcher_create(g);
    if (!one || !all)
        goto out;
    check_mask(one);
    size_t ok = 0;
    while (ok < tlen && dsq_grammar_matcher_accept_bytes(one, text + ok, 1) == DSQ_OK)
        ok++;
    if (dsq_grammar_matcher_accept_bytes(all, text, ok) != DSQ_OK)
        fail("a prefix taken byte by byte is refused whole");
    if (dsq_grammar_matcher_can_end(one) != dsq_grammar_matcher_can_end(all))
        fail("can_end differs between byte-by-byte and whole");
    if (ok < tlen) {
        dsq_grammar_matcher_t *c = dsq_grammar_matcher_clone(all);
        if (c && dsq_grammar_matcher_accept_bytes(c, text, 0) == DSQ_OK &&
            dsq_grammar_matcher_accept_bytes(c, text + ok, tlen - ok) == DSQ_OK)
            fail("bytes refused one at a time are taken together");
        dsq_grammar_matcher_free(c);
    }
    check_mask(one);
out:
    dsq_grammar_matcher_free(one);
    dsq_grammar_matcher_free(all);
    dsq_grammar_free(g);
    return 0;
}

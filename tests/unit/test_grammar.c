/* tests for engine/text/grammar.c and grammar_match.c: GBNF compiled to a
 * pushdown matcher, and the token mask.
 *
 *  - Membership against independent parsers: tests/golden/grammar_cases.jsonl
 *    (tests/ref/make_grammar_golden.py: Lark Earley for the context-free
 *    grammars, Python re.fullmatch for the regular ones) gives, per GBNF
 *    grammar, strings and whether each is a sentence. The matcher must
 *    agree on every string (accept_bytes succeeds and can_end), fed whole
 *    and byte by byte, and every prefix of a sentence must be accepted.
 *  - Bad grammars: each gives DSQ_EINVAL and a message naming the problem.
 *  - The mask on real vocabularies (SmolLM2's 49,152-entry byte-level BPE,
 *    the SPM vocabulary of tests/data): at every step of a walk the
 *    trie walk's mask equals the brute-force mask (every token tried on a
 *    clone of the matcher), the cached mask equals the computed one, and
 *    end-of-generation is allowed exactly where the grammar accepts.
 *  - The registry of compiled grammars: same text, same grammar and warm
 *    mask cache; cleared, a fresh one.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"
#include "test_common.h"

static dsq_grammar_t *compile(const char *src)
{
    char err[256];
    dsq_grammar_t *g = NULL;
    int rc = dsq_grammar_from_gbnf(src, strlen(src), NULL, &g, err, sizeof(err));
    if (rc != DSQ_OK)
        fail_msg("grammar did not compile: %s\n%s", err, src);
    return g;
}

/* whole string: accepted and complete */
static bool sentence(const dsq_grammar_t *g, const char *s, size_t n)
{
    dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
    assert_non_null(m);
    bool ok = dsq_grammar_matcher_accept_bytes(m, s, n) == DSQ_OK && dsq_grammar_matcher_can_end(m);
    dsq_grammar_matcher_free(m);
    return ok;
}

static void test_golden_membership(void **state)
{
    (void)state;
    const char *root = getenv("DSQ_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/golden/grammar_cases.jsonl", root ? root : ".");
    char *text = read_all(path, NULL);
    int n_grammars = 0, n_strings = 0, n_accepted = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        const char *name = cJSON_GetObjectItem(o, "name")->valuestring;
        dsq_grammar_t *g = compile(cJSON_GetObjectItem(o, "gbnf")->valuestring);
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(o, "cases")) {
            const char *s = cJSON_GetArrayItem(c, 0)->valuestring;
            bool want = cJSON_IsTrue(cJSON_GetArrayItem(c, 1));
            size_t n = strlen(s);
            bool got = sentence(g, s, n);
            if (got != want)
                fail_msg("%s: \"%s\": reference says %s, matcher %s", name, s,
                         want ? "sentence" : "not a sentence", got ? "accepts" : "rejects");
            /* byte by byte: same verdict; a sentence's prefixes all accepted */
            dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
            bool alive = true;
            for (size_t i = 0; i < n && alive; i++) {
                alive = dsq_grammar_matcher_accept_bytes(m, s + i, 1) == DSQ_OK;
                if (want && !alive)
                    fail_msg("%s: \"%s\": prefix of %zu bytes rejected", name, s, i + 1);
            }
            assert_true((alive && dsq_grammar_matcher_can_end(m)) == want);
            /* a failed advance leaves the state unchanged */
            if (want) {
                assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\xff", 1), DSQ_EINVAL);
                assert_true(dsq_grammar_matcher_can_end(m));
            }
            dsq_grammar_matcher_free(m);
            n_strings++;
            n_accepted += want;
        }
        dsq_grammar_free(g);
        cJSON_Delete(o);
        n_grammars++;
    }
    free(text);
    print_message("# %d grammars, %d strings (%d sentences) agree with the references\n",
                  n_grammars, n_strings, n_accepted);
    assert_true(n_grammars >= 10 && n_strings >= 100);
}

static void test_bad_grammars(void **state)
{
    (void)state;
    static const struct {
        const char *src, *msg;
    } bad[] = {
        {"root ::= foo", "undefined rule 'foo'"},
        {"start ::= \"a\"", "no start rule 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= root \"a\" | \"b\"", "left recursion"},
        {"root ::= x\nx ::= y \"a\"\ny ::= \"\" | x", "left recursion"},
        {"root ::= (\"\")*", "can recurse without consuming input"},
        {"root ::= \"abc", "unterminated string literal"},
        {"root ::= [a-", "unterminated character class"},
        {"root ::= [z-a]", "reversed"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"\\x4\"", "needs 2 hex digits"},
        {"root ::= \"\\uD800\"", "not a Unicode scalar value"},
        {"root ::= ( \"a\" ", "expected ')'"},
        {"root ::= \"a\" )", "unmatched ')'"},
        {"root ::= * \"a\"", "nothing before it to repeat"},
        {"root ::= \"a\"{3,2}", "maximum is below the minimum"},
        {"root ::= \"a\"{2000}", "repetition count above"},
        {"root ::= \"a\"{2", "expected '}'"},
        {"root \"a\"", "expected '::='"},
        {"::= \"a\"", "expected a rule name"},
        {"", "no rules"},
        {"root ::= \"\xc3\"", "invalid UTF-8"},
        {"root ::= @", "unexpected '@'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        dsq_grammar_t *g = (dsq_grammar_t *)0x1;
        int rc = dsq_grammar_from_gbnf(bad[i].src, strlen(bad[i].src), NULL, &g, err, sizeof(err));
        if (rc != DSQ_EINVAL || g != NULL || !strstr(err, bad[i].msg))
            fail_msg("grammar %zu <%s>: rc %d, err \"%s\", wanted \"%s\"", i, bad[i].src, rc, err,
                     bad[i].msg);
    }
    /* nesting and size limits */
    char *deep = malloc(4 * DSQ_GRAMMAR_MAX_NESTING + 64);
    strcpy(deep, "root ::= ");
    for (int i = 0; i <= DSQ_GRAMMAR_MAX_NESTING; i++)
        strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int i = 0; i <= DSQ_GRAMMAR_MAX_NESTING; i++)
        strcat(deep, ")");
    char err[256];
    dsq_grammar_t *g = NULL;
    assert_int_equal(dsq_grammar_from_gbnf(deep, strlen(deep), NULL, &g, err, sizeof(err)),
                     DSQ_EINVAL);
    assert_non_null(strstr(err, "nested deeper"));
    free(deep);
    /* a 1,040-character literal repeated 1,024 times: above 2^20 elements */
    static char big[2048];
    memcpy(big, "root ::= \"", 10);
    memset(big + 10, 'a', 1040);
    memcpy(big + 10 + 1040, "\"{1024}", sizeof("\"{1024}"));
    assert_int_equal(dsq_grammar_from_gbnf(big, strlen(big), NULL, &g, err, sizeof(err)),
                     DSQ_EINVAL);
    assert_non_null(strstr(err, "more than"));
    /* references keep nested repetitions compact: 10^9 characters, 3k elements */
    const char *nested = "root ::= ((\"a\"{1000}){1000}){1000}";
    assert_int_equal(dsq_grammar_from_gbnf(nested, strlen(nested), NULL, &g, err, sizeof(err)),
                     DSQ_OK);
    assert_true(dsq_grammar_n_elements(g) < 4000);
    assert_false(sentence(g, "aaa", 3));
    dsq_grammar_free(g);
    /* another start rule by name */
    const char *two = "a ::= \"x\"\nb ::= \"y\"";
    assert_int_equal(dsq_grammar_from_gbnf(two, strlen(two), "b", &g, err, sizeof(err)), DSQ_OK);
    assert_true(sentence(g, "y", 1));
    assert_false(sentence(g, "x", 1));
    dsq_grammar_free(g);
}

static void test_utf8_split(void **state)
{
    (void)state;
    dsq_grammar_t *g = compile("root ::= \"\xc3\xa9\" [\xe4\xb8\x80-\xe9\xbe\xa5]+ \"!\"");
    dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
    /* é then 日 (E6 97 A5), one byte at a time */
    const char *s = "\xc3\xa9\xe6\x97\xa5!";
    for (size_t i = 0; i < strlen(s); i++) {
        assert_int_equal(dsq_grammar_matcher_accept_bytes(m, s + i, 1), DSQ_OK);
        assert_true(dsq_grammar_matcher_can_end(m) == (i == strlen(s) - 1));
    }
    assert_true(dsq_grammar_matcher_done(m));
    dsq_grammar_matcher_free(m);
    m = dsq_grammar_matcher_create(g);
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\xc3\xa9", 2), DSQ_OK);
    /* a lead byte whose every completion is outside the class: E1 xx xx < U+4E00 */
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\xe1", 1), DSQ_EINVAL);
    /* E9 BF.. is above U+9FA5: the second byte decides */
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\xe9", 1), DSQ_OK);
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\xbf", 1), DSQ_EINVAL);
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\xbe\xa5", 2), DSQ_OK);
    /* overlong and stray continuation bytes never match */
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\xc0\x80", 2), DSQ_EINVAL);
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "\x80", 1), DSQ_EINVAL);
    /* lead bytes are judged by the characters they can begin: E0 only
     * U+0800.., F0 only U+10000.., F4 nothing above U+10FFFF */
    static const struct {
        const char *gbnf, *bytes;
        bool ok;
    } lead[] = {
        {"root ::= \"c\"", "\xe0", false},
        {"root ::= \"c\"", "\xf0", false},
        {"root ::= [\\x00-\\u07ff]", "\xe0", false},
        {"root ::= [\\x00-\\u07ff]", "\xdf", true},
        {"root ::= [\\u0800-\\uffff]", "\xe0", true},
        {"root ::= [\\u0800-\\uffff]", "\xe0\x9f", false},   /* overlong: < U+0800 */
        {"root ::= [\\u0800-\\uffff]", "\xe0\xa0\x80", true},
        {"root ::= [\\U00010000-\\U0010FFFF]", "\xf4\x8f", true},
        {"root ::= [\\U00010000-\\U0010FFFF]", "\xf4\x90", false},  /* > U+10FFFF */
        {"root ::= [\\U00010000-\\U0010FFFF]", "\xf0\x8f", false},  /* overlong */
        /* classes over everything: the pending range itself decides */
        {"root ::= .", "\xe0\x80", false},       /* overlong: nothing left */
        {"root ::= [^a]", "\xe0\x9f", false},
        {"root ::= .", "\xf4\x90", false},       /* above U+10FFFF */
        {"root ::= .", "\xed\xa0", false},       /* surrogates only */
        {"root ::= .", "\xed\x9f\xbf", true},   /* U+D7FF */
        {"root ::= .", "\xed", true},
    };
    for (size_t i = 0; i < sizeof(lead) / sizeof(lead[0]); i++) {
        dsq_grammar_t *lg = compile(lead[i].gbnf);
        dsq_grammar_matcher_t *lm = dsq_grammar_matcher_create(lg);
        int rc = dsq_grammar_matcher_accept_bytes(lm, lead[i].bytes, strlen(lead[i].bytes));
        if ((rc == DSQ_OK) != lead[i].ok)
            fail_msg("%s: bytes case %zu: rc %d, wanted %s", lead[i].gbnf, i, rc,
                     lead[i].ok ? "accepted" : "rejected");
        dsq_grammar_matcher_free(lm);
        dsq_grammar_free(lg);
    }
    dsq_grammar_matcher_t *c = dsq_grammar_matcher_clone(m);
    assert_non_null(c);
    assert_int_equal(dsq_grammar_matcher_accept_bytes(c, "!", 1), DSQ_OK);
    assert_true(dsq_grammar_matcher_can_end(c));
    assert_false(dsq_grammar_matcher_can_end(m));
    dsq_grammar_matcher_free(c);
    dsq_grammar_matcher_free(m);
    dsq_grammar_free(g);
}

static dsq_tokenizer_t *load_tokenizer(const char *env, const char *rel)
{
    const char *base = getenv(env);
    char p[1024], err[256] = "";
    snprintf(p, sizeof(p), "%s/%s", base ? base : ".", rel);
    struct stat st;
    if (stat(p, &st) != 0)
        fail_msg("missing test file %s", p);
    dsq_gguf_t *gg = dsq_gguf_open(p, err, sizeof(err));
    if (!gg)
        fail_msg("dsq_gguf_open %s: %s", p, err);
    dsq_tokenizer_t *t = dsq_tokenizer_from_gguf(gg, err, sizeof(err));
    dsq_gguf_close(gg);
    if (!t)
        fail_msg("tokenizer from %s: %s", p, err);
    return t;
}

/* At each of n_steps states: the mask equals brute force; then advance by
 * an allowed token chosen by a fixed LCG (preferring text tokens so the
 * walk goes deep). Returns the text produced. */
static void mask_walk(const dsq_tokenizer_t *t, const char *gbnf, int n_steps, uint64_t seed,
                      char *out, size_t out_cap)
{
    dsq_grammar_t *g = compile(gbnf);
    dsq_grammar_vocab_t *v = dsq_grammar_vocab_create(t);
    assert_non_null(v);
    const int32_t nv = dsq_grammar_vocab_size(v);
    const size_t words = ((size_t)nv + 31) / 32;
    uint32_t *mask = malloc(words * 4), *again = malloc(words * 4);
    int32_t *allowed = malloc((size_t)nv * sizeof(*allowed));
    dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
    size_t used = 0;
    out[0] = 0;
    for (int step = 0; step < n_steps && !dsq_grammar_matcher_done(m); step++) {
        bool cached = true;
        int n = dsq_grammar_matcher_fill_mask(m, v, mask, &cached);
        assert_true(n >= 0);
        int brute = 0, n_text = 0;
        for (int32_t id = 0; id < nv; id++) {
            dsq_grammar_matcher_t *c = dsq_grammar_matcher_clone(m);
            bool ok = dsq_grammar_matcher_accept_token(c, v, id) == DSQ_OK;
            dsq_grammar_matcher_free(c);
            bool bit = (mask[id / 32] >> (id % 32)) & 1u;
            if (ok != bit) {
                size_t bl = 0;
                const char *b = dsq_tokenizer_token_bytes(t, id, &bl);
                fail_msg("step %d after \"%s\": token %d \"%.*s\": brute force %s, mask %s", step,
                         out, id, (int)bl, b ? b : "", ok ? "allows" : "rejects",
                         bit ? "allows" : "rejects");
            }
            if (ok) {
                brute++;
                if (!dsq_tokenizer_is_eog(t, id))
                    allowed[n_text++] = id;
            }
        }
        assert_int_equal(n, brute);
        /* the same state again: from the cache, identical */
        assert_int_equal(dsq_grammar_matcher_fill_mask(m, v, again, &cached), n);
        assert_true(cached);
        assert_memory_equal(mask, again, words * 4);
        if (n_text == 0)
            break;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int32_t id = allowed[(seed >> 33) % (uint64_t)n_text];
        size_t bl = 0;
        const char *b = dsq_tokenizer_token_bytes(t, id, &bl);
        assert_int_equal(dsq_grammar_matcher_accept_token(m, v, id), DSQ_OK);
        if (getenv("DSQ_GRAMMAR_TRACE"))
            fprintf(stderr, "step %d: %d allowed, token %d (%zu bytes, first %02x)\n", step, n,
                    id, bl, (unsigned)(unsigned char)b[0]);
        if (used + bl + 1 < out_cap) {
            memcpy(out + used, b, bl);
            used += bl;
            out[used] = 0;
        }
    }
    free(mask);
    free(again);
    free(allowed);
    dsq_grammar_matcher_free(m);
    dsq_grammar_vocab_free(v);
    dsq_grammar_free(g);
}

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
    "array  ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws     ::= [ \\t\\n]{0,4}\n";

static void test_mask_smollm2(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_tokenizer("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    char out[4096];
    mask_walk(t, JSON_GBNF, 12, 1, out, sizeof(out));
    print_message("# smollm2 json walk: %s\n", out);
    for (uint64_t seed = 7; seed < 10; seed++) {
        mask_walk(t, "root ::= \"caf\xc3\xa9 \" [\xe4\xb8\x80-\xe9\xbe\xa5]{2,3} (\"!\" | \"?\")", 24,
                  seed, out, sizeof(out));
        print_message("# smollm2 cjk walk: %s\n", out);
        /* checked by hand-decoding (not by the matcher): "café ", then 2-3
         * code points in U+4E00..U+9FA5, then ! or ? */
        size_t n = strlen(out), i = 6, k = 0;
        assert_true(n >= 6 && memcmp(out, "caf\xc3\xa9 ", 6) == 0);
        for (; i + 3 <= n && (unsigned char)out[i] >= 0xe0; i += 3, k++) {
            uint32_t cp = ((out[i] & 0x0Fu) << 12) | ((out[i + 1] & 0x3Fu) << 6) |
                          (out[i + 2] & 0x3Fu);
            assert_true(cp >= 0x4E00 && cp <= 0x9FA5);
        }
        assert_true(k >= 2 && k <= 3);
        assert_true(i + 1 == n && (out[i] == '!' || out[i] == '?'));
    }
    dsq_tokenizer_destroy(t);
}

static void test_mask_spm(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_tokenizer("DSQ_TEST_DATA", "vocab/llama.cpp/ggml-vocab-llama-spm.gguf");
    char out[4096];
    mask_walk(t, "root ::= \"The \" [a-z]+ (\" \" [a-z]+){1,3} \".\"", 8, 3, out, sizeof(out));
    print_message("# spm walk: %s\n", out);
    dsq_tokenizer_destroy(t);
}

static void test_mask_deepseek(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_tokenizer("DSQ_TEST_DATA",
                                        "vocab/llama.cpp/ggml-vocab-deepseek-llm.gguf");
    assert_true(dsq_tokenizer_n_vocab(t) > 100000);
    char out[4096];
    mask_walk(t, JSON_GBNF, 6, 11, out, sizeof(out));
    print_message("# deepseek-llm json walk: %s\n", out);
    dsq_tokenizer_destroy(t);
}

/* U+0000 cannot be generated (outputs are C strings, the NUL would vanish
 * from the text): a literal of it, or a class of nothing else, is
 * refused (DSQ_EUNSUPPORTED, as a regex's); a class or `.` that merely
 * includes it keeps its other characters. */
static void test_nul(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "root ::= \"a\" \"\\x00\" \"b\"", "root ::= \"\\x00\"", "root ::= [\\x00]",
        "root ::= \"\\u0000\"", "root ::= \"\\0\"", "root ::= \"\\U00000000\"",
        "root ::= [\\x00-\\x00]", "root ::= \"a\" | [\\u0000]*",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        dsq_grammar_t *g = (dsq_grammar_t *)0x1;
        int rc = dsq_grammar_from_gbnf(bad[i], strlen(bad[i]), NULL, &g, err, sizeof(err));
        if (rc != DSQ_EUNSUPPORTED || g != NULL || !strstr(err, "U+0000 (NUL) cannot be "
                                                                "generated"))
            fail_msg("<%s>: rc %d, err \"%s\"", bad[i], rc, err);
        assert_non_null(strstr(err, "grammar line 1 column"));
    }
    static const char *const narrowed[] = {"root ::= [\\x00-\\x7f]*", "root ::= [^z]*",
                                           "root ::= .*", "root ::= [\\x00a-c]*"};
    for (size_t i = 0; i < sizeof(narrowed) / sizeof(narrowed[0]); i++) {
        dsq_grammar_t *g = compile(narrowed[i]);
        assert_true(sentence(g, "a", 1));
        assert_true(sentence(g, "ab", 2));
        if (sentence(g, "a\0b", 3) || sentence(g, "\0", 1))
            fail_msg("<%s> accepts a NUL", narrowed[i]);
        dsq_grammar_free(g);
    }
}

/* An empty rule (`x ::=`, no elements at all) matches the empty string,
 * an empty class `[]` nothing (fuzz_openai found both reaching NULL
 * pointers under UBSan). */
static void test_empty_rule(void **state)
{
    (void)state;
    dsq_grammar_t *g = compile("root ::= \"a\" x \"b\"\nx ::=");
    assert_true(sentence(g, "ab", 2));
    assert_false(sentence(g, "a", 1));
    dsq_grammar_free(g);
    /* the empty class [] matches nothing; {0,4} of it, only "" */
    g = compile("root ::= \"a\" obj [] ?\nobj ::= []{0,4}");   /* two: one interned set */
    assert_true(sentence(g, "a", 1));
    assert_false(sentence(g, "ab", 2));
    dsq_grammar_free(g);
}

/* Limits of the mask: a state of ~1024 distinct `.*` branches (each its
 * own rule) would take minutes of trie walk; fill_mask stops at
 * DSQ_GRAMMAR_MAX_MASK_WORK with DSQ_ERANGE. A start state over 1024
 * stacks (1100 alternatives) is truncated, and fill_mask says so
 * (DSQ_ERANGE) instead of a mask that refuses valid text. */
static void test_mask_limits(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_tokenizer("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    dsq_grammar_vocab_t *v = dsq_grammar_vocab_create(t);
    assert_non_null(v);
    uint32_t *mask = malloc(((size_t)dsq_grammar_vocab_size(v) + 31) / 32 * 4);
    size_t cap = 64 * 1024, n = 0;
    char *src = malloc(cap);
    n += (size_t)snprintf(src + n, cap - n, "root ::= .*");
    for (int i = 1; i < 1000; i++)
        n += (size_t)snprintf(src + n, cap - n, " | .*");
    dsq_grammar_t *g = compile(src);
    dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
    assert_int_equal(dsq_grammar_matcher_fill_mask(m, v, mask, NULL), DSQ_ERANGE);
    /* the matcher itself still follows text */
    assert_int_equal(dsq_grammar_matcher_accept_bytes(m, "abc", 3), DSQ_OK);
    dsq_grammar_matcher_free(m);
    dsq_grammar_free(g);
    n = (size_t)snprintf(src, cap, "root ::= \"a0\"");
    for (int i = 1; i < 1100; i++)
        n += (size_t)snprintf(src + n, cap - n, " | \"a%d\"", i);
    /* more alternatives open at the start than the matcher follows: refused
     * when compiled, not a request that starts and aborts */
    char err[256] = "";
    g = NULL;
    assert_int_equal(dsq_grammar_from_gbnf(src, strlen(src), NULL, &g, err, sizeof(err)),
                     DSQ_ERANGE);
    assert_null(g);
    assert_non_null(strstr(err, "more than 1024 alternatives"));
    /* 1024 alternatives fit */
    n = (size_t)snprintf(src, cap, "root ::= \"a0\"");
    for (int i = 1; i < 1024; i++)
        n += (size_t)snprintf(src + n, cap - n, " | \"a%d\"", i);
    g = compile(src);
    m = dsq_grammar_matcher_create(g);
    assert_true(dsq_grammar_matcher_fill_mask(m, v, mask, NULL) > 0);
    dsq_grammar_matcher_free(m);
    dsq_grammar_free(g);
    free(src);
    free(mask);
    dsq_grammar_vocab_free(v);
    dsq_tokenizer_destroy(t);
}

/* The registry: the same text compiles to the same grammar, whose mask
 * cache a second request's matcher then hits; another start rule or text
 * is another grammar; after dsq_grammar_registry_clear the text compiles
 * afresh (cold cache) while the old grammar lives on for its holders. */
static void test_registry(void **state)
{
    (void)state;
    dsq_tokenizer_t *t = load_tokenizer("DSQ_MODELS_DIR", "SmolLM2-135M-Instruct.Q4_1.gguf");
    dsq_grammar_vocab_t *v = dsq_grammar_vocab_create(t);
    assert_non_null(v);
    const size_t words = ((size_t)dsq_grammar_vocab_size(v) + 31) / 32;
    uint32_t *m1 = malloc(words * 4), *m2 = malloc(words * 4);
    static const char src[] = "root ::= \"reg\" [0-9]+ | x\nx ::= \"registry-test\"";
    char err[256];
    dsq_grammar_t *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    assert_int_equal(dsq_grammar_from_gbnf(src, strlen(src), NULL, &a, err, sizeof(err)), 0);
    assert_int_equal(dsq_grammar_from_gbnf(src, strlen(src), "root", &b, err, sizeof(err)), 0);
    assert_ptr_equal(a, b);
    assert_int_equal(dsq_grammar_from_gbnf(src, strlen(src), "x", &c, err, sizeof(err)), 0);
    assert_ptr_not_equal(a, c);
    assert_int_equal(dsq_grammar_from_gbnf(src, strlen(src) - 1, NULL, &d, err, sizeof(err)),
                     DSQ_EINVAL);   /* "registry-tes: unterminated string */
    bool cached = true;
    dsq_grammar_matcher_t *ma = dsq_grammar_matcher_create(a);
    int n = dsq_grammar_matcher_fill_mask(ma, v, m1, &cached);
    assert_true(n > 0);
    assert_false(cached);
    dsq_grammar_matcher_t *mb = dsq_grammar_matcher_create(b);
    assert_int_equal(dsq_grammar_matcher_fill_mask(mb, v, m2, &cached), n);
    assert_true(cached);
    assert_memory_equal(m1, m2, words * 4);
    dsq_grammar_matcher_free(mb);
    dsq_grammar_free(b);
    dsq_grammar_registry_clear();
    assert_int_equal(dsq_grammar_from_gbnf(src, strlen(src), NULL, &b, err, sizeof(err)), 0);
    mb = dsq_grammar_matcher_create(b);
    assert_int_equal(dsq_grammar_matcher_fill_mask(mb, v, m2, &cached), n);
    assert_false(cached);
    assert_memory_equal(m1, m2, words * 4);
    /* a, cleared from the registry, still works for its holder */
    assert_int_equal(dsq_grammar_matcher_accept_bytes(ma, "reg7", 4), 0);
    assert_true(dsq_grammar_matcher_can_end(ma));
    dsq_grammar_matcher_free(ma);
    dsq_grammar_matcher_free(mb);
    dsq_grammar_free(a);
    dsq_grammar_free(b);
    dsq_grammar_free(c);
    dsq_grammar_registry_clear();
    free(m1);
    free(m2);
    dsq_grammar_vocab_free(v);
    dsq_tokenizer_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_membership),
        cmocka_unit_test(test_bad_grammars),
        cmocka_unit_test(test_utf8_split),
        cmocka_unit_test(test_mask_smollm2),
        cmocka_unit_test(test_mask_spm),
        cmocka_unit_test(test_mask_deepseek),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_empty_rule),
        cmocka_unit_test(test_nul),
        cmocka_unit_test(test_mask_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

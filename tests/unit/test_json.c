/* tests for server/json.c: the strict RFC 8259 check in front of cJSON.
 * Which texts it takes and refuses, the fault it names, and the position
 * (byte 0-based, line and column 1-based, columns in characters) written
 * out by hand; messages stay one line of printable ASCII. The request
 * parser's use of it is in test_openai.c, the config file's in
 * test_options.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "server/json.h"

static int check(const char *text, size_t len, dsq_json_error_t *e)
{
    return dsq_json_check(text, len, e);
}

static void expect_ok(const char *text, size_t len)
{
    dsq_json_error_t e;
    if (check(text, len, &e) != DSQ_OK)
        fail_msg("refused '%s': %s", text, e.message);
}

static void expect_bad(const char *text, size_t len, dsq_json_fault_t fault,
                       size_t byte, int line, int column, const char *want)
{
    dsq_json_error_t e;
    char where[64];
    if (check(text, len, &e) != DSQ_EINVAL)
        fail_msg("took '%s'", text);
    if (e.fault != fault || e.byte != byte || e.line != line || e.column != column)
        fail_msg("'%s': fault %d at %zu (%d:%d), want %d at %zu (%d:%d): %s",
                 text, e.fault, e.byte, e.line, e.column, fault, byte, line,
                 column, e.message);
    snprintf(where, sizeof(where), "at byte %zu (line %d, column %d)", byte,
             line, column);
    assert_string_equal(e.where, where);
    if (!strstr(e.message, want) || !strstr(e.message, where))
        fail_msg("'%s': message '%s' lacks '%s' or '%s'", text, e.message,
                 want, where);
    for (const char *p = e.message; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            fail_msg("'%s': message byte 0x%02x is not printable ASCII", text,
                     (unsigned char)*p);
}

#define OK(s) expect_ok(s, sizeof(s) - 1)
#define BAD(s, f, b, l, c, w) expect_bad(s, sizeof(s) - 1, f, b, l, c, w)

static void test_takes(void **state)
{
    (void)state;
    /* any value at the top level (RFC 8259 section 2); the caller checks
     * the shape */
    OK("{}");
    OK("[]");
    OK("5");
    OK("\"x\"");
    OK("null");
    OK(" \t\r\n{\"a\" : [ 1 , 2 ] }\r\n\t ");
    /* numbers (section 6): integers of any size (read as doubles), the
     * edges of a double, -0, exponents of every form, underflow to 0 */
    OK("[18446744073709551615, -9223372036854775809, 1e308, -1.7976931348623157e308]");
    OK("[123456789012345678901234567890123456789012345678901234567890]");
    OK("[-0, 0, 0.0, -0.0e-0, 1E+2, 1e-2, 4.9e-324, 1e-400]");
    /* strings (section 7): every escape, surrogate pairs, raw UTF-8 up to
     * U+10FFFF, DEL (not a control character in JSON) */
    OK("[\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00 \\uFFFF\"]");
    OK("[\"\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF \x7f\"]");
    /* the same key in different objects; keys that differ only in case */
    OK("{\"a\":{\"a\":1},\"b\":[{\"a\":1},{\"a\":2}],\"A\":1}");
    /* \\u0000 is an escaped backslash and the text u0000 */
    OK("{\"a\":\"\\\\u0000\"}");
}

static void test_refuses(void **state)
{
    (void)state;
    /* numbers: the position is where the parser stops, the byte that
     * cannot continue the number or the one just past the token */
    BAD("[01]", DSQ_JSON_SYNTAX, 2, 1, 3, "invalid token");
    BAD("[-01]", DSQ_JSON_SYNTAX, 3, 1, 4, "invalid token");
    BAD("[1.]", DSQ_JSON_SYNTAX, 3, 1, 4, "invalid token");
    BAD("[.5]", DSQ_JSON_SYNTAX, 2, 1, 3, "invalid token");
    BAD("[1e]", DSQ_JSON_SYNTAX, 3, 1, 4, "invalid token");
    BAD("[1e+]", DSQ_JSON_SYNTAX, 4, 1, 5, "invalid token");
    BAD("[+1]", DSQ_JSON_SYNTAX, 2, 1, 3, "invalid token");
    BAD("[-]", DSQ_JSON_SYNTAX, 2, 1, 3, "invalid token");
    BAD("[0x10]", DSQ_JSON_SYNTAX, 3, 1, 4, "']' expected near 'x'");
    BAD("[1e400]", DSQ_JSON_SYNTAX, 6, 1, 7, "real number overflow");
    BAD("[NaN]", DSQ_JSON_SYNTAX, 4, 1, 5, "invalid token near 'NaN'");
    /* strings: raw control characters, bad escapes, lone surrogates
     * (jansson refuses them, as cJSON does: no UTF-8 can encode one) */
    BAD("[\"a\tb\"]", DSQ_JSON_SYNTAX, 3, 1, 4, "control character 0x9");
    BAD("[\"a\nb\"]", DSQ_JSON_SYNTAX, 3, 1, 4, "unexpected newline");
    BAD("[\"\\x\"]", DSQ_JSON_SYNTAX, 4, 1, 5, "invalid escape");
    BAD("[\"\\u12\"]", DSQ_JSON_SYNTAX, 7, 1, 8, "invalid escape");
    BAD("[\"\\ud800\"]", DSQ_JSON_SYNTAX, 9, 1, 10, "invalid Unicode '\\uD800'");
    BAD("[\"\\udc00\"]", DSQ_JSON_SYNTAX, 9, 1, 10, "invalid Unicode '\\uDC00'");
    BAD("[\"\\ud800\\u0041\"]", DSQ_JSON_SYNTAX, 15, 1, 16, "invalid Unicode");
    BAD("['a']", DSQ_JSON_SYNTAX, 2, 1, 3, "invalid token");
    /* UTF-8 (section 8.1): at the first bad byte */
    BAD("[\"\xFF\"]", DSQ_JSON_BAD_UTF8, 2, 1, 3, "not valid UTF-8");
    BAD("[\"\xC3\"]", DSQ_JSON_BAD_UTF8, 2, 1, 3, "not valid UTF-8");
    BAD("[\"\xC0\xAF\"]", DSQ_JSON_BAD_UTF8, 2, 1, 3, "not valid UTF-8");
    BAD("[\"\xED\xA0\x80\"]", DSQ_JSON_BAD_UTF8, 2, 1, 3, "not valid UTF-8");
    BAD("[\"\xF4\x90\x80\x80\"]", DSQ_JSON_BAD_UTF8, 2, 1, 3, "not valid UTF-8");
    BAD("\xEF\xBB\xBF{}", DSQ_JSON_SYNTAX, 3, 1, 2, "invalid token");  /* BOM */
    /* structure: trailing bytes, commas, missing pieces, empty text */
    BAD("{\"a\":1} x", DSQ_JSON_SYNTAX, 9, 1, 10, "end of file expected");
    BAD("{\"a\":1}{}", DSQ_JSON_SYNTAX, 8, 1, 9, "end of file expected");
    BAD("{\"a\":1,}", DSQ_JSON_SYNTAX, 8, 1, 9, "string or '}' expected");
    BAD("[1,]", DSQ_JSON_SYNTAX, 4, 1, 5, "unexpected token");
    BAD("{\"a\" 1}", DSQ_JSON_SYNTAX, 6, 1, 7, "':' expected");
    BAD("{\"a\":1", DSQ_JSON_SYNTAX, 6, 1, 7, "end of file");
    BAD("", DSQ_JSON_SYNTAX, 0, 1, 1, "end of file");
    BAD("  \n ", DSQ_JSON_SYNTAX, 4, 2, 2, "end of file");
    /* NULs: \u0000 and a raw NUL inside the value, at where they start */
    BAD("[\"a\\u0000\"]", DSQ_JSON_NUL, 3, 1, 4, "U+0000 (\\u0000)");
    BAD("[\"a\\\\\\u0000\"]", DSQ_JSON_NUL, 5, 1, 6, "U+0000");
    expect_bad("[\"a\0\"]", 6, DSQ_JSON_NUL, 3, 1, 4, "U+0000");
    expect_bad("\0{}", 3, DSQ_JSON_NUL, 0, 1, 1, "U+0000");
    /* after the value too: a C string's terminator is not whitespace */
    expect_bad("{\"a\":1}\0", 8, DSQ_JSON_NUL, 7, 1, 8, "U+0000");
    expect_bad("{\"a\":1}\n\0\0 ", 11, DSQ_JSON_NUL, 8, 2, 1, "U+0000");
}

static void test_duplicate_keys(void **state)
{
    (void)state;
    /* the key as sent, where its opening quote is */
    BAD("{\"stream\":true,\"stream\":false}", DSQ_JSON_DUPLICATE_KEY, 15, 1, 16,
        "duplicate key \"stream\"");
    BAD("[{\"a\":{\"b\":1,\"b\":[]}}]", DSQ_JSON_DUPLICATE_KEY, 13, 1, 14,
        "duplicate key \"b\"");
    /* equal after unescaping */
    BAD("{\"a\":1,\"\\u0061\":2}", DSQ_JSON_DUPLICATE_KEY, 7, 1, 8,
        "duplicate key \"\\u0061\"");
    BAD("{\"a\\\"\":1,\"a\\\"\":2}", DSQ_JSON_DUPLICATE_KEY, 9, 1, 10,
        "duplicate key \"a\\\"\"");
    BAD("{\"\":1,\"\":2}", DSQ_JSON_DUPLICATE_KEY, 6, 1, 7, "duplicate key \"\"");
    /* lines and columns: LF ends a line; a column is a character */
    BAD("{\n  \"a\": 1,\n  \"a\": 2\n}", DSQ_JSON_DUPLICATE_KEY, 14, 3, 3,
        "duplicate key \"a\"");
    BAD("{\"\xC3\xA9\":1,\"\xC3\xA9\":2}", DSQ_JSON_DUPLICATE_KEY, 8, 1, 8,
        "duplicate key \"\\xc3\\xa9\"");
    /* a long key is quoted up to 64 bytes */
    {
        char t[400], want[96];
        int n = snprintf(t, sizeof(t), "{\"%0100d\":1,\"%0100d\":2}", 0, 0);
        snprintf(want, sizeof(want), "duplicate key \"%064d...\"", 0);
        expect_bad(t, (size_t)n, DSQ_JSON_DUPLICATE_KEY, 106, 1, 107, want);
    }
}

/* Depth: jansson stops at 2048 levels (cJSON, after it, at 1000). */
static void test_depth(void **state)
{
    enum { N = 2049 };
    char *t = malloc(2 * N);
    dsq_json_error_t e;
    (void)state;
    memset(t, '[', N);
    memset(t + N, ']', N);
    assert_int_equal(check(t + 1, 2 * N - 2, &e), DSQ_OK);
    assert_int_equal(check(t, 2 * N, &e), DSQ_EINVAL);
    assert_int_equal(e.fault, DSQ_JSON_SYNTAX);
    assert_non_null(strstr(e.message, "maximum parsing depth"));
    free(t);
}

/* The message is one line of printable ASCII whatever jansson quotes. */
static void test_message_printable(void **state)
{
    (void)state;
    BAD("[\"\xC3\xA9\x01\"]", DSQ_JSON_SYNTAX, 4, 1, 4, "control character 0x1 near '\"\\xc3\\xa9'");
    BAD("{\"a\":1}\n\xC3\xA9", DSQ_JSON_SYNTAX, 10, 2, 2, "end of file expected near '\\xc3\\xa9'");
}

static void test_locate(void **state)
{
    dsq_json_error_t e;
    const char *t = "ab\n\xC3\xA9x\r\ny";
    (void)state;
    dsq_json_locate(t, strlen(t), 0, &e);
    assert_string_equal(e.where, "at byte 0 (line 1, column 1)");
    dsq_json_locate(t, strlen(t), 5, &e);     /* x, after a 2-byte e-acute */
    assert_string_equal(e.where, "at byte 5 (line 2, column 2)");
    dsq_json_locate(t, strlen(t), 8, &e);     /* y: CR LF is one line end */
    assert_string_equal(e.where, "at byte 8 (line 3, column 1)");
    dsq_json_locate(t, strlen(t), 99, &e);    /* clamped */
    assert_int_equal(e.byte, strlen(t));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takes),
        cmocka_unit_test(test_refuses),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_message_printable),
        cmocka_unit_test(test_locate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

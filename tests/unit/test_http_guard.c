/* tests for server/http_guard.c: the byte machine that reads HTTP/1.1
 * framing before libmicrohttpd. Which requests it takes and refuses, the
 * status, and the offset of the first refused byte, written out by hand
 * from RFC 9112 (the e2e test tests/e2e/test_http_strict.py compares the
 * daemon with h11, an independent parser). Every case is fed whole and one
 * byte at a time, which must agree: the daemon sees whatever split the
 * network makes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_guard.h"

/* Feed text whole and byte by byte; both must stop at the same byte with
 * the same status. Returns the status (0 = all taken). */
static int feed(const char *text, size_t len, size_t *at)
{
    dsq_http_guard_t a, b;
    size_t whole, split = len;
    dsq_http_guard_reset(&a);
    dsq_http_guard_reset(&b);
    whole = dsq_http_guard_feed(&a, (const uint8_t *)text, len);
    for (size_t i = 0; i < len; i++)
        if (dsq_http_guard_feed(&b, (const uint8_t *)text + i, 1) != 1) {
            split = i;
            break;
        }
    if (whole != split || a.status != b.status)
        fail_msg("whole feed stops at %zu (%d), byte-wise at %zu (%d): %.60s", whole,
                 a.status, split, b.status, text);
    *at = whole;
    return a.status;
}

#define OK(s) do { size_t at_; int st_ = feed(s, sizeof(s) - 1, &at_); \
    if (st_) fail_msg("refused (%d at %zu): %.80s", st_, at_, s); } while (0)
/* refused with status st at the byte `at` (the first byte that cannot be) */
#define BAD(s, st, at) do { size_t at_; int st_ = feed(s, sizeof(s) - 1, &at_); \
    if (st_ != (st) || at_ != (size_t)(at)) \
        fail_msg("got %d at %zu, want %d at %zu: %.80s", st_, at_, st, (size_t)(at), s); \
    } while (0)

static void test_takes(void **state)
{
    (void)state;
    OK("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    OK("GET /health HTTP/1.0\r\n\r\n");                 /* 1.0: Host optional */
    OK("\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");        /* 9112 2.2: empty line first */
    OK("POST /v1/completions HTTP/1.1\r\nHost: a:8000\r\nContent-Type: application/json\r\n"
       "Content-Length: 7\r\n\r\n{\"a\":1}");
    /* the body is not read: any bytes, NUL and bare LF included */
    OK("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n\0\n\r");
    /* chunked, with an extension and a trailer, then a pipelined request */
    OK("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
       "3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Trailer: y\r\n\r\n"
       "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    OK("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  Chunked \r\n\r\n0\r\n\r\n");
    OK("GET / HTTP/1.1\r\nHost: x\r\nContent-Length:  0 \r\n\r\n");
    OK("GET / HTTP/1.1\r\nHost:\r\n\r\n");               /* empty Host: allowed */
    OK("GET / HTTP/1.1\r\nhOsT: x\r\nX-Empty:\r\nX-Obs: caf\xc3\xa9\t!\r\n\r\n");
    OK("GET /a?b=%20&c=d HTTP/1.1\r\nHost: x\r\n\r\n");
    OK("GET / HTTP/1.1\r\nHost: x\r\n");                 /* incomplete: fine so far */
    OK("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999999999\r\n\r\n");
}

static void test_refuses(void **state)
{
    (void)state;
    /* NUL and other control bytes in the head */
    BAD("GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\0junk\r\n\r\n", 400, 48);
    BAD("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n", 400, 31);
    BAD("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x7f\r\n\r\n", 400, 31);
    BAD("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400, 32);
    BAD("GET /a\0b HTTP/1.1\r\nHost: x\r\n\r\n", 400, 6);
    BAD("GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400, 5);
    /* line ends and folding */
    BAD("GET / HTTP/1.1\nHost: x\r\n\r\n", 400, 14);
    BAD("GET / HTTP/1.1\r\nHost: x\n\r\n", 400, 23);
    BAD("GET / HTTP/1.1\r\nHost: x\r\n\n", 400, 25);
    BAD("\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", 400, 0);
    BAD("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 400, 33);
    BAD("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\n\r\n", 400, 33);
    /* field syntax */
    BAD("GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400, 20);
    BAD("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400, 32);
    BAD("GET / HTTP/1.1\r\nHost: x\r\n:x\r\n\r\n", 400, 25);
    BAD("GET / HTTP/1.1\r\nHo(st: x\r\n\r\n", 400, 18);
    /* Host */
    BAD("GET / HTTP/1.1\r\n\r\n", 400, 17);
    BAD("GET / HTTP/1.1\r\nX-A: b\r\n\r\n", 400, 25);
    BAD("GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, 33);
    /* Content-Length */
    BAD("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400, 45);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, 46);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 12345678901234567890123\r\n\r\n",
        400, 66);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 1\r\n\r\n", 400, 47);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
        400, 63);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", 400, 42);
    /* Transfer-Encoding */
    BAD("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        400, 74);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, 59);
    BAD("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, 46);
    /* chunk framing */
    BAD("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nx\r\n", 400, 56);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n", 400, 62);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n", 400, 57);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "1000000000000000\r\n", 400, 71);
    BAD("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "0\r\nContent-Length: 5\r\n\r\n", 400, 77);
    /* request line */
    BAD("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, 14);
    BAD("GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505, 14);
    BAD("GET / HTTP/1.10\r\nHost: x\r\n\r\n", 400, 14);
    BAD("GET / http/1.1\r\nHost: x\r\n\r\n", 400, 14);
    BAD("GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400, 4);
    BAD("GET /\r\n\r\n", 400, 5);
    BAD(" GET / HTTP/1.1\r\n\r\n", 400, 0);
    BAD("GET\t/ HTTP/1.1\r\n\r\n", 400, 3);
}

static void test_limits(void **state)
{
    (void)state;
    size_t at, cap = DSQ_GUARD_MAX_HEAD + 4096;
    char *s = malloc(cap);
    assert_non_null(s);
    /* a request line of 8 KiB with its CRLF is taken, one byte more is 414 */
    int n = snprintf(s, cap, "GET /");
    while (n < DSQ_GUARD_MAX_REQUEST_LINE - 11)
        s[n++] = 'a';
    n += snprintf(s + n, cap - n, " HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(feed(s, (size_t)n, &at), 0);
    n = snprintf(s, cap, "GET /a");
    while (n < DSQ_GUARD_MAX_REQUEST_LINE - 10)
        s[n++] = 'a';
    n += snprintf(s + n, cap - n, " HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(feed(s, (size_t)n, &at), 414);
    assert_int_equal(at, DSQ_GUARD_MAX_REQUEST_LINE);
    /* a head of more than 16 KiB is 431 */
    n = snprintf(s, cap, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ");
    while (n < DSQ_GUARD_MAX_HEAD + 100)
        s[n++] = 'b';
    n += snprintf(s + n, cap - n, "\r\n\r\n");
    assert_int_equal(feed(s, (size_t)n, &at), 431);
    assert_int_equal(at, DSQ_GUARD_MAX_HEAD);
    /* 100 fields are taken, 101 are 431 */
    n = snprintf(s, cap, "GET / HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 99; i++)
        n += snprintf(s + n, cap - n, "X-%d: v\r\n", i);
    int n99 = n;
    n += snprintf(s + n, cap - n, "\r\n");
    assert_int_equal(feed(s, (size_t)n, &at), 0);
    n = n99 + snprintf(s + n99, cap - n99, "X-last: v\r\n\r\n");
    assert_int_equal(feed(s, (size_t)n, &at), 431);
    assert_int_equal(at, (size_t)n99);
    free(s);
}

/* Query arguments and cookies: libmicrohttpd keeps a record of each in
 * its connection pool, so their number is bounded too (200). */
static void test_params(void **state)
{
    (void)state;
    size_t at, cap = 8192;
    char *s = malloc(cap);
    assert_non_null(s);
    for (int many = 200; many <= 201; many++) {
        int n = snprintf(s, cap, "GET /health?a");
        for (int i = 1; i < many; i++)
            n += snprintf(s + n, cap - n, "&a");
        n += snprintf(s + n, cap - n, " HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_int_equal(feed(s, (size_t)n, &at), many > 200 ? 414 : 0);
        n = snprintf(s, cap, "GET / HTTP/1.1\r\nHost: x\r\nCookie: a=1");
        for (int i = 1; i < many; i++)
            n += snprintf(s + n, cap - n, i % 2 ? "; a=1" : ",a=1");
        n += snprintf(s + n, cap - n, "\r\n\r\n");
        assert_int_equal(feed(s, (size_t)n, &at), many > 200 ? 431 : 0);
    }
    /* two Cookie fields count together */
    int n = snprintf(s, cap, "GET /?%s HTTP/1.1\r\nHost: x\r\nCookie: a=1", "a");
    for (int i = 1; i < 150; i++)
        n += snprintf(s + n, cap - n, ";a=1");
    n += snprintf(s + n, cap - n, "\r\nCookie: b=1");
    for (int i = 1; i < 50; i++)
        n += snprintf(s + n, cap - n, ";b=1");
    n += snprintf(s + n, cap - n, "\r\n\r\n");
    assert_int_equal(feed(s, (size_t)n, &at), 431);
    free(s);
}

/* Whole requests before the refused byte, in the same read: the offset
 * past the last of them and their number, so that they are answered
 * first; none when the refused request began in an earlier read. */
static void test_boundary(void **state)
{
    (void)state;
    dsq_http_guard_t g;
    static const char two[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
                              "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
                              "GET / HTTP/1.1\r\n\r\n";
    dsq_http_guard_reset(&g);
    size_t ok = dsq_http_guard_feed(&g, (const uint8_t *)two, sizeof(two) - 1);
    assert_int_equal(g.status, 400);
    assert_int_equal(ok, sizeof(two) - 2);                 /* the last LF */
    assert_int_equal(g.n_complete, 2);
    assert_int_equal(g.boundary, strlen("GET / HTTP/1.1\r\nHost: a\r\n\r\n"
                                        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"));
    /* the bad request split over two reads: nothing whole before it in
     * the second */
    dsq_http_guard_reset(&g);
    static const char a[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HT";
    assert_int_equal(dsq_http_guard_feed(&g, (const uint8_t *)a, sizeof(a) - 1), sizeof(a) - 1);
    assert_int_equal(g.n_complete, 1);
    static const char b[] = "TP/1.1\r\nX: \x01\r\n\r\n";
    dsq_http_guard_feed(&g, (const uint8_t *)b, sizeof(b) - 1);
    assert_int_equal(g.status, 400);
    assert_int_equal(g.n_complete, 0);
    assert_int_equal(g.boundary, 0);
}

/* The refusal is one whole response with the OpenAI error object, and a
 * refused HEAD gets the headers only. */
static void test_refusal(void **state)
{
    (void)state;
    dsq_http_guard_t g;
    size_t len = 0;
    static const char req[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX: \x01\r\n\r\n";
    dsq_http_guard_reset(&g);
    assert_int_not_equal(dsq_http_guard_feed(&g, (const uint8_t *)req, sizeof(req) - 1),
                         sizeof(req) - 1);
    assert_int_equal(dsq_http_guard_feed(&g, (const uint8_t *)"x", 1), 0);
    char *r = dsq_http_guard_refusal(&g, &len);
    assert_non_null(r);
    assert_int_equal(len, strlen(r));
    assert_true(!strncmp(r, "HTTP/1.1 400 Bad Request\r\n", 26));
    assert_non_null(strstr(r, "\r\nConnection: close\r\n"));
    const char *body = strstr(r, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    assert_true(!strncmp(body, "{\"error\":{\"message\":\"control byte in a header field\"", 52));
    char cl[64];
    snprintf(cl, sizeof(cl), "Content-Length: %zu\r\n", strlen(body));
    assert_non_null(strstr(r, cl));
    free(r);

    static const char head[] = "HEAD / HTTP/2.0\r\n";
    dsq_http_guard_reset(&g);
    dsq_http_guard_feed(&g, (const uint8_t *)head, sizeof(head) - 1);
    assert_int_equal(g.status, 505);
    r = dsq_http_guard_refusal(&g, &len);
    assert_non_null(r);
    assert_true(!strncmp(r, "HTTP/1.1 505 HTTP Version Not Supported\r\n", 41));
    assert_int_equal(r[len - 1], '\n');    /* ends with the head */
    assert_int_equal(r[len - 3], '\n');
    assert_null(strstr(r, "{"));
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takes),
        cmocka_unit_test(test_refuses),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_params),
        cmocka_unit_test(test_boundary),
        cmocka_unit_test(test_refusal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* GBNF text building blocks shared by the converters (grammar_regex.c,
 * grammar_schema.c, grammar_tools.c): a growing text buffer, GBNF string
 * literals, and integer or number ranges as digit-by-digit alternatives.
 *
 * A converter appends many small pieces and checks for out of memory only
 * once at the end (the buffer's oom flag), which keeps every converter's
 * code free of per-append error paths. Ranges are written out as exact
 * alternatives rather than checked afterwards, because the grammar is the
 * only check there is: what it accepts is what the model may write. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_gbnf_internal.h"

#define UNBOUNDED UINT64_MAX
#define MAX_INT_DIGITS 16

typedef dsq__sbuf_t sbuf_t;
typedef dsq__bounds_t bounds_t;

/* ------------------------------------------------------------ text buffer */

void dsq__sb_add(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom || !n)   /* s may be NULL when n is 0 (an empty piece) */
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void dsq__sb_str(sbuf_t *b, const char *s) { dsq__sb_add(b, s, strlen(s)); }

void dsq__sb_fmt(sbuf_t *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(tmp)) {
        char *big = malloc((size_t)n + 1);
        if (big) {
            vsnprintf(big, (size_t)n + 1, fmt, ap2);
            dsq__sb_add(b, big, (size_t)n);
            free(big);
        } else {
            b->oom = true;
        }
    } else if (n > 0) {
        dsq__sb_add(b, tmp, (size_t)n);
    }
    va_end(ap2);
}

/* A GBNF literal of n bytes: '"' and '\\' escaped, control bytes \xHH,
 * other bytes (UTF-8 included) as they are. */
void dsq__sb_lit(sbuf_t *b, const char *s, size_t n)
{
    dsq__sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            dsq__sb_add(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            dsq__sb_fmt(b, "\\x%02X", c);
        } else {
            dsq__sb_add(b, (const char *)&c, 1);
        }
    }
    dsq__sb_str(b, "\"");
}

/* ------------------------------------------------------ integer ranges */

static int n_digits(uint64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static uint64_t pow10u(int n)
{
    uint64_t p = 1;
    while (n-- > 0)
        p *= 10;
    return p;
}

static bool all_digit(const char *s, int n, char d)
{
    for (int i = 0; i < n; i++)
        if (s[i] != d)
            return false;
    return true;
}

/* Numerals of n digits from a to b (digit strings, a <= b): the classic
 * split of a range into a prefix-fixed head, a free middle and a tail. */
static void digit_range(sbuf_t *o, const char *a, const char *b, int n)
{
    if (n == 0)
        return;
    if (a[0] == b[0]) {
        dsq__sb_fmt(o, "\"%c\" ", a[0]);
        digit_range(o, a + 1, b + 1, n - 1);
        return;
    }
    char nines[MAX_INT_DIGITS + 2], zeros[MAX_INT_DIGITS + 2];
    memset(nines, '9', sizeof(nines));
    memset(zeros, '0', sizeof(zeros));
    bool a_free = all_digit(a + 1, n - 1, '0'), b_free = all_digit(b + 1, n - 1, '9');
    char lo = a[0], hi = b[0];
    bool first = true;
    dsq__sb_str(o, "( ");
    if (!a_free) {
        dsq__sb_fmt(o, "\"%c\" ", a[0]);
        digit_range(o, a + 1, nines, n - 1);
        lo++;
        first = false;
    }
    if (!b_free)
        hi--;
    if (lo <= hi) {
        dsq__sb_str(o, first ? "" : "| ");
        if (lo == hi)
            dsq__sb_fmt(o, "\"%c\" ", lo);
        else
            dsq__sb_fmt(o, "[%c-%c] ", lo, hi);
        if (n > 1)
            dsq__sb_fmt(o, "[0-9]{%d} ", n - 1);
        first = false;
    }
    if (!b_free) {
        dsq__sb_str(o, first ? "" : "| ");
        dsq__sb_fmt(o, "\"%c\" ", b[0]);
        digit_range(o, zeros, b + 1, n - 1);
    }
    dsq__sb_str(o, ") ");
}

/* Decimal numerals without leading zeros of the values lo..hi (hi
 * UNBOUNDED: up to MAX_INT_DIGITS digits). */
static void uint_range(sbuf_t *o, uint64_t lo, uint64_t hi)
{
    int nlo = n_digits(lo), nhi = hi == UNBOUNDED ? MAX_INT_DIGITS : n_digits(hi);
    dsq__sb_str(o, "( ");
    for (int len = nlo; len <= nhi; len++) {
        uint64_t from = len == nlo ? lo : pow10u(len - 1);
        uint64_t to = len == nhi && hi != UNBOUNDED ? hi : pow10u(len) - 1;
        char a[24], b[24];
        snprintf(a, sizeof(a), "%llu", (unsigned long long)from);
        snprintf(b, sizeof(b), "%llu", (unsigned long long)to);
        dsq__sb_str(o, len == nlo ? "" : "| ");
        digit_range(o, a, b, len);
    }
    dsq__sb_str(o, ") ");
}

void dsq__int_expr(sbuf_t *o, const bounds_t *bd)
{
    bool alt = false;
    dsq__sb_str(o, "( ");
    if (!bd->has_hi || bd->hi >= 0) {
        uint64_t lo = bd->has_lo && bd->lo > 0 ? (uint64_t)bd->lo : 0;
        uint_range(o, lo, bd->has_hi ? (uint64_t)bd->hi : UNBOUNDED);
        alt = true;
    }
    if (!bd->has_lo || bd->lo < 0) {
        /* -m with m >= 1 (no "-0") */
        uint64_t mlo = bd->has_hi && bd->hi < 0 ? (uint64_t)-bd->hi : 1;
        uint64_t mhi = bd->has_lo ? (uint64_t)-bd->lo : UNBOUNDED;
        dsq__sb_str(o, alt ? "| \"-\" " : "\"-\" ");
        uint_range(o, mlo, mhi);
    }
    dsq__sb_str(o, ") ");
}

/* Numbers (fraction allowed, no exponent) in [lo, hi], whole bounds. */
void dsq__num_expr(sbuf_t *o, const bounds_t *bd)
{
    bool alt = false;
    dsq__sb_str(o, "( ");
    if (!bd->has_hi || bd->hi >= 0) {
        uint64_t lo = bd->has_lo && bd->lo > 0 ? (uint64_t)bd->lo : 0;
        if (!bd->has_hi) {
            uint_range(o, lo, UNBOUNDED);
            dsq__sb_str(o, "jfrac? ");
        } else {
            uint64_t hi = (uint64_t)bd->hi;
            if (lo < hi) {
                uint_range(o, lo, hi - 1);
                dsq__sb_str(o, "jfrac? | ");
            }
            dsq__sb_fmt(o, "\"%llu\" ", (unsigned long long)hi);
        }
        alt = true;
    }
    if (!bd->has_lo || bd->lo < 0) {
        /* -m: m in [H, U], a fraction only below U */
        uint64_t h = bd->has_hi && bd->hi < 0 ? (uint64_t)-bd->hi : 0;
        dsq__sb_str(o, alt ? "| \"-\" ( " : "\"-\" ( ");
        if (!bd->has_lo) {
            uint_range(o, h, UNBOUNDED);
            dsq__sb_str(o, "jfrac? ");
        } else {
            uint64_t u = (uint64_t)-bd->lo;
            if (h < u) {
                uint_range(o, h, u - 1);
                dsq__sb_str(o, "jfrac? | ");
            }
            dsq__sb_fmt(o, "\"%llu\" ", (unsigned long long)u);
        }
        dsq__sb_str(o, ") ");
    }
    dsq__sb_str(o, ") ");
}

/* JSON Schema and regular expressions -> GBNF (grammar.h), the text the
 * grammar compiler takes.
 *
 * Every sentence of the grammar made from a schema is an instance that
 * validates against it (JSON Schema 2020-12, json-schema.org/draft/2020-12,
 * Core and Validation; the draft 4-7 spellings of the same keywords are
 * read too). The grammar may be narrower than the schema: properties come
 * in the order the schema lists them and no others are written, optional
 * ones may be left out; whitespace is at most 16 characters a gap (as the
 * json_object built-in); numbers have at most 16 integer and 16 fraction
 * digits. A keyword this file cannot honour exactly is an error naming it
 * (DSQ_EUNSUPPORTED), never ignored.
 *
 * The regex dialect is the common subset of ECMA-262 (what JSON Schema's
 * "pattern" means) and Python's re: literals, ., classes with ranges and
 * negation, \d \w \s \D \W \S, escapes, groups (capturing, (?:...),
 * named), |, the quantifiers * + ? {m} {m,} {m,n} (lazy forms are the
 * same language), ^ at the start and $ at the end. Backreferences,
 * lookaround, word boundaries and inline flags are DSQ_EUNSUPPORTED. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/hex.h"
#include "grammar.h"

#define MAX_SCHEMA_DEPTH 64
#define MAX_REFS 256
#define MAX_RANGES 512
#define UNBOUNDED UINT64_MAX
#define MAX_INT_DIGITS 16

/* ------------------------------------------------------------ text buffer */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *s, size_t n)
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

static void sb_str(sbuf_t *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_fmt(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf_t *b, const char *fmt, ...)
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
            sb_add(b, big, (size_t)n);
            free(big);
        } else {
            b->oom = true;
        }
    } else if (n > 0) {
        sb_add(b, tmp, (size_t)n);
    }
    va_end(ap2);
}

/* A GBNF literal of n bytes: '"' and '\\' escaped, control bytes \xHH,
 * other bytes (UTF-8 included) as they are. */
static void sb_lit(sbuf_t *b, const char *s, size_t n)
{
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_add(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            sb_fmt(b, "\\x%02X", c);
        } else {
            sb_add(b, (const char *)&c, 1);
        }
    }
    sb_str(b, "\"");
}

/* One code point inside a GBNF class. */
static void sb_class_cp(sbuf_t *b, uint32_t c)
{
    if (c == ']' || c == '[' || c == '\\' || c == '^' || c == '-' || c == '"')
        sb_fmt(b, "\\%c", (char)c);
    else if (c < 0x20 || c == 0x7f)
        sb_fmt(b, "\\x%02X", (unsigned)c);
    else if (c < 0x80)
        sb_fmt(b, "%c", (char)c);
    else if (c <= 0xffff)
        sb_fmt(b, "\\u%04X", (unsigned)c);
    else
        sb_fmt(b, "\\U%08X", (unsigned)c);
}

/* ---------------------------------------------------------- shared rules */

/* JSON pieces every schema grammar may use (RFC 8259): ws as the
 * json_object built-in; jchar1 is one code point (no \u escape of a
 * surrogate, whose pair would count as one character of a length bound
 * but two here). */
static const char base_rules[] =
    "ws ::= [ \\t\\n\\r]{0,16}\n"
    "jhex ::= [0-9a-fA-F]\n"
    "jchar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" jhex{4} )\n"
    "jchar1 ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] jhex{3}"
    " | [dD] [0-7] jhex{2} ) )\n"
    "jstring ::= \"\\\"\" jchar* \"\\\"\"\n"
    "jint ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "jfrac ::= \".\" [0-9]{1,16}\n"
    "jnumber ::= jint jfrac? ( [eE] [-+]? [0-9]{1,2} )?\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | \"true\" | \"false\" | \"null\"\n"
    "jobject ::= \"{\" ws ( jstring ws \":\" ws jvalue ws ( \",\" ws jstring ws \":\" ws jvalue ws )* )?"
    " \"}\"\n"
    "jarray ::= \"[\" ws ( jvalue ws ( \",\" ws jvalue ws )* )? \"]\"\n"
    "jempty ::= \"\"\n";

/* ------------------------------------------------------- converter state */

typedef struct conv {
    const cJSON *root;
    sbuf_t rules;                  /* rule definitions made so far          */
    int n_rules;
    struct {
        const cJSON *target;
        int rule;
    } refs[MAX_REFS];
    int n_refs;
    char path[512];                /* JSON pointer of the schema at hand    */
    char *err;
    size_t err_len;
    int depth;
} conv_t;

static int fail(conv_t *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(conv_t *c, int rc, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->err && c->err_len)
        snprintf(c->err, c->err_len, "%s (at %s)", msg, c->path[0] ? c->path : "the root");
    return rc;
}

/* Append "/key" to the path; returns the old length for path_pop. */
static size_t path_push(conv_t *c, const char *key)
{
    size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof(c->path) - n, "/%s", key);
    return n;
}

static size_t path_push_i(conv_t *c, int i)
{
    char k[16];
    snprintf(k, sizeof(k), "%d", i);
    return path_push(c, k);
}

static void path_pop(conv_t *c, size_t n) { c->path[n] = 0; }

/* A new rule "sN ::= body"; returns N (its name is "s%d"). */
static int add_rule(conv_t *c, const sbuf_t *body)
{
    int id = c->n_rules++;
    sb_fmt(&c->rules, "s%d ::= ", id);
    sb_add(&c->rules, body->p ? body->p : "jempty", body->p ? body->n : 6);
    sb_str(&c->rules, "\n");
    return id;
}

static int schema_expr(conv_t *c, const cJSON *s, sbuf_t *out);

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
        sb_fmt(o, "\"%c\" ", a[0]);
        digit_range(o, a + 1, b + 1, n - 1);
        return;
    }
    char nines[MAX_INT_DIGITS + 2], zeros[MAX_INT_DIGITS + 2];
    memset(nines, '9', sizeof(nines));
    memset(zeros, '0', sizeof(zeros));
    bool a_free = all_digit(a + 1, n - 1, '0'), b_free = all_digit(b + 1, n - 1, '9');
    char lo = a[0], hi = b[0];
    bool first = true;
    sb_str(o, "( ");
    if (!a_free) {
        sb_fmt(o, "\"%c\" ", a[0]);
        digit_range(o, a + 1, nines, n - 1);
        lo++;
        first = false;
    }
    if (!b_free)
        hi--;
    if (lo <= hi) {
        sb_str(o, first ? "" : "| ");
        if (lo == hi)
            sb_fmt(o, "\"%c\" ", lo);
        else
            sb_fmt(o, "[%c-%c] ", lo, hi);
        if (n > 1)
            sb_fmt(o, "[0-9]{%d} ", n - 1);
        first = false;
    }
    if (!b_free) {
        sb_str(o, first ? "" : "| ");
        sb_fmt(o, "\"%c\" ", b[0]);
        digit_range(o, zeros, b + 1, n - 1);
    }
    sb_str(o, ") ");
}

/* Decimal numerals without leading zeros of the values lo..hi (hi
 * UNBOUNDED: up to MAX_INT_DIGITS digits). */
static void uint_range(sbuf_t *o, uint64_t lo, uint64_t hi)
{
    int nlo = n_digits(lo), nhi = hi == UNBOUNDED ? MAX_INT_DIGITS : n_digits(hi);
    sb_str(o, "( ");
    for (int len = nlo; len <= nhi; len++) {
        uint64_t from = len == nlo ? lo : pow10u(len - 1);
        uint64_t to = len == nhi && hi != UNBOUNDED ? hi : pow10u(len) - 1;
        char a[24], b[24];
        snprintf(a, sizeof(a), "%llu", (unsigned long long)from);
        snprintf(b, sizeof(b), "%llu", (unsigned long long)to);
        sb_str(o, len == nlo ? "" : "| ");
        digit_range(o, a, b, len);
    }
    sb_str(o, ") ");
}

typedef struct bounds {
    bool has_lo, has_hi;
    int64_t lo, hi;                /* inclusive */
} bounds_t;

static void int_expr(sbuf_t *o, const bounds_t *bd)
{
    bool alt = false;
    sb_str(o, "( ");
    if (!bd->has_hi || bd->hi >= 0) {
        uint64_t lo = bd->has_lo && bd->lo > 0 ? (uint64_t)bd->lo : 0;
        uint_range(o, lo, bd->has_hi ? (uint64_t)bd->hi : UNBOUNDED);
        alt = true;
    }
    if (!bd->has_lo || bd->lo < 0) {
        /* -m with m >= 1 (no "-0") */
        uint64_t mlo = bd->has_hi && bd->hi < 0 ? (uint64_t)-bd->hi : 1;
        uint64_t mhi = bd->has_lo ? (uint64_t)-bd->lo : UNBOUNDED;
        sb_str(o, alt ? "| \"-\" " : "\"-\" ");
        uint_range(o, mlo, mhi);
    }
    sb_str(o, ") ");
}

/* Numbers (fraction allowed, no exponent) in [lo, hi], whole bounds. */
static void num_expr(sbuf_t *o, const bounds_t *bd)
{
    bool alt = false;
    sb_str(o, "( ");
    if (!bd->has_hi || bd->hi >= 0) {
        uint64_t lo = bd->has_lo && bd->lo > 0 ? (uint64_t)bd->lo : 0;
        if (!bd->has_hi) {
            uint_range(o, lo, UNBOUNDED);
            sb_str(o, "jfrac? ");
        } else {
            uint64_t hi = (uint64_t)bd->hi;
            if (lo < hi) {
                uint_range(o, lo, hi - 1);
                sb_str(o, "jfrac? | ");
            }
            sb_fmt(o, "\"%llu\" ", (unsigned long long)hi);
        }
        alt = true;
    }
    if (!bd->has_lo || bd->lo < 0) {
        /* -m: m in [H, U], a fraction only below U */
        uint64_t h = bd->has_hi && bd->hi < 0 ? (uint64_t)-bd->hi : 0;
        sb_str(o, alt ? "| \"-\" ( " : "\"-\" ( ");
        if (!bd->has_lo) {
            uint_range(o, h, UNBOUNDED);
            sb_str(o, "jfrac? ");
        } else {
            uint64_t u = (uint64_t)-bd->lo;
            if (h < u) {
                uint_range(o, h, u - 1);
                sb_str(o, "jfrac? | ");
            }
            sb_fmt(o, "\"%llu\" ", (unsigned long long)u);
        }
        sb_str(o, ") ");
    }
    sb_str(o, ") ");
}

/* Read minimum/maximum/exclusive* into whole inclusive bounds. */
static int read_bounds(conv_t *c, const cJSON *s, bool integer, bounds_t *bd)
{
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    memset(bd, 0, sizeof(*bd));
    const cJSON *xmin = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *xmax = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, keys[k]);
        if (!v || cJSON_IsBool(v))
            continue;   /* draft 4's boolean exclusive*: read with minimum */
        if (!cJSON_IsNumber(v))
            return fail(c, DSQ_EINVAL, "'%s' must be a number", keys[k]);
        double d = v->valuedouble;
        if (!(fabs(d) < 1e15))
            return fail(c, DSQ_EUNSUPPORTED, "'%s' beyond +-1e15 is not supported", keys[k]);
        bool excl = k == 1 || k == 3;
        bool is_min = k < 2;
        if (k == 0 && cJSON_IsTrue(xmin))
            excl = true;
        if (k == 2 && cJSON_IsTrue(xmax))
            excl = true;
        double r = is_min ? ceil(d) : floor(d);
        if (!integer && (r != d || excl))
            return fail(c, DSQ_EUNSUPPORTED,
                        "'%s' %g on a number: only inclusive whole-number bounds are "
                        "supported (use type integer, or minimum/maximum)", keys[k], d);
        int64_t b = (int64_t)r;
        if (excl && r == d)
            b += is_min ? 1 : -1;
        if (is_min) {
            if (!bd->has_lo || b > bd->lo)
                bd->lo = b;
            bd->has_lo = true;
        } else {
            if (!bd->has_hi || b < bd->hi)
                bd->hi = b;
            bd->has_hi = true;
        }
    }
    if (bd->has_lo && bd->has_hi && bd->lo > bd->hi)
        return fail(c, DSQ_EINVAL, "no %s lies within the bounds",
                    integer ? "integer" : "number");
    return DSQ_OK;
}

/* ------------------------------------------------------------- regex */

typedef struct range {
    uint32_t lo, hi;
} range_t;

typedef struct cset {
    range_t r[MAX_RANGES];
    int n;
} cset_t;

static int range_cmp(const void *a, const void *b)
{
    const range_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static bool cset_add(cset_t *s, uint32_t lo, uint32_t hi)
{
    if (s->n == MAX_RANGES)
        return false;
    s->r[s->n++] = (range_t){lo, hi};
    return true;
}

/* Sort and merge overlapping or adjacent ranges. */
static void cset_norm(cset_t *s)
{
    if (s->n == 0)
        return;
    qsort(s->r, (size_t)s->n, sizeof(s->r[0]), range_cmp);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi)
                s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

static void cset_negate(cset_t *s)
{
    cset_norm(s);
    cset_t t = {.n = 0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next)
            cset_add(&t, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= 0x10ffff)
        cset_add(&t, next, 0x10ffff);
    *s = t;
}

static bool cset_has(const cset_t *s, uint32_t c)
{
    for (int i = 0; i < s->n; i++)
        if (c >= s->r[i].lo && c <= s->r[i].hi)
            return true;
    return false;
}

/* Remove [lo, hi] from a normalised set. */
static void cset_remove(cset_t *s, uint32_t lo, uint32_t hi)
{
    cset_t t = {.n = 0};
    for (int i = 0; i < s->n; i++) {
        range_t r = s->r[i];
        if (r.hi < lo || r.lo > hi) {
            cset_add(&t, r.lo, r.hi);
            continue;
        }
        if (r.lo < lo)
            cset_add(&t, r.lo, lo - 1);
        if (r.hi > hi)
            cset_add(&t, hi + 1, r.hi);
    }
    *s = t;
}

/* Render a set as GBNF. json: inside a JSON string, so '"' and '\\' are
 * written as their escapes, \n \r \t as "\\n"..., other control characters
 * are left out (a subset of the set: still sound). */
static void cset_emit(sbuf_t *o, cset_t s, bool json)
{
    cset_norm(&s);
    bool alt = false;
    sb_str(o, "( ");
    if (json) {
        static const struct {
            uint32_t c;
            const char *esc;
        } e[] = {{'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'\n', "\"\\\\n\""},
                 {'\r', "\"\\\\r\""}, {'\t', "\"\\\\t\""}};
        for (size_t i = 0; i < sizeof(e) / sizeof(e[0]); i++) {
            if (cset_has(&s, e[i].c)) {
                sb_str(o, alt ? "| " : "");
                sb_str(o, e[i].esc);
                sb_str(o, " ");
                alt = true;
            }
        }
        /* the other control characters as JSON writes them (RFC 8259
         * section 7: \u00XX), so a pattern that needs one still matches */
        for (uint32_t c = 0; c < 0x20; c++) {
            if (c != '\n' && c != '\r' && c != '\t' && cset_has(&s, c)) {
                sb_fmt(o, "%s\"\\\\u%04x\" ", alt ? "| " : "", (unsigned)c);
                alt = true;
            }
        }
        cset_remove(&s, 0, 0x1f);
        cset_remove(&s, '"', '"');
        cset_remove(&s, '\\', '\\');
    }
    if (s.n > 0) {
        sb_str(o, alt ? "| [" : "[");
        for (int i = 0; i < s.n; i++) {
            sb_class_cp(o, s.r[i].lo);
            if (s.r[i].hi > s.r[i].lo) {
                sb_str(o, "-");
                sb_class_cp(o, s.r[i].hi);
            }
        }
        sb_str(o, "] ");
        alt = true;
    }
    if (!alt)
        sb_str(o, "[] ");   /* nothing: a class no character matches */
    sb_str(o, ") ");
}

typedef struct rx {
    const char *s;
    size_t n, i;
    bool json;
    bool uni;                      /* the last escape was \d \w \s or a complement */
    bool want_ne;                  /* build each piece's ne (rx_piece_t)     */
    struct {
        size_t at, len;            /* a group name, as bytes of s           */
    } *names;
    int n_names, cap_names;
    int depth;
    char *err;
    size_t err_len;
} rx_t;

static int rx_fail(rx_t *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rx_fail(rx_t *x, int rc, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (x->err && x->err_len)
        snprintf(x->err, x->err_len, "regex at offset %zu: %s", x->i, msg);
    return rc;
}

/* Next UTF-8 code point of the pattern; -1 on invalid UTF-8. */
static int32_t rx_cp(rx_t *x)
{
    const unsigned char *p = (const unsigned char *)x->s + x->i;
    size_t left = x->n - x->i;
    uint32_t c = p[0];
    int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
            : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || (size_t)len > left)
        return -1;
    if (len > 1) {
        c &= 0xff >> (len + 1);
        for (int k = 1; k < len; k++) {
            if ((p[k] & 0xc0) != 0x80)
                return -1;
            c = c << 6 | (p[k] & 0x3f);
        }
    }
    x->i += (size_t)len;
    return (int32_t)c;
}

/* The escape after a backslash as a set (one character or a shorthand
 * class). */
static int rx_escape(rx_t *x, cset_t *set)
{
    if (x->i >= x->n)
        return rx_fail(x, DSQ_EINVAL, "a trailing backslash");
    char e = x->s[x->i++];
    set->n = 0;
    switch (e) {
    case 'd': case 'D':
        cset_add(set, '0', '9');
        break;
    case 'w': case 'W':
        cset_add(set, '0', '9');
        cset_add(set, 'A', 'Z');
        cset_add(set, '_', '_');
        cset_add(set, 'a', 'z');
        break;
    case 's': case 'S':
        cset_add(set, '\t', '\r');
        cset_add(set, ' ', ' ');
        break;
    case 'n': cset_add(set, '\n', '\n'); return DSQ_OK;
    case 't': cset_add(set, '\t', '\t'); return DSQ_OK;
    case 'r': cset_add(set, '\r', '\r'); return DSQ_OK;
    case 'f': cset_add(set, '\f', '\f'); return DSQ_OK;
    case 'v': cset_add(set, '\v', '\v'); return DSQ_OK;
    case 'x': case 'u': {
        int nd = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = x->i < x->n ? dsq_hex_value(x->s[x->i]) : -1;
            if (h < 0)
                return rx_fail(x, DSQ_EINVAL, "\\%c needs %d hex digits", e, nd);
            v = v << 4 | (uint32_t)h;
            x->i++;
        }
        cset_add(set, v, v);
        return DSQ_OK;
    }
    case 'b': case 'B': case 'A': case 'Z': case 'z': case 'G':
        return rx_fail(x, DSQ_EUNSUPPORTED, "\\%c (an anchor) is not supported", e);
    default:
        if (e >= '0' && e <= '9')
            return rx_fail(x, DSQ_EUNSUPPORTED, "backreferences (\\%c) are not supported", e);
        if (isalpha((unsigned char)e))
            return rx_fail(x, DSQ_EUNSUPPORTED, "the escape \\%c is not supported", e);
        if ((unsigned char)e >= 0x80) {
            x->i--;
            int32_t c = rx_cp(x);
            if (c < 0)
                return rx_fail(x, DSQ_EINVAL, "invalid UTF-8");
            cset_add(set, (uint32_t)c, (uint32_t)c);
            return DSQ_OK;
        }
        cset_add(set, (uint32_t)(unsigned char)e, (uint32_t)(unsigned char)e);
        return DSQ_OK;
    }
    x->uni = true;
    if (isupper((unsigned char)e)) {
        cset_negate(set);
        /* inside a schema the reference is Python's re in Unicode mode
         * (jsonschema), whose \d \w \s also hold non-ASCII characters:
         * their complements keep to ASCII, so they stay a subset */
        if (x->json)
            cset_remove(set, 0x80, 0x10ffff);
    }
    return DSQ_OK;
}

/* [...] after the '['. */
static int rx_class(rx_t *x, cset_t *set)
{
    bool neg = x->i < x->n && x->s[x->i] == '^';
    if (neg)
        x->i++;
    set->n = 0;
    bool first = true, uni = false;
    for (;;) {
        if (x->i >= x->n)
            return rx_fail(x, DSQ_EINVAL, "an unterminated [");
        if (x->s[x->i] == ']' && !first) {
            x->i++;
            break;
        }
        first = false;
        cset_t one = {.n = 0};
        uint32_t lo;
        if (x->s[x->i] == '[' && x->i + 1 < x->n && x->s[x->i + 1] == ':')
            return rx_fail(x, DSQ_EUNSUPPORTED, "POSIX classes [:name:] are not supported");
        if (x->s[x->i] == '\\') {
            x->i++;
            x->uni = false;
            int rc = rx_escape(x, &one);
            if (rc)
                return rc;
            uni |= x->uni;
        } else {
            int32_t c = rx_cp(x);
            if (c < 0)
                return rx_fail(x, DSQ_EINVAL, "invalid UTF-8");
            cset_add(&one, (uint32_t)c, (uint32_t)c);
        }
        bool single = one.n == 1 && one.r[0].lo == one.r[0].hi;
        lo = one.r[0].lo;
        if (!single && x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']')
            return rx_fail(x, DSQ_EINVAL, "a range starts at a class shorthand");
        if (single && x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
            x->i++;
            cset_t two = {.n = 0};
            if (x->s[x->i] == '\\') {
                x->i++;
                int rc = rx_escape(x, &two);
                if (rc)
                    return rc;
                if (two.n != 1 || two.r[0].lo != two.r[0].hi)
                    return rx_fail(x, DSQ_EINVAL, "a range ends in a class shorthand");
            } else {
                int32_t c = rx_cp(x);
                if (c < 0)
                    return rx_fail(x, DSQ_EINVAL, "invalid UTF-8");
                cset_add(&two, (uint32_t)c, (uint32_t)c);
            }
            if (two.r[0].lo < lo)
                return rx_fail(x, DSQ_EINVAL, "a range out of order");
            if (!cset_add(set, lo, two.r[0].lo))
                return rx_fail(x, DSQ_ERANGE, "a class of too many ranges");
            continue;
        }
        for (int k = 0; k < one.n; k++)
            if (!cset_add(set, one.r[k].lo, one.r[k].hi))
                return rx_fail(x, DSQ_ERANGE, "a class of too many ranges");
    }
    if (neg) {
        cset_negate(set);
        if (x->json && uni)   /* as for \D above */
            cset_remove(set, 0x80, 0x10ffff);
    }
    return DSQ_OK;
}

typedef struct rx_piece rx_piece_t;
static int rx_alt(rx_t *x, rx_piece_t *out);

/* One atom's set into o. Outside a JSON string U+0000 cannot be generated
 * (outputs are C strings): a class keeps its other characters, a NUL
 * alone is refused rather than dropped from the language. */
static int rx_emit(rx_t *x, sbuf_t *o, cset_t set)
{
    if (!x->json && cset_has(&set, 0)) {
        cset_remove(&set, 0, 0);
        if (set.n == 0)
            return rx_fail(x, DSQ_EUNSUPPORTED, "U+0000 (NUL) cannot be generated");
    }
    cset_emit(o, set, x->json);
    return DSQ_OK;
}

/* Whether a counted repetition {m}, {m,}, {,n} or {m,n} starts at s[j]
 * (otherwise Python reads the '{' as a literal). */
static bool rx_counted_at(const rx_t *x, size_t j)
{
    if (j >= x->n || x->s[j] != '{')
        return false;
    j++;
    bool digits = false;
    while (j < x->n && isdigit((unsigned char)x->s[j]))
        j++, digits = true;
    if (j < x->n && x->s[j] == ',') {
        j++;
        while (j < x->n && isdigit((unsigned char)x->s[j]))
            j++, digits = true;
    }
    return digits && j < x->n && x->s[j] == '}';
}

/* A quantifier after an atom, if any: *m and *n (-1: unbounded) of the
 * repetition, m = n = 1 when there is none. */
static int rx_quant(rx_t *x, long *m, long *n)
{
    *m = *n = 1;
    if (x->i >= x->n)
        return DSQ_OK;
    char q = x->s[x->i];
    if (q == '*' || q == '+' || q == '?') {
        x->i++;
        *m = q == '+';
        *n = q == '?' ? 1 : -1;
    } else if (q == '{') {
        size_t j = x->i + 1;
        long lo = -1, hi;
        char *end;
        if (j < x->n && isdigit((unsigned char)x->s[j])) {
            lo = strtol(x->s + j, &end, 10);
            j = (size_t)(end - x->s);
        } else if (j < x->n && x->s[j] == ',') {
            lo = 0;   /* {,n}: Python's {0,n} */
        }
        if (lo < 0)
            return DSQ_OK;   /* a literal '{' (Python's reading) */
        hi = lo;
        if (j < x->n && x->s[j] == ',') {
            j++;
            hi = -1;
            if (j < x->n && isdigit((unsigned char)x->s[j])) {
                hi = strtol(x->s + j, &end, 10);
                j = (size_t)(end - x->s);
            }
        }
        if (j >= x->n || x->s[j] != '}')
            return DSQ_OK;
        x->i = j + 1;
        if (lo > DSQ_GRAMMAR_MAX_REPEAT || hi > DSQ_GRAMMAR_MAX_REPEAT)
            return rx_fail(x, DSQ_ERANGE, "a repetition above %d", DSQ_GRAMMAR_MAX_REPEAT);
        if (hi >= 0 && hi < lo)
            return rx_fail(x, DSQ_EINVAL, "a repetition {%ld,%ld} out of order", lo, hi);
        *m = lo;
        *n = hi;
    } else {
        return DSQ_OK;
    }
    if (x->i < x->n && x->s[x->i] == '?')
        x->i++;   /* lazy: the same language */
    else if (x->i < x->n && x->s[x->i] == '+')
        return rx_fail(x, DSQ_EUNSUPPORTED, "possessive quantifiers are not supported");
    if (x->i < x->n && ((strchr("*+?", x->s[x->i]) && x->s[x->i]) || rx_counted_at(x, x->i)))
        return rx_fail(x, DSQ_EINVAL, "a quantifier follows a quantifier");
    return DSQ_OK;
}

/* Whether a quantifier starts at s[j]. */
static bool rx_quant_at(const rx_t *x, size_t j)
{
    return j < x->n && (x->s[j] == '*' || x->s[j] == '+' || x->s[j] == '?' ||
                        rx_counted_at(x, j));
}

/* A part of the regex as GBNF: full is its language L; when L holds the
 * empty string (nullable), ne is L without it (only where x->want_ne
 * asked for it), and ne_void says that L is the empty string alone.
 * The grammar refuses a repetition of what can match empty (its
 * recursion would consume nothing), so X* of a nullable X is written
 * (X without the empty string)*: the same language. Each full and ne is
 * one item or a concatenation (safe to follow by more items), except a
 * sequence's or alternation's ne, which may be an alternation. */
struct rx_piece {
    sbuf_t full, ne;
    bool nullable, ne_void;
};

static void rx_piece_free(rx_piece_t *p)
{
    free(p->full.p);
    free(p->ne.p);
    *p = (rx_piece_t){0};
}

/* The GBNF suffix of a repetition {m,n} (n -1: unbounded). */
static void rx_suffix(sbuf_t *o, long m, long n)
{
    if (m == 0 && n < 0)
        sb_str(o, "* ");
    else if (m == 1 && n < 0)
        sb_str(o, "+ ");
    else if (m == 0 && n == 1)
        sb_str(o, "? ");
    else if (n < 0)
        sb_fmt(o, "{%ld,} ", m);
    else if (m != 1 || n != 1)
        sb_fmt(o, "{%ld,%ld} ", m, n);
}

/* a (one atom: a single item) repeated {m,n} into q; a is consumed. */
static void rx_repeat(rx_t *x, rx_piece_t *a, long m, long n, rx_piece_t *q)
{
    *q = (rx_piece_t){0};
    if (m == 1 && n == 1) {
        *q = *a;
        *a = (rx_piece_t){0};
        return;
    }
    if (n == 0 || (a->nullable && a->ne_void)) {   /* the empty string alone */
        sb_str(&q->full, "jempty ");
        q->nullable = q->ne_void = true;
        rx_piece_free(a);
        return;
    }
    /* (X | empty){m,n} is X{0,n} for X without the empty string */
    const sbuf_t *body = a->nullable ? &a->ne : &a->full;
    if (a->nullable)
        m = 0;
    sb_add(&q->full, body->p, body->n);
    rx_suffix(&q->full, m, n);
    if (m == 0) {
        q->nullable = true;
        if (x->want_ne) {
            sb_add(&q->ne, body->p, body->n);
            rx_suffix(&q->ne, 1, n);
        }
    }
    rx_piece_free(a);
}

/* A group name (?P<name>...) or (?<name>...) at s[i] up to its '>':
 * an identifier, not used before (Python's re: "redefinition of group
 * name"); *i ends past the '>'. */
static int rx_group_name(rx_t *x, size_t *i)
{
    const char *gt = memchr(x->s + *i, '>', x->n - *i);
    if (!gt)
        return rx_fail(x, DSQ_EINVAL, "an unterminated group name");
    size_t at = *i, len = (size_t)(gt - x->s) - at;
    bool ok = len > 0 && !isdigit((unsigned char)x->s[at]);
    for (size_t k = 0; ok && k < len; k++) {
        unsigned char ch = (unsigned char)x->s[at + k];
        ok = isalnum(ch) || ch == '_' || ch >= 0x80;
    }
    if (!ok)
        return rx_fail(x, DSQ_EINVAL, "a group name must be an identifier");
    /* a group parsed again (rx_seq) meets its own name at the same offset */
    for (int k = 0; k < x->n_names; k++) {
        if (x->names[k].at == at)
            goto known;
        if (x->names[k].len == len && !memcmp(x->s + x->names[k].at, x->s + at, len))
            return rx_fail(x, DSQ_EINVAL, "redefinition of group name '%.*s'",
                           (int)(len > 60 ? 60 : len), x->s + at);
    }
    if (x->n_names == x->cap_names) {
        int nc = x->cap_names ? x->cap_names * 2 : 8;
        void *q = realloc(x->names, (size_t)nc * sizeof(*x->names));
        if (!q)
            return DSQ_ENOMEM;
        x->names = q;
        x->cap_names = nc;
    }
    x->names[x->n_names].at = at;
    x->names[x->n_names++].len = len;
known:
    *i = (size_t)(gt - x->s) + 1;
    return DSQ_OK;
}

/* A group's alternation after its '(' (and ?: or name) into a; x->i ends
 * past the ')'. */
static int rx_group(rx_t *x, rx_piece_t *a)
{
    /* ~12 KiB of stack a level (the class sets): 16 levels fit an HTTP
     * worker thread's stack with room to spare */
    if (++x->depth > 16)
        return rx_fail(x, DSQ_ERANGE, "groups nested too deep");
    rx_piece_t in = {0};
    int rc = rx_alt(x, &in);
    x->depth--;
    if (!rc && (x->i >= x->n || x->s[x->i] != ')'))
        rc = rx_fail(x, DSQ_EINVAL, "an unterminated (");
    if (!rc) {
        x->i++;
        sb_str(&a->full, "( ");
        sb_add(&a->full, in.full.p, in.full.n);
        sb_str(&a->full, ") ");
        a->nullable = in.nullable;
        a->ne_void = in.ne_void;
        if (in.nullable && !in.ne_void && x->want_ne) {
            sb_str(&a->ne, "( ");
            sb_add(&a->ne, in.ne.p, in.ne.n);
            sb_str(&a->ne, ") ");
        }
    }
    rx_piece_free(&in);
    return rc;
}

/* One alternative: atoms with their quantifiers, up to | or ) or the end. */
static int rx_seq(rx_t *x, rx_piece_t *out)
{
    rx_piece_t *ps = NULL;
    int np = 0, cap = 0, rc = DSQ_OK;
    while (!rc && x->i < x->n && x->s[x->i] != '|' && x->s[x->i] != ')') {
        rx_piece_t a = {0};
        char ch = x->s[x->i];
        if (ch == '(') {
            x->i++;
            if (x->i < x->n && x->s[x->i] == '?') {
                if (x->i + 1 < x->n && x->s[x->i + 1] == ':') {
                    x->i += 2;
                } else if (x->i + 2 < x->n && (x->s[x->i + 1] == '<' || x->s[x->i + 1] == 'P') &&
                           x->s[x->i + 1 + (x->s[x->i + 1] == 'P')] == '<' &&
                           x->s[x->i + 2] != '=' && x->s[x->i + 2] != '!') {
                    size_t j = x->i + 2 + (x->s[x->i + 1] == 'P');
                    rc = rx_group_name(x, &j);
                    if (!rc)
                        x->i = j;
                } else {
                    rc = rx_fail(x, DSQ_EUNSUPPORTED,
                                 "lookaround and inline flags (?...) are not supported");
                }
            }
            size_t body = x->i;
            if (!rc)
                rc = rx_group(x, &a);
            /* repeated and able to match empty: the body again, now with
             * its language without the empty string (want_ne reaches
             * every group inside, so this happens once per outer group) */
            if (!rc && a.nullable && !a.ne_void && !x->want_ne && rx_quant_at(x, x->i)) {
                size_t after = x->i;
                rx_piece_free(&a);
                x->i = body;
                x->want_ne = true;
                rc = rx_group(x, &a);
                x->want_ne = false;
                if (!rc && x->i != after)
                    rc = rx_fail(x, DSQ_EINVAL, "an unterminated (");
            }
        } else if (ch == '[') {
            x->i++;
            cset_t set;
            rc = rx_class(x, &set);
            if (!rc)
                rc = rx_emit(x, &a.full, set);
        } else if (ch == '.') {
            x->i++;
            cset_t set = {.n = 0};
            cset_add(&set, '\n', '\n');
            cset_negate(&set);
            rc = rx_emit(x, &a.full, set);
        } else if (ch == '\\') {
            x->i++;
            cset_t set;
            rc = rx_escape(x, &set);
            if (!rc)
                rc = rx_emit(x, &a.full, set);
        } else if (ch == '*' || ch == '+' || ch == '?') {
            rc = rx_fail(x, DSQ_EINVAL, "'%c' has nothing to repeat", ch);
        } else if (ch == '^' || ch == '$') {
            rc = rx_fail(x, DSQ_EUNSUPPORTED,
                         "'%c' is supported only at the start (^) or end ($) of the pattern",
                         ch);
        } else {
            int32_t c = rx_cp(x);
            if (c < 0) {
                rc = rx_fail(x, DSQ_EINVAL, "invalid UTF-8");
            } else {
                cset_t set = {.n = 0};
                cset_add(&set, (uint32_t)c, (uint32_t)c);
                rc = rx_emit(x, &a.full, set);
            }
        }
        long m, n;
        if (!rc)
            rc = rx_quant(x, &m, &n);
        if (!rc && np == cap) {
            int nc = cap ? cap * 2 : 8;
            rx_piece_t *q = realloc(ps, (size_t)nc * sizeof(*q));
            if (q) {
                ps = q;
                cap = nc;
            } else {
                rc = DSQ_ENOMEM;
            }
        }
        if (!rc)
            rx_repeat(x, &a, m, n, &ps[np++]);
        rx_piece_free(&a);
    }
    /* the concatenation (pieces of the empty string alone left out); the
     * empty string is in it when it is in every piece, and then its
     * non-empty strings are those where some piece i is the first to be
     * non-empty: ne_i followed by the rest as they are */
    out->nullable = true;
    for (int i = 0; !rc && i < np; i++) {
        out->nullable &= ps[i].nullable;
        if (!ps[i].ne_void)
            sb_add(&out->full, ps[i].full.p, ps[i].full.n);
    }
    if (!out->full.p)
        sb_str(&out->full, "jempty ");
    out->ne_void = out->nullable;
    for (int i = 0; i < np; i++)
        out->ne_void &= ps[i].ne_void;
    bool first = true;
    for (int i = 0; !rc && out->nullable && x->want_ne && i < np; i++) {
        if (ps[i].ne_void)
            continue;
        sb_str(&out->ne, first ? "" : "| ");
        first = false;
        sb_add(&out->ne, ps[i].ne.p, ps[i].ne.n);
        for (int j = i + 1; j < np; j++)
            if (!ps[j].ne_void)
                sb_add(&out->ne, ps[j].full.p, ps[j].full.n);
        if (out->ne.n > DSQ_GRAMMAR_MAX_SOURCE)
            rc = rx_fail(x, DSQ_ERANGE, "a repetition of a group that can match the empty "
                         "string would make a grammar above %u bytes", DSQ_GRAMMAR_MAX_SOURCE);
    }
    for (int i = 0; i < np; i++)
        rx_piece_free(&ps[i]);
    free(ps);
    if (!rc && (out->full.oom || out->ne.oom))
        rc = DSQ_ENOMEM;
    return rc;
}

static int rx_alt(rx_t *x, rx_piece_t *out)
{
    rx_piece_t s = {0};
    int rc = rx_seq(x, &s);
    bool first = true;
    out->ne_void = true;
    for (;;) {
        if (rc)
            break;
        sb_str(&out->full, first ? "" : "| ");
        sb_add(&out->full, s.full.p, s.full.n);
        out->nullable |= s.nullable;
        /* the non-empty strings: each alternative's */
        const sbuf_t *ne = s.nullable ? (s.ne_void ? NULL : &s.ne) : &s.full;
        if (ne && x->want_ne) {
            sb_str(&out->ne, out->ne_void ? "" : "| ");
            sb_add(&out->ne, ne->p, ne->n);
        }
        if (ne)
            out->ne_void = false;
        first = false;
        rx_piece_free(&s);
        if (x->i >= x->n || x->s[x->i] != '|')
            break;
        x->i++;
        rc = rx_seq(x, &s);
    }
    rx_piece_free(&s);
    if (!out->nullable)   /* ne is full then, and never read */
        out->ne_void = false;
    if (!rc && (out->full.oom || out->ne.oom))
        rc = DSQ_ENOMEM;
    return rc;
}

/* The pattern as one GBNF expression into o. json: characters as they are
 * written inside a JSON string; *start / *end: whether ^ / $ anchored it. */
static int regex_expr(const char *re, size_t len, bool json, sbuf_t *o, bool *start, bool *end,
                      char *err, size_t err_len)
{
    rx_t x = {.s = re, .n = len, .json = json, .err = err, .err_len = err_len};
    *start = len > 0 && re[0] == '^';
    if (*start)
        x.i = 1;
    *end = false;
    if (len > x.i && re[len - 1] == '$') {
        size_t bs = 0;   /* an escaped \$ is a literal */
        for (size_t k = len - 1; k > x.i && re[k - 1] == '\\'; k--)
            bs++;
        if (bs % 2 == 0) {
            *end = true;
            x.n = len - 1;
        }
    }
    rx_piece_t top = {0};
    int rc = rx_alt(&x, &top);
    if (!rc && x.i < x.n)
        rc = rx_fail(&x, DSQ_EINVAL, "an unmatched )");
    sb_str(o, "( ");
    sb_add(o, top.full.p, top.full.n);
    sb_str(o, ") ");
    rx_piece_free(&top);
    free(x.names);
    if (!rc && o->oom)
        rc = DSQ_ENOMEM;
    return rc;
}

int dsq_grammar_gbnf_from_regex(const char *re, size_t len, char **gbnf, char *err,
                                size_t err_len)
{
    *gbnf = NULL;
    if (len > DSQ_GRAMMAR_MAX_SOURCE / 8) {
        snprintf(err, err_len, "the regex is longer than %u bytes", DSQ_GRAMMAR_MAX_SOURCE / 8);
        return DSQ_ERANGE;
    }
    sbuf_t o = {0};
    bool s, e;
    sb_str(&o, "root ::= ");
    int rc = regex_expr(re, len, false, &o, &s, &e, err, err_len);
    sb_str(&o, "\n");
    sb_str(&o, "jempty ::= \"\"\n");
    if (!rc && o.oom)
        rc = DSQ_ENOMEM;
    if (rc) {
        free(o.p);
        return rc;
    }
    *gbnf = o.p;
    return DSQ_OK;
}

/* ------------------------------------------------------------ schemas */

static const char *const annotations[] = {
    "$schema", "$id", "$comment", "$anchor", "title", "description", "default",
    "examples", "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
    "contentEncoding", "contentMediaType", NULL};

static const char *const keywords[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", NULL};

static bool in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k))
            return true;
    return false;
}

typedef enum jt {
    JT_NULL = 1, JT_BOOL = 2, JT_OBJECT = 4, JT_ARRAY = 8, JT_STRING = 16,
    JT_INTEGER = 32, JT_NUMBER = 64,
} jt_t;

static int type_bit(const char *name)
{
    static const char *const n[] = {"null", "boolean", "object", "array", "string",
                                    "integer", "number"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(name, n[i]))
            return 1 << i;
    return 0;
}

/* The JSON type bits an instance has (integer-valued numbers are both). */
static int value_types(const cJSON *v)
{
    if (cJSON_IsNull(v))
        return JT_NULL;
    if (cJSON_IsBool(v))
        return JT_BOOL;
    if (cJSON_IsObject(v))
        return JT_OBJECT;
    if (cJSON_IsArray(v))
        return JT_ARRAY;
    if (cJSON_IsString(v))
        return JT_STRING;
    double d = v->valuedouble;
    return JT_NUMBER | (d == floor(d) && fabs(d) < 9e15 ? JT_INTEGER : 0);
}

static int get_count(conv_t *c, const cJSON *s, const char *key, long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v)
        return DSQ_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return fail(c, DSQ_EINVAL, "'%s' must be a non-negative integer", key);
    if (v->valuedouble > DSQ_GRAMMAR_MAX_REPEAT)
        return fail(c, DSQ_EUNSUPPORTED, "'%s' above %d is not supported", key,
                    DSQ_GRAMMAR_MAX_REPEAT);
    *out = (long)v->valuedouble;
    return DSQ_OK;
}

/* A JSON value (enum/const) exactly, with the grammar's whitespace between
 * its tokens; object keys in the order given. */
static int value_literal(conv_t *c, const cJSON *v, sbuf_t *o)
{
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        bool obj = cJSON_IsObject(v);
        sb_str(o, obj ? "\"{\" ws " : "\"[\" ws ");
        const cJSON *e;
        int i = 0;
        cJSON_ArrayForEach(e, v) {
            if (i++)
                sb_str(o, "\",\" ws ");
            if (obj) {
                cJSON *k = cJSON_CreateString(e->string);
                char *kt = k ? cJSON_PrintUnformatted(k) : NULL;
                cJSON_Delete(k);
                if (!kt)
                    return fail(c, DSQ_ENOMEM, "out of memory");
                sb_lit(o, kt, strlen(kt));
                free(kt);
                sb_str(o, " ws \":\" ws ");
            }
            int rc = value_literal(c, e, o);
            if (rc)
                return rc;
            sb_str(o, "ws ");
        }
        sb_str(o, obj ? "\"}\" " : "\"]\" ");
        return DSQ_OK;
    }
    if (cJSON_IsNumber(v)) {
        /* the shortest text that reads back as the same double (cJSON's
         * printer treats doubles within an epsilon as equal, so
         * 9007199254740993 would come out as 9.00719925474099e+15) */
        char num[40];
        if (!isfinite(v->valuedouble))
            return fail(c, DSQ_EUNSUPPORTED, "a number beyond a double's range");
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(num, sizeof(num), "%.*g", prec, v->valuedouble);
            if (strtod(num, NULL) == v->valuedouble)
                break;
        }
        sb_lit(o, num, strlen(num));
        sb_str(o, " ");
        return DSQ_OK;
    }
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt)
        return fail(c, DSQ_ENOMEM, "out of memory");
    sb_lit(o, txt, strlen(txt));
    sb_str(o, " ");
    free(txt);
    return DSQ_OK;
}

/* RFC 3339 full-date with the days each month has; February 29 is left
 * out (a leap-year rule in a grammar is not worth it: a subset, sound). */
#define DATE                                                                        \
    "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | "   \
    "\"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | "   \
    "\"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )"

static int string_expr(conv_t *c, const cJSON *s, sbuf_t *o)
{
    long mn = -1, mx = -1;
    int rc;
    if ((rc = get_count(c, s, "minLength", &mn)) || (rc = get_count(c, s, "maxLength", &mx)))
        return rc;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if ((pat || fmt) && (mn >= 0 || mx >= 0))
        return fail(c, DSQ_EUNSUPPORTED, "'%s' together with minLength/maxLength is not "
                    "supported", pat ? "pattern" : "format");
    if (pat && fmt)
        return fail(c, DSQ_EUNSUPPORTED, "'pattern' together with 'format' is not supported");
    if (pat) {
        if (!cJSON_IsString(pat))
            return fail(c, DSQ_EINVAL, "'pattern' must be a string");
        bool st, en;
        char msg[200] = "";
        sb_str(o, "\"\\\"\" ");
        /* JSON Schema's pattern is a search: unanchored ends match anything */
        sbuf_t body = {0};
        rc = regex_expr(pat->valuestring, strlen(pat->valuestring), true, &body, &st, &en, msg,
                        sizeof(msg));
        if (rc) {
            free(body.p);
            return fail(c, rc, "'pattern': %s", msg);
        }
        if (!st)
            sb_str(o, "jchar* ");
        sb_add(o, body.p, body.n);
        free(body.p);
        if (!en)
            sb_str(o, "jchar* ");
        sb_str(o, "\"\\\"\" ");
        return DSQ_OK;
    }
    if (fmt) {
        static const struct {
            const char *name, *gbnf;
        } f[] = {
            {"date", DATE},
            {"time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                     "( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                     "[0-5] [0-9] )"},
            {"date-time", DATE " \"T\" ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                          "[0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] "
                          "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"},
            {"uuid", "jhex{8} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{4} \"-\" jhex{12}"},
            {"email", "[a-zA-Z0-9_+-]{1,32} ( \".\" [a-zA-Z0-9_+-]{1,32} ){0,3} \"@\" "
                      "( [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )? \".\" ){1,4} "
                      "[a-zA-Z]{2,8}"},
            {"ipv4", "( [0-9] | [1-9] [0-9] | \"1\" [0-9]{2} | \"2\" [0-4] [0-9] | \"25\" "
                     "[0-5] ) ( \".\" ( [0-9] | [1-9] [0-9] | \"1\" [0-9]{2} | \"2\" [0-4] "
                     "[0-9] | \"25\" [0-5] ) ){3}"},
        };
        if (!cJSON_IsString(fmt))
            return fail(c, DSQ_EINVAL, "'format' must be a string");
        for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
            if (!strcmp(fmt->valuestring, f[i].name)) {
                sb_fmt(o, "\"\\\"\" ( %s ) \"\\\"\" ", f[i].gbnf);
                return DSQ_OK;
            }
        }
        return fail(c, DSQ_EUNSUPPORTED, "'format' \"%.40s\" is not supported (supported: "
                    "date, time, date-time, uuid, email, ipv4)", fmt->valuestring);
    }
    if (mn < 0 && mx < 0) {
        sb_str(o, "jstring ");
        return DSQ_OK;
    }
    if (mn < 0)
        mn = 0;
    if (mx >= 0 && mx < mn)
        return fail(c, DSQ_EINVAL, "maxLength %ld is below minLength %ld", mx, mn);
    if (mx < 0)
        sb_fmt(o, "\"\\\"\" jchar1{%ld,} \"\\\"\" ", mn);
    else
        sb_fmt(o, "\"\\\"\" jchar1{%ld,%ld} \"\\\"\" ", mn, mx);
    return DSQ_OK;
}

static int array_expr(conv_t *c, const cJSON *s, sbuf_t *o)
{
    long mn = 0, mx = -1;
    int rc;
    if ((rc = get_count(c, s, "minItems", &mn)) || (rc = get_count(c, s, "maxItems", &mx)))
        return rc;
    if (mx >= 0 && mx < mn)
        return fail(c, DSQ_EINVAL, "maxItems %ld is below minItems %ld", mx, mn);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (u && !cJSON_IsFalse(u))
        return fail(c, DSQ_EUNSUPPORTED, "'uniqueItems' is not supported");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    if (cJSON_IsArray(items)) {   /* draft 4-7 tuple form */
        if (prefix)
            return fail(c, DSQ_EINVAL, "'items' as an array beside 'prefixItems'");
        prefix = items;
        items = NULL;
    }
    sb_str(o, "\"[\" ws ");
    if (prefix) {
        if (!cJSON_IsArray(prefix))
            return fail(c, DSQ_EINVAL, "'prefixItems' must be an array");
        /* exactly min(k, maxItems) items of the tuple, never extras */
        long k = cJSON_GetArraySize(prefix);
        long take = mx >= 0 && mx < k ? mx : k;
        if (mn > take)
            return fail(c, DSQ_EUNSUPPORTED, "'minItems' beyond the tuple of 'prefixItems' "
                        "is not supported");
        const char *pkey = cJSON_GetObjectItemCaseSensitive(s, "prefixItems") ? "prefixItems"
                                                                              : "items";
        for (long i = 0; i < take; i++) {
            size_t p0 = path_push(c, pkey);
            path_push_i(c, (int)i);
            if (i)
                sb_str(o, "\",\" ws ");
            rc = schema_expr(c, cJSON_GetArrayItem(prefix, (int)i), o);
            path_pop(c, p0);
            if (rc)
                return rc;
            sb_str(o, "ws ");
        }
        sb_str(o, "\"]\" ");
        return DSQ_OK;
    }
    sbuf_t it = {0};
    if (items && cJSON_IsFalse(items)) {
        if (mn > 0)
            return fail(c, DSQ_EINVAL, "'items' false with minItems %ld", mn);
        sb_str(o, "\"]\" ");
        return DSQ_OK;
    }
    if (items) {
        size_t p0 = path_push(c, "items");
        rc = schema_expr(c, items, &it);
        path_pop(c, p0);
        if (rc) {
            free(it.p);
            return rc;
        }
    } else {
        sb_str(&it, "jvalue ");
    }
    if (it.oom) {
        free(it.p);
        return fail(c, DSQ_ENOMEM, "out of memory");
    }
    int r = add_rule(c, &it);
    free(it.p);
    if (mx == 0) {
        sb_str(o, "\"]\" ");
        return DSQ_OK;
    }
    if (mn == 0)
        sb_str(o, "( ");
    sb_fmt(o, "s%d ws ( \",\" ws s%d ws )", r, r);
    long lo = mn > 0 ? mn - 1 : 0;
    if (mx < 0)
        sb_fmt(o, "{%ld,} ", lo);
    else
        sb_fmt(o, "{%ld,%ld} ", lo, mx - 1);
    if (mn == 0)
        sb_str(o, ")? ");
    sb_str(o, "\"]\" ");
    return DSQ_OK;
}

typedef struct prop {
    const char *name;
    const cJSON *schema;           /* NULL: any value */
    bool required;
    bool additional;               /* not in properties: the value is one of
                                      additionalProperties                 */
} prop_t;

static int object_expr(conv_t *c, const cJSON *s, sbuf_t *o)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return fail(c, DSQ_EINVAL, "'properties' must be an object");
    if (req && !cJSON_IsArray(req))
        return fail(c, DSQ_EINVAL, "'required' must be an array of strings");
    int np = props ? cJSON_GetArraySize(props) : 0, nr = req ? cJSON_GetArraySize(req) : 0;
    if (np == 0 && nr == 0) {
        /* a map: every value of the additionalProperties schema; none when
         * it is false; any JSON object when absent or true */
        if (!add || cJSON_IsTrue(add)) {
            sb_str(o, "jobject ");
            return DSQ_OK;
        }
        if (cJSON_IsFalse(add)) {
            sb_str(o, "\"{\" ws \"}\" ");
            return DSQ_OK;
        }
        sbuf_t v = {0};
        size_t p0 = path_push(c, "additionalProperties");
        int rc = schema_expr(c, add, &v);
        path_pop(c, p0);
        if (rc || v.oom) {
            free(v.p);
            return rc ? rc : fail(c, DSQ_ENOMEM, "out of memory");
        }
        int r = add_rule(c, &v);
        free(v.p);
        sb_fmt(o, "\"{\" ws ( jstring ws \":\" ws s%d ws ( \",\" ws jstring ws \":\" ws s%d ws )*"
                  " )? \"}\" ", r, r);
        return DSQ_OK;
    }
    /* declared properties in order, then required names not declared
     * (their values those of additionalProperties); no other additional
     * properties are ever written (valid whatever additionalProperties
     * says) */
    prop_t *p = calloc((size_t)(np + nr), sizeof(*p));
    if (!p)
        return fail(c, DSQ_ENOMEM, "out of memory");
    int n = 0, rc = DSQ_OK;
    const cJSON *it;
    cJSON_ArrayForEach(it, props) {
        p[n].name = it->string;
        p[n].schema = it;
        n++;
    }
    cJSON_ArrayForEach(it, req) {
        if (!cJSON_IsString(it)) {
            free(p);
            return fail(c, DSQ_EINVAL, "'required' must be an array of strings");
        }
        int k = 0;
        while (k < n && strcmp(p[k].name, it->valuestring))
            k++;
        if (k < n && p[k].required) {   /* JSON Schema: the items are unique */
            free(p);
            return fail(c, DSQ_EINVAL, "'required' lists '%.80s' twice", it->valuestring);
        }
        if (k == n) {
            /* a name not declared is an additional property: its value
             * is one of additionalProperties, and none when that is false
             * (no instance then has every required property) */
            if (cJSON_IsFalse(add)) {
                free(p);
                return fail(c, DSQ_EINVAL, "required property '%.80s' is forbidden by "
                            "additionalProperties: false", it->valuestring);
            }
            p[n].name = it->valuestring;
            p[n].schema = add && !cJSON_IsTrue(add) ? add : NULL;
            p[n].additional = true;
            n++;
        }
        p[k].required = true;
    }
    /* kv_i rules, then A_i ("," kv_i, optional or not, then A_{i+1}) and
     * F_i (the first property written is i or later) from the end */
    int *kv = calloc((size_t)n * 3, sizeof(int));
    if (!kv) {
        free(p);
        return fail(c, DSQ_ENOMEM, "out of memory");
    }
    int *ra = kv + n, *rf = kv + 2 * n;
    for (int i = 0; i < n && !rc; i++) {
        sbuf_t b = {0};
        char *key = NULL;
        cJSON *ks = cJSON_CreateString(p[i].name);
        if (ks)
            key = cJSON_PrintUnformatted(ks);
        cJSON_Delete(ks);
        if (!key) {
            rc = fail(c, DSQ_ENOMEM, "out of memory");
            break;
        }
        sb_lit(&b, key, strlen(key));
        free(key);
        sb_str(&b, " ws \":\" ws ");
        if (p[i].schema) {
            size_t p0 = path_push(c, p[i].additional ? "additionalProperties" : "properties");
            if (!p[i].additional)
                path_push(c, p[i].name);
            rc = schema_expr(c, p[i].schema, &b);
            path_pop(c, p0);
        } else {
            sb_str(&b, "jvalue ");
        }
        if (!rc && b.oom)
            rc = fail(c, DSQ_ENOMEM, "out of memory");
        if (!rc)
            kv[i] = add_rule(c, &b);
        free(b.p);
    }
    for (int i = n - 1; i >= 0 && !rc; i--) {
        sbuf_t a = {0}, f = {0};
        if (p[i].required)
            sb_fmt(&a, "\",\" ws s%d ws ", kv[i]);
        else
            sb_fmt(&a, "( \",\" ws s%d ws )? ", kv[i]);
        if (i + 1 < n)
            sb_fmt(&a, "s%d ", ra[i + 1]);
        ra[i] = add_rule(c, &a);
        sb_fmt(&f, "s%d ws ", kv[i]);
        if (i + 1 < n)
            sb_fmt(&f, "s%d ", ra[i + 1]);
        if (!p[i].required)
            sb_fmt(&f, "| %s ", i + 1 < n ? "" : "jempty");
        if (!p[i].required && i + 1 < n)
            sb_fmt(&f, "s%d ", rf[i + 1]);
        if (a.oom || f.oom)
            rc = fail(c, DSQ_ENOMEM, "out of memory");
        rf[i] = add_rule(c, &f);
        free(a.p);
        free(f.p);
    }
    if (!rc)
        sb_fmt(o, "\"{\" ws s%d \"}\" ", rf[0]);
    free(kv);
    free(p);
    return rc;
}

/* The schema at a local JSON pointer ("#", "#/$defs/x", with ~0 ~1 and
 * %-escapes left out: names with '/' or '~' are rare in generated
 * schemas). */
static const cJSON *resolve_ref(conv_t *c, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const cJSON *at = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char key[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof(key)) {
            if (p[0] == '~' && p[1] == '1') {
                key[k++] = '/';
                p += 2;
            } else if (p[0] == '~' && p[1] == '0') {
                key[k++] = '~';
                p += 2;
            } else {
                key[k++] = *p++;
            }
        }
        key[k] = 0;
        if (cJSON_IsArray(at)) {
            char *end;
            long i = strtol(key, &end, 10);
            at = *end ? NULL : cJSON_GetArrayItem(at, (int)i);
        } else {
            at = cJSON_GetObjectItemCaseSensitive(at, key);
        }
        if (!at)
            return NULL;
    }
    return *p ? NULL : at;
}

/* Branches of anyOf / oneOf as alternatives. oneOf needs exactly one
 * branch to match: allowed only when the branches' types cannot overlap. */
static int anyof_expr(conv_t *c, const cJSON *list, const char *key, sbuf_t *o)
{
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return fail(c, DSQ_EINVAL, "'%s' must be a non-empty array of schemas", key);
    if (!strcmp(key, "oneOf")) {
        int seen = 0;
        const cJSON *b;
        cJSON_ArrayForEach(b, list) {
            const cJSON *t = cJSON_IsObject(b) ? cJSON_GetObjectItemCaseSensitive(b, "type")
                                               : NULL;
            int bits = cJSON_IsString(t) ? type_bit(t->valuestring) : 0;
            if (bits & (JT_INTEGER | JT_NUMBER))
                bits |= JT_INTEGER | JT_NUMBER;
            if (!bits || (bits & seen))
                return fail(c, DSQ_EUNSUPPORTED, "'oneOf' whose branches may overlap is not "
                            "supported (each branch needs a different single 'type'; "
                            "anyOf has no such limit)");
            seen |= bits;
        }
    }
    sb_str(o, "( ");
    int i = 0, rc = DSQ_OK;
    const cJSON *b;
    cJSON_ArrayForEach(b, list) {
        size_t p0 = path_push(c, key);
        path_push_i(c, i);
        sb_str(o, i ? "| " : "");
        rc = schema_expr(c, b, o);
        path_pop(c, p0);
        if (rc)
            return rc;
        i++;
    }
    sb_str(o, ") ");
    return DSQ_OK;
}

/* Keywords that constrain beside a composition keyword (annotations do
 * not count). */
static const char *constraining_sibling(const cJSON *s, const char *self)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (strcmp(k->string, self) && !in_list(annotations, k->string))
            return k->string;
    }
    return NULL;
}

static int typed_expr(conv_t *c, const cJSON *s, int type, sbuf_t *o)
{
    switch (type) {
    case JT_NULL: sb_str(o, "\"null\" "); return DSQ_OK;
    case JT_BOOL: sb_str(o, "( \"true\" | \"false\" ) "); return DSQ_OK;
    case JT_OBJECT: return object_expr(c, s, o);
    case JT_ARRAY: return array_expr(c, s, o);
    case JT_STRING: return string_expr(c, s, o);
    case JT_INTEGER:
    case JT_NUMBER: {
        bounds_t bd;
        int rc = read_bounds(c, s, type == JT_INTEGER, &bd);
        if (rc)
            return rc;
        if (!bd.has_lo && !bd.has_hi)
            sb_str(o, type == JT_INTEGER ? "jint " : "jnumber ");
        else if (type == JT_INTEGER)
            int_expr(o, &bd);
        else
            num_expr(o, &bd);
        return DSQ_OK;
    }
    }
    return fail(c, DSQ_EINVAL, "unknown type");
}

static int schema_expr(conv_t *c, const cJSON *s, sbuf_t *o)
{
    if (cJSON_IsTrue(s)) {
        sb_str(o, "jvalue ");
        return DSQ_OK;
    }
    if (cJSON_IsFalse(s))
        return fail(c, DSQ_EUNSUPPORTED, "the schema false (no instance is valid)");
    if (!cJSON_IsObject(s))
        return fail(c, DSQ_EINVAL, "a schema must be an object or a boolean");
    if (++c->depth > MAX_SCHEMA_DEPTH) {
        c->depth--;
        return fail(c, DSQ_ERANGE, "schemas nested deeper than %d", MAX_SCHEMA_DEPTH);
    }
    int rc = DSQ_OK;
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (!in_list(keywords, k->string) && !in_list(annotations, k->string)) {
            c->depth--;
            return fail(c, DSQ_EUNSUPPORTED, "the keyword '%.60s' is not supported",
                        k->string);
        }
    }
    if (c->depth > 1 && cJSON_HasObjectItem(s, "$id")) {
        c->depth--;   /* a new base URI for the $refs below it */
        return fail(c, DSQ_EUNSUPPORTED, "'$id' inside the schema is not supported");
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const char *comp = ref ? "$ref"
                     : cJSON_HasObjectItem(s, "anyOf") ? "anyOf"
                     : cJSON_HasObjectItem(s, "oneOf") ? "oneOf"
                     : cJSON_HasObjectItem(s, "allOf") ? "allOf" : NULL;
    if (comp) {
        const char *sib = constraining_sibling(s, comp);
        if (sib) {
            c->depth--;
            return fail(c, DSQ_EUNSUPPORTED, "'%s' beside '%s' is not supported", sib, comp);
        }
    }
    if (ref) {
        if (!cJSON_IsString(ref)) {
            rc = fail(c, DSQ_EINVAL, "'$ref' must be a string");
        } else {
            const cJSON *t = resolve_ref(c, ref->valuestring);
            if (!t) {
                rc = fail(c, DSQ_EUNSUPPORTED, "'$ref' \"%.80s\": only references inside the "
                          "schema (#/...) that exist are supported", ref->valuestring);
            } else {
                int i = 0;
                while (i < c->n_refs && c->refs[i].target != t)
                    i++;
                if (i == c->n_refs) {
                    if (c->n_refs == MAX_REFS) {
                        rc = fail(c, DSQ_ERANGE, "more than %d '$ref' targets", MAX_REFS);
                        goto out;
                    }
                    /* the rule's number first, so a recursive reference
                     * finds it; its body next */
                    c->refs[i].target = t;
                    c->refs[i].rule = c->n_rules++;
                    c->n_refs++;
                    sbuf_t b = {0};
                    char saved[sizeof(c->path)];
                    memcpy(saved, c->path, sizeof(saved));
                    snprintf(c->path, sizeof(c->path), "%s", ref->valuestring + 1);
                    rc = schema_expr(c, t, &b);
                    memcpy(c->path, saved, sizeof(saved));
                    if (!rc && b.oom)
                        rc = fail(c, DSQ_ENOMEM, "out of memory");
                    if (!rc) {
                        sb_fmt(&c->rules, "s%d ::= ", c->refs[i].rule);
                        sb_add(&c->rules, b.p, b.n);
                        sb_str(&c->rules, "\n");
                    }
                    free(b.p);
                }
                if (!rc)
                    sb_fmt(o, "s%d ", c->refs[i].rule);
            }
        }
        goto out;
    }
    if (comp && strcmp(comp, "allOf")) {
        rc = anyof_expr(c, cJSON_GetObjectItemCaseSensitive(s, comp), comp, o);
        goto out;
    }
    if (comp) {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(s, "allOf");
        if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != 1) {
            rc = fail(c, DSQ_EUNSUPPORTED, "'allOf' of more than one schema is not supported");
        } else {
            size_t p0 = path_push(c, "allOf");
            path_push(c, "0");
            rc = schema_expr(c, cJSON_GetArrayItem(l, 0), o);
            path_pop(c, p0);
        }
        goto out;
    }
    /* the types allowed: "type" (a name or a list), else what the
     * keywords imply, else any value */
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    int types = 0;
    if (cJSON_IsString(ty)) {
        types = type_bit(ty->valuestring);
    } else if (cJSON_IsArray(ty)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, ty) {
            int b = cJSON_IsString(t) ? type_bit(t->valuestring) : 0;
            if (b & types) {   /* JSON Schema: the items are unique */
                rc = fail(c, DSQ_EINVAL, "'type' lists '%s' twice", t->valuestring);
                goto out;
            }
            if (!b) {
                types = 0;
                break;
            }
            types |= b;
        }
    } else if (!ty) {
        types = -1;
    }
    if (!types) {
        rc = fail(c, DSQ_EINVAL, "'type' must be one of null, boolean, object, array, "
                  "string, integer, number, or a list of them");
        goto out;
    }
    if (types & JT_NUMBER)
        types &= ~JT_INTEGER;   /* number covers integer */
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        /* literals of the right type; other keywords beside them are not
         * checked against the values, so they must be absent */
        const cJSON *kk;
        cJSON_ArrayForEach(kk, s) {
            if (strcmp(kk->string, "enum") && strcmp(kk->string, "const") &&
                strcmp(kk->string, "type") && !in_list(annotations, kk->string)) {
                rc = fail(c, DSQ_EUNSUPPORTED, "'%s' beside '%s' is not supported",
                          kk->string, en ? "enum" : "const");
                goto out;
            }
        }
        if (en && cn) {
            rc = fail(c, DSQ_EUNSUPPORTED, "'enum' beside 'const' is not supported");
            goto out;
        }
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0)) {
            rc = fail(c, DSQ_EINVAL, "'enum' must be a non-empty array");
            goto out;
        }
        sb_str(o, "( ");
        int n = 0;
        const cJSON *v = en ? en->child : cn;
        for (; v; v = en ? v->next : NULL) {
            int vt = value_types(v);
            if (types != -1 && !(vt & types) && !((vt & JT_INTEGER) && (types & JT_NUMBER)))
                continue;
            sb_str(o, n ? "| " : "");
            if ((rc = value_literal(c, v, o)))
                goto out;
            n++;
        }
        sb_str(o, ") ");
        if (n == 0)
            rc = fail(c, DSQ_EINVAL, "no '%s' value has the schema's type",
                      en ? "enum" : "const");
        goto out;
    }
    if (types == -1) {
        static const struct {
            const char *key;
            int type;
        } implied[] = {{"properties", JT_OBJECT}, {"required", JT_OBJECT},
                       {"additionalProperties", JT_OBJECT}, {"items", JT_ARRAY},
                       {"prefixItems", JT_ARRAY}, {"minItems", JT_ARRAY},
                       {"maxItems", JT_ARRAY}, {"minLength", JT_STRING},
                       {"maxLength", JT_STRING}, {"pattern", JT_STRING},
                       {"format", JT_STRING}, {"minimum", JT_NUMBER},
                       {"maximum", JT_NUMBER}, {"exclusiveMinimum", JT_NUMBER},
                       {"exclusiveMaximum", JT_NUMBER}};
        types = 0;
        for (size_t i = 0; i < sizeof(implied) / sizeof(implied[0]); i++)
            if (cJSON_HasObjectItem(s, implied[i].key))
                types |= implied[i].type;
        if (!types) {
            sb_str(o, "jvalue ");
            goto out;
        }
    }
    int n = 0;
    sb_str(o, "( ");
    for (int b = JT_NULL; b <= JT_NUMBER && !rc; b <<= 1) {
        if (!(types & b))
            continue;
        sb_str(o, n ? "| " : "");
        rc = typed_expr(c, s, b, o);
        n++;
    }
    sb_str(o, ") ");
out:
    c->depth--;
    return rc;
}

int dsq_grammar_gbnf_from_json_schema(const cJSON *schema, char **gbnf, char *err,
                                      size_t err_len)
{
    *gbnf = NULL;
    conv_t c = {.root = schema, .err = err, .err_len = err_len};
    sbuf_t root = {0};
    sb_str(&root, "root ::= ");
    int rc = schema_expr(&c, schema, &root);
    sb_str(&root, "\n");
    if (!rc)
        sb_add(&root, c.rules.p ? c.rules.p : "", c.rules.n);
    sb_str(&root, base_rules);
    if (!rc && (root.oom || c.rules.oom))
        rc = DSQ_ENOMEM;
    if (!rc && root.n > DSQ_GRAMMAR_MAX_SOURCE) {
        snprintf(err, err_len, "the schema's grammar would be larger than %u bytes",
                 DSQ_GRAMMAR_MAX_SOURCE);
        rc = DSQ_ERANGE;
    }
    free(c.rules.p);
    if (rc) {
        if (rc == DSQ_ENOMEM)
            snprintf(err, err_len, "out of memory");
        free(root.p);
        return rc;
    }
    *gbnf = root.p;
    return DSQ_OK;
}

/* ------------------------------------------------------------ tool calls */

int dsq_grammar_gbnf_for_tool_calls(const cJSON *tools, const char *name,
                                    dsq_tool_parser_t format, bool parallel, char **gbnf,
                                    char *err, size_t err_len)
{
    *gbnf = NULL;
    if (format != DSQ_TOOL_PARSER_DEEPSEEK && format != DSQ_TOOL_PARSER_HERMES) {
        snprintf(err, err_len, "no tool-call format to constrain to");
        return DSQ_EINVAL;
    }
    conv_t c = {.err = err, .err_len = err_len};
    sbuf_t calls = {0};
    int rc = DSQ_OK, n = 0, i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        i++;
        if (!cJSON_IsString(nm) || (name && strcmp(name, nm->valuestring)))
            continue;
        /* each tool's parameters on their own: refs resolve inside them.
         * The arguments are an object whatever the schema says of the
         * type (none, or absent parameters: any object) */
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(params, "type");
        if (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "object"))) {
            snprintf(err, err_len, "/tools/%d/function/parameters: the arguments are an "
                     "object, so its \"type\" must be \"object\"", i - 1);
            rc = DSQ_EINVAL;
            break;
        }
        /* without "type", a composition, $ref, enum or const could admit
         * values other than an object, which the grammar would then force
         * and the parser refuse: refused here, as OpenAI does */
        static const char *const decides[] = {"anyOf", "oneOf", "allOf", "$ref", "enum",
                                              "const"};
        for (size_t k = 0; !ty && k < sizeof(decides) / sizeof(decides[0]); k++) {
            if (cJSON_GetObjectItemCaseSensitive(params, decides[k])) {
                snprintf(err, err_len, "/tools/%d/function/parameters: the arguments are an "
                         "object, so it needs \"type\": \"object\" (it has '%s' and no "
                         "\"type\")", i - 1, decides[k]);
                rc = DSQ_EINVAL;
                break;
            }
        }
        if (rc)
            break;
        cJSON *any = cJSON_IsObject(params) ? cJSON_Duplicate(params, 1) : cJSON_CreateObject();
        if (!any || (!ty && !cJSON_AddStringToObject(any, "type", "object"))) {
            cJSON_Delete(any);
            rc = DSQ_ENOMEM;
            break;
        }
        params = any;
        c.root = params;
        c.n_refs = 0;
        snprintf(c.path, sizeof(c.path), "/tools/%d/function/parameters", i - 1);
        sbuf_t args = {0};
        rc = schema_expr(&c, params, &args);
        cJSON_Delete(any);
        if (rc) {
            free(args.p);
            break;
        }
        /* the name as the template writes it: a JSON string (Hermes) or
         * bare (DeepSeek) */
        sb_str(&calls, n ? "| " : "");
        if (format == DSQ_TOOL_PARSER_HERMES) {
            cJSON *ks = cJSON_CreateString(nm->valuestring);
            char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
            cJSON_Delete(ks);
            if (!kt) {
                free(args.p);
                rc = DSQ_ENOMEM;
                break;
            }
            sbuf_t head = {0};
            sb_str(&head, "<tool_call>\n{\"name\": ");
            sb_str(&head, kt);
            sb_str(&head, ", \"arguments\": ");
            free(kt);
            sb_lit(&calls, head.p ? head.p : "", head.n);
            free(head.p);
            sb_str(&calls, " ");
            sb_add(&calls, args.p ? args.p : "", args.n);
            sb_lit(&calls, "}\n</tool_call>", 14);
        } else {
            sbuf_t head = {0};
            sb_str(&head, "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
                          "function<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>");
            sb_str(&head, nm->valuestring);
            sb_str(&head, "\n```json\n");
            sb_lit(&calls, head.p ? head.p : "", head.n);
            free(head.p);
            sb_str(&calls, " ");
            sb_add(&calls, args.p ? args.p : "", args.n);
            static const char tail[] = "\n```<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81"
                                       "end\xef\xbd\x9c>";
            sb_lit(&calls, tail, sizeof(tail) - 1);
        }
        sb_str(&calls, " ");
        free(args.p);
        n++;
    }
    if (!rc && n == 0) {
        snprintf(err, err_len, name ? "no tool named '%.80s' in 'tools'" : "'tools' is empty",
                 name ? name : "");
        rc = DSQ_EINVAL;
    }
    sbuf_t out = {0};
    if (!rc) {
        /* parallel: at most DSQ_GRAMMAR_MAX_TOOL_CALLS calls, so a model
         * that repeats itself still ends */
        char sep[48] = "";
        if (parallel)
            snprintf(sep, sizeof(sep), "( \"\\n\" call ){0,%d}", DSQ_GRAMMAR_MAX_TOOL_CALLS - 1);
        if (format == DSQ_TOOL_PARSER_HERMES)
            sb_fmt(&out, "root ::= call %s\n", sep);
        else
            sb_fmt(&out, "root ::= \"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81"
                         "begin\xef\xbd\x9c>\" call %s \"<\xef\xbd\x9ctool\xe2\x96\x81"
                         "calls\xe2\x96\x81" "end\xef\xbd\x9c>\"\n", sep);
        sb_str(&out, "call ::= ");
        sb_add(&out, calls.p, calls.n);
        sb_str(&out, "\n");
        sb_add(&out, c.rules.p ? c.rules.p : "", c.rules.n);
        sb_str(&out, base_rules);
        if (out.oom || calls.oom || c.rules.oom)
            rc = DSQ_ENOMEM;
        else if (out.n > DSQ_GRAMMAR_MAX_SOURCE) {
            snprintf(err, err_len, "the tools' grammar would be larger than %u bytes",
                     DSQ_GRAMMAR_MAX_SOURCE);
            rc = DSQ_ERANGE;
        }
    }
    free(calls.p);
    free(c.rules.p);
    if (rc) {
        if (rc == DSQ_ENOMEM)
            snprintf(err, err_len, "out of memory");
        free(out.p);
        return rc;
    }
    *gbnf = out.p;
    return DSQ_OK;
}

/* Regular expressions -> GBNF (grammar.h): dsq_grammar_gbnf_from_regex
 * (vLLM's guided_regex) and the "pattern" of a JSON Schema string
 * (dsq__regex_expr, called by grammar_schema.c).
 *
 * The dialect is the common subset of ECMA-262 (what JSON Schema's
 * "pattern" means) and Python's re: literals, ., classes with ranges and
 * negation, \d \w \s \D \W \S, escapes, groups (capturing, (?:...),
 * named), |, the quantifiers * + ? {m} {m,} {m,n} (lazy forms are the
 * same language), ^ at the start and $ at the end. Backreferences,
 * lookaround, word boundaries and inline flags are DSQ_EUNSUPPORTED.
 *
 * The regex is translated, not run: each atom becomes a GBNF character
 * class and each quantifier a GBNF repetition, so the grammar's sentences
 * are exactly the strings the regex matches in full. */
#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/hex.h"
#include "grammar_gbnf_internal.h"

#define MAX_RANGES 512

typedef dsq__sbuf_t sbuf_t;

/* ------------------------------------------------------------- regex */

/* One code point inside a GBNF class. */
static void sb_class_cp(sbuf_t *b, uint32_t c)
{
    if (c == ']' || c == '[' || c == '\\' || c == '^' || c == '-' || c == '"')
        dsq__sb_fmt(b, "\\%c", (char)c);
    else if (c < 0x20 || c == 0x7f)
        dsq__sb_fmt(b, "\\x%02X", (unsigned)c);
    else if (c < 0x80)
        dsq__sb_fmt(b, "%c", (char)c);
    else if (c <= 0xffff)
        dsq__sb_fmt(b, "\\u%04X", (unsigned)c);
    else
        dsq__sb_fmt(b, "\\U%08X", (unsigned)c);
}

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
    dsq__sb_str(o, "( ");
    if (json) {
        static const struct {
            uint32_t c;
            const char *esc;
        } e[] = {{'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'\n', "\"\\\\n\""},
                 {'\r', "\"\\\\r\""}, {'\t', "\"\\\\t\""}};
        for (size_t i = 0; i < sizeof(e) / sizeof(e[0]); i++) {
            if (cset_has(&s, e[i].c)) {
                dsq__sb_str(o, alt ? "| " : "");
                dsq__sb_str(o, e[i].esc);
                dsq__sb_str(o, " ");
                alt = true;
            }
        }
        /* the other control characters as JSON writes them (RFC 8259
         * section 7: \u00XX), so a pattern that needs one still matches */
        for (uint32_t c = 0; c < 0x20; c++) {
            if (c != '\n' && c != '\r' && c != '\t' && cset_has(&s, c)) {
                dsq__sb_fmt(o, "%s\"\\\\u%04x\" ", alt ? "| " : "", (unsigned)c);
                alt = true;
            }
        }
        cset_remove(&s, 0, 0x1f);
        cset_remove(&s, '"', '"');
        cset_remove(&s, '\\', '\\');
    }
    if (s.n > 0) {
        dsq__sb_str(o, alt ? "| [" : "[");
        for (int i = 0; i < s.n; i++) {
            sb_class_cp(o, s.r[i].lo);
            if (s.r[i].hi > s.r[i].lo) {
                dsq__sb_str(o, "-");
                sb_class_cp(o, s.r[i].hi);
            }
        }
        dsq__sb_str(o, "] ");
        alt = true;
    }
    if (!alt)
        dsq__sb_str(o, "[] ");   /* nothing: a class no character matches */
    dsq__sb_str(o, ") ");
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
        dsq__sb_str(o, "* ");
    else if (m == 1 && n < 0)
        dsq__sb_str(o, "+ ");
    else if (m == 0 && n == 1)
        dsq__sb_str(o, "? ");
    else if (n < 0)
        dsq__sb_fmt(o, "{%ld,} ", m);
    else if (m != 1 || n != 1)
        dsq__sb_fmt(o, "{%ld,%ld} ", m, n);
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
        dsq__sb_str(&q->full, "jempty ");
        q->nullable = q->ne_void = true;
        rx_piece_free(a);
        return;
    }
    /* (X | empty){m,n} is X{0,n} for X without the empty string */
    const sbuf_t *body = a->nullable ? &a->ne : &a->full;
    if (a->nullable)
        m = 0;
    dsq__sb_add(&q->full, body->p, body->n);
    rx_suffix(&q->full, m, n);
    if (m == 0) {
        q->nullable = true;
        if (x->want_ne) {
            dsq__sb_add(&q->ne, body->p, body->n);
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
        dsq__sb_str(&a->full, "( ");
        dsq__sb_add(&a->full, in.full.p, in.full.n);
        dsq__sb_str(&a->full, ") ");
        a->nullable = in.nullable;
        a->ne_void = in.ne_void;
        if (in.nullable && !in.ne_void && x->want_ne) {
            dsq__sb_str(&a->ne, "( ");
            dsq__sb_add(&a->ne, in.ne.p, in.ne.n);
            dsq__sb_str(&a->ne, ") ");
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
            dsq__sb_add(&out->full, ps[i].full.p, ps[i].full.n);
    }
    if (!out->full.p)
        dsq__sb_str(&out->full, "jempty ");
    out->ne_void = out->nullable;
    for (int i = 0; i < np; i++)
        out->ne_void &= ps[i].ne_void;
    bool first = true;
    for (int i = 0; !rc && out->nullable && x->want_ne && i < np; i++) {
        if (ps[i].ne_void)
            continue;
        dsq__sb_str(&out->ne, first ? "" : "| ");
        first = false;
        dsq__sb_add(&out->ne, ps[i].ne.p, ps[i].ne.n);
        for (int j = i + 1; j < np; j++)
            if (!ps[j].ne_void)
                dsq__sb_add(&out->ne, ps[j].full.p, ps[j].full.n);
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
        dsq__sb_str(&out->full, first ? "" : "| ");
        dsq__sb_add(&out->full, s.full.p, s.full.n);
        out->nullable |= s.nullable;
        /* the non-empty strings: each alternative's */
        const sbuf_t *ne = s.nullable ? (s.ne_void ? NULL : &s.ne) : &s.full;
        if (ne && x->want_ne) {
            dsq__sb_str(&out->ne, out->ne_void ? "" : "| ");
            dsq__sb_add(&out->ne, ne->p, ne->n);
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
int dsq__regex_expr(const char *re, size_t len, bool json, sbuf_t *o, bool *start, bool *end,
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
    dsq__sb_str(o, "( ");
    dsq__sb_add(o, top.full.p, top.full.n);
    dsq__sb_str(o, ") ");
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
    dsq__sb_str(&o, "root ::= ");
    int rc = dsq__regex_expr(re, len, false, &o, &s, &e, err, err_len);
    dsq__sb_str(&o, "\n");
    dsq__sb_str(&o, "jempty ::= \"\"\n");
    if (!rc && o.oom)
        rc = DSQ_ENOMEM;
    if (rc) {
        free(o.p);
        return rc;
    }
    *gbnf = o.p;
    return DSQ_OK;
}

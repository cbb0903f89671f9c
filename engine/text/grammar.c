/* GBNF text -> compiled grammar (grammar.h for the notation, grammar_internal.h
 * for the compiled form).
 *
 * Groups and repetitions become synthesised rules, as in llama.cpp's
 * grammar-parser: for an item x
 *     x*      R ::= x R |            (right recursion: the matcher's stack
 *                                      does not grow, see grammar_match.c)
 *     x+      x R, R as for x*
 *     x?      R ::= x |
 *     x{m,n}  m copies of x, then R(n-m) with R(k) ::= x R(k-1) |, R(1) ::= x |
 *     x{m,}   m copies of x, then R as for x*
 * Then every rule must be defined, and no rule may reach itself without
 * consuming a character (left recursion would make the pushdown matcher
 * loop): checked with the nullable-rule fixpoint and a cycle search over
 * the "can start with" edges (Aho, Lam, Sethi, Ullman, Compilers, 4.3.3).
 */
#include "grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/hex.h"

typedef struct u32vec {
    uint32_t *v;
    size_t n, cap;
} u32vec_t;

typedef struct prule {
    char *name;
    u32vec_t body;
    int defined;      /* 1 once `name ::=` was read (synthesised: always) */
    int synth;        /* made for a group or repetition: not found by name */
    int line, col;    /* where it was first named */
} prule_t;

typedef struct parser {
    const char *s;
    size_t n, i;
    int line;
    size_t line_start;
    prule_t *rules;
    uint32_t n_rules, cap_rules;
    u32vec_t ranges;          /* all sets' ranges, pairs */
    u32vec_t cs_off, cs_n;
    uint32_t *cs_hash;        /* open addressing: set id + 1, 0 empty */
    uint32_t cs_hash_cap;
    size_t n_elements;        /* across every body, for the limit */
    int depth;
    int rc;
    char *err;
    size_t err_len;
} parser_t;

static void perr(parser_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void perr(parser_t *p, const char *fmt, ...)
{
    if (p->rc)
        return;
    p->rc = DSQ_EINVAL;
    if (!p->err || p->err_len == 0)
        return;
    int k = snprintf(p->err, p->err_len, "grammar line %d column %zu: ", p->line,
                     p->i - p->line_start + 1);
    if (k < 0 || (size_t)k >= p->err_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, p->err_len - (size_t)k, fmt, ap);
    va_end(ap);
}

/* A character U+0000 in a literal, or a class of no other character:
 * outputs are C strings, so a NUL could never reach the client and the
 * text would no longer be a sentence. Refused rather than dropped. */
static void perr_nul(parser_t *p)
{
    if (p->rc)
        return;
    perr(p, "U+0000 (NUL) cannot be generated (outputs are C strings)");
    p->rc = DSQ_EUNSUPPORTED;
}

static void oom(parser_t *p)
{
    if (!p->rc) {
        p->rc = DSQ_ENOMEM;
        if (p->err && p->err_len)
            snprintf(p->err, p->err_len, "grammar: out of memory");
    }
}

static int vec_push(parser_t *p, u32vec_t *v, uint32_t x)
{
    if (p->rc)
        return -1;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        uint32_t *nv = realloc(v->v, cap * sizeof(*nv));
        if (!nv) {
            oom(p);
            return -1;
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

/* Append to rule r's body (counted against the element limit). */
static int emit(parser_t *p, uint32_t r, uint32_t e)
{
    if (++p->n_elements > DSQ_GRAMMAR_MAX_ELEMENTS) {
        perr(p, "the grammar expands to more than %u elements", DSQ_GRAMMAR_MAX_ELEMENTS);
        return -1;
    }
    return vec_push(p, &p->rules[r].body, e);
}

static uint32_t new_rule(parser_t *p, const char *name, size_t len)
{
    if (p->rc)
        return 0;
    if (p->n_rules >= (1u << 29)) {
        perr(p, "too many rules");
        return 0;
    }
    if (p->n_rules == p->cap_rules) {
        uint32_t cap = p->cap_rules ? p->cap_rules * 2 : 32;
        prule_t *nr = realloc(p->rules, cap * sizeof(*nr));
        if (!nr) {
            oom(p);
            return 0;
        }
        p->rules = nr;
        p->cap_rules = cap;
    }
    prule_t *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof(*r));
    r->name = malloc(len + 1);
    if (!r->name) {
        oom(p);
        return 0;
    }
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->line = p->line;
    r->col = (int)(p->i - p->line_start + 1);
    return p->n_rules++;
}

/* A synthesised rule for a group or repetition inside rule `parent`. */
static uint32_t synth_rule(parser_t *p, uint32_t parent)
{
    char name[160];
    int k = snprintf(name, sizeof(name), "%.120s_%u", p->rules[parent].name, p->n_rules);
    uint32_t r = new_rule(p, name, (size_t)(k < 0 ? 0 : k));
    if (!p->rc)
        p->rules[r].defined = p->rules[r].synth = 1;
    return r;
}

static uint32_t named_rule(parser_t *p, const char *name, size_t len)
{
    for (uint32_t r = 0; r < p->n_rules; r++)
        if (!p->rules[r].synth && strlen(p->rules[r].name) == len && memcmp(p->rules[r].name, name, len) == 0)
            return r;
    return new_rule(p, name, len);
}

/* ------------------------------------------------------------ characters */

static int is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

static int peek(const parser_t *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

/* Whitespace (newlines included) and # comments. */
static void skip_ws(parser_t *p)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n')
                p->i++;
        } else if (c == '\n') {
            p->i++;
            p->line++;
            p->line_start = p->i;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            p->i++;
        } else {
            break;
        }
    }
}

/* One UTF-8 code point of the source. */
static uint32_t src_utf8(parser_t *p)
{
    const unsigned char *s = (const unsigned char *)p->s;
    unsigned char c = s[p->i];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
            : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || p->i + (size_t)len > p->n) {
        perr(p, "invalid UTF-8");
        return 0;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1Fu : len == 3 ? c & 0x0Fu : c & 0x07u;
    for (int k = 1; k < len; k++) {
        if ((s[p->i + (size_t)k] & 0xC0) != 0x80) {
            perr(p, "invalid UTF-8");
            return 0;
        }
        cp = (cp << 6) | (s[p->i + (size_t)k] & 0x3Fu);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > G_MAX_CP || (cp >= 0xD800 && cp <= 0xDFFF)) {
        perr(p, "invalid UTF-8");
        return 0;
    }
    p->i += (size_t)len;
    return cp;
}

/* One character of a literal or class: an escape or a UTF-8 code point. */
static uint32_t parse_char(parser_t *p)
{
    if (p->i >= p->n) {
        perr(p, "unexpected end of the grammar");
        return 0;
    }
    if (p->s[p->i] != '\\')
        return src_utf8(p);
    p->i++;
    int c = peek(p);
    p->i++;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '.':
    case '/': case '*': case '+': case '?': case '(': case ')': case '{': case '}':
    case '|': case ' ':
        return (uint32_t)c;
    case 'x': case 'u': case 'U': {
        int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = dsq_hex_value(peek(p));
            if (h < 0) {
                perr(p, "\\%c needs %d hex digits", c, nd);
                return 0;
            }
            v = v * 16 + (uint32_t)h;
            p->i++;
        }
        if (v > G_MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) {
            perr(p, "\\%c%0*X is not a Unicode scalar value", c, nd, v);
            return 0;
        }
        return v;
    }
    default:
        p->i--;
        if (c < 0)
            perr(p, "unexpected end of the grammar after '\\'");
        else
            perr(p, "unknown escape '\\%c'", c);
        return 0;
    }
}

/* ---------------------------------------------------------- character sets */

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

static uint64_t hash_words(const uint32_t *w, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

/* Intern the set given by n pairs in tmp (unsorted, may overlap; negated:
 * the complement over [0, U+10FFFF]). Returns its id. */
static uint32_t intern_set(parser_t *p, uint32_t *tmp, size_t n, int negated)
{
    if (p->rc)
        return 0;
    if (n)   /* an empty class ([]) may come with no array at all */
        qsort(tmp, n, 2 * sizeof(uint32_t), cmp_range);
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        if (m > 0 && tmp[2 * k] <= tmp[2 * (m - 1) + 1] + 1) {
            if (tmp[2 * k + 1] > tmp[2 * (m - 1) + 1])
                tmp[2 * (m - 1) + 1] = tmp[2 * k + 1];
        } else {
            tmp[2 * m] = tmp[2 * k];
            tmp[2 * m + 1] = tmp[2 * k + 1];
            m++;
        }
    }
    uint32_t *set = tmp, neg[2 * 1025];
    uint32_t *negbuf = NULL;
    if (negated) {
        uint32_t *o = m + 1 <= 1025 ? neg : (negbuf = malloc((2 * m + 2) * sizeof(uint32_t)));
        if (!o) {
            oom(p);
            return 0;
        }
        size_t q = 0;
        uint32_t lo = 0;
        for (size_t k = 0; k < m; k++) {
            if (tmp[2 * k] > lo) {
                o[2 * q] = lo;
                o[2 * q + 1] = tmp[2 * k] - 1;
                q++;
            }
            lo = tmp[2 * k + 1] + 1;
        }
        if (lo <= G_MAX_CP) {
            o[2 * q] = lo;
            o[2 * q + 1] = G_MAX_CP;
            q++;
        }
        set = o;
        m = q;
    }
    /* dedup: same ranges -> same id */
    uint64_t h = hash_words(set, 2 * m);
    if (p->cs_hash_cap < 2 * (p->cs_off.n + 1)) {
        uint32_t cap = p->cs_hash_cap ? p->cs_hash_cap * 2 : 256;
        uint32_t *nh = calloc(cap, sizeof(*nh));
        if (!nh) {
            free(negbuf);
            oom(p);
            return 0;
        }
        for (uint32_t id = 0; id < p->cs_off.n; id++) {
            /* ranges.v is NULL while every set so far is empty ([]) */
            uint64_t hh = p->cs_n.v[id] ? hash_words(p->ranges.v + 2 * (size_t)p->cs_off.v[id],
                                                     2 * p->cs_n.v[id])
                                        : hash_words(NULL, 0);
            uint32_t s = (uint32_t)hh & (cap - 1);
            while (nh[s])
                s = (s + 1) & (cap - 1);
            nh[s] = id + 1;
        }
        free(p->cs_hash);
        p->cs_hash = nh;
        p->cs_hash_cap = cap;
    }
    uint32_t s = (uint32_t)h & (p->cs_hash_cap - 1);
    while (p->cs_hash[s]) {
        uint32_t id = p->cs_hash[s] - 1;
        if (p->cs_n.v[id] == m && (m == 0 ||
            memcmp(p->ranges.v + 2 * (size_t)p->cs_off.v[id], set, 2 * m * sizeof(uint32_t)) == 0)) {
            free(negbuf);
            return id;
        }
        s = (s + 1) & (p->cs_hash_cap - 1);
    }
    uint32_t id = (uint32_t)p->cs_off.n;
    if (p->ranges.n / 2 > 0x3FFFFFFFu || id >= (1u << 30)) {
        free(negbuf);
        perr(p, "too many character sets");
        return 0;
    }
    vec_push(p, &p->cs_off, (uint32_t)(p->ranges.n / 2));
    vec_push(p, &p->cs_n, (uint32_t)m);
    for (size_t k = 0; k < 2 * m; k++)
        vec_push(p, &p->ranges, set[k]);
    free(negbuf);
    if (!p->rc)
        p->cs_hash[s] = id + 1;
    return id;
}

static uint32_t single_set(parser_t *p, uint32_t cp)
{
    uint32_t r[2] = {cp, cp};
    return intern_set(p, r, 1, 0);
}

/* ---------------------------------------------------------------- parsing */

static void parse_alternates(parser_t *p, uint32_t r);

/* At a name: is it the start of the next rule (`name ::=`)? */
static int at_rule_start(parser_t *p)
{
    size_t j = p->i;
    while (j < p->n && is_name_char((unsigned char)p->s[j]))
        j++;
    while (j < p->n && (p->s[j] == ' ' || p->s[j] == '\t' || p->s[j] == '\r' || p->s[j] == '\n'))
        j++;
    return j + 3 <= p->n && memcmp(p->s + j, "::=", 3) == 0;
}

static int read_int(parser_t *p, uint32_t *v)
{
    skip_ws(p);
    if (peek(p) < '0' || peek(p) > '9') {
        perr(p, "expected a number in { }");
        return -1;
    }
    uint64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (uint64_t)(peek(p) - '0');
        if (x > DSQ_GRAMMAR_MAX_REPEAT) {
            perr(p, "repetition count above %d", DSQ_GRAMMAR_MAX_REPEAT);
            return -1;
        }
        p->i++;
    }
    skip_ws(p);
    *v = (uint32_t)x;
    return 0;
}

/* Rule R ::= item R | (the x* rule) for the elements item[0..n). */
static uint32_t star_rule(parser_t *p, uint32_t parent, const uint32_t *item, size_t n)
{
    uint32_t s = synth_rule(p, parent);
    for (size_t k = 0; k < n && !p->rc; k++)
        emit(p, s, item[k]);
    emit(p, s, G_EL(GT_REF, s));
    emit(p, s, G_EL(GT_ALT, 0));
    return s;
}

/* Apply the repetition operator at p->i to rule r's elements [start, end). */
static void repeat(parser_t *p, uint32_t r, size_t start)
{
    size_t n = p->rules[r].body.n - start;
    uint32_t *item = malloc((n ? n : 1) * sizeof(*item));
    if (!item) {
        oom(p);
        return;
    }
    if (n)
        memcpy(item, p->rules[r].body.v + start, n * sizeof(*item));
    int op = peek(p);
    p->i++;
    uint32_t lo = 0, hi = 0;
    int unbounded = 0;
    if (op == '*') {
        unbounded = 1;
    } else if (op == '+') {
        lo = 1;
        unbounded = 1;
    } else if (op == '?') {
        hi = 1;
    } else {   /* { m } { m , } { m , n } */
        if (read_int(p, &lo) == 0) {
            if (peek(p) == ',') {
                p->i++;
                skip_ws(p);
                if (peek(p) == '}')
                    unbounded = 1;
                else if (read_int(p, &hi) == 0 && hi < lo)
                    perr(p, "{%u,%u}: the maximum is below the minimum", lo, hi);
            } else {
                hi = lo;
            }
            if (!p->rc && peek(p) != '}')
                perr(p, "expected '}'");
            else
                p->i++;
        }
    }
    if (p->rc) {
        free(item);
        return;
    }
    /* rebuild: lo copies, then the optional tail */
    p->n_elements -= n;
    p->rules[r].body.n = start;
    for (uint32_t k = 0; k < lo && !p->rc; k++)
        for (size_t q = 0; q < n; q++)
            emit(p, r, item[q]);
    if (unbounded) {
        uint32_t s = star_rule(p, r, item, n);
        emit(p, r, G_EL(GT_REF, s));
    } else if (hi > lo) {
        /* R(1) ::= item | ; R(k) ::= item R(k-1) | */
        uint32_t prev = 0;
        for (uint32_t k = 1; k <= hi - lo && !p->rc; k++) {
            uint32_t s = synth_rule(p, r);
            for (size_t q = 0; q < n; q++)
                emit(p, s, item[q]);
            if (k > 1)
                emit(p, s, G_EL(GT_REF, prev));
            emit(p, s, G_EL(GT_ALT, 0));
            prev = s;
        }
        emit(p, r, G_EL(GT_REF, prev));
    }
    free(item);
}

static void parse_sequence(parser_t *p, uint32_t r)
{
    for (;;) {
        skip_ws(p);
        int c = peek(p);
        if (p->rc || c < 0 || c == '|' || c == ')')
            return;
        if (is_name_char(c) && at_rule_start(p))
            return;
        size_t start = p->rules[r].body.n;
        if (c == '"') {
            p->i++;
            while (!p->rc && peek(p) != '"') {
                if (peek(p) < 0 || peek(p) == '\n') {
                    perr(p, "unterminated string literal");
                    return;
                }
                size_t at = p->i;
                uint32_t cp = parse_char(p);
                if (!p->rc && cp == 0) {
                    p->i = at;   /* the error points at the character */
                    perr_nul(p);
                }
                if (!p->rc)
                    emit(p, r, G_EL(GT_CHARS, single_set(p, cp)));
            }
            p->i++;
        } else if (c == '[') {
            p->i++;
            int neg = 0;
            if (peek(p) == '^') {
                neg = 1;
                p->i++;
            }
            u32vec_t tmp = {0};
            size_t at = p->i;
            bool nul = false;   /* a range of it includes U+0000 */
            while (!p->rc && peek(p) != ']') {
                if (peek(p) < 0) {
                    perr(p, "unterminated character class");
                    break;
                }
                uint32_t lo = parse_char(p), hi = lo;
                if (!p->rc && peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
                    p->i++;
                    hi = parse_char(p);
                    if (!p->rc && hi < lo)
                        perr(p, "character range %04X-%04X is reversed", lo, hi);
                }
                /* U+0000 is never generated (outputs are C strings): a
                 * class keeps its other characters */
                nul |= !neg && lo == 0;
                if (!neg && lo == 0 && hi == 0)
                    continue;
                vec_push(p, &tmp, !neg && lo == 0 ? 1 : lo);
                vec_push(p, &tmp, hi);
            }
            if (!p->rc && neg) {   /* the complement leaves U+0000 out too */
                vec_push(p, &tmp, 0);
                vec_push(p, &tmp, 0);
            }
            if (!p->rc) {
                p->i++;
                uint32_t id = intern_set(p, tmp.v, tmp.n / 2, neg);
                if (!p->rc && nul && p->cs_n.v[id] == 0) {
                    p->i = at;
                    perr_nul(p);
                }
                emit(p, r, G_EL(GT_CHARS, id));
            }
            free(tmp.v);
        } else if (c == '.') {
            p->i++;
            uint32_t any[2] = {1, G_MAX_CP};   /* U+0000 never: as for classes */
            emit(p, r, G_EL(GT_CHARS, intern_set(p, any, 1, 0)));
        } else if (is_name_char(c)) {
            size_t j = p->i, end = p->i;
            while (end < p->n && is_name_char((unsigned char)p->s[end]))
                end++;
            uint32_t ref = named_rule(p, p->s + j, end - j);   /* located at its start */
            p->i = end;
            emit(p, r, G_EL(GT_REF, ref));
        } else if (c == '(') {
            if (++p->depth > DSQ_GRAMMAR_MAX_NESTING) {
                perr(p, "groups nested deeper than %d", DSQ_GRAMMAR_MAX_NESTING);
                return;
            }
            p->i++;
            uint32_t s = synth_rule(p, r);
            parse_alternates(p, s);
            skip_ws(p);
            if (!p->rc && peek(p) != ')') {
                perr(p, "expected ')'");
                return;
            }
            p->i++;
            p->depth--;
            emit(p, r, G_EL(GT_REF, s));
        } else {
            if (c == '*' || c == '+' || c == '?' || c == '{')
                perr(p, "'%c' with nothing before it to repeat", c);
            else if (c >= 0x20 && c < 0x7F)
                perr(p, "unexpected '%c'", c);
            else
                perr(p, "unexpected byte 0x%02X", (unsigned)c);
            return;
        }
        skip_ws(p);
        while (!p->rc && (peek(p) == '*' || peek(p) == '+' || peek(p) == '?' || peek(p) == '{')) {
            repeat(p, r, start);
            skip_ws(p);
        }
    }
}

static void parse_alternates(parser_t *p, uint32_t r)
{
    parse_sequence(p, r);
    while (!p->rc && peek(p) == '|') {
        p->i++;
        emit(p, r, G_EL(GT_ALT, 0));
        parse_sequence(p, r);
    }
}

static void parse_grammar(parser_t *p)
{
    skip_ws(p);
    while (!p->rc && p->i < p->n) {
        size_t j = p->i;
        while (p->i < p->n && is_name_char((unsigned char)p->s[p->i]))
            p->i++;
        if (p->i == j) {
            perr(p, "expected a rule name");
            return;
        }
        uint32_t r = named_rule(p, p->s + j, p->i - j);
        if (p->rc)
            return;
        skip_ws(p);
        if (p->i + 3 > p->n || memcmp(p->s + p->i, "::=", 3) != 0) {
            perr(p, "expected '::=' after rule name '%s'", p->rules[r].name);
            return;
        }
        if (p->rules[r].defined) {
            perr(p, "rule '%s' is defined twice", p->rules[r].name);
            return;
        }
        p->rules[r].defined = 1;
        p->i += 3;
        parse_alternates(p, r);
        skip_ws(p);
        if (!p->rc && peek(p) == ')')
            perr(p, "unmatched ')'");
    }
}

/* --------------------------------------------------------------- checking */

/* Left recursion: rule r "starts with" s when an alternative of r reaches
 * a reference to s after only nullable rules. A cycle of such edges loops
 * the matcher. Returns the rule on a cycle, or -1. */
static int64_t left_cycle(const dsq_grammar_t *g, const uint8_t *nullable)
{
    uint8_t *color = calloc(g->n_rules, 1);      /* 0 new, 1 on path, 2 done */
    /* explicit DFS: (rule, element cursor) */
    uint32_t *st_r = malloc(g->n_rules * sizeof(uint32_t) + 4);
    uint32_t *st_e = malloc(g->n_rules * sizeof(uint32_t) + 4);
    int64_t bad = -2;
    if (!color || !st_r || !st_e)
        goto out;
    bad = -1;
    for (uint32_t r0 = 0; r0 < g->n_rules && bad < 0; r0++) {
        if (color[r0])
            continue;
        size_t sp = 0;
        st_r[sp] = r0;
        st_e[sp] = g->rule_start[r0];
        sp++;
        color[r0] = 1;
        while (sp > 0 && bad < 0) {
            uint32_t r = st_r[sp - 1], e = st_e[sp - 1];
            /* next "starts with" edge from cursor e: scan the alternative */
            int64_t next = -1;
            while (G_TYPE(g->el[e]) != GT_END) {
                uint32_t x = g->el[e];
                if (G_TYPE(x) == GT_ALT) {
                    e++;
                    continue;
                }
                if (G_TYPE(x) == GT_REF) {
                    next = G_VAL(x);
                    /* resume after it only if it is nullable; else skip the
                     * rest of this alternative */
                    e++;
                    if (!nullable[next])
                        while (!G_ENDS(g->el[e]))
                            e++;
                    break;
                }
                /* a character: the rest of this alternative is not at the start */
                while (!G_ENDS(g->el[e]))
                    e++;
            }
            st_e[sp - 1] = e;
            if (next < 0) {
                color[r] = 2;
                sp--;
            } else if (color[next] == 1) {
                bad = next;
            } else if (color[next] == 0) {
                color[next] = 1;
                st_r[sp] = (uint32_t)next;
                st_e[sp] = g->rule_start[next];
                sp++;
            }
        }
    }
out:
    free(color);
    free(st_r);
    free(st_e);
    return bad;
}

static int check(dsq_grammar_t *g, char *err, size_t err_len)
{
    uint8_t *nullable = calloc(g->n_rules, 1);
    if (!nullable)
        return DSQ_ENOMEM;
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r])
                continue;
            uint32_t e = g->rule_start[r];
            for (;;) {   /* each alternative */
                int ok = 1;
                for (; !G_ENDS(g->el[e]); e++) {
                    uint32_t x = g->el[e];
                    if (G_TYPE(x) == GT_CHARS || !nullable[G_VAL(x)])
                        ok = 0;
                }
                if (ok) {
                    nullable[r] = 1;
                    changed = 1;
                    break;
                }
                if (G_TYPE(g->el[e]) == GT_END)
                    break;
                e++;
            }
        }
    }
    int64_t bad = left_cycle(g, nullable);
    free(nullable);
    if (bad == -2)
        return DSQ_ENOMEM;
    if (bad >= 0) {
        if (err && err_len)
            snprintf(err, err_len,
                     "grammar: rule '%s' can recurse without consuming input (left recursion, "
                     "or a repetition of something that can be empty)",
                     g->rule_name[bad]);
        return DSQ_EINVAL;
    }
    return DSQ_OK;
}

/* ------------------------------------------------------------------ build */

static void parser_free(parser_t *p)
{
    for (uint32_t r = 0; r < p->n_rules; r++) {
        free(p->rules[r].name);
        free(p->rules[r].body.v);
    }
    free(p->rules);
    free(p->ranges.v);
    free(p->cs_off.v);
    free(p->cs_n.v);
    free(p->cs_hash);
}

dsq_grammar_t *dsq_grammar_retain(dsq_grammar_t *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void dsq_grammar_free(dsq_grammar_t *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1)
        return;
    dsq__grammar_cache_free(g);
    for (uint32_t r = 0; r < g->n_rules; r++)
        free(g->rule_name ? g->rule_name[r] : NULL);
    free(g->rule_name);
    free(g->rule_start);
    free(g->el);
    free(g->cs_ranges);
    free(g->cs_off);
    free(g->cs_n);
    free(g->cs_ascii);
    free(g);
}

/* ------------------------------------------------------------ registry */

/* The last REG_SLOTS grammars compiled, keyed by (start rule, source): a
 * client that sends the same grammar or schema with every request (the
 * common case) gets the compiled grammar and its warm mask cache back
 * instead of a cold copy. Each slot holds one reference; oldest first. */
#define REG_SLOTS 8

typedef struct reg_slot {
    char *key;          /* root, NUL, source */
    size_t key_len;
    uint64_t hash;
    dsq_grammar_t *g;
} reg_slot_t;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static reg_slot_t reg[REG_SLOTS];
static int reg_n;

static uint64_t reg_hash(const char *root, const char *src, size_t len)
{
    uint64_t h = 0xCBF29CE484222325ull;   /* FNV-1a, 64 bit */
    for (const char *c = root; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001B3ull;
    h = (h ^ 0xFFu) * 0x100000001B3ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)src[i]) * 0x100000001B3ull;
    return h;
}

static int reg_match(const reg_slot_t *e, uint64_t h, const char *root, const char *src,
                     size_t len)
{
    size_t rl = strlen(root);
    return e->hash == h && e->key_len == rl + 1 + len && memcmp(e->key, root, rl + 1) == 0 &&
           memcmp(e->key + rl + 1, src, len) == 0;
}

static dsq_grammar_t *reg_get(const char *root, const char *src, size_t len, uint64_t h)
{
    dsq_grammar_t *g = NULL;
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < reg_n && !g; i++)
        if (reg_match(&reg[i], h, root, src, len)) {
            g = dsq_grammar_retain(reg[i].g);
            reg_slot_t t = reg[i];   /* most recently used goes last */
            memmove(reg + i, reg + i + 1, (size_t)(reg_n - i - 1) * sizeof(*reg));
            reg[reg_n - 1] = t;
        }
    pthread_mutex_unlock(&reg_mu);
    return g;
}

static void reg_put(const char *root, const char *src, size_t len, uint64_t h, dsq_grammar_t *g)
{
    size_t rl = strlen(root);
    char *key = malloc(rl + 1 + len + 1);
    if (!key)
        return;                     /* not kept: only a later miss */
    memcpy(key, root, rl + 1);
    memcpy(key + rl + 1, src, len);
    dsq_grammar_t *old = NULL;
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < reg_n; i++)
        if (reg_match(&reg[i], h, root, src, len)) {   /* another thread won */
            pthread_mutex_unlock(&reg_mu);
            free(key);
            return;
        }
    if (reg_n == REG_SLOTS) {
        old = reg[0].g;
        free(reg[0].key);
        memmove(reg, reg + 1, (REG_SLOTS - 1) * sizeof(*reg));
        reg_n--;
    }
    reg[reg_n++] = (reg_slot_t){.key = key, .key_len = rl + 1 + len, .hash = h,
                                .g = dsq_grammar_retain(g)};
    pthread_mutex_unlock(&reg_mu);
    dsq_grammar_free(old);
}

void dsq_grammar_registry_clear(void)
{
    pthread_mutex_lock(&reg_mu);
    int n = reg_n;
    reg_slot_t copy[REG_SLOTS];
    memcpy(copy, reg, (size_t)n * sizeof(*reg));
    reg_n = 0;
    pthread_mutex_unlock(&reg_mu);
    for (int i = 0; i < n; i++) {
        free(copy[i].key);
        dsq_grammar_free(copy[i].g);
    }
}

static int compile_gbnf(const char *src, size_t len, const char *root, dsq_grammar_t **out,
                        char *err, size_t err_len);

int dsq_grammar_from_gbnf(const char *src, size_t len, const char *root,
                          dsq_grammar_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = 0;
    if (!out || (!src && len))
        return DSQ_EINVAL;
    *out = NULL;
    if (!root)
        root = "root";
    if (len > DSQ_GRAMMAR_MAX_SOURCE)
        return compile_gbnf(src, len, root, out, err, err_len);   /* its error */
    uint64_t h = reg_hash(root, src ? src : "", len);
    if ((*out = reg_get(root, src ? src : "", len, h)) != NULL)
        return DSQ_OK;
    int rc = compile_gbnf(src, len, root, out, err, err_len);
    if (rc == DSQ_OK && (rc = dsq__grammar_check_start(*out)) != DSQ_OK) {
        if (rc == DSQ_ERANGE && err && err_len)
            snprintf(err, err_len, "grammar: more than %d alternatives are open at the start "
                     "(e.g. an enum or choice list that long); the matcher follows at most "
                     "that many", DSQ_GRAMMAR_MAX_STACKS);
        dsq_grammar_free(*out);
        *out = NULL;
        return rc;
    }
    if (rc == DSQ_OK)
        reg_put(root, src ? src : "", len, h, *out);
    return rc;
}

static int compile_gbnf(const char *src, size_t len, const char *root, dsq_grammar_t **out,
                        char *err, size_t err_len)
{
    if (len > DSQ_GRAMMAR_MAX_SOURCE) {
        if (err && err_len)
            snprintf(err, err_len, "grammar: %zu bytes, above the limit of %u", len,
                     DSQ_GRAMMAR_MAX_SOURCE);
        return DSQ_EINVAL;
    }
    if (!root)
        root = "root";
    parser_t p = {.s = src, .n = len, .line = 1, .err = err, .err_len = err_len};
    parse_grammar(&p);
    if (!p.rc && p.n_rules == 0)
        perr(&p, "the grammar has no rules");
    for (uint32_t r = 0; !p.rc && r < p.n_rules; r++)
        if (!p.rules[r].defined) {
            p.rc = DSQ_EINVAL;
            if (err && err_len)
                snprintf(err, err_len, "grammar line %d column %d: undefined rule '%s'",
                         p.rules[r].line, p.rules[r].col, p.rules[r].name);
        }
    int64_t root_id = -1;
    for (uint32_t r = 0; !p.rc && r < p.n_rules; r++)
        if (!p.rules[r].synth && strcmp(p.rules[r].name, root) == 0)
            root_id = r;
    if (!p.rc && root_id < 0) {
        p.rc = DSQ_EINVAL;
        if (err && err_len)
            snprintf(err, err_len, "grammar: no start rule '%.64s'", root);
    }
    if (p.rc) {
        int rc = p.rc;
        parser_free(&p);
        return rc;
    }

    dsq_grammar_t *g = calloc(1, sizeof(*g));
    int rc = DSQ_ENOMEM;
    if (!g)
        goto fail;
    atomic_init(&g->refs, 1);
    g->n_rules = p.n_rules;
    g->root = (uint32_t)root_id;
    g->n_el = (uint32_t)(p.n_elements + p.n_rules);
    g->el = malloc(g->n_el * sizeof(*g->el));
    g->rule_start = malloc(g->n_rules * sizeof(*g->rule_start));
    g->rule_name = calloc(g->n_rules, sizeof(*g->rule_name));
    if (!g->el || !g->rule_start || !g->rule_name)
        goto fail;
    uint32_t at = 0;
    for (uint32_t r = 0; r < p.n_rules; r++) {
        g->rule_start[r] = at;
        if (p.rules[r].body.n)   /* an empty rule (x ::= ) has no body array */
            memcpy(g->el + at, p.rules[r].body.v, p.rules[r].body.n * sizeof(uint32_t));
        at += (uint32_t)p.rules[r].body.n;
        g->el[at++] = G_EL(GT_END, 0);
        g->rule_name[r] = p.rules[r].name;
        p.rules[r].name = NULL;
    }
    g->n_el = at;
    g->n_cs = (uint32_t)p.cs_off.n;
    g->cs_ranges = p.ranges.v;
    g->cs_off = p.cs_off.v;
    g->cs_n = p.cs_n.v;
    p.ranges.v = p.cs_off.v = p.cs_n.v = NULL;
    /* only empty classes ([]) leave no range at all: keep the arrays
     * non-NULL so that cs_ranges + 0 stays defined */
    if (!g->cs_ranges)
        g->cs_ranges = calloc(2, sizeof(*g->cs_ranges));
    g->cs_ascii = calloc(g->n_cs ? g->n_cs : 1, sizeof(*g->cs_ascii));
    if (!g->cs_ascii || !g->cs_ranges)
        goto fail;
    for (uint32_t c = 0; c < g->n_cs; c++) {
        const uint32_t *rg = g->cs_ranges + 2 * (size_t)g->cs_off[c];
        for (uint32_t k = 0; k < g->cs_n[c] && rg[2 * k] < 128; k++)
            for (uint32_t cp = rg[2 * k]; cp <= rg[2 * k + 1] && cp < 128; cp++)
                g->cs_ascii[c][cp >> 6] |= 1ull << (cp & 63);
    }
    rc = check(g, err, err_len);
    if (rc)
        goto fail;
    dsq__grammar_cache_init(g);
    parser_free(&p);
    *out = g;
    return DSQ_OK;
fail:
    if (rc == DSQ_ENOMEM && err && err_len)
        snprintf(err, err_len, "grammar: out of memory");
    parser_free(&p);
    dsq_grammar_free(g);
    return rc;
}

int dsq_grammar_n_rules(const dsq_grammar_t *g) { return g ? (int)g->n_rules : 0; }
int dsq_grammar_n_elements(const dsq_grammar_t *g) { return g ? (int)g->n_el : 0; }

/* ------------------------------------------------------------- built-ins */

/* RFC 8259 JSON; `ws` bounded per gap (grammar.h). */
#define JSON_RULES                                                                \
    "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n" \
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n" \
    "array  ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"          \
    "string ::= \"\\\"\" char* \"\\\"\"\n"                                      \
    "char   ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n" \
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n" \
    "ws     ::= [ \\t\\n\\r]{0,16}\n"

int dsq_grammar_builtin(dsq_grammar_builtin_t which, dsq_grammar_t **out, char *err,
                        size_t err_len)
{
    static const char object[] = "root ::= object\n" JSON_RULES;
    static const char value[] = "root ::= value\n" JSON_RULES;
    const char *src = which == DSQ_GRAMMAR_JSON_OBJECT ? object : value;
    if (which != DSQ_GRAMMAR_JSON_OBJECT && which != DSQ_GRAMMAR_JSON_VALUE)
        return DSQ_EINVAL;
    return dsq_grammar_from_gbnf(src, strlen(src), NULL, out, err, err_len);
}

int dsq_grammar_from_choices(const char *const *choices, int n, dsq_grammar_t **out,
                             char *err, size_t err_len)
{
    if (!out || !choices || n < 1) {
        if (err && err_len)
            snprintf(err, err_len, "guided_choice needs at least one choice");
        return DSQ_EINVAL;
    }
    /* root ::= "c0" | "c1" | ...: bytes >= 0x80 copied (UTF-8 is checked by
     * the parser), '"' and '\\' escaped, control characters as \xHH */
    size_t cap = 16;
    for (int i = 0; i < n; i++) {
        if (!choices[i] || !choices[i][0]) {
            if (err && err_len)
                snprintf(err, err_len, "guided_choice[%d] is empty", i);
            return DSQ_EINVAL;
        }
        cap += 4 * strlen(choices[i]) + 8;
    }
    if (cap > DSQ_GRAMMAR_MAX_SOURCE) {
        if (err && err_len)
            snprintf(err, err_len, "guided_choice: the choices are too long");
        return DSQ_EINVAL;
    }
    char *src = malloc(cap);
    if (!src)
        return DSQ_ENOMEM;
    size_t k = (size_t)snprintf(src, cap, "root ::=");
    for (int i = 0; i < n; i++) {
        k += (size_t)snprintf(src + k, cap - k, "%s\"", i ? " |" : "");
        for (const unsigned char *c = (const unsigned char *)choices[i]; *c; c++) {
            if (*c == '"' || *c == '\\') {
                src[k++] = '\\';
                src[k++] = (char)*c;
            } else if (*c < 0x20 || *c == 0x7F) {
                k += (size_t)snprintf(src + k, cap - k, "\\x%02X", *c);
            } else {
                src[k++] = (char)*c;
            }
        }
        src[k++] = '"';
    }
    src[k] = 0;
    int rc = dsq_grammar_from_gbnf(src, k, NULL, out, err, err_len);
    free(src);
    return rc;
}

/* Jinja2-subset lexer and parser for chat templates.
 *
 * Owns: the arena allocator, turning template text into the syntax tree of
 * chat_template_internal.h. Whitespace handling follows Jinja 3.1's lexer as
 * configured by transformers (trim_blocks=True, lstrip_blocks=True,
 * keep_trailing_newline=False): newlines are normalised to "\n", one
 * trailing newline is dropped, "-" markers strip all whitespace on their
 * side, a block or comment tag eats one newline after it, and spaces/tabs
 * before a block or comment tag that starts a line are dropped. Expression
 * precedence mirrors jinja2/parser.py so templates parse the same way.
 * Errors longjmp to dsq__jinja_parse, which reports "line N: reason". */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_internal.h"
#include "engine/common/hex.h"

/* ---- arena ---- */
struct dsq__arena_chunk {
    dsq__arena_chunk_t *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *dsq__arena_alloc(dsq__arena_t *a, size_t n)
{
    void *p = NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    dsq__arena_chunk_t *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > 65536 - sizeof(*c) ? n : 65536 - sizeof(*c);
        if (n > a->limit_bytes || a->used_bytes + sz > a->limit_bytes)
            goto out;
        c = malloc(sizeof(*c) + sz);
        if (!c)
            goto out;
        c->size = sz;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->used_bytes += sz;
    }
    p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
out:
    return p;
}

void dsq__arena_free(dsq__arena_t *a)
{
    dsq__arena_chunk_t *c = a->head;
    while (c) {
        dsq__arena_chunk_t *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used_bytes = 0;
}

/* ---- supported filters and tests ---- */
static const char *const filter_names[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape",
    "first", "float", "indent", "int", "items", "join", "last", "length",
    "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
    "reverse", "round", "safe", "select", "selectattr", "sort", "split",
    "string", "sum", "title", "tojson", "trim", "unique", "upper",
    "wordcount", NULL,
};
static const char *const test_names[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer",
    "float", "number", "string", "mapping", "iterable", "sequence",
    "callable", "sameas", "in", "eq", "equalto", "==", "ne", "!=", "lt",
    "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "odd",
    "even", "divisibleby", "lower", "upper", NULL,
};

static bool in_list(const char *const *l, const char *p, size_t n)
{
    for (; *l; l++)
        if (strlen(*l) == n && memcmp(*l, p, n) == 0)
            return true;
    return false;
}

bool dsq__jinja_is_filter(const char *p, size_t n)
{
    return in_list(filter_names, p, n);
}

bool dsq__jinja_is_test(const char *p, size_t n)
{
    return in_list(test_names, p, n);
}

/* ---- tokens ---- */
typedef enum {
    T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME,
    T_STRING, T_INT, T_FLOAT, T_OP, T_EOF,
} tok_type_t;

typedef struct {
    tok_type_t type;
    int line;
    int op;          /* T_OP: operator code */
    const char *p;   /* T_DATA/T_NAME/T_STRING: text (decoded for strings) */
    size_t n;
    int64_t i;
    double f;
} tok_t;

typedef struct {
    dsq__arena_t *arena;
    jmp_buf jb;
    char *err;
    size_t err_len;
    const char *src;
    size_t len;
    tok_t *toks;
    size_t n_toks, cap_toks;
    size_t pos;      /* parser position in toks */
    int depth;
} pstate_t;

#define MAX_PARSE_DEPTH 100

static _Noreturn void fail(pstate_t *ps, int line, const char *fmt, ...)
{
    if (ps->err && ps->err_len) {
        int k = snprintf(ps->err, ps->err_len, "template line %d: ", line);
        if (k >= 0 && (size_t)k < ps->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ps->err + k, ps->err_len - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    longjmp(ps->jb, 1);
}

static void *palloc(pstate_t *ps, size_t n)
{
    void *p = dsq__arena_alloc(ps->arena, n);
    if (!p)
        fail(ps, 0, "out of memory while parsing");
    return p;
}

static tok_t *push_tok(pstate_t *ps, tok_type_t type, int line)
{
    if (ps->n_toks == ps->cap_toks) {
        size_t cap = ps->cap_toks ? ps->cap_toks * 2 : 256;
        tok_t *t = palloc(ps, cap * sizeof(*t));
        if (ps->n_toks)
            memcpy(t, ps->toks, ps->n_toks * sizeof(*t));
        ps->toks = t;
        ps->cap_toks = cap;
    }
    tok_t *t = &ps->toks[ps->n_toks++];
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->line = line;
    return t;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
           c == '\f';
}

static int count_nl(const char *p, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

static void put_utf8(char *out, size_t *o, uint32_t cp)
{
    if (cp < 0x80) {
        out[(*o)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*o)++] = (char)(0xC0 | (cp >> 6));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*o)++] = (char)(0xE0 | (cp >> 12));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*o)++] = (char)(0xF0 | (cp >> 18));
        out[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* Decode a Python string literal body (Jinja decodes with
 * "unicode-escape"): \n \t \r \\ \' \" \a \b \f \v \0-7 octal, \xHH,
 * \uHHHH, \UHHHHHHHH; an unknown escape keeps the backslash. */
static void lex_string(pstate_t *ps, size_t *pos, int *line)
{
    const char *s = ps->src;
    char q = s[*pos];
    size_t i = *pos + 1;
    int start_line = *line;
    while (i < ps->len && s[i] != q) {
        if (s[i] == '\\' && i + 1 < ps->len)
            i++;
        i++;
    }
    if (i >= ps->len)
        fail(ps, start_line, "unterminated string literal");
    size_t body = *pos + 1, body_n = i - body;
    char *out = palloc(ps, body_n + 1);
    size_t o = 0;
    for (size_t k = body; k < i; k++) {
        char c = s[k];
        if (c != '\\') {
            out[o++] = c;
            continue;
        }
        char e = s[++k];
        switch (e) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'v': out[o++] = '\v'; break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case '\n': break; /* line continuation */
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < nd; d++) {
                int h = k + 1 + (size_t)d < i ? dsq_hex_value(s[k + 1 + (size_t)d]) : -1;
                if (h < 0)
                    fail(ps, start_line, "truncated \\%c escape in string", e);
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                fail(ps, start_line, "invalid code point in \\%c escape", e);
            k += (size_t)nd;
            put_utf8(out, &o, cp); /* fits: escape text >= its UTF-8 */
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && k + 1 < i && s[k + 1] >= '0' &&
                                s[k + 1] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(s[++k] - '0');
                put_utf8(out, &o, cp);
            } else {
                out[o++] = '\\';
                out[o++] = e;
            }
        }
    }
    *line += count_nl(s + *pos, i + 1 - *pos);
    tok_t *t = push_tok(ps, T_STRING, start_line);
    t->p = out;
    t->n = o;
    *pos = i + 1;
}

static const struct { const char *s; int op; } ops2[] = {
    {"//", DSQ__OP_FLOORDIV}, {"**", DSQ__OP_POW}, {"==", DSQ__OP_EQ},
    {"!=", DSQ__OP_NE}, {">=", DSQ__OP_GE}, {"<=", DSQ__OP_LE},
};

/* Lex the inside of {{ }} or {% %} starting at *pos (after the opener and
 * its sign). Returns after the end marker; sets *ended_nl when the matched
 * end text ends with a newline (Jinja's line_starting). */
static void lex_tag(pstate_t *ps, size_t *pos, int *line, bool block,
                    bool *ended_nl)
{
    const char *s = ps->src;
    size_t i = *pos;
    int bal = 0;
    int open_line = *line;
    const char ec = block ? '%' : '}';
    for (;;) {
        if (i >= ps->len)
            fail(ps, open_line, "unterminated %s tag", block ? "{%" : "{{");
        if (bal == 0) {
            /* end marker: "+%}", "-%}\s*", "%}\n?" (block, trim_blocks),
             * "-}}\s*", "}}" (variable) */
            size_t k = i;
            char sign = 0;
            if ((s[k] == '-' || s[k] == '+') && k + 2 < ps->len + 0 &&
                s[k + 1] == ec && s[k + 2] == '}') {
                sign = s[k];
                k++;
            }
            if (k + 1 < ps->len && s[k] == ec && s[k + 1] == '}' &&
                (sign != '+' || block)) {
                k += 2;
                *ended_nl = false;
                if (sign == '-') {
                    while (k < ps->len && is_ws(s[k])) {
                        *ended_nl = s[k] == '\n';
                        *line += s[k] == '\n';
                        k++;
                    }
                } else if (block && sign != '+' && k < ps->len &&
                           s[k] == '\n') {
                    k++;
                    (*line)++;
                    *ended_nl = true;
                }
                push_tok(ps, block ? T_BLOCK_END : T_VAR_END, *line);
                *pos = k;
                return;
            }
        }
        char c = s[i];
        if (is_ws(c)) {
            *line += c == '\n';
            i++;
        } else if (c == '\'' || c == '"') {
            lex_string(ps, &i, line);
        } else if (c >= '0' && c <= '9') {
            size_t st = i;
            bool isf = false;
            while (i < ps->len && ((s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
                i++;
            if (i + 1 < ps->len && s[i] == '.' && s[i + 1] >= '0' &&
                s[i + 1] <= '9') {
                isf = true;
                i++;
                while (i < ps->len &&
                       ((s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
                    i++;
            }
            if (i < ps->len && (s[i] == 'e' || s[i] == 'E')) {
                size_t k = i + 1;
                if (k < ps->len && (s[k] == '+' || s[k] == '-'))
                    k++;
                if (k < ps->len && s[k] >= '0' && s[k] <= '9') {
                    isf = true;
                    i = k;
                    while (i < ps->len && s[i] >= '0' && s[i] <= '9')
                        i++;
                }
            }
            char buf[64];
            size_t bn = 0;
            for (size_t k = st; k < i && bn < sizeof(buf) - 1; k++)
                if (s[k] != '_')
                    buf[bn++] = s[k];
            buf[bn] = 0;
            tok_t *t = push_tok(ps, isf ? T_FLOAT : T_INT, *line);
            if (isf) {
                t->f = strtod(buf, NULL);
            } else {
                errno = 0;
                unsigned long long v = strtoull(buf, NULL, 10);
                if (errno || v > (unsigned long long)INT64_MAX ||
                    bn >= sizeof(buf) - 1)
                    fail(ps, *line, "integer literal too large");
                t->i = (int64_t)v;
            }
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                   c == '_') {
            size_t st = i;
            while (i < ps->len &&
                   ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                    (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
                i++;
            tok_t *t = push_tok(ps, T_NAME, *line);
            t->p = s + st;
            t->n = i - st;
        } else {
            int op = 0;
            for (size_t k = 0; k < sizeof(ops2) / sizeof(ops2[0]); k++)
                if (i + 1 < ps->len && s[i] == ops2[k].s[0] &&
                    s[i + 1] == ops2[k].s[1]) {
                    op = ops2[k].op;
                    i += 2;
                    break;
                }
            if (!op) {
                if (!strchr("+-/*%~[](){}><=.:|,;", c) || c == 0)
                    fail(ps, *line, "unexpected character '%c' in tag", c);
                op = (unsigned char)c;
                i++;
                if (c == '(' || c == '[' || c == '{')
                    bal++;
                else if ((c == ')' || c == ']' || c == '}') && bal > 0)
                    bal--;
            }
            tok_t *t = push_tok(ps, T_OP, *line);
            t->op = op;
        }
    }
}

/* Match "\s*NAME\s*" then an end marker at s[i]: returns the index after
 * NAME's trailing spaces or 0 when NAME is not there. */
static size_t match_word(const pstate_t *ps, size_t i, const char *name)
{
    const char *s = ps->src;
    size_t k = strlen(name);
    while (i < ps->len && is_ws(s[i]))
        i++;
    if (ps->len - i < k || memcmp(s + i, name, k) != 0)
        return 0;
    i += k;
    if (i < ps->len && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                        (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
        return 0;
    while (i < ps->len && is_ws(s[i]))
        i++;
    return i;
}

/* Lstrip/rstrip of text before a tag, as the root rule does it. */
static size_t strip_before(const char *text, size_t tn, char sign, bool lstrip,
                           bool line_starting)
{
    if (sign == '-') {
        while (tn > 0 && is_ws(text[tn - 1]))
            tn--;
    } else if (sign != '+' && lstrip) {
        size_t lp = tn;
        while (lp > 0 && text[lp - 1] != '\n')
            lp--;
        if (lp > 0 || line_starting) {
            bool all_ws = true;
            for (size_t j = lp; j < tn; j++)
                if (!is_ws(text[j]))
                    all_ws = false;
            if (all_ws)
                tn = lp;
        }
    }
    return tn;
}

/* {% raw %}...{% endraw %}: *pos is just after "{%" and its sign. Returns
 * false (nothing consumed) when this is not a raw block. */
static bool lex_raw(pstate_t *ps, size_t *pos, int *line, bool *line_starting)
{
    const char *s = ps->src;
    size_t i = match_word(ps, *pos, "raw");
    if (!i)
        return false;
    int open_line = *line;
    bool dash = false;
    if (i + 2 < ps->len && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') {
        dash = true;
        i += 3;
    } else if (i + 1 < ps->len && s[i] == '%' && s[i + 1] == '}') {
        i += 2;
    } else {
        fail(ps, open_line, "malformed raw tag");
    }
    bool ls = false;
    while (dash && i < ps->len && is_ws(s[i])) {
        ls = s[i] == '\n';
        i++;
    }
    size_t body = i;
    for (;; i++) {
        if (i + 1 >= ps->len)
            fail(ps, open_line, "raw block is never closed (expected 'endraw')");
        if (s[i] != '{' || s[i + 1] != '%')
            continue;
        size_t k = i + 2;
        char sign = 0;
        if (k < ps->len && (s[k] == '-' || s[k] == '+'))
            sign = s[k++];
        size_t e = match_word(ps, k, "endraw");
        if (!e)
            continue;
        char esign = 0;
        if (e < ps->len && (s[e] == '-' || s[e] == '+'))
            esign = s[e++];
        if (e + 1 >= ps->len || s[e] != '%' || s[e + 1] != '}')
            continue;
        e += 2;
        size_t tn = strip_before(s + body, i - body, sign, true, ls);
        if (tn) {
            tok_t *t = push_tok(ps, T_DATA, *line);
            t->p = s + body;
            t->n = tn;
        }
        *line_starting = false;
        if (esign == '-') {
            while (e < ps->len && is_ws(s[e])) {
                *line_starting = s[e] == '\n';
                e++;
            }
        } else if (esign != '+' && e < ps->len && s[e] == '\n') {
            e++;
            *line_starting = true;
        }
        *line += count_nl(s + *pos, e - *pos);
        *pos = e;
        return true;
    }
}

static void lex(pstate_t *ps)
{
    const char *s = ps->src;
    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos < ps->len) {
        /* earliest "{{", "{%" or "{#" */
        size_t k = pos;
        const char *hit = NULL;
        while (k + 1 < ps->len) {
            const char *q = memchr(s + k, '{', ps->len - 1 - k);
            if (!q)
                break;
            if (q[1] == '{' || q[1] == '%' || q[1] == '#') {
                hit = q;
                break;
            }
            k = (size_t)(q - s) + 1;
        }
        size_t tstart = hit ? (size_t)(hit - s) : ps->len;
        const char *text = s + pos;
        size_t tn = tstart - pos;
        char kind = hit ? hit[1] : 0;
        char sign = 0;
        if (hit && tstart + 2 < ps->len &&
            (s[tstart + 2] == '-' || s[tstart + 2] == '+'))
            sign = s[tstart + 2];
        if (hit) /* lstrip_blocks applies to block and comment tags only */
            tn = strip_before(text, tn, sign, kind != '{', line_starting);
        if (tn > 0) {
            tok_t *t = push_tok(ps, T_DATA, line);
            t->p = text;
            t->n = tn;
        }
        line += count_nl(s + pos, tstart - pos);
        if (!hit)
            break;
        pos = tstart + 2 + (sign ? 1 : 0);
        line_starting = false;
        if (kind == '#') {
            /* comment: up to the first "#}" */
            int open_line = line;
            size_t e = pos;
            for (;;) {
                if (e + 1 >= ps->len)
                    fail(ps, open_line, "unterminated comment");
                if (s[e] == '#' && s[e + 1] == '}')
                    break;
                e++;
            }
            char esign = 0;
            if (e > pos && (s[e - 1] == '-' || s[e - 1] == '+'))
                esign = s[e - 1];
            line += count_nl(s + pos, e - pos);
            pos = e + 2;
            if (esign == '-') {
                while (pos < ps->len && is_ws(s[pos])) {
                    line_starting = s[pos] == '\n';
                    line += s[pos] == '\n';
                    pos++;
                }
            } else if (esign != '+' && pos < ps->len && s[pos] == '\n') {
                pos++;
                line++;
                line_starting = true;
            }
            continue;
        }
        bool block = kind == '%';
        if (block && lex_raw(ps, &pos, &line, &line_starting))
            continue;
        push_tok(ps, block ? T_BLOCK_BEGIN : T_VAR_BEGIN, line);
        lex_tag(ps, &pos, &line, block, &line_starting);
    }
    push_tok(ps, T_EOF, line);
}

/* ---- parser ---- */
static tok_t *cur(pstate_t *ps) { return &ps->toks[ps->pos]; }
static tok_t *peek(pstate_t *ps, size_t k)
{
    size_t i = ps->pos + k;
    return &ps->toks[i < ps->n_toks ? i : ps->n_toks - 1];
}
static void advance(pstate_t *ps)
{
    if (ps->pos + 1 < ps->n_toks)
        ps->pos++;
}
static bool is_name(const tok_t *t, const char *n)
{
    return t->type == T_NAME && strlen(n) == t->n && memcmp(t->p, n, t->n) == 0;
}
static bool is_op(const tok_t *t, int op)
{
    return t->type == T_OP && t->op == op;
}

static const char *tok_desc(const tok_t *t, char *buf, size_t n)
{
    switch (t->type) {
    case T_NAME: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); break;
    case T_OP:
        if (t->op < 256) snprintf(buf, n, "'%c'", t->op);
        else snprintf(buf, n, "operator");
        break;
    case T_STRING: snprintf(buf, n, "string"); break;
    case T_INT: case T_FLOAT: snprintf(buf, n, "number"); break;
    case T_BLOCK_END: snprintf(buf, n, "end of statement block"); break;
    case T_VAR_END: snprintf(buf, n, "end of print statement"); break;
    case T_EOF: snprintf(buf, n, "end of template"); break;
    default: snprintf(buf, n, "template data"); break;
    }
    return buf;
}

static _Noreturn void unexpected(pstate_t *ps, const char *what)
{
    char b[64];
    fail(ps, cur(ps)->line, "expected %s, got %s", what,
         tok_desc(cur(ps), b, sizeof(b)));
}

static void expect_op(pstate_t *ps, int op, const char *what)
{
    if (!is_op(cur(ps), op))
        unexpected(ps, what);
    advance(ps);
}

static dsq__jstr_t expect_name(pstate_t *ps)
{
    tok_t *t = cur(ps);
    if (t->type != T_NAME)
        unexpected(ps, "a name");
    advance(ps);
    return (dsq__jstr_t){t->p, t->n};
}

static dsq__jnode_t *mk(pstate_t *ps, dsq__jnode_kind_t k, int line)
{
    dsq__jnode_t *n = palloc(ps, sizeof(*n));
    n->kind = k;
    n->line = line;
    return n;
}

/* growable node-pointer vector in the arena */
typedef struct { dsq__jnode_t **v; int n, cap; } nvec_t;
static void nvec_push(pstate_t *ps, nvec_t *v, dsq__jnode_t *x)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        dsq__jnode_t **nv = palloc(ps, (size_t)cap * sizeof(*nv));
        if (v->n)
            memcpy(nv, v->v, (size_t)v->n * sizeof(*nv));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static dsq__jnode_t *parse_expr(pstate_t *ps, bool with_cond);
static dsq__jnode_t *parse_unary(pstate_t *ps, bool with_filter);
static dsq__jnode_t *parse_primary(pstate_t *ps);
static dsq__jnode_t *parse_postfix(pstate_t *ps, dsq__jnode_t *n);

static void enter(pstate_t *ps)
{
    if (++ps->depth > MAX_PARSE_DEPTH)
        fail(ps, cur(ps)->line, "nesting deeper than %d", MAX_PARSE_DEPTH);
}

/* expr (',' expr)* ; a comma makes a tuple (a list here) */
static dsq__jnode_t *parse_tuple(pstate_t *ps, bool with_cond)
{
    int line = cur(ps)->line;
    dsq__jnode_t *first = parse_expr(ps, with_cond);
    if (!is_op(cur(ps), ','))
        return first;
    nvec_t v = {0};
    nvec_push(ps, &v, first);
    while (is_op(cur(ps), ',')) {
        advance(ps);
        tok_t *t = cur(ps);
        if (t->type == T_VAR_END || t->type == T_BLOCK_END || is_op(t, ')'))
            break;
        nvec_push(ps, &v, parse_expr(ps, with_cond));
    }
    dsq__jnode_t *n = mk(ps, DSQ__N_LIST, line);
    n->items = v.v;
    n->n_items = v.n;
    n->op = 1;
    return n;
}

/* (args) after '(' was seen: positional and name=value */
static void parse_args(pstate_t *ps, dsq__jnode_t *n)
{
    nvec_t pos = {0}, kwv = {0};
    dsq__jstr_t *kwn = NULL;
    int kcap = 0;
    expect_op(ps, '(', "'('");
    while (!is_op(cur(ps), ')')) {
        if (pos.n + kwv.n > 0)
            expect_op(ps, ',', "',' or ')'");
        if (is_op(cur(ps), ')'))
            break;
        if (is_op(cur(ps), '*') || is_op(cur(ps), DSQ__OP_POW))
            fail(ps, cur(ps)->line, "unsupported construct: *args/**kwargs in call");
        if (cur(ps)->type == T_NAME && is_op(peek(ps, 1), '=')) {
            dsq__jstr_t nm = expect_name(ps);
            advance(ps);
            if (kwv.n == kcap) {
                int cap = kcap ? kcap * 2 : 4;
                dsq__jstr_t *nk = palloc(ps, (size_t)cap * sizeof(*nk));
                if (kwv.n)
                    memcpy(nk, kwn, (size_t)kwv.n * sizeof(*nk));
                kwn = nk;
                kcap = cap;
            }
            kwn[kwv.n] = nm;
            nvec_push(ps, &kwv, parse_expr(ps, true));
        } else {
            if (kwv.n)
                fail(ps, cur(ps)->line, "positional argument after keyword argument");
            nvec_push(ps, &pos, parse_expr(ps, true));
        }
    }
    advance(ps);
    n->items = pos.v;
    n->n_items = pos.n;
    n->kw_names = kwn;
    n->kw_vals = kwv.v;
    n->n_kw = kwv.n;
}

static dsq__jnode_t *parse_primary(pstate_t *ps)
{
    tok_t *t = cur(ps);
    dsq__jnode_t *n = NULL;
    enter(ps);
    if (t->type == T_NAME) {
        n = mk(ps, DSQ__N_LIT, t->line);
        if (is_name(t, "true") || is_name(t, "True")) {
            n->lit.t = DSQ__JV_BOOL;
            n->lit.u.b = true;
        } else if (is_name(t, "false") || is_name(t, "False")) {
            n->lit.t = DSQ__JV_BOOL;
        } else if (is_name(t, "none") || is_name(t, "None")) {
            n->lit.t = DSQ__JV_NONE;
        } else {
            n->kind = DSQ__N_NAME;
            n->name = (dsq__jstr_t){t->p, t->n};
        }
        advance(ps);
    } else if (t->type == T_STRING) {
        n = mk(ps, DSQ__N_LIT, t->line);
        n->lit.t = DSQ__JV_STR;
        /* adjacent string literals concatenate */
        size_t total = 0, k = ps->pos;
        while (ps->toks[k].type == T_STRING)
            total += ps->toks[k++].n;
        char *buf = palloc(ps, total + 1);
        size_t o = 0;
        while (cur(ps)->type == T_STRING) {
            memcpy(buf + o, cur(ps)->p, cur(ps)->n);
            o += cur(ps)->n;
            advance(ps);
        }
        n->lit.u.s.p = buf;
        n->lit.u.s.n = o;
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        n = mk(ps, DSQ__N_LIT, t->line);
        if (t->type == T_INT) {
            n->lit.t = DSQ__JV_INT;
            n->lit.u.i = t->i;
        } else {
            n->lit.t = DSQ__JV_FLOAT;
            n->lit.u.f = t->f;
        }
        advance(ps);
    } else if (is_op(t, '(')) {
        advance(ps);
        if (is_op(cur(ps), ')')) {
            advance(ps);
            n = mk(ps, DSQ__N_LIST, t->line);
            n->op = 1;
        } else {
            n = parse_tuple(ps, true);
            expect_op(ps, ')', "')'");
        }
    } else if (is_op(t, '[')) {
        advance(ps);
        nvec_t v = {0};
        while (!is_op(cur(ps), ']')) {
            if (v.n)
                expect_op(ps, ',', "',' or ']'");
            if (is_op(cur(ps), ']'))
                break;
            nvec_push(ps, &v, parse_expr(ps, true));
        }
        advance(ps);
        n = mk(ps, DSQ__N_LIST, t->line);
        n->items = v.v;
        n->n_items = v.n;
    } else if (is_op(t, '{')) {
        advance(ps);
        nvec_t v = {0};
        while (!is_op(cur(ps), '}')) {
            if (v.n)
                expect_op(ps, ',', "',' or '}'");
            if (is_op(cur(ps), '}'))
                break;
            nvec_push(ps, &v, parse_expr(ps, true));
            expect_op(ps, ':', "':'");
            nvec_push(ps, &v, parse_expr(ps, true));
        }
        advance(ps);
        n = mk(ps, DSQ__N_DICT, t->line);
        n->items = v.v;
        n->n_items = v.n;
    } else {
        unexpected(ps, "an expression");
    }
    ps->depth--;
    return n;
}

static dsq__jnode_t *parse_subscript(pstate_t *ps, dsq__jnode_t *obj)
{
    int line = cur(ps)->line;
    dsq__jnode_t *parts[3] = {NULL, NULL, NULL};
    int np = 0;
    bool is_slice = false;
    for (;;) {
        if (is_op(cur(ps), ':')) {
            if (np >= 2)
                fail(ps, line, "too many ':' in slice");
            is_slice = true;
            advance(ps);
            np++;
            continue;
        }
        if (is_op(cur(ps), ']'))
            break;
        if (parts[np])
            unexpected(ps, "']'");
        parts[np] = parse_expr(ps, true);
    }
    advance(ps);
    dsq__jnode_t *n;
    if (is_slice) {
        n = mk(ps, DSQ__N_SLICE, line);
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
    } else {
        if (!parts[0])
            fail(ps, line, "empty subscript");
        n = mk(ps, DSQ__N_GETITEM, line);
        n->b = parts[0];
    }
    n->a = obj;
    return n;
}

static dsq__jnode_t *parse_postfix(pstate_t *ps, dsq__jnode_t *n)
{
    for (;;) {
        tok_t *t = cur(ps);
        if (is_op(t, '.')) {
            advance(ps);
            tok_t *a = cur(ps);
            if (a->type == T_NAME) {
                dsq__jnode_t *g = mk(ps, DSQ__N_GETATTR, a->line);
                g->a = n;
                g->attr = (dsq__jstr_t){a->p, a->n};
                advance(ps);
                n = g;
            } else if (a->type == T_INT) {
                dsq__jnode_t *g = mk(ps, DSQ__N_GETITEM, a->line);
                g->a = n;
                g->b = mk(ps, DSQ__N_LIT, a->line);
                g->b->lit.t = DSQ__JV_INT;
                g->b->lit.u.i = a->i;
                advance(ps);
                n = g;
            } else {
                unexpected(ps, "an attribute name");
            }
        } else if (is_op(t, '[')) {
            advance(ps);
            enter(ps);
            n = parse_subscript(ps, n);
            ps->depth--;
        } else if (is_op(t, '(')) {
            dsq__jnode_t *c = mk(ps, DSQ__N_CALL, t->line);
            c->a = n;
            enter(ps);
            parse_args(ps, c);
            ps->depth--;
            n = c;
        } else {
            return n;
        }
    }
}

static dsq__jnode_t *parse_filter_expr(pstate_t *ps, dsq__jnode_t *n)
{
    for (;;) {
        tok_t *t = cur(ps);
        if (is_op(t, '|')) {
            advance(ps);
            tok_t *nt = cur(ps);
            dsq__jstr_t nm = expect_name(ps);
            if (is_op(cur(ps), '.'))
                fail(ps, nt->line, "unsupported construct: dotted filter name");
            if (!dsq__jinja_is_filter(nm.p, nm.n))
                fail(ps, nt->line, "unsupported filter '%.*s'", (int)nm.n, nm.p);
            dsq__jnode_t *f = mk(ps, DSQ__N_FILTER, nt->line);
            f->a = n;
            f->name = nm;
            if (is_op(cur(ps), '(')) {
                enter(ps);
                parse_args(ps, f);
                ps->depth--;
            }
            n = f;
        } else if (is_name(t, "is")) {
            advance(ps);
            dsq__jnode_t *f = mk(ps, DSQ__N_TEST, t->line);
            if (is_name(cur(ps), "not")) {
                f->op = 1;
                advance(ps);
            }
            tok_t *nt = cur(ps);
            dsq__jstr_t nm;
            if (nt->type == T_NAME) {
                nm = expect_name(ps);
            } else if (nt->type == T_OP && (nt->op == DSQ__OP_EQ ||
                       nt->op == DSQ__OP_NE || nt->op == '<' || nt->op == '>' ||
                       nt->op == DSQ__OP_LE || nt->op == DSQ__OP_GE)) {
                static const char *sym[] = {"==", "!=", "<", ">", "<=", ">="};
                int k = nt->op == DSQ__OP_EQ ? 0 : nt->op == DSQ__OP_NE ? 1 :
                        nt->op == '<' ? 2 : nt->op == '>' ? 3 :
                        nt->op == DSQ__OP_LE ? 4 : 5;
                nm = (dsq__jstr_t){sym[k], strlen(sym[k])};
                advance(ps);
            } else {
                unexpected(ps, "a test name");
            }
            if (!dsq__jinja_is_test(nm.p, nm.n))
                fail(ps, nt->line, "unsupported test '%.*s'", (int)nm.n, nm.p);
            f->a = n;
            f->name = nm;
            tok_t *c = cur(ps);
            if (is_op(c, '(')) {
                enter(ps);
                parse_args(ps, f);
                ps->depth--;
            } else if ((c->type == T_NAME || c->type == T_STRING ||
                        c->type == T_INT || c->type == T_FLOAT ||
                        is_op(c, '[') || is_op(c, '{')) &&
                       !is_name(c, "else") && !is_name(c, "or") &&
                       !is_name(c, "and")) {
                if (is_name(c, "is"))
                    fail(ps, c->line, "cannot chain multiple tests with 'is'");
                enter(ps);
                dsq__jnode_t *arg = parse_postfix(ps, parse_primary(ps));
                ps->depth--;
                f->items = palloc(ps, sizeof(*f->items));
                f->items[0] = arg;
                f->n_items = 1;
            }
            n = f;
        } else if (is_op(t, '(')) {
            dsq__jnode_t *c = mk(ps, DSQ__N_CALL, t->line);
            c->a = n;
            enter(ps);
            parse_args(ps, c);
            ps->depth--;
            n = c;
        } else {
            return n;
        }
    }
}

static dsq__jnode_t *parse_unary(pstate_t *ps, bool with_filter)
{
    tok_t *t = cur(ps);
    dsq__jnode_t *n;
    enter(ps);
    if (is_op(t, '-') || is_op(t, '+')) {
        advance(ps);
        n = mk(ps, DSQ__N_UNARY, t->line);
        n->op = t->op;
        n->a = parse_unary(ps, false);
    } else {
        n = parse_primary(ps);
    }
    n = parse_postfix(ps, n);
    if (with_filter)
        n = parse_filter_expr(ps, n);
    ps->depth--;
    return n;
}

static dsq__jnode_t *binop(pstate_t *ps, int op, int line, dsq__jnode_t *a,
                           dsq__jnode_t *b)
{
    dsq__jnode_t *n = mk(ps, DSQ__N_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static dsq__jnode_t *parse_pow(pstate_t *ps)
{
    dsq__jnode_t *n = parse_unary(ps, true);
    while (is_op(cur(ps), DSQ__OP_POW)) {
        int line = cur(ps)->line;
        advance(ps);
        n = binop(ps, DSQ__OP_POW, line, n, parse_unary(ps, true));
    }
    return n;
}

static dsq__jnode_t *parse_math2(pstate_t *ps)
{
    dsq__jnode_t *n = parse_pow(ps);
    for (;;) {
        tok_t *t = cur(ps);
        if (!(is_op(t, '*') || is_op(t, '/') || is_op(t, DSQ__OP_FLOORDIV) ||
              is_op(t, '%')))
            return n;
        advance(ps);
        n = binop(ps, t->op, t->line, n, parse_pow(ps));
    }
}

static dsq__jnode_t *parse_concat(pstate_t *ps)
{
    dsq__jnode_t *n = parse_math2(ps);
    while (is_op(cur(ps), '~')) {
        int line = cur(ps)->line;
        advance(ps);
        n = binop(ps, '~', line, n, parse_math2(ps));
    }
    return n;
}

static dsq__jnode_t *parse_math1(pstate_t *ps)
{
    dsq__jnode_t *n = parse_concat(ps);
    for (;;) {
        tok_t *t = cur(ps);
        if (!(is_op(t, '+') || is_op(t, '-')))
            return n;
        advance(ps);
        n = binop(ps, t->op, t->line, n, parse_concat(ps));
    }
}

static dsq__jnode_t *parse_compare(pstate_t *ps)
{
    int line = cur(ps)->line;
    dsq__jnode_t *first = parse_math1(ps);
    nvec_t v = {0};
    int *ops = NULL, cap = 0;
    for (;;) {
        tok_t *t = cur(ps);
        int op = 0;
        if (t->type == T_OP && (t->op == DSQ__OP_EQ || t->op == DSQ__OP_NE ||
                                t->op == '<' || t->op == '>' ||
                                t->op == DSQ__OP_LE || t->op == DSQ__OP_GE)) {
            op = t->op == '<' ? DSQ__OP_LT : t->op == '>' ? DSQ__OP_GT : t->op;
            advance(ps);
        } else if (is_name(t, "in")) {
            op = DSQ__OP_IN;
            advance(ps);
        } else if (is_name(t, "not") && is_name(peek(ps, 1), "in")) {
            op = DSQ__OP_NOTIN;
            advance(ps);
            advance(ps);
        } else {
            break;
        }
        if (v.n == cap) {
            int nc = cap ? cap * 2 : 4;
            int *no = palloc(ps, (size_t)nc * sizeof(*no));
            if (v.n)
                memcpy(no, ops, (size_t)v.n * sizeof(*no));
            ops = no;
            cap = nc;
        }
        ops[v.n] = op;
        nvec_push(ps, &v, parse_math1(ps));
    }
    if (!v.n)
        return first;
    dsq__jnode_t *n = mk(ps, DSQ__N_CMP, line);
    n->a = first;
    n->items = v.v;
    n->n_items = v.n;
    n->ops = ops;
    return n;
}

static dsq__jnode_t *parse_not(pstate_t *ps)
{
    tok_t *t = cur(ps);
    if (is_name(t, "not")) {
        advance(ps);
        enter(ps);
        dsq__jnode_t *n = mk(ps, DSQ__N_UNARY, t->line);
        n->op = DSQ__OP_NOT;
        n->a = parse_not(ps);
        ps->depth--;
        return n;
    }
    return parse_compare(ps);
}

static dsq__jnode_t *parse_and(pstate_t *ps)
{
    dsq__jnode_t *n = parse_not(ps);
    while (is_name(cur(ps), "and")) {
        dsq__jnode_t *x = mk(ps, DSQ__N_AND, cur(ps)->line);
        advance(ps);
        x->a = n;
        x->b = parse_not(ps);
        n = x;
    }
    return n;
}

static dsq__jnode_t *parse_or(pstate_t *ps)
{
    dsq__jnode_t *n = parse_and(ps);
    while (is_name(cur(ps), "or")) {
        dsq__jnode_t *x = mk(ps, DSQ__N_OR, cur(ps)->line);
        advance(ps);
        x->a = n;
        x->b = parse_and(ps);
        n = x;
    }
    return n;
}

static dsq__jnode_t *parse_expr(pstate_t *ps, bool with_cond)
{
    enter(ps);
    dsq__jnode_t *n = parse_or(ps);
    while (with_cond && is_name(cur(ps), "if")) {
        dsq__jnode_t *c = mk(ps, DSQ__N_COND, cur(ps)->line);
        advance(ps);
        c->a = n;
        c->b = parse_or(ps);
        if (is_name(cur(ps), "else")) {
            advance(ps);
            c->c = parse_expr(ps, true);
        }
        n = c;
    }
    ps->depth--;
    return n;
}

/* ---- statements ---- */
static dsq__jnode_t *parse_body(pstate_t *ps, const char *const *ends);

static void expect_block_end(pstate_t *ps)
{
    if (cur(ps)->type != T_BLOCK_END)
        unexpected(ps, "end of statement block '%}'");
    advance(ps);
}

/* After parse_body stopped at an end name: consume "{% endX %}" */
static void expect_end(pstate_t *ps, const char *name)
{
    if (!is_name(cur(ps), name))
        unexpected(ps, name);
    advance(ps);
    expect_block_end(ps);
}

static void parse_target_names(pstate_t *ps, dsq__jnode_t *n)
{
    dsq__jstr_t tmp[16];
    int k = 0;
    bool paren = is_op(cur(ps), '(');
    if (paren)
        advance(ps);
    for (;;) {
        if (k == 16)
            fail(ps, cur(ps)->line, "too many assignment targets");
        tmp[k++] = expect_name(ps);
        if (!is_op(cur(ps), ','))
            break;
        advance(ps);
        if (paren && is_op(cur(ps), ')'))
            break;
    }
    if (paren)
        expect_op(ps, ')', "')'");
    n->names = palloc(ps, (size_t)k * sizeof(*n->names));
    memcpy(n->names, tmp, (size_t)k * sizeof(*n->names));
    n->n_names = k;
}

static dsq__jnode_t *parse_statement(pstate_t *ps)
{
    tok_t *t = cur(ps);
    int line = t->line;
    dsq__jnode_t *n = NULL;
    if (t->type != T_NAME)
        unexpected(ps, "a statement name");
    enter(ps);
    if (is_name(t, "if")) {
        advance(ps);
        n = mk(ps, DSQ__S_IF, line);
        n->a = parse_tuple(ps, false);
        expect_block_end(ps);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        n->b = parse_body(ps, ends);
        dsq__jnode_t *tail = n;
        for (;;) {
            if (is_name(cur(ps), "elif")) {
                dsq__jnode_t *e = mk(ps, DSQ__S_IF, cur(ps)->line);
                advance(ps);
                e->a = parse_tuple(ps, false);
                expect_block_end(ps);
                e->b = parse_body(ps, ends);
                tail->c = e;
                tail = e;
            } else if (is_name(cur(ps), "else")) {
                advance(ps);
                expect_block_end(ps);
                static const char *const e2[] = {"endif", NULL};
                tail->c = parse_body(ps, e2);
                expect_end(ps, "endif");
                break;
            } else {
                expect_end(ps, "endif");
                break;
            }
        }
    } else if (is_name(t, "for")) {
        advance(ps);
        n = mk(ps, DSQ__S_FOR, line);
        parse_target_names(ps, n);
        if (!is_name(cur(ps), "in"))
            unexpected(ps, "'in'");
        advance(ps);
        n->a = parse_tuple(ps, false);
        if (is_name(cur(ps), "if")) {
            advance(ps);
            n->b = parse_expr(ps, true);
        }
        if (is_name(cur(ps), "recursive"))
            fail(ps, line, "unsupported construct: recursive for loop");
        expect_block_end(ps);
        static const char *const ends[] = {"else", "endfor", NULL};
        n->c = parse_body(ps, ends);
        if (is_name(cur(ps), "else")) {
            advance(ps);
            expect_block_end(ps);
            static const char *const e2[] = {"endfor", NULL};
            n->d = parse_body(ps, e2);
        }
        expect_end(ps, "endfor");
    } else if (is_name(t, "set")) {
        advance(ps);
        if (cur(ps)->type == T_NAME && is_op(peek(ps, 1), '.')) {
            n = mk(ps, DSQ__S_SETATTR, line);
            n->name = expect_name(ps);
            advance(ps);
            n->attr = expect_name(ps);
            expect_op(ps, '=', "'='");
            n->a = parse_tuple(ps, true);
            expect_block_end(ps);
        } else {
            n = mk(ps, DSQ__S_SET, line);
            parse_target_names(ps, n);
            if (is_op(cur(ps), '=')) {
                advance(ps);
                n->a = parse_tuple(ps, true);
                expect_block_end(ps);
            } else {
                if (n->n_names != 1)
                    fail(ps, line, "block set takes one name");
                if (is_op(cur(ps), '|'))
                    fail(ps, line, "unsupported construct: filtered block set");
                expect_block_end(ps);
                n->kind = DSQ__S_SETBLOCK;
                static const char *const ends[] = {"endset", NULL};
                n->c = parse_body(ps, ends);
                expect_end(ps, "endset");
            }
        }
    } else if (is_name(t, "macro")) {
        advance(ps);
        n = mk(ps, DSQ__S_MACRO, line);
        n->name = expect_name(ps);
        expect_op(ps, '(', "'('");
        dsq__jstr_t names[32];
        dsq__jnode_t *defs[32];
        int k = 0;
        while (!is_op(cur(ps), ')')) {
            if (k)
                expect_op(ps, ',', "',' or ')'");
            if (is_op(cur(ps), ')'))
                break;
            if (k == 32)
                fail(ps, line, "too many macro parameters");
            names[k] = expect_name(ps);
            defs[k] = NULL;
            if (is_op(cur(ps), '=')) {
                advance(ps);
                defs[k] = parse_expr(ps, true);
            }
            k++;
        }
        advance(ps);
        expect_block_end(ps);
        n->names = palloc(ps, (size_t)(k ? k : 1) * sizeof(*n->names));
        n->items = palloc(ps, (size_t)(k ? k : 1) * sizeof(*n->items));
        memcpy(n->names, names, (size_t)k * sizeof(*names));
        memcpy(n->items, defs, (size_t)k * sizeof(*defs));
        n->n_names = k;
        n->n_items = k;
        static const char *const ends[] = {"endmacro", NULL};
        n->c = parse_body(ps, ends);
        advance(ps);
        if (cur(ps)->type == T_NAME)
            advance(ps); /* {% endmacro name %} */
        expect_block_end(ps);
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        n = mk(ps, is_name(t, "break") ? DSQ__S_BREAK : DSQ__S_CONTINUE, line);
        advance(ps);
        expect_block_end(ps);
    } else if (is_name(t, "generation")) {
        /* transformers' {% generation %} marks assistant text for masks;
         * rendering just emits the body. */
        advance(ps);
        expect_block_end(ps);
        static const char *const ends[] = {"endgeneration", NULL};
        n = parse_body(ps, ends);
        expect_end(ps, "endgeneration");
    } else {
        fail(ps, line, "unsupported construct '%.*s' statement",
             (int)(t->n > 40 ? 40 : t->n), t->p);
    }
    ps->depth--;
    return n;
}

/* Parse statements until a block tag whose first name is in ends (left
 * current, at that name) or EOF (only allowed when ends is NULL). */
static dsq__jnode_t *parse_body(pstate_t *ps, const char *const *ends)
{
    int line = cur(ps)->line;
    nvec_t v = {0};
    for (;;) {
        tok_t *t = cur(ps);
        if (t->type == T_EOF) {
            if (ends) {
                char b[160];
                size_t o = 0;
                for (const char *const *e = ends; *e && o < sizeof(b) - 40; e++)
                    o += (size_t)snprintf(b + o, sizeof(b) - o, "%s'%s'",
                                          e == ends ? "" : " or ", *e);
                fail(ps, line, "block opened here is never closed (expected %s)", b);
            }
            break;
        }
        if (t->type == T_DATA) {
            dsq__jnode_t *x = mk(ps, DSQ__S_TEXT, t->line);
            x->name = (dsq__jstr_t){t->p, t->n};
            nvec_push(ps, &v, x);
            advance(ps);
        } else if (t->type == T_VAR_BEGIN) {
            advance(ps);
            dsq__jnode_t *x = mk(ps, DSQ__S_OUT, t->line);
            x->a = parse_tuple(ps, true);
            if (cur(ps)->type != T_VAR_END)
                unexpected(ps, "end of print statement '}}'");
            advance(ps);
            nvec_push(ps, &v, x);
        } else if (t->type == T_BLOCK_BEGIN) {
            advance(ps);
            tok_t *nm = cur(ps);
            if (ends && nm->type == T_NAME)
                for (const char *const *e = ends; *e; e++)
                    if (is_name(nm, *e))
                        goto done;
            if (nm->type == T_NAME && nm->n > 3 && memcmp(nm->p, "end", 3) == 0)
                fail(ps, nm->line, "unexpected '%.*s'", (int)(nm->n > 40 ? 40 : nm->n), nm->p);
            if (is_name(nm, "else") || is_name(nm, "elif"))
                fail(ps, nm->line, "unexpected '%.*s'", (int)nm->n, nm->p);
            nvec_push(ps, &v, parse_statement(ps));
        } else {
            unexpected(ps, "template data or a tag");
        }
    }
done:;
    dsq__jnode_t *b = mk(ps, DSQ__S_BODY, line);
    b->items = v.v;
    b->n_items = v.n;
    return b;
}

dsq__jnode_t *dsq__jinja_parse(dsq__arena_t *arena, const char *src,
                               size_t len, char *err, size_t err_len)
{
    pstate_t ps;
    memset(&ps, 0, sizeof(ps));
    ps.arena = arena;
    ps.err = err;
    ps.err_len = err_len;
    dsq__jnode_t *root = NULL;
    if (setjmp(ps.jb) == 0) {
        /* normalise \r\n and \r to \n; drop one trailing newline */
        char *s = palloc(&ps, len + 1);
        size_t o = 0;
        for (size_t i = 0; i < len; i++) {
            if (src[i] == '\r') {
                s[o++] = '\n';
                if (i + 1 < len && src[i + 1] == '\n')
                    i++;
            } else {
                s[o++] = src[i];
            }
        }
        if (o > 0 && s[o - 1] == '\n')
            o--;
        for (size_t i = 0; i < o; i++)
            if (s[i] == 0)
                fail(&ps, 1 + count_nl(s, i), "NUL byte in template");
        ps.src = s;
        ps.len = o;
        lex(&ps);
        root = parse_body(&ps, NULL);
    }
    return root;
}

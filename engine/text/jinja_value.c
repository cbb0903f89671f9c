/* Chat-template values: Python semantics for the evaluator.
 *
 * Owns: error exit and arena allocation of one render, the step counter,
 * byte buffers, lists/dicts, UTF-8 helpers, Python str()/repr() (floats in
 * shortest round-trip repr), truth, ==, ordering, attribute/item/slice
 * access with Jinja's undefined rules, iteration, len(), `in`, and
 * json.dumps as transformers' tojson calls it (ensure_ascii=False). Kept
 * apart from the evaluator so every Python-compatibility rule sits in one
 * place. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "chat_template_internal.h"
#include "engine/common/error.h"

typedef dsq__jv_t jv;
typedef dsq__jstr_t jstr;
/* ---- errors and allocation ---- */
_Noreturn void dsq__jfail(dsq__jrender_t *r, int code, int line, const char *fmt, ...)
{
    if (r->err && r->err_len) {
        int k = line > 0 ? snprintf(r->err, r->err_len, "template line %d: ", line)
                         : snprintf(r->err, r->err_len, "template: ");
        if (k >= 0 && (size_t)k < r->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + k, r->err_len - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    r->code = code;
    longjmp(r->jb, 1);
}

void *dsq__jalloc(dsq__jrender_t *r, size_t n)
{
    void *p = dsq__arena_alloc(&r->arena, n);
    if (!p)
        dsq__jfail(r, DSQ_ERANGE, 0, "render memory limit (%u bytes) exceeded",
              DSQ_CHAT_TEMPLATE_MAX_MEMORY_BYTES);
    return p;
}

void dsq__jtick(dsq__jrender_t *r, int line, int64_t n)
{
    r->steps += n;
    if (r->steps > DSQ_CHAT_TEMPLATE_MAX_STEPS)
        dsq__jfail(r, DSQ_ERANGE, line, "step limit (%d) exceeded",
              DSQ_CHAT_TEMPLATE_MAX_STEPS);
}

/* ---- string buffer ---- */
void dsq__jbuf_put(dsq__jrender_t *r, dsq__jbuf_t *b, const char *p, size_t n)
{
    if (n == 0)
        return;
    if (b->n + n > DSQ_CHAT_TEMPLATE_MAX_OUTPUT_BYTES)
        dsq__jfail(r, DSQ_ERANGE, 0, "output limit (%u bytes) exceeded",
              DSQ_CHAT_TEMPLATE_MAX_OUTPUT_BYTES);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        char *q = dsq__jalloc(r, cap);
        if (b->n)
            memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

/* ---- value constructors ---- */

jv dsq__jv_list(dsq__jrender_t *r, size_t cap)
{
    jv v = {.t = DSQ__JV_LIST};
    v.u.l = dsq__jalloc(r, sizeof(*v.u.l));
    if (cap) {
        v.u.l->v = dsq__jalloc(r, cap * sizeof(jv));
        v.u.l->cap = cap;
    }
    return v;
}
void dsq__jlist_push(dsq__jrender_t *r, dsq__jlist_t *l, jv x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = dsq__jalloc(r, cap * sizeof(*nv));
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}
jv dsq__jv_dict(dsq__jrender_t *r, uint8_t t)
{
    jv v = {.t = t};
    v.u.d = dsq__jalloc(r, sizeof(*v.u.d));
    return v;
}

const char *dsq__jv_type_name(const jv *v)
{
    switch (v->t) {
    case DSQ__JV_UNDEF: return "undefined";
    case DSQ__JV_NONE: return "NoneType";
    case DSQ__JV_BOOL: return "bool";
    case DSQ__JV_INT: return "int";
    case DSQ__JV_FLOAT: return "float";
    case DSQ__JV_STR: return "str";
    case DSQ__JV_LIST: return "list";
    case DSQ__JV_DICT: return "dict";
    case DSQ__JV_NS: return "Namespace";
    case DSQ__JV_MACRO: return "macro";
    default: return "builtin_function";
    }
}

_Noreturn void dsq__jfail_undef(dsq__jrender_t *r, int line, const jv *v)
{
    if (v->u.s.p)
        dsq__jfail(r, DSQ_EINVAL, line, "'%.*s' is undefined",
              (int)(v->u.s.n > 60 ? 60 : v->u.s.n), v->u.s.p);
    dsq__jfail(r, DSQ_EINVAL, line, "undefined value used");
}

/* ---- UTF-8 ---- */
static size_t u8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
}
/* decode one code point at p[i] (bounded by n); invalid bytes decode as
 * themselves, one byte each */
uint32_t dsq__u8_dec(const char *p, size_t n, size_t i, size_t *adv)
{
    const unsigned char *s = (const unsigned char *)p;
    size_t k = u8_len(s[i]);
    if (k == 1 || i + k > n) {
        *adv = 1;
        return s[i];
    }
    uint32_t cp = s[i] & (0x7F >> k);
    for (size_t j = 1; j < k; j++) {
        if ((s[i + j] & 0xC0) != 0x80) {
            *adv = 1;
            return s[i];
        }
        cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    *adv = k;
    return cp;
}
size_t dsq__u8_count(const char *p, size_t n)
{
    size_t k = 0, i = 0, a;
    while (i < n) {
        dsq__u8_dec(p, n, i, &a);
        i += a;
        k++;
    }
    return k;
}
/* byte offsets of each code point boundary: out[0..cnt] */
size_t *dsq__u8_offsets(dsq__jrender_t *r, const char *p, size_t n, size_t *cnt)
{
    size_t c = dsq__u8_count(p, n);
    size_t *o = dsq__jalloc(r, (c + 1) * sizeof(*o));
    size_t i = 0, k = 0, a;
    while (i < n) {
        o[k++] = i;
        dsq__u8_dec(p, n, i, &a);
        i += a;
    }
    o[k] = n;
    *cnt = c;
    return o;
}
bool dsq__py_space(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == ' ' || (c >= 0x1c && c <= 0x1f) ||
           c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- Python str() / repr() ---- */
static void fmt_float(double x, char *out, size_t out_n)
{
    if (isnan(x)) {
        snprintf(out, out_n, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(out, out_n, x < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    char dig[24];
    int nd = 0;
    while (*p && *p != 'e') {
        if (*p != '.' && nd < 23)
            dig[nd++] = *p;
        p++;
    }
    int e = atoi(p + 1);
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    dig[nd] = 0;
    char *o = out;
    size_t left = out_n;
#define PUT(...) do { int _k = snprintf(o, left, __VA_ARGS__); if (_k > 0 && (size_t)_k < left) { o += _k; left -= (size_t)_k; } } while (0)
    if (neg)
        PUT("-");
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++)
                PUT("%c", i < nd ? dig[i] : '0');
            PUT(".");
            if (nd > e + 1)
                PUT("%s", dig + e + 1);
            else
                PUT("0");
        } else {
            PUT("0.");
            for (int i = 0; i < -e - 1; i++)
                PUT("0");
            PUT("%s", dig);
        }
    } else {
        PUT("%c", dig[0]);
        if (nd > 1)
            PUT(".%s", dig + 1);
        PUT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
#undef PUT
}


static void put_repr_str(dsq__jrender_t *r, dsq__jbuf_t *b, const char *p, size_t n)
{
    char q = '\'';
    if (memchr(p, '\'', n) && !memchr(p, '"', n))
        q = '"';
    dsq__sb_ch(r, b, q);
    size_t i = 0, a;
    while (i < n) {
        uint32_t c = dsq__u8_dec(p, n, i, &a);
        char esc[12];
        if (c == (uint32_t)q || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            dsq__jbuf_put(r, b, esc, 2);
        } else if (c == '\n') {
            dsq__sb_str(r, b, "\\n");
        } else if (c == '\r') {
            dsq__sb_str(r, b, "\\r");
        } else if (c == '\t') {
            dsq__sb_str(r, b, "\\t");
        } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) {
            snprintf(esc, sizeof(esc), "\\x%02x", c);
            dsq__sb_str(r, b, esc);
        } else {
            dsq__jbuf_put(r, b, p + i, a);
        }
        i += a;
    }
    dsq__sb_ch(r, b, q);
}

static void put_repr(dsq__jrender_t *r, dsq__jbuf_t *b, const jv *v)
{
    if (v->t == DSQ__JV_STR)
        put_repr_str(r, b, v->u.s.p, v->u.s.n);
    else if (v->t == DSQ__JV_UNDEF)
        dsq__sb_str(r, b, "Undefined");
    else
        dsq__jput_str(r, b, v);
}

void dsq__jput_str(dsq__jrender_t *r, dsq__jbuf_t *b, const jv *v)
{
    char tmp[48];
    dsq__jtick(r, 0, 1);
    switch (v->t) {
    case DSQ__JV_UNDEF: break;
    case DSQ__JV_NONE: dsq__sb_str(r, b, "None"); break;
    case DSQ__JV_BOOL: dsq__sb_str(r, b, v->u.b ? "True" : "False"); break;
    case DSQ__JV_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)v->u.i);
        dsq__sb_str(r, b, tmp);
        break;
    case DSQ__JV_FLOAT:
        fmt_float(v->u.f, tmp, sizeof(tmp));
        dsq__sb_str(r, b, tmp);
        break;
    case DSQ__JV_STR: dsq__jbuf_put(r, b, v->u.s.p, v->u.s.n); break;
    case DSQ__JV_LIST:
    {
        uint8_t k = v->u.l->kind;
        bool tup = k == DSQ__JL_TUPLE;
        if (k == DSQ__JL_GEN) {
            dsq__sb_str(r, b, "<generator object>");
            break;
        }
        if (k >= DSQ__JL_ITEMS)
            dsq__sb_str(r, b, k == DSQ__JL_ITEMS ? "dict_items(" : k == DSQ__JL_KEYS ? "dict_keys(" : "dict_values(");
        dsq__sb_ch(r, b, tup ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                dsq__sb_str(r, b, ", ");
            put_repr(r, b, &v->u.l->v[i]);
        }
        if (tup && v->u.l->n == 1)
            dsq__sb_ch(r, b, ',');
        dsq__sb_ch(r, b, tup ? ')' : ']');
        if (k >= DSQ__JL_ITEMS)
            dsq__sb_ch(r, b, ')');
        break;
    }
    case DSQ__JV_DICT:
    case DSQ__JV_NS:
        if (v->t == DSQ__JV_NS)
            dsq__sb_str(r, b, "<Namespace ");
        dsq__sb_ch(r, b, '{');
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                dsq__sb_str(r, b, ", ");
            put_repr(r, b, &v->u.d->k[i]);
            dsq__sb_str(r, b, ": ");
            put_repr(r, b, &v->u.d->v[i]);
        }
        dsq__sb_ch(r, b, '}');
        if (v->t == DSQ__JV_NS)
            dsq__sb_ch(r, b, '>');
        break;
    case DSQ__JV_MACRO: dsq__sb_str(r, b, "<Macro>"); break;
    default: dsq__sb_str(r, b, "<built-in function>"); break;
    }
}

jv dsq__jto_str(dsq__jrender_t *r, const jv *v)
{
    if (v->t == DSQ__JV_STR)
        return *v;
    dsq__jbuf_t b = {0};
    dsq__jput_str(r, &b, v);
    return dsq__v_sb(&b);
}

/* ---- equality, ordering, truth ---- */
bool dsq__jv_truthy(const jv *v)
{
    switch (v->t) {
    case DSQ__JV_UNDEF: case DSQ__JV_NONE: return false;
    case DSQ__JV_BOOL: return v->u.b;
    case DSQ__JV_INT: return v->u.i != 0;
    case DSQ__JV_FLOAT: return v->u.f != 0.0;
    case DSQ__JV_STR: return v->u.s.n > 0;
    case DSQ__JV_LIST: return v->u.l->kind == DSQ__JL_GEN || v->u.l->n > 0;
    case DSQ__JV_DICT: return v->u.d->n > 0;
    default: return true;
    }
}

bool dsq__jv_eq(const jv *a, const jv *b)
{
    if (dsq__is_num(a) && dsq__is_num(b)) {
        if (dsq__is_intlike(a) && dsq__is_intlike(b))
            return dsq__int_of(a) == dsq__int_of(b);
        return dsq__num_f(a) == dsq__num_f(b);
    }
    if (a->t != b->t)
        return false;
    switch (a->t) {
    case DSQ__JV_UNDEF: case DSQ__JV_NONE: return true;
    case DSQ__JV_STR:
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case DSQ__JV_LIST:
        if (a->u.l->n != b->u.l->n)
            return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!dsq__jv_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return false;
        return true;
    case DSQ__JV_DICT:
        if (a->u.d->n != b->u.d->n)
            return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            bool found = false;
            for (size_t j = 0; j < b->u.d->n && !found; j++)
                if (dsq__jv_eq(&a->u.d->k[i], &b->u.d->k[j]))
                    found = dsq__jv_eq(&a->u.d->v[i], &b->u.d->v[j]);
            if (!found)
                return false;
        }
        return true;
    case DSQ__JV_NS: return a->u.d == b->u.d;
    case DSQ__JV_MACRO: return a->u.macro == b->u.macro;
    default: return a->u.i == b->u.i;
    }
}

int dsq__jv_cmp(dsq__jrender_t *r, int line, const jv *a, const jv *b)
{
    if (dsq__is_num(a) && dsq__is_num(b)) {
        if (dsq__is_intlike(a) && dsq__is_intlike(b))
            return dsq__int_of(a) < dsq__int_of(b) ? -1 : dsq__int_of(a) > dsq__int_of(b);
        double x = dsq__num_f(a), y = dsq__num_f(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == DSQ__JV_STR && b->t == DSQ__JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        if (c)
            return c < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    if (a->t == DSQ__JV_LIST && b->t == DSQ__JV_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (!dsq__jv_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return dsq__jv_cmp(r, line, &a->u.l->v[i], &b->u.l->v[i]);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    if (a->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, a);
    if (b->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, b);
    dsq__jfail(r, DSQ_EINVAL, line, "cannot order %s and %s", dsq__jv_type_name(a),
          dsq__jv_type_name(b));
}

/* ---- dicts ---- */
jv *dsq__jdict_find(const dsq__jdict_t *d, const jv *k)
{
    for (size_t i = 0; i < d->n; i++)
        if (dsq__jv_eq(&d->k[i], k))
            return &d->v[i];
    return NULL;
}
jv *dsq__jdict_get(const dsq__jdict_t *d, const char *p, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == DSQ__JV_STR && d->k[i].u.s.n == n &&
            memcmp(d->k[i].u.s.p, p, n) == 0)
            return &d->v[i];
    return NULL;
}
void dsq__jdict_set(dsq__jrender_t *r, dsq__jdict_t *d, jv k, jv v)
{
    jv *slot = dsq__jdict_find(d, &k);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *nk = dsq__jalloc(r, cap * sizeof(*nk));
        jv *nv = dsq__jalloc(r, cap * sizeof(*nv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(*nk));
            memcpy(nv, d->v, d->n * sizeof(*nv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

/* ---- access ---- */
jv dsq__jgetattr(dsq__jrender_t *r, int line, const jv *o, const char *p, size_t n)
{
    if (o->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, o);
    if (o->t == DSQ__JV_DICT || o->t == DSQ__JV_NS) {
        jv *x = dsq__jdict_get(o->u.d, p, n);
        if (x)
            return *x;
    }
    return dsq__v_undef(p, n);
}

static bool norm_index(int64_t i, size_t n, size_t *out)
{
    if (i < 0)
        i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n)
        return false;
    *out = (size_t)i;
    return true;
}

jv dsq__jgetitem(dsq__jrender_t *r, int line, const jv *o, const jv *k)
{
    size_t idx;
    if (o->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, o);
    if (o->t == DSQ__JV_DICT || o->t == DSQ__JV_NS) {
        jv *x = dsq__jdict_find(o->u.d, k);
        if (x)
            return *x;
    } else if (o->t == DSQ__JV_LIST && dsq__is_intlike(k)) {
        if (norm_index(dsq__int_of(k), o->u.l->n, &idx))
            return o->u.l->v[idx];
    } else if (o->t == DSQ__JV_STR && dsq__is_intlike(k)) {
        size_t cnt, *off = dsq__u8_offsets(r, o->u.s.p, o->u.s.n, &cnt);
        if (norm_index(dsq__int_of(k), cnt, &idx))
            return dsq__v_str(o->u.s.p + off[idx], off[idx + 1] - off[idx]);
    }
    if (k->t == DSQ__JV_STR)
        return dsq__v_undef(k->u.s.p, k->u.s.n);
    return dsq__v_undef(NULL, 0);
}

/* Python slice index normalisation */
static void slice_bounds(dsq__jrender_t *r, int line, size_t len, const jv *s0,
                         const jv *s1, const jv *s2, int64_t *start,
                         int64_t *stop, int64_t *step)
{
    int64_t L = (int64_t)len;
    *step = 1;
    if (s2 && s2->t != DSQ__JV_NONE) {
        if (!dsq__is_intlike(s2))
            dsq__jfail(r, DSQ_EINVAL, line, "slice step must be an integer");
        *step = dsq__int_of(s2);
        if (*step == 0)
            dsq__jfail(r, DSQ_EINVAL, line, "slice step cannot be zero");
    }
    const jv *bs[2] = {s0, s1};
    int64_t *out[2] = {start, stop};
    for (int k = 0; k < 2; k++) {
        const jv *b = bs[k];
        if (!b || b->t == DSQ__JV_NONE) {
            if (*step > 0)
                *out[k] = k == 0 ? 0 : L;
            else
                *out[k] = k == 0 ? L - 1 : -1;
            continue;
        }
        if (!dsq__is_intlike(b))
            dsq__jfail(r, DSQ_EINVAL, line, "slice indices must be integers");
        int64_t x = dsq__int_of(b);
        if (x < 0) {
            x += L;
            if (x < 0)
                x = *step < 0 ? -1 : 0;
        } else if (x >= L) {
            x = *step < 0 ? L - 1 : L;
        }
        *out[k] = x;
    }
}

jv dsq__jslice(dsq__jrender_t *r, int line, const jv *o, const jv *a, const jv *b,
                  const jv *c)
{
    int64_t st, sp, step;
    if (o->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, o);
    if (o->t == DSQ__JV_LIST) {
        slice_bounds(r, line, o->u.l->n, a, b, c, &st, &sp, &step);
        jv out = dsq__jv_list(r, 0);
        for (int64_t i = st; step > 0 ? i < sp : i > sp; i += step)
            dsq__jlist_push(r, out.u.l, o->u.l->v[i]);
        return out;
    }
    if (o->t == DSQ__JV_STR) {
        size_t cnt, *off = dsq__u8_offsets(r, o->u.s.p, o->u.s.n, &cnt);
        slice_bounds(r, line, cnt, a, b, c, &st, &sp, &step);
        if (step == 1)
            return st < sp ? dsq__v_str(o->u.s.p + off[st], off[sp] - off[st])
                           : dsq__v_str("", 0);
        dsq__jbuf_t sb = {0};
        for (int64_t i = st; step > 0 ? i < sp : i > sp; i += step)
            dsq__jbuf_put(r, &sb, o->u.s.p + off[i], off[i + 1] - off[i]);
        return dsq__v_sb(&sb);
    }
    return dsq__v_undef(NULL, 0);
}

/* iterate: list of items (strings by code point, dicts by key) */
dsq__jlist_t *dsq__jiter(dsq__jrender_t *r, int line, const jv *v)
{
    jv out;
    switch (v->t) {
    case DSQ__JV_UNDEF: return dsq__jv_list(r, 0).u.l;
    case DSQ__JV_LIST: return v->u.l;
    case DSQ__JV_DICT:
        out = dsq__jv_list(r, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            dsq__jlist_push(r, out.u.l, v->u.d->k[i]);
        return out.u.l;
    case DSQ__JV_STR: {
        out = dsq__jv_list(r, 0);
        size_t i = 0, a;
        while (i < v->u.s.n) {
            dsq__u8_dec(v->u.s.p, v->u.s.n, i, &a);
            dsq__jlist_push(r, out.u.l, dsq__v_str(v->u.s.p + i, a));
            i += a;
        }
        dsq__jtick(r, line, (int64_t)out.u.l->n);
        return out.u.l;
    }
    default:
        dsq__jfail(r, DSQ_EINVAL, line, "'%s' object is not iterable", dsq__jv_type_name(v));
    }
}

int64_t dsq__jlength(dsq__jrender_t *r, int line, const jv *v)
{
    switch (v->t) {
    case DSQ__JV_UNDEF: return 0;
    case DSQ__JV_STR: return (int64_t)dsq__u8_count(v->u.s.p, v->u.s.n);
    case DSQ__JV_LIST:
        if (v->u.l->kind == DSQ__JL_GEN)
            dsq__jfail(r, DSQ_EINVAL, line, "object of type 'generator' has no len()");
        return (int64_t)v->u.l->n;
    case DSQ__JV_DICT: case DSQ__JV_NS: return (int64_t)v->u.d->n;
    default:
        dsq__jfail(r, DSQ_EINVAL, line, "object of type '%s' has no len()", dsq__jv_type_name(v));
    }
}

bool dsq__jcontains(dsq__jrender_t *r, int line, const jv *hay, const jv *x)
{
    switch (hay->t) {
    case DSQ__JV_UNDEF: return false;
    case DSQ__JV_STR:
        if (x->t != DSQ__JV_STR)
            dsq__jfail(r, DSQ_EINVAL, line, "'in <string>' requires string as left operand, not %s", dsq__jv_type_name(x));
        if (x->u.s.n == 0)
            return true;
        return memmem(hay->u.s.p, hay->u.s.n, x->u.s.p, x->u.s.n) != NULL;
    case DSQ__JV_LIST:
        for (size_t i = 0; i < hay->u.l->n; i++)
            if (dsq__jv_eq(&hay->u.l->v[i], x))
                return true;
        return false;
    case DSQ__JV_DICT: case DSQ__JV_NS: return dsq__jdict_find(hay->u.d, x) != NULL;
    default:
        dsq__jfail(r, DSQ_EINVAL, line, "argument of type '%s' is not iterable", dsq__jv_type_name(hay));
    }
}

/* ---- JSON (Python json.dumps) ---- */
static void json_str(dsq__jrender_t *r, dsq__jbuf_t *b, const char *p, size_t n, bool ascii)
{
    dsq__sb_ch(r, b, '"');
    size_t i = 0, a;
    while (i < n) {
        uint32_t c = dsq__u8_dec(p, n, i, &a);
        char esc[16];
        switch (c) {
        case '"': dsq__sb_str(r, b, "\\\""); break;
        case '\\': dsq__sb_str(r, b, "\\\\"); break;
        case '\n': dsq__sb_str(r, b, "\\n"); break;
        case '\r': dsq__sb_str(r, b, "\\r"); break;
        case '\t': dsq__sb_str(r, b, "\\t"); break;
        case '\b': dsq__sb_str(r, b, "\\b"); break;
        case '\f': dsq__sb_str(r, b, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c >= 0x7F)) {
                if (c >= 0x10000) {
                    uint32_t v = c - 0x10000;
                    snprintf(esc, sizeof(esc), "\\u%04x\\u%04x",
                             0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    snprintf(esc, sizeof(esc), "\\u%04x", c);
                }
                dsq__sb_str(r, b, esc);
            } else {
                dsq__jbuf_put(r, b, p + i, a);
            }
        }
        i += a;
    }
    dsq__sb_ch(r, b, '"');
}

static void json_nl(dsq__jrender_t *r, dsq__jbuf_t *b, const dsq__jjson_opt_t *o, int level)
{
    dsq__sb_ch(r, b, '\n');
    for (int i = 0; i < level; i++)
        dsq__jbuf_put(r, b, o->indent, o->indent_n);
}

void dsq__jjson(dsq__jrender_t *r, int line, dsq__jbuf_t *b, const jv *v,
                     const dsq__jjson_opt_t *o, int level)
{
    char tmp[48];
    dsq__jtick(r, line, 1);
    if (level > 200)
        dsq__jfail(r, DSQ_ERANGE, line, "tojson nesting too deep");
    switch (v->t) {
    case DSQ__JV_NONE: dsq__sb_str(r, b, "null"); break;
    case DSQ__JV_BOOL: dsq__sb_str(r, b, v->u.b ? "true" : "false"); break;
    case DSQ__JV_INT: dsq__jput_str(r, b, v); break;
    case DSQ__JV_FLOAT:
        if (isnan(v->u.f))
            dsq__sb_str(r, b, "NaN");
        else if (isinf(v->u.f))
            dsq__sb_str(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            fmt_float(v->u.f, tmp, sizeof(tmp));
            dsq__sb_str(r, b, tmp);
        }
        break;
    case DSQ__JV_STR: json_str(r, b, v->u.s.p, v->u.s.n, o->ascii); break;
    case DSQ__JV_LIST:
        if (v->u.l->kind >= DSQ__JL_GEN)
            dsq__jfail(r, DSQ_EINVAL, line, "tojson: object of type %s is not JSON serializable",
                  v->u.l->kind == DSQ__JL_GEN ? "generator" : v->u.l->kind == DSQ__JL_ITEMS ? "dict_items" :
                  v->u.l->kind == DSQ__JL_KEYS ? "dict_keys" : "dict_values");
        if (v->u.l->n == 0) {
            dsq__sb_str(r, b, "[]");
            break;
        }
        dsq__sb_ch(r, b, '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                dsq__jbuf_put(r, b, o->item_sep.u.s.p, o->item_sep.u.s.n);
            if (o->indent)
                json_nl(r, b, o, level + 1);
            dsq__jjson(r, line, b, &v->u.l->v[i], o, level + 1);
        }
        if (o->indent)
            json_nl(r, b, o, level);
        dsq__sb_ch(r, b, ']');
        break;
    case DSQ__JV_DICT: {
        const dsq__jdict_t *d = v->u.d;
        if (d->n == 0) {
            dsq__sb_str(r, b, "{}");
            break;
        }
        /* keys become strings; order: insertion, or sorted */
        size_t *ord = dsq__jalloc(r, d->n * sizeof(*ord));
        jv *ks = dsq__jalloc(r, d->n * sizeof(*ks));
        for (size_t i = 0; i < d->n; i++) {
            ord[i] = i;
            const jv *k = &d->k[i];
            if (k->t == DSQ__JV_STR)
                ks[i] = *k;
            else if (k->t == DSQ__JV_BOOL)
                ks[i] = dsq__v_cstr(k->u.b ? "true" : "false");
            else if (k->t == DSQ__JV_NONE)
                ks[i] = dsq__v_cstr("null");
            else if (k->t == DSQ__JV_INT || k->t == DSQ__JV_FLOAT)
                ks[i] = dsq__jto_str(r, k);
            else
                dsq__jfail(r, DSQ_EINVAL, line, "tojson: keys must be str, int, float, bool or None, not %s", dsq__jv_type_name(k));
        }
        if (o->sort_keys)
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && dsq__jv_cmp(r, line, &ks[ord[j - 1]], &ks[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        dsq__sb_ch(r, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                dsq__jbuf_put(r, b, o->item_sep.u.s.p, o->item_sep.u.s.n);
            if (o->indent)
                json_nl(r, b, o, level + 1);
            json_str(r, b, ks[ord[i]].u.s.p, ks[ord[i]].u.s.n, o->ascii);
            dsq__jbuf_put(r, b, o->key_sep.u.s.p, o->key_sep.u.s.n);
            dsq__jjson(r, line, b, &d->v[ord[i]], o, level + 1);
        }
        if (o->indent)
            json_nl(r, b, o, level);
        dsq__sb_ch(r, b, '}');
        break;
    }
    case DSQ__JV_UNDEF:
        dsq__jfail(r, DSQ_EINVAL, line, "tojson: object of type Undefined is not JSON serializable");
    default:
        dsq__jfail(r, DSQ_EINVAL, line, "tojson: object of type %s is not JSON serializable", dsq__jv_type_name(v));
    }
}


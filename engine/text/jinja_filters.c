/* Chat-template filters, tests and methods.
 *
 * Owns: Jinja's filters (jinja2/filters.py semantics, with transformers'
 * tojson), tests (jinja2/tests.py), and the Python str and dict methods
 * templates call (startswith, split, strip, items, get, ...). The parser
 * accepts only the names listed in jinja.c; this file implements each of
 * them. map/select/reject/selectattr/rejectattr/unique/items/reverse return
 * generators as in Jinja, so tojson rejects them exactly as transformers
 * does. */
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
/* ---- arguments, string helpers, string and dict methods ---- */
bool dsq__jarg(const dsq__jargs_t *a, int idx, const char *name, jv *out)
{
    if (idx >= 0 && idx < a->n_pos) {
        *out = a->pos[idx];
        return true;
    }
    for (int i = 0; i < a->n_kw; i++)
        if (dsq__jstr_is(a->kw_names[i], name)) {
            *out = a->kw[i];
            return true;
        }
    return false;
}


jv dsq__jneed_str(dsq__jrender_t *r, int line, const jv *v, const char *what)
{
    if (v->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, v);
    if (v->t != DSQ__JV_STR)
        dsq__jfail(r, DSQ_EINVAL, line, "%s: expected a string, got %s", what, dsq__jv_type_name(v));
    return *v;
}

int64_t dsq__jneed_int(dsq__jrender_t *r, int line, const jv *v, const char *what)
{
    if (!dsq__is_intlike(v))
        dsq__jfail(r, DSQ_EINVAL, line, "%s: expected an integer, got %s", what, dsq__jv_type_name(v));
    return dsq__int_of(v);
}

/* strip code points in chars (or Python whitespace when chars is NULL) */
static jv strip_v(const jv *s, const jv *chars, bool left, bool right)
{
    const char *p = s->u.s.p;
    size_t st = 0, en = s->u.s.n, a;
    while (left && st < en) {
        uint32_t c = dsq__u8_dec(p, en, st, &a);
        bool hit;
        if (chars) {
            hit = false;
            size_t j = 0, b;
            while (j < chars->u.s.n && !hit) {
                hit = dsq__u8_dec(chars->u.s.p, chars->u.s.n, j, &b) == c;
                j += b;
            }
        } else {
            hit = dsq__py_space(c);
        }
        if (!hit)
            break;
        st += a;
    }
    while (right && en > st) {
        size_t k = en - 1;
        while (k > st && (((unsigned char)p[k]) & 0xC0) == 0x80)
            k--;
        uint32_t c = dsq__u8_dec(p, en, k, &a);
        if (k + a != en) { /* invalid tail byte: treat as one unit */
            k = en - 1;
            c = (unsigned char)p[k];
        }
        bool hit;
        if (chars) {
            hit = false;
            size_t j = 0, b;
            while (j < chars->u.s.n && !hit) {
                hit = dsq__u8_dec(chars->u.s.p, chars->u.s.n, j, &b) == c;
                j += b;
            }
        } else {
            hit = dsq__py_space(c);
        }
        if (!hit)
            break;
        en = k;
    }
    return dsq__v_str(p + st, en - st);
}

/* Python str.split / rsplit */
static jv split_v(dsq__jrender_t *r, int line, const jv *s, const jv *sep,
                  int64_t maxsplit, bool from_right)
{
    jv out = dsq__jv_list(r, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!sep || sep->t == DSQ__JV_NONE) {
        /* runs of whitespace; leading/trailing ignored */
        size_t *starts = dsq__jalloc(r, (n + 1) * sizeof(size_t));
        size_t *ends = dsq__jalloc(r, (n + 1) * sizeof(size_t));
        size_t nw = 0, i = 0, a;
        while (i < n) {
            while (i < n && dsq__py_space(dsq__u8_dec(p, n, i, &a)))
                i += a;
            if (i >= n)
                break;
            starts[nw] = i;
            while (i < n && !dsq__py_space(dsq__u8_dec(p, n, i, &a)))
                i += a;
            ends[nw++] = i;
        }
        if (maxsplit < 0 || (size_t)maxsplit >= nw || nw == 0) {
            for (size_t k = 0; k < nw; k++)
                dsq__jlist_push(r, out.u.l, dsq__v_str(p + starts[k], ends[k] - starts[k]));
        } else if (!from_right) {
            for (size_t k = 0; k < (size_t)maxsplit; k++)
                dsq__jlist_push(r, out.u.l, dsq__v_str(p + starts[k], ends[k] - starts[k]));
            jv rest = dsq__v_str(p + starts[maxsplit], n - starts[maxsplit]);
            dsq__jlist_push(r, out.u.l, strip_v(&rest, NULL, false, true));
        } else {
            size_t first = nw - (size_t)maxsplit;
            jv head = dsq__v_str(p, ends[first - 1]);
            dsq__jlist_push(r, out.u.l, strip_v(&head, NULL, true, false));
            for (size_t k = first; k < nw; k++)
                dsq__jlist_push(r, out.u.l, dsq__v_str(p + starts[k], ends[k] - starts[k]));
        }
        dsq__jtick(r, line, (int64_t)out.u.l->n);
        return out;
    }
    jv sp = dsq__jneed_str(r, line, sep, "split");
    if (sp.u.s.n == 0)
        dsq__jfail(r, DSQ_EINVAL, line, "split: empty separator");
    size_t m = sp.u.s.n;
    if (!from_right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *q = (maxsplit < 0 || k < maxsplit)
                                ? memmem(p + i, n - i, sp.u.s.p, m) : NULL;
            if (!q) {
                dsq__jlist_push(r, out.u.l, dsq__v_str(p + i, n - i));
                break;
            }
            dsq__jlist_push(r, out.u.l, dsq__v_str(p + i, (size_t)(q - (p + i))));
            i = (size_t)(q - p) + m;
            k++;
        }
    } else {
        /* collect from the right, then reverse */
        size_t e = n;
        int64_t k = 0;
        jv tmp = dsq__jv_list(r, 0);
        for (;;) {
            const char *q = NULL;
            if ((maxsplit < 0 || k < maxsplit) && e >= m)
                for (size_t j = e - m + 1; j-- > 0;)
                    if (memcmp(p + j, sp.u.s.p, m) == 0) {
                        q = p + j;
                        break;
                    }
            if (!q) {
                dsq__jlist_push(r, tmp.u.l, dsq__v_str(p, e));
                break;
            }
            dsq__jlist_push(r, tmp.u.l, dsq__v_str(q + m, e - (size_t)(q - p) - m));
            e = (size_t)(q - p);
            k++;
        }
        for (size_t j = tmp.u.l->n; j-- > 0;)
            dsq__jlist_push(r, out.u.l, tmp.u.l->v[j]);
    }
    dsq__jtick(r, line, (int64_t)out.u.l->n);
    return out;
}

static jv replace_v(dsq__jrender_t *r, int line, const jv *s, const jv *old,
                    const jv *nw, int64_t count)
{
    jv o = dsq__jneed_str(r, line, old, "replace"), w = dsq__jneed_str(r, line, nw, "replace");
    dsq__jbuf_t b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int64_t k = 0;
    if (o.u.s.n == 0) {
        /* Python inserts new between every code point and at both ends */
        size_t a;
        while (count < 0 || k < count) {
            dsq__jbuf_put(r, &b, w.u.s.p, w.u.s.n);
            k++;
            if (i >= n)
                break;
            dsq__u8_dec(p, n, i, &a);
            dsq__jbuf_put(r, &b, p + i, a);
            i += a;
        }
        dsq__jbuf_put(r, &b, p + i, n - i);
        return dsq__v_sb(&b);
    }
    while (count < 0 || k < count) {
        const char *q = memmem(p + i, n - i, o.u.s.p, o.u.s.n);
        if (!q)
            break;
        dsq__jbuf_put(r, &b, p + i, (size_t)(q - (p + i)));
        dsq__jbuf_put(r, &b, w.u.s.p, w.u.s.n);
        i = (size_t)(q - p) + o.u.s.n;
        k++;
    }
    dsq__jbuf_put(r, &b, p + i, n - i);
    return dsq__v_sb(&b);
}

static char a_lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c; }
static char a_upper(char c) { return c >= 'a' && c <= 'z' ? (char)(c - 32) : c; }
static bool a_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* mode: 'l' lower, 'u' upper, 't' str.title, 'c' capitalize, 'T' Jinja
 * title filter (words start after whitespace, '-', '(', '{', '[', '<') */
static jv case_v(dsq__jrender_t *r, const jv *s, char mode)
{
    char *q = dsq__jalloc(r, s->u.s.n + 1);
    bool prev_cased = false;
    for (size_t i = 0; i < s->u.s.n; i++) {
        char c = s->u.s.p[i];
        switch (mode) {
        case 'l': q[i] = a_lower(c); break;
        case 'u': q[i] = a_upper(c); break;
        case 'c': q[i] = i == 0 ? a_upper(c) : a_lower(c); break;
        case 't':
            q[i] = prev_cased ? a_lower(c) : a_upper(c);
            prev_cased = a_alpha(c);
            break;
        default: {
            bool start = i == 0 || strchr(" \t\n\r\v\f-({[<", s->u.s.p[i - 1]) != NULL;
            bool is_sep = strchr(" \t\n\r\v\f-({[<", c) != NULL;
            q[i] = is_sep ? c : start ? a_upper(c) : a_lower(c);
        }
        }
    }
    return dsq__v_str(q, s->u.s.n);
}

static jv join_v(dsq__jrender_t *r, int line, const jv *seq, const jv *sep,
                 const jv *attr);
static jv attr_path(dsq__jrender_t *r, int line, const jv *o, const jv *attr);

jv dsq__jstr_method(dsq__jrender_t *r, int line, const jv *s, jstr m, dsq__jargs_t *a)
{
    jv x, y, z;
    if (dsq__jstr_is(m, "startswith") || dsq__jstr_is(m, "endswith")) {
        bool ends = m.p[0] == 'e';
        if (!dsq__jarg(a, 0, "prefix", &x))
            dsq__jfail(r, DSQ_EINVAL, line, "%.*s needs an argument", (int)m.n, m.p);
        const jv *cands = &x;
        size_t nc = 1;
        if (x.t == DSQ__JV_LIST) {
            cands = x.u.l->v;
            nc = x.u.l->n;
        }
        for (size_t i = 0; i < nc; i++) {
            jv c = dsq__jneed_str(r, line, &cands[i], "startswith/endswith");
            if (c.u.s.n <= s->u.s.n &&
                memcmp(s->u.s.p + (ends ? s->u.s.n - c.u.s.n : 0), c.u.s.p, c.u.s.n) == 0)
                return dsq__v_bool(true);
        }
        return dsq__v_bool(false);
    }
    if (dsq__jstr_is(m, "strip") || dsq__jstr_is(m, "lstrip") || dsq__jstr_is(m, "rstrip")) {
        bool has = dsq__jarg(a, 0, "chars", &x) && x.t != DSQ__JV_NONE;
        if (has)
            dsq__jneed_str(r, line, &x, "strip");
        return strip_v(s, has ? &x : NULL, m.p[0] != 'r', m.p[0] != 'l');
    }
    if (dsq__jstr_is(m, "split") || dsq__jstr_is(m, "rsplit")) {
        bool has = dsq__jarg(a, 0, "sep", &x);
        int64_t ms = -1;
        if (dsq__jarg(a, 1, "maxsplit", &y))
            ms = dsq__jneed_int(r, line, &y, "split");
        return split_v(r, line, s, has ? &x : NULL, ms, m.p[0] == 'r');
    }
    if (dsq__jstr_is(m, "replace")) {
        if (!dsq__jarg(a, 0, "old", &x) || !dsq__jarg(a, 1, "new", &y))
            dsq__jfail(r, DSQ_EINVAL, line, "replace needs two arguments");
        int64_t cnt = -1;
        if (dsq__jarg(a, 2, "count", &z))
            cnt = dsq__jneed_int(r, line, &z, "replace");
        return replace_v(r, line, s, &x, &y, cnt);
    }
    if (dsq__jstr_is(m, "upper")) return case_v(r, s, 'u');
    if (dsq__jstr_is(m, "lower")) return case_v(r, s, 'l');
    if (dsq__jstr_is(m, "title")) return case_v(r, s, 't');
    if (dsq__jstr_is(m, "capitalize")) return case_v(r, s, 'c');
    if (dsq__jstr_is(m, "find") || dsq__jstr_is(m, "count")) {
        if (!dsq__jarg(a, 0, "sub", &x))
            dsq__jfail(r, DSQ_EINVAL, line, "%.*s needs an argument", (int)m.n, m.p);
        jv sub = dsq__jneed_str(r, line, &x, "find");
        if (m.p[0] == 'f') {
            const char *q = sub.u.s.n ? memmem(s->u.s.p, s->u.s.n, sub.u.s.p, sub.u.s.n)
                                      : s->u.s.p;
            return dsq__v_int(q ? (int64_t)dsq__u8_count(s->u.s.p, (size_t)(q - s->u.s.p)) : -1);
        }
        if (sub.u.s.n == 0)
            return dsq__v_int((int64_t)dsq__u8_count(s->u.s.p, s->u.s.n) + 1);
        int64_t k = 0;
        size_t i = 0;
        const char *q;
        while ((q = memmem(s->u.s.p + i, s->u.s.n - i, sub.u.s.p, sub.u.s.n))) {
            k++;
            i = (size_t)(q - s->u.s.p) + sub.u.s.n;
        }
        return dsq__v_int(k);
    }
    if (dsq__jstr_is(m, "join")) {
        if (!dsq__jarg(a, 0, "iterable", &x))
            dsq__jfail(r, DSQ_EINVAL, line, "join needs an argument");
        dsq__jlist_t *l = dsq__jiter(r, line, &x);
        for (size_t i = 0; i < l->n; i++)
            dsq__jneed_str(r, line, &l->v[i], "join");
        return join_v(r, line, &x, s, NULL);
    }
    dsq__jfail(r, DSQ_EINVAL, line, "unsupported string method '%.*s'",
          (int)(m.n > 40 ? 40 : m.n), m.p);
}

jv dsq__jdict_method(dsq__jrender_t *r, int line, const jv *d, jstr m, dsq__jargs_t *a,
                      bool *handled)
{
    jv x, y;
    *handled = true;
    if (dsq__jstr_is(m, "items") || dsq__jstr_is(m, "keys") || dsq__jstr_is(m, "values")) {
        jv out = dsq__jv_list(r, d->u.d->n);
        for (size_t i = 0; i < d->u.d->n; i++) {
            if (m.p[0] == 'i') {
                jv pair = dsq__jv_list(r, 2);
                pair.u.l->kind = DSQ__JL_TUPLE;
                dsq__jlist_push(r, pair.u.l, d->u.d->k[i]);
                dsq__jlist_push(r, pair.u.l, d->u.d->v[i]);
                dsq__jlist_push(r, out.u.l, pair);
            } else {
                dsq__jlist_push(r, out.u.l, m.p[0] == 'k' ? d->u.d->k[i] : d->u.d->v[i]);
            }
        }
        out.u.l->kind = m.p[0] == 'i' ? DSQ__JL_ITEMS : m.p[0] == 'k' ? DSQ__JL_KEYS : DSQ__JL_VALUES;
        dsq__jtick(r, line, (int64_t)d->u.d->n);
        return out;
    }
    if (dsq__jstr_is(m, "get")) {
        if (!dsq__jarg(a, 0, "key", &x))
            dsq__jfail(r, DSQ_EINVAL, line, "get needs an argument");
        jv *v = dsq__jdict_find(d->u.d, &x);
        if (v)
            return *v;
        return dsq__jarg(a, 1, "default", &y) ? y : dsq__v_none();
    }
    *handled = false;
    return dsq__v_none();
}

/* ---- filters and tests ---- */
static jv attr_path(dsq__jrender_t *r, int line, const jv *o, const jv *attr)
{
    /* Jinja make_attrgetter: "a.b.0" walks attributes / integer indexes */
    if (attr->t != DSQ__JV_STR)
        return dsq__jgetitem(r, line, o, attr);
    jv cur = *o;
    const char *p = attr->u.s.p, *e = p + attr->u.s.n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        if (!dot)
            dot = e;
        jv key = dsq__v_str(p, (size_t)(dot - p));
        bool digits = key.u.s.n > 0 && key.u.s.n < 18;
        for (size_t i = 0; i < key.u.s.n && digits; i++)
            digits = key.u.s.p[i] >= '0' && key.u.s.p[i] <= '9';
        if (digits)
            key = dsq__v_int(strtoll(key.u.s.p, NULL, 10));
        if (cur.t == DSQ__JV_UNDEF)
            return cur;
        cur = dsq__jgetitem(r, line, &cur, &key);
        p = dot + 1;
    }
    return cur;
}


static jv join_v(dsq__jrender_t *r, int line, const jv *seq, const jv *sep,
                 const jv *attr)
{
    dsq__jlist_t *l = dsq__jiter(r, line, seq);
    dsq__jbuf_t b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i && sep)
            dsq__jput_str(r, &b, sep);
        jv it = attr ? attr_path(r, line, &l->v[i], attr) : l->v[i];
        dsq__jput_str(r, &b, &it);
    }
    return dsq__v_sb(&b);
}

static jv sort_key(dsq__jrender_t *r, int line, const jv *v, const jv *attr, bool cs)
{
    jv k = attr ? attr_path(r, line, v, attr) : *v;
    if (!cs && k.t == DSQ__JV_STR)
        k = case_v(r, &k, 'l');
    return k;
}

static jv select_v(dsq__jrender_t *r, int line, const jv *seq, dsq__jargs_t *a, bool by_attr,
                   bool keep)
{
    dsq__jlist_t *l = dsq__jiter(r, line, seq);
    jv out = dsq__jv_list(r, 0);
    int first_test = by_attr ? 1 : 0;
    jv attr = dsq__v_none(), tname;
    if (by_attr && (a->n_pos < 1 || a->pos[0].t != DSQ__JV_STR))
        dsq__jfail(r, DSQ_EINVAL, line, "selectattr/rejectattr need an attribute name");
    if (by_attr)
        attr = a->pos[0];
    bool has_test = a->n_pos > first_test;
    if (has_test) {
        tname = dsq__jneed_str(r, line, &a->pos[first_test], "select test");
        if (!dsq__jinja_is_test(tname.u.s.p, tname.u.s.n))
            dsq__jfail(r, DSQ_EINVAL, line, "unsupported test '%.*s'",
                  (int)(tname.u.s.n > 40 ? 40 : tname.u.s.n), tname.u.s.p);
    }
    dsq__jargs_t ta = {0};
    if (has_test) {
        ta.pos = a->pos + first_test + 1;
        ta.n_pos = a->n_pos - first_test - 1;
    }
    for (size_t i = 0; i < l->n; i++) {
        dsq__jtick(r, line, 1);
        jv it = by_attr ? attr_path(r, line, &l->v[i], &attr) : l->v[i];
        bool ok = has_test ? dsq__jtest(r, line, (jstr){tname.u.s.p, tname.u.s.n}, &it, &ta)
                           : dsq__jv_truthy(&it);
        if (ok == keep)
            dsq__jlist_push(r, out.u.l, l->v[i]);
    }
    out.u.l->kind = DSQ__JL_GEN;
    return out;
}

jv dsq__jfilter(dsq__jrender_t *r, int line, jstr nm, const jv *v, dsq__jargs_t *a)
{
    jv x, y, z;
#define IS(s) dsq__jstr_is(nm, s)
    if (IS("default") || IS("d")) {
        jv def = dsq__jarg(a, 0, "default_value", &x) ? x : dsq__v_str("", 0);
        bool boolean = dsq__jarg(a, 1, "boolean", &y) && dsq__jv_truthy(&y);
        if (v->t == DSQ__JV_UNDEF || (boolean && !dsq__jv_truthy(v)))
            return def;
        return *v;
    }
    if (IS("length") || IS("count"))
        return dsq__v_int(dsq__jlength(r, line, v));
    if (IS("tojson")) {
        dsq__jjson_opt_t o = {0};
        o.ascii = dsq__jarg(a, 0, "ensure_ascii", &x) && dsq__jv_truthy(&x);
        if (dsq__jarg(a, 1, "indent", &x) && x.t != DSQ__JV_NONE) {
            if (x.t == DSQ__JV_STR) {
                o.indent = x.u.s.p;
                o.indent_n = x.u.s.n;
            } else {
                int64_t k = dsq__jneed_int(r, line, &x, "tojson indent");
                k = k < 0 ? 0 : k > 64 ? 64 : k;
                o.indent = "                                                                ";
                o.indent_n = (size_t)k;
            }
        }
        o.item_sep = dsq__v_cstr(o.indent ? "," : ", ");
        o.key_sep = dsq__v_cstr(": ");
        if (dsq__jarg(a, 2, "separators", &x) && x.t != DSQ__JV_NONE) {
            if (x.t != DSQ__JV_LIST || x.u.l->n != 2)
                dsq__jfail(r, DSQ_EINVAL, line, "tojson separators must be a pair of strings");
            o.item_sep = dsq__jneed_str(r, line, &x.u.l->v[0], "tojson separators");
            o.key_sep = dsq__jneed_str(r, line, &x.u.l->v[1], "tojson separators");
        }
        o.sort_keys = dsq__jarg(a, 3, "sort_keys", &x) && dsq__jv_truthy(&x);
        dsq__jbuf_t b = {0};
        dsq__jjson(r, line, &b, v, &o, 0);
        return dsq__v_sb(&b);
    }
    if (IS("string"))
        return dsq__jto_str(r, v);
    if (IS("safe"))
        return *v;
    if (IS("trim")) {
        jv s = dsq__jto_str(r, v);
        bool has = dsq__jarg(a, 0, "chars", &x) && x.t != DSQ__JV_NONE;
        if (has)
            dsq__jneed_str(r, line, &x, "trim");
        return strip_v(&s, has ? &x : NULL, true, true);
    }
    if (IS("upper") || IS("lower") || IS("capitalize") || IS("title")) {
        jv s = dsq__jto_str(r, v);
        return case_v(r, &s, IS("upper") ? 'u' : IS("lower") ? 'l' : IS("capitalize") ? 'c' : 'T');
    }
    if (IS("replace")) {
        jv s = dsq__jto_str(r, v);
        if (!dsq__jarg(a, 0, "old", &x) || !dsq__jarg(a, 1, "new", &y))
            dsq__jfail(r, DSQ_EINVAL, line, "replace needs two arguments");
        int64_t cnt = -1;
        if (dsq__jarg(a, 2, "count", &z) && z.t != DSQ__JV_NONE)
            cnt = dsq__jneed_int(r, line, &z, "replace");
        return replace_v(r, line, &s, &x, &y, cnt);
    }
    if (IS("split")) {
        jv s = dsq__jneed_str(r, line, v, "split");
        bool has = dsq__jarg(a, 0, "sep", &x);
        int64_t ms = -1;
        if (dsq__jarg(a, 1, "maxsplit", &y))
            ms = dsq__jneed_int(r, line, &y, "split");
        return split_v(r, line, &s, has ? &x : NULL, ms, false);
    }
    if (IS("first") || IS("last")) {
        dsq__jlist_t *l = dsq__jiter(r, line, v);
        if (l->n == 0)
            return dsq__v_undef(NULL, 0);
        return IS("first") ? l->v[0] : l->v[l->n - 1];
    }
    if (IS("join")) {
        jv sep = dsq__jarg(a, 0, "d", &x) ? x : dsq__v_str("", 0);
        bool has_attr = dsq__jarg(a, 1, "attribute", &y) && y.t != DSQ__JV_NONE;
        return join_v(r, line, v, &sep, has_attr ? &y : NULL);
    }
    if (IS("list")) {
        dsq__jlist_t *l = dsq__jiter(r, line, v);
        jv out = dsq__jv_list(r, l->n);
        for (size_t i = 0; i < l->n; i++)
            dsq__jlist_push(r, out.u.l, l->v[i]);
        return out;
    }
    if (IS("items")) {
        if (v->t == DSQ__JV_UNDEF)
            return dsq__jv_list(r, 0);
        if (v->t != DSQ__JV_DICT && v->t != DSQ__JV_NS)
            dsq__jfail(r, DSQ_EINVAL, line, "items: expected a mapping, got %s", dsq__jv_type_name(v));
        bool h;
        dsq__jargs_t none = {0};
        jv out = dsq__jdict_method(r, line, v, (jstr){"items", 5}, &none, &h);
        out.u.l->kind = DSQ__JL_GEN;
        return out;
    }
    if (IS("selectattr") || IS("rejectattr"))
        return select_v(r, line, v, a, true, IS("selectattr"));
    if (IS("select") || IS("reject"))
        return select_v(r, line, v, a, false, IS("select"));
    if (IS("map")) {
        dsq__jlist_t *l = dsq__jiter(r, line, v);
        jv out = dsq__jv_list(r, l->n);
        if (dsq__jarg(a, -1, "attribute", &x)) {
            bool has_def = dsq__jarg(a, -1, "default", &y);
            for (size_t i = 0; i < l->n; i++) {
                jv it = attr_path(r, line, &l->v[i], &x);
                if (it.t == DSQ__JV_UNDEF && has_def)
                    it = y;
                dsq__jlist_push(r, out.u.l, it);
            }
            dsq__jtick(r, line, (int64_t)l->n);
            out.u.l->kind = DSQ__JL_GEN;
            return out;
        }
        if (a->n_pos < 1)
            dsq__jfail(r, DSQ_EINVAL, line, "map needs a filter name or attribute=");
        jv fname = dsq__jneed_str(r, line, &a->pos[0], "map");
        if (!dsq__jinja_is_filter(fname.u.s.p, fname.u.s.n) || dsq__str_eq(&fname, "map"))
            dsq__jfail(r, DSQ_EINVAL, line, "unsupported filter '%.*s'",
                  (int)(fname.u.s.n > 40 ? 40 : fname.u.s.n), fname.u.s.p);
        dsq__jargs_t fa = *a;
        fa.pos++;
        fa.n_pos--;
        for (size_t i = 0; i < l->n; i++) {
            dsq__jtick(r, line, 1);
            dsq__jlist_push(r, out.u.l, dsq__jfilter(r, line, (jstr){fname.u.s.p, fname.u.s.n}, &l->v[i], &fa));
        }
        out.u.l->kind = DSQ__JL_GEN;
        return out;
    }
    if (IS("int")) {
        int64_t def = 0;
        if (dsq__jarg(a, 0, "default", &x))
            def = dsq__is_intlike(&x) ? dsq__int_of(&x) : 0;
        if (dsq__is_intlike(v))
            return dsq__v_int(dsq__int_of(v));
        if (v->t == DSQ__JV_FLOAT)
            return isfinite(v->u.f) && fabs(v->u.f) < 9.2e18 ? dsq__v_int((int64_t)v->u.f) : dsq__v_int(def);
        if (v->t == DSQ__JV_STR) {
            char buf[64];
            size_t k = 0;
            for (size_t i = 0; i < v->u.s.n && k < sizeof(buf) - 1; i++)
                if (v->u.s.p[i] != '_')
                    buf[k++] = v->u.s.p[i];
            buf[k] = 0;
            char *end;
            long long ll = strtoll(buf, &end, 10);
            while (*end == ' ' || *end == '\t' || *end == '\n')
                end++;
            if (k && *end == 0 && k < sizeof(buf) - 1)
                return dsq__v_int(ll);
            double d = strtod(buf, &end);
            while (*end == ' ' || *end == '\t' || *end == '\n')
                end++;
            if (k && *end == 0 && isfinite(d) && fabs(d) < 9.2e18)
                return dsq__v_int((int64_t)d);
        }
        return dsq__v_int(def);
    }
    if (IS("float")) {
        double def = dsq__jarg(a, 0, "default", &x) && dsq__is_num(&x) ? dsq__num_f(&x) : 0.0;
        if (dsq__is_num(v))
            return dsq__v_float(dsq__num_f(v));
        if (v->t == DSQ__JV_STR) {
            char buf[64];
            size_t k = v->u.s.n < sizeof(buf) - 1 ? v->u.s.n : sizeof(buf) - 1;
            memcpy(buf, v->u.s.p, k);
            buf[k] = 0;
            char *end;
            double d = strtod(buf, &end);
            if (k && *end == 0)
                return dsq__v_float(d);
        }
        return dsq__v_float(def);
    }
    if (IS("abs")) {
        if (v->t == DSQ__JV_FLOAT)
            return dsq__v_float(fabs(v->u.f));
        int64_t i = dsq__jneed_int(r, line, v, "abs");
        if (i == INT64_MIN)
            dsq__jfail(r, DSQ_ERANGE, line, "integer overflow");
        return dsq__v_int(i < 0 ? -i : i);
    }
    if (IS("round")) {
        if (!dsq__is_num(v))
            dsq__jfail(r, DSQ_EINVAL, line, "round: expected a number, got %s", dsq__jv_type_name(v));
        int64_t prec = dsq__jarg(a, 0, "precision", &x) ? dsq__jneed_int(r, line, &x, "round") : 0;
        jv meth = dsq__jarg(a, 1, "method", &y) ? y : dsq__v_cstr("common");
        double d = dsq__num_f(v), s = pow(10.0, (double)(prec < -300 ? -300 : prec > 300 ? 300 : prec));
        double t = d * s;
        if (dsq__str_eq(&meth, "ceil"))
            t = ceil(t);
        else if (dsq__str_eq(&meth, "floor"))
            t = floor(t);
        else if (dsq__str_eq(&meth, "common"))
            t = nearbyint(t);
        else
            dsq__jfail(r, DSQ_EINVAL, line, "round: method must be common, ceil or floor");
        return dsq__v_float(t / s);
    }
    if (IS("reverse")) {
        if (v->t == DSQ__JV_STR) {
            size_t cnt, *off = dsq__u8_offsets(r, v->u.s.p, v->u.s.n, &cnt);
            dsq__jbuf_t b = {0};
            for (size_t i = cnt; i-- > 0;)
                dsq__jbuf_put(r, &b, v->u.s.p + off[i], off[i + 1] - off[i]);
            return dsq__v_sb(&b);
        }
        dsq__jlist_t *l = dsq__jiter(r, line, v);
        jv out = dsq__jv_list(r, l->n);
        for (size_t i = l->n; i-- > 0;)
            dsq__jlist_push(r, out.u.l, l->v[i]);
        out.u.l->kind = DSQ__JL_GEN;
        return out;
    }
    if (IS("sort") || IS("unique") || IS("min") || IS("max")) {
        bool rev = IS("sort") && dsq__jarg(a, 0, "reverse", &x) && dsq__jv_truthy(&x);
        bool cs = dsq__jarg(a, IS("sort") ? 1 : 0, "case_sensitive", &y) && dsq__jv_truthy(&y);
        bool has_attr = dsq__jarg(a, IS("sort") ? 2 : 1, "attribute", &z) && z.t != DSQ__JV_NONE;
        dsq__jlist_t *l = dsq__jiter(r, line, v);
        jv out = dsq__jv_list(r, l->n);
        if (IS("unique")) {
            jv keys = dsq__jv_list(r, l->n);
            for (size_t i = 0; i < l->n; i++) {
                jv k = sort_key(r, line, &l->v[i], has_attr ? &z : NULL, cs);
                bool seen = false;
                for (size_t j = 0; j < keys.u.l->n && !seen; j++)
                    seen = dsq__jv_eq(&keys.u.l->v[j], &k);
                dsq__jtick(r, line, (int64_t)keys.u.l->n);
                if (!seen) {
                    dsq__jlist_push(r, keys.u.l, k);
                    dsq__jlist_push(r, out.u.l, l->v[i]);
                }
            }
            out.u.l->kind = DSQ__JL_GEN;
            return out;
        }
        if (IS("min") || IS("max")) {
            if (l->n == 0)
                return dsq__v_undef(NULL, 0);
            size_t best = 0;
            jv bk = sort_key(r, line, &l->v[0], has_attr ? &z : NULL, cs);
            for (size_t i = 1; i < l->n; i++) {
                jv k = sort_key(r, line, &l->v[i], has_attr ? &z : NULL, cs);
                int c = dsq__jv_cmp(r, line, &k, &bk);
                if (IS("min") ? c < 0 : c > 0) {
                    best = i;
                    bk = k;
                }
            }
            return l->v[best];
        }
        /* stable insertion sort on keys; bounded by the step limit */
        jv *keys = dsq__jalloc(r, (l->n ? l->n : 1) * sizeof(jv));
        for (size_t i = 0; i < l->n; i++) {
            keys[i] = sort_key(r, line, &l->v[i], has_attr ? &z : NULL, cs);
            out.u.l->v[i] = l->v[i];
        }
        out.u.l->n = l->n;
        for (size_t i = 1; i < l->n; i++) {
            for (size_t j = i; j > 0; j--) {
                dsq__jtick(r, line, 1);
                int c = dsq__jv_cmp(r, line, &keys[j - 1], &keys[j]);
                if (rev ? c >= 0 : c <= 0)
                    break;
                jv t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t;
                t = out.u.l->v[j]; out.u.l->v[j] = out.u.l->v[j - 1]; out.u.l->v[j - 1] = t;
            }
        }
        return out;
    }
    if (IS("sum")) {
        dsq__jlist_t *l = dsq__jiter(r, line, v);
        bool has_attr = dsq__jarg(a, 0, "attribute", &x) && x.t != DSQ__JV_NONE;
        jv acc = dsq__jarg(a, 1, "start", &y) ? y : dsq__v_int(0);
        for (size_t i = 0; i < l->n; i++) {
            jv it = has_attr ? attr_path(r, line, &l->v[i], &x) : l->v[i];
            if (!dsq__is_num(&acc) || !dsq__is_num(&it))
                dsq__jfail(r, DSQ_EINVAL, line, "sum: expected numbers");
            if (dsq__is_intlike(&acc) && dsq__is_intlike(&it)) {
                int64_t s;
                if (__builtin_add_overflow(dsq__int_of(&acc), dsq__int_of(&it), &s))
                    dsq__jfail(r, DSQ_ERANGE, line, "integer overflow");
                acc = dsq__v_int(s);
            } else {
                acc = dsq__v_float(dsq__num_f(&acc) + dsq__num_f(&it));
            }
        }
        return acc;
    }
    if (IS("indent")) {
        jv s = dsq__jto_str(r, v);
        jv ind;
        if (dsq__jarg(a, 0, "width", &x) && x.t == DSQ__JV_STR) {
            ind = x;
        } else {
            int64_t w = dsq__jarg(a, 0, "width", &x) ? dsq__jneed_int(r, line, &x, "indent") : 4;
            w = w < 0 ? 0 : w > 256 ? 256 : w;
            char *sp = dsq__jalloc(r, (size_t)w + 1);
            memset(sp, ' ', (size_t)w);
            ind = dsq__v_str(sp, (size_t)w);
        }
        bool first = dsq__jarg(a, 1, "first", &y) && dsq__jv_truthy(&y);
        bool blank = dsq__jarg(a, 2, "blank", &z) && dsq__jv_truthy(&z);
        dsq__jbuf_t b = {0};
        if (first)
            dsq__jbuf_put(r, &b, ind.u.s.p, ind.u.s.n);
        size_t i = 0, ln = 0;
        const char *p = s.u.s.p;
        size_t n = s.u.s.n;
        while (i <= n) {
            const char *q = i < n ? memchr(p + i, '\n', n - i) : NULL;
            size_t e = q ? (size_t)(q - p) : n;
            if (ln > 0) {
                dsq__sb_ch(r, &b, '\n');
                if (blank || e > i)
                    dsq__jbuf_put(r, &b, ind.u.s.p, ind.u.s.n);
            }
            dsq__jbuf_put(r, &b, p + i, e - i);
            ln++;
            if (!q)
                break;
            i = e + 1;
        }
        return dsq__v_sb(&b);
    }
    if (IS("escape") || IS("e")) {
        jv s = dsq__jto_str(r, v);
        dsq__jbuf_t b = {0};
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            switch (c) {
            case '&': dsq__sb_str(r, &b, "&amp;"); break;
            case '<': dsq__sb_str(r, &b, "&lt;"); break;
            case '>': dsq__sb_str(r, &b, "&gt;"); break;
            case '"': dsq__sb_str(r, &b, "&#34;"); break;
            case '\'': dsq__sb_str(r, &b, "&#39;"); break;
            default: dsq__sb_ch(r, &b, c);
            }
        }
        return dsq__v_sb(&b);
    }
    if (IS("dictsort")) {
        if (v->t != DSQ__JV_DICT)
            dsq__jfail(r, DSQ_EINVAL, line, "dictsort: expected a mapping");
        bool h;
        dsq__jargs_t none = {0};
        jv items = dsq__jdict_method(r, line, v, (jstr){"items", 5}, &none, &h);
        /* sort pairs by key, case-insensitive */
        dsq__jlist_t *l = items.u.l;
        for (size_t i = 1; i < l->n; i++)
            for (size_t j = i; j > 0; j--) {
                jv k1 = sort_key(r, line, &l->v[j - 1].u.l->v[0], NULL, false);
                jv k2 = sort_key(r, line, &l->v[j].u.l->v[0], NULL, false);
                dsq__jtick(r, line, 1);
                if (dsq__jv_cmp(r, line, &k1, &k2) <= 0)
                    break;
                jv t = l->v[j]; l->v[j] = l->v[j - 1]; l->v[j - 1] = t;
            }
        l->kind = DSQ__JL_LIST;
        return items;
    }
    if (IS("wordcount")) {
        jv s = dsq__jto_str(r, v);
        jv w = split_v(r, line, &s, NULL, -1, false);
        return dsq__v_int((int64_t)w.u.l->n);
    }
#undef IS
    dsq__jfail(r, DSQ_EINVAL, line, "unsupported filter '%.*s'", (int)(nm.n > 40 ? 40 : nm.n), nm.p);
}

bool dsq__jtest(dsq__jrender_t *r, int line, jstr nm, const jv *v, dsq__jargs_t *a)
{
    jv x;
#define IS(s) dsq__jstr_is(nm, s)
    if (IS("defined")) return v->t != DSQ__JV_UNDEF;
    if (IS("undefined")) return v->t == DSQ__JV_UNDEF;
    if (IS("none")) return v->t == DSQ__JV_NONE;
    if (IS("boolean")) return v->t == DSQ__JV_BOOL;
    if (IS("false")) return v->t == DSQ__JV_BOOL && !v->u.b;
    if (IS("true")) return v->t == DSQ__JV_BOOL && v->u.b;
    if (IS("integer")) return v->t == DSQ__JV_INT;
    if (IS("float")) return v->t == DSQ__JV_FLOAT;
    if (IS("number")) return dsq__is_num(v);
    if (IS("string")) return v->t == DSQ__JV_STR;
    if (IS("mapping")) return v->t == DSQ__JV_DICT;
    if (IS("iterable") || IS("sequence"))
        return v->t == DSQ__JV_STR || v->t == DSQ__JV_LIST ||
               v->t == DSQ__JV_DICT || v->t == DSQ__JV_UNDEF;
    if (IS("callable")) return v->t == DSQ__JV_MACRO || v->t == DSQ__JV_FUNC;
    if (IS("odd") || IS("even")) {
        int64_t i = dsq__jneed_int(r, line, v, "odd/even");
        return ((i % 2) != 0) == IS("odd");
    }
    if (IS("lower") || IS("upper")) {
        jv s = dsq__jto_str(r, v);
        bool cased = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            if (IS("lower") ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z'))
                return false;
            cased |= a_alpha(c);
        }
        return cased;
    }
    if (!dsq__jarg(a, 0, "other", &x))
        dsq__jfail(r, DSQ_EINVAL, line, "test '%.*s' needs an argument", (int)nm.n, nm.p);
    if (IS("divisibleby")) {
        int64_t d = dsq__jneed_int(r, line, &x, "divisibleby");
        if (d == 0)
            dsq__jfail(r, DSQ_EINVAL, line, "divisibleby: division by zero");
        return dsq__jneed_int(r, line, v, "divisibleby") % d == 0;
    }
    if (IS("sameas")) {
        if (v->t != x.t)
            return false;
        if (v->t == DSQ__JV_NONE || v->t == DSQ__JV_UNDEF)
            return true;
        if (v->t == DSQ__JV_BOOL)
            return v->u.b == x.u.b;
        if (v->t == DSQ__JV_LIST)
            return v->u.l == x.u.l;
        if (v->t == DSQ__JV_DICT || v->t == DSQ__JV_NS)
            return v->u.d == x.u.d;
        return dsq__jv_eq(v, &x);
    }
    if (IS("in")) return dsq__jcontains(r, line, &x, v);
    if (IS("eq") || IS("equalto") || IS("==")) return dsq__jv_eq(v, &x);
    if (IS("ne") || IS("!=")) return !dsq__jv_eq(v, &x);
    int c = dsq__jv_cmp(r, line, v, &x);
    if (IS("lt") || IS("lessthan") || IS("<")) return c < 0;
    if (IS("le") || IS("<=")) return c <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">")) return c > 0;
    if (IS("ge") || IS(">=")) return c >= 0;
#undef IS
    dsq__jfail(r, DSQ_EINVAL, line, "unsupported test '%.*s'", (int)nm.n, nm.p);
}


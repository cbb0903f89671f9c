/* Chat-template evaluator and public API (see chat_template.h).
 *
 * Owns: scopes, the tree-walking evaluator of the tree jinja.c builds,
 * operators, macro and builtin calls (raise_exception, namespace, dict,
 * range, strftime_now), the JSON input (parsed with cJSON, then turned
 * into values) and the render entry point.
 * Values live in jinja_value.c, filters/tests/methods in jinja_filters.c.
 * Semantics follow Jinja 3.1 with Python 3 values: an undefined value
 * prints as "", is false and iterates as empty, but attribute access,
 * arithmetic or ordering on it is an error; and/or return an operand.
 * Each render owns an arena that holds every value it makes, so errors
 * longjmp out and free everything at once; the template is never written,
 * which keeps renders thread-safe. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "chat_template.h"
#include "chat_template_internal.h"
#include "engine/common/error.h"

typedef dsq__jv_t jv;
typedef dsq__jnode_t node_t;
typedef dsq__jstr_t jstr;

struct dsq_chat_template {
    dsq__arena_t arena;
    node_t *root;
};

enum { F_RAISE = 1, F_NAMESPACE, F_DICT, F_RANGE, F_STRFTIME };

/* A scope: for-loop iterations and macro calls get a new one; set writes
 * into the current one. */
typedef struct dsq__jframe {
    struct dsq__jframe *parent;
    jstr *names;
    jv *vals;
    int n, cap;
} frame_t;


static jv eval(dsq__jrender_t *r, frame_t *f, const node_t *n);
static void exec(dsq__jrender_t *r, frame_t *f, dsq__jbuf_t *out, const node_t *n);

static void eval_args(dsq__jrender_t *r, frame_t *f, const node_t *n, dsq__jargs_t *a)
{
    a->n_pos = n->n_items;
    a->pos = n->n_items ? dsq__jalloc(r, (size_t)n->n_items * sizeof(jv)) : NULL;
    for (int i = 0; i < n->n_items; i++)
        a->pos[i] = eval(r, f, n->items[i]);
    a->n_kw = n->n_kw;
    a->kw_names = n->kw_names;
    a->kw = n->n_kw ? dsq__jalloc(r, (size_t)n->n_kw * sizeof(jv)) : NULL;
    for (int i = 0; i < n->n_kw; i++)
        a->kw[i] = eval(r, f, n->kw_vals[i]);
}

/* ---- frames ---- */
static frame_t *frame_new(dsq__jrender_t *r, frame_t *parent)
{
    frame_t *f = dsq__jalloc(r, sizeof(*f));
    f->parent = parent;
    return f;
}
static void frame_set(dsq__jrender_t *r, frame_t *f, jstr name, jv v)
{
    for (int i = 0; i < f->n; i++)
        if (f->names[i].n == name.n && memcmp(f->names[i].p, name.p, name.n) == 0) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 4;
        jstr *nn = dsq__jalloc(r, (size_t)cap * sizeof(*nn));
        jv *nv = dsq__jalloc(r, (size_t)cap * sizeof(*nv));
        if (f->n) {
            memcpy(nn, f->names, (size_t)f->n * sizeof(*nn));
            memcpy(nv, f->vals, (size_t)f->n * sizeof(*nv));
        }
        f->names = nn;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
}

static jv lookup(dsq__jrender_t *r, frame_t *f, jstr name)
{
    for (; f; f = f->parent)
        for (int i = f->n - 1; i >= 0; i--)
            if (f->names[i].n == name.n && memcmp(f->names[i].p, name.p, name.n) == 0)
                return f->vals[i];
    jv *g = dsq__jdict_get(r->globals, name.p, name.n);
    if (g)
        return *g;
    static const struct { const char *n; int id; } fns[] = {
        {"raise_exception", F_RAISE}, {"namespace", F_NAMESPACE},
        {"dict", F_DICT}, {"range", F_RANGE}, {"strftime_now", F_STRFTIME},
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
        if (dsq__jstr_is(name, fns[i].n)) {
            jv v = {.t = DSQ__JV_FUNC};
            v.u.i = fns[i].id;
            return v;
        }
    return dsq__v_undef(name.p, name.n);
}


/* ---- operators ---- */
static jv arith(dsq__jrender_t *r, int line, int op, const jv *a, const jv *b)
{
    if (op == '~') {
        dsq__jbuf_t s = {0};
        dsq__jput_str(r, &s, a);
        dsq__jput_str(r, &s, b);
        return dsq__v_sb(&s);
    }
    if (a->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, a);
    if (b->t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, line, b);
    if (dsq__is_num(a) && dsq__is_num(b)) {
        bool ints = dsq__is_intlike(a) && dsq__is_intlike(b);
        int64_t x = ints ? dsq__int_of(a) : 0, y = ints ? dsq__int_of(b) : 0, z;
        double fx = dsq__num_f(a), fy = dsq__num_f(b);
        switch (op) {
        case '+':
            if (!ints) return dsq__v_float(fx + fy);
            if (__builtin_add_overflow(x, y, &z)) goto overflow;
            return dsq__v_int(z);
        case '-':
            if (!ints) return dsq__v_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &z)) goto overflow;
            return dsq__v_int(z);
        case '*':
            if (!ints) return dsq__v_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &z)) goto overflow;
            return dsq__v_int(z);
        case '/':
            if (fy == 0.0) goto divzero;
            return dsq__v_float(fx / fy);
        case DSQ__OP_FLOORDIV:
            if (fy == 0.0) goto divzero;
            if (!ints) return dsq__v_float(floor(fx / fy));
            if (x == INT64_MIN && y == -1) goto overflow;
            z = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) z--;
            return dsq__v_int(z);
        case '%':
            if (fy == 0.0) goto divzero;
            if (!ints) {
                double m = fmod(fx, fy);
                if (m != 0.0 && ((m < 0) != (fy < 0))) m += fy;
                return dsq__v_float(m);
            }
            if (y == -1) return dsq__v_int(0);
            z = x % y;
            if (z != 0 && ((z < 0) != (y < 0))) z += y;
            return dsq__v_int(z);
        case DSQ__OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x, e = y;
                while (e > 0) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) goto overflow;
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                return dsq__v_int(acc);
            }
            if (fx == 0.0 && fy < 0) goto divzero;
            return dsq__v_float(pow(fx, fy));
        default: break;
        }
    }
    if (op == '+' && a->t == DSQ__JV_STR && b->t == DSQ__JV_STR) {
        if (a->u.s.n + b->u.s.n > DSQ_CHAT_TEMPLATE_MAX_OUTPUT_BYTES)
            dsq__jfail(r, DSQ_ERANGE, line, "string too long");
        char *p = dsq__jalloc(r, a->u.s.n + b->u.s.n + 1);
        memcpy(p, a->u.s.p, a->u.s.n);
        memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
        return dsq__v_str(p, a->u.s.n + b->u.s.n);
    }
    if (op == '+' && a->t == DSQ__JV_LIST && b->t == DSQ__JV_LIST) {
        jv out = dsq__jv_list(r, a->u.l->n + b->u.l->n);
        for (size_t i = 0; i < a->u.l->n; i++) dsq__jlist_push(r, out.u.l, a->u.l->v[i]);
        for (size_t i = 0; i < b->u.l->n; i++) dsq__jlist_push(r, out.u.l, b->u.l->v[i]);
        dsq__jtick(r, line, (int64_t)out.u.l->n);
        return out;
    }
    if (op == '*' && ((a->t == DSQ__JV_STR || a->t == DSQ__JV_LIST) && dsq__is_intlike(b)) ) {
        int64_t k = dsq__int_of(b);
        if (k < 0) k = 0;
        if (a->t == DSQ__JV_STR) {
            if (a->u.s.n && (uint64_t)k > DSQ_CHAT_TEMPLATE_MAX_OUTPUT_BYTES / a->u.s.n)
                dsq__jfail(r, DSQ_ERANGE, line, "string too long");
            dsq__jbuf_t s = {0};
            for (int64_t i = 0; i < k; i++)
                dsq__jbuf_put(r, &s, a->u.s.p, a->u.s.n);
            return dsq__v_sb(&s);
        }
        if (a->u.l->n && (uint64_t)k > (uint64_t)DSQ_CHAT_TEMPLATE_MAX_STEPS / a->u.l->n)
            dsq__jfail(r, DSQ_ERANGE, line, "list too long");
        dsq__jtick(r, line, k * (int64_t)a->u.l->n);
        jv out = dsq__jv_list(r, (size_t)k * a->u.l->n);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < a->u.l->n; j++)
                dsq__jlist_push(r, out.u.l, a->u.l->v[j]);
        return out;
    }
    if (op == '*' && dsq__is_intlike(a) && (b->t == DSQ__JV_STR || b->t == DSQ__JV_LIST))
        return arith(r, line, op, b, a);
    if (op == '%' && a->t == DSQ__JV_STR)
        dsq__jfail(r, DSQ_EINVAL, line, "string %% formatting is not supported");
    {
        static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
        int k = op == '+' ? 0 : op == '-' ? 1 : op == '*' ? 2 : op == '/' ? 3 :
                op == DSQ__OP_FLOORDIV ? 4 : op == '%' ? 5 : 6;
        dsq__jfail(r, DSQ_EINVAL, line, "unsupported operand types for %s: %s and %s",
              names[k], dsq__jv_type_name(a), dsq__jv_type_name(b));
    }
overflow:
    dsq__jfail(r, DSQ_ERANGE, line, "integer overflow");
divzero:
    dsq__jfail(r, DSQ_EINVAL, line, "division by zero");
}

static bool compare(dsq__jrender_t *r, int line, int op, const jv *a, const jv *b)
{
    switch (op) {
    case DSQ__OP_EQ: return dsq__jv_eq(a, b);
    case DSQ__OP_NE: return !dsq__jv_eq(a, b);
    case DSQ__OP_IN: return dsq__jcontains(r, line, b, a);
    case DSQ__OP_NOTIN: return !dsq__jcontains(r, line, b, a);
    case DSQ__OP_LT: return dsq__jv_cmp(r, line, a, b) < 0;
    case DSQ__OP_LE: return dsq__jv_cmp(r, line, a, b) <= 0;
    case DSQ__OP_GT: return dsq__jv_cmp(r, line, a, b) > 0;
    default: return dsq__jv_cmp(r, line, a, b) >= 0;
    }
}

/* ---- calls ---- */
static jv call_macro(dsq__jrender_t *r, int line, const node_t *m, dsq__jargs_t *a)
{
    frame_t *f = frame_new(r, r->root);
    if (a->n_pos > m->n_names)
        dsq__jfail(r, DSQ_EINVAL, line, "macro '%.*s' takes %d arguments, got %d",
              (int)m->name.n, m->name.p, m->n_names, a->n_pos);
    for (int i = 0; i < a->n_kw; i++) {
        bool ok = false;
        for (int j = 0; j < m->n_names && !ok; j++)
            ok = a->kw_names[i].n == m->names[j].n &&
                 memcmp(a->kw_names[i].p, m->names[j].p, m->names[j].n) == 0;
        if (!ok)
            dsq__jfail(r, DSQ_EINVAL, line, "macro '%.*s' has no parameter '%.*s'",
                  (int)m->name.n, m->name.p, (int)a->kw_names[i].n, a->kw_names[i].p);
    }
    for (int j = 0; j < m->n_names; j++) {
        jv v;
        char nm[64];
        size_t k = m->names[j].n < sizeof(nm) - 1 ? m->names[j].n : sizeof(nm) - 1;
        memcpy(nm, m->names[j].p, k);
        nm[k] = 0;
        if (!dsq__jarg(a, j, nm, &v))
            v = m->items[j] ? eval(r, f, m->items[j]) : dsq__v_undef(m->names[j].p, m->names[j].n);
        frame_set(r, f, m->names[j], v);
    }
    dsq__jbuf_t out = {0};
    int saved = r->brk;
    exec(r, f, &out, m->c);
    r->brk = saved;
    return dsq__v_sb(&out);
}

static jv call_builtin(dsq__jrender_t *r, int line, int64_t id, dsq__jargs_t *a)
{
    jv x, y, z;
    switch (id) {
    case F_RAISE: {
        jv msg = dsq__jarg(a, 0, "message", &x) ? dsq__jto_str(r, &x) : dsq__v_cstr("error");
        dsq__jfail(r, DSQ_EINVAL, line, "raise_exception: %.*s",
              (int)(msg.u.s.n > 400 ? 400 : msg.u.s.n), msg.u.s.p);
    }
    case F_NAMESPACE:
    case F_DICT: {
        jv d = dsq__jv_dict(r, id == F_NAMESPACE ? DSQ__JV_NS : DSQ__JV_DICT);
        for (int i = 0; i < a->n_pos; i++) {
            if (a->pos[i].t != DSQ__JV_DICT && a->pos[i].t != DSQ__JV_NS)
                dsq__jfail(r, DSQ_EINVAL, line, "namespace()/dict() positional argument must be a mapping");
            for (size_t k = 0; k < a->pos[i].u.d->n; k++)
                dsq__jdict_set(r, d.u.d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
        }
        for (int i = 0; i < a->n_kw; i++)
            dsq__jdict_set(r, d.u.d, dsq__v_str(a->kw_names[i].p, a->kw_names[i].n), a->kw[i]);
        return d;
    }
    case F_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (a->n_pos == 1) {
            stop = dsq__jneed_int(r, line, &a->pos[0], "range");
        } else if (a->n_pos == 2 || a->n_pos == 3) {
            start = dsq__jneed_int(r, line, &a->pos[0], "range");
            stop = dsq__jneed_int(r, line, &a->pos[1], "range");
            if (a->n_pos == 3)
                step = dsq__jneed_int(r, line, &a->pos[2], "range");
        } else {
            dsq__jfail(r, DSQ_EINVAL, line, "range takes 1 to 3 integer arguments");
        }
        if (step == 0)
            dsq__jfail(r, DSQ_EINVAL, line, "range step must not be zero");
        double cnt = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                              : ceil(((double)start - (double)stop) / (double)-step);
        if (cnt < 0)
            cnt = 0;
        if (cnt > (double)DSQ_CHAT_TEMPLATE_MAX_STEPS)
            dsq__jfail(r, DSQ_ERANGE, line, "range of %.0f items exceeds the step limit", cnt);
        dsq__jtick(r, line, (int64_t)cnt);
        jv out = dsq__jv_list(r, (size_t)cnt);
        for (int64_t i = 0; i < (int64_t)cnt; i++)
            dsq__jlist_push(r, out.u.l, dsq__v_int(start + i * step));
        return out;
    }
    case F_STRFTIME: {
        if (!dsq__jarg(a, 0, "format", &x))
            dsq__jfail(r, DSQ_EINVAL, line, "strftime_now needs a format");
        jv fmt = dsq__jneed_str(r, line, &x, "strftime_now");
        char f[256], buf[512];
        size_t k = fmt.u.s.n < sizeof(f) - 1 ? fmt.u.s.n : sizeof(f) - 1;
        memcpy(f, fmt.u.s.p, k);
        f[k] = 0;
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t n = strftime(buf, sizeof(buf), f, &tmv);
        char *p = dsq__jalloc(r, n + 1);
        memcpy(p, buf, n);
        (void)y;
        (void)z;
        return dsq__v_str(p, n);
    }
    default:
        dsq__jfail(r, DSQ_EINVAL, line, "object is not callable");
    }
}

static jv eval_call(dsq__jrender_t *r, frame_t *f, const node_t *n)
{
    dsq__jargs_t a;
    jv callee;
    if (n->a->kind == DSQ__N_GETATTR) {
        jv obj = eval(r, f, n->a->a);
        jstr m = n->a->attr;
        if (obj.t == DSQ__JV_UNDEF)
            dsq__jfail_undef(r, n->line, &obj);
        if (obj.t == DSQ__JV_STR) {
            eval_args(r, f, n, &a);
            return dsq__jstr_method(r, n->line, &obj, m, &a);
        }
        if (obj.t == DSQ__JV_DICT) {
            eval_args(r, f, n, &a);
            bool handled;
            jv res = dsq__jdict_method(r, n->line, &obj, m, &a, &handled);
            if (handled)
                return res;
            callee = dsq__jgetattr(r, n->line, &obj, m.p, m.n);
            goto have_callee;
        }
        callee = dsq__jgetattr(r, n->line, &obj, m.p, m.n);
        if (callee.t == DSQ__JV_UNDEF)
            dsq__jfail(r, DSQ_EINVAL, n->line, "%s has no method '%.*s'", dsq__jv_type_name(&obj),
                  (int)(m.n > 40 ? 40 : m.n), m.p);
    } else {
        callee = eval(r, f, n->a);
    }
    eval_args(r, f, n, &a);
have_callee:
    if (callee.t == DSQ__JV_MACRO)
        return call_macro(r, n->line, callee.u.macro, &a);
    if (callee.t == DSQ__JV_FUNC)
        return call_builtin(r, n->line, callee.u.i, &a);
    if (callee.t == DSQ__JV_UNDEF)
        dsq__jfail_undef(r, n->line, &callee);
    dsq__jfail(r, DSQ_EINVAL, n->line, "'%s' object is not callable", dsq__jv_type_name(&callee));
}

static jv eval(dsq__jrender_t *r, frame_t *f, const node_t *n)
{
    jv res, a, b;
    dsq__jtick(r, n->line, 1);
    if (++r->depth > DSQ_CHAT_TEMPLATE_MAX_DEPTH)
        dsq__jfail(r, DSQ_ERANGE, n->line, "evaluation nested deeper than %d",
              DSQ_CHAT_TEMPLATE_MAX_DEPTH);
    switch (n->kind) {
    case DSQ__N_LIT: res = n->lit; break;
    case DSQ__N_NAME: res = lookup(r, f, n->name); break;
    case DSQ__N_LIST:
        res = dsq__jv_list(r, (size_t)n->n_items);
        res.u.l->kind = n->op == 1 ? DSQ__JL_TUPLE : DSQ__JL_LIST;
        for (int i = 0; i < n->n_items; i++)
            dsq__jlist_push(r, res.u.l, eval(r, f, n->items[i]));
        break;
    case DSQ__N_DICT:
        res = dsq__jv_dict(r, DSQ__JV_DICT);
        for (int i = 0; i + 1 < n->n_items; i += 2) {
            a = eval(r, f, n->items[i]);
            b = eval(r, f, n->items[i + 1]);
            if (a.t == DSQ__JV_LIST || a.t == DSQ__JV_DICT || a.t == DSQ__JV_UNDEF)
                dsq__jfail(r, DSQ_EINVAL, n->line, "unhashable dict key of type %s", dsq__jv_type_name(&a));
            dsq__jdict_set(r, res.u.d, a, b);
        }
        break;
    case DSQ__N_GETATTR:
        a = eval(r, f, n->a);
        res = dsq__jgetattr(r, n->line, &a, n->attr.p, n->attr.n);
        break;
    case DSQ__N_GETITEM:
        a = eval(r, f, n->a);
        b = eval(r, f, n->b);
        res = dsq__jgetitem(r, n->line, &a, &b);
        break;
    case DSQ__N_SLICE: {
        jv s[3];
        a = eval(r, f, n->a);
        const node_t *parts[3] = {n->b, n->c, n->d};
        for (int i = 0; i < 3; i++)
            s[i] = parts[i] ? eval(r, f, parts[i]) : dsq__v_none();
        res = dsq__jslice(r, n->line, &a, &s[0], &s[1], &s[2]);
        break;
    }
    case DSQ__N_CALL: res = eval_call(r, f, n); break;
    case DSQ__N_FILTER: {
        dsq__jargs_t ar;
        a = eval(r, f, n->a);
        eval_args(r, f, n, &ar);
        res = dsq__jfilter(r, n->line, n->name, &a, &ar);
        break;
    }
    case DSQ__N_TEST: {
        dsq__jargs_t ar;
        a = eval(r, f, n->a);
        eval_args(r, f, n, &ar);
        res = dsq__v_bool(dsq__jtest(r, n->line, n->name, &a, &ar) != (n->op == 1));
        break;
    }
    case DSQ__N_UNARY:
        a = eval(r, f, n->a);
        if (n->op == DSQ__OP_NOT) {
            res = dsq__v_bool(!dsq__jv_truthy(&a));
        } else {
            if (a.t == DSQ__JV_UNDEF)
                dsq__jfail_undef(r, n->line, &a);
            if (!dsq__is_num(&a))
                dsq__jfail(r, DSQ_EINVAL, n->line, "bad operand type for unary %c: %s", n->op, dsq__jv_type_name(&a));
            if (n->op == '+')
                res = a.t == DSQ__JV_BOOL ? dsq__v_int(a.u.b) : a;
            else if (a.t == DSQ__JV_FLOAT)
                res = dsq__v_float(-a.u.f);
            else if (dsq__int_of(&a) == INT64_MIN)
                dsq__jfail(r, DSQ_ERANGE, n->line, "integer overflow");
            else
                res = dsq__v_int(-dsq__int_of(&a));
        }
        break;
    case DSQ__N_BINOP:
        a = eval(r, f, n->a);
        b = eval(r, f, n->b);
        res = arith(r, n->line, n->op, &a, &b);
        break;
    case DSQ__N_AND:
        res = eval(r, f, n->a);
        if (dsq__jv_truthy(&res))
            res = eval(r, f, n->b);
        break;
    case DSQ__N_OR:
        res = eval(r, f, n->a);
        if (!dsq__jv_truthy(&res))
            res = eval(r, f, n->b);
        break;
    case DSQ__N_CMP:
        a = eval(r, f, n->a);
        res = dsq__v_bool(true);
        for (int i = 0; i < n->n_items; i++) {
            b = eval(r, f, n->items[i]);
            if (!compare(r, n->line, n->ops[i], &a, &b)) {
                res = dsq__v_bool(false);
                break;
            }
            a = b;
        }
        break;
    case DSQ__N_COND:
        a = eval(r, f, n->b);
        res = dsq__jv_truthy(&a) ? eval(r, f, n->a)
                         : n->c ? eval(r, f, n->c) : dsq__v_undef(NULL, 0);
        break;
    default:
        dsq__jfail(r, DSQ_EINVAL, n->line, "internal: statement in expression");
    }
    r->depth--;
    return res;
}

static void bind_targets(dsq__jrender_t *r, frame_t *f, const node_t *n, const jv *v)
{
    if (n->n_names == 1) {
        frame_set(r, f, n->names[0], *v);
        return;
    }
    dsq__jlist_t *l = dsq__jiter(r, n->line, v);
    if (l->n != (size_t)n->n_names)
        dsq__jfail(r, DSQ_EINVAL, n->line, "cannot unpack %zu values into %d names",
              l->n, n->n_names);
    for (int i = 0; i < n->n_names; i++)
        frame_set(r, f, n->names[i], l->v[i]);
}

static void exec_for(dsq__jrender_t *r, frame_t *f, dsq__jbuf_t *out, const node_t *n)
{
    jv it = eval(r, f, n->a);
    if (it.t == DSQ__JV_NONE || !(it.t == DSQ__JV_UNDEF || it.t == DSQ__JV_LIST ||
                                  it.t == DSQ__JV_DICT || it.t == DSQ__JV_STR))
        dsq__jfail(r, DSQ_EINVAL, n->line, "'%s' object is not iterable", dsq__jv_type_name(&it));
    dsq__jlist_t *src = dsq__jiter(r, n->line, &it);
    dsq__jlist_t *items = src;
    if (n->b) {
        items = dsq__jv_list(r, 0).u.l;
        for (size_t i = 0; i < src->n; i++) {
            frame_t *tf = frame_new(r, f);
            bind_targets(r, tf, n, &src->v[i]);
            jv c = eval(r, tf, n->b);
            if (dsq__jv_truthy(&c))
                dsq__jlist_push(r, items, src->v[i]);
        }
    }
    size_t len = items->n;
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0",
                                       "first", "last", "length", "depth", "depth0",
                                       "previtem", "nextitem"};
    jv kv[11];
    for (int k = 0; k < 11; k++)
        kv[k] = dsq__v_cstr(keys[k]);
    for (size_t i = 0; i < len; i++) {
        dsq__jtick(r, n->line, 1);
        frame_t *lf = frame_new(r, f);
        bind_targets(r, lf, n, &items->v[i]);
        jv loop = dsq__jv_dict(r, DSQ__JV_DICT);
        dsq__jdict_t *d = loop.u.d;
        d->k = dsq__jalloc(r, 11 * sizeof(jv));
        d->v = dsq__jalloc(r, 11 * sizeof(jv));
        d->cap = 11;
        jv vals[11] = {
            dsq__v_int((int64_t)i + 1), dsq__v_int((int64_t)i), dsq__v_int((int64_t)(len - i)),
            dsq__v_int((int64_t)(len - i - 1)), dsq__v_bool(i == 0), dsq__v_bool(i + 1 == len),
            dsq__v_int((int64_t)len), dsq__v_int(1), dsq__v_int(0),
            i > 0 ? items->v[i - 1] : dsq__v_undef("previtem", 8),
            i + 1 < len ? items->v[i + 1] : dsq__v_undef("nextitem", 8),
        };
        for (int k = 0; k < 11; k++) {
            d->k[k] = kv[k];
            d->v[k] = vals[k];
        }
        d->n = 11;
        frame_set(r, lf, (jstr){"loop", 4}, loop);
        exec(r, lf, out, n->c);
        if (r->brk == 1) {
            r->brk = 0;
            break;
        }
        r->brk = 0;
    }
    if (len == 0 && n->d)
        exec(r, f, out, n->d);
}

static void exec(dsq__jrender_t *r, frame_t *f, dsq__jbuf_t *out, const node_t *n)
{
    jv v;
    dsq__jtick(r, n->line, 1);
    if (++r->depth > DSQ_CHAT_TEMPLATE_MAX_DEPTH)
        dsq__jfail(r, DSQ_ERANGE, n->line, "evaluation nested deeper than %d",
              DSQ_CHAT_TEMPLATE_MAX_DEPTH);
    switch (n->kind) {
    case DSQ__S_BODY:
        for (int i = 0; i < n->n_items && !r->brk; i++)
            exec(r, f, out, n->items[i]);
        break;
    case DSQ__S_TEXT: dsq__jbuf_put(r, out, n->name.p, n->name.n); break;
    case DSQ__S_OUT:
        v = eval(r, f, n->a);
        dsq__jput_str(r, out, &v);
        break;
    case DSQ__S_IF:
        v = eval(r, f, n->a);
        if (dsq__jv_truthy(&v))
            exec(r, f, out, n->b);
        else if (n->c)
            exec(r, f, out, n->c);
        break;
    case DSQ__S_FOR: exec_for(r, f, out, n); break;
    case DSQ__S_SET:
        v = eval(r, f, n->a);
        bind_targets(r, f, n, &v);
        break;
    case DSQ__S_SETATTR: {
        jv ns = lookup(r, f, n->name);
        if (ns.t != DSQ__JV_NS)
            dsq__jfail(r, DSQ_EINVAL, n->line, "can only set attributes on a namespace ('%.*s' is %s)",
                  (int)n->name.n, n->name.p, dsq__jv_type_name(&ns));
        if (n->attr.n && n->attr.p[0] == '_')
            dsq__jfail(r, DSQ_EINVAL, n->line, "namespace attributes may not start with '_'");
        v = eval(r, f, n->a);
        dsq__jdict_set(r, ns.u.d, dsq__v_str(n->attr.p, n->attr.n), v);
        break;
    }
    case DSQ__S_SETBLOCK: {
        dsq__jbuf_t b = {0};
        exec(r, f, &b, n->c);
        frame_set(r, f, n->names[0], dsq__v_sb(&b));
        break;
    }
    case DSQ__S_MACRO:
        v = (jv){.t = DSQ__JV_MACRO};
        v.u.macro = n;
        frame_set(r, f, n->name, v);
        break;
    case DSQ__S_BREAK: r->brk = 1; break;
    case DSQ__S_CONTINUE: r->brk = 2; break;
    default:
        dsq__jfail(r, DSQ_EINVAL, n->line, "internal: expression as statement");
    }
    r->depth--;
}

/* ---- cJSON -> values ---- */
static jv from_json(dsq__jrender_t *r, const cJSON *j, int depth)
{
    if (depth > 200)
        dsq__jfail(r, DSQ_EINVAL, 0, "input JSON nested too deeply");
    dsq__jtick(r, 0, 1);
    if (cJSON_IsString(j))
        return dsq__v_cstr(j->valuestring ? j->valuestring : "");
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) <= 9007199254740992.0)
            return dsq__v_int((int64_t)d);
        return dsq__v_float(d);
    }
    if (cJSON_IsBool(j))
        return dsq__v_bool(cJSON_IsTrue(j));
    if (cJSON_IsArray(j)) {
        jv out = dsq__jv_list(r, 0);
        for (const cJSON *c = j->child; c; c = c->next)
            dsq__jlist_push(r, out.u.l, from_json(r, c, depth + 1));
        return out;
    }
    if (cJSON_IsObject(j)) {
        jv out = dsq__jv_dict(r, DSQ__JV_DICT);
        for (const cJSON *c = j->child; c; c = c->next)
            dsq__jdict_set(r, out.u.d, dsq__v_cstr(c->string ? c->string : ""),
                     from_json(r, c, depth + 1));
        return out;
    }
    return dsq__v_none();
}

/* ---- public API ---- */
dsq_chat_template_t *dsq_chat_template_create(const char *src, size_t len,
                                              char *err, size_t err_len)
{
    dsq_chat_template_t *t = NULL;
    if (err && err_len)
        err[0] = 0;
    if (!src) {
        if (err && err_len)
            snprintf(err, err_len, "template: no source");
        goto out;
    }
    t = calloc(1, sizeof(*t));
    if (!t) {
        if (err && err_len)
            snprintf(err, err_len, "template: out of memory");
        goto out;
    }
    t->arena.limit_bytes = DSQ_CHAT_TEMPLATE_MAX_MEMORY_BYTES;
    t->root = dsq__jinja_parse(&t->arena, src, len, err, err_len);
    if (!t->root) {
        dsq_chat_template_destroy(t);
        t = NULL;
    }
out:
    return t;
}

void dsq_chat_template_destroy(dsq_chat_template_t *t)
{
    if (!t)
        return;
    dsq__arena_free(&t->arena);
    free(t);
}

/* setjmp lives here, apart from the caller's locals, so nothing the
 * longjmp could clobber is read after it. */
static int render_inner(dsq__jrender_t *r, const dsq_chat_template_t *t,
                        const cJSON *messages, const cJSON *tools, bool agp,
                        const char *bos, const char *eos, const cJSON *extra,
                        dsq__jbuf_t *out)
{
    if (setjmp(r->jb) != 0)
        return r->code ? r->code : DSQ_EINVAL;
    jv g = dsq__jv_dict(r, DSQ__JV_DICT);
    r->globals = g.u.d;
    dsq__jdict_set(r, g.u.d, dsq__v_cstr("messages"), from_json(r, messages, 0));
    dsq__jdict_set(r, g.u.d, dsq__v_cstr("tools"), tools ? from_json(r, tools, 0) : dsq__v_none());
    dsq__jdict_set(r, g.u.d, dsq__v_cstr("documents"), dsq__v_none());
    dsq__jdict_set(r, g.u.d, dsq__v_cstr("add_generation_prompt"), dsq__v_bool(agp));
    if (bos)
        dsq__jdict_set(r, g.u.d, dsq__v_cstr("bos_token"), dsq__v_cstr(bos));
    if (eos)
        dsq__jdict_set(r, g.u.d, dsq__v_cstr("eos_token"), dsq__v_cstr(eos));
    if (extra)
        for (const cJSON *c = extra->child; c; c = c->next)
            if (c->string)
                dsq__jdict_set(r, g.u.d, dsq__v_cstr(c->string), from_json(r, c, 0));
    r->root = frame_new(r, NULL);
    exec(r, r->root, out, t->root);
    return 0;
}

/* NUL-terminated JSON text as one value (whitespace around it), or NULL
 * with err naming the argument and where its parse stopped. NULL text is
 * NULL, without an error. */
static cJSON *parse_arg(const char *text, const char *what, int *rc, char *err,
                        size_t err_len)
{
    const char *end = NULL;
    cJSON *v = text ? cJSON_ParseWithOpts(text, &end, true) : NULL;
    if (text && !v) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        *rc = DSQ_EINVAL;
        if (err && err_len)
            snprintf(err, err_len, "chat template render: %s is not JSON text (the parse "
                     "stopped at byte %zu)", what, at);
    }
    return v;
}

int dsq_chat_template_render(const dsq_chat_template_t *t,
                             const char *messages_json, const char *tools_json,
                             bool add_generation_prompt, const char *bos,
                             const char *eos, const char *extra_json, char **out,
                             size_t *out_len, char *err, size_t err_len)
{
    int rc = DSQ_EINVAL, parse_rc = DSQ_OK;
    dsq__jrender_t *r = NULL;
    dsq__jbuf_t buf = {0};
    cJSON *messages = NULL, *tools = NULL, *extra = NULL;
    if (err && err_len)
        err[0] = 0;
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (t && out) {
        messages = parse_arg(messages_json, "messages", &parse_rc, err, err_len);
        if (!parse_rc)
            tools = parse_arg(tools_json, "tools", &parse_rc, err, err_len);
        if (!parse_rc)
            extra = parse_arg(extra_json, "extra", &parse_rc, err, err_len);
        if (parse_rc)
            goto undo_json;
    }
    if (!t || !out || !cJSON_IsArray(messages) ||
        (tools && !cJSON_IsArray(tools) && !cJSON_IsNull(tools)) ||
        (extra && !cJSON_IsObject(extra))) {
        if (err && err_len)
            snprintf(err, err_len, "chat template render: bad arguments "
                     "(messages must be an array, tools an array, extra an object)");
        goto undo_json;
    }
    r = calloc(1, sizeof(*r));
    if (!r) {
        rc = DSQ_ENOMEM;
        goto undo_json;
    }
    r->arena.limit_bytes = DSQ_CHAT_TEMPLATE_MAX_MEMORY_BYTES;
    r->err = err;
    r->err_len = err_len;
    rc = render_inner(r, t, messages, cJSON_IsNull(tools) ? NULL : tools,
                      add_generation_prompt, bos, eos, extra, &buf);
    if (rc == 0) {
        char *s = malloc(buf.n + 1);
        if (!s) {
            rc = DSQ_ENOMEM;
            goto undo_arena;
        }
        if (buf.n)
            memcpy(s, buf.p, buf.n);
        s[buf.n] = 0;
        *out = s;
        if (out_len)
            *out_len = buf.n;
    }
undo_arena:
    dsq__arena_free(&r->arena);
    free(r);
undo_json:
    cJSON_Delete(extra);
    cJSON_Delete(tools);
    cJSON_Delete(messages);
    return rc;
}


/* Internals shared by engine/text/jinja.c (lexer + parser), jinja_value.c
 * (values), jinja_filters.c (filters, tests, methods) and chat_template.c
 * (evaluator + public API).
 *
 * Everything a template or a render allocates lives in an arena: the parsed
 * tree in the template's arena (immutable after create, so renders can run
 * on many threads at once), the values of one render in that render's
 * arena. Errors inside the lexer, parser and evaluator longjmp out to the
 * one entry point, which then frees the whole arena: there is no partial
 * state to unwind, so a hostile template cannot leak or crash us. */
#ifndef DSQ_CHAT_TEMPLATE_INTERNAL_H
#define DSQ_CHAT_TEMPLATE_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- arena ---- */
typedef struct dsq__arena_chunk dsq__arena_chunk_t;
typedef struct dsq__arena {
    dsq__arena_chunk_t *head;
    size_t used_bytes;   /* sum of chunk sizes so far */
    size_t limit_bytes;  /* allocation fails past this */
} dsq__arena_t;

/* Returns 16-byte aligned zeroed memory, or NULL when the limit is hit or
 * malloc fails. */
void *dsq__arena_alloc(dsq__arena_t *a, size_t n_bytes);
void dsq__arena_free(dsq__arena_t *a);

/* ---- values ---- */
typedef enum dsq__jv_type {
    DSQ__JV_UNDEF = 0, DSQ__JV_NONE, DSQ__JV_BOOL, DSQ__JV_INT,
    DSQ__JV_FLOAT, DSQ__JV_STR, DSQ__JV_LIST, DSQ__JV_DICT,
    DSQ__JV_NS,     /* namespace(): a dict whose attributes may be set */
    DSQ__JV_MACRO,  /* u.macro: the S_MACRO node */
    DSQ__JV_FUNC,   /* u.i: builtin global function id */
} dsq__jv_type_t;

typedef struct dsq__jlist dsq__jlist_t;
typedef struct dsq__jdict dsq__jdict_t;
struct dsq__jnode;

/* A value. Strings are UTF-8 byte ranges (immutable, not NUL-terminated);
 * for UNDEF, s.p/s.n may hold the missing name for error messages. */
typedef struct dsq__jv {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        dsq__jlist_t *l;
        dsq__jdict_t *d;
        const struct dsq__jnode *macro;
    } u;
} dsq__jv_t;

/* What Python object a list stands for: it changes printing, len(),
 * truth and JSON (Jinja's map/select/... return generators, which
 * transformers' tojson rejects and which are always true). */
enum { DSQ__JL_LIST = 0, DSQ__JL_TUPLE, DSQ__JL_GEN, DSQ__JL_ITEMS,
       DSQ__JL_KEYS, DSQ__JL_VALUES };
struct dsq__jlist { size_t n, cap; dsq__jv_t *v; uint8_t kind; };
struct dsq__jdict { size_t n, cap; dsq__jv_t *k; dsq__jv_t *v; };

/* ---- syntax tree ---- */
typedef enum dsq__jnode_kind {
    /* expressions */
    DSQ__N_LIT, DSQ__N_NAME, DSQ__N_LIST, DSQ__N_DICT, DSQ__N_GETATTR,
    DSQ__N_GETITEM, DSQ__N_SLICE, DSQ__N_CALL, DSQ__N_FILTER, DSQ__N_TEST,
    DSQ__N_UNARY, DSQ__N_BINOP, DSQ__N_AND, DSQ__N_OR, DSQ__N_CMP,
    DSQ__N_COND,
    /* statements */
    DSQ__S_BODY, DSQ__S_TEXT, DSQ__S_OUT, DSQ__S_IF, DSQ__S_FOR, DSQ__S_SET,
    DSQ__S_SETATTR, DSQ__S_SETBLOCK, DSQ__S_MACRO, DSQ__S_BREAK,
    DSQ__S_CONTINUE,
} dsq__jnode_kind_t;

/* Operator codes (op field): single chars for one-char operators, and
 * these for the rest. */
enum {
    DSQ__OP_FLOORDIV = 256, DSQ__OP_POW, DSQ__OP_EQ, DSQ__OP_NE, DSQ__OP_LT,
    DSQ__OP_LE, DSQ__OP_GT, DSQ__OP_GE, DSQ__OP_IN, DSQ__OP_NOTIN,
    DSQ__OP_NOT,
};

typedef struct dsq__jstr { const char *p; size_t n; } dsq__jstr_t;

/* One node. Field use per kind (unused fields are zero):
 *  LIT: lit. NAME: name. LIST: items (op=1: a tuple literal). DICT: items = k0,v0,k1,v1...
 *  GETATTR: a.name. GETITEM: a[b]. SLICE: a[b:c:d] (any may be NULL).
 *  CALL: a(items..., kw_names=kw_vals). FILTER: a|name(items, kw).
 *  TEST: a is [not(op=1)] name(items). UNARY: op a. BINOP: a op b.
 *  AND/OR: a, b. CMP: a (ops[i] items[i])*. COND: a if b else c.
 *  BODY: items = statements. TEXT: name = the text. OUT: {{ a }}.
 *  IF: if a: b else c (c is BODY or IF for elif, or NULL).
 *  FOR: for names in a [if b]: c else d.
 *  SET: names = a. SETATTR: name.attr = a (name, attr).
 *  SETBLOCK: names[0] = render(c). MACRO: name(names = items defaults): c.
 */
typedef struct dsq__jnode {
    dsq__jnode_kind_t kind;
    int line;
    int op;
    dsq__jstr_t name;
    dsq__jstr_t attr;
    dsq__jv_t lit;
    struct dsq__jnode *a, *b, *c, *d;
    struct dsq__jnode **items;
    int n_items;
    int *ops;
    dsq__jstr_t *kw_names;
    struct dsq__jnode **kw_vals;
    int n_kw;
    dsq__jstr_t *names;
    int n_names;
} dsq__jnode_t;

/* Parse a template (source already newline-normalised by the caller is
 * not required: this does it). Nodes and strings live in arena. Returns the
 * root BODY node, or NULL with a one-line reason (with line number) in err.
 * Filters and tests are checked against the supported lists here, so an
 * unsupported construct fails at load, not at the first request. */
dsq__jnode_t *dsq__jinja_parse(dsq__arena_t *arena, const char *src,
                               size_t len, char *err, size_t err_len);

/* Supported filter / test names (shared by parser checks and evaluator). */
bool dsq__jinja_is_filter(const char *p, size_t n);
bool dsq__jinja_is_test(const char *p, size_t n);

/* ---- rendering: shared by chat_template.c (evaluator, API),
 * jinja_value.c (values, printing, JSON) and jinja_filters.c (filters,
 * tests, string and dict methods). All of it runs inside one render, on
 * one thread; errors longjmp to the render entry (dsq__jfail). ---- */

/* growable byte buffer in the render arena */
typedef struct { char *p; size_t n, cap; } dsq__jbuf_t;

struct dsq__jframe;

/* state of one render */
typedef struct dsq__jrender {
    dsq__arena_t arena;
    jmp_buf jb;
    char *err;
    size_t err_len;
    int code;             /* DSQ_E* reported by dsq__jfail */
    int64_t steps;
    int depth;
    int brk;              /* 1 break, 2 continue pending */
    struct dsq__jframe *root;
    dsq__jdict_t *globals;
} dsq__jrender_t;

/* evaluated call arguments: positional, then name=value */
typedef struct {
    dsq__jv_t *pos;
    int n_pos;
    const dsq__jstr_t *kw_names;
    dsq__jv_t *kw;
    int n_kw;
} dsq__jargs_t;

/* json.dumps options */
typedef struct {
    const char *indent;  /* NULL: single line */
    size_t indent_n;
    dsq__jv_t item_sep, key_sep;
    bool sort_keys;
    bool ascii;
} dsq__jjson_opt_t;

/* jinja_value.c. Every function taking r may leave the render through
 * dsq__jfail (DSQ_EINVAL for template/type errors, DSQ_ERANGE for limits). */
/* Report "template line N: <fmt>" (line <= 0: no line) with code; longjmp. */
_Noreturn void dsq__jfail(dsq__jrender_t *r, int code, int line, const char *fmt, ...);
/* Zeroed arena memory; fails the render past the memory limit. */
void *dsq__jalloc(dsq__jrender_t *r, size_t n);
/* Count n evaluation steps; fails the render past the step limit. */
void dsq__jtick(dsq__jrender_t *r, int line, int64_t n);
/* Append bytes; fails the render past the output limit. */
void dsq__jbuf_put(dsq__jrender_t *r, dsq__jbuf_t *b, const char *p, size_t n);
dsq__jv_t dsq__jv_list(dsq__jrender_t *r, size_t cap);
void dsq__jlist_push(dsq__jrender_t *r, dsq__jlist_t *l, dsq__jv_t x);
/* t: DSQ__JV_DICT or DSQ__JV_NS */
dsq__jv_t dsq__jv_dict(dsq__jrender_t *r, uint8_t t);
/* Python type name, for messages */
const char *dsq__jv_type_name(const dsq__jv_t *v);
/* "'name' is undefined" */
_Noreturn void dsq__jfail_undef(dsq__jrender_t *r, int line, const dsq__jv_t *v);
/* UTF-8: decode the code point at p[i] (invalid bytes decode as one byte
 * each), count code points, byte offset of every code point (cnt+1). */
uint32_t dsq__u8_dec(const char *p, size_t n, size_t i, size_t *adv);
size_t dsq__u8_count(const char *p, size_t n);
size_t *dsq__u8_offsets(dsq__jrender_t *r, const char *p, size_t n, size_t *cnt);
/* Python str.isspace() for one code point */
bool dsq__py_space(uint32_t c);
/* Python str(v) appended to b / as a value (undefined gives "") */
void dsq__jput_str(dsq__jrender_t *r, dsq__jbuf_t *b, const dsq__jv_t *v);
dsq__jv_t dsq__jto_str(dsq__jrender_t *r, const dsq__jv_t *v);
/* Python truth, ==, and ordering (-1/0/1; error for unorderable types) */
bool dsq__jv_truthy(const dsq__jv_t *v);
bool dsq__jv_eq(const dsq__jv_t *a, const dsq__jv_t *b);
int dsq__jv_cmp(dsq__jrender_t *r, int line, const dsq__jv_t *a, const dsq__jv_t *b);
/* dict lookup by value / by string key (NULL when missing); insert or replace */
dsq__jv_t *dsq__jdict_find(const dsq__jdict_t *d, const dsq__jv_t *k);
dsq__jv_t *dsq__jdict_get(const dsq__jdict_t *d, const char *p, size_t n);
void dsq__jdict_set(dsq__jrender_t *r, dsq__jdict_t *d, dsq__jv_t k, dsq__jv_t v);
/* Jinja o.name, o[k], o[a:b:c]: missing gives undefined, access on
 * undefined is an error */
dsq__jv_t dsq__jgetattr(dsq__jrender_t *r, int line, const dsq__jv_t *o, const char *p, size_t n);
dsq__jv_t dsq__jgetitem(dsq__jrender_t *r, int line, const dsq__jv_t *o, const dsq__jv_t *k);
dsq__jv_t dsq__jslice(dsq__jrender_t *r, int line, const dsq__jv_t *o, const dsq__jv_t *a,
                      const dsq__jv_t *b, const dsq__jv_t *c);
/* items of an iterable (strings by code point, dicts by key; undefined is
 * empty); len(); `x in hay` */
dsq__jlist_t *dsq__jiter(dsq__jrender_t *r, int line, const dsq__jv_t *v);
int64_t dsq__jlength(dsq__jrender_t *r, int line, const dsq__jv_t *v);
bool dsq__jcontains(dsq__jrender_t *r, int line, const dsq__jv_t *hay, const dsq__jv_t *x);
/* json.dumps(v) appended to b; level is the current indent depth */
void dsq__jjson(dsq__jrender_t *r, int line, dsq__jbuf_t *b, const dsq__jv_t *v,
                const dsq__jjson_opt_t *o, int level);

/* jinja_filters.c */
/* argument idx (positional) or name (keyword); false when absent */
bool dsq__jarg(const dsq__jargs_t *a, int idx, const char *name, dsq__jv_t *out);
/* v as a string / integer, else a type error naming what */
dsq__jv_t dsq__jneed_str(dsq__jrender_t *r, int line, const dsq__jv_t *v, const char *what);
int64_t dsq__jneed_int(dsq__jrender_t *r, int line, const dsq__jv_t *v, const char *what);
/* s.m(args) for a str s; d.m(args) for a dict (*handled false when m is
 * not a dict method) */
dsq__jv_t dsq__jstr_method(dsq__jrender_t *r, int line, const dsq__jv_t *s, dsq__jstr_t m,
                           dsq__jargs_t *a);
dsq__jv_t dsq__jdict_method(dsq__jrender_t *r, int line, const dsq__jv_t *d, dsq__jstr_t m,
                            dsq__jargs_t *a, bool *handled);
/* v|nm(args) and `v is nm(args)` */
dsq__jv_t dsq__jfilter(dsq__jrender_t *r, int line, dsq__jstr_t nm, const dsq__jv_t *v,
                       dsq__jargs_t *a);
bool dsq__jtest(dsq__jrender_t *r, int line, dsq__jstr_t nm, const dsq__jv_t *v,
                dsq__jargs_t *a);

/* small constructors and predicates */
static inline void dsq__sb_str(dsq__jrender_t *r, dsq__jbuf_t *b, const char *s) { dsq__jbuf_put(r, b, s, strlen(s)); }
static inline void dsq__sb_ch(dsq__jrender_t *r, dsq__jbuf_t *b, char c) { dsq__jbuf_put(r, b, &c, 1); }
static inline dsq__jv_t dsq__v_undef(const char *p, size_t n)
{
    dsq__jv_t v = {.t = DSQ__JV_UNDEF};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline dsq__jv_t dsq__v_none(void) { return (dsq__jv_t){.t = DSQ__JV_NONE}; }
static inline dsq__jv_t dsq__v_bool(bool b) { dsq__jv_t v = {.t = DSQ__JV_BOOL}; v.u.b = b; return v; }
static inline dsq__jv_t dsq__v_int(int64_t i) { dsq__jv_t v = {.t = DSQ__JV_INT}; v.u.i = i; return v; }
static inline dsq__jv_t dsq__v_float(double f) { dsq__jv_t v = {.t = DSQ__JV_FLOAT}; v.u.f = f; return v; }
static inline dsq__jv_t dsq__v_str(const char *p, size_t n)
{
    dsq__jv_t v = {.t = DSQ__JV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static inline dsq__jv_t dsq__v_sb(dsq__jbuf_t *b) { return dsq__v_str(b->p ? b->p : "", b->n); }
static inline dsq__jv_t dsq__v_cstr(const char *s) { return dsq__v_str(s, strlen(s)); }
static inline bool dsq__is_num(const dsq__jv_t *v)
{
    return v->t == DSQ__JV_INT || v->t == DSQ__JV_FLOAT || v->t == DSQ__JV_BOOL;
}
static inline double dsq__num_f(const dsq__jv_t *v)
{
    return v->t == DSQ__JV_FLOAT ? v->u.f : v->t == DSQ__JV_INT ? (double)v->u.i
                                                                 : (double)v->u.b;
}
static inline bool dsq__is_intlike(const dsq__jv_t *v)
{
    return v->t == DSQ__JV_INT || v->t == DSQ__JV_BOOL;
}
static inline int64_t dsq__int_of(const dsq__jv_t *v)
{
    return v->t == DSQ__JV_INT ? v->u.i : (int64_t)v->u.b;
}
static inline bool dsq__str_eq(const dsq__jv_t *v, const char *s)
{
    return v->t == DSQ__JV_STR && v->u.s.n == strlen(s) &&
           memcmp(v->u.s.p, s, v->u.s.n) == 0;
}
static inline bool dsq__jstr_is(dsq__jstr_t s, const char *c)
{
    return s.n == strlen(c) && memcmp(s.p, c, s.n) == 0;
}

#endif

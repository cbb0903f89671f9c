/* JSON Schema -> GBNF (grammar.h), the text the grammar compiler takes.
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
 * Schemas arrive as JSON text and are parsed here (cJSON), so callers
 * never hand the engine a parsed request and the parsed tree never
 * leaves this file. A schema's "pattern" goes to grammar_regex.c, numeric
 * bounds to the ranges of grammar_gbnf_text.c. The tool-call grammar
 * (grammar_tools.c) has each function's arguments made here
 * (dsq__schema_args_expr), all in one conversion, so their rules share
 * one numbering. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/common/error.h"
#include "grammar_gbnf_internal.h"

#define MAX_SCHEMA_DEPTH 64
#define MAX_REFS 256

typedef dsq__sbuf_t sbuf_t;
typedef dsq__bounds_t bounds_t;

/* ---------------------------------------------------------- shared rules */

/* JSON pieces every schema grammar may use (RFC 8259): ws as the
 * json_object built-in; jchar1 is one code point (no \u escape of a
 * surrogate, whose pair would count as one character of a length bound
 * but two here). */
const char dsq__schema_base_rules[] =
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

struct dsq__conv {
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
};
typedef dsq__conv_t conv_t;

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
    dsq__sb_fmt(&c->rules, "s%d ::= ", id);
    dsq__sb_add(&c->rules, body->p ? body->p : "jempty", body->p ? body->n : 6);
    dsq__sb_str(&c->rules, "\n");
    return id;
}

static int schema_expr(conv_t *c, const cJSON *s, sbuf_t *out);

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
        dsq__sb_str(o, obj ? "\"{\" ws " : "\"[\" ws ");
        const cJSON *e;
        int i = 0;
        cJSON_ArrayForEach(e, v) {
            if (i++)
                dsq__sb_str(o, "\",\" ws ");
            if (obj) {
                cJSON *k = cJSON_CreateString(e->string);
                char *kt = k ? cJSON_PrintUnformatted(k) : NULL;
                cJSON_Delete(k);
                if (!kt)
                    return fail(c, DSQ_ENOMEM, "out of memory");
                dsq__sb_lit(o, kt, strlen(kt));
                free(kt);
                dsq__sb_str(o, " ws \":\" ws ");
            }
            int rc = value_literal(c, e, o);
            if (rc)
                return rc;
            dsq__sb_str(o, "ws ");
        }
        dsq__sb_str(o, obj ? "\"}\" " : "\"]\" ");
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
        dsq__sb_lit(o, num, strlen(num));
        dsq__sb_str(o, " ");
        return DSQ_OK;
    }
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt)
        return fail(c, DSQ_ENOMEM, "out of memory");
    dsq__sb_lit(o, txt, strlen(txt));
    dsq__sb_str(o, " ");
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
        dsq__sb_str(o, "\"\\\"\" ");
        /* JSON Schema's pattern is a search: unanchored ends match anything */
        sbuf_t body = {0};
        rc = dsq__regex_expr(pat->valuestring, strlen(pat->valuestring), true, &body, &st, &en, msg,
                             sizeof(msg));
        if (rc) {
            free(body.p);
            return fail(c, rc, "'pattern': %s", msg);
        }
        if (!st)
            dsq__sb_str(o, "jchar* ");
        dsq__sb_add(o, body.p, body.n);
        free(body.p);
        if (!en)
            dsq__sb_str(o, "jchar* ");
        dsq__sb_str(o, "\"\\\"\" ");
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
                dsq__sb_fmt(o, "\"\\\"\" ( %s ) \"\\\"\" ", f[i].gbnf);
                return DSQ_OK;
            }
        }
        return fail(c, DSQ_EUNSUPPORTED, "'format' \"%.40s\" is not supported (supported: "
                    "date, time, date-time, uuid, email, ipv4)", fmt->valuestring);
    }
    if (mn < 0 && mx < 0) {
        dsq__sb_str(o, "jstring ");
        return DSQ_OK;
    }
    if (mn < 0)
        mn = 0;
    if (mx >= 0 && mx < mn)
        return fail(c, DSQ_EINVAL, "maxLength %ld is below minLength %ld", mx, mn);
    if (mx < 0)
        dsq__sb_fmt(o, "\"\\\"\" jchar1{%ld,} \"\\\"\" ", mn);
    else
        dsq__sb_fmt(o, "\"\\\"\" jchar1{%ld,%ld} \"\\\"\" ", mn, mx);
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
    dsq__sb_str(o, "\"[\" ws ");
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
                dsq__sb_str(o, "\",\" ws ");
            rc = schema_expr(c, cJSON_GetArrayItem(prefix, (int)i), o);
            path_pop(c, p0);
            if (rc)
                return rc;
            dsq__sb_str(o, "ws ");
        }
        dsq__sb_str(o, "\"]\" ");
        return DSQ_OK;
    }
    sbuf_t it = {0};
    if (items && cJSON_IsFalse(items)) {
        if (mn > 0)
            return fail(c, DSQ_EINVAL, "'items' false with minItems %ld", mn);
        dsq__sb_str(o, "\"]\" ");
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
        dsq__sb_str(&it, "jvalue ");
    }
    if (it.oom) {
        free(it.p);
        return fail(c, DSQ_ENOMEM, "out of memory");
    }
    int r = add_rule(c, &it);
    free(it.p);
    if (mx == 0) {
        dsq__sb_str(o, "\"]\" ");
        return DSQ_OK;
    }
    if (mn == 0)
        dsq__sb_str(o, "( ");
    dsq__sb_fmt(o, "s%d ws ( \",\" ws s%d ws )", r, r);
    long lo = mn > 0 ? mn - 1 : 0;
    if (mx < 0)
        dsq__sb_fmt(o, "{%ld,} ", lo);
    else
        dsq__sb_fmt(o, "{%ld,%ld} ", lo, mx - 1);
    if (mn == 0)
        dsq__sb_str(o, ")? ");
    dsq__sb_str(o, "\"]\" ");
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
            dsq__sb_str(o, "jobject ");
            return DSQ_OK;
        }
        if (cJSON_IsFalse(add)) {
            dsq__sb_str(o, "\"{\" ws \"}\" ");
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
        dsq__sb_fmt(o, "\"{\" ws ( jstring ws \":\" ws s%d ws ( \",\" ws jstring ws \":\" ws s%d "
                       "ws )* )? \"}\" ", r, r);
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
        dsq__sb_lit(&b, key, strlen(key));
        free(key);
        dsq__sb_str(&b, " ws \":\" ws ");
        if (p[i].schema) {
            size_t p0 = path_push(c, p[i].additional ? "additionalProperties" : "properties");
            if (!p[i].additional)
                path_push(c, p[i].name);
            rc = schema_expr(c, p[i].schema, &b);
            path_pop(c, p0);
        } else {
            dsq__sb_str(&b, "jvalue ");
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
            dsq__sb_fmt(&a, "\",\" ws s%d ws ", kv[i]);
        else
            dsq__sb_fmt(&a, "( \",\" ws s%d ws )? ", kv[i]);
        if (i + 1 < n)
            dsq__sb_fmt(&a, "s%d ", ra[i + 1]);
        ra[i] = add_rule(c, &a);
        dsq__sb_fmt(&f, "s%d ws ", kv[i]);
        if (i + 1 < n)
            dsq__sb_fmt(&f, "s%d ", ra[i + 1]);
        if (!p[i].required)
            dsq__sb_fmt(&f, "| %s ", i + 1 < n ? "" : "jempty");
        if (!p[i].required && i + 1 < n)
            dsq__sb_fmt(&f, "s%d ", rf[i + 1]);
        if (a.oom || f.oom)
            rc = fail(c, DSQ_ENOMEM, "out of memory");
        rf[i] = add_rule(c, &f);
        free(a.p);
        free(f.p);
    }
    if (!rc)
        dsq__sb_fmt(o, "\"{\" ws s%d \"}\" ", rf[0]);
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
    dsq__sb_str(o, "( ");
    int i = 0, rc = DSQ_OK;
    const cJSON *b;
    cJSON_ArrayForEach(b, list) {
        size_t p0 = path_push(c, key);
        path_push_i(c, i);
        dsq__sb_str(o, i ? "| " : "");
        rc = schema_expr(c, b, o);
        path_pop(c, p0);
        if (rc)
            return rc;
        i++;
    }
    dsq__sb_str(o, ") ");
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
    case JT_NULL: dsq__sb_str(o, "\"null\" "); return DSQ_OK;
    case JT_BOOL: dsq__sb_str(o, "( \"true\" | \"false\" ) "); return DSQ_OK;
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
            dsq__sb_str(o, type == JT_INTEGER ? "jint " : "jnumber ");
        else if (type == JT_INTEGER)
            dsq__int_expr(o, &bd);
        else
            dsq__num_expr(o, &bd);
        return DSQ_OK;
    }
    }
    return fail(c, DSQ_EINVAL, "unknown type");
}

static int schema_expr(conv_t *c, const cJSON *s, sbuf_t *o)
{
    if (cJSON_IsTrue(s)) {
        dsq__sb_str(o, "jvalue ");
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
                        dsq__sb_fmt(&c->rules, "s%d ::= ", c->refs[i].rule);
                        dsq__sb_add(&c->rules, b.p, b.n);
                        dsq__sb_str(&c->rules, "\n");
                    }
                    free(b.p);
                }
                if (!rc)
                    dsq__sb_fmt(o, "s%d ", c->refs[i].rule);
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
        dsq__sb_str(o, "( ");
        int n = 0;
        const cJSON *v = en ? en->child : cn;
        for (; v; v = en ? v->next : NULL) {
            int vt = value_types(v);
            if (types != -1 && !(vt & types) && !((vt & JT_INTEGER) && (types & JT_NUMBER)))
                continue;
            dsq__sb_str(o, n ? "| " : "");
            if ((rc = value_literal(c, v, o)))
                goto out;
            n++;
        }
        dsq__sb_str(o, ") ");
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
            dsq__sb_str(o, "jvalue ");
            goto out;
        }
    }
    int n = 0;
    dsq__sb_str(o, "( ");
    for (int b = JT_NULL; b <= JT_NUMBER && !rc; b <<= 1) {
        if (!(types & b))
            continue;
        dsq__sb_str(o, n ? "| " : "");
        rc = typed_expr(c, s, b, o);
        n++;
    }
    dsq__sb_str(o, ") ");
out:
    c->depth--;
    return rc;
}

/* text[0..len) parsed as one JSON value (whitespace around it allowed),
 * or NULL when it is not JSON text (or out of memory: cJSON cannot tell
 * the two apart); then *bad_byte is the offset where the parse stopped. */
static cJSON *parse_json(const char *text, size_t len, size_t *bad_byte)
{
    const char *end = NULL;
    cJSON *v = text ? cJSON_ParseWithLengthOpts(text, len, &end, false) : NULL;
    size_t at = end && end >= text ? (size_t)(end - text) : 0;
    /* cJSON stops after the value; only whitespace may follow it */
    while (v && at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' ||
                             text[at] == '\r'))
        at++;
    if (v && at < len) {
        cJSON_Delete(v);
        v = NULL;
    }
    if (!v)
        *bad_byte = at;
    return v;
}

static int gbnf_from_schema(const cJSON *schema, char **gbnf, char *err, size_t err_len)
{
    conv_t c = {.root = schema, .err = err, .err_len = err_len};
    sbuf_t root = {0};
    dsq__sb_str(&root, "root ::= ");
    int rc = schema_expr(&c, schema, &root);
    dsq__sb_str(&root, "\n");
    if (!rc)
        dsq__sb_add(&root, c.rules.p ? c.rules.p : "", c.rules.n);
    dsq__sb_str(&root, dsq__schema_base_rules);
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

int dsq_grammar_gbnf_from_json_schema(const char *schema_json, size_t len, char **gbnf,
                                      char *err, size_t err_len)
{
    size_t bad = 0;
    *gbnf = NULL;
    cJSON *schema = parse_json(schema_json, len, &bad);
    if (!schema) {
        snprintf(err, err_len, "the schema is not JSON text (the parse stopped at byte %zu)",
                 bad);
        return DSQ_EINVAL;
    }
    int rc = gbnf_from_schema(schema, gbnf, err, err_len);
    cJSON_Delete(schema);
    return rc;
}

/* ------------------------------------------------------ function arguments */

dsq__conv_t *dsq__conv_create(char *err, size_t err_len)
{
    conv_t *c = calloc(1, sizeof(*c));
    if (c) {
        c->err = err;
        c->err_len = err_len;
    }
    return c;
}

void dsq__conv_destroy(dsq__conv_t *c)
{
    if (!c)
        return;
    free(c->rules.p);
    free(c);
}

const dsq__sbuf_t *dsq__conv_rules(const dsq__conv_t *c) { return &c->rules; }

int dsq__schema_args_expr(dsq__conv_t *c, const char *params_json, const char *path,
                          dsq__sbuf_t *o)
{
    char *err = c->err;
    size_t err_len = c->err_len, bad = 0;
    int rc = DSQ_OK;
    cJSON *params = params_json ? parse_json(params_json, strlen(params_json), &bad) : NULL;
    if (params_json && !params) {
        snprintf(err, err_len, "%s: not JSON text (the parse stopped at byte %zu)", path, bad);
        return DSQ_EINVAL;
    }
    /* each tool's parameters on their own: refs resolve inside them.
     * The arguments are an object whatever the schema says of the
     * type (none, or absent parameters: any object) */
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(params, "type");
    if (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "object"))) {
        snprintf(err, err_len, "%s: the arguments are an object, so its \"type\" must be "
                 "\"object\"", path);
        rc = DSQ_EINVAL;
    }
    /* without "type", a composition, $ref, enum or const could admit
     * values other than an object, which the grammar would then force
     * and the parser refuse: refused here, as OpenAI does */
    static const char *const decides[] = {"anyOf", "oneOf", "allOf", "$ref", "enum",
                                          "const"};
    for (size_t k = 0; !ty && k < sizeof(decides) / sizeof(decides[0]); k++) {
        if (cJSON_GetObjectItemCaseSensitive(params, decides[k])) {
            snprintf(err, err_len, "%s: the arguments are an object, so it needs \"type\": "
                     "\"object\" (it has '%s' and no \"type\")", path, decides[k]);
            rc = DSQ_EINVAL;
            break;
        }
    }
    cJSON *any = params;
    if (!rc && !cJSON_IsObject(params)) {   /* then ty is NULL: only objects have members */
        cJSON_Delete(params);
        any = cJSON_CreateObject();
    }
    if (!rc && (!any || (!ty && !cJSON_AddStringToObject(any, "type", "object"))))
        rc = DSQ_ENOMEM;
    if (!rc) {
        c->root = any;
        c->n_refs = 0;
        snprintf(c->path, sizeof(c->path), "%s", path);
        rc = schema_expr(c, any, o);
    }
    cJSON_Delete(any);
    return rc;
}

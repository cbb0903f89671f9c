/* What the converters to GBNF text share: grammar_gbnf_text.c (the text
 * buffer and numeral ranges), grammar_regex.c (regex -> GBNF),
 * grammar_schema.c (JSON Schema -> GBNF) and grammar_tools.c (the
 * tool-call grammar, made of the tools' schemas). Each converter writes
 * GBNF text for grammar.c to compile; none of them compiles anything.
 * Not a public header: cJSON appears here because the schema converter
 * walks a parsed schema, which only the engine's own files parse. */
#ifndef DSQ_GRAMMAR_GBNF_INTERNAL_H
#define DSQ_GRAMMAR_GBNF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "grammar.h"

/* ---- text (grammar_gbnf_text.c) ---- */

/* A growing NUL-terminated text. An append that cannot allocate sets oom
 * and every later append does nothing, so a converter checks oom once,
 * at the end, instead of after each piece. {0} is an empty buffer; p is
 * NULL until the first non-empty append. */
typedef struct dsq__sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} dsq__sbuf_t;

/* Append n bytes of s (s may be NULL when n is 0). */
void dsq__sb_add(dsq__sbuf_t *b, const char *s, size_t n);
void dsq__sb_str(dsq__sbuf_t *b, const char *s);
void dsq__sb_fmt(dsq__sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A GBNF literal of n bytes: '"' and '\\' escaped, control bytes \xHH,
 * other bytes (UTF-8 included) as they are. */
void dsq__sb_lit(dsq__sbuf_t *b, const char *s, size_t n);

/* Whole bounds of an integer or a number, inclusive. */
typedef struct dsq__bounds {
    bool has_lo, has_hi;
    int64_t lo, hi;                /* inclusive */
} dsq__bounds_t;

/* One GBNF expression for the integers in bd (decimal, no leading zeros,
 * no "-0", at most 16 digits when a side is unbounded). */
void dsq__int_expr(dsq__sbuf_t *o, const dsq__bounds_t *bd);
/* Numbers in bd: the integers of dsq__int_expr with a fraction (rule
 * jfrac) wherever the value stays inside the bounds; no exponent. */
void dsq__num_expr(dsq__sbuf_t *o, const dsq__bounds_t *bd);

/* ---- regex (grammar_regex.c) ---- */

/* The regex re[0..len) as one GBNF expression appended to o. json:
 * characters as they are written inside a JSON string (a schema's
 * "pattern"), else as themselves; *start / *end: whether ^ / $ anchored
 * it. Errors as dsq_grammar_gbnf_from_regex, with one line in err. */
int dsq__regex_expr(const char *re, size_t len, bool json, dsq__sbuf_t *o, bool *start,
                    bool *end, char *err, size_t err_len);

/* ---- JSON Schema (grammar_schema.c) ---- */

#define DSQ__SCHEMA_MAX_REFS 256

/* One conversion: the rules made so far (sN ::= ..., numbered from 0),
 * the $ref targets already given a rule, and where in the schema it is
 * (a JSON pointer, for messages). Several schemas may go through one
 * conv in turn (the tools' parameters): rule numbers keep counting, and
 * root, n_refs and path are set again for each. */
typedef struct dsq__conv {
    const cJSON *root;             /* what "#" of a $ref names              */
    dsq__sbuf_t rules;             /* rule definitions made so far          */
    int n_rules;
    struct {
        const cJSON *target;
        int rule;
    } refs[DSQ__SCHEMA_MAX_REFS];
    int n_refs;
    char path[512];                /* JSON pointer of the schema at hand    */
    char *err;
    size_t err_len;
    int depth;
} dsq__conv_t;

/* The rules every schema grammar may use (ws, jstring, jvalue, ...). */
extern const char dsq__schema_base_rules[];

/* Schema s as one GBNF expression appended to out; rules it needs go to
 * c->rules. Errors as dsq_grammar_gbnf_from_json_schema, with one line
 * in c->err naming the keyword and c->path. */
int dsq__schema_expr(dsq__conv_t *c, const cJSON *s, dsq__sbuf_t *out);

/* text[0..len) parsed as one JSON value (whitespace around it allowed),
 * or NULL when it is not JSON text (or out of memory: cJSON cannot tell
 * the two apart); then *bad_byte is the offset where the parse stopped.
 * The caller frees the tree with cJSON_Delete. */
cJSON *dsq__schema_parse(const char *text, size_t len, size_t *bad_byte);

#endif

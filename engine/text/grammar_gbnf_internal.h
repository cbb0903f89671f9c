/* What the converters to GBNF text share: grammar_gbnf_text.c (the text
 * buffer and numeral ranges), grammar_regex.c (regex -> GBNF),
 * grammar_schema.c (JSON Schema -> GBNF) and grammar_tools.c (the
 * tool-call grammar, made of the tools' schemas). Each converter writes
 * GBNF text for grammar.c to compile; none of them compiles anything.
 * Schemas cross this header as JSON text: the parsed trees stay inside
 * grammar_schema.c. Not a public header. */
#ifndef DSQ_GRAMMAR_GBNF_INTERNAL_H
#define DSQ_GRAMMAR_GBNF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* The rules every schema grammar may use (ws, jstring, jvalue, ...). */
extern const char dsq__schema_base_rules[];

/* One conversion that several schemas go through in turn (the tools'
 * parameters): the rules they make ("sN ::= ..." lines) are numbered on
 * from one schema to the next, so they can share one grammar. err, and
 * its length, is where each failing call writes its one line. NULL on
 * out of memory; destroy with dsq__conv_destroy (NULL: no-op). */
typedef struct dsq__conv dsq__conv_t;
dsq__conv_t *dsq__conv_create(char *err, size_t err_len);
void dsq__conv_destroy(dsq__conv_t *c);
/* The rules made so far, owned by c. */
const dsq__sbuf_t *dsq__conv_rules(const dsq__conv_t *c);

/* The arguments of a function as one GBNF expression appended to o: a
 * JSON object valid against the parameters schema, the JSON text
 * params_json (NUL-terminated; NULL, or a value that is not an object:
 * any object), with "type": "object" added where it has no type; a $ref
 * resolves inside it. path is the JSON pointer errors name it by
 * (/tools/N/function/parameters). Errors as
 * dsq_grammar_gbnf_from_json_schema, and DSQ_EINVAL for a "type" other
 * than "object", or none beside a composition, $ref, enum or const
 * (which could admit other values). */
int dsq__schema_args_expr(dsq__conv_t *c, const char *params_json, const char *path,
                          dsq__sbuf_t *o);

#endif

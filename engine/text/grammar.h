/* Grammar-constrained decoding: a context-free grammar compiled from GBNF
 * text, a matcher that follows one sequence's output through it byte by
 * byte, and the token mask ("which vocabulary entries may come next") the
 * sampler applies before temperature, top-k/p and penalties.
 *
 * GBNF is llama.cpp's grammar notation (llama.cpp grammars/README.md):
 *     root   ::= object
 *     object ::= "{" ws ( pair ( "," ws pair )* )? "}"
 *     ws     ::= [ \t\n]*
 * rules `name ::= alternatives`; alternatives separated by `|`; literals
 * "..." and character classes [a-z0-9_], [^"\\] with the escapes \n \r \t
 * \\ \" \' \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH; `.` any character; groups
 * ( ... ); the repetitions *, +, ?, {m}, {m,}, {m,n}; comments from # to
 * the end of the line. Whitespace, newlines included, separates items; a
 * rule ends where the next `name ::=` starts. Characters are Unicode code
 * points; the matcher takes UTF-8 bytes, so a token that ends inside a
 * multi-byte character is allowed when some completion of that character
 * can match.
 *
 * How it runs: the grammar is a pushdown automaton. The matcher's state is
 * a set of stacks of grammar positions (the top is the next character
 * class to match; an empty stack means the text so far is a complete
 * sentence), as in llama.cpp's llama-grammar.cpp and the classic Earley /
 * GLR view of a CFG. The mask walks the vocabulary in sorted byte order
 * (a trie walk: tokens sharing a prefix share its work, and a rejected
 * prefix skips every token under it) and is cached per matcher state, so
 * a state seen before costs one hash lookup (XGrammar, Dong et al. 2024,
 * caches per state in the same spirit).
 *
 * Thread safety: a dsq_grammar_t and a dsq_grammar_vocab_t are immutable
 * after creation and may be shared by any number of matchers on any
 * threads; the grammar's mask cache is guarded by its own mutex. A
 * matcher belongs to one thread at a time.
 */
#ifndef DSQ_GRAMMAR_H
#define DSQ_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "tool_calls.h"

typedef struct dsq_grammar dsq_grammar_t;
typedef struct dsq_grammar_vocab dsq_grammar_vocab_t;
typedef struct dsq_grammar_matcher dsq_grammar_matcher_t;

/* Limits a grammar is held to (a request's grammar is untrusted input). */
#define DSQ_GRAMMAR_MAX_SOURCE   (1u << 20)  /* bytes of GBNF text            */
#define DSQ_GRAMMAR_MAX_ELEMENTS (1u << 20)  /* compiled elements, after
                                               repetitions are expanded     */
#define DSQ_GRAMMAR_MAX_NESTING  128         /* ( ) depth                    */
#define DSQ_GRAMMAR_MAX_REPEAT   1024        /* m and n of {m,n}             */
#define DSQ_GRAMMAR_MAX_STACKS   1024        /* stacks one state may hold    */
#define DSQ_GRAMMAR_MAX_DEPTH    1024        /* positions one stack may hold */
#define DSQ_GRAMMAR_MAX_MASK_WORK (1ull << 28)  /* stack steps + comparisons
                                               one mask may take (~1 s)     */

/* Compile GBNF text (len bytes, need not be NUL-terminated) with start rule
 * `root` (NULL: "root"). On success *out owns the grammar (free with
 * dsq_grammar_free). Errors, each with one line in err naming the line and
 * column or the rule: DSQ_EINVAL (syntax error, undefined or twice-defined
 * rule, missing start rule, a rule that can recurse without consuming
 * input (left recursion, also `x*` of an x that can be empty), a limit
 * above exceeded, invalid UTF-8 in the text), DSQ_ERANGE (more than
 * DSQ_GRAMMAR_MAX_STACKS alternatives open at the start, which the matcher
 * could not follow), DSQ_ENOMEM.
 * The last 8 grammars compiled are kept, keyed by (root, text): the same
 * text again returns another reference to the same grammar, with the mask
 * cache its earlier requests warmed (a client sends the same schema with
 * every request; XGrammar's compiler cache does the same). Each grammar's
 * mask cache holds at most 16 MiB, so the kept grammars at most 128 MiB. */
int dsq_grammar_from_gbnf(const char *src, size_t len, const char *root,
                          dsq_grammar_t **out, char *err, size_t err_len);

/* Drop the references the registry of dsq_grammar_from_gbnf holds (tests,
 * shutdown); grammars still referenced elsewhere live on. Thread-safe. */
void dsq_grammar_registry_clear(void);

/* Drop one reference (the creator holds the first); the last frees the
 * grammar. NULL is a no-op. Every matcher made from it must be freed
 * before the last reference goes. */
void dsq_grammar_free(dsq_grammar_t *g);

/* Take another reference (thread-safe); returns g. */
dsq_grammar_t *dsq_grammar_retain(dsq_grammar_t *g);

/* Compile one of the built-in grammars of the API:
 *  - DSQ_GRAMMAR_JSON_OBJECT: one JSON object (RFC 8259), as OpenAI's
 *    response_format {"type": "json_object"}; whitespace between tokens
 *    at most 16 characters a gap, so the model cannot loop on spaces.
 *  - DSQ_GRAMMAR_JSON_VALUE: any JSON value, same whitespace rule.
 * Errors as dsq_grammar_from_gbnf (only DSQ_ENOMEM in practice). */
typedef enum dsq_grammar_builtin {
    DSQ_GRAMMAR_JSON_OBJECT = 0,
    DSQ_GRAMMAR_JSON_VALUE = 1,
} dsq_grammar_builtin_t;
int dsq_grammar_builtin(dsq_grammar_builtin_t which, dsq_grammar_t **out, char *err,
                        size_t err_len);

/* A grammar whose sentences are exactly the n strings (vLLM's
 * guided_choice): each a UTF-8 string, NUL-terminated, non-empty. Errors:
 * DSQ_EINVAL (n < 1, an empty or non-UTF-8 choice; err says which),
 * DSQ_ENOMEM. */
int dsq_grammar_from_choices(const char *const *choices, int n, dsq_grammar_t **out,
                             char *err, size_t err_len);

/* GBNF text (for dsq_grammar_from_gbnf, start rule "root") whose
 * sentences are instances valid against a JSON Schema (2020-12
 * Validation vocabulary, draft 4-7 spellings read too; engine/text/
 * grammar_schema.c), given as JSON text: schema_json[0..len), UTF-8, need
 * not be NUL-terminated, one JSON value with whitespace around it; read
 * during the call only. Supported: type (a name or a list), enum, const,
 * properties, required, additionalProperties, items, prefixItems (and
 * draft 4-7 tuple items), additionalItems, minItems, maxItems,
 * uniqueItems false, minLength, maxLength, pattern (the regex subset of
 * dsq_grammar_gbnf_from_regex, a search as JSON Schema says), format
 * (date, time, date-time, uuid, email, ipv4), minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (whole bounds; a number's bounds
 * inclusive), anyOf, oneOf (branches of different types), allOf of one
 * schema, $ref to a JSON pointer inside the schema (recursion included),
 * and the annotations (title, description, default, examples, $defs...).
 * The grammar is narrower than the schema where that keeps it exact:
 * properties in the schema's order, no additional ones, bounded
 * whitespace and digits. On success *gbnf is malloc'd text the caller
 * frees. Errors, with one line in err naming the keyword and its JSON
 * pointer: DSQ_EUNSUPPORTED (a keyword or combination outside that
 * subset), DSQ_EINVAL (text that is not JSON: err gives the byte where the
 * parse stopped; a malformed schema, or one no instance satisfies),
 * DSQ_ERANGE (nesting, counts or size beyond the grammar limits),
 * DSQ_ENOMEM. */
int dsq_grammar_gbnf_from_json_schema(const char *schema_json, size_t len, char **gbnf,
                                      char *err, size_t err_len);

/* One function of a request's tools, OpenAI's {"type": "function",
 * "function": {"name", "description", "parameters"}}, as server/ reads it
 * out of the request. Both strings are NUL-terminated and borrowed for
 * the call that takes them. */
typedef struct dsq_tool_fn {
    const char *name;             /* NULL: the entry has no usable name and
                                     is never chosen (it still has its
                                     index in the tools array)              */
    const char *parameters_json;  /* the parameters JSON Schema as JSON
                                     text; NULL: none (any object)          */
} dsq_tool_fn_t;

/* GBNF text whose sentences are tool calls in the model's own syntax
 * (tool_calls.h: DSQ_TOOL_PARSER_HERMES or _DEEPSEEK, as its chat template
 * writes them) of the functions fns[0..n_fns) (fns[i] is tools[i] of the
 * request), each call's arguments a JSON object valid against that
 * function's parameters schema (as dsq_grammar_gbnf_from_json_schema,
 * with "type": "object" added where the schema has no type, composition,
 * $ref, enum or const; no parameters, or a JSON value that is not an
 * object: any object; a "type" other than "object": DSQ_EINVAL). name:
 * only that function (tool_choice {"type": "function", ...}), NULL: any
 * (tool_choice "required"). parallel: 1 to DSQ_GRAMMAR_MAX_TOOL_CALLS
 * calls, else exactly one. *gbnf as above. Errors: those of the schema
 * conversion (err names the tool's parameters by JSON pointer,
 * /tools/N/function/parameters, N the index in fns), DSQ_EINVAL (no such
 * tool, no tools, format NONE, parameters that are not JSON text),
 * DSQ_ERANGE, DSQ_ENOMEM. */
#define DSQ_GRAMMAR_MAX_TOOL_CALLS 8
int dsq_grammar_gbnf_for_tool_calls(const dsq_tool_fn_t *fns, int n_fns, const char *name,
                                    dsq_tool_parser_t format, bool parallel, char **gbnf,
                                    char *err, size_t err_len);

/* GBNF text whose sentences are exactly the strings the regex re (len
 * bytes, UTF-8) matches in full (Python re.fullmatch; vLLM's
 * guided_regex). The dialect: literals, ., [...] with ranges and ^, \d \w
 * \s \D \W \S, \n \t \r \f \v \xHH \uHHHH and escaped punctuation,
 * groups ( ), (?: ), (?P<name> ), (?<name> ), |, * + ? {m} {m,} {m,n}
 * (lazy forms the same), ^ first and $ last. *gbnf as above. Errors:
 * DSQ_EUNSUPPORTED (backreferences, lookaround, \b and other anchors,
 * inline flags, possessive quantifiers), DSQ_EINVAL (a malformed regex;
 * err gives the byte offset), DSQ_ERANGE (a repetition above
 * DSQ_GRAMMAR_MAX_REPEAT, deep nesting, a long regex), DSQ_ENOMEM. */
int dsq_grammar_gbnf_from_regex(const char *re, size_t len, char **gbnf, char *err,
                                size_t err_len);

/* Number of rules (including the ones synthesised for groups and
 * repetitions) and of compiled elements: for logs and tests. */
int dsq_grammar_n_rules(const dsq_grammar_t *g);
int dsq_grammar_n_elements(const dsq_grammar_t *g);

/* The vocabulary as the mask walks it: every token's decoded bytes
 * (dsq_tokenizer_token_bytes), sorted, with the longest common prefix of
 * neighbours. Control tokens and tokens with no bytes are never allowed by
 * a grammar; the end-of-generation tokens (dsq_tokenizer_is_eog) are
 * allowed exactly where the grammar accepts. t must outlive the result.
 * NULL on out of memory. One per model, shared by every matcher. */
dsq_grammar_vocab_t *dsq_grammar_vocab_create(const dsq_tokenizer_t *t);
void dsq_grammar_vocab_free(dsq_grammar_vocab_t *v);  /* NULL is a no-op */
int32_t dsq_grammar_vocab_size(const dsq_grammar_vocab_t *v);

/* A matcher at the start of g. NULL on out of memory. */
dsq_grammar_matcher_t *dsq_grammar_matcher_create(const dsq_grammar_t *g);
void dsq_grammar_matcher_free(dsq_grammar_matcher_t *m);  /* NULL: no-op */

/* A copy of m in its current state (n > 1 / best_of forks). NULL on out of
 * memory. */
dsq_grammar_matcher_t *dsq_grammar_matcher_clone(const dsq_grammar_matcher_t *m);

/* Advance by n bytes of output. DSQ_OK, or DSQ_EINVAL when the bytes
 * cannot continue any sentence of the grammar (invalid UTF-8 included);
 * then the state is unchanged. DSQ_ENOMEM leaves it unchanged too. */
int dsq_grammar_matcher_accept_bytes(dsq_grammar_matcher_t *m, const void *bytes,
                                     size_t n);

/* Advance by one sampled token of v: its bytes, or for an end-of-generation
 * token the end of the text (DSQ_OK only where the grammar accepts; the
 * matcher is then finished and accepts nothing more). DSQ_EINVAL for a
 * token the mask would not allow (state unchanged), DSQ_ERANGE for an id
 * out of range. */
int dsq_grammar_matcher_accept_token(dsq_grammar_matcher_t *m,
                                     const dsq_grammar_vocab_t *v, int32_t id);

/* True when the output so far is a complete sentence of the grammar (an
 * end-of-generation token is allowed now). */
bool dsq_grammar_matcher_can_end(const dsq_grammar_matcher_t *m);

/* True once no byte can extend the output (the grammar's sentence is
 * complete and nothing may follow it), or an end token was accepted. */
bool dsq_grammar_matcher_done(const dsq_grammar_matcher_t *m);

/* Fill mask with the tokens allowed next: bit (id % 32) of mask[id / 32]
 * set for an allowed id; mask has (dsq_grammar_vocab_size(v) + 31) / 32
 * words. Computed by the trie walk, or copied from the grammar's cache
 * when this state was seen before (*cached, may be NULL, says which).
 * Returns the number of allowed tokens (>= 0), DSQ_ENOMEM, or DSQ_ERANGE
 * when the state is beyond what a mask may cost: more work than
 * DSQ_GRAMMAR_MAX_MASK_WORK (a grammar of very many simultaneous
 * alternatives, e.g. hundreds of `.*` branches), or a state a limit above
 * truncated (whose mask would refuse valid text). The caller ends the
 * sequence; the engine thread is never held longer than that bound. */
int dsq_grammar_matcher_fill_mask(dsq_grammar_matcher_t *m, const dsq_grammar_vocab_t *v,
                                  uint32_t *mask, bool *cached);

/* Set logits[id] = -INFINITY for every id whose mask bit is clear
 * (n_vocab entries). */
void dsq_grammar_apply_mask(float *logits, int32_t n_vocab, const uint32_t *mask);

#endif

/* Strict JSON text for everything dsqd reads from outside: request bodies
 * (server/openai.c, and the Content-Type sniff in server/http.c) and the
 * --config file (server/options.c).
 *
 * cJSON, which builds the trees the rest of the server reads, is lenient:
 * it takes leading zeros, "1.", "+1", raw control characters and invalid
 * UTF-8 in strings, and keeps the first of two equal keys where most other
 * parsers keep the last. A proxy in front of dsqd that reads a body one
 * way while dsqd reads it another is an attack surface, so every such text
 * passes dsq_json_check() before cJSON sees it. The check is jansson's
 * decoder (a well-kept library rather than a grammar of our own), whose
 * tree is dropped at once. No MHD, no engine state. */
#ifndef DSQ_SERVER_JSON_H
#define DSQ_SERVER_JSON_H

#include <stddef.h>

typedef enum dsq_json_fault {
    DSQ_JSON_SYNTAX = 1,     /* not JSON text (RFC 8259 sections 2 to 7), a
                                number beyond a double (section 6), or
                                nested deeper than jansson's 2048 levels   */
    DSQ_JSON_DUPLICATE_KEY,  /* one object names a key twice, compared after
                                unescaping (section 4: names SHOULD be
                                unique; we make it MUST)                   */
    DSQ_JSON_BAD_UTF8,       /* bytes that are not UTF-8 (section 8.1 and
                                RFC 3629: overlong forms, encoded
                                surrogates, above U+10FFFF)                */
    DSQ_JSON_NUL,            /* a \u0000 escape, or a raw NUL byte anywhere:
                                cJSON ends a C string there and would
                                silently cut it                            */
    DSQ_JSON_NOMEM,          /* the check ran out of memory                */
} dsq_json_fault_t;

/* Why and where a text was refused. Caller-owned. */
typedef struct dsq_json_error {
    dsq_json_fault_t fault;
    size_t byte;             /* 0-based offset into the text: the byte the
                                parser stopped at (the offending byte, or
                                the one just past the offending token); a
                                duplicate key's opening quote              */
    int line;                /* 1-based; lines end at LF                   */
    int column;              /* 1-based, in characters (UTF-8 lead bytes)  */
    char where[96];          /* "at byte 15 (line 1, column 16)"; room for
                                the widest numbers (-Wformat-truncation)   */
    char message[384];       /* one line of printable ASCII (other bytes of
                                the text are written \xHH), ending in
                                `where`: e.g. "duplicate key \"stream\" at
                                byte 15 (line 1, column 16)" or "invalid
                                token near '0' at byte 6 (line 1, column
                                7)". Quotes at most 64 bytes of a key and
                                jansson's ~160-byte excerpt otherwise.     */
} dsq_json_error_t;

/* Check that text[0..len) (need not be NUL-terminated; may be NULL when len
 * is 0; read-only, not kept) is exactly one JSON value as RFC 8259 defines
 * it, with whitespace (section 2) around it, no object holding a key twice
 * and no U+0000 in any string. Any value is taken at the top level
 * (section 2), not only an object or array; the caller checks the shape. Integers of any size are taken (section 6: a
 * parser may limit precision, and cJSON reads them as doubles), so a seed
 * of 2^64-1 passes; a number that overflows a double does not. A NUL
 * byte is refused wherever it is, after the value too (a C string's
 * terminator is not whitespace). Nothing is kept: parse with cJSON after.
 * Returns 0, DSQ_EINVAL with *err filled, or DSQ_ENOMEM (err->fault
 * DSQ_JSON_NOMEM). Thread-safe. */
int dsq_json_check(const char *text, size_t len, dsq_json_error_t *err);

/* Fill err->byte, line, column and where for offset `byte` of text[0..len)
 * (clamped to len); leaves fault and message alone. For a position found
 * by another parser, e.g. where cJSON stopped. */
void dsq_json_locate(const char *text, size_t len, size_t byte,
                     dsq_json_error_t *err);

#endif

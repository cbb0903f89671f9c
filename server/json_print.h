/* Parts of a request handed to the engine as JSON text.
 *
 * The engine takes no cJSON trees from the server (its public headers
 * name no request JSON): a JSON Schema, chat messages, tools and their
 * parameters reach it as text, which it parses itself. That text must
 * read back as the very tree the server parsed, or a schema's enum or a
 * template's number would drift between what the client sent and what
 * the engine sees. cJSON's own printer cannot promise that: it writes a
 * double with 15 significant digits whenever that reads back within an
 * epsilon (9007199254740993 comes out as 9.00719925474099e+15) and writes
 * infinities as null. No MHD, no engine state. */
#ifndef DSQ_SERVER_JSON_PRINT_H
#define DSQ_SERVER_JSON_PRINT_H

#include <cjson/cJSON.h>

/* Compact JSON text of v (no whitespace) that cJSON parses back to the
 * same tree: the same types, keys in the same order (duplicates kept),
 * the same string bytes, and numbers with the fewest digits (15 to 17)
 * that read back to the same double (infinities, which a lenient cJSON
 * parse of 1e999 makes, as 1e999 / -1e999). A raw item is written as it
 * is. Returns malloc'd NUL-terminated text the caller frees, or NULL on
 * out of memory (or v NULL). Thread-safe. */
char *dsq_json_print(const cJSON *v);

#endif

/* The strict JSON check in front of cJSON (see json.h for why). jansson
 * decodes the text with JSON_REJECT_DUPLICATES and the tree is dropped;
 * what we add is the NUL rule cJSON needs (it runs first, so its message
 * stays ours), positions as byte + line:column, and messages safe to put
 * in an error body or on one log line. */
#include "server/json.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "engine/common/error.h"

#define QUOTE_MAX 64   /* bytes of the text one message quotes at most */

/* Copy src[0..n) into dst (cap bytes, always NUL-terminated) as printable
 * ASCII: other bytes become \xHH, so a message is one valid UTF-8 line
 * whatever the text held. Stops before an escape that would not fit. */
static void printable(char *dst, size_t cap, const char *src, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c >= 0x20 && c < 0x7f) {
            dst[o++] = (char)c;
        } else {
            if (o + 5 > cap)
                break;
            snprintf(dst + o, cap - o, "\\x%02x", c);
            o += 4;
        }
    }
    dst[o] = '\0';
}

void dsq_json_locate(const char *text, size_t len, size_t byte,
                     dsq_json_error_t *err)
{
    int line = 1, column = 1;
    if (byte > len)
        byte = len;
    for (size_t i = 0; i < byte; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') {
            line++;
            column = 1;
        } else if ((c & 0xC0) != 0x80) {
            column++;      /* continuation bytes add no column */
        }
    }
    err->byte = byte;
    err->line = line;
    err->column = column;
    snprintf(err->where, sizeof(err->where), "at byte %zu (line %d, column %d)",
             byte, line, column);
}

/* Offset of the first U+0000: a raw NUL byte anywhere (RFC 8259 has
 * none outside strings, and cJSON would cut a string there), or a \u0000
 * escape whose backslash is not itself escaped. len when there is none. */
static size_t find_nul(const char *text, size_t len)
{
    const char *z = memchr(text, '\0', len);
    size_t at = z ? (size_t)(z - text) : len;
    for (size_t i = 0; i + 6 <= at; i++) {
        size_t k = 0;
        if (memcmp(text + i, "\\u0000", 6))
            continue;
        while (k < i && text[i - 1 - k] == '\\')
            k++;
        if (k % 2 == 0)
            return i;
    }
    return at;
}

/* jansson reports a duplicate key just past its closing quote; find the
 * opening one (the nearest quote before it that no backslash escapes: a
 * key holds no other) so the message can quote the key as sent and point
 * at its start. Returns false when the text does not look that way. */
static bool find_key(const char *text, size_t end, size_t *start)
{
    if (end < 2 || text[end - 1] != '"')
        return false;
    for (size_t i = end - 1; i-- > 0;) {
        size_t k = 0;
        if (text[i] != '"')
            continue;
        while (k < i && text[i - 1 - k] == '\\')
            k++;
        if (k % 2 == 0) {
            *start = i;
            return true;
        }
    }
    return false;
}

int dsq_json_check(const char *text, size_t len, dsq_json_error_t *err)
{
    json_error_t je;
    json_t *root;
    size_t pos, key;
    int rc = DSQ_EINVAL;
    memset(err, 0, sizeof(*err));
    if (len == 0)
        text = "";      /* NULL is fine then (memchr and jansson want a buffer) */
    pos = find_nul(text, len);
    if (pos < len) {
        err->fault = DSQ_JSON_NUL;
        dsq_json_locate(text, len, pos, err);
        if (text[pos] == '\0')
            snprintf(err->message, sizeof(err->message),
                     "a NUL byte (U+0000) is not allowed in JSON text %s", err->where);
        else
            snprintf(err->message, sizeof(err->message),
                     "strings must not contain U+0000 (\\u0000) %s", err->where);
        return DSQ_EINVAL;
    }
    /* DECODE_ANY: the caller names the wrong shape itself. INT_AS_REAL:
     * without it jansson refuses integers past 2^63-1 ("too big integer"),
     * which cJSON reads as doubles. ALLOW_NUL: \u0000 is find_nul's. */
    root = json_loadb(text, len,
                      JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL |
                          JSON_ALLOW_NUL | JSON_DECODE_ANY,
                      &je);
    if (root) {
        json_decref(root);
        return DSQ_OK;
    }
    pos = je.position > 0 ? (size_t)je.position : 0;
    switch (json_error_code(&je)) {
    case json_error_out_of_memory:
        err->fault = DSQ_JSON_NOMEM;
        dsq_json_locate(text, len, pos, err);
        snprintf(err->message, sizeof(err->message), "out of memory %s",
                 err->where);
        rc = DSQ_ENOMEM;
        break;
    case json_error_duplicate_key:
        err->fault = DSQ_JSON_DUPLICATE_KEY;
        if (find_key(text, pos, &key)) {
            char name[161];     /* QUOTE_MAX bytes, as \xHH at worst */
            size_t kn = pos - key - 2;
            printable(name, sizeof(name), text + key + 1,
                      kn > QUOTE_MAX ? QUOTE_MAX : kn);
            dsq_json_locate(text, len, key, err);
            snprintf(err->message, sizeof(err->message),
                     "duplicate key \"%s%s\" %s", name,
                     kn > QUOTE_MAX ? "..." : "", err->where);
            break;
        }
        /* not where a key ends: jansson's own words, at its position */
        /* fall through */
    default: {
        char why[sizeof(je.text) * 4];
        err->fault = json_error_code(&je) == json_error_invalid_utf8
                         ? DSQ_JSON_BAD_UTF8
                         : err->fault ? err->fault : DSQ_JSON_SYNTAX;
        if (err->fault == DSQ_JSON_BAD_UTF8)
            snprintf(why, sizeof(why), "not valid UTF-8");
        else
            printable(why, sizeof(why), je.text, strnlen(je.text, sizeof(je.text)));
        dsq_json_locate(text, len, pos, err);
        snprintf(err->message, sizeof(err->message), "%.180s %s", why,
                 err->where);
        break;
    }
    }
    return rc;
}

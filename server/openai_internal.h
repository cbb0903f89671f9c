/* What server/openai.c (request parsing) and openai_response.c (response
 * rendering) share. Not an API: only those two files include it. */
#ifndef DSQ_SERVER_OPENAI_INTERNAL_H
#define DSQ_SERVER_OPENAI_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the UTF-8 sequence at s[0..n) (n >= 1), at least 1, with *ok
 * telling whether it is valid: the parser refuses invalid UTF-8 with it,
 * dsq_openai_utf8_clean replaces each invalid sequence with U+FFFD. */
size_t dsq__openai_utf8_seq(const unsigned char *s, size_t n, bool *ok);

#endif

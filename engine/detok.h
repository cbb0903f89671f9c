/* Incremental detokenizer for streaming: feed token ids one at a time and
 * get back only complete UTF-8 characters; bytes of an unfinished character
 * are held until it completes, and flushed (as U+FFFD for an invalid tail)
 * at the end. One dsq_detok_t per sequence; not thread-safe. */
#ifndef DSQ_DETOK_H
#define DSQ_DETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct dsq_detok dsq_detok_t;

/* skip_special: control tokens produce no text. strip_leading_space: for
 * SPM vocabularies, drop the dummy-prefix space of the first piece. */
dsq_detok_t *dsq_detok_create(const dsq_tokenizer_t *t, bool skip_special,
                              bool strip_leading_space);
void dsq_detok_destroy(dsq_detok_t *d);

/* Feed one id; append any newly complete text to *out (malloc'd buffer the
 * caller owns, grown as needed, NUL-terminated) and set *out_len to its
 * length. Returns 0, DSQ_ERANGE (bad id) or DSQ_ENOMEM. */
int dsq_detok_push(dsq_detok_t *d, int32_t id, char **out, size_t *out_len);
/* Flush held bytes (invalid tail becomes U+FFFD). Same out contract. */
int dsq_detok_flush(dsq_detok_t *d, char **out, size_t *out_len);

#endif

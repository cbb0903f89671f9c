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

/* skip_special: control tokens produce no text. strip_leading_space: drop
 * one leading space of the first non-control piece (SPM dummy prefix; use
 * it when streaming a decode from the start of a text, not for a
 * continuation after a prompt). t must outlive the detokenizer. Returns
 * NULL if t is NULL or out of memory. */
dsq_detok_t *dsq_detok_create(const dsq_tokenizer_t *t, bool skip_special,
                              bool strip_leading_space);
void dsq_detok_destroy(dsq_detok_t *d);

/* Feed one id; append any newly complete text to *out and set *out_len to
 * the new length. *out is a malloc'd buffer the caller owns (NULL to start;
 * grown with realloc, NUL-terminated); *out_len holds the bytes already in
 * it (0 when *out is NULL). Pass *out = NULL, *out_len = 0 to get just this
 * step's text. Invalid bytes become U+FFFD (one per maximal invalid
 * subpart), so the appended text is always valid UTF-8.
 * Returns 0, DSQ_EINVAL (NULL args), DSQ_ERANGE (bad id) or DSQ_ENOMEM. */
int dsq_detok_push(dsq_detok_t *d, int32_t id, char **out, size_t *out_len);
/* Flush held bytes (an unfinished character becomes one U+FFFD). Same out
 * contract; afterwards the detokenizer can be reused for more ids. */
int dsq_detok_flush(dsq_detok_t *d, char **out, size_t *out_len);

#endif

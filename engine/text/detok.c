/* Incremental detokenizer: token ids in, complete UTF-8 characters out.
 *
 * A token may end in the middle of a character (byte-level BPE and SPM byte
 * fallback split multi-byte characters across tokens), so the bytes of an
 * unfinished character are held back until the next token completes it.
 * Validation follows RFC 3629 / Unicode Table 3-7 (no overlongs, no
 * surrogates, nothing above U+10FFFF): a byte that can never start or
 * continue a valid character is replaced by U+FFFD at once, so every delta
 * handed out is valid UTF-8 and, for token streams whose full decode is
 * valid UTF-8, the concatenated deltas equal dsq_tokenizer_decode().
 */
#include "detok.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "tokenizer_internal.h"

struct dsq_detok {
    const dsq_tokenizer_t *t;
    bool skip_special;
    bool strip;          /* leading space of the first text piece pending */
    unsigned char held[4];
    size_t n_held;
};

dsq_detok_t *dsq_detok_create(const dsq_tokenizer_t *t, bool skip_special,
                              bool strip_leading_space)
{
    dsq_detok_t *d = NULL;
    if (!t) goto out;
    d = calloc(1, sizeof(*d));
    if (!d) goto out;
    d->t = t;
    d->skip_special = skip_special;
    d->strip = strip_leading_space;
out:
    return d;
}

void dsq_detok_destroy(dsq_detok_t *d)
{
    free(d);
}

/* Grow *out to hold add more bytes after *out_len (+ NUL). */
static int reserve(char **out, size_t *out_len, size_t add)
{
    size_t have = *out ? *out_len : 0;
    char *p = realloc(*out, have + add + 1);
    if (!p) return DSQ_ENOMEM;
    *out = p;
    *out_len = have;
    return 0;
}

/* Length of the valid character at s (n bytes available): >0 complete,
 * 0 a valid but unfinished prefix, -k invalid, where k is the length of the
 * maximal invalid subpart (one U+FFFD each, like Rust's from_utf8_lossy). */
static int char_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    int need;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c < 0xc2 || c > 0xf4) return -1;
    if (c < 0xe0) {
        need = 2;
    } else if (c < 0xf0) {
        need = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else {
        need = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned char x = s[i];
        if (i == 1 ? (x < lo || x > hi) : (x & 0xc0) != 0x80) return -i;
    }
    return need;
}

/* Emit the complete characters of held + (p, n); keep an unfinished tail. */
static int feed(dsq_detok_t *d, const char *p, size_t n, char **out,
                size_t *out_len)
{
    int rc = 0;
    size_t total = d->n_held + n;
    unsigned char *buf = malloc(total ? total : 1);
    if (!buf) return DSQ_ENOMEM;
    memcpy(buf, d->held, d->n_held);
    if (n) memcpy(buf + d->n_held, p, n);
    d->n_held = 0;
    /* worst case every byte becomes U+FFFD (3 bytes) */
    rc = reserve(out, out_len, 3 * total);
    if (rc) goto out;
    char *o = *out + *out_len;
    size_t i = 0;
    while (i < total) {
        int cl = char_len(buf + i, total - i);
        if (cl > 0) {
            memcpy(o, buf + i, (size_t)cl);
            o += cl;
            i += (size_t)cl;
        } else if (cl == 0) {
            d->n_held = total - i;
            memcpy(d->held, buf + i, d->n_held);
            break;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i += (size_t)-cl;
        }
    }
    *out_len = (size_t)(o - *out);
    (*out)[*out_len] = '\0';
out:
    free(buf);
    return rc;
}

int dsq_detok_push(dsq_detok_t *d, int32_t id, char **out, size_t *out_len)
{
    int rc = DSQ_EINVAL;
    if (!d || !out || !out_len) goto out;
    size_t n = 0;
    const char *p = dsq_tokenizer_token_bytes(d->t, id, &n);
    rc = DSQ_ERANGE;
    if (!p) goto out;
    rc = 0;
    bool control = dsq_tokenizer_is_special(d->t, id);
    if (control && d->skip_special) goto out;
    if (d->strip && !control) {
        if (n && p[0] == ' ') {
            p++;
            n--;
        }
        d->strip = false;
    }
    rc = feed(d, p, n, out, out_len);
out:
    return rc;
}

int dsq_detok_flush(dsq_detok_t *d, char **out, size_t *out_len)
{
    int rc = DSQ_EINVAL;
    if (!d || !out || !out_len) goto out;
    rc = reserve(out, out_len, 3);
    if (rc) goto out;
    char *o = *out + *out_len;
    if (d->n_held) {  /* an unfinished character: one maximal subpart */
        memcpy(o, "\xef\xbf\xbd", 3);
        o += 3;
    }
    d->n_held = 0;
    *out_len = (size_t)(o - *out);
    (*out)[*out_len] = '\0';
out:
    return rc;
}

/* deepseek_r1 reasoning parser (see reasoning.h): a two-state scanner over
 * the output text with a hold-back buffer for tags split across pieces.
 * The work buffer is hold + piece, scanned once; whatever cannot be part of
 * a tag any more is appended to the current part's delta. */
#include "server/reasoning.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

static const char OPEN_TAG[] = DSQ_REASONING_OPEN;
static const char CLOSE_TAG[] = DSQ_REASONING_CLOSE;

void dsq_reasoning_init(dsq_reasoning_t *r, bool in_think)
{
    memset(r, 0, sizeof(*r));
    r->in_think = in_think;
}

static const char *find_last(const char *s, size_t len, const char *tag)
{
    size_t n = strlen(tag);
    const char *last = NULL;
    for (size_t i = 0; i + n <= len; i++)
        if (!memcmp(s + i, tag, n))
            last = s + i;
    return last;
}

bool dsq_reasoning_prompt_in_think(const char *text, size_t len)
{
    const char *o = find_last(text, len, OPEN_TAG);
    const char *c = find_last(text, len, CLOSE_TAG);
    return o && (!c || o > c);
}

void dsq_reasoning_delta_free(dsq_reasoning_delta_t *d)
{
    if (!d)
        return;
    free(d->reasoning);
    free(d->content);
    memset(d, 0, sizeof(*d));
}

static int put(dsq_reasoning_delta_t *d, bool reasoning, const char *s,
               size_t n)
{
    char **p = reasoning ? &d->reasoning : &d->content;
    size_t *len = reasoning ? &d->reasoning_len : &d->content_len;
    char *q;
    if (!n)
        return DSQ_OK;
    q = realloc(*p, *len + n + 1);
    if (!q)
        return DSQ_ENOMEM;
    memcpy(q + *len, s, n);
    *len += n;
    q[*len] = '\0';
    *p = q;
    return DSQ_OK;
}

static int delta_start(dsq_reasoning_delta_t *d)
{
    memset(d, 0, sizeof(*d));
    d->reasoning = calloc(1, 1);
    d->content = calloc(1, 1);
    return d->reasoning && d->content ? DSQ_OK : DSQ_ENOMEM;
}

/* Longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t tag_prefix_suffix(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    size_t k = n < t - 1 ? n : t - 1;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

int dsq_reasoning_feed(dsq_reasoning_t *r, const char *text, size_t len,
                       dsq_reasoning_delta_t *out)
{
    int rc = delta_start(out);
    char *buf = NULL;
    size_t n = r->n_hold + len, i = 0;
    if (rc)
        goto fail;
    buf = malloc(n + 1);
    if (!buf) {
        rc = DSQ_ENOMEM;
        goto fail;
    }
    memcpy(buf, r->hold, r->n_hold);
    if (len)
        memcpy(buf + r->n_hold, text, len);
    r->n_hold = 0;
    while (i < n) {
        const char *tag = r->in_think ? CLOSE_TAG : OPEN_TAG;
        size_t tl = strlen(tag), j, keep;
        for (j = i; j + tl <= n; j++)
            if (!memcmp(buf + j, tag, tl))
                break;
        if (j + tl <= n) {
            if ((rc = put(out, r->in_think, buf + i, j - i)))
                goto fail;
            r->in_think = !r->in_think;
            i = j + tl;
            continue;
        }
        keep = tag_prefix_suffix(buf + i, n - i, tag);
        if ((rc = put(out, r->in_think, buf + i, n - i - keep)))
            goto fail;
        memcpy(r->hold, buf + n - keep, keep);
        r->n_hold = keep;
        i = n;
    }
    free(buf);
    return DSQ_OK;
fail:
    free(buf);
    dsq_reasoning_delta_free(out);
    return rc;
}

int dsq_reasoning_flush(dsq_reasoning_t *r, dsq_reasoning_delta_t *out)
{
    int rc = delta_start(out);
    if (!rc)
        rc = put(out, r->in_think, r->hold, r->n_hold);
    r->n_hold = 0;
    if (rc)
        dsq_reasoning_delta_free(out);
    return rc;
}

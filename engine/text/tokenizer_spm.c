/* SentencePiece-style BPE encoding (Llama 2 vocab, llama2.c tok*.bin).
 *
 * Semantics of sentencepiece's BPE mode as reproduced by llama.cpp
 * (llm_tokenizer_spm) and llama2.c run.c encode(): an optional dummy prefix
 * space, spaces written as U+2581 (llama2.c vocabularies keep ' '), one
 * symbol per UTF-8 character, then repeatedly merge the adjacent pair whose
 * concatenation is a vocabulary entry with the highest score (leftmost on
 * ties). A symbol left that is not in the vocabulary is emitted byte by byte
 * as its <0xNN> tokens (byte fallback), or as unk when there are none.
 * Candidates live in a binary heap, stale ones are dropped when popped.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "tokenizer_internal.h"

typedef struct sym { size_t off, len; int32_t prev, next; } sym_t;

static int try_pair(const dsq_tokenizer_t *t, const char *s, sym_t *sy,
                    int32_t l, dsq__heap_t *h)
{
    if (l < 0 || sy[l].next < 0) return 0;
    int32_t r = sy[l].next;
    size_t len = sy[l].len + sy[r].len;
    int32_t id = dsq__tok_find(t, s + sy[l].off, len);
    if (id < 0) return 0;
    /* best score first: the heap pops the lowest key */
    dsq__cand_t c = { .key = -(double)(t->scores ? t->scores[id] : 0.0f), .left = l,
                      .a = id, .len = len };
    return dsq__heap_push(h, c);
}

static size_t utf8_len(unsigned char c)
{
    static const size_t lookup[16] = { 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 2, 2, 3, 4 };
    return lookup[c >> 4];
}

int dsq__spm_encode(const dsq_tokenizer_t *t, const char *text, size_t len,
                    bool prefix, dsq__ids_t *out)
{
    int rc = 0;
    static const char ws[] = "\xe2\x96\x81";  /* U+2581 */
    const char *sp = t->spm_raw_space ? " " : ws;
    size_t sp_len = t->spm_raw_space ? 1 : 3;
    char *s = NULL;
    sym_t *sy = NULL;
    dsq__heap_t h = { 0 };
    if (len == 0) goto out;

    /* Escape whitespace into a private copy. */
    size_t n_sp = prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) n_sp += text[i] == ' ';
    size_t slen = len + n_sp * (sp_len - 1) + (prefix ? 1 : 0);
    s = malloc(slen + 1);
    sy = malloc((slen + 1) * sizeof(*sy));
    if (!s || !sy) {
        rc = DSQ_ENOMEM;
        goto out;
    }
    size_t k = 0;
    if (prefix) {
        memcpy(s + k, sp, sp_len);
        k += sp_len;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s + k, sp, sp_len);
            k += sp_len;
        } else {
            s[k++] = text[i];
        }
    }

    int32_t n = 0;
    for (size_t off = 0; off < k; n++) {
        size_t cl = utf8_len((unsigned char)s[off]);
        if (cl > k - off) cl = k - off;
        sy[n].off = off;
        sy[n].len = cl;
        sy[n].prev = n - 1;
        sy[n].next = off + cl < k ? n + 1 : -1;
        off += cl;
    }
    for (int32_t i = 0; i + 1 < n && rc == 0; i++) rc = try_pair(t, s, sy, i, &h);
    while (h.n && rc == 0) {
        dsq__cand_t c = dsq__heap_pop(&h);
        int32_t l = c.left, r = sy[l].next;
        if (sy[l].len == 0 || r < 0 || sy[l].len + sy[r].len != c.len)
            continue;
        sy[l].len += sy[r].len;
        sy[r].len = 0;
        sy[l].next = sy[r].next;
        if (sy[r].next >= 0) sy[sy[r].next].prev = l;
        rc = try_pair(t, s, sy, sy[l].prev, &h);
        if (rc == 0) rc = try_pair(t, s, sy, l, &h);
    }
    for (int32_t i = 0; i >= 0 && rc == 0 && n; i = sy[i].next) {
        int32_t id = dsq__tok_find(t, s + sy[i].off, sy[i].len);
        if (id >= 0) {
            rc = dsq__ids_push(out, id);
            continue;
        }
        for (size_t j = 0; j < sy[i].len && rc == 0; j++) {
            int32_t b = t->byte_id[(unsigned char)s[sy[i].off + j]];
            if (b < 0) b = t->unk;
            if (b >= 0) rc = dsq__ids_push(out, b);
        }
    }
out:
    free(s);
    free(sy);
    free(h.v);
    return rc;
}

/* The vocabulary as the grammar mask walks it (grammar.h,
 * dsq_grammar_vocab_create): every text token's bytes, sorted, with the
 * common prefix of neighbours. Apart from grammar_match.c so that the
 * request parser (and its fuzzer) can compile grammars without the
 * tokenizer. */
#include "grammar_internal.h"

#include <stdlib.h>
#include <string.h>

static int cmp_vtok(const void *pa, const void *pb)
{
    const vtok_t *a = pa, *b = pb;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->bytes, b->bytes, n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

dsq_grammar_vocab_t *dsq_grammar_vocab_create(const dsq_tokenizer_t *t)
{
    if (!t)
        return NULL;
    dsq_grammar_vocab_t *v = calloc(1, sizeof(*v));
    if (!v)
        return NULL;
    v->n_vocab = dsq_tokenizer_n_vocab(t);
    v->kind = malloc((size_t)(v->n_vocab > 0 ? v->n_vocab : 1));
    v->sorted = malloc((size_t)(v->n_vocab > 0 ? v->n_vocab : 1) * sizeof(*v->sorted));
    v->lcp = malloc((size_t)(v->n_vocab > 0 ? v->n_vocab : 1) * sizeof(*v->lcp));
    v->by_id = calloc((size_t)(v->n_vocab > 0 ? v->n_vocab : 1), sizeof(*v->by_id));
    if (!v->kind || !v->sorted || !v->lcp || !v->by_id) {
        dsq_grammar_vocab_free(v);
        return NULL;
    }
    for (int32_t id = 0; id < v->n_vocab; id++) {
        size_t len = 0;
        const char *b = dsq_tokenizer_token_bytes(t, id, &len);
        if (dsq_tokenizer_is_eog(t, id)) {
            v->kind[id] = KIND_EOG;
        } else if (!b || len == 0 || len > MAX_TOKEN_BYTES || dsq_tokenizer_is_special(t, id)) {
            v->kind[id] = KIND_NEVER;
        } else {
            v->kind[id] = KIND_TEXT;
            v->sorted[v->n_sorted++] = (vtok_t){(const uint8_t *)b, (uint32_t)len, id};
            v->by_id[id] = v->sorted[v->n_sorted - 1];
            if (len > v->max_len)
                v->max_len = (uint32_t)len;
        }
    }
    if (v->n_sorted > 0)
        qsort(v->sorted, (size_t)v->n_sorted, sizeof(*v->sorted), cmp_vtok);
    for (int32_t i = 0; i < v->n_sorted; i++) {
        uint32_t l = 0;
        if (i > 0) {
            const vtok_t *a = &v->sorted[i - 1], *b = &v->sorted[i];
            uint32_t n = a->len < b->len ? a->len : b->len;
            while (l < n && a->bytes[l] == b->bytes[l])
                l++;
        }
        v->lcp[i] = l;
    }
    return v;
}

void dsq_grammar_vocab_free(dsq_grammar_vocab_t *v)
{
    if (!v)
        return;
    free(v->kind);
    free(v->sorted);
    free(v->lcp);
    free(v->by_id);
    free(v);
}

int32_t dsq_grammar_vocab_size(const dsq_grammar_vocab_t *v) { return v ? v->n_vocab : 0; }


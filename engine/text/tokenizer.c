/* Tokenizer: the vocabulary, its three loaders (GGUF tokenizer.ggml.*, HF
 * tokenizer.json + tokenizer_config.json, llama2.c tok*.bin), special-token
 * splitting, decode and the queries of tokenizer.h. The merge algorithms
 * live in tokenizer_bpe.c (byte-level BPE, rank merges) and
 * tokenizer_spm.c (SentencePiece-style, score merges).
 *
 * Every token string is copied into one arena at load, with a second arena
 * for what each token decodes to (computed once, so decode and streaming
 * detokenization are table lookups). Strings are found by an open-addressing
 * hash map and merges by a (left id, right id) hash map. After creation the
 * object is read-only, so encode/decode can run on many threads at once;
 * per-call scratch lives on the caller's stack or heap.
 *
 * Special tokens follow llama.cpp/HF tokenizers: user-defined (non-special
 * added) tokens are always cut out of the text before pre-tokenization;
 * control tokens only with DSQ_TOK_PARSE_SPECIAL. Matching is leftmost,
 * longest first.
 */
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/common/log.h"
#include "tokenizer_internal.h"

#define ERR(...) snprintf(err, err_len, __VA_ARGS__)

/* ---- small helpers ---- */

int dsq__ids_push(dsq__ids_t *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, cap * sizeof(*v));
        if (!v) return DSQ_ENOMEM;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

typedef struct arena { char *p; size_t n, cap; } arena_t;

/* Append len bytes plus a NUL; *off gets the start offset. */
static int arena_put(arena_t *a, const void *s, size_t len, size_t *off)
{
    if (a->n + len + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 1 << 16;
        while (cap < a->n + len + 1) cap *= 2;
        char *p = realloc(a->p, cap);
        if (!p) return DSQ_ENOMEM;
        a->p = p;
        a->cap = cap;
    }
    *off = a->n;
    if (len) memcpy(a->p + a->n, s, len);
    a->p[a->n + len] = '\0';
    a->n += len + 1;
    return 0;
}

static uint64_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static size_t put_utf8(char *o, uint32_t c)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xc0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* Decode one UTF-8 character; returns its length (1 for an invalid byte,
 * with *cp = 0xFFFFFFFF). */
static size_t get_utf8(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t n = c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3
             : c < 0xf5 ? 4 : 0;
    if (n == 0 || n > len) goto bad;
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1fu : n == 3 ? c & 0x0fu : c & 0x07u;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3fu);
    }
    *cp = v;
    return n;
bad:
    *cp = 0xffffffffu;
    return 1;
}

/* ---- construction ---- */

typedef struct builder {
    dsq_tokenizer_t *t;
    arena_t str;
    size_t *off;
} builder_t;

static dsq_tokenizer_t *tok_alloc(builder_t *b, int64_t n, dsq_tokenizer_kind_t kind)
{
    dsq_tokenizer_t *t = calloc(1, sizeof(*t));
    memset(b, 0, sizeof(*b));
    if (!t) return NULL;
    t->kind = kind;
    t->n_vocab = (int32_t)n;
    t->bos = t->eos = t->unk = t->pad = t->eot = t->eom = -1;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    size_t un = n > 0 ? (size_t)n : 1;
    t->str = calloc(un, sizeof(*t->str));
    t->str_len = calloc(un, sizeof(*t->str_len));
    t->dec = calloc(un, sizeof(*t->dec));
    t->dec_len = calloc(un, sizeof(*t->dec_len));
    t->scores = calloc(un, sizeof(*t->scores));
    t->type = calloc(un, sizeof(*t->type));
    t->eog = calloc(un, sizeof(*t->eog));
    b->off = calloc(un, sizeof(*b->off));
    b->t = t;
    if (!t->str || !t->str_len || !t->dec || !t->dec_len || !t->scores ||
        !t->type || !t->eog || !b->off) {
        free(b->off);
        b->off = NULL;
        dsq_tokenizer_destroy(t);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        t->type[i] = DSQ__TT_UNUSED;
        b->off[i] = SIZE_MAX;
    }
    return t;
}

static int set_token(builder_t *b, int32_t id, const char *s, size_t len,
                     int type)
{
    int rc = arena_put(&b->str, s, len, &b->off[id]);
    if (rc == 0) {
        b->t->str_len[id] = (uint32_t)len;
        b->t->type[id] = (uint8_t)type;
    }
    return rc;
}

int32_t dsq__tok_find(const dsq_tokenizer_t *t, const char *s, size_t len)
{
    if (!t->map || len == 0) return -1;
    uint32_t i = (uint32_t)hash_bytes(s, len) & t->map_mask;
    for (;;) {
        int32_t id = t->map[i];
        if (id < 0) return -1;
        if (t->str_len[id] == len && memcmp(t->str[id], s, len) == 0)
            return id;
        i = (i + 1) & t->map_mask;
    }
}

/* Strings become pointers; build the string -> id map (a later duplicate
 * wins, as in llama.cpp). */
static int finish_vocab(builder_t *b)
{
    dsq_tokenizer_t *t = b->t;
    static const char empty[] = "";
    t->arena_str = b->str.p;
    b->str.p = NULL;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (b->off[i] == SIZE_MAX) {
            t->str[i] = (char *)empty;
            t->str_len[i] = 0;
        } else {
            t->str[i] = t->arena_str + b->off[i];
        }
    }
    free(b->off);
    b->off = NULL;
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)t->n_vocab + 16) cap *= 2;
    t->map = malloc(cap * sizeof(*t->map));
    if (!t->map) return DSQ_ENOMEM;
    memset(t->map, 0xff, cap * sizeof(*t->map));
    t->map_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len = t->str_len[id];
        if (len == 0) continue;
        uint32_t i = (uint32_t)hash_bytes(t->str[id], len) & t->map_mask;
        while (t->map[i] >= 0 &&
               !(t->str_len[t->map[i]] == len &&
                 memcmp(t->str[t->map[i]], t->str[id], len) == 0))
            i = (i + 1) & t->map_mask;
        t->map[i] = id;
    }
    return 0;
}

static int merges_alloc(dsq_tokenizer_t *t, int64_t n)
{
    uint32_t cap = 16;
    while (cap < 2u * (uint64_t)n + 16) cap *= 2;
    t->merges = malloc(cap * sizeof(*t->merges));
    if (!t->merges) return DSQ_ENOMEM;
    for (uint32_t i = 0; i < cap; i++) t->merges[i].rank = -1;
    t->merge_mask = cap - 1;
    return 0;
}

/* Add merge "a"+"b" with the next rank; pairs whose parts or result are not
 * in the vocabulary are skipped (they can never fire). First rank wins. */
static void merge_add(dsq_tokenizer_t *t, const char *a, size_t la,
                      const char *b, size_t lb, char *tmp)
{
    int32_t ia = dsq__tok_find(t, a, la), ib = dsq__tok_find(t, b, lb);
    int32_t rank = t->n_merges++;
    if (ia < 0 || ib < 0) return;
    memcpy(tmp, a, la);
    memcpy(tmp + la, b, lb);
    int32_t im = dsq__tok_find(t, tmp, la + lb);
    if (im < 0) return;
    uint64_t k = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    k *= 0x9e3779b97f4a7c15ull;
    uint32_t i = (uint32_t)(k >> 32) & t->merge_mask;
    while (t->merges[i].rank >= 0) {
        if (t->merges[i].a == ia && t->merges[i].b == ib) return;
        i = (i + 1) & t->merge_mask;
    }
    t->merges[i].a = ia;
    t->merges[i].b = ib;
    t->merges[i].rank = rank;
    t->merges[i].id = im;
}

/* Parse "<0xNN>"; -1 if s is not a byte token. */
static int byte_token(const char *s, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    const char *h1 = memchr(hex, s[3], 16), *h2 = memchr(hex, s[4], 16);
    if (!h1 || !h2 || !s[3] || !s[4]) return -1;
    return (int)((h1 - hex) * 16 + (h2 - hex));
}

static int cmp_special_len(const void *x, const void *y, void *arg)
{
    const dsq_tokenizer_t *t = arg;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    if (t->str_len[a] != t->str_len[b])
        return t->str_len[a] > t->str_len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Decoded bytes, byte ids, specials, end-of-generation flags. */
static int finish_rest(dsq_tokenizer_t *t)
{
    static const char *const eog_text[] = {
        "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<|EOT|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "<EOT>",
        NULL,
    };
    int rc = 0;
    arena_t dec = { 0 };
    size_t *doff = malloc((size_t)(t->n_vocab ? t->n_vocab : 1) * sizeof(*doff));
    char *tmp = NULL;
    uint32_t max_len = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->str_len[i] > max_len) max_len = t->str_len[i];
    tmp = malloc((size_t)max_len + 4);
    if (!doff || !tmp) {
        rc = DSQ_ENOMEM;
        goto out;
    }
    uint32_t b2c[256];
    uint8_t c2b[324];
    dsq__bpe_byte_map(b2c);
    for (int i = 0; i < 256; i++) c2b[b2c[i]] = (uint8_t)i;

    for (int32_t id = 0; id < t->n_vocab && rc == 0; id++) {
        const char *s = t->str[id];
        size_t len = t->str_len[id], n = 0;
        int tt = t->type[id];
        if (tt == DSQ__TT_CONTROL || tt == DSQ__TT_USER || tt == DSQ__TT_UNKNOWN) {
            memcpy(tmp, s, len);
            n = len;
        } else if (t->kind == DSQ_TOKENIZER_BPE) {
            for (size_t i = 0; i < len;) {
                uint32_t cp;
                size_t cl = get_utf8((const unsigned char *)s + i, len - i, &cp);
                if (cp < 324 && (cp >= 256 || b2c[cp] == cp))
                    tmp[n++] = (char)c2b[cp];
                else
                    for (size_t j = 0; j < cl; j++) tmp[n++] = s[i + j];
                i += cl;
            }
        } else {
            int bv = byte_token(s, len);
            if (bv >= 0 && (tt == DSQ__TT_BYTE || t->spm_raw_space)) {
                tmp[n++] = (char)bv;
            } else if (t->spm_raw_space) {
                memcpy(tmp, s, len);
                n = len;
            } else {
                for (size_t i = 0; i < len;) {
                    if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                        tmp[n++] = ' ';
                        i += 3;
                    } else {
                        tmp[n++] = s[i++];
                    }
                }
            }
        }
        rc = arena_put(&dec, tmp, n, &doff[id]);
        t->dec_len[id] = (uint32_t)n;
    }
    if (rc) goto out;
    t->arena_dec = dec.p;
    dec.p = NULL;
    for (int32_t id = 0; id < t->n_vocab; id++)
        t->dec[id] = t->arena_dec + doff[id];

    /* byte ids */
    for (int bv = 0; bv < 256; bv++) {
        if (t->kind == DSQ_TOKENIZER_BPE) {
            char u[4];
            size_t ul = put_utf8(u, b2c[bv]);
            t->byte_id[bv] = dsq__tok_find(t, u, ul);
        } else {
            char u[7];
            snprintf(u, sizeof(u), "<0x%02X>", bv);
            int32_t id = dsq__tok_find(t, u, 6);
            if (id >= 0 && (t->type[id] == DSQ__TT_BYTE || t->spm_raw_space))
                t->byte_id[bv] = id;
        }
    }

    /* specials: control, unknown and user-defined tokens with text */
    int32_t n_sp = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int tt = t->type[id];
        if ((tt == DSQ__TT_CONTROL || tt == DSQ__TT_USER || tt == DSQ__TT_UNKNOWN) &&
            t->str_len[id] > 0)
            n_sp++;
    }
    t->special = malloc((size_t)(n_sp ? n_sp : 1) * sizeof(*t->special));
    if (!t->special) {
        rc = DSQ_ENOMEM;
        goto out;
    }
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int tt = t->type[id];
        if ((tt == DSQ__TT_CONTROL || tt == DSQ__TT_USER || tt == DSQ__TT_UNKNOWN) &&
            t->str_len[id] > 0) {
            t->special[t->n_special++] = id;
            t->special_first[(unsigned char)t->str[id][0]] = 1;
        }
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof(*t->special),
            cmp_special_len, t);

    /* end of generation */
    int32_t fixed[3] = { t->eos, t->eot, t->eom };
    for (int i = 0; i < 3; i++)
        if (fixed[i] >= 0 && fixed[i] < t->n_vocab) t->eog[fixed[i]] = true;
    for (int i = 0; eog_text[i]; i++) {
        int32_t id = dsq__tok_find(t, eog_text[i], strlen(eog_text[i]));
        if (id >= 0 && (t->type[id] == DSQ__TT_CONTROL || t->type[id] == DSQ__TT_USER))
            t->eog[id] = true;
    }
out:
    free(dec.p);
    free(doff);
    free(tmp);
    return rc;
}

static void builder_drop(builder_t *b)
{
    free(b->str.p);
    free(b->off);
    b->str.p = NULL;
    b->off = NULL;
}

void dsq_tokenizer_destroy(dsq_tokenizer_t *t)
{
    if (!t) return;
    dsq__bpe_free(t);
    free(t->str);
    free(t->str_len);
    free(t->dec);
    free(t->dec_len);
    free(t->scores);
    free(t->type);
    free(t->eog);
    free(t->map);
    free(t->merges);
    free(t->special);
    free(t->arena_str);
    free(t->arena_dec);
    free(t->chat_template);
    free(t);
}

/* ---- GGUF ---- */

/* Special id under key into *id. Missing (or not a number): def when it
 * is a token, else -1. Present: -1 is "none", otherwise it must be below
 * the vocabulary size n (llama.cpp warns and drops such an id; a file that
 * names a token it does not have is damaged, so we refuse it). */
static int gguf_id(const dsq_gguf_t *g, const char *key, int32_t def,
                   int32_t n, int32_t *id, char *err, size_t err_len)
{
    int64_t v = dsq_gguf_get_int(g, key, INT64_MIN);
    if (v == INT64_MIN) {
        *id = def >= 0 && def < n ? def : -1;
        return 0;
    }
    if (v != -1 && (v < 0 || v >= n)) {
        ERR("tokenizer: %s: %s = %lld is not a token id (%d tokens; -1 means none)",
            dsq_gguf_path(g), key, (long long)v, n);
        return DSQ_EFORMAT;
    }
    *id = (int32_t)v;
    return 0;
}

dsq_tokenizer_t *dsq_tokenizer_from_gguf(const struct dsq_gguf *g, char *err,
                                         size_t err_len)
{
    dsq_tokenizer_t *t = NULL;
    builder_t b = { 0 };
    char *tmp = NULL;
    int rc = 0;
    size_t ml = 0, pl = 0;
    if (!g) {
        ERR("tokenizer: no GGUF");
        goto fail;
    }
    const char *model = dsq_gguf_get_str(g, "tokenizer.ggml.model", &ml);
    if (!model) {
        ERR("tokenizer: %s has no tokenizer.ggml.model", dsq_gguf_path(g));
        goto fail;
    }
    dsq_tokenizer_kind_t kind;
    if (ml == 4 && memcmp(model, "gpt2", 4) == 0) {
        kind = DSQ_TOKENIZER_BPE;
    } else if (ml == 5 && memcmp(model, "llama", 5) == 0) {
        kind = DSQ_TOKENIZER_SPM;
    } else {
        ERR("tokenizer: %s: tokenizer.ggml.model '%.*s' is not supported "
            "(expected gpt2 or llama)", dsq_gguf_path(g), (int)ml, model);
        goto fail;
    }
    dsq_gguf_vtype_t et;
    int64_t n = dsq_gguf_arr_n(g, "tokenizer.ggml.tokens", &et);
    if (n <= 0 || n > INT32_MAX / 4 || et != DSQ_GGUF_STRING) {
        ERR("tokenizer: %s: tokenizer.ggml.tokens missing or not a string array",
            dsq_gguf_path(g));
        goto fail;
    }
    t = tok_alloc(&b, n, kind);
    if (!t) {
        ERR("tokenizer: out of memory for %lld tokens", (long long)n);
        goto fail;
    }
    const void *types = NULL, *scores = NULL;
    if (dsq_gguf_arr_n(g, "tokenizer.ggml.token_type", &et) == n &&
        (et == DSQ_GGUF_I32 || et == DSQ_GGUF_U32))
        types = dsq_gguf_arr_data(g, "tokenizer.ggml.token_type");
    if (dsq_gguf_arr_n(g, "tokenizer.ggml.scores", &et) == n && et == DSQ_GGUF_F32)
        scores = dsq_gguf_arr_data(g, "tokenizer.ggml.scores");
    for (int64_t i = 0; i < n && rc == 0; i++) {
        size_t len = 0;
        const char *s = dsq_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &len);
        int32_t tt = DSQ__TT_NORMAL;
        if (types) memcpy(&tt, (const char *)types + 4 * i, 4);
        if (tt < 1 || tt > 6) tt = DSQ__TT_NORMAL;
        if (scores) memcpy(&t->scores[i], (const char *)scores + 4 * i, 4);
        rc = set_token(&b, (int32_t)i, s ? s : "", s ? len : 0, tt);
    }
    if (rc == 0) rc = finish_vocab(&b);
    if (rc) {
        ERR("tokenizer: out of memory reading the vocabulary");
        goto fail;
    }
    int32_t nv = t->n_vocab;
    bool spm = kind == DSQ_TOKENIZER_SPM;
    if (gguf_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, nv, &t->bos, err, err_len) ||
        gguf_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, nv, &t->eos, err, err_len) ||
        gguf_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, nv, &t->unk, err,
                err_len) ||
        gguf_id(g, "tokenizer.ggml.padding_token_id", -1, nv, &t->pad, err, err_len) ||
        gguf_id(g, "tokenizer.ggml.eot_token_id", -1, nv, &t->eot, err, err_len) ||
        gguf_id(g, "tokenizer.ggml.eom_token_id", -1, nv, &t->eom, err, err_len))
        goto fail;
    t->add_bos = dsq_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", spm);
    t->add_space_prefix = dsq_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", spm);

    if (kind == DSQ_TOKENIZER_BPE) {
        int64_t nm = dsq_gguf_arr_n(g, "tokenizer.ggml.merges", &et);
        if (nm < 0 || et != DSQ_GGUF_STRING) {
            ERR("tokenizer: %s: BPE vocabulary without tokenizer.ggml.merges",
                dsq_gguf_path(g));
            goto fail;
        }
        uint32_t max_len = 0;
        for (int32_t i = 0; i < nv; i++)
            if (t->str_len[i] > max_len) max_len = t->str_len[i];
        tmp = malloc(2 * (size_t)max_len + 2);
        if (!tmp || merges_alloc(t, nm)) {
            ERR("tokenizer: out of memory for %lld merges", (long long)nm);
            goto fail;
        }
        for (int64_t i = 0; i < nm; i++) {
            size_t len = 0;
            const char *s = dsq_gguf_arr_str(g, "tokenizer.ggml.merges", i, &len);
            const char *sp = s && len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
            size_t la = sp ? (size_t)(sp - s) : 0, lb = sp ? len - la - 1 : 0;
            if (!sp || la > max_len || lb > max_len) {
                t->n_merges++;
                continue;
            }
            merge_add(t, s, la, sp + 1, lb, tmp);
        }
        const char *pre = dsq_gguf_get_str(g, "tokenizer.ggml.pre", &pl);
        char pre_name[64] = "default";
        if (pre && pl < sizeof(pre_name)) {
            memcpy(pre_name, pre, pl);
            pre_name[pl] = '\0';
        }
        rc = dsq__bpe_set_pre(t, pre_name, err, err_len);
        if (rc == DSQ_EUNSUPPORTED) {
            dsq_log(DSQ_LOG_WARN, "tokenizer pre=%s unknown, using gpt-2 split",
                    pre_name);
            rc = dsq__bpe_set_pre(t, "gpt-2", err, err_len);
        }
        if (rc) goto fail;
    }
    size_t tl = 0;
    const char *tmpl = dsq_gguf_get_str(g, "tokenizer.chat_template", &tl);
    if (tmpl) {
        t->chat_template = strndup(tmpl, tl);
        if (!t->chat_template) {
            ERR("tokenizer: out of memory");
            goto fail;
        }
    }
    if (finish_rest(t)) {
        ERR("tokenizer: out of memory");
        goto fail;
    }
    free(tmp);
    return t;
fail:
    free(tmp);
    builder_drop(&b);
    dsq_tokenizer_destroy(t);
    return NULL;
}

/* ---- llama2.c tok*.bin ---- */

static char *read_file(const char *path, size_t *len)
{
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size >= 0 &&
        (uint64_t)st.st_size < ((uint64_t)1 << 32)) {
        buf = malloc((size_t)st.st_size + 1);
        if (buf && fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
            free(buf);
            buf = NULL;
        }
        if (buf) {
            buf[st.st_size] = '\0';
            *len = (size_t)st.st_size;
        }
    }
    fclose(f);
    return buf;
}

dsq_tokenizer_t *dsq_tokenizer_from_llama2c(const char *path, char *err,
                                            size_t err_len)
{
    dsq_tokenizer_t *t = NULL;
    builder_t b = { 0 };
    size_t len = 0;
    char *buf = path ? read_file(path, &len) : NULL;
    if (!buf) {
        ERR("tokenizer: cannot read %s", path ? path : "(null)");
        goto fail;
    }
    /* Count tokens: int32 max_token_length, then (f32 score, i32 len, bytes)*. */
    int64_t n = 0;
    size_t pos = 4;
    while (pos < len) {
        int32_t l;
        if (len - pos < 8) break;
        memcpy(&l, buf + pos + 4, 4);
        if (l < 0 || (size_t)l > len - pos - 8) break;
        pos += 8 + (size_t)l;
        n++;
    }
    if (len < 4 || pos != len || n < 3) {
        ERR("tokenizer: %s is not a llama2.c tokenizer (bad record at byte %zu)",
            path, pos);
        goto fail;
    }
    t = tok_alloc(&b, n, DSQ_TOKENIZER_SPM);
    if (!t) {
        ERR("tokenizer: out of memory");
        goto fail;
    }
    t->spm_raw_space = true;
    pos = 4;
    int rc = 0;
    for (int32_t i = 0; i < n && rc == 0; i++) {
        int32_t l;
        memcpy(&t->scores[i], buf + pos, 4);
        memcpy(&l, buf + pos + 4, 4);
        const char *s = buf + pos + 8;
        int tt = DSQ__TT_NORMAL;
        if (i == 0) tt = DSQ__TT_UNKNOWN;
        else if (i <= 2) tt = DSQ__TT_CONTROL;
        else if (byte_token(s, (size_t)l) >= 0) tt = DSQ__TT_BYTE;
        rc = set_token(&b, i, s, (size_t)l, tt);
        pos += 8 + (size_t)l;
    }
    if (rc == 0) rc = finish_vocab(&b);
    t->unk = 0;
    t->bos = 1;
    t->eos = 2;
    t->add_bos = true;
    t->add_space_prefix = true;
    if (rc == 0) rc = finish_rest(t);
    if (rc) {
        ERR("tokenizer: out of memory");
        goto fail;
    }
    free(buf);
    return t;
fail:
    free(buf);
    builder_drop(&b);
    dsq_tokenizer_destroy(t);
    return NULL;
}

/* ---- Hugging Face tokenizer.json ---- */

static const char *json_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* bos_token / eos_token in tokenizer_config.json: a string or {content}. */
static const char *json_token(const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return json_str(v, "content");
    return NULL;
}

static int add_pre(dsq_tokenizer_t *t, const cJSON *p, char *err,
                   size_t err_len)
{
    int rc = 0;
    const char *type = json_str(p, "type");
    if (!type) {
        ERR("tokenizer: pre_tokenizer without type");
        rc = DSQ_EFORMAT;
    } else if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            rc = add_pre(t, it, err, err_len);
            if (rc) break;
        }
    } else if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = json_str(pat, "Regex");
        const char *lit = json_str(pat, "String");
        const char *beh = json_str(p, "behavior");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "invert")) ||
            (beh && strcmp(beh, "Isolated") != 0)) {
            ERR("tokenizer: Split behavior '%s'%s not supported",
                beh ? beh : "?", cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
                                      p, "invert")) ? " (invert)" : "");
            rc = DSQ_EUNSUPPORTED;
        } else if (re) {
            rc = dsq__bpe_add_regex(t, re, err, err_len);
        } else if (lit) {
            size_t l = strlen(lit);
            char *q = malloc(l + 5);
            if (!q) {
                rc = DSQ_ENOMEM;
            } else {
                snprintf(q, l + 5, "\\Q%s\\E", lit);
                rc = dsq__bpe_add_regex(t, q, err, err_len);
                free(q);
            }
        } else {
            ERR("tokenizer: Split without pattern");
            rc = DSQ_EFORMAT;
        }
    } else if (strcmp(type, "Digits") == 0) {
        bool one = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "individual_digits"));
        rc = dsq__bpe_add_regex(t, one ? "\\p{N}" : "\\p{N}+", err, err_len);
    } else if (strcmp(type, "ByteLevel") == 0) {
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space")))
            t->add_prefix_space = true;
        if (!cJSON_IsFalse(ur))
            rc = dsq__bpe_add_regex(t, dsq__bpe_gpt2_regex, err, err_len);
    } else {
        ERR("tokenizer: pre_tokenizer type '%s' not supported", type);
        rc = DSQ_EUNSUPPORTED;
    }
    return rc;
}

static bool has_bytelevel(const cJSON *p)
{
    if (!p) return false;
    const char *type = json_str(p, "type");
    if (type && strcmp(type, "ByteLevel") == 0) return true;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"))
        if (has_bytelevel(it)) return true;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "decoders"))
        if (has_bytelevel(it)) return true;
    return false;
}

dsq_tokenizer_t *dsq_tokenizer_from_hf(const char *path, char *err,
                                       size_t err_len)
{
    dsq_tokenizer_t *t = NULL;
    builder_t b = { 0 };
    char *json_path = NULL, *cfg_path = NULL, *text = NULL, *tmp = NULL;
    cJSON *root = NULL, *cfg = NULL;
    size_t len = 0;
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        ERR("tokenizer: %s does not exist", path ? path : "(null)");
        goto fail;
    }
    size_t pl = strlen(path);
    json_path = malloc(pl + 32);
    cfg_path = malloc(pl + 32);
    if (!json_path || !cfg_path) goto oom;
    if (S_ISDIR(st.st_mode)) {
        snprintf(json_path, pl + 32, "%s/tokenizer.json", path);
        snprintf(cfg_path, pl + 32, "%s/tokenizer_config.json", path);
    } else {
        snprintf(json_path, pl + 32, "%s", path);
        const char *slash = strrchr(path, '/');
        int dl = slash ? (int)(slash - path) : 1;
        snprintf(cfg_path, pl + 32, "%.*s/tokenizer_config.json", dl,
                 slash ? path : ".");
    }
    text = read_file(json_path, &len);
    if (!text) {
        ERR("tokenizer: cannot read %s", json_path);
        goto fail;
    }
    root = cJSON_ParseWithLength(text, len);
    free(text);
    text = read_file(cfg_path, &len);
    if (text) cfg = cJSON_ParseWithLength(text, len);  /* optional */
    free(text);
    text = NULL;
    if (!root) {
        ERR("tokenizer: %s is not valid JSON", json_path);
        goto fail;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mtype = json_str(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!mtype || strcmp(mtype, "BPE") != 0 || !cJSON_IsObject(vocab) ||
        !cJSON_IsArray(merges)) {
        ERR("tokenizer: %s: model.type must be BPE with vocab and merges",
            json_path);
        goto fail;
    }
    if (!has_bytelevel(pre) &&
        !has_bytelevel(cJSON_GetObjectItemCaseSensitive(root, "decoder"))) {
        ERR("tokenizer: %s: only byte-level BPE tokenizer.json is supported "
            "(SentencePiece-style: use the GGUF or tokenizer.model)", json_path);
        goto fail;
    }
    int64_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e8) {
            ERR("tokenizer: %s: bad id for vocab entry '%s'", json_path,
                it->string ? it->string : "?");
            goto fail;
        }
        if ((int64_t)it->valuedouble + 1 > n) n = (int64_t)it->valuedouble + 1;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8 ||
            !json_str(it, "content")) {
            ERR("tokenizer: %s: bad added_tokens entry", json_path);
            goto fail;
        }
        if ((int64_t)id->valuedouble + 1 > n) n = (int64_t)id->valuedouble + 1;
    }
    t = tok_alloc(&b, n, DSQ_TOKENIZER_BPE);
    if (!t) goto oom;
    int rc = 0;
    cJSON_ArrayForEach(it, vocab) {
        if (rc) break;
        rc = set_token(&b, (int32_t)it->valuedouble, it->string,
                       strlen(it->string), DSQ__TT_NORMAL);
    }
    cJSON_ArrayForEach(it, added) {
        if (rc) break;
        const char *c = json_str(it, "content");
        bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
        rc = set_token(&b, (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble,
                       c, strlen(c), special ? DSQ__TT_CONTROL : DSQ__TT_USER);
    }
    if (rc == 0) rc = finish_vocab(&b);
    if (rc) goto oom;

    uint32_t max_len = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->str_len[i] > max_len) max_len = t->str_len[i];
    tmp = malloc(2 * (size_t)max_len + 2);
    if (!tmp || merges_alloc(t, cJSON_GetArraySize(merges))) goto oom;
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *bb = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring;
            size_t l = strlen(s);
            const char *sp = l > 1 ? memchr(s + 1, ' ', l - 1) : NULL;
            if (sp) {
                a = s;
                la = (size_t)(sp - s);
                bb = sp + 1;
                lb = l - la - 1;
            }
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            bb = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(bb);
        }
        if (!a || la > max_len || lb > max_len) {
            t->n_merges++;
            continue;
        }
        merge_add(t, a, la, bb, lb, tmp);
    }
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    if (pre && !cJSON_IsNull(pre)) {
        if (add_pre(t, pre, err, err_len)) goto fail;
    } else if (dsq__bpe_add_regex(t, dsq__bpe_gpt2_regex, err, err_len)) {
        goto fail;
    }
    if (cfg) {
        const char *bos = json_token(cfg, "bos_token");
        const char *eos = json_token(cfg, "eos_token");
        const char *pad = json_token(cfg, "pad_token");
        const char *unk = json_token(cfg, "unk_token");
        if (bos) t->bos = dsq__tok_find(t, bos, strlen(bos));
        if (eos) t->eos = dsq__tok_find(t, eos, strlen(eos));
        if (pad) t->pad = dsq__tok_find(t, pad, strlen(pad));
        if (unk) t->unk = dsq__tok_find(t, unk, strlen(unk));
        t->add_bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token"));
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
        if (cJSON_IsArray(ct)) {  /* [{name, template}]: "default" or first */
            cJSON_ArrayForEach(it, ct) {
                const char *nm = json_str(it, "name");
                if (!tmpl || (nm && strcmp(nm, "default") == 0))
                    tmpl = json_str(it, "template");
            }
        }
        if (tmpl && !(t->chat_template = strdup(tmpl))) goto oom;
    }
    if (finish_rest(t)) goto oom;
    goto done;
oom:
    ERR("tokenizer: out of memory loading %s", path);
fail:
    builder_drop(&b);
    dsq_tokenizer_destroy(t);
    t = NULL;
done:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    free(json_path);
    free(cfg_path);
    free(text);
    free(tmp);
    return t;
}

/* ---- queries ---- */

dsq_tokenizer_kind_t dsq_tokenizer_kind(const dsq_tokenizer_t *t) { return t ? t->kind : DSQ_TOKENIZER_BPE; }
int32_t dsq_tokenizer_n_vocab(const dsq_tokenizer_t *t) { return t ? t->n_vocab : 0; }
int32_t dsq_tokenizer_bos(const dsq_tokenizer_t *t) { return t ? t->bos : -1; }
int32_t dsq_tokenizer_eos(const dsq_tokenizer_t *t) { return t ? t->eos : -1; }
int32_t dsq_tokenizer_pad(const dsq_tokenizer_t *t) { return t ? t->pad : -1; }
bool dsq_tokenizer_add_bos(const dsq_tokenizer_t *t) { return t && t->add_bos && t->bos >= 0; }

bool dsq_tokenizer_is_eog(const dsq_tokenizer_t *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}

bool dsq_tokenizer_is_special(const dsq_tokenizer_t *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && t->type[id] == DSQ__TT_CONTROL;
}

const char *dsq_tokenizer_chat_template(const dsq_tokenizer_t *t)
{
    return t ? t->chat_template : NULL;
}

int32_t dsq_tokenizer_find(const dsq_tokenizer_t *t, const char *text,
                           size_t len)
{
    return t && text ? dsq__tok_find(t, text, len) : -1;
}

const char *dsq_tokenizer_token_bytes(const dsq_tokenizer_t *t, int32_t id,
                                      size_t *len)
{
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->dec_len[id];
    return t->dec[id];
}

const char *dsq_tokenizer_token_str(const dsq_tokenizer_t *t, int32_t id,
                                    size_t *len)
{
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->str_len[id];
    return t->str[id];
}

/* ---- encode / decode ---- */

/* Longest special token allowed at text[i..len), or -1. */
static int32_t special_at(const dsq_tokenizer_t *t, const char *text,
                          size_t len, bool parse_special)
{
    if (!t->special_first[(unsigned char)text[0]]) return -1;
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        size_t sl = t->str_len[id];
        if (sl > len) continue;
        if (t->type[id] != DSQ__TT_USER && !parse_special) continue;
        if (memcmp(text, t->str[id], sl) == 0) return id;
    }
    return -1;
}

static int encode_fragment(const dsq_tokenizer_t *t, const char *text,
                           size_t len, bool first, bool prev_special,
                           dsq__ids_t *out)
{
    if (len == 0) return 0;
    if (t->kind == DSQ_TOKENIZER_SPM)
        return dsq__spm_encode(t, text, len, t->add_space_prefix && prev_special, out);
    if (t->add_prefix_space && first && text[0] != ' ') {
        char *s = malloc(len + 1);
        if (!s) return DSQ_ENOMEM;
        s[0] = ' ';
        memcpy(s + 1, text, len);
        int rc = dsq__bpe_encode(t, s, len + 1, out);
        free(s);
        return rc;
    }
    return dsq__bpe_encode(t, text, len, out);
}

int dsq_tokenizer_encode(const dsq_tokenizer_t *t, const char *text,
                         size_t len, unsigned flags, int32_t **ids,
                         size_t *n_ids)
{
    int rc = 0;
    dsq__ids_t out = { 0 };
    if (!t || (!text && len) || !ids || !n_ids) {
        rc = DSQ_EINVAL;
        goto out;
    }
    *ids = NULL;
    *n_ids = 0;
    if ((flags & DSQ_TOK_ADD_BOS) && t->bos >= 0) rc = dsq__ids_push(&out, t->bos);
    bool parse = (flags & DSQ_TOK_PARSE_SPECIAL) != 0;
    bool prev_special = true, first = true;
    size_t start = 0, i = 0;
    while (i < len && rc == 0) {
        int32_t sid = t->n_special ? special_at(t, text + i, len - i, parse) : -1;
        if (sid < 0) {
            i++;
            continue;
        }
        if (i > start) {
            rc = encode_fragment(t, text + start, i - start, first,
                                 prev_special, &out);
            first = false;
        }
        if (rc == 0) rc = dsq__ids_push(&out, sid);
        prev_special = true;
        i += t->str_len[sid];
        start = i;
    }
    if (rc == 0 && start < len)
        rc = encode_fragment(t, text + start, len - start, first, prev_special, &out);
    if (rc == 0 && !out.v) {  /* no ids: still hand back a buffer */
        out.v = malloc(sizeof(*out.v));
        if (!out.v) rc = DSQ_ENOMEM;
    }
    if (rc == 0) {
        *ids = out.v;
        *n_ids = out.n;
        out.v = NULL;
    }
out:
    free(out.v);
    return rc;
}

bool dsq__tok_strips_space(const dsq_tokenizer_t *t)
{
    return t->kind == DSQ_TOKENIZER_SPM && t->add_space_prefix;
}

int dsq_tokenizer_decode(const dsq_tokenizer_t *t, const int32_t *ids,
                         size_t n_ids, bool skip_special, char **text,
                         size_t *len)
{
    int rc = 0;
    char *buf = NULL;
    if (!t || (!ids && n_ids) || !text) {
        rc = DSQ_EINVAL;
        goto out;
    }
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            rc = DSQ_ERANGE;
            goto out;
        }
        total += t->dec_len[ids[i]];
    }
    buf = malloc(total + 1);
    if (!buf) {
        rc = DSQ_ENOMEM;
        goto out;
    }
    size_t n = 0;
    bool strip = dsq__tok_strips_space(t);
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        bool control = t->type[id] == DSQ__TT_CONTROL;
        if (skip_special && control) continue;
        const char *s = t->dec[id];
        size_t l = t->dec_len[id];
        if (strip && !control) {
            if (l && s[0] == ' ') {
                s++;
                l--;
            }
            strip = false;
        }
        memcpy(buf + n, s, l);
        n += l;
    }
    buf[n] = '\0';
    *text = buf;
    if (len) *len = n;
    buf = NULL;
out:
    free(buf);
    return rc;
}

/* ---- merge candidate heap (shared by tokenizer_bpe.c and tokenizer_spm.c) ---- */

static bool cand_less(const dsq__cand_t *x, const dsq__cand_t *y)
{
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}

int dsq__heap_push(dsq__heap_t *h, dsq__cand_t c)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        dsq__cand_t *v = realloc(h->v, cap * sizeof(*v));
        if (!v)
            return DSQ_ENOMEM;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
    return DSQ_OK;
}

dsq__cand_t dsq__heap_pop(dsq__heap_t *h)
{
    dsq__cand_t top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && cand_less(&h->v[c + 1], &h->v[c]))
            c++;
        if (!cand_less(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

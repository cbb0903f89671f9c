/* Byte-level BPE (GPT-2 style): the pre-tokenizer and the merge loop.
 *
 * Pre-tokenizer: a sequence of regexes, each applied to every piece left by
 * the previous one, keeping both the matches and the gaps between them as
 * pieces (HF tokenizers Split with behavior "Isolated"). The regexes per
 * tokenizer.ggml.pre name are those of each family's HF tokenizer.json (as
 * listed per pre type in llama.cpp llama-vocab.cpp); they are compiled with
 * PCRE2 in UTF + UCP mode (\p{L}, \p{N}, \s are Unicode-aware) and with
 * PCRE2_MATCH_INVALID_UTF so arbitrary bytes never make a match fail hard:
 * invalid bytes simply end up in gaps and are encoded byte-wise.
 *
 * Merge loop: every byte of a piece starts as the token of its GPT-2
 * bytes_to_unicode character; adjacent pairs are merged lowest rank first
 * (leftmost on ties), as in HF tokenizers' BPE word merge. Pairs live in a
 * binary heap and stale entries are dropped when popped, so a piece of n
 * bytes costs O(n log n), not O(n^2).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "tokenizer_internal.h"

const char dsq__bpe_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
    "|\\s+(?!\\S)|\\s+";

static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* DeepSeek LLM 7B/67B (and V2): five Split regexes after newlines. */
static const char *const re_deepseek_llm[] = {
    "[\\r\\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf"
    "\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f"
    "\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd"
    "\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
    "\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
    "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
    NULL,
};

/* DeepSeek Coder 1.3B/6.7B/33B. */
static const char *const re_deepseek_coder[] = {
    "[\\r\\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}",
    NULL,
};

/* DeepSeek V3 / R1 (from its tokenizer.json pre_tokenizer). */
static const char *const re_deepseek_v3[] = {
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};

int dsq__bpe_add_regex(dsq_tokenizer_t *t, const char *pattern, char *err,
                       size_t err_len)
{
    int rc = 0;
    if (t->n_regex >= DSQ__MAX_REGEX) {
        snprintf(err, err_len, "tokenizer: more than %d pre-tokenizer regexes",
                 DSQ__MAX_REGEX);
        rc = DSQ_EUNSUPPORTED;
        goto out;
    }
    int ecode = 0;
    PCRE2_SIZE eoff = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP |
                                       PCRE2_MATCH_INVALID_UTF,
                                   &ecode, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof(msg));
        snprintf(err, err_len,
                 "tokenizer: pre-tokenizer regex does not compile at %zu: %s",
                 (size_t)eoff, (const char *)msg);
        rc = DSQ_EFORMAT;
        goto out;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  /* optional speed-up */
    t->regex[t->n_regex++] = re;
out:
    return rc;
}

static int add_list(dsq_tokenizer_t *t, const char *const *list, char *err,
                    size_t err_len)
{
    int rc = 0;
    for (int i = 0; list[i] && rc == 0; i++)
        rc = dsq__bpe_add_regex(t, list[i], err, err_len);
    return rc;
}

int dsq__bpe_set_pre(dsq_tokenizer_t *t, const char *pre, char *err,
                     size_t err_len)
{
    static const char *const gpt2[] = { dsq__bpe_gpt2_regex, NULL };
    static const char *const digits_gpt2[] = { "\\p{N}", dsq__bpe_gpt2_regex,
                                               NULL };
    static const char *const llama3[] = { re_llama3, NULL };
    static const char *const qwen2[] = { re_qwen2, NULL };
    static const struct { const char *name; const char *const *list;
                          bool ignore_merges; } table[] = {
        { "default", gpt2, false },          { "gpt-2", gpt2, false },
        { "gpt2", gpt2, false },             { "llama-bpe", llama3, true },
        { "llama3", llama3, true },          { "llama-v3", llama3, true },
        { "dbrx", llama3, false },           { "smaug-bpe", llama3, false },
        { "deepseek-llm", re_deepseek_llm, false },
        { "deepseek-coder", re_deepseek_coder, false },
        { "deepseek-v3", re_deepseek_v3, false },
        { "qwen2", qwen2, false },           { "deepseek-r1-qwen", qwen2, false },
        { "smollm", digits_gpt2, false },    { "starcoder", digits_gpt2, false },
        { "refact", digits_gpt2, false },    { "command-r", digits_gpt2, false },
        { "codeshell", digits_gpt2, false },
    };
    int rc = DSQ_EUNSUPPORTED;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (strcmp(pre, table[i].name) == 0) {
            t->ignore_merges = table[i].ignore_merges;
            rc = add_list(t, table[i].list, err, err_len);
            goto out;
        }
    }
    snprintf(err, err_len, "tokenizer: unknown tokenizer.ggml.pre '%s'", pre);
out:
    return rc;
}

void dsq__bpe_free(dsq_tokenizer_t *t)
{
    for (int i = 0; i < t->n_regex; i++)
        pcre2_code_free((pcre2_code *)t->regex[i]);
    t->n_regex = 0;
}

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order. */
void dsq__bpe_byte_map(uint32_t byte_to_cp[256])
{
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) ||
                    (b >= 0xae && b <= 0xff);
        byte_to_cp[b] = keep ? (uint32_t)b : 256u + n++;
    }
}

/* ---- pre-tokenizer ---- */

typedef struct range { size_t off, len; } range_t;
typedef struct ranges { range_t *v; size_t n, cap; } ranges_t;

static int ranges_push(ranges_t *r, size_t off, size_t len)
{
    if (len == 0) return 0;
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        range_t *v = realloc(r->v, cap * sizeof(*v));
        if (!v) return DSQ_ENOMEM;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n].off = off;
    r->v[r->n].len = len;
    r->n++;
    return 0;
}

/* Split each range of in by re (matches and gaps both kept) into out. */
static int split_ranges(const pcre2_code *re, pcre2_match_data *md,
                        const char *text, const ranges_t *in, ranges_t *out)
{
    int rc = 0;
    out->n = 0;
    for (size_t i = 0; i < in->n && rc == 0; i++) {
        PCRE2_SPTR subj = (PCRE2_SPTR)(text + in->v[i].off);
        size_t len = in->v[i].len, pos = 0, last = 0;
        while (pos < len && rc == 0) {
            int m = pcre2_match(re, subj, len, pos, 0, md, NULL);
            if (m == PCRE2_ERROR_JIT_STACKLIMIT)
                m = pcre2_match(re, subj, len, pos, PCRE2_NO_JIT, md, NULL);
            if (m < 0) break;  /* no match (or a limit): rest is one gap */
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t s = ov[0], e = ov[1];
            if (e <= s) {  /* empty match: step one character */
                pos = s + 1;
                while (pos < len && (subj[pos] & 0xc0) == 0x80) pos++;
                continue;
            }
            rc = ranges_push(out, in->v[i].off + last, s - last);
            if (rc == 0) rc = ranges_push(out, in->v[i].off + s, e - s);
            last = pos = e;
        }
        if (rc == 0) rc = ranges_push(out, in->v[i].off + last, len - last);
    }
    return rc;
}

/* ---- merge loop ---- */

static const dsq__merge_t *find_merge(const dsq_tokenizer_t *t, int32_t a,
                                      int32_t b)
{
    if (!t->merges || a < 0 || b < 0) return NULL;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    k *= 0x9e3779b97f4a7c15ull;
    uint32_t i = (uint32_t)(k >> 32) & t->merge_mask;
    for (;;) {
        const dsq__merge_t *m = &t->merges[i];
        if (m->rank < 0) return NULL;
        if (m->a == a && m->b == b) return m;
        i = (i + 1) & t->merge_mask;
    }
}

typedef struct work {
    int32_t *id, *next, *prev;
    size_t cap;
    dsq__heap_t heap;
    char *buf;       /* byte-level string of a piece (ignore_merges) */
    size_t buf_cap;
} work_t;

static int work_reserve(work_t *w, size_t n)
{
    if (n <= w->cap) return 0;
    int32_t *id = realloc(w->id, n * sizeof(*id));
    if (id) w->id = id;
    int32_t *nx = realloc(w->next, n * sizeof(*nx));
    if (nx) w->next = nx;
    int32_t *pv = realloc(w->prev, n * sizeof(*pv));
    if (pv) w->prev = pv;
    if (!id || !nx || !pv) return DSQ_ENOMEM;
    w->cap = n;
    return 0;
}

static int try_pair(const dsq_tokenizer_t *t, work_t *w, int32_t l)
{
    if (l < 0 || w->next[l] < 0) return 0;
    const dsq__merge_t *m = find_merge(t, w->id[l], w->id[w->next[l]]);
    if (!m) return 0;
    dsq__cand_t c = { .key = m->rank, .left = l, .a = m->a, .b = m->b };
    return dsq__heap_push(&w->heap, c);
}

/* Whole piece as a token (llama3 ignore_merges). */
static int32_t whole_piece(const dsq_tokenizer_t *t, work_t *w,
                           const unsigned char *p, size_t len)
{
    static uint32_t cp[256];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        uint32_t tmp[256];
        dsq__bpe_byte_map(tmp);
        memcpy(cp, tmp, sizeof(cp));
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    if (w->buf_cap < 2 * len) {
        char *b = realloc(w->buf, 2 * len);
        if (!b) return -1;
        w->buf = b;
        w->buf_cap = 2 * len;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t c = cp[p[i]];
        if (c < 0x80) {
            w->buf[n++] = (char)c;
        } else {
            w->buf[n++] = (char)(0xc0 | (c >> 6));
            w->buf[n++] = (char)(0x80 | (c & 0x3f));
        }
    }
    return dsq__tok_find(t, w->buf, n);
}

static int encode_piece(const dsq_tokenizer_t *t, work_t *w,
                        const unsigned char *p, size_t len, dsq__ids_t *out)
{
    int rc = 0;
    if (t->ignore_merges && len > 1) {
        int32_t id = whole_piece(t, w, p, len);
        if (id >= 0) {
            rc = dsq__ids_push(out, id);
            goto out;
        }
    }
    rc = work_reserve(w, len);
    if (rc) goto out;
    for (size_t i = 0; i < len; i++) {
        w->id[i] = t->byte_id[p[i]];
        w->next[i] = i + 1 < len ? (int32_t)(i + 1) : -1;
        w->prev[i] = (int32_t)i - 1;
    }
    w->heap.n = 0;
    for (size_t i = 0; i + 1 < len && rc == 0; i++)
        rc = try_pair(t, w, (int32_t)i);
    while (w->heap.n && rc == 0) {
        dsq__cand_t c = dsq__heap_pop(&w->heap);
        int32_t l = c.left, r = w->next[l];
        if (w->id[l] != c.a || r < 0 || w->id[r] != c.b) continue;
        w->id[l] = find_merge(t, c.a, c.b)->id;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        w->id[r] = -2;
        w->next[r] = -1;
        rc = try_pair(t, w, w->prev[l]);
        if (rc == 0) rc = try_pair(t, w, l);
    }
    for (int32_t i = 0; i >= 0 && rc == 0 && len; i = w->next[i]) {
        int32_t id = w->id[i];
        if (id < 0) id = t->unk;   /* byte with no token: unk or dropped */
        if (id >= 0) rc = dsq__ids_push(out, id);
    }
out:
    return rc;
}

int dsq__bpe_encode(const dsq_tokenizer_t *t, const char *text, size_t len,
                    dsq__ids_t *out)
{
    int rc = 0;
    ranges_t a = { 0 }, b = { 0 };
    work_t w = { 0 };
    pcre2_match_data *md = NULL;
    if (len == 0) goto out;
    rc = ranges_push(&a, 0, len);
    for (int k = 0; k < t->n_regex && rc == 0; k++) {
        const pcre2_code *re = t->regex[k];
        md = pcre2_match_data_create_from_pattern(re, NULL);
        if (!md) {
            rc = DSQ_ENOMEM;
            break;
        }
        rc = split_ranges(re, md, text, &a, &b);
        pcre2_match_data_free(md);
        md = NULL;
        ranges_t tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t i = 0; i < a.n && rc == 0; i++)
        rc = encode_piece(t, &w, (const unsigned char *)text + a.v[i].off,
                          a.v[i].len, out);
out:
    free(a.v);
    free(b.v);
    free(w.id);
    free(w.next);
    free(w.prev);
    free(w.heap.v);
    free(w.buf);
    return rc;
}

/* The grammar matcher, the vocabulary walk and the mask cache (grammar.h).
 *
 * A state is a set of stacks of element indices into g->el. The top of a
 * non-empty stack is always a GT_CHARS element: the next character class
 * to match; below it, the positions to continue at once the rules above
 * are finished. An empty stack is a finished sentence. Reading a code point
 * c: every stack whose top class holds c pops it, pushes the next element
 * of that alternative (unless the alternative ends there), and is then
 * expanded: while the top is a GT_REF, it is replaced by one stack per
 * alternative of the referenced rule (the continuation after the
 * reference stays below). Tail references push nothing, so x* as
 * R ::= x R | runs in constant stack depth. This is the pushdown
 * recognizer of llama.cpp's llama-grammar.cpp, re-derived here; it is
 * exact for any grammar without left recursion (grammar.c rejects that).
 *
 * Bytes: a state also carries a pending UTF-8 character (the bits read so
 * far and the number of continuation bytes still to come). While a
 * character is pending, only stacks whose top class meets the range of
 * code points that could still complete it are kept.
 */
#include "grammar_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

typedef struct gstate {
    uint32_t n;              /* stacks */
    uint32_t *off;           /* [n + 1] start of each stack in pos */
    uint32_t *pos;           /* concatenated stacks, bottom first */
    uint32_t cap_n, cap_pos;
    uint32_t partial;        /* bits of the pending character */
    uint8_t left;            /* continuation bytes still expected */
    uint8_t need;            /* continuation bytes of the pending character */
    uint8_t overflow;        /* a limit dropped a stack */
} gstate_t;

struct dsq_grammar_matcher {
    const dsq_grammar_t *g;
    gstate_t cur, a, b, work;
    uint32_t *tmp;           /* [DSQ_GRAMMAR_MAX_DEPTH + 2] */
    gstate_t *depth;         /* mask walk: state after d bytes of a prefix */
    uint32_t n_depth;
    uint32_t *key;           /* serialised cur for the cache */
    size_t cap_key;
    bool ended;              /* an end token was accepted */
};

/* ------------------------------------------------------------------ state */

static void st_free(gstate_t *s)
{
    free(s->off);
    free(s->pos);
    memset(s, 0, sizeof(*s));
}

static int st_reserve(gstate_t *s, uint32_t n, uint32_t npos)
{
    if (n + 1 > s->cap_n) {
        uint32_t cap = s->cap_n ? s->cap_n : 8;
        while (cap < n + 1)
            cap *= 2;
        uint32_t *o = realloc(s->off, cap * sizeof(*o));
        if (!o)
            return DSQ_ENOMEM;
        s->off = o;
        s->cap_n = cap;
    }
    if (npos > s->cap_pos || !s->pos) {   /* pos never NULL: pos + 0 stays defined */
        uint32_t cap = s->cap_pos ? s->cap_pos : 64;
        while (cap < npos)
            cap *= 2;
        uint32_t *p = realloc(s->pos, cap * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        s->pos = p;
        s->cap_pos = cap;
    }
    return DSQ_OK;
}

static int st_reset(gstate_t *s)
{
    if (st_reserve(s, 0, 0))
        return DSQ_ENOMEM;
    s->n = 0;
    s->off[0] = 0;
    s->partial = 0;
    s->left = s->need = 0;
    s->overflow = 0;
    return DSQ_OK;
}

static uint64_t hash_stack(const uint32_t *a, uint32_t L)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ L;
    for (uint32_t i = 0; i < L; i++) {
        h ^= a[i];
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return h;
}

/* Append stack a[0..L) unless s holds it already (dedup). States hold a
 * few stacks as a rule, so the check compares length and top first, then
 * the words; no hash. */
static int st_add(gstate_t *s, const uint32_t *a, uint32_t L, int dedup)
{
    if (dedup && s->n > 0) {
        uint32_t top = L ? a[L - 1] : 0;
        for (uint32_t i = 0; i < s->n; i++) {
            uint32_t o = s->off[i];
            if (s->off[i + 1] - o == L && (L == 0 || (s->pos[o + L - 1] == top &&
                memcmp(s->pos + o, a, (L - 1) * sizeof(*a)) == 0)))
                return DSQ_OK;
        }
    }
    if (dedup && s->n >= DSQ_GRAMMAR_MAX_STACKS) {
        s->overflow = 1;
        return DSQ_OK;
    }
    if ((s->n + 2 > s->cap_n || s->off[s->n] + L > s->cap_pos) &&
        st_reserve(s, s->n + 1, s->off[s->n] + L))
        return DSQ_ENOMEM;
    memcpy(s->pos + s->off[s->n], a, L * sizeof(*a));
    s->n++;
    s->off[s->n] = s->off[s->n - 1] + L;
    return DSQ_OK;
}

static int st_copy(gstate_t *d, const gstate_t *s)
{
    if (st_reserve(d, s->n, s->off[s->n]))
        return DSQ_ENOMEM;
    d->n = s->n;
    memcpy(d->off, s->off, (s->n + 1) * sizeof(*s->off));
    memcpy(d->pos, s->pos, s->off[s->n] * sizeof(*s->pos));
    d->partial = s->partial;
    d->left = s->left;
    d->need = s->need;
    d->overflow = s->overflow;
    return DSQ_OK;
}

#define EXPAND_BUDGET (1u << 16)      /* references expanded + stacks pushed */
#define EXPAND_MAX_WORDS (1u << 22)   /* scratch positions: 16 MiB */

/* Expand stack a[0..L) (its top may be a GT_REF) into stacks whose top is
 * a character class, or that are empty, and add them to out. w is scratch;
 * tmp holds DSQ_GRAMMAR_MAX_DEPTH + 2 words. */
static int expand(const dsq_grammar_t *g, gstate_t *out, const uint32_t *a, uint32_t L,
                  gstate_t *w, uint32_t *tmp)
{
    if (L == 0 || G_TYPE(g->el[a[L - 1]]) == GT_CHARS)
        return st_add(out, a, L, 1);   /* nothing to expand (most steps) */
    if (st_reset(w) || st_add(w, a, L, 0))
        return DSQ_ENOMEM;
    uint32_t budget = EXPAND_BUDGET;
    while (w->n > 0) {
        uint32_t i = w->n - 1, bl = w->off[i + 1] - w->off[i];
        const uint32_t *b = w->pos + w->off[i];
        if (bl == 0 || G_TYPE(g->el[b[bl - 1]]) == GT_CHARS) {
            if (st_add(out, b, bl, 1))
                return DSQ_ENOMEM;
            w->n--;
            continue;
        }
        if (--budget == 0) {
            out->overflow = 1;
            return DSQ_OK;
        }
        /* top is a reference: base = below it + its continuation */
        uint32_t p = b[bl - 1], r = G_VAL(g->el[p]);
        memcpy(tmp, b, (bl - 1) * sizeof(*tmp));
        uint32_t base = bl - 1;
        if (!G_ENDS(g->el[p + 1]))
            tmp[base++] = p + 1;
        w->n--;
        for (uint32_t q = g->rule_start[r];;) {
            uint32_t nl = base;
            if (!G_ENDS(g->el[q]))
                tmp[nl++] = q;
            /* every pushed stack costs budget too, and the scratch holds
             * at most EXPAND_MAX_WORDS: a rule with many alternatives behind
             * a long nullable chain cannot grow it without bound */
            if (--budget == 0 || w->off[w->n] + nl > EXPAND_MAX_WORDS) {
                out->overflow = 1;
                return DSQ_OK;
            }
            if (nl > DSQ_GRAMMAR_MAX_DEPTH)
                out->overflow = 1;
            else if (st_add(w, tmp, nl, 0))
                return DSQ_ENOMEM;
            while (!G_ENDS(g->el[q]))
                q++;
            if (G_TYPE(g->el[q]) == GT_END)
                break;
            q++;
        }
    }
    return DSQ_OK;
}

static int st_initial(const dsq_grammar_t *g, gstate_t *out, gstate_t *w, uint32_t *tmp)
{
    if (st_reset(out))
        return DSQ_ENOMEM;
    /* one stack per alternative of the start rule */
    for (uint32_t q = g->rule_start[g->root];;) {
        uint32_t one = q;
        int rc = expand(g, out, &one, G_ENDS(g->el[q]) ? 0 : 1, w, tmp);
        if (rc)
            return rc;
        while (!G_ENDS(g->el[q]))
            q++;
        if (G_TYPE(g->el[q]) == GT_END)
            break;
        q++;
    }
    return DSQ_OK;
}

/* out = in after code point cp (no character pending in in). */
static int st_step_cp(const dsq_grammar_t *g, const gstate_t *in, uint32_t cp, gstate_t *out,
                      gstate_t *w, uint32_t *tmp)
{
    if (st_reset(out))
        return DSQ_ENOMEM;
    for (uint32_t i = 0; i < in->n; i++) {
        uint32_t L = in->off[i + 1] - in->off[i];
        if (L == 0)
            continue;
        const uint32_t *a = in->pos + in->off[i];
        uint32_t p = a[L - 1];
        if (!g_cs_has(g, G_VAL(g->el[p]), cp))
            continue;
        /* tmp is expand's scratch too: build the popped stack in the tail */
        uint32_t *nb = tmp + DSQ_GRAMMAR_MAX_DEPTH + 2;
        memcpy(nb, a, (L - 1) * sizeof(*nb));
        uint32_t nl = L - 1;
        if (!G_ENDS(g->el[p + 1]))
            nb[nl++] = p + 1;
        int rc = expand(g, out, nb, nl, w, tmp);
        if (rc)
            return rc;
    }
    out->overflow |= in->overflow;
    return DSQ_OK;
}

/* Keep the stacks of in whose top class meets [lo, hi] (a character is
 * pending); partial / left / need as given. */
static int st_prune(const dsq_grammar_t *g, const gstate_t *in, uint32_t lo, uint32_t hi,
                    gstate_t *out)
{
    if (st_reset(out))
        return DSQ_ENOMEM;
    for (uint32_t i = 0; i < in->n; i++) {
        uint32_t L = in->off[i + 1] - in->off[i];
        if (L == 0)
            continue;
        const uint32_t *a = in->pos + in->off[i];
        if (g_cs_meets(g, G_VAL(g->el[a[L - 1]]), lo, hi) && st_add(out, a, L, 0))
            return DSQ_ENOMEM;
    }
    out->overflow = in->overflow;
    return DSQ_OK;
}

/* The code points a pending character can still become: bits v read so
 * far, left continuation bytes to come, need in all; a character of
 * need + 1 bytes is at least 0x80 / 0x800 / 0x10000 (shorter forms are
 * overlong, RFC 3629) and at most U+10FFFF. */
static const uint32_t utf8_min[4] = {0, 0x80, 0x800, 0x10000};

static uint32_t char_lo(uint32_t v, unsigned left, unsigned need)
{
    uint32_t lo = v << (6 * left);
    return lo < utf8_min[need] ? utf8_min[need] : lo;
}

static uint32_t char_hi(uint32_t v, unsigned left)
{
    uint32_t hi = (v << (6 * left)) | ((1u << (6 * left)) - 1);
    return hi > G_MAX_CP ? G_MAX_CP : hi;
}

/* A character is pending whose code point lies in [lo, hi]: keep the
 * stacks that can still take it. An empty range (an overlong or too-large
 * prefix such as E0 80 or F4 90) or one of surrogates only (ED A0..) can
 * never complete, so it is rejected here, not one byte later. */
static int st_pending(const dsq_grammar_t *g, const gstate_t *in, uint32_t lo, uint32_t hi,
                      gstate_t *out)
{
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF))
        return st_reset(out);
    return st_prune(g, in, lo, hi, out);
}

/* out = in after byte c. out->n == 0: rejected. */
static int st_step_byte(const dsq_grammar_t *g, const gstate_t *in, uint8_t c, gstate_t *out,
                        gstate_t *w, uint32_t *tmp)
{
    if (in->left == 0) {
        if (c < 0x80)
            return st_step_cp(g, in, c, out, w, tmp);
        uint32_t v;
        uint8_t need;
        if (c >= 0xC2 && c <= 0xDF) {
            v = c & 0x1Fu;
            need = 1;
        } else if ((c & 0xF0) == 0xE0) {
            v = c & 0x0Fu;
            need = 2;
        } else if (c >= 0xF0 && c <= 0xF4) {
            v = c & 0x07u;
            need = 3;
        } else {
            return st_reset(out);        /* not a lead byte: rejected */
        }
        int rc = st_pending(g, in, char_lo(v, need, need), char_hi(v, need), out);
        out->partial = v;
        out->left = out->need = need;
        return rc;
    }
    if ((c & 0xC0) != 0x80)
        return st_reset(out);
    uint32_t v = (in->partial << 6) | (c & 0x3Fu);
    uint8_t left = (uint8_t)(in->left - 1);
    if (left == 0) {
        if (v < utf8_min[in->need] || v > G_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
            return st_reset(out);
        return st_step_cp(g, in, v, out, w, tmp);
    }
    int rc = st_pending(g, in, char_lo(v, left, in->need), char_hi(v, left), out);
    out->partial = v;
    out->left = left;
    out->need = in->need;
    return rc;
}

static bool st_accepts(const gstate_t *s)
{
    if (s->left)
        return false;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->off[i + 1] == s->off[i])
            return true;
    return false;
}

/* --------------------------------------------------------------- matcher */

static dsq_grammar_matcher_t *matcher_alloc(const dsq_grammar_t *g)
{
    dsq_grammar_matcher_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->g = g;
    m->tmp = malloc(2 * (DSQ_GRAMMAR_MAX_DEPTH + 2) * sizeof(*m->tmp));
    if (!m->tmp || st_reset(&m->cur) || st_reset(&m->a) || st_reset(&m->b) ||
        st_reset(&m->work)) {
        dsq_grammar_matcher_free(m);
        return NULL;
    }
    return m;
}

dsq_grammar_matcher_t *dsq_grammar_matcher_create(const dsq_grammar_t *g)
{
    if (!g)
        return NULL;
    dsq_grammar_matcher_t *m = matcher_alloc(g);
    if (m && st_initial(g, &m->cur, &m->work, m->tmp)) {
        dsq_grammar_matcher_free(m);
        return NULL;
    }
    return m;
}

int dsq__grammar_check_start(const dsq_grammar_t *g)
{
    dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
    if (!m)
        return DSQ_ENOMEM;
    int rc = m->cur.overflow ? DSQ_ERANGE : DSQ_OK;
    dsq_grammar_matcher_free(m);
    return rc;
}

dsq_grammar_matcher_t *dsq_grammar_matcher_clone(const dsq_grammar_matcher_t *src)
{
    if (!src)
        return NULL;
    dsq_grammar_matcher_t *m = matcher_alloc(src->g);
    if (m && st_copy(&m->cur, &src->cur)) {
        dsq_grammar_matcher_free(m);
        return NULL;
    }
    if (m)
        m->ended = src->ended;
    return m;
}

void dsq_grammar_matcher_free(dsq_grammar_matcher_t *m)
{
    if (!m)
        return;
    st_free(&m->cur);
    st_free(&m->a);
    st_free(&m->b);
    st_free(&m->work);
    for (uint32_t d = 0; d < m->n_depth; d++)
        st_free(&m->depth[d]);
    free(m->depth);
    free(m->tmp);
    free(m->key);
    free(m);
}

int dsq_grammar_matcher_accept_bytes(dsq_grammar_matcher_t *m, const void *bytes, size_t n)
{
    if (!m || (!bytes && n))
        return DSQ_EINVAL;
    if (m->ended)
        return n ? DSQ_EINVAL : DSQ_OK;
    const uint8_t *s = bytes;
    const gstate_t *in = &m->cur;
    gstate_t *bufs[2] = {&m->a, &m->b};
    for (size_t i = 0; i < n; i++) {
        gstate_t *out = bufs[i & 1];
        int rc = st_step_byte(m->g, in, s[i], out, &m->work, m->tmp);
        if (rc)
            return rc;
        if (out->n == 0)
            return DSQ_EINVAL;
        in = out;
    }
    if (n == 0)
        return DSQ_OK;
    /* swap the result into cur (no copy) */
    gstate_t *res = bufs[(n - 1) & 1], t = m->cur;
    m->cur = *res;
    *res = t;
    return DSQ_OK;
}

bool dsq_grammar_matcher_can_end(const dsq_grammar_matcher_t *m)
{
    return m && !m->ended && st_accepts(&m->cur);
}

bool dsq_grammar_matcher_done(const dsq_grammar_matcher_t *m)
{
    if (!m || m->ended)
        return true;
    if (m->cur.left)
        return false;
    for (uint32_t i = 0; i < m->cur.n; i++)
        if (m->cur.off[i + 1] != m->cur.off[i])
            return false;
    return true;
}

/* ------------------------------------------------------------ vocabulary */

int dsq_grammar_matcher_accept_token(dsq_grammar_matcher_t *m, const dsq_grammar_vocab_t *v,
                                     int32_t id)
{
    if (!m || !v)
        return DSQ_EINVAL;
    if (id < 0 || id >= v->n_vocab)
        return DSQ_ERANGE;
    if (m->ended)
        return DSQ_EINVAL;
    if (v->kind[id] == KIND_EOG) {
        if (!st_accepts(&m->cur))
            return DSQ_EINVAL;
        m->ended = true;
        return DSQ_OK;
    }
    if (v->kind[id] == KIND_NEVER)
        return DSQ_EINVAL;
    return dsq_grammar_matcher_accept_bytes(m, v->by_id[id].bytes, v->by_id[id].len);
}

/* ------------------------------------------------------------ mask cache */

#define CACHE_MAX_BYTES (16u << 20)   /* grammar.h: per grammar */

void dsq__grammar_cache_init(dsq_grammar_t *g)
{
    pthread_mutex_init(&g->cache_mu, NULL);
    g->cache_ready = 1;
    g->cache_max_bytes = CACHE_MAX_BYTES;
}

static void entry_free(g_cache_entry_t *e)
{
    free(e->key);
    free(e->mask);
    memset(e, 0, sizeof(*e));
}

void dsq__grammar_cache_free(dsq_grammar_t *g)
{
    for (uint32_t i = 0; i < g->cache_n; i++)
        entry_free(&g->cache[i]);
    free(g->cache);
    g->cache = NULL;
    if (g->cache_ready)
        pthread_mutex_destroy(&g->cache_mu);
    g->cache_ready = 0;
}

/* cur serialised: partial, left, need, n, then each stack's length and
 * positions */
static int make_key(dsq_grammar_matcher_t *m, uint64_t *hash)
{
    const gstate_t *s = &m->cur;
    size_t n = 4 + s->n + s->off[s->n];
    if (n > m->cap_key) {
        uint32_t *k = realloc(m->key, n * sizeof(*k));
        if (!k)
            return DSQ_ENOMEM;
        m->key = k;
        m->cap_key = n;
    }
    uint32_t *k = m->key, j = 0;
    k[j++] = s->partial;
    k[j++] = s->left;
    k[j++] = s->need;
    k[j++] = s->n;
    for (uint32_t i = 0; i < s->n; i++) {
        k[j++] = s->off[i + 1] - s->off[i];
        memcpy(k + j, s->pos + s->off[i], (s->off[i + 1] - s->off[i]) * sizeof(*k));
        j += s->off[i + 1] - s->off[i];
    }
    *hash = hash_stack(k, j);
    return (int)j;
}

static int cache_get(dsq_grammar_t *g, const dsq_grammar_vocab_t *v, const uint32_t *key,
                     uint32_t key_len, uint64_t h, uint32_t *mask, size_t words)
{
    int found = -1;
    pthread_mutex_lock(&g->cache_mu);
    for (uint32_t i = 0; i < g->cache_n; i++) {
        g_cache_entry_t *e = &g->cache[i];
        if (e->hash == h && e->vocab == v && e->key_len == key_len &&
            memcmp(e->key, key, key_len * sizeof(*key)) == 0) {
            memcpy(mask, e->mask, words * sizeof(*mask));
            found = e->n_allowed;
            break;
        }
    }
    pthread_mutex_unlock(&g->cache_mu);
    return found;
}

static void cache_put(dsq_grammar_t *g, const dsq_grammar_vocab_t *v, const uint32_t *key,
                      uint32_t key_len, uint64_t h, const uint32_t *mask, size_t words,
                      int n_allowed)
{
    size_t bytes = key_len * sizeof(*key) + words * sizeof(*mask);
    if (bytes > g->cache_max_bytes / 4)
        return;
    g_cache_entry_t e = {.hash = h, .vocab = v, .key_len = key_len, .n_allowed = n_allowed,
                         .bytes = bytes};
    e.key = malloc(key_len * sizeof(*key));
    e.mask = malloc(words * sizeof(*mask));
    if (!e.key || !e.mask) {
        entry_free(&e);
        return;
    }
    memcpy(e.key, key, key_len * sizeof(*key));
    memcpy(e.mask, mask, words * sizeof(*mask));
    pthread_mutex_lock(&g->cache_mu);
    if (!g->cache) {
        g->cache_cap = 1024;
        g->cache = calloc(g->cache_cap, sizeof(*g->cache));
        if (!g->cache) {
            g->cache_cap = 0;
            pthread_mutex_unlock(&g->cache_mu);
            entry_free(&e);
            return;
        }
    }
    /* evict the oldest until the new entry fits */
    uint32_t drop = 0;
    size_t kept = g->cache_bytes;
    while (drop < g->cache_n && (g->cache_n - drop == g->cache_cap || kept + bytes > g->cache_max_bytes))
        kept -= g->cache[drop++].bytes;
    for (uint32_t i = 0; i < drop; i++)
        entry_free(&g->cache[i]);
    memmove(g->cache, g->cache + drop, (g->cache_n - drop) * sizeof(*g->cache));
    g->cache_n -= drop;
    g->cache_bytes = kept;
    g->cache[g->cache_n++] = e;
    g->cache_bytes += bytes;
    pthread_mutex_unlock(&g->cache_mu);
}

/* ------------------------------------------------------------------ mask */

static int ensure_depth(dsq_grammar_matcher_t *m, uint32_t n)
{
    if (n <= m->n_depth)
        return DSQ_OK;
    gstate_t *d = realloc(m->depth, n * sizeof(*d));
    if (!d)
        return DSQ_ENOMEM;
    memset(d + m->n_depth, 0, (n - m->n_depth) * sizeof(*d));
    m->depth = d;
    m->n_depth = n;
    return DSQ_OK;
}

int dsq_grammar_matcher_fill_mask(dsq_grammar_matcher_t *m, const dsq_grammar_vocab_t *v,
                                  uint32_t *mask, bool *cached)
{
    if (!m || !v || !mask)
        return DSQ_EINVAL;
    const size_t words = ((size_t)v->n_vocab + 31) / 32;
    memset(mask, 0, words * sizeof(*mask));
    if (cached)
        *cached = false;
    if (m->ended)
        return 0;
    uint64_t h;
    int key_len = make_key(m, &h);
    if (key_len < 0)
        return key_len;
    dsq_grammar_t *g = (dsq_grammar_t *)m->g;
    int hit = cache_get(g, v, m->key, (uint32_t)key_len, h, mask, words);
    if (hit >= 0) {
        if (cached)
            *cached = true;
        return hit;
    }
    if (ensure_depth(m, v->max_len + 1))
        return DSQ_ENOMEM;
    if (m->cur.overflow)
        return DSQ_ERANGE;   /* a limit dropped stacks: the mask would lie */
    int n_allowed = 0;
    uint64_t work = 0;      /* stacks stepped + dedup comparisons (bound) */
    /* st(0) = cur; st(d) = m->depth[d] for d >= 1 */
    uint32_t valid = 0;     /* st(0..valid) hold the current prefix's states */
    for (int32_t i = 0; i < v->n_sorted;) {
        const vtok_t *t = &v->sorted[i];
        uint32_t d = v->lcp[i] < valid ? v->lcp[i] : valid;
        int ok = 1;
        while (d < t->len) {
            const gstate_t *in = d == 0 ? &m->cur : &m->depth[d];
            gstate_t *out = &m->depth[d + 1];
            int rc = st_step_byte(g, in, t->bytes[d], out, &m->work, m->tmp);
            if (rc)
                return rc;
            work += in->n + (uint64_t)out->n * out->n / 2 + 1;
            if (work > DSQ_GRAMMAR_MAX_MASK_WORK)
                return DSQ_ERANGE;
            if (out->n == 0) {
                ok = 0;
                break;
            }
            d++;
        }
        if (ok) {
            mask[t->id / 32] |= 1u << (t->id % 32);
            n_allowed++;
            valid = t->len;
            i++;
        } else {
            /* the prefix t->bytes[0..d] is dead: skip every token under it */
            valid = d;
            i++;
            while (i < v->n_sorted && v->lcp[i] > d)
                i++;
        }
    }
    if (st_accepts(&m->cur))
        for (int32_t id = 0; id < v->n_vocab; id++)
            if (v->kind[id] == KIND_EOG) {
                mask[id / 32] |= 1u << (id % 32);
                n_allowed++;
            }
    cache_put(g, v, m->key, (uint32_t)key_len, h, mask, words, n_allowed);
    return n_allowed;
}

void dsq_grammar_apply_mask(float *logits, int32_t n_vocab, const uint32_t *mask)
{
    for (int32_t id = 0; id < n_vocab; id++)
        if (!((mask[id / 32] >> (id % 32)) & 1u))
            logits[id] = -INFINITY;
}

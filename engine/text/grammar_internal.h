/* What grammar.c (GBNF -> compiled grammar) and grammar_match.c (matcher,
 * vocabulary, mask) share. Not a public header. */
#ifndef DSQ_GRAMMAR_INTERNAL_H
#define DSQ_GRAMMAR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "grammar.h"

/* A compiled element is one uint32: the top 2 bits are its type, the low
 * 30 its value. Rule r's alternatives start at rule_start[r], are
 * separated by GT_ALT and end with GT_END; an alternative is a sequence of
 * GT_CHARS (value: character-set id) and GT_REF (value: rule id). */
#define GT_END   0u
#define GT_ALT   1u
#define GT_REF   2u
#define GT_CHARS 3u
#define G_EL(t, v) (((uint32_t)(t) << 30) | (uint32_t)(v))
#define G_TYPE(e) ((e) >> 30)
#define G_VAL(e) ((e) & 0x3FFFFFFFu)
/* end of an alternative: the next element is GT_END or GT_ALT */
#define G_ENDS(e) (G_TYPE(e) <= GT_ALT)

#define G_MAX_CP 0x10FFFFu

/* the grammar's mask cache: one entry per (vocabulary, matcher state) */
typedef struct g_cache_entry {
    uint64_t hash;
    const dsq_grammar_vocab_t *vocab;
    uint32_t *key;          /* the state, serialised (see grammar_match.c) */
    uint32_t key_len;
    uint32_t *mask;
    int n_allowed;
    size_t bytes;           /* key + mask */
} g_cache_entry_t;

struct dsq_grammar {
    _Atomic int refs;    uint32_t *el;                /* [n_el] */
    uint32_t n_el;
    uint32_t *rule_start;        /* [n_rules] */
    char **rule_name;            /* [n_rules], for messages */
    uint32_t n_rules;
    uint32_t root;
    /* character sets: set c is ranges[2*off[c] ..] (lo, hi inclusive,
     * sorted, disjoint, not adjacent), n[c] ranges */
    uint32_t *cs_ranges, *cs_off, *cs_n;
    uint64_t (*cs_ascii)[2];     /* [n_cs] bitmap of code points < 128 */
    uint32_t n_cs;
    /* mask cache (grammar_match.c): a ring of entries, bounded in bytes */
    int cache_ready;             /* cache_mu initialised */
    pthread_mutex_t cache_mu;
    g_cache_entry_t *cache;
    uint32_t cache_cap, cache_n;  /* entries [0, cache_n), oldest first */
    size_t cache_bytes, cache_max_bytes;
};

/* Some code point of [lo, hi] in set c. */
static inline int g_cs_meets(const struct dsq_grammar *g, uint32_t c, uint32_t lo, uint32_t hi)
{
    const uint32_t *r = g->cs_ranges + 2 * (size_t)g->cs_off[c];
    uint32_t a = 0, b = g->cs_n[c];
    while (a < b) {
        uint32_t mid = (a + b) / 2;
        if (r[2 * mid + 1] < lo)
            a = mid + 1;
        else
            b = mid;
    }
    return a < g->cs_n[c] && r[2 * a] <= hi;
}

/* Code point cp in set c. */
static inline int g_cs_has(const struct dsq_grammar *g, uint32_t c, uint32_t cp)
{
    if (cp < 128)
        return (int)((g->cs_ascii[c][cp >> 6] >> (cp & 63)) & 1u);
    return g_cs_meets(g, c, cp, cp);
}

#define KIND_TEXT 0
#define KIND_EOG 1
#define KIND_NEVER 2
#define MAX_TOKEN_BYTES 4096

typedef struct vtok {
    const uint8_t *bytes;
    uint32_t len;
    int32_t id;
} vtok_t;

struct dsq_grammar_vocab {
    int32_t n_vocab;
    int32_t n_sorted;
    vtok_t *sorted;          /* text tokens by bytes */
    uint32_t *lcp;           /* [n_sorted] common prefix with the previous */
    uint8_t *kind;           /* [n_vocab] */
    vtok_t *by_id;           /* [n_vocab] bytes of each text token */
    uint32_t max_len;
};

/* DSQ_ERANGE when the start state already holds more stacks than one
 * state may (DSQ_GRAMMAR_MAX_STACKS: e.g. an enum of 10,000 strings),
 * whose first mask would be refused: dsq_grammar_from_gbnf refuses such a
 * grammar up front. 0 when it fits, DSQ_ENOMEM. */
int dsq__grammar_check_start(const struct dsq_grammar *g);
void dsq__grammar_cache_init(struct dsq_grammar *g);
void dsq__grammar_cache_free(struct dsq_grammar *g);

#endif

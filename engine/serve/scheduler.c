/* Continuous-batching scheduler (see scheduler.h for the policy).
 *
 * Queues are small pointer arrays, both kept in age order (order, then
 * index): new sequences arrive at the tail of waiting, preempted ones and
 * forks re-enter it at their age's place; running is sorted the same way.
 * A step first counts each request's running sequences (owners_build: a
 * sorted table, looked up by bsearch), then orders the step's candidates
 * with qsort by round-robin turn: admission, decode rows and prefill
 * shares each get their own candidate list (cand_t), a few hundred
 * entries at most, so a step stays well under a millisecond of planning
 * (docs/benchmarks.md, dsq-bench sched). Step arrays grow to the largest
 * step and are reused. */
#include "scheduler.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

typedef struct seq_vec {
    dsq_seq_t **v;
    int n, cap;
} seq_vec_t;

/* A request (owner) with sequences in the scheduler, for a step's turns. */
typedef struct owner_ent {
    uintptr_t key;                 /* owner_key()                           */
    int n_running;                 /* running, not paused, at the step start */
    int n_seqs;                    /* running or waiting, at the step start */
    int n_turn;                    /* scratch: its waiting ones ranked so far */
    bool reclaimed;                /* scratch: a slot was parked for it     */
} owner_ent_t;

/* A sequence that may get tokens in this step. */
typedef struct cand {
    dsq_seq_t *seq;
    uint64_t rank;                 /* round-robin round: lower goes first   */
    int want;                      /* tokens it needs, then those it gets   */
    int n_done;                    /* computed tokens (a waiting one's with
                                      its cached prefix)                   */
    int sel;                       /* position in selection order           */
    bool waiting;                  /* to admit: needs a slot and free blocks */
} cand_t;

/* Prefill candidates of a step: each at least this many rows of prefill
 * time at position 0, so a crowd of new prompts still gets useful chunks
 * instead of one token each. */
#define MIN_SHARE_ROWS 4

/* With a step budget, a step may always take this many times the
 * predicted cost of a one-row step (the fixed cost, reading every weight
 * once, plus one row). A budget meant for responsiveness must not make a
 * big model on a small machine run steps of a few rows, each paying the
 * whole weight read: at 8x a step's rows beyond the first get at least
 * 7/8 of its time. The one-row step, not the fit's fixed cost alone, is
 * the unit because steps of a few rows cannot tell the fixed cost from
 * the per-row one, and a fit of such steps may put all of it in either.
 * Measured on a 6.7B model on 2 cores (docs/benchmarks.md, "Serving a
 * 6.7B model"): a one-row step ~150-190 ms, ~31 ms a prompt token, so the
 * default 250 ms budget had left 1-4 prompt tokens a step. */
#define MIN_STEPS_PER_STEP 8.0

struct dsq_sched {
    dsq_kv_cache_t *kv;
    dsq_sched_opts_t o;
    seq_vec_t waiting, running;
    int64_t n_preemptions;
    int prefill_cap;                           /* hardening: 0 = none */
    double budget_ms;                          /* hardening: 0 = none */
    dsq_step_cost_t cost;
    double trust_rows_left, trust_pairs_left;  /* this step's, see fit_chunk */
    int64_t n_prefix_queries, n_prefix_hits;   /* tokens */
    int32_t *hit_ids;                          /* prefix lookup scratch */
    dsq_block_hash_t *hit_hashes;
    int cap_hit;
    uint64_t n_picks;                          /* sequences scheduled (turns) */
    owner_ent_t *own;                          /* this step's requests */
    int n_own, cap_own;
    cand_t *adm, *dec, *pre;                   /* this step's candidates */
    int cap_cand;
    /* step buffers */
    int cap_tokens, cap_seqs, cap_bt;
    dsq_sched_out_t out;
};

static int vec_reserve(seq_vec_t *q, int need)
{
    if (need <= q->cap)
        return DSQ_OK;
    int cap = q->cap ? q->cap * 2 : 16;
    while (cap < need)
        cap *= 2;
    dsq_seq_t **v = realloc(q->v, (size_t)cap * sizeof(*v));
    if (!v)
        return DSQ_ENOMEM;
    q->v = v;
    q->cap = cap;
    return DSQ_OK;
}

static void vec_erase(seq_vec_t *q, int i)
{
    memmove(q->v + i, q->v + i + 1, (size_t)(q->n - i - 1) * sizeof(*q->v));
    q->n--;
}

static int vec_find(const seq_vec_t *q, const dsq_seq_t *s)
{
    for (int i = 0; i < q->n; i++)
        if (q->v[i] == s)
            return i;
    return -1;
}

static bool older(const dsq_seq_t *a, const dsq_seq_t *b)
{
    return a->order < b->order || (a->order == b->order && a->index < b->index);
}

/* Insert keeping running sorted oldest first. */
static int running_insert(dsq_sched_t *s, dsq_seq_t *seq)
{
    int rc = vec_reserve(&s->running, s->running.n + 1);
    if (rc)
        return rc;
    int i = s->running.n;
    while (i > 0 && older(seq, s->running.v[i - 1]))
        i--;
    memmove(s->running.v + i + 1, s->running.v + i,
            (size_t)(s->running.n - i) * sizeof(*s->running.v));
    s->running.v[i] = seq;
    s->running.n++;
    seq->state = DSQ_SEQ_RUNNING;
    return DSQ_OK;
}

dsq_sched_t *dsq_sched_create(dsq_kv_cache_t *kv, const dsq_sched_opts_t *o)
{
    dsq_sched_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->kv = kv;
    s->o = *o;
    if (s->o.max_num_seqs <= 0)
        s->o.max_num_seqs = 256;
    if (s->o.max_num_batched_tokens <= 0)
        s->o.max_num_batched_tokens = 2048;
    return s;
}

void dsq_sched_destroy(dsq_sched_t *s)
{
    if (!s)
        return;
    free(s->waiting.v);
    free(s->running.v);
    free(s->hit_ids);
    free(s->hit_hashes);
    free(s->own);
    free(s->adm);
    free(s->dec);
    free(s->pre);
    dsq_sched_out_t *o = &s->out;
    free(o->seqs);
    free(o->tokens);
    free(o->pos);
    free(o->row_seq);
    free(o->slot);
    free(o->block_tables);
    free(o->logit_rows);
    free(o->logit_seqs);
    free(s);
}

int dsq_sched_add(dsq_sched_t *s, dsq_seq_t *seq)
{
    int rc = vec_reserve(&s->waiting, s->waiting.n + 1);
    if (rc)
        return rc;
    s->waiting.v[s->waiting.n++] = seq;
    seq->state = DSQ_SEQ_WAITING;
    return DSQ_OK;
}

/* Insert into waiting at seq's age: ahead of everything younger. */
static int waiting_insert(dsq_sched_t *s, dsq_seq_t *seq)
{
    int rc = vec_reserve(&s->waiting, s->waiting.n + 1);
    if (rc)
        return rc;
    int j = 0;
    while (j < s->waiting.n && older(s->waiting.v[j], seq))
        j++;
    memmove(s->waiting.v + j + 1, s->waiting.v + j,
            (size_t)(s->waiting.n - j) * sizeof(*s->waiting.v));
    s->waiting.v[j] = seq;
    s->waiting.n++;
    seq->state = DSQ_SEQ_WAITING;
    return DSQ_OK;
}

int dsq_sched_add_fork(dsq_sched_t *s, dsq_seq_t *seq)
{
    return waiting_insert(s, seq);
}

void dsq_sched_remove(dsq_sched_t *s, dsq_seq_t *seq)
{
    int i = vec_find(&s->running, seq);
    if (i >= 0)
        vec_erase(&s->running, i);
    i = vec_find(&s->waiting, seq);
    if (i >= 0)
        vec_erase(&s->waiting, i);
    dsq_kv_seq_free(s->kv, &seq->bt);
    seq->state = DSQ_SEQ_DETACHED;
}

void dsq_sched_drop_drafts(dsq_seq_t *seq)
{
    seq->n_tokens -= seq->n_draft;
    seq->n_draft = 0;
}

static int preempt(dsq_sched_t *s, dsq_seq_t *seq)
{
    dsq_sched_drop_drafts(seq);
    int i = vec_find(&s->running, seq);
    if (i >= 0)
        vec_erase(&s->running, i);
    dsq_kv_seq_free(s->kv, &seq->bt);
    seq->n_computed = 0;
    seq->n_preempted++;
    s->n_preemptions++;
    /* Back to the front, ahead of everything younger. */
    return waiting_insert(s, seq);
}

/* Reserve blocks (and copy shared ones) so seq can compute `want` more
 * tokens. */
static int reserve(dsq_sched_t *s, dsq_seq_t *seq, int want)
{
    int rc = dsq_kv_seq_reserve(s->kv, &seq->bt, seq->n_computed + want);
    if (!rc)
        rc = dsq_kv_seq_cow(s->kv, &seq->bt, seq->n_computed, seq->n_computed + want);
    return rc;
}

/* Longest cached prefix of a waiting sequence that holds no blocks: fills
 * s->hit_ids/hit_hashes, returns the blocks matched (0 when off) and in
 * *n_evictable how many of them sit on the evictable list. */
static int prefix_lookup(dsq_sched_t *s, const dsq_seq_t *seq, int *n_evictable, int *rc)
{
    *n_evictable = 0;
    *rc = DSQ_OK;
    if (!dsq_kv_prefix_caching(s->kv) || seq->no_prefix_cache || seq->bt.n != 0 ||
        seq->n_computed != 0)
        return 0;
    int max_blocks = (seq->n_tokens - 1) / dsq_kv_block_size(s->kv);
    if (max_blocks <= 0)
        return 0;
    if (max_blocks > s->cap_hit) {
        int32_t *ids = realloc(s->hit_ids, (size_t)max_blocks * sizeof(*ids));
        if (ids)
            s->hit_ids = ids;
        dsq_block_hash_t *h = realloc(s->hit_hashes, (size_t)max_blocks * sizeof(*h));
        if (h)
            s->hit_hashes = h;
        if (!ids || !h) {
            *rc = DSQ_ENOMEM;
            return 0;
        }
        s->cap_hit = max_blocks;
    }
    return dsq_kv_prefix_lookup(s->kv, seq->tokens, seq->n_tokens, max_blocks, s->hit_ids,
                                s->hit_hashes, n_evictable);
}

static int grow_out(dsq_sched_t *s, int n_tokens, int n_seqs, int max_blocks)
{
    dsq_sched_out_t *o = &s->out;
    if (n_tokens > s->cap_tokens) {
        int cap = n_tokens;
        int32_t **arrs[] = {&o->tokens, &o->pos, &o->row_seq, &o->slot, &o->logit_rows};
        for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) {
            int32_t *p = realloc(*arrs[i], (size_t)cap * sizeof(int32_t));
            if (!p)
                return DSQ_ENOMEM;
            *arrs[i] = p;
        }
        dsq_seq_t **ls = realloc(o->logit_seqs, (size_t)cap * sizeof(*ls));
        if (!ls)
            return DSQ_ENOMEM;
        o->logit_seqs = ls;
        s->cap_tokens = cap;
    }
    if (n_seqs > s->cap_seqs) {
        dsq_seq_t **p = realloc(o->seqs, (size_t)n_seqs * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        o->seqs = p;
        s->cap_seqs = n_seqs;
    }
    int bt = n_seqs * (max_blocks > 0 ? max_blocks : 1);
    if (bt > s->cap_bt) {
        int32_t *p = realloc(o->block_tables, (size_t)bt * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        o->block_tables = p;
        s->cap_bt = bt;
    }
    return DSQ_OK;
}

/* hardening: the tokens of a prefill chunk at position p (at most want)
 * that fit in *ms_left under the cost model; charges them to *ms_left.
 * The first prefill chunk of a step gets at least one token. */
static int fit_chunk(dsq_sched_t *s, int p, int want, double *ms_left, bool any_prefill)
{
    int n_time = dsq_step_cost_chunk_fit(&s->cost, p, *ms_left, want);
    int n = n_time;
    /* the trust region (step_cost.h): rows and pairs left in this step */
    if (s->cost.trust_rows > 0) {
        if (n > s->trust_rows_left)
            n = s->trust_rows_left > 0 ? (int)s->trust_rows_left : 0;
        while (n > 0 && (double)dsq_step_cost_chunk_pairs(p, n) > s->trust_pairs_left) {
            /* largest n within the pairs left: solve n p + n(n+1)/2 <= left */
            double b = (double)p + 0.5, left = s->trust_pairs_left;
            int m = left > 0 ? (int)(-b + sqrt(b * b + 2 * left)) : 0;
            n = m < n ? m : n - 1;
        }
        if (n == 0 && n_time > 0 && !any_prefill) {
            /* the region alone stopped it: at least 16 rows (or what the
             * time allows, if less) */
            n = n_time < 16 ? n_time : 16;
        }
    }
    if (n == 0 && !any_prefill && want > 0)
        n = 1;
    int64_t pairs = dsq_step_cost_chunk_pairs(p, n);
    *ms_left -= s->cost.token_ms * n + s->cost.pair_ms * (double)pairs;
    s->trust_rows_left -= n;
    s->trust_pairs_left -= (double)pairs;
    return n;
}

/* ------------------------------------------------------------ fair share */

/* The request a sequence belongs to, the unit of fairness: seq->req, else
 * its owner (a sequence with neither is a request of its own). The engine
 * sets req: its owner is each choice's own handle, and keying on that
 * would make every choice a request of its own, with no share to keep. */
static uintptr_t owner_key(const dsq_seq_t *q)
{
    return q->req ? (uintptr_t)q->req : q->owner ? (uintptr_t)q->owner : (uintptr_t)q;
}

static int cmp_owner(const void *a, const void *b)
{
    uintptr_t x = ((const owner_ent_t *)a)->key, y = ((const owner_ent_t *)b)->key;
    return (x > y) - (x < y);
}

/* s->own: every request with a running or waiting sequence and its
 * running sequences that are not paused, sorted by key. */
static int owners_build(dsq_sched_t *s)
{
    int n = s->running.n + s->waiting.n;
    if (n > s->cap_own) {
        owner_ent_t *p = realloc(s->own, (size_t)n * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        s->own = p;
        s->cap_own = n;
    }
    int k = 0;
    for (int i = 0; i < s->running.n; i++)
        s->own[k++] = (owner_ent_t){owner_key(s->running.v[i]), !s->running.v[i]->paused, 1,
                                    0, false};
    for (int i = 0; i < s->waiting.n; i++)
        s->own[k++] = (owner_ent_t){owner_key(s->waiting.v[i]), 0, 1, 0, false};
    if (k > 1)
        qsort(s->own, (size_t)k, sizeof(*s->own), cmp_owner);
    int m = 0;
    for (int i = 0; i < k; i++) {
        if (m > 0 && s->own[m - 1].key == s->own[i].key) {
            s->own[m - 1].n_running += s->own[i].n_running;
            s->own[m - 1].n_seqs += s->own[i].n_seqs;
        } else
            s->own[m++] = s->own[i];
    }
    s->n_own = m;
    return DSQ_OK;
}

/* q's request in s->own (NULL only for a sequence added since). */
static owner_ent_t *owner_of(dsq_sched_t *s, const dsq_seq_t *q)
{
    owner_ent_t key = {.key = owner_key(q)};
    if (s->n_own == 0)
        return NULL;
    return bsearch(&key, s->own, (size_t)s->n_own, sizeof(*s->own), cmp_owner);
}


static int cands_reserve(dsq_sched_t *s, int n)
{
    if (n <= s->cap_cand)
        return DSQ_OK;
    cand_t **arrs[] = {&s->adm, &s->dec, &s->pre};
    for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) {
        cand_t *p = realloc(*arrs[i], (size_t)n * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        *arrs[i] = p;
    }
    s->cap_cand = n;
    return DSQ_OK;
}

static int cmp_age(const dsq_seq_t *a, const dsq_seq_t *b)
{
    return older(a, b) ? -1 : older(b, a) ? 1 : 0;
}

/* admission: turn, then age (FCFS among equals) */
static int cmp_cand_admit(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return cmp_age(x->seq, y->seq);
}

/* one request's candidates, least recently scheduled first */
static int cmp_cand_owner(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    uintptr_t kx = owner_key(x->seq), ky = owner_key(y->seq);
    if (kx != ky)
        return kx < ky ? -1 : 1;
    if (x->seq->last_sched != y->seq->last_sched)
        return x->seq->last_sched < y->seq->last_sched ? -1 : 1;
    return cmp_age(x->seq, y->seq);
}

/* round-robin: turn, then the least recently scheduled, then age */
static int cmp_cand_turn(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->seq->last_sched != y->seq->last_sched)
        return x->seq->last_sched < y->seq->last_sched ? -1 : 1;
    return cmp_age(x->seq, y->seq);
}

/* water-filling order: the first selected, then the smallest need */
static int cmp_cand_fill(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if ((x->sel == 0) != (y->sel == 0))
        return x->sel == 0 ? -1 : 1;
    if (x->want != y->want)
        return x->want < y->want ? -1 : 1;
    return x->sel - y->sel;
}

static int cmp_cand_sel(const void *a, const void *b)
{
    return ((const cand_t *)a)->sel - ((const cand_t *)b)->sel;
}

/* Order c[0..n) round-robin across requests: each request's least
 * recently scheduled sequence (rank 0), then each one's second, ... */
static void turn_order(cand_t *c, int n)
{
    if (n < 2)
        return;
    qsort(c, (size_t)n, sizeof(*c), cmp_cand_owner);
    for (int i = 0; i < n; i++)
        c[i].rank = i > 0 && owner_key(c[i].seq) == owner_key(c[i - 1].seq) ? c[i - 1].rank + 1
                                                                             : 0;
    qsort(c, (size_t)n, sizeof(*c), cmp_cand_turn);
}

/* Slot reclaim: with every slot taken, each waiting request that runs at
 * least two sequences fewer than the request holding the most (a new one,
 * or one whose sequences were all preempted, runs none) gets a slot from
 * that one: its youngest running sequence is parked, back to waiting with
 * its KV blocks (it is not recomputed: it resumes where it was once the
 * round-robin gives it a slot again). One slot per request per step, so
 * the slots move towards the max-min fair share (n = 2 beside n = 6 on 4
 * slots: 2 and 2) in a few steps, and a new request waits at most a step
 * for its first, whatever one request holds. Returns the slots freed. */
static int reclaim_slots(dsq_sched_t *s)
{
    int n_freed = 0;
    for (int i = 0; i < s->waiting.n; i++) {
        dsq_seq_t *q = s->waiting.v[i];
        owner_ent_t *o = owner_of(s, q);
        if (q->paused || !o || o->reclaimed)
            continue;
        owner_ent_t *big = NULL;
        for (int k = 0; k < s->n_own; k++)
            if (s->own[k].n_running >= o->n_running + 2 &&
                (!big || s->own[k].n_running > big->n_running))
                big = &s->own[k];
        if (!big)
            continue;
        for (int j = s->running.n - 1; j >= 0; j--) {
            dsq_seq_t *v = s->running.v[j];
            if (v->paused || owner_key(v) != big->key)
                continue;
            vec_erase(&s->running, j);
            if (waiting_insert(s, v) != DSQ_OK) {
                running_insert(s, v);    /* no memory to park it: it runs */
                return n_freed;
            }
            big->n_running--;
            o->reclaimed = true;
            n_freed++;
            break;                       /* (v is met again: it is skipped) */
        }
    }
    return n_freed;
}

/* A running sequence whose next step is one decode row (and its drafts). */
static bool is_decode(const dsq_seq_t *q)
{
    return q->n_computed >= q->n_prompt && q->n_tokens - q->n_computed == 1 + q->n_draft;
}

/* Whether a's request should give up a sequence before b's: it runs more
 * sequences, or as many but has more in all, or it is younger. */
static bool gives_first(dsq_sched_t *s, const dsq_seq_t *a, const dsq_seq_t *b)
{
    const owner_ent_t *oa = owner_of(s, a), *ob = owner_of(s, b);
    int ra = oa ? oa->n_running : 0, rb = ob ? ob->n_running : 0;
    int na = oa ? oa->n_seqs : 0, nb = ob ? ob->n_seqs : 0;
    if (ra != rb)
        return ra > rb;
    if (na != nb)
        return na > nb;
    return older(b, a);
}

/* The sequence to preempt so that seq can have blocks: of the running ones
 * not yet scheduled in this step, and seq itself, the youngest of the
 * request with the most running sequences (then the most sequences): the
 * fair share's largest holder gives first; with one sequence per request,
 * the youngest, as before. */
static dsq_seq_t *pick_victim(dsq_sched_t *s, dsq_seq_t *seq)
{
    dsq_seq_t *v = seq;
    for (int i = 0; i < s->running.n; i++) {
        dsq_seq_t *q = s->running.v[i];
        if (q != seq && q->sched_tokens == 0 && gives_first(s, q, v))
            v = q;
    }
    return v;
}

/* Blocks seq needs to compute want tokens from n_done: new ones past its
 * table (or past the n_hit cached blocks it is about to share), and a copy
 * of each block it shares (a fork's) that the chunk writes into. */
static int blocks_needed(const dsq_sched_t *s, const dsq_seq_t *seq, int n_done, int want,
                         int n_hit)
{
    int have = n_hit ? n_hit : seq->bt.n;
    int need = dsq_kv_blocks_for(s->kv, n_done + want) - have;
    if (need < 0)
        need = 0;
    if (!n_hit) {
        int bs = dsq_kv_block_size(s->kv);
        for (int b = n_done / bs; b <= (n_done + want - 1) / bs && b < seq->bt.n; b++)
            need += dsq_kv_refcount(s->kv, seq->bt.ids[b]) > 1;
    }
    return need;
}

static int pick(dsq_sched_t *s, seq_vec_t *picked, dsq_seq_t *seq, int want)
{
    int rc = vec_reserve(picked, picked->n + 1);
    if (rc)
        return rc;
    picked->v[picked->n++] = seq;
    seq->sched_tokens = want;
    seq->last_sched = ++s->n_picks;
    return DSQ_OK;
}

/* Blocks for `want` more tokens of running seq, preempting (pick_victim)
 * while they run out. *ok: seq got them (false: it was preempted itself,
 * or nothing was left to preempt). */
static int run_reserve(dsq_sched_t *s, dsq_seq_t *seq, int want, int *n_pre, bool *ok)
{
    int rc;
    *ok = false;
    for (;;) {
        rc = reserve(s, seq, want);
        if (rc != DSQ_EFULL)
            break;
        dsq_seq_t *victim = pick_victim(s, seq);
        rc = preempt(s, victim);
        (*n_pre)++;
        if (rc || victim == seq)
            break;
    }
    if (rc == DSQ_EFULL || seq->state != DSQ_SEQ_RUNNING)
        return DSQ_OK;
    if (rc == DSQ_OK)
        *ok = true;
    return rc;
}

/* Admit waiting seq with a chunk of at most want tokens (its cached
 * prefix first, when prefix caching finds one). *ok: it is running now,
 * with seq->sched_tokens set; false: its blocks do not fit. */
static int admit(dsq_sched_t *s, dsq_seq_t *seq, int want, bool *ok)
{
    int n_ev = 0, rc = DSQ_OK;
    *ok = false;
    bool fresh = seq->bt.n == 0 && seq->n_computed == 0;   /* new or preempted */
    int n_hit = prefix_lookup(s, seq, &n_ev, &rc);
    if (rc)
        return rc;
    int n_done = n_hit ? n_hit * dsq_kv_block_size(s->kv) : seq->n_computed;
    if (want > seq->n_tokens - n_done)
        want = seq->n_tokens - n_done;
    if (want <= 0)
        return DSQ_OK;
    if (blocks_needed(s, seq, n_done, want, n_hit) > dsq_kv_n_free(s->kv) - n_ev)
        return DSQ_OK;
    if (n_hit) {
        rc = dsq_kv_seq_share_prefix(s->kv, &seq->bt, s->hit_ids, s->hit_hashes, n_hit);
        if (rc)
            return rc;
        seq->n_computed = n_done;
    }
    rc = reserve(s, seq, want);
    if (rc) {
        /* cannot happen after the budget check; start it over (its tokens
         * are kept: it is recomputed like a preempted one) */
        dsq_kv_seq_free(s->kv, &seq->bt);
        seq->n_computed = 0;
        return rc == DSQ_EFULL ? DSQ_OK : rc;
    }
    if (dsq_kv_prefix_caching(s->kv) && fresh) {
        s->n_prefix_queries += seq->n_tokens;
        s->n_prefix_hits += n_hit ? n_done : 0;
        if (seq->n_preempted == 0) {
            int c = n_hit ? n_done : 0;
            seq->n_cached_prompt = c < seq->n_prompt ? c : seq->n_prompt;
        }
    }
    int i = vec_find(&s->waiting, seq);
    if (i >= 0)
        vec_erase(&s->waiting, i);
    rc = running_insert(s, seq);
    if (rc)
        return rc;
    seq->sched_tokens = want;
    *ok = true;
    return DSQ_OK;
}

int dsq_sched_step(dsq_sched_t *s, dsq_sched_out_t *out)
{
    int budget = s->o.max_num_batched_tokens;
    int n_pre = 0;
    int rc = DSQ_OK;
    /* Scheduled sequences are collected first; the batch arrays are built
     * once the set is final (preemption may remove earlier picks). */
    seq_vec_t picked = {0};
    rc = owners_build(s);
    if (!rc)
        rc = cands_reserve(s, s->running.n + s->waiting.n);
    if (rc)
        goto done;

    /* hardening: paused sequences (their client is not reading) keep their
     * KV but not a max_num_seqs slot, so a request whose client stops
     * reading cannot lock others out; a step still carries at most
     * max_num_seqs sequences (the step buffers are planned for that) */
    int n_paused = 0;
    bool any_decode = false;
    for (int i = 0; i < s->running.n; i++) {
        dsq_seq_t *q = s->running.v[i];
        q->sched_tokens = 0;
        n_paused += q->paused;
        any_decode = any_decode || is_decode(q);
    }
    for (int i = 0; i < s->waiting.n; i++)
        s->waiting.v[i]->sched_tokens = 0;
    int free_slots = s->o.max_num_seqs - (s->running.n - n_paused);
    if (free_slots <= 0 && s->waiting.n > 0)
        free_slots += reclaim_slots(s);

    /* itl: while any running sequence decodes, prefill tokens (chunks of
     * running sequences and admissions) share a smaller budget, so one
     * step, and with it every stream's gap between tokens, stays short
     * (Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024). */
    int prefill_left = budget;
    if (any_decode && s->o.max_prefill_tokens_with_decode > 0 &&
        s->o.max_prefill_tokens_with_decode < budget)
        prefill_left = s->o.max_prefill_tokens_with_decode;
    /* hardening: the engine's step budget (dsq_sched_set_prefill_cap) */
    if (s->prefill_cap > 0 && s->prefill_cap < prefill_left)
        prefill_left = s->prefill_cap;

    /* itl: drain-aligned admission (admission_defer_steps): no new prompt
     * while every running sequence is a decode near its end */
    bool defer = s->o.admission_defer_steps > 0 && s->waiting.n > 0 && s->running.n > 0 &&
                 n_paused == 0;
    for (int i = 0; i < s->running.n && defer; i++) {
        const dsq_seq_t *q = s->running.v[i];
        defer = q->n_max_tokens > 0 && is_decode(q) &&
                q->n_max_tokens - q->n_tokens <= s->o.admission_defer_steps;
    }

    /* 1. Slots: the waiting sequences that may take the free ones, in
     * round-robin turn (a request's running sequences count as turns it
     * had), FCFS among equals. */
    int n_adm = 0;
    for (int i = 0; free_slots > 0 && i < s->waiting.n; i++) {
        dsq_seq_t *q = s->waiting.v[i];
        if (q->paused)
            continue;
        owner_ent_t *o = owner_of(s, q);
        s->adm[n_adm++] = (cand_t){.seq = q, .waiting = true,
                                   .rank = o ? (uint64_t)(o->n_running + o->n_turn++) : 0};
    }
    if (n_adm > 1)
        qsort(s->adm, (size_t)n_adm, sizeof(*s->adm), cmp_cand_admit);
    if (n_adm > free_slots)
        n_adm = free_slots > 0 ? free_slots : 0;

    /* 2. Decode rows, round-robin across requests. With a step budget
     * they get what is left of 90% of it after the fixed cost, less a
     * quarter for prefill when a prompt is pending; at least half of it,
     * and where the budget is small for the model, at least
     * MIN_STEPS_PER_STEP - 1 one-row steps' time (a decode row costs
     * little beside the weight read every step pays, so a big model's
     * step holds as many as that allows instead of taking turns a few
     * rows at a time). At least one row per step. */
    bool timed = s->budget_ms > 0;
    bool prefill_pending = false;
    int n_dec = 0;
    for (int i = 0; i < s->running.n; i++) {
        dsq_seq_t *q = s->running.v[i];
        if (q->paused)
            continue;
        if (is_decode(q))
            s->dec[n_dec++] = (cand_t){.seq = q};
        else
            prefill_pending = true;
    }
    for (int i = 0; i < n_adm; i++) {
        if (is_decode(s->adm[i].seq))
            s->dec[n_dec++] = s->adm[i];     /* a fork (or a parked one) */
        else
            prefill_pending = prefill_pending || !defer;
    }
    turn_order(s->dec, n_dec);
    double decode_ms = 0, decode_cost = 0;
    double one_row_ms = s->cost.fixed_ms + s->cost.token_ms + s->cost.pair_ms;
    /* the budget is small for the model: see MIN_STEPS_PER_STEP */
    const bool small_budget = timed && MIN_STEPS_PER_STEP * one_row_ms > s->budget_ms;
    if (timed) {
        decode_ms = 0.9 * s->budget_ms - s->cost.fixed_ms -
                    (prefill_pending ? 0.25 * s->budget_ms : 0);
        if (decode_ms < 0.5 * s->budget_ms)
            decode_ms = 0.5 * s->budget_ms;
        if (small_budget && decode_ms < (MIN_STEPS_PER_STEP - 1) * one_row_ms)
            decode_ms = (MIN_STEPS_PER_STEP - 1) * one_row_ms;
        s->trust_rows_left = s->cost.trust_rows;
        s->trust_pairs_left = s->cost.trust_pairs;
    }
    bool admitting = true;      /* no waiting one failed to fit (FCFS) */
    for (int i = 0; i < n_dec && budget > 0 && picked.n < s->o.max_num_seqs; i++) {
        dsq_seq_t *q = s->dec[i].seq;
        bool ok = false;
        if (q->state != (s->dec[i].waiting ? DSQ_SEQ_WAITING : DSQ_SEQ_RUNNING))
            continue;           /* preempted in this step */
        double cost = s->cost.token_ms + s->cost.pair_ms * (double)(q->n_computed + 1);
        if (timed && picked.n > 0 && decode_cost + cost > decode_ms)
            break;
        /* drafts ride along where the step's tokens and time allow */
        int want = 1;
        for (int d = 0; d < q->n_draft && want < budget; d++) {
            double c = s->cost.token_ms + s->cost.pair_ms * (double)(q->n_computed + want + 1);
            if (timed && decode_cost + cost + c > decode_ms)
                break;
            cost += c;
            want++;
        }
        q->n_tokens -= q->n_draft - (want - 1);
        q->n_draft = want - 1;
        if (s->dec[i].waiting) {
            if (n_pre > 0 || !admitting)
                continue;
            rc = admit(s, q, want, &ok);
            admitting = ok;
        } else {
            rc = run_reserve(s, q, want, &n_pre, &ok);
        }
        if (!rc && ok)
            rc = pick(s, &picked, q, want);
        if (rc)
            goto done;
        if (ok) {
            budget -= want;
            decode_cost += cost;
        }
    }

    /* 3. Prefill: running prompts and the waiting ones that have slots
     * share the prefill tokens and time max-min fairly (scheduler.h). */
    if (prefill_left > budget)
        prefill_left = budget;
    double prefill_ms = 0;
    int max_pf = s->o.max_num_seqs - picked.n;
    if (max_pf > prefill_left)
        max_pf = prefill_left;          /* a token each at least */
    if (timed) {
        /* what fits beside the decodes; at least a quarter of the budget;
         * where the budget is too small for the model (MIN_STEPS_PER_STEP
         * one-row steps exceed it: a big model on a small machine, a
         * simulator) or the decode rows alone exceed it, at least as much
         * as the step without prefill costs, so prefill moves as fast as
         * the decodes do and at most doubles their step instead of
         * crawling a few tokens a step; and there, with no decode row
         * (nobody waits between tokens), the budget stretched to
         * MIN_STEPS_PER_STEP one-row steps, so a prompt-only step is not
         * mostly the weight read. A model the budget fits keeps the
         * budget as its bound. */
        double base_ms = s->cost.fixed_ms + decode_cost;
        double budget_ms = s->budget_ms;
        if (picked.n == 0 && small_budget)
            budget_ms = MIN_STEPS_PER_STEP * one_row_ms;
        prefill_ms = 0.9 * budget_ms - base_ms;
        if (prefill_ms < 0.25 * budget_ms)
            prefill_ms = 0.25 * budget_ms;
        if (prefill_ms < base_ms && (small_budget || base_ms > s->budget_ms))
            prefill_ms = base_ms;
        /* two prompts at least (where two slots allow), so a new prompt
         * is not held behind a long one for all of its chunks when the
         * time fits few rows */
        double row_ms = MIN_SHARE_ROWS * (s->cost.token_ms + s->cost.pair_ms);
        if (row_ms > 0 && prefill_ms / row_ms < max_pf && max_pf > 2)
            max_pf = prefill_ms / row_ms >= 2 ? (int)(prefill_ms / row_ms) : 2;
    }
    /* Selection, in turn: the running prompt scheduled least recently
     * first (so every admitted prompt keeps moving, whatever arrives),
     * then the waiting ones in admission order (a new request does not
     * queue behind running prompts), then the other running prompts,
     * least recently scheduled first; at most max_pf of them. */
    int n_run = 0, n_pf = 0;
    for (int i = 0; i < s->running.n; i++) {
        dsq_seq_t *q = s->running.v[i];
        if (q->paused || is_decode(q) || q->sched_tokens > 0 || q->n_tokens <= q->n_computed)
            continue;
        s->pre[n_run++] = (cand_t){.seq = q, .want = q->n_tokens - q->n_computed,
                                   .n_done = q->n_computed};
    }
    if (n_run > 1)
        qsort(s->pre, (size_t)n_run, sizeof(*s->pre), cmp_cand_turn);
    cand_t *sel = s->dec;               /* the decode rows are planned */
    if (n_run > 0 && max_pf > 0)
        sel[n_pf++] = s->pre[0];
    for (int i = 0; i < n_adm && n_pf < max_pf && !defer && n_pre == 0; i++) {
        dsq_seq_t *q = s->adm[i].seq;
        if (is_decode(q) || q->state != DSQ_SEQ_WAITING)
            continue;
        int n_ev = 0;
        int n_hit = prefix_lookup(s, q, &n_ev, &rc);   /* to size its need */
        if (rc)
            goto done;
        int n_done = n_hit ? n_hit * dsq_kv_block_size(s->kv) : q->n_computed;
        sel[n_pf++] = (cand_t){.seq = q, .want = q->n_tokens - n_done, .n_done = n_done,
                               .waiting = true};
    }
    for (int i = 1; i < n_run && n_pf < max_pf; i++)
        sel[n_pf++] = s->pre[i];
    for (int i = 0; i < n_pf; i++) {
        s->pre[i] = sel[i];
        s->pre[i].sel = i;
    }
    /* water-filling: each in turn gets an equal share of what is left,
     * or less if it needs less (the first selected first, so it always
     * moves; then the smallest need first, so the shares the small ones
     * leave go to the large ones) */
    if (n_pf > 1)
        qsort(s->pre, (size_t)n_pf, sizeof(*s->pre), cmp_cand_fill);
    /* attack2: logits rows left for prompt-logprob chunks */
    int plr_left = s->o.max_prompt_logit_rows > 0 ? s->o.max_prompt_logit_rows : INT_MAX;
    int tok_left = prefill_left;
    double ms_left = prefill_ms;
    /* the first waiting prompt (admission order) gets a token even when
     * its share of the time fits none: one that gets none stops admission
     * (FCFS, below), and a running prompt whose tokens each cost more
     * than the step's time would hold it back for all of its chunks */
    int first_wait = INT_MAX;
    for (int j = 0; j < n_pf; j++)
        if (s->pre[j].waiting && s->pre[j].sel < first_wait)
            first_wait = s->pre[j].sel;
    for (int j = 0; j < n_pf; j++) {
        cand_t *c = &s->pre[j];
        int left = n_pf - j;
        int share = tok_left / left;
        if (share < 1 && tok_left > 0)
            share = 1;
        int want = c->want < share ? c->want : share;
        bool plr = c->seq->prompt_logits && c->n_done < c->seq->n_prompt;
        if (plr && want > plr_left)
            want = plr_left;
        if (timed) {
            double ms = ms_left / left, ms0 = ms;
            const int asked = want;
            want = fit_chunk(s, c->n_done, want, &ms, j > 0);
            if (want == 0 && asked > 0 && c->sel == first_wait)
                want = fit_chunk(s, c->n_done, 1, &ms, false);
            ms_left -= ms0 - ms;
        }
        c->want = want;
        tok_left -= want;
        if (plr)
            plr_left -= want;
    }
    if (n_pf > 1)
        qsort(s->pre, (size_t)n_pf, sizeof(*s->pre), cmp_cand_sel);
    /* running prompts first: a preemption among them stops admission */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n_pf; i++) {
            cand_t *c = &s->pre[i];
            dsq_seq_t *q = c->seq;
            bool ok = false;
            if (c->waiting != (pass == 1))
                continue;
            if (!c->waiting) {
                if (c->want <= 0 || q->state != DSQ_SEQ_RUNNING)
                    continue;
                rc = run_reserve(s, q, c->want, &n_pre, &ok);
                if (!rc && ok)
                    rc = pick(s, &picked, q, c->want);
            } else {
                /* nothing is admitted in a step that preempted (it would
                 * only thrash), and none overtakes one that got no tokens
                 * or did not fit (FCFS) */
                if (c->want <= 0 || n_pre > 0 || !admitting) {
                    admitting = false;
                    continue;
                }
                rc = admit(s, q, c->want, &ok);
                admitting = ok;
                if (!rc && ok)
                    rc = pick(s, &picked, q, q->sched_tokens);
            }
            if (rc)
                goto done;
            if (ok)
                budget -= q->sched_tokens;
        }
    }

    /* Nothing runs and nothing could be admitted: blocks the waiting forks
     * share with each other may be what is missing. Start the youngest of
     * them over (it is recomputed like a preempted one). */
    if (picked.n == 0 && n_pre == 0 && n_adm > 0 && s->running.n == n_paused) {
        for (int i = s->waiting.n - 1; i >= 0; i--) {
            dsq_seq_t *q = s->waiting.v[i];
            if (q->bt.n > 0 && !q->paused) {
                dsq_kv_seq_free(s->kv, &q->bt);
                q->n_computed = 0;
                q->n_preempted++;
                s->n_preemptions++;
                n_pre++;
                break;
            }
        }
    }

    /* drafts of sequences this step does not run are void (the engine
     * proposes again next step) */
    for (int i = 0; i < s->running.n; i++)
        if (s->running.v[i]->sched_tokens == 0)
            dsq_sched_drop_drafts(s->running.v[i]);
    for (int i = 0; i < s->waiting.n; i++)
        dsq_sched_drop_drafts(s->waiting.v[i]);

    /* Build the batch. */
    int n_tokens = 0, max_blocks = 1;
    for (int i = 0; i < picked.n; i++) {
        n_tokens += picked.v[i]->sched_tokens;
        if (picked.v[i]->bt.n > max_blocks)
            max_blocks = picked.v[i]->bt.n;
    }
    rc = grow_out(s, n_tokens, picked.n, max_blocks);
    if (rc)
        goto done;
    dsq_sched_out_t *o = &s->out;
    o->n_seqs = picked.n;
    o->max_blocks = max_blocks;
    o->n_tokens = n_tokens;
    o->n_logits = 0;
    o->n_preempted = n_pre;
    int row = 0;
    for (int i = 0; i < picked.n; i++) {
        dsq_seq_t *seq = picked.v[i];
        o->seqs[i] = seq;
        seq->sched_row = row;
        int32_t *bt = o->block_tables + (size_t)i * (size_t)max_blocks;
        memcpy(bt, seq->bt.ids, (size_t)seq->bt.n * sizeof(*bt));
        for (int j = seq->bt.n; j < max_blocks; j++)
            bt[j] = -1;
        for (int j = 0; j < seq->sched_tokens; j++, row++) {
            int p = seq->n_computed + j;
            o->tokens[row] = seq->tokens[p];
            o->pos[row] = p;
            o->row_seq[row] = i;
            o->slot[row] = dsq_kv_slot(s->kv, &seq->bt, p);
        }
        if (seq->n_computed + seq->sched_tokens == seq->n_tokens) {
            /* the last row, and with drafts the pending token's and each
             * draft's: every one of them is verified */
            for (int j = seq->n_draft; j >= 0; j--) {
                o->logit_rows[o->n_logits] = row - 1 - j;
                o->logit_seqs[o->n_logits++] = seq;
            }
        }
    }
done:
    free(picked.v);
    if (rc == DSQ_OK)
        *out = s->out;
    return rc;
}

void dsq_sched_commit(dsq_sched_t *s, const dsq_sched_out_t *out)
{
    for (int i = 0; i < out->n_seqs; i++) {
        dsq_seq_t *seq = out->seqs[i];
        seq->n_computed += seq->sched_tokens - seq->n_draft;
        seq->sched_tokens = 0;
        /* blocks that just filled become reusable */
        dsq_kv_seq_cache_blocks(s->kv, &seq->bt, seq->tokens, seq->n_computed);
    }
}

void dsq_sched_accept_drafts(dsq_sched_t *s, dsq_seq_t *seq, int n_accepted)
{
    seq->n_computed += n_accepted;
    dsq_kv_seq_cache_blocks(s->kv, &seq->bt, seq->tokens, seq->n_computed);
    dsq_kv_seq_truncate(s->kv, &seq->bt, seq->n_tokens);
}

void dsq_sched_set_prefill_cap(dsq_sched_t *s, int n_tokens)
{
    s->prefill_cap = n_tokens > 0 ? n_tokens : 0;
}

void dsq_sched_set_step_budget(dsq_sched_t *s, double budget_ms, const dsq_step_cost_t *cost)
{
    if (budget_ms > 0 && cost) {
        s->budget_ms = budget_ms;
        s->cost = *cost;
    } else {
        s->budget_ms = 0;
    }
}

int dsq_sched_n_waiting(const dsq_sched_t *s) { return s->waiting.n; }
int dsq_sched_n_running(const dsq_sched_t *s) { return s->running.n; }

int dsq_sched_n_free_slots(const dsq_sched_t *s)
{
    int used = 0;
    for (int i = 0; i < s->running.n; i++)
        used += !s->running.v[i]->paused;
    return used < s->o.max_num_seqs ? s->o.max_num_seqs - used : 0;
}
int64_t dsq_sched_n_preemptions(const dsq_sched_t *s) { return s->n_preemptions; }

void dsq_sched_prefix_stats(const dsq_sched_t *s, int64_t *queries, int64_t *hits)
{
    *queries = s->n_prefix_queries;
    *hits = s->n_prefix_hits;
}

bool dsq_sched_check(const dsq_sched_t *s)
{
    int n = s->waiting.n + s->running.n;
    const dsq_block_table_t **t = malloc((size_t)(n ? n : 1) * sizeof(*t));
    if (!t)
        return false;
    int k = 0;
    for (int i = 0; i < s->waiting.n; i++)
        t[k++] = &s->waiting.v[i]->bt;
    for (int i = 0; i < s->running.n; i++)
        t[k++] = &s->running.v[i]->bt;
    bool ok = dsq_kv_check(s->kv, t, k);
    free(t);
    return ok;
}

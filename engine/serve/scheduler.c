/* Continuous-batching scheduler (see scheduler.h for the policy).
 *
 * Queues are small pointer arrays: waiting is FIFO with preempted sequences
 * re-entering at the front; running is kept sorted by arrival order so
 * "oldest first" and "youngest is preempted" are array ends. Step arrays grow
 * to the largest step and are reused. */
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

int dsq_sched_add_running(dsq_sched_t *s, dsq_seq_t *seq)
{
    return running_insert(s, seq);
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

static int preempt(dsq_sched_t *s, dsq_seq_t *seq)
{
    int i = vec_find(&s->running, seq);
    if (i >= 0)
        vec_erase(&s->running, i);
    dsq_kv_seq_free(s->kv, &seq->bt);
    seq->n_computed = 0;
    seq->n_preempted++;
    s->n_preemptions++;
    int rc = vec_reserve(&s->waiting, s->waiting.n + 1);
    if (rc)
        return rc;
    /* Back to the front, ahead of everything younger. */
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

int dsq_sched_step(dsq_sched_t *s, dsq_sched_out_t *out)
{
    int budget = s->o.max_num_batched_tokens;
    int n_sched = 0, n_pre = 0;
    int rc = DSQ_OK;
    /* Scheduled sequences are collected first; the batch arrays are built
     * once the set is final (preemption may remove earlier picks). */
    seq_vec_t picked = {0};

    /* itl: while any running sequence decodes, prefill tokens (chunks of
     * running sequences and admissions) share a smaller budget, so one
     * step, and with it every stream's gap between tokens, stays short
     * (Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024). */
    int prefill_left = budget;
    if (s->o.max_prefill_tokens_with_decode > 0 &&
        s->o.max_prefill_tokens_with_decode < budget) {
        for (int i = 0; i < s->running.n; i++) {
            const dsq_seq_t *seq = s->running.v[i];
            if (seq->n_computed >= seq->n_prompt && seq->n_tokens - seq->n_computed == 1) {
                prefill_left = s->o.max_prefill_tokens_with_decode;
                break;
            }
        }
    }

    /* hardening: the engine's step budget (dsq_sched_set_prefill_cap) */
    if (s->prefill_cap > 0 && s->prefill_cap < prefill_left)
        prefill_left = s->prefill_cap;

    /* hardening: the step budget in predicted ms (dsq_sched_set_step_budget) */
    double prefill_ms = 0;
    bool timed = s->budget_ms > 0;
    bool any_prefill = false;
    if (timed) {
        double decode_ms = 0;
        for (int i = 0; i < s->running.n; i++) {
            const dsq_seq_t *seq = s->running.v[i];
            if (!seq->paused && seq->n_computed >= seq->n_prompt &&
                seq->n_tokens - seq->n_computed == 1)
                decode_ms += s->cost.token_ms + s->cost.pair_ms * (double)(seq->n_computed + 1);
        }
        /* what fits beside the decodes; at least a quarter of the budget;
         * and where the budget is out of reach (a step without prefill
         * already costs more: a big model on a small machine, a
         * simulator), as much as that step, so prefill at most doubles
         * it instead of crawling a token per step */
        double base_ms = s->cost.fixed_ms + decode_ms;
        prefill_ms = 0.9 * s->budget_ms - base_ms;
        if (prefill_ms < 0.25 * s->budget_ms)
            prefill_ms = 0.25 * s->budget_ms;
        if (base_ms > s->budget_ms && prefill_ms < base_ms)
            prefill_ms = base_ms;
        s->trust_rows_left = s->cost.trust_rows;
        s->trust_pairs_left = s->cost.trust_pairs;
    }

    /* attack2: logits rows left for prompt-logprob chunks */
    int plr_left = s->o.max_prompt_logit_rows > 0 ? s->o.max_prompt_logit_rows : INT_MAX;

    /* hardening: paused sequences (their client is not reading) keep their
     * KV but not a max_num_seqs slot, so a request whose client stops
     * reading cannot lock others out; a step still carries at most
     * max_num_seqs sequences (the step buffers are planned for that), the
     * oldest first */
    int n_paused = 0;
    for (int i = 0; i < s->running.n; i++)
        n_paused += s->running.v[i]->paused;

    for (int i = 0; i < s->running.n && budget > 0 && picked.n < s->o.max_num_seqs; i++) {
        dsq_seq_t *seq = s->running.v[i];
        if (seq->paused)
            continue;            /* hardening: its client is not reading */
        int want = seq->n_tokens - seq->n_computed;
        bool decode = seq->n_computed >= seq->n_prompt && want == 1;
        bool plr = seq->prompt_logits && seq->n_computed < seq->n_prompt;
        if (!decode && want > prefill_left)
            want = prefill_left;
        if (want > budget)
            want = budget;
        if (plr && want > plr_left)
            want = plr_left;
        if (!decode && timed)
            want = fit_chunk(s, seq->n_computed, want, &prefill_ms, any_prefill);
        if (want <= 0)
            continue;
        for (;;) {
            rc = reserve(s, seq, want);
            if (rc != DSQ_EFULL)
                break;
            /* Out of blocks: preempt the youngest running sequence that is
             * not yet scheduled in this step (possibly seq itself). */
            dsq_seq_t *victim = s->running.v[s->running.n - 1];
            bool victim_is_seq = victim == seq;
            rc = preempt(s, victim);
            n_pre++;
            if (rc || victim_is_seq)
                break;
        }
        if (rc == DSQ_EFULL || seq->state != DSQ_SEQ_RUNNING) {
            rc = DSQ_OK;
            break;   /* seq itself was preempted: it was the youngest */
        }
        if (rc)
            goto done;
        rc = vec_reserve(&picked, picked.n + 1);
        if (rc)
            goto done;
        picked.v[picked.n++] = seq;
        seq->sched_tokens = want;
        budget -= want;
        if (!decode) {
            prefill_left -= want;
            any_prefill = true;
        }
        if (plr)
            plr_left -= want;
    }
    if (prefill_left > budget)
        prefill_left = budget;
    if (s->o.admission_defer_steps > 0 && s->waiting.n > 0 && picked.n == s->running.n &&
        picked.n > 0) {
        bool defer = true;
        for (int i = 0; i < picked.n && defer; i++) {
            const dsq_seq_t *seq = picked.v[i];
            defer = seq->n_max_tokens > 0 && seq->n_computed >= seq->n_prompt &&
                    seq->sched_tokens == 1 && seq->n_tokens - seq->n_computed == 1 &&
                    seq->n_max_tokens - seq->n_tokens <= s->o.admission_defer_steps;
        }
        if (defer)
            prefill_left = 0;
    }

    /* Admit waiting sequences, first come first served, only when nothing
     * was preempted in this step (admitting then would just thrash). */
    while (n_pre == 0 && s->waiting.n > 0 && prefill_left > 0 &&
           s->running.n - n_paused < s->o.max_num_seqs && picked.n < s->o.max_num_seqs) {
        dsq_seq_t *seq = s->waiting.v[0];
        int n_ev = 0;
        int n_hit = prefix_lookup(s, seq, &n_ev, &rc);
        if (rc)
            goto done;
        int n_done = n_hit ? n_hit * dsq_kv_block_size(s->kv) : seq->n_computed;
        int want = seq->n_tokens - n_done;
        bool plr = seq->prompt_logits && n_done < seq->n_prompt;
        if (want > prefill_left)
            want = prefill_left;
        if (plr && want > plr_left)
            want = plr_left;
        if (timed)
            want = fit_chunk(s, n_done, want, &prefill_ms, any_prefill);
        if (want <= 0)
            break;      /* attack2: no logits rows left; keeps FCFS order */
        int need = dsq_kv_blocks_for(s->kv, n_done + want) - (n_hit ? n_hit : seq->bt.n);
        if (need > dsq_kv_n_free(s->kv) - n_ev)
            break;
        if (n_hit) {
            rc = dsq_kv_seq_share_prefix(s->kv, &seq->bt, s->hit_ids, s->hit_hashes, n_hit);
            if (rc)
                goto done;
            seq->n_computed = n_done;
        }
        rc = reserve(s, seq, want);
        if (rc) {
            /* cannot happen after the budget check; undo the sharing */
            dsq_kv_seq_free(s->kv, &seq->bt);
            seq->n_computed = 0;
            if (rc == DSQ_EFULL) {
                rc = DSQ_OK;
                break;
            }
            goto done;
        }
        if (dsq_kv_prefix_caching(s->kv)) {
            s->n_prefix_queries += seq->n_tokens;
            s->n_prefix_hits += n_hit ? n_done : 0;
            if (seq->n_preempted == 0) {
                int c = n_hit ? n_done : 0;
                seq->n_cached_prompt = c < seq->n_prompt ? c : seq->n_prompt;
            }
        }
        vec_erase(&s->waiting, 0);
        rc = running_insert(s, seq);
        if (!rc)
            rc = vec_reserve(&picked, picked.n + 1);
        if (rc)
            goto done;
        picked.v[picked.n++] = seq;
        seq->sched_tokens = want;
        budget -= want;
        prefill_left -= want;
        any_prefill = true;
        if (plr)
            plr_left -= want;
    }

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
            o->logit_rows[o->n_logits] = row - 1;
            o->logit_seqs[o->n_logits++] = seq;
        }
    }
    n_sched = picked.n;
    (void)n_sched;
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
        seq->n_computed += seq->sched_tokens;
        seq->sched_tokens = 0;
        /* blocks that just filled become reusable */
        dsq_kv_seq_cache_blocks(s->kv, &seq->bt, seq->tokens, seq->n_computed);
    }
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

/* The draft model of speculative decoding (draft.h): its load and
 * vocabulary check, its paged KV cache and per-sequence states, and the
 * batched greedy passes that make the drafts.
 */
#include "draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/clock.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/kv/kv_cache.h"
#include "engine/text/tokenizer.h"

/* One sequence's draft state. */
typedef struct dstate {
    uint64_t key;
    bool live;
    dsq_block_table_t bt;
    int32_t *toks;                 /* the tokens whose KV bt holds, [n_kv]    */
    int n_kv, cap;
    uint64_t used;                 /* the last proposal that used it (LRU)    */
} dstate_t;

struct dsq_draft {
    dsq_model_file_t *file;
    dsq_model_t *model;
    dsq_kv_cache_t *kv;
    int n_cmp;                     /* argmax over ids [0, n_cmp)              */
    int n_vocab;                   /* the draft's logits row                  */
    int max_chunk;
    dstate_t *st;
    int n_st;
    uint64_t stamp;
    int64_t tokens_computed, evictions;
    double round_ms;
    /* one pass's batch, grown as needed */
    int32_t *tokens, *pos, *row_seq, *slot, *bts, *lrows;
    int rows_cap, bts_cap;
    float *logits;
    int logits_cap;
};

/* The draft's vocabulary must be the target's, token for token: a draft
 * id means the target's token of the same id. */
static int check_vocab(const dsq_tokenizer_t *dt, const dsq_tokenizer_t *tt, const char *path,
                       char *err, size_t err_len)
{
    int32_t n = dsq_tokenizer_n_vocab(dt);
    if (n != dsq_tokenizer_n_vocab(tt)) {
        snprintf(err, err_len, "--draft-model %.300s: its vocabulary has %d tokens, the "
                 "model's %d: a draft model must share the model's tokenizer", path, n,
                 dsq_tokenizer_n_vocab(tt));
        return DSQ_EINVAL;
    }
    for (int32_t i = 0; i < n; i++) {
        size_t la = 0, lb = 0;
        const char *a = dsq_tokenizer_token_bytes(dt, i, &la);
        const char *b = dsq_tokenizer_token_bytes(tt, i, &lb);
        if (!a || !b || la != lb || memcmp(a, b, la)) {
            snprintf(err, err_len, "--draft-model %.300s: token %d differs from the model's "
                     "(\"%.*s\" vs \"%.*s\"): a draft model must share the model's "
                     "tokenizer", path, i, a ? (int)(la < 40 ? la : 40) : 0, a ? a : "",
                     b ? (int)(lb < 40 ? lb : 40) : 0, b ? b : "");
            return DSQ_EINVAL;
        }
    }
    return DSQ_OK;
}

dsq_draft_t *dsq_draft_create(const dsq_draft_opts_t *o, char *err, size_t err_len)
{
    dsq_draft_t *d = calloc(1, sizeof(*d));
    if (!d) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    char why[512];
    d->file = dsq_model_file_open(o->path, NULL, why, sizeof(why));
    if (d->file && !dsq_model_file_tokenizer(d->file) && o->tokenizer_path) {
        /* a checkpoint without a tokenizer reads the target's */
        dsq_model_file_close(d->file);
        d->file = dsq_model_file_open(o->path, o->tokenizer_path, why, sizeof(why));
    }
    if (!d->file) {
        snprintf(err, err_len, "--draft-model: %s", why);
        goto fail;
    }
    const dsq_tokenizer_t *dt = dsq_model_file_tokenizer(d->file);
    if (!dt) {
        snprintf(err, err_len, "--draft-model %.300s: no tokenizer in the file to check "
                 "against the model's", o->path);
        goto fail;
    }
    if (check_vocab(dt, o->target_tok, o->path, err, err_len))
        goto fail;
    d->model = dsq_model_create(d->file, &o->model, why, sizeof(why));
    if (!d->model) {
        snprintf(err, err_len, "--draft-model %.300s: %s", o->path, why);
        goto fail;
    }
    const dsq_model_config_t *c = dsq_model_config(d->model);
    d->n_vocab = (int)c->n_vocab;
    d->n_cmp = (int)(c->n_vocab < o->target_n_vocab ? c->n_vocab : o->target_n_vocab);
    int kv_heads, kv_dim;
    bool has_v;
    dsq_model_kv_shape(d->model, &kv_heads, &kv_dim, &has_v);
    int bs = o->block_size > 0 ? o->block_size : 16;
    int64_t n_blocks = (o->kv_tokens + bs - 1) / bs;
    d->kv = dsq_kv_create_on(o->model.backend, (int)c->n_layer, kv_heads, kv_dim, bs,
                             n_blocks > 0 ? n_blocks : 1, o->kv_dtype, has_v, why,
                             sizeof(why));
    if (!d->kv) {
        snprintf(err, err_len, "--draft-model %.300s: its KV cache: %s", o->path, why);
        goto fail;
    }
    d->n_st = o->n_states > 0 ? o->n_states : 1;
    d->max_chunk = o->max_chunk > 0 ? o->max_chunk : 256;
    d->st = calloc((size_t)d->n_st, sizeof(*d->st));
    if (!d->st) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    for (int i = 0; i < d->n_st; i++)
        dsq_block_table_init(&d->st[i].bt);
    return d;
fail:
    dsq_draft_destroy(d);
    return NULL;
}

static void state_drop(dsq_draft_t *d, dstate_t *s)
{
    if (s->live)
        dsq_kv_seq_free(d->kv, &s->bt);
    s->live = false;
    s->n_kv = 0;
    s->key = 0;
}

void dsq_draft_destroy(dsq_draft_t *d)
{
    if (!d)
        return;
    for (int i = 0; d->st && i < d->n_st; i++) {
        state_drop(d, &d->st[i]);
        dsq_block_table_deinit(&d->st[i].bt);
        free(d->st[i].toks);
    }
    free(d->st);
    free(d->tokens);
    free(d->pos);
    free(d->row_seq);
    free(d->slot);
    free(d->bts);
    free(d->lrows);
    free(d->logits);
    dsq_kv_destroy(d->kv);
    dsq_model_destroy(d->model);
    dsq_model_file_close(d->file);
    free(d);
}

void dsq_draft_forget(dsq_draft_t *d, uint64_t key)
{
    for (int i = 0; d && i < d->n_st; i++)
        if (d->st[i].live && d->st[i].key == key)
            state_drop(d, &d->st[i]);
}

void dsq_draft_info(const dsq_draft_t *d, dsq_draft_info_t *out)
{
    memset(out, 0, sizeof(*out));
    out->weight_bytes = dsq_model_weight_bytes(d->model);
    out->kv_blocks = dsq_kv_n_blocks(d->kv);
    out->kv_free = dsq_kv_n_free(d->kv);
    for (int i = 0; i < d->n_st; i++)
        out->n_states += d->st[i].live;
    out->tokens_computed = d->tokens_computed;
    out->evictions = d->evictions;
    out->round_ms = d->round_ms;
}

/* The least recently used live state not used by this proposal, or NULL. */
static dstate_t *lru_victim(dsq_draft_t *d)
{
    dstate_t *v = NULL;
    for (int i = 0; i < d->n_st; i++) {
        dstate_t *s = &d->st[i];
        if (s->live && s->used != d->stamp && (!v || s->used < v->used))
            v = s;
    }
    return v;
}

/* key's state, or a new one (a free slot, else the LRU victim's); NULL
 * when every slot is in use by this proposal. */
static dstate_t *state_for(dsq_draft_t *d, uint64_t key)
{
    dstate_t *free_slot = NULL;
    for (int i = 0; i < d->n_st; i++) {
        if (d->st[i].live && d->st[i].key == key)
            return &d->st[i];
        if (!d->st[i].live && !free_slot)
            free_slot = &d->st[i];
    }
    if (!free_slot && (free_slot = lru_victim(d))) {
        state_drop(d, free_slot);
        d->evictions++;
    }
    if (free_slot) {
        free_slot->live = true;
        free_slot->key = key;
        free_slot->n_kv = 0;
    }
    return free_slot;
}

/* Room for n tokens in s's table, evicting other states if needed. */
static int reserve(dsq_draft_t *d, dstate_t *s, int n)
{
    if (n > s->cap) {
        int cap = s->cap ? s->cap : 64;
        while (cap < n)
            cap *= 2;
        int32_t *p = realloc(s->toks, (size_t)cap * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        s->toks = p;
        s->cap = cap;
    }
    for (;;) {
        int rc = dsq_kv_seq_reserve(d->kv, &s->bt, n);
        if (rc != DSQ_EFULL)
            return rc;
        dstate_t *v = lru_victim(d);
        if (!v)
            return DSQ_EFULL;
        state_drop(d, v);
        d->evictions++;
    }
}

static int grow_rows(dsq_draft_t *d, int rows, int bts)
{
    if (rows > d->rows_cap) {
        int32_t **arr[] = {&d->tokens, &d->pos, &d->row_seq, &d->slot, &d->lrows};
        for (size_t i = 0; i < sizeof(arr) / sizeof(arr[0]); i++) {
            int32_t *p = realloc(*arr[i], (size_t)rows * sizeof(int32_t));
            if (!p)
                return DSQ_ENOMEM;
            *arr[i] = p;
        }
        d->rows_cap = rows;
    }
    if (bts > d->bts_cap) {
        int32_t *p = realloc(d->bts, (size_t)bts * sizeof(int32_t));
        if (!p)
            return DSQ_ENOMEM;
        d->bts = p;
        d->bts_cap = bts;
    }
    return DSQ_OK;
}

static int32_t argmax(const float *row, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

/* A pass over rows already in d->tokens/pos/row_seq (n_rows of them) for
 * the states ss[0..n_ss): their block tables, the rows' slots, and
 * logits for the n_logits rows in d->lrows. */
static int run_pass(dsq_draft_t *d, dstate_t **ss, int n_ss, int n_rows, int n_logits)
{
    int mb = 1;
    for (int i = 0; i < n_ss; i++)
        if (ss[i]->bt.n > mb)
            mb = ss[i]->bt.n;
    int rc = grow_rows(d, n_rows, n_ss * mb);
    if (rc)
        return rc;
    if (n_logits > d->logits_cap) {
        float *p = realloc(d->logits, (size_t)n_logits * (size_t)d->n_vocab * sizeof(float));
        if (!p)
            return DSQ_ENOMEM;
        d->logits = p;
        d->logits_cap = n_logits;
    }
    for (int i = 0; i < n_ss; i++) {
        memcpy(d->bts + (size_t)i * mb, ss[i]->bt.ids, (size_t)ss[i]->bt.n * sizeof(int32_t));
        for (int j = ss[i]->bt.n; j < mb; j++)
            d->bts[(size_t)i * mb + j] = 0;
    }
    for (int r = 0; r < n_rows; r++)
        d->slot[r] = dsq_kv_slot(d->kv, &ss[d->row_seq[r]]->bt, d->pos[r]);
    dsq_batch_t b = {.n_tokens = n_rows, .tokens = d->tokens, .pos = d->pos,
                     .row_seq = d->row_seq, .slot = d->slot, .n_seqs = n_ss,
                     .block_tables = d->bts, .max_blocks = mb, .n_logits = n_logits,
                     .logit_rows = d->lrows};
    rc = dsq_model_forward(d->model, d->kv, &b, d->logits);
    if (!rc)
        d->tokens_computed += n_rows;
    return rc;
}

/* Catch the states up to their sequences: one pass of at most
 * d->max_chunk rows, the jobs that need the fewest rows first (a
 * sequence drafted for in the last step needs one or two: its drafts go
 * on while a new one's prompt is read); a job whose last token is
 * computed gets its first draft. One pass a proposal, so a long prompt's
 * catch-up is spread over steps (no drafts for it meanwhile) instead of
 * stalling the step of every sequence in the batch. */
static int catch_up(dsq_draft_t *d, dsq_draft_job_t *jobs, dstate_t **js, int n_jobs,
                    dstate_t **ss, int *jx)
{
    int order[64], n_ord = 0;
    for (int i = 0; i < n_jobs && n_ord < 64; i++) {
        if (!js[i] || js[i]->n_kv >= jobs[i].n_tokens)
            continue;
        int need = jobs[i].n_tokens - js[i]->n_kv, at = n_ord++;
        while (at > 0 && jobs[order[at - 1]].n_tokens - js[order[at - 1]]->n_kv > need) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = i;
    }
    int n_rows = 0, n_ss = 0, n_logits = 0;
    for (int o = 0; o < n_ord && n_rows < d->max_chunk; o++) {
        int i = order[o];
        dstate_t *s = js[i];
        int take = jobs[i].n_tokens - s->n_kv;
        if (take > d->max_chunk - n_rows)
            take = d->max_chunk - n_rows;
        int rc = grow_rows(d, n_rows + take, 0);
        if (rc)
            return rc;
        for (int t = 0; t < take; t++) {
            int p = s->n_kv + t;
            d->tokens[n_rows + t] = jobs[i].tokens[p];
            d->pos[n_rows + t] = p;
            d->row_seq[n_rows + t] = n_ss;
        }
        if (s->n_kv + take == jobs[i].n_tokens) {
            d->lrows[n_logits] = n_rows + take - 1;
            jx[n_logits++] = i;
        }
        ss[n_ss++] = s;
        n_rows += take;
    }
    if (n_rows == 0)
        return DSQ_OK;
    int rc = run_pass(d, ss, n_ss, n_rows, n_logits);
    if (rc)
        return rc;
    for (int r = 0; r < n_rows; r++) {
        dstate_t *s = ss[d->row_seq[r]];
        s->toks[d->pos[r]] = d->tokens[r];
        s->n_kv = d->pos[r] + 1;
    }
    for (int l = 0; l < n_logits; l++) {
        dsq_draft_job_t *j = &jobs[jx[l]];
        j->out[0] = argmax(d->logits + (size_t)l * (size_t)d->n_vocab, d->n_cmp);
        j->n_out = 1;
    }
    return DSQ_OK;
}

int dsq_draft_propose(dsq_draft_t *d, dsq_draft_job_t *jobs, int n_jobs)
{
    if (n_jobs <= 0)
        return DSQ_OK;
    dstate_t **js = calloc((size_t)n_jobs * 2, sizeof(*js));
    int *jx = malloc((size_t)n_jobs * sizeof(*jx));
    if (!js || !jx) {
        free(js);
        free(jx);
        return DSQ_ENOMEM;
    }
    dstate_t **ss = js + n_jobs;
    d->stamp++;
    int rc = DSQ_OK, kmax = 0;
    for (int i = 0; i < n_jobs && !rc; i++) {
        dsq_draft_job_t *j = &jobs[i];
        j->n_out = 0;
        if (j->k < 1 || j->n_tokens < 1)
            continue;
        dstate_t *s = state_for(d, j->key);
        if (!s)
            continue;
        s->used = d->stamp;
        /* keep the KV of the prefix the state and the sequence still agree
         * on, and recompute at least the last token (its logits) */
        int agree = 0, lim = s->n_kv < j->n_tokens - 1 ? s->n_kv : j->n_tokens - 1;
        while (agree < lim && s->toks[agree] == j->tokens[agree])
            agree++;
        s->n_kv = agree;
        dsq_kv_seq_truncate(d->kv, &s->bt, agree);
        rc = reserve(d, s, j->n_tokens + j->k - 1);
        if (rc == DSQ_EFULL) {
            rc = DSQ_OK;      /* no room even alone: no drafts this time */
            continue;
        }
        js[i] = s;
        if (j->k > kmax)
            kmax = j->k;
    }
    if (!rc)
        rc = catch_up(d, jobs, js, n_jobs, ss, jx);
    for (int r = 1; r < kmax && !rc; r++) {
        /* one more draft for each job that wants it: one row each */
        double t0 = dsq_clock_now_s();
        int n = 0;
        if ((rc = grow_rows(d, n_jobs, 0)))
            break;
        for (int i = 0; i < n_jobs; i++) {
            if (!js[i] || jobs[i].n_out != r || jobs[i].k <= r)
                continue;
            d->tokens[n] = jobs[i].out[r - 1];
            d->pos[n] = jobs[i].n_tokens + r - 1;
            d->row_seq[n] = n;
            d->lrows[n] = n;
            ss[n] = js[i];
            jx[n++] = i;
        }
        if (n == 0)
            break;
        if ((rc = run_pass(d, ss, n, n, n)))
            break;
        for (int l = 0; l < n; l++) {
            dsq_draft_job_t *j = &jobs[jx[l]];
            ss[l]->toks[d->pos[l]] = d->tokens[l];
            ss[l]->n_kv = d->pos[l] + 1;
            j->out[r] = argmax(d->logits + (size_t)l * (size_t)d->n_vocab, d->n_cmp);
            j->n_out = r + 1;
        }
        double ms = (dsq_clock_now_s() - t0) * 1e3;
        d->round_ms = d->round_ms > 0 ? 0.8 * d->round_ms + 0.2 * ms : ms;
    }
    if (rc) {
        dsq_log(DSQ_LOG_WARN, "event=draft_failed err=%s", dsq_strerror(rc));
        for (int i = 0; i < n_jobs; i++) {
            jobs[i].n_out = 0;
            if (js[i])
                state_drop(d, js[i]);
        }
    }
    free(js);
    free(jx);
    return rc;
}

/* One choice of a request (eseq_t), engine thread only, from its creation
 * to its final event: sampling its next token (under the grammar's mask
 * when the request has a grammar), the fork of the n > 1 / best_of
 * choices from the first once the prompt is computed, and the text
 * pipeline every accepted token goes through: the incremental
 * detokenizer, a hold-back buffer that keeps text a stop string could
 * still begin with (text goes out only once it can no longer be part of
 * one), and the pending output event the step's publish hands to the
 * request's queue.
 */
#include "engine_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "engine/common/clock.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/kv/kv_cache.h"
#include "engine/text/detok.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"
#include "sampler.h"
#include "scheduler.h"

/* Where a choice stands in its thinking section (sp.think_*). */
enum { THINK_BEFORE = 0, THINK_IN, THINK_AFTER };

eseq_t *dsq__eseq_create(dsq_engine_t *e, dsq_req_t *r, int index)
{
    eseq_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->req = r;
    s->uid = ++e->next_uid;
    s->think_state = r->sp.think_open ? THINK_IN : THINK_BEFORE;
    s->think_force = -1;
    s->seq.owner = s;
    s->seq.req = r;                /* the fair share is per request */
    s->seq.index = index;
    dsq_block_table_init(&s->seq.bt);
    s->detok = dsq_detok_create(e->tok, true, false);
    if (r->sp.grammar)
        s->gm = dsq_grammar_matcher_create(r->sp.grammar);
    if (!s->detok || (r->sp.grammar && !s->gm)) {
        dsq_detok_destroy(s->detok);
        free(s);
        return NULL;
    }
    return s;
}

void dsq__eseq_destroy(eseq_t *s)
{
    if (!s)
        return;
    dsq_detok_destroy(s->detok);
    dsq_grammar_matcher_free(s->gm);
    free(s->gmask);
    dsq_block_table_deinit(&s->seq.bt);
    free(s->seq.tokens);
    free(s->hold);
    dsq_output_free(&s->ev);
    free(s->ev_text);
    free(s);
}

int dsq__seq_append(dsq_seq_t *q, int32_t t)
{
    if (q->n_tokens == q->cap_tokens) {
        int cap = q->cap_tokens ? q->cap_tokens * 2 : 64;
        int32_t *p = realloc(q->tokens, (size_t)cap * sizeof(*p));
        if (!p)
            return DSQ_ENOMEM;
        q->tokens = p;
        q->cap_tokens = cap;
    }
    q->tokens[q->n_tokens++] = t;
    return DSQ_OK;
}

static int buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        while (c < *len + n + 1)
            c *= 2;
        char *p = realloc(*buf, c);
        if (!p)
            return DSQ_ENOMEM;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return DSQ_OK;
}

/* Grow the pending event's per-token arrays to hold one more token. */
static int ev_reserve(eseq_t *s, int n_top)
{
    dsq_output_t *ev = &s->ev;
    if (ev->n_tokens < s->ev_cap)
        return DSQ_OK;
    int cap = s->ev_cap ? s->ev_cap * 2 : 8;
    int32_t *t = realloc(ev->tokens, (size_t)cap * sizeof(*t));
    if (!t)
        return DSQ_ENOMEM;
    ev->tokens = t;
    size_t *off = realloc(ev->token_text_offset, (size_t)cap * sizeof(*off));
    if (!off)
        return DSQ_ENOMEM;
    ev->token_text_offset = off;
    if (n_top >= 0) {
        float *lp = realloc(ev->logprobs, (size_t)cap * sizeof(*lp));
        if (!lp)
            return DSQ_ENOMEM;
        ev->logprobs = lp;
        if (n_top > 0) {
            dsq_top_logprob_t *tp = realloc(ev->top, (size_t)cap * (size_t)n_top * sizeof(*tp));
            if (!tp)
                return DSQ_ENOMEM;
            ev->top = tp;
        }
    }
    s->ev_cap = cap;
    return DSQ_OK;
}

/* Move text that can no longer become part of a stop string from hold to
 * the pending event. final: flush everything. Returns true if a stop string
 * was found (the text before it is emitted, the rest dropped). */
static bool release_text(eseq_t *s, bool final)
{
    dsq_req_t *r = s->req;
    size_t cut = s->hold_len;
    bool stopped = false;
    int which = 0;
    for (int i = 0; i < r->sp.n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        if (sl == 0)
            continue;
        char *p = memmem(s->hold, s->hold_len, r->stop[i], sl);
        if (p && (size_t)(p - s->hold) < cut) {
            cut = (size_t)(p - s->hold);
            stopped = true;
            which = i + 1;
        }
    }
    if (stopped && !s->stop_matched)
        s->stop_matched = which;
    if (!stopped && !final && r->max_stop_len > 0) {
        size_t keep = r->max_stop_len - 1;
        cut = s->hold_len > keep ? s->hold_len - keep : 0;
        /* Never split a UTF-8 character: back up to a lead byte. */
        while (cut > 0 && cut < s->hold_len && ((unsigned char)s->hold[cut] & 0xC0) == 0x80)
            cut--;
    }
    if (cut > 0) {
        buf_append(&s->ev_text, &s->ev_text_len, &s->ev_text_cap, s->hold, cut);
        memmove(s->hold, s->hold + cut, s->hold_len - cut);
        s->hold_len -= cut;
    }
    if (stopped || final)
        s->hold_len = 0;
    return stopped;
}

/* Hand the pending event to the request queue. */
void dsq__flush_event(eseq_t *s)
{
    dsq_output_t *ev = &s->ev;
    if (ev->n_tokens == 0 && s->ev_text_len == 0 && ev->finish == DSQ_FINISH_NONE)
        return;
    ev->index = s->seq.index;
    ev->text = s->ev_text ? s->ev_text : strdup("");
    ev->text_len = s->ev_text_len;
    ev->n_top = s->req->sp.logprobs > 0 ? s->req->sp.logprobs : 0;
    if (!s->req->queue_reported && s->req->t_sched > 0) {
        ev->queue_us = (int64_t)((s->req->t_sched - s->req->t_arrival) * 1e6);
        if (ev->queue_us <= 0)
            ev->queue_us = 1;
        s->req->queue_reported = true;
    }
    if (s->req->plp && !s->req->plp_sent) {
        /* prompt logprobs ride on the request's first event */
        dsq_req_t *r = s->req;
        r->plp_sent = true;
        ev->n_prompt_logprobs = r->plp_n;
        ev->prompt_logprobs = r->plp;
        ev->prompt_top = r->plp_top;
        r->plp = NULL;
        r->plp_top = NULL;
    }
    if (ev->finish != DSQ_FINISH_NONE) {
        ev->queue_timeout = s->req->queue_timeout;
        ev->prompt_tokens = s->req->n_prompt;
        ev->completion_tokens = s->n_generated;
        ev->cached_tokens = s->seq.n_cached_prompt;
        ev->stop_matched = s->stop_matched;
        ev->reasoning_tokens = s->think_n;
    }
    s->ev_text = NULL;
    s->ev_text_len = s->ev_text_cap = 0;
    s->ev_cap = 0;
    dsq__req_push(s->req, ev);
}

/* End a choice. Text still held back (for stop strings) or inside the
 * detokenizer is emitted, except after a stop string, where everything from
 * the stop string on is dropped, and on abort. */
void dsq__finish_seq(dsq_engine_t *e, eseq_t *s, dsq_finish_t why, bool drop_tail)
{
    if (s->finished)
        return;
    if (why != DSQ_FINISH_ABORT && !drop_tail) {
        char *tail = NULL;
        size_t tail_len = 0;
        if (dsq_detok_flush(s->detok, &tail, &tail_len) == 0 && tail_len > 0)
            buf_append(&s->hold, &s->hold_len, &s->hold_cap, tail, tail_len);
        free(tail);
        release_text(s, true);
    }
    s->finished = true;
    s->ev.finish = why;
    dsq_draft_forget(e->draft, s->uid);
    if (s->seq.state != DSQ_SEQ_DETACHED)
        dsq_sched_remove(e->sched, &s->seq);
    s->req->n_live--;
    pthread_mutex_lock(&s->req->mu);
    s->req->tl.n_generated += s->n_generated;
    s->req->tl.n_preemptions += s->seq.n_preempted;
    if (s->req->n_live == 0)
        s->req->tl.t_end = dsq_clock_now_s();
    pthread_mutex_unlock(&s->req->mu);
    pthread_mutex_lock(&e->mu);
    e->stats.requests_finished_total += s->req->n_live == 0;
    pthread_mutex_unlock(&e->mu);
}

/* The choice's output ends with ids[0..n). */
static bool output_ends_with(const eseq_t *s, const int32_t *ids, int n)
{
    int n_out = s->seq.n_tokens - s->seq.n_prompt;
    return n > 0 && n_out >= n &&
           !memcmp(s->seq.tokens + s->seq.n_tokens - n, ids, (size_t)n * sizeof(*ids));
}

/* The thinking section after the token just appended: count it, step a
 * forced end along, and see the section open or close. */
static void think_track(eseq_t *s)
{
    const dsq_sampling_t *sp = &s->req->sp;
    if (!sp->n_think_end)
        return;
    if (s->think_state == THINK_BEFORE) {
        if (output_ends_with(s, sp->think_start, sp->n_think_start))
            s->think_state = THINK_IN;
        return;
    }
    if (s->think_state != THINK_IN)
        return;
    s->think_n++;
    if (s->think_force >= 0 && ++s->think_force < sp->n_think_end)
        return;
    if (s->think_force >= 0 || output_ends_with(s, sp->think_end, sp->n_think_end)) {
        s->think_state = THINK_AFTER;
        s->think_force = -1;
    }
}

static bool is_stop_token(const dsq_req_t *r, int32_t t)
{
    for (int i = 0; i < r->sp.n_stop_token_ids; i++)
        if (r->sp.stop_token_ids[i] == t)
            return true;
    return false;
}

/* Record a sampled token on s and decide whether the sequence ends. */
static int accept_token(dsq_engine_t *e, eseq_t *s, int32_t tok, float lp,
                        const dsq_top_logprob_t *top)
{
    dsq_req_t *r = s->req;
    int n_top = r->sp.logprobs;
    int rc = dsq__seq_append(&s->seq, tok);
    if (!rc)
        rc = ev_reserve(s, n_top);
    if (rc)
        return rc;
    think_track(s);
    dsq_output_t *ev = &s->ev;
    int k = ev->n_tokens++;
    ev->tokens[k] = tok;
    ev->token_text_offset[k] = s->text_bytes;
    if (n_top >= 0) {
        ev->logprobs[k] = lp;
        if (n_top > 0)
            memcpy(ev->top + (size_t)k * (size_t)n_top, top, (size_t)n_top * sizeof(*top));
    }
    s->n_generated++;
    s->cum_logprob += lp;
    if (r->t_first_token == 0) {
        r->t_first_token = dsq_clock_now_s();
        dsq_admission_observe_ttft(e->adm, (r->t_first_token - r->t_arrival) * 1e3);
    }
    pthread_mutex_lock(&e->mu);
    e->stats.generation_tokens_total++;
    pthread_mutex_unlock(&e->mu);

    bool eos = !r->sp.ignore_eos && dsq_tokenizer_is_eog(e->tok, tok);
    if (eos || is_stop_token(r, tok)) {
        dsq__finish_seq(e, s, DSQ_FINISH_STOP, false);
        return DSQ_OK;
    }
    char *piece = NULL;
    size_t piece_len = 0;
    rc = dsq_detok_push(s->detok, tok, &piece, &piece_len);
    if (!rc && piece_len > 0) {
        s->text_bytes += piece_len;
        rc = buf_append(&s->hold, &s->hold_len, &s->hold_cap, piece, piece_len);
    }
    free(piece);
    if (rc)
        return rc;
    if (release_text(s, false)) {
        dsq__finish_seq(e, s, DSQ_FINISH_STOP, true);
        return DSQ_OK;
    }
    if (s->n_generated >= r->sp.max_tokens || s->seq.n_tokens >= e->max_model_len)
        dsq__finish_seq(e, s, DSQ_FINISH_LENGTH, false);
    return DSQ_OK;
}

/* n > 1: after the prompt is computed, fork the first sequence so the
 * choices share the prompt's KV blocks (copy on write). */
int dsq__fork_choices(dsq_engine_t *e, dsq_req_t *r)
{
    eseq_t *parent = r->seqs[0];
    for (int i = 1; i < dsq__req_n_total(r); i++) {
        eseq_t *c = dsq__eseq_create(e, r, i);
        if (!c)
            return DSQ_ENOMEM;
        r->seqs[r->n_seqs++] = c;
        r->n_live++;
        c->seq.order = parent->seq.order;
        c->seq.n_prompt = parent->seq.n_prompt;
        c->seq.n_max_tokens = parent->seq.n_max_tokens;
        c->seq.n_cached_prompt = parent->seq.n_cached_prompt;
        c->seq.no_prefix_cache = parent->seq.no_prefix_cache;
        for (int j = 0; j < parent->seq.n_tokens; j++)
            if (dsq__seq_append(&c->seq, parent->seq.tokens[j]))
                return DSQ_ENOMEM;
        c->seq.n_computed = parent->seq.n_computed;
        int rc = dsq_kv_seq_fork(e->kv, &c->seq.bt, &parent->seq.bt);
        if (rc)
            return rc;
        uint64_t seed = r->sp.seed + (uint64_t)i;
        if (!r->sp.has_seed && RAND_bytes((unsigned char *)&seed, sizeof(seed)) != 1)
            seed = (uint64_t)dsq_clock_now_s() ^ (r->id + (uint64_t)i);
        dsq_rng_seed(&c->rng, seed);
        rc = dsq_sched_add_fork(e->sched, &c->seq);
        if (rc)
            return rc;
    }
    r->forked = true;
    return DSQ_OK;
}

int dsq__sample_seq(dsq_engine_t *e, eseq_t *s, const float *row)
{
    dsq_req_t *r = s->req;
    dsq_top_logprob_t top[MAX_TOP_LOGPROBS];
    int32_t tok = 0;
    float lp = 0;
    int n_top = r->sp.logprobs > 0 ? r->sp.logprobs : 0;
#ifndef NDEBUG
    if (e->fail_choice > 0 && s->seq.index == e->fail_choice - 1) {
        e->fail_choice = 0;   /* tests: a failed step, once (engine_main's path) */
        return DSQ_EIO;
    }
#endif
    memcpy(e->logits_fork, row, (size_t)e->n_vocab * sizeof(float));
    dsq_sampler_hist_t hist = {
        .prompt = s->seq.tokens, .n_prompt = s->seq.n_prompt,
        .output = s->seq.tokens + s->seq.n_prompt,
        .n_output = s->seq.n_tokens - s->seq.n_prompt,
    };
    if (s->gm) {
        /* the grammar's allowed tokens (cached per matcher state) */
        if (!e->gvocab && !(e->gvocab = dsq_grammar_vocab_create(e->tok)))
            return DSQ_ENOMEM;
        uint32_t *mask;
        int n_ok;
        if (s->gmask_ready) {
            /* made by the mask worker during this step's forward pass */
            mask = s->gmask;
            n_ok = s->gmask_n;
            s->gmask_ready = false;
        } else {
            size_t gwords = dsq__mask_words(e);
            if (!e->gmask && !(e->gmask = malloc(gwords * sizeof(uint32_t))))
                return DSQ_ENOMEM;
            mask = e->gmask;
            memset(mask, 0, gwords * sizeof(uint32_t));
            n_ok = dsq_grammar_matcher_fill_mask(s->gm, e->gvocab, mask, NULL);
        }
        if (n_ok == DSQ_ERANGE) {
            /* the grammar's state costs more than a mask may (grammar.h):
             * end this choice, not the batch */
            dsq_log(DSQ_LOG_WARN, "event=grammar_too_costly req=%llu (the grammar's state is "
                    "beyond the matcher's limits)", (unsigned long long)r->id);
            dsq__finish_seq(e, s, DSQ_FINISH_ABORT, true);
            return DSQ_OK;
        }
        if (n_ok < 0)
            return n_ok;
        hist.allowed = mask;
    } else if (r->sp.has_think_budget && s->think_state == THINK_IN && r->sp.n_think_end &&
               (s->think_force >= 0 || s->think_n >= r->sp.think_budget)) {
        /* the budget is spent: the end of the section comes next, one
         * token a step, through the sampler so its logprob is the model's */
        size_t words = ((size_t)e->n_vocab + 31) / 32;
        int32_t t = r->sp.think_end[s->think_force >= 0 ? s->think_force : 0];
        if (!e->tmask && !(e->tmask = malloc(words * sizeof(uint32_t))))
            return DSQ_ENOMEM;
        memset(e->tmask, 0, words * sizeof(uint32_t));
        if (t >= 0 && t < e->n_vocab)
            e->tmask[t / 32] |= 1u << (t % 32);
        s->think_force = s->think_force >= 0 ? s->think_force : 0;
        hist.allowed = e->tmask;
    }
    int rc = dsq_sampler_pick(e->sampler, &r->sp, &hist, e->logits_fork, &s->rng, &tok,
                              r->sp.logprobs >= 0 || dsq__req_n_total(r) > r->sp.n ? &lp : NULL,
                              n_top ? top : NULL, n_top);
    if (rc == DSQ_ERANGE && s->gm) {
        /* the grammar allows no token the model can give (every allowed
         * logit -inf or NaN): end the choice here */
        dsq_log(DSQ_LOG_WARN, "event=grammar_dead_end req=%llu (no allowed token has a "
                "finite logit)", (unsigned long long)r->id);
        dsq__finish_seq(e, s, DSQ_FINISH_STOP, false);
        return DSQ_OK;
    }
    if (!rc && s->gm && (rc = dsq_grammar_matcher_accept_token(s->gm, e->gvocab, tok)) != 0) {
        if (rc == DSQ_ENOMEM)
            return rc;
        /* the mask allowed tok, so the matcher must take it: a refusal is
         * a bug in the grammar engine; end this choice, not the batch */
        dsq_log(DSQ_LOG_ERROR, "event=grammar_rejected_token req=%llu token=%d (the mask "
                "allowed a token the matcher refuses)", (unsigned long long)r->id, (int)tok);
        dsq__finish_seq(e, s, DSQ_FINISH_ABORT, true);
        return DSQ_OK;
    }
    if (rc == DSQ_ERANGE) {
        /* every logit NaN: this sequence cannot go on, the others can */
        dsq_log(DSQ_LOG_ERROR, "event=nonfinite_logits req=%llu (the model's weights or "
                "activations are not finite)", (unsigned long long)r->id);
        dsq__finish_seq(e, s, DSQ_FINISH_ABORT, true);
        return DSQ_OK;
    }
    if (!rc)
        rc = accept_token(e, s, tok, lp, top);
    /* a grammar that admits nothing more (its sentence is complete, or
     * it took an end token even under ignore_eos) ends the choice */
    if (!rc && s->gm && !s->finished && dsq_grammar_matcher_done(s->gm))
        dsq__finish_seq(e, s, DSQ_FINISH_STOP, false);
    return rc;
}

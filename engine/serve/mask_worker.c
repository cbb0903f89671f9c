/* The grammar-mask worker: one thread that makes the token masks of a
 * step's constrained choices while the engine thread runs that step's
 * forward pass, so that a grammar adds to a step only what its masks take
 * beyond the forward pass. The hand-off is one job list under e->mw.mu:
 * the engine thread posts it before the forward pass and waits for it
 * after; in between only the worker touches those choices' matchers and
 * masks. Started at the first constrained step, joined by
 * dsq_engine_destroy.
 */
#include "engine_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/grammar.h"

/* Words of a grammar mask: it covers the model's rows and the
 * tokenizer's vocabulary, whichever is larger (padded embedding rows, or
 * a tokenizer larger than the model); rows the tokenizer does not know
 * stay disallowed. e->gvocab must exist. */
size_t dsq__mask_words(const dsq_engine_t *e)
{
    int32_t nv = dsq_grammar_vocab_size(e->gvocab);
    return ((size_t)(nv > e->n_vocab ? nv : e->n_vocab) + 31) / 32;
}

static void *mask_worker_main(void *arg)
{
    dsq_engine_t *e = arg;
    size_t words = dsq__mask_words(e);
    pthread_mutex_lock(&e->mw.mu);
    for (;;) {
        while (!e->mw.pending && !e->mw.quit)
            pthread_cond_wait(&e->mw.cv, &e->mw.mu);
        if (e->mw.quit)
            break;
        int n = e->mw.n_jobs;
        pthread_mutex_unlock(&e->mw.mu);
        for (int i = 0; i < n; i++) {
            eseq_t *s = e->mw.jobs[i];
            memset(s->gmask, 0, words * sizeof(uint32_t));
            s->gmask_n = dsq_grammar_matcher_fill_mask(s->gm, e->gvocab, s->gmask, NULL);
            s->gmask_ready = true;
        }
        pthread_mutex_lock(&e->mw.mu);
        e->mw.pending = false;
        pthread_cond_broadcast(&e->mw.cv);
    }
    pthread_mutex_unlock(&e->mw.mu);
    return NULL;
}

/* Hand the masks of this step's constrained sequences to the mask worker
 * before the forward pass (the sampler then finds them made). Nothing on
 * any failure: dsq__sample_seq makes a mask itself when none is ready. Returns
 * true when jobs were posted (dsq__mask_worker_wait must follow). */
bool dsq__mask_worker_post(dsq_engine_t *e, const dsq_sched_out_t *out)
{
    int n = 0;
    for (int i = 0; i < out->n_logits; i++) {
        eseq_t *s = (eseq_t *)out->logit_seqs[i]->owner;
        /* one mask per choice: a choice with drafts has several rows in a
         * row, its first one's mask is made here (speculate.c) */
        if (i > 0 && out->logit_seqs[i] == out->logit_seqs[i - 1])
            continue;
        n += s->gm && !s->finished && s->req->sp.max_tokens != 0;
    }
    if (n == 0)
        return false;
    if (!e->gvocab && !(e->gvocab = dsq_grammar_vocab_create(e->tok)))
        return false;
    if (!e->mw.started) {
        pthread_mutex_init(&e->mw.mu, NULL);
        pthread_cond_init(&e->mw.cv, NULL);
        if (pthread_create(&e->mw.thread, NULL, mask_worker_main, e) != 0) {
            pthread_cond_destroy(&e->mw.cv);
            pthread_mutex_destroy(&e->mw.mu);
            return false;
        }
        e->mw.started = true;
    }
    if (n > e->mw.cap) {
        eseq_t **j = realloc(e->mw.jobs, (size_t)n * sizeof(*j));
        if (!j)
            return false;
        e->mw.jobs = j;
        e->mw.cap = n;
    }
    size_t words = dsq__mask_words(e);
    e->mw.n_jobs = 0;
    for (int i = 0; i < out->n_logits; i++) {
        eseq_t *s = (eseq_t *)out->logit_seqs[i]->owner;
        if ((i > 0 && out->logit_seqs[i] == out->logit_seqs[i - 1]) || !s->gm ||
            s->finished || s->req->sp.max_tokens == 0)
            continue;
        s->gmask_ready = false;
        if (!s->gmask && !(s->gmask = malloc(words * sizeof(uint32_t))))
            continue;   /* this one is made inline */
        e->mw.jobs[e->mw.n_jobs++] = s;
    }
    if (e->mw.n_jobs == 0)
        return false;
    pthread_mutex_lock(&e->mw.mu);
    e->mw.pending = true;
    pthread_cond_broadcast(&e->mw.cv);
    pthread_mutex_unlock(&e->mw.mu);
    return true;
}

void dsq__mask_worker_wait(dsq_engine_t *e)
{
    pthread_mutex_lock(&e->mw.mu);
    while (e->mw.pending)
        pthread_cond_wait(&e->mw.cv, &e->mw.mu);
    pthread_mutex_unlock(&e->mw.mu);
}

void dsq__mask_worker_stop(dsq_engine_t *e)
{
    if (!e->mw.started)
        return;
    pthread_mutex_lock(&e->mw.mu);
    e->mw.quit = true;
    pthread_cond_broadcast(&e->mw.cv);
    pthread_mutex_unlock(&e->mw.mu);
    pthread_join(e->mw.thread, NULL);
    pthread_cond_destroy(&e->mw.cv);
    pthread_mutex_destroy(&e->mw.mu);
    e->mw.started = false;
}

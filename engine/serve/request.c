/* The request handle (dsq_req_t): created and read by HTTP threads,
 * filled by the engine thread. Output events go through a queue under the
 * request's own mutex, so a reader never waits for a step and the engine
 * never waits for a reader; the engine only looks at the bytes a reader
 * leaves queued, to hold a request whose client stopped reading. The
 * handle is reference-counted: its creator holds one reference, the
 * engine another from submit until every choice ended.
 */
#include "engine_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/text/grammar.h"

#define MAX_BEST_OF 1024            /* sequences one request may fork        */

static atomic_uint_fast64_t next_req_id = 1;

void dsq_output_free(dsq_output_t *o)
{
    if (!o)
        return;
    free(o->text);
    free(o->tokens);
    free(o->logprobs);
    free(o->top);
    free(o->token_text_offset);
    free(o->prompt_logprobs);
    free(o->prompt_top);
    memset(o, 0, sizeof(*o));
}

static void req_free(dsq_req_t *r)
{
    dsq_grammar_free(r->sp.grammar);
    free(r->prompt);
    free(r->bias_ids);
    free(r->bias);
    free(r->stop_ids);
    free(r->think_ids);
    for (int i = 0; r->stop && i < r->sp.n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    for (int i = 0; i < r->q_n; i++)
        dsq_output_free(&r->q[(r->q_head + i) % r->q_cap]);
    free(r->q);
    free(r->seqs);
    free(r->plp);
    free(r->plp_top);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Sequences the request generates: n, or best_of when larger. */
int dsq__req_n_total(const dsq_req_t *r)
{
    return r->sp.best_of > r->sp.n ? r->sp.best_of : r->sp.n;
}

dsq_req_t *dsq_req_create(const int32_t *prompt, int n_prompt,
                          const dsq_sampling_t *sp, dsq_req_notify_fn notify,
                          void *user, char *err, size_t err_len)
{
    dsq_req_t *r = NULL;
    if (!prompt || n_prompt <= 0 || !sp) {
        snprintf(err, err_len, "prompt must contain at least one token");
        return NULL;
    }
    if (sp->max_tokens < 0 || sp->n < 1 || sp->temperature < 0 ||
        !(sp->top_p > 0 && sp->top_p <= 1) || sp->min_p < 0 || sp->min_p > 1 ||
        sp->logprobs > MAX_TOP_LOGPROBS || sp->n_logit_bias < 0 || sp->n_stop < 0 ||
        sp->n_stop_token_ids < 0 || sp->repetition_penalty < 0 || sp->n_think_start < 0 ||
        sp->n_think_end < 0 || (sp->has_think_budget && sp->think_budget < 0) ||
        sp->best_of < 0 || sp->best_of > MAX_BEST_OF) {
        snprintf(err, err_len, "invalid sampling parameters");
        return NULL;
    }
    r = calloc(1, sizeof(*r));
    if (!r)
        goto oom;
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancelled, false);
    atomic_init(&r->submitted, false);
    pthread_mutex_init(&r->mu, NULL);
    r->id = atomic_fetch_add(&next_req_id, 1);
    r->sp = *sp;
    dsq_grammar_retain(r->sp.grammar);
    r->notify = notify;
    r->user = user;
    r->prompt = malloc((size_t)n_prompt * sizeof(*r->prompt));
    if (!r->prompt)
        goto oom;
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof(*prompt));
    r->n_prompt = n_prompt;
    if (sp->n_logit_bias > 0) {
        r->bias_ids = malloc((size_t)sp->n_logit_bias * sizeof(*r->bias_ids));
        r->bias = malloc((size_t)sp->n_logit_bias * sizeof(*r->bias));
        if (!r->bias_ids || !r->bias)
            goto oom;
        memcpy(r->bias_ids, sp->logit_bias_ids, (size_t)sp->n_logit_bias * sizeof(int32_t));
        memcpy(r->bias, sp->logit_bias, (size_t)sp->n_logit_bias * sizeof(float));
    }
    r->sp.logit_bias_ids = r->bias_ids;
    r->sp.logit_bias = r->bias;
    if (sp->n_stop_token_ids > 0) {
        r->stop_ids = malloc((size_t)sp->n_stop_token_ids * sizeof(*r->stop_ids));
        if (!r->stop_ids)
            goto oom;
        memcpy(r->stop_ids, sp->stop_token_ids, (size_t)sp->n_stop_token_ids * sizeof(int32_t));
    }
    r->sp.stop_token_ids = r->stop_ids;
    if (sp->n_think_start + sp->n_think_end > 0) {
        size_t n = (size_t)sp->n_think_start + (size_t)sp->n_think_end;
        if (!(r->think_ids = malloc(n * sizeof(*r->think_ids))))
            goto oom;
        if (sp->n_think_start)
            memcpy(r->think_ids, sp->think_start, (size_t)sp->n_think_start * sizeof(int32_t));
        if (sp->n_think_end)
            memcpy(r->think_ids + sp->n_think_start, sp->think_end,
                   (size_t)sp->n_think_end * sizeof(int32_t));
    }
    r->sp.think_start = r->think_ids;
    r->sp.think_end = r->think_ids ? r->think_ids + sp->n_think_start : NULL;
    if (sp->n_stop > 0) {
        r->stop = calloc((size_t)sp->n_stop, sizeof(*r->stop));
        if (!r->stop)
            goto oom;
        for (int i = 0; i < sp->n_stop; i++) {
            r->stop[i] = strdup(sp->stop[i] ? sp->stop[i] : "");
            if (!r->stop[i])
                goto oom;
            size_t l = strlen(r->stop[i]);
            if (l > r->max_stop_len)
                r->max_stop_len = l;
        }
    }
    r->sp.stop = (const char *const *)r->stop;
    r->seqs = calloc((size_t)dsq__req_n_total(r), sizeof(*r->seqs));
    if (!r->seqs)
        goto oom;
    if (sp->prompt_logprobs && n_prompt > 1) {
        int k = sp->logprobs > 0 ? sp->logprobs : 0;
        r->plp = malloc((size_t)(n_prompt - 1) * sizeof(*r->plp));
        if (!r->plp)
            goto oom;
        if (k > 0 && !(r->plp_top = malloc((size_t)(n_prompt - 1) * (size_t)k *
                                           sizeof(*r->plp_top))))
            goto oom;
    }
    return r;
oom:
    snprintf(err, err_len, "out of memory");
    if (r)
        req_free(r);
    return NULL;
}

void dsq_req_ref(dsq_req_t *r)
{
    atomic_fetch_add(&r->refs, 1);
}

void dsq_req_unref(dsq_req_t *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1)
        req_free(r);
}

uint64_t dsq_req_id(const dsq_req_t *r) { return r->id; }

void dsq_req_timeline(dsq_req_t *r, dsq_req_timeline_t *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->tl;
    pthread_mutex_unlock(&r->mu);
}

/* Bytes an event holds (its struct, text and per-token arrays),
 * the measure of a request's undelivered output. */
static int64_t event_bytes(const dsq_output_t *o)
{
    int64_t n = (int64_t)sizeof(*o) + (int64_t)o->text_len;
    n += (int64_t)o->n_tokens * (int64_t)(sizeof(int32_t) + sizeof(size_t) +
                                          (o->logprobs ? sizeof(float) : 0) +
                                          (o->top ? (size_t)o->n_top * sizeof(dsq_top_logprob_t) : 0));
    n += (int64_t)o->n_prompt_logprobs * (int64_t)(sizeof(float) +
         (o->prompt_top ? (size_t)o->n_top * sizeof(dsq_top_logprob_t) : 0));
    return n;
}

int dsq_req_next(dsq_req_t *r, dsq_output_t *out)
{
    int rc;
    bool wake = false;
    pthread_mutex_lock(&r->mu);
    if (r->q_n > 0) {
        *out = r->q[r->q_head];
        r->q_bytes -= event_bytes(out);
        /* the reader caught up: let the engine schedule it */
        wake = atomic_load(&r->held) && r->eng;
        memset(&r->q[r->q_head], 0, sizeof(r->q[0]));
        r->q_head = (r->q_head + 1) % r->q_cap;
        r->q_n--;
        if (out->finish != DSQ_FINISH_NONE)
            r->n_final_popped++;
        rc = 1;
    } else if (r->n_final_popped >= r->sp.n) {
        rc = -1;
    } else {
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    if (wake)
        dsq__wake_engine(r->eng);
    return rc;
}

/* Queue an event (takes ownership of ev's arrays). */
int dsq__req_push(dsq_req_t *r, dsq_output_t *ev)
{
    int rc = DSQ_OK;
    pthread_mutex_lock(&r->mu);
    if (r->q_n == r->q_cap) {
        int cap = r->q_cap ? r->q_cap * 2 : 8;
        dsq_output_t *q = malloc((size_t)cap * sizeof(*q));
        if (!q) {
            rc = DSQ_ENOMEM;
            goto out;
        }
        for (int i = 0; i < r->q_n; i++)
            q[i] = r->q[(r->q_head + i) % r->q_cap];
        free(r->q);
        r->q = q;
        r->q_head = 0;
        r->q_cap = cap;
    }
    r->q[(r->q_head + r->q_n) % r->q_cap] = *ev;
    r->q_n++;
    r->q_bytes += event_bytes(ev);
    if (ev->finish != DSQ_FINISH_NONE)
        r->n_final_pushed++;
    memset(ev, 0, sizeof(*ev));
out:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

bool dsq_req_held(dsq_req_t *r)
{
    return atomic_load(&r->adm_held);
}

int dsq_req_refusal(dsq_req_t *r, char *buf, size_t len)
{
    pthread_mutex_lock(&r->mu);
    int retry = r->retry_after_s;
    if (buf && len)
        snprintf(buf, len, "%s", r->refusal);
    pthread_mutex_unlock(&r->mu);
    return retry;
}

/* Shared by the engine tests (test_engine.c, _prefix.c, _spec.c): the
 * SmolLM2 engine they open, a condition-variable waiter that a request's
 * notify callback signals, a blocking "next event" on top of
 * dsq_req_next (engine/serve/engine.h), which itself never blocks, and a wait
 * for an idle engine. Header-only
 * (static inline); include after <cmocka.h>. */
#ifndef DSQ_TEST_ENGINE_TEST_H
#define DSQ_TEST_ENGINE_TEST_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/serve/engine.h"
#include "engine/text/tokenizer.h"

/* Counts notify calls; initialise with WAITER_INIT. */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int signals;
} waiter_t;

#define WAITER_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}

/* dsq_req_create's notify callback; user is the waiter_t. */
static inline void notify(dsq_req_t *r, void *user)
{
    (void)r;
    waiter_t *w = user;
    pthread_mutex_lock(&w->mu);
    w->signals++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Next event of r into *ev, waiting on w (the waiter r was created with)
 * while none is ready. Returns dsq_req_next's result: > 0 an event, < 0
 * the request has finished (no more events); never 0. */
static inline int wait_next(waiter_t *w, dsq_req_t *r, dsq_output_t *ev)
{
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int seen = w->signals;
        pthread_mutex_unlock(&w->mu);
        int got = dsq_req_next(r, ev);
        if (got != 0)
            return got;
        pthread_mutex_lock(&w->mu);
        while (w->signals == seen)
            pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
    }
}

/* Creates a request for prompt ids[0..n) with sampling *sp, notifying w,
 * and submits it to e; fails the test if either step fails. The caller
 * keeps ids and drops the returned reference with dsq_req_unref. */
static inline dsq_req_t *req_submit_ids(dsq_engine_t *e, waiter_t *w, const int32_t *ids,
                                        int n, const dsq_sampling_t *sp)
{
    char err[256];
    dsq_req_t *r = dsq_req_create(ids, n, sp, notify, w, err, sizeof(err));
    if (!r)
        fail_msg("dsq_req_create: %s", err);
    assert_int_equal(dsq_engine_submit(e, r), DSQ_OK);
    return r;
}

/* req_submit_ids on text encoded by e's tokenizer (special tokens parsed). */
static inline dsq_req_t *req_submit_text(dsq_engine_t *e, waiter_t *w, const char *text,
                                         const dsq_sampling_t *sp)
{
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(dsq_tokenizer_encode(dsq_engine_tokenizer(e), text, strlen(text),
                                          DSQ_TOK_PARSE_SPECIAL, &ids, &n), 0);
    dsq_req_t *r = req_submit_ids(e, w, ids, (int)n, sp);
    free(ids);
    return r;
}

/* Wait (up to 4 s) until e runs and queues nothing and holds no KV
 * block; fails the test saying what is left otherwise. */
static inline void wait_engine_idle(dsq_engine_t *e)
{
    dsq_engine_stats_t st;
    for (int i = 0; i < 4000; i++) {
        dsq_engine_stats(e, &st);
        if (st.n_running == 0 && st.n_waiting == 0 && st.kv_blocks_used == 0)
            return;
        usleep(1000);
    }
    fail_msg("engine did not become idle: running=%d waiting=%d blocks_used=%lld", st.n_running,
             st.n_waiting, (long long)st.kv_blocks_used);
}

/* Every prompt ids p[i][0..len) of n_p submitted at once with sampling
 * *sp (one batch); each request's first n_out token ids into
 * out[i * n_out ..], asserting it made n_out. */
static inline void run_prompt_ids(dsq_engine_t *e, waiter_t *w, const int32_t *p, int len,
                                  int n_p, const dsq_sampling_t *sp, int32_t *out, int n_out)
{
    dsq_req_t *rs[16];
    assert_true(n_p <= 16);
    for (int i = 0; i < n_p; i++)
        rs[i] = req_submit_ids(e, w, p + (size_t)i * len, len, sp);
    for (int i = 0; i < n_p; i++) {
        dsq_output_t ev;
        int n = 0;
        while (wait_next(w, rs[i], &ev) > 0) {
            for (int t = 0; t < ev.n_tokens && n < n_out; t++)
                out[(size_t)i * n_out + n++] = ev.tokens[t];
            dsq_output_free(&ev);
        }
        assert_int_equal(n, n_out);
        dsq_req_unref(rs[i]);
    }
}

/* total requests, at_once at a time: request k is texts[k % n_texts] with
 * sampling sp_of(k); every third (k % 3 == 0) is cancelled after its first
 * event. Returns when all have ended. */
static inline void run_with_cancels(dsq_engine_t *e, waiter_t *w, int total, const char *const *texts,
                                    int n_texts, dsq_sampling_t (*sp_of)(int))
{
    enum { AT_ONCE = 8 };
    int done = 0, next = 0;
    dsq_req_t *live[AT_ONCE] = {0};
    int id[AT_ONCE];
    while (done < total) {
        for (int s = 0; s < AT_ONCE && next < total; s++) {
            if (live[s])
                continue;
            dsq_sampling_t sp = sp_of(next);
            live[s] = req_submit_text(e, w, texts[next % n_texts], &sp);
            id[s] = next++;
        }
        for (int s = 0; s < AT_ONCE; s++) {
            if (!live[s])
                continue;
            dsq_output_t ev;
            if (wait_next(w, live[s], &ev) > 0) {
                if (id[s] % 3 == 0)
                    dsq_engine_cancel(e, live[s]);
                dsq_output_free(&ev);
                continue;
            }
            dsq_req_unref(live[s]);
            live[s] = NULL;
            done++;
        }
    }
}

/* Engine on $DSQ_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf with the other
 * options of *o (o->model_path is set here, to a static buffer). Fails the
 * test naming the file when it is missing, or with the engine's reason when
 * dsq_engine_create refuses; the caller destroys the engine. */
static inline dsq_engine_t *smollm2_engine(dsq_engine_opts_t *o)
{
    static char model_path[1024];
    const char *dir = getenv("DSQ_MODELS_DIR");
    snprintf(model_path, sizeof(model_path), "%s/SmolLM2-135M-Instruct.Q4_1.gguf",
             dir ? dir : "models");
    if (access(model_path, R_OK) != 0)
        fail_msg("required test model missing: %s", model_path);
    o->model_path = model_path;
    char err[512];
    dsq_engine_t *e = dsq_engine_create(o, err, sizeof(err));
    if (!e)
        fail_msg("engine: %s", err);
    return e;
}

#endif

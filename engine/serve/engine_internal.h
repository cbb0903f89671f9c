/* What the engine's files share, and nothing else: the request, choice
 * and engine structs and the dsq__ helpers one of them calls in another.
 * Not an API (engine.h is); included only from engine/serve/. The files:
 *
 *   engine.c           the engine thread: its libuv loop and the step
 *   engine_setup.c     create (device, memory plan, model, KV cache,
 *                      scheduler), dsq_engine_plan, destroy
 *   submit.c           dsq_engine_submit/_cancel and admission into the
 *                      scheduler
 *   request.c          the request handle and its output queue
 *   choice.c           one choice: sampling, fork, text and stop hold-back
 *   mask_worker.c      the thread that makes grammar masks during a step
 *   prompt_logprobs.c  prompt-token logprobs
 *   speculate.c        speculative decoding: drafts proposed before a
 *                      step, verified after it
 *
 * Threads: what dsq_req_create and dsq_engine_create set is read-only
 * afterwards, for any thread; what dsq_engine_submit sets before it
 * queues a request is handed over with it, once. Past that the engine
 * thread owns every field not marked otherwise; a field another thread
 * touches is atomic or names the mutex that guards it. A request is
 * reference-counted.
 */
#ifndef DSQ_ENGINE_INTERNAL_H
#define DSQ_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/text/detok.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"
#include "admission.h"
#include "draft.h"
#include "engine.h"
#include "padding.h"
#include "sampler.h"
#include "scheduler.h"
#include "step_cost.h"

#define MAX_TOP_LOGPROBS 20

/* dsq_engine_opts_t.spec_max_batch's default */
#define DSQ__SPEC_MAX_BATCH 4

/* Engine-side state of one choice. Engine thread only. */
typedef struct eseq {
    dsq_seq_t seq;                 /* scheduler view (must be first)          */
    dsq_req_t *req;
    dsq_detok_t *detok;
    dsq_grammar_matcher_t *gm;     /* sp.grammar's matcher, or NULL           */
    uint32_t *gmask;               /* the next mask, made by the mask worker
                                      during the forward pass                */
    int gmask_n;                   /* its fill_mask result (count or error)   */
    bool gmask_ready;              /* gmask holds the current state's mask    */
    dsq_rng_t rng;
    char *hold;                    /* decoded text not yet emitted            */
    size_t hold_len, hold_cap;
    size_t text_bytes;             /* bytes of text decoded so far            */
    int n_generated;
    double cum_logprob;            /* best_of ranking (raw logprobs)          */
    bool finished;
    int stop_matched;              /* 1 + the sp.stop index that ended it, 0 */
    int think_state;               /* THINK_* (choice.c)                      */
    int think_n;                   /* tokens written inside the section       */
    int think_force;               /* next think_end index to force, -1: none */
    uint64_t uid;                  /* unique in the engine's life (draft.h key) */
    int32_t mtp_tok;               /* the MTP module's draft, valid while the  */
    int mtp_at;                    /* choice has mtp_at tokens (0: none)       */
    double spec_acc, spec_seen;    /* speculation: drafts accepted / checked,
                                      decayed (speculate.c's draft length)   */
    int step_prefill;              /* timeline: prompt tokens of this step   */
    int step_pos;                  /* timeline: their first position          */
    bool step_decode;              /* timeline: a decode row in this step     */
    /* pending output event */
    dsq_output_t ev;
    int ev_cap;
    char *ev_text;
    size_t ev_text_len, ev_text_cap;
} eseq_t;

struct dsq_req {
    atomic_int refs;
    uint64_t id;
    int32_t *prompt;
    int n_prompt;
    dsq_sampling_t sp;             /* arrays point at owned copies below      */
    int32_t *bias_ids, *stop_ids;
    int32_t *think_ids;            /* think_start then think_end (sp points in) */
    float *bias;
    char **stop;
    size_t max_stop_len;
    dsq_req_notify_fn notify;
    void *user;
    atomic_bool cancelled;
    atomic_bool submitted;

    pthread_mutex_t mu;            /* guards the output queue below           */
    dsq_output_t *q;
    int q_head, q_n, q_cap;
    int64_t q_bytes;               /* memory the queued events hold           */
    atomic_bool held;              /* not scheduled: output unread            */
    struct dsq_engine *eng;        /* set at submit, for wake-ups             */
    int n_final_pushed;            /* choices whose final event was queued    */
    int n_final_popped;

    /* prompt logprobs (sp.prompt_logprobs), engine thread only:
     * entry i = prompt token i + 1; plp_n entries computed so far */
    float *plp;
    dsq_top_logprob_t *plp_top;
    int plp_n;
    bool plp_sent;
    bool scored;                   /* max_tokens 0 ended every choice
                                      after the prompt (finish "length") */

    /* engine thread only */
    eseq_t **seqs;
    int n_seqs;                    /* created so far (1 until the fork)       */
    int n_live;
    bool forked;
    bool counted_waiting;
    bool queue_reported;           /* queue_us sent on the first event        */
    bool queue_timeout;            /* expired in the queue                    */
    double t_held;                 /* when it was last held back              */
    double t_sched;                /* first time any choice was scheduled     */
    struct dsq_req *next_active, *prev_active;
    double t_arrival, t_first_token;
    /* admission policy (admission.h) */
    bool admitted;                 /* engine thread: entered the scheduler    */
    atomic_bool adm_held;          /* adaptive: submitted and not yet admitted
                                      (stays set when it ends unadmitted: its
                                      final events tell that)               */
    int64_t need_tokens;           /* the most KV it can take, whole blocks
                                      (kv_need_tokens, at submit)          */
    char refusal[200];             /* under mu: the policy's reason, or ""    */
    int retry_after_s;             /* under mu: > 0 with refusal              */
    /* under mu (dsq_req_timeline reads it from any thread) */
    dsq_req_timeline_t tl;
    uint64_t tl_step;              /* engine thread: last step counted        */
};

struct dsq_engine {
    dsq_engine_opts_t o;
    dsq_backend_t *be;             /* where the model runs                    */
    bool be_owned;                 /* created here (CUDA), destroyed last     */
    int max_model_len;
    dsq_model_file_t *file;
    dsq_model_t *model;
    dsq_kv_cache_t *kv;
    dsq_draft_t *draft;            /* speculation's draft model, or NULL       */
    dsq_kv_dtype_t draft_kvt;      /* its KV element type, set by the plan     */
    struct {                       /* spec_mtp: one MTP pass's batch           */
        int32_t *tokens, *pos, *row_seq, *slot, *lrows;
        eseq_t **lseq;             /* whose draft each logit row makes         */
        float *h, *logits;
        int cap, lcap;
    } mtp;
    uint64_t next_uid;             /* engine thread: eseq_t.uid                */
    dsq_sched_t *sched;
    dsq_sampler_t *sampler;
    const dsq_tokenizer_t *tok;
    int n_vocab;
    dsq_grammar_vocab_t *gvocab;   /* made at the first grammar request       */
    uint32_t *gmask;               /* [(max(n_vocab, gvocab's) + 31) / 32]     */
    uint32_t *tmask;               /* [(n_vocab + 31) / 32]: a forced token    */
    /* The mask worker (mask_worker.c). While the engine thread runs a
     * step's forward pass, this thread fills the masks of the step's
     * constrained sequences (their matchers are not touched by the engine
     * thread until the pass returns and the worker is done). Started at
     * the first constrained step. */
    struct {
        pthread_t thread;
        pthread_mutex_t mu;
        pthread_cond_t cv;
        eseq_t **jobs;
        int n_jobs, cap;
        bool pending;              /* under mu: jobs posted, not all done     */
        bool quit;                 /* under mu                                */
        bool started;              /* engine thread                           */
    } mw;
    float *logits;
    int logits_cap;
    uint8_t *seq_dec;              /* [seq_dec_cap]: the step's decoding
                                      sequences (dsq_batch_t.seq_decode)  */
    int seq_dec_cap;
    float *logits_fork;
    /* prompt-logprob rows appended to the scheduler's logit rows */
    int32_t *lrows, *xpos;
    eseq_t **xseq;
    int lrows_cap;

    pthread_t thread;
    uv_loop_t loop;
    uv_async_t async;
    uv_idle_t idle;
    bool idle_on;
    uv_timer_t heartbeat;          /* watchdog heartbeat, see engine.h        */
    int n_held;                    /* requests held (hold_unread)             */
    dsq_step_cost_fit_t step_fit;  /* measured step cost model                */
    bool held_idle;                /* the last step had only those            */
    /* admission window (engine.h admission_window_ms) */
    uv_timer_t burst;
    double t_last_submit;          /* under mu                                */
    double t_last_step;            /* engine thread: end of the last step     */
    double t_burst;                /* engine thread: first wait of this burst */
    int window_ms;                 /* quiet time; <= 0: off                   */
    int wedge_ms;                  /* DSQ_TEST_WEDGE_ENGINE_MS, debug builds  */
    int fail_choice;               /* DSQ_TEST_FAIL_SAMPLE_CHOICE + 1, debug:
                                    * that choice's first sample fails once   */

    pthread_mutex_t mu;            /* guards submit queue and stats           */
    dsq_req_t **subq;
    int subq_n, subq_cap;
    bool stopping;
    atomic_int n_waiting;          /* submitted, not yet scheduled            */
    atomic_int n_free_slots;       /* run slots free at the last step's end
                                      (dsq_sched_n_free_slots): that many of
                                      the n_waiting do not count as waiting */
    dsq_engine_stats_t stats;

    dsq_req_t *active;             /* engine thread: list of live requests    */
    uint64_t next_order;
    uint64_t n_steps;              /* engine steps run (timeline)             */
    /* admission (admission.h) */
    dsq_admission_t *adm;
    dsq_req_t **pend;              /* engine thread: held back, oldest first  */
    int pend_n, pend_cap;
    atomic_int n_inflight;         /* admitted to the scheduler, not ended    */
    atomic_int n_pending;          /* adaptive: submitted, not yet admitted   */
    atomic_llong reserved_tokens;  /* need_tokens of the in-flight ones       */
    int64_t kv_tokens;             /* KV capacity in tokens                   */
    dsq_pad_model_t *pad_model;    /* NULL when none; informational on CPU    */
};

/* ------------------------------------------------------------ request.c */

/* Sequences r generates: sp.n, or sp.best_of when larger. */
int dsq__req_n_total(const dsq_req_t *r);

/* Queue ev on r's output queue under r->mu, taking ownership of its
 * arrays (*ev is zeroed). Returns 0, or DSQ_ENOMEM with nothing queued and
 * *ev as it was. Engine thread. */
int dsq__req_push(dsq_req_t *r, dsq_output_t *ev);

/* ------------------------------------------------------------ choice.c */

/* Choice `index` of r (0: made at admission; 1..: forked after the
 * prompt) with its detokenizer and, when r has a grammar, its matcher.
 * NULL when out of memory. Engine thread. */
eseq_t *dsq__eseq_create(dsq_engine_t *e, dsq_req_t *r, int index);
void dsq__eseq_destroy(eseq_t *s);   /* NULL is a no-op */

/* Append token t to q's tokens, growing the array. 0 or DSQ_ENOMEM. */
int dsq__seq_append(dsq_seq_t *q, int32_t t);

/* Hand s's pending event (if it holds anything) to its request's queue,
 * with what only the first or the final event carries. Engine thread. */
void dsq__flush_event(eseq_t *s);

/* End choice s with finish reason `why` (a no-op when it has ended):
 * flush its held-back text unless why is ABORT or drop_tail (a stop
 * string was found), take it out of the scheduler, count it on the
 * request. Its final event goes out with the next publish. */
void dsq__finish_seq(dsq_engine_t *e, eseq_t *s, dsq_finish_t why, bool drop_tail);

/* n > 1 or best_of: fork r's first choice into the others once its
 * prompt is computed (they share its KV blocks). 0 or a DSQ_E*. */
int dsq__fork_choices(dsq_engine_t *e, dsq_req_t *r);

/* Sample choice s's next token from one logits row ([n_vocab] fp32, read,
 * not changed) and accept it. A choice that cannot go on (grammar dead
 * end, non-finite logits) is finished and 0 returned; a DSQ_E* fails the
 * step. */
int dsq__sample_seq(dsq_engine_t *e, eseq_t *s, const float *row);

/* ------------------------------------------------------------ mask_worker.c */

/* uint32 words of one grammar mask; e->gvocab must exist. */
size_t dsq__mask_words(const dsq_engine_t *e);

/* Before the forward pass: post the masks of out's constrained choices
 * to the mask worker (started at the first use). Returns true when jobs
 * were posted; dsq__mask_worker_wait must then follow the pass. */
bool dsq__mask_worker_post(dsq_engine_t *e, const dsq_sched_out_t *out);
void dsq__mask_worker_wait(dsq_engine_t *e);
/* Join the worker (if it was started). dsq_engine_destroy, after the
 * engine thread ended. */
void dsq__mask_worker_stop(dsq_engine_t *e);

/* ------------------------------------------------------------ prompt_logprobs.c */

/* Append to e->lrows, after out's n_logits rows, the rows of this step
 * that score prompt tokens (*n_x of them; e->xpos and e->xseq say whose).
 * 0 or DSQ_ENOMEM. */
int dsq__plp_collect(dsq_engine_t *e, const dsq_sched_out_t *out, int *n_x);
/* Score prompt token pos + 1 of s's request from the logits row at pos
 * ([n_vocab] fp32). */
void dsq__plp_store(dsq_engine_t *e, eseq_t *s, int pos, const float *row);

/* ------------------------------------------------------------ speculate.c */

/* Before the step is planned (speculative decoding on): give each running
 * decoding choice its drafts (dsq_seq_t.n_draft), unless more than
 * spec_max_batch choices decode. */
void dsq__spec_propose(dsq_engine_t *e);
/* After dsq_sched_commit, for choice s scheduled with n_rows - 1 drafts:
 * sample row i ([n_rows][n_vocab] fp32) and go on to row i + 1 while the
 * token sampled equals draft i; then give the scheduler back what was not
 * kept (dsq_sched_accept_drafts) and count it. 0 or a DSQ_E* (fails the
 * step, as dsq__sample_seq). */
int dsq__spec_verify(dsq_engine_t *e, eseq_t *s, const float *rows, int n_rows);
/* spec_mtp, after the step's sampling: run the MTP module over every row
 * of out whose position its choice has now computed (so the module's KV
 * follows the model's), and keep each decoding choice's next draft
 * (eseq_t.mtp_tok). A failure costs drafts, not the step: logged. */
void dsq__spec_mtp(dsq_engine_t *e, const dsq_sched_out_t *out);

/* ------------------------------------------------------------ submit.c */

/* End r, which never entered the scheduler (refused by the policy, or
 * cancelled or shut down while held back): the next publish sends its
 * final events. */
void dsq__end_unadmitted(dsq_engine_t *e, dsq_req_t *r, bool refused);

/* Take the submit queue and admit (or, adaptive policy, hold back) each
 * request in it. Engine thread. */
void dsq__admit_new(dsq_engine_t *e);

/* ------------------------------------------------------------ engine.c */

/* Put r on e's list of live requests (which publish walks). */
void dsq__active_add(dsq_engine_t *e, dsq_req_t *r);

/* Refresh e->stats from the scheduler and the KV cache, under e->mu. */
void dsq__update_stats(dsq_engine_t *e);

/* Wake the engine loop (uv_async_send). Any thread. */
void dsq__wake_engine(dsq_engine_t *e);

/* Start the engine thread (engine_setup.c's last step of
 * dsq_engine_create). Returns 0, or a DSQ_E* with the reason in err and
 * no loop left to close. */
int dsq__engine_start_thread(dsq_engine_t *e, const dsq_engine_opts_t *opts, char *err,
                             size_t err_len);

#endif

/* Iteration-level (continuous) batching scheduler (Yu et al., Orca, OSDI
 * 2022; vLLM's block-based admission, Kwon et al. 2023).
 *
 * Each step: keep every running sequence (decodes and unfinished prefill
 * chunks, oldest first), then admit waiting sequences first come, first
 * served, chunking long prompts (chunked prefill), until
 * max_num_batched_tokens, max_num_seqs or the free-block budget is reached.
 * When blocks run out, the most recently admitted sequence is preempted by
 * recompute: its blocks are freed and it goes back to the front of the
 * waiting queue with its tokens (prompt + generated so far). Admission stops
 * at the first waiting sequence that does not fit, so the oldest waiting one
 * is never overtaken (no starvation).
 *
 * Engine-thread only; not thread-safe.
 */
#ifndef DSQ_SCHEDULER_H
#define DSQ_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "kv_cache.h"

typedef enum dsq_seq_state {
    DSQ_SEQ_WAITING = 0,
    DSQ_SEQ_RUNNING,
    DSQ_SEQ_DETACHED,     /* not owned by the scheduler */
} dsq_seq_state_t;

/* One sequence: a request's choice. Owned by the engine; the scheduler holds
 * pointers while the sequence is waiting or running. */
typedef struct dsq_seq {
    void *owner;              /* the request (opaque to the scheduler)          */
    int index;                /* choice index                                   */
    uint64_t order;           /* arrival order; lower = older                   */
    int32_t *tokens;          /* prompt followed by generated tokens            */
    int n_tokens, cap_tokens;
    int n_prompt;
    int n_computed;           /* tokens whose KV is in the cache                */
    dsq_block_table_t bt;
    dsq_seq_state_t state;
    int n_preempted;
    int sched_tokens;         /* tokens scheduled in the current step           */
    int sched_row;            /* first batch row of this sequence in the step   */
} dsq_seq_t;

typedef struct dsq_sched dsq_sched_t;

/* Limits of one step. */
typedef struct dsq_sched_opts {
    int max_num_seqs;             /* running sequences                      */
    int max_num_batched_tokens;   /* tokens per step                        */
} dsq_sched_opts_t;

/* The plan of one step: the scheduled sequences and the ragged batch. All
 * arrays are owned by the scheduler and valid until the next step. */
typedef struct dsq_sched_out {
    int n_seqs;
    dsq_seq_t **seqs;             /* [n_seqs]                                */
    int n_tokens;
    int32_t *tokens, *pos, *row_seq, *slot;   /* [n_tokens]                  */
    int32_t *block_tables;        /* [n_seqs][max_blocks]                    */
    int max_blocks;
    int n_logits;
    int32_t *logit_rows;          /* rows whose sequence is fully computed   */
    dsq_seq_t **logit_seqs;       /* [n_logits] the sequence of each row     */
    int n_preempted;              /* preemptions in this step                */
} dsq_sched_out_t;

dsq_sched_t *dsq_sched_create(dsq_kv_cache_t *kv, const dsq_sched_opts_t *o);
void dsq_sched_destroy(dsq_sched_t *s);    /* does not free sequences */

/* Append seq to the waiting queue (tail). Returns 0 or DSQ_ENOMEM. */
int dsq_sched_add(dsq_sched_t *s, dsq_seq_t *seq);
/* Add a sequence that already holds KV (a fork) directly to the running
 * set. Returns 0 or DSQ_ENOMEM. */
int dsq_sched_add_running(dsq_sched_t *s, dsq_seq_t *seq);
/* Remove seq from whichever queue holds it and free its KV blocks. */
void dsq_sched_remove(dsq_sched_t *s, dsq_seq_t *seq);

/* Plan the next step. Returns 0 (out->n_tokens may be 0 when nothing can
 * run) or DSQ_ENOMEM. */
int dsq_sched_step(dsq_sched_t *s, dsq_sched_out_t *out);
/* After the forward pass: mark the scheduled tokens as computed. */
void dsq_sched_commit(dsq_sched_t *s, const dsq_sched_out_t *out);

int dsq_sched_n_waiting(const dsq_sched_t *s);
int dsq_sched_n_running(const dsq_sched_t *s);
int64_t dsq_sched_n_preemptions(const dsq_sched_t *s);
/* Check KV invariants against the tables of all queued sequences (plus
 * extra tables the caller holds). */
bool dsq_sched_check(const dsq_sched_t *s);

#endif

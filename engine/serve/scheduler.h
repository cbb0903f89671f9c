/* Iteration-level (continuous) batching scheduler (Yu et al., Orca, OSDI
 * 2022; vLLM's block-based admission, Kwon et al. 2023), sharing each step
 * fairly between requests.
 *
 * A sequence is running (it holds one of max_num_seqs slots and its KV
 * blocks) or waiting. Each step plans, in this order:
 *
 *  1. Slots. Running sequences that are not paused hold a slot each, the n
 *     / best_of choices of a request included: a fork (dsq_sched_add_fork)
 *     waits for a slot like any sequence, so max_num_seqs bounds the
 *     sequences of a step, always (vLLM V1 runs the n samples of a
 *     request as n sequences scheduled on their own, the same rule). Free
 *     slots go to waiting sequences round-robin across requests (req):
 *     a request with fewer running sequences first, so a new request
 *     overtakes the waiting forks of one that already runs; among equals
 *     the oldest (a new request never overtakes an older new one: FCFS).
 *  2. Decode rows, round-robin across requests: every request's least
 *     recently scheduled sequence first, then every request's second, and
 *     so on, until max_num_batched_tokens, the step's sequences or, with a
 *     step budget (dsq_sched_set_step_budget), the decode rows' share of
 *     it is used up. A request of 128 sequences therefore takes turns
 *     instead of making every step long, and a request of one sequence
 *     decodes in every step.
 *  3. Prefill chunks (chunked prefill) of running prompts and of newly
 *     admitted ones share the step's prefill tokens (and, with a step
 *     budget, its time) max-min fairly: the oldest first gets an equal
 *     share (so it always moves), then the others from the shortest: a
 *     prompt that needs less than an equal share gets all it needs, the
 *     rest is split evenly among the longer ones. One long prompt never
 *     holds a step while others wait, and a short prompt arriving behind
 *     long ones is computed in the next step.
 *
 * When blocks run out, a running sequence not yet scheduled in the step is
 * preempted by recompute (its blocks are freed and it goes back to the
 * waiting queue, in age order, with its tokens: prompt + generated so
 * far): the youngest of the request with the most running sequences (with
 * one sequence per request, the youngest, as vLLM). Nothing is admitted
 * in a step that preempted (it would only thrash), and a waiting sequence
 * that does not fit the free blocks stops admission for the step, so an
 * older waiting request is never overtaken for memory (no starvation).
 *
 * Latency (both optional, see dsq_sched_opts_t): while any running sequence
 * decodes, the step's prefill tokens are capped separately
 * (max_prefill_tokens_with_decode), and admission of new prompts waits
 * while every running sequence is a decode within admission_defer_steps
 * of its end.
 *
 * Speculative decoding: a decoding sequence may carry drafts (n_draft
 * proposed tokens after its pending one). Its decode rows are then the
 * pending token and the drafts, each with logits, within the same limits
 * as other rows: drafts that do not fit the step's tokens or the decode
 * rows' time are dropped from the tail, and a sequence not scheduled or
 * preempted in the step loses them all (the engine proposes again).
 *
 * Prefix caching (when the KV cache has it on, see kv_cache.h): a waiting
 * sequence that holds no blocks (new, or preempted) is admitted with the
 * longest chain of cached full blocks matching its tokens, at most
 * (n_tokens - 1) / block_size blocks so the last token is always computed
 * (its logits are needed); those tokens count as computed and only the rest
 * is prefilled. Blocks are cached as they fill (dsq_sched_commit), during
 * prefill and decode. Evictable cached blocks count as free in the block
 * budget, except the ones the admitted sequence itself reuses.
 *
 * Engine-thread only; not thread-safe.
 */
#ifndef DSQ_SCHEDULER_H
#define DSQ_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kv/kv_cache.h"
#include "step_cost.h"

typedef enum dsq_seq_state {
    DSQ_SEQ_WAITING = 0,
    DSQ_SEQ_RUNNING,
    DSQ_SEQ_DETACHED,     /* not owned by the scheduler */
} dsq_seq_state_t;

/* One sequence: a request's choice. Owned by the engine; the scheduler holds
 * pointers while the sequence is waiting or running. */
typedef struct dsq_seq {
    void *owner;              /* the engine's handle (opaque to the scheduler)  */
    const void *req;          /* the request it belongs to, the unit of the
                                 fair share (its choices share one key;
                                 opaque); NULL: owner is the request        */
    int index;                /* choice index                                   */
    uint64_t order;           /* arrival order; lower = older                   */
    int32_t *tokens;          /* prompt followed by generated tokens            */
    int n_tokens, cap_tokens;
    int n_prompt;
    int n_computed;           /* tokens whose KV is in the cache                */
    dsq_block_table_t bt;
    dsq_seq_state_t state;
    int n_preempted;
    bool no_prefix_cache;     /* never reuse cached blocks for this sequence
                                 (prompt logprobs need every position's
                                 logits); its full blocks are still cached */
    int n_cached_prompt;      /* prompt tokens whose KV came from the prefix
                                 cache at the first admission (0 when off);
                                 a multiple of block_size, < n_prompt       */
    int n_max_tokens;         /* itl: n_tokens at which the sequence ends at the
                                 latest (prompt + max_tokens); 0 = unknown  */
    bool prompt_logits;       /* attack2: every prompt position needs its
                                 logits (prompt logprobs): its prompt chunks
                                 count against max_prompt_logit_rows      */
    bool paused;              /* hardening: held back by the engine (its client
                                 is not reading its output): never scheduled,
                                 keeps its KV blocks (it may still be
                                 preempted), still counts as running        */
    uint64_t last_sched;      /* scheduler: when it was last scheduled, as a
                                 count of sequences scheduled (round-robin
                                 turns: ties in one step keep their pick
                                 order); 0 = never                          */
    int n_draft;              /* speculative decoding: the last n_draft tokens
                                 are proposed, not sampled (the engine's
                                 proposer appends them before a step);
                                 scheduled with the pending token as one
                                 chunk whose every row gets logits, then
                                 taken back by dsq_sched_accept_drafts.
                                 0 outside that window                     */
    int sched_tokens;         /* tokens scheduled in the current step           */
    int sched_row;            /* first batch row of this sequence in the step   */
} dsq_seq_t;

typedef struct dsq_sched dsq_sched_t;

/* Limits of one step. */
typedef struct dsq_sched_opts {
    int max_num_seqs;             /* running sequences (slots), forks
                                     included; also the sequences of a step */
    int max_num_batched_tokens;   /* tokens per step                        */
    /* itl: prefill tokens per step (running chunks + admissions together)
     * while at least one running sequence decodes; decode rows are not
     * counted and always run. 0 or >= max_num_batched_tokens: no separate
     * cap. Bounds the inter-token latency of running streams by the time
     * of a (decodes + this many prefill tokens) step, at some cost in time
     * to first token when prompts queue behind running decodes. */
    int max_prefill_tokens_with_decode;
    /* itl: drain-aligned admission. When every running sequence is
     * decoding and each will end (n_max_tokens) within this many steps,
     * waiting sequences are not admitted until they have ended, so their
     * prefill runs in a step without decodes instead of stalling streams
     * that are about to finish. Costs the waiting ones at most this many
     * decode steps of time to first token; keeps closed-loop clients (a
     * new request right after each answer) in one wave instead of
     * splitting into groups that stall each other every request. 0: off. */
    int admission_defer_steps;
    /* attack2: prompt tokens per step of sequences with prompt_logits
     * (each one costs a logits row of n_vocab floats, so this bounds the
     * step's logits buffer: 2048 rows of a 100k vocabulary are 800 MB).
     * Other sequences still fill the rest of the step. 0: no cap. */
    int max_prompt_logit_rows;
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
/* Add a sequence that already holds KV (a fork of an n > 1 / best_of
 * request, sharing its parent's blocks) to the waiting queue in age order
 * (its order and index): it runs once the round-robin gives it a slot, so
 * forks never push the running set past max_num_seqs. Returns 0 or
 * DSQ_ENOMEM. */
int dsq_sched_add_fork(dsq_sched_t *s, dsq_seq_t *seq);
/* Remove seq from whichever queue holds it and free its KV blocks. */
void dsq_sched_remove(dsq_sched_t *s, dsq_seq_t *seq);

/* Plan the next step. Returns 0 (out->n_tokens may be 0 when nothing can
 * run) or DSQ_ENOMEM. */
int dsq_sched_step(dsq_sched_t *s, dsq_sched_out_t *out);
/* After the forward pass: mark the scheduled tokens as computed. A
 * sequence with drafts (n_draft > 0) advances by its pending token only;
 * its drafts wait for dsq_sched_accept_drafts. */
void dsq_sched_commit(dsq_sched_t *s, const dsq_sched_out_t *out);

/* Speculative decoding, after dsq_sched_commit, for a sequence scheduled
 * with drafts: the caller has removed the drafts from seq->tokens (n_tokens
 * -= n_draft, n_draft = 0) and appended what it sampled, of which the
 * first n_accepted equal the first n_accepted drafts (0 <= n_accepted <=
 * the drafts scheduled). Their KV, written by this step's draft rows, is
 * kept (n_computed += n_accepted, full blocks cached); the rows past them
 * are dropped by giving back the blocks beyond the ones n_tokens needs
 * (they hold nothing cached: only computed, accepted tokens are hashed).
 * seq must be running. */
void dsq_sched_accept_drafts(dsq_sched_t *s, dsq_seq_t *seq, int n_accepted);

/* Remove seq's drafts from its tokens (n_tokens -= n_draft). */
void dsq_sched_drop_drafts(dsq_seq_t *seq);

/* hardening: prefill tokens (prompt chunks and admissions together) per
 * step from now on, whether or not anything decodes; decode rows are not
 * counted. The engine sets it from its step budget (engine.h
 * step_budget_ms); it combines with max_prefill_tokens_with_decode (the
 * smaller applies). n_tokens <= 0 removes the cap. */
void dsq_sched_set_prefill_cap(dsq_sched_t *s, int n_tokens);

/* hardening: size every step's prefill by predicted time instead of
 * tokens. From now on a step's prefill chunks (running sequences' and
 * admissions') get what the cost model *cost (step_cost.h) predicts fits
 * in 90% of budget_ms after its fixed cost and the step's decode rows
 * (each decode row: token_ms + pair_ms * its position + 1), and never less
 * than a quarter of budget_ms, so prefill keeps moving when decodes alone
 * fill the budget. Where the budget is small for the model (8 predicted
 * one-row steps, fixed + one row, exceed it) or the decode rows alone
 * exceed it, prefill also gets at least what the step without it costs
 * (it at most doubles that step); there a step with no decode row has
 * its budget stretched to 8 one-row steps (so its prompt rows, not the
 * weight read, fill it), and decode rows get at least 7 one-row steps'
 * time: such a step can take ~16 one-row steps (a 6.7B model on 2
 * cores: ~2.5 s at 250 ms). A chunk's cost grows with its position
 * (attention pairs), so a long prompt's later chunks get fewer tokens. At
 * least two prompts share a step's prefill when two are ready and two
 * slots are free, and at least one prefill token per step moves whatever
 * the prediction (progress). Combines
 * with the token caps (max_prefill_tokens_with_decode,
 * dsq_sched_set_prefill_cap, max_num_batched_tokens: the smallest
 * applies). budget_ms <= 0 or cost NULL removes it. The model is copied. */
void dsq_sched_set_step_budget(dsq_sched_t *s, double budget_ms, const dsq_step_cost_t *cost);

int dsq_sched_n_waiting(const dsq_sched_t *s);
int dsq_sched_n_running(const dsq_sched_t *s);
/* max_num_seqs minus the running sequences that are not paused (>= 0):
 * the slots a waiting sequence can take at the next step. */
int dsq_sched_n_free_slots(const dsq_sched_t *s);
int64_t dsq_sched_n_preemptions(const dsq_sched_t *s);
/* Prefix cache counters, in tokens, over every admission (preempted
 * sequences again at re-admission), as vLLM V1's prefix_cache_queries and
 * prefix_cache_hits: *queries += the sequence's n_tokens, *hits += the
 * tokens reused. Both stay 0 while prefix caching is off. */
void dsq_sched_prefix_stats(const dsq_sched_t *s, int64_t *queries, int64_t *hits);
/* Check KV invariants against the tables of all queued sequences (plus
 * extra tables the caller holds). */
bool dsq_sched_check(const dsq_sched_t *s);

#endif

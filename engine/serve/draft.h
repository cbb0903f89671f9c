/* Speculative decoding with a draft model: a second, smaller model of the
 * same vocabulary (DeepSeek-Coder-1.3B for 6.7B/33B, a lower-bit copy of
 * the target itself) proposes the next tokens of each speculating
 * sequence by greedy decoding; the engine scores them in its next step
 * (speculate.c). A greedy draft is a deterministic proposal, so the
 * engine's verification (sample every row as plain decoding would, keep
 * drafts while they equal the samples) is exact rejection sampling and
 * the output is the one without speculation (spec.h). The draft's own
 * probabilities are not used: with temperature sampling a sampled draft
 * would be accepted a little more often (Leviathan et al. 2023), at the
 * price of the draft's full softmax and a second RNG stream per sequence.
 *
 * The draft model has its own paged KV cache, on the same backend as the
 * target, and one state per sequence it drafts for (a block table, how
 * many tokens of the sequence its KV holds, the drafts it last made).
 * States are found by a key the caller gives (unique per sequence, never
 * reused), kept for at most `n_states` sequences and evicted least recently
 * used first when the pool or the cache is full; a sequence whose state
 * was evicted is caught up again from its first token. Nothing has to be
 * rolled back after verification: at the next proposal the state keeps
 * the KV of the longest prefix on which its tokens still agree with the
 * sequence's (rejected drafts, drafts the scheduler dropped), and computes
 * the rest.
 *
 * Not thread-safe: the engine thread only.
 */
#ifndef DSQ_DRAFT_H
#define DSQ_DRAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "kernels.h"

typedef struct dsq_draft dsq_draft_t;

typedef struct dsq_draft_opts {
    const char *path;             /* the draft model (any format dsq loads)   */
    const char *tokenizer_path;   /* for a draft file without a tokenizer (a
                                     llama2.c checkpoint): the target's
                                     --tokenizer; NULL otherwise            */
    const dsq_tokenizer_t *target_tok;   /* the target's, to compare with   */
    int64_t target_n_vocab;       /* the target's logits rows: drafts are the
                                     argmax over ids below min(this, the
                                     draft's n_vocab)                      */
    dsq_model_opts_t model;       /* load options (backend, activation type);
                                     quantize applies to the draft too      */
    dsq_kv_dtype_t kv_dtype;
    int block_size;               /* KV block tokens                          */
    int64_t kv_tokens;            /* the draft cache's capacity, tokens       */
    int n_states;                 /* sequences with a state at once, >= 1     */
    int max_chunk;                /* most tokens per catch-up forward pass    */
} dsq_draft_opts_t;

/* Open and load the draft model, check its vocabulary against the
 * target's (same size; same bytes for every token), and make its KV cache.
 * NULL + a one-line reason in err (the file cannot be read, its
 * vocabulary differs, out of memory). */
dsq_draft_t *dsq_draft_create(const dsq_draft_opts_t *o, char *err, size_t err_len);
void dsq_draft_destroy(dsq_draft_t *d);    /* NULL is a no-op */

/* One sequence's request for drafts. */
typedef struct dsq_draft_job {
    uint64_t key;                 /* the sequence's state, made on first use  */
    const int32_t *tokens;        /* the sequence, [n_tokens]; the last token
                                     is the one the target computes next     */
    int n_tokens;
    int k;                        /* drafts wanted, 1..DSQ_SPEC_MAX_K         */
    int32_t *out;                 /* [k]: receives the drafts                 */
    int n_out;                    /* drafts made (0..k)                       */
} dsq_draft_job_t;

/* Draft for every job at once (at most 64 jobs take part): catch the
 * states up to their sequences (one batched pass of at most max_chunk
 * tokens, the jobs needing the fewest first: a job not caught up by it
 * gets no drafts this time and goes on next time), then
 * k - 1 more single-token passes over the jobs with a first draft. A job whose
 * state finds no KV room even after evicting the states not in this call
 * (or whose sequence would pass the draft's context) gets n_out 0.
 * Returns 0, or DSQ_ENOMEM / a forward error: every n_out is then 0 and
 * the states that pass touched are dropped. */
int dsq_draft_propose(dsq_draft_t *d, dsq_draft_job_t *jobs, int n_jobs);

/* Drop key's state (its sequence ended) and free its blocks. No-op when
 * it has none. */
void dsq_draft_forget(dsq_draft_t *d, uint64_t key);

/* Facts for logs, stats and tests. */
typedef struct dsq_draft_info {
    size_t weight_bytes;          /* the draft model's resident weights       */
    int64_t kv_blocks, kv_free;   /* its cache's blocks, and the free ones    */
    int n_states;                 /* live states                              */
    int64_t tokens_computed;      /* draft tokens computed since creation     */
    int64_t evictions;            /* states evicted for room                  */
    double round_ms;              /* a single-token draft pass, decayed mean  */
} dsq_draft_info_t;
void dsq_draft_info(const dsq_draft_t *d, dsq_draft_info_t *out);

#endif

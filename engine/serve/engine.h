/* The engine's API towards the server: load a model, submit requests, read
 * their output. Everything here is thread-safe unless it says otherwise.
 *
 * Threads: dsq_engine_create() starts one engine thread running a libuv loop
 * (docs/architecture.md, "One request"). HTTP threads create a dsq_req_t,
 * submit it, and read output events from it; the engine thread is the only
 * one that touches model state. A dsq_req_t is reference-counted: the
 * creator holds one reference, the engine takes another on submit and drops
 * it when the request ends.
 */
#ifndef DSQ_ENGINE_H
#define DSQ_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/io/model_config.h"
#include "admission.h"
#include "engine/text/tokenizer.h"

/* KV cache element type (dsqd --kv-cache-dtype); the values are the
 * kernels' dsq_kv_dtype_t ones, plus AUTO. */
typedef enum dsq_engine_kv {
    DSQ_ENGINE_KV_AUTO = -1,   /* FP32 for a model stored in FP32 (vLLM's
                                  "auto" = model dtype), FP16 otherwise      */
    DSQ_ENGINE_KV_F16 = 0,
    DSQ_ENGINE_KV_INT8 = 1,    /* group-wise INT8 (kernels.h DSQ_KV_INT8)    */
    DSQ_ENGINE_KV_F32 = 2,
} dsq_engine_kv_t;

/* Defaults of admission_defer_steps and admission_window_ms (see
 * docs/benchmarks.md, serving section, for the measurements behind them). */
#define DSQ_ENGINE_ADMISSION_DEFER_STEPS 4
#define DSQ_ENGINE_ADMISSION_WINDOW_MS 5

typedef struct dsq_engine dsq_engine_t;
typedef struct dsq_req dsq_req_t;

/* Engine options (units in the names). Zero means "default" for every
 * numeric field. */
/* Activation precision of the quantised products (dsqd
 * --activation-dtype). The engine hands it to the model, which sets it on
 * every quantised linear weight (kernels.h dsq_act_dtype_t). */
typedef enum dsq_engine_act {
    DSQ_ENGINE_ACT_INT8 = 0,   /* default: activations quantised to int8 per
                                  32-block, llama.cpp's scheme and speed     */
    DSQ_ENGINE_ACT_F32 = 1,    /* fp32: W·x exact up to fp32 rounding, slower */
} dsq_engine_act_t;

typedef struct dsq_engine_opts {
    const char *model_path;          /* .gguf file, HF directory or llama2.c .bin */
    const char *tokenizer_path;      /* optional separate tokenizer             */
    int max_model_len;               /* tokens; default n_ctx_train (capped)    */
    int max_num_seqs;                /* default 256                             */
    int max_num_batched_tokens;      /* default max(2048, max_model_len)?       */
    int max_prefill_tokens_with_decode; /* prefill tokens per step while
                                        any sequence decodes (scheduler.h);
                                        0 (default) or >= the step budget:
                                        no separate cap                      */
    int admission_defer_steps;       /* dsq_sched_opts_t's; 0 = default
                                        DSQ_ENGINE_ADMISSION_DEFER_STEPS,
                                        < 0 = off                            */
    int admission_window_ms;         /* with nothing running, the first
                                        step of a burst of requests waits
                                        until none arrived (and no step
                                        ended) for this long, at most 10x it
                                        after the first wait; 0 = default
                                        DSQ_ENGINE_ADMISSION_WINDOW_MS,
                                        < 0 = off                            */
    int max_waiting_requests;        /* default 1024: requests that wait with
                                        every run slot taken; beyond, submit
                                        -> DSQ_EFULL                        */
    int64_t max_undelivered_bytes;   /* a request whose queued, not
                                        yet popped output (dsq_req_next) holds
                                        this many bytes is not scheduled until
                                        its reader catches up to half of it;
                                        0 = 16 KiB                           */
    double undelivered_timeout_s;    /* a request held that long is
                                        aborted (logged); 0 = 30 s, < 0 = never */
    double step_budget_ms;           /* target duration of one step
                                        in ms: prefill tokens per step are
                                        what the step cost model fitted to
                                        the measured steps (step_cost.h)
                                        predicts to fit beside the decode
                                        rows (dsq_sched_set_step_budget), so
                                        running streams, cancellation and
                                        /metrics wait about one budget for a
                                        step end (up to ~16 one-row steps
                                        where 8 exceed the budget);
                                        0 = 250, < 0 = no budget            */
    double max_queue_wait_s;         /* a request not scheduled this
                                        long after submit is aborted; its final
                                        events carry queue_timeout; 0 = none */
    /* Admission policy (admission.h): DSQ_ADMISSION_STATIC (0, the
     * fixed bounds above) or DSQ_ADMISSION_ADAPTIVE: a concurrency limit
     * moved by the p90 TTFT / ITL of recent requests against these
     * targets (ms; at least one > 0 for adaptive, else create fails). */
    int admission_policy;
    double target_ttft_ms, target_itl_ms;
    int block_size;                  /* tokens per KV block, default 16         */
    int kv_cache_dtype;              /* a dsq_engine_kv_t value              */
    int64_t memory_limit_bytes;      /* CPU: KV + weights budget                */
    int64_t kv_cache_memory_bytes;   /* explicit KV budget (overrides)          */
    bool kv_prefault;                /* commit the host KV cache's
                                        pages at create (dsq_kv_prefault), so
                                        RSS does not grow under load; default
                                        off here, on in dsqd
                                        (--kv-cache-prefault)                */
    bool enable_prefix_caching;      /* reuse KV blocks of shared prefixes
                                        (engine/kv/kv_cache.h); default off        */
    int n_threads;                   /* CPU threads, default physical cores     */
    const char *quantize;            /* NULL/"none" or "int4": RTN at load      */
    int quant_group_size;            /* with quantize=int4: 32/64/128           */
    dsq_engine_act_t activation_dtype; /* activations of quantised matmuls */
    const char *dtype;               /* activations between a device's products
                                        (model.h dsq_model_opts_t.dtype, vLLM's
                                        --dtype): NULL/"auto", "float16",
                                        "bfloat16", "float32"; CPU: fp32 only */
    /* Liveness heartbeat (systemd WatchdogSec, deploy/dsqd.service).
     * When heartbeat is non-NULL and heartbeat_interval_ms > 0, the engine
     * thread calls heartbeat(heartbeat_user) every heartbeat_interval_ms from
     * a uv_timer_t on its own loop, i.e. between scheduler steps: an engine
     * wedged inside a step (or its loop) stops calling it, which is the
     * point. The first call comes one interval after dsq_engine_create().
     * Must not block (dsqd sends sd_notify("WATCHDOG=1")). NULL/0 = off.
     * Debug builds only (NDEBUG unset): env DSQ_TEST_WEDGE_ENGINE_MS=N makes
     * the engine thread sleep N ms at the start of its first step, so tests
     * can observe a hung engine (heartbeats stop, HTTP threads still answer). */
    void (*heartbeat)(void *user);
    void *heartbeat_user;
    int heartbeat_interval_ms;
    /* Padding cost model (engine/serve/padding.h), a JSON file written by
     * `dsq-bench pad`. NULL: the backend's default file when it exists
     * (dsq_pad_default_path; a malformed default is ignored with a
     * warning); set: that file, and any failure to load it fails
     * dsq_engine_create. Logged at start-up; on the CPU backend
     * informational (batches are ragged), the CUDA-graph path will plan
     * its bucket launches with it (dsq_pad_choose). */
    const char *padding_model_path;
    /* Where the model runs (engine/backend/backend.h): NULL or "cpu"; "cuda"
     * (device 0; dsq_engine_create fails with the reason when this build
     * has no CUDA or there is no device: never a silent CPU fallback);
     * "auto": CUDA when a device is there, else the CPU (logged either
     * way: event=device). */
    const char *device;
    double gpu_memory_utilization;   /* device plans: budget = min(total x
                                        this - bytes in use before the
                                        first allocation, free), as vLLM;
                                        default 0.9; a budget <= 0 fails
                                        dsq_engine_create (DSQ_ENOMEM)   */
    /* Speculative decoding (spec.h), off by default. spec_k > 0: each
     * step, while at most spec_max_batch sequences decode, n-gram prompt
     * lookup proposes up to spec_k draft tokens for each of them (matching
     * their last spec_ngram_max down to spec_ngram_min tokens against the
     * prompt and output so far); one forward pass scores the pending token
     * and the drafts, and drafts are kept while they equal what sampling
     * gives at their position, so the output is the one without
     * speculation (greedy or seeded sampling alike, up to the last bits of
     * a multi-row forward pass; dsq_sampling_t.no_speculation opts a
     * request out). spec_k <= DSQ_SPEC_MAX_K; 0 defaults: spec_ngram_min 2,
     * spec_ngram_max 4, spec_max_batch 4. dsq_engine_create fails on
     * values out of range (spec_ngram_min > spec_ngram_max, negative). */
    int spec_k;
    int spec_ngram_min, spec_ngram_max;
    int spec_max_batch;
    /* false (default): each sequence's draft length adapts to its
     * acceptance and the cost of a row (spec.h dsq_spec_draft_len); true:
     * spec_k drafts whenever the lookup has them */
    bool spec_fixed_len;
    /* With spec_k > 0: the drafts come from this draft model (draft.h)
     * instead of the n-gram lookup: any file dsq loads whose vocabulary
     * is the model's token for token (checked at create: a one-line
     * refusal otherwise), run on the same backend with its own KV cache,
     * a line of the memory plan (dsq_plan_t.draft_bytes). NULL: n-gram. */
    const char *draft_model_path;
    /* With spec_k > 0 (1 is all it uses): the draft is the model's own
     * multi-token prediction module (DeepSeek-V3 checkpoints, model.h),
     * loaded for it and run after every step over the step's computed
     * rows; dsq_engine_create fails when the model has none. Exclusive
     * with draft_model_path. */
    bool spec_mtp;
    /* the draft KV cache's capacity in tokens; 0: spec_max_batch x
     * (max_model_len + DSQ_SPEC_MAX_K), every speculating sequence at full
     * length */
    int64_t draft_kv_tokens;
} dsq_engine_opts_t;

/* The most draft tokens per sequence and step (dsq_engine_opts_t.spec_k). */
#define DSQ_SPEC_MAX_K 16

/* Load the model and start the engine thread. On failure returns NULL with a
 * one-line reason in err. On a device (opts->device) the weights are copied
 * there once with progress on the log, the KV cache is device memory sized
 * from the device's free memory by the planner, and every step runs there;
 * the engine logs the plan's prediction beside the bytes it allocated
 * (event=device_memory). */
dsq_engine_t *dsq_engine_create(const dsq_engine_opts_t *opts, char *err,
                                size_t err_len);
/* Memory plan for opts without loading weights (engine/serve/planner.h): opens
 * the model file's header and tensor table, or, for a directory holding
 * only config.json, the config alone (weights then assumed in the
 * opts->quantize format, FP16 otherwise). *out receives a malloc'd table
 * (json = false) or JSON object (json = true). Returns 0, or a negative
 * DSQ_E* with a reason in err (unreadable model, bad config; DSQ_ERANGE
 * when the budget cannot hold one sequence of max_model_len, with *out
 * still filled so the numbers can be shown). */
int dsq_engine_plan(const dsq_engine_opts_t *opts, bool json, char **out, char *err,
                    size_t err_len);

/* Stop the engine thread (ending every request with finish_reason "abort")
 * and free everything. NULL is a no-op. */
void dsq_engine_destroy(dsq_engine_t *e);

/* Read-only model facts, valid for the engine's lifetime. */
const dsq_model_config_t *dsq_engine_config(const dsq_engine_t *e);
const dsq_tokenizer_t *dsq_engine_tokenizer(const dsq_engine_t *e);
int dsq_engine_max_model_len(const dsq_engine_t *e);
/* The waiting queue's size in requests (max_waiting_requests,
 * its default applied). It counts only requests that truly wait: a
 * request submitted while a run slot is free (max_num_seqs less the
 * running sequences) is not refused, however many were submitted with it
 * (a burst the admission window holds back a few ms is not a queue). */
int dsq_engine_max_waiting(const dsq_engine_t *e);
/* The most requests the engine takes at once: a run slot each
 * (max_num_seqs) plus the waiting queue. A request of more prompts than
 * this can never be queued whole (a 400 for the client, not a 503 to
 * retry). */
int dsq_engine_max_queued(const dsq_engine_t *e);
/* The model's own chat template (NUL-terminated Jinja2 text,
 * owned by the engine): GGUF tokenizer.chat_template, or for a HF
 * directory tokenizer_config.json chat_template (string, or the "default"
 * entry of a named list) / chat_template.jinja (engine/loader/loader.h). NULL
 * when the model has none (llama2.c checkpoints never do). The BOS/EOS
 * token text for rendering comes from dsq_tokenizer_token_str(). */
const char *dsq_engine_chat_template(const dsq_engine_t *e);

/* Snapshot of engine counters for /metrics and /health. */
typedef struct dsq_engine_stats {
    int n_running, n_waiting;
    int64_t kv_blocks_total, kv_blocks_used;
    int64_t prompt_tokens_total, generation_tokens_total;
    int64_t preemptions_total;
    int64_t requests_finished_total;
    /* Prefix cache lookups in tokens (vLLM V1 prefix_cache_queries /
     * prefix_cache_hits): queries = tokens of every admitted sequence,
     * hits = those whose KV came from the cache. 0 while it is off. */
    int64_t prefix_cache_queries_total, prefix_cache_hits_total;
    /* On a device (opts->device "cuda"; 0 on the CPU): the planner's
     * prediction of device memory (weights in the device layout + KV
     * blocks + activation workspace + step buffers, bytes), the budget it
     * was planned in (min(total x gpu_memory_utilization - bytes in use
     * before, free, memory_limit_bytes when set); with kv_cache_memory_bytes the KV part
     * is that instead of what the budget leaves), and the bytes allocated through the
     * backend now and at their peak since start-up
     * (dsq_backend_peak_bytes). The peak never exceeds the prediction. */
    int64_t device_planned_bytes, device_budget_bytes;
    int64_t device_allocated_bytes, device_peak_bytes;
    /* Bytes of one KV block (all layers, K and V as stored);
     * requests held now because their reader is behind (step-start view,
     * engine.h max_undelivered_bytes); requests aborted because they stayed
     * held past undelivered_timeout_s, and because they waited past
     * max_queue_wait_s, since start-up. */
    int64_t kv_block_bytes;
    int n_held;
    int64_t stream_stall_aborts_total, queue_timeouts_total;
    /* The admission policy's state (admission.h dsq_admission_stats_t:
     * its limit, moves, refusals, last window's p90s) and the requests it
     * holds back now (adaptive: waiting for a slot under the limit; they
     * are in n_waiting too) */
    dsq_admission_stats_t admission;
    int n_admission_held;
    /* Speculative decoding since start-up (vLLM's spec_decode counters):
     * verifications (a sequence's drafts scored in one step), draft tokens
     * scored, drafts accepted, and accepted at each draft position
     * (0-based; position i counts verifications that kept > i drafts);
     * spec_k: the engine's spec_k (0: off). With a draft model: its
     * resident weight bytes, its KV blocks (total, free), the tokens it
     * computed and the states it evicted for room (draft.h). */
    int spec_k;
    int64_t draft_weight_bytes, draft_kv_blocks, draft_kv_free;
    int64_t draft_tokens_total, draft_evictions_total;
    int64_t spec_drafts_total, spec_draft_tokens_total, spec_accepted_tokens_total;
    int64_t spec_accepted_per_pos[DSQ_SPEC_MAX_K];
} dsq_engine_stats_t;
void dsq_engine_stats(dsq_engine_t *e, dsq_engine_stats_t *out);

/* ------------------------------------------------------------ requests */

/* Sampling and stopping parameters of one request (OpenAI/vLLM meanings). */
typedef struct dsq_sampling {
    int max_tokens;                  /* >= 0; 0 is allowed with echo            */
    float temperature;               /* 0 = greedy                              */
    float top_p;                     /* (0, 1], 1 = off                         */
    int top_k;                       /* <= 0 = off                              */
    float min_p;                     /* [0, 1], 0 = off                         */
    float presence_penalty;          /* [-2, 2]                                 */
    float frequency_penalty;         /* [-2, 2]                                 */
    float repetition_penalty;        /* > 0, 1 = off (CTRL paper, as vLLM)      */
    bool has_seed;
    uint64_t seed;
    bool ignore_eos;
    int logprobs;                    /* -1: none; 0..20 top alternatives        */
    int n;                           /* choices, >= 1                           */
    /* best_of > n generates best_of sequences from one prompt (forked
     * copy-on-write after the prefill, like n > 1) and returns the n with
     * the highest cumulative raw log-probability of their completion
     * tokens (sum, as vLLM; OpenAI documents "highest log probability per
     * token"), renumbered 0..n-1 best first; ties keep generation order.
     * Their events are held until every candidate ended (no streaming).
     * 0 or <= n: n sequences. At most 1024 (dsq_req_create rejects more). */
    int best_of;
    /* Compute the logprob of every prompt token but the first under
     * the raw model distribution (log-softmax of the logits at the position
     * before it), with max(logprobs, 0) top alternatives each, and deliver
     * them on the request's first output event (dsq_output_t
     * prompt_logprobs). Each position is computed once, also across chunked
     * prefill and preemption by recompute. */
    bool prompt_logprobs;
    int n_logit_bias;
    const int32_t *logit_bias_ids;   /* [n_logit_bias], copied on create        */
    const float *logit_bias;         /* [n_logit_bias], copied on create        */
    int n_stop_token_ids;
    const int32_t *stop_token_ids;   /* copied on create                        */
    int n_stop;
    const char *const *stop;         /* stop strings, copied on create          */
    /* Constrained decoding (engine/text/grammar.h), or NULL: every
     * token of every choice is one the grammar allows, end-of-generation
     * only where it accepts, and a choice whose grammar admits nothing more
     * finishes with DSQ_FINISH_STOP. dsq_req_create takes its own reference
     * (the caller keeps and frees its own). */
    struct dsq_grammar *grammar;
    /* Reasoning models' thinking section, as token ids (copied on
     * create): it is open from the start when think_open (the prompt
     * opened it), else from where the choice writes think_start; it ends
     * where the choice writes think_end. Its tokens are counted
     * (dsq_output_t.reasoning_tokens). With has_think_budget, a choice that
     * has written think_budget (>= 0) tokens inside it is made to write
     * think_end next, one token a step (the sampler picks among those
     * alone, so logprobs stay the model's), and then goes on as sampled.
     * No think_end ids: nothing is tracked. The budget is not applied
     * under a grammar (the grammar decides every token there). */
    bool think_open;
    int n_think_start;
    const int32_t *think_start;
    int n_think_end;
    const int32_t *think_end;
    bool has_think_budget;
    int think_budget;
    /* Decode this request without speculation (dsq_engine_opts_t.spec_k)
     * even where the engine speculates. */
    bool no_speculation;
} dsq_sampling_t;

/* Why a choice ended. */
typedef enum dsq_finish {
    DSQ_FINISH_NONE = 0,
    DSQ_FINISH_STOP,                 /* EOS, stop token or stop string          */
    DSQ_FINISH_LENGTH,               /* max_tokens or max_model_len             */
    DSQ_FINISH_ABORT,                /* cancelled or engine shut down           */
} dsq_finish_t;

/* One top-logprob alternative. */
typedef struct dsq_top_logprob {
    int32_t token;
    float logprob;
} dsq_top_logprob_t;

/* One output event of one choice: the text that became final since the last
 * event, the tokens sampled since then, and, on the last event, the finish
 * reason. Owned by the caller of dsq_req_next() and freed with
 * dsq_output_free(). text is UTF-8 and never splits a character; text that
 * might still become a stop string is held back until it cannot. */
typedef struct dsq_output {
    int index;                       /* choice index 0..n-1                     */
    char *text;                      /* NUL-terminated delta                    */
    size_t text_len;
    int n_tokens;
    int32_t *tokens;                 /* [n_tokens]                              */
    float *logprobs;                 /* [n_tokens] or NULL                      */
    dsq_top_logprob_t *top;          /* [n_tokens][n_top] or NULL               */
    int n_top;
    size_t *token_text_offset;       /* [n_tokens]: byte offset of each token's
                                        text within the choice's whole text     */
    dsq_finish_t finish;
    int prompt_tokens;               /* set on the final event                  */
    int completion_tokens;           /* set on the final event                  */
    int reasoning_tokens;            /* set on the final event: tokens written
                                        inside the thinking section (its end
                                        marker included; sp.think_*)        */
    int stop_matched;                /* set on the final event: 1 + the index in
                                        sp.stop of the stop string that ended
                                        the choice; 0 when none did (EOS, a
                                        stop token, length, abort)          */
    int cached_tokens;               /* set on the final event: prompt tokens
                                        whose KV came from the prefix cache at
                                        admission (a multiple of block_size,
                                        < prompt_tokens; 0 when off)            */
    /* Prompt logprobs (dsq_sampling_t.prompt_logprobs), on the
     * request's first event only: entry i is prompt token i + 1 (the first
     * prompt token has none), n_prompt_logprobs <= n_prompt - 1 (fewer only
     * when the prompt was not computed, e.g. an abort); top rows hold n_top
     * alternatives, most likely first. NULL / 0 otherwise. */
    int n_prompt_logprobs;
    float *prompt_logprobs;          /* [n_prompt_logprobs]                     */
    dsq_top_logprob_t *prompt_top;   /* [n_prompt_logprobs][n_top] or NULL      */
    /* best_of > n: tokens generated by the candidates that were not
     * returned, on one final event of the request (usage counts them). */
    int discarded_tokens;
    bool queue_timeout;              /* final event of a request
                                        aborted after max_queue_wait_s without
                                        ever being scheduled (finish ABORT)  */
    int64_t queue_us;                /* on the request's first event (0 = not
                                        reported): microseconds from
                                        dsq_engine_submit to the step that
                                        first scheduled it, for /metrics'
                                        request_queue_time_seconds and the log */
} dsq_output_t;

void dsq_output_free(dsq_output_t *o);

/* Called on the engine thread whenever a request has new output or ends. It
 * must not block (e.g. MHD_resume_connection or a condvar signal). */
typedef void (*dsq_req_notify_fn)(dsq_req_t *req, void *user);

/* Create a request for the prompt ids (copied). Returns NULL with a reason
 * in err on invalid parameters. The caller owns one reference. */
dsq_req_t *dsq_req_create(const int32_t *prompt, int n_prompt,
                          const dsq_sampling_t *sp, dsq_req_notify_fn notify,
                          void *user, char *err, size_t err_len);
void dsq_req_ref(dsq_req_t *r);
void dsq_req_unref(dsq_req_t *r);    /* NULL is a no-op */
uint64_t dsq_req_id(const dsq_req_t *r);

/* Queue the request. Returns 0, DSQ_EFULL (waiting queue full, or refused
 * by the admission policy: dsq_req_refusal says why), DSQ_ERANGE
 * (prompt + max_tokens > max_model_len), DSQ_ESTATE (engine shutting down). */
int dsq_engine_submit(dsq_engine_t *e, dsq_req_t *r);

/* Why the admission policy refused r (at submit: DSQ_EFULL; or
 * later: its final events carry queue_timeout), into buf (NUL-terminated,
 * "" when it did not). Returns the Retry-After it asks for in seconds, or
 * 0 when the policy did not refuse r (a full queue or --max-queue-wait:
 * the caller's own message). Any thread. */
int dsq_req_refusal(dsq_req_t *r, char *buf, size_t len);

/* Whether the adaptive admission policy still holds r back (submitted,
 * neither admitted to the scheduler nor refused yet). The engine calls r's
 * notify when it admits r; one refused or cancelled while held stays
 * "held" and ends with its final events instead. dsqd holds a streamed
 * answer's 200 until then, so a refusal is a real 503. Any thread. */
bool dsq_req_held(dsq_req_t *r);

/* Ask the engine to end the request (client gone, timeout). Its KV blocks are
 * freed at the next step; it then reports DSQ_FINISH_ABORT. Idempotent. */
void dsq_engine_cancel(dsq_engine_t *e, dsq_req_t *r);

/* Where a request spent its time, for its trace spans
 * (server/trace.h). Times are seconds on CLOCK_MONOTONIC (the clock of
 * every other engine timestamp), 0 while the moment has not come. */
#define DSQ_REQ_MAX_CHUNKS 32
typedef struct dsq_req_chunk {
    double t_start, t_end;           /* the engine step that computed it      */
    int pos;                         /* first prompt position of the chunk   */
    int n_tokens;                    /* prompt tokens computed in that step   */
    int index;                       /* choice (> 0: recomputed after a
                                        preemption of a forked choice)       */
} dsq_req_chunk_t;
typedef struct dsq_req_timeline {
    double t_submit;                 /* dsq_engine_submit accepted it          */
    double t_sched;                  /* start of the first step that ran it    */
    double t_first_token;            /* first token sampled                    */
    double t_end;                    /* its last choice ended                  */
    int n_chunks;                    /* prefill chunks, in step order; beyond
                                        DSQ_REQ_MAX_CHUNKS the last one grows
                                        to cover the rest (n_chunks_merged)   */
    int n_chunks_merged;
    dsq_req_chunk_t chunks[DSQ_REQ_MAX_CHUNKS];
    int n_decode_steps;              /* steps in which any choice decoded     */
    int n_generated;                 /* tokens of every choice (best_of: all
                                        candidates), counted as choices end  */
    int n_preemptions;               /* of every choice, counted as they end  */
    int n_draft_tokens;              /* speculative decoding: drafts scored   */
    int n_draft_accepted;            /* and kept, every choice               */
} dsq_req_timeline_t;

/* Copy r's timeline into *out (under the request's lock: any thread,
 * at any time; complete once every choice's final event was popped). */
void dsq_req_timeline(dsq_req_t *r, dsq_req_timeline_t *out);

/* Pop the next output event. Returns 1 and fills *out, 0 when nothing is
 * pending yet, or -1 when every choice has finished and everything was
 * popped. Never blocks. */
int dsq_req_next(dsq_req_t *r, dsq_output_t *out);

#endif

/* dsqd options: ONE table (name, type, default, bounds, help, env name)
 * drives the command-line flags, the --config JSON file and --help.
 *
 * Precedence, lowest to highest: built-in defaults < --config file <
 * DSQ_* environment variables < command-line flags. Each option `--foo-bar`
 * is the config key "foo-bar" (or "foo_bar") and the env var DSQ_FOO_BAR.
 * Pure code (cJSON only) so it is unit-testable without an engine. */
#ifndef DSQ_SERVER_OPTIONS_H
#define DSQ_SERVER_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Parsed options. Strings are malloc'd (or NULL) and freed by
 * dsq_options_deinit(). Sizes in bytes, timeouts in seconds. */
typedef struct dsq_options {
    char *host;
    int port;
    char *model;
    char *tokenizer;
    char *served_model_name;     /* NULL: basename of model                */
    int max_model_len;           /* 0: engine default                      */
    int max_num_seqs;
    int max_num_batched_tokens;
    int max_prefill_tokens_with_decode;
    int admission_defer_steps;
    int admission_window_ms;
    double gpu_memory_utilization;
    char *api_key;
    char *kv_cache_dtype;        /* auto | fp16 | int8                     */
    int block_size;
    bool enable_prefix_caching;
    int speculative_ngram;         /* draft tokens per step, 0 = off         */
    int speculative_ngram_min, speculative_ngram_max;
    int speculative_max_batch;
    bool speculative_fixed_len;
    char *draft_model;             /* speculation's draft model, or NULL     */
    int draft_max;                 /* its drafts per step                    */
    bool speculative_mtp;          /* the model's MTP module drafts          */
    bool kv_cache_prefault;        /* hardening: see --kv-cache-prefault     */
    int64_t max_request_bytes;
    int max_waiting_requests;
    double max_queue_wait;       /* hardening: s, 0 = none                 */
    double step_budget_ms;       /* hardening: ms, 0 = none                */
    char *admission_policy;      /* admission: static | adaptive           */
    double target_ttft_ms;       /* admission: ms, 0 = none                */
    double target_itl_ms;
    int64_t max_undelivered_bytes; /* hardening: bytes                     */
    double stream_stall_timeout; /* hardening: s, 0 = never               */
    double shutdown_timeout;     /* s                                      */
    double request_timeout;      /* s, 0 = none                            */
    double header_timeout;       /* hardening: s, request head deadline    */
    double body_timeout;         /* hardening: s, request body deadline    */
    int max_connections;         /* hardening: 0 = from RLIMIT_NOFILE      */
    int max_connections_per_client; /* hardening: 0 = no limit         */
    int http_threads;            /* hardening: 0 = 2 per CPU, 4..32        */
    int timeout_keep_alive;      /* api: s, idle connection timeout        */
    int max_seqs_per_request;    /* api: prompts x max(n, best_of) cap     */
    int threads;
    int seed;                    /* users: default request seed, -1 = none */
    int reasoning_budget;        /* thinking tokens of a request that sets
                                    none; -1 = no limit                    */
    char *device;                /* auto | cpu | cuda                      */
    char *quantize;              /* none | int4                            */
    int group_size;
    char *activation_dtype;      /* int8 | fp32                            */
    char *dtype;                 /* auto | float16 | bfloat16 | float32    */
    int64_t memory_limit;        /* bytes, 0 = none                        */
    int64_t kv_cache_memory;     /* bytes, 0 = planner decides             */
    char *log_level;
    char *log_file;              /* NULL: stderr; reopened on SIGHUP       */
    char *ssl_certfile;
    char *ssl_keyfile;
    char *allowed_origins;       /* comma-separated, "*" allowed           */
    bool any_content_type;       /* api: see --any-content-type            */
    char *chat_template;
    char *padding_model;         /* pad: padding cost model JSON           */
    char *reasoning_parser;      /* none | deepseek_r1                     */
    char *tool_call_parser;      /* auto | deepseek | hermes | none        */
    char *otlp_endpoint;         /* otel: OTLP/HTTP base URL, NULL = env   */
    bool otlp_export_prompt;     /* otel: prompt text in spans             */
    char *config;
    bool plan;
    bool json;
    bool help;
    bool version;
} dsq_options_t;

/* Looks up an environment variable (getenv signature); tests pass a fake. */
typedef const char *(*dsq_getenv_fn)(const char *name);

/* Fill *o from defaults, the config file (--config PATH or DSQ_CONFIG),
 * the environment (through getenv_fn; NULL = no environment) and argv[1..].
 * Returns 0, or DSQ_EINVAL (unknown flag, missing value, bad type or out of
 * bounds, unreadable/invalid config file) with a one-line reason in err.
 * On failure *o is still valid and must be dsq_options_deinit()ed. */
int dsq_options_load(dsq_options_t *o, int argc, char *const *argv,
                     dsq_getenv_fn getenv_fn, char *err, size_t err_len);

/* Free the strings in *o. Safe on a zeroed struct. */
void dsq_options_deinit(dsq_options_t *o);

/* Write the --help text (generated from the table) to f. */
void dsq_options_help(FILE *f);

/* Parse a byte size: a non-negative integer with an optional suffix
 * K/M/G/T (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024),
 * case-insensitive. Returns 0 or DSQ_EINVAL. */
int dsq_options_parse_bytes(const char *s, int64_t *out);

#endif

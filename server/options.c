/* The dsqd option table and the three sources that feed it (config file,
 * environment, flags). Every value, whatever its source, goes through
 * set_value(), so types and bounds are checked in one place. */
#include "server/options.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "engine/common/error.h"
#include "server/json.h"

typedef enum { T_STR, T_INT, T_FLOAT, T_BOOL, T_BYTES } opt_type_t;

typedef struct opt {
    const char *name;            /* flag without "--"                      */
    opt_type_t type;
    size_t offset;               /* into dsq_options_t                     */
    const char *def;             /* default as text, NULL = unset          */
    double min, max;             /* bounds for INT/FLOAT/BYTES             */
    const char *choices;         /* "a|b|c" for enumerated strings         */
    const char *help;
    const char *env;             /* env var when not DSQ_<NAME>            */
} opt_t;

#define O(f) offsetof(dsq_options_t, f)
static const opt_t table[] = {
    {"host", T_STR, O(host), "127.0.0.1", 0, 0, NULL, "address to listen on", NULL},
    {"port", T_INT, O(port), "8000", 0, 65535, NULL, "TCP port (0 = any free port)", NULL},
    {"model", T_STR, O(model), NULL, 0, 0, NULL, "model: .gguf file, HF directory or llama2.c .bin", NULL},
    {"tokenizer", T_STR, O(tokenizer), NULL, 0, 0, NULL, "separate tokenizer (tokenizer.json or directory)", NULL},
    {"served-model-name", T_STR, O(served_model_name), NULL, 0, 0, NULL, "model id in the API (default: model file basename)", NULL},
    {"max-model-len", T_INT, O(max_model_len), "0", 0, 1 << 24, NULL, "context length in tokens (0 = model's)", NULL},
    {"max-num-seqs", T_INT, O(max_num_seqs), "0", 0, 65536, NULL, "max running sequences (0 = engine default)", NULL},
    {"max-num-batched-tokens", T_INT, O(max_num_batched_tokens), "0", 0, 1 << 24, NULL, "token budget per engine step (0 = engine default)", NULL},
    {"max-prefill-tokens-with-decode", T_INT, O(max_prefill_tokens_with_decode), "0", 0, 1 << 24, NULL, "prefill tokens per engine step while sequences decode: bounds the gap between streamed tokens (0 = no separate cap)", NULL},
    {"admission-defer-steps", T_INT, O(admission_defer_steps), "4", 0, 1 << 20, NULL, "hold new prompts back while every running sequence will end within this many steps, so their prefill does not stall those streams (0 = off)", NULL},
    {"admission-window-ms", T_INT, O(admission_window_ms), "5", 0, 10000, NULL, "when idle, start a burst of requests once none arrived for this long (at most 10x it), so it runs as one batch (0 = off)", NULL},
    {"gpu-memory-utilization", T_FLOAT, O(gpu_memory_utilization), "0.9", 0.01, 1.0, NULL, "with a CUDA device: the fraction of the device's total memory this server may use for weights + KV cache + workspace, counting what is already in use (its CUDA context, other processes), as vLLM's", NULL},
    {"api-key", T_STR, O(api_key), NULL, 0, 0, NULL, "require 'Authorization: Bearer KEY' (all routes but /health)", NULL},
    {"kv-cache-dtype", T_STR, O(kv_cache_dtype), "auto", 0, 0, "auto|fp16|fp32|int8", "KV cache element type (auto: fp32 for FP32 models, else fp16)", NULL},
    {"block-size", T_INT, O(block_size), "16", 1, 1024, NULL, "tokens per KV block", NULL},
    {"enable-prefix-caching", T_BOOL, O(enable_prefix_caching), "false", 0, 0, NULL, "reuse the KV blocks of prompt prefixes seen before (automatic prefix caching; usage reports cached_tokens)", NULL},
    {"speculative-ngram", T_INT, O(speculative_ngram), "0", 0, 16, NULL, "speculative decoding by n-gram prompt lookup: up to K draft tokens per decoding sequence and step, taken from what followed the last occurrence of the text's current suffix in the prompt and output, scored in the same forward pass; the output is the one without it (0 = off; pays on output that copies its context: code edits, quoting, extraction)", NULL},
    {"speculative-ngram-min", T_INT, O(speculative_ngram_min), "2", 1, 64, NULL, "with --speculative-ngram: shortest suffix (tokens) matched", NULL},
    {"speculative-ngram-max", T_INT, O(speculative_ngram_max), "4", 1, 64, NULL, "with --speculative-ngram: longest suffix (tokens) matched, tried first", NULL},
    {"draft-model", T_STR, O(draft_model), NULL, 0, 0, NULL, "speculative decoding with a draft model: a smaller model of the same vocabulary (same tokens, same ids; checked at start-up) proposes up to --draft-max tokens per decoding sequence and step by greedy decoding, on the same device with its own KV cache, and the model scores them in one forward pass; the output is the one without it (llama-server's --model-draft)", NULL},
    {"speculative-mtp", T_BOOL, O(speculative_mtp), "false", 0, 0, NULL, "speculative decoding with the model's own multi-token prediction module (DeepSeek-V3 Hugging Face checkpoints; GGUF conversions drop it): one draft token per decoding sequence and step, scored in the next forward pass; the output is the one without it (vLLM's method \"deepseek_mtp\")", NULL},
    {"draft-max", T_INT, O(draft_max), "5", 1, 16, NULL, "with --draft-model: most draft tokens per sequence and step", NULL},
    {"speculative-max-batch", T_INT, O(speculative_max_batch), "4", 1, 65536, NULL, "with --speculative-ngram, --draft-model or --speculative-mtp: speculate only while at most this many sequences decode (a batch is bound by compute, where scoring drafts costs about what it saves; measured on a 2-core CPU: +20 % at 1 stream, +-10 % at 8)", NULL},
    {"speculative-fixed-len", T_BOOL, O(speculative_fixed_len), "false", 0, 0, NULL, "with --speculative-ngram, --draft-model or --speculative-mtp: always propose K drafts where the proposer has them, instead of a length that follows each sequence's acceptance and the measured cost of a row", NULL},
    {"kv-cache-prefault", T_BOOL, O(kv_cache_prefault), "true", 0, 0, NULL, "cpu: commit the KV cache's memory at start (default on), so the resident memory of an idle server is what the memory plan reserved and no load grows it; --kv-cache-prefault false commits pages as blocks are first used (quicker start, RSS grows with use)", NULL},
    {"max-request-bytes", T_BYTES, O(max_request_bytes), "1MiB", 1, 1073741824.0, NULL, "largest request body accepted (413 above)", NULL},
    {"max-waiting-requests", T_INT, O(max_waiting_requests), "0", 0, 1 << 24, NULL, "waiting queue size, 503 with Retry-After when full (0 = engine default, 1024)", NULL},
    {"max-undelivered-bytes", T_BYTES, O(max_undelivered_bytes), "16KiB", 4096, 1073741824.0, NULL, "output a request may have generated but its client not yet read (a stream whose client stopped reading): beyond it the request is not scheduled (its KV is kept) until the client catches up; each socket's kernel send buffer is capped to half of it. Small by default so that a client that stopped reading is held within its first ~300 tokens, not after thousands; a client that reads loses nothing", NULL},
    {"stream-stall-timeout", T_FLOAT, O(stream_stall_timeout), "30", 0, 86400, NULL, "seconds a request may stay held by --max-undelivered-bytes; then it is aborted and logged (0 = never)", NULL},
    {"step-budget-ms", T_FLOAT, O(step_budget_ms), "250", 0, 600000, NULL, "target duration of one engine step: prompt tokens per step are what a cost model fitted to the measured steps (fixed + per token + per attention pair) predicts to fit in it beside the running decodes, so a long prompt cannot stall running streams, a cancel or /metrics for longer; where 8 one-row steps of the model exceed it (a big model on a small machine), steps may take up to ~16 one-row steps instead of crawling a few rows each (0 = no budget: up to --max-num-batched-tokens per step)", NULL},
    {"max-queue-wait", T_FLOAT, O(max_queue_wait), "0", 0, 86400 * 7, NULL, "seconds a request may wait to be scheduled; then it is refused with 503 and Retry-After (streams: an error event) (0 = no limit)", NULL},
    {"admission-policy", T_STR, O(admission_policy), "static", 0, 0, "static|adaptive", "static: every request queues up to --max-waiting-requests / --max-queue-wait; adaptive: a concurrency limit that grows while the p90 time to first token and inter-token latency stay under --target-ttft-ms / --target-itl-ms and shrinks (x0.9) when they exceed them (AIMD); requests beyond it wait at most half the TTFT target, more are refused at once with 503 and Retry-After", NULL},
    {"target-ttft-ms", T_FLOAT, O(target_ttft_ms), "0", 0, 3600000, NULL, "with --admission-policy adaptive: the p90 time to first token (ms, submit to first token) to hold (0 = none)", NULL},
    {"target-itl-ms", T_FLOAT, O(target_itl_ms), "0", 0, 3600000, NULL, "with --admission-policy adaptive: the p90 inter-token latency (ms, the duration of an engine step with decodes) to hold (0 = none)", NULL},
    {"shutdown-timeout", T_FLOAT, O(shutdown_timeout), "30", 0, 86400, NULL, "seconds in-flight requests may finish after SIGTERM", NULL},
    {"request-timeout", T_FLOAT, O(request_timeout), "600", 0, 86400 * 7, NULL, "seconds a request may take from arrival to its last token, queue wait included; then it is cancelled (408; a stream ends with finish_reason abort). Raise it for very long generations (0 = no limit)", NULL},
    {"timeout-keep-alive", T_INT, O(timeout_keep_alive), "5", 1, 86400, NULL, "seconds an idle or stalled connection (no request in flight) stays open", NULL},
    {"header-timeout", T_FLOAT, O(header_timeout), "10", 0, 86400, NULL, "seconds a client has to send a request's whole head (request line and headers), from connect, or on a kept-alive connection from the previous answer plus --timeout-keep-alive; then the connection is closed (0 = none)", NULL},
    {"body-timeout", T_FLOAT, O(body_timeout), "60", 0, 86400, NULL, "seconds a client has to send a request's whole body once its head is in; then the connection is closed (0 = none)", NULL},
    {"max-connections", T_INT, O(max_connections), "0", 0, 1 << 20, NULL, "open connections at once; beyond it new ones are closed unanswered (0 = the file-descriptor limit less 256, at most 65536)", NULL},
    {"max-connections-per-client", T_INT, O(max_connections_per_client), "1024", 0, 1 << 20, NULL, "open connections from one client IP address (0 = no limit; behind a proxy every client has the proxy's address)", NULL},
    {"http-threads", T_INT, O(http_threads), "0", 0, 1024, NULL, "HTTP threads that parse and answer requests; waiting requests hold none (0 = 2 per CPU, 4 to 32)", NULL},
    {"max-seqs-per-request", T_INT, O(max_seqs_per_request), "128", 1, 1 << 20, NULL, "cap on prompts x max(n, best_of) of one request (400 above; 128 = OpenAI's cap on n), so one request cannot take most of --max-num-seqs", NULL},
    {"threads", T_INT, O(threads), "0", 0, 4096, NULL, "CPU threads for the engine (0 = physical cores)", NULL},
    {"seed", T_INT, O(seed), "-1", -1, 2147483647.0, NULL, "sampling seed of every request that sends none (as llama-server's --seed: the same request then samples the same text; -1 = a fresh random seed per request)", NULL},
    {"device", T_STR, O(device), "auto", 0, 0, "auto|cpu|cuda", "where the model runs: cuda (device 0; exit 1 when there is none), cpu, or auto (cuda when a device is present and the model's architecture runs there, else cpu)", NULL},
    {"quantize", T_STR, O(quantize), "none", 0, 0, "none|int4", "round FP16/BF16/FP32 weights to INT4 at load (RTN; quantized checkpoints load as they are)", NULL},
    {"group-size", T_INT, O(group_size), "128", 32, 128, NULL, "group size for --quantize int4 (32, 64, 128)", NULL},
    {"activation-dtype", T_STR, O(activation_dtype), "int8", 0, 0, "int8|fp32", "activations of quantized matmuls: int8 (fast, llama.cpp's scheme) or fp32 (exact W*x, slower)", NULL},
    {"dtype", T_STR, O(dtype), "auto", 0, 0, "auto|float16|half|bfloat16|float32|float", "activations between products on --device cuda (vLLM's --dtype): auto = bfloat16 when the checkpoint stores bf16 tensors, else float16; the residual stream, norms, softmax and logits stay fp32. The CPU backend computes in fp32 (auto or float32 only)", NULL},
    {"memory-limit", T_BYTES, O(memory_limit), "0", 0, 9.0e18, NULL, "CPU memory budget for weights + workspace + KV cache (0 = half of physical RAM)", NULL},
    {"kv-cache-memory", T_BYTES, O(kv_cache_memory), "0", 0, 9.0e18, NULL, "explicit KV cache budget; with weights and workspace it must fit the memory budget (0 = planner decides: on cpu what the budget leaves, at most 4 GiB as vLLM's CPU default; on cuda all the device budget leaves)", NULL},
    {"log-level", T_STR, O(log_level), "info", 0, 0, "error|warn|info|debug", "log threshold", NULL},
    {"log-file", T_STR, O(log_file), NULL, 0, 0, NULL, "append logs to this file instead of stderr; SIGHUP reopens it", NULL},
    {"ssl-certfile", T_STR, O(ssl_certfile), NULL, 0, 0, NULL, "PEM certificate: serve HTTPS", NULL},
    {"ssl-keyfile", T_STR, O(ssl_keyfile), NULL, 0, 0, NULL, "PEM private key for --ssl-certfile", NULL},
    {"allowed-origins", T_STR, O(allowed_origins), NULL, 0, 0, NULL, "origins (scheme://host[:port], comma-separated, or '*') whose web pages may call dsqd: they get the CORS headers and preflights; without --api-key, a request whose Origin is neither listed nor dsqd's own (scheme:// + the Host it was sent to) is refused with 403. A browser UI on another origin needs it even with --api-key", NULL},
    {"any-content-type", T_BOOL, O(any_content_type), "false", 0, 0, NULL, "take a POST body sent with any Content-Type when it is JSON (as llama-server does, e.g. curl -d without -H); by default only application/json (or none) is taken, 415 otherwise, so a web page cannot post a form to dsqd", NULL},
    {"padding-model", T_STR, O(padding_model), NULL, 0, 0, NULL, "padding cost model JSON from 'dsq-bench pad' (default: $XDG_CACHE_HOME/dsq/padding-<backend>.json when present; informational on cpu)", NULL},
    {"chat-template", T_STR, O(chat_template), NULL, 0, 0, NULL, "chat template file (overrides the model's)", NULL},
    {"reasoning-parser", T_STR, O(reasoning_parser), "none", 0, 0, "none|deepseek_r1", "split <think>...</think> into reasoning_content (chat)", NULL},
    {"reasoning-budget", T_INT, O(reasoning_budget), "-1", -1, 1 << 30, NULL, "with --reasoning-parser: thinking tokens a request may write when it sets no budget of its own (thinking_budget, Anthropic's thinking.budget_tokens); when spent, </think> is written for the model and the answer follows (-1 = no limit, 0 = no thinking)", NULL},
    {"tool-call-parser", T_STR, O(tool_call_parser), "auto", 0, 0, "auto|deepseek|hermes|none", "the model's tool-call syntax (chat tools): auto = from the chat template", NULL},
    {"otlp-endpoint", T_STR, O(otlp_endpoint), NULL, 0, 0, NULL, "OpenTelemetry: export a trace of every request over OTLP/HTTP (JSON) to this base URL, e.g. http://127.0.0.1:4318 (/v1/traces is appended unless the path ends in it); overrides OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and OTEL_EXPORTER_OTLP_ENDPOINT (unset and no OTEL_ endpoint: no export; traceparent is still honoured and answered)", NULL},
    {"otlp-export-prompt", T_BOOL, O(otlp_export_prompt), "false", 0, 0, NULL, "OpenTelemetry: put the request's messages or prompt in its span (gen_ai.input.messages); off by default, prompt text is never exported", NULL},
    {"config", T_STR, O(config), NULL, 0, 0, NULL, "JSON config file; keys are these option names", NULL},
    {"plan", T_BOOL, O(plan), "false", 0, 0, NULL, "print the memory plan and exit", NULL},
    {"json", T_BOOL, O(json), "false", 0, 0, NULL, "with --plan: print the plan as a JSON object", NULL},
    {"help", T_BOOL, O(help), "false", 0, 0, NULL, "print this help and exit", NULL},
    {"version", T_BOOL, O(version), "false", 0, 0, NULL, "print the version and exit", NULL},
};
#undef O
#define N_OPTS (sizeof(table) / sizeof(table[0]))

/* users: the flags people type from llama-server and vLLM, as aliases of
 * the canonical options (shown beside them in --help). */
static const struct { const char *alias, *name; } aliases[] = {
    {"-m", "model"}, {"-c", "max-model-len"}, {"--ctx-size", "max-model-len"},
    {"-t", "threads"},
};
#define N_ALIASES (sizeof(aliases) / sizeof(aliases[0]))

static void fail(char *err, size_t err_len, const char *fmt, const char *a,
                 const char *b)
{
    if (err && err_len)
        snprintf(err, err_len, fmt, a, b);
}

/* "SRC: value TEXT out of range [MIN, MAX]" (what, when not NULL, after
 * TEXT: e.g. its value in bytes; unit after the range). */
static void fail_range(char *err, size_t err_len, const char *src, const char *text,
                       const char *what, double min, double max, const char *fmt_num,
                       const char *unit)
{
    char lo[320], hi[320];   /* %.0f of any double fits */
    if (!err || !err_len)
        return;
    snprintf(lo, sizeof(lo), fmt_num, min);
    snprintf(hi, sizeof(hi), fmt_num, max);
    snprintf(err, err_len, "%s: value %s%s out of range [%s, %s]%s", src, text, what ? what : "",
             lo, hi, unit);
}

/* Match names treating '-' and '_' alike; n = length of s to compare. */
static bool name_eq(const char *name, const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        char a = name[i], b = s[i];
        if (a == '\0')
            return false;
        if (b == '_')
            b = '-';
        if (a != b)
            return false;
    }
    return name[i] == '\0';
}

static const opt_t *find(const char *s, size_t n)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (name_eq(table[i].name, s, n))
            return &table[i];
    return NULL;
}

int dsq_options_parse_bytes(const char *s, int64_t *out)
{
    static const struct { const char *suf; double mul; } sufs[] = {
        {"", 1}, {"b", 1}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12},
        {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
        {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0},
        {"tib", 1099511627776.0},
    };
    char *end = NULL;
    double v;
    if (!s || !*s || isspace((unsigned char)*s) || *s == '-')
        return DSQ_EINVAL;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return DSQ_EINVAL;
    for (size_t i = 0; i < sizeof(sufs) / sizeof(sufs[0]); i++) {
        if (strcasecmp(end, sufs[i].suf) == 0) {
            double b = v * sufs[i].mul;
            if (b > 9.2e18 || b != floor(b))
                return DSQ_EINVAL;
            *out = (int64_t)b;
            return DSQ_OK;
        }
    }
    return DSQ_EINVAL;
}

static bool in_choices(const char *choices, const char *v)
{
    size_t n = strlen(v);
    const char *p = choices;
    while (p && *p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncasecmp(p, v, n) == 0)
            return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

/* Set option o from text (from argv, env, a config string or a default).
 * src names the source for error messages. */
static int set_value(dsq_options_t *opts, const opt_t *o, const char *text,
                     const char *src, char *err, size_t err_len)
{
    void *field = (char *)opts + o->offset;
    char *end = NULL;
    int rc = DSQ_OK;
    switch (o->type) {
    case T_STR: {
        char **p = field;
        if (o->choices && !in_choices(o->choices, text)) {
            fail(err, err_len, "%s: must be one of %s", src, o->choices);
            rc = DSQ_EINVAL;
            break;
        }
        char *dup = strdup(text);
        if (!dup) {
            rc = DSQ_ENOMEM;
            break;
        }
        if (o->choices)
            for (char *c = dup; *c; c++)
                *c = (char)tolower((unsigned char)*c);
        free(*p);
        *p = dup;
        break;
    }
    case T_INT: {
        long v;
        errno = 0;
        v = strtol(text, &end, 10);
        if (errno || end == text || *end || isspace((unsigned char)*text)) {
            fail(err, err_len, "%s: expected an integer, got '%s'", src, text);
            rc = DSQ_EINVAL;
        } else if (v < o->min || v > o->max) {
            fail_range(err, err_len, src, text, NULL, o->min, o->max, "%.0f", "");
            rc = DSQ_EINVAL;
        } else {
            *(int *)field = (int)v;
        }
        break;
    }
    case T_FLOAT: {
        double v;
        errno = 0;
        v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v) ||
            isspace((unsigned char)*text)) {
            fail(err, err_len, "%s: expected a number, got '%s'", src, text);
            rc = DSQ_EINVAL;
        } else if (v < o->min || v > o->max) {
            fail_range(err, err_len, src, text, NULL, o->min, o->max, "%g", "");
            rc = DSQ_EINVAL;
        } else {
            *(double *)field = v;
        }
        break;
    }
    case T_BOOL:
        if (!strcasecmp(text, "true") || !strcmp(text, "1") ||
            !strcasecmp(text, "yes") || !strcasecmp(text, "on")) {
            *(bool *)field = true;
        } else if (!strcasecmp(text, "false") || !strcmp(text, "0") ||
                   !strcasecmp(text, "no") || !strcasecmp(text, "off")) {
            *(bool *)field = false;
        } else {
            fail(err, err_len, "%s: expected true or false, got '%s'", src,
                 text);
            rc = DSQ_EINVAL;
        }
        break;
    case T_BYTES: {
        int64_t v = 0;
        if (dsq_options_parse_bytes(text, &v) != DSQ_OK) {
            fail(err, err_len, "%s: expected a byte size like 512MiB, got '%s'",
                 src, text);
            rc = DSQ_EINVAL;
        } else if ((double)v < o->min || (double)v > o->max) {
            /* K/M/G are powers of 1000, KiB/MiB/GiB of 1024: say which */
            char what[48];
            snprintf(what, sizeof(what), " (%lld bytes)", (long long)v);
            fail_range(err, err_len, src, text, what, o->min, o->max, "%.0f", " bytes");
            rc = DSQ_EINVAL;
        } else {
            *(int64_t *)field = v;
        }
        break;
    }
    }
    return rc;
}

static int apply_json(dsq_options_t *opts, const char *path, char *err,
                      size_t err_len)
{
    int rc = DSQ_EINVAL;
    char *buf = NULL;
    long size;
    cJSON *root = NULL, *it;
    dsq_json_error_t je;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail(err, err_len, "--config %s: %s", path, strerror(errno));
        return DSQ_EINVAL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0 || size > (1 << 24)) {
        fail(err, err_len, "--config %s: %s", path, "cannot read");
        goto undo_file;
    }
    buf = malloc((size_t)size + 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fail(err, err_len, "--config %s: %s", path, "cannot read");
        goto undo_file;
    }
    buf[size] = '\0';
    /* strict JSON first (server/json.h): a key set twice is an error here
     * too, not "the first one wins" */
    if (dsq_json_check(buf, (size_t)size, &je) != DSQ_OK) {
        char why[sizeof(je.message) + 32];
        snprintf(why, sizeof(why), "%s%s",
                 je.fault == DSQ_JSON_SYNTAX || je.fault == DSQ_JSON_BAD_UTF8
                     ? "not valid JSON: " : "", je.message);
        fail(err, err_len, "--config %s: %s", path, why);
        goto undo_file;
    }
    root = cJSON_Parse(buf);
    if (!cJSON_IsObject(root)) {
        fail(err, err_len, "--config %s: %s", path, "not a JSON object");
        goto undo_file;
    }
    rc = DSQ_OK;
    cJSON_ArrayForEach(it, root) {
        char text[64], src[160];
        const char *val = text;
        const opt_t *o = find(it->string, strlen(it->string));
        snprintf(src, sizeof(src), "config key \"%.100s\"", it->string);
        if (!o || !strcmp(o->name, "config") || !strcmp(o->name, "help") ||
            !strcmp(o->name, "version")) {
            fail(err, err_len, "--config %s: unknown key \"%s\"", path,
                 it->string);
            rc = DSQ_EINVAL;
            break;
        }
        if (cJSON_IsString(it))
            val = it->valuestring;
        else if (cJSON_IsBool(it))
            snprintf(text, sizeof(text), "%s", cJSON_IsTrue(it) ? "true" : "false");
        else if (cJSON_IsNumber(it))
            snprintf(text, sizeof(text), "%.17g", it->valuedouble);
        else if (cJSON_IsNull(it))
            continue;
        else {
            fail(err, err_len, "%s: %s", src, "expected a string, number or boolean");
            rc = DSQ_EINVAL;
            break;
        }
        if (o->type == T_STR && !cJSON_IsString(it)) {
            fail(err, err_len, "%s: %s", src, "expected a string");
            rc = DSQ_EINVAL;
            break;
        }
        rc = set_value(opts, o, val, src, err, err_len);
        if (rc != DSQ_OK)
            break;
    }
undo_file:
    cJSON_Delete(root);
    free(buf);
    fclose(f);
    return rc;
}

static void env_name(const opt_t *o, char *buf, size_t len)
{
    size_t i = 0, j;
    if (o->env) {
        snprintf(buf, len, "%s", o->env);
        return;
    }
    snprintf(buf, len, "DSQ_");
    j = 4;
    for (; o->name[i] && j + 1 < len; i++, j++)
        buf[j] = o->name[i] == '-' ? '_' : (char)toupper((unsigned char)o->name[i]);
    buf[j] = '\0';
}

/* --allowed-origins: "*" or comma-separated origins as a browser sends
 * them in Origin (scheme://host[:port]: no path, no trailing slash),
 * checked at start so that a typo is an error, not an origin that never
 * matches. */
static int check_origins(const char *list, char *err, size_t err_len)
{
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && *p == ' ') { p++; len--; }
        while (len && p[len - 1] == ' ') len--;
        char one[256];
        snprintf(one, sizeof(one), "%.*s", (int)(len < 255 ? len : 255), p);
        const char *host = strstr(one, "://");
        bool ok = !strcmp(one, "*") ||
                  (host && host > one && host[3] && !strchr(host + 3, '/') &&
                   strspn(one, "abcdefghijklmnopqrstuvwxyz0123456789+-.") == (size_t)(host - one));
        if (!ok) {
            fail(err, err_len, "--allowed-origins: '%s' is not an origin (scheme://host[:port] "
                 "as a browser sends it, e.g. http://localhost:3000: no path, no trailing "
                 "slash; or *)%s", one, "");
            return DSQ_EINVAL;
        }
        p = comma ? comma + 1 : NULL;
    }
    return DSQ_OK;
}

int dsq_options_load(dsq_options_t *o, int argc, char *const *argv,
                     dsq_getenv_fn getenv_fn, char *err, size_t err_len)
{
    int rc = DSQ_OK;
    const char *config = NULL;
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < N_OPTS && rc == DSQ_OK; i++)
        if (table[i].def)
            rc = set_value(o, &table[i], table[i].def, table[i].name, err,
                           err_len);
    if (rc != DSQ_OK)
        return rc;

    /* The config file comes first in precedence order, so find it early:
     * the last --config on the command line, else DSQ_CONFIG. */
    if (getenv_fn)
        config = getenv_fn("DSQ_CONFIG");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            config = argv[i] + 9;
    }
    if (config && *config) {
        rc = apply_json(o, config, err, err_len);
        if (rc == DSQ_OK)
            rc = set_value(o, find("config", 6), config, "--config", err, err_len);
        if (rc != DSQ_OK)
            return rc;
    }

    for (size_t i = 0; getenv_fn && i < N_OPTS && rc == DSQ_OK; i++) {
        char name[64];
        const char *v;
        size_t off = table[i].offset;
        if (off == offsetof(dsq_options_t, config) ||
            off == offsetof(dsq_options_t, help) ||
            off == offsetof(dsq_options_t, version))
            continue;
        env_name(&table[i], name, sizeof(name));
        v = getenv_fn(name);
        if (v && *v)
            rc = set_value(o, &table[i], v, name, err, err_len);
    }

    bool positional = false, model_flag = false;
    for (int i = 1; i < argc && rc == DSQ_OK; i++) {
        const char *a = argv[i], *eq = NULL, *val = NULL;
        const opt_t *opt = NULL;
        char src[128];
        for (size_t k = 0; k < N_ALIASES && !opt; k++) {
            size_t n = strlen(aliases[k].alias);
            if (!strncmp(a, aliases[k].alias, n) && (a[n] == '\0' || (a[1] == '-' && a[n] == '='))) {
                opt = find(aliases[k].name, strlen(aliases[k].name));
                eq = a[n] == '=' ? a + n : NULL;
            }
        }
        if (!opt && a[0] != '-' && !positional) {
            /* users: `dsqd MODEL`, as `vllm serve MODEL` and llama-server */
            if (model_flag) {
                fail(err, err_len, "the model is given twice (%s and --model)", a, "");
                rc = DSQ_EINVAL;
                break;
            }
            positional = true;
            rc = set_value(o, find("model", 5), a, "MODEL", err, err_len);
            continue;
        }
        if (!opt && strncmp(a, "--", 2) != 0) {
            fail(err, err_len, "unexpected argument '%s'%s", a,
                 positional && a[0] != '-' ? " (one MODEL only)" : "");
            rc = DSQ_EINVAL;
            break;
        }
        if (!opt) {
            a += 2;
            eq = strchr(a, '=');
            opt = find(a, eq ? (size_t)(eq - a) : strlen(a));
        }
        if (!opt) {
            fail(err, err_len, "unknown option '%s' (see --help)%s", argv[i], "");
            rc = DSQ_EINVAL;
            break;
        }
        if (opt->offset == offsetof(dsq_options_t, model)) {
            model_flag = true;
            if (positional) {
                fail(err, err_len, "the model is given twice (MODEL and %s)%s", argv[i], "");
                rc = DSQ_EINVAL;
                break;
            }
        }
        snprintf(src, sizeof(src), "--%s", opt->name);
        if (eq)
            val = eq + 1;
        else if (opt->type == T_BOOL) {
            /* users: `--flag false` (the next word a boolean) is read as
             * --flag=false, never as a positional MODEL */
            static const char *const words[] = {"true", "false", "yes", "no", "on", "off",
                                                "1", "0"};
            val = "true";
            for (size_t k = 0; i + 1 < argc && k < sizeof(words) / sizeof(words[0]); k++)
                if (!strcasecmp(argv[i + 1], words[k])) {
                    val = argv[++i];
                    break;
                }
        }
        else if (i + 1 < argc)
            val = argv[++i];
        else {
            fail(err, err_len, "%s needs a value%s", src, "");
            rc = DSQ_EINVAL;
            break;
        }
        rc = set_value(o, opt, val, src, err, err_len);
    }
    if (rc == DSQ_OK && o->allowed_origins)
        rc = check_origins(o->allowed_origins, err, err_len);
    if (rc == DSQ_OK && o->speculative_ngram_min > o->speculative_ngram_max) {
        char a[16], b[16];
        snprintf(a, sizeof(a), "%d", o->speculative_ngram_min);
        snprintf(b, sizeof(b), "%d", o->speculative_ngram_max);
        fail(err, err_len, "--speculative-ngram-min %s is above --speculative-ngram-max %s", a,
             b);
        rc = DSQ_EINVAL;
    }
    const bool draft = o->draft_model && *o->draft_model;
    if (rc == DSQ_OK && o->speculative_mtp && (draft || o->speculative_ngram > 0)) {
        fail(err, err_len, "--speculative-mtp and %s are two proposers: use one%s",
             draft ? "--draft-model" : "--speculative-ngram", "");
        rc = DSQ_EINVAL;
    }
    if (rc == DSQ_OK && draft && o->speculative_ngram > 0) {
        fail(err, err_len, "--draft-model and --speculative-ngram are two proposers: use one%s%s",
             "", "");
        rc = DSQ_EINVAL;
    }
    return rc;
}

void dsq_options_deinit(dsq_options_t *o)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        if (table[i].type == T_STR) {
            char **p = (char **)((char *)o + table[i].offset);
            free(*p);
            *p = NULL;
        }
    }
}

void dsq_options_help(FILE *f)
{
    fprintf(f, "usage: dsqd [MODEL] [options]   (MODEL, -m MODEL or --model MODEL)\n\n"
               "OpenAI-compatible completion server. Every option is also a key of the\n"
               "--config JSON file and an environment variable DSQ_<NAME>; precedence:\n"
               "flags > environment > config file > defaults.\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &table[i];
        char lhs[64], env[64];
        static const char *tn[] = {"STR", "INT", "NUM", "", "BYTES"};
        const char *meta = o->choices ? o->choices : tn[o->type];
        char al[32] = "";
        for (size_t k = 0; k < N_ALIASES; k++)
            if (!strcmp(aliases[k].name, o->name))
                snprintf(al + strlen(al), sizeof(al) - strlen(al), "%s, ", aliases[k].alias);
        snprintf(lhs, sizeof(lhs), "%s--%s%s%s", al, o->name, *meta ? " " : "", meta);
        env_name(o, env, sizeof(env));
        fprintf(f, "  %-44s %s", lhs, o->help);
        if (o->def && o->type != T_BOOL)
            fprintf(f, " [default: %s]", o->def);
        fprintf(f, " (env %s)\n", env);
    }
}

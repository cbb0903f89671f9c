/* dsq-run: run one prompt through the engine from the command line.
 *
 * It uses the same engine API as dsqd (dsq_engine_create, dsq_req_*), so
 * what it prints is what the server would send. Text goes to stdout as it
 * is produced; with --ids two lines "prompt: ID ..." (BOS included when the
 * model adds one) and "output: ID ..." instead. Timing goes to stderr. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsq_config.h"
#include "engine/serve/engine.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/text/tokenizer.h"

static const char usage[] =
    "usage: dsq-run --model PATH --prompt TEXT [-n N] [options]\n"
    "  --model PATH         .gguf file, Hugging Face directory or llama2.c .bin\n"
    "  --tokenizer PATH     separate tokenizer (llama2.c tok*.bin, tokenizer.json)\n"
    "  --prompt TEXT        prompt text (special tokens like <|im_start|> are parsed)\n"
    "  -n N                 tokens to generate (default 32)\n"
    "  --temperature T      0 = greedy (default 0)\n"
    "  --top-p P, --top-k K, --seed S\n"
    "  --ignore-eos         keep generating after end-of-sequence tokens\n"
    "  --no-bos             do not add BOS even if the model asks for it\n"
    "  --ids                print prompt and output token ids instead of text\n"
    "  --threads T          CPU threads (default: all cores)\n"
    "  --quantize int4      round 8/16/32-bit weights to INT4 at load (RTN)\n"
    "  --group-size G       INT4 group size with --quantize (32, 64, 128)\n"
    "  --kv-cache-dtype D   auto (default: fp32 for FP32 models, else fp16), fp16, fp32, int8\n"
    "  --activation-dtype A int8 (default: int8 activations in quantized matmuls, fast)\n"
    "                       or fp32 (exact W*x up to fp32 rounding, slower)\n"
    "  --help, --version\n";

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready;
} waiter_t;

static void on_notify(dsq_req_t *r, void *user)
{
    (void)r;
    waiter_t *w = user;
    pthread_mutex_lock(&w->mu);
    w->ready = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < INT_MIN || v > INT_MAX)
        return DSQ_EINVAL;
    *out = (int)v;
    return DSQ_OK;
}

static int parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s)
        return DSQ_EINVAL;
    *out = v;
    return DSQ_OK;
}

int main(int argc, char **argv)
{
    dsq_engine_opts_t eo = {0};
    dsq_sampling_t sp = {.max_tokens = 32, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1};
    const char *prompt = NULL;
    int ids = 0, no_bos = 0, bad = 0;
    const char *kvd = NULL;
    const char *actd = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("dsq-run %s\n", DSQ_VERSION);
            return 0;
        } else if (!strcmp(a, "--ids")) {
            ids = 1;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            sp.ignore_eos = true;
        } else if (!v) {
            fprintf(stderr, "dsq-run: %s needs a value or is unknown\n", a);
            return 2;
        } else {
            i++;
            if (!strcmp(a, "--model")) eo.model_path = v;
            else if (!strcmp(a, "--tokenizer")) eo.tokenizer_path = v;
            else if (!strcmp(a, "--prompt")) prompt = v;
            else if (!strcmp(a, "-n")) bad |= parse_int(v, &sp.max_tokens);
            else if (!strcmp(a, "--temperature")) bad |= parse_float(v, &sp.temperature);
            else if (!strcmp(a, "--top-p")) bad |= parse_float(v, &sp.top_p);
            else if (!strcmp(a, "--top-k")) bad |= parse_int(v, &sp.top_k);
            else if (!strcmp(a, "--seed")) {
                int s;
                bad |= parse_int(v, &s);
                sp.seed = (uint64_t)s;
                sp.has_seed = true;
            } else if (!strcmp(a, "--threads")) bad |= parse_int(v, &eo.n_threads);
            else if (!strcmp(a, "--quantize")) eo.quantize = v;
            else if (!strcmp(a, "--group-size")) bad |= parse_int(v, &eo.quant_group_size);
            else if (!strcmp(a, "--kv-cache-dtype")) kvd = v;
            else if (!strcmp(a, "--activation-dtype")) actd = v;
            else {
                fprintf(stderr, "dsq-run: unknown option %s (see --help)\n", a);
                return 2;
            }
            if (bad) {
                fprintf(stderr, "dsq-run: bad value for %s: %s\n", a, v);
                return 2;
            }
        }
    }
    if (!eo.model_path || !prompt) {
        fprintf(stderr, "dsq-run: --model and --prompt are required (see --help)\n");
        return 2;
    }
    if (sp.max_tokens < 0 || sp.temperature < 0 || sp.top_p <= 0 || sp.top_p > 1) {
        fprintf(stderr, "dsq-run: -n must be >= 0, --temperature >= 0, --top-p in (0, 1]\n");
        return 2;
    }
    eo.kv_cache_dtype = DSQ_ENGINE_KV_AUTO;
    if (kvd && strcmp(kvd, "int8") == 0)
        eo.kv_cache_dtype = DSQ_ENGINE_KV_INT8;
    else if (kvd && strcmp(kvd, "fp16") == 0)
        eo.kv_cache_dtype = DSQ_ENGINE_KV_F16;
    else if (kvd && strcmp(kvd, "fp32") == 0)
        eo.kv_cache_dtype = DSQ_ENGINE_KV_F32;
    else if (kvd && strcmp(kvd, "auto") != 0) {
        fprintf(stderr, "dsq-run: --kv-cache-dtype must be auto, fp16, fp32 or int8\n");
        return 2;
    }
    if (actd && strcmp(actd, "fp32") == 0)
        eo.activation_dtype = DSQ_ENGINE_ACT_F32;
    else if (actd && strcmp(actd, "int8") != 0) {
        fprintf(stderr, "dsq-run: --activation-dtype must be int8 or fp32\n");
        return 2;
    }
    if (eo.quantize && strcmp(eo.quantize, "int4") != 0 && strcmp(eo.quantize, "none") != 0) {
        fprintf(stderr, "dsq-run: --quantize must be int4 or none\n");
        return 2;
    }
    if (!getenv("DSQ_LOG_LEVEL"))
        dsq_log_set_level("warn");
    else
        dsq_log_set_level(getenv("DSQ_LOG_LEVEL"));

    char err[512] = "";
    int status = 1;
    int32_t *pids = NULL;
    size_t n_pids = 0;
    dsq_req_t *req = NULL;
    waiter_t w = {.ready = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    double t0 = now_s();
    dsq_engine_t *e = dsq_engine_create(&eo, err, sizeof(err));
    if (!e) {
        fprintf(stderr, "dsq-run: %s\n", err);
        goto out;
    }
    double t_load = now_s() - t0;
    const dsq_tokenizer_t *tok = dsq_engine_tokenizer(e);
    unsigned flags = DSQ_TOK_PARSE_SPECIAL;
    if (!no_bos && dsq_tokenizer_add_bos(tok))
        flags |= DSQ_TOK_ADD_BOS;
    if (dsq_tokenizer_encode(tok, prompt, strlen(prompt), flags, &pids, &n_pids) != 0 ||
        n_pids == 0) {
        fprintf(stderr, "dsq-run: the prompt encodes to no tokens\n");
        goto out;
    }
    req = dsq_req_create(pids, (int)n_pids, &sp, on_notify, &w, err, sizeof(err));
    if (!req) {
        fprintf(stderr, "dsq-run: %s\n", err);
        goto out;
    }
    int rc = dsq_engine_submit(e, req);
    if (rc) {
        fprintf(stderr, "dsq-run: submit failed: %s (prompt %zu tokens + %d > max_model_len %d?)\n",
                dsq_strerror(rc), n_pids, sp.max_tokens, dsq_engine_max_model_len(e));
        goto out;
    }
    if (ids) {
        printf("prompt:");
        for (size_t i = 0; i < n_pids; i++)
            printf(" %d", pids[i]);
        printf("\noutput:");
    }
    double t_start = now_s(), t_first = 0;
    int n_gen = 0;
    for (;;) {
        dsq_output_t ev;
        int got = dsq_req_next(req, &ev);
        if (got < 0)
            break;
        if (got == 0) {
            pthread_mutex_lock(&w.mu);
            while (!w.ready)
                pthread_cond_wait(&w.cv, &w.mu);
            w.ready = 0;
            pthread_mutex_unlock(&w.mu);
            continue;
        }
        if (ev.n_tokens > 0 && t_first == 0)
            t_first = now_s();
        n_gen += ev.n_tokens;
        if (ids)
            for (int i = 0; i < ev.n_tokens; i++)
                printf(" %d", ev.tokens[i]);
        else
            fwrite(ev.text, 1, ev.text_len, stdout);
        fflush(stdout);
        if (ev.finish == DSQ_FINISH_ABORT) {
            fprintf(stderr, "\ndsq-run: request aborted\n");
            dsq_output_free(&ev);
            goto out;
        }
        dsq_output_free(&ev);
    }
    printf("\n");
    double t_end = now_s();
    double gen_s = t_first > 0 ? t_end - t_first : 0;
    fprintf(stderr, "dsq-run: load %.0f ms, prompt %zu tokens, first token %.1f ms, "
            "%d tokens, %.1f tok/s generation\n", t_load * 1000, n_pids,
            t_first > 0 ? (t_first - t_start) * 1000 : 0.0, n_gen,
            n_gen > 1 && gen_s > 0 ? (n_gen - 1) / gen_s : 0.0);
    status = 0;
out:
    dsq_req_unref(req);
    free(pids);
    dsq_engine_destroy(e);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return status;
}

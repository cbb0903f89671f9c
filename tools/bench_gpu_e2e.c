/* dsq-bench gpu, end to end: the whole engine (loader, planner, scheduler,
 * model graph, sampler) on the CUDA backend with a model of DeepSeek-Coder-
 * 6.7B's shapes and random weights, the `e2e` rows of `dsq-bench gpu`.
 *
 * The model: a llama GGUF (GGUF spec v3, github.com/ggml-org/ggml
 * docs/gguf.md) written to $TMPDIR (default /tmp) and unlinked as soon as
 * the engine has loaded it: 32 layers, n_embd 4096, 32 heads of 128 (MHA),
 * n_ff 11008, vocab 32256, RoPE base 100000 (deepseek-coder-6.7b's
 * config.json); every matrix Q4_0 (ggml's block of 32: fp16 d, 16 bytes of
 * nibbles, w = (q - 8) d; the INT4 family dsq repacks to its native layout),
 * norms F32; a llama (SPM) vocabulary of <unk>, <s>, </s>, the 256 byte
 * tokens and placeholder pieces. 3.8 GB on disk; --quick: 2 layers of 64
 * (the simulator smoke). The weights are uniform random nibbles with
 * d = 0.22 / sqrt(k) (unit-variance products): timing does not depend on
 * values, and the outputs stay finite.
 *
 * The engine runs with dsqd's defaults (device "cuda", greedy sampling with
 * ignore_eos, INT8 activations, FP16 KV, prefix caching off) but an explicit
 * KV budget (8 GiB; max_model_len 1024), so the figures do not depend on how
 * much memory the device has. Rows:
 *   load       dsq_engine_create: GGUF open, repack, upload, KV (seconds)
 *   ttft       one 512-token prompt, max_tokens 1: submit to the first
 *              token event, median of 3 (ms)
 *   decode b1  one request, 32-token prompt, 128 new tokens: (tokens - 1) /
 *              (last - first token time) (tok/s)
 *   decode b64 64 requests at once, 32-token prompts (distinct), 128 new
 *              tokens each: tokens delivered while all 64 are decoding
 *              (after the last first token, up to the first request's
 *              end) / that time (tok/s, all sequences together)
 * Target for an H200: decode b1 >= 850 tok/s (3.6 GB of weights read per
 * token at about 4 TB/s, less launch overhead). */
#include "dsq_config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/io/tensor.h"
#include "engine/serve/engine.h"

int dsq__bench_gpu_e2e(bool quick, FILE *json);
int dsq__bench_gpu_write_model(bool quick, const char *path);

/* ------------------------------------------------------ GGUF writer */

typedef struct shape {
    int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    double rope_theta;
    const char *name;
} shape_t;

static const shape_t SHAPE_67B = {32, 4096, 32, 32, 11008, 32256, 16384, 100000.0,
                                  "deepseek-coder-6.7b shapes (random Q4_0)"};
static const shape_t SHAPE_QUICK = {2, 64, 4, 2, 128, 320, 512, 10000.0,
                                    "tiny llama (random Q4_0)"};

enum { GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STR = 8,
       GGUF_ARR = 9 };

typedef struct wr {
    FILE *f;
    uint64_t rng;
    int err;
} wr_t;

static void put(wr_t *w, const void *p, size_t n)
{
    if (!w->err && fwrite(p, 1, n, w->f) != n)
        w->err = errno ? errno : EIO;
}
static void put_u32(wr_t *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(wr_t *w, uint64_t v) { put(w, &v, 8); }
static void put_str(wr_t *w, const char *s)
{
    put_u64(w, strlen(s));
    put(w, s, strlen(s));
}
static void kv_u32(wr_t *w, const char *k, uint32_t v)
{
    put_str(w, k);
    put_u32(w, GGUF_U32);
    put_u32(w, v);
}
static void kv_f32(wr_t *w, const char *k, float v)
{
    put_str(w, k);
    put_u32(w, GGUF_F32);
    put(w, &v, 4);
}
static void kv_str(wr_t *w, const char *k, const char *v)
{
    put_str(w, k);
    put_u32(w, GGUF_STR);
    put_str(w, v);
}
static void kv_bool(wr_t *w, const char *k, bool v)
{
    uint8_t b = v;
    put_str(w, k);
    put_u32(w, GGUF_BOOL);
    put(w, &b, 1);
}

static uint64_t next64(wr_t *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

typedef struct tdesc {
    char name[64];
    dsq_type_t type;
    int64_t ne0, ne1;            /* ne1 = 1 for vectors */
    size_t bytes, offset;
} tdesc_t;

#define ALIGN 32u

static size_t pad_to(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int add_t(tdesc_t *t, int *n, size_t *off, const char *name, dsq_type_t type,
                 int64_t ne0, int64_t ne1)
{
    tdesc_t *d = &t[(*n)++];
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->type = type;
    d->ne0 = ne0;
    d->ne1 = ne1;
    if (dsq_type_bytes(type, ne0 * ne1, &d->bytes))
        return DSQ_EINVAL;
    d->offset = *off;
    *off = pad_to(*off + d->bytes);
    return 0;
}

/* Tensor data: Q4_0 blocks with random nibbles and d = 0.22/sqrt(ne0), or
 * F32 norms near 1. Written in 1 MiB chunks. */
static void write_data(wr_t *w, const tdesc_t *d)
{
    enum { CHUNK = 1 << 20 };
    static uint8_t buf[CHUNK];
    if (d->type == DSQ_TYPE_F32) {
        for (int64_t i = 0; i < d->ne0 * d->ne1; i++) {
            float v = 1.0f + (float)((int)(next64(w) >> 40) % 201 - 100) * 1e-3f;
            put(w, &v, 4);
        }
    } else {
        const uint16_t dh = dsq_fp32_to_fp16(0.22f / sqrtf((float)d->ne0));
        const size_t blk = 18, per = CHUNK / blk;
        size_t n_blk = d->bytes / blk;
        while (n_blk && !w->err) {
            size_t m = n_blk < per ? n_blk : per;
            for (size_t b = 0; b < m; b++) {
                uint8_t *p = buf + b * blk;
                memcpy(p, &dh, 2);
                uint64_t r0 = next64(w), r1 = next64(w);
                memcpy(p + 2, &r0, 8);
                memcpy(p + 10, &r1, 8);
            }
            put(w, buf, m * blk);
            n_blk -= m;
        }
    }
    static const uint8_t zeros[ALIGN];
    put(w, zeros, pad_to(d->bytes) - d->bytes);
}

/* Write the model to path. Returns 0 or an errno-style code. */
static int write_model(const char *path, const shape_t *s)
{
    const int nt_max = 3 + 9 * s->n_layer;
    tdesc_t *t = calloc((size_t)nt_max, sizeof(*t));
    if (!t)
        return DSQ_ENOMEM;
    int n = 0, rc = 0;
    size_t off = 0;
    const int64_t d = s->n_embd, hd = s->n_embd / s->n_head, kvd = hd * s->n_head_kv;
    rc |= add_t(t, &n, &off, "token_embd.weight", DSQ_TYPE_Q4_0, d, s->n_vocab);
    rc |= add_t(t, &n, &off, "output_norm.weight", DSQ_TYPE_F32, d, 1);
    rc |= add_t(t, &n, &off, "output.weight", DSQ_TYPE_Q4_0, d, s->n_vocab);
    for (int l = 0; l < s->n_layer && !rc; l++) {
        char nm[64];
#define T(suffix, type, a, b)                                            \
        snprintf(nm, sizeof(nm), "blk.%d." suffix, l);                   \
        rc |= add_t(t, &n, &off, nm, type, a, b)
        T("attn_norm.weight", DSQ_TYPE_F32, d, 1);
        T("attn_q.weight", DSQ_TYPE_Q4_0, d, d);
        T("attn_k.weight", DSQ_TYPE_Q4_0, d, kvd);
        T("attn_v.weight", DSQ_TYPE_Q4_0, d, kvd);
        T("attn_output.weight", DSQ_TYPE_Q4_0, d, d);
        T("ffn_norm.weight", DSQ_TYPE_F32, d, 1);
        T("ffn_gate.weight", DSQ_TYPE_Q4_0, d, s->n_ff);
        T("ffn_up.weight", DSQ_TYPE_Q4_0, d, s->n_ff);
        T("ffn_down.weight", DSQ_TYPE_Q4_0, s->n_ff, d);
#undef T
    }
    if (rc) {
        free(t);
        return DSQ_EINVAL;
    }
    wr_t w = {.f = fopen(path, "wb"), .rng = 0x2545f4914f6cdd1dull};
    if (!w.f) {
        free(t);
        return errno ? errno : EIO;
    }
    setvbuf(w.f, NULL, _IOFBF, 1 << 22);
    put(&w, "GGUF", 4);
    put_u32(&w, 3);
    put_u64(&w, (uint64_t)n);
    put_u64(&w, 17);                                   /* KV pairs below */
    kv_str(&w, "general.architecture", "llama");
    kv_str(&w, "general.name", s->name);
    kv_u32(&w, "general.alignment", ALIGN);
    kv_u32(&w, "llama.block_count", (uint32_t)s->n_layer);
    kv_u32(&w, "llama.context_length", (uint32_t)s->n_ctx);
    kv_u32(&w, "llama.embedding_length", (uint32_t)s->n_embd);
    kv_u32(&w, "llama.feed_forward_length", (uint32_t)s->n_ff);
    kv_u32(&w, "llama.attention.head_count", (uint32_t)s->n_head);
    kv_u32(&w, "llama.attention.head_count_kv", (uint32_t)s->n_head_kv);
    kv_f32(&w, "llama.rope.freq_base", (float)s->rope_theta);
    kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_u32(&w, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    kv_bool(&w, "tokenizer.ggml.add_bos_token", true);
    /* the vocabulary: <unk> <s> </s>, <0x00>..<0xFF>, then "▁t<i>" */
    put_str(&w, "tokenizer.ggml.tokens");
    put_u32(&w, GGUF_ARR);
    put_u32(&w, GGUF_STR);
    put_u64(&w, (uint64_t)s->n_vocab);
    for (int i = 0; i < s->n_vocab; i++) {
        char tok[32];
        if (i < 3)
            snprintf(tok, sizeof(tok), "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(tok, sizeof(tok), "<0x%02X>", i - 3);
        else
            snprintf(tok, sizeof(tok), "\xe2\x96\x81t%d", i);
        put_str(&w, tok);
    }
    put_str(&w, "tokenizer.ggml.token_type");
    put_u32(&w, GGUF_ARR);
    put_u32(&w, GGUF_I32);
    put_u64(&w, (uint64_t)s->n_vocab);
    for (int i = 0; i < s->n_vocab; i++)
        put_u32(&w, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
    for (int i = 0; i < n; i++) {
        put_str(&w, t[i].name);
        bool vec = t[i].ne1 == 1;
        put_u32(&w, vec ? 1 : 2);
        put_u64(&w, (uint64_t)t[i].ne0);
        if (!vec)
            put_u64(&w, (uint64_t)t[i].ne1);
        put_u32(&w, (uint32_t)t[i].type);
        put_u64(&w, t[i].offset);
    }
    long pos = ftell(w.f);
    static const uint8_t zeros[ALIGN];
    if (pos < 0)
        w.err = EIO;
    else
        put(&w, zeros, pad_to((size_t)pos) - (size_t)pos);
    for (int i = 0; i < n && !w.err; i++)
        write_data(&w, &t[i]);
    if (fclose(w.f) && !w.err)
        w.err = errno ? errno : EIO;
    free(t);
    return w.err;
}

/* dsq-bench gpu --write-model PATH: the e2e model alone, for dsqd or
 * dsq-inspect. */
int dsq__bench_gpu_write_model(bool quick, const char *path)
{
    int rc = write_model(path, quick ? &SHAPE_QUICK : &SHAPE_67B);
    if (rc) {
        fprintf(stderr, "dsq-bench gpu: cannot write %s: %s\n", path,
                rc > 0 ? strerror(rc) : dsq_strerror(rc));
        unlink(path);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------ the engine */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
} waiter_t;

static waiter_t W = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void notify(dsq_req_t *r, void *user)
{
    (void)r;
    (void)user;
    pthread_mutex_lock(&W.mu);
    W.pending = 1;
    pthread_cond_broadcast(&W.cv);
    pthread_mutex_unlock(&W.mu);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct track {
    dsq_req_t *r;
    double t_submit, t_first, t_last;
    int n_tokens;
    bool done;
    int n_ev;
    double *ev_t;                 /* [max_tokens + 2] event times */
    int *ev_n;                    /* tokens in each event */
} track_t;

/* Submit n requests (prompt_len random ids each, salted by request) and
 * collect every event with its arrival time until all ended. */
static int run_wave(dsq_engine_t *e, int n, int prompt_len, int max_tokens, int n_vocab,
                    uint64_t salt, track_t *tr, char *err, size_t err_len)
{
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt_len);
    if (!ids)
        return DSQ_ENOMEM;
    dsq_sampling_t sp = {.max_tokens = max_tokens, .temperature = 0, .top_p = 1, .n = 1,
                         .repetition_penalty = 1, .logprobs = -1, .ignore_eos = true};
    int rc = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ salt;
    memset(tr, 0, sizeof(*tr) * (size_t)n);
    for (int i = 0; i < n && !rc; i++) {
        tr[i].ev_t = malloc(sizeof(double) * (size_t)(max_tokens + 2));
        tr[i].ev_n = malloc(sizeof(int) * (size_t)(max_tokens + 2));
        for (int j = 0; j < prompt_len; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ids[j] = 259 + (int32_t)(x % (uint64_t)(n_vocab - 259));
        }
        tr[i].r = dsq_req_create(ids, prompt_len, &sp, notify, NULL, err, err_len);
        if (!tr[i].r || !tr[i].ev_t || !tr[i].ev_n) {
            rc = tr[i].r ? DSQ_ENOMEM : DSQ_EINVAL;
            break;
        }
        tr[i].t_submit = now_s();
        rc = dsq_engine_submit(e, tr[i].r);
        if (rc)
            snprintf(err, err_len, "submit: %s", dsq_strerror(rc));
    }
    free(ids);
    for (int left = n; !rc && left > 0;) {
        pthread_mutex_lock(&W.mu);
        if (!W.pending) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&W.cv, &W.mu, &ts);
        }
        W.pending = 0;
        pthread_mutex_unlock(&W.mu);
        for (int i = 0; i < n; i++) {
            if (tr[i].done)
                continue;
            dsq_output_t ev;
            int got;
            while ((got = dsq_req_next(tr[i].r, &ev)) == 1) {
                double t = now_s();
                if (ev.n_tokens > 0) {
                    if (!tr[i].n_tokens)
                        tr[i].t_first = t;
                    tr[i].t_last = t;
                    tr[i].n_tokens += ev.n_tokens;
                    if (tr[i].n_ev < max_tokens + 2) {
                        tr[i].ev_t[tr[i].n_ev] = t;
                        tr[i].ev_n[tr[i].n_ev++] = ev.n_tokens;
                    }
                }
                bool abort = ev.finish == DSQ_FINISH_ABORT;
                dsq_output_free(&ev);
                if (abort) {
                    snprintf(err, err_len, "request %d aborted", i);
                    rc = DSQ_ESTATE;
                }
            }
            if (got < 0) {
                tr[i].done = true;
                left--;
                if (tr[i].n_tokens != max_tokens && !rc) {
                    snprintf(err, err_len, "request %d: %d tokens, wanted %d", i,
                             tr[i].n_tokens, max_tokens);
                    rc = DSQ_ESTATE;
                }
            }
        }
    }
    if (rc)
        for (int i = 0; i < n; i++)
            if (tr[i].r)
                dsq_engine_cancel(e, tr[i].r);
    return rc;
}

static void free_wave(track_t *tr, int n)
{
    for (int i = 0; i < n; i++) {
        dsq_req_unref(tr[i].r);
        free(tr[i].ev_t);
        free(tr[i].ev_n);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Decode tok/s of a wave: tokens delivered after the last first token, up
 * to the first request's last token, over that time. */
static double wave_tok_s(const track_t *tr, int n)
{
    double t0 = 0, t1 = INFINITY;
    for (int i = 0; i < n; i++) {
        if (tr[i].t_first > t0)
            t0 = tr[i].t_first;
        if (tr[i].t_last < t1)
            t1 = tr[i].t_last;
    }
    long tok = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < tr[i].n_ev; k++)
            if (tr[i].ev_t[k] > t0 && tr[i].ev_t[k] <= t1)
                tok += tr[i].ev_n[k];
    return t1 > t0 ? (double)tok / (t1 - t0) : 0;
}

int dsq__bench_gpu_e2e(bool quick, FILE *json)
{
    const shape_t *s = quick ? &SHAPE_QUICK : &SHAPE_67B;
    const int prompt_ttft = quick ? 16 : 512, n_ttft = quick ? 1 : 3;
    const int prompt_dec = quick ? 8 : 32, new_dec = quick ? 4 : 128;
    const int batch_big = quick ? 4 : 64;
    const char *tmpdir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/dsq-bench-e2e-%ld.gguf",
             tmpdir && *tmpdir ? tmpdir : "/tmp", (long)getpid());
    double t0 = now_s();
    int rc = write_model(path, s);
    if (rc) {
        fprintf(stderr, "dsq-bench gpu e2e: cannot write %s: %s\n", path,
                rc > 0 ? strerror(rc) : dsq_strerror(rc));
        unlink(path);
        return 1;
    }
    const double t_write = now_s() - t0;
    dsq_engine_opts_t o = {.model_path = path, .device = "cuda",
                           .max_model_len = quick ? 128 : 1024,
                           .max_num_seqs = batch_big,
                           .kv_cache_memory_bytes = quick ? 0 : 8LL << 30};
    char err[512] = "";
    t0 = now_s();
    dsq_engine_t *e = dsq_engine_create(&o, err, sizeof(err));
    const double t_load = now_s() - t0;
    unlink(path);
    if (!e) {
        fprintf(stderr, "dsq-bench gpu e2e: engine: %s\n", err);
        return 1;
    }
    dsq_engine_stats_t st;
    dsq_engine_stats(e, &st);
    printf("e2e    %s: model written in %.1f s, engine up in %.1f s, device memory "
           "%.1f MiB (planned %.1f MiB), %lld KV blocks\n", s->name, t_write, t_load,
           (double)st.device_allocated_bytes / (1 << 20),
           (double)st.device_planned_bytes / (1 << 20), (long long)st.kv_blocks_total);
    if (json)
        fprintf(json, "{\"bench\":\"e2e_load\",\"model\":\"%s\",\"write_s\":%.3f,\"load_s\":%.3f,"
                "\"device_allocated_bytes\":%lld,\"device_planned_bytes\":%lld}\n", s->name,
                t_write, t_load, (long long)st.device_allocated_bytes,
                (long long)st.device_planned_bytes);
    track_t *tr = calloc((size_t)batch_big, sizeof(*tr));
    double ttft[3] = {0};
    if (!tr)
        rc = DSQ_ENOMEM;
    /* warm-up: one short request (first-launch costs out of the figures) */
    if (!rc) {
        rc = run_wave(e, 1, prompt_dec, 2, s->n_vocab, 99, tr, err, sizeof(err));
        free_wave(tr, 1);
    }
    for (int k = 0; k < n_ttft && !rc; k++) {
        rc = run_wave(e, 1, prompt_ttft, 1, s->n_vocab, 100 + (uint64_t)k, tr, err,
                      sizeof(err));
        ttft[k] = (tr[0].t_first - tr[0].t_submit) * 1e3;
        free_wave(tr, 1);
    }
    if (!rc) {
        qsort(ttft, (size_t)n_ttft, sizeof(double), cmp_d);
        double med = ttft[n_ttft / 2];
        printf("e2e    ttft  prompt %4d tokens: %9.2f ms (median of %d)\n", prompt_ttft, med,
               n_ttft);
        if (json)
            fprintf(json, "{\"bench\":\"e2e_ttft\",\"prompt_tokens\":%d,\"ttft_ms\":%.3f,"
                    "\"runs\":%d}\n", prompt_ttft, med, n_ttft);
    }
    const int batches[2] = {1, batch_big};
    for (int b = 0; b < 2 && !rc; b++) {
        int nb = batches[b];
        rc = run_wave(e, nb, prompt_dec, new_dec, s->n_vocab, 200 + (uint64_t)b, tr, err,
                      sizeof(err));
        if (!rc) {
            double tps = nb == 1 ? (tr[0].t_last > tr[0].t_first ?
                                    (tr[0].n_tokens - 1) / (tr[0].t_last - tr[0].t_first) : 0)
                                 : wave_tok_s(tr, nb);
            printf("e2e    decode batch %3d, %d new tokens each: %10.1f tok/s%s\n", nb, new_dec,
                   tps, nb == 1 && !quick ? "   (H200 target >= 850)" : "");
            if (json)
                fprintf(json, "{\"bench\":\"e2e_decode\",\"batch\":%d,\"prompt_tokens\":%d,"
                        "\"new_tokens\":%d,\"tok_s\":%.3f}\n", nb, prompt_dec, new_dec, tps);
        }
        free_wave(tr, nb);
    }
    fflush(stdout);
    if (rc)
        fprintf(stderr, "dsq-bench gpu e2e: %s%s%s\n", dsq_strerror(rc), *err ? ": " : "",
                err);
    free(tr);
    dsq_engine_destroy(e);
    return rc ? 1 : 0;
}

/* dsq-bench serve: an HTTP load generator for OpenAI-compatible servers.
 *
 * N clients each keep one streamed /v1/completions request in flight (a
 * closed loop) until R requests have been sent. Every request asks for
 * exactly T new tokens (`ignore_eos: true`, greedy) after a prompt of P
 * token ids (an id array, so every server sees the same prompt length
 * whatever its tokenizer does); (P, T) come from a fixed mix, prompts from a
 * seeded generator, so two servers get the same request sequence.
 *
 * Measured per request, on the client's monotonic clock at the moment the
 * bytes arrive (libcurl's multi interface, one thread):
 *   TTFT  time from sending to the first SSE chunk with non-empty text;
 *   ITL   gaps between consecutive chunks with text (a chunk that carries
 *         several tokens gives one long gap; tok/chunk in the report says
 *         how often that happened);
 *   TPOT  (last text chunk - first text chunk) / (tokens - 1), as vLLM's
 *         benchmark_serving defines it; insensitive to chunking;
 *   E2E   send to end of stream.
 * Output tokens are the server's `usage.completion_tokens` (both dsqd with
 * `stream_options.include_usage` and llama.cpp's llama-server report it);
 * a request is a failure unless it returns 200, finishes its stream and
 * produced exactly T tokens. Percentiles interpolate linearly between
 * closest ranks (numpy's default).
 *
 * Targets are --url's (an already running server) and/or servers this
 * program starts itself, one after the other, on free 127.0.0.1 ports:
 * --dsqd PATH and --llama-server PATH with the same GGUF, threads, maximum
 * concurrency (--max-num-seqs / -np) and per-sequence context. With two
 * targets the report ends with their ratios. */
#include "dsq_config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "bench_http.h"

int dsq__bench_serve(int argc, char **argv);

#define MAX_MIX 16
#define MAX_TARGETS 4
#define MAX_EXTRA 32
#define RAW_KEEP 400            /* bytes of body kept for error messages */

typedef struct {
    int prompt_len, max_tokens;
} mix_t;

typedef struct {
    int n_clients, n_requests, n_mix, warmup;
    mix_t mix[MAX_MIX];
    uint64_t seed;
    int vocab;                  /* prompt ids are drawn from [100, vocab)   */
    double timeout_s;           /* per request                               */
    const char *model_name;     /* NULL: ask /v1/models                      */
    bool json;
    char *grammar;              /* --grammar FILE's text (GBNF), or NULL     */
    cJSON *schema;              /* --json-schema FILE's schema, or NULL      */
    bool constrained;           /* this pass sends "grammar": grammar, or
                                   "json_schema": schema                     */
    double open_rate;           /* --open-loop RATE: Poisson arrivals, req/s;
                                   0 = closed loop (--clients in flight)    */
    char **prompts;             /* --prompt-file: text prompts, used round
                                   robin instead of id arrays (their length
                                   is the server's usage.prompt_tokens)    */
    int n_prompts;
} load_t;

#define OPEN_LOOP_SLOTS 1024    /* requests in flight at most, open loop   */

/* One request in flight: its curl handle, SSE parser state, timings. */
typedef struct {
    int idx, prompt_len, max_tokens;
    CURL *easy;
    struct curl_slist *hdrs;
    char *body;
    char *line;                 /* bytes of the current, unfinished line    */
    size_t line_len, line_cap;
    char *data;                 /* "data:" payload of the current event     */
    size_t data_len, data_cap;
    char raw[RAW_KEEP + 1];     /* first bytes of the body                  */
    size_t raw_len;
    double t_start, t_end;
    double *chunk_t;            /* arrival time of each chunk with text     */
    int n_chunks, chunk_cap;
    int usage_tokens;           /* -1: no usage seen                         */
    int usage_prompt;           /* usage.prompt_tokens, -1: none            */
    long long draft_n, draft_acc; /* llama-server's timings.draft_n(_accepted) */
    long status;                /* HTTP status, once done                   */
    bool refused_event;         /* a queue_full error event in the stream   */
    bool done, finished, oom;
    char err[240];
} req_t;

/* What is kept of a finished request. */
typedef struct {
    double t_start, t_end;
    double *chunk_t;            /* [n_chunks], owned; NULL for failures     */
    int n_chunks, tokens;
    bool ok;
    bool refused;               /* HTTP 503                                  */
} done_t;

/* Everything the report needs from one target's run. */
typedef struct {
    char label[64], url[160];
    int n_req, n_ok;
    double dur_s;
    long long in_tokens, out_tokens, n_chunks;
    double req_s, out_tok_s;
    double ttft[3], itl[3], tpot[3], e2e[3];   /* p50, p99, mean; ms */
    int n_refused;              /* open loop: answered 503 (refused)      */
    double refuse[3];           /* their time to the 503; ms              */
    double offered_rate;        /* open loop: arrivals per second sent    */
    long long draft_n, draft_acc; /* speculative decoding: draft tokens scored
                                   and accepted (dsqd's /metrics counters, or
                                   llama-server's per-request timings)     */
    char first_err[300];
} stats_t;

/* Set by SIGINT/SIGTERM: the run stops, a started server is stopped. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* p50, p99 (linear interpolation between closest ranks) and mean of v,
 * sorted in place; NaN when n == 0. */
static void summarize(double *v, size_t n, double out[3])
{
    if (n == 0) {
        out[0] = out[1] = out[2] = NAN;
        return;
    }
    qsort(v, n, sizeof(*v), cmp_double);
    static const double q[2] = {0.50, 0.99};
    for (int i = 0; i < 2; i++) {
        double pos = q[i] * (double)(n - 1);
        size_t lo = (size_t)pos;
        size_t hi = lo + 1 < n ? lo + 1 : lo;
        out[i] = v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
    }
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    out[2] = sum / (double)n;
}

static bool grow(char **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    char *q = realloc(*p, c);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

/* One complete SSE event: "[DONE]" or a completion chunk / error object. */
static void on_event(req_t *r, double t)
{
    if (r->data_len == 0)
        return;
    r->data[r->data_len] = '\0';
    if (strcmp(r->data, "[DONE]") == 0) {
        r->done = true;
        return;
    }
    cJSON *o = cJSON_Parse(r->data);
    if (!o) {
        if (!r->err[0])
            snprintf(r->err, sizeof(r->err), "unparsable SSE data: %.120s", r->data);
        return;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    const cJSON *ec = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "code") : NULL;
    /* a refusal after the 200 went out (dsqd: held back, then refused) */
    if (cJSON_IsString(ec) && !strcmp(ec->valuestring, "queue_full"))
        r->refused_event = true;
    if (e && !r->err[0]) {
        const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
        snprintf(r->err, sizeof(r->err), "error event: %.200s",
                 cJSON_IsString(m) ? m->valuestring : "(no message)");
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    if (ch) {
        const cJSON *txt = cJSON_GetObjectItemCaseSensitive(ch, "text");
        if (cJSON_IsString(txt) && txt->valuestring[0]) {
            if (r->n_chunks == r->chunk_cap) {
                int c = r->chunk_cap ? 2 * r->chunk_cap : 64;
                double *p = realloc(r->chunk_t, (size_t)c * sizeof(*p));
                if (!p) {
                    r->oom = true;
                    cJSON_Delete(o);
                    return;
                }
                r->chunk_t = p;
                r->chunk_cap = c;
            }
            r->chunk_t[r->n_chunks++] = t;
        }
        if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason")))
            r->finished = true;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    const cJSON *ct = u ? cJSON_GetObjectItemCaseSensitive(u, "completion_tokens") : NULL;
    const cJSON *pt = u ? cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens") : NULL;
    if (cJSON_IsNumber(ct))
        r->usage_tokens = ct->valueint;
    if (cJSON_IsNumber(pt))
        r->usage_prompt = pt->valueint;
    /* llama-server: draft statistics of the request on its last chunk */
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(o, "timings");
    const cJSON *dn = tm ? cJSON_GetObjectItemCaseSensitive(tm, "draft_n") : NULL;
    const cJSON *da = tm ? cJSON_GetObjectItemCaseSensitive(tm, "draft_n_accepted") : NULL;
    if (cJSON_IsNumber(dn) && cJSON_IsNumber(da)) {
        r->draft_n = (long long)dn->valuedouble;
        r->draft_acc = (long long)da->valuedouble;
    }
    cJSON_Delete(o);
}

/* One line of the event stream (without its "\n" or "\r\n"). */
static void on_line(req_t *r, const char *s, size_t n, double t)
{
    if (n == 0) {
        on_event(r, t);
        r->data_len = 0;
        return;
    }
    if (n < 5 || memcmp(s, "data:", 5) != 0)
        return;                 /* comments, event:, id:, retry: */
    s += 5;
    n -= 5;
    if (n && *s == ' ') {
        s++;
        n--;
    }
    size_t need = r->data_len + n + 2;
    if (!grow(&r->data, &r->data_cap, need)) {
        r->oom = true;
        return;
    }
    if (r->data_len)
        r->data[r->data_len++] = '\n';
    memcpy(r->data + r->data_len, s, n);
    r->data_len += n;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *user)
{
    req_t *r = user;
    size_t n = size * nmemb;
    double t = dsq__bench_now_s();
    if (r->raw_len < RAW_KEEP) {
        size_t k = n < RAW_KEEP - r->raw_len ? n : RAW_KEEP - r->raw_len;
        memcpy(r->raw + r->raw_len, p, k);
        r->raw_len += k;
        r->raw[r->raw_len] = '\0';
    }
    for (size_t i = 0; i < n && !r->oom; i++) {
        if (p[i] == '\n') {
            size_t len = r->line_len;
            if (len && r->line[len - 1] == '\r')
                len--;
            on_line(r, r->line ? r->line : "", len, t);
            r->line_len = 0;
        } else {
            if (!grow(&r->line, &r->line_cap, r->line_len + 1)) {
                r->oom = true;
                break;
            }
            r->line[r->line_len++] = p[i];
        }
    }
    return r->oom ? 0 : n;       /* 0 makes curl abort the transfer */
}

static void req_free(req_t *r)
{
    if (r->easy)
        curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->hdrs);
    free(r->body);
    free(r->line);
    free(r->data);
    free(r->chunk_t);
    memset(r, 0, sizeof(*r));
}

/* The JSON body of request idx: the same for every target, given the seed. */
static char *make_body(const load_t *ld, const char *model, int idx, int prompt_len,
                       int max_tokens)
{
    uint64_t s = ld->seed * 0x100000001b3ull + (uint64_t)idx;
    cJSON *o = cJSON_CreateObject(), *ids = NULL;
    char *out = NULL;
    if (!o)
        return NULL;
    if (model && !cJSON_AddStringToObject(o, "model", model))
        goto out;
    if (ld->n_prompts > 0) {
        if (!cJSON_AddStringToObject(o, "prompt", ld->prompts[idx % ld->n_prompts]))
            goto out;
        prompt_len = 0;
    } else if (!(ids = cJSON_AddArrayToObject(o, "prompt"))) {
        goto out;
    }
    for (int i = 0; i < prompt_len; i++) {
        cJSON *n = cJSON_CreateNumber((double)(100 + dsq__bench_splitmix(&s) % (uint64_t)(ld->vocab - 100)));
        if (!n || !cJSON_AddItemToArray(ids, n)) {
            cJSON_Delete(n);
            goto out;
        }
    }
    cJSON *so = NULL;
    if (!cJSON_AddNumberToObject(o, "max_tokens", max_tokens) ||
        !cJSON_AddTrueToObject(o, "stream") ||
        !(so = cJSON_AddObjectToObject(o, "stream_options")) ||
        !cJSON_AddTrueToObject(so, "include_usage") ||
        !cJSON_AddTrueToObject(o, "ignore_eos") ||
        !cJSON_AddNumberToObject(o, "temperature", 0))
        goto out;
    if (ld->constrained && ld->grammar && !cJSON_AddStringToObject(o, "grammar", ld->grammar))
        goto out;
    if (ld->constrained && ld->schema &&
        !cJSON_AddItemToObject(o, "json_schema", cJSON_Duplicate(ld->schema, 1)))
        goto out;
    out = cJSON_PrintUnformatted(o);
out:
    cJSON_Delete(o);
    return out;
}

static int req_start(req_t *r, CURLM *m, const load_t *ld, const char *url,
                     const char *model, int idx, int prompt_len, int max_tokens)
{
    memset(r, 0, sizeof(*r));
    r->idx = idx;
    r->prompt_len = prompt_len;
    r->max_tokens = max_tokens;
    r->usage_tokens = -1;
    r->usage_prompt = -1;
    char full[256];
    snprintf(full, sizeof(full), "%s/v1/completions", url);
    r->body = make_body(ld, model, idx, prompt_len, max_tokens);
    r->easy = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (h)
        r->hdrs = h;
    if (h && !(h = curl_slist_append(r->hdrs, "Accept: text/event-stream")))
        h = NULL;
    if (!r->body || !r->easy || !h) {
        req_free(r);
        return -1;
    }
    CURL *e = r->easy;
    curl_easy_setopt(e, CURLOPT_URL, full);
    curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(ld->timeout_s * 1e3));
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    r->t_start = dsq__bench_now_s();
    if (curl_multi_add_handle(m, e) != CURLM_OK) {
        req_free(r);
        return -1;
    }
    return 0;
}

/* Decide whether a finished transfer succeeded; fills r->err if not. */
static bool req_judge(req_t *r, CURLcode cc)
{
    long status = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    r->status = status;
    if (r->line_len) {           /* stream ended without a final newline */
        on_line(r, r->line, r->line_len, r->t_end);
        r->line_len = 0;
    }
    if (r->data_len)
        on_event(r, r->t_end);
    if (r->oom)
        snprintf(r->err, sizeof(r->err), "out of memory");
    else if (cc != CURLE_OK)
        snprintf(r->err, sizeof(r->err), "%s", curl_easy_strerror(cc));
    else if (status != 200)
        snprintf(r->err, sizeof(r->err), "HTTP %ld: %.200s", status, r->raw);
    else if (r->err[0])
        ;
    else if (!r->done && !r->finished)
        snprintf(r->err, sizeof(r->err), "stream ended without finish_reason or [DONE]");
    else if (r->usage_tokens >= 0 && r->usage_tokens != r->max_tokens)
        snprintf(r->err, sizeof(r->err), "usage.completion_tokens %d, expected %d",
                 r->usage_tokens, r->max_tokens);
    else if (r->usage_tokens < 0 && r->n_chunks != r->max_tokens)
        snprintf(r->err, sizeof(r->err), "no usage and %d text chunks, expected %d tokens",
                 r->n_chunks, r->max_tokens);
    return r->err[0] == '\0';
}

/* The first model id that url/v1/models lists, malloc'd, or NULL. */
static char *first_model(const char *url)
{
    char full[256];
    long st;
    snprintf(full, sizeof(full), "%s/v1/models", url);
    char *body = dsq__bench_http_get(full, &st, 30), *id = NULL;
    cJSON *o = body && st == 200 ? cJSON_Parse(body) : NULL;
    const cJSON *d = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "data"), 0);
    const cJSON *s = d ? cJSON_GetObjectItemCaseSensitive(d, "id") : NULL;
    if (cJSON_IsString(s))
        id = strdup(s->valuestring);
    cJSON_Delete(o);
    free(body);
    return id;
}

/* Run requests [first, first + n) against url with at most n_clients in
 * flight; fills st when st != NULL (warm-up passes NULL). Returns 0, or -1
 * when the run could not be set up (per-request failures are counted). */
static int run_load(const load_t *ld, const char *url, const char *model, int first, int n,
                    int max_tokens_cap, stats_t *st)
{
    /* open loop: arrivals of a Poisson process of rate open_rate (seeded
     * exponential gaps), started whatever is in flight */
    bool open = ld->open_rate > 0;
    int slots = open ? OPEN_LOOP_SLOTS : (ld->n_clients > 0 ? ld->n_clients : 1);
    req_t *rs = calloc((size_t)slots, sizeof(*rs));
    done_t *done = calloc((size_t)(n > 0 ? n : 1), sizeof(*done));
    CURLM *m = curl_multi_init();
    int rc = -1, next = 0, active = 0, n_done = 0;
    uint64_t rng = ld->seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!rs || !done || !m)
        goto out;
    double t0 = dsq__bench_now_s(), t_end = t0, t_arrive = t0;
    for (;;) {
        while (next < n && active < slots && (!open || dsq__bench_now_s() >= t_arrive)) {
            int slot = 0;
            while (rs[slot].easy)
                slot++;
            const mix_t *mx = &ld->mix[(first + next) % ld->n_mix];
            int mt = max_tokens_cap > 0 && mx->max_tokens > max_tokens_cap ? max_tokens_cap
                                                                           : mx->max_tokens;
            if (req_start(&rs[slot], m, ld, url, model, first + next, mx->prompt_len, mt) != 0) {
                fprintf(stderr, "dsq-bench serve: cannot set up request %d (out of memory)\n",
                        first + next);
                goto out;
            }
            next++;
            active++;
            if (open) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                double u = ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
                t_arrive += -log(u) / ld->open_rate;
            }
        }
        if (active == 0 && next >= n)
            break;
        if (stop_requested) {
            fprintf(stderr, "dsq-bench serve: interrupted\n");
            goto out;
        }
        int running = 0, done_before = n_done;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            req_t *r = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            CURLcode cc = msg->data.result;
            r->t_end = t_end = dsq__bench_now_s();
            curl_multi_remove_handle(m, r->easy);
            bool ok = req_judge(r, cc);
            if (st) {
                st->n_req++;
                bool refused = !ok && (r->status == 503 || r->refused_event);
                if (refused)
                    st->n_refused++;
                if (ok) {
                    st->n_ok++;
                    st->in_tokens += r->usage_prompt >= 0 ? r->usage_prompt : r->prompt_len;
                    st->draft_n += r->draft_n;
                    st->draft_acc += r->draft_acc;
                    st->out_tokens += r->usage_tokens >= 0 ? r->usage_tokens : r->n_chunks;
                    st->n_chunks += r->n_chunks;
                } else if (!st->first_err[0] && !(refused && ld->open_rate > 0)) {
                    /* open loop: a refusal is counted, not a failure */
                    snprintf(st->first_err, sizeof(st->first_err), "request %d: %s", r->idx,
                             r->err);
                }
            } else if (!ok) {
                fprintf(stderr, "dsq-bench serve: warm-up request failed: %s\n", r->err);
            }
            /* keep the timings, free the transfer and the slot */
            done_t *d = &done[n_done++];
            d->ok = ok;
            d->refused = !ok && (r->status == 503 || r->refused_event);
            d->t_start = r->t_start;
            d->t_end = r->t_end;
            d->tokens = r->usage_tokens >= 0 ? r->usage_tokens : r->n_chunks;
            d->n_chunks = ok ? r->n_chunks : 0;
            d->chunk_t = ok ? r->chunk_t : NULL;
            if (ok)
                r->chunk_t = NULL;
            req_free(r);
            active--;
        }
        /* a freed slot starts its next request at once; otherwise wait
         * (open loop: until the next arrival at the latest) */
        if (open && next < n) {
            int ms = (int)((t_arrive - dsq__bench_now_s()) * 1e3);
            if (ms > 0)
                curl_multi_poll(m, NULL, 0, ms < 100 ? ms : 100, NULL);
        } else if (active > 0 && (n_done == done_before || next >= n)) {
            curl_multi_poll(m, NULL, 0, 100, NULL);
        }
    }
    if (st) {
        st->dur_s = t_end - t0;
        size_t n_gap = 0;
        for (int i = 0; i < n_done; i++)
            n_gap += done[i].n_chunks > 1 ? (size_t)done[i].n_chunks - 1 : 0;
        double *ttft = malloc((size_t)(n_done + 1) * sizeof(double));
        double *tpot = malloc((size_t)(n_done + 1) * sizeof(double));
        double *e2e = malloc((size_t)(n_done + 1) * sizeof(double));
        double *itl = malloc((n_gap + 1) * sizeof(double));
        double *ref = malloc((size_t)(n_done + 1) * sizeof(double));
        if (ttft && tpot && e2e && itl && ref) {
            size_t nt = 0, np = 0, ne = 0, ni = 0, nr = 0;
            for (int i = 0; i < n_done; i++) {
                const done_t *r = &done[i];
                if (r->refused)
                    ref[nr++] = (r->t_end - r->t_start) * 1e3;
                if (!r->ok)
                    continue;
                e2e[ne++] = (r->t_end - r->t_start) * 1e3;
                if (r->n_chunks == 0)
                    continue;
                ttft[nt++] = (r->chunk_t[0] - r->t_start) * 1e3;
                if (r->tokens > 1)
                    tpot[np++] = (r->chunk_t[r->n_chunks - 1] - r->chunk_t[0]) * 1e3 /
                                 (r->tokens - 1);
                for (int k = 1; k < r->n_chunks; k++)
                    itl[ni++] = (r->chunk_t[k] - r->chunk_t[k - 1]) * 1e3;
            }
            summarize(ttft, nt, st->ttft);
            summarize(tpot, np, st->tpot);
            summarize(e2e, ne, st->e2e);
            summarize(itl, ni, st->itl);
            summarize(ref, nr, st->refuse);
            st->offered_rate = open && t_arrive > t0 ? n / (t_arrive - t0) : 0;
            st->req_s = st->dur_s > 0 ? st->n_ok / st->dur_s : 0;
            st->out_tok_s = st->dur_s > 0 ? (double)st->out_tokens / st->dur_s : 0;
            rc = 0;
        }
        free(ttft);
        free(tpot);
        free(e2e);
        free(itl);
        free(ref);
    } else {
        rc = 0;
    }
out:
    for (int i = 0; rs && i < slots; i++)
        if (rs[i].easy) {
            curl_multi_remove_handle(m, rs[i].easy);
            req_free(&rs[i]);
        }
    for (int i = 0; i < n_done; i++)
        free(done[i].chunk_t);
    free(done);
    free(rs);
    if (m)
        curl_multi_cleanup(m);
    return rc;
}

/* ------------------------------------------------------- server driver */

typedef struct {
    const char *kind;           /* "dsqd" or "llama-server"                 */
    const char *exe;
    const char *extra[MAX_EXTRA];
    int n_extra;
} spawn_t;

/* Start sp on 127.0.0.1:port with stdout+stderr to log; returns the pid or -1. */
static pid_t start_server(const spawn_t *sp, const char *model, int threads, int n_seqs,
                          int ctx, int port, const char *log)
{
    char sport[16], sthr[16], sseq[16], sctx[16], stot[24];
    const char *argv[64];
    int n = 0;
    snprintf(sport, sizeof(sport), "%d", port);
    snprintf(sthr, sizeof(sthr), "%d", threads);
    snprintf(sseq, sizeof(sseq), "%d", n_seqs);
    snprintf(sctx, sizeof(sctx), "%d", ctx);
    snprintf(stot, sizeof(stot), "%lld", (long long)ctx * n_seqs);
    argv[n++] = sp->exe;
    if (strcmp(sp->kind, "dsqd") == 0) {
        /* no --kv-cache-memory: the planner's default holds every
         * sequence at --max-model-len, the KV llama-server gets from -c
         * (a fixed size would hold fewer tokens of a bigger model), up to
         * its CPU cap of 4 GiB and what the memory budget leaves */
        const char *a[] = {"--model", model, "--host", "127.0.0.1", "--port", sport,
                           "--threads", sthr, "--max-num-seqs", sseq, "--max-model-len", sctx,
                           "--log-level", "warn"};
        for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
            argv[n++] = a[i];
    } else {
        /* -c is the total KV size, split evenly over the -np slots */
        const char *a[] = {"-m", model, "--host", "127.0.0.1", "--port", sport, "-t", sthr,
                           "-tb", sthr, "-np", sseq, "-c", stot, "--no-webui"};
        for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
            argv[n++] = a[i];
    }
    for (int i = 0; i < sp->n_extra; i++)
        argv[n++] = sp->extra[i];
    argv[n] = NULL;
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "dsq-bench serve: cannot open log %s: %s\n", log, strerror(errno));
        return -1;
    }
    if (strcmp(sp->kind, "dsqd") != 0 && (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")))
        fprintf(stderr, "dsq-bench serve: %s runs with OpenMP's defaults (OMP_WAIT_POLICY / "
                "GOMP_SPINCOUNT of this environment not passed on)\n", sp->kind);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (strcmp(sp->kind, "dsqd") != 0) {
            /* a peer runs at its own defaults. libgomp's wait
             * policy knobs (the test environment sets OMP_WAIT_POLICY=
             * passive, which cut llama.cpp's decode ~14x on a 2-core box)
             * never reach it from ours. */
            unsetenv("OMP_WAIT_POLICY");
            unsetenv("GOMP_SPINCOUNT");
        }
        execv(sp->exe, (char *const *)argv);
        dprintf(2, "exec %s: %s\n", sp->exe, strerror(errno));
        _exit(127);
    }
    close(fd);
    if (pid < 0)
        fprintf(stderr, "dsq-bench serve: fork: %s\n", strerror(errno));
    return pid;
}

/* dsqd's speculative decoding counters (vLLM's names) from url's /metrics:
 * false when the server has none (not dsqd, or speculation off). */
static bool spec_counters(const char *url, long long *draft, long long *acc)
{
    char full[256];
    long status = 0;
    snprintf(full, sizeof(full), "%s/metrics", url);
    char *m = dsq__bench_http_get(full, &status, 10);
    bool ok = false;
    if (m && status == 200) {
        const char *d = strstr(m, "\nvllm:spec_decode_num_draft_tokens_total{");
        const char *a = strstr(m, "\nvllm:spec_decode_num_accepted_tokens_total{");
        if (d && a && (d = strchr(d, '}')) && (a = strchr(a, '}'))) {
            *draft = strtoll(d + 1, NULL, 10);
            *acc = strtoll(a + 1, NULL, 10);
            ok = true;
        }
    }
    free(m);
    return ok;
}

/* ------------------------------------------------------------- report */

static void print_table(const load_t *ld, stats_t *s, int n)
{
    printf("# dsq-bench serve: clients %d, requests %d, seed %llu, mix", ld->n_clients,
           ld->n_requests, (unsigned long long)ld->seed);
    for (int i = 0; i < ld->n_mix; i++)
        printf("%s%d:%d", i ? "," : " ", ld->mix[i].prompt_len, ld->mix[i].max_tokens);
    printf(" (prompt:output tokens)\n");
    if (ld->open_rate > 0) {
        printf("# open loop: Poisson arrivals at %.3f req/s; TTFT/ITL/E2E of the requests "
               "served, refused = answered 503\n", ld->open_rate);
        for (int i = 0; i < n; i++)
            printf("# %s: offered %.3f req/s, refused %d/%d, time to the 503 p50 %.1f ms "
                   "p99 %.1f ms\n", s[i].label, s[i].offered_rate, s[i].n_refused, s[i].n_req,
                   s[i].refuse[0], s[i].refuse[1]);
    }
    for (int i = 0; i < n; i++)
        printf("# %s = %s%s%s\n", s[i].label, s[i].url, s[i].first_err[0] ? "; first failure: " : "",
               s[i].first_err);
    if (ld->n_prompts > 0)
        printf("# prompts: %d texts of --prompt-file, round robin (prompt lengths are the "
               "servers' usage.prompt_tokens)\n", ld->n_prompts);
    for (int i = 0; i < n; i++)
        if (s[i].draft_n > 0)
            printf("# %s: speculative decoding scored %lld draft tokens, accepted %lld "
                   "(%.1f %%)\n", s[i].label, s[i].draft_n, s[i].draft_acc,
                   100.0 * (double)s[i].draft_acc / (double)s[i].draft_n);
    printf("| target | ok/sent | wall s | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms |"
           " ITL p50 ms | ITL p99 ms | TPOT p50 ms | TPOT p99 ms | E2E p50 ms | E2E p99 ms |"
           " tok/chunk |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
           " ---: | ---: |\n");
    for (int i = 0; i < n; i++) {
        const stats_t *t = &s[i];
        printf("| %s | %d/%d | %.1f | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |"
               " %.0f | %.0f | %.2f |\n",
               t->label, t->n_ok, t->n_req, t->dur_s, t->req_s, t->out_tok_s, t->ttft[0],
               t->ttft[1], t->itl[0], t->itl[1], t->tpot[0], t->tpot[1], t->e2e[0], t->e2e[1],
               t->n_chunks ? (double)t->out_tokens / (double)t->n_chunks : NAN);
    }
    if (n == 2) {
        const stats_t *a = &s[0], *b = &s[1];
        printf("| %s / %s | | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |"
               " %.2f | %.2f | |\n",
               a->label, b->label, a->dur_s / b->dur_s, a->req_s / b->req_s,
               a->out_tok_s / b->out_tok_s, a->ttft[0] / b->ttft[0], a->ttft[1] / b->ttft[1],
               a->itl[0] / b->itl[0], a->itl[1] / b->itl[1], a->tpot[0] / b->tpot[0],
               a->tpot[1] / b->tpot[1], a->e2e[0] / b->e2e[0], a->e2e[1] / b->e2e[1]);
        printf("# ratios: throughput > 1 means %s is faster; latency < 1 means %s is faster\n",
               a->label, a->label);
    }
    fflush(stdout);
}

static void add_pct(cJSON *o, const char *name, const double v[3])
{
    cJSON *p = cJSON_AddObjectToObject(o, name);
    if (!p)
        return;
    /* JSON has no NaN: no samples is null */
    static const char *k[3] = {"p50", "p99", "mean"};
    for (int i = 0; i < 3; i++)
        if (isnan(v[i]))
            cJSON_AddNullToObject(p, k[i]);
        else
            cJSON_AddNumberToObject(p, k[i], v[i]);
}

static void print_json(const load_t *ld, stats_t *s, int n)
{
    cJSON *o = cJSON_CreateObject(), *cfg, *mix, *ts;
    if (!o || !(cfg = cJSON_AddObjectToObject(o, "config")) ||
        !(mix = cJSON_AddArrayToObject(cfg, "mix")) ||
        !(ts = cJSON_AddArrayToObject(o, "targets"))) {
        cJSON_Delete(o);
        fprintf(stderr, "dsq-bench serve: out of memory\n");
        return;
    }
    cJSON_AddNumberToObject(cfg, "clients", ld->n_clients);
    cJSON_AddNumberToObject(cfg, "requests", ld->n_requests);
    cJSON_AddNumberToObject(cfg, "seed", (double)ld->seed);
    if (ld->open_rate > 0)
        cJSON_AddNumberToObject(cfg, "open_loop_rate", ld->open_rate);
    for (int i = 0; i < ld->n_mix; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddNumberToObject(m, "prompt_len", ld->mix[i].prompt_len);
        cJSON_AddNumberToObject(m, "max_tokens", ld->mix[i].max_tokens);
        cJSON_AddItemToArray(mix, m);
    }
    for (int i = 0; i < n; i++) {
        const stats_t *t = &s[i];
        cJSON *x = cJSON_CreateObject();
        if (!x)
            continue;
        cJSON_AddStringToObject(x, "label", t->label);
        cJSON_AddStringToObject(x, "url", t->url);
        cJSON_AddNumberToObject(x, "requests", t->n_req);
        cJSON_AddNumberToObject(x, "succeeded", t->n_ok);
        /* open loop: refusals are their own count, not failures */
        cJSON_AddNumberToObject(x, "failed", t->n_req - t->n_ok -
                                                 (ld->open_rate > 0 ? t->n_refused : 0));
        cJSON_AddNumberToObject(x, "duration_s", t->dur_s);
        cJSON_AddNumberToObject(x, "prompt_tokens", (double)t->in_tokens);
        cJSON_AddNumberToObject(x, "output_tokens", (double)t->out_tokens);
        cJSON_AddNumberToObject(x, "text_chunks", (double)t->n_chunks);
        cJSON_AddNumberToObject(x, "request_throughput", t->req_s);
        cJSON_AddNumberToObject(x, "output_tok_s", t->out_tok_s);
        add_pct(x, "ttft_ms", t->ttft);
        add_pct(x, "itl_ms", t->itl);
        add_pct(x, "tpot_ms", t->tpot);
        add_pct(x, "e2e_ms", t->e2e);
        cJSON_AddNumberToObject(x, "refused", t->n_refused);
        cJSON_AddNumberToObject(x, "draft_tokens", (double)t->draft_n);
        cJSON_AddNumberToObject(x, "draft_accepted", (double)t->draft_acc);
        add_pct(x, "refuse_ms", t->refuse);
        if (ld->open_rate > 0)
            cJSON_AddNumberToObject(x, "offered_rate", t->offered_rate);
        if (t->first_err[0])
            cJSON_AddStringToObject(x, "first_error", t->first_err);
        else
            cJSON_AddNullToObject(x, "first_error");
        cJSON_AddItemToArray(ts, x);
    }
    char *txt = cJSON_Print(o);
    if (txt)
        printf("%s\n", txt);
    free(txt);
    cJSON_Delete(o);
    fflush(stdout);
}

/* ------------------------------------------------------------- options */

/* --prompt-file: one JSON string per line (JSON Lines), blank lines
 * skipped. Returns 0, or -1 with the reason on stderr. */
static int read_prompts(const char *path, load_t *ld)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dsq-bench serve: --prompt-file %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, rc = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0)
            continue;
        cJSON *j = cJSON_Parse(line);
        char **p = realloc(ld->prompts, (size_t)(ld->n_prompts + 1) * sizeof(*p));
        if (p)
            ld->prompts = p;
        if (!cJSON_IsString(j) || !p || !(p[ld->n_prompts] = strdup(j->valuestring))) {
            fprintf(stderr, "dsq-bench serve: --prompt-file %s:%d: not a JSON string\n", path,
                    lineno);
            rc = -1;
        } else {
            ld->n_prompts++;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    if (rc == 0 && ld->n_prompts == 0) {
        fprintf(stderr, "dsq-bench serve: --prompt-file %s: no prompts\n", path);
        rc = -1;
    }
    return rc;
}

static int parse_int(const char *s, const char *name, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "dsq-bench serve: %s wants an integer in [%d, %d], got '%s'\n", name,
                lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_mix(const char *s, load_t *ld)
{
    ld->n_mix = 0;
    while (*s) {
        char *end;
        long p = strtol(s, &end, 10), t;
        if (end == s || *end != ':')
            goto bad;
        s = end + 1;
        t = strtol(s, &end, 10);
        if (end == s || (*end && *end != ',') || p < 1 || p > 1 << 20 || t < 1 ||
            t > 1 << 20 || ld->n_mix == MAX_MIX)
            goto bad;
        ld->mix[ld->n_mix++] = (mix_t){(int)p, (int)t};
        s = *end ? end + 1 : end;
    }
    if (ld->n_mix > 0)
        return 0;
bad:
    fprintf(stderr, "dsq-bench serve: --mix wants P:T[,P:T...] (at most %d, each >= 1)\n",
            MAX_MIX);
    return -1;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: dsq-bench serve [--url URL]... [--dsqd PATH] [--llama-server PATH]\n"
        "         [--model GGUF] [--threads 2] [--ctx C] [--clients 8] [--requests 32]\n"
        "         [--prompt-len 128] [--max-tokens 64] [--mix P:T,P:T,...] [--seed 1]\n"
        "         [--vocab 10000] [--warmup 1] [--timeout 600] [--model-name NAME]\n"
        "         [--dsqd-arg ARG]... [--llama-arg ARG]... [--log-dir DIR] [--json]\n"
        "         [--grammar GBNF_FILE | --json-schema SCHEMA_FILE] [--open-loop RATE]\n"
        "         [--prompt-file JSONL]\n"
        "Streams /v1/completions from N concurrent clients (prompts are token-id\n"
        "arrays, ignore_eos, greedy) and reports request throughput, output tok/s,\n"
        "TTFT, inter-token latency, time per output token and end-to-end latency.\n"
        "Targets run one after the other: each --url (--url2 is a synonym), then\n"
        "--dsqd and --llama-server, which are started on free 127.0.0.1 ports with\n"
        "the same --model, --threads, max concurrency (= --clients) and per-sequence\n"
        "context --ctx (default: longest P+T rounded up to 256), and stopped after.\n"
        "With two targets the last row gives first/second ratios. Prompt ids are\n"
        "drawn from [100, --vocab); mix entries are used round robin. Exit status:\n"
        "0 all requests succeeded (open loop: or were refused with 503), 1 some failed\n"
        "or a server did not start, 2 usage.\n"
        "--grammar: each target runs the load twice, plain and then with every\n"
        "request constrained by the file's GBNF grammar (\"grammar\" field, which\n"
        "dsqd and llama-server both take); the grammar should never complete, so\n"
        "every request still makes exactly T tokens.\n"
        "--json-schema: the same with a JSON Schema (\"json_schema\" field, llama.cpp's\n"
        "name, which dsqd takes too), row label +schema.\n"
        "--open-loop RATE: requests arrive as a Poisson process of RATE per second\n"
        "(seeded exponential gaps), each started whatever is in flight (at most 1024;\n"
        "--clients is then only the servers' --max-num-seqs); requests answered 503\n"
        "(or, streamed, an error event with code queue_full) are counted as refused\n"
        "with their time to the answer, the latency columns\n"
        "are those of the requests served.\n"
        "--prompt-file: text prompts (one JSON string per line) sent round robin\n"
        "instead of id arrays (--prompt-len and the mix's P are then unused; T still\n"
        "applies). Where a target speculates (dsqd --speculative-ngram, read from its\n"
        "/metrics; llama-server --spec-type, from each answer's timings), the draft\n"
        "tokens scored and accepted are reported.\n");
}

int dsq__bench_serve(int argc, char **argv)
{
    load_t ld = {.n_clients = 8, .n_requests = 32, .seed = 1, .vocab = 10000,
                 .timeout_s = 600, .warmup = 1};
    int prompt_len = 128, max_tokens = 64, threads = 2, ctx = 0;
    const char *urls[MAX_TARGETS], *model = NULL, *log_dir = NULL;
    const char *mix_arg = NULL;
    int n_urls = 0;
    spawn_t sp[2] = {{.kind = "dsqd"}, {.kind = "llama-server"}};
    double start_timeout = 300;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            ld.json = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "dsq-bench serve: unknown option or missing value: %s\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--url") == 0 || strcmp(a, "--url2") == 0) {
            if (n_urls == MAX_TARGETS - 2) {
                fprintf(stderr, "dsq-bench serve: at most %d --url\n", MAX_TARGETS - 2);
                return 2;
            }
            if (strncmp(v, "http://", 7) != 0 && strncmp(v, "https://", 8) != 0) {
                fprintf(stderr, "dsq-bench serve: --url wants http://HOST:PORT, got '%s'\n", v);
                return 2;
            }
            if (strlen(v) > 150) {
                fprintf(stderr, "dsq-bench serve: --url too long\n");
                return 2;
            }
            urls[n_urls++] = v;
        } else if (strcmp(a, "--dsqd") == 0) {
            sp[0].exe = v;
        } else if (strcmp(a, "--llama-server") == 0) {
            sp[1].exe = v;
        } else if (strcmp(a, "--dsqd-arg") == 0 || strcmp(a, "--llama-arg") == 0) {
            spawn_t *s = &sp[a[2] == 'd' ? 0 : 1];
            if (s->n_extra == MAX_EXTRA) {
                fprintf(stderr, "dsq-bench serve: at most %d %s\n", MAX_EXTRA, a);
                return 2;
            }
            s->extra[s->n_extra++] = v;
        } else if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--prompt-file") == 0) {
            if (read_prompts(v, &ld) != 0)
                return 2;
        } else if (strcmp(a, "--grammar") == 0) {
            FILE *f = fopen(v, "rb");
            long n = -1;
            if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < (1L << 20) &&
                fseek(f, 0, SEEK_SET) == 0) {
                free(ld.grammar);
                ld.grammar = calloc(1, (size_t)n + 1);
                if (!ld.grammar || fread(ld.grammar, 1, (size_t)n, f) != (size_t)n)
                    n = -1;
            }
            if (f)
                fclose(f);
            if (n < 1) {
                fprintf(stderr, "dsq-bench serve: --grammar %s: unreadable, empty or above "
                        "1 MiB\n", v);
                return 2;
            }
        } else if (strcmp(a, "--json-schema") == 0) {
            FILE *f = fopen(v, "rb");
            char buf[1 << 16];
            size_t n = f ? fread(buf, 1, sizeof(buf), f) : 0;
            if (f)
                fclose(f);
            cJSON_Delete(ld.schema);
            ld.schema = n > 0 && n < sizeof(buf) ? cJSON_ParseWithLength(buf, n) : NULL;
            if (!cJSON_IsObject(ld.schema)) {
                fprintf(stderr, "dsq-bench serve: --json-schema %s: unreadable, above 64 KiB "
                        "or not a JSON object\n", v);
                cJSON_Delete(ld.schema);
                return 2;
            }
        } else if (strcmp(a, "--model-name") == 0) {
            ld.model_name = v;
        } else if (strcmp(a, "--log-dir") == 0) {
            log_dir = v;
        } else if (strcmp(a, "--mix") == 0) {
            mix_arg = v;
        } else if (strcmp(a, "--threads") == 0) {
            rc = parse_int(v, a, 1, 1024, &threads);
        } else if (strcmp(a, "--ctx") == 0) {
            rc = parse_int(v, a, 16, 1 << 20, &ctx);
        } else if (strcmp(a, "--clients") == 0) {
            rc = parse_int(v, a, 1, 4096, &ld.n_clients);
        } else if (strcmp(a, "--requests") == 0) {
            rc = parse_int(v, a, 1, 1 << 24, &ld.n_requests);
        } else if (strcmp(a, "--prompt-len") == 0) {
            rc = parse_int(v, a, 1, 1 << 20, &prompt_len);
        } else if (strcmp(a, "--max-tokens") == 0) {
            rc = parse_int(v, a, 1, 1 << 20, &max_tokens);
        } else if (strcmp(a, "--vocab") == 0) {
            rc = parse_int(v, a, 101, 1 << 30, &ld.vocab);
        } else if (strcmp(a, "--warmup") == 0) {
            rc = parse_int(v, a, 0, 1024, &ld.warmup);
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            ld.seed = strtoull(v, &end, 10);
            rc = errno || end == v || *end || *v == '-' ? -1 : 0;
            if (rc)
                fprintf(stderr, "dsq-bench serve: --seed wants an unsigned integer\n");
        } else if (strcmp(a, "--open-loop") == 0) {
            char *end;
            double d = strtod(v, &end);
            if (end == v || *end || !(d > 0 && d <= 100000)) {
                fprintf(stderr, "dsq-bench serve: --open-loop wants a rate in req/s in "
                                "(0, 100000]\n");
                return 2;
            }
            ld.open_rate = d;
        } else if (strcmp(a, "--timeout") == 0 || strcmp(a, "--start-timeout") == 0) {
            char *end;
            double d = strtod(v, &end);
            if (end == v || *end || !(d > 0 && d <= 86400)) {
                fprintf(stderr, "dsq-bench serve: %s wants seconds in (0, 86400]\n", a);
                return 2;
            }
            *(a[2] == 't' ? &ld.timeout_s : &start_timeout) = d;
        } else {
            fprintf(stderr, "dsq-bench serve: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (rc)
            return 2;
    }
    if (mix_arg) {
        if (parse_mix(mix_arg, &ld))
            return 2;
    } else {
        ld.mix[0] = (mix_t){prompt_len, max_tokens};
        ld.n_mix = 1;
    }
    if (ld.grammar && ld.schema) {
        fprintf(stderr, "dsq-bench serve: give --grammar or --json-schema, not both\n");
        return 2;
    }
    if (n_urls == 0 && !sp[0].exe && !sp[1].exe) {
        fprintf(stderr, "dsq-bench serve: no target: give --url, --dsqd or --llama-server\n");
        return 2;
    }
    if ((sp[0].exe || sp[1].exe) && !model) {
        fprintf(stderr, "dsq-bench serve: --dsqd/--llama-server need --model GGUF\n");
        return 2;
    }
    if (model && access(model, R_OK) != 0) {
        fprintf(stderr, "dsq-bench serve: model %s: %s\n", model, strerror(errno));
        return 2;
    }
    for (int i = 0; i < 2; i++)
        if (sp[i].exe && access(sp[i].exe, X_OK) != 0) {
            fprintf(stderr, "dsq-bench serve: %s %s: %s\n", sp[i].kind, sp[i].exe,
                    strerror(errno));
            return 2;
        }
    if (ctx == 0) {
        int longest = 0;
        for (int i = 0; i < ld.n_mix; i++)
            if (ld.mix[i].prompt_len + ld.mix[i].max_tokens > longest)
                longest = ld.mix[i].prompt_len + ld.mix[i].max_tokens;
        ctx = (longest + 255) / 256 * 256;
    }
    if (!log_dir)
        log_dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "dsq-bench serve: curl_global_init failed\n");
        return 1;
    }
    stats_t st[2 * MAX_TARGETS];
    memset(st, 0, sizeof(st));
    int n_st = 0, rc = 0;
    for (int ti = 0; ti < n_urls + 2; ti++) {
        const spawn_t *s = ti >= n_urls ? &sp[ti - n_urls] : NULL;
        if (s && !s->exe)
            continue;
        stats_t *t = &st[n_st];
        char url[160], log[512] = "";
        pid_t pid = -1;
        if (s) {
            int port = dsq__bench_free_port();
            snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
            snprintf(log, sizeof(log), "%s/dsq-bench-serve-%s-%d.log", log_dir, s->kind,
                     (int)getpid());
            snprintf(t->label, sizeof(t->label), "%s", s->kind);
            if (port < 0 || (pid = start_server(s, model, threads, ld.n_clients, ctx, port,
                                                log)) < 0) {
                rc = 1;
                break;
            }
            fprintf(stderr, "dsq-bench serve: started %s pid %d on %s (log %s)\n", s->kind,
                    (int)pid, url, log);
            if (dsq__bench_wait_ready(pid, url, start_timeout, &stop_requested) != 0) {
                fprintf(stderr, "dsq-bench serve: %s did not become ready, see %s\n", s->kind,
                        log);
                dsq__bench_stop_server(pid);
                rc = 1;
                break;
            }
        } else {
            snprintf(url, sizeof(url), "%s", urls[ti]);
            size_t l = strlen(url);
            while (l && url[l - 1] == '/')
                url[--l] = '\0';
            snprintf(t->label, sizeof(t->label), "url%d", ti + 1);
        }
        snprintf(t->url, sizeof(t->url), "%s", url);
        char *name = ld.model_name ? strdup(ld.model_name) : first_model(url);
        if (!name) {
            fprintf(stderr, "dsq-bench serve: %s: no model id from %s/v1/models (give "
                    "--model-name)\n", t->label, url);
            rc = 1;
        } else {
            fprintf(stderr, "dsq-bench serve: %s: %d requests, %d clients, model '%s'\n",
                    t->label, ld.n_requests, ld.n_clients, name);
            /* warm-up: ids after the measured ones, 4 tokens, not counted;
             * with --grammar, the same load again on the same server with
             * every request constrained (its own row) */
            for (int pass = 0; pass < (ld.grammar || ld.schema ? 2 : 1) && !rc; pass++) {
                ld.constrained = pass == 1;
                t = &st[n_st];
                if (pass == 1) {
                    char base[64];
                    memcpy(base, st[n_st - 1].label, sizeof(base));
                    base[40] = 0;
                    *t = (stats_t){0};
                    memcpy(t->label, base, strlen(base));
                    const char *tag = ld.schema ? "+schema" : "+grammar";
                    memcpy(t->label + strlen(base), tag, strlen(tag) + 1);
                    snprintf(t->url, sizeof(t->url), "%s", url);
                }
                if (ld.warmup > 0 &&
                    run_load(&ld, url, name, ld.n_requests, ld.warmup, 4, NULL))
                    rc = 1;
                else {
                    long long d0 = 0, a0 = 0, d1 = 0, a1 = 0;
                    bool spec = spec_counters(url, &d0, &a0);
                    if (run_load(&ld, url, name, 0, ld.n_requests, 0, t) != 0) {
                        rc = 1;
                    } else {
                        if (spec && spec_counters(url, &d1, &a1)) {
                            t->draft_n += d1 - d0;
                            t->draft_acc += a1 - a0;
                        }
                        n_st++;
                    }
                }
            }
            ld.constrained = false;
        }
        free(name);
        if (pid > 0)
            dsq__bench_stop_server(pid);
        if (stop_requested)
            rc = 1;
        if (rc)
            break;
    }
    if (n_st > 0) {
        if (ld.json)
            print_json(&ld, st, n_st);
        else
            print_table(&ld, st, n_st);
    }
    for (int i = 0; i < n_st && rc == 0; i++)
        if (st[i].n_ok + (ld.open_rate > 0 ? st[i].n_refused : 0) != st[i].n_req)
            rc = 1;          /* open loop: a 503 is an answer, not a failure */
    curl_global_cleanup();
    free(ld.grammar);
    cJSON_Delete(ld.schema);
    for (int i = 0; i < ld.n_prompts; i++)
        free(ld.prompts[i]);
    free(ld.prompts);
    return rc;
}

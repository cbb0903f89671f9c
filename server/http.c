/* libmicrohttpd front end of dsqd: routing, auth, body limits, CORS, the
 * OpenAI endpoints and SSE streaming. See http.h for the threading model.
 *
 * Every response goes through send_response() (CORS headers, status
 * bookkeeping) and every error body through server/error.c. One struct conn
 * per HTTP request holds all of that request's state; it is created on the
 * first access-handler call and freed in the request-completed callback,
 * which is also where engine requests are cancelled and the log line is
 * written. */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "dsq_config.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/hex.h"
#include "engine/common/clock.h"
#include "engine/text/tokenizer.h"
#include "server/chat.h"
#include "server/error.h"
#include "server/json.h"
#include "server/openai.h"
#include "server/reasoning.h"
#include "server/trace.h"
#include "engine/text/grammar.h"
#include "engine/text/tool_calls.h"

#define CANCEL_GRACE_S 5.0
#define QUEUE_TIMEOUT_MSG "the request waited past --max-queue-wait without being " \
                          "scheduled (the server is overloaded); retry later"

/* ------------------------------------------------------------ waiters */

/* A wake-up target for the engine's notify callback, one per request being
 * answered. libmicrohttpd runs its connections on a small pool of polling
 * threads (http.h), so a request that has nothing to send parks: its
 * connection is suspended (MHD_suspend_connection, from its own handler or
 * stream reader) and `parked` set, both under `mu`; whoever wakes it (the
 * engine's notify, the ticker thread on a hang-up or deadline, the stop
 * path) bumps `seq` and, if parked, resumes the connection under the same
 * lock, so a wake-up between a handler's last look and its suspend is never
 * lost (the handler re-checks `seq` under `mu` before it suspends).
 *
 * Waiters are recycled through a free list and only freed with the daemon
 * (after the engine is gone), because the engine may call notify for a
 * request whose connection already ended: such a late call then only
 * causes a spurious wake-up of a recycled waiter (a parked one re-checks its
 * state and parks again), never a resume of a closed connection, because a
 * waiter is parked only while its current connection is suspended. */
typedef struct waiter {
    pthread_mutex_t mu;
    uint64_t seq;                /* bumped by every wake-up                 */
    bool parked;                 /* mc is suspended, waiting for seq        */
    struct MHD_Connection *mc;   /* valid while parked                      */
    int fd;                      /* mc's socket, for the ticker's hang-up poll */
    double wake_at;              /* monotonic s: the ticker wakes it then
                                    (request timeout, cancel grace); 0 = no */
    struct waiter *next_free;
    struct waiter *next_all;
} waiter_t;

/* hardening: one per open connection (MHD_OPTION_NOTIFY_CONNECTION), for
 * the request-head and body deadlines the ticker enforces. */
enum sock_phase {
    S_HEAD = 0,                  /* connected, the request head not in yet  */
    S_IDLE,                      /* kept alive after an answer               */
    S_BODY,                      /* head in, reading the body                */
    S_BUSY,                      /* answering: no deadline but the request's */
};
typedef struct sock_rec {
    int fd;
    enum sock_phase phase;
    double t0;                   /* monotonic s the phase began             */
    bool cut;                    /* shut down by the ticker already         */
    struct sock_rec *prev, *next;
} sock_rec_t;

struct dsq_http {
    struct MHD_Daemon *d;
    dsq_http_config_t cfg;       /* strings owned (copied)                 */
    char *cfg_strings[6];
    dsq_metrics_t *metrics;
    _Atomic(dsq_engine_t *) engine;
    atomic_bool draining;
    atomic_bool stopping;
    atomic_bool no_park;         /* stop: handlers answer now, never park  */
    atomic_int n_inflight;
    int port;
    unsigned char key_hash[SHA256_DIGEST_LENGTH];
    bool have_key;
    pthread_mutex_t pool_mu;
    waiter_t *pool_free, *pool_all;
    dsq_chat_t *chat;            /* set once before the engine, then read-only */
    /* hardening: open connections and the ticker thread */
    pthread_mutex_t sock_mu;
    sock_rec_t *socks;
    int n_socks;
    pthread_t ticker;
    bool ticker_started;
    atomic_bool ticker_stop;
    atomic_llong n_cut_head, n_cut_body;
};

static waiter_t *waiter_get(dsq_http_t *h)
{
    waiter_t *w;
    pthread_mutex_lock(&h->pool_mu);
    w = h->pool_free;
    if (w) {
        h->pool_free = w->next_free;
    } else if ((w = calloc(1, sizeof(*w)))) {
        pthread_mutex_init(&w->mu, NULL);
        w->fd = -1;
        w->next_all = h->pool_all;
        h->pool_all = w;
    }
    pthread_mutex_unlock(&h->pool_mu);
    return w;
}

static void waiter_put(dsq_http_t *h, waiter_t *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->parked = false;           /* a completed connection is never parked */
    w->mc = NULL;
    w->fd = -1;
    w->wake_at = 0;
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&h->pool_mu);
    w->next_free = h->pool_free;
    h->pool_free = w;
    pthread_mutex_unlock(&h->pool_mu);
}

/* Bump seq and resume the connection if it is parked. Never blocks for
 * long (one mutex, MHD_resume_connection's own short lock and a write to
 * libmicrohttpd's wake-up pipe): safe on the engine thread. */
static void waiter_wake(waiter_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->seq++;
    if (w->parked) {
        w->parked = false;
        MHD_resume_connection(w->mc);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Engine thread: must not block (waiter_wake). */
static void on_notify(dsq_req_t *req, void *user)
{
    (void)req;
    waiter_wake(user);
}

static uint64_t waiter_seq(waiter_t *w)
{
    uint64_t s;
    pthread_mutex_lock(&w->mu);
    s = w->seq;
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* ------------------------------------------------------------ per request */

enum route {
    R_NONE = 0, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_VERSION, R_COMPLETIONS,
    R_TOKENIZE, R_DETOKENIZE, R_CHAT, R_TOKENIZER_INFO,
};

typedef struct choice_st {
    char *text;                  /* non-streaming: accumulated text         */
    size_t len, cap;
    cJSON *lp;                   /* non-streaming logprobs accumulator      */
    dsq_finish_t finish;
    int64_t n_tokens;            /* counted from events                     */
    int64_t final_tokens;        /* engine's completion_tokens, if given    */
    double t_last;
    dsq_reasoning_t rs;          /* chat with a reasoning parser, streaming */
    /* issue 22, chat with tools, streaming: content held back from where a
     * tool call may start (parsed at the finish), and whether any content
     * went out before it */
    char *th;
    size_t th_len, th_cap;
    bool th_any;
} choice_st;

typedef struct conn {
    dsq_http_t *h;
    struct MHD_Connection *mc;
    enum route route;
    char method[12];
    char path[96];
    char *model_id;              /* GET /v1/models/{id}: the id (owned) */
    bool gone_logged;            /* users: event=disconnect logged */
    const char *err_code;        /* users: the error sent (access log) */
    char err_msg[224];
    int status;
    double t_start;
    /* body */
    char *body;
    size_t body_len, body_cap;
    bool too_large, responded;
    bool ct_other;               /* users: Content-Type not JSON (curl -d):
                                    accepted when the body parses as JSON */
    bool close_after;            /* attack2: answer with Connection: close */
    uint64_t discarded;          /* body bytes dropped after too_large   */
    /* completion */
    dsq_completion_req_t req;
    bool have_req;
    dsq_engine_t *e;
    const dsq_tokenizer_t *tok;
    int n_ereqs;
    dsq_req_t **ereqs;
    bool *ereq_done;
    int64_t *prompt_tokens;
    int64_t *cached_tokens;
    size_t *echo_len;            /* api: per prompt, bytes of the echoed
                                    prompt's token texts (logprobs offsets) */
    bool *echo_done;             /* api: prompt logprobs handled, per prompt */
    int64_t discarded_tokens;    /* api: best_of candidates not returned   */
    int n_choices;
    choice_st *choices;
    waiter_t *w;
    char id[48];
    int64_t created;
    bool inflight;
    bool cancelled;
    double t_cancel;
    double t_first;
    double queue_ms;             /* from the engine, -1 until reported      */
    bool queue_timeout;          /* hardening: aborted after --max-queue-wait */
    int retry_after_s;           /* admission: the policy's Retry-After, 0 = 1 */
    /* streaming */
    char *pend;
    size_t pend_len, pend_off, pend_cap;
    bool stream_finished;        /* usage + [DONE] queued                  */
    bool stream_held;            /* admission: the 200 waits for admission  */
    bool eof;
    /* chat */
    bool reasoning;              /* split output with the reasoning parser  */
    bool prompt_in_think;        /* the rendered prompt opened <think>      */
    dsq_tool_parser_t tools;     /* issue 22: parse calls out (NONE: off)   */
    dsq_trace_ctx_t tr;          /* otel: this request's trace context      */
    int64_t clk_off_ns;          /* otel: CLOCK_REALTIME - CLOCK_MONOTONIC  */
} conn_t;

static void cancel_all(conn_t *c)
{
    if (c->cancelled)
        return;
    c->cancelled = true;
    c->t_cancel = dsq_clock_now_s();
    for (int i = 0; i < c->n_ereqs; i++)
        if (c->ereqs[i] && !c->ereq_done[i])
            dsq_engine_cancel(c->e, c->ereqs[i]);
}

static bool client_gone(conn_t *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct pollfd p;
    if (!ci)
        return false;
    p.fd = ci->connect_fd;
    p.events = POLLRDHUP;
    p.revents = 0;
    if (poll(&p, 1, 0) <= 0)
        return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* users: set on a connection's thread when it closes a request because the
 * client went away (event=disconnect logged), so that libmicrohttpd's own
 * "application error" / "internal error" line that follows on the same
 * thread (thread-per-connection) goes to debug, not warn (log_mhd). */
static __thread bool tl_client_gone;

static void log_disconnect(conn_t *c, const char *how)
{
    if (c->gone_logged)
        return;
    c->gone_logged = true;
    dsq_log(DSQ_LOG_INFO, "event=disconnect req=%s path=%s reason=%s",
            c->id[0] ? c->id : "-", c->path, how);
}

/* ------------------------------------------------------------ responses */

static void add_cors(conn_t *c, struct MHD_Response *r)
{
    const char *origin, *list = c->h->cfg.allowed_origins;
    if (!list || !*list)
        return;
    origin = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin");
    if (!strcmp(list, "*")) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        return;
    }
    if (!origin)
        return;
    size_t n = strlen(origin);
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && *p == ' ') { p++; len--; }
        while (len && p[len - 1] == ' ') len--;
        if ((len == 1 && *p == '*') || (len == n && !strncmp(p, origin, n))) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
            MHD_add_response_header(r, "Vary", "Origin");
            return;
        }
        p = comma ? comma + 1 : NULL;
    }
}

/* Queue r with status; takes ownership of r. */
static enum MHD_Result send_response(conn_t *c, int status,
                                     struct MHD_Response *r)
{
    enum MHD_Result ret;
    if (!r)
        return MHD_NO;
    add_cors(c, r);
    {
        /* otel: W3C Trace Context: the span that answered */
        char tp[DSQ_TRACEPARENT_LEN + 1];
        dsq_trace_format(&c->tr, tp);
        MHD_add_response_header(r, "traceparent", tp);
        if (c->tr.tracestate[0])
            MHD_add_response_header(r, "tracestate", c->tr.tracestate);
    }
    c->status = status;
    c->responded = true;
    ret = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Takes ownership of body (malloc'd). */
static enum MHD_Result send_body(conn_t *c, int status, char *body,
                                 const char *ctype)
{
    struct MHD_Response *r;
    if (!body)
        return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(body), body,
                                        MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    return send_response(c, status, r);
}

static enum MHD_Result send_json(conn_t *c, int status, cJSON *obj)
{
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    return send_body(c, status, s, "application/json");
}

static enum MHD_Result send_error(conn_t *c, dsq_apierr_t kind,
                                  const char *param, const char *msg)
{
    int status = dsq_apierr_status(kind);
    char *body = dsq_apierr_json(kind, msg, param);
    /* users: the access log line of a 4xx/5xx names the error */
    c->err_code = dsq_apierr_code(kind) ? dsq_apierr_code(kind) : dsq_apierr_type(kind);
    snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg ? msg : "");
    for (char *q = c->err_msg; *q; q++)
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
            *q = '\'';
    struct MHD_Response *r;
    if (!body)
        return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(body), body,
                                        MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (kind == DSQ_APIERR_RATE_LIMIT || kind == DSQ_APIERR_UNAVAILABLE ||
        kind == DSQ_APIERR_OVERLOADED) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", c->retry_after_s > 0 ? c->retry_after_s : 1);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    if (kind == DSQ_APIERR_AUTH)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (kind == DSQ_APIERR_METHOD) {
        const char *allow = "GET, HEAD";
        if (c->route == R_COMPLETIONS || c->route == R_TOKENIZE ||
            c->route == R_DETOKENIZE || c->route == R_CHAT)
            allow = "POST";
        if (c->h->cfg.allowed_origins)
            allow = (!strcmp(allow, "POST")) ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
        MHD_add_response_header(r, "Allow", allow);
    }
    if (kind == DSQ_APIERR_TOO_LARGE || c->close_after)
        MHD_add_response_header(r, "Connection", "close");
    return send_response(c, status, r);
}

static enum MHD_Result send_api_error(conn_t *c, const dsq_api_error_t *e)
{
    return send_error(c, e->kind, e->param, e->message);
}

/* ------------------------------------------------------------ auth */

static bool authorized(conn_t *c)
{
    const char *a;
    unsigned char got[SHA256_DIGEST_LENGTH];
    if (!c->h->have_key)
        return true;
    a = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return false;
    a += 7;
    while (*a == ' ')
        a++;
    /* Hash both sides so the comparison is constant-time in the key's
     * length too, then compare the digests with CRYPTO_memcmp. */
    SHA256((const unsigned char *)a, strlen(a), got);
    return CRYPTO_memcmp(got, c->h->key_hash, sizeof(got)) == 0;
}

/* ------------------------------------------------------------ simple routes */

static dsq_openai_limits_t limits(conn_t *c)
{
    dsq_openai_limits_t lim = {c->h->cfg.served_model_name,
                               c->tok ? dsq_tokenizer_n_vocab(c->tok) : 0,
                               c->h->cfg.max_seqs_per_request};
    return lim;
}

static enum MHD_Result do_health(conn_t *c)
{
    if (!atomic_load(&c->h->engine))
        return send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "model is loading");
    if (atomic_load(&c->h->draining))
        return send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "server is draining");
    return send_body(c, 200, strdup("{\"status\":\"ok\"}"), "application/json");
}

/* The model object of GET /v1/models and /v1/models/{id} (OpenAI's Model:
 * id, object, created, owned_by; vLLM adds root, parent, max_model_len). */
static cJSON *model_object(conn_t *c)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", c->h->cfg.served_model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)c->h->cfg.created);
    cJSON_AddStringToObject(m, "owned_by", "dsq");
    cJSON_AddStringToObject(m, "root", c->h->cfg.served_model_name);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len",
                            c->e ? dsq_engine_max_model_len(c->e) : 0);
    return m;
}

static enum MHD_Result do_models(conn_t *c)
{
    cJSON *o = cJSON_CreateObject(), *data;
    cJSON_AddStringToObject(o, "object", "list");
    data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_object(c));
    return send_json(c, 200, o);
}

/* users: GET /v1/models/{id} (the SDKs' models.retrieve): the model, or 404
 * model_not_found. The id is the rest of the path, percent-decoded by
 * libmicrohttpd; ids with '/' (e.g. "org/name") are kept whole. */
static enum MHD_Result do_model(conn_t *c)
{
    if (strcmp(c->model_id, c->h->cfg.served_model_name)) {
        /* the id as sent may be any bytes: at most 200 of them, invalid
         * UTF-8 (or a cut character) replaced, so the body stays JSON */
        size_t n = strlen(c->model_id), clean_len = 0;
        char *clean = dsq_openai_utf8_clean(c->model_id, n > 200 ? 200 : n, &clean_len);
        char msg[900];
        snprintf(msg, sizeof(msg), "The model '%s%s' does not exist; this server serves "
                 "'%s'", clean ? clean : "?", n > 200 ? "..." : "",
                 c->h->cfg.served_model_name);
        free(clean);
        return send_error(c, DSQ_APIERR_MODEL_NOT_FOUND, "model", msg);
    }
    return send_json(c, 200, model_object(c));
}

/* users: GET /tokenizer_info as vLLM serves it (lm-evaluation-harness's
 * tokenizer_backend=remote reads eos_token / bos_token / pad_token and
 * chat_template, then tokenizes through /tokenize and /detokenize):
 * token texts (null when the vocabulary has none) and ids, the vocabulary
 * size, whether BOS is added, model_max_length (= max_model_len) and the
 * chat template the server renders with (null when there is none). */
static cJSON *token_field(cJSON *o, const char *name, const dsq_tokenizer_t *t, int32_t id)
{
    char key[32];
    size_t len = 0;
    const char *s = id >= 0 ? dsq_tokenizer_token_str(t, id, &len) : NULL;
    cJSON *v = s ? cJSON_CreateString(s) : cJSON_CreateNull();
    cJSON_AddItemToObject(o, name, v);
    snprintf(key, sizeof(key), "%s_id", name);
    if (id >= 0)
        cJSON_AddNumberToObject(o, key, id);
    else
        cJSON_AddNullToObject(o, key);
    return v;
}

static enum MHD_Result do_tokenizer_info(conn_t *c)
{
    const dsq_tokenizer_t *t = c->tok;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tokenizer_class",
                            dsq_tokenizer_kind(t) == DSQ_TOKENIZER_BPE ? "bpe (byte-level)"
                                                                       : "sentencepiece");
    token_field(o, "bos_token", t, dsq_tokenizer_bos(t));
    token_field(o, "eos_token", t, dsq_tokenizer_eos(t));
    token_field(o, "pad_token", t, dsq_tokenizer_pad(t));
    cJSON_AddBoolToObject(o, "add_bos_token", dsq_tokenizer_add_bos(t));
    cJSON_AddNumberToObject(o, "vocab_size", dsq_tokenizer_n_vocab(t));
    cJSON_AddNumberToObject(o, "model_max_length", dsq_engine_max_model_len(c->e));
    const char *tmpl = dsq_chat_template_source(c->h->chat);
    if (tmpl)
        cJSON_AddStringToObject(o, "chat_template", tmpl);
    else
        cJSON_AddNullToObject(o, "chat_template");
    return send_json(c, 200, o);
}

static enum MHD_Result do_version(conn_t *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", DSQ_VERSION);
    return send_json(c, 200, o);
}

static enum MHD_Result do_metrics(conn_t *c)
{
    dsq_engine_stats_t st;
    char *s;
    if (c->e)
        dsq_engine_stats(c->e, &st);
    dsq_metrics_extra_t ext = {0};
    if (c->h->cfg.otlp) {
        dsq_otlp_stats_t os;
        dsq_otlp_stats(c->h->cfg.otlp, &os);
        ext.otlp_on = true;
        ext.otlp_spans_exported = os.exported;
        ext.otlp_spans_dropped_queue_full = os.dropped_queue_full;
        ext.otlp_spans_dropped_export_failed = os.dropped_export_failed;
        ext.otlp_spans_queued = os.queued;
        ext.otlp_export_requests = os.export_requests;
        ext.otlp_export_failures = os.export_failures;
    }
    s = dsq_metrics_render(c->h->metrics, c->e ? &st : NULL,
                           c->h->cfg.served_model_name, &ext);
    return send_body(c, 200, s, "text/plain; version=0.0.4; charset=utf-8");
}

static unsigned tok_flags(const dsq_tokenizer_t *t, bool add_special)
{
    return DSQ_TOK_PARSE_SPECIAL |
           (add_special && dsq_tokenizer_add_bos(t) ? DSQ_TOK_ADD_BOS : 0u);
}

static enum MHD_Result do_tokenize(conn_t *c)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = limits(c);
    dsq_tokenize_req_t q;
    char *prompt = NULL;
    size_t plen = 0, n_ids = 0;
    int32_t *ids = NULL;
    enum MHD_Result ret;
    cJSON *o, *arr;
    int rc;
    if (dsq_openai_parse_tokenize_req(c->body, c->body_len, &lim, &q, &err))
        return send_api_error(c, &err);
    if (q.messages) {
        /* chatapi: the prompt /v1/chat/completions would submit */
        if (dsq_chat_render(c->h->chat, q.messages, q.tools,
                            q.add_generation_prompt, &prompt, &plen, &err)) {
            dsq_tokenize_req_deinit(&q);
            return send_api_error(c, &err);
        }
        rc = dsq_chat_tokenize(c->h->chat, prompt, plen, q.add_special, &ids,
                               &n_ids);
    } else {
        rc = dsq_tokenizer_encode(c->tok, q.prompt, q.prompt_len,
                                  tok_flags(c->tok, q.add_special), &ids, &n_ids);
    }
    dsq_tokenize_req_deinit(&q);
    if (rc) {
        free(prompt);
        return send_error(c, DSQ_APIERR_INTERNAL, NULL, "tokenizer failed");
    }
    o = cJSON_CreateObject();
    arr = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < n_ids; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "count", (double)n_ids);
    cJSON_AddNumberToObject(o, "max_model_len", dsq_engine_max_model_len(c->e));
    ret = send_json(c, 200, o);
    free(ids);
    free(prompt);
    return ret;
}

static enum MHD_Result do_detokenize(conn_t *c)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = limits(c);
    int32_t *ids = NULL;
    int n_ids = 0;
    char *text = NULL, *clean;
    size_t len = 0;
    cJSON *o;
    if (dsq_openai_parse_detokenize(c->body, c->body_len, &lim, &ids, &n_ids,
                                    &err))
        return send_api_error(c, &err);
    if (dsq_tokenizer_decode(c->tok, ids, (size_t)n_ids, false, &text, &len)) {
        free(ids);
        return send_error(c, DSQ_APIERR_INVALID_REQUEST, "tokens",
                          "'tokens' holds an id outside the vocabulary");
    }
    free(ids);
    clean = dsq_openai_utf8_clean(text, len, NULL);
    free(text);
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", clean ? clean : "");
    free(clean);
    return send_json(c, 200, o);
}

/* ------------------------------------------------------------ completions */

static const char *token_text(void *u, int32_t id, size_t *len)
{
    return dsq_tokenizer_token_bytes(u, id, len);
}

static int append(char **p, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256);
        while (nc < *len + n + 1)
            nc *= 2;
        char *q = realloc(*p, nc);
        if (!q)
            return DSQ_ENOMEM;
        *p = q;
        *cap = nc;
    }
    memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = '\0';
    return DSQ_OK;
}

static int pend_add(conn_t *c, char *s)
{
    int rc = DSQ_ENOMEM;
    if (s)
        rc = append(&c->pend, &c->pend_len, &c->pend_cap, s, strlen(s));
    free(s);
    return rc;
}

/* Text of prompt p to echo (malloc'd). */
static char *echo_text(conn_t *c, int p, size_t *len)
{
    const dsq_prompt_t *q = &c->req.prompts[p];
    char *t = NULL;
    if (q->text) {
        *len = q->text_len;
        return strndup(q->text, q->text_len);
    }
    if (dsq_tokenizer_decode(c->tok, q->ids, (size_t)q->n_ids, false, &t, len))
        return NULL;
    return t;
}

static void chat_stream_output(conn_t *c, int idx, choice_st *ch,
                               dsq_output_t *o);

/* api: echo + logprobs. The request's first event carries the prompt's
 * logprobs: add the prompt's entries to every choice of prompt p (before
 * any completion entry: no choice of p had an event yet). Streaming, the
 * echo chunk was held back for this and is sent now, text and logprobs
 * together. */
static void echo_prompt_logprobs(conn_t *c, int p, const dsq_output_t *o)
{
    const dsq_prompt_t *pr = &c->req.prompts[p];
    int n = c->req.sp.n;
    for (int k = 0; k < n; k++) {
        int idx = p * n + k;
        size_t tl = 0;
        if (!c->req.stream) {
            if (c->choices[idx].lp)
                dsq_openai_logprobs_add_prompt(c->choices[idx].lp, pr->ids, pr->n_ids, o,
                                               token_text, (void *)c->tok, &tl);
        } else {
            cJSON *lp = dsq_openai_logprobs_new();
            size_t len = 0;
            char *t = echo_text(c, p, &len);
            if (lp && t)
                dsq_openai_logprobs_add_prompt(lp, pr->ids, pr->n_ids, o, token_text,
                                               (void *)c->tok, &tl);
            if (t)
                pend_add(c, dsq_openai_chunk(c->id, c->created,
                                             c->h->cfg.served_model_name, idx, t, len,
                                             lp, DSQ_FINISH_NONE, c->req.include_usage));
            free(t);
            cJSON_Delete(lp);
        }
        c->echo_len[p] = tl;
    }
}

static void handle_output(conn_t *c, int p, dsq_output_t *o)
{
    double t = dsq_clock_now_s();
    int n = c->req.sp.n;
    int idx = p * n + (o->index >= 0 && o->index < n ? o->index : 0);
    choice_st *ch = &c->choices[idx];
    dsq_metrics_t *m = c->h->metrics;

    if (o->queue_us > 0 && c->queue_ms < 0) {
        c->queue_ms = (double)o->queue_us / 1e3;
        dsq_metrics_observe(m, DSQ_HIST_QUEUE, (double)o->queue_us / 1e6);
    }
    if (o->n_tokens > 0) {
        if (c->t_first == 0) {
            c->t_first = t;
            dsq_metrics_observe(m, DSQ_HIST_TTFT, t - c->t_start);
        }
        if (ch->t_last > 0)
            dsq_metrics_observe(m, DSQ_HIST_ITL, (t - ch->t_last) / o->n_tokens);
        ch->t_last = t;
        ch->n_tokens += o->n_tokens;
    }
    c->discarded_tokens += o->discarded_tokens;
    if (c->req.sp.prompt_logprobs && !c->req.chat && !c->echo_done[p]) {
        /* the request's first event (it carries the prompt's logprobs) */
        c->echo_done[p] = true;
        echo_prompt_logprobs(c, p, o);
    }
    if (o->finish != DSQ_FINISH_NONE) {
        if (o->queue_timeout)
            c->queue_timeout = true;
        ch->finish = o->finish;
        if (o->completion_tokens > 0)
            ch->final_tokens = o->completion_tokens;
        if (o->cached_tokens > c->cached_tokens[p])
            c->cached_tokens[p] = o->cached_tokens;
    }
    if (!c->req.stream) {
        if (o->text_len)
            append(&ch->text, &ch->len, &ch->cap, o->text, o->text_len);
        if (ch->lp && c->req.chat)
            dsq_openai_chat_logprobs_add(ch->lp, o, token_text, (void *)c->tok);
        else if (ch->lp)
            dsq_openai_logprobs_add(ch->lp, o, c->req.echo ? c->echo_len[p] : 0,
                                    token_text, (void *)c->tok);
        return;
    }
    if (c->req.chat) {
        chat_stream_output(c, idx, ch, o);
        return;
    }
    if (o->text_len || o->n_tokens || o->finish != DSQ_FINISH_NONE) {
        cJSON *lp = NULL;
        if (c->req.sp.logprobs >= 0 && (lp = dsq_openai_logprobs_new()))
            dsq_openai_logprobs_add(lp, o, c->req.echo ? c->echo_len[p] : 0,
                                    token_text, (void *)c->tok);
        pend_add(c, dsq_openai_chunk(c->id, c->created, c->h->cfg.served_model_name,
                                     idx, o->text ? o->text : "", o->text_len, lp,
                                     o->finish, c->req.include_usage));
        cJSON_Delete(lp);
    }
}

/* issue 22: tool calls of a chat choice, streamed. The content delta *d
 * goes into the choice's hold buffer; what cannot be the start of a call
 * (dsq_tool_calls_safe_prefix, and not trailing whitespace, which the
 * non-streamed answer trims before a call) is given back in *d to send.
 * At the finish the held text is parsed: true when it held calls (then
 * *d is the content around them, tool_stream_calls sends them), else all
 * of it is content. */
static bool tool_stream_hold(conn_t *c, int idx, choice_st *ch, dsq_reasoning_delta_t *d,
                             dsq_finish_t finish)
{
    (void)idx;
    if (d->content_len) {
        if (ch->th_len + d->content_len + 1 > ch->th_cap) {
            size_t cap = (ch->th_len + d->content_len + 1) * 2;
            char *p = realloc(ch->th, cap);
            if (!p)
                return false;   /* out of memory: the delta goes out as is */
            ch->th = p;
            ch->th_cap = cap;
        }
        memcpy(ch->th + ch->th_len, d->content, d->content_len);
        ch->th_len += d->content_len;
        ch->th[ch->th_len] = '\0';
    }
    free(d->content);
    d->content = NULL;
    d->content_len = 0;
    size_t emit = 0;
    bool called = false;
    if (finish == DSQ_FINISH_NONE) {
        emit = dsq_tool_calls_safe_prefix(c->tools, ch->th ? ch->th : "", ch->th_len);
        while (emit > 0 && strchr(" \t\r\n", ch->th[emit - 1]))
            emit--;
    } else {
        dsq_tool_parse_t r;
        if (ch->th_len && finish == DSQ_FINISH_STOP &&
            dsq_tool_calls_parse(c->tools, ch->th, ch->th_len, &r) == DSQ_OK) {
            if (r.n_calls > 0) {
                called = true;
                /* the content around the calls, as the non-streamed
                 * answer has it: after what went out, a newline */
                size_t n = r.content_len + (ch->th_any && r.content_len ? 1 : 0);
                char *t = malloc(n + 1);
                if (t) {
                    size_t k = 0;
                    if (ch->th_any && r.content_len)
                        t[k++] = '\n';
                    memcpy(t + k, r.content, r.content_len);
                    t[n] = '\0';
                    d->content = t;
                    d->content_len = n;
                }
                /* the calls stay in ch->th as the parsed text for
                 * tool_stream_calls */
            }
            dsq_tool_parse_free(&r);
        }
        if (!called)
            emit = ch->th_len;
    }
    if (emit > 0) {
        d->content = strndup(ch->th, emit);
        d->content_len = d->content ? emit : 0;
        memmove(ch->th, ch->th + emit, ch->th_len - emit + 1);
        ch->th_len -= emit;
        ch->th_any = true;
    }
    return called;
}

/* The held text's calls as one delta.tool_calls chunk. */
static void tool_stream_calls(conn_t *c, int idx, choice_st *ch)
{
    dsq_tool_parse_t r;
    if (dsq_tool_calls_parse(c->tools, ch->th, ch->th_len, &r) != DSQ_OK)
        return;
    dsq_tool_call_out_t *out = calloc((size_t)r.n_calls, sizeof(*out));
    char (*ids)[40] = calloc((size_t)r.n_calls, sizeof(*ids));
    if (out && ids) {
        for (int k = 0; k < r.n_calls; k++) {
            dsq_openai_new_id(ids[k], sizeof(ids[k]), "call_");
            out[k] = (dsq_tool_call_out_t){ids[k], r.calls[k].name, r.calls[k].arguments};
        }
        pend_add(c, dsq_openai_chat_tool_chunk(c->id, c->created, c->h->cfg.served_model_name,
                                               idx, out, r.n_calls, 0, c->req.include_usage));
    }
    free(out);
    free(ids);
    dsq_tool_parse_free(&r);
}

/* chatapi: one engine event of a streamed chat choice -> content /
 * reasoning_content deltas, then a separate finish_reason chunk. */
static void chat_stream_output(conn_t *c, int idx, choice_st *ch,
                               dsq_output_t *o)
{
    const char *model = c->h->cfg.served_model_name;
    dsq_reasoning_delta_t d = {0}, f = {0};
    cJSON *lp = NULL;
    bool usage_null = c->req.include_usage;
    if (c->reasoning) {
        if (dsq_reasoning_feed(&ch->rs, o->text ? o->text : "", o->text_len, &d))
            memset(&d, 0, sizeof(d));
        if (o->finish != DSQ_FINISH_NONE && !dsq_reasoning_flush(&ch->rs, &f)) {
            char *q = realloc(d.content, d.content_len + f.content_len + 1);
            char *r = realloc(d.reasoning, d.reasoning_len + f.reasoning_len + 1);
            if (q) {
                memcpy(q + d.content_len, f.content ? f.content : "", f.content_len);
                d.content = q;
                d.content_len += f.content_len;
                q[d.content_len] = '\0';
            }
            if (r) {
                memcpy(r + d.reasoning_len, f.reasoning ? f.reasoning : "",
                       f.reasoning_len);
                d.reasoning = r;
                d.reasoning_len += f.reasoning_len;
                r[d.reasoning_len] = '\0';
            }
            dsq_reasoning_delta_free(&f);
        }
    } else if (o->text_len) {
        d.content = strndup(o->text, o->text_len);
        d.content_len = d.content ? o->text_len : 0;
    }
    bool called = false;
    if (c->tools != DSQ_TOOL_PARSER_NONE)
        called = tool_stream_hold(c, idx, ch, &d, o->finish);
    if (c->req.sp.logprobs >= 0 && o->n_tokens &&
        (lp = dsq_openai_chat_logprobs_new()))
        dsq_openai_chat_logprobs_add(lp, o, token_text, (void *)c->tok);
    if (d.content_len || d.reasoning_len || lp)
        pend_add(c, dsq_openai_chat_chunk(
                        c->id, c->created, model, idx, NULL,
                        d.content_len || !d.reasoning_len ? (d.content ? d.content : "") : NULL,
                        d.content_len, d.reasoning_len ? d.reasoning : NULL,
                        d.reasoning_len, lp, DSQ_FINISH_NONE, usage_null));
    if (called)
        tool_stream_calls(c, idx, ch);
    if (o->finish != DSQ_FINISH_NONE)
        pend_add(c, called ? dsq_openai_chat_tool_finish_chunk(c->id, c->created, model, idx,
                                                               usage_null)
                           : dsq_openai_chat_chunk(c->id, c->created, model, idx, NULL,
                                                   NULL, 0, NULL, 0, NULL, o->finish,
                                                   usage_null));
    cJSON_Delete(lp);
    dsq_reasoning_delta_free(&d);
}

/* Pop every pending event. Returns true when every engine request ended. */
static bool drain_events(conn_t *c)
{
    bool all = true;
    for (int p = 0; p < c->n_ereqs; p++) {
        dsq_output_t o;
        int r;
        while (!c->ereq_done[p]) {
            memset(&o, 0, sizeof(o));
            r = dsq_req_next(c->ereqs[p], &o);
            if (r == 1) {
                handle_output(c, p, &o);
                dsq_output_free(&o);
            } else if (r < 0) {
                c->ereq_done[p] = true;
            } else {
                break;
            }
        }
        all = all && c->ereq_done[p];
    }
    return all;
}

static void usage_of(conn_t *c, dsq_usage_t *u)
{
    memset(u, 0, sizeof(*u));
    for (int p = 0; p < c->n_ereqs; p++) {
        u->prompt_tokens += c->prompt_tokens[p];
        u->cached_tokens += c->cached_tokens[p];
    }
    for (int i = 0; i < c->n_choices; i++)
        u->completion_tokens += c->choices[i].final_tokens > 0
                                    ? c->choices[i].final_tokens
                                    : c->choices[i].n_tokens;
    /* api: best_of > n: OpenAI bills every generated candidate */
    u->completion_tokens += c->discarded_tokens;
    u->has_cached = c->h->cfg.prefix_caching;
}

/* admission: the message of a request refused after it was queued: the
 * admission policy's reason (and its Retry-After into c), else the
 * --max-queue-wait one. Points into buf or at a constant. */
static const char *refusal_msg(conn_t *c, char *buf, size_t len)
{
    for (int p = 0; p < c->n_ereqs; p++) {
        int ra = c->ereqs[p] ? dsq_req_refusal(c->ereqs[p], buf, len) : 0;
        if (ra > 0) {
            c->retry_after_s = ra;
            return buf;
        }
    }
    return QUEUE_TIMEOUT_MSG;
}

typedef enum { W_PENDING, W_DONE, W_DATA, W_GONE, W_TIMEOUT, W_STOPPING } wait_result_t;

static enum MHD_Result start_stream(conn_t *c);
static enum MHD_Result stream_when_admitted(conn_t *c);

/* One look at a request being answered, never blocking: drain the engine's
 * events, then watch the client, the timeout and the drain/stop flags.
 * W_PENDING: nothing to do until the next wake-up (the caller parks). */
static wait_result_t poll_progress(conn_t *c)
{
    dsq_http_t *h = c->h;
    bool done = drain_events(c);
    if (done)
        return W_DONE;
    /* held back by admission (stream_held), what is pending (a chat
     * stream's role chunk, an echo) waits for the 200: the client, stop
     * and timeout checks below still run */
    if (c->req.stream && !c->stream_held && c->pend_len > c->pend_off)
        return W_DATA;
    if (atomic_load(&h->no_park)) {
        cancel_all(c);
        return W_STOPPING;
    }
    if (c->cancelled) {
        if (dsq_clock_now_s() - c->t_cancel > CANCEL_GRACE_S)
            return W_STOPPING;
    } else if (atomic_load(&h->stopping)) {
        cancel_all(c);
    } else if (client_gone(c)) {
        /* users: a client hang-up is normal: info, with the request id
         * (libmicrohttpd's own "application error" line that follows
         * a stream's end is logged at debug, log_mhd) */
        log_disconnect(c, "client closed the connection; its sequences are cancelled");
        tl_client_gone = true;
        cancel_all(c);
        return W_GONE;
    } else if (h->cfg.request_timeout_s > 0 &&
               dsq_clock_now_s() - c->t_start > h->cfg.request_timeout_s) {
        cancel_all(c);
        if (!c->req.stream)
            return W_TIMEOUT;
    }
    return W_PENDING;
}

/* Suspend c's connection until the next wake-up, unless one came since
 * `seen` (then false: look again). Only from c's access handler or stream
 * reader (libmicrohttpd's rule for MHD_suspend_connection). */
static bool park(conn_t *c, uint64_t seen)
{
    waiter_t *w = c->w;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    double wake_at = 0;
    if (c->cancelled)
        wake_at = c->t_cancel + CANCEL_GRACE_S + 0.01;
    else if (c->h->cfg.request_timeout_s > 0)
        wake_at = c->t_start + c->h->cfg.request_timeout_s + 0.01;
    pthread_mutex_lock(&w->mu);
    if (w->seq != seen || atomic_load(&c->h->no_park)) {
        pthread_mutex_unlock(&w->mu);
        return false;
    }
    w->mc = c->mc;
    w->fd = ci ? ci->connect_fd : -1;
    w->wake_at = wake_at;
    w->parked = true;
    MHD_suspend_connection(c->mc);
    pthread_mutex_unlock(&w->mu);
    return true;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    conn_t *c = cls;
    (void)pos;
    for (;;) {
        if (c->pend_len > c->pend_off) {
            size_t n = c->pend_len - c->pend_off;
            if (n > max)
                n = max;
            memcpy(buf, c->pend + c->pend_off, n);
            c->pend_off += n;
            if (c->pend_off == c->pend_len)
                c->pend_off = c->pend_len = 0;
            return (ssize_t)n;
        }
        if (c->stream_finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        uint64_t seen = waiter_seq(c->w);
        wait_result_t w = poll_progress(c);
        if (w == W_GONE)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (w == W_PENDING) {
            if (park(c, seen))
                return 0;    /* resumed by the next wake-up */
            continue;
        }
        if (w == W_DONE || w == W_STOPPING || w == W_TIMEOUT) {
            if (c->queue_timeout) {
                /* hardening: the 200 and its headers are out: the refusal
                 * is an error event (as vLLM streams errors), then [DONE] */
                char rbuf[200];
                const char *msg = refusal_msg(c, rbuf, sizeof(rbuf));
                char *e = dsq_apierr_json(DSQ_APIERR_OVERLOADED, msg, NULL);
                size_t n = e ? strlen(e) + 16 : 0;
                char *ev = e ? malloc(n) : NULL;
                if (ev)
                    snprintf(ev, n, "data: %s\n\n", e);
                free(e);
                pend_add(c, ev);
                c->err_code = "queue_full";
                snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg);
            }
            if (c->req.include_usage) {
                dsq_usage_t u;
                usage_of(c, &u);
                pend_add(c, (c->req.chat ? dsq_openai_chat_usage_chunk
                                         : dsq_openai_usage_chunk)(
                                c->id, c->created, c->h->cfg.served_model_name, &u));
            }
            pend_add(c, strdup("data: [DONE]\n\n"));
            c->stream_finished = true;
        }
    }
}

/* chatapi: the chat.completion body; the whole text of each choice goes
 * through the reasoning parser at once. */
static enum MHD_Result finish_chat_nonstream(conn_t *c)
{
    dsq_chat_choice_out_t *outs = calloc((size_t)c->n_choices, sizeof(*outs));
    dsq_reasoning_delta_t *ds = calloc((size_t)c->n_choices, sizeof(*ds));
    /* issue 22: per choice, the parsed calls, their output rows and ids */
    bool tools = c->tools != DSQ_TOOL_PARSER_NONE;
    dsq_tool_parse_t *tp = tools ? calloc((size_t)c->n_choices, sizeof(*tp)) : NULL;
    dsq_tool_call_out_t **tc = tools ? calloc((size_t)c->n_choices, sizeof(*tc)) : NULL;
    char (**tid)[40] = tools ? calloc((size_t)c->n_choices, sizeof(*tid)) : NULL;
    dsq_usage_t u;
    char *body = NULL;
    bool ok = outs && ds && (!tools || (tp && tc && tid));
    for (int i = 0; ok && i < c->n_choices; i++) {
        choice_st *ch = &c->choices[i];
        outs[i].index = i;
        outs[i].content = ch->text ? ch->text : "";
        outs[i].content_len = ch->len;
        outs[i].logprobs = ch->lp;
        outs[i].finish = ch->finish;
        if (c->reasoning) {
            dsq_reasoning_t rs;
            dsq_reasoning_delta_t tail = {0};
            dsq_reasoning_init(&rs, c->prompt_in_think);
            if (dsq_reasoning_feed(&rs, outs[i].content, outs[i].content_len,
                                   &ds[i]) ||
                dsq_reasoning_flush(&rs, &tail)) {
                ok = false;
                break;
            }
            /* only a held tag prefix can remain, and it belongs to the
             * part the parser ended in */
            if (tail.reasoning_len || tail.content_len) {
                dsq_reasoning_delta_t *d = &ds[i];
                bool r = tail.reasoning_len > 0;
                char **p = r ? &d->reasoning : &d->content;
                size_t *pl = r ? &d->reasoning_len : &d->content_len;
                const char *t = r ? tail.reasoning : tail.content;
                size_t tl = r ? tail.reasoning_len : tail.content_len;
                char *q = realloc(*p, *pl + tl + 1);
                if (q) {
                    memcpy(q + *pl, t, tl);
                    *pl += tl;
                    q[*pl] = '\0';
                    *p = q;
                }
            }
            dsq_reasoning_delta_free(&tail);
            outs[i].content = ds[i].content;
            outs[i].content_len = ds[i].content_len;
            outs[i].reasoning = ds[i].reasoning_len ? ds[i].reasoning : NULL;
            outs[i].reasoning_len = ds[i].reasoning_len;
        }
        /* issue 22: tool calls parsed out of a choice that stopped */
        if (c->tools != DSQ_TOOL_PARSER_NONE && ch->finish == DSQ_FINISH_STOP && tp && tc) {
            if (dsq_tool_calls_parse(c->tools, outs[i].content, outs[i].content_len, &tp[i])) {
                ok = false;
                break;
            }
            if (tp[i].n_calls > 0) {
                tc[i] = calloc((size_t)tp[i].n_calls, sizeof(*tc[i]));
                tid[i] = calloc((size_t)tp[i].n_calls, sizeof(*tid[i]));
                if (!tc[i] || !tid[i]) {
                    ok = false;
                    break;
                }
                for (int k = 0; k < tp[i].n_calls; k++) {
                    dsq_openai_new_id(tid[i][k], sizeof(tid[i][k]), "call_");
                    tc[i][k] = (dsq_tool_call_out_t){tid[i][k], tp[i].calls[k].name,
                                                     tp[i].calls[k].arguments};
                }
                outs[i].content = tp[i].content;
                outs[i].content_len = tp[i].content_len;
                outs[i].tool_calls = tc[i];
                outs[i].n_tool_calls = tp[i].n_calls;
            }
        }
    }
    if (ok) {
        usage_of(c, &u);
        body = dsq_openai_chat_body(c->id, c->created,
                                    c->h->cfg.served_model_name, outs,
                                    c->n_choices, &u);
    }
    for (int i = 0; ds && i < c->n_choices; i++)
        dsq_reasoning_delta_free(&ds[i]);
    for (int i = 0; tools && tp && tc && tid && i < c->n_choices; i++) {
        dsq_tool_parse_free(&tp[i]);
        free(tc[i]);
        free(tid[i]);
    }
    free(tp);
    free(tc);
    free(tid);
    free(ds);
    free(outs);
    if (!body)
        return send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    return send_body(c, 200, body, "application/json");
}

/* A non-streaming request after its submit, and again at each resume: the
 * answer once every sequence ended (or the request timed out, the client
 * left, the server stops), else park the connection. */
static enum MHD_Result finish_nonstream(conn_t *c)
{
    wait_result_t w;
    dsq_choice_out_t *outs;
    dsq_usage_t u;
    char *body;
    for (;;) {
        uint64_t seen = waiter_seq(c->w);
        /* a refused prompt of a list ends the request at once */
        if ((w = poll_progress(c)) != W_PENDING || c->queue_timeout)
            break;
        if (park(c, seen))
            return MHD_YES;      /* the access handler runs again on resume */
    }
    if (w == W_GONE)
        return MHD_NO;
    if (w == W_TIMEOUT)
        return send_error(c, DSQ_APIERR_TIMEOUT, NULL,
                          "request ran past --request-timeout");
    if (w == W_STOPPING)
        return send_error(c, DSQ_APIERR_UNAVAILABLE, NULL,
                          "server is shutting down");
    if (c->queue_timeout) {
        char rbuf[200];
        cancel_all(c);
        return send_error(c, DSQ_APIERR_OVERLOADED, NULL, refusal_msg(c, rbuf, sizeof(rbuf)));
    }
    if (c->req.chat)
        return finish_chat_nonstream(c);
    outs = calloc((size_t)c->n_choices, sizeof(*outs));
    if (!outs)
        return send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    for (int i = 0; i < c->n_choices; i++) {
        outs[i].index = i;
        outs[i].text = c->choices[i].text ? c->choices[i].text : "";
        outs[i].text_len = c->choices[i].len;
        outs[i].logprobs = c->choices[i].lp;
        outs[i].finish = c->choices[i].finish;
    }
    usage_of(c, &u);
    body = dsq_openai_completion_body(c->id, c->created,
                                      c->h->cfg.served_model_name, outs,
                                      c->n_choices, &u);
    free(outs);
    return send_body(c, 200, body, "application/json");
}

static enum MHD_Result start_requests(conn_t *c);

static enum MHD_Result do_completions(conn_t *c)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = limits(c);
    dsq_completion_req_t *q = &c->req;
    int max_len = dsq_engine_max_model_len(c->e);

    if (dsq_openai_parse_completion(c->body, c->body_len, &lim, q, &err))
        return send_api_error(c, &err);
    if (!q->sp.has_seed && c->h->cfg.default_seed >= 0) {   /* users: --seed */
        q->sp.has_seed = true;
        q->sp.seed = (uint64_t)c->h->cfg.default_seed;
    }
    c->have_req = true;
    /* tokenize, then check every prompt against the context before
     * submitting anything */
    for (int p = 0; p < q->n_prompts; p++) {
        dsq_prompt_t *pr = &q->prompts[p];
        if (pr->text) {
            size_t n = 0;
            if (dsq_tokenizer_encode(c->tok, pr->text, pr->text_len,
                                     tok_flags(c->tok, true), &pr->ids, &n))
                return send_error(c, DSQ_APIERR_INTERNAL, NULL,
                                  "tokenizer failed");
            pr->n_ids = (int)n;
        }
        if (pr->n_ids == 0)
            return send_error(c, DSQ_APIERR_INVALID_REQUEST, "prompt",
                              "the prompt is empty after tokenization");
        if (dsq_openai_check_context(pr->n_ids, q->sp.max_tokens, max_len, &err))
            return send_api_error(c, &err);
    }
    if (q->sp.prompt_logprobs) {
        /* attack2: every choice repeats its prompt's logprobs: bound the
         * response before anything is computed */
        int64_t entries = 0;
        for (int p = 0; p < q->n_prompts; p++)
            entries += (int64_t)q->sp.n * q->prompts[p].n_ids * (q->sp.logprobs + 1);
        if (entries > DSQ_OPENAI_MAX_PROMPT_LOGPROB_ENTRIES) {
            char msg[256];
            snprintf(msg, sizeof(msg), "echo with logprobs would return %lld prompt "
                     "logprob entries (n x prompt tokens x (logprobs + 1)); the "
                     "limit is %d: lower n or logprobs, or split the prompts",
                     (long long)entries, DSQ_OPENAI_MAX_PROMPT_LOGPROB_ENTRIES);
            return send_error(c, DSQ_APIERR_INVALID_REQUEST, "logprobs", msg);
        }
    }
    return start_requests(c);
}

/* chatapi: POST /v1/chat/completions. Renders the messages with the chat
 * template, tokenizes them into the request's single prompt, then shares
 * everything after tokenization with /v1/completions (start_requests). */
static enum MHD_Result do_chat(conn_t *c)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = limits(c);
    dsq_completion_req_t *q = &c->req;
    int max_len = dsq_engine_max_model_len(c->e);
    dsq_prompt_t *pr;
    size_t n = 0;

    if (dsq_openai_parse_chat(c->body, c->body_len, &lim, q, &err))
        return send_api_error(c, &err);
    if (!q->sp.has_seed && c->h->cfg.default_seed >= 0) {   /* users: --seed */
        q->sp.has_seed = true;
        q->sp.seed = (uint64_t)c->h->cfg.default_seed;
    }
    c->have_req = true;
    /* issue 22: tools. required / a named function: decoding is
     * constrained to calls in the model's syntax with valid arguments.
     * Before the template sees the tools, so a tool it cannot take is
     * refused naming 'tools' */
    if (q->tool_choice != DSQ_TOOL_CHOICE_NONE)
        c->tools = dsq_chat_tool_parser(c->h->chat);
    if (q->tool_choice >= DSQ_TOOL_CHOICE_REQUIRED) {
        char why[320] = "", *gbnf = NULL;
        int rc = c->tools == DSQ_TOOL_PARSER_NONE ? DSQ_EINVAL
               : dsq_chat_gbnf_for_tool_calls(q->tools,
                                              q->tool_choice == DSQ_TOOL_CHOICE_NAMED
                                                  ? q->tool_name : NULL,
                                              c->tools, q->parallel_tool_calls, &gbnf, why,
                                              sizeof(why));
        if (c->tools == DSQ_TOOL_PARSER_NONE)
            snprintf(why, sizeof(why), "--tool-call-parser none: no call syntax to constrain "
                     "to");
        if (!rc)
            rc = dsq_grammar_from_gbnf(gbnf, strlen(gbnf), NULL, &q->sp.grammar, why,
                                       sizeof(why));
        free(gbnf);
        if (rc == DSQ_ENOMEM)
            return send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        if (rc) {
            char msg[400];
            snprintf(msg, sizeof(msg), "'tools': %s", why);
            return send_error(c, rc == DSQ_EUNSUPPORTED ? DSQ_APIERR_UNSUPPORTED
                                                        : DSQ_APIERR_INVALID_REQUEST,
                              "tools", msg);
        }
    }
    if (!(q->prompts = calloc(1, sizeof(*q->prompts))))
        return send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    q->n_prompts = 1;
    pr = &q->prompts[0];
    if (dsq_chat_render(c->h->chat, q->messages, q->tools, true, &pr->text,
                        &pr->text_len, &err))
        return send_api_error(c, &err);
    if (dsq_chat_tokenize(c->h->chat, pr->text, pr->text_len, true, &pr->ids, &n))
        return send_error(c, DSQ_APIERR_INTERNAL, NULL, "tokenizer failed");
    pr->n_ids = (int)n;
    if (pr->n_ids == 0)
        return send_error(c, DSQ_APIERR_INVALID_REQUEST, "messages",
                          "the rendered prompt is empty");
    if (q->sp.max_tokens < 0)   /* no limit given: up to the context's end */
        q->sp.max_tokens = max_len - pr->n_ids > 0 ? max_len - pr->n_ids : 1;
    if (dsq_openai_check_context(pr->n_ids, q->sp.max_tokens, max_len, &err))
        return send_api_error(c, &err);
    c->reasoning = dsq_chat_has_reasoning(c->h->chat);
    c->prompt_in_think = c->reasoning &&
        dsq_reasoning_prompt_in_think(pr->text, pr->text_len);
    return start_requests(c);
}

/* Everything after tokenization, shared by completions and chat: create,
 * check and submit one engine request per prompt, then answer (JSON or
 * SSE). */
static enum MHD_Result start_requests(conn_t *c)
{
    dsq_api_error_t err;
    dsq_completion_req_t *q = &c->req;
    char reason[256];

    c->n_ereqs = q->n_prompts;
    c->n_choices = q->n_prompts * q->sp.n;
    c->ereqs = calloc((size_t)c->n_ereqs, sizeof(*c->ereqs));
    c->ereq_done = calloc((size_t)c->n_ereqs, sizeof(*c->ereq_done));
    c->prompt_tokens = calloc((size_t)c->n_ereqs, sizeof(*c->prompt_tokens));
    c->cached_tokens = calloc((size_t)c->n_ereqs, sizeof(*c->cached_tokens));
    c->echo_len = calloc((size_t)c->n_ereqs, sizeof(*c->echo_len));
    c->echo_done = calloc((size_t)c->n_ereqs, sizeof(*c->echo_done));
    c->choices = calloc((size_t)c->n_choices, sizeof(*c->choices));
    c->w = waiter_get(c->h);
    if (!c->ereqs || !c->ereq_done || !c->prompt_tokens || !c->cached_tokens ||
        !c->echo_len || !c->echo_done || !c->choices || !c->w ||
        dsq_openai_new_id(c->id, sizeof(c->id), q->chat ? "chatcmpl-" : "cmpl-"))
        return send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    c->created = (int64_t)time(NULL);
    for (int i = 0; i < c->n_choices; i++) {
        if (q->sp.logprobs >= 0 && !q->stream &&
            !(c->choices[i].lp = q->chat ? dsq_openai_chat_logprobs_new()
                                         : dsq_openai_logprobs_new()))
            return send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        if (q->chat) {
            /* the first delta of each choice carries the role */
            dsq_reasoning_init(&c->choices[i].rs, c->prompt_in_think);
            if (q->stream)
                pend_add(c, dsq_openai_chat_chunk(
                                c->id, c->created, c->h->cfg.served_model_name,
                                i, "assistant", "", 0, NULL, 0, NULL,
                                DSQ_FINISH_NONE, q->include_usage));
        }
        if (q->echo) {
            size_t len = 0;
            /* api: with logprobs, the streamed echo waits for the prompt's
             * logprobs (echo_prompt_logprobs) */
            char *t = q->stream && q->sp.prompt_logprobs ? NULL
                                                         : echo_text(c, i / q->sp.n, &len);
            if (t && q->stream)
                pend_add(c, dsq_openai_chunk(c->id, c->created,
                                             c->h->cfg.served_model_name, i, t,
                                             len, NULL, DSQ_FINISH_NONE,
                                             q->include_usage));
            else if (t)
                append(&c->choices[i].text, &c->choices[i].len,
                       &c->choices[i].cap, t, len);
            free(t);
        }
    }
    if (c->n_ereqs > dsq_engine_max_waiting(c->e)) {
        /* hardening: it could never be queued whole; retrying cannot help */
        for (int k = 0; k < c->n_ereqs; k++)
            c->ereq_done[k] = true;
        snprintf(reason, sizeof(reason), "this request has %d prompts; the server queues at "
                 "most %d requests (--max-waiting-requests): send fewer prompts per request",
                 c->n_ereqs, dsq_engine_max_waiting(c->e));
        return send_error(c, DSQ_APIERR_INVALID_REQUEST, "prompt", reason);
    }
    for (int p = 0; p < c->n_ereqs; p++) {
        dsq_prompt_t *pr = &q->prompts[p];
        reason[0] = '\0';
        c->prompt_tokens[p] = pr->n_ids;
        c->ereqs[p] = dsq_req_create(pr->ids, pr->n_ids, &q->sp, on_notify,
                                     c->w, reason, sizeof(reason));
        if (!c->ereqs[p]) {
            /* nothing was submitted yet: nothing to cancel or wait for */
            for (int k = 0; k < c->n_ereqs; k++)
                c->ereq_done[k] = true;
            return send_error(c, DSQ_APIERR_INVALID_REQUEST, NULL,
                              reason[0] ? reason : "invalid request");
        }
    }
    for (int p = 0; p < c->n_ereqs; p++) {
        int rc = dsq_engine_submit(c->e, c->ereqs[p]);
        if (rc) {
            /* requests never submitted report nothing: treat them as done */
            for (int k = p; k < c->n_ereqs; k++)
                c->ereq_done[k] = true;
            cancel_all(c);
            if (rc == DSQ_ERANGE) {
                dsq_openai_check_context(q->prompts[p].n_ids, q->sp.max_tokens,
                                         0, &err);
                return send_api_error(c, &err);
            }
            if (rc == DSQ_EFULL) {
                /* admission: the policy's own reason and Retry-After */
                char why[200];
                if ((c->retry_after_s = dsq_req_refusal(c->ereqs[p], why, sizeof(why))) > 0)
                    return send_error(c, DSQ_APIERR_OVERLOADED, NULL, why);
                return send_error(c, DSQ_APIERR_OVERLOADED, NULL,
                                  "the server's waiting queue is full; retry later");
            }
            return send_error(c, dsq_apierr_from_code(rc), NULL, dsq_strerror(rc));
        }
    }
    c->inflight = true;
    atomic_fetch_add(&c->h->n_inflight, 1);
    if (!q->stream)
        return finish_nonstream(c);
    for (int p = 0; p < c->n_ereqs; p++)
        c->stream_held |= c->ereqs[p] && dsq_req_held(c->ereqs[p]);
    if (c->stream_held)
        return stream_when_admitted(c);
    return start_stream(c);
}

/* The 200 of a streamed request: its events go out as they come
 * (stream_reader); what is already in c->pend (an echo) goes first. */
static enum MHD_Result start_stream(conn_t *c)
{
    {
        struct MHD_Response *r = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, c, NULL);
        if (!r)
            return MHD_NO;
        /* SSE is UTF-8 by definition (WHATWG HTML, server-sent events);
         * saying so, as OpenAI and vLLM do, keeps clients that default
         * text types to ISO-8859-1 (python-requests) from misreading it */
        MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        return send_response(c, 200, r);
    }
}

/* admission: a streamed request the adaptive policy holds back gets its
 * 200 only once admitted (dsq_req_held), so a refusal while it waits is a
 * 503 with Retry-After like one at submit, not an error event inside a
 * 200. After the submit, and again at each resume. */
static enum MHD_Result stream_when_admitted(conn_t *c)
{
    for (;;) {
        uint64_t seen = waiter_seq(c->w);
        if (c->h->cfg.request_timeout_s > 0 && !c->cancelled &&
            dsq_clock_now_s() - c->t_start > c->h->cfg.request_timeout_s) {
            cancel_all(c);
            return send_error(c, DSQ_APIERR_TIMEOUT, NULL,
                              "request ran past --request-timeout");
        }
        wait_result_t w = poll_progress(c);
        bool held = false;
        for (int p = 0; p < c->n_ereqs; p++)
            held |= c->ereqs[p] && !c->ereq_done[p] && dsq_req_held(c->ereqs[p]);
        if (w == W_GONE)
            return MHD_NO;
        if (w == W_STOPPING)
            return send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "server is shutting down");
        if (c->queue_timeout) {
            /* one prompt refused refuses the request: the others (a
             * prompt list) are cancelled, not computed for nothing */
            char rbuf[200];
            cancel_all(c);
            return send_error(c, DSQ_APIERR_OVERLOADED, NULL,
                              refusal_msg(c, rbuf, sizeof(rbuf)));
        }
        if (w == W_DONE || !held)
            break;
        if (park(c, seen))
            return MHD_YES;      /* the access handler runs again on resume */
    }
    c->stream_held = false;
    return start_stream(c);
}

/* ------------------------------------------------------------ dispatch */

static enum route find_route(const char *url)
{
    static const struct { const char *path; enum route r; } routes[] = {
        {"/health", R_HEALTH}, {"/v1/models", R_MODELS},
        {"/metrics", R_METRICS}, {"/version", R_VERSION},
        {"/v1/completions", R_COMPLETIONS}, {"/tokenize", R_TOKENIZE},
        {"/detokenize", R_DETOKENIZE}, {"/v1/chat/completions", R_CHAT},
        {"/tokenizer_info", R_TOKENIZER_INFO},
    };
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (!strcmp(url, routes[i].path))
            return routes[i].r;
    if (!strncmp(url, "/v1/models/", 11) && url[11])
        return R_MODEL;
    return R_NONE;
}

static bool is_post_route(enum route r)
{
    return r == R_COMPLETIONS || r == R_TOKENIZE || r == R_DETOKENIZE ||
           r == R_CHAT;
}

static bool json_content_type(conn_t *c)
{
    const char *ct = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND,
                                                 "Content-Type");
    if (!ct)
        return true;    /* no type: take the body as JSON, as vLLM does */
    while (*ct == ' ')
        ct++;
    return !strncasecmp(ct, "application/json", 16) &&
           (ct[16] == '\0' || ct[16] == ';' || ct[16] == ' ' ||
            ct[16] == '\t');
}

static enum MHD_Result preflight(conn_t *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Methods",
                            "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    return send_response(c, 204, r);
}

/* How many header fields of one name a request has (case-insensitive,
 * RFC 9110 5.1): MHD_KeyValueIterator over a header_count_t. */
typedef struct {
    const char *name;
    int n;
} header_count_t;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    header_count_t *hc = cls;
    (void)kind;
    (void)value;
    if (key && !strcasecmp(key, hc->name))
        hc->n++;
    return MHD_YES;
}

static int n_headers(struct MHD_Connection *mc, const char *name)
{
    header_count_t hc = {name, 0};
    MHD_get_connection_values(mc, MHD_HEADER_KIND, count_header, &hc);
    return hc.n;
}

/* First call: everything that can be decided from the headers alone. */
static enum MHD_Result on_headers(conn_t *c)
{
    dsq_http_t *h = c->h;
    bool get = !strcmp(c->method, "GET") || !strcmp(c->method, "HEAD");
    bool post = !strcmp(c->method, "POST");
    const char *cl;

    if (!strcmp(c->method, "OPTIONS") && h->cfg.allowed_origins)
        return preflight(c);
    if (c->route == R_NONE)
        return send_error(c, DSQ_APIERR_NOT_FOUND, NULL, "unknown route");
    if ((is_post_route(c->route) && !post) || (!is_post_route(c->route) && !get))
        return send_error(c, DSQ_APIERR_METHOD, NULL, "method not allowed");
    /* api: two Content-Length headers (MHD uses the first) let a proxy
     * that uses the other one smuggle a second request: refuse (attack2:
     * on every route, GET too) */
    {
        int n_cl = n_headers(c->mc, "Content-Length");
        /* attack2: the body's framing is ambiguous: never keep reading
         * this connection (what follows could be a smuggled request) */
        c->close_after = n_cl > 1 ||
            (n_cl && MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND,
                                                 "Transfer-Encoding"));
        if (n_cl > 1)
            return send_error(c, DSQ_APIERR_INVALID_REQUEST, NULL,
                              "more than one Content-Length header");
        /* attack2: Transfer-Encoding and Content-Length together (RFC 9112
         * 6.3: MHD reads the chunked body, a proxy may use the length):
         * the same smuggling risk; refuse, and close the connection */
        if (c->close_after)
            return send_error(c, DSQ_APIERR_INVALID_REQUEST, NULL,
                              "both Transfer-Encoding and Content-Length");
    }
    if (c->route == R_HEALTH)
        return MHD_YES;
    if (!authorized(c))
        return send_error(c, DSQ_APIERR_AUTH, NULL,
                          "missing or invalid API key (Authorization: Bearer)");
    if (!post)
        return MHD_YES;
    /* users: curl -d without -H sends application/x-www-form-urlencoded;
     * llama-server takes such a body when it is JSON, and so does dsqd
     * (checked once the body is in, on_request); anything else is 415 */
    c->ct_other = !json_content_type(c);
    cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > (unsigned long long)h->cfg.max_request_bytes) {
        c->too_large = true;
        return send_error(c, DSQ_APIERR_TOO_LARGE, NULL,
                          "request body is larger than --max-request-bytes");
    }
    return MHD_YES;
}

static enum MHD_Result on_request(conn_t *c)
{
    dsq_http_t *h = c->h;
    c->e = atomic_load(&h->engine);
    c->tok = c->e ? dsq_engine_tokenizer(c->e) : NULL;
    if (c->route == R_HEALTH)
        return do_health(c);
    if (atomic_load(&h->draining) && c->route != R_METRICS)
        return send_error(c, DSQ_APIERR_UNAVAILABLE, NULL,
                          "server is shutting down");
    switch (c->route) {
    case R_MODELS: return do_models(c);
    case R_MODEL: return do_model(c);
    case R_VERSION: return do_version(c);
    case R_METRICS: return do_metrics(c);
    default: break;
    }
    if (c->ct_other && is_post_route(c->route)) {
        /* the same strict check the request parser runs first
         * (server/json.h), so "is JSON" means one thing here and there; a
         * U+0000 goes on to the parser, whose 400 names it */
        dsq_json_error_t je;
        int rc = dsq_json_check(c->body, c->body_len, &je);
        if (rc == DSQ_ENOMEM)
            return send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        if (rc != DSQ_OK && je.fault != DSQ_JSON_NUL)
            return send_error(c, DSQ_APIERR_MEDIA_TYPE, NULL,
                              "Content-Type must be application/json (a body of another "
                              "type is taken only when it is JSON)");
    }
    if (!c->e)
        return send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "model is loading");
    switch (c->route) {
    case R_COMPLETIONS: return do_completions(c);
    case R_CHAT: return do_chat(c);
    case R_TOKENIZE: return do_tokenize(c);
    case R_DETOKENIZE: return do_detokenize(c);
    case R_TOKENIZER_INFO: return do_tokenizer_info(c);
    default: return send_error(c, DSQ_APIERR_NOT_FOUND, NULL, "unknown route");
    }
}

/* api: connection timeouts (docs/api.md, Operation). Idle: no request in
 * flight (--timeout-keep-alive, default 5 s). Busy: a request is being
 * answered; a long queue wait or a slow generation sends nothing for a
 * while, so this is max(300 s, --request-timeout + 5 s), the bound dsqd
 * always had, only for a connection whose peer stopped reading. */
static unsigned idle_timeout_s(const dsq_http_t *h)
{
    return h->cfg.timeout_keep_alive_s > 0 ? (unsigned)h->cfg.timeout_keep_alive_s : 5;
}

static unsigned busy_timeout_s(const dsq_http_t *h)
{
    double t = h->cfg.request_timeout_s + 5;
    return t > 300 ? (unsigned)t : 300;
}

/* hardening: the deadline phase of mc's connection (sock_rec_t). */
static void sock_phase(dsq_http_t *h, struct MHD_Connection *mc, enum sock_phase ph)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    sock_rec_t *r = ci ? ci->socket_context : NULL;
    if (!r)
        return;
    pthread_mutex_lock(&h->sock_mu);
    r->phase = ph;
    r->t0 = dsq_clock_now_s();
    pthread_mutex_unlock(&h->sock_mu);
}

/* hardening: whether the ticker cut mc at its head or body deadline */
static bool sock_was_cut(dsq_http_t *h, struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    sock_rec_t *r = ci ? ci->socket_context : NULL;
    if (!r)
        return false;
    pthread_mutex_lock(&h->sock_mu);
    bool cut = r->cut;
    pthread_mutex_unlock(&h->sock_mu);
    return cut;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc,
                                 const char *url, const char *method,
                                 const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    dsq_http_t *h = cls;
    conn_t *c = *con_cls;
    (void)version;
    if (!c) {
        c = calloc(1, sizeof(*c));
        if (!c)
            return MHD_NO;
        c->h = h;
        c->mc = mc;
        c->t_start = dsq_clock_now_s();
        c->queue_ms = -1;
        {
            /* otel: two traceparent headers make it invalid (W3C 3.2) */
            int n_tp = n_headers(mc, "traceparent");
            dsq_trace_begin(h->cfg.sampler,
                            n_tp == 1 ? MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                                    "traceparent") : NULL,
                            MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "tracestate"),
                            &c->tr);
            c->clk_off_ns = dsq_trace_clock_offset_ns();
        }
        c->route = find_route(url);
        if (c->route == R_MODEL && !(c->model_id = strdup(url + strlen("/v1/models/")))) {
            free(c);
            return MHD_NO;
        }
        snprintf(c->method, sizeof(c->method), "%s", method);
        snprintf(c->path, sizeof(c->path), "%s", url);
        /* users: the path goes into log lines: printable ASCII only, no
         * quotes (a %0A in the URL must not forge a line, a %FF must not
         * make the log invalid UTF-8) */
        for (char *q = c->path; *q; q++)
            if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f || *q == '"' ||
                *q == '\\')
                *q = '?';
        *con_cls = c;
        sock_phase(h, mc, S_BODY);
        return on_headers(c);
    }
    if (c->inflight && !c->responded && !c->req.stream)
        return finish_nonstream(c);          /* resumed (waiters) */
    if (c->inflight && !c->responded && c->stream_held)
        return stream_when_admitted(c);      /* resumed (admission) */
    if (c->responded) {
        /* response already queued (413/415/...): drop the rest unread */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (c->too_large) {
            /* libmicrohttpd cannot answer in the middle of an upload, so a
             * chunked body over the limit is read and dropped (never
             * buffered) up to 4x the limit, then answered with 413; beyond
             * that the connection is closed. */
            c->discarded += n;
            return c->discarded > 4 * (uint64_t)h->cfg.max_request_bytes ? MHD_NO
                                                                         : MHD_YES;
        }
        if (c->body_len + n > (size_t)h->cfg.max_request_bytes) {
            c->too_large = true;
            c->discarded = c->body_len + n;
            free(c->body);
            c->body = NULL;
            c->body_len = c->body_cap = 0;
            return MHD_YES;
        }
        if (append(&c->body, &c->body_len, &c->body_cap, upload_data, n))
            return MHD_NO;
        return MHD_YES;
    }
    if (c->too_large)
        return send_error(c, DSQ_APIERR_TOO_LARGE, NULL,
                          "request body is larger than --max-request-bytes");
    if (!c->body && (c->body = strdup("")) == NULL)
        return MHD_NO;
    /* api: the whole request arrived; while it is answered the idle
     * timeout must not apply (MHD counts it from the last byte exchanged,
     * also while our handler or stream reader waits for the engine) */
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, busy_timeout_s(h));
    sock_phase(h, mc, S_BUSY);
    return on_request(c);
}

/* otel: the route's template for span names and http.route (NULL for
 * unknown routes: the span is then named by the method alone, as the HTTP
 * semantic conventions say, so a scan of random URLs cannot make names). */
static const char *route_template(enum route r)
{
    switch (r) {
    case R_HEALTH: return "/health";
    case R_MODELS: return "/v1/models";
    case R_MODEL: return "/v1/models/{model}";
    case R_METRICS: return "/metrics";
    case R_VERSION: return "/version";
    case R_COMPLETIONS: return "/v1/completions";
    case R_TOKENIZE: return "/tokenize";
    case R_DETOKENIZE: return "/detokenize";
    case R_CHAT: return "/v1/chat/completions";
    case R_TOKENIZER_INFO: return "/tokenizer_info";
    default: return NULL;
    }
}

/* otel: the request's input as JSON text for gen_ai.input.messages
 * (--otlp-export-prompt): chat messages as validated, completions' prompts
 * as an array of their texts (token-id prompts as id arrays). */
static char *prompt_json(const conn_t *c)
{
    if (c->req.chat)
        return c->req.messages ? cJSON_PrintUnformatted(c->req.messages) : NULL;
    cJSON *a = cJSON_CreateArray();
    for (int p = 0; a && p < c->req.n_prompts; p++) {
        const dsq_prompt_t *pr = &c->req.prompts[p];
        cJSON_AddItemToArray(a, pr->text ? cJSON_CreateString(pr->text)
                                         : cJSON_CreateIntArray(pr->ids, pr->n_ids));
    }
    char *s = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    return s;
}

/* otel: the spans of one finished request, queued to the exporter: the
 * HTTP server span, and under it, for each prompt the engine took, its
 * queue wait, each prefill chunk and the decode phase (engine.h
 * dsq_req_timeline). Attribute names from the OpenTelemetry semantic
 * conventions (HTTP server spans; GenAI: gen_ai.*), vLLM's
 * gen_ai.latency.* and dsq.* for what neither names. */
static void trace_request(conn_t *c, struct MHD_Connection *mc, int st, double t_end)
{
    dsq_otlp_t *x = c->h->cfg.otlp;
    if (!x || !(c->tr.flags & 1))
        return;
    int64_t off = c->clk_off_ns;
#define NS(t) ((int64_t)((t) * 1e9) + off)
    const char *route = route_template(c->route);
    char name[64];
    snprintf(name, sizeof(name), "%s%s%s", c->method, route ? " " : "", route ? route : "");
    cJSON *sp = dsq_span_new(c->tr.trace_id, c->tr.span_id,
                             c->tr.has_parent ? c->tr.parent_id : NULL, name, DSQ_SPAN_SERVER,
                             NS(c->t_start), NS(t_end));
    if (!sp)
        return;
    dsq_span_trace_state(sp, c->tr.tracestate);
    dsq_span_attr_str(sp, "http.request.method", c->method);
    dsq_span_attr_str(sp, "url.path", c->path);
    dsq_span_attr_str(sp, "url.scheme", c->h->cfg.tls_cert_pem ? "https" : "http");
    if (route)
        dsq_span_attr_str(sp, "http.route", route);
    dsq_span_attr_int(sp, "http.response.status_code", st);
    {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        char host[NI_MAXHOST], serv[NI_MAXSERV];
        if (ci && ci->client_addr &&
            !getnameinfo(ci->client_addr,
                         ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                : sizeof(struct sockaddr_in),
                         host, sizeof(host), serv, sizeof(serv),
                         NI_NUMERICHOST | NI_NUMERICSERV)) {
            dsq_span_attr_str(sp, "client.address", host);
            dsq_span_attr_int(sp, "client.port", atoi(serv));
        }
        const char *ua = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "User-Agent");
        if (ua)
            dsq_span_attr_strn(sp, "user_agent.original", ua, strnlen(ua, 256));
    }
    if (st >= 400) {
        char code[16];
        snprintf(code, sizeof(code), "%d", st);
        dsq_span_attr_str(sp, "error.type", c->err_code ? c->err_code : code);
        /* HTTP server spans: 5xx are errors, 4xx are the client's */
        if (st >= 500)
            dsq_span_status(sp, DSQ_STATUS_ERROR, c->err_msg[0] ? c->err_msg : NULL);
    }
    if ((c->route == R_COMPLETIONS || c->route == R_CHAT) && c->have_req) {
        const dsq_completion_req_t *q = &c->req;
        dsq_usage_t u;
        usage_of(c, &u);
        dsq_span_attr_str(sp, "gen_ai.operation.name", q->chat ? "chat" : "text_completion");
        dsq_span_attr_str(sp, "gen_ai.request.model", q->model);
        dsq_span_attr_str(sp, "gen_ai.response.model", c->h->cfg.served_model_name);
        if (c->id[0]) {
            dsq_span_attr_str(sp, "gen_ai.response.id", c->id);
            dsq_span_attr_str(sp, "gen_ai.request.id", c->id);   /* vLLM's name */
        }
        dsq_span_attr_int(sp, "gen_ai.request.max_tokens", q->sp.max_tokens);
        dsq_span_attr_double(sp, "gen_ai.request.temperature", q->sp.temperature);
        dsq_span_attr_double(sp, "gen_ai.request.top_p", q->sp.top_p);
        if (q->sp.top_k > 0)
            dsq_span_attr_int(sp, "gen_ai.request.top_k", q->sp.top_k);
        dsq_span_attr_double(sp, "gen_ai.request.frequency_penalty", q->sp.frequency_penalty);
        dsq_span_attr_double(sp, "gen_ai.request.presence_penalty", q->sp.presence_penalty);
        if (q->sp.has_seed)
            dsq_span_attr_int(sp, "gen_ai.request.seed", (int64_t)q->sp.seed);
        if (q->sp.n != 1)
            dsq_span_attr_int(sp, "gen_ai.request.choice.count", q->sp.n);
        if (q->sp.n_stop > 0)
            dsq_span_attr_strs(sp, "gen_ai.request.stop_sequences", q->sp.stop, q->sp.n_stop);
        dsq_span_attr_bool(sp, "dsq.request.stream", q->stream);
        if (c->n_ereqs > 1)
            dsq_span_attr_int(sp, "dsq.request.prompts", c->n_ereqs);
        if (c->n_ereqs) {
            dsq_span_attr_int(sp, "gen_ai.usage.input_tokens", u.prompt_tokens);
            dsq_span_attr_int(sp, "gen_ai.usage.output_tokens", u.completion_tokens);
            if (u.has_cached)
                dsq_span_attr_int(sp, "gen_ai.usage.cache_read.input_tokens", u.cached_tokens);
        }
        if (c->n_choices) {
            const char *fr[64];
            int n = c->n_choices < 64 ? c->n_choices : 64;
            for (int i = 0; i < n; i++)
                fr[i] = c->choices[i].finish ? dsq_openai_finish_reason(c->choices[i].finish)
                                             : "abort";
            dsq_span_attr_strs(sp, "gen_ai.response.finish_reasons", fr, n);
        }
        if (c->queue_ms >= 0)
            dsq_span_attr_double(sp, "gen_ai.latency.time_in_queue", c->queue_ms / 1e3);
        if (c->t_first > 0)
            dsq_span_attr_double(sp, "gen_ai.latency.time_to_first_token",
                                 c->t_first - c->t_start);
        dsq_span_attr_double(sp, "gen_ai.latency.e2e", t_end - c->t_start);
        if (dsq_otlp_config(x)->export_prompt) {
            char *pj = prompt_json(c);
            dsq_span_attr_str(sp, "gen_ai.input.messages", pj);
            free(pj);
        }
    }
    dsq_otlp_submit(x, sp);

    for (int p = 0; p < c->n_ereqs; p++) {
        dsq_req_timeline_t tl;
        uint8_t id[8];
        if (!c->ereqs[p])
            continue;
        dsq_req_timeline(c->ereqs[p], &tl);
        if (tl.t_submit <= 0)
            continue;                /* never queued */
        double end = tl.t_end > 0 ? tl.t_end : t_end;
        double q_end = tl.t_sched > 0 ? tl.t_sched : end;
        dsq_trace_new_span_id(id);
        cJSON *s = dsq_span_new(c->tr.trace_id, id, c->tr.span_id, "queue", DSQ_SPAN_INTERNAL,
                                NS(tl.t_submit), NS(q_end));
        if (c->n_ereqs > 1)
            dsq_span_attr_int(s, "dsq.prompt_index", p);
        dsq_span_attr_int(s, "gen_ai.request.id", (int64_t)dsq_req_id(c->ereqs[p]));
        dsq_span_attr_bool(s, "dsq.queue.scheduled", tl.t_sched > 0);
        if (s)
            dsq_otlp_submit(x, s);
        for (int k = 0; k < tl.n_chunks; k++) {
            const dsq_req_chunk_t *ch = &tl.chunks[k];
            dsq_trace_new_span_id(id);
            s = dsq_span_new(c->tr.trace_id, id, c->tr.span_id, "prefill", DSQ_SPAN_INTERNAL,
                             NS(ch->t_start), NS(ch->t_end));
            if (c->n_ereqs > 1)
                dsq_span_attr_int(s, "dsq.prompt_index", p);
            dsq_span_attr_int(s, "dsq.prefill.tokens", ch->n_tokens);
            dsq_span_attr_int(s, "dsq.prefill.position", ch->pos);
            dsq_span_attr_int(s, "dsq.prefill.chunk", k);
            if (ch->index)
                dsq_span_attr_int(s, "dsq.choice.index", ch->index);
            if (k == tl.n_chunks - 1 && tl.n_chunks_merged)
                dsq_span_attr_int(s, "dsq.prefill.chunks_merged", tl.n_chunks_merged);
            if (s)
                dsq_otlp_submit(x, s);
        }
        if (tl.t_first_token > 0) {
            dsq_trace_new_span_id(id);
            s = dsq_span_new(c->tr.trace_id, id, c->tr.span_id, "decode", DSQ_SPAN_INTERNAL,
                             NS(tl.t_first_token), NS(end));
            if (c->n_ereqs > 1)
                dsq_span_attr_int(s, "dsq.prompt_index", p);
            dsq_span_attr_int(s, "dsq.decode.tokens", tl.n_generated);
            dsq_span_attr_int(s, "dsq.decode.steps", tl.n_decode_steps);
            dsq_span_attr_int(s, "dsq.preemptions", tl.n_preemptions);
            if (s)
                dsq_otlp_submit(x, s);
        }
    }
#undef NS
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    dsq_http_t *h = cls;
    conn_t *c = *con_cls;
    if (!c)
        return;
    *con_cls = NULL;
    /* api: back to the idle timeout for a kept-alive connection */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, idle_timeout_s(h));
        sock_phase(h, mc, S_IDLE);
    }
    if (c->n_ereqs && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* users: a reset seen by libmicrohttpd's write, not our poll */
        if (toe != MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
            log_disconnect(c, "the connection ended before the answer did (client reset or "
                              "write error); its sequences are cancelled");
        cancel_all(c);
    }
    for (int p = 0; p < c->n_ereqs; p++)
        if (c->ereqs[p] && !c->ereq_done[p])
            dsq_engine_cancel(c->e, c->ereqs[p]);
    if (c->n_choices && c->t_first > 0)
        dsq_metrics_observe(h->metrics, DSQ_HIST_E2E, dsq_clock_now_s() - c->t_start);
    {
        int st = c->status ? c->status : 499;   /* 499: client closed early */
        double t = dsq_clock_now_s();
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && c->n_ereqs)
            st = 499;
        /* hardening: not the client's leaving but our deadline (the
         * ticker shut the socket down): 408, said as such */
        bool cut = st == 499 && !c->status && sock_was_cut(h, mc);
        if (cut)
            st = 408;
        dsq_metrics_count_request(h->metrics, st);
        trace_request(c, mc, st, t);
        char why[300] = "";
        if (cut)
            snprintf(why, sizeof(why), " error=request_timeout message=\"request body not in "
                     "within --body-timeout\"");
        else if (c->err_code && st >= 400)
            snprintf(why, sizeof(why), " error=%s message=\"%s\"", c->err_code, c->err_msg);
        if (c->route == R_COMPLETIONS || c->route == R_CHAT) {
            dsq_usage_t u;
            usage_of(c, &u);
            dsq_metrics_add_prompt_tokens(h->metrics, u.prompt_tokens);
            char tp[DSQ_TRACEPARENT_LEN + 1];
            dsq_trace_format(&c->tr, tp);
            tp[35] = '\0';              /* "00-" + the trace id */
            dsq_log(DSQ_LOG_INFO,
                    "req=%s method=%s path=%s status=%d prompt_tokens=%lld "
                    "completion_tokens=%lld queue_ms=%.1f ttft_ms=%.1f total_ms=%.1f "
                    "trace_id=%s%s",
                    c->id[0] ? c->id : "-", c->method, c->path, st,
                    (long long)u.prompt_tokens, (long long)u.completion_tokens,
                    c->queue_ms,
                    c->t_first > 0 ? (c->t_first - c->t_start) * 1e3 : -1.0,
                    (t - c->t_start) * 1e3, tp + 3, why);
        } else {
            dsq_log((c->route == R_HEALTH || c->route == R_METRICS) && st < 400
                        ? DSQ_LOG_DEBUG : DSQ_LOG_INFO,
                    "method=%s path=%s status=%d total_ms=%.1f%s", c->method,
                    c->path, st, (t - c->t_start) * 1e3, why);
        }
    }
    for (int p = 0; p < c->n_ereqs; p++)
        dsq_req_unref(c->ereqs[p]);
    if (c->inflight)
        atomic_fetch_sub(&h->n_inflight, 1);
    waiter_put(h, c->w);
    for (int i = 0; i < c->n_choices; i++) {
        free(c->choices[i].text);
        free(c->choices[i].th);
        cJSON_Delete(c->choices[i].lp);
    }
    free(c->choices);
    free(c->ereqs);
    free(c->ereq_done);
    free(c->prompt_tokens);
    free(c->cached_tokens);
    free(c->echo_len);
    free(c->echo_done);
    free(c->pend);
    free(c->body);
    free(c->model_id);
    if (c->have_req)
        dsq_completion_req_deinit(&c->req);
    free(c);
}

/* ------------------------------------------------------------ daemon */

/* hardening: MHD_OPTION_NOTIFY_CONNECTION: track every open connection for
 * the head/body deadlines. libmicrohttpd calls CLOSED before it closes the
 * socket, and the ticker only shuts a socket down under sock_mu, so it never
 * touches a descriptor number that was closed and reused. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    dsq_http_t *h = cls;
    sock_rec_t *r;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(r = calloc(1, sizeof(*r))))
            return;
        r->fd = ci->connect_fd;
        r->phase = S_HEAD;
        if (h->cfg.max_undelivered_bytes > 0) {
            /* hardening: the kernel's send buffer is undelivered output
             * too (it autotunes up to MiBs per socket otherwise) */
            int64_t b = h->cfg.max_undelivered_bytes / 2;
            int sb = (int)(b < 4096 ? 4096 : b > (4 << 20) ? (4 << 20) : b);
            setsockopt(r->fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof(sb));
        }
        r->t0 = dsq_clock_now_s();
        pthread_mutex_lock(&h->sock_mu);
        r->next = h->socks;
        if (h->socks)
            h->socks->prev = r;
        h->socks = r;
        h->n_socks++;
        pthread_mutex_unlock(&h->sock_mu);
        *socket_context = r;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && (r = *socket_context)) {
        pthread_mutex_lock(&h->sock_mu);
        if (r->prev)
            r->prev->next = r->next;
        else
            h->socks = r->next;
        if (r->next)
            r->next->prev = r->prev;
        h->n_socks--;
        pthread_mutex_unlock(&h->sock_mu);
        free(r);
        *socket_context = NULL;
    }
}

/* The ticker, part 1: shut down connections past their head or body
 * deadline (libmicrohttpd then sees the end of the stream and closes them;
 * its own timeout is an idle one that a byte every few seconds resets).
 * One log line per tick that closed any. */
static void tick_deadlines(dsq_http_t *h, double t)
{
    double head = h->cfg.header_timeout_s, body = h->cfg.body_timeout_s;
    double idle = idle_timeout_s(h) + head;
    long n_head = 0, n_body = 0;
    pthread_mutex_lock(&h->sock_mu);
    for (sock_rec_t *r = h->socks; r; r = r->next) {
        double lim = r->phase == S_HEAD ? head : r->phase == S_IDLE ? idle
                   : r->phase == S_BODY ? body : 0;
        if (r->cut || lim <= 0 || t - r->t0 <= lim)
            continue;
        shutdown(r->fd, SHUT_RDWR);
        r->cut = true;
        if (r->phase == S_BODY)
            n_body++;
        else
            n_head++;
    }
    pthread_mutex_unlock(&h->sock_mu);
    if (n_head || n_body) {
        atomic_fetch_add(&h->n_cut_head, n_head);
        atomic_fetch_add(&h->n_cut_body, n_body);
        dsq_log(DSQ_LOG_INFO, "event=deadline_close head=%ld body=%ld reason=\"request head "
                "not in within --header-timeout %.0f s / body within --body-timeout %.0f s\"",
                n_head, n_body, head, body);
    }
}

/* The ticker, part 2: wake parked requests that need a look without an
 * engine event: a hang-up (one poll() over every parked socket), a deadline
 * (request timeout, cancel grace) or the stop flag. */
static void tick_waiters(dsq_http_t *h, double t)
{
    bool stop = atomic_load(&h->stopping);
    size_t n = 0, cap = 0;
    waiter_t **ws = NULL;
    struct pollfd *pf = NULL;
    pthread_mutex_lock(&h->pool_mu);
    for (waiter_t *w = h->pool_all; w; w = w->next_all) {
        pthread_mutex_lock(&w->mu);
        bool parked = w->parked, due = stop || (w->wake_at > 0 && t >= w->wake_at);
        int fd = w->fd;
        pthread_mutex_unlock(&w->mu);
        if (!parked)
            continue;
        if (due || fd < 0) {
            if (due)
                waiter_wake(w);
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            waiter_t **a = realloc(ws, nc * sizeof(*a));
            struct pollfd *b = a ? realloc(pf, nc * sizeof(*b)) : NULL;
            if (a)
                ws = a;
            if (!b)
                break;
            pf = b;
            cap = nc;
        }
        ws[n] = w;
        pf[n].fd = fd;
        pf[n].events = POLLRDHUP;
        pf[n].revents = 0;
        n++;
    }
    pthread_mutex_unlock(&h->pool_mu);
    /* waiters are never freed while the daemon runs; a waiter that was
     * resumed (and even recycled) meanwhile only gets a spurious wake-up */
    if (n && poll(pf, (nfds_t)n, 0) > 0)
        for (size_t i = 0; i < n; i++)
            if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
                waiter_wake(ws[i]);
    free(ws);
    free(pf);
}

#define TICK_MS 50

static void *ticker_main(void *arg)
{
    dsq_http_t *h = arg;
    while (!atomic_load(&h->ticker_stop)) {
        struct timespec ts = {0, TICK_MS * 1000000L};
        nanosleep(&ts, NULL);
        double t = dsq_clock_now_s();
        tick_waiters(h, t);
        tick_deadlines(h, t);
    }
    return NULL;
}

static char *dupstr(dsq_http_t *h, int slot, const char *s)
{
    if (!s)
        return NULL;
    h->cfg_strings[slot] = strdup(s);
    return h->cfg_strings[slot];
}

/* attack2: at most MHD_LOG_BURST libmicrohttpd lines per second (a flood
 * of refused connections logs one line each); the count of dropped lines
 * is logged with the next line let through. */
#define MHD_LOG_BURST 20

static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static time_t window;
    static long n_window, n_dropped;
    char line[512];
    long dropped = 0;
    (void)cls;
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    /* users: our handlers end a request with an error (stream reader) or
     * MHD_NO (non-streaming) after a client hang-up, already logged as
     * event=disconnect at info: not a warning */
    bool gone = tl_client_gone;
    tl_client_gone = false;
    /* hardening: a client that closes (or is cut at its head/body deadline,
     * logged once per tick as event=deadline_close) before its request is
     * in is the client's business: debug */
    if (!strncmp(line, "Connection socket is closed when reading request", 48) ||
        !strncmp(line, "Connection was closed by remote side with incomplete request", 60))
        gone = true;
    int level = gone ? DSQ_LOG_DEBUG : DSQ_LOG_WARN;
    /* lines below the threshold neither log nor count against the burst
     * (a slowloris flood is all debug lines: no "suppressed" warnings) */
    if (level > dsq_log_threshold)
        return;
    time_t now = time(NULL);
    pthread_mutex_lock(&mu);
    if (now != window) {
        window = now;
        n_window = 0;
    }
    if (n_window >= MHD_LOG_BURST) {
        n_dropped++;
        pthread_mutex_unlock(&mu);
        return;
    }
    n_window++;
    dropped = n_dropped;
    n_dropped = 0;
    pthread_mutex_unlock(&mu);
    if (dropped)
        dsq_log(DSQ_LOG_WARN, "mhd: %ld messages suppressed", dropped);
    dsq_log(level, "mhd: %s", line);
}

/* users: percent-decoding of URLs and query arguments as libmicrohttpd's
 * own, except that %00 stays "%00": a decoded NUL would end the C string
 * early, so "/v1/models/NAME%00junk" would compare equal to NAME. */
static size_t unescape_keep_nul(void *cls, struct MHD_Connection *mc, char *s)
{
    (void)cls;
    (void)mc;
    char *r = s, *w = s;
    while (*r) {
        int hi, lo;
        if (r[0] == '%' && r[1] && r[2] && (hi = dsq_hex_value(r[1])) >= 0 &&
            (lo = dsq_hex_value(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

/* users: the listening socket, bound here rather than by libmicrohttpd so
 * that a busy port is a start-up error with its reason. SO_REUSEADDR only
 * (a restart may rebind over TIME_WAIT connections), never SO_REUSEPORT:
 * that let a second dsqd bind the same port and take half the requests.
 * Returns the listening fd or -1 with err set. */
static int listen_socket(const struct addrinfo *ai, const char *host, int port, char *err,
                         size_t err_len)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(err, err_len, "cannot listen on %s:%d: socket: %s", host, port,
                 strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 511) != 0) {
        int e = errno;
        if (e == EADDRINUSE)
            snprintf(err, err_len, "cannot listen on %s:%d: port %d is already in use "
                     "(another dsqd or server; choose one with --port)", host, port, port);
        else
            snprintf(err, err_len, "cannot listen on %s:%d: %s", host, port, strerror(e));
        close(fd);
        return -1;
    }
    return fd;
}

/* hardening: the connection limit: --max-connections, or what the process
 * may open (RLIMIT_NOFILE, whose soft limit is first raised to the hard
 * one, as nginx's worker_rlimit_nofile would be set) less 256 descriptors
 * for model files, logs and the engine, at most 65536. */
static unsigned connection_limit(const dsq_http_t *h)
{
    struct rlimit rl;
    rlim_t n = 4096;
    if (h->cfg.max_connections > 0)
        return (unsigned)h->cfg.max_connections;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t want = rl.rlim_max == RLIM_INFINITY ? 65536 + 256 : rl.rlim_max;
            struct rlimit nr = {want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &nr) == 0)
                rl.rlim_cur = want;
        }
        n = rl.rlim_cur == RLIM_INFINITY ? 65536 + 256 : rl.rlim_cur;
        n = n > 512 ? n - 256 : n / 2;
    }
    return n > 65536 ? 65536u : (unsigned)n;
}

/* hardening: --http-threads, or 2 per online CPU, 4 to 32: the threads run
 * parsing, tokenization and JSON rendering, never a wait. */
static unsigned http_threads(const dsq_http_t *h)
{
    long n = h->cfg.http_threads > 0 ? h->cfg.http_threads : 2 * sysconf(_SC_NPROCESSORS_ONLN);
    if (h->cfg.http_threads <= 0)
        n = n < 4 ? 4 : n > 32 ? 32 : n;
    return (unsigned)n;
}

dsq_http_t *dsq_http_create(const dsq_http_config_t *cfg, dsq_metrics_t *m,
                            char *err, size_t err_len)
{
    dsq_http_t *h = calloc(1, sizeof(*h));
    struct addrinfo hints = {0}, *ai = NULL;
    char port[16];
    /* hardening: a pool of polling threads (epoll on Linux, else poll;
     * never select(), which refused every socket numbered 1024 or more),
     * requests that wait park their connection (suspend/resume), so open
     * connections cost memory, not threads (http.h) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    if (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES)
        flags |= MHD_USE_EPOLL;
    else
        flags |= MHD_USE_POLL;
    int gai;

    if (!h) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    h->cfg = *cfg;
    h->cfg.host = dupstr(h, 0, cfg->host);
    h->cfg.api_key = NULL;
    h->cfg.allowed_origins = cfg->allowed_origins && *cfg->allowed_origins
                                 ? dupstr(h, 2, cfg->allowed_origins) : NULL;
    h->cfg.tls_cert_pem = dupstr(h, 3, cfg->tls_cert_pem);
    h->cfg.tls_key_pem = dupstr(h, 4, cfg->tls_key_pem);
    h->cfg.served_model_name = dupstr(h, 5, cfg->served_model_name ? cfg->served_model_name : "");
    h->metrics = m;
    pthread_mutex_init(&h->pool_mu, NULL);
    pthread_mutex_init(&h->sock_mu, NULL);
    if (cfg->api_key && *cfg->api_key) {
        SHA256((const unsigned char *)cfg->api_key, strlen(cfg->api_key),
               h->key_hash);
        h->have_key = true;
    }
    if (h->cfg.tls_cert_pem || h->cfg.tls_key_pem) {
        if (!h->cfg.tls_cert_pem || !h->cfg.tls_key_pem) {
            snprintf(err, err_len, "TLS needs both --ssl-certfile and --ssl-keyfile");
            goto fail;
        }
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            snprintf(err, err_len, "this libmicrohttpd has no TLS support");
            goto fail;
        }
        flags |= MHD_USE_TLS;
    }
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    snprintf(port, sizeof(port), "%d", cfg->port);
    gai = getaddrinfo(h->cfg.host && *h->cfg.host ? h->cfg.host : NULL, port,
                      &hints, &ai);
    if (gai) {
        snprintf(err, err_len, "--host %s: %s", h->cfg.host ? h->cfg.host : "",
                 gai_strerror(gai));
        goto fail;
    }
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    char host_name[300];
    const char *hn = h->cfg.host && *h->cfg.host ? h->cfg.host : "*";
    snprintf(host_name, sizeof(host_name), strchr(hn, ':') ? "[%.290s]" : "%.290s", hn);
    int lfd = listen_socket(ai, host_name, cfg->port, err, err_len);
    freeaddrinfo(ai);
    if (lfd < 0)
        goto fail;
    /* api: the idle timeout; on_access switches a connection to the busy
     * one while it answers a request */
    unsigned idle_s = idle_timeout_s(h);
    unsigned max_conn = connection_limit(h), n_threads = http_threads(h);
    unsigned per_ip = h->cfg.max_connections_per_client > 0
                          ? (unsigned)h->cfg.max_connections_per_client : 0;
    if (h->cfg.tls_cert_pem)
        h->d = MHD_start_daemon(
            flags, (uint16_t)cfg->port, NULL, NULL, on_access, h,
            MHD_OPTION_EXTERNAL_LOGGER, log_mhd, h,
            MHD_OPTION_LISTEN_SOCKET, lfd,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
            MHD_OPTION_UNESCAPE_CALLBACK, unescape_keep_nul, NULL,
            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
            MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
            MHD_OPTION_CONNECTION_LIMIT, max_conn,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
            MHD_OPTION_THREAD_POOL_SIZE, n_threads,
            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 * 1024),
            MHD_OPTION_HTTPS_MEM_CERT, h->cfg.tls_cert_pem,
            MHD_OPTION_HTTPS_MEM_KEY, h->cfg.tls_key_pem,
            MHD_OPTION_END);
    else
        h->d = MHD_start_daemon(
            flags, (uint16_t)cfg->port, NULL, NULL, on_access, h,
            MHD_OPTION_EXTERNAL_LOGGER, log_mhd, h,
            MHD_OPTION_LISTEN_SOCKET, lfd,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
            MHD_OPTION_UNESCAPE_CALLBACK, unescape_keep_nul, NULL,
            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
            MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
            MHD_OPTION_CONNECTION_LIMIT, max_conn,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
            MHD_OPTION_THREAD_POOL_SIZE, n_threads,
            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(512 * 1024),
            MHD_OPTION_END);
    if (!h->d) {
        close(lfd);
        snprintf(err, err_len, "cannot serve on %s:%d (%s)", host_name, cfg->port,
                 h->cfg.tls_cert_pem ? "bad TLS certificate or key" : "libmicrohttpd failed");
        goto fail;
    }
    if (pthread_create(&h->ticker, NULL, ticker_main, h) != 0) {
        snprintf(err, err_len, "cannot start the HTTP ticker thread");
        goto fail;
    }
    h->ticker_started = true;
    dsq_log(DSQ_LOG_DEBUG, "event=http_threads pool=%u max_connections=%u per_client=%u "
            "header_timeout_s=%.1f body_timeout_s=%.1f", n_threads, max_conn, per_ip,
            h->cfg.header_timeout_s, h->cfg.body_timeout_s);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    h->port = cfg->port;
    if (getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0)
        h->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
    return h;
fail:
    dsq_http_destroy(h);
    return NULL;
}

int dsq_http_set_chat(dsq_http_t *h, dsq_engine_t *e,
                      const char *template_path, const char *reasoning_parser,
                      const char *tool_parser, char *err, size_t err_len)
{
    dsq_chat_t *chat = dsq_chat_create(template_path, dsq_engine_chat_template(e),
                                       dsq_engine_tokenizer(e),
                                       reasoning_parser, tool_parser, err, err_len);
    if (!chat)
        return DSQ_EINVAL;
    dsq_chat_destroy(h->chat);
    h->chat = chat;
    return DSQ_OK;
}

void dsq_http_set_engine(dsq_http_t *h, dsq_engine_t *e)
{
    atomic_store(&h->engine, e);
}

int dsq_http_port(const dsq_http_t *h)
{
    return h->port;
}

void dsq_http_drain(dsq_http_t *h)
{
    atomic_store(&h->draining, true);
}

int dsq_http_n_inflight(dsq_http_t *h)
{
    return atomic_load(&h->n_inflight);
}

void dsq_http_stop(dsq_http_t *h)
{
    if (!h || !h->d)
        return;
    atomic_store(&h->draining, true);
    atomic_store(&h->stopping, true);
    /* wake every waiter so it sees `stopping` now, not at the next tick */
    pthread_mutex_lock(&h->pool_mu);
    for (waiter_t *w = h->pool_all; w; w = w->next_all)
        waiter_wake(w);
    pthread_mutex_unlock(&h->pool_mu);
    /* Let the cancelled requests end properly (final chunk with
     * finish_reason "abort", then [DONE]) before MHD_stop_daemon shuts
     * their sockets down; bounded by the cancel grace period. */
    for (int i = 0; i < (int)(CANCEL_GRACE_S * 20) + 20 &&
                    atomic_load(&h->n_inflight) > 0; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* libmicrohttpd must not be stopped with a suspended connection: from
     * here on nothing parks, and whatever is parked is resumed (it then
     * answers at once) */
    atomic_store(&h->no_park, true);
    pthread_mutex_lock(&h->pool_mu);
    for (waiter_t *w = h->pool_all; w; w = w->next_all)
        waiter_wake(w);
    pthread_mutex_unlock(&h->pool_mu);
    for (int i = 0; i < 40 && atomic_load(&h->n_inflight) > 0; i++) {
        struct timespec ts = {0, 25 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (h->ticker_started) {
        atomic_store(&h->ticker_stop, true);
        pthread_join(h->ticker, NULL);
        h->ticker_started = false;
    }
    MHD_stop_daemon(h->d);
    h->d = NULL;
}

void dsq_http_destroy(dsq_http_t *h)
{
    waiter_t *w, *next;
    if (!h)
        return;
    dsq_http_stop(h);
    for (w = h->pool_all; w; w = next) {
        next = w->next_all;
        pthread_mutex_destroy(&w->mu);
        free(w);
    }
    if (h->ticker_started) {     /* create failed after the ticker began */
        atomic_store(&h->ticker_stop, true);
        pthread_join(h->ticker, NULL);
    }
    pthread_mutex_destroy(&h->pool_mu);
    pthread_mutex_destroy(&h->sock_mu);
    dsq_chat_destroy(h->chat);
    for (size_t i = 0; i < sizeof(h->cfg_strings) / sizeof(h->cfg_strings[0]); i++)
        free(h->cfg_strings[i]);
    free(h);
}

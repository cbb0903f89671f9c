/* libmicrohttpd front end of dsqd: the daemon (listening socket, thread
 * pool, TLS, connection limits), the ticker thread, dispatch of each
 * request to its handler and the request-completed accounting (status,
 * metrics, spans, access log). See http.h for the threading model and
 * http_internal.h for how the front end is split.
 *
 * This file is only the transport: what a route answers lives in
 * http_routes.c and completions.c, which it calls with the request's
 * conn_t once the head and body are in. One conn_t per HTTP request holds
 * all of that request's state; it is created on the first access-handler
 * call and freed in the request-completed callback, which is also where
 * engine requests are cancelled and the log line is written. */
#include "server/http_internal.h"

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
#include <openssl/sha.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/hex.h"
#include "engine/common/clock.h"
#include "server/chat.h"
#include "server/error.h"
#include "server/http_guard.h"
#include "server/json.h"
#include "server/trace.h"

/* One per open connection (MHD_OPTION_NOTIFY_CONNECTION), for
 * the request-head and body deadlines the ticker enforces. */
enum sock_phase {
    S_HEAD = 0,                  /* connected, the request head not in yet  */
    S_IDLE,                      /* kept alive after an answer               */
    S_BODY,                      /* head in, reading the body                */
    S_BUSY,                      /* answering: no deadline but the request's */
};
struct sock_rec {
    int fd;
    enum sock_phase phase;
    double t0;                   /* monotonic s the phase began             */
    bool cut;                    /* shut down by the ticker already         */
    struct sock_rec *prev, *next;
};

/* ------------------------------------------------------------ dispatch */

static enum route find_route(const char *url)
{
    static const struct { const char *path; enum route r; } routes[] = {
        {"/health", R_HEALTH}, {"/v1/models", R_MODELS},
        {"/metrics", R_METRICS}, {"/version", R_VERSION},
        {"/v1/completions", R_COMPLETIONS}, {"/tokenize", R_TOKENIZE},
        {"/detokenize", R_DETOKENIZE}, {"/v1/chat/completions", R_CHAT},
        {"/tokenizer_info", R_TOKENIZER_INFO}, {"/v1/messages", R_MESSAGES},
        {"/v1/messages/count_tokens", R_COUNT_TOKENS}, {"/v1/responses", R_RESPONSES},
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
    return dsq__route_is_post(r);
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
                            "Authorization, Content-Type, x-api-key, anthropic-version, "
                            "anthropic-beta");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    return dsq__send_response(c, 204, r);
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
    /* a browser's preflight with no origins allowed: say why, not 405
     * (the page would only see that CORS failed) */
    if (!strcmp(c->method, "OPTIONS") &&
        MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin"))
        return dsq__send_origin_refusal(c);
    if (c->route == R_NONE)
        return dsq__send_error(c, DSQ_APIERR_NOT_FOUND, NULL, "unknown route");
    if ((is_post_route(c->route) && !post) || (!is_post_route(c->route) && !get))
        return dsq__send_error(c, DSQ_APIERR_METHOD, NULL, "method not allowed");
    /* two Content-Length headers (MHD uses the first) let a proxy
     * that uses the other one smuggle a second request: refuse (on every
     * route, GET too) */
    {
        int n_cl = n_headers(c->mc, "Content-Length");
        /* the body's framing is ambiguous: never keep reading
         * this connection (what follows could be a smuggled request) */
        c->close_after = n_cl > 1 ||
            (n_cl && MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND,
                                                 "Transfer-Encoding"));
        if (n_cl > 1)
            return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, NULL,
                                   "more than one Content-Length header");
        /* the checks read one value: a second one must not slip past */
        if (n_headers(c->mc, "Origin") > 1 || n_headers(c->mc, "Content-Type") > 1)
            return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, NULL,
                                   "more than one Origin or Content-Type header");
        /* Transfer-Encoding and Content-Length together (RFC 9112
         * 6.3: MHD reads the chunked body, a proxy may use the length):
         * the same smuggling risk; refuse, and close the connection */
        if (c->close_after)
            return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, NULL,
                                   "both Transfer-Encoding and Content-Length");
    }
    if (c->route == R_HEALTH)
        return MHD_YES;
    if (!dsq__origin_allowed(c))
        return dsq__send_origin_refusal(c);
    if (!dsq__authorized(c))
        return dsq__send_error(c, DSQ_APIERR_AUTH, NULL,
                               "missing or invalid API key (Authorization: Bearer, or "
                               "x-api-key)");
    if (!post)
        return MHD_YES;
    /* a form, text/plain or multipart body is what a web page can make a
     * browser send anywhere without asking the server first (CORS
     * "simple requests"), so only JSON is taken by default. curl -d
     * without -H sends application/x-www-form-urlencoded: with
     * --any-content-type such a body is taken when it is JSON (as
     * llama-server does; checked once the body is in, on_request) */
    c->ct_other = !json_content_type(c);
    if (c->ct_other && !h->cfg.any_content_type) {
        char msg[400];
        const char *ct = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Content-Type");
        snprintf(msg, sizeof(msg), "Content-Type must be application/json, not '%.80s' "
                 "(curl: -H 'Content-Type: application/json'; dsqd --any-content-type takes "
                 "a JSON body of any type)", ct ? ct : "");
        return dsq__send_error(c, DSQ_APIERR_MEDIA_TYPE, NULL, msg);
    }
    cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > (unsigned long long)h->cfg.max_request_bytes) {
        c->too_large = true;
        return dsq__send_error(c, DSQ_APIERR_TOO_LARGE, NULL,
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
        return dsq__do_health(c);
    if (atomic_load(&h->draining) && c->route != R_METRICS)
        return dsq__send_error(c, DSQ_APIERR_UNAVAILABLE, NULL,
                               "server is shutting down");
    switch (c->route) {
    case R_MODELS: return dsq__do_models(c);
    case R_MODEL: return dsq__do_model(c);
    case R_VERSION: return dsq__do_version(c);
    case R_METRICS: return dsq__do_metrics(c);
    default: break;
    }
    if (c->ct_other && is_post_route(c->route)) {
        /* the same strict check the request parser runs first
         * (server/json.h), so "is JSON" means one thing here and there; a
         * U+0000 goes on to the parser, whose 400 names it */
        dsq_json_error_t je;
        int rc = dsq_json_check(c->body, c->body_len, &je);
        if (rc == DSQ_ENOMEM)
            return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        if (rc != DSQ_OK && je.fault != DSQ_JSON_NUL) {
            char msg[512];
            snprintf(msg, sizeof(msg), "a body that is not application/json is taken only when "
                     "it is JSON, and this one is not: %s", je.message);
            return dsq__send_error(c, DSQ_APIERR_MEDIA_TYPE, NULL, msg);
        }
    }
    if (!c->e)
        return dsq__send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "model is loading");
    switch (c->route) {
    case R_COMPLETIONS: return dsq__do_completions(c);
    case R_CHAT: return dsq__do_chat(c);
    case R_MESSAGES: return dsq__do_messages(c);
    case R_RESPONSES: return dsq__do_responses(c);
    case R_COUNT_TOKENS: return dsq__do_count_tokens(c);
    case R_TOKENIZE: return dsq__do_tokenize(c);
    case R_DETOKENIZE: return dsq__do_detokenize(c);
    case R_TOKENIZER_INFO: return dsq__do_tokenizer_info(c);
    default: return dsq__send_error(c, DSQ_APIERR_NOT_FOUND, NULL, "unknown route");
    }
}

/* Connection timeouts (docs/api.md, Operation). Idle: no request in
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

/* The deadline phase of mc's connection (sock_rec_t). */
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

/* Whether the ticker cut mc at its head or body deadline */
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
    /* absolute-form (RFC 9112 3.2.2, what a client talking to a proxy
     * sends): the route is the path after the authority */
    if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8)) {
        const char *path = strchr(url + (url[4] == ':' ? 7 : 8), '/');
        url = path ? path : "/";
    }
    if (!c) {
        c = calloc(1, sizeof(*c));
        if (!c)
            return MHD_NO;
        c->h = h;
        c->mc = mc;
        c->t_start = dsq_clock_now_s();
        c->queue_ms = -1;
        {
            /* two traceparent headers make it invalid (W3C 3.2) */
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
        /* the path goes into log lines: printable ASCII only, no
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
        return dsq__finish_nonstream(c);          /* resumed (waiters) */
    if (c->inflight && !c->responded && c->stream_held)
        return dsq__stream_when_admitted(c);      /* resumed (admission) */
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
        if (dsq__append(&c->body, &c->body_len, &c->body_cap, upload_data, n))
            return MHD_NO;
        return MHD_YES;
    }
    if (c->too_large)
        return dsq__send_error(c, DSQ_APIERR_TOO_LARGE, NULL,
                               "request body is larger than --max-request-bytes");
    if (!c->body && (c->body = strdup("")) == NULL)
        return MHD_NO;
    /* the whole request arrived; while it is answered the idle
     * timeout must not apply (MHD counts it from the last byte exchanged,
     * also while our handler or stream reader waits for the engine) */
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, busy_timeout_s(h));
    sock_phase(h, mc, S_BUSY);
    return on_request(c);
}
static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    dsq_http_t *h = cls;
    conn_t *c = *con_cls;
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* a refusal of a request pipelined after this one goes now */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            dsq_http_guard_request_done(ci->connect_fd);
    }
    if (!c)
        return;
    *con_cls = NULL;
    /* back to the idle timeout for a kept-alive connection */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, idle_timeout_s(h));
        sock_phase(h, mc, S_IDLE);
    }
    if (c->n_ereqs && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* a reset seen by libmicrohttpd's write, not our poll */
        if (toe != MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
            dsq__log_disconnect(c, "the connection ended before the answer did (client reset or "
                                   "write error); its sequences are cancelled");
        dsq__cancel_all(c);
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
        /* not the client's leaving but our deadline (the
         * ticker shut the socket down): 408, said as such */
        bool cut = st == 499 && !c->status && sock_was_cut(h, mc);
        if (cut)
            st = 408;
        dsq_metrics_count_request(h->metrics, st);
        dsq__trace_request(c, mc, st, t);
        char why[300] = "";
        if (cut)
            snprintf(why, sizeof(why), " error=request_timeout message=\"request body not in "
                     "within --body-timeout\"");
        else if (c->err_code && st >= 400)
            snprintf(why, sizeof(why), " error=%s message=\"%s\"", c->err_code, c->err_msg);
        if (dsq__route_generates(c->route)) {
            dsq_usage_t u;
            dsq__usage_of(c, &u);
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
    dsq__waiter_put(h, c->w);
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
    cJSON_Delete(c->resp_echo);
    dsq_responses_stream_free(&c->rst);
    if (c->have_req)
        dsq_completion_req_deinit(&c->req);
    free(c);
}

/* ------------------------------------------------------------ daemon */

/* MHD_OPTION_NOTIFY_CONNECTION: track every open connection for
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
        if (!ci)
            return;
        /* every byte this connection sends passes the strict reader
         * first (http_guard.h) */
        if (!dsq_http_guard_attach(ci->connect_fd, h->cfg.tls_cert_pem != NULL))
            dsq_log(DSQ_LOG_WARN, "event=http_guard_off fd=%d (out of memory "
                    "or above the descriptor limit): libmicrohttpd's own checks apply",
                    ci->connect_fd);
        if (!(r = calloc(1, sizeof(*r))))
            return;
        r->fd = ci->connect_fd;
        r->phase = S_HEAD;
        if (h->cfg.max_undelivered_bytes > 0) {
            /* the kernel's send buffer is undelivered output
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
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            dsq_http_guard_detach(ci->connect_fd);
        if (!(r = *socket_context))
            return;
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
                dsq__waiter_wake(w);
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
                dsq__waiter_wake(ws[i]);
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

/* At most MHD_LOG_BURST libmicrohttpd lines per second (a flood
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
    /* our handlers end a request with an error (stream reader) or
     * MHD_NO (non-streaming) after a client hang-up, already logged as
     * event=disconnect at info: not a warning */
    bool gone = dsq__tl_client_gone;
    dsq__tl_client_gone = false;
    /* a client that closes (or is cut at its head/body deadline,
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

/* Percent-decoding of URLs and query arguments as libmicrohttpd's
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

/* The listening socket, bound here rather than by libmicrohttpd so
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

/* The connection limit: --max-connections, or what the process
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

/* --http-threads, or 2 per online CPU, 4 to 32: the threads run
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
    /* a pool of polling threads (epoll on Linux, else poll;
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
    /* the idle timeout; on_access switches a connection to the busy
     * one while it answers a request */
    unsigned idle_s = idle_timeout_s(h);
    unsigned max_conn = connection_limit(h), n_threads = http_threads(h);
    unsigned per_ip = h->cfg.max_connections_per_client > 0
                          ? (unsigned)h->cfg.max_connections_per_client : 0;
    /* the certificate and key only with TLS (an empty array otherwise) */
    struct MHD_OptionItem tls_opts[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)h->cfg.tls_cert_pem},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)h->cfg.tls_key_pem},
        {MHD_OPTION_END, 0, NULL},
    };
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
        /* room for the largest head the strict reader lets through (16
         * KiB, 100 fields, 200 query arguments and cookies, each a record
         * in this pool) beside the answer's buffer; the default 32 KiB ran
         * out at ~450 cookies and answered in HTML. Pages are committed
         * as used. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
        MHD_OPTION_ARRAY, h->cfg.tls_cert_pem ? tls_opts : tls_opts + 2,
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
        dsq__waiter_wake(w);
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
        dsq__waiter_wake(w);
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

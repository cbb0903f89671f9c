/* One request's connection: the waiter that parks it while the engine
 * works and wakes it again, its hang-up check, and everything that answers
 * it (responses, CORS, error bodies), plus the API-key check and the
 * limits its body is parsed against.
 *
 * Parking (dsq__park) and waking (dsq__waiter_wake) take the same waiter
 * lock, so both halves live here: that lock is what makes a wake-up
 * between a handler's last look and its suspend impossible to lose
 * (waiter_t). Every response goes through dsq__send_response() (CORS and
 * trace headers, status bookkeeping) and every error body through
 * server/error.c. */
#include "server/http_internal.h"

#include <poll.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "engine/common/clock.h"
#include "engine/common/error.h"
#include "engine/common/log.h"

/* ------------------------------------------------------------ waiters */

waiter_t *dsq__waiter_get(dsq_http_t *h)
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

void dsq__waiter_put(dsq_http_t *h, waiter_t *w)
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
void dsq__waiter_wake(waiter_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->seq++;
    if (w->parked) {
        w->parked = false;
        MHD_resume_connection(w->mc);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Engine thread: must not block (dsq__waiter_wake). */
void dsq__on_notify(dsq_req_t *req, void *user)
{
    (void)req;
    dsq__waiter_wake(user);
}

uint64_t dsq__waiter_seq(waiter_t *w)
{
    uint64_t s;
    pthread_mutex_lock(&w->mu);
    s = w->seq;
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* Suspend c's connection until the next wake-up, unless one came since
 * `seen` (then false: look again). Only from c's access handler or stream
 * reader (libmicrohttpd's rule for MHD_suspend_connection). */
bool dsq__park(conn_t *c, uint64_t seen)
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

/* ------------------------------------------------------------ per request */

void dsq__cancel_all(conn_t *c)
{
    if (c->cancelled)
        return;
    c->cancelled = true;
    c->t_cancel = dsq_clock_now_s();
    for (int i = 0; i < c->n_ereqs; i++)
        if (c->ereqs[i] && !c->ereq_done[i])
            dsq_engine_cancel(c->e, c->ereqs[i]);
}

bool dsq__client_gone(conn_t *c)
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

/* Set on a connection's thread when it closes a request because the
 * client went away (event=disconnect logged), so that libmicrohttpd's own
 * "application error" / "internal error" line that follows on the same
 * thread (thread-per-connection) goes to debug, not warn (log_mhd). */
__thread bool dsq__tl_client_gone;

void dsq__log_disconnect(conn_t *c, const char *how)
{
    if (c->gone_logged)
        return;
    c->gone_logged = true;
    dsq_log(DSQ_LOG_INFO, "event=disconnect req=%s path=%s reason=%s",
            c->id[0] ? c->id : "-", c->path, how);
}

/* ------------------------------------------------------------ origins */

/* Whether origin is one of the comma-separated list (entries trimmed of
 * spaces; "*" matches any). */
static bool origin_listed(const char *list, const char *origin)
{
    size_t n = strlen(origin);
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && *p == ' ') { p++; len--; }
        while (len && p[len - 1] == ' ') len--;
        if ((len == 1 && *p == '*') || (len == n && !strncmp(p, origin, n)))
            return true;
        p = comma ? comma + 1 : NULL;
    }
    return false;
}

bool dsq__origin_allowed(conn_t *c)
{
    const char *origin = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin");
    const char *list = c->h->cfg.allowed_origins, *host, *auth;
    /* no Origin: not a browser's cross-site request (curl, SDKs); a
     * key: the request has to carry it, which a page on another site
     * does not have */
    if (!origin || c->h->have_key)
        return true;
    if (list && *list && origin_listed(list, origin))
        return true;
    /* same origin: scheme://authority whose authority is this Host */
    host = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Host");
    auth = strstr(origin, "://");
    return host && auth && *host && !strcasecmp(auth + 3, host);
}

enum MHD_Result dsq__send_origin_refusal(conn_t *c)
{
    const char *origin = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin");
    char msg[512], shown[128];
    snprintf(shown, sizeof(shown), "%.120s", origin ? origin : "");
    for (char *q = shown; *q; q++)
        if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f || *q == '"' || *q == '\\')
            *q = '?';
    snprintf(msg, sizeof(msg), "cross-origin request refused: Origin \"%s\" is neither this "
             "server's own nor in --allowed-origins; to let that page use dsqd, start it with "
             "--allowed-origins %s (scheme://host[:port], comma-separated)", shown,
             !strcmp(shown, "null") ? "<origin>" : shown);
    return dsq__send_error(c, DSQ_APIERR_FORBIDDEN, NULL, msg);
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
    if (origin && origin_listed(list, origin)) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
}

/* Queue r with status; takes ownership of r. */
enum MHD_Result dsq__send_response(conn_t *c, int status,
                                   struct MHD_Response *r)
{
    enum MHD_Result ret;
    if (!r)
        return MHD_NO;
    add_cors(c, r);
    {
        /* W3C Trace Context: the span that answered */
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

/* The free callback of a large answer. Building it (a logprobs answer of
 * tens of MB is millions of small cJSON nodes) left that much freed memory
 * in glibc's arenas, which they keep: the RSS of the daemon grew by the
 * largest answers and stayed there. Give it back to the OS once the
 * answer is sent; malloc_trim walks every arena, a few ms for tens of MB,
 * paid only by answers of 1 MiB and more. */
static void free_and_trim(void *p)
{
    free(p);
    malloc_trim(0);
}

/* Takes ownership of body (malloc'd). */
enum MHD_Result dsq__send_body(conn_t *c, int status, char *body,
                               const char *ctype)
{
    struct MHD_Response *r;
    size_t len;
    if (!body)
        return MHD_NO;
    len = strlen(body);
    r = len >= ((size_t)1 << 20)
            ? MHD_create_response_from_buffer_with_free_callback(len, body, free_and_trim)
            : MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    return dsq__send_response(c, status, r);
}

enum MHD_Result dsq__send_json(conn_t *c, int status, cJSON *obj)
{
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    return dsq__send_body(c, status, s, "application/json");
}

enum MHD_Result dsq__send_error(conn_t *c, dsq_apierr_t kind,
                                const char *param, const char *msg)
{
    int status = dsq_apierr_status(kind);
    /* Anthropic's routes, and paths under them that are none */
    bool anthropic = dsq__route_anthropic(c->route) ||
                     (c->route == R_NONE && !strncmp(c->path, "/v1/messages/", 13));
    char *body = anthropic ? dsq_anthropic_error_json(kind, msg)
                           : dsq_apierr_json(kind, msg, param);
    /* the access log line of a 4xx/5xx names the error */
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
        if (dsq__route_is_post(c->route))
            allow = "POST";
        if (c->h->cfg.allowed_origins)
            allow = (!strcmp(allow, "POST")) ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
        MHD_add_response_header(r, "Allow", allow);
    }
    if (kind == DSQ_APIERR_TOO_LARGE || c->close_after)
        MHD_add_response_header(r, "Connection", "close");
    return dsq__send_response(c, status, r);
}

enum MHD_Result dsq__send_api_error(conn_t *c, const dsq_api_error_t *e)
{
    return dsq__send_error(c, e->kind, e->param, e->message);
}

/* ------------------------------------------------------------ auth */

bool dsq__authorized(conn_t *c)
{
    const char *a;
    unsigned char got[SHA256_DIGEST_LENGTH];
    if (!c->h->have_key)
        return true;
    a = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (a && !strncasecmp(a, "Bearer ", 7)) {
        a += 7;
        while (*a == ' ')
            a++;
    } else {
        /* Anthropic's clients send the key as x-api-key; any route
         * takes either, as vLLM and llama-server do */
        a = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "x-api-key");
        if (!a)
            return false;
    }
    /* Hash both sides so the comparison is constant-time in the key's
     * length too, then compare the digests with CRYPTO_memcmp. */
    SHA256((const unsigned char *)a, strlen(a), got);
    return CRYPTO_memcmp(got, c->h->key_hash, sizeof(got)) == 0;
}

/* ------------------------------------------------------------ request body */

dsq_openai_limits_t dsq__limits(conn_t *c)
{
    dsq_openai_limits_t lim = {c->h->cfg.served_model_name,
                               c->tok ? dsq_tokenizer_n_vocab(c->tok) : 0,
                               c->h->cfg.max_seqs_per_request};
    return lim;
}

int dsq__append(char **p, size_t *len, size_t *cap, const char *s, size_t n)
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

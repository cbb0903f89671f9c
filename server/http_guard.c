/* The strict reader of HTTP/1.1 framing (http_guard.h): the byte machine,
 * the refusal it answers with, and the recv / gnutls_record_recv hooks
 * that run it on every socket libmicrohttpd reads.
 *
 * Grammar: RFC 9112 (request line 3, field lines 5, chunked coding 7.1,
 * message body length 6.3) and RFC 9110 5.6.2 (tokens). Where RFC 9112
 * lets a server choose, the choice is the strict one: a bare LF, obs-fold
 * (5.2), whitespace before a field's colon (5.1), a second Host (3.2) or
 * Content-Length, a Content-Length that is not plain digits and a
 * Transfer-Encoding other than chunked (6.1: 501) are refused. */
#include "server/http_guard.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "server/error.h"

enum {
    G_START,        /* before a request line; empty lines are skipped      */
    G_START_LF,     /* CR of an empty line before the request line         */
    G_METHOD,
    G_TARGET,
    G_VERSION,
    G_RL_LF,        /* CR after the version                                */
    G_FIELD,        /* start of a field line or of the empty line          */
    G_NAME,
    G_VALUE,
    G_VALUE_LF,     /* CR after a value                                    */
    G_END_LF,       /* CR of the empty line that ends the head / trailer   */
    G_BODY,         /* Content-Length bytes                                */
    G_CHUNK_SIZE,
    G_CHUNK_EXT,    /* after the size's digits, up to CR                   */
    G_CHUNK_LF,     /* CR of the size line                                 */
    G_CHUNK_DATA,
    G_CHUNK_CR,     /* the CR after chunk data                             */
    G_CHUNK_DATA_LF,
    G_REFUSED,
};

/* which header fields the framing depends on */
enum { F_OTHER, F_HOST, F_CL, F_TE, F_COOKIE };

static bool is_tchar(uint8_t c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* field-vchar / SP / HTAB, obs-text included (RFC 9110 5.5) */
static bool is_value_byte(uint8_t c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static size_t refuse(dsq_http_guard_t *g, int status, const char *reason, size_t at)
{
    g->status = status;
    g->reason = reason;
    g->st = G_REFUSED;
    return at;
}

void dsq_http_guard_reset(dsq_http_guard_t *g)
{
    memset(g, 0, sizeof(*g));
    g->st = G_START;
}

/* a new request: forget the last one's fields (not the call's count of
 * completed requests) */
static void next_request(dsq_http_guard_t *g)
{
    size_t boundary = g->boundary;
    int n_complete = g->n_complete;
    dsq_http_guard_reset(g);
    g->boundary = boundary;
    g->n_complete = n_complete;
    g->just_done = true;
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The value of a field line is complete: check what framing reads. */
static const char *end_field(dsq_http_guard_t *g, int *status)
{
    *status = 400;
    size_t n = g->val_len;
    while (n && (g->val[n - 1] == ' ' || g->val[n - 1] == '\t'))
        n--;
    g->val[n] = '\0';
    if (g->trailer)
        return g->field == F_OTHER || g->field == F_COOKIE ? NULL
                                                            : "a framing field in a chunked trailer";
    switch (g->field) {
    case F_HOST:
        return ++g->n_host > 1 ? "more than one Host header" : NULL;
    case F_CL:
        if (++g->n_cl > 1)
            return "more than one Content-Length header";
        if (!n || n > 18)
            return "invalid Content-Length";
        g->cl = 0;
        for (size_t i = 0; i < n; i++) {
            if (g->val[i] < '0' || g->val[i] > '9')
                return "invalid Content-Length";
            g->cl = g->cl * 10 + (uint64_t)(g->val[i] - '0');
        }
        return NULL;
    case F_TE:
        if (++g->n_te > 1)
            return "more than one Transfer-Encoding header";
        if (strcasecmp(g->val, "chunked")) {
            *status = 501;
            return "Transfer-Encoding other than chunked";
        }
        return NULL;
    default:
        return NULL;
    }
}

/* The empty line after the fields: the head is whole. Returns NULL and
 * sets the body state, or the reason (and *status) for a refusal. */
static const char *end_head(dsq_http_guard_t *g, int *status)
{
    *status = 400;
    if (g->trailer) {
        next_request(g);
        return NULL;
    }
    if (g->http11 && !g->n_host)
        return "an HTTP/1.1 request needs a Host header";
    if (g->n_te && g->n_cl)
        return "both Transfer-Encoding and Content-Length";
    if (g->n_te) {
        if (!g->http11)
            return "Transfer-Encoding in an HTTP/1.0 request";
        g->st = G_CHUNK_SIZE;
        g->chunk_digits = 0;
        g->remaining = 0;
        g->line_len = 0;
        return NULL;
    }
    if (g->cl) {
        g->remaining = g->cl;
        g->st = G_BODY;
        return NULL;
    }
    next_request(g);
    return NULL;
}

size_t dsq_http_guard_feed(dsq_http_guard_t *g, const uint8_t *p, size_t n)
{
    const char *why;
    int status;
    if (g->st == G_REFUSED)
        return 0;
    g->boundary = 0;
    g->n_complete = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (g->just_done) {      /* byte i - 1 ended a request */
            g->just_done = false;
            g->boundary = i;
            g->n_complete++;
        }
        if (g->st == G_BODY || g->st == G_CHUNK_DATA) {
            uint64_t take = n - i < g->remaining ? n - i : g->remaining;
            g->remaining -= take;
            i += take - 1;
            if (!g->remaining) {
                if (g->st == G_BODY)
                    next_request(g);
                else
                    g->st = G_CHUNK_CR;
            }
            continue;
        }
        if (g->st <= G_END_LF) {
            /* head bytes: the limits first */
            if (++g->head_len > DSQ_GUARD_MAX_HEAD)
                return refuse(g, 431, "request head larger than 16 KiB", i);
            if (++g->line_len > DSQ_GUARD_MAX_REQUEST_LINE && g->st <= G_RL_LF)
                return refuse(g, 414, "request line longer than 8 KiB", i);
        }
        switch (g->st) {
        case G_START:
            if (c == '\r') {
                g->st = G_START_LF;
                break;
            }
            if (!is_tchar(c))
                return refuse(g, 400, "malformed request line", i);
            g->st = G_METHOD;
            g->method[g->method_len++] = (char)c;
            break;
        case G_START_LF:
            if (c != '\n')
                return refuse(g, 400, "CR without LF", i);
            g->line_len = 0;
            g->st = G_START;
            break;
        case G_METHOD:
            if (c == ' ') {
                g->st = G_TARGET;
                break;
            }
            if (!is_tchar(c))
                return refuse(g, 400, "malformed request line", i);
            if (g->method_len >= sizeof(g->method) - 1)
                return refuse(g, 501, "unknown method", i);
            g->method[g->method_len++] = (char)c;
            break;
        case G_TARGET:
            if (c == ' ') {
                if (g->line_len == (uint32_t)g->method_len + 2)
                    return refuse(g, 400, "malformed request line", i);
                g->st = G_VERSION;
                break;
            }
            if (c <= 0x20 || c >= 0x7f)
                return refuse(g, 400, "request target has a byte outside visible ASCII", i);
            if ((c == '?' && !g->in_query) || (c == '&' && g->in_query)) {
                g->in_query = true;
                if (++g->n_params > DSQ_GUARD_MAX_PARAMS)
                    return refuse(g, 414, "more than 200 query arguments", i);
            }
            break;
        case G_VERSION:
            if (c == '\r') {
                if (g->ver_len != 8 || strncmp(g->ver, "HTTP/", 5) ||
                    g->ver[5] < '0' || g->ver[5] > '9' || g->ver[6] != '.' ||
                    g->ver[7] < '0' || g->ver[7] > '9')
                    return refuse(g, 400, "malformed request line", i);
                if (strcmp(g->ver, "HTTP/1.1") && strcmp(g->ver, "HTTP/1.0"))
                    return refuse(g, 505, "HTTP version not supported (HTTP/1.0 and 1.1 are)", i);
                g->http11 = g->ver[7] == '1';
                g->st = G_RL_LF;
                break;
            }
            if (g->ver_len >= 8 || c <= 0x20 || c >= 0x7f)
                return refuse(g, 400, "malformed request line", i);
            g->ver[g->ver_len++] = (char)c;
            break;
        case G_RL_LF:
        case G_VALUE_LF:
            if (c != '\n')
                return refuse(g, 400, "CR without LF", i);
            if (g->st == G_VALUE_LF && (why = end_field(g, &status)))
                return refuse(g, status, why, i);
            g->line_len = 0;
            g->st = G_FIELD;
            break;
        case G_FIELD:
            if (c == '\r') {
                g->st = G_END_LF;
                break;
            }
            if (c == ' ' || c == '\t')
                return refuse(g, 400, "obsolete line folding (a field line starting with whitespace)", i);
            if (!is_tchar(c))
                return refuse(g, 400, c == '\n' ? "bare LF line end (CRLF needed)"
                                                : "malformed header field name", i);
            if (++g->n_fields > DSQ_GUARD_MAX_FIELDS)
                return refuse(g, 431, "more than 100 header fields", i);
            g->name_len = 0;
            g->val_len = 0;
            g->field = F_OTHER;
            g->name[g->name_len++] = (char)(c | 0x20);
            g->st = G_NAME;
            break;
        case G_NAME:
            if (c == ':') {
                g->name[g->name_len < sizeof(g->name) ? g->name_len : sizeof(g->name) - 1] = '\0';
                if (g->name_len < sizeof(g->name)) {
                    g->field = !strcmp(g->name, "host") ? F_HOST
                             : !strcmp(g->name, "content-length") ? F_CL
                             : !strcmp(g->name, "transfer-encoding") ? F_TE
                             : !strcmp(g->name, "cookie") ? F_COOKIE : F_OTHER;
                    if (g->field == F_COOKIE && ++g->n_params > DSQ_GUARD_MAX_PARAMS)
                        return refuse(g, 431, "more than 200 query arguments and cookies", i);
                }
                g->st = G_VALUE;
                break;
            }
            if (c == ' ' || c == '\t')
                return refuse(g, 400, "whitespace between a header field name and its colon", i);
            if (!is_tchar(c))
                return refuse(g, 400, c == '\r' || c == '\n' ? "header line without a colon"
                                                             : "malformed header field name", i);
            if (g->name_len < sizeof(g->name))
                g->name[g->name_len++] = (char)(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
            break;
        case G_VALUE:
            if (c == '\r') {
                g->st = G_VALUE_LF;
                break;
            }
            if (c == '\n')
                return refuse(g, 400, "bare LF line end (CRLF needed)", i);
            if (!is_value_byte(c))
                return refuse(g, 400, "control byte in a header field", i);
            /* libmicrohttpd splits a Cookie at ; and , */
            if (g->field == F_COOKIE && (c == ';' || c == ',') &&
                ++g->n_params > DSQ_GUARD_MAX_PARAMS)
                return refuse(g, 431, "more than 200 query arguments and cookies", i);
            /* the values framing reads are kept, leading OWS dropped; a
             * Host is only counted */
            if ((g->field == F_CL || g->field == F_TE) &&
                !(g->val_len == 0 && (c == ' ' || c == '\t'))) {
                if (g->val_len >= sizeof(g->val) - 1)
                    return refuse(g, g->field == F_CL ? 400 : 501,
                                  g->field == F_CL ? "invalid Content-Length"
                                                   : "Transfer-Encoding other than chunked", i);
                g->val[g->val_len++] = (char)c;
            }
            break;
        case G_END_LF:
            if (c != '\n')
                return refuse(g, 400, "CR without LF", i);
            if ((why = end_head(g, &status)))
                return refuse(g, status, why, i);
            break;
        case G_CHUNK_SIZE: {
            int v = hexval(c);
            if (++g->line_len > DSQ_GUARD_MAX_CHUNK_LINE)
                return refuse(g, 400, "chunk size line too long", i);
            if (v >= 0) {
                if (++g->chunk_digits > 15)
                    return refuse(g, 400, "chunk size too large", i);
                g->remaining = g->remaining * 16 + (uint64_t)v;
                break;
            }
            if (!g->chunk_digits)
                return refuse(g, 400, "malformed chunk size", i);
            if (c == '\r') {
                g->st = G_CHUNK_LF;
                break;
            }
            if (c != ';' && c != ' ' && c != '\t')
                return refuse(g, 400, "malformed chunk size", i);
            g->st = G_CHUNK_EXT;
            break;
        }
        case G_CHUNK_EXT:
            if (++g->line_len > DSQ_GUARD_MAX_CHUNK_LINE)
                return refuse(g, 400, "chunk size line too long", i);
            if (c == '\r') {
                g->st = G_CHUNK_LF;
                break;
            }
            if (!is_value_byte(c))
                return refuse(g, 400, "control byte in a chunk extension", i);
            break;
        case G_CHUNK_LF:
            if (c != '\n')
                return refuse(g, 400, "CR without LF", i);
            g->line_len = 0;
            g->chunk_digits = 0;
            if (!g->remaining) {
                /* the last chunk: a trailer section, then the next request */
                g->trailer = true;
                g->st = G_FIELD;
            } else {
                g->st = G_CHUNK_DATA;
            }
            break;
        case G_CHUNK_CR:
            if (c != '\r')
                return refuse(g, 400, "chunk data longer than its size", i);
            g->st = G_CHUNK_DATA_LF;
            break;
        case G_CHUNK_DATA_LF:
            if (c != '\n')
                return refuse(g, 400, "CR without LF", i);
            g->st = G_CHUNK_SIZE;
            g->line_len = 0;
            g->remaining = 0;
            break;
        default:
            return refuse(g, 400, "malformed request", i);
        }
    }
    if (g->just_done) {
        g->just_done = false;
        g->boundary = n;
        g->n_complete++;
    }
    return n;
}

static const char *status_text(int status)
{
    switch (status) {
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 505: return "HTTP Version Not Supported";
    default: return "Bad Request";
    }
}

char *dsq_http_guard_refusal(const dsq_http_guard_t *g, size_t *len)
{
    char *body = dsq_apierr_json(DSQ_APIERR_INVALID_REQUEST, g->reason, NULL);
    if (!body)
        return NULL;
    bool head = !strcmp(g->method, "HEAD");
    size_t bl = strlen(body);
    size_t cap = bl + 256;
    char *out = malloc(cap);
    if (out) {
        int k = snprintf(out, cap,
                         "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         g->status, status_text(g->status), bl, head ? "" : body);
        *len = (size_t)k;
    }
    free(body);
    return out;
}

/* ------------------------------------------------------------ the hooks */

typedef struct guard_conn {
    dsq_http_guard_t g;
    bool tls;
    int fd;
    void *session;           /* the TLS session, once seen               */
    int pending;             /* pipelined requests libmicrohttpd answers
                                before the refusal is sent              */
} guard_conn_t;

/* attached connections by socket number; sized once to the descriptor
 * limit, so a lookup is one load for any fd */
static _Atomic(guard_conn_t *) *g_tab;
static int g_cap;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_uint_least64_t g_refused;

typedef ssize_t (*tls_recv_fn)(void *session, void *buf, size_t len);
typedef ssize_t (*tls_send_fn)(void *session, const void *buf, size_t len);
typedef int (*tls_fd_fn)(void *session);
typedef int (*tls_bye_fn)(void *session, int how);
static tls_recv_fn real_tls_recv;
static tls_send_fn real_tls_send;
static tls_fd_fn real_tls_fd;
static tls_bye_fn real_tls_bye;

static void init_once(void)
{
    struct rlimit rl;
    rlim_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
    if (n == RLIM_INFINITY || n > (1u << 20))
        n = 1u << 20;
    g_tab = calloc((size_t)n, sizeof(*g_tab));
    g_cap = g_tab ? (int)n : 0;
    /* the TLS functions of the gnutls libmicrohttpd loaded (NULL when
     * it has none: then no connection is TLS) */
    real_tls_recv = (tls_recv_fn)dlsym(RTLD_NEXT, "gnutls_record_recv");
    real_tls_send = (tls_send_fn)dlsym(RTLD_NEXT, "gnutls_record_send");
    real_tls_fd = (tls_fd_fn)dlsym(RTLD_NEXT, "gnutls_transport_get_int");
    real_tls_bye = (tls_bye_fn)dlsym(RTLD_NEXT, "gnutls_bye");
}

bool dsq_http_guard_attach(int fd, bool tls)
{
    pthread_once(&g_once, init_once);
    if (fd < 0 || fd >= g_cap ||
        (tls && (!real_tls_recv || !real_tls_send || !real_tls_fd || !real_tls_bye)))
        return false;
    guard_conn_t *gc = calloc(1, sizeof(*gc));
    if (!gc)
        return false;
    dsq_http_guard_reset(&gc->g);
    gc->tls = tls;
    gc->fd = fd;
    gc = atomic_exchange(&g_tab[fd], gc);
    free(gc);
    return true;
}

void dsq_http_guard_detach(int fd)
{
    if (fd < 0 || fd >= g_cap)
        return;
    free(atomic_exchange(&g_tab[fd], NULL));
}

uint64_t dsq_http_guard_refused(void)
{
    return atomic_load(&g_refused);
}

static guard_conn_t *lookup(int fd)
{
    return fd >= 0 && fd < g_cap ? atomic_load_explicit(&g_tab[fd], memory_order_acquire)
                                 : NULL;
}

/* The first invalid byte arrived: answer, stop sending, and from now on
 * drop what arrives until the client closes (closing at once with unread
 * bytes would reset the connection and could lose the answer). */
static void answer_refusal(guard_conn_t *gc)
{
    size_t len = 0;
    char *resp = dsq_http_guard_refusal(&gc->g, &len);
    atomic_fetch_add(&g_refused, 1);
    if (resp) {
        if (gc->tls)
            (void)real_tls_send(gc->session, resp, len);
        else
            (void)send(gc->fd, resp, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        free(resp);
    }
    if (gc->tls)
        (void)real_tls_bye(gc->session, 1 /* GNUTLS_SHUT_WR: close_notify */);
    shutdown(gc->fd, SHUT_WR);
}

/* Bytes buf[0..r) were read for gc and the reader refused one of them.
 * Whole requests pipelined before it are passed on (returns their length)
 * and answered first: the refusal waits for libmicrohttpd to finish
 * them (dsq_http_guard_request_done). Else the refusal goes now (0). */
static size_t refuse_after(guard_conn_t *gc)
{
    if (gc->g.boundary > 0) {
        gc->pending = gc->g.n_complete;
        return gc->g.boundary;
    }
    answer_refusal(gc);
    return 0;
}

void dsq_http_guard_request_done(int fd)
{
    guard_conn_t *gc = lookup(fd);
    if (gc && gc->pending > 0 && --gc->pending == 0)
        answer_refusal(gc);
}

/* libmicrohttpd reads plain sockets with recv(): pass the bytes when they
 * are valid so far. Any other caller and flag passes through. */
ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    ssize_t r = recvfrom(fd, buf, len, flags, NULL, NULL);
    guard_conn_t *gc;
    if (r <= 0 || (flags & MSG_PEEK) || !(gc = lookup(fd)) || gc->tls)
        return r;
    if (gc->g.st != G_REFUSED) {
        size_t ok;
        if (dsq_http_guard_feed(&gc->g, buf, (size_t)r) == (size_t)r)
            return r;
        if ((ok = refuse_after(gc)) > 0)
            return (ssize_t)ok;
    }
    /* drain, so an edge-triggered poller sees the next arrival or the
     * close */
    while ((r = recvfrom(fd, buf, len, flags | MSG_DONTWAIT, NULL, NULL)) > 0)
        ;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        return r;
    if (r == 0)
        return 0;
    errno = EAGAIN;
    return -1;
}

/* gnutls's error codes used here (gnutls/gnutls.h) */
#define TLS_E_AGAIN (-28)

/* libmicrohttpd reads TLS connections with gnutls_record_recv(): the same
 * filter on the decrypted bytes. The session is typed void * so that dsqd
 * builds without gnutls's headers; the ABI is a pointer either way. */
ssize_t gnutls_record_recv(void *session, void *buf, size_t len);
ssize_t gnutls_record_recv(void *session, void *buf, size_t len)
{
    pthread_once(&g_once, init_once);
    if (!real_tls_recv)
        return -50;  /* GNUTLS_E_INVALID_REQUEST: never reached, no TLS */
    ssize_t r = real_tls_recv(session, buf, len);
    guard_conn_t *gc;
    if (r <= 0 || !real_tls_fd || !(gc = lookup(real_tls_fd(session))) || !gc->tls)
        return r;
    gc->session = session;
    if (gc->g.st != G_REFUSED) {
        size_t ok;
        if (dsq_http_guard_feed(&gc->g, buf, (size_t)r) == (size_t)r)
            return r;
        if ((ok = refuse_after(gc)) > 0)
            return (ssize_t)ok;
    }
    while ((r = real_tls_recv(session, buf, len)) > 0)
        ;
    return r == 0 ? 0 : r < 0 && r != TLS_E_AGAIN ? r : TLS_E_AGAIN;
}

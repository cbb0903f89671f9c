/* The strict reader of HTTP/1.1 framing in front of libmicrohttpd.
 *
 * libmicrohttpd 0.9.75 (Debian bookworm) is lax where RFC 9112 is strict:
 * it cuts header values at a NUL byte, takes bare LF line ends, obs-fold
 * and an HTTP/1.1 request without Host, and the errors it generates itself
 * (bad Content-Length, 414, 431, 505) carry an HTML body, once after a
 * doubled status line. Newer releases add a "client discipline" level but
 * still answer in HTML, and none is packaged for bookworm. So dsqd reads
 * every byte a client sends before libmicrohttpd does: the bytes of each
 * request head and of a chunked body's framing go through a byte-wise
 * state machine (dsq_http_guard_feed) as they arrive, and libmicrohttpd
 * gets them only when they are valid so far. At the first byte that makes
 * a request malformed, dsqd answers itself (one status line, the OpenAI
 * error object, Connection: close), drops what else arrives and waits for
 * the client to close; libmicrohttpd never sees that byte, so it never
 * answers in HTML.
 *
 * The hook is the libc `recv` (plain sockets) and gnutls_record_recv (TLS):
 * defined in this file, the executable's definitions take precedence for
 * libmicrohttpd's calls (ELF symbol interposition); they read through the
 * real functions and filter only sockets attached here. The filter needs
 * no lookahead, so it keeps the kernel's readiness semantics libmicrohttpd
 * relies on (a short read means the socket is drained). */
#ifndef DSQ_SERVER_HTTP_GUARD_H
#define DSQ_SERVER_HTTP_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits, all below what libmicrohttpd's 32 KiB connection pool holds, so
 * a head it would refuse is refused here first. */
#define DSQ_GUARD_MAX_REQUEST_LINE 8192   /* bytes; 414 above            */
#define DSQ_GUARD_MAX_HEAD 16384          /* bytes of one head; 431 above */
#define DSQ_GUARD_MAX_FIELDS 100          /* header fields; 431 above    */
#define DSQ_GUARD_MAX_PARAMS 200          /* query arguments + cookies, which
                                             libmicrohttpd keeps a record
                                             of each: 414 / 431 above    */
#define DSQ_GUARD_MAX_CHUNK_LINE 1024     /* chunk size line; 400 above  */

/* Parse state of one connection: plain data, zeroed by
 * dsq_http_guard_reset, no allocation. */
typedef struct dsq_http_guard {
    int st;                  /* state of the byte machine (http_guard.c)   */
    uint32_t line_len;       /* bytes of the current line                  */
    uint32_t head_len;       /* bytes of the current head                  */
    uint16_t n_fields;
    uint8_t method_len, ver_len, name_len, val_len;
    char method[17];         /* NUL-terminated                             */
    char ver[9];
    char name[20];           /* current field name, lower case, truncated  */
    char val[34];            /* current value of a field we read, trimmed  */
    uint8_t field;           /* which field the current line is            */
    bool trailer;            /* the field lines are a chunked trailer      */
    bool http11;
    uint8_t n_host, n_cl, n_te;
    bool in_query;           /* the target's bytes are past its '?'        */
    uint16_t n_params;       /* query arguments and cookies so far         */
    uint64_t cl;             /* Content-Length value                       */
    uint64_t remaining;      /* body or chunk bytes still to pass           */
    int chunk_digits;
    int status;              /* 0 while valid, else the refusal's status   */
    const char *reason;      /* static text of the refusal                 */
    /* of the last dsq_http_guard_feed call: the offset just past the last
     * request it completed (0: none) and how many it completed; kept
     * across requests */
    size_t boundary;
    int n_complete;
    bool just_done;
} dsq_http_guard_t;

/* Start g at the beginning of a connection. */
void dsq_http_guard_reset(dsq_http_guard_t *g);

/* Feed the next n bytes the connection received. Returns n when they are
 * all valid so far, else the offset of the first invalid byte, and sets
 * g->status (400, 414, 431, 501 or 505) and g->reason; after that every
 * call returns 0. Bytes of a Content-Length body and chunk data are
 * skipped, not read. g->boundary and g->n_complete then say which whole
 * requests came before the invalid byte in this call (pipelined ones,
 * to be answered before the refusal). */
size_t dsq_http_guard_feed(dsq_http_guard_t *g, const uint8_t *p, size_t n);

/* The refusal of a g with status set, as a whole HTTP/1.1 response (status
 * line, Content-Type, Content-Length, Connection: close, and the OpenAI
 * error object unless the method was HEAD) in a malloc'd buffer the caller
 * frees; *len its length. NULL on ENOMEM. */
char *dsq_http_guard_refusal(const dsq_http_guard_t *g, size_t *len);

/* Filter the socket fd of a new connection from now on (tls: its bytes
 * come through gnutls_record_recv, not recv). Returns false (the socket is
 * then unfiltered: libmicrohttpd's own checks apply) on ENOMEM or an fd
 * above the process's descriptor limit. Called by the connection's
 * thread before its first read; dsq_http_guard_detach before close. */
bool dsq_http_guard_attach(int fd, bool tls);
void dsq_http_guard_detach(int fd);

/* libmicrohttpd finished answering a request on fd (its completed
 * callback): a refusal that waited for the requests pipelined before the
 * malformed one goes out after the last of them. */
void dsq_http_guard_request_done(int fd);

/* Requests refused so far (all connections), for tests and the log. */
uint64_t dsq_http_guard_refused(void);

#endif

/* What the files of dsqd's HTTP front end share: the daemon (struct
 * dsq_http), one request's state (conn_t) and the waiter that parks it.
 * Not an API: only the server/ files named below include it; everything
 * else goes through server/http.h.
 *
 * The front end is split by concern: http.c is the transport (daemon,
 * ticker, dispatch, request accounting), http_conn.c what every handler
 * does with its connection (park it, answer it, check its API key),
 * http_routes.c the routes that answer at once, completions.c the
 * completions and chat endpoints, http_trace.c the spans of a finished
 * request. One conn_t per HTTP request holds all of that request's
 * state, so a handler needs nothing but its conn_t. */
#ifndef DSQ_SERVER_HTTP_INTERNAL_H
#define DSQ_SERVER_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <openssl/sha.h>

#include "engine/serve/engine.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tool_calls.h"
#include "server/anthropic.h"
#include "server/chat.h"
#include "server/error.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/reasoning.h"
#include "server/responses.h"
#include "server/trace.h"

/* Seconds a cancelled request still waits for the engine to end its
 * sequences (a stream then sends finish_reason "abort" and [DONE]) before
 * its handler gives up on it; dsq_http_stop waits as long. */
#define CANCEL_GRACE_S 5.0

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

/* one per open connection, for the ticker's deadlines (http.c) */
typedef struct sock_rec sock_rec_t;

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
    /* open connections and the ticker thread */
    pthread_mutex_t sock_mu;
    sock_rec_t *socks;
    int n_socks;
    pthread_t ticker;
    bool ticker_started;
    atomic_bool ticker_stop;
    atomic_llong n_cut_head, n_cut_body;
};

enum route {
    R_NONE = 0, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_VERSION, R_COMPLETIONS,
    R_TOKENIZE, R_DETOKENIZE, R_CHAT, R_TOKENIZER_INFO, R_MESSAGES, R_COUNT_TOKENS,
    R_RESPONSES,
};

/* Routes that take a POST body (the rest answer GET and HEAD). */
static inline bool dsq__route_is_post(enum route r)
{
    return r == R_COMPLETIONS || r == R_TOKENIZE || r == R_DETOKENIZE || r == R_CHAT ||
           r == R_MESSAGES || r == R_COUNT_TOKENS || r == R_RESPONSES;
}

/* Routes that submit work to the engine (usage, access log, trace). */
static inline bool dsq__route_generates(enum route r)
{
    return r == R_COMPLETIONS || r == R_CHAT || r == R_MESSAGES || r == R_RESPONSES;
}

/* Routes answered in Anthropic's shapes (errors included). */
static inline bool dsq__route_anthropic(enum route r)
{
    return r == R_MESSAGES || r == R_COUNT_TOKENS;
}

typedef struct choice_st {
    char *text;                  /* non-streaming: accumulated text         */
    size_t len, cap;
    cJSON *lp;                   /* non-streaming logprobs accumulator      */
    dsq_finish_t finish;
    int64_t n_tokens;            /* counted from events                     */
    int64_t final_tokens;        /* engine's completion_tokens, if given    */
    double t_last;
    dsq_reasoning_t rs;          /* chat with a reasoning parser, streaming */
    /* chat with tools, streaming: content held back from where a
     * tool call may start (parsed at the finish), and whether any content
     * went out before it */
    char *th;
    size_t th_len, th_cap;
    bool th_any;
    int stop_matched;            /* the final event's stop_matched          */
    int reasoning_tokens;        /* the final event's reasoning_tokens      */
    bool called;                 /* streamed: it ended in tool calls        */
} choice_st;

typedef struct conn {
    dsq_http_t *h;
    struct MHD_Connection *mc;
    enum route route;
    char method[12];
    char path[96];
    char *model_id;              /* GET /v1/models/{id}: the id (owned) */
    bool gone_logged;            /* event=disconnect logged */
    const char *err_code;        /* the error sent (access log) */
    char err_msg[224];
    int status;
    double t_start;
    /* body */
    char *body;
    size_t body_len, body_cap;
    bool too_large, responded;
    bool ct_other;               /* Content-Type not JSON (curl -d):
                                    accepted when the body parses as JSON */
    bool close_after;            /* answer with Connection: close */
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
    size_t *echo_len;            /* per prompt, bytes of the echoed
                                    prompt's token texts (logprobs offsets) */
    bool *echo_done;             /* prompt logprobs handled, per prompt */
    int64_t discarded_tokens;    /* best_of candidates not returned        */
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
    bool queue_timeout;          /* aborted after --max-queue-wait */
    int retry_after_s;           /* the policy's Retry-After, 0 = 1 */
    /* streaming */
    char *pend;
    size_t pend_len, pend_off, pend_cap;
    bool stream_finished;        /* usage + [DONE] queued                  */
    bool stream_held;            /* the 200 waits for admission             */
    bool eof;
    /* chat */
    bool reasoning;              /* split output with the reasoning parser  */
    bool prompt_in_think;        /* the rendered prompt opened <think>      */
    dsq_tool_parser_t tools;     /* call syntax parsed out (NONE: off)      */
    /* /v1/messages: answered in Anthropic's shapes (server/anthropic.h) */
    bool anthropic;
    bool thinking_off;           /* thinking disabled: reasoning not sent   */
    dsq_anthropic_stream_t as;   /* the streamed message's open block       */
    /* /v1/responses: answered as response objects (server/responses.h) */
    bool responses;
    cJSON *resp_echo;            /* the request fields a response repeats   */
    dsq_responses_stream_t rst;  /* the streamed response's items           */
    dsq_trace_ctx_t tr;          /* this request's trace context            */
    int64_t clk_off_ns;          /* CLOCK_REALTIME - CLOCK_MONOTONIC        */
} conn_t;

/* ---- http_conn.c: waiters (park, wake), the connection, responses */

/* A waiter from the pool (recycled or new), NULL on ENOMEM; give it back
 * with dsq__waiter_put. */
waiter_t *dsq__waiter_get(dsq_http_t *h);
void dsq__waiter_put(dsq_http_t *h, waiter_t *w);
/* Any thread, the engine's included: never blocks for long. */
void dsq__waiter_wake(waiter_t *w);
uint64_t dsq__waiter_seq(waiter_t *w);
/* The engine's notify callback (dsq_req_create); user is the waiter. */
void dsq__on_notify(dsq_req_t *req, void *user);
/* Suspend c's connection unless a wake-up came since seen (then false). */
bool dsq__park(conn_t *c, uint64_t seen);
void dsq__cancel_all(conn_t *c);
bool dsq__client_gone(conn_t *c);
/* Set on this thread when it ends a request because its client left. */
extern __thread bool dsq__tl_client_gone;
void dsq__log_disconnect(conn_t *c, const char *how);
/* Queue c's one response. send_response, send_body and send_json take
 * ownership of r, body and obj. */
enum MHD_Result dsq__send_response(conn_t *c, int status, struct MHD_Response *r);
enum MHD_Result dsq__send_body(conn_t *c, int status, char *body, const char *ctype);
enum MHD_Result dsq__send_json(conn_t *c, int status, cJSON *obj);
enum MHD_Result dsq__send_error(conn_t *c, dsq_apierr_t kind, const char *param,
                                const char *msg);
enum MHD_Result dsq__send_api_error(conn_t *c, const dsq_api_error_t *e);
bool dsq__authorized(conn_t *c);
/* false for a browser's cross-site request: an Origin header that is
 * neither listed in --allowed-origins nor this server's own (scheme://Host),
 * when no API key is set (403, docs/api.md) */
bool dsq__origin_allowed(conn_t *c);
/* The 403 origin_not_allowed answer: names the Origin and the flag. */
enum MHD_Result dsq__send_origin_refusal(conn_t *c);
/* What c's body is parsed against (model name, vocabulary, sequences). */
dsq_openai_limits_t dsq__limits(conn_t *c);
/* Append n bytes of s to the growing NUL-terminated buffer *p. Returns 0
 * or DSQ_ENOMEM (*p unchanged). */
int dsq__append(char **p, size_t *len, size_t *cap, const char *s, size_t n);

/* ---- http_routes.c: the routes that answer at once */

enum MHD_Result dsq__do_health(conn_t *c);
enum MHD_Result dsq__do_models(conn_t *c);
enum MHD_Result dsq__do_model(conn_t *c);
enum MHD_Result dsq__do_tokenizer_info(conn_t *c);
enum MHD_Result dsq__do_version(conn_t *c);
enum MHD_Result dsq__do_metrics(conn_t *c);
enum MHD_Result dsq__do_tokenize(conn_t *c);
enum MHD_Result dsq__do_detokenize(conn_t *c);
/* POST /v1/messages/count_tokens: {"input_tokens": n}, the prompt
 * /v1/messages would submit. */
enum MHD_Result dsq__do_count_tokens(conn_t *c);
/* dsq_tokenizer_encode flags for a prompt: special tokens parsed, BOS
 * when add_special and the tokenizer adds one. */
unsigned dsq__tok_flags(const dsq_tokenizer_t *t, bool add_special);

/* ---- completions.c: /v1/completions and /v1/chat/completions */

enum MHD_Result dsq__do_completions(conn_t *c);
enum MHD_Result dsq__do_chat(conn_t *c);
/* POST /v1/messages: the body translated to a chat request, then
 * dsq__do_chat with Anthropic's output shapes. */
enum MHD_Result dsq__do_messages(conn_t *c);
/* POST /v1/responses: likewise, answered as OpenAI Responses objects. */
enum MHD_Result dsq__do_responses(conn_t *c);
/* Re-entered on every resume of a submitted request until it answers:
 * the JSON body, or the 200 of a stream held back by admission. */
enum MHD_Result dsq__finish_nonstream(conn_t *c);
enum MHD_Result dsq__stream_when_admitted(conn_t *c);
/* Token counts of c so far, for the usage object, the trace and the log. */
void dsq__usage_of(conn_t *c, dsq_usage_t *u);

/* ---- http_trace.c */

/* Queue the spans of c, which ended with status st at t_end (monotonic
 * s), to the exporter, if there is one and c's trace is sampled. */
void dsq__trace_request(conn_t *c, struct MHD_Connection *mc, int st, double t_end);

#endif

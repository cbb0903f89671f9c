/* The HTTP daemon: routes, auth, limits, CORS, TLS, streaming, drain.
 *
 * Threading: libmicrohttpd runs a small pool of polling threads
 * (MHD_OPTION_THREAD_POOL_SIZE, --http-threads; epoll on Linux) that parse,
 * authorize, tokenize and render, and never wait. A request that has
 * nothing to send parks: its connection is suspended
 * (MHD_suspend_connection) and resumed by the engine's notify callback
 * (never blocking the engine thread: a short mutex + MHD_resume_connection)
 * or by a ticker thread every 50 ms, which polls every parked socket for a
 * hang-up (libmicrohttpd does not watch suspended ones), wakes requests at
 * their timeout or cancel grace, and shuts down connections whose request
 * head (--header-timeout) or body (--body-timeout) is not in by its
 * deadline. So an open connection costs its buffers, never a thread: slow
 * or idle clients cannot take the threads that serve others, and the only
 * bounds are --max-connections and --max-connections-per-client.
 *
 * Lifecycle: create (listening; /health says 503) -> set_engine (ready) ->
 * drain (new requests get 503; in-flight ones continue) -> stop (aborts
 * what is left, joins every connection thread) -> the caller destroys the
 * engine -> destroy. */
#ifndef DSQ_SERVER_HTTP_H
#define DSQ_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/serve/engine.h"
#include "server/metrics.h"

typedef struct dsq_http_config {
    const char *host;                /* numeric address or name, e.g. 127.0.0.1 */
    int port;                        /* 0 = any free port (see dsq_http_port) */
    const char *api_key;             /* NULL/"" = no auth                    */
    int64_t max_request_bytes;       /* 413 above                            */
    double request_timeout_s;        /* 0 = none                             */
    const char *allowed_origins;     /* NULL = CORS off; "a,b" or "*"; a
                                        request from another Origin is 403
                                        unless api_key is set              */
    bool any_content_type;           /* take a POST body of any Content-Type
                                        that is JSON (llama-server's way);
                                        false: 415 unless application/json */
    const char *tls_cert_pem;        /* PEM contents (not paths), both or none */
    const char *tls_key_pem;
    const char *served_model_name;
    int64_t created;                 /* unix time for /v1/models             */
    bool prefix_caching;             /* report cached_tokens in usage        */
    int timeout_keep_alive_s;        /* a connection with no request
                                        bytes in flight for this long is
                                        closed (idle keep-alive, or a client
                                        that sends nothing / half a request);
                                        a running request is never cut by
                                        it. 0 = 5 (uvicorn's default)        */
    double header_timeout_s;         /* the whole request head
                                        (request line + headers) must be in
                                        within this from connect (kept-alive:
                                        from the previous answer, plus
                                        timeout_keep_alive_s); <= 0 = none */
    double body_timeout_s;           /* the whole body within this
                                        from the end of its head; <= 0 = none */
    int max_connections;             /* open connections at once;
                                        0 = from RLIMIT_NOFILE (raised to its
                                        hard limit) less 256, at most 65536 */
    int max_connections_per_client;  /* per client IP address
                                        (libmicrohttpd's per-IP limit); 0 = none */
    int64_t max_undelivered_bytes;   /* the engine's bound on a
                                        request's unread output; each socket's
                                        kernel send buffer is capped to half of
                                        it (SO_SNDBUF; Linux doubles it), so a
                                        client that stops reading holds at most
                                        about twice this; 0 = the kernel's  */
    int http_threads;                /* polling threads; 0 = 2 per
                                        online CPU, 4 to 32 */
    int max_seqs_per_request;        /* prompts x max(n, best_of) cap;
                                        0 = DSQ_OPENAI_MAX_SEQS             */
    int64_t default_seed;            /* --seed, the seed of requests
                                        that send none; < 0 = none (each
                                        such request draws a random one)  */
    int reasoning_budget;            /* --reasoning-budget: thinking tokens
                                        of a request that sets none; < 0 =
                                        no limit                         */
    /* OpenTelemetry: every request gets a W3C trace context (from its
     * traceparent / tracestate, else a new trace) and answers with its
     * traceparent; with otlp (borrowed; must outlive the daemon) each
     * sampled request's spans are queued to it when the request ends
     * (server/trace.h). sampler decides the sampled flag of new traces
     * (NULL: parentbased_always_on). */
    struct dsq_otlp *otlp;
    const struct dsq_sampler *sampler;
} dsq_http_config_t;

typedef struct dsq_http dsq_http_t;

/* Start listening. Strings in cfg are copied. metrics is borrowed and must
 * outlive the daemon. NULL with a reason in err (bind failed, TLS not
 * supported by this libmicrohttpd, ...). */
dsq_http_t *dsq_http_create(const dsq_http_config_t *cfg, dsq_metrics_t *m,
                            char *err, size_t err_len);
/* Set up /v1/chat/completions for engine e (call after the engine
 * is created, before dsq_http_set_engine): compiles the chat template from
 * template_path (--chat-template; NULL = the model's own, if any) and
 * selects the reasoning parser (NULL/"none" or "deepseek_r1") and the
 * tool-call parser (dsq_chat_create). Returns 0,
 * or DSQ_EINVAL with a one-line reason in err (unreadable file, template
 * that does not compile, unknown parser): the daemon should then refuse
 * to start. Without a template chat requests get a 400. */
int dsq_http_set_chat(dsq_http_t *h, dsq_engine_t *e,
                      const char *template_path, const char *reasoning_parser,
                      const char *tool_parser, char *err, size_t err_len);
/* The engine is loaded: serve requests with it (borrowed until
 * dsq_http_stop returns). /health turns 200. */
void dsq_http_set_engine(dsq_http_t *h, dsq_engine_t *e);
/* Bound TCP port (useful with port 0). */
int dsq_http_port(const dsq_http_t *h);
/* Stop taking new work: every new request but /health and /metrics gets
 * 503, /health too. In-flight completions continue. */
void dsq_http_drain(dsq_http_t *h);
/* Completions in flight (submitted, response not finished). */
int dsq_http_n_inflight(dsq_http_t *h);
/* Cancel whatever is still in flight and stop the daemon (joins all
 * connection threads). After it returns nothing calls the engine any more.
 * Idempotent. */
void dsq_http_stop(dsq_http_t *h);
/* Free everything (calls dsq_http_stop first). Call after the engine is
 * destroyed: the engine may call notify until then. NULL is a no-op. */
void dsq_http_destroy(dsq_http_t *h);

#endif

/* POST /v1/completions and /v1/chat/completions, from the request body
 * to the last byte of the answer: validate (server/openai.c), render the
 * messages with the chat template and constrain tool calls (chat only),
 * tokenize and check every prompt against the context, submit one engine
 * request per prompt (start_requests), then either stream the engine's
 * events as SSE (stream_reader) or gather them into one JSON body
 * (dsq__finish_nonstream).
 *
 * Nothing here blocks an HTTP thread: a request with nothing to send
 * parks its connection (dsq__park) and runs again when the engine's
 * notify or the ticker wakes it, so every stage after the submit starts
 * with a look that never waits (poll_progress). The transport (http.c)
 * only routes to dsq__do_completions / dsq__do_chat and re-enters the
 * waiting stages on resume. */
#include "server/http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/common/clock.h"
#include "engine/common/error.h"
#include "engine/text/grammar.h"

#define QUEUE_TIMEOUT_MSG "the request waited past --max-queue-wait without being " \
                          "scheduled (the server is overloaded); retry later"

static const char *token_text(void *u, int32_t id, size_t *len)
{
    return dsq_tokenizer_token_bytes(u, id, len);
}

static int pend_add(conn_t *c, char *s)
{
    int rc = DSQ_ENOMEM;
    if (s)
        rc = dsq__append(&c->pend, &c->pend_len, &c->pend_cap, s, strlen(s));
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

static dsq_responses_meta_t resp_meta(const conn_t *c)
{
    dsq_responses_meta_t m = {c->id, c->created, c->h->cfg.served_model_name, c->resp_echo};
    return m;
}

/* The stop string that ended choice ch (borrowed from the request), or
 * NULL. */
static const char *stop_sequence(const conn_t *c, const choice_st *ch)
{
    int k = ch->stop_matched - 1;
    return k >= 0 && k < c->req.sp.n_stop ? c->req.stop[k] : NULL;
}

/* Echo + logprobs. The request's first event carries the prompt's
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
        ch->stop_matched = o->stop_matched;
        ch->reasoning_tokens = o->reasoning_tokens;
        if (o->completion_tokens > 0)
            ch->final_tokens = o->completion_tokens;
        if (o->cached_tokens > c->cached_tokens[p])
            c->cached_tokens[p] = o->cached_tokens;
    }
    if (!c->req.stream) {
        if (o->text_len)
            dsq__append(&ch->text, &ch->len, &ch->cap, o->text, o->text_len);
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

/* The calls in a finished choice's text: a choice cut at max_tokens
 * keeps the complete calls before the one it was writing. */
static int tool_parse(const conn_t *c, dsq_finish_t finish, const char *text, size_t len,
                      dsq_tool_parse_t *r)
{
    return (finish == DSQ_FINISH_LENGTH ? dsq_tool_calls_parse_cut
                                        : dsq_tool_calls_parse)(c->tools, text, len, r);
}

/* Tool calls of a chat choice, streamed. The content delta *d
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
        if (ch->th_len && (finish == DSQ_FINISH_STOP || finish == DSQ_FINISH_LENGTH) &&
            tool_parse(c, finish, ch->th, ch->th_len, &r) == DSQ_OK) {
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
static void tool_stream_calls(conn_t *c, int idx, choice_st *ch, dsq_finish_t finish)
{
    dsq_tool_parse_t r;
    if (tool_parse(c, finish, ch->th, ch->th_len, &r) != DSQ_OK)
        return;
    dsq_tool_call_out_t *out = calloc((size_t)r.n_calls, sizeof(*out));
    char (*ids)[40] = calloc((size_t)r.n_calls, sizeof(*ids));
    if (out && ids) {
        for (int k = 0; k < r.n_calls; k++) {
            dsq_openai_new_id(ids[k], sizeof(ids[k]), c->anthropic ? "toolu_" : "call_");
            out[k] = (dsq_tool_call_out_t){ids[k], r.calls[k].name, r.calls[k].arguments};
        }
        if (c->anthropic)
            pend_add(c, dsq_anthropic_ev_tools(&c->as, out, r.n_calls));
        else if (c->responses)
            pend_add(c, dsq_responses_ev_calls(&c->rst, out, r.n_calls));
        else
            pend_add(c, dsq_openai_chat_tool_chunk(c->id, c->created,
                                                   c->h->cfg.served_model_name, idx, out,
                                                   r.n_calls, 0, c->req.include_usage));
    }
    free(out);
    free(ids);
    dsq_tool_parse_free(&r);
}

/* One engine event of a streamed chat choice -> content /
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
    if (c->anthropic) {
        /* the reasoning part of a delta comes before its content */
        if (d.reasoning_len && !c->thinking_off)
            pend_add(c, dsq_anthropic_ev_text(&c->as, true, d.reasoning, d.reasoning_len));
        if (d.content_len)
            pend_add(c, dsq_anthropic_ev_text(&c->as, false, d.content, d.content_len));
    } else if (c->responses) {
        if (d.reasoning_len)
            pend_add(c, dsq_responses_ev_text(&c->rst, true, d.reasoning, d.reasoning_len));
        if (d.content_len)
            pend_add(c, dsq_responses_ev_text(&c->rst, false, d.content, d.content_len));
    } else if (d.content_len || d.reasoning_len || lp)
        pend_add(c, dsq_openai_chat_chunk(
                        c->id, c->created, model, idx, NULL,
                        d.content_len || !d.reasoning_len ? (d.content ? d.content : "") : NULL,
                        d.content_len, d.reasoning_len ? d.reasoning : NULL,
                        d.reasoning_len, lp, DSQ_FINISH_NONE, usage_null));
    if (called)
        tool_stream_calls(c, idx, ch, o->finish);
    ch->called |= called;
    /* Anthropic's stop_reason and the Responses status go out at the
     * stream's end */
    if (o->finish != DSQ_FINISH_NONE && !c->anthropic && !c->responses)
        pend_add(c, called && o->finish == DSQ_FINISH_STOP
                        ? dsq_openai_chat_tool_finish_chunk(c->id, c->created, model, idx,
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

void dsq__usage_of(conn_t *c, dsq_usage_t *u)
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
    /* best_of > n: OpenAI bills every generated candidate */
    u->completion_tokens += c->discarded_tokens;
    u->has_cached = c->h->cfg.prefix_caching;
    for (int i = 0; i < c->n_choices; i++)
        u->reasoning_tokens += c->choices[i].reasoning_tokens;
    u->has_reasoning = c->reasoning;
}

/* The message of a request refused after it was queued: the
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
        dsq__cancel_all(c);
        return W_STOPPING;
    }
    if (c->cancelled) {
        if (dsq_clock_now_s() - c->t_cancel > CANCEL_GRACE_S)
            return W_STOPPING;
    } else if (atomic_load(&h->stopping)) {
        dsq__cancel_all(c);
    } else if (dsq__client_gone(c)) {
        /* a client hang-up is normal: info, with the request id
         * (libmicrohttpd's own "application error" line that follows
         * a stream's end is logged at debug, log_mhd) */
        dsq__log_disconnect(c, "client closed the connection; its sequences are cancelled");
        dsq__tl_client_gone = true;
        dsq__cancel_all(c);
        return W_GONE;
    } else if (h->cfg.request_timeout_s > 0 &&
               dsq_clock_now_s() - c->t_start > h->cfg.request_timeout_s) {
        dsq__cancel_all(c);
        if (!c->req.stream)
            return W_TIMEOUT;
    }
    return W_PENDING;
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
        uint64_t seen = dsq__waiter_seq(c->w);
        wait_result_t w = poll_progress(c);
        if (w == W_GONE)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (w == W_PENDING) {
            if (dsq__park(c, seen))
                return 0;    /* resumed by the next wake-up */
            continue;
        }
        if (w == W_DONE || w == W_STOPPING || w == W_TIMEOUT) {
            if (c->queue_timeout) {
                /* the 200 and its headers are out: the refusal
                 * is an error event (as vLLM streams errors), then [DONE] */
                char rbuf[200];
                const char *msg = refusal_msg(c, rbuf, sizeof(rbuf));
                char *e = c->anthropic || c->responses
                              ? NULL : dsq_apierr_json(DSQ_APIERR_OVERLOADED, msg, NULL);
                size_t n = e ? strlen(e) + 16 : 0;
                char *ev = e ? malloc(n) : NULL;
                if (ev)
                    snprintf(ev, n, "data: %s\n\n", e);
                free(e);
                pend_add(c, c->anthropic ? dsq_anthropic_ev_error(DSQ_APIERR_OVERLOADED, msg)
                            : c->responses ? dsq_responses_ev_error(&c->rst,
                                                                    DSQ_APIERR_OVERLOADED, msg)
                                           : ev);
                c->err_code = "queue_full";
                snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg);
            }
            if (c->anthropic) {
                /* after an error event Anthropic's streams end there */
                if (!c->queue_timeout) {
                    dsq_usage_t u;
                    const choice_st *ch = &c->choices[0];
                    dsq__usage_of(c, &u);
                    pend_add(c, dsq_anthropic_ev_end(
                                    &c->as,
                                    dsq_anthropic_stop_reason(ch->finish, ch->called,
                                                              ch->stop_matched > 0),
                                    stop_sequence(c, ch), &u));
                }
                c->stream_finished = true;
                continue;
            }
            if (c->responses) {
                /* Responses streams end with their last event, no [DONE] */
                if (!c->queue_timeout) {
                    dsq_usage_t u;
                    dsq_responses_meta_t m = resp_meta(c);
                    dsq__usage_of(c, &u);
                    pend_add(c, dsq_responses_ev_end(&c->rst, &m, c->choices[0].finish, &u));
                }
                c->stream_finished = true;
                continue;
            }
            if (c->req.include_usage) {
                dsq_usage_t u;
                dsq__usage_of(c, &u);
                pend_add(c, (c->req.chat ? dsq_openai_chat_usage_chunk
                                         : dsq_openai_usage_chunk)(
                                c->id, c->created, c->h->cfg.served_model_name, &u));
            }
            pend_add(c, strdup("data: [DONE]\n\n"));
            c->stream_finished = true;
        }
    }
}

/* The chat.completion body; the whole text of each choice goes
 * through the reasoning parser at once. */
static enum MHD_Result finish_chat_nonstream(conn_t *c)
{
    dsq_chat_choice_out_t *outs = calloc((size_t)c->n_choices, sizeof(*outs));
    dsq_reasoning_delta_t *ds = calloc((size_t)c->n_choices, sizeof(*ds));
    /* with tools: per choice, the parsed calls, their output rows and ids */
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
        /* tool calls parsed out of a choice that stopped */
        if (c->tools != DSQ_TOOL_PARSER_NONE && tp && tc &&
            (ch->finish == DSQ_FINISH_STOP || ch->finish == DSQ_FINISH_LENGTH)) {
            if (tool_parse(c, ch->finish, outs[i].content, outs[i].content_len, &tp[i])) {
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
                    dsq_openai_new_id(tid[i][k], sizeof(tid[i][k]),
                                      c->anthropic ? "toolu_" : "call_");
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
        dsq__usage_of(c, &u);
        dsq_responses_meta_t m = resp_meta(c);
        body = c->responses ? dsq_responses_body(&m, &outs[0], &u)
               : c->anthropic
                   ? dsq_anthropic_message_body(c->id, c->h->cfg.served_model_name, &outs[0],
                                                !c->thinking_off,
                                                stop_sequence(c, &c->choices[0]), &u)
                   : dsq_openai_chat_body(c->id, c->created, c->h->cfg.served_model_name,
                                          outs, c->n_choices, &u);
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
        return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    return dsq__send_body(c, 200, body, "application/json");
}

/* A non-streaming request after its submit, and again at each resume: the
 * answer once every sequence ended (or the request timed out, the client
 * left, the server stops), else park the connection. */
enum MHD_Result dsq__finish_nonstream(conn_t *c)
{
    wait_result_t w;
    dsq_choice_out_t *outs;
    dsq_usage_t u;
    char *body;
    for (;;) {
        uint64_t seen = dsq__waiter_seq(c->w);
        /* a refused prompt of a list ends the request at once */
        if ((w = poll_progress(c)) != W_PENDING || c->queue_timeout)
            break;
        if (dsq__park(c, seen))
            return MHD_YES;      /* the access handler runs again on resume */
    }
    if (w == W_GONE)
        return MHD_NO;
    if (w == W_TIMEOUT)
        return dsq__send_error(c, DSQ_APIERR_TIMEOUT, NULL,
                               "request ran past --request-timeout");
    if (w == W_STOPPING)
        return dsq__send_error(c, DSQ_APIERR_UNAVAILABLE, NULL,
                               "server is shutting down");
    if (c->queue_timeout) {
        char rbuf[200];
        dsq__cancel_all(c);
        return dsq__send_error(c, DSQ_APIERR_OVERLOADED, NULL,
                               refusal_msg(c, rbuf, sizeof(rbuf)));
    }
    if (c->req.chat)
        return finish_chat_nonstream(c);
    outs = calloc((size_t)c->n_choices, sizeof(*outs));
    if (!outs)
        return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    for (int i = 0; i < c->n_choices; i++) {
        outs[i].index = i;
        outs[i].text = c->choices[i].text ? c->choices[i].text : "";
        outs[i].text_len = c->choices[i].len;
        outs[i].logprobs = c->choices[i].lp;
        outs[i].finish = c->choices[i].finish;
    }
    dsq__usage_of(c, &u);
    body = dsq_openai_completion_body(c->id, c->created,
                                      c->h->cfg.served_model_name, outs,
                                      c->n_choices, &u);
    free(outs);
    return dsq__send_body(c, 200, body, "application/json");
}

static enum MHD_Result start_requests(conn_t *c);

enum MHD_Result dsq__do_completions(conn_t *c)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = dsq__limits(c);
    dsq_completion_req_t *q = &c->req;
    int max_len = dsq_engine_max_model_len(c->e);

    if (dsq_openai_parse_completion(c->body, c->body_len, &lim, q, &err))
        return dsq__send_api_error(c, &err);
    if (!q->sp.has_seed && c->h->cfg.default_seed >= 0) {   /* --seed */
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
                                     dsq__tok_flags(c->tok, true), &pr->ids, &n))
                return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL,
                                       "tokenizer failed");
            pr->n_ids = (int)n;
        }
        if (pr->n_ids == 0)
            return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, "prompt",
                                   "the prompt is empty after tokenization");
        if (dsq_openai_check_context(pr->n_ids, q->sp.max_tokens, max_len, &err))
            return dsq__send_api_error(c, &err);
    }
    if (q->sp.prompt_logprobs) {
        /* every choice repeats its prompt's logprobs: bound the
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
            return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, "logprobs", msg);
        }
    }
    return start_requests(c);
}

/* The thinking section for the engine (dsq_sampling_t.think_*): the
 * reasoning parser's tags as token ids, whether the prompt opened it, and
 * the budget (the request's, else --reasoning-budget). */
static int think_setup(conn_t *c)
{
    dsq_completion_req_t *q = &c->req;
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int budget = q->think_budget >= 0 ? q->think_budget : c->h->cfg.reasoning_budget;
    int rc = dsq_tokenizer_encode(c->tok, DSQ_REASONING_OPEN, strlen(DSQ_REASONING_OPEN),
                                  DSQ_TOK_PARSE_SPECIAL, &a, &na);
    if (!rc)
        rc = dsq_tokenizer_encode(c->tok, DSQ_REASONING_CLOSE, strlen(DSQ_REASONING_CLOSE),
                                  DSQ_TOK_PARSE_SPECIAL, &b, &nb);
    if (!rc && !(q->think_ids = malloc((na + nb) * sizeof(int32_t))))
        rc = DSQ_ENOMEM;
    if (!rc) {
        memcpy(q->think_ids, a, na * sizeof(int32_t));
        memcpy(q->think_ids + na, b, nb * sizeof(int32_t));
        q->sp.think_start = q->think_ids;
        q->sp.n_think_start = (int)na;
        q->sp.think_end = q->think_ids + na;
        q->sp.n_think_end = (int)nb;
        q->sp.think_open = c->prompt_in_think;
        q->sp.has_think_budget = budget >= 0;
        q->sp.think_budget = budget;
    }
    free(a);
    free(b);
    return rc;
}

/* POST /v1/chat/completions. Renders the messages with the chat
 * template, tokenizes them into the request's single prompt, then shares
 * everything after tokenization with /v1/completions (start_requests). */
enum MHD_Result dsq__do_chat(conn_t *c)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = dsq__limits(c);
    dsq_completion_req_t *q = &c->req;
    int max_len = dsq_engine_max_model_len(c->e);
    dsq_prompt_t *pr;
    size_t n = 0;

    if (dsq_openai_parse_chat(c->body, c->body_len, &lim, q, &err))
        return dsq__send_api_error(c, &err);
    if (!q->sp.has_seed && c->h->cfg.default_seed >= 0) {   /* --seed */
        q->sp.has_seed = true;
        q->sp.seed = (uint64_t)c->h->cfg.default_seed;
    }
    c->have_req = true;
    /* tools. required / a named function: decoding is
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
                                              c->tools,
                                              /* a named function is called
                                               * once (OpenAI's forced call) */
                                              q->parallel_tool_calls &&
                                                  q->tool_choice != DSQ_TOOL_CHOICE_NAMED,
                                              &gbnf, why, sizeof(why));
        if (c->tools == DSQ_TOOL_PARSER_NONE)
            snprintf(why, sizeof(why), "--tool-call-parser none: no call syntax to constrain "
                     "to");
        if (!rc)
            rc = dsq_grammar_from_gbnf(gbnf, strlen(gbnf), NULL, &q->sp.grammar, why,
                                       sizeof(why));
        free(gbnf);
        if (rc == DSQ_ENOMEM)
            return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        if (rc) {
            char msg[400];
            snprintf(msg, sizeof(msg), "'tools': %s", why);
            return dsq__send_error(c, rc == DSQ_EUNSUPPORTED ? DSQ_APIERR_UNSUPPORTED
                                                             : DSQ_APIERR_INVALID_REQUEST,
                                   "tools", msg);
        }
    }
    if (!(q->prompts = calloc(1, sizeof(*q->prompts))))
        return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    q->n_prompts = 1;
    pr = &q->prompts[0];
    if (dsq_chat_render(c->h->chat, q->messages, q->tools, true, &pr->text,
                        &pr->text_len, &err))
        return dsq__send_api_error(c, &err);
    if (dsq_chat_tokenize(c->h->chat, pr->text, pr->text_len, true, &pr->ids, &n))
        return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "tokenizer failed");
    pr->n_ids = (int)n;
    if (pr->n_ids == 0)
        return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, "messages",
                               "the rendered prompt is empty");
    if (q->sp.max_tokens < 0)   /* no limit given: up to the context's end */
        q->sp.max_tokens = max_len - pr->n_ids > 0 ? max_len - pr->n_ids : 1;
    if (dsq_openai_check_context(pr->n_ids, q->sp.max_tokens, max_len, &err))
        return dsq__send_api_error(c, &err);
    c->reasoning = dsq_chat_has_reasoning(c->h->chat);
    /* under a grammar (structured outputs, forced tool calls) the grammar
     * writes every token from the first: what the template's open <think>
     * would make reasoning is the constrained answer itself */
    c->prompt_in_think = c->reasoning && !q->sp.grammar &&
        dsq_reasoning_prompt_in_think(pr->text, pr->text_len);
    if (c->reasoning && think_setup(c))
        return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "tokenizer failed");
    return start_requests(c);
}

enum MHD_Result dsq__do_messages(conn_t *c)
{
    dsq_api_error_t err;
    dsq_anthropic_req_t ar;
    if (dsq_anthropic_to_chat(c->body, c->body_len, false, &ar, &err))
        return dsq__send_api_error(c, &err);
    /* the chat request it means replaces the body: dsq__do_chat parses it
     * (and the trace's input messages read it) */
    free(c->body);
    c->body = ar.chat_body;
    c->body_len = ar.chat_body_len;
    c->body_cap = ar.chat_body_len + 1;
    c->anthropic = true;
    c->thinking_off = ar.thinking_off;
    return dsq__do_chat(c);
}

enum MHD_Result dsq__do_responses(conn_t *c)
{
    dsq_api_error_t err;
    dsq_responses_req_t rr;
    if (dsq_responses_to_chat(c->body, c->body_len, &rr, &err))
        return dsq__send_api_error(c, &err);
    free(c->body);
    c->body = rr.chat_body;
    c->body_len = rr.chat_body_len;
    c->body_cap = rr.chat_body_len + 1;
    c->resp_echo = rr.echo;
    c->responses = true;
    return dsq__do_chat(c);
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
    c->w = dsq__waiter_get(c->h);
    if (!c->ereqs || !c->ereq_done || !c->prompt_tokens || !c->cached_tokens ||
        !c->echo_len || !c->echo_done || !c->choices || !c->w ||
        dsq_openai_new_id(c->id, sizeof(c->id),
                          c->anthropic ? "msg_" : c->responses ? "resp_"
                                                : q->chat ? "chatcmpl-" : "cmpl-"))
        return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    c->created = (int64_t)time(NULL);
    for (int i = 0; i < c->n_choices; i++) {
        if (q->sp.logprobs >= 0 && !q->stream &&
            !(c->choices[i].lp = q->chat ? dsq_openai_chat_logprobs_new()
                                         : dsq_openai_logprobs_new()))
            return dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        if (q->chat) {
            /* the first delta of each choice carries the role */
            dsq_reasoning_init(&c->choices[i].rs, c->prompt_in_think);
            if (q->stream && c->anthropic) {
                pend_add(c, dsq_anthropic_ev_start(c->id, c->h->cfg.served_model_name,
                                                   q->prompts[0].n_ids));
            } else if (q->stream && c->responses) {
                dsq_responses_meta_t m = resp_meta(c);
                pend_add(c, dsq_responses_ev_start(&c->rst, &m));
            } else if (q->stream) {
                pend_add(c, dsq_openai_chat_chunk(
                                c->id, c->created, c->h->cfg.served_model_name,
                                i, "assistant", "", 0, NULL, 0, NULL,
                                DSQ_FINISH_NONE, q->include_usage));
            }
        }
        if (q->echo) {
            size_t len = 0;
            /* with logprobs, the streamed echo waits for the prompt's
             * logprobs (echo_prompt_logprobs) */
            char *t = q->stream && q->sp.prompt_logprobs ? NULL
                                                         : echo_text(c, i / q->sp.n, &len);
            if (t && q->stream)
                pend_add(c, dsq_openai_chunk(c->id, c->created,
                                             c->h->cfg.served_model_name, i, t,
                                             len, NULL, DSQ_FINISH_NONE,
                                             q->include_usage));
            else if (t)
                dsq__append(&c->choices[i].text, &c->choices[i].len,
                            &c->choices[i].cap, t, len);
            free(t);
        }
    }
    if (c->n_ereqs > dsq_engine_max_queued(c->e)) {
        /* it could never be queued whole; retrying cannot help */
        for (int k = 0; k < c->n_ereqs; k++)
            c->ereq_done[k] = true;
        snprintf(reason, sizeof(reason), "this request has %d prompts; the server takes at "
                 "most %d requests at once (--max-num-seqs run slots + --max-waiting-requests "
                 "waiting): send fewer prompts per request",
                 c->n_ereqs, dsq_engine_max_queued(c->e));
        return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, "prompt", reason);
    }
    for (int p = 0; p < c->n_ereqs; p++) {
        dsq_prompt_t *pr = &q->prompts[p];
        reason[0] = '\0';
        c->prompt_tokens[p] = pr->n_ids;
        c->ereqs[p] = dsq_req_create(pr->ids, pr->n_ids, &q->sp, dsq__on_notify,
                                     c->w, reason, sizeof(reason));
        if (!c->ereqs[p]) {
            /* nothing was submitted yet: nothing to cancel or wait for */
            for (int k = 0; k < c->n_ereqs; k++)
                c->ereq_done[k] = true;
            return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, NULL,
                                   reason[0] ? reason : "invalid request");
        }
    }
    for (int p = 0; p < c->n_ereqs; p++) {
        int rc = dsq_engine_submit(c->e, c->ereqs[p]);
        if (rc) {
            /* requests never submitted report nothing: treat them as done */
            for (int k = p; k < c->n_ereqs; k++)
                c->ereq_done[k] = true;
            dsq__cancel_all(c);
            if (rc == DSQ_ERANGE) {
                dsq_openai_check_context(q->prompts[p].n_ids, q->sp.max_tokens,
                                         0, &err);
                return dsq__send_api_error(c, &err);
            }
            if (rc == DSQ_EFULL) {
                /* the policy's own reason and Retry-After */
                char why[200];
                if ((c->retry_after_s = dsq_req_refusal(c->ereqs[p], why, sizeof(why))) > 0)
                    return dsq__send_error(c, DSQ_APIERR_OVERLOADED, NULL, why);
                return dsq__send_error(c, DSQ_APIERR_OVERLOADED, NULL,
                                       "the server's waiting queue is full; retry later");
            }
            return dsq__send_error(c, dsq_apierr_from_code(rc), NULL, dsq_strerror(rc));
        }
    }
    c->inflight = true;
    atomic_fetch_add(&c->h->n_inflight, 1);
    if (!q->stream)
        return dsq__finish_nonstream(c);
    for (int p = 0; p < c->n_ereqs; p++)
        c->stream_held |= c->ereqs[p] && dsq_req_held(c->ereqs[p]);
    if (c->stream_held)
        return dsq__stream_when_admitted(c);
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
        return dsq__send_response(c, 200, r);
    }
}

/* A streamed request the adaptive policy holds back gets its
 * 200 only once admitted (dsq_req_held), so a refusal while it waits is a
 * 503 with Retry-After like one at submit, not an error event inside a
 * 200. After the submit, and again at each resume. */
enum MHD_Result dsq__stream_when_admitted(conn_t *c)
{
    for (;;) {
        uint64_t seen = dsq__waiter_seq(c->w);
        if (c->h->cfg.request_timeout_s > 0 && !c->cancelled &&
            dsq_clock_now_s() - c->t_start > c->h->cfg.request_timeout_s) {
            dsq__cancel_all(c);
            return dsq__send_error(c, DSQ_APIERR_TIMEOUT, NULL,
                                   "request ran past --request-timeout");
        }
        wait_result_t w = poll_progress(c);
        bool held = false;
        for (int p = 0; p < c->n_ereqs; p++)
            held |= c->ereqs[p] && !c->ereq_done[p] && dsq_req_held(c->ereqs[p]);
        if (w == W_GONE)
            return MHD_NO;
        if (w == W_STOPPING)
            return dsq__send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "server is shutting down");
        if (c->queue_timeout) {
            /* one prompt refused refuses the request: the others (a
             * prompt list) are cancelled, not computed for nothing */
            char rbuf[200];
            dsq__cancel_all(c);
            return dsq__send_error(c, DSQ_APIERR_OVERLOADED, NULL,
                                   refusal_msg(c, rbuf, sizeof(rbuf)));
        }
        if (w == W_DONE || !held)
            break;
        if (dsq__park(c, seen))
            return MHD_YES;      /* the access handler runs again on resume */
    }
    c->stream_held = false;
    return start_stream(c);
}

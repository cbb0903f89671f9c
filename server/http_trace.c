/* The OpenTelemetry spans of one finished request, queued to the OTLP
 * exporter (server/trace.h) from the request-completed callback. Every
 * time and count comes from what the request recorded while it ran (its
 * conn_t, the engine's dsq_req_timeline), so the spans are built once,
 * after the answer is out, and never on the request's way. */
#include "server/http_internal.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* The route's template for span names and http.route (NULL for
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
    case R_MESSAGES: return "/v1/messages";
    case R_COUNT_TOKENS: return "/v1/messages/count_tokens";
    case R_RESPONSES: return "/v1/responses";
    default: return NULL;
    }
}

/* The request's input as JSON text for gen_ai.input.messages
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

/* The spans of one finished request, queued to the exporter: the
 * HTTP server span, and under it, for each prompt the engine took, its
 * queue wait, each prefill chunk and the decode phase (engine.h
 * dsq_req_timeline). Attribute names from the OpenTelemetry semantic
 * conventions (HTTP server spans; GenAI: gen_ai.*), vLLM's
 * gen_ai.latency.* and dsq.* for what neither names. */
void dsq__trace_request(conn_t *c, struct MHD_Connection *mc, int st, double t_end)
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
    if (dsq__route_generates(c->route) && c->have_req) {
        const dsq_completion_req_t *q = &c->req;
        dsq_usage_t u;
        dsq__usage_of(c, &u);
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
            if (tl.n_draft_tokens > 0) {
                dsq_span_attr_int(s, "dsq.spec.draft_tokens", tl.n_draft_tokens);
                dsq_span_attr_int(s, "dsq.spec.accepted_tokens", tl.n_draft_accepted);
            }
            if (s)
                dsq_otlp_submit(x, s);
        }
    }
#undef NS
}

/* The routes that answer at once: /health, /v1/models and
 * /v1/models/{id}, /tokenizer_info, /version, /metrics, /tokenize and
 * /detokenize. Each reads only what never changes while the daemon serves
 * (configuration, tokenizer, chat template) or is safe from any thread
 * (engine and exporter stats), and none parks its connection; the
 * completions routes, which submit work and wait for it, are elsewhere. */
#include "server/http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsq_config.h"
#include "engine/common/error.h"

enum MHD_Result dsq__do_health(conn_t *c)
{
    if (!atomic_load(&c->h->engine))
        return dsq__send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "model is loading");
    if (atomic_load(&c->h->draining))
        return dsq__send_error(c, DSQ_APIERR_UNAVAILABLE, NULL, "server is draining");
    return dsq__send_body(c, 200, strdup("{\"status\":\"ok\"}"), "application/json");
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

enum MHD_Result dsq__do_models(conn_t *c)
{
    cJSON *o = cJSON_CreateObject(), *data;
    cJSON_AddStringToObject(o, "object", "list");
    data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_object(c));
    return dsq__send_json(c, 200, o);
}

/* GET /v1/models/{id} (the SDKs' models.retrieve): the model, or 404
 * model_not_found. The id is the rest of the path, percent-decoded by
 * libmicrohttpd; ids with '/' (e.g. "org/name") are kept whole. */
enum MHD_Result dsq__do_model(conn_t *c)
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
        return dsq__send_error(c, DSQ_APIERR_MODEL_NOT_FOUND, "model", msg);
    }
    return dsq__send_json(c, 200, model_object(c));
}

/* GET /tokenizer_info as vLLM serves it (lm-evaluation-harness's
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

enum MHD_Result dsq__do_tokenizer_info(conn_t *c)
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
    return dsq__send_json(c, 200, o);
}

enum MHD_Result dsq__do_version(conn_t *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", DSQ_VERSION);
    return dsq__send_json(c, 200, o);
}

enum MHD_Result dsq__do_metrics(conn_t *c)
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
    return dsq__send_body(c, 200, s, "text/plain; version=0.0.4; charset=utf-8");
}

unsigned dsq__tok_flags(const dsq_tokenizer_t *t, bool add_special)
{
    return DSQ_TOK_PARSE_SPECIAL |
           (add_special && dsq_tokenizer_add_bos(t) ? DSQ_TOK_ADD_BOS : 0u);
}

/* The token ids of a /tokenize-style body: with messages, the prompt
 * /v1/chat/completions would submit; else the prompt's. Returns 0 with
 * *ids (malloc'd) or the answer already sent in *ret. */
static int tokenize_body(conn_t *c, const char *body, size_t len, int32_t **ids,
                         size_t *n_ids, enum MHD_Result *ret)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = dsq__limits(c);
    dsq_tokenize_req_t q;
    char *prompt = NULL;
    size_t plen = 0;
    int rc;
    *ids = NULL;
    *n_ids = 0;
    if (dsq_openai_parse_tokenize_req(body, len, &lim, &q, &err)) {
        *ret = dsq__send_api_error(c, &err);
        return DSQ_EINVAL;
    }
    if (q.messages) {
        if (dsq_chat_render(c->h->chat, q.messages, q.tools,
                            q.add_generation_prompt, &prompt, &plen, &err)) {
            dsq_tokenize_req_deinit(&q);
            *ret = dsq__send_api_error(c, &err);
            return DSQ_EINVAL;
        }
        rc = dsq_chat_tokenize(c->h->chat, prompt, plen, q.add_special, ids, n_ids);
    } else {
        rc = dsq_tokenizer_encode(c->tok, q.prompt, q.prompt_len,
                                  dsq__tok_flags(c->tok, q.add_special), ids, n_ids);
    }
    dsq_tokenize_req_deinit(&q);
    free(prompt);
    if (rc)
        *ret = dsq__send_error(c, DSQ_APIERR_INTERNAL, NULL, "tokenizer failed");
    return rc;
}

enum MHD_Result dsq__do_tokenize(conn_t *c)
{
    size_t n_ids = 0;
    int32_t *ids = NULL;
    enum MHD_Result ret;
    cJSON *o, *arr;
    if (tokenize_body(c, c->body, c->body_len, &ids, &n_ids, &ret))
        return ret;
    o = cJSON_CreateObject();
    arr = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < n_ids; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "count", (double)n_ids);
    cJSON_AddNumberToObject(o, "max_model_len", dsq_engine_max_model_len(c->e));
    ret = dsq__send_json(c, 200, o);
    free(ids);
    return ret;
}

enum MHD_Result dsq__do_count_tokens(conn_t *c)
{
    dsq_api_error_t err;
    dsq_anthropic_req_t ar;
    size_t n_ids = 0;
    int32_t *ids = NULL;
    enum MHD_Result ret;
    cJSON *o;
    if (dsq_anthropic_to_chat(c->body, c->body_len, true, &ar, &err))
        return dsq__send_api_error(c, &err);
    int rc = tokenize_body(c, ar.chat_body, ar.chat_body_len, &ids, &n_ids, &ret);
    dsq_anthropic_req_deinit(&ar);
    if (rc)
        return ret;
    free(ids);
    o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", (double)n_ids);
    return dsq__send_json(c, 200, o);
}

enum MHD_Result dsq__do_detokenize(conn_t *c)
{
    dsq_api_error_t err;
    dsq_openai_limits_t lim = dsq__limits(c);
    int32_t *ids = NULL;
    int n_ids = 0;
    char *text = NULL, *clean;
    size_t len = 0;
    cJSON *o;
    if (dsq_openai_parse_detokenize(c->body, c->body_len, &lim, &ids, &n_ids,
                                    &err))
        return dsq__send_api_error(c, &err);
    if (dsq_tokenizer_decode(c->tok, ids, (size_t)n_ids, false, &text, &len)) {
        free(ids);
        return dsq__send_error(c, DSQ_APIERR_INVALID_REQUEST, "tokens",
                               "'tokens' holds an id outside the vocabulary");
    }
    free(ids);
    clean = dsq_openai_utf8_clean(text, len, NULL);
    free(text);
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", clean ? clean : "");
    free(clean);
    return dsq__send_json(c, 200, o);
}

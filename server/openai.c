/* OpenAI request bodies -> validated C structs: completions, chat
 * (messages, tools, structured outputs), /tokenize and /detokenize.
 * Validation is table-free but field-by-field in the order of the API
 * reference, each failure naming its field as `param`, so the unit tests
 * can walk the reference. Responses are built in openai_response.c. */
#include "server/openai.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/text/grammar.h"
#include "server/json.h"
#include "server/json_print.h"
#include "server/openai_internal.h"

/* ------------------------------------------------------------ helpers */

const char *dsq__json_type_name(const cJSON *v)
{
    if (!v) return "nothing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNumber(v)) return "number";
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsArray(v)) return "array";
    if (cJSON_IsObject(v)) return "object";
    return "invalid";
}

static bool is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
           v->valuedouble == floor(v->valuedouble) &&
           fabs(v->valuedouble) < 9.007199254740992e15;
}

/* What a value that is_int refused is, for the error message. */
static const char *non_int_name(const cJSON *v)
{
    if (!cJSON_IsNumber(v))
        return dsq__json_type_name(v);
    if (v->valuedouble != floor(v->valuedouble))
        return "a fraction";
    return "a number beyond +-2^53, where JSON numbers stop being exact integers";
}

/* Present and not null. */
static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNull(v) ? NULL : v;
}

/* Optional number in [lo, hi] (open ends when lo_open/hi_open). */
static int get_num(const cJSON *obj, const char *name, double lo, bool lo_open,
                   double hi, bool hi_open, double *out, dsq_api_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return DSQ_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, name,
                                 "'%s' must be a number, got %s", name,
                                 dsq__json_type_name(v));
    double x = v->valuedouble;
    if ((lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, name,
                                 "'%s' must be in %s%g, %g%s, got %g", name,
                                 lo_open ? "(" : "[", lo, hi,
                                 hi_open ? ")" : "]", x);
    *out = x;
    return DSQ_OK;
}

static int get_int(const cJSON *obj, const char *name, double lo, double hi,
                   int64_t *out, dsq_api_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return DSQ_OK;
    bool integral = cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!is_int(v) && !(integral && (v->valuedouble < lo || v->valuedouble > hi)))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, name,
                                 "'%s' must be an integer, got %s", name, non_int_name(v));
    if (v->valuedouble < lo || v->valuedouble > hi)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, name,
                                 "'%s' must be in [%.0f, %.0f], got %.*g",
                                 name, lo, hi, fabs(v->valuedouble) < 1e15 ? 17 : 3,
                                 v->valuedouble);
    *out = (int64_t)v->valuedouble;
    return DSQ_OK;
}

static int get_bool(const cJSON *obj, const char *name, bool *out,
                    dsq_api_error_t *err)
{
    const cJSON *v = field(obj, name);
    if (!v)
        return DSQ_OK;
    if (!cJSON_IsBool(v))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, name,
                                 "'%s' must be a boolean, got %s", name,
                                 dsq__json_type_name(v));
    *out = cJSON_IsTrue(v);
    return DSQ_OK;
}

/* True when s is valid UTF-8 (RFC 3629). */
static bool utf8_valid(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        bool ok;
        i += dsq__openai_utf8_seq((const unsigned char *)s + i, n - i, &ok);
        if (!ok)
            return false;
    }
    return true;
}

/* Does any string value or key in v hold invalid UTF-8? cJSON passes
 * raw bytes through (and decodes \u escapes to valid UTF-8, lone
 * surrogates aside, which it rejects), so this looks at every string once
 * after parsing. Depth is bounded by cJSON's nesting limit. */
static bool tree_has_bad_utf8(const cJSON *v)
{
    for (; v; v = v->next) {
        if (v->string && !utf8_valid(v->string))
            return true;
        if (cJSON_IsString(v) && v->valuestring && !utf8_valid(v->valuestring))
            return true;
        if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && tree_has_bad_utf8(v->child))
            return true;
    }
    return false;
}

/* 400 naming the top-level field whose value (or key) holds invalid
 * UTF-8. Returns true when one does (err set). */
static bool reject_bad_utf8(const cJSON *root, dsq_api_error_t *err)
{
    for (const cJSON *v = root->child; v; v = v->next) {
        bool key_bad = v->string && !utf8_valid(v->string);
        if (!key_bad && !(cJSON_IsString(v) && v->valuestring && !utf8_valid(v->valuestring)) &&
            !((cJSON_IsArray(v) || cJSON_IsObject(v)) && tree_has_bad_utf8(v->child)))
            continue;
        if (key_bad)
            dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, NULL,
                              "a field name is not valid UTF-8");
        else
            dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, v->string,
                              "'%s' holds a string that is not valid UTF-8",
                              v->string);
        return true;
    }
    return false;
}

/* 400 for a body the strict check refused. Bad UTF-8 still names the
 * top-level field that holds it (docs/api.md): jansson stops at the first
 * bad byte and all before it is valid JSON, so cJSON's tree of the same
 * body finds that string first. */
static void refuse_json(const char *body, size_t len, const dsq_json_error_t *je,
                        dsq_api_error_t *err)
{
    cJSON *root = NULL;
    const char *what = "";
    if (je->fault == DSQ_JSON_BAD_UTF8)
        root = cJSON_ParseWithLengthOpts(body, len, NULL, false);
    if (cJSON_IsObject(root) && reject_bad_utf8(root, err)) {
        size_t n = strlen(err->message);
        snprintf(err->message + n, sizeof(err->message) - n, " %s", je->where);
    } else {
        if (je->fault == DSQ_JSON_SYNTAX || je->fault == DSQ_JSON_BAD_UTF8)
            what = "request body is not valid JSON: ";
        else if (je->fault == DSQ_JSON_DUPLICATE_KEY)
            what = "request body has a ";
        dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, NULL, "%s%s", what,
                          je->message);
    }
    cJSON_Delete(root);
}

/* Every request body comes in here. First the strict check (server/json.h:
 * RFC 8259, no key twice, no U+0000), whose message names the byte and
 * line:column; then cJSON builds the tree the validators read. */
cJSON *dsq__openai_parse_object(const char *body, size_t len, dsq_api_error_t *err)
{
    const char *end = NULL;
    cJSON *root = NULL;
    dsq_json_error_t je;
    int rc = dsq_json_check(body, len, &je);
    if (rc == DSQ_ENOMEM) {
        dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    } else if (rc != DSQ_OK) {
        refuse_json(body, len, &je, err);
    } else if (!(root = cJSON_ParseWithLengthOpts(body, len, &end, false))) {
        /* the check took it, so cJSON's own limit refused it: nesting
         * deeper than CJSON_NESTING_LIMIT (or out of memory) */
        dsq_json_locate(body, len, end ? (size_t)(end - body) : 0, &je);
        dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, NULL,
                          "request body is not valid JSON: nested deeper than "
                          "%d levels %s", CJSON_NESTING_LIMIT, je.where);
    } else if (!cJSON_IsObject(root)) {
        dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, NULL,
                          "request body must be a JSON object, got %s",
                          dsq__json_type_name(root));
        cJSON_Delete(root);
        root = NULL;
    } else if (reject_bad_utf8(root, err)) {
        /* the check has read the UTF-8 already; this walk over what the
         * validators will read stays as a second line */
        cJSON_Delete(root);
        root = NULL;
    }
    return root;
}

static int check_model(const cJSON *root, const dsq_openai_limits_t *lim,
                       bool required, dsq_api_error_t *err)
{
    const cJSON *m = field(root, "model");
    if (!m) {
        if (!required)
            return DSQ_OK;
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "model",
                                 "'model' is required");
    }
    if (!cJSON_IsString(m))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "model",
                                 "'model' must be a string, got %s",
                                 dsq__json_type_name(m));
    if (lim->served_model_name && strcmp(m->valuestring, lim->served_model_name))
        return dsq_api_error_set(err, DSQ_APIERR_MODEL_NOT_FOUND, "model",
                                 "The model '%.200s' does not exist; this "
                                 "server serves '%.200s'",
                                 m->valuestring, lim->served_model_name);
    return DSQ_OK;
}

/* Token-id array -> malloc'd ids. allow_empty for detokenize. */
static int parse_ids(const cJSON *arr, const dsq_openai_limits_t *lim,
                     const char *param, bool allow_empty, int32_t **ids,
                     int *n_ids, dsq_api_error_t *err)
{
    int n = cJSON_GetArraySize(arr), i = 0;
    const cJSON *it;
    int32_t *v;
    if (n == 0 && !allow_empty)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                 "'%s' must not be an empty array", param);
    v = malloc(sizeof(*v) * (size_t)(n ? n : 1));
    if (!v)
        return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL,
                                 "out of memory");
    cJSON_ArrayForEach(it, arr) {
        if (!is_int(it) || it->valuedouble < 0 ||
            (lim->n_vocab > 0 && it->valuedouble >= lim->n_vocab) ||
            it->valuedouble > INT32_MAX) {
            free(v);
            if (!is_int(it))
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                         "'%s' must hold integer token ids, "
                                         "got %s", param, dsq__json_type_name(it));
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                     "token id %.0f in '%s' is out of the "
                                     "vocabulary [0, %d)", it->valuedouble,
                                     param, (int)lim->n_vocab);
        }
        v[i++] = (int32_t)it->valuedouble;
    }
    *ids = v;
    *n_ids = n;
    return DSQ_OK;
}

/* ------------------------------------------------------------ prompts */

static int parse_prompt(const cJSON *root, const dsq_openai_limits_t *lim,
                        dsq_completion_req_t *r, dsq_api_error_t *err)
{
    const cJSON *p = field(root, "prompt"), *it;
    int n = 0, rc = DSQ_OK;
    if (!p)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "prompt",
                                 "'prompt' is required");
    if (cJSON_IsString(p))
        n = 1;
    else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0)
        n = is_int(p->child) ? 1 : cJSON_GetArraySize(p);
    else
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "prompt",
                                 "'prompt' must be a string, an array of "
                                 "strings, an array of token ids or an array "
                                 "of token-id arrays (non-empty), got %s",
                                 cJSON_IsArray(p) ? "an empty array"
                                                  : dsq__json_type_name(p));
    if (n > DSQ_OPENAI_MAX_PROMPTS)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "prompt",
                                 "at most %d prompts per request, got %d",
                                 DSQ_OPENAI_MAX_PROMPTS, n);
    r->prompts = calloc((size_t)n, sizeof(*r->prompts));
    if (!r->prompts)
        return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    r->n_prompts = n;
    if (cJSON_IsString(p)) {
        r->prompts[0].text = strdup(p->valuestring);
        r->prompts[0].text_len = strlen(p->valuestring);
        if (!r->prompts[0].text)
            rc = dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        return rc;
    }
    if (n == 1 && is_int(p->child))
        return parse_ids(p, lim, "prompt", false, &r->prompts[0].ids,
                         &r->prompts[0].n_ids, err);
    /* array of strings, or array of id arrays: one kind throughout */
    bool strings = cJSON_IsString(p->child);
    int i = 0;
    cJSON_ArrayForEach(it, p) {
        dsq_prompt_t *q = &r->prompts[i++];
        if (strings && cJSON_IsString(it)) {
            q->text = strdup(it->valuestring);
            q->text_len = strlen(it->valuestring);
            if (!q->text)
                return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL,
                                         "out of memory");
        } else if (!strings && cJSON_IsArray(it)) {
            rc = parse_ids(it, lim, "prompt", false, &q->ids, &q->n_ids, err);
            if (rc)
                return rc;
        } else {
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "prompt",
                                     "'prompt' array elements must all be "
                                     "strings or all be token-id arrays, "
                                     "found %s", dsq__json_type_name(it));
        }
    }
    return DSQ_OK;
}

/* ------------------------------------------------------------ sampling */

static int parse_stop(const cJSON *root, dsq_completion_req_t *r,
                      dsq_api_error_t *err)
{
    const cJSON *s = field(root, "stop"), *it;
    int n, i = 0;
    if (!s)
        return DSQ_OK;
    if (cJSON_IsString(s))
        n = 1;
    else if (cJSON_IsArray(s))
        n = cJSON_GetArraySize(s);
    else
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "stop",
                                 "'stop' must be a string or an array of "
                                 "strings, got %s", dsq__json_type_name(s));
    if (n > DSQ_OPENAI_MAX_STOP)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "stop",
                                 "'stop' takes at most %d sequences, got %d",
                                 DSQ_OPENAI_MAX_STOP, n);
    if (n == 0)
        return DSQ_OK;
    r->stop = calloc((size_t)n, sizeof(*r->stop));
    if (!r->stop)
        return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    r->sp.n_stop = n;
    r->sp.stop = (const char *const *)r->stop;
    for (it = cJSON_IsString(s) ? s : s->child; it && i < n; it = it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "stop",
                                     "'stop' sequences must be non-empty "
                                     "strings, got %s",
                                     cJSON_IsString(it) ? "\"\"" : dsq__json_type_name(it));
        r->stop[i] = strdup(it->valuestring);
        if (!r->stop[i++])
            return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL,
                                     "out of memory");
        if (cJSON_IsString(s))
            break;
    }
    return DSQ_OK;
}

static int parse_logit_bias(const cJSON *root, const dsq_openai_limits_t *lim,
                            dsq_completion_req_t *r, dsq_api_error_t *err)
{
    const cJSON *b = field(root, "logit_bias"), *it;
    int n, i = 0;
    if (!b)
        return DSQ_OK;
    if (!cJSON_IsObject(b))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "logit_bias",
                                 "'logit_bias' must be an object mapping "
                                 "token ids to numbers, got %s", dsq__json_type_name(b));
    n = cJSON_GetArraySize(b);
    if (n == 0)
        return DSQ_OK;
    r->logit_bias_ids = malloc(sizeof(*r->logit_bias_ids) * (size_t)n);
    r->logit_bias = malloc(sizeof(*r->logit_bias) * (size_t)n);
    if (!r->logit_bias_ids || !r->logit_bias)
        return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    cJSON_ArrayForEach(it, b) {
        char *end = NULL;
        long id = strtol(it->string, &end, 10);
        if (!it->string[0] || *end || it->string[0] == '-' ||
            it->string[0] == '+' || it->string[0] == ' ' || id < 0 ||
            (lim->n_vocab > 0 && id >= lim->n_vocab) || id > INT32_MAX)
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                     "logit_bias",
                                     "'logit_bias' key '%.40s' is not a token "
                                     "id in [0, %d)", it->string,
                                     (int)lim->n_vocab);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
            it->valuedouble < -100 || it->valuedouble > 100)
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                     "logit_bias",
                                     "'logit_bias' values must be numbers in "
                                     "[-100, 100] (token %ld)", id);
        r->logit_bias_ids[i] = (int32_t)id;
        r->logit_bias[i++] = (float)it->valuedouble;
    }
    r->sp.n_logit_bias = n;
    r->sp.logit_bias_ids = r->logit_bias_ids;
    r->sp.logit_bias = r->logit_bias;
    return DSQ_OK;
}

/* ------------------------------------------------------------ chat */

/* "developer" is the OpenAI API's successor of "system" (o1 and
 * later); templates know only system, so it is renamed on the way in. */
static const char *const ROLES[] = {"system", "user", "assistant", "tool", "developer"};

/* One message's content, normalised for the template: a string stays, an
 * array of text parts becomes their texts joined by "\n" (as vLLM does for
 * string-content templates), null stays null (assistant turns that only
 * carry tool_calls). Returns a new item or NULL with err set. */
static cJSON *message_content(const cJSON *m, int i, const char *role,
                              dsq_api_error_t *err)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *it;
    char *joined = NULL;
    size_t n = 0;
    cJSON *out = NULL;
    if (!c || cJSON_IsNull(c)) {
        if (!strcmp(role, "assistant"))
            return cJSON_CreateNull();
        dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                          "'messages[%d].content' is required for role '%s'",
                          i, role);
        return NULL;
    }
    if (cJSON_IsString(c))
        return cJSON_CreateString(c->valuestring);
    if (!cJSON_IsArray(c)) {
        dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                          "'messages[%d].content' must be a string or an "
                          "array of text parts, got %s", i, dsq__json_type_name(c));
        return NULL;
    }
    joined = calloc(1, 1);
    cJSON_ArrayForEach(it, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(it, "text");
        size_t tl;
        char *q;
        if (!joined)
            break;
        if (!cJSON_IsObject(it) || !cJSON_IsString(ty) ||
            strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
            bool other = cJSON_IsObject(it) && cJSON_IsString(ty) &&
                         strcmp(ty->valuestring, "text");
            dsq_api_error_set(err, other ? DSQ_APIERR_UNSUPPORTED
                                         : DSQ_APIERR_INVALID_REQUEST,
                              "messages",
                              other ? "'messages[%d].content' part type "
                                      "'%.40s' is not supported (text only)"
                                    : "'messages[%d].content' parts must be "
                                      "{\"type\": \"text\", \"text\": string}%.0s",
                              i, other ? ty->valuestring : "");
            free(joined);
            return NULL;
        }
        tl = strlen(tx->valuestring);
        q = realloc(joined, n + tl + 2);
        if (!q) {
            free(joined);
            joined = NULL;
            break;
        }
        joined = q;
        if (n)
            joined[n++] = '\n';
        memcpy(joined + n, tx->valuestring, tl + 1);
        n += tl;
    }
    if (joined)
        out = cJSON_CreateString(joined);
    free(joined);
    if (!out)
        dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    return out;
}

/* The members that tie a tool result to its call, in OpenAI's shape: a
 * "tool" message's tool_call_id (a string when present), tool_calls (an array, or
 * null, of {"function": {"name": string, "arguments": string or
 * object}, ...}). The template reads them, so a malformed one would
 * otherwise be rendered wrong or dropped without a word. */
static int message_tool_fields(const cJSON *m, int i, dsq_api_error_t *err)
{
    /* Optional, as in vLLM and transformers' templates (which match
     * results to calls by order); present, it must be a string. */
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    if (id && !cJSON_IsString(id))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages[%d].tool_call_id' must be a string, got %s", i,
                                 dsq__json_type_name(id));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *c;
    if (!tc || cJSON_IsNull(tc))
        return DSQ_OK;
    if (!cJSON_IsArray(tc))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages[%d].tool_calls' must be an array, got %s", i,
                                 dsq__json_type_name(tc));
    int k = 0;
    cJSON_ArrayForEach(c, tc) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *ar = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(nm) ||
            (ar && !cJSON_IsString(ar) && !cJSON_IsObject(ar)))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                     "'messages[%d].tool_calls[%d]' must be {\"id\": ..., "
                                     "\"type\": \"function\", \"function\": {\"name\": "
                                     "string, \"arguments\": string}}", i, k);
        k++;
    }
    return DSQ_OK;
}

int dsq__openai_parse_messages(const cJSON *root, cJSON **messages,
                               cJSON **tools, dsq_api_error_t *err)
{
    const cJSON *ms = field(root, "messages"), *m, *t;
    int i = 0;
    *messages = *tools = NULL;
    if (!ms)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages' is required");
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "'messages' must be a non-empty array of "
                                 "message objects, got %s",
                                 cJSON_IsArray(ms) ? "an empty array"
                                                   : dsq__json_type_name(ms));
    if (!(*messages = cJSON_CreateArray()))
        return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    cJSON_ArrayForEach(m, ms) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *f;
        cJSON *copy, *content;
        bool known = false;
        if (!cJSON_IsObject(m)) {
            dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                              "'messages[%d]' must be an object, got %s", i,
                              dsq__json_type_name(m));
            goto fail;
        }
        for (size_t k = 0; cJSON_IsString(role) && k < sizeof(ROLES) / sizeof(ROLES[0]); k++)
            known = known || !strcmp(role->valuestring, ROLES[k]);
        if (!known) {
            dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                              "'messages[%d].role' must be one of system, "
                              "developer, user, assistant, tool; got %s%.40s%s", i,
                              cJSON_IsString(role) ? "'" : "",
                              cJSON_IsString(role) ? role->valuestring
                                                   : dsq__json_type_name(role),
                              cJSON_IsString(role) ? "'" : "");
            goto fail;
        }
        if (message_tool_fields(m, i, err))
            goto fail;
        if (!(content = message_content(m, i, role->valuestring, err)))
            goto fail;
        if (!(copy = cJSON_CreateObject())) {
            cJSON_Delete(content);
            dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
            goto fail;
        }
        cJSON_AddItemToArray(*messages, copy);
        /* other members (name, tool_calls, tool_call_id, ...) pass through
         * to the template unchanged */
        cJSON_ArrayForEach(f, m)
            if (strcmp(f->string, "content") && strcmp(f->string, "role"))
                cJSON_AddItemToObject(copy, f->string, cJSON_Duplicate(f, true));
        cJSON_AddStringToObject(copy, "role", strcmp(role->valuestring, "developer")
                                              ? role->valuestring : "system");
        cJSON_AddItemToObject(copy, "content", content);
        i++;
    }
    t = field(root, "tools");
    if (t) {
        if (!cJSON_IsArray(t)) {
            dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                              "'tools' must be an array, got %s", dsq__json_type_name(t));
            goto fail;
        }
        if (!(*tools = cJSON_Duplicate(t, true))) {
            dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
            goto fail;
        }
    }
    return DSQ_OK;
fail:
    cJSON_Delete(*messages);
    *messages = NULL;
    return DSQ_EINVAL;
}

/* max_completion_tokens (wins) / max_tokens, logprobs + top_logprobs. */
static int parse_chat_fields(const cJSON *root, dsq_completion_req_t *r,
                             dsq_api_error_t *err)
{
    int64_t iv = -1, mc = -1, top = -1;
    bool lp = false;
    int rc;
    if ((rc = get_int(root, "max_tokens", 1, 1 << 30, &iv, err)) ||
        (rc = get_int(root, "max_completion_tokens", 1, 1 << 30, &mc, err)) ||
        (rc = get_bool(root, "logprobs", &lp, err)) ||
        (rc = get_int(root, "top_logprobs", 0, DSQ_OPENAI_MAX_LOGPROBS, &top, err)))
        return rc;
    /* -1: until the context is full (filled in once the prompt is known) */
    r->sp.max_tokens = (int)(mc >= 0 ? mc : iv);
    if (top >= 0 && !lp)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                 "top_logprobs", "'top_logprobs' needs "
                                 "'logprobs': true");
    r->sp.logprobs = lp ? (int)(top >= 0 ? top : 0) : -1;
    /* a reasoning budget: thinking_budget (Qwen's and SGLang's name), or
     * none at all from chat_template_kwargs.enable_thinking false (vLLM's
     * switch; the other template kwargs are not read) */
    int64_t tb = -1;
    const cJSON *kw = field(root, "chat_template_kwargs");
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking");
    if ((rc = get_int(root, "thinking_budget", 0, 1 << 30, &tb, err)))
        return rc;
    if (kw && (!cJSON_IsObject(kw) || (et && !cJSON_IsBool(et))))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "chat_template_kwargs",
                                 "'chat_template_kwargs' must be an object whose "
                                 "enable_thinking is a boolean");
    if (cJSON_IsFalse(et) && tb < 0)
        tb = 0;
    r->think_budget = (int)tb;
    return DSQ_OK;
}

/* Constrained decoding: every field of the three APIs
 * that asks for it compiles into r->sp.grammar (engine/text/grammar.h):
 *  - GBNF text: llama.cpp's `grammar`, vLLM's `guided_grammar`,
 *    `structured_outputs.grammar`;
 *  - a list of strings: vLLM's `guided_choice`, `structured_outputs.choice`;
 *  - a JSON Schema: OpenAI's response_format {"type": "json_schema",
 *    "json_schema": {"schema": ...}}, llama.cpp's `json_schema` and
 *    response_format {"type": "json_object", "schema": ...}, vLLM's
 *    `guided_json` (an object or its JSON text), `structured_outputs.json`;
 *  - a regex: vLLM's `guided_regex`, `structured_outputs.regex`;
 *  - any JSON object: response_format {"type": "json_object"},
 *    `structured_outputs.json_object` true.
 * At most one per request. A constraint that does not compile, or a schema
 * keyword outside the supported subset, is a 400 naming the field and,
 * for schemas, the keyword and its JSON pointer. */
typedef enum so_kind { SO_GBNF, SO_CHOICE, SO_SCHEMA, SO_REGEX, SO_JSON_OBJECT } so_kind_t;

typedef struct so {
    const char *param;             /* the request field, for messages        */
    so_kind_t kind;
    const cJSON *v;
} so_t;

/* The constraint fields of root into so[] (at most 8); 400 for a
 * malformed response_format or structured_outputs. */
static int collect_structured(const cJSON *root, so_t *so, int *n, dsq_api_error_t *err)
{
    static const struct {
        const char *name;
        so_kind_t kind;
    } top[] = {{"grammar", SO_GBNF}, {"guided_grammar", SO_GBNF},
               {"guided_choice", SO_CHOICE}, {"guided_json", SO_SCHEMA},
               {"guided_regex", SO_REGEX}, {"json_schema", SO_SCHEMA}};
    *n = 0;
    for (size_t k = 0; k < sizeof(top) / sizeof(top[0]); k++) {
        const cJSON *v = field(root, top[k].name);
        if (v && !cJSON_IsNull(v))
            so[(*n)++] = (so_t){top[k].name, top[k].kind, v};
    }
    const cJSON *rf = field(root, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *ty = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type")
                                             : NULL;
        if (!cJSON_IsString(ty))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "response_format",
                                     "'response_format' must be an object with a string "
                                     "'type'");
        /* the members each type has (OpenAI's, and llama.cpp's schema
         * beside json_object): another one would be ignored, and may
         * have been meant to change the output */
        const char *own = !strcmp(ty->valuestring, "json_object") ? "schema"
                        : !strcmp(ty->valuestring, "json_schema") ? "json_schema" : NULL;
        bool known = own || !strcmp(ty->valuestring, "text");
        const cJSON *k;
        cJSON_ArrayForEach(k, rf) {
            if (!known || !strcmp(k->string, "type") || (own && !strcmp(k->string, own)))
                continue;
            bool other = !strcmp(k->string, "schema") || !strcmp(k->string, "json_schema");
            return dsq_api_error_set(err, other ? DSQ_APIERR_INVALID_REQUEST
                                                : DSQ_APIERR_UNSUPPORTED, "response_format",
                                     other ? "'response_format.%.40s' does not go with type "
                                             "'%s'"
                                           : "'response_format.%.40s' is not supported (type "
                                             "'%s' takes %s)",
                                     k->string, ty->valuestring,
                                     other ? "" : own ? (!strcmp(own, "schema") ? "'schema'"
                                                                                : "'json_schema'")
                                                      : "no other field");
        }
        const cJSON *sch = cJSON_GetObjectItemCaseSensitive(rf, "schema");
        if (!strcmp(ty->valuestring, "json_object")) {
            if (sch && !cJSON_IsNull(sch))   /* llama.cpp's form */
                so[(*n)++] = (so_t){"response_format.schema", SO_SCHEMA, sch};
            else
                so[(*n)++] = (so_t){"response_format", SO_JSON_OBJECT, rf};
        } else if (!strcmp(ty->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            sch = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
            /* OpenAI's members: name ^[a-zA-Z0-9_-]{1,64}$, description,
             * schema, strict (a boolean) */
            const cJSON *jk, *jsm = cJSON_IsObject(js) ? js : NULL;
            cJSON_ArrayForEach(jk, jsm) {
                bool ok = true;
                const char *want = "";
                if (!strcmp(jk->string, "name")) {
                    size_t nl = cJSON_IsString(jk)
                                    ? strspn(jk->valuestring, "abcdefghijklmnopqrstuvwxyz"
                                                              "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                              "0123456789_-")
                                    : 0;
                    ok = cJSON_IsString(jk) && nl > 0 && nl <= 64 && !jk->valuestring[nl];
                    want = "a string of 1 to 64 of a-z, A-Z, 0-9, '_' and '-'";
                } else if (!strcmp(jk->string, "strict")) {
                    ok = cJSON_IsBool(jk) || cJSON_IsNull(jk);
                    want = "a boolean";
                } else if (!strcmp(jk->string, "description")) {
                    ok = cJSON_IsString(jk) || cJSON_IsNull(jk);
                    want = "a string";
                } else if (strcmp(jk->string, "schema")) {
                    return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED,
                                             "response_format.json_schema",
                                             "'response_format.json_schema.%.40s' is not "
                                             "supported (name, description, schema, strict)",
                                             jk->string);
                }
                if (!ok) {
                    char param[64];
                    snprintf(param, sizeof(param), "response_format.json_schema.%s",
                             jk->string);
                    return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                             "'%s' must be %s", param, want);
                }
            }
            if (!sch || cJSON_IsNull(sch))
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "response_format",
                                         "'response_format' of type 'json_schema' needs "
                                         "'json_schema': {\"name\": ..., \"schema\": {...}}");
            so[(*n)++] = (so_t){"response_format.json_schema.schema", SO_SCHEMA, sch};
        } else if (strcmp(ty->valuestring, "text")) {
            return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "response_format",
                                     "'response_format' of type '%.40s' is not supported "
                                     "(\"text\", \"json_object\" or \"json_schema\")",
                                     ty->valuestring);
        }
    }
    const cJSON *st = field(root, "structured_outputs");
    if (st && !cJSON_IsNull(st)) {
        static const struct {
            const char *key, *param;
            so_kind_t kind;
        } sub[] = {{"json", "structured_outputs.json", SO_SCHEMA},
                   {"regex", "structured_outputs.regex", SO_REGEX},
                   {"choice", "structured_outputs.choice", SO_CHOICE},
                   {"grammar", "structured_outputs.grammar", SO_GBNF},
                   {"json_object", "structured_outputs.json_object", SO_JSON_OBJECT}};
        if (!cJSON_IsObject(st))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "structured_outputs",
                                     "'structured_outputs' must be an object, got %s",
                                     dsq__json_type_name(st));
        const cJSON *it;
        int before = *n;
        cJSON_ArrayForEach(it, st) {
            size_t k = 0;
            while (k < sizeof(sub) / sizeof(sub[0]) && strcmp(sub[k].key, it->string))
                k++;
            if (k == sizeof(sub) / sizeof(sub[0]))
                return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "structured_outputs",
                                         "'structured_outputs.%.40s' is not supported (json, "
                                         "regex, choice, grammar, json_object)", it->string);
            if (cJSON_IsNull(it) || (sub[k].kind == SO_JSON_OBJECT && cJSON_IsFalse(it)))
                continue;
            if (sub[k].kind == SO_JSON_OBJECT && !cJSON_IsTrue(it))
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, sub[k].param,
                                         "'%s' must be a boolean", sub[k].param);
            if (*n < 8)
                so[(*n)++] = (so_t){sub[k].param, sub[k].kind, it};
        }
        /* vLLM: "you must use one kind of structured outputs constraint" */
        if (*n == before)
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "structured_outputs",
                                     "'structured_outputs' names no constraint: give one of "
                                     "json, regex, choice, grammar, json_object: true");
    }
    /* vLLM's guided_whitespace_pattern changes which outputs are allowed
     * (the whitespace between a schema's tokens), so it is refused, not
     * ignored; guided_decoding_backend only picks vLLM's implementation
     * and is ignored */
    const cJSON *wp = field(root, "guided_whitespace_pattern");
    if (wp && !cJSON_IsNull(wp))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "guided_whitespace_pattern",
                                 "'guided_whitespace_pattern' is not supported (the grammar "
                                 "allows up to 16 whitespace characters between tokens)");
    return DSQ_OK;
}

static int parse_structured(const cJSON *root, dsq_completion_req_t *r, dsq_api_error_t *err)
{
    so_t so[8];
    int n = 0;
    int rc = collect_structured(root, so, &n, err);
    if (rc || n == 0)
        return rc;
    if (n > 1)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, so[1].param,
                                 "'%s' and '%s' both constrain the output; give one",
                                 so[0].param, so[1].param);
    const char *param = so[0].param;
    const cJSON *v = so[0].v;
    char msg[320] = "";
    char *gbnf = NULL;
    cJSON *parsed = NULL;
    switch (so[0].kind) {
    case SO_GBNF:
        if (!cJSON_IsString(v))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                     "'%s' must be a GBNF grammar string, got %s", param,
                                     dsq__json_type_name(v));
        rc = dsq_grammar_from_gbnf(v->valuestring, strlen(v->valuestring), NULL,
                                   &r->sp.grammar, msg, sizeof(msg));
        break;
    case SO_CHOICE: {
        int nc = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
        if (nc < 1 || nc > DSQ_GRAMMAR_MAX_STACKS)   /* one start stack each */
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                     "'%s' must be an array of 1 to %d strings", param,
                                     DSQ_GRAMMAR_MAX_STACKS);
        const char **c = calloc((size_t)nc, sizeof(*c));
        if (!c)
            return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            if (!cJSON_IsString(it)) {
                free(c);
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                         "'%s[%d]' must be a string, got %s", param, i,
                                         dsq__json_type_name(it));
            }
            c[i++] = it->valuestring;
        }
        rc = dsq_grammar_from_choices(c, nc, &r->sp.grammar, msg, sizeof(msg));
        free(c);
        break;
    }
    case SO_SCHEMA:
        if (cJSON_IsString(v)) {   /* vLLM takes the schema's JSON text too */
            /* the body's strict check again, for the text: a key twice
             * (which a validator would read as the last) or a \u0000
             * (where cJSON's C string would end) is refused, not cut */
            dsq_json_error_t je;
            size_t tl = strlen(v->valuestring);
            rc = dsq_json_check(v->valuestring, tl, &je);
            if (rc == DSQ_ENOMEM)
                return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
            if (rc || !(parsed = cJSON_ParseWithLength(v->valuestring, tl)))
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                         "'%s' is a string that is not JSON: %s", param,
                                         rc ? je.message : "nested too deep");
            v = parsed;
        }
        {
            char *text = dsq_json_print(v);   /* the engine parses it again */
            rc = text ? dsq_grammar_gbnf_from_json_schema(text, strlen(text), &gbnf, msg,
                                                          sizeof(msg))
                      : DSQ_ENOMEM;
            free(text);
        }
        break;
    case SO_REGEX:
        if (!cJSON_IsString(v))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, param,
                                     "'%s' must be a regular expression string, got %s", param,
                                     dsq__json_type_name(v));
        rc = dsq_grammar_gbnf_from_regex(v->valuestring, strlen(v->valuestring), &gbnf, msg,
                                         sizeof(msg));
        break;
    case SO_JSON_OBJECT:
        rc = dsq_grammar_builtin(DSQ_GRAMMAR_JSON_OBJECT, &r->sp.grammar, msg, sizeof(msg));
        break;
    }
    cJSON_Delete(parsed);
    if (!rc && gbnf)
        rc = dsq_grammar_from_gbnf(gbnf, strlen(gbnf), NULL, &r->sp.grammar, msg, sizeof(msg));
    free(gbnf);
    if (rc == DSQ_ENOMEM)
        return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    if (rc)
        return dsq_api_error_set(err, rc == DSQ_EUNSUPPORTED ? DSQ_APIERR_UNSUPPORTED
                                                             : DSQ_APIERR_INVALID_REQUEST,
                                 param, "'%s': %s", param, msg);
    return DSQ_OK;
}

/* Tools: they must have OpenAI's shape on either
 * route; tool_choice ("none", "auto", "required" or {"type": "function",
 * "function": {"name": ...}} naming one of the tools) and
 * parallel_tool_calls go into r (chat only: a completions request that
 * asks for calls is a 400). The legacy functions / function_call are
 * refused, not ignored. */
static int parse_tools(const cJSON *root, bool chat, dsq_completion_req_t *r,
                       dsq_api_error_t *err)
{
    const cJSON *v;
    const cJSON *tools = field(root, "tools"), *tc = field(root, "tool_choice");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                 "'tools' must be an array, got %s", dsq__json_type_name(tools));
    int ti = 0;
    const cJSON *tool_list = cJSON_IsArray(tools) ? tools : NULL;
    cJSON_ArrayForEach(v, tool_list) {
        /* OpenAI's shape: {"type": "function", "function": {"name": string, ...}} */
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(v, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(v, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsObject(v) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") ||
            !cJSON_IsObject(fn) || !cJSON_IsString(nm) || !nm->valuestring[0])
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                     "'tools[%d]' must be {\"type\": \"function\", "
                                     "\"function\": {\"name\": string, ...}}", ti);
        if (pa && !cJSON_IsNull(pa) && !cJSON_IsObject(pa))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                     "'tools[%d].function.parameters' must be a JSON Schema "
                                     "object", ti);
        /* arguments are a JSON object: OpenAI refuses a schema of another
         * type the same way */
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(pa, "type");
        if (pt && !(cJSON_IsString(pt) && !strcmp(pt->valuestring, "object")))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                     "'tools[%d].function.parameters' must be a JSON Schema "
                                     "of \"type\": \"object\" (the arguments are an "
                                     "object)", ti);
        /* without "type", these may admit other values, which a
         * constrained call would then be forced to write and the parser
         * refuse; OpenAI refuses them too. Untyped parameters with only
         * properties, required, ... are an object. */
        static const char *const decides[] = {"anyOf", "oneOf", "allOf", "$ref", "enum",
                                              "const"};
        for (size_t k = 0; !pt && cJSON_IsObject(pa) && k < sizeof(decides) / sizeof(*decides);
             k++)
            if (cJSON_HasObjectItem(pa, decides[k]))
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                         "'tools[%d].function.parameters' has '%s' and no "
                                         "\"type\": it must be a JSON Schema of \"type\": "
                                         "\"object\" (the arguments are an object)", ti,
                                         decides[k]);
        const cJSON *de = cJSON_GetObjectItemCaseSensitive(fn, "description");
        if (de && !cJSON_IsNull(de) && !cJSON_IsString(de))
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                     "'tools[%d].function.description' must be a string, "
                                     "got %s", ti, dsq__json_type_name(de));
        /* the name goes into the model's call syntax and back to the
         * client's dispatch: OpenAI's ^[a-zA-Z0-9_-]{1,64}$, and '.' */
        size_t nl = strspn(nm->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789_-.");
        if (nm->valuestring[nl] || nl > 64)
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                     "'tools[%d].function.name' must be 1 to 64 of a-z, A-Z, "
                                     "0-9, '_', '-' and '.'", ti);
        /* a call names its function: two of one name are ambiguous */
        const cJSON *w;
        int wi = 0;
        cJSON_ArrayForEach(w, tool_list) {
            if (w == v)
                break;
            const cJSON *n2 = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(w, "function"), "name");
            if (!strcmp(n2->valuestring, nm->valuestring))
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tools",
                                         "'tools[%d].function.name' '%s' is also the name of "
                                         "'tools[%d]'; function names must be unique", ti,
                                         nm->valuestring, wi);
            wi++;
        }
        ti++;
    }
    /* the legacy function-calling fields (OpenAI's deprecated functions /
     * function_call) ask for the same thing */
    const cJSON *fns = field(root, "functions"), *fc = field(root, "function_call");
    if (fns && !cJSON_IsNull(fns))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "functions",
                                 "the legacy 'functions' is not supported: use 'tools'");
    if (fc && !cJSON_IsNull(fc) &&
        !(cJSON_IsString(fc) && (!strcmp(fc->valuestring, "none") ||
                                 !strcmp(fc->valuestring, "auto"))))
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "function_call",
                                 "the legacy 'function_call' is not supported: use "
                                 "'tool_choice'");
    r->parallel_tool_calls = true;
    int rc = get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, err);
    if (rc)
        return rc;
    r->tool_choice = ti > 0 ? DSQ_TOOL_CHOICE_AUTO : DSQ_TOOL_CHOICE_NONE;
    if (tc && !cJSON_IsNull(tc)) {
        const cJSON *fn = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "function")
                                             : NULL;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *ty = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "type")
                                             : NULL;
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) {
            r->tool_choice = DSQ_TOOL_CHOICE_NONE;
        } else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto")) {
            r->tool_choice = ti > 0 ? DSQ_TOOL_CHOICE_AUTO : DSQ_TOOL_CHOICE_NONE;
        } else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")) {
            r->tool_choice = DSQ_TOOL_CHOICE_REQUIRED;
        } else if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "function") &&
                   cJSON_IsString(nm)) {
            bool found = false;
            cJSON_ArrayForEach(v, tool_list) {
                const cJSON *n2 = cJSON_GetObjectItemCaseSensitive(
                    cJSON_GetObjectItemCaseSensitive(v, "function"), "name");
                found |= !strcmp(n2->valuestring, nm->valuestring);
            }
            if (!found)
                return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tool_choice",
                                         "'tool_choice' names '%.80s', which is not in "
                                         "'tools'", nm->valuestring);
            if (!(r->tool_name = strdup(nm->valuestring)))
                return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
            r->tool_choice = DSQ_TOOL_CHOICE_NAMED;
        } else {
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tool_choice",
                                     "'tool_choice' must be \"none\", \"auto\", "
                                     "\"required\" or {\"type\": \"function\", "
                                     "\"function\": {\"name\": ...}}");
        }
        if (r->tool_choice >= DSQ_TOOL_CHOICE_REQUIRED && ti == 0)
            return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tool_choice",
                                     "'tool_choice' asks for a call but 'tools' is empty");
    }
    if (!chat && r->tool_choice != DSQ_TOOL_CHOICE_NONE)
        return dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "tools",
                                 "tool calls are for /v1/chat/completions; on completions "
                                 "'tools' needs 'tool_choice': \"none\"");
    if (r->tool_choice >= DSQ_TOOL_CHOICE_REQUIRED && r->sp.grammar)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tool_choice",
                                 "'tool_choice' %s and another constraint both constrain the "
                                 "output; give one",
                                 r->tool_choice == DSQ_TOOL_CHOICE_NAMED ? "naming a function"
                                                                         : "\"required\"");
    return DSQ_OK;
}

/* One parser for /v1/completions and /v1/chat/completions; the
 * chat request differs only in messages (for prompt), no echo/suffix/
 * best_of, max_completion_tokens, and boolean logprobs + top_logprobs. */
static int parse_request(const char *body, size_t len,
                         const dsq_openai_limits_t *lim, bool chat,
                         dsq_completion_req_t *out, dsq_api_error_t *err)
{
    int rc;
    int64_t iv;
    double dv;
    const cJSON *v;
    dsq_completion_req_t *r = out;
    cJSON *root;

    memset(r, 0, sizeof(*r));
    r->chat = chat;
    r->sp.max_tokens = 16;
    r->sp.temperature = 1.0f;
    r->sp.top_p = 1.0f;
    r->sp.top_k = 0;
    r->sp.min_p = 0.0f;
    r->sp.repetition_penalty = 1.0f;
    r->sp.logprobs = -1;
    r->sp.n = 1;
    r->think_budget = -1;
    root = dsq__openai_parse_object(body, len, err);
    if (!root)
        return DSQ_EINVAL;

    if ((rc = check_model(root, lim, true, err)))
        goto fail;
    if ((rc = parse_structured(root, r, err)))
        goto fail;
    if ((rc = parse_tools(root, chat, r, err)))
        goto fail;
    if (chat) {
        if ((rc = dsq__openai_parse_messages(root, &r->messages, &r->tools, err)))
            goto fail;
        if ((rc = parse_chat_fields(root, r, err)))
            goto fail;
        goto sampling;
    }
    if ((rc = parse_prompt(root, lim, r, err)))
        goto fail;
    v = field(root, "suffix");
    if (v && !(cJSON_IsString(v) && !v->valuestring[0])) {
        rc = dsq_api_error_set(err, DSQ_APIERR_UNSUPPORTED, "suffix",
                               "'suffix' (insertion) is not supported");
        goto fail;
    }
    if ((rc = get_bool(root, "echo", &r->echo, err)))
        goto fail;
    iv = -1;
    if ((rc = get_int(root, "max_tokens", 0, 1 << 30, &iv, err)))
        goto fail;
    if (iv >= 0)
        r->sp.max_tokens = (int)iv;
    if (r->sp.max_tokens == 0 && !r->echo) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "max_tokens",
                               "'max_tokens' must be at least 1 (0 is only "
                               "allowed with echo)");
        goto fail;
    }
sampling:
    dv = 1.0;
    if ((rc = get_num(root, "temperature", 0, false, 2, false, &dv, err)))
        goto fail;
    /* Below 1e-5 means greedy, as in vLLM (_SAMPLING_EPS): the sampler
     * divides by the float temperature, and 1/t overflows to inf below
     * ~3e-39 (NaN probabilities, a garbage token every step). */
    r->sp.temperature = dv < 1e-5 ? 0.0f : (float)dv;
    dv = 1.0;
    if ((rc = get_num(root, "top_p", 0, true, 1, false, &dv, err)))
        goto fail;
    /* a top_p that rounds to 0.0f (accepted above as > 0) keeps the
     * top token, as any tiny top_p does */
    r->sp.top_p = (float)dv > 0 ? (float)dv : FLT_TRUE_MIN;
    iv = -1;
    if ((rc = get_int(root, "top_k", -1, 1 << 30, &iv, err)))
        goto fail;
    r->sp.top_k = iv <= 0 ? 0 : (int)iv;
    dv = 0.0;
    if ((rc = get_num(root, "min_p", 0, false, 1, false, &dv, err)))
        goto fail;
    r->sp.min_p = (float)dv;
    dv = 0.0;
    if ((rc = get_num(root, "presence_penalty", -2, false, 2, false, &dv, err)))
        goto fail;
    r->sp.presence_penalty = (float)dv;
    dv = 0.0;
    if ((rc = get_num(root, "frequency_penalty", -2, false, 2, false, &dv, err)))
        goto fail;
    r->sp.frequency_penalty = (float)dv;
    dv = 1.0;
    if ((rc = get_num(root, "repetition_penalty", 0, true, 2, false, &dv, err)))
        goto fail;
    /* Keep logit / penalty finite (an inf logit makes NaN probabilities)
     * and non-zero (0 turns the penalty off): below 1e-30 every
     * repeated token is already favoured without bound. */
    r->sp.repetition_penalty = dv < 1e-30 ? 1e-30f : (float)dv;
    iv = 1;
    if ((rc = get_int(root, "n", 1, DSQ_OPENAI_MAX_N, &iv, err)))
        goto fail;
    r->sp.n = (int)iv;
    iv = r->sp.n;
    if (chat)
        goto seed;
    if ((rc = get_int(root, "best_of", 1, DSQ_OPENAI_MAX_N, &iv, err)))
        goto fail;
    if (iv < r->sp.n) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "best_of",
                               "'best_of' (%d) must be >= 'n' (%d)", (int)iv,
                               r->sp.n);
        goto fail;
    }
seed:
    r->best_of = (int)iv;
    r->sp.best_of = (int)iv;
    {
        /* cap on the sequences one request creates */
        int max_seqs = lim->max_seqs > 0 ? lim->max_seqs : DSQ_OPENAI_MAX_SEQS;
        int64_t seqs = (int64_t)(r->n_prompts > 0 ? r->n_prompts : 1) * iv;
        if (seqs > max_seqs) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                   iv > r->sp.n ? "best_of" : "n",
                                   "this request would create %lld sequences "
                                   "(%d prompts x %s %d); the limit is %d",
                                   (long long)seqs,
                                   r->n_prompts > 0 ? r->n_prompts : 1,
                                   iv > r->sp.n ? "best_of" : "n", (int)iv,
                                   max_seqs);
            goto fail;
        }
    }
    v = field(root, "seed");
    if (v) {
        if (!is_int(v)) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "seed",
                                   "'seed' must be an integer, got %s", non_int_name(v));
            goto fail;
        }
        r->sp.has_seed = true;
        r->sp.seed = (uint64_t)(int64_t)v->valuedouble;
    }
    iv = -1;
    if (!chat && (rc = get_int(root, "logprobs", 0, DSQ_OPENAI_MAX_LOGPROBS, &iv, err)))
        goto fail;
    if (!chat)
        r->sp.logprobs = (int)iv;
    /* echo + logprobs scores the prompt too (OpenAI legacy format) */
    r->sp.prompt_logprobs = r->echo && r->sp.logprobs >= 0;
    if ((rc = parse_stop(root, r, err)))
        goto fail;
    v = field(root, "stop_token_ids");
    if (v) {
        if (!cJSON_IsArray(v)) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                   "stop_token_ids",
                                   "'stop_token_ids' must be an array of "
                                   "token ids, got %s", dsq__json_type_name(v));
            goto fail;
        }
        if ((rc = parse_ids(v, lim, "stop_token_ids", true, &r->stop_token_ids,
                            &r->sp.n_stop_token_ids, err)))
            goto fail;
        r->sp.stop_token_ids = r->stop_token_ids;
    }
    if ((rc = parse_logit_bias(root, lim, r, err)))
        goto fail;
    if ((rc = get_bool(root, "ignore_eos", &r->sp.ignore_eos, err)))
        goto fail;
    {
        /* speculative decoding opt-out (dsqd --speculative-ngram) */
        bool spec = true;
        if ((rc = get_bool(root, "speculative", &spec, err)))
            goto fail;
        r->sp.no_speculation = !spec;
    }
    if ((rc = get_bool(root, "stream", &r->stream, err)))
        goto fail;
    if (r->stream && r->best_of > r->sp.n) {
        /* as OpenAI: candidates are ranked after they all ended */
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "best_of",
                               "'best_of' > 'n' cannot be streamed");
        goto fail;
    }
    v = field(root, "stream_options");
    if (v) {
        if (!cJSON_IsObject(v)) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                   "stream_options",
                                   "'stream_options' must be an object, got %s",
                                   dsq__json_type_name(v));
            goto fail;
        }
        if (!r->stream) {
            rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST,
                                   "stream_options",
                                   "'stream_options' is only allowed when "
                                   "'stream' is true");
            goto fail;
        }
        if ((rc = get_bool(v, "include_usage", &r->include_usage, err))) {
            snprintf(err->param, sizeof(err->param), "stream_options");
            goto fail;
        }
    }
    v = field(root, "user");
    if (v && !cJSON_IsString(v)) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "user",
                               "'user' must be a string, got %s", dsq__json_type_name(v));
        goto fail;
    }
    v = field(root, "model");
    r->model = strdup(v->valuestring);
    if (!r->model) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
        goto fail;
    }
    cJSON_Delete(root);
    return DSQ_OK;
fail:
    cJSON_Delete(root);
    dsq_completion_req_deinit(r);
    return DSQ_EINVAL;
}

int dsq_openai_parse_completion(const char *body, size_t len,
                                const dsq_openai_limits_t *lim,
                                dsq_completion_req_t *out,
                                dsq_api_error_t *err)
{
    return parse_request(body, len, lim, false, out, err);
}

int dsq_openai_parse_chat(const char *body, size_t len,
                          const dsq_openai_limits_t *lim,
                          dsq_completion_req_t *out, dsq_api_error_t *err)
{
    return parse_request(body, len, lim, true, out, err);
}

void dsq_completion_req_deinit(dsq_completion_req_t *r)
{
    if (!r)
        return;
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    free(r->tool_name);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (int i = 0; r->stop && i < r->sp.n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->logit_bias_ids);
    free(r->logit_bias);
    free(r->think_ids);
    free(r->model);
    dsq_grammar_free(r->sp.grammar);
    memset(r, 0, sizeof(*r));
}

int dsq_openai_check_context(int n_prompt, int max_tokens, int max_model_len,
                             dsq_api_error_t *err)
{
    if ((int64_t)n_prompt + max_tokens <= max_model_len)
        return DSQ_OK;
    dsq_api_error_set(err, DSQ_APIERR_CONTEXT_LENGTH, n_prompt >= max_model_len
                      ? "prompt" : "max_tokens",
                      "This model's maximum context length is %d tokens. "
                      "However, you requested %lld tokens (%d in the prompt, "
                      "%d for the completion). Please reduce the prompt or "
                      "max_tokens.", max_model_len,
                      (long long)n_prompt + max_tokens, n_prompt, max_tokens);
    return DSQ_ERANGE;
}

/* ------------------------------------------------------------ /tokenize */

int dsq_openai_parse_tokenize(const char *body, size_t len,
                              const dsq_openai_limits_t *lim, char **prompt,
                              size_t *prompt_len, bool *add_special,
                              dsq_api_error_t *err)
{
    int rc;
    const cJSON *p;
    cJSON *root = dsq__openai_parse_object(body, len, err);
    *prompt = NULL;
    *add_special = true;
    if (!root)
        return DSQ_EINVAL;
    if ((rc = check_model(root, lim, false, err)))
        goto done;
    if ((rc = get_bool(root, "add_special_tokens", add_special, err)))
        goto done;
    p = field(root, "prompt");
    if (!cJSON_IsString(p)) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "prompt",
                               "'prompt' must be a string, got %s",
                               p ? dsq__json_type_name(p) : "nothing");
        goto done;
    }
    *prompt = strdup(p->valuestring);
    *prompt_len = strlen(p->valuestring);
    if (!*prompt)
        rc = dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
done:
    cJSON_Delete(root);
    return rc ? DSQ_EINVAL : DSQ_OK;
}

int dsq_openai_parse_detokenize(const char *body, size_t len,
                                const dsq_openai_limits_t *lim,
                                int32_t **ids, int *n_ids,
                                dsq_api_error_t *err)
{
    int rc;
    const cJSON *t;
    cJSON *root = dsq__openai_parse_object(body, len, err);
    *ids = NULL;
    *n_ids = 0;
    if (!root)
        return DSQ_EINVAL;
    if ((rc = check_model(root, lim, false, err)))
        goto done;
    t = field(root, "tokens");
    if (!cJSON_IsArray(t)) {
        rc = dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "tokens",
                               "'tokens' must be an array of token ids, got %s",
                               t ? dsq__json_type_name(t) : "nothing");
        goto done;
    }
    rc = parse_ids(t, lim, "tokens", true, ids, n_ids, err);
done:
    cJSON_Delete(root);
    return rc ? DSQ_EINVAL : DSQ_OK;
}

int dsq_openai_parse_tokenize_req(const char *body, size_t len,
                                  const dsq_openai_limits_t *lim,
                                  dsq_tokenize_req_t *out,
                                  dsq_api_error_t *err)
{
    int rc;
    cJSON *root = dsq__openai_parse_object(body, len, err);
    memset(out, 0, sizeof(*out));
    out->add_special = true;
    out->add_generation_prompt = true;
    if (!root)
        return DSQ_EINVAL;
    if ((rc = check_model(root, lim, false, err)) ||
        (rc = get_bool(root, "add_special_tokens", &out->add_special, err)))
        goto done;
    if (field(root, "messages")) {
        if ((rc = get_bool(root, "add_generation_prompt",
                           &out->add_generation_prompt, err)))
            goto done;
        rc = dsq__openai_parse_messages(root, &out->messages, &out->tools, err);
        goto done;
    }
    cJSON_Delete(root);
    root = NULL;
    rc = dsq_openai_parse_tokenize(body, len, lim, &out->prompt,
                                   &out->prompt_len, &out->add_special, err);
done:
    cJSON_Delete(root);
    if (rc)
        dsq_tokenize_req_deinit(out);
    return rc ? DSQ_EINVAL : DSQ_OK;
}

void dsq_tokenize_req_deinit(dsq_tokenize_req_t *r)
{
    if (!r)
        return;
    free(r->prompt);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    memset(r, 0, sizeof(*r));
}

/* tests for server/openai.c, server/openai_response.c and server/error.c:
 * every completions field, its bad types and ranges -> status, param and
 * code as the OpenAI API reference (and vLLM where OpenAI is silent)
 * prescribe; the response and SSE builders; the error object shape.
 * Expected values are written out by hand from the API reference, not
 * produced by the code under test. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/common/error.h"
#include "engine/text/grammar.h"
#include "server/error.h"
#include "server/openai.h"

static const dsq_openai_limits_t LIM = {"smol", 1000, 0};

typedef struct bad_case {
    const char *body;
    int status;
    const char *param;     /* NULL = JSON null */
    const char *code;      /* NULL = JSON null */
} bad_case_t;

#define M "\"model\":\"smol\","
static const bad_case_t bad[] = {
    /* body shape */
    {"", 400, NULL, NULL},
    {"{", 400, NULL, NULL},
    {"[1,2]", 400, NULL, NULL},
    {"\"x\"", 400, NULL, NULL},
    {"{\"model\":\"smol\",\"prompt\":\"a\"} trailing", 400, NULL, NULL},
    /* model */
    {"{\"prompt\":\"a\"}", 400, "model", NULL},
    {"{\"model\":5,\"prompt\":\"a\"}", 400, "model", NULL},
    {"{\"model\":\"gpt-4\",\"prompt\":\"a\"}", 404, "model", "model_not_found"},
    /* users: a constraint outside what is built (schema keywords, regex
     * features, tools) is refused, not ignored; a grammar that does not
     * compile is a 400 naming it */
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}",
     400, "response_format", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"schema\":{\"not\":{}}}}}", 400, "response_format.json_schema.schema",
     "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"xml\"}}", 400, "response_format",
     "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"response_format\":\"json\"}", 400, "response_format", NULL},
    /* members of response_format that would be ignored, or malformed */
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":5,\"schema\":{}}}}", 400, "response_format.json_schema.name", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"a b\",\"schema\":{}}}}", 400, "response_format.json_schema.name", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"\",\"schema\":{}}}}", 400, "response_format.json_schema.name", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"" "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" "\","
     "\"schema\":{}}}}", 400, "response_format.json_schema.name", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"n\",\"strict\":\"yes\",\"schema\":{}}}}", 400,
     "response_format.json_schema.strict", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"n\",\"description\":1,\"schema\":{}}}}", 400,
     "response_format.json_schema.description", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"n\",\"schema\":{},\"schemaa\":{}}}}", 400, "response_format.json_schema",
     "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\",\"foo\":1}}", 400,
     "response_format", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"schema\":{}},\"strict\":true}}", 400, "response_format", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"text\",\"json_schema\":"
     "{\"schema\":{\"type\":\"integer\"}}}}", 400, "response_format", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"text\",\"schema\":{}}}", 400,
     "response_format", NULL},
    {"{" M "\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\",\"json_schema\":"
     "{\"schema\":{}}}}", 400, "response_format", NULL},
    /* vLLM's whitespace pattern changes the language: refused */
    {"{" M "\"prompt\":\"a\",\"guided_json\":{},\"guided_whitespace_pattern\":\" *\"}", 400,
     "guided_whitespace_pattern", "unsupported_parameter"},
    /* structured_outputs names no constraint */
    {"{" M "\"prompt\":\"a\",\"structured_outputs\":{}}", 400, "structured_outputs", NULL},
    {"{" M "\"prompt\":\"a\",\"structured_outputs\":{\"json\":null}}", 400,
     "structured_outputs", NULL},
    {"{" M "\"prompt\":\"a\",\"structured_outputs\":{\"json_object\":false}}", 400,
     "structured_outputs", NULL},
    /* JSON Schema's unique items; a required name additionalProperties
     * forbids (no instance is valid) */
    {"{" M "\"prompt\":\"a\",\"guided_json\":{\"type\":[\"string\",\"string\"]}}", 400,
     "guided_json", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":{}},"
     "\"required\":[\"a\",\"a\"]}}", 400, "guided_json", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_json\":{\"type\":\"object\",\"required\":[\"zz\"],"
     "\"additionalProperties\":false}}", 400, "guided_json", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_regex\":\"(?P<x>a)(?P<x>b)\"}", 400, "guided_regex", NULL},
    {"{" M "\"prompt\":\"a\",\"grammar\":\"root ::= \\\"a\\\" \\\"\\\\x00\\\" \\\"b\\\"\"}",
     400, "grammar", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"grammar\":\"root ::= [\\\\x00]\"}", 400, "grammar",
     "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"guided_json\":{\"type\":\"array\",\"uniqueItems\":true}}", 400,
     "guided_json", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"guided_json\":\"{not json\"}", 400, "guided_json", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_json\":{\"type\":\"strng\"}}", 400, "guided_json", NULL},
    /* the schema as text gets the body's strict check: a \u0000 (where
     * the C string would end and cut the schema) or a key twice */
    {"{" M "\"prompt\":\"a\",\"guided_json\":\"{\\\"const\\\":\\\"a\\\\u0000b\\\"}\"}", 400,
     "guided_json", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_json\":\"{\\\"type\\\":\\\"string\\\",\\\"type\\\":"
     "\\\"integer\\\"}\"}", 400, "guided_json", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_regex\":\"a\\\\x00b\"}", 400, "guided_regex",
     "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"guided_regex\":\"(a)\\\\1\"}", 400, "guided_regex",
     "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"guided_regex\":\"(a\"}", 400, "guided_regex", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_regex\":7}", 400, "guided_regex", NULL},
    {"{" M "\"prompt\":\"a\",\"json_schema\":{\"type\":\"string\",\"format\":\"hostname\"}}", 400,
     "json_schema", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"a\",\"json\":{}}}", 400,
     "structured_outputs.json", NULL},
    {"{" M "\"prompt\":\"a\",\"structured_outputs\":{\"structural_tag\":\"x\"}}", 400,
     "structured_outputs", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"structured_outputs\":[1]}", 400, "structured_outputs", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_regex\":\"a\",\"json_schema\":{}}", 400, "json_schema",
     NULL},
    {"{" M "\"prompt\":\"a\",\"guided_choice\":[]}", 400, "guided_choice", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_choice\":[\"a\",\"\"]}", 400, "guided_choice", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_choice\":[\"a\",3]}", 400, "guided_choice", NULL},
    {"{" M "\"prompt\":\"a\",\"guided_grammar\":\"x\"}", 400, "guided_grammar", NULL},
    {"{" M "\"prompt\":\"a\",\"grammar\":\"root ::= x\"}", 400, "grammar", NULL},
    {"{" M "\"prompt\":\"a\",\"grammar\":5}", 400, "grammar", NULL},
    {"{" M "\"prompt\":\"a\",\"grammar\":\"root ::= \\\"a\\\"\",\"guided_choice\":[\"a\"]}", 400,
     "guided_choice", NULL},
    /* tools of the wrong shape, on /v1/completions too; legacy functions */
    {"{" M "\"prompt\":\"a\",\"tools\":\"x\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":{}}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[1],\"tool_choice\":\"none\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
     400, "tools", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"tools\":[{}],\"tool_choice\":\"none\"}", 400, "tools", NULL},
    /* a name the call syntax could not carry; arguments that are not an
     * object */
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"a</tool_call>\"}}],\"tool_choice\":\"none\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"a\\nb\"}}],\"tool_choice\":\"none\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":{\"type\":\"string\"}}}],\"tool_choice\":\"none\"}", 400, "tools",
     NULL},
    /* parameters without "type" but with a keyword that may admit other
     * values than an object: a constrained call would be forced into
     * arguments the parser then refuses (OpenAI refuses them too) */
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":{\"anyOf\":[{\"type\":\"string\"}]}}}],\"tool_choice\":\"none\"}",
     400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":{\"oneOf\":[{\"type\":\"object\"}]}}}],\"tool_choice\":\"none\"}",
     400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":{\"enum\":[1]}}}],\"tool_choice\":\"none\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":{\"const\":\"x\"}}}],\"tool_choice\":\"none\"}", 400, "tools",
     NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{}}}}}],"
     "\"tool_choice\":\"none\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"parameters\":{\"allOf\":[{}]}}}],\"tool_choice\":\"none\"}", 400, "tools",
     NULL},
    /* two functions of one name; a description that is not a string */
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":"
     "\"none\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
     "\"f\",\"description\":5}}],\"tool_choice\":\"none\"}", 400, "tools", NULL},
    {"{" M "\"prompt\":\"a\",\"functions\":[{\"name\":\"f\"}]}", 400, "functions",
     "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"functions\":[]}", 400, "functions", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"function_call\":{\"name\":\"f\"}}", 400, "function_call",
     "unsupported_parameter"},
    /* prompt */
    {"{" M "\"max_tokens\":1}", 400, "prompt", NULL},
    {"{" M "\"prompt\":5}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":{}}", 400, "prompt", NULL},
    {"{" M "\"prompt\":true}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[1,\"a\"]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[\"a\",1]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[\"a\",[1]]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[[1],[]]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[[1],\"a\"]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[1.5]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[-1]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[1000]}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[[3,1000]]}", 400, "prompt", NULL},
    /* suffix */
    {"{" M "\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix", "unsupported_parameter"},
    {"{" M "\"prompt\":\"a\",\"suffix\":3}", 400, "suffix", "unsupported_parameter"},
    /* max_tokens */
    {"{" M "\"prompt\":\"a\",\"max_tokens\":\"5\"}", 400, "max_tokens", NULL},
    {"{" M "\"prompt\":\"a\",\"max_tokens\":1.5}", 400, "max_tokens", NULL},
    {"{" M "\"prompt\":\"a\",\"max_tokens\":-1}", 400, "max_tokens", NULL},
    {"{" M "\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", NULL},
    {"{" M "\"prompt\":\"a\",\"max_tokens\":true}", 400, "max_tokens", NULL},
    /* temperature [0, 2] */
    {"{" M "\"prompt\":\"a\",\"temperature\":-0.1}", 400, "temperature", NULL},
    {"{" M "\"prompt\":\"a\",\"temperature\":2.01}", 400, "temperature", NULL},
    {"{" M "\"prompt\":\"a\",\"temperature\":\"hot\"}", 400, "temperature", NULL},
    /* top_p (0, 1] */
    {"{" M "\"prompt\":\"a\",\"top_p\":0}", 400, "top_p", NULL},
    {"{" M "\"prompt\":\"a\",\"top_p\":1.1}", 400, "top_p", NULL},
    {"{" M "\"prompt\":\"a\",\"top_p\":[1]}", 400, "top_p", NULL},
    /* top_k: -1, 0 (off) or >= 1 */
    {"{" M "\"prompt\":\"a\",\"top_k\":-2}", 400, "top_k", NULL},
    {"{" M "\"prompt\":\"a\",\"top_k\":2.5}", 400, "top_k", NULL},
    {"{" M "\"prompt\":\"a\",\"top_k\":\"5\"}", 400, "top_k", NULL},
    /* min_p [0, 1] */
    {"{" M "\"prompt\":\"a\",\"min_p\":-0.01}", 400, "min_p", NULL},
    {"{" M "\"prompt\":\"a\",\"min_p\":1.01}", 400, "min_p", NULL},
    /* penalties */
    {"{" M "\"prompt\":\"a\",\"presence_penalty\":2.5}", 400, "presence_penalty", NULL},
    {"{" M "\"prompt\":\"a\",\"presence_penalty\":-2.5}", 400, "presence_penalty", NULL},
    {"{" M "\"prompt\":\"a\",\"frequency_penalty\":3}", 400, "frequency_penalty", NULL},
    {"{" M "\"prompt\":\"a\",\"frequency_penalty\":\"x\"}", 400, "frequency_penalty", NULL},
    {"{" M "\"prompt\":\"a\",\"repetition_penalty\":0}", 400, "repetition_penalty", NULL},
    {"{" M "\"prompt\":\"a\",\"repetition_penalty\":-1}", 400, "repetition_penalty", NULL},
    /* n, best_of */
    {"{" M "\"prompt\":\"a\",\"n\":0}", 400, "n", NULL},
    {"{" M "\"prompt\":\"a\",\"n\":129}", 400, "n", NULL},
    {"{" M "\"prompt\":\"a\",\"n\":1.5}", 400, "n", NULL},
    {"{" M "\"prompt\":\"a\",\"n\":3,\"best_of\":2}", 400, "best_of", NULL},
    /* api: best_of > n cannot stream (OpenAI) */
    {"{" M "\"prompt\":\"a\",\"n\":1,\"best_of\":2,\"stream\":true}", 400, "best_of", NULL},
    {"{" M "\"prompt\":\"a\",\"best_of\":129}", 400, "best_of", NULL},
    /* api: prompts x max(n, best_of) > DSQ_OPENAI_MAX_SEQS (128): 9 x 128, 2 x 65 */
    {"{" M "\"prompt\":[\"a\",\"a\"],\"n\":65}", 400, "n", NULL},
    {"{" M "\"prompt\":[\"a\",\"a\"],\"best_of\":65}", 400, "best_of", NULL},
    {"{" M "\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"],\"n\":128}", 400, "n", NULL},
    {"{" M "\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"],\"n\":2,\"best_of\":128}", 400, "best_of", NULL},
    {"{" M "\"prompt\":\"a\",\"best_of\":\"2\"}", 400, "best_of", NULL},
    /* seed */
    {"{" M "\"prompt\":\"a\",\"seed\":1.5}", 400, "seed", NULL},
    {"{" M "\"prompt\":\"a\",\"seed\":\"1\"}", 400, "seed", NULL},
    /* logprobs 0..20 */
    {"{" M "\"prompt\":\"a\",\"logprobs\":21}", 400, "logprobs", NULL},
    {"{" M "\"prompt\":\"a\",\"logprobs\":-1}", 400, "logprobs", NULL},
    {"{" M "\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs", NULL},
    /* echo */
    {"{" M "\"prompt\":\"a\",\"echo\":1}", 400, "echo", NULL},
    /* stop: string or <= 4 non-empty strings */
    {"{" M "\"prompt\":\"a\",\"stop\":5}", 400, "stop", NULL},
    {"{" M "\"prompt\":\"a\",\"stop\":[\"a\",5]}", 400, "stop", NULL},
    {"{" M "\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", NULL},
    {"{" M "\"prompt\":\"a\",\"stop\":\"\"}", 400, "stop", NULL},
    {"{" M "\"prompt\":\"a\",\"stop\":{}}", 400, "stop", NULL},
    /* stop_token_ids */
    {"{" M "\"prompt\":\"a\",\"stop_token_ids\":5}", 400, "stop_token_ids", NULL},
    {"{" M "\"prompt\":\"a\",\"stop_token_ids\":[1000]}", 400, "stop_token_ids", NULL},
    {"{" M "\"prompt\":\"a\",\"stop_token_ids\":[\"1\"]}", 400, "stop_token_ids", NULL},
    /* logit_bias: {"id": -100..100} */
    {"{" M "\"prompt\":\"a\",\"logit_bias\":[1]}", 400, "logit_bias", NULL},
    {"{" M "\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", 400, "logit_bias", NULL},
    {"{" M "\"prompt\":\"a\",\"logit_bias\":{\"-1\":1}}", 400, "logit_bias", NULL},
    {"{" M "\"prompt\":\"a\",\"logit_bias\":{\"1000\":1}}", 400, "logit_bias", NULL},
    {"{" M "\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", 400, "logit_bias", NULL},
    {"{" M "\"prompt\":\"a\",\"logit_bias\":{\"5\":\"1\"}}", 400, "logit_bias", NULL},
    /* booleans */
    {"{" M "\"prompt\":\"a\",\"ignore_eos\":\"yes\"}", 400, "ignore_eos", NULL},
    {"{" M "\"prompt\":\"a\",\"stream\":1}", 400, "stream", NULL},
    /* stream_options */
    {"{" M "\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options", NULL},
    {"{" M "\"prompt\":\"a\",\"stream\":true,\"stream_options\":5}", 400, "stream_options", NULL},
    {"{" M "\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400, "stream_options", NULL},
    /* user */
    {"{" M "\"prompt\":\"a\",\"user\":5}", 400, "user", NULL},
    /* \u0000 would cut the string short in cJSON: refused, not truncated */
    {"{" M "\"prompt\":\"a\\u0000b\"}", 400, NULL, NULL},
    {"{" M "\"prompt\":\"a\",\"user\":\"\\\\\\u0000\"}", 400, NULL, NULL},
    /* api: invalid UTF-8 anywhere (cJSON passes raw bytes through) -> 400
     * naming the top-level field: lone 0xFF, truncated sequence, overlong,
     * UTF-8-encoded surrogate, above U+10FFFF, in keys and nested values */
    {"{" M "\"prompt\":\"a\xFF\"}", 400, "prompt", NULL},
    {"{" M "\"prompt\":[\"ok\",\"\xC3\"]}", 400, "prompt", NULL},
    {"{\"model\":\"sm\xC0\xAFl\",\"prompt\":\"a\"}", 400, "model", NULL},
    {"{" M "\"prompt\":\"a\",\"stop\":[\"\xED\xA0\x80\"]}", 400, "stop", NULL},
    {"{" M "\"prompt\":\"a\",\"user\":\"\xF4\x90\x80\x80\"}", 400, "user", NULL},
    {"{" M "\"prompt\":\"a\",\"logit_bias\":{\"\xE0\x80\x80\":1}}", 400, "logit_bias", NULL},
    {"{" M "\"prompt\":\"a\",\"x\xFE\":1}", 400, NULL, NULL},
};

static void check_error_json(const dsq_api_error_t *e, int status,
                             const char *param, const char *code)
{
    char *s = dsq_apierr_json(e->kind, e->message, e->param);
    cJSON *root = cJSON_Parse(s), *err, *p, *c, *m, *t;
    assert_non_null(root);
    err = cJSON_GetObjectItem(root, "error");
    assert_non_null(err);
    m = cJSON_GetObjectItem(err, "message");
    t = cJSON_GetObjectItem(err, "type");
    p = cJSON_GetObjectItem(err, "param");
    c = cJSON_GetObjectItem(err, "code");
    assert_true(cJSON_IsString(m) && m->valuestring[0]);
    assert_true(cJSON_IsString(t));
    assert_non_null(p);
    assert_non_null(c);
    assert_int_equal(dsq_apierr_status(e->kind), status);
    if (param)
        assert_string_equal(p->valuestring ? p->valuestring : "(null)", param);
    else
        assert_true(cJSON_IsNull(p));
    if (code)
        assert_string_equal(c->valuestring ? c->valuestring : "(null)", code);
    cJSON_Delete(root);
    free(s);
}

static void test_bad_requests(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dsq_completion_req_t r;
        dsq_api_error_t e;
        memset(&e, 0, sizeof(e));
        int rc = dsq_openai_parse_completion(bad[i].body, strlen(bad[i].body),
                                             &LIM, &r, &e);
        if (rc != DSQ_EINVAL)
            fail_msg("case %zu accepted: %s", i, bad[i].body);
        if (bad[i].param && strcmp(e.param, bad[i].param))
            fail_msg("case %zu (%s): param '%s', want '%s'", i, bad[i].body,
                     e.param, bad[i].param);
        check_error_json(&e, bad[i].status, bad[i].param, bad[i].code);
        /* the parser leaves nothing allocated behind on failure */
        assert_null(r.prompts);
        assert_null(r.model);
    }
}

/* hardening: an integer field's message says what was wrong: a fraction,
 * or an integer out of range (1e26 is integral; "fraction" misled) */
/* users: every constraint field of the three APIs reaches sp.grammar as
 * the constraint it names: a sentence of it is accepted, a near miss not */
static void test_constraint_fields(void **state)
{
    (void)state;
    static const struct {
        const char *field, *yes, *no;
    } ok[] = {
        {"\"grammar\":\"root ::= [0-9]{2}\"", "42", "4"},
        {"\"guided_grammar\":\"root ::= \\\"ab\\\"\"", "ab", "a"},
        {"\"guided_choice\":[\"yes\",\"no\"]", "no", "maybe"},
        {"\"guided_regex\":\"[a-c]+x\"", "abcx", "abc"},
        {"\"guided_json\":{\"type\":\"integer\",\"maximum\":9}", "9", "10"},
        {"\"guided_json\":\"{\\\"type\\\":\\\"boolean\\\"}\"", "true", "1"},
        {"\"json_schema\":{\"enum\":[\"a\",\"b\"]}", "\"b\"", "\"c\""},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
         "\"strict\":true,\"schema\":{\"type\":\"array\",\"maxItems\":1}}}", "[1]", "[1,2]"},
        {"\"response_format\":{\"type\":\"json_object\"}", "{\"a\":1}", "[1]"},
        {"\"response_format\":{\"type\":\"json_object\",\"schema\":{\"type\":\"null\"}}", "null",
         "{}"},
        {"\"structured_outputs\":{\"regex\":\"z{3}\"}", "zzz", "zz"},
        {"\"structured_outputs\":{\"choice\":[\"x\"],\"json_object\":false}", "x", "y"},
        {"\"structured_outputs\":{\"json_object\":true}", "{}", "1"},
        {"\"structured_outputs\":{\"grammar\":\"root ::= \\\"q\\\"\"}", "q", "qq"},
        {"\"structured_outputs\":{\"json\":{\"type\":\"string\",\"maxLength\":1}}", "\"a\"",
         "\"ab\""},
        /* OpenAI's json_schema members, strict null; vLLM's backend
         * choice (the output is the same whichever implementation) */
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
         "\"My_schema-1\",\"description\":\"d\",\"strict\":null,\"schema\":{\"const\":1}}}",
         "1", "2"},
        {"\"guided_regex\":\"b+\",\"guided_decoding_backend\":\"xgrammar\","
         "\"guided_whitespace_pattern\":null", "bb", "a"},
        {"\"structured_outputs\":{\"json\":null,\"regex\":\"c\"}", "c", "cc"},
        /* a repetition of what can match empty is a valid regex */
        {"\"guided_regex\":\"(a*)*b\"", "aab", "aa"},
        {"\"guided_json\":{\"type\":\"string\",\"pattern\":\"^(a|)*$\"}", "\"aa\"", "\"b\""},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char body[512];
        snprintf(body, sizeof(body), "{" M "\"prompt\":\"a\",%s}", ok[i].field);
        dsq_completion_req_t r;
        dsq_api_error_t e;
        memset(&e, 0, sizeof(e));
        if (dsq_openai_parse_completion(body, strlen(body), &LIM, &r, &e) != 0)
            fail_msg("%s: refused: %s", body, e.message);
        assert_non_null(r.sp.grammar);
        const char *s[2] = {ok[i].yes, ok[i].no};
        for (int k = 0; k < 2; k++) {
            dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(r.sp.grammar);
            assert_non_null(m);
            bool acc = dsq_grammar_matcher_accept_bytes(m, s[k], strlen(s[k])) == DSQ_OK &&
                       dsq_grammar_matcher_can_end(m);
            if (acc != (k == 0))
                fail_msg("%s: \"%s\" %s", body, s[k], acc ? "accepted" : "refused");
            dsq_grammar_matcher_free(m);
        }
        dsq_completion_req_deinit(&r);
    }
}

static void test_int_messages(void **state)
{
    (void)state;
    static const struct { const char *body, *want; } cases[] = {
        {"{" M "\"prompt\":\"a\",\"max_tokens\":1e26}", "must be in [0, 1073741824], got 1e+26"},
        {"{" M "\"prompt\":\"a\",\"max_tokens\":1.5}", "got a fraction"},
        {"{" M "\"prompt\":\"a\",\"max_tokens\":-7}", "got -7"},
        {"{" M "\"prompt\":\"a\",\"seed\":1e30}", "beyond +-2^53"},
        {"{" M "\"prompt\":\"a\",\"seed\":0.5}", "got a fraction"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dsq_completion_req_t r;
        dsq_api_error_t e;
        memset(&e, 0, sizeof(e));
        assert_int_equal(dsq_openai_parse_completion(cases[i].body, strlen(cases[i].body),
                                                     &LIM, &r, &e), DSQ_EINVAL);
        if (!strstr(e.message, cases[i].want))
            fail_msg("case %zu: message '%s' lacks '%s'", i, e.message, cases[i].want);
        assert_null(strstr(e.message, i == 1 || i == 4 ? "must be in" : "fraction"));
    }
}

static void test_defaults(void **state)
{
    dsq_completion_req_t r;
    dsq_api_error_t e;
    const char *b = "{\"model\":\"smol\",\"prompt\":\"Hello\"}";
    (void)state;
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    assert_string_equal(r.model, "smol");
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "Hello");
    assert_int_equal(r.sp.max_tokens, 16);          /* OpenAI default */
    assert_true(r.sp.temperature == 1.0f);          /* OpenAI default */
    assert_true(r.sp.top_p == 1.0f);
    assert_int_equal(r.sp.top_k, 0);
    assert_true(r.sp.min_p == 0.0f);
    assert_true(r.sp.repetition_penalty == 1.0f);
    assert_int_equal(r.sp.n, 1);
    assert_int_equal(r.best_of, 1);
    assert_int_equal(r.sp.logprobs, -1);
    assert_false(r.sp.has_seed);
    assert_false(r.echo);
    assert_false(r.stream);
    assert_int_equal(r.sp.n_stop, 0);
    dsq_completion_req_deinit(&r);
}

static void test_all_fields(void **state)
{
    dsq_completion_req_t r;
    dsq_api_error_t e;
    const char *b =
        "{\"model\":\"smol\",\"prompt\":[[1,2,3],[4]],\"max_tokens\":7,"
        "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,"
        "\"n\":2,\"best_of\":2,\"stop\":[\"\\n\",\"END\"],"
        "\"stop_token_ids\":[7,8],\"seed\":-3,\"logprobs\":3,"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
        "\"repetition_penalty\":1.1,\"logit_bias\":{\"11\":-100,\"12\":5.5},"
        "\"ignore_eos\":true,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"user\":\"u\","
        "\"suffix\":null,\"unknown_field\":1}";
    (void)state;
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 3);
    assert_int_equal(r.prompts[1].n_ids, 1);
    assert_int_equal(r.prompts[1].ids[0], 4);
    assert_int_equal(r.sp.max_tokens, 7);
    assert_true(r.sp.temperature == 0.5f);
    assert_true(r.sp.top_p == 0.9f);
    assert_int_equal(r.sp.top_k, 40);
    assert_true(r.sp.min_p == 0.05f);
    assert_int_equal(r.sp.n, 2);
    assert_int_equal(r.sp.n_stop, 2);
    assert_string_equal(r.sp.stop[0], "\n");
    assert_string_equal(r.sp.stop[1], "END");
    assert_int_equal(r.sp.n_stop_token_ids, 2);
    assert_int_equal(r.sp.stop_token_ids[1], 8);
    assert_true(r.sp.has_seed);
    assert_true(r.sp.seed == (uint64_t)(int64_t)-3);
    assert_int_equal(r.sp.logprobs, 3);
    assert_true(r.sp.presence_penalty == 0.5f);
    assert_true(r.sp.frequency_penalty == -0.5f);
    assert_true(r.sp.repetition_penalty == 1.1f);
    assert_int_equal(r.sp.n_logit_bias, 2);
    assert_int_equal(r.sp.logit_bias_ids[0], 11);
    assert_true(r.sp.logit_bias[0] == -100.0f);
    assert_int_equal(r.sp.logit_bias_ids[1], 12);
    assert_true(r.sp.logit_bias[1] == 5.5f);
    assert_true(r.sp.ignore_eos);
    assert_true(r.stream);
    assert_true(r.include_usage);
    dsq_completion_req_deinit(&r);
}

/* Values the float sampler cannot take as they are: a temperature whose
 * inverse overflows, a top_p or repetition_penalty that rounds to 0.0f. */
static void test_tiny_sampling_values(void **state)
{
    dsq_completion_req_t r;
    dsq_api_error_t e;
    const char *b = "{\"model\":\"smol\",\"prompt\":\"a\",\"temperature\":1e-45,"
                    "\"top_p\":1e-46,\"repetition_penalty\":5e-324}";
    const char *esc = "{\"model\":\"smol\",\"prompt\":\"a\\\\u0000\"}";
    (void)state;
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    assert_true(r.sp.temperature == 0.0f);              /* greedy */
    assert_true(r.sp.top_p > 0.0f);
    assert_true(r.sp.repetition_penalty >= 1e-30f);
    dsq_completion_req_deinit(&r);
    /* an escaped backslash before u0000 is plain text */
    assert_int_equal(dsq_openai_parse_completion(esc, strlen(esc), &LIM, &r, &e), 0);
    assert_string_equal(r.prompts[0].text, "a\\u0000");
    dsq_completion_req_deinit(&r);
}

static void test_prompt_forms(void **state)
{
    dsq_completion_req_t r;
    dsq_api_error_t e;
    const char *b1 = "{\"model\":\"smol\",\"prompt\":[\"a\",\"bc\",\"\"]}";
    const char *b2 = "{\"model\":\"smol\",\"prompt\":[5,6,999]}";
    const char *b3 = "{\"model\":\"smol\",\"prompt\":\"x\",\"stop\":\"s\","
                     "\"top_k\":-1,\"echo\":true,\"max_tokens\":0}";
    (void)state;
    assert_int_equal(dsq_openai_parse_completion(b1, strlen(b1), &LIM, &r, &e), 0);
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompts[1].text, "bc");
    assert_int_equal(r.prompts[1].text_len, 2);
    assert_int_equal(r.prompts[2].text_len, 0);
    dsq_completion_req_deinit(&r);
    assert_int_equal(dsq_openai_parse_completion(b2, strlen(b2), &LIM, &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 999);
    dsq_completion_req_deinit(&r);
    /* max_tokens 0 is fine with echo; a single stop string; top_k -1 = off */
    assert_int_equal(dsq_openai_parse_completion(b3, strlen(b3), &LIM, &r, &e), 0);
    assert_int_equal(r.sp.max_tokens, 0);
    assert_int_equal(r.sp.n_stop, 1);
    assert_string_equal(r.sp.stop[0], "s");
    assert_int_equal(r.sp.top_k, 0);
    assert_true(r.echo);
    dsq_completion_req_deinit(&r);
}

static void test_context_length(void **state)
{
    dsq_api_error_t e;
    (void)state;
    assert_int_equal(dsq_openai_check_context(100, 28, 128, &e), 0);
    assert_int_equal(dsq_openai_check_context(100, 29, 128, &e), DSQ_ERANGE);
    assert_int_equal(dsq_apierr_status(e.kind), 400);
    assert_string_equal(dsq_apierr_code(e.kind), "context_length_exceeded");
    /* both numbers (and the limit) in the message */
    assert_non_null(strstr(e.message, "128"));
    assert_non_null(strstr(e.message, "100"));
    assert_non_null(strstr(e.message, "29"));
    assert_non_null(strstr(e.message, "129"));
}

static void test_error_table(void **state)
{
    (void)state;
    assert_int_equal(dsq_apierr_status(dsq_apierr_from_code(DSQ_EINVAL)), 400);
    assert_int_equal(dsq_apierr_status(dsq_apierr_from_code(DSQ_ERANGE)), 400);
    assert_string_equal(dsq_apierr_code(dsq_apierr_from_code(DSQ_ERANGE)),
                        "context_length_exceeded");
    /* hardening: an overloaded engine is 503 (OpenAI clients read 429 as a
     * per-client rate limit) */
    assert_int_equal(dsq_apierr_status(dsq_apierr_from_code(DSQ_EFULL)), 503);
    assert_string_equal(dsq_apierr_code(dsq_apierr_from_code(DSQ_EFULL)), "queue_full");
    assert_int_equal(dsq_apierr_status(dsq_apierr_from_code(DSQ_ESTATE)), 503);
    assert_int_equal(dsq_apierr_status(dsq_apierr_from_code(DSQ_ENOMEM)), 500);
    assert_int_equal(dsq_apierr_status(DSQ_APIERR_AUTH), 401);
    assert_int_equal(dsq_apierr_status(DSQ_APIERR_NOT_FOUND), 404);
    assert_int_equal(dsq_apierr_status(DSQ_APIERR_METHOD), 405);
    assert_int_equal(dsq_apierr_status(DSQ_APIERR_TOO_LARGE), 413);
    assert_int_equal(dsq_apierr_status(DSQ_APIERR_MEDIA_TYPE), 415);
    assert_string_equal(dsq_apierr_type(DSQ_APIERR_INVALID_REQUEST),
                        "invalid_request_error");
    /* message with quotes and newlines stays valid JSON */
    char *s = dsq_apierr_json(DSQ_APIERR_INVALID_REQUEST, "a \"b\"\n", "x");
    cJSON *j = cJSON_Parse(s);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"),
                                            "message")->valuestring, "a \"b\"\n");
    cJSON_Delete(j);
    free(s);
}

static void test_tokenize_bodies(void **state)
{
    dsq_api_error_t e;
    char *p = NULL;
    size_t len = 0;
    bool add = false;
    int32_t *ids = NULL;
    int n = 0;
    const char *t1 = "{\"prompt\":\"hi\",\"add_special_tokens\":false}";
    const char *t2 = "{\"prompt\":[1]}";
    const char *t3 = "{\"model\":\"other\",\"prompt\":\"hi\"}";
    const char *d1 = "{\"tokens\":[1,2,999]}";
    const char *d2 = "{\"tokens\":[1000]}";
    const char *d3 = "{\"tokens\":\"1\"}";
    (void)state;
    assert_int_equal(dsq_openai_parse_tokenize(t1, strlen(t1), &LIM, &p, &len, &add, &e), 0);
    assert_string_equal(p, "hi");
    assert_false(add);
    free(p);
    assert_int_equal(dsq_openai_parse_tokenize(t2, strlen(t2), &LIM, &p, &len, &add, &e), DSQ_EINVAL);
    assert_string_equal(e.param, "prompt");
    assert_int_equal(dsq_openai_parse_tokenize(t3, strlen(t3), &LIM, &p, &len, &add, &e), DSQ_EINVAL);
    assert_string_equal(e.param, "model");
    assert_int_equal(dsq_openai_parse_detokenize(d1, strlen(d1), &LIM, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 999);
    free(ids);
    assert_int_equal(dsq_openai_parse_detokenize(d2, strlen(d2), &LIM, &ids, &n, &e), DSQ_EINVAL);
    assert_string_equal(e.param, "tokens");
    assert_int_equal(dsq_openai_parse_detokenize(d3, strlen(d3), &LIM, &ids, &n, &e), DSQ_EINVAL);
}

static const char *fake_tok(void *u, int32_t id, size_t *len)
{
    static const char *words[] = {" a", " b", "\xE2\x82", "c"};
    (void)u;
    if (id < 0 || id > 3)
        return NULL;
    *len = strlen(words[id]);
    return words[id];
}

static void test_response_and_chunks(void **state)
{
    int32_t toks[2] = {0, 2};
    float lps[2] = {-0.25f, -1.5f};
    dsq_top_logprob_t top[4] = {{0, -0.25f}, {1, -2.0f}, {3, -0.5f}, {1, -3.0f}};
    size_t offs[2] = {0, 2};
    dsq_output_t o = {0};
    dsq_choice_out_t ch;
    dsq_usage_t u = {.prompt_tokens = 5, .completion_tokens = 2, .cached_tokens = 3,
                     .has_cached = true};
    cJSON *lp = dsq_openai_logprobs_new(), *j, *c0, *l;
    char *body, *chunk, id[64];
    (void)state;
    o.n_tokens = 2;
    o.tokens = toks;
    o.logprobs = lps;
    o.top = top;
    o.n_top = 2;
    o.token_text_offset = offs;
    assert_int_equal(dsq_openai_logprobs_add(lp, &o, 0, fake_tok, NULL), 0);
    ch.index = 0;
    ch.text = " a\xE2\x82";  /* ends in a broken UTF-8 sequence */
    ch.text_len = 4;
    ch.logprobs = lp;
    ch.finish = DSQ_FINISH_LENGTH;
    assert_int_equal(dsq_openai_new_id(id, sizeof(id), "cmpl-"), 0);
    assert_int_equal(strlen(id), 5 + 32);
    body = dsq_openai_completion_body(id, 1700000000, "smol", &ch, 1, &u);
    j = cJSON_Parse(body);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    assert_string_equal(cJSON_GetObjectItem(j, "id")->valuestring, id);
    assert_int_equal(cJSON_GetObjectItem(j, "created")->valuedouble, 1700000000);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "text")->valuestring, " a\xEF\xBF\xBD");
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    l = cJSON_GetObjectItem(c0, "logprobs");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "tokens"), 0)->valuestring, " a");
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "token_logprobs"), 1)->valuedouble == -1.5);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "text_offset"), 1)->valuedouble, 2);
    /* second token (id 2) was not in its top-2: added as vLLM does */
    cJSON *t1 = cJSON_GetArrayItem(cJSON_GetObjectItem(l, "top_logprobs"), 1);
    assert_int_equal(cJSON_GetArraySize(t1), 3);
    assert_true(cJSON_GetObjectItem(t1, "c")->valuedouble == -0.5);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valuedouble, 7);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"),
                     "prompt_tokens_details"), "cached_tokens")->valuedouble, 3);
    cJSON_Delete(j);
    free(body);

    chunk = dsq_openai_chunk(id, 1, "smol", 3, "hi", 2, NULL, DSQ_FINISH_NONE, true);
    assert_memory_equal(chunk, "data: {", 7);
    assert_string_equal(chunk + strlen(chunk) - 2, "\n\n");
    j = cJSON_Parse(chunk + 6);
    assert_non_null(j);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_int_equal(cJSON_GetObjectItem(c0, "index")->valuedouble, 3);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c0, "logprobs")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")));
    cJSON_Delete(j);
    free(chunk);
    chunk = dsq_openai_usage_chunk(id, 1, "smol", &u);
    j = cJSON_Parse(chunk + 6);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valuedouble, 2);
    cJSON_Delete(j);
    free(chunk);
    cJSON_Delete(lp);
}

/* chatapi: /v1/chat/completions bodies (OpenAI Chat Completions API
 * reference: messages, max_completion_tokens, logprobs + top_logprobs). */
static void test_chat_parse(void **state)
{
    static const struct { const char *body; const char *param; } bad_chat[] = {
        {"{" M "\"max_tokens\":3}", "messages"},
        {"{" M "\"messages\":[]}", "messages"},
        {"{" M "\"messages\":\"hi\"}", "messages"},
        {"{" M "\"messages\":[1]}", "messages"},
        {"{" M "\"messages\":[{\"content\":\"x\"}]}", "messages"},
        {"{" M "\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", "messages"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages"},
        {"{" M "\"messages\":[{\"role\":\"user\"}]}", "messages"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}", "messages"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", "tools"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":1}", "top_logprobs"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", "logprobs"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}", "max_completion_tokens"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking_budget\":-1}", "thinking_budget"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking_budget\":1.5}", "thinking_budget"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", "chat_template_kwargs"},
        {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":0}}", "chat_template_kwargs"},
    };
    dsq_completion_req_t r;
    dsq_api_error_t e;
    const char *ok =
        "{" M "\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}],\"name\":\"n\"},"
        "{\"role\":\"assistant\",\"tool_calls\":[]},"
        "{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":\"t\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
        "\"tool_choice\":\"none\",\"max_tokens\":9,"
        "\"max_completion_tokens\":4,\"logprobs\":true,\"top_logprobs\":3,"
        "\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"stop\":\"x\",\"seed\":5,\"logit_bias\":{\"7\":1}}";
    const cJSON *m;
    (void)state;
    for (size_t i = 0; i < sizeof(bad_chat) / sizeof(bad_chat[0]); i++) {
        memset(&e, 0, sizeof(e));
        if (dsq_openai_parse_chat(bad_chat[i].body, strlen(bad_chat[i].body),
                                  &LIM, &r, &e) != DSQ_EINVAL)
            fail_msg("accepted: %s", bad_chat[i].body);
        if (dsq_apierr_status(e.kind) != 400 || strcmp(e.param, bad_chat[i].param))
            fail_msg("%s: status %d param '%s'", bad_chat[i].body,
                     dsq_apierr_status(e.kind), e.param);
        assert_null(r.messages);
    }
    assert_int_equal(dsq_openai_parse_chat(ok, strlen(ok), &LIM, &r, &e), 0);
    assert_true(r.chat);
    assert_int_equal(r.n_prompts, 0);
    assert_int_equal(r.sp.max_tokens, 4);       /* max_completion_tokens wins */
    assert_int_equal(r.sp.logprobs, 3);
    assert_int_equal(r.sp.n, 2);
    assert_true(r.stream && r.include_usage && r.sp.has_seed);
    assert_int_equal(r.sp.n_stop, 1);
    assert_int_equal(r.sp.n_logit_bias, 1);
    assert_int_equal(r.think_budget, -1);        /* none given */
    assert_int_equal(cJSON_GetArraySize(r.messages), 4);
    m = cJSON_GetArrayItem(r.messages, 1);
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "a\nb");
    assert_string_equal(cJSON_GetObjectItem(m, "name")->valuestring, "n");
    m = cJSON_GetArrayItem(r.messages, 2);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(m, "content")));
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(m, "tool_calls")));
    assert_int_equal(cJSON_GetArraySize(r.tools), 1);
    dsq_completion_req_deinit(&r);
    /* reasoning budgets: thinking_budget, or 0 from enable_thinking false
     * (an explicit budget wins) */
    {
        static const struct { const char *body; int budget; } tb[] = {
            {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking_budget\":7}", 7},
            {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":"
             "{\"enable_thinking\":false,\"other\":1}}", 0},
            {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":"
             "{\"enable_thinking\":true}}", -1},
            {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking_budget\":5,"
             "\"chat_template_kwargs\":{\"enable_thinking\":false}}", 5},
        };
        for (size_t i = 0; i < sizeof(tb) / sizeof(tb[0]); i++) {
            if (dsq_openai_parse_chat(tb[i].body, strlen(tb[i].body), &LIM, &r, &e))
                fail_msg("refused %s: %s", tb[i].body, e.message);
            assert_int_equal(r.think_budget, tb[i].budget);
            dsq_completion_req_deinit(&r);
        }
    }
    /* tool_choice and parallel_tool_calls; a named
     * function must be one of the tools; the legacy functions fields are
     * refused; response_format text passes */
    {
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
#define TOOL_F "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"
        static const struct { const char *body; int choice; const char *name; bool par; } yes[] = {
            {"{" M MSG TOOL_F "}", DSQ_TOOL_CHOICE_AUTO, NULL, true},
            {"{" M MSG TOOL_F ",\"tool_choice\":\"none\"}", DSQ_TOOL_CHOICE_NONE, NULL, true},
            {"{" M MSG TOOL_F ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
             DSQ_TOOL_CHOICE_REQUIRED, NULL, false},
            {"{" M MSG TOOL_F ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
             "\"f\"}}}", DSQ_TOOL_CHOICE_NAMED, "f", true},
            {"{" M MSG "\"tool_choice\":\"auto\"}", DSQ_TOOL_CHOICE_NONE, NULL, true},
            /* untyped parameters of only object keywords are an object */
            {"{" M MSG "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
             "\"description\":\"d\",\"parameters\":{\"properties\":{\"a\":{}},\"required\":"
             "[\"a\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"g\",\"description\":"
             "null}}],\"tool_choice\":\"required\"}", DSQ_TOOL_CHOICE_REQUIRED, NULL, true},
            /* the turns of a call as clients send them: arguments a string
             * (or an object, transformers' form), tool_calls null or [] */
            {"{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
             "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":"
             "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},{\"id\":\"d\","
             "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]},{\"role\":"
             "\"tool\",\"content\":\"r\",\"tool_call_id\":\"c\"},{\"role\":\"assistant\","
             "\"content\":\"ok\",\"tool_calls\":null}]," TOOL_F "}", DSQ_TOOL_CHOICE_AUTO, NULL,
             true},
        };
        for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
            memset(&e, 0, sizeof(e));
            if (dsq_openai_parse_chat(yes[i].body, strlen(yes[i].body), &LIM, &r, &e))
                fail_msg("refused: %s: %s", yes[i].body, e.message);
            assert_int_equal(r.tool_choice, yes[i].choice);
            assert_true(r.parallel_tool_calls == yes[i].par);
            if (yes[i].name)
                assert_string_equal(r.tool_name, yes[i].name);
            dsq_completion_req_deinit(&r);
        }
        static const struct { const char *body, *param, *code; } no[] = {
            {"{" M MSG "\"tool_choice\":{\"type\":\"function\"}}", "tool_choice", NULL},
            {"{" M MSG TOOL_F ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
             "\"g\"}}}", "tool_choice", NULL},
            {"{" M MSG "\"tool_choice\":\"required\"}", "tool_choice", NULL},
            {"{" M MSG TOOL_F ",\"tool_choice\":\"always\"}", "tool_choice", NULL},
            {"{" M MSG TOOL_F ",\"tool_choice\":\"required\",\"guided_regex\":\"a\"}",
             "tool_choice", NULL},
            {"{" M MSG TOOL_F ",\"parallel_tool_calls\":1}", "parallel_tool_calls", NULL},
            {"{" M MSG "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
             "\"parameters\":3}}]}", "tools", NULL},
            {"{" M MSG "\"functions\":[{\"name\":\"f\"}]}", "functions", "unsupported_parameter"},
            {"{" M MSG "\"functions\":[]}", "functions", "unsupported_parameter"},
            /* OpenAI's shape of the tool-call turns */
            {"{" M "\"messages\":[{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":7}]}",
             "messages", NULL},
            {"{" M "\"messages\":[{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":null}]}",
             "messages", NULL},
            {"{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}", "messages", NULL},
            {"{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[null]}]}", "messages",
             NULL},
            {"{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
             "\"type\":\"function\"}]}]}", "messages", NULL},
            {"{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
             "{\"arguments\":\"{}\"}}]}]}", "messages", NULL},
            {"{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
             "{\"name\":\"f\",\"arguments\":3}}]}]}", "messages", NULL},
            {"{" M MSG "\"function_call\":{\"name\":\"f\"}}", "function_call",
             "unsupported_parameter"},
        };
        for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
            memset(&e, 0, sizeof(e));
            if (dsq_openai_parse_chat(no[i].body, strlen(no[i].body), &LIM, &r, &e) != DSQ_EINVAL)
                fail_msg("accepted: %s", no[i].body);
            assert_string_equal(e.param, no[i].param);
            if (no[i].code)
                assert_string_equal(dsq_apierr_code(e.kind), no[i].code);
        }
#undef MSG
#undef TOOL_F
        const char *b = "{" M "\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
                        "{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[],"
                        "\"tool_choice\":\"auto\",\"response_format\":{\"type\":\"text\"}}";
        assert_int_equal(dsq_openai_parse_chat(b, strlen(b), &LIM, &r, &e), 0);
        /* developer is the template's system role */
        m = cJSON_GetArrayItem(r.messages, 0);
        assert_string_equal(cJSON_GetObjectItem(m, "role")->valuestring, "system");
        assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "d");
        dsq_completion_req_deinit(&r);
    }
    /* defaults: no limit (-1, filled from the context), no logprobs */
    {
        const char *b = "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true}";
        assert_int_equal(dsq_openai_parse_chat(b, strlen(b), &LIM, &r, &e), 0);
        assert_int_equal(r.sp.max_tokens, -1);
        assert_int_equal(r.sp.logprobs, 0);
        assert_null(r.tools);
        dsq_completion_req_deinit(&r);
        b = "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true,\"best_of\":9}";
        assert_int_equal(dsq_openai_parse_chat(b, strlen(b), &LIM, &r, &e), 0);
        assert_int_equal(r.sp.logprobs, -1);
        assert_false(r.echo);
        dsq_completion_req_deinit(&r);
    }
    /* /tokenize with messages */
    {
        dsq_tokenize_req_t t;
        const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                        "\"add_generation_prompt\":false}";
        assert_int_equal(dsq_openai_parse_tokenize_req(b, strlen(b), &LIM, &t, &e), 0);
        assert_non_null(t.messages);
        assert_null(t.prompt);
        assert_false(t.add_generation_prompt);
        assert_true(t.add_special);
        dsq_tokenize_req_deinit(&t);
        b = "{\"prompt\":\"hi\",\"add_special_tokens\":false}";
        assert_int_equal(dsq_openai_parse_tokenize_req(b, strlen(b), &LIM, &t, &e), 0);
        assert_string_equal(t.prompt, "hi");
        assert_false(t.add_special);
        dsq_tokenize_req_deinit(&t);
        b = "{\"messages\":[{\"role\":\"x\",\"content\":\"x\"}]}";
        assert_int_equal(dsq_openai_parse_tokenize_req(b, strlen(b), &LIM, &t, &e), DSQ_EINVAL);
        assert_null(t.messages);
    }
}

static void test_chat_response_and_chunks(void **state)
{
    int32_t toks[2] = {0, 2};
    float lps[2] = {-0.25f, -1.5f};
    dsq_top_logprob_t top[2] = {{0, -0.25f}, {2, -1.5f}};
    dsq_output_t o = {0};
    dsq_chat_choice_out_t ch = {0};
    dsq_usage_t u = {.prompt_tokens = 5, .completion_tokens = 2};
    cJSON *lp = dsq_openai_chat_logprobs_new(), *j, *c0, *t, *d;
    char *body, *chunk;
    (void)state;
    o.n_tokens = 2;
    o.tokens = toks;
    o.logprobs = lps;
    o.top = top;
    o.n_top = 1;
    assert_int_equal(dsq_openai_chat_logprobs_add(lp, &o, fake_tok, NULL), 0);
    ch.content = "Paris";
    ch.content_len = 5;
    ch.reasoning = "think";
    ch.reasoning_len = 5;
    ch.logprobs = lp;
    ch.finish = DSQ_FINISH_STOP;
    body = dsq_openai_chat_body("chatcmpl-1", 7, "smol", &ch, 1, &u);
    j = cJSON_Parse(body);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    d = cJSON_GetObjectItem(c0, "message");
    assert_string_equal(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItem(d, "content")->valuestring, "Paris");
    assert_string_equal(cJSON_GetObjectItem(d, "reasoning_content")->valuestring, "think");
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    /* token 2 is a broken UTF-8 piece: token text replaced, bytes raw */
    t = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content"), 1);
    assert_string_equal(cJSON_GetObjectItem(t, "token")->valuestring, "\xEF\xBF\xBD");
    assert_true(cJSON_GetObjectItem(t, "logprob")->valuedouble == -1.5);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t, "bytes")), 2);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(t, "bytes"), 0)->valuedouble, 0xE2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t, "top_logprobs")), 1);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valuedouble, 7);
    cJSON_Delete(j);
    free(body);
    ch.reasoning = NULL;        /* no parser: no reasoning_content member */
    ch.logprobs = NULL;
    body = dsq_openai_chat_body("chatcmpl-1", 7, "smol", &ch, 1, &u);
    j = cJSON_Parse(body);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "reasoning_content"));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c0, "logprobs")));
    cJSON_Delete(j);
    free(body);

    chunk = dsq_openai_chat_chunk("chatcmpl-1", 7, "smol", 1, "assistant", "", 0,
                                  NULL, 0, NULL, DSQ_FINISH_NONE, true);
    assert_memory_equal(chunk, "data: {", 7);
    j = cJSON_Parse(chunk + 6);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion.chunk");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_int_equal(cJSON_GetObjectItem(c0, "index")->valuedouble, 1);
    d = cJSON_GetObjectItem(c0, "delta");
    assert_int_equal(cJSON_GetArraySize(d), 2);
    assert_string_equal(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItem(d, "content")->valuestring, "");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")));
    cJSON_Delete(j);
    free(chunk);
    chunk = dsq_openai_chat_chunk("chatcmpl-1", 7, "smol", 0, NULL, NULL, 0,
                                  "hm", 2, NULL, DSQ_FINISH_NONE, false);
    j = cJSON_Parse(chunk + 6);
    d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
    assert_int_equal(cJSON_GetArraySize(d), 1);
    assert_string_equal(cJSON_GetObjectItem(d, "reasoning_content")->valuestring, "hm");
    assert_null(cJSON_GetObjectItem(j, "usage"));
    cJSON_Delete(j);
    free(chunk);
    chunk = dsq_openai_chat_chunk("chatcmpl-1", 7, "smol", 0, NULL, NULL, 0,
                                  NULL, 0, NULL, DSQ_FINISH_LENGTH, false);
    j = cJSON_Parse(chunk + 6);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(c0, "delta")), 0);
    assert_string_equal(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    cJSON_Delete(j);
    free(chunk);
    chunk = dsq_openai_chat_usage_chunk("chatcmpl-1", 7, "smol", &u);
    j = cJSON_Parse(chunk + 6);
    assert_string_equal(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion.chunk");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    cJSON_Delete(j);
    free(chunk);
    cJSON_Delete(lp);
}

static void test_utf8_clean(void **state)
{
    size_t n;
    char *s;
    (void)state;
    s = dsq_openai_utf8_clean("ok \xC3\xA9 \xF0\x9F\x98\x80", 10, &n);
    assert_string_equal(s, "ok \xC3\xA9 \xF0\x9F\x98\x80");
    free(s);
    s = dsq_openai_utf8_clean("\xC0\xAF|\xED\xA0\x80|\xFF", 8, &n); /* overlong, surrogate, 0xFF */
    assert_string_equal(s, "\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD");
    free(s);
}

/* api: best_of, echo + logprobs, valid UTF-8 kept, and the UTF-8 check on
 * the chat / tokenize / detokenize parsers too. */
static void test_api_fields(void **state)
{
    dsq_completion_req_t r;
    dsq_api_error_t e;
    const char *b;
    char *pr = NULL;
    size_t pl = 0;
    bool add = false;
    int32_t *ids = NULL;
    int n_ids = 0;
    dsq_tokenize_req_t t;
    (void)state;
    b = "{" M "\"prompt\":\"a\",\"n\":2,\"best_of\":3}";
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    assert_int_equal(r.sp.n, 2);
    assert_int_equal(r.best_of, 3);
    assert_int_equal(r.sp.best_of, 3);
    assert_false(r.sp.prompt_logprobs);
    dsq_completion_req_deinit(&r);
    /* echo + logprobs (+ max_tokens 0): the scoring call */
    b = "{" M "\"prompt\":\"a\",\"echo\":true,\"logprobs\":2,\"max_tokens\":0}";
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    assert_true(r.sp.prompt_logprobs);
    assert_int_equal(r.sp.logprobs, 2);
    assert_int_equal(r.sp.max_tokens, 0);
    dsq_completion_req_deinit(&r);
    /* logprobs without echo: no prompt logprobs */
    b = "{" M "\"prompt\":\"a\",\"logprobs\":0}";
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    assert_false(r.sp.prompt_logprobs);
    dsq_completion_req_deinit(&r);
    /* exactly at the cap: 1 prompt x 128, 8 prompts x 16 = 128 */
    b = "{" M "\"prompt\":\"a\",\"n\":128}";
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    dsq_completion_req_deinit(&r);
    b = "{" M "\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"],\"n\":16}";
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    dsq_completion_req_deinit(&r);
    /* the finding: 8 prompts x n = 128 (1,024 sequences) */
    b = "{" M "\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"],\"n\":128}";
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), DSQ_EINVAL);
    assert_string_equal(e.param, "n");
    /* a lower cap from the limits */
    {
        dsq_openai_limits_t lim = {"smol", 1000, 4};
        b = "{" M "\"prompt\":[\"a\",\"a\"],\"n\":3}";
        assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &lim, &r, &e), DSQ_EINVAL);
        assert_string_equal(e.param, "n");
        b = "{" M "\"prompt\":[\"a\",\"a\"],\"n\":2}";
        assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &lim, &r, &e), 0);
        dsq_completion_req_deinit(&r);
    }
    /* valid multi-byte UTF-8 passes untouched: U+00E9, U+20AC, U+1F600 */
    b = "{" M "\"prompt\":\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"}";
    assert_int_equal(dsq_openai_parse_completion(b, strlen(b), &LIM, &r, &e), 0);
    assert_string_equal(r.prompts[0].text, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
    dsq_completion_req_deinit(&r);
    /* chat: invalid UTF-8 in message content */
    b = "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"hi\xC3(\"}]}";
    assert_int_equal(dsq_openai_parse_chat(b, strlen(b), &LIM, &r, &e), DSQ_EINVAL);
    assert_string_equal(e.param, "messages");
    b = "{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\x80\"}]}]}";
    assert_int_equal(dsq_openai_parse_chat(b, strlen(b), &LIM, &r, &e), DSQ_EINVAL);
    assert_string_equal(e.param, "messages");
    /* tokenize / detokenize bodies */
    b = "{\"prompt\":\"\xFF\"}";
    assert_int_equal(dsq_openai_parse_tokenize(b, strlen(b), &LIM, &pr, &pl, &add, &e),
                     DSQ_EINVAL);
    assert_string_equal(e.param, "prompt");
    assert_int_equal(dsq_openai_parse_tokenize_req(b, strlen(b), &LIM, &t, &e), DSQ_EINVAL);
    assert_string_equal(e.param, "prompt");
    b = "{\"model\":\"\xFF\",\"tokens\":[1]}";
    assert_int_equal(dsq_openai_parse_detokenize(b, strlen(b), &LIM, &ids, &n_ids, &e),
                     DSQ_EINVAL);
    assert_string_equal(e.param, "model");
}

/* api: echo + logprobs prompt entries, values written out by hand from the
 * OpenAI legacy format: first token null/null, offsets = running byte
 * length of the token texts, the prompt token itself in its top dict. */
static void test_prompt_logprobs(void **state)
{
    int32_t ids[3] = {3, 0, 1};          /* "c", " a", " b" */
    float plp[2] = {-1.25f, -0.5f};      /* " a" after "c", " b" after " a" */
    dsq_top_logprob_t top[2] = {{2, -0.75f}, {1, -0.5f}};  /* n_top 1 */
    dsq_output_t o = {0};
    cJSON *lp = dsq_openai_logprobs_new();
    size_t tl = 0;
    (void)state;
    o.n_prompt_logprobs = 2;
    o.prompt_logprobs = plp;
    o.prompt_top = top;
    o.n_top = 1;
    assert_int_equal(dsq_openai_logprobs_add_prompt(lp, ids, 3, &o, fake_tok, NULL, &tl), 0);
    assert_int_equal(tl, 5);
    char *s = cJSON_PrintUnformatted(lp);
    assert_string_equal(s, "{\"tokens\":[\"c\",\" a\",\" b\"],"
                           "\"token_logprobs\":[null,-1.25,-0.5],"
                           "\"top_logprobs\":[null,{\"\xEF\xBF\xBD\":-0.75,\" a\":-1.25},"
                           "{\" b\":-0.5}],\"text_offset\":[0,1,3]}");
    free(s);
    cJSON_Delete(lp);
    /* not computed (e.g. aborted before the prompt ran): nulls */
    lp = dsq_openai_logprobs_new();
    o.n_prompt_logprobs = 0;
    assert_int_equal(dsq_openai_logprobs_add_prompt(lp, ids, 2, &o, fake_tok, NULL, &tl), 0);
    s = cJSON_PrintUnformatted(lp);
    assert_string_equal(s, "{\"tokens\":[\"c\",\" a\"],\"token_logprobs\":[null,null],"
                           "\"top_logprobs\":[null,null],\"text_offset\":[0,1]}");
    free(s);
    cJSON_Delete(lp);
    /* wrong object shape */
    lp = dsq_openai_chat_logprobs_new();
    assert_int_equal(dsq_openai_logprobs_add_prompt(lp, ids, 2, &o, fake_tok, NULL, &tl),
                     DSQ_EINVAL);
    cJSON_Delete(lp);
}

/* Request bodies are JSON as RFC 8259 defines it, and no object
 * holds a key twice. Each of these cJSON alone took (or refused without
 * saying where); now each is a 400 whose message names the byte offset
 * (0-based) and line:column (1-based, columns in characters). The offsets
 * are counted by hand: S is 36 bytes, so a seed value starts at byte 36;
 * P is 29 bytes and ends with the comma after "prompt":"a". */
#define S "{\"model\":\"smol\",\"prompt\":\"a\",\"seed\":"
#define P "{\"model\":\"smol\",\"prompt\":\"a\","
static const struct strict_case {
    const char *body;
    const char *param;      /* NULL = JSON null */
    const char *want;       /* a piece of the message */
} strict_bad[] = {
    /* numbers (RFC 8259 section 6): the parser stops at the byte that
     * cannot continue the number, or just past the token it refuses */
    {S "01}", NULL, "at byte 37 (line 1, column 38)"},
    {S "-01}", NULL, "at byte 38 (line 1, column 39)"},
    {S "1.}", NULL, "at byte 38 (line 1, column 39)"},
    {S ".5}", NULL, "at byte 37 (line 1, column 38)"},
    {S "1e}", NULL, "at byte 38 (line 1, column 39)"},
    {S "+1}", NULL, "at byte 37 (line 1, column 38)"},
    {S "-}", NULL, "at byte 37 (line 1, column 38)"},
    {S "1e400}", NULL, "at byte 41 (line 1, column 42)"},  /* overflows a double */
    /* strings (section 7): a raw control character, a bad escape, a lone
     * surrogate escape */
    {"{\"model\":\"smol\",\"prompt\":\"a\tb\"}", NULL, "at byte 27 (line 1, column 28)"},
    {"{\"model\":\"smol\",\"prompt\":\"a\x1f\"}", NULL, "at byte 27 (line 1, column 28)"},
    {"{\"model\":\"smol\",\"prompt\":\"\\x\"}", NULL, "at byte 28 (line 1, column 29)"},
    {"{\"model\":\"smol\",\"prompt\":\"\\ud800\"}", NULL, "at byte 33 (line 1, column 34)"},
    {"{\"model\":\"smol\",\"prompt\":\"\\udc00\\ud800\"}", NULL, "at byte 39"},
    /* invalid UTF-8 (section 8.1) keeps naming its top-level field */
    {"{\"model\":\"smol\",\"prompt\":\"a\xFF\"}", "prompt", "at byte 27 (line 1, column 28)"},
    {"{\"model\":\"smol\",\"prompt\":\"\xC3\xA9\xC0\xAF\"}", "prompt", "at byte 28 (line 1, column 28)"},
    /* duplicate keys (section 4: names SHOULD be unique; a proxy may read
     * the other one): the message names the key and where it starts */
    {P "\"stream\":true,\"stream\":false}", NULL,
     "duplicate key \"stream\" at byte 43 (line 1, column 44)"},
    {P "\"logit_bias\":{\"11\":1,\"11\":2}}", NULL,
     "duplicate key \"11\" at byte 50 (line 1, column 51)"},
    {P "\"st\\u0072eam\":true,\"stream\":false}", NULL, "duplicate key \"stream\" at byte 48"},
    {"{\"model\":\"smol\",\n \"model\":\"smol\",\"prompt\":\"a\"}", NULL,
     "duplicate key \"model\" at byte 18 (line 2, column 2)"},
    /* structure (sections 2, 4, 5): trailing garbage and commas */
    {P "\"n\":1} x", NULL, "at byte 37 (line 1, column 38)"},
    {P "\"n\":1,}", NULL, "at byte 36 (line 1, column 37)"},
    {P "\"stop\":[\"a\",]}", NULL, "at byte 42 (line 1, column 43)"},
};

static void test_strict_json(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(strict_bad) / sizeof(strict_bad[0]); i++) {
        const struct strict_case *c = &strict_bad[i];
        dsq_completion_req_t r;
        dsq_api_error_t e;
        memset(&e, 0, sizeof(e));
        if (dsq_openai_parse_completion(c->body, strlen(c->body), &LIM, &r, &e) != DSQ_EINVAL)
            fail_msg("case %zu accepted: %s", i, c->body);
        if (!strstr(e.message, c->want))
            fail_msg("case %zu (%s): message '%s' lacks '%s'", i, c->body,
                     e.message, c->want);
        if (strcmp(e.param, c->param ? c->param : ""))
            fail_msg("case %zu (%s): param '%s', want '%s'", i, c->body,
                     e.param, c->param ? c->param : "");
        check_error_json(&e, 400, c->param, NULL);
        assert_int_equal(e.kind, DSQ_APIERR_INVALID_REQUEST);
    }
}

/* Every parser takes the same strict path: a duplicate key inside a chat
 * message object, in a tokenize and a detokenize body. */
static void test_strict_json_routes(void **state)
{
    const char *chat = "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\","
                       "\"content\":\"a\",\"role\":\"system\"}]}";
    const char *tok = "{\"prompt\":\"a\",\"prompt\":\"b\"}";
    const char *detok = "{\"tokens\":[1],\"tokens\":[2]}";
    dsq_completion_req_t r;
    dsq_api_error_t e;
    char *p = NULL;
    size_t len = 0;
    bool add = false;
    int32_t *ids = NULL;
    int n = 0;
    (void)state;
    memset(&e, 0, sizeof(e));
    assert_int_equal(dsq_openai_parse_chat(chat, strlen(chat), &LIM, &r, &e), DSQ_EINVAL);
    assert_non_null(strstr(e.message, "duplicate key \"role\" at byte 57 (line 1, column 58)"));
    assert_null(r.messages);
    memset(&e, 0, sizeof(e));
    assert_int_equal(dsq_openai_parse_tokenize(tok, strlen(tok), &LIM, &p, &len, &add, &e),
                     DSQ_EINVAL);
    assert_non_null(strstr(e.message, "duplicate key \"prompt\" at byte 14"));
    memset(&e, 0, sizeof(e));
    assert_int_equal(dsq_openai_parse_detokenize(detok, strlen(detok), &LIM, &ids, &n, &e),
                     DSQ_EINVAL);
    assert_non_null(strstr(e.message, "duplicate key \"tokens\" at byte 14"));
}

/* What strictness must not break: integers past 2^63 (seeds are often
 * sent as uint64), the edges of a double, -0, escapes (surrogate pairs
 * too), whitespace around the value, a C string's NUL terminator after it,
 * nesting to cJSON's limit; and nesting past it still names a position. */
static void test_strict_json_good(void **state)
{
    static const char *good[] = {
        P "\"x\":18446744073709551615}",
        P "\"x\":-9223372036854775808,\"y\":123456789012345678901234567890}",
        P "\"x\":1e308,\"y\":-1.5E-300,\"z\":4.9e-324,\"w\":1e-400}",
        P "\"x\":-0,\"y\":0.0e+0,\"z\":-0.0}",
        "{\"model\":\"smol\",\"prompt\":\"\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\b\\f\\n\\r\\t\"}",
        "{\"model\":\"smol\",\"prompt\":\"\xC3\xA9\xF0\x9F\x98\x80\"}",
        " \t\r\n{\"model\":\"smol\" , \"prompt\" : \"a\"}\r\n \t",
        "{\"model\":\"smol\",\"prompt\":\"a\"}\n",
        /* the same key in two different objects is fine */
        "{\"model\":\"smol\",\"prompt\":\"a\",\"x\":{\"model\":1,\"y\":{\"model\":2}}}",
        P "\"seed\":9007199254740991}",
    };
    dsq_completion_req_t r;
    dsq_api_error_t e;
    char deep[2 * 1000 + 64], *d;
    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        memset(&e, 0, sizeof(e));
        if (dsq_openai_parse_completion(good[i], strlen(good[i]), &LIM, &r, &e) != 0)
            fail_msg("case %zu refused: %s: %s", i, good[i], e.message);
        dsq_completion_req_deinit(&r);
    }
    {
        /* a C string's terminator after the value is not JSON whitespace */
        const char nul[] = "{\"model\":\"smol\",\"prompt\":\"a\"}\0";
        assert_int_not_equal(dsq_openai_parse_completion(nul, sizeof(nul), &LIM, &r, &e), 0);
        assert_non_null(strstr(e.message, "NUL byte"));
    }
    /* the object plus 999 arrays: cJSON's nesting limit of 1000, as today */
    d = deep + sprintf(deep, P "\"x\":");
    for (int i = 0; i < 999; i++)
        *d++ = '[';
    for (int i = 0; i < 999; i++)
        *d++ = ']';
    *d++ = '}';
    assert_int_equal(dsq_openai_parse_completion(deep, (size_t)(d - deep), &LIM, &r, &e), 0);
    dsq_completion_req_deinit(&r);
    /* one more level: refused, and the message says where */
    d = deep + sprintf(deep, P "\"x\":");
    for (int i = 0; i < 1000; i++)
        *d++ = '[';
    for (int i = 0; i < 1000; i++)
        *d++ = ']';
    *d++ = '}';
    memset(&e, 0, sizeof(e));
    assert_int_equal(dsq_openai_parse_completion(deep, (size_t)(d - deep), &LIM, &r, &e),
                     DSQ_EINVAL);
    assert_non_null(strstr(e.message, "at byte "));
    assert_non_null(strstr(e.message, "(line 1, column "));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_constraint_fields),
        cmocka_unit_test(test_int_messages),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_all_fields),
        cmocka_unit_test(test_prompt_forms),
        cmocka_unit_test(test_tiny_sampling_values),
        cmocka_unit_test(test_context_length),
        cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_tokenize_bodies),
        cmocka_unit_test(test_response_and_chunks),
        cmocka_unit_test(test_utf8_clean),
        cmocka_unit_test(test_api_fields),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_chat_parse),
        cmocka_unit_test(test_chat_response_and_chunks),
        cmocka_unit_test(test_strict_json),
        cmocka_unit_test(test_strict_json_routes),
        cmocka_unit_test(test_strict_json_good),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

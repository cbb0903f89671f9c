/* tests for server/responses.c: Responses requests translated into the
 * chat requests they mean (and taken by the real chat parser), refusals
 * naming the field, the response object and the streamed event sequence.
 * Expected JSON is written out by hand from OpenAI's Responses API
 * reference (request, response object, streaming events), not produced by
 * the code under test; generated ids are checked by prefix and then
 * replaced before the trees are compared. */
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
#include "server/openai.h"
#include "server/responses.h"

static const dsq_openai_limits_t LIM = {"smol", 1000, 0};

static void check_translation(const char *body, const char *want_chat, const char *want_echo)
{
    dsq_responses_req_t r;
    dsq_api_error_t e;
    if (dsq_responses_to_chat(body, strlen(body), &r, &e))
        fail_msg("refused: %s (%s)", e.message, body);
    cJSON *got = cJSON_Parse(r.chat_body), *exp = cJSON_Parse(want_chat);
    assert_non_null(exp);
    if (!cJSON_Compare(got, exp, true))
        fail_msg("translation of\n  %s\nis\n  %s\nwant\n  %s", body, r.chat_body, want_chat);
    cJSON_Delete(got);
    cJSON_Delete(exp);
    if (want_echo) {
        exp = cJSON_Parse(want_echo);
        assert_non_null(exp);
        char *s = cJSON_PrintUnformatted(r.echo);
        if (!cJSON_Compare(r.echo, exp, true))
            fail_msg("echo\n  %s\nwant\n  %s", s, want_echo);
        free(s);
        cJSON_Delete(exp);
    }
    dsq_responses_req_deinit(&r);
}

static void test_translate(void **state)
{
    (void)state;
    /* a string input, defaults echoed as OpenAI's response object has them */
    check_translation(
        "{\"model\":\"smol\",\"input\":\"Hi\",\"instructions\":\"Be brief.\","
        "\"max_output_tokens\":32,\"temperature\":0.2,\"stream\":true}",
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":32,\"temperature\":0.2,"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
        "{\"instructions\":\"Be brief.\",\"max_output_tokens\":32,\"temperature\":0.2,"
        "\"top_p\":1.0,\"tools\":[],\"tool_choice\":\"auto\",\"parallel_tool_calls\":true,"
        "\"text\":{\"format\":{\"type\":\"text\"}},\"reasoning\":{\"effort\":null,"
        "\"summary\":null},\"metadata\":{},\"user\":null}");
    /* items: a function call round, parts joined, reasoning dropped, a
     * function tool and a named choice, text.format json_schema */
    check_translation(
        "{\"model\":\"smol\",\"store\":false,\"input\":["
        "{\"role\":\"developer\",\"content\":\"D\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
        "\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\","
        "\"arguments\":\"{\\\"x\\\":1}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"42\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"f\",\"arguments\":\"{}\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"F\","
        "\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\",\"schema\":"
        "{\"type\":\"object\"},\"strict\":true}}}",
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"developer\",\"content\":\"D\"},"
        "{\"role\":\"user\",\"content\":\"a\\nb\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"call_1\"},"
        "{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":[{\"id\":\"call_2\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"F\","
        "\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\","
        "\"schema\":{\"type\":\"object\"},\"strict\":true}}}",
        NULL);
}

static void test_translation_parses_as_chat(void **state)
{
    (void)state;
    const char *body = "{\"model\":\"smol\",\"input\":\"Hi\",\"max_output_tokens\":9,"
                       "\"top_p\":0.5,\"tools\":[{\"type\":\"function\",\"name\":\"f\","
                       "\"parameters\":{\"type\":\"object\"}}],\"tool_choice\":\"required\","
                       "\"parallel_tool_calls\":false}";
    dsq_responses_req_t a;
    dsq_completion_req_t r;
    dsq_api_error_t e;
    assert_int_equal(dsq_responses_to_chat(body, strlen(body), &a, &e), 0);
    if (dsq_openai_parse_chat(a.chat_body, a.chat_body_len, &LIM, &r, &e))
        fail_msg("chat parser refused %s: %s", a.chat_body, e.message);
    assert_int_equal(r.sp.max_tokens, 9);
    assert_true(r.sp.top_p == 0.5f);
    assert_int_equal(r.tool_choice, DSQ_TOOL_CHOICE_REQUIRED);
    assert_false(r.parallel_tool_calls);
    assert_false(r.stream);
    dsq_completion_req_deinit(&r);
    dsq_responses_req_deinit(&a);
    /* json_schema through text.format compiles a grammar */
    body = "{\"model\":\"smol\",\"input\":\"Hi\",\"text\":{\"format\":{\"type\":\"json_schema\","
           "\"name\":\"s\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":"
           "{\"type\":\"integer\"}}}}}}";
    assert_int_equal(dsq_responses_to_chat(body, strlen(body), &a, &e), 0);
    if (dsq_openai_parse_chat(a.chat_body, a.chat_body_len, &LIM, &r, &e))
        fail_msg("chat parser refused %s: %s", a.chat_body, e.message);
    assert_non_null(r.sp.grammar);
    dsq_completion_req_deinit(&r);
    dsq_responses_req_deinit(&a);
}

typedef struct bad {
    const char *body;
    dsq_apierr_t kind;
    const char *param;
} bad_t;

static const bad_t bad[] = {
    {"{\"model\":\"smol\"}", DSQ_APIERR_INVALID_REQUEST, "input"},
    {"{\"model\":\"smol\",\"input\":[]}", DSQ_APIERR_INVALID_REQUEST, "input"},
    {"{\"model\":\"smol\",\"input\":5}", DSQ_APIERR_INVALID_REQUEST, "input"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"store\":true}", DSQ_APIERR_UNSUPPORTED, "store"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"previous_response_id\":\"resp_1\"}",
     DSQ_APIERR_UNSUPPORTED, "previous_response_id"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"conversation\":\"conv_1\"}", DSQ_APIERR_UNSUPPORTED,
     "conversation"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"background\":true}", DSQ_APIERR_UNSUPPORTED,
     "background"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"truncation\":\"auto\"}", DSQ_APIERR_UNSUPPORTED,
     "truncation"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"max_tool_calls\":2}", DSQ_APIERR_UNSUPPORTED,
     "max_tool_calls"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"top_logprobs\":2}", DSQ_APIERR_UNSUPPORTED,
     "top_logprobs"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"instructions\":5}", DSQ_APIERR_INVALID_REQUEST,
     "instructions"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"max_output_tokens\":0}", DSQ_APIERR_INVALID_REQUEST,
     "max_output_tokens"},
    {"{\"model\":\"smol\",\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
     DSQ_APIERR_INVALID_REQUEST, "input"},
    {"{\"model\":\"smol\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
     "\"image_url\":\"http://x\"}]}]}", DSQ_APIERR_UNSUPPORTED, "input"},
    {"{\"model\":\"smol\",\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}",
     DSQ_APIERR_UNSUPPORTED, "input"},
    {"{\"model\":\"smol\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}",
     DSQ_APIERR_INVALID_REQUEST, "input"},
    {"{\"model\":\"smol\",\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}",
     DSQ_APIERR_INVALID_REQUEST, "input"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"tools\":[{\"type\":\"web_search\"}]}",
     DSQ_APIERR_UNSUPPORTED, "tools"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"tools\":[{\"name\":\"f\"}]}",
     DSQ_APIERR_INVALID_REQUEST, "tools"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"tool_choice\":{\"type\":\"web_search\"}}",
     DSQ_APIERR_UNSUPPORTED, "tool_choice"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"text\":{\"format\":{\"type\":\"xml\"}}}",
     DSQ_APIERR_INVALID_REQUEST, "text.format"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"reasoning\":\"high\"}", DSQ_APIERR_INVALID_REQUEST,
     "reasoning"},
    {"{\"model\":\"smol\",\"input\":\"a\",\"metadata\":[]}", DSQ_APIERR_INVALID_REQUEST,
     "metadata"},
};

static void test_bad_requests(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dsq_responses_req_t a;
        dsq_api_error_t e;
        memset(&e, 0, sizeof(e));
        if (dsq_responses_to_chat(bad[i].body, strlen(bad[i].body), &a, &e) != DSQ_EINVAL)
            fail_msg("taken: %s", bad[i].body);
        assert_null(a.chat_body);
        assert_null(a.echo);
        if (e.kind != bad[i].kind || strcmp(e.param, bad[i].param))
            fail_msg("%s: kind %d param '%s' (%s), want kind %d param '%s'", bad[i].body,
                     e.kind, e.param, e.message, bad[i].kind, bad[i].param);
    }
}

/* Replace every "id" of output items (random) by its prefix, after checking
 * it has one. */
static void mask_ids(cJSON *v)
{
    for (cJSON *c = v ? v->child : NULL; c; c = c->next) {
        if (c->string && (!strcmp(c->string, "id") || !strcmp(c->string, "item_id") ||
                          !strcmp(c->string, "call_id")) &&
            cJSON_IsString(c)) {
            const char *us = strchr(c->valuestring, '_');
            assert_non_null(us);
            assert_int_equal(strlen(us + 1), 32);
            char p[16];
            snprintf(p, sizeof(p), "%.*s", (int)(us - c->valuestring + 1), c->valuestring);
            cJSON_SetValuestring(c, p);
        }
        mask_ids(c);
    }
}

static void check_json(const char *got, const char *want)
{
    cJSON *g = cJSON_Parse(got), *w = cJSON_Parse(want);
    assert_non_null(g);
    assert_non_null(w);
    mask_ids(g);
    if (!cJSON_Compare(g, w, true)) {
        char *s = cJSON_PrintUnformatted(g);
        fail_msg("got\n  %s\nwant\n  %s", s, want);
    }
    cJSON_Delete(g);
    cJSON_Delete(w);
}

#define HEAD(status)                                                                       \
    "\"object\":\"response\",\"created_at\":7,\"status\":\"" status "\",\"error\":null,"
#define ECHO                                                                               \
    "\"model\":\"smol\",\"temperature\":1.0,\"tools\":[],\"store\":false,"                 \
    "\"previous_response_id\":null,\"truncation\":\"disabled\",\"background\":false"

static void test_body(void **state)
{
    (void)state;
    cJSON *echo = cJSON_Parse("{\"temperature\":1.0,\"tools\":[]}");
    dsq_responses_meta_t m = {"resp_00112233445566778899aabbccddeeff", 7, "smol", echo};
    dsq_tool_call_out_t calls[] = {{"call_0123456789abcdef0123456789abcdef", "f", "{\"x\":1}"}};
    dsq_chat_choice_out_t ch = {.content = "Hi", .content_len = 2, .reasoning = "hm",
                                .reasoning_len = 2, .tool_calls = calls, .n_tool_calls = 1,
                                .finish = DSQ_FINISH_STOP};
    dsq_usage_t u = {.prompt_tokens = 10, .completion_tokens = 5, .cached_tokens = 8};
    char *b = dsq_responses_body(&m, &ch, &u);
    check_json(b,
               "{\"id\":\"resp_\"," HEAD("completed") "\"incomplete_details\":null," ECHO ","
               "\"output\":[{\"type\":\"reasoning\",\"id\":\"rs_\",\"summary\":[],\"content\":"
               "[{\"type\":\"reasoning_text\",\"text\":\"hm\"}]},"
               "{\"type\":\"message\",\"id\":\"msg_\",\"status\":\"completed\",\"role\":"
               "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\","
               "\"annotations\":[],\"logprobs\":[]}]},"
               "{\"type\":\"function_call\",\"id\":\"fc_\",\"call_id\":\"call_\",\"name\":\"f\","
               "\"arguments\":\"{\\\"x\\\":1}\",\"status\":\"completed\"}],"
               "\"usage\":{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":8},"
               "\"output_tokens\":5,\"output_tokens_details\":{\"reasoning_tokens\":0},"
               "\"total_tokens\":15}}");
    free(b);
    /* cut at max_output_tokens: incomplete */
    ch = (dsq_chat_choice_out_t){.content = "ab", .content_len = 2,
                                 .finish = DSQ_FINISH_LENGTH};
    b = dsq_responses_body(&m, &ch, &u);
    check_json(b,
               "{\"id\":\"resp_\"," HEAD("incomplete") "\"incomplete_details\":{\"reason\":"
               "\"max_output_tokens\"}," ECHO ",\"output\":[{\"type\":\"message\",\"id\":"
               "\"msg_\",\"status\":\"incomplete\",\"role\":\"assistant\",\"content\":[{\"type\":"
               "\"output_text\",\"text\":\"ab\",\"annotations\":[],\"logprobs\":[]}]}],"
               "\"usage\":{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":8},"
               "\"output_tokens\":5,\"output_tokens_details\":{\"reasoning_tokens\":0},"
               "\"total_tokens\":15}}");
    free(b);
    cJSON_Delete(echo);
}

/* The streamed events parsed back: their types in order, sequence numbers
 * 0, 1, 2, ..., output indexes, and the completed response's output equal
 * to the items done. */
static void test_stream(void **state)
{
    (void)state;
    cJSON *echo = cJSON_Parse("{}");
    dsq_responses_meta_t m = {"resp_00112233445566778899aabbccddeeff", 7, "smol", echo};
    dsq_responses_stream_t st = {0};
    dsq_tool_call_out_t calls[] = {{"call_0123456789abcdef0123456789abcdef", "f", "{}"}};
    dsq_usage_t u = {.prompt_tokens = 3, .completion_tokens = 4};
    char *parts[7] = {
        dsq_responses_ev_start(&st, &m),
        dsq_responses_ev_text(&st, true, "th", 2),
        dsq_responses_ev_text(&st, false, "Hel", 3),
        dsq_responses_ev_text(&st, false, "lo", 2),
        dsq_responses_ev_text(&st, false, "", 0),
        dsq_responses_ev_calls(&st, calls, 1),
        dsq_responses_ev_end(&st, &m, DSQ_FINISH_STOP, &u),
    };
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    };
    static const int index[] = {-1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, -1};
    int k = 0;
    cJSON *last = NULL;
    for (int p = 0; p < 7; p++) {
        assert_non_null(parts[p]);
        char *save = NULL;
        for (char *ev = strtok_r(parts[p], "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
            char name[64];
            assert_int_equal(sscanf(ev, "event: %63s", name), 1);
            char *data = strtok_r(NULL, "\n", &save);
            assert_non_null(data);
            assert_true(!strncmp(data, "data: ", 6));
            cJSON *o = cJSON_Parse(data + 6);
            assert_non_null(o);
            assert_true(k < (int)(sizeof(want) / sizeof(want[0])));
            if (strcmp(name, want[k]))
                fail_msg("event %d is %s, want %s", k, name, want[k]);
            assert_string_equal(cJSON_GetObjectItem(o, "type")->valuestring, want[k]);
            assert_int_equal(cJSON_GetObjectItem(o, "sequence_number")->valueint, k);
            if (index[k] >= 0)
                assert_int_equal(cJSON_GetObjectItem(o, "output_index")->valueint, index[k]);
            if (!strcmp(name, "response.output_text.done"))
                assert_string_equal(cJSON_GetObjectItem(o, "text")->valuestring, "Hello");
            cJSON_Delete(last);
            last = o;
            k++;
        }
        free(parts[p]);
    }
    assert_int_equal(k, (int)(sizeof(want) / sizeof(want[0])));
    cJSON *r = cJSON_GetObjectItem(last, "response");
    assert_string_equal(cJSON_GetObjectItem(r, "status")->valuestring, "completed");
    char *out = cJSON_PrintUnformatted(cJSON_GetObjectItem(r, "output"));
    check_json(out,
               "[{\"type\":\"reasoning\",\"id\":\"rs_\",\"summary\":[],\"content\":"
               "[{\"type\":\"reasoning_text\",\"text\":\"th\"}]},"
               "{\"type\":\"message\",\"id\":\"msg_\",\"status\":\"completed\",\"role\":"
               "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hello\","
               "\"annotations\":[],\"logprobs\":[]}]},"
               "{\"type\":\"function_call\",\"id\":\"fc_\",\"call_id\":\"call_\",\"name\":\"f\","
               "\"arguments\":\"{}\",\"status\":\"completed\"}]");
    free(out);
    cJSON_Delete(last);
    dsq_responses_stream_free(&st);
    /* cut at the limit: the message item is incomplete in its done event
     * and in response.incomplete, as unstreamed; an answer with no text
     * at all is one empty message item */
    for (int empty = 0; empty < 2; empty++) {
        dsq_responses_stream_t s2 = {0};
        char *a = dsq_responses_ev_start(&s2, &m);
        char *t = dsq_responses_ev_text(&s2, false, "ab", empty ? 0 : 2);
        char *e = dsq_responses_ev_end(&s2, &m, DSQ_FINISH_LENGTH, &u);
        assert_non_null(a);
        assert_non_null(t);
        assert_non_null(e);
        assert_non_null(strstr(e, "event: response.output_item.done\n"));
        assert_non_null(strstr(e, "event: response.incomplete\n"));
        assert_null(strstr(e, "\"status\":\"completed\""));
        assert_non_null(strstr(e, empty ? "\"text\":\"\"" : "\"text\":\"ab\""));
        if (empty)
            assert_non_null(strstr(e, "event: response.output_item.added\n"));
        free(a);
        free(t);
        free(e);
        dsq_responses_stream_free(&s2);
    }
    cJSON_Delete(echo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translate),
        cmocka_unit_test(test_translation_parses_as_chat),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_body),
        cmocka_unit_test(test_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* tests for server/anthropic.c: Messages requests translated into the chat
 * requests they mean (and then taken by the real chat parser), refusals
 * naming the field, the message object, the SSE event sequence and the
 * error object. Expected JSON is written out by hand from Anthropic's
 * Messages API reference (request and response shapes, "Streaming
 * Messages" event flow), not produced by the code under test; JSON is
 * compared as trees (cJSON_Compare), SSE text byte for byte. */
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
#include "server/anthropic.h"
#include "server/openai.h"

static const dsq_openai_limits_t LIM = {"smol", 1000, 0};

/* body -> translated chat body, compared with want as JSON trees */
static void check_translation(const char *body, bool count_only, const char *want)
{
    dsq_anthropic_req_t r;
    dsq_api_error_t e;
    int rc = dsq_anthropic_to_chat(body, strlen(body), count_only, &r, &e);
    if (rc)
        fail_msg("refused: %s (%s)", e.message, body);
    cJSON *got = cJSON_Parse(r.chat_body), *exp = cJSON_Parse(want);
    assert_non_null(exp);
    if (!cJSON_Compare(got, exp, true))
        fail_msg("translation of\n  %s\nis\n  %s\nwant\n  %s", body, r.chat_body, want);
    cJSON_Delete(got);
    cJSON_Delete(exp);
    dsq_anthropic_req_deinit(&r);
}

static void test_translate_basic(void **state)
{
    (void)state;
    check_translation(
        "{\"model\":\"smol\",\"max_tokens\":64,\"system\":\"Be brief.\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"stop_sequences\":[\"END\",\"\\n\\n\"],"
        "\"metadata\":{\"user_id\":\"u1\"},\"stream\":true}",
        false,
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":64,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"stop\":[\"END\",\"\\n\\n\"]}");
    /* system as text blocks (cache_control ignored), content blocks joined */
    check_translation(
        "{\"model\":\"smol\",\"max_tokens\":8,\"system\":[{\"type\":\"text\",\"text\":\"A\"},"
        "{\"type\":\"text\",\"text\":\"B\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
        "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},"
        "{\"type\":\"text\",\"text\":\"y\"}]},{\"role\":\"assistant\",\"content\":\"z\"}]}",
        false,
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"system\",\"content\":\"A\\nB\"},"
        "{\"role\":\"user\",\"content\":\"x\\ny\"},{\"role\":\"assistant\",\"content\":\"z\"}],"
        "\"max_tokens\":8}");
    /* output_config.format -> response_format; effort not read */
    check_translation(
        "{\"model\":\"smol\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
        "\"output_config\":{\"effort\":\"low\",\"format\":{\"type\":\"json_schema\",\"schema\":"
        "{\"type\":\"object\"}}}}",
        false,
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":8,"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"output\","
        "\"schema\":{\"type\":\"object\"}}}}");
    /* count_tokens: no max_tokens needed, sampling fields not carried */
    check_translation(
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
        "\"temperature\":0.1}",
        true, "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
}

static void test_translate_tools(void **state)
{
    (void)state;
    /* a whole tool round: the call as tool_use, its result as tool_result
     * (string and block content), text after the result stays after it,
     * thinking blocks of earlier turns dropped */
    check_translation(
        "{\"model\":\"smol\",\"max_tokens\":100,"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather\","
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}},"
        "{\"type\":\"custom\",\"name\":\"t2\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris and Rome?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
        "\"signature\":\"s\"},{\"type\":\"text\",\"text\":\"Looking.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
        "\"input\":{\"city\":\"Paris\"}},{\"type\":\"tool_use\",\"id\":\"toolu_2\","
        "\"name\":\"get_weather\",\"input\":{\"city\":\"Rome\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":\"18C\"},{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\","
        "\"content\":[{\"type\":\"text\",\"text\":\"25C\"}],\"is_error\":false},"
        "{\"type\":\"text\",\"text\":\"Thanks\"}]}]}",
        false,
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"Weather in Paris and Rome?\"},{\"role\":\"assistant\",\"content\":\"Looking.\","
        "\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},{\"id\":\"toolu_2\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Rome\\\"}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"18C\",\"tool_call_id\":\"toolu_1\"},"
        "{\"role\":\"tool\",\"content\":\"25C\",\"tool_call_id\":\"toolu_2\"},"
        "{\"role\":\"user\",\"content\":\"Thanks\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"city\":{\"type\":\"string\"}}}}},{\"type\":\"function\",\"function\":{\"name\":"
        "\"t2\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,\"max_tokens\":100}");
    /* an assistant turn of calls only: content null; named and none choices */
    check_translation(
        "{\"model\":\"smol\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
        "\"content\":[{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"f\",\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"i\"}]}]}",
        false,
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"i\",\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"\",\"tool_call_id\":\"i\"}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
        "\"max_tokens\":5}");
    check_translation(
        "{\"model\":\"smol\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"none\"},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
        false,
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
        "\"tool_choice\":\"none\",\"max_tokens\":5}");
}

/* The translation is for the chat parser: what it makes is taken by it,
 * with the fields landing where /v1/chat/completions puts them. */
static void test_translation_parses_as_chat(void **state)
{
    (void)state;
    const char *body =
        "{\"model\":\"smol\",\"max_tokens\":64,\"system\":\"S\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0.5,"
        "\"top_k\":7,\"stop_sequences\":[\"END\"],\"stream\":true,"
        "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}}";
    dsq_anthropic_req_t a;
    dsq_completion_req_t r;
    dsq_api_error_t e;
    assert_int_equal(dsq_anthropic_to_chat(body, strlen(body), false, &a, &e), 0);
    if (dsq_openai_parse_chat(a.chat_body, a.chat_body_len, &LIM, &r, &e))
        fail_msg("chat parser refused %s: %s", a.chat_body, e.message);
    assert_int_equal(r.sp.max_tokens, 64);
    assert_true(r.sp.temperature == 0.5f);
    assert_int_equal(r.sp.top_k, 7);
    assert_int_equal(r.sp.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.sp.n, 1);
    assert_int_equal(r.tool_choice, DSQ_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_name, "f");
    assert_int_equal(cJSON_GetArraySize(r.messages), 2);
    dsq_completion_req_deinit(&r);
    dsq_anthropic_req_deinit(&a);
    /* the model name is still checked: 404 naming "model" */
    body = "{\"model\":\"claude-x\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\","
           "\"content\":\"a\"}]}";
    assert_int_equal(dsq_anthropic_to_chat(body, strlen(body), false, &a, &e), 0);
    assert_int_equal(dsq_openai_parse_chat(a.chat_body, a.chat_body_len, &LIM, &r, &e),
                     DSQ_EINVAL);
    assert_int_equal(e.kind, DSQ_APIERR_MODEL_NOT_FOUND);
    assert_string_equal(dsq_anthropic_error_type(e.kind), "not_found_error");
    dsq_anthropic_req_deinit(&a);
}

static void test_thinking(void **state)
{
    (void)state;
    dsq_anthropic_req_t a;
    dsq_api_error_t e;
    const char *off = "{\"model\":\"smol\",\"max_tokens\":4,\"thinking\":{\"type\":\"disabled\"},"
                      "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}";
    const char *on = "{\"model\":\"smol\",\"max_tokens\":4096,\"thinking\":{\"type\":\"enabled\","
                     "\"budget_tokens\":2048},\"messages\":[{\"role\":\"user\","
                     "\"content\":\"a\"}]}";
    assert_int_equal(dsq_anthropic_to_chat(off, strlen(off), false, &a, &e), 0);
    assert_true(a.thinking_off);
    assert_int_equal(a.thinking_budget, 0);
    assert_non_null(strstr(a.chat_body, "\"thinking_budget\":0"));
    dsq_anthropic_req_deinit(&a);
    assert_int_equal(dsq_anthropic_to_chat(on, strlen(on), false, &a, &e), 0);
    assert_false(a.thinking_off);
    assert_int_equal(a.thinking_budget, 2048);
    assert_non_null(strstr(a.chat_body, "\"thinking_budget\":2048"));
    dsq_anthropic_req_deinit(&a);
    const char *none = "{\"model\":\"smol\",\"max_tokens\":4,"
                       "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}";
    assert_int_equal(dsq_anthropic_to_chat(none, strlen(none), false, &a, &e), 0);
    assert_int_equal(a.thinking_budget, -1);
    assert_null(strstr(a.chat_body, "thinking_budget"));
    dsq_anthropic_req_deinit(&a);
    /* adaptive: the model decides (no budget); display omitted hides it */
    const char *ad = "{\"model\":\"smol\",\"max_tokens\":4,\"thinking\":{\"type\":\"adaptive\","
                     "\"display\":\"omitted\"},\"messages\":[{\"role\":\"user\","
                     "\"content\":\"a\"}]}";
    assert_int_equal(dsq_anthropic_to_chat(ad, strlen(ad), false, &a, &e), 0);
    assert_int_equal(a.thinking_budget, -1);
    assert_true(a.thinking_off);
    dsq_anthropic_req_deinit(&a);
}

typedef struct bad {
    const char *body;
    dsq_apierr_t kind;
    const char *param;
} bad_t;

#define U "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]"
static const bad_t bad[] = {
    {"", DSQ_APIERR_INVALID_REQUEST, ""},
    {"[1]", DSQ_APIERR_INVALID_REQUEST, ""},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"x\":1,\"x\":2," U "}", DSQ_APIERR_INVALID_REQUEST, ""},
    {"{\"model\":\"smol\"," U "}", DSQ_APIERR_INVALID_REQUEST, "max_tokens"},
    {"{\"model\":\"smol\",\"max_tokens\":4}", DSQ_APIERR_INVALID_REQUEST, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[]}", DSQ_APIERR_INVALID_REQUEST,
     "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[{\"role\":\"system\",\"content\":\"a\"}]}",
     DSQ_APIERR_INVALID_REQUEST, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":5}]}",
     DSQ_APIERR_INVALID_REQUEST, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
     "[{\"type\":\"image\",\"source\":{}}]}]}", DSQ_APIERR_UNSUPPORTED, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
     "[{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"f\",\"input\":{}}]}]}",
     DSQ_APIERR_INVALID_REQUEST, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[{\"role\":\"assistant\",\"content\":"
     "[{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"f\",\"input\":\"{}\"}]}]}",
     DSQ_APIERR_INVALID_REQUEST, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
     "[{\"type\":\"tool_result\",\"content\":\"x\"}]}]}", DSQ_APIERR_INVALID_REQUEST, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
     "[{\"text\":\"x\"}]}]}", DSQ_APIERR_INVALID_REQUEST, "messages"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"system\":5," U "}", DSQ_APIERR_INVALID_REQUEST,
     "system"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"system\":[{\"type\":\"image\"}]," U "}",
     DSQ_APIERR_UNSUPPORTED, "system"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"],"
     U "}", DSQ_APIERR_INVALID_REQUEST, "stop_sequences"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"stop_sequences\":\"a\"," U "}",
     DSQ_APIERR_INVALID_REQUEST, "stop_sequences"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"stop_sequences\":[\"\"]," U "}",
     DSQ_APIERR_INVALID_REQUEST, "stop_sequences"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"tools\":[{\"type\":\"web_search_20250305\","
     "\"name\":\"web_search\"}]," U "}", DSQ_APIERR_UNSUPPORTED, "tools"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"tools\":[{\"name\":\"f\"}]," U "}",
     DSQ_APIERR_INVALID_REQUEST, "tools"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"tools\":{}," U "}", DSQ_APIERR_INVALID_REQUEST,
     "tools"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"tool_choice\":\"auto\"," U "}",
     DSQ_APIERR_INVALID_REQUEST, "tool_choice"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"tool_choice\":{\"type\":\"tool\"}," U "}",
     DSQ_APIERR_INVALID_REQUEST, "tool_choice"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"tool_choice\":{\"type\":\"some\"}," U "}",
     DSQ_APIERR_INVALID_REQUEST, "tool_choice"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"thinking\":{\"type\":\"enabled\"}," U "}",
     DSQ_APIERR_INVALID_REQUEST, "thinking"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"thinking\":{\"type\":\"enabled\","
     "\"budget_tokens\":1.5}," U "}", DSQ_APIERR_INVALID_REQUEST, "thinking"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"thinking\":true," U "}",
     DSQ_APIERR_INVALID_REQUEST, "thinking"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"metadata\":\"x\"," U "}",
     DSQ_APIERR_INVALID_REQUEST, "metadata"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"thinking\":{\"type\":\"adaptive\",\"display\":1},"
     U "}", DSQ_APIERR_INVALID_REQUEST, "thinking"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"output_config\":{\"format\":{\"type\":\"xml\"}},"
     U "}", DSQ_APIERR_INVALID_REQUEST, "output_config"},
    {"{\"model\":\"smol\",\"max_tokens\":4,\"output_config\":5," U "}",
     DSQ_APIERR_INVALID_REQUEST, "output_config"},
};

static void test_bad_requests(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dsq_anthropic_req_t a;
        dsq_api_error_t e;
        memset(&e, 0, sizeof(e));
        if (dsq_anthropic_to_chat(bad[i].body, strlen(bad[i].body), false, &a, &e) !=
            DSQ_EINVAL)
            fail_msg("taken: %s", bad[i].body);
        assert_null(a.chat_body);
        if (e.kind != bad[i].kind || strcmp(e.param, bad[i].param))
            fail_msg("%s: kind %d param '%s' (%s), want kind %d param '%s'", bad[i].body,
                     e.kind, e.param, e.message, bad[i].kind, bad[i].param);
        assert_true(strlen(e.message) > 10);
    }
}

static void check_json(const char *got, const char *want)
{
    cJSON *g = cJSON_Parse(got), *w = cJSON_Parse(want);
    assert_non_null(g);
    assert_non_null(w);
    if (!cJSON_Compare(g, w, true))
        fail_msg("got\n  %s\nwant\n  %s", got, want);
    cJSON_Delete(g);
    cJSON_Delete(w);
}

static void test_message_body(void **state)
{
    (void)state;
    dsq_tool_call_out_t calls[] = {{"toolu_a", "get_weather", "{\"city\":\"Paris\"}"}};
    dsq_chat_choice_out_t ch = {.content = "Sure.", .content_len = 5, .reasoning = "think",
                                .reasoning_len = 5, .tool_calls = calls, .n_tool_calls = 1,
                                .finish = DSQ_FINISH_STOP};
    dsq_usage_t u = {.prompt_tokens = 20, .completion_tokens = 7, .cached_tokens = 16};
    char *b = dsq_anthropic_message_body("msg_1", "smol", &ch, true, NULL, &u);
    check_json(b,
               "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"smol\","
               "\"content\":[{\"type\":\"thinking\",\"thinking\":\"think\",\"signature\":\"\"},"
               "{\"type\":\"text\",\"text\":\"Sure.\"},{\"type\":\"tool_use\",\"id\":\"toolu_a\","
               "\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}],"
               "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":4,"
               "\"output_tokens\":7,\"cache_read_input_tokens\":16,"
               "\"cache_creation_input_tokens\":0}}");
    free(b);
    /* thinking off: no thinking block; a stop sequence; cut bytes mended */
    ch = (dsq_chat_choice_out_t){.content = "ab\xC3", .content_len = 3, .reasoning = "r",
                                 .reasoning_len = 1, .finish = DSQ_FINISH_STOP};
    u = (dsq_usage_t){.prompt_tokens = 3, .completion_tokens = 2};
    b = dsq_anthropic_message_body("msg_2", "smol", &ch, false, "END", &u);
    check_json(b,
               "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"smol\","
               "\"content\":[{\"type\":\"text\",\"text\":\"ab\\ufffd\"}],"
               "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\",\"usage\":"
               "{\"input_tokens\":3,\"output_tokens\":2,\"cache_read_input_tokens\":0,"
               "\"cache_creation_input_tokens\":0}}");
    free(b);
    /* all thinking: no empty text block beside it (the stream sends none) */
    ch = (dsq_chat_choice_out_t){.reasoning = "r", .reasoning_len = 1,
                                 .finish = DSQ_FINISH_LENGTH};
    b = dsq_anthropic_message_body("msg_3", "smol", &ch, true, NULL, &u);
    assert_non_null(strstr(b, "\"content\":[{\"type\":\"thinking\",\"thinking\":\"r\","
                              "\"signature\":\"\"}],"));
    free(b);
    b = dsq_anthropic_message_body("msg_4", "smol", &ch, false, NULL, &u);
    assert_non_null(strstr(b, "\"content\":[{\"type\":\"text\",\"text\":\"\"}],"));
    free(b);
    assert_string_equal(dsq_anthropic_stop_reason(DSQ_FINISH_LENGTH, false, false),
                        "max_tokens");
    assert_string_equal(dsq_anthropic_stop_reason(DSQ_FINISH_STOP, false, false), "end_turn");
    assert_string_equal(dsq_anthropic_stop_reason(DSQ_FINISH_LENGTH, true, false), "max_tokens");
    assert_string_equal(dsq_anthropic_stop_reason(DSQ_FINISH_ABORT, false, false), "end_turn");
}

/* take s, append to *all */
static void cat(char **all, char *s)
{
    assert_non_null(s);
    size_t a = *all ? strlen(*all) : 0, n = strlen(s);
    *all = realloc(*all, a + n + 1);
    memcpy(*all + a, s, n + 1);
    free(s);
}

/* The event flow of Anthropic's "Streaming Messages" page: message_start,
 * then per block start / deltas / stop with increasing indexes, then
 * message_delta and message_stop. */
static void test_stream_events(void **state)
{
    (void)state;
    dsq_anthropic_stream_t st = {0};
    dsq_tool_call_out_t calls[] = {{"toolu_a", "f", "{\"x\":1}"}};
    dsq_usage_t u = {.prompt_tokens = 9, .completion_tokens = 4};
    char *all = NULL;
    cat(&all, dsq_anthropic_ev_start("msg_1", "smol", 9));
    cat(&all, dsq_anthropic_ev_text(&st, true, "Hm", 2));
    cat(&all, dsq_anthropic_ev_text(&st, true, ".", 1));
    cat(&all, dsq_anthropic_ev_text(&st, false, "", 0));
    cat(&all, dsq_anthropic_ev_text(&st, false, "Hi", 2));
    cat(&all, dsq_anthropic_ev_tools(&st, calls, 1));
    cat(&all, dsq_anthropic_ev_end(&st, "tool_use", NULL, &u));
    const char *want =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\","
        "\"type\":\"message\",\"role\":\"assistant\",\"model\":\"smol\",\"content\":[],"
        "\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":9,"
        "\"output_tokens\":0,\"cache_read_input_tokens\":0,\"cache_creation_input_tokens\":0}}}"
        "\n\n"
        "event: ping\ndata: {\"type\":\"ping\"}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
        "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Hm\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\".\"}}\n\n"
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,"
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,"
        "\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"f\","
        "\"input\":{}}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,"
        "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"x\\\":1}\"}}\n\n"
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n"
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
        "\"tool_use\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":9,\"output_tokens\":4,"
        "\"cache_read_input_tokens\":0,\"cache_creation_input_tokens\":0}}\n\n"
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    if (strcmp(all, want))
        fail_msg("stream\n%s\nwant\n%s", all, want);
    free(all);
    /* an empty message: one empty text block (as the unstreamed body has
     * it), then the end */
    st = (dsq_anthropic_stream_t){0};
    all = dsq_anthropic_ev_end(&st, "max_tokens", "x", &u);
    assert_non_null(strstr(all, "\"stop_reason\":\"max_tokens\",\"stop_sequence\":\"x\""));
    assert_non_null(strstr(all, "event: content_block_start\ndata: {\"type\":"
                                "\"content_block_start\",\"index\":0,\"content_block\":"
                                "{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_stop\n"));
    free(all);
}

static void test_errors(void **state)
{
    (void)state;
    char *s = dsq_anthropic_error_json(DSQ_APIERR_AUTH, "bad key");
    check_json(s, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\","
                  "\"message\":\"bad key\"}}");
    free(s);
    s = dsq_anthropic_ev_error(DSQ_APIERR_OVERLOADED, "busy");
    assert_string_equal(s, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                           "\"overloaded_error\",\"message\":\"busy\"}}\n\n");
    free(s);
    static const struct {
        dsq_apierr_t k;
        const char *t;
    } types[] = {
        {DSQ_APIERR_INVALID_REQUEST, "invalid_request_error"},
        {DSQ_APIERR_CONTEXT_LENGTH, "invalid_request_error"},
        {DSQ_APIERR_UNSUPPORTED, "invalid_request_error"},
        {DSQ_APIERR_FORBIDDEN, "permission_error"},
        {DSQ_APIERR_NOT_FOUND, "not_found_error"},
        {DSQ_APIERR_TOO_LARGE, "request_too_large"},
        {DSQ_APIERR_RATE_LIMIT, "rate_limit_error"},
        {DSQ_APIERR_TIMEOUT, "timeout_error"},
        {DSQ_APIERR_INTERNAL, "api_error"},
        {DSQ_APIERR_UNAVAILABLE, "overloaded_error"},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        assert_string_equal(dsq_anthropic_error_type(types[i].k), types[i].t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translate_basic),
        cmocka_unit_test(test_translate_tools),
        cmocka_unit_test(test_translation_parses_as_chat),
        cmocka_unit_test(test_thinking),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_message_body),
        cmocka_unit_test(test_stream_events),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

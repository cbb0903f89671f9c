/* tests for engine/text/tool_calls.c: the DeepSeek and Hermes tool-call
 * parsers.
 *
 *  - tests/golden/tool_call_cases.jsonl (tests/ref/make_tool_call_golden.py)
 *    holds assistant turns with tool calls as the real DeepSeek-V3 and
 *    Qwen2.5 chat templates render them (Python jinja2), DeepSeek-V3.1's
 *    documented form, and malformed variants (cut before the end marker,
 *    broken arguments, no name). Each must parse to the recorded calls
 *    (names equal, arguments equal as JSON) and content; a malformed one
 *    to no calls and the whole text as content.
 *  - The parser is picked from a chat template's text; names map to
 *    parsers; the streaming hold-back offset covers a marker's prefix.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/text/tool_calls.h"
#include "test_common.h"

static void test_golden(void **state)
{
    (void)state;
    char *path = path_join("DSQ_SOURCE_ROOT", ".", "tests/golden/tool_call_cases.jsonl");
    char *text = read_all(path, NULL);
    free(path);
    int n = 0, n_calls = 0, n_malformed = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#')
            continue;
        cJSON *c = cJSON_Parse(line);
        assert_non_null(c);
        const char *pname = cJSON_GetObjectItem(c, "parser")->valuestring;
        const char *src = cJSON_GetObjectItem(c, "source")->valuestring;
        const char *t = cJSON_GetObjectItem(c, "text")->valuestring;
        const char *want_content = cJSON_GetObjectItem(c, "content")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "calls");
        dsq_tool_parser_t p;
        assert_int_equal(dsq_tool_parser_from_name(pname, &p), DSQ_OK);
        dsq_tool_parse_t r;
        assert_int_equal(dsq_tool_calls_parse(p, t, strlen(t), &r), DSQ_OK);
        if (strcmp(r.content, want_content) || r.content_len != strlen(want_content))
            fail_msg("%s (%s): content \"%s\", want \"%s\"", pname, src, r.content, want_content);
        if (r.n_calls != cJSON_GetArraySize(want))
            fail_msg("%s (%s): %d calls, want %d, in: %s", pname, src, r.n_calls,
                     cJSON_GetArraySize(want), t);
        for (int i = 0; i < r.n_calls; i++) {
            const cJSON *w = cJSON_GetArrayItem(want, i);
            assert_string_equal(r.calls[i].name, cJSON_GetObjectItem(w, "name")->valuestring);
            cJSON *got = cJSON_Parse(r.calls[i].arguments);
            if (!got || !cJSON_Compare(got, cJSON_GetObjectItem(w, "arguments"), true))
                fail_msg("%s (%s): call %d arguments %s", pname, src, i, r.calls[i].arguments);
            cJSON_Delete(got);
            n_calls++;
        }
        n_malformed += r.n_calls == 0;
        dsq_tool_parse_free(&r);
        cJSON_Delete(c);
        n++;
    }
    free(text);
    print_message("# %d cases: %d calls recovered, %d texts with none (all content)\n", n,
                  n_calls, n_malformed);
    assert_true(n >= 50 && n_calls >= 15 && n_malformed >= 30);
}

static void test_detect_names_and_prefix(void **state)
{
    (void)state;
    char *qp = path_join("DSQ_TEST_DATA", "../shared/data",
                         "tokenizers/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    char *dp = path_join("DSQ_TEST_DATA", "../shared/data",
                         "tokenizers/chat_templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    char *q = read_all(qp, NULL), *d = read_all(dp, NULL);
    assert_int_equal(dsq_tool_parser_detect(q), DSQ_TOOL_PARSER_HERMES);
    assert_int_equal(dsq_tool_parser_detect(d), DSQ_TOOL_PARSER_DEEPSEEK);
    assert_int_equal(dsq_tool_parser_detect("{{ messages }}"), DSQ_TOOL_PARSER_NONE);
    assert_int_equal(dsq_tool_parser_detect(NULL), DSQ_TOOL_PARSER_NONE);
    free(q);
    free(d);
    free(qp);
    free(dp);
    dsq_tool_parser_t p;
    assert_int_equal(dsq_tool_parser_from_name("deepseek_v31", &p), DSQ_OK);
    assert_int_equal(p, DSQ_TOOL_PARSER_DEEPSEEK);
    assert_int_equal(dsq_tool_parser_from_name("qwen", &p), DSQ_OK);
    assert_int_equal(p, DSQ_TOOL_PARSER_HERMES);
    assert_int_equal(dsq_tool_parser_from_name("mistral", &p), DSQ_EINVAL);
    /* streaming: hold back from a marker, or from a suffix that may begin one */
    const char *s = "Sure. <tool_ca";
    assert_int_equal(dsq_tool_calls_safe_prefix(DSQ_TOOL_PARSER_HERMES, s, strlen(s)), 6);
    s = "Sure. <tool_call>{";
    assert_int_equal(dsq_tool_calls_safe_prefix(DSQ_TOOL_PARSER_HERMES, s, strlen(s)), 6);
    s = "a < b";
    assert_int_equal(dsq_tool_calls_safe_prefix(DSQ_TOOL_PARSER_HERMES, s, strlen(s)), 5);
    s = "x <\xef\xbd\x9ctool";
    assert_int_equal(dsq_tool_calls_safe_prefix(DSQ_TOOL_PARSER_DEEPSEEK, s, strlen(s)), 2);
    assert_int_equal(dsq_tool_calls_safe_prefix(DSQ_TOOL_PARSER_NONE, s, strlen(s)), strlen(s));
    dsq_tool_parse_t r;
    assert_int_equal(dsq_tool_calls_parse((dsq_tool_parser_t)7, "x", 1, &r), DSQ_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_detect_names_and_prefix),
    };
    return cmocka_run_group_tests_name("tool_calls", tests, NULL, NULL);
}

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
 *  - The tool-call grammar (tool_choice required / named; the request's
 *    tools handed to the engine by server/chat.c, as dsqd does): the
 *    templates' own renderings of calls are sentences of it (exactly one
 *    call unless parallel), a call of another function or with arguments
 *    off its schema is not.
 *  - The parser is picked from a chat template's text; names map to
 *    parsers; the streaming hold-back offset covers a marker's prefix.
 *  - The calls go back into the templates (server/chat.c): an assistant
 *    turn in the wire form OpenAI clients send (content null, arguments a
 *    JSON string) renders with DeepSeek-V3's and Qwen2.5's templates to
 *    the golden text Python jinja2 made from each template's own
 *    convention (string arguments and content None for DeepSeek, dict
 *    arguments for Qwen).
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
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tool_calls.h"
#include "server/chat.h"
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

static bool sentence(const dsq_grammar_t *g, const char *s)
{
    dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
    assert_non_null(m);
    bool ok = dsq_grammar_matcher_accept_bytes(m, s, strlen(s)) == DSQ_OK &&
              dsq_grammar_matcher_can_end(m);
    dsq_grammar_matcher_free(m);
    return ok;
}

static dsq_grammar_t *tool_grammar(const char *tools_json, const char *name,
                                   dsq_tool_parser_t f, bool parallel)
{
    cJSON *tools = cJSON_Parse(tools_json);
    assert_non_null(tools);
    char err[256], *gbnf = NULL;
    int rc = dsq_chat_gbnf_for_tool_calls(tools, name, f, parallel, &gbnf, err, sizeof(err));
    if (rc)
        fail_msg("tool grammar: %s", err);
    cJSON_Delete(tools);
    dsq_grammar_t *g = NULL;
    rc = dsq_grammar_from_gbnf(gbnf, strlen(gbnf), NULL, &g, err, sizeof(err));
    if (rc)
        fail_msg("tool grammar did not compile: %s\n%s", err, gbnf);
    free(gbnf);
    return g;
}

#define DS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"

static void test_tool_grammar(void **state)
{
    (void)state;
    char *path = path_join("DSQ_SOURCE_ROOT", ".", "tests/golden/tool_call_cases.jsonl");
    char *text = read_all(path, NULL);
    free(path);
    int n_checked = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#')
            continue;
        cJSON *c = cJSON_Parse(line);
        const char *src = cJSON_GetObjectItem(c, "source")->valuestring;
        const cJSON *calls = cJSON_GetObjectItem(c, "calls");
        /* the templates' renderings of calls with no text before them */
        if (!strstr(src, "chat template") || strstr(src, "malformed") ||
            cJSON_GetArraySize(calls) == 0 || cJSON_GetObjectItem(c, "content")->valuestring[0]) {
            cJSON_Delete(c);
            continue;
        }
        dsq_tool_parser_t f = strstr(src, "Qwen") ? DSQ_TOOL_PARSER_HERMES
                                                  : DSQ_TOOL_PARSER_DEEPSEEK;
        /* tools: the called names, any object as parameters, plus one more */
        char tools[2048] = "[{\"type\":\"function\",\"function\":{\"name\":\"other\"}}";
        const cJSON *k;
        cJSON_ArrayForEach(k, calls) {
            char one[256];
            snprintf(one, sizeof(one), ",{\"type\":\"function\",\"function\":{\"name\":\"%s\","
                     "\"parameters\":{\"type\":\"object\"}}}",
                     cJSON_GetObjectItem(k, "name")->valuestring);
            strcat(tools, one);
        }
        strcat(tools, "]");
        /* the V3 template leaves out calls_end after a single call; a
         * constrained output always has it */
        char t[4096];
        snprintf(t, sizeof(t), "%s", cJSON_GetObjectItem(c, "text")->valuestring);
        if (f == DSQ_TOOL_PARSER_DEEPSEEK && !strstr(t, DS_END))
            strcat(t, DS_END);
        bool multi = cJSON_GetArraySize(calls) > 1;
        dsq_grammar_t *any = tool_grammar(tools, NULL, f, true);
        dsq_grammar_t *one = tool_grammar(tools, NULL, f, false);
        const char *first = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "name")->valuestring;
        dsq_grammar_t *named = tool_grammar(tools, first, f, false);
        dsq_grammar_t *other = tool_grammar(tools, "other", f, true);
        if (!sentence(any, t))
            fail_msg("%s: not a sentence of the tool grammar: %s", src, t);
        assert_true(sentence(one, t) == !multi);
        assert_true(sentence(named, t) == !multi);
        assert_false(sentence(other, t));
        /* what the grammar allows, the parser reads back */
        dsq_tool_parse_t r;
        assert_int_equal(dsq_tool_calls_parse(f, t, strlen(t), &r), DSQ_OK);
        assert_int_equal(r.n_calls, cJSON_GetArraySize(calls));
        dsq_tool_parse_free(&r);
        dsq_grammar_free(any);
        dsq_grammar_free(one);
        dsq_grammar_free(named);
        dsq_grammar_free(other);
        cJSON_Delete(c);
        n_checked++;
    }
    free(text);
    /* arguments off the schema are not sentences */
    const char *typed = "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
                        "\"maximum\":9}},\"required\":[\"n\"]}}}]";
    dsq_grammar_t *g = tool_grammar(typed, NULL, DSQ_TOOL_PARSER_HERMES, false);
    assert_true(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"n\": 7}}\n</tool_call>"));
    assert_false(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"n\": 12}}\n</tool_call>"));
    assert_false(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>"));
    dsq_grammar_free(g);
    /* parameters without a type, {} or none: still an object, never
     * another JSON value */
    static const char *const untyped[] = {
        "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":"
        "{\"properties\":{\"n\":{\"type\":\"integer\"}}}}}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{}}}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":null}}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"w\"}}]"};
    for (size_t k = 0; k < sizeof(untyped) / sizeof(untyped[0]); k++) {
        g = tool_grammar(untyped[k], NULL, DSQ_TOOL_PARSER_HERMES, false);
        assert_true(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"n\": 7}}\n</tool_call>"));
        assert_false(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": 7}\n</tool_call>"));
        assert_false(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": \"x\"}\n</tool_call>"));
        dsq_grammar_free(g);
    }
    /* errors: no such tool; a parameters schema outside the subset, named;
     * a type other than object */
    cJSON *tools = cJSON_Parse(typed);
    char err[256], *gbnf = NULL;
    assert_int_equal(dsq_chat_gbnf_for_tool_calls(tools, "x", DSQ_TOOL_PARSER_HERMES, true,
                                                  &gbnf, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "no tool named 'x'"));
    cJSON_Delete(tools);
    tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":"
                        "{\"type\":\"object\",\"patternProperties\":{}}}}]");
    assert_int_equal(dsq_chat_gbnf_for_tool_calls(tools, NULL, DSQ_TOOL_PARSER_DEEPSEEK, true,
                                                  &gbnf, err, sizeof(err)), DSQ_EUNSUPPORTED);
    assert_non_null(strstr(err, "/tools/0/function/parameters"));
    assert_null(gbnf);
    cJSON_Delete(tools);
    tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":"
                        "{\"type\":\"string\"}}}]");
    assert_int_equal(dsq_chat_gbnf_for_tool_calls(tools, NULL, DSQ_TOOL_PARSER_HERMES, false,
                                                  &gbnf, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "must be \"object\""));
    assert_null(gbnf);
    cJSON_Delete(tools);
    print_message("# tool grammar: %d template renderings are sentences\n", n_checked);
    assert_true(n_checked >= 8);
}

static void test_detect_names_and_prefix(void **state)
{
    (void)state;
    char *qp = path_join("DSQ_TEST_DATA", "tests/data",
                         "tokenizers/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    char *dp = path_join("DSQ_TEST_DATA", "tests/data",
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

/* The text the chat renders for [USER, turn] after [USER] + generation
 * prompt, without the end marker end (the golden file's "text"). */
static char *render_turn(const dsq_chat_t *chat, const cJSON *turn, const char *end)
{
    cJSON *head = cJSON_Parse("[{\"role\": \"user\", \"content\": \"Please help.\"}]");
    cJSON *full = cJSON_Duplicate(head, 1);
    cJSON_AddItemToArray(full, cJSON_Duplicate(turn, 1));
    char *h = NULL, *f = NULL;
    size_t hl = 0, fl = 0;
    dsq_api_error_t err = {0};
    if (dsq_chat_render(chat, head, NULL, true, &h, &hl, &err) ||
        dsq_chat_render(chat, full, NULL, false, &f, &fl, &err))
        fail_msg("render: %s", err.message);
    assert_true(fl >= hl && !memcmp(f, h, hl));
    memmove(f, f + hl, fl - hl + 1);
    fl -= hl;
    size_t el = strlen(end);
    if (fl >= el && !strcmp(f + fl - el, end))
        f[fl - el] = 0;
    free(h);
    cJSON_Delete(head);
    cJSON_Delete(full);
    return f;
}

static void test_calls_render_back(void **state)
{
    (void)state;
    char err[256] = "", *dir = path_join("DSQ_TEST_DATA", "tests/data", "tokenizers/deepseek-v3");
    char *cfg_path = path_join("DSQ_TEST_DATA", "tests/data",
                               "tokenizers/deepseek-v3/tokenizer_config.json");
    char *qwen_path = path_join("DSQ_TEST_DATA", "tests/data",
                                "tokenizers/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    char *gold_path = path_join("DSQ_SOURCE_ROOT", ".", "tests/golden/tool_call_cases.jsonl");
    require_file(cfg_path);
    require_file(qwen_path);
    char *cfg_text = read_all(cfg_path, NULL), *gold = read_all(gold_path, NULL);
    cJSON *cfg = cJSON_Parse(cfg_text);
    dsq_tokenizer_t *tok = dsq_tokenizer_from_hf(dir, err, sizeof(err));
    if (!tok)
        fail_msg("%s: %s", dir, err);
    dsq_chat_t *ds = dsq_chat_create(NULL, cJSON_GetStringValue(cJSON_GetObjectItem(cfg, "chat_template")),
                                     tok, NULL, NULL, err, sizeof(err));
    dsq_chat_t *qw = dsq_chat_create(qwen_path, NULL, tok, NULL, NULL, err, sizeof(err));
    assert_non_null(ds);
    assert_non_null(qw);
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(gold, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *c = line[0] == '#' ? NULL : cJSON_Parse(line);
        const char *src = cJSON_GetStringValue(cJSON_GetObjectItem(c, "source"));
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(c, "content"));
        bool is_ds = src && !strcmp(src, "DeepSeek-V3 chat template");
        bool is_qw = src && !strcmp(src, "Qwen2.5-7B-Instruct chat template");
        if ((!is_ds && !is_qw) || strcmp(content, "")) {
            cJSON_Delete(c);
            continue;
        }
        /* the wire form: content null, arguments the string sent */
        cJSON *turn = cJSON_CreateObject(), *calls = cJSON_AddArrayToObject(turn, "tool_calls"), *w;
        cJSON_AddStringToObject(turn, "role", "assistant");
        cJSON_AddNullToObject(turn, "content");
        cJSON_ArrayForEach(w, cJSON_GetObjectItem(c, "calls")) {
            cJSON *tc = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(tc, "id", "call_0");
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_AddStringToObject(fn, "name", cJSON_GetStringValue(cJSON_GetObjectItem(w, "name")));
            cJSON_AddStringToObject(fn, "arguments",
                                    cJSON_GetStringValue(cJSON_GetObjectItem(w, "arguments_json")));
            cJSON_AddItemToArray(calls, tc);
        }
        char *got = render_turn(is_ds ? ds : qw, turn,
                                is_ds ? dsq_chat_eos_text(ds)
                                      : "<|im_end|>\n");
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
        if (strcmp(got, want))
            fail_msg("%s: rendered\n%s\nwant\n%s", src, got, want);
        free(got);
        /* an empty string for content renders the same in Qwen's */
        if (is_qw) {
            cJSON_ReplaceItemInObject(turn, "content", cJSON_CreateString(""));
            got = render_turn(qw, turn, "<|im_end|>\n");
            assert_string_equal(got, want);
            free(got);
        }
        cJSON_Delete(turn);
        cJSON_Delete(c);
        n++;
    }
    assert_int_equal(n, 8);
    dsq_chat_destroy(ds);
    dsq_chat_destroy(qw);
    dsq_tokenizer_destroy(tok);
    cJSON_Delete(cfg);
    free(cfg_text);
    free(gold);
    free(gold_path);
    free(qwen_path);
    free(cfg_path);
    free(dir);
}

/* The engine's own form of the tools: fns[i] is tools[i], an entry
 * without a name is skipped but keeps its index, and parameters that are
 * not JSON text are refused naming that index. */
/* A choice cut at max_tokens: the calls it finished parse, the one it was
 * writing is dropped (from its begin marker, even a cut one). */
static void test_parse_cut(void **state)
{
    (void)state;
#define DCB "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DCE "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DSEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
    static const struct {
        dsq_tool_parser_t p;
        const char *text;
        int n_calls;
        const char *content;
    } cases[] = {
        {DSQ_TOOL_PARSER_HERMES,
         "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
         "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"b\": 2}}\n</tool_call>\n"
         "<tool_call>\n{\"name\": \"f\", \"argu", 2, "Sure."},
        {DSQ_TOOL_PARSER_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"", 0, ""},
        /* cut inside the second call's begin marker */
        {DSQ_TOOL_PARSER_HERMES,
         "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_c", 1, ""},
        {DSQ_TOOL_PARSER_HERMES, "Let me see. <too", 0, "Let me see. "},
        /* not cut inside a call: as dsq_tool_calls_parse */
        {DSQ_TOOL_PARSER_HERMES,
         "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nand then", 1,
         "and then"},
        {DSQ_TOOL_PARSER_DEEPSEEK,
         DCB "f" DSEP "{\"a\": 1}" DCE "\n" DCB "g" DSEP "{\"b\"", 1, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dsq_tool_parse_t r;
        assert_int_equal(dsq_tool_calls_parse_cut(cases[i].p, cases[i].text,
                                                  strlen(cases[i].text), &r), DSQ_OK);
        if (r.n_calls != cases[i].n_calls || strcmp(r.content, cases[i].content))
            fail_msg("case %zu: %d calls, content [%s]", i, r.n_calls, r.content);
        if (r.n_calls)
            assert_string_equal(r.calls[0].name, "f");
        if (r.n_calls > 1)
            assert_string_equal(r.calls[1].arguments, "{\"b\": 2}");
        dsq_tool_parse_free(&r);
    }
}

static void test_tool_grammar_fns(void **state)
{
    (void)state;
    const dsq_tool_fn_t fns[] = {
        {NULL, NULL},
        {"w", "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},"
              "\"required\":[\"n\"]}"},
        {"bad", "{\"type\":"},
    };
    char err[256] = "", *gbnf = NULL;
    assert_int_equal(dsq_grammar_gbnf_for_tool_calls(fns, 2, NULL, DSQ_TOOL_PARSER_HERMES, false,
                                                     &gbnf, err, sizeof(err)), DSQ_OK);
    dsq_grammar_t *g = NULL;
    assert_int_equal(dsq_grammar_from_gbnf(gbnf, strlen(gbnf), NULL, &g, err, sizeof(err)),
                     DSQ_OK);
    free(gbnf);
    assert_true(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"n\": 7}}\n</tool_call>"));
    assert_false(sentence(g, "<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>"));
    dsq_grammar_free(g);
    gbnf = NULL;
    assert_int_equal(dsq_grammar_gbnf_for_tool_calls(fns, 3, NULL, DSQ_TOOL_PARSER_HERMES, false,
                                                     &gbnf, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "/tools/2/function/parameters: not JSON text"));
    assert_null(gbnf);
    assert_int_equal(dsq_grammar_gbnf_for_tool_calls(fns, 1, NULL, DSQ_TOOL_PARSER_HERMES, false,
                                                     &gbnf, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "'tools' is empty"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_tool_grammar),
        cmocka_unit_test(test_tool_grammar_fns),
        cmocka_unit_test(test_detect_names_and_prefix),
        cmocka_unit_test(test_calls_render_back),
        cmocka_unit_test(test_parse_cut),
    };
    return cmocka_run_group_tests_name("tool_calls", tests, NULL, NULL);
}

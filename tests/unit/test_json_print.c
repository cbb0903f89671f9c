/* tests for server/json_print.c: the JSON text the server hands the
 * engine. Every text below is parsed with cJSON, printed, and parsed
 * again; the two trees must be the same item for item, numbers to the
 * bit (cJSON_Compare would not do: it compares doubles within an
 * epsilon, which is the very rounding this printer exists to avoid). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/json_print.h"

static bool same(const cJSON *a, const cJSON *b)
{
    if ((a->type & 0xff) != (b->type & 0xff))
        return false;
    if ((a->string == NULL) != (b->string == NULL) ||
        (a->string && strcmp(a->string, b->string)))
        return false;
    if (cJSON_IsNumber(a))
        return !memcmp(&a->valuedouble, &b->valuedouble, sizeof(double)) &&
               a->valueint == b->valueint;
    if (cJSON_IsString(a))
        return !strcmp(a->valuestring, b->valuestring);
    const cJSON *x = a->child, *y = b->child;
    for (; x && y; x = x->next, y = y->next)
        if (!same(x, y))
            return false;
    return !x && !y;
}

static void round_trip(const char *text, const char *want)
{
    cJSON *v = cJSON_Parse(text);
    if (!v)
        fail_msg("cJSON does not parse %s", text);
    char *p = dsq_json_print(v);
    assert_non_null(p);
    cJSON *w = cJSON_Parse(p);
    if (!w || !same(v, w))
        fail_msg("%s printed as %s, which reads back differently", text, p);
    if (want && strcmp(p, want))
        fail_msg("%s printed as %s, want %s", text, p, want);
    cJSON_Delete(w);
    cJSON_Delete(v);
    free(p);
}

static void test_round_trip(void **state)
{
    (void)state;
    round_trip("{\"a\": [1, 2.5, \"x\\u0001\\\"\\\\/\\b\\f\\n\\r\\t\"], \"b\": null, "
               "\"c\": true, \"d\": false, \"e\": {}, \"f\": []}",
               "{\"a\":[1,2.5,\"x\\u0001\\\"\\\\/\\b\\f\\n\\r\\t\"],\"b\":null,"
               "\"c\":true,\"d\":false,\"e\":{},\"f\":[]}");
    /* doubles cJSON's printer would round: 2^53 + 1 reads as 2^53, which
     * it writes as 9.00719925474099e+15; one ulp above 1 as 1 */
    round_trip("[9007199254740993, 1.0000000000000002, 0.1, 0.30000000000000004, 1e300, "
               "-0.0, 5e-324, 1.7976931348623157e308, 123456789012345678901234567890]", NULL);
    round_trip("[9007199254740993]", "[9007199254740992]");
    round_trip("[1.0000000000000002]", "[1.0000000000000002]");
    /* a lenient parse of 1e999 is an infinity; it must stay one */
    round_trip("[1e999, -1e999]", "[1e999,-1e999]");
    /* keys in order, a key twice kept twice, UTF-8 and escapes in keys */
    round_trip("{\"z\":1,\"a\":2,\"z\":3,\"\\u00e9\\n\":\"\xe2\x9c\x93\"}",
               "{\"z\":1,\"a\":2,\"z\":3,\"\xc3\xa9\\n\":\"\xe2\x9c\x93\"}");
    round_trip("\"top\"", "\"top\"");
    round_trip("null", "null");
    /* nesting (600 levels; cJSON parses up to 1000) */
    char deep[4096] = "";
    for (int i = 0; i < 300; i++)
        strcat(deep, "[{\"k\":");
    strcat(deep, "0");
    for (int i = 0; i < 300; i++)
        strcat(deep, "}]");
    round_trip(deep, deep);
    assert_null(dsq_json_print(NULL));
}

static void test_raw(void **state)
{
    (void)state;
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateRaw("{\"x\":1}"));
    char *p = dsq_json_print(a);
    assert_string_equal(p, "[{\"x\":1}]");
    free(p);
    cJSON_Delete(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_raw),
    };
    return cmocka_run_group_tests_name("json_print", tests, NULL, NULL);
}

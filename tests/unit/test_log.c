/* tests for engine/common/log.c: level names and error strings. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

static void test_set_level(void **state)
{
    (void)state;
    assert_int_equal(dsq_log_set_level("debug"), DSQ_OK);
    assert_int_equal(dsq_log_threshold, DSQ_LOG_DEBUG);
    assert_int_equal(dsq_log_set_level("WARN"), DSQ_OK);
    assert_int_equal(dsq_log_threshold, DSQ_LOG_WARN);
    assert_int_equal(dsq_log_set_level("loud"), DSQ_EINVAL);
    assert_int_equal(dsq_log_threshold, DSQ_LOG_WARN);
    assert_int_equal(dsq_log_set_level(NULL), DSQ_EINVAL);
}

static void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(dsq_strerror(DSQ_EINVAL), "invalid argument");
    assert_string_equal(dsq_strerror(12345), "unknown error");
    for (int e = 0; e >= DSQ_ESTATE; e--)
        assert_string_not_equal(dsq_strerror(e), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_level),
        cmocka_unit_test(test_strerror),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

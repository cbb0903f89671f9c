/* Logging: the smallest shared piece of the engine with error.c, used by
 * every other module and by server/. Lines are built in a stack buffer and
 * written with one write(2) so concurrent threads never interleave. */
#include "log.h"
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int dsq_log_threshold = DSQ_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* DSQ_LOG_LEVEL in the environment sets the initial threshold. */
__attribute__((constructor)) static void log_level_from_env(void)
{
    const char *v = getenv("DSQ_LOG_LEVEL");
    if (v)
        dsq_log_set_level(v);
}

int dsq_log_set_level(const char *name)
{
    int rc = DSQ_EINVAL;
    for (int i = 0; name && i < 4; i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            dsq_log_threshold = i;
            rc = DSQ_OK;
        }
    }
    return rc;
}

void dsq__log_write(int level, const char *fmt, ...)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = (int)strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof(line) - (size_t)n, ".%03ldZ level=%s ",
                  ts.tv_nsec / 1000000L,
                  level >= 0 && level < 4 ? level_names[level] : "?");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += m;
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

/* Logging: one line per event, key=value pairs, to stderr (journald collects
 * it under systemd). dsq_log() checks the level before formatting, so a
 * disabled debug line costs one comparison. Never log prompt or completion
 * text above DSQ_LOG_DEBUG. */
#ifndef DSQ_LOG_H
#define DSQ_LOG_H

typedef enum dsq_log_level {
    DSQ_LOG_ERROR = 0,
    DSQ_LOG_WARN  = 1,
    DSQ_LOG_INFO  = 2,
    DSQ_LOG_DEBUG = 3,
} dsq_log_level_t;

/* Current threshold; lines with level > dsq_log_threshold are dropped.
 * Default DSQ_LOG_INFO, or DSQ_LOG_LEVEL=error|warn|info|debug at startup. */
extern int dsq_log_threshold;

/* Set the threshold from a name ("error", "warn", "info", "debug").
 * Returns 0, or DSQ_EINVAL for an unknown name (threshold unchanged). */
int dsq_log_set_level(const char *name);

/* Write one formatted line "ts level msg\n" to stderr atomically (one write).
 * Use the dsq_log() macro, not this, so disabled levels skip formatting. */
void dsq__log_write(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define dsq_log(level, ...)                                   \
    do {                                                      \
        if ((int)(level) <= dsq_log_threshold)                \
            dsq__log_write((level), __VA_ARGS__);             \
    } while (0)

#endif

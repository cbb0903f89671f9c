/* The monotonic clock every timer in dsq reads (step timings, deadlines,
 * spans' durations, benchmark intervals): CLOCK_MONOTONIC, which never
 * jumps with the wall clock. Wall-clock timestamps (log lines, trace
 * start times) use CLOCK_REALTIME where they are made. */
#ifndef DSQ_CLOCK_H
#define DSQ_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Seconds since an arbitrary fixed point (boot), ns resolution. */
static inline double dsq_clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The same clock in integer nanoseconds. */
static inline int64_t dsq_clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif

/* Helpers shared by the dsq-bench HTTP tools (bench_serve.c, bench_soak.c):
 * a clock, a seeded random stream, a free loopback port, a blocking GET,
 * waiting for and stopping a spawned server. Internal
 * to dsq-bench (dsq__ prefix). */
#ifndef DSQ_TOOLS_BENCH_HTTP_H
#define DSQ_TOOLS_BENCH_HTTP_H

#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

/* Seconds on the monotonic clock. */
double dsq__bench_now_s(void);

/* SplitMix64 (Steele, Lea, Flood 2014): the next value of the seeded
 * stream *s (advanced). Prompts and mixes are reproducible from a seed. */
uint64_t dsq__bench_splitmix(uint64_t *s);

/* Poll url/health until it answers 200: 0; -1 when pid (> 0: a process we
 * started) exited, timeout_s passed or *stop became non-zero. */
int dsq__bench_wait_ready(pid_t pid, const char *url, double timeout_s,
                          volatile sig_atomic_t *stop);

/* A TCP port on 127.0.0.1 free at the time of the call, or -1. */
int dsq__bench_free_port(void);

/* GET url (loopback only, no proxy) with a timeout in seconds. Returns
 * the body as a malloc'd NUL-terminated string (the caller frees it) and
 * the HTTP status in *status, or NULL with *status = 0 when the transfer
 * failed. */
char *dsq__bench_http_get(const char *url, long *status, double timeout_s);

/* As dsq__bench_http_get, with "Authorization: Bearer api_key" when
 * api_key is not NULL. */
char *dsq__bench_http_get_auth(const char *url, const char *api_key, long *status,
                               double timeout_s);

/* SIGTERM pid, wait up to 30 s for it to exit (drain), then SIGKILL;
 * reaps it. pid <= 0 is a no-op. */
void dsq__bench_stop_server(pid_t pid);

#endif

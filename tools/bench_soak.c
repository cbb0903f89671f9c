/* dsq-bench soak: minutes of mixed, partly hostile load against one dsqd,
 * reporting what it holds at the start and at the end.
 *
 * The load (one thread: libcurl's multi interface plus raw sockets):
 *   --clients C   closed-loop clients, each with one request in flight,
 *                 drawn from a fixed mix: streamed completions of 16-256
 *                 prompt ids and 8-64 new tokens (60%); of those streams a
 *                 fifth hang up after 1-8 chunks (an abort); 1,500-id
 *                 prompts with 8 new tokens (10%); non-streamed requests
 *                 (15%); malformed JSON bodies, which must get a 400 with
 *                 an OpenAI error object (15%);
 *   --unread U    streams of 4,000 new tokens whose client stops reading
 *                 after the first chunk (a 4 KiB receive buffer) and holds
 *                 the connection --unread-hold seconds (default: three
 *                 quarters of the run; with dsqd's defaults
 *                 a stream is held once 256 KiB are undelivered, a few
 *                 minutes at 2-core speeds, and aborted 30 s later), then reads what is
 *                 left and starts again; counted as aborted by the server
 *                 (an error event or no [DONE]) or finished;
 *   --slow S      slowloris connections sending one header byte every 2 s,
 *                 reopened when the server closes them (its header
 *                 deadline).
 * Every --sample seconds it reads the server's RSS, open fds and threads
 * (/proc/PID) and its KV blocks in use, running and waiting requests
 * (/metrics). When the time is up it stops the load, waits up to 30 s for
 * the server to go idle, and samples again.
 *
 * An error is a request of the closed-loop mix whose outcome is not the
 * expected one (a stream without [DONE] or with an error event, a status
 * other than 200 (400 for the malformed ones), a transport failure other
 * than our own hang-up). Exit status: 0 when there were no errors and, at
 * the end, no KV block is in use, fds are within 2 and threads at most
 * what they were at the start; 1 otherwise; 2 for bad usage or a server
 * that did not start. This is a benchmark, not a timed test: it reports,
 * the thresholds are what a leak would break. */
#include "dsq_config.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "bench_http.h"

int dsq__bench_soak(int argc, char **argv);

#define MAX_SLOW 8192
#define MAX_LINE 65536

enum { K_STREAM, K_ABORT, K_LONG, K_PLAIN, K_BAD, K_UNREAD, K_COUNT };
static const char *const kind_name[K_COUNT] = {"stream", "abort", "long", "plain",
                                               "bad_json", "unread"};

typedef struct {
    int kind;
    CURL *easy;
    struct curl_slist *hdrs;
    char *body;
    char line[512];             /* the current SSE line, truncated          */
    size_t line_len;
    char head[512];             /* the first bytes of a non-streamed body   */
    size_t head_len;
    int chunks, abort_after;
    bool done, error_event, hung_up, server_abort;
    double t_paused, t_start;
    bool paused;
} sreq_t;

typedef struct {
    double t;
    long rss_kib, fds, threads;
    long kv_used, running, waiting, held;
    long stall_aborts, kv_block_bytes;
} sample_t;

typedef struct {
    const char *url;
    const char *model;          /* served model name                         */
    const char *api_key;        /* NULL: none                                */
    pid_t pid;
    int n_clients, n_unread, n_slow;
    double minutes, sample_s, unread_hold_s;
    uint64_t rng;
    int vocab;
    /* counts */
    long sent[K_COUNT], ok[K_COUNT], failed[K_COUNT], stopped[K_COUNT];
    long slow_opened, slow_closed_by_server;
    long unread_aborted, unread_finished;
    double slow_life_sum;
    char first_err[300];
} soak_t;

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static int rand_in(soak_t *s, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(dsq__bench_splitmix(&s->rng) % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------ samples */

static long proc_status_field(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    if (f)
        fclose(f);
    return v;
}

static long proc_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static long metric(const char *text, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, name, nl) == 0 && (p[nl] == ' ' || p[nl] == '{')) {
            const char *v = strchr(p, ' ');
            return v ? (long)strtod(v + 1, NULL) : -1;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return -1;
}

static sample_t take_sample(const soak_t *s, double t0)
{
    sample_t x = {.t = dsq__bench_now_s() - t0, .rss_kib = -1, .fds = -1, .threads = -1,
                  .kv_used = -1, .running = -1, .waiting = -1, .held = -1,
                  .stall_aborts = -1, .kv_block_bytes = -1};
    if (s->pid > 0) {
        x.rss_kib = proc_status_field(s->pid, "VmRSS");
        x.threads = proc_status_field(s->pid, "Threads");
        x.fds = proc_fds(s->pid);
    }
    char url[256];
    long st;
    snprintf(url, sizeof(url), "%s/metrics", s->url);
    char *m = dsq__bench_http_get_auth(url, s->api_key, &st, 5);
    if (m && st == 200) {
        x.kv_used = metric(m, "dsq:kv_cache_blocks_used");
        x.running = metric(m, "dsq:num_requests_running");
        x.waiting = metric(m, "dsq:num_requests_waiting");
        x.held = metric(m, "dsq:num_requests_held");
        x.stall_aborts = metric(m, "dsq:stream_stall_aborts_total");
        x.kv_block_bytes = metric(m, "dsq:kv_cache_block_bytes");
    }
    free(m);
    return x;
}

static void print_sample(const char *label, const sample_t *x)
{
    printf("| %s | %.0f | %.1f | %ld | %ld | %ld | %ld | %ld | %ld |\n", label, x->t,
           x->rss_kib >= 0 ? (double)x->rss_kib / 1024.0 : -1.0, x->fds, x->threads, x->kv_used,
           x->running, x->waiting, x->held);
    fflush(stdout);
}

/* ------------------------------------------------------------ requests */

static void note_err(soak_t *s, const sreq_t *r, const char *what)
{
    if (!s->first_err[0])
        snprintf(s->first_err, sizeof(s->first_err), "%s: %s", kind_name[r->kind], what);
}

static void on_line(sreq_t *r)
{
    r->line[r->line_len < sizeof(r->line) ? r->line_len : sizeof(r->line) - 1] = '\0';
    if (strncmp(r->line, "data:", 5) == 0) {
        const char *d = r->line + 5;
        while (*d == ' ')
            d++;
        if (strcmp(d, "[DONE]") == 0)
            r->done = true;
        else if (strncmp(d, "{\"error\"", 8) == 0)
            r->error_event = true;
        else
            r->chunks++;
        /* a stream the server cut short ends with finish_reason "abort" */
        if (strstr(d, "\"finish_reason\":\"abort\"") || strstr(d, "\"finish_reason\": \"abort\""))
            r->server_abort = true;
    }
    r->line_len = 0;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *user)
{
    sreq_t *r = user;
    size_t n = size * nmemb;
    if (r->kind == K_PLAIN || r->kind == K_BAD) {
        size_t k = sizeof(r->head) - 1 - r->head_len;
        if (k > n)
            k = n;
        memcpy(r->head + r->head_len, p, k);
        r->head_len += k;
        r->head[r->head_len] = '\0';
        return n;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            if (r->line_len && r->line[r->line_len - 1] == '\r')
                r->line_len--;
            on_line(r);
            if (r->kind == K_ABORT && r->chunks >= r->abort_after) {
                r->hung_up = true;
                return 0;                 /* curl aborts: we hang up */
            }
            if (r->kind == K_UNREAD && r->chunks >= 1 && r->t_paused == 0)
                r->t_paused = dsq__bench_now_s();   /* the main loop stops reading */
        } else if (r->line_len < sizeof(r->line) - 1) {
            r->line[r->line_len++] = p[i];
        }
    }
    return n;
}

/* An unread stream's socket gets a small receive buffer, as a client that
 * stops reading has: otherwise the kernel would absorb megabytes of its
 * output and the server would never see it stop. */
static int small_rcvbuf(void *user, curl_socket_t fd, curlsocktype purpose)
{
    (void)user;
    (void)purpose;
    int sz = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    return CURL_SOCKOPT_OK;
}

static void sreq_free(sreq_t *r)
{
    if (r->easy)
        curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->hdrs);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

static char *ids_body(soak_t *s, int n_prompt, int max_tokens, bool stream)
{
    size_t cap = (size_t)n_prompt * 7 + 256;
    char *b = malloc(cap);
    if (!b)
        return NULL;
    size_t o = (size_t)snprintf(b, cap, "{\"model\":\"%s\",\"prompt\":[", s->model);
    for (int i = 0; i < n_prompt; i++)
        o += (size_t)snprintf(b + o, cap - o, "%s%d", i ? "," : "", rand_in(s, 100, s->vocab - 1));
    snprintf(b + o, cap - o,
             "],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0.8,\"seed\":%d,"
             "\"stream\":%s}",
             max_tokens, rand_in(s, 0, 1 << 30), stream ? "true" : "false");
    return b;
}

static int pick_kind(soak_t *s)
{
    int x = rand_in(s, 0, 99);
    if (x < 48)
        return K_STREAM;
    if (x < 60)
        return K_ABORT;
    if (x < 70)
        return K_LONG;
    if (x < 85)
        return K_PLAIN;
    return K_BAD;
}

static int sreq_start(soak_t *s, sreq_t *r, CURLM *m, int kind)
{
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->t_start = dsq__bench_now_s();
    switch (kind) {
    case K_STREAM:
    case K_ABORT:
        r->body = ids_body(s, rand_in(s, 16, 256), rand_in(s, 8, 64), true);
        r->abort_after = rand_in(s, 1, 8);
        break;
    case K_LONG:
        r->body = ids_body(s, 1500, 8, true);
        break;
    case K_PLAIN:
        r->body = ids_body(s, rand_in(s, 16, 128), rand_in(s, 4, 32), false);
        break;
    case K_BAD:
        r->body = strdup("{\"model\": \"x\", \"prompt\": [1, 2,");
        break;
    case K_UNREAD:
        r->body = ids_body(s, 16, 4000, true);
        break;
    }
    r->easy = curl_easy_init();
    r->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (r->hdrs && s->api_key) {
        char auth[512];
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", s->api_key);
        struct curl_slist *h = curl_slist_append(r->hdrs, auth);
        if (!h)
            return -1;
        r->hdrs = h;
    }
    if (!r->body || !r->easy || !r->hdrs)
        return -1;
    char url[256];
    snprintf(url, sizeof(url), "%s/v1/completions", s->url);
    CURL *e = r->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(kind == K_UNREAD ? 600e3 : 300e3));
    if (kind == K_UNREAD) {
        curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 1024L);   /* read little, then stop */
        curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, small_rcvbuf);
        curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
    }
    s->sent[kind]++;
    return curl_multi_add_handle(m, e) == CURLM_OK ? 0 : -1;
}

/* Judge a finished request of the closed-loop mix (unread ones are not
 * judged: the server may abort them, which is the point). */
static void sreq_judge(soak_t *s, sreq_t *r, CURLcode cc)
{
    long status = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    char why[200] = "";
    switch (r->kind) {
    case K_ABORT:
        if (!r->hung_up && !(cc == CURLE_OK && status == 200 && r->done))
            snprintf(why, sizeof(why), "status %ld, curl %s", status, curl_easy_strerror(cc));
        break;
    case K_STREAM:
    case K_LONG:
        if (cc != CURLE_OK || status != 200 || !r->done || r->error_event || r->server_abort)
            snprintf(why, sizeof(why), "status %ld, curl %s, done %d, error event %d, abort %d",
                     status, curl_easy_strerror(cc), r->done, r->error_event, r->server_abort);
        break;
    case K_PLAIN:
        if (cc != CURLE_OK || status != 200 || !strstr(r->head, "\"choices\""))
            snprintf(why, sizeof(why), "status %ld, curl %s, body %.80s", status,
                     curl_easy_strerror(cc), r->head);
        break;
    case K_BAD:
        if (cc != CURLE_OK || status != 400 || !strstr(r->head, "\"error\""))
            snprintf(why, sizeof(why), "status %ld, curl %s, body %.80s", status,
                     curl_easy_strerror(cc), r->head);
        break;
    default:
        /* unread: not judged; the server may abort it, which is the point */
        s->ok[r->kind]++;
        if (r->error_event || r->server_abort || !r->done)
            s->unread_aborted++;
        else
            s->unread_finished++;
        return;
    }
    if (why[0]) {
        s->failed[r->kind]++;
        note_err(s, r, why);
    } else {
        s->ok[r->kind]++;
    }
}

/* ------------------------------------------------------------ slowloris */

typedef struct {
    int fd;
    double t_open, t_next;
} slow_t;

static int slow_open(const soak_t *s, int port, slow_t *c)
{
    (void)s;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    c->t_open = dsq__bench_now_s();
    c->t_next = c->t_open + 0.2;
    return 0;
}

/* Trickle one byte per connection that is due; reap the ones the server
 * closed (counted with their lifetime) and reopen them. */
static void slow_tick(soak_t *s, int port, slow_t *cs, int n, bool reopen)
{
    static const char head[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    double t = dsq__bench_now_s();
    for (int i = 0; i < n; i++) {
        slow_t *c = &cs[i];
        if (c->fd < 0) {
            if (reopen && slow_open(s, port, c) == 0)
                s->slow_opened++;
            continue;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        char buf[256];
        bool closed = false;
        if (poll(&p, 1, 0) > 0) {
            ssize_t k = recv(c->fd, buf, sizeof(buf), 0);
            closed = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        }
        if (!closed && t >= c->t_next) {
            size_t sent = (size_t)((t - c->t_open) / 2.0);
            char b = sent < sizeof(head) - 1 ? head[sent] : 'a';
            ssize_t k = send(c->fd, &b, 1, MSG_NOSIGNAL);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)
                closed = true;
            c->t_next = t + 2.0;
        }
        if (closed) {
            s->slow_closed_by_server++;
            s->slow_life_sum += t - c->t_open;
            close(c->fd);
            c->fd = -1;
        }
    }
}

/* ------------------------------------------------------------ main */

static void usage(void)
{
    fprintf(stderr,
            "usage: dsq-bench soak (--dsqd PATH --model FILE | --url URL [--pid PID])\n"
            "                      [--minutes M] [--clients C] [--unread U] [--slow S]\n"
            "                      [--sample SECONDS] [--unread-hold SECONDS] [--vocab N]\n"
            "                      [--seed N] [--log FILE] [--api-key KEY] [--model-name NAME]\n"
            "                      [-- DSQD-ARGS...]\n"
            "Minutes of mixed, partly hostile load against one dsqd (started here with\n"
            "--dsqd, on a free loopback port, or already at --url; --pid lets it read\n"
            "that one's /proc), then a report of what the server holds at start and end.\n"
            "  --clients C   closed-loop clients (default 8): streamed completions (a fifth\n"
            "                of them hang up after 1-8 chunks), 1,500-token prompts,\n"
            "                non-streamed requests, malformed JSON (must get a 400)\n"
            "  --unread U    streams of 4,000 tokens never read (default 4) for\n"
            "                --unread-hold s (default 3/4 of the run), then read\n"
            "                out: counted as aborted by the server or finished\n"
            "  --slow S      slowloris connections, a header byte every 2 s (default 200),\n"
            "                reopened when the server closes them\n"
            "  --sample S    seconds between samples of RSS, fds, threads (/proc) and\n"
            "                KV blocks, running, waiting, held requests (/metrics); 30\n"
            "  -- ARGS       extra dsqd arguments (--dsqd mode; it starts with\n"
            "                --log-level warn, pass -- --log-level info for more)\n"
            "An error is a request of the clients' mix with another outcome than\n"
            "expected. Verdict ok (exit 0): no errors and, once idle, no KV block in use,\n"
            "fds within +2 and threads at most their start; each failed check is named.\n"
            "Exit 1: verdict FAILED; 2: bad usage or no server. RSS grows as KV blocks are\n"
            "first used (the report gives the KV bytes touched). Loopback only.\n");
}

static char *served_model(const char *url, const char *api_key)
{
    char full[256];
    long st;
    snprintf(full, sizeof(full), "%s/v1/models", url);
    char *b = dsq__bench_http_get_auth(full, api_key, &st, 10);
    char *id = NULL;
    const char *p = b && st == 200 ? strstr(b, "\"id\"") : NULL;
    if (p && (p = strchr(p + 4, '"'))) {
        const char *q = strchr(p + 1, '"');
        if (q)
            id = strndup(p + 1, (size_t)(q - p - 1));
    }
    free(b);
    return id;
}

static pid_t spawn_dsqd(const char *exe, const char *model, int port, const char *log,
                        char **extra, int n_extra)
{
    char sport[16];
    snprintf(sport, sizeof(sport), "%d", port);
    const char *base[] = {exe, "--model", model, "--host", "127.0.0.1", "--port", sport,
                          "--log-level", "warn"};
    int nb = (int)(sizeof(base) / sizeof(base[0]));
    const char **argv = calloc((size_t)(nb + n_extra + 1), sizeof(*argv));
    if (!argv)
        return -1;
    for (int i = 0; i < nb; i++)
        argv[i] = base[i];
    for (int i = 0; i < n_extra; i++)
        argv[nb + i] = extra[i];
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "dsq-bench soak: cannot open %s: %s\n", log, strerror(errno));
        free(argv);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(exe, (char *const *)argv);
        dprintf(2, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(fd);
    free(argv);
    return pid;
}

int dsq__bench_soak(int argc, char **argv)
{
    soak_t s = {.n_clients = 8, .n_unread = 4, .n_slow = 200, .minutes = 10, .sample_s = 30,
                .unread_hold_s = -1, .rng = 20261202, .vocab = 30000};
    const char *dsqd = NULL, *model_file = NULL, *log = NULL, *url = NULL, *model_name = NULL;
    char **extra = NULL;
    int n_extra = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--") == 0) {
            extra = argv + i + 1;
            n_extra = argc - i - 1;
            break;
        }
        if (strcmp(a, "--help") == 0) {
            usage();
            return 0;
        }
        if (!v) {
            usage();
            return 2;
        }
        char *end = NULL;
        if (strcmp(a, "--dsqd") == 0) dsqd = v;
        else if (strcmp(a, "--model") == 0) model_file = v;
        else if (strcmp(a, "--url") == 0) url = v;
        else if (strcmp(a, "--log") == 0) log = v;
        else if (strcmp(a, "--api-key") == 0) s.api_key = v;
        else if (strcmp(a, "--model-name") == 0) model_name = v;
        else if (strcmp(a, "--pid") == 0) s.pid = (pid_t)strtol(v, &end, 10);
        else if (strcmp(a, "--minutes") == 0) s.minutes = strtod(v, &end);
        else if (strcmp(a, "--clients") == 0) s.n_clients = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--unread") == 0) s.n_unread = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--slow") == 0) s.n_slow = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--sample") == 0) s.sample_s = strtod(v, &end);
        else if (strcmp(a, "--unread-hold") == 0) s.unread_hold_s = strtod(v, &end);
        else if (strcmp(a, "--vocab") == 0) s.vocab = (int)strtol(v, &end, 10);
        else if (strcmp(a, "--seed") == 0) s.rng = strtoull(v, &end, 10);
        else {
            fprintf(stderr, "dsq-bench soak: unknown option %s\n", a);
            usage();
            return 2;
        }
        if (end && *end) {
            fprintf(stderr, "dsq-bench soak: bad value for %s: %s\n", a, v);
            return 2;
        }
        i++;
    }
    if ((!dsqd) == (!url) || (dsqd && !model_file) || s.n_clients < 1 || s.n_unread < 0 ||
        s.n_slow < 0 || s.n_slow > MAX_SLOW || !(s.minutes > 0) || !(s.sample_s > 0) ||
        s.vocab <= 100) {
        usage();
        return 2;
    }
    if (s.unread_hold_s < 0)
        s.unread_hold_s = s.minutes * 45;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    uint64_t seed = s.rng;

    char own_url[64], log_buf[256];
    int port = 0;
    pid_t spawned = -1;
    if (dsqd) {
        port = dsq__bench_free_port();
        if (!log) {
            const char *tmp = getenv("TMPDIR");
            snprintf(log_buf, sizeof(log_buf), "%s/dsq-bench-soak-dsqd-%d.log",
                     tmp && *tmp ? tmp : "/tmp", (int)getpid());
            log = log_buf;
        }
        spawned = port > 0 ? spawn_dsqd(dsqd, model_file, port, log, extra, n_extra) : -1;
        snprintf(own_url, sizeof(own_url), "http://127.0.0.1:%d", port);
        s.url = own_url;
        s.pid = spawned;
    } else {
        s.url = url;
        const char *p = strrchr(url, ':');
        port = p ? atoi(p + 1) : 80;
    }
    /* a server we start may take minutes to load; one we are pointed at
     * is up or it is not */
    if ((dsqd && spawned <= 0) ||
        dsq__bench_wait_ready(spawned, s.url, dsqd ? 300 : 10, &stop_requested) != 0) {
        fprintf(stderr, "dsq-bench soak: server at %s not ready%s%s\n", s.url,
                log ? "; log: " : "", log ? log : "");
        dsq__bench_stop_server(spawned);
        return 2;
    }
    char *model = model_name ? strdup(model_name) : served_model(s.url, s.api_key);
    if (!model) {
        fprintf(stderr, "dsq-bench soak: %s/v1/models lists no model (--api-key? "
                "--model-name?)\n", s.url);
        dsq__bench_stop_server(spawned);
        return 2;
    }
    s.model = model;

    CURLM *m = curl_multi_init();
    int n_slots = s.n_clients + s.n_unread;
    sreq_t *rs = calloc((size_t)n_slots, sizeof(*rs));
    slow_t *slow = calloc((size_t)(s.n_slow ? s.n_slow : 1), sizeof(*slow));
    if (!m || !rs || !slow) {
        fprintf(stderr, "dsq-bench soak: out of memory\n");
        return 2;
    }
    for (int i = 0; i < s.n_slow; i++)
        slow[i].fd = -1;

    /* warm up: one plain request, so the start sample has the model's
     * buffers in place */
    double t0 = dsq__bench_now_s();
    sreq_start(&s, &rs[0], m, K_PLAIN);
    for (int running = 1; running && !stop_requested;) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    curl_multi_remove_handle(m, rs[0].easy);
    sreq_free(&rs[0]);
    s.sent[K_PLAIN] = 0;

    if (s.n_unread > 0 && s.unread_hold_s >= s.minutes * 60)
        fprintf(stderr, "dsq-bench soak: note: --unread-hold %.0f s >= the run: the unread "
                "streams will not be read out (nor counted) before it ends\n", s.unread_hold_s);
    printf("# dsq-bench soak: %s (model %s), %.1f min, %d clients, %d unread streams "
           "(held %.0f s), %d slow connections, seed %llu\n", s.url, model, s.minutes,
           s.n_clients, s.n_unread, s.unread_hold_s, s.n_slow, (unsigned long long)seed);
    printf("| sample | t s | RSS MiB | fds | threads | KV blocks | running | waiting | held |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    t0 = dsq__bench_now_s();
    sample_t start = take_sample(&s, t0);
    print_sample("start", &start);
    sample_t peak = start;

    for (int i = 0; i < n_slots; i++)
        if (sreq_start(&s, &rs[i], m, i < s.n_clients ? pick_kind(&s) : K_UNREAD) != 0) {
            fprintf(stderr, "dsq-bench soak: cannot start a request\n");
            return 2;
        }
    double t_end = t0 + s.minutes * 60, t_sample = t0 + s.sample_s;
    int running = n_slots;
    while (!stop_requested && dsq__bench_now_s() < t_end) {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            sreq_t *r;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            sreq_judge(&s, r, msg->data.result);
            int kind = r->kind;
            curl_multi_remove_handle(m, r->easy);
            sreq_free(r);
            if (sreq_start(&s, r, m, kind == K_UNREAD ? K_UNREAD : pick_kind(&s)) != 0) {
                fprintf(stderr, "dsq-bench soak: cannot start a request\n");
                stop_requested = 1;
            }
        }
        /* unread streams: paused after their first chunk, resumed after
         * the hold (the server has aborted them by then, by default) */
        double t = dsq__bench_now_s();
        for (int i = s.n_clients; i < n_slots; i++) {
            sreq_t *r = &rs[i];
            if (!r->easy || r->t_paused == 0)
                continue;
            if (!r->paused && t - r->t_paused < s.unread_hold_s) {
                r->paused = true;
                curl_easy_pause(r->easy, CURLPAUSE_RECV);
            } else if (r->paused && t - r->t_paused >= s.unread_hold_s) {
                r->paused = false;
                r->t_paused = -1;        /* read the rest, do not pause again */
                curl_easy_pause(r->easy, CURLPAUSE_CONT);
            }
        }
        slow_tick(&s, port, slow, s.n_slow, true);
        if (t >= t_sample) {
            sample_t x = take_sample(&s, t0);
            print_sample("load", &x);
            if (x.rss_kib > peak.rss_kib)
                peak.rss_kib = x.rss_kib;
            if (x.fds > peak.fds)
                peak.fds = x.fds;
            if (x.threads > peak.threads)
                peak.threads = x.threads;
            if (x.kv_used > peak.kv_used)
                peak.kv_used = x.kv_used;
            t_sample += s.sample_s;
        }
        curl_multi_poll(m, NULL, 0, 50, NULL);
    }

    /* stop the load: hang up everything (closing curl's connection pool
     * too), let the server go idle */
    for (int i = 0; i < n_slots; i++)
        if (rs[i].easy) {
            s.stopped[rs[i].kind]++;
            curl_multi_remove_handle(m, rs[i].easy);
            sreq_free(&rs[i]);
        }
    curl_multi_cleanup(m);
    m = NULL;
    for (int i = 0; i < s.n_slow; i++)
        if (slow[i].fd >= 0) {
            close(slow[i].fd);
            slow[i].fd = -1;
        }
    double t_stop = dsq__bench_now_s();
    sample_t end;
    do {
        usleep(500000);
        end = take_sample(&s, t0);
    } while (dsq__bench_now_s() - t_stop < 30 && (end.kv_used != 0 || end.running != 0 ||
                                       end.waiting != 0));
    /* a second more for connections and their threads to be reaped */
    sleep(1);
    end = take_sample(&s, t0);
    print_sample("end", &end);
    if (end.rss_kib > peak.rss_kib)
        peak.rss_kib = end.rss_kib;

    long errors = 0;
    printf("\n| kind | sent | as expected | errors | in flight at stop |\n"
           "| --- | ---: | ---: | ---: | ---: |\n");
    for (int k = 0; k < K_COUNT; k++) {
        printf("| %s | %ld | %ld | %ld | %ld |\n", kind_name[k], s.sent[k], s.ok[k], s.failed[k],
               s.stopped[k]);
        errors += s.failed[k];
    }
    printf("\nunread streams: %ld seen aborted by the server, %ld finished; the server counted "
           "%ld stall aborts\n", s.unread_aborted, s.unread_finished,
           end.stall_aborts >= 0 && start.stall_aborts >= 0 ? end.stall_aborts - start.stall_aborts
                                                            : -1);
    printf("slow connections: %ld opened, %ld closed by the server, mean lifetime %.1f s\n",
           s.slow_opened, s.slow_closed_by_server,
           s.slow_closed_by_server ? s.slow_life_sum / (double)s.slow_closed_by_server : 0.0);
    /* the KV pool is allocated up front but its pages become resident as
     * blocks are first used: RSS grows by up to the peak blocks' bytes */
    if (end.kv_block_bytes > 0)
        printf("KV touched: at most %.1f MiB (peak %ld blocks sampled x %ld bytes)\n",
               (double)peak.kv_used * (double)end.kv_block_bytes / 1048576.0, peak.kv_used,
               end.kv_block_bytes);
    printf("start -> end: RSS %+.1f MiB (peak %.1f MiB), fds %+ld (peak %ld), threads %+ld "
           "(peak %ld), KV blocks in use at the end %ld, errors %ld%s%s\n",
           (double)(end.rss_kib - start.rss_kib) / 1024.0, (double)peak.rss_kib / 1024.0,
           end.fds - start.fds, peak.fds, end.threads - start.threads, peak.threads,
           end.kv_used, errors, s.first_err[0] ? "; first: " : "", s.first_err);
    char why[512] = "";
    size_t wl = 0;
    if (errors)
        wl += (size_t)snprintf(why + wl, sizeof(why) - wl, "; %ld errors", errors);
    if (end.kv_used != 0)
        wl += (size_t)snprintf(why + wl, sizeof(why) - wl, "; KV blocks in use %ld", end.kv_used);
    if (start.fds >= 0 && end.fds > start.fds + 2)
        wl += (size_t)snprintf(why + wl, sizeof(why) - wl, "; fds %+ld > +2",
                               end.fds - start.fds);
    if (start.threads >= 0 && end.threads > start.threads)
        wl += (size_t)snprintf(why + wl, sizeof(why) - wl, "; threads %+ld > 0",
                               end.threads - start.threads);
    bool good = wl == 0;
    printf("verdict: %s%s\n", good ? "ok" : "FAILED", good ? "" : why);

    free(rs);
    free(slow);
    free(model);
    dsq__bench_stop_server(spawned);
    curl_global_cleanup();
    return good ? 0 : 1;
}

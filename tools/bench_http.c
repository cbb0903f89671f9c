/* Helpers shared by the dsq-bench HTTP tools (see bench_http.h). */
#include "dsq_config.h"

#include "bench_http.h"
#include "engine/common/clock.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

/* GET url, body into a malloc'd string (NULL on failure); *status = HTTP code. */
char *dsq__bench_http_get(const char *url, long *status, double timeout_s)
{
    return dsq__bench_http_get_auth(url, NULL, status, timeout_s);
}

char *dsq__bench_http_get_auth(const char *url, const char *api_key, long *status,
                               double timeout_s)
{
    CURL *e = curl_easy_init();
    char *out = NULL;
    *status = 0;
    if (!e)
        return NULL;
    FILE *f = NULL;
    size_t len = 0;
    f = open_memstream(&out, &len);
    if (f) {
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, f);   /* default writer: fwrite */
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1e3));
        struct curl_slist *h = NULL;
        if (api_key) {
            char auth[512];
            snprintf(auth, sizeof(auth), "Authorization: Bearer %s", api_key);
            h = curl_slist_append(NULL, auth);
            curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        }
        CURLcode cc = curl_easy_perform(e);
        curl_slist_free_all(h);
        fclose(f);
        if (cc == CURLE_OK)
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
        else {
            free(out);
            out = NULL;
        }
    }
    curl_easy_cleanup(e);
    return out;
}

int dsq__bench_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof(a);
    if (fd < 0)
        return -1;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

void dsq__bench_stop_server(pid_t pid)
{
    int status;
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 300; i++) {         /* 30 s to drain and exit */
        if (waitpid(pid, &status, WNOHANG) == pid)
            return;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
}

double dsq__bench_now_s(void) { return dsq_clock_now_s(); }

uint64_t dsq__bench_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int dsq__bench_wait_ready(pid_t pid, const char *url, double timeout_s,
                          volatile sig_atomic_t *stop)
{
    char full[256];
    snprintf(full, sizeof(full), "%s/health", url);
    double t0 = dsq__bench_now_s();
    while (dsq__bench_now_s() - t0 < timeout_s && !*stop) {
        int status;
        if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid)
            return -1;
        long st;
        free(dsq__bench_http_get(full, &st, 2));
        if (st == 200)
            return 0;
        usleep(200000);
    }
    return -1;
}

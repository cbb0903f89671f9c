/* W3C Trace Context and the OTLP/HTTP JSON span exporter (see trace.h). */
#include "server/trace.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/rand.h>

#include "dsq_config.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/hex.h"
#include "engine/common/clock.h"

/* ------------------------------------------------------ trace context */

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;                       /* W3C: lowercase hex only */
}

static bool hex_bytes(const char *s, uint8_t *out, int n)
{
    bool nonzero = false;
    for (int i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
        nonzero |= out[i] != 0;
    }
    return nonzero;
}

int dsq_trace_parse_traceparent(const char *s, uint8_t trace_id[16], uint8_t parent_id[8],
                                uint8_t *flags)
{
    uint8_t ver, fl, tid[16], pid[8];
    if (!s)
        return DSQ_EINVAL;
    /* optional whitespace around a header value is not part of it */
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n < DSQ_TRACEPARENT_LEN || hexval(s[0]) < 0 || hexval(s[1]) < 0)
        return DSQ_EINVAL;
    ver = (uint8_t)(hexval(s[0]) << 4 | hexval(s[1]));
    if (ver == 0xff || (ver == 0 && n != DSQ_TRACEPARENT_LEN) ||
        (n > DSQ_TRACEPARENT_LEN && s[DSQ_TRACEPARENT_LEN] != '-'))
        return DSQ_EINVAL;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return DSQ_EINVAL;
    if (!hex_bytes(s + 3, tid, 16) || !hex_bytes(s + 36, pid, 8))
        return DSQ_EINVAL;           /* bad hex, or an all-zero id */
    if (hexval(s[53]) < 0 || hexval(s[54]) < 0)
        return DSQ_EINVAL;
    fl = (uint8_t)(hexval(s[53]) << 4 | hexval(s[54]));
    memcpy(trace_id, tid, 16);
    memcpy(parent_id, pid, 8);
    *flags = fl;
    return DSQ_OK;
}

static bool key_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
           ch == '*' || ch == '/';
}

/* one list-member "key=value" of length n (no surrounding blanks) */
static bool valid_member(const char *m, size_t n)
{
    const char *eq = memchr(m, '=', n);
    if (!eq)
        return false;
    size_t kn = (size_t)(eq - m), vn = n - kn - 1;
    if (kn == 0 || kn > 256 || vn == 0 || vn > 256)
        return false;
    if (!((m[0] >= 'a' && m[0] <= 'z') || (m[0] >= '0' && m[0] <= '9')))
        return false;
    int at = 0;
    for (size_t i = 0; i < kn; i++) {
        if (m[i] == '@') {
            if (++at > 1 || i == 0 || i + 1 == kn || kn - i - 1 > 14)
                return false;
        } else if (!key_char(m[i])) {
            return false;
        }
    }
    for (size_t i = 0; i < vn; i++) {
        unsigned char ch = (unsigned char)eq[1 + i];
        if (ch < 0x20 || ch > 0x7e || ch == ',' || ch == '=')
            return false;
    }
    return eq[vn] != ' ';            /* the last value character is not blank */
}

bool dsq_trace_valid_tracestate(const char *s)
{
    if (!s)
        return false;
    size_t n = strlen(s);
    int members = 0;
    if (n == 0 || n > DSQ_TRACESTATE_MAX)
        return false;
    for (const char *p = s; p <= s + n;) {
        const char *comma = memchr(p, ',', (size_t)(s + n - p));
        const char *end = comma ? comma : s + n;
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (b > a) {                 /* empty members are allowed */
            if (++members > 32 || !valid_member(a, (size_t)(b - a)))
                return false;
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    return members > 0;
}

static void random_bytes(uint8_t *out, int n)
{
    do {
        if (RAND_bytes(out, n) != 1) {
            /* OpenSSL's CSPRNG failing is not a reason to refuse a request:
             * ids only need to be unique, not secret */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                         (uint64_t)(uintptr_t)out;
            for (int i = 0; i < n; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                out[i] = (uint8_t)x;
            }
        }
        bool nz = false;
        for (int i = 0; i < n; i++)
            nz |= out[i] != 0;
        if (nz)
            return;
    } while (1);
}

void dsq_trace_new_span_id(uint8_t out[8]) { random_bytes(out, 8); }

static bool ratio_keeps(const uint8_t trace_id[16], double ratio)
{
    uint64_t v = 0;
    if (ratio >= 1.0)
        return true;
    if (!(ratio > 0.0))
        return false;
    for (int i = 8; i < 16; i++)
        v = v << 8 | trace_id[i];
    return (double)v < ratio * 18446744073709551616.0;
}

void dsq_trace_begin(const dsq_sampler_t *smp, const char *traceparent,
                     const char *tracestate, dsq_trace_ctx_t *out)
{
    uint8_t fl = 0;
    memset(out, 0, sizeof(*out));
    out->has_parent = traceparent &&
        dsq_trace_parse_traceparent(traceparent, out->trace_id, out->parent_id, &fl) == DSQ_OK;
    if (!out->has_parent)
        random_bytes(out->trace_id, 16);
    /* tracestate only means something beside a valid traceparent */
    if (out->has_parent && dsq_trace_valid_tracestate(tracestate))
        snprintf(out->tracestate, sizeof(out->tracestate), "%s", tracestate);
    random_bytes(out->span_id, 8);
    dsq_sampler_t def = {DSQ_SAMPLER_PARENT_ON, 1.0};
    if (!smp)
        smp = &def;
    bool keep;
    bool parent_kind = smp->kind == DSQ_SAMPLER_PARENT_ON || smp->kind == DSQ_SAMPLER_PARENT_OFF ||
                       smp->kind == DSQ_SAMPLER_PARENT_RATIO;
    if (parent_kind && out->has_parent) {
        keep = (fl & 1) != 0;
    } else {
        switch (smp->kind) {
        case DSQ_SAMPLER_OFF:
        case DSQ_SAMPLER_PARENT_OFF: keep = false; break;
        case DSQ_SAMPLER_RATIO:
        case DSQ_SAMPLER_PARENT_RATIO: keep = ratio_keeps(out->trace_id, smp->ratio); break;
        default: keep = true; break;
        }
    }
    /* the other flag bits are not ours to keep (W3C: set only known ones) */
    out->flags = keep ? 1 : 0;
}

static void hex_out(char *dst, const uint8_t *b, int n)
{
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < n; i++) {
        dst[2 * i] = d[b[i] >> 4];
        dst[2 * i + 1] = d[b[i] & 15];
    }
    dst[2 * n] = '\0';
}

void dsq_trace_format(const dsq_trace_ctx_t *c, char out[DSQ_TRACEPARENT_LEN + 1])
{
    char tid[33], sid[17];
    hex_out(tid, c->trace_id, 16);
    hex_out(sid, c->span_id, 8);
    snprintf(out, DSQ_TRACEPARENT_LEN + 1, "00-%s-%s-%02x", tid, sid, c->flags);
}

int64_t dsq_trace_clock_offset_ns(void)
{
    struct timespec rt, mt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    return ((int64_t)rt.tv_sec - (int64_t)mt.tv_sec) * 1000000000 +
           ((int64_t)rt.tv_nsec - (int64_t)mt.tv_nsec);
}

/* -------------------------------------------------------------- spans */

static void add_ns(cJSON *o, const char *key, int64_t ns)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%lld", (long long)(ns > 0 ? ns : 0));
    cJSON_AddStringToObject(o, key, buf);
}

cJSON *dsq_span_new(const uint8_t trace_id[16], const uint8_t span_id[8],
                    const uint8_t *parent_id, const char *name, int kind,
                    int64_t start_ns, int64_t end_ns)
{
    char tid[33], sid[17], pid[17];
    cJSON *s = cJSON_CreateObject();
    if (!s)
        return NULL;
    hex_out(tid, trace_id, 16);
    hex_out(sid, span_id, 8);
    cJSON_AddStringToObject(s, "traceId", tid);
    cJSON_AddStringToObject(s, "spanId", sid);
    if (parent_id) {
        hex_out(pid, parent_id, 8);
        cJSON_AddStringToObject(s, "parentSpanId", pid);
    }
    cJSON_AddStringToObject(s, "name", name);
    cJSON_AddNumberToObject(s, "kind", kind);
    add_ns(s, "startTimeUnixNano", start_ns);
    add_ns(s, "endTimeUnixNano", end_ns < start_ns ? start_ns : end_ns);
    if (!cJSON_AddArrayToObject(s, "attributes") || !cJSON_GetObjectItem(s, "endTimeUnixNano")) {
        cJSON_Delete(s);
        return NULL;
    }
    return s;
}

static void attr_add(cJSON *span, const char *key, cJSON *value)
{
    cJSON *a = span ? cJSON_GetObjectItem(span, "attributes") : NULL;
    cJSON *kv = a && value ? cJSON_CreateObject() : NULL;
    if (!kv) {
        cJSON_Delete(value);
        return;
    }
    cJSON_AddStringToObject(kv, "key", key);
    cJSON_AddItemToObject(kv, "value", value);
    cJSON_AddItemToArray(a, kv);
}

static cJSON *any_str(const char *v, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    char *t = malloc(n + 1);
    if (!o || !t) {
        cJSON_Delete(o);
        free(t);
        return NULL;
    }
    memcpy(t, v, n);
    t[n] = '\0';
    cJSON_AddStringToObject(o, "stringValue", t);
    free(t);
    return o;
}

void dsq_span_attr_strn(cJSON *span, const char *key, const char *v, size_t n)
{
    if (v)
        attr_add(span, key, any_str(v, n));
}

void dsq_span_attr_str(cJSON *span, const char *key, const char *v)
{
    if (v)
        dsq_span_attr_strn(span, key, v, strlen(v));
}

void dsq_span_attr_int(cJSON *span, const char *key, int64_t v)
{
    char buf[24];
    cJSON *o = cJSON_CreateObject();
    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    if (o)
        cJSON_AddStringToObject(o, "intValue", buf);   /* int64: a string in JSON */
    attr_add(span, key, o);
}

void dsq_span_attr_double(cJSON *span, const char *key, double v)
{
    if (!isfinite(v))
        return;                      /* JSON has no NaN/Inf */
    cJSON *o = cJSON_CreateObject();
    if (o)
        cJSON_AddNumberToObject(o, "doubleValue", v);
    attr_add(span, key, o);
}

void dsq_span_attr_bool(cJSON *span, const char *key, bool v)
{
    cJSON *o = cJSON_CreateObject();
    if (o)
        cJSON_AddBoolToObject(o, "boolValue", v);
    attr_add(span, key, o);
}

void dsq_span_attr_strs(cJSON *span, const char *key, const char *const *v, int n)
{
    cJSON *o = cJSON_CreateObject(), *arr = o ? cJSON_CreateObject() : NULL;
    cJSON *vals = arr ? cJSON_AddArrayToObject(arr, "values") : NULL;
    if (!vals) {
        cJSON_Delete(o);
        cJSON_Delete(arr);
        return;
    }
    cJSON_AddItemToObject(o, "arrayValue", arr);
    for (int i = 0; i < n; i++) {
        cJSON *s = any_str(v[i] ? v[i] : "", v[i] ? strlen(v[i]) : 0);
        if (s)
            cJSON_AddItemToArray(vals, s);
    }
    attr_add(span, key, o);
}

void dsq_span_status(cJSON *span, int code, const char *message)
{
    cJSON *st = cJSON_CreateObject();
    if (!st)
        return;
    if (message && *message)
        cJSON_AddStringToObject(st, "message", message);
    cJSON_AddNumberToObject(st, "code", code);
    cJSON_DeleteItemFromObject(span, "status");
    cJSON_AddItemToObject(span, "status", st);
}

void dsq_span_trace_state(cJSON *span, const char *tracestate)
{
    if (tracestate && *tracestate)
        cJSON_AddStringToObject(span, "traceState", tracestate);
}

/* ------------------------------------------------------ configuration */

static const char *env_get(dsq_getenv_fn env, const char *name)
{
    const char *v = env ? env(name) : NULL;
    return v && *v ? v : NULL;
}

static int fail(char *err, size_t n, const char *fmt, const char *a, const char *b)
{
    if (err && n)
        snprintf(err, n, fmt, a, b ? b : "");
    return DSQ_EINVAL;
}

/* Percent-decoding of a W3C Baggage value (the format of
 * OTEL_RESOURCE_ATTRIBUTES and OTEL_EXPORTER_OTLP_HEADERS). malloc'd; NULL
 * when malformed (a '%' without two hex digits) or on ENOMEM. */
static char *pct_decode(const char *s, size_t n)
{
    char *out = malloc(n + 1);
    size_t k = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            out[k++] = s[i];
            continue;
        }
        int hi = i + 1 < n ? dsq_hex_value(s[i + 1]) : -1;
        int lo = i + 2 < n ? dsq_hex_value(s[i + 2]) : -1;
        if (hi < 0 || lo < 0) {
            free(out);
            return NULL;
        }
        out[k++] = (char)(hi << 4 | lo);
        i += 2;
    }
    out[k] = '\0';
    return out;
}

typedef int (*member_fn)(void *user, const char *key, const char *value);

/* "k1=v1,k2=v2": keys and values trimmed, values percent-decoded; empty
 * members skipped. DSQ_EINVAL on a member without '=' or with an empty
 * key, a bad escape, or what fn returns. */
static int parse_members(const char *s, member_fn fn, void *user)
{
    while (s && *s) {
        const char *comma = strchr(s, ','), *end = comma ? comma : s + strlen(s);
        const char *a = s, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (b > a) {
            const char *eq = memchr(a, '=', (size_t)(b - a));
            const char *ke = eq;
            if (!eq)
                return DSQ_EINVAL;
            while (ke > a && (ke[-1] == ' ' || ke[-1] == '\t'))
                ke--;
            const char *vs = eq + 1;
            while (vs < b && (*vs == ' ' || *vs == '\t'))
                vs++;
            if (ke == a)
                return DSQ_EINVAL;
            char *key = strndup(a, (size_t)(ke - a));
            char *val = pct_decode(vs, (size_t)(b - vs));
            int rc = key && val ? fn(user, key, val) : DSQ_EINVAL;
            free(key);
            free(val);
            if (rc)
                return rc;
        }
        s = comma ? comma + 1 : NULL;
    }
    return DSQ_OK;
}

static int add_resource_attr(void *user, const char *key, const char *value)
{
    cJSON *arr = user;
    cJSON *kv = cJSON_CreateObject(), *v = cJSON_CreateObject();
    if (!kv || !v) {
        cJSON_Delete(kv);
        cJSON_Delete(v);
        return DSQ_ENOMEM;
    }
    /* a key given twice: the last one wins */
    int n = cJSON_GetArraySize(arr);
    for (int i = 0; i < n; i++) {
        cJSON *k = cJSON_GetObjectItem(cJSON_GetArrayItem(arr, i), "key");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, key)) {
            cJSON_DeleteItemFromArray(arr, i);
            break;
        }
    }
    cJSON_AddStringToObject(kv, "key", key);
    cJSON_AddStringToObject(v, "stringValue", value);
    cJSON_AddItemToObject(kv, "value", v);
    cJSON_AddItemToArray(arr, kv);
    return DSQ_OK;
}

static bool token_char(unsigned char ch)
{
    /* RFC 9110 5.6.2 tchar */
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int add_header(void *user, const char *key, const char *value)
{
    dsq_otlp_config_t *c = user;
    for (const char *p = key; *p; p++)
        if (!token_char((unsigned char)*p))
            return DSQ_EINVAL;
    for (const char *p = value; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\t')
            return DSQ_EINVAL;       /* no CR/LF: no header injection */
    if (!strcasecmp(key, "content-type") || !strcasecmp(key, "content-length"))
        return DSQ_EINVAL;
    char **h = realloc(c->headers, (size_t)(c->n_headers + 1) * sizeof(*h));
    if (!h)
        return DSQ_ENOMEM;
    c->headers = h;
    size_t n = strlen(key) + strlen(value) + 3;
    if (!(h[c->n_headers] = malloc(n)))
        return DSQ_ENOMEM;
    snprintf(h[c->n_headers++], n, "%s: %s", key, value);
    return DSQ_OK;
}

static int env_int(dsq_getenv_fn env, const char *name, int lo, int hi, int *out, char *err,
                   size_t err_len)
{
    const char *v = env_get(env, name);
    char *end;
    if (!v)
        return DSQ_OK;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof(range), "an integer in [%d, %d]", lo, hi);
        if (err && err_len)
            snprintf(err, err_len, "%s=%s: not %s", name, v, range);
        return DSQ_EINVAL;
    }
    *out = (int)x;
    return DSQ_OK;
}

/* http(s)://host...; returns whether the URL names a scheme we speak and a
 * host */
static bool http_url(const char *u)
{
    const char *h = !strncasecmp(u, "http://", 7) ? u + 7
                  : !strncasecmp(u, "https://", 8) ? u + 8 : NULL;
    if (!h || !*h || *h == '/' || *h == ':' || *h == '?' || *h == '#')
        return false;
    for (const char *p = u; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return false;
    return true;
}

/* base + "/v1/traces" (spec: OTEL_EXPORTER_OTLP_ENDPOINT); a base whose
 * path already ends in /v1/traces is kept (--otlp-endpoint only) */
static char *traces_url(const char *base, bool keep_full)
{
    size_t n = strlen(base);
    const char *suffix = "/v1/traces";
    if (keep_full && n >= 10 && !strcmp(base + n - 10, suffix))
        return strdup(base);
    while (n && base[n - 1] == '/')
        n--;
    char *u = malloc(n + 11);
    if (u) {
        memcpy(u, base, n);
        memcpy(u + n, suffix, 11);
    }
    return u;
}

static const struct { const char *name; dsq_sampler_kind_t kind; } samplers[] = {
    {"parentbased_always_on", DSQ_SAMPLER_PARENT_ON},
    {"parentbased_always_off", DSQ_SAMPLER_PARENT_OFF},
    {"parentbased_traceidratio", DSQ_SAMPLER_PARENT_RATIO},
    {"always_on", DSQ_SAMPLER_ON},
    {"always_off", DSQ_SAMPLER_OFF},
    {"traceidratio", DSQ_SAMPLER_RATIO},
};

int dsq_otlp_config_load(dsq_otlp_config_t *c, const dsq_options_t *o, dsq_getenv_fn env,
                         char *err, size_t err_len)
{
    const char *v;
    int rc = DSQ_OK;
    memset(c, 0, sizeof(*c));
    c->max_queue = 2048;
    c->max_batch = 512;
    c->delay_ms = 5000;
    c->timeout_ms = 10000;
    c->sampler = (dsq_sampler_t){DSQ_SAMPLER_PARENT_ON, 1.0};
    c->export_prompt = o && o->otlp_export_prompt;
    if (!(c->resource = cJSON_CreateArray()))
        return DSQ_ENOMEM;

    /* the sampler applies to propagation as well (the sampled flag) */
    if ((v = env_get(env, "OTEL_TRACES_SAMPLER"))) {
        size_t i;
        for (i = 0; i < sizeof(samplers) / sizeof(samplers[0]); i++)
            if (!strcmp(v, samplers[i].name))
                break;
        if (i == sizeof(samplers) / sizeof(samplers[0])) {
            rc = fail(err, err_len, "OTEL_TRACES_SAMPLER=%s: not one of always_on, always_off, "
                      "traceidratio, parentbased_always_on, parentbased_always_off, "
                      "parentbased_traceidratio%s", v, "");
            goto out;
        }
        c->sampler.kind = samplers[i].kind;
        if (c->sampler.kind == DSQ_SAMPLER_RATIO || c->sampler.kind == DSQ_SAMPLER_PARENT_RATIO) {
            const char *a = env_get(env, "OTEL_TRACES_SAMPLER_ARG");
            char *end = NULL;
            double r = a ? strtod(a, &end) : 1.0;
            if (a && (end == a || *end || !(r >= 0.0 && r <= 1.0))) {
                rc = fail(err, err_len, "OTEL_TRACES_SAMPLER_ARG=%s: not a ratio in [0, 1]%s",
                          a, "");
                goto out;
            }
            c->sampler.ratio = r;
        }
    }

    v = env_get(env, "OTEL_SDK_DISABLED");
    if (v && !strcasecmp(v, "true"))
        goto out;                    /* off: endpoint stays NULL */
    v = env_get(env, "OTEL_TRACES_EXPORTER");
    if (v && !strcmp(v, "none"))
        goto out;
    if (v && strcmp(v, "otlp")) {
        rc = fail(err, err_len, "OTEL_TRACES_EXPORTER=%s: dsqd exports traces with otlp "
                  "(or none)%s", v, "");
        goto out;
    }
    {
        const char *flag = o && o->otlp_endpoint && *o->otlp_endpoint ? o->otlp_endpoint : NULL;
        const char *full = env_get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        const char *base = env_get(env, "OTEL_EXPORTER_OTLP_ENDPOINT");
        const char *src = flag ? "--otlp-endpoint" : full ? "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
                                                          : "OTEL_EXPORTER_OTLP_ENDPOINT";
        const char *url = flag ? flag : full ? full : base;
        if (!url)
            goto out;                /* no endpoint: tracing off */
        if (!http_url(url)) {
            rc = fail(err, err_len, "%s %s: not an http:// or https:// URL", src, url);
            goto out;
        }
        c->endpoint = flag ? traces_url(flag, true) : full ? strdup(full) : traces_url(base, false);
        if (!c->endpoint) {
            rc = DSQ_ENOMEM;
            goto out;
        }
    }
    v = env_get(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
    if (!v)
        v = env_get(env, "OTEL_EXPORTER_OTLP_PROTOCOL");
    if (v && strcmp(v, "http/json")) {
        rc = fail(err, err_len, "OTLP protocol %s: dsqd sends http/json (OTLP/HTTP with JSON "
                  "encoding; a Collector's otlp receiver takes it on port 4318)%s", v, "");
        goto out;
    }
    v = env_get(env, "OTEL_EXPORTER_OTLP_HEADERS");
    if (v && (rc = parse_members(v, add_header, c)) != DSQ_OK) {
        rc = fail(err, err_len, "OTEL_EXPORTER_OTLP_HEADERS: %s%s",
                  rc == DSQ_ENOMEM ? "out of memory"
                                   : "not a list of name=value (percent-encoded) header fields",
                  "");
        goto out;
    }
    v = env_get(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS");
    if (v && (rc = parse_members(v, add_header, c)) != DSQ_OK) {
        rc = fail(err, err_len, "OTEL_EXPORTER_OTLP_TRACES_HEADERS: %s%s",
                  "not a list of name=value (percent-encoded) header fields", "");
        goto out;
    }
    if ((rc = env_int(env, "OTEL_EXPORTER_OTLP_TIMEOUT", 1, 600000, &c->timeout_ms, err,
                      err_len)) ||
        (rc = env_int(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 1, 600000, &c->timeout_ms, err,
                      err_len)) ||
        (rc = env_int(env, "OTEL_BSP_SCHEDULE_DELAY", 0, 3600000, &c->delay_ms, err, err_len)) ||
        (rc = env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", 1, 1 << 20, &c->max_queue, err,
                      err_len)) ||
        (rc = env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1, 1 << 20, &c->max_batch, err,
                      err_len)))
        goto out;
    if (c->max_batch > c->max_queue)
        c->max_batch = c->max_queue;     /* spec: the batch cannot exceed the queue */

    /* resource: OTEL_RESOURCE_ATTRIBUTES, then service.name over it */
    v = env_get(env, "OTEL_RESOURCE_ATTRIBUTES");
    if (v && parse_members(v, add_resource_attr, c->resource) != DSQ_OK) {
        /* spec: a malformed value is discarded as a whole, with an error */
        dsq_log(DSQ_LOG_WARN, "event=otel_resource_attributes_ignored reason=\"not a list of "
                              "key=value (percent-encoded)\"");
        cJSON_Delete(c->resource);
        if (!(c->resource = cJSON_CreateArray())) {
            rc = DSQ_ENOMEM;
            goto out;
        }
    }
    {
        const char *svc = env_get(env, "OTEL_SERVICE_NAME");
        bool have_svc = false, have_ver = false;
        int n = cJSON_GetArraySize(c->resource);
        for (int i = 0; i < n; i++) {
            cJSON *k = cJSON_GetObjectItem(cJSON_GetArrayItem(c->resource, i), "key");
            have_svc |= cJSON_IsString(k) && !strcmp(k->valuestring, "service.name");
            have_ver |= cJSON_IsString(k) && !strcmp(k->valuestring, "service.version");
        }
        if (svc || !have_svc)
            add_resource_attr(c->resource, "service.name", svc ? svc : "dsqd");
        if (!have_ver)
            add_resource_attr(c->resource, "service.version", DSQ_VERSION);
        add_resource_attr(c->resource, "telemetry.sdk.name", "dsqd");
    }
out:
    if (rc)
        dsq_otlp_config_deinit(c);
    return rc;
}

void dsq_otlp_config_deinit(dsq_otlp_config_t *c)
{
    if (!c)
        return;
    free(c->endpoint);
    cJSON_Delete(c->resource);
    for (int i = 0; i < c->n_headers; i++)
        free(c->headers[i]);
    free(c->headers);
    memset(c, 0, sizeof(*c));
}

/* ----------------------------------------------------------- exporter */

struct dsq_otlp {
    dsq_otlp_config_t c;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cJSON **q;                       /* ring of c.max_queue spans             */
    int head, n;
    double t_first;                  /* monotonic s when the oldest queued
                                        span of the next batch arrived       */
    bool quit;
    double t_flush_end;              /* quit: give up on the collector then   */
    dsq_otlp_stats_t st;
    /* exporter thread only */
    CURL *curl;
    struct curl_slist *hdrs;
    char resp[4096];
    size_t resp_len;
    double t_warned;
    int64_t n_unwarned;
};

char *dsq_otlp_encode(const dsq_otlp_config_t *c, cJSON *const *spans, int n)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *rss = cJSON_AddArrayToObject(root, "resourceSpans");
    cJSON *rs = cJSON_CreateObject();
    cJSON *res = cJSON_AddObjectToObject(rs, "resource");
    cJSON *sss = cJSON_AddArrayToObject(rs, "scopeSpans");
    cJSON *ss = cJSON_CreateObject();
    cJSON *scope = cJSON_AddObjectToObject(ss, "scope");
    cJSON *arr = cJSON_AddArrayToObject(ss, "spans");
    char *out = NULL;
    if (!root || !rss || !rs || !res || !sss || !ss || !scope || !arr)
        goto done;
    cJSON_AddItemToArray(rss, rs);
    rs = NULL;
    cJSON_AddItemToArray(sss, ss);
    ss = NULL;
    if (c->resource)
        cJSON_AddItemReferenceToObject(res, "attributes", c->resource);
    cJSON_AddStringToObject(scope, "name", "dsqd");
    cJSON_AddStringToObject(scope, "version", DSQ_VERSION);
    for (int i = 0; i < n; i++)
        if (!cJSON_AddItemReferenceToArray(arr, spans[i]))
            goto done;
    out = cJSON_PrintUnformatted(root);
done:
    cJSON_Delete(rs);
    cJSON_Delete(ss);
    cJSON_Delete(root);              /* references: the spans stay */
    return out;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *user)
{
    dsq_otlp_t *x = user;
    size_t n = sz * nm, room = sizeof(x->resp) - 1 - x->resp_len;
    memcpy(x->resp + x->resp_len, p, n < room ? n : room);
    x->resp_len += n < room ? n : room;
    return n;
}

/* Log an export failure: the first, then at most one line a minute with
 * the count since the last one. */
static void warn_failure(dsq_otlp_t *x, const char *why, long status)
{
    double t = dsq_clock_now_s();
    x->n_unwarned++;
    if (x->t_warned > 0 && t - x->t_warned < 60)
        return;
    dsq_log(DSQ_LOG_WARN, "event=otlp_export_failed endpoint=%s status=%ld reason=\"%s\" "
                          "failures=%lld", x->c.endpoint, status, why,
            (long long)x->n_unwarned);
    x->t_warned = t;
    x->n_unwarned = 0;
}

/* POST one batch; returns the spans the collector took (the batch less a
 * partial success's rejectedSpans), or -1 when it failed */
static int64_t export_batch(dsq_otlp_t *x, cJSON **spans, int n, long timeout_ms)
{
    char *body = dsq_otlp_encode(&x->c, spans, n);
    long status = 0;
    int64_t took = -1;
    if (!body) {
        warn_failure(x, "out of memory", 0);
        return -1;
    }
    x->resp_len = 0;
    curl_easy_setopt(x->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(x->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(x->curl, CURLOPT_TIMEOUT_MS, timeout_ms > 0 ? timeout_ms : 1L);
    CURLcode cc = curl_easy_perform(x->curl);
    if (cc == CURLE_OK)
        curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK) {
        warn_failure(x, curl_easy_strerror(cc), 0);
    } else if (status < 200 || status > 299) {
        warn_failure(x, "the collector refused the export", status);
    } else {
        took = n;
        x->resp[x->resp_len] = '\0';
        /* OTLP: a 2xx may carry partialSuccess.rejectedSpans */
        cJSON *r = x->resp_len ? cJSON_Parse(x->resp) : NULL;
        cJSON *ps = cJSON_GetObjectItem(r, "partialSuccess");
        cJSON *rj = cJSON_GetObjectItem(ps, "rejectedSpans");
        double k = cJSON_IsNumber(rj) ? rj->valuedouble
                 : cJSON_IsString(rj) ? strtod(rj->valuestring, NULL) : 0;
        if (k > 0)
            took = n - (k < n ? (int64_t)k : n);
        cJSON_Delete(r);
    }
    free(body);
    return took;
}

static void *exporter_main(void *arg)
{
    dsq_otlp_t *x = arg;
    cJSON **batch = malloc((size_t)x->c.max_batch * sizeof(*batch));
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (!x->quit && x->n < x->c.max_batch &&
               (x->n == 0 || dsq_clock_now_s() < x->t_first + x->c.delay_ms / 1e3)) {
            if (x->n == 0) {
                pthread_cond_wait(&x->cv, &x->mu);
            } else {
                double t = x->t_first + x->c.delay_ms / 1e3;
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9, dt = t - now;
                if (dt <= 0)
                    break;
                ts.tv_sec += (time_t)dt;
                ts.tv_nsec += (long)((dt - (double)(time_t)dt) * 1e9);
                if (ts.tv_nsec >= 1000000000) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000;
                }
                pthread_cond_timedwait(&x->cv, &x->mu, &ts);
            }
        }
        if (x->n == 0 && x->quit)
            break;
        if (x->n == 0)
            continue;
        long timeout = x->c.timeout_ms;
        if (x->quit) {
            double left = x->t_flush_end - dsq_clock_now_s();
            if (left <= 0 || !batch) {
                /* the flush time is over: what is left is lost */
                x->st.dropped_export_failed += x->n;
                while (x->n) {
                    cJSON_Delete(x->q[x->head]);
                    x->head = (x->head + 1) % x->c.max_queue;
                    x->n--;
                }
                break;
            }
            if (left * 1e3 < timeout)
                timeout = (long)(left * 1e3) + 1;
        }
        int k = 0;
        while (batch && x->n && k < x->c.max_batch) {
            batch[k++] = x->q[x->head];
            x->head = (x->head + 1) % x->c.max_queue;
            x->n--;
        }
        x->t_first = dsq_clock_now_s();
        pthread_mutex_unlock(&x->mu);
        int64_t took = k ? export_batch(x, batch, k, timeout) : 0;
        for (int i = 0; i < k; i++)
            cJSON_Delete(batch[i]);
        pthread_mutex_lock(&x->mu);
        if (k) {
            x->st.export_requests++;
            if (took < 0) {
                x->st.export_failures++;
                x->st.dropped_export_failed += k;
            } else {
                x->st.exported += took;
                x->st.dropped_export_failed += k - took;
            }
        }
        if (!batch) {
            /* no memory for a batch: drop, so the queue never fills for good */
            x->st.dropped_export_failed += x->n;
            while (x->n) {
                cJSON_Delete(x->q[x->head]);
                x->head = (x->head + 1) % x->c.max_queue;
                x->n--;
            }
        }
    }
    pthread_mutex_unlock(&x->mu);
    free(batch);
    return NULL;
}

static int copy_config(dsq_otlp_config_t *dst, const dsq_otlp_config_t *src)
{
    *dst = *src;
    dst->endpoint = strdup(src->endpoint);
    dst->resource = cJSON_Duplicate(src->resource, 1);
    dst->headers = src->n_headers ? calloc((size_t)src->n_headers, sizeof(char *)) : NULL;
    if (!dst->endpoint || !dst->resource || (src->n_headers && !dst->headers)) {
        dst->n_headers = 0;
        return DSQ_ENOMEM;
    }
    for (int i = 0; i < src->n_headers; i++)
        if (!(dst->headers[i] = strdup(src->headers[i])))
            return DSQ_ENOMEM;
    return DSQ_OK;
}

dsq_otlp_t *dsq_otlp_create(const dsq_otlp_config_t *c, char *err, size_t err_len)
{
    dsq_otlp_t *x = calloc(1, sizeof(*x));
    if (!c || !c->endpoint) {
        free(x);
        fail(err, err_len, "no OTLP endpoint%s%s", "", "");
        return NULL;
    }
    if (!x || copy_config(&x->c, c) ||
        !(x->q = calloc((size_t)c->max_queue, sizeof(*x->q))) || !(x->curl = curl_easy_init()))
        goto oom;
    x->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; x->hdrs && i < x->c.n_headers; i++) {
        struct curl_slist *h = curl_slist_append(x->hdrs, x->c.headers[i]);
        if (!h)
            goto oom;
        x->hdrs = h;
    }
    if (!x->hdrs)
        goto oom;
    curl_easy_setopt(x->curl, CURLOPT_URL, x->c.endpoint);
    curl_easy_setopt(x->curl, CURLOPT_HTTPHEADER, x->hdrs);
    curl_easy_setopt(x->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(x->curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(x->curl, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(x->c.timeout_ms < 5000 ? x->c.timeout_ms : 5000));
    curl_easy_setopt(x->curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(x->curl, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->curl, CURLOPT_USERAGENT, "dsqd/" DSQ_VERSION);
    pthread_mutex_init(&x->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&x->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (pthread_create(&x->thread, NULL, exporter_main, x)) {
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->cv);
        fail(err, err_len, "cannot start the OTLP exporter thread%s%s", "", "");
        goto fail_free;
    }
    dsq_log(DSQ_LOG_INFO, "event=otlp_exporter endpoint=%s max_queue=%d max_batch=%d "
                          "delay_ms=%d timeout_ms=%d headers=%d export_prompt=%d",
            x->c.endpoint, x->c.max_queue, x->c.max_batch, x->c.delay_ms, x->c.timeout_ms,
            x->c.n_headers, x->c.export_prompt);
    return x;
oom:
    fail(err, err_len, "out of memory%s%s", "", "");
fail_free:
    if (x) {
        if (x->curl)
            curl_easy_cleanup(x->curl);
        curl_slist_free_all(x->hdrs);
        free(x->q);
        dsq_otlp_config_deinit(&x->c);
        free(x);
    }
    return NULL;
}

void dsq_otlp_destroy(dsq_otlp_t *x, int flush_ms)
{
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    x->quit = true;
    x->t_flush_end = dsq_clock_now_s() + (flush_ms > 0 ? flush_ms : 0) / 1e3;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thread, NULL);
    curl_easy_cleanup(x->curl);
    curl_slist_free_all(x->hdrs);
    for (; x->n; x->n--, x->head = (x->head + 1) % x->c.max_queue)
        cJSON_Delete(x->q[x->head]);
    free(x->q);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    dsq_otlp_config_deinit(&x->c);
    free(x);
}

bool dsq_otlp_submit(dsq_otlp_t *x, cJSON *span)
{
    if (!x || !span) {
        cJSON_Delete(span);
        return false;
    }
    pthread_mutex_lock(&x->mu);
    if (x->n >= x->c.max_queue || x->quit) {
        x->st.dropped_queue_full++;
        pthread_mutex_unlock(&x->mu);
        cJSON_Delete(span);
        return false;
    }
    x->q[(x->head + x->n) % x->c.max_queue] = span;
    if (x->n++ == 0)
        x->t_first = dsq_clock_now_s();
    if (x->n == 1 || x->n == x->c.max_batch)
        pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    return true;
}

void dsq_otlp_stats(dsq_otlp_t *x, dsq_otlp_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    *out = x->st;
    out->queued = x->n;
    pthread_mutex_unlock(&x->mu);
}

const dsq_otlp_config_t *dsq_otlp_config(const dsq_otlp_t *x) { return x ? &x->c : NULL; }

/* server/trace.c: W3C Trace Context parsing (the spec's examples and its
 * validity rules), sampling, the OTEL_* configuration rules of the
 * OpenTelemetry SDK spec, the OTLP JSON encoding, and the exporter's
 * bounded queue and failure counting (against a closed loopback port;
 * the e2e suite checks a real receiver, tests/e2e/test_tracing.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "engine/common/error.h"
#include "server/trace.h"

/* W3C Trace Context 3.2.2.3's example */
#define TP_EXAMPLE "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static void test_traceparent_valid(void **st)
{
    (void)st;
    uint8_t tid[16], pid[8], fl = 0xaa;
    assert_int_equal(dsq_trace_parse_traceparent(TP_EXAMPLE, tid, pid, &fl), DSQ_OK);
    assert_int_equal(tid[0], 0x4b);
    assert_int_equal(tid[15], 0x36);
    assert_int_equal(pid[0], 0x00);
    assert_int_equal(pid[1], 0xf0);
    assert_int_equal(pid[7], 0xb7);
    assert_int_equal(fl, 1);
    /* optional whitespace around the value */
    assert_int_equal(dsq_trace_parse_traceparent(" " TP_EXAMPLE "\t", tid, pid, &fl), DSQ_OK);
    /* a later version may append fields after a '-' (3.2.4) */
    assert_int_equal(dsq_trace_parse_traceparent(
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-the-future-holds",
        tid, pid, &fl), DSQ_OK);
    assert_int_equal(fl, 0);
}

static void test_traceparent_invalid(void **st)
{
    (void)st;
    static const char *bad[] = {
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",          /* short */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",         /* uppercase */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",         /* zero trace */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",         /* zero parent */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",         /* version ff */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",   /* 00 + more */
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",        /* no '-' */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",         /* separator */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",         /* not hex */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",         /* flags */
        "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",         /* version */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t tid[16], pid[8], fl;
        if (dsq_trace_parse_traceparent(bad[i], tid, pid, &fl) != DSQ_EINVAL)
            fail_msg("accepted %s", bad[i]);
    }
}

static void test_tracestate(void **st)
{
    (void)st;
    assert_true(dsq_trace_valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
    assert_true(dsq_trace_valid_tracestate("fw529a3039@dt=1, ,vendor/x=a b"));
    assert_false(dsq_trace_valid_tracestate(""));
    assert_false(dsq_trace_valid_tracestate("Rojo=1"));       /* uppercase key */
    assert_false(dsq_trace_valid_tracestate("rojo="));        /* empty value */
    assert_false(dsq_trace_valid_tracestate("=1"));
    assert_false(dsq_trace_valid_tracestate("a=b=c"));
    assert_false(dsq_trace_valid_tracestate("a=b\n"));
    char many[400] = "";
    for (int i = 0; i < 33; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sk%d=v", i ? "," : "", i);
    assert_false(dsq_trace_valid_tracestate(many));           /* 33 members */
    char big[600];
    memset(big, 'a', sizeof(big) - 1);
    big[0] = 'k';
    big[1] = '=';
    big[sizeof(big) - 1] = '\0';
    assert_false(dsq_trace_valid_tracestate(big));            /* > 512 bytes */
}

static bool all_zero(const uint8_t *b, int n)
{
    for (int i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void test_begin_and_sampling(void **st)
{
    (void)st;
    dsq_trace_ctx_t c;
    uint8_t tid[16], pid[8], fl;
    dsq_sampler_t pb = {DSQ_SAMPLER_PARENT_ON, 1.0};
    assert_int_equal(dsq_trace_parse_traceparent(TP_EXAMPLE, tid, pid, &fl), DSQ_OK);

    dsq_trace_begin(&pb, TP_EXAMPLE, "rojo=1", &c);
    assert_true(c.has_parent);
    assert_memory_equal(c.trace_id, tid, 16);
    assert_memory_equal(c.parent_id, pid, 8);
    assert_memory_not_equal(c.span_id, pid, 8);
    assert_false(all_zero(c.span_id, 8));
    assert_int_equal(c.flags, 1);
    assert_string_equal(c.tracestate, "rojo=1");

    /* round trip: our traceparent names the same trace and our span */
    char out[DSQ_TRACEPARENT_LEN + 1];
    dsq_trace_format(&c, out);
    assert_int_equal(strlen(out), DSQ_TRACEPARENT_LEN);
    uint8_t t2[16], p2[8], f2;
    assert_int_equal(dsq_trace_parse_traceparent(out, t2, p2, &f2), DSQ_OK);
    assert_memory_equal(t2, tid, 16);
    assert_memory_equal(p2, c.span_id, 8);
    assert_int_equal(f2, 1);

    /* parent-based: the caller's "not sampled" is kept */
    dsq_trace_begin(&pb, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", NULL, &c);
    assert_int_equal(c.flags, 0);
    /* always_on ignores it */
    dsq_sampler_t on = {DSQ_SAMPLER_ON, 1.0};
    dsq_trace_begin(&on, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", NULL, &c);
    assert_int_equal(c.flags, 1);
    /* parentbased_always_off: sampled parents are still followed; roots not */
    dsq_sampler_t pboff = {DSQ_SAMPLER_PARENT_OFF, 1.0};
    dsq_trace_begin(&pboff, TP_EXAMPLE, NULL, &c);
    assert_int_equal(c.flags, 1);
    dsq_trace_begin(&pboff, NULL, NULL, &c);
    assert_int_equal(c.flags, 0);
    /* invalid traceparent: a new trace, tracestate dropped with it */
    dsq_trace_begin(&pb, "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "rojo=1", &c);
    assert_false(c.has_parent);
    assert_false(all_zero(c.trace_id, 16));
    assert_string_equal(c.tracestate, "");
    assert_int_equal(c.flags, 1);
    /* two new traces differ */
    dsq_trace_ctx_t d;
    dsq_trace_begin(NULL, NULL, NULL, &d);
    assert_memory_not_equal(c.trace_id, d.trace_id, 16);

    /* traceidratio: the last 8 bytes of the trace id against ratio x 2^64 */
    dsq_sampler_t half = {DSQ_SAMPLER_RATIO, 0.5};
    dsq_trace_begin(&half, "00-4bf92f3577b34da60000000000000001-00f067aa0ba902b7-00", NULL, &c);
    assert_int_equal(c.flags, 1);      /* ratio ignores the parent's flag */
    dsq_trace_begin(&half, "00-4bf92f3577b34da6ffffffffffffffff-00f067aa0ba902b7-01", NULL, &c);
    assert_int_equal(c.flags, 0);
    dsq_sampler_t pbhalf = {DSQ_SAMPLER_PARENT_RATIO, 0.5};
    dsq_trace_begin(&pbhalf, "00-4bf92f3577b34da6ffffffffffffffff-00f067aa0ba902b7-01", NULL, &c);
    assert_int_equal(c.flags, 1);      /* parent-based: the parent decides */
    dsq_sampler_t zero = {DSQ_SAMPLER_RATIO, 0.0};
    for (int i = 0; i < 50; i++) {
        dsq_trace_begin(&zero, NULL, NULL, &c);
        assert_int_equal(c.flags, 0);
    }
}

/* ---------------------------------------------------------- config */

static const char *fake_env[32][2];

static const char *env_fake(const char *name)
{
    for (int i = 0; fake_env[i][0]; i++)
        if (!strcmp(fake_env[i][0], name))
            return fake_env[i][1];
    return NULL;
}

static void env_set(int n, ...)
{
    va_list ap;
    memset(fake_env, 0, sizeof(fake_env));
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        fake_env[i][0] = va_arg(ap, const char *);
        fake_env[i][1] = va_arg(ap, const char *);
    }
    va_end(ap);
}

static const char *resource_value(const dsq_otlp_config_t *c, const char *key)
{
    cJSON *kv;
    cJSON_ArrayForEach(kv, c->resource) {
        cJSON *k = cJSON_GetObjectItem(kv, "key");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, key))
            return cJSON_GetObjectItem(cJSON_GetObjectItem(kv, "value"), "stringValue")
                ->valuestring;
    }
    return NULL;
}

static void test_config_endpoints(void **st)
{
    (void)st;
    dsq_otlp_config_t c;
    dsq_options_t o = {0};
    char err[256];

    env_set(0);
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_null(c.endpoint);                     /* nothing set: off */
    assert_int_equal(c.sampler.kind, DSQ_SAMPLER_PARENT_ON);
    dsq_otlp_config_deinit(&c);

    env_set(1, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_string_equal(c.endpoint, "http://collector:4318/v1/traces");
    assert_int_equal(c.max_queue, 2048);
    assert_int_equal(c.max_batch, 512);
    assert_int_equal(c.delay_ms, 5000);
    assert_int_equal(c.timeout_ms, 10000);
    assert_string_equal(resource_value(&c, "service.name"), "dsqd");
    dsq_otlp_config_deinit(&c);

    /* the signal-specific endpoint is used as is, and wins */
    env_set(2, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b:443/custom/path");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_string_equal(c.endpoint, "https://b:443/custom/path");
    dsq_otlp_config_deinit(&c);

    /* the flag wins over both: a base URL, or a full one ending in /v1/traces */
    o.otlp_endpoint = "http://127.0.0.1:4318";
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_string_equal(c.endpoint, "http://127.0.0.1:4318/v1/traces");
    dsq_otlp_config_deinit(&c);
    o.otlp_endpoint = "http://127.0.0.1:4318/v1/traces";
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_string_equal(c.endpoint, "http://127.0.0.1:4318/v1/traces");
    dsq_otlp_config_deinit(&c);

    /* off switches */
    env_set(1, "OTEL_SDK_DISABLED", "true");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_null(c.endpoint);
    dsq_otlp_config_deinit(&c);
    env_set(1, "OTEL_TRACES_EXPORTER", "none");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_null(c.endpoint);
    dsq_otlp_config_deinit(&c);

    /* refusals, each with its reason */
    static const char *refused[][3] = {
        {"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "grpc"},
        {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf", "http/protobuf"},
        {"OTEL_TRACES_EXPORTER", "zipkin", "zipkin"},
        {"OTEL_TRACES_SAMPLER", "sometimes", "sometimes"},
        {"OTEL_BSP_MAX_QUEUE_SIZE", "0", "OTEL_BSP_MAX_QUEUE_SIZE"},
        {"OTEL_BSP_SCHEDULE_DELAY", "5s", "OTEL_BSP_SCHEDULE_DELAY"},
        {"OTEL_EXPORTER_OTLP_TIMEOUT", "-1", "OTEL_EXPORTER_OTLP_TIMEOUT"},
        {"OTEL_EXPORTER_OTLP_HEADERS", "a=b%0D%0AX-Evil: 1", "OTEL_EXPORTER_OTLP_HEADERS"},
        {"OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign", "OTEL_EXPORTER_OTLP_HEADERS"},
        {"OTEL_EXPORTER_OTLP_HEADERS", "bad name=1", "OTEL_EXPORTER_OTLP_HEADERS"},
        {"OTEL_EXPORTER_OTLP_HEADERS", "a=%zz", "OTEL_EXPORTER_OTLP_HEADERS"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        env_set(1, refused[i][0], refused[i][1]);
        err[0] = '\0';
        if (dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)) != DSQ_EINVAL)
            fail_msg("%s=%s accepted", refused[i][0], refused[i][1]);
        if (!strstr(err, refused[i][2]))
            fail_msg("%s=%s: reason '%s' does not name %s", refused[i][0], refused[i][1], err,
                     refused[i][2]);
        assert_null(c.endpoint);
        assert_null(c.resource);
    }
    /* a ratio outside [0, 1] */
    env_set(2, "OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "1.5");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "1.5"));
    env_set(0);
    o.otlp_endpoint = "ftp://collector/";
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_EINVAL);
    assert_non_null(strstr(err, "--otlp-endpoint"));
    o.otlp_endpoint = "http:///v1/traces";
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_EINVAL);
}

static void test_config_values(void **st)
{
    (void)st;
    dsq_otlp_config_t c;
    dsq_options_t o = {.otlp_endpoint = "http://127.0.0.1:4318", .otlp_export_prompt = true};
    char err[256];
    env_set(9, "OTEL_EXPORTER_OTLP_HEADERS", " api-key = s3cr%20t , x-tenant=a%2Cb",
            "OTEL_SERVICE_NAME", "dsq-east",
            "OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored,deployment.environment=prod%20eu,"
                                        "host.name=gpu-1",
            "OTEL_TRACES_SAMPLER", "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG", "0.25",
            "OTEL_BSP_MAX_QUEUE_SIZE", "100",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "500",
            "OTEL_BSP_SCHEDULE_DELAY", "250",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1500");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_int_equal(c.n_headers, 2);
    assert_string_equal(c.headers[0], "api-key: s3cr t");
    assert_string_equal(c.headers[1], "x-tenant: a,b");
    /* OTEL_SERVICE_NAME over the resource attributes' service.name */
    assert_string_equal(resource_value(&c, "service.name"), "dsq-east");
    assert_string_equal(resource_value(&c, "deployment.environment"), "prod eu");
    assert_string_equal(resource_value(&c, "host.name"), "gpu-1");
    assert_non_null(resource_value(&c, "service.version"));
    assert_int_equal(c.sampler.kind, DSQ_SAMPLER_PARENT_RATIO);
    assert_true(c.sampler.ratio == 0.25);
    assert_int_equal(c.max_queue, 100);
    assert_int_equal(c.max_batch, 100);        /* clamped to the queue */
    assert_int_equal(c.delay_ms, 250);
    assert_int_equal(c.timeout_ms, 1500);
    assert_true(c.export_prompt);
    dsq_otlp_config_deinit(&c);

    /* a malformed OTEL_RESOURCE_ATTRIBUTES is dropped as a whole (spec) */
    env_set(2, "OTEL_RESOURCE_ATTRIBUTES", "a=1,broken", "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://x:1");
    o.otlp_endpoint = NULL;
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    assert_null(resource_value(&c, "a"));
    assert_string_equal(resource_value(&c, "service.name"), "dsqd");
    dsq_otlp_config_deinit(&c);
}

/* ---------------------------------------------------------- encoding */

static cJSON *attr(cJSON *span, const char *key)
{
    cJSON *kv;
    cJSON_ArrayForEach(kv, cJSON_GetObjectItem(span, "attributes")) {
        if (!strcmp(cJSON_GetObjectItem(kv, "key")->valuestring, key))
            return cJSON_GetObjectItem(kv, "value");
    }
    return NULL;
}

static void test_encode(void **st)
{
    (void)st;
    dsq_otlp_config_t c;
    dsq_options_t o = {.otlp_endpoint = "http://127.0.0.1:9"};
    char err[128];
    env_set(1, "OTEL_SERVICE_NAME", "enc");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    dsq_trace_ctx_t t;
    dsq_trace_begin(NULL, TP_EXAMPLE, NULL, &t);
    cJSON *s = dsq_span_new(t.trace_id, t.span_id, t.parent_id, "POST /v1/completions",
                            DSQ_SPAN_SERVER, 1700000000123456789LL, 1700000000223456789LL);
    assert_non_null(s);
    dsq_span_attr_str(s, "gen_ai.request.model", "m");
    dsq_span_attr_int(s, "gen_ai.usage.input_tokens", 12);
    dsq_span_attr_double(s, "gen_ai.request.temperature", 0.5);
    dsq_span_attr_double(s, "nan", 0.0 / 0.0);      /* left out: JSON has no NaN */
    dsq_span_attr_bool(s, "dsq.request.stream", true);
    const char *stops[] = {"\n", "END"};
    dsq_span_attr_strs(s, "gen_ai.request.stop_sequences", stops, 2);
    dsq_span_status(s, DSQ_STATUS_ERROR, "boom");
    dsq_span_trace_state(s, "rojo=1");
    cJSON *spans[1] = {s};
    char *body = dsq_otlp_encode(&c, spans, 1);
    assert_non_null(body);
    cJSON *root = cJSON_Parse(body);
    assert_non_null(root);
    cJSON *rs = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "resourceSpans"), 0);
    cJSON *ss = cJSON_GetArrayItem(cJSON_GetObjectItem(rs, "scopeSpans"), 0);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(ss, "scope"), "name")->valuestring,
                        "dsqd");
    cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(ss, "spans"), 0);
    assert_string_equal(cJSON_GetObjectItem(e, "traceId")->valuestring,
                        "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_string_equal(cJSON_GetObjectItem(e, "parentSpanId")->valuestring, "00f067aa0ba902b7");
    assert_int_equal(strlen(cJSON_GetObjectItem(e, "spanId")->valuestring), 16);
    assert_string_equal(cJSON_GetObjectItem(e, "startTimeUnixNano")->valuestring,
                        "1700000000123456789");
    assert_int_equal(cJSON_GetObjectItem(e, "kind")->valueint, 2);
    assert_string_equal(cJSON_GetObjectItem(attr(e, "gen_ai.usage.input_tokens"),
                                            "intValue")->valuestring, "12");
    assert_true(cJSON_GetObjectItem(attr(e, "gen_ai.request.temperature"),
                                    "doubleValue")->valuedouble == 0.5);
    assert_null(attr(e, "nan"));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(attr(e, "dsq.request.stream"), "boolValue")));
    cJSON *vals = cJSON_GetObjectItem(
        cJSON_GetObjectItem(attr(e, "gen_ai.request.stop_sequences"), "arrayValue"), "values");
    assert_int_equal(cJSON_GetArraySize(vals), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(vals, 1), "stringValue")
                            ->valuestring, "END");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "status"), "code")->valueint, 2);
    assert_string_equal(cJSON_GetObjectItem(e, "traceState")->valuestring, "rojo=1");
    cJSON *res = cJSON_GetObjectItem(cJSON_GetObjectItem(rs, "resource"), "attributes");
    assert_true(cJSON_GetArraySize(res) >= 2);
    cJSON_Delete(root);
    free(body);
    cJSON_Delete(s);              /* encode borrowed it */
    dsq_otlp_config_deinit(&c);
}

/* ---------------------------------------------------------- exporter */

static cJSON *some_span(void)
{
    dsq_trace_ctx_t t;
    dsq_trace_begin(NULL, NULL, NULL, &t);
    return dsq_span_new(t.trace_id, t.span_id, NULL, "x", DSQ_SPAN_INTERNAL, 1, 2);
}

static void test_exporter_dead_collector(void **st)
{
    (void)st;
    dsq_otlp_config_t c;
    /* port 1 on loopback: nothing listens; connections are refused */
    dsq_options_t o = {.otlp_endpoint = "http://127.0.0.1:1"};
    char err[128];
    env_set(2, "OTEL_BSP_SCHEDULE_DELAY", "10", "OTEL_EXPORTER_OTLP_TIMEOUT", "2000");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    dsq_otlp_t *x = dsq_otlp_create(&c, err, sizeof(err));
    assert_non_null(x);
    for (int i = 0; i < 3; i++)
        assert_true(dsq_otlp_submit(x, some_span()));
    dsq_otlp_stats_t s;
    for (int i = 0; i < 500; i++) {
        dsq_otlp_stats(x, &s);
        if (s.dropped_export_failed == 3)
            break;
        usleep(10000);
    }
    assert_int_equal(s.dropped_export_failed, 3);
    assert_true(s.export_failures >= 1);
    assert_int_equal(s.exported, 0);
    assert_int_equal(s.queued, 0);
    dsq_otlp_destroy(x, 100);
    dsq_otlp_config_deinit(&c);
}

static void test_exporter_queue_bound(void **st)
{
    (void)st;
    dsq_otlp_config_t c;
    dsq_options_t o = {.otlp_endpoint = "http://127.0.0.1:1"};
    char err[128];
    /* a long delay: nothing leaves the queue while the test fills it */
    env_set(3, "OTEL_BSP_SCHEDULE_DELAY", "600000", "OTEL_BSP_MAX_QUEUE_SIZE", "2",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2");
    assert_int_equal(dsq_otlp_config_load(&c, &o, env_fake, err, sizeof(err)), DSQ_OK);
    c.max_batch = 3;              /* keep the thread waiting: batch > queue */
    dsq_otlp_t *x = dsq_otlp_create(&c, err, sizeof(err));
    assert_non_null(x);
    assert_true(dsq_otlp_submit(x, some_span()));
    assert_true(dsq_otlp_submit(x, some_span()));
    assert_false(dsq_otlp_submit(x, some_span()));   /* full: dropped, not waited for */
    assert_false(dsq_otlp_submit(NULL, some_span()));
    dsq_otlp_stats_t s;
    dsq_otlp_stats(x, &s);
    assert_int_equal(s.dropped_queue_full, 1);
    assert_int_equal(s.queued, 2);
    /* no flush time: the rest is dropped at once, nothing is sent */
    dsq_otlp_destroy(x, 0);
    dsq_otlp_config_deinit(&c);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traceparent_valid),
        cmocka_unit_test(test_traceparent_invalid),
        cmocka_unit_test(test_tracestate),
        cmocka_unit_test(test_begin_and_sampling),
        cmocka_unit_test(test_config_endpoints),
        cmocka_unit_test(test_config_values),
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_exporter_dead_collector),
        cmocka_unit_test(test_exporter_queue_bound),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}

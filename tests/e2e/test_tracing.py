"""Request tracing against a real OTLP/HTTP receiver.

The receiver is a loopback HTTP server taking POST /v1/traces; every body
is parsed with the official opentelemetry-proto package
(google.protobuf.json_format into ExportTraceServiceRequest), so a field
dsqd names or encodes wrongly fails the parse. The tests check W3C
traceparent handling, parent/child links, the order of the spans in time,
GenAI attributes against the response's usage, that prompt text stays out
unless --otlp-export-prompt, and that a dead or stalled collector costs
requests nothing (they finish long before the collector would answer; the
spans are dropped and counted in /metrics).
"""
import http.server
import json
import re
import socket
import threading
import time

import pytest
import requests
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from conftest import MODEL_NAME, post, sse_events, free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TP_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def hex_ids_to_base64(doc):
    """OTLP/JSON writes traceId/spanId/parentSpanId as hex (the OTLP spec's
    one departure from the protobuf JSON mapping, which has base64 for
    bytes); turn them into base64 for json_format, checking their form."""
    import base64
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for key, n in (("traceId", 32), ("spanId", 16), ("parentSpanId", 16)):
                    if key in sp:
                        v = sp[key]
                        if not re.fullmatch("[0-9a-f]{%d}" % n, v):
                            raise ValueError(f"{key} {v!r} is not {n} lowercase hex digits")
                        sp[key] = base64.b64encode(bytes.fromhex(v)).decode()
    return doc


class Collector:
    """OTLP/HTTP JSON receiver on a free loopback port. stall_s > 0: hold
    every export that long before answering (a slow collector)."""

    def __init__(self, stall_s=0.0):
        self.requests = []          # ExportTraceServiceRequest messages
        self.raw = []               # bodies as received
        self.errors = []
        self.lock = threading.Lock()
        self.stall_s = stall_s
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if outer.stall_s:
                    outer.release.wait(outer.stall_s)
                try:
                    if self.path != "/v1/traces":
                        raise ValueError("path " + self.path)
                    if self.headers.get("Content-Type") != "application/json":
                        raise ValueError("content type " + str(self.headers.get("Content-Type")))
                    msg = json_format.Parse(json.dumps(hex_ids_to_base64(json.loads(body))),
                                            ExportTraceServiceRequest())
                    with outer.lock:
                        outer.requests.append(msg)
                        outer.raw.append(body)
                    code = 200
                except Exception as e:  # noqa: BLE001 - reported by the test
                    with outer.lock:
                        outer.errors.append(repr(e))
                    code = 400
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                try:
                    self.wfile.write(b"{}")
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def spans(self):
        out = []
        with self.lock:
            for r in self.requests:
                for rs in r.resource_spans:
                    res = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            out.append((res, s))
        return out

    def trace(self, trace_hex, n_min, timeout=30):
        """Spans of one trace once at least n_min arrived."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            got = [s for _, s in self.spans() if s.trace_id.hex() == trace_hex]
            if len(got) >= n_min:
                return got
            time.sleep(0.05)
        pytest.fail(f"{len(got)} spans of trace {trace_hex} after {timeout} s; "
                    f"receiver errors {self.errors}")

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()
    assert not c.errors, c.errors


FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "dsq-e2e",
               "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=e2e%20test"}


def attrs(span):
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [x.string_value for x in v.array_value.values]
        else:
            out[kv.key] = getattr(v, kind)
    return out


def chat(server, headers=None, **body):
    body.setdefault("model", MODEL_NAME)
    body.setdefault("messages", [{"role": "user", "content": "Name a colour."}])
    body.setdefault("max_tokens", 8)
    body.setdefault("temperature", 0)
    return post(server, "/v1/chat/completions", body, headers=headers)


def test_spans_of_a_chat_request(daemon_factory, collector):
    d = daemon_factory("--otlp-endpoint", collector.url, env=FAST_EXPORT)
    secret = "The passphrase is periwinkle-42."
    r = chat(d, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
                         "tracestate": "rojo=00f067aa0ba902b7"},
             messages=[{"role": "user", "content": secret}], max_tokens=12,
             temperature=0.7, top_p=0.9, seed=5, stop=["\n\n"])
    assert r.status_code == 200, r.text
    body = r.json()
    m = TP_RE.match(r.headers["traceparent"])
    assert m, r.headers.get("traceparent")
    assert m.group(1) == TRACE_ID and m.group(2) != PARENT_ID and m.group(3) == "01"
    assert r.headers["tracestate"] == "rojo=00f067aa0ba902b7"
    server_span_id = m.group(2)

    spans = collector.trace(TRACE_ID, 4)
    time.sleep(0.3)                         # any stragglers of the same request
    spans = collector.trace(TRACE_ID, 4)
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    assert set(by_name) == {"POST /v1/chat/completions", "queue", "prefill", "decode"}, by_name
    root = by_name["POST /v1/chat/completions"][0]
    assert len(by_name["POST /v1/chat/completions"]) == 1
    assert root.span_id.hex() == server_span_id
    assert root.parent_span_id.hex() == PARENT_ID
    assert root.kind == Span.SPAN_KIND_SERVER
    assert root.trace_state == "rojo=00f067aa0ba902b7"
    a = attrs(root)
    assert a["http.request.method"] == "POST"
    assert a["http.route"] == "/v1/chat/completions"
    assert a["http.response.status_code"] == 200
    assert a["client.address"] == "127.0.0.1"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == MODEL_NAME
    assert a["gen_ai.response.model"] == MODEL_NAME
    assert a["gen_ai.response.id"] == body["id"]
    assert a["gen_ai.request.max_tokens"] == 12
    assert a["gen_ai.request.temperature"] == pytest.approx(0.7, abs=1e-6)
    assert a["gen_ai.request.top_p"] == pytest.approx(0.9, abs=1e-6)
    assert a["gen_ai.request.seed"] == 5
    assert a["gen_ai.request.stop_sequences"] == ["\n\n"]
    assert a["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    assert a["gen_ai.response.finish_reasons"] == [body["choices"][0]["finish_reason"]]
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"] \
        <= a["gen_ai.latency.e2e"]
    assert "gen_ai.input.messages" not in a
    # children: every one under the server span, inside it in time, in order
    for s in spans:
        if s is not root:
            assert s.parent_span_id == root.span_id, s
            assert s.kind == Span.SPAN_KIND_INTERNAL
            assert root.start_time_unix_nano <= s.start_time_unix_nano \
                <= s.end_time_unix_nano <= root.end_time_unix_nano, s.name
    q, dec = by_name["queue"][0], by_name["decode"][0]
    pre = sorted(by_name["prefill"], key=lambda s: s.start_time_unix_nano)
    assert q.end_time_unix_nano <= pre[0].start_time_unix_nano
    assert pre[-1].end_time_unix_nano <= dec.end_time_unix_nano
    assert pre[0].start_time_unix_nano <= dec.start_time_unix_nano
    assert sum(attrs(p)["dsq.prefill.tokens"] for p in pre) == body["usage"]["prompt_tokens"]
    assert attrs(pre[0])["dsq.prefill.position"] == 0
    da = attrs(dec)
    assert da["dsq.decode.tokens"] == body["usage"]["completion_tokens"]
    assert 1 <= da["dsq.decode.steps"] <= body["usage"]["completion_tokens"]
    # wall-clock times: within a minute of now
    assert abs(root.start_time_unix_nano / 1e9 - time.time()) < 60
    res = collector.spans()[0][0]
    assert res["service.name"] == "dsq-e2e"
    assert res["deployment.environment"] == "e2e test"
    # the prompt never left the process
    with collector.lock:
        assert not any(b"periwinkle" in raw for raw in collector.raw)
    metrics = requests.get(d.url("/metrics"), timeout=10).text
    exported = float(re.search(r'^dsq:otlp_spans_exported_total\{[^}]*\} (\S+)$', metrics,
                               re.M).group(1))
    assert exported >= 4


def test_spans_of_messages_and_responses(daemon_factory, collector):
    """/v1/messages and /v1/responses are traced like chat: one server span
    named for the route, with the request's id and token counts, and the
    engine's children."""
    d = daemon_factory("--otlp-endpoint", collector.url, env=FAST_EXPORT)
    msgs = [{"role": "user", "content": "Name a colour."}]
    cases = [("/v1/messages", "1" * 32, {"model": MODEL_NAME, "max_tokens": 6,
                                          "messages": msgs}),
             ("/v1/responses", "2" * 32, {"model": MODEL_NAME, "max_output_tokens": 6,
                                           "input": "Name a colour."})]
    for route, trace, body in cases:
        r = post(d, route, body, headers={"traceparent": f"00-{trace}-{PARENT_ID}-01"})
        assert r.status_code == 200, r.text
        out = r.json()
        u = out["usage"]
        n_in = u["input_tokens"] + u.get("cache_read_input_tokens", 0)
        spans = collector.trace(trace, 4)
        roots = [s for s in spans if s.name == "POST " + route]
        assert len(roots) == 1, [s.name for s in spans]
        a = attrs(roots[0])
        assert a["http.route"] == route and a["http.response.status_code"] == 200
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.response.id"] == out["id"]
        assert a["gen_ai.usage.input_tokens"] == n_in
        assert a["gen_ai.usage.output_tokens"] == u["output_tokens"]
        assert {s.name for s in spans} >= {"queue", "prefill", "decode"}


def test_new_trace_stream_and_errors(daemon_factory, collector):
    d = daemon_factory("--otlp-endpoint", collector.url + "/v1/traces", env=FAST_EXPORT)
    # no traceparent: a new trace, the server span is a root
    r = post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": "Once upon a time",
                                    "max_tokens": 6, "stream": True}, stream=True)
    assert r.status_code == 200
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    m = TP_RE.match(r.headers["traceparent"])
    assert m and m.group(1) != TRACE_ID and m.group(3) == "01"
    spans = collector.trace(m.group(1), 4)
    root = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER][0]
    assert root.parent_span_id == b""
    a = attrs(root)
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["dsq.request.stream"] is True
    # invalid traceparents are ignored (a new trace), never an error
    for bad in ["00-" + TRACE_ID.upper() + "-" + PARENT_ID + "-01",
                "00-" + "0" * 32 + "-" + PARENT_ID + "-01",
                "ff-" + TRACE_ID + "-" + PARENT_ID + "-01", "garbage"]:
        r = chat(d, headers={"traceparent": bad}, max_tokens=1)
        assert r.status_code == 200
        m = TP_RE.match(r.headers["traceparent"])
        assert m and m.group(1) != TRACE_ID.lower(), bad
    # a 400 is traced too: a client error, not a span error
    r = post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": -1},
             headers={"traceparent": f"00-{'ab' * 16}-{PARENT_ID}-01"})
    assert r.status_code == 400
    assert TP_RE.match(r.headers["traceparent"]).group(1) == "ab" * 16
    (root,) = collector.trace("ab" * 16, 1)
    a = attrs(root)
    assert a["http.response.status_code"] == 400
    assert a["error.type"]
    assert root.status.code == Status.STATUS_CODE_UNSET
    # a 404 on an unknown route: the span is named by the method alone
    r = requests.get(d.url("/no/such/route"), timeout=10,
                     headers={"traceparent": f"00-{'cd' * 16}-{PARENT_ID}-01"})
    assert r.status_code == 404
    (root,) = collector.trace("cd" * 16, 1)
    assert root.name == "GET" and "http.route" not in attrs(root)


def test_unsampled_parent_is_not_exported(daemon_factory, collector):
    d = daemon_factory("--otlp-endpoint", collector.url, env=FAST_EXPORT)
    r = chat(d, headers={"traceparent": f"00-{'11' * 16}-{PARENT_ID}-00"}, max_tokens=2)
    assert r.status_code == 200
    assert r.headers["traceparent"].endswith("-00")
    # a sampled request after it: once its spans are in, the other's would be
    r = chat(d, headers={"traceparent": f"00-{'22' * 16}-{PARENT_ID}-01"}, max_tokens=2)
    collector.trace("22" * 16, 4)
    time.sleep(0.3)
    assert not [s for _, s in collector.spans() if s.trace_id.hex() == "11" * 16]


def test_export_prompt_flag(daemon_factory, collector):
    d = daemon_factory("--otlp-endpoint", collector.url, "--otlp-export-prompt",
                       env=FAST_EXPORT)
    r = chat(d, headers={"traceparent": f"00-{'33' * 16}-{PARENT_ID}-01"},
             messages=[{"role": "user", "content": "periwinkle"}], max_tokens=2)
    assert r.status_code == 200
    spans = collector.trace("33" * 16, 4)
    root = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER][0]
    msgs = json.loads(attrs(root)["gen_ai.input.messages"])
    assert msgs[0]["content"] == "periwinkle"


def test_speculation_attributes(daemon_factory, collector):
    # a reply that copies its prompt: the decode span says how many drafts
    # were scored and kept; a request that opts out has neither attribute
    d = daemon_factory("--otlp-endpoint", collector.url, "--speculative-ngram", "8",
                       env=FAST_EXPORT)
    text = "alpha beta gamma delta epsilon zeta eta theta " * 4
    r = chat(d, headers={"traceparent": f"00-{'55' * 16}-{PARENT_ID}-01"},
             messages=[{"role": "user", "content": "Repeat exactly: " + text}],
             max_tokens=40, temperature=0)
    assert r.status_code == 200
    spans = collector.trace("55" * 16, 4)
    da = attrs([s for s in spans if s.name == "decode"][0])
    assert 0 < da["dsq.spec.accepted_tokens"] <= da["dsq.spec.draft_tokens"]
    assert da["dsq.decode.steps"] < da["dsq.decode.tokens"]
    r = chat(d, headers={"traceparent": f"00-{'66' * 16}-{PARENT_ID}-01"},
             messages=[{"role": "user", "content": "Repeat exactly: " + text}],
             max_tokens=40, temperature=0, speculative=False)
    assert r.status_code == 200
    spans = collector.trace("66" * 16, 4)
    da = attrs([s for s in spans if s.name == "decode"][0])
    assert "dsq.spec.draft_tokens" not in da


def test_spans_flushed_at_shutdown(daemon_factory, collector):
    # a batch delay far beyond the test: only the shutdown flush sends it
    d = daemon_factory("--otlp-endpoint", collector.url,
                       env={"OTEL_BSP_SCHEDULE_DELAY": "600000"})
    r = chat(d, headers={"traceparent": f"00-{'44' * 16}-{PARENT_ID}-01"}, max_tokens=2)
    assert r.status_code == 200
    time.sleep(0.5)
    assert not collector.spans()
    assert d.stop() == 0
    assert len([s for _, s in collector.spans() if s.trace_id.hex() == "44" * 16]) >= 4


def metric(text, name, reason=None):
    lbl = r'\{[^}]*reason="%s"[^}]*\}' % reason if reason else r'\{[^}]*\}'
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), lbl), text, re.M)
    assert m, name
    return float(m.group(1))


def timed_requests(d, n):
    worst = 0.0
    for _ in range(n):
        t0 = time.time()
        r = chat(d, max_tokens=4)
        worst = max(worst, time.time() - t0)
        assert r.status_code == 200, r.text
    return worst


def test_dead_collector_costs_nothing(daemon_factory):
    # a port nothing listens on: every export fails at connect
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    d = daemon_factory("--otlp-endpoint", f"http://127.0.0.1:{dead}", env=FAST_EXPORT)
    timed_requests(d, 6)
    t0 = time.time()
    while time.time() - t0 < 20:
        text = requests.get(d.url("/metrics"), timeout=10).text
        if metric(text, "dsq:otlp_spans_dropped_total", "export_failed") >= 6 * 4:
            break
        time.sleep(0.1)
    assert metric(text, "dsq:otlp_spans_dropped_total", "export_failed") >= 6 * 4
    assert metric(text, "dsq:otlp_export_failures_total") >= 1
    assert metric(text, "dsq:otlp_spans_exported_total") == 0
    assert "otlp_export_failed" in d.log_tail()


def test_stalled_collector_costs_nothing(daemon_factory):
    # the collector holds every export for 60 s (dsqd gives up after its
    # 20 s timeout); the queue holds 8 spans: the rest are dropped, counted
    stall = Collector(stall_s=60)
    try:
        d = daemon_factory("--otlp-endpoint", stall.url,
                           env={"OTEL_BSP_SCHEDULE_DELAY": "10", "OTEL_BSP_MAX_QUEUE_SIZE": "8",
                                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4",
                                "OTEL_EXPORTER_OTLP_TIMEOUT": "20000"})
        worst = timed_requests(d, 12)
        # 12 requests of 4 tokens on a stalled exporter: each one finishes
        # like any request, nowhere near the stall or the export timeout
        assert worst < 10, worst
        text = requests.get(d.url("/metrics"), timeout=10).text
        assert metric(text, "dsq:otlp_spans_dropped_total", "queue_full") >= 12 * 4 - 8 - 4
        assert metric(text, "dsq:otlp_spans_queued") <= 8
        # SIGTERM while an export hangs: the daemon still exits, within
        # the export timeout it gives the last spans
        t0 = time.time()
        assert d.stop(timeout=60) == 0
        assert time.time() - t0 < 45
    finally:
        stall.close()


def test_bad_tracing_config_refused(daemon_factory):
    import subprocess
    from conftest import model_path
    import os
    exe = os.environ["DSQD"]
    for extra, env, needle in [
            (["--otlp-endpoint", "ftp://127.0.0.1/"], {}, "--otlp-endpoint"),
            (["--otlp-endpoint", "http://127.0.0.1:4318"],
             {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
            ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                  "OTEL_EXPORTER_OTLP_HEADERS": "a=b%0D%0Ax"}, "OTEL_EXPORTER_OTLP_HEADERS"),
            ([], {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
             "OTEL_TRACES_SAMPLER_ARG")]:
        full = dict(os.environ, **env)
        p = subprocess.run([exe, "--model", model_path(), "--port", str(free_port()), *extra],
                           env=full, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (extra, env, p.stderr)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0], p.stderr

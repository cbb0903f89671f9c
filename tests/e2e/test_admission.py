"""Admission policies (issue 23): static (fixed bounds) against adaptive
(a concurrency limit moved by --target-ttft-ms / --target-itl-ms). A burst
far beyond what the target allows: static serves everything (late), the
adaptive policy serves some and refuses the rest at once with 503, an
OpenAI error object and Retry-After, and says so in /metrics."""
import json
import os
import re
import subprocess
import threading
import time

import requests

from conftest import MODEL_NAME, free_port, model_path


def burst(d, n, max_tokens=24):
    out = [None] * n

    def one(i):
        t0 = time.time()
        r = requests.post(d.url("/v1/completions"), timeout=300,
                          json={"model": MODEL_NAME, "prompt": f"Story {i}: once upon a time",
                                "max_tokens": max_tokens, "temperature": 0,
                                "ignore_eos": True})
        out[i] = (r, time.time() - t0)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def metric(text, name, **labels):
    lbl = "".join(r'(?=[^}]*%s="%s")' % (k, v) for k, v in labels.items())
    m = re.search(r"^%s\{%s[^}]*\} (\S+)$" % (re.escape(name), lbl), text, re.M)
    assert m, (name, labels)
    return float(m.group(1))


def test_adaptive_refuses_excess_quickly(daemon_factory):
    d = daemon_factory("--admission-policy", "adaptive", "--target-ttft-ms", "1500",
                       "--max-num-seqs", "16")
    res = burst(d, 48)
    ok = [(r, t) for r, t in res if r.status_code == 200]
    refused = [(r, t) for r, t in res if r.status_code == 503]
    assert len(ok) + len(refused) == 48, [r.status_code for r, _ in res]
    assert ok and refused
    for r, _ in ok:
        assert r.json()["usage"]["completion_tokens"] == 24
    for r, t in refused:
        e = r.json()["error"]
        assert e["code"] == "queue_full" and "adaptive concurrency limit" in e["message"]
        assert int(r.headers["Retry-After"]) >= 2          # ceil(1.5 s)
    # refused at arrival: in far less time than serving one takes
    fastest_ok = min(t for _, t in ok)
    at_once = [t for r, t in refused if "waited" not in r.json()["error"]["message"]]
    assert at_once and max(at_once) < fastest_ok
    text = requests.get(d.url("/metrics"), timeout=10).text
    assert metric(text, "dsq:admission_policy", policy="adaptive") == 1
    assert metric(text, "dsq:admission_refused_total", reason="limit") + \
        metric(text, "dsq:admission_refused_total", reason="queue_wait") == len(refused)
    assert 1 <= metric(text, "dsq:admission_limit") <= 16
    assert metric(text, "dsq:admission_requests_held") == 0
    # the server is fine after it
    r = requests.post(d.url("/v1/completions"), timeout=60,
                      json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


def test_static_serves_the_burst(daemon_factory):
    d = daemon_factory("--max-num-seqs", "16")
    res = burst(d, 24, max_tokens=8)
    assert [r.status_code for r, _ in res] == [200] * 24
    text = requests.get(d.url("/metrics"), timeout=10).text
    assert metric(text, "dsq:admission_policy", policy="static") == 1
    assert "dsq:admission_limit{" not in text


def test_adaptive_needs_a_target():
    p = subprocess.run([os.environ["DSQD"], "--model", model_path(), "--port", str(free_port()),
                        "--admission-policy", "adaptive"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--target-ttft-ms" in lines[0], p.stderr


def test_adaptive_streamed_refusals_are_503(daemon_factory):
    """A streamed request held back by the adaptive policy gets no 200
    until it is admitted, so one refused after waiting is a 503 with
    Retry-After and an error object, like one refused at arrival, and
    every 200 stream is a whole answer. The first requests' 96 tokens take
    longer than the 750 ms a held one may wait, so some are refused after
    waiting."""
    d = daemon_factory("--admission-policy", "adaptive", "--target-ttft-ms", "1500",
                       "--max-num-seqs", "16")
    n = 48
    out = [None] * n

    def one(i):
        with requests.post(d.url("/v1/completions"), timeout=300, stream=True,
                           json={"model": MODEL_NAME, "prompt": f"Story {i}: once upon a time",
                                 "max_tokens": 96, "temperature": 0, "ignore_eos": True,
                                 "stream": True}) as r:
            out[i] = (r.status_code, dict(r.headers), r.content.decode())
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ok = [o for o in out if o[0] == 200]
    refused = [o for o in out if o[0] == 503]
    assert len(ok) + len(refused) == n, [o[0] for o in out]
    assert ok and refused
    for _, _, body in ok:
        assert '"error"' not in body and body.rstrip().endswith("data: [DONE]"), body[-300:]
        events = [ln[6:] for ln in body.splitlines() if ln.startswith("data: {")]
        assert sum(1 for e in events if '"finish_reason":"length"' in e) == 1, body[-300:]
    waited = 0
    for _, headers, body in refused:
        e = json.loads(body)["error"]
        assert e["code"] == "queue_full" and "adaptive concurrency limit" in e["message"], e
        assert int(headers["Retry-After"]) >= 2
        waited += "waited" in e["message"]
    assert waited >= 1, [json.loads(b)["error"]["message"] for _, _, b in refused]

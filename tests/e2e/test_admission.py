"""Admission policies: static (fixed bounds) against adaptive
(a concurrency limit moved by --target-ttft-ms / --target-itl-ms). A burst
far beyond what the target allows: static serves everything (late), the
adaptive policy serves some and refuses the rest at once with 503, an
OpenAI error object and Retry-After, and says so in /metrics."""
import json
import os
import re
import socket
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


def wait_metric(d, name, want, timeout):
    """Poll /metrics until name == want; the last value seen."""
    t_end = time.time() + timeout
    while True:
        v = metric(requests.get(d.url("/metrics"), timeout=10).text, name)
        if v == want or time.time() > t_end:
            return v
        time.sleep(0.05)


def raw_post(d, path, body):
    """A request on a socket of our own, to hang up on at will."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    return s


def test_held_requests_that_hang_up_leave_the_queue(daemon_factory):
    """Two requests held behind two long ones (the limit is 2, and so is
    the queue); the second held one (not the oldest, a chat stream whose
    role chunk is pending) hangs up. It leaves the queue at once, not when
    it reaches the head or its wait runs out (the target is 20 s: a held
    one may wait 10 s); the oldest then runs when the long ones' clients
    hang up too."""
    d = daemon_factory("--admission-policy", "adaptive", "--target-ttft-ms", "20000",
                       "--max-num-seqs", "2")
    longs = [raw_post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": f"Story {i}:",
                                             "max_tokens": 2000, "temperature": 0,
                                             "ignore_eos": True}) for i in range(2)]
    assert wait_metric(d, "dsq:num_requests_running", 2, 30) == 2
    res = {}

    def head():
        res["head"] = requests.post(d.url("/v1/completions"), timeout=120,
                                    json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 4})
    t = threading.Thread(target=head)
    t.start()
    assert wait_metric(d, "dsq:admission_requests_held", 1, 10) == 1
    s = raw_post(d, "/v1/chat/completions", {"model": MODEL_NAME, "stream": True,
                                             "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "Hi"}]})
    assert wait_metric(d, "dsq:admission_requests_held", 2, 10) == 2
    s.settimeout(0.5)
    try:
        got = s.recv(1)
    except socket.timeout:
        got = None                 # no 200 while held: as it should be
    assert got is None, "a held stream got an answer or was closed: %r" % got
    s.close()
    assert wait_metric(d, "dsq:admission_requests_held", 1, 3) == 1
    text = requests.get(d.url("/metrics"), timeout=10).text
    assert metric(text, "dsq:num_requests_running") == 2        # the long ones, still going
    for c in longs:
        c.close()
    t.join(timeout=120)
    assert res["head"].status_code == 200, res["head"].text
    assert wait_metric(d, "dsq:admission_requests_held", 0, 3) == 0


def test_one_refused_prompt_refuses_the_list(daemon_factory):
    """A list of two prompts at a limit of 1: the first runs at once, the
    second waits behind it past half the TTFT target and is refused. The
    request is a 503 (streamed: no 200 with an error inside), and the
    first prompt, whose answer nobody will read, is cancelled then, not
    computed to its 2000 tokens."""
    d = daemon_factory("--admission-policy", "adaptive", "--target-ttft-ms", "1000",
                       "--max-num-seqs", "1")
    generated = 0
    for stream in (False, True):
        r = requests.post(d.url("/v1/completions"), timeout=300, stream=stream,
                          json={"model": MODEL_NAME, "prompt": ["Once upon a time", "Hello"],
                                "max_tokens": 2000, "temperature": 0, "ignore_eos": True,
                                "stream": stream})
        assert r.status_code == 503, (stream, r.status_code, r.text[:300])
        e = r.json()["error"]
        assert e["code"] == "queue_full" and "waited" in e["message"], e
        assert int(r.headers["Retry-After"]) >= 1
        assert wait_metric(d, "dsq:num_requests_running", 0, 5) == 0, stream
        # the first prompt stopped when the second was refused (~0.5 s in)
        total = metric(requests.get(d.url("/metrics"), timeout=10).text,
                       "dsq:generation_tokens_total")
        assert total - generated < 1000, (stream, total - generated)
        generated = total

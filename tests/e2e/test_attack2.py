"""Regression tests for the second adversarial pass (attack2): bugs found by
attacking the echo/logprobs, best_of, keep-alive and HTTP edge features.

Each test names the bug it pins down; all run against the real dsqd on a
loopback port (conftest.py).
"""
import json
import resource
import socket
import time

import pytest
import requests

from conftest import MODEL_NAME, post, raw_http, sse_events

PROMPT = "The capital of France is a city named"


def test_score_only_every_choice_finishes_length(server):
    """echo + max_tokens 0 with n > 1 (or best_of > n): the engine skipped
    the fork, so choices 1.. came back with finish_reason "abort"."""
    for extra in ({"n": 3, "logprobs": 2}, {"n": 2, "best_of": 3}):
        body = {"model": MODEL_NAME, "prompt": PROMPT, "echo": True,
                "max_tokens": 0, **extra}
        r = post(server, "/v1/completions", body)
        assert r.status_code == 200, r.text
        j = r.json()
        assert len(j["choices"]) == extra["n"]
        assert [c["finish_reason"] for c in j["choices"]] == ["length"] * extra["n"]
        assert all(c["text"] == PROMPT for c in j["choices"])
        assert j["usage"]["completion_tokens"] == 0
        if "logprobs" in extra:
            lps = [c["logprobs"] for c in j["choices"]]
            assert all(lp and len(lp["tokens"]) == j["usage"]["prompt_tokens"] for lp in lps)
    r = requests.post(server.url("/v1/completions"), stream=True, timeout=120,
                      json={"model": MODEL_NAME, "prompt": PROMPT, "echo": True,
                            "logprobs": 1, "max_tokens": 0, "n": 2, "stream": True})
    assert r.status_code == 200
    fin = {}
    for ev in sse_events(r):
        if ev != "[DONE]":
            for c in ev["choices"]:
                if c["finish_reason"]:
                    fin[c["index"]] = c["finish_reason"]
    assert fin == {0: "length", 1: "length"}


def test_transfer_encoding_with_content_length_refused(server):
    """Transfer-Encoding + Content-Length (request smuggling, RFC 9112 6.3)
    was answered 200 from the chunked body; duplicate Content-Length on a
    GET route was not checked at all."""
    body = json.dumps({"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1})
    req = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
           "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
           f"Content-Length: 5\r\n\r\n{len(body):x}\r\n{body}\r\n0\r\n\r\n"
           "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    out = raw_http(server.port, req.encode())
    head = out.split(b"\r\n\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 400"), out[:200]
    assert b"connection: close" in head.lower()
    # nothing after the ambiguous body is served on that connection
    assert out.count(b"HTTP/1.1 ") == 1, out
    out = raw_http(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    assert requests.get(server.url("/health"), timeout=10).status_code == 200


def test_raw_nul_byte_refused(server):
    """A raw NUL byte inside a JSON string silently cut the prompt (cJSON
    ends C strings there); only the \\u0000 escape was refused."""
    data = b'{"model":"%s","prompt":"a\x00b","max_tokens":1}' % MODEL_NAME.encode()
    r = post(server, "/v1/completions", raw=data)
    assert r.status_code == 400, r.text
    assert "U+0000" in r.json()["error"]["message"]
    data = b'{"model":"%s","messages":[{"role":"user","content":"a\x00b"}]}' % MODEL_NAME.encode()
    assert post(server, "/v1/chat/completions", raw=data).status_code == 400
    # nor after the value: a C string's terminator is not JSON whitespace
    data = b'{"model":"%s","prompt":"ab","max_tokens":1}\x00' % MODEL_NAME.encode()
    r = post(server, "/v1/completions", raw=data)
    assert r.status_code == 400 and "NUL byte" in r.json()["error"]["message"], r.text


def test_idle_connection_flood_does_not_lock_out(daemon_factory):
    """MHD polled with select(): every socket number >= FD_SETSIZE (1024)
    was refused, so ~1000 idle connections (each kept for the 5 s idle
    timeout) locked every new client out, and each refusal logged a line."""
    n_idle = 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n_idle + 200
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    try:
        # the daemon inherits the raised limit
        # one client address: the per-client cap (test_hardening.py) is
        # lifted so that this checks the socket-number limit alone
        d = daemon_factory("--timeout-keep-alive", "30", "--header-timeout", "30",
                           "--max-connections-per-client", "0")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    socks = []
    try:
        for _ in range(n_idle):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\n")   # incomplete request
            socks.append(s)
        time.sleep(1.0)
        r = requests.get(d.url("/health"), timeout=10)
        assert r.status_code == 200
    finally:
        for s in socks:
            s.close()
    time.sleep(2.0)
    assert requests.get(d.url("/health"), timeout=10).status_code == 200
    # libmicrohttpd's per-connection warnings are rate-limited
    with open(d.log_path, "rb") as f:
        log = f.read().decode("utf-8", "replace")
    mhd_lines = [ln for ln in log.splitlines() if "mhd:" in ln]
    assert len(mhd_lines) < 200, len(mhd_lines)


def test_prompt_logprob_entries_capped(server):
    """echo + logprobs repeats the prompt's logprobs in every choice: n 128,
    logprobs 20 and long prompts asked for tens of GB of JSON (the server
    built it all in memory). Now refused up front, before any compute."""
    ids = [100 + (i * 7919) % 40000 for i in range(800)]
    body = {"model": MODEL_NAME, "prompt": ids, "echo": True, "logprobs": 20,
            "max_tokens": 0, "n": 128}
    t0 = time.time()
    r = post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "logprobs" and "2150400" in err["message"]
    assert time.time() - t0 < 30          # answered before the prefill
    # the same prompt scored once is fine
    body.update(n=1, logprobs=1, prompt=ids[:40])
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == 40

#!/usr/bin/env python3
"""Fair-share probe: the time to first token of a small request while one
client's big request runs beside it.

usage: tools/fair_probe.py PORT [alone|hog|long ...] [--hog-prompts P]
       [--hog-n N] [--long N] [--long-tokens T] [--rounds R]

Against a dsqd already listening on 127.0.0.1:PORT, each phase sends R
(default 3) small requests one after the other (an 8-id prompt,
max_tokens 4, streamed) and prints the TTFT of each (send to the first
chunk with text; "timeout" after 60 s) and the phase's median:

  alone  nothing else runs;
  hog    one streamed request of P prompts (default 8) x n = N (default
         128), max_tokens 4000, ignore_eos, runs (the small ones start
         once it generates); a 400 for it is printed and the phase skipped;
  long   N (default 4) prompts of T ids (default 8000), max_tokens 1, are
         prefilling (the small one starts 2 s after them; each round sends
         them anew, so every small request meets them prefilling).

The big requests are cancelled (connections closed) after each phase.
The measurement of tests/e2e/test_fairness.py, printed for
docs/benchmarks.md. Loopback only.
"""
import argparse
import http.client
import json
import re
import socket
import statistics
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("port", type=int)
ap.add_argument("phases", nargs="*", default=["alone", "hog", "long"])
ap.add_argument("--hog-prompts", type=int, default=8)
ap.add_argument("--hog-n", type=int, default=128)
ap.add_argument("--long", type=int, default=4)
ap.add_argument("--long-tokens", type=int, default=8000)
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()


def get(path):
    c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=30)
    c.request("GET", path)
    return c.getresponse().read().decode()


def metric(name):
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), get("/metrics"), re.M)
    return float(m.group(1)) if m else 0.0


model = json.loads(get("/v1/models"))["data"][0]["id"]


def open_post(body):
    """A request on a socket of our own (closing it cancels the request)."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", a.port), timeout=600)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
              b"\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    return s


def small_ttft(timeout=60.0):
    body = {"model": model, "prompt": [100 + 37 * i for i in range(8)], "max_tokens": 4,
            "stream": True, "temperature": 0}
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return "HTTP %d" % r.status
        while True:
            line = r.readline()
            if not line:
                return "no text"
            if line.startswith(b"data: {") and b'"text":"' in line and b'"text":""' not in line:
                return time.time() - t0
    except (socket.timeout, TimeoutError):
        return "timeout"
    finally:
        c.close()


def rounds(label, before=None, after=None):
    got = []
    for _ in range(a.rounds):
        ctx = before() if before else None
        v = small_ttft()
        got.append(v)
        if after:
            after(ctx)
        time.sleep(0.5)
    nums = [v for v in got if isinstance(v, float)]
    med = "%.2f s" % statistics.median(nums) if len(nums) == len(got) else "-"
    print("%-6s ttft: %s  median %s" % (label, ", ".join(
        "%.2f s" % v if isinstance(v, float) else v for v in got), med), flush=True)


def hang_up(s):
    """Close s so that the server sees it at once (a plain close leaves
    the connection open while the drain thread is blocked in recv)."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


def drain(s):
    def run():
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
    threading.Thread(target=run, daemon=True).start()


def idle():
    t_end = time.time() + 120
    while time.time() < t_end and (metric("dsq:num_requests_running") > 0 or
                                   metric("dsq:num_requests_waiting") > 0):
        time.sleep(0.2)


for phase in a.phases:
    if phase == "alone":
        rounds("alone")
    elif phase == "hog":
        s = open_post({"model": model, "prompt": ["Tell me a story"] * a.hog_prompts,
                       "n": a.hog_n, "max_tokens": 4000, "ignore_eos": True, "stream": True})
        s.settimeout(120)
        head = s.recv(4096)
        if not head.startswith(b"HTTP/1.1 200"):
            print("hog    refused: %s" % head.split(b"\r\n")[0].decode(), flush=True)
            s.close()
            continue
        drain(s)
        g0 = metric("dsq:generation_tokens_total")
        t_end = time.time() + 120
        while metric("dsq:generation_tokens_total") - g0 < 4 * a.hog_prompts * a.hog_n and \
                time.time() < t_end:
            time.sleep(0.2)
        print("hog    %d x n=%d running: %d sequences" % (
            a.hog_prompts, a.hog_n, metric("dsq:num_requests_running")), flush=True)
        rounds("hog")
        hang_up(s)
        idle()
    elif phase == "long":
        n_long = [0]

        def start_long():
            p0 = metric("dsq:prompt_tokens_total")
            socks = []
            n_long[0] += 1           # fresh prompts each round (no cached prefix)
            for i in range(a.long):
                k = i + a.long * n_long[0]
                p = [100 + (j * 7919 + k * 104729) % 30000 for j in range(a.long_tokens)]
                s = open_post({"model": model, "prompt": p, "max_tokens": 1})
                drain(s)
                socks.append(s)
            time.sleep(2)
            return socks, p0

        def stop_long(ctx):
            socks, p0 = ctx
            print("long   prompt tokens computed by then: %d of %d" % (
                metric("dsq:prompt_tokens_total") - p0, a.long * a.long_tokens), flush=True)
            for s in socks:
                hang_up(s)
            idle()
        rounds("long", start_long, stop_long)

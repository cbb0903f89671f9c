#!/usr/bin/env python3
"""Stall probe: how long a running stream waits while a long prompt is
prefilled beside it (the step budget's effect).

usage: tools/stall_probe.py PORT [PROMPT_TOKENS] [MODEL_NAME]

Against a dsqd already listening on 127.0.0.1:PORT: one streamed
completion runs (ignore_eos, 4000 tokens); after 2 s a PROMPT_TOKENS-id
prompt (default 3000) is sent with max_tokens 1. Prints the prefill's
wall time and the stream's gaps between chunks during it (p50/p90/p99/max,
ms). The same measurement as tests/e2e/test_hardening.py::
test_long_prompt_does_not_stall_streams, which asserts it; this prints it
for docs/benchmarks.md. Loopback only.
"""
import http.client
import json
import sys
import threading
import time

port = int(sys.argv[1])
n_prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
model = sys.argv[3] if len(sys.argv) > 3 else None


def post(body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return c.getresponse()


if model is None:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    model = json.loads(c.getresponse().read())["data"][0]["id"]
gaps, stop = [], False


def streamer():
    r = post({"model": model, "prompt": "Once upon a time", "max_tokens": 4000,
              "stream": True, "ignore_eos": True})
    last = time.time()
    while not stop:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            t = time.time()
            gaps.append((t, t - last))
            last = t


threading.Thread(target=streamer, daemon=True).start()
time.sleep(2)
prompt = [100 + (i * 7919) % 30000 for i in range(n_prompt)]
t0 = time.time()
post({"model": model, "prompt": prompt, "max_tokens": 1}).read()
t1 = time.time()
stop = True
g = sorted(x[1] for x in gaps if t0 <= x[0] <= t1 + 0.5)
if not g:
    sys.exit("no stream chunks during the prefill")


def pct(q):
    return 1e3 * g[min(len(g) - 1, int(len(g) * q))]


print("prefill_s=%.2f n_gaps=%d p50=%.0f p90=%.0f p99=%.0f max=%.0f (ms)"
      % (t1 - t0, len(g), pct(0.5), pct(0.9), pct(0.99), 1e3 * g[-1]))

#!/usr/bin/env python3
"""Unread-stream probe: N streaming clients that never
read, against a dsqd listening on 127.0.0.1:PORT with process id PID.

usage: tools/unread_probe.py PORT PID [N] [SECONDS]

1. baseline: idle RSS, then one normal stream of 64 tokens (its ITL p50/p99);
2. opens N connections (4 KiB receive buffers, as a client that stops
   reading has), each sending a streamed completion of 4,000 tokens, and
   never reads them; samples RSS and /metrics (running, held, KV blocks)
   for SECONDS (default 60);
3. the same normal stream again, beside them; then closes them all and
   checks that the KV blocks come back.
Prints each phase. Loopback only.
"""
import json
import re
import socket
import sys
import time
import urllib.request

port, pid = int(sys.argv[1]), int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
secs = float(sys.argv[4]) if len(sys.argv) > 4 else 60
base = f"http://127.0.0.1:{port}"


def rss():
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) / 1024.0


def metrics():
    t = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    out = {}
    for name in ("num_requests_running", "num_requests_held", "kv_cache_blocks_used"):
        m = re.search(r"^dsq:%s\{[^}]*\} (\S+)" % name, t, re.M)
        out[name] = float(m.group(1)) if m else -1
    return out


model = json.loads(urllib.request.urlopen(base + "/v1/models").read())["data"][0]["id"]


def normal_stream():
    req = urllib.request.Request(base + "/v1/completions", json.dumps({
        "model": model, "prompt": "Once upon a time", "max_tokens": 64, "ignore_eos": True,
        "temperature": 0, "stream": True}).encode(), {"Content-Type": "application/json"})
    ts = []
    with urllib.request.urlopen(req, timeout=300) as r:
        for ln in r:
            if ln.startswith(b"data: ") and ln.strip() != b"data: [DONE]":
                ts.append(time.time())
    g = sorted(b - a for a, b in zip(ts, ts[1:]))
    return 1e3 * g[len(g) // 2], 1e3 * g[min(len(g) - 1, int(len(g) * 0.99))]


normal_stream()                          # warm up
idle = rss()
b50, b99 = normal_stream()
print(f"idle RSS {idle:.1f} MiB; normal stream alone: ITL p50 {b50:.1f} ms p99 {b99:.1f} ms")
socks = []
body = json.dumps({"model": model, "prompt": "Tell me a long story.", "max_tokens": 4000,
                   "ignore_eos": True, "temperature": 0.8, "stream": True}).encode()
for i in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    socks.append(s)
t0 = time.time()
while time.time() - t0 < secs:
    time.sleep(min(15, secs / 4))
    m = metrics()
    print(f"t={time.time() - t0:.0f}s RSS {rss():.1f} MiB ({100 * (rss() / idle - 1):+.0f}% of idle) "
          f"running {m['num_requests_running']:.0f} held {m['num_requests_held']:.0f} "
          f"KV blocks {m['kv_cache_blocks_used']:.0f}")
p50, p99 = normal_stream()
print(f"normal stream beside {n} unread: ITL p50 {p50:.1f} ms p99 {p99:.1f} ms; "
      f"RSS {rss():.1f} MiB ({100 * (rss() / idle - 1):+.0f}% of idle)")
for s in socks:
    s.close()
t1 = time.time()
while time.time() - t1 < 30 and metrics()["kv_cache_blocks_used"] > 0:
    time.sleep(0.5)
print(f"closed: KV blocks {metrics()['kv_cache_blocks_used']:.0f} after {time.time() - t1:.1f} s")

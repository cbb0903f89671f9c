#!/usr/bin/env python3
"""Overload probe: what N concurrent requests cost a dsqd (memory per
waiting request).

usage: tools/overload_probe.py PORT PID [N] [MAX_TOKENS]

Against a dsqd listening on 127.0.0.1:PORT with process id PID: opens N
(default 2000) connections, sends one non-streamed completion on each
(a 16-id prompt, MAX_TOKENS new tokens, default 16) at once, and reads
every answer with one selector (no client thread per request). Samples the
server's RSS and thread count (/proc/PID/status) every 0.25 s. Prints idle
and peak RSS and threads, the answers by status, and the wall time.
Loopback only.
"""
import json
import selectors
import socket
import sys
import time

port, pid = int(sys.argv[1]), int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 16


def status():
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            k, _, v = ln.partition(":")
            if k in ("VmRSS", "Threads"):
                out[k] = int(v.split()[0])
    return out["VmRSS"] / 1024.0, out["Threads"]


def model_name():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return json.loads(data.partition(b"\r\n\r\n")[2])["data"][0]["id"]


model = model_name()
rss0, thr0 = status()
sel = selectors.DefaultSelector()
bufs = {}
t0 = time.time()
for i in range(n):
    body = json.dumps({"model": model, "prompt": [100 + (i * 31 + j) % 20000 for j in range(16)],
                       "max_tokens": max_tokens, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
    bufs[s] = b""
t_sent = time.time()
peak_rss, peak_thr = rss0, thr0
codes = {}
t_sample = 0
while bufs and time.time() - t0 < 600:
    for key, _ in sel.select(timeout=0.25):
        s = key.fileobj
        try:
            chunk = s.recv(65536)
        except (BlockingIOError, InterruptedError):
            continue
        except ConnectionError:
            chunk = b""
        if chunk:
            bufs[s] += chunk
            continue
        line = bufs.pop(s).split(b"\r\n", 1)[0]
        code = line.split()[1].decode() if len(line.split()) > 1 else "closed"
        codes[code] = codes.get(code, 0) + 1
        sel.unregister(s)
        s.close()
    if time.time() - t_sample >= 0.25:
        r, t = status()
        peak_rss, peak_thr = max(peak_rss, r), max(peak_thr, t)
        t_sample = time.time()
print(f"n={n} sent_in_s={t_sent - t0:.2f} wall_s={time.time() - t0:.1f} statuses={codes} "
      f"unanswered={len(bufs)}")
print(f"RSS idle {rss0:.1f} MiB peak {peak_rss:.1f} MiB (+{100 * (peak_rss / rss0 - 1):.0f}%), "
      f"threads idle {thr0} peak {peak_thr}")

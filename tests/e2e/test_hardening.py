"""Hardening: slow and hostile clients cannot lock the server.

Every test is bounded in time and uses loopback only. Slow clients connect
from other loopback addresses (127.0.0.2, ...: Linux routes all of
127.0.0.0/8 to lo) so that the per-client connection cap does not hide the
serving model behind it: the normal client is 127.0.0.1.
"""
import re
import resource
import socket
import threading
import time

import pytest
import requests

from conftest import MODEL_NAME, post


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft, hard
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return soft, hard


def connect_from(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((addr, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def closed_by_peer(s):
    """True when the server closed s (EOF or reset), False while it is open."""
    s.setblocking(False)
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


class Trickler:
    """Sends one header byte per socket every `period` s (slowloris): the
    idle timeout never fires, only a deadline for the whole head can."""

    def __init__(self, socks, period=1.0, byte=b"a"):
        self.socks, self.period, self.byte = socks, period, byte
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.wait(self.period):
            for s in self.socks:
                try:
                    s.send(self.byte)
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.t.join()


def timed(fn):
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0


def test_slowloris_does_not_lock_out(daemon_factory):
    """4,200 connections trickling their request head one byte a second
    (more than the old fixed cap of 4,096 threads-per-connection): /health
    and a completion from a normal client still answer within 1 s, and
    every slow connection is closed at its --header-timeout deadline."""
    n_slow, n_addr, deadline = 4200, 12, 6.0
    old = raise_nofile(n_slow + 400)
    try:
        d = daemon_factory("--header-timeout", str(deadline),   # inherits the limit
                           env={"DSQ_LOG_LEVEL": "info"})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
    # warm the model so the timed completion measures serving, not first use
    post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2})
    socks = []
    try:
        t_first = time.monotonic()
        for i in range(n_slow):
            s = connect_from(f"127.0.0.{2 + i % n_addr}", d.port)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        t_last = time.monotonic()
        assert t_last - t_first < deadline - 2, "setup too slow for the deadline"
        tr = Trickler(socks)
        try:
            r, dt = timed(lambda: requests.get(d.url("/health"), timeout=10))
            assert r.status_code == 200 and dt < 1.0, (r.status_code, dt)
            r, dt = timed(lambda: post(d, "/v1/completions", {
                "model": MODEL_NAME, "prompt": "The capital of France is",
                "max_tokens": 4, "temperature": 0}))
            assert r.status_code == 200 and dt < 1.0, (r.status_code, dt, r.text[:200])
            # before the deadline the slow ones are still open (held, not refused)
            early = [s for s in socks[-200:] if closed_by_peer(s)]
            assert time.monotonic() - t_last < deadline - 0.5
            assert not early, f"{len(early)} slow connections closed before the deadline"
            # after it (plus one 50 ms tick and slack) every one is closed
            time.sleep(max(0.0, t_last + deadline + 1.5 - time.monotonic()))
        finally:
            tr.close()
        still = sum(1 for s in socks if not closed_by_peer(s))
        assert still == 0, f"{still} of {n_slow} slow connections still open past the deadline"
        r = requests.get(d.url("/health"), timeout=10)
        assert r.status_code == 200
    finally:
        for s in socks:
            s.close()
    with open(d.log_path, "rb") as f:
        log = f.read().decode("utf-8", "replace")
    assert "event=deadline_close" in log
    # a connection cut at its deadline is an info event, not a warning each
    assert "level=warn mhd: Connection socket is closed" not in log
    # nor are those (debug) lines counted into "N messages suppressed" warnings
    assert "messages suppressed" not in log, \
        [ln for ln in log.splitlines() if "suppressed" in ln][:3]


def test_slow_body_closed_at_deadline(daemon_factory):
    """A body trickled a byte every 0.5 s is cut at --body-timeout from the
    end of its head, although each byte resets the idle timeout."""
    d = daemon_factory("--body-timeout", "2")
    s = connect_from("127.0.0.2", d.port)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        t0 = time.monotonic()
        closed_at = None
        while time.monotonic() - t0 < 6:
            time.sleep(0.5)
            if closed_by_peer(s):
                closed_at = time.monotonic() - t0
                break
            try:
                s.send(b" ")
            except OSError:
                closed_at = time.monotonic() - t0
                break
        assert closed_at is not None, "a trickled body was never cut"
        assert 1.5 <= closed_at <= 3.5, closed_at
    finally:
        s.close()
    assert requests.get(d.url("/health"), timeout=10).status_code == 200
    # counted and logged as our deadline (408), not as a client that left (499)
    t = requests.get(d.url("/metrics"), timeout=10).text
    assert re.search(r'^dsq:http_requests_total\{[^}]*status="408"[^}]*\} 1', t, re.M), \
        [ln for ln in t.splitlines() if "http_requests_total{" in ln]
    assert not re.search(r'status="499"[^}]*\} [1-9]', t)


def test_per_client_connection_cap(daemon_factory):
    """--max-connections-per-client: one address cannot take more; another
    address is still served."""
    d = daemon_factory("--max-connections-per-client", "8")
    socks = [connect_from("127.0.0.3", d.port) for _ in range(8)]
    try:
        time.sleep(0.3)
        extra = connect_from("127.0.0.3", d.port)
        try:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            extra.settimeout(5)
            try:
                got = extra.recv(4096)
            except OSError:
                got = b""
            assert got == b"", f"the 9th connection of one client was answered: {got[:80]!r}"
        finally:
            extra.close()
        r = requests.get(d.url("/health"), timeout=10)    # 127.0.0.1
        assert r.status_code == 200
    finally:
        for s in socks:
            s.close()


def test_max_queue_wait_refuses_with_503(daemon_factory):
    """--max-queue-wait: a request not scheduled in time is refused with 503
    + Retry-After (non-streaming) or an error event before [DONE]
    (streaming), while the running one completes."""
    d = daemon_factory("--max-num-seqs", "1", "--max-queue-wait", "0.5",
                       env={"DSQ_LOG_LEVEL": "info"})
    long_body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 1000,
                 "ignore_eos": True, "temperature": 0}
    short = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    out = {}

    def run_long():
        out["long"] = post(d, "/v1/completions", long_body)
    t = threading.Thread(target=run_long)
    t.start()
    try:
        time.sleep(0.3)          # the long one is running: the next ones queue
        r, dt = timed(lambda: post(d, "/v1/completions", short))
        assert r.status_code == 503, (r.status_code, r.text[:200])
        e = r.json()["error"]
        assert e["code"] == "queue_full" and "--max-queue-wait" in e["message"], e
        assert int(r.headers["Retry-After"]) >= 1
        assert 0.4 <= dt < 5, dt
        with requests.post(d.url("/v1/completions"), json=dict(short, stream=True),
                           stream=True, timeout=30) as rs:
            assert rs.status_code == 200
            data = [ln[6:] for ln in rs.iter_lines() if ln.startswith(b"data: ")]
        assert data[-1] == b"[DONE]", data
        import json
        errs = [json.loads(x)["error"] for x in data[:-1] if b'"error"' in x]
        assert errs and errs[0]["code"] == "queue_full", data
        # both refusals are counted
        assert metric(d, "dsq:queue_timeouts_total") == 2
    finally:
        t.join()
    assert out["long"].status_code == 200, out["long"].text[:200]
    assert out["long"].json()["usage"]["completion_tokens"] == 1000
    with open(d.log_path, "rb") as f:
        assert b"event=queue_timeout" in f.read()


def metric(d, name):
    for ln in requests.get(d.url("/metrics"), timeout=10).text.splitlines():
        if ln.startswith(name + " ") or ln.startswith(name + "{"):
            return float(ln.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_unread_stream(port, body, addr="127.0.0.1"):
    """A streaming request whose client never reads (small receive buffer)."""
    import json
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((addr, 0))
    s.connect(("127.0.0.1", port))
    raw = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    return s


def test_held_request_frees_its_slots(daemon_factory):
    """One streamed request with n = --max-num-seqs whose client never reads
    fills every running slot; once it is held, its sequences keep their KV
    but give their slots back, so another client is served at once instead
    of waiting for --stream-stall-timeout (before: 36 s behind n=128 x 2)."""
    d = daemon_factory("--max-num-seqs", "16", "--max-undelivered-bytes", "8KiB",
                       "--stream-stall-timeout", "60")
    s = open_unread_stream(d.port, {"model": MODEL_NAME, "prompt": "Tell me a long story",
                                    "n": 16, "max_tokens": 2000, "ignore_eos": True,
                                    "temperature": 0.8, "stream": True})
    try:
        deadline = time.monotonic() + 60
        while metric(d, "dsq:num_requests_held") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metric(d, "dsq:num_requests_held") >= 1, "the unread request was never held"
        assert metric(d, "dsq:num_requests_running") >= 16
        r, dt = timed(lambda: post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": "Hi",
                                                          "max_tokens": 4}))
        assert r.status_code == 200, r.text[:200]
        # on the old scheduler it waited for the 60 s stall abort
        assert dt < 10, f"a normal request took {dt:.1f} s beside a held one"
        assert metric(d, "dsq:stream_stall_aborts_total") == 0
    finally:
        s.close()
    deadline = time.monotonic() + 30
    while metric(d, "dsq:kv_cache_blocks_used") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(d, "dsq:kv_cache_blocks_used") == 0


def test_unread_streams_do_not_grow_memory(daemon_factory):
    """32 streams whose clients never read, at the default
    --max-undelivered-bytes: generation stops once each has filled its
    socket and its engine queue (KV kept), RSS stays within 10% of the
    idle server's (the KV cache is committed at start, --kv-cache-prefault),
    and a normal client is then served at its unloaded pace. (32, not the 100
    of the attack that found it, bounds the test's time on 2 cores; tools/unread_probe.py
    measures 100, docs/benchmarks.md.)"""
    n = 32
    d = daemon_factory("--max-num-seqs", "128", "--stream-stall-timeout", "0")
    body = {"model": MODEL_NAME, "prompt": "Write a long story about a dragon.",
            "max_tokens": 3000, "ignore_eos": True, "temperature": 0.8, "stream": True}
    normal = {"model": MODEL_NAME, "prompt": "Count: one, two,", "max_tokens": 48,
              "ignore_eos": True, "temperature": 0}

    def normal_time():
        return timed(lambda: post(d, "/v1/completions", normal))[1]
    base_t = min(normal_time() for _ in range(2))
    rss_idle = rss_bytes(d.proc.pid)
    # the KV cache (256 MiB here) is resident before any load
    assert rss_idle > 256 << 20, rss_idle
    g_start = metric(d, "dsq:generation_tokens_total")
    socks = [open_unread_stream(d.port, body, f"127.0.0.{2 + i % 4}") for i in range(n)]
    try:
        # each stream fills its socket and its engine queue, then is held:
        # generation stops (n x ~100-200 tokens at batch n first; a slow or
        # loaded box needs minutes for that, so the wait is long and ends
        # only on a quiet interval, which is asserted, never on the clock)
        g0, t0 = metric(d, "dsq:generation_tokens_total"), time.monotonic()
        quiet = False
        while not quiet and time.monotonic() - t0 < 420:
            time.sleep(3)
            g1 = metric(d, "dsq:generation_tokens_total")
            quiet = g1 == g0
            g0 = g1
        assert quiet, f"generation never stopped for unread streams ({g1:.0f} tokens in " \
                      f"{time.monotonic() - t0:.0f} s)"
        assert metric(d, "dsq:num_requests_running") == n
        per_stream = (g1 - g_start) / n
        assert per_stream < 600, f"{per_stream:.0f} tokens per unread stream before it was held"
        busy_t = normal_time()
        time.sleep(3)
        g2 = metric(d, "dsq:generation_tokens_total")
        rss = rss_bytes(d.proc.pid)
        # held: generation stopped (the normal request's 48 tokens aside)
        assert g2 - g1 <= 48 + n, (g1, g2)
        assert rss <= rss_idle * 1.10, (rss_idle, rss)
        # the held sequences cost other clients nothing per step
        assert busy_t < 3 * base_t + 0.5, (base_t, busy_t)
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 10
    while metric(d, "dsq:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(d, "dsq:num_requests_running") == 0
    assert metric(d, "dsq:kv_cache_blocks_used") == 0


def test_stalled_stream_aborted_after_timeout(daemon_factory):
    """--stream-stall-timeout: a stream held because its client does not
    read is aborted (its KV freed) and logged with the reason."""
    d = daemon_factory("--max-undelivered-bytes", "8KiB", "--stream-stall-timeout", "2",
                       env={"DSQ_LOG_LEVEL": "info"})
    body = {"model": MODEL_NAME, "prompt": "Tell me a story.", "max_tokens": 4000,
            "ignore_eos": True, "temperature": 0.8, "stream": True}
    s = open_unread_stream(d.port, body)
    held_seen = 0
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.3)
            held_seen = max(held_seen, metric(d, "dsq:num_requests_held"))
            if metric(d, "dsq:num_requests_running") == 0 and \
               metric(d, "dsq:generation_tokens_total") > 0:
                break
        # /metrics showed it held (for ~2 s), then counted its abort
        assert held_seen == 1
        assert metric(d, "dsq:num_requests_held") == 0
        assert metric(d, "dsq:stream_stall_aborts_total") == 1
        assert metric(d, "dsq:num_requests_running") == 0
        assert metric(d, "dsq:kv_cache_blocks_used") == 0
        assert metric(d, "dsq:generation_tokens_total") < 4000
    finally:
        s.close()
    with open(d.log_path, "rb") as f:
        log = f.read()
    assert b"reason=\"the client did not read its stream\"" in log, log[-2000:]


def stream_gaps(d, body, start_evt, t_log):
    """Stream body; record each chunk's arrival (monotonic s) into t_log."""
    with requests.post(d.url("/v1/completions"), json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        for ln in r.iter_lines():
            if ln.startswith(b"data: "):
                t_log.append(time.monotonic())
                if len(t_log) == 5:
                    start_evt.set()


def test_long_prompt_does_not_stall_streams(daemon_factory):
    """--step-budget-ms: a 3,000-token prompt arriving while a stream runs
    is prefilled in chunks whose predicted time fits the budget beside the
    decode, so the stream keeps getting tokens every ~budget instead of
    waiting for one 2,048-token chunk (seconds on a CPU)."""
    budget = 250
    d = daemon_factory("--step-budget-ms", str(budget))
    long_prompt = [100 + (i * 7919) % 30000 for i in range(3000)]
    # warm up: the engine measures its cost per token on real steps
    post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": long_prompt[:600],
                                "max_tokens": 1})
    started, times = threading.Event(), []
    t = threading.Thread(target=stream_gaps, args=(d, {
        "model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 300,
        "ignore_eos": True, "temperature": 0, "stream": True}, started, times))
    t.start()
    assert started.wait(60)
    t_long0 = time.monotonic()
    r = post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": long_prompt, "max_tokens": 1})
    t_long1 = time.monotonic()
    t.join()
    assert r.status_code == 200, r.text[:200]
    gaps = sorted(b - a for a, b in zip(times, times[1:]) if a >= t_long0 and b <= t_long1)
    assert len(gaps) >= 5, (len(gaps), t_long1 - t_long0)
    # The prefill was split into steps the cost model sized to the budget:
    # nine in ten gaps within 2x the budget (the bound the step budget promises), and no gap
    # a large part of the prefill (before: 2,048-token chunks, one gap ~2/3
    # of it). The bound is on p90, not the maximum: the suite shares the 2
    # cores with other tests, whose bursts the model cannot foresee (alone
    # on this box: max 290 ms; with two CPU burners beside it p50 219 ms,
    # max 511 ms; the model follows the load).
    t_total = t_long1 - t_long0
    p90 = gaps[int(len(gaps) * 0.9)]
    msg = (f"max gap {gaps[-1] * 1e3:.0f} ms, p90 {p90 * 1e3:.0f} ms, median "
           f"{gaps[len(gaps) // 2] * 1e3:.0f} ms, {len(gaps)} gaps in a {t_total * 1e3:.0f} ms prefill")
    print(msg)
    assert p90 <= 2 * budget / 1e3, msg
    assert gaps[-1] <= max(4 * budget / 1e3, t_total / 4), msg


def test_abort_during_prefill_frees_blocks(daemon_factory):
    """A client that leaves during a 6,000-token prefill: its KV blocks are
    free within about one step budget, not at the end of a 2,048-token
    chunk."""
    budget = 250
    d = daemon_factory("--step-budget-ms", str(budget), "--max-model-len", "8192")
    prompt = [100 + (i * 7919) % 30000 for i in range(6000)]
    post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": prompt[:600], "max_tokens": 1})
    s = open_unread_stream(d.port, {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4,
                                    "stream": True})
    t_sub = time.monotonic()
    try:
        deadline = time.monotonic() + 60
        while metric(d, "dsq:kv_cache_blocks_used") < 64 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(d, "dsq:kv_cache_blocks_used") >= 64, "prefill never started"
        t_fill = time.monotonic() - t_sub     # ~1,024 tokens computed
    finally:
        s.close()
    t0 = time.monotonic()
    while metric(d, "dsq:kv_cache_blocks_used") > 0 and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    dt = time.monotonic() - t0
    assert metric(d, "dsq:kv_cache_blocks_used") == 0
    # one step (about the budget) + the hang-up poll + a scrape; on a
    # loaded box, well under the time of the ~1,024 tokens of t_fill;
    # before: the rest of a 2,048-token chunk
    assert dt <= max(2 * budget / 1e3 + 0.15, 0.6 * t_fill), \
        f"blocks freed {dt * 1e3:.0f} ms after the hang-up (t_fill {t_fill * 1e3:.0f} ms)"


def test_memory_returned_after_large_answers(daemon_factory):
    """Building an answer of ~14 MB (echo + logprobs 20 of a 1,500-token
    prompt, n 16: millions of small JSON nodes) left that much freed memory
    in glibc's arenas, which kept it: the RSS grew by ~230 MB over four such
    answers and stayed. Once an answer of 1 MiB or more is sent, dsqd gives
    the memory back (malloc_trim)."""
    d = daemon_factory()
    prompt = "The quick brown fox jumps over the lazy dog. " * 150
    post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1})
    base = rss_bytes(d.proc.pid)
    for _ in range(3):
        r = post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1,
                                        "echo": True, "logprobs": 20, "n": 16})
        assert r.status_code == 200, r.text[:300]
        assert len(r.content) > 10 << 20
    # the free callback runs once the answer is out; give it a moment
    t0 = time.time()
    while time.time() - t0 < 5 and rss_bytes(d.proc.pid) - base > 100 << 20:
        time.sleep(0.2)
    grown = rss_bytes(d.proc.pid) - base
    assert grown < 100 << 20, "RSS grew by %d MiB over 3 answers of 14 MB" % (grown >> 20)

"""deploy/nginx/dsq.conf in front of two dsqd replicas, one restarted under load.

nginx (Debian's nginx-light) runs as an unprivileged process with its own
prefix, pid and log files in a temporary directory; the shipped dsq.conf is
included with only its upstream servers and its listen line replaced by
loopback ports. Streaming completions run continuously from a few client
threads. Replica A gets SIGTERM while it is streaming a response, drains,
exits 0 and is started again on the same port. Checked: every request
succeeded (the ones in flight on A finished: drain; new ones went to B:
503/refused -> next upstream), at least one was in flight on A when it got
SIGTERM, and A serves again after its restart. Bounded to about a minute.
Collected by the deploy_pytest meson test.
"""
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest
import requests

from conftest import MODEL_NAME, free_port, model_path

API_KEY = "test-key-deploy"
N_CLIENTS = 3
MAX_TOKENS = 24


def find_nginx():
    for p in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.path.exists(p):
            return p
    pytest.fail("nginx not found: install nginx-light (scripts/setup)")


class Replica:
    def __init__(self, port, tmp, tag):
        self.port, self.tmp, self.tag, self.n = port, tmp, tag, 0
        self.proc = None

    def start(self):
        exe = os.environ.get("DSQD")
        if not exe or not os.path.exists(exe):
            pytest.fail(f"DSQD does not name the dsqd binary (got {exe!r})")
        self.n += 1
        self.log_path = os.path.join(self.tmp, f"dsqd-{self.tag}-{self.n}.log")
        env = dict(os.environ, DSQ_API_KEY=API_KEY, DSQ_LOG_LEVEL="info")
        env.pop("NOTIFY_SOCKET", None)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [exe, "--model", model_path(), "--host", "127.0.0.1",
                 "--port", str(self.port), "--kv-cache-memory", "256MiB",
                 "--shutdown-timeout", "30"],
                stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout=180):
        t_end = time.time() + timeout
        while time.time() < t_end:
            if self.proc.poll() is not None:
                pytest.fail(f"dsqd {self.tag} exited {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/health",
                                timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        pytest.fail(f"dsqd {self.tag} not ready:\n{self.log()}")

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-3000:].decode("utf-8", "replace")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None


def nginx_conf(tmp, listen_port, backends):
    """The shipped dsq.conf with test ports, inside a self-contained main
    config whose every path is under tmp."""
    src = os.path.join(os.environ["DSQ_SOURCE_ROOT"], "deploy", "nginx", "dsq.conf")
    with open(src) as f:
        site = f.read()
    params = re.findall(r"^\s*server\s+\S+:\d+(\s+[^;]*);", site, re.M)
    assert params and "max_fails" in params[0], "upstream servers not found in dsq.conf"
    lines = "".join(f"    server 127.0.0.1:{p}{params[0]};\n" for p in backends)
    site, n = re.subn(r"(^\s*server\s+\S+:\d+\s+[^;]*;\n)+", lines, site, count=1, flags=re.M)
    assert n == 1
    site, n = re.subn(r"^\s*listen\s+80;", f"    listen 127.0.0.1:{listen_port};", site,
                      count=1, flags=re.M)
    assert n == 1
    with open(os.path.join(tmp, "dsq.conf"), "w") as f:
        f.write(site)
    main = f"""
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    # test only: which replica answered
    add_header X-Dsq-Upstream $upstream_addr always;
    include {tmp}/dsq.conf;
}}
"""
    path = os.path.join(tmp, "nginx.conf")
    with open(path, "w") as f:
        f.write(main)
    return path


def drop_privileges():
    """preexec_fn: run nginx as nobody when the test runs as root."""
    if os.geteuid() == 0:
        pw = pwd.getpwnam("nobody")
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)


def stream_once(base):
    """One streaming completion through nginx: (ok, upstream, t0, t_first, t_end, why)."""
    t0 = time.monotonic()
    t_first, upstream, why = None, None, ""
    try:
        with requests.post(base + "/v1/completions", stream=True, timeout=120,
                           headers={"Authorization": f"Bearer {API_KEY}"},
                           json={"model": MODEL_NAME, "prompt": "Once upon a time",
                                 "max_tokens": MAX_TOKENS, "stream": True,
                                 "ignore_eos": True}) as r:
            upstream = r.headers.get("X-Dsq-Upstream")
            if r.status_code != 200:
                return False, upstream, t0, None, time.monotonic(), f"HTTP {r.status_code}: {r.text[:200]}"
            done, finish = False, None
            for raw in r.iter_lines():
                line = raw.decode("utf-8")
                if not line:
                    continue
                if t_first is None:
                    t_first = time.monotonic()
                if line == "data: [DONE]":
                    done = True
                    break
                ev = json.loads(line[6:])
                finish = ev["choices"][0].get("finish_reason") or finish
            ok = done and finish == "length"
            why = "" if ok else f"stream ended done={done} finish={finish}"
    except (requests.RequestException, ValueError, KeyError) as e:
        ok, why = False, repr(e)
    return ok, upstream, t0, t_first, time.monotonic(), why


def test_nginx_two_replicas_restart_under_load():
    tmp = tempfile.mkdtemp(prefix="dsq-nginx-")
    os.chmod(tmp, 0o755)
    a = Replica(free_port(), tmp, "a")
    b = Replica(free_port(), tmp, "b")
    listen = free_port()
    ngx = None
    results, lock, stop_load = [], threading.Lock(), threading.Event()
    started_on_a = threading.Event()
    try:
        a.start()
        b.start()
        ngx = start_nginx(tmp, listen, [a.port, b.port])
        a.wait_ready()
        b.wait_ready()
        base = f"http://127.0.0.1:{listen}"
        t_end = time.time() + 10
        while time.time() < t_end:
            try:
                if requests.get(base + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        else:
            pytest.fail("nginx did not answer:\n" + open(f"{tmp}/error.log").read())
        a_addr = f"127.0.0.1:{a.port}"

        def client():
            while not stop_load.is_set():
                res = stream_once(base)
                with lock:
                    results.append(res)

        threads = [threading.Thread(target=client) for _ in range(N_CLIENTS)]
        for th in threads:
            th.start()

        # SIGTERM A while it is running a request (its own /metrics says so)
        time.sleep(2)
        t_kill = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = requests.get(f"http://127.0.0.1:{a.port}/metrics", timeout=5,
                             headers={"Authorization": f"Bearer {API_KEY}"}).text
            running = re.search(r"^dsq:num_requests_running\S*\s+(\d+)", m, re.M)
            assert running, "dsq:num_requests_running missing from /metrics"
            if int(running.group(1)) >= 1:
                t_kill = time.monotonic()
                a.proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
        assert t_kill is not None, "no request reached replica A"
        rc = a.proc.wait(timeout=60)
        assert rc == 0, f"A exit status {rc}:\n{a.log()}"
        t_exit = time.monotonic()
        time.sleep(1)
        a.start()                      # same port: nginx's upstream line
        a.wait_ready()
        t_restarted = time.monotonic()
        # A is back in rotation once fail_timeout has passed
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            with lock:
                if any(r[1] == a_addr and r[2] > t_restarted for r in results):
                    break
            time.sleep(0.2)
        time.sleep(1)
        stop_load.set()
        for th in threads:
            th.join(timeout=120)

        failed = [r for r in results if not r[0]]
        assert not failed, (f"{len(failed)} of {len(results)} requests failed: "
                            f"{[r[5] for r in failed][:5]}\nnginx errors:\n"
                            + open(f"{tmp}/error.log").read()[-2000:])
        # requests that were streaming from A when it got SIGTERM finished
        # there (drain), not on a retry
        in_flight_a = [r for r in results
                       if r[1] == a_addr and r[2] < t_kill < r[4] and r[4] <= t_exit + 0.5]
        assert in_flight_a, ("no request was in flight on A at SIGTERM "
                             f"({len(results)} requests)")
        assert any(r[1] == a_addr and r[2] > t_restarted for r in results), \
            "A got no requests after its restart"
        assert "event=draining" in open(os.path.join(tmp, "dsqd-a-1.log")).read()
        assert len(results) >= 10, len(results)
        print(f"requests={len(results)} in_flight_on_a_at_sigterm={len(in_flight_a)} "
              f"retried={sum(1 for r in results if r[1] and ',' in r[1])} "
              f"on_a_after_restart="
              f"{sum(1 for r in results if r[1] == a_addr and r[2] > t_restarted)}")
    finally:
        stop_load.set()
        stop_nginx(ngx)
        a.stop()
        b.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def start_nginx(tmp, listen, backends):
    """nginx with the shipped dsq.conf in front of backends; returns Popen."""
    nginx = find_nginx()
    conf = nginx_conf(tmp, listen, backends)
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        for root, dirs, files in os.walk(tmp):
            for name in dirs + files:
                os.chown(os.path.join(root, name), nobody.pw_uid, nobody.pw_gid)
        os.chown(tmp, nobody.pw_uid, nobody.pw_gid)
    t = subprocess.run([nginx, "-t", "-p", tmp, "-e", f"{tmp}/error.log", "-c", conf],
                       capture_output=True, text=True, preexec_fn=drop_privileges)
    assert t.returncode == 0, "nginx -t:\n" + t.stderr
    return subprocess.Popen([nginx, "-p", tmp, "-e", f"{tmp}/error.log", "-c", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=drop_privileges)


def stop_nginx(ngx):
    """SIGQUIT (graceful) a started nginx; kill it after 10 s."""
    if ngx and ngx.poll() is None:
        ngx.send_signal(signal.SIGQUIT)
        try:
            ngx.wait(timeout=10)
        except subprocess.TimeoutExpired:
            ngx.kill()
            ngx.wait()


def raw_exchange(port, data, timeout=5.0):
    """Send data on a fresh connection; read until the server closes it.
    Returns (bytes read, closed by the server within timeout)."""
    import socket
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out, t_end = b"", time.monotonic() + timeout
        while time.monotonic() < t_end:
            s.settimeout(max(0.05, t_end - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return out, False
            except ConnectionResetError:
                return out, True
            if not chunk:
                return out, True
            out += chunk
        return out, False
    finally:
        s.close()


def parse_one_response(raw):
    """(status, headers dict, body) of the single HTTP response in raw;
    fails when raw holds more than one status line."""
    n_status = len(re.findall(rb"(?:^|\r\n)HTTP/1\.[01] \d{3}", raw))
    assert n_status == 1, f"{n_status} status lines in:\n{raw[:600]!r}"
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size_s, _, rest = rest.partition(b"\r\n")
            size = int(size_s.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    return status, hdrs, body


def test_nginx_framing_errors_are_json():
    """Framing errors and slow clients, covered by the deployment docs/api.md
    prescribes (dsqd behind deploy/nginx/dsq.conf): every framing error a
    client can provoke is one response, an OpenAI JSON error object, on a
    connection the server then closes; a NUL byte inside the API key is
    refused by nginx and never reaches dsqd, while dsqd's own JSON errors
    (401) and answers pass through unchanged."""
    tmp = tempfile.mkdtemp(prefix="dsq-nginx-framing-")
    os.chmod(tmp, 0o755)
    a = Replica(free_port(), tmp, "a")
    listen = free_port()
    ngx = None
    try:
        a.start()
        ngx = start_nginx(tmp, listen, [a.port])
        a.wait_ready()
        base = f"http://127.0.0.1:{listen}"
        t_end = time.time() + 30
        while time.time() < t_end:
            try:
                if requests.get(base + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        auth = f"Authorization: Bearer {API_KEY}\r\n".encode()
        post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        cases = [
            ("head too large", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 +
             b"\r\n\r\n", 431),
            ("URI too long", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
            ("HTTP version", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", 505),
            ("Content-Length -5", post + auth + b"Content-Length: -5\r\n\r\n{}", 400),
            ("Content-Length abc", post + auth + b"Content-Length: abc\r\n\r\n{}", 400),
            ("Content-Length 20 digits", post + auth +
             b"Content-Length: 99999999999999999999\r\n\r\n{}", 400),
            ("two Content-Lengths", post + auth + b"Content-Length: 2\r\nContent-Length: 3\r\n"
             b"\r\n{}", 400),
            ("body too large", post + auth + b"Content-Length: 2000000\r\n\r\n", 413),
            ("NUL after the API key", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
             b"Authorization: Bearer " + API_KEY.encode() + b"\0junk\r\n\r\n", 400),
            ("bad request line", b"GARBAGE\r\n\r\n", 400),
            ("TRACE", b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
            ("Transfer-Encoding gzip", post + auth + b"Transfer-Encoding: gzip\r\n\r\n", 501),
        ]
        for name, data, want in cases:
            raw, closed = raw_exchange(listen, data)
            status, hdrs, body = parse_one_response(raw)
            if status != want:
                with open(os.path.join(tmp, "error.log"), "rb") as f:
                    elog = b"\n".join(ln[:240] for ln in f.read().splitlines()[-4:])
                pytest.fail(f"{name}: {status} (want {want}):\n{raw[:400]!r}\nnginx: {elog!r}")
            assert hdrs.get("content-type", "").startswith("application/json"), (name, hdrs)
            err = json.loads(body)["error"]
            assert err["message"] and err["type"], (name, err)
            if want != 413:
                assert closed, f"{name}: connection left open"
        # the NUL case never reached dsqd: it logged no request with that key
        with open(a.log_path, "rb") as f:
            log = f.read()
        assert b"junk" not in log
        # dsqd's own answers pass through: 200 with the key, its 401 JSON without
        r = requests.get(base + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"},
                         timeout=10)
        assert r.status_code == 200 and r.json()["data"], r.text[:200]
        r = requests.get(base + "/v1/models", headers={"Authorization": "Bearer wrong"},
                         timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        # no replica up: nginx's 502 is JSON too
        a.stop()
        r = requests.get(base + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"},
                         timeout=30)
        assert r.status_code == 502 and r.json()["error"]["type"] == "service_unavailable", \
            r.text[:300]
    finally:
        stop_nginx(ngx)
        a.stop()
        shutil.rmtree(tmp, ignore_errors=True)

"""Fixtures for the dsqd end-to-end tests.

Each daemon runs $DSQD on a free loopback port with
--model $DSQ_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf, is waited for on
/health, and is stopped with SIGTERM afterwards (the exit status must be 0).
A missing binary or model fails the test with a message naming it.
"""
import os
import signal
import socket
import subprocess
import time

import pytest
import requests
import urllib3

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = MODEL_FILE          # default --served-model-name: the basename
START_TIMEOUT_S = 180


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path():
    d = os.environ.get("DSQ_MODELS_DIR")
    if not d:
        pytest.fail("DSQ_MODELS_DIR is not set (run through meson test)")
    p = os.path.join(d, MODEL_FILE)
    if not os.path.exists(p):
        pytest.fail(f"missing model file {p} (scripts/fetch-model)")
    return p


class Daemon:
    def __init__(self, *extra, env=None, tls=False, wait=True):
        exe = os.environ.get("DSQD")
        if not exe or not os.path.exists(exe):
            pytest.fail(f"DSQD does not name the dsqd binary (got {exe!r})")
        self.port = free_port()
        scheme = "https" if tls else "http"
        self.base = f"{scheme}://127.0.0.1:{self.port}"
        # a small KV budget: the default plan takes most of the RAM, and
        # several daemons run at once here
        self.args = [exe, "--model", model_path(), "--host", "127.0.0.1",
                     "--port", str(self.port), "--kv-cache-memory", "256MiB", *extra]
        full_env = dict(os.environ)
        full_env.pop("DSQ_API_KEY", None)
        full_env.update(env or {})
        self.log_path = f"/tmp/dsqd-e2e-{self.port}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=full_env)
        if wait:
            self.wait_ready()

    def log_tail(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-3000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_ready(self):
        t0 = time.time()
        while time.time() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                pytest.fail(f"dsqd exited with {self.proc.returncode}:\n"
                            + self.log_tail())
            try:
                r = requests.get(self.base + "/health", timeout=2, verify=False)
                if r.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        pytest.fail("dsqd did not become ready:\n" + self.log_tail())

    def url(self, path):
        return self.base + path

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.log.close()
                pytest.fail("dsqd did not exit after SIGTERM:\n" + self.log_tail())
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    d = Daemon()
    yield d
    rc = d.stop()
    assert rc == 0, "dsqd exit status %r:\n%s" % (rc, d.log_tail())


@pytest.fixture
def daemon_factory():
    made = []

    def make(*extra, **kw):
        d = Daemon(*extra, **kw)
        made.append(d)
        return d
    yield make
    for d in made:
        d.stop()


def raw_http(port, data, timeout=10.0):
    """Send raw bytes, read until the server closes (or timeout: then the
    bytes end in <timeout>; a reset: <reset>)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        s.sendall(data)
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        out += b"<timeout>"
    except ConnectionResetError:
        out += b"<reset>"
    finally:
        s.close()
    return out


def post(server, path, body=None, raw=None, headers=None, **kw):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if raw is not None:
        return requests.post(server.url(path), data=raw, headers=h, timeout=120, **kw)
    return requests.post(server.url(path), json=body, headers=h, timeout=120, **kw)


def complete(server, **body):
    body.setdefault("model", MODEL_NAME)
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(resp):
    """Parse an SSE body into a list of JSON-or-'[DONE]' payloads. Lines
    are split as bytes and decoded as UTF-8 (the SSE encoding): decoding
    first would let a character's byte 0x85 (NEL) split a line."""
    import json
    out = []
    for raw in resp.iter_lines():
        line = raw.decode("utf-8")
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[6:]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out

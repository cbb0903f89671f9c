"""dsqd under systemd's notify protocol (deploy/dsqd.service, Type=notify).

The test plays systemd: it binds an AF_UNIX datagram socket, passes it as
NOTIFY_SOCKET and reads what dsqd sends (sd_notify(3)). Checked:
- READY=1 (with a STATUS naming the model and the KV blocks) comes after
  the model is loaded (/health answers 200 at once), then STOPPING=1 on
  SIGTERM, in that order, and the exit status is 0;
- with WATCHDOG_USEC set, WATCHDOG=1 arrives every WATCHDOG_USEC/2, from
  the engine thread: while the engine is wedged (DSQ_TEST_WEDGE_ENGINE_MS,
  debug builds) they stop although HTTP still answers, then resume.
Collected by the deploy_pytest meson test (not by dsqd_pytest's glob).
"""
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest
import requests

from conftest import MODEL_NAME, free_port, model_path

START_TIMEOUT_S = 180


class Notify:
    """A NOTIFY_SOCKET listener: [(monotonic time, {key: value})] per datagram."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="dsq-notify-")
        self.path = os.path.join(self.dir.name, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.msgs = []
        self.cv = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                break
            kv = {}
            for line in data.decode("utf-8", "replace").split("\n"):
                if "=" in line:
                    k, v = line.split("=", 1)
                    kv[k] = v
            with self.cv:
                self.msgs.append((time.monotonic(), kv))
                self.cv.notify_all()

    def wait_for(self, key, value=None, timeout=START_TIMEOUT_S, proc=None):
        """First message (index, time, kv) carrying key (=value)."""
        t_end = time.monotonic() + timeout
        with self.cv:
            while True:
                for i, (t, kv) in enumerate(self.msgs):
                    if key in kv and (value is None or kv[key] == value):
                        return i, t, kv
                if proc is not None and proc.poll() is not None:
                    return None
                left = t_end - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(min(left, 0.5))

    def times(self, key, value):
        with self.cv:
            return [t for t, kv in self.msgs if kv.get(key) == value]

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()
        self.dir.cleanup()


def start_dsqd(notify, extra_env):
    exe = os.environ.get("DSQD")
    if not exe or not os.path.exists(exe):
        pytest.fail(f"DSQD does not name the dsqd binary (got {exe!r})")
    port = free_port()
    env = dict(os.environ)
    env.pop("DSQ_API_KEY", None)
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)
    env["NOTIFY_SOCKET"] = notify.path
    env["DSQ_LOG_LEVEL"] = "info"
    env.update(extra_env)
    log = tempfile.NamedTemporaryFile(prefix="dsqd-notify-", suffix=".log", delete=False)
    proc = subprocess.Popen([exe, "--model", model_path(), "--host", "127.0.0.1",
                             "--port", str(port), "--kv-cache-memory", "256MiB"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, port, log


def log_text(log):
    log.flush()
    with open(log.name, "rb") as f:
        return f.read().decode("utf-8", "replace")[-4000:]


def stop(proc, log):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("dsqd did not exit after SIGTERM:\n" + log_text(log))
    return proc.returncode


def test_ready_then_stopping():
    n = Notify()
    proc, port, log = start_dsqd(n, {})
    try:
        ready = n.wait_for("READY", "1", proc=proc)
        assert ready, "no READY=1 on NOTIFY_SOCKET:\n" + log_text(log)
        # READY means loaded: the engine answers immediately
        r = requests.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert r.status_code == 200, r.text
        i_ready, _, kv = ready
        status = kv.get("STATUS", "")
        assert MODEL_NAME in status and "kv_blocks=" in status, status
        assert int(status.split("kv_blocks=")[1].split()[0]) > 0, status
        # a STATUS=loading message came first (sent before the model loads)
        loading = n.wait_for("STATUS", timeout=0)
        assert loading and loading[0] < i_ready and "loading" in loading[2]["STATUS"]
        assert n.wait_for("STOPPING", timeout=0) is None, "STOPPING before SIGTERM"
        # a real request works between READY and SIGTERM
        r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                          json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        rc = stop(proc, log)
        assert rc == 0, f"exit status {rc}:\n" + log_text(log)
        stopping = n.wait_for("STOPPING", "1", timeout=5)
        assert stopping, "no STOPPING=1 after SIGTERM:\n" + log_text(log)
        assert stopping[0] > i_ready, "STOPPING=1 came before READY=1"
        assert len(n.times("READY", "1")) == 1
    finally:
        stop(proc, log)
        n.close()
        os.unlink(log.name)


def gaps(ts):
    return [b - a for a, b in zip(ts, ts[1:])]


def test_watchdog_stops_while_engine_wedged():
    wd_usec = 400_000              # dsqd pets every 200 ms
    wedge_ms = 3000
    n = Notify()
    proc, port, log = start_dsqd(n, {"WATCHDOG_USEC": str(wd_usec),
                                     "DSQ_TEST_WEDGE_ENGINE_MS": str(wedge_ms)})
    try:
        ready = n.wait_for("READY", "1", proc=proc)
        assert ready, "no READY=1 on NOTIFY_SOCKET:\n" + log_text(log)
        time.sleep(1.5)
        t0 = time.monotonic()
        before = [t for t in n.times("WATCHDOG", "1") if t > ready[1]]
        assert len(before) >= 4, f"only {len(before)} WATCHDOG=1 in 1.5 s after READY"
        assert max(gaps(before)) < 1.0, gaps(before)

        # the first engine step wedges the engine thread for wedge_ms
        result = {}

        def one_request():
            result["r"] = requests.post(
                f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4})
        th = threading.Thread(target=one_request)
        th.start()
        time.sleep(1.0)
        # HTTP threads are alive while the engine hangs...
        h = requests.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert h.status_code == 200
        th.join(timeout=60)
        assert result.get("r") is not None and result["r"].status_code == 200
        time.sleep(1.5)
        t1 = time.monotonic()
        assert "event=engine_wedged_for_test" in log_text(log), (
            "DSQ_TEST_WEDGE_ENGINE_MS had no effect (a build with NDEBUG "
            "ignores it; build with b_ndebug=false):\n" + log_text(log))
        during = [t for t in n.times("WATCHDOG", "1") if t0 <= t <= t1]
        g = gaps([t0] + during + [t1])
        # ...but nothing pets the watchdog for (about) the wedge...
        assert max(g) >= wedge_ms / 1000 * 0.8, (
            f"watchdog kept coming while the engine was wedged: gaps {g}")
        # ...and the pets resume afterwards
        after = [t for t in during if t > t1 - 1.5]
        assert len(after) >= 4, f"WATCHDOG=1 did not resume: {len(after)} in 1.5 s"
        assert stop(proc, log) == 0
    finally:
        stop(proc, log)
        n.close()
        os.unlink(log.name)


def test_sighup_reopens_log_file(tmp_path):
    """--log-file plus SIGHUP (ExecReload) is how logrotate moves the log."""
    n = Notify()
    logf = tmp_path / "dsqd.log"
    exe = os.environ.get("DSQD")
    if not exe or not os.path.exists(exe):
        pytest.fail(f"DSQD does not name the dsqd binary (got {exe!r})")
    env = dict(os.environ, NOTIFY_SOCKET=n.path, DSQ_LOG_LEVEL="info")
    env.pop("DSQ_API_KEY", None)
    proc = subprocess.Popen([exe, "--model", model_path(), "--host", "127.0.0.1",
                             "--port", str(free_port()), "--kv-cache-memory", "256MiB",
                             "--log-file", str(logf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        assert n.wait_for("READY", "1", proc=proc), proc.stderr.read().decode()
        assert "event=ready" in logf.read_text()
        rotated = tmp_path / "dsqd.log.1"
        logf.rename(rotated)
        proc.send_signal(signal.SIGHUP)
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end and not (
                logf.exists() and "event=log_reopened" in logf.read_text()):
            time.sleep(0.1)
        assert logf.exists() and "event=log_reopened" in logf.read_text()
        assert proc.poll() is None, "SIGHUP stopped dsqd"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "event=draining" in logf.read_text()
        assert "event=draining" not in rotated.read_text()
        # nothing went to stderr once --log-file took over
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        n.close()

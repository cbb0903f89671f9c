"""Startup and shutdown: /health is 503 until the model is loaded; SIGTERM
stops new work (503) while in-flight streams finish, then dsqd exits 0;
--help/--version/--plan and bad options exit cleanly."""
import os
import signal
import subprocess
import threading
import time

import requests

from conftest import MODEL_NAME, Daemon, model_path, sse_events


def test_drain_on_sigterm():
    d = Daemon("--shutdown-timeout", "120")
    # long enough to be still streaming 0.3 s after SIGTERM (48 tokens took
    # ~0.25 s on a quiet box: the drain had ended and the listener was
    # closed before /health was asked)
    body = {"model": MODEL_NAME, "prompt": "Count:", "max_tokens": 400, "temperature": 0,
            "ignore_eos": True, "stream": True}
    result = {}

    def run():
        r = requests.post(d.url("/v1/completions"), json=body, stream=True, timeout=300)
        result["events"] = sse_events(r)

    t = threading.Thread(target=run)
    t.start()
    # wait for the stream to be under way, then ask for a shutdown
    for _ in range(200):
        m = requests.get(d.url("/metrics")).text
        if "dsq:num_requests_running{" in m and not any(
                l.startswith("dsq:num_requests_running{") and l.endswith(" 0")
                for l in m.splitlines()):
            break
        time.sleep(0.05)
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    if d.proc.poll() is None:
        assert requests.get(d.url("/health")).status_code == 503
        r = requests.post(d.url("/v1/completions"), json=dict(body, stream=False))
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable"
    t.join(300)
    ev = result["events"]
    assert ev[-1] == "[DONE]"
    assert ev[-2]["choices"][0]["finish_reason"] == "length"
    assert d.proc.wait(60) == 0


def test_shutdown_timeout_aborts_and_exits_zero():
    d = Daemon("--shutdown-timeout", "0.5")
    body = {"model": MODEL_NAME, "prompt": "Count:", "max_tokens": 2000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    r = requests.post(d.url("/v1/completions"), json=body, stream=True, timeout=300)
    it = r.iter_lines()
    next(it)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(60) == 0
    rest = [l for l in it if l]
    assert rest[-1] == b"data: [DONE]"
    assert b'"finish_reason":"abort"' in rest[-2]


def run_cli(*args):
    exe = os.environ["DSQD"]
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def test_cli():
    r = run_cli("--help")
    assert r.returncode == 0 and "--max-request-bytes" in r.stdout and "DSQ_API_KEY" in r.stdout
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("dsqd ")
    r = run_cli("--no-such-flag")
    assert r.returncode == 2 and "--no-such-flag" in r.stderr
    r = run_cli("--port", "x")
    assert r.returncode == 2
    r = run_cli()
    assert r.returncode == 2 and "--model" in r.stderr
    r = run_cli("--model", "/nonexistent/model.gguf", "--port", "0")
    assert r.returncode == 1
    r = run_cli("--plan", "--model", "/nonexistent/model.gguf")
    assert r.returncode == 1 and "plan" in r.stderr
    r = run_cli("--plan", "--model", model_path(), "--kv-cache-memory", "512MiB")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "KV" in r.stdout and "max_model_len" in r.stdout
    # 64 MiB of KV (2912 tokens) cannot hold one 8192-token sequence: the
    # plan is still printed, and the exit status says it does not fit
    r = run_cli("--plan", "--model", model_path(), "--kv-cache-memory", "64MiB",
                "--max-model-len", "8192")
    assert r.returncode == 1 and "max_model_len" in r.stdout


def test_plan_json_and_config_only():
    """--plan --json keys, and planning a model from its config.json alone."""
    import json
    r = run_cli("--plan", "--json", "--model", model_path(), "--kv-cache-memory", "512MiB")
    assert r.returncode == 0, r.stderr[-2000:]
    p = json.loads(r.stdout)
    for k in ("weight_bytes", "kv_bytes_per_token", "block_bytes", "num_blocks",
              "max_tokens", "max_concurrent_seqs", "coarse_estimate_bytes"):
        assert k in p, k
    # SmolLM2: 2 x 30 layers x 3 kv heads x 64 x 2 bytes; 512 MiB / (16 x 23040)
    assert p["kv_bytes_per_token"] == 23040
    assert p["num_blocks"] == (512 << 20) // (16 * 23040)
    assert p["max_tokens"] == p["num_blocks"] * 16
    assert "load" not in r.stderr        # nothing loaded, no progress lines
    cfg = os.path.join(os.environ.get("DSQ_TEST_DATA", ""), "configs", "hf",
                       "DeepSeek-V2-Lite-Chat")
    r = run_cli("--plan", "--json", "--model", cfg, "--quantize", "int4",
                "--kv-cache-memory", "1GiB", "--max-model-len", "4096")
    assert r.returncode == 0, r.stderr[-2000:]
    p = json.loads(r.stdout)
    assert p["weights_from_config"] is True
    assert p["kv_bytes_per_token"] == 27 * (512 + 64) * 2    # MLA latent + rope key


def test_request_timeout(daemon_factory):
    d = daemon_factory("--request-timeout", "0.5")
    body = {"model": MODEL_NAME, "prompt": "Count:", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True}
    r = requests.post(d.url("/v1/completions"), json=body, timeout=120)
    assert r.status_code == 408, r.text
    assert r.json()["error"]["code"] == "request_timeout"
    r = requests.post(d.url("/v1/completions"), json=dict(body, stream=True), stream=True,
                      timeout=120)
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    assert ev[-2]["choices"][0]["finish_reason"] == "abort"
    assert requests.get(d.url("/health")).status_code == 200

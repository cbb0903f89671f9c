#!/usr/bin/env python3
"""GPU check end to end over HTTP: `dsqd --device cuda` serving stories260K
(llama2.c, tok512) answers /v1/completions, streamed and not, with the same
text as `dsqd --device cpu` from the same build.

Both daemons run with --kv-cache-dtype fp16 (the CUDA ops have no FP32 KV;
the CPU's auto would pick FP32 for this FP32 model) and greedy decoding;
the CUDA daemon computes with fp16 activations (--dtype auto), so their
logits differ by the fp16 roundings tests/gpu/test_cuda_model.c bounds,
far below the gaps between these 8 greedy choices: the text is the same. The CUDA daemon runs under tests/gpu/cudasim when
DSQ_CUDASIM_WRAP is set (meson's -Dcudasim=true build), else natively (a
GPU box: tests/gpu/run). Its log must name the device (event=device).
TAP on stdout; the daemons' logs go to $TMPDIR/dsqd-cuda-http-*.log (kept
when a check fails).

  DSQD=build/tools/dsqd DSQ_TEST_DATA=tests/data tests/gpu/test_cuda_http.py
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PROMPT = "Once upon a time, there was a little"
MAX_TOKENS = 8
START_TIMEOUT_S = 600

results = []


def tap(ok, what, why=""):
    results.append(ok)
    print(f"{'ok' if ok else 'not ok'} {len(results)} - {what}")
    if why:
        for line in why.splitlines():
            print(f"# {line}")
    sys.stdout.flush()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, device, wrap):
        data = os.environ.get("DSQ_TEST_DATA", "tests/data")
        model = os.path.join(data, "models/stories260K/stories260K.bin")
        tok = os.path.join(data, "models/stories260K/tok512.bin")
        for p in (model, tok):
            if not os.path.exists(p):
                raise SystemExit(f"Bail out! missing {p} (DSQ_TEST_DATA)")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        fd, self.log_path = tempfile.mkstemp(prefix=f"dsqd-cuda-http-{device}-",
                                             suffix=".log")
        self.log = os.fdopen(fd, "wb")
        args = [os.environ["DSQD"], "--model", model, "--tokenizer", tok,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--device", device, "--kv-cache-dtype", "fp16",
                "--kv-cache-memory", "1MiB", "--max-model-len", "256",
                "--threads", "1", "--log-level", "info",
                # the simulator runs a step in seconds: a step budget
                # (backend-independent, tested on the CPU in
                # tests/e2e/test_hardening.py) would only split prompts
                "--step-budget-ms", "0"]
        env = dict(os.environ)
        env.pop("DSQ_API_KEY", None)
        if wrap:
            args = [wrap] + args
            env["CUDASIM_QUIET"] = "1"
            env["CUDASIM_LOG"] = self.log_path + ".sim"
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_ready(self):
        t0 = time.time()
        while time.time() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                return f"exited {self.proc.returncode}:\n{self.log_text()[-2000:]}"
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return None
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        return "not ready in time:\n" + self.log_text()[-2000:]

    def daemon_pid(self):
        """dsqd's pid: the process itself, or under the simulator's run
        script (which waits for it and exits with its status) its child."""
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "dsqd":
                        return pid
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.daemon_pid(), signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def model_id(self):
        with urllib.request.urlopen(self.base + "/v1/models", timeout=30) as r:
            return json.loads(r.read())["data"][0]["id"]

    def complete(self, stream):
        body = json.dumps({"model": self.model_id(), "prompt": PROMPT,
                           "max_tokens": MAX_TOKENS, "temperature": 0,
                           "stream": stream}).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=900) as r:
                raw = r.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"HTTP {e.code}: {e.read()[:500]!r}") from None
        if not stream:
            j = json.loads(raw)
            return j["choices"][0]["text"], j["choices"][0]["finish_reason"]
        text, finish, done = "", None, False
        for line in raw.split("\n"):
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            j = json.loads(line[6:])
            for c in j.get("choices", []):
                text += c.get("text") or ""
                finish = c.get("finish_reason") or finish
        if not done:
            raise ValueError("stream ended without data: [DONE]")
        return text, finish


def main():
    if "DSQD" not in os.environ:
        print("Bail out! DSQD does not name the dsqd binary")
        return 1
    wrap = os.environ.get("DSQ_CUDASIM_WRAP")
    print("1..5")
    cpu = Daemon("cpu", None)
    gpu = Daemon("cuda", wrap)
    try:
        err = cpu.wait_ready() or ""
        gerr = gpu.wait_ready()
        tap(not err and not gerr, "both daemons ready",
            (("cpu: " + err) if err else "") + (("cuda: " + gerr) if gerr else ""))
        if err or gerr:
            return 1
        log = gpu.log_text()
        dev = [l for l in log.splitlines() if "event=device" in l and "device_memory" not in l]
        tap(bool(dev) and "cuda" in dev[0].lower(), "cuda daemon logs its device",
            dev[0] if dev else log[-1500:])
        for stream in (False, True):
            what = "streamed" if stream else "not streamed"
            try:
                want = cpu.complete(stream)
                got = gpu.complete(stream)
            except (RuntimeError, ValueError, OSError, KeyError) as e:
                tap(False, f"/v1/completions {what}", str(e))
                continue
            tap(got == want and len(want[0]) > 0,
                f"/v1/completions {what}: cuda text equals cpu text",
                f"cpu: {want!r}\ncuda: {got!r}")
    finally:
        rc_gpu = gpu.stop()
        rc_cpu = cpu.stop()
    tap(rc_gpu == 0 and rc_cpu == 0, "both daemons exit 0 on SIGTERM",
        f"cpu {rc_cpu}, cuda {rc_gpu}; logs {cpu.log_path} {gpu.log_path}")
    if all(results):
        for d in (cpu, gpu):
            for p in (d.log_path, d.log_path + ".sim"):
                if os.path.exists(p):
                    os.unlink(p)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""GGUF files as users download them: dsqd serves llama.cpp's Q4_K_M of
SmolLM2 (made by tests/ref/make_smollm2_quants.sh in scripts/test) over
HTTP, and a GGUF holding a type dsq does not read (IQ2_XXS) fails at start
with a one-line reason naming the tensor and the type, exit status 1,
before any weight is loaded; dsq-inspect flags the same file; a block with
a NaN scale fails the load naming tensor and block."""
import os
import subprocess
import time

import numpy as np
import pytest
import requests

from conftest import free_port

QUANTS = os.path.join(os.environ.get("DSQ_MODELS_DIR", "models"), "smollm2-quants")


def quant_file(name):
    p = os.path.join(QUANTS, f"SmolLM2-135M-Instruct.{name}.gguf")
    if not os.path.exists(p):
        pytest.fail(f"missing {p}: made by tests/ref/make_smollm2_quants.sh (scripts/test)")
    return p


def start(model, *extra):
    port = free_port()
    log = open(f"/tmp/dsqd-gguf-types-{port}.log", "wb")
    proc = subprocess.Popen([os.environ["DSQD"], "--model", model, "--host", "127.0.0.1",
                             "--port", str(port), "--kv-cache-memory", "256MiB", *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    while time.time() - t0 < 120:
        assert proc.poll() is None, open(log.name, "rb").read()[-2000:]
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail("dsqd did not become ready")


@pytest.mark.parametrize("name", ["Q4_K_M", "Q6_K", "IQ4_XS"])
def test_serves_llama_quantize_files(name):
    path = quant_file(name)
    proc, base = start(path)
    try:
        models = requests.get(base + "/v1/models", timeout=10).json()
        mid = models["data"][0]["id"]
        assert mid == os.path.basename(path)
        r = requests.post(base + "/v1/completions", json={
            "model": mid, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0, "logprobs": 1}, timeout=60)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert ch["text"].strip() != ""
        assert all(np.isfinite(lp) for lp in ch["logprobs"]["token_logprobs"])
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def make_unreadable(tmp_path):
    """The pure Q5_0 SmolLM2 with blk.0.ffn_down.weight rewritten as IQ2_XXS
    (random bytes of the right size), everything else copied by gguf-py."""
    import gguf
    src = gguf.GGUFReader(quant_file("Q5_0-pure"))
    out = str(tmp_path / "smollm2-iq2xxs.gguf")
    w = gguf.GGUFWriter(out, src.fields["general.architecture"].contents())
    for name, f in src.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    rng = np.random.default_rng(0)
    for t in src.tensors:
        shape = [int(x) for x in reversed(t.shape)]         # numpy order
        if t.name == "blk.0.ffn_down.weight":
            be, bb = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ2_XXS]
            raw = rng.integers(0, 256, size=(shape[0], shape[1] // be * bb), dtype=np.uint8)
            w.add_tensor(t.name, raw, raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_unreadable_type_fails_at_start(tmp_path):
    path = make_unreadable(tmp_path)
    t0 = time.time()
    r = subprocess.run([os.environ["DSQD"], "--model", path, "--port", "0",
                        "--log-level", "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "IQ2_XXS" in ln]
    assert lines, r.stderr[-2000:]
    assert "blk.0.ffn_down.weight" in lines[0] and "does not read" in lines[0]
    # refused by the type check that runs before any weight is repacked:
    # the engine fails, the daemon never gets ready
    assert "event=engine_failed" in lines[0]
    assert "event=ready" not in r.stderr
    assert time.time() - t0 < 60
    i = subprocess.run([os.environ["DSQ_INSPECT"], path], capture_output=True, text=True,
                       timeout=60)
    assert i.returncode == 0, i.stderr
    assert "IQ2_XXS" in i.stdout and "NOT READ by dsq" in i.stdout
    assert "readable:         no: tensor blk.0.ffn_down.weight" in i.stdout


def test_nonfinite_scale_fails_at_start(tmp_path):
    """A Q4_K block whose fp16 d is NaN (a damaged file): dsqd names the
    tensor and the block and exits 1, instead of serving NaN logits."""
    import shutil
    import gguf
    path = str(tmp_path / "smollm2-nan.gguf")
    shutil.copy(quant_file("Q4_K_M"), path)
    r = gguf.GGUFReader(path, "r+")
    t = next(t for t in r.tensors if t.name == "blk.3.ffn_down.weight")
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_K
    blocks = t.data.reshape(-1, 144)
    blocks[5, 0:2] = np.frombuffer(np.array([np.nan], dtype=np.float16).tobytes(), np.uint8)
    del r
    p = subprocess.run([os.environ["DSQD"], "--model", path, "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr[-2000:]
    line = [ln for ln in p.stderr.splitlines() if "non-finite" in ln]
    assert line and "blk.3.ffn_down.weight" in line[0] and "block 5 " in line[0], p.stderr[-2000:]

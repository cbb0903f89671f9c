"""What users of vLLM, llama.cpp and the OpenAI SDKs expect:
each case failed on dsqd before its fix.

Busy port, 404 model_not_found, GET /v1/models/{id}, the developer role,
JSON bodies sent with another Content-Type (curl -d), refusing
response_format / tools until they are built, /tokenizer_info, the short
flags (positional MODEL, -m, -c/--ctx-size, -t, --seed), vLLM metric
names, disconnects logged at info and 4xx access lines naming the error,
and plans that name the flag that fixes them.
"""
import os
import re
import signal
import socket
import subprocess
import time

import openai
import pytest
import requests

from conftest import MODEL_NAME, Daemon, free_port, model_path, post

PROMPT = "The capital of France is"


def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)


def run_dsqd(*args, timeout=60):
    return subprocess.run([os.environ["DSQD"], *args], capture_output=True, text=True,
                          timeout=timeout)


def test_busy_port_is_a_startup_error(server):
    """SO_REUSEPORT let a second dsqd share the port and take half the
    requests; now the second one exits 1 naming the port."""
    r = run_dsqd("--model", model_path(), "--host", "127.0.0.1", "--port", str(server.port),
                 "--kv-cache-memory", "64MiB")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "port %d is already in use" % server.port in r.stderr, r.stderr[-2000:]
    # and it said so before loading the weights (no load progress lines)
    assert "event=engine_ready" not in r.stderr
    # the first server is untouched
    assert requests.get(server.url("/health"), timeout=5).status_code == 200


def test_busy_port_held_by_another_program():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run_dsqd("--model", model_path(), "--host", "127.0.0.1", "--port", str(port))
    assert r.returncode == 1 and "port %d is already in use" % port in r.stderr, r.stderr


def test_unknown_model_is_404(server):
    c = client(server)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "model_not_found"


def test_models_retrieve(server):
    m = client(server).models.retrieve(MODEL_NAME)
    assert m.id == MODEL_NAME and m.object == "model" and m.owned_by == "dsq"
    with pytest.raises(openai.NotFoundError) as e:
        client(server).models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"
    r = requests.get(server.url("/v1/models/" + MODEL_NAME))
    assert r.status_code == 200 and r.json()["max_model_len"] > 0
    assert requests.post(server.url("/v1/models/" + MODEL_NAME)).status_code == 405


def test_developer_role_is_system(server):
    """developer renders exactly as system (the OpenAI API's newer name)."""
    def rendered(role):
        r = post(server, "/v1/chat/completions", {
            "model": MODEL_NAME, "max_tokens": 1, "temperature": 0, "messages": [
                {"role": role, "content": "Answer in French."},
                {"role": "user", "content": "Hello"}]})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]
    tok = post(server, "/tokenize", {"model": MODEL_NAME, "messages": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"}], "add_generation_prompt": True}).json()
    assert rendered("developer") == rendered("system") == tok["count"]
    r = client(server).chat.completions.create(
        model=MODEL_NAME, max_tokens=3, temperature=0,
        messages=[{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": "Hi"}])
    assert r.choices[0].message.content


def test_json_body_without_json_content_type(server, daemon_factory):
    """curl -d '{...}' without -H sends application/x-www-form-urlencoded:
    a 415 that says which header to add, and --any-content-type takes it
    (as llama-server does) when the body is JSON."""
    body = '{"model": "%s", "prompt": "%s", "max_tokens": 2, "temperature": 0}' % (
        MODEL_NAME, PROMPT)
    for ct in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; b=x"):
        r = requests.post(server.url("/v1/completions"), data=body,
                          headers={"Content-Type": ct})
        assert r.status_code == 415, (ct, r.text)
        e = r.json()["error"]
        assert e["code"] == "unsupported_media_type"
        assert "Content-Type: application/json" in e["message"] and "--any-content-type" in e["message"]
        assert "not '%s'" % ct in e["message"]
    d = daemon_factory("--any-content-type")
    for ct in ("application/x-www-form-urlencoded", "text/plain"):
        r = requests.post(d.url("/v1/completions"), data=body, headers={"Content-Type": ct})
        assert r.status_code == 200, (ct, r.text)
        assert r.json()["usage"]["completion_tokens"] == 2
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", d.url("/v1/completions"),
                          "-d", body], capture_output=True, text=True, timeout=60)
    assert out.stdout.rstrip().endswith("200"), out.stdout
    r = requests.post(d.url("/v1/completions"), data="model=x&prompt=y",
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    # a JSON typo sent that way: the 415 still says where the JSON breaks
    r = requests.post(d.url("/v1/completions"), data='{"model": 01}',
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and "at byte 11 (line 1, column 12)" in r.json()["error"]["message"]


def test_tool_calls_refused_on_completions(server):
    # tool calls are a chat feature (tests/e2e/test_tools.py); on
    # /v1/completions asking for them is a 400, never silently ignored
    body = {"model": MODEL_NAME, "max_tokens": 2, "prompt": "hi",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == "tools" and e["code"] == "unsupported_parameter", e
    assert "/v1/chat/completions" in e["message"]
    r = post(server, "/v1/completions", dict(body, tool_choice="none"))
    assert r.status_code == 200, r.text


def test_structured_outputs_refused_through_sdk(server):
    # a schema keyword outside the supported subset is refused, naming it
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "patternProperties": {}}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "'patternProperties'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client(server).completions.create(model=MODEL_NAME, prompt="a",
                                          extra_body={"guided_regex": "(?=a)b"})
    assert "lookaround" in e.value.body["message"]
    # what stays accepted: text format, tools with tool_choice none
    r = client(server).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        response_format={"type": "text"}, tool_choice="none",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert r.choices[0].finish_reason == "length"


def test_tokenizer_info(server):
    r = requests.get(server.url("/tokenizer_info"))
    assert r.status_code == 200, r.text
    info = r.json()
    # SmolLM2-135M-Instruct: <|im_start|> 1, <|im_end|> 2 (eos), vocab 49152
    assert info["eos_token"] == "<|im_end|>" and info["eos_token_id"] == 2
    assert info["vocab_size"] == 49152
    assert info["model_max_length"] == requests.get(
        server.url("/v1/models")).json()["data"][0]["max_model_len"]
    assert "<|im_start|>" in info["chat_template"]
    assert "pad_token" in info and "bos_token" in info
    # the remote tokenizer of lm-eval encodes the eos text through /tokenize
    t = post(server, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
    assert t.status_code == 200 and t.json()["tokens"] == [2]


def test_short_flags_and_positional_model(daemon_factory):
    """dsqd MODEL -c N -t T --seed S, as llama-server / vLLM users type."""
    exe = os.environ["DSQD"]
    port = free_port()
    log = open(f"/tmp/dsqd-e2e-{port}.log", "wb")
    p = subprocess.Popen([exe, model_path(), "--host", "127.0.0.1", "--port", str(port),
                          "-c", "512", "-t", "1", "--seed", "1234", "--kv-cache-memory",
                          "64MiB", "--log-level", "info"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            assert p.poll() is None, open(log.name).read()[-2000:]
            try:
                if requests.get(base + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        m = requests.get(base + "/v1/models").json()["data"][0]
        assert m["max_model_len"] == 512
        # --seed: requests without a seed sample the same text each time
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.5}
        a = [requests.post(base + "/v1/completions", json=body).json()["choices"][0]["text"]
             for _ in range(3)]
        assert a[0] == a[1] == a[2], a
        # ... and the same as a request that sends that seed itself
        b = requests.post(base + "/v1/completions", json=dict(body, seed=1234)).json()
        assert b["choices"][0]["text"] == a[0]
        c = requests.post(base + "/v1/completions", json=dict(body, seed=99)).json()
        assert c["choices"][0]["text"] != a[0]
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
        log.close()
    text = open(log.name).read()
    assert "threads=1" in text
    assert "url=http://127.0.0.1:%d" % port in text


def test_no_seed_samples_differently(server):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.5}
    texts = {post(server, "/v1/completions", body).json()["choices"][0]["text"]
             for _ in range(4)}
    assert len(texts) > 1


def test_positional_and_flag_model_conflict():
    r = run_dsqd(model_path(), "--model", model_path())
    assert r.returncode == 2 and "twice" in r.stderr, r.stderr
    r = run_dsqd(model_path(), "other.gguf")
    assert r.returncode == 2 and "other.gguf" in r.stderr, r.stderr
    r = run_dsqd("--help")
    assert "-m, --model" in r.stdout and "-c, --ctx-size, --max-model-len" in r.stdout
    assert "-t, --threads" in r.stdout and "--seed" in r.stdout
    assert "0 = half of physical RAM" in r.stdout
    assert "DSQ_QUANTIZE)" in r.stdout and "DSQ_LOAD_QUANTIZE" not in r.stdout


def test_quantize_env_name(daemon_factory):
    """--quantize reads DSQ_QUANTIZE like every option (DSQ_<NAME>)."""
    r = subprocess.run([os.environ["DSQD"], "--plan", "--model", model_path()],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, DSQ_QUANTIZE="int3"))
    assert r.returncode == 2 and "DSQ_QUANTIZE" in r.stderr, r.stderr


VLLM = ["vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
        "vllm:num_preemptions_total"]


def metric(text, name):
    m = re.search("^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_vllm_metric_names(daemon_factory):
    d = daemon_factory("--enable-prefix-caching")
    before = requests.get(d.url("/metrics")).text
    prompt = "Once upon a time, " * 10          # > one KV block, so the repeat hits
    usage = []
    for _ in range(2):
        r = requests.post(d.url("/v1/completions"), json={
            "model": MODEL_NAME, "prompt": prompt, "max_tokens": 3, "temperature": 0})
        usage.append(r.json()["usage"])
    t = requests.get(d.url("/metrics")).text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", t, re.M))
    for name in VLLM:
        assert name in types, name
    for name in ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                 "vllm:e2e_request_latency_seconds"):
        assert types[name] == "histogram"
        # the same buckets as dsq's own histogram of that quantity
        assert metric(t, name + "_count") >= 2 or name.endswith("output_token_seconds")
    # vLLM V1's bucket lists (vllm/v1/metrics/loggers.py), transcribed
    ttft = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
            5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
    tpot = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0, 20.0, 40.0, 80.0]
    lat = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
    for name, want in (("vllm:time_to_first_token_seconds", ttft),
                       ("vllm:time_per_output_token_seconds", tpot),
                       ("vllm:e2e_request_latency_seconds", lat),
                       ("vllm:request_queue_time_seconds", lat)):
        les = re.findall("^" + re.escape(name) + r'_bucket\{[^}]*le="([^"]+)"\}', t, re.M)
        assert [float(x) for x in les[:-1]] == want and les[-1] == "+Inf", (name, les)
    assert types["vllm:prompt_tokens_total"] == "counter"
    assert types["vllm:num_requests_running"] == "gauge"
    # vLLM counts prompt tokens with the prefix-cached ones
    assert usage[1]["prompt_tokens_details"]["cached_tokens"] > 0
    got = metric(t, "vllm:prompt_tokens_total") - metric(before, "vllm:prompt_tokens_total")
    assert got == usage[0]["prompt_tokens"] + usage[1]["prompt_tokens"]
    own = metric(t, "dsq:prompt_tokens_total") - metric(before, "dsq:prompt_tokens_total")
    assert own < got
    assert metric(t, "vllm:generation_tokens_total") >= 6
    assert 0 <= metric(t, "vllm:kv_cache_usage_perc") <= 1


def test_logs_disconnect_info_and_4xx_reason(daemon_factory):
    # the test environment sets DSQ_LOG_LEVEL=warn; the flag wins
    d = daemon_factory("--log-level", "info")
    # a 4xx access line names the error code and message
    r = requests.post(d.url("/v1/completions"), json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    # a client that hangs up mid-stream
    s = socket.create_connection(("127.0.0.1", d.port))
    body = ('{"model": "%s", "prompt": "Once", "max_tokens": 200, "stream": true, '
            '"ignore_eos": true}' % MODEL_NAME).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.close()
    for _ in range(100):
        log = open(d.log_path).read()
        if "event=disconnect" in log:
            break
        time.sleep(0.1)
    d.stop()
    log = open(d.log_path).read()
    line = [l for l in log.splitlines() if "status=404" in l]
    assert line and 'error=model_not_found' in line[0] and "does not exist" in line[0], line
    dis = [l for l in log.splitlines() if "event=disconnect" in l]
    assert dis and "level=info" in dis[0] and re.search(r"req=cmpl-\w+", dis[0]), dis
    assert "application error" not in log
    assert not [l for l in log.splitlines() if "level=warn" in l and "mhd" in l], log[-3000:]


def test_plan_refusals_name_the_flag():
    # an explicit KV budget over the memory limit is an error naming both
    r = run_dsqd("--plan", "--model", model_path(), "--memory-limit", "256MiB",
                 "--kv-cache-memory", "1GiB")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "--kv-cache-memory" in r.stderr and "--memory-limit" in r.stderr, r.stderr
    r = run_dsqd("--model", model_path(), "--port", "0", "--memory-limit", "256MiB",
                 "--kv-cache-memory", "1GiB")
    assert r.returncode == 1 and "--kv-cache-memory" in r.stderr, r.stderr[-2000:]
    # one sequence that does not fit: the largest max_model_len that does
    r = run_dsqd("--plan", "--model", model_path(), "--kv-cache-memory", "64MiB",
                 "--max-model-len", "8192")
    assert r.returncode == 1
    # 64 MiB / (16 x 23040 bytes) = 182 blocks = 2912 tokens
    assert "use --max-model-len 2912 or lower" in r.stderr, r.stderr
    # the 4 GiB CPU default says why it is 4 GiB
    r = run_dsqd("--plan", "--json", "--model", model_path(), "--memory-limit", "64GiB",
                 "--max-model-len", "8192", "--max-num-seqs", "256")
    assert r.returncode == 0, r.stderr
    import json
    p = json.loads(r.stdout)
    assert p["kv_budget_bytes"] == 4 << 30 and "4 GiB" in p["kv_budget_source"], p


LM_EVAL_TASK = """task: dsq_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""

LM_EVAL_DOCS = [
    '{"question": "The capital of France is", "choices": [" Paris", " a banana"], "answer": 0}',
    '{"question": "Two plus two equals", "choices": [" purple", " four"], "answer": 1}',
    '{"question": "The sun rises in the", "choices": [" east", " refrigerator"], "answer": 0}',
]


def test_lm_eval_remote_tokenizer(server, tmp_path):
    """lm-evaluation-harness's local-completions finds /tokenizer_info, picks
    the remote tokenizer (no Hugging Face hub: offline here) and scores a
    tiny local multiple-choice task through echo + logprobs."""
    import json
    import sys
    (tmp_path / "tiny.jsonl").write_text("\n".join(LM_EVAL_DOCS) + "\n")
    (tmp_path / "dsq_tiny.yaml").write_text(LM_EVAL_TASK.format(data=tmp_path / "tiny.jsonl"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"), NO_PROXY="127.0.0.1")
    args = "base_url=%s,model=%s,num_concurrent=1,max_retries=1" % (
        server.url("/v1/completions"), MODEL_NAME)
    r = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions",
                        "--model_args", args, "--tasks", "dsq_tiny",
                        "--include_path", str(tmp_path), "--output_path",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                       env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "Auto-detected remote tokenizer support" in out, out[-4000:]
    res = [p for p in (tmp_path / "out").rglob("results_*.json")]
    assert res, out[-2000:]
    acc = json.loads(res[0].read_text())["results"]["dsq_tiny"]["acc,none"]
    # choices chosen to be unambiguous even for a 135M model: a broken
    # tokenizer (wrong continuation split) or logprob path loses them
    assert acc == 1.0, out[-2000:]


def test_scripts_serve_prints_the_real_address():
    """scripts/serve --port P said http://127.0.0.1:8000 whatever P was; it
    now relays dsqd's own ready line."""
    root = os.environ.get("DSQ_SOURCE_ROOT") or os.getcwd()
    port = free_port()
    p = subprocess.Popen([os.path.join(root, "scripts", "serve"), "--port", str(port),
                          "--kv-cache-memory", "256MiB", "--log-level", "info"], cwd=root,
                         env=dict(os.environ, DSQ_SERVE_DSQD=os.environ["DSQD"]),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    try:
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        fd, buf, t0 = p.stdout.fileno(), b"", time.time()
        # dsqd keeps running whatever it printed: read the raw pipe with a
        # deadline (the ready line comes within seconds; 60 s is for a
        # loaded CI box), a little past dsqd's own ready line
        while time.time() - t0 < 60 and not any(
                l.startswith("serve: dsqd is serving on") for l in lines):
            if not sel.select(timeout=1):
                if any("event=ready" in l for l in lines) and time.time() - t0 > 5:
                    break
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            *done, buf = buf.split(b"\n")
            lines += [l.decode("utf-8", "replace") for l in done]
        said = [l for l in lines if l.startswith("serve: dsqd is serving on")]
        assert said and said[0].split()[-1] == "http://127.0.0.1:%d" % port, "".join(lines)
        assert not [l for l in lines if ":8000" in l and l.startswith("serve:")], lines
        assert requests.get("http://127.0.0.1:%d/health" % port, timeout=5).status_code == 200
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)


def test_model_id_edge_cases(daemon_factory):
    """Found by attacking the new route: %00, ids longer than a fixed
    buffer, bytes that are not UTF-8, log-line forging through the path."""
    long_name = "b" * 300
    d = daemon_factory("--served-model-name", long_name, "--log-level", "info")
    assert requests.get(d.url("/v1/models/" + long_name)).status_code == 200
    r = requests.get(d.url("/v1/models/" + long_name[:255] + "JUNK"))
    assert r.status_code == 404
    assert requests.get(d.url("/v1/models/" + long_name + "%00junk")).status_code == 404
    for raw in ("/v1/models/%ff%fe%c3", "/v1/models/" + "a" * 199 + "%C3%A9"):
        r = requests.get(d.url(raw))
        assert r.status_code == 404
        r.content.decode("utf-8")                  # valid UTF-8, so valid JSON
        assert r.json()["error"]["code"] == "model_not_found"
    requests.get(d.url("/v1/models/x%0A2026-01-01T00:00:00Z%20level=error%20event=forged"))
    # trailing bytes after the JSON, with another Content-Type: not JSON
    r = requests.post(d.url("/v1/completions"), headers={"Content-Type": "text/plain"},
                      data='{"model": "%s", "prompt": "Hi"} xyz' % long_name)
    assert r.status_code == 415, r.text
    # a non-streaming client that hangs up: info, never a warning
    s = socket.create_connection(("127.0.0.1", d.port))
    body = ('{"model": "%s", "prompt": "Once", "max_tokens": 200, "ignore_eos": true}'
            % long_name).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.5)
    s.close()
    for _ in range(100):
        if "event=disconnect" in open(d.log_path).read():
            break
        time.sleep(0.1)
    d.stop()
    log = open(d.log_path).read()
    assert "event=forged" not in "".join(l for l in log.splitlines()
                                         if l.startswith("2026-01-01"))
    assert not [l for l in log.splitlines() if l.startswith("2026-01-01")], log[-2000:]
    assert "event=disconnect" in log
    assert not [l for l in log.splitlines() if "level=warn" in l], log[-3000:]

"""POST /v1/completions end to end: every field, streaming and not, raw HTTP
and the official openai client. Expectations come from the OpenAI API
reference; model-dependent ones compare the server with itself only through
invariants (greedy is deterministic, n choices of a greedy request are equal,
a streamed text equals the same request unstreamed)."""
import re

import openai
import pytest
import requests

from conftest import MODEL_NAME, complete, post, sse_events

PROMPT = "The capital of France is"


def client(server, **kw):
    return openai.OpenAI(base_url=server.url("/v1"), api_key=kw.pop("api_key", "none"),
                         max_retries=0, **kw)


def test_health_models_version(server):
    assert requests.get(server.url("/health")).status_code == 200
    m = requests.get(server.url("/v1/models")).json()
    assert m["object"] == "list"
    assert len(m["data"]) == 1
    d = m["data"][0]
    assert d["id"] == MODEL_NAME and d["object"] == "model"
    assert d["owned_by"] == "dsq" and isinstance(d["created"], int)
    assert d["max_model_len"] > 0
    v = requests.get(server.url("/version")).json()
    assert re.match(r"^\d+\.\d+\.\d+", v["version"])


def test_response_shape(server):
    j = complete(server, prompt=PROMPT, max_tokens=5, temperature=0)
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", j["id"])
    assert j["object"] == "text_completion"
    assert isinstance(j["created"], int)
    assert j["model"] == MODEL_NAME
    assert len(j["choices"]) == 1
    c = j["choices"][0]
    assert c["index"] == 0 and isinstance(c["text"], str)
    assert c["logprobs"] is None
    assert c["finish_reason"] in ("stop", "length")
    u = j["usage"]
    assert u["prompt_tokens"] > 0 and 0 < u["completion_tokens"] <= 5
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    tok = post(server, "/tokenize", {"prompt": PROMPT}).json()
    assert u["prompt_tokens"] == tok["count"]


def test_default_max_tokens_16(server):
    j = complete(server, prompt=PROMPT, temperature=0, ignore_eos=True)
    assert j["usage"]["completion_tokens"] == 16
    assert j["choices"][0]["finish_reason"] == "length"


def test_ids_differ(server):
    a = complete(server, prompt=PROMPT, max_tokens=1)
    b = complete(server, prompt=PROMPT, max_tokens=1)
    assert a["id"] != b["id"]


def test_greedy_deterministic_and_token_prompt(server):
    a = complete(server, prompt=PROMPT, max_tokens=8, temperature=0)
    b = complete(server, prompt=PROMPT, max_tokens=8, temperature=0)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    ids = post(server, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    c = complete(server, prompt=ids, max_tokens=8, temperature=0)
    assert c["choices"][0]["text"] == a["choices"][0]["text"]
    d = complete(server, prompt=[ids], max_tokens=8, temperature=0)
    assert d["choices"][0]["text"] == a["choices"][0]["text"]


def test_multi_prompt_prompt_major(server):
    prompts = ["Once upon a time", "def fib(n):"]
    single = [complete(server, prompt=p, max_tokens=6, temperature=0)["choices"][0]["text"]
              for p in prompts]
    j = complete(server, prompt=prompts, n=2, max_tokens=6, temperature=0)
    assert [c["index"] for c in j["choices"]] == [0, 1, 2, 3]
    texts = [c["text"] for c in j["choices"]]
    assert texts == [single[0], single[0], single[1], single[1]]
    assert j["usage"]["prompt_tokens"] == sum(
        post(server, "/tokenize", {"prompt": p}).json()["count"] for p in prompts)


def test_n_and_best_of_equal(server):
    j = complete(server, prompt=PROMPT, n=3, best_of=3, max_tokens=4, temperature=0)
    assert len(j["choices"]) == 3
    assert len({c["text"] for c in j["choices"]}) == 1


def test_echo(server):
    j = complete(server, prompt=PROMPT, echo=True, max_tokens=3, temperature=0)
    assert j["choices"][0]["text"].startswith(PROMPT)
    j0 = complete(server, prompt=PROMPT, echo=True, max_tokens=0)
    assert j0["choices"][0]["text"] == PROMPT
    assert j0["usage"]["completion_tokens"] == 0


def test_logprobs(server):
    j = complete(server, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3,
                 ignore_eos=True)
    lp = j["choices"][0]["logprobs"]
    n = j["usage"]["completion_tokens"]
    assert n == 5
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == n
    assert len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    for tok, l, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert isinstance(tok, str) and l <= 0
        assert 3 <= len(top) <= 4
        # greedy: the chosen token is the most likely one
        assert l == pytest.approx(max(top.values()), abs=1e-4)
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert lp["text_offset"][0] == 0
    j0 = complete(server, prompt=PROMPT, max_tokens=2, logprobs=0)
    assert len(j0["choices"][0]["logprobs"]["tokens"]) == j0["usage"]["completion_tokens"]


def test_stop_string(server):
    base = complete(server, prompt=PROMPT, max_tokens=16, temperature=0,
                    ignore_eos=True)["choices"][0]["text"]
    assert len(base) >= 4, base
    stop = base[2:4]
    if not stop.strip():
        stop = base[2:5]
    cut = base.index(stop)
    j = complete(server, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "@@@@"])
    assert j["choices"][0]["text"] == base[:cut]
    assert j["choices"][0]["finish_reason"] == "stop"
    j = complete(server, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop)
    assert j["choices"][0]["text"] == base[:cut]


def forced_token(server):
    ids = post(server, "/tokenize", {"prompt": " hello", "add_special_tokens": False}).json()["tokens"]
    assert len(ids) >= 1
    return ids[-1]


def test_logit_bias_and_stop_token_ids(server):
    tid = forced_token(server)
    text = post(server, "/detokenize", {"tokens": [tid] * 4}).json()["prompt"]
    j = complete(server, prompt=PROMPT, max_tokens=4, temperature=0,
                 logit_bias={str(tid): 100}, ignore_eos=True)
    assert j["choices"][0]["text"] == text
    j = complete(server, prompt=PROMPT, max_tokens=4, temperature=0,
                 logit_bias={str(tid): 100}, stop_token_ids=[tid])
    assert j["choices"][0]["finish_reason"] == "stop"
    assert j["usage"]["completion_tokens"] <= 1
    assert j["choices"][0]["text"] in ("", post(server, "/detokenize", {"tokens": [tid]}).json()["prompt"])


def test_seed_reproducible(server):
    kw = dict(prompt=PROMPT, max_tokens=8, temperature=1.0, seed=1234)
    a = complete(server, **kw)["choices"][0]["text"]
    b = complete(server, **kw)["choices"][0]["text"]
    assert a == b


def test_sampling_fields_accepted(server):
    j = complete(server, prompt=PROMPT, max_tokens=4, temperature=0.7, top_p=0.9,
                 top_k=20, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.5,
                 repetition_penalty=1.2, user="someone", seed=1)
    assert j["usage"]["completion_tokens"] <= 4


def test_ignore_eos_runs_to_length(server):
    j = complete(server, prompt="<|im_end|>", max_tokens=12, temperature=0, ignore_eos=True)
    assert j["usage"]["completion_tokens"] == 12
    assert j["choices"][0]["finish_reason"] == "length"


def test_stream_raw(server):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    r = requests.post(server.url("/v1/completions"), json=body, stream=True, timeout=120)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    usage = ev[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    chunks = ev[:-2]
    assert len({c["id"] for c in chunks + [usage]}) == 1
    assert all(c["object"] == "text_completion" and c["model"] == MODEL_NAME for c in chunks)
    assert all(c["usage"] is None for c in chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    ref = complete(server, prompt=PROMPT, max_tokens=8, temperature=0)
    assert text == ref["choices"][0]["text"]
    assert usage["usage"] == ref["usage"]


def test_stream_without_usage_and_multi(server):
    body = {"model": MODEL_NAME, "prompt": ["a", "b"], "n": 2, "max_tokens": 3,
            "temperature": 0, "stream": True, "logprobs": 1}
    r = requests.post(server.url("/v1/completions"), json=body, stream=True, timeout=120)
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert all("usage" not in c for c in chunks)
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1, 2, 3}
    finals = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert len(finals) == 4
    for c in chunks:
        lp = c["choices"][0]["logprobs"]
        assert lp is not None and len(lp["tokens"]) == len(lp["token_logprobs"])


def test_stream_echo(server):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, "stream": True,
            "echo": True, "temperature": 0}
    ev = sse_events(requests.post(server.url("/v1/completions"), json=body, stream=True))
    text = "".join(c["choices"][0]["text"] for c in ev[:-1])
    assert text.startswith(PROMPT)


def test_openai_client(server):
    c = client(server)
    r = c.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    s = c.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                             stream=True, stream_options={"include_usage": True})
    parts, usage = [], None
    for ch in s:
        if ch.choices:
            parts.append(ch.choices[0].text)
        if ch.usage:
            usage = ch.usage
    assert "".join(parts) == r.choices[0].text
    assert usage.completion_tokens == r.usage.completion_tokens
    raw = c.completions.with_raw_response.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2)
    assert raw.http_response.status_code == 200
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.parse().choices[0].index == 0
    r2 = c.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, logprobs=2,
                              extra_body={"top_k": 5, "ignore_eos": True})
    assert len(r2.choices[0].logprobs.tokens) == 2
    models = c.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_openai_client_errors(server):
    c = client(server)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    assert e.value.status_code == 404
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=5)
    assert e.value.body["param"] == "temperature"


def test_metrics_text(server):
    complete(server, prompt=PROMPT, max_tokens=2)
    t = requests.get(server.url("/metrics")).text
    for name in ["dsq:num_requests_running", "dsq:num_requests_waiting",
                 "dsq:kv_cache_blocks_used", "dsq:kv_cache_blocks_total",
                 "dsq:prompt_tokens_total", "dsq:generation_tokens_total",
                 "dsq:num_preemptions_total",
                 "dsq:num_requests_held", "dsq:stream_stall_aborts_total",
                 "dsq:queue_timeouts_total", "dsq:kv_cache_block_bytes",
                 "dsq:time_to_first_token_seconds_bucket",
                 "dsq:inter_token_latency_seconds_bucket",
                 "dsq:e2e_request_latency_seconds_count",
                 "dsq:request_queue_time_seconds_count"]:
        assert re.search("^" + re.escape(name) + r"[{ ]", t, re.M), name
    # every sample line is "name{labels} value"
    for line in t.splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? \S+', line), line
    # SmolLM2: 30 layers x K and V x 3 KV heads x 64 x fp16 x 16 tokens
    m = re.search(r'^dsq:kv_cache_block_bytes\{[^}]*\} (\d+)', t, re.M)
    assert m and int(m.group(1)) == 30 * 2 * 3 * 64 * 2 * 16, m and m.group(0)
    m = re.search(r'^dsq:e2e_request_latency_seconds_count\{[^}]*\} (\d+)', t, re.M)
    assert int(m.group(1)) >= 1


def test_tokenize_detokenize(server):
    t = post(server, "/tokenize", {"model": MODEL_NAME, "prompt": "Hello world"}).json()
    assert t["count"] == len(t["tokens"]) > 0
    assert t["max_model_len"] > 0
    d = post(server, "/detokenize", {"tokens": t["tokens"]}).json()
    assert d["prompt"].endswith("Hello world")


def test_tiny_sampling_values_stay_sane(server):
    # float overflow in the sampler: 1/temperature = inf, logit/penalty = inf,
    # top_p rounding to 0.0f; each used to give NaN probabilities (the
    # vocabulary's last token every step) or a 400 without a param
    greedy = complete(server, prompt=PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    for t in (1e-39, 1e-45, 5e-324):
        got = complete(server, prompt=PROMPT, max_tokens=6, temperature=t)["choices"][0]["text"]
        assert got == greedy, (t, got)
    got = complete(server, prompt=PROMPT, max_tokens=6, temperature=1, seed=1,
                   top_p=1e-46)["choices"][0]["text"]
    assert got == greedy
    pen = [complete(server, prompt=PROMPT, max_tokens=6, temperature=0,
                    repetition_penalty=rp)["choices"][0]["text"] for rp in (1e-30, 1e-40)]
    assert pen[0] == pen[1], pen

"""POST /v1/chat/completions end to end: the official openai
client streaming and not on SmolLM2-135M-Instruct, whose GGUF carries its
chat template; the rendered prompt (POST /tokenize with messages, then
/detokenize) against the transformers golden in
tests/golden/chat_templates/; OpenAI-style 400s; a model without a
template; --chat-template with the R1-Distill template and
--reasoning-parser deepseek_r1. The reasoning parser itself is tested in C
(tests/unit/test_reasoning.c): SmolLM2 never writes think tags."""
import json
import os

import openai
import pytest

from conftest import MODEL_NAME, post, sse_events

QUESTION = "What is the capital of France? Answer in one word."


def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="none",
                         max_retries=0)


def data_file(*parts):
    d = os.environ.get("DSQ_TEST_DATA")
    if not d:
        pytest.fail("DSQ_TEST_DATA is not set (run through meson test)")
    p = os.path.join(d, *parts)
    if not os.path.exists(p):
        pytest.fail(f"missing test data file {p}")
    return p


def golden_cases():
    root = os.environ.get("DSQ_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
    path = os.path.join(root, "tests", "golden", "chat_templates",
                        "smollm2-135m-instruct.json")
    with open(path, encoding="utf-8") as f:
        text = "".join(l for l in f if not l.startswith("#"))
    return json.loads(text)["cases"]


def test_chat_nonstream_answers(server):
    r = client(server).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}],
        temperature=0, max_tokens=20)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert "Paris" in c.message.content, c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_nonstream(server):
    cl = client(server)
    msgs = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": QUESTION}]
    full = cl.chat.completions.create(model=MODEL_NAME, messages=msgs,
                                      temperature=0, max_tokens=12)
    chunks = list(cl.chat.completions.create(
        model=MODEL_NAME, messages=msgs, temperature=0, max_tokens=12,
        stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finals[-1] == full.choices[0].finish_reason
    assert all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        full.usage.completion_tokens


def test_chat_stream_raw_sse(server):
    r = post(server, "/v1/chat/completions",
             {"model": MODEL_NAME, "messages": [{"role": "user", "content": QUESTION}],
              "max_tokens": 4, "temperature": 0, "stream": True,
              "logprobs": True, "top_logprobs": 2}, stream=True)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [e for e in ev[1:-2] if e["choices"][0]["delta"].get("content")]
    assert content
    for e in content:
        for t in e["choices"][0]["logprobs"]["content"]:
            assert bytes(t["bytes"]).decode("utf-8", "replace") == t["token"]
            assert t["logprob"] <= 0 and len(t["top_logprobs"]) == 2
    assert ev[-2]["choices"][0]["delta"] == {}
    assert ev[-2]["choices"][0]["finish_reason"] == "length"


def test_chat_multi_turn(server):
    cl = client(server)
    msgs = [{"role": "user", "content": QUESTION}]
    first = cl.chat.completions.create(model=MODEL_NAME, messages=msgs,
                                       temperature=0, max_tokens=20)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": [
                 {"type": "text", "text": "And the capital of Germany?"},
                 {"type": "text", "text": "Answer in one word."}]}]
    second = cl.chat.completions.create(model=MODEL_NAME, messages=msgs,
                                        temperature=0, max_tokens=20)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + \
        first.usage.completion_tokens
    assert "Berlin" in second.choices[0].message.content, second.choices[0].message.content


def test_chat_logprobs_n_and_max_completion_tokens(server):
    r = client(server).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}],
        temperature=0, max_completion_tokens=3, max_tokens=50, n=2,
        logprobs=True, top_logprobs=3, seed=7, stop=["\n\n"],
        logit_bias={"0": -100})
    assert len(r.choices) == 2 and r.usage.completion_tokens == 6
    assert r.choices[0].message.content == r.choices[1].message.content
    lp = r.choices[0].logprobs.content
    assert len(lp) == 3
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 for t in lp)
    assert lp[0].top_logprobs[0].logprob >= lp[0].top_logprobs[1].logprob


def test_rendered_prompt_equals_golden(server):
    n = 0
    for case in golden_cases():
        # transformers' errors (content parts with a string template) and
        # template variables beyond the API's are not the server's cases
        if "error" in case or case["extra"] or not case["messages"]:
            continue
        body = {"model": MODEL_NAME, "messages": case["messages"],
                "add_generation_prompt": case["add_generation_prompt"]}
        if case["tools"]:
            body["tools"] = case["tools"]
        r = post(server, "/tokenize", body)
        assert r.status_code == 200, (case["name"], r.text)
        toks = r.json()["tokens"]
        d = post(server, "/detokenize", {"model": MODEL_NAME, "tokens": toks})
        assert d.status_code == 200, d.text
        assert d.json()["prompt"] == case["expected"], case["name"]
        n += 1
    assert n >= 12


@pytest.mark.parametrize("body,param,needle", [
    ({}, "messages", "required"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages", "role"),
    ({"messages": [{"role": "user", "content": 42}]}, "messages", "string"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages", "text"),
    ({"messages": [{"role": "user"}]}, "messages", "content"),
    ({"messages": "hi"}, "messages", "array"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs", "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
     "max_completion_tokens", "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 5}, "temperature", "temperature"),
])
def test_chat_errors(server, body, param, needle):
    body = dict(body, model=MODEL_NAME)
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == param
    assert needle in e["message"], e["message"]


def test_chat_error_through_openai_client(server):
    with pytest.raises(openai.BadRequestError) as ei:
        client(server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "wizard", "content": "hi"}])
    assert ei.value.status_code == 400


def test_no_template_gives_400(daemon_factory):
    d = daemon_factory("--model", data_file("models", "stories260K", "stories260K.bin"),
                       "--tokenizer", data_file("models", "stories260K", "tok512.bin"))
    r = post(d, "/v1/chat/completions", {"model": "stories260K.bin",
                                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error"
    assert "no chat template" in e["message"] and "--chat-template" in e["message"]
    r = post(d, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    # completions still work on that daemon
    r = post(d, "/v1/completions", {"model": "stories260K.bin", "prompt": "Once",
                                    "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_broken_template_refuses_start(daemon_factory, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if messages %}never closed")
    d = daemon_factory("--chat-template", str(bad), wait=False)
    rc = d.proc.wait(timeout=120)
    assert rc != 0
    assert "does not compile" in d.log_tail() and "never closed" in d.log_tail()


def test_r1_template_reasoning_parser(daemon_factory):
    tpl = data_file("tokenizers", "chat_templates",
                    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    d = daemon_factory("--chat-template", tpl, "--reasoning-parser", "deepseek_r1")
    msgs = [{"role": "user", "content": QUESTION}]
    # the override is what renders: R1's markers, <think> opened in the prompt
    t = post(d, "/tokenize", {"messages": msgs})
    assert t.status_code == 200
    text = post(d, "/detokenize", {"tokens": t.json()["tokens"]}).json()["prompt"]
    assert text == ("<|im_start|><\uff5cUser\uff5c>" + QUESTION +
                    "<\uff5cAssistant\uff5c><think>\n")
    # the prompt opened <think>: with no </think> in the output, all of it
    # is reasoning, streamed or not
    body = {"model": MODEL_NAME, "messages": msgs, "temperature": 0, "max_tokens": 10}
    r = post(d, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    m = r.json()["choices"][0]["message"]
    out = m.get("reasoning_content", "") + m["content"]
    if "</think>" not in out:
        assert m["content"] == "" and m["reasoning_content"]
    s = post(d, "/v1/chat/completions", dict(body, stream=True), stream=True)
    ev = [e for e in sse_events(s) if e != "[DONE]"]
    deltas = [e["choices"][0]["delta"] for e in ev if e["choices"]]
    assert "".join(x.get("reasoning_content", "") for x in deltas) == \
        m.get("reasoning_content", "")
    assert "".join(x.get("content", "") for x in deltas) == m["content"]


@pytest.mark.parametrize("extra,budget", [
    ({}, 6),                                          # --reasoning-budget
    ({"thinking_budget": 3}, 3),
    ({"chat_template_kwargs": {"enable_thinking": False}}, 0),
])
def test_reasoning_budget_bounds_thinking(daemon_factory, extra, budget):
    """The budget counts the tokens between the think markers: the R1
    template opens <think> in the prompt and SmolLM2 never closes it, so
    the engine writes </think> (several ids in SmolLM2's vocabulary) right
    after `budget` tokens; the reasoning is those tokens, the usage counts
    them with the marker."""
    tpl = data_file("tokenizers", "chat_templates",
                    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    d = daemon_factory("--chat-template", tpl, "--reasoning-parser", "deepseek_r1",
                       "--reasoning-budget", "6")
    n_end = post(d, "/tokenize", {"prompt": "</think>", "add_special_tokens": False}).json()
    n_end = n_end["count"]
    r = post(d, "/v1/chat/completions", {"model": MODEL_NAME, "temperature": 0,
                                         "max_tokens": 24, "logprobs": True,
                                         "messages": [{"role": "user", "content": QUESTION}],
                                         **extra})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    toks = [t["token"] for t in ch["logprobs"]["content"]]
    assert "".join(toks[budget:budget + n_end]) == "</think>", toks
    assert "</think>" not in "".join(toks[:budget])
    assert (ch["message"].get("reasoning_content") or "") == "".join(toks[:budget])
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == budget + n_end
    # a budget the model never reaches changes nothing
    free = post(d, "/v1/chat/completions", {"model": MODEL_NAME, "temperature": 0,
                                            "max_tokens": 8, "thinking_budget": 100,
                                            "messages": [{"role": "user", "content": QUESTION}]})
    assert "</think>" not in (free.json()["choices"][0]["message"].get("reasoning_content")
                              or "")

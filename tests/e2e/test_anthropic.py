"""POST /v1/messages and /v1/messages/count_tokens end to end with
Anthropic's official Python SDK on SmolLM2-135M-Instruct: the greedy
answer equals /v1/chat/completions' for the same turns (one engine path),
streamed equals not streamed, stop_sequences and max_tokens give their
stop_reason, tool_use blocks whose input validates against input_schema
and a tool_result round trip, count_tokens equals the usage of a create,
errors in Anthropic's error shape through the SDK's exception classes,
the x-api-key header, and thinking blocks from the R1 template with
--reasoning-parser deepseek_r1. The event flow is also read raw, against
the order Anthropic's streaming reference gives."""
import json
import os

import anthropic
import jsonschema
import openai
import pytest
import requests

from conftest import MODEL_NAME, post

QUESTION = "What is the capital of France? Answer in one word."
MSGS = [{"role": "user", "content": QUESTION}]
# The SDK (2.x) no longer takes temperature / top_p / top_k; dsqd still
# reads them from the body, where extra_body puts them
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 24},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}


def client(d, key="none"):
    return anthropic.Anthropic(base_url=d.url(""), api_key=key, max_retries=0)


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def test_create_equals_chat_completions(server):
    m = client(server).messages.create(model=MODEL_NAME, max_tokens=20, extra_body=GREEDY,
                                       system="You are terse.", messages=MSGS)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == MODEL_NAME
    assert "Paris" in text_of(m), m
    assert m.stop_reason in ("end_turn", "max_tokens")
    c = openai.OpenAI(base_url=server.url("/v1"), api_key="none", max_retries=0)
    r = c.chat.completions.create(model=MODEL_NAME, max_tokens=20, temperature=0,
                                  messages=[{"role": "system", "content": "You are terse."}]
                                  + MSGS)
    assert text_of(m) == r.choices[0].message.content
    assert m.usage.output_tokens == r.usage.completion_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == r.usage.prompt_tokens


def test_stream_equals_create(server):
    cl = client(server)
    kw = dict(model=MODEL_NAME, max_tokens=24, extra_body=GREEDY,
              messages=[{"role": "user", "content": "Name three colours."}])
    m = cl.messages.create(**kw)
    with cl.messages.stream(**kw) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == text_of(m) == text_of(final)
    assert final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens


def test_async_client(server):
    """AsyncAnthropic, two requests at once, streamed and not: each
    equals the sync answer (greedy decoding does not depend on the batch)."""
    import asyncio
    kw = dict(model=MODEL_NAME, max_tokens=16, extra_body=GREEDY, messages=MSGS)
    want = text_of(client(server).messages.create(**kw))

    async def both():
        ac = anthropic.AsyncAnthropic(base_url=server.url(""), api_key="none", max_retries=0)

        async def streamed():
            async with ac.messages.stream(**kw) as s:
                return text_of(await s.get_final_message())
        a, b = await asyncio.gather(ac.messages.create(**kw), streamed())
        await ac.close()
        return text_of(a), b
    assert asyncio.run(both()) == (want, want)


def test_stream_event_order(server):
    r = post(server, "/v1/messages", {"model": MODEL_NAME, "max_tokens": 12, "stream": True,
                                      "messages": MSGS}, stream=True)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    names, datas = [], []
    for block in r.text.split("\n\n"):
        if not block:
            continue
        ev, data = block.split("\n")
        assert ev.startswith("event: ") and data.startswith("data: "), block
        names.append(ev[7:])
        datas.append(json.loads(data[6:]))
        assert datas[-1]["type"] == names[-1]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    body = names[2:-2]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body[1:-1]) == {"content_block_delta"}
    assert datas[0]["message"]["usage"]["input_tokens"] > 10
    assert datas[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert datas[-2]["usage"]["output_tokens"] > 0


def test_stop_sequence_and_max_tokens(server):
    cl = client(server)
    kw = dict(model=MODEL_NAME, extra_body=GREEDY,
              messages=[{"role": "user", "content": "Write one sentence about the sea."}])
    full = text_of(cl.messages.create(max_tokens=30, **kw))
    words = full.split()
    assert len(words) >= 4, full
    stop = " " + words[2]
    m = cl.messages.create(max_tokens=30, stop_sequences=[stop], **kw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, m
    assert text_of(m) == full[:full.index(stop)]
    m = cl.messages.create(max_tokens=3, **kw)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_tool_use_and_result(server):
    cl = client(server)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = cl.messages.create(model=MODEL_NAME, max_tokens=200, extra_body=GREEDY, tools=[WEATHER],
                           tool_choice={"type": "any", "disable_parallel_tool_use": True},
                           messages=ask)
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    # streamed: the same call assembled from input_json_delta
    with cl.messages.stream(model=MODEL_NAME, max_tokens=200, extra_body=GREEDY, tools=[WEATHER],
                            tool_choice={"type": "tool", "name": "get_weather",
                                         "disable_parallel_tool_use": True},
                            messages=ask) as s:
        final = s.get_final_message()
    su = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(su) == 1
    assert su[0].input == uses[0].input
    # the result goes back in as a tool_result block
    m2 = cl.messages.create(
        model=MODEL_NAME, max_tokens=30, extra_body=GREEDY, tools=[WEATHER],
        messages=ask + [{"role": "assistant", "content": m.content},
                        {"role": "user", "content": [{"type": "tool_result",
                                                      "tool_use_id": uses[0].id,
                                                      "content": "18 C, sunny"}]}])
    assert m2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens > \
        m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_count_tokens(server):
    cl = client(server)
    n = cl.messages.count_tokens(model=MODEL_NAME, system="You are terse.", messages=MSGS)
    m = cl.messages.create(model=MODEL_NAME, max_tokens=2, system="You are terse.",
                           messages=MSGS)
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
    # the same count as /tokenize of the chat turns it means
    t = post(server, "/tokenize", {"messages": [{"role": "system", "content": "You are terse."}]
                                   + MSGS})
    assert t.json()["count"] == n.input_tokens


@pytest.mark.parametrize("body,status,etype,needle", [
    ({"model": MODEL_NAME, "messages": MSGS}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": MSGS}, 404,
     "not_found_error", "does not exist"),
    ({"model": MODEL_NAME, "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
     400, "invalid_request_error", "image"),
    ({"model": MODEL_NAME, "max_tokens": 0, "messages": MSGS}, 400, "invalid_request_error",
     "max_tokens"),
    ({"model": MODEL_NAME, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
     400, "invalid_request_error", "'system'"),
    ({"model": MODEL_NAME, "max_tokens": 100000, "messages": MSGS}, 400,
     "invalid_request_error", "context"),
])
def test_errors_in_anthropic_shape(server, body, status, etype, needle):
    r = post(server, "/v1/messages", body)
    assert r.status_code == status, r.text
    e = r.json()
    assert e["type"] == "error" and e["error"]["type"] == etype, e
    assert needle in e["error"]["message"], e


def test_errors_through_the_sdk(server):
    cl = client(server)
    with pytest.raises(anthropic.NotFoundError):
        cl.messages.create(model="claude-x", max_tokens=5, messages=MSGS)
    with pytest.raises(anthropic.BadRequestError) as ei:
        cl.messages.create(model=MODEL_NAME, max_tokens=5, messages=MSGS,
                           stop_sequences=["a", "b", "c", "d", "e"])
    assert "stop_sequences" in str(ei.value)
    # bad JSON and a wrong method keep the Anthropic shape on these routes
    r = post(server, "/v1/messages", raw=b"{")
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = requests.get(server.url("/v1/messages"), timeout=10)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    # other routes keep OpenAI's shape
    r = post(server, "/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS,
                                              "max_tokens": 0})
    assert r.status_code == 400 and "param" in r.json()["error"]


def test_x_api_key(daemon_factory):
    d = daemon_factory("--api-key", "sekrit")
    m = client(d, "sekrit").messages.create(model=MODEL_NAME, max_tokens=3, messages=MSGS)
    assert m.usage.output_tokens > 0
    with pytest.raises(anthropic.AuthenticationError):
        client(d, "wrong").messages.create(model=MODEL_NAME, max_tokens=3, messages=MSGS)
    r = post(d, "/v1/messages", {"model": MODEL_NAME, "max_tokens": 3, "messages": MSGS})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    # either header works on every route
    assert requests.get(d.url("/v1/models"), headers={"x-api-key": "sekrit"},
                        timeout=10).status_code == 200
    assert requests.get(d.url("/v1/models"), headers={"Authorization": "Bearer sekrit"},
                        timeout=10).status_code == 200
    assert requests.get(d.url("/v1/models"), headers={"x-api-key": "nope"},
                        timeout=10).status_code == 401


def test_thinking_blocks_with_r1_template(daemon_factory):
    d_ = os.environ.get("DSQ_TEST_DATA")
    if not d_:
        pytest.fail("DSQ_TEST_DATA is not set (run through meson test)")
    tpl = os.path.join(d_, "tokenizers", "chat_templates",
                       "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    d = daemon_factory("--chat-template", tpl, "--reasoning-parser", "deepseek_r1")
    cl = client(d)
    kw = dict(model=MODEL_NAME, max_tokens=10, extra_body=GREEDY, messages=MSGS)
    chat = post(d, "/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 10,
                                            "temperature": 0, "messages": MSGS}).json()
    want = chat["choices"][0]["message"]
    m = cl.messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **kw)
    thinking = "".join(b.thinking for b in m.content if b.type == "thinking")
    assert thinking == (want.get("reasoning_content") or "")
    assert text_of(m) == (want["content"] or "")
    with cl.messages.stream(thinking={"type": "enabled", "budget_tokens": 1024}, **kw) as s:
        f = s.get_final_message()
    assert "".join(b.thinking for b in f.content if b.type == "thinking") == thinking
    assert text_of(f) == text_of(m)
    # disabled: the section is closed at once (a budget of 0), as chat's
    # thinking_budget 0, and no thinking block comes back
    off = cl.messages.create(thinking={"type": "disabled"}, **kw)
    assert not [b for b in off.content if b.type == "thinking"]
    chat0 = post(d, "/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 10,
                                             "temperature": 0, "messages": MSGS,
                                             "thinking_budget": 0}).json()
    assert text_of(off) == (chat0["choices"][0]["message"]["content"] or "")
    assert not chat0["choices"][0]["message"].get("reasoning_content")


def test_output_config_json_schema(server):
    """output_config.format (the SDK's structured outputs) goes through the
    grammar engine: the text is JSON valid against the schema."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    m = client(server).messages.create(
        model=MODEL_NAME, max_tokens=80, extra_body=GREEDY,
        messages=[{"role": "user", "content": "Name a big city."}],
        output_config={"format": {"type": "json_schema", "schema": schema}})
    assert m.stop_reason == "end_turn", m
    jsonschema.validate(json.loads(text_of(m)), schema)

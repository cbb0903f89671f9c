"""POST /v1/responses end to end with the official openai SDK's
client.responses on SmolLM2-135M-Instruct: the greedy answer equals
/v1/chat/completions' for the same turns, the streamed response (the
SDK's stream helper, which checks every item's identity and order)
equals the plain one, a function call round trip, text.format
json_schema validated with jsonschema, max_output_tokens giving status
"incomplete", and the stateful fields refused with a 400 in OpenAI's
error shape."""
import json

import jsonschema
import openai
import pytest

from conftest import MODEL_NAME, post

QUESTION = "What is the capital of France? Answer in one word."
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 24},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}


def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="none", max_retries=0)


def test_create_equals_chat_completions(server):
    c = client(server)
    r = c.responses.create(model=MODEL_NAME, input=QUESTION, instructions="You are terse.",
                           max_output_tokens=20, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert "Paris" in r.output_text, r
    ch = c.chat.completions.create(
        model=MODEL_NAME, max_tokens=20, temperature=0,
        messages=[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": QUESTION}])
    assert r.output_text == ch.choices[0].message.content
    assert r.usage.input_tokens == ch.usage.prompt_tokens
    assert r.usage.output_tokens == ch.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "You are terse." and r.max_output_tokens == 20


def test_stream_equals_create(server):
    c = client(server)
    kw = dict(model=MODEL_NAME, input=QUESTION, max_output_tokens=100,
              temperature=0)
    r = c.responses.create(**kw)
    assert r.status == "completed", r
    with c.responses.stream(**kw) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == r.output_text == final.output_text
    assert final.usage.output_tokens == r.usage.output_tokens
    # raw events: numbered from 0 without gaps, no [DONE]
    raw = post(server, "/v1/responses", dict(kw, stream=True), stream=True).text
    seqs = [json.loads(l[6:])["sequence_number"] for l in raw.split("\n")
            if l.startswith("data: ")]
    assert seqs == list(range(len(seqs)))
    assert "[DONE]" not in raw


def test_function_call_round_trip(server):
    c = client(server)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.responses.create(model=MODEL_NAME, input=ask, tools=[WEATHER], tool_choice="required",
                           parallel_tool_calls=False, max_output_tokens=200, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    # the same call, streamed
    with c.responses.stream(model=MODEL_NAME, input=ask, tools=[WEATHER],
                            tool_choice={"type": "function", "name": "get_weather"},
                            max_output_tokens=200, temperature=0) as s:
        final = s.get_final_response()
    sc = [o for o in final.output if o.type == "function_call"]
    assert len(sc) == 1 and json.loads(sc[0].arguments) == json.loads(calls[0].arguments)
    # the result goes back as a function_call_output item
    r2 = c.responses.create(
        model=MODEL_NAME, tools=[WEATHER], max_output_tokens=30, temperature=0,
        input=ask + [o.model_dump(exclude_none=True) for o in r.output] +
        [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C"}])
    assert r2.status in ("completed", "incomplete")
    assert r2.usage.input_tokens > r.usage.input_tokens


def test_json_schema_format(server):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client(server).responses.create(
        model=MODEL_NAME, input="Invent a person.", max_output_tokens=80, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema,
                         "strict": True}})
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_max_output_tokens_is_incomplete(server):
    r = client(server).responses.create(model=MODEL_NAME, input="Tell me a long story.",
                                        max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


@pytest.mark.parametrize("extra,param", [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image",
                                              "image_url": "https://example.com/a.png"}]}]},
     "input"),
])
def test_refusals(server, extra, param):
    body = {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 4, **extra}
    r = post(server, "/v1/responses", body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and e["type"] == "invalid_request_error", e
    with pytest.raises(openai.BadRequestError):
        client(server).responses.create(**body)


def metric(server, name):
    import requests
    total = 0.0
    for line in requests.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_both_translated_apis_count_in_metrics(server):
    """/v1/responses and /v1/messages are requests like the others: each
    adds one time-to-first-token observation and its tokens."""
    import anthropic
    names = ("dsq:time_to_first_token_seconds_count", "dsq:generation_tokens_total")
    before = [metric(server, n) for n in names]
    r = client(server).responses.create(model=MODEL_NAME, input=QUESTION, max_output_tokens=5)
    m = anthropic.Anthropic(base_url=server.url(""), api_key="none", max_retries=0) \
        .messages.create(model=MODEL_NAME, max_tokens=5,
                         messages=[{"role": "user", "content": QUESTION}])
    after = [metric(server, n) for n in names]
    assert after[0] - before[0] == 2
    assert after[1] - before[1] == r.usage.output_tokens + m.usage.output_tokens


def test_reasoning_item_with_r1_template(daemon_factory):
    """With the R1 template and --reasoning-parser, the reasoning is a
    reasoning item (reasoning_text), equal to chat's reasoning_content,
    streamed and not; --reasoning-budget bounds it here too."""
    import os
    tpl = os.path.join(os.environ["DSQ_TEST_DATA"], "tokenizers", "chat_templates",
                       "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    d = daemon_factory("--chat-template", tpl, "--reasoning-parser", "deepseek_r1",
                       "--reasoning-budget", "4")
    c = client(d)
    r = c.responses.create(model=MODEL_NAME, input=QUESTION, max_output_tokens=40,
                           temperature=0)
    ch = c.chat.completions.create(model=MODEL_NAME, max_tokens=40, temperature=0,
                                   messages=[{"role": "user", "content": QUESTION}])
    want = ch.choices[0].message.model_extra.get("reasoning_content") or ""
    items = [o for o in r.output if o.type == "reasoning"]
    assert len(items) == 1 and want, r.output
    assert items[0].content[0].type == "reasoning_text"
    assert items[0].content[0].text == want
    assert r.output_text == (ch.choices[0].message.content or "")
    assert r.usage.output_tokens_details.reasoning_tokens == \
        ch.usage.completion_tokens_details.reasoning_tokens > 0
    with c.responses.stream(model=MODEL_NAME, input=QUESTION, max_output_tokens=40,
                            temperature=0) as s:
        events = list(s)      # get_final_response() wants completed, not incomplete
    types = [e.type for e in events]
    assert types[-1] == "response." + r.status
    final = events[-1].response
    assert "response.reasoning_text.delta" in types
    assert [o.type for o in final.output] == [o.type for o in r.output]
    assert final.output[0].content[0].text == want

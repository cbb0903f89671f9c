"""Tool calls through the chat API on the real SmolLM2 with the
openai SDK: tool_choice "required" and a named function constrain
decoding to calls in the model's syntax (Hermes' <tool_call> JSON here:
SmolLM2's template shows no call syntax, so --tool-call-parser auto picks
it), parsed into message.tool_calls with finish_reason "tool_calls";
arguments validate against each function's parameters with Python's
jsonschema; streamed delta.tool_calls assemble to the non-streamed answer;
parallel_tool_calls false gives one call; a tool result goes back in as a
role "tool" message.
"""
import json

import jsonschema
import openai
import pytest

from conftest import MODEL_NAME, post

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ALARM = {"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm",
    "parameters": {"type": "object", "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "minute": {"type": "integer", "minimum": 0, "maximum": 59}},
        "required": ["hour", "minute"]}}}
TOOLS = [WEATHER, ALARM]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Paris? Also wake me at 7."}]


def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)


def check_calls(calls, only=None):
    assert calls, calls
    for tc in calls:
        assert tc.type == "function" and tc.id.startswith("call_"), tc
        name = tc.function.name
        assert name in SCHEMAS and (only is None or name == only), name
        jsonschema.validate(json.loads(tc.function.arguments), SCHEMAS[name])


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_required_gives_valid_calls(server, seed):
    # one call each (a 135M model repeats calls; parallel ones below)
    kw = dict(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="required",
              max_tokens=200, parallel_tool_calls=False)
    kw.update(temperature=0) if seed is None else kw.update(temperature=1.0, seed=seed)
    ch = client(server).chat.completions.create(**kw).choices[0]
    assert ch.finish_reason == "tool_calls", ch
    check_calls(ch.message.tool_calls)


def test_parallel_calls_are_bounded(server):
    """With parallel_tool_calls (the default) the grammar allows 1 to 8
    calls, so even a model that repeats itself ends with tool_calls."""
    ch = client(server).chat.completions.create(
        model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="required",
        max_tokens=600, temperature=0).choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert 1 <= len(ch.message.tool_calls) <= 8
    check_calls(ch.message.tool_calls)


def test_named_function_and_single_call(server):
    ch = client(server).chat.completions.create(
        model=MODEL_NAME, messages=MSGS, tools=TOOLS, max_tokens=200, temperature=1.0,
        seed=4, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "set_alarm"}}).choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert len(ch.message.tool_calls) == 1
    check_calls(ch.message.tool_calls, only="set_alarm")


def test_named_function_is_one_call(server):
    """A forced call ends after it, parallel_tool_calls left at its default
    (true): before, the grammar allowed up to 8 calls of the named function,
    and SmolLM2 started a second one that ran into max_tokens."""
    ch = client(server).chat.completions.create(
        model=MODEL_NAME, max_tokens=100, temperature=0, tools=[WEATHER],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert len(ch.message.tool_calls) == 1
    check_calls(ch.message.tool_calls, only="get_weather")


def test_cut_by_max_tokens_keeps_complete_calls(server):
    """With parallel calls SmolLM2 repeats itself; cut a few tokens before
    the end of its answer, the calls it finished still come back parsed
    (finish_reason stays "length"), streamed and not."""
    cl = client(server)
    kw = dict(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="required",
              temperature=0)
    full = cl.chat.completions.create(max_tokens=600, **kw)
    calls = full.choices[0].message.tool_calls
    assert len(calls) >= 2, full
    cut = cl.chat.completions.create(max_tokens=full.usage.completion_tokens - 3, **kw)
    ch = cut.choices[0]
    assert ch.finish_reason == "length", ch
    got = [(c.function.name, c.function.arguments) for c in ch.message.tool_calls]
    assert got == [(c.function.name, c.function.arguments) for c in calls[:-1]]
    assert not ch.message.content
    streamed = {}
    for ev in cl.chat.completions.create(max_tokens=full.usage.completion_tokens - 3,
                                         stream=True, **kw):
        for tc in (ev.choices[0].delta.tool_calls or []) if ev.choices else []:
            streamed[tc.index] = (tc.function.name, tc.function.arguments)
    assert [streamed[k] for k in sorted(streamed)] == got


def test_streamed_deltas_assemble_to_the_answer(server):
    kw = dict(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="required",
              max_tokens=600, temperature=0)
    whole = client(server).chat.completions.create(**kw).choices[0]
    calls, content, finish = {}, "", None
    for chunk in client(server).chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                t = calls.setdefault(d.index, {"name": "", "arguments": ""})
                t["name"] += (d.function.name or "") if d.function else ""
                t["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert content == (whole.message.content or "")
    assert [calls[i] for i in sorted(calls)] == [
        {"name": t.function.name, "arguments": t.function.arguments}
        for t in whole.message.tool_calls]


def test_tool_result_round_trip_and_auto(server):
    first = client(server).chat.completions.create(
        model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="required",
        max_tokens=200, temperature=0, parallel_tool_calls=False).choices[0].message
    tc = first.tool_calls[0]
    # content "" rather than None: SmolLM2's template adds content to a
    # string (DeepSeek's needs None there to see a tool-call turn)
    msgs = MSGS + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": tc.id, "type": "function",
             "function": {"name": tc.function.name, "arguments": tc.function.arguments}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": "{\"result\": \"ok\"}"}]
    # auto: the model may answer in text; whatever it writes comes back
    ch = client(server).chat.completions.create(model=MODEL_NAME, messages=msgs, tools=TOOLS,
                                                max_tokens=24, temperature=0).choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls"), ch
    if ch.finish_reason == "tool_calls":
        check_calls(ch.message.tool_calls)
    else:
        assert isinstance(ch.message.content, str)


DEEP = {"type": "object"}
for _ in range(200):
    DEEP = {"type": "object", "properties": {"a": DEEP}}


@pytest.mark.parametrize("extra,param,words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not in 'tools'"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "patternProperties": {}}}}]}, "tools",
     "'patternProperties' is not supported (at /tools/0/function/parameters)"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "give one"),
    # the tools are checked before the template sees them: a schema nested
    # past the converter's depth names 'tools', not 'messages'
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": DEEP}}]}, "tools", "nested deeper"),
    # more alternatives open at the start than the matcher follows: refused
    # up front, not a 200 that aborts
    ({"tool_choice": "none", "guided_json": {"enum": [f"v{i}" for i in range(1100)]}},
     "guided_json", "more than 1024 alternatives"),
    ({"tools": [{"type": "function", "function": {"name": "a</tool_call>"}}]}, "tools",
     "'tools[0].function.name'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "array"}}}]}, "tools", "\"type\": \"object\""),
    # no "type" but a keyword that may admit non-objects: the grammar forced
    # such arguments and the parser refused them (no tool_calls in a 200)
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}]},
     "tools", "has 'anyOf' and no \"type\""),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"enum": [1, 2]}}}]},
     "tools", "has 'enum' and no \"type\""),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"$ref": "#/$defs/s", "$defs": {"s": {"type": "string"}}}}}]},
     "tools", "has '$ref' and no \"type\""),
    ({"tools": [WEATHER, WEATHER]}, "tools", "function names must be unique"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]}, "tools",
     "'tools[0].function.description' must be a string"),
    ({"functions": []}, "functions", "legacy 'functions'"),
    # the turns of a call in OpenAI's shape
    ({"messages": MSGS + [{"role": "tool", "content": "sunny", "tool_call_id": 3}]},
     "messages", "'messages[1].tool_call_id' must be a string"),
    ({"messages": MSGS + [{"role": "assistant", "content": None, "tool_calls": {"a": 1}}]},
     "messages", "'messages[1].tool_calls' must be an array"),
    ({"messages": MSGS + [{"role": "assistant", "content": None, "tool_calls": [None]}]},
     "messages", "'messages[1].tool_calls[0]' must be"),
    ({"messages": MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function"}]}]}, "messages", "'messages[1].tool_calls[0]'"),
])
def test_bad_tool_requests_are_400(server, extra, param, words):
    body = dict({"model": MODEL_NAME, "messages": MSGS, "tools": TOOLS, "max_tokens": 8},
                **extra)
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and words in e["message"], e


def test_untyped_object_parameters_still_constrain(server):
    """parameters without "type" but with only object keywords are an
    object, as before; a description may be null."""
    tool = {"type": "function", "function": {"name": "note", "description": None, "parameters": {
        "properties": {"text": {"type": "string", "maxLength": 12}}, "required": ["text"],
        "additionalProperties": False}}}
    r = post(server, "/v1/chat/completions", {
        "model": MODEL_NAME, "messages": MSGS, "tools": [tool], "tool_choice": "required",
        "parallel_tool_calls": False, "max_tokens": 80, "temperature": 0})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    (tc,) = ch["message"]["tool_calls"]
    args = json.loads(tc["function"]["arguments"])
    jsonschema.validate(args, {"type": "object", **tool["function"]["parameters"]})


def test_r1_template_constrained_answers_are_not_reasoning(daemon_factory):
    """The R1 templates open <think> in the prompt; under a grammar (forced
    calls, a schema) the grammar writes the answer from the first token, so
    it is the answer, not reasoning: tool_calls / tool_use / function_call
    and JSON content, on all three APIs (it came back as reasoning, or was
    lost with thinking disabled)."""
    import os
    tpl = os.path.join(os.environ["DSQ_TEST_DATA"], "tokenizers", "chat_templates",
                       "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    d = daemon_factory("--chat-template", tpl, "--reasoning-parser", "deepseek_r1")
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    ch = client(d).chat.completions.create(model=MODEL_NAME, messages=ask, tools=[WEATHER],
                                           tool_choice="required", max_tokens=200,
                                           temperature=0, parallel_tool_calls=False).choices[0]
    assert ch.finish_reason == "tool_calls", ch
    check_calls(ch.message.tool_calls)
    assert not getattr(ch.message, "reasoning_content", None)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    ch = client(d).chat.completions.create(
        model=MODEL_NAME, messages=ask, max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        extra_body={"thinking_budget": 0}).choices[0]
    jsonschema.validate(json.loads(ch.message.content), schema)
    fn = WEATHER["function"]
    for thinking in ({"type": "disabled"}, {"type": "enabled", "budget_tokens": 2000}):
        m = post(d, "/v1/messages", {"model": MODEL_NAME, "max_tokens": 200, "temperature": 0,
                                     "messages": ask, "thinking": thinking,
                                     "tools": [{"name": fn["name"],
                                                "input_schema": fn["parameters"]}],
                                     "tool_choice": {"type": "tool", "name": fn["name"]}})
        assert m.status_code == 200, m.text
        m = m.json()
        assert m["stop_reason"] == "tool_use", m
        uses = [b for b in m["content"] if b["type"] == "tool_use"]
        assert len(uses) == 1
        jsonschema.validate(uses[0]["input"], fn["parameters"])
    r = post(d, "/v1/responses", {"model": MODEL_NAME, "input": ask, "max_output_tokens": 200,
                                  "temperature": 0, "tool_choice": "required",
                                  "parallel_tool_calls": False,
                                  "tools": [{"type": "function", **fn}]}).json()
    calls = [o for o in r["output"] if o["type"] == "function_call"]
    assert len(calls) == 1 and r["status"] == "completed", r
    jsonschema.validate(json.loads(calls[0]["arguments"]), fn["parameters"])

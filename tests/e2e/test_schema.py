"""JSON Schema and regex constraints through the API on
the real SmolLM2: OpenAI's response_format json_schema (through the SDK,
including its pydantic `parse` helper), vLLM's guided_json and
guided_regex, llama.cpp's json_schema.

Every output is checked by references that share nothing with dsq:
Python's `jsonschema` (Draft 2020-12 with its FormatChecker) for schemas,
`re.fullmatch` (re.ASCII, as dsq's classes are) for regexes. The corpus:
the schemas and regexes of tests/golden/schema_cases.jsonl (whose
membership the unit test checks), the official JSON-Schema-Test-Suite
(draft 2020-12, tests/ref/fetch_schema_suite.py) and
tests/golden/function_schemas.json (49 tool definitions written for this
test in the shape DeepSeek's function calling takes: name, description,
parameters), greedy and sampled.
"""
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pydantic
import pytest

from conftest import MODEL_NAME, post, sse_events

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "golden", "schema_cases.jsonl")


def cases(kind):
    out = []
    with open(GOLDEN, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                c = json.loads(line)
                if kind in c:
                    out.append(c[kind])
    return out


def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)


def validate(schema, text):
    """None when text is a valid instance, else the reason."""
    try:
        inst = json.loads(text)
    except ValueError as e:
        return f"not JSON: {e}"
    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errs = list(v.iter_errors(inst))
    return "; ".join(e.message for e in errs) or None


def generate(server, field, value, seed, n=2, prompt="Here is the JSON value asked for:\n",
             max_tokens=200):
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, field: value}
    if seed is None:
        body["temperature"] = 0
    else:
        body.update(temperature=1.0, seed=seed, n=n)
    r = post(server, "/v1/completions", body)
    if r.status_code == 400:
        # outside the supported subset (unsupported_parameter naming the
        # keyword), or a body dsqd refuses (a schema holding \u0000)
        e = r.json()["error"]
        assert e["message"] and (e["code"] == "unsupported_parameter" or
                                 "U+0000" in e["message"] or "no " in e["message"]), e
        return None
    assert r.status_code == 200, (value, r.text)
    return r.json()["choices"]


def suite_schemas():
    d = os.environ.get("DSQ_MODELS_DIR", "models") + "/jsonschema-suite"
    assert os.path.exists(d + "/type.json"), \
        f"required test files missing: {d} (tests/ref/fetch_schema_suite.py)"
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            with open(os.path.join(d, name), encoding="utf-8") as f:
                out += [g["schema"] for g in json.load(f)]
    return out


def function_schemas():
    with open(os.path.join(HERE, "..", "golden", "function_schemas.json"), encoding="utf-8") as f:
        return json.load(f)


def test_schema_corpus_generates_valid_instances(server):
    """At least 200 schemas: the golden ones (greedy, and 2 seeds with
    n = 2), the official test suite's (draft 2020-12) and 49 function
    parameter schemas in the style of DeepSeek's tool definitions (greedy
    and one seed each). Each finished output validates with jsonschema;
    outputs cut by max_tokens are counted and must be rare; a schema
    outside the subset is a 400 naming the keyword."""
    jobs = [(s, seed, 2, "Here is the JSON value asked for:\n", 200)
            for s in cases("schema") for seed in (None, 1, 2)]
    jobs += [(s, seed, 1, "Here is the JSON value asked for:\n", 128)
             for i, s in enumerate(suite_schemas()) for seed in (None, 100 + i)]
    jobs += [(fn["parameters"], seed, 1,
              f"Call the function {fn['name']} ({fn['description']}). Arguments as JSON:\n", 160)
             for i, fn in enumerate(function_schemas()) for seed in (None, 500 + i)]
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda j: (j[0], generate(server, "guided_json", j[0], j[1], j[2],
                                                        j[3], j[4])), jobs))
    n_ok = n_cut = 0
    served, refused = set(), set()
    for schema, choices in results:
        key = json.dumps(schema, sort_keys=True)
        if choices is None:
            refused.add(key)
            continue
        served.add(key)
        for c in choices:
            if c["finish_reason"] == "length":
                n_cut += 1
                print("cut:", key[:80], repr(c["text"][-60:]))
                continue
            assert c["finish_reason"] == "stop", c
            why = validate(schema, c["text"])
            assert why is None, (schema, c["text"], why)
            n_ok += 1
    print(f"{len(served)} schemas served, {len(refused)} refused; {n_ok} outputs valid, "
          f"{n_cut} cut by max_tokens")
    # cut ones are schemas without a length bound (free strings, maps,
    # recursion) on which a 135M model can loop
    assert len(served) >= 200 and n_ok >= 2 * len(served), (len(served), n_ok)
    assert n_cut <= n_ok // 4, (n_ok, n_cut)


def test_golden_regexes_generate_matches(server):
    regexes = [c for c in cases("regex")]
    jobs = [(rx, seed) for rx in regexes for seed in (None, 3)]
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda j: (j[0], generate(server, "guided_regex", j[0], j[1])),
                              jobs))
    n_ok = 0
    for rx, choices in results:
        for c in choices:
            if c["finish_reason"] == "length":
                continue
            assert re.fullmatch(rx, c["text"], re.ASCII), (rx, c["text"])
            n_ok += 1
    assert n_ok >= 2 * len(regexes), n_ok


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "born": {"type": "string", "format": "date"},
        "pets": {"type": "array", "maxItems": 3,
                 "items": {"enum": ["cat", "dog", "fish"]}},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_format_through_sdk(server, stream):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                 "strict": True}}
    texts = []
    for seed in (None, 1, 2):
        kw = dict(model=MODEL_NAME, max_tokens=120, response_format=rf,
                  messages=[{"role": "user", "content": "Describe a person as JSON."}])
        if seed is not None:
            kw.update(temperature=1.0, seed=seed)
        else:
            kw.update(temperature=0)
        if stream:
            parts, finish = [], None
            for ch in client(server).chat.completions.create(stream=True, **kw):
                for c in ch.choices:
                    parts.append(c.delta.content or "")
                    finish = c.finish_reason or finish
            text = "".join(parts)
        else:
            c = client(server).chat.completions.create(**kw).choices[0]
            text, finish = c.message.content, c.finish_reason
        assert finish == "stop", (finish, text)
        assert validate(PERSON, text) is None, (text, validate(PERSON, text))
        texts.append(text)
    assert len(set(texts)) > 1, texts


def test_streamed_equals_unstreamed(server):
    body = {"model": MODEL_NAME, "prompt": "Person:", "max_tokens": 120, "temperature": 0,
            "json_schema": PERSON}
    plain = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    r = post(server, "/v1/completions", dict(body, stream=True), stream=True)
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in ev[:-1] if e.get("choices")) == plain
    assert validate(PERSON, plain) is None, plain


class Pet(pydantic.BaseModel):
    kind: str = pydantic.Field(max_length=12)
    legs: int = pydantic.Field(ge=0, le=8)


class Owner(pydantic.BaseModel):
    # bounded, so a 135M model's greedy answer ends inside max_tokens
    name: str = pydantic.Field(max_length=24)
    pets: list[Pet] = pydantic.Field(max_length=3)
    nickname: str | None = pydantic.Field(default=None, max_length=16)


def test_sdk_parse_with_pydantic(server):
    """openai-python's parse helper sends pydantic's strict schema ($defs,
    $ref, anyOf with null, additionalProperties false) and reads the answer
    back into the model."""
    out = client(server).chat.completions.parse(
        model=MODEL_NAME, max_tokens=300, temperature=0, response_format=Owner,
        messages=[{"role": "user", "content": "An owner and their pets, as JSON."}])
    ch = out.choices[0]
    assert ch.finish_reason == "stop", ch
    assert isinstance(ch.message.parsed, Owner), ch.message.content
    assert validate(Owner.model_json_schema(), ch.message.content) is None


@pytest.mark.parametrize("body,param,words", [
    ({"guided_json": {"type": "object", "properties": {"a": {"not": {}}}}}, "guided_json",
     "'not' is not supported (at /properties/a)"),
    ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema", "'uniqueItems'"),
    ({"guided_json": {"type": "string", "format": "uri"}}, "guided_json", "\"uri\""),
    ({"guided_json": {"type": "number", "minimum": 0.5}}, "guided_json", "whole-number"),
    ({"guided_regex": "(a)\\1"}, "guided_regex", "backreferences"),
    ({"guided_regex": "a{3,1}"}, "guided_regex", "out of order"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "needs 'json_schema'"),
    ({"guided_json": {"type": "integer"}, "guided_regex": "a"}, "guided_regex", "give one"),
    # a required name additionalProperties false forbids: no instance is
    # valid (a 200 wrote {"zz": ...} before)
    ({"guided_json": {"type": "object", "required": ["zz"], "additionalProperties": False}},
     "guided_json", "required property 'zz' is forbidden by additionalProperties: false"),
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}},
                      "required": ["a", "zz"], "additionalProperties": False}},
     "guided_json", "required property 'zz' is forbidden"),
    # JSON Schema's unique items; Python's re on a group name twice
    ({"guided_json": {"type": ["string", "string"]}}, "guided_json", "'type' lists 'string' twice"),
    ({"guided_json": {"type": "object", "properties": {"a": {}}, "required": ["a", "a"]}},
     "guided_json", "'required' lists 'a' twice"),
    ({"guided_regex": "(?P<x>a)(?P<x>b)"}, "guided_regex", "redefinition of group name 'x'"),
])
def test_bad_schemas_are_400(server, body, param, words):
    r = post(server, "/v1/completions", dict({"model": MODEL_NAME, "prompt": "x",
                                              "max_tokens": 4}, **body))
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and words in e["message"], e


# A repetition of what can match empty is a valid regex (it was refused
# with an internal rule name): the outputs fullmatch Python's re.
@pytest.mark.parametrize("field,value,rx", [
    ("guided_regex", "(a*)*b", "(a*)*b"),
    ("guided_regex", "(a?)+b", "(a?)+b"),
    ("guided_regex", "(x?y?)*z", "(x?y?)*z"),
    ("guided_regex", "((ab)?|c?){1,4}d", "((ab)?|c?){1,4}d"),
    ("guided_json", {"type": "string", "pattern": "^(a|)*$"}, None),
])
def test_nullable_repetitions_generate_matches(server, field, value, rx):
    n_ok = 0
    for seed in (None, 1, 2):
        choices = generate(server, field, value, seed, max_tokens=24)
        assert choices is not None, value
        for c in choices:
            if c["finish_reason"] == "length":
                continue
            if rx is None:
                assert validate(value, c["text"]) is None, c["text"]
                assert re.fullmatch(r"(a|)*", json.loads(c["text"]))
            else:
                assert re.fullmatch(rx, c["text"], re.ASCII), (rx, c["text"])
            n_ok += 1
    assert n_ok >= 1, value

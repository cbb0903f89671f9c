"""Constrained decoding through the API: llama.cpp's
`grammar` and vLLM's `guided_grammar` (GBNF), vLLM's `guided_choice`, and
OpenAI's response_format {"type": "json_object"}, on the real SmolLM2.

Every output is checked by a parser that shares nothing with dsq: Lark
(Earley) for the GBNF grammars, written a second time in Lark's notation,
and Python's json module for json_object. Sampled (temperature 1, several
seeds) and greedy, streamed and not, with n > 1 and best_of.
"""
import json
import re

import lark
import openai
import pytest

from conftest import MODEL_NAME, post, sse_events

# bounded, so every sample finishes well inside max_tokens
RECORD_GBNF = r'''
root  ::= "{" pair ( "," pair ){0,2} "}"
pair  ::= "\"" [a-z]{1,8} "\":" ( num | list )
list  ::= "[" num ( "," num ){0,3} "]"
num   ::= [0-9]{1,4}
'''
RECORD_LARK = lark.Lark(r'''
start: "{" pair ("," pair)~0..2 "}"
pair: "\"" LOWER~1..8 "\":" (num | list)
list: "[" num ("," num)~0..3 "]"
num: DIGIT~1..4
LOWER: /[a-z]/
DIGIT: /[0-9]/
''', parser="earley", lexer="dynamic_complete")


def is_record(text):
    try:
        RECORD_LARK.parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)


@pytest.mark.parametrize("field", ["grammar", "guided_grammar"])
def test_grammar_outputs_are_sentences(server, field):
    texts = []
    for seed in (1, 2, 3):
        r = post(server, "/v1/completions", {
            "model": MODEL_NAME, "prompt": "A JSON record of a cat:", "max_tokens": 160,
            "temperature": 1.0, "seed": seed, "n": 2, field: RECORD_GBNF})
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            assert c["finish_reason"] == "stop", c
            assert is_record(c["text"]), c["text"]
            texts.append(c["text"])
    # sampled: not one fixed string
    assert len(set(texts)) > 1, texts
    # greedy too, and the reference rejects a near miss (the check can fail)
    r = post(server, "/v1/completions", {"model": MODEL_NAME, "prompt": "A JSON record:",
                                         "max_tokens": 160, "temperature": 0, field: RECORD_GBNF})
    text = r.json()["choices"][0]["text"]
    assert is_record(text), text
    assert not is_record(text[:-1])


def test_grammar_streamed_equals_unstreamed_and_best_of(server):
    body = {"model": MODEL_NAME, "prompt": "Data:", "max_tokens": 160, "temperature": 0,
            "grammar": RECORD_GBNF}
    plain = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    r = post(server, "/v1/completions", dict(body, stream=True), stream=True)
    assert r.status_code == 200
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    streamed = "".join(e["choices"][0]["text"] for e in ev[:-1] if e.get("choices"))
    assert streamed == plain
    finish = [e["choices"][0]["finish_reason"] for e in ev[:-1] if e.get("choices")]
    assert finish[-1] == "stop"
    r = post(server, "/v1/completions", dict(body, temperature=1.0, seed=5, n=2, best_of=3))
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        assert is_record(c["text"]), c["text"]


@pytest.mark.parametrize("stream", [False, True])
def test_guided_choice(server, stream):
    choices = ["Paris", "London", "Berlin", "Rome \"the eternal\""]
    got = []
    for seed in (1, 2, 3, 4):
        kw = dict(model=MODEL_NAME, temperature=1.0, seed=seed, max_tokens=20, n=2,
                  messages=[{"role": "user", "content": "Name a European capital."}],
                  extra_body={"guided_choice": choices})
        if stream:
            parts = {}
            for ch in client(server).chat.completions.create(stream=True, **kw):
                for c in ch.choices:
                    parts.setdefault(c.index, "")
                    parts[c.index] += c.delta.content or ""
            got += list(parts.values())
        else:
            out = client(server).chat.completions.create(**kw)
            for c in out.choices:
                assert c.finish_reason == "stop"
                got.append(c.message.content)
    assert all(g in choices for g in got), got


def test_json_object_through_sdk(server):
    c = client(server)
    for seed in (None, 1, 2):
        kw = dict(model=MODEL_NAME, max_tokens=300, response_format={"type": "json_object"},
                  messages=[{"role": "user", "content": "Describe a cat as a JSON object."}])
        if seed is not None:
            kw.update(temperature=1.0, seed=seed)
        out = c.chat.completions.create(**kw)
        ch = out.choices[0]
        if ch.finish_reason == "length":
            # cut by max_tokens: a prefix of an object, never anything else
            assert ch.message.content.startswith("{"), ch.message.content
            continue
        assert ch.finish_reason == "stop"
        assert isinstance(json.loads(ch.message.content), dict), ch.message.content


@pytest.mark.parametrize("body,param,words", [
    ({"grammar": "root ::= foo"}, "grammar", "undefined rule 'foo'"),
    ({"guided_grammar": "root ::= \"a"}, "guided_grammar", "unterminated string"),
    ({"grammar": "root ::= root \"a\""}, "grammar", "left recursion"),
    ({"guided_choice": []}, "guided_choice", "array of 1 to"),
    ({"guided_choice": [f"c{i}" for i in range(1025)]}, "guided_choice", "array of 1 to 1024"),
    ({"grammar": "root ::= \"a\"", "guided_choice": ["a"]}, "guided_choice", "give one"),
    ({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}},
     "response_format", "give one"),
    # U+0000 cannot be generated (it vanished from a 200's text before)
    ({"grammar": 'root ::= "a" "\\x00" "b"'}, "grammar", "U+0000 (NUL) cannot be generated"),
    ({"grammar": 'root ::= "\\x00"'}, "grammar", "U+0000 (NUL) cannot be generated"),
    ({"guided_grammar": "root ::= [\\x00]"}, "guided_grammar", "U+0000 (NUL)"),
    ({"grammar": 'root ::= "\\u0000"'}, "grammar", "U+0000 (NUL)"),
    # members that would be ignored although they change the output
    ({"response_format": {"type": "json_object", "foo": 1}}, "response_format", "'response_format.foo'"),
    ({"response_format": {"type": "text", "json_schema": {"schema": {"type": "integer"}}}},
     "response_format", "does not go with type 'text'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}}},
     "response_format.json_schema.name", "must be a string of 1 to 64"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "strict": "yes", "schema": {}}}}, "response_format.json_schema.strict",
     "must be a boolean"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {}, "extra": 1}}}, "response_format.json_schema",
     "'response_format.json_schema.extra' is not supported"),
    ({"guided_json": {"type": "integer"}, "guided_whitespace_pattern": "[ ]*"},
     "guided_whitespace_pattern", "not supported"),
    ({"structured_outputs": {}}, "structured_outputs", "names no constraint"),
    ({"structured_outputs": {"json": None}}, "structured_outputs", "names no constraint"),
])
def test_bad_constraints_are_400(server, body, param, words):
    r = post(server, "/v1/completions", dict({"model": MODEL_NAME, "prompt": "x",
                                              "max_tokens": 4}, **body))
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and words in e["message"], e
    # the server is fine afterwards
    r = post(server, "/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2,
                                         "grammar": "root ::= \"ok\""})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok", r.text


def test_nul_left_out_of_classes(server):
    """A class or `.` that merely includes U+0000 keeps its other
    characters; vLLM's guided_decoding_backend picks an implementation,
    not the output, and is ignored."""
    for seed in (1, 2, 3):
        r = post(server, "/v1/completions", {
            "model": MODEL_NAME, "prompt": "Some text:", "max_tokens": 12, "temperature": 1.0,
            "seed": seed, "grammar": "root ::= [\\x00-\\x7f]{1,8} \";\"",
            "guided_decoding_backend": "xgrammar"})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        if c["finish_reason"] == "stop":
            assert re.fullmatch(r"[\x01-\x7f]{1,8};", c["text"]), c["text"]
        assert "\x00" not in c["text"], c["text"]

#!/usr/bin/env python3
"""Write tests/golden/tool_call_cases.jsonl: assistant turns with tool
calls as the models' own chat templates write them, and the calls a
parser must recover.

The text of each case is what the model is trained to generate after the
generation prompt: the conversation [user, assistant with tool_calls]
rendered by the real template (Python's jinja2 with transformers'
settings: sandboxed, trim_blocks, lstrip_blocks, tojson without HTML
escaping), minus the rendering of [user] with add_generation_prompt, minus
the end-of-sequence marker the model stops on. Templates: DeepSeek-V3's
tokenizer_config.json (parser "deepseek") and Qwen2.5-7B-Instruct's
(parser "hermes") from tests/data. DeepSeek-V3.1's shorter form has
no template in the data; its cases are written from the format its model
card documents (`"source": "format"`). Malformed variants of each (cut
before the end marker, arguments that are not a JSON object, no name)
must give no calls and the whole text as content.

  {"parser": P, "source": S, "text": T, "content": C,
   "calls": [{"name": N, "arguments": A, "arguments_json": J}]}
  (A: the JSON object, parsed; J: json.dumps(A, ensure_ascii=False), the
  string an OpenAI client sends back in an assistant turn's tool_calls)

Usage: DSQ_TEST_DATA=tests/data tests/ref/make_tool_call_golden.py [OUT]
Needs jinja2 (in .venv).
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = os.environ.get("DSQ_TEST_DATA", "tests/data")


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[jinja2.ext.loopcontrols])
    e.filters["tojson"] = lambda x, indent=None, **k: json.dumps(x, ensure_ascii=False,
                                                               indent=indent)
    e.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(Exception(m))
    return e


def render(tmpl, messages, gen, **kw):
    return env().from_string(tmpl).render(messages=messages, add_generation_prompt=gen, **kw)


CALLS = [
    [("get_current_weather", {"location": "Paris, France", "unit": "celsius"})],
    [("search_web", {"query": "C11 atomics \"memory_order\"", "max_results": 3}),
     ("get_stock_price", {"ticker": "NVDA"})],
    [("set_alarm", {"time": "07:30", "repeat": ["mon", "tue"], "label": "réveil"})],
    [("calculate", {"expression": "2*(3+4)", "precise": True, "digits": 12.5, "note": None})],
]
USER = {"role": "user", "content": "Please help."}


def wire(calls):
    return [{"name": n, "arguments": a, "arguments_json": json.dumps(a, ensure_ascii=False)}
            for n, a in calls]


def deepseek_cases(tmpl):
    out = []
    bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    for calls in CALLS:
        msg = {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
            for n, a in calls]}
        head = render(tmpl, [USER], True, bos_token=bos, eos_token=eos)
        full = render(tmpl, [USER, msg], False, bos_token=bos, eos_token=eos)
        assert full.startswith(head), (head, full)
        text = full[len(head):]
        if text.endswith(eos):
            text = text[:-len(eos)]
        out.append({"parser": "deepseek", "source": "DeepSeek-V3 chat template", "text": text,
                    "content": "", "calls": wire(calls)})
    # content before the calls (the model may write some)
    c = dict(out[0])
    c["text"] = "Let me look that up.\n\n" + c["text"]
    c["content"] = "Let me look that up."
    out.append(c)
    return out


def deepseek_v31_cases():
    cb, ce = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
    ob, oe, sep = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁sep｜>"
    out = []
    for calls in CALLS[:2]:
        text = ob + "".join(cb + n + sep + json.dumps(a, ensure_ascii=False) + ce
                            for n, a in calls) + oe
        out.append({"parser": "deepseek", "source": "format", "text": text, "content": "",
                    "calls": wire(calls)})
    return out


def hermes_cases(tmpl):
    out = []
    for calls in CALLS:
        msg = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
        head = render(tmpl, [USER], True)
        full = render(tmpl, [USER, msg], False)
        assert full.startswith(head), (head, full)
        text = full[len(head):]
        for end in ("<|im_end|>\n", "<|im_end|>"):
            if text.endswith(end):
                text = text[:-len(end)]
                break
        out.append({"parser": "hermes", "source": "Qwen2.5-7B-Instruct chat template",
                    "text": text, "content": "",
                    "calls": wire(calls)})
    c = dict(out[1])
    c["text"] = "Two lookups:\n" + c["text"]
    c["content"] = "Two lookups:"
    out.append(c)
    return out


def malformed(cases):
    """Cut, broken arguments, no name: no calls, all text content."""
    out = []
    for c in cases:
        t = c["text"]
        end = "<｜tool▁call▁end｜>" if c["parser"] == "deepseek" else "</tool_call>"
        i = t.find(end)
        variants = [t[:i], t[:i] + t[i:].replace(end, "", 1)]
        name = c["calls"][0]["name"]
        variants.append(t.replace(json.dumps(c["calls"][0]["arguments"], ensure_ascii=False)[:-1],
                                  json.dumps(c["calls"][0]["arguments"], ensure_ascii=False)[:-2],
                                  1))
        variants.append(t.replace(name, "", 1) if c["parser"] == "deepseek"
                        else t.replace('"name": "' + name + '"', '"nom": "' + name + '"', 1))
        for v in variants:
            if v != t:
                out.append({"parser": c["parser"], "source": "malformed: " + c["source"],
                            "text": v, "content": v, "calls": []})
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/tool_call_cases.jsonl"
    with open(os.path.join(DATA, "tokenizers/deepseek-v3/tokenizer_config.json")) as f:
        ds = json.load(f)["chat_template"]
    with open(os.path.join(DATA, "tokenizers/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja")) as f:
        qw = f.read()
    good = deepseek_cases(ds) + deepseek_v31_cases() + hermes_cases(qw)
    cases = good + malformed(good)
    # plain text with no call at all: content only
    cases.append({"parser": "deepseek", "source": "no call", "text": "The weather is fine.",
                  "content": "The weather is fine.", "calls": []})
    cases.append({"parser": "hermes", "source": "no call", "text": "<tool_call is not a tag",
                  "content": "<tool_call is not a tag", "calls": []})
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# made by tests/ref/make_tool_call_golden.py (jinja2 {jinja2.__version__}); "
                "one case a line\n")
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(good)} well-formed, {len(cases) - len(good)} other cases")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Golden renderings of real chat templates, made with transformers.

Owns tests/golden/chat_templates/*.json. One file per template; each holds
the conversations it was rendered with and, per conversation, either the
exact expected text or the error transformers raised (the C renderer must
then fail too). tests/unit/test_chat_template.c reads the template text from
the test data at run time (never from the golden file) and checks its
SHA-256 against the one recorded here, so a changed data file is reported as
such instead of as a rendering mismatch.

Why built this way: transformers' own renderer
(transformers.utils.chat_template_utils.render_jinja_template: jinja2
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, its tojson and
raise_exception) is what users of Hugging Face models get, so the C
interpreter is compared against it, not against itself. bos/eos are passed
as apply_chat_template does (special tokens map; a missing token is left
undefined); tools=None and documents=None are passed as render_jinja_template
does.

Regenerate from the repo root, in a scratch venv (no torch needed):
  python3 -m venv /tmp/chatvenv
  /tmp/chatvenv/bin/pip install transformers jinja2 gguf
  DSQ_TEST_DATA=tests/data DSQ_MODELS_DIR=models \\
      /tmp/chatvenv/bin/python tests/ref/make_chat_golden.py
"""
import copy
import hashlib
import importlib.metadata
import json
import os
import sys

import gguf
import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

FORMAT_VERSION = 1
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "chat_templates")

BOS_DS = "<｜begin▁of▁sentence｜>"
EOS_DS = "<｜end▁of▁sentence｜>"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city, e.g. “Zürich”.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "noop",
            "description": "Does nothing.\nSecond line with \"quotes\" and \\ backslash.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]

SYS = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "What is 2+2?"}
A1 = {"role": "assistant", "content": "4."}
U2 = {"role": "user", "content": "And 3+3?"}
A_THINK = {"role": "assistant",
           "content": "<think>\nThe user asks 2+2.\nThat is 4.\n</think>\n\nThe answer is 4."}
A_THINK2 = {"role": "assistant", "content": "<think>\nsix\n</think>\n\nSix."}

CASES = [
    ("single_user_gen", [U1], None, True, {}),
    ("single_user_nogen", [U1], None, False, {}),
    ("system_multi_gen", [SYS, U1, A1, U2], None, True, {}),
    ("system_multi_nogen", [SYS, U1, A1, U2, {"role": "assistant", "content": "6."}], None, False, {}),
    ("no_system_multi", [U1, A1, U2], None, True, {}),
    ("two_system", [SYS, {"role": "system", "content": "Answer in French."}, U1], None, True, {}),
    ("non_ascii", [
        {"role": "system", "content": "Réponds en français, s'il te plaît. 日本語も可。"},
        {"role": "user", "content": "Привет! 🚀 \"quoted\" back\\slash\ttab\nnewline — ünïcödé"},
        {"role": "assistant", "content": "Bonjour ! Ça va ? 你好 🙂"},
        {"role": "user", "content": "  leading and trailing spaces  \n"},
    ], None, True, {}),
    ("content_parts", [
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]},
    ], None, True, {}),
    ("think_history", [U1, A_THINK, U2, A_THINK2], None, False, {}),
    ("think_then_user", [SYS, U1, A_THINK, U2], None, True, {}),
    ("reasoning_content", [U1, {"role": "assistant", "content": "The answer is 4.",
                                "reasoning_content": "Simple arithmetic."}, U2], None, True, {}),
    ("enable_thinking_false", [U1], None, True, {"enable_thinking": False}),
    ("tools_gen", [SYS, {"role": "user", "content": "Weather in Zürich?"}], TOOLS, True, {}),
    ("tools_no_system", [{"role": "user", "content": "Weather in Paris?"}], TOOLS, True, {}),
    ("tool_calls_str_args", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"type": "function", "function": {"name": "noop", "arguments": "{}"}},
        ]},
        {"role": "tool", "content": "{\"temp_c\": 21}"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "It is 21 °C in Paris."},
        {"role": "user", "content": "Thanks"},
    ], TOOLS, True, {}),
    ("tool_calls_obj_args", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
        ]},
        {"role": "tool", "content": "{\"temp_c\": 21.5}"},
    ], None, True, {}),
    ("tool_last_gen", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
        ]},
        {"role": "tool", "content": "cold"},
    ], None, True, {}),
    ("empty_messages", [], None, True, {}),
]


# Small templates (written here) exercising expressions, filters, tests,
# whitespace control and error cases; expected output from the same renderer.
SNIPPETS = [
    '{% for i in [1,2] %}{% if i==2 %}{{x}}{% endif %}{% set x = i %}{% endfor %}|{{x}}',
    '{{ [1,2.5,"a",none,true,{"k":[1]}] }}',
    '{{ 1/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7%3 }} {{ 1e20 }} {{ 0.1+0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 2**10 }} {{ 2**0.5 }} {{ 100000.0 }} {{ 0.0001 }} {{ 1e-5 }} {{ -0.0 }} {{ 123456789012345678.0 }}',
    '{{ "a\\nb\\u00e9\\x41\\t\\\\" }}',
    '{{ undefined_x.foo }}',
    '{{ none.foo }}|{{ none["x"] }}',
    '{{ [1,2]|tojson }}{{ {"a":"é\\u0001\\"\\\\/"}|tojson(indent=2) }}{{ d|tojson }}{{ d|tojson(indent=2) }}{{ messages|tojson }}',
    '  {% if true %}x{% endif %}  \n  {%+ if true %}y{% endif %}\n   {# c #}\nz {% if true %}\nq\n{% endif %}',
    '{{ "x" + 1 }}',
    '{{ \'it\'\'s\' }} {{ "it\'s" }} {{ [\'it\\\'s\', "a\\"b", \'a\\nb\'] }}',
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}:{{ m.role }}/{{ m['content'] }};{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% else %}none{% endfor %}{% for x in [] %}a{% else %}empty{% endfor %}",
    '{{ messages[1:] | length }} {{ messages[::-1][0].role }} {{ "héllo"[1:3] }} {{ "hello"[::-1] }} {{ [1,2,3,4,5][1:-1:2] }} {{ [1,2,3][-10:10] }} {{ "abc"[-1] }} {{ [1,2,3][5] }}',
    "{{ 'a' if x else 'b' }} {{ 'a' if n else 'b' }} {{ ('a' if false) }}|{{ 1 if 2 > 1 else 0 }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' in 'abc' }} {{ 'z' not in 'abc' }} {{ 1 in [1,2] }} {{ 'a' in d }} {{ 'q' in d }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }} {{ x is none }} {{ y is defined }} {{ y is undefined }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ d is mapping }} {{ d is iterable }} {{ 'a' is string }} {{ true is true }} {{ n is odd }} {{ n is divisibleby 3 }} {{ n is divisibleby(2) }}",
    "{{ x and 1 }} {{ n and 'yes' }} {{ x or 'def' }} {{ n or 5 }} {{ not x }} {{ not n }}",
    '{{ "  hi  "|trim }}|{{ "xxhixx"|trim("x") }}|{{ "Hello World"|upper }}|{{ "Hello"|lower }}|{{ "hello world"|capitalize }}|{{ "hello world-foo (bar"|title }}|{{ "a,b,c"|replace(",", ";") }}|{{ "aaa"|replace("a","b",2) }}|{{ [1,2,3]|first }}{{ [1,2,3]|last }}|{{ [1,2,3]|join(", ") }}|{{ "abc"|list }}|{{ d|items|list }}|{{ 3.7|int }}{{ "42"|int }}{{ "x"|int }}{{ "4.5"|int }}|{{ 5|string }}{{ [1]|string }}|{{ y|default("dflt") }}{{ ""|default("e", true) }}{{ x|default("X") }}|{{ "abc"|length }}{{ d|length }}{{ "日本"|length }}',
    '{{ messages|selectattr("role", "equalto", "user")|list|length }} {{ messages|rejectattr("role", "equalto", "user")|map(attribute="role")|join(",") }} {{ messages|map(attribute="role")|list }} {{ [1,0,2]|select|list }} {{ ["a","B"]|map("upper")|list }} {{ messages|selectattr("role","==","system")|map(attribute=\'content\')|first }}',
    '{{ "a,b,,c".split(",") }} {{ " a b ".split() }} {{ "a b c".split(" ", 1) }} {{ "a.b.c".rsplit(".", 1) }} {{ "hello".startswith("he") }} {{ "hello".endswith("lo") }} {{ "hello".startswith(("x","h")) }} {{ "  x ".strip() }}|{{ "\\n\\nx\\n".lstrip("\\n") }}|{{ "x\\n\\n".rstrip("\\n") }}|{{ "aXb".replace("X","y") }} {{ "Hello".upper() }} {{ "Hello".lower() }} {{ "hello wORLD".title() }} {{ "hello".capitalize() }} {{ "hello".find("l") }} {{ "hello".count("l") }} {{ "-".join(["a","b"]) }}',
    '{{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get("a") }} {{ d.get("z") }} {{ d.get("z", 9) }} {% for k, v in d.items() %}{{k}}={{v}};{% endfor %}',
    "{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}",
    "{% macro m(a, b='B') %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}",
    '{{ raise_exception("boom") }}',
    '{%- for i in range(5) -%}\n  {%- if i == 1 %}{% continue %}{% endif -%}\n  {%- if i == 3 %}{% break %}{% endif -%}\n  {{ i }}\n{%- endfor %}',
    '{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}block {{ a }}{% endset %}[{{ t }}]',
    "{{ 'a' ~ 1 ~ none ~ y ~ 2.0 }} {{ 3 - 5 }} {{ -n }} {{ 2 * 'ab' }} {{ [1] * 3 }} {{ [1] + [2] }} {{ 10 % 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    '{# comment #}a{#- c -#}  b {#+ c +#}\nc',
    'x   {{- "y" -}}   z {{ "w" }}\n q',
    '{{ tools is none }} {{ tools is defined }} {{ bos_token }}{{ eos_token }} {{ add_generation_prompt }}',
    "{{ messages[0]['role'] == 'system' }} {{ messages[5] is defined }} {{ (messages|length - 1) }}",
    '{{ [3,1,2]|sort }} {{ ["b","A","c"]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ [1,2,1,3]|unique|list }} {{ [3,1,2]|max }} {{ [3,1,2]|min }} {{ [1,2,3]|sum }} {{ [1,2]|reverse|list }} {{ "abc"|reverse }}',
    '{{ "a\\nb\\n\\nc"|indent(2) }}|{{ "a\\nb"|indent(2, true) }}|{{ "a\\n"|indent }}|{{ {"a": [1, {"b": 2}], "c": "d"}|tojson(indent=4) }}',
    '{{ 1.5|round }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ -3|abs }} {{ "3.5"|float }} {{ 5|float }}',
    '{{ x.y }}',
    '{{ y + 1 }}',
    '{% for a in none %}{% endfor %}',
    '{{ foo(1) }}',
    '{% if %}',
    '{% for x in y %}',
    '{{ x | nosuchfilter }}',
    '{% raw %}x{% endraw %}',
    '{{ "unterminated }}',
    "{{ d.a }}{{ d['b'][1] }}{{ d.b.0 }}",
    "{{ {'a':{'b':1}} }}",
    '{{ (1, 2) }} {{ () }} {{ 1, 2 }}',
    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'x' is sameas 'x' }} {{ none is sameas none }} {{ 3 is gt 2 }} {{ 3 is lt(2) }} {{ 1 is in [1] }} {{ 2 is ne 1 }}",
    "{{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 < 'a' }}",
    '{% for a, b in [[1,2],[3,4]] %}{{ a + b }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}',
    '{{ dict(a=1, b=2) }} {{ namespace(a=1) }}',
    "{% for m in messages %}{% set content = m.content %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}[{{ content }}]{% endfor %}{{ content }}\n",
    '{% raw %}x{{ y }}{% endraw %}',
    'a\n  {% raw %}\n  {{ x }}\n  {% endraw %}\nb',
    'a {%- raw -%}  {{ x }}  {%- endraw -%}  b',
    '{%raw%}{%endraw%}c',
    "{% for m in messages %}\n    {% if m.role == 'user' %}\n        U: {{ m.content }}\n    {% elif m.role == 'assistant' %}\n        A: {{ m.content }}\n    {% else %}\n        S\n    {% endif %}\n{% endfor %}",
    '{%- for m in messages %}\n  {{- m.role }}\n{% endfor -%}\nend',
    '  {{ 1 }}  {% if true %}  x  {% endif %}\n{# comment #}\n  {#- c2 #}\ny',
    '{% if true %}a{% endif %}\nb{% if true +%}\nc{% endif %}',
    "{{ bos_token }}{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] | trim }}\n{% endfor %}",
    '\t{% if true %}tab{% endif %}\n',
]

# Context every snippet is rendered with (bos/eos/extra as kwargs).
SNIPPET_CTX = {
    "messages": [{"role": "system", "content": "sys"},
                 {"role": "user", "content": "Hi é ünï 你好"},
                 {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"}],
    "tools": None,
    "add_generation_prompt": True,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "extra": {"x": None, "n": 3, "f": 2.5, "d": {"a": 1, "b": [1, 2]}},
}


def data_path(rel):
    root = os.environ.get("DSQ_TEST_DATA")
    if not root:
        sys.exit("set DSQ_TEST_DATA (e.g. tests/data)")
    return os.path.join(root, rel)


def models_path(rel):
    root = os.environ.get("DSQ_MODELS_DIR")
    if not root:
        sys.exit("set DSQ_MODELS_DIR (e.g. models)")
    return os.path.join(root, rel)


def token_text(tok):
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def from_tokenizer_config(rel):
    with open(data_path(rel), encoding="utf-8") as f:
        cfg = json.load(f)
    return cfg["chat_template"], token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token"))


def from_gguf(rel):
    r = gguf.GGUFReader(models_path(rel))

    def field_str(k):
        f = r.fields[k]
        return bytes(f.parts[f.data[0]]).decode("utf-8")

    def field_int(k):
        f = r.fields[k]
        return int(f.parts[f.data[0]][0])

    toks = r.fields["tokenizer.ggml.tokens"]
    def tok(i):
        return bytes(toks.parts[toks.data[i]]).decode("utf-8")
    return (field_str("tokenizer.chat_template"),
            tok(field_int("tokenizer.ggml.bos_token_id")),
            tok(field_int("tokenizer.ggml.eos_token_id")))


TEMPLATES = [
    # name, source kind, path, bos, eos (None: read from the source)
    ("qwen2.5-7b-instruct", "file", "tokenizers/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>"),
    ("deepseek-r1-distill-qwen-32b", "file", "tokenizers/chat_templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", BOS_DS, EOS_DS),
    ("llama-cpp-deepseek-r1", "file", "tokenizers/chat_templates/llama-cpp-deepseek-r1.jinja", BOS_DS, EOS_DS),
    ("deepseek-v3", "tokenizer_config", "tokenizers/deepseek-v3/tokenizer_config.json", None, None),
    ("qwen3", "tokenizer_config", "tokenizers/qwen3/tokenizer_config.json", None, None),
    ("smollm2-135m-instruct", "gguf", "SmolLM2-135M-Instruct.Q4_1.gguf", None, None),
]


def render(template, messages, tools, agp, bos, eos, extra):
    kwargs = dict(extra)
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    out, _ = render_jinja_template(conversations=[copy.deepcopy(messages)],
                                   tools=copy.deepcopy(tools), chat_template=template,
                                   add_generation_prompt=agp, **kwargs)
    return out[0]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    for name, kind, rel, bos, eos in TEMPLATES:
        if kind == "file":
            with open(data_path(rel), encoding="utf-8", newline="") as f:
                template = f.read()
        elif kind == "tokenizer_config":
            template, bos, eos = from_tokenizer_config(rel)
        else:
            template, bos, eos = from_gguf(rel)
        cases = []
        for cname, msgs, tools, agp, extra in CASES:
            case = {"name": cname, "messages": msgs, "tools": tools,
                    "add_generation_prompt": agp, "extra": extra}
            try:
                case["expected"] = render(template, msgs, tools, agp, bos, eos, extra)
            except Exception as e:  # the C renderer must fail as well
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
        doc = {
            "template": {"source": kind, "path": rel,
                         "sha256": hashlib.sha256(template.encode("utf-8")).hexdigest()},
            "bos_token": bos,
            "eos_token": eos,
            "cases": cases,
        }
        path = os.path.join(OUT_DIR, name + ".json")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(f"# dsq chat-template golden, format {FORMAT_VERSION}\n")
            f.write("# regenerate: DSQ_TEST_DATA=tests/data DSQ_MODELS_DIR=models "
                    "python3 tests/ref/make_chat_golden.py (venv: transformers jinja2 gguf)\n")
            f.write(f"# rendered by transformers {transformers.__version__} "
                    f"(render_jinja_template), jinja2 {jinja2.__version__}, "
                    f"gguf {importlib.metadata.version('gguf')}; template sha256 "
                    f"{doc['template']['sha256']}; tolerance: exact bytes\n")
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum(1 for c in cases if "error" in c)
        print(f"{path}: {len(cases)} cases, {n_err} expect an error")
    write_snippets()


def write_snippets():
    from transformers.utils.chat_template_utils import _compile_jinja_template
    c = SNIPPET_CTX
    cases = []
    for src in SNIPPETS:
        case = {"template": src}
        try:
            # compile separately so syntax errors are recorded too
            _compile_jinja_template(src)
            case["expected"] = render(src, c["messages"], c["tools"], c["add_generation_prompt"],
                                      c["bos_token"], c["eos_token"], c["extra"])
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    path = os.path.join(OUT_DIR, "snippets.json")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(f"# dsq chat-template golden, format {FORMAT_VERSION}\n")
        f.write("# regenerate: DSQ_TEST_DATA=tests/data DSQ_MODELS_DIR=models "
                "python3 tests/ref/make_chat_golden.py (venv: transformers jinja2 gguf)\n")
        f.write(f"# rendered by transformers {transformers.__version__} "
                f"(render_jinja_template), jinja2 {jinja2.__version__}; tolerance: exact bytes\n")
        json.dump({"context": c, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(cases)} snippets, {sum(1 for x in cases if 'error' in x)} expect an error")


if __name__ == "__main__":
    main()

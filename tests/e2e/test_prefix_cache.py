"""Automatic prefix caching end to end (--enable-prefix-caching).

With the flag, a repeated prompt reuses the KV blocks of its first run:
usage.prompt_tokens_details.cached_tokens = the prompt tokens whose KV came
from the cache, which is every full 16-token block except that the last
prompt token is always recomputed, i.e. floor((prompt_tokens - 1) / 16) * 16
(docs/api.md); greedy text is unchanged; the dsq:prefix_cache_* counters
move. Without the flag nothing is reused and the field is absent (as vLLM
without --enable-prompt-tokens-details)."""
import re

import openai
import requests

from conftest import MODEL_NAME, complete, post, sse_events

BLOCK = 16
# about 100 tokens
LONG = ("The following notes describe the history of the city of Rome, from its "
        "legendary founding by Romulus and Remus, through the kingdom, the republic and "
        "the empire, for students who are new to the subject. The notes are short and "
        "each one ends with a question that the reader should try to answer before "
        "reading on. Question one: who were the first kings of Rome, which of them "
        "built the first walls and temples of the city, and why")


def metric(server, name):
    text = requests.get(server.url("/metrics"), timeout=30).text
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def cached(usage):
    d = usage.get("prompt_tokens_details")
    return None if d is None else d["cached_tokens"]


def expected(n_prompt):
    return (n_prompt - 1) // BLOCK * BLOCK


def test_prefix_cache_on(daemon_factory):
    d = daemon_factory("--enable-prefix-caching")
    q0 = metric(d, "dsq:prefix_cache_queries_total")
    h0 = metric(d, "dsq:prefix_cache_hits_total")
    assert q0 == 0 and h0 == 0
    a = complete(d, prompt=LONG, max_tokens=12, temperature=0)
    n = a["usage"]["prompt_tokens"]
    assert 90 <= n <= 160, n
    assert cached(a["usage"]) == 0
    b = complete(d, prompt=LONG, max_tokens=12, temperature=0)
    assert b["usage"]["prompt_tokens"] == n
    c = cached(b["usage"])
    assert c > 0 and c % BLOCK == 0 and c < n
    assert c == expected(n)
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    assert metric(d, "dsq:prefix_cache_queries_total") == 2 * n
    assert metric(d, "dsq:prefix_cache_hits_total") == c

    # a prompt sharing the first blocks reuses exactly those
    other = complete(d, prompt=LONG[:200] + " Something else entirely.", max_tokens=4,
                     temperature=0)
    co = cached(other["usage"])
    assert 0 < co < c and co % BLOCK == 0

    # streaming: the usage chunk carries the same field
    r = post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": LONG, "max_tokens": 12,
                                    "temperature": 0, "stream": True,
                                    "stream_options": {"include_usage": True}}, stream=True)
    assert r.status_code == 200
    evs = [e for e in sse_events(r) if e != "[DONE]"]
    usage = [e["usage"] for e in evs if e.get("usage")]
    assert len(usage) == 1 and cached(usage[0]) == c
    text = "".join(ch["text"] for e in evs for ch in e.get("choices", []))
    assert text == a["choices"][0]["text"]

    # chat through the official client: second call hits the cache
    cl = openai.OpenAI(base_url=d.url("/v1"), api_key="none", max_retries=0)
    msgs = [{"role": "system", "content": LONG}, {"role": "user", "content": "Answer briefly."}]
    r1 = cl.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8,
                                    temperature=0)
    r2 = cl.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8,
                                    temperature=0)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.usage.prompt_tokens_details.cached_tokens == expected(r2.usage.prompt_tokens)
    assert r2.choices[0].message.content == r1.choices[0].message.content
    assert metric(d, "dsq:prefix_cache_hits_total") > c


def test_prefix_cache_off(server):
    a = complete(server, prompt=LONG, max_tokens=6, temperature=0)
    b = complete(server, prompt=LONG, max_tokens=6, temperature=0)
    assert cached(a["usage"]) in (None, 0)
    assert cached(b["usage"]) in (None, 0)
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    assert metric(server, "dsq:prefix_cache_queries_total") == 0
    assert metric(server, "dsq:prefix_cache_hits_total") == 0

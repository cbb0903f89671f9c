"""64 concurrent streaming clients, a third of them hanging up at random
points. Afterwards the daemon is healthy, every KV block is free again, and
each completed greedy response equals the same request run alone."""
import concurrent.futures
import json
import random
import re
import time

import requests

from conftest import MODEL_NAME

PROMPTS = ["The quick brown fox", "In the beginning", "def add(a, b):",
           "Paris is the capital of", "1, 2, 3, 4,", "Dear Sir or Madam,",
           "The meaning of life is", "Once upon a time"]
N_CLIENTS = 64
MAX_TOKENS = 24


def body(i):
    return {"model": MODEL_NAME, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True}


def stream_one(server, i, drop_after):
    r = requests.post(server.url("/v1/completions"), json=dict(body(i), stream=True),
                      stream=True, timeout=600)
    assert r.status_code == 200, r.text
    text, n = [], 0
    for raw in r.iter_lines():
        line = raw.decode("utf-8")
        if not line:
            continue
        if drop_after is not None and n >= drop_after:
            r.close()            # hang up mid-stream
            return i, None
        n += 1
        payload = line[6:]
        if payload == "[DONE]":
            break
        text.append(json.loads(payload)["choices"][0]["text"])
    return i, "".join(text)


def kv_used(server):
    t = requests.get(server.url("/metrics")).text
    m = re.search(r"^dsq:kv_cache_blocks_used\{[^}]*\} (\S+)", t, re.M)
    return float(m.group(1))


def test_64_streams_with_disconnects(server):
    rng = random.Random(7)
    alone = {}
    for p in range(len(PROMPTS)):
        r = requests.post(server.url("/v1/completions"), json=body(p), timeout=600)
        alone[p] = r.json()["choices"][0]["text"]
    drops = {i: rng.randint(0, MAX_TOKENS // 2) for i in rng.sample(range(N_CLIENTS), N_CLIENTS // 3)}
    with concurrent.futures.ThreadPoolExecutor(N_CLIENTS) as ex:
        futs = [ex.submit(stream_one, server, i, drops.get(i)) for i in range(N_CLIENTS)]
        results = [f.result() for f in futs]
    done = [(i, t) for i, t in results if t is not None]
    assert len(done) == N_CLIENTS - len(drops)
    for i, t in done:
        assert t == alone[i % len(PROMPTS)], (i, t, alone[i % len(PROMPTS)])
    assert requests.get(server.url("/health")).status_code == 200
    for _ in range(100):
        if kv_used(server) == 0:
            break
        time.sleep(0.1)
    assert kv_used(server) == 0
    # still answers, same as before
    r = requests.post(server.url("/v1/completions"), json=body(0), timeout=600)
    assert r.json()["choices"][0]["text"] == alone[0]

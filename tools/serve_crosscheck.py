#!/usr/bin/env python3
"""Independent cross-check of `dsq-bench serve`: the same load,
driven by the official OpenAI Python SDK instead of our C client.

usage: tools/serve_crosscheck.py URL CLIENTS REQUESTS [PROMPT_LEN] [MAX_TOKENS] [SEED]

CLIENTS threads each take requests from a shared counter until REQUESTS
have been sent (one warm-up request first, not counted). Each request is a
streamed /v1/completions of a PROMPT_LEN-id prompt (ids drawn from
[100, 10000) with SEED, as dsq-bench serve draws them), MAX_TOKENS new
tokens, greedy, ignore_eos (both dsqd and llama-server take it). Reports
output tok/s (completion tokens / wall time, tokens from the usage chunk
where the server sends one, else the streamed chunks that carried text),
TTFT p50/p99 and ITL p50 in ms, and request failures. Loopback targets
only; prints one line, and --json prints it as JSON.
"""
import json
import random
import sys
import threading
import time

import openai


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    as_json = "--json" in sys.argv[1:]
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    url, n_clients, n_req = args[0], int(args[1]), int(args[2])
    plen = int(args[3]) if len(args) > 3 else 128
    mtok = int(args[4]) if len(args) > 4 else 64
    seed = int(args[5]) if len(args) > 5 else 1
    if not url.startswith(("http://127.0.0.1", "http://localhost")):
        print("serve_crosscheck: loopback targets only", file=sys.stderr)
        return 2
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none",
                           max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 10000) for _ in range(plen)] for _ in range(n_req + 1)]

    def one(prompt):
        t0 = time.perf_counter()
        stamps, usage = [], None
        stream = client.completions.create(
            model=model, prompt=prompt, max_tokens=mtok, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.perf_counter())
        n = usage if usage else len(stamps)
        ttft = (stamps[0] - t0) if stamps else float("nan")
        itl = [b - a for a, b in zip(stamps, stamps[1:])]
        return n, ttft, itl

    one(prompts[-1])                              # warm-up
    lock = threading.Lock()
    nxt = [0]
    res, fails = [], [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n_req:
                return
            try:
                r = one(prompts[i])
            except openai.OpenAIError as e:
                with lock:
                    fails[0] += 1
                print(f"serve_crosscheck: request {i}: {e}", file=sys.stderr)
                continue
            with lock:
                res.append(r)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(n_clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0

    def pct(xs, p):
        xs = sorted(xs)
        return 1e3 * xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
    out = {
        "url": url, "clients": n_clients, "requests": n_req, "failed": fails[0],
        "out_tok_s": sum(r[0] for r in res) / wall,
        "ttft_p50_ms": pct([r[1] for r in res], 0.5),
        "ttft_p99_ms": pct([r[1] for r in res], 0.99),
        "itl_p50_ms": pct([x for r in res for x in r[2]], 0.5),
        "wall_s": wall,
    }
    if as_json:
        print(json.dumps(out))
    else:
        print(f"{url} C={n_clients}: {out['out_tok_s']:.1f} out tok/s, TTFT p50 "
              f"{out['ttft_p50_ms']:.0f} ms p99 {out['ttft_p99_ms']:.0f} ms, ITL p50 "
              f"{out['itl_p50_ms']:.1f} ms, {fails[0]} failed, {wall:.1f} s")
    return 1 if fails[0] else 0


if __name__ == "__main__":
    sys.exit(main())

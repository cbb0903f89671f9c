"""Speculative decoding end to end (--speculative-ngram, --draft-model).

A server that speculates answers what one that does not answers: the same
greedy text and the same seeded samples, streamed or not, under grammars
too, with logprobs equal to the last bits a different summation order may
move; the vLLM spec_decode counters appear on /metrics only when it is on
and show drafts accepted on a prompt whose answer copies it (under a
grammar as well); a request may opt out
with "speculative": false, and a non-boolean there is a 400 in the API's
error shape. Concurrent clients get the same answers as sequential ones."""
import concurrent.futures
import os
import re
import subprocess

import requests

from conftest import MODEL_NAME, complete, free_port, model_path, post, sse_events

CODE = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        "def mul(a, b):\n    return a * b\n\n\ndef add(a, b):\n")

PROMPTS = [
    CODE,
    "The capital of France is",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5,",
    "Once upon a time, in a small village by the sea,",
]


def metrics(server):
    return requests.get(server.url("/metrics"), timeout=30).text


def counter(text, name):
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def answers(d, **extra):
    out = []
    for p in PROMPTS:
        r = complete(d, prompt=p, max_tokens=40, temperature=0, logprobs=1, **extra)
        c = r["choices"][0]
        out.append((c["text"], c["logprobs"]["token_logprobs"], c["finish_reason"]))
    return out


def sampled(d, **extra):
    return [complete(d, prompt=p, max_tokens=30, temperature=0.9, top_p=0.95, seed=7,
                     **extra)["choices"][0]["text"] for p in PROMPTS]


def constrained(d):
    """Greedy answers under a regex and a JSON schema: from the second row
    on, the engine makes each verified position's mask itself."""
    r1 = complete(d, prompt=CODE, max_tokens=40, temperature=0,
                  guided_regex=r"(    return a [-+*] b\n\n\ndef [a-z]+\(a, b\):\n)+")
    r2 = complete(d, prompt="A JSON object with a name and two numbers: ", max_tokens=40,
                  temperature=0, guided_json={
                      "type": "object", "required": ["name", "a", "b"],
                      "properties": {"name": {"type": "string"}, "a": {"type": "integer"},
                                     "b": {"type": "integer"}}})
    return [r1["choices"][0]["text"], r2["choices"][0]["text"]]


def same(a, b):
    for (ta, la, fa), (tb, lb, fb) in zip(a, b):
        assert ta == tb and fa == fb
        assert len(la) == len(lb)
        assert all(abs(x - y) <= 1e-3 for x, y in zip(la, lb)), (la, lb)


def test_speculative_same_answers(daemon_factory):
    plain = daemon_factory()
    base = answers(plain)
    base_sampled = sampled(plain)
    base_constrained = constrained(plain)
    assert "spec_decode" not in metrics(plain)
    plain.stop()

    d = daemon_factory("--speculative-ngram", "4")
    m0 = metrics(d)
    assert counter(m0, "vllm:spec_decode_num_drafts_total") == 0
    same(answers(d), base)
    assert sampled(d) == base_sampled
    m = counter(metrics(d), "vllm:spec_decode_num_accepted_tokens_total")
    assert constrained(d) == base_constrained
    assert counter(metrics(d), "vllm:spec_decode_num_accepted_tokens_total") > m
    m1 = metrics(d)
    drafted = counter(m1, "vllm:spec_decode_num_draft_tokens_total")
    accepted = counter(m1, "vllm:spec_decode_num_accepted_tokens_total")
    assert counter(m1, "vllm:spec_decode_num_drafts_total") > 0
    assert 0 < accepted <= drafted
    pos = [float(x) for x in re.findall(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="\d+"\} (\S+)$',
        m1, re.M)]
    assert len(pos) == 4 and sum(pos) == accepted
    assert all(pos[i + 1] <= pos[i] for i in range(3))

    # streamed: the same text
    r = post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": CODE, "max_tokens": 40,
                                    "temperature": 0, "stream": True}, stream=True)
    assert r.status_code == 200
    text = "".join(e["choices"][0]["text"] for e in sse_events(r)
                   if isinstance(e, dict) and e.get("choices"))
    assert text == base[0][0]

    # opt-out: same answer, no new drafts
    before = counter(metrics(d), "vllm:spec_decode_num_draft_tokens_total")
    r = complete(d, prompt=CODE, max_tokens=40, temperature=0, speculative=False)
    assert r["choices"][0]["text"] == base[0][0]
    assert counter(metrics(d), "vllm:spec_decode_num_draft_tokens_total") == before

    # a bad type is the API's 400
    r = post(d, "/v1/completions", {"model": MODEL_NAME, "prompt": CODE, "max_tokens": 4,
                                    "speculative": "no"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "speculative" and "boolean" in err["message"]

    # concurrent clients: speculating and plain rows in the same steps
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda p: complete(d, prompt=p, max_tokens=40, temperature=0)
                          ["choices"][0]["text"], PROMPTS * 2))
    assert got == [t for t, _, _ in base] * 2


def test_draft_model_same_answers(daemon_factory):
    """--draft-model: the default model drafting for itself answers what
    the plain server answers (greedy, seeded samples, under a grammar,
    concurrent clients), and keeps every greedy draft, since a draft is the
    draft model's greedy token and here that is the model's own."""
    plain = daemon_factory()
    base = answers(plain)
    base_sampled = sampled(plain)
    base_constrained = constrained(plain)
    plain.stop()

    d = daemon_factory("--draft-model", model_path(), "--draft-max", "4",
                       "--speculative-fixed-len")
    same(answers(d), base)
    m = metrics(d)
    drafted = counter(m, "vllm:spec_decode_num_draft_tokens_total")
    assert drafted > 0
    assert counter(m, "vllm:spec_decode_num_accepted_tokens_total") == drafted
    assert counter(m, "dsq:draft_tokens_total") >= drafted
    assert counter(m, "dsq:draft_kv_blocks_used") == 0
    assert counter(m, "dsq:draft_kv_blocks_total") > 0
    assert sampled(d) == base_sampled
    assert constrained(d) == base_constrained
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda p: complete(d, prompt=p, max_tokens=40, temperature=0)
                          ["choices"][0]["text"], PROMPTS * 2))
    assert got == [t for t, _, _ in base] * 2


def start_fails(*args):
    p = subprocess.run([os.environ["DSQD"], "--model", model_path(), "--port", str(free_port()),
                        "--log-level", "error", *args], capture_output=True, text=True,
                       timeout=60)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode != 0 and len(lines) == 1, (p.returncode, p.stderr)
    return p.returncode, lines[0]


def test_draft_model_refusals(tmp_path):
    """A draft model dsqd cannot use stops it at start-up with one line
    naming the flag: a missing file, another vocabulary (the stories260K
    checkpoint, 512 tokens), both proposers at once, a draft length out of
    range."""
    rc, line = start_fails("--draft-model", str(tmp_path / "none.gguf"))
    assert rc == 1 and "--draft-model" in line and "none.gguf" in line
    stories = os.path.join(os.environ.get("DSQ_TEST_DATA", "tests/data"),
                           "models/stories260K/stories260K.bin")
    rc, line = start_fails("--draft-model", stories)
    assert rc == 1 and "vocabulary has 512 tokens" in line
    rc, line = start_fails("--draft-model", model_path(), "--speculative-ngram", "3")
    assert rc == 2 and "--speculative-ngram" in line
    rc, line = start_fails("--draft-model", model_path(), "--draft-max", "17")
    assert rc == 2 and "--draft-max" in line


def tiny_v3_mtp():
    d = os.environ.get("DSQ_MODELS_DIR", "models")
    data = os.environ.get("DSQ_TEST_DATA", "tests/data")
    return ["--model", os.path.join(d, "deepseek2-tiny", "v3_mtp"),
            "--tokenizer", os.path.join(data, "models/stories260K/tok512.bin"),
            "--served-model-name", MODEL_NAME]


def test_mtp_same_answers(daemon_factory):
    """--speculative-mtp on the tiny DeepSeek-V3 with an MTP module
    (tests/ref/make_deepseek2_tiny.py v3_mtp): the same greedy and seeded
    answers as without it, drafts scored every step (fixed length), and a
    model without a module refused at start-up in one line."""
    prompts = ["Once upon a time", "The cat sat", "Lily and Tom went to the park"]

    def texts(d, **extra):
        return [complete(d, prompt=p, max_tokens=24, **extra)["choices"][0]["text"]
                for p in prompts]
    plain = daemon_factory(*tiny_v3_mtp())
    base = texts(plain, temperature=0)
    base_s = texts(plain, temperature=0.8, seed=3)
    plain.stop()
    d = daemon_factory(*tiny_v3_mtp(), "--speculative-mtp", "--speculative-fixed-len")
    assert texts(d, temperature=0) == base
    assert texts(d, temperature=0.8, seed=3) == base_s
    m = metrics(d)
    assert counter(m, "vllm:spec_decode_num_draft_tokens_total") > 0
    rc, line = start_fails("--speculative-mtp")
    assert rc == 1 and "no multi-token prediction module" in line
    rc, line = start_fails(*tiny_v3_mtp(), "--speculative-mtp", "--draft-model", model_path())
    assert rc == 2 and "two proposers" in line

"""Every error the API promises, as raw HTTP: status, the nested OpenAI
error object ({"error": {message, type, param, code}}), and the headers
that go with it (Allow, Retry-After, WWW-Authenticate). Also auth, CORS,
TLS and the body limit, which need daemons with other options."""
import concurrent.futures
import json
import re
import shutil
import socket
import subprocess

import pytest
import requests

from conftest import MODEL_NAME, post

P = {"model": MODEL_NAME, "prompt": "Hi"}


def err(r, status, param=None, code=None):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/json")
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e
    return e


@pytest.mark.parametrize("field,value", [
    ("model", 5), ("prompt", 5), ("prompt", []), ("prompt", [[]]), ("prompt", [1, "a"]),
    ("prompt", [-1]), ("prompt", [10 ** 9]), ("max_tokens", "5"), ("max_tokens", -1),
    ("max_tokens", 0), ("max_tokens", 1.5), ("temperature", -1), ("temperature", 2.5),
    ("temperature", "x"), ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("top_k", 1.5),
    ("min_p", 2), ("n", 0), ("n", 1000), ("best_of", "x"), ("stop", 5),
    ("stop", ["a", "b", "c", "d", "e"]), ("stop", [""]), ("stop_token_ids", [-5]),
    ("stop_token_ids", "x"), ("seed", "x"), ("seed", 0.5), ("logprobs", 21),
    ("logprobs", -1), ("echo", "yes"), ("presence_penalty", 3), ("frequency_penalty", -3),
    ("repetition_penalty", 0), ("logit_bias", {"x": 1}), ("logit_bias", {"1": 500}),
    ("logit_bias", [1]), ("logit_bias", {"99999999": 1}), ("ignore_eos", 1), ("stream", "no"),
    ("user", 1),
])
def test_bad_field(server, field, value):
    body = dict(P, **{field: value})
    e = err(post(server, "/v1/completions", body), 400, field)
    assert e["type"] == "invalid_request_error"


def test_unknown_model(server):
    err(post(server, "/v1/completions", dict(P, model="gpt-4")), 404, "model", "model_not_found")
    err(post(server, "/v1/chat/completions", {"model": "gpt-4", "messages": [
        {"role": "user", "content": "hi"}]}), 404, "model", "model_not_found")


def test_missing_fields(server):
    err(post(server, "/v1/completions", {"prompt": "x"}), 400, "model")
    err(post(server, "/v1/completions", {"model": MODEL_NAME}), 400, "prompt")


def test_unsupported(server):
    err(post(server, "/v1/completions", dict(P, suffix="x")), 400, "suffix", "unsupported_parameter")
    # api: best_of > n and echo + logprobs are supported (tests/e2e/test_api_gaps.py)
    err(post(server, "/v1/completions", dict(P, best_of=2, stream=True)), 400, "best_of")
    err(post(server, "/v1/completions", dict(P, n=2, best_of=1)), 400, "best_of")
    err(post(server, "/v1/completions", dict(P, stream_options={"include_usage": True})), 400,
        "stream_options")


def test_invalid_json(server):
    for raw in [b"{", b"", b"[]", b"nul", b'{"model": "x"} {}', b"\xff\xfe"]:
        err(post(server, "/v1/completions", raw=raw), 400, None)



# A request body is JSON as RFC 8259 defines it, and no object
# holds a key twice (a proxy in front may read the other one). Each case is
# (the rest of a body that starts with STRICT, the offset in that rest where
# the error is reported, a piece of the message, param): the 400 names the
# byte offset (0-based) and line:column (1-based).
STRICT = b'{"model":"%s","prompt":"Hi","max_tokens":1,' % MODEL_NAME.encode()


@pytest.mark.parametrize("rest,at,what,param", [
    (b'"seed":01}', 8, "invalid token", None),
    (b'"seed":-01}', 9, "invalid token", None),
    (b'"seed":1.}', 9, "invalid token", None),
    (b'"seed":.5}', 8, "invalid token", None),
    (b'"seed":1e}', 9, "invalid token", None),
    (b'"seed":+1}', 8, "invalid token", None),
    (b'"seed":-}', 8, "invalid token", None),
    (b'"user":"a\tb"}', 9, "control character", None),
    (b'"user":"a\x01b"}', 9, "control character", None),
    (b'"user":"\\x"}', 10, "invalid escape", None),
    (b'"user":"\\ud800"}', 15, "invalid Unicode", None),
    (b'"user":"a\xff"}', 9, "not valid UTF-8", "user"),
    (b'"stream":false,"stream":true}', 15, 'duplicate key "stream"', None),
    (b'"logit_bias":{"1":1,"1":2}}', 20, 'duplicate key "1"', None),
    (b'"n":1} x', 8, "end of file expected", None),
    (b'"n":1,}', 7, "expected", None),
])
def test_strict_json(server, rest, at, what, param):
    e = err(post(server, "/v1/completions", raw=STRICT + rest), 400, param)
    assert e["type"] == "invalid_request_error"
    pos = len(STRICT) + at
    assert what in e["message"], e
    assert "at byte %d (line 1, column %d)" % (pos, pos + 1) in e["message"], e


def test_strict_json_every_route(server):
    # a duplicate inside a chat message object, over two lines
    body = (b'{"model":"%s",\n"messages":[{"role":"user","content":"hi",\n'
            b' "role":"system"}]}' % MODEL_NAME.encode())
    e = err(post(server, "/v1/chat/completions", raw=body), 400)
    assert 'duplicate key "role" at byte %d (line 3, column 2)' % body.rindex(b'"role"') \
        in e["message"], e
    e = err(post(server, "/tokenize", raw=b'{"prompt":"a","prompt":"b"}'), 400)
    assert 'duplicate key "prompt" at byte 14 (line 1, column 15)' in e["message"], e
    e = err(post(server, "/detokenize", raw=b'{"tokens":[01]}'), 400)
    assert "at byte 12 (line 1, column 13)" in e["message"], e
    # a body sent as another Content-Type is refused, strict JSON or not
    # (--any-content-type: test_users.py)
    r = post(server, "/v1/completions", raw=STRICT + b'"stream":false,"stream":true}',
             headers={"Content-Type": "text/plain"})
    err(r, 415)
    r = post(server, "/v1/completions", raw=STRICT + b'"seed":1}',
             headers={"Content-Type": "text/plain"})
    err(r, 415)


def test_strict_json_still_takes(server):
    # integers past 2^64, the edges of a double, -0, surrogate pairs,
    # whitespace around the value (a NUL after it is not: test_attack2.py)
    for rest in [b'"x":18446744073709551615,"y":123456789012345678901234567890}',
                 b'"x":1e308,"y":-0,"z":4.9e-324,"w":-0.0E+0}',
                 b'"user":"\\u00e9\\ud83d\\ude00\\/\\"\\\\"}',
                 b'"x":{"model":1,"y":{"model":2}}}',
                 b'"seed":1} \r\n\t']:
        r = post(server, "/v1/completions", raw=b" \n" + STRICT + rest)
        assert r.status_code == 200, (rest, r.text)

def test_context_length(server):
    mml = requests.get(server.url("/v1/models")).json()["data"][0]["max_model_len"]
    n = post(server, "/tokenize", {"prompt": P["prompt"]}).json()["count"]
    e = err(post(server, "/v1/completions", dict(P, max_tokens=mml)), 400, "max_tokens",
            "context_length_exceeded")
    assert str(mml) in e["message"] and str(mml + n) in e["message"]
    ids = [1] * mml
    e = err(post(server, "/v1/completions", dict(P, prompt=ids, max_tokens=1)), 400, "prompt",
            "context_length_exceeded")
    assert str(mml) in e["message"] and str(mml + 1) in e["message"]


def test_404_405(server):
    r = requests.get(server.url("/v1/nothing"))
    err(r, 404)
    r = requests.get(server.url("/v1/completions"))
    err(r, 405)
    assert "POST" in r.headers["Allow"]
    r = requests.post(server.url("/v1/models"), json={})
    err(r, 405)
    assert "GET" in r.headers["Allow"]
    r = requests.delete(server.url("/health"))
    err(r, 405)


def test_415(server):
    r = requests.post(server.url("/v1/completions"), data="model=x",
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    err(r, 415)
    r = requests.post(server.url("/v1/completions"), data="not json",
                      headers={"Content-Type": "text/plain"})
    err(r, 415)
    r = requests.post(server.url("/v1/completions"), data=json.dumps(dict(P, max_tokens=1)),
                      headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200
    r = requests.post(server.url("/v1/completions"), data=json.dumps(dict(P, max_tokens=1)),
                      headers={"Content-Type": "application/json\t; charset=utf-8"})
    assert r.status_code == 200


def test_nul_escape_refused(server):
    # cJSON ends strings at \u0000: "a\u0000b" used to run as the prompt "a"
    for path, body in [("/v1/completions", dict(P, prompt="a\u0000b")),
                       ("/tokenize", {"prompt": "a\u0000b"}),
                       ("/v1/chat/completions",
                        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "\u0000"}]})]:
        e = err(post(server, path, body), 400, None)
        assert "U+0000" in e["message"]
    # an escaped backslash followed by the text u0000 is fine
    assert post(server, "/tokenize", raw=b'{"prompt": "a\\\\u0000"}').status_code == 200



def test_metrics_count_499_and_204(server):
    # docs/api.md: 499 (client went away) is a status label, not "other"
    text = requests.get(server.url("/metrics")).text
    for code in ("204", "499"):
        assert re.search(r'dsq:http_requests_total\{[^}]*status="%s"\} \d+' % code, text), code


def test_tokenize_errors(server):
    err(post(server, "/tokenize", {"prompt": 5}), 400, "prompt")
    err(post(server, "/tokenize", {"model": "zzz", "prompt": "a"}), 404, "model", "model_not_found")
    err(post(server, "/detokenize", {"tokens": [10 ** 9]}), 400, "tokens")
    err(post(server, "/detokenize", {"tokens": "a"}), 400, "tokens")


def raw_request(port, data, read=65536, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while len(out) < read:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    return out


def test_413(daemon_factory):
    d = daemon_factory("--max-request-bytes", "1KiB")
    body = json.dumps(dict(P, prompt="x" * 4000))
    r = requests.post(d.url("/v1/completions"), data=body,
                      headers={"Content-Type": "application/json"})
    err(r, 413)
    # a huge declared length is refused from the headers alone, unread
    out = raw_request(d.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{")
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    # chunked body without a length: refused once it passes the limit
    def gen():
        for _ in range(8):
            yield b"x" * 512
    r = requests.post(d.url("/v1/completions"), data=gen(),
                      headers={"Content-Type": "application/json"})
    err(r, 413)
    # still serving
    assert requests.post(d.url("/v1/completions"), json=dict(P, max_tokens=1)).status_code == 200


def test_garbage_http_does_not_kill(server):
    raw_request(server.port, b"\x00\x01garbage\r\n\r\n", timeout=2)
    raw_request(server.port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n{", timeout=2)
    assert requests.get(server.url("/health")).status_code == 200


def test_api_key(daemon_factory):
    d = daemon_factory("--api-key", "sekrit")
    assert requests.get(d.url("/health")).status_code == 200   # no auth on /health
    for h in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"},
              {"Authorization": "Bearer sekri"}, {"Authorization": "Bearer sekrit2"}]:
        r = requests.get(d.url("/v1/models"), headers=h)
        e = err(r, 401, None, "invalid_api_key")
        assert e["type"] == "authentication_error"
        r = post(d, "/v1/completions", dict(P, max_tokens=1), headers=h)
        err(r, 401)
    ok = {"Authorization": "Bearer sekrit"}
    assert requests.get(d.url("/v1/models"), headers=ok).status_code == 200
    assert requests.get(d.url("/metrics"), headers=ok).status_code == 200
    assert requests.get(d.url("/metrics")).status_code == 401
    assert post(d, "/v1/completions", dict(P, max_tokens=1), headers=ok).status_code == 200
    import openai
    c = openai.OpenAI(base_url=d.url("/v1"), api_key="sekrit", max_retries=0)
    assert c.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=1).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=d.url("/v1"), api_key="bad", max_retries=0).models.list()


def test_api_key_from_env(daemon_factory):
    d = daemon_factory(env={"DSQ_API_KEY": "envkey"})
    assert requests.get(d.url("/v1/models")).status_code == 401
    assert requests.get(d.url("/v1/models"),
                        headers={"Authorization": "Bearer envkey"}).status_code == 200


def test_cors(daemon_factory, server):
    # off by default: no CORS headers, OPTIONS is not a method we serve
    # (and a cross-site request is refused: test_http_strict.py)
    r = requests.get(server.url("/v1/models"), headers={"Origin": "http://a.example"})
    assert r.status_code == 403
    assert "Access-Control-Allow-Origin" not in r.headers
    assert requests.options(server.url("/v1/completions")).status_code == 405
    d = daemon_factory("--allowed-origins", "http://a.example,http://b.example")
    r = requests.options(d.url("/v1/completions"), headers={
        "Origin": "http://b.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 204
    assert r.headers["Access-Control-Allow-Origin"] == "http://b.example"
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert "authorization" in r.headers["Access-Control-Allow-Headers"].lower()
    r = requests.get(d.url("/v1/models"), headers={"Origin": "http://a.example"})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "http://a.example"
    r = requests.get(d.url("/v1/models"), headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert "Access-Control-Allow-Origin" not in r.headers


def test_tls(daemon_factory, tmp_path):
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.fail("the openssl command is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    d = daemon_factory("--ssl-certfile", str(cert), "--ssl-keyfile", str(key), tls=True)
    r = requests.get(d.url("/v1/models"), verify=str(cert))
    assert r.status_code == 200
    r = requests.post(d.url("/v1/completions"), json=dict(P, max_tokens=2), verify=str(cert))
    assert r.status_code == 200
    with pytest.raises(requests.RequestException):
        requests.get(f"http://127.0.0.1:{d.port}/health", timeout=5)


def test_503_queue_full(daemon_factory):
    """hardening: an engine overload is 503 + Retry-After (429 tells OpenAI
    clients that they, not the server, send too much)."""
    d = daemon_factory("--max-num-seqs", "1", "--max-waiting-requests", "1")
    body = dict(P, max_tokens=48, ignore_eos=True, temperature=0)
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda _: post(d, "/v1/completions", body), range(8)))
    codes = sorted(r.status_code for r in rs)
    assert 503 in codes and 200 in codes and 429 not in codes, codes
    for r in rs:
        if r.status_code == 503:
            e = err(r, 503)
            assert e["code"] == "queue_full", e
            assert int(r.headers["Retry-After"]) >= 1
    assert requests.get(d.url("/health")).status_code == 200
    # more prompts than the whole queue holds: never admissible, so a 400
    # naming the limit (a 503 would have the client retry for ever)
    r = post(d, "/v1/completions", dict(P, prompt=["a", "b", "c"], max_tokens=1))
    e = err(r, 400, "prompt")
    assert "--max-waiting-requests" in e["message"], e
    assert "Retry-After" not in r.headers
    r = post(d, "/v1/completions", dict(P, prompt=["a"], max_tokens=1))
    assert r.status_code == 200, r.text[:300]

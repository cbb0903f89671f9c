"""Strict HTTP/1.1 framing (server/http_guard.c): every malformed request
gets one status line and the OpenAI error object, never libmicrohttpd's
HTML, and a NUL or other control byte, a missing Host, obs-fold or a bare
LF is a 400 (RFC 9112), not a request that goes on with a cut header.

The verdicts are checked against h11 (an independent HTTP/1.1 parser): what
h11 refuses, dsqd refuses; what both should take, both take.
"""
import json
import re
import socket
import time

import h11
import pytest
import requests

from conftest import MODEL_NAME, Daemon, raw_http

KEY = "sk-strict-test"


def parse_one(out):
    """(status, headers dict lower-cased, body) of the single response."""
    assert len(re.findall(rb"(?:^|\n)HTTP/1\.\d \d\d\d ", out)) == 1, out[:400]
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        hdrs[k.strip().lower().decode()] = v.strip().decode()
    return status, hdrs, body


def assert_refused(out, status, where=""):
    st, hdrs, body = parse_one(out)
    assert st == status, (where, out[:300])
    assert hdrs.get("content-type") == "application/json", out[:300]
    assert hdrs.get("connection") == "close"
    assert int(hdrs["content-length"]) == len(body)
    assert b"<html" not in out.lower()
    err = json.loads(body)["error"]
    assert err["type"] == "invalid_request_error" and err["message"], err
    return err["message"]


def h11_refuses(data):
    """Whether h11 (as a server) refuses these bytes as one request."""
    conn = h11.Connection(h11.SERVER)
    try:
        conn.receive_data(data)
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA or isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
                return False
            if ev is h11.PAUSED:
                return False
    except h11.RemoteProtocolError:
        return True


GOOD_BODY = json.dumps({"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1}).encode()


def post_req(extra=b"", body=GOOD_BODY, host=b"Host: x\r\n", version=b"HTTP/1.1"):
    return (b"POST /v1/completions " + version + b"\r\n" + host +
            b"Content-Type: application/json\r\n" + extra +
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


# malformed requests of the attack pass (finding 4 and 5) and their status
BAD = [
    ("content-length -5", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    ("content-length abc", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    ("content-length 23 digits",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12345678901234567890123\r\n\r\n", 400),
    ("NUL in Authorization", post_req(b"Authorization: Bearer " + KEY.encode() + b"\0junk\r\n"), 400),
    ("NUL in a header", post_req(b"X-A: a\0b\r\n"), 400),
    ("control byte in a header", post_req(b"X-A: a\x01b\r\n"), 400),
    ("no Host on HTTP/1.1", post_req(host=b""), 400),
    ("two Hosts", post_req(b"Host: y\r\n"), 400),
    ("obs-fold", post_req(b"X-A: a\r\n b\r\n"), 400),
    ("bare LF", post_req().replace(b"Host: x\r\n", b"Host: x\n"), 400),
    ("space before colon", post_req(b"X-A : b\r\n"), 400),
    ("HTTP/2.0", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ("URI of 10 KiB", b"GET /" + b"a" * 10240 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ("head of 20 KiB", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20480 + b"\r\n\r\n", 431),
    ("gzip transfer coding",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    ("bad chunk size",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    # each a record in libmicrohttpd's connection pool, which ran out at
    # ~450 (an HTML 431 after a doubled head, or no answer at all)
    ("500 cookies", b"GET /health HTTP/1.1\r\nHost: x\r\nCookie: " + b"; ".join([b"a=1"] * 500)
     + b"\r\n\r\n", 431),
    ("500 query arguments", b"GET /health?" + b"&".join([b"a"] * 500) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     414),
]


@pytest.fixture(scope="module")
def keyed():
    d = Daemon("--api-key", KEY)
    yield d
    assert d.stop() == 0, d.log_tail()


@pytest.mark.parametrize("name,data,status", BAD, ids=[b[0] for b in BAD])
def test_malformed_gets_one_json_answer(keyed, name, data, status):
    assert_refused(raw_http(keyed.port, data), status, name)
    # the daemon still serves
    assert requests.get(keyed.url("/health"), timeout=10).status_code == 200


def test_h11_refuses_what_dsqd_refuses(keyed):
    """Independent reference: h11 refuses ten of the malformed requests
    above as well; it takes a control byte, obs-fold and a bare LF (RFC
    9112 lets a server refuse them, and dsqd does) and leaves the version
    and size limits to the application."""
    refused_by_h11 = {name for name, data, _ in BAD if h11_refuses(data)}
    assert refused_by_h11 == {
        "content-length -5", "content-length abc", "content-length 23 digits",
        "NUL in Authorization", "NUL in a header", "no Host on HTTP/1.1", "two Hosts",
        "space before colon", "gzip transfer coding", "bad chunk size"}, refused_by_h11


# (name, bytes, whether h11 takes them too)
GOOD = [
    ("plain", post_req(), True),
    ("authorized", post_req(b"Authorization: Bearer " + KEY.encode() + b"\r\n"), True),
    # RFC 9112 2.2: a server SHOULD ignore an empty line before the
    # request line (h11 refuses it)
    ("leading empty line", b"\r\n" + post_req(b"Authorization: Bearer " + KEY.encode() + b"\r\n"),
     False),
    ("obs-text value", post_req(b"Authorization: Bearer " + KEY.encode() + b"\r\nX-A: caf\xc3\xa9\r\n"),
     True),
    ("HTTP/1.0 without Host",
     post_req(b"Authorization: Bearer " + KEY.encode() + b"\r\n", host=b"", version=b"HTTP/1.0"),
     True),
]


@pytest.mark.parametrize("name,data,h11_takes", GOOD, ids=[g[0] for g in GOOD])
def test_valid_requests_taken(keyed, name, data, h11_takes):
    assert h11_refuses(data) != h11_takes, name
    data = data.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    if b"Authorization" not in data:
        data = data.replace(b"Host: x\r\n", b"Host: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n")
    st, _, body = parse_one(raw_http(keyed.port, data))
    assert st == 200, (name, body[:300])
    assert json.loads(body)["choices"]


def test_largest_head_taken(keyed):
    """What the reader lets through fits libmicrohttpd's pool: a head of
    almost 16 KiB holding 100 fields, 150 cookies and 50 query arguments is
    answered, not refused in HTML."""
    cookies = b"; ".join(b"c%03d=%s" % (i, b"v" * 70) for i in range(75))
    fields = b"".join(b"X-F%02d: %s\r\n" % (i, b"w" * 20) for i in range(96))
    head = (b"GET /health?" + b"&".join([b"q=1"] * 50) + b" HTTP/1.1\r\nHost: x\r\n" +
            b"Cookie: " + cookies + b"\r\nCookie: " + cookies + b"\r\n" + fields +
            b"Connection: close\r\n\r\n")
    assert 10000 < len(head) < 16384, len(head)
    st, _, body = parse_one(raw_http(keyed.port, head))
    assert st == 200, body


def test_good_request_before_a_bad_one_in_one_send(keyed):
    """Pipelined in one segment, a good request is answered (first) and the
    malformed one after it gets the refusal; before, the refusal took the
    good one's place."""
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
    out = raw_http(keyed.port, post_req(auth) + b"GET /health HTTP/1.1\r\n\r\n")
    first, _, rest = out.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 "), out[:300]
    n = int(re.search(rb"(?i)content-length: (\d+)", first).group(1))
    assert json.loads(rest[:n])["choices"]
    assert "Host header" in assert_refused(rest[n:], 400)
    # a HEAD answered with its head only, then the refusal
    out = raw_http(keyed.port, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n\x00junk\r\n\r\n")
    first, _, rest = out.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 "), out[:300]
    assert_refused(rest, 400)


def test_one_origin_one_content_type_absolute_form(keyed):
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
    for dup in (b"Origin: http://x\r\nOrigin: http://evil.example\r\n",
                b"Content-Type: text/plain\r\n"):
        st, _, body = parse_one(raw_http(keyed.port, post_req(auth + dup + b"Connection: close\r\n")))
        assert st == 400 and b"more than one" in body, body
    st, _, body = parse_one(raw_http(
        keyed.port, b"GET http://127.0.0.1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"))
    assert st == 200, body


def test_chunked_body_and_pipelined_request(keyed):
    """A chunked body (extension, trailer) and a request pipelined after it
    pass the reader whole."""
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
    body = GOOD_BODY
    data = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
            b"%x;e=1\r\n" % 5 + body[:5] + b"\r\n" +
            b"%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n0\r\nX-T: 1\r\n\r\n" +
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    out = raw_http(keyed.port, data)
    assert out.count(b"HTTP/1.1 200 OK\r\n") == 2, out[:600]


def test_refusal_after_a_passed_request(keyed):
    """The reader follows a connection across requests: a bad head after a
    good request and its body on the same connection is refused, with only
    the first request answered."""
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
    s = socket.create_connection(("127.0.0.1", keyed.port), timeout=30)
    try:
        s.sendall(post_req(auth))
        first = b""
        while b"\r\n\r\n" not in first:
            first += s.recv(65536)
        head, _, rest = first.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        n = int([ln.split(b":")[1] for ln in head.split(b"\r\n")
                 if ln.lower().startswith(b"content-length")][0])
        while len(rest) < n:
            rest += s.recv(65536)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: \0\r\n\r\n")
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    finally:
        s.close()
    assert "control byte" in assert_refused(out, 400)


def test_head_refusal_has_no_body(keyed):
    out = raw_http(keyed.port, b"HEAD /health HTTP/1.1\r\nX-A: \x01\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), out
    assert body == b"" and b"content-length: " in head.lower()


def test_json_body_followed_by_nul_refused(keyed):
    """A NUL after the JSON text is not whitespace (RFC 8259)."""
    data = post_req(b"Authorization: Bearer " + KEY.encode() + b"\r\nConnection: close\r\n",
                    body=GOOD_BODY + b"\0")
    st, _, body = parse_one(raw_http(keyed.port, data))
    assert st == 400, body
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_tls_connection_refused_the_same_way(daemon_factory, tmp_path):
    """Over TLS the reader sees the decrypted bytes (gnutls_record_recv)."""
    import ssl
    import subprocess
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    d = daemon_factory("--ssl-certfile", str(cert), "--ssl-keyfile", str(key), tls=True)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    def tls_exchange(data):
        raw = socket.create_connection(("127.0.0.1", d.port), timeout=3)
        s = ctx.wrap_socket(raw)
        s.sendall(data)
        out = b""
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except (ssl.SSLError, ConnectionResetError, socket.timeout):
            pass
        s.close()
        return out

    # refused and closed at once, not at the 3 s read timeout
    t0 = time.monotonic()
    assert_refused(tls_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n"), 400)
    assert time.monotonic() - t0 < 2.5
    out = tls_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out[:200]


def test_cross_site_requests(server, daemon_factory):
    """A web page can make a browser POST to localhost without asking
    first (a CORS "simple request": a form, text/plain or multipart body);
    the browser then sends its Origin. Without an API key such a request
    is 403 unless its Origin is listed or is the server's own, and a body
    that is not application/json is 415 whatever the Origin."""
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1}
    url = server.url("/v1/completions")
    r = requests.post(url, json=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403, r.text
    e = r.json()["error"]
    assert e["code"] == "origin_not_allowed"
    assert "--allowed-origins http://evil.example" in e["message"], e   # what to run
    assert "Access-Control-Allow-Origin" not in r.headers
    # a browser's preflight: the same 403, not a 405 it would not show
    r = requests.options(url, headers={"Origin": "http://evil.example",
                                       "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert requests.post(url, json=body, headers={"Origin": "null"}).status_code == 403
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = requests.post(url, data=json.dumps(body), headers={"Content-Type": ct})
        assert r.status_code == 415, (ct, r.text)
    assert requests.post(url, json=body).status_code == 200               # no Origin: curl, SDKs
    own = "http://127.0.0.1:%d" % server.port
    assert requests.post(url, json=body, headers={"Origin": own}).status_code == 200
    # listed origins are taken, others still refused
    d = daemon_factory("--allowed-origins", "http://ui.example")
    r = requests.post(d.url("/v1/completions"), json=body, headers={"Origin": "http://ui.example"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://ui.example"
    r = requests.post(d.url("/v1/completions"), json=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    # with an API key the key is the check: a page on another site has none
    k = daemon_factory("--api-key", KEY)
    r = requests.post(k.url("/v1/completions"), json=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 401
    r = requests.post(k.url("/v1/completions"), json=body,
                      headers={"Origin": "http://evil.example", "Authorization": "Bearer " + KEY})
    assert r.status_code == 200

"""A request's header section is bounded in size (431) and time (408), over a raw socket
against the real API process (api/header_limits.py). Before, with no key at all, a 20-50 MB
header line was read whole and answered 200, and a connection trickling a header line every
9 s stayed open for ever; normal traffic (large bodies, keep-alive, pipelining, event streams
that outlive the header deadline) must not notice the limits."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tokenq.cli.stack import Stack
from tokenq.shared.settings import Settings

MODEL = "hdr-m"  # no worker serves it: its jobs stay queued
BOUND = 65_536  # the default max_header_bytes
TIMEOUT_S = 2.0  # header_timeout_s, shortened for the test


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An API without keys (anyone is admin, as in the report) on its own Redis, no worker."""
    state = tmp_path_factory.mktemp("hdr")
    (state / "models.json").write_text(json.dumps({MODEL: {"backend": "fake"}}))
    stack = Stack(Settings(redis_url=None, state_dir=state, models_file=state / "models.json"),
                  models=[MODEL], quiet=True, scratch_redis=True,
                  env={"TOKENQ_API__HEADER_TIMEOUT_S": str(TIMEOUT_S),
                       "TOKENQ_API__SSE_PING_S": "1"})  # a quiet stream sends a ping a second
    stack.start_parts(worker_models=[])
    try:
        stack.wait_ready(timeout=120, models=[])
        yield stack
    finally:
        stack.stop()


def _connect(api: Stack) -> socket.socket:
    return socket.create_connection((api.host, api.port), timeout=10)


def _read_response(sock: socket.socket, within_s: float = 10.0,
                   buf: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """One response with a content-length; what follows it stays in `buf`."""
    buf = bytearray() if buf is None else buf
    deadline = time.monotonic() + within_s
    while b"\r\n\r\n" not in buf:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {bytes(buf)!r}"
        buf += chunk
    head, _, _ = bytes(buf).partition(b"\r\n\r\n")
    del buf[:len(head) + 4]
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    size = int(headers["content-length"])
    while len(buf) < size:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, "closed inside a response body"
        buf += chunk
    body = bytes(buf[:size])
    del buf[:size]
    return int(lines[0].split()[1]), headers, body


def _closed_within(sock: socket.socket, within_s: float) -> bool:
    """The server closes (EOF or reset) within `within_s`; whatever it sends is dropped."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


def _envelope(body: bytes, code: str) -> None:
    """OpenAI's error envelope."""
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "code", "param"}, err
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", code, None)
    assert isinstance(err["message"], str) and err["message"]


@pytest.mark.parametrize("shape", ["one 200 KB line", "5,000 short lines"])
def test_a_header_section_over_the_bound_is_431_before_it_is_all_sent(
        api: Stack, shape: str) -> None:
    with _connect(api) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n")
        if shape == "one 200 KB line":
            first, rest = b"X-Big: " + b"a" * 100_000, b"a" * 100_000 + b"\r\n\r\n"
        else:
            lines = b"".join(b"X-H-%05d: %s\r\n" % (i, b"b" * 24) for i in range(5_000))
            first, rest = lines[:100_000], lines[100_000:] + b"\r\n"
        sock.sendall(first)  # past the bound, the headers not ended: the answer comes now
        status, headers, body = _read_response(sock)
        assert status == 431, body
        _envelope(body, "headers_too_large")
        assert headers["connection"] == "close"
        try:  # the rest is dropped unparsed (or the connection is gone already)
            sock.sendall(rest)
        except ConnectionError:
            pass
        assert _closed_within(sock, 10.0)
    assert httpx.get(f"{api.url}/health", timeout=5).status_code == 200


def test_a_trickled_header_section_is_closed_after_the_header_timeout(api: Stack) -> None:
    with _connect(api) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n")
        deadline = started + TIMEOUT_S + 10
        n = 0
        # one header line every 0.2 s, until the server answers (or the deadline)
        while not select.select([sock], [], [], 0.2)[0]:
            assert time.monotonic() < deadline, "a trickled header section stayed open"
            sock.sendall(b"X-Drip-%d: y\r\n" % n)
            n += 1
        status, _, body = _read_response(sock)
        took = time.monotonic() - started
        assert status == 408, body
        _envelope(body, "request_timeout")
        assert took >= TIMEOUT_S - 0.1, f"cut after {took:.2f}s"
        assert _closed_within(sock, 10.0)


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
        api: Stack) -> None:
    with _connect(api) as sock:
        started = time.monotonic()
        assert _closed_within(sock, TIMEOUT_S + 10), "a silent connection stayed open"
        assert time.monotonic() - started >= TIMEOUT_S - 0.1


def test_normal_requests_keep_alive_pipelining_and_large_bodies_are_answered(
        api: Stack) -> None:
    get = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Pad: %s\r\n\r\n"
    with _connect(api) as sock:
        buf = bytearray()
        # an ~8 KB header, and one just under the bound, on one keep-alive connection
        for pad in (8_000, BOUND - 200):
            sock.sendall(get % (b"p" * pad))
            status, _, body = _read_response(sock, buf=buf)
            assert status == 200, body
            assert MODEL in {m["id"] for m in json.loads(body)["data"]}
        # pipelined: 300 requests in one write, together over the bound (each is counted
        # on its own), answered in order
        pad = b"s" * 300
        sock.sendall(b"".join(b"GET /health HTTP/1.1\r\nHost: t\r\nX-N: %d\r\nX-Pad: %s\r\n"
                              b"\r\n" % (i, pad) for i in range(300)) + get % b"q")
        for _ in range(300):
            assert _read_response(sock, buf=buf)[0] == 200
        assert _read_response(sock, buf=buf)[0] == 200
        # idle between requests past the header timeout: uvicorn's keep-alive (5 s) rules
        time.sleep(TIMEOUT_S + 0.5)
        sock.sendall(get % b"r")
        assert _read_response(sock, buf=buf)[0] == 200
        # a body over the header bound, in the same write as its headers, is no header
        payload = json.dumps({"model": MODEL, "prompt": "x" * 300_000}).encode()
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\ncontent-type: application/json"
                     b"\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
        status, _, body = _read_response(sock, buf=buf)
        assert status == 202, body


def test_an_event_stream_outlives_the_header_timeout(api: Stack) -> None:
    with httpx.Client(base_url=api.url, timeout=30) as c:
        job = c.post("/v1/jobs", json={"model": MODEL, "prompt": "hi"})
        assert job.status_code in (200, 201, 202), job.text
        with c.stream("GET", f"/v1/jobs/{job.json()['id']}/events") as resp:
            assert resp.status_code == 200
            opened = time.monotonic()
            for _ in resp.iter_lines():  # its `queued` event, then a ping a second
                if time.monotonic() > opened + TIMEOUT_S + 1:
                    break
            else:
                pytest.fail("the stream ended")


def test_the_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().api.max_header_bytes, Settings().api.header_timeout_s) == (BOUND, 30.0)
    monkeypatch.setenv("TOKENQ_API__MAX_HEADER_BYTES", "32768")
    monkeypatch.setenv("TOKENQ_API__HEADER_TIMEOUT_S", "5")
    assert (Settings().api.max_header_bytes, Settings().api.header_timeout_s) == (32_768, 5.0)


@pytest.mark.parametrize("declared", ["over the limit", "chunked"])
def test_a_body_refused_early_closes_its_connection(api: Stack, declared: str) -> None:
    """A 413 answered before the body is read closes the connection: before, the client
    could go on sending body bytes that uvicorn dropped, each resetting its keep-alive
    timer, and hold the connection for ever."""
    with _connect(api) as sock:
        head = b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\ncontent-type: application/json\r\n"
        if declared == "over the limit":
            sock.sendall(head + b"content-length: 1000000000\r\n\r\n" + b" " * 1_000)
        else:  # no length declared: refused once what arrived passes the limit
            chunk = b" " * 65_536
            sock.sendall(head + b"transfer-encoding: chunked\r\n\r\n"
                         + (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 40)
        status, headers, body = _read_response(sock)
        assert status == 413, body
        _envelope(body, "payload_too_large")
        assert headers.get("connection") == "close", headers
        deadline = time.monotonic() + 5.0
        closed = False
        while not closed and time.monotonic() < deadline:  # trickle more body bytes
            try:
                sock.sendall(b" " * 100)
            except ConnectionError:
                closed = True
                break
            closed = _closed_within(sock, 0.2)
        assert closed, "the connection stayed open while the client sent more body"

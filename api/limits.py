"""Body size and speed limits, enforced while the body is read (413/408 in OpenAI's envelope),
and a buffered body that spells a lone UTF-16 surrogate refused (400, api/surrogates.py).

A slow body (a client trickling bytes, or sending none after its headers) would hold a
connection and a request slot for as long as it likes; the whole body of an ordinary
request must arrive within `timeout_s`, and each chunk of a large upload within it.
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenq.api import surrogates
from tokenq.api.errors import PayloadTooLarge, RequestTimeout

# What `curl -d` sends (or no type at all): a JSON body under it is read as JSON, as
# llama-server and vLLM read it; before, every route answered "Input should be a valid
# dictionary" to the curl line without `-H 'content-type: application/json'`.
UNTYPED = (b"", b"application/x-www-form-urlencoded")


def as_json(scope: Scope, body: bytes) -> Scope:
    """`scope` with its content-type made application/json when the body is a JSON object
    or array sent untyped (UNTYPED); otherwise `scope` itself."""
    headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
    ctype = next((v for k, v in headers if k == b"content-type"), b"")
    if ctype.split(b";")[0].strip().lower() not in UNTYPED or body.lstrip()[:1] not in (
            b"{", b"["):
        return scope
    headers = [(k, v) for k, v in headers if k != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


class BodyLimit:
    """`max_bytes` for every route; routes under a `large` prefix (file uploads) get their
    own limit and are streamed through, counted, never buffered here."""

    def __init__(self, app: ASGIApp, max_bytes: int, large: dict[str, int] | None = None,
                 timeout_s: float = 30.0):
        self.app = app
        self.max_bytes = max_bytes
        self.large = large or {}
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        limit = next((n for p, n in self.large.items() if path == p), None)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > (
                limit or self.max_bytes):
            await self._reject(send, limit or self.max_bytes)
            return
        if limit is not None:
            await self.app(scope, self._counted(receive, limit, self.timeout_s), send)
            return
        # Chunked bodies: read up to the limit ourselves, then replay them.
        chunks: list[bytes] = []
        size = 0
        more = True
        deadline = time.monotonic() + self.timeout_s
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                await self._reject(send, self.max_bytes, status=408)
                return
            if msg["type"] != "http.request":
                break
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._reject(send, self.max_bytes)
                return
            chunks.append(body)
            more = msg.get("more_body", False)
        whole = b"".join(chunks)
        if (where := surrogates.in_body(whole)) is not None:
            await self._reject(send, self.max_bytes, status=400, param=where)
            return
        replay = [{"type": "http.request", "body": whole, "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(as_json(scope, whole), replayed, send)

    @staticmethod
    def _counted(receive: Receive, limit: int, timeout_s: float) -> Receive:
        size = 0
        body_done = False

        async def counted() -> Message:
            nonlocal size, body_done
            if body_done:  # e.g. waiting for the disconnect: not a body read
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), timeout_s)
            except TimeoutError:
                raise RequestTimeout(f"no part of the request body arrived for {timeout_s:g}s")\
                    from None
            body_done = not msg.get("more_body", False)
            size += len(msg.get("body", b""))
            if size > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            return msg

        return counted

    @staticmethod
    async def _reject(send: Send, limit: int, status: int = 413,
                      param: str | None = None) -> None:
        message, code = f"request body is larger than {limit} bytes", "payload_too_large"
        if status == 408:
            message, code = "the request body did not arrive in time", "request_timeout"
        elif status == 400:
            message, code = (f"{param} holds a lone UTF-16 surrogate (\\ud800-\\udfff not "
                             "in a pair), which no text can carry"), "invalid_text"
        body = json.dumps({"error": {
            "message": message, "type": "invalid_request_error", "code": code,
            "param": param}}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        if status != 400:  # the body is not all read: close, or the client could go on
            headers.append((b"connection", b"close"))  # sending it for ever (keep-alive)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

"""Body size limit, enforced before the body is read in full (413 in OpenAI's envelope)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.errors import PayloadTooLarge


class BodyLimit:
    """`max_bytes` for every route; routes under a `large` prefix (file uploads) get their
    own limit and are streamed through, counted, never buffered here."""

    def __init__(self, app: ASGIApp, max_bytes: int, large: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.large = large or {}

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
            await self.app(scope, self._counted(receive, limit), send)
            return
        # Chunked bodies: read up to the limit ourselves, then replay them.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._reject(send, self.max_bytes)
                return
            chunks.append(body)
            more = msg.get("more_body", False)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    @staticmethod
    def _counted(receive: Receive, limit: int) -> Receive:
        size = 0

        async def counted() -> Message:
            nonlocal size
            msg = await receive()
            size += len(msg.get("body", b""))
            if size > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            return msg

        return counted

    @staticmethod
    async def _reject(send: Send, limit: int) -> None:
        body = json.dumps({"error": {
            "message": f"request body is larger than {limit} bytes",
            "type": "invalid_request_error", "code": "payload_too_large", "param": None}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

"""The floor for `tokenq bench scale` part (a): a minimal relay from Redis to SSE clients.

What a relay cannot do with less: one pub/sub connection read in bulk (hiredis parses the
replies), and per announcement one socket write of the events it carries, formatted as
tokenq's API formats them. When an announcement does not start at the relay's cursor (a
stream's first events, a hint with no entries), one XRANGE. Nothing else: no auth, no
resume, no keep-alive, no limits, no ASGI; on uvloop, as the API. Its CPU per 1,000
tokens on the same traffic is the bound tokenq's API is reported against.

    python -m tokenq.cli.bench.relay --redis-url redis://... --port N

`GET /v1/jobs/{id}/events` streams that job's events until its terminal one, then closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit

import hiredis
import redis.asyncio as aioredis

from tokenq.api import sse
from tokenq.shared import keys
from tokenq.shared.schemas import TERMINAL_EVENTS

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-store\r\n"
        b"connection: close\r\n\r\n")
MISSING = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def _events(entries: list[tuple[str, list[str]]]) -> tuple[bytes, bool]:
    out, ended = [], False
    for entry_id, flat in entries:
        fields = dict(zip(flat[::2], flat[1::2], strict=False))
        name = fields.get("e", "message")
        out.append(sse.event(fields.get("d", ""), event=name, id=entry_id))  # as the API's
        ended = ended or name in TERMINAL_EVENTS
    return b"".join(out), ended


class Relay:
    def __init__(self, url: str) -> None:
        self.url = url
        self.cmd = aioredis.Redis.from_url(url, decode_responses=True)
        self.clients: dict[str, tuple[asyncio.StreamWriter, list[str]]] = {}  # channel ->
        self.sub_writer: asyncio.StreamWriter | None = None

    async def start(self) -> None:
        where = urlsplit(self.url)
        reader, self.sub_writer = await asyncio.open_connection(where.hostname or "127.0.0.1",
                                                                where.port or 6379)
        asyncio.get_running_loop().create_task(self._read(reader))

    def _command(self, *args: str) -> None:
        assert self.sub_writer is not None
        self.sub_writer.write(b"".join(
            [f"*{len(args)}\r\n".encode()] +
            [f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args]))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        parser = hiredis.Reader(encoding="utf-8")
        while data := await reader.read(1 << 16):
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                if isinstance(reply, list) and len(reply) == 3 and reply[0] == "message":
                    await self._message(reply[1], reply[2])
                elif isinstance(reply, list) and reply[0] == "subscribe":
                    await self._catch_up(reply[1])

    async def _message(self, channel: str, message: str) -> None:
        got = self.clients.get(channel)
        if got is None:
            return
        writer, cursor = got
        carried: Any = json.loads(message) if message else None
        if isinstance(carried, list) and carried and carried[0] == cursor[0]:
            entries = [(carried[i], carried[i + 1]) for i in range(1, len(carried), 2)]
            self._write(channel, writer, cursor, entries)
        else:
            await self._catch_up(channel)

    async def _catch_up(self, channel: str) -> None:
        got = self.clients.get(channel)
        if got is None:
            return
        writer, cursor = got
        rows: Any = await self.cmd.xrange(channel, min="(" + cursor[0])
        if rows:
            self._write(channel, writer, cursor,
                        [(i, [x for kv in f.items() for x in kv]) for i, f in rows])

    def _write(self, channel: str, writer: asyncio.StreamWriter, cursor: list[str],
               entries: list[tuple[str, list[str]]]) -> None:
        body, ended = _events(entries)
        cursor[0] = entries[-1][0]
        writer.write(body)
        if ended:
            self.clients.pop(channel, None)
            self._command("UNSUBSCRIBE", channel)
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            parts = path.split("/")
            if len(parts) != 5 or parts[1:3] != ["v1", "jobs"] or parts[4] != "events":
                writer.write(MISSING)
                writer.close()
                return
            channel = keys.job_events(parts[3])
            writer.write(HEAD)
            self.clients[channel] = (writer, ["0-0"])
            self._command("SUBSCRIBE", channel)  # its confirmation reads what is there


async def main(url: str, port: int) -> None:
    relay = Relay(url)
    await relay.start()
    server = await asyncio.start_server(relay.serve, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    try:  # the loop the API runs on (uvicorn picks uvloop where it is installed)
        import uvloop
        uvloop.run(main(args.redis_url, args.port))
    except ImportError:
        asyncio.run(main(args.redis_url, args.port))
